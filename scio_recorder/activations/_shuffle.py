"""The shuffle buffer: tokens leave in a random order, memory bounded.

Holds :class:`ShuffleBuffer`. Tokens arrive in chunks (one batch's kept
tokens: a dict of columns with the same number of rows). The first
``capacity`` tokens fill the buffer; after that, each arriving token takes
a slot drawn uniformly at random, and the token that held the slot leaves
(the shuffle buffer of ``tf.data`` and of ``torch``'s datapipes). At the
end, what the buffer holds leaves in a random permutation. The tokens that
leave are therefore a permutation of those that arrived, a token's delay
is geometric with mean ``capacity``, and a buffer larger than the whole set
gives a uniform permutation of it.

A chunk is handled at once, not token by token, with the same result as
the token-by-token loop: arriving tokens that draw the same slot form a
chain (the first pushes out the slot's old token, the next pushes out the
first, ...), found by a stable sort of the slots drawn. A chunk of ``n``
tokens costs ``O(n log n)`` plus a gather and a scatter of ``n`` rows per
column, whatever the capacity.

The random numbers come from one :class:`torch.Generator` whose state is
part of :meth:`ShuffleBuffer.state`, with the buffer's rows: a write
resumed from a checkpoint continues the same sequence.
"""

from __future__ import annotations

__all__ = ["RNG", "ShuffleBuffer"]

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Mapping

RNG = "rng"
"""The key of the generator's state in :meth:`ShuffleBuffer.state`."""


def _rows(columns: Mapping[str, Tensor]) -> int:
    return int(next(iter(columns.values())).shape[0])


class ShuffleBuffer:
    """Shuffle a stream of row chunks with at most ``capacity`` rows held.

    Examples
    --------
    >>> import torch
    >>> buffer = ShuffleBuffer(4, seed=0)
    >>> first = buffer.push({"x": torch.arange(3)})
    >>> second = buffer.push({"x": torch.arange(3, 10)})
    >>> out = torch.cat([first["x"], second["x"], buffer.flush()["x"]])
    >>> sorted(out.tolist()) == list(range(10)), len(first["x"]), len(second["x"])
    (True, 0, 6)

    """

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity = capacity
        self.generator = torch.Generator().manual_seed(seed)
        self.columns: dict[str, Tensor] = {}
        self.fill = 0

    def _grow(self, chunk: Mapping[str, Tensor], rows: int) -> None:
        """Make room for ``fill + rows`` rows (doubling, up to the capacity)."""
        need = self.fill + rows
        for name, value in chunk.items():
            held = self.columns.get(name)
            if held is not None and held.shape[0] >= need:
                continue
            size = min(
                self.capacity, max(need, 2 * (held.shape[0] if held is not None else 0))
            )
            grown = torch.empty((size, *value.shape[1:]), dtype=value.dtype)
            if held is not None:
                grown[: self.fill] = held[: self.fill]
            self.columns[name] = grown

    def push(self, chunk: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Take a chunk in; return the rows that leave (maybe none), in order."""
        rows = _rows(chunk)
        take = min(rows, self.capacity - self.fill)
        if take:
            self._grow(chunk, take)
            for name, value in chunk.items():
                self.columns[name][self.fill : self.fill + take] = value[:take]
            self.fill += take
        rest = rows - take
        if rest == 0:
            return {name: value[:0] for name, value in chunk.items()}
        slots = torch.randint(self.capacity, (rest,), generator=self.generator)
        order = torch.argsort(slots, stable=True)
        ranked = slots[order]
        same = ranked[1:] == ranked[:-1]
        first = torch.ones(rest, dtype=torch.bool)
        first[1:] = ~same
        last = torch.ones(rest, dtype=torch.bool)
        last[:-1] = ~same
        # The arrival that came before each one to its slot (ranked order),
        # and each arrival's own view of it (arrival order).
        before = torch.zeros(rest, dtype=torch.int64)
        before[1:] = order[:-1]
        is_first = torch.empty_like(first)
        is_first[order] = first
        previous = torch.empty_like(order)
        previous[order] = before
        from_buffer = is_first.nonzero().squeeze(1)
        from_chunk = (~is_first).nonzero().squeeze(1)
        settled = ranked[last]
        stays = order[last] + take
        out: dict[str, Tensor] = {}
        for name, value in chunk.items():
            held = self.columns[name]
            leaving = torch.empty((rest, *value.shape[1:]), dtype=value.dtype)
            leaving[from_buffer] = held[slots[from_buffer]]
            leaving[from_chunk] = value[previous[from_chunk] + take]
            held[settled] = value[stays]
            out[name] = leaving
        return out

    def flush(self) -> dict[str, Tensor]:
        """Return every row held, in a random order, and empty the buffer."""
        order = torch.randperm(self.fill, generator=self.generator)
        out = {name: held[: self.fill][order] for name, held in self.columns.items()}
        self.columns, self.fill = {}, 0
        return out

    def state(self) -> dict[str, Tensor]:
        """Return the rows held (one entry per column) and the generator's state."""
        out = {name: held[: self.fill] for name, held in self.columns.items()}
        out[RNG] = self.generator.get_state()
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Take the rows and the generator's state of :meth:`state` back."""
        self.generator.set_state(state[RNG])
        self.columns = {
            name: value.clone() for name, value in state.items() if name != RNG
        }
        self.fill = _rows(self.columns) if self.columns else 0
