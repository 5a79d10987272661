"""Measure what recording costs inside ``torch.compile(..., fullgraph=True)``.

For each model (CPU, one thread, eval mode, ``torch.no_grad()``), on copies of
one network with the same weights:

* ``eager``: ``net(x)``, uncompiled (for reference);
* ``plain``: ``torch.compile(net, fullgraph=True)(x)``, no hook anywhere;
* ``one``: ``torch.compile(rnet, fullgraph=True)(x)`` recording one layer;
* ``all``: the same, recording every recordable label of the table.

Runs are interleaved: each round times one batch of calls of every scenario,
in a freshly shuffled order, and each ratio is the median over rounds of the
two scenarios' times in the same round (paired), so slow drifts of a shared
machine cancel. Batches are short (1 ms by default, well under a scheduler
time slice), so that on a loaded machine most batches run uninterrupted and
the few that are not fall outside the median; the MLP gets more rounds
(201) than the CNN (31), whose calls are long. The report also gives:

* compile time: the first call after ``torch._dynamo.reset()`` of the compiled
  recorder (one layer) over the compiled plain net, median of paired repeats;
* graph breaks, from ``torch._dynamo.explain`` (must be 0);
* recompiles: new graphs while switching between the two selections and
  back (one per distinct selection, none when a selection comes back);
* a check that records equal the eager recorder's within float32 tolerance and
  that the output equals the compiled plain net's.

``python benchmarks/compile.py --help`` lists the options; ``--quick`` is the
smoke run CI does.
"""

from __future__ import annotations

import argparse
import copy
import gc
import platform
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
import torch._dynamo.testing
import torch._functorch.config
import torch._inductor.config
from torch import nn

from scio_recorder import Recorder
from scio_recorder.models import resnet18_cifar

EPS = torch.finfo(torch.float32).eps


def mlp() -> nn.Module:
    """The 64-128-128-10 perceptron of issue 11."""
    return nn.Sequential(
        nn.Linear(64, 128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


@dataclass
class Case:
    name: str
    net: nn.Module
    x: torch.Tensor
    one: str  # the name of the module whose output is "one layer"
    rounds: int  # the default number of rounds


def build_case(name: str) -> Case:
    if name == "mlp":
        return Case("mlp", mlp().eval(), torch.randn(1, 64), "2", 201)
    if name == "cnn":
        return Case(
            "cnn", resnet18_cifar().eval(), torch.randn(16, 3, 32, 32), "layer3", 31
        )
    msg = f"unknown model {name!r}"
    raise ValueError(msg)


@dataclass
class Scenario:
    name: str
    call: Any
    samples_ns: list[float] = field(default_factory=list)


def time_batch(call: Any, n: int) -> float:
    """Return the mean time of one call, in ns, over ``n`` calls (GC off)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(n):
            call()
        return (time.perf_counter_ns() - start) / n
    finally:
        gc.enable()


def paired(a: Scenario, b: Scenario) -> float:
    return statistics.median(
        x / y for x, y in zip(a.samples_ns, b.samples_ns, strict=True)
    )


def recorder(net: nn.Module, x: torch.Tensor) -> Recorder:
    return Recorder(net, input_size=(1, *x.shape[1:]))


def labels_all(rnet: Recorder) -> list[Any]:
    return [row.label for row in rnet.table.rows if row.recordable]


def compile_seconds(case: Case, repeats: int) -> tuple[float, float, float]:
    """Median first-call times (plain, recorder one layer) and their paired ratio."""
    plain_s, rec_s, ratios = [], [], []
    for _ in range(repeats):
        times = {}
        for which in random.sample(["plain", "one"], 2):
            torch._dynamo.reset()
            net = copy.deepcopy(case.net)
            if which == "plain":
                target: Any = net
            else:
                target = recorder(net, case.x)
                target.record(case.one)
            compiled = torch.compile(target, fullgraph=True)
            # No cache: each repeat compiles from scratch, as a first run does.
            with (
                torch._inductor.config.patch(fx_graph_cache=False),
                torch._functorch.config.patch(enable_autograd_cache=False),
                torch.no_grad(),
            ):
                start = time.perf_counter()
                compiled(case.x)
                times[which] = time.perf_counter() - start
        plain_s.append(times["plain"])
        rec_s.append(times["one"])
        ratios.append(times["one"] / times["plain"])
    return (
        statistics.median(plain_s),
        statistics.median(rec_s),
        statistics.median(ratios),
    )


def graph_breaks(rnet: Recorder, x: torch.Tensor) -> int:
    torch._dynamo.reset()
    with torch.no_grad():
        return int(torch._dynamo.explain(rnet)(x).graph_break_count)


def recompiles(case: Case) -> tuple[int, int]:
    """New graphs for one, all, one again, all again (expected: 1, 1, 0, 0)."""
    torch._dynamo.reset()
    rnet = recorder(copy.deepcopy(case.net), case.x)
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(rnet, fullgraph=True, backend=counter)
    counts = []
    with torch.no_grad():
        for selection in ([case.one], labels_all(rnet), [case.one], labels_all(rnet)):
            rnet.record(*selection)
            before = counter.frame_count
            compiled(case.x)
            compiled(case.x)
            counts.append(counter.frame_count - before)
    return sum(counts[:2]), sum(counts[2:])


def check(
    case: Case, rnet: Recorder, compiled: Any, plain: Any, *, exact: bool
) -> list[str]:
    """Compare the compiled records with eager ones and the output with plain.

    ``exact``: the output must equal the compiled plain net's bit for bit
    (one recorded layer). With every layer recorded inductor may fuse
    differently, and the output is held to the records' tolerance instead.
    """
    problems = []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # in-place ReLUs overwrite some records
        rnet(case.x)
        eager = dict(rnet.activations)
        out, expected = compiled(case.x), plain(case.x)
        scale = float(expected.abs().max()) + 1.0
        off = float((out - expected).abs().max())
        if (exact and off != 0.0) or off > 1024 * EPS * scale:
            problems.append(f"{case.name}: output differs from the compiled plain net")
    for label, record in eager.items():
        got = rnet.activations[label]
        # Differently fused float32 kernels: a few hundred eps of the magnitude.
        scale = float(record.abs().max()) + 1.0
        if float((got - record).abs().max()) > 1024 * EPS * scale:
            problems.append(f"{case.name}: record {label} differs from eager")
    return problems


def bench(case: Case, rounds: int, batch_ms: float, repeats: int) -> dict[str, Any]:
    torch._dynamo.reset()
    plain_net = copy.deepcopy(case.net)
    one_rnet = recorder(copy.deepcopy(case.net), case.x)
    one_rnet.record(case.one)
    all_rnet = recorder(copy.deepcopy(case.net), case.x)
    all_rnet.record(*labels_all(all_rnet))
    plain = torch.compile(plain_net, fullgraph=True)
    one = torch.compile(one_rnet, fullgraph=True)
    every = torch.compile(all_rnet, fullgraph=True)
    x = case.x
    scenarios = [
        Scenario("eager", lambda: case.net(x)),
        Scenario("plain", lambda: plain(x)),
        Scenario("one", lambda: one(x)),
        Scenario("all", lambda: every(x)),
    ]
    problems = check(case, one_rnet, one, plain, exact=True)
    problems += check(case, all_rnet, every, plain, exact=False)
    with torch.no_grad():
        for scenario in scenarios:  # warm up, and size the batches
            for _ in range(3):
                scenario.call()
        single = time_batch(scenarios[1].call, 20)
        n = max(5, int(batch_ms * 1e6 / single))
        for r in range(rounds):
            for scenario in random.sample(scenarios, len(scenarios)):
                scenario.samples_ns.append(time_batch(scenario.call, n))
            print(f"  {case.name}: round {r + 1}/{rounds}", file=sys.stderr)
    by = {s.name: s for s in scenarios}
    plain_s, rec_s, compile_ratio = compile_seconds(case, repeats)
    fresh_one = recorder(copy.deepcopy(case.net), case.x)
    fresh_one.record(case.one)
    fresh_all = recorder(copy.deepcopy(case.net), case.x)
    fresh_all.record(*labels_all(fresh_all))
    new_graphs, back = recompiles(case)
    return {
        "model": case.name,
        "rounds": rounds,
        "input": tuple(x.shape),
        "eager_us": statistics.median(by["eager"].samples_ns) / 1e3,
        "plain_us": statistics.median(by["plain"].samples_ns) / 1e3,
        "one": paired(by["one"], by["plain"]),
        "all": paired(by["all"], by["plain"]),
        "layers": len(labels_all(all_rnet)),
        "compile_plain_s": plain_s,
        "compile_one_s": rec_s,
        "compile_ratio": compile_ratio,
        "breaks_one": graph_breaks(fresh_one, x),
        "breaks_all": graph_breaks(fresh_all, x),
        "recompiles": new_graphs,
        "recompiles_back": back,
        "problems": problems,
    }


def row(r: dict[str, Any]) -> str:
    return (
        f"| {r['model']} | {r['input']} | {r['eager_us']:.0f} µs | "
        f"{r['plain_us']:.0f} µs | {r['one']:.3f} | {r['all']:.3f} "
        f"({r['layers']} labels) | {r['compile_plain_s']:.1f} s, "
        f"{r['compile_one_s']:.1f} s ({r['compile_ratio']:.2f}) | "
        f"{r['breaks_one']}, {r['breaks_all']} | {r['recompiles']}, "
        f"{r['recompiles_back']} |"
    )


def report(results: list[dict[str, Any]], batch_ms: float) -> str:
    machine = platform.processor() or platform.machine()
    header = (
        "| model | input | eager | compiled plain | one layer / plain | "
        "all layers / plain | compile time plain, recorder (ratio) | "
        "graph breaks (one, all) | recompiles (new selections, returning) |"
    )
    rounds = ", ".join(f"{r['model']} {r['rounds']}" for r in results)
    title = (
        f"torch {torch.__version__}, {machine}, 1 thread, rounds: {rounds} "
        f"(batches of {batch_ms:g} ms)"
    )
    lines = [
        f"{title}; ratios are medians of paired rounds",
        "",
        header,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *(row(r) for r in results),
    ]
    problems = [p for r in results for p in r["problems"]]
    lines += ["", *(f"CHECK FAILED: {p}" for p in problems)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp,cnn")
    parser.add_argument(
        "--rounds", type=int, help="rounds per model (default: 201 MLP, 31 CNN)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="compile-time repeats")
    parser.add_argument("--batch-ms", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="smoke run (CI)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats, args.batch_ms = 3, 1, 1.0
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    # Torch's own deprecation notices while compiling, not this benchmark's.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    cases = [build_case(name) for name in args.models.split(",")]
    results = [
        bench(case, args.rounds or case.rounds, args.batch_ms, args.repeats)
        for case in cases
    ]
    text = report(results, args.batch_ms)
    print(text)
    return 1 if "CHECK FAILED" in text else 0


if __name__ == "__main__":
    raise SystemExit(main())
