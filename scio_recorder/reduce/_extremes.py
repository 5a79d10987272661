"""Running entrywise minimum and maximum over samples.

:class:`MinMax` bounds each feature of the records; :class:`FeatureMapGram`
bounds each entry of the per-sample feature-map Gram matrices (the
Gram-matrix OoD detector of Sastry & Oore, 2020). Both keep the same state,
a running minimum and maximum with the sample count (:class:`_RunningMinMax`),
and differ only in how a batch becomes per-sample values.

Import them from :mod:`scio_recorder.reduce`, their public home.
"""

from __future__ import annotations

__all__ = [
    "FeatureMapGram",
    "FeatureMapGramResult",
    "MinMax",
    "MinMaxResult",
]

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._base import (
    _F64,
    _Base,
    _batch,
    _count_tensor,
    _FeatureShape,
    _get,
    _shape_tensor,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from typing_extensions import Self


class _RunningMinMax(_Base, _FeatureShape):
    """Shared state of :class:`MinMax` and :class:`FeatureMapGram`.

    Running elementwise minimum and maximum of per-sample values, with the
    sample count; subclasses say how a batch becomes those values.
    """

    _name = "MinMax"
    _state_dtype: torch.dtype | None = None  # dtype of a loaded state

    def _reset(self) -> None:
        self._n = 0
        self._shape = None
        self._min: Tensor | None = None
        self._max: Tensor | None = None

    @property
    def count(self) -> int:
        """Samples seen."""
        return self._n

    def _combine(self, n: int, lo: Tensor, hi: Tensor) -> None:
        if self._min is None or self._max is None:
            self._min, self._max = lo, hi
        else:
            self._min = torch.minimum(self._min, lo.to(self._min.device))
            self._max = torch.maximum(self._max, hi.to(self._max.device))
        self._n += n

    def merge(self, other: Self) -> None:
        """Absorb ``other``."""
        self._check_peer(other)
        self._peer_shape(other, self._name)
        if other._min is not None and other._max is not None:
            self._combine(other._n, other._min.clone(), other._max.clone())

    def _min_max(self) -> tuple[Tensor, Tensor]:
        if self._min is None or self._max is None:
            msg = f"{self._name}: no sample seen yet"
            raise ValueError(msg)
        return self._min.clone(), self._max.clone()

    def state(self) -> dict[str, Tensor]:
        """Return ``count``, ``feature_shape``, ``min``, ``max``."""
        out = {"count": _count_tensor(self._n)}
        if self._shape is not None:
            out["feature_shape"] = _shape_tensor(self._shape)
        if self._min is not None and self._max is not None:
            out["min"] = self._min
            out["max"] = self._max
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the state by ``state``."""
        self._reset()
        self._n = int(_get(state, "count", self._name))
        if "feature_shape" in state:
            self._shape = torch.Size(state["feature_shape"].tolist())
        if self._n:
            lo, hi = _get(state, "min", self._name), _get(state, "max", self._name)
            if self._state_dtype is not None:
                lo, hi = lo.to(self._state_dtype), hi.to(self._state_dtype)
            self._min, self._max = lo, hi


@dataclasses.dataclass(frozen=True)
class MinMaxResult:
    """The result of :class:`MinMax`, per feature, in the input dtype.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import MinMax
    >>> r = MinMax()
    >>> r.update(torch.tensor([[1.5], [-2.0]]))
    >>> r.result().min, r.result().max
    (tensor([-2.]), tensor([1.5000]))

    """

    min: Tensor
    """Per-feature minimum over samples."""
    max: Tensor
    """Per-feature maximum over samples."""


class MinMax(_RunningMinMax):
    """Per-feature minimum and maximum over samples.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import MinMax
    >>> r = MinMax()
    >>> r.update(torch.tensor([[1, 8], [4, 2]]))
    >>> r.update(torch.tensor([[0, 5]]))
    >>> r.result()
    MinMaxResult(min=tensor([0, 2]), max=tensor([4, 8]))

    """

    def __init__(self) -> None:
        self._reset()

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (checked; target unused)
        """Feed a batch (dim 0: samples); ``target`` is ignored."""
        x = _batch(value, "MinMax")
        self._check_features(x, "MinMax")
        if x.shape[0] == 0:
            return
        self._combine(x.shape[0], x.amin(0), x.amax(0))

    def result(self) -> MinMaxResult:
        """Return the per-feature minimum and maximum."""
        return MinMaxResult(*self._min_max())


@dataclasses.dataclass(frozen=True)
class FeatureMapGramResult:
    """The result of :class:`FeatureMapGram`, in float64.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import FeatureMapGram
    >>> r = FeatureMapGram(power=2, row_sums=True)
    >>> r.update(torch.tensor([[[1.0, 0.0], [0.0, -2.0]]]))
    >>> r.result().max.tolist()
    [1.0, 4.0]

    """

    count: int
    """Samples seen."""
    min: Tensor
    """Entrywise minimum over samples of the per-sample Gram matrices."""
    max: Tensor
    """Entrywise maximum over samples of the per-sample Gram matrices."""


class FeatureMapGram(_RunningMinMax):
    r"""Entrywise min and max over samples of per-sample feature-map Grams.

    A record ``[B, C, *spatial]`` gives, per sample, $F$ =
    ``x.reshape(C, -1)`` and the $C \times C$ Gram matrix of order $p$

    $$G_p = \mathrm{sign}(F^p (F^p)^\top) \, \lvert F^p (F^p)^\top \rvert^{1/p}$$

    (powers entrywise), as in the Gram-matrix OoD detector of Sastry & Oore
    (2020), which keeps the row sums of $F^p (F^p)^\top$ (``row_sums=True``:
    ``[C]`` per sample) before the $1/p$ root. The result is the entrywise
    min and max over samples (use :class:`PerClass` for per-class bounds).

    Parameters
    ----------
    power : int, default 1
        The order $p \ge 1$.
    row_sums : bool, default False
        Reduce each Gram matrix to its row sums.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import FeatureMapGram
    >>> r = FeatureMapGram()
    >>> r.update(torch.tensor([[[1.0, 0.0], [1.0, 1.0]], [[2.0, 0.0], [0.0, 0.0]]]))
    >>> res = r.result()
    >>> res.min.tolist(), res.max.tolist()
    ([[1.0, 0.0], [0.0, 0.0]], [[4.0, 1.0], [1.0, 2.0]])

    """

    _name = "FeatureMapGram"
    _state_dtype = _F64

    def __init__(self, power: int = 1, *, row_sums: bool = False) -> None:
        if isinstance(power, bool) or not isinstance(power, int) or power < 1:
            msg = f"FeatureMapGram: power must be an integer >= 1, got {power!r}"
            raise ValueError(msg)
        self.power = power
        self.row_sums = row_sums
        self._reset()

    def _config(self) -> tuple[Any, ...]:
        return (self.power, self.row_sums)

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (checked; target unused)
        """Feed a batch ``[B, C, *spatial]``; ``target`` is ignored."""
        x = _batch(value, "FeatureMapGram")
        if x.dim() < 2:  # noqa: PLR2004 (batch and channel dims)
            msg = f"FeatureMapGram needs records [B, C, ...], got {list(x.shape)}"
            raise ValueError(msg)
        self._check_features(x, "FeatureMapGram")
        if x.shape[0] == 0:
            return
        feats = x.reshape(x.shape[0], x.shape[1], -1).to(_F64)
        if self.power != 1:
            feats = feats.pow(self.power)
        gram = feats @ feats.transpose(1, 2)
        if self.row_sums:
            gram = gram.sum(2)
        if self.power != 1:
            gram = gram.sign() * gram.abs().pow(1.0 / self.power)
        self._combine(x.shape[0], gram.amin(0), gram.amax(0))

    def result(self) -> FeatureMapGramResult:
        """Return count and the entrywise min and max Gram matrices."""
        return FeatureMapGramResult(self._n, *self._min_max())
