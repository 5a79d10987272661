"""Moment statistics over samples: mean, variance, covariance, Gram matrix.

Dim 0 of every record is the sample (batch) dimension, the other dims are the
features. :class:`Moments` (per-feature mean and variance) and
:class:`Covariance` (full covariance, features flattened) share the
Welford/Chan machinery of :class:`_MeanCentered`: each batch is summarised
exactly in float64 by a two-pass computation, then merged with Chan's rule,
so parts of a stream merge in any order without losing precision.
:class:`Gram` holds the uncentred second moments. The per-class shared
covariance is in :mod:`scio_recorder._per_class`.

Import them from :mod:`scio_recorder.reduce`, their public home.
"""

from __future__ import annotations

__all__ = [
    "Covariance",
    "CovarianceResult",
    "Gram",
    "GramResult",
    "Moments",
    "MomentsResult",
]

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._base import (
    _F64,
    _Base,
    _batch,
    _count_tensor,
    _FeatureShape,
    _flat,
    _get,
    _shape_tensor,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from typing_extensions import Self


@dataclasses.dataclass(frozen=True)
class MomentsResult:
    """The result of :class:`Moments`: per-feature statistics, in float64.

    ``mean``, ``var``, ``var_population`` and ``std`` have the per-sample
    shape of the records.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments
    >>> r = Moments()
    >>> r.update(torch.tensor([[[0.0, 1.0]], [[2.0, 5.0]]]))
    >>> res = r.result()
    >>> res.mean.shape, res.var.tolist(), res.var_population.tolist()
    (torch.Size([1, 2]), [[2.0, 8.0]], [[1.0, 4.0]])

    """

    count: int
    """Samples seen."""
    mean: Tensor
    """Mean over samples."""
    var: Tensor
    """Unbiased variance, ``M2 / (count - 1)`` (NaN for one sample)."""
    var_population: Tensor
    """Population variance, ``M2 / count``."""
    std: Tensor
    """Unbiased standard deviation, ``sqrt(var)``."""


class _MeanCentered(_Base, _FeatureShape):
    """Count, per-feature mean and centred co-moments merged with Chan's rule.

    For parts ``a`` and ``b`` with counts ``na``, ``nb``, means ``ma``,
    ``mb`` and centred (co-)moments ``Ma``, ``Mb``::

        n = na + nb,   d = mb - ma
        mean = ma + d * nb / n
        M = Ma + Mb + outer(d, d) * na * nb / n     (diagonal only: d * d)

    Each batch is summarised exactly by a two-pass float64 computation
    (mean, then the centred moments), then merged with the rule above.
    """

    _full: bool  # full co-moment matrix, or its diagonal only

    def _reset(self) -> None:
        self._n = 0
        self._shape = None
        self._mean: Tensor | None = None
        self._m2: Tensor | None = None

    @property
    def count(self) -> int:
        """Samples seen."""
        return self._n

    def _combine(self, nb: int, mb: Tensor, m2b: Tensor) -> None:
        if self._mean is None or self._m2 is None or self._n == 0:
            self._n, self._mean, self._m2 = nb, mb, m2b
            return
        na = self._n
        n = na + nb
        mb = mb.to(self._mean.device)
        m2b = m2b.to(self._mean.device)
        delta = mb - self._mean
        weight = na * nb / n
        extra = torch.outer(delta, delta) if self._full else delta * delta
        self._m2 = self._m2 + m2b + extra * weight
        self._mean = self._mean + delta * (nb / n)
        self._n = n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (checked; target unused)
        """Feed a batch (dim 0: samples); ``target`` is ignored."""
        who = type(self).__name__
        x = _batch(value, who)
        self._check_features(x, who)
        if x.shape[0] == 0:
            return
        flat = _flat(x)
        mb = flat.mean(0)
        centred = flat - mb
        m2b = centred.T @ centred if self._full else (centred * centred).sum(0)
        self._combine(flat.shape[0], mb, m2b)

    def merge(self, other: Self) -> None:
        """Absorb ``other`` with Chan's parallel update."""
        self._check_peer(other)
        self._peer_shape(other, type(self).__name__)
        if other._n == 0 or other._mean is None or other._m2 is None:
            return
        self._combine(other._n, other._mean.clone(), other._m2.clone())

    def _checked(self) -> tuple[Tensor, Tensor]:
        if self._n == 0 or self._mean is None or self._m2 is None:
            msg = f"{type(self).__name__}: no sample seen yet"
            raise ValueError(msg)
        return self._mean, self._m2

    def state(self) -> dict[str, Tensor]:
        """Return ``count``, ``feature_shape``, ``mean`` and ``m2``."""
        out = {"count": _count_tensor(self._n)}
        if self._shape is not None:
            out["feature_shape"] = _shape_tensor(self._shape)
        if self._n and self._mean is not None and self._m2 is not None:
            out["mean"] = self._mean
            out["m2"] = self._m2
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the state by ``state``."""
        who = type(self).__name__
        self._reset()
        self._n = int(_get(state, "count", who))
        if "feature_shape" in state:
            self._shape = torch.Size(state["feature_shape"].tolist())
        if self._n:
            self._mean = _get(state, "mean", who).to(_F64)
            self._m2 = _get(state, "m2", who).to(_F64)


class Moments(_MeanCentered):
    """Per-feature count, mean and variance over samples (Welford/Chan).

    Each batch's mean and centred sum of squares ``M2`` are computed in
    float64 by a two-pass formula, then merged into the running state with
    Chan's rule, so a stream with a large offset (``1e6 + N(0, 1)``) keeps
    its variance, unlike a sum of squares.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments
    >>> r = Moments()
    >>> r.update(torch.tensor([[1.0, 10.0], [2.0, 20.0]]))
    >>> r.update(torch.tensor([[3.0, 30.0]]))
    >>> res = r.result()
    >>> res.count, res.mean.tolist(), res.var.tolist()
    (3, [2.0, 20.0], [1.0, 100.0])

    """

    _full = False

    def __init__(self) -> None:
        self._reset()

    def result(self) -> MomentsResult:
        """Return count, mean, unbiased and population variance, std."""
        mean, m2 = self._checked()
        shape = self._shape if self._shape is not None else torch.Size()
        var = m2 / (self._n - 1) if self._n > 1 else torch.full_like(m2, math.nan)
        return MomentsResult(
            count=self._n,
            mean=mean.reshape(shape).clone(),
            var=var.reshape(shape),
            var_population=(m2 / self._n).reshape(shape),
            std=var.sqrt().reshape(shape),
        )


@dataclasses.dataclass(frozen=True)
class CovarianceResult:
    """The result of :class:`Covariance`, in float64 (features flattened).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Covariance
    >>> r = Covariance()
    >>> r.update(torch.tensor([[[0.0, 1.0]], [[2.0, 5.0]]]))
    >>> res = r.result()
    >>> res.mean.tolist(), res.cov_population.tolist()
    ([1.0, 3.0], [[1.0, 2.0], [2.0, 4.0]])

    """

    count: int
    """Samples seen."""
    mean: Tensor
    """Mean over samples, shape ``[F]``."""
    cov: Tensor
    """Unbiased covariance ``C / (count - 1)``, shape ``[F, F]``."""
    cov_population: Tensor
    """Population covariance ``C / count``, shape ``[F, F]``."""


class Covariance(_MeanCentered):
    """Mean and full covariance over samples (co-moment matrix, Chan merge).

    Features (all dims but 0) are flattened to ``F``; memory is ``F x F``.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Covariance
    >>> r = Covariance()
    >>> r.update(torch.tensor([[0.0, 0.0], [1.0, 2.0]]))
    >>> r.update(torch.tensor([[2.0, 4.0]]))
    >>> r.result().cov
    tensor([[1., 2.],
            [2., 4.]], dtype=torch.float64)

    """

    _full = True

    def __init__(self) -> None:
        self._reset()

    def result(self) -> CovarianceResult:
        """Return count, mean, unbiased and population covariance."""
        mean, m2 = self._checked()
        cov = m2 / (self._n - 1) if self._n > 1 else torch.full_like(m2, math.nan)
        return CovarianceResult(self._n, mean.clone(), cov, m2 / self._n)


@dataclasses.dataclass(frozen=True)
class GramResult:
    """The result of :class:`Gram`, in float64 (features flattened).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Gram
    >>> r = Gram()
    >>> r.update(torch.tensor([[1.0, 2.0], [3.0, 0.0]]))
    >>> r.result().count, r.result().sum.tolist()
    (2, [[10.0, 2.0], [2.0, 4.0]])

    """

    count: int
    """Samples seen."""
    sum: Tensor
    r"""$\sum_i x_i x_i^\top$, shape ``[F, F]``."""
    mean: Tensor
    """``sum / count``: the uncentred second-moment matrix."""


class Gram(_Base, _FeatureShape):
    r"""Uncentred second moments: $\sum_i x_i x_i^\top$ over samples, with count.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Gram
    >>> r = Gram()
    >>> r.update(torch.tensor([[1.0, 2.0], [3.0, 0.0]]))
    >>> r.result().mean
    tensor([[5., 1.],
            [1., 2.]], dtype=torch.float64)

    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._shape = None
        self._sum: Tensor | None = None

    @property
    def count(self) -> int:
        """Samples seen."""
        return self._n

    def _combine(self, n: int, gram: Tensor) -> None:
        self._sum = gram if self._sum is None else self._sum + gram.to(self._sum.device)
        self._n += n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (checked; target unused)
        """Feed a batch (dim 0: samples); ``target`` is ignored."""
        x = _batch(value, "Gram")
        self._check_features(x, "Gram")
        if x.shape[0] == 0:
            return
        flat = _flat(x)
        self._combine(flat.shape[0], flat.T @ flat)

    def merge(self, other: Self) -> None:
        """Add the sums of ``other``."""
        self._check_peer(other)
        self._peer_shape(other, "Gram")
        if other._sum is not None:
            self._combine(other._n, other._sum.clone())

    def result(self) -> GramResult:
        r"""Return count, sum and mean of $x x^\top$."""
        if self._sum is None:
            msg = "Gram: no sample seen yet"
            raise ValueError(msg)
        return GramResult(self._n, self._sum.clone(), self._sum / self._n)

    def state(self) -> dict[str, Tensor]:
        """Return ``count``, ``feature_shape``, ``sum``."""
        out = {"count": _count_tensor(self._n)}
        if self._shape is not None:
            out["feature_shape"] = _shape_tensor(self._shape)
        if self._sum is not None:
            out["sum"] = self._sum
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the state by ``state``."""
        self._reset()
        self._n = int(_get(state, "count", "Gram"))
        if "feature_shape" in state:
            self._shape = torch.Size(state["feature_shape"].tolist())
        if self._n:
            self._sum = _get(state, "sum", "Gram").to(_F64)
