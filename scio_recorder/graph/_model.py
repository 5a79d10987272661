"""The execution graph: nodes, edges, and views at a depth, rolled or not.

An :class:`ExecutionGraph` is a view of one captured pass
(:class:`~scio_recorder.graph._capture.Capture`): the capture holds every
module call and operation; a view picks which of them are nodes. Other views
of the same pass (:meth:`ExecutionGraph.at_depth`, :meth:`ExecutionGraph.rolled`)
are derived without running the net again.

The rule of a view at ``depth`` (``None``: no limit): a module call becomes a
node when it is a leaf (it called no submodule) at or above ``depth``, or a
call at ``depth`` (everything inside it folds into it, and it keeps its own
label); a call above ``depth`` that called submodules is not a node but a
*cluster* around its nodes. An operation becomes a node when no node of a
module call holds it. Every element's inputs become edges from the node that
holds their producer to the node that holds the element.
"""

from __future__ import annotations

__all__ = ["ExecutionGraph", "GraphError"]

import dataclasses
from typing import TYPE_CHECKING, Any

from scio_recorder.layers import label_str

from ._dot import render_dot, svg_of, to_dot
from ._nodes import Cluster, Edge, Node

if TYPE_CHECKING:
    from pathlib import Path

    from scio_recorder.layers import DepthIdx

    from ._capture import Capture, Shape, Source


class GraphError(RuntimeError):
    """The forward pass raised; :attr:`graph` holds the graph up to there.

    The node where it raised has ``failed=True``; the original exception is
    the ``__cause__``.
    """

    def __init__(self, message: str, graph: ExecutionGraph) -> None:
        """Keep ``graph`` with the message."""
        super().__init__(message)
        self.graph = graph


class ExecutionGraph:
    """The graph of one forward pass, at a depth; made by :meth:`Recorder.graph`.

    Attributes
    ----------
    nodes : tuple of Node
        In execution order: inputs first, outputs last.
    edges : tuple of Edge
        ``(source index, target index, shape)``, following the data flow.
    clusters : Mapping of str to Cluster
        The containers around nodes (drawn with ``expand_nested=True``).
    depth : int or None
        The depth of this view (``None``: down to the leaves).
    roll : bool
        Whether repeated calls of one module are one node.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> graph = Recorder(net, input_size=(1, 4)).graph()
    >>> [node.title() for node in graph.nodes]
    ['input', 'Linear (0): 1-1', 'ReLU (1): 1-2', 'Linear (2): 1-3', 'output']
    >>> graph.edges[0]
    Edge(source=0, target=1, shape=(1, 4))
    >>> [node.title() for node in graph.at_depth(0).nodes]
    ['input', 'Sequential: 0-1', 'output']

    """

    def __init__(
        self,
        capture: Capture,
        recorded: frozenset[DepthIdx],
        *,
        depth: int | None = None,
        roll: bool = False,
    ) -> None:
        """Make the view of ``capture`` at ``depth`` (see the module docstring)."""
        if depth is not None and (isinstance(depth, bool) or depth < 0):
            msg = f"depth must be None or an int >= 0, got {depth!r}"
            raise ValueError(msg)
        self._capture = capture
        self._recorded = recorded
        self.depth = depth
        self.roll = roll
        nodes, edges, clusters = _View(capture, recorded, depth).build()
        if roll:
            nodes, edges = _rolled(nodes, edges)
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.edges: tuple[Edge, ...] = tuple(edges)
        self.clusters: dict[str, Cluster] = clusters

    # -- other views -------------------------------------------------------
    def at_depth(self, depth: int | None) -> ExecutionGraph:
        """Return the view of the same pass at ``depth`` (the net is not run)."""
        return ExecutionGraph(
            self._capture, self._recorded, depth=depth, roll=self.roll
        )

    def rolled(self, roll: bool = True) -> ExecutionGraph:  # noqa: FBT001, FBT002 (a switch)
        """Return the view with repeated calls of a module as one node."""
        return ExecutionGraph(
            self._capture, self._recorded, depth=self.depth, roll=roll
        )

    # -- reading -----------------------------------------------------------
    @property
    def failed(self) -> Node | None:
        """The node where the pass raised, if it did and it is a node."""
        return next((node for node in self.nodes if node.failed), None)

    def predecessors(self, index: int) -> list[int]:
        """Return the indices of the nodes with an edge into node ``index``."""
        return sorted({e.source for e in self.edges if e.target == index})

    def __len__(self) -> int:
        """Return the number of nodes."""
        return len(self.nodes)

    def __repr__(self) -> str:
        """Summarise: node and edge counts, depth."""
        return (
            f"ExecutionGraph({len(self.nodes)} nodes, {len(self.edges)} edges, "
            f"depth={self.depth}{', rolled' if self.roll else ''})"
        )

    def __str__(self) -> str:
        """One line per node: index, words, output shapes, and where it reads."""
        lines = [repr(self)]
        for index, node in enumerate(self.nodes):
            shapes = ", ".join(_shape_str(s) for s in node.shapes)
            sources = ", ".join(map(str, self.predecessors(index)))
            flags = (" recorded" if node.recorded else "") + (
                " FAILED" if node.failed else ""
            )
            calls = f" x{node.calls}" if node.calls > 1 else ""
            lines.append(
                f"{index:>4}  {node.kind:<8} {node.title()}{calls}  {shapes}"
                f"{'  <- ' + sources if sources else ''}{flags}"
            )
        return "\n".join(lines)

    # -- drawing -----------------------------------------------------------
    def to_dot(self, *, expand_nested: bool = False) -> str:
        """Return the graph as Graphviz DOT source (no dependency needed).

        Module nodes show the table's words (``Linear (fc): 1-3``) and their
        output shapes; recorded nodes are highlighted, a failed one is red;
        edges carry shapes. With ``expand_nested`` containers are drawn as
        boxes (clusters) around the nodes they hold.
        """
        return to_dot(
            self.nodes, self.edges, self.clusters, expand_nested=expand_nested
        )

    def render(
        self,
        path: str | Path,
        *,
        format: str | None = None,  # noqa: A002 (graphviz's name)
        expand_nested: bool = False,
    ) -> Path:
        """Render to ``path`` (``.svg``, ``.png`` or ``.pdf``; or ``format``).

        Needs the ``graphviz`` Python package (``pip install
        'scio-recorder[graph]'``) and Graphviz's ``dot`` program; a missing
        one raises ``RuntimeError`` saying how to install it.
        """
        return render_dot(self.to_dot(expand_nested=expand_nested), path, format)

    def _repr_svg_(self) -> str | None:
        return svg_of(self.to_dot())

    def _repr_mimebundle_(self, **_: Any) -> dict[str, str]:
        bundle = {"text/plain": repr(self)}
        svg = svg_of(self.to_dot())
        if svg is not None:
            bundle["image/svg+xml"] = svg
        return bundle


def _shape_str(shape: Shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


class _View:
    """Builds the nodes and edges of one view of a capture."""

    def __init__(
        self, capture: Capture, recorded: frozenset[DepthIdx], depth: int | None
    ) -> None:
        self.capture = capture
        self.recorded = recorded
        self.depth = depth
        self.calls = capture.calls

    def chain(self, call: int | None) -> list[int]:
        """Return the calls from the root down to ``call``."""
        out: list[int] = []
        while call is not None:
            out.append(call)
            call = self.calls[call].parent
        return out[::-1]

    def holder(self, call: int | None) -> int | None:
        """Return the call whose node holds what happens inside ``call``."""
        for index in self.chain(call):
            c = self.calls[index]
            if c.leaf or (self.depth is not None and c.depth >= self.depth):
                return index
        return None

    def rep(self, source: Source) -> Source | None:
        kind, index = source
        if kind == "input":
            return source
        if kind == "call":
            holder = self.holder(index)
            return None if holder is None else ("call", holder)
        holder = self.holder(self.capture.ops[index].owner)
        return source if holder is None else ("call", holder)

    def build(self) -> tuple[list[Node], list[Edge], dict[str, Cluster]]:
        capture = self.capture
        nodes: list[Node] = [
            Node("input", name, shapes=(shape,)) for name, shape in capture.inputs
        ]
        position: dict[Source, int] = {("input", i): i for i in range(len(nodes))}
        self.position = position
        clusters: dict[str, Cluster] = {}
        for source in capture.order:
            if self.rep(source) != source:
                continue
            position[source] = len(nodes)
            nodes.append(self.node(source, clusters))
        self.mark_failed(nodes, position, clusters)
        edges: dict[Edge, None] = {}
        for source in capture.order:
            target = self.rep(source)
            if target is None:
                continue
            kind, index = source
            element = self.calls[index] if kind == "call" else capture.ops[index]
            for producer, shape in element.inputs:
                origin = self.rep(producer)
                if origin is not None and origin != target and origin in position:
                    edges[Edge(position[origin], position[target], shape)] = None
        for name, made_by, shape in capture.outputs:
            edges.update(dict.fromkeys(self.output_edges(made_by, len(nodes), shape)))
            nodes.append(Node("output", name, shapes=(shape,)))
        return nodes, list(edges), clusters

    def output_edges(
        self, producer: Source | None, index: int, shape: Shape
    ) -> list[Edge]:
        holder = None if producer is None else self.rep(producer)
        if holder is None or holder not in self.position:
            return []
        return [Edge(self.position[holder], index, shape)]

    def node(self, source: Source, clusters: dict[str, Cluster]) -> Node:
        kind, index = source
        if kind == "call":
            call = self.calls[index]
            scope = self.scope(call.parent, clusters)
            return Node(
                "module",
                call.name,
                call.label,
                call.shapes,
                recorded=call.label in self.recorded,
                type=call.type,
                scope=scope,
            )
        op = self.capture.ops[index]
        return Node(
            "function", op.name, shapes=op.shapes, scope=self.scope(op.owner, clusters)
        )

    def scope(self, call: int | None, clusters: dict[str, Cluster]) -> tuple[str, ...]:
        """Return the cluster keys around ``call``'s contents, making them."""
        keys: list[str] = []
        for index in self.chain(call)[1:]:  # the root is the whole picture
            c = self.calls[index]
            key = label_str(c.label) if c.label is not None else f"call{index}"
            if key not in clusters:
                clusters[key] = Cluster(
                    key,
                    c.label,
                    c.name,
                    c.type,
                    keys[-1] if keys else None,
                    recorded=c.label in self.recorded,
                )
            keys.append(key)
        return tuple(keys)

    def mark_failed(
        self,
        nodes: list[Node],
        position: dict[Source, int],
        clusters: dict[str, Cluster],
    ) -> None:
        """Mark the node (else the cluster) that holds the failing element."""
        source = self.capture.failed
        if source is None:
            return
        holder = self.rep(source)
        if holder is not None and holder in position:
            i = position[holder]
            nodes[i] = dataclasses.replace(nodes[i], failed=True)
            return
        kind, index = source
        call = index if kind == "call" else self.capture.ops[index].owner
        keys = self.scope(call, clusters) if call is not None else ()
        if keys:
            clusters[keys[-1]] = dataclasses.replace(clusters[keys[-1]], failed=True)


def _rolled(nodes: list[Node], edges: list[Edge]) -> tuple[list[Node], list[Edge]]:
    """Merge the module nodes of one module (same name and type) into one."""
    first: dict[tuple[str, str | None], int] = {}
    target: list[int] = []
    merged: list[Node] = []
    counts: list[int] = []
    for node in nodes:
        key = (node.name, node.type)
        if node.kind == "module" and key in first:
            target.append(first[key])
            counts[first[key]] += 1
            continue
        if node.kind == "module":
            first[key] = len(merged)
        target.append(len(merged))
        merged.append(node)
        counts.append(1)
    merged = [
        dataclasses.replace(
            node,
            calls=count,
            failed=node.failed
            or any(n.failed for n, t in zip(nodes, target, strict=True) if t == i),
            recorded=node.recorded
            or any(n.recorded for n, t in zip(nodes, target, strict=True) if t == i),
        )
        for i, (node, count) in enumerate(zip(merged, counts, strict=True))
    ]
    out: dict[Edge, None] = {}
    for edge in edges:
        out[Edge(target[edge.source], target[edge.target], edge.shape)] = None
    return merged, list(out)
