"""The self-check's report: one line per check, as a text or an HTML table.

:class:`CheckLine` is one check's verdict (PASS, WARN or FAIL), its largest
difference and what that is, where it is and its likely cause;
:class:`CheckReport` holds the lines in the order of :data:`CHECKS`, prints
as an aligned text table and shows as an HTML one in a notebook. The
wording every check's cause uses to name modules (:func:`named`) and a
check it could not run (:func:`skipped`) is here too, so that the lines
read alike.
"""

from __future__ import annotations

__all__ = [
    "CHECKS",
    "CheckLine",
    "CheckReport",
    "Status",
    "named",
    "named_plain",
    "raised",
    "skipped",
]

import dataclasses
import html
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from scio_recorder._support.render import free_table, html_table

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


CHECKS = ("recording", "batch", "determinism", "dtype", "inplace", "calls")
"""The checks' names, in the report's order."""


Status = Literal["PASS", "WARN", "FAIL"]


_COLUMNS = ("check", "result", "magnitude", "where", "likely cause")


@dataclasses.dataclass(frozen=True)
class CheckLine:
    """One check of a :class:`CheckReport`.

    Attributes
    ----------
    name : str
        One of :data:`CHECKS`.
    status : {"PASS", "WARN", "FAIL"}
        The verdict.
    magnitude : float or None
        The largest difference found (what ``measure`` says), ``None`` when
        nothing was measured.
    measure : str
        What ``magnitude`` is, e.g. ``"relative"`` (the largest absolute
        difference over the record's largest magnitude), ``"max |diff|"``,
        or ``"count"`` (of layers: the in-place check's, shown ``"1 layer"``).
    where : str
        Where the largest difference is: the layer, and the row.
    cause : str
        The likely cause, in words (or what passed).
    layers : mapping of str to float
        The magnitude per layer (label ``"depth-idx"``), where measured.
    """

    name: str
    status: Status
    magnitude: float | None
    measure: str
    where: str
    cause: str
    layers: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def cells(self) -> list[str]:
        """Return the line's cells, as the tables show them."""
        return [self.name, self.status, _shown(self), self.where or "-", self.cause]


def _shown(line: CheckLine) -> str:
    """Return a line's magnitude as the tables show it."""
    if line.magnitude is None:
        return "-"
    if line.measure == "count":  # of layers (the in-place check's)
        count = int(line.magnitude)
        return f"{count} layer" if count == 1 else f"{count} layers"
    if line.magnitude == 0:
        return "bit-equal"
    return f"{line.magnitude:.3g} {line.measure}"


class CheckReport(Mapping[str, CheckLine]):
    """What :func:`check` found: one :class:`CheckLine` per check.

    ``str(report)`` is a text table, ``report._repr_html_()`` an HTML one
    (what a notebook shows). The report is a read-only mapping of check
    name to line, in the order of :data:`CHECKS`: ``report["batch"]`` is
    one line, ``"batch" in report`` holds, ``list(report)`` are the names
    and ``report.items()`` the names with their lines.

    Attributes
    ----------
    lines : tuple of CheckLine
        The checks, in the order of :data:`CHECKS`.

    Examples
    --------
    >>> line = CheckLine("calls", "PASS", None, "", "", "as planned")
    >>> report = CheckReport([line])
    >>> "calls" in report, list(report), report["calls"].status
    (True, ['calls'], 'PASS')
    """

    def __init__(self, lines: Sequence[CheckLine]) -> None:
        self.lines = tuple(lines)

    @property
    def failed(self) -> tuple[str, ...]:
        """The names of the checks that failed."""
        return tuple(line.name for line in self.lines if line.status == "FAIL")

    @property
    def warned(self) -> tuple[str, ...]:
        """The names of the checks that warned."""
        return tuple(line.name for line in self.lines if line.status == "WARN")

    @property
    def passed(self) -> bool:
        """Whether no check failed."""
        return not self.failed

    def __getitem__(self, name: str) -> CheckLine:
        """Return the line of check ``name``."""
        for line in self.lines:
            if line.name == name:
                return line
        msg = f"No check named {name!r}: the checks are {', '.join(CHECKS)}."
        raise KeyError(msg)

    def __iter__(self) -> Iterator[str]:
        """Iterate over the checks' names, in the report's order."""
        return (line.name for line in self.lines)

    def __len__(self) -> int:
        """Return the number of checks."""
        return len(self.lines)

    def __str__(self) -> str:
        """Return the report as an aligned text table."""
        rows = [line.cells() for line in self.lines]
        return "\n".join(free_table(_COLUMNS, rows, rule=True))

    def __repr__(self) -> str:
        """Return a one-line summary."""
        found = ", ".join(f"{line.name} {line.status}" for line in self.lines)
        return f"CheckReport({found})"

    def _repr_html_(self) -> str:
        """Return the report as an HTML table (one row per check)."""
        table = html_table(
            list(_COLUMNS),
            [line.cells() for line in self.lines],
            highlight=[line.status != "PASS" for line in self.lines],
            caption="scio_recorder.check",
        )
        colours = {"PASS": "#1a7f37", "WARN": "#9a6700", "FAIL": "#cf222e"}
        for status, colour in colours.items():
            cell = f'<td style="text-align:left">{html.escape(status)}</td>'
            table = table.replace(
                cell,
                f'<td style="text-align:left;color:{colour};font-weight:bold">'
                f"{status}</td>",
            )
        return table


def skipped(name: str, why: str) -> CheckLine:
    """Return the line of a check that could not run, saying why (a WARN)."""
    return CheckLine(name, "WARN", None, "", "", f"not checked: {why}")


# -- how the causes name things ------------------------------------------------


def named(names: list[str]) -> str:
    """Name modules in code style, the first three and how many more."""
    return named_plain([f"`{name}`" for name in names])


def named_plain(names: list[str]) -> str:
    """Name things as given, the first three and how many more."""
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")  # noqa: PLR2004


def raised(error: BaseException) -> str:
    """Name an exception as a cause does: its type, and its message's first line."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__} ({first})"
