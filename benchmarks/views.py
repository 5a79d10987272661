"""Measure what an attention view costs at real sizes: build time and page size.

For each size (heads x tokens, a causal pattern from
:func:`~scio_recorder.views.attention_from_qk` on random queries and keys),
every round times, in a freshly shuffled order:

* ``view``: ``attention_view(weights).html()``, the page as written (the
  unmasked half, float32 in base64);
* ``json`` (at 512 tokens only, as a baseline): the encoding the first
  version of the view used, every cell rounded to six significant digits
  in nested JSON lists, masked zeros included.

A size whose page would pass the 50 MB limit is refused by the view: the
time to refuse is reported, and the message. The report gives the median
time, the paired median ratio to the baseline where there is one, and the
page's size. With ``--browser`` (a Chromium installed, see
``tests/browser.py``), the time from opening the page to its load event is
reported too (the script decodes and draws within it).

Run ``python benchmarks/views.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import scio_recorder
from scio_recorder.views import attention_from_qk, attention_view
from scio_recorder.views._base import finite

SIZES = ((12, 512), (12, 1024), (4, 2048), (12, 2048))


def weights(heads: int, tokens: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, tokens, 8 * heads, generator=gen)
    k = torch.randn(1, tokens, 8 * heads, generator=gen)
    return attention_from_qk(q, k, num_heads=heads)


def old_json(w: torch.Tensor) -> str:
    """The first version's data: every cell, six significant digits, JSON lists."""
    data = [[finite(row) for row in head] for head in w[0].double().tolist()]
    return json.dumps({"weights": data}, separators=(",", ":"))


def build(w: torch.Tensor) -> tuple[float, int | str]:
    start = time.perf_counter()
    try:
        page = attention_view(w).html()
    except ValueError as error:
        return time.perf_counter() - start, str(error)
    return time.perf_counter() - start, len(page.encode())


def opened(page_html: str) -> float | None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import browser  # noqa: PLC0415 (optional, with --browser)

    chromium = browser.start()
    if chromium is None:
        return None
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "attention.html")
            path.write_text(page_html, encoding="utf-8")
            tab = chromium.page(1280, 900)
            start = time.perf_counter()
            tab.load(path.as_uri())
            seconds = time.perf_counter() - start
            errors = tab.errors()
            if errors:
                print(f"CHECK FAILED: the page reported {errors}", file=sys.stderr)
            return seconds
    finally:
        chromium.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="1 round, 512 only")
    parser.add_argument("--browser", action="store_true", help="time the page's load")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    sizes = SIZES[:1] if args.quick else SIZES
    torch.set_num_threads(1)
    rng = random.Random(0)
    print(
        f"# scio_recorder {scio_recorder.__version__}: attention view at real sizes\n\n"
        f"- torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; 1 thread; {rounds} rounds"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
        + "\n"
    )
    print("| heads x tokens | encoding | median s | ratio to json (paired) | page MB |")
    print("|---|---|---:|---:|---:|")
    failed = False
    for heads, tokens in sizes:
        w = weights(heads, tokens)
        jobs: dict[str, Any] = {"view": lambda w=w: build(w)}
        if tokens == 512:
            jobs["json"] = lambda w=w: (0.0, len(old_json(w).encode()))
        times: dict[str, list[float]] = {name: [] for name in jobs}
        sizes_of: dict[str, int | str] = {}
        for _ in range(rounds):
            order = list(jobs)
            rng.shuffle(order)
            for name in order:
                start = time.perf_counter()
                _, size = jobs[name]()
                times[name].append(time.perf_counter() - start)
                sizes_of[name] = size
        for name in jobs:
            size = sizes_of[name]
            ratio = (
                f"{statistics.median(a / b for a, b in zip(times[name], times['json'], strict=True)):.3f}"
                if "json" in times
                else ""
            )
            shown = f"{size / 1e6:.1f}" if isinstance(size, int) else "refused"
            print(
                f"| {heads} x {tokens} | {name} | {statistics.median(times[name]):.2f} "
                f"| {ratio} | {shown} |"
            )
            if isinstance(size, str):
                print(f"\n> {size}\n", file=sys.stderr)
        if statistics.median(times["view"]) > 5:
            print(f"CHECK FAILED: {heads} x {tokens} took over 5 s", file=sys.stderr)
            failed = True
        if args.browser and isinstance(sizes_of["view"], int):
            seconds = opened(attention_view(w).html())
            if seconds is not None:
                print(f"| {heads} x {tokens} | browser load | {seconds:.2f} | | |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
