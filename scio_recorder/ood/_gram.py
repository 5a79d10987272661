"""A multi-layer detector, read in one pass: Gram (Sastry & Oore, 2020).

It reads any number of layers (``layers=[...]``) in **one** forward pass of
the unmodified net, as every multi-layer detector does
(:class:`~._layers.MultiLayer`); each layer's output is turned into its Gram
statistics (:func:`gram_vectors`) through :class:`~._layers.Mapped`, and
fitting is one :func:`~scio_recorder.collect.collect` pass with one reducer
per layer (class-wise minima and maxima).
"""

from __future__ import annotations

__all__ = ["Gram", "gram_vector", "gram_vectors"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional

from scio_recorder.reduce import Concat, MinMax, PerClass

from ._checks import per_sample_size
from ._layers import SEQUENCE_RANK, MultiLayer
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

_F64 = torch.float64


_GRAM_CHUNK = 1 << 15  # float64 entries per chunk of samples: 256 kB, in cache


def gram_vectors(feature: Tensor, poles: Sequence[int]) -> Tensor:
    """Row sums of the ``p``-th order Gram matrices, signed ``p``-th root, ``[B, P C]``.

    For each pole ``p``: ``G = (F^p) (F^p)^T`` with ``F`` the ``C x HW`` map
    of a sample (dim 1 is the channel; a ``[B, T, D]`` token sequence is read
    as ``D`` channels over ``T`` tokens), its row sums ``g``, then ``sign(g)
    |g|^(1/p)``, as pytorch-ood's ``Gram``; the poles side by side.

    Computed in float64 without forming ``G``: its row sums are ``F^p s``
    with ``s = (F^p)^T 1``, the column sums (a matrix-vector product,
    ``C HW`` operations where ``G`` takes ``C^2 HW``), a chunk of samples at
    a time, so that the float64 copies stay in the cache, whatever the
    batch; consecutive poles multiply the previous power once more.

    Examples
    --------
    >>> import torch
    >>> g = gram_vectors(torch.tensor([[[[1.0, 2.0]], [[0.0, 1.0]]]]), [1, 2])
    >>> g.round(decimals=3).tolist()  # p = 2: sqrt of the row sums 21 and 5
    [[7.0, 3.0, 4.583, 2.236]]

    """
    f = feature.detach()
    if f.dim() == SEQUENCE_RANK:
        f = f.transpose(1, 2)
    f = f.reshape(f.shape[0], f.shape[1], -1)
    per = max(1, _GRAM_CHUNK // max(1, f.shape[1] * f.shape[2]))
    parts = []
    for part in torch.split(f, per):
        wide = part.to(_F64)
        rows = []
        power, have = wide, 1
        for p in poles:
            if p == have + 1:
                power = power * wide
            elif p != have:
                power = wide.pow(p)
            have = p
            g = torch.bmm(power, power.sum(dim=1).unsqueeze(2)).squeeze(2)
            rows.append(g if p == 1 else g.sign() * g.abs().pow(1.0 / p))
        parts.append(torch.cat(rows, dim=1))
    if not parts:
        return f.new_zeros(0, len(poles) * f.shape[1], dtype=_F64)
    return torch.cat(parts)


def gram_vector(feature: Tensor, p: int) -> Tensor:
    """Row sums of the ``p``-th order Gram matrix, signed ``p``-th root, ``[B, C]``.

    :func:`gram_vectors` of one pole.

    Examples
    --------
    >>> import torch
    >>> gram_vector(torch.tensor([[[[1.0, 2.0]], [[0.0, 1.0]]]]), 1).tolist()
    [[7.0, 3.0]]

    """
    return gram_vectors(feature, [p])


def held_out(labels: Tensor, seen: Tensor, fraction: float) -> Tensor:
    """Whether each sample of a batch is held out, a fraction of each class.

    The ``j``-th sample of class ``c`` in the stream (``j`` from 0,
    ``seen[c]`` of them before this batch) is held out when ``floor((j + 1)
    f) > floor(j f)``, ``f = fraction``: one in ``1 / f`` of each class,
    whatever the order of the labels. ``labels`` and ``seen`` on the CPU.

    Examples
    --------
    >>> import torch
    >>> labels = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    >>> held_out(labels, torch.zeros(2, dtype=torch.int64), 0.5).tolist()
    [False, False, True, True, False, False, True, True]

    """
    if labels.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    classes = max(int(labels.max()) + 1, seen.shape[0])
    before = functional.pad(seen, (0, classes - seen.shape[0]))
    one_hot = functional.one_hot(labels, classes)
    j = (one_hot.cumsum(dim=0) - 1).gather(1, labels[:, None])[:, 0] + before[labels]
    j = j.to(_F64)
    return torch.floor((j + 1) * fraction) > torch.floor(j * fraction)


class _GramFit:
    """A reducer: a layer's Gram vectors, bounds per class and the held-out ones.

    Each batch's Gram vectors (``fn``) are computed once; the samples
    :func:`held_out` holds out are kept by class (``PerClass(Concat)``), the
    others feed the per-class min and max (``PerClass(MinMax)``). The result
    is ``(bounds, held)``, two mappings class -> result.
    """

    def __init__(self, fn: Callable[[Tensor], Tensor], fraction: float) -> None:
        self.fn, self.fraction = fn, fraction
        self.bounds = PerClass(MinMax())
        self.held = PerClass(Concat())
        self.seen = torch.zeros(0, dtype=torch.int64)

    @property
    def count(self) -> int:
        return int(self.bounds.count) + int(self.held.count)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        if target is None:
            msg = "Gram needs class labels: pass `target=` to fit."
            raise ValueError(msg)
        labels = torch.as_tensor(target).reshape(-1).to("cpu", torch.int64)
        if labels.numel() == 0:
            return
        held = held_out(labels, self.seen, self.fraction)
        counts = torch.bincount(labels, minlength=self.seen.shape[0])
        self.seen = functional.pad(self.seen, (0, counts.shape[0] - self.seen.shape[0]))
        self.seen = self.seen + counts
        grams = self.fn(value)
        rows = held.to(grams.device)
        if bool((~held).any()):
            self.bounds.update(grams[~rows], labels[~held].to(grams.device))
        if bool(held.any()):
            self.held.update(grams[rows], labels[held].to(grams.device))

    def merge(self, other: _GramFit) -> None:
        self.bounds.merge(other.bounds)
        self.held.merge(other.held)
        width = max(self.seen.shape[0], other.seen.shape[0])
        self.seen = functional.pad(self.seen, (0, width - self.seen.shape[0]))
        self.seen = self.seen + functional.pad(
            other.seen, (0, width - other.seen.shape[0])
        )

    def result(self) -> tuple[dict[int, Any], dict[int, Tensor]]:
        return self.bounds.result(), self.held.result()

    def state(self) -> dict[str, Tensor]:
        return {
            **{f"bounds/{k}": v for k, v in self.bounds.state().items()},
            **{f"held/{k}": v for k, v in self.held.state().items()},
            "seen": self.seen,
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        for name, part in (("bounds", self.bounds), ("held", self.held)):
            prefix = f"{name}/"
            part.load_state(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            )
        self.seen = state["seen"].to(torch.int64)

    def fresh(self) -> _GramFit:
        return _GramFit(self.fn, self.fraction)


def gram_deviation(g: Tensor, mins: Tensor, maxs: Tensor) -> Tensor:
    """Return the relative out-of-bounds deviation summed over entries, ``[B]``.

    ``sum relu(min - g) / |min + 1e-6| + relu(g - max) / |max + 1e-6|``
    (pytorch-ood's ``_deviation``).

    Examples
    --------
    >>> import torch
    >>> gram_deviation(torch.tensor([[0.0, 3.0]]), torch.ones(2), 2 * torch.ones(2))
    tensor([1.5000])

    """
    low = functional.relu(mins - g) / torch.abs(mins + 1e-6)
    high = functional.relu(g - maxs) / torch.abs(maxs + 1e-6)
    return (low + high).sum(dim=1)


def _class_bounds(
    per_class: Mapping[int, Any], held: Mapping[int, Tensor]
) -> tuple[Tensor, Tensor]:
    """Stack the per-class min and max, ``[classes, F]``; every class present.

    ``held``: the held-out samples' Gram vectors by class, whose classes
    need bounds too.
    """
    top = max([*per_class, *held], default=-1) + 1
    missing = sorted(set(range(top)) - set(per_class))
    if top < 2 or missing:  # noqa: PLR2004 (bounds per class)
        msg = (
            f"Gram: the fit data must hold every class 0 .. {max(top - 1, 1)} "
            f"(outside the held-out samples); missing {missing or 'a second class'}. "
            "Check `target=`, or fit on more data."
        )
        raise ValueError(msg)
    lo = torch.stack([per_class[c].min.to(_F64) for c in range(top)])
    hi = torch.stack([per_class[c].max.to(_F64) for c in range(top)])
    return lo, hi


def _held_out_deviation(held: Mapping[int, Tensor], lo: Tensor, hi: Tensor) -> Tensor:
    """Return the mean deviation of held-out Gram vectors from their class bounds.

    1 when nothing is held out, or the mean is 0 (float64, a scalar).
    """
    total = torch.zeros((), dtype=_F64)
    n = 0
    for cls, grams in held.items():
        g = grams.to(device=lo.device, dtype=_F64)
        total = total + gram_deviation(g, lo[cls], hi[cls]).sum().cpu()
        n += int(g.shape[0])
    mean = total / max(n, 1)
    return mean if mean > 0 else torch.ones((), dtype=_F64)


class Gram(MultiLayer):
    r"""Gram-matrix deviations (Sastry & Oore, ICML 2020), in one pass of the net.

    For each layer $l$ and pole $p$ of ``num_poles_list``: $g_{lp}(x)$,
    the row sums of $(F^p)(F^p)^\top$ with their signed $p$-th root
    (:func:`gram_vector`; $F$ the layer's $C \times HW$ map, no pooling).
    ``fit`` keeps per class the entry-wise min and max of $g_{lp}$ over the
    fit data (streaming, :class:`~scio_recorder.reduce.MinMax` per class)
    and, in the same pass, the Gram vectors of the held-out samples (a
    fraction of the data, $P C$ values each), whose mean deviation
    against the bounds of their true class is $E_l$. The score is

    $$\mathrm{score}(x) = \sum_l \frac{1}{E_l} \sum_p \mathrm{dev}(g_{lp}(x),
    \mathrm{min}_{lpc}, \mathrm{max}_{lpc}),$$

    with $c$ the predicted class and $\mathrm{dev}$ the deviation of
    :func:`gram_deviation`. Follows pytorch-ood's ``Gram``; one pass over the
    fit data (pytorch-ood: one per layer, then the held-out deviations),
    shared by :func:`~scio_recorder.ood.fit_detectors`.

    Where our reading decided: the held-out samples are a fraction of each
    class, as pytorch-ood's, but chosen deterministically (:func:`held_out`:
    the ``j``-th sample of a class in the stream when ``floor((j + 1) f) >
    floor(j f)``, ``f = validation_fraction``) rather than by a random
    permutation; with ``validation_fraction=0`` nothing is held out
    and every $E_l = 1$ (as pytorch-ood when a class has < 10 samples).
    $E_l = 1$ also when the held-out deviation is 0. Every class from 0 to
    the largest label must be in the fit data outside the held-out samples
    (pytorch-ood's requirement too).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    num_poles_list : list of int, optional
        The poles ``p``; default ``1 .. len(layers)`` (pytorch-ood's).
    validation_fraction : float, default 0.1
        Held out for $E_l$, in ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(2), input_size=(1, 3, 32, 32))
    >>> data = [(torch.randn(20, 3, 32, 32), torch.arange(20) % 2)]
    >>> gram = Gram(rnet, ["features.1", "features.4"]).fit(data, target=1)
    >>> gram(torch.randn(3, 3, 32, 32)).shape
    torch.Size([3])

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        num_poles_list: Sequence[int] | None = None,
        validation_fraction: float = 0.1,
    ) -> None:
        """Resolve the layers; check the poles."""
        super().__init__(rnet, layers, pool=None)
        poles = list(num_poles_list or range(1, len(self.labels) + 1))
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in poles):
            msg = f"Gram: num_poles_list must hold ints >= 1, got {poles!r}"
            raise ValueError(msg)
        if not 0.0 <= validation_fraction < 1.0:
            msg = (
                "Gram: validation_fraction must be in [0, 1), got "
                f"{validation_fraction}"
            )
            raise ValueError(msg)
        self.poles = poles
        self.validation_fraction = float(validation_fraction)
        self.mins: list[Tensor] = []
        self.maxs: list[Tensor] = []
        self.norms = torch.ones(len(self.labels), dtype=_F64)

    def grams(self, value: Tensor) -> Tensor:
        """Return the poles' Gram vectors of one layer, side by side ``[B, P C]``."""
        return gram_vectors(value, self.poles)

    def fit_keep(self) -> dict[Any, Any]:
        """Per layer: class bounds of the Gram vectors, and the held-out vectors.

        The samples not held out feed per-class min/max; the held-out ones
        (``validation_fraction`` of each class, a Gram vector of ``P C``
        values each) are kept by class, for their deviations once the
        bounds are known: one pass over the data.
        """
        return {
            label: _GramFit(self.grams, self.validation_fraction)
            for label in self.labels
        }

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the class bounds and each layer's mean held-out deviation."""
        mins, maxs, norms = [], [], []
        for label in self.labels:
            per_class, held = result[label]
            lo, hi = _class_bounds(per_class, held)
            mins.append(lo)
            maxs.append(hi)
            norms.append(_held_out_deviation(held, lo, hi))
        self.mins, self.maxs, self.norms = mins, maxs, torch.stack(norms)

    def score_pass(self, result: Pass) -> Tensor:
        """Return the normalised deviations summed over layers."""
        predicted = result.logits.argmax(dim=1)
        classes = self.mins[0].shape[0]
        if bool((predicted >= classes).any()):
            msg = (
                f"Gram: the net predicts class {int(predicted.max())}, but was fitted "
                f"on classes 0 .. {classes - 1}; fit on data with every class."
            )
            raise ValueError(msg)
        total = torch.zeros(predicted.shape[0], dtype=_F64, device=predicted.device)
        for i, label in enumerate(self.labels):
            g = self.grams(result.outputs[label])
            lo, hi = self.mins[i].to(g.device), self.maxs[i].to(g.device)
            dev = gram_deviation(
                g, lo[predicted.to(g.device)], hi[predicted.to(g.device)]
            )
            total = total + dev.to(total.device) / self.norms[i].to(total.device)
        return total

    def config(self) -> dict[str, Any]:
        """Return the layers, poles and validation fraction."""
        return {
            "layers": [list(label) for label in self.labels],
            "num_poles_list": self.poles,
            "validation_fraction": self.validation_fraction,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the bounds per layer and the norms."""
        out = {"norms": self.norms}
        for i, (lo, hi) in enumerate(zip(self.mins, self.maxs, strict=True)):
            out[f"mins.{i}"], out[f"maxs.{i}"] = lo, hi
        return out

    def state_entries(self) -> dict[str, StateEntry]:
        """``norms`` ``[L]``; per layer ``i``: ``mins.i``, ``maxs.i``.

        Each ``[classes, P C_i]``.

        ``P`` the number of poles, ``C_i`` the channels of layer ``i`` (the
        width of a token sequence); float64.
        """
        out = {"norms": StateEntry((len(self.labels),), _F64)}
        for i, label in enumerate(self.labels):
            size = per_sample_size(self.rnet, label, "output")
            channels = None
            if size:
                channels = size[1] if len(size) == SEQUENCE_RANK - 1 else size[0]
            width = None if channels is None else len(self.poles) * channels
            out[f"mins.{i}"] = StateEntry(("classes", width), _F64)
            out[f"maxs.{i}"] = StateEntry(("classes", width), _F64)
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the bounds and the norms."""
        n = len(self.labels)
        self.mins = [state[f"mins.{i}"] for i in range(n)]
        self.maxs = [state[f"maxs.{i}"] for i in range(n)]
        self.norms = state["norms"]
