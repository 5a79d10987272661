"""The entry point: parse, run the command, report errors in one line."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING

from scio_recorder._support.errors import CLIError

from ._check import _check
from ._demo import _demo
from ._graph import _graph
from ._merge import _merge
from ._model import _as_program
from ._parser import _build_parser
from ._summary import _summary

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo,
    "summary": _summary,
    "graph": _graph,
    "check": _check,
    "merge": _merge,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``scio-recorder`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Command-line arguments without the program name; ``sys.argv[1:]`` if
        None.

    Returns
    -------
    int
        Exit status: 0, or 2 for an error (printed as one line).

    Raises
    ------
    SystemExit
        On ``--help``, ``--version`` or a usage error, as :mod:`argparse` does.

    Examples
    --------
    >>> main(["summary", "nope"])
    2

    """
    args = _build_parser().parse_args(argv)
    target = getattr(args, "target", None)
    try:
        with contextlib.nullcontext() if target is None else _as_program(target):
            status = COMMANDS[args.command](args)
            sys.stdout.flush()  # a closed pipe fails here, not at the exit
            return status
    except BrokenPipeError:
        # The reader left (`scio-recorder summary ... | head`): stop quietly, as
        # Unix tools do; stdout goes nowhere so that the exit's flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as error:
        if args.debug:
            raise
        text = str(error).strip().replace("\n", " ") or type(error).__name__
        if not isinstance(error, CLIError):
            text = f"{type(error).__name__}: {text}"
        print(
            f"scio-recorder: error: {text} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return 2
