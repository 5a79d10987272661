"""GradNorm (Huang et al., NeurIPS 2021), from one forward pass.

GradNorm is the L1 norm of the gradient, with respect to the weight ``W`` of
the last linear layer, of the KL divergence between the uniform distribution
and ``softmax(z / T)``: small for out-of-distribution inputs. For a linear
layer the gradient has a closed form: with ``f`` the layer's input, ``z`` its
output and ``C`` classes,

    d/dW KL(u || softmax(z / T)) = ((softmax(z / T) - 1 / C) / T) f^T,

whose L1 norm is ``||softmax(z / T) - 1 / C||_1 ||f||_1 / T``. So each sample
is scored from the recorded input and output of the layer, in one batched
forward pass, with no backward pass and no ``.grad`` touched; the tests check
it against autograd, sample by sample.
"""

from __future__ import annotations

__all__ = ["GradNorm"]

from typing import TYPE_CHECKING, Any

import torch

from ._checks import last_linear
from ._protocol import Detector

if TYPE_CHECKING:
    from torch import Tensor

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass


class GradNorm(Detector):
    r"""GradNorm (Huang et al., NeurIPS 2021): a gradient norm of the last layer.

    $\mathrm{score}(x) = -\|\partial \mathrm{KL}(u \,\|\, \mathrm{softmax}(z / T)) /
    \partial W\|_1$, $W$ the last layer's weight.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    fc : selector, optional
        The ``nn.Linear`` whose weight gradient is taken; default the last one
        the net calls.
    t : float, default 1.0
        The temperature ``T``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> GradNorm(Recorder(net, input_size=(1, 3)))(torch.randn(5, 3)).shape
    torch.Size([5])

    """

    def __init__(
        self, rnet: Recorder, *, fc: Selector | None = None, t: float = 1.0
    ) -> None:
        """Find ``fc``; check ``t``."""
        super().__init__(rnet)
        if t <= 0:
            msg = f"GradNorm: the temperature t must be > 0, got {t}"
            raise ValueError(msg)
        self.label: DepthIdx = last_linear(rnet, fc, "GradNorm")
        self.t = t

    def outputs(self) -> tuple[DepthIdx, ...]:
        """Return the output of ``fc`` (its logits)."""
        return (self.label,)

    def inputs(self) -> tuple[DepthIdx, ...]:
        """Return the input of ``fc``."""
        return (self.label,)

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the gradient's L1 norm."""
        z = result.outputs[self.label]
        f = result.inputs[self.label]
        if z.dim() != 2:  # noqa: PLR2004 (a batch of logit vectors)
            msg = (
                f"GradNorm: fc's output must be [batch, classes], got "
                f"{list(z.shape)}; name a classification layer with `fc=`."
            )
            raise ValueError(msg)
        p = torch.softmax(z / self.t, dim=1)
        spread = (p - 1.0 / z.shape[1]).abs().sum(dim=1)
        scores: Tensor = -(spread * f.abs().sum(dim=1)) / self.t
        return scores

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and the temperature."""
        return {"fc": list(self.label), "t": self.t}
