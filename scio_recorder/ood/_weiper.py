"""WeiPer: the classifier's weights perturbed (Granz, Heurich & Landgraf, 2024)."""

from __future__ import annotations

__all__ = ["WeiPer"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional

from scio_recorder.collect import InputOf

from ._checks import check_count
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

from ._weights import _F64, _Classifier, _fit_two


def weiper_edges(low: Tensor, high: Tensor, bins: int) -> Tensor:
    """Return the ``bins + 1`` edges of WeiPer's bins from ``low`` to ``high``.

    As the reference computes them, in ``low``'s dtype: ``low + (k / bins)
    ((high + 1e-8) - low)``, ``k = 0..bins`` (in float32, ``1e-8`` is lost
    beside a ``high`` above about 0.1, so that ``high`` itself falls out of
    the last bin, with the values above it).

    Examples
    --------
    >>> import torch
    >>> weiper_edges(torch.tensor(0.0), torch.tensor(4.0), 4)
    tensor([0., 1., 2., 3., 4.])

    """
    steps = torch.arange(bins + 1, dtype=low.dtype, device=low.device) / bins
    return low + steps * ((high + 1e-8) - low)


def weiper_densities(values: Tensor, edges: Tensor, weights: Tensor) -> Tensor:
    """Return each row's histogram of its values, ``[N, bins]``, float64.

    ``values`` ``[N, M]``, ``edges`` the ``bins + 1`` increasing edges (a
    value ``v`` is in bin ``k`` when ``edges[k] <= v < edges[k + 1]``),
    ``weights`` ``[M]`` the weight of each column. A row's densities are the
    weights in each bin over the row's total weight: what falls below the
    first edge or at or above the last counts in the total, not in a bin.

    Examples
    --------
    >>> import torch
    >>> edges = torch.tensor([0.0, 1.0, 2.0])
    >>> weiper_densities(torch.tensor([[0.5, 1.5, 1.7, 9.0]]), edges, torch.ones(4))
    tensor([[0.2500, 0.5000]], dtype=torch.float64)

    """
    where = torch.searchsorted(edges.to(values), values.contiguous(), right=True)
    n, bins = values.shape[0], edges.shape[0] - 1
    counts = torch.zeros(n, bins + 2, dtype=_F64, device=values.device)
    w = weights.to(device=values.device, dtype=_F64).expand(n, -1)
    counts.scatter_add_(1, where, w)
    return counts[:, 1:-1] / counts.sum(dim=1, keepdim=True)


def uniform_smoothing(densities: Tensor, size: int) -> Tensor:
    """Return the moving average of each row over ``size`` bins, edges replicated.

    The window of bin ``i`` runs from ``i - (size - 1) // 2`` to ``i + size
    // 2`` (a ``Conv1d`` with ``padding="same"`` and
    ``padding_mode="replicate"``: one more bin after than before for an even
    ``size``).

    Examples
    --------
    >>> import torch
    >>> uniform_smoothing(torch.tensor([[0.0, 3.0, 0.0, 0.0]]), 3)
    tensor([[1., 1., 1., 0.]])

    """
    left = (size - 1) // 2
    right = size - 1 - left
    padded = torch.cat(
        [
            densities[:, :1].expand(-1, left),
            densities,
            densities[:, -1:].expand(-1, right),
        ],
        dim=1,
    )
    return padded.unfold(1, size, 1).mean(dim=-1)


def symmetric_kl(p: Tensor, q: Tensor, eps: float) -> Tensor:
    """Return ``KL(p' || q') + KL(q' || p')`` per row of ``q``, offsets ``eps``.

    ``p' = (p + eps) / sum(p + eps)``, and ``q'`` likewise.

    ``p`` ``[bins]``, ``q`` ``[N, bins]``; both are offset by ``eps`` and
    normalised to sum to one first.

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    >>> symmetric_kl(p, p[None], 0.0)
    tensor([0.], dtype=torch.float64)

    """
    p = p + eps
    p = p / p.sum()
    q = q + eps
    q = q / q.sum(dim=1, keepdim=True)
    return ((p - q) * (p.log() - q.log())).sum(dim=1)


def reference_weights(size: int, chunk: int = 1000) -> Tensor:
    """Return the weights the reference's histogram gives ``size`` values, float64.

    The reference averages the indicator of each bin over chunks of
    ``chunk`` values, then sums the chunks' averages: beyond ``chunk``
    values, a value of a short last chunk weighs more than the others.
    Uniform (``1 / size``) up to ``chunk`` values or when ``chunk`` divides
    ``size``.

    Examples
    --------
    >>> reference_weights(5, chunk=4).tolist()
    [0.125, 0.125, 0.125, 0.125, 0.5]

    """
    if size <= chunk:
        return torch.full((size,), 1.0 / size, dtype=_F64)
    sizes = [min(chunk, size - start) for start in range(0, size, chunk)]
    per = [torch.full((n,), 1.0 / n, dtype=_F64) for n in sizes]
    return torch.cat(per) / len(sizes)


class _Range:
    """A reducer: the lowest and highest feature and perturbed logit."""

    def __init__(self, owner: WeiPer) -> None:
        self.owner = owner
        self.bounds = torch.tensor([math.inf, -math.inf, math.inf, -math.inf])
        self.n = 0

    @property
    def count(self) -> int:
        return self.n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        f = value.detach().reshape(value.shape[0], -1)
        if f.shape[0] == 0:
            return
        z = self.owner.perturbed_logits(f)
        self.fold(torch.stack([f.min(), f.max(), z.min(), z.max()]).cpu())
        self.n += f.shape[0]

    def fold(self, found: Tensor) -> None:
        if self.n == 0:
            self.bounds = found.clone()
            return
        self.bounds = torch.stack(
            [
                torch.minimum(self.bounds[0], found[0].to(self.bounds)),
                torch.maximum(self.bounds[1], found[1].to(self.bounds)),
                torch.minimum(self.bounds[2], found[2].to(self.bounds)),
                torch.maximum(self.bounds[3], found[3].to(self.bounds)),
            ]
        )

    def merge(self, other: _Range) -> None:
        if other.n:
            self.fold(other.bounds)
            self.n += other.n

    def result(self) -> Tensor:
        return self.bounds

    def state(self) -> dict[str, Tensor]:
        return {"bounds": self.bounds, "count": torch.tensor(self.n)}

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.bounds, self.n = state["bounds"], int(state["count"])

    def fresh(self) -> _Range:
        return _Range(self.owner)


class _Densities:
    """A reducer: sums of the per-sample densities, and of the per-batch means."""

    def __init__(self, owner: WeiPer, bounds: Tensor) -> None:
        self.owner, self.bounds = owner, bounds
        self._reset()

    def _reset(self) -> None:
        bins = self.owner.bins
        self.sums = torch.zeros(2, bins, dtype=_F64)
        self.batch_sums = torch.zeros(2, bins, dtype=_F64)
        self.n = 0
        self.batches = 0

    @property
    def count(self) -> int:
        return self.n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        f = value.detach().reshape(value.shape[0], -1)
        if f.shape[0] == 0:
            return
        latent, perturbed, _ = self.owner.densities(f, self.bounds)
        both = torch.stack([latent, perturbed])  # [2, N, bins]
        self.sums = self.sums.to(both.device) + both.sum(dim=1)
        self.batch_sums = self.batch_sums.to(both.device) + both.mean(dim=1)
        self.n += f.shape[0]
        self.batches += 1

    def merge(self, other: _Densities) -> None:
        self.sums = self.sums + other.sums.to(self.sums.device)
        self.batch_sums = self.batch_sums + other.batch_sums.to(self.sums.device)
        self.n += other.n
        self.batches += other.batches

    def result(self) -> tuple[Tensor, Tensor]:
        """Return the mean density per sample and the mean of the batch means."""
        return self.sums / max(self.n, 1), self.batch_sums / max(self.batches, 1)

    def state(self) -> dict[str, Tensor]:
        return {
            "sums": self.sums,
            "batch_sums": self.batch_sums,
            "count": torch.tensor(self.n),
            "batches": torch.tensor(self.batches),
        }

    def load_state(self, state: dict[str, Tensor]) -> None:
        self.sums, self.batch_sums = state["sums"], state["batch_sums"]
        self.n, self.batches = int(state["count"]), int(state["batches"])

    def fresh(self) -> _Densities:
        return _Densities(self.owner, self.bounds)


def _check_positive(who: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        msg = f"{who}: {name} must be a positive number, got {value!r}"
        raise ValueError(msg)
    return float(value)


def _check_lambda(who: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        msg = f"{who}: {name} must be a number >= 0, got {value!r}"
        raise ValueError(msg)
    return float(value)


class WeiPer(_Classifier):
    r"""WeiPer, weight perturbations (Granz, Heurich & Landgraf, NeurIPS 2024).

    ``r`` perturbed copies of ``fc``: $\tilde W_i = W + \delta\,
    \mathrm{diag}(\lVert w_c \rVert)\, N_i / \lVert N_{i,c} \rVert$, $N_i$
    Gaussian noise ``C x F`` (each row of the noise scaled to $\delta$ times
    the norm of its class's weight), the bias unchanged; the perturbed
    logits $\tilde z = (\tilde W_i f + b)_{i \le r}$ (``r C`` values). Each
    sample gets two histograms on ``bins`` bins: of its ``F`` feature values
    ($p_f$) and of its ``r C`` perturbed logits ($p_{\tilde z}$), the bins
    spanning the fit data's lowest to highest feature (perturbed logit).
    ``fit`` (two passes: the range, then the densities) keeps the fit data's
    mean densities $\bar p_f, \bar p_{\tilde z}$.

    $\mathrm{score}(x) = \mathrm{KL}_s(\bar p_f, S_{s_1} p_f) + \lambda_1
    \mathrm{KL}_s(\bar p_{\tilde z}, S_{s_2} p_{\tilde z}) - \lambda_2
    \mathrm{MSP}_{\tilde W}$ (``score="kld"``, WeiPer+KLD), with $S_s$ the
    moving average over ``s`` bins (edges replicated), $\mathrm{KL}_s$ the
    symmetric KL divergence of the two densities each offset by $\epsilon$
    (``epsilon``, ``epsilon_perturbed``) and normalised, and
    $\mathrm{MSP}_{\tilde W}$ the mean over the ``r`` copies of the maximum
    softmax probability. ``score="msp"``: $-\mathrm{MSP}_{\tilde W}$ alone
    (WeiPer+MSP). Higher is more OoD (the reference returns minus it).

    The defaults are the reference's (``mgranz/weiper``, its OpenOOD
    postprocessor ``weiper_kldiv``): ``r=100``, ``delta=1.8``,
    ``bins=100``, ``lambda1=2.5``, ``lambda2=0.1``, ``smoothing=4``,
    ``smoothing_perturbed=15``, ``epsilon=0.01``,
    ``epsilon_perturbed=0.025``. What we kept of the reference's details,
    and dropped (``reference=True`` keeps them all, to check against it):

    * kept: one range for all of a histogram's values (the lowest and
      highest over every feature, not one per feature), from the exact
      minimum and maximum of the fit data (the reference's only working
      path: its other one refers to variables it never sets); the upper
      edge ``high + 1e-8`` in float32 (:func:`weiper_edges`); values outside
      the range counted in the histogram's total, not in a bin; only the
      test sample's histogram smoothed, not the fit mean; the bins and
      perturbed logits in the features' dtype;
    * dropped by default, kept with ``reference=True``: the fit mean as the
      mean of the batches' means (a short last batch weighs more; ours: the
      mean over the samples) and, for more than 1,000 values, histograms
      averaged over chunks of 1,000 values (a short last chunk weighs more;
      ours: every value alike; :func:`reference_weights`);
    * without effect on the numbers, not reproduced: the reference scores
      test samples in chunks of 100, padding a short last chunk with ones,
      because its smoothing is a ``Conv1d`` of 100 channels, one a sample;
      the channels are independent (the kernel is diagonal), so the padding
      changes no score, and ours smooths each sample alone.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    r : int, default 100
        The number of perturbed copies of ``fc``.
    delta : float, default 1.8
        The perturbation's size relative to each class's weight norm.
    bins : int, default 100
        Bins of the histograms.
    lambda1, lambda2 : float, default 2.5 and 0.1
        Weights of the perturbed logits' divergence and of their MSP
        (both 0: the features' divergence alone).
    smoothing, smoothing_perturbed : int, default 4 and 15
        Widths of the moving averages of the features' and the perturbed
        logits' histograms.
    epsilon, epsilon_perturbed : float, default 0.01 and 0.025
        Offsets of the densities before the divergences.
    score : {"kld", "msp"}
        WeiPer+KLD (default) or WeiPer+MSP.
    reference : bool
        Reproduce the reference's fit mean and chunked histograms (above).
    generator : torch.Generator or int, optional
        Draws the noise (an int seeds a new generator); default torch's
        global generator.
    perturbations : Tensor, optional
        The noise itself, ``[r, C, F]`` (then ``generator`` is not used).
    fc : selector, optional
        The classification ``nn.Linear``; default the last one the net calls.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> weiper = WeiPer(Recorder(net, input_size=(1, 3)), r=4, bins=10, generator=0)
    >>> weiper.fit([torch.randn(32, 3)], input=None)(torch.randn(5, 3)).shape
    torch.Size([5])
    >>> weiper.perturbed.shape  # r copies of fc's 2 x 8 weight
    torch.Size([4, 2, 8])

    """

    fit_passes: ClassVar[int] = 2

    def __init__(  # noqa: PLR0913 (the reference's hyperparameters)
        self,
        rnet: Recorder,
        r: int = 100,
        *,
        delta: float = 1.8,
        bins: int = 100,
        lambda1: float = 2.5,
        lambda2: float = 0.1,
        smoothing: int = 4,
        smoothing_perturbed: int = 15,
        epsilon: float = 0.01,
        epsilon_perturbed: float = 0.025,
        score: str = "kld",
        reference: bool = False,
        generator: torch.Generator | int | None = None,
        perturbations: Tensor | None = None,
        fc: Selector | None = None,
    ) -> None:
        """Find ``fc``, check the hyperparameters, draw the perturbations."""
        who = "WeiPer"
        self.r = check_count(who, "r", r, low=1)
        self.bins = check_count(who, "bins", bins, low=1)
        self.smoothing = check_count(who, "smoothing", smoothing, low=1)
        self.smoothing_perturbed = check_count(
            who, "smoothing_perturbed", smoothing_perturbed, low=1
        )
        self.delta = _check_positive(who, "delta", delta)
        self.epsilon = _check_positive(who, "epsilon", epsilon)
        self.epsilon_perturbed = _check_positive(
            who, "epsilon_perturbed", epsilon_perturbed
        )
        self.lambda1 = _check_lambda(who, "lambda1", lambda1)
        self.lambda2 = _check_lambda(who, "lambda2", lambda2)
        if score not in {"kld", "msp"}:
            msg = f"WeiPer: score must be 'kld' or 'msp', got {score!r}"
            raise ValueError(msg)
        self.score_kind = score
        self.reference = bool(reference)
        super().__init__(rnet, fc)
        w = self.linear.weight.detach()
        if perturbations is None:
            if isinstance(generator, bool):
                msg = "WeiPer: generator must be a torch.Generator or an int seed"
                raise TypeError(msg)
            draws = (
                torch.Generator().manual_seed(generator)
                if isinstance(generator, int)
                else generator
            )
            noise = torch.randn((self.r, *w.shape), generator=draws, dtype=w.dtype)
        else:
            noise = perturbations.detach()
            if tuple(noise.shape) != (self.r, *w.shape):
                msg = (
                    f"WeiPer: perturbations must be [r, C, F] = "
                    f"{[self.r, *w.shape]} (r copies of fc's weight), got "
                    f"{list(noise.shape)}"
                )
                raise ValueError(msg)
        self.perturbed = self.perturb(noise.to(w))
        self.bounds = torch.full((4,), math.nan, dtype=w.dtype)
        self.density = torch.zeros(self.bins, dtype=_F64)
        self.density_perturbed = torch.zeros(self.bins, dtype=_F64)

    def perturb(self, noise: Tensor) -> Tensor:
        """Return the ``r`` perturbed weights ``[r, C, F]`` from the noise.

        As the reference computes them, one copy at a time:
        ``W + (delta * normalize(N_i)) * ||w_c||``.
        """
        w = self.linear.weight.detach()
        norms = w.norm(dim=1)[:, None]
        return torch.stack(
            [w + (self.delta * functional.normalize(n, dim=1)) * norms for n in noise]
        )

    def perturbed_logits(self, f: Tensor) -> Tensor:
        """Return the ``r C`` perturbed logits of each row of ``f``, ``[N, r C]``."""
        r, c, width = self.perturbed.shape
        bias = self.linear.bias
        b = (
            bias.detach().repeat(r)
            if bias is not None
            else torch.zeros(r * c, dtype=f.dtype, device=f.device)
        )
        return functional.linear(f, self.perturbed.reshape(r * c, width).to(f), b.to(f))

    def densities(self, f: Tensor, bounds: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Return the features' and perturbed logits' densities, and the logits."""
        z = self.perturbed_logits(f)
        bounds = bounds.to(device=f.device, dtype=f.dtype)
        out = []
        for values, (low, high) in ((f, bounds[:2]), (z, bounds[2:])):
            size = values.shape[1]
            weights = (
                reference_weights(size)
                if self.reference
                else torch.full((size,), 1.0 / size, dtype=_F64)
            )
            edges = weiper_edges(low, high, self.bins)
            out.append(weiper_densities(values, edges, weights))
        return out[0], out[1], z

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,  # noqa: ARG002 (WeiPer uses no labels)
        **options: Any,
    ) -> Self:
        """Two passes: the range of the features and logits, then the densities.

        ``batches`` is iterated twice: a list or a ``DataLoader``; a
        generator or another iterator is a ``TypeError``, raised before the
        first pass. ``target`` is not used. With ``spill_dir``, the passes
        use its subfolders ``pass-0`` and ``pass-1`` (each resumable). If
        the fit fails, the detector is left as it was.
        """
        key = InputOf(self.label)

        def second(found: Mapping[Any, Any]) -> tuple[dict[Any, Any], Any]:
            bounds = found[key]

            def finish(result: Any) -> None:
                per_sample, per_batch = result[self.label]
                mean = per_batch if self.reference else per_sample
                self.bounds = bounds
                self.density, self.density_perturbed = mean[0].cpu(), mean[1].cpu()

            return {key: _Densities(self, bounds)}, finish

        _fit_two(
            self,
            {key: _Range(self)},
            second,
            batches,
            input=input,
            target=None,
            options=options,
        )
        return self

    def score_pass(self, result: Pass) -> Tensor:
        """Return the divergences from the fit's densities, minus the MSP term."""
        f = self.features(result)
        latent, perturbed, z = self.densities(f, self.bounds)
        r, c, _ = self.perturbed.shape
        msp = z.to(_F64).reshape(-1, r, c).softmax(dim=-1).amax(dim=-1).mean(dim=-1)
        if self.score_kind == "msp":
            return -msp
        kl = symmetric_kl(
            self.density.to(latent.device),
            uniform_smoothing(latent, self.smoothing),
            self.epsilon,
        )
        kl_perturbed = symmetric_kl(
            self.density_perturbed.to(latent.device),
            uniform_smoothing(perturbed, self.smoothing_perturbed),
            self.epsilon_perturbed,
        )
        scores: Tensor = kl + self.lambda1 * kl_perturbed - self.lambda2 * msp
        return scores

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label and the hyperparameters."""
        return {
            **super().config(),
            "r": self.r,
            "delta": self.delta,
            "bins": self.bins,
            "lambda1": self.lambda1,
            "lambda2": self.lambda2,
            "smoothing": self.smoothing,
            "smoothing_perturbed": self.smoothing_perturbed,
            "epsilon": self.epsilon,
            "epsilon_perturbed": self.epsilon_perturbed,
            "score": self.score_kind,
            "reference": self.reference,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the perturbed weights, the bins' range and the fit's densities."""
        return {
            "perturbed": self.perturbed,
            "bounds": self.bounds,
            "density": self.density,
            "density_perturbed": self.density_perturbed,
        }

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: ``[r, C, F]``, the 4 bounds, two ``[bins]`` densities."""
        w = self.linear.weight
        return {
            "perturbed": StateEntry((self.r, *w.shape), w.dtype),
            "bounds": StateEntry((4,), w.dtype),
            "density": StateEntry((self.bins,), _F64),
            "density_perturbed": StateEntry((self.bins,), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the perturbed weights, the range and the densities."""
        self.perturbed = state["perturbed"].to(self.linear.weight.device)
        self.bounds = state["bounds"]
        self.density = state["density"]
        self.density_perturbed = state["density_perturbed"]
