"""Plain-text and HTML rendering of tables that must fit a width.

Helpers shared by :meth:`LayerTable.compact <scio_recorder.LayerTable.compact>`,
:meth:`LayerTable.to_html <scio_recorder.LayerTable.to_html>` and the
recorder's ``compact`` and ``_repr_html_``, the tables of numbers of the
OoD results and the benchmark (:func:`metric_table`), and the tables whose
last column runs free (:func:`free_table`: the layer table's text, the
self-check's report, collect's estimate): every text table of the library
is written here. Cells are plain strings, widths are
counted in characters (names of modules are expected to be narrow
characters, as Python identifiers are).
"""

from __future__ import annotations

__all__ = [
    "ELLIPSIS",
    "fit_widths",
    "free_table",
    "html_table",
    "metric_table",
    "middle_truncate",
    "min_width",
    "selection_marks",
    "text_table",
    "wrap",
]

import html
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Container, Sequence

ELLIPSIS = "\N{HORIZONTAL ELLIPSIS}"
"""What stands for the characters a truncated cell leaves out."""

SEPARATOR = "  "
"""Between two columns of a text table."""

MIN_FLEXIBLE = 6
"""The narrowest a truncatable column gets before the width is refused."""


def middle_truncate(text: str, width: int) -> str:
    """Return ``text`` cut to ``width`` characters, the middle replaced by an ellipsis.

    The start and the end of a qualified name say the most (``encoder`` ...
    ``dense``), so both are kept.

    Examples
    --------
    >>> middle_truncate("encoder.layer.0.attention.output.dense", 20)
    'encoder.la…put.dense'
    >>> middle_truncate("fc", 20)
    'fc'

    """
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    head = width // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def fit_widths(
    natural: Sequence[int], budget: int, stages: Sequence[Sequence[int]] | None = None
) -> list[int] | None:
    """Return column widths summing to at most ``budget``, or None if impossible.

    The columns of the first stage are narrowed first, the widest first to a
    common cap (water filling), so a column that already fits is never cut;
    the next stage is narrowed only once the earlier ones are at their
    floor: :data:`MIN_FLEXIBLE` characters (or the natural width, if
    smaller).

    Parameters
    ----------
    natural : sequence of int
        The widths the columns would like.
    budget : int
        The most their sum may be.
    stages : sequence of sequence of int, optional
        Indices into ``natural``, in the order to narrow them (default: all
        columns in one stage).

    Examples
    --------
    >>> fit_widths([30, 10, 8], 40)
    [22, 10, 8]
    >>> fit_widths([30, 10, 16], 40, stages=[[0, 1], [2]])
    [14, 10, 16]
    >>> fit_widths([30, 30, 30], 12) is None
    True

    """
    widths = list(natural)
    floors = [min(width, MIN_FLEXIBLE) for width in widths]
    if sum(floors) > budget:
        return None
    for stage in stages or [range(len(widths))]:
        if sum(widths) <= budget:
            break
        rest = sum(widths) - sum(widths[i] for i in stage)
        room = budget - rest
        cap = max(widths[i] for i in stage)
        while (
            cap > MIN_FLEXIBLE
            and sum(max(min(widths[i], cap), floors[i]) for i in stage) > room
        ):
            cap -= 1
        capped = [i for i in stage if widths[i] > cap]
        for i in stage:
            widths[i] = max(min(widths[i], cap), floors[i])
        spare = room - sum(widths[i] for i in stage)
        for i in capped:  # hand the rest out from the left
            if spare <= 0:
                break
            if widths[i] < natural[i]:
                widths[i] += 1
                spare -= 1
    return widths if sum(widths) <= budget else None


def text_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    flexible: Sequence[int | Sequence[int]],
    right: Sequence[int] = (),
) -> list[str] | None:
    r"""Return the lines of an aligned table at most ``width`` characters wide.

    Parameters
    ----------
    header : sequence of str
        The column titles.
    rows : sequence of sequence of str
        The cells, one sequence per row.
    width : int
        The most characters a line may have.
    flexible : sequence of int or of sequences of int
        The columns that may be narrowed (their cells cut in the middle); a
        sequence of groups narrows each group only once the groups before it
        are as narrow as they get (see :func:`fit_widths`).
    right : sequence of int
        The columns aligned right (numbers).

    Returns
    -------
    list of str or None
        A header line, a rule, then one line per row, trailing blanks
        stripped; None if the table cannot be made that narrow.

    Examples
    --------
    >>> lines = text_table(
    ...     ["name", "n"], [["a.long.name", "1,000"]], width=13, flexible=[0], right=[1]
    ... )
    >>> print("\n".join(lines))
    name        n
    ------  -----
    a.l…me  1,000

    """
    table = [list(header), *(list(row) for row in rows)]
    natural = _natural(table)
    stages = _stages(flexible)
    columns = [column for stage in stages for column in stage]
    fixed = sum(w for i, w in enumerate(natural) if i not in columns)
    budget = width - fixed - len(SEPARATOR) * (len(header) - 1)
    position = {column: index for index, column in enumerate(columns)}
    fitted = fit_widths(
        [natural[i] for i in columns],
        budget,
        [[position[column] for column in stage] for stage in stages],
    )
    if fitted is None:
        return None
    widths = list(natural)
    for index, column in enumerate(columns):
        widths[column] = fitted[index]

    def line(cells: Sequence[str]) -> str:
        cut = [middle_truncate(c, size) for c, size in zip(cells, widths, strict=True)]
        return _aligned(cut, widths, right)

    rule = SEPARATOR.join("-" * size for size in widths)
    return [line(table[0]), rule, *(line(row) for row in table[1:])]


def metric_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool = False
) -> list[str]:
    r"""Return the lines of a table of numbers: names in the first column, then values.

    Plain text: the columns aligned, the first to the left and the others
    (numbers) to the right, trailing blanks stripped, no rule; with
    ``markdown``, a Markdown table whose value columns are right-aligned.

    Examples
    --------
    >>> rows = [["MSP", "0.912"], ["Mahalanobis", "0.5"]]
    >>> print("\n".join(metric_table(["detector", "AUROC"], rows)))
    detector     AUROC
    MSP          0.912
    Mahalanobis    0.5
    >>> print("\n".join(metric_table(["detector", "AUROC"], rows[:1], markdown=True)))
    | detector | AUROC |
    |---|---:|
    | MSP | 0.912 |

    """
    table = [list(header), *(list(row) for row in rows)]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in table]
        return [lines[0], "|---|" + "---:|" * (len(header) - 1), *lines[1:]]
    widths = _natural(table)
    right = range(1, len(header))
    return [_aligned(row, widths, right) for row in table]


def free_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, rule: bool = False
) -> list[str]:
    r"""Return the lines of a left-aligned table whose last column runs free.

    Every column but the last is padded to its widest cell; the last (a
    shape, a note, a sentence) is written as it is; trailing blanks are
    stripped. With ``rule``, a line of dashes follows the header (under the
    last column, as long as its title).

    Examples
    --------
    >>> rows = [["1-1", "fc", "[1, 4]"], ["1-2", "act", "(never called)"]]
    >>> print("\n".join(free_table(["label", "name", "output"], rows, rule=True)))
    label  name  output
    -----  ----  ------
    1-1    fc    [1, 4]
    1-2    act   (never called)

    """
    table = [list(header), *(list(row) for row in rows)]
    widths = _natural([row[:-1] for row in table])
    lines = [
        SEPARATOR.join(
            [*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]
        ).rstrip()
        for row in table
    ]
    if rule:
        lines.insert(1, SEPARATOR.join("-" * w for w in [*widths, len(table[0][-1])]))
    return lines


def _aligned(cells: Sequence[str], widths: Sequence[int], right: Container[int]) -> str:
    """Join ``cells`` padded to ``widths`` (``right``: right-aligned), stripped."""
    out = [
        cell.rjust(size) if index in right else cell.ljust(size)
        for index, (cell, size) in enumerate(zip(cells, widths, strict=True))
    ]
    return SEPARATOR.join(out).rstrip()


def _stages(flexible: Sequence[int | Sequence[int]]) -> list[list[int]]:
    if all(isinstance(item, int) for item in flexible):
        return [[item for item in flexible if isinstance(item, int)]]
    return [[item] if isinstance(item, int) else list(item) for item in flexible]


def _natural(table: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in table) for i in range(len(table[0]))]


def min_width(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    flexible: Sequence[int | Sequence[int]],
) -> int:
    """Return the narrowest width :func:`text_table` can fit these cells into.

    Examples
    --------
    >>> min_width(["name", "n"], [["a.long.name", "1,000"]], [0])
    13

    """
    natural = _natural([header, *rows])
    columns = {column for stage in _stages(flexible) for column in stage}
    return sum(
        min(size, MIN_FLEXIBLE) if i in columns else size
        for i, size in enumerate(natural)
    ) + len(SEPARATOR) * (len(header) - 1)


def wrap(text: str, width: int) -> list[str]:
    """Return ``text`` as lines of at most ``width`` characters.

    Words longer than the width are broken.

    Examples
    --------
    >>> wrap("Total params: 1,234 (trainable 1,234)", 20)
    ['Total params: 1,234', '(trainable 1,234)']

    """
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def html_table(  # noqa: PLR0913 (keyword-only parts of one table)
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Sequence[int] = (),
    highlight: Sequence[bool] = (),
    caption: str = "",
    footer: Sequence[str] = (),
) -> str:
    r"""Return an HTML table; every cell is escaped.

    Parameters
    ----------
    header : sequence of str
        The column titles.
    rows : sequence of sequence of str
        The cells, one sequence per row.
    right : sequence of int
        The columns aligned right (numbers).
    highlight : sequence of bool
        Per row, whether to shade it (a recorded row).
    caption : str
        The table's caption.
    footer : sequence of str
        Lines under the table, each spanning every column.

    Examples
    --------
    >>> print(html_table(["a"], [["<x>"]], caption="c").replace("><", ">\n<"))
    <table>
    <caption>c</caption>
    <thead>
    <tr>
    <th style="text-align:left">a</th>
    </tr>
    </thead>
    <tbody>
    <tr>
    <td style="text-align:left">&lt;x&gt;</td>
    </tr>
    </tbody>
    </table>

    """

    def align(index: int) -> str:
        return "right" if index in right else "left"

    head = "".join(
        f'<th style="text-align:{align(i)}">{html.escape(title)}</th>'
        for i, title in enumerate(header)
    )
    body = []
    for position, row in enumerate(rows):
        shaded = position < len(highlight) and highlight[position]
        style = ' style="background-color:rgba(255,200,0,0.25)"' if shaded else ""
        cells = "".join(
            f'<td style="text-align:{align(i)}">{html.escape(cell)}</td>'
            for i, cell in enumerate(row)
        )
        body.append(f"<tr{style}>{cells}</tr>")
    parts = ["<table>"]
    if caption:
        parts.append(f"<caption>{html.escape(caption)}</caption>")
    parts.append(f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>")
    if footer:
        cell = f'<td colspan="{len(header)}" style="text-align:left">'
        lines = "".join(f"<tr>{cell}{html.escape(text)}</td></tr>" for text in footer)
        parts.append(f"<tfoot>{lines}</tfoot>")
    parts.append("</table>")
    return "".join(parts)


MARKS = (("o", "output"), ("i", "input"), ("g", "output gradient"))
"""The marks of a recorder's compact table, and what each one means."""


def selection_marks(
    outputs: Sequence[tuple[int, int]],
    inputs: Sequence[tuple[int, int]],
    grads: Sequence[tuple[int, int]],
    params: Sequence[str],
) -> tuple[dict[tuple[int, int], str], list[str]]:
    r"""Return the marks of a recorder's selection and the footer that explains them.

    Examples
    --------
    >>> marks, notes = selection_marks([(1, 1)], [(1, 1), (1, 2)], [], ["0.weight"])
    >>> marks
    {(1, 1): 'oi', (1, 2): 'i'}
    >>> print("\n".join(notes))
    Currently recording: outputs 1-1; inputs 1-1, 1-2 (rec: o output, i input)
    Also recording parameters: 0.weight

    """
    marks: dict[tuple[int, int], str] = {}
    used, recorded = [], []
    for (mark, meaning), labels in zip(MARKS, (outputs, inputs, grads), strict=True):
        if labels:
            used.append(f"{mark} {meaning}")
            recorded.append(f"{meaning}s {', '.join(f'{d}-{i}' for d, i in labels)}")
        for label in labels:
            marks[label] = marks.get(label, "") + mark
    notes = []
    if marks:
        notes.append(
            f"Currently recording: {'; '.join(recorded)} (rec: {', '.join(used)})"
        )
    if params:
        notes.append(f"Also recording parameters: {', '.join(params)}")
    return marks, notes
