"""The layer table as a collapsible tree: shapes and parameters on hover."""

from __future__ import annotations

__all__ = ["layer_view"]

from typing import TYPE_CHECKING, Any

from scio_recorder.layers import as_table

from ._base import View, new_figure

if TYPE_CHECKING:
    from collections.abc import Iterable

    from matplotlib.figure import Figure

    from scio_recorder.layers import DepthIdx, Layer

_LINES = 400  # rows in the static picture, at most (its figure(most=))


def _parents(rows: tuple[Layer, ...]) -> list[int]:
    """Return each row's parent: the last row above it one level up (-1: none)."""
    last: dict[int, int] = {}
    parents = []
    for index, row in enumerate(rows):
        depth = row.label[0]
        parents.append(last.get(depth - 1, -1))
        last[depth] = index
        for deeper in [d for d in last if d > depth]:
            del last[deeper]
    return parents


def _size(size: list[Any]) -> str:
    """Return a shape as the view shows it: ``-`` for an empty one."""
    return str(size) if size else "-"


class _LayerView(View):
    kind = "layers"

    def figure(self, depth: int | None = None, most: int = _LINES) -> Figure:
        """Return the table as an indented list: every row to ``depth``.

        Parameters
        ----------
        depth : int, optional
            The deepest level drawn (0: the net alone); default all.
        most : int, default 400
            Rows drawn at most (a line then says how many are left).
        """
        rows = self.data["rows"]
        level: dict[int, int] = {}
        shown = []
        for index, row in enumerate(rows):
            parent = row[10]
            level[index] = 0 if parent < 0 else level[parent] + 1
            if depth is None or level[index] <= depth:
                shown.append(index)
        lines = []
        for index in shown[:most]:
            label, name, kind, *_, output, _, recordable, _, recorded, _ = rows[index]
            mark = "  [recorded]" if recorded else ""
            shape = f"  {output}" if recordable else ""
            lines.append(
                f"{'  ' * level[index]}{label}  {name or '(net)'}  {kind}{shape}{mark}"
            )
        if len(shown) > most:
            lines.append(f"... {len(shown) - most} more rows: figure(most=...)")
        hidden = len(rows) - len(shown)
        if hidden:
            lines.append(f"({hidden} deeper rows: figure(depth=...) or the HTML view)")
        line = 8 * 1.25 / 72  # inches a line of 8 pt text takes
        top = 0.45  # inches above the first line: the title's
        height = top + line * len(lines) + 0.15
        width = max(6.0, 0.6 + 8 * 0.6 / 72 * max(map(len, lines)))
        fig = new_figure(width, height)
        fig.set_layout_engine("none")
        fig.text(
            0.1 / width,
            1 - top / height,
            "\n".join(lines),
            family="monospace",
            fontsize=8,
            va="top",
            linespacing=1.25,
        )
        fig.text(0.1 / width, 1 - 0.12 / height, self.title, fontsize=10, va="top")
        return fig


def layer_view(
    net: Any,
    *,
    recorded: Iterable[DepthIdx] | None = None,
    open_depth: int = 1,
    title: str | None = None,
) -> View:
    """Return the layer table as a tree: collapsed, opened level by level.

    Each row is a module call of the reference pass (its label, name and
    type); hovering it shows its input and output shapes (``-`` for an
    empty one, as in the compact table: a structured output such as
    transformers' ``ModelOutput``, inputs passed by keyword, or a scalar),
    its parameters and whether it is recorded. Recorded rows are marked,
    and so is every row above them (how many are recorded inside). Rows
    below ``open_depth`` are drawn only when their parent is opened, so a
    net of thousands of modules gives a small page; "expand all",
    "collapse all" and "show recorded" (open the path to each recorded row)
    act on the whole tree.

    Parameters
    ----------
    net : Recorder or LayerTable
        A :class:`~scio_recorder.Recorder` (its table, and its
        :attr:`~scio_recorder.Recorder.recording` marked) or a
        :class:`~scio_recorder.LayerTable`.
    recorded : iterable of labels, optional
        The rows to mark; default what the recorder records (none for a
        table).
    open_depth : int, default 1
        Levels open at first (0: the net's row alone).
    title : str, optional
        Default the net's type and its row count.

    Returns
    -------
    View

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), input_size=(1, 3))
    >>> rnet.record((1, 1))
    >>> view = layer_view(rnet)
    >>> view.data["rows"][1]
    ['1-1', '0', 'Linear', 0, '[1, 3]', '[1, 4]', 16, 1, None, 1, 0]
    >>> view.title
    'Layers of Sequential (3 rows, 1 recorded)'

    """
    table = as_table(net, "`net`")
    marked = set(getattr(net, "recording", ()) if recorded is None else recorded)
    unknown = sorted(marked - set(table))
    if unknown:
        msg = f"layer_view: no row labelled {unknown} in the table; see print(rnet)"
        raise KeyError(msg)
    rows = table.rows
    parents = _parents(rows)
    data = {
        "rows": [
            [
                row.label_str,
                row.name,
                type(row.module).__name__,
                row.call_index,
                _size(row.input_size),
                _size(row.output_size),
                row.num_params,
                int(row.recordable),
                row.reason,
                int(row.label in marked),
                parent,
            ]
            for row, parent in zip(rows, parents, strict=True)
        ],
        "recorded": len(marked),
        "open": open_depth,
    }
    root = type(rows[0].module).__name__ if rows else "net"
    view = _LayerView(
        data,
        title=title or f"Layers of {root} ({len(rows)} rows, {len(marked)} recorded)",
    )
    view.height = 600
    return view
