"""Reducers that fold records across calls, and :class:`Count`.

The ``torchfunc``-style reductions of a recorder or a scope: keep every
record (:class:`Keep`), or fold records elementwise with
``acc = fn(acc, new)`` (:class:`Fold`, and the ready folds :class:`Sum`,
:class:`RecordMean`, :class:`Max`, :class:`Min`), the reducers
:func:`scio_recorder.reduce.make_reducer` builds from a name. :class:`Count`
sits with them: like :class:`Keep` it accepts any record, and it only counts
records (and their samples). Unlike the data-set statistics, these treat a
record as a whole, not as a batch of samples.

Import them from :mod:`scio_recorder.reduce`, their public home.
"""

from __future__ import annotations

__all__ = [
    "Count",
    "CountResult",
    "Fold",
    "Keep",
    "Max",
    "Min",
    "RecordMean",
    "Sum",
]

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._base import _F64, _Base, _clone, _count_tensor, _get

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from typing_extensions import Self


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
