"""The layer table: one labelled row per module call of a reference pass.

A :class:`LayerTable` is pure data, built once per :class:`~scio_recorder.Recorder`
by :func:`build_table`. It runs :func:`torchinfo.summary` (which gives the
reference scio Recorder its labels and its printed table) and, during the same
forward pass, logs every module call itself. The rows are rebuilt from that log
because torchinfo 1.8.0 mislabels a few common structures:

* a module instance shared by several blocks is shown under the *last* block
  that declares it, with a phantom copy of that block's row before its first
  call (the reference Recorder then silently records the wrong call);
* containers that never run (``ModuleList``, ``ModuleDict``, a parent whose
  children are called directly) are inserted as rows, and the same row object
  is inserted again for each group of children, so one label is printed twice;
* calls that nest inside a call of the same module are counted by the order in
  which they *end*, not start.

The labelling rule (documented in ``docs/labels.md``):

1. Every module call of the reference pass gives one row, in the order the
   calls start. Its depth is the number of components of the module's
   qualified name (the root net has depth 0). A module registered under several
   names takes the name that continues the enclosing call's name (so a shared
   ``ReLU`` called inside ``b1`` is ``b1.act``, not ``b2.act``).
2. Before a call row whose ancestors (by qualified name) are not the rows just
   above it, a *container row* is inserted for each missing ancestor, as
   torchinfo does. Container rows are not calls: they cannot be recorded.
3. ``idx`` counts rows of the same depth from the top of the table, starting
   at 1. The root net is ``(0, 1)``.

Wherever torchinfo already gives one row per call, this yields exactly
torchinfo's rows and labels, so tables and code written for the reference
Recorder agree.
"""

from __future__ import annotations

__all__ = ["DepthIdx", "Layer", "LayerTable", "build_table"]

import dataclasses
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import torch
import torchinfo
import torchinfo.torchinfo as _torchinfo_impl
from torch import nn
from torchinfo.formatting import FormattingOptions
from torchinfo.layer_info import LayerInfo
from torchinfo.model_statistics import ModelStatistics

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

DepthIdx: TypeAlias = tuple[int, int]
"""A layer label ``(depth, idx)``, printed ``depth-idx`` in the table."""

Mode: TypeAlias = Literal["train", "eval"]

_NOT_CALLED = (
    "it is a container that is never called in the reference pass; only its "
    "submodules run"
)
_NO_OUTPUT = "its call did not return normally in the reference pass"


@dataclasses.dataclass(frozen=True, eq=False)
class Layer:
    """One row of the layer table.

    Attributes
    ----------
    label : DepthIdx
        The ``(depth, idx)`` label, printed ``depth-idx``.
    name : str
        The module's qualified name in the net (``""`` for the net itself),
        as given by :meth:`torch.nn.Module.named_modules`.
    module : torch.nn.Module
        The module this row belongs to.
    call_index : int or None
        Which call of ``module`` this row is (0 for its first call of a pass,
        1 for the second, ...), counted in the order calls start; ``None``
        for container rows, which are not calls.
    recordable : bool
        Whether :meth:`Recorder.record` accepts this label.
    reason : str or None
        Why the row cannot be recorded, ``None`` when it can.
    input_size, output_size : list
        Shapes seen in the reference pass, as torchinfo reports them.
    num_params : int
        Parameters of ``module`` (all of them, as torchinfo counts).

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5))
    >>> layer = rnet.table[(1, 1)]
    >>> layer.name, type(layer.module).__name__, layer.call_index, layer.output_size
    ('0', 'Linear', 0, [1, 4])

    """

    label: DepthIdx
    name: str
    module: nn.Module
    call_index: int | None
    recordable: bool
    reason: str | None
    input_size: list[Any]
    output_size: list[Any]
    num_params: int
    _end_order: int | None = dataclasses.field(default=None, repr=False)

    @property
    def label_str(self) -> str:
        """The label as printed in the table, e.g. ``"1-3"``."""
        return f"{self.label[0]}-{self.label[1]}"

    def describe(self) -> str:
        """Describe the row in words for messages, e.g. ``1-3 (Linear `2`)``."""
        name = f" `{self.name}`" if self.name else " (the whole net)"
        return f"{self.label_str} ({type(self.module).__name__}{name})"


class LayerTable(Mapping[DepthIdx, Layer]):
    """The labelled rows of a reference pass, read-only.

    A mapping from labels to :class:`Layer` rows that iterates in table order.

    Attributes
    ----------
    rows : tuple of Layer
        All rows, in table order (container rows included).
    mode : {"train", "eval"}
        The mode the net was put in for the reference pass (torchinfo's
        ``mode``, ``"eval"`` by default).
    grad_enabled : bool
        Whether gradients were enabled in the reference pass (torchinfo always
        runs it under :func:`torch.no_grad`, so ``False``).
    statistics : torchinfo.model_statistics.ModelStatistics
        The torchinfo summary whose ``repr`` is the printed table.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5))
    >>> [row.label_str for row in rnet.table.values()]
    ['0-1', '1-1', '1-2']
    >>> rnet.table.mode, rnet.table.grad_enabled
    ('eval', False)

    """

    def __init__(
        self,
        rows: tuple[Layer, ...],
        *,
        mode: Mode,
        grad_enabled: bool,
        statistics: ModelStatistics,
    ) -> None:
        self.rows = rows
        self.mode: Mode = mode
        self.grad_enabled = grad_enabled
        self.statistics = statistics
        self._by_label = {row.label: row for row in rows}
        calls: dict[nn.Module, list[Layer]] = {}
        for row in rows:
            if row.call_index is not None:
                calls.setdefault(row.module, []).append(row)
        self._calls = {module: tuple(rows_) for module, rows_ in calls.items()}

    def __getitem__(self, label: DepthIdx) -> Layer:
        """Return the row labelled ``label``."""
        return self._by_label[label]

    def __iter__(self) -> Iterator[DepthIdx]:
        """Iterate over labels in table order."""
        return (row.label for row in self.rows)

    def __len__(self) -> int:
        """Return the number of rows."""
        return len(self.rows)

    def calls_of(self, module: nn.Module) -> tuple[Layer, ...]:
        """Return the call rows of ``module``, in the order the calls start.

        Examples
        --------
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> relu = nn.ReLU()
        >>> net = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> [row.label_str for row in rnet.table.calls_of(relu)]
        ['1-2', '1-4']

        """
        return self._calls.get(module, ())

    def call_plan(self, module: nn.Module) -> tuple[Layer, ...]:
        """Return the recordable calls of ``module`` in the order they *end*.

        Forward hooks fire when a call ends; the k-th firing in a pass is the
        k-th row of this tuple.
        """
        rows = [row for row in self.calls_of(module) if row._end_order is not None]  # noqa: SLF001 (own class)
        rows.sort(key=lambda row: row._end_order or 0)  # noqa: SLF001 (own class)
        return tuple(rows)

    @property
    def mode_description(self) -> str:
        """Say in words how the reference pass ran, for error messages."""
        grad = "enabled" if self.grad_enabled else "disabled"
        return f"{self.mode} mode with gradients {grad}"


class _Row(LayerInfo):  # type: ignore[misc]  # torchinfo is untyped
    """A torchinfo row that can be a container row.

    A container row is not a call: it prints a note after its label, and it
    counts only the module's own parameters (not its submodules', which their
    call rows count), once, so totals and percentages stay right even when a
    container appears several times.
    """

    note = ""
    own_params = 0
    own_trainable = 0

    def make_container(self, *, first: bool) -> None:
        self.note = "(not called)"
        if first:
            own = list(self.module.parameters(recurse=False))
            self.own_params = sum(p.numel() for p in own)
            self.own_trainable = sum(p.numel() for p in own if p.requires_grad)

    def get_layer_name(self, show_var_name: bool, show_depth: bool) -> str:  # noqa: FBT001 (torchinfo's signature)
        name: str = super().get_layer_name(show_var_name, show_depth)
        return f"{name} {self.note}" if self.note else name

    def leftover_params(self) -> int:
        if self.note == "(not called)":
            return self.own_params
        return int(super().leftover_params())

    def leftover_trainable_params(self) -> int:
        if self.note == "(not called)":
            return self.own_trainable
        return int(super().leftover_trainable_params())

    def num_params_to_str(self, reached_max_depth: bool) -> str:  # noqa: FBT001 (torchinfo's signature)
        if self.note == "(not called)":
            return f"{self.own_params:,}" if self.own_params else "--"
        return str(super().num_params_to_str(reached_max_depth))

    def params_percent(
        self,
        total_params: int,
        reached_max_depth: bool,  # noqa: FBT001 (torchinfo's signature)
        precision: int = 2,
    ) -> str:
        if self.note == "(not called)":
            if not self.own_params or not total_params:
                return f"{' ' * 5}--"
            return f"{self.own_params / total_params:>{precision + 5}.{precision}%}"
        return str(super().params_percent(total_params, reached_max_depth, precision))


@dataclasses.dataclass
class _Call:
    """A module call logged during the reference pass."""

    info: _Row
    name: str
    module: nn.Module
    call_index: int
    end_order: int | None = None


class _CallLog:
    """Hooks on every module of a net that log its calls in order."""

    def __init__(self, net: nn.Module, batch_dim: int | None) -> None:
        self.net = net
        self.batch_dim = batch_dim
        self.names: dict[nn.Module, list[str]] = {}
        for name, module in net.named_modules(remove_duplicate=False):
            self.names.setdefault(module, []).append(name)
        # Rows in table order: call rows and inserted container rows.
        self.rows: list[_Row] = []
        self.calls: dict[_Row, _Call] = {}
        self.stack: list[_Call] = []
        self.hierarchy: dict[int, tuple[str, _Row]] = {}  # depth -> name, row
        self.containers: dict[_Row, str] = {}  # container row -> qualified name
        self.shown: set[nn.Module] = set()  # containers with a row already
        self.counts: dict[nn.Module, int] = {}
        self.ends = 0
        self.seen: set[int] = set()

    def install(self) -> list[RemovableHandle]:
        handles = []
        for module in self.names:
            handles.append(module.register_forward_pre_hook(self._pre_hook))
            handles.append(module.register_forward_hook(self._hook))
        return handles

    def _pick_name(self, module: nn.Module) -> str:
        """Choose the qualified name of ``module`` for a call in context."""
        names = self.names[module]
        if len(names) == 1:
            return names[0]
        parent = self.stack[-1].name.split(".") if self.stack else []
        if parent == [""]:
            parent = []

        def score(name: str) -> tuple[bool, int]:
            owner = name.split(".")[:-1]
            common = 0
            for a, b in zip(owner, parent, strict=False):
                if a != b:
                    break
                common += 1
            return common == len(owner), common

        return max(names, key=score)  # max keeps the first of equal scores

    def _new_row(self, name: str, module: nn.Module, depth: int) -> _Row:
        var_name = name.rsplit(".", 1)[-1] if name else type(module).__name__
        parent = self.hierarchy.get(depth - 1)
        info = _Row(var_name, module, depth, parent[1] if parent else None)
        info.calculate_num_params()
        info.check_recursive(self.seen)
        self.seen.add(info.layer_id)
        self.rows.append(info)
        self.hierarchy[depth] = (name, info)
        for deeper in [d for d in self.hierarchy if d > depth]:
            del self.hierarchy[deeper]
        return info

    def _pre_hook(self, module: nn.Module, _args: object) -> None:
        name = self._pick_name(module)
        parts = name.split(".") if name else []
        depth = len(parts)
        for d in range(1, depth):
            ancestor = ".".join(parts[:d])
            shown = self.hierarchy.get(d)
            if shown is None or shown[0] != ancestor:
                container = self.net.get_submodule(ancestor)
                row = self._new_row(ancestor, container, d)
                row.make_container(first=container not in self.shown)
                self.shown.add(container)
                self.containers[row] = ancestor
        info = self._new_row(name, module, depth)
        index = self.counts.get(module, 0)
        self.counts[module] = index + 1
        call = _Call(info, name, module, index)
        self.calls[info] = call
        self.stack.append(call)

    def _hook(self, module: nn.Module, inputs: object, outputs: object) -> None:
        # The innermost open call of this module is the one ending.
        for position in range(len(self.stack) - 1, -1, -1):
            call = self.stack[position]
            if call.module is module:
                del self.stack[position]
                break
        else:  # pragma: no cover - torch pairs pre-hooks and hooks
            return
        info = call.info
        if info.contains_lazy_param:
            info.calculate_num_params()
        info.input_size, _ = info.calculate_size(inputs, self.batch_dim)
        info.output_size, elem_bytes = info.calculate_size(outputs, self.batch_dim)
        info.output_bytes = elem_bytes * _torchinfo_impl.prod(info.output_size)
        info.executed = True
        info.calculate_macs()
        call.end_order = self.ends
        self.ends += 1

    def unwind(self) -> None:
        """Forget calls left open and mark them (their forward raised)."""
        for call in self.calls.values():
            if call.end_order is None:
                call.info.note = "(no output)"
        self.stack.clear()


def build_table(net: nn.Module, summary_kwargs: dict[str, Any]) -> LayerTable:
    """Run the reference pass of ``net`` and return its labelled rows.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        Keyword arguments for :func:`torchinfo.summary`; must contain
        ``input_data`` or ``input_size``.

    Returns
    -------
    LayerTable
        The rows, following the labelling rule of this module's docstring.

    Raises
    ------
    ValueError
        If neither ``input_data`` nor ``input_size`` is given.

    Examples
    --------
    >>> from torch import nn
    >>> table = build_table(nn.Sequential(nn.Linear(2, 2)), {"input_size": (1, 2)})
    >>> list(table)
    [(0, 1), (1, 1)]

    """
    if not {"input_size", "input_data"} & summary_kwargs.keys():
        msg = "You must provide `input_data` or `input_size`"
        raise ValueError(msg)
    kwargs = dict(summary_kwargs)
    if kwargs.get("cache_forward_pass"):
        warnings.warn(
            "`cache_forward_pass=True` is ignored by `Recorder`: torchinfo keys "
            "its cache by class name, so a cached pass could label the modules "
            "of another network. Drop the argument to silence this warning.",
            UserWarning,
            stacklevel=3,
        )
    kwargs["cache_forward_pass"] = False
    verbose = kwargs.get("verbose", 0)
    kwargs["verbose"] = 0
    mode: Mode = "train" if str(kwargs.get("mode", "eval")) == "train" else "eval"

    log = _CallLog(net, kwargs.get("batch_dim"))
    handles = log.install()
    try:
        summary = torchinfo.summary(net, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
        log.unwind()
        # torchinfo stores every pass in a global cache keyed by class name,
        # whatever `cache_forward_pass` says: drop ours so it cannot keep
        # `net` alive (torchinfo issue 369), and leave other entries alone.
        cache = _torchinfo_impl._cached_forward_pass  # noqa: SLF001 (no public API)
        name = type(net).__name__
        if name in cache and any(info.module is net for info in cache[name]):
            del cache[name]

    statistics = _restatistics(summary, log.rows)
    if verbose:
        print(statistics)  # noqa: T201 (the user asked torchinfo to print)
    rows = _to_layers(log)
    return LayerTable(rows, mode=mode, grad_enabled=False, statistics=statistics)


def _restatistics(summary: ModelStatistics, rows: list[_Row]) -> ModelStatistics:
    """Return torchinfo statistics over the rebuilt ``rows``."""
    counters: dict[int, int] = {}
    for index, info in enumerate(rows):
        counters[info.depth] = counters.get(info.depth, 0) + 1
        info.depth_index = counters[info.depth]
        info.children = _torchinfo_impl.get_children_layers(rows, index)
    old = summary.formatting
    formatting = FormattingOptions(
        old.max_depth, old.verbose, old.col_names, old.col_width, old.row_settings
    )
    formatting.params_units = old.params_units
    formatting.macs_units = old.macs_units
    return ModelStatistics(rows, summary.input_size, summary.total_input, formatting)


def _to_layers(log: _CallLog) -> tuple[Layer, ...]:
    layers = []
    for info in log.rows:
        call = log.calls.get(info)
        if call is None:
            layers.append(
                Layer(
                    (info.depth, info.depth_index),
                    log.containers[info],
                    info.module,
                    None,
                    recordable=False,
                    reason=_NOT_CALLED,
                    input_size=[],
                    output_size=[],
                    num_params=info.num_params,
                )
            )
            continue
        layers.append(
            Layer(
                (info.depth, info.depth_index),
                call.name,
                call.module,
                call.call_index,
                recordable=call.end_order is not None,
                reason=None if call.end_order is not None else _NO_OUTPUT,
                input_size=list(info.input_size),
                output_size=list(info.output_size),
                num_params=info.num_params,
                _end_order=call.end_order,
            )
        )
    return tuple(layers)
