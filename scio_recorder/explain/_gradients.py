r"""Gradient attributions: integrated gradients, saliency, input x gradient, SmoothGrad.

One machinery for the four, computed as captum 0.9 computes them (its step
sizes and alphas, its convergence delta), on the net as it is, through the
recorder:

* the *attributed tensors* of ``x`` are its floating-point tensors; where it
  has none (token ids), its first tensor (``input_ids``);
* with ``layer=None`` the gradient is taken with respect to those tensors;
  with ``layer=`` a label, with respect to that call's output (its first
  tensor), replaced in each pass through ``activation_postproc`` by the
  point where the gradient is wanted, as captum's layer methods do with a
  forward hook;
* every pass runs a batch of *rows*, each row a copy of one sample of ``x``
  (its other batch tensors, an ``attention_mask``, copied alongside), so
  that ``steps x batch`` or ``samples x batch`` rows can be split into
  passes of ``internal_batch_size`` rows.

The gradient is :func:`torch.autograd.grad` of the target's values: the
parameters' ``.grad`` are untouched.
"""

from __future__ import annotations

__all__ = ["input_x_gradient", "integrated_gradients", "saliency", "smoothgrad"]

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from scio_recorder._engine.state import CallInputs
from scio_recorder._net.outputs import logits_of
from scio_recorder._net.quantized import refuse_gradients
from scio_recorder.select import resolve_one

from ._base import (
    arguments,
    batch_of,
    check_flag,
    check_recorder,
    run_keeping,
    run_net,
    stream_of,
    with_stream,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

METHODS = (
    "gausslegendre",
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
)
"""The integration rules of :func:`integrated_gradients`, named as in captum."""

_TARGET_ADVICE = (
    "pass a class index (`target=3`), one per sample (`target=[3, 1]`), a "
    "function of the output returning one number per sample (`target=lambda "
    "out: out.logits[:, -1, 7]`), or None for the predicted class"
)


def rule(method: str, steps: int, who: str) -> tuple[list[float], list[float]]:
    """Return the step sizes and alphas of ``method`` for ``steps``, as captum.

    Riemann rules: steps of ``1 / steps`` at float32 ``linspace`` points
    (captum's trapezoid halves the two end steps and puts its points at 0,
    ..., 1: its weights sum to ``1 - 1 / steps``); Gauss-Legendre: NumPy's
    ``leggauss`` nodes and weights mapped from ``[-1, 1]`` to ``[0, 1]``.
    """
    if method not in METHODS:
        msg = (
            f"{who}: `method={method!r}` is not an integration rule: use one of "
            f"{list(METHODS)}."
        )
        raise ValueError(msg)
    least = 1 if method == "gausslegendre" else 2
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < least:
        msg = (
            f"{who}: `steps={steps!r}` must be an int of at least {least} for "
            f"`method={method!r}`."
        )
        raise ValueError(msg)
    if method == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        return (0.5 * weights).tolist(), (0.5 * (1 + nodes)).tolist()
    sizes = [1 / steps] * steps
    kind = method.removeprefix("riemann_")
    if kind == "trapezoid":
        sizes[0] /= 2
        sizes[-1] /= 2
    start, end = {
        "left": (0.0, 1 - 1 / steps),
        "right": (1 / steps, 1.0),
        "middle": (1 / (2 * steps), 1 - 1 / (2 * steps)),
        "trapezoid": (0.0, 1.0),
    }[kind]
    return sizes, torch.linspace(start, end, steps).tolist()


# -- the setting: the inputs, the attributed tensors, the target --------------


@dataclass
class _Setting:
    """What every pass of one attribution shares."""

    rnet: Recorder
    who: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batch: int
    keys: list[int | str]
    """Where the attributed tensors are: a positional index or a keyword."""
    label: DepthIdx | None
    target: Any

    def inputs(self) -> list[Tensor]:
        """Return the attributed tensors of ``x``."""
        return [self._get(key) for key in self.keys]

    def _get(self, key: int | str) -> Tensor:
        value: Tensor = self.args[key] if isinstance(key, int) else self.kwargs[key]
        return value

    def rows(
        self, rows: Tensor, replaced: Sequence[Tensor] | None = None
    ) -> CallInputs:
        """Return the inputs of the pass whose row ``i`` is sample ``rows[i]``.

        Every tensor with the batch as dimension 0 is indexed; the attributed
        tensors are ``replaced`` where given (they already have the rows).
        """

        def take(value: Any) -> Any:
            if (
                isinstance(value, Tensor)
                and value.dim() > 0
                and value.shape[0] == self.batch
            ):
                return value.index_select(0, rows.to(value.device))
            return value

        args = [take(value) for value in self.args]
        kwargs = {name: take(value) for name, value in self.kwargs.items()}
        for key, value in zip(self.keys, replaced or (), strict=False):
            if isinstance(key, int):
                args[key] = value
            else:
                kwargs[key] = value
        return CallInputs(tuple(args), kwargs)

    def with_inputs(self, values: Sequence[Tensor]) -> CallInputs:
        """Return ``x`` with its attributed tensors replaced by ``values``."""
        return self.rows(torch.arange(self.batch), values)

    def last_real(self, rows: Tensor) -> Tensor | None:
        """Return each row's last real position (``attention_mask``), or None.

        A right-padded row's last position is padding: its logits there are
        not the row's next-token distribution.
        """
        mask = self.kwargs.get("attention_mask")
        if not isinstance(mask, Tensor) or mask.dim() != 2:  # noqa: PLR2004 ([B, T])
            return None
        real = (mask != 0).long().cumsum(dim=1)  # its maximum: the last real token
        return real.argmax(dim=1).index_select(0, rows.to(real.device))

    def scores(self, output: Any, rows: Tensor) -> Tensor:
        """Return the target's value on each row of a pass, ``[rows]``."""
        if callable(self.target) and not isinstance(self.target, Tensor):
            values = self.target(output)
            if not isinstance(values, Tensor) or values.shape != (len(rows),):
                shown = (
                    list(values.shape)
                    if isinstance(values, Tensor)
                    else type(values).__name__
                )
                msg = (
                    f"{self.who}: `target` returned {shown} for a pass of "
                    f"{len(rows)} rows; it must return one number per row, a "
                    "tensor of shape [rows], e.g. `lambda out: out.logits[:, -1, 7]`."
                )
                raise ValueError(msg)
            return values
        logits = class_logits(output, self.who, self.last_real(rows))
        classes = self.target.to(logits.device).index_select(0, rows.to(logits.device))
        count = logits.shape[1]
        bad = classes[(classes < 0) | (classes >= count)]
        if bad.numel():
            msg = (
                f"{self.who}: `target` holds class {int(bad[0])}, out of range for "
                f"the {count} classes of the net's output: give indices from 0 to "
                f"{count - 1}."
            )
            raise ValueError(msg)
        return logits.gather(1, classes.reshape(-1, 1))[:, 0]


def class_logits(output: Any, who: str, last: Tensor | None = None) -> Tensor:
    """Return the ``[rows, classes]`` logits (a language model's: the last position).

    ``last``: each row's last real position (of an ``attention_mask``), taken
    instead of the last position where the logits have that many positions.
    """
    logits = logits_of(output)
    if logits.dim() == 3 and last is not None:  # noqa: PLR2004 ([rows, positions, vocabulary])
        rows = torch.arange(len(logits), device=logits.device)
        logits = logits[rows, last.to(logits.device).clamp(max=logits.shape[1] - 1)]
    elif logits.dim() > 2:  # noqa: PLR2004 ([rows, positions, vocabulary])
        logits = logits[:, -1]
    if logits.dim() != 2:  # noqa: PLR2004 ([rows, classes])
        msg = (
            f"{who}: the net's logits have shape {list(logits.shape)}, not "
            "[batch, classes]: pass `target=` as a function of the output that "
            "returns one number per sample, e.g. `lambda out: out[:, 0]`."
        )
        raise ValueError(msg)
    return logits


def _setting(
    rnet: Recorder, x: Any, target: Any, layer: Selector | None, who: str
) -> _Setting:
    check_recorder(rnet, who)
    args, kwargs = arguments(x)
    batch = batch_of(x, "x", who)
    label = (
        None if layer is None else resolve_one(rnet.table, rnet.net, layer, who).label
    )
    keys = _attributed(args, kwargs, batch, need_float=label is None, who=who)
    refuse_gradients(rnet.net, who)
    setting = _Setting(rnet, who, tuple(args), dict(kwargs), batch, keys, label, None)
    setting.target = _classes(setting, target)
    return setting


def _attributed(
    args: Sequence[Any],
    kwargs: dict[str, Any],
    batch: int,
    *,
    need_float: bool,
    who: str,
) -> list[int | str]:
    """Return where ``x``'s attributed tensors are (see the module's docstring)."""
    places: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
    batched = [
        (key, value)
        for key, value in places
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch
    ]
    floats = [key for key, value in batched if value.is_floating_point()]
    if floats:
        return floats
    if need_float:
        msg = (
            f"{who}: `x` holds no floating-point tensor to take a gradient with "
            "respect to (token ids are integers): pass `layer=` the embedding, "
            "e.g. `layer='transformer.wte'`, to attribute to its output as "
            "captum's LayerIntegratedGradients does."
        )
        raise ValueError(msg)
    ids: list[int | str] = [key for key, _ in batched if key == "input_ids"]
    return ids or [batched[0][0]]


def _classes(setting: _Setting, target: Any) -> Any:
    """Return ``target`` as a function or as one class per sample (a long tensor)."""
    who, batch = setting.who, setting.batch
    if callable(target) and not isinstance(target, Tensor):
        return target
    if target is None:
        with torch.no_grad():
            output = run_net(setting.rnet, CallInputs(setting.args, setting.kwargs))
        last = setting.last_real(torch.arange(batch))
        return class_logits(output, who, last).argmax(dim=1).cpu()
    if isinstance(target, bool) or not isinstance(target, int | Tensor | list | tuple):
        msg = f"{who}: `target` is {target!r}: {_TARGET_ADVICE}."
        raise TypeError(msg)
    classes = torch.as_tensor(target)
    if (
        classes.is_floating_point()
        or classes.is_complex()
        or classes.dtype == torch.bool
    ):
        msg = (
            f"{who}: `target` holds {classes.dtype} values; class indices are "
            f"integers: {_TARGET_ADVICE}."
        )
        raise TypeError(msg)
    if classes.dim() > 1 or classes.numel() not in {1, batch}:
        msg = (
            f"{who}: `target` has shape {list(classes.shape)} for a batch of "
            f"{batch}: give one class per sample, or one for all: {_TARGET_ADVICE}."
        )
        raise ValueError(msg)
    return classes.reshape(-1).expand(batch).long().cpu()


# -- the passes ---------------------------------------------------------------


def _gradients(
    setting: _Setting, values: Sequence[Tensor], rows: Tensor
) -> list[Tensor]:
    """Return the target's gradients at ``values``, the attributed points of ``rows``.

    ``values`` are input tensors (no layer) or the layer's output (one),
    with ``len(rows)`` rows.
    """
    leaves = [value.detach().requires_grad_(True) for value in values]  # noqa: FBT003
    rnet = setting.rnet
    with torch.enable_grad():
        if setting.label is None:
            output = run_net(rnet, setting.rows(rows, leaves))
        else:
            (leaf,) = leaves

            def replace(out: Any) -> Any:
                got = stream_of(rnet, setting.label, out, setting.who)  # type: ignore[arg-type]
                if got.shape != leaf.shape:
                    msg = (
                        f"{setting.who}: layer "
                        f"{rnet.table[setting.label].describe()} outputs "  # type: ignore[index]
                        f"{list(got.shape)} here and {list(leaf.shape)} on the "
                        "inputs: the layer's output must not depend on the batch's "
                        "size."
                    )
                    raise ValueError(msg)
                return with_stream(out, leaf)

            with rnet.selecting(setting.label):
                output = run_net(
                    rnet,
                    setting.rows(rows),
                    activation_postproc=[replace],
                    dont_record=True,
                )
        scores = setting.scores(output, rows)
        grads = torch.autograd.grad(
            scores, leaves, grad_outputs=torch.ones_like(scores), allow_unused=True
        )
    return [
        torch.zeros_like(leaf) if grad is None else grad
        for leaf, grad in zip(leaves, grads, strict=True)
    ]


def _points(setting: _Setting, inputs: Any) -> list[Tensor]:
    """Return the attributed points of ``inputs``: its tensors, or the layer's."""
    if setting.label is None:
        args, kwargs = arguments(inputs)
        return [
            (args[key] if isinstance(key, int) else kwargs[key]).detach()
            for key in setting.keys
        ]
    _, kept = run_keeping(setting.rnet, inputs, [setting.label])
    return [stream_of(setting.rnet, setting.label, kept[setting.label], setting.who)]


def _row_scores(setting: _Setting, inputs: CallInputs) -> Tensor:
    with torch.no_grad():
        output = run_net(setting.rnet, inputs)
        return setting.scores(output, torch.arange(setting.batch))


def _per_pass(internal_batch_size: int | None, batch: int, who: str) -> int | None:
    """Return how many copies of the batch one pass holds (None: all)."""
    if internal_batch_size is None:
        return None
    if (
        not isinstance(internal_batch_size, int)
        or isinstance(internal_batch_size, bool)
        or internal_batch_size < batch
    ):
        msg = (
            f"{who}: `internal_batch_size={internal_batch_size!r}` must be an int "
            f"of at least the batch size {batch} (the most rows in one pass), or None."
        )
        raise ValueError(msg)
    return internal_batch_size // batch


def _baselines(setting: _Setting, baselines: Any) -> list[Tensor]:
    """Return one baseline per attributed tensor, of its shape."""
    inputs = setting.inputs()
    who = setting.who
    if baselines is None:
        return [torch.zeros_like(value) for value in inputs]
    if isinstance(baselines, int | float) and not isinstance(baselines, bool):
        return [torch.full_like(value, baselines) for value in inputs]
    given = list(baselines) if isinstance(baselines, tuple | list) else [baselines]
    if len(given) != len(inputs) or not all(
        isinstance(b, Tensor | int | float) for b in given
    ):
        msg = (
            f"{who}: `baselines` gives {len(given)} values for the "
            f"{len(inputs)} attributed tensors of `x` ({setting.keys}): give "
            "one tensor (or number) per attributed tensor, or None for zeros."
        )
        raise ValueError(msg)
    out = []
    for value, base in zip(inputs, given, strict=True):
        if not isinstance(base, Tensor):
            out.append(torch.full_like(value, base))
            continue
        try:
            out.append(base.to(value.device, value.dtype).expand_as(value))
        except RuntimeError:
            msg = (
                f"{who}: a baseline of shape {list(base.shape)} does not fit its "
                f"input of shape {list(value.shape)}: give the input's shape, or "
                "one sample's with a batch of 1."
            )
            raise ValueError(msg) from None
    return out


def _output(values: list[Tensor]) -> Tensor | tuple[Tensor, ...]:
    return values[0] if len(values) == 1 else tuple(values)


# -- the public functions -----------------------------------------------------


def integrated_gradients(  # noqa: PLR0913, PLR0917 (the interface: captum's options)
    rnet: Recorder,
    x: Any,
    target: Any = None,
    baselines: Any = None,
    steps: int = 50,
    method: str = "gausslegendre",
    layer: Selector | None = None,
    internal_batch_size: int | None = None,
    return_delta: bool = False,  # noqa: FBT001, FBT002 (captum's flag, by name)
) -> Any:
    r"""Return the integrated gradients of ``target`` at ``x`` (or at ``layer``).

    $(x - x') \odot \sum_k w_k \, \partial F / \partial x \,|_{x' + \alpha_k
    (x - x')}$, $x'$ the baseline and $(w_k, \alpha_k)$ the integration
    rule's step sizes and points (Sundararajan et al., ICML 2017), computed
    as captum 0.9's ``IntegratedGradients`` does. With ``layer=``, $x$ is
    that call's output on the inputs and $x'$ its output on the baseline
    inputs, the net run on the inputs with the layer's output replaced by
    each point: captum's ``LayerIntegratedGradients`` (for token ids and the
    embedding, the usual token attributions: sum them over the hidden
    dimension).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its mode is used as is: call ``net.eval()`` first).
    x : Tensor, tuple, Mapping or CallInputs
        The net's inputs (see :mod:`scio_recorder.explain`). The attributed
        tensors are its floating-point tensors, or (token ids) its first
        tensor, ``input_ids`` if named; the others (an ``attention_mask``)
        are copied into every pass.
    target : int, sequence of int, Tensor, callable or None
        The class to explain, one for all or one per sample (as captum); of a
        language model's ``[batch, positions, vocabulary]`` logits, at the
        last position (each row's last real token where ``x`` has an
        ``attention_mask``: a right-padded row's own). Or a function of the
        output returning one number per row of the pass (``lambda out:
        out.logits[:, 3, 7]``). Default the class predicted on ``x``.
    baselines : Tensor, number, tuple or None
        The baseline of each attributed tensor (of its shape, or one sample's
        with a batch of 1), a number for all, or None for zeros (for token
        ids: token 0, as captum).
    steps : int, default 50
        The number of points of the integral.
    method : str, default "gausslegendre"
        ``"gausslegendre"``, ``"riemann_left"``, ``"riemann_right"``,
        ``"riemann_middle"`` or ``"riemann_trapezoid"`` (captum's names,
        step sizes and points).
    layer : selector or None
        A call whose output (its first tensor) to attribute to; None: the
        inputs.
    internal_batch_size : int or None
        The most rows (points x samples) in one pass; None: all in one.
    return_delta : bool, default False
        Also return the convergence delta, per sample: the attributions'
        sum minus $F(x) - F(x')$ (on the net's output, for the layer too).

    Returns
    -------
    Tensor or tuple of Tensor, or (that, Tensor)
        The attributions, of the attributed tensor's shape (or the layer's
        output's; a tuple when ``x`` has several floating-point tensors),
        detached; with ``return_delta=True``, ``(attributions, delta)``,
        ``delta`` of shape ``[batch]``.

    Raises
    ------
    TypeError
        Before any pass: ``rnet`` is not a :class:`~scio_recorder.Recorder`,
        ``target`` is none of the kinds above, ``return_delta`` not a bool.
    ValueError
        Before any pass: an unknown ``method``, too few ``steps`` (2 for a
        Riemann rule), ``internal_batch_size`` below the batch, no
        floating-point input without ``layer=``, baselines that do not fit
        the inputs, a net with layers that pass no gradient to their input.
        During them: a class out of range, a ``target`` function that does
        not return one number per row.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> x = torch.randn(2, 3)
    >>> attributions, delta = integrated_gradients(rnet, x, target=1, return_delta=True)
    >>> attributions.shape, bool(delta.abs().max() < 1e-3)  # completeness
    (torch.Size([2, 3]), True)
    >>> integrated_gradients(rnet, x, target=[0, 1], layer="1").shape
    torch.Size([2, 4])

    """
    who = "integrated_gradients"
    sizes, alphas = rule(method, steps, who)
    check_flag(return_delta, "return_delta", who)
    setting = _setting(rnet, x, target, layer, who)
    per_pass = _per_pass(internal_batch_size, setting.batch, who) or steps
    bases = _baselines(setting, baselines)
    base_inputs = setting.with_inputs(bases)
    ends = _points(setting, CallInputs(setting.args, setting.kwargs))
    if setting.label is None:
        starts = [base.detach() for base in bases]
    else:
        starts = _points(setting, base_inputs)
    totals = [torch.zeros_like(end) for end in ends]
    examples = torch.arange(setting.batch)
    for first in range(0, steps, per_pass):
        chunk = range(first, min(first + per_pass, steps))
        points = [
            torch.cat([start + alphas[k] * (end - start) for k in chunk])
            for start, end in zip(starts, ends, strict=True)
        ]
        grads = _gradients(setting, points, examples.repeat(len(chunk)))
        weights = torch.tensor([sizes[k] for k in chunk]).float()
        for i, grad in enumerate(grads):
            scaled = grad.contiguous().view(len(chunk), -1) * weights.view(-1, 1).to(
                grad.device
            )
            part = scaled.reshape(len(chunk), *ends[i].shape).sum(0)
            totals[i] = totals[i] + part  # 0 + part is part, exactly
    attributions = [
        total * (end - start)
        for total, start, end in zip(totals, starts, ends, strict=True)
    ]
    if not return_delta:
        return _output(attributions)
    with torch.no_grad():
        start_scores = _row_scores(setting, base_inputs)
        end_scores = _row_scores(setting, CallInputs(setting.args, setting.kwargs))
        summed = torch.stack(
            [a.reshape(a.shape[0], -1).sum(1) for a in attributions]
        ).sum(0)
        delta = summed - (end_scores - start_scores)
    return _output(attributions), delta


def saliency(
    rnet: Recorder,
    x: Any,
    target: Any = None,
    *,
    absolute: bool = True,
    layer: Selector | None = None,
) -> Any:
    r"""Return the gradient of ``target`` at ``x`` (its absolute value by default).

    $|\partial F / \partial x|$ (Simonyan et al. 2014), captum's
    ``Saliency`` (``abs=True``); with ``layer=``, the gradient with respect
    to that call's output.

    Parameters
    ----------
    rnet, x, target, layer
        As for :func:`integrated_gradients`.
    absolute : bool, default True
        Return the gradient's absolute value; False: the gradient.

    Returns
    -------
    Tensor or tuple of Tensor
        Of the attributed tensor's shape (see :func:`integrated_gradients`),
        detached.

    Raises
    ------
    TypeError, ValueError
        As :func:`integrated_gradients`; ``absolute`` not a bool.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Linear(3, 2)
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> grads = saliency(rnet, torch.randn(4, 3), target=1, absolute=False)
    >>> torch.equal(grads, net.weight[1].detach().expand(4, 3))
    True

    """
    who = "saliency"
    check_flag(absolute, "absolute", who)
    setting = _setting(rnet, x, target, layer, who)
    points = _points(setting, CallInputs(setting.args, setting.kwargs))
    grads = _gradients(setting, points, torch.arange(setting.batch))
    return _output([grad.abs() if absolute else grad for grad in grads])


def input_x_gradient(
    rnet: Recorder, x: Any, target: Any = None, *, layer: Selector | None = None
) -> Any:
    r"""Return ``x`` times the gradient of ``target`` at ``x``.

    $x \odot \partial F / \partial x$ (Shrikumar et al. 2016), captum's
    ``InputXGradient``; with ``layer=``, that call's output times the
    gradient with respect to it (captum's ``LayerGradientXActivation``).

    Parameters
    ----------
    rnet, x, target, layer
        As for :func:`integrated_gradients`.

    Returns
    -------
    Tensor or tuple of Tensor
        Of the attributed tensor's shape, detached.

    Raises
    ------
    TypeError, ValueError
        As :func:`integrated_gradients`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Linear(3, 1, bias=False)
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> x = torch.randn(2, 3)
    >>> torch.allclose(input_x_gradient(rnet, x, target=0).sum(1), net(x)[:, 0])
    True

    """
    setting = _setting(rnet, x, target, layer, "input_x_gradient")
    points = _points(setting, CallInputs(setting.args, setting.kwargs))
    grads = _gradients(setting, points, torch.arange(setting.batch))
    return _output([grad * point for grad, point in zip(grads, points, strict=True)])


def smoothgrad(  # noqa: PLR0913 (keyword-only options)
    rnet: Recorder,
    x: Any,
    target: Any = None,
    *,
    samples: int = 50,
    stdev: float = 0.15,
    absolute: bool = False,
    internal_batch_size: int | None = None,
    generator: torch.Generator | None = None,
) -> Any:
    r"""Return the gradient of ``target`` averaged over noisy copies of ``x``.

    $\frac1n \sum_i \partial F / \partial x \,|_{x + \epsilon_i}$,
    $\epsilon_i \sim \mathcal N(0, \sigma^2)$ (Smilkov et al. 2017): captum's
    ``NoiseTunnel(Saliency(f)).attribute(..., nt_type="smoothgrad")``, its
    noise drawn as captum draws it (sample ``b``'s copies at rows ``b * n``
    to ``b * n + n - 1``, one ``torch.normal`` per attributed tensor), so
    that with one seed both give the same attributions.

    Parameters
    ----------
    rnet, x, target
        As for :func:`integrated_gradients` (floating-point inputs).
    samples : int, default 50
        The number $n$ of noisy copies of each sample.
    stdev : float, default 0.15
        The noise's standard deviation $\sigma$, in the input's units (the
        paper takes 10 to 20% of the input's range).
    absolute : bool, default False
        Average the gradients' absolute values (captum's ``Saliency``
        default) instead of the gradients.
    internal_batch_size : int or None
        The most rows (copies) in one pass; None: all in one.
    generator : torch.Generator or None
        Where the noise is drawn from; None: torch's global generator.

    Returns
    -------
    Tensor or tuple of Tensor
        Of the input's shape, detached.

    Raises
    ------
    TypeError, ValueError
        As :func:`integrated_gradients`; ``samples`` not a positive int,
        ``stdev`` not a non-negative number.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Linear(3, 2)  # linear: every copy has the same gradient
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> grads = smoothgrad(rnet, torch.randn(2, 3), target=0, samples=4)
    >>> torch.allclose(grads, net.weight[0].detach().expand(2, 3))
    True

    """
    who = "smoothgrad"
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        msg = f"{who}: `samples={samples!r}` must be a positive int."
        raise ValueError(msg)
    if (
        not isinstance(stdev, int | float)
        or isinstance(stdev, bool)
        or not math.isfinite(stdev)
        or stdev < 0
    ):
        msg = f"{who}: `stdev={stdev!r}` must be a non-negative number."
        raise ValueError(msg)
    check_flag(absolute, "absolute", who)
    setting = _setting(rnet, x, target, None, who)
    rows_per_pass = internal_batch_size or setting.batch * samples
    _per_pass(internal_batch_size, setting.batch, who)
    noisy = []
    for value in setting.inputs():
        shape = (value.shape[0] * samples, *value.shape[1:])
        spread = torch.tensor(float(stdev), device=value.device).repeat(shape)
        noise = torch.normal(0.0, spread, generator=generator)
        noisy.append(value.detach().repeat_interleave(samples, dim=0) + noise)
    rows = torch.arange(setting.batch).repeat_interleave(samples)
    parts: list[list[Tensor]] = [[] for _ in noisy]
    for first in range(0, len(rows), rows_per_pass):
        chunk = slice(first, first + rows_per_pass)
        grads = _gradients(setting, [value[chunk] for value in noisy], rows[chunk])
        for part, grad in zip(parts, grads, strict=True):
            part.append(grad.abs() if absolute else grad)
    means = []
    for part, value in zip(parts, noisy, strict=True):
        stacked = torch.cat(part).view(setting.batch, samples, *value.shape[1:])
        means.append(stacked.sum(dim=1) * 1 / samples)
    return _output(means)
