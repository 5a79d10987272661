"""Detectors that edit one layer's output in flight: ReAct, ASH, Scale.

The edit goes through the recorder's postprocessing path
(``rnet(x, activation_postproc=...)``), so the rest of the net runs as is on
the edited activations, with the call-plan checks and in-place safety of any
recorded pass; the score comes from the edited logits (energy by default,
any ``detector=`` function of the logits otherwise). The edits work on any
layer shape: the activations of a sample are flattened (``C x H x W`` for a
feature map, as pytorch-ood does for ASH), edited, and reshaped.
"""

from __future__ import annotations

__all__ = ["ASH", "ReAct", "Scale", "ash_b", "ash_p", "ash_s", "scale_shaping"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import Quantiles

from ._checks import one_label, one_tensor
from ._logits import energy_score
from ._protocol import Detector, StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass


def _kept(n: int, percentile: float) -> int:
    """How many activations a percentile keeps: ``n - round(n * percentile)``."""
    return n - round(n * percentile)


def _top(x: Tensor, percentile: float) -> tuple[Tensor, Tensor, Tensor]:
    """Return the flattened activations, the top values kept and their indices."""
    flat = x.reshape(x.shape[0], -1)
    k = _kept(flat.shape[1], percentile)
    values, index = torch.topk(flat, k, dim=1)
    return flat, values, index


def ash_p(x: Tensor, percentile: float = 0.65) -> Tensor:
    """Keep the top ``1 - percentile`` activations of each sample, zero the rest.

    Examples
    --------
    >>> import torch
    >>> ash_p(torch.tensor([[1.0, 4.0, 2.0, 3.0]]), 0.5)
    tensor([[0., 4., 0., 3.]])

    """
    flat, values, index = _top(x, percentile)
    return torch.zeros_like(flat).scatter(1, index, values).reshape(x.shape)


def ash_b(x: Tensor, percentile: float = 0.65) -> Tensor:
    """Like :func:`ash_p`, the kept activations all set to ``sum(x) / k``.

    Examples
    --------
    >>> import torch
    >>> ash_b(torch.tensor([[1.0, 4.0, 2.0, 3.0]]), 0.5)
    tensor([[0., 5., 0., 5.]])

    """
    flat, values, index = _top(x, percentile)
    fill = (flat.sum(dim=1) / values.shape[1])[:, None].expand_as(values)
    return torch.zeros_like(flat).scatter(1, index, fill).reshape(x.shape)


def ash_s(x: Tensor, percentile: float = 0.65) -> Tensor:
    """Prune as :func:`ash_p`, then scale by ``exp(s1 / s2)``.

    ``s1`` and ``s2`` are the sums before and after pruning.

    Examples
    --------
    >>> import torch
    >>> ash_s(torch.tensor([[1.0, 3.0]]), 0.5)  # 3 exp(4 / 3)
    tensor([[ 0.0000, 11.3810]])

    """
    flat, values, index = _top(x, percentile)
    pruned = torch.zeros_like(flat).scatter(1, index, values)
    ratio = flat.sum(dim=1) / pruned.sum(dim=1)
    return (pruned * torch.exp(ratio)[:, None]).reshape(x.shape)


def scale_shaping(x: Tensor, percentile: float = 0.65) -> Tensor:
    """Scale every activation (none pruned) by ``exp(s1 / s2)`` (SCALE).

    ``s1`` is the sum of a sample's activations, ``s2`` the sum of its top
    ``1 - percentile`` (Xu et al. 2024).

    Examples
    --------
    >>> import torch
    >>> scale_shaping(torch.tensor([[1.0, 1.0]]), 0.5)
    tensor([[7.3891, 7.3891]])

    """
    flat, values, _ = _top(x, percentile)
    ratio = flat.sum(dim=1) / values.sum(dim=1)
    return x * torch.exp(ratio).reshape(-1, *([1] * (x.dim() - 1)))


def _check_percentile(who: str, percentile: float) -> None:
    if not 0.0 <= percentile < 1.0:
        msg = f"{who}: percentile must be a fraction in [0, 1), got {percentile}"
        raise ValueError(msg)


class _Shaping(Detector):
    """An edit at ``layer``, the score from the edited logits."""

    edits: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__(rnet, layer=layer)
        self.label: DepthIdx = one_label(rnet, layer, type(self).__name__)
        self.detector = detector or energy_score

    def edit_label(self) -> DepthIdx:
        return self.label

    def edit(self, output: Tensor) -> Tensor:
        """Return the shaped output; refuse an output that is not one tensor."""
        who = type(self).__name__
        return self.shape(one_tensor(output, self.rnet, self.label, who))

    def shape(self, output: Tensor) -> Tensor:
        """Return the edited activations."""
        raise NotImplementedError

    def score_pass(self, result: Pass) -> Tensor:
        return self.detector(result.logits)


class ReAct(_Shaping):
    """ReAct (Sun et al., NeurIPS 2021): clip ``layer``'s activations, then score.

    ``fit`` takes the clipping threshold as the ``percentile`` of the layer's
    activations on in-distribution data (all features and samples together,
    exact quantiles; ``exact=False``: the bounded-memory sketch of
    :class:`~scio_recorder.reduce.Quantiles`, memory flat in the samples).
    ``score`` clips the layer's output at the threshold in flight and scores
    the logits (energy by default). The paper clips the penultimate layer.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector
        The layer whose output is clipped (one call).
    percentile : float, default 0.9
        The quantile, a fraction in ``[0, 1)`` (pytorch-ood's name; the
        paper's 90th percentile).
    exact : bool, default True
        Exact quantiles, or the sketch.
    detector : callable, optional
        ``logits -> scores``; default :func:`energy_score`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> react = ReAct(rnet, layer="1").fit([torch.randn(64, 3)], input=None)
    >>> react(torch.randn(4, 3)).shape, float(react.threshold) > 0
    (torch.Size([4]), True)

    """

    needs_fit: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        percentile: float = 0.9,
        exact: bool = True,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Resolve the layer; the threshold comes from :meth:`fit`."""
        _check_percentile("ReAct", percentile)
        super().__init__(rnet, layer, detector=detector)
        self.percentile = percentile
        self.exact = exact
        self.threshold = torch.tensor(float("nan"))

    def fit_keep(self) -> dict[Any, Any]:
        """Return the layer's activation quantile."""
        q = Quantiles([self.percentile], per_feature=False, exact=self.exact)
        return {self.label: q}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the quantile as the threshold."""
        self.threshold = result[self.label].reshape(-1)[0].to(torch.float32)

    def shape(self, output: Tensor) -> Tensor:
        """Clip at the threshold."""
        return output.clamp(max=self.threshold.to(output))

    def config(self) -> dict[str, Any]:
        """Return the layer label, the percentile and the quantile mode."""
        return {
            "layer": list(self.label),
            "percentile": self.percentile,
            "exact": self.exact,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the threshold."""
        return {"threshold": self.threshold.reshape(1)}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the clipping threshold, ``[1]`` float32."""
        return {"threshold": StateEntry((1,), torch.float32)}

    def load_state(self, state: Any) -> None:
        """Set the threshold."""
        self.threshold = state["threshold"].reshape(())


class ASH(_Shaping):
    """ASH, activation shaping (Djurisic et al., ICLR 2023); no fitting.

    Prunes each sample's activations of ``layer`` below its ``percentile``
    (the largest ``1 - percentile`` are kept), then, by ``variant``:
    ``"ash-p"`` keeps them, ``"ash-b"`` sets them all to ``s1 / k``, ``"ash-s"``
    scales them by ``exp(s1 / s2)`` (``s1``, ``s2``: the sums before and after
    pruning); the rest of the net runs on the result, scored by energy.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector
        The layer whose output is shaped (the paper: after the last pooling).
    variant : {"ash-s", "ash-p", "ash-b"}, default "ash-s"
        pytorch-ood's names.
    percentile : float, default 0.65
        The fraction pruned, in ``[0, 1)``.
    detector : callable, optional
        ``logits -> scores``; default :func:`energy_score`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> ASH(Recorder(net, input_size=(1, 3)), layer="1", variant="ash-b")
    ASH(layer=[1, 2], variant='ash-b', percentile=0.65)

    """

    VARIANTS: ClassVar[dict[str, Callable[[Tensor, float], Tensor]]] = {
        "ash-s": ash_s,
        "ash-p": ash_p,
        "ash-b": ash_b,
    }

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        variant: str = "ash-s",
        percentile: float = 0.65,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Check the variant and the percentile."""
        if variant not in self.VARIANTS:
            msg = (
                f"ASH: variant must be one of {sorted(self.VARIANTS)}, got {variant!r}"
            )
            raise ValueError(msg)
        _check_percentile("ASH", percentile)
        super().__init__(rnet, layer, detector=detector)
        self.variant = variant
        self.percentile = percentile

    def shape(self, output: Tensor) -> Tensor:
        """Shape the activations."""
        return self.VARIANTS[self.variant](output, self.percentile)

    def config(self) -> dict[str, Any]:
        """Return the layer label, the variant and the percentile."""
        return {
            "layer": list(self.label),
            "variant": self.variant,
            "percentile": self.percentile,
        }


class Scale(_Shaping):
    """SCALE (Xu et al., ICLR 2024): scale ``layer``'s activations, then score.

    Each sample's activations are multiplied by ``exp(s1 / s2)``, ``s1`` their
    sum and ``s2`` the sum of the largest ``1 - percentile`` of them; none is
    pruned (unlike ASH-S). No fitting; energy score by default.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector
        The layer whose output is scaled.
    percentile : float, default 0.65
        In ``[0, 1)``.
    detector : callable, optional
        ``logits -> scores``; default :func:`energy_score`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> Scale(Recorder(net, input_size=(1, 3)), layer="1")(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        percentile: float = 0.65,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Check the percentile."""
        _check_percentile("Scale", percentile)
        super().__init__(rnet, layer, detector=detector)
        self.percentile = percentile

    def shape(self, output: Tensor) -> Tensor:
        """Scale the activations."""
        return scale_shaping(output, self.percentile)

    def config(self) -> dict[str, Any]:
        """Return the layer label and the percentile."""
        return {"layer": list(self.label), "percentile": self.percentile}
