"""Detectors from class prototypes or the classification layer's geometry.

``DICE``, ``SHE``, ``NNGuide`` and ``fDBD`` read the input ``f`` of the
classification layer ``fc`` (an ``nn.Linear``, by default the last one the
net calls; as :class:`~scio_recorder.ood.ViM` does) and use its weight ``W``
and bias ``b``, read from the net when scoring (the net is not copied).
(``RMDS``, the relative Mahalanobis distance, is a
:class:`~scio_recorder.ood.Mahalanobis` and lives beside it.) Fitting is
one streaming :func:`~scio_recorder.collect.collect` pass: means
and covariances in float64 whatever the data size, except ``NNGuide``,
whose bank of ``N x F`` guide features grows with the fit data (``collect``
spills it to disk beyond a ``memory_budget``; the paper fits on a subset).
"""

from __future__ import annotations

__all__ = ["DICE", "SHE", "NNGuide", "fDBD", "quantile_linear"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional

from scio_recorder.reduce import Concat, Moments

from ._checks import check_bank_k, check_count
from ._classes import ClassConditional, check_at
from ._geometry import ClassSums
from ._layers import LastLayer
from ._outputs import energy_score
from ._saving import StateEntry
from ._search import check_search, nearest

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

_F64 = torch.float64


def quantile_linear(values: Tensor, q: float) -> Tensor:
    """Return the ``q`` quantile of all of ``values``, interpolated linearly.

    ``torch.quantile``'s default (``"linear"``), without its size limit.

    Examples
    --------
    >>> import torch
    >>> quantile_linear(torch.tensor([3.0, 1.0, 2.0, 4.0]), 0.5)
    tensor(2.5000)

    """
    flat = values.reshape(-1).sort().values
    position = q * (flat.numel() - 1)
    low = int(position)
    high = min(low + 1, flat.numel() - 1)
    return flat[low] + (position - low) * (flat[high] - flat[low])


class DICE(LastLayer):
    r"""DICE, directed sparsification (Sun & Li, ECCV 2022).

    ``fit`` takes the mean $m$ of ``fc``'s input features on
    in-distribution data (streaming) and the contributions $V = m^\top \odot W$
    ($V_{cj} = m_j W_{cj}$); the weights whose contribution is not above the
    $p$ quantile of $V$ are masked out: $\tilde W = W \odot [V > q_p(V)]$.
    $\mathrm{score}(x) = \mathrm{detector}(f \tilde W^\top + b)$, the energy by
    default.

    Where our reading decided, with pytorch-ood 0.4: ``p`` is the fraction
    of weights dropped, the quantile interpolated linearly over all ``C x
    F`` contributions (``torch.quantile``'s default), a weight kept when its
    contribution is strictly above it; the mean and contributions are
    float64 (pytorch-ood: float32), so a contribution within float32
    rounding of the threshold may be kept on one side and not the other.
    ``p`` has no default in pytorch-ood; ours is the paper's CIFAR value.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    p : float, default 0.9
        The fraction of weights dropped, in ``[0, 1)``.
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.
    detector : callable, optional
        ``logits -> scores``; default :func:`~scio_recorder.ood._outputs.energy_score`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(1)  # seeded: a ReLU dead on the data ties its 0s
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> dice = DICE(Recorder(net, input_size=(1, 3)), p=0.5)
    >>> dice.fit([torch.randn(32, 3)], input=None)(torch.randn(4, 3)).shape
    torch.Size([4])
    >>> int(dice.mask().sum())  # half of the 2 x 8 weights kept
    8

    """

    needs_fit: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        p: float = 0.9,
        *,
        fc: Selector | None = None,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Find ``fc``; check ``p``."""
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
            msg = (
                f"DICE: p, the fraction of weights dropped, must be in [0, 1), "
                f"got {p!r}"
            )
            raise ValueError(msg)
        super().__init__(rnet, fc)
        self.p = float(p)
        self.detector = detector or energy_score
        self.mean = torch.zeros(0, dtype=_F64)
        self.threshold = torch.tensor(float("nan"), dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Return the mean of ``fc``'s input to keep."""
        return {self._keep_key(self.label, "input"): Moments()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the mean feature and the contributions' quantile."""
        self.mean = result[self.label].mean.reshape(-1).to(_F64).cpu()
        contributions = self.mean[None, :] * self.weight64().cpu()
        self.threshold = quantile_linear(contributions, self.p)

    def mask(self) -> Tensor:
        """Return the kept weights, ``[C, F]`` booleans."""
        w = self.weight64()
        contributions = self.mean.to(w.device)[None, :] * w
        return contributions > self.threshold.to(w.device)

    def score_pass(self, result: Pass) -> Tensor:
        """Return the score of the logits of the sparsified ``fc``."""
        f = self.features(result)
        masked = self.linear.weight.detach() * self.mask()
        bias = self.linear.bias
        logits = functional.linear(
            f, masked.to(f), None if bias is None else bias.detach().to(f)
        )
        return self.detector(logits)

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and ``p``."""
        return {**super().config(), "p": self.p}

    def state(self) -> dict[str, Tensor]:
        """Return the mean feature and the threshold."""
        return {"mean": self.mean, "threshold": self.threshold.reshape(1)}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the mean of ``fc``'s input ``[F]``, the threshold."""
        return {
            "mean": StateEntry((self.linear.in_features,), _F64),
            "threshold": StateEntry((1,), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the mean feature and the threshold."""
        self.mean = state["mean"]
        self.threshold = state["threshold"].reshape(())


# ----------------------------------------------------------------- SHE
class _CorrectMeans(ClassSums):
    """A reducer: per-class sums and counts of the correctly classified features."""

    def __init__(self, owner: LastLayer) -> None:
        super().__init__()
        self.owner = owner

    def update(self, value: Any, target: Tensor | None = None) -> None:
        if target is None:
            msg = "SHE needs class labels: pass `target=` to fit."
            raise ValueError(msg)
        f = value.detach().reshape(value.shape[0], -1)
        predicted = self.owner.logits(f).argmax(dim=1)
        target = torch.as_tensor(target, device=f.device).reshape(-1)
        right = predicted == target
        self.add(self.owner.linear.out_features, f[right], predicted[right])

    def fresh(self) -> _CorrectMeans:
        return _CorrectMeans(self.owner)


class SHE(ClassConditional, LastLayer):
    r"""SHE, simplified Hopfield energy (Zhang et al., ICLR 2023).

    ``fit`` (labelled in-distribution data, ``target=`` needed) stores one
    pattern per class, $S_c$: the mean of ``fc``'s input features over the
    fit samples of class $c$ that the net classifies correctly (streaming,
    float64). $\mathrm{score}(x) = -\langle f, S_{\hat y} \rangle$, $\hat y$ the
    class ``fc`` predicts for $x$ (``at="predicted"``, the paper's reading
    and the default); ``score_classes(x)`` is $-\langle f, S_c \rangle$ for every
    class, and
    ``at="closest"`` reads the class of the largest inner product.

    Where our reading decided, with pytorch-ood 0.4: predictions are
    ``fc``'s (computed from the recorded features with ``fc``'s weight, the
    net's own operation); every class of ``fc`` needs at least one correctly
    classified fit sample (pytorch-ood asks the same of the labels' classes).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.
    at : {"predicted", "closest"}
        Which class's pattern the score reads.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)  # a net that predicts both classes
    >>> net = nn.Sequential(nn.Linear(2, 2))
    >>> rnet = Recorder(net, input_size=(1, 2))
    >>> x = torch.randn(32, 2)
    >>> she = SHE(rnet).fit([(x, net(x).argmax(1))], target=1)
    >>> she.patterns.shape, she(torch.randn(3, 2)).shape
    (torch.Size([2, 2]), torch.Size([3]))

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(
        self, rnet: Recorder, *, fc: Selector | None = None, at: str = "predicted"
    ) -> None:
        """Find ``fc``; labels are its classes."""
        self.at = check_at("SHE", at)
        super().__init__(rnet, fc)
        self.num_classes = self.linear.out_features
        self.patterns = torch.zeros(0, 0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Per-class sums of the correctly classified features."""
        return {self._keep_key(self.label, "input"): _CorrectMeans(self)}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the class means; refuse a class with no correct sample."""
        sums, counts = result[self.label]
        missing = torch.nonzero(counts == 0).reshape(-1).tolist()
        if sums.numel() == 0 or missing:
            which = missing or list(range(self.linear.out_features))
            msg = (
                f"SHE: no fit sample of class {', '.join(map(str, which))} is "
                "classified correctly, so its pattern is undefined; fit on "
                "labelled data of every class that the net classifies well."
            )
            raise ValueError(msg)
        self.patterns = (sums / counts[:, None].to(_F64)).cpu()

    def predicted(self, result: Pass) -> Tensor:
        """Return the class ``fc`` predicts (from the recorded features)."""
        return self.logits(self.features(result)).argmax(dim=1)

    def scores_at(self, result: Pass, classes: Tensor) -> Tensor:
        """Return minus the inner product with the given class's pattern."""
        f = self.features(result)
        patterns = self.patterns.to(f.device)
        return -(f.to(_F64) * patterns[classes.to(f.device)]).sum(dim=1)

    def class_scores(self, result: Pass) -> Tensor:
        """Return minus the inner product with each class's pattern."""
        f = self.features(result).to(_F64)
        scores: Tensor = -(f @ self.patterns.to(f.device).T)
        return scores

    def state(self) -> dict[str, Tensor]:
        """Return the patterns."""
        return {"patterns": self.patterns}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: one pattern per class of ``fc``, ``[C, F]``."""
        shape = (self.linear.out_features, self.linear.in_features)
        return {"patterns": StateEntry(shape, _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the patterns."""
        self.patterns = state["patterns"]


# ----------------------------------------------------------------- NNGuide
class NNGuide(LastLayer):
    r"""NNGuide, nearest-neighbour guidance (Park et al., ICCV 2023).

    With $E(x) = \mathrm{logsumexp}(\mathrm{fc}(f(x)))$ and $\hat f = f / \|f\|$:
    ``fit`` keeps the bank of the fit samples' guides $E(z) \hat f(z)$;
    $\mathrm{score}(x) = -E(x) \cdot \frac{1}{k} \sum$ of the $k$ largest
    $\langle \hat f(x), E(z) \hat f(z) \rangle$ over the bank.

    Where our reading decided, with pytorch-ood 0.4: the neighbours are the
    ``k`` largest inner products with the energy-scaled guides (not the
    ``k`` nearest by cosine, then scaled); the bank is float32. **The bank
    grows with the fit data** (``N x F``; ``collect`` spills the features to
    disk beyond a ``memory_budget``): the paper fits on a random subset of
    the training set (1 % on ImageNet), so fit on a subset.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    k : int, default 10
        Neighbours averaged.
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.
    backend, search_budget
        The search's options (:func:`~scio_recorder.ood._search.nearest`,
        the largest inner products).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> guide = NNGuide(Recorder(net, input_size=(1, 3)), k=3)
    >>> guide.fit([torch.randn(16, 3)], input=None).bank.shape
    torch.Size([16, 4])

    """

    needs_fit: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        k: int = 10,
        *,
        fc: Selector | None = None,
        backend: str = "auto",
        search_budget: int | None = None,
    ) -> None:
        """Find ``fc``; check ``k`` and the search options."""
        check_count("NNGuide", "k", k, low=1)
        check_search("NNGuide", backend, search_budget)
        super().__init__(rnet, fc)
        self.k = k
        self.backend, self.search_budget = backend, search_budget
        self.bank = torch.zeros(0, 0)

    def fit_keep(self) -> dict[Any, Any]:
        """Every feature row of ``fc``'s input."""
        return {self._keep_key(self.label, "input"): Concat()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the energy-scaled normalised features, chunk by chunk."""
        rows = result[self.label]
        rows = rows.reshape(rows.shape[0], -1)
        check_bank_k("NNGuide", self.k, rows.shape[0])
        device = self.linear.weight.device
        chunks = []
        for start in range(0, rows.shape[0], 4096):
            z = rows[start : start + 4096].to(device).float()
            energy = torch.logsumexp(self.logits(z), dim=1)
            chunks.append((functional.normalize(z, dim=1) * energy[:, None]).cpu())
        self.bank = torch.cat(chunks)

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the energy times the guidance."""
        f = self.features(result).float()
        energy = torch.logsumexp(self.logits(f), dim=1)
        z = functional.normalize(f, dim=1)
        top = nearest(
            z,
            self.bank,
            self.k,
            metric="ip",
            backend=self.backend,
            memory_budget=self.search_budget,
        ).values
        scores: Tensor = -(top.mean(dim=1) * energy)
        return scores

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and ``k``."""
        return {**super().config(), "k": self.k}

    def state(self) -> dict[str, Tensor]:
        """Return the bank."""
        return {"bank": self.bank}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the guided bank ``[N, F]``, float32."""
        return {"bank": StateEntry(("samples", self.linear.in_features), torch.float32)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the bank."""
        check_bank_k("NNGuide", self.k, state["bank"].shape[0])
        self.bank = state["bank"]


# ----------------------------------------------------------------- RMDS
class fDBD(LastLayer):  # noqa: N801 (the paper's and pytorch-ood's name)
    r"""fDBD, fast decision-boundary distance (Liu & Qin, ICML 2024).

    With $\hat y$ the class ``fc`` predicts, $z = W f + b$ its logits and
    $\mu$ the mean of ``fc``'s input on the fit data (streaming, float64):
    $\mathrm{score}(x) = -\frac{1}{C - 1} \sum_{c \ne \hat y} |z_{\hat y} - z_c| /
    \|w_{\hat y} - w_c\| / \|f - \mu\|$ (the distances to the decision
    boundaries, relative to the distance to the mean).

    Where our reading decided, with pytorch-ood 0.4: the prediction is
    ``fc``'s (the net's own operation, in the features' dtype), the
    distances are float64; $\|f - \mu\|$ is clamped to $10^{-8}$; two
    classes with equal weight vectors divide by zero (as in the paper).

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
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3))
    >>> dbd = fDBD(Recorder(net, input_size=(1, 3)))
    >>> bool((dbd.fit([torch.randn(16, 3)], input=None)(torch.randn(4, 3)) <= 0).all())
    True

    """

    needs_fit: ClassVar[bool] = True

    def __init__(self, rnet: Recorder, *, fc: Selector | None = None) -> None:
        """Find ``fc``; it needs two classes."""
        super().__init__(rnet, fc)
        if self.linear.out_features < 2:  # noqa: PLR2004 (a boundary needs two classes)
            msg = (
                f"fDBD: fc {rnet.table[self.label].describe()} has one output; "
                "decision boundaries need at least two classes."
            )
            raise ValueError(msg)
        self.mean = torch.zeros(0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Return the mean of ``fc``'s input to keep."""
        return {self._keep_key(self.label, "input"): Moments()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the mean feature."""
        self.mean = result[self.label].mean.reshape(-1).to(_F64).cpu()

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the mean relative distance to the decision boundaries."""
        f = self.features(result)
        predicted = self.logits(f).argmax(dim=1)
        g = f.to(_F64)
        w = self.weight64().to(g.device)
        z = g @ w.T + self.bias64().to(g.device)
        gram = w @ w.T
        sq = gram.diagonal()
        apart = (sq[:, None] + sq[None, :] - 2 * gram).clamp(min=0).sqrt()
        apart = apart.fill_diagonal_(1.0)[predicted]
        gaps = (z - z.gather(1, predicted[:, None])).abs()
        boundary = (gaps / apart).sum(dim=1) / (z.shape[1] - 1)
        spread = (g - self.mean.to(g.device)).norm(dim=1).clamp(min=1e-8)
        scores: Tensor = -boundary / spread
        return scores

    def state(self) -> dict[str, Tensor]:
        """Return the mean feature."""
        return {"mean": self.mean}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the mean of ``fc``'s input ``[F]``."""
        return {"mean": StateEntry((self.linear.in_features,), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the mean feature."""
        self.mean = state["mean"]
