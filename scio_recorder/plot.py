"""Pictures of what was recorded and detected (matplotlib, the ``plot`` extra).

Each function takes data (an :class:`~scio_recorder.ood.Evaluation` or the
:class:`~scio_recorder.ood.OoDResults` of several OoD sets, heatmaps,
records) and returns a :class:`matplotlib.figure.Figure`; those
that draw one panel also take an ``ax`` to draw into. Nothing calls
``plt.show()`` and no global figure state is used, so the functions work
the same in scripts, notebooks and headless runs (``fig.savefig(path)``).

Curves of several detectors take their colours from :func:`detector_colours`:
matplotlib's ten ``tab10`` colours up to ten detectors, else as many distinct
colours sampled from a perceptually uniform colormap, with line styles that
tell neighbours apart.

* :func:`score_histograms`: in- vs out-of-distribution scores per detector;
* :func:`roc_curves`: ROC curves of several detectors;
* :func:`pr_curves`: precision-recall curves of several detectors;
* :func:`gradcam_overlay`: Grad-CAM heatmaps blended over their images;
* :func:`activation_histograms`: the value distribution of recorded layers;
* :func:`feature_maps`: a grid of a convolutional layer's feature maps.
"""

from __future__ import annotations

__all__ = [
    "activation_histograms",
    "detector_colours",
    "feature_maps",
    "gradcam_overlay",
    "pr_curves",
    "precision_recall_curve",
    "roc_curves",
    "score_histograms",
]

import importlib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from ._support.extras import install_hint
from .ood import Evaluation
from .ood.metrics import _array, _counts, aupr_in, aupr_out, roc_curve

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy.typing as npt
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from torch import Tensor

    from .ood import OoDResults

    Evaluations = Evaluation | OoDResults | Mapping[str, Evaluation]

_TITLE_CHARS = 28
"""Panel titles longer than this get a smaller font (they would overlap)."""

INSTALL = f"Plots need matplotlib: {install_hint('plot', 'matplotlib')}."


Scale = Literal["linear", "log", "symlog"]
SCALES = ("linear", "log", "symlog")
_TAB10 = 10  # matplotlib's default cycle: distinct up to ten lines
_STYLES = ("-", "--", ":", "-.")
_IN_PANEL = 4  # detectors whose legend fits in a panel's corner


def _matplotlib(module: str | None = None) -> Any:
    try:
        return importlib.import_module(
            f"matplotlib.{module}" if module else "matplotlib"
        )
    except ImportError as error:
        raise RuntimeError(INSTALL) from error


def _figure(*args: Any, **kwargs: Any) -> Figure:
    figure: Figure = _matplotlib("figure").Figure(*args, **kwargs)
    return figure


def _grid(n: int, *, columns: int, size: float = 2.6) -> tuple[Figure, list[Axes]]:
    """Return a figure with ``n`` panels, at most ``columns`` a row, no empty cell.

    The rows are filled as evenly as the count allows (7 panels, 4 columns:
    two rows of 4 and 3, not 4 and 3 empty cells of a wider grid), and only
    the ``n`` panels are made: a grid cell without a panel is blank space.
    """
    cols = max(1, min(columns, n))
    rows = max(1, math.ceil(n / cols))
    cols = max(1, math.ceil(n / rows))  # balance: no row of mostly empty cells
    fig = _figure(figsize=(size * cols, size * rows), layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
    return fig, axes


def detector_colours(n: int) -> list[tuple[float, float, float, float]]:
    """Return ``n`` distinct RGBA colours, one per detector, for any ``n``.

    Up to ten, matplotlib's ``tab10`` (its default cycle); more, ``n``
    evenly spaced samples of the perceptually uniform ``viridis`` colormap,
    handed out in a strided order so that consecutive detectors get far
    apart colours (the curves also cycle four line styles).

    Examples
    --------
    >>> colours = detector_colours(25)
    >>> len(set(colours))
    25

    """
    if n <= _TAB10:
        cmap = _matplotlib().colormaps["tab10"]
        return [tuple(cmap(i)) for i in range(n)]
    samples = _matplotlib().colormaps["viridis"](np.linspace(0, 1, n))
    stride = next(s for s in range(max(2, n // 3), n + 1) if math.gcd(s, n) == 1)
    return [tuple(samples[(i * stride) % n]) for i in range(n)]


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


def _check_view(scale: str, clip: tuple[float, float] | None) -> None:
    if scale not in SCALES:
        msg = f"score_histograms: scale={scale!r}; use one of {SCALES}"
        raise ValueError(msg)
    if clip is not None:
        low, high = clip
        if not 0 <= low < high <= 1:
            msg = (
                f"score_histograms: clip={clip!r} must be two quantiles "
                "0 <= lo < hi <= 1, e.g. clip=(0.01, 0.99)"
            )
            raise ValueError(msg)


def _edges(
    ax: Axes, values: npt.NDArray[np.float64], bins: int, scale: str, where: str
) -> npt.NDArray[np.float64]:
    """Set ``ax``'s x scale; return ``bins + 1`` edges even on that scale."""
    low, high = float(values.min()), float(values.max())
    if scale == "log":
        if low <= 0:
            msg = (
                f"score_histograms: scale='log' needs positive scores, but "
                f"{where} has scores down to {low:.3g}; use scale='symlog' "
                "(linear near 0, logarithmic in both tails)"
            )
            raise ValueError(msg)
        ax.set_xscale("log")
    elif scale == "symlog":
        # linear within the median magnitude, logarithmic beyond: the bulk
        # keeps its shape and the tails are compressed
        magnitude = float(np.median(np.abs(values)))
        ax.set_xscale("symlog", linthresh=magnitude if magnitude > 0 else 1.0)
    if high <= low:
        high = low + 1 if scale != "log" else low * 2
    transform = ax.xaxis.get_transform()
    ends = transform.transform(np.array([[low], [high]]))[:, 0]
    even = np.linspace(ends[0], ends[1], bins + 1)[:, None]
    edges: npt.NDArray[np.float64] = transform.inverted().transform(even)[:, 0]
    edges[0], edges[-1] = low, high  # exact ends: no score falls outside
    return edges


def score_histograms(  # noqa: PLR0913 (the data, which panels, how to draw them)
    evaluation: Evaluations,
    detectors: Sequence[str] | None = None,
    *,
    sets: Sequence[str] | None = None,
    bins: int = 40,
    columns: int = 4,
    scale: Scale = "linear",
    clip: tuple[float, float] | None = None,
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
        Histogram bins (shared by both sets of a panel), evenly spaced on
        the ``scale``.
    columns : int, default 4
        Panels per row at most (one OoD set); the rows are balanced and no
        cell is left empty of a panel where a row can be shortened. With
        several sets, a row per set.
    scale : {"linear", "log", "symlog"}, default "linear"
        The score axis. ``"log"`` for positive heavy-tailed scores (an error
        names the detector with scores <= 0); ``"symlog"`` for scores of
        any sign: linear within the median score magnitude, logarithmic
        beyond.
    clip : (float, float), optional
        Quantiles ``(lo, hi)``, e.g. ``(0.01, 0.99)``: each panel's axis
        spans those quantiles of its scores (both sets pooled), and the
        scores beyond are counted in the end bins, so a few outliers no
        longer squash the bulk into one bin. The x label says so.

    Returns
    -------
    Figure
        One panel per detector (and set), titled with its AUROC, and one
        legend for the figure (the same colour is the same set everywhere).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import Evaluation
    >>> scores = torch.linspace(0, 1, 50)
    >>> ev = Evaluation({"a": scores}, {"a": scores + 0.5})
    >>> fig = score_histograms(ev)
    >>> [ax.get_title() for ax in fig.axes]
    ['a (AUROC 0.87)']
    >>> [t.get_text() for t in fig.legends[0].get_texts()]
    ['in-distribution', 'OoD']
    >>> heavy = Evaluation({"a": torch.rand(50)}, {"a": torch.rand(50) ** -3})
    >>> score_histograms(heavy, scale="log").axes[0].get_xscale()
    'log'

    """
    _check_view(scale, clip)
    evaluations = _evaluations(evaluation, sets)
    names = _names(evaluations[0], detectors)
    several = len(evaluations) > 1
    count = len(names) * len(evaluations)
    fig, axes = _grid(count, columns=len(names) if several else columns)
    colours = detector_colours(len(evaluations) + 1)  # in-distribution first
    panels = [(k, ev, name) for k, ev in enumerate(evaluations) for name in names]
    xlabel = "score (higher: more OoD)"
    if clip is not None:
        xlabel += f"\nclipped to the {clip[0]:.3g}-{clip[1]:.3g} quantiles"
    handles: dict[str, Any] = {}
    for ax, (k, ev, name) in zip(axes, panels, strict=True):
        inside = _numpy(ev.id_scores[name])
        outside = _numpy(ev.ood_scores[name])
        pooled = np.concatenate([inside, outside])
        if clip is not None:
            low, high = np.quantile(pooled, clip)
            inside, outside, pooled = (
                np.clip(v, low, high) for v in (inside, outside, pooled)
            )
        where = f" vs {ev.name}" if several else ""
        edges = _edges(ax, pooled, bins, scale, f"detector {name!r}{where}")
        for values, label, colour in (
            (inside, "in-distribution", colours[0]),
            (outside, ev.name, colours[k + 1]),
        ):
            # the fraction of the set per bin: bins are even on the axis's
            # scale, so bar heights are densities per unit of that scale
            weights = np.full(values.shape, 1 / values.size)
            *_, bars = ax.hist(
                values,
                bins=edges.tolist(),
                weights=weights,
                alpha=0.6,
                color=colour,
                label=label,
            )
            handles.setdefault(label, bars)
        title = f"{name}{where} (AUROC {ev[name]['AUROC']:.2f})"
        # A long name would run into the next panel's title: a smaller font.
        ax.set_title(title, fontsize=None if len(title) <= _TITLE_CHARS else "small")
        # small: a panel is about 30 characters of the default size wide
        ax.set_xlabel(xlabel, fontsize="small" if clip is None else "x-small")
        ax.set_yticks([])
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside upper center",
            ncols=len(handles),
            fontsize=9,
        )
    return fig


def _curve_panels(  # noqa: PLR0913 (what roc_curves takes, and how to draw)
    evaluation: Evaluations,
    detectors: Sequence[str] | None,
    sets: Sequence[str] | None,
    ax: Axes | None,
    *,
    what: str,
    legend: Literal["lower left", "lower right"],
    draw: Callable[[Axes, Evaluation, str, dict[str, Any]], None],
    finish: Callable[[Axes, Evaluation], None],
) -> Figure:
    """Draw a panel per OoD set, a curve per detector (colour and style each).

    ``draw`` draws one detector's curve; ``finish`` labels the panel. The
    legend sits in the panel, or beside it for more than ten detectors.
    """
    evaluations = _evaluations(evaluation, sets)
    names = _names(evaluations[0], detectors)
    if ax is not None:
        if len(evaluations) > 1:
            msg = (
                f"{what}: one `ax` cannot hold the {len(evaluations)} OoD "
                f"sets {[ev.name for ev in evaluations]}; pick one with "
                "`sets=[name]`, or drop `ax` (a panel per set)."
            )
            raise ValueError(msg)
        fig = ax.get_figure()
        axes = [ax]
    else:
        fig, axes = _grid(len(evaluations), columns=3, size=4.3)
    colours = detector_colours(len(names))
    many = len(names) > _TAB10
    for panel, ev in zip(axes, evaluations, strict=True):
        for i, name in enumerate(names):
            style: dict[str, Any] = {"color": colours[i]}
            if many:
                style["linestyle"] = _STYLES[i % len(_STYLES)]
            draw(panel, ev, name, style)
        finish(panel, ev)
        if many or len(names) > _IN_PANEL:
            # beside the panel: inside, it would hide curves (a reversed
            # ranking runs through the lower right corner)
            panel.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        else:
            panel.legend(fontsize=7, loc=legend)
    if ax is None and (many or len(names) > _IN_PANEL):
        # room for the legends beside the panels, which keep their size
        fig.set_figwidth(fig.get_figwidth() * 1.6)  # type: ignore[union-attr]
    return fig  # type: ignore[return-value]


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

    def draw(panel: Axes, ev: Evaluation, name: str, style: dict[str, Any]) -> None:
        fpr, tpr = roc_curve(ev.id_scores[name], ev.ood_scores[name])
        panel.plot(fpr, tpr, label=f"{name} ({ev[name]['AUROC']:.2f})", **style)

    def finish(panel: Axes, ev: Evaluation) -> None:
        panel.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        panel.set_xlabel("false positive rate (in-distribution flagged)")
        panel.set_ylabel(f"true positive rate ({ev.name} flagged)")
        panel.set_title(f"ROC, {ev.name}")

    return _curve_panels(
        evaluation,
        detectors,
        sets,
        ax,
        what="roc_curves",
        legend="lower right",
        draw=draw,
        finish=finish,
    )


def precision_recall_curve(
    positives: Any, negatives: Any
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Return ``(precision, recall)`` of ``positives`` ranked above ``negatives``.

    One point per distinct threshold, from the lowest (recall 1) to the
    highest, then ``(1, 0)``: the values and order of scikit-learn's
    ``precision_recall_curve``, whose step area is the average precision
    (:func:`~scio_recorder.ood.metrics.average_precision`).

    Examples
    --------
    >>> precision, recall = precision_recall_curve([0.9, 0.4], [0.5])
    >>> precision.round(3).tolist(), recall.tolist()
    ([0.667, 0.5, 1.0, 1.0], [1.0, 0.5, 0.5, 0.0])

    """
    pos = _array(positives, "positives")
    tps, fps = _counts(pos, _array(negatives, "negatives"))
    precision = tps / (tps + fps)
    recall = tps / pos.size
    return np.r_[precision[::-1], 1.0], np.r_[recall[::-1], 0.0]


def pr_curves(
    evaluation: Evaluations,
    detectors: Sequence[str] | None = None,
    *,
    sets: Sequence[str] | None = None,
    ax: Axes | None = None,
    positive: Literal["ood", "id"] = "ood",
) -> Figure:
    """Draw the precision-recall curves of several detectors, a panel per set.

    Takes what :func:`roc_curves` takes. Each curve's legend gives both
    areas, AUPR-In (in-distribution positive, scores negated) and AUPR-Out
    (OoD positive); ``positive`` picks which curve is drawn. The dotted line
    is chance: the positives' share of the samples.

    Parameters
    ----------
    evaluation : Evaluation or OoDResults
        From :func:`~scio_recorder.ood.evaluate` (or a dict of
        :class:`~scio_recorder.ood.Evaluation`).
    detectors : sequence of str, optional
        Which ones, in order; default all.
    sets : sequence of str, optional
        Which OoD sets of an :class:`~scio_recorder.ood.OoDResults`; default
        all, one panel each.
    ax : Axes, optional
        Draw into it (one OoD set only).
    positive : {"ood", "id"}, default "ood"
        The positive class of the drawn curve: ``"ood"``, the curve whose
        area is AUPR-Out; ``"id"``, AUPR-In.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import Evaluation
    >>> scores = torch.linspace(0, 1, 50)
    >>> ev = Evaluation({"a": scores}, {"a": scores + 0.5})
    >>> fig = pr_curves(ev)
    >>> fig.axes[0].lines[0].get_label()
    'a (AUPR-In 0.88, AUPR-Out 0.88)'

    """
    if positive not in ("ood", "id"):
        msg = (
            f"pr_curves: positive={positive!r}; use 'ood' (AUPR-Out) or 'id' (AUPR-In)"
        )
        raise ValueError(msg)

    def draw(panel: Axes, ev: Evaluation, name: str, style: dict[str, Any]) -> None:
        inside, outside = _numpy(ev.id_scores[name]), _numpy(ev.ood_scores[name])
        areas = f"AUPR-In {aupr_in(inside, outside):.2f}, "
        areas += f"AUPR-Out {aupr_out(inside, outside):.2f}"
        pos, neg = (outside, inside) if positive == "ood" else (-inside, -outside)
        precision, recall = precision_recall_curve(pos, neg)
        panel.step(recall, precision, where="post", label=f"{name} ({areas})", **style)

    def finish(panel: Axes, ev: Evaluation) -> None:
        first = next(iter(ev.id_scores))  # every detector scored the same samples
        inside, outside = len(ev.id_scores[first]), len(ev.ood_scores[first])
        share = (outside if positive == "ood" else inside) / (inside + outside)
        panel.axhline(share, color="grey", linestyle=":", linewidth=1)
        flagged = ev.name if positive == "ood" else "in-distribution"
        panel.set_xlabel(f"recall ({flagged} found)")
        panel.set_ylabel(f"precision ({flagged} among those flagged)")
        panel.set_ylim(0, 1.02)
        panel.set_title(f"precision-recall, {ev.name} ({positive.upper()} positive)")

    return _curve_panels(
        evaluation,
        detectors,
        sets,
        ax,
        what="pr_curves",
        legend="lower left",
        draw=draw,
        finish=finish,
    )


def _image(x: Tensor) -> Any:
    """``[C, H, W]`` -> an ``[H, W, 3]`` array in [0, 1] for imshow."""
    x = x.detach().to("cpu", torch.float64)
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    x = x[:3].permute(1, 2, 0)
    low, high = x.min(), x.max()
    return ((x - low) / (high - low if high > low else 1)).numpy()


def _class_name(value: Any, class_names: Sequence[str] | None) -> str:
    index = int(value)
    if class_names is None:
        return str(index)
    if not 0 <= index < len(class_names):
        msg = (
            f"gradcam_overlay: class {index} has no entry in the "
            f"{len(class_names)} class_names; pass one name per class"
        )
        raise ValueError(msg)
    return class_names[index]


def _per_image(values: Any, count: int, what: str) -> list[Any] | None:
    if values is None:
        return None
    found = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    if len(found) != count:
        msg = f"gradcam_overlay: {what}= has {len(found)} entries for {count} images"
        raise ValueError(msg)
    return found


def gradcam_overlay(  # noqa: PLR0913 (the pictures, what they show, how)
    images: Tensor,
    cams: Tensor,
    *,
    titles: Sequence[str] | None = None,
    alpha: float = 0.5,
    columns: int = 4,
    layer: str | None = None,
    predicted: Sequence[int] | Tensor | None = None,
    true: Sequence[int] | Tensor | None = None,
    class_names: Sequence[str] | None = None,
    cmap: str = "jet",
    outline: bool = False,
) -> Figure:
    """Draw Grad-CAM heatmaps blended over their images, with a colour bar.

    Each heatmap is drawn over its image with an opacity of ``alpha`` times
    the heat: where Grad-CAM sees nothing, the image shows unchanged; where
    it sees most, the colour covers it at ``alpha``. One colour bar gives
    the scale (Grad-CAM's ``[0, 1]``); the figure's title names the layer,
    and each image's title the predicted and the true class.

    Parameters
    ----------
    images : Tensor
        ``[B, C, H, W]`` (shown min-max scaled).
    cams : Tensor
        ``[B, H, W]`` from :func:`~scio_recorder.explain.grad_cam`.
    titles : sequence of str, optional
        One per image, shown above the classes.
    alpha : float, default 0.5
        Opacity of the hottest parts of the heatmap.
    columns : int, default 4
        Images per row.
    layer : str, optional
        The layer the maps are of, e.g. ``"features.3 (2-4)"`` (its name
        and label): the figure's title is ``Grad-CAM of <layer>``.
    predicted, true : sequence of int or Tensor, optional
        The predicted and the true class of each image, named in its title
        (``predicted cat, true dog``); a wrong prediction is titled in red.
    class_names : sequence of str, optional
        Names of the classes, by index; default the indices.
    cmap : str, default "jet"
        matplotlib colormap of the heat.
    outline : bool, default False
        Also draw each image's outline over the heat: a white line where its
        brightness crosses the middle of its range, so that a small image
        (an 8 x 8 digit) stays readable under the colours.

    Examples
    --------
    >>> import torch
    >>> fig = gradcam_overlay(
    ...     torch.rand(2, 3, 8, 8),
    ...     torch.rand(2, 8, 8),
    ...     layer="features.3 (2-4)",
    ...     predicted=[0, 1],
    ...     true=[0, 0],
    ...     class_names=["cat", "dog"],
    ... )
    >>> fig.get_suptitle()
    'Grad-CAM of features.3 (2-4)'
    >>> [ax.get_title() for ax in fig.axes[:2]]
    ['predicted cat, true cat', 'predicted dog, true cat']
    >>> fig.axes[2].get_ylabel()  # the colour bar
    'Grad-CAM (0: no evidence, 1: most)'

    """
    if images.shape[0] != cams.shape[0] or images.shape[-2:] != cams.shape[-2:]:
        msg = (
            f"gradcam_overlay: images {list(images.shape)} and cams "
            f"{list(cams.shape)} must share the batch and the height x width "
            "(use grad_cam(..., upsample=True))."
        )
        raise ValueError(msg)
    count = images.shape[0]
    titles = _per_image(titles, count, "titles")
    predicted = _per_image(predicted, count, "predicted")
    true = _per_image(true, count, "true")
    fig, axes = _grid(count, columns=columns, size=2.2)
    colors = _matplotlib("colors")
    norm = colors.Normalize(vmin=0, vmax=1)
    for i, ax in enumerate(axes):
        ax.imshow(_image(images[i]))
        heat = np.clip(_numpy(cams[i]), 0, 1)
        ax.imshow(heat, cmap=cmap, norm=norm, alpha=alpha * heat)
        if outline:
            grey = _image(images[i]).mean(axis=2)
            if grey.max() > grey.min():  # a flat image has no outline
                ax.contour(grey, levels=[0.5], colors="white", linewidths=1.5)
        ax.set_axis_off()
        lines = [titles[i]] if titles is not None else []
        words = []
        if predicted is not None:
            words.append(f"predicted {_class_name(predicted[i], class_names)}")
        if true is not None:
            words.append(f"true {_class_name(true[i], class_names)}")
        lines += [", ".join(words)] if words else []
        wrong = predicted is not None and true is not None and predicted[i] != true[i]
        if lines:
            ax.set_title(
                "\n".join(lines), fontsize=8, color="#c00000" if wrong else "black"
            )
    mappable = _matplotlib("cm").ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(
        mappable, ax=axes, shrink=0.8, label="Grad-CAM (0: no evidence, 1: most)"
    )
    if layer is not None:
        fig.suptitle(f"Grad-CAM of {layer}")
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
