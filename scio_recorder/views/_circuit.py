"""A circuit as a graph: nodes by layer, edges weighted by their scores."""

from __future__ import annotations

__all__ = ["circuit_view"]

import re
from typing import TYPE_CHECKING, Any

from ._base import View, new_figure, rounded

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

_HEAD = re.compile(r"^a(\d+)\.h(\d+)(<[qkv]>)?$")
_MLP = re.compile(r"^m(\d+)$")


def _place(name: str, order: int) -> tuple[float, int]:
    """Return a node's column key and row: the authors' names by layer."""
    if name == "input":
        return (-1.0, 0)
    if name == "logits":
        return (float("inf"), 0)
    head = _HEAD.match(name)
    if head:
        return (2.0 * int(head.group(1)), int(head.group(2)))
    mlp = _MLP.match(name)
    if mlp:
        return (2.0 * int(mlp.group(1)) + 1, 0)
    return (float(order), 0)  # a named component: its own column, in order


def _node(name: str) -> str:
    """Return the node a destination belongs to (a head's, for its q/k/v)."""
    return name.split("<", 1)[0]


class _CircuitView(View):
    kind = "circuit"

    def figure(self) -> Figure:
        fig = new_figure(
            min(12, 2 + 1.2 * self.data["columns"]),
            min(8, 1.5 + 0.6 * self.data["rows"]),
        )
        ax = fig.add_subplot()
        nodes = self.data["nodes"]
        top = self.data["largest"] or 1.0
        for edge in self.data["edges"]:
            a, b = nodes[edge["from"]], nodes[edge["to"]]
            value = edge["value"] or 0.0
            ax.plot(
                [a["col"], b["col"]],
                [-a["row"], -b["row"]],
                color="#2166ac" if value >= 0 else "#b2182b",
                linewidth=0.5 + 5 * abs(value) / top,
                alpha=0.7,
            )
        ax.scatter(
            [n["col"] for n in nodes], [-n["row"] for n in nodes], s=120, color="#444"
        )
        for n in nodes:
            ax.annotate(
                n["name"],
                (n["col"], -n["row"]),
                fontsize=7,
                ha="center",
                va="bottom",
                xytext=(0, 6),
                textcoords="offset points",
            )
        ax.set_axis_off()
        ax.set_title(self.title, fontsize=10)
        return fig


def circuit_view(
    scores: Any,
    edges: Sequence[tuple[str, str]] | None = None,
    *,
    n: int = 40,
    title: str = "Circuit",
) -> View:
    """Return a circuit as a graph: nodes by layer, edges weighted by score.

    Columns are the graph's order (the input, each layer's heads, its MLP,
    the logits), a layer's heads one above the other; an edge's width is
    its absolute score, its colour the sign (blue positive, red negative);
    hovering an edge shows its source, destination (a head's ``<q>``,
    ``<k>`` or ``<v>``) and score, hovering a node its name.

    Parameters
    ----------
    scores : EdgeScores
        From :func:`~scio_recorder.explain.edge_attribution`.
    edges : sequence of (str, str), optional
        The circuit's edges; default the ``n`` of largest absolute score.
    n : int, default 40
        How many edges when ``edges`` is not given.
    title : str, default "Circuit"

    Returns
    -------
    View
        ``.html()``, ``.save("circuit.html")``, ``.figure()``,
        ``.save("circuit.png")``; shown in Jupyter.

    Raises
    ------
    KeyError
        An edge that is not in ``scores``.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.explain import EdgeScores
    >>> scores = EdgeScores(
    ...     torch.tensor([[0.5, -2.0]]), ["input"], ["a0.h1<q>", "logits"]
    ... )
    >>> view = circuit_view(scores)
    >>> [node["name"] for node in view.data["nodes"]]
    ['input', 'a0.h1', 'logits']
    >>> [(e["source"], e["destination"], e["value"]) for e in view.data["edges"]]
    [('input', 'logits', -2.0), ('input', 'a0.h1<q>', 0.5)]

    """
    chosen = list(scores.top(n) if edges is None else edges)
    values = [float(scores[u, v]) for u, v in chosen]
    names: list[str] = []
    for u, v in chosen:
        for name in (u, _node(v)):
            if name not in names:
                names.append(name)
    order = {name: i for i, name in enumerate([*scores.sources, *scores.destinations])}
    places = {name: _place(name, order.get(name, 0)) for name in names}
    columns = sorted({key for key, _ in places.values()})
    ordered = sorted(names, key=lambda name: places[name])
    nodes: list[dict[str, Any]] = [
        {"name": name, "col": columns.index(places[name][0]), "row": places[name][1]}
        for name in ordered
    ]
    rows = 1 + max((places[name][1] for name in ordered), default=0)
    where = {node["name"]: i for i, node in enumerate(nodes)}
    data: dict[str, Any] = {
        "nodes": nodes,
        "edges": [
            {
                "source": u,
                "destination": v,
                "from": where[u],
                "to": where[_node(v)],
                "value": rounded(value),
            }
            for (u, v), value in zip(chosen, values, strict=True)
        ],
        "largest": rounded(max((abs(v) for v in values), default=0.0)),
        "columns": len(columns),
        "rows": rows,
    }
    view = _CircuitView(data, title=title)
    view.height = min(900, 160 + 28 * len(columns) + 80 * rows)
    return view
