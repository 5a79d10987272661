"""Measure what the OoD detectors cost against hand-written code.

(a) **Fitting**, on the demo CNN and the ResNet-18-style CNN (eval mode, one
thread, generated 32x32 images in batches of 128): ``ReAct``, ``KNN`` and
``Mahalanobis`` ``.fit`` (one ``collect`` pass each) against a hand-written
loop with one forward hook doing the same job (keep the activations, then
``torch.quantile``; keep the features; per-class sums and a covariance), in
interleaved rounds; the ratio is the median over rounds of the paired
ratio. Then the peak memory of ``Mahalanobis`` and ``ReAct(exact=False)``
fits at two data-set sizes, each in a fresh process (peak RSS minus the
peak of the same process that only builds the net and the data): it must
not grow with the samples.

(b) **Scoring with 8 detectors** (MSP, Energy, MaxLogit, Entropy,
Mahalanobis, KNN, ReAct, ASH): ``evaluate`` (one pass for the six that edit
nothing, one per edit) against scoring each detector on its own, one forward
pass per detector per batch, as pytorch-ood does.

Run ``python benchmarks/ood.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from calibration import pin_malloc  # this folder's calibration benchmark

import scio_recorder
from scio_recorder import Recorder
from scio_recorder.data import make_blobs_images
from scio_recorder.models import demo_model, resnet18_cifar
from scio_recorder.ood import (
    ASH,
    KNN,
    MSP,
    Energy,
    Entropy,
    Mahalanobis,
    MaxLogit,
    ReAct,
    evaluate,
)

BATCH = 128


def build(name: str) -> tuple[torch.nn.Module, Recorder, str, str]:
    """The net, its recorder, the penultimate layer, and the last Linear."""
    torch.manual_seed(0)
    if name == "demo":
        net = demo_model().eval()
        return (
            net,
            Recorder(net, input_size=(1, 3, 32, 32)),
            "classifier.2",
            "classifier.3",
        )
    net = resnet18_cifar(num_classes=10).eval()
    return net, Recorder(net, input_size=(1, 3, 32, 32)), "avgpool", "fc"


def data(samples: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = make_blobs_images(samples, seed=seed)
    return list(zip(x.split(BATCH), y.split(BATCH), strict=True))


# ------------------------------------------------------------ hand-written
def hand_react(net, layer: str, batches) -> torch.Tensor:
    module = net.get_submodule(layer)
    kept = []
    handle = module.register_forward_hook(lambda _m, _i, out: kept.append(out.detach()))
    try:
        with torch.no_grad():
            for x, _ in batches:
                net(x)
    finally:
        handle.remove()
    values = torch.cat([k.reshape(-1) for k in kept]).double()
    return (
        torch.quantile(values, 0.9)
        if values.numel() < 2**24
        else values.kthvalue(int(0.9 * values.numel())).values
    )


def hand_features(net, fc: str, batches) -> tuple[torch.Tensor, torch.Tensor]:
    module = net.get_submodule(fc)
    kept = []
    handle = module.register_forward_pre_hook(
        lambda _m, args: kept.append(args[0].detach().reshape(args[0].shape[0], -1))
    )
    try:
        with torch.no_grad():
            for x, _ in batches:
                net(x)
    finally:
        handle.remove()
    return torch.cat(kept), torch.cat([y for _, y in batches])


def hand_knn(net, fc: str, batches) -> torch.Tensor:
    features, _ = hand_features(net, fc, batches)
    return torch.nn.functional.normalize(features, dim=1)


def hand_mahalanobis(net, fc: str, batches) -> tuple[torch.Tensor, torch.Tensor]:
    module = net.get_submodule(fc)
    state: dict[str, Any] = {}

    def hook(_m, args):
        f = args[0].detach().reshape(args[0].shape[0], -1).double()
        y = state["y"]
        sums = state.setdefault(
            "sums", torch.zeros(10, f.shape[1], dtype=torch.float64)
        )
        counts = state.setdefault("counts", torch.zeros(10, dtype=torch.float64))
        outer = state.setdefault(
            "outer", torch.zeros(f.shape[1], f.shape[1], dtype=torch.float64)
        )
        sums.index_add_(0, y, f)
        counts.index_add_(0, y, torch.ones_like(y, dtype=torch.float64))
        outer += f.T @ f

    handle = module.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            for x, y in batches:
                state["y"] = y
                net(x)
    finally:
        handle.remove()
    means = state["sums"] / state["counts"][:, None]
    n = state["counts"].sum()
    cov = (
        state["outer"]
        - (state["counts"][:, None, None] * means[:, :, None] * means[:, None, :]).sum(
            0
        )
    ) / n
    return means, torch.linalg.pinv(cov, hermitian=True)


# ------------------------------------------------------------ timing
def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(
    scenarios: dict[str, Any], rounds: int, rng: random.Random
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in scenarios}
    for _ in range(rounds):
        order = list(scenarios)
        rng.shuffle(order)
        for name in order:
            times[name].append(timed(scenarios[name]))
    return times


def fit_section(model: str, samples: int, rounds: int, rng: random.Random) -> list[str]:
    net, rnet, penultimate, fc = build(model)
    batches = data(samples)
    scenarios = {
        "ReAct.fit": lambda: ReAct(rnet, layer=penultimate).fit(batches),
        "hand ReAct": lambda: hand_react(net, penultimate, batches),
        "KNN.fit": lambda: KNN(rnet, k=10).fit(batches),
        "hand KNN": lambda: hand_knn(net, fc, batches),
        "Mahalanobis.fit": lambda: Mahalanobis(rnet).fit(batches, target=1),
        "hand Mahalanobis": lambda: hand_mahalanobis(net, fc, batches),
    }
    times = paired(scenarios, rounds, rng)
    rows = []
    for ours in ("ReAct.fit", "KNN.fit", "Mahalanobis.fit"):
        hand = "hand " + ours.split(".")[0]
        ratios = [a / b for a, b in zip(times[ours], times[hand], strict=True)]
        rows.append(
            f"| {model} | {samples:,} | {ours} | {statistics.median(times[ours]):.2f} "
            f"| {statistics.median(times[hand]):.2f} | {statistics.median(ratios):.3f} |"
        )
    return rows


def score_section(model: str, samples: int, rounds: int, rng: random.Random) -> str:
    _, rnet, penultimate, _ = build(model)
    fit = data(512, seed=1)
    detectors = {
        "MSP": MSP(rnet),
        "Energy": Energy(rnet),
        "MaxLogit": MaxLogit(rnet),
        "Entropy": Entropy(rnet),
        "Mahalanobis": Mahalanobis(rnet).fit(fit, target=1),
        "KNN": KNN(rnet, k=10).fit(fit),
        "ReAct": ReAct(rnet, layer=penultimate).fit(fit),
        "ASH": ASH(rnet, layer=penultimate),
    }
    xs = [x for x, _ in data(samples, seed=2)]
    half = len(xs) // 2

    def shared():
        evaluate(detectors, xs[:half], xs[half:], input=None)

    def apart():
        for detector in detectors.values():
            for x in xs:
                detector(x)

    times = paired({"evaluate": shared, "apart": apart}, rounds, rng)
    ratios = [a / b for a, b in zip(times["evaluate"], times["apart"], strict=True)]
    return (
        f"| {model} | {samples:,} | {statistics.median(times['evaluate']):.2f} "
        f"| {statistics.median(times['apart']):.2f} | {statistics.median(ratios):.3f} |"
    )


# ------------------------------------------------------------ memory
def _status(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset the peak RSS (Linux: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    # As calibration.py: every block of 128 KiB or more mapped, and unmapped
    # when freed, so the peak RSS follows the memory in use.
    pin_malloc(128 * 1024, 128 * 1024)
    _, rnet, penultimate, _ = build(spec["model"])
    batches = data(spec["samples"])
    torch.set_num_threads(1)
    gc.collect()
    if _reset_peak() and _status("VmRSS") is not None:
        base = _status("VmRSS") or 0
        run_fit(spec, rnet, penultimate, batches)
        return {**spec, "growth_kib": (_status("VmHWM") or 0) - base}
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run_fit(spec, rnet, penultimate, batches)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {**spec, "growth_kib": peak - base}


def run_fit(
    spec: dict[str, Any], rnet: Recorder, penultimate: str, batches: list[Any]
) -> None:
    if spec["task"] == "Mahalanobis":
        Mahalanobis(rnet).fit(batches, target=1)
    elif spec["task"] == "ReAct sketch":
        ReAct(rnet, layer=penultimate, exact=False).fit(batches)
    elif spec["task"] == "KNN (keeps the features)":
        KNN(rnet, k=10).fit(batches)


def memory_section(model: str, sizes: tuple[int, ...]) -> list[str]:
    rows = []
    for task in ("Mahalanobis", "ReAct sketch", "KNN (keeps the features)"):
        growth = []
        for n in sizes:
            spec = {"model": model, "samples": n, "task": task}
            done = subprocess.run(  # noqa: S603 (this script, in a fresh process)
                [sys.executable, __file__, "--memory-child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=True,
            )
            growth.append(json.loads(done.stdout)["growth_kib"] / 1024)
        cells = " | ".join(f"{g:+.1f}" for g in growth)
        rows.append(f"| {model} | {task} | {cells} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--samples", type=int, default=4096, help="fit samples (default 4096)"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds (default 5)"
    )
    parser.add_argument(
        "--models",
        default="demo,resnet",
        help="comma-separated: demo, resnet (default both)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="few samples, one round: a smoke run"
    )
    parser.add_argument(
        "--sections", default="fit,memory,score", help="which of fit, memory, score"
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return 0
    torch.set_num_threads(1)
    samples, rounds = (256, 1) if args.quick else (args.samples, args.rounds)
    models = args.models.split(",")
    rng = random.Random(0)
    print(
        f"# scio_recorder {scio_recorder.__version__}: OoD detectors vs hand-written code\n\n"
        f"- torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; CPU, 1 thread, eval mode; batches of {BATCH}; "
        f"{rounds} round(s)"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
    )
    sections = args.sections.split(",")
    if "fit" in sections:
        fit_report(models, samples, rounds, rng)
    if "memory" in sections:
        memory_report(models, samples)
    if "score" in sections:
        score_report(models, samples, rounds, rng)
    return 0


def fit_report(
    models: list[str], samples: int, rounds: int, rng: random.Random
) -> None:
    print("\n## (a) fitting\n")
    print(
        "| model | samples | detector | median s | hand-written s | ratio (paired median) |"
    )
    print("|---|---:|---|---:|---:|---:|")
    for model in models:
        for row in fit_section(model, samples, rounds, rng):
            print(row)


def memory_report(models: list[str], samples: int) -> None:
    sizes = (samples // 4, samples)
    print(
        f"\nPeak memory growth of a fit, MiB, at {sizes[0]:,} and {sizes[1]:,} samples:\n"
    )
    print(f"| model | fit | {sizes[0]:,} | {sizes[1]:,} |")
    print("|---|---|---:|---:|")
    for model in models:
        for row in memory_section(model, sizes):
            print(row)


def score_report(
    models: list[str], samples: int, rounds: int, rng: random.Random
) -> None:
    print("\n## (b) scoring with 8 detectors\n")
    print("| model | samples | evaluate s | one pass per detector s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for model in models:
        print(score_section(model, samples, rounds, rng))


if __name__ == "__main__":
    sys.exit(main())
