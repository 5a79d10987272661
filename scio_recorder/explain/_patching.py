"""Activation patching: a source run's activations put into a target run."""

from __future__ import annotations

__all__ = ["ActivationCache", "cache_run", "patch"]

import dataclasses
from typing import TYPE_CHECKING, Any

from ._base import (
    check_pair,
    check_recorder,
    check_where,
    put,
    run_edited,
    run_keeping,
    select_calls,
    stream_of,
    with_stream,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from torch import Tensor

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def _replace(
    rnet: Recorder, label: DepthIdx, values: Tensor, where: Any
) -> Callable[[Any], Any]:
    """Return the edit putting ``values`` (or ``values[where]``) in the stream."""

    def edit(output: Any) -> Any:
        stream = stream_of(rnet, label, output, "patch")
        if stream.shape != values.shape:
            msg = (
                f"patch: layer {rnet.table[label].describe()} outputs "
                f"{list(stream.shape)} on `target` and {list(values.shape)} on "
                "`source`: pass a source and a target of the same shape (batch "
                "and length; pad them, with an `attention_mask`)."
            )
            raise ValueError(msg)
        return with_stream(output, put(stream, values, where))

    return edit


@dataclasses.dataclass(frozen=True)
class ActivationCache:
    """The outputs of chosen calls in one run, kept to patch them elsewhere.

    Returned by :func:`cache_run`; :func:`patch` takes one in place of its
    ``source``, so that many patches of one source cost one source pass.

    Attributes
    ----------
    output : Any
        The net's output on the source.
    activations : Mapping
        Label ``(depth, idx)`` -> that call's output (copies, detached).
    """

    output: Any
    activations: Mapping[DepthIdx, Any]


def cache_run(
    rnet: Recorder, inputs: Any, layers: Selector | list[Selector]
) -> ActivationCache:
    """Run ``inputs`` once and keep the outputs of the calls ``layers`` select.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    inputs : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`).
    layers : selector or list of selectors
        The calls to keep (every call a selector selects).

    Returns
    -------
    ActivationCache
        The output and the kept activations, by label, without gradient.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> a = torch.randn(1, 3)
    >>> cache = cache_run(rnet, a, ["0", "1"])
    >>> sorted(cache.activations)
    [(1, 1), (1, 2)]
    >>> b = torch.randn(1, 3)
    >>> torch.equal(patch(rnet, cache, b, "1"), cache.output)  # no source pass
    True

    """
    check_recorder(rnet, "cache_run")
    labels = select_calls(rnet, layers, "cache_run")
    return ActivationCache(*run_keeping(rnet, inputs, labels))


def patch(
    rnet: Recorder,
    source: Any,
    target: Any,
    layers: Selector | list[Selector],
    *,
    where: Any = None,
) -> Any:
    """Run ``target`` with ``layers``' activations taken from a run of ``source``.

    The basic experiment of mechanistic interpretability: does the
    information at these layers (and positions) carry the difference between
    the two inputs? One pass of ``source`` serves every patched call; pass an
    :class:`ActivationCache` (:func:`cache_run`) as ``source`` to patch the
    same source into many targets, layers or positions with no source pass
    at all.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    source : Tensor, tuple, Mapping, CallInputs or ActivationCache
        The net's inputs (see :mod:`scio_recorder.explain`), or a cached run of them.
    target : Tensor, tuple, Mapping or CallInputs
        The net's inputs.
    layers : selector or list of selectors
        The layers to patch (every call they select; name one call of a
        reused module by its label to patch that call only).
    where : index, optional
        Patch only ``output[where]`` (e.g. ``(slice(None), 3)``: channel 3;
        ``(slice(None), 5)``: token 5 of a ``[B, T, D]`` output); default the
        whole tensor. A layer whose output is a tuple (a block returning
        ``(hidden_states, ...)``) has its first item patched.

    Returns
    -------
    Any
        The net's output on ``target``, patched.

    Raises
    ------
    KeyError
        If ``source`` is a cache that lacks a patched layer.
    ValueError
        If ``source`` and ``target`` differ in batch size or a patched
        layer's output shape, or ``where`` does not index that output.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> a, b = torch.randn(1, 3), torch.randn(1, 3)
    >>> torch.equal(patch(rnet, a, b, layers="0"), net(a))  # all of it: a's output
    True

    """
    check_recorder(rnet, "patch")
    labels = select_calls(rnet, layers, "patch")
    if not isinstance(source, ActivationCache):
        check_pair(source, target, ("source", "target"), "patch")
    if isinstance(source, ActivationCache):
        missing = [label for label in labels if label not in source.activations]
        if missing:
            shown = ", ".join(rnet.table[label].describe() for label in missing)
            msg = (
                f"patch: the cached source run lacks layer {shown}: cache it "
                f"too, `cache_run(rnet, source, layers)` with these layers."
            )
            raise KeyError(msg)
        kept = {label: source.activations[label] for label in labels}
    else:
        kept = dict(cache_run(rnet, source, labels).activations)
    streams = {label: stream_of(rnet, label, kept[label], "patch") for label in labels}
    for label, stream in streams.items():
        check_where(where, stream, "patch", rnet.table[label].describe())
    edits = {label: _replace(rnet, label, streams[label], where) for label in labels}
    return run_edited(rnet, target, edits)
