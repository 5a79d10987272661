"""The rules every detector applies to what it reads: layers, sizes, values, labels.

One place for each check that detectors share, so that every detector
refuses the same bad data with the same message:

* layers: :func:`one_label` (one call whose output is a tensor),
  :func:`last_linear` (the classification layer);
* feature sizes: :func:`per_sample_size`, :func:`feature_count`,
  :func:`check_feature_count` (scoring inputs of the fitted size);
* non-finite fit features: :class:`NonFinite` teed with a detector's reducer
  (:func:`finite_keep`, :func:`finite_result`, :func:`check_finite_samples`);
* class labels: :class:`CheckedTargets` (:func:`checked_targets`), checked per
  batch before anything grows.
"""

from __future__ import annotations

__all__ = [
    "CheckedTargets",
    "NonFinite",
    "check_feature_count",
    "check_finite_samples",
    "checked_targets",
    "feature_count",
    "finite_keep",
    "finite_result",
    "last_linear",
    "one_label",
    "per_sample_size",
]

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

from scio_recorder._batches import as_arguments, batch_getter, first_batch_size
from scio_recorder.reduce import Tee
from scio_recorder.select import resolve_one

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

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


class NonFinite:
    """A reducer counting the samples that hold a NaN or an infinity.

    Teed with a detector's own reducer (:func:`finite_keep`), so that the fit
    refuses non-finite features with their count (:func:`finite_result`)
    instead of failing later in ``linalg``. The count stays on the records'
    device until :meth:`result`.

    Examples
    --------
    >>> import torch
    >>> r = NonFinite()
    >>> r.update(torch.tensor([[1.0, float("nan")], [1.0, 2.0], [float("inf"), 0]]))
    >>> r.result(), r.count
    (2, 3)

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
        flat = value.detach().reshape(value.shape[0], -1)
        bad = (~torch.isfinite(flat)).any(dim=1).sum()
        self.bad = self.bad.to(flat.device) + bad
        self.n += flat.shape[0]

    def merge(self, other: NonFinite) -> None:
        """Add ``other``'s counts."""
        self.bad = self.bad + other.bad.to(self.bad.device)
        self.n += other.n

    def result(self) -> int:
        """Return the number of non-finite samples (one host read)."""
        return int(self.bad)

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


def finite_keep(reducer: Any) -> Tee:
    """Return ``reducer`` teed with a :class:`NonFinite` count of its samples."""
    return Tee(reducer, NonFinite())


def finite_result(
    detector: DetectorLike, label: DepthIdx, kind: str, value: Any
) -> Any:
    """Return the result of a :func:`finite_keep`; refuse non-finite samples."""
    result, bad = value
    if bad:
        count = getattr(result, "count", None)
        check_finite_samples(detector, label, kind, bad=bad, n=count)
    return result


def check_finite_samples(
    detector: DetectorLike, label: DepthIdx, kind: str, *, bad: int, n: int | None
) -> None:
    """Raise if ``bad`` fit samples hold non-finite features, naming the layer."""
    if bad:
        of = f" of the {n}" if n is not None else ""
        msg = (
            f"{type(detector).__name__}: {bad}{of} fit samples have non-finite "
            f"features (NaN or Inf) at layer "
            f"{detector.rnet.table[label].describe()} ({kind}), so the fitted "
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
    integer dtype, one label per sample, each in ``[0, num_classes)``.
    """

    spec: Any
    input: Any
    num_classes: int | None
    who: str
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
                    "those samples, or fix `target=`"
                    + (
                        ", or pass `num_classes=` covering every class."
                        if self.num_classes is not None
                        else "."
                    )
                )
                raise ValueError(msg)
        return target


def checked_targets(
    target: Any,
    input: Any,  # noqa: A002 (collect's name)
    detectors: Sequence[DetectorLike],
) -> CheckedTargets:
    """Return ``target`` wrapped to check labels for the detectors that use them."""
    users = [d for d in detectors if d.needs_target]
    known = [n for d in users if (n := getattr(d, "num_classes", None)) is not None]
    who = ", ".join(sorted({type(d).__name__ for d in users})) + ".fit"
    return CheckedTargets(target, input, min(known) if known else None, who)


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
