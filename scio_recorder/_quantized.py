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

:func:`gradient_cuts` names the layers of the last kind, and
:func:`refuse_gradients` is the one check every path of the library that
takes a gradient through the net makes before its first pass, so that a
model that has them is refused instead of given wrong gradients:

* ``record(grads=...)`` (:class:`~scio_recorder.Recorder`);
* the explanations that differentiate the net: ``explain.grad_cam``,
  ``explain.attribution_patch``;
* every detector pass with autograd on (``ood``'s shared pass,
  ``run_pass(grad=True)``): the input perturbation of ODIN, of Mahalanobis
  and the multi-layer detectors with ``epsilon > 0`` (``gradient_step``),
  AdaScale's, and NAC's backward, in scoring and in their fits;
* ``data.train_classifier`` (its backward trains the layers before them).

GradNorm is not among them: it scores from the closed form of the last
layer's weight gradient, computed from that layer's recorded input and
output, with no gradient through the net. The layers are found by their
weights' attributes (torchao's tensors carry ``act_quant_kwargs``), so
torchao is never imported.
"""

from __future__ import annotations

__all__ = ["gradient_cuts", "refuse_gradients"]

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def _cuts(module: nn.Module) -> bool:
    """Whether ``module`` quantizes its input, so that it passes it no gradient."""
    weight = module._parameters.get("weight")  # noqa: SLF001 (its own weight)
    return getattr(weight, "act_quant_kwargs", None) is not None


def gradient_cuts(net: nn.Module) -> list[str]:
    """Return the qualified names of the layers that pass no gradient to their input.

    Examples
    --------
    >>> from torch import nn
    >>> gradient_cuts(nn.Sequential(nn.Linear(2, 2)))
    []

    """
    return [name for name, module in net.named_modules() if _cuts(module)]


_NAMED = 3
"""How many of the layers a refusal names."""


def refuse_gradients(net: nn.Module, who: str) -> None:
    """Refuse to take gradients through a net whose layers pass none to their input.

    The one check of every path that takes a gradient through the net (see
    the module's docstring), made before its first pass.

    Parameters
    ----------
    net : torch.nn.Module
        The net.
    who : str
        What asked, named in the message (``"`record(grads=...)`"``,
        ``"grad_cam"``, ``"ODIN"``).

    Raises
    ------
    ValueError
        Naming the layers (the first three, and how many more) and the fix.

    Examples
    --------
    >>> from torch import nn
    >>> refuse_gradients(nn.Sequential(nn.Linear(2, 2)), "doc")  # a float net

    """
    if not any(_cuts(module) for module in net.modules()):
        return
    cuts = gradient_cuts(net)
    named = ", ".join(f"`{name}`" for name in cuts[:_NAMED])
    more = f" and {len(cuts) - _NAMED} more" if len(cuts) > _NAMED else ""
    msg = (
        f"{who} takes gradients through the net, but {len(cuts)} of its layers "
        f"({named}{more}) quantize their input to int8 (torchao's dynamic "
        "activation quantization), and torch passes no gradient through that "
        "rounding: every gradient before them would silently miss their "
        "paths. Use the float model, or one quantized weight-only "
        "(`Int8WeightOnlyConfig`), whose input gradients are exact."
    )
    raise ValueError(msg)
