"""Multi-layer detectors, read in one pass: MahalanobisEnsemble, Gram.

The machinery every multi-layer detector shares:

* ``layers=[...]``: any number of selectors, each resolving to one call
  (:func:`resolve_layers`); a pass records all of them at once (the
  detector's :meth:`~Detector.outputs`), so scoring a batch is **one** forward
  pass of the unmodified net, whatever the number of layers (OpenOOD needs
  the net rewritten to return a feature list; pytorch-ood re-runs the prefix
  of the net per layer).
* Fitting is one :func:`~scio_recorder.collect.collect` pass with one reducer
  per layer (streaming, bounded memory); each reducer sees the layer's
  output through :class:`Mapped` (pooling, Gram statistics, ...).
* Pooling (:func:`pool_features`): a ``[B, C, H, W]`` feature map is
  averaged over ``H, W`` per channel (``pool="mean"``); a ``[B, T, D]``
  token sequence gives its first token (``token="cls"``) or its mean over
  the tokens the padding mask keeps (``token="mean"``, ``mask=``); ``[B,
  F]`` is kept; ``pool=None`` flattens every sample.
* ``mask=``: a padding mask is an argument of the net, not a layer's
  output; ``mask="attention_mask"`` (a keyword) or an int (a positional
  argument) names it, and the detector reads it from each call of the net
  (a forward pre-hook on the wrapped net that keeps a reference to it).
"""

from __future__ import annotations

__all__ = [
    "Gram",
    "MahalanobisEnsemble",
    "Mapped",
    "pool_features",
    "resolve_layers",
]

import math
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional

from scio_recorder.reduce import MinMax, PerClass, SharedCovariance

from ._checks import (
    checked_targets,
    finite_keep,
    finite_result,
    one_label,
    per_sample_size,
)
from ._features import _net_classes, min_mahalanobis
from ._passes import all_or_nothing, check_reiterable, in_subfolder
from ._protocol import Detector, Pass, StateEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64
_MAP, _TOKENS = 4, 3  # the ranks of a feature map and of a token sequence
POOLS = ("mean", None)
TOKENS = ("cls", "mean")


def resolve_layers(
    rnet: Recorder, layers: Sequence[Selector], who: str
) -> list[DepthIdx]:
    """Resolve each selector of ``layers`` to one call; refuse none or repeats.

    Examples
    --------
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(), input_size=(1, 3, 32, 32))
    >>> resolve_layers(rnet, ["features.1", "features.4"], "doc")
    [(2, 2), (2, 5)]

    """
    if isinstance(layers, str) or not isinstance(layers, list | tuple) or not layers:
        msg = (
            f"{who}: layers must be a non-empty list of selectors (labels, "
            f"names, ...), got {layers!r}; e.g. `layers=['layer1', 'layer2']`."
        )
        raise ValueError(msg)
    labels = [one_label(rnet, layer, who) for layer in layers]
    seen: dict[DepthIdx, Any] = {}
    for layer, label in zip(layers, labels, strict=True):
        if label in seen:
            msg = (
                f"{who}: layers {seen[label]!r} and {layer!r} are the same call "
                f"{rnet.table[label].describe()}; name each layer once."
            )
            raise ValueError(msg)
        seen[label] = layer
    return labels


def pool_features(
    value: Tensor,
    pool: str | None = "mean",
    token: str = "cls",  # noqa: S107 (not a password)
    mask: Tensor | None = None,
) -> Tensor:
    """Return one feature vector per sample, ``[B, F]``, in float64.

    ``pool="mean"``: a ``[B, C, H, W]`` map is averaged over ``H, W``; a
    ``[B, T, D]`` sequence gives its first token (``token="cls"``) or the mean
    of the tokens where ``mask`` (``[B, T]``, nonzero = a real token) is set
    (``token="mean"``; every token without a mask); other shapes are
    flattened. ``pool=None`` flattens every sample.

    Examples
    --------
    >>> import torch
    >>> pool_features(torch.ones(2, 3, 4, 4)).shape
    torch.Size([2, 3])
    >>> x = torch.tensor([[[1.0], [3.0], [100.0]]])
    >>> pool_features(x, token="mean", mask=torch.tensor([[1, 1, 0]])).tolist()
    [[2.0]]

    """
    value = value.detach().to(_F64)
    if pool is None:
        return value.reshape(value.shape[0], -1)
    if value.dim() == _MAP:
        return value.mean(dim=(2, 3))
    if value.dim() == _TOKENS:
        if token == "cls":  # noqa: S105 (not a password)
            return value[:, 0]
        if mask is None:
            return value.mean(dim=1)
        keep = mask.to(device=value.device, dtype=_F64).reshape(*value.shape[:2], 1)
        return (value * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
    return value.reshape(value.shape[0], -1)


def pooled_size(
    rnet: Recorder, label: DepthIdx, pool: str | None = "mean"
) -> int | None:
    """Return the number of features :func:`pool_features` gives a layer's output.

    From the recorder's layer table (``None`` when it does not know the
    layer's shape): the channels of a map, the width of a token sequence,
    else every entry of a sample.

    Examples
    --------
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(), input_size=(1, 3, 32, 32))
    >>> pooled_size(rnet, (2, 2)), pooled_size(rnet, (2, 2), pool=None)
    (8, 8192)

    """
    size = per_sample_size(rnet, label, "output")
    if size is None:
        return None
    if pool is not None and len(size) == _MAP - 1:
        return size[0]
    if pool is not None and len(size) == _TOKENS - 1:
        return size[1]
    return math.prod(size)


class Mapped:
    """A reducer fed ``fn(record)`` instead of the record (``fn``: pooling, ...).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments
    >>> r = Mapped(Moments(), lambda t: 2 * t)
    >>> r.update(torch.ones(3, 2))
    >>> r.result().mean.tolist(), r.count
    ([2.0, 2.0], 3)

    """

    def __init__(self, inner: Any, fn: Callable[[Tensor], Tensor]) -> None:
        """Wrap ``inner``."""
        self.inner, self.fn = inner, fn

    @property
    def count(self) -> int:
        """Samples seen."""
        return int(self.inner.count)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Feed ``fn(value)``."""
        self.inner.update(self.fn(value), target)

    def merge(self, other: Mapped) -> None:
        """Absorb another's inner reducer."""
        self.inner.merge(other.inner)

    def result(self) -> Any:
        """Return the inner result."""
        return self.inner.result()

    def state(self) -> dict[str, Tensor]:
        """Return the inner state."""
        return dict(self.inner.state())

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the inner state."""
        self.inner.load_state(state)

    def fresh(self) -> Mapped:
        """Return an empty reducer of the same config."""
        return Mapped(self.inner.fresh(), self.fn)


def _check_choice(who: str, name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        msg = f"{who}: {name} must be one of {list(choices)}, got {value!r}"
        raise ValueError(msg)


class _MultiLayer(Detector):
    """A detector reading several layers' outputs in one pass."""

    def __init__(
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        pool: str | None = "mean",
        token: str = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
    ) -> None:
        super().__init__(rnet)
        who = type(self).__name__
        _check_choice(who, "pool", pool, POOLS)
        _check_choice(who, "token", token, TOKENS)
        if mask is not None and (
            isinstance(mask, bool) or not isinstance(mask, int | str)
        ):
            msg = (
                f"{who}: mask must name an argument of the net (a keyword str or a "
                f"positional int), got {mask!r}; e.g. `mask='attention_mask'`."
            )
            raise TypeError(msg)
        self.labels = resolve_layers(rnet, layers, who)
        self.pool, self.token, self.mask = pool, token, mask
        self._mask_value: Tensor | None = None
        if mask is not None:
            self._hook = rnet.net.register_forward_pre_hook(
                _mask_keeper(weakref.ref(self), mask), with_kwargs=True
            )

    def outputs(self) -> tuple[DepthIdx, ...]:
        return tuple(self.labels)

    def current_mask(self) -> Tensor | None:
        """Return the mask the net received in its latest call (``mask=``)."""
        if self.mask is None:
            return None
        if self._mask_value is None:
            msg = (
                f"{type(self).__name__}: the net's latest call had no argument "
                f"{self.mask!r} (mask=); pass the padding mask to the net under "
                "that name, or drop `mask=`."
            )
            raise ValueError(msg)
        return self._mask_value

    def features(self, value: Tensor) -> Tensor:
        """Pool one layer's record into ``[B, F]`` float64 features."""
        return pool_features(value, self.pool, self.token, self.current_mask())

    def config(self) -> dict[str, Any]:
        return {
            "layers": [list(label) for label in self.labels],
            "pool": self.pool,
            "token": self.token,
            "mask": self.mask,
        }


def _mask_keeper(
    owner: weakref.ref[_MultiLayer], where: int | str
) -> Callable[..., None]:
    def keep(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        detector = owner()
        if detector is None:
            return
        if isinstance(where, str):
            found = kwargs.get(where)
        else:
            found = args[where] if -len(args) <= where < len(args) else None
        detector._mask_value = found if isinstance(found, Tensor) else None  # noqa: SLF001 (its own state)

    return keep


def _check_shrinkage(who: str, shrinkage: float) -> None:
    if not 0.0 <= shrinkage <= 1.0:
        msg = f"{who}: shrinkage must be a fraction in [0, 1], got {shrinkage}"
        raise ValueError(msg)


def shrunk(cov: Tensor, shrinkage: float) -> Tensor:
    """Return ``(1 - s) S + s (tr(S) / F) I``, a covariance shrunk to a sphere.

    Examples
    --------
    >>> import torch
    >>> shrunk(torch.tensor([[2.0, 1.0], [1.0, 0.0]]), 0.5)
    tensor([[1.5000, 0.5000],
            [0.5000, 0.5000]])

    """
    if shrinkage == 0.0:
        return cov
    scale = torch.diagonal(cov).mean()
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    return (1.0 - shrinkage) * cov + shrinkage * scale * eye


class MahalanobisEnsemble(_MultiLayer):
    """Lee et al.'s feature ensemble (NeurIPS 2018), in one pass of the net.

    For each layer ``l`` of ``layers``: features ``f_l`` pooled per channel
    (:func:`pool_features`), class means ``mu_lc`` and the covariance ``S_l``
    shared by the classes (``W / N``, streaming); ``M_l(x) = min_c (f_l -
    mu_lc)^T S_l^+ (f_l - mu_lc)``; ``score(x) = sum_l w_l M_l(x)``.

    Where our reading decided: the paper fits ``w_l`` by logistic regression
    on validation OoD data; we need no OoD data: equal weights ``1`` (as
    pytorch-ood's ``MultiMahalanobis``), or ``weights=``. The paper's input
    preprocessing (a step of size eps against the gradient) is not done (eps
    = 0; pytorch-ood's does not either). ``S^+`` is the pseudo-inverse of the
    covariance shrunk by ``shrinkage`` (:func:`shrunk`) for near-singular
    covariances. pytorch-ood's ``MultiMahalanobis`` scores ``0.5 M_l`` with
    ``S_l = W`` (not divided by ``N``) plus ``1e-6 I``: its scores are ours
    times ``1 / (2 N)`` (the tests check it).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    weights : list of float, optional
        One per layer; default all 1.
    pool, token, mask
        How a layer's output becomes features (:func:`pool_features`);
        ``mask`` names the net's argument holding the padding mask.
    shrinkage : float, default 0.0
        In ``[0, 1]``.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(3), input_size=(1, 3, 32, 32))
    >>> data = [(torch.randn(12, 3, 32, 32), torch.arange(12) % 3)]
    >>> ens = MahalanobisEnsemble(rnet, ["features.1", "features.4", "classifier.2"])
    >>> ens.fit(data, target=1)(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2])

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (the paper's and the pooling's options)
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        weights: Sequence[float] | None = None,
        pool: str | None = "mean",
        token: str = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
        shrinkage: float = 0.0,
    ) -> None:
        """Resolve the layers; check the weights and the shrinkage."""
        super().__init__(rnet, layers, pool=pool, token=token, mask=mask)
        _check_shrinkage("MahalanobisEnsemble", shrinkage)
        if weights is None:
            weights = [1.0] * len(self.labels)
        if len(weights) != len(self.labels):
            msg = (
                f"MahalanobisEnsemble: {len(weights)} weights for "
                f"{len(self.labels)} layers; give one weight per layer."
            )
            raise ValueError(msg)
        self.weights = [float(w) for w in weights]
        self.shrinkage = float(shrinkage)
        self.num_classes: int | None = _net_classes(rnet)
        self.means: list[Tensor] = []
        self.precisions: list[Tensor] = []

    def fit_keep(self) -> dict[Any, Any]:
        """One pooled shared covariance per layer (non-finite samples counted)."""
        return {
            label: finite_keep(
                Mapped(SharedCovariance(self.num_classes), self.features)
            )
            for label in self.labels
        }

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep each layer's class means and precision matrix."""
        self.means, self.precisions = [], []
        for label in self.labels:
            stats = finite_result(self, label, "output", result[label])
            seen = torch.nonzero(stats.class_counts > 0).reshape(-1)
            if seen.numel() < 2:  # noqa: PLR2004 (class statistics need two classes)
                msg = (
                    "MahalanobisEnsemble needs at least two classes in the fit data; "
                    f"got {seen.tolist()}. Check `target=` and the batches."
                )
                raise ValueError(msg)
            self.means.append(stats.means[seen])
            cov = shrunk(stats.cov, self.shrinkage)
            self.precisions.append(torch.linalg.pinv(cov, hermitian=True))

    def layer_scores(self, result: Pass) -> Tensor:
        """Return ``M_l(x)`` per sample and layer, ``[B, L]``."""
        return torch.stack(
            [
                min_mahalanobis(self.features(result.outputs[label]), mean, precision)
                for label, mean, precision in zip(
                    self.labels, self.means, self.precisions, strict=True
                )
            ],
            dim=1,
        )

    def score_pass(self, result: Pass) -> Tensor:
        """Return the weighted sum of the per-layer distances."""
        per_layer = self.layer_scores(result)
        return per_layer @ torch.tensor(
            self.weights, dtype=_F64, device=per_layer.device
        )

    def config(self) -> dict[str, Any]:
        """Return the layers, pooling, weights and shrinkage."""
        return {
            **super().config(),
            "weights": self.weights,
            "shrinkage": self.shrinkage,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the means and precisions, by layer index."""
        out: dict[str, Tensor] = {}
        for i, (mean, precision) in enumerate(
            zip(self.means, self.precisions, strict=True)
        ):
            out[f"means.{i}"], out[f"precision.{i}"] = mean, precision
        return out

    def state_entries(self) -> dict[str, StateEntry]:
        """Per layer ``i``: ``means.i`` ``[classes, F_i]``, ``precision.i``.

        ``F_i`` the pooled features of layer ``i`` (:func:`pooled_size`),
        float64; the same classes in every layer.
        """
        out: dict[str, StateEntry] = {}
        for i, label in enumerate(self.labels):
            f = pooled_size(self.rnet, label, self.pool)
            out[f"means.{i}"] = StateEntry(("classes", f), _F64)
            out[f"precision.{i}"] = StateEntry((f, f), _F64)
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the means and precisions."""
        n = len(self.labels)
        self.means = [state[f"means.{i}"] for i in range(n)]
        self.precisions = [state[f"precision.{i}"] for i in range(n)]


def gram_vector(feature: Tensor, p: int) -> Tensor:
    """Row sums of the ``p``-th order Gram matrix, signed ``p``-th root, ``[B, C]``.

    ``G = (F^p) (F^p)^T`` with ``F`` the ``C x HW`` map of a sample (dim 1 is
    the channel; a ``[B, T, D]`` token sequence is read as ``D`` channels
    over ``T`` tokens), as pytorch-ood's ``Gram``, in float64.

    Examples
    --------
    >>> import torch
    >>> gram_vector(torch.tensor([[[[1.0, 2.0]], [[0.0, 1.0]]]]), 1).tolist()
    [[7.0, 3.0]]

    """
    f = feature.detach().to(_F64)
    if f.dim() == _TOKENS:
        f = f.transpose(1, 2)
    f = f.reshape(f.shape[0], f.shape[1], -1) ** p
    g = torch.matmul(f, f.transpose(1, 2)).sum(dim=2)
    return g.sign() * g.abs() ** (1.0 / p)


def _held_out(start: int, n: int, fraction: float) -> Tensor:
    """Whether samples ``start .. start + n - 1`` of the stream are held out."""
    i = torch.arange(start, start + n, dtype=_F64)
    return torch.floor((i + 1) * fraction) > torch.floor(i * fraction)


class _Part:
    """A reducer fed ``fn(record)`` of the held-out samples, or of the others."""

    def __init__(
        self, inner: Any, fn: Callable[[Tensor], Tensor], fraction: float, *, held: bool
    ) -> None:
        self.inner, self.fn, self.fraction, self.held = inner, fn, fraction, held
        self.seen = 0

    @property
    def count(self) -> int:
        return int(self.inner.count)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        n = int(value.shape[0])
        rows = _held_out(self.seen, n, self.fraction).to(value.device)
        self.seen += n
        rows = rows if self.held else ~rows
        if bool(rows.any()):
            part = None if target is None else target[rows.to(target.device)]
            self.inner.update(self.fn(value[rows]), part)

    def merge(self, other: _Part) -> None:
        self.inner.merge(other.inner)
        self.seen += other.seen

    def result(self) -> Any:
        return self.inner.result()

    def state(self) -> dict[str, Tensor]:
        return {**self.inner.state(), "_seen": torch.tensor(self.seen)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.seen = int(state["_seen"])
        self.inner.load_state({k: v for k, v in state.items() if k != "_seen"})

    def fresh(self) -> _Part:
        return _Part(self.inner.fresh(), self.fn, self.fraction, held=self.held)


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


class _Deviations:
    """A reducer: the sum and count of a layer's Gram deviations (true classes)."""

    def __init__(self, mins: Tensor, maxs: Tensor) -> None:
        self.mins, self.maxs = mins, maxs
        self.total = torch.zeros((), dtype=_F64)
        self.n = 0

    @property
    def count(self) -> int:
        return self.n

    def update(self, value: Tensor, target: Tensor | None = None) -> None:
        assert target is not None  # noqa: S101 (Gram.fit passes the labels)
        cls = target.to(device=self.mins.device, dtype=torch.int64)
        dev = gram_deviation(value.to(self.mins.device), self.mins[cls], self.maxs[cls])
        self.total = self.total.to(dev.device) + dev.sum()
        self.n += int(value.shape[0])

    def merge(self, other: _Deviations) -> None:
        self.total = self.total + other.total.to(self.total.device)
        self.n += other.n

    def result(self) -> Tensor:
        return self.total / max(self.n, 1)

    def state(self) -> dict[str, Tensor]:
        return {"total": self.total, "count": torch.tensor(self.n)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.total, self.n = state["total"], int(state["count"])

    def fresh(self) -> _Deviations:
        return _Deviations(self.mins, self.maxs)


def _class_bounds(per_class: Mapping[int, Any]) -> tuple[Tensor, Tensor]:
    """Stack the per-class min and max, ``[classes, F]``; every class present."""
    top = max(per_class) + 1 if per_class else 0
    missing = sorted(set(range(top)) - set(per_class))
    if top < 2 or missing:  # noqa: PLR2004 (bounds per class)
        msg = (
            f"Gram: the fit data must hold every class 0 .. {max(top - 1, 1)}; "
            f"missing {missing or 'a second class'}. Check `target=`."
        )
        raise ValueError(msg)
    lo = torch.stack([per_class[c].min.to(_F64) for c in range(top)])
    hi = torch.stack([per_class[c].max.to(_F64) for c in range(top)])
    return lo, hi


class Gram(_MultiLayer):
    """Gram-matrix deviations (Sastry & Oore, ICML 2020), in one pass of the net.

    For each layer ``l`` and pole ``p`` of ``num_poles_list``: ``g_lp(x)``,
    the row sums of ``(F^p)(F^p)^T`` with their signed ``p``-th root
    (:func:`gram_vector`; ``F`` the layer's ``C x HW`` map, no pooling).
    ``fit`` keeps per class the entry-wise min and max of ``g_lp`` over the
    fit data (streaming, :class:`~scio_recorder.reduce.MinMax` per class), then
    in a second pass the mean deviation ``E_l`` of the held-out samples
    against the bounds of their true class. ``score(x) = sum_l (sum_p
    dev(g_lp(x), min_lpc, max_lpc)) / E_l``, ``c`` the predicted class,
    ``dev`` :func:`gram_deviation`. Follows pytorch-ood's ``Gram``.

    Where our reading decided: the held-out fraction is chosen
    deterministically (sample ``i`` of the stream when ``floor((i + 1) f) >
    floor(i f)``, ``f = validation_fraction``) rather than by a random
    permutation per class; with ``validation_fraction=0`` nothing is held out
    and every ``E_l = 1`` (as pytorch-ood when a class has < 10 samples).
    ``E_l = 1`` also when the held-out deviation is 0. Every class from 0 to
    the largest label must be in the fit data (pytorch-ood's requirement too).
    The fit data are read twice (a list or a ``DataLoader``).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    num_poles_list : list of int, optional
        The poles ``p``; default ``1 .. len(layers)`` (pytorch-ood's).
    validation_fraction : float, default 0.1
        Held out for ``E_l``, in ``[0, 1)``.

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
    fit_passes: ClassVar[int] = 2

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
        self.num_classes: int | None = _net_classes(rnet)
        self.validation_fraction = float(validation_fraction)
        self.mins: list[Tensor] = []
        self.maxs: list[Tensor] = []
        self.norms = torch.ones(len(self.labels), dtype=_F64)

    def grams(self, value: Tensor) -> Tensor:
        """Return the poles' Gram vectors of one layer, side by side ``[B, P C]``."""
        return torch.cat([gram_vector(value, p) for p in self.poles], dim=1)

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,
        **options: Any,
    ) -> Self:
        """Two passes: the class bounds, then the held-out deviations.

        ``batches`` is iterated twice (once with ``validation_fraction=0``):
        a list or a ``DataLoader``; a generator or another iterator is a
        ``TypeError``, raised before the first pass. Labels are checked per
        batch (integers in ``[0, classes)``), non-finite records refused with
        their count. With ``spill_dir``, the passes use its subfolders
        ``pass-0`` and ``pass-1`` (each resumable). If the fit fails, the
        detector is left as it was.
        """
        from scio_recorder.collect import collect  # noqa: PLC0415 (as ViM does)

        if target is None:
            msg = "Gram.fit needs class labels: pass `target=` (e.g. `target=1`)."
            raise ValueError(msg)
        f = self.validation_fraction
        passes = [("one for the class bounds", 1)]
        if f > 0:
            passes.append(("one for the held-out deviations", 1))
        check_reiterable(batches, passes, "Gram.fit")
        keep = {
            label: finite_keep(_Part(PerClass(MinMax()), self.grams, f, held=False))
            for label in self.labels
        }
        with all_or_nothing([self]):
            bounds = collect(
                self.rnet,
                batches,
                keep,
                input=input,
                target=checked_targets(target, input, [self]),
                **in_subfolder(options, "pass-0"),
            )
            self.mins, self.maxs = [], []
            for label in self.labels:
                per_class = finite_result(self, label, "output", bounds[label])
                lo, hi = _class_bounds(per_class)
                self.mins.append(lo)
                self.maxs.append(hi)
            self.norms = torch.ones(len(self.labels), dtype=_F64)
            if f > 0:
                second: dict[Any, Any] = {
                    label: _Part(_Deviations(lo, hi), self.grams, f, held=True)
                    for label, lo, hi in zip(
                        self.labels, self.mins, self.maxs, strict=True
                    )
                }
                devs = collect(
                    self.rnet,
                    batches,
                    second,
                    input=input,
                    target=checked_targets(target, input, [self]),
                    **in_subfolder(options, "pass-1"),
                )
                expected = torch.stack(
                    [devs[label].to(_F64).cpu() for label in self.labels]
                )
                self.norms = torch.where(
                    expected > 0, expected, torch.ones_like(expected)
                )
            self._fitted = True
        return self

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
                channels = size[1] if len(size) == _TOKENS - 1 else size[0]
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
