"""The bridge to torchinfo: its rows, its statistics, and the patches of one summary.

torchinfo 1.8 gives the reference pass its rows (:class:`Row`, a
``LayerInfo`` that counts each parameter once, on the row it is assigned
to: :func:`assign_params`) and its printed table (the statistics of
:func:`restatistics`, totalled here in linear time, each parameter once,
units printed the same on every Python). :func:`summary_patches` patches
torchinfo for the duration of one summary: sizes of nested tensors
(:func:`nested_size`, :class:`RaggedDim`), no statistics of its own, no
hooks of its own (the reference pass logs the calls itself, see
:mod:`._reference`).
"""

from __future__ import annotations

__all__ = [
    "SUMMARY_OPTIONS",
    "RaggedDim",
    "Row",
    "assign_params",
    "nested_size",
    "restatistics",
    "summary_patches",
]

import contextlib
import inspect
import threading
from typing import TYPE_CHECKING, Any

import torchinfo
import torchinfo.torchinfo as _torchinfo_impl
from torch import Tensor
from torch.nn.parameter import is_lazy
from torchinfo.enums import Units
from torchinfo.formatting import FormattingOptions
from torchinfo.layer_info import LayerInfo
from torchinfo.model_statistics import ModelStatistics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from torch import nn


class Row(LayerInfo):
    """A torchinfo row with call-aware parameter accounting.

    torchinfo counts a non-leaf row's parameters as "its parameters minus
    those of the rows listed under it", which double counts when the calls of
    a module's children are not listed under it (a module passed as an
    argument and called elsewhere, a module calling itself). Here each
    parameter is *assigned* once, to the first row of the nearest module
    (itself or an ancestor) that has a row; a row shows and totals count its
    assigned parameters. Where the table is a plain tree of calls this is
    exactly torchinfo's count. A parameter held by several modules (tied
    weights) is assigned once too, and *shown* (``shown``, the compact table)
    on the row of each module holding it. A container row (not a call) also
    prints a note after its label.
    """

    note = ""
    is_container = False
    assigned = 0
    assigned_trainable = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # parameters the compact table shows on this row: id -> (count,
        # trainable); a parameter held by several modules (tied weights) is
        # shown on the row of each of them
        self.shown: dict[int, tuple[int, bool]] = {}

    def get_layer_name(self, show_var_name: bool, show_depth: bool) -> str:  # noqa: FBT001 (torchinfo's signature)
        name: str = super().get_layer_name(show_var_name, show_depth)
        return f"{name} {self.note}" if self.note else name

    def leftover_params(self) -> int:
        return self.assigned

    def leftover_trainable_params(self) -> int:
        return self.assigned_trainable

    def num_params_to_str(self, reached_max_depth: bool) -> str:  # noqa: FBT001 (torchinfo's signature)
        if self.is_container:
            return f"{self.assigned:,}" if self.assigned else "--"
        return str(super().num_params_to_str(reached_max_depth))

    def params_percent(
        self,
        total_params: int,
        reached_max_depth: bool,  # noqa: FBT001 (torchinfo's signature)
        precision: int = 2,
    ) -> str:
        if self.is_container:
            if not self.assigned or not total_params:
                return f"{' ' * 5}--"
            return f"{self.assigned / total_params:>{precision + 5}.{precision}%}"
        return str(super().params_percent(total_params, reached_max_depth, precision))


def assign_params(net: nn.Module, rows: list[Row]) -> tuple[tuple[str, ...], ...]:
    """Assign each parameter of ``net`` to one row (see :class:`Row`).

    Each parameter is counted as torchinfo counts it (a pruned weight by its
    mask, a lazy one not at all). Return the qualified names of each
    parameter held by several modules (tied weights), one tuple a parameter.
    """
    row_of = _row_finder(net, rows)
    names = {module: name for name, module in net.named_modules()}
    holders: dict[int, tuple[nn.Parameter, int, list[tuple[nn.Module, str]]]] = {}
    for module in net.modules():
        for name, param in module.named_parameters(recurse=False):
            if not is_lazy(param):
                count, _ = LayerInfo.get_param_count(module, name, param)
                entry = holders.setdefault(id(param), (param, count, []))
                entry[2].append((module, name))
    shared = []
    for key, (param, count, held) in holders.items():
        shown = [row for row in (row_of(module) for module, _ in held) if row]
        if shown:
            shown[0].assigned += count
            shown[0].assigned_trainable += count if param.requires_grad else 0
        for row in shown:
            row.shown[key] = (count, param.requires_grad)
        if len(held) > 1:
            shared.append(tuple(_qualified(names[m], name) for m, name in held))
    return tuple(shared)


def _row_finder(net: nn.Module, rows: list[Row]) -> Callable[[nn.Module], Row | None]:
    """Return ``row_of(module)``: the first row of ``module`` or of an ancestor."""
    first: dict[nn.Module, Row] = {}
    for row in rows:
        first.setdefault(row.module, row)
    parents: dict[nn.Module, nn.Module] = {}
    for module in net.modules():
        for child in module.children():
            parents.setdefault(child, module)

    def row_of(module: nn.Module) -> Row | None:
        holder: nn.Module | None = module
        while holder is not None and holder not in first:
            holder = parents.get(holder)
        return None if holder is None else first[holder]

    return row_of


def _qualified(module_name: str, name: str) -> str:
    return f"{module_name}.{name}" if module_name else name


class RaggedDim(int):
    """A ragged dimension of a nested tensor in a row's sizes, shown ``<=n``.

    Its value is the largest size of that dimension over the nested tensor's
    components, so byte counts and mult-adds computed from the sizes are
    those of the padded tensor: upper bounds.

    Examples
    --------
    >>> [3, RaggedDim(5), 16]
    [3, <=5, 16]

    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<={int(self)}"

    __str__ = __repr__


def nested_size(tensor: Tensor) -> list[int]:
    """Return the sizes of a nested tensor, a ragged dimension as a :class:`RaggedDim`.

    Examples
    --------
    >>> import torch
    >>> nt = torch.nested.nested_tensor([torch.zeros(2, 4), torch.zeros(3, 4)])
    >>> nested_size(nt)
    [2, <=3, 4]

    """
    parts = tensor.unbind()
    sizes: list[int] = []
    for dim in range(tensor.dim()):
        if dim == 0:
            sizes.append(len(parts))
            continue
        lengths = {int(part.shape[dim - 1]) for part in parts}
        if len(lengths) == 1:
            sizes.append(lengths.pop())
        else:
            sizes.append(RaggedDim(max(lengths, default=0)))
    return sizes


_LOCK = threading.Lock()


class _Unsummed(ModelStatistics):
    """torchinfo's statistics object, without torchinfo's statistics.

    :func:`torchinfo.summary` totals its rows in ``ModelStatistics.__init__``
    through ``LayerInfo.leftover_params``, which recurses into every
    descendant of a row *and* each of their descendants: its work doubles with
    each level of nesting (a ``Linear`` in 30 nested ``Sequential`` would take
    hours). :func:`build_table` only keeps the formatting and the input sizes
    of that object and totals its own rows (:func:`restatistics`, linear), so
    during the reference pass torchinfo builds this instead.
    """

    def __init__(
        self,
        summary_list: list[LayerInfo],
        input_size: Any,
        total_input_size: int,
        formatting: FormattingOptions,
    ) -> None:
        self.summary_list = summary_list
        self.input_size = input_size
        self.formatting = formatting
        self.total_input = total_input_size
        self.total_mult_adds = 0
        self.total_params, self.trainable_params = 0, 0
        self.total_param_bytes, self.total_output_bytes = 0, 0


@contextlib.contextmanager
def summary_patches(rows: list[Row]) -> Iterator[None]:
    """Patch torchinfo for the duration of one summary; put it back on exit.

    * torchinfo sizes a call's inputs and outputs with
      ``LayerInfo.calculate_size``, which fails on a nested tensor (the
      padded-batch fast path of ``nn.TransformerEncoder`` in eval mode passes
      them between its layers). A nested tensor (or a tuple starting with one,
      as torchinfo sizes a call's inputs by the first) is sized by
      :func:`nested_size`; another tensor, or a sequence starting with one,
      as torchinfo sizes it, without reading its ``.data`` (an operator
      call); everything else goes to torchinfo's own function.
    * ``torchinfo.summary`` builds an :class:`_Unsummed` instead of its
      exponential-time statistics.
    * torchinfo registers no hooks of its own: :class:`_CallLog` logs every
      call and builds the rows (``rows``), which torchinfo's own rows would
      only duplicate (at about the cost of the forward on a net of small
      layers). torchinfo's error message after a failed pass ("Executed
      layers up to: ...") lists ``rows``.
    """
    with _LOCK:
        original = LayerInfo.__dict__["calculate_size"]
        calculate = original.__func__
        statistics = _torchinfo_impl.ModelStatistics  # type: ignore[attr-defined]
        hooked = {
            name: getattr(_torchinfo_impl, name)
            for name in (
                "apply_hooks",
                "add_missing_container_layers",
                "set_children_layers",
            )
        }

        def apply_hooks(
            *_args: Any,
        ) -> tuple[list[Row], dict[int, Any], dict[int, Any]]:
            return rows, {}, {}

        def calculate_size(inputs: Any, batch_dim: int | None) -> tuple[list[int], int]:
            first = inputs[0] if isinstance(inputs, list | tuple) and inputs else inputs
            if isinstance(first, Tensor):
                if first.is_nested:
                    return nested_size(first), first.element_size()
                # torchinfo's own result, without its `.data`, an operator
                # call per row that a dispatch mode (the static-flow check's)
                # would see: a tensor's size, or a sequence's first tensor's
                # with the batch dimension set to 1
                size = list(first.size())
                if first is not inputs and batch_dim is not None:
                    size = [*size[:batch_dim], 1, *size[batch_dim + 1 :]]
                return size, first.element_size()
            size, elem_bytes = calculate(inputs, batch_dim)
            return size, elem_bytes

        LayerInfo.calculate_size = staticmethod(calculate_size)  # type: ignore[method-assign]
        _torchinfo_impl.ModelStatistics = _Unsummed  # type: ignore[attr-defined]
        _torchinfo_impl.apply_hooks = apply_hooks  # type: ignore[assignment]
        _torchinfo_impl.add_missing_container_layers = _ignore
        _torchinfo_impl.set_children_layers = _ignore
        try:
            yield
        finally:
            LayerInfo.calculate_size = original  # type: ignore[method-assign]
            _torchinfo_impl.ModelStatistics = statistics  # type: ignore[attr-defined]
            for name, function in hooked.items():
                setattr(_torchinfo_impl, name, function)


def _ignore(summary_list: list[LayerInfo]) -> None:
    """Stand in for torchinfo's steps on its own rows (see ``summary_patches``)."""


SUMMARY_OPTIONS = frozenset(inspect.signature(torchinfo.summary).parameters) - {
    "kwargs"
}


def restatistics(
    summary: ModelStatistics, rows: list[Row], shared: tuple[tuple[str, ...], ...]
) -> _Statistics:
    """Return torchinfo statistics over the rebuilt ``rows``."""
    counters: dict[int, int] = {}
    for info in rows:
        counters[info.depth] = counters.get(info.depth, 0) + 1
        info.depth_index = counters[info.depth]
    # A row's children (as torchinfo's `get_children_layers` finds them) are
    # the rows after it, up to the next row at its depth or above: close the
    # open rows with a stack, in one pass.
    ends = [len(rows)] * len(rows)
    open_rows: list[int] = []
    for index, info in enumerate(rows):
        while open_rows and rows[open_rows[-1]].depth >= info.depth:
            ends[open_rows.pop()] = index
        open_rows.append(index)
    for index, info in enumerate(rows):
        info.children = list(rows[index + 1 : ends[index]])
    old = summary.formatting
    formatting = FormattingOptions(
        old.max_depth, old.verbose, old.col_names, old.col_width, old.row_settings
    )
    formatting.params_units = old.params_units
    formatting.macs_units = old.macs_units
    return _Statistics(
        list(rows), summary.input_size, summary.total_input, formatting, shared
    )


class _Statistics(ModelStatistics):
    """torchinfo's statistics, each parameter counted once, units printed right.

    * torchinfo totals a leaf row's parameters with *all* the parameters of
      its module, so a parameter held by several modules (tied weights: a
      language model's embedding and output layer) is counted once per
      module. The totals here (``total_params``, ``trainable_params`` and the
      bytes of ``Params size``) count each parameter once; the rows still
      show torchinfo's per-module counts, a tied weight on each module.
      Without tied weights the totals are torchinfo's.
    * torchinfo 1.8 formats its ``Units`` (a ``str`` enum) with
      ``f"{units}"``, which prints ``Units.MEGABYTES`` instead of ``M`` from
      Python 3.11 on (enum formatting changed); the printed footer is mended
      here so that it reads the same on every Python version.
    """

    def __init__(
        self,
        summary_list: list[LayerInfo],
        input_size: Any,
        total_input_size: int,
        formatting: FormattingOptions,
        shared: tuple[tuple[str, ...], ...] = (),
    ) -> None:
        super().__init__(summary_list, input_size, total_input_size, formatting)
        self.shared_params = shared
        """The qualified names of each parameter held by several modules."""
        rows = [row for row in summary_list if isinstance(row, Row)]
        if len(rows) != len(summary_list):  # pragma: no cover (always Row)
            return
        self.total_params = sum(row.assigned for row in rows)
        self.trainable_params = sum(row.assigned_trainable for row in rows)
        # torchinfo's bytes: the leaf rows' parameters, here each one once
        seen: set[int] = set()
        self.total_param_bytes = 0
        for row in rows:
            if not row.is_leaf_layer or row.is_recursive:
                continue
            for name, param in row.module.named_parameters():
                if id(param) in seen or is_lazy(param):
                    continue
                seen.add(id(param))
                count, _ = LayerInfo.get_param_count(row.module, name, param)
                self.total_param_bytes += param.element_size() * count

    def __repr__(self) -> str:
        text = super().__repr__()
        for unit in Units:
            text = text.replace(f"({Units.__name__}.{unit.name})", f"({unit.value})")
        return text
