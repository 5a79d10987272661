"""The ``"dtype"`` check: the records against a copy's in a wider dtype.

A float16 or bfloat16 model is compared with a float32 copy, a float32 one
with a float64 copy (:func:`_wide_records`: from the same buffers and
random state, on the batch cast), as relative error per layer. A copy
cannot stand for a quantized model (the float values its weights came from
are gone: :func:`_quantized`) nor for a tensor-parallel one (it would copy
every rank's shards): :func:`_not_widened` says why, and the check warns
instead.
"""

from __future__ import annotations

__all__ = ["check_dtype"]

import copy
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scio_recorder._engine.shards import tensor_parallel
from scio_recorder._support.files import dtype_name
from scio_recorder._support.tree import iter_tensors, map_tensors

from ._measure import difference, pairs, unmatched, verdict
from ._passes import compared, seeded
from ._report import CheckLine, named_plain, raised, skipped
from ._rows import padding

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx

    from ._passes import Run
    from ._report import Status


def check_dtype(
    run: Run, records: dict[DepthIdx, Any], *, copy_model: bool
) -> CheckLine:
    """Compare ``records`` with those of a copy of the model in a wider dtype."""
    net = run.rnet.net
    dtype = _float_dtype(net, (run.args, run.kwargs))
    if dtype == torch.float64 and not _quantized(net):
        return CheckLine(
            "dtype", "PASS", None, "relative", "", "float64: no wider dtype to compare"
        )
    why = _not_widened(net, dtype, copy_model=copy_model)
    if why is not None or dtype is None:
        return skipped("dtype", why or "no floating parameter, buffer or input")
    wide = torch.float32 if torch.finfo(dtype).bits < 32 else torch.float64  # noqa: PLR2004
    try:
        wider = _wide_records(run, wide)
    except Exception as error:  # noqa: BLE001 (the report says it, and goes on)
        why = f"a copy of the model in {dtype_name(wide)} raised {raised(error)}"
        return skipped("dtype", why)
    records, wider, left = _unpadded(run, records, wider)
    per_layer, (diff, _, where) = compared(run, records, wider)
    if not math.isfinite(diff):
        where, cause = _apart(run, records, wider, (dtype, wide))
        return CheckLine("dtype", "FAIL", diff, "relative", where, cause, per_layer)
    status: Status
    if dtype == torch.float32:
        status = verdict(diff, dtype, exact=False)
    else:  # 16-bit: its rounding shows, always (WARN), unless beyond 0.5
        status = "PASS" if diff == 0 else "WARN" if diff <= 0.5 else "FAIL"  # noqa: PLR2004
    cause = _dtype_cause(status, dtype, wide)
    if left:
        status = "WARN" if status == "PASS" else status
        cause = (
            f"{cause}, where compared; not compared: values of "
            f"{named_plain([run.describe(label) for label in left])} "
            f"that the {dtype_name(wide)} copy computes as NaN or inf and the "
            f"{dtype_name(dtype)} model does not, in a padded batch: the copy "
            "computes the padding otherwise (a softmax over masked scores only), "
            "and that spreads to the positions after it"
        )
    return CheckLine("dtype", status, diff, "relative", where, cause, per_layer)


def _apart(
    run: Run,
    records: dict[DepthIdx, Any],
    wider: dict[DepthIdx, Any],
    dtypes: tuple[torch.dtype, torch.dtype],
) -> tuple[str, str]:
    """Say where and why the records and the wider copy's are not comparable.

    The first call, in the order the calls ended, whose record is NaN or
    infinite on one side only, or another shape, or (an integer record)
    differs. NaN at the same places on both sides are no difference.
    """
    name, wider_name = (dtype_name(dtype) for dtype in dtypes)
    for label, record in records.items():
        for a, b in pairs(record, wider.get(label)):
            if math.isfinite(difference(a, b)):
                continue
            where = run.describe(label)
            if a.shape != b.shape:
                return where, (
                    f"the record has shape {list(a.shape)} in {name} and "
                    f"{list(b.shape)} in the {wider_name} copy: the model takes "
                    "another path in another dtype"
                )
            if not (a.is_floating_point() or a.is_complex()):
                return where, (
                    f"the record ({dtype_name(a.dtype)}) differs from the "
                    f"{wider_name} copy's: integers computed from values that "
                    f"differ by {name} rounding (an argmax, a threshold)"
                )
            return where, _one_sided(unmatched(a, b), unmatched(b, a), dtypes)
    return "", "a record is not comparable with the wider copy's"  # pragma: no cover


def _one_sided(
    narrow: set[str], wide: set[str], dtypes: tuple[torch.dtype, torch.dtype]
) -> str:
    """Say which side's NaN or infinities make a record not comparable."""
    name, wider = (dtype_name(dtype) for dtype in dtypes)
    said = [
        f"{' and '.join(sorted(kinds))} in {mine} where {other} does not"
        for kinds, mine, other in (
            (narrow, name, f"the {wider} copy"),
            (wide, f"the {wider} copy", f"the {name} model"),
        )
        if kinds
    ]
    if "inf" in narrow:
        range_ = " or bfloat16 (its range)" if torch.finfo(dtypes[0]).bits < 32 else ""  # noqa: PLR2004
        fix = f"{name} overflows; compute in {wider}{range_}"
    elif narrow:
        fix = f"the {name} computation makes NaN that the {wider} one does not"
    else:
        fix = f"the {wider} copy makes NaN or inf that the {name} model does not"
    return f"the record holds {', and '.join(said)}: {fix}"


def _not_widened(
    net: nn.Module, dtype: torch.dtype | None, *, copy_model: bool
) -> str | None:
    """Say why the records cannot be compared with a wider copy's (``None``: they can).

    Every rank of a tensor-parallel model finds the same reason (the
    model's structure gives it), so none copies while another waits.
    """
    quantized = _quantized(net)
    if quantized:
        return (
            f"quantized weights ({named_plain(quantized)}): a wider copy keeps "
            "their quantized values, and the float weights they came from are not "
            "here; the records carry the quantization's error (measure it against "
            "the float model: docs/bigmodels.md)"
        )
    if dtype is not None and not copy_model:
        return f"dtype_copy=False; the model computes in {dtype_name(dtype)}"
    if tensor_parallel(net):
        return (
            "a tensor-parallel model (DTensor parameters): a wider copy would copy "
            "every rank's shards; check the unsharded model"
        )
    return None


def _dtype_cause(status: Status, dtype: torch.dtype, wide: torch.dtype) -> str:
    """Say what a finite difference from the wider copy likely comes from."""
    name, wider = dtype_name(dtype), dtype_name(wide)
    if status == "PASS":
        return f"the {name} records equal a {wider} copy's up to {name} rounding"
    if torch.finfo(dtype).bits < 32:  # noqa: PLR2004
        return (
            f"the model computes in {name}: its records carry "
            f"{name} rounding (eps {torch.finfo(dtype).eps:.2g}), up to this "
            f"relative error against a {wider} copy; record a float32 copy of "
            "the model if that matters"
        )
    return (
        f"the records differ from a {wider} copy's beyond float32 "
        "rounding: an ill-conditioned layer (a near-singular normalization, a "
        "large cancellation)"
    )


def _float_dtype(net: nn.Module, inputs: Any) -> torch.dtype | None:
    """Return the dtype the net computes in.

    Its narrowest floating parameter's or buffer's; for a net with none,
    its inputs' narrowest floating dtype.
    """
    dtypes = {p.dtype for p in net.parameters() if p.is_floating_point()}
    dtypes |= {b.dtype for b in net.buffers() if b.is_floating_point()}
    if not dtypes:
        dtypes = {t.dtype for t in iter_tensors(inputs) if t.is_floating_point()}
    if not dtypes:
        return None
    return min(dtypes, key=lambda d: torch.finfo(d).bits)


def _quantized(net: nn.Module) -> list[str]:
    """Return the modules whose weights are quantized, named with the weights' type.

    A quantized weight is an integer tensor (bitsandbytes' ``Int8Params``,
    ``Params4bit``), a quantized torch tensor, or a tensor subclass other
    than a ``DTensor`` (torchao's ``Int8Tensor``, which reports float32 but
    holds int8 values): a copy cast to a wider dtype keeps its values.
    """
    found = []
    for name, module in net.named_modules():
        for param in module.parameters(recurse=False):
            kind = type(param)
            subclass = kind is not Tensor and not issubclass(kind, nn.Parameter)
            if (
                param.is_quantized
                or not (param.is_floating_point() or param.is_complex())
                or (subclass and kind.__name__ != "DTensor")
            ):
                found.append(f"`{name or type(module).__name__}` ({kind.__name__})")
                break
    return found


def _unpadded(
    run: Run, records: dict[DepthIdx, Any], wider: dict[DepthIdx, Any]
) -> tuple[dict[DepthIdx, Any], dict[DepthIdx, Any], list[DepthIdx]]:
    """Return both sides' records at the batch's kept positions, and what was left out.

    A padded batch (a 2-D ``attention_mask`` on the batch dimension 0)
    computes anything at its padding, which a model in another dtype may
    compute otherwise: only the kept positions are compared, as the batch
    check does. Each record of the batch's size on dim 0 keeps the values
    whose every dimension of the positions' length is a kept position (dim
    1 of hidden states, both the query and key dims of attention weights),
    as a flat tensor; the others are compared whole. NaN or infinities that
    the wider copy alone computes are left out too (the third value names
    their calls): a padding position the copy computes as NaN (a softmax
    over masked scores only, computed in float32 inside a float64 model:
    ``finfo(float64).min`` is ``-inf`` there) spreads to kept positions in
    the layers after it, where the model itself computes numbers.
    """
    size = run.size
    keep = None if size is None or run.dim else padding(run.kwargs, size)
    if keep is None or bool(keep.all()):
        return records, wider, []
    narrow: dict[DepthIdx, Any] = {}
    wide: dict[DepthIdx, Any] = {}
    left: list[DepthIdx] = []
    for label in run.labels:
        cut = [_cut(a, b, keep) for a, b in pairs(records[label], wider[label])]
        narrow[label] = [a for a, _, _ in cut]
        wide[label] = [b for _, b, _ in cut]
        if any(dropped for _, _, dropped in cut):
            left.append(label)
    return narrow, wide, left


def _cut(a: Tensor, b: Tensor, keep: Tensor) -> tuple[Tensor, Tensor, bool]:
    """Return ``a`` and ``b`` at the kept positions, and whether ``b``'s own NaN were.

    (See :func:`_unpadded`.) Another shape is returned as it is: the
    comparison says so.
    """
    if a.shape != b.shape:
        return a, b, False
    mask = _kept(a, keep)
    dropped = False
    if b.is_floating_point() or b.is_complex():
        only_wide = ~b.isfinite() & a.isfinite()
        if bool(only_wide.any()):
            mask = torch.ones_like(only_wide) if mask is None else mask
            dropped = bool((only_wide & mask).any())
            mask &= ~only_wide
    if mask is None:
        return a, b, False
    return a[mask], b[mask], dropped


def _kept(value: Tensor, keep: Tensor) -> Tensor | None:
    """Return where ``value`` is at kept positions (``None``: no positions' dim).

    Every dimension but 0 of the positions' length counts; dim 0 must be
    the batch's.
    """
    rows, length = keep.shape
    if value.dim() < 2 or value.shape[0] != rows:  # noqa: PLR2004 (batch, positions)
        return None
    mask = torch.ones(value.shape, dtype=torch.bool, device=value.device)
    found = False
    for dim in range(1, value.dim()):
        if value.shape[dim] == length:
            shape = [length if d == dim else 1 for d in range(1, value.dim())]
            mask &= keep.to(value.device).reshape(rows, *shape)
            found = True
    return mask if found else None


def _wide_records(run: Run, wide: torch.dtype) -> dict[DepthIdx, Any]:
    """Return the records of a copy of the model in ``wide``, on the batch cast."""
    run.state.restore()  # the copy starts from the state the other passes do
    copied = copy.deepcopy(run.rnet)
    copied.net.to(wide)

    def cast(value: Tensor) -> Tensor:
        return value.to(wide) if value.is_floating_point() else value

    args, kwargs = map_tensors(cast, run.args), map_tensors(cast, run.kwargs)
    with copied.selecting(*run.labels), seeded(enabled=True):
        copied(*args, **kwargs)
        return dict(copied.activations)
