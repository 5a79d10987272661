"""The geometry of features: norms, Mahalanobis distances, class sums.

What detectors measure between a sample's features and the fit's:

* norms: :func:`l2_rows` (the features of Mahalanobis++ and RMDS++),
  :func:`normalized` (scio's normalisation of a neighbour bank, any order,
  :func:`check_act_norm`);
* Mahalanobis distances to class means under a shared precision, one class
  at a time (memory ``O(N F)``): :func:`class_mahalanobis` per class,
  :func:`min_mahalanobis` the closest; :func:`spread_classes` places the
  scores of the classes seen in the fit among all of the net's, and
  :func:`closest_class_sum` is the loss of Lee et al.'s input
  preprocessing;
* :class:`ClassSums`: the per-class sums and counts a fit streams
  (KLMatching's typical posteriors, SHE's class means).

Everything is computed in float64.
"""

from __future__ import annotations

__all__ = [
    "ClassSums",
    "check_act_norm",
    "class_mahalanobis",
    "closest_class_sum",
    "l2_rows",
    "min_mahalanobis",
    "normalized",
    "spread_classes",
]

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torch import Tensor

_F64 = torch.float64


def l2_rows(features: Tensor) -> Tensor:
    """Return each sample's features flattened and L2-normalised, float64.

    ``f / ||f||_2`` (a zero vector stays zero), the features of Mahalanobis++
    and RMDS++ (Müller & Hein, ICML 2025).

    Examples
    --------
    >>> import torch
    >>> l2_rows(torch.tensor([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6, 0.8], [0.0, 0.0]]

    """
    # Not detached: Lee et al.'s preprocessing (``epsilon``) differentiates it.
    flat = features.reshape(features.shape[0], -1).to(_F64)
    return torch.nn.functional.normalize(flat, dim=1)


def normalized(rows: Tensor, act_norm: float | None) -> Tensor:
    """Divide each row by its ``act_norm``-norm (rows of norm 0 kept); ``None``: as is.

    scio's ``normalize_samples`` for a positive order.

    Examples
    --------
    >>> import torch
    >>> normalized(torch.tensor([[3.0, 4.0], [0.0, 0.0]]), 2.0).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]

    """
    if act_norm is None:
        return rows
    norms = torch.linalg.vector_norm(rows, ord=act_norm, dim=1, keepdim=True)
    scaled: Tensor = rows / norms.where(norms != 0, 1)
    return scaled


def check_act_norm(who: str, act_norm: float | None) -> float | None:
    """Return ``act_norm`` as a float if it is ``None`` or a positive number."""
    if act_norm is None:
        return None
    if isinstance(act_norm, bool) or not isinstance(act_norm, int | float):
        msg = f"{who}: act_norm must be a positive number or None, got {act_norm!r}"
        raise TypeError(msg)
    if not act_norm > 0:
        msg = f"{who}: act_norm must be a positive number or None, got {act_norm!r}"
        raise ValueError(msg)
    return float(act_norm)


def min_mahalanobis(features: Tensor, means: Tensor, precision: Tensor) -> Tensor:
    """Return ``min_c (f - mu_c)^T P (f - mu_c)`` per sample, in float64.

    One class at a time (memory ``O(N F)``).

    Examples
    --------
    >>> import torch
    >>> means = torch.tensor([[0.0, 0.0], [4.0, 0.0]])
    >>> min_mahalanobis(torch.tensor([[0.0, 1.0], [3.0, 0.0]]), means, torch.eye(2))
    tensor([1., 1.], dtype=torch.float64)

    """
    flat = features.reshape(features.shape[0], -1).to(_F64)
    means = means.to(device=flat.device, dtype=_F64)
    precision = precision.to(device=flat.device, dtype=_F64)
    best = torch.full((flat.shape[0],), math.inf, dtype=_F64, device=flat.device)
    for mean in means:
        centred = flat - mean
        best = torch.minimum(best, ((centred @ precision) * centred).sum(dim=1))
    return best


def class_mahalanobis(features: Tensor, means: Tensor, precision: Tensor) -> Tensor:
    """Return ``(f - mu_c)^T P (f - mu_c)`` per sample and class, ``[N, C]``, float64.

    One class at a time, as :func:`min_mahalanobis` (whose minimum it has).

    Examples
    --------
    >>> import torch
    >>> means = torch.tensor([[0.0, 0.0], [4.0, 0.0]])
    >>> class_mahalanobis(torch.tensor([[0.0, 1.0]]), means, torch.eye(2))
    tensor([[ 1., 17.]], dtype=torch.float64)

    """
    flat = features.reshape(features.shape[0], -1).to(_F64)
    means = means.to(device=flat.device, dtype=_F64)
    precision = precision.to(device=flat.device, dtype=_F64)
    columns = []
    for mean in means:
        centred = flat - mean
        columns.append(((centred @ precision) * centred).sum(dim=1))
    if not columns:
        return flat.new_zeros(flat.shape[0], 0)
    return torch.stack(columns, dim=1)


def closest_class_sum(scores: Tensor) -> Tensor:
    """Return the sum over rows of each row's lowest score (NaN counts as ``inf``).

    The loss of Lee et al.'s preprocessing: its gradient with respect to the
    input moves each sample towards its closest class.

    Examples
    --------
    >>> import torch
    >>> closest_class_sum(torch.tensor([[1.0, 2.0], [float("nan"), 3.0]]))
    tensor(4.)

    """
    closest = scores.detach().nan_to_num(nan=math.inf).argmin(dim=1)
    return scores.gather(1, closest[:, None]).sum()


def spread_classes(scores: Tensor, classes: Tensor, width: int) -> Tensor:
    """Return ``scores`` as columns ``classes`` of ``[N, width]``, ``inf`` elsewhere.

    Examples
    --------
    >>> import torch
    >>> spread_classes(torch.tensor([[1.0, 2.0]]), torch.tensor([0, 2]), 3)
    tensor([[1., inf, 2.]])

    """
    out = scores.new_full((scores.shape[0], width), math.inf)
    out[:, classes.to(scores.device)] = scores
    return out


class ClassSums:
    """A reducer's shared part: per-class sums (``[C, F]``) and counts.

    Subclasses say, in ``update``, which rows go to which class; merging,
    the result ``(sums, counts)`` and the spilled state are the same.
    """

    def __init__(self) -> None:
        self.sums = torch.zeros(0, 0, dtype=_F64)
        self.counts = torch.zeros(0, dtype=torch.int64)

    @property
    def count(self) -> int:
        """Return the number of rows summed."""
        return int(self.counts.sum())

    def add(self, classes: int, rows: Tensor, by: Tensor) -> None:
        """Add ``rows`` (``[N, F]``) to the sums of classes ``by`` (``[N]``)."""
        if self.sums.numel() == 0:
            self.sums = rows.new_zeros(classes, rows.shape[1], dtype=_F64)
            self.counts = torch.zeros(classes, dtype=torch.int64, device=rows.device)
        self.sums = self.sums.to(rows.device).index_add(0, by, rows.to(_F64))
        self.counts = self.counts.to(rows.device).index_add(0, by, torch.ones_like(by))

    def merge(self, other: ClassSums) -> None:
        """Add another reducer's sums and counts."""
        if other.sums.numel() == 0:
            return
        if self.sums.numel() == 0:
            self.sums, self.counts = other.sums.clone(), other.counts.clone()
            return
        self.sums = self.sums + other.sums.to(self.sums.device)
        self.counts = self.counts + other.counts.to(self.counts.device)

    def result(self) -> tuple[Tensor, Tensor]:
        """Return ``(sums, counts)``."""
        return self.sums, self.counts

    def state(self) -> dict[str, Tensor]:
        """Return the sums and counts (to spill or checkpoint)."""
        return {"sums": self.sums, "counts": self.counts}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the sums and counts."""
        self.sums, self.counts = state["sums"], state["counts"]
