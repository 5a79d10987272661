"""CORE: the features split on the span of the classifier's rows (Yang et al., 2026)."""

from __future__ import annotations

__all__ = ["CORE"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional

from scio_recorder.collect import InputOf

from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

from ._weights import _F64, _Classifier, _fit_two, _LabelSums


class _Spread:
    """A reducer: sums and squared sums of CORE's two scores."""

    def __init__(self, owner: CORE, means: Tensor | None) -> None:
        self.owner, self.means = owner, means
        self.sums = torch.zeros(2, dtype=_F64)
        self.squares = torch.zeros(2, dtype=_F64)
        self.n = 0

    @property
    def count(self) -> int:
        return self.n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        f = value.detach().reshape(value.shape[0], -1).to(_F64)
        if f.shape[0] == 0:
            return
        confidence = self.owner.confidence(f)
        member = (
            self.owner.membership(f, self.means)
            if self.means is not None
            else torch.zeros_like(confidence)
        )
        both = torch.stack([confidence, member])
        self.sums = self.sums.to(f.device) + both.sum(dim=1)
        self.squares = self.squares.to(f.device) + (both * both).sum(dim=1)
        self.n += f.shape[0]

    def merge(self, other: _Spread) -> None:
        self.sums = self.sums + other.sums.to(self.sums.device)
        self.squares = self.squares + other.squares.to(self.sums.device)
        self.n += other.n

    def result(self) -> tuple[Tensor, Tensor]:
        """Return the means and the (population) standard deviations."""
        n = max(self.n, 1)
        mean = self.sums / n
        return mean, (self.squares / n - mean * mean).clamp(min=0).sqrt()

    def state(self) -> dict[str, Tensor]:
        return {
            "sums": self.sums,
            "squares": self.squares,
            "count": torch.tensor(self.n),
        }

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.sums, self.squares = state["sums"], state["squares"]
        self.n = int(state["count"])

    def fresh(self) -> _Spread:
        return _Spread(self.owner, self.means)


class CORE(_Classifier):
    r"""CORE, confidence and orthogonal residual (Yang, Kim & Bahk, 2026).

    With $P$ the orthogonal projection on the span of ``fc``'s weight rows
    and $r(f) = f - P f$ the residual (what ``fc`` discards): the
    confidence $E(f) = \mathrm{logsumexp}(W f + b)$ (the energy, which only
    $P f$ moves) and the membership $M(f) = \max_c \cos(r(f), r(\mu_c))$, the
    cosine of the residual to the residual of the class means $\mu_c$ of the
    fit data. ``fit`` (labelled data, ``target=`` needed; two passes: the
    class means and the energies' spread, then the membership's) keeps the
    means $m_E, m_M$ and standard deviations $s_E, s_M$ of both on the fit
    data; $\mathrm{score}(x) = -\left(\frac{E - m_E}{s_E} + \frac{M -
    m_M}{s_M}\right)$, the two normalised and summed.

    **The authors' code (OpenOOD pull request #312) could not be read**
    when this was written: this is our reading of the paper (arXiv
    2603.18290) and of the pull request's description (energy on the span,
    class-mean cosine on the residual, a normalised sum). Where we decided:
    the span is the rank of ``W`` (singular values above ``max(C, F)`` float64
    eps times the largest); the class means are of the labels' classes
    (every class of ``fc`` needs a fit sample); the cosine is the highest
    over the classes; the normalisation uses the fit data's mean and
    population standard deviation (a constant score, of deviation zero,
    counts as deviation one). Everything is float64; the span is taken from
    ``fc``'s weight when the detector is made (as ViM's origin).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> core = CORE(Recorder(net, input_size=(1, 3)))
    >>> x = torch.randn(32, 3)
    >>> core.fit([(x, torch.arange(32) % 2)], target=1)(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    needs_target: ClassVar[bool] = True
    fit_passes: ClassVar[int] = 2

    def __init__(self, rnet: Recorder, *, fc: Selector | None = None) -> None:
        """Find ``fc``; its classes are the labels'."""
        super().__init__(rnet, fc)
        self.num_classes = self.classes = self.linear.out_features
        self.means = torch.zeros(0, 0, dtype=_F64)
        self.spread = torch.zeros(4, dtype=_F64)
        w = self.weight64()
        _, values, vh = torch.linalg.svd(w, full_matrices=False)
        tol = values.max() * max(w.shape) * torch.finfo(_F64).eps
        self.basis: Tensor = vh[values > tol].T
        """An orthonormal basis of the span of ``W``'s rows, ``[F, rank]``
        (of ``fc``'s weight when the detector was made)."""

    def span(self) -> Tensor:
        """Return an orthonormal basis of the span of ``W``'s rows, ``[F, rank]``."""
        return self.basis

    def residual(self, f: Tensor, basis: Tensor | None = None) -> Tensor:
        """Return ``f - P f``, float64."""
        q = (self.span() if basis is None else basis).to(f.device)
        g = f.to(_F64)
        return g - (g @ q) @ q.T

    def confidence(self, f: Tensor) -> Tensor:
        """Return the energy ``logsumexp(W f + b)``, float64."""
        g = f.to(_F64)
        w = self.weight64().to(g.device)
        return torch.logsumexp(g @ w.T + self.bias64().to(g.device), dim=1)

    def membership(self, f: Tensor, means: Tensor) -> Tensor:
        """Return the highest cosine of the residual to the class means' residuals."""
        basis = self.span()
        r = functional.normalize(self.residual(f, basis), dim=1)
        m = functional.normalize(self.residual(means.to(r.device), basis), dim=1)
        cosines: Tensor = (r @ m.T).amax(dim=1)
        return cosines

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,
        **options: Any,
    ) -> Self:
        """Two passes: the class means and the energies, then the cosines.

        ``batches`` is iterated twice (a list or a ``DataLoader``), with
        class labels (``target=``). With ``spill_dir``, the passes use its
        subfolders ``pass-0`` and ``pass-1``. If the fit fails, the
        detector is left as it was.
        """
        from ._checks import checked_targets  # noqa: PLC0415 (as the protocol's fit)

        if target is None:
            msg = "CORE.fit needs class labels: pass `target=` (e.g. `target=1`)."
            raise ValueError(msg)
        key = InputOf(self.label)

        def second(found: Mapping[Any, Any]) -> tuple[dict[Any, Any], Any]:
            sums, counts = found[key]
            missing = torch.nonzero(counts == 0).reshape(-1).tolist()
            if sums.numel() == 0 or missing:
                which = missing or list(range(self.classes))
                msg = (
                    f"CORE: no fit sample of class {', '.join(map(str, which))}, "
                    "so its mean is undefined; fit on labelled data of every class."
                )
                raise ValueError(msg)
            means = (sums / counts[:, None].to(_F64)).cpu()

            def finish(result: Any) -> None:
                mean, std = result[self.label]
                self.means = means
                self.spread = torch.cat([mean, std]).cpu()

            return {key: _Spread(self, means)}, finish

        _fit_two(
            self,
            {key: _LabelSums(self.classes, "CORE")},
            second,
            batches,
            input=input,
            target=checked_targets(target, input, [self]),
            options=options,
        )
        return self

    def parts(self, result: Pass) -> tuple[Tensor, Tensor]:
        """Return the two normalised scores ``(E - m_E) / s_E``, ``(M - m_M) / s_M``."""
        f = self.features(result)
        spread = self.spread.to(f.device)
        std = torch.where(spread[2:] > 0, spread[2:], torch.ones_like(spread[2:]))
        confidence = (self.confidence(f) - spread[0]) / std[0]
        member = (self.membership(f, self.means) - spread[1]) / std[1]
        return confidence, member

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the sum of the normalised confidence and membership."""
        confidence, member = self.parts(result)
        return -(confidence + member)

    def state(self) -> dict[str, Tensor]:
        """Return the class means and the two scores' means and deviations."""
        return {"means": self.means, "spread": self.spread}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: ``[C, F]`` class means, ``[4]`` (m_E, m_M, s_E, s_M)."""
        shape = (self.linear.out_features, self.linear.in_features)
        return {"means": StateEntry(shape, _F64), "spread": StateEntry((4,), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the class means and the spread."""
        self.means, self.spread = state["means"], state["spread"]


# ----------------------------------------------------------------- ORA
