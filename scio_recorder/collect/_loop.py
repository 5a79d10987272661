"""The per-batch loop of a collect run, and how inputs come out of batches.

Holds :class:`Run` (skip the batches a resumed run already reduced, run the
net, feed each label's record to its slot, spill beyond the memory budget,
checkpoint every few batches and after an error) and the counting of
samples; the batch plumbing it uses (getters for ``input=`` and
``target=``, moving values between devices) is :mod:`scio_recorder._run.batches`,
shared with :mod:`scio_recorder.ood`.

Why: this is the loop that is easy to get subtly wrong (a sample counted
twice on an interrupt, a checkpoint written mid-batch, a resumed run fed
other batches); it lives in one place, apart from option checking and
result assembly in :mod:`scio_recorder.collect`.
"""

from __future__ import annotations

__all__ = [
    "Run",
    "length_of",
    "total_samples",
]

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._run.batches import as_arguments, first_batch_size, move_to

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scio_recorder.recorder import Recorder

    from ._checkpoint import Checkpoints, Saved
    from ._progress import Bar
    from ._specs import Slot

# The logger of the public module: one logger for everything a run reports.
logger = logging.getLogger("scio_recorder.collect")


def total_samples(batches: object) -> int | None:
    """Return the number of samples a ``DataLoader`` yields, when known."""
    if not isinstance(batches, torch.utils.data.DataLoader):
        return None
    size = batches.batch_size
    if size is None:
        return None
    try:
        n = len(batches.sampler)  # type: ignore[arg-type]
    except TypeError:
        return None
    return (n // size) * size if batches.drop_last else n


class Run:
    """The per-batch loop of :func:`~scio_recorder.collect.collect`."""

    def __init__(  # noqa: PLR0913 (the loop's settings)
        self,
        rnet: Recorder,
        slots: list[Slot],
        *,
        get_input: Callable[[Any], Any],
        input_is_callable: bool,
        get_target: Callable[[Any], Any] | None,
        grad: bool,
        device: torch.device | None,
        to: torch.device | None,
        budget: int | None,
        checkpoints: Checkpoints | None,
        every: int,
        early_exit: bool = False,
    ) -> None:
        self.rnet = rnet
        self.slots = slots
        self.get_input = get_input
        self.input_is_callable = input_is_callable
        self.get_target = get_target
        self.grad = grad
        self.device = device
        self.to = to
        self.budget = budget
        self.checkpoints = checkpoints
        self.every = every
        self.options = {"early_exit": True} if early_exit else {}
        """The recorder's own options of every pass (none: the fast path)."""
        self.bar: Bar | None = None
        self.samples = 0
        self.batches = 0
        self.peak = 0
        self.consistent = True
        self.stores = [s.store for s in slots if s.store is not None]

    def arguments(self, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return as_arguments(self.get_input(batch), spread=self.input_is_callable)

    def run(self, batches: Iterable[Any], saved: Saved) -> None:
        self.samples, self.batches = saved.samples, saved.batches
        skip = saved.batches
        if saved.complete and skip and length_of(batches) == skip:
            return  # a finished run, rerun on the same (sized) batches
        skipped_samples: int | None = 0
        index = 0
        try:
            for batch in batches:
                if index < skip:
                    size = first_batch_size(*self.arguments(batch))
                    skipped_samples = (
                        None
                        if size is None or skipped_samples is None
                        else skipped_samples + size
                    )
                    index += 1
                    if index == skip:
                        self._check_skipped(skipped_samples, saved)
                    continue
                self.step(batch)
                index += 1
            self._check_exhausted(index, skip)
        except BaseException:
            if self.checkpoints is not None and self.consistent:
                self._checkpoint_after_error()
            raise
        if self.checkpoints is not None:
            self.checkpoints.save(self.slots, self.batches, self.samples, complete=True)

    def _checkpoint_after_error(self) -> None:
        assert self.checkpoints is not None  # noqa: S101 (checked by the caller)
        if self.checkpoints.saved.batches == self.batches:
            return
        try:
            self.checkpoints.save(
                self.slots, self.batches, self.samples, complete=False
            )
        except Exception:
            logger.exception("collect: could not checkpoint after the error")

    @staticmethod
    def _check_exhausted(index: int, skip: int) -> None:
        if index < skip:
            msg = (
                f"`batches` yielded {index} batches, but the run saved in "
                f"spill_dir had already reduced {skip}: the batches differ. "
                "Resume with the same batches, or pass `resume=False`."
            )
            raise ValueError(msg)

    def _check_skipped(self, skipped: int | None, saved: Saved) -> None:
        if skipped is not None and skipped != saved.samples:
            msg = (
                f"The first {saved.batches} batches hold {skipped} samples, but "
                f"the run saved in spill_dir reduced {saved.samples} samples from "
                "them: the batches differ (the loader must yield the same batches "
                "in the same order). Resume with the same batches, or pass "
                "`resume=False`."
            )
            raise ValueError(msg)

    def _inputs(
        self, batch: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any], Tensor | None]:
        args, kwargs = self.arguments(batch)
        target = self.get_target(batch) if self.get_target is not None else None
        if target is not None and not isinstance(target, Tensor):
            target = torch.as_tensor(target)
        if target is not None and target.device.type == "cpu":
            # Checked here, before the move: on an accelerator the reducers
            # do not check labels (that would synchronise with the host).
            for slot in self.slots:
                slot.check_target(target)
        if self.device is not None:
            args, kwargs = move_to(args, self.device), move_to(kwargs, self.device)
            target = move_to(target, self.device)
        if self.to is not None and target is not None:
            target = move_to(target, self.to)
        return args, kwargs, target

    def step(self, batch: Any) -> None:
        args, kwargs, target = self._inputs(batch)
        with torch.set_grad_enabled(self.grad):
            self.rnet(*args, **kwargs, **self.options)
        records, inputs = self.rnet.activations, self.rnet.inputs
        size = first_batch_size(args, kwargs)
        self.consistent = False
        for slot in self.slots:
            value = slot.value_of(records, inputs)
            if self.to is not None:
                value = move_to(value, self.to)
            slot.update(value, target)
            if size is None and isinstance(value, Tensor) and value.dim() >= 1:
                size = int(value.shape[0])
        self.samples += size or 0
        self.batches += 1
        self.consistent = True
        if self.bar is not None:
            self.bar.update(size or 0)
        held = sum(store.mem_bytes for store in self.stores)
        self.peak = max(self.peak, held)
        if self.budget is not None and held > self.budget:
            for store in self.stores:
                store.spill()
        if self.checkpoints is not None and self.batches % self.every == 0:
            self.checkpoints.save(
                self.slots, self.batches, self.samples, complete=False
            )


def length_of(batches: object) -> int | None:
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return None
