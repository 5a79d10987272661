"""Ablation: chosen layers' outputs zeroed, or set to their mean over a data set."""

from __future__ import annotations

__all__ = ["ablate", "layer_means"]

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder.collect import collect
from scio_recorder.select import as_label, resolve

from ._base import (
    check_recorder,
    check_where,
    put,
    run_edited,
    select_calls,
    stream_of,
    with_stream,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def layer_means(
    rnet: Recorder,
    batches: Iterable[Any],
    layers: Selector | list[Selector],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
    **options: Any,
) -> dict[DepthIdx, Tensor]:
    """Return each layer's mean activation over a data set (one ``collect`` pass).

    ``input`` and ``**options`` are those of
    :func:`~scio_recorder.collect.collect`: ``input=0`` takes item 0 of tuple
    batches, ``input=None`` passes the whole batch as the one argument, and
    ``input=dict`` passes each batch of keyword inputs (a tokenizer's output)
    as keyword arguments.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    >>> layer_means(rnet, [torch.ones(4, 3)], "0", input=None)[(1, 1)].shape
    torch.Size([2])

    """
    check_recorder(rnet, "layer_means")
    labels = select_calls(rnet, layers, "layer_means")
    result = collect(
        rnet, batches, dict.fromkeys(labels, "moments"), input=input, **options
    )
    return {label: result[label].mean for label in labels}


def ablate(
    rnet: Recorder,
    x: Any,
    layers: Selector | list[Selector],
    *,
    means: Mapping[Any, Tensor] | None = None,
    where: Any = None,
) -> Any:
    """Run ``x`` with ``layers``' activations zeroed, or set to their means.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    x : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`).
    layers : selector or list of selectors
        The layers ablated (every call they select; a label names one call
        of a reused module).
    means : Mapping, optional
        Layer -> mean activation, as :func:`layer_means` returns it:
        mean-ablation; default zero-ablation. A key is a label ``(depth,
        idx)`` or any selector of the layer; keys of layers not ablated are
        ignored. A mean must broadcast to the layer's output (its shape
        without the batch dimension, as :func:`layer_means` gives, does).
    where : index, optional
        Ablate only ``output[where]``. A layer whose output is a tuple (a
        block returning ``(hidden_states, ...)``) has its first item ablated.

    Returns
    -------
    Any
        The net's output, ablated.

    Raises
    ------
    TypeError
        If ``means`` is not a mapping, or one of its values is not a tensor.
    ValueError
        If a key of ``means`` is not a layer of the net, a mean does not
        broadcast to its layer's output, or ``where`` does not index it.
    KeyError
        If an ablated layer has no mean in ``means``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> out = ablate(rnet, torch.randn(4, 3), layers="1")
    >>> torch.allclose(out, net[2].bias.expand(4, 2))  # nothing reaches the head
    True

    """
    check_recorder(rnet, "ablate")
    labels = select_calls(rnet, layers, "ablate")
    by_label = None if means is None else _means_by_label(rnet, means)
    edits: dict[DepthIdx, Callable[[Any], Any]] = {}
    for label in labels:
        if by_label is None:
            edits[label] = _on_stream(rnet, label, _ablation(rnet, label, None), where)
            continue
        if label not in by_label:
            msg = (
                f"ablate: no mean for layer {rnet.table[label].describe()}: compute "
                "them with `layer_means(rnet, batches, layers)`."
            )
            raise KeyError(msg)
        key, mean = by_label[label]
        ablated = _ablation(rnet, label, mean, f"means[{key!r}]")
        edits[label] = _on_stream(rnet, label, ablated, where)
    return run_edited(rnet, x, edits)


_MEANS_ADVICE = (
    "pass `means=layer_means(rnet, batches, layers)`, a mapping from each "
    "ablated layer's label to its mean activation"
)


def _means_by_label(
    rnet: Recorder, means: object
) -> dict[DepthIdx, tuple[object, Tensor]]:
    """Check ``ablate``'s ``means``; return label -> (the user's key, mean)."""
    if not isinstance(means, Mapping):
        shown = (
            f"a Tensor of shape {list(means.shape)}"
            if isinstance(means, Tensor)
            else f"a {type(means).__name__}"
        )
        msg = (
            f"ablate: `means` must be a mapping from layer to mean activation, "
            f"got {shown}: {_MEANS_ADVICE}, e.g. `means={{(1, 2): mean}}` for one "
            "layer."
        )
        raise TypeError(msg)
    by_label: dict[DepthIdx, tuple[object, Tensor]] = {}
    for key, mean in means.items():
        if not isinstance(mean, Tensor):
            msg = (
                f"ablate: `means[{key!r}]` is a {type(mean).__name__}, not a "
                f"tensor: {_MEANS_ADVICE}."
            )
            raise TypeError(msg)
        for label in _key_labels(rnet, key):
            if label in by_label:
                msg = (
                    f"ablate: `means` has two means for layer "
                    f"{rnet.table[label].describe()}, under the keys "
                    f"{by_label[label][0]!r} and {key!r}: keep one of them."
                )
                raise ValueError(msg)
            by_label[label] = (key, mean)
    return by_label


def _key_labels(rnet: Recorder, key: object) -> list[DepthIdx]:
    """Return the labels a key of ``means`` stands for, or raise naming it."""
    label = as_label(key)
    if label is not None and label in rnet.table:
        return [label]
    problem = "no label of this net"
    if label is None:
        try:
            rows = resolve(rnet.table, rnet.net, [key])
        except (KeyError, ValueError, TypeError) as error:
            problem = str(error)
        else:
            if rows:
                return [row.label for row in rows]
            problem = "it selects no layer"
    msg = (
        f"ablate: the key {key!r} of `means` is not a layer of this net "
        f"({problem}); see `print(rnet)` for the labels, and {_MEANS_ADVICE}."
    )
    raise ValueError(msg)


def _ablation(
    rnet: Recorder, label: DepthIdx, mean: Tensor | None, name: str = ""
) -> Callable[[Tensor, Any], Tensor]:
    """Return the function ablating ``label``'s stream: zeros, or ``mean``."""
    layer = rnet.table[label].describe()

    def ablated(output: Tensor, where: Any) -> Tensor:
        check_where(where, output, "ablate", layer)
        if mean is None:
            return put(output, torch.zeros_like(output), where)
        try:
            shape = torch.broadcast_shapes(mean.shape, output.shape)  # type: ignore[no-untyped-call]
            fits = shape == output.shape
        except RuntimeError:
            fits = False
        if not fits:
            msg = (
                f"ablate: `{name}` has shape {list(mean.shape)}, which does not "
                f"broadcast to the output {list(output.shape)} of layer {layer}: "
                f"pass the layer's mean activation, of shape "
                f"{list(output.shape[1:])} (the output without its batch "
                "dimension, as `layer_means` returns it)."
            )
            raise ValueError(msg)
        value = mean.to(output).expand_as(output).clone()
        return put(output, value, where)

    return ablated


def _on_stream(
    rnet: Recorder,
    label: DepthIdx,
    ablated: Callable[[Tensor, Any], Tensor],
    where: Any,
) -> Callable[[Any], Any]:
    """Return the edit applying ``ablated`` to the stream of ``label``'s output."""

    def edit(output: Any) -> Any:
        stream = stream_of(rnet, label, output, "ablate")
        return with_stream(output, ablated(stream, where))

    return edit
