"""ORA: the angles to the decision boundaries (Demirel et al., NeurIPS 2025)."""

from __future__ import annotations

__all__ = ["ORA"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

from ._weights import _F64, _Classifier, _LabelSums

_AGGREGATIONS = ("mean", "max", "min")


class ORA(_Classifier):
    r"""ORA, OoD detection with relative angles (Demirel et al., NeurIPS 2025).

    With $\hat y$ the class ``fc`` predicts, $z = W f + b$ and $\mu$ the
    mean of the class means of ``fc``'s input on the fit data: the
    projection of $f$ on the boundary between $\hat y$ and $c$ is $f_c = f -
    \frac{z_{\hat y} - z_c}{\lVert w_{\hat y} - w_c \rVert^2} (w_{\hat y} -
    w_c)$, and its angle $\theta_c = \frac{1}{\pi} \arccos \cos(f - \mu, f_c
    - \mu)$. $\mathrm{score}(x) = -\frac{1}{C} \sum_c \theta_c$
    (``aggregation="mean"``, the default; $\theta_{\hat y}$, undefined,
    counts as 0), or minus their ``"max"`` (the same), or ``"min"`` (over
    $c \ne \hat y$).

    As OpenOOD pull request #311 computes it (berkerdemirel's
    ``ORAPostprocessor``): the class means are of the labels' classes, a
    class without fit samples counting as a zero mean (``target=`` needed);
    the norms of $f - \mu$ and $f_c - \mu$ are clamped to $10^{-12}$ (a
    zero vector has cosine 0, angle 1/2). Ours: float64 (the reference:
    float32), from inner products ($\cos$ from $\lVert f - \mu \rVert^2$,
    $\langle f - \mu, w_{\hat y} - w_c \rangle$ and the Gram matrix of
    ``W``: no ``C x F`` tensor per sample); the prediction is ``fc``'s, in
    the features' dtype.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    aggregation : {"mean", "max", "min"}
        How the classes' angles make the score.
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> ora = ORA(Recorder(net, input_size=(1, 3)))
    >>> x = torch.randn(30, 3)
    >>> scores = ora.fit([(x, torch.arange(30) % 3)], target=1)(torch.randn(4, 3))
    >>> bool(((scores <= 0) & (scores >= -1)).all())
    True

    """

    needs_target: ClassVar[bool] = True

    def __init__(
        self, rnet: Recorder, *, aggregation: str = "mean", fc: Selector | None = None
    ) -> None:
        """Find ``fc``; it needs two classes."""
        if aggregation not in _AGGREGATIONS:
            msg = (
                f"ORA: aggregation must be one of {_AGGREGATIONS}, got {aggregation!r}"
            )
            raise ValueError(msg)
        super().__init__(rnet, fc)
        if self.linear.out_features < 2:  # noqa: PLR2004 (a boundary needs two classes)
            msg = (
                f"ORA: fc {rnet.table[self.label].describe()} has one output; "
                "decision boundaries need at least two classes."
            )
            raise ValueError(msg)
        self.aggregation = aggregation
        self.num_classes = self.classes = self.linear.out_features
        self.centre = torch.zeros(0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Per-class sums of ``fc``'s input, by label."""
        return {self._keep_key(self.label, "input"): _LabelSums(self.classes, "ORA")}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the mean of the class means (a class without samples: zero)."""
        sums, counts = result[self.label]
        if sums.numel() == 0:
            sums = torch.zeros(self.classes, self.linear.in_features, dtype=_F64)
            counts = torch.zeros(self.classes, dtype=torch.int64)
        means = sums / counts.clamp(min=1)[:, None].to(_F64)
        self.centre = means.mean(dim=0).cpu()

    def angles(self, result: Pass) -> Tensor:
        """Return the angles ``[N, C]`` over pi (NaN at the prediction)."""
        f = self.features(result)
        predicted = self.logits(f).argmax(dim=1)
        g = f.to(_F64)
        w = self.weight64().to(g.device)
        z = g @ w.T + self.bias64().to(g.device)
        a = g - self.centre.to(g.device)
        aw = a @ w.T  # <a, w_c>
        gram = w @ w.T
        sq = gram.diagonal()
        p = predicted[:, None]
        gap = z.gather(1, p) - z  # z_pred - z_c
        ad = aw.gather(1, p) - aw  # <a, w_pred - w_c>
        dd = sq[predicted][:, None] + sq[None, :] - 2 * gram[predicted]
        step = gap / dd  # NaN at the prediction (0 / 0)
        aa = (a * a).sum(dim=1, keepdim=True)
        ab = aa - step * ad
        bb = (aa - 2 * step * ad + step * step * dd).clamp(min=0)
        na = aa.sqrt().clamp(min=1e-12)
        nb = bb.sqrt().clamp(min=1e-12)
        cos = (ab / (na * nb)).clamp(-1.0, 1.0)
        return torch.arccos(cos) / math.pi

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the aggregated angle."""
        theta = self.angles(result)
        if self.aggregation == "min":
            return -theta.nan_to_num(nan=math.inf).amin(dim=1)
        theta = theta.nan_to_num(nan=0.0)
        if self.aggregation == "max":
            return -theta.amax(dim=1)
        return -theta.mean(dim=1)

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and the aggregation."""
        return {**super().config(), "aggregation": self.aggregation}

    def state(self) -> dict[str, Tensor]:
        """Return the mean of the class means."""
        return {"centre": self.centre}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the mean of the class means ``[F]``."""
        return {"centre": StateEntry((self.linear.in_features,), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the mean of the class means."""
        self.centre = state["centre"]
