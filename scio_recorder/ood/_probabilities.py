"""Detectors that read the predicted distribution ``softmax(logits)``: GEN, KLMatching.

``GEN`` needs no fitting. ``KLMatching`` fits one typical posterior per
predicted class, streaming: a reducer sums the softmax vectors of the fit
data by predicted class (``C x C`` float64 whatever the data size). Both
read the net's output (its logits, :func:`~._outputs.as_logits`), at fit
time the output of the root call of the recorder's table
(:func:`~._outputs.output_label`).
"""

from __future__ import annotations

__all__ = ["GEN", "KLMatching", "gen_score", "kl_to_each"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._classes import ClassConditional, check_at
from ._geometry import ClassSums
from ._outputs import as_logits, output_label
from ._protocol import Detector
from ._saving import StateEntry
from ._tokens import TokenScoring, logit_tokens

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

    from ._protocol import Pass

_F64 = torch.float64


def gen_score(logits: Tensor, gamma: float = 0.1, m: int | None = None) -> Tensor:
    """Return GEN's generalised entropy of ``softmax(logits)`` (Liu et al. 2023).

    ``mean_{j in top-m} p_j^gamma (1 - p_j)^gamma``, the probabilities clamped
    to ``[1e-7, 1 - 1e-7]`` (as pytorch-ood does); ``m=None``: every class.

    Examples
    --------
    >>> import torch
    >>> gen_score(torch.tensor([[0.0, 0.0]]), gamma=1.0).tolist()  # 0.5 * 0.5
    [0.25]

    """
    p = torch.softmax(logits, dim=1).clamp(1e-7, 1 - 1e-7)
    if m is not None:
        p = torch.topk(p, min(m, p.shape[1]), dim=1).values
    return (p.pow(gamma) * (1 - p).pow(gamma)).mean(dim=1)


class GEN(TokenScoring):
    r"""GEN, generalised entropy (Liu et al., CVPR 2023); no fitting.

    $\mathrm{score}(x) = \frac{1}{M} \sum_{j \in \mathrm{top}_M} p_j^\gamma (1 -
    p_j)^\gamma$ with $p = \mathrm{softmax}(f(x))$ clamped to $[10^{-7}, 1 -
    10^{-7}]$ ($\gamma$ = ``gamma``): small for a peaked
    posterior (in-distribution), large for a flat one.

    Where our reading decided, with pytorch-ood 0.4: the terms are averaged
    over the ``M`` largest probabilities, not summed as in the paper (a
    constant factor, the same ranking); ``M=None`` (every class) is the
    default, the paper uses ``M = 100`` on ImageNet (for 100 classes or
    fewer the two are the same).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    gamma : float, default 0.1
        The exponent, > 0 (the paper's recommendation).
    M : int, optional
        How many of the largest probabilities to average; default all.
    token, mask, reduce
        ``token="each"``: score each position's next-token distribution of a
        language model (:mod:`~scio_recorder.ood._tokens`).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> GEN(rnet, M=2)(torch.randn(5, 3)).shape
    torch.Size([5])

    """

    def __init__(  # noqa: PLR0913 (GEN's two, then the per-token reading)
        self,
        rnet: Recorder,
        gamma: float = 0.1,
        M: int | None = None,  # noqa: N803 (pytorch-ood's name)
        *,
        token: str | None = None,
        mask: int | str | None = None,
        reduce: str | int = "mean",
    ) -> None:
        """Check ``gamma`` and ``M``."""
        super().__init__(rnet)
        self.init_tokens(token, mask, reduce)
        if not gamma > 0:
            msg = f"GEN: gamma must be > 0, got {gamma}"
            raise ValueError(msg)
        if M is not None and (isinstance(M, bool) or not isinstance(M, int) or M < 1):
            msg = f"GEN: M must be an int >= 1 or None (every class), got {M!r}"
            raise ValueError(msg)
        self.gamma = gamma
        self.M = M

    def score_pass(self, result: Pass) -> Tensor:
        """Return the generalised entropy of the predicted distribution."""
        if self.token_each:
            return super().score_pass(result)
        return gen_score(result.logits, self.gamma, self.M)

    def token_scores(self, result: Pass) -> Tensor:
        """Return each position's generalised entropy, ``[B, T]`` (``token="each"``)."""
        return logit_tokens(
            result.logits, lambda logits: gen_score(logits, self.gamma, self.M)
        )

    def config(self) -> dict[str, Any]:
        """Return ``gamma`` and ``M``."""
        return {"gamma": self.gamma, "M": self.M, **self.token_config()}


class _PredictedMeans(ClassSums):
    """A reducer: the sum of ``softmax(logits)`` and the count, by predicted class."""

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol; KL-matching uses no labels)
        p = torch.softmax(as_logits(value, "KLMatching").detach().to(_F64), dim=1)
        self.add(p.shape[1], p, p.argmax(dim=1))

    def fresh(self) -> _PredictedMeans:
        return _PredictedMeans()


def kl_to_each(p: Tensor, typical: Tensor) -> Tensor:
    """Return ``KL(p || d_k)`` per row of ``p`` and row of ``typical``, in float64.

    As :func:`kl_to_closest`, before the minimum: ``[N, K]``.

    Examples
    --------
    >>> import torch
    >>> typical = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    >>> kl_to_each(torch.tensor([[1.0, 0.0]], dtype=torch.float64), typical)
    tensor([[0.6931, 0.0000]], dtype=torch.float64)

    """
    p = p.to(_F64)
    typical = typical.to(p)
    log_d = typical.log().nan_to_num(neginf=torch.finfo(_F64).min)
    p_log_p = torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(dim=1)
    kl: Tensor = p_log_p[:, None] - p @ log_d.T
    return kl


def kl_to_closest(p: Tensor, typical: Tensor) -> Tensor:
    """Return ``min_k KL(p || d_k)`` per row of ``p``, in float64.

    ``0 log 0 = 0``; where ``d_k`` is 0 and ``p`` is not, ``log d_k`` is the
    lowest finite float64 (pytorch-ood's convention), so the divergence is
    huge but finite.

    Examples
    --------
    >>> import torch
    >>> typical = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    >>> kl_to_closest(torch.tensor([[1.0, 0.0]], dtype=torch.float64), typical)
    tensor([0.], dtype=torch.float64)

    """
    return kl_to_each(p, typical).amin(dim=1)


class KLMatching(ClassConditional, Detector):
    r"""KL matching (Hendrycks et al., ICML 2022): KL to the closest typical posterior.

    ``fit`` takes, for each class $k$ the net predicts on the fit data, the
    typical posterior $d_k$: the mean of $\mathrm{softmax}(f(x))$ over the fit
    samples predicted as $k$ (no labels needed), streaming.
    $\mathrm{score}(x) = \min_k \mathrm{KL}(\mathrm{softmax}(f(x)) \,\|\, d_k)$ over
    those classes.

    Where our reading decided, with pytorch-ood 0.4: the minimum runs over
    the classes predicted at least once on the fit data (the paper does not
    say what to do with the others); labels are not used (pytorch-ood uses
    them only to drop OoD samples: give in-distribution data only); $\log
    d_k = -\infty$ is replaced by the lowest finite float, so the score stays
    finite. Sums and the divergence are in float64.

    Class-conditional: ``score_classes(x)`` is $\mathrm{KL}(\mathrm{softmax}(f(x))
    \,\|\, d_k)$
    for every class (``inf`` for a class never predicted on the fit data);
    ``at="predicted"`` reads it at the class predicted for ``x``.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier: its logits are ``[batch, classes]``).
    at : {"closest", "predicted"}
        Which class's divergence is the score.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> klm = KLMatching(rnet).fit([torch.randn(64, 3)], input=None)
    >>> klm(torch.randn(5, 3)).shape, klm.typical.shape[1]
    (torch.Size([5]), 4)

    """

    needs_fit: ClassVar[bool] = True

    def __init__(self, rnet: Recorder, *, at: str = "closest") -> None:
        """Find the net's output."""
        self.at = check_at("KLMatching", at)
        super().__init__(rnet)
        self.label = output_label(rnet)
        self.classes = torch.zeros(0, dtype=torch.int64)
        self.typical = torch.zeros(0, 0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Return the softmax sums of the net's output to keep, by predicted class."""
        return {self.label: _PredictedMeans()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the mean posterior of every predicted class."""
        sums, counts = result[self.label]
        seen = torch.nonzero(counts > 0).reshape(-1)
        self.classes = seen.cpu()
        self.typical = (sums[seen] / counts[seen, None].to(_F64)).cpu()

    def posterior(self, result: Pass) -> Tensor:
        """Return ``softmax`` of the pass's logits, float64."""
        logits = as_logits(result.logits, "KLMatching")
        return torch.softmax(logits.to(_F64), dim=1)

    def closest_scores(self, result: Pass) -> Tensor:
        """Return the KL divergence to the closest typical posterior."""
        return kl_to_closest(self.posterior(result), self.typical)

    def class_scores(self, result: Pass) -> Tensor:
        """Return the KL divergence to each typical posterior (``inf``: none)."""
        p = self.posterior(result)
        kl = kl_to_each(p, self.typical)
        out = kl.new_full((kl.shape[0], p.shape[1]), math.inf)
        out[:, self.classes.to(kl.device)] = kl
        return out

    def state(self) -> dict[str, Tensor]:
        """Return the predicted classes and their typical posteriors."""
        return {"classes": self.classes, "typical": self.typical}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: predicted classes, their typical posteriors."""
        return {
            "classes": StateEntry(("classes",), torch.int64),
            "typical": StateEntry(("classes", "logits"), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the classes and typical posteriors."""
        self.classes, self.typical = state["classes"], state["typical"]
