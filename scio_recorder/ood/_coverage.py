"""Neuron activation coverage: NAC (Liu et al., ICLR 2024), a gradient detector.

A neuron's state is ``sigmoid(alpha * z * dKL(u || softmax(logits)) / dz)``
(``z`` the neuron's output, pooled per channel for a map): it needs a
backward pass per batch, so NAC is scored by its own pass with autograd
(:meth:`~scio_recorder.ood.Detector.score_inputs`; the shared passes of the
other detectors run under ``torch.no_grad()``), and fitted by its own loop
over the batches (``collect`` records detached tensors). The fitted state is
a histogram of states per neuron: bounded memory, whatever the data.
"""

from __future__ import annotations

__all__ = ["NAC", "nac_edges"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._checks import check_finite_samples
from ._layers import MultiLayer, check_choice, pool_features, pooled_size
from ._passes import all_or_nothing
from ._protocol import gradient_fit_inputs, run_pass
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from typing_extensions import Self

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64
_MIN_BINS = 4  # two edges on each side of 0.5


def nac_edges(m_bins: int) -> Tensor:
    """Return OpenOOD's NAC bin edges on ``[0, 1]`` for ``M = m_bins``, float64.

    OpenOOD's ``logspace(1e3, M)``: ``M // 2`` points ``log_1000`` of
    ``linspace(1, sqrt(1000))`` on ``[0, 0.5]`` (dense near 0), mirrored on
    ``[0.5, 1]`` (dense near 1), the last edge moved to 1.01, and 1.2
    appended: ``2 (M // 2)`` edges, so ``2 (M // 2) - 1`` bins (49 for
    ``M = 50``); bin ``i`` is ``[edge_i, edge_{i+1})``.

    Examples
    --------
    >>> edges = nac_edges(50)
    >>> len(edges), edges[0].item(), edges[24].item(), edges[-1].item()
    (50, 0.0, 0.5, 1.2)

    """
    num = m_bins // 2
    x = torch.linspace(1.0, math.sqrt(1e3), num, dtype=_F64)
    low = torch.log(x) / math.log(1e3)
    edges = torch.cat([low[:-1], (1.0 - low).flip(0)])
    edges[-1] += 1e-2
    return torch.cat([edges, torch.tensor([1.2], dtype=_F64)])


def _per_layer(who: str, name: str, value: Any, n: int, kind: type) -> list[Any]:
    values = list(value) if isinstance(value, list | tuple) else [value] * n
    if len(values) != n:
        msg = (
            f"{who}: {name} has {len(values)} values for {n} layers; give one "
            "value, or one per layer."
        )
        raise ValueError(msg)
    return [kind(v) for v in values]


def _with_grad(value: Any) -> Any:
    """Floating-point input tensors made leaves that require grad.

    So the layers' outputs are in the graph even where the net's
    parameters are frozen (``requires_grad=False``).
    """
    if isinstance(value, Tensor) and value.is_floating_point():
        return value if value.requires_grad else value.detach().requires_grad_()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_with_grad(v) for v in value)
    if isinstance(value, list):
        return [_with_grad(v) for v in value]
    if isinstance(value, dict):
        return {k: _with_grad(v) for k, v in value.items()}
    return value


class NAC(MultiLayer):
    r"""Neuron activation coverage, NAC-UE (Liu et al., ICLR 2024).

    For each layer $l$ of ``layers`` and neuron $n$ (a channel of a map,
    whose output and gradient are pooled over ``H, W`` separately; a unit
    of a token sequence, pooled over the tokens as ``token=`` says): the
    state $s = \mathrm{sigmoid}(\alpha_l z_n g_n)$, $g = \partial / \partial z
    \sum_{\mathrm{samples}} \mathrm{KL}(u \,\|\, \mathrm{softmax}(\mathrm{logits}))$
    (one backward per batch; the samples'
    gradients do not mix in an ``eval()`` net). ``fit`` counts, per neuron,
    the fit samples whose state falls in each bin of :func:`nac_edges`
    (OpenOOD's bins). The coverage of a bin is $\min(\mathrm{count} / o_\star,
    1)$ ($o_\star$ = ``o_star``); $\mathrm{score}(x) = -\mathrm{mean}_l
    \mathrm{mean}_n \mathrm{coverage}_{ln}(\text{bin of } s_{ln}(x))$ (higher = more
    OoD; OpenOOD's NAC-UE averages the layers too).

    **OpenOOD's NAC**, the authors' code (its ``nac`` postprocessor,
    ``KMNC`` coverage and ``StatePooling``), is this formula with
    ``pool="sum"``: it *sums* a map's output and gradient over ``H, W``
    (its ``avg_pooling`` does, "since the denominator can be scaled by the
    sigmoid"), sums a ViT block's tokens and takes the first token of the
    final layer norm (``token=["sum", ..., "cls"]``, one per layer), and
    leaves ``[B, F]`` features as they are; ``m_bins`` is its ``M``,
    ``alpha`` its ``sig_alpha``, ``o_star`` its ``O``, with its per-layer
    values (e.g. ``sig_alpha`` 0.001 for a ResNet's ``layer2``, 100 for
    ``avgpool``). The tests check our scores against that formula written
    out by hand, on a CNN and a ViT. The default ``pool="mean"`` averages
    instead, so that one ``alpha`` suits layers of any size: it is
    OpenOOD's NAC with ``sig_alpha`` $= \alpha / (H W)^2$ (the tests check
    that too). Every fit sample counts (OpenOOD's default state function;
    the paper's variant keeping only correctly classified samples: fit on
    those batches). The defaults of ``m_bins``, ``alpha``, ``o_star`` are
    pytorch-ood 0.4's ``NACUE``; pytorch-ood's formula differs by design:
    it pools the product $z g$ (not $z$ and $g$ apart), uses its own
    geometric bins (``m_bins`` bins, not ``2 (m_bins // 2) - 1``) and sums
    the layers (we average them); on one un-pooled layer the states agree
    and only the bins differ.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (its outputs' logits: ``[batch, classes]``).
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    m_bins : int or list of int, default 50
        OpenOOD's ``M`` (>= 4): ``2 (M // 2) - 1`` bins; one value, or one
        per layer.
    alpha : float or list of float, default 100.0
        The sigmoid's steepness; one value, or one per layer.
    o_star : int or list of int, default 50
        The count of a fully covered bin (>= 1); one value, or one per layer.
    pool : {"mean", "sum", None}, default "mean"
        How a map's output and gradient become one value per channel:
        averaged or summed (OpenOOD's) over ``H, W``; ``None``: every entry
        is a neuron.
    token : {"cls", "mean", "sum", "last"} or list of them, default "cls"
        How a ``[B, T, D]`` sequence's output and gradient become one value
        per unit: the first real token's, the mean or the sum over the real
        tokens, or the last real token's (the padding ``mask`` kept, see
        :func:`~._layers.pool_features`); one value, or one per layer.
    mask
        The net's argument holding the padding mask, as for
        :class:`MahalanobisEnsemble`.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(3), input_size=(1, 3, 32, 32))
    >>> nac = NAC(rnet, ["features.1", "classifier.2"], o_star=2)
    >>> nac.fit([torch.randn(8, 3, 32, 32)], input=None).counts[0].shape
    torch.Size([8, 49])
    >>> nac(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2])

    """

    needs_fit: ClassVar[bool] = True
    own_passes = True
    POOLS: ClassVar[tuple[str | None, ...]] = ("mean", "sum", None)
    TOKENS: ClassVar[tuple[str, ...]] = ("cls", "mean", "sum", "last")

    def __init__(  # noqa: PLR0913 (pytorch-ood's options and the pooling's)
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        m_bins: int | Sequence[int] = 50,
        alpha: float | Sequence[float] = 100.0,
        o_star: int | Sequence[int] = 50,
        pool: str | None = "mean",
        token: str | Sequence[str] = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
    ) -> None:
        """Resolve the layers; check the per-layer hyperparameters."""
        tokens = [token] if isinstance(token, str) else list(token)
        if "each" in tokens:
            msg = (
                "NAC: token='each' has no per-token reading: NAC's states are the "
                "gradients of the KL divergence of the net's one output "
                "distribution per sample, and its coverage is of those samples. "
                "For a score per token use Mahalanobis, MahalanobisEnsemble, DkNN "
                "or JTLA with token='each', or Surprisal."
            )
            raise ValueError(msg)
        super().__init__(rnet, layers, pool=pool, token=tokens[0], mask=mask)
        n = len(self.labels)
        self.tokens = _per_layer("NAC", "token", token, n, str)
        for each in self.tokens:
            check_choice("NAC", "token", each, self.TOKENS)
        self.token_given = token if isinstance(token, str) else self.tokens
        self.m_bins = _per_layer("NAC", "m_bins", m_bins, n, int)
        self.alpha = _per_layer("NAC", "alpha", alpha, n, float)
        self.o_star = _per_layer("NAC", "o_star", o_star, n, int)
        if any(m < _MIN_BINS for m in self.m_bins):
            msg = f"NAC: m_bins must be ints >= {_MIN_BINS}, got {self.m_bins}"
            raise ValueError(msg)
        if any(o < 1 for o in self.o_star):
            msg = f"NAC: o_star must be ints >= 1, got {self.o_star}"
            raise ValueError(msg)
        self.edges = [nac_edges(m) for m in self.m_bins]
        self.counts: list[Tensor] = []

    # -- the states -----------------------------------------------------------
    def states(self, *args: Any, **kwargs: Any) -> list[Tensor]:
        """Return each layer's neuron states ``[batch, N_l]`` (float64) for an input.

        One forward pass recording ``layers`` and one backward pass of the
        summed KL to the uniform distribution, under ``torch.enable_grad()``;
        no ``.grad`` of the net is touched.
        """
        with torch.enable_grad():
            found = run_pass(
                self.rnet,
                _with_grad(args),
                _with_grad(kwargs),
                outputs=self.labels,
                grad=True,
                who="NAC",
            )
            logits = found.logits
            outputs = [found.outputs[label] for label in self.labels]
            for label, z in zip(self.labels, outputs, strict=True):
                if not isinstance(z, Tensor) or not z.requires_grad:
                    msg = (
                        f"NAC: the output of layer "
                        f"{self.rnet.table[label].describe()} is not in the "
                        "autograd graph (no gradient reaches it): choose a "
                        "layer the logits depend on, with floating-point inputs "
                        "or parameters that require grad."
                    )
                    raise ValueError(msg)
            if logits.dim() != 2:  # noqa: PLR2004 (a batch of logit vectors)
                msg = (
                    "NAC: the net's logits must be [batch, classes], got "
                    f"{list(logits.shape)}"
                )
                raise ValueError(msg)
            kl = -torch.log_softmax(logits, dim=1).mean(dim=1).sum()
            grads = torch.autograd.grad(kl, outputs)
        mask = self.current_mask()
        return [
            torch.sigmoid(
                alpha
                * pool_features(z, self.pool, token, mask)
                * pool_features(g, self.pool, token, mask)
            )
            for z, g, alpha, token in zip(
                outputs, grads, self.alpha, self.tokens, strict=True
            )
        ]

    def bins(self, states: Sequence[Tensor]) -> list[Tensor]:
        """Return each state's bin index, ``[batch, N_l]`` int64."""
        return [
            (torch.bucketize(s, e.to(s.device), right=True) - 1).clamp(0, len(e) - 2)
            for s, e in zip(states, self.edges, strict=True)
        ]

    # -- fitting --------------------------------------------------------------
    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,  # noqa: ARG002 (NAC uses no labels)
        device: torch.device | str | None = None,
        **options: Any,
    ) -> Self:
        """Count the neuron states of the batches in each bin (one pass).

        Its own loop, with a backward pass per batch (``collect`` records
        without gradients): ``input`` as for ``collect``; ``device`` moves
        each batch's input (the net must be there); ``target`` is not used;
        ``position_ids`` as for ``collect`` (derived from a padded batch's
        mask by default); ``collect``'s other options (``spill_dir``,
        ``memory_budget``, ...) do not apply (the histograms are small) and
        are refused. If the fit
        fails (e.g. a sample with non-finite states), the detector is left
        as it was.
        """
        found = gradient_fit_inputs(
            self.rnet,
            batches,
            input=input,
            device=device,
            options=options,
            who="NAC",
            state="a histogram per neuron, whatever the data",
        )
        with all_or_nothing([self]):
            counts: list[Tensor] | None = None
            bad = [torch.zeros((), dtype=torch.int64) for _ in self.labels]
            seen = 0
            for args, kwargs in found:
                states = self.states(*args, **kwargs)
                for i, s in enumerate(states):
                    rows = (~torch.isfinite(s)).any(dim=1).sum()
                    bad[i] = bad[i].to(rows.device) + rows
                if counts is None:
                    counts = [
                        torch.zeros(s.shape[1], len(e) - 1, dtype=torch.int64)
                        for s, e in zip(states, self.edges, strict=True)
                    ]
                for i, b in enumerate(self.bins(states)):
                    width = counts[i].shape[1]
                    flat = b + width * torch.arange(b.shape[1], device=b.device)
                    hist = torch.bincount(flat.reshape(-1), minlength=counts[i].numel())
                    counts[i] = counts[i] + hist.cpu().reshape(counts[i].shape)
                seen += int(states[0].shape[0])
            if counts is None or seen == 0:
                msg = "NAC.fit got no samples: pass in-distribution batches."
                raise ValueError(msg)
            for label, count in zip(self.labels, bad, strict=True):
                check_finite_samples(
                    "NAC", self.rnet, label, "output", bad=int(count), n=seen
                )
            self.counts = counts
            self._fitted = True
        return self

    # -- scoring --------------------------------------------------------------
    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return minus the mean coverage of the neurons' states, ``[batch]``."""
        states = self.states(*args, **kwargs)
        total = torch.zeros(states[0].shape[0], dtype=_F64, device=states[0].device)
        for s in states:  # a NaN state falls in no bin: its score is NaN
            total = total.masked_fill(~torch.isfinite(s).all(dim=1), float("nan"))
        for i, b in enumerate(self.bins(states)):
            counts = self.counts[i].to(b.device)
            if counts.shape[0] != b.shape[1]:
                msg = (
                    f"NAC: layer {self.rnet.table[self.labels[i]].describe()} gives "
                    f"{b.shape[1]} neurons, but NAC was fitted on {counts.shape[0]}: "
                    "score inputs of the shape it was fitted on, or fit it again."
                )
                raise ValueError(msg)
            coverage = (counts.to(_F64) / self.o_star[i]).clamp(max=1.0)
            total = total + coverage.gather(1, b.T).T.mean(dim=1)
        scores: Tensor = -total / len(self.labels)
        return scores

    # -- state ----------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Return the layers, pooling and the per-layer hyperparameters."""
        return {
            **super().config(),
            "token": self.token_given,
            "m_bins": self.m_bins,
            "alpha": self.alpha,
            "o_star": self.o_star,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the bin counts, by layer index."""
        return {f"counts.{i}": c for i, c in enumerate(self.counts)}

    def state_entries(self) -> dict[str, StateEntry]:
        """Per layer ``i``: ``counts.i`` ``[N_i, bins_i]`` int64 (N_i: neurons)."""
        return {
            f"counts.{i}": StateEntry(
                (pooled_size(self.rnet, label, self.pool), len(edges) - 1),
                torch.int64,
            )
            for i, (label, edges) in enumerate(
                zip(self.labels, self.edges, strict=True)
            )
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the bin counts."""
        self.counts = [state[f"counts.{i}"] for i in range(len(self.labels))]
