"""Reducers: fold records across calls, or stream statistics over a data set.

One protocol, two jobs
----------------------
A recorded layer produces one *record* (a tensor, usually a batch) per call.
Two things are commonly done with a stream of records, and both are served by
the same small protocol, :class:`Reducer`:

* **Folding across calls or passes** (``torchfunc`` parity): keep every record
  (:class:`Keep`), or fold them elementwise with ``acc = fn(acc, new)``
  (:class:`Fold`, and the ready folds :class:`Sum`, :class:`Max`,
  :class:`Min`, :class:`RecordMean`). Records must have equal shapes.
  :func:`make_reducer` turns ``"all"``, ``"keep"``, ``"sum"``, ``"mean"``,
  ``"max"``, ``"min"`` or a callable into a reducer.
* **Data-set statistics over samples**: dim 0 of every record is the sample
  (batch) dimension and the other dims are the features (flattened where a
  matrix is needed): :class:`Count`, :class:`Moments`, :class:`Covariance`,
  :class:`SharedCovariance`, :class:`MinMax`, :class:`Gram`,
  :class:`FeatureMapGram`, :class:`Quantiles`, :class:`Concat`, and
  :class:`PerClass` to split any of them by class label.

A reducer is a plain object::

    r.update(record, target=None)  # feed one record (target: class labels)
    r.merge(other)  # absorb a reducer of the same kind/config
    r.result()  # the current result; state is kept
    r.state() / r.load_state(s)  # flat dict of tensors, to save or gather
    r.fresh()  # a new empty reducer with the same config
    r.count  # samples seen (records, for folds)

Why one protocol: the code that feeds records (a recorder hook, a loop over a
data loader, a distributed job) does not need to know what is computed, and
a new statistic plugs in by implementing five methods.

Why mergeable: the statistics are exact *and* mergeable, so a data set can be
split across ranks, shards or threads, each part reduced on its own
(:meth:`fresh` builds the per-part reducers) and the parts merged in any
order. Moments use Welford/Chan updates in float64 (one two-pass batch
statistic per update, then a Chan merge), so a long stream with a large
offset keeps its precision. :meth:`state` is a flat ``dict[str, Tensor]`` that
``torch.save`` and ``torch.distributed`` gather handle directly.

Conventions
-----------
* Accumulators live on the record's device; :meth:`update` never synchronises
  with the host (no ``.item()``), except :class:`PerClass` (one sync per update
  to split the batch by label) and :class:`SharedCovariance` without
  ``num_classes`` (one sync to grow the class table), and :class:`Concat`,
  whose job is to copy to the CPU.
* **Result dtypes.** Anything computed by arithmetic (sums, means, moments,
  covariances, Gram matrices, quantiles) is accumulated and returned in
  ``float64``. Reducers that only select or store values (:class:`Keep`,
  :class:`Concat`, :class:`Max`, :class:`Min`, :class:`MinMax`, a user
  :class:`Fold`) return the input's dtype.
* Built-in reducers detach records (statistics carry no autograd graph).
* ``float64`` is not supported on Apple MPS: reduce on the CPU there.

Examples
--------
>>> import torch
>>> from scio_recorder.reduce import Moments
>>> parts = [Moments(), Moments()]
>>> parts[0].update(torch.tensor([[1.0], [2.0]]))
>>> parts[1].update(torch.tensor([[3.0], [4.0], [5.0]]))
>>> total = parts[0].fresh()
>>> for part in reversed(parts):
...     total.merge(part)
>>> stats = total.result()
>>> stats.count, stats.mean.item(), stats.var.item()
(5, 3.0, 2.5)

"""

from __future__ import annotations

__all__ = [
    "REDUCTION_NAMES",
    "Concat",
    "Count",
    "CountResult",
    "Covariance",
    "CovarianceResult",
    "FeatureMapGram",
    "FeatureMapGramResult",
    "Fold",
    "Gram",
    "GramResult",
    "Keep",
    "Max",
    "Min",
    "MinMax",
    "MinMaxResult",
    "Moments",
    "MomentsResult",
    "PerClass",
    "Quantiles",
    "RecordMean",
    "Reducer",
    "SharedCovariance",
    "SharedCovarianceResult",
    "Sum",
    "make_reducer",
    "quantile_rank_bound",
]

import copy
import dataclasses
import math
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from typing_extensions import Self

_F64 = torch.float64


# --------------------------------------------------------------------- protocol
@runtime_checkable
class Reducer(Protocol):
    """What every reducer provides (a structural protocol: no base class).

    Feed records with :meth:`update`; read :meth:`result` at any time. Two
    reducers of the same kind and configuration combine with :meth:`merge`;
    merging is associative and commutative (up to float rounding), so parts
    of a stream may be reduced anywhere and merged in any order. Order-only
    exceptions are documented on the reducer (:class:`Keep` and
    :class:`Concat` keep rows in merge order; the approximate
    :class:`Quantiles` sketch depends on the order but its error bound does
    not).

    Examples
    --------
    >>> from scio_recorder.reduce import Moments, Reducer, Sum
    >>> isinstance(Moments(), Reducer), isinstance(Sum(), Reducer)
    (True, True)

    """

    @property
    def count(self) -> int:
        """Samples seen (for the elementwise folds: records seen)."""
        ...

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Feed one record; ``target`` holds per-sample class labels."""
        ...

    def merge(self, other: Self) -> None:
        """Absorb ``other``, a reducer of the same kind and configuration."""
        ...

    def result(self) -> Any:
        """Return the current result without consuming the state."""
        ...

    def state(self) -> dict[str, Tensor]:
        """Return the state as a flat dict of tensors."""
        ...

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Replace the state by ``state`` (from :meth:`state`)."""
        ...

    def fresh(self) -> Self:
        """Return a new, empty reducer with the same configuration."""
        ...


# ---------------------------------------------------------------------- helpers
def _batch(value: object, who: str) -> Tensor:
    """Return ``value`` detached, checking it is a tensor with a batch dim."""
    if not isinstance(value, Tensor):
        msg = f"{who} reduces tensors, got {type(value).__name__}"
        raise TypeError(msg)
    if value.dim() < 1:
        msg = f"{who} needs records with a batch dimension (dim 0), got a 0-d tensor"
        raise ValueError(msg)
    return value.detach()


def _flat(x: Tensor) -> Tensor:
    """Return ``x`` as a float64 ``[batch, features]`` matrix."""
    return x.reshape(x.shape[0], math.prod(x.shape[1:])).to(_F64)


def _shape_tensor(shape: Sequence[int]) -> Tensor:
    return torch.tensor(list(shape), dtype=torch.int64)


def _count_tensor(n: int) -> Tensor:
    return torch.tensor(n, dtype=torch.int64)


def _get(state: Mapping[str, Tensor], key: str, who: str) -> Tensor:
    try:
        return state[key]
    except KeyError:
        msg = f"{who}.load_state: the state has no {key!r} entry"
        raise KeyError(msg) from None


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def _labels(target: Tensor | None, batch: int, who: str) -> Tensor:
    """Check ``target``: integer class labels, one per sample."""
    if target is None:
        msg = f"{who} needs per-sample class labels: call update(value, target)"
        raise ValueError(msg)
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        msg = f"{who}: class labels must be integers, got {target.dtype}"
        raise TypeError(msg)
    if target.shape != (batch,):
        msg = (
            f"{who}: target must have shape [batch] = [{batch}], "
            f"got {list(target.shape)}"
        )
        raise ValueError(msg)
    return target.detach()


class _Base:
    """Plumbing shared by the built-in reducers (not part of the protocol).

    ``__init__`` stores the configuration then calls :meth:`_reset`, which
    must (re)assign every piece of state; :meth:`fresh` is a shallow copy
    (shared, immutable configuration) followed by :meth:`_reset`.
    """

    def _reset(self) -> None:
        raise NotImplementedError

    @property
    def count(self) -> int:
        """Samples seen (for the elementwise folds: records seen)."""
        raise NotImplementedError

    def fresh(self) -> Self:
        """Return a new, empty reducer with the same configuration.

        Returns
        -------
        Self
            An empty reducer of the same class and configuration, for example
            one per rank or shard, to :meth:`merge` later.

        Examples
        --------
        >>> import torch
        >>> from scio_recorder.reduce import Moments
        >>> r = Moments()
        >>> r.update(torch.ones(3, 2))
        >>> r.count, r.fresh().count
        (3, 0)

        """
        new = copy.copy(self)
        new._reset()  # noqa: SLF001 (own class)
        return new

    def _config(self) -> tuple[Any, ...]:
        return ()

    def _check_peer(self, other: object) -> None:
        if type(other) is not type(self):
            msg = f"cannot merge a {type(other).__name__} into a {type(self).__name__}"
            raise TypeError(msg)
        assert isinstance(other, _Base)  # noqa: S101 (narrowing for mypy)
        theirs = other._config()  # noqa: SLF001 (own class)
        if theirs != self._config():
            msg = (
                f"cannot merge {type(self).__name__} reducers with different "
                f"configurations: {self._config()} and {theirs}"
            )
            raise ValueError(msg)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(count={self.count})"


class _FeatureShape:
    """Track the per-sample feature shape and check every record against it."""

    _shape: torch.Size | None

    def _check_features(self, x: Tensor, who: str) -> None:
        if self._shape is None:
            self._shape = x.shape[1:]
        elif x.shape[1:] != self._shape:
            msg = (
                f"{who}: every record must have the same per-sample shape; got "
                f"{list(x.shape[1:])} after {list(self._shape)}"
            )
            raise ValueError(msg)

    def _peer_shape(self, other: _FeatureShape, who: str) -> None:
        if self._shape is None:
            self._shape = other._shape
        elif other._shape is not None and other._shape != self._shape:
            msg = (
                f"{who}: cannot merge records of per-sample shape "
                f"{list(other._shape)} into {list(self._shape)}"
            )
            raise ValueError(msg)


# ------------------------------------------------------------ per-call folding
class Keep(_Base):
    """Keep every record (``"all"`` / ``"keep"``): the result is their list.

    Records are stored as given (not copied, not detached), like a recorder
    that keeps every call. :meth:`merge` appends the other's records after
    this one's, so the list follows the merge order. :meth:`state` works when
    every record is a tensor.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Keep
    >>> r = Keep()
    >>> r.update(torch.tensor([1, 2]))
    >>> r.update(torch.tensor([3]))
    >>> r.count, r.result()
    (2, [tensor([1, 2]), tensor([3])])

    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._records: list[Any] = []

    @property
    def count(self) -> int:
        """Records kept."""
        return len(self._records)

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (any record; target unused)
        """Append ``value``; ``target`` is ignored."""
        self._records.append(value)

    def merge(self, other: Self) -> None:
        """Append the records of ``other``."""
        self._check_peer(other)
        self._records.extend(other._records)

    def result(self) -> list[Any]:
        """Return the list of records (a new list; the records are shared)."""
        return list(self._records)

    def state(self) -> dict[str, Tensor]:
        """Return ``{"count": n, "record.0": ..., ...}`` (tensor records only)."""
        out = {"count": _count_tensor(len(self._records))}
        for i, record in enumerate(self._records):
            if not isinstance(record, Tensor):
                msg = (
                    f"Keep.state: record {i} is a {type(record).__name__}, not a tensor"
                )
                raise TypeError(msg)
            out[f"record.{i}"] = record
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the records by those of ``state``."""
        n = int(_get(state, "count", "Keep"))
        self._records = [_get(state, f"record.{i}", "Keep") for i in range(n)]


class Fold(_Base):
    """Fold records with a function: ``acc = fn(acc, new)``.

    The first record becomes the accumulator as is (not copied, like
    ``torchfunc``), so ``fn`` should return a new object rather than modify
    ``acc`` in place. :meth:`merge` computes ``fn(acc, other_acc)``: for the
    result not to depend on how the stream was split and merged, ``fn`` must
    be associative and commutative (``torch.add``, ``torch.maximum``, ...).
    Merging uses this reducer's ``fn``; the other's is not compared.

    Parameters
    ----------
    fn : callable
        ``fn(acc, new) -> acc``.
    name : str, optional
        A name for messages and ``repr``; defaults to ``fn.__name__``.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Fold
    >>> r = Fold(lambda acc, new: acc * new, name="product")
    >>> for x in ([1.0, 2.0], [3.0, 4.0], [5.0, 6.0]):
    ...     r.update(torch.tensor(x))
    >>> r.result(), r.count, r
    (tensor([15., 48.]), 3, Fold(product, count=3))

    """

    def __init__(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> None:
        if not callable(fn):
            msg = f"Fold needs a callable fn(acc, new) -> acc, got {fn!r}"
            raise TypeError(msg)
        self._fn = fn
        self.name: str = name if name is not None else getattr(fn, "__name__", repr(fn))
        self._reset()

    def _reset(self) -> None:
        self._acc: Any = None
        self._n = 0

    @property
    def count(self) -> int:
        """Records folded."""
        return self._n

    def _prepare(self, value: Any) -> Any:
        return value

    def _check_acc(self, other_acc: Any) -> Any:
        return other_acc

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (any record; target unused)
        """Fold ``value`` into the accumulator; ``target`` is ignored."""
        value = self._prepare(value)
        self._acc = value if self._n == 0 else self._fn(self._acc, value)
        self._n += 1

    def merge(self, other: Self) -> None:
        """Set the accumulator to ``fn(acc, other_acc)``."""
        self._check_peer(other)
        if other._n == 0:
            return
        theirs = self._check_acc(other._acc)
        self._acc = _clone(theirs) if self._n == 0 else self._fn(self._acc, theirs)
        self._n += other._n

    def _finish(self, acc: Any) -> Any:
        return acc

    def result(self) -> Any:
        """Return the accumulator.

        Raises
        ------
        ValueError
            If no record was folded yet.
        """
        if self._n == 0:
            msg = f"{self!r}: no record folded yet"
            raise ValueError(msg)
        return self._finish(self._acc)

    def state(self) -> dict[str, Tensor]:
        """Return ``{"count": n, "acc": accumulator}`` (tensor accumulators)."""
        out = {"count": _count_tensor(self._n)}
        if self._n:
            if not isinstance(self._acc, Tensor):
                msg = f"{self!r}.state: the accumulator is not a tensor"
                raise TypeError(msg)
            out["acc"] = self._acc
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the accumulator by the one in ``state``."""
        self._n = int(_get(state, "count", "Fold"))
        self._acc = _get(state, "acc", "Fold") if self._n else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, count={self.count})"


class _ElementwiseFold(Fold):
    """A ready fold of tensor records of equal shape."""

    _dtype: torch.dtype | None = None  # None: keep the record's dtype

    def _prepare(self, value: Any) -> Tensor:
        if not isinstance(value, Tensor):
            msg = f"{self.name!r} reduces tensors, got {type(value).__name__}"
            raise TypeError(msg)
        x = value.detach()
        if self._dtype is not None:
            x = x.to(self._dtype)
        if self._n == 0:
            # own the first record (unless converting already copied it)
            return x.clone() if x.data_ptr() == value.data_ptr() else x
        return self._check_acc(x)

    def _check_acc(self, other_acc: Any) -> Tensor:
        assert isinstance(other_acc, Tensor)  # noqa: S101 (narrowing for mypy)
        if self._n and other_acc.shape != self._acc.shape:
            msg = (
                f"{self.name!r} folds records elementwise: they must have equal "
                f"shapes, got {list(other_acc.shape)} after {list(self._acc.shape)}"
            )
            raise ValueError(msg)
        return other_acc.to(self._acc.device) if self._n else other_acc

    def __repr__(self) -> str:
        return f"{type(self).__name__}(count={self.count})"


class Sum(_ElementwiseFold):
    """Elementwise sum of the records (``"sum"``), accumulated in float64.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Sum
    >>> r = Sum()
    >>> r.update(torch.tensor([1.0, 2.0]))
    >>> r.update(torch.tensor([3.0, 5.0]))
    >>> r.result()
    tensor([4., 7.], dtype=torch.float64)

    """

    _dtype = _F64

    def __init__(self) -> None:
        super().__init__(torch.add, "sum")


class RecordMean(Sum):
    """Elementwise mean across records (``"mean"``), in float64.

    Not to be confused with :class:`Moments`, the mean over *samples*.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import RecordMean
    >>> r = RecordMean()
    >>> r.update(torch.tensor([1.0, 2.0]))
    >>> r.update(torch.tensor([3.0, 5.0]))
    >>> r.result()
    tensor([2.0000, 3.5000], dtype=torch.float64)

    """

    def __init__(self) -> None:
        super().__init__()
        self.name = "mean"

    def _finish(self, acc: Any) -> Tensor:
        assert isinstance(acc, Tensor)  # noqa: S101 (narrowing for mypy)
        return acc / self._n


class Max(_ElementwiseFold):
    """Elementwise maximum of the records (``"max"``), in the input dtype.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Max
    >>> r = Max()
    >>> r.update(torch.tensor([1, 5]))
    >>> r.update(torch.tensor([3, 2]))
    >>> r.result()
    tensor([3, 5])

    """

    def __init__(self) -> None:
        super().__init__(torch.maximum, "max")


class Min(_ElementwiseFold):
    """Elementwise minimum of the records (``"min"``), in the input dtype.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Min
    >>> r = Min()
    >>> r.update(torch.tensor([1, 5]))
    >>> r.update(torch.tensor([3, 2]))
    >>> r.result()
    tensor([1, 2])

    """

    def __init__(self) -> None:
        super().__init__(torch.minimum, "min")


REDUCTION_NAMES: tuple[str, ...] = ("all", "keep", "sum", "mean", "max", "min")
"""The names :func:`make_reducer` accepts."""

_NAMED: dict[str, Callable[[], Reducer]] = {
    "all": Keep,
    "keep": Keep,
    "sum": Sum,
    "mean": RecordMean,
    "max": Max,
    "min": Min,
}


def make_reducer(spec: str | Callable[[Any, Any], Any] | Reducer) -> Reducer:
    """Turn a reduction spec into a reducer.

    Parameters
    ----------
    spec : str, callable or Reducer
        ``"all"`` or ``"keep"`` (:class:`Keep`), ``"sum"`` (:class:`Sum`),
        ``"mean"`` (:class:`RecordMean`), ``"max"`` (:class:`Max`), ``"min"``
        (:class:`Min`); a callable ``fn(acc, new) -> acc`` (:class:`Fold`); or
        a reducer, returned as is.

    Returns
    -------
    Reducer
        A new reducer, or ``spec`` itself when it is one.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones).
    TypeError
        For a reducer class instead of an instance, or any other object.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import make_reducer
    >>> make_reducer("mean"), make_reducer(torch.maximum)
    (RecordMean(count=0), Fold(maximum, count=0))
    >>> make_reducer("median")
    Traceback (most recent call last):
    ...
    ValueError: unknown reduction 'median'; valid names: 'all', 'keep', 'sum', 'mean', 'max', 'min' (or pass a callable fn(acc, new) -> acc, or a Reducer)

    """  # noqa: E501 (doctest output)
    if isinstance(spec, str):
        try:
            return _NAMED[spec]()
        except KeyError:
            valid = ", ".join(repr(name) for name in REDUCTION_NAMES)
            msg = (
                f"unknown reduction {spec!r}; valid names: {valid} "
                "(or pass a callable fn(acc, new) -> acc, or a Reducer)"
            )
            raise ValueError(msg) from None
    if isinstance(spec, type):
        msg = (
            f"make_reducer got the class {spec.__name__}; pass an instance, "
            f"e.g. {spec.__name__}()"
        )
        raise TypeError(msg)
    if isinstance(spec, Reducer):
        return spec
    if callable(spec):
        return Fold(spec)
    msg = (
        "make_reducer needs a name, a callable fn(acc, new) -> acc or a Reducer, "
        f"got {type(spec).__name__}"
    )
    raise TypeError(msg)


# ------------------------------------------------------------------ statistics
@dataclasses.dataclass(frozen=True)
class CountResult:
    """The result of :class:`Count`.

    Examples
    --------
    >>> from scio_recorder.reduce import CountResult
    >>> CountResult(records=2, samples=6).samples
    6

    """

    records: int
    """Records (updates) seen."""
    samples: int
    """Samples seen (sum of the records' dim 0)."""


class Count(_Base):
    """Count records and samples.

    A tensor record with at least one dim counts ``record.shape[0]`` samples;
    anything else (a 0-d tensor, a tuple, ...) counts one.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Count
    >>> r = Count()
    >>> r.update(torch.zeros(4, 3))
    >>> r.update(torch.zeros(2, 3))
    >>> r.result()
    CountResult(records=2, samples=6)

    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._records = 0
        self._samples = 0

    @property
    def count(self) -> int:
        """Samples seen."""
        return self._samples

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (any record; target unused)
        """Count one record."""
        self._records += 1
        is_batch = isinstance(value, Tensor) and value.dim() >= 1
        self._samples += value.shape[0] if is_batch else 1

    def merge(self, other: Self) -> None:
        """Add the counts of ``other``."""
        self._check_peer(other)
        self._records += other._records
        self._samples += other._samples

    def result(self) -> CountResult:
        """Return the counts."""
        return CountResult(self._records, self._samples)

    def state(self) -> dict[str, Tensor]:
        """Return ``{"records": ..., "samples": ...}``."""
        return {
            "records": _count_tensor(self._records),
            "samples": _count_tensor(self._samples),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the counts by those of ``state``."""
        self._records = int(_get(state, "records", "Count"))
        self._samples = int(_get(state, "samples", "Count"))


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
class SharedCovarianceResult:
    """The result of :class:`SharedCovariance`, in float64.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import SharedCovariance
    >>> r = SharedCovariance(num_classes=3)
    >>> r.update(torch.tensor([[1.0], [3.0], [7.0]]), torch.tensor([2, 2, 0]))
    >>> res = r.result()
    >>> res.class_counts.tolist(), res.means.flatten().tolist(), res.cov.item()
    ([1, 0, 2], [7.0, 0.0, 2.0], 0.6666666666666666)

    """

    count: int
    """Samples seen, ``N``."""
    class_counts: Tensor
    """Samples per class, ``[C]`` (int64)."""
    means: Tensor
    """Per-class means, ``[C, F]`` (zero for a class never seen)."""
    cov: Tensor
    """Shared covariance ``W / N`` (Lee et al. 2018), ``[F, F]``."""
    cov_unbiased: Tensor
    """Pooled unbiased covariance ``W / (N - C_seen)``, ``[F, F]``."""


class SharedCovariance(_Base, _FeatureShape):
    """Per-class means and the covariance shared by all classes.

    With ``W = sum_c sum_{i in c} (x_i - mu_c)(x_i - mu_c)^T`` the pooled
    within-class co-moment, ``cov = W / N`` is the tied covariance of the
    Mahalanobis detector of Lee et al. (2018), and ``cov_unbiased =
    W / (N - C)`` (``C``: classes seen) the pooled unbiased estimate.

    Per-class counts, sums and centred co-moments of a batch come from
    ``index_add_`` (no host sync when ``num_classes`` is given), and are
    merged class by class with Chan's rule, vectorised:
    ``W += W_b + D^T diag(na * nb / n) D`` with ``D`` the differences of
    class means.

    Parameters
    ----------
    num_classes : int, optional
        Number of classes; labels must lie in ``[0, num_classes)``. Without
        it the class table grows to the largest label seen, at the cost of
        one host sync per update.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import SharedCovariance
    >>> r = SharedCovariance(num_classes=2)
    >>> x = torch.tensor([[0.0], [2.0], [10.0], [14.0]])
    >>> r.update(x, torch.tensor([0, 0, 1, 1]))
    >>> res = r.result()
    >>> res.means.flatten().tolist(), res.cov.item(), res.cov_unbiased.item()
    ([1.0, 12.0], 2.5, 5.0)

    """

    def __init__(self, num_classes: int | None = None) -> None:
        if num_classes is not None and num_classes < 1:
            msg = f"SharedCovariance: num_classes must be >= 1, got {num_classes}"
            raise ValueError(msg)
        self.num_classes = num_classes
        self._reset()

    def _config(self) -> tuple[Any, ...]:
        return (self.num_classes,)

    def _reset(self) -> None:
        self._n = 0
        self._shape = None
        self._counts: Tensor | None = None  # [C] float64
        self._means: Tensor | None = None  # [C, F]
        self._within: Tensor | None = None  # [F, F]

    @property
    def count(self) -> int:
        """Samples seen."""
        return self._n

    def _grow(self, classes: int) -> None:
        """Pad the class table to ``classes`` rows."""
        if self._counts is None or self._means is None:
            return
        extra = classes - self._counts.shape[0]
        if extra > 0:
            self._counts = torch.cat([self._counts, self._counts.new_zeros(extra)])
            self._means = torch.cat(
                [self._means, self._means.new_zeros(extra, self._means.shape[1])]
            )

    def _combine(self, nb: Tensor, mb: Tensor, wb: Tensor, total: int) -> None:
        if self._counts is None or self._means is None or self._within is None:
            self._counts, self._means, self._within = nb, mb, wb
            self._n = total
            return
        classes = max(self._counts.shape[0], nb.shape[0])
        self._grow(classes)
        device = self._counts.device
        nb = torch.cat(
            [nb.to(device), nb.new_zeros(classes - nb.shape[0], device=device)]
        )
        mb = torch.cat(
            [
                mb.to(device),
                mb.new_zeros(classes - mb.shape[0], mb.shape[1], device=device),
            ]
        )
        na, ma = self._counts, self._means
        n = na + nb
        safe_n = n.clamp(min=1)
        delta = mb - ma
        weight = na * nb / safe_n
        self._within = (
            self._within + wb.to(device) + (delta * weight[:, None]).T @ delta
        )
        self._means = ma + delta * (nb / safe_n)[:, None]
        self._counts = n
        self._n += total

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Feed a batch with its class labels ``target`` (shape ``[batch]``)."""
        x = _batch(value, "SharedCovariance")
        labels = _labels(target, x.shape[0], "SharedCovariance")
        self._check_features(x, "SharedCovariance")
        if x.shape[0] == 0:
            return
        flat = _flat(x)
        labels = labels.to(device=flat.device, dtype=torch.int64)
        if self.num_classes is not None:
            classes = self.num_classes
        else:  # one host sync: the class table grows to the largest label
            classes = int(labels.max()) + 1
            if self._counts is not None:
                classes = max(classes, self._counts.shape[0])
        nb = flat.new_zeros(classes).index_add_(0, labels, flat.new_ones(flat.shape[0]))
        sums = flat.new_zeros(classes, flat.shape[1]).index_add_(0, labels, flat)
        mb = sums / nb.clamp(min=1)[:, None]
        centred = flat - mb[labels]
        self._combine(nb, mb, centred.T @ centred, flat.shape[0])

    def merge(self, other: Self) -> None:
        """Absorb ``other`` (class by class, Chan's rule)."""
        self._check_peer(other)
        self._peer_shape(other, "SharedCovariance")
        if other._counts is None or other._means is None or other._within is None:
            return
        self._combine(
            other._counts.clone(), other._means.clone(), other._within.clone(), other._n
        )

    def result(self) -> SharedCovarianceResult:
        """Return counts, per-class means and the shared covariance."""
        if self._n == 0 or self._counts is None or self._means is None:
            msg = "SharedCovariance: no sample seen yet"
            raise ValueError(msg)
        assert self._within is not None  # noqa: S101 (set with the counts)
        seen = int((self._counts > 0).sum())
        dof = self._n - seen
        unbiased = (
            self._within / dof if dof > 0 else torch.full_like(self._within, math.nan)
        )
        return SharedCovarianceResult(
            count=self._n,
            class_counts=self._counts.round().to(torch.int64),
            means=self._means.clone(),
            cov=self._within / self._n,
            cov_unbiased=unbiased,
        )

    def state(self) -> dict[str, Tensor]:
        """Return the counts, ``feature_shape``, ``means`` and ``within``."""
        out = {"count": _count_tensor(self._n)}
        if self._shape is not None:
            out["feature_shape"] = _shape_tensor(self._shape)
        if (
            self._counts is not None
            and self._means is not None
            and self._within is not None
        ):
            out["class_counts"] = self._counts
            out["means"] = self._means
            out["within"] = self._within
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the state by ``state``."""
        self._reset()
        self._n = int(_get(state, "count", "SharedCovariance"))
        if "feature_shape" in state:
            self._shape = torch.Size(state["feature_shape"].tolist())
        if "class_counts" in state:
            self._counts = state["class_counts"].to(_F64)
            self._means = _get(state, "means", "SharedCovariance").to(_F64)
            self._within = _get(state, "within", "SharedCovariance").to(_F64)


class PerClass(_Base):
    """One reducer per class label: ``{label: reducer}``.

    Each batch is split by ``target`` (one host sync per update, to learn
    which labels are present) and each part fed to the reducer of its class,
    created on first sight with ``factory()``.

    Parameters
    ----------
    factory : callable or Reducer
        Makes an empty reducer (a class such as ``Moments``, or a
        ``lambda``); a reducer instance is used through its :meth:`fresh`.
    num_classes : int, optional
        If given, labels outside ``[0, num_classes)`` raise ``ValueError``.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments, PerClass
    >>> r = PerClass(Moments, num_classes=3)
    >>> r.update(torch.tensor([[1.0], [5.0], [3.0]]), torch.tensor([0, 2, 0]))
    >>> {c: res.mean.item() for c, res in r.result().items()}
    {0: 2.0, 2: 5.0}

    """

    def __init__(
        self, factory: Callable[[], Reducer] | Reducer, num_classes: int | None = None
    ) -> None:
        if isinstance(factory, Reducer) and not isinstance(factory, type):
            self._factory: Callable[[], Reducer] = factory.fresh
        elif callable(factory):
            self._factory = factory
        else:
            msg = f"PerClass needs a reducer factory, got {factory!r}"
            raise TypeError(msg)
        self.num_classes = num_classes
        self._reset()

    def _config(self) -> tuple[Any, ...]:
        return (self.num_classes,)

    def _reset(self) -> None:
        self._reducers: dict[int, Reducer] = {}

    @property
    def count(self) -> int:
        """Samples seen, all classes together."""
        return sum(r.count for r in self._reducers.values())

    @property
    def reducers(self) -> dict[int, Reducer]:
        """The reducer of each class seen, by label (a new dict)."""
        return dict(sorted(self._reducers.items()))

    def _reducer(self, label: int) -> Reducer:
        self._check_labels([label])
        if label not in self._reducers:
            self._reducers[label] = self._factory()
        return self._reducers[label]

    def _check_labels(self, labels: list[int]) -> None:
        for label in labels:
            if self.num_classes is not None and not 0 <= label < self.num_classes:
                msg = f"PerClass: label {label} is outside [0, {self.num_classes})"
                raise ValueError(msg)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Split the batch by ``target`` and feed each class's reducer."""
        x = _batch(value, "PerClass")
        labels = _labels(target, x.shape[0], "PerClass").to(x.device)
        if x.shape[0] == 0:
            return
        present, sizes = torch.unique(labels, sorted=True, return_counts=True)
        classes = [int(label) for label in present.tolist()]  # the host sync
        split = sizes.tolist()
        self._check_labels(classes)  # before any reducer is created or fed
        reducers = [self._reducer(label) for label in classes]
        order = torch.argsort(labels, stable=True)
        parts = torch.split(x[order], split)
        label_parts = torch.split(labels[order], split)
        for reducer, part, part_labels in zip(
            reducers, parts, label_parts, strict=True
        ):
            reducer.update(part, part_labels)

    def merge(self, other: Self) -> None:
        """Merge class by class; classes only ``other`` saw are added."""
        self._check_peer(other)
        for label, reducer in other._reducers.items():
            self._reducer(label).merge(reducer)

    def result(self) -> dict[int, Any]:
        """Return ``{label: result}`` for every class seen, by label."""
        return {label: r.result() for label, r in sorted(self._reducers.items())}

    def state(self) -> dict[str, Tensor]:
        """Return every class's state, keys prefixed by ``"<label>/"``."""
        return {
            f"{label}/{key}": value
            for label, reducer in sorted(self._reducers.items())
            for key, value in reducer.state().items()
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the per-class reducers by those in ``state``."""
        grouped: dict[int, dict[str, Tensor]] = {}
        for key, value in state.items():
            prefix, sep, rest = key.partition("/")
            if not sep:
                msg = f"PerClass.load_state: key {key!r} has no '<label>/' prefix"
                raise KeyError(msg)
            grouped.setdefault(int(prefix), {})[rest] = value
        self._reset()
        for label, sub in sorted(grouped.items()):
            self._reducer(label).load_state(sub)


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
    """``sum_i x_i x_i^T``, shape ``[F, F]``."""
    mean: Tensor
    """``sum / count``: the uncentred second-moment matrix."""


class Gram(_Base, _FeatureShape):
    """Uncentred second moments: ``sum_i x_i x_i^T`` over samples, with count.

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
        """Return count, sum and mean of ``x x^T``."""
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
    """Entrywise min and max over samples of per-sample feature-map Grams.

    A record ``[B, C, *spatial]`` gives, per sample, ``F = x.reshape(C, -1)``
    and the ``C x C`` Gram matrix of order ``p``::

        G_p = sign(F^p F^pT) * |F^p F^pT|^(1/p)      (powers entrywise)

    as in the Gram-matrix OoD detector of Sastry & Oore (2020), which keeps
    the row sums of ``F^p F^pT`` (``row_sums=True``: ``[C]`` per sample)
    before the ``1/p`` root. The result is the entrywise min and max over
    samples (use :class:`PerClass` for per-class bounds).

    Parameters
    ----------
    power : int, default 1
        The order ``p >= 1``.
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


class Concat(_Base, _FeatureShape):
    """Concatenate the records along dim 0, on the CPU.

    Each record is copied to the CPU at :meth:`update` (a host sync for GPU
    records); :attr:`nbytes` says how much is held, so a caller can decide to
    spill to disk. :meth:`merge` appends the other's rows after this one's.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Concat
    >>> r = Concat()
    >>> r.update(torch.tensor([[1, 2]]))
    >>> r.update(torch.tensor([[3, 4], [5, 6]]))
    >>> r.result(), r.count, r.nbytes
    (tensor([[1, 2],
            [3, 4],
            [5, 6]]), 3, 48)

    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._shape = None
        self._chunks: list[Tensor] = []

    @property
    def count(self) -> int:
        """Rows (samples) held."""
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes held on the CPU."""
        return sum(c.element_size() * c.numel() for c in self._chunks)

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (checked; target unused)
        """Copy the batch to the CPU and append it; ``target`` is ignored."""
        x = _batch(value, "Concat")
        self._check_features(x, "Concat")
        chunk = x.to("cpu", copy=True)
        self._chunks.append(chunk)
        self._n += chunk.shape[0]

    def merge(self, other: Self) -> None:
        """Append the rows of ``other``."""
        self._check_peer(other)
        self._peer_shape(other, "Concat")
        self._chunks.extend(other._chunks)
        self._n += other._n

    def result(self) -> Tensor:
        """Return all rows as one CPU tensor (a new tensor)."""
        if not self._chunks:
            msg = "Concat: no record seen yet"
            raise ValueError(msg)
        return torch.cat(self._chunks)

    def state(self) -> dict[str, Tensor]:
        """Return ``count`` and ``data`` (the concatenated rows)."""
        out = {"count": _count_tensor(self._n)}
        if self._chunks:
            out["data"] = self.result()
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the rows by ``state["data"]``."""
        self._reset()
        if "data" in state:
            data = state["data"].to("cpu")
            self._chunks = [data]
            self._n = data.shape[0]
            self._shape = data.shape[1:]


# ------------------------------------------------------------------- quantiles
def quantile_rank_bound(n: int, k: int) -> int:
    """Return the worst-case rank error of the :class:`Quantiles` sketch.

    After ``n`` values, every estimated rank (and the rank of every returned
    quantile) is within this many positions of the true one, whatever the
    values, their order, the batch sizes and the merges:

    ``sum_{h >= 0, k 2^h <= n} 2^h floor(n / (k 2^h))  <=  n (floor(log2(n/k)) + 1) / k``

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

    """  # noqa: E501 (a formula)
    bound, weight = 0, 1
    while k * weight <= n:
        bound += weight * (n // (k * weight))
        weight *= 2
    return bound


class Quantiles(_Base, _FeatureShape):
    """Quantiles over samples, per feature: exact, or a bounded-memory sketch.

    ``exact=True`` keeps every value and returns linearly interpolated
    quantiles (as :func:`torch.quantile`). ``exact=False`` keeps a
    deterministic mergeable compactor sketch per feature, vectorised over
    features: level ``h`` holds values of weight ``2^h``; new values enter
    level 0; when a level holds ``k`` values or more it is sorted and every
    other value moves up to level ``h + 1`` with doubled weight (an odd
    leftover, the largest, stays). The offset (keep the values at even or at
    odd positions) alternates at each compaction of a level, and starts at
    ``h mod 2``, so that successive errors tend to cancel. A quantile ``q``
    is the smallest retained value whose cumulated weight reaches ``q * n``.

    Rank guarantee of the sketch: each compaction at level ``h`` changes the
    weighted count of retained values below any threshold by at most
    ``2^h``; it consumes at least ``k`` values of weight ``2^h`` out of at
    most ``n / 2^h`` ever present at that level, so the rank error is at most
    ``sum_h 2^h floor(n / (k 2^h)) <= n (floor(log2(n/k)) + 1) / k``
    (:func:`quantile_rank_bound`; :attr:`rank_error_bound` is the tighter
    bound of the compactions actually done). The rank of a returned value
    ``y`` is then within that bound of ``q * n``: the true count of values
    below ``y`` is at most ``q n + bound``, of values up to ``y`` at least
    ``q n - bound``. Memory between updates: fewer than ``k`` values per
    level and at most ``floor(log2(n/k)) + 2`` levels per feature (a level
    compacts only if it received ``k`` values, i.e. ``k 2^h <= n``).

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
    each returned value's rank is within ``rank_error_bound`` of ``q * n``.

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
        """Proven bound on the rank error now: ``sum_h 2^h * compactions_h``."""
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
