"""The metrics against scio-pypi 1.1's ``scio.eval``, where scio is installed.

scio needs Python 3.12 syntax, so it runs in its own interpreter: set
``SCIO_PYTHON`` to a Python that imports ``scio`` (``pip install
scio-pypi==1.1``); the test is skipped otherwise. Both sides compute in
float64 from the same scores; the areas are sums of at most ~60 terms, so
they agree to 1e-12 (any real difference is at least 1 / 30**2).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from scio_recorder.ood.metrics import (
    convex_hull_auroc,
    mcc,
    partial_auroc,
    tnr_at_tpr,
    tpr_at_fpr,
)

SCIO_PYTHON = os.environ.get("SCIO_PYTHON", "")

SCRIPT = """
import json, sys
import numpy as np
from scio.eval import AUC, MCC, TNR, TPR
out = []
for case in json.load(sys.stdin):
    ind, ood = np.array(case["ind"]), np.array(case["ood"])
    labels = np.r_[np.zeros(ind.size), np.ones(ood.size)]  # OoD positive
    scores = -np.r_[ind, ood]  # scio: OoD scores low
    lo, hi, x = case["lo"], case["hi"], case["x"]
    out.append([
        float(AUC(max_fpr=hi, min_fpr=lo)(labels, scores)),
        float(AUC(kind="convex_hull")(labels, scores)),
        float(MCC()(labels, scores)),
        float(TPR(max_fpr=x)(labels, scores)),
        float(TNR(min_tpr=x)(labels, scores)),
    ])
json.dump(out, sys.stdout)
"""


@pytest.mark.skipif(
    not (SCIO_PYTHON and Path(SCIO_PYTHON).exists()),
    reason="set SCIO_PYTHON to a Python with scio-pypi 1.1 installed",
)
def test_metrics_equal_scios_on_random_tied_scores():
    """Partial (pessimistic) and hull AUC, MCC, TPR@FPR, TNR@TPR equal scio's."""
    rng = np.random.default_rng(0)
    cases = []
    for trial in range(500):
        n, p = (int(v) for v in rng.integers(1, 30, size=2))
        levels = int(rng.integers(2, 12))
        jitter = rng.random(n) if trial % 2 else 0.0
        ind = rng.integers(0, levels, n) + jitter
        ood = rng.integers(0, levels, p) + 0.5 * (trial % 3 == 0)
        cases.append({
            "ind": ind.tolist(),
            "ood": ood.tolist(),
            "lo": float(rng.choice([0.0, 0.1, 0.25])),
            "hi": float(rng.choice([0.3, 0.5, 1.0])),
            "x": float(rng.random()),
        })  # fmt: skip
    done = subprocess.run(  # noqa: S603 (the interpreter the user named, a fixed script)
        [SCIO_PYTHON, "-c", SCRIPT],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    for case, theirs in zip(cases, json.loads(done.stdout), strict=True):
        ind, ood, x = case["ind"], case["ood"], case["x"]
        ours = [
            partial_auroc(ind, ood, max_fpr=case["hi"], min_fpr=case["lo"],
                          ties="pessimistic"),
            convex_hull_auroc(ind, ood),
            mcc(ind, ood),
            tpr_at_fpr(ind, ood, x),
            tnr_at_tpr(ind, ood, x),
        ]  # fmt: skip
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
