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

from scio_recorder._support.tree import iter_tensors

from ._measure import difference, nonfinite, pairs, verdict
from ._passes import compared, dropping
from ._random import drawers, unseen
from ._report import CheckLine, named

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx

    from ._passes import Run


def check_recording(
    run: Run, plain: Any, recorded: Any, records: dict[DepthIdx, Any]
) -> CheckLine:
    """Compare the net's output ``recorded`` with its output ``plain`` (no hook).

    ``records``: the recorded pass's, in the order the calls ended. If any
    holds NaN or an infinity, the line says so, naming the first (WARN, if
    nothing worse): the comparing checks count NaN at the same places as
    equal, so this line is where they show.
    """
    worst, dtype = 0.0, torch.float32
    for a, b in pairs(recorded, plain):
        diff = difference(a, b)
        if diff > worst:
            worst, dtype = diff, b.dtype
    status = verdict(worst, dtype, exact=True)
    where = "the net's output"
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
    held = _not_numbers(run, records)
    if held is not None:
        first, said = held
        if status == "PASS":
            status, where = "WARN", first
            cause = f"{cause}, but {said}"
        else:
            cause = f"{cause}; and {said}"
    return CheckLine("recording", status, worst, "relative", where, cause)


def _not_numbers(run: Run, records: dict[DepthIdx, Any]) -> tuple[str, str] | None:
    """Say which records hold NaN or infinities: the first call's, and how many more.

    ``records`` are in the order the calls ended, so the first named is
    where the NaN appear (the calls around it end later). ``None``: every
    value is a number.
    """
    held: list[tuple[DepthIdx, int, int, int]] = []
    for label, record in records.items():
        counts = [(*nonfinite(t), t.numel()) for t in iter_tensors(record)]
        nan, inf = sum(c[0] for c in counts), sum(c[1] for c in counts)
        if nan or inf:
            held.append((label, nan, inf, sum(c[2] for c in counts)))
    if not held:
        return None
    label, nan, inf, size = held[0]
    kinds = " and ".join(kind for kind, n in (("NaN", nan), ("inf", inf)) if n)
    first = run.describe(label)
    later = len(held) - 1
    more = f", and {later} call{'s' * (later > 1)} after it" if later else ""
    said = (
        f"the records hold {kinds}: first in {first} ({nan + inf} of its {size} "
        f"values){more}; the net computes them (a log or sqrt of a negative, 0/0, "
        "an overflow), and scores from these records carry them. The other checks "
        "count NaN at the same places as equal"
    )
    return first, said


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
    *,
    drew: bool,
) -> tuple[CheckLine, str | None]:
    """Compare two passes, the second run from where the first left the net.

    ``changed``: the buffers the first pass changed; ``drew``: whether a
    pass drew from a global random generator (:mod:`._random`). Return the
    line, and what the other checks' differences may come from when the
    net keeps state between passes that the check cannot put back, or draws
    random numbers otherwise than by ``nn.Dropout`` (``None``: neither).
    A draw makes the line WARN even when the two passes agree: the records
    are random all the same.
    """
    per_layer, (diff, dtype, where) = compared(run, second, first)
    status = verdict(diff, dtype, exact=True)
    net = run.rnet.net
    dropouts = dropping(net)
    note = None
    keep = "call net.eval(), or keep it if you want random records (MC dropout)"
    drawn = ""  # the modules whose calls drew
    if drew and not dropouts:
        drawn = named(drawers(net, run.plain))
        note = (
            "the forward draws random numbers (see determinism), and a row alone "
            "or a copy in another dtype draws others"
        )
    if status == "PASS" and dropouts:
        status = "WARN"  # the passes drew alike here; the records are still random
        cause = (
            f"dropout is active ({named(dropouts)} in train mode, p > 0): the two "
            "passes gave bit-equal records here, but each pass draws its own masks "
            "and scales what it keeps by 1/(1-p), so the records are not the "
            f"eval-mode ones; {keep}"
        )
    elif status == "PASS" and drew:
        status = "WARN"  # the passes drew alike here; the records are still random
        cause = (
            f"the forward draws random numbers{f' (in {drawn})' if drawn else ''}: "
            "the two passes gave "
            "bit-equal records here, but each pass draws its own (a functional "
            "dropout such as F.dropout(x, p, training=True) scales what it keeps "
            "by 1/(1-p) even when it drops nothing), so the records are random; "
            "turn the draw off (training=False, net.eval()), or keep it if you "
            "want random records"
        )
    elif status == "PASS":
        cause = "two passes on the batch give bit-equal records"
        devices = unseen(net)
        if devices:
            cause += (
                f"; whether the forward draws random numbers on "
                f"{', '.join(devices)} cannot be told (only the CPU's and CUDA's "
                "generators are read)"
            )
    elif dropouts:
        status = "FAIL"
        cause = (
            f"dropout is active ({named(dropouts)} in train mode): each pass "
            f"draws other masks; {keep}"
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
            f"other than an nn.Dropout in train mode{f', in {drawn}' if drawn else ''})"
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
    if line.status == "PASS" or not line.magnitude or line.measure != "relative":
        return line
    return dataclasses.replace(
        line, cause=f"{note}: this difference may come from that"
    )
