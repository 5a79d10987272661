"""Measure generation monitors: a monitored ``generate`` against the same ``generate``.

GPT-2 from a config (random weights, GPT-2's vocabulary of 50,257 tokens, no
download), 4 layers of width 256, CPU, one thread, eval mode; a greedy
``generate`` of ``--new`` tokens from a batch of 4 prompts of 16 tokens,
with the KV cache. Every job records the same layer, the final layer norm
(``transformer.ln_f``, the features a per-token Mahalanobis reads):

* ``plain``: ``rnet.generate(...)``, recording that layer at every step;
* ``mahalanobis``: the same, with ``monitors={"m": Mahalanobis(rnet,
  "transformer.ln_f", token="each", ...)}`` (fitted first on other data);
* ``surprisal``: the same, with ``monitors={"s": Surprisal(rnet)}`` (a
  float64 log-softmax over the 50,257 logits of each step).

Paired ratios: every round runs the jobs once each in a freshly shuffled
order, and the ratio is the median over rounds of ``job / plain`` *in the
same round* (slow drifts of a shared machine cancel). Before timing, the
monitored generations are checked to give the same tokens as the plain one;
a failed check prints ``CHECK FAILED`` and exits with status 1. ``--quick``
is a smoke run (2 layers, 4 tokens, 2 rounds), not a measurement.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script, this folder is first on `sys.path`, where `import
# transformers` would find `benchmarks/transformers.py`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
import transformers  # noqa: E402 (after the path fix)

from scio_recorder import Recorder  # noqa: E402 (after the path fix)
from scio_recorder.ood import Mahalanobis, Surprisal  # noqa: E402

WIDTH, BATCH, PROMPT = 256, 4, 16
LAYER = "transformer.ln_f"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="smoke run")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.new, args.rounds = 2, 4, 2
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=args.layers, n_embd=WIDTH, n_head=WIDTH // 64, n_positions=256
    )
    net = transformers.GPT2LMHeadModel(config).eval()
    vocab = config.vocab_size
    prompt = torch.randint(0, vocab, (BATCH, PROMPT))
    rnet = Recorder(net, input_data={"input_ids": prompt})
    rnet.record(LAYER)
    fit = [{"input_ids": torch.randint(0, vocab, (8, 32))} for _ in range(4)]
    maha = Mahalanobis(rnet, LAYER, token="each").fit(fit)  # noqa: S106 (not a password)
    options = {
        "max_new_tokens": args.new,
        "do_sample": False,
        "pad_token_id": 0,
        "eos_token_id": None,
        "attention_mask": torch.ones_like(prompt),
    }
    monitors: dict[str, Any] = {
        "plain": None,
        "mahalanobis": {"m": maha},
        "surprisal": {"s": Surprisal(rnet)},
    }

    def run(job: str) -> torch.Tensor:
        extra = {} if monitors[job] is None else {"monitors": monitors[job]}
        with torch.no_grad():
            return rnet.generate(prompt, **options, **extra)

    reference = run("plain")
    failed = [job for job in monitors if not torch.equal(run(job), reference)]
    for job in failed:
        print(f"CHECK FAILED: {job} generated other tokens", file=sys.stderr)
    if failed:
        return 1
    times: dict[str, list[float]] = {job: [] for job in monitors}
    for _ in range(args.rounds):
        order = list(monitors)
        random.shuffle(order)
        for job in order:
            start = time.perf_counter()
            run(job)
            times[job].append(time.perf_counter() - start)
    print(f"{args.layers} layers, {args.new} new tokens, {args.rounds} rounds")
    print("| job | median s per generate | ratio to plain (paired median) |")
    print("|---|---:|---:|")
    for job, seconds in times.items():
        ratio = statistics.median(
            t / p for t, p in zip(seconds, times["plain"], strict=True)
        )
        print(f"| {job} | {statistics.median(seconds):.4f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
