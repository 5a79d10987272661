"""The entry points of :mod:`scio_recorder.collect`: :func:`collect`, :func:`estimate`.

:func:`collect` checks its options, then runs in three stages:
:func:`_prepare` describes the run (a :class:`_Job`: one slot per label, ``_specs``; the
loop, ``_loop``; where it spills, ``_spill``, and checkpoints,
``_checkpoint``), :func:`_execute` runs the loop over the batches with the
kept labels selected, and :func:`_finish` merges across ranks
(``_distributed``) and assembles the
:class:`~scio_recorder.collect.CollectResult` (``_results``). The package's
``__init__`` documents the whole; import from there.
"""

from __future__ import annotations

__all__ = ["COLLECT_SIGNATURE", "CollectModule", "collect", "estimate"]

import contextlib
import dataclasses
import hashlib
import inspect
import json
import logging
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._engine.shards import tensor_parallel
from scio_recorder._engine.state import CallInputs
from scio_recorder._run.batches import (
    POSITION_IDS,
    Positions,
    as_arguments,
    batch_getter,
    padding_unwatched,
)
from scio_recorder._support.parts import (
    check_part,
    refuse_process_group,
    weights_digest,
)
from scio_recorder._support.ranks import rank_and_world

from ._checkpoint import Checkpoints, Saved, fingerprint_of
from ._distributed import Merged, concat_reducer, merge_across_ranks
from ._estimate import Estimate, estimate_slots, human
from ._loop import Run, total_samples
from ._parts import save_part
from ._progress import bar_description, make_bar
from ._results import CollectResult
from ._specs import (
    BatchSpec,
    Gather,
    ReducerSpec,
    needs_target,
    plan,
    short_name,
)
from ._spill import ConcatStore, SpillFolder, spill_lock

if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.reduce import Reducer
    from scio_recorder.select import Selector

    from ._specs import Slot

logger = logging.getLogger("scio_recorder.collect")


def estimate(
    rnet: Recorder,
    keep: Mapping[Selector, ReducerSpec],
    num_samples: int | None = None,
) -> Estimate:
    """Estimate the bytes a :func:`collect` run with ``keep`` handles.

    Per label, the bytes of one sample's record are the row's
    ``output_size`` (as torchinfo reports it for the reference input) without
    its batch dim, times the element size of the dtype seen in the reference
    pass (4, float32, when unknown). Nothing is run.

    Parameters
    ----------
    rnet : Recorder
        The recorder whose table is used.
    keep : Mapping
        As for :func:`collect`: selector -> reducer spec.
    num_samples : int, optional
        The number of samples, for the totals.

    Returns
    -------
    Estimate
        Per-label rows and totals; ``print`` it for a table.

    Raises
    ------
    ValueError, TypeError
        As :func:`collect` for a bad ``keep``.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    >>> rnet = Recorder(net, input_size=(1, 3, 10, 10))
    >>> est = estimate(rnet, {(1, 1): "concat"}, num_samples=50_000)
    >>> est.per_sample[(1, 1)], est.total
    (2048, 102400000)
    >>> est.summary()
    'records 2.0 KiB/sample; kept 2.0 KiB/sample (97.7 MiB for 50,000 samples)'

    """
    slots, _ = plan(rnet, keep)
    return estimate_slots(slots, rnet.table, num_samples)


def _check_options(  # noqa: PLR0913 (the options it checks)
    *,
    memory_budget: int | None,
    checkpoint_every: int | None,
    spill_dir: object,
    gather: object,
    progress: object,
    early_exit: object,
) -> None:
    if memory_budget is not None and (
        isinstance(memory_budget, bool)
        or not isinstance(memory_budget, int)
        or memory_budget < 0
    ):
        msg = f"`memory_budget` must be a number of bytes >= 0, got {memory_budget!r}"
        raise ValueError(msg)
    if checkpoint_every is not None:
        if (
            isinstance(checkpoint_every, bool)
            or not isinstance(checkpoint_every, int)
            or checkpoint_every < 1
        ):
            msg = f"`checkpoint_every` must be an int >= 1, got {checkpoint_every!r}"
            raise ValueError(msg)
        if spill_dir is None:
            msg = (
                "`checkpoint_every` needs a `spill_dir` to write checkpoints to: "
                "pass `spill_dir=...`, or drop `checkpoint_every`."
            )
            raise ValueError(msg)
    if isinstance(gather, bool) or gather not in ("all", 0, None):
        msg = f"`gather` must be 'all', 0 or None, got {gather!r}"
        raise ValueError(msg)
    for name, value in (("progress", progress), ("early_exit", early_exit)):
        if value is not None and not isinstance(value, bool):
            msg = f"`{name}` must be None, True or False, got {value!r}"
            raise TypeError(msg)


def collect(  # noqa: PLR0913 (the documented options)
    rnet: Recorder,
    batches: Iterable[Any],
    keep: Mapping[Selector, ReducerSpec],
    *,
    input: BatchSpec = 0,  # noqa: A002 (the documented name)
    target: BatchSpec = None,
    grad: bool = False,
    device: torch.device | str | None = None,
    to: torch.device | str | None = None,
    memory_budget: int | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    resume: bool = True,
    checkpoint_every: int | None = None,
    progress: bool | None = None,
    gather: Gather = "all",
    clone: bool = False,
    durable: bool = False,
    early_exit: bool | None = None,
    position_ids: str | None = POSITION_IDS,
    part: int | None = None,
    parts: int | None = None,
    save: str | os.PathLike[str] | None = None,
) -> CollectResult:
    """Run the recorder over every batch and reduce the chosen layers' outputs.

    For each batch, the input is taken out of the batch (``input``), moved to
    ``device``, and passed through ``rnet`` with exactly the labels of
    ``keep`` recorded; each label's record (moved to ``to``) feeds that
    label's reducer, with the batch's class labels (``target``) when given.
    The net runs in whatever mode you set (``collect`` never calls
    ``eval()``: call ``net.eval()`` first for dropout-free, running-stat
    batch norm features), under :func:`torch.no_grad` unless ``grad=True``.
    The recorder's selection (and its record options) is restored at the
    end, also after an error.

    Parameters
    ----------
    rnet : Recorder
        The recorder wrapping the net.
    batches : iterable
        Any iterable of batches: a ``DataLoader``, a list, a generator. To
        resume, it must yield the same batches in the same order.
    keep : Mapping
        Selector -> reducer spec. A selector is a label ``(depth, idx)``, a
        qualified name, or anything :func:`scio_recorder.select.resolve`
        accepts; it must resolve to at least one label, and each label gets
        its own fresh reducer. A spec is ``"concat"`` (per-sample features
        kept on the CPU, spilled to disk beyond ``memory_budget``; a
        ``Concat()`` instance means the same), a statistic name
        (``"moments"``, ``"covariance"``, ``"gram"``, ``"minmax"``,
        ``"count"``), any :func:`~scio_recorder.reduce.make_reducer` spec
        (``"all"``, ``"sum"``, ..., a fold function), or a reducer instance,
        used as a template (``.fresh()`` per label; it is not modified).
    input : int, str, callable or None, default 0
        How to get the net's input from a batch: the item at an index of a
        tuple or list batch, the value at a key of a dict batch, the whole
        batch (``None``), or ``input(batch)``, whose result is passed as the
        positional arguments when it is a tuple, as keyword arguments when it
        is a dict, else as the one argument.
    target : int, str, callable or None, default None
        The same forms, for per-sample integer class labels passed to the
        reducers (:class:`~scio_recorder.reduce.PerClass` and
        :class:`~scio_recorder.reduce.SharedCovariance` need them).
    grad : bool, default False
        Run the passes with autograd enabled (records are still detached by
        the reducers).
    device : torch.device or str, optional
        Move inputs and targets here before the pass (asynchronously toward
        an accelerator: use a ``DataLoader`` with ``pin_memory=True``).
    to : torch.device or str, optional
        Move records here before reducing (by default they stay where the
        net produced them; concatenations always go to the CPU).
    memory_budget : int, optional
        Bytes of concatenated rows to hold in RAM: beyond it, every
        concatenation is appended to a file (in ``spill_dir``, else a
        temporary folder) and its RAM freed. RAM then stays under the budget
        plus one batch's rows. ``None``: no limit.
    spill_dir : str or os.PathLike, optional
        Folder for spilled rows, checkpoints (reducer states, safetensors)
        and the manifest (JSON); enables resuming. Checkpoints write the
        concatenated rows there too, so concatenations come back memory
        mapped from ``spill_dir`` (see :attr:`CollectResult.files`). Under
        :mod:`torch.distributed` each rank uses ``spill_dir/rank-<r>``. One
        run at a time: the run holds the lock file ``collect.lock`` there
        until it returns or raises.
    resume : bool, default True
        With ``spill_dir``: if it holds a run with the same arguments, skip
        the batches it completed (they are still drawn from ``batches``, the
        net does not run on them) and go on from its last checkpoint; a run
        with other arguments is a ``ValueError``. ``False`` deletes the saved
        run and starts over.
    checkpoint_every : int, optional
        Batches between checkpoints (needs ``spill_dir``); default: every
        batch. An error or ``KeyboardInterrupt`` between batches also
        checkpoints the batches completed.
    progress : bool, optional
        A tqdm bar (``unit="sample"``) on stderr. ``None``: shown when stderr
        is a terminal and tqdm is installed (on rank 0 only, under
        :mod:`torch.distributed`).
    gather : {"all", 0, None}, default "all"
        Under an initialised :mod:`torch.distributed` process group: ``"all"``
        gives every rank the merged statistics and all concatenated rows
        (rank 0's, then rank 1's, ...); ``0`` gives every rank the merged
        statistics and only rank 0 the concatenations (``None`` elsewhere);
        ``None`` merges nothing (local results). Ignored otherwise.
    clone : bool, default False
        Record copies (``rnet.record(..., clone=True)``), for nets that modify
        a recorded output in place later in the same pass (e.g. a
        ``ReLU(inplace=True)`` after a recorded layer): without it, the
        reducers would see the modified values (the recorder warns with
        :class:`~scio_recorder.InPlaceWarning`).
    durable : bool, default False
        ``fsync`` every checkpoint's files, so that a checkpoint also survives
        a power loss or an operating-system crash (an exception, a
        ``KeyboardInterrupt`` or a killed process never lose one). Costs a
        few milliseconds per checkpoint on most disks.
    early_exit : bool, optional
        Stop each pass once every kept layer has been recorded (see
        ``rnet(x, early_exit=True)``): the layers after the last kept one do
        not run, and the results are those of full passes. ``None`` (the
        default): stop early when the kept layers do not include the net's
        output (the root row, depth 0) and ``grad=False``. ``True``: always
        (refused as by the recorder, e.g. for inputs that require grad with
        ``grad=True``). ``False``: full passes. Layers that do not run have
        no side effect either (a ``BatchNorm`` after the last kept layer
        does not update its running statistics in train mode).
    position_ids : {"from_mask", None}, default "from_mask"
        ``"from_mask"``: when the net's forward takes ``position_ids`` and
        ``attention_mask`` (a Hugging Face language model) and an input has
        a 2-D ``attention_mask`` and no ``position_ids``, it gets
        ``attention_mask.cumsum(-1) - 1`` (0 at the padding), as
        ``generate`` gives them, so that a row's records do not depend on
        its padding (left or right) nor on its batch-mates. Models that
        number padded rows themselves (RoBERTa's family, OPT,
        encoder-decoders) and nets without these arguments get the input as
        it is. ``None``: inputs are passed as they are.
    part, parts : int, optional
        Run part ``part`` (0 to ``parts - 1``) of a run split over
        ``parts`` independent workers, with no process group (a SLURM array
        task, a Ray actor, a plain process), on this part's batches; at the
        end, every reducer's state and every concatenation are saved to
        ``save/collect-part-<part>.safetensors`` (replaced atomically), and
        :func:`merge` gives the result of one run over every part's batches.
        Give both, with ``save``, or none. A ``spill_dir`` is then
        ``spill_dir/part-<part>``. See "Many machines" in ``docs/collect.md``.
    save : str or os.PathLike, optional
        The folder of the parts' files (with ``part``).

    Returns
    -------
    CollectResult
        A read-only mapping label -> result, with ``samples``, ``batches``,
        ``estimate``, ``reducers``, ``save()`` and more (with ``part``: this
        part's own results).

    Raises
    ------
    ValueError
        For a bad ``keep`` or option, a spill folder holding a run with other
        arguments or a damaged or edited checkpoint, batches that differ from
        the saved run's, or no batch.
    RuntimeError
        When another run (a live process, or another thread) holds
        ``spill_dir``'s lock file (``collect.lock``); a lock left by a process
        of this host that no longer runs is taken over with a warning.
    TypeError
        For a spec or batch of the wrong kind.

    Examples
    --------
    Per-class means and the shared covariance of the penultimate layer (the
    Mahalanobis detector of Lee et al. 2018), and the logits themselves:

    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.reduce import SharedCovariance
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_size=(1, 5))
    >>> data = torch.utils.data.TensorDataset(torch.randn(40, 5), torch.arange(40) % 3)
    >>> loader = torch.utils.data.DataLoader(data, batch_size=16)
    >>> result = collect(
    ...     rnet,
    ...     loader,
    ...     {"1": SharedCovariance(num_classes=3), (1, 3): "concat"},
    ...     target=1,
    ... )
    >>> stats = result[(1, 2)]
    >>> stats.class_counts.tolist(), stats.cov.shape, result[(1, 3)].shape
    ([14, 13, 13], torch.Size([4, 4]), torch.Size([40, 3]))
    >>> result.samples, result.batches
    (40, 3)

    """
    _check_options(
        memory_budget=memory_budget,
        checkpoint_every=checkpoint_every,
        spill_dir=spill_dir,
        gather=gather,
        progress=progress,
        early_exit=early_exit,
    )
    split = _check_split(part, parts, save)
    job = _prepare(
        rnet,
        batches,
        keep,
        input=input,
        target=target,
        grad=grad,
        device=device,
        to=to,
        memory_budget=memory_budget,
        spill_dir=spill_dir,
        checkpoint_every=checkpoint_every,
        durable=durable,
        early_exit=early_exit,
        position_ids=position_ids,
        split=split,
    )
    with job.holding():
        _execute(job, batches, resume=resume, progress=progress, clone=clone)
        result = _finish(job, gather)
        if split is not None and save is not None:
            save_part(
                Path(save),
                part=split[0],
                parts=split[1],
                slots=job.slots,
                local={s.label: result[s.label] for s in job.slots if s.store},
                fingerprint=job.saved,
                samples=result.samples,
                batches=result.batches,
                weights=weights_digest(job.rnet.net),
            )
        return result


def _check_split(
    part: int | None, parts: int | None, save: object
) -> tuple[int, int] | None:
    """Check ``part``, ``parts`` and ``save``; return ``(part, parts)`` or None."""
    check_part(part, parts, append=False)
    if part is None or parts is None:
        if save is not None:
            msg = (
                "`save=` is the folder of a part's file: pass it with `part=` and "
                "`parts=` (to save a whole run's results, use `result.save(path)`)."
            )
            raise ValueError(msg)
        return None
    if save is None:
        msg = (
            f"`part={part}, parts={parts}` needs `save=`, the folder of the parts' "
            "files (one folder every part can reach), which `merge` reads."
        )
        raise ValueError(msg)
    return part, parts


@dataclasses.dataclass
class _Job:
    """A collect run as :func:`_prepare` describes it, before the first batch.

    The slots (one per label, with a fresh reducer or store), the loop
    (:class:`~._loop.Run`) with its settings, where it spills and
    checkpoints, the estimate, and this process's rank. Nothing is written
    until :meth:`holding`.
    """

    rnet: Recorder
    slots: list[Slot]
    labels_of: dict[Any, tuple[DepthIdx, ...]]
    run: Run
    folder: SpillFolder
    folder_path: Path | None
    checkpoints: Checkpoints | None
    estimate: Estimate
    num_samples: int | None
    digest: str
    """The run's fingerprint without the rank: ranks check they run the same."""
    rank: int
    world: int
    budget: int | None
    position_ids: str | None
    saved: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The run's fingerprint without the rank or part (what a part saves)."""

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold ``spill_dir``'s lock while the run writes; remove a temporary folder.

        One run per folder (per rank folder under :mod:`torch.distributed`):
        a second run would truncate and append the same files.
        """
        lock = None if self.folder_path is None else spill_lock(self.folder_path)
        if lock is not None:
            lock.acquire()
        try:
            yield
        finally:
            self.folder.cleanup()
            if lock is not None:
                lock.release()


def _prepare(  # noqa: PLR0913 (collect's options)
    rnet: Recorder,
    batches: Iterable[Any],
    keep: Mapping[Selector, ReducerSpec],
    *,
    input: BatchSpec,  # noqa: A002 (collect's name)
    target: BatchSpec,
    grad: bool,
    device: torch.device | str | None,
    to: torch.device | str | None,
    memory_budget: int | None,
    spill_dir: str | os.PathLike[str] | None,
    checkpoint_every: int | None,
    durable: bool,
    early_exit: bool | None,
    position_ids: str | None,
    split: tuple[int, int] | None = None,
) -> _Job:
    """Describe the run: its slots, its loop, where it spills; nothing runs."""
    slots, labels_of = plan(rnet, keep)
    if early_exit is None:  # stop early unless the output or gradients are needed
        early_exit = not grad and all(
            slot.of_input or slot.label[0] != 0 for slot in slots
        )
    _check_targets(slots, target)
    positions = Positions.of(rnet.net, position_ids)
    get_input, input_is_callable = _input_getter(input, positions)
    rank, world = _placement(split)
    fingerprint = fingerprint_of(slots, input, target)
    if positions.active:  # a run without derived ids keeps its fingerprint
        fingerprint["position_ids"] = POSITION_IDS
    saved = dict(fingerprint)
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode())
    if world > 1:
        fingerprint["rank"] = f"{rank} of {world}"
    if split is not None:
        fingerprint["part"] = f"{split[0]} of {split[1]}"
    folder_path = _spill_path(spill_dir, rank, world, split)
    folder = SpillFolder(folder_path)
    for slot in slots:
        if slot.template is None:
            slot.store = ConcatStore(slot.label, folder)
        else:
            slot.reducer = slot.template.fresh()
    checkpoints = (
        None
        if folder_path is None
        else Checkpoints(folder_path, fingerprint, durable=durable)
    )
    num_samples = total_samples(batches)
    run = Run(
        rnet,
        slots,
        get_input=get_input,
        input_is_callable=input_is_callable,
        get_target=None if target is None else batch_getter(target, "target"),
        grad=grad,
        device=None if device is None else torch.device(device),
        to=None if to is None else torch.device(to),
        budget=memory_budget,
        checkpoints=checkpoints,
        every=checkpoint_every or 1,
        early_exit=early_exit,
    )
    return _Job(
        rnet,
        slots,
        labels_of,
        run,
        folder,
        folder_path,
        checkpoints,
        estimate_slots(slots, rnet.table, num_samples),
        num_samples,
        digest.hexdigest(),
        rank,
        world,
        memory_budget,
        position_ids,
        saved,
    )


def _placement(split: tuple[int, int] | None) -> tuple[int, int]:
    """Return this process's rank and world (a part: 0 of 1, no process group)."""
    dist_info = rank_and_world()
    rank, world = dist_info if dist_info is not None else (0, 1)
    if split is None:
        return rank, world
    refuse_process_group(world)
    return 0, 1


def _spill_path(
    spill_dir: str | os.PathLike[str] | None,
    rank: int,
    world: int,
    split: tuple[int, int] | None,
) -> Path | None:
    """Return the spill folder of this rank (``rank-<r>``) or part (``part-<k>``)."""
    if spill_dir is None:
        return None
    folder_path = Path(spill_dir)
    if world > 1:
        folder_path /= f"rank-{rank}"
    if split is not None:
        folder_path /= f"part-{split[0]}"
    return folder_path


def _execute(
    job: _Job,
    batches: Iterable[Any],
    *,
    resume: bool,
    progress: bool | None,
    clone: bool,
) -> None:
    """Run the loop over ``batches`` with exactly the kept labels selected.

    The recorder's selection comes back after, also after an error; a
    resumed run starts from its last checkpoint.
    """
    rnet, slots, run = job.rnet, job.slots, job.run
    with (
        rnet.selecting(
            *(slot.label for slot in slots if not slot.of_input),
            inputs=[slot.label for slot in slots if slot.of_input],
            clone=clone,
        ),
        padding_unwatched(rnet, job.position_ids),
    ):
        saved = Saved()
        if job.checkpoints is not None:
            saved = job.checkpoints.open(slots, resume=resume, device=run.to)
        run.bar = make_bar(
            progress=progress if progress is not None or job.rank == 0 else False,
            total=job.num_samples,
            initial=saved.samples,
            desc=bar_description(job.estimate),
        )
        try:
            if run.bar is not None or job.budget is not None:
                _announce(job.estimate, job.budget, job.folder_path)
            run.run(batches, saved)
        finally:
            if run.bar is not None:
                run.bar.close()


def _gathered(job: _Job, gather: Gather) -> Merged:
    """Return the results: this process's, or merged across ranks (``gather``)."""
    local = {
        slot.label: slot.store.tensor() for slot in job.slots if slot.store is not None
    }
    # Tensor parallelism: every rank ran the same batches, and its records
    # are whole (the recorder gathered them): each rank's results are all.
    if job.world > 1 and gather is not None and not tensor_parallel(job.rnet.net):
        return merge_across_ranks(
            job.slots,
            local,
            samples=job.run.samples,
            batches=job.run.batches,
            gather=gather,
            folder=job.folder,
            budget=job.budget,
            digest=job.digest,
        )
    return _local_results(job.slots, local, job.run)


def _finish(job: _Job, gather: Gather) -> CollectResult:
    """Return the :class:`~scio_recorder.collect.CollectResult` (merged: ``gather``)."""
    merged = _gathered(job, gather)
    slots = job.slots
    return CollectResult(
        {slot.label: merged.results[slot.label] for slot in slots},
        samples=merged.samples,
        batches=merged.batches,
        estimate=job.estimate,
        reducers={slot.label: merged.reducers[slot.label] for slot in slots},
        labels_of=job.labels_of,
        rank_samples=merged.rank_samples,
        peak_bytes=job.run.peak,
        files=merged.files if job.folder.persistent else {},
        table=job.rnet.table,
    )


def _check_targets(slots: list[Slot], target: BatchSpec) -> None:
    """Refuse reducers that need class labels when ``target`` is not given."""
    if target is not None:
        return
    for slot in slots:
        if needs_target(slot.template):
            msg = (
                f"keep[{slot.selector!r}] is a {short_name(slot.template)}, "
                "which needs per-sample class labels: pass `target=` (e.g. "
                "`target=1` for (input, label) batches)."
            )
            raise ValueError(msg)


def _input_getter(
    input: BatchSpec,  # noqa: A002 (collect's name)
    positions: Positions,
) -> tuple[Callable[[Any], Any], bool]:
    """Return how to take the net's input out of a batch, and whether it spreads.

    When the net takes position ids, the getter derives them when missing
    (:meth:`Positions.add`).
    """
    get_input = batch_getter(input, "input")
    input_is_callable = callable(input) and not isinstance(input, int | str)
    if positions.active:  # the net takes position ids: derive them when missing
        return _with_positions(get_input, positions, spread=input_is_callable), True
    return get_input, input_is_callable


def _with_positions(
    get_input: Callable[[Any], Any], positions: Positions, *, spread: bool
) -> Callable[[Any], CallInputs]:
    """Return ``get_input`` followed by :meth:`Positions.add`, as ``CallInputs``."""

    def inputs(batch: Any) -> CallInputs:
        args, kwargs = positions.add(*as_arguments(get_input(batch), spread=spread))
        return CallInputs(args, kwargs)

    return inputs


def _announce(est: Estimate, budget: int | None, folder: Path | None) -> None:
    """Log what the run needs, and whether concatenations will spill."""
    logger.info("collect: %s", est.summary())
    if (
        budget is not None
        and est.stored_total is not None
        and est.stored_total > budget
    ):
        logger.info(
            "collect: concatenations exceed the memory budget (%s): they will "
            "spill to '%s'",
            human(budget),
            folder if folder is not None else "a temporary folder",
        )


def _local_results(
    slots: list[Slot], local: dict[DepthIdx, Tensor | None], run: Run
) -> Merged:
    """Return this process's results (no distributed merge)."""
    if run.batches == 0:
        msg = (
            "`batches` yielded no batch: there is nothing to collect. Check the "
            "data loader (an empty dataset, or drop_last=True with fewer "
            "samples than batch_size)."
        )
        raise ValueError(msg)
    results: dict[DepthIdx, Any] = {}
    reducers: dict[DepthIdx, Reducer] = {}
    files: dict[DepthIdx, Path] = {}
    for slot in slots:
        if slot.store is not None:
            results[slot.label] = local[slot.label]
            reducers[slot.label] = concat_reducer(local[slot.label])
            if slot.store.file is not None:
                files[slot.label] = slot.store.file
        else:
            assert slot.reducer is not None  # noqa: S101 (set for reducers)
            results[slot.label] = slot.reducer.result()
            reducers[slot.label] = slot.reducer
    return Merged(results, reducers, run.samples, run.batches, (run.samples,), files)


class CollectModule(types.ModuleType):
    """The class of :mod:`scio_recorder.collect`: calling it calls :func:`collect`.

    ``scio_recorder.collect`` is the subpackage (``import scio_recorder.collect
    as m`` gives ``m.collect``, ``m.InputOf``, ...), and it is also callable,
    so that ``scio_recorder.collect(rnet, batches, keep)`` and ``from
    scio_recorder import collect; collect(rnet, batches, keep)`` run
    :func:`collect`. ``inspect.signature`` of the module is the function's
    (the module's ``__signature__``); its ``__doc__`` stays the module's,
    which says so.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> CollectResult:
        """Call :func:`collect` with the same arguments."""
        return collect(*args, **kwargs)


COLLECT_SIGNATURE = inspect.signature(collect)
"""The signature of :func:`collect`, also the signature of the callable module."""
