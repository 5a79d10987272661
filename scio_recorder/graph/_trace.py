"""Run the capture and make the graph, or the error that carries it."""

from __future__ import annotations

__all__ = ["graph_of", "trace_graph"]

from typing import TYPE_CHECKING, Any

from scio_recorder._net.preserve import preserved

from ._capture import capture
from ._model import ExecutionGraph, GraphError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch import nn

    from scio_recorder.layers import DepthIdx, LayerTable


def trace_graph(  # noqa: PLR0913 (the graph's options)
    net: nn.Module,
    table: LayerTable | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    recorded: Iterable[DepthIdx] = (),
    depth: int | None = None,
    roll: bool = False,
) -> ExecutionGraph:
    """Run ``net(*args, **kwargs)`` once and return its execution graph.

    Prefer :meth:`Recorder.graph <scio_recorder.Recorder.graph>`, which
    passes the table and the selection, or :func:`graph_of` without a
    Recorder. With ``table=None`` the calls are labelled by this pass itself
    (see :func:`graph_of`).

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


def graph_of(
    net: nn.Module,
    *args: Any,
    depth: int | None = None,
    roll: bool = False,
    **kwargs: Any,
) -> ExecutionGraph:
    """Run ``net(*args, **kwargs)`` once and return its graph, without a Recorder.

    No table is built first (no torchinfo reference pass), so this also
    draws a net that fails on its first pass, where ``Recorder(net, ...)``
    itself raises: the :class:`GraphError` holds the graph up to the failing
    call. Module calls are labelled by this pass with the table's rule: a
    call's depth is its nesting depth (the net's own call is ``0-1``), its
    index its rank among the calls started at that depth; names are the
    qualified module names. The labels are those of ``Recorder(net,
    ...).table`` for the same input, except where the table numbers modules
    that never ran (a Recorder's table lists them too): use
    :meth:`Recorder.graph <scio_recorder.Recorder.graph>` when a Recorder
    exists, which also marks what it records. ``depth`` and ``roll`` are
    this function's own keywords; a forward taking arguments of those names
    needs :func:`trace_graph` (``trace_graph(net, None, args, kwargs)``).

    Parameters
    ----------
    net : nn.Module
        The network; run once, in its own mode, under the caller's grad mode.
    *args, **kwargs
        The forward's inputs.
    depth : int, optional
        Fold calls deeper than ``depth`` into their ancestor (default: none).
    roll : bool
        One node per repeated module.

    Returns
    -------
    ExecutionGraph
        The graph of the pass.

    Raises
    ------
    GraphError
        If the pass raised: chained to that exception, with the graph up to
        the failing call (``failed=True``) in ``.graph``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder.graph import GraphError, graph_of
    >>> net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(5, 2))
    >>> try:  # broken from the start: Recorder(net, input_size=(1, 4)) raises
    ...     graph_of(net, torch.ones(1, 4))
    ... except GraphError as error:
    ...     print([node.title() for node in error.graph.nodes])
    ...     print(error.graph.failed.title())
    ['input', 'Linear (0): 1-1', 'ReLU (1): 1-2', 'Linear (2): 1-3']
    Linear (2): 1-3

    """
    return trace_graph(net, None, args, kwargs, depth=depth, roll=roll)
