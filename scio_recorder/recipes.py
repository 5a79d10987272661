"""Small helpers for the research recipes of ``docs/recipes/``.

The recipes run end to end on a laptop CPU in seconds, without downloads:
:func:`make_blobs_images` builds a toy image classification data set in code,
:func:`train_classifier` fits a small network on it (both live in
:mod:`scio_recorder.data` and are re-exported here). The out-of-distribution
(OoD) detection recipe uses the detectors of :mod:`scio_recorder.ood`
(:class:`~scio_recorder.ood.Mahalanobis`) and their metrics
(:mod:`scio_recorder.ood.metrics`); :func:`mahalanobis_scores` is the
detector's score written out from the statistics of
:class:`~scio_recorder.reduce.SharedCovariance`, with the opposite sign.

``auroc`` was removed from this module: it rated scores with the
in-distribution samples as positives, and returned ``1 - x`` where
:func:`scio_recorder.ood.metrics.auroc` returns ``x`` on the same lists.
Importing it raises an :class:`ImportError` that says what to use.

Examples
--------
>>> import torch
>>> from scio_recorder.recipes import make_blobs_images, mahalanobis_scores
>>> images, labels = make_blobs_images(6, num_classes=3, image_size=8, seed=0)
>>> images.shape, torch.bincount(labels).tolist()
(torch.Size([6, 3, 8, 8]), [2, 2, 2])
>>> means = torch.tensor([[0.0, 0.0], [4.0, 0.0]])
>>> scores = mahalanobis_scores(
...     torch.tensor([[0.0, 1.0], [9.0, 0.0]]), means, torch.eye(2)
... )
>>> scores.tolist()
[-1.0, -25.0]

"""

from __future__ import annotations

__all__ = [
    "Pattern",
    "class_colours",
    "mahalanobis_scores",
    "make_blobs_images",
    "train_classifier",
]

from typing import NoReturn

import torch
from torch import Tensor

from .data import Pattern, class_colours, make_blobs_images, train_classifier
from .ood._features import min_mahalanobis

_AUROC_REMOVED = (
    "scio_recorder.recipes.auroc was removed: it counted in-distribution "
    "samples as positives (higher score = more in-distribution) and so returned "
    "1 - x where scio_recorder.ood.metrics.auroc returns x on the same lists. "
    "Use `from scio_recorder.ood.metrics import auroc`: `auroc(id_scores, "
    "ood_scores)` counts OoD samples as positives (higher score = more OoD, the "
    "convention of every detector of scio_recorder.ood), i.e. it is the "
    "probability that an OoD sample scores higher than an in-distribution one. "
    "For confidence scores (higher = more in-distribution, as "
    "`mahalanobis_scores` returns), negate them: `auroc(-in_scores, "
    "-out_scores)` is the number the removed function gave."
)


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
    :class:`~scio_recorder.reduce.SharedCovarianceResult`. The detector
    :class:`scio_recorder.ood.Mahalanobis` scores ``-mahalanobis_scores``
    (higher = more OoD, the convention of :mod:`scio_recorder.ood` and of
    :func:`scio_recorder.ood.metrics.auroc`).

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


def __getattr__(name: str) -> NoReturn:
    """Raise for ``auroc`` (removed), as for any name.

    ``from scio_recorder.recipes import auroc`` raises :class:`ImportError`
    with the message, which names the replacement and its convention.
    """
    if name == "auroc":
        raise ImportError(_AUROC_REMOVED, name=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
