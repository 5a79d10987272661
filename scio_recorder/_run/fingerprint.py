"""Deterministic descriptions of a run's arguments, for the fingerprints of resumes.

Holds :func:`describe_value` (a configuration value as text, without memory
addresses: tensors by shape, dtype and digest, classes and functions by
their public path), :func:`describe_reducer` and :func:`describe_spec` (an
``input=``-like spec).

Why: a run resumed from a folder must have been started with the same
arguments; :mod:`scio_recorder.collect` and :mod:`scio_recorder.activations`
save a fingerprint made of these descriptions and compare it on resuming.
"""

from __future__ import annotations

__all__ = ["describe_reducer", "describe_spec", "describe_value"]

import hashlib
import re

import torch
from torch import Tensor

from scio_recorder._support.public import public_module
from scio_recorder.reduce import Reducer

ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def describe_value(value: object, depth: int = 0) -> str:  # noqa: PLR0911 (one branch per kind)
    """Describe a configuration value deterministically (no addresses)."""
    if depth > 4:  # noqa: PLR2004 (enough for nested reducers)
        return "..."
    if isinstance(value, Tensor):
        data = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]
        return f"Tensor({list(value.shape)}, {value.dtype}, sha256:{digest})"
    if isinstance(value, type):
        return f"{public_module(value)}.{value.__qualname__}"
    if isinstance(value, list | tuple):
        items = ", ".join(describe_value(v, depth + 1) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items})"
    if isinstance(value, dict):
        items = ", ".join(
            f"{k!r}: {describe_value(v, depth + 1)}"
            for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))
        )
        return "{" + items + "}"
    if isinstance(value, Reducer):
        return describe_reducer(value, depth + 1)
    owner = getattr(value, "__self__", None)
    if owner is not None and callable(value):  # a bound method
        name = getattr(value, "__name__", "?")
        return f"{describe_value(owner, depth + 1)}.{name}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{public_module(value)}.{value.__qualname__}"
    return ADDRESS.sub("", repr(value))


def describe_reducer(reducer: Reducer | None, depth: int = 0) -> str:
    """Describe a reducer's class and configuration, for the fingerprint."""
    if reducer is None:
        return "concat"
    cls = type(reducer)
    fields = getattr(reducer, "__dict__", None)
    if not isinstance(fields, dict):
        return (
            f"{public_module(cls)}.{cls.__qualname__}({ADDRESS.sub('', repr(reducer))})"
        )
    parts = ", ".join(
        f"{k}={describe_value(v, depth)}" for k, v in sorted(fields.items())
    )
    return f"{public_module(cls)}.{cls.__qualname__}({parts})"


def describe_spec(spec: object) -> str:
    """Describe an ``input=``-like spec: an int or str as is, else as a value."""
    if spec is None or isinstance(spec, int | str):
        return repr(spec)
    return describe_value(spec)
