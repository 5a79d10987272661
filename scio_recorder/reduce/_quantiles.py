"""Quantiles over samples: exact, or a bounded-memory mergeable sketch.

:class:`Quantiles` keeps every value (exact, interpolated quantiles), or a
deterministic compactor sketch per feature whose rank error is proven to stay
within :func:`quantile_rank_bound`; the sketch's algorithm and its guarantee
are documented on the class.

Import them from :mod:`scio_recorder.reduce`, their public home.
"""

from __future__ import annotations

__all__ = ["Quantiles", "quantile_rank_bound"]

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
    _get,
    _shape_tensor,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from typing_extensions import Self


def quantile_rank_bound(n: int, k: int) -> int:
    r"""Return the worst-case rank error of the :class:`Quantiles` sketch.

    After ``n`` values, every estimated rank (and the rank of every returned
    quantile) is within this many positions of the true one, whatever the
    values, their order, the batch sizes and the merges:

    $$\sum_{h \ge 0,\ k 2^h \le n} 2^h \lfloor n / (k 2^h) \rfloor
    \le n (\lfloor \log_2(n/k) \rfloor + 1) / k$$

    Parameters
    ----------
    n : int
        Values seen per feature.
    k : int
        The sketch's level capacity.

    Returns
    -------
    int
        The bound (0 while ``n < k``: nothing was compacted).

    Examples
    --------
    >>> from scio_recorder.reduce import quantile_rank_bound
    >>> quantile_rank_bound(100_000, 1024), quantile_rank_bound(1000, 1024)
    (641, 0)

    """
    bound, weight = 0, 1
    while k * weight <= n:
        bound += weight * (n // (k * weight))
        weight *= 2
    return bound


class Quantiles(_Base, _FeatureShape):
    r"""Quantiles over samples, per feature: exact, or a bounded-memory sketch.

    ``exact=True`` keeps every value and returns linearly interpolated
    quantiles (as :func:`torch.quantile`). ``exact=False`` keeps a
    deterministic mergeable compactor sketch per feature, vectorised over
    features: level $h$ holds values of weight $2^h$; new values enter
    level 0; when a level holds ``k`` values or more it is sorted and every
    other value moves up to level $h + 1$ with doubled weight (an odd
    leftover, the largest, stays). The offset (keep the values at even or at
    odd positions) alternates at each compaction of a level, and starts at
    $h \bmod 2$, so that successive errors tend to cancel. A quantile $q$
    is the smallest retained value whose cumulated weight reaches $q n$.

    Rank guarantee of the sketch: each compaction at level ``h`` changes the
    weighted count of retained values below any threshold by at most
    $2^h$; it consumes at least $k$ values of weight $2^h$ out of at
    most $n / 2^h$ ever present at that level, so the rank error is at most
    $\sum_h 2^h \lfloor n / (k 2^h) \rfloor \le n (\lfloor \log_2(n/k)
    \rfloor + 1) / k$ (:func:`quantile_rank_bound`; :attr:`rank_error_bound`
    is the tighter bound of the compactions actually done). The rank of a
    returned value $y$ is then within that bound $b$ of $q n$: the true
    count of values below $y$ is at most $q n + b$, of values up to $y$ at
    least $q n - b$. Memory between updates: fewer than $k$ values per
    level and at most $\lfloor \log_2(n/k) \rfloor + 2$ levels per feature
    (a level compacts only if it received $k$ values, i.e. $k 2^h \le n$).

    Parameters
    ----------
    q : float or sequence of float
        Quantile level(s) in ``[0, 1]``.
    per_feature : bool, default True
        Quantiles per feature (dims 1...) over samples; with ``False`` every
        element of every record is a value of one pooled stream.
    exact : bool, default True
        Keep everything (exact), or use the sketch.
    k : int, default 1024
        Level capacity of the sketch (even, >= 2).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Quantiles
    >>> r = Quantiles([0.0, 0.5, 1.0])
    >>> r.update(torch.tensor([[1.0, 10.0], [4.0, 40.0]]))
    >>> r.update(torch.tensor([[2.0, 20.0]]))
    >>> r.result()
    tensor([[ 1., 10.],
            [ 2., 20.],
            [ 4., 40.]], dtype=torch.float64)

    The sketch on 1000 shuffled values ``0, ..., 999``, fed in batches of 100:
    each returned value's rank is within ``rank_error_bound`` of $q n$.

    >>> sketch = Quantiles([0.1, 0.5, 0.9], exact=False, k=64)
    >>> for batch in ((torch.arange(1000.0) * 337) % 1000).split(100):
    ...     sketch.update(batch)
    >>> sketch.result().tolist(), sketch.rank_error_bound, sketch.retained
    ([106.0, 509.0, 911.0], 36, 100)

    """

    def __init__(
        self,
        q: float | Sequence[float],
        *,
        per_feature: bool = True,
        exact: bool = True,
        k: int = 1024,
    ) -> None:
        levels = (float(q),) if isinstance(q, int | float) else tuple(map(float, q))
        if not levels or not all(0.0 <= level <= 1.0 for level in levels):
            msg = f"Quantiles: q must be in [0, 1], got {q!r}"
            raise ValueError(msg)
        if k < 2 or k % 2:  # noqa: PLR2004 (pairs are compacted)
            msg = f"Quantiles: k must be an even integer >= 2, got {k}"
            raise ValueError(msg)
        self.q = levels
        self._scalar_q = isinstance(q, int | float)
        self.per_feature = per_feature
        self.exact = exact
        self.k = k
        self._reset()

    def _config(self) -> tuple[Any, ...]:
        return (self.q, self.per_feature, self.exact, self.k)

    def _reset(self) -> None:
        self._n = 0  # samples (dim 0 rows)
        self._values = 0  # values per feature stream
        self._shape = None
        self._chunks: list[Tensor] = []  # exact: [n_i, F] chunks
        self._levels: list[Tensor] = []  # sketch: [F, size_h] float64
        self._compactions: list[int] = []
        self._offsets: list[int] = []

    @property
    def count(self) -> int:
        """Samples seen (rows)."""
        return self._n

    @property
    def rank_error_bound(self) -> int:
        r"""Proven bound on the rank error now: $\sum_h 2^h C_h$.

        $C_h$: the compactions done at level $h$.
        """
        return sum(c << h for h, c in enumerate(self._compactions))

    @property
    def retained(self) -> int:
        """Values held per feature (sketch), or values seen (exact)."""
        if self.exact:
            return self._values
        return sum(level.shape[1] for level in self._levels)

    def _matrix(self, x: Tensor) -> Tensor:
        """Return the values of a record as ``[values, features]``."""
        if self.per_feature:
            self._check_features(x, "Quantiles")
            return x.reshape(x.shape[0], math.prod(x.shape[1:]))
        return x.reshape(-1, 1)

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (checked; target unused)
        """Feed a batch (dim 0: samples); ``target`` is ignored."""
        x = _batch(value, "Quantiles")
        values = self._matrix(x)
        self._n += x.shape[0]
        if values.shape[0] == 0:
            return
        self._values += values.shape[0]
        if self.exact:
            self._chunks.append(values.clone())
        else:
            self._absorb([values.T.to(_F64)], [0], [0])

    def _absorb(
        self, levels: list[Tensor], compactions: list[int], offsets: list[int]
    ) -> None:
        """Add ``levels`` level by level, then compact every full level."""
        if not self._levels:
            self._levels = [levels[0][:, :0]]
            self._compactions, self._offsets = [0], [0]
        device = self._levels[0].device
        for h, incoming in enumerate(levels):
            if h == len(self._levels):
                self._levels.append(incoming[:, :0].to(device))
                self._compactions.append(0)
                self._offsets.append(offsets[h])
            self._levels[h] = torch.cat([self._levels[h], incoming.to(device)], 1)
            self._compactions[h] += compactions[h]
        h = 0
        while h < len(self._levels):
            size = self._levels[h].shape[1]
            if size >= self.k:
                ordered = self._levels[h].sort(dim=1).values
                even = size - size % 2
                promoted = ordered[:, self._offsets[h] : even : 2]
                self._levels[h] = ordered[:, even:]
                self._offsets[h] ^= 1
                self._compactions[h] += 1
                if h + 1 == len(self._levels):
                    self._levels.append(promoted[:, :0])
                    self._compactions.append(0)
                    self._offsets.append((h + 1) % 2)
                self._levels[h + 1] = torch.cat([self._levels[h + 1], promoted], 1)
            h += 1

    def merge(self, other: Self) -> None:
        """Absorb ``other`` (exact: append; sketch: merge level by level)."""
        self._check_peer(other)
        if self.per_feature:
            self._peer_shape(other, "Quantiles")
        self._n += other._n
        self._values += other._values
        if self.exact:
            self._chunks.extend(other._chunks)
        elif not self._levels:  # a copy of other's sketch, which is at rest
            self._levels = [level.clone() for level in other._levels]
            self._compactions = list(other._compactions)
            self._offsets = list(other._offsets)
        elif other._levels:
            self._absorb(other._levels, other._compactions, other._offsets)

    def result(self) -> Tensor:
        """Return the quantiles, float64, shape ``[len(q), *features]``.

        The leading dim is dropped for a scalar ``q``; with
        ``per_feature=False`` there are no feature dims.
        """
        if self._values == 0:
            msg = "Quantiles: no value seen yet"
            raise ValueError(msg)
        out = self._exact() if self.exact else self._sketch()  # [Q, F]
        shape = self._shape if self.per_feature and self._shape is not None else ()
        out = out.reshape(len(self.q), *shape)
        return out[0] if self._scalar_q else out

    def _exact(self) -> Tensor:
        data = torch.cat([c.to(self._chunks[0].device) for c in self._chunks])
        ordered = data.to(_F64).sort(dim=0).values
        rows = []
        for level in self.q:
            pos = level * (self._values - 1)
            lo = math.floor(pos)
            hi = min(lo + 1, self._values - 1)
            frac = pos - lo
            rows.append(ordered[lo] + (ordered[hi] - ordered[lo]) * frac)
        return torch.stack(rows)

    def _sketch(self) -> Tensor:
        values = torch.cat(self._levels, 1)  # [F, T]
        device = values.device
        weights = torch.cat(
            [
                torch.full((level.shape[1],), float(1 << h), dtype=_F64, device=device)
                for h, level in enumerate(self._levels)
            ]
        )
        ordered, index = values.sort(dim=1)
        cumulative = weights[index].cumsum(1)
        ranks = torch.tensor(self.q, dtype=_F64, device=device) * self._values
        ranks = ranks.expand(values.shape[0], len(self.q)).contiguous()
        pos = torch.searchsorted(cumulative, ranks).clamp(max=values.shape[1] - 1)
        return ordered.gather(1, pos).T

    def state(self) -> dict[str, Tensor]:
        """Return ``count``, ``values``, ``feature_shape`` and the data.

        Exact: ``data`` ``[values, F]``. Sketch: ``level.<h>`` ``[F, size]``,
        ``compactions`` and ``offsets`` (one per level).
        """
        out = {"count": _count_tensor(self._n), "values": _count_tensor(self._values)}
        if self._shape is not None:
            out["feature_shape"] = _shape_tensor(self._shape)
        if self.exact and self._chunks:
            out["data"] = torch.cat(
                [c.to(self._chunks[0].device) for c in self._chunks]
            )
        if not self.exact and self._levels:
            out.update({f"level.{h}": level for h, level in enumerate(self._levels)})
            out["compactions"] = torch.tensor(self._compactions, dtype=torch.int64)
            out["offsets"] = torch.tensor(self._offsets, dtype=torch.int64)
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the state by ``state``."""
        self._reset()
        self._n = int(_get(state, "count", "Quantiles"))
        self._values = int(_get(state, "values", "Quantiles"))
        if "feature_shape" in state:
            self._shape = torch.Size(state["feature_shape"].tolist())
        if self.exact and "data" in state:
            self._chunks = [state["data"]]
        if not self.exact and "compactions" in state:
            self._compactions = [int(c) for c in state["compactions"].tolist()]
            self._offsets = [int(o) for o in state["offsets"].tolist()]
            self._levels = [
                _get(state, f"level.{h}", "Quantiles").to(_F64)
                for h in range(len(self._compactions))
            ]
