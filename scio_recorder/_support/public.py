"""The public import path of the library's own objects.

Classes are defined in private modules (``scio_recorder.reduce._moments``) and
re-exported by a public package (``scio_recorder.reduce``). They keep their
defining ``__module__``, so that ``inspect.getsource`` and tracebacks find
them; what is written to disk (type tags of saved results, checkpoint
fingerprints) names the public path instead, so that files stay readable when
code moves between private modules.
"""

from __future__ import annotations

__all__ = ["public_module"]

import sys


def public_module(obj: object) -> str:
    """Return the public module that exports ``obj`` (a class or function).

    Private trailing segments (``_name``) of ``obj.__module__`` are dropped
    while the parent package re-exports ``obj`` under its own name.

    Examples
    --------
    >>> from scio_recorder.reduce import Moments
    >>> Moments.__module__
    'scio_recorder.reduce._moments'
    >>> public_module(Moments)
    'scio_recorder.reduce'
    >>> public_module(int)
    'builtins'

    """
    module = str(getattr(obj, "__module__", None) or "?")
    name = getattr(obj, "__name__", None)
    parts = module.split(".")
    while len(parts) > 1 and parts[-1].startswith("_") and name is not None:
        parent = sys.modules.get(".".join(parts[:-1]))
        if parent is None or getattr(parent, name, None) is not obj:
            break
        parts.pop()
    return ".".join(parts)
