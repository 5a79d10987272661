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

__all__ = [
    "DepthIdx",
    "Layer",
    "LayerTable",
    "RaggedDim",
    "as_table",
    "build_table",
    "example_inputs",
    "label_str",
    "nested_size",
    "parse_label",
    "reference_kwargs",
]

import contextlib
import dataclasses
import inspect
import itertools
import math
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, cast, overload

import torch
import torchinfo
import torchinfo.torchinfo as _torchinfo_impl
from torch import Tensor
from torch.nn.parameter import is_lazy
from torchinfo.enums import Units
from torchinfo.formatting import FormattingOptions
from torchinfo.layer_info import LayerInfo, prod
from torchinfo.model_statistics import ModelStatistics

from . import _render
from ._preserve import placed_by_accelerate, preserved
from ._tree import iter_tensors

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.hooks import RemovableHandle

DepthIdx: TypeAlias = tuple[int, int]
"""A layer label ``(depth, idx)``, printed ``depth-idx`` in the table."""


def label_str(label: DepthIdx) -> str:
    """Return ``label`` as printed in the table.

    Examples
    --------
    >>> label_str((1, 3))
    '1-3'

    """
    return f"{label[0]}-{label[1]}"


def parse_label(text: str) -> DepthIdx:
    """Return the label printed as ``text`` (the inverse of :func:`label_str`).

    Examples
    --------
    >>> parse_label("1-3")
    (1, 3)

    """
    depth, _, idx = text.partition("-")
    return int(depth), int(idx)


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
    overwritten : frozenset of str
        What of this call a later in-place operation overwrote in the
        reference pass (version counters): ``"output"``, ``"inputs"``, both
        or neither. A recorder copies those records when it takes them, so
        that they stay exact (see :meth:`Recorder.record`).

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
    overwritten: frozenset[str] = dataclasses.field(default=frozenset(), repr=False)

    @property
    def end_order(self) -> int | None:
        """Rank of this call among the ends of calls in the reference pass.

        Forward hooks fire, and a list of postprocessors is consumed, in this
        order; ``None`` for a row that is not a call.
        """
        return self._end_order

    @property
    def label_str(self) -> str:
        """The label as printed in the table, e.g. ``"1-3"``."""
        return label_str(self.label)

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

    def __str__(self) -> str:
        """Return one line per row: label, qualified name, type, call, shape.

        Examples
        --------
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> relu = nn.ReLU()
        >>> net = nn.Sequential(nn.Linear(5, 4), relu, nn.Sequential(relu))
        >>> print(Recorder(net, input_size=(1, 5)).table)
        label  name  type        call  output shape
        0-1    -     Sequential  0     [1, 4]
        1-1    0     Linear      0     [1, 4]
        1-2    1     ReLU        0     [1, 4]
        1-3    2     Sequential  0     [1, 4]
        2-1    2.0   ReLU        1     [1, 4]

        """
        header = ("label", "name", "type", "call", "output shape")
        lines = [
            (
                row.label_str,
                row.name or "-",
                type(row.module).__name__,
                "-" if row.call_index is None else str(row.call_index),
                str(row.output_size) if row.recordable else f"({row.reason})",
            )
            for row in self.rows
        ]
        widths = [max(len(line[i]) for line in (header, *lines)) for i in range(4)]
        return "\n".join(
            "  ".join(
                [
                    *(
                        cell.ljust(width)
                        for cell, width in zip(line, widths, strict=False)
                    ),
                    line[4],
                ]
            ).rstrip()
            for line in (header, *lines)
        )

    def __repr__(self) -> str:
        """Return ``LayerTable(<n> rows, mode=...)``."""
        return f"LayerTable({len(self.rows)} rows, mode={self.mode!r})"

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

    def compact(
        self,
        width: int = 100,
        *,
        depth: int | None = None,
        marks: Mapping[DepthIdx, str] | None = None,
    ) -> str:
        """Return the table in at most ``width`` columns, one line per row.

        The columns are the label, the qualified name, the type, the output
        shape and the parameters (with thousands separators), then a footer
        with the totals, each parameter counted once. A parameter held by
        several modules (tied weights: a language model's embedding and
        output layer) is shown on the row of each, and the footer names it.
        Where the lines would be too wide, the name, type and shape columns
        are narrowed (the widest first) and their cells cut in the middle
        with an ellipsis (``encoder.l…ut.dense``). The reference
        table, ``print(rnet)``, is unchanged; this one is for terminals,
        notebooks and docs.

        Parameters
        ----------
        width : int
            The most characters a line may have (default 100).
        depth : int, optional
            Show rows down to this depth; a row at the cut counts the
            parameters of the rows hidden under it. Default: the ``depth``
            the table was built with (every depth, unless the recorder was
            given one).
        marks : mapping of label to str, optional
            A short mark per label, shown in a first column ``rec`` (the
            recorder's :meth:`~scio_recorder.Recorder.compact` marks what it
            records).

        Returns
        -------
        str
            The lines, without a trailing newline.

        Raises
        ------
        TypeError
            If ``width`` is not an ``int`` or ``marks`` not a mapping of
            labels to strings (the message names the argument).
        ValueError
            If ``width`` is too small for the label and parameter columns
            plus a few characters of each other column (the message gives the
            smallest width that works), or ``depth`` is not an integer >= 0.

        Examples
        --------
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> relu = nn.ReLU()
        >>> net = nn.Sequential(nn.Linear(5, 4), relu, nn.Sequential(relu))
        >>> print(Recorder(net, input_size=(1, 5)).table.compact())
        label  name  type        output shape  params
        -----  ----  ----------  ------------  ------
        0-1    -     Sequential  [1, 4]             -
        1-1    0     Linear      [1, 4]            24
        1-2    1     ReLU        [1, 4]             -
        1-3    2     Sequential  [1, 4]             -
        2-1    2.0   ReLU        [1, 4]             -
        Total params: 24 (trainable 24)
        5 rows; reference pass in eval mode

        """
        width = _check_width(width)
        header, cells, _, footer = self._cells(depth, marks)
        # names and types are cut before shapes, which read badly cut
        flexible = [
            [header.index("name"), header.index("type")],
            [header.index("output shape")],
        ]
        right = [len(header) - 1]
        lines = _render.text_table(
            header, cells, width=width, flexible=flexible, right=right
        )
        if lines is None:
            smallest = _render.min_width(header, cells, flexible)
            msg = (
                f"width={width} is too narrow for this table: the label and "
                "params columns and a few characters of the name, type and "
                f"output shape columns need {smallest}; give width >= {smallest}"
            )
            raise ValueError(msg)
        lines += [line for text in footer for line in _render.wrap(text, width)]
        return "\n".join(lines)

    def to_html(
        self,
        *,
        depth: int | None = None,
        marks: Mapping[DepthIdx, str] | None = None,
        caption: str = "",
    ) -> str:
        """Return the compact table as an HTML table (what Jupyter shows).

        The columns of :meth:`compact`, never cut; rows with a mark are
        shaded; the totals are the table's footer.

        Parameters
        ----------
        depth, marks
            As for :meth:`compact`.
        caption : str
            The table's caption.

        Examples
        --------
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
        >>> html = rnet.table.to_html(marks={(1, 1): "o"})
        >>> html.count("<tr"), html.count("background-color")
        (5, 1)

        """
        if not isinstance(caption, str):
            msg = f"to_html(caption={caption!r}): give the caption as a str"
            raise TypeError(msg)
        header, cells, marked, footer = self._cells(depth, marks)
        return _render.html_table(
            header,
            cells,
            right=[len(header) - 1],
            highlight=marked,
            caption=caption,
            footer=footer,
        )

    def _repr_html_(self) -> str:
        """Return :meth:`to_html`, for Jupyter."""
        return self.to_html()

    def _cells(
        self, depth: int | None, marks: Mapping[DepthIdx, str] | None
    ) -> tuple[list[str], list[list[str]], list[bool], list[str]]:
        """Return the header, the cells, which rows are marked, the footer."""
        limit = self._depth_limit(depth)
        marks = _check_marks(marks)
        own = self._own_params()
        shown: list[tuple[Layer, dict[int, tuple[int, bool]]]] = []
        for row, params in zip(self.rows, own, strict=True):
            if row.label[0] <= limit:
                shown.append((row, dict(params)))
            elif shown:  # hidden under the last row shown: it counts them
                shown[-1][1].update(params)
        header = ["rec"] if marks else []
        header += ["label", "name", "type", "output shape", "params"]
        cells = []
        for row, params in shown:
            line = [marks.get(row.label, "")] if marks else []
            count = sum(n for n, _ in params.values())
            line += [
                row.label_str,
                row.name or "-",
                type(row.module).__name__,
                _shape_cell(row),
                f"{count:,}" if count else "-",
            ]
            cells.append(line)
        every = {key: value for params in own for key, value in params.items()}
        total = sum(n for n, _ in every.values())
        trainable = sum(n for n, grad in every.values() if grad)
        footer = [f"Total params: {total:,} (trainable {trainable:,})"]
        shared = getattr(self.statistics, "shared_params", ())
        if shared:
            named = [" = ".join(group) for group in shared[:_SHARED_NAMED]]
            if len(shared) > _SHARED_NAMED:
                named.append(f"{len(shared) - _SHARED_NAMED} more")
            footer.append(
                f"Tied weights ({'; '.join(named)}): shown on the row of each "
                "module holding them, counted once in the totals"
            )
        if len(shown) < len(self.rows):
            footer.append(
                f"{len(shown)} of {len(self.rows)} rows (depth <= {limit}; a row "
                "counts the parameters of the rows hidden under it); reference "
                f"pass in {self.mode} mode"
            )
        else:
            footer.append(f"{len(self.rows)} rows; reference pass in {self.mode} mode")
        marked = [bool(marks.get(row.label)) for row, _ in shown]
        return header, cells, marked, footer

    def _depth_limit(self, depth: int | None) -> float:
        if depth is None:
            built = getattr(self.statistics.formatting, "max_depth", None)
            return math.inf if built is None else built
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            msg = (
                f"depth={depth!r} is not a depth: give an integer >= 0 (0: the "
                "whole net as one row), or None for every depth the table has"
            )
            raise ValueError(msg)
        return depth

    def _own_params(self) -> list[dict[int, tuple[int, bool]]]:
        """Return the parameters each row shows: id -> (count, trainable).

        Each parameter is shown once, on the row it is assigned to, and a
        parameter held by several modules (tied weights) also on the row of
        each other module holding it.
        """
        infos = getattr(self.statistics, "summary_list", [])
        if len(infos) == len(self.rows) and all(isinstance(i, _Row) for i in infos):
            return [info.shown for info in infos]
        # a table built by hand: the root's count, as one parameter
        return [
            {id(row): (row.num_params, True)} if row.label[0] == 0 else {}
            for row in self.rows
        ]


class _HoldsTable(Protocol):
    """An object holding a layer table (a Recorder, a Scope)."""

    @property
    def table(self) -> LayerTable: ...  # pragma: no cover (a protocol)


@overload
def as_table(obj: None, who: str = ...) -> None: ...
@overload
def as_table(obj: LayerTable | _HoldsTable, who: str = ...) -> LayerTable: ...
@overload
def as_table(
    obj: Mapping[DepthIdx, Layer] | _HoldsTable | None, who: str = ...
) -> Mapping[DepthIdx, Layer] | None: ...
def as_table(obj: object, who: str = "`table=`") -> Mapping[DepthIdx, Layer] | None:
    """Return the layer table ``obj`` stands for: a table, or what holds one.

    Functions that take "a :class:`LayerTable` or a
    :class:`~scio_recorder.Recorder`" read it through this one helper: an
    object whose ``table`` attribute is a :class:`LayerTable` (a
    ``Recorder``, a ``Scope``) gives that table; a mapping of labels to rows
    (a ``LayerTable`` itself) is returned as it is; ``None`` stays ``None``.
    Duck typed, so that this module needs no import of the recorder.

    Parameters
    ----------
    obj : LayerTable, Recorder, Mapping or None
        The table, or the object holding it.
    who : str, default "`table=`"
        What ``obj`` was passed as, for the error message.

    Returns
    -------
    LayerTable, Mapping or None

    Raises
    ------
    TypeError
        If ``obj`` is none of these; the message names ``who`` and the type.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
    >>> as_table(rnet) is rnet.table, as_table(rnet.table) is rnet.table
    (True, True)
    >>> as_table([1, 2], "`table=` of save_records")
    Traceback (most recent call last):
    ...
    TypeError: `table=` of save_records must be a LayerTable, a Recorder (or an object with a LayerTable as `table`) or None, got a value of type list.

    """  # noqa: E501 (doctest output)
    if obj is None:
        return None
    held = getattr(obj, "table", None)
    if isinstance(held, LayerTable):
        return held
    if isinstance(obj, Mapping):
        return cast("Mapping[DepthIdx, Layer]", obj)
    msg = (
        f"{who} must be a LayerTable, a Recorder (or an object with a "
        f"LayerTable as `table`) or None, got a value of type {type(obj).__name__}."
    )
    raise TypeError(msg)


class _Row(LayerInfo):
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


_NOT_CALLED_NOTE = "(not called)"
_NOT_A_CALL_NOTE = "(not a call)"
_NOT_A_CALL = (
    "this row is not a call: it only groups calls of submodules made outside "
    "the module's own call"
)


_SHORT_REASONS = {
    _NOT_CALLED: "(not called)",
    _NOT_A_CALL: "(not a call)",
    _NO_OUTPUT: "(no output)",
}


_SHARED_NAMED = 3
"""How many shared parameters the compact table's footer names."""


def _check_width(width: object, who: str = "compact") -> int:
    """Return ``width`` if it is an ``int``; raise naming it otherwise.

    (A width too narrow for a table is refused by the table, which knows the
    narrowest width that works.)

    Parameters
    ----------
    width : object
        What the caller gave as ``width``.
    who : str
        The function it was given to, for the message.

    Raises
    ------
    TypeError
        If ``width`` is not an integer (a string, ``None``, a float, a bool).

    Examples
    --------
    >>> _check_width(80)
    80
    >>> _check_width("100")
    Traceback (most recent call last):
    ...
    TypeError: compact(width='100'): give the most characters a line may have as an int, e.g. `compact(width=100)` (the default)

    """  # noqa: E501 (doctest output)
    if isinstance(width, bool) or not isinstance(width, int):
        msg = (
            f"{who}(width={width!r}): give the most characters a line may have "
            f"as an int, e.g. `{who}(width=100)` (the default)"
        )
        raise TypeError(msg)
    return width


def _check_marks(marks: object) -> Mapping[DepthIdx, str]:
    """Return ``marks`` (``None``: none) if it maps labels to strings; else raise."""
    if marks is None:
        return {}
    if not isinstance(marks, Mapping):
        msg = (
            f"marks={marks!r}: give a mapping of labels to short strings, e.g. "
            "`marks={(1, 3): 'o'}`, or None"
        )
        raise TypeError(msg)
    bad = {label: mark for label, mark in marks.items() if not isinstance(mark, str)}
    if bad:
        msg = (
            f"marks: the mark of each label must be a str, got {bad!r}; e.g. "
            "`marks={(1, 3): 'o'}`"
        )
        raise TypeError(msg)
    return cast("Mapping[DepthIdx, str]", marks)


def _shape_cell(row: Layer) -> str:
    """Return the output shape of ``row`` for the compact table, or why none."""
    if not row.recordable:
        return _SHORT_REASONS.get(row.reason or "", "-")
    return str(row.output_size) if row.output_size else "-"


def _assign_params(net: nn.Module, rows: list[_Row]) -> tuple[tuple[str, ...], ...]:
    """Assign each parameter of ``net`` to one row (see :class:`_Row`).

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


def _row_finder(net: nn.Module, rows: list[_Row]) -> Callable[[nn.Module], _Row | None]:
    """Return ``row_of(module)``: the first row of ``module`` or of an ancestor."""
    first: dict[nn.Module, _Row] = {}
    for row in rows:
        first.setdefault(row.module, row)
    parents: dict[nn.Module, nn.Module] = {}
    for module in net.modules():
        for child in module.children():
            parents.setdefault(child, module)

    def row_of(module: nn.Module) -> _Row | None:
        holder: nn.Module | None = module
        while holder is not None and holder not in first:
            holder = parents.get(holder)
        return None if holder is None else first[holder]

    return row_of


def _qualified(module_name: str, name: str) -> str:
    return f"{module_name}.{name}" if module_name else name


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
        self.counts: dict[nn.Module, int] = {}
        self.ends = 0
        self.seen: set[int] = set()
        # The tensors of each call's inputs (when it starts) and output (when
        # it ends) with their version counters, compared once the pass is
        # over: a counter that moved means a later in-place operation
        # overwrote that record (see `overwritten`).
        self.watched: list[tuple[_Row, str, list[Tensor], list[int]]] = []

    def install(self) -> list[RemovableHandle]:
        handles = []
        for module in self.names:
            handles.append(
                module.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
            )
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

        best = max(map(score, names))
        tied = [name for name in names if score(name) == best]
        # A module registered under several names of one parent (a ReLU at
        # positions 1 and 3 of a Sequential) takes them in turn, call by call.
        return tied[self.counts.get(module, 0) % len(tied)]

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

    def _pre_hook(self, module: nn.Module, args: object, kwargs: object) -> None:
        name = self._pick_name(module)
        parts = name.split(".") if name else []
        depth = len(parts)
        for d in range(1, depth):
            ancestor = ".".join(parts[:d])
            shown = self.hierarchy.get(d)
            if shown is None or shown[0] != ancestor:
                container = self.net.get_submodule(ancestor)
                row = self._new_row(ancestor, container, d)
                row.is_container = True
                self.containers[row] = ancestor
        info = self._new_row(name, module, depth)
        index = self.counts.get(module, 0)
        self.counts[module] = index + 1
        call = _Call(info, name, module, index)
        self.calls[info] = call
        self.stack.append(call)
        self._watch(info, "inputs", (args, kwargs))

    def _watch(self, info: _Row, what: str, value: object) -> None:
        tensors = [t for t in iter_tensors(value) if not t.is_inference()]
        if tensors:
            versions = [t._version for t in tensors]  # noqa: SLF001 (version counter)
            self.watched.append((info, what, tensors, versions))

    def overwritten(self) -> dict[_Row, frozenset[str]]:
        """Return, per call, what a later in-place operation overwrote; forget all."""
        found: dict[_Row, set[str]] = {}
        for info, what, tensors, versions in self.watched:
            if [t._version for t in tensors] != versions:  # noqa: SLF001
                found.setdefault(info, set()).add(what)
        self.watched = []
        return {info: frozenset(whats) for info, whats in found.items()}

    def _hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
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
        info.output_bytes = elem_bytes * prod(info.output_size)
        info.executed = True
        info.calculate_macs()
        call.end_order = self.ends
        self.ends += 1
        self._watch(info, "output", outputs)

    def unwind(self) -> None:
        """Forget calls left open; write the notes of rows that are not calls."""
        for call in self.calls.values():
            if call.end_order is None:
                call.info.note = "(no output)"
        for row in self.containers:
            row.note = (
                _NOT_A_CALL_NOTE if row.module in self.counts else _NOT_CALLED_NOTE
            )
        self.stack.clear()


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
    of that object and totals its own rows (:func:`_restatistics`, linear), so
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
def _summary_patches(rows: list[_Row]) -> Iterator[None]:
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
        ) -> tuple[list[_Row], dict[int, Any], dict[int, Any]]:
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
    """Stand in for torchinfo's steps on its own rows (see ``_summary_patches``)."""


_SUMMARY_OPTIONS = frozenset(inspect.signature(torchinfo.summary).parameters) - {
    "kwargs"
}


def example_inputs(
    net: nn.Module, summary_kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return ``(args, kwargs)`` for a pass like the reference pass.

    ``input_data`` is used as given; ``input_size`` makes random tensors as
    torchinfo does (same dtypes, batch dim and device); the summary's other
    keyword arguments that are not torchinfo options go to the net.

    Examples
    --------
    >>> from torch import nn
    >>> args, kwargs = example_inputs(nn.Linear(4, 2), {"input_size": (3, 4)})
    >>> [a.shape for a in args], kwargs
    ([torch.Size([3, 4])], {})

    """
    x, _ = _torchinfo_impl.process_input(
        summary_kwargs.get("input_data"),
        summary_kwargs.get("input_size"),
        summary_kwargs.get("batch_dim"),
        _input_device(net, summary_kwargs),
        summary_kwargs.get("dtypes"),
    )
    kwargs = {k: v for k, v in summary_kwargs.items() if k not in _SUMMARY_OPTIONS}
    if isinstance(x, Mapping):
        return (), {**x, **kwargs}
    return tuple(x or ()), kwargs


def _input_device(net: nn.Module, summary_kwargs: Mapping[str, Any]) -> torch.device:
    """Return where ``input_size`` makes the example inputs.

    ``device`` if given, else the device of the net's first parameter or
    buffer that is not on the ``meta`` device (an offloaded one is), else CPU.
    """
    device = summary_kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for tensor in (*net.parameters(), *net.buffers()):
        if not tensor.is_meta:
            return tensor.device
    return torch.device("cpu")


def reference_kwargs(net: nn.Module, summary_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return torchinfo's arguments for a reference pass that leaves ``net`` in place.

    torchinfo moves the net to ``device`` when given and, when only
    ``input_size`` is, to the first parameter's CUDA device, or CUDA if
    available, or CPU. For a net placed by accelerate (``dispatch_model``,
    ``cpu_offload``, ``disk_offload``, ``from_pretrained(...,
    device_map=...)``) that would undo its device map, and it fails on
    offloaded parameters (on the ``meta`` device). For such a net,
    ``input_size`` becomes ``input_data`` made as torchinfo makes it, on the
    device of the first parameter or buffer not on ``meta`` (else CPU), which
    accelerate's hooks move to each module's execution device; ``device`` is
    refused. Any other net's arguments are returned as they are.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        Keyword arguments for :func:`torchinfo.summary`.

    Returns
    -------
    dict
        The arguments to give :func:`torchinfo.summary`.

    Raises
    ------
    ValueError
        If ``device`` is given for a net placed by accelerate.

    Examples
    --------
    >>> from torch import nn
    >>> reference_kwargs(nn.Linear(3, 2), {"input_size": (1, 3)})
    {'input_size': (1, 3)}

    """
    kwargs = summary_kwargs
    if not placed_by_accelerate(net):
        return kwargs
    device = kwargs.get("device")
    if device is not None:
        msg = (
            f"`device={device!r}` makes torchinfo move the net, which would undo "
            "accelerate's placement of this model (its modules have accelerate "
            "hooks, from `dispatch_model`, `cpu_offload`, `disk_offload` or "
            "`from_pretrained(..., device_map=...)`). Drop `device`: the "
            "reference pass leaves the model where it is (accelerate's hooks "
            "move the inputs to each module's execution device), or pass "
            "`input_data` on the device you want."
        )
        raise ValueError(msg)
    if kwargs.get("input_data") is not None or kwargs.get("input_size") is None:
        return kwargs
    kwargs = dict(kwargs)
    kwargs["input_data"], _ = _torchinfo_impl.process_input(
        None,
        kwargs.pop("input_size"),
        kwargs.get("batch_dim"),
        _input_device(net, kwargs),
        kwargs.pop("dtypes", None),
    )
    return kwargs


def build_table(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    *,
    around: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> LayerTable:
    """Run the reference pass of ``net`` and return its labelled rows.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        Keyword arguments for :func:`torchinfo.summary`; must contain
        ``input_data`` or ``input_size``.
    around : callable, optional
        Returns a context manager entered around :func:`torchinfo.summary`
        only (inside the snapshot that restores the net), e.g. a fake-tensor
        mode.

    Returns
    -------
    LayerTable
        The rows, following the labelling rule of this module's docstring.

    Raises
    ------
    ValueError
        If neither ``input_data`` nor ``input_size`` is given.

    Notes
    -----
    ``net`` is left as it was: every submodule's ``training`` flag, every
    parameter's ``requires_grad`` and every buffer are put back after the
    pass (torchinfo restores only the top module's flag, and a train-mode
    pass moves BatchNorm running statistics). The work is linear in the
    number of rows times the nesting depth, whatever torchinfo's own totals
    would cost.

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
    kwargs = dict(reference_kwargs(net, summary_kwargs))
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
    before = _first_device(net)
    name = type(net).__name__
    previous = _torchinfo_impl._cached_forward_pass.get(name)  # noqa: SLF001 (no public API)
    handles = log.install()
    try:
        with (
            preserved(net),
            _summary_patches(log.rows),
            around() if around is not None else contextlib.nullcontext(),
        ):
            summary = torchinfo.summary(net, **kwargs)
            # Read before the net's buffers and parameters are put back (in
            # place): only the pass's own in-place operations count.
            overwritten = log.overwritten()
    finally:
        for handle in handles:
            handle.remove()
        log.unwind()
        # torchinfo stores every pass in a global cache keyed by class name,
        # whatever `cache_forward_pass` says, overwriting the entry of any net
        # of the same class name: put back what was there, so our entry cannot
        # keep `net` alive (torchinfo issue 369) and other entries survive.
        cache = _torchinfo_impl._cached_forward_pass  # noqa: SLF001 (no public API)
        if previous is None:
            cache.pop(name, None)
        else:
            cache[name] = previous

    _warn_if_moved(net, before, kwargs)
    shared = _assign_params(net, log.rows)
    statistics = _restatistics(summary, log.rows, shared)
    if verbose:
        print(statistics)  # noqa: T201 (the user asked torchinfo to print)
    rows = _to_layers(log, overwritten)
    return LayerTable(rows, mode=mode, grad_enabled=False, statistics=statistics)


def _first_device(net: nn.Module) -> torch.device | None:
    """Return the device of the net's first parameter or buffer (``None``: none)."""
    for tensor in itertools.chain(net.parameters(), net.buffers()):
        return tensor.device
    return None


def _warn_if_moved(
    net: nn.Module, before: torch.device | None, kwargs: Mapping[str, Any]
) -> None:
    """Warn when torchinfo moved ``net`` to another device that nobody asked for.

    Given ``input_size`` alone, torchinfo moves a CPU net to CUDA when CUDA is
    available (the reference ``Recorder`` too, so the move stays; a net
    placed by accelerate never moves, see :func:`reference_kwargs`).
    """
    after = _first_device(net)
    if before is None or after is None or after == before or "device" in kwargs:
        return
    msg = (
        f"Building the layer table moved the net from {before} to {after}: "
        "torchinfo does so when only `input_size` is given and a CUDA device is "
        "available (as the reference Recorder does), so inputs on "
        f"{before} no longer fit it. To keep the net where it is, pass "
        f"`device={str(before)!r}` or `input_data` (an example input on the "
        "device you want) instead of `input_size`."
    )
    warnings.warn(msg, UserWarning, stacklevel=4)


def _restatistics(
    summary: ModelStatistics, rows: list[_Row], shared: tuple[tuple[str, ...], ...]
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
        rows = [row for row in summary_list if isinstance(row, _Row)]
        if len(rows) != len(summary_list):  # pragma: no cover (always _Row)
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


def _to_layers(
    log: _CallLog, overwritten: Mapping[_Row, frozenset[str]]
) -> tuple[Layer, ...]:
    layers = []
    for info in log.rows:
        call = log.calls.get(info)
        label = (info.depth, info.depth_index or 0)  # set by _restatistics
        if call is None:
            layers.append(
                Layer(
                    label,
                    log.containers[info],
                    info.module,
                    None,
                    recordable=False,
                    reason=_NOT_A_CALL
                    if info.note == _NOT_A_CALL_NOTE
                    else _NOT_CALLED,
                    input_size=[],
                    output_size=[],
                    num_params=info.num_params,
                )
            )
            continue
        layers.append(
            Layer(
                label,
                call.name,
                call.module,
                call.call_index,
                recordable=call.end_order is not None,
                reason=None if call.end_order is not None else _NO_OUTPUT,
                input_size=list(info.input_size),
                output_size=list(info.output_size),
                num_params=info.num_params,
                _end_order=call.end_order,
                overwritten=overwritten.get(info, frozenset()),
            )
        )
    return tuple(layers)
