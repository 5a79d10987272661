"""Attribution patching: the patching grid's effects to first order."""

from __future__ import annotations

__all__ = ["attribution_patch"]

from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._net.quantized import refuse_gradients

from ._base import (
    as_positions,
    check_callable,
    check_like,
    check_pair,
    check_recorder,
    grid_columns,
    in_call_order,
    one_number,
    run_net,
    select_calls_in_order,
    stream_of,
    with_stream,
)
from ._patching import cache_run

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from torch import Tensor

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def attribution_patch(  # noqa: PLR0913 (keyword-only options)
    rnet: Recorder,
    clean: Any,
    corrupted: Any,
    layers: Selector | Sequence[Selector],
    metric: Callable[[Any], Tensor],
    *,
    positions: Iterable[int] | None = None,
) -> Tensor:
    r"""Return attribution patching's estimate of the patching grid's effects.

    Cell ``[i, j]`` is $\sum (a_\mathrm{clean} - a_\mathrm{corrupted}) \,
    \partial m / \partial a$, $a$ the activation at layer ``i`` and position
    ``j`` and $m$ the metric, summed over the batch and every dimension
    after the position (the hidden one), the gradient taken on the
    corrupted run (Nanda 2023, "Attribution patching"): the first-order
    estimate of $m_\mathrm{patched} - m_\mathrm{corrupted}$ of
    :func:`patch_sweep`. One forward and one backward on ``corrupted``, one
    forward on ``clean``; the gradient is :func:`torch.autograd.grad` with
    respect to the activations (the parameters' ``.grad`` are untouched).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its mode is used as is: call ``net.eval()`` first).
    clean, corrupted : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`), of one shape; put
        ``labels`` among the corrupted inputs for a metric on ``out.loss``.
    layers : selector or list of selectors
        The grid's rows, as for :func:`patch_sweep`.
    metric : callable
        ``metric(output) -> scalar tensor`` on the corrupted run's output.
    positions : iterable of int, optional
        The grid's columns (dimension 1 of the outputs); default all.

    Returns
    -------
    Tensor
        ``[len(layers), len(positions)]``, detached.

    Raises
    ------
    TypeError
        Before any pass: ``rnet`` is not a :class:`~scio_recorder.Recorder`,
        ``metric`` is not callable, ``positions`` is not an iterable of ints.
    ValueError
        Before any pass: ``layers`` selects nothing, ``clean`` and
        ``corrupted`` differ in batch size, ``positions`` is empty, the net
        has layers that pass no gradient to their input (torchao's dynamic
        activation quantization: the estimate would miss their paths). After
        the clean pass: a position out of range of a layer's output. Then:
        clean and corrupted outputs differ in shape, ``metric`` does not
        return one number.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    >>> clean = torch.tensor([[1, 2, 3, 4, 5]])
    >>> corrupted = torch.tensor([[1, 2, 9, 4, 5]])
    >>> est = attribution_patch(rnet, clean, corrupted, ["1"], lambda o: o[0, 2, 0])
    >>> with torch.no_grad():  # the net after layer "1" is linear: exact
    ...     effect = net(clean)[0, 2, 0] - net(corrupted)[0, 2, 0]
    >>> bool(torch.isclose(est[0, 2], effect, atol=1e-6)), est[0, 0].item()
    (True, 0.0)

    """
    who = "attribution_patch"
    check_recorder(rnet, who)
    labels = select_calls_in_order(rnet, layers, who)
    check_callable(metric, "metric", who, "lambda out: out.loss")
    wanted = as_positions(positions, "positions", who)
    check_pair(clean, corrupted, ("clean", "corrupted"), who)
    refuse_gradients(rnet.net, who)
    clean_run = cache_run(rnet, clean, labels)
    sources = {
        label: stream_of(rnet, label, clean_run.activations[label], who)
        for label in labels
    }
    columns = grid_columns(rnet, wanted, sources, who)
    kept: dict[DepthIdx, Tensor] = {}

    def keep(label: DepthIdx) -> Callable[[Any], Any]:
        def edit(output: Any) -> Any:
            stream = stream_of(rnet, label, output, "attribution_patch")
            if not stream.requires_grad:  # no parameter before it needs grad
                stream = stream.detach().requires_grad_(True)  # noqa: FBT003
                kept[label] = stream
                return with_stream(output, stream)
            kept[label] = stream
            return None

        return edit

    edits = {label: keep(label) for label in labels}
    with rnet.selecting(*labels), torch.enable_grad():
        output = run_net(
            rnet,
            corrupted,
            activation_postproc=in_call_order(rnet, edits),
            dont_record=True,
        )
        value = one_number(metric(output), "attribution_patch", "metric")
        acts = [kept[label] for label in labels]
        grads = torch.autograd.grad(value, acts, allow_unused=True)
    rows = []
    for label, act, grad in zip(labels, acts, grads, strict=True):
        source = sources[label]
        check_like(rnet, label, act, source, "attribution_patch")
        # None: the metric does not depend on this call
        slope = torch.zeros_like(act) if grad is None else grad
        product = (source - act.detach()) * slope
        rows.append(product.sum(0).flatten(1).sum(1))
    return torch.stack([row[columns] for row in rows])
