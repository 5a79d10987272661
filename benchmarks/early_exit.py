"""Measure early exit: ``collect`` on the middle block of a GPT-2, stopping there.

GPT-2 from a config (random weights, GPT-2's vocabulary of 50,257 tokens, no
download), 12 layers of width 256, CPU, one thread, eval mode; a data set of
``--batches`` batches of 2 x 64 tokens. Two jobs, each one whole ``collect``
run keeping the moments of the middle block's output (``transformer.h.5``):

* ``full``: ``collect(..., early_exit=False)``, every pass runs the 12
  blocks and the unembedding;
* ``early``: ``collect(...)`` as it runs by default (``early_exit=None``:
  the kept block is not the net's output, so each pass stops after it).

Paired ratios: every round runs both jobs once in a freshly shuffled order,
and the ratio is the median over rounds of ``early / full`` *in the same
round* (slow drifts of a shared machine cancel). Before timing, the two
results are checked equal bit for bit (the same operations on the same
tensors), and the blocks each pass runs are counted; a failed check prints
``CHECK FAILED`` and exits with status 1. ``--quick`` is a smoke run (4
layers, 2 batches, 2 rounds), not a measurement.

``python benchmarks/early_exit.py --help`` lists the options.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import platform
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# Run as a script, this folder is first on `sys.path`, where `import
# transformers` would find `benchmarks/transformers.py`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
import transformers  # noqa: E402 (after the path fix)

from scio_recorder import Recorder, collect  # noqa: E402 (after the path fix)

BATCH, SEQ, WIDTH = 2, 64, 256
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILED.append(what)
        print(f"CHECK FAILED: {what}", file=sys.stderr)


def build(layers: int) -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=WIDTH, n_head=WIDTH // 64, n_positions=1024
    )
    return transformers.GPT2LMHeadModel(config).eval()


def main() -> int:
    """Print the Markdown report; return 1 if a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.layers, args.batches, args.rounds = 4, 2, 2
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # transformers' notes on the config
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = build(args.layers)
    middle = f"transformer.h.{args.layers // 2 - 1}"
    data = [
        torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
        for _ in range(args.batches)
    ]
    rnet = Recorder(model, input_data={"input_ids": data[0]})
    keep = {middle: "moments"}

    def run(*, early: bool) -> Any:
        return collect(
            rnet, data, keep, input=None, early_exit=None if early else False
        )

    blocks = [0]

    def count(*_: Any) -> None:
        blocks[0] += 1

    handles = [block.register_forward_pre_hook(count) for block in model.transformer.h]
    handles.append(model.lm_head.register_forward_pre_hook(count))
    ran = {}
    results = {}
    for name, early in (("full", False), ("early", True)):
        blocks[0] = 0
        results[name] = run(early=early)
        ran[name] = blocks[0] / args.batches
    for handle in handles:
        handle.remove()
    (label,) = results["full"].keys()
    full, early = results["full"][label], results["early"][label]
    check(
        torch.equal(full.mean, early.mean) and torch.equal(full.var, early.var),
        "early exit's moments equal the full passes' bit for bit",
    )
    check(ran["early"] < ran["full"], "early passes run fewer blocks")

    times: dict[str, list[float]] = {"full": [], "early": []}
    gc.disable()
    try:
        for _ in range(args.rounds):
            order = list(times)
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                run(early=name == "early")
                times[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    ratio = statistics.median(
        e / f for e, f in zip(times["early"], times["full"], strict=True)
    )
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"# benchmarks/early_exit.py, {dt.datetime.now(tz=dt.UTC).date()}, "
        f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, one thread"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
    )
    print(
        f"\nGPT-2, {args.layers} layers, width {WIDTH} ({params:.0f}M parameters); "
        f"`collect` of the moments of `{middle}` over {args.batches} batches of "
        f"{BATCH} x {SEQ} tokens; {args.rounds} rounds.\n"
    )
    print("| job | median s per run | modules run per pass | ratio to full |")
    print("|---|---:|---:|---:|")
    for name in ("full", "early"):
        versus = "1.000" if name == "full" else f"{ratio:.3f}"
        print(
            f"| {name} | {statistics.median(times[name]):.3f} | "
            f"{ran[name]:.0f} of {args.layers + 1} | {versus} |"
        )
    print("\nModules counted: the blocks and the unembedding (`lm_head`).")
    if FAILED:
        print("\n" + "\n".join(f"CHECK FAILED: {what}" for what in FAILED))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
