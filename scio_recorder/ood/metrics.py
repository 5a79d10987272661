"""Metrics of out-of-distribution (OoD) detection, from two sets of scores.

Scores follow the convention of every detector of :mod:`scio_recorder.ood`
(and of pytorch-ood): **higher means more likely OoD**. OoD samples are the
positive class, as in pytorch-ood's ``OODMetrics``:

* ``AUROC``: the probability that an OoD sample scores higher than an
  in-distribution (ID) one, ties counting one half (the Mann-Whitney
  statistic; 1 is perfect, 0.5 chance);
* ``AUPR-IN``: the average precision with ID samples as positives (scores
  negated); ``AUPR-OUT``: with OoD samples as positives;
* ``FPR95-ID`` (:func:`fpr_at_id_recall`): the false-positive rate at 95 %
  in-distribution recall, **ID as the positive class**, as the ODIN and
  Energy papers and OpenOOD up to v1.5 (June 2023) report "FPR@95" (see
  below for OpenOOD since): the fraction of OoD samples scored
  at or below the threshold that keeps 95 % of the ID samples (OoD taken for
  ID). The default FPR of the results tables (:class:`~scio_recorder.ood.OoDResults`);
* ``FPR95-OOD`` (:func:`fpr_at_ood_recall`): the other convention, **OoD as
  the positive class**: the fraction of ID samples flagged as OoD at the
  threshold that flags 95 % of the OoD samples. ``FPR95TPR``
  (:func:`fpr_at_tpr`, :func:`ood_metrics`) is this one, under its old name.
  OpenOOD's "FPR@95" is this one since its commit 873e8c2 (August 2023,
  "fix ood eval (ood as pos)": ``auc_and_fpr_recall`` in
  ``openood/evaluators/metrics.py`` takes OoD as the positive class);
  before, its ``fpr_recall`` took ID as positive, ``FPR95-ID``. Both are
  tested against a port of OpenOOD's code, on scores without ties (its
  ``roc_curve`` drops intermediate points, which with ties can skip the
  first one reaching 95 %).

The two FPRs differ in general (one counts OoD samples, the other ID
samples); name the convention when reporting one. An ``AUROC`` below 0.5
means a reversed ranking: the detector ranks ID samples above OoD ones.

The reference library scio's measures, in the same convention (its
``scio.eval`` AUC, MCC, TPR and TNR, with OoD samples scored *low*: pass it
our scores negated):

* ``pAUROC@x`` (:func:`partial_auroc`): the area under the ROC curve between
  two false-positive rates, divided by their distance (1 is perfect);
* ``AUROC-CH`` (:func:`convex_hull_auroc`): the area under the ROC curve's
  convex hull (what a mix of thresholds can reach);
* ``MCC`` (:func:`mcc`): the best Matthews correlation over thresholds;
* ``TPR@FPRx`` (:func:`tpr_at_fpr`): the fraction of OoD samples flagged at
  the threshold that flags at most a fraction ``x`` of the ID ones;
* ``TNR@TPRx`` (:func:`tnr_at_tpr`): the fraction of ID samples kept at the
  threshold that flags at least a fraction ``x`` of the OoD ones.

**Ties.** A group of tied scores moves the ROC curve diagonally. Our areas
(``AUROC``, ``pAUROC``) follow that diagonal, so a tied (ID, OoD) pair counts
one half (the Mann-Whitney convention, scikit-learn's); scio's default
("pessimistic") takes the lower staircase, so a tied pair counts zero:
``ties="pessimistic"`` gives scio's number. The convex hull, the MCC and the
rates at a fixed rate do not depend on the convention (they read the ROC
curve's points, one per distinct score).

Everything is computed in float64 with numpy, from sorted scores, ties
grouped: each metric equals scikit-learn's (``roc_auc_score``,
``average_precision_score``, ``roc_curve``), which the tests check, ties
included.

Examples
--------
>>> from scio_recorder.ood.metrics import ood_metrics
>>> metrics = ood_metrics([0.1, 0.2, 0.3, 0.9], [0.8, 0.95, 0.3])
>>> {name: round(value, 3) for name, value in metrics.items()}
{'AUROC': 0.792, 'AUPR-IN': 0.854, 'AUPR-OUT': 0.756, 'FPR95TPR': 0.5}

"""

from __future__ import annotations

__all__ = [
    "ALL_METRICS",
    "METRICS",
    "TABLE_METRICS",
    "aupr_in",
    "aupr_out",
    "auroc",
    "average_precision",
    "check_metric_names",
    "convex_hull_auroc",
    "describe_metric",
    "fpr_at_id_recall",
    "fpr_at_ood_recall",
    "fpr_at_tpr",
    "mcc",
    "metric_function",
    "ood_metrics",
    "partial_auroc",
    "roc_curve",
    "tnr_at_tpr",
    "tpr_at_fpr",
]

import numbers
import re
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy.typing as npt
    from torch import Tensor

    Scores = npt.ArrayLike | Tensor

METRICS = ("AUROC", "AUPR-IN", "AUPR-OUT", "FPR95TPR")
"""The names :func:`ood_metrics` returns by default, in order (``FPR95TPR``:
OoD positive, the same as ``FPR95-OOD``)."""

ALL_METRICS = ("AUROC", "AUPR-IN", "AUPR-OUT", "FPR95-ID", "FPR95-OOD", "FPR95TPR")
"""The names every :class:`~scio_recorder.ood.Evaluation` computes.

:func:`ood_metrics` and the results tables also take, on request,
``AUROC-CH``, ``MCC`` and the parametrised ``pAUROC@<max_fpr>`` (e.g.
``pAUROC@0.1``), ``TPR@FPR<fpr>`` (e.g. ``TPR@FPR0.05``) and
``TNR@TPR<tpr>`` (e.g. ``TNR@TPR0.95``): see :func:`metric_function`."""

TABLE_METRICS = ("AUROC", "FPR95-ID", "AUPR-IN", "AUPR-OUT")
"""The metrics a results table shows by default (FPR with ID positive, as
OpenOOD up to v1.5 and the ODIN and Energy papers)."""


def _array(scores: Scores, what: str) -> npt.NDArray[np.float64]:
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().to("cpu", torch.float64).numpy()
    out = np.asarray(scores, dtype=np.float64).reshape(-1)
    if out.size == 0:
        msg = f"{what} is empty: the metrics need at least one score of each set"
        raise ValueError(msg)
    if np.isnan(out).any():
        msg = f"{what} holds NaN scores: check the detector (and its fit)"
        raise ValueError(msg)
    return out


def _counts(
    positives: npt.NDArray[np.float64], negatives: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Cumulative true and false positives at each distinct threshold, high first."""
    scores = np.concatenate([positives, negatives])
    labels = np.concatenate([np.ones(positives.size), np.zeros(negatives.size)])
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    # ties grouped (`!=`, not `np.diff`: inf - inf is NaN, and equal
    # infinities are tied)
    last = np.r_[np.flatnonzero(scores[1:] != scores[:-1]), scores.size - 1]
    tps = np.cumsum(labels)[last]
    fps = (last + 1) - tps
    return tps, fps


def roc_curve(
    id_scores: Scores, ood_scores: Scores
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Return ``(fpr, tpr)`` of the ROC curve, OoD positive, from ``(0, 0)``.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import roc_curve
    >>> fpr, tpr = roc_curve([0.1, 0.5], [0.5, 0.9])
    >>> fpr.tolist(), tpr.tolist()
    ([0.0, 0.0, 0.5, 1.0], [0.0, 0.5, 1.0, 1.0])

    """
    ood = _array(ood_scores, "ood_scores")
    ind = _array(id_scores, "id_scores")
    tps, fps = _counts(ood, ind)
    return np.r_[0.0, fps / ind.size], np.r_[0.0, tps / ood.size]


def auroc(id_scores: Scores, ood_scores: Scores) -> float:
    """Return the area under the ROC curve (OoD scores higher: 1).

    Examples
    --------
    >>> from scio_recorder.ood.metrics import auroc
    >>> auroc([0.1, 0.2], [0.3, 0.2])
    0.875

    """
    fpr, tpr = roc_curve(id_scores, ood_scores)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))  # trapezoids


def average_precision(positives: Scores, negatives: Scores) -> float:
    r"""Return the average precision of ``positives`` ranked above ``negatives``.

    $\sum_n (R_n - R_{n-1}) P_n$ over the distinct thresholds ($R_n$, $P_n$
    the recall and precision at the $n$-th), as
    scikit-learn's ``average_precision_score``.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import average_precision
    >>> average_precision([0.9, 0.4], [0.5])
    0.8333333333333333

    """
    pos = _array(positives, "positives")
    neg = _array(negatives, "negatives")
    tps, fps = _counts(pos, neg)
    precision = tps / (tps + fps)
    recall = tps / pos.size
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def aupr_in(id_scores: Scores, ood_scores: Scores) -> float:
    """Return the average precision with ID samples as positives.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import aupr_in
    >>> aupr_in([0.1, 0.2], [0.9])
    1.0

    """
    return average_precision(
        -_array(id_scores, "id_scores"), -_array(ood_scores, "ood_scores")
    )


def aupr_out(id_scores: Scores, ood_scores: Scores) -> float:
    """Return the average precision with OoD samples as positives.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import aupr_out
    >>> aupr_out([0.1, 0.2], [0.9])
    1.0

    """
    return average_precision(ood_scores, id_scores)


def fpr_at_tpr(id_scores: Scores, ood_scores: Scores, tpr: float = 0.95) -> float:
    """Return the false positive rate where the true positive rate reaches ``tpr``.

    **OoD is the positive class**: the fraction of ID samples flagged at the
    threshold that flags a fraction ``tpr`` of the OoD samples (the first ROC
    point reaching it). The same as :func:`fpr_at_ood_recall`, and OpenOOD's
    "FPR@95" since its commit 873e8c2 (August 2023); OpenOOD v1.5's was the
    other convention, :func:`fpr_at_id_recall`.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import fpr_at_tpr
    >>> fpr_at_tpr([0.1, 0.2, 0.6, 0.7], [0.5, 0.9], tpr=0.95)
    0.5

    """
    tpr = _check_rate(tpr, "tpr", low_open=True)
    fpr, rates = roc_curve(id_scores, ood_scores)
    return float(fpr[np.argmax(rates >= tpr - 1e-12)])


def fpr_at_ood_recall(
    id_scores: Scores, ood_scores: Scores, recall: float = 0.95
) -> float:
    """Return the fraction of ID samples flagged at ``recall`` of the OoD samples.

    **OoD is the positive class** (``FPR95-OOD``; ``FPR95TPR`` under its old
    name, :func:`fpr_at_tpr`): the threshold is the highest one that flags
    (scores at or above) at least a fraction ``recall`` of the OoD samples,
    and the result is the fraction of ID samples at or above it.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import fpr_at_ood_recall
    >>> fpr_at_ood_recall([0.1, 0.2, 0.6, 0.7], [0.5, 0.9])
    0.5

    """
    recall = _check_rate(recall, "recall", low_open=True)
    return fpr_at_tpr(id_scores, ood_scores, recall)


def fpr_at_id_recall(
    id_scores: Scores, ood_scores: Scores, recall: float = 0.95
) -> float:
    """Return the fraction of OoD samples taken for ID at ``recall`` of the ID ones.

    **ID is the positive class** (``FPR95-ID``), the "FPR@95" of the ODIN and
    Energy papers and of OpenOOD up to v1.5 (its ``fpr_recall``; since its
    commit 873e8c2 of August 2023 OpenOOD reports :func:`fpr_at_ood_recall`):
    the threshold is the lowest one that keeps (scores at or below) at
    least a fraction ``recall`` of the ID samples, and the result is the
    fraction of OoD samples at or below it. (OpenOOD before April 2022 kept
    the ``int(recall * n)`` lowest-scored ID samples, one fewer when
    ``recall * n`` is not an integer.)

    Examples
    --------
    >>> from scio_recorder.ood.metrics import fpr_at_id_recall
    >>> fpr_at_id_recall([0.1, 0.2, 0.6, 0.7], [0.5, 0.9])
    0.5
    >>> fpr_at_id_recall([0.1, 0.2, 0.3], [0.25, 0.9], recall=2 / 3)
    0.0

    """
    recall = _check_rate(recall, "recall", low_open=True)
    ind = _array(id_scores, "id_scores")
    ood = _array(ood_scores, "ood_scores")
    return fpr_at_tpr(-ood, -ind, recall)  # ID positive: negated scores


Ties = Literal["half", "pessimistic"]


def _check_rate(value: object, name: str, *, low_open: bool = False) -> float:
    """Return ``value`` as a float in ``[0, 1]`` (or ``(0, 1]``), else raise.

    The one check of every rate argument of the metrics: a real number (a
    Python, numpy or 0-d tensor number, not a bool nor a string), named in
    the message otherwise.
    """
    bounds = "(0, 1]" if low_open else "[0, 1]"
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = (
            f"{name} must be a rate in {bounds} (a number, e.g. 0.95), got "
            f"{value!r} ({type(value).__name__})"
        )
        raise TypeError(msg)
    rate = float(value)
    if not (0.0 < rate <= 1.0 if low_open else 0.0 <= rate <= 1.0):
        msg = f"{name} must be a rate in {bounds}, got {value!r}"
        raise ValueError(msg)
    return rate


def _tpr_at(
    fpr: npt.NDArray[np.float64],
    tpr: npt.NDArray[np.float64],
    x: float,
    *,
    end: bool = False,
) -> float:
    """Return the ROC curve's TPR at FPR ``x``, linearly interpolated.

    Where the curve is vertical at ``x`` (a group of tied OoD scores), the
    TPR after it (the top), or with ``end`` the TPR before it (the bottom):
    an area from ``x`` starts at the top, one up to ``x`` ends at the bottom.
    """
    side: Literal["left", "right"] = "left" if end else "right"
    i = int(np.searchsorted(fpr, x, side=side)) - 1  # the segment crossing x
    i = min(max(i, 0), fpr.size - 2)
    width = fpr[i + 1] - fpr[i]
    if width == 0:
        return float(tpr[i + 1])
    return float(tpr[i] + (x - fpr[i]) / width * (tpr[i + 1] - tpr[i]))


def partial_auroc(
    id_scores: Scores,
    ood_scores: Scores,
    *,
    max_fpr: float,
    min_fpr: float = 0.0,
    ties: Ties = "half",
) -> float:
    """Return the ROC area for FPR in ``[min_fpr, max_fpr]``, normalised.

    The area is divided by ``max_fpr - min_fpr``, so 1 is perfect and a
    random ranking gives about ``(min_fpr + max_fpr) / 2``, as scio's
    ``AUC(max_fpr=, min_fpr=)``. (scikit-learn's ``roc_auc_score(max_fpr=)``
    applies the McClish correction instead; this is not it.) OoD positive.

    Parameters
    ----------
    id_scores, ood_scores : array_like or Tensor
        Scores of in-distribution and OoD samples (higher: more OoD).
    max_fpr, min_fpr : float
        The false-positive rates bounding the area, ``0 <= min_fpr < max_fpr
        <= 1``.
    ties : {"half", "pessimistic"}
        How a group of tied scores counts: along the ROC curve's diagonal
        (``"half"``, as :func:`auroc`), or along the lower staircase
        (``"pessimistic"``, scio's default).

    Examples
    --------
    >>> from scio_recorder.ood.metrics import partial_auroc
    >>> partial_auroc([0.1, 0.2, 0.3, 0.4], [0.35, 0.5], max_fpr=0.5)
    0.75
    >>> partial_auroc([0.1, 0.2, 0.3, 0.4], [0.35, 0.5], max_fpr=1.0)
    0.875

    """
    low = _check_rate(min_fpr, "min_fpr")
    high = _check_rate(max_fpr, "max_fpr")
    if not low < high:
        msg = f"partial_auroc needs min_fpr < max_fpr, got {min_fpr!r} and {max_fpr!r}"
        raise ValueError(msg)
    ties = _check_ties(ties)
    fpr, tpr = roc_curve(id_scores, ood_scores)
    inside = (fpr > low) & (fpr < high)
    xs = np.r_[low, fpr[inside], high]
    if ties == "pessimistic":
        # the lower staircase: from each FPR on, the highest TPR reached at
        # or before it, until the next FPR (a left Riemann sum)
        # (TPR never decreases along the curve: the TPR of the last point
        # at or before each FPR, found by a binary search, O(n log n))
        last = np.searchsorted(fpr, xs[:-1] + 1e-15, side="right") - 1
        area = float(np.sum(np.diff(xs) * tpr[last]))
    else:  # the curve itself: trapezoids, ties on its diagonals
        ys = np.r_[
            _tpr_at(fpr, tpr, low), tpr[inside], _tpr_at(fpr, tpr, high, end=True)
        ]
        area = float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2))
    return area / (high - low)


def _check_ties(ties: str) -> Ties:
    if ties == "half":
        return "half"
    if ties == "pessimistic":
        return "pessimistic"
    msg = f"ties must be 'half' or 'pessimistic', got {ties!r}"
    raise ValueError(msg)


def convex_hull_auroc(id_scores: Scores, ood_scores: Scores) -> float:
    """Return the area under the ROC curve's convex hull (OoD positive).

    The hull is what randomly mixing two thresholds can reach; its area is
    at least the :func:`auroc`, equal when the curve is concave. (scio's
    ``AUC(kind="convex_hull")``.)

    Examples
    --------
    >>> from scio_recorder.ood.metrics import auroc, convex_hull_auroc
    >>> ind, ood = [0.1, 0.3, 0.5, 0.7], [0.2, 0.6, 0.8, 0.9]
    >>> auroc(ind, ood), convex_hull_auroc(ind, ood)
    (0.75, 0.84375)

    """
    fpr, tpr = roc_curve(id_scores, ood_scores)
    points = np.c_[np.r_[fpr, 1.0], np.r_[tpr, 1.0]]
    hull: list[npt.NDArray[np.float64]] = []
    for point in points:  # the upper hull, left to right (a monotone chain)
        while len(hull) > 1:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (point[1] - y1) - (y2 - y1) * (point[0] - x1) < 0:
                break  # a right turn: hull[-1] stays above the chord
            hull.pop()
        hull.append(point)
    xs, ys = np.array(hull).T
    return float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2))


def mcc(id_scores: Scores, ood_scores: Scores) -> float:
    """Return the best Matthews correlation coefficient over thresholds.

    OoD positive, each threshold flagging the scores at or above it; the
    degenerate thresholds (nothing or everything flagged) count 0, so the
    result is in ``[0, 1]``. The maximum is taken over the ROC curve's
    Pareto front (as scio's ``MCC``): the points no other point beats in
    both rates.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import mcc
    >>> mcc([0.1, 0.2, 0.3], [0.4, 0.5]), round(mcc([0.1, 0.4], [0.3, 0.5]), 3)
    (1.0, 0.577)

    """
    ood = _array(ood_scores, "ood_scores")
    ind = _array(id_scores, "id_scores")
    tps, fps = _counts(ood, ind)
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    front = (np.diff(fps, append=np.inf) > 0) & (np.diff(tps, prepend=-np.inf) > 0)
    tp, fp = tps[front], fps[front]
    p, n = float(ood.size), float(ind.size)
    fn, tn = p - tp, n - fp
    squared = (tp + fp) * (tn + fn) * p * n
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(squared > 0, (tp * tn - fp * fn) / np.sqrt(squared), 0.0)
    return float(max(values.max(), 0.0))


def tpr_at_fpr(id_scores: Scores, ood_scores: Scores, fpr: float) -> float:
    """Return the fraction of OoD samples flagged while at most ``fpr`` of ID are.

    OoD positive: the highest true-positive rate of a threshold whose
    false-positive rate is at most ``fpr`` (scio's ``TPR(max_fpr=)``).

    Examples
    --------
    >>> from scio_recorder.ood.metrics import tpr_at_fpr
    >>> tpr_at_fpr([0.1, 0.2, 0.6, 0.7], [0.5, 0.9], 0.25)
    0.5
    >>> tpr_at_fpr([0.1, 0.2, 0.6, 0.7], [0.5, 0.9], 0.5)
    1.0

    """
    limit = _check_rate(fpr, "fpr")
    rates, tpr = roc_curve(id_scores, ood_scores)
    return float(tpr[rates <= limit + 1e-12].max())


def tnr_at_tpr(id_scores: Scores, ood_scores: Scores, tpr: float) -> float:
    """Return the fraction of ID samples kept while at least ``tpr`` of OoD are flagged.

    OoD positive: one minus the lowest false-positive rate of a threshold
    whose true-positive rate is at least ``tpr`` (scio's ``TNR(min_tpr=)``);
    ``1 - fpr_at_tpr(id_scores, ood_scores, tpr)``.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import tnr_at_tpr
    >>> tnr_at_tpr([0.1, 0.2, 0.6, 0.7], [0.5, 0.9], 0.95)
    0.5

    """
    limit = _check_rate(tpr, "tpr")
    fpr, rates = roc_curve(id_scores, ood_scores)
    return float(1.0 - fpr[rates >= limit - 1e-12].min())


_FUNCTIONS = {
    "AUROC": auroc,
    "AUPR-IN": aupr_in,
    "AUPR-OUT": aupr_out,
    "FPR95-ID": fpr_at_id_recall,
    "FPR95-OOD": fpr_at_ood_recall,
    "FPR95TPR": fpr_at_tpr,
}


def _partial_up_to(rate: float) -> Callable[[Scores, Scores], float]:
    return lambda i, o: partial_auroc(i, o, max_fpr=rate)


def _tpr_up_to(rate: float) -> Callable[[Scores, Scores], float]:
    return lambda i, o: tpr_at_fpr(i, o, rate)


def _tnr_from(rate: float) -> Callable[[Scores, Scores], float]:
    return lambda i, o: tnr_at_tpr(i, o, rate)


_PARAMETRISED: dict[str, tuple[Callable[[float], Callable[..., float]], str]] = {
    "pAUROC@": (
        _partial_up_to,
        (
            "the ROC area for FPR in [0, {x}], normalised (OoD positive); "
            "higher is better."
        ),
    ),
    "TPR@FPR": (
        _tpr_up_to,
        (
            "the fraction of OoD samples flagged while at most {x} of ID are; "
            "higher is better."
        ),
    ),
    "TNR@TPR": (
        _tnr_from,
        (
            "the fraction of ID samples kept while at least {x} of OoD are "
            "flagged; higher is better."
        ),
    ),
}
_PLAIN_EXTRA: dict[str, tuple[Callable[..., float], str]] = {
    "AUROC-CH": (
        convex_hull_auroc,
        "the area under the ROC curve's convex hull (OoD positive); higher is better.",
    ),
    "MCC": (
        mcc,
        (
            "the best Matthews correlation over thresholds (OoD positive); "
            "higher is better."
        ),
    ),
}
_NAME = re.compile(r"^(pAUROC@|TPR@FPR|TNR@TPR)(0(?:\.\d+)?|1(?:\.0+)?|\.\d+)$")
_HINT = (
    f"choose among {', '.join(ALL_METRICS)}, AUROC-CH, MCC, or a rate after "
    "pAUROC@, TPR@FPR or TNR@TPR (e.g. pAUROC@0.1, TPR@FPR0.05, TNR@TPR0.95)"
)


def metric_function(name: str) -> Callable[[Scores, Scores], float]:
    """Return the function ``f(id_scores, ood_scores) -> float`` of a metric name.

    Names: those of :data:`ALL_METRICS`, ``AUROC-CH`` (:func:`convex_hull_auroc`),
    ``MCC`` (:func:`mcc`), and a rate after ``pAUROC@`` (:func:`partial_auroc`
    up to that FPR), ``TPR@FPR`` (:func:`tpr_at_fpr`) or ``TNR@TPR``
    (:func:`tnr_at_tpr`).

    Raises
    ------
    ValueError
        For an unknown name, listing the known forms.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import metric_function
    >>> metric_function("TPR@FPR0.25")([0.1, 0.2, 0.6, 0.7], [0.5, 0.9])
    0.5

    """
    if name in _FUNCTIONS:
        return _FUNCTIONS[name]
    if name in _PLAIN_EXTRA:
        return _PLAIN_EXTRA[name][0]
    match = _NAME.match(name) if isinstance(name, str) else None
    if match is None:
        msg = f"unknown metric {name!r}; {_HINT}."
        raise ValueError(msg)
    prefix, rate = match.groups()
    return _PARAMETRISED[prefix][0](float(rate))


def _known(name: str) -> bool:
    return name in _FUNCTIONS or name in _PLAIN_EXTRA or bool(_NAME.match(name))


def describe_metric(name: str) -> str:
    """Return one line saying what metric ``name`` is (for tables' legends).

    Examples
    --------
    >>> from scio_recorder.ood.metrics import describe_metric
    >>> describe_metric("TNR@TPR0.95")
    'TNR@TPR0.95: the fraction of ID samples kept while at least 0.95 of OoD are flagged; higher is better.'

    """  # noqa: E501 (doctest output)
    metric_function(name)  # refuses an unknown name
    if name in _PLAIN_EXTRA:
        return f"{name}: {_PLAIN_EXTRA[name][1]}"
    match = _NAME.match(name)
    if match is None:
        return name
    prefix, rate = match.groups()
    return f"{name}: " + _PARAMETRISED[prefix][1].format(x=rate)


def ood_metrics(
    id_scores: Scores, ood_scores: Scores, *, names: Sequence[str] = METRICS
) -> dict[str, float]:
    """Return ``AUROC``, ``AUPR-IN``, ``AUPR-OUT`` and ``FPR95TPR`` (or ``names``).

    Parameters
    ----------
    id_scores, ood_scores : array_like or Tensor
        Scores of in-distribution and OoD samples (higher: more OoD).
    names : sequence of str, default :data:`METRICS`
        Which metrics, among :data:`ALL_METRICS` (``FPR95-ID``: ID positive,
        OpenOOD v1.5's FPR@95; ``FPR95-OOD``: OoD positive, equal to
        ``FPR95TPR``, OpenOOD's FPR@95 since August 2023) and the others
        :func:`metric_function` knows (``MCC``, ``pAUROC@0.1``, ...).

    Returns
    -------
    dict of str to float
        Keyed by ``names``, in order.

    Raises
    ------
    ValueError
        If a set is empty or holds NaN, or a name is unknown.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import ood_metrics
    >>> ood_metrics([0.0, 0.1], [0.9, 1.0])
    {'AUROC': 1.0, 'AUPR-IN': 1.0, 'AUPR-OUT': 1.0, 'FPR95TPR': 0.0}
    >>> ood_metrics([0.1, 0.2, 0.6, 0.7], [0.5, 0.9], names=["FPR95-ID", "FPR95-OOD"])
    {'FPR95-ID': 0.5, 'FPR95-OOD': 0.5}

    """
    check_metric_names(names, "ood_metrics: ")
    return {name: metric_function(name)(id_scores, ood_scores) for name in names}


def check_metric_names(names: Sequence[str], who: str = "") -> list[str]:
    """Return ``names`` as a list, or raise naming those :func:`metric_function` refuses.

    ``who`` prefixes the message (the function that was given them).

    Examples
    --------
    >>> check_metric_names(["AUROC", "FPR95"], "demo: ")
    Traceback (most recent call last):
    ...
    ValueError: demo: unknown metric 'FPR95'; choose among AUROC, AUPR-IN, AUPR-OUT, FPR95-ID, FPR95-OOD, FPR95TPR, AUROC-CH, MCC, or a rate after pAUROC@, TPR@FPR or TNR@TPR (e.g. pAUROC@0.1, TPR@FPR0.05, TNR@TPR0.95).

    """  # noqa: E501 (doctest output)
    unknown = [name for name in names if not _known(name)]
    if unknown:
        msg = f"{who}unknown metric {', '.join(map(repr, unknown))}; {_HINT}."
        raise ValueError(msg)
    return list(names)
