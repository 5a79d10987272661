"""Make the pictures and the OoD table the docs show: ``python docs/pictures.py``.

Everything is made from code in this repository, on models built in code and
data generated in code, so anyone can remake it (seed 0; numbers move a
little with the machine and the thread count, as training amplifies
rounding). Needs the ``plot`` and ``graph`` extras and Graphviz's ``dot``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scio_recorder.data import batches, make_blobs_images, ood_sets
from scio_recorder.demo import run_demo
from scio_recorder.ood import (
    ASH,
    KNN,
    MSP,
    Energy,
    Entropy,
    GradNorm,
    Mahalanobis,
    MaxLogit,
    ReAct,
    Scale,
    ViM,
    evaluate,
    fit_detectors,
)

if TYPE_CHECKING:
    from scio_recorder import Recorder

IMAGES = Path(__file__).resolve().parent / "images"


def ood_table(rnet: Recorder) -> str:
    """Rate every detector against every OoD set; return the Markdown table."""
    train_x, train_y = make_blobs_images(3000, seed=0)
    test_x, _ = make_blobs_images(1000, seed=100)
    sets = ood_sets(1000, seed=200)
    detectors = {
        "MSP": MSP(rnet),
        "MaxLogit": MaxLogit(rnet),
        "Energy": Energy(rnet),
        "Entropy": Entropy(rnet),
        "ReAct": ReAct(rnet, layer="classifier.2"),
        "ASH": ASH(rnet, layer="classifier.2"),
        "Scale": Scale(rnet, layer="classifier.2"),
        "Mahalanobis": Mahalanobis(rnet),
        "KNN (k=10)": KNN(rnet, k=10),
        "ViM (d=16)": ViM(rnet, d=16),
        "GradNorm": GradNorm(rnet),
    }
    fit_detectors(detectors, batches(train_x, train_y, 256), target=1)
    results = evaluate(
        detectors,
        batches(test_x, None, 256),
        {name: batches(x, None, 256) for name, x in sets.items()},
        input=None,
    )
    names = list(results)
    lines = [
        "| detector | "
        + " | ".join(f"AUROC {n} | FPR95-OOD {n}" for n in names)
        + " |",
        "|---|" + "---:|---:|" * len(names),
    ]
    for detector in detectors:
        cells = [
            f"{r[detector]['AUROC']:.3f} | {r[detector]['FPR95TPR']:.3f}"
            for r in (results[n] for n in names)
        ]
        lines.append(f"| {detector} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    result = run_demo(IMAGES, seed=0, echo=lambda _line: None)
    for path in result.files:
        print(path)
    table = ood_table(result.rnet)
    (IMAGES / "ood-table.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
