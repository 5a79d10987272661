"""How far apart two records are, and the verdict that gives.

:func:`difference` is the largest absolute difference over the reference's
largest magnitude (0: equal; infinite: not comparable, as a NaN or an
infinity on one side only, or another shape). NaN at the same places on
both sides are equal: a net that computes NaN computes them on every pass,
and :func:`nonfinite` counts them for the line that names them;
:func:`verdict` says PASS, WARN or FAIL of a difference by the package's
tolerance rule (up to ``1024 eps`` of the dtype is rounding). Every check
measures with these, so that their numbers mean the same.
"""

from __future__ import annotations

__all__ = ["difference", "nonfinite", "pairs", "unmatched", "verdict"]

import math
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._support.tree import iter_tensors

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
    """Return max ``|a - b|`` over max ``|b|`` (0: equal; inf: not comparable).

    A NaN equals a NaN at the same place (a deterministic net computes the
    same NaN on every pass: ``log`` of a negative), and the magnitude is
    measured on the other values; a NaN on one side only, an infinity on
    one side only (or of the other sign), or another shape is a difference
    of ``inf``. A complex record's NaN are compared part by part.
    """
    if a.shape != b.shape:
        return math.inf
    if torch.equal(a, b):
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return math.inf
    wide = torch.promote_types(a.dtype, b.dtype)
    (a, nan_a), (b, nan_b) = _without_nan(a.to(wide)), _without_nan(b.to(wide))
    if not torch.equal(nan_a, nan_b):
        return math.inf  # a NaN on one side only
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool((finite | (a == b)).all()):
        return math.inf  # an infinity on one side only
    scale = float(b[finite].abs().max()) if bool(finite.any()) else 0.0
    diff = float((a - b)[finite].abs().max()) if bool(finite.any()) else 0.0
    return diff / scale if scale > 0 else (math.inf if diff > 0 else 0.0)


def _without_nan(value: Tensor) -> tuple[Tensor, Tensor]:
    """Return ``value`` with its NaN (each part's, if complex) set to 0, and where."""
    parts = torch.view_as_real(value) if value.is_complex() else value
    nan = parts.isnan()
    parts = parts.masked_fill(nan, 0)
    return (torch.view_as_complex(parts) if value.is_complex() else parts), nan


def nonfinite(value: Tensor) -> tuple[int, int]:
    """Return how many values of ``value`` are NaN, and how many are infinite."""
    if not (value.is_floating_point() or value.is_complex()):
        return 0, 0
    return int(value.isnan().sum()), int(value.isinf().sum())


def unmatched(a: Tensor, b: Tensor) -> set[str]:
    """Return what ``a`` holds where ``b`` holds another value: ``"NaN"``, ``"inf"``.

    (For two records of the same shape whose :func:`difference` is
    infinite: which side's NaN or infinities make it so.)
    """
    if not (a.is_floating_point() or a.is_complex()):
        return set()
    other = ~(a == b) & ~(a.isnan() & b.isnan())
    found = set()
    if bool((a.isnan() & other).any()):
        found.add("NaN")
    if bool((a.isinf() & other).any()):
        found.add("inf")
    return found


def pairs(batched: Any, alone: Any) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield the tensors of two records side by side."""
    yield from zip(iter_tensors(batched), iter_tensors(alone), strict=False)
