"""An OpenOOD-style benchmark on data that needs no download.

:func:`run_benchmark` follows the protocol of OpenOOD's tables (Zhang et al.,
2023): a classifier is trained on the in-distribution (ID) classes, every
detector is fitted on the training data and rated against **near-OoD** sets
(semantic shift: classes the net never saw, images of the same kind) and
**far-OoD** sets (other kinds of images), with the means over each group;
the whole (split, weights, training order, OoD draws) is repeated for
several seeds, and every number is reported as its mean and spread across
the seeds.

Two benchmarks, both built from data in the package:

* ``"digits"`` (the default, real data): the 1,797 8x8 hand-written digits
  of :func:`scio_recorder.data.load_digits` as an **open set**: digits 0-5
  are ID (two thirds for training, one third for testing, split per seed),
  digits 6-9 are the near-OoD set; far-OoD: uniform noise, and the ID test
  digits inverted (``1 - x``) and rotated by 90 degrees. The net is
  :func:`scio_recorder.models.digits_cnn` (6 logits).
* ``"blobs"`` (generated, a hard case): the coloured blobs of
  :func:`scio_recorder.data.make_blobs_images` on
  :func:`scio_recorder.models.demo_model`; near-OoD: squares of the class
  colours (``"shapes"``) and blobs of unseen hues (``"colours"``);
  far-OoD: pixel noise. The squares carry more colour than any blob and so
  give *larger* logits: logit-based scores rank them as more ID than the
  test blobs (AUROC < 0.5: a reversed ranking).

:func:`catalogue` builds every detector of :mod:`scio_recorder.ood` for a
trained net, with the layers it reads named for that net.

Examples
--------
>>> from scio_recorder.ood.benchmark import run_benchmark
>>> results = run_benchmark(["MSP", "MahalanobisEnsemble"], seeds=(0, 1), quick=True)
>>> results.columns
['digits-6-9', 'noise', 'inverted', 'rotated', 'near mean', 'far mean']
>>> len(results.values("MSP", "far mean", "AUROC"))  # one per seed
2
>>> results.mean("MahalanobisEnsemble", "far mean", "AUROC") > 0.95
True
>>> print(results.to_text(["AUROC"], columns=["far mean"]))  # doctest: +ELLIPSIS
OoD benchmark 'digits': 2 detectors, 2 seeds (0, 1); mean ± std over the seeds ...
...
AUROC
detector                  far mean
MSP                  0.6... ± 0.1...
MahalanobisEnsemble  0.99... ± 0.00...

"""

from __future__ import annotations

__all__ = [
    "BENCHMARKS",
    "CATALOGUE",
    "BenchmarkData",
    "BenchmarkResults",
    "catalogue",
    "load_benchmark",
    "run_benchmark",
]

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._render import metric_table
from scio_recorder.data import (
    batches,
    load_digits,
    make_blobs_images,
    ood_sets,
    train_classifier,
)
from scio_recorder.models import demo_model, digits_cnn
from scio_recorder.recorder import Recorder

from ._calibration import TempScale
from ._catalogue import DETECTORS, Classifier
from ._evaluate import OoDResults, evaluate, legend
from ._passes import fit_detectors
from .metrics import check_metric_names

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch import Tensor, nn

    from ._protocol import Detector

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


def catalogue(
    rnet: Recorder,
    *,
    penultimate: str = "classifier.2",
    blocks: Sequence[str] = ("features.3", "features.6"),
    d: int | None = None,
) -> dict[str, Detector]:
    """Return every detector of :mod:`scio_recorder.ood`, built for ``rnet``.

    Detectors that read the logits or the last ``nn.Linear`` (``fc=``) find
    them themselves; the others read:

    * ``penultimate``: the layer whose activations ReAct, ASH, Scale, VRA and
      AdaScale edit (the ReLU before the last ``nn.Linear``);
    * ``blocks``: feature maps of the convolutional part, for RankFeat (one
      edited pass per block), Gram (these blocks), MahalanobisEnsemble,
      NAC, DkNN and JTLA (these blocks and ``penultimate``: 2-3 layers);
    * ``d``: the principal subspace of ViM and Residual (default half the
      penultimate width), NECO's is the number of classes.

    The defaults fit :func:`~scio_recorder.models.digits_cnn`; for
    :func:`~scio_recorder.models.demo_model` pass
    ``blocks=("features.1", "features.4")``. Other hyperparameters are the
    detectors' defaults, except ``KNN(k=10)`` (the paper's 50 is for 50,000
    training images; the digits have 541), and for the scores without a
    default: ``LID(k=10)``, ``Trust(alpha=0.1)``, ``DkNN(k=10)``,
    ``JTLA(test={"type": "multinomial", "k": 10})``,
    ``FeatureSqueezing(squeezers=["bits:3", "median:2"])`` (the paper's for
    MNIST-like images: a bit depth of 3, a 2 x 2 median), and
    ``Odds(epsilon=0.1, noise_samples=32)`` (noise a tenth of the digits'
    ``[0, 1]`` range; 32 draws, an eighth of the paper's 256, as each draw
    is a forward pass of every sample, to fit and to score).

    Parameters
    ----------
    rnet : Recorder
        The trained classifier, wrapped.
    penultimate : str
        The label or name of the penultimate activation.
    blocks : sequence of str
        Two (or three) feature maps, shallow to deep.
    d : int, optional
        ViM's and Residual's principal dimensions.

    Returns
    -------
    dict of str to Detector
        Class name -> unfitted detector, in the order of the docs' table;
        ``"Mahalanobis++"`` and ``"RMDS++"`` are ``normalize=True``.

    Examples
    --------
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import digits_cnn
    >>> from scio_recorder.ood.benchmark import catalogue
    >>> detectors = catalogue(Recorder(digits_cnn(6), input_size=(1, 1, 8, 8)))
    >>> len(detectors), list(detectors)[:4]
    (39, ['MSP', 'MaxLogit', 'Energy', 'Entropy'])

    """
    linears = [m for m in rnet.net.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        msg = "catalogue: the net has no nn.Linear; its detectors read the last one"
        raise ValueError(msg)
    width, logits = linears[-1].in_features, linears[-1].out_features
    net = Classifier(
        rnet,
        penultimate=penultimate,
        blocks=tuple(blocks),
        d=d if d is not None else width // 2,
        logits=logits,
    )
    return {name: make(net) for name, make in DETECTORS}


@dataclasses.dataclass
class BenchmarkRun:
    """One seed of a benchmark: the trained net and its results."""

    seed: int
    accuracy: float
    """The net's closed-set accuracy on the ID test data."""
    results: OoDResults
    """Every detector against every OoD set, with near/far means."""
    seconds: dict[str, float]
    """Time per step: ``data``, ``train``, ``fit``, ``evaluate``."""
    rnet: Recorder = dataclasses.field(repr=False)
    """The trained net, wrapped."""
    data: BenchmarkData = dataclasses.field(repr=False)
    """The data of this seed."""


class BenchmarkResults:
    """Every detector x OoD set (and group mean), over several seeds.

    ``values(detector, column, metric)`` lists one number per seed;
    :meth:`mean` and :meth:`std` (the sample standard deviation, ``n - 1``
    in the denominator; 0 for a single seed) summarise them. A group mean
    (``"near mean"``, ``"far mean"``) is taken per seed over the group's
    sets, then summarised over the seeds, as in OpenOOD. Prints as aligned
    tables (``str``), one per metric, cells ``mean ± std``;
    :meth:`to_markdown` gives the same as Markdown.

    Attributes
    ----------
    benchmark : str
        The benchmark's name.
    runs : list of BenchmarkRun
        One per seed, in order; ``runs[i].results`` is that seed's
        :class:`~scio_recorder.ood.OoDResults` (with the scores, for plots).
    """

    def __init__(
        self, benchmark: str, runs: Sequence[BenchmarkRun], description: str = ""
    ) -> None:
        """Check that every run has the same detectors and sets."""
        if not runs:
            msg = "BenchmarkResults needs at least one run (one seed)"
            raise ValueError(msg)
        self.benchmark = benchmark
        self.runs = list(runs)
        self.description = description
        first = self.runs[0].results
        for run in self.runs[1:]:
            if (
                run.results.detectors != first.detectors
                or run.results.columns != first.columns
            ):
                msg = (
                    f"BenchmarkResults: seed {run.seed} has detectors "
                    f"{run.results.detectors} and columns {run.results.columns}, "
                    f"seed {self.runs[0].seed} {first.detectors} and {first.columns}"
                )
                raise ValueError(msg)

    @property
    def seeds(self) -> list[int]:
        """The seeds, one per run."""
        return [run.seed for run in self.runs]

    @property
    def detectors(self) -> list[str]:
        """The detectors' names, in order."""
        return self.runs[0].results.detectors

    @property
    def columns(self) -> list[str]:
        """The OoD sets, then the group means (``near mean``, ``far mean``)."""
        return self.runs[0].results.columns

    @property
    def groups(self) -> dict[str, list[str]]:
        """Group name -> its sets."""
        return self.runs[0].results.groups

    @property
    def accuracy(self) -> list[float]:
        """The net's closed-set accuracy on the ID test data, per seed."""
        return [run.accuracy for run in self.runs]

    def values(self, detector: str, column: str, metric: str) -> list[float]:
        """Return ``metric`` of ``detector`` on a set or group, one per seed.

        Raises
        ------
        KeyError
            Naming the unknown detector, column or metric, and the known ones.
        """
        return [run.results.value(detector, column, metric) for run in self.runs]

    def mean(self, detector: str, column: str, metric: str) -> float:
        """Return the mean over the seeds of :meth:`values`."""
        return _mean(self.values(detector, column, metric))

    def std(self, detector: str, column: str, metric: str) -> float:
        """Return the sample standard deviation over the seeds (0 for one seed)."""
        return _std(self.values(detector, column, metric))

    def _cells(self, metric: str, columns: Sequence[str]) -> list[list[str]]:
        return [
            [
                name,
                *(_cell(self.values(name, c, metric)) for c in columns),
            ]
            for name in self.detectors
        ]

    def _columns(self, columns: Sequence[str] | None) -> list[str]:
        chosen = self.columns if columns is None else list(columns)
        unknown = [c for c in chosen if c not in self.columns]
        if unknown:
            msg = f"unknown columns {unknown}; the results have {self.columns}"
            raise ValueError(msg)
        return chosen

    def _metrics(self, metrics: Sequence[str]) -> list[str]:
        return check_metric_names(metrics)

    def _head(self, metrics: Sequence[str]) -> list[str]:
        seeds = ", ".join(map(str, self.seeds))
        groups = "; ".join(f"{g} = {', '.join(s)}" for g, s in self.groups.items())
        acc = self.accuracy
        spread = (
            "one run: no spread over seeds (run several for mean ± std)"
            if len(self.runs) < 2  # noqa: PLR2004 (a spread needs two runs)
            else "mean ± std over the seeds (sample std, n - 1)"
        )
        count = f"{len(self.runs)} seed{'s' if len(self.runs) > 1 else ''}"
        lines = [
            (
                f"OoD benchmark {self.benchmark!r}: {len(self.detectors)} detectors, "
                f"{count} ({seeds}); {spread}"
            ),
        ]
        if self.description:
            lines.append(self.description)
        lines.append(
            f"closed-set accuracy on the ID test data {_cell(acc)}"
            + (f"; groups: {groups}" if groups else "")
        )
        lines += [line for m in metrics for line in legend(m).split("\n")]
        return lines

    def to_text(
        self,
        metrics: Sequence[str] = ("AUROC", "FPR95-ID"),
        columns: Sequence[str] | None = None,
    ) -> str:
        """Return one aligned plain-text table per metric, cells ``mean ± std``.

        Parameters
        ----------
        metrics : sequence of str, default ("AUROC", "FPR95-ID")
            Among :data:`~scio_recorder.ood.metrics.ALL_METRICS` and the others
            :func:`~scio_recorder.ood.metrics.metric_function` knows (``MCC``,
            ``pAUROC@0.1``, ...); the legend names each one's convention
            (``FPR95-ID``: ID positive, OpenOOD v1.5's).
        columns : sequence of str, optional
            Sets and groups to show; default all (:attr:`columns`).
        """
        metrics = self._metrics(metrics)
        shown = self._columns(columns)
        out = self._head(metrics)
        for metric in metrics:
            table = metric_table(["detector", *shown], self._cells(metric, shown))
            out += ["", metric, *table]
        return "\n".join(out)

    def to_markdown(
        self,
        metrics: Sequence[str] = ("AUROC", "FPR95-ID"),
        columns: Sequence[str] | None = None,
    ) -> str:
        """Return one Markdown table per metric (legend first), as :meth:`to_text`."""
        metrics = self._metrics(metrics)
        shown = self._columns(columns)
        out = [f"{line}  " for line in self._head(metrics)]
        for metric in metrics:
            out += ["", f"**{metric}** (mean ± std over {len(self.runs)} seeds)", ""]
            out += metric_table(
                ["detector", *shown], self._cells(metric, shown), markdown=True
            )
        return "\n".join(out)

    def __str__(self) -> str:
        """Return :meth:`to_text`."""
        return self.to_text()

    def __repr__(self) -> str:
        """Show the benchmark, the seeds and the detectors."""
        return (
            f"BenchmarkResults({self.benchmark!r}, seeds={self.seeds}, "
            f"columns={self.columns}, detectors={self.detectors})"
        )


def _cell(values: Sequence[float]) -> str:
    if len(values) < 2:  # noqa: PLR2004 (one run: no spread to show)
        return f"{_mean(values):.3f}"
    return f"{_mean(values):.3f} ± {_std(values):.3f}"


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:  # noqa: PLR2004 (a spread needs two values)
        return 0.0
    mean = _mean(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def run_benchmark(  # noqa: PLR0913 (the protocol's knobs, keyword-only)
    detectors: Sequence[str]
    | Mapping[str, Callable[[Recorder], Detector]]
    | None = None,
    *,
    benchmark: str = "digits",
    seeds: Sequence[int] = (0, 1, 2),
    epochs: int | None = None,
    quick: bool = False,
    echo: Callable[[str], Any] | None = None,
    threads: int | None = 1,
) -> BenchmarkResults:
    """Train, fit and rate detectors on a benchmark, for several seeds.

    For each seed: the benchmark's data (:func:`load_benchmark`), a fresh
    net (``torch.manual_seed(seed)``) trained with
    :func:`~scio_recorder.data.train_classifier`, every detector fitted with
    one shared pass over the training data
    (:func:`~scio_recorder.ood.fit_detectors`, labels given) and rated by
    :func:`~scio_recorder.ood.evaluate` against the near- and far-OoD sets
    (passes shared). ``TempScale`` is fitted on a held-out ID split
    (``BenchmarkData.val``: on the training data, which the net fits
    perfectly, the NLL has no minimum); where the net classifies all of it
    correctly too, it keeps ``T = 1`` (MSP's scores) for that seed, and says
    so through ``echo``. Deterministic for a seed on a given machine.

    Parameters
    ----------
    detectors : sequence of str, or mapping of str to callable, optional
        ``None``: the whole :func:`catalogue`; names: those of the
        catalogue; a mapping name -> ``f(rnet) -> Detector``: your own,
        built anew for each seed's net.
    benchmark : {"digits", "blobs"}, default "digits"
        See :data:`BENCHMARKS` and the module's description.
    seeds : sequence of int, default (0, 1, 2)
        One run per seed.
    epochs : int, optional
        Training epochs (default 30 for the digits, 4 for the blobs; a
        third with ``quick``).
    quick : bool
        Fewer epochs (and fewer generated images): a smoke run.
    echo : callable, optional
        Where progress lines go (e.g. ``print``); default nowhere.
    threads : int or None, default 1
        ``torch.set_num_threads`` during the run, restored after; ``None``:
        leave it. The nets are tiny: intra-op threads only add overhead
        (on a busy machine two threads made a training step of the digits
        CNN 40 times slower than one), and one thread makes the numbers
        independent of the machine's core count.

    Returns
    -------
    BenchmarkResults

    Raises
    ------
    ValueError
        For no seed, an unknown benchmark, or an unknown detector name
        (naming the catalogue's).

    Examples
    --------
    >>> from scio_recorder.ood import KNN
    >>> from scio_recorder.ood.benchmark import run_benchmark
    >>> results = run_benchmark(
    ...     {"KNN k=5": lambda rnet: KNN(rnet, k=5)}, seeds=(0,), quick=True
    ... )
    >>> results.detectors, results.seeds, results.std("KNN k=5", "noise", "AUROC")
    (['KNN k=5'], [0], 0.0)

    """
    if benchmark not in BENCHMARKS:
        msg = f"unknown benchmark {benchmark!r}; choose among {list(BENCHMARKS)}"
        raise ValueError(msg)
    if not seeds:
        msg = "run_benchmark needs at least one seed, e.g. seeds=(0, 1, 2)"
        raise ValueError(msg)
    if detectors is not None and not isinstance(detectors, Mapping):
        detectors = list(detectors)
        known = CATALOGUE
        unknown = [name for name in detectors if name not in known]
        if unknown:
            msg = f"unknown detectors {unknown}; the catalogue has {list(known)}"
            raise ValueError(msg)
    say = echo if echo is not None else _quiet
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        runs = [
            _run(benchmark, seed, detectors, epochs=epochs, quick=quick, echo=say)
            for seed in seeds
        ]
    finally:
        torch.set_num_threads(before)
    return BenchmarkResults(benchmark, runs, runs[0].data.description)


def _quiet(_line: str) -> None:
    return None


def _run(  # noqa: PLR0913
    benchmark: str,
    seed: int,
    detectors: list[str] | Mapping[str, Callable[[Recorder], Detector]] | None,
    *,
    epochs: int | None,
    quick: bool,
    echo: Callable[[str], Any],
) -> BenchmarkRun:
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    data = load_benchmark(benchmark, seed=seed, quick=quick)
    seconds["data"] = time.perf_counter() - start

    step = time.perf_counter()
    torch.manual_seed(seed)
    net = data.net()
    n_epochs = epochs if epochs is not None else _EPOCHS[benchmark]
    if quick and epochs is None:
        n_epochs = max(1, n_epochs // 3)
    train_x, train_y = data.train
    train_classifier(
        net, train_x, train_y, epochs=n_epochs, batch_size=32, lr=3e-3, seed=seed
    )
    test_x, test_y = data.test
    with torch.no_grad():
        accuracy = float((net(test_x).argmax(1) == test_y).float().mean())
    seconds["train"] = time.perf_counter() - step

    rnet = Recorder(net, input_size=data.input_size)
    layers = _LAYERS[benchmark]
    if detectors is None or not isinstance(detectors, Mapping):
        built = catalogue(rnet, **layers)
        if detectors is not None:
            built = {name: built[name] for name in detectors}
    else:
        built = {name: make(rnet) for name, make in detectors.items()}
    step = time.perf_counter()
    held_out = {k: v for k, v in built.items() if isinstance(v, TempScale)}
    fit_detectors(
        {k: v for k, v in built.items() if k not in held_out},
        batches(train_x, train_y, 128),
        target=1,
    )
    # TempScale on the training data, which the net fits perfectly, has no
    # NLL minimum: it is fitted on the held-out split instead
    for name, detector in held_out.items():
        try:
            detector.fit(batches(*data.val, 128), target=1)
        except ValueError as error:  # noqa: PERF203 (one fit per detector)
            if "NLL keeps decreasing" not in str(error):
                raise
            # every held-out sample classified right: no finite temperature
            built[name] = TempScale(rnet, t=1.0)
            echo(
                f"seed {seed}: {name}: the net classifies every held-out sample "
                "correctly, so the NLL has no minimum (T -> 0); T = 1 (MSP) kept"
            )
    seconds["fit"] = time.perf_counter() - step

    step = time.perf_counter()
    results = evaluate(
        built,
        batches(test_x, test_y, 256),
        {
            name: [(x,) for x in batches(x, None, 256)]
            for name, x in {**data.near, **data.far}.items()
        },
        target=1,
        near=list(data.near),
        far=list(data.far),
    )
    seconds["evaluate"] = time.perf_counter() - step
    echo(
        f"seed {seed}: accuracy {accuracy:.3f}, {len(built)} detectors; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
    )
    return BenchmarkRun(seed, accuracy, results, seconds, rnet, data)


_EPOCHS = {"digits": 30, "blobs": 4}
_LAYERS: dict[str, dict[str, Any]] = {
    "digits": {"penultimate": "classifier.2", "blocks": ("features.3", "features.6")},
    "blobs": {"penultimate": "classifier.2", "blocks": ("features.1", "features.4")},
}
CATALOGUE = tuple(name for name, _ in DETECTORS)
"""The names of :func:`catalogue`'s detectors, in its order (what
:func:`run_benchmark` takes by name)."""
