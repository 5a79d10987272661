"""Measure what starting costs: ``import scio_recorder`` and the CLI's ``--help``.

Each command runs in a fresh interpreter, timed from outside (wall clock,
interpreter start included), against ``python -c "import torch"``, which
every use of the library pays anyway:

* ``import torch``: the baseline;
* ``import scio_recorder``: target <= 1.15x the baseline;
* ``python -m scio_recorder --help`` (what the ``scio-recorder`` command
  runs): target <= 1.25x;
* for information, without target: ``import scio_recorder.ood`` (the OoD
  face; detectors load when first used) and a first ``Recorder`` with the
  default static-flow check (torch's ``FakeTensorMode``, which imports
  ``torch._dynamo``).

Runs are interleaved: each round runs every command once, in a freshly
shuffled order, and each ratio is the median over rounds of the command's
time over the baseline's in the same round (paired), so that the load of a
shared machine cancels. Commands run in the checkout (``--checkout``, this
repository by default), so that they import its package; ``--baseline
PATH`` adds the same rows for another checkout (e.g. the main branch) in the
same rounds, for a before/after comparison. Python writes and reads its
bytecode caches as after a normal install (``PYTHONDONTWRITEBYTECODE`` is
dropped), and one warm-up round runs first.

``python benchmarks/startup.py --help`` lists the options; ``--quick`` is the
smoke run CI does.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIRST_RECORDER = (
    "from torch import nn; from scio_recorder import Recorder; "
    "Recorder(nn.Sequential(nn.Linear(4, 4)), input_size=(1, 4))"
)


@dataclass
class Command:
    name: str
    argv: list[str]
    cwd: Path
    target: float | None = None
    seconds: list[float] = field(default_factory=list)


def commands(checkout: Path, label: str = "") -> list[Command]:
    """The commands measured in ``checkout`` (the baseline comes first)."""
    python = sys.executable
    suffix = f" ({label})" if label else ""
    return [
        Command(f"import torch{suffix}", [python, "-c", "import torch"], checkout),
        Command(
            f"import scio_recorder{suffix}",
            [python, "-c", "import scio_recorder"],
            checkout,
            1.15,
        ),
        Command(
            f"scio-recorder --help{suffix}",
            [python, "-m", "scio_recorder", "--help"],
            checkout,
            1.25,
        ),
        Command(
            f"import scio_recorder.ood{suffix}",
            [python, "-c", "import scio_recorder.ood"],
            checkout,
        ),
        Command(
            f"first Recorder(net){suffix}", [python, "-c", FIRST_RECORDER], checkout
        ),
    ]


def run(command: Command, env: dict[str, str]) -> float:
    """Run ``command`` once; return its wall-clock time in seconds."""
    start = time.perf_counter()
    done = subprocess.run(  # noqa: S603 (our own interpreter and commands)
        command.argv,
        cwd=command.cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        msg = f"{command.name} failed ({done.returncode}):\n{done.stderr}"
        raise RuntimeError(msg)
    return seconds


def imported_from(checkout: Path, env: dict[str, str]) -> str:
    """Where ``import scio_recorder`` finds the package when run in ``checkout``."""
    done = subprocess.run(
        [sys.executable, "-c", "import scio_recorder; print(scio_recorder.__file__)"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return str(Path(done.stdout.strip()).parent)


def row(command: Command, baseline: Command) -> str:
    median_s = statistics.median(command.seconds)
    if command is baseline:
        return f"| {command.name} | {median_s:.2f} s | 1 | — |"
    ratio = statistics.median(
        a / b for a, b in zip(command.seconds, baseline.seconds, strict=True)
    )
    target = "—" if command.target is None else f"≤ {command.target:.2f}"
    flag = " (missed)" if command.target is not None and ratio > command.target else ""
    return f"| {command.name} | {median_s:.2f} s | {ratio:.2f}{flag} | {target} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument(
        "--checkout", type=Path, default=ROOT, help="the checkout measured"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="PATH",
        help="another checkout measured in the same rounds (e.g. the main branch)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run (CI)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 3
    random.seed(args.seed)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    groups = [commands(args.checkout.resolve())]
    if args.baseline is not None:
        groups[0] = commands(args.checkout.resolve(), "this checkout")
        groups.append(commands(args.baseline.resolve(), "baseline"))
    for group in groups:
        print(f"{group[0].cwd}: imports {imported_from(group[0].cwd, env)}")
    everything = [command for group in groups for command in group]
    for command in everything:  # warm up: bytecode caches, file system
        run(command, env)
    for r in range(args.rounds):
        for command in random.sample(everything, len(everything)):
            command.seconds.append(run(command, env))
        print(f"  round {r + 1}/{args.rounds}", file=sys.stderr)
    title = (
        f"Python {sys.version.split()[0]}, {args.rounds} rounds; ratios are "
        "medians of paired rounds over `import torch` run in the same round"
    )
    lines = [
        title,
        "",
        "| command | median time | / import torch | target |",
        "|---|---:|---:|---:|",
    ]
    for group in groups:
        lines += [row(command, group[0]) for command in group]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
