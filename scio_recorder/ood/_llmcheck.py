r"""LLM-Check (Sriramanan et al., NeurIPS 2024): hidden states and attention.

:class:`HiddenScore` (the hidden-state matrix's log-determinant,
:func:`hidden_score`) and :class:`AttentionScore` (the attention kernel's
log diagonal, :func:`attention_score`), under the paper's normalisation or
lm-polygraph's (:data:`NORMALISATIONS`), as the paper writes them: their
direction is the data's to tell (rate it with ``evaluate``).
"""

from __future__ import annotations

__all__ = [
    "NORMALISATIONS",
    "AttentionScore",
    "HiddenScore",
    "attention_score",
    "hidden_score",
]

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._states import (
    Internal,
    attention_weights,
    keep_mask,
    mean_log_eig,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


NORMALISATIONS = ("paper", "polygraph")
"""The normalisations of :func:`attention_score`."""


def hidden_score(
    hidden: Tensor, mask: Tensor | None = None, alpha: float = 1e-3
) -> Tensor:
    r"""Return LLM-Check's hidden score of each row's hidden states, ``[B]``.

    For a row's real tokens $H \in \mathbb{R}^{m \times d}$ at one layer,
    $\Sigma = H J_d H^\top + \alpha I_m$ (the reference code's
    ``centered_svd_val``: the features centred, then the ``m x m`` Gram
    matrix) and the score is the mean log singular value (here: eigenvalue,
    $\Sigma$ is symmetric positive definite) of $\Sigma$,
    $\frac1m \log\det\Sigma$: the paper's normalisation, the log-determinant
    divided by the number of tokens (it equals $\frac2m \sum_i \log
    \sigma_i(J_d H^\top)$ but for $\alpha$). The same formula as
    :func:`eigen_score`, over one answer's tokens instead of ``K`` answers.

    Parameters
    ----------
    hidden : Tensor
        ``[B, T, d]``.
    mask : Tensor, optional
        ``[B, T]``, nonzero at the tokens to take (the answer's real
        tokens); default every token.
    alpha : float, default 1e-3
        The ridge.

    Examples
    --------
    >>> import torch
    >>> h = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    >>> hidden_score(h).shape
    torch.Size([2])

    """
    if hidden.dim() != 3:  # noqa: PLR2004 ([B, T, d])
        msg = f"hidden_score takes [B, T, d] hidden states, got {list(hidden.shape)}"
        raise ValueError(msg)
    keep = keep_mask(mask, hidden.shape[:2], hidden.device)
    out = torch.full(hidden.shape[:1], math.nan, dtype=_F64, device=hidden.device)
    for row in range(hidden.shape[0]):
        if bool(keep[row].any()):
            out[row] = mean_log_eig(hidden[row][keep[row]], alpha)
    return out


def attention_score(
    weights: Tensor, mask: Tensor | None = None, *, normalisation: str = "paper"
) -> Tensor:
    r"""Return LLM-Check's attention score of each row's attention kernels, ``[B]``.

    A head's causal attention kernel $A^h$ (over a row's ``m`` real tokens)
    is lower triangular: $\log\det A^h = \sum_t \log A^h_{tt}$. Two
    normalisations, which rank rows differently (rows of different lengths):

    * ``"paper"``: $\sum_h \frac1m \log\det A^h$, the mean log diagonal of
      each head summed over the ``H`` heads (LLM-Check's
      ``get_attn_eig_prod``);
    * ``"polygraph"``: $-\frac1H \sum_h \log\det A^h$, the whole log
      diagonal of each head averaged over the heads and negated
      (lm-polygraph 0.7.0's ``AttentionScore``, ``gen_only=False``, without
      its ``1e-12`` inside the log).

    Parameters
    ----------
    weights : Tensor
        ``[B, H, T, T]`` (one layer's attention weights).
    mask : Tensor, optional
        ``[B, T]``, nonzero at the tokens to take; default every token.
    normalisation : {"paper", "polygraph"}, default "paper"

    Examples
    --------
    >>> import torch
    >>> a = torch.tril(torch.ones(1, 2, 3, 3))
    >>> a = a / a.sum(-1, keepdim=True)  # each head: diagonal 1, 1/2, 1/3
    >>> round(float(attention_score(a)), 6)  # 2 * (log 1 + log 1/2 + log 1/3) / 3
    -1.194506
    >>> round(float(attention_score(a, normalisation="polygraph")), 6)  # log 6
    1.791759

    """
    if weights.dim() != 4:  # noqa: PLR2004 ([B, H, T, T])
        msg = f"attention_score takes [B, H, T, T] weights, got {list(weights.shape)}"
        raise ValueError(msg)
    if normalisation not in NORMALISATIONS:
        msg = (
            f"attention_score: normalisation must be one of {list(NORMALISATIONS)}, "
            f"got {normalisation!r}"
        )
        raise ValueError(msg)
    keep = keep_mask(mask, (weights.shape[0], weights.shape[2]), weights.device)
    diag = weights.to(_F64).diagonal(dim1=-2, dim2=-1).log()  # [B, H, T]
    count = keep.sum(dim=1)
    logdet = diag.masked_fill(~keep[:, None], 0).sum(dim=-1)  # [B, H]
    if normalisation == "paper":
        out = (logdet / count.clamp(min=1)[:, None]).sum(dim=1)
    else:
        out = -logdet.mean(dim=1)
    return torch.where(count > 0, out, math.nan)


class HiddenScore(Internal):
    r"""LLM-Check's hidden score: :func:`hidden_score` of each row's real tokens.

    Reads ``layer``'s output ``[B, T, d]`` (its first output for a block
    returning a tuple); ``span="all"`` takes every real token, an int ``s``
    the real tokens from the row's ``s``-th on (the answer after a prompt of
    ``s`` tokens, as the reference code's ``tok_lens``). No fitting. The
    normalisation is the paper's (:func:`hidden_score`); higher: more
    likely hallucinated.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=20)
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (3, 5))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> HiddenScore(rnet, "transformer.h.1")(input_ids=ids).shape
    torch.Size([3])

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        alpha: float = 1e-3,
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the layer and the ridge."""
        super().__init__(rnet, layer, mask=mask)
        self.alpha = float(alpha)

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return :func:`hidden_score` of each row, ``[B]``."""
        value = self.read(args, kwargs)
        value = value[0] if isinstance(value, tuple | list) else value
        return hidden_score(value, self.real(kwargs, value.shape[:2]), self.alpha)

    def config(self) -> dict[str, Any]:
        return {"layer": list(self.label), "alpha": self.alpha}


class AttentionScore(Internal):
    r"""LLM-Check's attention score: :func:`attention_score` of one attention module.

    ``layer`` names an attention module of a model with eager attention
    (``attn_implementation="eager"``), whose second output is its weights.
    ``normalisation="paper"`` is the paper's, ``"polygraph"``
    lm-polygraph 0.7.0's (:func:`attention_score`). No fitting.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(
    ...     n_layer=1, n_embd=8, n_head=2, vocab_size=20, attn_implementation="eager"
    ... )
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (3, 5))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> AttentionScore(rnet, "transformer.h.0.attn")(input_ids=ids).shape
    torch.Size([3])

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        normalisation: str = "paper",
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the attention module and the normalisation."""
        super().__init__(rnet, layer, mask=mask)
        if normalisation not in NORMALISATIONS:
            msg = (
                f"AttentionScore: normalisation must be one of "
                f"{list(NORMALISATIONS)}, got {normalisation!r}"
            )
            raise ValueError(msg)
        self.normalisation = normalisation

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return :func:`attention_score` of each row, ``[B]``."""
        weights = attention_weights("AttentionScore", self.read(args, kwargs))
        real = self.real(kwargs, (weights.shape[0], weights.shape[2]))
        return attention_score(weights, real, normalisation=self.normalisation)

    def config(self) -> dict[str, Any]:
        return {"layer": list(self.label), "normalisation": self.normalisation}
