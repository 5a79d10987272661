"""Measure the time overhead of ``scio_recorder.Recorder`` on the CPU.

For each model, every scenario below is timed on the same network instance
(eval mode, ``torch.no_grad()``, one thread):

* ``plain``: ``net(x)``, no hook anywhere;
* ``recorder_none``: ``rnet(x)`` with a Recorder recording nothing;
* ``recorder_one``: ``rnet(x)`` recording one representative layer;
* ``hand_one``: ``net(x)`` with a hand-written forward hook on that same module,
  storing its output in a dict;
* ``recorder_all``: ``rnet(x)`` recording every recordable label of the table;
* ``hand_all``: ``net(x)`` with a hand-written hook on every module that has a
  recordable row;
* Transformer only, ``recorder_inner`` / ``hand_inner``: one layer *inside* an
  encoder layer (its hook disables that encoder layer's fused fast path).

Runs are interleaved: each round times one batch of N calls of every scenario,
in a freshly shuffled order; the report gives the median over rounds of the
time per call, its interquartile range, the ratio of medians to ``plain`` and,
for recorder scenarios, to the matching hand-written hooks. Hooks are placed
before a batch and removed after it, so every batch of ``plain`` runs on a net
without hooks (checked).

Run ``python benchmarks/overhead.py --help`` for the options; see
``benchmarks/README.md`` for how to read the output.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import platform
import random
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import scio_recorder
from scio_recorder import Recorder
from scio_recorder.models import resnet18_cifar, tiny_mlp, transformer_encoder

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# glibc's malloc (see mallopt(3)): parameter numbers from <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# By default glibc raises its mmap threshold each time a large mmapped block is
# freed, and trims the heap top when more than the trim threshold is free: a
# 4 MiB activation may then be mmapped (and page-faulted afresh on every call)
# or served from the heap depending on what ran before, which shifts CNN
# timings by several percent between scenarios. Pinning both parameters (which
# also disables the dynamic adjustment) makes them independent of history.
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum on 64-bit systems
TRIM_THRESHOLD = 512 * 1024 * 1024

ALL_MODELS = ("mlp", "cnn", "transformer", "relus")
RELUS = 100  # modules of the `relus` sweep
DEFAULT_ROUNDS = 41
QUICK_ROUNDS = 3
# Short batches, many rounds: shared machines change speed by up to 2x for
# seconds at a time, so each round's scenarios must run close together.
DEFAULT_BATCH_MS = 5.0  # minimum duration of one timed batch of calls
QUICK_BATCH_MS = 5.0


def pin_malloc() -> str:
    """Pin glibc's malloc thresholds; return a sentence saying what was done."""
    if not sys.platform.startswith("linux"):
        return "malloc: not pinned (not Linux)"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "malloc: not pinned (no glibc mallopt)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        return "malloc: mallopt failed, thresholds not pinned"
    return (
        f"malloc: glibc M_MMAP_THRESHOLD={MMAP_THRESHOLD >> 20} MiB and "
        f"M_TRIM_THRESHOLD={TRIM_THRESHOLD >> 20} MiB pinned with mallopt, so "
        "that timings do not depend on what ran before"
    )


# --------------------------------------------------------------------- models


@dataclass
class Case:
    """A model to benchmark, with its input and the layers to hook."""

    name: str
    net: nn.Module
    x: torch.Tensor
    summary_size: tuple[int, ...]
    force_static_flow: bool
    one: str  # qualified name of the "one layer" module
    inner: str | None = None  # a module inside an encoder layer (Transformer)
    rtol: float = 0.0  # tolerance when comparing outputs with `plain`
    atol: float = 0.0


def build_case(name: str) -> Case:
    if name == "mlp":
        return Case(
            name="mlp",
            net=tiny_mlp(),
            x=torch.randn(1, 16),
            summary_size=(1, 16),
            force_static_flow=True,
            one="2",  # the middle Linear
        )
    if name == "cnn":
        return Case(
            name="cnn",
            net=resnet18_cifar(),
            x=torch.randn(16, 3, 32, 32),
            summary_size=(1, 3, 32, 32),
            force_static_flow=True,
            one="layer3",  # output of the third stage
        )
    if name == "transformer":
        num_layers = 4
        return Case(
            name="transformer",
            net=transformer_encoder(num_layers=num_layers),
            x=torch.randn(8, 64, 256),
            summary_size=(1, 64, 256),
            # symbolic_trace cannot trace nn.TransformerEncoder.
            force_static_flow=False,
            # The encoder's output: hooking nn.TransformerEncoder itself keeps
            # the fused fast path of its layers.
            one="encoder",
            inner=f"encoder.layers.{num_layers - 1}.linear2",
            # A layer off the fast path computes with slightly different
            # rounding.
            rtol=1e-4,
            atol=1e-5,
        )
    if name == "relus":
        # The cost of one recorded module call: every scenario runs the same
        # RELUS tiny calls, so (scenario - plain) / RELUS is what a hook costs.
        return Case(
            name="relus",
            net=nn.Sequential(*[nn.ReLU() for _ in range(RELUS)]),
            x=torch.randn(1, 4),
            summary_size=(1, 4),
            force_static_flow=True,
            one=str(RELUS // 2),
        )
    msg = f"unknown model {name!r}"
    raise ValueError(msg)


# ----------------------------------------------------------------- scenarios


def table_rows(rnet: Recorder) -> list[Any]:
    """Rows of ``rnet.table`` in table order (a mapping or an iterable of rows)."""
    table: Any = rnet.table
    values = table.values() if hasattr(table, "values") else table
    return list(values)


@dataclass
class Scenario:
    """One way of calling the net, with what to do before and after a batch."""

    name: str
    call: Callable[[], Any]
    setup: Callable[[], None] = lambda: None
    teardown: Callable[[], None] = lambda: None
    hand: str | None = None  # the hand-written scenario to compare with
    baseline: str = "plain"  # the hook-free scenario to compare with
    describe: str = ""
    recorded: Callable[[], set[Any]] = set  # what the last call recorded
    expect: set[Any] = field(default_factory=set)  # what a call should record
    samples_ns: list[float] = field(default_factory=list)


def hand_hooks(
    modules: dict[str, nn.Module], store: dict[str, list[Any]]
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Return (setup, teardown) placing/removing a storing hook on each module."""
    handles: list[Any] = []

    def make_hook(name: str) -> Callable[[nn.Module, Any, Any], None]:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            store.setdefault(name, []).append(output)

        return hook

    def setup() -> None:
        handles.extend(
            module.register_forward_hook(make_hook(name))
            for name, module in modules.items()
        )

    def teardown() -> None:
        for handle in handles:
            handle.remove()
        handles.clear()
        store.clear()

    return setup, teardown


def build_scenarios(case: Case, rnet: Recorder) -> list[Scenario]:
    """Build the scenarios of ``case``, all sharing ``case.net``."""
    net, x = case.net, case.x
    recordable = [row for row in table_rows(rnet) if row.recordable]
    named = dict(net.named_modules())

    def recorder_call() -> Any:
        return rnet(x)

    def plain_call() -> Any:
        return net(x)

    def stop_recording() -> None:
        rnet.record()

    def recorder_keys() -> set[Any]:
        return set(rnet.activations)

    scenarios = [
        Scenario("plain", plain_call, describe="net(x)"),
        Scenario(
            "recorder_none",
            recorder_call,
            setup=stop_recording,
            describe="rnet(x), recording nothing",
            recorded=recorder_keys,
        ),
    ]
    groups: list[tuple[str, str | None]] = [("one", case.one)]
    if case.inner is not None:
        groups.append(("inner", case.inner))
    groups.append(("all", None))
    for suffix, module_name in groups:
        if module_name is None:
            labels = [row.label for row in recordable]
            modules = {row.name: row.module for row in recordable}
            what = f"{len(labels)} labels on {len(modules)} modules"
        else:
            labels = [row.label for row in recordable if row.name == module_name][:1]
            if not labels:
                msg = f"{case.name}: no recordable row for module {module_name!r}"
                raise LookupError(msg)
            modules = {module_name: named[module_name]}
            kind = type(named[module_name]).__name__
            what = f"{labels[0]} = `{module_name}` ({kind})"
        store: dict[str, list[Any]] = {}
        setup, teardown = hand_hooks(modules, store)

        def hand_call(store: dict[str, list[Any]] = store) -> Any:
            store.clear()
            return net(x)

        def record(labels: list[tuple[int, int]] = labels) -> None:
            rnet.record(*labels)

        def hand_keys(store: dict[str, list[Any]] = store) -> set[Any]:
            return set(store)

        scenarios += [
            Scenario(
                f"recorder_{suffix}",
                recorder_call,
                setup=record,
                teardown=stop_recording,
                hand=f"hand_{suffix}",
                describe=f"rnet(x) recording {what}",
                recorded=recorder_keys,
                expect=set(labels),
            ),
            Scenario(
                f"hand_{suffix}",
                hand_call,
                setup=setup,
                teardown=teardown,
                describe=f"net(x), hand-written hooks on {len(modules)} module(s)",
                recorded=hand_keys,
                expect=set(modules),
            ),
        ]
    if case.name != "relus":  # no parameter: no gradient to capture
        scenarios += capture_scenarios(case, rnet, recordable, named)
    return scenarios


def capture_scenarios(
    case: Case, rnet: Recorder, recordable: list[Any], named: dict[str, nn.Module]
) -> list[Scenario]:
    """Inputs and output gradients of the "one" layer, vs hand-written hooks.

    Gradient scenarios time a forward and a backward pass with gradients
    enabled, against ``plain_grad`` (the same without hooks).
    """
    net, x = case.net, case.x
    label = next(row.label for row in recordable if row.name == case.one)
    module = named[case.one]
    handles: list[Any] = []
    store: dict[str, Any] = {}

    def stop() -> None:
        rnet.record()
        for handle in handles:
            handle.remove()
        handles.clear()
        store.clear()

    def hand_input() -> None:
        def pre_hook(_module: nn.Module, args: Any, kwargs: Any) -> None:
            store["inputs"] = (args, kwargs)

        handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))

    def hand_grad() -> None:
        def keep(grad: torch.Tensor) -> None:
            store["grad"] = grad

        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            output.register_hook(keep)

        handles.append(module.register_forward_hook(hook))

    def forward_backward(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.enable_grad():
                out = call()
                out.sum().backward()
            net.zero_grad(set_to_none=True)
            return out.detach()

        return run

    inputs = [
        Scenario(
            "recorder_input_one",
            lambda: rnet(x),
            setup=lambda: rnet.record(inputs=label),
            teardown=stop,
            hand="hand_input_one",
            describe=f"rnet(x) recording the inputs of {label} = `{case.one}`",
            recorded=lambda: set(rnet.inputs),
            expect={label},
        ),
        Scenario(
            "hand_input_one",
            lambda: net(x),
            setup=hand_input,
            teardown=stop,
            describe="net(x), a hand-written pre-hook storing (args, kwargs)",
            recorded=lambda: set(store),
            expect={"inputs"},
        ),
    ]
    if case.name == "transformer":  # a backward pass there dwarfs everything
        return inputs
    return [
        *inputs,
        Scenario(
            "plain_grad",
            forward_backward(lambda: net(x)),
            describe="net(x).sum().backward(), gradients enabled",
        ),
        Scenario(
            "recorder_grad_one",
            forward_backward(lambda: rnet(x)),
            setup=lambda: rnet.record(grads=label),
            teardown=stop,
            hand="hand_grad_one",
            baseline="plain_grad",
            describe=f"the same through rnet, recording the gradient of {label}",
            recorded=lambda: set(rnet.gradients),
            expect={label},
        ),
        Scenario(
            "hand_grad_one",
            forward_backward(lambda: net(x)),
            setup=hand_grad,
            teardown=stop,
            baseline="plain_grad",
            describe="the same on net, a hand-written hook adding a tensor hook",
            recorded=lambda: set(store),
            expect={"grad"},
        ),
    ]


# ------------------------------------------------------------------- helpers


def hooks_anywhere(net: nn.Module) -> int:
    """Count forward (pre-)hooks on ``net``'s modules and global ones."""
    from torch.nn.modules import module as module_mod  # noqa: PLC0415

    count = len(getattr(module_mod, "_global_forward_hooks", {}))
    count += len(getattr(module_mod, "_global_forward_pre_hooks", {}))
    for module in net.modules():
        count += len(module._forward_hooks) + len(module._forward_pre_hooks)
    return count


@contextlib.contextmanager
def count_fast_path() -> Iterator[list[int]]:
    """Count calls of torch's fused TransformerEncoderLayer kernel.

    ``TransformerEncoderLayer.forward`` looks ``torch._transformer_encoder_layer_fwd``
    up at call time, so replacing the attribute of ``torch`` intercepts it.
    """
    original = torch._transformer_encoder_layer_fwd
    counter = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return original(*args, **kwargs)

    torch._transformer_encoder_layer_fwd = counting
    try:
        yield counter
    finally:
        torch._transformer_encoder_layer_fwd = original


CLOCKS = {"thread": time.thread_time_ns, "wall": time.perf_counter_ns}
CLOCK = [time.thread_time_ns]
"""The clock of :func:`time_batch` (``--clock``)."""


def time_batch(call: Callable[[], Any], n: int) -> float:
    """Return the mean time of one call, in ns, over ``n`` calls (GC off).

    The clock is the thread's CPU time by default: with one torch thread the
    calls run on this thread alone, and CPU time leaves out the time a shared
    machine gives other processes (which wall time counts, by up to 2x for
    seconds at a time). ``--clock wall`` times wall-clock time.
    """
    clock = CLOCK[0]
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = clock()
        for _ in range(n):
            call()
        stop = clock()
    finally:
        if gc_was_enabled:
            gc.enable()
    return (stop - start) / n


def run_in(scenario: Scenario, fn: Callable[[], Any]) -> Any:
    scenario.setup()
    try:
        return fn()
    finally:
        scenario.teardown()


def timed(scenario: Scenario, n: int) -> float:
    """Set the scenario up, time a batch of ``n`` calls, tear it down."""
    return float(run_in(scenario, functools.partial(time_batch, scenario.call, n)))


def paired_ratio(scenario: Scenario, other: Scenario) -> float:
    """Median over rounds of this scenario's time over ``other``'s, same round.

    Both ran within one round, close together: pairing them cancels the slow
    drifts of a shared machine's speed that a ratio of medians would keep.
    """
    return statistics.median(
        a / b for a, b in zip(scenario.samples_ns, other.samples_ns, strict=True)
    )


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q2, q3


# -------------------------------------------------------------------- driver


def check_scenarios(case: Case, scenarios: list[Scenario]) -> list[str]:
    """Run each scenario once; check its output and what it records."""
    problems: list[str] = []
    reference = case.net(case.x)
    for scenario in scenarios:
        if scenario.name == "plain" and hooks_anywhere(case.net):
            problems.append("plain: the net carries hooks")

        def once(scenario: Scenario = scenario) -> tuple[Any, set[Any]]:
            return scenario.call(), scenario.recorded()

        out, recorded = run_in(scenario, once)
        if not torch.allclose(out, reference, rtol=case.rtol, atol=case.atol):
            diff = (out - reference).abs().max().item()
            problems.append(f"{scenario.name}: output differs (max |diff| {diff:.3g})")
        if recorded != scenario.expect:
            problems.append(
                f"{scenario.name}: recorded {len(recorded)} items, "
                f"expected {len(scenario.expect)}"
            )
    if hooks_anywhere(case.net):
        problems.append("hooks left on the net after the scenarios")
    return problems


def fast_path_counts(scenarios: list[Scenario]) -> dict[str, int]:
    counts = {}
    for scenario in scenarios:
        with count_fast_path() as counter:
            run_in(scenario, scenario.call)
        counts[scenario.name] = counter[0]
    return counts


def bench_case(
    case: Case, rounds: int, batch_ms: float, rng: random.Random
) -> dict[str, Any]:
    net = case.net.eval()
    start = time.perf_counter()
    rnet = Recorder(
        net, input_size=case.summary_size, force_static_flow=case.force_static_flow
    )
    build_s = time.perf_counter() - start
    net.eval()
    scenarios = build_scenarios(case, rnet)
    by_name = {scenario.name: scenario for scenario in scenarios}

    # Warm up every scenario, then size batches from the plain net's speed.
    for scenario in scenarios:
        timed(scenario, 3)
    plain_ns = min(time_batch(by_name["plain"].call, 3) for _ in range(3))
    n_calls = max(1, round(batch_ms * 1e6 / plain_ns))
    for scenario in scenarios:
        timed(scenario, n_calls)

    problems = check_scenarios(case, scenarios)
    counts = fast_path_counts(scenarios) if case.name == "transformer" else {}

    for round_index in range(rounds):
        order = scenarios[:]
        rng.shuffle(order)
        for scenario in order:
            if scenario.name == "plain" and hooks_anywhere(net):
                msg = "hooks left on the net before a plain batch"
                raise RuntimeError(msg)
            scenario.samples_ns.append(timed(scenario, n_calls))
        print(
            f"  {case.name}: round {round_index + 1}/{rounds}",
            file=sys.stderr,
            end="\r" if round_index + 1 < rounds else "\n",
        )
    return {
        "scenarios": scenarios,
        "n_calls": n_calls,
        "build_s": build_s,
        "problems": problems,
        "fast_path": counts,
        "table_rows": len(table_rows(rnet)),
    }


def format_report(
    header: list[str], results: dict[str, dict[str, Any]], fast_path_layers: int
) -> str:
    lines = [*header, ""]
    lines.append(
        "| model | scenario | median µs | IQR µs | ratio to plain* "
        "| ratio to hand-written* |"
    )
    lines.append("|---|---|---:|---:|---:|---:|")
    notes = []
    for model, result in results.items():
        scenarios = result["scenarios"]
        by_name = {s.name: s for s in scenarios}
        for scenario in scenarios:
            q1, median, q3 = quartiles(scenario.samples_ns)
            to_plain = paired_ratio(scenario, by_name[scenario.baseline])
            to_hand = (
                f"{paired_ratio(scenario, by_name[scenario.hand]):.3f}"
                if scenario.hand
                else "—"
            )
            lines.append(
                f"| {model} | {scenario.name} | {median / 1e3:,.1f} "
                f"| {(q3 - q1) / 1e3:,.1f} | {to_plain:.3f} | {to_hand} |"
            )
        notes.append(
            f"- {model}: {result['n_calls']} call(s) per batch, "
            f"{len(scenarios[0].samples_ns)} rounds; table of "
            f"{result['table_rows']} rows built in {result['build_s']:.2f} s"
        )
        notes.extend(f"  - `{s.name}`: {s.describe}" for s in scenarios)
        notes.extend(f"  - CHECK FAILED: {p}" for p in result["problems"])
    lines += ["", *notes]
    relus = results.get("relus")
    if relus:
        by_name = {s.name: s for s in relus["scenarios"]}
        plain = quartiles(by_name["plain"].samples_ns)[1]
        # hooks on every module and on the root Sequential: RELUS + 1 calls
        per_call = {
            name: (quartiles(by_name[name].samples_ns)[1] - plain) / (RELUS + 1)
            for name in ("recorder_all", "hand_all")
        }
        lines += [
            "",
            (
                f"Per recorded module call (relus: {RELUS} ReLUs and the root, "
                "median over rounds, minus `plain`): recorder "
                f"{per_call['recorder_all'] / 1e3:.2f} µs, hand-written dict-store "
                f"hook {per_call['hand_all'] / 1e3:.2f} µs, ratio "
                f"{per_call['recorder_all'] / per_call['hand_all']:.2f}"
            ),
        ]
    counts = results.get("transformer", {}).get("fast_path")
    if counts:
        lines += [
            "",
            (
                "TransformerEncoderLayer fused fast-path calls per forward pass "
                f"(the encoder has {fast_path_layers} layers):"
            ),
            "",
            "| scenario | fast-path calls per pass |",
            "|---|---:|",
        ]
        lines += [f"| {name} | {count} |" for name, count in counts.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure the overhead of scio_recorder.Recorder (CPU, 1 thread)."
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=(
            f"interleaved rounds (default {DEFAULT_ROUNDS}, "
            f"{QUICK_ROUNDS} with --quick)"
        ),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few rounds and short batches: a smoke run, not a measurement",
    )
    parser.add_argument(
        "--models",
        default=",".join(ALL_MODELS),
        help=f"comma-separated subset of {','.join(ALL_MODELS)} (default: all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument(
        "--no-pin-malloc",
        action="store_true",
        help="leave glibc's malloc thresholds dynamic (to see their effect)",
    )
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="thread",
        help=(
            "what a batch is timed by: the thread's CPU time (default; one torch "
            "thread runs every call on it, and a loaded machine's other "
            "processes do not count) or wall-clock time"
        ),
    )
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(ALL_MODELS))
    if unknown or not args.models:
        parser.error(f"--models: unknown or empty {unknown}; choose from {ALL_MODELS}")
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    malloc_note = (
        "malloc: not pinned (--no-pin-malloc)" if args.no_pin_malloc else pin_malloc()
    )
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    CLOCK[0] = CLOCKS[args.clock]
    # Recording an in-place ReLU's input is flagged once per label; the
    # benchmark measures time, not what the records hold.
    inplace_warning = getattr(scio_recorder, "InPlaceWarning", None)
    if inplace_warning is not None:
        warnings.simplefilter("ignore", inplace_warning)

    batch_ms = QUICK_BATCH_MS if args.quick else DEFAULT_BATCH_MS
    header = [
        "# scio_recorder overhead",
        "",
        (
            f"- torch {torch.__version__}, Python {platform.python_version()}, "
            f"{platform.machine()} {platform.system()}; CPU, "
            f"{torch.get_num_threads()} thread, eval mode, torch.no_grad()"
        ),
        f"- {malloc_note}",
        (
            f"- {args.rounds} interleaved rounds (shuffled order each round); a "
            "sample is the mean time per call over a batch of calls lasting about "
            f"{batch_ms:g} ms or one call, timed by the "
            f"{'thread CPU' if args.clock == 'thread' else 'wall-clock'} time; "
            "median and interquartile range over "
            "rounds" + (" (--quick: a smoke run, not a measurement)" * args.quick)
        ),
        (
            "- *ratios are paired: the median over rounds of (this scenario's "
            "time / the other's time in the same round); gradient scenarios "
            "compare with `plain_grad`"
        ),
    ]
    results: dict[str, dict[str, Any]] = {}
    fast_path_layers = 0
    started = time.perf_counter()
    with torch.no_grad():
        for model in args.models:
            case = build_case(model)
            fast_path_layers += sum(
                isinstance(module, nn.TransformerEncoderLayer)
                for module in case.net.modules()
            )
            print(f"{model}: building and warming up", file=sys.stderr)
            results[model] = bench_case(case, args.rounds, batch_ms, rng)
    header.append(f"- total run time {time.perf_counter() - started:.0f} s")
    report = format_report(header, results, fast_path_layers)
    print(report, end="")
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")
    return 1 if any(r["problems"] for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
