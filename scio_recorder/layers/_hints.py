"""What to say when the reference pass fails on inputs the model cannot read.

Holds :func:`token_model_hint`: a model that reads token ids (its forward
takes ``input_ids``, or the pass failed in an embedding's lookup) given
``input_size=``, from which torchinfo draws random floats, fails with
torchinfo's "Failed to run torchinfo" and an error about the embedding's
indices. The hint says what such a model wants instead.
"""

from __future__ import annotations

__all__ = ["token_model_hint"]

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from collections.abc import Mapping


def _takes_input_ids(net: nn.Module) -> bool:
    """Whether ``net``'s forward takes ``input_ids`` first (as Hugging Face's)."""
    if getattr(net, "main_input_name", None) == "input_ids":
        return True
    try:
        parameters = list(inspect.signature(net.forward).parameters)
    except (TypeError, ValueError):
        parameters = []
    return parameters[:1] == ["input_ids"]


def _reads_tokens(net: nn.Module, error: BaseException) -> bool:
    """Whether ``net`` reads token ids, from its forward or from ``error``."""
    if _takes_input_ids(net):
        return True
    cause: BaseException | None = error
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = str(cause)
        if "embedding" in text and "'indices'" in text:
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _vocabulary(net: nn.Module) -> int | None:
    """Return how many token ids ``net`` reads (its config's, or its embedding's)."""
    size = getattr(getattr(net, "config", None), "vocab_size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    for module in net.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    return None


def token_model_hint(
    net: nn.Module, summary_kwargs: Mapping[str, Any], error: BaseException
) -> str | None:
    """Say what a model that reads token ids wants instead of ``input_size``.

    ``None`` unless the reference pass was given ``input_size`` (torchinfo's
    random inputs, floating point unless ``dtypes`` says otherwise) and
    ``net`` reads token ids (:func:`_reads_tokens`).

    Examples
    --------
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))  # ids first
    >>> error = RuntimeError("Expected tensor for argument #1 'indices' to have "
    ...                      "one of the following scalar types: Long, Int "
    ...                      "(while checking arguments for embedding)")  # fmt: skip
    >>> hint = token_model_hint(net, {"input_size": (1, 8)}, error)
    >>> hint[hint.index("Give") :]
    'Give it token ids instead: `input_data=torch.randint(10, (1, 8))`.'
    >>> token_model_hint(net, {"input_data": torch.zeros(1, 8)}, error) is None
    True

    """
    size = summary_kwargs.get("input_size")
    if size is None or summary_kwargs.get("input_data") is not None:
        return None
    dtypes = summary_kwargs.get("dtypes")
    if dtypes and not any(
        isinstance(dtype, torch.dtype) and dtype.is_floating_point for dtype in dtypes
    ):
        return None
    if not _reads_tokens(net, error):
        return None
    shape = tuple(size) if isinstance(size, (list, tuple)) else size
    vocab = _vocabulary(net)
    draw = (
        f"torch.randint({vocab}, {shape})"
        if vocab is not None
        else f"ids of shape {shape}"
    )
    data = f'{{"input_ids": {draw}}}' if _takes_input_ids(net) else draw
    return (
        f"The reference pass of {type(net).__name__} failed on torchinfo's random "
        f"inputs of `input_size={shape}`, which are floating point, but it reads "
        f"token ids (integers). Give it token ids instead: "
        f"`input_data={data}`."
    )
