"""One record, several reducers: :class:`Tee`."""

from __future__ import annotations

__all__ = ["Tee"]

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor
    from typing_extensions import Self

    from ._base import Reducer


class Tee:
    """Feed every record to several reducers; the result is the tuple of theirs.

    Lets one pass over the data (one ``collect`` key per label) serve several
    consumers of the same layer, e.g. the class statistics of a Mahalanobis
    detector and the feature bank of a KNN detector.

    Parameters
    ----------
    *reducers : Reducer
        The reducers (at least one), fed in order.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments, MinMax, Tee
    >>> tee = Tee(Moments(), MinMax())
    >>> tee.update(torch.tensor([[1.0], [3.0]]))
    >>> moments, extremes = tee.result()
    >>> moments.mean.item(), extremes.max.item(), tee.count
    (2.0, 3.0, 2)

    """

    def __init__(self, *reducers: Reducer) -> None:
        """Keep the reducers."""
        if not reducers:
            msg = "Tee needs at least one reducer, e.g. Tee(Moments(), MinMax())"
            raise ValueError(msg)
        self.reducers = reducers

    @property
    def count(self) -> int:
        """Samples seen (by the first reducer)."""
        return self.reducers[0].count

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Feed ``value`` to every reducer."""
        for reducer in self.reducers:
            reducer.update(value, target)

    def merge(self, other: Self) -> None:
        """Merge reducer by reducer."""
        if len(other.reducers) != len(self.reducers):
            msg = "Tee.merge needs a Tee of as many reducers"
            raise ValueError(msg)
        for mine, theirs in zip(self.reducers, other.reducers, strict=True):
            mine.merge(theirs)

    def result(self) -> tuple[Any, ...]:
        """Return the tuple of the reducers' results."""
        return tuple(reducer.result() for reducer in self.reducers)

    def state(self) -> dict[str, Tensor]:
        """Return every reducer's state, keys prefixed ``"<i>/"``."""
        return {
            f"{i}/{key}": value
            for i, reducer in enumerate(self.reducers)
            for key, value in reducer.state().items()
        }

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Give each reducer its part of ``state``."""
        for i, reducer in enumerate(self.reducers):
            prefix = f"{i}/"
            reducer.load_state(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            )

    def fresh(self) -> Self:
        """Return a Tee of fresh reducers."""
        return type(self)(*(reducer.fresh() for reducer in self.reducers))

    def __repr__(self) -> str:
        """Show the reducers."""
        return f"Tee({', '.join(map(repr, self.reducers))})"
