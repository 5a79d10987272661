"""The reducer that stores every sample: :class:`Concat`.

:class:`Concat` concatenates the records along dim 0 on the CPU (``"concat"``
in :func:`scio_recorder.collect.collect`); its memory grows with the data set,
and :attr:`Concat.nbytes` lets a caller decide to spill to disk. It is apart
from the streaming statistics because its job is to copy, not to summarise.

Import it from :mod:`scio_recorder.reduce`, its public home.
"""

from __future__ import annotations

__all__ = ["Concat"]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._base import _Base, _batch, _count_tensor, _FeatureShape

if TYPE_CHECKING:
    from collections.abc import Mapping

    from typing_extensions import Self


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
