"""A reducer keeping every fit sample's features and class label: :class:`Bank`.

The neighbour detectors (:mod:`._neighbours`, :mod:`._jtla`) search a bank
of fit features; :class:`~scio_recorder.ood.MahalanobisEnsemble` keeps one
to calibrate p-values. Unlike ``collect``'s ``"concat"``, a bank keeps the
labels beside the rows, and holds them in memory (it is not spilled).
"""

from __future__ import annotations

__all__ = ["Bank"]

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from torch import Tensor

_F32, _I64 = torch.float32, torch.int64


class Bank:
    """A reducer keeping every sample's features (float32) and class label, on the CPU.

    ``fn`` maps a record to ``[batch, F]`` features (pooling; default:
    flatten each sample), kept in ``dtype``. :meth:`result` is ``(features
    [N, F], labels [N])`` (labels ``None`` when no target was given).

    Examples
    --------
    >>> import torch
    >>> bank = Bank()
    >>> bank.update(torch.ones(2, 3, 2), torch.tensor([0, 1]))
    >>> rows, labels = bank.result()
    >>> rows.shape, labels.tolist(), bank.count
    (torch.Size([2, 6]), [0, 1], 2)

    """

    def __init__(
        self, fn: Callable[[Tensor], Tensor] | None = None, dtype: torch.dtype = _F32
    ) -> None:
        """Start empty."""
        self.fn, self.dtype = fn, dtype
        self.rows: list[Tensor] = []
        self.labels: list[Tensor] = []

    @property
    def count(self) -> int:
        """Samples held."""
        return sum(r.shape[0] for r in self.rows)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Keep the batch's features and labels."""
        features = self.fn(value) if self.fn is not None else value
        features = features.detach().reshape(features.shape[0], -1)
        self.rows.append(features.to("cpu", self.dtype))
        if target is not None:
            self.labels.append(torch.as_tensor(target).detach().to("cpu", _I64))

    def merge(self, other: Bank) -> None:
        """Append the other's samples after this one's."""
        self.rows += other.rows
        self.labels += other.labels

    def result(self) -> tuple[Tensor, Tensor | None]:
        """Return the features ``[N, F]`` and the labels ``[N]`` (or ``None``)."""
        rows = torch.cat(self.rows) if self.rows else torch.zeros(0, 0)
        labels = torch.cat(self.labels).reshape(-1) if self.labels else None
        return rows, labels

    def state(self) -> dict[str, Tensor]:
        """Return the rows and labels."""
        rows, labels = self.result()
        return {"rows": rows} if labels is None else {"rows": rows, "labels": labels}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the rows and labels."""
        self.rows = [state["rows"]] if state["rows"].numel() else []
        self.labels = [state["labels"]] if "labels" in state else []

    def fresh(self) -> Bank:
        """Return an empty bank with the same ``fn`` and dtype."""
        return Bank(self.fn, self.dtype)
