"""Measure what recording costs on a GPU: nothing, one layer, every layer.

Two models built in code (random weights, no download, no torchvision), eval
mode, ``torch.no_grad()``:

* ``resnet18``: ResNet-18 in torchvision's ImageNet layout (``7x7`` stem with
  stride 2 and max-pooling, four stages of two basic blocks, 11.7 M
  parameters), on ``224x224`` images;
* ``gpt2``: GPT-2 small from ``transformers.GPT2Config()`` (12 layers, width
  768, 124 M parameters), on token ids.

Scenarios, all on one model instance: ``plain`` (``net(x)``, no hook);
``recorder_none`` (``rnet(x)`` recording nothing); ``recorder_one`` (one
layer: ``layer3`` of the ResNet, the middle block of GPT-2);
``recorder_all`` (every recordable label of the table). Every round times one
batch of calls of every scenario, in a freshly shuffled order; a ratio is the
median over rounds of the scenario's time over ``plain``'s *in the same
round* (paired: drifts of the machine's speed cancel). On CUDA a batch is
timed with CUDA events recorded around it (the queue is drained before the
first), so the figure is the GPU's time for the calls, launch overhead
included; on the CPU with ``time.perf_counter``. The peak memory a
scenario's pass allocates beyond what was allocated before it is reported
on CUDA (``torch.cuda.max_memory_allocated``): recording every layer keeps
every layer's output until the next pass.

Before timing, each scenario's output is checked equal (bit for bit) to the
plain pass, and each record of ``recorder_one`` equal to what a hand-written
forward hook sees. TF32 is off (``torch.backends.cuda.matmul.allow_tf32``,
``torch.backends.cudnn.allow_tf32``), so the figures are float32 kernels'.

``--device cpu`` runs the same code on the CPU (the smoke run of CI:
``python benchmarks/gpu.py --quick --device cpu``, small models). ``python
benchmarks/gpu.py --help`` lists the options.
"""

from __future__ import annotations

import argparse
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

# This folder holds `transformers.py`: run as a script, its folder would come
# first on `sys.path` and shadow the library of that name.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402 (after the path fix)
import transformers  # noqa: E402
from torch import nn  # noqa: E402

from scio_recorder import Recorder  # noqa: E402
from scio_recorder.models import ResNetCIFAR  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

MODELS = ("resnet18", "gpt2")
SCENARIOS = ("plain", "recorder_none", "recorder_one", "recorder_all")


class ResNet18(ResNetCIFAR):
    """ResNet-18 in torchvision's ImageNet layout (``7x7`` stem, max-pooling)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__(num_classes=num_classes)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            out = stage(out)
        logits: torch.Tensor = self.fc(self.avgpool(out).flatten(1))
        return logits


@dataclass
class Case:
    """A model, its input, its recorder and the one layer to record."""

    name: str
    net: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    one: str
    describe: str
    rnet: Recorder = field(init=False)
    samples: dict[str, list[float]] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)


def build(name: str, device: torch.device, *, quick: bool) -> Case:
    """Build a model on ``device`` with its input (small ones with ``quick``)."""
    torch.manual_seed(0)
    if name == "resnet18":
        batch, size = (2, 64) if quick else (32, 224)
        net = ResNet18().eval().to(device)
        x = torch.randn(batch, 3, size, size, device=device)
        describe = f"ResNet-18 (ImageNet layout), batch {batch} x 3 x {size} x {size}"
        return Case(name, net, (x,), {}, "layer3", describe)
    config = (
        transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=2, n_positions=64, vocab_size=1000
        )
        if quick
        else transformers.GPT2Config()
    )
    batch, seq = (2, 16) if quick else (8, 256)
    model = transformers.GPT2LMHeadModel(config).eval().to(device)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    one = f"transformer.h.{config.n_layer // 2}"
    describe = (
        f"GPT-2 ({config.n_layer} layers, width {config.n_embd}), "
        f"batch {batch} x {seq} tokens"
    )
    return Case(name, model, (), {"input_ids": ids}, one, describe)


def scenarios(case: Case) -> dict[str, tuple[Callable[[], Any], Callable[[], None]]]:
    """Return ``name -> (call, select)``: what a pass calls, what it records."""
    rnet = case.rnet
    everything = [row.label for row in rnet.table.values() if row.recordable]

    def plain() -> Any:
        return case.net(*case.args, **case.kwargs)

    def recorded() -> Any:
        return rnet(*case.args, **case.kwargs)

    return {
        "plain": (plain, rnet.record),
        "recorder_none": (recorded, rnet.record),
        "recorder_one": (recorded, lambda: rnet.record(case.one)),
        "recorder_all": (recorded, lambda: rnet.record(*everything)),
    }


def first_tensor(output: Any) -> torch.Tensor:
    """The logits of a classifier or of a language model's output."""
    return output if isinstance(output, torch.Tensor) else output.logits


def check(case: Case) -> list[str]:
    """Check outputs against the plain pass and one record against a hook."""
    problems = []
    calls = scenarios(case)
    call, select = calls["plain"]
    select()
    want = first_tensor(call())
    seen: list[Any] = []
    module = case.net.get_submodule(case.one)
    handle = module.register_forward_hook(lambda _m, _a, out: seen.append(out))
    try:
        call()
    finally:
        handle.remove()
    for name, (scenario_call, scenario_select) in calls.items():
        scenario_select()
        if not torch.equal(first_tensor(scenario_call()), want):
            problems.append(f"{case.name} {name}: output differs from the plain pass")
    calls["recorder_one"][1]()
    calls["recorder_one"][0]()
    record = case.rnet.activations_of(case.one)[0]
    hooked = seen[0][0] if isinstance(seen[0], tuple) else seen[0]
    mine = record[0] if isinstance(record, tuple) else record
    if not torch.equal(mine, hooked) or mine.device != hooked.device:
        problems.append(f"{case.name} recorder_one: record differs from a hook's")
    case.rnet.record()
    return problems


class Clock:
    """Times a batch of calls: CUDA events on a GPU, ``perf_counter`` on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, call: Callable[[], Any], n: int) -> float:
        """Return the mean seconds per call over ``n`` calls (GC off)."""
        gc.collect()
        gc.disable()
        try:
            if self.cuda:
                torch.cuda.synchronize()
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(n):
                    call()
                stop.record()
                stop.synchronize()
                return start.elapsed_time(stop) / 1e3 / n
            begin = time.perf_counter()
            for _ in range(n):
                call()
            return (time.perf_counter() - begin) / n
        finally:
            gc.enable()

    def peak(self, call: Callable[[], Any]) -> int:
        """Return the bytes one call allocates beyond what was allocated (CUDA)."""
        if not self.cuda:
            return 0
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before


def bench(case: Case, clock: Clock, rounds: int, calls_per_batch: int) -> None:
    """Fill ``case.samples`` (seconds per call) and ``case.peaks`` (bytes)."""
    calls = scenarios(case)
    for name, (call, select) in calls.items():  # warm-up, and the peak memory
        select()
        for _ in range(3):
            call()
        case.peaks[name] = clock.peak(call)
        case.samples[name] = []
    case.rnet.record()
    order = list(calls)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            call, select = calls[name]
            select()
            case.samples[name].append(clock.time(call, calls_per_batch))
        case.rnet.record()


def report(cases: list[Case], header: list[str], device: torch.device) -> str:
    """Return the Markdown report: a table per model."""
    lines = [*header, ""]
    memory = device.type == "cuda"
    lines.append(
        "| model | scenario | median ms | IQR ms | ratio to plain*"
        + (" | peak MiB beyond the inputs |" if memory else " |")
    )
    lines.append("|---|---|---:|---:|---:|" + ("---:|" if memory else ""))
    for case in cases:
        plain = case.samples["plain"]
        for name in SCENARIOS:
            samples = case.samples[name]
            q1, _, q3 = (
                statistics.quantiles(samples, n=4)
                if len(samples) > 1
                else (samples[0],) * 3
            )
            med = statistics.median(samples)
            ratio = statistics.median(
                a / b for a, b in zip(samples, plain, strict=True)
            )
            row = (
                f"| {case.name} | {name} | {med * 1e3:,.3f} | "
                f"{(q3 - q1) * 1e3:,.3f} | {ratio:.3f} |"
            )
            if memory:
                row += f" {case.peaks[name] / 2**20:,.1f} |"
            lines.append(row)
    lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="cuda", help="where to run (default cuda; cpu: a smoke run)"
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help=f"subset of {','.join(MODELS)}"
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 21, 3 quick")
    parser.add_argument("--calls", type=int, default=None, help="calls per batch")
    parser.add_argument(
        "--quick", action="store_true", help="small models, few rounds: a smoke run"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown or not args.models:
        parser.error(f"--models: unknown or empty {unknown}; choose from {MODELS}")
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; pass `--device cpu`")
    if args.rounds is None:
        args.rounds = 3 if args.quick else 21
    if args.calls is None:
        args.calls = 2 if args.quick else 10
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.device.type == "cpu":
        torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # transformers' config notes, in-place ReLUs
    where = (
        torch.cuda.get_device_name(args.device)
        if args.device.type == "cuda"
        else f"CPU ({platform.machine()}), 1 thread"
    )
    header = [
        "# scio_recorder on a GPU: recording nothing, one layer, every layer",
        "",
        (
            f"- {where}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}"
        ),
        "- eval mode, `torch.no_grad()`, float32, TF32 off",
        f"- {args.rounds} interleaved rounds of {args.calls} calls per scenario "
        "(shuffled order each round); median and interquartile range over rounds"
        + (" (--quick: a smoke run, not a measurement)" * args.quick),
        (
            "- *paired: the median over rounds of (this scenario's time / "
            "plain's time in the same round)"
        ),
    ]
    cases, problems = [], []
    clock = Clock(args.device)
    started = time.perf_counter()
    with torch.no_grad():
        for name in args.models:
            print(f"{name}: building, checking, warming up", file=sys.stderr)
            case = build(name, args.device, quick=args.quick)
            case.rnet = Recorder(case.net, input_data=case.kwargs or case.args)
            problems += check(case)
            bench(case, clock, args.rounds, args.calls)
            header.append(f"- {name}: {case.describe}")
            cases.append(case)
    header.append(f"- total run time {time.perf_counter() - started:.0f} s")
    text = report(cases, header, args.device)
    text += "".join(f"\nCHECK FAILED: {problem}" for problem in problems)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
