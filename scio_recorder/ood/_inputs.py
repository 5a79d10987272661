"""The net's input, moved: what perturbation detectors and preprocessing share.

* :func:`floating_input`: the input they move, the net's first positional
  argument, which must be a floating tensor (token ids cannot be moved);
* :func:`check_epsilon`, :func:`gradient_step`: one step of size
  ``epsilon`` against the sign of a loss's gradient with respect to that
  input (Lee et al.'s preprocessing: ``Mahalanobis(epsilon=)``, ``RMDS``,
  ``MahalanobisEnsemble``);
* :func:`sample_noise`: uniform noise that depends only on the sample and a
  seed, never on the batch it comes in (``Odds``).
"""

from __future__ import annotations

__all__ = ["check_epsilon", "floating_input", "gradient_step", "sample_noise"]

import hashlib
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._support.tree import map_tensors

from ._checks import check_number
from ._protocol import Pass, run_pass

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

_F32, _F64 = torch.float32, torch.float64
_NOISE_BLOCK = 64
"""Noise draws per generator: block ``b`` of a sample's draws has its own seed."""


def floating_input(args: tuple[Any, ...], who: str) -> Tensor:
    """Return the net's first positional input; refuse one that is not floating.

    Examples
    --------
    >>> import torch
    >>> floating_input((torch.ones(2, 3),), "Odds").shape
    torch.Size([2, 3])
    >>> floating_input((torch.ones(2, 3, dtype=torch.long),), "Odds")
    Traceback (most recent call last):
    ...
    TypeError: Odds perturbs the net's first positional input, which must be a floating tensor; got a torch.int64 tensor. Pass the input first, as a floating tensor (a language model's token ids cannot be perturbed).

    """  # noqa: E501 (doctest output)
    x = args[0] if args else None
    if not (isinstance(x, Tensor) and x.is_floating_point()):
        got = type(x).__name__ if not isinstance(x, Tensor) else f"a {x.dtype} tensor"
        msg = (
            f"{who} perturbs the net's first positional input, which must be a "
            f"floating tensor; got {got}. Pass the input first, as a floating "
            "tensor (a language model's token ids cannot be perturbed)."
        )
        raise TypeError(msg)
    return x


def check_epsilon(who: str, epsilon: float) -> float:
    """Return ``epsilon`` as a float if it is a finite number >= 0; raise otherwise.

    Examples
    --------
    >>> check_epsilon("Mahalanobis", 0)
    0.0

    """
    return check_number(who, "epsilon", epsilon, zero=True)


def gradient_step(  # noqa: PLR0913 (the net's arguments, the losses, what they read)
    rnet: Recorder,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    losses: Callable[[Pass], Sequence[Tensor]],
    *,
    epsilon: float,
    who: str,
    outputs: Iterable[DepthIdx] = (),
    inputs: Iterable[DepthIdx] = (),
) -> tuple[list[Tensor], Pass]:
    """Return ``x - epsilon sign(grad_x loss)`` for each loss, and the pass of ``x``.

    ``x`` is the net's first positional input (:func:`floating_input`); one
    pass with autograd on records ``outputs`` and ``inputs``, ``losses(pass)``
    are scalars (sums over the batch: each sample's gradient is that of its
    own term when samples do not interact, as in ``net.eval()``), one
    backward pass each, and only the input's gradient is taken (no
    parameter's ``.grad`` is touched). Gradient entries of magnitude at
    most the dtype's ``eps`` count as 0 (no step), as in scio's
    ``fgm_direction``. The returned pass holds the records of ``x``,
    detached.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2))
    >>> x = torch.zeros(1, 2)
    >>> (moved,), _ = gradient_step(
    ...     rnet, (x,), {}, lambda p: [p.logits[:, 0].sum()], epsilon=0.5, who="doc"
    ... )
    >>> torch.equal(moved, -0.5 * rnet.net[0].weight[0:1].sign())
    True

    """
    x = floating_input(args, who)
    with torch.inference_mode(mode=False), torch.enable_grad():
        leaf = x.detach().clone().requires_grad_()
        result = run_pass(
            rnet,
            (leaf, *args[1:]),
            kwargs,
            outputs=outputs,
            inputs=inputs,
            grad=True,
            who=who,
        )
        values = list(losses(result))
        grads = [
            torch.autograd.grad(
                value, leaf, retain_graph=i < len(values) - 1, allow_unused=True
            )[0]
            for i, value in enumerate(values)
        ]
    moved = []
    for grad in grads:
        if grad is None:  # the loss does not depend on the input
            moved.append(x.detach().clone())
            continue
        tiny = grad.abs() <= torch.finfo(grad.dtype).eps
        step = grad.sign().masked_fill(tiny, 0)
        moved.append((x.detach() - epsilon * step).to(x.dtype))
    detached = Pass(
        result.logits.detach(),
        {k: _detached(v) for k, v in result.outputs.items()},
        {k: v.detach() for k, v in result.inputs.items()},
    )
    return moved, detached


def _detached(value: Any) -> Any:
    return map_tensors(lambda t: t.detach(), value)


def sample_noise(sample: Tensor, count: int, *, seed: int, start: int = 0) -> Tensor:
    """Return draws ``start .. start + count`` of a sample's noise, uniform in [-1, 1].

    ``[count, *sample.shape]``, in the sample's dtype and on its device. The
    draws depend only on ``seed`` and the sample's values (its bytes, dtype
    and shape), never on the batch it comes in or on the device: draw block
    ``b`` (draws ``64 b .. 64 b + 63``) comes from a CPU generator seeded by
    a BLAKE2b hash of the seed, the sample and ``b``. The sample is read
    once to the host.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([0.5, 1.0])
    >>> noise = sample_noise(x, 3, seed=0)
    >>> noise.shape, bool((noise.abs() <= 1).all())
    (torch.Size([3, 2]), True)
    >>> torch.equal(noise, sample_noise(x.clone(), 3, seed=0))
    True
    >>> torch.equal(noise[1:], sample_noise(x, 2, seed=0, start=1))
    True

    """
    host = sample.detach().to("cpu").contiguous()
    key = hashlib.blake2b(digest_size=16)
    key.update(f"{seed}|{host.dtype}|{list(host.shape)}|".encode())
    key.update(host.reshape(-1).view(torch.uint8).numpy().tobytes())
    dtype = host.dtype if host.dtype in {_F32, _F64} else _F32
    blocks = []
    first, last = start // _NOISE_BLOCK, (start + count - 1) // _NOISE_BLOCK
    for block in range(first, last + 1):
        digest = key.copy()
        digest.update(block.to_bytes(8, "little"))
        generator = torch.Generator().manual_seed(
            int.from_bytes(digest.digest()[:8], "little") >> 1
        )
        draws = torch.rand(
            (_NOISE_BLOCK, *host.shape), generator=generator, dtype=dtype
        )
        blocks.append(1 - 2 * draws)
    drawn = torch.cat(blocks)[start - first * _NOISE_BLOCK :][:count]
    return drawn.to(device=sample.device, dtype=sample.dtype)
