"""``scio-recorder summary``: the labelled layer table, and the recorded layers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from scio_recorder._support.errors import CLIError
from scio_recorder._support.render import text_table

from ._model import _model, _recorder, _selector

if TYPE_CHECKING:
    import argparse

    from scio_recorder import Recorder


def _summary(args: argparse.Namespace) -> int:
    net, inputs = _model(args)
    options = {} if args.depth is None else {"depth": args.depth}
    rnet = _recorder(net, inputs, **options)
    if args.record:  # before the table, so that it marks the recorded rows
        try:
            rnet.record(*(_selector(s) for s in args.record))
        except (KeyError, ValueError, TypeError) as error:
            said = str(error).strip("'\"")
            msg = (
                f"--record {' '.join(args.record)}: {said} (`scio-recorder "
                "summary` without --record lists the labels and names to record)"
            )
            raise CLIError(msg) from error
    if args.full:
        print(rnet.summary)
    else:
        try:
            print(rnet.compact(args.width))
        except ValueError as error:
            msg = f"--width {args.width}: {error}"
            raise CLIError(msg) from error
    if not args.record:
        return 0
    call_args, call_kwargs = rnet.example_inputs()
    with torch.no_grad():
        rnet(*call_args, **call_kwargs)
    print("\nrecorded in one pass on the input above:")
    print(_recorded_table(rnet, args.width))
    return 0


def _recorded_table(rnet: Recorder, width: int) -> str:
    """Return the recorded outputs of the latest pass: shapes and statistics.

    At most ``width`` characters a line: the statistics are left out from
    the right (max, min, std) before names and shapes are cut in the middle.
    """
    header = ["label", "name", "shape", "mean", "std", "min", "max"]
    rows = []
    for label, value in rnet.activations.items():
        row = rnet.table[label]
        cells = [row.label_str, row.name or "-"]
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            v = value.detach().double()
            std = v.std() if v.numel() > 1 else 0.0
            cells += [
                str(list(value.shape)),
                f"{v.mean():+.4g}",
                f"{std:.4g}",
                f"{v.min():+.4g}",
                f"{v.max():+.4g}",
            ]
        else:
            cells += [type(value).__name__, "-", "-", "-", "-"]
        rows.append(cells)
    # first uncut, leaving statistics out; then names and shapes cut too
    for flexible in ([], [[1], [2]]):
        for shown in range(len(header), 3, -1):
            lines = text_table(
                header[:shown],
                [cells[:shown] for cells in rows],
                width=width,
                flexible=flexible,
                right=range(3, shown),
            )
            if lines is not None:
                return "\n".join(lines)
    return "\n".join(  # pragma: no cover - --width >= 40 fits 4 cut columns
        "  ".join(cells[:4]) for cells in [header, *rows]
    )
