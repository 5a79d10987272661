"""Detectors that read only the logits: MSP, MaxLogit, Energy, Entropy.

Each is a function of the logits (``msp_score``, ...), usable on its own or
as the ``detector=`` of an edit detector, and a :class:`Detector` that needs
no fitting. Higher scores mean more likely out-of-distribution (the
negative of the papers' confidence scores, as pytorch-ood does).
"""

from __future__ import annotations

__all__ = [
    "MSP",
    "Energy",
    "Entropy",
    "MaxLogit",
    "energy_score",
    "entropy_score",
    "max_logit_score",
    "msp_score",
]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._protocol import Detector

if TYPE_CHECKING:
    from scio_recorder.recorder import Recorder

    from ._protocol import Pass


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


class _FromLogits(Detector):
    def __init__(self, rnet: Recorder) -> None:
        super().__init__(rnet)

    def score_pass(self, result: Pass) -> Tensor:
        return self._score(result.logits)

    def _score(self, logits: Tensor) -> Tensor:
        raise NotImplementedError


class MSP(_FromLogits):
    """Maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).

    ``score(x) = -max_c softmax(f(x))_c`` from the net's logits; no fitting.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> MSP(rnet)(torch.randn(5, 3)).shape
    torch.Size([5])

    """

    def _score(self, logits: Tensor) -> Tensor:
        return msp_score(logits)


class MaxLogit(_FromLogits):
    """Maximum logit (Hendrycks et al., ICML 2022): ``-max_c f(x)_c``; no fitting.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> MaxLogit(rnet)(torch.randn(5, 3)).shape
    torch.Size([5])

    """

    def _score(self, logits: Tensor) -> Tensor:
        return max_logit_score(logits)


class Energy(_FromLogits):
    """Energy score (Liu et al., NeurIPS 2020): ``-t logsumexp(f(x) / t)``.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    t : float, default 1.0
        Temperature (pytorch-ood's ``t``).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> Energy(rnet, t=2.0)
    Energy(t=2.0)

    """

    def __init__(self, rnet: Recorder, t: float = 1.0) -> None:
        """Keep the temperature."""
        super().__init__(rnet)
        if t <= 0:
            msg = f"Energy: the temperature t must be > 0, got {t}"
            raise ValueError(msg)
        self.t = t

    def _score(self, logits: Tensor) -> Tensor:
        return energy_score(logits, self.t)

    def config(self) -> dict[str, Any]:
        """Return the temperature."""
        return {"t": self.t}


class Entropy(_FromLogits):
    """Entropy of the predicted distribution: ``-sum_c p_c log p_c``; no fitting.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> bool((Entropy(rnet)(torch.randn(5, 3)) >= 0).all())
    True

    """

    def _score(self, logits: Tensor) -> Tensor:
        return entropy_score(logits)
