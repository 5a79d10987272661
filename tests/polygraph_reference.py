"""Run lm-polygraph 0.7.0's estimators on arrays written by the parity tests.

Run by ``tests/test_ood_polygraph.py`` in an interpreter where lm-polygraph
is installed (``$LM_POLYGRAPH_PYTHON``): ``python polygraph_reference.py
FOLDER`` reads ``FOLDER/inputs.npz`` and writes ``FOLDER/outputs.npz``.
Nothing of this project is imported here: lm-polygraph (MIT) is the oracle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def main(folder: Path) -> None:
    """Score the inputs with each estimator; save the scores."""
    from lm_polygraph.estimators import (  # noqa: PLC0415 (run under LM_POLYGRAPH_PYTHON only)
        AttentionScore,
        EigenScore,
        MahalanobisDistanceSeq,
        RelativeMahalanobisDistanceSeq,
    )

    data = np.load(folder / "inputs.npz")
    out = {}
    samples = data["samples"]  # [N, K, d]
    out["eigen"] = EigenScore(alpha=float(data["alpha"]))(
        {"sample_embeddings": list(samples)}
    )
    lengths = data["lengths"]
    attentions = [data[f"attention_{i}"] for i in range(len(lengths))]
    out["attention"] = AttentionScore(layer=int(data["layer"]))(
        {
            "forwardpass_attention_weights": attentions,
            "greedy_tokens": [[0] * int(n) for n in lengths],
        }
    )
    stats = {
        "embeddings_decoder": data["test"],
        "train_embeddings_decoder": data["train"],
        "background_train_embeddings_decoder": data["background"],
    }
    out["md"] = MahalanobisDistanceSeq("decoder")(stats)
    out["rmd"] = RelativeMahalanobisDistanceSeq("decoder")(stats)
    np.savez(folder / "outputs.npz", **out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
