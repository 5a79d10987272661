"""The progress bar of a collect run: tqdm when installed, else a text line.

Holds :func:`make_bar`, which picks tqdm or :class:`TextBar` (a line on
stderr every few seconds), and :func:`bar_description`, the bar's title.

Why: a run over a whole data set takes long enough to want progress, and
tqdm is an optional dependency.
"""

from __future__ import annotations

__all__ = ["Bar", "TextBar", "bar_description", "make_bar"]

import importlib
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

from ._estimate import human

if TYPE_CHECKING:
    from ._estimate import Estimate


class Bar(Protocol):
    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


class TextBar:
    """A progress line on stderr when tqdm is not installed."""

    def __init__(self, total: int | None, desc: str) -> None:
        self.total = total
        self.desc = desc
        self.n = 0
        self.start = time.monotonic()
        self.shown = self.start

    def update(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.shown >= 5.0:  # noqa: PLR2004 (seconds between lines)
            self.shown = now
            self._show(now)

    def _show(self, now: float) -> None:
        rate = self.n / max(now - self.start, 1e-9)
        total = f"/{self.total:,}" if self.total is not None else ""
        sys.stderr.write(
            f"{self.desc}: {self.n:,}{total} sample ({rate:.1f} sample/s)\n"
        )

    def close(self) -> None:
        self._show(time.monotonic())


def make_bar(
    *, progress: bool | None, total: int | None, initial: int, desc: str
) -> Bar | None:
    try:
        tqdm_module = importlib.import_module("tqdm")
    except ImportError:
        tqdm_module = None
    if progress is None:
        progress = tqdm_module is not None and sys.stderr.isatty()
    if not progress:
        return None
    if tqdm_module is None:
        return TextBar(total, desc)
    bar: Bar = tqdm_module.tqdm(
        total=total,
        initial=initial,
        unit="sample",
        unit_scale=True,
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    return bar


def bar_description(est: Estimate) -> str:
    """Return the progress bar's title: labels, and the bytes to keep."""
    n = len(est.labels)
    text = f"collect {n} label{'s' if n != 1 else ''}"
    if est.stored_total:
        text += f" ({human(est.stored_total)} to keep)"
    return text
