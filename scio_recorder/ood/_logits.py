"""Detectors that read only the logits: MSP, MaxLogit, Energy, Entropy, JointEnergy.

Each is a :class:`Detector` that needs no fitting around a function of the
logits (``msp_score``, ... in :mod:`._outputs`, usable on their own or as
the ``detector=`` of an edit detector). Higher scores mean more likely
out-of-distribution (the negative of the papers' confidence scores, as
pytorch-ood does).

With ``token="each"`` (and ``mask=``, ``reduce=``, as
:mod:`~scio_recorder.ood._tokens` says), each scores every position of a
language model's ``[B, T, V]`` logits: position ``t``'s next-token
distribution, ``score_tokens`` ``[B, T]``.
"""

from __future__ import annotations

__all__ = [
    "MSP",
    "Energy",
    "Entropy",
    "JointEnergy",
    "MaxLogit",
]

from typing import TYPE_CHECKING, Any

from ._outputs import (
    energy_score,
    entropy_score,
    joint_energy_score,
    max_logit_score,
    msp_score,
)
from ._tokens import TokenScoring, logit_tokens

if TYPE_CHECKING:
    from torch import Tensor

    from scio_recorder.recorder import Recorder

    from ._protocol import Pass


class _FromLogits(TokenScoring):
    def __init__(
        self,
        rnet: Recorder,
        *,
        token: str | None = None,
        mask: int | str | None = None,
        reduce: str | int = "mean",
    ) -> None:
        super().__init__(rnet)
        self.init_tokens(token, mask, reduce)

    def score_pass(self, result: Pass) -> Tensor:
        if self.token_each:
            return super().score_pass(result)
        return self._score(result.logits)

    def token_scores(self, result: Pass) -> Tensor:
        """Score each position's next-token distribution, ``[B, T]``."""
        return logit_tokens(result.logits, self._score)

    def config(self) -> dict[str, Any]:
        return self.token_config()

    def _score(self, logits: Tensor) -> Tensor:
        raise NotImplementedError


class MSP(_FromLogits):
    r"""Maximum softmax probability (Hendrycks & Gimpel, ICLR 2017).

    $\mathrm{score}(x) = -\max_c \mathrm{softmax}(f(x))_c$ from the net's logits; no
    fitting.

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
    r"""Maximum logit (Hendrycks et al., ICML 2022): $-\max_c f(x)_c$; no fitting.

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
    r"""Energy score (Liu et al., NeurIPS 2020): $-t \log \sum_c e^{f(x)_c / t}$.

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

    def __init__(
        self,
        rnet: Recorder,
        t: float = 1.0,
        *,
        token: str | None = None,
        mask: int | str | None = None,
        reduce: str | int = "mean",
    ) -> None:
        """Keep the temperature."""
        super().__init__(rnet, token=token, mask=mask, reduce=reduce)
        if t <= 0:
            msg = f"Energy: the temperature t must be > 0, got {t}"
            raise ValueError(msg)
        self.t = t

    def _score(self, logits: Tensor) -> Tensor:
        return energy_score(logits, self.t)

    def config(self) -> dict[str, Any]:
        """Return the temperature."""
        return {"t": self.t, **self.token_config()}


class Entropy(_FromLogits):
    r"""Entropy of the predicted distribution: $-\sum_c p_c \log p_c$; no fitting.

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


class JointEnergy(_FromLogits):
    r"""Joint energy (Wang et al., NeurIPS 2021): $-\sum_c \log(1 + e^{f(x)_c})$.

    The paper's score for multi-label nets (*Can multi-label classification
    networks know what they don't know?*): each logit is read as the energy
    of its own "class against the rest" decision and the classes' free
    energies $\log(1 + e^{f_c})$ are summed; higher means more
    in-distribution, and the score is minus it. No fitting. scio 1.1's
    ``JointEnergy`` conformity is the sum itself: ``score = -conformity``
    (the same number in every class, so every reading of scio's agrees).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> bool((JointEnergy(rnet)(torch.randn(5, 3)) < 0).all())
    True

    """

    def _score(self, logits: Tensor) -> Tensor:
        return joint_energy_score(logits)
