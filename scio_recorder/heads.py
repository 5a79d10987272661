"""Attention heads: a view of the heads in a projection's input, and head edits.

Multi-head attention computes one output per head, ``z_h`` (``[..., D]``),
concatenates them along the last dimension (``[..., H * D]``) and applies the
output projection (``o_proj``, ``c_proj``, ``out_proj``). The input of that
projection therefore holds every head's output side by side: editing a head
is editing a slice of that input (TransformerLens's ``hook_z``), with
``Recorder(..., input_postproc={"...o_proj": fn})`` on the unmodified model.

This is exact under grouped-query attention (Llama, Mistral with
``num_key_value_heads < num_attention_heads``): keys and values are shared by
groups of query heads, but each *query* head still has its own output, and
the projection's input has ``num_attention_heads`` slices. (Slicing the value
projection instead would edit a whole group of heads at once.)

Examples
--------
>>> import torch
>>> x = torch.arange(8.0).reshape(1, 1, 8)  # 4 heads of size 2
>>> zero_heads([1], num_heads=4)(x)
tensor([[[0., 1., 0., 0., 4., 5., 6., 7.]]])
"""

from __future__ import annotations

__all__ = ["head_count", "heads_view", "scale_heads", "zero_heads"]

import math
from collections.abc import Mapping
from numbers import Real
from typing import TYPE_CHECKING

import torch

from .recorder import Recorder
from .select import resolve_one

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from torch import Tensor

    from .select import Selector

_COUNT_NAMES = ("num_heads", "num_attention_heads", "n_head", "n_heads")


def heads_view(x: Tensor, num_heads: int) -> Tensor:
    """Return ``x`` (``[..., H * D]``) as ``[..., H, D]`` (a view when it can be).

    An in-place change of a view changes ``x``.

    Raises
    ------
    TypeError
        If ``x`` is not a tensor with a dimension, or ``num_heads`` not an int.
    ValueError
        If ``num_heads`` is below 1, or the last dimension is not a multiple
        of it.

    Examples
    --------
    >>> import torch
    >>> heads_view(torch.zeros(2, 5, 12), num_heads=4).shape
    torch.Size([2, 5, 4, 3])

    """
    _check_count(num_heads, "heads_view")
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        shown = "a 0-d tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        msg = (
            f"heads_view: `x` must be a tensor [..., heads * head_size], got "
            f"{shown}: pass the input of the attention's output projection."
        )
        raise TypeError(msg)
    if x.shape[-1] % num_heads:
        msg = (
            f"Cannot split the last dimension ({x.shape[-1]}) of a tensor of "
            f"shape {list(x.shape)} into {num_heads} heads: it must be a multiple "
            "of the head count. Give the number of query heads "
            "(`num_attention_heads`), not of key/value heads."
        )
        raise ValueError(msg)
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


def scale_heads(
    factors: dict[int, float], num_heads: int
) -> Callable[[Tensor], Tensor]:
    """Return an ``input_postproc`` that multiplies head ``h`` by ``factors[h]``.

    The tensor given is not changed: the function returns an edited copy.

    Raises
    ------
    TypeError
        If ``factors`` is not a mapping, a head is not an int, a scale not a
        number, or ``num_heads`` not an int.
    ValueError
        If a head is out of ``range(num_heads)``, a scale is not finite, or
        ``num_heads`` is below 1.

    Examples
    --------
    >>> import torch
    >>> scale_heads({0: 2.0}, num_heads=2)(torch.ones(1, 4))
    tensor([[2., 2., 1., 1.]])

    """
    _check_count(num_heads, "scale_heads")
    if not isinstance(factors, Mapping):
        msg = (
            f"scale_heads: `factors` must be a mapping from head to scale, got "
            f"{_shown(factors)}: e.g. `scale_heads({{1: 0.5}}, num_heads="
            f"{num_heads})` halves head 1."
        )
        raise TypeError(msg)
    chosen = dict(factors)
    _check_heads(list(chosen), num_heads, "scale_heads", "a key of `factors`")
    for head, factor in chosen.items():
        if not isinstance(factor, Real) or isinstance(factor, bool):
            msg = (
                f"scale_heads: `factors[{head}]` is {_shown(factor)}, not a "
                f"number: give each head's scale as a float, e.g. `{{{head}: 0.5}}`."
            )
            raise TypeError(msg)
        if not math.isfinite(factor):
            msg = (
                f"scale_heads: `factors[{head}]` is {factor}: a scale must be "
                "finite (0.0 silences a head)."
            )
            raise ValueError(msg)

    def edit(x: Tensor) -> Tensor:
        scale = torch.ones(num_heads, dtype=x.dtype, device=x.device)
        for head, factor in chosen.items():
            scale[head] = factor
        return (heads_view(x, num_heads) * scale[:, None]).flatten(-2)

    return edit


def zero_heads(heads: Iterable[int], num_heads: int) -> Callable[[Tensor], Tensor]:
    """Return an ``input_postproc`` that zeroes the outputs of ``heads``.

    Raises
    ------
    TypeError
        If ``heads`` is not an iterable of ints, or ``num_heads`` not an int.
    ValueError
        If a head is out of ``range(num_heads)``, or ``num_heads`` is below 1.

    Examples
    --------
    >>> import torch
    >>> zero_heads([0], num_heads=2)(torch.ones(1, 4))
    tensor([[0., 0., 1., 1.]])

    """
    _check_count(num_heads, "zero_heads")
    if isinstance(heads, int | str | bytes) or not hasattr(heads, "__iter__"):
        msg = (
            f"zero_heads: `heads` must be an iterable of head indices, got "
            f"{_shown(heads)}: e.g. `zero_heads([1], num_heads={num_heads})`."
        )
        raise TypeError(msg)
    chosen = list(heads)
    _check_heads(chosen, num_heads, "zero_heads", "in `heads`")
    return scale_heads(dict.fromkeys(chosen, 0.0), num_heads)


def head_count(rnet: Recorder, selector: Selector) -> int:
    """Return the number of (query) heads of the attention ``selector`` is in.

    ``selector`` names a module (its output projection, or the attention
    module itself); the count is read from that module or the closest
    enclosing one that has ``num_heads``, ``num_attention_heads``,
    ``n_head`` or ``n_heads``, or a ``config`` with one of these.

    Raises
    ------
    ValueError
        If no enclosing module says how many heads it has.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)
    >>> model = transformers.GPT2Model(config)
    >>> rnet = Recorder(model, input_size=(1, 4), dtypes=[torch.long])
    >>> head_count(rnet, "h.0.attn.c_proj")
    2

    """
    if not isinstance(rnet, Recorder):
        msg = (
            f"head_count: `rnet` must be a Recorder wrapping the model, got a "
            f"{type(rnet).__name__}: wrap it first, e.g. `Recorder(model, "
            'input_data={"input_ids": ids})`.'
        )
        raise TypeError(msg)
    row = resolve_one(rnet.table, rnet.net, selector, "head_count")
    parts = row.name.split(".") if row.name else []
    modules = dict(rnet.net.named_modules())
    for end in range(len(parts), -1, -1):
        module = modules.get(".".join(parts[:end]))
        for owner in (module, getattr(module, "config", None)):
            for name in _COUNT_NAMES:
                value = getattr(owner, name, None)
                if isinstance(value, int) and value > 0:
                    return value
    msg = (
        f"No module enclosing {row.describe()} says how many heads it has "
        f"(none of {', '.join(_COUNT_NAMES)}, on the module or its `config`): "
        "give `num_heads=` yourself."
    )
    raise ValueError(msg)


def _check_count(num_heads: object, who: str) -> None:
    """Refuse a ``num_heads`` that is not an int of at least 1."""
    if not isinstance(num_heads, int) or isinstance(num_heads, bool):
        msg = (
            f"{who}: `num_heads` must be an int, got {_shown(num_heads)}: give the "
            "number of query heads (`head_count(rnet, selector)` reads it)."
        )
        raise TypeError(msg)
    if num_heads < 1:
        msg = f"{who}: `num_heads={num_heads}`: there is at least one head."
        raise ValueError(msg)


def _check_heads(heads: Sequence[object], num_heads: int, who: str, where: str) -> None:
    """Refuse a head that is not an int in ``range(num_heads)``."""
    for head in heads:
        if not isinstance(head, int) or isinstance(head, bool):
            msg = (
                f"{who}: head {head!r} ({where}) is not an int: give head "
                f"indices from 0 to {num_heads - 1}."
            )
            raise TypeError(msg)
        if not 0 <= head < num_heads:
            msg = (
                f"{who}: head {head} ({where}) does not exist: there are "
                f"{num_heads} heads, 0 to {num_heads - 1}."
            )
            raise ValueError(msg)


def _shown(value: object) -> str:
    """Describe ``value`` in a message: a tensor by its shape, else by repr."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return repr(value)
