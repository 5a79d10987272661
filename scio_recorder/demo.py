"""The end-to-end demo: train a small CNN on real digits, detect OoD, explain, draw.

:func:`run_demo` is what ``scio-recorder demo`` runs, and what makes the
pictures of the docs (``docs/pictures.py``): the open-set digits benchmark
of :mod:`scio_recorder.ood.benchmark` (real data shipped with the package,
no download: digits 0-5 in-distribution, digits 6-9 near-OoD; noise,
inverted and rotated digits far-OoD). For each of three seeds it trains the
digits CNN in about a second, wraps it in a :class:`~scio_recorder.Recorder`,
fits every detector of :mod:`scio_recorder.ood` with one shared pass over
the training data, and rates them (:func:`~scio_recorder.ood.evaluate`);
it prints AUROC and FPR@95 (ID positive, OpenOOD's) as mean ± std over the
seeds, and writes pictures of the first seed: score histograms, ROC
curves, a Grad-CAM overlay and the execution graph. Deterministic for a
given seed on a given machine.
"""

from __future__ import annotations

__all__ = ["DemoResult", "run_demo"]

import dataclasses
import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ._extras import INSTALL_DOT, install_hint
from .explain import grad_cam
from .ood.benchmark import ID_DIGITS, BenchmarkResults, run_benchmark

if TYPE_CHECKING:
    from collections.abc import Callable

    from .ood import OoDResults
    from .ood.benchmark import BenchmarkRun
    from .recorder import Recorder

OOD_SETS = ("digits-6-9", "noise", "inverted", "rotated")
"""The OoD sets of the digits benchmark (near, then far), pictured by default."""

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
    ood: tuple[str, ...] = OOD_SETS,
    seeds: int | None = None,
) -> DemoResult:
    """Run the demo: real digits, training, every detector, metrics, pictures.

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
        The OoD sets to draw score histograms and ROC curves of (all are
        rated): among :data:`OOD_SETS`.
    seeds : int, optional
        How many seeds (default 3; 1 with ``quick``).

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
    (28, ['MSP', 'MaxLogit', 'Energy'])

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
    echo(
        "per seed: train the digits CNN, fit every detector with one shared pass, rate"
    )
    benchmark = run_benchmark(
        seeds=tuple(range(seed, seed + count)), quick=quick, echo=echo
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
        result.files = _pictures(first, drawn, folder, echo)
        seconds["pictures"] = time.perf_counter() - step
    seconds["total"] = time.perf_counter() - start
    echo(f"\ndone in {seconds['total']:.1f} s")
    return result


def _pictures(
    run: BenchmarkRun,
    ood: tuple[str, ...],
    folder: Path,
    echo: Callable[[str], Any],
) -> list[Path]:
    rnet, evaluations = run.rnet, run.results
    files: list[Path] = []
    if importlib.util.find_spec("matplotlib") is None:
        hint = install_hint("plot", "matplotlib")
        echo(f"no pictures of scores and Grad-CAM: {hint}")
    else:
        from .plot import gradcam_overlay, roc_curves, score_histograms  # noqa: PLC0415 (optional)

        shown = [name for name in PICTURED if name in evaluations.detectors]
        for name in ood:
            path = folder / f"scores-{name}.png"
            score_histograms(evaluations[name], shown).savefig(path, dpi=110)
            files.append(path)
            path = folder / f"roc-{name}.png"
            roc_curves(evaluations[name], shown).savefig(path, dpi=110)
            files.append(path)
        # four test digits (ID) and four digits 6-9 (near-OoD)
        images = torch.cat([run.data.test[0][:4], run.data.near["digits-6-9"][:4]])
        cams = grad_cam(rnet, images, layer="features.3")  # 8 x 8, the input's
        with torch.no_grad():
            predicted = rnet.net(images).argmax(1).tolist()
        true = [*run.data.test[1][:4].tolist(), *[None] * 4]  # unseen: no ID class
        titles = [
            f"ID digit {t}: predicted {c}"
            if t is not None
            else f"unseen digit (6-9): predicted {c}"
            for t, c in zip(true, predicted, strict=True)
        ]
        fig = gradcam_overlay(
            images, cams, titles=titles, alpha=0.6, layer="features.3 (the last conv)"
        )
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
        why = "install graphviz for SVG" if str(error) == INSTALL_DOT else str(error)
        echo(f"execution graph written as DOT ({why})")
    files.append(path)
    echo("pictures:\n" + "\n".join(f"  {p}" for p in files))
    return files
