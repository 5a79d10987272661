"""What every view shares: the page shell, its data, the static figure.

A view is data (JSON, embedded in the page) plus a script that draws it:
one HTML document, its style and scripts inline (``_static/*.css``,
``_static/*.js``), which loads nothing from the network. The shared script
(``_static/base.js``) gives the tooltip, the colour scales and a canvas heat
map; each view adds its own script, which reads the data from the element
``#sv-data``.

In Jupyter, :meth:`View._repr_html_` puts the document in an ``<iframe
srcdoc=...>``: its style cannot leak into the notebook, and two views on
one page keep their own scripts.
"""

from __future__ import annotations

__all__ = [
    "DIGITS",
    "View",
    "finite",
    "names",
    "not_empty",
    "one_sample",
    "rounded",
    "script_json",
    "short",
    "tick_labels",
]

import html
import importlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scio_recorder._support.extras import install_hint

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from matplotlib.figure import Figure
    from torch import Tensor

_STATIC = Path(__file__).resolve().parent / "_static"
DIGITS = 6
"""Significant digits kept of each number in a page (float32 holds about 7)."""

_FIGURES = (".png", ".svg", ".pdf")


def _static(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


def rounded(value: float, digits: int = DIGITS) -> float | None:
    """Return ``value`` to ``digits`` significant digits; ``None`` if not finite.

    JSON has no NaN nor infinity: the page shows them as missing.

    Examples
    --------
    >>> rounded(0.123456789), rounded(float("nan"))
    (0.123457, None)

    """
    if not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def script_json(data: Any) -> str:
    r"""Return ``data`` as JSON that is safe inside an HTML ``<script>`` element.

    The HTML parser reads a script's text before JSON does: ``</script>``
    would end the element, and ``<!--`` followed by ``<script>`` sends the
    parser into its "double escaped" state, where the page's own
    ``</script>`` no longer ends it (the page's script never runs). JSON
    may write any character as ``\uXXXX``: every ``<``, ``>`` and ``&`` is
    written so, and no markup can appear in the text at all.

    Raises
    ------
    ValueError
        For a number that is not finite (JSON has none: use
        :func:`rounded`).

    Examples
    --------
    >>> script_json({"token": "<!--<script>"})
    '{"token":"\\u003c!--\\u003cscript\\u003e"}'

    """
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def not_empty(shape: Sequence[int], axes: Sequence[str], who: str, what: str) -> None:
    """Refuse a ``shape`` with an axis of size 0, naming it and the shape.

    A page with nothing to draw would be blank, or its script would fail.

    Raises
    ------
    ValueError
        Naming the empty axes and the whole shape.

    Examples
    --------
    >>> not_empty([2, 3], ["layers", "positions"], "patching_view", "grid")
    >>> try:
    ...     not_empty([2, 0], ["layers", "positions"], "patching_view", "grid")
    ... except ValueError as error:
    ...     print(str(error).split(";")[0])
    patching_view: `grid` has no positions (its shape is [2, 0] for [layers, positions])

    """
    empty = [
        "samples" if axis == "batch" else axis
        for axis, size in zip(axes, shape, strict=True)
        if size == 0
    ]
    if empty:
        msg = (
            f"{who}: `{what}` has no {' and no '.join(empty)} (its shape is "
            f"{list(shape)} for [{', '.join(axes)}]); give at least one of each"
        )
        raise ValueError(msg)


def finite(values: Iterable[float], digits: int = DIGITS) -> list[float | None]:
    """Return :func:`rounded` of each value, as a list for JSON."""
    return [rounded(float(v), digits) for v in values]


def one_sample(
    values: Tensor, axes: Sequence[str], sample: int, who: str, what: str
) -> Tensor:
    """Return ``values`` without its batch axis: sample ``sample`` of a batch.

    ``axes`` names the batched shape's axes, one of them ``"batch"``;
    ``values`` (the argument ``what`` of ``who``) has them all (a batch:
    the sample is taken) or all but ``"batch"`` (one sample already).

    Raises
    ------
    ValueError
        Naming both shapes, for ``values`` of another number of dimensions;
        naming the shape, for ``values`` with an axis of size 0
        (:func:`not_empty`).
    IndexError
        Naming the batch's size, for a sample outside it.
    """
    dim = list(axes).index("batch")
    one = [axis for axis in axes if axis != "batch"]
    if values.dim() in {len(axes), len(one)}:
        not_empty(values.shape, axes if values.dim() == len(axes) else one, who, what)
    if values.dim() == len(axes):
        if not 0 <= sample < values.shape[dim]:
            msg = (
                f"{who}: sample={sample}, but the batch has {values.shape[dim]} "
                f"samples; pick one of 0 to {values.shape[dim] - 1}"
            )
            raise IndexError(msg)
        return values.select(dim, sample)
    if values.dim() != len(one):
        msg = (
            f"{who}: `{what}` must be [{', '.join(axes)}] or "
            f"[{', '.join(one)}]; got {list(values.shape)}"
        )
        raise ValueError(msg)
    return values


def names(given: Sequence[Any] | None, count: int, what: str, who: str) -> list[str]:
    """Return ``count`` names: ``given`` as text, or ``0 .. count - 1``."""
    if given is None:
        return [str(i) for i in range(count)]
    found = [str(name) for name in given]
    if len(found) != count:
        msg = f"{who}: {len(found)} {what} for {count}; give one per {what[:-1]}"
        raise ValueError(msg)
    return found


def matplotlib_module(module: str) -> Any:
    """Import ``matplotlib.<module>``, or say how to install matplotlib."""
    try:
        return importlib.import_module(f"matplotlib.{module}")
    except ImportError as error:
        msg = (
            "The static picture of a view needs matplotlib: "
            f"{install_hint('plot', 'matplotlib')}. The HTML needs nothing."
        )
        raise RuntimeError(msg) from error


def new_figure(width: float, height: float) -> Figure:
    """Return a new matplotlib figure (no global state: no ``pyplot``)."""
    figure: Figure = matplotlib_module("figure").Figure(
        figsize=(width, height), layout="constrained"
    )
    return figure


LABEL = 16
"""Characters of a token label kept in a static picture (the page has them all)."""


def short(label: str, width: int = LABEL) -> str:
    """Return ``label`` cut to ``width`` characters, ``…`` marking a cut.

    Examples
    --------
    >>> short("a label of forty characters, or about so", 12)
    'a label of …'

    """
    return label if len(label) <= width else label[: width - 1] + "…"


def tick_labels(labels: Sequence[str], inches: float, points: float) -> list[int]:
    """Return the positions of ``labels`` to draw along ``inches`` of an axis.

    Evenly spaced, every one when they fit: each takes ``1.4 * points``
    points across (its height, for labels at a right angle to the axis, with
    room between them), 72 points an inch.

    Examples
    --------
    >>> tick_labels([str(i) for i in range(512)], inches=8, points=7)[:4]
    [0, 9, 18, 27]
    >>> tick_labels(["a", "b"], inches=8, points=7)
    [0, 1]

    """
    room = max(1, int(inches * 72 / (1.4 * points)))
    step = max(1, math.ceil(len(labels) / room))
    return list(range(0, len(labels), step))


class View:
    """An interactive view: one self-contained HTML page and its static picture.

    Made by the functions of :mod:`scio_recorder.views`, not directly. The
    page holds its data, style and scripts: it works offline, saved to a
    file, in a notebook and in an exported notebook.

    Attributes
    ----------
    kind : str
        Which view: ``"attention"``, ``"lens"``, ``"patching"``,
        ``"layers"`` or ``"ood"``.
    title : str
        Shown above the view.
    data : dict
        What the page draws (JSON-ready: numbers rounded to six significant
        digits, histogram edges to as many as tell them apart, ``None`` for
        a value that is not finite).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.views import patching_view
    >>> view = patching_view(torch.tensor([[0.5, -1.0]]), layers=["1-1"])
    >>> view.kind, view.data["values"]
    ('patching', [[0.5, -1.0]])
    >>> page = view.html()
    >>> page.startswith("<!DOCTYPE html>"), "http" in page
    (True, False)

    """

    kind: str = "view"
    height: int = 400
    """The height, in pixels, of the frame :meth:`_repr_html_` shows it in."""

    def __init__(self, data: dict[str, Any], *, title: str) -> None:
        self.data = data
        self.title = title

    def __repr__(self) -> str:
        """Return ``<kind view: title>``."""
        return f"<{self.kind} view: {self.title}>"

    def html(self) -> str:
        """Return the page: one HTML document, its style and scripts inline."""
        payload = script_json(self.data)
        style = _static("base.css") + _static(f"{self.kind}.css")
        script = _static("base.js") + _static(f"{self.kind}.js")
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(self.title)}</title>\n"
            f"<style>{style}</style></head>\n"
            f'<body><div class="sv-view sv-{self.kind}">'
            f'<h1 class="sv-title">{html.escape(self.title)}</h1>'
            '<div id="sv-root"></div></div>\n'
            '<div id="sv-tip" class="sv-tip" hidden></div>\n'
            f'<script type="application/json" id="sv-data">{payload}</script>\n'
            f"<script>{script}</script>\n"
            "</body></html>\n"
        )

    def _repr_html_(self) -> str:
        """Return the page in a frame, for Jupyter (styles and scripts kept apart)."""
        return (
            f'<iframe srcdoc="{html.escape(self.html(), quote=True)}" '
            f'style="width: 100%; height: {self.height}px; border: 0" '
            f'title="{html.escape(self.title, quote=True)}"></iframe>'
        )

    def figure(self) -> Figure:
        """Return the static picture (matplotlib), for a paper."""
        raise NotImplementedError  # pragma: no cover (each view has its own)

    def save(self, path: str | Path) -> Path:
        """Write the page (``.html``) or the picture (``.png``, ``.svg``, ``.pdf``).

        Returns
        -------
        Path
            The file written.

        Raises
        ------
        ValueError
            For another suffix.
        """
        target = Path(path)
        suffix = target.suffix.lower()
        if suffix in {".html", ".htm"}:
            target.write_text(self.html(), encoding="utf-8")
        elif suffix in _FIGURES:
            self.figure().savefig(target, dpi=150)
        else:
            msg = (
                f"save({str(path)!r}): name an .html file (the interactive "
                f"page) or a {', '.join(_FIGURES)} file (the static picture)"
            )
            raise ValueError(msg)
        return target
