"""AdaSCALE (Regmi, 2025): SCALE with a percentile set per sample.

The family of :class:`~scio_recorder.ood.Scale`: a layer's activations are
scaled by ``exp(s1 / s2)`` (``s1`` their sum, ``s2`` the sum of the largest
``1 - p``), then the logits are scored by energy. AdaSCALE picks ``p`` per
sample, from how much the activations move under a small step of the input
along the gradient of the predicted logit: an input whose top activations
move little (more stable: in-distribution) gets a lower percentile. That
step needs the input's gradient, so AdaScale scores and fits with passes of
its own (a forward and a backward pass, a forward pass on the moved input,
and for variant ``"A"`` an edited pass), as ODIN does.

Follows OpenOOD's ``adascale_a`` and ``adascale_l`` postprocessors (the
paper's code), read for the formula; the hyperparameters are OpenOOD's, as
fractions where it takes percents (our ``percentiles=(0.75, 0.85)`` is its
``percentile: [75, 85]``, ``k1=0.05`` its ``k1: 5``).
"""

from __future__ import annotations

__all__ = ["AdaScale", "ada_scale", "perturb_least_sensitive"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._checks import (
    check_finite_samples,
    one_label,
    one_tensor,
    rows_not_finite,
)
from ._inputs import floating_input
from ._outputs import as_logits, energy_score
from ._passes import all_or_nothing
from ._protocol import Detector, Pass, gradient_fit_inputs, run_pass
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64
VARIANTS = ("A", "L")


def ada_scale(x: Tensor, percentiles: Tensor) -> Tensor:
    """Return ``sum(x) / sum(largest k of x)`` per sample, ``k`` set per sample.

    ``x`` is ``[B, F]``; sample ``i`` keeps its ``k_i = F - round(F p_i)``
    largest values (at least one), ``p_i`` its percentile (a fraction):
    OpenOOD's ``ada_scale``, in float64.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    >>> ada_scale(x, torch.tensor([0.5, 0.75])).tolist()  # 10 / 7, 10 / 4
    [1.4285714285714286, 2.5]

    """
    x = x.to(_F64)
    n = x.shape[1]
    ks = (n - torch.round(n * percentiles.to(device=x.device, dtype=_F64))).clamp(1, n)
    ks = ks.to(torch.int64)
    top = int(ks.max()) if ks.numel() else 1
    values = torch.topk(x, top, dim=1).values
    keep = torch.arange(top, device=x.device)[None, :] < ks[:, None]
    return x.sum(dim=1) / (values * keep).sum(dim=1)


def perturb_least_sensitive(x: Tensor, grad: Tensor, o: float, step: float) -> Tensor:
    """Move the fraction ``o`` of ``x``'s entries with the smallest ``|grad|``.

    Per sample, the ``int(o n)`` entries (of ``n``) where the gradient is
    smallest in magnitude move by ``step * sign(grad)``; the others stay
    (OpenOOD's ``perturb``, whose ``step`` is 0.5).

    Examples
    --------
    >>> import torch
    >>> x = torch.zeros(1, 4)
    >>> perturb_least_sensitive(x, torch.tensor([[-0.1, 2.0, -3.0, 4.0]]), 0.5, 1.0)
    tensor([[-1.,  1.,  0.,  0.]])

    """
    flat = grad.abs().reshape(grad.shape[0], -1)
    n = int(flat.shape[1] * o)
    index = torch.topk(flat, n, dim=1, largest=False).indices
    mask = torch.zeros_like(flat, dtype=x.dtype).scatter(1, index, 1.0)
    return x.detach() + grad.sign().to(x.dtype) * mask.reshape(x.shape) * step


class AdaScale(Detector):
    r"""AdaSCALE (Regmi, 2025): SCALE with an adaptive percentile, then energy.

    With $f$ the output of ``layer`` (flattened per sample, $F$ values),
    $x'$ the input moved along the sign of the gradient of the predicted
    logit on the fraction ``o`` of its entries where that gradient is
    smallest (by ``step``, :func:`perturb_least_sensitive`), and $f'$ the
    layer's output on $x'$:

    * $Q'(x) = \sum_{j \in \mathrm{top}_{k_1}(f)} \mathrm{relu}(f'_j) + \lambda
      \sum_{j \in \mathrm{top}_{k_2}(f)} |f_j - f'_j|$ ($\lambda$ = ``lmbda``),
      $\mathrm{top}_k(f)$ the indices of the ``int(F k)`` largest entries
      of $f$ (at least one);
    * ``fit`` keeps $Q'$ of every fit sample; $p(x) = p_{\min} + (1 -
      \mathrm{ECDF}(Q'(x))) (p_{\max} - p_{\min})$, the ECDF of the fit
      samples' $Q'$ (the fraction of them $\le Q'(x)$);
    * $s(x) = \sum \mathrm{relu}(f)$ / (the sum of its top
      $F - \mathrm{round}(F p(x))$ values) (:func:`ada_scale`);
    * variant ``"A"``: the rest of the net runs on $f e^s$ (an edit in
      flight, as :class:`Scale`), $\mathrm{score} = -\mathrm{logsumexp}(z)$,
      $z$ the logits; variant ``"L"``: $\mathrm{score} =
      -\mathrm{logsumexp}(z s^2)$, the net's own logits scaled.

    Where our reading decided, with OpenOOD's ``adascale_a`` and
    ``adascale_l`` (v1.5): the formula, the perturbation (``step`` 0.5 on
    OpenOOD's normalised images: give yours) and the defaults are OpenOOD's
    (its ``percentile: [75, 85]``, ``k1: 5``, ``k2: 1`` in percent,
    ``lmbda: 10``, ``o: 0.05``; the same for both variants; its comment:
    ``[80, 85]`` is best on a ResNet-50); OpenOOD fits on a random subset of
    5,000 validation samples, we on every fit sample given; ``int(F k)`` is
    raised to 1 where OpenOOD's would be 0 (below $1 / k$ features), and
    so is a sample's count of top values. ``layer`` is the layer whose
    output is scaled, for a classifier the input of its last ``nn.Linear``
    (the penultimate activation): on such a layer the edit in flight is
    OpenOOD's $\mathrm{fc}(f e^s)$. Scoring costs two forward passes and a
    backward pass (three forwards for ``"A"``), none shared; the fit keeps
    one number per fit sample.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its logits: ``[batch, classes]``; its first
        positional input a floating tensor, moved along the gradient).
    layer : selector
        The layer whose output is scaled (one call).
    variant : {"A", "L"}, default "A"
        Scale the activations (``"A"``) or the logits (``"L"``).
    percentiles : (float, float), default (0.75, 0.85)
        ``p_min`` and ``p_max``, fractions with ``0 <= p_min <= p_max < 1``.
    k1 : float, default 0.05
        The fraction of the largest activations whose shifted values
        ``Q'`` sums.
    k2 : float, default 0.01
        The fraction of the largest activations whose shifts ``Q'`` sums.
    lmbda : float, default 10.0
        The weight of the activations' shift in ``Q'`` (OpenOOD's name).
    o : float, default 0.05
        The fraction of input entries moved.
    step : float, default 0.5
        How far they move.
    detector : callable, optional
        ``logits -> scores``; default the energy, as the paper.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
    >>> ada = AdaScale(Recorder(net, input_size=(1, 3)), "1", variant="L")
    >>> ada.fit([torch.randn(32, 3)], input=None).bank.shape
    torch.Size([32])
    >>> ada(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    needs_fit: ClassVar[bool] = True
    own_passes = True

    def __init__(  # noqa: PLR0913 (OpenOOD's hyperparameters)
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        variant: str = "A",
        percentiles: Sequence[float] = (0.75, 0.85),
        k1: float = 0.05,
        k2: float = 0.01,
        lmbda: float = 10.0,
        o: float = 0.05,
        step: float = 0.5,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        """Resolve the layer; check the hyperparameters."""
        if variant not in VARIANTS:
            msg = f"AdaScale: variant must be one of {list(VARIANTS)}, got {variant!r}"
            raise ValueError(msg)
        low, high = _pair(percentiles)
        if not 0.0 <= low <= high < 1.0:
            msg = (
                "AdaScale: percentiles must be fractions (p_min, p_max) with "
                f"0 <= p_min <= p_max < 1, got {tuple(percentiles)!r} (OpenOOD's "
                "[75, 85] is (0.75, 0.85))"
            )
            raise ValueError(msg)
        for name, value in (("k1", k1), ("k2", k2), ("o", o)):
            if not 0.0 < value <= 1.0:
                msg = f"AdaScale: {name} must be a fraction in (0, 1], got {value!r}"
                raise ValueError(msg)
        if not (lmbda >= 0 and step > 0):
            msg = f"AdaScale: lmbda must be >= 0 and step > 0, got {lmbda!r}, {step!r}"
            raise ValueError(msg)
        super().__init__(rnet, layer=layer)
        self.label: DepthIdx = one_label(rnet, layer, "AdaScale")
        self.variant = variant
        self.percentiles = (low, high)
        self.k1, self.k2, self.lmbda = float(k1), float(k2), float(lmbda)
        self.o, self.step = float(o), float(step)
        self.detector = detector or energy_score
        self.bank = torch.zeros(0, dtype=_F64)

    # -- the passes -----------------------------------------------------------
    def outputs(self) -> tuple[DepthIdx, ...]:
        """Return the layer it reads (in passes of its own; for saved shapes)."""
        return (self.label,)

    def activations(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Return the logits, ``f`` and ``f'`` (``[B, F]``) of an input.

        A forward and a backward pass (the gradient of the predicted logits
        with respect to the input; no ``.grad`` of the net is touched), then
        a forward pass on the moved input.
        """
        x = floating_input(args, "AdaScale")
        with torch.inference_mode(mode=False), torch.enable_grad():
            leaf = x.detach().clone().requires_grad_()
            found = run_pass(
                self.rnet,
                (leaf, *args[1:]),
                kwargs,
                outputs=[self.label],
                grad=True,
                who="AdaScale",
            )
            logits = as_logits(found.logits, "AdaScale")
            f = self._record(found)
            top = logits.gather(1, logits.argmax(dim=1, keepdim=True)).sum()
            (grad,) = torch.autograd.grad(top, leaf)
        moved = perturb_least_sensitive(x, grad, self.o, self.step)
        moved_f = self._record(
            run_pass(self.rnet, (moved, *args[1:]), kwargs, outputs=[self.label])
        )
        flat = f.detach().reshape(f.shape[0], -1)
        return logits.detach(), flat, moved_f.reshape(moved_f.shape[0], -1)

    def _record(self, result: Pass) -> Tensor:
        value = result.outputs[self.label]
        return one_tensor(value, self.rnet, self.label, "AdaScale")

    def stability(self, f: Tensor, moved: Tensor) -> Tensor:
        """Return ``Q'`` per sample, float64, from ``f`` and ``f'`` (``[B, F]``)."""
        f, moved = f.to(_F64), moved.to(_F64)
        features = f.shape[1]
        k1 = max(1, math.floor(features * self.k1 + 1e-9))
        k2 = max(1, math.floor(features * self.k2 + 1e-9))
        top1 = torch.topk(f, min(k1, features), dim=1).indices
        top2 = torch.topk(f, min(k2, features), dim=1).indices
        kept = torch.relu(moved).gather(1, top1).sum(dim=1)
        shift = (f - moved).abs().gather(1, top2).sum(dim=1)
        return kept + self.lmbda * shift

    def percentile(self, stability: Tensor) -> Tensor:
        """Return ``p(x)`` from ``Q'(x)``: high where few fit samples are above."""
        bank = self.bank.to(stability.device)
        ecdf = torch.searchsorted(bank, stability, right=True).to(_F64) / len(bank)
        low, high = self.percentiles
        return low + (1.0 - ecdf) * (high - low)

    # -- fitting --------------------------------------------------------------
    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,  # noqa: ARG002 (AdaScale uses no labels)
        device: torch.device | str | None = None,
        **options: Any,
    ) -> Self:
        """Keep ``Q'`` of every fit sample (one loop over the batches).

        Its own loop, with a backward pass per batch (``collect`` records
        without gradients): ``input`` as for ``collect``; ``device`` moves
        each batch's input (the net must be there); ``target`` is not used;
        ``position_ids`` as for ``collect`` (derived from a padded batch's
        mask by default); ``collect``'s other options do not apply and are
        refused. A fit
        sample with a NaN or an infinity in the layer's output refuses the
        fit; if it fails, the detector is left as it was.
        """
        inputs = gradient_fit_inputs(
            self.rnet,
            batches,
            input=input,
            device=device,
            options=options,
            who="AdaScale",
            state="one number per fit sample",
        )
        with all_or_nothing([self]):
            found: list[Tensor] = []
            bad, seen = 0, 0
            for args, kwargs in inputs:
                _, f, moved = self.activations(args, kwargs)
                bad += int(rows_not_finite(f).sum())
                seen += int(f.shape[0])
                found.append(self.stability(f, moved).cpu())
            check_finite_samples(
                "AdaScale", self.rnet, self.label, "output", bad=bad, n=seen
            )
            if not found:
                msg = "AdaScale.fit got no samples: pass in-distribution batches."
                raise ValueError(msg)
            self.bank = torch.sort(torch.cat(found)).values
            self._fitted = True
        return self

    # -- scoring --------------------------------------------------------------
    def scales(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the scale ``s(x)`` of each sample, float64 (three passes)."""
        return self._scaled(args, kwargs)[1]

    def _scaled(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Tensor]:
        logits, f, moved = self.activations(args, kwargs)
        p = self.percentile(self.stability(f, moved))
        return logits, ada_scale(torch.relu(f), p)

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the energy of the logits of the scaled activations (or logits)."""
        logits, scale = self._scaled(args, kwargs)
        if self.variant == "L":
            return self.detector(logits * scale.to(logits).pow(2)[:, None])
        factor = torch.exp(scale)

        def edit(output: Tensor) -> Tensor:
            shape = (-1, *([1] * (output.dim() - 1)))
            return output * factor.to(output).reshape(shape)

        # a factor per row of the batch: the edit sees every row
        found = run_pass(
            self.rnet, args, kwargs, edit=(self.label, edit), finite_rows=False
        )
        out = found.logits
        return self.detector(as_logits(out, "AdaScale"))

    # -- state ----------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Return the layer and the hyperparameters."""
        return {
            "layer": list(self.label),
            "variant": self.variant,
            "percentiles": list(self.percentiles),
            "k1": self.k1,
            "k2": self.k2,
            "lmbda": self.lmbda,
            "o": self.o,
            "step": self.step,
        }

    def state(self) -> dict[str, Tensor]:
        """Return ``Q'`` of the fit samples, sorted."""
        return {"bank": self.bank}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: ``Q'`` of the fit samples ``[samples]``, float64."""
        return {"bank": StateEntry(("samples",), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the fit samples' ``Q'`` (kept sorted)."""
        self.bank = torch.sort(state["bank"]).values


def _pair(values: Sequence[float]) -> tuple[float, float]:
    items = list(values) if isinstance(values, list | tuple) else []
    if len(items) != 2 or not all(  # noqa: PLR2004 (a pair)
        isinstance(v, int | float) and not isinstance(v, bool) for v in items
    ):
        msg = (
            "AdaScale: percentiles must be a pair of fractions (p_min, p_max), "
            f"got {values!r}"
        )
        raise ValueError(msg)
    return float(items[0]), float(items[1])
