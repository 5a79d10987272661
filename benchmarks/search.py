"""The nearest-neighbour search of the OoD detectors: memory and time as the bank grows.

``scio_recorder.ood._search.nearest`` (KNN, NNGuide, LID, Trust, DkNN and
JTLA search with it) reads the bank in blocks sized by a memory budget.
This script measures, for banks of growing size kept on disk (a
memory-mapped float32 file, as ``collect`` spills a large bank), how much
memory a search of 1024 queries takes besides the bank, and how long:

* ``torch``: ``nearest(..., backend="torch")``;
* ``faiss``: ``nearest(..., backend="faiss")`` (when faiss is installed);
* ``naive``: the bank loaded into memory, ``torch.cdist`` to every row,
  then ``topk`` (what KNN did before: memory grows with the bank), for the
  banks where its distance matrix fits.

Memory: each (bank, method) runs in a fresh process; a thread samples the
process's anonymous resident memory (``RssAnon`` in ``/proc/self/status``:
not the file-backed pages of the memory-mapped bank) every millisecond;
the table gives the peak minus the value before the search. Time: in one
process per bank, ``rounds`` interleaved rounds of every method (a random
order each round), the median time of a search and the median of the
per-round ratio to ``torch``'s.

    python benchmarks/search.py                       # 10^4 .. 10^6 rows, 128 features
    python benchmarks/search.py --quick               # smoke run: small banks, 3 rounds
    python benchmarks/search.py --sizes 10000,1000000 --features 512 --out search.md

Linux only (``/proc``). Progress goes to stderr, the Markdown table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from scio_recorder.ood._search import faiss_available, nearest

MIB = 2**20


def anon_kib() -> int:
    """Return this process's anonymous resident memory, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    msg = "no RssAnon in /proc/self/status"
    raise RuntimeError(msg)


class Peak:
    """Sample ``anon_kib`` every millisecond in a thread; keep the maximum."""

    def __init__(self) -> None:
        self.peak = anon_kib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, anon_kib())
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_kib())


def write_bank(path: Path, rows: int, features: int, seed: int) -> None:
    """Write ``rows x features`` float32 normals to ``path``, 65536 rows at a time."""
    gen = torch.Generator().manual_seed(seed)
    with path.open("wb") as out:
        for start in range(0, rows, 65536):
            n = min(65536, rows - start)
            out.write(torch.randn(n, features, generator=gen).numpy().tobytes())


def mapped(path: Path, rows: int, features: int) -> torch.Tensor:
    """The bank file as a tensor whose pages stay in the file (copy on write)."""
    return torch.from_numpy(
        np.memmap(path, dtype=np.float32, mode="c", shape=(rows, features))
    )


def search(method: str, queries: torch.Tensor, bank: torch.Tensor, k: int, budget: int):
    if method == "naive":
        in_ram = bank.clone()
        return torch.cdist(queries, in_ram).topk(k, dim=1, largest=False)
    return nearest(queries, bank, k, backend=method, memory_budget=budget)


def child(args: argparse.Namespace) -> None:
    """One process: the memory of one search, or the timed rounds of one bank."""
    torch.set_num_threads(args.threads)
    bank = mapped(Path(args.bank), args.rows, args.features)
    gen = torch.Generator().manual_seed(1)
    queries = torch.randn(args.queries, args.features, generator=gen)
    budget = args.budget * MIB
    if args.measure == "memory":
        before = anon_kib()
        with Peak() as peak:
            search(args.method, queries, bank, args.k, budget)
        print(json.dumps({"extra_mib": (peak.peak - before) / 1024}))
        return
    methods = args.method.split(",")
    for method in methods:  # warm up (and read the bank into the page cache)
        search(method, queries, bank, args.k, budget)
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.rounds):
        order = methods[:]
        random.shuffle(order)
        for method in order:
            start = time.perf_counter()
            search(method, queries, bank, args.k, budget)
            times[method].append(time.perf_counter() - start)
    print(json.dumps(times))


def run_child(
    args: argparse.Namespace, bank: Path, rows: int, measure: str, method: str
):
    command = [
        sys.executable,
        __file__,
        "--child",
        "--bank", str(bank),
        "--rows", str(rows),
        "--features", str(args.features),
        "--queries", str(args.queries),
        "--k", str(args.k),
        "--budget", str(args.budget),
        "--rounds", str(args.rounds),
        "--threads", str(args.threads),
        "--measure", measure,
        "--method", method,
    ]  # fmt: skip
    done = subprocess.run(command, check=True, capture_output=True, text=True)  # noqa: S603 (this script)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--budget", type=int, default=128, help="MiB (nearest's)")
    parser.add_argument("--naive-max", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bank", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.quick:
        args.sizes, args.rounds, args.queries = "2000,20000", 3, 256
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = ["torch", *(["faiss"] if faiss_available() else []), "naive"]
    lines = [
        (
            f"Search of {args.queries} queries, k={args.k}, {args.features} float32 "
            f"features, budget {args.budget} MiB, {args.threads} threads; medians "
            f"of {args.rounds} interleaved rounds."
        ),
        "",
        "| bank rows | bank MiB | method | extra memory MiB | time s | time / torch |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for rows in sizes:
            bank = Path(folder) / f"bank-{rows}.f32"
            print(f"writing a bank of {rows} rows", file=sys.stderr)
            write_bank(bank, rows, args.features, seed=rows)
            here = [m for m in methods if m != "naive" or rows <= args.naive_max]
            timed = run_child(args, bank, rows, "time", ",".join(here))
            for method in here:
                print(f"{rows} rows, {method}: memory", file=sys.stderr)
                memory = run_child(args, bank, rows, "memory", method)["extra_mib"]
                ratio = statistics.median(
                    t / base
                    for t, base in zip(timed[method], timed["torch"], strict=True)
                )
                lines.append(
                    f"| {rows:,} | {rows * args.features * 4 / MIB:,.0f} | {method} "
                    f"| {memory:,.1f} | {statistics.median(timed[method]):.3f} "
                    f"| {ratio:.2f} |"
                )
            bank.unlink()
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
