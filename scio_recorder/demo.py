"""The end-to-end demo: train a small CNN on real digits, detect OoD, explain, draw.

:func:`run_demo` is what ``scio-recorder demo`` runs, and what makes the
pictures of the docs (``docs/pictures.py``): the open-set digits benchmark
of :mod:`scio_recorder.ood.benchmark` (real data shipped with the package,
no download: digits 0-5 in-distribution, digits 6-9 near-OoD; noise,
inverted and rotated digits far-OoD). For each of three seeds it trains the
digits CNN in about a second, wraps it in a :class:`~scio_recorder.Recorder`,
fits the detectors of :data:`DETECTORS` (``detectors=None``, the CLI's
``--all``: every detector of :mod:`scio_recorder.ood`) with one shared pass
over the training data, and rates them (:func:`~scio_recorder.ood.evaluate`);
it prints AUROC and FPR@95 (ID positive, OpenOOD v1.5's) as mean ± std over the
seeds, and writes pictures of the first seed: score histograms, ROC
curves, a Grad-CAM overlay and the execution graph. Deterministic for a
given seed on a given machine.
"""

from __future__ import annotations

__all__ = ["DemoResult", "gradcam_layer", "run_demo"]

import dataclasses
import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._support.extras import INSTALL_DOT, install_hint
from .data import load_digits
from .explain import grad_cam
from .ood.benchmark import CATALOGUE, ID_DIGITS, BenchmarkResults, run_benchmark

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .layers import Layer
    from .ood import OoDResults
    from .ood.benchmark import BenchmarkRun
    from .recorder import Recorder

OOD_SETS = ("digits-6-9", "noise", "inverted", "rotated")
"""The OoD sets of the digits benchmark (near, then far), all rated."""

DRAWN = ("digits-6-9",)
"""The OoD sets pictured by default: the near one, where detectors differ
(drawing the score histograms of every set took a third of the demo's time)."""

PICTURED = (
    "MSP",
    "Energy",
    "ReAct",
    "KNN",
    "ViM",
    "RMDS",
    "Mahalanobis",
    "MahalanobisEnsemble",
)
"""The detectors drawn in the score histograms and ROC curves."""

SEEDS = 3
"""Seeds the demo runs (one with ``quick``)."""

SLOW = ("NAC", "RankFeat", "AdaScale", "Trust", "IsoMax", "FeatureSqueezing", "Odds")
"""The catalogue's detectors the demo leaves out unless asked (``--all``).

Each costs more than a second per seed on two cores, with passes (or a fit)
of its own: ``Odds`` (32 noisy passes of every sample, to fit and to score:
a third of the whole catalogue's time), ``AdaScale``, ``IsoMax`` (1,000
optimiser steps), ``Trust``, ``RankFeat``, ``NAC`` and ``FeatureSqueezing``.
Without them the demo runs in about half the time (``--all`` takes 1.6x to
2.2x as long; ``docs/cli.md`` has the figures)."""

DETECTORS = tuple(name for name in CATALOGUE if name not in SLOW)
"""The detectors the demo rates by default: the catalogue but :data:`SLOW`
(35 of 42, every family represented), in the catalogue's order."""


@dataclasses.dataclass
class DemoResult:
    """What :func:`run_demo` measured and wrote."""

    accuracy: float
    """Test accuracy of the trained CNN (the mean over the seeds)."""
    evaluations: OoDResults
    """The first seed's results: OoD set -> the detectors' metrics and scores."""
    files: list[Path]
    """The pictures written."""
    seconds: dict[str, float]
    """Time per step."""
    rnet: Recorder = dataclasses.field(repr=False)
    """The first seed's wrapped, trained CNN."""
    benchmark: BenchmarkResults | None = dataclasses.field(default=None, repr=False)
    """Every seed's results: ``mean ± std`` tables."""

    def table(self) -> str:
        """Return AUROC and FPR95-ID (mean ± std over the seeds) as Markdown."""
        if self.benchmark is not None:
            return self.benchmark.to_markdown(("AUROC", "FPR95-ID"))
        return self.evaluations.to_markdown(("AUROC", "FPR95-ID"))


def run_demo(  # noqa: PLR0913 (keyword-only knobs)
    out: str | Path | None = "scio-demo",
    *,
    seed: int = 0,
    quick: bool = False,
    echo: Callable[[str], Any] = print,
    ood: tuple[str, ...] = DRAWN,
    seeds: int | None = None,
    detectors: Sequence[str] | None = DETECTORS,
) -> DemoResult:
    """Run the demo: real digits, training, detectors, metrics, pictures.

    Parameters
    ----------
    out : path or None
        Folder for the pictures (made if missing); ``None``: no pictures.
    seed : int
        The first seed (of the split, the weights, the training order, the
        noise); the others follow it (``seed + 1``, ...).
    quick : bool
        One seed, fewer epochs, pictures of the first set of ``ood`` only (a
        smoke run, a few seconds).
    echo : callable
        Where progress and results are written (``print`` by default).
    ood : tuple of str
        The OoD sets to draw score histograms and ROC curves of, among
        :data:`OOD_SETS` (default :data:`DRAWN`, the near set; all four are
        rated either way).
    seeds : int, optional
        How many seeds (default 3; 1 with ``quick``).
    detectors : sequence of str, optional
        The catalogue's detectors to rate (default :data:`DETECTORS`, all but
        the slowest); ``None``: every one (the CLI's ``--all``).

    Returns
    -------
    DemoResult

    Raises
    ------
    ValueError
        For an unknown OoD set in ``ood`` (naming the sets).

    Examples
    --------
    >>> result = run_demo(None, quick=True, echo=lambda line: None)
    >>> list(result.evaluations)
    ['digits-6-9', 'noise', 'inverted', 'rotated']
    >>> len(result.evaluations.detectors), result.evaluations.detectors[:3]
    (35, ['MSP', 'MaxLogit', 'Energy'])

    """
    unknown = [name for name in ood if name not in OOD_SETS]
    if unknown:
        msg = f"unknown OoD set {unknown}; the digits benchmark has {list(OOD_SETS)}"
        raise ValueError(msg)
    start = time.perf_counter()
    count = seeds if seeds is not None else (1 if quick else SEEDS)
    echo(
        f"open-set benchmark on real hand-written digits (8x8, shipped with the "
        f"package): digits 0-{ID_DIGITS - 1} in-distribution, {ID_DIGITS}-9 "
        f"near-OoD; noise, inverted and rotated digits far-OoD; {count} seed(s)"
    )
    which = (
        f"fit {len(detectors)} of the catalogue's {len(CATALOGUE)} detectors "
        "(--all: every one)"
        if detectors is not None
        else f"fit every detector of the catalogue ({len(CATALOGUE)})"
    )
    echo(f"per seed: train the digits CNN, {which} with one shared pass, rate")
    benchmark = run_benchmark(
        None if detectors is None else list(detectors),
        seeds=tuple(range(seed, seed + count)),
        quick=quick,
        echo=echo,
    )
    first = benchmark.runs[0]
    seconds = {
        key: sum(run.seconds[key] for run in benchmark.runs) for key in first.seconds
    }
    echo(first.rnet.compact())
    echo(
        "\nOoD detection (higher AUROC, lower FPR95-ID: better)\n"
        + benchmark.to_text(("AUROC", "FPR95-ID"))
    )
    result = DemoResult(
        accuracy=sum(benchmark.accuracy) / len(benchmark.accuracy),
        evaluations=first.results,
        files=[],
        seconds=seconds,
        rnet=first.rnet,
        benchmark=benchmark,
    )
    if out is not None:
        step = time.perf_counter()
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        drawn = ood[:1] if quick else ood
        result.files = _pictures(first, drawn, folder, echo, count)
        seconds["pictures"] = time.perf_counter() - step
    seconds["total"] = time.perf_counter() - start
    echo(f"\ndone in {seconds['total']:.1f} s")
    return result


def gradcam_layer(rnet: Recorder) -> tuple[Layer, str]:
    """Return the row of the last convolution of ``rnet``'s table, and its title.

    The layer the demo's Grad-CAM picture is of, found in the layer table
    (never named by hand), and the words that name it: qualified name,
    label and type.

    Raises
    ------
    ValueError
        If the net has no ``nn.Conv2d`` call (naming the net).

    Examples
    --------
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import digits_cnn
    >>> row, title = gradcam_layer(Recorder(digits_cnn(6), input_size=(1, 1, 8, 8)))
    >>> row.name, title
    ('features.5', 'features.5 (2-6, Conv2d: the last convolution)')

    """
    convs = [
        row
        for row in rnet.table.rows
        if row.recordable and isinstance(row.module, nn.Conv2d)
    ]
    if not convs:
        msg = (
            f"{type(rnet.net).__name__} has no nn.Conv2d call to draw the "
            "Grad-CAM of; print(rnet.compact()) lists its layers"
        )
        raise ValueError(msg)
    row = convs[-1]
    words = "the last convolution" if len(convs) > 1 else "its convolution"
    title = f"{row.name} ({row.label_str}, {type(row.module).__name__}: {words})"
    return row, title


def _gradcam_picture(run: BenchmarkRun, overlay: Callable[..., Any]) -> Any:
    """Draw Grad-CAM of the last convolution on four test and four unseen digits.

    Each panel names the true digit and the prediction; the digit's outline
    is drawn over the heat, so it stays readable.
    """
    rnet = run.rnet
    row, title = gradcam_layer(rnet)
    test_x, test_y = run.data.test
    # one of each unseen digit, from the set the near-OoD images come from
    digits, labels = load_digits()
    unseen = torch.stack(
        [torch.nonzero(labels == digit)[0, 0] for digit in range(ID_DIGITS, 10)]
    )[:4]
    images = torch.cat([test_x[:4], digits[unseen]])
    true = [*test_y[:4].tolist(), *labels[unseen].tolist()]
    cams = grad_cam(rnet, images, layer=row.label)  # upsampled to the 8 x 8 input
    with torch.no_grad():
        predicted = rnet.net(images).argmax(1).tolist()
    titles = [
        f"{'test' if digit < ID_DIGITS else 'unseen'} digit {digit}: predicted {guess}"
        for digit, guess in zip(true, predicted, strict=True)
    ]
    return overlay(images, cams, titles=titles, alpha=0.6, layer=title, outline=True)


def _pictures(
    run: BenchmarkRun,
    ood: tuple[str, ...],
    folder: Path,
    echo: Callable[[str], Any],
    seeds: int,
) -> list[Path]:
    rnet, evaluations = run.rnet, run.results
    files: list[Path] = []
    seed = f"the net of seed {run.seed}"
    if seeds > 1:
        seed += f" (the first of {seeds}; the printed table: mean ± std over them)"
    if importlib.util.find_spec("matplotlib") is None:
        hint = install_hint("plot", "matplotlib")
        echo(f"no pictures of scores and Grad-CAM: {hint}")
    else:
        from .plot import gradcam_overlay, roc_curves, score_histograms  # noqa: PLC0415 (optional)

        shown = [name for name in PICTURED if name in evaluations.detectors]
        for name in ood:
            # the histograms span the 1 %-99 % quantiles: a few huge
            # distances would squash every other score into one bin
            figures = (
                (
                    "scores",
                    score_histograms(evaluations[name], shown, clip=(0.01, 0.99)),
                ),
                ("roc", roc_curves(evaluations[name], shown)),
            )
            for kind, fig in figures:
                # on two lines: one would be cut off at both sides
                fig.supxlabel(seed.replace(" (", "\n("), fontsize="medium")
                path = folder / f"{kind}-{name}.png"
                fig.savefig(path, dpi=110)
                files.append(path)
        fig = _gradcam_picture(run, gradcam_overlay)
        fig.suptitle(f"{fig.get_suptitle()}\nthe net of seed {run.seed}")
        path = folder / "gradcam.png"
        fig.savefig(path, dpi=110)
        files.append(path)
    # the layers the detectors read, highlighted
    with rnet.selecting("classifier.2", inputs="classifier.3"):
        graph = rnet.graph()
    try:
        path = graph.render(folder / "graph.svg", expand_nested=True)
    except RuntimeError as error:
        path = folder / "graph.dot"
        path.write_text(graph.to_dot(expand_nested=True), encoding="utf-8")
        why = (
            "for SVG, install Graphviz's `dot` program: `apt-get install "
            "graphviz`, `conda install graphviz` or `brew install graphviz`"
            if str(error) == INSTALL_DOT
            else str(error)
        )
        echo(f"execution graph written as DOT ({why})")
    files.append(path)
    echo(f"pictures of {seed}:\n" + "\n".join(f"  {p}" for p in files))
    return files
