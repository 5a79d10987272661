"""The patching grid, layers x positions: a block stack's prefix run once, or batched.

Both ways repeat the corrupted inputs along the batch dimension, one copy per
cell of a pass, each copy patched at its own cell; on a block stack
(``_prefix``) the blocks before the patched call are answered from one
corrupted run, one pass per row of the grid.
"""

from __future__ import annotations

__all__ = ["patch_sweep"]

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scio_recorder._engine.plan import reshaping
from scio_recorder._engine.state import CallInputs
from scio_recorder._support.tree import map_tensors

from ._base import (
    arguments,
    as_positions,
    check_callable,
    check_flag,
    check_like,
    check_max_batch,
    check_pair,
    check_positions,
    check_recorder,
    find_module,
    grid_columns,
    in_call_order,
    one_number,
    run_keeping,
    run_net,
    select_calls_in_order,
    stream_of,
    with_stream,
)
from ._prefix import answered_blocks, answering, capturing, find_stack

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from scio_recorder.layers import DepthIdx, Layer
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def _copies(times: int, batch: int) -> Callable[[Any], Any]:
    """Return a function repeating a tensor of ``batch`` rows ``times`` along dim 0.

    Row ``k * batch + i`` is row ``i``; anything else (a ``[1, T]``
    ``position_ids`` when ``batch > 1``, flags, ...) is returned as it is.
    ``repeat`` copies: each call gives new tensors.
    """

    def rep(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch:
            return value.repeat(times, *[1] * (value.dim() - 1))
        return value

    return rep


def _repeat(inputs: Any, times: int, batch: int) -> CallInputs:
    """Return the net's inputs with every argument tensor repeated (:func:`_copies`)."""
    rep = _copies(times, batch)
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
    read_at: Iterable[int] | None = None,
    unembed: nn.Module | Selector | None = None,
    max_batch: int | None = None,
    reuse_prefix: bool = True,
) -> Tensor:
    """Return the activation-patching grid: ``metric`` per layer and position.

    Cell ``[i, j]`` is ``metric`` of the net's output on ``corrupted`` with
    the output of layer ``i`` at position ``j`` (``output[:, j]``, every
    sample of the batch) taken from the run on ``clean``.

    A cell re-runs only what its patch changes where the net allows it: a
    stack of blocks (an ``nn.ModuleList`` whose modules each run once per
    pass: GPT-2's ``transformer.h``, Llama's ``model.layers``), in eval
    mode. One pass on ``clean`` keeps the patched layers' outputs, one pass
    on ``corrupted`` keeps every block's output, and each cell's pass answers
    the blocks that end before the patched call from that cache: only the
    blocks after it run. One pass per row of the grid, its cells repeated
    along the batch dimension (or passes of at most ``max_batch`` rows).
    Elsewhere (no stack, a net in training mode, ``reuse_prefix=False``),
    one pass on ``clean``, then the corrupted inputs repeated once per cell,
    each copy patched at its own cell: one pass for the whole grid, or
    passes of at most ``max_batch`` rows.

    A pass of one cell (``max_batch`` = the batch size) on a block stack runs
    the same operations on the same tensors as a patched run of its own: the
    cells equal a loop of hooked runs bit for bit. Several cells in a pass
    equal it up to the rounding of batched matrix products (a few ulps).

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
    read_at : iterable of int, optional
        The positions the metric reads: the unembedding runs at these only
        (its input cut to ``[:, read_at]``), in every pass, so the metric
        sees the logits at these positions, in this order (``out.logits[:,
        k]`` is position ``read_at[k]``), as with Hugging Face's
        ``logits_to_keep``. Default: every position.
    unembed : module or selector, optional
        The unembedding ``read_at`` cuts the input of (one call of a module
        of the net); default found as :func:`logit_lens` finds it
        (``lm_head``, or ``get_output_embeddings()``).
    max_batch : int, optional
        The most rows in one patched pass (at least one cell's batch);
        default one row of the grid per pass on a block stack, else the whole
        grid in one pass.
    reuse_prefix : bool, default True
        Answer the blocks before a patch from the corrupted run on a block
        stack: an answered block gives what its own ``forward`` returned
        there, and every hook on it (the user's forward hooks and pre-hooks,
        global ones, accelerate's) runs around the answer as around a real
        call, so the grid is the one of ``False``. ``False`` runs every block
        of every cell (for a net whose blocks leave something other than
        their output to later layers, e.g. a key/value cache shared across
        layers, or a hook on a block whose result changes from pass to pass).

    Returns
    -------
    Tensor
        ``[len(layers), len(positions)]``, float (the default dtype),
        detached, on the device of what ``metric`` returns (a model on a GPU
        gives the grid on the GPU, without a copy to the host per cell).

    Raises
    ------
    TypeError
        Before any pass, naming the argument: ``rnet`` is not a
        :class:`~scio_recorder.Recorder`, ``metric`` is not callable,
        ``positions`` or ``read_at`` is not an iterable of ints, ``max_batch``
        is not an int, ``reuse_prefix`` not a bool.
    ValueError
        Before any pass: ``layers`` selects nothing, ``clean`` and
        ``corrupted`` differ in batch size, ``positions`` or ``read_at`` is
        empty, ``max_batch`` is below the batch size. After the clean pass,
        before the grid: a position out of range of a layer's output (or of
        the unembedding's input, for ``read_at``). During the grid: clean
        and corrupted outputs differ in shape, or ``metric`` does not return
        one number.

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
    >>> with torch.no_grad():  # position 2 restored (a batched sweep: float32
    ...     # rounding may differ from the one-row run in the last bits)
    ...     bool(torch.isclose(grid[0, 2], net(clean)[0, 2, 0], rtol=1e-5, atol=1e-6))
    True

    """
    who = "patch_sweep"
    check_recorder(rnet, who)
    labels = select_calls_in_order(rnet, layers, who)
    check_callable(metric, "metric", who, _METRIC_EXAMPLE)
    wanted = as_positions(positions, "positions", who)
    batch = check_pair(clean, corrupted, ("clean", "corrupted"), who)
    check_max_batch(max_batch, batch, who)
    check_flag(reuse_prefix, "reuse_prefix", who)
    reading = _reading(rnet, as_positions(read_at, "read_at", who), unembed)
    _, kept = run_keeping(rnet, clean, labels, input_postproc=reading)
    streams = {label: stream_of(rnet, label, kept[label], who) for label in labels}
    columns = grid_columns(rnet, wanted, streams, who)
    stack = find_stack(rnet) if reuse_prefix else None
    answered = {
        label: answered_blocks(stack, rnet.table[label]) if stack else ()
        for label in labels
    }
    sweep = _Sweep(rnet, corrupted, batch, streams, metric, reading)
    if any(answered.values()):
        return sweep.from_prefix(labels, columns, answered, max_batch)
    return sweep.batched(labels, columns, max_batch)


_METRIC_EXAMPLE = "lambda out: (out.logits[:, -1, 7] - out.logits[:, -1, 11]).mean()"


def _reading(
    rnet: Recorder, read_at: list[int] | None, unembed: nn.Module | Selector | None
) -> dict[Any, Callable[[Tensor], Tensor]] | None:
    """Return the ``input_postproc`` cutting the unembedding's input to ``read_at``."""
    if read_at is None:
        return None
    module = find_module(rnet, unembed, "unembed", "patch_sweep")
    calls = rnet.table.call_plan(module)
    if len(calls) != 1:
        msg = (
            f"patch_sweep: `read_at=` cuts the input of the unembedding, but "
            f"{type(module).__name__} runs {len(calls)} times in a pass: name "
            "the call to cut with `unembed=` (its label)."
        )
        raise ValueError(msg)
    index = torch.tensor(read_at)
    where = f"the unembedding's input, {calls[0].describe()}"

    def cut(hidden: Tensor) -> Tensor:
        length = hidden.shape[1] if hidden.dim() > 1 else 0
        check_positions(read_at, length, "read_at", "patch_sweep", where)
        return hidden[:, index.to(hidden.device)]

    return {calls[0].label: reshaping(cut)}  # fewer positions: on purpose


@dataclasses.dataclass(frozen=True)
class _Sweep:
    """The passes of one grid: what every pass of the sweep shares."""

    rnet: Recorder
    corrupted: Any
    batch: int
    streams: dict[DepthIdx, Tensor]
    metric: Callable[[Any], Tensor]
    reading: dict[Any, Callable[[Tensor], Tensor]] | None

    def run(
        self,
        labels: Sequence[DepthIdx],
        cells: list[tuple[int, int]],
        columns: list[int],
        values: dict[tuple[int, int], Tensor],
        first_row: int = 0,
    ) -> None:
        """Run ``cells`` (``(row, column)``) in one pass; keep their metric.

        Each value stays where ``metric`` left it (a GPU's tensor on the GPU:
        no copy to the host, so no wait for the device, per cell).
        """
        rnet, batch = self.rnet, self.batch
        edits = {
            label: _sweep_edit(
                rnet,
                label,
                self.streams[label],
                [(k, columns[j]) for k, (i, j) in enumerate(cells) if i == row],
                batch,
            )
            for row, label in enumerate(labels)
        }
        rows = len(cells) * batch
        output = run_net(
            rnet,
            _repeat(self.corrupted, len(cells), batch),
            activation_postproc=in_call_order(rnet, edits),
            dont_record=True,
            input_postproc=self.reading,
        )
        for k, (i, j) in enumerate(cells):
            value = self.metric(_cell_output(output, k, batch, rows))
            number = one_number(value, "patch_sweep", "metric").detach()
            values[first_row + i, j] = number.to(torch.get_default_dtype())

    def batched(
        self, labels: list[DepthIdx], columns: list[int], max_batch: int | None
    ) -> Tensor:
        """Every cell a copy of the corrupted inputs, every block run."""
        cells = [(i, j) for i in range(len(labels)) for j in range(len(columns))]
        per_pass = len(cells) if max_batch is None else max_batch // self.batch
        values: dict[tuple[int, int], Tensor] = {}
        with self.rnet.selecting(*labels), torch.no_grad():
            for start in range(0, len(cells), per_pass):
                self.run(labels, cells[start : start + per_pass], columns, values)
        return _grid(values, len(labels), len(columns))

    def from_prefix(
        self,
        labels: list[DepthIdx],
        columns: list[int],
        answered: dict[DepthIdx, tuple[Layer, ...]],
        max_batch: int | None,
    ) -> Tensor:
        """One pass per row (or chunk of it), the blocks before it answered."""
        rnet, batch = self.rnet, self.batch
        # What each block's own forward returned, not its output after the
        # hooks (a user's hook would then run twice on an answered call).
        blocks = {block.module for row in answered.values() for block in row}
        with rnet.selecting(), capturing(blocks) as prefix, torch.no_grad():
            run_net(rnet, self.corrupted, dont_record=True, input_postproc=self.reading)
        per_pass = len(columns) if max_batch is None else max_batch // batch
        values: dict[tuple[int, int], Tensor] = {}
        for i, label in enumerate(labels):
            with rnet.selecting(label), torch.no_grad():
                for start in range(0, len(columns), per_pass):
                    cells = [
                        (0, j)
                        for j in range(start, min(start + per_pass, len(columns)))
                    ]
                    answers = {
                        block.module: _answer(prefix[block.module], len(cells), batch)
                        for block in answered[label]
                    }
                    with answering(answers):
                        self.run([label], cells, columns, values, i)
        return _grid(values, len(labels), len(columns))


def _grid(values: dict[tuple[int, int], Tensor], rows: int, columns: int) -> Tensor:
    """Return the ``[rows, columns]`` grid of ``values``, where the first one is."""
    device = values[0, 0].device
    cells = [values[i, j].to(device) for i in range(rows) for j in range(columns)]
    return torch.stack(cells).reshape(rows, columns)


def _answer(output: Any, times: int, batch: int) -> Callable[[], Any]:
    """Return a function giving ``output`` repeated ``times`` along the batch.

    Each call gives new tensors, so that an in-place change downstream leaves
    the cache as it was.
    """
    rep = _copies(times, batch)
    return lambda: map_tensors(rep, output)
