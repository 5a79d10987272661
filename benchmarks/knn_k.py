"""Rate ``KNN`` for several ``k`` on the digits benchmark, in one run.

Why ``KNN``'s default ``k`` is 1 and not pytorch-ood's and the paper's 50:
``run_benchmark`` (the demo's protocol: the digits CNN trained on the
digits 0-5, 541 training digits, rated against the unseen digits 6-9 and
noise, inverted and rotated digits) with one ``KNN`` per ``k``, all fitted
with the same shared pass, over the seeds given. Prints the AUROC and
FPR95-ID tables (mean ± std over the seeds).

``python benchmarks/knn_k.py`` (seeds 0-2, ``k`` 1, 5, 10 and 50);
``--k 1 50 --seeds 0 1 2 3 4`` for others.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from scio_recorder.ood import KNN
from scio_recorder.ood.benchmark import run_benchmark

if TYPE_CHECKING:
    from collections.abc import Callable

    from scio_recorder import Recorder


def knn(k: int) -> Callable[[Recorder], KNN]:
    """Build a ``KNN`` with this ``k`` for each seed's net."""
    return lambda rnet: KNN(rnet, k=k)


def main() -> None:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 5, 10, 50])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    detectors = {f"KNN k={k}": knn(k) for k in args.k}
    results = run_benchmark(detectors, seeds=tuple(args.seeds))
    print(results.to_markdown(("AUROC", "FPR95-ID")))


if __name__ == "__main__":
    main()
