"""Turn a reduction spec (a name, a fold function, a reducer) into a reducer."""

from __future__ import annotations

__all__ = ["REDUCTION_NAMES", "make_reducer"]

from typing import TYPE_CHECKING, Any

from ._base import Reducer
from ._folds import Fold, Keep, Max, Min, RecordMean, Sum

if TYPE_CHECKING:
    from collections.abc import Callable


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
