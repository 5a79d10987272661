"""Explanations on a recorded net: Grad-CAM, activation patching, ablation.

Every layer is named as for :meth:`~scio_recorder.Recorder.record`, and every
edit goes through the recorder's postprocessing path
(``rnet(x, activation_postproc=...)``), so the call-plan checks and the
in-place safety of any recorded pass hold. The recorder's selection is
restored afterwards (:meth:`~scio_recorder.Recorder.selecting`), and the
net's parameters' ``.grad`` are never touched.

* :func:`grad_cam`: class-activation heatmaps of a convolutional layer
  (Selvaraju et al. 2017), upsampled to the input size;
* :func:`patch`: run a *source* input, keep chosen layers' activations, run a
  *target* input with them substituted (whole tensors, or positions and
  channels), return the patched output;
* :func:`ablate`: zero- or mean-ablation of chosen layers (means from
  :func:`layer_means`, one :func:`~scio_recorder.collect.collect` pass).
"""

from __future__ import annotations

__all__ = ["ablate", "grad_cam", "layer_means", "patch"]

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._outputs import logits_of
from .collect import collect
from .select import as_label, resolve, resolve_one

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .layers import DepthIdx
    from .recorder import Recorder
    from .select import Selector


def _labels(
    rnet: Recorder, layers: Selector | list[Selector], who: str
) -> list[DepthIdx]:
    selectors = layers if isinstance(layers, list) else [layers]
    rows = resolve(rnet.table, rnet.net, selectors)
    if not rows:
        msg = f"{who}: {layers!r} selects no layer; see `print(rnet)` for the labels."
        raise ValueError(msg)
    return [row.label for row in rows]


def grad_cam(
    rnet: Recorder,
    x: Tensor,
    layer: Selector,
    target: Tensor | int | None = None,
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
    x : Tensor
        Inputs ``[B, C, H, W]``.
    layer : selector
        A layer with ``[B, K, h, w]`` outputs (one call).
    target : Tensor, int or None
        Class per sample (``[B]``) or for all; default the predicted class.
    upsample : bool, default True
        Upsample to ``H x W`` (bilinear); else the layer's ``h x w``.

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

    """
    label = resolve_one(rnet.table, rnet.net, layer, "grad_cam").label
    x = x.detach().requires_grad_(True)  # noqa: FBT003 (torch's positional flag)
    with rnet.selecting(label), torch.enable_grad():
        logits = logits_of(rnet(x))
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
            cam[:, None], size=x.shape[-2:], mode="bilinear", align_corners=False
        )[:, 0]
    top = cam.flatten(1).amax(dim=1).clamp(min=torch.finfo(cam.dtype).tiny)
    return cam / top[:, None, None]


def _replace(values: Tensor, where: Any) -> Callable[[Tensor], Tensor]:
    def edit(output: Tensor) -> Tensor:
        if not isinstance(output, Tensor) or output.shape != values.shape:
            got = (
                list(output.shape)
                if isinstance(output, Tensor)
                else type(output).__name__
            )
            msg = (
                f"the patched layer outputs {got} here and {list(values.shape)} "
                "in the source run: patch inputs of the same shape, or select "
                "positions with `where=`."
            )
            raise ValueError(msg)
        return _put(output, values, where)

    return edit


def _put(output: Tensor, values: Tensor, where: Any) -> Tensor:
    """Return ``values``, or ``output`` with ``values[where]`` put at ``where``."""
    if where is None:
        return values
    edited = output.clone()
    edited[where] = values[where]
    return edited


def _run_edited(
    rnet: Recorder,
    target: Any,
    edits: dict[DepthIdx, Callable[[Tensor], Tensor]],
) -> Any:
    """Run ``target`` with ``edits`` applied to the outputs of their labels.

    A list of postprocessors is consumed in the order the recorded calls end,
    which the table knows from the reference pass.
    """
    order = sorted(edits, key=lambda label: rnet.table[label].end_order or 0)
    with rnet.selecting(*edits), torch.no_grad():
        return rnet(*_args(target), activation_postproc=[edits[k] for k in order])


def _args(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def patch(
    rnet: Recorder,
    source: Any,
    target: Any,
    layers: Selector | list[Selector],
    *,
    where: Any = None,
) -> Any:
    """Run ``target`` with ``layers``' activations taken from a run of ``source``.

    The basic experiment of mechanistic interpretability: does the
    information at these layers (and positions) carry the difference between
    the two inputs?

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    source, target : Tensor or tuple
        The net's inputs (a tuple for several positional arguments).
    layers : selector or list of selectors
        The layers to patch (every call they select).
    where : index, optional
        Patch only ``output[where]`` (e.g. ``(slice(None), 3)``: channel 3;
        ``(slice(None), 5)``: token 5 of a ``[B, T, D]`` output); default the
        whole tensor.

    Returns
    -------
    Any
        The net's output on ``target``, patched.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> a, b = torch.randn(1, 3), torch.randn(1, 3)
    >>> torch.equal(patch(rnet, a, b, layers="0"), net(a))  # all of it: a's output
    True

    """
    labels = _labels(rnet, layers, "patch")
    with rnet.selecting(*labels), torch.no_grad():
        rnet(*_args(source))
        kept = {label: rnet.activations[label] for label in labels}
    return _run_edited(rnet, target, {k: _replace(v, where) for k, v in kept.items()})


def layer_means(
    rnet: Recorder,
    batches: Iterable[Any],
    layers: Selector | list[Selector],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
    **options: Any,
) -> dict[DepthIdx, Tensor]:
    """Return each layer's mean activation over a data set (one ``collect`` pass).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    >>> layer_means(rnet, [torch.ones(4, 3)], "0", input=None)[(1, 1)].shape
    torch.Size([2])

    """
    labels = _labels(rnet, layers, "layer_means")
    result = collect(
        rnet, batches, dict.fromkeys(labels, "moments"), input=input, **options
    )
    return {label: result[label].mean for label in labels}


def ablate(
    rnet: Recorder,
    x: Any,
    layers: Selector | list[Selector],
    *,
    means: Mapping[Any, Tensor] | None = None,
    where: Any = None,
) -> Any:
    """Run ``x`` with ``layers``' activations zeroed, or set to their means.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    x : Tensor or tuple
        The net's inputs.
    layers : selector or list of selectors
        The layers ablated.
    means : Mapping, optional
        Layer -> mean activation, as :func:`layer_means` returns it:
        mean-ablation; default zero-ablation. A key is a label ``(depth,
        idx)`` or any selector of the layer; keys of layers not ablated are
        ignored. A mean must broadcast to the layer's output (its shape
        without the batch dimension, as :func:`layer_means` gives, does).
    where : index, optional
        Ablate only ``output[where]``.

    Returns
    -------
    Any
        The net's output, ablated.

    Raises
    ------
    TypeError
        If ``means`` is not a mapping, or one of its values is not a tensor.
    ValueError
        If a key of ``means`` is not a layer of the net, or a mean does not
        broadcast to its layer's output.
    KeyError
        If an ablated layer has no mean in ``means``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> out = ablate(rnet, torch.randn(4, 3), layers="1")
    >>> torch.allclose(out, net[2].bias.expand(4, 2))  # nothing reaches the head
    True

    """
    labels = _labels(rnet, layers, "ablate")
    by_label = None if means is None else _means_by_label(rnet, means)
    edits: dict[DepthIdx, Callable[[Tensor], Tensor]] = {}
    for label in labels:
        if by_label is None:
            edits[label] = _ablation(None, where)
            continue
        if label not in by_label:
            msg = (
                f"ablate: no mean for layer {rnet.table[label].describe()}: compute "
                "them with `layer_means(rnet, batches, layers)`."
            )
            raise KeyError(msg)
        key, mean = by_label[label]
        edits[label] = _ablation(
            mean, where, f"means[{key!r}]", rnet.table[label].describe()
        )
    return _run_edited(rnet, x, edits)


_MEANS_ADVICE = (
    "pass `means=layer_means(rnet, batches, layers)`, a mapping from each "
    "ablated layer's label to its mean activation"
)


def _means_by_label(
    rnet: Recorder, means: object
) -> dict[DepthIdx, tuple[object, Tensor]]:
    """Check ``ablate``'s ``means``; return label -> (the user's key, mean)."""
    if not isinstance(means, Mapping):
        shown = (
            f"a Tensor of shape {list(means.shape)}"
            if isinstance(means, Tensor)
            else f"a {type(means).__name__}"
        )
        msg = (
            f"ablate: `means` must be a mapping from layer to mean activation, "
            f"got {shown}: {_MEANS_ADVICE}, e.g. `means={{(1, 2): mean}}` for one "
            "layer."
        )
        raise TypeError(msg)
    by_label: dict[DepthIdx, tuple[object, Tensor]] = {}
    for key, mean in means.items():
        if not isinstance(mean, Tensor):
            msg = (
                f"ablate: `means[{key!r}]` is a {type(mean).__name__}, not a "
                f"tensor: {_MEANS_ADVICE}."
            )
            raise TypeError(msg)
        for label in _key_labels(rnet, key):
            if label in by_label:
                msg = (
                    f"ablate: `means` has two means for layer "
                    f"{rnet.table[label].describe()}, under the keys "
                    f"{by_label[label][0]!r} and {key!r}: keep one of them."
                )
                raise ValueError(msg)
            by_label[label] = (key, mean)
    return by_label


def _key_labels(rnet: Recorder, key: object) -> list[DepthIdx]:
    """Return the labels a key of ``means`` stands for, or raise naming it."""
    label = as_label(key)
    if label is not None and label in rnet.table:
        return [label]
    problem = "no label of this net"
    if label is None:
        try:
            rows = resolve(rnet.table, rnet.net, [key])
        except (KeyError, ValueError, TypeError) as error:
            problem = str(error)
        else:
            if rows:
                return [row.label for row in rows]
            problem = "it selects no layer"
    msg = (
        f"ablate: the key {key!r} of `means` is not a layer of this net "
        f"({problem}); see `print(rnet)` for the labels, and {_MEANS_ADVICE}."
    )
    raise ValueError(msg)


def _ablation(
    mean: Tensor | None, where: Any, name: str = "", layer: str = ""
) -> Callable[[Tensor], Tensor]:
    def edit(output: Tensor) -> Tensor:
        if mean is None:
            return _put(output, torch.zeros_like(output), where)
        try:
            shape = torch.broadcast_shapes(mean.shape, output.shape)  # type: ignore[no-untyped-call]
            fits = shape == output.shape
        except RuntimeError:
            fits = False
        if not fits:
            msg = (
                f"ablate: `{name}` has shape {list(mean.shape)}, which does not "
                f"broadcast to the output {list(output.shape)} of layer {layer}: "
                f"pass the layer's mean activation, of shape "
                f"{list(output.shape[1:])} (the output without its batch "
                "dimension, as `layer_means` returns it)."
            )
            raise ValueError(msg)
        value = mean.to(output).expand_as(output).clone()
        return _put(output, value, where)

    return edit
