"""Measure the memory and time of fitting OoD detectors at ImageNet's scale.

``MahalanobisEnsemble`` on 4 layers of 2,048 features with 1,000 classes
(ImageNet's: a ResNet-50's pooled features, its classes) keeps, per layer,
the class counts, the class means ``[C, F]`` and the pooled within-class
co-moment ``[F, F]``, in float64: ``(C + C*F + F*F) * 8`` bytes, 50 MiB a
layer, whatever the number of samples. This script checks that a fit's
memory is indeed flat in the number of samples, and measures its time, on
synthetic features (standard normal, random labels), three ways:

* ``reducers``: the detector's own reducers (``fit_keep()``: the shared
  covariance behind the pooling and the non-finite counter) fed batches of
  features directly;
* ``collect``: ``MahalanobisEnsemble(...).fit(batches, target=1)`` on a stub
  net whose 4 layers (``nn.Identity``) output the batch's features and whose
  head is a ``Linear(2048, 1000)``: the whole path (``collect``, the
  recorder, the records, the reducers);
* ``knn``: ``KNN`` on one such layer, a row for comparison: its bank keeps
  every sample's normalised features (``N * F * 4`` bytes), so it grows.

Every (path, sample count) runs in a fresh process, which reports its peak
resident memory (``ru_maxrss``) and its resident memory once everything is
built but before the first batch (the baseline); batches are generated on
the fly, so nothing but the fit holds memory that grows. The time is the
fit's wall time (generating the synthetic batches included; it is a few
percent). Streaming (the batches, through the reducers) and finishing (the
detector's ``fit_from``: a pseudo-inverse of each ``[F, F]`` covariance, a
fixed cost) are timed apart. The report extrapolates to ImageNet's
1,281,167 training images: the streaming time per additional sample (from
the smallest to the largest run: the first batches pay a start-up) times
that count, plus the finishing time; memory: the largest peak seen (flat) for the
Mahalanobis paths, the per-sample growth times that count for KNN.

``python benchmarks/memory.py --quick`` is a smoke run (small sizes);
``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import KNN, MahalanobisEnsemble

if TYPE_CHECKING:
    from collections.abc import Iterator

IMAGENET = 1_281_167
PATHS = ("reducers", "collect", "knn")
MIB = 2**20


class Stub(nn.Module):
    """``layers`` identity layers (the features), then a linear head."""

    def __init__(self, features: int, classes: int, layers: int) -> None:
        super().__init__()
        for i in range(layers):
            self.add_module(f"layer{i}", nn.Identity())
        self.head = nn.Linear(features, classes)
        self.layers = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.layers):
            x = self.get_submodule(f"layer{i}")(x)
        out: torch.Tensor = self.head(x)
        return out


def batches(args: argparse.Namespace) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(features, labels)`` batches, generated on the fly (seeded)."""
    generator = torch.Generator().manual_seed(0)
    left = args.samples
    while left > 0:
        size = min(args.batch, left)
        x = torch.randn(size, args.features, generator=generator)
        y = torch.randint(0, args.classes, (size,), generator=generator)
        left -= size
        yield x, y


def resident() -> int:
    """Bytes resident now (``/proc/self/statm``), else the peak so far."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:  # noqa: PTH123
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux
        return peak()


def peak() -> int:
    """Peak resident bytes of this process (``ru_maxrss``: KiB on Linux)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Fit once in this process; return the measures."""
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    net = Stub(args.features, args.classes, args.layers).eval()
    rnet = Recorder(net, input_size=(1, args.features))
    layers = [f"layer{i}" for i in range(args.layers)]
    if args.path == "knn":
        detector: Any = KNN(rnet, layer=layers[-1])
    else:
        detector = MahalanobisEnsemble(rnet, layers, pool=None)
    finishing = [0.0]
    streaming_peak = [0]
    fit_from = detector.fit_from

    def timed_fit_from(result: Any) -> None:
        streaming_peak[0] = peak()
        start = time.perf_counter()
        fit_from(result)
        finishing[0] += time.perf_counter() - start

    detector.fit_from = timed_fit_from
    reducers = detector.fit_keep()
    baseline = resident()
    start = time.perf_counter()
    if args.path == "reducers":
        for x, y in batches(args):
            for reducer in reducers.values():
                reducer.update(x, y)
        detector.fit_from({key: r.result() for key, r in reducers.items()})
    else:
        target = 1 if args.path == "collect" else None
        with torch.no_grad():
            detector.fit(batches(args), target=target)
    seconds = time.perf_counter() - start
    return {
        "stream": seconds - finishing[0],
        "finish": finishing[0],
        "baseline": baseline,
        "streaming_peak": streaming_peak[0],
        "peak": peak(),
    }


def run(args: argparse.Namespace, path: str, samples: int) -> dict[str, Any]:
    """Run :func:`child` in a fresh interpreter; return its measures."""
    command = [
        sys.executable,
        __file__,
        "--child",
        path,
        "--samples",
        str(samples),
        *("--classes", str(args.classes), "--features", str(args.features)),
        *("--layers", str(args.layers), "--batch", str(args.batch)),
        *("--threads", str(args.threads)),
    ]
    # A fixed mmap threshold: glibc returns every freed large tensor to the
    # system at once, so the resident peak is the peak of live memory.
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(  # noqa: S603 (our own script)
        command, capture_output=True, text=True, check=False, env=env
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        msg = f"{path} on {samples} samples failed (exit {done.returncode})"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def state_bytes(args: argparse.Namespace) -> int:
    """The float64 state of the Mahalanobis reducers, all layers."""
    per_layer = args.classes + args.classes * args.features + args.features**2
    return 8 * per_layer * args.layers


def report(args: argparse.Namespace, rows: dict[str, list[dict[str, Any]]]) -> str:
    """Return the Markdown report: the table, then the extrapolations."""
    lines = [
        "# Fitting at scale: memory and time against the number of samples",
        "",
        (
            f"- {args.classes} classes, {args.features} features, {args.layers} "
            f"layers (KNN: one), batches of {args.batch}; CPU "
            f"({platform.machine()}), {args.threads} torch thread(s), torch "
            f"{torch.__version__}"
        ),
        (
            f"- the Mahalanobis state: {state_bytes(args) / MIB:,.0f} MiB "
            "(class means and the within-class co-moment, float64, all layers)"
        ),
        (
            "- each row is a fresh process; memory is the peak resident memory "
            "over the memory resident before the first batch, while streaming "
            "and overall (glibc's mmap threshold fixed at 64 KiB)"
        ),
        "",
        (
            "| path | samples | streaming s | finishing s | streaming peak MiB "
            "| peak MiB, finishing included |"
        ),
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines.extend(
        f"| {path} | {r['samples']:,} | {r['stream']:,.1f} | {r['finish']:,.1f} | "
        f"{(r['streaming_peak'] - r['baseline']) / MIB:,.0f} | "
        f"{(r['peak'] - r['baseline']) / MIB:,.0f} |"
        for path, results in rows.items()
        for r in results
    )
    lines += ["", f"Extrapolated to ImageNet's {IMAGENET:,} samples:", ""]
    for path, results in rows.items():
        first, last = results[0], results[-1]
        if len(results) > 1:  # the marginal cost: the first batches pay start-up
            per_sample = (last["stream"] - first["stream"]) / (
                last["samples"] - first["samples"]
            )
        else:
            per_sample = last["stream"] / last["samples"]
        finish = statistics.median(r["finish"] for r in results)
        hours = (per_sample * IMAGENET + finish) / 3600
        grown = [r["streaming_peak"] - r["baseline"] for r in results]
        if path == "knn" and len(results) > 1:
            slope = (grown[-1] - grown[0]) / (last["samples"] - first["samples"])
            memory = (
                f"grows, {slope:,.0f} bytes per sample: "
                f"{slope * IMAGENET / 2**30:,.1f} GiB"
            )
        else:
            memory = (
                f"flat, at most {max(grown) / MIB:,.0f} MiB while streaming "
                f"({max(r['peak'] - r['baseline'] for r in results) / MIB:,.0f} "
                "MiB with the finishing)"
            )
        lines.append(
            f"- {path}: {hours:,.1f} h here (streaming {per_sample * 1e6:,.0f} µs "
            f"per sample, then {finish:,.0f} s to finish); memory {memory}"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default=None, help="comma-separated counts")
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--features", type=int, default=None)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared machine, more threads wait "
        "for each other in every parallel kernel)",
    )
    parser.add_argument("--paths", default=",".join(PATHS), help="subset of paths")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    small = args.quick
    if args.classes is None:
        args.classes = 10 if small else 1000
    if args.features is None:
        args.features = 64 if small else 2048
    if args.samples is None:
        args.samples = "512,1024" if small else "1024,4096,16384"
    args.counts = [int(s) for s in args.samples.split(",")]
    args.paths = [p for p in args.paths.split(",") if p]
    if unknown := sorted(set(args.paths) - set(PATHS)):
        parser.error(f"--paths: unknown {unknown}; choose from {PATHS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        args.path, args.samples = args.child, args.counts[0]
        print(json.dumps(child(args)))
        return 0
    rows: dict[str, list[dict[str, Any]]] = {}
    for path in args.paths:
        for samples in args.counts:
            print(f"{path}: {samples:,} samples", file=sys.stderr)
            rows.setdefault(path, []).append(
                {"samples": samples, **run(args, path, samples)}
            )
    print(report(args, rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
