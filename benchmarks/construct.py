"""Measure what building a ``Recorder`` costs, against torchinfo and one forward.

Two nets, CPU, one thread, eval mode, no download:

* ``mlp``: a 2,000-module MLP, ``Sequential`` of 1,000 ``Linear(64, 64)`` +
  ``ReLU`` pairs (2,001 module calls), a batch of 8;
* ``gpt2``: GPT-2 from a config (12 layers, width 512 by default, random
  weights), a batch of 2 x 64 tokens. ``--pad-token-id`` sets the config's
  ``pad_token_id`` (0; the ids are drawn from 1 up, no padding), which makes
  transformers read a value of the ids in its padding warning when no
  attention mask is given (``reference_tensors="fake"`` then falls back to
  the real pass); ``--mask`` passes an all-ones ``attention_mask`` too
  (no read).

Each round times, in a freshly shuffled order, one plain forward under
``torch.no_grad()``, one ``torchinfo.summary(net, input_data=x,
verbose=0)`` (torchinfo's defaults otherwise) and one construction per
scenario:

* ``default``: ``Recorder(net, input_data=x)`` (real reference pass, the
  static-flow check);
* ``no check``: ``force_static_flow=False``;
* ``fake``: ``reference_tensors="fake"``, ``force_static_flow=False``;
* ``fake+check``: ``reference_tensors="fake"`` with the default check.

Three ratios per scenario, each the median over rounds of the ratio of two
times of the same round (paired, so slow drifts of a shared machine cancel):
to one plain forward, to ``torchinfo.summary`` plus one forward (issue
35's target: at most 2), and to the ``default`` construction (which of
real and fake reference tensors is faster for this net and input). ``python benchmarks/construct.py --help`` lists the
options; ``--quick`` runs one small round of each net.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

# `benchmarks/transformers.py` would shadow the library: drop this script's
# folder, first on `sys.path`, before importing it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
import torchinfo  # noqa: E402 (after the path fix)
import transformers  # noqa: E402 (after the path fix)
from torch import nn  # noqa: E402 (after the path fix)

import scio_recorder  # noqa: E402 (after the path fix)
from scio_recorder import Recorder  # noqa: E402 (after the path fix)

if TYPE_CHECKING:
    from collections.abc import Callable

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "no check": {"force_static_flow": False},
    "fake": {"force_static_flow": False, "reference_tensors": "fake"},
    "fake+check": {"reference_tensors": "fake"},
}


def mlp(pairs: int, width: int, batch: int) -> tuple[nn.Module, torch.Tensor, str]:
    """The MLP of ``2 * pairs`` modules and its input."""
    layers = [m for _ in range(pairs) for m in (nn.Linear(width, width), nn.ReLU())]
    net = nn.Sequential(*layers).eval()
    described = (
        f"MLP, {2 * pairs:,} modules (Linear({width}, {width}) + ReLU), batch {batch}"
    )
    return net, torch.rand(batch, width), described


def gpt2(
    layers: int,
    width: int,
    batch: int,
    seq: int,
    *,
    pad_token_id: bool = False,
    mask: bool = False,
) -> tuple[nn.Module, Any, str]:
    """GPT-2 from a config and a batch of token ids (a dict with ``mask``)."""
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=max(1, width // 64),
        n_positions=max(1024, seq),
        pad_token_id=0 if pad_token_id else None,
    )
    net = transformers.GPT2LMHeadModel(config).eval()
    params = sum(p.numel() for p in net.parameters()) / 1e6
    described = (
        f"GPT-2, {layers} layers, width {width} ({params:.0f}M), batch {batch} x {seq}"
        + (", config pad_token_id=0" if pad_token_id else "")
        + (", with an attention_mask" if mask else "")
    )
    ids = torch.randint(1, config.vocab_size, (batch, seq))
    if mask:
        return (
            net,
            {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
            described,
        )
    return net, ids, described


def measure(net: nn.Module, x: Any, rounds: int) -> dict[str, list[float]]:
    """Time every job once per round, in a shuffled order; return the times."""

    def forward() -> None:
        with torch.no_grad():
            net(**x) if isinstance(x, dict) else net(x)

    def summary() -> None:
        torchinfo.summary(net, input_data=x, verbose=0)

    def build(options: dict[str, Any]) -> Callable[[], None]:
        return lambda: Recorder(net, input_data=x, **options) and None

    jobs = {"forward": forward, "torchinfo": summary} | {
        name: build(options) for name, options in SCENARIOS.items()
    }
    for job in jobs.values():  # warm-up
        job()
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(rounds):
        order = list(jobs)
        random.shuffle(order)
        for name in order:
            start = time.perf_counter()
            jobs[name]()
            times[name].append(time.perf_counter() - start)
    return times


def report(times: dict[str, list[float]]) -> None:
    """Print medians and the two paired ratios of each scenario."""
    forward, summary = times["forward"], times["torchinfo"]
    baseline = [f + s for f, s in zip(forward, summary, strict=True)]
    print(
        "| scenario | median s | ratio to one forward | ratio to torchinfo + forward "
        "| ratio to default |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in ["forward", "torchinfo", *SCENARIOS]:
        own = times[name]
        ratios = [
            statistics.median(t / b for t, b in zip(own, base, strict=True))
            for base in (forward, baseline, times["default"])
        ]
        print(
            f"| {name} | {statistics.median(own):.3f} | "
            + " | ".join(f"{ratio:.2f}" for ratio in ratios)
            + " |"
        )


def main() -> None:
    """Print the paired ratios of each net as Markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=["mlp", "gpt2", "both"], default="both")
    parser.add_argument("--pairs", type=int, default=1000, help="MLP Linear+ReLU pairs")
    parser.add_argument("--layers", type=int, default=12, help="GPT-2 layers")
    parser.add_argument("--width", type=int, default=512, help="GPT-2 width")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="tiny nets, one round")
    parser.add_argument(
        "--pad-token-id", action="store_true", help="GPT-2's config sets pad_token_id"
    )
    parser.add_argument(
        "--mask", action="store_true", help="GPT-2 given an attention_mask too"
    )
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.layers, args.width, args.seq, args.rounds = 20, 1, 64, 8, 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")  # transformers' config notes
    nets = []
    if args.net in {"mlp", "both"}:
        nets.append(mlp(args.pairs, 64, 8))
    if args.net in {"gpt2", "both"}:
        nets.append(
            gpt2(
                args.layers,
                args.width,
                args.batch,
                args.seq,
                pad_token_id=args.pad_token_id,
                mask=args.mask,
            )
        )
    for net, x, described in nets:
        times = measure(net, x, args.rounds)
        print(
            f"\n{described}; scio_recorder {scio_recorder.__version__} from "
            f"{scio_recorder.__file__}; one thread, {args.rounds} rounds\n"
        )
        report(times)


if __name__ == "__main__":
    main()
