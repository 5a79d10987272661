"""A self-check of a recording job: are the records what you think they are.

:func:`scio_recorder.check` (also :meth:`Recorder.check
<scio_recorder.Recorder.check>` and ``scio-recorder check``) runs the user's
model on the user's batch a few times and reports six checks, one line
each, PASS, WARN or FAIL, with the largest difference, where it is, and its
likely cause in words:

* ``"recording"``: the net's outputs with the recorder and without it
  (no hook at all), same random state: bit-equal;
* ``"batch"``: each row's records batched against the row run alone, its
  padding removed (a 2-D ``attention_mask`` tells which columns are
  padding): equal up to float rounding. This catches position ids that
  follow the padding, ``BatchNorm`` in train mode and any leak across rows;
* ``"determinism"``: two passes on the batch, the second from where the
  first left the net: bit-equal (dropout left on, random operations, state
  kept between passes, nondeterministic kernels);
* ``"dtype"``: the records against those of a copy of the model in a wider
  dtype (float32 for bfloat16 and float16 models, float64 for float32
  ones), as relative error per layer;
* ``"inplace"``: the records a later in-place operation overwrites (known
  from the reference pass, and copied so that they stay exact), and any
  record changed in place that nobody could know in advance;
* ``"calls"``: each checked call ran as in the reference pass (the call
  plan).

What a check could not compare makes it WARN, never PASS, and its cause
says what and why: records with no batch dimension (a record's batch
dimension is told by its shapes, batched and alone), inputs whose dim 0 is
not the batch (a sequence-first module shows it; ``batch_dim=`` says
where it is), rows of padding only, rows that raise alone, and models a
wider copy cannot stand for (quantized, tensor-parallel). Every compared
pass starts from the buffers the check found, and its records are copies
taken as it ends, so state kept between passes shows in ``determinism``
only.

Tolerances. Records computed by different kernels (a batch of 5 rows is
not blocked as a batch of 1) differ by roundings: up to ``1024 eps`` of the
record's dtype, relative to the record's largest magnitude, is rounding
(PASS); beyond ``100`` times that, or beyond 0.5, it is not (FAIL); in
between, WARN. Bit-equal checks (recording, determinism) pass only when
equal; a difference within the rounding tolerance warns.

Why a module of its own: the checks run the recorder and its net many
times and compare what they give, which no pass of the engine does; it is
loaded when first used (``scio_recorder.check``, ``rnet.check``), not by
``import scio_recorder``. It takes the recorder as it is given (the
recorder's module imports it, not the other way round).
"""

from __future__ import annotations

__all__ = ["CHECKS", "CheckLine", "CheckReport", "check_net", "check_recorder"]

import contextlib
import copy
import dataclasses
import html
import math
import warnings
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy

from ._batches import as_arguments, first_batch_size, position_scheme
from ._engine.shards import tensor_parallel
from ._errors import CallPlanError, InPlaceWarning
from ._preserve import preserved
from ._render import html_table
from ._tree import iter_tensors, map_tensors
from .select import as_list, resolve

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from ._engine.plan import RecordOptions
    from .layers import DepthIdx, Layer

CHECKS = ("recording", "batch", "determinism", "dtype", "inplace", "calls")
"""The checks' names, in the report's order."""

Status = Literal["PASS", "WARN", "FAIL"]

_SEED = 0
"""The random state every compared pass starts from (dropout draws alike)."""

_COLUMNS = ("check", "result", "magnitude", "where", "likely cause")


@dataclasses.dataclass(frozen=True)
class CheckLine:
    """One check of a :class:`CheckReport`.

    Attributes
    ----------
    name : str
        One of :data:`CHECKS`.
    status : {"PASS", "WARN", "FAIL"}
        The verdict.
    magnitude : float or None
        The largest difference found (what ``measure`` says), ``None`` when
        nothing was measured.
    measure : str
        What ``magnitude`` is, e.g. ``"relative"`` (the largest absolute
        difference over the record's largest magnitude) or ``"max |diff|"``.
    where : str
        Where the largest difference is: the layer, and the row.
    cause : str
        The likely cause, in words (or what passed).
    layers : mapping of str to float
        The magnitude per layer (label ``"depth-idx"``), where measured.
    """

    name: str
    status: Status
    magnitude: float | None
    measure: str
    where: str
    cause: str
    layers: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def cells(self) -> list[str]:
        """Return the line's cells, as the tables show them."""
        return [self.name, self.status, _shown(self), self.where or "-", self.cause]


def _shown(line: CheckLine) -> str:
    if line.magnitude is None:
        return "-"
    if line.magnitude == 0:
        return "bit-equal" if line.measure != "count" else "0"
    if line.measure == "count":
        return str(int(line.magnitude))
    return f"{line.magnitude:.3g} {line.measure}"


class CheckReport:
    """What :func:`check` found: one :class:`CheckLine` per check.

    ``str(report)`` is a text table, ``report._repr_html_()`` an HTML one
    (what a notebook shows); ``report["batch"]`` is one line.

    Attributes
    ----------
    lines : tuple of CheckLine
        The checks, in the order of :data:`CHECKS`.
    """

    def __init__(self, lines: Sequence[CheckLine]) -> None:
        self.lines = tuple(lines)

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the checks that failed."""
        return tuple(line.name for line in self.lines if line.status == "FAIL")

    @property
    def warned(self) -> tuple[str, ...]:
        """The names of the checks that warned."""
        return tuple(line.name for line in self.lines if line.status == "WARN")

    @property
    def passed(self) -> bool:
        """Whether no check failed."""
        return not self.failed

    def __getitem__(self, name: str) -> CheckLine:
        """Return the line of check ``name``."""
        for line in self.lines:
            if line.name == name:
                return line
        msg = f"No check named {name!r}: the checks are {', '.join(CHECKS)}."
        raise KeyError(msg)

    def __str__(self) -> str:
        """Return the report as an aligned text table."""
        rows = [list(_COLUMNS), *(line.cells() for line in self.lines)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
        out = []
        for k, row in enumerate(rows):
            cells = [
                cell.ljust(width) for cell, width in zip(row, widths, strict=False)
            ]
            out.append("  ".join([*cells, row[-1]]).rstrip())
            if k == 0:
                out.append("  ".join("-" * w for w in [*widths, len(row[-1])]))
        return "\n".join(out)

    def __repr__(self) -> str:
        """Return a one-line summary."""
        found = ", ".join(f"{line.name} {line.status}" for line in self.lines)
        return f"CheckReport({found})"

    def _repr_html_(self) -> str:
        """Return the report as an HTML table (one row per check)."""
        table = html_table(
            list(_COLUMNS),
            [line.cells() for line in self.lines],
            highlight=[line.status != "PASS" for line in self.lines],
            caption="scio_recorder.check",
        )
        colours = {"PASS": "#1a7f37", "WARN": "#9a6700", "FAIL": "#cf222e"}
        for status, colour in colours.items():
            cell = f'<td style="text-align:left">{html.escape(status)}</td>'
            table = table.replace(
                cell,
                f'<td style="text-align:left;color:{colour};font-weight:bold">'
                f"{status}</td>",
            )
        return table


# -- tolerances --------------------------------------------------------------


def _tolerance(dtype: torch.dtype) -> float:
    """Return the largest relative difference that float rounding explains.

    ``1024 eps`` of the dtype (a few hundred roundings, each at most ``eps``
    relative to the largest magnitude), at most 1/16 (bfloat16, float16).
    """
    if not dtype.is_floating_point:
        return 0.0
    return min(1024 * torch.finfo(dtype).eps, 1 / 16)


def _verdict(relative: float, dtype: torch.dtype, *, exact: bool) -> Status:
    """Say PASS, WARN or FAIL of a relative difference between records.

    PASS: equal, or (unless ``exact``) within rounding. FAIL: beyond 100
    times the rounding tolerance, or beyond 0.5. WARN in between (and, when
    ``exact``, within rounding).
    """
    tolerance = _tolerance(dtype)
    if relative == 0 or (not exact and relative <= tolerance):
        return "PASS"
    if relative <= min(100 * tolerance, 0.5):
        return "WARN"
    return "FAIL"


def _difference(a: Tensor, b: Tensor) -> float:
    """Return max ``|a - b|`` over max ``|b|`` (0: equal; inf: not comparable)."""
    if a.shape != b.shape:
        return math.inf
    if torch.equal(a, b):
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return math.inf
    wide = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(wide), b.to(wide)
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool((finite | (a == b)).all()):
        return math.inf  # a NaN or an infinity on one side only
    scale = float(b[finite].abs().max()) if bool(finite.any()) else 0.0
    diff = float((a - b)[finite].abs().max()) if bool(finite.any()) else 0.0
    return diff / scale if scale > 0 else (math.inf if diff > 0 else 0.0)


# -- inputs ------------------------------------------------------------------


def _arguments(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the batch as the net's arguments (a mapping: keywords; a tuple)."""
    return as_arguments(batch, spread=True)


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any], dim: int) -> int | None:
    """Return dim ``dim`` of the first tensor among the arguments that has it."""
    if dim == 0:
        return first_batch_size(args, kwargs)
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() > dim:
            return int(value.shape[dim])
    return None


def _padding(kwargs: Mapping[str, Any], size: int) -> Tensor | None:
    """Return the ``[batch, positions]`` mask of kept tokens, if the batch has one."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] == size:  # noqa: PLR2004 (batch, positions)
        return mask != 0
    return None


def _row_alone(
    run: _Run, row: int, keep: Tensor | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Row ``row`` of the batch alone, its padding (``keep`` false) removed.

    Every input with the batch's size on the batch dimension is cut there;
    the others (a scalar, a table shared by the rows) go whole.
    """
    size, dim = run.size, run.dim
    columns = None if keep is None or bool(keep.all()) else keep
    width = None if keep is None else keep.shape[0]

    def take(value: Tensor) -> Tensor:
        if value.dim() <= dim or value.shape[dim] != size:
            return value
        value = value.narrow(dim, row, 1)
        if columns is not None and value.dim() >= 2 and value.shape[1] == width:  # noqa: PLR2004
            value = value[:, columns.to(value.device)]
        return value

    return map_tensors(take, run.args), map_tensors(take, run.kwargs)


def _rows_to_check(
    size: int, keep: Tensor | None, rows: int
) -> tuple[list[int], list[int]]:
    """Return the rows compared alone (the most padded first), and the empty ones.

    A row with no real token (all padding) has nothing to run alone: it is
    returned apart, so that the report says so.
    """
    if keep is None:
        return list(range(min(size, rows))), []
    real = keep.sum(1).tolist()
    empty = [r for r in range(size) if not real[r]]
    order = sorted((r for r in range(size) if real[r]), key=lambda r: (real[r], r))
    return sorted(order[:rows]), empty


# -- what the net is -----------------------------------------------------------


def _modules(net: nn.Module, kinds: tuple[type[nn.Module], ...]) -> list[str]:
    """Return the qualified names of the modules of ``kinds`` in train mode."""
    return [
        name or type(module).__name__
        for name, module in net.named_modules()
        if isinstance(module, kinds) and module.training
    ]


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)


def _named(names: list[str]) -> str:
    return _named_plain([f"`{name}`" for name in names])


def _named_plain(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")  # noqa: PLR2004


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


_SEQUENCE_FIRST = (nn.RNNBase, nn.MultiheadAttention)
"""The modules whose batch is dim 1 of their input unless ``batch_first``."""


class _State:
    """The net's buffers as the check found them, put back before each pass.

    A net that keeps state in a buffer (a running sum, a cache) and changes
    it in place would start each pass from where the previous one left it;
    every comparison of the check starts from the same state instead, and
    :meth:`changed` names the buffers that one pass changed (the cause of a
    determinism failure).
    """

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        with torch.no_grad():
            self.saved = [
                (qualified, module, name, buffer, buffer.clone())
                for qualified, module, name, buffer in _buffers(net)
            ]

    def restore(self) -> None:
        """Put every buffer back (the object in its slot and its values)."""
        with torch.no_grad():
            for _, module, name, buffer, saved in self.saved:
                if module._buffers.get(name) is not buffer:  # noqa: SLF001 (reassigned by a pass)
                    module._buffers[name] = buffer  # noqa: SLF001
                if not torch.equal(buffer, saved):
                    with torch.inference_mode(buffer.is_inference()):
                        buffer.copy_(saved)

    def changed(self) -> list[str]:
        """Return the buffers a pass changed, but a train-mode BatchNorm's statistics.

        Those statistics change at every pass in train mode, but a pass in
        train mode does not read them.
        """
        return [
            qualified
            for qualified, module, name, buffer, saved in self.saved
            if not (isinstance(module, _NORMS) and module.training)
            and (
                module._buffers.get(name) is not buffer  # noqa: SLF001 (reassigned)
                or not torch.equal(buffer, saved)
            )
        ]


_NORMS = (nn.modules.batchnorm._BatchNorm,)  # noqa: SLF001 (the base of every BatchNorm)


def _buffers(net: nn.Module) -> Iterator[tuple[str, nn.Module, str, Tensor]]:
    """Yield each buffer with its qualified name, its module and its name there."""
    for prefix, module in net.named_modules():
        for name, buffer in module._buffers.items():  # noqa: SLF001 (non-persistent ones too)
            if buffer is not None and not is_lazy(buffer) and not buffer.is_meta:
                yield (f"{prefix}.{name}" if prefix else name), module, name, buffer


# -- the passes -------------------------------------------------------------------


@dataclasses.dataclass
class _Run:
    """The recorder, the batch, and what each pass gave."""

    rnet: Any
    """The :class:`~scio_recorder.Recorder` (this module sits below it)."""
    labels: list[DepthIdx]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batch_dim: int | None
    """The batch dimension the user named; ``None``: dim 0, unless the net says not."""
    state: _State
    output: Any = None
    """The net's output of the latest pass (a copy taken as the pass ended)."""

    @property
    def dim(self) -> int:
        """The dimension the rows are split on."""
        return self.batch_dim or 0

    @property
    def size(self) -> int | None:
        """The batch size (``None``: no input has the batch dimension)."""
        return _batch_size(self.args, self.kwargs, self.dim)

    def records(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        seed: bool,
        restore: bool = True,
    ) -> dict[DepthIdx, Any]:
        """Run one recorded pass; return copies of its records, taken as it ends.

        From the fixed random state if ``seed``, and from the state the net
        was found in if ``restore`` (its buffers put back). Copies, because
        a record may be a tensor that the net changes later (a buffer it
        returns and updates at the next pass): two passes' records would
        then be one tensor, always equal to itself.
        """
        args = self.args if args is None else args
        kwargs = self.kwargs if kwargs is None else kwargs
        if restore:
            self.state.restore()
        with _seeded(enabled=seed):
            self.output = _copied(self.rnet(*args, **kwargs))
        return {label: _copied(value) for label, value in self.rnet.activations.items()}

    def plain(self) -> Any:
        """Run the net with no hook at all, from the fixed state; return its output."""
        with self.rnet.selecting():
            self.records(seed=True)
        return self.output

    def describe(self, label: DepthIdx) -> str:
        row: Layer = self.rnet.table[label]
        return row.describe()


def _copied(value: Any) -> Any:
    return map_tensors(lambda tensor: tensor.clone(), value)


@contextlib.contextmanager
def _seeded(*, enabled: bool) -> Iterator[None]:
    if enabled:
        torch.manual_seed(_SEED)
    yield


def _pairs(batched: Any, alone: Any) -> Iterator[tuple[Tensor, Tensor]]:
    yield from zip(iter_tensors(batched), iter_tensors(alone), strict=False)


# -- the checks --------------------------------------------------------------


def _check_recording(run: _Run, plain: Any, recorded: Any) -> CheckLine:
    worst, dtype = 0.0, torch.float32
    for a, b in _pairs(recorded, plain):
        diff = _difference(a, b)
        if diff > worst:
            worst, dtype = diff, b.dtype
    status = _verdict(worst, dtype, exact=True)
    if status == "PASS":
        cause = "the outputs with and without the recorder are bit-equal"
    else:
        fused = [
            run.rnet.table[label].name
            for label in run.labels
            if _inside(run.rnet.net, run.rnet.table[label].name, _FUSED)
        ]
        cause = (
            f"recording calls inside {_named(fused)} turns off the fused fast "
            "path of the module around them (any hook does): the outputs change by "
            "roundings; record the module itself to keep it fused"
            if fused
            else "the outputs change when the net is recorded: a module computes "
            "another way when a hook is on it or on a submodule (a fused fast path, "
            "as torch's TransformerEncoderLayer has)"
        )
    return CheckLine("recording", status, worst, "relative", "the net's output", cause)


_FUSED = (nn.TransformerEncoderLayer, nn.MultiheadAttention)


def _inside(net: nn.Module, name: str, kinds: tuple[type[nn.Module], ...]) -> bool:
    parts = name.split(".") if name else []
    return any(
        isinstance(net.get_submodule(".".join(parts[:k])), kinds)
        for k in range(len(parts))
        if k
    )


def _check_batch(
    run: _Run, batched: dict[DepthIdx, Any], rows: int, unsplit: str | None
) -> CheckLine:
    size = run.size
    keep = None if size is None or run.dim else _padding(run.kwargs, size)
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
    checked, empty = _rows_to_check(size, keep, rows)
    found = _Rows()
    for row in checked:
        found.compare(run, batched, row, None if keep is None else keep[row])
    notes = found.notes(run, empty)
    diff, dtype, where, row = found.worst
    per_layer = found.per_layer
    if not per_layer:  # nothing compared: say why, never PASS
        return CheckLine("batch", "WARN", None, "relative", "", "; ".join(notes))
    status = _verdict(diff, dtype, exact=False)
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


_Kind = Literal["split", "shared", "whole"]
"""How a record relates to the rows: cut along the batch dimension (its size
is the batch's), shared by every row (size 1 there, as a broadcast table),
or of the whole batch (neither: a statistic over it, or rows reshaped into
another dimension)."""


@dataclasses.dataclass
class _Rows:
    """What comparing rows alone with the batch found, record by record.

    A record is keyed ``(label, i)``: the ``i``-th tensor of the label's
    record. A split record must be compared on every row run alone; a
    shared one (the same tensor for every row) on one row at least, where
    its shape is the row alone's (a row without padding); a record of the
    whole batch cannot be compared by row.
    """

    per_layer: dict[str, float] = dataclasses.field(default_factory=dict)
    worst: tuple[float, torch.dtype, str, int] = (0.0, torch.float32, "", -1)
    """The largest difference, its dtype, its layer and its row."""
    failed: list[str] = dataclasses.field(default_factory=list)
    """What each row that raised alone raised."""
    kinds: dict[tuple[DepthIdx, int], _Kind] = dataclasses.field(default_factory=dict)
    compared: set[tuple[DepthIdx, int]] = dataclasses.field(default_factory=set)
    unmatched: dict[tuple[DepthIdx, int], list[int]] = dataclasses.field(
        default_factory=dict
    )
    """The split records whose row slice did not match the row alone: the rows."""

    def compare(
        self,
        run: _Run,
        batched: dict[DepthIdx, Any],
        row: int,
        keep: Tensor | None,
    ) -> None:
        """Run ``row`` alone (its padding, ``keep`` false, removed) and compare."""
        try:
            alone = run.records(*_row_alone(run, row, keep), seed=True)
        except Exception as error:  # noqa: BLE001 (what the row alone raised is the finding)
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            self.failed.append(
                f"row {row} alone raised {type(error).__name__} ({first})"
            )
            return
        stripped = keep if keep is not None and not bool(keep.all()) else None
        for label in run.labels:
            wholes = list(iter_tensors(batched[label]))
            singles = list(iter_tensors(alone[label]))
            if len(wholes) != len(singles):  # another structure: no pairing is sound
                self.kinds.update({(label, i): "whole" for i in range(len(wholes))})
                continue
            for i, (whole, single) in enumerate(zip(wholes, singles, strict=True)):
                kind, mine = _row_slice(whole, single, (row, run.size or 0), stripped)
                self.kinds[label, i] = kind
                if mine is None:
                    if kind == "split":
                        self.unmatched.setdefault((label, i), []).append(row)
                    continue
                self.compared.add((label, i))
                diff = _difference(mine, single)
                key = run.rnet.table[label].label_str
                self.per_layer[key] = max(self.per_layer.get(key, 0.0), diff)
                if diff > self.worst[0]:
                    self.worst = (diff, single.dtype, run.describe(label), row)

    def notes(self, run: _Run, empty: list[int]) -> list[str]:
        """Say what could not be compared, and why."""
        notes = []
        if empty:
            rows = ", ".join(map(str, empty))
            notes.append(
                f"row{'s' * (len(empty) > 1)} {rows} "
                f"{'have' if len(empty) > 1 else 'has'} no real token (all padding): "
                "not run alone"
            )
        notes += [f"{text}: not compared" for text in self.failed]
        whole = _labels_of(k for k, kind in self.kinds.items() if kind == "whole")
        shared = _labels_of(
            k
            for k, kind in self.kinds.items()
            if kind == "shared" and k not in self.compared
        )
        if whole:
            notes.append(
                f"not compared: records of {_described(run, whole)} have no batch "
                f"dimension of size {run.size} (a record of the whole batch, or rows "
                "reshaped into another dimension)"
            )
        norms = _modules(run.rnet.net, _NORMS)
        if norms and (whole or self.failed):
            notes.append(
                f"a BatchNorm in train mode ({_named(norms)}) ties rows together "
                "whatever the layout: call net.eval()"
            )
        if shared:
            notes.append(
                f"not compared: records of {_described(run, shared)} are shared by "
                "every row (batch dimension of size 1), and no checked row alone "
                "gives them the same shape (its padding cut)"
            )
        if self.unmatched:
            missed = sorted({row for rows in self.unmatched.values() for row in rows})
            notes.append(
                f"not compared on row{'s' * (len(missed) > 1)} "
                f"{', '.join(map(str, missed))}: records of "
                f"{_described(run, _labels_of(self.unmatched))} do not have the row "
                "alone's shape once its padding is cut"
            )
        return notes


def _labels_of(keys: Any) -> list[DepthIdx]:
    """Return the labels of record keys ``(label, i)``, in order, once each."""
    return list(dict.fromkeys(label for label, _ in keys))


def _described(run: _Run, labels: list[DepthIdx]) -> str:
    shown = ", ".join(run.describe(label) for label in labels[:3])
    return shown + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")  # noqa: PLR2004


def _row_slice(
    whole: Tensor, single: Tensor, where: tuple[int, int], keep: Tensor | None
) -> tuple[_Kind, Tensor | None]:
    """Return how a record relates to the rows, and row ``row``'s part of it.

    ``where``: the row and the batch size. The record's batch dimension is
    told by its shapes, batched and alone: the one dimension of the batch's
    size that is 1 in the row alone, the others equal (a sequence-first
    layer's ``[T, B, F]`` output and ``[1, B, F]`` state are cut on dim 1).
    A padded row's part has its padding columns (``keep`` false) cut from
    dim 1 of a record batched on dim 0. ``None`` as the part: no part of
    the record has the shape of the row alone's.
    """
    size = where[1]
    if whole.dim() == single.dim():
        parts = _cuts(whole, single, where, keep)
        if len(parts) == 1 or (parts and size == 1):  # one way to cut it
            return "split", parts[0]
        if parts:  # several dimensions would do: whose rows they are is unknown
            return "whole", None
        if any(
            whole.shape[d] == size and single.shape[d] == 1 for d in range(whole.dim())
        ):  # a batch dimension, but no cut has the row alone's shape
            return "split", None
    if size > 1 and whole.dim() >= 1 and whole.shape[0] == 1:  # broadcast to every row
        return "shared", whole if whole.shape == single.shape else None
    return "whole", None


def _cuts(
    whole: Tensor, single: Tensor, where: tuple[int, int], keep: Tensor | None
) -> list[Tensor]:
    """Return row ``row``'s part of ``whole`` along each dimension that gives one."""
    row, size = where
    parts = []
    for dim in range(whole.dim()):
        if whole.shape[dim] != size or single.shape[dim] != 1:
            continue
        mine = whole.narrow(dim, row, 1)
        if dim == 0 and keep is not None and mine.shape[1:2] == keep.shape:
            mine = mine[:, keep.to(mine.device)]
        if mine.shape == single.shape:
            parts.append(mine)
    return parts


def _sequence_first(run: _Run) -> str | None:
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


def _batch_cause(run: _Run, row: int, keep: Tensor | None, status: Status) -> str:
    net = run.rnet.net
    padded = keep is not None and not bool(keep[row].all())
    norms = _modules(net, _NORMS)
    dropouts = _modules(net, _DROPOUTS)
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
        return (
            f"a BatchNorm in train mode ({_named(norms)}) normalizes with the "
            "batch's own statistics, so a row's records depend on its batch-mates: "
            "call net.eval()"
        )
    if dropouts:
        return (
            f"dropout is active ({_named(dropouts)} in train mode): rows alone draw "
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


def _compared(
    run: _Run, records: dict[DepthIdx, Any], reference: dict[DepthIdx, Any]
) -> tuple[dict[str, float], tuple[float, torch.dtype, str]]:
    """Compare two passes' records, layer by layer.

    Return the largest relative difference per layer, and the largest of
    all with the reference's dtype and the layer it is at.
    """
    per_layer: dict[str, float] = {}
    worst = (0.0, torch.float32, "")
    for label in run.labels:
        for a, b in _pairs(records[label], reference[label]):
            diff = _difference(a, b)
            key = run.rnet.table[label].label_str
            per_layer[key] = max(per_layer.get(key, 0.0), diff)
            if diff > worst[0]:
                worst = (diff, b.dtype, run.describe(label))
    return per_layer, worst


def _check_determinism(
    run: _Run,
    first: dict[DepthIdx, Any],
    second: dict[DepthIdx, Any],
    changed: list[str],
) -> tuple[CheckLine, str | None]:
    """Compare two passes, the second run from where the first left the net.

    ``changed``: the buffers the first pass changed. Return the line, and
    what the other checks' differences may come from when the net keeps
    state between passes that the check cannot put back, or draws random
    numbers otherwise than by ``nn.Dropout`` (``None``: neither).
    """
    per_layer, (diff, dtype, where) = _compared(run, second, first)
    status = _verdict(diff, dtype, exact=True)
    dropouts = _modules(run.rnet.net, _DROPOUTS)
    note = None
    if status == "PASS":
        cause = "two passes on the batch give bit-equal records"
    elif dropouts:
        status = "FAIL"
        cause = (
            f"dropout is active ({_named(dropouts)} in train mode): each pass "
            "draws other masks; call net.eval()"
        )
    elif changed:
        status = "FAIL"
        cause = (
            f"state kept between passes: a pass changes the buffer {_named(changed)} "
            "in place and the next pass reads it, so two passes on the same batch "
            "differ (the other checks start each pass from the state found)"
        )
    elif _compared(run, run.records(seed=True), first)[1][0] == 0:
        status = "FAIL"  # the same random state repeats it: random draws
        cause = (
            "two passes on the same batch differ, and two from the same random "
            "state do not: the forward draws random numbers (a random operation "
            "other than an nn.Dropout in train mode)"
        )
        note = (
            "the forward draws random numbers (see determinism), and a row alone "
            "or a copy in another dtype draws others"
        )
    elif status == "WARN":
        cause = (
            "two passes differ by roundings: nondeterministic kernels (atomic "
            "additions on a GPU); torch.use_deterministic_algorithms(True) makes "
            "them repeat"
        )
    else:
        note = (
            "the net keeps state between passes (see determinism), so the passes "
            "compared here did not start from the same state"
        )
        cause = (
            "two passes on the same batch differ, even from the same random state "
            "and buffers: the net keeps state between passes outside its buffers "
            "(an attribute a pass changes)"
        )
    line = CheckLine("determinism", status, diff, "relative", where, cause, per_layer)
    return line, note


def _from_passes(line: CheckLine, note: str) -> CheckLine:
    """Say that a line's difference may come from what ``note`` says of the passes."""
    if line.status == "PASS" or line.magnitude is None or line.measure != "relative":
        return line
    return dataclasses.replace(
        line, cause=f"{note}: this difference may come from that"
    )


def _check_dtype(
    run: _Run, records: dict[DepthIdx, Any], *, copy_model: bool
) -> CheckLine:
    net = run.rnet.net
    dtype = _float_dtype(net, (run.args, run.kwargs))
    if dtype == torch.float64 and not _quantized(net):
        return CheckLine(
            "dtype", "PASS", None, "relative", "", "float64: no wider dtype to compare"
        )
    why = _not_widened(net, dtype, copy_model=copy_model)
    if why is not None or dtype is None:
        return _skipped("dtype", why or "no floating parameter, buffer or input")
    wide = torch.float32 if torch.finfo(dtype).bits < 32 else torch.float64  # noqa: PLR2004
    try:
        wider = _wide_records(run, wide)
    except Exception as error:  # noqa: BLE001 (the report says it, and goes on)
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return _skipped(
            "dtype",
            f"a copy of the model in {_name(wide)} raised {type(error).__name__} "
            f"({first})",
        )
    per_layer, (diff, _, where) = _compared(run, records, wider)
    if not math.isfinite(diff):
        status: Status = "FAIL"
    elif dtype == torch.float32:
        status = _verdict(diff, dtype, exact=False)
    else:  # 16-bit: its rounding shows, always (WARN), unless beyond 0.5
        status = "PASS" if diff == 0 else "WARN" if diff <= 0.5 else "FAIL"  # noqa: PLR2004
    cause = _dtype_cause(status, diff, dtype, wide)
    return CheckLine("dtype", status, diff, "relative", where, cause, per_layer)


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
            f"quantized weights ({_named_plain(quantized)}): a wider copy keeps "
            "their quantized values, and the float weights they came from are not "
            "here; the records carry the quantization's error (measure it against "
            "the float model: docs/bigmodels.md)"
        )
    if dtype is not None and not copy_model:
        return f"dtype_copy=False; the model computes in {_name(dtype)}"
    if tensor_parallel(net):
        return (
            "a tensor-parallel model (DTensor parameters): a wider copy would copy "
            "every rank's shards; check the unsharded model"
        )
    return None


def _dtype_cause(
    status: Status, diff: float, dtype: torch.dtype, wide: torch.dtype
) -> str:
    if status == "PASS":
        return (
            f"the {_name(dtype)} records equal a {_name(wide)} copy's up to "
            f"{_name(dtype)} rounding"
        )
    if not math.isfinite(diff):
        return (
            f"a record overflows or is NaN in {_name(dtype)} and not in "
            f"{_name(wide)}: compute in {_name(wide)} or bfloat16 (its range)"
        )
    if torch.finfo(dtype).bits < 32:  # noqa: PLR2004
        return (
            f"the model computes in {_name(dtype)}: its records carry "
            f"{_name(dtype)} rounding (eps {torch.finfo(dtype).eps:.2g}), up to this "
            f"relative error against a {_name(wide)} copy; record a float32 copy of "
            "the model if that matters"
        )
    return (
        f"the records differ from a {_name(wide)} copy's beyond float32 "
        "rounding: an ill-conditioned layer (a near-singular normalization, a "
        "large cancellation)"
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _wide_records(run: _Run, wide: torch.dtype) -> dict[DepthIdx, Any]:
    """Return the records of a copy of the model in ``wide``, on the batch cast."""
    run.state.restore()  # the copy starts from the state the other passes do
    copied = copy.deepcopy(run.rnet)
    copied.net.to(wide)

    def cast(value: Tensor) -> Tensor:
        return value.to(wide) if value.is_floating_point() else value

    args, kwargs = map_tensors(cast, run.args), map_tensors(cast, run.kwargs)
    with copied.selecting(*run.labels), _seeded(enabled=True):
        copied(*args, **kwargs)
        return dict(copied.activations)


def _check_inplace(run: _Run, changed: dict[DepthIdx, float]) -> CheckLine:
    """Check in-place overwrites; ``changed``: label -> how much its record moved."""
    table = run.rnet.table
    known = [label for label in run.labels if "output" in table[label].overwritten]
    if changed:
        labels = sorted(changed, key=lambda label: -changed[label])
        return CheckLine(
            "inplace",
            "FAIL",
            changed[labels[0]],
            "relative",
            ", ".join(table[label].describe() for label in labels[:3]),
            "a record was changed in place by an operation the reference pass did not "
            "run (another mode, a data-dependent branch), so it no longer holds the "
            "layer's output: rnet.record(..., clone=True) keeps it exact",
            {table[label].label_str: changed[label] for label in labels},
        )
    if known:
        shown = ", ".join(table[label].describe() for label in known[:3])
        more = f" and {len(known) - 3} more" if len(known) > 3 else ""  # noqa: PLR2004
        return CheckLine(
            "inplace",
            "WARN",
            len(known),
            "count",
            shown + more,
            "a later in-place operation overwrites these outputs (e.g. "
            "ReLU(inplace=True) after them): the recorder copies them, so its records "
            "are exact, at the cost of a copy; a hook of your own must clone them",
            {table[label].label_str: 1.0 for label in known},
        )
    return CheckLine(
        "inplace",
        "PASS",
        0,
        "count",
        "",
        "no in-place operation overwrites a recorded output",
    )


def _check_calls(run: _Run, error: CallPlanError | None) -> CheckLine:
    if error is None:
        return CheckLine(
            "calls",
            "PASS",
            None,
            "",
            "",
            f"each of the {len(run.labels)} checked calls ran as in the reference pass",
        )
    text = str(error)
    first = text.split(". Labels cannot", 1)[0]
    causes = text.split("Likely causes: ", 1)[-1] if "Likely causes: " in text else ""
    return CheckLine(
        "calls",
        "FAIL",
        None,
        "",
        first.removeprefix("Call plan mismatch: "),
        causes or text,
    )


def _skipped(name: str, why: str) -> CheckLine:
    return CheckLine(name, "WARN", None, "", "", f"not checked: {why}")


# -- entry points ------------------------------------------------------------------


def _labels(rnet: Any, layers: Any) -> list[DepthIdx]:
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
    args, kwargs = _arguments(batch)
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
            run = _Run(rnet, labels, args, kwargs, batch_dim, _State(net))
            lines = _checks(run, options, rows=rows, dtype_copy=dtype_copy)
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
    if not {"input_data", "input_size"} & recorder_kwargs.keys():
        args, kwargs = _arguments(batch)
        if args:  # keyword inputs beside positional ones go to the forward
            recorder_kwargs = {**kwargs, **recorder_kwargs, "input_data": list(args)}
        else:
            recorder_kwargs = {**recorder_kwargs, "input_data": kwargs}
    rnet = recorder(net, **recorder_kwargs)
    return check_recorder(rnet, batch, **options)


def _checks(
    run: _Run, options: RecordOptions, *, rows: int, dtype_copy: bool
) -> list[CheckLine]:
    rnet = run.rnet
    plain = run.plain()
    unsplit = _sequence_first(run) if run.batch_dim is None else None
    chosen = dataclasses.asdict(options)
    chosen.pop("transforms", None)
    with rnet.selecting(*run.labels, **chosen):
        try:
            first = run.records(seed=True)
        except CallPlanError as error:
            why = "the recorded pass failed its call plan (see calls)"
            return [
                *(_skipped(name, why) for name in CHECKS[:-2]),
                _check_inplace(run, {}),
                _check_calls(run, error),
            ]
        recorded = run.output
        changed = run.state.changed()  # by one pass
        second = run.records(seed=False, restore=False)  # from where `first` left it
        determinism, note = _check_determinism(run, first, second, changed)
        lines = [
            _check_recording(run, plain, recorded),
            _check_batch(run, first, rows, unsplit),
            determinism,
            _check_dtype(run, first, copy_model=dtype_copy),
        ]
    moved: dict[DepthIdx, float] = {}
    if not options.clone:  # the records against copies taken as the calls end
        with rnet.selecting(*run.labels, **{**chosen, "clone": True}):
            copies = run.records(seed=True)
        for label in run.labels:
            most = max(
                (_difference(a, b) for a, b in _pairs(first[label], copies[label])),
                default=0.0,
            )
            if most > 0:
                moved[label] = most
    lines += [_check_inplace(run, moved), _check_calls(run, None)]
    if note is not None:
        lines = [
            line if line is determinism else _from_passes(line, note) for line in lines
        ]
    return lines
