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

# also here, as before the split (the demo reads them): ID_DIGITS, NEAR, FAR,
# BenchmarkRun
from ._data import BENCHMARKS, BenchmarkData, load_benchmark
from ._data import FAR as FAR
from ._data import ID_DIGITS as ID_DIGITS
from ._data import NEAR as NEAR
from ._results import BenchmarkResults
from ._results import BenchmarkRun as BenchmarkRun
from ._runner import CATALOGUE, catalogue, run_benchmark
