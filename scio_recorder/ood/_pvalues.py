"""Layer aggregation: per-layer p-values, combined as scio combines them.

A multi-layer detector scores each layer; to put layers of other scales on
one footing, each layer's score is turned into a **p-value** against the
same score of the fit samples (:func:`p_values`: the fraction of fit
samples that score at least as OoD), and the layers' p-values are combined
by a named rule (:func:`combine`), scio 1.1's ``get_aggregator``:

==============  =====================================================
``"sum"``       ``sum_l p_l``
``"mean"``      ``mean_l p_l``
``"min"``       ``min_l p_l``
``"max"``       ``max_l p_l``
``"fisher"``    ``sum_l log p_l`` (scio's: Fisher's statistic is ``-2`` times it)
``"harmonic"``  ``1 / mean_l (1 / p_l)``
``"geometric"`` ``exp(mean_l log p_l)``
==============  =====================================================

The result is a conformity (higher = in-distribution); detectors score its
negation. A p-value of 0 makes ``fisher`` and ``geometric`` ``-inf`` and
``harmonic`` 0, as in scio.
"""

from __future__ import annotations

__all__ = ["AGGREGATIONS", "check_aggregation", "combine", "p_values"]

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import Tensor

AGGREGATIONS = ("sum", "mean", "min", "max", "fisher", "harmonic", "geometric")
"""The names :func:`combine` knows."""


def check_aggregation(who: str, aggregation: str | None, *, none: bool) -> None:
    """Refuse an unknown aggregation name (``None`` too unless ``none``).

    Examples
    --------
    >>> check_aggregation("DkNN", "fisher", none=True)

    """
    if aggregation is None and none:
        return
    if aggregation not in AGGREGATIONS:
        names = [*AGGREGATIONS, None] if none else list(AGGREGATIONS)
        msg = f"{who}: aggregation must be one of {names}, got {aggregation!r}"
        raise ValueError(msg)


def combine(p: Tensor, aggregation: str, dim: int = -1) -> Tensor:  # noqa: PLR0911 (one rule a name)
    """Combine p-values along ``dim`` by the rule named ``aggregation``.

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    >>> [round(float(combine(p, a)[0]), 4) for a in ("sum", "fisher", "harmonic")]
    [0.75, -2.0794, 0.3333]

    """
    if aggregation == "sum":
        return p.sum(dim=dim)
    if aggregation == "mean":
        return p.mean(dim=dim)
    if aggregation == "min":
        return p.amin(dim=dim)
    if aggregation == "max":
        return p.amax(dim=dim)
    if aggregation == "fisher":
        return p.log().sum(dim=dim)
    if aggregation == "harmonic":
        return 1 / (1 / p).mean(dim=dim)
    if aggregation == "geometric":
        return p.log().mean(dim=dim).exp()
    check_aggregation("combine", aggregation, none=False)
    raise AssertionError  # pragma: no cover (check_aggregation raised)


def p_values(reference: Tensor, scores: Tensor, *, ties: bool = True) -> Tensor:
    """Return the fraction of ``reference`` scores at least as high as each score.

    ``reference`` is ``[..., N]``, sorted in increasing order along its last
    dimension (the fit samples' scores, higher = more OoD); ``scores`` is
    ``[..., B]`` with the same leading dimensions, or of any shape for a
    one-dimensional ``reference``. Returns the shape of ``scores``,
    float64: ``#{i: reference_i >= s} / N``, or ``#{i: reference_i > s} /
    N`` with ``ties=False`` (DkNN's: a fit sample with the same score does
    not count).

    Examples
    --------
    >>> import torch
    >>> reference = torch.tensor([1.0, 2.0, 2.0, 3.0])
    >>> p_values(reference, torch.tensor([2.0, 0.0, 4.0])).tolist()
    [0.75, 1.0, 0.0]
    >>> p_values(reference, torch.tensor([2.0]), ties=False).tolist()
    [0.25]

    """
    n = reference.shape[-1]
    below = torch.searchsorted(
        reference.contiguous(), scores.contiguous(), right=not ties
    )
    return (n - below).to(torch.float64) / n
