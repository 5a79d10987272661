"""What detectors read of the net's output: its logits and the scores of logits.

* :func:`output_label`: the label of the root call, whose output is the
  net's output (what a fit collects to read the logits);
* :func:`as_logits`: the ``[batch, classes]`` logits of that output
  (:func:`~scio_recorder._net.outputs.logits_of` finds them in a model output),
  refused when they are not a batch of logit vectors;
* the scores of the logits, each usable on its own or as the ``detector=``
  of an edit detector: :func:`msp_score`, :func:`max_logit_score`,
  :func:`energy_score`, :func:`entropy_score`, :func:`joint_energy_score`.
  Higher scores mean more likely out-of-distribution (the negative of the
  papers' confidence scores, as pytorch-ood does).
"""

from __future__ import annotations

__all__ = [
    "as_logits",
    "energy_score",
    "entropy_score",
    "joint_energy_score",
    "max_logit_score",
    "msp_score",
    "output_label",
]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._net.outputs import logits_of

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder


def output_label(rnet: Recorder) -> DepthIdx:
    """Return the label of the root call: its output is the net's output."""
    return next(label for label in rnet.table if label[0] == 0)


def as_logits(value: Any, who: str) -> Tensor:
    """Return the ``[batch, classes]`` logits of a net's output."""
    logits = logits_of(value)
    if logits.dim() != 2:  # noqa: PLR2004 (a batch of logit vectors)
        msg = (
            f"{who}: the net's logits must be [batch, classes], got "
            f"{list(logits.shape)}; this detector is for classifiers."
        )
        raise ValueError(msg)
    return logits


def msp_score(logits: Tensor) -> Tensor:
    """Return ``-max_c softmax(logits)_c`` (Hendrycks & Gimpel 2017).

    Examples
    --------
    >>> import torch
    >>> msp_score(torch.tensor([[0.0, 0.0], [10.0, 0.0]])).tolist()
    [-0.5, -0.9999545812606812]

    """
    return -torch.softmax(logits, dim=1).amax(dim=1)


def max_logit_score(logits: Tensor) -> Tensor:
    """Return ``-max_c logits_c`` (Hendrycks et al. 2022).

    Examples
    --------
    >>> import torch
    >>> max_logit_score(torch.tensor([[1.0, 3.0]])).tolist()
    [-3.0]

    """
    return -logits.amax(dim=1)


def energy_score(logits: Tensor, t: float = 1.0) -> Tensor:
    """Return the free energy ``-t logsumexp(logits / t)`` (Liu et al. 2020).

    Examples
    --------
    >>> import torch
    >>> round(energy_score(torch.tensor([[0.0, 0.0]])).item(), 4)
    -0.6931

    """
    return -t * torch.logsumexp(logits / t, dim=1)


def entropy_score(logits: Tensor) -> Tensor:
    """Return the entropy of ``softmax(logits)``, ``-sum_c p_c log p_c``.

    Examples
    --------
    >>> import torch
    >>> round(entropy_score(torch.tensor([[0.0, 0.0]])).item(), 4)
    0.6931

    """
    log_p = torch.log_softmax(logits, dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def joint_energy_score(logits: Tensor) -> Tensor:
    """Return minus the joint energy ``sum_c log(1 + exp(logits_c))`` (Wang et al.).

    Each logit is read as a binary (one class against the rest) energy, and
    the classes' free energies are summed; computed as ``logaddexp(z_c, 0)``,
    exact for logits of any size.

    Examples
    --------
    >>> import torch
    >>> joint_energy_score(torch.tensor([[0.0, 0.0], [100.0, -100.0]])).tolist()
    [-1.3862943649291992, -100.0]

    """
    return -torch.logaddexp(logits, torch.zeros((), dtype=logits.dtype)).sum(dim=1)
