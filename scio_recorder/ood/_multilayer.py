"""Multi-layer detectors, read in one pass: MahalanobisEnsemble, Gram.

Both read any number of layers (``layers=[...]``) in **one** forward pass of
the unmodified net, pooled per layer, as every multi-layer detector does
(:class:`~._layers.MultiLayer`: the layers, the pooling, the padding mask).
Fitting is one :func:`~scio_recorder.collect.collect` pass with one reducer
per layer (streaming, bounded memory); each reducer sees the layer's
output through :class:`~._layers.Mapped` (pooling, Gram statistics, ...).
"""

from __future__ import annotations

__all__ = [
    "Gram",
    "MahalanobisEnsemble",
    "gram_vector",
    "gram_vectors",
]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor
from torch.nn import functional

from scio_recorder.reduce import Concat, MinMax, PerClass, SharedCovariance, Tee

from ._bank import Bank
from ._checks import per_sample_size
from ._classes import ClassConditional, check_at, class_count
from ._geometry import (
    class_mahalanobis,
    closest_class_sum,
    l2_rows,
    min_mahalanobis,
    spread_classes,
)
from ._inputs import check_epsilon, gradient_step
from ._layers import SEQUENCE_RANK, TOKENS, Mapped, MultiLayer, pooled_size
from ._protocol import Pass, run_pass
from ._pvalues import check_aggregation, combine, p_values
from ._saving import StateEntry
from ._tokens import TokenScoring

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


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


class MahalanobisEnsemble(TokenScoring, ClassConditional, MultiLayer):
    r"""Lee et al.'s feature ensemble (NeurIPS 2018), in one pass of the net.

    For each layer $l$ of ``layers``: features $f_l$ pooled per channel
    (:func:`~._layers.pool_features`), class means $\mu_{lc}$ and the covariance $S_l$
    shared by the classes ($W / N$, streaming); $M_l(x) = \min_c (f_l -
    \mu_{lc})^\top S_l^+ (f_l - \mu_{lc})$; $\mathrm{score}(x) = \sum_l w_l
    M_l(x)$.

    Where our reading decided: the paper fits ``w_l`` by logistic regression
    on validation OoD data; we need no OoD data: equal weights $w_l = 1$ (as
    pytorch-ood's ``MultiMahalanobis``), or ``weights=``. The paper's input
    preprocessing (a step of size eps against the gradient) is ``epsilon=``,
    default 0 (none; pytorch-ood does none). $S_l^+$ is the pseudo-inverse of the
    covariance shrunk by ``shrinkage`` (:func:`shrunk`) for near-singular
    covariances. pytorch-ood's ``MultiMahalanobis`` scores $0.5 M_l$ with
    $S_l = W$ (not divided by $N$) plus $10^{-6} I$: its scores are ours
    times $1 / (2 N)$ (the tests check it). With ``normalize=True``, the
    Mahalanobis++ of each layer (Müller & Hein, ICML 2025): the pooled
    features L2-normalised ($f_l / \|f_l\|_2$) to fit and to score.

    Class-conditional: ``score_classes(x)`` is $\sum_l w_l M_{lc}(x)$, $M_{lc}$
    the distance to class $c$'s mean at layer $l$ (``inf`` for a class
    absent from the fit data); ``at="predicted"`` reads it at the predicted
    class, as scio 1.1's ``DeepMahalanobis`` does (its conformity is minus
    it times $(N - 1) / N$). ``at="closest"`` (default) takes the closest
    class **of each layer**, as above: $\sum_l w_l \min_c M_{lc}$.

    ``aggregation=<name>`` combines p-values instead of summing distances
    (:mod:`~scio_recorder.ood._pvalues`): $p_{lc}(x)$ is the fraction of fit
    samples whose distance to their own class's mean at layer $l$ is at
    least $M_{lc}(x)$ (calibrated on the fit data themselves, which the
    means include), the conformity $\mathrm{conf}_c(x)$ combines the
    $p_{lc}(x)$ over the layers (``"fisher"``: $\sum_l \log p_{lc}(x)$),
    ``score_classes(x)`` is $-\mathrm{conf}_c(x)$, and ``score(x)`` reads
    it at the class of the highest conformity (``at="closest"``) or the
    predicted one. The fit then keeps every fit sample's pooled features
    ($N \times \sum_l F_l$ float64) until the distances are computed.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    weights : list of float, optional
        One per layer; default all 1.
    pool, token, mask
        How a layer's output becomes features (:func:`~._layers.pool_features`);
        ``mask`` names the net's argument holding the padding mask.
        ``token="each"``: a score per token of ``[B, T, D]`` layers
        (:mod:`~scio_recorder.ood._tokens`): every real token a sample of
        each layer's streamed class statistics (one class without a
        target; ``target="labels"`` or ``"input_ids"`` a class per token),
        ``score_tokens`` ``[B, T]``; needs ``at="closest"``, no
        ``epsilon`` nor ``aggregation``.
    reduce : {"mean", "max", "last"} or int, default "mean"
        With ``token="each"``: how ``score`` reduces a row's token scores.
    shrinkage : float, default 0.0
        In ``[0, 1]``.
    normalize : bool, default False
        Mahalanobis++: L2-normalise each layer's pooled features.
    at : {"closest", "predicted"}
        Which class's distances are the score (above).
    aggregation : str, optional
        ``None`` (the weighted sum of distances) or one of
        :data:`~scio_recorder.ood._pvalues.AGGREGATIONS` (unweighted: no
        ``weights`` with it).
    epsilon : float, default 0.0
        Lee et al.'s input preprocessing, per layer (0: none, today's
        scores bit for bit): layer $l$ reads $\hat x_l = x - \epsilon \,
        \mathrm{sign}(\nabla_x M_l(x))$, the step towards its own closest class, as
        the paper and scio's ``DeepMahalanobis`` do (a backward pass and a
        forward pass per layer, the detector's own; not with an
        ``aggregation``, whose p-values are calibrated on unmoved inputs).

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
    TOKENS: ClassVar[tuple[str, ...]] = (*TOKENS, "each")

    def __init__(  # noqa: PLR0913 (the paper's and the pooling's options)
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        reduce: str | int = "mean",
        weights: Sequence[float] | None = None,
        pool: str | None = "mean",
        token: str = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
        shrinkage: float = 0.0,
        normalize: bool = False,
        at: str = "closest",
        aggregation: str | None = None,
        epsilon: float = 0.0,
    ) -> None:
        """Resolve the layers; check the weights and the shrinkage."""
        self.at = check_at("MahalanobisEnsemble", at)
        check_aggregation("MahalanobisEnsemble", aggregation, none=True)
        self.epsilon = check_epsilon("MahalanobisEnsemble", epsilon)
        self.own_passes = self.epsilon > 0
        if self.epsilon and aggregation is not None:
            msg = (
                f"MahalanobisEnsemble: aggregation={aggregation!r} calibrates "
                "p-values on the unmoved fit samples, so the inputs moved by "
                f"epsilon={epsilon!r} would not be calibrated; use one of them."
            )
            raise ValueError(msg)
        if aggregation is not None and weights is not None:
            msg = (
                "MahalanobisEnsemble: weights weigh the sum of distances, but "
                f"aggregation={aggregation!r} combines p-values, unweighted; "
                "drop one of them."
            )
            raise ValueError(msg)
        self.aggregation = aggregation
        super().__init__(rnet, layers, pool=pool, token=token, mask=mask)
        self.init_tokens("each" if token == "each" else None, mask, reduce)  # noqa: S105 (not a password)
        if self.token_each:
            if at != "closest" or epsilon or aggregation is not None:
                msg = (
                    "MahalanobisEnsemble: token='each' sums each layer's distance "
                    "to its closest class per token: drop `at=`, `epsilon=` and "
                    "`aggregation=`."
                )
                raise ValueError(msg)
            self.num_classes = None  # the classes the fit's target shows
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
        self.normalize = bool(normalize)
        self.classes = torch.zeros(0, dtype=torch.int64)
        self.means: list[Tensor] = []
        self.precisions: list[Tensor] = []
        self.reference = torch.zeros(0, 0, dtype=_F64)

    def features(
        self, value: Tensor, rows: Tensor | None = None, *, detach: bool = True
    ) -> Tensor:
        """Pool one layer's record (L2-normalised with ``normalize``), ``[B, F]``."""
        pooled = super().features(value, rows, detach=detach)
        return l2_rows(pooled) if self.normalize else pooled

    def fit_keep(self) -> dict[Any, Any]:
        """One pooled shared covariance per layer (non-finite samples counted).

        With an aggregation, also the pooled features and labels (a bank).
        """
        keep = {}
        for label in self.labels:
            stats: Any = SharedCovariance(self.num_classes)
            if self.aggregation is not None:
                stats = Tee(stats, Bank(dtype=_F64))
            keep[label] = Mapped(stats, self.features)
        return keep

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep each layer's class means and precision matrix (and the reference)."""
        self.means, self.precisions = [], []
        banks = []
        for label in self.labels:
            stats = result[label]
            if self.aggregation is not None:
                stats, bank = stats
                banks.append(bank)
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
            self.classes = seen.cpu()
        if self.aggregation is not None:
            self.reference = torch.stack(
                [self._own_distances(i, *bank) for i, bank in enumerate(banks)]
            )

    # -- per token (token="each") -------------------------------------------
    def token_values(self, result: Pass, label: DepthIdx) -> Tensor:
        """Return each token's features at ``label``, float64 ``[B, T, F]``."""
        value = result.outputs[label]
        if value.dim() < SEQUENCE_RANK:
            msg = (
                f"MahalanobisEnsemble: token='each' reads [B, T, ...] layers, but "
                f"{self.rnet.table[label].describe()} gives {list(value.shape)}"
            )
            raise ValueError(msg)
        flat = value.detach().reshape(*value.shape[:2], -1).to(_F64)
        return l2_rows(flat) if self.normalize else flat

    def fit_token_start(self) -> None:
        """Start each layer's streamed class statistics of the tokens."""
        self._token_stats = [SharedCovariance(None) for _ in self.labels]

    def fit_token_batch(self, result: Pass, keep: Tensor, target: Tensor) -> None:
        """Feed each layer the kept tokens' features and classes."""
        for label, stats in zip(self.labels, self._token_stats, strict=True):
            values = self.token_values(result, label)
            rows = keep.to(values.device)
            stats.update(values[rows], target.to(values.device)[rows])

    def fit_token_end(self) -> None:
        """Keep each layer's class means and precision (the same classes)."""
        if self._token_stats[0].count == 0:
            msg = "MahalanobisEnsemble.fit: the fit batches hold no real token"
            raise ValueError(msg)
        self.means, self.precisions = [], []
        for stats in (s.result() for s in self._token_stats):
            seen = torch.nonzero(stats.class_counts > 0).reshape(-1)
            self.means.append(stats.means[seen])
            cov = shrunk(stats.cov, self.shrinkage)
            self.precisions.append(torch.linalg.pinv(cov, hermitian=True))
            self.classes = seen.cpu()
        del self._token_stats

    def token_scores(self, result: Pass) -> Tensor:
        """Return each token's weighted sum of closest-class distances, ``[B, T]``."""
        total: Tensor | None = None
        for label, mean, precision, weight in zip(
            self.labels, self.means, self.precisions, self.weights, strict=True
        ):
            values = self.token_values(result, label)
            flat = values.reshape(-1, values.shape[2])
            part = weight * min_mahalanobis(flat, mean, precision)
            part = part.reshape(values.shape[:2])
            total = part if total is None else total + part
        assert total is not None  # noqa: S101 (resolve_labels: one layer at least)
        return total

    def _own_distances(self, layer: int, rows: Tensor, labels: Tensor) -> Tensor:
        """Return the fit samples' distances to their own class mean, sorted."""
        column = torch.searchsorted(self.classes, labels)
        own = torch.empty(rows.shape[0], dtype=_F64)
        for start in range(0, rows.shape[0], 4096):
            part = slice(start, start + 4096)
            distances = class_mahalanobis(
                rows[part], self.means[layer], self.precisions[layer]
            )
            own[part] = distances.gather(1, column[part, None])[:, 0].cpu()
        return own.sort().values

    def layer_class_scores(self, result: Pass) -> Tensor:
        """Return ``M_lc(x)`` per layer, sample and fitted class, ``[L, B, C']``."""
        return torch.stack(
            [self._layer_distances(i, result) for i in range(len(self.labels))]
        )

    def _layer_distances(
        self, layer: int, result: Pass, *, detach: bool = True
    ) -> Tensor:
        """Return ``M_lc`` of layer ``layer`` read in ``result``, ``[B, C']``."""
        value = result.outputs[self.labels[layer]]
        features = self.features(value, result.rows, detach=detach)
        return class_mahalanobis(features, self.means[layer], self.precisions[layer])

    def class_scores(self, result: Pass) -> Tensor:
        """Return each class's weighted distances summed, ``[batch, classes]``.

        With an aggregation: minus the combined p-values.
        """
        return self._combined(self.layer_class_scores(result), result)

    def _combined(self, per_layer: Tensor, result: Pass) -> Tensor:
        """Return the class scores from the per-layer distances ``[L, B, C']``."""
        width = class_count(int(self.classes.max()) + 1, result)
        if self.aggregation is None:
            weights = torch.tensor(self.weights, dtype=_F64, device=per_layer.device)
            summed = (per_layer * weights[:, None, None]).sum(dim=0)
            return spread_classes(summed, self.classes, width)
        reference = self.reference.to(per_layer.device)
        p = torch.stack(
            [
                p_values(ref, layer)
                for ref, layer in zip(reference, per_layer, strict=True)
            ]
        )
        # A class absent from the fit data scores +inf (conforms not at all).
        return spread_classes(-combine(p, self.aggregation, dim=0), self.classes, width)

    def closest_scores(self, result: Pass) -> Tensor:
        """Return the weighted sum of each layer's closest-class distance.

        With an aggregation: the lowest class score.
        """
        if self.aggregation is not None:
            return self.class_scores(result).amin(dim=1)
        return self.score_sum(result)

    def layer_scores(self, result: Pass) -> Tensor:
        """Return ``M_l(x)`` per sample and layer, ``[B, L]``."""
        return torch.stack(
            [
                min_mahalanobis(
                    self.features(result.outputs[label], result.rows), mean, precision
                )
                for label, mean, precision in zip(
                    self.labels, self.means, self.precisions, strict=True
                )
            ],
            dim=1,
        )

    def moved_distances(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass]:
        r"""Return $M_{lc}(\hat x_l)$, ``[L, B, C']``, and the pass of $x$.

        For ``epsilon > 0``.

        Each layer's own preprocessing, as scio's: one pass with autograd
        on, a backward pass per layer (the gradient of the distance to that
        layer's closest class), then a pass of each moved input $\hat x_l$.
        """
        moved, clean = gradient_step(
            self.rnet,
            args,
            kwargs,
            lambda result: [
                closest_class_sum(self._layer_distances(i, result, detach=False))
                for i in range(len(self.labels))
            ],
            epsilon=self.epsilon,
            who="MahalanobisEnsemble",
            outputs=self.labels,
        )
        per_layer = [
            self._layer_distances(
                i, run_pass(self.rnet, (x, *args[1:]), kwargs, outputs=[label])
            )
            for i, (x, label) in enumerate(zip(moved, self.labels, strict=True))
        ]
        return torch.stack(per_layer), clean

    def class_scores_inputs(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass]:
        """Return the class scores of the preprocessed inputs (``epsilon > 0``)."""
        per_layer, clean = self.moved_distances(args, kwargs)
        return self._combined(per_layer, clean), clean

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Score the preprocessed inputs (``epsilon > 0``), closest class per layer."""
        if self.at == "predicted":
            return super().score_inputs(args, kwargs)
        per_layer, _ = self.moved_distances(args, kwargs)
        weights = torch.tensor(self.weights, dtype=_F64, device=per_layer.device)
        return (per_layer.amin(dim=2) * weights[:, None]).sum(dim=0)

    def score_sum(self, result: Pass) -> Tensor:
        """Return the weighted sum of the per-layer closest-class distances."""
        per_layer = self.layer_scores(result)
        return per_layer @ torch.tensor(
            self.weights, dtype=_F64, device=per_layer.device
        )

    def config(self) -> dict[str, Any]:
        """Return the layers, pooling, weights, shrinkage (and the options set).

        ``normalize`` and ``aggregation`` only when set, so that the files
        saved before them load.
        """
        out = {
            **super().config(),
            "weights": self.weights,
            "shrinkage": self.shrinkage,
            **({"normalize": True} if self.normalize else {}),
            **({"reduce": self.reduce} if self.token_each else {}),
        }
        if self.aggregation is not None:
            out["aggregation"] = self.aggregation
        return out

    def state(self) -> dict[str, Tensor]:
        """Return the classes, means and precisions by layer index (and reference)."""
        out: dict[str, Tensor] = {"classes": self.classes}
        for i, (mean, precision) in enumerate(
            zip(self.means, self.precisions, strict=True)
        ):
            out[f"means.{i}"], out[f"precision.{i}"] = mean, precision
        if self.aggregation is not None:
            out["reference"] = self.reference
        return out

    def state_entries(self) -> dict[str, StateEntry]:
        """Per layer ``i``: ``means.i`` ``[classes, F_i]``, ``precision.i``.

        ``F_i`` the pooled features of layer ``i`` (:func:`~._layers.pooled_size`),
        float64; the same classes in every layer, ``classes`` ``[classes]``
        their labels; with an aggregation, ``reference`` ``[L, samples]``,
        the fit samples' sorted distances to their class mean.
        """
        out: dict[str, StateEntry] = {"classes": StateEntry(("classes",), torch.int64)}
        for i, label in enumerate(self.labels):
            f = pooled_size(self.rnet, label, self.pool)
            out[f"means.{i}"] = StateEntry(("classes", f), _F64)
            out[f"precision.{i}"] = StateEntry((f, f), _F64)
        if self.aggregation is not None:
            out["reference"] = StateEntry((len(self.labels), "samples"), _F64)
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the classes, means and precisions (and the reference)."""
        n = len(self.labels)
        self.classes = state["classes"]
        self.means = [state[f"means.{i}"] for i in range(n)]
        self.precisions = [state[f"precision.{i}"] for i in range(n)]
        if self.aggregation is not None:
            self.reference = state["reference"]


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
