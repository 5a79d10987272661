"""OoD results: score histograms and ROC curves, one detector picked from a list."""

from __future__ import annotations

__all__ = ["ood_view"]

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._base import DIGITS, View, finite, new_figure, rounded

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt
    from matplotlib.figure import Figure

    from scio_recorder.ood import Evaluation

_ROC_POINTS = 200  # points of a ROC curve kept in the page, at most


def _evaluations(results: Any) -> list[Evaluation]:
    from scio_recorder.ood import Evaluation  # noqa: PLC0415 (not with the views)

    if isinstance(results, Evaluation):
        return [results]
    if isinstance(results, Mapping) and results:
        values = list(results.values())
        if all(isinstance(v, Evaluation) for v in values):
            return values
    msg = (
        "ood_view: expected an Evaluation or OoDResults from `evaluate` (or a "
        f"dict of Evaluation), got a {type(results).__name__}"
    )
    raise TypeError(msg)


def histogram(
    inside: npt.NDArray[np.float64],
    outside: npt.NDArray[np.float64],
    bins: int,
    clip: tuple[float, float] | None,
) -> dict[str, Any]:
    """Return shared bin edges and both sets' counts (clipped tails: end bins).

    The edges are even between the ``clip`` quantiles of both sets pooled
    (their finite extremes without ``clip``); scores beyond, infinities
    included, are counted in the end bins. They are kept to the digits that
    tell them apart (:func:`edge_digits`).
    """
    pooled = np.concatenate([inside, outside])
    bounded = pooled[np.isfinite(pooled)]
    if bounded.size == 0:
        bounded = np.zeros(1)
    if clip is None:
        low, high = float(bounded.min()), float(bounded.max())
    else:
        low, high = (float(q) for q in np.quantile(bounded, clip))
    clipped = bool(clip is not None or bounded.size < pooled.size)
    if high <= low:
        high = low + 1.0
    edges = np.linspace(low, high, bins + 1)
    counts = [
        np.histogram(np.clip(v, low, high), bins=edges)[0].tolist()
        for v in (inside, outside)
    ]
    return {
        "edges": finite(edges, edge_digits(low, high, bins)),
        "id": counts[0],
        "ood": counts[1],
        "clipped": clipped,
    }


def edge_digits(low: float, high: float, bins: int) -> int:
    """Return the significant digits that keep ``bins`` even bins apart.

    Six (:data:`~._base.DIGITS`) where the edges are not much larger than a
    bin, and one more per power of ten they are larger (scores of 3e5 in
    bins of 0.05 keep 13, where six would make every edge 300000.0), up to
    float64's 17.

    Examples
    --------
    >>> edge_digits(0.0, 14.0, 5), edge_digits(3e5, 3e5 + 1.5, 30)
    (7, 13)

    """
    width = (high - low) / bins
    top = max(abs(low), abs(high))
    if not width > 0 or not math.isfinite(top / width):
        return DIGITS
    return min(17, DIGITS + max(0, math.ceil(math.log10(top / width))))


def _thinned(
    fpr: npt.NDArray[np.float64], tpr: npt.NDArray[np.float64]
) -> list[list[Any]]:
    """At most :data:`_ROC_POINTS` points of the curve, its ends kept."""
    if fpr.size > _ROC_POINTS:
        keep = np.unique(np.linspace(0, fpr.size - 1, _ROC_POINTS).round().astype(int))
        fpr, tpr = fpr[keep], tpr[keep]
    return [finite(fpr), finite(tpr)]


class _OoDView(View):
    kind = "ood"

    def figure(self, detector: str | None = None) -> Figure:
        """Return the histogram and ROC of ``detector`` (default the first)."""
        names = self.data["detectors"]
        index = 0 if detector is None else names.index(detector)
        sets = self.data["sets"]
        fig = new_figure(8.5, 3.2 * len(sets))
        for row, found in enumerate(sets):
            panel = found["panels"][index]
            left = fig.add_subplot(len(sets), 2, 2 * row + 1)
            edges = np.array(panel["edges"], dtype=float)
            for key, label, colour, total in (
                ("id", "in-distribution", "#1f77b4", found["n_id"]),
                ("ood", found["name"], "#ff7f0e", found["n_ood"]),
            ):
                share = np.array(panel[key], dtype=float) / max(total, 1)
                left.stairs(
                    share, edges, fill=True, alpha=0.6, color=colour, label=label
                )
            xlabel = "score (higher: more OoD)"
            if panel["clipped"] and self.data["clip"] is not None:
                low, high = self.data["clip"]
                xlabel += f"\ntails clipped to the {low}-{high} quantiles"
            left.set_xlabel(xlabel, fontsize=8)
            left.set_yticks([])
            left.legend(fontsize=7, loc="upper right")
            left.set_title(f"{names[index]}, {found['name']}", fontsize=9)
            right = fig.add_subplot(len(sets), 2, 2 * row + 2)
            fpr, tpr = panel["roc"]
            right.plot(fpr, tpr, color="#d62728")
            right.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
            right.set_aspect("equal")
            right.set_xlabel("false positive rate", fontsize=8)
            right.set_ylabel("true positive rate", fontsize=8)
            right.set_title(f"ROC, AUROC {panel['metrics']['AUROC']:.3f}", fontsize=9)
        return fig


def ood_view(
    results: Any,
    detectors: Sequence[str] | None = None,
    *,
    bins: int = 30,
    clip: tuple[float, float] | None = (0.01, 0.99),
    title: str = "OoD detection",
) -> View:
    """Return the score histograms and ROC curve of each detector, picked from a list.

    One detector at a time (and one OoD set, for several): its in- and
    out-of-distribution score histograms, on shared bins, and its ROC curve
    (OoD positive), with its metrics. Hovering a bin shows its edges and
    both counts; hovering the ROC, the nearest point.

    Parameters
    ----------
    results : Evaluation or OoDResults
        From :func:`~scio_recorder.ood.evaluate` (it keeps the scores).
    detectors : sequence of str, optional
        Which ones, in the list's order; default all.
    bins : int, default 30
        Bins of a histogram, even between its ends.
    clip : (float, float) or None, default (0.01, 0.99)
        The quantiles of both sets' scores (pooled) at the ends of the
        histogram: scores beyond are counted in the end bins, so that a few
        extreme scores (Mahalanobis distances in the hundreds of thousands)
        do not squash the rest into one bin. ``None``: from the lowest to
        the highest score.
    title : str, default "OoD detection"

    Returns
    -------
    View
        ``.figure(detector)`` draws one detector's panels (default the first).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import Evaluation
    >>> ev = Evaluation({"a": torch.arange(10.0)}, {"a": torch.arange(10.0) + 5}, "far")
    >>> view = ood_view(ev, bins=5, clip=None)
    >>> panel = view.data["sets"][0]["panels"][0]
    >>> panel["edges"], panel["id"], panel["ood"]
    ([0.0, 2.8, 5.6, 8.4, 11.2, 14.0], [3, 3, 3, 1, 0], [0, 1, 3, 3, 3])

    """
    evaluations = _evaluations(results)
    names = list(evaluations[0]) if detectors is None else list(detectors)
    missing = [name for name in names if name not in evaluations[0]]
    if missing or not names:
        known = list(evaluations[0])
        msg = f"ood_view: no detector named {missing}; the results have {known}"
        raise KeyError(msg)
    if clip is not None and not 0 <= clip[0] < clip[1] <= 1:
        msg = (
            f"ood_view: clip={clip!r} must be two quantiles 0 <= lo < hi <= 1, or None"
        )
        raise ValueError(msg)
    if bins < 1:
        msg = f"ood_view: bins={bins}; use at least 1"
        raise ValueError(msg)
    from scio_recorder.ood.metrics import roc_curve  # noqa: PLC0415 (not with the views)

    sets = []
    for evaluation in evaluations:
        panels = []
        for name in names:
            inside = evaluation.id_scores[name].detach().to("cpu").double().numpy()
            outside = evaluation.ood_scores[name].detach().to("cpu").double().numpy()
            panel = histogram(inside, outside, bins, clip)
            panel["roc"] = _thinned(*roc_curve(inside, outside))
            panel["metrics"] = {
                key: rounded(value)
                for key, value in evaluation[name].items()
                if key != "FPR95TPR"  # the old name of FPR95-OOD
            }
            panels.append(panel)
        first = evaluation.id_scores[names[0]]
        sets.append(
            {
                "name": evaluation.name,
                "n_id": len(first),
                "n_ood": len(evaluation.ood_scores[names[0]]),
                "panels": panels,
            }
        )
    data = {"detectors": names, "sets": sets, "clip": list(clip) if clip else None}
    view = _OoDView(data, title=title)
    view.height = 420
    return view
