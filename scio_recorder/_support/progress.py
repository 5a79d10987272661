"""Progress bars (tqdm, on stderr), shown by default when stderr is a terminal.

Holds :func:`make_bar` and the :class:`Bar` protocol it returns.

Why: :func:`scio_recorder.collect.collect` (samples) and
:func:`scio_recorder.activations.write` (tokens) show the same kind of bar,
with the same default.
"""

from __future__ import annotations

__all__ = ["Bar", "make_bar"]

import sys
from typing import Any, Protocol

from tqdm import tqdm


class Bar(Protocol):
    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


def make_bar(
    *,
    progress: bool | None,
    total: int | None,
    initial: int,
    desc: str,
    unit: str = "sample",
) -> Bar | None:
    """Return a tqdm bar, or ``None`` (``progress=None``: if stderr is a terminal).

    Examples
    --------
    >>> make_bar(progress=False, total=10, initial=0, desc="x") is None
    True

    """
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    bar: Bar = tqdm(
        total=total,
        initial=initial,
        unit=unit,
        unit_scale=True,
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    return bar
