"""The rules every detector applies to what it reads: layers, sizes, values, labels.

One place for each check that detectors share, so that every detector
refuses the same bad data with the same message:

* layers: :func:`one_label` (one call whose output is a tensor),
  :func:`last_linear` (the classification layer);
* feature sizes: :func:`per_sample_size`, :func:`feature_count`,
  :func:`check_feature_count` (scoring inputs of the fitted size);
* the data given: :func:`check_batches` (an iterable of batches, not a
  tensor or a mapping);
* non-finite fit features: every reducer a fit keeps is teed with a
  :class:`NonFinite` count (:func:`count_non_finite`), and the fit is refused
  with the count and the layer (:func:`refuse_non_finite`), for every
  detector the same; at scoring, the protocol (:mod:`._protocol`) scores the
  finite rows and gives the others NaN;
* class labels: :class:`CheckedTargets` (:func:`checked_targets`), checked per
  batch before anything grows, against the classes of every detector taking
  labels (:func:`net_classes` by default);
* hyperparameters: :func:`check_count` (an int from a bound up),
  :func:`check_number` (a finite number, positive or not negative).
"""

from __future__ import annotations

__all__ = [
    "CheckedTargets",
    "NonFinite",
    "check_bank_k",
    "check_batches",
    "check_count",
    "check_feature_count",
    "check_finite_samples",
    "check_number",
    "checked_targets",
    "count_non_finite",
    "feature_count",
    "last_linear",
    "net_classes",
    "one_label",
    "one_tensor",
    "per_sample_size",
    "refuse_non_finite",
    "rows_not_finite",
]

import dataclasses
import inspect
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from scio_recorder._run.batches import as_arguments, batch_getter, first_batch_size
from scio_recorder._support.tree import iter_tensors
from scio_recorder.collect import InputOf
from scio_recorder.reduce import Concat, Tee
from scio_recorder.select import resolve_one

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


class DetectorLike(Protocol):
    """What these checks read of a detector: its recorder and whether it needs labels.

    (A structural type, so that this module stays below the protocol in
    :mod:`._protocol`, which uses it.)
    """

    rnet: Recorder
    needs_target: ClassVar[bool]
    num_classes: int | None


def per_sample_size(rnet: Recorder, label: DepthIdx, kind: str) -> list[int] | None:
    """Return the per-sample shape of a layer's output or (first) input, if known."""
    row = rnet.table[label]
    size = row.output_size if kind == "output" else row.input_size
    if isinstance(size, list) and size and all(_is_size(n) for n in size):
        return list(size[1:])
    return None


def feature_count(rnet: Recorder, label: DepthIdx, kind: str) -> int | None:
    """Return the number of features per sample of a layer's output or input."""
    size = per_sample_size(rnet, label, kind)
    return None if size is None else math.prod(size)


def check_feature_count(
    detector: DetectorLike, label: DepthIdx, kind: str, *, got: int, expected: int
) -> None:
    """Refuse scoring features whose size is not the fitted one, naming the layer."""
    if got != expected:
        msg = (
            f"{type(detector).__name__}: layer "
            f"{detector.rnet.table[label].describe()} ({kind}) gives {got} "
            f"features per sample, but the detector was fitted on {expected}: score "
            "inputs of the shape it was fitted on (e.g. images of the fit's "
            "size), or fit it again on such inputs."
        )
        raise ValueError(msg)


def _is_size(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def check_bank_k(who: str, k: int, n: int) -> None:
    """Refuse ``k`` nearest neighbours out of a bank of ``n`` fit samples.

    Examples
    --------
    >>> check_bank_k("KNN", 5, 3)
    Traceback (most recent call last):
    ...
    ValueError: KNN: k=5 is more than the 3 fit samples; fit on more data or lower k.

    """
    if k > n:
        msg = (
            f"{who}: k={k} is more than the {n} fit samples; fit on more data or "
            "lower k."
        )
        raise ValueError(msg)


def check_count(who: str, name: str, value: object, *, low: int) -> int:
    """Return ``value`` if it is an int ``>= low`` (not a bool); raise naming it.

    Examples
    --------
    >>> check_count("Odds", "noise_samples", 0, low=1)
    Traceback (most recent call last):
    ...
    ValueError: Odds: noise_samples must be an int >= 1, got 0

    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        msg = f"{who}: {name} must be an int >= {low}, got {value!r}"
        raise ValueError(msg)
    return value


def check_number(who: str, name: str, value: object, *, zero: bool) -> float:
    """Return ``value`` as a float if it is finite and ``> 0`` (``>= 0`` with ``zero``).

    Examples
    --------
    >>> check_number("Mahalanobis", "epsilon", 0, zero=True)
    0.0
    >>> check_number("IsoMax", "lr", float("nan"), zero=False)
    Traceback (most recent call last):
    ...
    ValueError: IsoMax: lr must be a finite number > 0, got nan

    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        msg = f"{who}: {name} must be a finite number {bound}, got {value!r}"
        raise ValueError(msg)
    return float(value)


def check_batches(batches: object, who: str, name: str = "batches") -> None:
    """Refuse a tensor or a mapping given where an iterable of batches belongs.

    Iterating a tensor gives its rows, each taken as a batch without its
    batch dimension; iterating a mapping gives its keys: both fail later with
    an error about something else, or fit on the wrong data.

    Examples
    --------
    >>> import torch
    >>> check_batches([torch.zeros(4, 2)], "fit")
    >>> check_batches(torch.zeros(4, 2), "fit")
    Traceback (most recent call last):
    ...
    TypeError: fit: `batches` is a tensor of shape [4, 2], not an iterable of batches: iterating it would give its 4 rows, each as a batch without the batch dimension. Pass a list of batches, e.g. `[x]` for this one batch (`[(x, y)]` with labels), or a DataLoader.

    """  # noqa: E501 (doctest output)
    if isinstance(batches, Tensor):
        shape = list(batches.shape)
        rows = f"its {shape[0]} rows" if shape else "nothing (a 0-d tensor)"
        msg = (
            f"{who}: `{name}` is a tensor of shape {shape}, not an iterable of "
            f"batches: iterating it would give {rows}, each as a batch without "
            "the batch dimension. Pass a list of batches, e.g. `[x]` for this "
            "one batch (`[(x, y)]` with labels), or a DataLoader."
        )
        raise TypeError(msg)
    if isinstance(batches, Mapping):
        msg = (
            f"{who}: `{name}` is a {type(batches).__name__} (a mapping), not an "
            "iterable of batches: iterating it would give its keys "
            f"{list(batches)[:3]}. Pass a list of batches, e.g. `[batch]` for "
            "this one dict batch, or a DataLoader."
        )
        raise TypeError(msg)


def rows_not_finite(t: Tensor) -> Tensor:
    """Return ``[batch]`` bools: the rows (dim 0) of ``t`` with a NaN or an infinity.

    A row's sum is non-finite exactly when the row holds a NaN or an
    infinity, as long as the sum cannot overflow: summed in float64 for
    narrower floats (one pass, no tensor of ``t``'s size); float64 rows are
    tested entry by entry.

    Examples
    --------
    >>> import torch
    >>> rows_not_finite(torch.tensor([[1.0, float("inf")], [3e38, 3e38]])).tolist()
    [True, False]

    """
    flat = t.detach().reshape(t.shape[0], -1)
    if flat.dtype in {torch.float64, torch.complex128}:
        return ~torch.isfinite(flat).all(dim=1)
    wide = torch.complex128 if flat.is_complex() else torch.float64
    return ~torch.isfinite(flat.sum(dim=1, dtype=wide))


def _rows_non_finite(value: Any) -> tuple[Tensor, int] | None:
    """``([batch]`` bools: a non-finite entry in the row, ``batch)``, or ``None``.

    Over the floating tensors of ``value`` (nested: a model output) whose
    dim 0 is the batch, the dim 0 of its first tensor.
    """
    tensors = [t for t in iter_tensors(value) if t.dim() >= 1]
    if not tensors:
        return None
    n = int(tensors[0].shape[0])
    bad = torch.zeros(n, dtype=torch.bool, device=tensors[0].device)
    for t in tensors:
        if t.shape[0] == n and n and (t.is_floating_point() or t.is_complex()):
            bad = bad | rows_not_finite(t).to(bad.device)
    return bad, n


class NonFinite:
    """A reducer counting the samples that hold a NaN or an infinity.

    Teed with each reducer of a detector's fit (:func:`count_non_finite`), so
    that the fit refuses non-finite features with their count
    (:func:`refuse_non_finite`) instead of fitting a NaN state or failing
    later in ``linalg``. A sample is a row (dim 0) of the record, or of every
    floating tensor in it (a model output). The count stays on the records'
    device until :meth:`result`, which returns ``(non-finite, seen)``.

    Examples
    --------
    >>> import torch
    >>> r = NonFinite()
    >>> r.update(torch.tensor([[1.0, float("nan")], [1.0, 2.0], [float("inf"), 0]]))
    >>> r.result(), r.count
    ((2, 3), 3)

    """

    def __init__(self) -> None:
        """Start with no sample seen."""
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.bad = torch.zeros((), dtype=torch.int64)

    @property
    def count(self) -> int:
        """Samples seen."""
        return self.n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        """Count the samples of ``value`` with a non-finite entry."""
        found = _rows_non_finite(value)
        if found is None:
            return
        rows, n = found
        self.bad = self.bad.to(rows.device) + rows.sum()
        self.n += n

    def merge(self, other: NonFinite) -> None:
        """Add ``other``'s counts."""
        self.bad = self.bad + other.bad.to(self.bad.device)
        self.n += other.n

    def result(self) -> tuple[int, int]:
        """Return the numbers of non-finite and of all samples (one host read)."""
        return int(self.bad), self.n

    def state(self) -> dict[str, Tensor]:
        """Return the counts."""
        return {"count": torch.tensor(self.n), "bad": self.bad}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the counts."""
        self.n, self.bad = int(state["count"]), state["bad"].to(torch.int64)

    def fresh(self) -> NonFinite:
        """Return an empty counter."""
        return NonFinite()

    def __repr__(self) -> str:
        """Show the class."""
        return "NonFinite()"


def count_non_finite(keep: Mapping[Any, Any]) -> dict[Any, Any]:
    """Return a fit's ``keep`` with every reducer teed with a :class:`NonFinite`.

    A bank of rows (a :class:`~scio_recorder.reduce.Concat` alone, which
    ``collect`` may spill to disk) is kept as it is: its rows are checked
    whole by :func:`refuse_non_finite`.
    """
    return {
        key: reducer if type(reducer) is Concat else Tee(reducer, NonFinite())
        for key, reducer in keep.items()
    }


def refuse_non_finite(
    who: Mapping[Any, str],
    rnet: Recorder,
    keep: Mapping[Any, Any],
    collected: Mapping[Any, tuple[DepthIdx, Any]],
) -> dict[Any, Any]:
    """Refuse non-finite fit samples; return each key's own result.

    ``keep`` is what the detectors asked for (before
    :func:`count_non_finite`), ``collected`` maps each of its keys to the
    layer's label and the collected value of the counted keep. Raises
    naming ``who[key]`` (the detectors keeping it), the first layer with
    non-finite samples and their count; nothing is fitted from a value
    before every one is checked.
    """
    results: dict[Any, Any] = {}
    for key, reducer in keep.items():
        label, value = collected[key]
        kind = "input" if isinstance(key, InputOf) else "output"
        if type(reducer) is Concat:
            bad, n = _bank_non_finite(value), int(value.shape[0])
            results[key] = value
        else:
            results[key], (bad, n) = value
        check_finite_samples(who[key], rnet, label, kind, bad=bad, n=n)
    return results


def _bank_non_finite(bank: Tensor, chunk: int = 65536) -> int:
    """Count the rows of a bank with a non-finite entry, a chunk at a time."""
    bad = 0
    for start in range(0, bank.shape[0], chunk):
        part = bank[start : start + chunk]
        found = _rows_non_finite(part)
        bad += 0 if found is None else int(found[0].sum())
    return bad


def check_finite_samples(  # noqa: PLR0913 (who, where, and the counts)
    who: str,
    rnet: Recorder,
    label: DepthIdx,
    kind: str,
    *,
    bad: int,
    n: int | None,
) -> None:
    """Raise if ``bad`` fit samples hold non-finite features, naming the layer."""
    if bad:
        of = f" of the {n}" if n is not None else ""
        msg = (
            f"{who}: {bad}{of} fit samples have non-finite "
            f"features (NaN or Inf) at layer "
            f"{rnet.table[label].describe()} ({kind}), so the fitted "
            "state would be NaN. Drop or repair those samples before fitting "
            "(find them with `torch.isfinite` on the inputs, or on the layer's "
            "records from `collect`), or look for an overflow in the net (e.g. "
            "float16)."
        )
        raise ValueError(msg)


@dataclasses.dataclass
class CheckedTargets:
    """A ``target=`` for ``collect`` that checks class labels before any reducer.

    Checked per batch, before the net runs and before any class table grows:
    integer dtype, one label per sample, each in ``[0, num_classes)``
    (``hint``: what else to do about a label out of range, e.g. pass
    ``num_classes=``).
    """

    spec: Any
    input: Any
    num_classes: int | None
    who: str
    hint: str = ""
    seen: int = dataclasses.field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Resolve the getters (refusing a bad ``target=`` at once)."""
        self._target = batch_getter(self.spec, "target")
        self._input = (
            None if callable(self.input) else batch_getter(self.input, "input")
        )

    def __call__(self, batch: Any) -> Any:
        """Return the batch's labels, checked."""
        target = self._target(batch)
        index, self.seen = self.seen, self.seen + 1
        labels = target if isinstance(target, Tensor) else torch.as_tensor(target)
        where = f"batch {index} of the fit data"
        classes = f"[0, {self.num_classes})" if self.num_classes else "[0, classes)"
        if (
            labels.is_floating_point()
            or labels.is_complex()
            or labels.dtype == torch.bool
        ):
            msg = (
                f"{self.who}: the class labels of {where} are {labels.dtype}, not "
                f"integers: pass integer class indices in {classes}, one per sample "
                "(e.g. `labels.long()`)."
            )
            raise TypeError(msg)
        size = None
        if self._input is not None:
            args, kwargs = as_arguments(self._input(batch), spread=False)
            size = first_batch_size(args, kwargs)
        if labels.dim() != 1 or (size is not None and labels.shape[0] != size):
            msg = (
                f"{self.who}: {where} has "
                f"{'?' if size is None else size} samples but labels of shape "
                f"{list(labels.shape)}: pass one class index per sample, shape "
                f"[{'batch' if size is None else size}] (`target=` picks the labels "
                "out of each batch)."
            )
            raise ValueError(msg)
        if labels.numel():
            low, high = (int(v) for v in torch.stack([labels.min(), labels.max()]))
            bad = low if low < 0 else high
            if low < 0 or (self.num_classes is not None and high >= self.num_classes):
                count = (
                    f"the {self.num_classes} classes of the net"
                    if self.num_classes is not None
                    else "class indices"
                )
                msg = (
                    f"{self.who}: class label {bad} in {where} is outside "
                    f"{classes} ({count}); labels must be class indices: drop "
                    f"those samples, or fix `target=`{self.hint}."
                )
                raise ValueError(msg)
        return target


def checked_targets(
    target: Any,
    input: Any,  # noqa: A002 (collect's name)
    detectors: Sequence[DetectorLike],
) -> CheckedTargets:
    """Return ``target`` wrapped to check labels for the detectors that use them.

    Labels must lie in ``[0, C)``, ``C`` the smallest ``num_classes`` of the
    detectors taking labels (each defaults to :func:`net_classes`).
    """
    users = [d for d in detectors if d.needs_target]
    known = [n for d in users if (n := d.num_classes) is not None]
    who = ", ".join(sorted({type(d).__name__ for d in users})) + ".fit"
    takes = users and all(
        "num_classes" in inspect.signature(type(d)).parameters for d in users
    )
    hint = ", or pass `num_classes=` covering every class" if takes and known else ""
    return CheckedTargets(target, input, min(known) if known else None, who, hint)


def net_classes(rnet: Recorder) -> int | None:
    """Return the net's number of logits: its output ``[1, C]``, or last Linear's.

    ``None`` when neither is known.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net_classes(Recorder(nn.Sequential(nn.Linear(3, 5)), input_size=(1, 3)))
    5

    """
    for row in rnet.table.values():
        if row.label[0] == 0:
            size = row.output_size
            if (
                isinstance(size, list)
                and len(size) == 2  # noqa: PLR2004 (a batch of logit vectors)
                and all(isinstance(n, int) and not isinstance(n, bool) for n in size)
            ):
                return int(size[1])
    linears = [
        row.module
        for row in rnet.table.values()
        if row.recordable and isinstance(row.module, nn.Linear)
    ]
    return int(linears[-1].out_features) if linears else None


def one_tensor(value: Any, rnet: Recorder, label: DepthIdx, who: str) -> Tensor:
    """Return a layer's output, refused unless it is one tensor (naming the layer)."""
    if not isinstance(value, Tensor):
        msg = (
            f"{who}: layer {rnet.table[label].describe()} outputs a "
            f"{type(value).__name__}, not one tensor; choose a layer whose "
            "output is a tensor."
        )
        raise TypeError(msg)
    return value


def one_label(rnet: Recorder, layer: Selector, who: str) -> DepthIdx:
    """Resolve ``layer`` to exactly one label whose output is a tensor."""
    row = resolve_one(rnet.table, rnet.net, layer, who)
    size = row.output_size
    if not (isinstance(size, list) and size and all(isinstance(n, int) for n in size)):
        msg = (
            f"{who}: layer {row.describe()} outputs {size}, not one tensor; "
            "choose a layer whose output is a tensor."
        )
        raise ValueError(msg)
    return row.label


def last_linear(rnet: Recorder, fc: Selector | None, who: str) -> DepthIdx:
    """Return the label of ``fc``, or of the last ``nn.Linear`` the net calls."""
    if fc is not None:
        label = one_label(rnet, fc, who)
        if not isinstance(rnet.table[label].module, nn.Linear):
            module = type(rnet.table[label].module).__name__
            msg = f"{who}: fc={fc!r} is a {module}; it must be an nn.Linear."
            raise TypeError(msg)
        return label
    linears = [
        row.label
        for row in rnet.table.values()
        if row.recordable and isinstance(row.module, nn.Linear)
    ]
    if not linears:
        msg = (
            f"{who}: the net calls no nn.Linear; name its classification layer "
            "with `fc=` (an nn.Linear), or give `layer=`."
        )
        raise ValueError(msg)
    return linears[-1]
