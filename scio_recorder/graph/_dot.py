"""Graphviz output: DOT text (no dependency), and rendering (optional).

DOT is written by hand, so it needs nothing; rendering goes through the
``graphviz`` Python package (the ``graph`` extra) and Graphviz's ``dot``
program, both optional: a missing one raises an error that says how to
install it, and :func:`to_dot` keeps working.
"""

from __future__ import annotations

__all__ = ["INSTALL_DOT", "render_dot", "svg_of", "to_dot"]

import importlib
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scio_recorder._support.extras import INSTALL_DOT, install_hint

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ._nodes import Cluster, Edge, Node

INSTALL_PACKAGE = (
    "Rendering needs the `graphviz` Python package: "
    f"{install_hint('graph', 'graphviz')}, and Graphviz's `dot` program. "
    "`graph.to_dot()` works without it."
)
FORMATS = ("svg", "png", "pdf")

_STYLE = {
    "input": 'shape=ellipse, fillcolor="#e3ecfa"',
    "output": 'shape=ellipse, fillcolor="#e3ecfa"',
    "module": 'shape=box, fillcolor="#ffffff"',
    "function": 'shape=box, fillcolor="#f1f1f1", fontsize=10',
}
_RECORDED_FILL = "#ffd966"
_FAILED_FILL, _FAILED_LINE = "#f4a0a0", "#c00000"
_RECORDED = f'fillcolor="{_RECORDED_FILL}", penwidth=2'
_FAILED = f'fillcolor="{_FAILED_FILL}", color="{_FAILED_LINE}", penwidth=2'


def _legend(nodes: Sequence[Node], clusters: Sequence[Cluster]) -> list[str]:
    """Return the key to the highlights the picture uses (none for none).

    One plain node holding a table, a row per highlight present: "recorded"
    in the recorded fill (what the recorder's selection records), "failed"
    in red (the call the pass raised at). ``clusters``: those drawn.
    """
    rows = []
    marked: list[Node | Cluster] = [*nodes, *clusters]
    if any(item.recorded and not item.failed for item in marked):
        rows.append(
            f'<tr><td bgcolor="{_RECORDED_FILL}">recorded (by the selection)</td></tr>'
        )
    if any(item.failed for item in marked):
        rows.append(
            f'<tr><td bgcolor="{_FAILED_FILL}" color="{_FAILED_LINE}">'
            "failed (the pass raised here)</td></tr>"
        )
    if not rows:
        return []
    table = (
        '<table border="0" cellborder="1" cellspacing="2" cellpadding="4">'
        '<tr><td border="0"><b>legend</b></td></tr>' + "".join(rows) + "</table>"
    )
    return [f'  legend [shape=plaintext, style="", fontsize=10, label=<{table}>];']


_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _label_char(char: str) -> str:
    if char in _ENTITIES:
        return _ENTITIES[char]
    if char == "\\":
        return "\\\\"
    if char == '"':
        return '\\"'
    if char == "\n":
        return "\\n"
    if unicodedata.category(char) == "Cc":
        return f"&#{ord(char)};"  # a raw CR, TAB, ... would be reformatted
    return char


def _quote(text: str) -> str:
    r"""Return ``text`` as a quoted DOT string that Graphviz draws as ``text``.

    Graphviz reads a label in three steps, each undone here: the DOT lexer
    (``\"`` is a quote), the HTML entities of every label (``&amp;`` is
    ``&``, so a module named ``&amp;`` must be written ``&amp;amp;``; ``<``
    and ``>`` are written ``&lt;`` and ``&gt;`` too), and the label escapes
    (``\\`` is a backslash, ``\n`` a new line; ``\N``, ``\G``, ... would be
    replaced by the node's or graph's name). Line breaks of ``text`` become
    ``\n``; other control characters, numeric entities (``&#13;``).

    Examples
    --------
    >>> print(_quote('A<b> "&amp;" \\N'))
    "A&lt;b&gt; \"&amp;amp;\" \\N"

    """
    return '"' + "".join(map(_label_char, text)) + '"'


def _shape(shape: tuple[Any, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _node_line(index: int, node: Node) -> str:
    lines = [node.title() + (f" x{node.calls}" if node.calls > 1 else "")]
    lines += [_shape(s) for s in node.shapes[:3]]
    if len(node.shapes) > 3:  # noqa: PLR2004 (three shapes are enough to show)
        lines.append(f"... {len(node.shapes) - 3} more")
    style = _STYLE[node.kind]
    if node.failed:
        style += ", " + _FAILED
    elif node.recorded:
        style += ", " + _RECORDED
    return f"  n{index} [label={_quote(chr(10).join(lines))}, {style}];"


def to_dot(
    nodes: Sequence[Node],
    edges: Sequence[Edge],
    clusters: Mapping[str, Cluster],
    *,
    expand_nested: bool = False,
) -> str:
    """Return the graph of ``nodes``, ``edges`` (and ``clusters``) as DOT source."""
    out = [
        "digraph execution_graph {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11];',
        '  node [style="rounded,filled", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555"];',
    ]
    lines = {i: _node_line(i, node) for i, node in enumerate(nodes)}
    if expand_nested:
        out += _clusters(nodes, clusters, lines)
    else:
        out += list(lines.values())
    out += _legend(nodes, list(clusters.values()) if expand_nested else [])
    for edge in edges:
        out.append(
            f"  n{edge.source} -> n{edge.target} [label={_quote(_shape(edge.shape))}];"
        )
    out.append("}")
    return "\n".join(out) + "\n"


def _clusters(
    nodes: Sequence[Node], clusters: Mapping[str, Cluster], lines: dict[int, str]
) -> list[str]:
    """Node lines nested in ``subgraph cluster_*`` blocks, one per container."""
    members: dict[str | None, list[int]] = {}
    for index, node in enumerate(nodes):
        members.setdefault(node.scope[-1] if node.scope else None, []).append(index)
    children: dict[str | None, list[Cluster]] = {}
    for cluster in clusters.values():
        children.setdefault(cluster.parent, []).append(cluster)

    def block(key: str | None, indent: str) -> list[str]:
        out = [indent + lines[i].strip() for i in members.get(key, [])]
        for cluster in children.get(key, []):
            name = "cluster_" + "".join(c if c.isalnum() else "_" for c in cluster.key)
            color = '"#999999"'
            if cluster.failed:
                color = '"#c00000"; penwidth=2'
            elif cluster.recorded:
                color = '"#d4a000"; penwidth=2'
            out.append(f"{indent}subgraph {name} {{")
            out.append(
                f"{indent}  label={_quote(cluster.title())}; style=dashed; "
                f"color={color}; fontsize=10;"
            )
            out += block(cluster.key, indent + "  ")
            out.append(f"{indent}}}")
        return out

    return block(None, "  ")


def _graphviz() -> Any:
    try:
        return importlib.import_module("graphviz")
    except ImportError as error:
        raise RuntimeError(INSTALL_PACKAGE) from error


def _pipe(dot: str, fmt: str) -> bytes:
    graphviz = _graphviz()
    try:
        data: bytes = graphviz.Source(dot).pipe(format=fmt)
    except graphviz.ExecutableNotFound as error:
        raise RuntimeError(INSTALL_DOT) from error
    return data


def render_dot(dot: str, path: str | Path, fmt: str | None) -> Path:
    """Render ``dot`` to ``path``; the format is ``fmt`` or the file's suffix."""
    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        msg = (
            f"Cannot render to {fmt or 'a file without suffix'!r}: use a path "
            f"ending in .svg, .png or .pdf, or `format=` one of {FORMATS}; "
            "`to_dot()` gives the DOT source."
        )
        raise ValueError(msg)
    path.write_bytes(_pipe(dot, fmt))
    return path


def svg_of(dot: str) -> str | None:
    """Return the SVG of ``dot``, or ``None`` when rendering is not available."""
    try:
        return _pipe(dot, "svg").decode("utf-8")
    except RuntimeError:
        return None
