"""Pictures of what was recorded and detected (matplotlib, the ``plot`` extra).

Each function takes data (an :class:`~scio_recorder.ood.Evaluation` or the
:class:`~scio_recorder.ood.OoDResults` of several OoD sets, heatmaps,
records) and returns a :class:`matplotlib.figure.Figure`; those
that draw one panel also take an ``ax`` to draw into. Nothing calls
``plt.show()`` and no global figure state is used, so the functions work
the same in scripts, notebooks and headless runs (``fig.savefig(path)``).

* :func:`score_histograms`: in- vs out-of-distribution scores per detector;
* :func:`roc_curves`: ROC curves of several detectors;
* :func:`gradcam_overlay`: Grad-CAM heatmaps over their images;
* :func:`activation_histograms`: the value distribution of recorded layers;
* :func:`feature_maps`: a grid of a convolutional layer's feature maps.
"""

from __future__ import annotations

__all__ = [
    "activation_histograms",
    "feature_maps",
    "gradcam_overlay",
    "roc_curves",
    "score_histograms",
]

import importlib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ._extras import install_hint
from .ood import Evaluation
from .ood.metrics import roc_curve

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from torch import Tensor

    from .ood import OoDResults

    Evaluations = Evaluation | OoDResults | Mapping[str, Evaluation]

INSTALL = f"Plots need matplotlib: {install_hint('plot', 'matplotlib')}."


def _figure(*args: Any, **kwargs: Any) -> Figure:
    try:
        module = importlib.import_module("matplotlib.figure")
    except ImportError as error:
        raise RuntimeError(INSTALL) from error
    figure: Figure = module.Figure(*args, **kwargs)
    return figure


def _grid(n: int, *, columns: int, size: float = 2.6) -> tuple[Figure, list[Axes]]:
    cols = max(1, min(columns, n))
    rows = max(1, math.ceil(n / cols))
    fig = _figure(figsize=(size * cols, size * rows), layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
    return fig, axes


def _numpy(values: Tensor) -> Any:
    return values.detach().to("cpu", torch.float64).numpy()


def _names(evaluation: Evaluation, detectors: Sequence[str] | None) -> list[str]:
    names = list(evaluation) if detectors is None else list(detectors)
    unknown = [name for name in names if name not in evaluation]
    if unknown:
        msg = (
            f"no detector named {unknown} in the evaluation; it has {list(evaluation)}"
        )
        raise KeyError(msg)
    return names


def _evaluations(
    evaluation: Evaluations, sets: Sequence[str] | None
) -> list[Evaluation]:
    """Return the :class:`Evaluation` of each set to draw, in order."""
    if isinstance(evaluation, Evaluation):
        if sets is not None and list(sets) != [evaluation.name]:
            msg = (
                f"sets={list(sets)}: this Evaluation holds one OoD set, "
                f"{evaluation.name!r}; drop `sets=`."
            )
            raise KeyError(msg)
        return [evaluation]
    if not isinstance(evaluation, Mapping) or not all(
        isinstance(v, Evaluation) for v in evaluation.values()
    ):
        msg = (
            f"expected an Evaluation or OoDResults from `evaluate`, got a "
            f"{type(evaluation).__name__}"
        )
        raise TypeError(msg)
    names = list(evaluation) if sets is None else list(sets)
    unknown = [name for name in names if name not in evaluation]
    if unknown or not names:
        msg = f"no OoD set named {unknown} in the results; they have {list(evaluation)}"
        raise KeyError(msg)
    found: Mapping[str, Evaluation] = evaluation  # type: ignore[assignment]
    return [found[name] for name in names]


def score_histograms(
    evaluation: Evaluations,
    detectors: Sequence[str] | None = None,
    *,
    sets: Sequence[str] | None = None,
    bins: int = 40,
    columns: int = 4,
) -> Figure:
    """Draw each detector's in- and out-of-distribution score histograms.

    Parameters
    ----------
    evaluation : Evaluation or OoDResults
        From :func:`~scio_recorder.ood.evaluate` (it keeps the scores); for
        several OoD sets, one row of panels per set.
    detectors : sequence of str, optional
        Which ones, in order; default all.
    sets : sequence of str, optional
        Which OoD sets of an :class:`~scio_recorder.ood.OoDResults`, in
        order; default all.
    bins : int, default 40
        Histogram bins (shared by both sets of a panel).
    columns : int, default 4
        Panels per row (one OoD set); with several sets, a row per set.

    Returns
    -------
    Figure
        One panel per detector (and set), titled with its AUROC.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import Evaluation
    >>> scores = torch.linspace(0, 1, 50)
    >>> ev = Evaluation({"a": scores}, {"a": scores + 0.5})
    >>> fig = score_histograms(ev)
    >>> [ax.get_title() for ax in fig.axes]
    ['a (AUROC 0.87)']

    """
    evaluations = _evaluations(evaluation, sets)
    names = _names(evaluations[0], detectors)
    several = len(evaluations) > 1
    count = len(names) * len(evaluations)
    fig, axes = _grid(count, columns=len(names) if several else columns)
    panels = [(ev, name) for ev in evaluations for name in names]
    for ax, (ev, name) in zip(axes, panels, strict=True):
        inside = _numpy(ev.id_scores[name])
        outside = _numpy(ev.ood_scores[name])
        low = min(inside.min(), outside.min())
        high = max(inside.max(), outside.max())
        edges = torch.linspace(low, high if high > low else low + 1, bins + 1).tolist()
        ax.hist(inside, bins=edges, alpha=0.6, density=True, label="in-distribution")
        ax.hist(outside, bins=edges, alpha=0.6, density=True, label=ev.name)
        where = f" vs {ev.name}" if several else ""
        ax.set_title(f"{name}{where} (AUROC {ev[name]['AUROC']:.2f})")
        ax.set_xlabel("score (higher: more OoD)")
        ax.set_yticks([])
    if axes:
        for i in range(0, len(axes), len(names) if several else len(axes)):
            axes[i].legend(fontsize=8)
    return fig


def roc_curves(
    evaluation: Evaluations,
    detectors: Sequence[str] | None = None,
    *,
    sets: Sequence[str] | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Draw the ROC curves (OoD positive) of several detectors, a panel per set.

    Parameters
    ----------
    evaluation : Evaluation or OoDResults
        From :func:`~scio_recorder.ood.evaluate`.
    detectors : sequence of str, optional
        Which ones, in order; default all.
    sets : sequence of str, optional
        Which OoD sets of an :class:`~scio_recorder.ood.OoDResults`; default
        all, one panel each.
    ax : Axes, optional
        Draw into it (one OoD set only).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import Evaluation
    >>> scores = torch.linspace(0, 1, 50)
    >>> ev = Evaluation({"a": scores}, {"a": scores + 0.5})
    >>> fig = roc_curves(ev)
    >>> len(fig.axes[0].lines)  # one curve and the chance line
    2

    """
    evaluations = _evaluations(evaluation, sets)
    names = _names(evaluations[0], detectors)
    if ax is not None:
        if len(evaluations) > 1:
            msg = (
                f"roc_curves: one `ax` cannot hold the {len(evaluations)} OoD "
                f"sets {[ev.name for ev in evaluations]}; pick one with "
                "`sets=[name]`, or drop `ax` (a panel per set)."
            )
            raise ValueError(msg)
        fig = ax.get_figure()
        axes = [ax]
    else:
        fig, axes = _grid(len(evaluations), columns=3, size=4.3)
    for panel, ev in zip(axes, evaluations, strict=True):
        for name in names:
            fpr, tpr = roc_curve(ev.id_scores[name], ev.ood_scores[name])
            panel.plot(fpr, tpr, label=f"{name} ({ev[name]['AUROC']:.2f})")
        panel.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        panel.set_xlabel("false positive rate (in-distribution flagged)")
        panel.set_ylabel(f"true positive rate ({ev.name} flagged)")
        panel.set_title(f"ROC, {ev.name}")
        panel.legend(fontsize=7, loc="lower right")
    return fig  # type: ignore[return-value]


def _image(x: Tensor) -> Any:
    """``[C, H, W]`` -> an ``[H, W, 3]`` array in [0, 1] for imshow."""
    x = x.detach().to("cpu", torch.float64)
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    x = x[:3].permute(1, 2, 0)
    low, high = x.min(), x.max()
    return ((x - low) / (high - low if high > low else 1)).numpy()


def gradcam_overlay(
    images: Tensor,
    cams: Tensor,
    *,
    titles: Sequence[str] | None = None,
    alpha: float = 0.5,
    columns: int = 4,
) -> Figure:
    """Draw Grad-CAM heatmaps over their images.

    Parameters
    ----------
    images : Tensor
        ``[B, C, H, W]`` (shown min-max scaled).
    cams : Tensor
        ``[B, H, W]`` from :func:`~scio_recorder.explain.grad_cam`.
    titles : sequence of str, optional
        One per image.
    alpha : float, default 0.5
        Opacity of the heatmap.
    columns : int, default 4
        Images per row.

    Examples
    --------
    >>> import torch
    >>> fig = gradcam_overlay(torch.rand(2, 3, 8, 8), torch.rand(2, 8, 8))
    >>> len(fig.axes), len(fig.axes[0].images)
    (2, 2)

    """
    if images.shape[0] != cams.shape[0] or images.shape[-2:] != cams.shape[-2:]:
        msg = (
            f"gradcam_overlay: images {list(images.shape)} and cams "
            f"{list(cams.shape)} must share the batch and the height x width "
            "(use grad_cam(..., upsample=True))."
        )
        raise ValueError(msg)
    fig, axes = _grid(images.shape[0], columns=columns, size=2.2)
    for i, ax in enumerate(axes):
        ax.imshow(_image(images[i]))
        ax.imshow(_numpy(cams[i]), cmap="jet", alpha=alpha, vmin=0, vmax=1)
        ax.set_axis_off()
        if titles is not None:
            ax.set_title(titles[i], fontsize=9)
    return fig


def activation_histograms(
    records: Mapping[Any, Tensor],
    *,
    bins: int = 50,
    columns: int = 4,
) -> Figure:
    """Draw the distribution of values of each recorded layer.

    Parameters
    ----------
    records : Mapping
        Label (or name) -> tensor, e.g. ``rnet.activations``.

    Examples
    --------
    >>> import torch
    >>> fig = activation_histograms(
    ...     {(1, 1): torch.randn(8, 4), (1, 2): torch.rand(8, 4)}
    ... )
    >>> [ax.get_title() for ax in fig.axes]
    ['1-1', '1-2']

    """
    items = [(k, v) for k, v in records.items() if isinstance(v, torch.Tensor)]
    if not items:
        msg = "activation_histograms: no tensor among the records; record a layer first"
        raise ValueError(msg)
    fig, axes = _grid(len(items), columns=columns)
    for ax, (key, values) in zip(axes, items, strict=True):
        ax.hist(_numpy(values).reshape(-1), bins=bins)
        ax.set_title(f"{key[0]}-{key[1]}" if isinstance(key, tuple) else str(key))
        ax.set_yticks([])
    return fig


def feature_maps(
    maps: Tensor,
    *,
    max_maps: int = 16,
    columns: int = 8,
    title: str | None = None,
) -> Figure:
    """Draw a grid of a convolutional layer's feature maps (one sample).

    Parameters
    ----------
    maps : Tensor
        ``[C, H, W]``, or ``[1, C, H, W]``.
    max_maps : int, default 16
        The first channels shown.

    Examples
    --------
    >>> import torch
    >>> len(feature_maps(torch.rand(1, 6, 5, 5)).axes)
    6

    """
    if maps.dim() == 4 and maps.shape[0] == 1:  # noqa: PLR2004 (one sample)
        maps = maps[0]
    if maps.dim() != 3:  # noqa: PLR2004 ([C, H, W])
        msg = f"feature_maps takes [C, H, W] (or [1, C, H, W]), got {list(maps.shape)}"
        raise ValueError(msg)
    count = min(max_maps, maps.shape[0])
    fig, axes = _grid(count, columns=columns, size=1.4)
    for channel, ax in enumerate(axes):
        ax.imshow(_numpy(maps[channel]), cmap="viridis")
        ax.set_axis_off()
        ax.set_title(str(channel), fontsize=7)
    if title is not None:
        fig.suptitle(title)
    return fig
