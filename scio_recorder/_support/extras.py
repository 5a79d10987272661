"""How to install what an optional extra brings, said once for every message.

``pip install 'scio-recorder[plot]'`` works once the package is on an index;
until then (and for anyone who installed from a wheel or a clone) the same
extra is spelled differently, and naming the underlying package always works.
"""

from __future__ import annotations

__all__ = ["INSTALL_DOT", "install_hint"]

INSTALL_DOT = (
    "Rendering needs Graphviz's `dot` program, which was not found: install it "
    "with `apt-get install graphviz`, `conda install graphviz` or `brew install "
    "graphviz`. `graph.to_dot()` works without it."
)
"""The message of a render without Graphviz's ``dot`` (a system program)."""


def install_hint(extra: str, packages: str) -> str:
    """Return how to install the extra ``extra``, which brings ``packages``.

    Examples
    --------
    >>> print(install_hint("plot", "matplotlib"))
    `pip install matplotlib` (the `plot` extra: `pip install 'scio-recorder[plot]'` from an index, `pip install -e '.[plot]'` from a clone, or `pip install 'scio_recorder-<version>-py3-none-any.whl[plot]'` from a wheel)

    """  # noqa: E501 (doctest output)
    return (
        f"`pip install {packages}` (the `{extra}` extra: "
        f"`pip install 'scio-recorder[{extra}]'` from an index, "
        f"`pip install -e '.[{extra}]'` from a clone, or "
        f"`pip install 'scio_recorder-<version>-py3-none-any.whl[{extra}]'` "
        "from a wheel)"
    )
