"""Measure what exact records and derived position ids cost, on overhead.py's models.

Exact by default: the reference pass learns which records a later in-place
operation overwrites, and only those are copies. For each model, on one net
instance (eval mode, ``torch.no_grad()``, one thread), every round times a
batch of calls of each scenario, in a freshly shuffled order:

* ``plain``: ``net(x)``, no hook;
* ``uncopied``: ``rnet(x)`` recording every recordable label, the plan's
  copies turned off (the records are the very tensors: the behaviour before,
  inexact where an in-place operation overwrites them);
* ``exact``: the same recorder as it is (the default): overwritten records
  copied;
* ``hand``: a hand-written hook on every recorded module storing its output
  (inexact likewise);
* ``hand_clone``: the same hooks storing ``out.clone()`` (what one writes to
  be exact without knowing which records are overwritten);
* ``exact_again``: ``exact`` once more, an A/A pair whose ratio shows the
  noise of the machine (likewise ``None`` twice for ``collect``).

Models: overhead.py's (``mlp``: ``tiny_mlp()`` on ``(1, 16)``; ``cnn``:
``resnet18_cifar()`` on ``(16, 3, 32, 32)``, with ``ReLU(inplace=True)``;
``transformer``: ``transformer_encoder()`` on ``(8, 64, 256)``), and
``cnn_plain``: the same ResNet-18 with every ``ReLU`` out of place.

Derived position ids: ``collect`` over ``--batches`` batches keeping the
moments of overhead.py's "one layer", with ``position_ids="from_mask"`` (the
default) against ``None``, paired the same way; on overhead.py's models
(whose forward takes no ``position_ids``: nothing is derived) and on a small
GPT-2 (2 layers, width 64) fed left-padded batches of 8 x 32 tokens with an
attention mask (ids derived from it at every batch).

Paired ratios: the median over rounds of one scenario's time over another's
*in the same round*. Before timing, every exact record is checked equal to
a cloning hand hook's, bit for bit, and the ``collect`` results of both
settings equal where nothing is derived; a failed check prints ``CHECK
FAILED`` and exits with status 1. ``--quick`` is a smoke run, not a
measurement. ``python benchmarks/exact.py --help`` lists the options.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import platform
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Run as a script, this folder is first on `sys.path`, where `import
# transformers` would find `benchmarks/transformers.py`.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
from torch import nn  # noqa: E402

from scio_recorder import Recorder, collect  # noqa: E402
from scio_recorder._support.tree import iter_tensors, map_tensors  # noqa: E402
from scio_recorder.models import (  # noqa: E402
    resnet18_cifar,
    tiny_mlp,
    transformer_encoder,
)

if TYPE_CHECKING:
    from collections.abc import Callable

FAILED: list[str] = []
MODELS = ("mlp", "cnn", "cnn_plain", "transformer")


def check(ok: bool, what: str) -> None:
    if not ok:
        FAILED.append(what)
        print(f"CHECK FAILED: {what}", file=sys.stderr)


@dataclasses.dataclass
class Case:
    name: str
    net: nn.Module
    x: torch.Tensor
    size: tuple[int, ...]
    one: str
    static: bool = True


def build(name: str) -> Case:
    if name == "mlp":
        return Case(name, tiny_mlp().eval(), torch.randn(1, 16), (1, 16), "2")
    if name in {"cnn", "cnn_plain"}:
        net = resnet18_cifar().eval()
        if name == "cnn_plain":
            for module in net.modules():
                if isinstance(module, nn.ReLU):
                    module.inplace = False
        return Case(name, net, torch.randn(16, 3, 32, 32), (1, 3, 32, 32), "layer3")
    net = transformer_encoder(num_layers=4).eval()
    return Case(name, net, torch.randn(8, 64, 256), (1, 64, 256), "encoder", False)


def time_batch(call: Callable[[], Any], n: int) -> float:
    """Mean CPU time of this thread per call, in ns, over ``n`` calls (GC off)."""
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time_ns()
        for _ in range(n):
            call()
        return (time.thread_time_ns() - start) / n
    finally:
        gc.enable()


def calls_per_batch(call: Callable[[], Any], ms: float) -> int:
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, int(ms / 1000 / once))


def paired(samples: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))


def copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone()


def same(a: Any, b: Any) -> bool:
    """Whether two records hold equal tensors, bit for bit."""
    left, right = list(iter_tensors(a)), list(iter_tensors(b))
    return len(left) == len(right) and all(
        torch.equal(x, y) for x, y in zip(left, right, strict=True)
    )


def hand_hooks(
    modules: list[nn.Module], *, clone: bool
) -> tuple[Callable[[], None], Callable[[], None], dict[int, list[Any]]]:
    store: dict[int, list[Any]] = {}
    handles: list[Any] = []

    def hook(module: nn.Module, _args: Any, out: Any) -> None:
        store.setdefault(id(module), []).append(
            map_tensors(copy, out) if clone else out
        )

    def setup() -> None:
        store.clear()
        handles.extend(m.register_forward_hook(hook) for m in modules)

    def teardown() -> None:
        for handle in handles:
            handle.remove()
        handles.clear()

    return setup, teardown, store


def exact_scenarios(case: Case) -> tuple[dict[str, Any], int]:
    """Return the scenarios (name -> (call, setup, teardown)) and the copies."""
    rnet = Recorder(case.net, input_size=case.size, force_static_flow=case.static)
    rows = [row for row in rnet.table.values() if row.recordable and row.name]
    labels = [row.label for row in rows]
    modules = list(dict.fromkeys(row.module for row in rows))
    rnet.record(*labels)
    exact_plan = rnet._passes.plan
    uncopied = dataclasses.replace(
        exact_plan, copied=frozenset(), copied_inputs=frozenset()
    )
    net, x = case.net, case.x

    def select(plan: Any) -> Callable[[], None]:
        return lambda: rnet._passes.select(plan)

    def unhook() -> None:  # every scenario starts and ends with no hook at all
        rnet.record()

    hand = hand_hooks(modules, clone=False)
    hand_clone = hand_hooks(modules, clone=True)
    scenarios = {
        "plain": (lambda: net(x), unhook, unhook),
        "uncopied": (lambda: rnet(x), select(uncopied), unhook),
        "exact": (lambda: rnet(x), select(exact_plan), unhook),
        "exact_again": (lambda: rnet(x), select(exact_plan), unhook),  # A/A
        "hand": (lambda: net(x), *hand[:2]),
        "hand_clone": (lambda: net(x), *hand_clone[:2]),
    }
    # exact records are the cloning hooks' values, bit for bit
    with torch.no_grad():
        rnet._passes.select(exact_plan)
        rnet(x)
        records = dict(rnet.activations)
        rnet.record()
        hand_clone[0]()
        net(x)
        hand_clone[1]()
    store = hand_clone[2]
    seen: dict[int, int] = {}
    for row in rows:
        k = seen.get(id(row.module), 0)
        seen[id(row.module)] = k + 1
        value = store[id(row.module)][k]
        check(
            same(records[row.label], value),
            f"{case.name}: the exact record of {row.label_str} is the cloning hook's",
        )
    return scenarios, len(exact_plan.copied)


def position_scenarios(case: Case, batches: int) -> dict[str, Any]:
    rnet = Recorder(case.net, input_size=case.size, force_static_flow=case.static)
    data = [case.x] * batches

    def run(mode: str | None) -> Any:
        return collect(rnet, data, {case.one: "moments"}, input=None, position_ids=mode)

    label = next(iter(run("from_mask")))
    a, b = run("from_mask")[label], run(None)[label]
    check(
        torch.equal(a.mean, b.mean),
        f"{case.name}: collect's results do not depend on position_ids here",
    )
    return {
        "from_mask": (lambda: run("from_mask"), lambda: None, lambda: None),
        "none": (lambda: run(None), lambda: None, lambda: None),
        "none_again": (lambda: run(None), lambda: None, lambda: None),  # A/A
    }


def gpt2_positions(batches: int) -> dict[str, Any]:
    import transformers  # noqa: PLC0415 (only here)

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000)
    ).eval()
    ids = torch.randint(1, 1000, (8, 32))
    mask = torch.ones(8, 32, dtype=torch.long)
    for row in range(8):
        mask[row, : 3 * row] = 0  # left padding
    data = [{"input_ids": ids * mask, "attention_mask": mask}] * batches
    rnet = Recorder(model, input_data={"input_ids": ids[:1]})

    def run(mode: str | None) -> Any:
        return collect(
            rnet, data, {"transformer.h.0": "moments"}, input=lambda b: b,
            position_ids=mode,
        )  # fmt: skip

    return {
        "from_mask": (lambda: run("from_mask"), lambda: None, lambda: None),
        "none": (lambda: run(None), lambda: None, lambda: None),
        "none_again": (lambda: run(None), lambda: None, lambda: None),  # A/A
    }


def measure(
    scenarios: dict[str, Any], rounds: int, ms: float
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in scenarios}
    sizes = {}
    with torch.no_grad():
        for name, (call, setup, teardown) in scenarios.items():
            setup()
            try:
                sizes[name] = calls_per_batch(call, ms)
            finally:
                teardown()
        n = min(sizes.values())
        for _ in range(rounds):
            order = list(scenarios)
            random.shuffle(order)
            for name in order:
                call, setup, teardown = scenarios[name]
                setup()
                try:
                    samples[name].append(time_batch(call, n))
                finally:
                    teardown()
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tables", default="exact,positions", help="exact, positions or both"
    )
    args = parser.parse_args(argv)
    tables = set(args.tables.split(","))
    models = [m for m in args.models.split(",") if m]
    ms = 5.0
    if args.quick:
        args.rounds, args.batches, ms = 2, 2, 1.0
        models = [m for m in models if m == "mlp"] or models[:1]
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    random.seed(args.seed)
    print(
        f"# benchmarks/exact.py, {dt.datetime.now(tz=dt.UTC).date()}, "
        f"{platform.machine()} {platform.system()}, torch {torch.__version__}, "
        f"one thread, {args.rounds} rounds, CPU time of the thread"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
    )
    if "exact" in tables:
        exact_table(models, args.rounds, ms, args.seed)
    if "positions" in tables:
        positions_table(models, args, ms)
    return 1 if FAILED else 0


def exact_table(models: list[str], rounds: int, ms: float, seed: int) -> None:
    print(
        "\n| model | copies per pass | exact / uncopied | A/A (exact / exact) | "
        "exact / hand | exact / hand_clone | uncopied / plain |\n"
        "|---|---|---|---|---|---|---|"
    )
    for name in models:
        torch.manual_seed(seed)
        case = build(name)
        scenarios, copies = exact_scenarios(case)
        s = measure(scenarios, rounds, ms)
        print(
            f"| {name} | {copies} | {paired(s, 'exact', 'uncopied'):.3f} | "
            f"{paired(s, 'exact', 'exact_again'):.3f} | "
            f"{paired(s, 'exact', 'hand'):.3f} | {paired(s, 'exact', 'hand_clone'):.3f} | "
            f"{paired(s, 'uncopied', 'plain'):.3f} |"
        )


def positions_table(models: list[str], args: argparse.Namespace, ms: float) -> None:
    print(
        "\n| model | collect, from_mask / None | A/A (None / None) | batches |\n"
        "|---|---|---|---|"
    )
    for name in models:
        torch.manual_seed(args.seed)
        case = build(name)
        s = measure(position_scenarios(case, args.batches), args.rounds, ms)
        print(
            f"| {name} | {paired(s, 'from_mask', 'none'):.3f} | "
            f"{paired(s, 'none', 'none_again'):.3f} | {args.batches} |"
        )
    if not args.quick:
        s = measure(gpt2_positions(args.batches), args.rounds, ms)
        print(
            f"| gpt2 (2 x 64, left-padded 8 x 32) | "
            f"{paired(s, 'from_mask', 'none'):.3f} | "
            f"{paired(s, 'none', 'none_again'):.3f} | {args.batches} |"
        )


if __name__ == "__main__":
    sys.exit(main())
