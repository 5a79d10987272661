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
  in-distribution recall, **ID as the positive class**, as OpenOOD and the
  ODIN and Energy papers report "FPR@95": the fraction of OoD samples scored
  at or below the threshold that keeps 95 % of the ID samples (OoD taken for
  ID). The default FPR of the results tables (:class:`~scio_recorder.ood.OoDResults`);
* ``FPR95-OOD`` (:func:`fpr_at_ood_recall`): the other convention, **OoD as
  the positive class**: the fraction of ID samples flagged as OoD at the
  threshold that flags 95 % of the OoD samples. ``FPR95TPR``
  (:func:`fpr_at_tpr`, :func:`ood_metrics`) is this one, under its old name.

The two FPRs differ in general (one counts OoD samples, the other ID
samples); name the convention when reporting one. An ``AUROC`` below 0.5
means a reversed ranking: the detector ranks ID samples above OoD ones.

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
    "fpr_at_id_recall",
    "fpr_at_ood_recall",
    "fpr_at_tpr",
    "ood_metrics",
    "roc_curve",
]

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy.typing as npt
    from torch import Tensor

    Scores = npt.ArrayLike | Tensor

METRICS = ("AUROC", "AUPR-IN", "AUPR-OUT", "FPR95TPR")
"""The names :func:`ood_metrics` returns by default, in order (``FPR95TPR``:
OoD positive, the same as ``FPR95-OOD``)."""

ALL_METRICS = ("AUROC", "AUPR-IN", "AUPR-OUT", "FPR95-ID", "FPR95-OOD", "FPR95TPR")
"""Every name :func:`ood_metrics` knows (``names=``)."""

TABLE_METRICS = ("AUROC", "FPR95-ID", "AUPR-IN", "AUPR-OUT")
"""The metrics a results table shows by default (FPR with ID positive, as
OpenOOD)."""


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
    last = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]  # ties grouped
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
    """Return the average precision of ``positives`` ranked above ``negatives``.

    ``sum_n (R_n - R_{n-1}) P_n`` over the distinct thresholds, as
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
    point reaching it). The same as :func:`fpr_at_ood_recall`; OpenOOD's
    "FPR@95" is the other convention, :func:`fpr_at_id_recall`.

    Examples
    --------
    >>> from scio_recorder.ood.metrics import fpr_at_tpr
    >>> fpr_at_tpr([0.1, 0.2, 0.6, 0.7], [0.5, 0.9], tpr=0.95)
    0.5

    """
    if not 0.0 < tpr <= 1.0:
        msg = f"tpr must be in (0, 1], got {tpr}"
        raise ValueError(msg)
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
    if not 0.0 < recall <= 1.0:
        msg = f"recall must be in (0, 1], got {recall}"
        raise ValueError(msg)
    return fpr_at_tpr(id_scores, ood_scores, recall)


def fpr_at_id_recall(
    id_scores: Scores, ood_scores: Scores, recall: float = 0.95
) -> float:
    """Return the fraction of OoD samples taken for ID at ``recall`` of the ID ones.

    **ID is the positive class** (``FPR95-ID``), the "FPR@95" of OpenOOD and
    of the ODIN and Energy papers: the threshold is the lowest one that keeps
    (scores at or below) at least a fraction ``recall`` of the ID samples,
    and the result is the fraction of OoD samples at or below it. (OpenOOD
    keeps the ``int(recall * n)`` lowest-scored ID samples, one fewer when
    ``recall * n`` is not an integer; the difference vanishes with ``n``.)

    Examples
    --------
    >>> from scio_recorder.ood.metrics import fpr_at_id_recall
    >>> fpr_at_id_recall([0.1, 0.2, 0.6, 0.7], [0.5, 0.9])
    0.5
    >>> fpr_at_id_recall([0.1, 0.2, 0.3], [0.25, 0.9], recall=2 / 3)
    0.0

    """
    if not 0.0 < recall <= 1.0:
        msg = f"recall must be in (0, 1], got {recall}"
        raise ValueError(msg)
    ind = _array(id_scores, "id_scores")
    ood = _array(ood_scores, "ood_scores")
    return fpr_at_tpr(-ood, -ind, recall)  # ID positive: negated scores


_FUNCTIONS = {
    "AUROC": auroc,
    "AUPR-IN": aupr_in,
    "AUPR-OUT": aupr_out,
    "FPR95-ID": fpr_at_id_recall,
    "FPR95-OOD": fpr_at_ood_recall,
    "FPR95TPR": fpr_at_tpr,
}


def ood_metrics(
    id_scores: Scores, ood_scores: Scores, *, names: Sequence[str] = METRICS
) -> dict[str, float]:
    """Return ``AUROC``, ``AUPR-IN``, ``AUPR-OUT`` and ``FPR95TPR`` (or ``names``).

    Parameters
    ----------
    id_scores, ood_scores : array_like or Tensor
        Scores of in-distribution and OoD samples (higher: more OoD).
    names : sequence of str, default :data:`METRICS`
        Which metrics, among :data:`ALL_METRICS`: ``FPR95-ID`` (ID positive,
        OpenOOD's FPR@95) and ``FPR95-OOD`` (OoD positive, equal to
        ``FPR95TPR``) name their convention.

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
    return {name: _FUNCTIONS[name](id_scores, ood_scores) for name in names}


def check_metric_names(names: Sequence[str], who: str = "") -> list[str]:
    """Return ``names`` as a list, or raise naming those not in :data:`ALL_METRICS`.

    ``who`` prefixes the message (the function that was given them).

    Examples
    --------
    >>> check_metric_names(["AUROC", "FPR95"], "demo: ")
    Traceback (most recent call last):
    ...
    ValueError: demo: unknown metric 'FPR95'; choose among AUROC, AUPR-IN, AUPR-OUT, FPR95-ID, FPR95-OOD, FPR95TPR.

    """  # noqa: E501 (doctest output)
    unknown = [name for name in names if name not in ALL_METRICS]
    if unknown:
        msg = (
            f"{who}unknown metric {', '.join(map(repr, unknown))}; "
            f"choose among {', '.join(ALL_METRICS)}."
        )
        raise ValueError(msg)
    return list(names)
