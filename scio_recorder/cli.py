"""Command-line interface: ``scio-recorder``.

Subcommands
-----------
demo
    Wrap a tiny CNN in a :class:`~scio_recorder.Recorder`, record two layers
    during a forward pass, then clip one layer's output in flight.

Run ``scio-recorder --help`` or ``python -m scio_recorder --help`` for usage.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import scio_recorder
from scio_recorder import Recorder
from scio_recorder.models import demo_model

if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch import Tensor

    from scio_recorder import Layer

__all__ = ["main"]

DIST_NAME = "scio-recorder"
BATCH_SIZE = 4
CLIP_MAX = 1.0


def _version() -> str:
    try:
        return version(DIST_NAME)
    except PackageNotFoundError:  # running from a source tree, not installed
        return str(getattr(scio_recorder, "__version__", "unknown"))


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scio-recorder",
        description="Record the activations of chosen layers of a PyTorch model.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    demo = subparsers.add_parser(
        "demo",
        help="record two layers of a tiny CNN and clip one in flight",
        description=(
            "Wrap a tiny random CNN in a Recorder, print its layer table, record "
            "two layers on a random batch, then clip one layer in flight."
        ),
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for the weights and the input batch (default: %(default)s)",
    )
    return parser


def _rows(rnet: Recorder) -> list[Layer]:
    """Return the rows of the layer table, in table order."""
    table: Any = rnet.table
    # A mapping label -> row iterates over labels; otherwise it yields rows.
    return list(table.values() if isinstance(table, Mapping) else table)


def _clip(t: Tensor) -> Tensor:
    """ReAct-style postprocessor: clip activations from above."""
    return t.clamp(max=CLIP_MAX)


def demo(seed: int = 0) -> int:
    """Run the demonstration printed by ``scio-recorder demo``.

    Parameters
    ----------
    seed : int, default 0
        Seed of :func:`torch.manual_seed`, fixing the weights and the input.

    Returns
    -------
    int
        Exit status, 0 on success.
    """
    torch.manual_seed(seed)
    net = demo_model().eval()
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    print(rnet)

    rows = [row for row in _rows(rnet) if row.recordable]
    convs = [row for row in rows if isinstance(row.module, nn.Conv2d)]
    linears = [row for row in rows if isinstance(row.module, nn.Linear)]
    if not convs or not linears:
        print("error: the demo model has no recordable Conv2d or Linear layer")
        return 1
    first_conv, last_linear = convs[0], linears[-1]

    rnet.record(first_conv.label, last_linear.label)
    print()
    print(f"Recording {first_conv.label} ({first_conv.name}) and ", end="")
    print(f"{last_linear.label} ({last_linear.name})")
    x = torch.randn(BATCH_SIZE, 3, 32, 32)
    with torch.no_grad():
        logits = rnet(x)
    print(f"Forward pass on a random batch of {BATCH_SIZE}:")
    for label, activation in rnet.activations.items():
        shape = tuple(activation.shape)
        mean = activation.float().mean().item()
        print(f"  {label}: shape {shape}, mean {mean:+.4f}")

    # ReAct (Sun et al., 2021) clips rectified activations from above; clip
    # those of the first ReLU, the first place where the random net exceeds 1.
    relu = next(row for row in rows if isinstance(row.module, nn.ReLU))
    rnet.record(relu.label)
    with torch.no_grad():
        reference = rnet(x)
        above = int((rnet.activations[relu.label] > CLIP_MAX).sum())
        total = rnet.activations[relu.label].numel()
        edited = rnet(x, activation_postproc=_clip)
    changed = int((edited != reference).sum())
    print()
    print(
        f"In-flight edit (ReAct-style): clamp(max={CLIP_MAX}) on "
        f"{relu.label} ({relu.name})"
    )
    print(f"  activations clipped: {above} of {total}")
    print(f"  logits changed: {changed} of {edited.numel()}")
    if not torch.equal(reference, logits):
        print("error: recording another layer changed the logits")
        return 1
    return 0


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
        Exit status.

    Raises
    ------
    SystemExit
        On ``--help``, ``--version`` or a usage error, as :mod:`argparse` does.
    """
    args = _build_parser().parse_args(argv)
    if args.command == "demo":
        return demo(seed=args.seed)
    return 2  # pragma: no cover - argparse rejects unknown commands
