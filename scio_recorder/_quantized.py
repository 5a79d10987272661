"""Quantized layers through which torch passes no gradient.

A model quantized by torchao, bitsandbytes or transformers' quantizers wraps,
records and edits as any other: its quantized layers take and return float
tensors, and hooks see those. Gradients are another matter:

* **weight-only** quantization (torchao's ``Int8WeightOnlyConfig``) computes
  ``x @ dequantize(W)``: the gradient to the layer's input is exact (that of
  the float layer with the dequantized weights); the int8 weights themselves
  get none.
* bitsandbytes' 8-bit layers (``Linear8bitLt``) quantize the input too, and
  pass the gradient straight through that rounding: the gradient to the input
  is the dequantized weights' (in float16 on the CPU).
* **dynamic activation** quantization (torchao's
  ``Int8DynamicActivationInt8WeightConfig``) rounds the input to int8 inside
  the operation, and torch passes *no* gradient to the input: a gradient
  taken anywhere before such a layer silently misses every path through it
  (a residual stream's gradient keeps the skip connections only).

:func:`gradient_cuts` names the layers of the last kind, so that
``record(grads=...)`` refuses a model that has them instead of recording
wrong gradients (:func:`refuse_gradients`). They are found by their
weights' attributes (torchao's tensors carry ``act_quant_kwargs``), so
torchao is never imported.
"""

from __future__ import annotations

__all__ = ["gradient_cuts", "refuse_gradients"]

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def gradient_cuts(net: nn.Module) -> list[str]:
    """Return the qualified names of the layers that pass no gradient to their input.

    Examples
    --------
    >>> from torch import nn
    >>> gradient_cuts(nn.Sequential(nn.Linear(2, 2)))
    []

    """
    return [
        name
        for name, module in net.named_modules()
        if getattr(module._parameters.get("weight"), "act_quant_kwargs", None)  # noqa: SLF001 (its own weight)
        is not None
    ]


def refuse_gradients(net: nn.Module) -> None:
    """Refuse to record gradients of a net with layers that pass none to their input.

    Examples
    --------
    >>> from torch import nn
    >>> refuse_gradients(nn.Sequential(nn.Linear(2, 2)))  # a float net: accepted

    """
    cuts = gradient_cuts(net)
    if cuts:
        msg = (
            f"Cannot record gradients of this net: {len(cuts)} of its layers "
            f"(`{cuts[0]}` first) quantize their input to int8 "
            "(torchao's dynamic activation quantization), through which torch "
            "passes no gradient, so every gradient before them would silently "
            "miss their paths. Record gradients on the float model, or on one "
            "quantized weight-only (`Int8WeightOnlyConfig`), whose input "
            "gradients are exact."
        )
        raise ValueError(msg)
