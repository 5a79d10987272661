"""The patching grid as a heat map: layers x positions, hover shows the value."""

from __future__ import annotations

__all__ = ["patching_view"]

from typing import TYPE_CHECKING, Any

import torch

from ._base import (
    View,
    finite,
    matplotlib_module,
    names,
    new_figure,
    not_empty,
    short,
    tick_labels,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure
    from torch import Tensor


def matrix(values: Any, who: str, what: str) -> Tensor:
    """Return ``values`` as a float64 CPU tensor, or say what shape is expected."""
    tensor = torch.as_tensor(values).detach().to("cpu", torch.float64)
    if tensor.dim() != 2:  # noqa: PLR2004 (a grid)
        msg = f"{who}: `{what}` must be 2-D, got the shape {list(tensor.shape)}"
        raise ValueError(msg)
    return tensor


class _PatchingView(View):
    kind = "patching"

    def figure(self) -> Figure:
        values = torch.tensor(
            [
                [float("nan") if v is None else v for v in row]
                for row in self.data["values"]
            ]
        ).numpy()
        rows, cols = values.shape
        fig = new_figure(min(13, 4.0 + 0.3 * cols), min(10, 3.0 + 0.3 * rows))
        ax = fig.add_subplot()
        low, high = self.data["low"], self.data["high"]
        colors = matplotlib_module("colors")
        bound = max(-low, high) or 1.0  # centred on 0, whatever the signs
        norm = colors.Normalize(vmin=-bound, vmax=bound)
        image = ax.imshow(values, cmap="RdBu_r", norm=norm, aspect="auto")
        width, height = fig.get_size_inches()
        layers = [short(name) for name in self.data["layers"]]
        positions = [short(name) for name in self.data["positions"]]
        at_rows = tick_labels(layers, height - 2.2, 7)
        at_cols = tick_labels(positions, width - 3.5, 7)
        ax.set_yticks(at_rows, [layers[i] for i in at_rows], fontsize=7)
        ax.set_xticks(at_cols, [positions[j] for j in at_cols], rotation=90, fontsize=7)
        ax.set_xlabel("position")
        ax.set_ylabel("layer")
        ax.set_title(self.title, fontsize=10)
        fig.colorbar(image, ax=ax, label=self.data["metric"], shrink=0.8)
        return fig


def patching_view(
    grid: Tensor,
    *,
    layers: Sequence[Any] | None = None,
    positions: Sequence[Any] | None = None,
    metric: str = "metric",
    title: str = "Activation patching",
) -> View:
    """Return the heat map of a patching grid; hovering a cell shows its value.

    Values are drawn on a blue-white-red scale centred on 0 (white is 0,
    whatever the signs: a grid of one sign draws its lowest cell in colour
    unless it is 0), from minus to plus the largest magnitude.

    Parameters
    ----------
    grid : Tensor
        ``[layers, positions]``, e.g. from
        :func:`~scio_recorder.explain.patch_sweep` (or
        :func:`~scio_recorder.explain.attribution_patch`).
    layers : sequence, optional
        A name per row (the selectors given to ``patch_sweep``); default
        ``0, 1, ...``.
    positions : sequence, optional
        A name per column, e.g. the input's tokens; default ``0, 1, ...``.
    metric : str, default "metric"
        What a value is (shown on hover and on the colour bar).
    title : str, default "Activation patching"

    Returns
    -------
    View
        ``.html()``, ``.save("grid.html")``, ``.figure()``,
        ``.save("grid.png")``; shown in Jupyter.

    Examples
    --------
    >>> import torch
    >>> view = patching_view(
    ...     torch.tensor([[0.0, 1.0], [0.25, 0.5]]),
    ...     layers=["h.0", "h.1"],
    ...     positions=["The", " cat"],
    ...     metric="logit difference",
    ... )
    >>> view.data["layers"], view.data["low"], view.data["high"]
    (['h.0', 'h.1'], 0.0, 1.0)

    """
    values = matrix(grid, "patching_view", "grid")
    not_empty(values.shape, ["layers", "positions"], "patching_view", "grid")
    rows, cols = values.shape
    finite_values = values[values.isfinite()]
    low = float(finite_values.min()) if finite_values.numel() else 0.0
    high = float(finite_values.max()) if finite_values.numel() else 1.0
    data = {
        "values": [finite(row) for row in values.tolist()],
        "layers": names(layers, rows, "layers", "patching_view"),
        "positions": names(positions, cols, "positions", "patching_view"),
        "metric": metric,
        "low": low,
        "high": high,
    }
    view = _PatchingView(data, title=title)
    view.height = min(900, 200 + 40 * rows)
    return view
