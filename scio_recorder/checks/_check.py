"""The entry points: check a recorder, or a net wrapped in one, on a batch.

:func:`check_recorder` (``rnet.check``) checks its options, then runs the
checks in one scope that leaves the net, the global random state and the
recorder's warnings as they were (:func:`_run_checks`: the plain and the
recorded pass, a second pass from where the first left the net, the rows
alone, the wider copy, the copies of overwritten records).
:func:`check_net` (``scio_recorder.check``) wraps a net in a recorder
first. Neither imports the recorder's module, which imports this package:
``check_net`` is given the class.
"""

from __future__ import annotations

__all__ = ["check_net", "check_recorder"]

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._net.preserve import SavedBuffers, preserved
from scio_recorder._run.batches import as_arguments
from scio_recorder._support.errors import CallPlanError, InPlaceWarning
from scio_recorder._support.tree import iter_tensors
from scio_recorder.select import as_list, resolve

from ._batch import check_batch, sequence_first
from ._dtype import check_dtype
from ._exact import check_determinism, check_recording, from_passes
from ._passes import Run
from ._plan import changed_in_place, check_calls, check_inplace
from ._report import CHECKS, CheckLine, CheckReport, named_plain, skipped

if TYPE_CHECKING:
    from torch import nn

    from scio_recorder._engine.plan import RecordOptions
    from scio_recorder.layers import DepthIdx, Layer


def _labels(rnet: Any, layers: Any) -> list[DepthIdx]:
    """Return the calls to check: ``layers``, else the selection, else all."""
    if layers is not None:
        rows: list[Layer] = resolve(rnet.table, rnet.net, as_list(layers))
    elif rnet.recording:
        rows = [rnet.table[label] for label in rnet.recording]
    else:
        rows = list(rnet.table.values())
    labels = [row.label for row in rows if row.recordable]
    if not labels:
        msg = f"`layers={layers!r}` selects no recordable call: nothing to check."
        raise ValueError(msg)
    return labels


def check_recorder(  # noqa: PLR0913 (the recorder, the batch, then the options)
    rnet: Any,
    batch: Any,
    *,
    layers: Any = None,
    rows: int = 8,
    dtype_copy: bool = True,
    batch_dim: int | None = None,
) -> CheckReport:
    """Check a recorder on a batch: see :func:`scio_recorder.check`.

    The recorder's selection and the net (modes, parameters, buffers) are as
    before after it, and so is the global random state; ``rnet.activations``
    holds the check's last pass.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        msg = f"`rows` must be an int >= 1 (rows compared alone), got {rows!r}"
        raise ValueError(msg)
    if batch_dim is not None and (
        isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim < 0
    ):
        msg = (
            "`batch_dim` must be None (dim 0, unless a sequence-first module says "
            "otherwise) or an int >= 0 (the inputs' batch dimension), got "
            f"{batch_dim!r}"
        )
        raise ValueError(msg)
    args, kwargs = as_arguments(batch, spread=True)
    _refuse_empty(args, kwargs, batch_dim)
    labels = _labels(rnet, layers)
    net = rnet.net
    passes = rnet._passes  # noqa: SLF001 (the engine's: options, in-place warnings)
    options = passes.plan.options  # the user's record options
    warned = set(passes.warned)  # the check's passes warn nobody
    padding_done = rnet._padding.done  # noqa: SLF001 (the report says it instead)
    devices = sorted({p.device.index or 0 for p in net.parameters() if p.is_cuda})
    try:
        with (
            preserved(net),
            torch.random.fork_rng(devices=devices),
            torch.no_grad(),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", InPlaceWarning)
            warnings.filterwarnings("ignore", "A left-padded batch", UserWarning)
            run = Run(rnet, labels, args, kwargs, batch_dim, SavedBuffers(net))
            lines = _run_checks(run, options, rows=rows, dtype_copy=dtype_copy)
    finally:
        passes.warned.clear()
        passes.warned.update(warned)
        rnet._padding.done = padding_done  # noqa: SLF001
    return CheckReport(lines)


def check_net(
    recorder: type[Any],
    net: nn.Module,
    batch: Any,
    options: dict[str, Any],
    recorder_kwargs: dict[str, Any],
) -> CheckReport:
    """Wrap ``net`` in a recorder and check it: see :func:`scio_recorder.check`.

    ``recorder``: the :class:`~scio_recorder.Recorder` class (its module
    imports this one); ``options``: the keywords of :func:`check_recorder`;
    ``recorder_kwargs``: those of the recorder.

    A recorder given as ``net`` is checked as it is (``rnet.check``): a
    recorder wrapped in another would record its hooks' work twice.
    """
    if isinstance(net, recorder):
        if recorder_kwargs:
            msg = (
                f"`net` is already a Recorder: the Recorder keywords "
                f"{', '.join(sorted(recorder_kwargs))} cannot apply to it. Call "
                "`rnet.check(batch, ...)` on it (it checks its own table and "
                "selection), or pass the plain model to `check`."
            )
            raise TypeError(msg)
        return check_recorder(net, batch, **options)
    args, kwargs = as_arguments(batch, spread=True)
    _refuse_empty(args, kwargs, options.get("batch_dim"))
    if not {"input_data", "input_size"} & recorder_kwargs.keys():
        if args:  # keyword inputs beside positional ones go to the forward
            recorder_kwargs = {**kwargs, **recorder_kwargs, "input_data": list(args)}
        else:
            recorder_kwargs = {**recorder_kwargs, "input_data": kwargs}
    rnet = recorder(net, **recorder_kwargs)
    return check_recorder(rnet, batch, **options)


def _refuse_empty(
    args: tuple[Any, ...], kwargs: dict[str, Any], batch_dim: Any
) -> None:
    """Refuse a batch of no row: every comparison would be over no value.

    Its rows are counted on the batch dimension (``batch_dim``, else dim 0)
    of the first input tensor that has one.
    """
    dim = batch_dim if isinstance(batch_dim, int) and batch_dim >= 0 else 0
    for value in iter_tensors((args, kwargs)):
        if value.dim() > dim:
            if value.shape[dim] == 0:
                msg = (
                    f"`check` got an empty batch: an input of shape "
                    f"{list(value.shape)} has no row on its batch dimension (dim "
                    f"{dim}), so every check would compare no value. Pass a batch "
                    "of at least one row (several, to compare rows batched against "
                    "alone)."
                )
                raise ValueError(msg)
            return


def _refuse_empty_records(run: Run, records: dict[DepthIdx, Any]) -> None:
    """Refuse records that hold no value at all: every comparison would be empty."""
    tensors = [(label, t) for label in run.labels for t in iter_tensors(records[label])]
    if any(t.numel() for _, t in tensors):
        return
    shapes = named_plain(
        [f"{run.describe(label)}: {list(t.shape)}" for label, t in tensors]
    )
    msg = (
        f"`check` has nothing to compare: the records of the checked calls hold "
        f"no value ({shapes or 'no tensor'}). Pass a batch whose records are not "
        "empty (a sequence of at least one position), or check other layers."
    )
    raise ValueError(msg)


def _run_checks(
    run: Run, options: RecordOptions, *, rows: int, dtype_copy: bool
) -> list[CheckLine]:
    """Run the passes and return the lines, in the order of ``CHECKS``."""
    rnet = run.rnet
    plain = run.plain()
    unsplit = sequence_first(run) if run.batch_dim is None else None
    chosen = dataclasses.asdict(options)
    chosen.pop("transforms", None)
    with rnet.selecting(*run.labels, **chosen):
        try:
            first = run.records(seed=True)
        except CallPlanError as error:
            why = "the recorded pass failed its call plan (see calls)"
            return [
                *(skipped(name, why) for name in CHECKS[:-2]),
                check_inplace(run, {}),
                check_calls(run, error),
            ]
        _refuse_empty_records(run, first)
        recorded, drew = run.output, run.drew
        changed = run.changed()  # by one pass
        second = run.records(seed=False, restore=False)  # from where `first` left it
        drew = drew or run.drew
        determinism, note = check_determinism(run, first, second, changed, drew=drew)
        lines = [
            check_recording(run, plain, recorded, first),
            check_batch(run, first, rows, unsplit),
            determinism,
            check_dtype(run, first, copy_model=dtype_copy),
        ]
    moved = {} if options.clone else changed_in_place(run, first, chosen)
    lines += [check_inplace(run, moved), check_calls(run, None)]
    if note is not None:
        lines = [
            line if line is determinism else from_passes(line, note) for line in lines
        ]
    return lines
