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

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import Quantiles

from ._checks import one_tensor
from ._layers import Shaping, resolve_labels
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Edit


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


class _Pooled(Quantiles):
    """Quantiles whose result is the reducer itself, to merge several layers'."""

    def result(self) -> Any:
        """Return the reducer itself (merged with the other layers' by the detector)."""
        return self


class ReAct(Shaping):
    """ReAct (Sun et al., NeurIPS 2021): clip activations in flight, then score.

    ``fit`` takes the clipping threshold as the ``percentile`` of the
    activations on in-distribution data (all features and samples together,
    exact quantiles, linearly interpolated; ``exact=False``: the
    bounded-memory sketch of :class:`~scio_recorder.reduce.Quantiles`,
    memory flat in the samples). ``score`` clips the output at the
    threshold in flight and scores the logits (energy by default). The
    paper clips the penultimate layer.

    scio 1.1's variants: ``symmetric=True`` also clips from below, at the
    ``1 - percentile`` quantile (``percentile > 0.5``): ``clamp(min=lower,
    max=threshold)``. ``layers=[...]`` clips several layers in one pass:
    with one threshold for all of them, the quantile of their activations
    together (``per_layer=False``, scio's default), or one per layer
    (``per_layer=True``, ``percentile`` then one value or one per layer).

    scio 1.1's ``ReAct`` takes ``percentile`` in percent (90.0 for our
    0.9), its thresholds as the next value up (``"higher"``; ``"lower"``
    for the lower one) where ours interpolate, and its conformity is
    ``softmax`` of the clipped logits at the class the unclipped net
    predicts; ``detector=msp_score`` gives minus their maximum (the two
    agree where clipping keeps the prediction): see the scio migration
    page.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector, optional
        The layer whose output is clipped (one call).
    layers : list of selectors, optional
        Several layers instead (exactly one of ``layer`` and ``layers``);
        edits of several layers need an eager (not compiled) recorder.
    percentile : float or list of float, default 0.9
        The quantile, a fraction in ``[0, 1)`` (pytorch-ood's name; the
        paper's 90th percentile); a list gives one per layer
        (``per_layer=True``).
    symmetric : bool, default False
        Also clip below, at the ``1 - percentile`` quantile.
    per_layer : bool, default False
        One threshold per layer, or one for all the layers (scio's name and
        default; the same with one layer).
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
    >>> both = ReAct(rnet, layers=["0", "1"], symmetric=True, per_layer=True)
    >>> both.fit([torch.randn(64, 3)], input=None).thresholds.shape
    torch.Size([2])

    """

    needs_fit: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (the paper's options and scio's variants)
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        layers: Sequence[Selector] | None = None,
        percentile: float | Sequence[float] = 0.9,
        symmetric: bool = False,
        per_layer: bool = False,
        exact: bool = True,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Resolve the layers; the thresholds come from :meth:`fit`."""
        if (layer is None) == (layers is None):
            msg = (
                "ReAct: give the layer to clip, `layer=`, or several, `layers=[...]` "
                "(exactly one of them)."
            )
            raise ValueError(msg)
        labels = None if layers is None else resolve_labels(rnet, layers, "ReAct")
        super().__init__(
            rnet, layer if labels is None else labels[0], detector=detector
        )
        self.labels: list[DepthIdx] = [self.label] if labels is None else labels
        self.per_layer = bool(per_layer) and len(self.labels) > 1
        groups = len(self.labels) if self.per_layer else 1
        if isinstance(percentile, int | float):
            levels = [float(percentile)] * groups
        elif per_layer and len(percentile) == len(self.labels):
            levels = [float(p) for p in percentile]
        else:
            msg = (
                f"ReAct: percentile is {percentile!r}; give one fraction, or one "
                f"per layer ({len(self.labels)}) with `per_layer=True`."
            )
            raise ValueError(msg)
        for level in levels:
            _check_percentile("ReAct", level)
            if symmetric and not level > 0.5:  # noqa: PLR2004 (the lower quantile below the upper)
                msg = (
                    f"ReAct: symmetric clipping needs percentile > 0.5 (the lower "
                    f"threshold is the 1 - percentile quantile), got {level}"
                )
                raise ValueError(msg)
        self.percentile: float | list[float] = (
            levels[0] if isinstance(percentile, int | float) else levels
        )
        self.levels = levels
        self.symmetric = bool(symmetric)
        self.exact = exact
        self.thresholds = torch.full((groups,), float("nan"))
        self.lowers = torch.full((groups,), float("nan"))

    @property
    def threshold(self) -> Tensor:
        """The (first) upper threshold, a scalar tensor."""
        return self.thresholds[0]

    def fit_keep(self) -> dict[Any, Any]:
        """Return a quantile stream per layer (merged over layers when shared)."""
        keep = {}
        for i, label in enumerate(self.labels):
            level = self.levels[i if self.per_layer else 0]
            q = [1 - level, level] if self.symmetric else [level]
            keep[label] = _Pooled(q, per_feature=False, exact=self.exact)
        return keep

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the quantiles as the thresholds."""
        streams = [result[label] for label in self.labels]
        groups = [[s] for s in streams] if self.per_layer else [streams]
        uppers, lowers = [], []
        for group in groups:
            merged = group[0].fresh()
            for stream in group:
                merged.merge(stream)
            values = Quantiles.result(merged).reshape(-1).to(torch.float32)
            uppers.append(values[-1])
            lowers.append(values[0] if self.symmetric else values.new_tensor(math.nan))
        self.thresholds, self.lowers = torch.stack(uppers), torch.stack(lowers)

    def edit_passes(self) -> list[Edit]:
        """One pass clipping every layer (a callable for one layer)."""
        if len(self.labels) == 1:
            return [(self.label, self.edit)]
        return [{label: self._clipper(i) for i, label in enumerate(self.labels)}]

    def _clipper(self, layer: int) -> Callable[[Any], Tensor]:
        def clip(output: Any) -> Tensor:
            return self.edit(output, layer)

        return clip

    def edit(self, output: Tensor, layer: int = 0) -> Tensor:
        """Return layer ``layer``'s output clipped (one tensor only)."""
        label = self.labels[layer]
        tensor = one_tensor(output, self.rnet, label, "ReAct")
        return self.clip(tensor, layer if self.per_layer else 0)

    def shape(self, output: Tensor) -> Tensor:
        """Clip at the (first) thresholds."""
        return self.clip(output, 0)

    def clip(self, output: Tensor, group: int) -> Tensor:
        """Clip at ``group``'s threshold (and from below at its lower one)."""
        upper = self.thresholds[group].to(output)
        if not self.symmetric:
            return output.clamp(max=upper)
        return output.clamp(min=self.lowers[group].to(output), max=upper)

    def config(self) -> dict[str, Any]:
        """Return the layers, the percentile, the variants and the quantile mode."""
        config: dict[str, Any] = {
            "layer": list(self.label),
            "percentile": self.percentile,
            "exact": self.exact,
        }
        if len(self.labels) > 1:
            config["layer"] = [list(label) for label in self.labels]
            config["per_layer"] = self.per_layer
        if self.symmetric:
            config["symmetric"] = True
        return config

    def state(self) -> dict[str, Tensor]:
        """Return the thresholds (and the lower ones, ``symmetric``)."""
        state = {"threshold": self.thresholds}
        if self.symmetric:
            state["lower"] = self.lowers
        return state

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: a clipping threshold per group of layers, float32."""
        groups = len(self.thresholds)
        entries = {"threshold": StateEntry((groups,), torch.float32)}
        if self.symmetric:
            entries["lower"] = StateEntry((groups,), torch.float32)
        return entries

    def load_state(self, state: Any) -> None:
        """Set the thresholds."""
        self.thresholds = state["threshold"].reshape(-1)
        if self.symmetric:
            self.lowers = state["lower"].reshape(-1)


class ASH(Shaping):
    """ASH, activation shaping (Djurisic et al., ICLR 2023); no fitting.

    Prunes each sample's activations of ``layer`` below its ``percentile``
    (the largest ``1 - percentile`` are kept), then, by ``variant``:
    ``"ash-p"`` keeps them, ``"ash-b"`` sets them all to $s_1 / k$, ``"ash-s"``
    scales them by $e^{s_1 / s_2}$ ($s_1$, $s_2$: the sums before and after
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


class Scale(Shaping):
    """SCALE (Xu et al., ICLR 2024): scale ``layer``'s activations, then score.

    Each sample's activations are multiplied by $e^{s_1 / s_2}$, $s_1$ their
    sum and $s_2$ the sum of the largest ``1 - percentile`` of them; none is
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
