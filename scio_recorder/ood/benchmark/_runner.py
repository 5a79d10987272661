"""The benchmark's runner: the catalogue of detectors for a net, and the seeds' runs.

:func:`catalogue` builds every detector of :mod:`scio_recorder.ood` for a
trained net; :func:`run_benchmark` trains, fits and evaluates them for each
seed and gathers a :class:`~scio_recorder.ood.benchmark.BenchmarkResults`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder.data import (
    batches,
    train_classifier,
)
from scio_recorder.ood._calibration import TempScale
from scio_recorder.ood._catalogue import DETECTORS, Classifier
from scio_recorder.ood._evaluate import evaluate
from scio_recorder.ood._passes import fit_detectors
from scio_recorder.recorder import Recorder

from ._data import BENCHMARKS, load_benchmark
from ._results import BenchmarkResults, BenchmarkRun

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scio_recorder.ood._protocol import Detector


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
    (42, ['MSP', 'MaxLogit', 'Energy', 'Entropy'])

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
