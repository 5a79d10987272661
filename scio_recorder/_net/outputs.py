"""Reading a net's output: where the logits are."""

from __future__ import annotations

__all__ = ["logits_of"]

from collections.abc import Mapping
from typing import Any

from torch import Tensor


def logits_of(output: Any) -> Tensor:
    """Return the logits in a net's output.

    A tensor is the logits; otherwise a ``"logits"`` key or attribute (Hugging
    Face outputs), else the first item of a tuple or list.

    Examples
    --------
    >>> import torch
    >>> logits_of({"logits": torch.zeros(2, 3), "hidden": None}).shape
    torch.Size([2, 3])

    """
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        found: Tensor = output["logits"]
        return found
    if isinstance(getattr(output, "logits", None), Tensor):
        logits: Tensor = output.logits
        return logits
    if isinstance(output, list | tuple) and output and isinstance(output[0], Tensor):
        return output[0]
    msg = (
        f"Cannot find logits in the net's output ({type(output).__name__}): "
        "detectors read a tensor, a 'logits' key or attribute, or the first "
        "item of a tuple."
    )
    raise TypeError(msg)
