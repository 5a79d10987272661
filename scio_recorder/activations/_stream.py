"""A token stream's batches as :func:`write` takes them: :func:`token_batches`.

:func:`token_batches` turns each batch into the net's arguments and the
``[batch, positions]`` mask of the tokens kept, exactly as :func:`write`
does (``_tokens.Batches``: the padding mask's entry, ``mask=None`` refused
on a batch holding the padding token, ``skip_bos``, the device), for tools
that measure something over the same tokens a set holds
(:func:`scio_recorder.sae.evaluate`).
"""

from __future__ import annotations

__all__ = ["TokenBatch", "token_batches"]

from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from scio_recorder._run.batches import POSITION_IDS

from ._tokens import Batches, token_ids

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from torch import Tensor

    from scio_recorder.recorder import Recorder


class TokenBatch(NamedTuple):
    """One batch of a token stream: the net's arguments and the tokens kept."""

    args: tuple[Any, ...]
    """Positional arguments of the net (moved to ``device``)."""
    kwargs: dict[str, Any]
    """Keyword arguments of the net (moved to ``device``)."""
    keep: Tensor
    """``[batch, positions]`` bool: the tokens kept (padding and BOS left out)."""
    ids: Tensor | None
    """The ``[batch, positions]`` token ids among the arguments, if any."""


def token_batches(  # noqa: PLR0913 (write's options)
    rnet: Recorder,
    batches: Iterable[Any],
    *,
    mask: Any = "attention_mask",
    input: Any = None,  # noqa: A002 (the documented name)
    skip_bos: bool = False,
    device: torch.device | str | None = None,
    position_ids: str | None = POSITION_IDS,
) -> Iterator[TokenBatch]:
    """Yield each batch's arguments and kept tokens, as :func:`write` reads them.

    ``mask``, ``input``, ``skip_bos``, ``device`` and ``position_ids`` are
    :func:`write`'s (the arguments hold the position ids derived from the
    padding mask, by default).
    The batch's shape ``[batch, positions]`` is the mask's, or (with
    ``mask=None``) the token ids'.

    Raises
    ------
    ValueError, TypeError, KeyError
        As :func:`write` does for a batch: no mask entry, a mask that is
        not 0 and 1 or not of the ids' shape, padding with ``mask=None``,
        padding the model is given no ``attention_mask`` for; and for
        ``mask=None`` on a batch without token ids.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.activations import token_batches
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_data=torch.zeros(1, 2, dtype=torch.long))
    >>> ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    >>> [b.keep.sum().item() for b in token_batches(rnet, [ids], mask=None)]
    [6]
    >>> batch = {"input_ids": ids, "attention_mask": torch.tensor([[0, 1, 1]] * 2)}
    >>> one = next(token_batches(rnet, [batch], input="input_ids", skip_bos=True))
    >>> one.keep.tolist()
    [[False, False, True], [False, False, True]]

    """
    source = Batches(
        rnet,
        input=input,
        mask=mask,
        skip_bos=skip_bos,
        device=None if device is None else torch.device(device),
        position_ids=position_ids,
    )
    for index, batch in enumerate(batches):
        args, kwargs, padding = source.checked(batch, index)
        ids = token_ids(args, kwargs)
        if padding is not None:
            shape = (int(padding.shape[0]), int(padding.shape[1]))
        elif ids is not None:
            shape = (int(ids.shape[0]), int(ids.shape[1]))
        else:
            msg = (
                f"Batch {index} holds no [batch, positions] token ids, and "
                "`mask=None` gives no shape: pass the batches' padding mask "
                "(`mask=...`)."
            )
            raise ValueError(msg)
        keep = source.kept(padding, shape, index)
        args, kwargs = source.positions.add(*source.move(args, kwargs))
        yield TokenBatch(args, kwargs, keep, ids)
