"""Small helpers for the research recipes of ``docs/recipes/``.

The recipes run end to end on a laptop CPU in seconds, without downloads:
:func:`make_blobs_images` builds a toy image classification data set in code,
:func:`train_classifier` fits a small network on it (both live in
:mod:`scio_recorder.data` and are re-exported here), and the out-of-distribution
(OoD) detection recipe scores samples with :func:`mahalanobis_scores` from the
per-class means and shared covariance that
:class:`~scio_recorder.reduce.SharedCovariance` computes, then rates the
detector with :func:`auroc`.

Examples
--------
>>> import torch
>>> from scio_recorder.recipes import auroc, make_blobs_images, mahalanobis_scores
>>> images, labels = make_blobs_images(6, num_classes=3, image_size=8, seed=0)
>>> images.shape, torch.bincount(labels).tolist()
(torch.Size([6, 3, 8, 8]), [2, 2, 2])
>>> means = torch.tensor([[0.0, 0.0], [4.0, 0.0]])
>>> scores = mahalanobis_scores(
...     torch.tensor([[0.0, 1.0], [9.0, 0.0]]), means, torch.eye(2)
... )
>>> scores.tolist()
[-1.0, -25.0]
>>> auroc([3.0, 2.0], [1.0, 2.0])
0.875

"""

from __future__ import annotations

__all__ = [
    "Pattern",
    "auroc",
    "class_colours",
    "mahalanobis_scores",
    "make_blobs_images",
    "train_classifier",
]

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from .data import Pattern, class_colours, make_blobs_images, train_classifier
from .ood._features import min_mahalanobis

if TYPE_CHECKING:
    import numpy.typing as npt


def mahalanobis_scores(
    features: Tensor, class_means: Tensor, shared_cov: Tensor
) -> Tensor:
    """Return the Mahalanobis confidence score of each sample (Lee et al. 2018).

    ``score(f) = -min_c (f - mu_c)^T S^+ (f - mu_c)``, with ``mu_c`` the class
    means, ``S`` the covariance shared by the classes and ``S^+`` its
    pseudo-inverse (the inverse when ``S`` is invertible; the pseudo-inverse,
    as the reference implementation's ``pinvh``, keeps dead features of a
    ReLU layer, whose variance is zero, from breaking the score). Higher
    means more in-distribution. This is the single-layer detector without
    input preprocessing; feed it the ``means`` and ``cov`` of a
    :class:`~scio_recorder.reduce.SharedCovarianceResult`.

    Computed in float64 on the device of ``features``, one class at a time
    (memory ``O(N F)``, no ``[N, C, F]`` tensor).

    Parameters
    ----------
    features : Tensor
        ``[N, F]``, or ``[N, ...]`` (flattened to ``[N, F]``).
    class_means : Tensor
        ``[C, F]``. Classes never seen in calibration (a zero count) should
        be dropped first, or they act as a class centred at their row.
    shared_cov : Tensor
        ``[F, F]``, symmetric positive semi-definite.

    Returns
    -------
    Tensor
        ``[N]``, float64; ``0`` for a sample at a class mean.

    Raises
    ------
    ValueError
        If the shapes do not match, or there is no class.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.recipes import mahalanobis_scores
    >>> means = torch.tensor([[0.0, 0.0], [10.0, 0.0]])
    >>> cov = torch.tensor([[4.0, 0.0], [0.0, 1.0]])
    >>> f = torch.tensor([[2.0, 0.0], [0.0, 2.0], [9.0, 1.0]])
    >>> mahalanobis_scores(f, means, cov)
    tensor([-1.0000, -4.0000, -1.2500], dtype=torch.float64)

    """
    flat = features.reshape(features.shape[0], -1).to(torch.float64)
    means = class_means.to(device=flat.device, dtype=torch.float64)
    cov = shared_cov.to(device=flat.device, dtype=torch.float64)
    num_features = flat.shape[1]
    is_matrix = means.dim() == 2  # noqa: PLR2004 (a matrix has two dims)
    if not is_matrix or means.shape[0] == 0 or means.shape[1] != num_features:
        msg = (
            f"mahalanobis_scores: class_means must be [C, {num_features}] with "
            f"C >= 1, got {list(means.shape)}"
        )
        raise ValueError(msg)
    if cov.shape != (num_features, num_features):
        msg = (
            f"mahalanobis_scores: shared_cov must be [{num_features}, "
            f"{num_features}], got {list(cov.shape)}"
        )
        raise ValueError(msg)
    precision = torch.linalg.pinv(cov, hermitian=True)
    return -min_mahalanobis(flat, means, precision)


def auroc(
    in_scores: npt.ArrayLike | Tensor, out_scores: npt.ArrayLike | Tensor
) -> float:
    """Return the area under the ROC curve of a detector, computed in numpy.

    In-distribution samples are the positives and a higher score means "more
    in-distribution": the AUROC is the probability that a random
    in-distribution sample scores higher than a random out-of-distribution
    one, ties counting one half (the Mann-Whitney statistic, computed from
    mid-ranks in ``O(n log n)``). 1 is a perfect detector, 0.5 chance.

    Parameters
    ----------
    in_scores : array_like or Tensor
        Scores of in-distribution samples (any shape; flattened).
    out_scores : array_like or Tensor
        Scores of out-of-distribution samples.

    Returns
    -------
    float
        The AUROC, in ``[0, 1]``.

    Raises
    ------
    ValueError
        If either set is empty, or a score is NaN.

    Examples
    --------
    >>> from scio_recorder.recipes import auroc
    >>> auroc([0.9, 0.8, 0.7], [0.1, 0.75])
    0.8333333333333334
    >>> auroc([1.0, 2.0], [1.0, 2.0])
    0.5

    """
    pos = _as_numpy(in_scores)
    neg = _as_numpy(out_scores)
    if pos.size == 0 or neg.size == 0:
        msg = "auroc: both score sets must be non-empty"
        raise ValueError(msg)
    scores = np.concatenate([pos, neg])
    if np.isnan(scores).any():
        msg = "auroc: scores must not be NaN"
        raise ValueError(msg)
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    # Mid-rank (1-based) of each distinct value: ranks of the tied block averaged.
    ends = np.cumsum(counts)
    mid_ranks = ends - (counts - 1) / 2.0
    rank_sum = float(mid_ranks[inverse[: pos.size]].sum())
    u = rank_sum - pos.size * (pos.size + 1) / 2.0
    return u / (pos.size * neg.size)


def _as_numpy(values: npt.ArrayLike | Tensor) -> npt.NDArray[np.float64]:
    if isinstance(values, Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)
