"""The benchmarks' data: the digits and the blobs, their splits and OoD sets.

:func:`load_benchmark` builds one seed's :class:`BenchmarkData` (what
:func:`~scio_recorder.ood.benchmark.run_benchmark` trains on and rates
against); the face, :mod:`scio_recorder.ood.benchmark`, says what each
benchmark holds.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from scio_recorder.data import (
    load_digits,
    make_blobs_images,
    ood_sets,
)
from scio_recorder.models import demo_model, digits_cnn

if TYPE_CHECKING:
    from torch import Tensor, nn


BENCHMARKS = ("digits", "blobs")
"""The benchmarks :func:`run_benchmark` knows: real digits, generated blobs."""

ID_DIGITS = 6
"""Digits ``0 .. ID_DIGITS - 1`` are in-distribution; the others near-OoD."""

NEAR = "near mean"
FAR = "far mean"


@dataclasses.dataclass
class BenchmarkData:
    """The data of one benchmark for one seed: training, ID test, OoD sets."""

    name: str
    """``"digits"`` or ``"blobs"``."""
    train: tuple[Tensor, Tensor]
    """Training images and labels (ID classes only)."""
    test: tuple[Tensor, Tensor]
    """ID test images and labels."""
    val: tuple[Tensor, Tensor]
    """A held-out ID split, for fits that need data the net did not train on
    (TempScale's temperature)."""
    near: dict[str, Tensor]
    """Near-OoD sets: name -> images."""
    far: dict[str, Tensor]
    """Far-OoD sets: name -> images."""
    num_classes: int
    """Number of ID classes (the net's logits)."""
    description: str
    """One line for the tables' head."""

    @property
    def input_size(self) -> tuple[int, ...]:
        """The shape of one input batch of one sample, for the ``Recorder``."""
        return (1, *self.train[0].shape[1:])

    def net(self) -> nn.Module:
        """Return a fresh, untrained net for this benchmark (seed torch first)."""
        if self.name == "digits":
            return digits_cnn(self.num_classes)
        return demo_model(self.num_classes)


def load_benchmark(
    name: str = "digits", *, seed: int = 0, quick: bool = False
) -> BenchmarkData:
    """Return the data of benchmark ``name`` for one seed.

    Parameters
    ----------
    name : {"digits", "blobs"}
        See the module's description.
    seed : int
        Seed of the split (digits), of the generated images and the noise.
    quick : bool
        Fewer generated images (blobs; the digits are small already).

    Returns
    -------
    BenchmarkData

    Raises
    ------
    ValueError
        For an unknown benchmark (naming the known ones).

    Examples
    --------
    >>> from scio_recorder.ood.benchmark import load_benchmark
    >>> data = load_benchmark("digits", seed=0)
    >>> len(data.train[0]), len(data.test[0]), data.num_classes, data.input_size
    (541, 361, 6, (1, 1, 8, 8))
    >>> {name: len(x) for name, x in {**data.near, **data.far}.items()}
    {'digits-6-9': 714, 'noise': 361, 'inverted': 361, 'rotated': 361}

    """
    if name == "digits":
        return _digits(seed)
    if name == "blobs":
        return _blobs(seed, quick=quick)
    msg = f"unknown benchmark {name!r}; choose among {list(BENCHMARKS)}"
    raise ValueError(msg)


def _digits(seed: int) -> BenchmarkData:
    images, labels = load_digits()
    gen = torch.Generator().manual_seed(seed)
    inside = torch.nonzero(labels < ID_DIGITS).flatten()
    inside = inside[torch.randperm(len(inside), generator=gen)]
    cut, held = len(inside) // 2, (2 * len(inside)) // 3
    train, val, test = inside[:cut], inside[cut:held], inside[held:]
    test_x = images[test]
    n = len(test)
    noise = torch.rand(n, *images.shape[1:], generator=gen)
    return BenchmarkData(
        name="digits",
        train=(images[train], labels[train]),
        test=(test_x, labels[test]),
        val=(images[val], labels[val]),
        near={"digits-6-9": images[labels >= ID_DIGITS]},
        far={
            "noise": noise,
            "inverted": 1 - test_x,
            "rotated": torch.rot90(test_x, 1, dims=(2, 3)),
        },
        num_classes=ID_DIGITS,
        description=(
            f"hand-written 8x8 digits (UCI, via scikit-learn): ID digits 0-"
            f"{ID_DIGITS - 1} ({len(train)} train, {len(val)} validation, {n} "
            f"test), near-OoD digits "
            f"{ID_DIGITS}-9; far-OoD uniform noise, inverted and rotated test digits"
        ),
    )


def _blobs(seed: int, *, quick: bool) -> BenchmarkData:
    n_train, n_test = (1000, 300) if quick else (3000, 1000)
    train = make_blobs_images(n_train, seed=seed)
    test = make_blobs_images(n_test, seed=seed + 100)
    sets = ood_sets(n_test, seed=seed + 200)
    return BenchmarkData(
        name="blobs",
        train=train,
        test=test,
        val=make_blobs_images(n_test // 3, seed=seed + 300),
        near={"shapes": sets["shapes"], "colours": sets["colours"]},
        far={"noise": sets["noise"]},
        num_classes=10,
        description=(
            f"generated coloured blobs, 10 classes ({n_train} train, {n_test} "
            "test); near-OoD squares of the class colours and blobs of unseen "
            "hues; far-OoD pixel noise"
        ),
    )
