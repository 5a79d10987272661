"""Detectors that edit a block's output in flight: RankFeat, VRA.

As :class:`~scio_recorder.ood.ReAct` and :class:`~scio_recorder.ood.ASH`, the
edit goes through the recorder's postprocessing path, so the rest of the net
runs unchanged on the edited activations (pytorch-ood needs the net cut in a
backbone and a head), and the score is the energy of the edited logits (any
``detector=`` function of the logits otherwise).
"""

from __future__ import annotations

__all__ = ["VRA", "RankFeat", "remove_rank1"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import Quantiles

from ._checks import per_sample_size
from ._layers import Shaping, resolve_labels
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Edit, Pass

_MIN_RANK = 3  # a batch of matrices


def remove_rank1(x: Tensor) -> Tensor:
    """Subtract each sample's rank-1 part ``s1 u1 v1^T`` (its top singular triplet).

    A sample of a ``[B, C, H, W]`` map is the ``C x HW`` matrix (pytorch-ood's
    ``_remove_rank1``); of a ``[B, T, D]`` sequence, the ``T x D`` matrix.
    The SVD runs in float32 at least (``linalg`` has no half-precision
    kernels; a bfloat16 or float16 map is converted, and the result back).

    Examples
    --------
    >>> import torch
    >>> x = torch.outer(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 1.0]))
    >>> remove_rank1(x[None]).abs().max().item() < 1e-5
    True

    """
    if x.dim() < _MIN_RANK:
        msg = (
            f"RankFeat: the edited layer outputs {list(x.shape)}; it needs a batch "
            "of matrices ([B, C, H, W] or [B, T, D]): choose a block's output."
        )
        raise ValueError(msg)
    m = x.reshape(x.shape[0], x.shape[1], -1)
    wide = m.to(torch.promote_types(m.dtype, torch.float32))
    u, s, vh = torch.linalg.svd(wide, full_matrices=False)
    rank1 = s[:, 0:1].unsqueeze(2) * u[:, :, 0:1].bmm(vh[:, 0:1, :])
    out: Tensor = (wide - rank1).to(x.dtype).reshape(x.shape)
    return out


class RankFeat(Shaping):
    r"""RankFeat (Song et al., NeurIPS 2022): remove the rank-1 part, then energy.

    The output of ``layer`` (a block's feature map) loses its top singular
    component, sample by sample (:func:`remove_rank1`), in flight; the rest
    of the net runs on it and $\mathrm{score} = -\mathrm{logsumexp}(z)$, $z$ the
    logits (energy). No
    fitting. Follows pytorch-ood's ``RankFeat`` (exact SVD, not the paper's
    optional power iteration).

    The paper's best setting removes the rank-1 part at two blocks (3 and 4
    of a ResNet): ``layers=[block3, block4]`` runs one pass per block (each
    editing that block alone, as the paper's code does), averages the
    passes' logits (the paper's code fuses "at the logit space") and scores
    the average. pytorch-ood's ``RankFeat`` edits one block only.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector, optional
        The block whose output is edited (one call).
    layers : list of selectors, optional
        Instead of ``layer``: several blocks, one edited pass each, logits
        averaged.
    detector : callable, optional
        ``logits -> scores``; default :func:`energy_score`.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(), input_size=(1, 3, 32, 32))
    >>> RankFeat(rnet, layer="features.4")(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2])
    >>> both = RankFeat(rnet, layers=["features.1", "features.4"])
    >>> both(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2])

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        layers: Sequence[Selector] | None = None,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Resolve the layer, or the layers."""
        if (layer is None) == (layers is None):
            which = "both" if layer is not None else "neither"
            msg = (
                "RankFeat: give `layer=` (one block) or `layers=[...]` (several, "
                f"the paper's two blocks), not {which}."
            )
            raise ValueError(msg)
        if layers is not None:
            labels = resolve_labels(rnet, layers, "RankFeat")
            super().__init__(rnet, labels[0], detector=detector)
            self.labels = labels
        else:
            super().__init__(rnet, layer, detector=detector)
            self.labels = [self.label]

    def edit_passes(self) -> list[Edit]:
        """One pass per layer, each editing that layer."""
        return [(label, self.edit) for label in self.labels]

    def score_passes(self, results: Sequence[Pass]) -> Tensor:
        """Score the mean of the passes' logits."""
        logits = torch.stack([r.logits for r in results]).mean(dim=0)
        return self.detector(logits)

    def shape(self, output: Tensor) -> Tensor:
        """Remove the rank-1 part."""
        return remove_rank1(output)

    def config(self) -> dict[str, Any]:
        """Return the layer label (the labels, with ``layers=``)."""
        return (
            {"layer": list(self.label)}
            if len(self.labels) == 1
            else {"layers": [list(label) for label in self.labels]}
        )


class VRA(Shaping):
    """Variational rectified activation (Xu et al., NeurIPS 2023), then energy.

    ``fit`` takes, per element of ``layer``'s output, its ``lower_percentile``
    and ``upper_percentile`` quantiles ``a``, ``b`` over the in-distribution
    data (exact quantiles). ``score`` edits the output in flight and scores
    the logits (energy). The edit, by default pytorch-ood's ``VRA``:
    ``clip(z, a, b)``; with ``gamma`` the paper's piecewise form ``0`` for ``z
    < a``, ``z + gamma`` for ``a <= z <= b``, ``b`` for ``z > b``.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector
        The layer whose output is edited.
    lower_percentile : float, default 0.01
        The quantile clipped to from below, a fraction in ``[0, 1]``
        (pytorch-ood's name and default).
    upper_percentile : float, default 0.99
        The quantile clipped to from above (pytorch-ood's name and default).
    gamma : float, optional
        The paper's offset; ``None``: pytorch-ood's clip.
    detector : callable, optional
        ``logits -> scores``; default :func:`energy_score`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> vra = VRA(Recorder(net, input_size=(1, 3)), layer="1")
    >>> vra.fit([torch.randn(64, 3)], input=None)(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    needs_fit: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (pytorch-ood's options and the paper's gamma)
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        lower_percentile: float = 0.01,
        upper_percentile: float = 0.99,
        gamma: float | None = None,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Check the percentiles; the thresholds come from :meth:`fit`."""
        for name, value in (
            ("lower_percentile", lower_percentile),
            ("upper_percentile", upper_percentile),
        ):
            if not 0.0 <= value <= 1.0:
                msg = f"VRA: {name} must be a fraction in [0, 1], got {value}"
                raise ValueError(msg)
        if lower_percentile > upper_percentile:
            msg = (
                f"VRA: lower_percentile={lower_percentile} exceeds "
                f"upper_percentile={upper_percentile}; swap them."
            )
            raise ValueError(msg)
        super().__init__(rnet, layer, detector=detector)
        self.lower_percentile = float(lower_percentile)
        self.upper_percentile = float(upper_percentile)
        self.gamma = None if gamma is None else float(gamma)
        self.lower = torch.zeros(0)
        self.upper = torch.zeros(0)

    def fit_keep(self) -> dict[Any, Any]:
        """Per-element quantiles of the layer's output."""
        q = [self.lower_percentile, self.upper_percentile]
        return {self.label: Quantiles(q, per_feature=True, exact=True)}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the two thresholds (float32, as the activations)."""
        quantiles = result[self.label]
        self.lower = quantiles[0].to(torch.float32)
        self.upper = quantiles[1].to(torch.float32)

    def shape(self, output: Tensor) -> Tensor:
        """Clip (or the paper's piecewise edit)."""
        lower, upper = self.lower.to(output), self.upper.to(output)
        if self.gamma is None:
            return output.clip(min=lower, max=upper)
        inside = torch.where(
            output < lower, torch.zeros_like(output), output + self.gamma
        )
        return torch.where(output > upper, upper.expand_as(output), inside)

    def config(self) -> dict[str, Any]:
        """Return the layer label, the percentiles and gamma."""
        return {
            "layer": list(self.label),
            "lower_percentile": self.lower_percentile,
            "upper_percentile": self.upper_percentile,
            "gamma": self.gamma,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the thresholds."""
        return {"lower": self.lower, "upper": self.upper}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the thresholds, the layer's output shape, float32."""
        size = per_sample_size(self.rnet, self.label, "output")
        shape: tuple[int | None, ...] = (None,) if size is None else tuple(size)
        return {
            "lower": StateEntry(shape, torch.float32),
            "upper": StateEntry(shape, torch.float32),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the thresholds."""
        self.lower, self.upper = state["lower"], state["upper"]
