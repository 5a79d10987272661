r"""The language model's own uncertainty per token: :class:`Surprisal`.

A token out of place (a random span injected into fluent text) is what the
model itself finds unlikely: its surprisal $-\log p(x_t \mid x_{<t})$ peaks
there, where a distance on hidden states may not move. The converse, a
fluent shift (text of another kind that the model predicts well), is
invisible to surprisal and plain to a distance on hidden states
(:class:`~scio_recorder.ood.Mahalanobis` with ``token="each"``): the docs
page "Language models: a score per token" shows both.
"""

from __future__ import annotations

__all__ = ["Surprisal"]

import math
from typing import TYPE_CHECKING, Any

import torch

from ._tokens import TokenScoring

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torch import Tensor

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

    from ._protocol import Pass


class Surprisal(TokenScoring):
    r"""The model's surprisal at each token, $-\log p(x_t \mid x_{<t})$; no fitting.

    ``score_tokens(batch)`` gives ``[B, T]``: at position ``t`` the negative
    log-probability, under the net's logits at ``t - 1``, of the token the
    batch holds at ``t`` (natural log, float64). It is NaN at the padding
    and at each row's first real token (nothing predicts it). ``det(batch)``
    reduces a row by ``reduce=`` (``"mean"``: the log-perplexity). In a
    generation monitor, a step scores the token it chose
    (:attr:`~._tokens.TokenScoring.step_position`).

    Parameters
    ----------
    rnet : Recorder
        A causal language model whose output holds ``[B, T, V]`` logits.
    mask : str or int, optional, default "attention_mask"
        The net's argument holding the padding mask (absent: every token is
        real).
    ids : str or int, default "input_ids"
        The net's argument holding the token ids (a keyword; the first
        positional argument when the keyword is absent).
    reduce : {"mean", "max", "last"} or int, default "mean"
        How ``score`` reduces a row
        (:func:`~scio_recorder.ood._tokens.reduce_tokens`).

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20)
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (2, 5))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    >>> s = Surprisal(rnet).score_tokens(input_ids=ids, attention_mask=mask)
    >>> s.isnan().tolist()
    [[True, True, False, False, False], [True, False, False, False, False]]

    """

    step_position = "chosen"

    def __init__(
        self,
        rnet: Recorder,
        *,
        mask: int | str | None = "attention_mask",
        ids: int | str = "input_ids",
        reduce: str | int = "mean",
    ) -> None:
        """Keep where the ids and the mask are."""
        super().__init__(rnet)
        self.ids = ids
        self.init_tokens("each", mask, reduce, ids=ids)

    def token_mask(self, result: Pass, shape: torch.Size) -> Tensor:
        """Return the real tokens; a call without the mask counts every token real."""
        mask = self.kept("mask", result) if self.mask_arg is not None else None
        if mask is None:
            return torch.ones(shape, dtype=torch.bool)
        return mask.reshape(shape) != 0

    def token_scores(self, result: Pass) -> Tensor:
        r"""Return $-\log p(x_t \mid x_{<t})$, NaN where no real token precedes."""
        ids = self.kept("ids", result)
        logits = result.logits
        if ids is None or logits.dim() != 3:  # noqa: PLR2004 (a language model's [B, T, V])
            msg = (
                f"Surprisal reads the token ids (argument {self.ids!r}) and the "
                f"logits [B, T, V] of a causal language model; got ids "
                f"{None if ids is None else list(ids.shape)} and logits "
                f"{list(logits.shape)}."
            )
            raise ValueError(msg)
        # -log softmax(z)[x] of the positions that predict a token only
        ids = ids.to(logits.device).reshape(logits.shape[:2])
        out = torch.full(
            logits.shape[:2], math.nan, dtype=torch.float64, device=logits.device
        )
        out[:, 1:] = _surprisal(logits[:, :-1], ids[:, 1:])
        real = self.token_mask(result, logits.shape[:2]).to(logits.device)
        preceded = torch.zeros_like(real)
        preceded[:, 1:] = real[:, :-1]
        return out.masked_fill(~preceded, math.nan)

    def score_step(
        self,
        logits: Tensor,
        outputs: Mapping[DepthIdx, Tensor],  # noqa: ARG002 (the monitor's protocol)
        inputs: Mapping[DepthIdx, Tensor],  # noqa: ARG002 (the monitor's protocol)
        tokens: Tensor,
    ) -> Tensor:
        r"""Return the surprisal of the token each row chose at this step, ``[B]``.

        $-\log p(x \mid \cdot)$ of ``tokens[:, -1]`` under the step's
        logits ``[B, 1, V]``, without a pass built for the step. The
        exponentials are summed in float32 (pairwise, ~1e-7 from the float64
        log-sum-exp: below the float32 rounding of the logits themselves, at
        half the cost of :meth:`token_scores`' float64 sum; a monitor's each
        step).
        """
        chosen = tokens[:, -1].to(logits.device)
        return _surprisal(logits[:, -1], chosen, exact=False)

    def config(self) -> dict[str, Any]:
        """Return where the ids and the mask are, and the reduction."""
        return {"ids": self.ids, "mask": self.mask_arg, "reduce": self.reduce}


def _surprisal(logits: Tensor, ids: Tensor, *, exact: bool = True) -> Tensor:
    """Return ``-log softmax(logits)[ids]`` over the last dimension, float64.

    ``logsumexp(z) - z[x]``, with ``logsumexp(z) = m + log sum exp(z - m)``
    (``m`` the max): the exponentials of float32 ``z - m`` (at most 0, exact
    to an eps of themselves where they matter) summed in float64, about
    1e-9 from the float64 logsumexp at half its cost; ``exact=False`` sums
    them in float32 (torch's pairwise sum: ~1e-7, half the cost again).
    """
    z = logits.detach()
    if z.dtype not in {torch.float32, torch.float64}:
        z = z.float()
    top = z.amax(dim=-1, keepdim=True)
    spread = torch.exp(z - top)
    total = (
        spread.sum(dim=-1, dtype=torch.float64)
        if exact
        else spread.sum(dim=-1).to(torch.float64)
    )
    picked = z.gather(-1, ids[..., None])[..., 0].to(torch.float64)
    return top[..., 0].to(torch.float64) + total.log() - picked
