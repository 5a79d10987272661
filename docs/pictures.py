"""Make the pictures and the OoD tables the docs show: ``python docs/pictures.py``.

Everything is made from code and data in this repository (the digits ship
with the package; the blobs are generated), so anyone can remake it. Numbers
move a little with the machine, as training amplifies rounding (the
benchmark runs on one thread, so the core count does not matter). Needs the
``plot`` and ``graph`` extras and Graphviz's ``dot``.

* the real-data benchmark (``scio_recorder.ood.benchmark``, ``"digits"``):
  every detector, 5 seeds, ``images/ood-table.md``; the pictures
  ``scio-recorder demo`` draws (of its first seed's net, seed 0) as
  ``images/digits-*.png`` (the home page's);
* the hard case (``"blobs"``): every detector, 3 seeds,
  ``images/ood-table-blobs.md``; ``scores-shapes.png`` and
  ``roc-shapes.png``, and the Grad-CAM (``gradcam.png``) and execution
  graph (``graph.svg``) of the blobs CNN (``models.demo_model``) that the
  explain and graph pages show, all of seed 0's net.

Grad-CAM pictures name their layer from the layer table
(``scio_recorder.demo.gradcam_layer``: the last convolution), never by hand.
The pictures are of seed 0's net, drawn by a run of that seed alone (the
same net as the tables' first seed), so that they say "seed 0" and nothing
about a count of seeds that the tables beside them do not have. Score
histograms clip their tails to the 1 %-99 % quantiles (a few huge
distances would squash the rest into one bin).

``python docs/pictures.py --pictures`` remakes the pictures only (one seed
of each benchmark, a minute or two), not the tables.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from scio_recorder.demo import PICTURED, gradcam_layer, run_demo
from scio_recorder.explain import grad_cam
from scio_recorder.ood.benchmark import run_benchmark
from scio_recorder.plot import gradcam_overlay, roc_curves, score_histograms

IMAGES = Path(__file__).resolve().parent / "images"


def digits_pictures() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo(
            tmp, seed=0, seeds=1, echo=lambda _line: None, ood=("digits-6-9",)
        )
        for path in result.files:
            name = {
                "scores-digits-6-9.png": "digits-scores.png",
                "roc-digits-6-9.png": "digits-roc.png",
            }.get(path.name, f"digits-{path.name}")
            if path.suffix == ".png":
                shutil.copy(path, IMAGES / name)
                print(IMAGES / name)


def digits() -> str:
    digits_pictures()
    results = run_benchmark(seeds=(0, 1, 2, 3, 4), echo=print)
    return results.to_markdown(("AUROC", "FPR95-ID"))


def blobs_pictures(first: Any) -> None:
    """Draw the blobs benchmark's pictures, of its first seed's run."""
    shown = [name for name in PICTURED if name in first.results.detectors]
    # the distances' tails run to tens of thousands where the ID scores stay
    # below a hundred: the 1 %-99 % quantiles, on a scale linear within the
    # median magnitude and logarithmic beyond
    scores = score_histograms(
        first.results["shapes"], shown, clip=(0.01, 0.99), scale="symlog"
    )
    scores.supxlabel(f"the net of seed {first.seed}", fontsize="medium")
    scores.savefig(IMAGES / "scores-shapes.png", dpi=110)
    roc = roc_curves(first.results["shapes"], shown)
    roc.supxlabel(f"the net of seed {first.seed}", fontsize="medium")
    roc.savefig(IMAGES / "roc-shapes.png", dpi=110)
    print(IMAGES / "scores-shapes.png", IMAGES / "roc-shapes.png")


def blobs() -> str:
    results = run_benchmark(benchmark="blobs", seeds=(0, 1, 2), echo=print)
    first = results.runs[0]
    blobs_pictures(first)
    rnet = first.rnet
    images, labels = first.data.test[0][:8], first.data.test[1][:8]
    row, title = gradcam_layer(rnet)
    cams = grad_cam(rnet, images, layer=row.label)
    with torch.no_grad():
        predicted = rnet.net(images).argmax(1)
    fig = gradcam_overlay(
        images, cams, predicted=predicted, true=labels, layer=f"{title}, seed 0"
    )
    fig.savefig(IMAGES / "gradcam.png", dpi=110)
    with rnet.selecting("classifier.2", inputs="classifier.3"):
        rnet.graph().render(IMAGES / "graph.svg", expand_nested=True)
    return results.to_markdown(("AUROC", "FPR95-ID"))


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    if sys.argv[1:] == ["--pictures"]:
        digits_pictures()
        blobs_pictures(run_benchmark(benchmark="blobs", seeds=(0,), echo=print).runs[0])
        return 0
    table = digits()
    (IMAGES / "ood-table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    table = blobs()
    (IMAGES / "ood-table-blobs.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
