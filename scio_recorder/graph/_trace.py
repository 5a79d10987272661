"""Run the capture and make the graph, or the error that carries it."""

from __future__ import annotations

__all__ = ["trace_graph"]

from typing import TYPE_CHECKING, Any

from scio_recorder._preserve import preserved

from ._capture import capture
from ._model import ExecutionGraph, GraphError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch import nn

    from scio_recorder.layers import DepthIdx, LayerTable


def trace_graph(  # noqa: PLR0913 (the graph's options)
    net: nn.Module,
    table: LayerTable,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    recorded: Iterable[DepthIdx] = (),
    depth: int | None = None,
    roll: bool = False,
) -> ExecutionGraph:
    """Run ``net(*args, **kwargs)`` once and return its execution graph.

    Prefer :meth:`Recorder.graph <scio_recorder.Recorder.graph>`, which
    passes the table and the selection.

    Raises
    ------
    GraphError
        If the pass raised: chained to that exception, with the graph up to
        the failing call in ``.graph``.
    """
    if depth is not None and (
        isinstance(depth, bool) or not isinstance(depth, int) or depth < 0
    ):
        msg = f"depth must be None or an int >= 0, got {depth!r}"
        raise ValueError(msg)
    with preserved(net):
        captured = capture(net, table, args, kwargs)
    graph = ExecutionGraph(captured, frozenset(recorded), depth=depth, roll=roll)
    error = captured.error
    if error is None:
        return graph
    failed = graph.failed
    where = f"at {failed.title()}" if failed is not None else "outside any module call"
    inputs = ", ".join(
        "[" + ", ".join(map(str, shape)) + "]"
        for index in (graph.predecessors(graph.nodes.index(failed)) if failed else [])
        for shape in graph.nodes[index].shapes[:1]
    )
    msg = (
        f"The forward pass raised {where}"
        + (f" (inputs from nodes of shapes {inputs})" if inputs else "")
        + f": {type(error).__name__}: {error}. The graph up to there is "
        "`error.graph`; its failed node has `failed=True`."
    )
    raise GraphError(msg, graph) from error
