"""The progress bar of a collect run (tqdm, on stderr).

Holds :func:`make_bar`, which makes a tqdm bar when progress is asked for (by
default: when stderr is a terminal), and :func:`bar_description`, the bar's
title.
"""

from __future__ import annotations

__all__ = ["Bar", "bar_description", "make_bar"]

import sys
from typing import TYPE_CHECKING, Any, Protocol

from tqdm import tqdm

from ._estimate import human

if TYPE_CHECKING:
    from ._estimate import Estimate


class Bar(Protocol):
    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


def make_bar(
    *, progress: bool | None, total: int | None, initial: int, desc: str
) -> Bar | None:
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    bar: Bar = tqdm(
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
