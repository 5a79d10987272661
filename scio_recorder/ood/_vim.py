"""ViM (Wang et al., CVPR 2022): the features' residual off their principal space.

The penultimate features' norm outside the fit's principal subspace, scaled
to the logits and set against their energy. Fitting takes two streaming
passes (the principal space first, then the residual norms' scale); the
family of :mod:`._features` (one layer's features, by default the input of
the last ``nn.Linear``).
"""

from __future__ import annotations

__all__ = ["ViM"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import Covariance

from ._checks import (
    check_batches,
    check_feature_count,
    last_linear,
)
from ._passes import all_or_nothing, check_reiterable, in_subfolder
from ._protocol import Detector, Pass, fit_pass
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


class _ResidualNorms:
    """A reducer: sums of max logits and of ViM residual norms (for alpha)."""

    def __init__(
        self, u: Tensor, residual: Tensor, weight: Tensor, bias: Tensor
    ) -> None:
        self.u, self.residual, self.weight, self.bias = u, residual, weight, bias
        self._reset()

    def _reset(self) -> None:
        self.sums = torch.zeros(2, dtype=_F64)
        self.n = 0

    @property
    def count(self) -> int:
        return self.n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        f = value.detach().reshape(value.shape[0], -1).to(_F64)
        logits = f @ self.weight.to(f).T + self.bias.to(f)
        norms = ((f - self.u.to(f)) @ self.residual.to(f)).norm(dim=1)
        self.sums = self.sums.to(f.device) + torch.stack(
            [logits.amax(dim=1).sum(), norms.sum()]
        )
        self.n += f.shape[0]

    def merge(self, other: _ResidualNorms) -> None:
        self.sums = self.sums + other.sums.to(self.sums.device)
        self.n += other.n

    def result(self) -> Tensor:
        return self.sums / max(self.n, 1)

    def state(self) -> dict[str, Tensor]:
        return {"sums": self.sums, "count": torch.tensor(self.n)}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.sums, self.n = state["sums"], int(state["count"])

    def fresh(self) -> _ResidualNorms:
        return _ResidualNorms(self.u, self.residual, self.weight, self.bias)


class ViM(Detector):
    r"""Virtual-logit matching (Wang et al., CVPR 2022).

    With $W$, $b$ the weight and bias of the classification layer ``fc``
    and $f$ its input features: the origin $u = -W^+ b$; ``fit`` takes the
    principal subspace of the in-distribution features about $u$ (the top
    ``d`` eigenvectors of $\mathbb{E}[(f - u)(f - u)^\top]$, from a streaming
    covariance) and $\alpha = \mathrm{mean}(\max z) / \mathrm{mean}(\|(f -
    u) R\|)$, $z$ the logits, $R$ spanning the residual (the other
    eigenvectors), in a second pass. $\mathrm{score}(x) = \alpha \|(f - u)
    R\| - \mathrm{logsumexp}(f W^\top + b)$.

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
    >>> vim = ViM(Recorder(net, input_size=(1, 3)), d=2)
    >>> vim.fit([torch.randn(32, 3)], input=None)(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    needs_fit: ClassVar[bool] = True
    fit_passes: ClassVar[int] = 2

    def __init__(self, rnet: Recorder, d: int, *, fc: Selector | None = None) -> None:
        """Find ``fc`` and check ``d``."""
        super().__init__(rnet)
        self.label = last_linear(rnet, fc, "ViM")
        linear = rnet.table[self.label].module
        assert isinstance(linear, torch.nn.Linear)  # noqa: S101 (last_linear checks it)
        weight = linear.weight.detach().to(_F64)
        bias = linear.bias
        self.weight: Tensor = weight
        self.bias: Tensor = (
            bias.detach().to(_F64)
            if bias is not None
            else weight.new_zeros(weight.shape[0])
        )
        features = weight.shape[1]
        if isinstance(d, bool) or not isinstance(d, int) or not 0 < d < features:
            msg = (
                f"ViM: d must be an int in [1, {features}) (the input features of "
                f"{rnet.table[self.label].describe()}), got {d!r}"
            )
            raise ValueError(msg)
        self.d = d
        self.u = -torch.linalg.pinv(weight) @ self.bias
        self.residual = torch.zeros(features, 0, dtype=_F64)
        self.alpha = torch.tensor(float("nan"), dtype=_F64)

    def inputs(self) -> tuple[DepthIdx, ...]:
        """Return the input of ``fc``."""
        return (self.label,)

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,  # noqa: ARG002 (ViM uses no labels)
        **options: Any,
    ) -> Self:
        """Two passes: the principal subspace, then ``alpha``.

        ``batches`` is iterated twice: a list or a ``DataLoader``; a
        generator or another iterator is a ``TypeError``, raised before the
        first pass. ``target`` is not used. With ``spill_dir``, the passes
        use its subfolders ``pass-0`` and ``pass-1`` (each resumable). If
        the fit fails, the detector is left as it was.
        """
        from scio_recorder.collect import InputOf, collect  # noqa: PLC0415 (as the base does)

        check_batches(batches, "ViM.fit")
        passes = [("one for the principal subspace", 1), ("one for alpha", 1)]
        check_reiterable(batches, passes, "ViM.fit")
        key = InputOf(self.label)
        with all_or_nothing([self]):
            ((_, stats),) = fit_pass(
                self.rnet,
                {key: Covariance()},
                batches,
                who={key: "ViM"},
                input=input,
                target=None,
                **in_subfolder(options, "pass-0"),
            ).values()
            centre = stats.mean.reshape(-1) - self.u
            second = stats.cov_population + torch.outer(centre, centre)
            values, vectors = torch.linalg.eigh(second)
            order = torch.argsort(values, descending=True)
            residual = vectors[:, order[self.d :]]
            norms = _ResidualNorms(self.u, residual, self.weight, self.bias)
            result = collect(
                self.rnet,
                batches,
                {key: norms},
                input=input,
                **in_subfolder(options, "pass-1"),
            )
            mean_logit, mean_norm = result[self.label].tolist()
            self.residual = residual
            self.alpha = torch.tensor(mean_logit / mean_norm, dtype=_F64)
            self._fitted = True
        return self

    def score_pass(self, result: Pass) -> Tensor:
        """Return the virtual logit minus the energy."""
        f = result.inputs[self.label]
        f = f.reshape(f.shape[0], -1).to(_F64)
        features = self.weight.shape[1]
        check_feature_count(
            self, self.label, "input", got=f.shape[1], expected=features
        )
        logits = f @ self.weight.to(f).T + self.bias.to(f)
        vlogit = self.alpha.to(f) * ((f - self.u.to(f)) @ self.residual.to(f)).norm(
            dim=1
        )
        scores: Tensor = vlogit - torch.logsumexp(logits, dim=1)
        return scores

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and ``d``."""
        return {"fc": list(self.label), "d": self.d}

    def state(self) -> dict[str, Tensor]:
        """Return the residual basis and alpha."""
        return {"residual": self.residual, "alpha": self.alpha.reshape(1)}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the residual ``[F, F - d]`` (F: fc's input), alpha."""
        features = int(self.weight.shape[1])
        return {
            "residual": StateEntry((features, features - self.d), _F64),
            "alpha": StateEntry((1,), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the residual basis and alpha."""
        self.residual, self.alpha = state["residual"], state["alpha"].reshape(())
