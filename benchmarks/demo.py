"""Time ``scio-recorder demo`` with and without ``--all``, and its first run.

Each run is a fresh process (``python -m scio_recorder demo --out DIR``),
timed by its wall clock and by its CPU seconds (user and system, from
:func:`resource.getrusage` of the children: what a shared machine's load
disturbs least). First a *cold* run, as the first one after installing:
with an empty ``PYTHONPYCACHEPREFIX`` (every module compiled to bytecode
again) and an empty ``MPLCONFIGDIR`` (matplotlib's font cache built
again); then ``--pairs`` warm pairs, each a default run and an ``--all``
run in a shuffled order, reusing those caches. Printed: each run's times,
the medians, and the median over pairs of the paired ratio ``--all`` /
default (paired, so slow drifts of a shared machine cancel).

``python benchmarks/demo.py --pairs 3``; ``--quick`` times ``--quick``
demos (one seed), a smoke run.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(args: list[str], env: dict[str, str], out: Path) -> tuple[float, float]:
    """Run the demo once in a fresh process; return (wall, CPU) seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(  # noqa: S603 (this interpreter, fixed arguments)
        [sys.executable, "-m", "scio_recorder", "demo", "--out", str(out), *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    """Print the cold run, the warm pairs and the paired ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="time --quick demos")
    options = parser.parse_args()
    extra = ["--quick"] if options.quick else []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        env = dict(os.environ)
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
        env["MPLCONFIGDIR"] = str(root / "matplotlib")
        times: dict[str, list[tuple[float, float]]] = {"default": [], "--all": []}
        wall, cpu = run(extra, env, root / "out")
        print(f"cold (first) default run: {wall:.1f} s wall, {cpu:.1f} s CPU")
        for pair in range(options.pairs):
            order = ["default", "--all"]
            random.shuffle(order)
            for name in order:
                args = extra + (["--all"] if name == "--all" else [])
                times[name].append(run(args, env, root / "out"))
                wall, cpu = times[name][-1]
                print(f"pair {pair}, {name}: {wall:.1f} s wall, {cpu:.1f} s CPU")
        for name, measured in times.items():
            walls, cpus = zip(*measured, strict=True)
            print(
                f"warm {name}: median {statistics.median(walls):.1f} s wall, "
                f"{statistics.median(cpus):.1f} s CPU"
            )
        for index, clock in ((0, "wall"), (1, "CPU")):
            ratios = [
                a[index] / d[index]
                for a, d in zip(times["--all"], times["default"], strict=True)
            ]
            print(
                f"--all / default ({clock}), paired: median "
                f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
            )


if __name__ == "__main__":
    main()
