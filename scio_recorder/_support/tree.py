"""The one walk over nested values (outputs, arguments, records).

Every place that reaches the tensors inside a nested value goes through
:func:`map_tensors` (rebuild with a function applied to each tensor),
:func:`iter_tensors` (the tensors, in order) or :func:`tensor_items` (the
tensors with their paths), so that recording options (``clone``, ``detach``,
``device``, ``dtype``), gradient capture, ``collect``'s device moves and the
graph capture agree on what is "inside".

Containers, rebuilt with the same type:

* ``list`` and ``tuple``, and their subclasses: named tuples
  (``type(x)(*items)``), ``torch.return_types`` struct sequences and other
  subclasses (``type(x)(items)``);
* dataclass instances, frozen or not (Hugging Face ``ModelOutput`` included):
  a shallow copy with every field replaced (``object.__setattr__``, so frozen
  dataclasses work and ``__init__``/``__post_init__`` do not run again); a
  dataclass that is also a dict (``ModelOutput``) gets its items replaced by
  the same new field values, so ``out.logits is out["logits"]`` still holds;
* ``dict`` and its subclasses (``OrderedDict``, ``defaultdict``, ...), and
  other mutable mappings (``UserDict``, Hugging Face ``BatchEncoding``): a
  shallow copy (keeping the subclass, its default factory and attributes) with
  every value replaced.

Anything else is a leaf, returned unchanged (``None``, numbers, strings,
other objects).

Why an own walk rather than ``torch.utils._pytree``: pytree treats plain
dataclasses and ``OrderedDict`` subclasses as leaves (their tensors would be
missed unless every user type were registered), and Hugging Face registers
``ModelOutput`` with pytree only once ``transformers`` is imported, rebuilding
it through its constructor (which runs ``__post_init__`` again on the new
values). The walk here knows these types without any registration, and
rebuilds a value without calling its constructor, except for tuples (which
cannot be built otherwise).
"""

from __future__ import annotations

__all__ = ["iter_tensors", "map_leaves", "map_tensors", "tensor_items"]

import copy
import dataclasses
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from torch import Tensor

Key = int | str | object
"""A position inside a container: an index, a field name or a dict key."""

_Node = tuple[list[Key], list[Any], Callable[[list[Any]], Any]]


def _rebuild_tuple(value: tuple[Any, ...]) -> Callable[[list[Any]], Any]:
    cls = type(value)
    if cls is tuple:
        return tuple
    if hasattr(cls, "_fields"):  # a named tuple
        return lambda items: cls(*items)
    return cls  # a struct sequence (torch.return_types) or another subclass


def _rebuild_dataclass(value: Any, names: list[str]) -> Callable[[list[Any]], Any]:
    def rebuild(items: list[Any]) -> Any:
        new = copy.copy(value)
        for name, item in zip(names, items, strict=True):
            object.__setattr__(new, name, item)
            if isinstance(new, dict) and dict.__contains__(new, name):
                # A dict and a dataclass (ModelOutput): the item is the field.
                dict.__setitem__(new, name, item)
        return new

    return rebuild


def _rebuild_mapping(value: Any, keys: list[Key]) -> Callable[[list[Any]], Any]:
    def rebuild(items: list[Any]) -> Any:
        new = copy.copy(value)
        for key, item in zip(keys, items, strict=True):
            new[key] = item
        return new

    return rebuild


def _split(value: Any) -> _Node | None:
    """Return ``(keys, children, rebuild)`` of a container, ``None`` for a leaf."""
    cls = type(value)
    rebuild: Callable[[list[Any]], Any]
    if cls is tuple or cls is list:  # the common cases first
        rebuild = cls
    elif cls is dict:
        keys = list(value)
        return (
            keys,
            list(value.values()),
            lambda items: dict(zip(keys, items, strict=True)),
        )
    elif isinstance(value, tuple):
        rebuild = _rebuild_tuple(value)
    elif isinstance(value, list):
        rebuild = cls
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value) if hasattr(value, f.name)]
        children = [getattr(value, name) for name in names]
        return list(names), children, _rebuild_dataclass(value, names)
    elif isinstance(value, MutableMapping):
        keys = list(value)
        return keys, [value[key] for key in keys], _rebuild_mapping(value, keys)
    else:
        return None
    return list(range(len(value))), list(value), rebuild


def map_leaves(
    fn: Callable[[Any], Any], value: Any, leaf: type | tuple[type, ...]
) -> Any:
    """Return ``value`` rebuilt with ``fn`` applied to every instance of ``leaf``.

    Parameters
    ----------
    fn : callable
        Applied to each leaf; its result takes the leaf's place.
    value : Any
        A leaf, or containers (see the module docstring) nested to any depth.
    leaf : type or tuple of types
        What ``fn`` applies to; other non-containers are kept as they are.

    Returns
    -------
    Any
        A new value of the same structure and container types.

    Examples
    --------
    >>> map_leaves(lambda n: n * 10, {"a": [1, (2, "x")], "b": None}, int)
    {'a': [10, (20, 'x')], 'b': None}

    """
    if isinstance(value, leaf):
        return fn(value)
    node = _split(value)
    if node is None:
        return value
    _, children, rebuild = node
    return rebuild([map_leaves(fn, child, leaf) for child in children])


def map_tensors(fn: Callable[[Tensor], Any], value: Any) -> Any:
    """Return ``value`` rebuilt with ``fn`` applied to every tensor inside.

    Parameters
    ----------
    fn : callable
        Applied to each tensor; its result takes the tensor's place.
    value : Any
        A tensor, or containers (see the module docstring) nested to any depth.

    Returns
    -------
    Any
        A new value of the same structure and container types; non-tensor
        leaves are the very objects of ``value``.

    Examples
    --------
    >>> import torch
    >>> from collections import namedtuple
    >>> Pair = namedtuple("Pair", "a b")
    >>> map_tensors(lambda t: t + 1, Pair(torch.zeros(1), [torch.ones(1), 3]))
    Pair(a=tensor([1.]), b=[tensor([2.]), 3])

    """
    if isinstance(value, Tensor):
        return fn(value)
    return map_leaves(fn, value, Tensor)


def tensor_items(value: Any) -> Iterator[tuple[tuple[Key, ...], Tensor]]:
    """Yield ``(path, tensor)`` for every tensor inside ``value``, in order.

    A path is the keys from ``value`` down to the tensor: indices of lists
    and tuples, field names of dataclasses, keys of mappings.

    Examples
    --------
    >>> import torch
    >>> [path for path, _ in tensor_items({"a": [torch.zeros(1), 2, torch.ones(1)]})]
    [('a', 0), ('a', 2)]

    """
    if isinstance(value, Tensor):
        yield (), value
        return
    node = _split(value)
    if node is None:
        return
    keys, children, _ = node
    for key, child in zip(keys, children, strict=True):
        for path, tensor in tensor_items(child):
            yield (key, *path), tensor


def iter_tensors(value: Any) -> Iterator[Tensor]:
    """Yield the tensors inside ``value``, in the order :func:`map_tensors` visits.

    Examples
    --------
    >>> import torch
    >>> len(list(iter_tensors((torch.zeros(1), {"b": torch.ones(1)}, "c"))))
    2

    """
    if isinstance(value, Tensor):
        yield value
        return
    node = _split(value)
    if node is not None:
        for child in node[1]:
            yield from iter_tensors(child)
