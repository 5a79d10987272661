"""How the net's inputs come out of a batch, and how batches move between devices.

Holds the getters of ``input=`` and ``target=`` (:func:`batch_getter`: an
index, a key, a callable or ``None`` for the whole batch), the one
convention that turns an input into the net's positional and keyword
arguments (:func:`as_arguments`), :func:`move_to` (a device move that keeps
the nesting) and :func:`first_batch_size`.

Why: :func:`scio_recorder.collect.collect`, the detectors of
:mod:`scio_recorder.ood` and :mod:`scio_recorder.explain` all take batches
and inputs the same way; each had its own copy (or imported a private
module of another subpackage), and a convention that differs between them
surprises.
"""

from __future__ import annotations

__all__ = [
    "as_arguments",
    "batch_getter",
    "first_batch_size",
    "index_getter",
    "key_getter",
    "move_to",
]

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ._engine.state import CallInputs
from ._tree import map_tensors

if TYPE_CHECKING:
    import torch


def batch_getter(spec: object, what: str) -> Callable[[Any], Any]:
    """Return a function taking the input (or target) out of a batch.

    ``spec`` is ``None`` (the whole batch), an int (an item of a tuple or
    list batch), a str (a key of a dict batch) or a callable ``batch ->
    value``; ``what`` names the option (``"input"``, ``"target"``) in the
    messages.

    Examples
    --------
    >>> batch_getter(1, "target")(("x", "y")), batch_getter("y", "target")({"y": 2})
    ('y', 2)
    >>> batch_getter(1.5, "target")
    Traceback (most recent call last):
    ...
    TypeError: `target` must be an int, a str, a callable or None, got 1.5

    """
    if spec is None:
        return lambda batch: batch
    if isinstance(spec, int) and not isinstance(spec, bool):
        return index_getter(spec, what)
    if isinstance(spec, str):
        return key_getter(spec, what)
    if callable(spec) and not isinstance(spec, bool):
        return spec
    msg = f"`{what}` must be an int, a str, a callable or None, got {spec!r}"
    raise TypeError(msg)


def index_getter(index: int, what: str) -> Callable[[Any], Any]:
    """Return a function taking item ``index`` of a tuple or list batch."""

    def by_index(batch: Any) -> Any:
        if isinstance(batch, Tensor):
            msg = (
                f"`{what}={index}` takes item {index} of a tuple or list batch, "
                f"but the batch is a tensor. Pass `{what}=None` to use the whole "
                "batch" + (" as the input." if what == "input" else ".")
            )
            raise TypeError(msg)
        try:
            return batch[index]
        except (IndexError, KeyError, TypeError) as error:
            msg = (
                f"`{what}={index}`: cannot take item {index} of the batch, a "
                f"{type(batch).__name__} ({error}). Pass `{what}=` an index, a "
                "key or a callable batch -> value."
            )
            raise ValueError(msg) from error

    return by_index


def key_getter(key: str, what: str) -> Callable[[Any], Any]:
    """Return a function taking ``key`` of a dict batch."""

    def by_key(batch: Any) -> Any:
        if not isinstance(batch, Mapping):
            msg = (
                f"`{what}={key!r}` takes a key of a dict batch, but the batch "
                f"is a {type(batch).__name__}. Pass an index or a callable."
            )
            raise TypeError(msg)
        if key not in batch:
            msg = (
                f"`{what}={key!r}`: the batch has no such key; its keys are "
                f"{list(batch)}."
            )
            raise KeyError(msg)
        return batch[key]

    return by_key


def as_arguments(value: Any, *, spread: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Turn an input into the net's positional and keyword arguments.

    A :class:`~scio_recorder.CallInputs` is both, always. With ``spread``
    (what a callable ``input=`` returned; the inputs of
    :mod:`scio_recorder.explain`), a tuple (a named tuple too) is the
    positional arguments and a mapping (a tokenizer's ``BatchEncoding``
    too) the keyword arguments. Anything else, and anything without
    ``spread`` (an item taken by index or key, the whole batch), is the one
    positional argument.

    Examples
    --------
    >>> as_arguments((1, 2), spread=True), as_arguments((1, 2), spread=False)
    (((1, 2), {}), (((1, 2),), {}))
    >>> as_arguments({"ids": 3}, spread=True)
    ((), {'ids': 3})
    >>> from scio_recorder import CallInputs
    >>> as_arguments(CallInputs((1,), {"mask": 0}), spread=False)
    ((1,), {'mask': 0})

    """
    if isinstance(value, CallInputs):
        return tuple(value.args), dict(value.kwargs)
    if spread and isinstance(value, tuple):
        return value, {}
    if spread and isinstance(value, Mapping):
        return (), dict(value)
    return (value,), {}


def move_to(value: Any, device: torch.device) -> Any:
    """Move the tensors in ``value`` to ``device`` (async toward accelerators).

    Any nesting that :func:`~scio_recorder._tree.map_tensors` walks is kept:
    named tuples, dict subclasses, dataclasses (model outputs).

    Examples
    --------
    >>> import torch
    >>> moved = move_to({"x": (torch.zeros(1), 2)}, torch.device("meta"))
    >>> moved["x"][0].device, moved["x"][1]
    (device(type='meta'), 2)

    """
    # A copy toward the CPU must be synchronous: an asynchronous one returns
    # before the data has arrived.
    non_blocking = device.type != "cpu"
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), value)


def first_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Return dim 0 of the first tensor among the arguments (no host sync).

    Examples
    --------
    >>> import torch
    >>> first_batch_size((3, torch.zeros(())), {"x": torch.zeros(4, 2)})
    4
    >>> first_batch_size((), {}) is None
    True

    """
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    return None
