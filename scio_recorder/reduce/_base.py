"""The :class:`Reducer` protocol, and the plumbing the built-in reducers share.

The protocol lives here, below every reducer module, so that a module that
checks against it (``_per_class``) and the public face that re-exports it
(:mod:`scio_recorder.reduce`) both import it from below: no import circle.

Every built-in reducer checks its records the same way (a tensor with a
batch dim, detached), stores counts and shapes in its :meth:`state` as int64
tensors, reads them back with the same error messages, and gets
:meth:`fresh`, peer checks for :meth:`merge` and ``repr`` from :class:`_Base`;
those with a per-sample feature shape track it with :class:`_FeatureShape`.
They live here, in one private module, so that the modules holding the
reducers (``_folds``, ``_moments``, ...)
share one implementation and import nothing from each other.
"""

from __future__ import annotations

__all__ = [
    "_F64",
    "Reducer",
    "_Base",
    "_FeatureShape",
    "_batch",
    "_clone",
    "_count_tensor",
    "_flat",
    "_get",
    "_labels",
    "_shape_tensor",
    "check_class_labels",
]

import copy
import math
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from typing_extensions import Self


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


_F64 = torch.float64


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


def check_class_labels(labels: Tensor, num_classes: int | None, who: str) -> None:
    """Raise unless every label is a class index: ``>= 0``, ``< num_classes``.

    One host read of the smallest and largest label; callers on an
    accelerator skip it (``collect`` checks targets on the CPU, before they
    are moved), so that ``update`` adds no host-device synchronisation.

    Examples
    --------
    >>> import torch
    >>> check_class_labels(torch.tensor([0, 4, 1]), 3, "PerClass")
    Traceback (most recent call last):
    ...
    ValueError: PerClass: class label 4 is outside [0, 3). Labels must be class indices in [0, num_classes): drop those samples, or pass a num_classes that covers every class.

    """  # noqa: E501 (doctest output)
    if labels.numel() == 0:
        return
    low, high = (int(v) for v in torch.stack([labels.min(), labels.max()]).tolist())
    if num_classes is not None and (low < 0 or high >= num_classes):
        bad = low if low < 0 else high
        msg = (
            f"{who}: class label {bad} is outside [0, {num_classes}). Labels must "
            "be class indices in [0, num_classes): drop those samples, or pass a "
            "num_classes that covers every class."
        )
        raise ValueError(msg)
    if low < 0:
        msg = (
            f"{who}: class label {low} is negative. Labels must be class indices "
            ">= 0: drop those samples (e.g. an ignore index such as -1), or map "
            "them to a class of their own."
        )
        raise ValueError(msg)


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
