"""How far apart two records are, and the verdict that gives.

:func:`difference` is the largest absolute difference over the reference's
largest magnitude (0: equal; infinite: not comparable, as a NaN or an
infinity on one side only, or another shape); :func:`verdict` says PASS,
WARN or FAIL of it by the package's tolerance rule (up to ``1024 eps`` of
the dtype is rounding). Every check measures with these, so that their
numbers mean the same.
"""

from __future__ import annotations

__all__ = ["difference", "pairs", "verdict"]

import math
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._tree import iter_tensors

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch import Tensor

    from ._report import Status


def _tolerance(dtype: torch.dtype) -> float:
    """Return the largest relative difference that float rounding explains.

    ``1024 eps`` of the dtype (a few hundred roundings, each at most ``eps``
    relative to the largest magnitude), at most 1/16 (bfloat16, float16).
    """
    if not dtype.is_floating_point:
        return 0.0
    return min(1024 * torch.finfo(dtype).eps, 1 / 16)


def verdict(relative: float, dtype: torch.dtype, *, exact: bool) -> Status:
    """Say PASS, WARN or FAIL of a relative difference between records.

    PASS: equal, or (unless ``exact``) within rounding. FAIL: beyond 100
    times the rounding tolerance, or beyond 0.5. WARN in between (and, when
    ``exact``, within rounding).
    """
    tolerance = _tolerance(dtype)
    if relative == 0 or (not exact and relative <= tolerance):
        return "PASS"
    if relative <= min(100 * tolerance, 0.5):
        return "WARN"
    return "FAIL"


def difference(a: Tensor, b: Tensor) -> float:
    """Return max ``|a - b|`` over max ``|b|`` (0: equal; inf: not comparable)."""
    if a.shape != b.shape:
        return math.inf
    if torch.equal(a, b):
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return math.inf
    wide = torch.promote_types(a.dtype, b.dtype)
    a, b = a.to(wide), b.to(wide)
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool((finite | (a == b)).all()):
        return math.inf  # a NaN or an infinity on one side only
    scale = float(b[finite].abs().max()) if bool(finite.any()) else 0.0
    diff = float((a - b)[finite].abs().max()) if bool(finite.any()) else 0.0
    return diff / scale if scale > 0 else (math.inf if diff > 0 else 0.0)


def pairs(batched: Any, alone: Any) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield the tensors of two records side by side."""
    yield from zip(iter_tensors(batched), iter_tensors(alone), strict=False)
