"""The patching grid, layers x positions, batched."""

from __future__ import annotations

__all__ = ["patch_sweep"]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._batches import first_batch_size
from scio_recorder._engine.state import CallInputs
from scio_recorder._tree import map_tensors

from ._base import (
    arguments,
    check_like,
    in_call_order,
    one_number,
    position_list,
    run_net,
    select_calls_in_order,
    stream_of,
    with_stream,
)
from ._patching import cache_run

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def _batch_size(inputs: Any, who: str) -> int:
    """Return dim 0 of the first tensor among the inputs, or raise naming them."""
    size = first_batch_size(*arguments(inputs))
    if size is not None:
        return size
    msg = (
        f"{who}: the inputs hold no tensor with a batch dimension "
        f"({type(inputs).__name__}); pass a tensor, a tuple of positional "
        "arguments or a mapping of keyword arguments (e.g. a tokenizer's output)."
    )
    raise ValueError(msg)


def _repeat(inputs: Any, times: int, batch: int) -> Any:
    """Repeat every argument tensor with ``batch`` rows ``times`` along dim 0.

    Row ``k * batch + i`` is row ``i``; other arguments (a ``[1, T]``
    ``position_ids`` when ``batch > 1``, flags, ...) are passed as they are.
    """

    def rep(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch:
            return value.repeat(times, *[1] * (value.dim() - 1))
        return value

    args, kwargs = arguments(inputs)
    return CallInputs(
        tuple(rep(v) for v in args), {k: rep(v) for k, v in kwargs.items()}
    )


def _sweep_edit(
    rnet: Recorder,
    label: DepthIdx,
    clean: Tensor,
    cells: list[tuple[int, int]],
    batch: int,
) -> Callable[[Any], Any]:
    """Put ``clean[:, p]`` at rows ``k * batch ...`` of each cell ``(k, p)``."""

    def edit(output: Any) -> Any:
        if not cells:
            return None
        stream = stream_of(rnet, label, output, "patch_sweep")
        check_like(rnet, label, stream, clean, "patch_sweep")
        edited = stream.clone()
        for k, position in cells:
            edited[k * batch : (k + 1) * batch, position] = clean[:, position]
        return with_stream(output, edited)

    return edit


def _cell_output(output: Any, k: int, batch: int, rows: int) -> Any:
    """Return the part of a batched output that belongs to cell ``k``.

    Every tensor with ``rows`` rows is cut to the cell's ``batch`` rows; any
    other tensor (a loss averaged over all the rows) becomes ``None``.
    """

    def cut(value: Tensor) -> Tensor | None:
        if value.dim() >= 1 and value.shape[0] == rows:
            return value[k * batch : (k + 1) * batch]
        return None

    return map_tensors(cut, output)


def patch_sweep(  # noqa: PLR0913 (keyword-only options)
    rnet: Recorder,
    clean: Any,
    corrupted: Any,
    layers: Selector | Sequence[Selector],
    metric: Callable[[Any], Tensor],
    *,
    positions: Iterable[int] | None = None,
    max_batch: int | None = None,
) -> Tensor:
    """Return the activation-patching grid: ``metric`` per layer and position.

    Cell ``[i, j]`` is ``metric`` of the net's output on ``corrupted`` with
    the output of layer ``i`` at position ``j`` (``output[:, j]``, every
    sample of the batch) taken from the run on ``clean``. The grid runs
    batched: one pass on ``clean``, then the corrupted inputs repeated along
    the batch dimension once per cell, each copy patched at its own cell:
    one pass for the whole grid, or ``ceil(cells * batch / max_batch)``
    passes of at most ``max_batch`` rows. The results equal a loop of single
    patched runs up to the rounding of batched matrix products (a few ulps).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its mode is used as is: call ``net.eval()`` first).
    clean, corrupted : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`), of one shape. Every
        argument tensor whose first dimension is the batch size is repeated;
        the others (flags, a ``[1, T]`` ``position_ids``) are passed as is.
    layers : selector or list of selectors
        The grid's rows: every call each selector selects, in the order given
        (a label ``(depth, idx)`` names one call of a reused module). Each
        call outputs ``[batch, positions, ...]``, or a tuple starting with
        such a tensor (the residual stream of a block).
    metric : callable
        ``metric(output) -> scalar tensor``, e.g. ``lambda out:
        (out.logits[:, -1, good] - out.logits[:, -1, bad]).mean()``. It sees
        the output of one cell's copy of the batch: tensors with the batch
        dimension are cut to it, other tensors are ``None`` (a loss averaged
        over the whole batched pass means nothing per cell: compute it from
        the logits).
    positions : iterable of int, optional
        The grid's columns: indices along dimension 1 of the outputs; default
        every position of the first layer's output.
    max_batch : int, optional
        The most rows in one patched pass (at least one cell's batch); default
        the whole grid in one pass.

    Returns
    -------
    Tensor
        ``[len(layers), len(positions)]``, float, detached.

    Raises
    ------
    ValueError
        If ``metric`` does not return one number, if clean and corrupted
        outputs differ in shape, or if ``max_batch`` is below the batch size.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    >>> clean = torch.tensor([[1, 2, 3, 4, 5]])
    >>> corrupted = torch.tensor([[1, 2, 9, 4, 5]])
    >>> grid = patch_sweep(rnet, clean, corrupted, ["0", "1"], lambda out: out[0, 2, 0])
    >>> grid.shape
    torch.Size([2, 5])
    >>> with torch.no_grad():
    ...     bool(grid[0, 2] == net(clean)[0, 2, 0])  # position 2 restored
    True

    """
    labels = select_calls_in_order(rnet, layers, "patch_sweep")
    batch = _batch_size(corrupted, "patch_sweep")
    clean_run = cache_run(rnet, clean, labels)
    streams = {
        label: stream_of(rnet, label, clean_run.activations[label], "patch_sweep")
        for label in labels
    }
    columns = position_list(positions, streams[labels[0]].shape[1])
    cells = [(i, j) for i in range(len(labels)) for j in range(len(columns))]
    per_pass = len(cells) if max_batch is None else max_batch // batch
    if per_pass < 1:
        msg = (
            f"patch_sweep: `max_batch={max_batch}` is below the batch size "
            f"{batch} of the inputs: allow at least one copy of the batch."
        )
        raise ValueError(msg)
    grid = torch.empty(len(labels), len(columns), dtype=torch.float64)
    with rnet.selecting(*labels), torch.no_grad():
        for start in range(0, len(cells), per_pass):
            chunk = cells[start : start + per_pass]
            edits = {
                label: _sweep_edit(
                    rnet,
                    label,
                    streams[label],
                    [(k, columns[j]) for k, (i, j) in enumerate(chunk) if i == row],
                    batch,
                )
                for row, label in enumerate(labels)
            }
            rows = len(chunk) * batch
            output = run_net(
                rnet,
                _repeat(corrupted, len(chunk), batch),
                activation_postproc=in_call_order(rnet, edits),
                dont_record=True,
            )
            for k, (i, j) in enumerate(chunk):
                value = metric(_cell_output(output, k, batch, rows))
                grid[i, j] = one_number(value, "patch_sweep", "metric").double()
    return grid.to(torch.get_default_dtype())
