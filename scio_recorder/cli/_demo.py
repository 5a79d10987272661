"""``scio-recorder demo``: the digits OoD demo (:mod:`scio_recorder.demo`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scio_recorder._support.errors import CLIError

if TYPE_CHECKING:
    import argparse
    from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    out: Path = args.out
    # Checked before the run (seconds), not when the pictures are drawn.
    if out.exists() and not out.is_dir():
        msg = f"--out {out} is a file, not a folder: give a folder for the pictures"
        raise CLIError(msg)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        msg = f"--out {out}: cannot make that folder ({error.strerror}); give another"
        raise CLIError(msg) from error
    from scio_recorder.demo import run_demo  # noqa: PLC0415 (heavier imports)

    if args.all:
        run_demo(out, seed=args.seed, quick=args.quick, detectors=None)
    else:
        run_demo(out, seed=args.seed, quick=args.quick)
    return 0
