"""Selectors: the forms people type to choose layers, resolved to table rows.

A selector is any of

* a label ``(depth, idx)``, as printed in the table (the reference form);
* a qualified module name, ``"layer1.0.conv1"``: every call of that module;
* a pair ``("layer1.0.relu", k)``: the k-th call (from 0) of that module;
* a module instance: every call of it;
* a module type, ``nn.Linear``: every call of every module of that type;
* a predicate ``f(layer) -> bool`` over :class:`~scio_recorder.Layer` rows;
* :func:`children` / :func:`modules`: torchfunc-style registration by types
  and indices, where giving both means *both* conditions;
* a list, tuple of selectors (other than a label or a name-call pair) or a set
  of them: their union.

Resolution is all-or-nothing: a selector that matches nothing, or that names
a row that cannot be recorded, raises :class:`ValueError` saying what to do,
and the caller changes nothing.
"""

from __future__ import annotations

__all__ = [
    "Selector",
    "as_label",
    "as_list",
    "check_labels",
    "children",
    "index_like",
    "looks_like_label",
    "modules",
    "resolve",
    "resolve_callables",
    "resolve_one",
    "resolve_params",
]

import dataclasses
import difflib
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from torch import nn

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .layers import DepthIdx, Layer, LayerTable

Selector: TypeAlias = Any
"""Anything :func:`resolve` accepts (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class _Registration:
    """Modules by position among children or all modules, and by type."""

    recursive: bool
    types: tuple[type[nn.Module], ...] | None
    indices: frozenset[int] | None

    def matches(self, net: nn.Module) -> list[nn.Module]:
        pool = list(net.modules()) if self.recursive else list(net.children())
        return [
            module
            for index, module in enumerate(pool)
            if (self.types is None or isinstance(module, self.types))
            and (self.indices is None or index in self.indices)
        ]

    def __str__(self) -> str:
        kind = "modules" if self.recursive else "children"
        types = None if self.types is None else [t.__name__ for t in self.types]
        indices = None if self.indices is None else sorted(self.indices)
        return f"{kind}(types={types}, indices={indices})"


def _registration(
    *,
    recursive: bool,
    types: type[nn.Module] | Iterable[type[nn.Module]] | None,
    indices: int | Iterable[int] | None,
) -> _Registration:
    if isinstance(types, type):
        types = (types,)
    if isinstance(indices, int):
        indices = (indices,)
    return _Registration(
        recursive,
        None if types is None else tuple(types),
        None if indices is None else frozenset(indices),
    )


def children(
    *,
    types: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
    indices: int | Iterable[int] | None = None,
) -> Selector:
    """Select direct children of the net by type and/or position.

    Like torchfunc's ``recorder.children(net, types=..., indices=...)``, with
    one difference: given both, a child must match both conditions (torchfunc
    takes either). Given neither, every child is selected.

    Parameters
    ----------
    types : type or iterable of types, optional
        Module classes (``isinstance`` test).
    indices : int or iterable of int, optional
        Positions in ``net.children()``, from 0.

    Returns
    -------
    Selector
        To pass to :meth:`Recorder.record`.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> rnet = Recorder(net, input_size=(1, 4))
    >>> rnet.record(children(types=nn.Linear, indices=(1, 2)))
    >>> rnet.recording
    ((1, 3),)

    """
    return _registration(recursive=False, types=types, indices=indices)


def modules(
    *,
    types: type[nn.Module] | Iterable[type[nn.Module]] | None = None,
    indices: int | Iterable[int] | None = None,
) -> Selector:
    """Select modules of the net (recursively) by type and/or position.

    Positions are those of ``net.modules()`` (0 is the net itself), as in
    torchfunc's ``recorder.modules``; given both conditions, a module must
    match both.

    Parameters
    ----------
    types : type or iterable of types, optional
        Module classes (``isinstance`` test).
    indices : int or iterable of int, optional
        Positions in ``net.modules()``, from 0.

    Returns
    -------
    Selector
        To pass to :meth:`Recorder.record`.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2)))
    >>> rnet = Recorder(net, input_size=(1, 4))
    >>> rnet.record(modules(types=nn.Linear))
    >>> rnet.recording
    ((1, 1), (2, 1))

    """
    return _registration(recursive=True, types=types, indices=indices)


def index_like(value: object) -> bool:
    """Whether ``value`` is an integer (``int``, ``numpy.int64``, ...)."""
    return hasattr(type(value), "__index__") and not isinstance(value, str)


def as_label(value: object) -> DepthIdx | None:
    """Return ``value`` as a label ``(depth, idx)`` of plain ints, or ``None``.

    Any pair of integers is a label (numpy integers too, as the reference
    Recorder accepted them).

    Examples
    --------
    >>> import numpy as np
    >>> as_label((np.int64(1), 3)), as_label("1-3")
    ((1, 3), None)

    """
    if isinstance(value, tuple) and len(value) == 2:  # noqa: PLR2004 (a pair)
        depth, idx = value
        if index_like(depth) and index_like(idx):
            return (operator.index(depth), operator.index(idx))
    return None


def _is_name_call(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2  # noqa: PLR2004 (a pair)
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


def _names(table: LayerTable) -> list[str]:
    seen: dict[str, None] = {}
    for row in table.rows:
        seen.setdefault(row.name, None)
    return list(seen)


def _module_named(net: nn.Module, name: str) -> nn.Module | None:
    """Return the module registered as ``name`` in ``net`` (any of its names)."""
    try:
        return net.get_submodule(name)
    except AttributeError:
        return None


def _calls_named(table: LayerTable, net: nn.Module, name: str) -> list[Layer]:
    """Return every call row of the module named ``name``, whatever its row name.

    A module registered under several names (a ReLU reused in a Sequential)
    is one module: any of its names selects all of its calls.
    """
    module = _module_named(net, name)
    return [] if module is None else list(table.calls_of(module))


def _unknown_name(table: LayerTable, name: str) -> ValueError:
    close = difflib.get_close_matches(name, [n for n in _names(table) if n], n=3)
    hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
    return ValueError(
        f"No module named `{name}` is called in the reference pass.{hint} "
        "`print(rnet.table)` lists the qualified names. Operation cancelled"
    )


def resolve(
    table: LayerTable, net: nn.Module, selectors: Iterable[Selector]
) -> list[Layer]:
    """Return the rows ``selectors`` pick, in table order, without duplicates.

    Parameters
    ----------
    table : LayerTable
        The rows to choose from.
    net : torch.nn.Module
        The network (for :func:`children` and :func:`modules`).
    selectors : iterable of Selector
        See the module docstring.

    Returns
    -------
    list of Layer
        The selected rows; container rows are never returned.

    Raises
    ------
    ValueError
        If a selector matches no row, names a row that cannot be recorded, or
        is of no known form.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> relu = nn.ReLU()
    >>> net = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> [row.label for row in resolve(rnet.table, net, ["1", nn.ReLU])]
    [(1, 2), (1, 4)]
    >>> [row.label for row in resolve(rnet.table, net, [("3", 1)])]
    [(1, 4)]

    """
    picked: dict[DepthIdx, Layer] = {}
    for selector in selectors:
        for row in _rows_of(table, net, selector):
            picked[row.label] = row
    order = {row.label: i for i, row in enumerate(table.rows)}
    return sorted(picked.values(), key=lambda row: order[row.label])


def _rows_of(  # noqa: C901, PLR0911, PLR0912 (one branch per selector form)
    table: LayerTable, net: nn.Module, selector: Selector
) -> list[Layer]:
    """Return the rows one selector picks (:func:`resolve_one`: exactly one row)."""
    label = as_label(selector)
    if label is not None:
        if label not in table:
            msg = f"Following layers not found: {{{label!r}}}. Operation cancelled"
            raise ValueError(msg)
        return [_recordable(table[label])]
    if isinstance(selector, str):
        rows = _calls_named(table, net, selector)
        if not rows:
            module = _module_named(net, selector)
            containers = [row for row in table.rows if row.module is module]
            if containers:
                return [_recordable(containers[0])]
            raise _unknown_name(table, selector)
        return rows
    if _is_name_call(selector):
        name, k = selector
        rows = _calls_named(table, net, name)
        if not rows:
            raise _unknown_name(table, name)
        matching = [row for row in rows if row.call_index == k]
        if not matching:
            msg = (
                f"Module `{name}` is called {len(rows)} time"
                f"{'s' if len(rows) != 1 else ''} in the reference pass, so its "
                f"calls are numbered 0 to {len(rows) - 1}, not {k}. "
                "Operation cancelled"
            )
            raise ValueError(msg)
        return [_recordable(matching[0])]
    if isinstance(selector, nn.Module):
        rows = list(table.calls_of(selector))
        if not rows:
            msg = (
                f"The module {type(selector).__name__} given is not called in the "
                "reference pass of this net. Operation cancelled"
            )
            raise ValueError(msg)
        return [_recordable(row) for row in rows]
    if isinstance(selector, type) and issubclass(selector, nn.Module):
        rows = [
            row
            for row in table.rows
            if row.call_index is not None and isinstance(row.module, selector)
        ]
        if not rows:
            msg = (
                f"No module of type `{selector.__name__}` is called in the "
                "reference pass. Operation cancelled"
            )
            raise ValueError(msg)
        return [row for row in rows if row.recordable]
    if isinstance(selector, _Registration):
        wanted = selector.matches(net)
        rows = [row for module in wanted for row in table.calls_of(module)]
        if not rows:
            msg = f"`{selector}` selects no called module. Operation cancelled"
            raise ValueError(msg)
        return [row for row in rows if row.recordable]
    if isinstance(selector, list | tuple | set | frozenset):
        return [row for item in selector for row in _rows_of(table, net, item)]
    if callable(selector):
        predicate: Callable[[Layer], object] = selector
        rows = [row for row in table.rows if row.recordable and predicate(row)]
        if not rows:
            msg = f"The predicate {selector!r} selects no row. Operation cancelled"
            raise ValueError(msg)
        return rows
    msg = (
        f"Cannot select layers with {selector!r} ({type(selector).__name__}). Use "
        "a label `(depth, idx)`, a qualified name, `(name, call)`, a module, a "
        "module type, a predicate over rows, or `children()`/`modules()`. "
        "Operation cancelled"
    )
    raise TypeError(msg)


def _recordable(row: Layer) -> Layer:
    if not row.recordable:
        msg = f"Layer {row.describe()} cannot be recorded: {row.reason}."
        raise ValueError(msg + " Operation cancelled")
    return row


def resolve_one(
    table: LayerTable,
    net: nn.Module,
    selector: Selector,
    who: str,
    *,
    hint: str = "`layer={label}`",
) -> Layer:
    """Resolve ``selector`` to exactly one row, or raise naming the fix.

    For tools that act on one layer call (a detector's layer, Grad-CAM's):
    an unknown selector or one selecting several calls raises
    ``ValueError``, prefixed with ``who``; ``hint`` is the fix suggested for
    several calls (``{label}`` becomes the first call's label).

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(
    ...     nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), input_size=(1, 2)
    ... )
    >>> resolve_one(rnet.table, rnet.net, "1", "demo").label
    (1, 2)
    >>> resolve_one(rnet.table, rnet.net, nn.Linear, "demo")
    Traceback (most recent call last):
    ...
    ValueError: demo: layer <class 'torch.nn.modules.linear.Linear'> selects 2 calls (1-1, 1-2); name one of them, e.g. `layer=(1, 1)`.

    """  # noqa: E501 (doctest output)
    try:
        rows = resolve(table, net, [selector])
    except (KeyError, ValueError, TypeError) as error:
        # The reference's "Operation cancelled" ends `record`'s own messages;
        # inside this one it would read as a second sentence.
        why = str(error).removesuffix("Operation cancelled").rstrip()
        msg = f"{who}: layer {selector!r} is not a layer of this net: {why}"
        raise ValueError(msg) from error
    if len(rows) != 1:
        labels = ", ".join(row.label_str for row in rows)
        msg = (
            f"{who}: layer {selector!r} selects {len(rows)} calls ({labels}); name "
            f"one of them, e.g. {hint.format(label=rows[0].label)}."
        )
        raise ValueError(msg)
    return rows[0]


def check_labels(table: LayerTable, selectors: tuple[Selector, ...]) -> None:
    """Refuse label-like selectors that name no recordable row.

    With the reference Recorder's messages (``record(1, 2)`` gets the hint
    ``rnet.record((1, 2))``); nothing is changed when this raises.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2))
    >>> check_labels(rnet.table, ((1, 1),))
    >>> check_labels(rnet.table, (1, 2))
    Traceback (most recent call last):
    ...
    ValueError: Following layers not found: {1, 2}. Did you mean `rnet.record((1, 2))`? Operation cancelled

    """  # noqa: E501 (doctest output)
    labels = [as_label(s) or s for s in selectors if looks_like_label(s)]
    unknown = {s for s in labels if s not in table}
    if unknown:
        hint = ""
        if len(selectors) == 2 and all(map(index_like, selectors)):  # noqa: PLR2004 (a pair)
            hint = f"Did you mean `rnet.record({selectors})`? "
        shown = "{" + ", ".join(map(repr, sorted(unknown, key=repr))) + "}"
        msg = f"Following layers not found: {shown}. {hint}Operation cancelled"
        raise ValueError(msg)
    refused = [table[s] for s in sorted(set(labels)) if not table[s].recordable]
    if refused:
        lines = [f"- {row.describe()}: {row.reason}" for row in refused]
        names = {row.name for row in refused}
        children = [
            f"`{row.label}`"
            for row in table.rows
            if row.recordable and any(row.name.startswith(f"{name}.") for name in names)
        ]
        if children:
            examples = ", ".join(children[:3])
            lines.append(f"Record its submodules' calls instead, e.g. {examples}.")
        msg = "These layers cannot be recorded:\n" + "\n".join(lines)
        raise ValueError(msg + "\nOperation cancelled")


def resolve_params(
    table: LayerTable, net: nn.Module, selectors: list[Selector]
) -> dict[str, nn.Parameter]:
    """Return the parameters that ``selectors`` name, by qualified name.

    A selector is a parameter name (``"fc.weight"``) or picks modules as
    :func:`resolve` does (their parameters, in the net's order).

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2))
    >>> list(resolve_params(rnet.table, rnet.net, ["0"]))
    ['0.weight', '0.bias']

    """
    if not selectors:  # the usual case: no walk over the net's parameters
        return {}
    named = dict(net.named_parameters())
    by_id = {id(p): name for name, p in named.items()}
    found: dict[str, nn.Parameter] = {}
    module_selectors = []
    modules = {name for name, _ in net.named_modules(remove_duplicate=False)}
    for selector in selectors:
        if isinstance(selector, str) and selector in named:
            found[selector] = named[selector]
        elif isinstance(selector, str) and selector not in modules:
            close = difflib.get_close_matches(selector, [*named, *modules], n=3)
            hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?"
            msg = (
                f"No parameter or module named `{selector}` in the net."
                f"{hint if close else ''} `dict(net.named_parameters())` lists "
                "the parameter names. Operation cancelled"
            )
            raise ValueError(msg)
        else:
            module_selectors.append(selector)
    for row in resolve(table, net, module_selectors):
        for param in row.module.parameters():
            name = by_id.get(id(param))
            if name is not None:
                found[name] = param
    return {name: found[name] for name in named if name in found}


def looks_like_label(value: object) -> bool:
    """Whether the reference Recorder would have taken ``value`` as a label."""
    return index_like(value) or (
        isinstance(value, tuple) and bool(value) and all(map(index_like, value))
    )


def as_list(selectors: Selector | None) -> list[Selector]:
    """Return the selectors of an option: ``None``, one selector, or a list."""
    if selectors is None:
        return []
    if isinstance(selectors, list | set | frozenset):
        return list(selectors)
    return [selectors]


def resolve_callables(
    table: LayerTable,
    net: nn.Module,
    mapping: Mapping[Any, Callable[[Any], Any]],
    option: str,
) -> dict[DepthIdx, Callable[[Any], Any]]:
    """Return ``{label: fn}`` for ``{selector: fn}`` (each selector's rows).

    ``option`` names the argument in messages. Refuses a mapping whose value
    is not callable, and a selector that matches nothing (as :func:`resolve`).

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), input_size=(1, 2))
    >>> resolve_callables(rnet.table, rnet.net, {"1": abs}, "activation_postproc")
    {(1, 2): <built-in function abs>}
    >>> resolve_callables(rnet.table, rnet.net, {"1": 0}, "input_postproc")
    Traceback (most recent call last):
    ...
    TypeError: `input_postproc` maps '1' to 0, which is not callable: give a function `fn(tensor) -> replacement or None`.

    """  # noqa: E501 (doctest output)
    if not isinstance(mapping, Mapping):
        msg = (
            f"`{option}` must be a dict {{selector: function}}, got "
            f"{type(mapping).__name__}."
        )
        raise TypeError(msg)
    found: dict[DepthIdx, Callable[[Any], Any]] = {}
    for selector, fn in mapping.items():
        if not callable(fn):
            msg = (
                f"`{option}` maps {selector!r} to {fn!r}, which is not callable: "
                "give a function `fn(tensor) -> replacement or None`."
            )
            raise TypeError(msg)
        for row in resolve(table, net, [selector]):
            found[row.label] = fn
    return found
