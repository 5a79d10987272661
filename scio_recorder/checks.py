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
* ``"determinism"``: two passes on the batch: bit-equal (dropout left on,
  random operations, nondeterministic kernels);
* ``"dtype"``: the records against those of a copy of the model in a wider
  dtype (float32 for bfloat16 and float16 models, float64 for float32
  ones), as relative error per layer;
* ``"inplace"``: the records a later in-place operation overwrites (known
  from the reference pass, and copied so that they stay exact), and any
  record changed in place that nobody could know in advance;
* ``"calls"``: each checked call ran as in the reference pass (the call
  plan).

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

__all__ = ["CHECKS", "CheckLine", "CheckReport", "check_recorder"]

import contextlib
import copy
import dataclasses
import html
import math
import warnings
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from ._batches import as_arguments, first_batch_size, position_scheme
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


def _padding(kwargs: Mapping[str, Any], size: int) -> Tensor | None:
    """Return the ``[batch, positions]`` mask of kept tokens, if the batch has one."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] == size:  # noqa: PLR2004 (batch, positions)
        return mask != 0
    return None


def _row_alone(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    row: int,
    size: int,
    keep: Tensor | None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Row ``row`` of the batch alone, its padding (``keep`` false) removed."""
    columns = None if keep is None or bool(keep.all()) else keep
    width = None if keep is None else keep.shape[0]

    def take(value: Tensor) -> Tensor:
        if value.dim() == 0 or value.shape[0] != size:
            return value
        value = value[row : row + 1]
        if columns is not None and value.dim() >= 2 and value.shape[1] == width:  # noqa: PLR2004
            value = value[:, columns.to(value.device)]
        return value

    return map_tensors(take, args), map_tensors(take, kwargs)


def _rows_to_check(size: int, keep: Tensor | None, rows: int) -> list[int]:
    """Return the rows compared alone: the most padded first, then in order."""
    if keep is None:
        return list(range(min(size, rows)))
    padding = (~keep).sum(1).tolist()
    order = sorted(range(size), key=lambda r: (-padding[r], r))
    return sorted(order[:rows])


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
    shown = ", ".join(f"`{n}`" for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")  # noqa: PLR2004


def _float_dtype(net: nn.Module) -> torch.dtype | None:
    """Return the dtype the net computes in: its narrowest floating parameter's."""
    dtypes = {p.dtype for p in net.parameters() if p.is_floating_point()}
    dtypes |= {b.dtype for b in net.buffers() if b.is_floating_point()}
    if not dtypes:
        return None
    return min(dtypes, key=lambda d: torch.finfo(d).bits)


# -- the passes -------------------------------------------------------------------


@dataclasses.dataclass
class _Run:
    """The recorder, the batch, and what each pass gave."""

    rnet: Any
    """The :class:`~scio_recorder.Recorder` (this module sits below it)."""
    labels: list[DepthIdx]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    size: int | None
    output: Any = None
    """The net's output of the latest pass."""

    def records(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        seed: bool,
    ) -> dict[DepthIdx, Any]:
        """Run one recorded pass (from the fixed random state if ``seed``)."""
        args = self.args if args is None else args
        kwargs = self.kwargs if kwargs is None else kwargs
        with _seeded(enabled=seed):
            self.output = self.rnet(*args, **kwargs)
        return dict(self.rnet.activations)

    def describe(self, label: DepthIdx) -> str:
        row: Layer = self.rnet.table[label]
        return row.describe()


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


def _check_batch(run: _Run, batched: dict[DepthIdx, Any], rows: int) -> CheckLine:
    size = run.size
    keep = None if size is None else _padding(run.kwargs, size)
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
    per_layer: dict[str, float] = {}
    worst = (0.0, torch.float32, "", -1)
    for row in _rows_to_check(size, keep, rows):
        row_keep = None if keep is None else keep[row]
        args, kwargs = _row_alone(run.args, run.kwargs, row, size, row_keep)
        try:
            alone = run.records(args, kwargs, seed=True)
        except Exception as error:  # noqa: BLE001 (what the row alone raised is the finding)
            cause = _batch_cause(run, row, keep, "FAIL")
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return CheckLine(
                "batch",
                "FAIL",
                None,
                "relative",
                f"row {row}",
                f"row {row} alone raised {type(error).__name__} ({first}); {cause}",
            )
        stripped = row_keep is not None and not bool(row_keep.all())
        for label in run.labels:
            diff, dtype = _row_difference(
                batched[label], alone[label], row, size, row_keep if stripped else None
            )
            if diff is None:
                continue
            key = run.rnet.table[label].label_str
            per_layer[key] = max(per_layer.get(key, 0.0), diff)
            if diff > worst[0]:
                worst = (diff, dtype, run.describe(label), row)
    diff, dtype, where, row = worst
    status = _verdict(diff, dtype, exact=False)
    place = f"{where}, row {row}" if where else ""
    if status == "PASS":
        cause = (
            "each row's records alone equal its records in the batch, up to "
            "float rounding"
        )
        if diff == 0:
            cause = "each row's records alone equal its records in the batch"
    else:
        cause = _batch_cause(run, row, keep, status)
    return CheckLine("batch", status, diff, "relative", place, cause, per_layer)


def _row_difference(
    batched: Any, alone: Any, row: int, size: int, keep: Tensor | None
) -> tuple[float | None, torch.dtype]:
    """Return the largest relative difference of a row's records, batched, alone."""
    worst: float | None = None
    dtype = torch.float32
    for whole, single in _pairs(batched, alone):
        if whole.dim() == 0 or whole.shape[0] != size:
            continue
        mine = whole[row : row + 1]
        if keep is not None:
            if mine.dim() < 2 or mine.shape[1] != keep.shape[0]:  # noqa: PLR2004
                continue
            mine = mine[:, keep.to(mine.device)]
        if mine.shape != single.shape:
            continue
        diff = _difference(mine, single)
        if worst is None or diff > worst:
            worst, dtype = diff, single.dtype
    return worst, dtype


def _batch_cause(run: _Run, row: int, keep: Tensor | None, status: Status) -> str:
    net = run.rnet.net
    padded = keep is not None and not bool(keep[row].all())
    norms = _modules(net, (nn.modules.batchnorm._BatchNorm,))  # noqa: SLF001 (the base of every BatchNorm)
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
    return (
        f"row {row}'s records depend on its batch-mates: an operation mixes rows "
        "(a statistic over the batch, attention or an index across rows)"
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
    run: _Run, first: dict[DepthIdx, Any], second: dict[DepthIdx, Any]
) -> CheckLine:
    per_layer, (diff, dtype, where) = _compared(run, second, first)
    status = _verdict(diff, dtype, exact=True)
    dropouts = _modules(run.rnet.net, _DROPOUTS)
    if status == "PASS":
        cause = "two passes on the batch give bit-equal records"
    elif dropouts:
        status = "FAIL"
        cause = (
            f"dropout is active ({_named(dropouts)} in train mode): each pass "
            "draws other masks; call net.eval()"
        )
    elif status == "WARN":
        cause = (
            "two passes differ by roundings: nondeterministic kernels (atomic "
            "additions on a GPU); torch.use_deterministic_algorithms(True) makes "
            "them repeat"
        )
    else:
        cause = (
            "two passes on the same batch differ: the forward draws random "
            "numbers, or reads a state that a pass changes"
        )
    return CheckLine("determinism", status, diff, "relative", where, cause, per_layer)


def _check_dtype(
    run: _Run, records: dict[DepthIdx, Any], *, copy_model: bool
) -> CheckLine:
    dtype = _float_dtype(run.rnet.net)
    if dtype is None or dtype == torch.float64:
        what = "no floating parameter" if dtype is None else "float64"
        return CheckLine(
            "dtype", "PASS", None, "relative", "", f"{what}: no wider dtype to compare"
        )
    wide = torch.float32 if torch.finfo(dtype).bits < 32 else torch.float64  # noqa: PLR2004
    if not copy_model:
        return CheckLine(
            "dtype",
            "WARN",
            None,
            "relative",
            "",
            f"not checked (dtype_copy=False): the model computes in {_name(dtype)}",
        )
    wider = _wide_records(run, wide)
    per_layer, (diff, _, where) = _compared(run, records, wider)
    if not math.isfinite(diff):
        status: Status = "FAIL"
    elif dtype == torch.float32:
        status = _verdict(diff, dtype, exact=False)
    else:  # 16-bit: its rounding shows, always (WARN), unless beyond 0.5
        status = "PASS" if diff == 0 else "WARN" if diff <= 0.5 else "FAIL"  # noqa: PLR2004
    cause = _dtype_cause(status, diff, dtype, wide)
    return CheckLine("dtype", status, diff, "relative", where, cause, per_layer)


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


def check_recorder(
    rnet: Any,
    batch: Any,
    *,
    layers: Any = None,
    rows: int = 8,
    dtype_copy: bool = True,
) -> CheckReport:
    """Check a recorder on a batch: see :func:`scio_recorder.check`.

    The recorder's selection and the net (modes, parameters, buffers) are as
    before after it, and so is the global random state; ``rnet.activations``
    holds the check's last pass.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        msg = f"`rows` must be an int >= 1 (rows compared alone), got {rows!r}"
        raise ValueError(msg)
    args, kwargs = _arguments(batch)
    labels = _labels(rnet, layers)
    run = _Run(rnet, labels, args, kwargs, first_batch_size(args, kwargs))
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
            lines = _checks(run, options, rows=rows, dtype_copy=dtype_copy)
    finally:
        passes.warned.clear()
        passes.warned.update(warned)
        rnet._padding.done = padding_done  # noqa: SLF001
    return CheckReport(lines)


def _checks(
    run: _Run, options: RecordOptions, *, rows: int, dtype_copy: bool
) -> list[CheckLine]:
    rnet = run.rnet
    with rnet.selecting(), _seeded(enabled=True):
        plain = rnet(*run.args, **run.kwargs)
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
        second = run.records(seed=False)
        lines = [
            _check_recording(run, plain, recorded),
            _check_batch(run, first, rows),
            _check_determinism(run, first, second),
            _check_dtype(run, first, copy_model=dtype_copy),
        ]
    changed: dict[DepthIdx, float] = {}
    if not options.clone:  # the records against copies taken as the calls end
        with rnet.selecting(*run.labels, **{**chosen, "clone": True}):
            copies = run.records(seed=True)
        for label in run.labels:
            moved = max(
                (_difference(a, b) for a, b in _pairs(first[label], copies[label])),
                default=0.0,
            )
            if moved > 0:
                changed[label] = moved
    return [*lines, _check_inplace(run, changed), _check_calls(run, None)]
