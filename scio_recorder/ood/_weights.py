r"""Detectors of the classification layer's weights: WeiPer, CORE, ORA.

All three read the input ``f`` of the classification layer ``fc`` (an
``nn.Linear``, by default the last one the net calls, as
:class:`~scio_recorder.ood.ViM` does) and use its weight ``W`` (``C x F``)
and bias ``b``:

* :class:`WeiPer` perturbs ``W`` ``r`` times and compares the histograms
  of a sample's features and of its perturbed logits with the fit data's
  (Granz, Heurich & Landgraf, NeurIPS 2024);
* :class:`CORE` splits ``f`` into its part in the span of ``W``'s rows and
  the orthogonal residual: the energy of the first, the cosine of the second
  to the class means (Yang, Kim & Bahk, 2026);
* :class:`ORA` measures the angles between ``f`` and its projections on
  the decision boundaries, seen from the mean of the class means (Demirel
  et al., NeurIPS 2025).

Fitting streams (:func:`~scio_recorder.collect.collect`): ORA's class means
in one pass shared with the other detectors; WeiPer (the bins' range, then
the densities) and CORE (the class means, then the spread of the residual
cosines) in two passes of their own, as :class:`~scio_recorder.ood.ViM`.
"""

from __future__ import annotations

__all__ = ["CORE", "ORA", "WeiPer"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional

from scio_recorder.collect import InputOf, collect

from ._checks import check_batches, check_count, last_linear
from ._geometry import ClassSums
from ._passes import all_or_nothing, check_reiterable, in_subfolder
from ._protocol import Detector, fit_pass
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

_F64 = torch.float64
_F32 = torch.float32


class _Classifier(Detector):
    """A detector of ``fc``'s input features, reading ``fc``'s weight when scoring."""

    needs_fit: ClassVar[bool] = True

    def __init__(self, rnet: Recorder, fc: Selector | None) -> None:
        super().__init__(rnet)
        self.label: DepthIdx = last_linear(rnet, fc, type(self).__name__)
        linear = rnet.table[self.label].module
        assert isinstance(linear, nn.Linear)  # noqa: S101 (last_linear checks it)
        self.linear = linear

    def inputs(self) -> tuple[DepthIdx, ...]:
        """Return the input of ``fc``."""
        return (self.label,)

    def features(self, result: Pass) -> Tensor:
        """Return ``fc``'s input, ``[batch, F]``."""
        f = result.inputs[self.label]
        return f.reshape(f.shape[0], -1)

    def weight64(self) -> Tensor:
        """Return ``W`` in float64."""
        return self.linear.weight.detach().to(_F64)

    def bias64(self) -> Tensor:
        """Return ``b`` in float64 (zeros without a bias)."""
        bias = self.linear.bias
        w = self.linear.weight
        return (
            bias.detach().to(_F64)
            if bias is not None
            else torch.zeros(w.shape[0], dtype=_F64, device=w.device)
        )

    def logits(self, f: Tensor) -> Tensor:
        """Return ``fc(f)``, in ``f``'s dtype (the net's own operation)."""
        bias = self.linear.bias
        return functional.linear(
            f,
            self.linear.weight.detach().to(f),
            None if bias is None else bias.detach().to(f),
        )

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label."""
        return {"fc": list(self.label)}


class _LabelSums(ClassSums):
    """A reducer: per-class sums and counts of ``fc``'s input, by label."""

    def __init__(self, classes: int, who: str) -> None:
        super().__init__()
        self.classes, self.who = classes, who

    def update(self, value: Any, target: Tensor | None = None) -> None:
        if target is None:
            msg = f"{self.who} needs class labels: pass `target=` to fit."
            raise ValueError(msg)
        f = value.detach().reshape(value.shape[0], -1)
        by = torch.as_tensor(target, device=f.device).reshape(-1).long()
        self.add(self.classes, f, by)

    def fresh(self) -> _LabelSums:
        return _LabelSums(self.classes, self.who)


def _fit_two(  # noqa: PLR0913 (the detector, its two passes, the data's options)
    detector: Detector,
    first: Mapping[Any, Any],
    second: Any,
    batches: Iterable[Any],
    *,
    input: Any,  # noqa: A002 (collect's name)
    target: Any,
    options: Mapping[str, Any],
) -> None:
    """Run a two-pass fit: ``first`` (a keep), then ``second(result) -> keep``.

    ``second`` gets the first pass's results by key and returns the second
    pass's keep (reducers made with what the first found), and a function
    ``finish(result)`` that sets the state; all or nothing. With
    ``spill_dir``, the passes use its subfolders ``pass-0`` and ``pass-1``.
    """
    name = type(detector).__name__
    check_batches(batches, f"{name}.fit")
    passes = [("one for its statistics", 1), ("one for their spread", 1)]
    check_reiterable(batches, passes, f"{name}.fit")
    with all_or_nothing([detector]):
        found = fit_pass(
            detector.rnet,
            first,
            batches,
            who=dict.fromkeys(first, name),
            input=input,
            target=target,
            **in_subfolder(options, "pass-0"),
        )
        keep, finish = second({key: value for key, (_, value) in found.items()})
        result = collect(
            detector.rnet,
            batches,
            keep,
            input=input,
            target=target,
            **in_subfolder(options, "pass-1"),
        )
        finish(result)
        detector._fitted = True  # noqa: SLF001 (the fit's own flag)


# ----------------------------------------------------------------- WeiPer
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


# ----------------------------------------------------------------- CORE
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
