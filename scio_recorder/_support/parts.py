"""Parts of a run split over independent workers: the checks both tools share.

Holds :func:`check_part` (``part=K, parts=N`` as
:func:`scio_recorder.activations.write` and
:func:`scio_recorder.collect.collect` take them),
:func:`refuse_process_group` (a part is written with no
:mod:`torch.distributed` process group) and :func:`weights_digest` (the
model's weights, saved with each part and compared by the merges: parts of
other weights are refused).

Why: an activation set and a collect run split into parts follow one rule
(part ``K`` of ``N``, no process group, a merge afterwards), checked and
worded once.
"""

from __future__ import annotations

__all__ = ["SAMPLE", "check_part", "refuse_process_group", "weights_digest"]

import hashlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import nn

SAMPLE = 4096
"""The values of each parameter or buffer that :func:`weights_digest` reads."""


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


def weights_digest(net: nn.Module) -> str:
    """Return a digest of a net's weights: names, shapes, dtypes and sampled values.

    Each parameter and buffer contributes its name, shape and dtype and the
    bytes of up to :data:`SAMPLE` of its values, evenly spaced (a copy of at
    most that many values to the CPU each: a few milliseconds for a large
    model); weights on the ``meta`` device (offloaded) contribute no values.
    Two parts written with other checkpoints of the same architecture differ
    here, almost surely, since fine-tuning moves nearly every value.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Linear(3, 2)
    >>> before = weights_digest(net)
    >>> with torch.no_grad():
    ...     _ = net.weight.add_(1.0)
    >>> before == weights_digest(net), len(before)
    (False, 16)

    """
    digest = hashlib.sha256()
    for name, tensor in net.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.Tensor):
            continue
        digest.update(f"{name} {list(tensor.shape)} {tensor.dtype}\n".encode())
        if tensor.device.type == "meta" or not tensor.numel():
            continue
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // SAMPLE)
        sample = flat[::step][:SAMPLE].to("cpu").contiguous()
        digest.update(sample.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
