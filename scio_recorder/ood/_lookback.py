r"""Lookback Lens (Chuang et al., EMNLP 2024): attention on the context, per step.

:func:`lookback_ratios` gives each head's share of attention on the context
at each generated token; :class:`LookbackRatio` fits a logistic classifier
on them (label 1: hallucinated).
"""

from __future__ import annotations

__all__ = ["LookbackRatio", "lookback_ratios"]

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._run.batches import Positions

from ._checks import one_label
from ._protocol import run_pass
from ._saving import StateEntry
from ._states import (
    Internal,
    attention_weights,
    fit_logistic,
    keep_mask,
    probe_logits,
)
from ._tokens import token_arguments

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


def lookback_ratios(
    weights: Tensor, context: Tensor, real: Tensor | None = None
) -> Tensor:
    r"""Return each head's lookback ratio at each generated token, ``[B, T, H]``.

    At a new (non-context) token $t$ as a query, head $h$'s mean attention
    on the context tokens $A^{ctx}$ and on the new tokens up to and
    including $t$, $A^{new}$, give
    $\mathrm{LR}_t^h = A^{ctx} / (A^{ctx} + A^{new})$ (Lookback Lens, Eq.
    1): the step that fed token $t$ with the KV cache on. NaN at the
    context, the padding, and a row without context.

    Parameters
    ----------
    weights : Tensor
        ``[B, H, T, T]``, one layer's attention weights.
    context : Tensor
        ``[B, T]`` bool, True at the context (prompt) tokens.
    real : Tensor, optional
        ``[B, T]``, nonzero at the real tokens; default all.

    Examples
    --------
    >>> import torch
    >>> w = torch.tril(torch.ones(1, 1, 3, 3))
    >>> w = w / w.sum(-1, keepdim=True)
    >>> ctx = torch.tensor([[True, False, False]])
    >>> lookback_ratios(w, ctx)[0, :, 0].tolist()  # t=2: (1/3) / (1/3 + 1/3)
    [nan, 0.5, 0.5]

    """
    batch, _, width, _ = weights.shape
    keep = keep_mask(real, (batch, width), weights.device)
    ctx = context.to(weights.device).bool() & keep
    new = ~context.to(weights.device).bool() & keep
    w = weights.to(_F64)  # [B, H, Tq, Tk]
    causal = torch.ones(width, width, dtype=torch.bool, device=w.device).tril()
    on_ctx = (w * ctx[:, None, None, :]).sum(-1) / ctx.sum(-1).clamp(min=1)[
        :, None, None
    ]
    new_keys = new[:, None, :] & causal[None]  # [B, Tq, Tk]
    on_new = (w * new_keys[:, None]).sum(-1) / new_keys.sum(-1).clamp(min=1)[:, None]
    ratio = (on_ctx / (on_ctx + on_new)).transpose(1, 2)  # [B, T, H]
    steps = new & ctx.any(dim=1, keepdim=True)
    return ratio.masked_fill(~steps[..., None], math.nan)


class LookbackRatio(Internal):
    r"""Lookback Lens: each head's lookback ratio per generated token, and a classifier.

    ``layers`` are attention modules of a model with eager attention.
    :meth:`ratios` gives :func:`lookback_ratios` of every head of every
    layer, ``[B, T, L * H]``, NaN but at the new tokens; the batch holds,
    under ``context=``, the number of context (prompt) tokens of each row
    ``[B]`` (counted among its real tokens: a left-padded row counts from
    its first real token). :meth:`features` averages a row's steps (the
    paper's span features), and :meth:`fit` fits a logistic classifier
    (L2, float64) on them with labels under ``target`` (1: hallucinated);
    ``score`` is its logit.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(
    ...     n_layer=2, n_embd=8, n_head=2, vocab_size=20, attn_implementation="eager"
    ... )
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (4, 6))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> lr = LookbackRatio(rnet, ["transformer.h.0.attn", "transformer.h.1.attn"])
    >>> batch = {"input_ids": ids, "context": torch.tensor([3, 3, 4, 2])}
    >>> lr.ratios(batch).shape
    torch.Size([4, 6, 4])
    >>> _ = lr.fit([dict(batch, label=torch.tensor([0, 1, 0, 1]))], target="label")
    >>> lr(batch).shape
    torch.Size([4])

    """

    needs_fit = True

    def __init__(
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        context: str = "context",
        weight_decay: float = 1e-3,
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the attention modules, the context key and the ridge."""
        if isinstance(layers, str) or not layers:
            msg = f"LookbackRatio: layers must be a non-empty list, got {layers!r}"
            raise ValueError(msg)
        super().__init__(rnet, layers[0], mask=mask)
        self.labels = [one_label(rnet, layer, "LookbackRatio") for layer in layers]
        self.context, self.weight_decay = context, float(weight_decay)
        self.extra_keys = (context,)
        self.params: dict[str, Tensor] = {}

    def layers_read(self) -> list[tuple[DepthIdx, str]]:
        return [(label, "output") for label in self.labels]

    def _ratios(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        net, own = self.split(kwargs)
        if self.context not in own:
            msg = (
                f"LookbackRatio: the batch has no key {self.context!r}, the number "
                "of context (prompt) tokens of each row [B]"
            )
            raise KeyError(msg)
        result = run_pass(self.rnet, args, net, outputs=self.labels)
        out = []
        for label in self.labels:
            weights = attention_weights("LookbackRatio", result.outputs[label])
            batch, _, width, _ = weights.shape
            real = self.real(net, (batch, width))
            keep = torch.ones(batch, width, dtype=torch.bool) if real is None else real
            rank = keep.cumsum(dim=1)  # 1 at a row's first real token
            counts = torch.as_tensor(own[self.context]).reshape(-1, 1)
            ctx = keep & (rank <= counts)
            out.append(lookback_ratios(weights, ctx, keep))
        return torch.cat(out, dim=-1)

    def ratios(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the lookback ratios ``[B, T, L * H]`` (layer-major), NaN off steps."""
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return self._ratios(args, kwargs)

    def _features(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        return self._ratios(args, kwargs).nanmean(dim=1)

    def features(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return each row's lookback ratios averaged over its steps, ``[B, L * H]``."""
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return self._features(args, kwargs)

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = None,  # noqa: A002, ARG002 (the protocol's name; mappings only)
        target: Any = "label",
        **options: Any,  # noqa: ARG002 (the protocol's signature)
    ) -> Self:
        """Fit the logistic classifier on the features of labelled batches."""
        xs, ys = [], []
        for args, kwargs, labels in self.fit_batches(batches, target):
            xs.append(self._features(args, kwargs))
            ys.append(torch.as_tensor(labels).reshape(-1))
        self.params = fit_logistic(
            torch.cat(xs), torch.cat(ys), hidden=0, weight_decay=self.weight_decay,
            steps=200, seed=0,
        )  # fmt: skip
        self._fitted = True
        return self

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the classifier's logit of each row, ``[B]``."""
        return probe_logits(self.params, self._features(args, kwargs))

    def config(self) -> dict[str, Any]:
        return {
            "layers": [list(label) for label in self.labels],
            "context": self.context,
            "weight_decay": self.weight_decay,
        }

    def state(self) -> dict[str, Tensor]:
        return dict(self.params)

    def state_entries(self) -> dict[str, StateEntry]:
        return {"w": StateEntry((None,), _F64), "b": StateEntry((), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.params = dict(state)
