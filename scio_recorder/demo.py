"""The end-to-end demo: train a small CNN, detect OoD inputs, explain, draw.

:func:`run_demo` is what ``scio-recorder demo`` runs, and what makes the
pictures of the docs (``docs/pictures.py``): on data generated in code
(:mod:`scio_recorder.data`), it trains the demo CNN for a few seconds, wraps
it in a :class:`~scio_recorder.Recorder`, fits several detectors with one
pass over the training data (:func:`~scio_recorder.ood.fit_detectors`),
rates them against two OoD sets (:func:`~scio_recorder.ood.evaluate`), and
writes pictures: score histograms, ROC curves, a Grad-CAM overlay and the
execution graph. Deterministic for a given seed on a given machine.
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
from .data import batches, make_blobs_images, ood_sets, train_classifier
from .explain import grad_cam
from .models import demo_model
from .ood import ASH, KNN, MSP, Energy, Mahalanobis, ReAct, evaluate, fit_detectors
from .recorder import Recorder

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .ood import Evaluation

OOD_SETS = ("noise", "shapes")
"""The OoD sets the demo rates detectors against (easy, then hard)."""


@dataclasses.dataclass
class DemoResult:
    """What :func:`run_demo` measured and wrote."""

    accuracy: float
    """Test accuracy of the trained CNN."""
    evaluations: Mapping[str, Evaluation]
    """OoD set -> the detectors' metrics (and scores): an ``OoDResults``."""
    files: list[Path]
    """The pictures written."""
    seconds: dict[str, float]
    """Time per step."""
    rnet: Recorder = dataclasses.field(repr=False)
    """The wrapped, trained CNN."""

    def _cells(self) -> tuple[list[str], list[list[str]]]:
        sets = list(self.evaluations)
        header = ["detector"]
        for name in sets:
            header += [f"AUROC {name}", f"FPR95 {name}"]
        rows = []
        for detector in self.evaluations[sets[0]]:
            cells = [detector]
            for name in sets:
                metrics = self.evaluations[name][detector]
                cells += [f"{metrics['AUROC']:.3f}", f"{metrics['FPR95TPR']:.3f}"]
            rows.append(cells)
        return header, rows

    def table(self) -> str:
        """Return AUROC and FPR@95 of every detector and OoD set, in Markdown."""
        header, rows = self._cells()
        lines = [
            "| " + " | ".join(header) + " |",
            "|---|" + "---:|" * (len(header) - 1),
        ]
        lines += ["| " + " | ".join(cells) + " |" for cells in rows]
        return "\n".join(lines)

    def to_text(self) -> str:
        """Return :meth:`table` as aligned plain text, for a terminal.

        Examples
        --------
        >>> import torch
        >>> from scio_recorder.ood import Evaluation
        >>> scores = {"MSP": torch.tensor([0.0, 1.0])}, {"MSP": torch.tensor([2.0])}
        >>> result = DemoResult(
        ...     0.9, {"noise": Evaluation(*scores, "noise")}, [], {}, None
        ... )
        >>> print(result.to_text())
        detector  AUROC noise  FPR95 noise
        MSP             1.000        0.000

        """
        header, rows = self._cells()
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        return "\n".join(
            "  ".join(
                [cells[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            )
            for cells in [header, *rows]
        )


def run_demo(
    out: str | Path | None = "scio-demo",
    *,
    seed: int = 0,
    quick: bool = False,
    echo: Callable[[str], Any] = print,
    ood: tuple[str, ...] = OOD_SETS,
) -> DemoResult:
    """Run the demo: data, training, detectors, metrics, pictures.

    Parameters
    ----------
    out : path or None
        Folder for the pictures (made if missing); ``None``: no pictures.
    seed : int
        Seed of the data, the weights and the training order.
    quick : bool
        Fewer samples and epochs (a smoke run, a few seconds).
    echo : callable
        Where progress and results are written (``print`` by default).
    ood : tuple of str
        The OoD sets of :func:`~scio_recorder.data.ood_sets` to rate against.

    Returns
    -------
    DemoResult

    Examples
    --------
    >>> result = run_demo(None, quick=True, echo=lambda line: None)
    >>> list(result.evaluations), list(result.evaluations["noise"])[:3]
    (['noise', 'shapes'], ['MSP', 'Energy', 'ReAct'])

    """
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    n_train, n_test, epochs = (1000, 300, 2) if quick else (3000, 1000, 4)
    torch.manual_seed(seed)
    train_x, train_y = make_blobs_images(n_train, seed=seed)
    test_x, test_y = make_blobs_images(n_test, seed=seed + 100)
    sets = ood_sets(n_test, seed=seed + 200)
    unknown = [name for name in ood if name not in sets]
    if unknown:
        msg = f"unknown OoD set {unknown}; the sets are {sorted(sets)}"
        raise ValueError(msg)
    echo(
        f"data: {n_train} training and {n_test} test images of coloured blobs "
        f"(10 classes, 32x32), OoD sets {', '.join(ood)} ({n_test} each)"
    )
    seconds["data"] = time.perf_counter() - start

    step = time.perf_counter()
    net = demo_model(num_classes=10)
    echo(f"training the demo CNN ({epochs} epochs)...")
    train_classifier(net, train_x, train_y, epochs=epochs, seed=seed)
    with torch.no_grad():
        accuracy = float((net(test_x).argmax(1) == test_y).float().mean())
    echo(f"test accuracy {accuracy:.3f}")
    seconds["train"] = time.perf_counter() - step

    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    echo(rnet.compact())

    step = time.perf_counter()
    detectors = {
        "MSP": MSP(rnet),
        "Energy": Energy(rnet),
        "ReAct": ReAct(rnet, layer="classifier.2"),
        "ASH": ASH(rnet, layer="classifier.2"),
        "Mahalanobis": Mahalanobis(rnet),
        "KNN": KNN(rnet, k=10),
    }
    echo("fitting ReAct, Mahalanobis and KNN with one pass over the training data...")
    fit_detectors(detectors, batches(train_x, train_y, 256), target=1)
    seconds["fit"] = time.perf_counter() - step

    step = time.perf_counter()
    evaluations = evaluate(
        detectors,
        batches(test_x, None, 256),
        {name: batches(sets[name], None, 256) for name in ood},
        input=None,
    )
    seconds["evaluate"] = time.perf_counter() - step
    result = DemoResult(accuracy, evaluations, [], seconds, rnet)
    echo("\nOoD detection (higher AUROC, lower FPR@95TPR: better)\n" + result.to_text())

    if out is not None:
        step = time.perf_counter()
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        result.files = _pictures(rnet, evaluations, test_x[:8], folder, echo)
        seconds["pictures"] = time.perf_counter() - step
    seconds["total"] = time.perf_counter() - start
    echo(f"\ndone in {seconds['total']:.1f} s")
    return result


def _pictures(
    rnet: Recorder,
    evaluations: Mapping[str, Evaluation],
    images: torch.Tensor,
    folder: Path,
    echo: Callable[[str], Any],
) -> list[Path]:
    files: list[Path] = []
    if importlib.util.find_spec("matplotlib") is None:
        hint = install_hint("plot", "matplotlib")
        echo(f"no pictures of scores and Grad-CAM: {hint}")
    else:
        from .plot import gradcam_overlay, roc_curves, score_histograms  # noqa: PLC0415 (optional)

        for name, evaluation in evaluations.items():
            path = folder / f"scores-{name}.png"
            score_histograms(evaluation).savefig(path, dpi=110)
            files.append(path)
            path = folder / f"roc-{name}.png"
            roc_curves(evaluation).savefig(path, dpi=110)
            files.append(path)
        cams = grad_cam(rnet, images, layer="features.3")
        with torch.no_grad():
            predicted = rnet.net(images).argmax(1).tolist()
        fig = gradcam_overlay(images, cams, titles=[f"class {c}" for c in predicted])
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
