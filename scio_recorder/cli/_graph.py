"""``scio-recorder graph``: draw the execution graph of a model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from scio_recorder._support.errors import CLIError
from scio_recorder.layers import example_inputs

from ._model import _forward_error, _model

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from scio_recorder.graph import ExecutionGraph


def _graph(args: argparse.Namespace) -> int:
    """Draw the graph of one pass; no table is built first (:func:`graph_of`)."""
    from scio_recorder.graph import GraphError, trace_graph  # noqa: PLC0415 (when used)

    net, given = _model(args)
    call_args, call_kwargs = example_inputs(net, given.kwargs)
    try:
        with torch.no_grad():
            graph = trace_graph(
                net, None, call_args, call_kwargs, depth=args.depth, roll=args.roll
            )
    except GraphError as error:
        failed = error.graph.failed
        where = f" at {failed.title()}" if failed is not None else ""
        if args.output is None:
            print(error.graph)
            shown = "the graph up to there is printed above"
        else:
            written = args.output
            try:
                _write_graph(error.graph, args)
            except CLIError:  # cannot render: the DOT text still shows it
                written = args.output.with_suffix(".dot")
                dot = error.graph.to_dot(expand_nested=args.expand_nested)
                written.write_text(dot, encoding="utf-8")
            shown = (
                "the graph up to there (the failing call in red) was written to "
                f"{written}"
            )
        hint = _forward_error(error, given, where)
        msg = f"{hint}; {shown}"
        raise CLIError(msg) from error
    if args.output is None:
        print(graph)
        return 0
    _write_graph(graph, args)
    print(f"wrote {args.output} ({len(graph.nodes)} nodes, {len(graph.edges)} edges)")
    return 0


def _write_graph(graph: ExecutionGraph, args: argparse.Namespace) -> None:
    out: Path = args.output
    if out.suffix == ".dot":
        out.write_text(graph.to_dot(expand_nested=args.expand_nested), encoding="utf-8")
        return
    try:
        graph.render(out, expand_nested=args.expand_nested)
    except (RuntimeError, ValueError) as error:
        msg = f"{error} (or write -o graph.dot)"
        raise CLIError(msg) from error
