"""Measure calibration-statistics collection with ``scio_recorder.collect``.

A ResNet-18 for 32x32 images (``scio_recorder.models.resnet18_cifar()``, eval
mode, random weights) sees random images ``[3, 32, 32]`` in batches of 128,
with random targets in 10 classes. Its penultimate features, the output of
``avgpool`` (``[batch, 512, 1, 1]``: 512 values per sample, the input of
``fc`` once flattened), are collected two ways:

* (a) ``concat``: every feature vector, concatenated on the CPU;
* (b) ``shared``: per-class means and the shared (tied) covariance over the
  10 classes, ``SharedCovariance(num_classes=10)``, streamed in float64.

Each task is timed through :func:`scio_recorder.collect.collect` and through a
hand-written loop with one ``register_forward_hook`` on ``avgpool`` that does
the same work: for (a) the hook copies each output to the CPU and the loop
concatenates at the end; for (b) the hook feeds each output, with the batch's
targets, to a ``SharedCovariance`` object (the same reducer class), so that
only the plumbing differs. A ``plain`` loop (forward passes, no hook) gives
the cost of the passes themselves, and ``plain_b``, the same loop on another
copy of the net, is an A/A control: its ratio to ``plain`` shows how far
ratios move by noise alone.

Runs are interleaved batch by batch: in a round, every scenario runs one
full collection (every sample) in its own thread, with its own copy of the
net (same weights, so that no hook of one fires in the passes of another),
and a conductor hands each batch to every scenario in turn, in a freshly
shuffled order, one at a time (the threads never run together; one torch
thread each). A sample is the time of one batch, from receiving it to asking
for the next (forward pass, hooks, reduction), so a burst of load from outside
hits every scenario alike. The report gives, per scenario, the median and
interquartile range of those times, the medians of the per-batch ratios to
``plain`` and to the matching hand-written loop (same batch, same round), and
per-run totals (with the setup before the first batch and the final
``result()``). The target for collect over hand-written is 1.05 or less.

Peak memory: ``plain`` and each task run again in a fresh subprocess per
number of samples (4,096 and 16,384 by default; images drawn batch by batch so
that the input does not grow; glibc's malloc pinned to unmap freed tensors),
and the report gives the peak resident set size during the run (``VmHWM``,
reset after a warm-up collection of two batches) minus the RSS at its start.
For (b) it must not grow with the number of samples (checked).

Numerical check: the class means and shared covariance of (b), from
``collect`` and from the hand-written loop, are compared with a float64
two-pass computation on the features concatenated by (a).

``--precision auto`` (the default) picks bfloat16 where the CPU has native
bfloat16 instructions (``avx512_bf16`` or ``amx_bf16`` among its flags) and
float32 elsewhere. ``bfloat16`` runs the passes under
``torch.autocast("cpu", dtype=torch.bfloat16)`` with channels-last tensors:
faster than float32 only with those instructions, and much slower without
them (emulated: 8.5x slower than float32 for ResNet-18 at batch 32 on an
AVX2-only AMD EPYC). The collection work is the same up to the dtype of the
features (bfloat16 rows are half the bytes to copy and keep); what changes is
the cost of the passes around it.

Run ``python benchmarks/calibration.py --help`` for the options; see
``benchmarks/README.md`` for the other benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.models import resnet18_cifar
from scio_recorder.reduce import SharedCovariance

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

NUM_CLASSES = 10
BATCH_SIZE = 128
LAYER = "avgpool"  # output [batch, 512, 1, 1]: the penultimate features
FEATURES = 512
DEFAULT_SAMPLES = 4096
QUICK_SAMPLES = 256
DEFAULT_MEMORY_SAMPLES = (4096, 16384)
QUICK_MEMORY_SAMPLES = (256, 1024)
DEFAULT_ROUNDS = 2
QUICK_ROUNDS = 1
WARMUP_BATCHES = 2
TASKS = ("concat", "shared")
RATIO_TARGET = 1.05
MIB = 1024 * 1024
# glibc's malloc (see mallopt(3)): parameter numbers from <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


# ----------------------------------------------------------------------- data


def batch_at(index: int, seed: int, batch_size: int = BATCH_SIZE) -> tuple[Any, Any]:
    """Return batch ``index``: images and targets drawn from their own seed."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    x = torch.randn(batch_size, 3, 32, 32, generator=gen)
    y = torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen)
    return x.contiguous(memory_format=torch.channels_last), y


def lazy_batches(num_samples: int, seed: int) -> Iterator[tuple[Any, Any]]:
    """Yield the batches of ``num_samples`` samples one at a time."""
    for index, start in enumerate(range(0, num_samples, BATCH_SIZE)):
        yield batch_at(index, seed, min(BATCH_SIZE, num_samples - start))


def build_net() -> tuple[nn.Module, Recorder]:
    net = resnet18_cifar(num_classes=NUM_CLASSES).eval()
    net = net.to(memory_format=torch.channels_last)
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    net.eval()
    return net, rnet


def native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (Linux flags; else False)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def resolve_precision(precision: str) -> str:
    if precision == "auto":
        return "bfloat16" if native_bfloat16() else "float32"
    return precision


def precision_context(precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "bfloat16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ------------------------------------------------------------------ scenarios


def keep_spec(task: str) -> dict[str, Any]:
    """The ``keep`` argument of ``collect`` for a task."""
    if task == "concat":
        return {LAYER: "concat"}
    return {LAYER: SharedCovariance(num_classes=NUM_CLASSES)}


def only_value(result: Any) -> Any:
    """Return the single result of a one-label ``collect`` result."""
    values = list(result.values())
    if len(values) != 1:
        msg = f"expected one result, got {len(values)}: {list(result)}"
        raise RuntimeError(msg)
    return values[0]


def run_collect(rnet: Recorder, task: str, batches: Any) -> Any:
    from scio_recorder.collect import collect  # noqa: PLC0415 (optional module)

    target = 1 if task == "shared" else None
    result = collect(rnet, batches, keep_spec(task), target=target, progress=False)
    return only_value(result)


def run_hand(net: nn.Module, task: str, batches: Any) -> Any:
    """The same collection with one hand-written forward hook on ``avgpool``."""
    module = net.get_submodule(LAYER)
    chunks: list[torch.Tensor] = []
    reducer = SharedCovariance(num_classes=NUM_CLASSES)
    current: list[Any] = [None]  # the targets of the batch in flight

    if task == "concat":

        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            chunks.append(
                output.detach().to(
                    "cpu", memory_format=torch.contiguous_format, copy=True
                )
            )

    else:

        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            reducer.update(output, current[0])

    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            for x, y in batches:
                current[0] = y
                net(x)
    finally:
        handle.remove()
    return torch.cat(chunks) if task == "concat" else reducer.result()


def run_plain(net: nn.Module, batches: Any) -> None:
    with torch.no_grad():
        for x, _ in batches:
            net(x)


@dataclass
class Scenario:
    name: str
    task: str | None
    call: Callable[[Any], Any]
    hand: str | None = None
    describe: str = ""
    runs_s: list[float] = field(default_factory=list)  # one full collection
    steps_s: list[float] = field(default_factory=list)  # one batch, all rounds
    edges_s: list[float] = field(default_factory=list)  # setup + result
    last: Any = None


def build_scenarios(net: nn.Module) -> list[Scenario]:
    """The scenarios, each with its own copy of ``net`` (same weights).

    Each scenario runs in its own thread during a round, so that no hook of
    one can fire in the passes of another.
    """

    def twin() -> nn.Module:
        return copy.deepcopy(net).eval()

    plain_net, control_net = twin(), twin()
    scenarios = [
        Scenario(
            "plain",
            None,
            lambda batches: run_plain(plain_net, batches),
            describe="forward passes only, no hook",
        ),
        Scenario(
            "plain_b",
            None,
            lambda batches: run_plain(control_net, batches),
            describe=(
                "A/A control: `plain` again, on another copy of the net; its "
                "ratio to `plain` shows the noise floor of the ratios (load, "
                "copies of the net)"
            ),
        ),
    ]
    for task in TASKS:
        what = (
            "concatenate the features on the CPU"
            if task == "concat"
            else f"SharedCovariance(num_classes={NUM_CLASSES})"
        )
        rnet = Recorder(twin(), input_size=(1, 3, 32, 32))
        rnet.net.eval()
        hand_net = twin()
        scenarios += [
            Scenario(
                f"collect_{task}",
                task,
                lambda batches, task=task, rnet=rnet: run_collect(rnet, task, batches),
                hand=f"hand_{task}",
                describe=f"`collect(rnet, batches, {{{LAYER!r}: ...}})`: {what}",
            ),
            Scenario(
                f"hand_{task}",
                task,
                lambda batches, task=task, net=hand_net: run_hand(net, task, batches),
                describe=(
                    "one hand-written forward hook: "
                    + (
                        "copies each output to the CPU, `torch.cat` at the end"
                        if task == "concat"
                        else "feeds each output and the batch's targets to a "
                        "`SharedCovariance` object (same reducer, plumbing only)"
                    )
                ),
            ),
        ]
    return scenarios


class Lane:
    """One scenario's run in its own thread, fed one batch per turn.

    The conductor (:func:`lockstep`) gives the turn to one lane at a time:
    the lane's loop (``collect`` or a hand-written loop) receives a batch,
    processes it and asks for the next one, which ends its turn. A *step* is
    the time from receiving a batch to asking for the next: forward pass,
    hooks and reduction. Setup (before the first batch) and the final
    ``result()`` (after the last) are turns too, timed apart.
    """

    def __init__(self, scenario: Scenario, batches: list[Any], precision: str) -> None:
        self.scenario = scenario
        self.batches = batches
        self.precision = precision
        self.go = threading.Semaphore(0)
        self.done = threading.Semaphore(0)
        self.steps: list[float] = []
        self.started = self.setup = self.finish_start = self.finish = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.work, name=scenario.name)
        self.thread.daemon = True

    def feed(self) -> Iterator[Any]:
        self.setup = time.perf_counter() - self.started
        self.done.release()  # ready for the first batch
        for batch in self.batches:
            self.go.acquire()
            start = time.perf_counter()
            yield batch
            self.steps.append(time.perf_counter() - start)
            self.done.release()
        self.go.acquire()  # the turn of the final result
        self.finish_start = time.perf_counter()

    def work(self) -> None:
        torch.set_num_threads(1)  # per thread with OpenMP
        self.started = time.perf_counter()
        try:
            with precision_context(self.precision):
                self.scenario.last = self.scenario.call(self.feed())
            self.finish = time.perf_counter() - self.finish_start
        except BaseException as error:  # noqa: BLE001 (re-raised by the conductor)
            self.error = error
        finally:
            self.done.release()

    def wait(self) -> None:
        """Wait for the end of this lane's turn; re-raise its error."""
        while not self.done.acquire(timeout=1.0):
            if not self.thread.is_alive():
                break
        if self.error is not None:
            msg = f"{self.scenario.name} failed"
            raise RuntimeError(msg) from self.error


def lockstep(
    scenarios: list[Scenario], batches: list[Any], precision: str, rng: random.Random
) -> None:
    """Run one full collection of every scenario, interleaved batch by batch.

    For each batch, every scenario processes it in turn, in a freshly
    shuffled order, one at a time: a burst of load from outside hits every
    scenario alike.
    """
    lanes = [Lane(scenario, batches, precision) for scenario in scenarios]
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for lane in lanes:  # setup, one lane at a time
            lane.thread.start()
            lane.wait()
        for _ in range(len(batches) + 1):  # the batches, then the results
            order = lanes[:]
            rng.shuffle(order)
            for lane in order:
                lane.go.release()
                lane.wait()
        for lane in lanes:
            lane.thread.join()
    finally:
        if gc_was_enabled:
            gc.enable()
    for lane in lanes:
        scenario = lane.scenario
        if len(lane.steps) != len(batches):
            msg = f"{scenario.name}: {len(lane.steps)} steps for {len(batches)} batches"
            raise RuntimeError(msg)
        edges = lane.setup + lane.finish
        scenario.runs_s.append(edges + sum(lane.steps))
        scenario.steps_s += lane.steps
        scenario.edges_s.append(edges)


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q2, q3


# ------------------------------------------------------------------- numerics


def two_pass_reference(features: torch.Tensor, targets: torch.Tensor) -> Any:
    """Class means and shared covariance ``W / N`` by two passes in float64."""
    x = features.reshape(features.shape[0], -1).to(torch.float64)
    counts = torch.bincount(targets, minlength=NUM_CLASSES).to(torch.float64)
    sums = torch.zeros(NUM_CLASSES, x.shape[1], dtype=torch.float64)
    sums.index_add_(0, targets, x)
    means = sums / counts.clamp(min=1)[:, None]
    centred = x - means[targets]
    cov = centred.T @ centred / x.shape[0]
    return means, cov


def check_numerics(
    scenarios: dict[str, Scenario], targets: torch.Tensor
) -> tuple[list[str], list[str]]:
    """Compare (b) with the two-pass reference on (a)'s features."""
    rows: list[str] = []
    problems: list[str] = []
    features = scenarios["collect_concat"].last
    hand_features = scenarios["hand_concat"].last
    if features.shape[0] != targets.shape[0] or features[0].numel() != FEATURES:
        problems.append(f"collect_concat: features of shape {list(features.shape)}")
        return rows, problems
    if not torch.equal(features, hand_features):
        problems.append("collect_concat and hand_concat features differ")
    means, cov = two_pass_reference(features, targets)
    for name in ("collect_shared", "hand_shared"):
        result = scenarios[name].last
        counts = torch.bincount(targets, minlength=NUM_CLASSES)
        if not torch.equal(result.class_counts.cpu(), counts):
            problems.append(f"{name}: class counts differ from the targets'")
        for what, got, ref in (
            ("class means", result.means, means),
            ("shared covariance", result.cov, cov),
        ):
            err = (got.cpu() - ref).abs().max().item()
            scale = ref.abs().max().item()
            rows.append(
                f"| {name} | {what} | {err:.3g} | {scale:.3g} "
                f"| {err / scale if scale else float('nan'):.3g} |"
            )
            if err > 1e-9 * max(scale, 1.0):
                problems.append(f"{name}: {what} off by {err:.3g}")
    same = all(
        torch.equal(
            getattr(scenarios["collect_shared"].last, a),
            getattr(scenarios["hand_shared"].last, a),
        )
        for a in ("means", "cov")
    )
    rows.append(
        "| collect_shared vs hand_shared | means and covariance | "
        + ("identical | | |" if same else "differ | | |")
    )
    return rows, problems


# --------------------------------------------------------------------- memory


def rss_now() -> int:
    """Current resident set size in bytes (Linux), else 0."""
    try:
        pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def status_kib(field_name: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (Linux), else ``None``."""
    try:
        text = Path("/proc/self/status").read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1]) * 1024
    return None


def peak_rss() -> int:
    """Peak resident set size of this process in bytes.

    ``VmHWM`` where there is one (it is what ``/proc/self/clear_refs`` resets),
    else ``ru_maxrss``.
    """
    hwm = status_kib("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> bool:
    """Reset the peak RSS to the current RSS (Linux >= 4.0); say if it worked."""
    if status_kib("VmHWM") is None:
        return False
    try:
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        return False
    return peak_rss() <= rss_now() + 1024 * 1024


def pin_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Pin glibc's malloc thresholds (see mallopt(3)); say if it worked.

    By default glibc raises its mmap threshold each time a large mapped block
    is freed, so where a tensor lives (mapped, or in the heap, which keeps
    freed memory resident) depends on what ran before. Pinning both
    thresholds also disables that adjustment.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1
    return mallopt(M_TRIM_THRESHOLD, trim_threshold) == 1 and ok


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one collection in this (fresh) process; return its memory figures."""
    # Every block of 128 KiB or more mapped, and unmapped when freed: the RSS
    # follows the memory in use.
    pinned = pin_malloc(128 * 1024, 128 * 1024)
    torch.set_num_threads(1)
    task, samples, precision = spec["task"], spec["samples"], spec["precision"]
    net, rnet = build_net()

    def run(batches: Iterator[tuple[Any, Any]]) -> Any:
        if task == "plain":
            return run_plain(net, batches)
        return run_collect(rnet, task, batches)

    with precision_context(precision):
        run(lazy_batches(WARMUP_BATCHES * BATCH_SIZE, seed=1))
        gc.collect()
        reset = reset_peak_rss()
        before_peak, before_now = peak_rss(), rss_now()
        start = time.perf_counter()
        result = run(lazy_batches(samples, seed=2))
        seconds = time.perf_counter() - start
        after_peak = peak_rss()
    held = result.element_size() * result.numel() if task == "concat" else 0
    return {
        "task": task,
        "samples": samples,
        "growth": after_peak - (before_now if reset else before_peak),
        "method": (
            "VmHWM reset with /proc/self/clear_refs"
            if reset
            else "ru_maxrss difference"
        )
        + (", malloc pinned" if pinned else ""),
        "result_bytes": held,
        "seconds": seconds,
    }


def measure_memory(
    sizes: tuple[int, ...], precision: str, jobs: int
) -> list[dict[str, Any]]:
    """Run every (task, samples) in a fresh subprocess, ``jobs`` at a time."""
    specs = [{"task": "plain", "samples": sizes[0], "precision": precision}]
    specs += [
        {"task": task, "samples": n, "precision": precision}
        for task in TASKS
        for n in sizes
    ]
    results: list[dict[str, Any]] = []
    pending = list(specs)
    running: list[tuple[dict[str, Any], subprocess.Popen[str]]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < jobs:
            spec = pending.pop(0)
            command = [sys.executable, __file__, "--memory-child", json.dumps(spec)]
            process = subprocess.Popen(  # noqa: S603 (this script, our arguments)
                command, stdout=subprocess.PIPE, text=True, env=env
            )
            running.append((spec, process))
        spec, process = running.pop(0)
        out, _ = process.communicate()
        if process.returncode:
            results.append({**spec, "error": f"exit status {process.returncode}"})
        else:
            results.append(json.loads(out.strip().splitlines()[-1]))
        print(
            f"  memory: {spec['task']} at {spec['samples']} samples done",
            file=sys.stderr,
        )
    order = ("plain", *TASKS)
    return sorted(results, key=lambda r: (order.index(r["task"]), r["samples"]))


def memory_section(
    memory: list[dict[str, Any]], rnet: Recorder
) -> tuple[list[str], list[str]]:
    """The memory table, the estimates and the no-growth check."""
    lines = [
        "| task | samples | peak extra MiB | over plain MiB | result MiB | run s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    problems: list[str] = []
    growth: dict[str, list[tuple[int, int]]] = {"plain": [], **{t: [] for t in TASKS}}
    methods = sorted({item.get("method", "") for item in memory} - {""})
    plain = [i["growth"] for i in memory if i["task"] == "plain" and "error" not in i]
    for item in memory:
        if "error" in item:
            problems.append(
                f"memory run {item['task']}/{item['samples']}: {item['error']}"
            )
            continue
        growth[item["task"]].append((item["samples"], item["growth"]))
        over = (
            "—"
            if item["task"] == "plain" or not plain
            else (f"{(item['growth'] - plain[0]) / MIB:+.1f}")
        )
        lines.append(
            f"| {item['task']} | {item['samples']:,} | {item['growth'] / MIB:.1f} "
            f"| {over} | {item['result_bytes'] / MIB:.1f} | {item['seconds']:.1f} |"
        )
    lines += ["", f"Measured by: {'; '.join(methods)}."]
    shared = sorted(growth["shared"])
    concat = sorted(growth["concat"])
    if len(shared) >= 2 and len(concat) >= 2:
        extra_shared = shared[-1][1] - shared[0][1]
        extra_concat = concat[-1][1] - concat[0][1]
        lines += [
            "",
            (
                f"From {shared[0][0]:,} to {shared[-1][0]:,} samples the peak grows "
                f"by {extra_shared / MIB:.1f} MiB for `shared` and by "
                f"{extra_concat / MIB:.1f} MiB for `concat`."
            ),
        ]
        # The concatenated features at the largest size, as the yardstick of a
        # growth proportional to the number of samples.
        if extra_shared > max(extra_concat / 4, 2 * MIB):
            problems.append(
                f"shared: peak memory grows with the samples ({extra_shared / MIB:.1f} "
                "MiB)"
            )
    largest = max(item["samples"] for item in memory)
    lines += [
        "",
        (
            f"`print(estimate(rnet, keep, num_samples={largest}))` for the same "
            "keeps (from the layer table, whose reference pass runs in float32):"
        ),
        "",
    ]
    try:
        from scio_recorder.collect import estimate  # noqa: PLC0415

        for task in TASKS:
            est = estimate(rnet, keep_spec(task), num_samples=largest)
            lines += [f"- {task}:", "", "  ```"]
            lines += [f"  {line}" for line in str(est).splitlines()]
            lines += ["  ```", ""]
    except Exception as error:  # noqa: BLE001 (reported, not fatal)
        problems.append(f"estimate failed: {type(error).__name__}: {error}")
    while lines and not lines[-1]:
        lines.pop()
    return lines, problems


# --------------------------------------------------------------------- driver


def paired_ratio(a: Scenario, b: Scenario) -> float:
    """Median over batches of ``a``'s step over ``b``'s step on the same batch."""
    return statistics.median(x / y for x, y in zip(a.steps_s, b.steps_s, strict=True))


def format_table(scenarios: list[Scenario]) -> list[str]:
    lines = [
        (
            "| scenario | median ms per batch | IQR ms | ratio to plain "
            "| ratio to hand-written | median s per run "
            "| ratio to hand-written, per run | setup + result ms |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_name = {s.name: s for s in scenarios}
    run = {s.name: quartiles(s.runs_s)[1] for s in scenarios}
    for scenario in scenarios:
        q1, median, q3 = quartiles(scenario.steps_s)
        name, hand = scenario.name, scenario.hand
        to_plain = paired_ratio(scenario, by_name["plain"])
        to_hand = f"{paired_ratio(scenario, by_name[hand]):.3f}" if hand else "—"
        run_to_hand = f"{run[name] / run[hand]:.3f}" if hand else "—"
        edges = quartiles(scenario.edges_s)[1] * 1e3
        lines.append(
            f"| {name} | {median * 1e3:.1f} | {(q3 - q1) * 1e3:.1f} "
            f"| {to_plain:.3f} | {to_hand} | {run[name]:.2f} | {run_to_hand} "
            f"| {edges:.1f} |"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Time and measure the collection of penultimate-layer statistics of "
            "a ResNet-18 (CPU, 1 thread): scio_recorder.collect vs a hand hook."
        )
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        help=f"samples per timed run (default {DEFAULT_SAMPLES}, {QUICK_SAMPLES} "
        "with --quick)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"interleaved rounds (default {DEFAULT_ROUNDS}, {QUICK_ROUNDS} with "
        "--quick)",
    )
    parser.add_argument(
        "--memory-samples",
        default=None,
        help="comma-separated sample counts of the memory runs (default "
        f"{','.join(map(str, DEFAULT_MEMORY_SAMPLES))}, "
        f"{','.join(map(str, QUICK_MEMORY_SAMPLES))} with --quick; 0: skip)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="memory subprocesses run at the same time (default 2; they are not timed)",
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help=(
            "auto (default): bfloat16 if the CPU has native bfloat16 "
            "instructions, else float32; bfloat16: passes under CPU autocast "
            "(slow when emulated); float32: the plain net"
        ),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few samples, one round: a smoke run (CI), not a measurement",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.samples is None:
        args.samples = QUICK_SAMPLES if args.quick else DEFAULT_SAMPLES
    if args.rounds is None:
        args.rounds = QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS
    if args.memory_samples is None:
        sizes = QUICK_MEMORY_SAMPLES if args.quick else DEFAULT_MEMORY_SAMPLES
    else:
        sizes = tuple(int(s) for s in args.memory_samples.split(",") if s.strip())
    args.memory_samples = tuple(sorted({n for n in sizes if n > 0}))
    if args.samples < BATCH_SIZE or args.rounds < 1 or args.jobs < 1:
        parser.error(f"need --samples >= {BATCH_SIZE}, --rounds >= 1, --jobs >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory_child is not None:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return 0
    # As in overhead.py: timings that do not depend on what ran before.
    args.precision = resolve_precision(args.precision)
    pinned = pin_malloc(32 * MIB, 512 * MIB)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    started = time.perf_counter()

    print("building the nets and the recorders", file=sys.stderr)
    net, rnet = build_net()
    batches = list(lazy_batches(args.samples, args.seed))
    targets = torch.cat([y for _, y in batches])
    scenarios = build_scenarios(net)
    by_name = {s.name: s for s in scenarios}
    problems: list[str] = []

    print("warming up", file=sys.stderr)
    lockstep(scenarios, batches[:WARMUP_BATCHES], args.precision, rng)
    for scenario in scenarios:
        scenario.runs_s, scenario.steps_s, scenario.edges_s = [], [], []
    for round_index in range(args.rounds):
        lockstep(scenarios, batches, args.precision, rng)
        print(f"  round {round_index + 1}/{args.rounds}", file=sys.stderr)
    numeric_rows, numeric_problems = check_numerics(by_name, targets)
    problems += numeric_problems
    for scenario in scenarios:
        scenario.last = None

    memory: list[dict[str, Any]] = []
    if args.memory_samples:
        print("memory runs (fresh subprocesses)", file=sys.stderr)
        memory = measure_memory(args.memory_samples, args.precision, args.jobs)
    memory_lines, memory_problems = memory_section(memory, rnet) if memory else ([], [])
    problems += memory_problems

    num_batches = len(batches)
    run = {s.name: quartiles(s.runs_s)[1] for s in scenarios}
    verdicts = []
    for task in TASKS:
        per_batch = paired_ratio(by_name[f"collect_{task}"], by_name[f"hand_{task}"])
        per_run = run[f"collect_{task}"] / run[f"hand_{task}"]
        met = "met" if per_batch <= RATIO_TARGET else "NOT met"
        verdicts.append(
            f"`{task}` {per_batch:.3f} per batch ({met}), {per_run:.3f} per run"
        )
    control = paired_ratio(by_name["plain_b"], by_name["plain"])
    verdicts.append(f"A/A control `plain_b` / `plain` {control:.3f} (noise floor)")
    verdict = "; ".join(verdicts)
    autocast = (
        "passes under `torch.autocast('cpu', dtype=torch.bfloat16)`, channels-last "
        "(bfloat16 features)"
        if args.precision == "bfloat16"
        else "float32 passes, channels-last (float32 features)"
    )
    lines = [
        "# scio_recorder calibration: collect vs hand-written hooks",
        "",
        (
            f"- torch {torch.__version__}, Python {platform.python_version()}, "
            f"{platform.machine()} {platform.system()}; CPU, "
            f"{torch.get_num_threads()} thread, eval mode, torch.no_grad(); {autocast}"
        ),
        (
            f"- `resnet18_cifar()`, {args.samples:,} random samples [3, 32, 32] in "
            f"{num_batches} batches of {BATCH_SIZE}, targets in {NUM_CLASSES} "
            f"classes; features: the output of `{LAYER}` ({FEATURES} per sample)"
        ),
        (
            f"- {args.rounds} round(s); a round runs one full collection of every "
            "scenario, each in its own thread with its own copy of the net, "
            "interleaved batch by batch: every batch goes through every scenario "
            "in turn, in a freshly shuffled order, one at a time. A sample is the "
            "time of one batch (from receiving it to asking for the next: forward "
            "pass, hooks, reduction): median and interquartile range over the "
            f"{args.rounds * num_batches} batches; ratios are medians over batches "
            "of the per-batch ratios (same batch, same round); per-run figures "
            "are medians over rounds; `setup + result` is a run minus its batches "
            "(planning, hooks, `result()`)"
            + (" (--quick: a smoke run, not a measurement)" * args.quick)
        ),
        (
            "- malloc: glibc thresholds pinned as in `overhead.py`"
            if pinned
            else "- malloc: thresholds not pinned (no glibc)"
        ),
        "",
        *format_table(scenarios),
        "",
        *(f"- `{s.name}`: {s.describe}" for s in scenarios),
        "",
        f"Ratio collect / hand-written (target <= {RATIO_TARGET}): {verdict}.",
        "",
        "## Numerical check",
        "",
        (
            "Max absolute error against a float64 two-pass computation on the "
            "features of `collect_concat` (`W / N`, Lee et al.'s tied covariance):"
        ),
        "",
        "| result | quantity | max abs error | max abs value | relative |",
        "|---|---|---:|---:|---:|",
        *numeric_rows,
    ]
    if memory_lines:
        lines += [
            "",
            "## Peak memory",
            "",
            (
                "Peak extra resident memory of one collection in a fresh process: "
                "the peak RSS during the run (reset with `/proc/self/clear_refs` "
                "after a warm-up collection of "
                f"{WARMUP_BATCHES} batches, read as `VmHWM`) minus the RSS at "
                "its start. glibc's malloc is pinned to map (and unmap when freed) "
                "every block of 128 KiB or more, so that the RSS follows the memory "
                "in use. Images are drawn batch by batch. The peak includes the "
                "transient memory of the forward pass itself (`plain`: passes "
                "without any hook); `over plain` is the difference; `result` "
                "is the size of the returned concatenation."
            ),
            "",
            *memory_lines,
        ]
    lines += ["", f"Total run time {time.perf_counter() - started:.0f} s."]
    lines += [f"- CHECK FAILED: {p}" for p in problems]
    report = "\n".join(lines).rstrip("\n") + "\n"
    print(report, end="")
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
