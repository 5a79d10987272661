"""The ``"batch"`` check: each row's records alone against those in the batch.

:func:`check_batch` makes the line from what :class:`~._rows.Rows` found
(:mod:`._rows` runs the rows alone and compares them), and
:func:`_batch_cause` names the likely cause of a difference: position ids
numbered from the padding, a BatchNorm or a dropout in train mode, an
operation that mixes rows. Before any row runs alone,
:func:`sequence_first` looks whether the inputs' dim 0 is their batch at
all: a sequence-first module (``nn.LSTM`` without ``batch_first``) can show
that it is not, and the check then warns instead of cutting the inputs
along their time axis.
"""

from __future__ import annotations

__all__ = ["check_batch", "sequence_first"]

from typing import TYPE_CHECKING, Any

from torch import nn

from scio_recorder._run.batches import position_scheme
from scio_recorder._support.tree import iter_tensors

from ._measure import verdict
from ._passes import NORMS, dropping, in_train_mode
from ._report import CheckLine, named
from ._rows import Rows, padding, rows_to_check

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from scio_recorder.layers import DepthIdx

    from ._passes import Run
    from ._report import Status


_SEQUENCE_FIRST = (nn.RNNBase, nn.MultiheadAttention)
"""The modules whose batch is dim 1 of their input unless ``batch_first``."""


def check_batch(
    run: Run, batched: dict[DepthIdx, Any], rows: int, unsplit: str | None
) -> CheckLine:
    """Compare rows run alone with the batch ``batched`` (its records)."""
    size = run.size
    keep = None if size is None or run.dim else padding(run.kwargs, size)
    if size is None or (size == 1 and (keep is None or bool(keep.all()))):
        return CheckLine(
            "batch",
            "WARN",
            None,
            "relative",
            "",
            "the batch has one row and no padding: nothing to compare batched against "
            "alone; check a batch of several rows",
        )
    if unsplit is not None:
        return CheckLine("batch", "WARN", None, "relative", "", unsplit)
    checked, empty = rows_to_check(size, keep, rows)
    found = Rows()
    for row in checked:
        found.compare(run, batched, row, None if keep is None else keep[row])
    notes = found.notes(run, empty)
    diff, dtype, where, row = found.worst
    per_layer = found.per_layer
    if not per_layer:  # nothing compared: say why, never PASS
        norms = in_train_mode(run.rnet.net, NORMS)
        if norms:  # the cause is certain all the same: FAIL, naming it
            return CheckLine(
                "batch",
                "FAIL",
                None,
                "relative",
                "",
                "; ".join([_norms(norms), *notes]),
            )
        return CheckLine("batch", "WARN", None, "relative", "", "; ".join(notes))
    status = verdict(diff, dtype, exact=False)
    place = f"{where}, row {row}" if where else ""
    if status == "PASS":
        cause = (
            "each row's records alone equal its records in the batch, up to "
            "float rounding"
        )
        if diff == 0:
            cause = "each row's records alone equal its records in the batch"
        if notes:
            status, cause = "WARN", f"{cause}, where compared"
    else:
        cause = _batch_cause(run, row, keep, status)
    return CheckLine(
        "batch", status, diff, "relative", place, "; ".join([cause, *notes]), per_layer
    )


def sequence_first(run: Run) -> str | None:
    """Say why the inputs' dim 0 is not the batch, if a sequence-first module shows it.

    ``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` and ``nn.MultiheadAttention`` built
    with ``batch_first=False`` take their batch on dim 1. One plain pass
    sees what they are given: if dim 1 of it is not the batch size, the
    inputs' dim 0 is not their batch (it is time); if dims 0 and 1 are both
    the batch size, which one is cannot be told.
    """
    modules = [
        (name or type(module).__name__, module)
        for name, module in run.rnet.net.named_modules()
        if isinstance(module, _SEQUENCE_FIRST) and not module.batch_first
    ]
    if not modules or run.size is None:
        return None
    seen: dict[str, torch.Size] = {}

    def hook(name: str) -> Any:
        def see(_module: nn.Module, args: Any, kwargs: Any) -> None:
            first = next(iter_tensors((args, kwargs)), None)
            if first is not None:
                seen.setdefault(name, first.shape)

        return see

    handles = [
        module.register_forward_pre_hook(hook(name), with_kwargs=True)
        for name, module in modules
    ]
    try:
        run.plain()
    finally:
        for handle in handles:
            handle.remove()
    for name, module in modules:
        shape = seen.get(name)
        if shape is None or len(shape) < 3:  # noqa: PLR2004 (not run, or unbatched)
            continue
        what = (
            f"`{name}` ({type(module).__name__}, batch_first=False) takes "
            f"{list(shape)}, its batch on dim 1"
        )
        if shape[1] != run.size:
            return (
                f"cannot split the batch: {what}, and the inputs' dim 0 "
                f"({run.size}) is not that batch (a sequence-first input); pass "
                "batch_dim=1 if dim 1 of the inputs is their batch"
            )
        if shape[0] == run.size:
            return (
                f"cannot split the batch: {what}, and dims 0 and 1 are both "
                f"{run.size}: which one is the batch cannot be told; pass "
                "batch_dim=0 or 1"
            )
    return None


def _batch_cause(run: Run, row: int, keep: Tensor | None, status: Status) -> str:
    """Say why row ``row``'s records alone differ from the batch's."""
    net = run.rnet.net
    padded = keep is not None and not bool(keep[row].all())
    norms = in_train_mode(net, NORMS)
    dropouts = dropping(net)
    if (
        padded
        and run.kwargs.get("position_ids") is None
        and position_scheme(net)
        in {
            "absolute",
            "relative",
        }
    ):
        return (
            f"row {row}'s records change with its padding: the model takes "
            "position_ids and the batch has none, so the row's tokens are numbered "
            "from its padding; pass position_ids = (mask.cumsum(-1) - 1).clamp(min=0), "
            "or run the batches through collect / activations.write, which derive "
            "them (position_ids='from_mask')"
        )
    if norms:
        return _norms(norms)
    if dropouts:
        return (
            f"dropout is active ({named(dropouts)} in train mode): rows alone draw "
            "other masks; call net.eval()"
        )
    if padded:
        return (
            f"row {row}'s records change with its padding: the net reads padded "
            "positions, or numbers positions from the padding"
        )
    if status == "WARN":
        return (
            f"row {row}'s records alone differ from the batch's beyond float "
            "rounding, but little: a reduction over the batch, or kernels that "
            "depend on the batch size"
        )
    layout = (
        ""
        if run.batch_dim is not None
        else "; or dim 0 of the inputs is not their batch (pass batch_dim=)"
    )
    return (
        f"row {row}'s records depend on its batch-mates: an operation mixes rows "
        f"(a statistic over the batch, attention or an index across rows){layout}"
    )


def _norms(norms: list[str]) -> str:
    """Say that BatchNorms in train mode (``norms``) tie rows together."""
    return (
        f"a BatchNorm in train mode ({named(norms)}) normalizes with the "
        "batch's own statistics, so a row's records depend on its batch-mates: "
        "call net.eval()"
    )
