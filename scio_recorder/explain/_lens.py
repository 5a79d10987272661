"""The logit lens: the final norm and unembedding applied to residual streams."""

from __future__ import annotations

__all__ = ["logit_lens"]

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._base import check_recorder, find_module, select_calls_in_order, stream_of
from ._patching import cache_run

if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch import Tensor

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def logit_lens(
    rnet: Recorder,
    inputs: Any,
    layers: Selector | Sequence[Selector],
    *,
    norm: nn.Module | Selector | None = None,
    unembed: nn.Module | Selector | None = None,
) -> Tensor:
    """Return ``unembed(norm(h))`` for the residual stream ``h`` after each layer.

    The logit lens (nostalgebraist 2020): read what each layer's residual
    stream would predict if the net stopped there. One pass records the
    streams; the final norm and the unembedding are then called on each.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    inputs : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`).
    layers : selector or list of selectors
        The calls whose outputs are residual streams (blocks), in the order
        given; a tuple output's first item is the stream.
    norm : module or selector, optional
        The final norm; default found by name (``transformer.ln_f`` of GPT-2,
        ``model.norm`` of Llama, Mistral, Qwen, ...), else the last norm
        called (a module whose type name ends with ``Norm``).
    unembed : module or selector, optional
        The unembedding; default ``lm_head`` (or the net's
        ``get_output_embeddings()``).

    Returns
    -------
    Tensor
        ``[len(layers), *stream.shape[:-1], vocabulary]``, detached.

    Raises
    ------
    TypeError
        If ``rnet`` is not a :class:`~scio_recorder.Recorder`.
    ValueError
        If no norm or unembedding is named nor found (the message says how to
        name them), or they do not apply to a layer's output (not a residual
        stream).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    >>> net.add_module("lm_head", nn.Linear(4, 10))
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    >>> ids = torch.tensor([[1, 2, 3, 4, 5]])
    >>> lens = logit_lens(rnet, ids, ["0", "1"])
    >>> lens.shape
    torch.Size([2, 1, 5, 10])
    >>> torch.equal(lens[1], net(ids).detach())  # the last stream: the output
    True

    """
    check_recorder(rnet, "logit_lens")
    labels = select_calls_in_order(rnet, layers, "logit_lens")
    final = find_module(rnet, norm, "norm", "logit_lens")
    head = find_module(rnet, unembed, "unembed", "logit_lens")
    kept = cache_run(rnet, inputs, labels)
    lenses = []
    with torch.no_grad():
        for label in labels:
            stream = stream_of(rnet, label, kept.activations[label], "logit_lens")
            try:
                lenses.append(head(final(stream)))
            except RuntimeError as error:
                msg = (
                    f"logit_lens: the norm ({type(final).__name__}) and the "
                    f"unembedding ({type(head).__name__}) do not apply to the "
                    f"output {list(stream.shape)} of layer "
                    f"{rnet.table[label].describe()} ({error}): name layers whose "
                    "outputs are residual streams (blocks), or pass the model's "
                    "own `norm=` and `unembed=`."
                )
                raise ValueError(msg) from error
    return torch.stack(lenses)
