"""Make the pictures and the OoD tables the docs show: ``python docs/pictures.py``.

Everything is made from code and data in this repository (the digits ship
with the package; the blobs are generated), so anyone can remake it. Numbers
move a little with the machine, as training amplifies rounding (the
benchmark runs on one thread, so the core count does not matter). Needs the
``plot`` and ``graph`` extras and Graphviz's ``dot``.

* the real-data benchmark (``scio_recorder.ood.benchmark``, ``"digits"``):
  every detector, 5 seeds, ``images/ood-table.md``; the demo's pictures of
  seed 0 as ``images/digits-*.png`` (the home page's);
* the hard case (``"blobs"``): every detector, 3 seeds,
  ``images/ood-table-blobs.md``; ``scores-shapes.png`` and
  ``roc-shapes.png``, and the demo CNN's Grad-CAM (``gradcam.png``) and
  execution graph (``graph.svg``) that the explain and graph pages show.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch

from scio_recorder.demo import PICTURED, run_demo
from scio_recorder.explain import grad_cam
from scio_recorder.ood.benchmark import run_benchmark
from scio_recorder.plot import gradcam_overlay, roc_curves, score_histograms

IMAGES = Path(__file__).resolve().parent / "images"


def digits() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo(tmp, seed=0, echo=lambda _line: None, ood=("digits-6-9",))
        for path in result.files:
            name = {
                "scores-digits-6-9.png": "digits-scores.png",
                "roc-digits-6-9.png": "digits-roc.png",
            }.get(path.name, f"digits-{path.name}")
            if path.suffix == ".png":
                shutil.copy(path, IMAGES / name)
                print(IMAGES / name)
    results = run_benchmark(seeds=(0, 1, 2, 3, 4), echo=print)
    return results.to_markdown(("AUROC", "FPR95-ID"))


def blobs() -> str:
    results = run_benchmark(benchmark="blobs", seeds=(0, 1, 2), echo=print)
    first = results.runs[0]
    shown = [name for name in PICTURED if name in first.results.detectors]
    for kind, draw in (("scores", score_histograms), ("roc", roc_curves)):
        path = IMAGES / f"{kind}-shapes.png"
        draw(first.results["shapes"], shown).savefig(path, dpi=110)
        print(path)
    rnet = first.rnet
    images = first.data.test[0][:8]
    cams = grad_cam(rnet, images, layer="features.3")
    with torch.no_grad():
        predicted = rnet.net(images).argmax(1).tolist()
    fig = gradcam_overlay(images, cams, titles=[f"class {c}" for c in predicted])
    fig.savefig(IMAGES / "gradcam.png", dpi=110)
    with rnet.selecting("classifier.2", inputs="classifier.3"):
        rnet.graph().render(IMAGES / "graph.svg", expand_nested=True)
    return results.to_markdown(("AUROC", "FPR95-ID"))


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    table = digits()
    (IMAGES / "ood-table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    table = blobs()
    (IMAGES / "ood-table-blobs.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
