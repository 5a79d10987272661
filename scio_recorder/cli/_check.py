"""``scio-recorder check``: check a recording job on the model's input."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from scio_recorder import CallInputs
from scio_recorder._support.errors import CLIError
from scio_recorder.layers import example_inputs

from ._model import _model, _recorder, _selector

if TYPE_CHECKING:
    import argparse


def _padded(data: Any, side: str) -> Any:
    """Pad row ``r`` of ``B`` by ``r * T // (2 * B)`` tokens (id 0) on ``side``."""
    if side == "none":
        return data
    if not isinstance(data, dict) or "attention_mask" not in data:
        msg = (
            f"--padding {side} needs --input-ids and a model whose forward takes an "
            "attention_mask (the padding is marked there)"
        )
        raise CLIError(msg)
    ids = next(iter(data.values())).clone()
    mask = torch.ones_like(ids)
    rows, width = ids.shape
    for row in range(rows):
        pad = row * width // (2 * rows)
        if pad:
            where = slice(None, pad) if side == "left" else slice(width - pad, None)
            mask[row, where] = 0
    return {next(iter(data)): ids * mask, "attention_mask": mask}


def _check(args: argparse.Namespace) -> int:
    from scio_recorder._run.batches import Positions  # noqa: PLC0415 (when used)
    from scio_recorder.checks import check_recorder  # noqa: PLC0415

    if args.rows < 1:
        msg = f"--rows {args.rows}: give the number of rows to run alone, >= 1"
        raise CLIError(msg)
    net, given = _model(args)
    rnet = _recorder(net, given)
    if args.padding != "none":
        given.kwargs["input_data"] = _padded(
            given.kwargs.get("input_data"), args.padding
        )
    call_args, call_kwargs = example_inputs(net, given.kwargs)
    mode = None if args.position_ids == "none" else args.position_ids
    call_args, call_kwargs = Positions(net, mode).add(call_args, call_kwargs)
    layers = [_selector(s) for s in args.record] or None
    try:
        report = check_recorder(
            rnet, CallInputs(call_args, call_kwargs), layers=layers, rows=args.rows
        )
    except (KeyError, ValueError, TypeError) as error:
        if layers is None:
            raise
        said = str(error).strip("'\"")
        msg = f"--record {' '.join(args.record)}: {said}"
        raise CLIError(msg) from error
    print(report)
    return 1 if report.failed else 0
