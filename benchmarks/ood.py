"""Measure what the OoD catalogue costs with shared passes, against one at a time.

On the demo CNN and the ResNet-18-style CNN (eval mode, one thread,
generated 32x32 blob images, random convolutions with a least-squares
classifier head so that every class is predicted), three sections:

(a) **The catalogue** (every detector of ``scio_recorder.ood``, as
``scio_recorder.ood.benchmark.catalogue`` builds it for each net):
fitting with ``fit_detectors`` and scoring an ID and an OoD set with
``score_sets`` (shared passes), against each detector alone, its own
``.fit`` then its own scoring batch by batch (one detector at a time, the
way pytorch-ood is used). Forward calls are counted with a forward pre-hook
on the net; the wall times are paired medians over interleaved rounds. The
first round also checks that both give the same scores, and gives each
detector's forward calls alone.

(b) **Multi-layer detectors over L = 1, 2, 4 layers**: the forward calls per
batch of ``MahalanobisEnsemble`` and ``Gram`` (fit and score), against
pytorch-ood's ``MultiMahalanobis`` and ``Gram`` when pytorch-ood imports
(else a hand-written loop that runs the net's prefix up to each layer, as
``MultiMahalanobis`` does), counted as the runs of the net's first module.

(c) **Peak memory of every fit** against the number of samples (demo CNN):
each fit in a forked child process with glibc's malloc thresholds pinned
(every block of 128 KiB or more mapped, and unmapped when freed), the peak
RSS reset (``/proc/self/clear_refs``) after the data is built; the growth is
the peak RSS (``VmHWM``) minus the RSS before the fit. RSS sees every CPU
allocation torch makes (``tracemalloc`` sees none of them).

``--sections hand`` adds the earlier comparison of three ``.fit`` (ReAct,
KNN, Mahalanobis) with hand-written hook loops doing the same job.

pytorch-ood 0.4 imports on a CPU-only torch without torchvision's compiled
operators once the two schemas it touches (``torchvision::nms``,
``torchvision::qnms``) are declared; the script declares them when they are
missing. Run ``python benchmarks/ood.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from calibration import pin_malloc  # this folder's calibration benchmark
from torch import nn

import scio_recorder
from scio_recorder import Recorder
from scio_recorder.data import make_blobs_images, ood_sets
from scio_recorder.models import demo_model, resnet18_cifar
from scio_recorder.ood import (
    KNN,
    Detector,
    Gram,
    Mahalanobis,
    MahalanobisEnsemble,
    ReAct,
    fit_detectors,
    score_sets,
)
from scio_recorder.ood.benchmark import catalogue as build_catalogue

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------ pytorch-ood
_TORCHVISION_SCHEMAS: list[Any] = []


def import_pytorch_ood() -> Any:
    """``pytorch_ood.detector``, or None where it does not import."""
    try:
        torch.ops.torchvision.nms  # noqa: B018 (does the schema exist?)
    except (AttributeError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define(
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
        )
        _TORCHVISION_SCHEMAS.append(library)  # keep it alive
    try:
        import pytorch_ood.detector as found  # noqa: PLC0415 (optional)
    except Exception:  # noqa: BLE001 (any failure: fall back)
        return None
    return found


# ------------------------------------------------------------ nets
@dataclass
class Spec:
    """What the detectors read on one net."""

    name: str
    net: nn.Module
    rnet: Recorder
    penultimate: str  # ReAct, ASH, Scale, VRA, AdaScale
    fc: str  # the last Linear
    blocks: tuple[str, ...]  # RankFeat, Gram; with `penultimate`: the multi-layer
    d: int  # ViM, Residual
    atoms: list[tuple[str, nn.Module]]  # the net's chain up to its last block
    head: nn.Module  # what follows the chain, to the logits
    depth: list[list[str]]  # the layers read for L = 1, 2, 4


def fit_head(net: nn.Module, fc: str, batches: Batches) -> None:
    """Set the last Linear by least squares, so the random net classifies."""
    module = net.get_submodule(fc)
    assert isinstance(module, nn.Linear)
    kept: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda _m, a: kept.append(a[0]))
    with torch.no_grad():
        for x, _ in batches:
            net(x)
    handle.remove()
    f = torch.cat(kept).double()
    f = torch.cat([f, torch.ones(len(f), 1, dtype=f.dtype)], 1)
    y = torch.cat([y for _, y in batches])
    onehot = torch.nn.functional.one_hot(y, module.out_features).double()
    ridge = 1e-3 * f.pow(2).mean() * torch.eye(f.shape[1], dtype=f.dtype)
    w = torch.linalg.solve(f.T @ f + ridge, f.T @ onehot)
    with torch.no_grad():
        module.weight.copy_(w[:-1].T.float() * 10)
        module.bias.copy_(w[-1].float() * 10)


def build(name: str, head_data: Batches) -> Spec:
    torch.manual_seed(0)
    if name == "demo":
        net = demo_model().eval()
        fit_head(net, "classifier.3", head_data)
        f = net.features
        return Spec(
            name="demo CNN",
            net=net,
            rnet=Recorder(net, input_size=(1, 3, 32, 32)),
            penultimate="classifier.2",
            fc="classifier.3",
            blocks=("features.1", "features.4"),
            d=16,
            atoms=[(f"features.{i}", f[i]) for i in range(5)],
            head=nn.Sequential(f[5], net.classifier),
            depth=[
                ["features.4"],
                ["features.1", "features.4"],
                ["features.1", "features.2", "features.3", "features.4"],
            ],
        )
    net = resnet18_cifar(num_classes=10).eval()
    fit_head(net, "fc", head_data)
    names = ["conv1", "bn1", "relu", "layer1", "layer2", "layer3", "layer4"]
    return Spec(
        name="ResNet-18",
        net=net,
        rnet=Recorder(net, input_size=(1, 3, 32, 32)),
        penultimate="avgpool",
        fc="fc",
        blocks=("layer3", "layer4"),
        d=256,
        atoms=[(n, net.get_submodule(n)) for n in names],
        head=nn.Sequential(net.avgpool, nn.Flatten(), net.fc),
        depth=[
            ["layer4"],
            ["layer3", "layer4"],
            ["layer1", "layer2", "layer3", "layer4"],
        ],
    )


def chain(spec: Spec, layers: list[str]) -> list[nn.Module]:
    """The net up to its last read layer, cut after each read layer."""
    parts: list[nn.Module] = []
    current: list[nn.Module] = []
    for name, module in spec.atoms:
        current.append(module)
        if name in layers:
            parts.append(nn.Sequential(*current))
            current = []
    return parts


def data(samples: int, batch: int, seed: int) -> Batches:
    x, y = make_blobs_images(samples, seed=seed)
    return list(zip(x.split(batch), y.split(batch), strict=True))


def catalogue(spec: Spec) -> dict[str, Detector]:
    """Every detector of the package (the package's catalogue, built for this net)."""
    return build_catalogue(
        spec.rnet, penultimate=spec.penultimate, blocks=spec.blocks, d=spec.d
    )


# ------------------------------------------------------------ counting
class Calls:
    """Count the calls of a module with a forward pre-hook."""

    def __init__(self, module: nn.Module) -> None:
        self.n = 0
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, _module: nn.Module, _args: Any) -> None:
        self.n += 1


@dataclass
class Run:
    fit_s: float = 0.0
    score_s: float = 0.0
    fit_calls: int = 0
    score_calls: int = 0
    scores: dict[str, torch.Tensor] | None = None
    # detector -> forward calls to fit, to score; seconds to fit, to score
    each: dict[str, tuple[int, int, float, float]] | None = None


def shared_run(spec: Spec, fit: Batches, sets: dict[str, list[Any]]) -> Run:
    detectors = catalogue(spec)
    calls = Calls(spec.net)
    try:
        start = time.perf_counter()
        fit_detectors(detectors, fit, target=1)
        middle, fitted = time.perf_counter(), calls.n
        scored = score_sets(detectors, sets, input=None)
        end = time.perf_counter()
    finally:
        calls.handle.remove()
    return Run(
        middle - start,
        end - middle,
        fitted,
        calls.n - fitted,
        {k: torch.cat([scored[s][k] for s in sets]) for k in detectors},
    )


def apart_run(spec: Spec, fit: Batches, sets: dict[str, list[Any]]) -> Run:
    detectors = catalogue(spec)
    calls = Calls(spec.net)
    run = Run(scores={}, each={})
    assert run.scores is not None
    assert run.each is not None
    try:
        for name, detector in detectors.items():
            before = calls.n
            start = time.perf_counter()
            if detector.needs_fit:
                detector.fit(fit, target=1 if detector.needs_target else None)
            middle, fitted = time.perf_counter(), calls.n
            scores = [detector(x).detach() for xs in sets.values() for x in xs]
            run.fit_s += middle - start
            run.score_s += time.perf_counter() - middle
            run.each[name] = (
                fitted - before,
                calls.n - fitted,
                middle - start,
                time.perf_counter() - middle,
            )
            run.scores[name] = torch.cat(scores)
    finally:
        calls.handle.remove()
    run.fit_calls = sum(e[0] for e in run.each.values())
    run.score_calls = sum(e[1] for e in run.each.values())
    return run


def mismatches(a: Run, b: Run) -> list[str]:
    """Detectors whose two score vectors differ beyond float32 rounding."""
    assert a.scores is not None
    assert b.scores is not None
    bad = []
    for name, x in a.scores.items():
        y = b.scores[name]
        # Same fit data and net, but batched reductions may sum in another
        # order (shared Tee vs own reducer): allow ~1e3 float32 eps relative
        # to the scores' magnitude.
        scale = float(x.abs().max()) + 1e-12
        if x.shape != y.shape or not torch.allclose(x, y, rtol=1e-4, atol=1e-4 * scale):
            bad.append(name)
    return bad


def paired_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def catalogue_section(
    spec: Spec, fit: Batches, sets: dict[str, list[Any]], rounds: int, seed: int
) -> tuple[list[str], dict[str, tuple[int, int]], list[str]]:
    rng = random.Random(seed)
    runs: dict[str, list[Run]] = {"shared": [], "apart": []}
    scenarios = {"shared": shared_run, "apart": apart_run}
    for index in range(rounds):
        order = list(scenarios)
        rng.shuffle(order)
        for name in order:
            log(f"  {spec.name}: catalogue, round {index + 1}/{rounds}, {name}")
            runs[name].append(scenarios[name](spec, fit, sets))
    shared, apart = runs["shared"], runs["apart"]
    bad = mismatches(shared[0], apart[0])
    fit_b, score_b = len(fit), sum(len(xs) for xs in sets.values())
    rows = []
    for phase in ("fit", "score", "total"):

        def seconds(run: Run, phase: str = phase) -> float:
            return {"fit": run.fit_s, "score": run.score_s}.get(
                phase, run.fit_s + run.score_s
            )

        def count(run: Run, phase: str = phase) -> int:
            return {"fit": run.fit_calls, "score": run.score_calls}.get(
                phase, run.fit_calls + run.score_calls
            )

        batches = {"fit": fit_b, "score": score_b}.get(phase, fit_b + score_b)
        ours = [seconds(r) for r in shared]
        alone = [seconds(r) for r in apart]
        rows.append(
            f"| {spec.name} | {phase} | {batches} | {count(shared[0]):,} "
            f"| {count(apart[0]):,} | {statistics.median(ours):.2f} "
            f"| {statistics.median(alone):.2f} | **{paired_ratio(alone, ours):.2f}x** |"
        )
    each = {}
    for name in catalogue(spec):
        seen = [r.each[name] for r in apart if r.each is not None]
        fit_s = statistics.median(e[2] for e in seen)
        score_s = statistics.median(e[3] for e in seen)
        each[name] = (seen[0][0], seen[0][1], fit_s, score_s)
    return rows, each, bad


# ------------------------------------------------------------ multi-layer
def hand_multi_mahalanobis(
    parts: list[nn.Module], fit: Batches, xs: list[Any], calls: Calls
) -> int:
    """The per-layer cut loop of pytorch-ood's MultiMahalanobis, by hand.

    Class means only (no covariance): a lower bound of its cost.
    """
    fitted = 0
    with torch.no_grad():
        sums = [None] * len(parts)
        for x, _ in fit:
            for i in range(len(parts)):
                z = nn.Sequential(*parts[: i + 1])(x).mean(dim=(2, 3))
                sums[i] = z.sum(0) if sums[i] is None else sums[i] + z.sum(0)
        fitted = calls.n
        for x in xs:
            for i in range(len(parts)):
                nn.Sequential(*parts[: i + 1])(x).mean(dim=(2, 3))
    return fitted


def layers_section(
    spec: Spec,
    fit: Batches,
    xs: list[Any],
    rounds: int,
    *,
    seed: int,
    found: Any,
) -> list[str]:
    rng = random.Random(seed)
    rows = []
    batches = len(fit), len(xs)
    for layers in spec.depth:
        parts = chain(spec, layers)
        first = spec.atoms[0][1]

        def ours_maha(calls: Calls, layers: list[str] = layers) -> int:
            detector = MahalanobisEnsemble(spec.rnet, layers=layers).fit(fit, target=1)
            fitted = calls.n
            for x in xs:
                detector(x)
            return fitted

        def ours_gram(calls: Calls, layers: list[str] = layers) -> int:
            detector = Gram(spec.rnet, layers=layers).fit(fit, target=1)
            fitted = calls.n
            for x in xs:
                detector(x)
            return fitted

        def their_maha(calls: Calls, parts: list[nn.Module] = parts) -> int:
            if found is None:
                return hand_multi_mahalanobis(parts, fit, xs, calls)
            detector = found.MultiMahalanobis(parts).to("cpu").fit(fit)
            fitted = calls.n
            for x in xs:
                detector.predict(x)
            return fitted

        def their_gram(calls: Calls, parts: list[nn.Module] = parts) -> int:
            detector = found.Gram(spec.head, parts, num_classes=10).to("cpu")
            detector.fit(fit)
            fitted = calls.n
            for x in xs:
                detector.predict(x)
            return fitted

        scenarios: dict[str, tuple[Callable[[Calls], int], nn.Module]] = {
            "ours MahalanobisEnsemble": (ours_maha, spec.net),
            "ours Gram": (ours_gram, spec.net),
            "theirs MultiMahalanobis": (their_maha, first),
        }
        if found is not None:
            scenarios["theirs Gram"] = (their_gram, first)
        times: dict[str, list[float]] = {name: [] for name in scenarios}
        counts: dict[str, tuple[int, int]] = {}
        for index in range(rounds):
            log(f"  {spec.name}: L = {len(layers)}, round {index + 1}/{rounds}")
            order = list(scenarios)
            rng.shuffle(order)
            for name in order:
                fn, module = scenarios[name]
                calls = Calls(module)
                start = time.perf_counter()
                try:
                    fitted = fn(calls)
                finally:
                    calls.handle.remove()
                times[name].append(time.perf_counter() - start)
                counts[name] = fitted, calls.n - fitted
        pairs = [
            ("ours MahalanobisEnsemble", "theirs MultiMahalanobis", "Mahalanobis"),
            ("ours Gram", "theirs Gram", "Gram"),
        ]

        def per_batch(name: str, counts: dict[str, tuple[int, int]] = counts) -> str:
            fitted, scored = counts[name]
            return f"{fitted / batches[0]:.2f} / {scored / batches[1]:.2f}"

        for ours, theirs, what in pairs:
            if theirs not in scenarios:
                continue
            rows.append(
                f"| {spec.name} | {what} | {len(layers)} | {per_batch(ours)} "
                f"| {per_batch(theirs)} | {statistics.median(times[ours]):.2f} "
                f"| {statistics.median(times[theirs]):.2f} "
                f"| **{paired_ratio(times[theirs], times[ours]):.2f}x** |"
            )
    return rows


# ------------------------------------------------------------ hand-written fits
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


def fit_section(spec: Spec, samples: int, rounds: int, rng: random.Random) -> list[str]:
    """The old section (a): ``.fit`` against a hand-written hook loop."""
    net, rnet, penultimate, fc, model = (
        spec.net,
        spec.rnet,
        spec.penultimate,
        spec.fc,
        spec.name,
    )
    batches = data(samples, 128, seed=0)
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


# ------------------------------------------------------------ memory
def fits(spec: Spec) -> dict[str, Detector]:
    """The catalogue's detectors that fit, and ReAct with its flat-memory sketch."""
    fitted = {name: d for name, d in catalogue(spec).items() if d.needs_fit}
    fitted["ReAct (exact=False)"] = ReAct(
        spec.rnet, layer=spec.penultimate, exact=False
    )
    return fitted


ALL = "the whole catalogue (fit_detectors)"


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One fit in this (fresh or forked) process: its peak RSS growth, KiB."""
    torch.set_num_threads(1)
    head = data(512, 128, seed=9)
    net = build(spec["model"], head)
    batches = data(spec["samples"], 128, seed=0)
    task = spec["task"]
    detectors = catalogue(net) if task == ALL else {task: fits(net)[task]}
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := RSS
    base = _status("VmRSS") or 0
    fit_detectors(detectors, batches, target=1)
    return {**spec, "growth_kib": (_status("VmHWM") or 0) - base}


def measure_memory(spec: dict[str, Any]) -> float:
    """Growth in MiB of one fit, in a forked child (else a fresh process)."""
    if not hasattr(os, "fork"):
        done = subprocess.run(  # noqa: S603 (this script, in a fresh process)
            [sys.executable, __file__, "--memory-child", json.dumps(spec)],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(json.loads(done.stdout)["growth_kib"]) / 1024
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave at once
        os.close(read)
        code = 0
        try:
            result = json.dumps(memory_child(spec))
        except BaseException as error:  # noqa: BLE001 (reported to the parent)
            result, code = json.dumps({"error": repr(error)}), 1
        os.write(write, result.encode())
        os.close(write)
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    result = json.loads(text)
    if "error" in result:
        msg = f"memory child {spec} failed: {result['error']}"
        raise RuntimeError(msg)
    return float(result["growth_kib"]) / 1024


def memory_section(sizes: list[int], tasks: list[str]) -> Iterator[str]:
    """Yield a row per fit, as it is measured."""
    for task in tasks:
        log(f"  memory: {task}")
        growth = [
            measure_memory({"model": "demo", "samples": n, "task": task}) for n in sizes
        ]
        cells = " | ".join(f"{g:+.2f}" for g in growth)
        yield f"| {task} | {cells} | {growth[-1] - growth[0]:+.2f} |"


# ------------------------------------------------------------ report
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2048, help="fit samples")
    parser.add_argument(
        "--score-samples", type=int, default=1024, help="ID samples scored (and OoD)"
    )
    parser.add_argument("--batch", type=int, default=128, help="batch size")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--models", default="demo,resnet", help="comma-separated: demo, resnet"
    )
    parser.add_argument(
        "--sections",
        default="catalogue,layers,memory",
        help="comma-separated: catalogue, layers, memory, hand (the fits "
        "against hand-written hook loops)",
    )
    parser.add_argument(
        "--memory-sizes", default="256,1024,4096", help="fit sizes for memory"
    )
    parser.add_argument(
        "--fits",
        default=None,
        help="comma-separated fits for the memory section (default: every fit)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, one round: a smoke run"
    )
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    pinned = pin_malloc(128 * 1024, 128 * 1024)
    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return 0
    torch.set_num_threads(1)
    if args.quick:
        args.samples, args.score_samples, args.batch, args.rounds = 256, 64, 64, 1
        args.memory_sizes = "256,1024"
    sizes = [int(n) for n in args.memory_sizes.split(",")]
    sections = args.sections.split(",")
    found = None if args.quick else import_pytorch_ood()
    print(
        f"# scio_recorder {scio_recorder.__version__}: the OoD catalogue, shared "
        "passes against one detector at a time\n\n"
        f"- torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs; 1 thread, eval mode; "
        f"batches of {args.batch}; {args.rounds} round(s); fit on "
        f"{args.samples:,} samples, scored on {args.score_samples:,} ID + "
        f"{args.score_samples:,} OoD; malloc pinned: {pinned}; "
        f"{time.strftime('%Y-%m-%d')}\n"
        "- pytorch-ood: "
        + ("imported" if found is not None else "not imported (hand-written loops)")
        + (" (--quick: a smoke run, not a measurement)" if args.quick else "")
    )
    failed = False
    head = data(512, 128, seed=9)
    specs = [build(m, head) for m in args.models.split(",")]
    fit = data(args.samples, args.batch, seed=0)
    test = make_blobs_images(args.score_samples, seed=2)[0].split(args.batch)
    noise = ood_sets(args.score_samples, seed=3)["noise"].split(args.batch)
    sets = {"id": list(test), "ood": list(noise)}
    if "catalogue" in sections:
        print(
            f"\n## (a) the catalogue: {len(catalogue(specs[0]))} detectors\n\n"
            "| model | phase | batches | forward calls shared | forward calls one "
            "at a time | shared s | one at a time s | speed-up (paired) |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|"
        )
        each: dict[str, dict[str, tuple[int, int, float, float]]] = {}
        for spec in specs:
            rows, each[spec.name], bad = catalogue_section(
                spec, fit, sets, args.rounds, seed=0
            )
            print("\n".join(rows))
            if bad:
                failed = True
                print(f"\nCHECK FAILED ({spec.name}): scores differ for {bad}")
        score_b = sum(len(xs) for xs in sets.values())
        names = " | ".join(f"{n} fit s | {n} score s" for n in each)
        print(
            f"\nEach detector alone: forward calls per batch ({len(fit)} fit "
            f"batches, {score_b} scored; the same on every net) and seconds "
            "(median over rounds):\n\n"
            f"| detector | fit calls | score calls | {names} |\n"
            "|---|---:|---:|" + "---:|---:|" * len(each)
        )
        first = next(iter(each.values()))
        for name, (f, s, _, _) in first.items():
            cells = " | ".join(
                f"{by[name][2]:.2f} | {by[name][3]:.2f}" for by in each.values()
            )
            print(f"| {name} | {f / len(fit):.2f} | {s / score_b:.2f} | {cells} |")
    if "layers" in sections:
        what = "pytorch-ood" if found is not None else "a hand-written per-layer loop"
        print(
            "\n## (b) multi-layer detectors: forward calls per batch (fit / score)"
            f", against {what}\n\n"
            "| model | detector | L | ours fit / score | theirs fit / score "
            "| ours s | theirs s "
            "| speed-up (paired) |\n|---|---|---:|---:|---:|---:|---:|---:|"
        )
        for spec in specs:
            xs = sets["id"]
            for row in layers_section(spec, fit, xs, args.rounds, seed=1, found=found):
                print(row)
    if "hand" in sections:
        print(
            "\n## fits against hand-written hook loops\n\n"
            "| model | samples | detector | median s | hand-written s "
            "| ratio (paired median) |\n|---|---:|---|---:|---:|---:|"
        )
        for spec in specs:
            rows = fit_section(spec, args.samples, args.rounds, random.Random(0))
            print("\n".join(rows))
    if "memory" in sections and Path("/proc/self/clear_refs").exists():
        tasks = [*fits(build("demo", head)), ALL]
        if args.fits:
            tasks = args.fits.split(",")
        elif args.quick:
            tasks = ["Mahalanobis", "KNN", ALL]
        cells = " | ".join(f"{n:,}" for n in sizes)
        print(
            "\n## (c) peak memory growth of a fit (demo CNN), MiB, by fit samples\n\n"
            f"| fit | {cells} | growth |\n|---|" + "---:|" * (len(sizes) + 1)
        )
        for row in memory_section(sizes, tasks):
            print(row, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
