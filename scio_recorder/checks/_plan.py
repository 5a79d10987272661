"""The checks of what the reference pass foretold: ``"inplace"`` and ``"calls"``.

The reference pass knows which recorded outputs a later in-place operation
overwrites: the recorder copies those, so its records stay exact, and
:func:`check_inplace` warns, naming them. A record changed in place that
the reference pass did not foresee (another mode, a data-dependent branch)
shows when the records are compared with copies taken as the calls end,
and fails. :func:`check_calls` turns the call plan's
:class:`~scio_recorder.CallPlanError`, if a checked pass raised one, into
the line.
"""

from __future__ import annotations

__all__ = ["changed_in_place", "check_calls", "check_inplace"]

from typing import TYPE_CHECKING, Any

from ._measure import difference, pairs
from ._report import CheckLine, named_plain

if TYPE_CHECKING:
    from scio_recorder._support.errors import CallPlanError
    from scio_recorder.layers import DepthIdx

    from ._passes import Run


def changed_in_place(
    run: Run, records: dict[DepthIdx, Any], options: dict[str, Any]
) -> dict[DepthIdx, float]:
    """Return how much each of ``records`` moved from a copy taken as its call ended.

    ``records``: a pass's, recorded with ``options`` (which do not clone);
    the copies come from a pass with ``clone=True``. Nonzero: an operation
    the reference pass did not foresee changed the output in place.
    """
    with run.rnet.selecting(*run.labels, **{**options, "clone": True}):
        copies = run.records(seed=True)
    moved = {}
    for label in run.labels:
        most = max(
            (difference(a, b) for a, b in pairs(records[label], copies[label])),
            default=0.0,
        )
        if most > 0:
            moved[label] = most
    return moved


def check_inplace(run: Run, changed: dict[DepthIdx, float]) -> CheckLine:
    """Check in-place overwrites; ``changed``: label -> how much its record moved."""
    table = run.rnet.table
    known = [label for label in run.labels if "output" in table[label].overwritten]
    if changed:
        labels = sorted(changed, key=lambda label: -changed[label])
        return CheckLine(
            "inplace",
            "FAIL",
            changed[labels[0]],
            "relative",
            ", ".join(table[label].describe() for label in labels[:3]),
            "a record was changed in place by an operation the reference pass did not "
            "run (another mode, a data-dependent branch), so it no longer holds the "
            "layer's output: rnet.record(..., clone=True) keeps it exact",
            {table[label].label_str: changed[label] for label in labels},
        )
    if known:
        return CheckLine(
            "inplace",
            "WARN",
            len(known),
            "count",
            named_plain([table[label].describe() for label in known]),
            "a later in-place operation overwrites these outputs (e.g. "
            "ReLU(inplace=True) after them): the recorder copies them, so its records "
            "are exact, at the cost of a copy; a hook of your own must clone them",
            {table[label].label_str: 1.0 for label in known},
        )
    return CheckLine(
        "inplace",
        "PASS",
        0,
        "count",
        "",
        "no in-place operation overwrites a recorded output",
    )


def check_calls(run: Run, error: CallPlanError | None) -> CheckLine:
    """Say whether the checked passes ran as the plan says (``error``: not)."""
    if error is None:
        return CheckLine(
            "calls",
            "PASS",
            None,
            "",
            "",
            f"each of the {len(run.labels)} checked calls ran as in the reference pass",
        )
    text = str(error)
    first = text.split(". Labels cannot", 1)[0]
    causes = text.split("Likely causes: ", 1)[-1] if "Likely causes: " in text else ""
    return CheckLine(
        "calls",
        "FAIL",
        None,
        "",
        first.removeprefix("Call plan mismatch: "),
        causes or text,
    )
