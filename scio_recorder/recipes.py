"""Small helpers for the research recipes of ``docs/recipes/``.

The recipes run end to end on a laptop CPU in seconds, without downloads:
:func:`make_blobs_images` builds a toy image classification data set in code,
:func:`train_classifier` fits a small network on it, and the out-of-distribution
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

import math
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    import numpy.typing as npt

Pattern = Literal["blob", "square", "noise"]
"""The families of images :func:`make_blobs_images` draws."""

_PATTERNS: tuple[str, ...] = ("blob", "square", "noise")


def class_colours(num_classes: int) -> Tensor:
    """Return the colour of each class: evenly spaced hues, zero-mean RGB.

    Class ``c`` has the hue angle ``theta = 2 pi c / num_classes`` and the
    colour ``(cos theta, cos(theta - 2 pi / 3), cos(theta + 2 pi / 3))``: its
    channels sum to zero and its norm is ``sqrt(3 / 2)`` for every class, so
    that classes differ by hue only, not by brightness.

    Parameters
    ----------
    num_classes : int
        Number of classes (at least 1).

    Returns
    -------
    Tensor
        ``[num_classes, 3]``, float32.

    Raises
    ------
    ValueError
        If ``num_classes < 1``.

    Examples
    --------
    >>> from scio_recorder.recipes import class_colours
    >>> class_colours(3)
    tensor([[ 1.0000, -0.5000, -0.5000],
            [-0.5000,  1.0000, -0.5000],
            [-0.5000, -0.5000,  1.0000]])

    """
    if num_classes < 1:
        msg = f"num_classes must be at least 1, got {num_classes}"
        raise ValueError(msg)
    theta = torch.arange(num_classes, dtype=torch.float64) * (2 * math.pi / num_classes)
    shifts = torch.tensor([0.0, 2 * math.pi / 3, -2 * math.pi / 3], dtype=torch.float64)
    return torch.cos(theta[:, None] - shifts[None, :]).to(torch.float32)


def make_blobs_images(  # noqa: PLR0913 (keyword-only knobs of a data generator)
    num_samples: int,
    num_classes: int = 10,
    *,
    image_size: int = 32,
    pattern: Pattern = "blob",
    noise: float = 0.2,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Draw a toy image classification data set: one coloured blob per image.

    Each image of class ``c`` holds one Gaussian blob of the colour
    :func:`class_colours` gives class ``c`` (so the class is the hue), at a
    random position (centre uniform in the middle half of the image), with a
    random width (standard deviation between 8 % and 16 % of the side) and a
    random amplitude (between 0.8 and 1.2), plus independent Gaussian pixel
    noise of standard deviation ``noise``. Labels are balanced (each class
    appears ``num_samples // num_classes`` or one more times) and shuffled.

    Other families, with the same classes, positions, widths and amplitudes,
    serve as out-of-distribution data:

    * ``pattern="square"``: a uniformly coloured square of side four widths
      instead of the blob (a held-out shape family, same colours);
    * ``pattern="noise"``: no object at all, only pixel noise of standard
      deviation 1 (``noise`` is then ignored); labels carry no information.

    Everything is drawn from a :class:`torch.Generator` seeded with ``seed``,
    so a call is deterministic: the same arguments give the same tensors.

    Parameters
    ----------
    num_samples : int
        Number of images.
    num_classes : int, default 10
        Number of classes.
    image_size : int, default 32
        Side of the square images, in pixels.
    pattern : {"blob", "square", "noise"}, default "blob"
        The family of images (see above).
    noise : float, default 0.2
        Standard deviation of the pixel noise added to blobs and squares.
    seed : int, default 0
        Seed of the random generator.

    Returns
    -------
    images : Tensor
        ``[num_samples, 3, image_size, image_size]``, float32.
    labels : Tensor
        ``[num_samples]``, int64 class labels in ``[0, num_classes)``.

    Raises
    ------
    ValueError
        If a size is not positive, ``noise`` is negative or ``pattern`` is
        unknown.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.recipes import make_blobs_images
    >>> x, y = make_blobs_images(1000, seed=1)
    >>> x.shape, x.dtype, y.dtype
    (torch.Size([1000, 3, 32, 32]), torch.float32, torch.int64)
    >>> torch.bincount(y).tolist()
    [100, 100, 100, 100, 100, 100, 100, 100, 100, 100]
    >>> again, _ = make_blobs_images(1000, seed=1)
    >>> torch.equal(x, again)
    True
    >>> noise, _ = make_blobs_images(1000, pattern="noise")
    >>> round(noise.std().item(), 2)
    1.0

    """
    if num_samples < 0 or num_classes < 1 or image_size < 1:
        msg = (
            "make_blobs_images: num_samples must be >= 0, num_classes and "
            f"image_size >= 1; got {num_samples}, {num_classes}, {image_size}"
        )
        raise ValueError(msg)
    if noise < 0:
        msg = f"make_blobs_images: noise must be >= 0, got {noise}"
        raise ValueError(msg)
    if pattern not in _PATTERNS:
        msg = f"make_blobs_images: pattern must be one of {_PATTERNS}, got {pattern!r}"
        raise ValueError(msg)
    gen = torch.Generator().manual_seed(seed)
    n = num_samples
    labels = (torch.arange(n) % num_classes)[torch.randperm(n, generator=gen)]
    centres = (0.25 + 0.5 * torch.rand(n, 2, generator=gen)) * image_size
    widths = (0.08 + 0.08 * torch.rand(n, 1, 1, generator=gen)) * image_size
    amplitudes = 0.8 + 0.4 * torch.rand(n, 1, 1, generator=gen)
    pixel_noise = torch.randn(n, 3, image_size, image_size, generator=gen)
    if pattern == "noise":
        return pixel_noise, labels

    grid = torch.arange(image_size, dtype=torch.float32) + 0.5
    dy = grid[None, :, None] - centres[:, 0, None, None]  # [n, H, 1]
    dx = grid[None, None, :] - centres[:, 1, None, None]  # [n, 1, W]
    if pattern == "blob":
        shape = torch.exp(-(dy**2 + dx**2) / (2 * widths**2))
    else:  # a square of side 4 widths
        inside = (dy.abs() <= 2 * widths) & (dx.abs() <= 2 * widths)
        shape = inside.to(torch.float32)
    colours = class_colours(num_classes)[labels]  # [n, 3]
    images = (amplitudes * shape)[:, None] * colours[:, :, None, None]
    return images + noise * pixel_noise, labels


def train_classifier(  # noqa: PLR0913 (keyword-only training knobs)
    net: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    epochs: int = 5,
    batch_size: int = 64,
    lr: float = 1e-2,
    seed: int = 0,
) -> float:
    """Fit ``net`` to ``(images, labels)`` with Adam and the cross-entropy loss.

    A minimal loop for the recipes: mini-batches in an order drawn from a
    generator seeded with ``seed``, ``epochs`` passes, the network left in
    evaluation mode at the end.

    Parameters
    ----------
    net : nn.Module
        A classifier returning logits ``[batch, num_classes]``; trained in
        place.
    images : Tensor
        Training inputs, ``[num_samples, ...]``.
    labels : Tensor
        Integer class labels, ``[num_samples]``.
    epochs : int, default 5
        Passes over the data.
    batch_size : int, default 64
        Samples per optimiser step.
    lr : float, default 1e-2
        Adam's learning rate.
    seed : int, default 0
        Seed of the shuffling order.

    Returns
    -------
    float
        The accuracy of the trained network on the training data (evaluation
        mode, no gradient).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder.recipes import train_classifier
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(200, 2)
    >>> y = (x[:, 0] > 0).long()
    >>> net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> train_classifier(net, x, y, epochs=20, batch_size=32) > 0.95
    True
    >>> net.training
    False

    """
    gen = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=gen)
        for index in torch.split(order, batch_size):
            optimiser.zero_grad()
            loss = loss_fn(net(images[index]), labels[index])
            loss.backward()
            optimiser.step()
    net.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), 256):
            logits = net(images[start : start + 256])
            correct += int((logits.argmax(1) == labels[start : start + 256]).sum())
    return correct / max(len(images), 1)


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
    best = torch.full((flat.shape[0],), math.inf, dtype=torch.float64)
    best = best.to(flat.device)
    for mean in means:
        centred = flat - mean
        distance = ((centred @ precision) * centred).sum(1)
        best = torch.minimum(best, distance)
    return -best


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
