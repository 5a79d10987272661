"""The checks that want bit-equal passes: ``"recording"`` and ``"determinism"``.

``recording`` compares the net's outputs with the recorder and without any
hook, from the same random state and buffers (:func:`check_recording`);
``determinism`` two recorded passes, the second from where the first left
the net (:func:`check_determinism`), and tells state kept between passes
from random draws and from nondeterministic kernels by running again from
the state found. When the net keeps state or draws random numbers, the
other checks' passes did not start alike: :func:`from_passes` says so in
their causes.
"""

from __future__ import annotations

__all__ = ["check_determinism", "check_recording", "from_passes"]

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._measure import difference, pairs, verdict
from ._passes import DROPOUTS, compared, in_train_mode
from ._report import CheckLine, named

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx

    from ._passes import Run


def check_recording(run: Run, plain: Any, recorded: Any) -> CheckLine:
    """Compare the net's output ``recorded`` with its output ``plain`` (no hook)."""
    worst, dtype = 0.0, torch.float32
    for a, b in pairs(recorded, plain):
        diff = difference(a, b)
        if diff > worst:
            worst, dtype = diff, b.dtype
    status = verdict(worst, dtype, exact=True)
    if status == "PASS":
        cause = "the outputs with and without the recorder are bit-equal"
    else:
        fused = [
            run.rnet.table[label].name
            for label in run.labels
            if _inside(run.rnet.net, run.rnet.table[label].name, _FUSED)
        ]
        cause = (
            f"recording calls inside {named(fused)} turns off the fused fast "
            "path of the module around them (any hook does): the outputs change by "
            "roundings; record the module itself to keep it fused"
            if fused
            else "the outputs change when the net is recorded: a module computes "
            "another way when a hook is on it or on a submodule (a fused fast path, "
            "as torch's TransformerEncoderLayer has)"
        )
    return CheckLine("recording", status, worst, "relative", "the net's output", cause)


_FUSED = (nn.TransformerEncoderLayer, nn.MultiheadAttention)


def _inside(net: nn.Module, name: str, kinds: tuple[type[nn.Module], ...]) -> bool:
    """Whether the module ``name`` sits inside a module of ``kinds``."""
    parts = name.split(".") if name else []
    return any(
        isinstance(net.get_submodule(".".join(parts[:k])), kinds)
        for k in range(len(parts))
        if k
    )


def check_determinism(
    run: Run,
    first: dict[DepthIdx, Any],
    second: dict[DepthIdx, Any],
    changed: list[str],
) -> tuple[CheckLine, str | None]:
    """Compare two passes, the second run from where the first left the net.

    ``changed``: the buffers the first pass changed. Return the line, and
    what the other checks' differences may come from when the net keeps
    state between passes that the check cannot put back, or draws random
    numbers otherwise than by ``nn.Dropout`` (``None``: neither).
    """
    per_layer, (diff, dtype, where) = compared(run, second, first)
    status = verdict(diff, dtype, exact=True)
    dropouts = in_train_mode(run.rnet.net, DROPOUTS)
    note = None
    if status == "PASS":
        cause = "two passes on the batch give bit-equal records"
    elif dropouts:
        status = "FAIL"
        cause = (
            f"dropout is active ({named(dropouts)} in train mode): each pass "
            "draws other masks; call net.eval()"
        )
    elif changed:
        status = "FAIL"
        cause = (
            f"state kept between passes: a pass changes the buffer {named(changed)} "
            "in place and the next pass reads it, so two passes on the same batch "
            "differ (the other checks start each pass from the state found)"
        )
    elif compared(run, run.records(seed=True), first)[1][0] == 0:
        status = "FAIL"  # the same random state repeats it: random draws
        cause = (
            "two passes on the same batch differ, and two from the same random "
            "state do not: the forward draws random numbers (a random operation "
            "other than an nn.Dropout in train mode)"
        )
        note = (
            "the forward draws random numbers (see determinism), and a row alone "
            "or a copy in another dtype draws others"
        )
    elif status == "WARN":
        cause = (
            "two passes differ by roundings: nondeterministic kernels (atomic "
            "additions on a GPU); torch.use_deterministic_algorithms(True) makes "
            "them repeat"
        )
    else:
        note = (
            "the net keeps state between passes (see determinism), so the passes "
            "compared here did not start from the same state"
        )
        cause = (
            "two passes on the same batch differ, even from the same random state "
            "and buffers: the net keeps state between passes outside its buffers "
            "(an attribute a pass changes)"
        )
    line = CheckLine("determinism", status, diff, "relative", where, cause, per_layer)
    return line, note


def from_passes(line: CheckLine, note: str) -> CheckLine:
    """Say that a line's difference may come from what ``note`` says of the passes."""
    if line.status == "PASS" or line.magnitude is None or line.measure != "relative":
        return line
    return dataclasses.replace(
        line, cause=f"{note}: this difference may come from that"
    )
