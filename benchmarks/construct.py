"""Measure what building a ``Recorder`` costs, against one plain forward.

GPT-2 from a config (random weights, no download), CPU, one thread, eval
mode. Each round times, in a freshly shuffled order, one plain forward under
``torch.no_grad()`` and one construction per scenario:

* ``real``: ``Recorder(net, input_data=x, force_static_flow=False)``;
* ``real+check``: the default, ``Recorder(net, input_data=x)`` (real
  reference pass, then the fake-tensor static-flow check);
* ``fake``: ``reference_tensors="fake"``, ``force_static_flow=False``;
* ``fake+check``: ``reference_tensors="fake"`` with the default check (one pass
  does both).

Each ratio is the median over rounds of construction time over the plain
forward of the same round (paired, so slow drifts of a shared machine
cancel). ``python benchmarks/construct.py --help`` lists the options.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings

import torch
import transformers

from scio_recorder import Recorder

SCENARIOS = {
    "real": {"force_static_flow": False},
    "real+check": {},
    "fake": {"force_static_flow": False, "reference_tensors": "fake"},
    "fake+check": {"reference_tensors": "fake"},
}


def main() -> None:
    """Print the median paired ratios as a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")  # transformers' config notes
    config = transformers.GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=max(1, args.width // 64),
        n_positions=max(1024, args.seq),
    )
    net = transformers.GPT2LMHeadModel(config).eval()
    x = torch.randint(0, config.vocab_size, (args.batch, args.seq))

    def forward() -> None:
        with torch.no_grad():
            net(x)

    def build(options: dict[str, object]) -> None:
        Recorder(net, input_data=x, **options)

    jobs = {"forward": forward} | {
        name: (lambda options=options: build(options))
        for name, options in SCENARIOS.items()
    }
    for job in jobs.values():  # warm-up
        job()
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(args.rounds):
        order = list(jobs)
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            jobs[name]()
            times[name].append(time.perf_counter() - start)
    params = sum(p.numel() for p in net.parameters()) / 1e6
    print(
        f"GPT-2, {args.layers} layers, width {args.width}, {params:.0f}M "
        f"parameters, batch {args.batch} x {args.seq}, one thread, "
        f"{args.rounds} rounds\n"
    )
    print("| scenario | median s | ratio to one forward |")
    print("|---|---:|---:|")
    print(f"| forward | {statistics.median(times['forward']):.3f} | 1.00 |")
    for name in SCENARIOS:
        ratios = [t / f for t, f in zip(times[name], times["forward"], strict=True)]
        print(
            f"| {name} | {statistics.median(times[name]):.3f} | "
            f"{statistics.median(ratios):.2f} |"
        )


if __name__ == "__main__":
    main()
