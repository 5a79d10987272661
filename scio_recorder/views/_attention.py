"""Attention per head: the weights recorded, or recomputed from recorded q and k."""

from __future__ import annotations

__all__ = ["attention_from_qk", "attention_view"]

import base64
import math
from typing import TYPE_CHECKING, Any

import torch

from ._base import (
    View,
    matplotlib_module,
    names,
    new_figure,
    one_sample,
    short,
    tick_labels,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure
    from torch import Tensor

_HEADS_DIMS = 4  # [batch, heads, tokens, head size]
_FLAT_DIMS = 3  # [batch, tokens, heads * head size]


def _split(x: Tensor, heads: int, what: str) -> Tensor:
    """``[B, T, H * D]`` -> ``[B, H, T, D]``; ``[B, H, T, D]`` as it is."""
    if x.dim() == _HEADS_DIMS:
        if x.shape[1] != heads:
            msg = (
                f"attention_from_qk: `{what}` {list(x.shape)} has {x.shape[1]} "
                f"heads in dimension 1, not {heads}"
            )
            raise ValueError(msg)
        return x
    if x.dim() != _FLAT_DIMS or x.shape[-1] % heads:
        msg = (
            f"attention_from_qk: `{what}` must be [batch, tokens, heads * head_size] "
            f"or [batch, heads, tokens, head_size]; got {list(x.shape)} for {heads} "
            "heads"
        )
        raise ValueError(msg)
    batch, tokens, width = x.shape
    return x.reshape(batch, tokens, heads, width // heads).transpose(1, 2)


def attention_from_qk(  # noqa: PLR0913 (the tensors, then keyword-only options)
    q: Tensor,
    k: Tensor,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    causal: bool = True,
    mask: Tensor | None = None,
    scale: float | None = None,
    position_embeddings: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    r"""Return each head's attention weights $\mathrm{softmax}(s \, q k^\top)$.

    $s$ is ``scale``; the causal and padding masks apply before the softmax.

    For nets whose attention computes its weights inside a fused kernel
    (PyTorch's scaled-dot-product attention): record the queries and keys
    and recompute the weights. With eager attention the weights can be
    recorded instead (``output_attentions=True``, or the attention module's
    second output), and that is the one safe way for any model this
    function does not describe:

    * GPT-2: the ``attn.c_attn`` output holds q, k and v (split it in
      three);
    * rotary models (Llama, Mistral, Qwen2, Gemma's first versions): the
      ``q_proj`` and ``k_proj`` outputs are the queries and keys *before*
      their rotary embedding, which changes every weight; record the
      model's rotary embedding too (``model.rotary_emb``, whose output is
      ``(cos, sin)``) and pass it as ``position_embeddings``: it is applied
      as transformers' ``apply_rotary_pos_emb`` does (each head's halves
      rotated);
    * models that rotate otherwise (a part of each head: GPT-NeoX's
      ``rotary_pct``, Phi's; pairs of neighbours: GPT-J) or that normalize q
      and k after the projection (Qwen3's ``q_norm``, OLMo 2, Gemma 3):
      record the eager attention weights. (A ``cos`` narrower than a head
      is refused; the others cannot be told from the tensors.)

    Parameters
    ----------
    q, k : Tensor
        ``[batch, tokens, heads * head_size]`` (a projection's output) or
        ``[batch, heads, tokens, head_size]``.
    num_heads : int
        Query heads.
    num_kv_heads : int, optional
        Key heads under grouped-query attention (each serves
        ``num_heads // num_kv_heads`` query heads); default ``num_heads``.
    causal : bool, default True
        Mask the keys after each query (a decoder). Queries are the last
        ``q.shape[-2]`` positions of the keys.
    mask : Tensor, optional
        ``[batch, keys]``, 1 for a key to attend to, 0 for padding.
    scale : float, optional
        $s$, default $1 / \sqrt{d}$, $d$ the head size.
    position_embeddings : (Tensor, Tensor), optional
        ``(cos, sin)`` of a rotary model, each ``[batch, keys, head_size]``
        or ``[keys, head_size]`` (the output of its ``rotary_emb``,
        recorded in the same pass): ``x * cos + rotate_half(x) * sin`` is
        applied to ``q`` (the last ``q.shape[-2]`` positions) and ``k``,
        ``rotate_half(x)`` being ``cat(-x2, x1)`` of the head's halves.

    Returns
    -------
    Tensor
        ``[batch, heads, queries, keys]``, float32 or wider, each row
        summing to 1 (a row with every key masked is all zeros).

    Raises
    ------
    ValueError
        For shapes that do not match: ``q`` and ``k`` (batch, head size,
        heads), ``position_embeddings`` (not a pair, not the head size or
        the keys' count, an odd head size).

    Examples
    --------
    >>> import torch
    >>> q, k = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    >>> weights = attention_from_qk(q, k, num_heads=2)
    >>> weights.shape
    torch.Size([1, 2, 3, 3])
    >>> weights[0, 0, 0].tolist()  # the first token sees only itself
    [1.0, 0.0, 0.0]
    >>> cos, sin = torch.ones(3, 4), torch.zeros(3, 4)  # no rotation at all
    >>> rotated = attention_from_qk(q, k, num_heads=2, position_embeddings=(cos, sin))
    >>> torch.equal(rotated, weights)
    True

    """
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_heads < 1 or kv_heads < 1 or num_heads % kv_heads:
        msg = (
            f"attention_from_qk: num_heads={num_heads}, num_kv_heads={kv_heads}: "
            "both at least 1, and num_heads a multiple of num_kv_heads"
        )
        raise ValueError(msg)
    dtype = torch.promote_types(q.dtype, torch.float32)
    queries = _split(q.detach(), num_heads, "q").to(dtype)
    keys = _split(k.detach(), kv_heads, "k").to(dtype)
    if queries.shape[-1] != keys.shape[-1] or queries.shape[0] != keys.shape[0]:
        msg = (
            f"attention_from_qk: q {list(queries.shape)} and k {list(keys.shape)} "
            "(as [batch, heads, tokens, head_size]) must share batch and head size"
        )
        raise ValueError(msg)
    if position_embeddings is not None:
        queries, keys = _rotated(queries, keys, position_embeddings)
    keys = keys.repeat_interleave(num_heads // kv_heads, dim=1)
    factor = 1 / math.sqrt(queries.shape[-1]) if scale is None else scale
    logits = queries @ keys.transpose(-1, -2) * factor
    n_q, n_k = logits.shape[-2:]
    blocked = torch.zeros(n_q, n_k, dtype=torch.bool, device=logits.device)
    if causal:
        blocked = torch.ones_like(blocked).triu(n_k - n_q + 1)
    blocked = blocked.expand(logits.shape[0], 1, n_q, n_k)
    if mask is not None:
        blocked = blocked | (mask.to(logits.device) == 0)[:, None, None, :]
    logits = logits.masked_fill(blocked, -math.inf)
    weights = torch.softmax(logits, dim=-1)
    return weights.nan_to_num(0.0)  # a row with every key masked


def _rotated(
    queries: Tensor, keys: Tensor, position_embeddings: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """Rotate ``[B, H, T, D]`` queries and keys by ``(cos, sin)``, as transformers."""
    if (
        not isinstance(position_embeddings, tuple | list)
        or len(position_embeddings) != 2  # noqa: PLR2004 (cos and sin)
    ):
        msg = (
            "attention_from_qk: `position_embeddings` must be the pair (cos, sin) "
            "that the model's rotary embedding returns (record `model.rotary_emb`)"
        )
        raise ValueError(msg)
    cos, sin = (t.detach().to(queries.dtype) for t in position_embeddings)
    head, n_k, n_q = keys.shape[-1], keys.shape[-2], queries.shape[-2]
    if cos.shape != sin.shape or cos.dim() not in {2, 3} or cos.shape[-2] != n_k:
        msg = (
            f"attention_from_qk: `position_embeddings` cos {list(cos.shape)} and sin "
            f"{list(sin.shape)} must both be [batch, keys, head_size] or [keys, "
            f"head_size], with {n_k} keys"
        )
        raise ValueError(msg)
    if cos.shape[-1] != head or head % 2:
        msg = (
            f"attention_from_qk: `position_embeddings` rotate {cos.shape[-1]} "
            f"dimensions of heads of {head}; this function rotates whole heads "
            "of an even size, by halves (transformers' `apply_rotary_pos_emb`). "
            "For a model that rotates a part of each head (GPT-NeoX's "
            "`rotary_pct`), record the eager attention weights instead "
            '(`output_attentions=True` with `attn_implementation="eager"`).'
        )
        raise ValueError(msg)
    if cos.dim() == 3 and cos.shape[0] not in {1, keys.shape[0]}:  # noqa: PLR2004 ([B, T, D])
        msg = (
            f"attention_from_qk: `position_embeddings` hold {cos.shape[0]} samples "
            f"for a batch of {keys.shape[0]}"
        )
        raise ValueError(msg)
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # over the heads

    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + turned * sin

    at_queries = (..., slice(n_k - n_q, None), slice(None))
    return (
        rotate(queries, cos[at_queries], sin[at_queries]),
        rotate(keys, cos, sin),
    )


MAX_MB = 50.0
"""The largest page :func:`attention_view` writes by default, in megabytes."""
_BYTES = 4  # a float32 weight


def weights_of(data: dict[str, Any]) -> Any:
    """Return a page's weights as a numpy ``[heads, queries, keys]`` array.

    Masked cells (the keys after each query, when the page stores only the
    unmasked half) are NaN, as are the weights that were not finite.
    """
    import numpy as np  # noqa: PLC0415 (torch's dependency; only for pictures)

    flat = np.frombuffer(base64.b64decode(data["weights"]), dtype="<f4")
    heads, n_q, n_k = len(data["heads"]), len(data["queries"]), len(data["keys"])
    full = np.full((heads, n_q, n_k), np.nan, dtype=np.float64)
    lengths = row_lengths(n_q, n_k, causal=data["causal"])
    at = 0
    for h in range(heads):
        for i, length in enumerate(lengths):
            full[h, i, :length] = flat[at : at + length]
            at += length
    return full


def row_lengths(n_q: int, n_k: int, *, causal: bool) -> list[int]:
    """Keys stored per query: all, or those up to the query's own (causal)."""
    if not causal:
        return [n_k] * n_q
    return [n_k - n_q + i + 1 for i in range(n_q)]


class _AttentionView(View):
    kind = "attention"

    def figure(self) -> Figure:
        """Each head's weights; masked cells grey, token labels thinned and cut."""
        weights = weights_of(self.data)
        heads = weights.shape[0]
        columns = min(heads, 4)
        rows = math.ceil(heads / columns)
        side = 3.4 if heads > 1 else 6.0
        fig = new_figure(side * columns + 1.2, side * rows + 0.8)
        axes = [fig.add_subplot(rows, columns, h + 1) for h in range(heads)]
        cmap = matplotlib_module("colors").LinearSegmentedColormap.from_list(
            "weights", ["#ffffff", "#08306b"]
        )
        cmap = cmap.with_extremes(bad="#d0d0d0")  # masked: grey, not white
        keys = [short(k) for k in self.data["keys"]]
        queries = [short(q) for q in self.data["queries"]]
        image = None
        for h, ax in enumerate(axes):
            image = ax.imshow(weights[h], cmap=cmap, vmin=0, vmax=1)
            ax.set_title(f"head {self.data['heads'][h]}", fontsize=9)
            at_k = tick_labels(keys, side * 0.6, 6)
            at_q = tick_labels(queries, side * 0.6, 6)
            ax.set_xticks(at_k, [keys[j] for j in at_k], rotation=90)
            ax.set_yticks(at_q, [queries[i] for i in at_q])
            ax.tick_params(labelsize=6)
            ax.set_xlabel("key", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
        if image is not None:
            fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
        if self.data["causal"]:
            fig.text(0.01, 0.005, "grey: masked (keys after the query)", fontsize=7)
        fig.suptitle(self.title, fontsize=10)
        return fig


def attention_view(  # noqa: PLR0913 (the weights, then keyword-only options)
    weights: Tensor,
    tokens: Sequence[Any] | None = None,
    *,
    keys: Sequence[Any] | None = None,
    sample: int = 0,
    heads: Sequence[int] | None = None,
    layer: str | None = None,
    title: str | None = None,
    max_mb: float = MAX_MB,
) -> View:
    """Return a view of a layer's attention patterns, head by head.

    All heads as thumbnails (click one, or press Enter on it, to open it),
    or one head at a time (picked from a list) as a heat map with the
    tokens along its sides: past about 60 tokens, a window of them that
    the "queries from" and "keys from" fields move (the map's cells stay
    12 px, so that the labels can be read at 2,048 tokens). Hovering a cell
    shows its weight; hovering a query token shows its row, the keys it
    attends to most first. The colour scale is picked in the page: linear,
    logarithmic, or clipped at the 99th percentile of the weights drawn,
    with its values shown. Every part is reachable by keyboard (Tab, then
    the arrow keys on a map).

    A causal pattern (every weight after each query's own key exactly 0, as
    a decoder's mask leaves them) is stored as its lower half only: those
    cells are masked, drawn hatched (not as zero weights) and left out of
    the tooltips. The weights are stored as float32 (about seven digits),
    in binary.

    Parameters
    ----------
    weights : Tensor
        ``[batch, heads, queries, keys]`` (the attention weights a Hugging
        Face model returns with ``output_attentions=True``, or an eager
        attention module's second output, recorded; or
        :func:`attention_from_qk`), or ``[heads, queries, keys]``.
    tokens : sequence, optional
        The query tokens (as text); default ``0, 1, ...``.
    keys : sequence, optional
        The key tokens, if not the queries (a cache before them).
    sample : int, default 0
        The sample of the batch shown.
    heads : sequence of int, optional
        The heads shown (numbered as in ``weights``); default all.
    layer : str, optional
        The layer's name, shown.
    title : str, optional
        Default ``"Attention"`` (and the layer).
    max_mb : float, default 50
        The largest page written, in megabytes (10**6 bytes): a larger one
        is refused, naming its size.

    Returns
    -------
    View

    Raises
    ------
    ValueError
        For a page over ``max_mb``: pick fewer ``heads``, or slice the
        tokens (``weights[..., a:b, a:b]`` and ``tokens[a:b]``).

    Examples
    --------
    >>> import torch
    >>> weights = torch.softmax(torch.randn(1, 2, 3, 3), dim=-1)
    >>> view = attention_view(weights, ["The", " cat", " sat"], layer="h.0.attn")
    >>> view.data["heads"], view.data["queries"], view.data["causal"], view.title
    ([0, 1], ['The', ' cat', ' sat'], False, 'Attention, h.0.attn')
    >>> causal = attention_from_qk(
    ...     torch.randn(1, 3, 8), torch.randn(1, 3, 8), num_heads=2
    ... )
    >>> attention_view(causal).data["causal"]  # 6 weights a head stored, not 9
    True

    """
    found = one_sample(
        torch.as_tensor(weights).detach().to("cpu"),
        ["batch", "heads", "queries", "keys"],
        sample,
        "attention_view",
        "weights",
    )
    n_h, n_q, n_k = found.shape
    shown = list(range(n_h)) if heads is None else [int(h) for h in heads]
    if not shown or any(not 0 <= h < n_h for h in shown):
        msg = (
            f"attention_view: heads={list(heads or [])}; pick at least one of "
            f"0 to {n_h - 1}"
        )
        raise ValueError(msg)
    picked = found[shown].to(torch.float32)
    queries = names(tokens, n_q, "tokens", "attention_view")
    if keys is None and n_k != n_q:
        # keys before the queries (a cache): unnamed, then the queries' tokens
        key_names = [str(j) for j in range(n_k - n_q)] + queries
        if n_k < n_q:
            key_names = [str(j) for j in range(n_k)]
    else:
        key_names = names(
            keys if keys is not None else tokens, n_k, "keys", "attention_view"
        )
    later = torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1)
    causal = n_k >= n_q and bool((picked[:, later] == 0).all())
    lengths = row_lengths(n_q, n_k, causal=causal)
    size = len(shown) * sum(lengths) * _BYTES * 4 / 3  # base64
    if size > max_mb * 1e6:
        msg = (
            f"attention_view: {len(shown)} heads x {n_q} queries x {n_k} keys make "
            f"a page of {size / 1e6:.3g} MB ({_BYTES} bytes a weight"
            f"{', the masked half left out' if causal else ''}), over max_mb="
            f"{max_mb:g}; pick fewer heads (heads=[0, 1]) or slice the tokens "
            "(weights[..., a:b, a:b] with tokens[a:b]), or raise max_mb"
        )
        raise ValueError(msg)
    kept = picked[:, ~later] if causal else picked.reshape(len(shown), -1)
    payload = kept.contiguous().numpy().astype("<f4").tobytes()
    data = {
        "weights": base64.b64encode(payload).decode("ascii"),
        "heads": shown,
        "causal": causal,
        "queries": queries,
        "keys": key_names,
        "layer": layer,
    }
    view = _AttentionView(
        data, title=title or ("Attention" + (f", {layer}" if layer else ""))
    )
    view.height = 640
    return view
