"""The layer table itself: its rows, their labels, and how they are built.

:class:`Layer` (one row), :class:`LayerTable` (the rows, by label),
:func:`as_table` (a table from a recorder or a table), labels
(:func:`label_str`, :func:`parse_label`) and :func:`build_table`, which runs
the reference pass (``_reference``) and turns its call log into rows by the
labelling rule the face (:mod:`scio_recorder.layers`) states.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, cast, overload

from scio_recorder._support import render as _render

from ._reference import (
    NOT_A_CALL_NOTE,
    CallLog,
    run_reference,
)
from ._torchinfo import Row

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable, Iterator

    from torch import nn
    from torchinfo.model_statistics import ModelStatistics


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

# Why a row cannot be recorded (`Layer.reason`)
_NOT_CALLED = (
    "it is a container that is never called in the reference pass; only its "
    "submodules run"
)
_NO_OUTPUT = "its call did not return normally in the reference pass"
_NOT_A_CALL = (
    "this row is not a call: it only groups calls of submodules made outside "
    "the module's own call"
)


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
        return "\n".join(_render.free_table(header, lines))

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
        if len(infos) == len(self.rows) and all(isinstance(i, Row) for i in infos):
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
    log, overwritten, statistics, mode = run_reference(
        net, summary_kwargs, around=around
    )
    return LayerTable(
        _to_layers(log, overwritten),
        mode="train" if mode == "train" else "eval",
        grad_enabled=False,
        statistics=statistics,
    )


def _to_layers(
    log: CallLog, overwritten: Mapping[Row, frozenset[str]]
) -> tuple[Layer, ...]:
    """Return the rows of the table from the call log, labelled."""
    layers = []
    for info in log.rows:
        call = log.calls.get(info)
        label = (info.depth, info.depth_index or 0)  # set by restatistics
        if call is None:
            layers.append(
                Layer(
                    label,
                    log.containers[info],
                    info.module,
                    None,
                    recordable=False,
                    reason=_NOT_A_CALL if info.note == NOT_A_CALL_NOTE else _NOT_CALLED,
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
