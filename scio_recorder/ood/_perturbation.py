"""Detectors that move the net's input and read how the output moves.

Two scores of scio 1.1 (``scio.scores``), on the moved input of
:mod:`._inputs` (which the input preprocessing of the Mahalanobis family
shares):

* :class:`FeatureSqueezing` (Xu et al., NDSS 2018): squeezed inputs
  (:func:`bits_squeeze`, :func:`median_squeeze`) against the input;
* :class:`Odds` (Roth et al., ICML 2019): noisy inputs, the shifts of the
  logit differences standardised per class pair.

Their passes are their own (:attr:`~Detector.own_passes`): ``evaluate``
and ``fit_detectors`` run them beside the shared pass.
"""

from __future__ import annotations

__all__ = [
    "Z_AGGREGATIONS",
    "FeatureSqueezing",
    "Odds",
    "bits_squeeze",
    "median_squeeze",
]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder._run.batches import as_arguments, batch_getter, move_to
from scio_recorder._support.tree import map_tensors

from ._checks import (
    check_batches,
    check_count,
    check_finite_samples,
    check_number,
    checked_targets,
)
from ._classes import ClassConditional, check_at
from ._inputs import floating_input, sample_noise
from ._outputs import as_logits, output_label
from ._passes import all_or_nothing
from ._protocol import Detector, Pass, run_pass
from ._pvalues import AGGREGATIONS, combine
from ._rows import empty_batch
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64
_ROWS = 4096
"""Noisy inputs per forward pass (whole blocks of one or more samples)."""


# ----------------------------------------------------------------- squeezers
def bits_squeeze(x: Tensor, bits: int) -> Tensor:
    """Return ``x`` rounded to the centres of ``2^bits`` bins of ``[0, 1)``.

    ``(round(x 2^bits) + 1/2) / 2^bits`` (scio 1.1's formula; ``1`` goes up
    to ``1 + 2^-(bits + 1)``; :func:`torch.round` rounds half to even).

    Examples
    --------
    >>> import torch
    >>> bits_squeeze(torch.tensor([0.0, 0.3, 0.74, 1.0]), 1).tolist()
    [0.25, 0.75, 0.75, 1.25]

    """
    scale = 2.0**bits
    return ((x * scale).round() + 0.5) / scale


def _reflected(n: int, size: int, device: torch.device) -> Tensor:
    """``[n, size]`` indices of each position's window, mirrored at the edges.

    The window of ``i`` is ``i - size // 2 .. i - size // 2 + size - 1``; an
    index outside ``[0, n)`` is mirrored about the edge, the edge sample
    repeated (SciPy's ``mode="reflect"``: ``d c b a | a b c d | d c b a``).
    """
    offsets = torch.arange(size, device=device) - size // 2
    index = torch.arange(n, device=device)[:, None] + offsets[None, :]
    period = index.remainder(2 * n)
    return torch.where(period < n, period, 2 * n - 1 - period)


def median_squeeze(x: Tensor, size: int) -> Tensor:
    """Return the median of each ``size`` (x ``size``) window of each sample.

    Samples (``x[i]``) of one dim are filtered along it, of two dims over
    both, of three dims (``C x H x W``) over ``H, W`` per channel. Windows
    as SciPy's ``vectorized_filter(..., np.median, size=size)`` (scio's):
    the window of ``i`` starts at ``i - size // 2``, edges mirrored
    (``mode="reflect"``); an even count of values gives the mean of the two
    middle ones. Memory: ``size^d`` times the batch.

    Examples
    --------
    >>> import torch
    >>> median_squeeze(torch.tensor([[1.0, 2.0, 9.0, 4.0]]), 2).tolist()
    [[1.0, 1.5, 5.5, 6.5]]
    >>> median_squeeze(torch.tensor([[1.0, 2.0, 9.0, 4.0]]), 3).tolist()
    [[1.0, 2.0, 4.0, 4.0]]

    """
    dims = x.dim() - 1
    if dims not in {1, 2, 3}:
        msg = (
            f"FeatureSqueezing: median squeezing filters samples of 1, 2 or 3 "
            f"dims (C x H x W), got samples of shape {list(x.shape[1:])}."
        )
        raise ValueError(msg)
    axes = [1] if dims == 1 else [x.dim() - 2, x.dim() - 1]
    windows = x
    for k, axis in enumerate(axes):
        # Each filtered axis becomes (position, window); windows go last.
        index = _reflected(x.shape[axis], size, x.device)
        at = axis + k  # earlier axes each added a window dim after them
        windows = windows.index_select(at, index.reshape(-1))
        shape = list(windows.shape)
        windows = windows.reshape(*shape[:at], x.shape[axis], size, *shape[at + 1 :])
    # Move every window dim to the end, flattened.
    window_dims = [axis + k + 1 for k, axis in enumerate(axes)]
    keep = [d for d in range(windows.dim()) if d not in window_dims]
    values = windows.permute(*keep, *window_dims).reshape(*x.shape, -1)
    ordered = values.sort(dim=-1).values
    count = ordered.shape[-1]
    if count % 2:
        return ordered[..., count // 2].contiguous()
    low, high = ordered[..., count // 2 - 1], ordered[..., count // 2]
    return ((low + high) / 2).contiguous()


def _parse_squeezer(spec: Any) -> tuple[str, Callable[[Tensor], Tensor]]:
    """Return a squeezer's name and function: scio's ``"bits:n"``, ``"median:s"``."""
    if callable(spec):
        return getattr(spec, "__name__", repr(spec)), spec
    if isinstance(spec, str):
        kind, _, value = spec.partition(":")
        try:
            n = int(value.strip())
        except ValueError:
            n = None
        if kind.strip() == "bits" and n is not None:
            if not 0 < n < 32:  # noqa: PLR2004 (a float32 mantissa's bits)
                msg = f"FeatureSqueezing: 'bits:n' needs 0 < n < 32, got {spec!r}"
                raise ValueError(msg)
            return spec, lambda x: bits_squeeze(x, n)
        if kind.strip() == "median" and n is not None:
            if n < 1:
                msg = f"FeatureSqueezing: 'median:s' needs a size s >= 1, got {spec!r}"
                raise ValueError(msg)
            return spec, lambda x: median_squeeze(x, n)
    msg = (
        f"FeatureSqueezing: squeezer {spec!r} is not 'bits:n' (n-bit depth), "
        "'median:s' (median filter of size s) or a callable `x -> squeezed x`."
    )
    raise ValueError(msg)


def _check_aggregation(who: str, aggregation: Any) -> str | float:
    if isinstance(aggregation, str) and aggregation in AGGREGATIONS:
        return aggregation
    if (
        isinstance(aggregation, int | float)
        and not isinstance(aggregation, bool)
        and aggregation > 0
    ):
        return float(aggregation)
    msg = (
        f"{who}: aggregation must be one of {list(AGGREGATIONS)} or the order "
        f"p > 0 of a vector norm, got {aggregation!r}"
    )
    raise ValueError(msg)


class FeatureSqueezing(Detector):
    r"""Feature squeezing (Xu et al., NDSS 2018), as scio 1.1 scores it.

    Each squeezer $s$ maps the input to a coarser one (fewer bits per
    value, a median filter); with $p(x) = \mathrm{softmax}(f(x))$, the distance of
    each squeezer is $d_s(x) = \|p(x) - p(s(x))\|$ (the L1 norm by
    default, the paper's), and ``score(x)`` combines them over the
    squeezers (their maximum by default, the paper's joint detector): an
    input the net reads differently once squeezed is more likely OoD (the
    paper's target: adversarial examples). No fitting; one pass of the
    input and one per squeezer, of their own.

    scio 1.1's ``FeatureSqueezing`` conformity is minus the score (the same
    in every class). The squeezers follow scio's: ``"bits:n"`` is
    $(\mathrm{round}(x 2^n) + 1/2) / 2^n$ (:func:`bits_squeeze`, for inputs in
    $[0, 1]$), ``"median:s"`` a median filter of size $s \times s$
    over each sample (per channel for $C \times H \times W$; :func:`median_squeeze`,
    SciPy's windows and edges). The input squeezed is the net's first
    positional argument, a floating tensor (:func:`floating_input`).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier).
    squeezers : str, callable or sequence of them
        ``"bits:n"`` (``0 < n < 32``), ``"median:s"`` (``s >= 1``), or
        ``x -> squeezed x`` keeping the shape.
    dist_norm : float, default 1.0
        The order of the norm of ``p(x) - p(s(x))`` (scio's name).
    aggregation : str or float, default "max"
        How the squeezers' distances combine: a name of
        :data:`~scio_recorder.ood._pvalues.AGGREGATIONS` (scio's
        ``get_aggregator``: ``"fisher"`` is the sum of the logs, ...), or a
        number ``p``, their ``p``-norm.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    >>> rnet = Recorder(net, input_size=(1, 1, 4, 4))
    >>> squeeze = FeatureSqueezing(rnet, squeezers=["bits:3", "median:2"])
    >>> squeeze
    FeatureSqueezing(squeezers=['bits:3', 'median:2'], dist_norm=1.0, aggregation='max')
    >>> scores = squeeze(torch.rand(5, 1, 4, 4))
    >>> scores.shape, bool((scores >= 0).all())
    (torch.Size([5]), True)

    """

    own_passes = True

    def __init__(
        self,
        rnet: Recorder,
        *,
        squeezers: Any,
        dist_norm: float = 1.0,
        aggregation: str | float = "max",
    ) -> None:
        """Parse the squeezers; check the norm and the aggregation."""
        specs = (
            [squeezers]
            if isinstance(squeezers, str) or callable(squeezers)
            else list(squeezers)
        )
        if not specs:
            msg = "FeatureSqueezing: give at least one squeezer, e.g. ['bits:3']."
            raise ValueError(msg)
        parsed = [_parse_squeezer(spec) for spec in specs]
        check_number("FeatureSqueezing", "dist_norm", dist_norm, zero=False)
        self.aggregation = _check_aggregation("FeatureSqueezing", aggregation)
        super().__init__(rnet)
        self.names = [name for name, _ in parsed]
        self.squeezers = [fn for _, fn in parsed]
        self.dist_norm = float(dist_norm)

    def distances(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        r"""Return $\|p(x) - p(s(x))\|$ for each squeezer, ``[batch, squeezers]``."""
        x = floating_input(args, "FeatureSqueezing")
        rest = args[1:]
        clean = run_pass(self.rnet, args, kwargs).logits
        p = torch.softmax(as_logits(clean, "FeatureSqueezing"), dim=1)
        columns = []
        for name, squeeze in zip(self.names, self.squeezers, strict=True):
            moved = _squeezed(squeeze, name, x)
            squeezed = run_pass(self.rnet, (moved, *rest), kwargs).logits
            q = torch.softmax(as_logits(squeezed, "FeatureSqueezing"), dim=1)
            columns.append(torch.linalg.vector_norm(p - q, ord=self.dist_norm, dim=1))
        return torch.stack(columns, dim=1)

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Combine the squeezers' distances (higher: more OoD)."""
        distances = self.distances(args, kwargs)
        if isinstance(self.aggregation, float):
            norm: Tensor = torch.linalg.vector_norm(
                distances, ord=self.aggregation, dim=1
            )
            return norm
        return combine(distances, self.aggregation, dim=1)

    def config(self) -> dict[str, Any]:
        """Return the squeezers (names), the norm and the aggregation."""
        return {
            "squeezers": self.names,
            "dist_norm": self.dist_norm,
            "aggregation": self.aggregation,
        }


def _squeezed(squeeze: Callable[[Tensor], Any], name: str, x: Tensor) -> Tensor:
    """Return ``squeeze(x)``, checked where it is made: the input's shape and dtype.

    A squeezer returning fewer rows was broadcast by ``p(x) - p(s(x))``,
    another dtype or ``None`` failed inside the net; the message names the
    squeezer, as an edit's check names the edit.
    """
    out = squeeze(x)
    want = f"a tensor of shape {list(x.shape)} and dtype {x.dtype}"
    if not isinstance(out, Tensor):
        msg = (
            f"FeatureSqueezing: squeezer {name!r} returned a "
            f"{type(out).__name__}, where the input is {want}. A squeezer "
            "returns the squeezed input: a tensor of its shape and dtype."
        )
        raise TypeError(msg)
    if out.shape != x.shape or out.dtype != x.dtype:
        msg = (
            f"FeatureSqueezing: squeezer {name!r} returned a tensor of shape "
            f"{list(out.shape)} and dtype {out.dtype}, where the input is "
            f"{want}. A squeezer returns the squeezed input: a tensor of its "
            "shape and dtype."
        )
        raise ValueError(msg)
    return out


# ----------------------------------------------------------------- Odds
Z_AGGREGATIONS = ("sum", "detect", "rectify")
"""How :class:`Odds` combines a class's z-scores over the other classes."""


class Odds(ClassConditional):
    r"""The odds are odd (Roth, Kilcher & Hofmann, ICML 2019), as scio 1.1 scores it.

    With $f_{y,z}(x) = f_z(x) - f_y(x)$ the preference of class $z$ over
    $y$ and $x + n$ the input with uniform noise $n$ in $[-\epsilon,
    \epsilon]$ per value ($\epsilon$ = ``epsilon``), the noise-induced shift
    $g_{y,z}(x) = \mathbb{E}_n[f_{y,z}(x + n)] - f_{y,z}(x)$ (``noise_samples``
    draws). ``fit`` (labelled in-distribution data, ``target=`` needed)
    takes, for each class $y$, the mean $\mu_{y,z}$ and the standard
    deviation $\sigma_{y,z}$ of the shifts $f_{y,z}(x + n) - f_{y,z}(x)$ over
    its fit samples and their draws. A class's score is its z-scores
    $(g_{y,z}(x) - \mu_{y,z}) / \sigma_{y,z}$ combined over the other classes
    $z$ (``z_aggregation``:
    their sum by default, scio's; ``"detect"`` the largest, the paper's
    test for a sample predicted $y$; ``"rectify"`` the smallest):
    ``score_classes(x)`` ``[batch, classes]``, higher = the logits move under
    noise as they do not for that class's data. ``score(x)`` reads it at
    the predicted class (the paper's and scio's reading, the default), or
    at the lowest (``at="closest"``).

    Randomness: the noise of a sample depends only on ``seed`` and its
    values (:func:`sample_noise`), so an input scores the same in any batch
    and on any device (up to the rounding of the net's passes), fit and
    score alike. Cost: ``noise_samples`` forward passes per sample, to fit
    and to score (``noise_samples x batch`` noisy inputs, up to 4096 a
    pass); the passes are Odds' own.

    scio 1.1's ``Odds`` conformity is ``-score_classes(x)`` for its own
    noise draws (a generator seeded once at ``fit``, drawn in batch order),
    but with **one difference of definition**: scio divides by the
    variance $\sigma^2$, not by $\sigma$ as the paper's z-scores; ``scale=
    "variance"`` reproduces it. A class without fit samples scores ``+inf``
    (scio: conformity ``-inf``), as does a z-score that is ``0 / 0``.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier); its first positional input is moved
        (a floating tensor, :func:`floating_input`).
    epsilon : float
        The noise's scale (``L-infinity``), on the input's scale; ``> 0``.
    noise_samples : int, default 256
        Draws per sample (the paper's and scio's).
    seed : int, default 0
        The noise's seed.
    z_aggregation : {"sum", "detect", "rectify"}
        How a class's z-scores combine over the other classes (scio's name).
    scale : {"std", "variance"}
        The paper's z-scores, or scio 1.1's (divided by the variance).
    at : {"predicted", "closest"}
        Which class's score is the sample's.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> rnet = Recorder(net, input_size=(1, 4))
    >>> odds = Odds(rnet, epsilon=0.1, noise_samples=16)
    >>> odds.fit([(torch.randn(30, 4), torch.arange(30) % 3)], target=1)
    Odds(epsilon=0.1, noise_samples=16, seed=0, z_aggregation='sum', scale='std', fitted)
    >>> x = torch.randn(4, 4)
    >>> odds.score_classes(x).shape, torch.equal(odds(x)[:2], odds(x[:2]))
    (torch.Size([4, 3]), True)

    """  # noqa: E501 (doctest output)

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True
    own_passes = True
    SCALES: ClassVar[tuple[str, ...]] = ("std", "variance")

    def __init__(  # noqa: PLR0913 (scio's hyperparameters and the reading)
        self,
        rnet: Recorder,
        *,
        epsilon: float,
        noise_samples: int = 256,
        seed: int = 0,
        z_aggregation: str = "sum",
        scale: str = "std",
        at: str = "predicted",
    ) -> None:
        """Check the hyperparameters."""
        self.at = check_at("Odds", at)
        # no noise, no odds: every shift's spread would be 0 (z-scores x / 0)
        epsilon = check_number("Odds", "epsilon", epsilon, zero=False)
        check_count("Odds", "noise_samples", noise_samples, low=1)
        check_count("Odds", "seed", seed, low=0)
        if z_aggregation not in Z_AGGREGATIONS:
            msg = (
                f"Odds: z_aggregation must be one of {list(Z_AGGREGATIONS)}, got "
                f"{z_aggregation!r}"
            )
            raise ValueError(msg)
        if scale not in self.SCALES:
            msg = f"Odds: scale must be one of {list(self.SCALES)}, got {scale!r}"
            raise ValueError(msg)
        super().__init__(rnet)
        self.epsilon = float(epsilon)
        self.noise_samples, self.seed = noise_samples, seed
        self.z_aggregation, self.scale = z_aggregation, scale
        self.label: DepthIdx = output_label(rnet)
        self.counts = torch.zeros(0, dtype=_I64)
        self.mean = torch.zeros(0, 0, dtype=_F64)
        self.std = torch.zeros(0, 0, dtype=_F64)

    # -- the noisy passes --------------------------------------------------
    def noisy_logits(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Iterable[tuple[int, int, Tensor]]:
        """Yield ``(sample, first draw, logits)`` of the noisy inputs, a pass at a time.

        ``logits`` ``[draws, C]``: those of the sample's draws ``first ..``
        (:func:`sample_noise`); the net's other tensor arguments with the
        batch's rows are repeated for each draw.
        """
        x = floating_input(args, "Odds")
        n, draws = x.shape[0], self.noise_samples
        block = min(draws, _ROWS)
        pieces = [(i, start) for i in range(n) for start in range(0, draws, block)]
        per_pass = max(1, _ROWS // block)
        for first in range(0, len(pieces), per_pass):
            group = pieces[first : first + per_pass]
            sizes = [min(block, draws - start) for _, start in group]
            rows = torch.tensor([i for i, _ in group], device=x.device)
            rows = rows.repeat_interleave(torch.tensor(sizes, device=x.device))
            noisy = torch.cat(
                [
                    x[i]
                    + self.epsilon * sample_noise(x[i], size, seed=self.seed, start=s)
                    for (i, s), size in zip(group, sizes, strict=True)
                ]
            )
            rest, options = _rows_of((args[1:], dict(kwargs)), n, rows)
            logits = as_logits(
                run_pass(self.rnet, (noisy, *rest), options).logits, "Odds"
            )
            at = 0
            for (i, s), size in zip(group, sizes, strict=True):
                yield i, s, logits[at : at + size]
                at += size

    def shifts(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass]:
        r"""Return the shifts $\mathbb{E}_n[f(x + n)] - f(x)$ and the pass of $x$.

        The shifts are ``[batch, C]``.
        """
        result = run_pass(self.rnet, args, kwargs)
        logits = as_logits(result.logits, "Odds")
        total = torch.zeros(logits.shape, dtype=_F64, device=logits.device)
        for i, _, noisy in self.noisy_logits(args, kwargs):
            total[i] += noisy.to(_F64).sum(dim=0)
        return total / self.noise_samples - logits.to(_F64), result

    # -- fitting -----------------------------------------------------------
    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,
        device: torch.device | str | None = None,
        **options: Any,
    ) -> Self:
        """Take each class's mean and deviation of the shifts (one pass, its own loop).

        ``input``, ``target`` as for ``collect``; ``device`` moves each
        batch's input (the net must be there). ``collect``'s other options
        do not apply (the state is ``C x C`` per statistic) and are refused.
        Labels are checked as for every detector, and a fit sample whose
        input or logits are not finite refuses the fit. If the fit fails,
        the detector is left as it was.
        """
        if options:
            msg = (
                f"Odds.fit runs its own loop of noisy passes and takes no "
                f"{', '.join(sorted(options))}; its state is C x C, whatever "
                "the data. Drop them (fit Odds apart from fit_detectors when "
                "sharing a spill_dir)."
            )
            raise TypeError(msg)
        check_batches(batches, "Odds.fit")
        if target is None:
            msg = "Odds.fit needs class labels: pass `target=` (e.g. `target=1`)."
            raise ValueError(msg)
        take = batch_getter(input, "input")
        labels_of = checked_targets(target, input, [self])
        where = None if device is None else torch.device(device)
        with all_or_nothing([self]):
            moments = _ClassMoments()
            bad = seen = 0
            for batch in batches:
                args, kwargs = as_arguments(take(batch), spread=callable(input))
                labels = torch.as_tensor(labels_of(batch)).reshape(-1)
                if empty_batch(args, kwargs) is not None:
                    continue
                if where is not None:
                    args, kwargs = move_to(args, where), move_to(kwargs, where)
                bad += self._fit_batch(moments, args, kwargs, labels)
                seen += len(labels)
            check_finite_samples(
                "Odds", self.rnet, self.label, "output", bad=bad, n=seen
            )
            self.counts, self.mean, variance = moments.result()
            self.std = variance.sqrt()
            self._fitted = True
        return self

    def _fit_batch(
        self,
        moments: _ClassMoments,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        labels: Tensor,
    ) -> int:
        """Add the batch's shifts to the moments; return its non-finite samples.

        A sample whose input or logits are not finite is counted, not used
        (the fit is refused after the pass, naming the count).
        """
        x = floating_input(args, "Odds")
        logits = as_logits(run_pass(self.rnet, args, kwargs).logits, "Odds")
        bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)
        bad |= ~torch.isfinite(logits).all(dim=1)
        if bool(bad.any()):
            keep = torch.nonzero(~bad).reshape(-1)
            args = _rows_of(args, x.shape[0], keep)
            kwargs = _rows_of(dict(kwargs), x.shape[0], keep)
            logits, labels = logits[keep], labels[keep.to(labels.device)]
        y = labels.to(logits.device)
        clean = (logits - logits.gather(1, y[:, None])).to(_F64)
        for i, _, noisy in self.noisy_logits(args, kwargs):
            c = int(y[i])
            shift = (noisy - noisy[:, c : c + 1]).to(_F64) - clean[i]
            moments.add(c, shift, logits.shape[1])
        return int(bad.sum())

    # -- scoring -----------------------------------------------------------
    def class_scores_inputs(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass]:
        """Return each class's z-scores combined, ``[batch, C]``; the pass of ``x``."""
        shift, result = self.shifts(args, kwargs)
        classes = shift.shape[1]
        if classes != self.mean.shape[0]:
            msg = (
                f"Odds: the net gives {classes} logits, but the detector was "
                f"fitted on {self.mean.shape[0]}: fit it again on this net."
            )
            raise ValueError(msg)
        # g[b, y, z] = shift_z - shift_y: the preference of z over y moved.
        g = shift[:, None, :] - shift[:, :, None]
        mean, std = self.mean.to(g.device), self.std.to(g.device)
        spread = std.square() if self.scale == "variance" else std
        z = (g - mean) / spread
        diagonal = torch.eye(classes, dtype=torch.bool, device=g.device)
        if self.z_aggregation == "sum":
            scores = z.masked_fill(diagonal, 0).sum(dim=2)
        elif self.z_aggregation == "detect":
            scores = z.masked_fill(diagonal, -math.inf).amax(dim=2)
        else:
            scores = z.masked_fill(diagonal, math.inf).amin(dim=2)
        unseen = (self.counts < 2).to(g.device)  # noqa: PLR2004 (a deviation needs two)
        scores = scores.masked_fill(unseen[None, :], math.inf)
        return scores.masked_fill(scores.isnan(), math.inf), result

    def config(self) -> dict[str, Any]:
        """Return the hyperparameters (``at`` reads the state, it is not part of it)."""
        return {
            "epsilon": self.epsilon,
            "noise_samples": self.noise_samples,
            "seed": self.seed,
            "z_aggregation": self.z_aggregation,
            "scale": self.scale,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the per-class counts, means and deviations of the shifts."""
        return {"counts": self.counts, "mean": self.mean, "std": self.std}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: counts ``[C]``, means and deviations ``[C, C]``."""
        return {
            "counts": StateEntry(("logits",), _I64),
            "mean": StateEntry(("logits", "logits"), _F64),
            "std": StateEntry(("logits", "logits"), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the counts, means and deviations."""
        self.counts, self.mean, self.std = state["counts"], state["mean"], state["std"]


def _rows_of(value: Any, n: int, rows: Tensor) -> Any:
    """Take ``rows`` of every tensor in ``value`` with the batch's ``n`` rows."""

    def take(t: Tensor) -> Tensor:
        if t.dim() and t.shape[0] == n:
            return t.index_select(0, rows.to(t.device))
        return t

    return map_tensors(take, value)


class _ClassMoments:
    """Per-class count, mean and sum of squared deviations of rows (float64, CPU).

    Rows of class ``c`` are merged a block at a time (Chan et al.'s update),
    so the variance does not lose digits to a large mean.
    """

    def __init__(self) -> None:
        self.n: dict[int, int] = {}
        self.mean: dict[int, Tensor] = {}
        self.m2: dict[int, Tensor] = {}
        self.width = 0

    def add(self, c: int, rows: Tensor, width: int) -> None:
        """Merge ``rows`` ``[m, C]`` into class ``c``'s moments."""
        self.width = width
        rows = rows.to("cpu", _F64)
        m = rows.shape[0]
        mean = rows.mean(dim=0)
        m2 = (rows - mean).square().sum(dim=0)
        n = self.n.get(c, 0)
        if n == 0:
            self.n[c], self.mean[c], self.m2[c] = m, mean, m2
            return
        total = n + m
        delta = mean - self.mean[c]
        self.mean[c] = self.mean[c] + delta * (m / total)
        self.m2[c] = self.m2[c] + m2 + delta.square() * (n * m / total)
        self.n[c] = total

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        """Return counts ``[C]``, means and unbiased variances ``[C, C]``.

        ``C`` is the logits' width; a class without rows has count 0 and
        zero statistics (it scores ``+inf``).
        """
        if not self.n:
            msg = "Odds.fit got no samples: pass labelled in-distribution batches."
            raise ValueError(msg)
        width = max(self.width, max(self.n) + 1)
        counts = torch.zeros(width, dtype=_I64)
        mean = torch.zeros(width, width, dtype=_F64)
        variance = torch.zeros(width, width, dtype=_F64)
        for c, n in self.n.items():
            counts[c] = n
            mean[c] = self.mean[c]
            if n > 1:
                variance[c] = self.m2[c] / (n - 1)
        return counts, mean, variance
