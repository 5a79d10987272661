"""Detectors of the classifier's penultimate features: NCI, NECO, Residual.

Features ``f`` are the input of the classification ``nn.Linear`` ``fc``
(default: the last one the net calls), as for :class:`~scio_recorder.ood.ViM`;
``W``, ``b`` its weight and bias. Fitting is one streaming
:func:`~scio_recorder.collect.collect` pass of moments (mean, covariance),
shared with other detectors by :func:`~scio_recorder.ood.fit_detectors`.
"""

from __future__ import annotations

__all__ = ["NCI", "NECO", "Residual"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from scio_recorder.collect import InputOf
from scio_recorder.reduce import Covariance, Moments

from ._checks import check_feature_count, last_linear
from ._protocol import Detector
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

_F64 = torch.float64


class _Head(Detector):
    """A detector of ``fc``'s input features, with ``fc``'s weight and bias."""

    needs_fit: ClassVar[bool] = True

    def __init__(self, rnet: Recorder, fc: Selector | None) -> None:
        super().__init__(rnet)
        self.label: DepthIdx = last_linear(rnet, fc, type(self).__name__)
        linear = rnet.table[self.label].module
        assert isinstance(linear, nn.Linear)  # noqa: S101 (last_linear checks it)
        self.weight = linear.weight.detach().to(_F64)
        bias = linear.bias
        self.bias = (
            bias.detach().to(_F64)
            if bias is not None
            else self.weight.new_zeros(self.weight.shape[0])
        )

    @property
    def features_in(self) -> int:
        """The input features of ``fc`` (its weight's columns)."""
        return int(self.weight.shape[1])

    def inputs(self) -> tuple[DepthIdx, ...]:
        return (self.label,)

    def features(self, result: Pass) -> Tensor:
        f = result.inputs[self.label]
        f = f.reshape(f.shape[0], -1).to(_F64)
        check_feature_count(
            self, self.label, "input", got=f.shape[1], expected=self.features_in
        )
        return f

    def logits(self, f: Tensor) -> Tensor:
        return f @ self.weight.to(f).T + self.bias.to(f)

    def _check_d(self, d: int) -> None:
        features = self.weight.shape[1]
        if isinstance(d, bool) or not isinstance(d, int) or not 0 < d < features:
            msg = (
                f"{type(self).__name__}: d must be an int in [1, {features}) (the "
                f"input features of {self.rnet.table[self.label].describe()}), "
                f"got {d!r}"
            )
            raise ValueError(msg)


class NCI(_Head):
    r"""Neural-collapse inspired detector (Liu & Qin, CVPR 2025, arXiv 2311.01479).

    ``fit`` takes the global mean $\mu_g$ of the in-distribution features
    (labels unused). With $c$ the predicted class and $w_c$ its row of
    $W$: $\mathrm{score}(x) = -(f - \mu_g) \cdot w_c / \|f - \mu_g\|_2 - \alpha
    \|f\|_1$ (the L1 norm, as pytorch-ood's ``NCI``, which this follows; the
    penalty is off for ``alpha <= 0``).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.
    alpha : float, default 0.0
        Weight of the feature-norm term (pytorch-ood's default).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> nci = NCI(Recorder(net, input_size=(1, 3)), alpha=0.01)
    >>> nci.fit([torch.randn(16, 3)], input=None)(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    def __init__(
        self, rnet: Recorder, *, fc: Selector | None = None, alpha: float = 0.0
    ) -> None:
        """Find ``fc``."""
        super().__init__(rnet, fc)
        self.alpha = float(alpha)
        self.mean = torch.zeros(0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Return the features' mean."""
        return {InputOf(self.label): Moments()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the global mean."""
        stats = result[self.label]
        self.mean = stats.mean.reshape(-1).to(_F64)

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the cosine to the predicted class, minus the norm term."""
        f = self.features(result)
        centred = f - self.mean.to(f)
        w = self.weight.to(f)[self.logits(f).argmax(dim=1)]
        cosine: Tensor = (centred * w).sum(dim=1) / centred.norm(dim=1)
        if self.alpha <= 0:
            return -cosine
        penalty: Tensor = self.alpha * f.abs().sum(dim=1)
        return -cosine - penalty

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and ``alpha``."""
        return {"fc": list(self.label), "alpha": self.alpha}

    def state(self) -> dict[str, Tensor]:
        """Return the global mean."""
        return {"mean": self.mean}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the mean ``[F]`` float64 (F: fc's input)."""
        return {"mean": StateEntry((self.features_in,), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the global mean."""
        self.mean = state["mean"]


class NECO(_Head):
    r"""Neural-collapse based OoD detection (Ammar et al., ICLR 2024).

    ``fit`` standardises the in-distribution features (mean ``m``, standard
    deviation $s$, 1 where $s = 0$, as scikit-learn's ``StandardScaler``
    the paper's code uses) and takes the top ``d`` principal directions
    $V_d$ of the standardised features (eigenvectors of their covariance,
    streaming). With $z = (f - m) / s$: $\mathrm{NECO}(x) = \|V_d^\top z\| /
    \|z\|$, times the max logit with ``use_max_logit`` (the paper does it for
    ViTs and other non-ResNet nets); $\mathrm{score} = -\mathrm{NECO}$ (higher:
    OoD). pytorch-ood
    has no NECO; this follows the paper and OpenOOD's ``neco`` postprocessor.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    d : int
        Dimension of the principal subspace (< the features' dimension).
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.
    use_max_logit : bool, default False
        Multiply by the max logit.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> neco = NECO(Recorder(net, input_size=(1, 3)), d=2)
    >>> neco.fit([torch.randn(32, 3)], input=None)(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    def __init__(
        self,
        rnet: Recorder,
        d: int,
        *,
        fc: Selector | None = None,
        use_max_logit: bool = False,
    ) -> None:
        """Find ``fc``; check ``d``."""
        super().__init__(rnet, fc)
        self._check_d(d)
        self.d = d
        self.use_max_logit = bool(use_max_logit)
        self.mean = torch.zeros(0, dtype=_F64)
        self.scale = torch.zeros(0, dtype=_F64)
        self.basis = torch.zeros(0, 0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Return the features' mean and covariance."""
        return {InputOf(self.label): Covariance()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the standardisation and the principal directions."""
        stats = result[self.label]
        cov = stats.cov_population.to(_F64)
        std = torch.diagonal(cov).clamp(min=0).sqrt()
        self.scale = torch.where(std > 0, std, torch.ones_like(std))
        self.mean = stats.mean.reshape(-1).to(_F64)
        standardised = cov / torch.outer(self.scale, self.scale)
        values, vectors = torch.linalg.eigh(standardised)
        order = torch.argsort(values, descending=True)
        self.basis = vectors[:, order[: self.d]]

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the principal share of the norm (times the max logit)."""
        f = self.features(result)
        z = (f - self.mean.to(f)) / self.scale.to(f)
        neco: Tensor = (z @ self.basis.to(f)).norm(dim=1) / z.norm(dim=1)
        if self.use_max_logit:
            neco = neco * self.logits(f).amax(dim=1)
        return -neco

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label, ``d`` and ``use_max_logit``."""
        return {
            "fc": list(self.label),
            "d": self.d,
            "use_max_logit": self.use_max_logit,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the standardisation and the basis."""
        return {"mean": self.mean, "scale": self.scale, "basis": self.basis}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: mean, scale ``[F]``, basis ``[F, d]``, float64."""
        f = self.features_in
        return {
            "mean": StateEntry((f,), _F64),
            "scale": StateEntry((f,), _F64),
            "basis": StateEntry((f, self.d), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the standardisation and the basis."""
        self.mean, self.scale = state["mean"], state["scale"]
        self.basis = state["basis"]


class Residual(_Head):
    r"""The Residual score (Wang et al., CVPR 2022, ViM's baseline).

    With the origin $u = -W^+ b$, ``fit`` takes the eigenvectors of
    $\mathbb{E}[(f - u)(f - u)^\top]$ over the in-distribution features
    (streaming moments); $R$ spans all but the top ``d``. $\mathrm{score}(x) =
    \|(f - u) R\|$: the norm
    of the feature's part orthogonal to the principal subspace (as ViM
    without the energy; OpenOOD's ``residual`` postprocessor negated).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    d : int
        Dimension of the principal subspace (< the features' dimension).
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> res = Residual(Recorder(net, input_size=(1, 3)), d=2)
    >>> bool((res.fit([torch.randn(32, 3)], input=None)(torch.randn(4, 3)) >= 0).all())
    True

    """

    def __init__(self, rnet: Recorder, d: int, *, fc: Selector | None = None) -> None:
        """Find ``fc``; check ``d``."""
        super().__init__(rnet, fc)
        self._check_d(d)
        self.d = d
        self.u = -torch.linalg.pinv(self.weight) @ self.bias
        self.residual = torch.zeros(self.weight.shape[1], 0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Return the features' mean and covariance."""
        return {InputOf(self.label): Covariance()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the residual basis."""
        stats = result[self.label]
        centre = stats.mean.reshape(-1).to(_F64) - self.u
        second = stats.cov_population.to(_F64) + torch.outer(centre, centre)
        values, vectors = torch.linalg.eigh(second)
        order = torch.argsort(values, descending=True)
        self.residual = vectors[:, order[self.d :]]

    def score_pass(self, result: Pass) -> Tensor:
        """Return the residual norm."""
        f = self.features(result)
        norms: Tensor = ((f - self.u.to(f)) @ self.residual.to(f)).norm(dim=1)
        return norms

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and ``d``."""
        return {"fc": list(self.label), "d": self.d}

    def state(self) -> dict[str, Tensor]:
        """Return the residual basis."""
        return {"residual": self.residual}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the residual basis ``[F, F - d]``, float64."""
        f = self.features_in
        return {"residual": StateEntry((f, f - self.d), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the residual basis."""
        self.residual = state["residual"]
