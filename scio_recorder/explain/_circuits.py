r"""The scores of a graph's edges, as a graph: circuits, thresholds, saving.

:class:`EdgeScores` (what :func:`~._edges.edge_attribution` returns): a
score for every edge ``u -> v``, its top edges or those above a threshold,
the circuit as a mask, saved in safetensors with the node names as JSON.
"""

from __future__ import annotations

__all__ = ["EdgeScores"]

import json
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path


class EdgeScores:
    """The scores of a graph's edges: ``scores[u, v]`` for the edge ``u -> v``.

    Attributes
    ----------
    values : Tensor
        ``[sources, destinations]``, float64; 0 where there is no edge
        (``v`` before ``u``).
    sources, destinations : list of str
        The rows' and columns' node names.
    real : Tensor
        ``[sources, destinations]``, bool: where an edge is.

    Examples
    --------
    >>> import torch
    >>> scores = EdgeScores(torch.ones(1, 1), ["input"], ["logits"])
    >>> float(scores["input", "logits"]), scores.nodes
    (1.0, ['input', 'logits'])

    """

    def __init__(
        self,
        values: Tensor,
        sources: list[str],
        destinations: list[str],
        real: Tensor | None = None,
        aliases: dict[str, str] | None = None,
    ) -> None:
        self.values = values
        self.sources = list(sources)
        self.destinations = list(destinations)
        self.real = torch.ones_like(values, dtype=torch.bool) if real is None else real
        self.aliases = dict(aliases or {})
        self._rows = {name: i for i, name in enumerate(self.sources)}
        self._cols = {name: i for i, name in enumerate(self.destinations)}

    @property
    def nodes(self) -> list[str]:
        """Every node's name: the sources, then the destinations not among them."""
        seen = dict.fromkeys(self.sources)
        for name in self.destinations:
            seen.setdefault(name, None)
        return list(seen)

    def index(self, u: str, v: str) -> tuple[int, int]:
        """Return the row and column of the edge ``u -> v``, or raise KeyError."""
        v = self.aliases.get(v, v)
        if u not in self._rows:
            msg = f"{u!r} is not a source node: the sources are {self.sources}."
            raise KeyError(msg)
        if v not in self._cols:
            hint = (
                f" (a head's inputs are {v}<q>, {v}<k> and {v}<v>)"
                if f"{v}<q>" in self._cols
                else ""
            )
            msg = (
                f"{v!r} is not a destination node{hint}: the destinations are "
                f"{self.destinations}."
            )
            raise KeyError(msg)
        row, col = self._rows[u], self._cols[v]
        if not self.real[row, col]:
            msg = f"there is no edge {u} -> {v}: {v} runs before {u}'s output exists."
            raise KeyError(msg)
        return row, col

    def __getitem__(self, edge: tuple[str, str]) -> Tensor:
        """Return the score of the edge ``edge = (u, v)``."""
        return self.values[self.index(*edge)]

    def edges(self) -> Iterator[tuple[str, str]]:
        """Yield every edge ``(u, v)``, sources in order, then destinations."""
        for i, u in enumerate(self.sources):
            for j, v in enumerate(self.destinations):
                if self.real[i, j]:
                    yield u, v

    def __len__(self) -> int:
        """Return the number of edges."""
        return int(self.real.sum())

    def top(self, n: int) -> list[tuple[str, str]]:
        """Return the ``n`` edges of largest absolute score, largest first.

        Ties keep the order of :meth:`edges`.

        Examples
        --------
        >>> import torch
        >>> scores = EdgeScores(torch.tensor([[1.0, -3.0]]), ["input"], ["a", "logits"])
        >>> scores.top(1)
        [('input', 'logits')]

        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            msg = f"EdgeScores.top: `n={n!r}` must be an int of at least 0."
            raise ValueError(msg)
        edges = list(self.edges())
        sizes = [abs(float(self[edge])) for edge in edges]
        order = sorted(range(len(edges)), key=lambda i: -sizes[i])
        return [edges[i] for i in order[:n]]

    def above(self, threshold: float) -> list[tuple[str, str]]:
        """Return the edges of absolute score at least ``threshold``, largest first.

        Examples
        --------
        >>> import torch
        >>> scores = EdgeScores(torch.tensor([[1.0, -3.0]]), ["input"], ["a", "logits"])
        >>> scores.above(0.5)
        [('input', 'logits'), ('input', 'a')]

        """
        edges = self.top(len(self))
        return [edge for edge in edges if abs(float(self[edge])) >= threshold]

    def mask(self, edges: Sequence[tuple[str, str]]) -> Tensor:
        """Return ``[sources, destinations]``, True at ``edges`` (a circuit)."""
        keep = torch.zeros_like(self.real)
        for u, v in edges:
            keep[self.index(u, v)] = True
        return keep

    def save(
        self, path: str | Path, circuit: Sequence[tuple[str, str]] | None = None
    ) -> None:
        """Write the graph to ``path`` (safetensors, node names in its JSON metadata).

        The scores (``values``), where edges are (``real``), and optionally a
        circuit's edges (``circuit``, a mask); :meth:`load` reads it back.

        Examples
        --------
        >>> import tempfile, pathlib, torch
        >>> scores = EdgeScores(torch.tensor([[1.0, -3.0]]), ["input"], ["a", "logits"])
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "graph.safetensors"
        >>> scores.save(path, circuit=[("input", "logits")])
        >>> again, circuit = EdgeScores.load(path)
        >>> torch.equal(again.values, scores.values), circuit
        (True, [('input', 'logits')])

        """
        from safetensors.torch import save_file  # noqa: PLC0415 (a dependency)

        tensors = {
            "values": self.values.detach().cpu().contiguous(),
            "real": self.real.cpu().contiguous(),
        }
        if circuit is not None:
            tensors["circuit"] = self.mask(circuit).cpu().contiguous()
        names = {
            "sources": self.sources,
            "destinations": self.destinations,
            "aliases": self.aliases,
        }
        save_file(tensors, str(path), metadata={"graph": json.dumps(names)})

    @classmethod
    def load(cls, path: str | Path) -> tuple[EdgeScores, list[tuple[str, str]] | None]:
        """Read a graph written by :meth:`save`: the scores, and the circuit or None.

        Raises
        ------
        ValueError
            If the file is not a graph written by :meth:`save`.

        Examples
        --------
        See :meth:`save`.

        """
        from safetensors import safe_open  # noqa: PLC0415 (a dependency)

        with safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
            if "graph" not in metadata or "values" not in file.keys():  # noqa: SIM118 (not a dict)
                msg = (
                    f"EdgeScores.load: {path} holds no graph (no 'graph' metadata or "
                    "'values' tensor): read a file written by EdgeScores.save."
                )
                raise ValueError(msg)
            tensors = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118
        names = json.loads(metadata["graph"])
        scores = cls(
            tensors["values"],
            names["sources"],
            names["destinations"],
            tensors["real"],
            names["aliases"],
        )
        circuit = None
        if "circuit" in tensors:
            circuit = [
                edge
                for edge in scores.edges()
                if tensors["circuit"][scores.index(*edge)]
            ]
        return scores, circuit

    def __repr__(self) -> str:
        """Describe the graph's size."""
        return (
            f"EdgeScores({len(self.sources)} sources, {len(self.destinations)} "
            f"destinations, {len(self)} edges)"
        )
