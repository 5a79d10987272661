"""Parts of a run split over independent workers: the checks both tools share.

Holds :func:`check_part` (``part=K, parts=N`` as
:func:`scio_recorder.activations.write` and
:func:`scio_recorder.collect.collect` take them) and
:func:`refuse_process_group` (a part is written with no
:mod:`torch.distributed` process group).

Why: an activation set and a collect run split into parts follow one rule
(part ``K`` of ``N``, no process group, a merge afterwards), checked and
worded once.
"""

from __future__ import annotations

__all__ = ["check_part", "refuse_process_group"]


def check_part(part: object, parts: object, *, append: bool) -> None:
    """Refuse ``part``/``parts`` that do not name one part of a split."""
    if part is None and parts is None:
        return
    for name, value in (("part", part), ("parts", parts)):
        if value is None:
            other = "parts" if name == "part" else "part"
            msg = (
                f"`{other}` was given without `{name}`: pass both (part K of N, "
                "0 <= K < N), or neither."
            )
            raise ValueError(msg)
        if isinstance(value, bool) or not isinstance(value, int):
            msg = f"`{name}` must be an int, got {value!r}"
            raise TypeError(msg)
    assert isinstance(part, int)  # noqa: S101 (checked above)
    assert isinstance(parts, int)  # noqa: S101 (checked above)
    if parts < 1 or not 0 <= part < parts:
        msg = (
            "`part` must be in 0..parts-1 and `parts` >= 1, got "
            f"part={part}, parts={parts}"
        )
        raise ValueError(msg)
    if append:
        msg = (
            "`append=True` adds a part to a finished set; `part=` writes one "
            "part of a set written by several workers: pass one of them."
        )
        raise ValueError(msg)


def refuse_process_group(world: int) -> None:
    """Refuse a part written inside a process group of several ranks."""
    if world > 1:
        msg = (
            "`part=` writes one part with no process group, but a "
            f"torch.distributed process group of {world} ranks is initialised: "
            "call `write` without `part=` (every rank writes its shards of one "
            "set), or make each rank a part of its own (part=K * world + rank, "
            "parts=N * world) in processes without a process group."
        )
        raise RuntimeError(msg)
