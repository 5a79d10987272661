"""The progress bar of a collect run: its title.

Holds :func:`bar_description`, the bar's title; the bar itself is
:func:`scio_recorder._support.progress.make_bar` (re-exported here with :class:`Bar`).
"""

from __future__ import annotations

__all__ = ["Bar", "bar_description", "make_bar"]

from typing import TYPE_CHECKING

from scio_recorder._support.progress import Bar, make_bar

from ._estimate import human

if TYPE_CHECKING:
    from ._estimate import Estimate


def bar_description(est: Estimate) -> str:
    """Return the progress bar's title: labels, and the bytes to keep."""
    n = len(est.labels)
    text = f"collect {n} label{'s' if n != 1 else ''}"
    if est.stored_total:
        text += f" ({human(est.stored_total)} to keep)"
    return text
