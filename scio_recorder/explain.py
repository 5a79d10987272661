"""Explanations on a recorded net: Grad-CAM, activation patching, ablation.

Every layer is named as for :meth:`~scio_recorder.Recorder.record`: a
selector picks *calls* (labels), not modules, so the two calls of a reused
module are patched, ablated or read apart. Every edit goes through the
recorder's postprocessing path (``rnet(x, activation_postproc=...)``), so the
call-plan checks and the in-place safety of any recorded pass hold. The
recorder's selection is restored afterwards
(:meth:`~scio_recorder.Recorder.selecting`), and the net's parameters'
``.grad`` are never touched.

The net's inputs (``x``, ``source``, ``target``, ``clean``, ``corrupted``)
take one form everywhere: a tensor is the one positional argument, a tuple
the positional arguments, a mapping (a tokenizer's ``BatchEncoding``
included) the keyword arguments (``input_ids``, ``attention_mask``,
``labels``, ...), and a :class:`~scio_recorder.CallInputs` ``(args,
kwargs)`` both. (A net whose one argument is a dict takes ``(mapping,)``.)

* :func:`grad_cam`: class-activation heatmaps of a convolutional layer
  (Selvaraju et al. 2017), upsampled to the input size;
* :func:`patch`: run a *source* input, keep chosen layers' activations, run a
  *target* input with them substituted (whole tensors, or positions and
  channels), return the patched output; :func:`cache_run` keeps a source run
  for many patches;
* :func:`patch_sweep`: the patching grid layers x positions, batched;
* :func:`attribution_patch`: its linear estimate from one backward pass;
* :func:`logit_lens`: the final norm and unembedding applied to residual
  streams;
* :func:`ablate`: zero- or mean-ablation of chosen layers (means from
  :func:`layer_means`, one :func:`~scio_recorder.collect.collect` pass).
"""

from __future__ import annotations

__all__ = [
    "ActivationCache",
    "ablate",
    "attribution_patch",
    "cache_run",
    "grad_cam",
    "layer_means",
    "logit_lens",
    "patch",
    "patch_sweep",
]

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ._batches import as_arguments, first_batch_size
from ._engine.state import CallInputs
from ._outputs import logits_of
from ._tree import map_tensors
from .collect import collect
from .select import as_label, resolve, resolve_one

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from .layers import DepthIdx
    from .recorder import Recorder
    from .select import Selector


# -- the net's inputs ---------------------------------------------------------


def _arguments(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the positional and keyword arguments that ``inputs`` stands for.

    The convention of a callable ``input=`` of
    :func:`~scio_recorder.collect.collect`
    (:func:`scio_recorder._batches.as_arguments`): a :class:`CallInputs` is
    both; a tuple the positional arguments; a mapping (``BatchEncoding``
    too) the keyword arguments; anything else the one positional argument.
    """
    return as_arguments(inputs, spread=True)


def _run(rnet: Recorder, inputs: Any, **options: Any) -> Any:
    """Call ``rnet`` on ``inputs`` (see :func:`_arguments`) with ``options``."""
    args, kwargs = _arguments(inputs)
    clash = sorted(kwargs.keys() & {"activation_postproc", "dont_record"})
    if clash:
        msg = (
            f"the net's keyword inputs name {clash}, an option of the recorder: "
            "rename the net's argument."
        )
        raise ValueError(msg)
    return rnet(*args, **kwargs, **options)


def _batch_size(inputs: Any, who: str) -> int:
    """Return dim 0 of the first tensor among the inputs, or raise naming them."""
    size = first_batch_size(*_arguments(inputs))
    if size is not None:
        return size
    msg = (
        f"{who}: the inputs hold no tensor with a batch dimension "
        f"({type(inputs).__name__}); pass a tensor, a tuple of positional "
        "arguments or a mapping of keyword arguments (e.g. a tokenizer's output)."
    )
    raise ValueError(msg)


def _repeat(inputs: Any, times: int, batch: int) -> Any:
    """Repeat every argument tensor with ``batch`` rows ``times`` along dim 0.

    Row ``k * batch + i`` is row ``i``; other arguments (a ``[1, T]``
    ``position_ids`` when ``batch > 1``, flags, ...) are passed as they are.
    """

    def rep(value: Any) -> Any:
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch:
            return value.repeat(times, *[1] * (value.dim() - 1))
        return value

    args, kwargs = _arguments(inputs)
    return CallInputs(
        tuple(rep(v) for v in args), {k: rep(v) for k, v in kwargs.items()}
    )


def _requiring_grad(inputs: Any) -> Any:
    """Return ``inputs`` with every floating-point argument tensor a leaf needing grad.

    So that a layer's output is in the autograd graph even when no parameter
    requires a gradient.
    """

    def leaf(value: Any) -> Any:
        if isinstance(value, Tensor) and value.is_floating_point():
            return value.detach().requires_grad_(True)  # noqa: FBT003 (torch's flag)
        return value

    args, kwargs = _arguments(inputs)
    return CallInputs(
        tuple(leaf(v) for v in args), {k: leaf(v) for k, v in kwargs.items()}
    )


def _scalar(value: Any, who: str, name: str) -> Tensor:
    """Check that ``value`` (what ``name`` returned) is one number."""
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.reshape(())
    shown = (
        f"a tensor of shape {list(value.shape)}"
        if isinstance(value, Tensor)
        else repr(value)
        if value is None
        else f"a {type(value).__name__}"
    )
    msg = (
        f"{who}: `{name}` returned {shown}; it must return one number as a "
        "tensor, e.g. `lambda out: out.logits[:, -1, 7].sum()` or "
        "`lambda out: out.loss` (with `labels` among the inputs)."
    )
    raise ValueError(msg)


# -- layers -------------------------------------------------------------------


def _labels(
    rnet: Recorder, layers: Selector | list[Selector], who: str
) -> list[DepthIdx]:
    selectors = layers if isinstance(layers, list) else [layers]
    rows = resolve(rnet.table, rnet.net, selectors)
    if not rows:
        msg = f"{who}: {layers!r} selects no layer; see `print(rnet)` for the labels."
        raise ValueError(msg)
    return [row.label for row in rows]


def _labels_in_order(
    rnet: Recorder, layers: Selector | Sequence[Selector], who: str
) -> list[DepthIdx]:
    """Return the calls ``layers`` select, in the order given, without repeats.

    Each selector's calls come in table order: the rows of a grid.
    """
    selectors = list(layers) if isinstance(layers, list | range) else [layers]
    found: list[DepthIdx] = []
    for selector in selectors:
        for label in _labels(rnet, [selector], who):
            if label not in found:
                found.append(label)
    return found


def _in_call_order(
    rnet: Recorder, edits: Mapping[DepthIdx, Callable[[Any], Any]]
) -> list[Callable[[Any], Any]]:
    """Return the postprocessors as a list, in the order the recorded calls end.

    A list of postprocessors is consumed in that order, which the table knows
    from the reference pass.
    """
    order = sorted(edits, key=lambda label: rnet.table[label].end_order or 0)
    return [edits[label] for label in order]


def _stream(rnet: Recorder, label: DepthIdx, value: Any, who: str) -> Tensor:
    """Return the tensor a call passes on: its output, or its output's first item.

    Blocks of older Hugging Face models return ``(hidden_states, ...)``.
    """
    if isinstance(value, Tensor):
        return value
    if isinstance(value, tuple | list) and value and isinstance(value[0], Tensor):
        first: Tensor = value[0]
        return first
    msg = (
        f"{who}: layer {rnet.table[label].describe()} outputs a "
        f"{type(value).__name__}, not a tensor nor a tuple starting with one: "
        "name a layer whose output is the residual stream, e.g. a block."
    )
    raise TypeError(msg)


def _with_stream(value: Any, stream: Tensor) -> Any:
    """Return ``value`` with its stream (see :func:`_stream`) replaced."""
    if isinstance(value, Tensor):
        return stream
    return type(value)([stream, *value[1:]])


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
        The net's inputs (see the module docstring), with the image
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
        out = _run(rnet, inputs)
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
            chosen = _scalar(target(out), "grad_cam", "target")
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
    """Run ``target`` with ``edits`` applied to the outputs of their labels."""
    with rnet.selecting(*edits), torch.no_grad():
        return _run(rnet, target, activation_postproc=_in_call_order(rnet, edits))


@dataclasses.dataclass(frozen=True)
class ActivationCache:
    """The outputs of chosen calls in one run, kept to patch them elsewhere.

    Returned by :func:`cache_run`; :func:`patch` takes one in place of its
    ``source``, so that many patches of one source cost one source pass.

    Attributes
    ----------
    output : Any
        The net's output on the source.
    activations : Mapping
        Label ``(depth, idx)`` -> that call's output (copies, detached).
    """

    output: Any
    activations: Mapping[DepthIdx, Any]


def cache_run(
    rnet: Recorder, inputs: Any, layers: Selector | list[Selector]
) -> ActivationCache:
    """Run ``inputs`` once and keep the outputs of the calls ``layers`` select.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    inputs : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see the module docstring).
    layers : selector or list of selectors
        The calls to keep (every call a selector selects).

    Returns
    -------
    ActivationCache
        The output and the kept activations, by label, without gradient.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> a = torch.randn(1, 3)
    >>> cache = cache_run(rnet, a, ["0", "1"])
    >>> sorted(cache.activations)
    [(1, 1), (1, 2)]
    >>> b = torch.randn(1, 3)
    >>> torch.equal(patch(rnet, cache, b, "1"), cache.output)  # no source pass
    True

    """
    labels = _labels(rnet, layers, "cache_run")
    with rnet.selecting(*labels, clone=True, detach=True), torch.no_grad():
        output = _run(rnet, inputs)
        kept = {label: rnet.activations[label] for label in labels}
    return ActivationCache(output, kept)


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
    the two inputs? One pass of ``source`` serves every patched call; pass an
    :class:`ActivationCache` (:func:`cache_run`) as ``source`` to patch the
    same source into many targets, layers or positions with no source pass
    at all.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    source : Tensor, tuple, Mapping, CallInputs or ActivationCache
        The net's inputs (see the module docstring), or a cached run of them.
    target : Tensor, tuple, Mapping or CallInputs
        The net's inputs.
    layers : selector or list of selectors
        The layers to patch (every call they select; name one call of a
        reused module by its label to patch that call only).
    where : index, optional
        Patch only ``output[where]`` (e.g. ``(slice(None), 3)``: channel 3;
        ``(slice(None), 5)``: token 5 of a ``[B, T, D]`` output); default the
        whole tensor.

    Returns
    -------
    Any
        The net's output on ``target``, patched.

    Raises
    ------
    KeyError
        If ``source`` is a cache that lacks a patched layer.

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
    if isinstance(source, ActivationCache):
        missing = [label for label in labels if label not in source.activations]
        if missing:
            shown = ", ".join(rnet.table[label].describe() for label in missing)
            msg = (
                f"patch: the cached source run lacks layer {shown}: cache it "
                f"too, `cache_run(rnet, source, layers)` with these layers."
            )
            raise KeyError(msg)
        kept = {label: source.activations[label] for label in labels}
    else:
        kept = dict(cache_run(rnet, source, labels).activations)
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

    ``input`` and ``**options`` are those of
    :func:`~scio_recorder.collect.collect`: ``input=0`` takes item 0 of tuple
    batches, ``input=None`` passes the whole batch as the one argument, and
    ``input=dict`` passes each batch of keyword inputs (a tokenizer's output)
    as keyword arguments.

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
    x : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see the module docstring).
    layers : selector or list of selectors
        The layers ablated (every call they select; a label names one call
        of a reused module).
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


# -- language models ----------------------------------------------------------


def _check_like(
    rnet: Recorder, label: DepthIdx, got: Tensor, want: Tensor, who: str
) -> None:
    if got.shape[1:] != want.shape[1:]:
        msg = (
            f"{who}: layer {rnet.table[label].describe()} outputs "
            f"{list(got.shape)} on the corrupted input and {list(want.shape)} on "
            "the clean one: pass inputs of the same length (pad them, with an "
            "`attention_mask`)."
        )
        raise ValueError(msg)


def _positions(positions: Iterable[int] | None, length: int) -> list[int]:
    return list(range(length)) if positions is None else [int(p) for p in positions]


def _sweep_edit(
    rnet: Recorder,
    label: DepthIdx,
    clean: Tensor,
    cells: list[tuple[int, int]],
    batch: int,
) -> Callable[[Any], Any]:
    """Put ``clean[:, p]`` at rows ``k * batch ...`` of each cell ``(k, p)``."""

    def edit(output: Any) -> Any:
        if not cells:
            return None
        stream = _stream(rnet, label, output, "patch_sweep")
        _check_like(rnet, label, stream, clean, "patch_sweep")
        edited = stream.clone()
        for k, position in cells:
            edited[k * batch : (k + 1) * batch, position] = clean[:, position]
        return _with_stream(output, edited)

    return edit


def _cell_output(output: Any, k: int, batch: int, rows: int) -> Any:
    """Return the part of a batched output that belongs to cell ``k``.

    Every tensor with ``rows`` rows is cut to the cell's ``batch`` rows; any
    other tensor (a loss averaged over all the rows) becomes ``None``.
    """

    def cut(value: Tensor) -> Tensor | None:
        if value.dim() >= 1 and value.shape[0] == rows:
            return value[k * batch : (k + 1) * batch]
        return None

    return map_tensors(cut, output)


def patch_sweep(  # noqa: PLR0913 (keyword-only options)
    rnet: Recorder,
    clean: Any,
    corrupted: Any,
    layers: Selector | Sequence[Selector],
    metric: Callable[[Any], Tensor],
    *,
    positions: Iterable[int] | None = None,
    max_batch: int | None = None,
) -> Tensor:
    """Return the activation-patching grid: ``metric`` per layer and position.

    Cell ``[i, j]`` is ``metric`` of the net's output on ``corrupted`` with
    the output of layer ``i`` at position ``j`` (``output[:, j]``, every
    sample of the batch) taken from the run on ``clean``. The grid runs
    batched: one pass on ``clean``, then the corrupted inputs repeated along
    the batch dimension once per cell, each copy patched at its own cell:
    one pass for the whole grid, or ``ceil(cells * batch / max_batch)``
    passes of at most ``max_batch`` rows. The results equal a loop of single
    patched runs up to the rounding of batched matrix products (a few ulps).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its mode is used as is: call ``net.eval()`` first).
    clean, corrupted : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see the module docstring), of one shape. Every
        argument tensor whose first dimension is the batch size is repeated;
        the others (flags, a ``[1, T]`` ``position_ids``) are passed as is.
    layers : selector or list of selectors
        The grid's rows: every call each selector selects, in the order given
        (a label ``(depth, idx)`` names one call of a reused module). Each
        call outputs ``[batch, positions, ...]``, or a tuple starting with
        such a tensor (the residual stream of a block).
    metric : callable
        ``metric(output) -> scalar tensor``, e.g. ``lambda out:
        (out.logits[:, -1, good] - out.logits[:, -1, bad]).mean()``. It sees
        the output of one cell's copy of the batch: tensors with the batch
        dimension are cut to it, other tensors are ``None`` (a loss averaged
        over the whole batched pass means nothing per cell: compute it from
        the logits).
    positions : iterable of int, optional
        The grid's columns: indices along dimension 1 of the outputs; default
        every position of the first layer's output.
    max_batch : int, optional
        The most rows in one patched pass (at least one cell's batch); default
        the whole grid in one pass.

    Returns
    -------
    Tensor
        ``[len(layers), len(positions)]``, float, detached.

    Raises
    ------
    ValueError
        If ``metric`` does not return one number, if clean and corrupted
        outputs differ in shape, or if ``max_batch`` is below the batch size.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    >>> clean = torch.tensor([[1, 2, 3, 4, 5]])
    >>> corrupted = torch.tensor([[1, 2, 9, 4, 5]])
    >>> grid = patch_sweep(rnet, clean, corrupted, ["0", "1"], lambda out: out[0, 2, 0])
    >>> grid.shape
    torch.Size([2, 5])
    >>> with torch.no_grad():
    ...     bool(grid[0, 2] == net(clean)[0, 2, 0])  # position 2 restored
    True

    """
    labels = _labels_in_order(rnet, layers, "patch_sweep")
    batch = _batch_size(corrupted, "patch_sweep")
    clean_run = cache_run(rnet, clean, labels)
    streams = {
        label: _stream(rnet, label, clean_run.activations[label], "patch_sweep")
        for label in labels
    }
    columns = _positions(positions, streams[labels[0]].shape[1])
    cells = [(i, j) for i in range(len(labels)) for j in range(len(columns))]
    per_pass = len(cells) if max_batch is None else max_batch // batch
    if per_pass < 1:
        msg = (
            f"patch_sweep: `max_batch={max_batch}` is below the batch size "
            f"{batch} of the inputs: allow at least one copy of the batch."
        )
        raise ValueError(msg)
    grid = torch.empty(len(labels), len(columns), dtype=torch.float64)
    with rnet.selecting(*labels), torch.no_grad():
        for start in range(0, len(cells), per_pass):
            chunk = cells[start : start + per_pass]
            edits = {
                label: _sweep_edit(
                    rnet,
                    label,
                    streams[label],
                    [(k, columns[j]) for k, (i, j) in enumerate(chunk) if i == row],
                    batch,
                )
                for row, label in enumerate(labels)
            }
            rows = len(chunk) * batch
            output = _run(
                rnet,
                _repeat(corrupted, len(chunk), batch),
                activation_postproc=_in_call_order(rnet, edits),
                dont_record=True,
            )
            for k, (i, j) in enumerate(chunk):
                value = metric(_cell_output(output, k, batch, rows))
                grid[i, j] = _scalar(value, "patch_sweep", "metric").double()
    return grid.to(torch.get_default_dtype())


def attribution_patch(  # noqa: PLR0913 (keyword-only options)
    rnet: Recorder,
    clean: Any,
    corrupted: Any,
    layers: Selector | Sequence[Selector],
    metric: Callable[[Any], Tensor],
    *,
    positions: Iterable[int] | None = None,
) -> Tensor:
    """Return attribution patching's estimate of the patching grid's effects.

    Cell ``[i, j]`` is ``sum((clean_act - corrupted_act) * d metric / d act)``
    at layer ``i`` and position ``j``, summed over the batch and every
    dimension after the position (the hidden one), the gradient taken on the
    corrupted run (Nanda 2023, "Attribution patching"): the first-order
    estimate of ``patched metric - corrupted metric`` of
    :func:`patch_sweep`. One forward and one backward on ``corrupted``, one
    forward on ``clean``; the gradient is :func:`torch.autograd.grad` with
    respect to the activations (the parameters' ``.grad`` are untouched).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its mode is used as is: call ``net.eval()`` first).
    clean, corrupted : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see the module docstring), of one shape; put
        ``labels`` among the corrupted inputs for a metric on ``out.loss``.
    layers : selector or list of selectors
        The grid's rows, as for :func:`patch_sweep`.
    metric : callable
        ``metric(output) -> scalar tensor`` on the corrupted run's output.
    positions : iterable of int, optional
        The grid's columns (dimension 1 of the outputs); default all.

    Returns
    -------
    Tensor
        ``[len(layers), len(positions)]``, detached.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    >>> clean = torch.tensor([[1, 2, 3, 4, 5]])
    >>> corrupted = torch.tensor([[1, 2, 9, 4, 5]])
    >>> est = attribution_patch(rnet, clean, corrupted, ["1"], lambda o: o[0, 2, 0])
    >>> with torch.no_grad():  # the net after layer "1" is linear: exact
    ...     effect = net(clean)[0, 2, 0] - net(corrupted)[0, 2, 0]
    >>> bool(torch.isclose(est[0, 2], effect, atol=1e-6)), est[0, 0].item()
    (True, 0.0)

    """
    labels = _labels_in_order(rnet, layers, "attribution_patch")
    clean_run = cache_run(rnet, clean, labels)
    kept: dict[DepthIdx, Tensor] = {}

    def keep(label: DepthIdx) -> Callable[[Any], Any]:
        def edit(output: Any) -> Any:
            stream = _stream(rnet, label, output, "attribution_patch")
            if not stream.requires_grad:  # no parameter before it needs grad
                stream = stream.detach().requires_grad_(True)  # noqa: FBT003
                kept[label] = stream
                return _with_stream(output, stream)
            kept[label] = stream
            return None

        return edit

    edits = {label: keep(label) for label in labels}
    with rnet.selecting(*labels), torch.enable_grad():
        output = _run(
            rnet,
            corrupted,
            activation_postproc=_in_call_order(rnet, edits),
            dont_record=True,
        )
        value = _scalar(metric(output), "attribution_patch", "metric")
        acts = [kept[label] for label in labels]
        grads = torch.autograd.grad(value, acts, allow_unused=True)
    rows = []
    for label, act, grad in zip(labels, acts, grads, strict=True):
        source = _stream(rnet, label, clean_run.activations[label], "attribution_patch")
        _check_like(rnet, label, act, source, "attribution_patch")
        # None: the metric does not depend on this call
        slope = torch.zeros_like(act) if grad is None else grad
        product = (source - act.detach()) * slope
        rows.append(product.sum(0).flatten(1).sum(1))
    columns = _positions(positions, rows[0].shape[0])
    return torch.stack([row[columns] for row in rows])


_NORMS = (
    "transformer.ln_f",  # GPT-2, GPT-J
    "model.norm",  # Llama, Mistral, Qwen, Gemma
    "gpt_neox.final_layer_norm",  # Pythia
    "model.decoder.final_layer_norm",  # OPT
    "transformer.norm_f",
    "ln_final",  # TransformerLens
)
_UNEMBEDS = ("lm_head", "embed_out", "unembed")


def _module(
    rnet: Recorder,
    chosen: nn.Module | Selector | None,
    names: tuple[str, ...],
    role: str,
) -> nn.Module:
    """Return the module named by the user, or found by its usual names."""
    if isinstance(chosen, nn.Module):
        return chosen
    if chosen is not None:
        row = resolve_one(rnet.table, rnet.net, chosen, f"logit_lens: `{role}=`")
        return row.module
    net = rnet.net
    modules: dict[str, nn.Module] = dict(net.named_modules())
    for name in names:
        if name in modules:
            return modules[name]
    getter = getattr(net, "get_output_embeddings", None)
    if role == "unembed" and callable(getter):
        found = getter()  # Hugging Face's unembedding
        if isinstance(found, nn.Module):
            return found
    if role == "norm":  # the last norm called: the final one of a transformer
        rows = [
            row
            for row in rnet.table.values()
            if type(row.module).__name__.endswith("Norm") and row.end_order is not None
        ]
        if rows:
            return max(rows, key=lambda row: row.end_order or 0).module
    example = {"norm": '"transformer.ln_f"', "unembed": '"lm_head"'}[role]
    msg = (
        f"logit_lens: found no {role} module in {type(net).__name__} (looked for "
        f"{', '.join(names)}"
        + (", then the last *Norm called" if role == "norm" else "")
        + f"): name it, e.g. `{role}={example}` (a name, label or any selector "
        f"of one call, or a module)"
        + (", or `norm=torch.nn.Identity()` for none." if role == "norm" else ".")
    )
    raise ValueError(msg)


def logit_lens(
    rnet: Recorder,
    inputs: Any,
    layers: Selector | Sequence[Selector],
    *,
    norm: nn.Module | Selector | None = None,
    unembed: nn.Module | Selector | None = None,
) -> Tensor:
    """Return ``unembed(norm(h))`` for the residual stream ``h`` after each layer.

    The logit lens (nostalgebraist 2020): read what each layer's residual
    stream would predict if the net stopped there. One pass records the
    streams; the final norm and the unembedding are then called on each.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    inputs : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see the module docstring).
    layers : selector or list of selectors
        The calls whose outputs are residual streams (blocks), in the order
        given; a tuple output's first item is the stream.
    norm : module or selector, optional
        The final norm; default found by name (``transformer.ln_f`` of GPT-2,
        ``model.norm`` of Llama, Mistral, Qwen, ...), else the last norm
        called (a module whose type name ends with ``Norm``).
    unembed : module or selector, optional
        The unembedding; default ``lm_head`` (or the net's
        ``get_output_embeddings()``).

    Returns
    -------
    Tensor
        ``[len(layers), *stream.shape[:-1], vocabulary]``, detached.

    Raises
    ------
    ValueError
        If no norm or unembedding is named nor found: the message says how to
        name them.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    >>> net.add_module("lm_head", nn.Linear(4, 10))
    >>> rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    >>> ids = torch.tensor([[1, 2, 3, 4, 5]])
    >>> lens = logit_lens(rnet, ids, ["0", "1"])
    >>> lens.shape
    torch.Size([2, 1, 5, 10])
    >>> torch.equal(lens[1], net(ids).detach())  # the last stream: the output
    True

    """
    labels = _labels_in_order(rnet, layers, "logit_lens")
    final = _module(rnet, norm, _NORMS, "norm")
    head = _module(rnet, unembed, _UNEMBEDS, "unembed")
    run = cache_run(rnet, inputs, labels)
    with torch.no_grad():
        return torch.stack(
            [
                head(final(_stream(rnet, label, run.activations[label], "logit_lens")))
                for label in labels
            ]
        )
