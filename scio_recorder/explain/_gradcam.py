"""Grad-CAM: class-activation heatmaps of a convolutional layer."""

from __future__ import annotations

__all__ = ["grad_cam"]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._engine.state import CallInputs
from scio_recorder._net.outputs import logits_of
from scio_recorder._net.quantized import refuse_gradients
from scio_recorder.select import resolve_one

from ._base import arguments, check_flag, check_recorder, one_number, run_net

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
    r"""Return Grad-CAM heatmaps of ``layer`` for the class ``target``.

    $\operatorname{ReLU}(\sum_k \alpha_k A_k)$, $A_k$ the layer's feature
    maps and $\alpha_k$ the spatial mean of $\partial z_t / \partial A_k$,
    $z_t$ the logit of the target (Selvaraju et al., ICCV 2017); each map
    is scaled to ``[0, 1]`` (a map of zeros stays zero). Gradients are taken
    with :func:`torch.autograd.grad` with respect to the recorded
    activation: the parameters' ``.grad`` are untouched.

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

    Raises
    ------
    TypeError
        Before the pass: ``rnet`` is not a :class:`~scio_recorder.Recorder`,
        ``target`` is none of the kinds above (or a float tensor),
        ``upsample`` not a bool.
    ValueError
        Before the pass: ``upsample=True`` without a 4-d input, a negative
        class, a net with layers that pass no gradient to their input
        (torchao's dynamic activation quantization). After it: the layer's
        output is not ``[B, K, h, w]``, a class out of range of the logits,
        or ``target`` (a function) does not return one number.

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
    check_recorder(rnet, "grad_cam")
    label = resolve_one(rnet.table, rnet.net, layer, "grad_cam").label
    _check_target(target)
    check_flag(upsample, "upsample", "grad_cam")
    refuse_gradients(rnet.net, "grad_cam")
    inputs = _requiring_grad(x)
    size = _image_size(inputs) if upsample else None
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
            classes = _classes(target, logits)
            chosen = logits.gather(1, classes.reshape(-1, 1)).sum()
        (grads,) = torch.autograd.grad(chosen, maps)
    weights = grads.mean(dim=(2, 3), keepdim=True)
    cam = torch.relu((weights * maps.detach()).sum(dim=1))
    if size is not None:
        cam = torch.nn.functional.interpolate(
            cam[:, None], size=size, mode="bilinear", align_corners=False
        )[:, 0]
    top = cam.flatten(1).amax(dim=1).clamp(min=torch.finfo(cam.dtype).tiny)
    return cam / top[:, None, None]


_TARGET_ADVICE = (
    "pass a class index (`target=3`), one per sample (`target=torch.tensor([3, "
    "1])`), a function of the output (`target=lambda out: out.loss`), or None "
    "for the predicted class"
)


def _check_target(target: object) -> None:
    """Refuse a ``target`` of the wrong kind before the pass."""
    if target is None or (callable(target) and not isinstance(target, Tensor)):
        return
    if isinstance(target, int) and not isinstance(target, bool):
        if target < 0:
            msg = f"grad_cam: `target={target}` is a negative class: {_TARGET_ADVICE}."
            raise ValueError(msg)
        return
    if isinstance(target, Tensor):
        if (
            target.is_floating_point()
            or target.is_complex()
            or target.dtype == torch.bool
        ):
            msg = (
                f"grad_cam: `target` is a {target.dtype} tensor; class indices are "
                f"integers: {_TARGET_ADVICE}."
            )
            raise TypeError(msg)
        if target.dim() > 1:
            msg = (
                f"grad_cam: `target` has shape {list(target.shape)}; it holds one "
                f"class per sample, shape [batch]: {_TARGET_ADVICE}."
            )
            raise ValueError(msg)
        return
    msg = f"grad_cam: `target` is {target!r}: {_TARGET_ADVICE}."
    raise TypeError(msg)


def _classes(target: Tensor | int | None, logits: Tensor) -> Tensor:
    """Return the class of each sample, checked against the logits' shape."""
    if logits.dim() != 2:  # noqa: PLR2004 ([batch, classes])
        msg = (
            f"grad_cam: the net's logits have shape {list(logits.shape)}, not "
            "[batch, classes]: pass `target=` as a function of the output that "
            "returns the number to explain, e.g. `lambda out: out[:, 0, 3].sum()`."
        )
        raise ValueError(msg)
    batch, count = logits.shape
    if target is None:
        return logits.argmax(dim=1)
    if isinstance(target, int):
        classes = torch.full((batch,), target, device=logits.device)
    else:
        if target.numel() not in {1, batch}:
            msg = (
                f"grad_cam: `target` holds {target.numel()} classes for a batch "
                f"of {batch}: give one class per sample, or one for all."
            )
            raise ValueError(msg)
        classes = target.to(logits.device).reshape(-1).expand(batch)
    bad = classes[(classes < 0) | (classes >= count)]
    if bad.numel():
        msg = (
            f"grad_cam: `target` holds class {int(bad[0])}, out of range for the "
            f"{count} classes of the net's output: give indices from 0 to "
            f"{count - 1}."
        )
        raise ValueError(msg)
    return classes


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
