"""Data made in code: toy image classification sets and their OoD companions.

Nothing can be downloaded where the examples, tests and the demo run, so the
data they use is drawn here from a seeded generator, deterministically:

* :func:`make_blobs_images`: one coloured Gaussian blob per image, the class
  given by the hue; other families with the same positions, sizes and
  amplitudes serve as out-of-distribution (OoD) data (squares: an unseen
  shape; ``hue_shift``: unseen colours; ``noise``: no object at all);
* :func:`ood_sets`: the three OoD sets the demo and the docs use, from easy
  (noise) to hard (unseen colours);
* :func:`train_classifier`: a minimal training loop (the demo CNN learns the
  blobs in seconds on 2 cores);
* :func:`batches`: ``(images, labels)`` split into a list of batches, what
  :func:`~scio_recorder.collect.collect` and the detectors take.

And one small real data set, shipped with the package (no download, no
scikit-learn needed): :func:`load_digits`, the 1,797 8x8 hand-written digits
of scikit-learn's ``load_digits`` (UCI, BSD-3; see
``scio_recorder/_data/LICENSE-digits``), on which
:mod:`scio_recorder.ood.benchmark` runs its open-set benchmark.

Examples
--------
>>> from scio_recorder.data import make_blobs_images, ood_sets
>>> x, y = make_blobs_images(20, num_classes=4, image_size=16, seed=0)
>>> x.shape, y.tolist()[:6]
(torch.Size([20, 3, 16, 16]), [0, 1, 1, 3, 3, 2])
>>> sorted(ood_sets(8, image_size=16))
['colours', 'noise', 'shapes']

"""

from __future__ import annotations

__all__ = [
    "Pattern",
    "batches",
    "class_colours",
    "load_digits",
    "make_blobs_images",
    "ood_sets",
    "train_classifier",
]

import io
import math
from importlib import resources
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from ._net.quantized import refuse_gradients

Pattern = Literal["blob", "square", "noise"]
"""The families of images :func:`make_blobs_images` draws."""

_PATTERNS: tuple[str, ...] = ("blob", "square", "noise")


def class_colours(num_classes: int) -> Tensor:
    r"""Return the colour of each class: evenly spaced hues, zero-mean RGB.

    Class $c$ has the hue angle $\theta = 2 \pi c / C$ ($C$ =
    ``num_classes``) and the colour $(\cos \theta, \cos(\theta - 2 \pi / 3),
    \cos(\theta + 2 \pi / 3))$: its channels sum to zero and its norm is
    $\sqrt{3 / 2}$ for every class, so that classes differ by hue only, not
    by brightness.

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
    >>> from scio_recorder.data import class_colours
    >>> class_colours(3)
    tensor([[ 1.0000, -0.5000, -0.5000],
            [-0.5000,  1.0000, -0.5000],
            [-0.5000, -0.5000,  1.0000]])

    """
    if num_classes < 1:
        msg = f"num_classes must be at least 1, got {num_classes}"
        raise ValueError(msg)
    return _colours(num_classes, 0.0)


def _colours(num_classes: int, hue_shift: float) -> Tensor:
    steps = torch.arange(num_classes, dtype=torch.float64) + hue_shift
    theta = steps * (2 * math.pi / num_classes)
    shifts = torch.tensor([0.0, 2 * math.pi / 3, -2 * math.pi / 3], dtype=torch.float64)
    return torch.cos(theta[:, None] - shifts[None, :]).to(torch.float32)


def make_blobs_images(  # noqa: PLR0913 (keyword-only knobs of a data generator)
    num_samples: int,
    num_classes: int = 10,
    *,
    image_size: int = 32,
    pattern: Pattern = "blob",
    noise: float = 0.2,
    hue_shift: float = 0.0,
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
      deviation 1 (``noise`` is then ignored); labels carry no information;
    * ``hue_shift=0.5``: every hue moved half-way to the next class's, colours
      no class has (an unseen-colour family, same shapes).

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
    hue_shift : float, default 0.0
        Hue offset, in class steps (``0.5``: half-way between two classes).
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
    >>> from scio_recorder.data import make_blobs_images
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
    colours = _colours(num_classes, hue_shift)[labels]  # [n, 3]
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
    >>> from scio_recorder.data import train_classifier
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(200, 2)
    >>> y = (x[:, 0] > 0).long()
    >>> net = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> train_classifier(net, x, y, epochs=20, batch_size=32) > 0.95
    True
    >>> net.training
    False

    """
    refuse_gradients(net, "train_classifier")
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


def ood_sets(
    num_samples: int,
    num_classes: int = 10,
    *,
    image_size: int = 32,
    seed: int = 1,
) -> dict[str, Tensor]:
    """Return three out-of-distribution image sets for blobs of ``num_classes``.

    * ``"noise"``: pixel noise only (easy: no object at all);
    * ``"shapes"``: squares of the class colours (an unseen shape);
    * ``"colours"``: blobs of hues half-way between two classes (hard: the
      shape is known, and each colour lies between two known ones).

    Parameters
    ----------
    num_samples : int
        Images per set.
    num_classes : int, default 10
        The classes of the in-distribution blobs (sets the colours).
    image_size : int, default 32
        Side of the images.
    seed : int, default 1
        Seed (use another than the training data's).

    Returns
    -------
    dict of str to Tensor
        Set name -> images ``[num_samples, 3, image_size, image_size]``.

    Examples
    --------
    >>> from scio_recorder.data import ood_sets
    >>> {name: tuple(x.shape) for name, x in ood_sets(4, image_size=8).items()}
    {'noise': (4, 3, 8, 8), 'shapes': (4, 3, 8, 8), 'colours': (4, 3, 8, 8)}

    """
    n, c, size = num_samples, num_classes, image_size
    noise, _ = make_blobs_images(n, c, image_size=size, pattern="noise", seed=seed)
    shapes, _ = make_blobs_images(
        n, c, image_size=size, pattern="square", seed=seed + 1
    )
    colours, _ = make_blobs_images(n, c, image_size=size, hue_shift=0.5, seed=seed + 2)
    return {"noise": noise, "shapes": shapes, "colours": colours}


def batches(
    images: Tensor, labels: Tensor | None = None, batch_size: int = 256
) -> list[Tensor] | list[tuple[Tensor, Tensor]]:
    """Split a data set into a list of batches (with labels: ``(x, y)`` pairs).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.data import batches
    >>> [tuple(x.shape) for x, _ in batches(torch.zeros(5, 2), torch.zeros(5), 2)]
    [(2, 2), (2, 2), (1, 2)]

    """
    if batch_size < 1:
        msg = f"batch_size must be >= 1, got {batch_size}"
        raise ValueError(msg)
    parts = list(torch.split(images, batch_size))
    if labels is None:
        return parts
    return list(zip(parts, torch.split(labels, batch_size), strict=True))


def load_digits(*, normalize: bool = True) -> tuple[Tensor, Tensor]:
    """Return the 1,797 hand-written digits shipped with the package.

    The images and labels of scikit-learn's
    :func:`sklearn.datasets.load_digits` (the test set of the UCI "Optical
    Recognition of Handwritten Digits" data, Alpaydin & Kaynak, 1998; BSD
    3-Clause through scikit-learn, see ``scio_recorder/_data/LICENSE-digits``),
    stored in the package as ``_data/digits.npz`` (45 kB): no download and
    no scikit-learn needed. Each image is 8x8, a pixel counting the inked
    cells of a 4x4 block of the original 32x32 bitmap (0 to 16).

    Parameters
    ----------
    normalize : bool, default True
        Divide the pixels by 16 (values in ``[0, 1]``); ``False``: the
        counts 0..16 as stored (as scikit-learn's ``images``).

    Returns
    -------
    images : Tensor
        ``[1797, 1, 8, 8]``, float32 (one channel).
    labels : Tensor
        ``[1797]``, int64, the digit 0..9 (about 180 of each).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.data import load_digits
    >>> x, y = load_digits()
    >>> x.shape, x.dtype, float(x.min()), float(x.max())
    (torch.Size([1797, 1, 8, 8]), torch.float32, 0.0, 1.0)
    >>> torch.bincount(y).tolist()
    [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]

    """
    blob = resources.files("scio_recorder") / "_data" / "digits.npz"
    with np.load(io.BytesIO(blob.read_bytes())) as stored:
        pixels = torch.from_numpy(stored["images"].astype(np.float32))
        labels = torch.from_numpy(stored["labels"].astype(np.int64))
    images = pixels[:, None] / 16 if normalize else pixels[:, None]
    return images, labels
