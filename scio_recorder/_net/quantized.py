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

* ``record(grads=...)`` (:class:`~scio_recorder.Recorder`), and again at
  each pass that captures a selected gradient (a model quantized after the
  selection: the engine's ``PassState.watch_grad``);
* the explanations that differentiate the net: ``explain.grad_cam``,
  ``explain.attribution_patch``;
* every detector pass with autograd on (``ood``'s shared pass,
  ``run_pass(grad=True)``): the input perturbation of ODIN, of Mahalanobis
  and the multi-layer detectors with ``epsilon > 0`` (``gradient_step``),
  AdaScale's, and NAC's backward, in scoring and in their fits;
* ``data.train_classifier`` (its backward trains the layers before them).

GradNorm is not among them: it scores from the closed form of the last
layer's weight gradient, computed from that layer's recorded input and
output, with no gradient through the net.

How a layer is found to cut the gradient, without importing torchao: its
weight says so (torchao's ``Int8Tensor.act_quant_kwargs``,
``IntxUnpackedToInt8Tensor.activation_quantization``), or, for any other
weight of one of torchao's tensor classes (its configurations are many and
change), the layer is asked: its ``forward`` (no hooks) on a small input
that requires a gradient, and whether one reaches that input. The answer is
kept per weight.
"""

from __future__ import annotations

__all__ = ["gradient_cuts", "refuse_gradients", "weighted_layers"]

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

if TYPE_CHECKING:
    from collections.abc import Sequence

_MARKS = ("act_quant_kwargs", "activation_quantization")
"""Attributes by which torchao's weights say that their layer quantizes its input."""

_PLAIN = (nn.Parameter, Tensor)
"""The weights' types of plain layers (every pass with gradients looks: fast)."""

_ASKED: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""What the layer of each torchao weight (a key by identity) answered."""


def _cuts(module: nn.Module) -> bool:
    """Whether ``module`` quantizes its input, so that it passes it no gradient."""
    weight = module._parameters.get("weight")  # noqa: SLF001 (its own weight)
    if weight is None or type(weight) in _PLAIN:  # a float layer: no look further
        return False
    if any(getattr(weight, mark, None) is not None for mark in _MARKS):
        return True
    if not type(weight).__module__.startswith("torchao."):
        return False
    if weight not in _ASKED:
        _ASKED[weight] = _passes_no_gradient(module, weight)
    return bool(_ASKED[weight])


def _passes_no_gradient(module: nn.Module, weight: Tensor) -> bool:
    """Ask a layer with a torchao weight whether a gradient reaches its input.

    Its own ``forward`` (no hooks run) on ones of shape ``[2, in_features]``
    (no random draw) in the weight's dtype and device. A layer that cannot be
    asked so (a weight that is not ``[out, in]``, on ``meta``, or a forward
    that refuses the input) is not said to cut the gradient.
    """
    if weight.dim() != 2 or weight.is_meta:  # noqa: PLR2004 (a linear layer's weight)
        return False
    try:
        with torch.enable_grad():
            x = torch.ones(
                2, weight.shape[1], dtype=weight.dtype, device=weight.device
            ).requires_grad_()
            out = module.forward(x)
            if not (isinstance(out, Tensor) and out.requires_grad):
                return True
            (grad,) = torch.autograd.grad(out.sum(), x, allow_unused=True)
    except Exception:  # noqa: BLE001 (a layer that cannot be asked so)
        return False
    return grad is None


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


def weighted_layers(net: nn.Module) -> tuple[nn.Module, ...]:
    """Return the modules of ``net`` that hold a weight of their own.

    The only ones :func:`refuse_gradients` looks at: a caller that checks
    at every pass keeps them (``layers=``).

    Examples
    --------
    >>> from torch import nn
    >>> len(weighted_layers(nn.Sequential(nn.Linear(2, 2), nn.ReLU())))
    1

    """
    return tuple(m for m in net.modules() if "weight" in m._parameters)  # noqa: SLF001 (its own)


def refuse_gradients(
    net: nn.Module, who: str, layers: Sequence[nn.Module] | None = None
) -> None:
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
    layers : sequence of torch.nn.Module, optional
        The net's modules with a weight (:func:`weighted_layers`), kept by a
        caller that checks at every pass; by default the net's modules are
        walked.

    Raises
    ------
    ValueError
        Naming the layers (the first three, and how many more) and the fix.

    Examples
    --------
    >>> from torch import nn
    >>> refuse_gradients(nn.Sequential(nn.Linear(2, 2)), "doc")  # a float net

    """
    if not any(
        _cuts(module) for module in (net.modules() if layers is None else layers)
    ):
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
