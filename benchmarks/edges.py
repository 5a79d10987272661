"""Measure what edge attribution costs: passes counted, then paired times.

For each GPT-2 configuration (random weights, eval mode, one thread, a batch
of ``--batch`` x ``--length`` tokens, a logit-difference metric):

* **passes counted**: the model's forward calls and the backward passes
  through it (``torch.autograd.grad`` calls whose graph reaches the model),
  during ``edge_attribution(method="eap")`` and ``method="exact"``, against
  the number of edges. EAP: 2 forwards and 1 backward through the model
  whatever the edges, and one small vector-Jacobian product per layer
  through its first norm and query/key/value projection (the heads' inputs,
  counted apart); exact: one clean and one corrupted forward, then one
  forward per ``max_edges`` edges (each a batch of that many copies);
* **paired times**: every round times ``eap`` and ``plain`` (one forward
  and one backward of the model on the same batch, by hand) in a freshly
  shuffled order; the ratio is the median over rounds of ``eap / plain``
  *in the same round*. ``exact`` is timed on the small configuration only
  (the large one has tens of thousands of edges).

``--quick`` is a smoke run, not a measurement. ``python benchmarks/edges.py
--help`` lists the options.
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

import torch  # noqa: E402 (after the path is set)
import transformers  # noqa: E402

from scio_recorder import Recorder  # noqa: E402
from scio_recorder.explain import edge_attribution  # noqa: E402

CONFIGS = {
    "gpt2-2x4x64": {"n_layer": 2, "n_head": 4, "n_embd": 64},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768},
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        **CONFIGS[name], vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval()


def metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


class Counter:
    """Count the model's forward calls and the backward passes through it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.forwards = 0
        self.backwards = 0
        self.small = 0
        self._handle = model.register_forward_pre_hook(self._forward)
        self._grad = torch.autograd.grad
        self._model = model
        torch.autograd.grad = self._count  # type: ignore[assignment]

    def _forward(self, *_: Any) -> None:
        self.forwards += 1

    def _count(self, outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        first = outputs[0] if isinstance(outputs, list | tuple) else outputs
        if first.dim() == 0 and first.numel() == 1 and self._reaches_model(first):
            self.backwards += 1
        else:
            self.small += 1
        return self._grad(outputs, inputs, *args, **kwargs)

    def _reaches_model(self, value: torch.Tensor) -> bool:
        # the metric's graph holds the unembedding's weight; a norm's VJP not
        head = self._model.lm_head.weight
        seen, todo = set(), [value.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if getattr(node, "variable", None) is head:
                return True
            todo.extend(parent for parent, _ in node.next_functions)
        return False

    def close(self) -> None:
        self._handle.remove()
        torch.autograd.grad = self._grad  # type: ignore[assignment]


def count(name: str, batch: int, length: int, method: str) -> dict[str, int]:
    model = build(name)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 1000, (batch, length), generator=gen)
    corrupted = clean.clone()
    corrupted[:, length // 2] = 7
    rnet = Recorder(model, input_data={"input_ids": clean})
    counter = Counter(model)
    try:
        scores = edge_attribution(rnet, clean, corrupted, metric, method, max_edges=64)
    finally:
        counter.close()
    return {
        "edges": len(scores),
        "forwards": counter.forwards,
        "backwards": counter.backwards,
        "small": counter.small,
    }


def timed(
    name: str, batch: int, length: int, rounds: int, *, exact: bool
) -> dict[str, Any]:
    model = build(name)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 1000, (batch, length), generator=gen)
    corrupted = clean.clone()
    corrupted[:, length // 2] = 7
    rnet = Recorder(model, input_data={"input_ids": clean})

    def plain() -> None:
        metric(model(input_ids=clean).logits).backward()
        model.zero_grad(set_to_none=True)

    scenarios = {
        "plain": plain,
        "eap": lambda: edge_attribution(rnet, clean, corrupted, metric),
    }
    if exact:
        scenarios["exact"] = lambda: edge_attribution(
            rnet, clean, corrupted, metric, "exact"
        )
    times: dict[str, list[float]] = {key: [] for key in scenarios}
    for fn in scenarios.values():
        fn()  # warm up
    for _ in range(rounds):
        order = list(scenarios)
        random.shuffle(order)
        for key in order:
            start = time.perf_counter()
            scenarios[key]()
            times[key].append(time.perf_counter() - start)
    out: dict[str, Any] = {
        key: statistics.median(values) * 1e3 for key, values in times.items()
    }
    for key in scenarios:
        if key != "plain":
            ratios = [a / b for a, b in zip(times[key], times["plain"], strict=True)]
            out[f"{key}/plain"] = statistics.median(ratios)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    random.seed(0)
    rounds = 2 if args.quick else args.rounds
    names = ["gpt2-2x4x64"] if args.quick else list(CONFIGS)
    print("| model | method | edges | model forwards | model backwards | small VJPs |")
    print("|---|---|---|---|---|---|")
    for name in names:
        for method in ("eap", "exact") if name == "gpt2-2x4x64" else ("eap",):
            got = count(name, args.batch, args.length, method)
            print(
                f"| {name} | {method} | {got['edges']:,} | {got['forwards']} | "
                f"{got['backwards']} | {got['small']} |"
            )
    print()
    print(
        "| model | plain fwd+bwd ms | eap ms | eap / plain* | exact ms | exact / plain* |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        got = timed(name, args.batch, args.length, rounds, exact=name == "gpt2-2x4x64")
        exact = (
            f"{got['exact']:.1f} | {got['exact/plain']:.2f}"
            if "exact" in got
            else "— | —"
        )
        print(
            f"| {name} | {got['plain']:.1f} | {got['eap']:.1f} | "
            f"{got['eap/plain']:.2f} | {exact} |"
        )


if __name__ == "__main__":
    main()
