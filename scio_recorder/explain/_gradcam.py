"""Grad-CAM: class-activation heatmaps of a convolutional layer."""

from __future__ import annotations

__all__ = ["grad_cam"]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._engine.state import CallInputs
from scio_recorder._outputs import logits_of
from scio_recorder.select import resolve_one

from ._base import arguments, one_number, run_net

if TYPE_CHECKING:
    from collections.abc import Callable

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def grad_cam(
    rnet: Recorder,
    x: Any,
    layer: Selector,
    target: Tensor | int | Callable[[Any], Tensor] | None = None,
    *,
    upsample: bool = True,
) -> Tensor:
    """Return Grad-CAM heatmaps of ``layer`` for the class ``target``.

    ``cam = ReLU(sum_k alpha_k A_k)``, ``A`` the layer's feature maps and
    ``alpha_k`` the spatial mean of ``d logit_target / d A_k`` (Selvaraju et
    al., ICCV 2017); each map is scaled to ``[0, 1]`` (a map of zeros stays
    zero). Gradients are taken with :func:`torch.autograd.grad` with respect
    to the recorded activation: the parameters' ``.grad`` are untouched.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its mode is used as is: call ``net.eval()`` first).
    x : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`), with the image
        ``[B, C, H, W]`` among them.
    layer : selector
        A layer with ``[B, K, h, w]`` outputs (one call).
    target : Tensor, int, callable or None
        Class per sample (``[B]``) or for all; default the predicted class;
        or a function of the net's output returning the scalar to explain
        (``lambda out: out.loss``).
    upsample : bool, default True
        Upsample to ``H x W`` (bilinear), those of the first 4-d input
        tensor; else the layer's ``h x w``.

    Returns
    -------
    Tensor
        ``[B, H, W]`` (or ``[B, h, w]``), float, in ``[0, 1]``, detached.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(
    ...     nn.Conv2d(3, 4, 3, padding=1),
    ...     nn.ReLU(),
    ...     nn.AdaptiveAvgPool2d(1),
    ...     nn.Flatten(),
    ...     nn.Linear(4, 2),
    ... )
    >>> rnet = Recorder(net, input_size=(1, 3, 8, 8))
    >>> cams = grad_cam(rnet, torch.randn(2, 3, 8, 8), layer="1")
    >>> cams.shape, bool(cams.min() >= 0), bool(cams.max() <= 1)
    (torch.Size([2, 8, 8]), True, True)
    >>> loss = grad_cam(rnet, torch.randn(2, 3, 8, 8), "1", lambda out: out[:, 1].sum())
    >>> loss.shape
    torch.Size([2, 8, 8])

    """
    label = resolve_one(rnet.table, rnet.net, layer, "grad_cam").label
    inputs = _requiring_grad(x)
    with rnet.selecting(label), torch.enable_grad():
        out = run_net(rnet, inputs)
        maps = rnet.activations[label]
        if not isinstance(maps, Tensor) or maps.dim() != 4:  # noqa: PLR2004 ([B, K, h, w])
            shape = (
                list(maps.shape) if isinstance(maps, Tensor) else type(maps).__name__
            )
            msg = (
                f"grad_cam: layer {rnet.table[label].describe()} outputs {shape}; "
                "Grad-CAM needs feature maps [batch, channels, height, width]: "
                "name a convolutional layer."
            )
            raise ValueError(msg)
        if callable(target) and not isinstance(target, Tensor):
            chosen = one_number(target(out), "grad_cam", "target")
        else:
            logits = logits_of(out)
            if target is None:
                classes = logits.argmax(dim=1)
            elif isinstance(target, int):
                classes = torch.full((logits.shape[0],), target, device=logits.device)
            else:
                classes = target.to(logits.device)
            chosen = logits.gather(1, classes.reshape(-1, 1)).sum()
        (grads,) = torch.autograd.grad(chosen, maps)
    weights = grads.mean(dim=(2, 3), keepdim=True)
    cam = torch.relu((weights * maps.detach()).sum(dim=1))
    if upsample:
        cam = torch.nn.functional.interpolate(
            cam[:, None], size=_image_size(inputs), mode="bilinear", align_corners=False
        )[:, 0]
    top = cam.flatten(1).amax(dim=1).clamp(min=torch.finfo(cam.dtype).tiny)
    return cam / top[:, None, None]


def _image_size(inputs: CallInputs) -> tuple[int, int]:
    for value in (*inputs.args, *inputs.kwargs.values()):
        if isinstance(value, Tensor) and value.dim() == 4:  # noqa: PLR2004 ([B, C, H, W])
            return int(value.shape[-2]), int(value.shape[-1])
    msg = (
        "grad_cam: `upsample=True` resizes to the input image, but no input is "
        "a [batch, channels, height, width] tensor: pass `upsample=False`."
    )
    raise ValueError(msg)


def _requiring_grad(inputs: Any) -> Any:
    """Return ``inputs`` with every floating-point argument tensor a leaf needing grad.

    So that a layer's output is in the autograd graph even when no parameter
    requires a gradient.
    """

    def leaf(value: Any) -> Any:
        if isinstance(value, Tensor) and value.is_floating_point():
            return value.detach().requires_grad_(True)  # noqa: FBT003 (torch's flag)
        return value

    args, kwargs = arguments(inputs)
    return CallInputs(
        tuple(leaf(v) for v in args), {k: leaf(v) for k, v in kwargs.items()}
    )
