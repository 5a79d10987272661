"""Measure the time to build an execution graph, as a ratio to a plain forward.

For each model (the ResNet-18-style CNN at 16x3x32x32 and the 4-layer
Transformer encoder of ``overhead.py``, eval mode, ``torch.no_grad()``, one
thread), every round times, in a freshly shuffled order:

* ``plain``: ``net(x)``;
* ``scio``: ``rnet.graph(x)`` (the whole graph at full depth, not rendered);
* ``torchview``: ``torchview.draw_graph(net, input_data=x, depth=100,
  graph_dir=None)`` (0.2.7; not rendered), when torchview is installed. It is
  not a dependency: install it in the benchmark's environment only
  (``pip install --no-deps torchview graphviz``).

The report gives, per model and tool, the median over rounds of the ratio to
``plain`` timed in the same round (paired), and the median time.

Run ``python benchmarks/graph.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import random
import statistics
import sys
import time
from typing import Any

import torch

import scio_recorder
from scio_recorder import Recorder
from scio_recorder.models import resnet18_cifar, transformer_encoder


def build(name: str) -> tuple[torch.nn.Module, Recorder, torch.Tensor]:
    torch.manual_seed(0)
    if name == "cnn":
        net = resnet18_cifar(num_classes=10).eval()
        x = torch.randn(16, 3, 32, 32)
        return net, Recorder(net, input_size=(1, 3, 32, 32)), x
    net = transformer_encoder().eval()
    x = torch.randn(8, 64, 256)
    return net, Recorder(net, input_size=(1, 64, 256), force_static_flow=False), x


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--quick", action="store_true", help="2 rounds: a smoke run")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(1)
    try:
        torchview: Any = importlib.import_module("torchview")
    except ImportError:
        torchview = None
    rng = random.Random(0)
    print(
        f"# scio_recorder {scio_recorder.__version__}: graph build time\n\n"
        f"- torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; CPU, 1 thread, eval mode, torch.no_grad(); "
        f"{rounds} rounds"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
        + f"\n- torchview: {getattr(torchview, '__version__', 'not installed')}\n"
    )
    print("| model | tool | median ms | ratio to plain (paired median) | nodes |")
    print("|---|---|---:|---:|---:|")
    for name in ("cnn", "transformer"):
        net, rnet, x = build(name)
        tools: dict[str, Any] = {
            "plain": lambda net=net, x=x: net(x),
            "scio": lambda rnet=rnet, x=x: rnet.graph(x),
        }
        if torchview is not None:
            tools["torchview"] = lambda net=net, x=x: torchview.draw_graph(
                net, input_data=x, depth=100, graph_dir=None
            )
        times: dict[str, list[float]] = {tool: [] for tool in tools}
        with torch.no_grad():
            for tool in tools.values():  # warm-up
                tool()
            for _ in range(rounds):
                order = list(tools)
                rng.shuffle(order)
                for tool in order:
                    times[tool].append(timed(tools[tool]))
            nodes = {"plain": "", "scio": str(len(rnet.graph(x).nodes))}
        for tool, samples in times.items():
            ratios = [t / p for t, p in zip(samples, times["plain"], strict=True)]
            print(
                f"| {name} | {tool} | {statistics.median(samples) * 1e3:.1f} "
                f"| {statistics.median(ratios):.2f} | {nodes.get(tool, '')} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
