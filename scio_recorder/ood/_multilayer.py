"""A multi-layer detector, read in one pass: MahalanobisEnsemble.

It reads any number of layers (``layers=[...]``) in **one** forward pass of
the unmodified net, pooled per layer, as every multi-layer detector does
(:class:`~._layers.MultiLayer`: the layers, the pooling, the padding mask).
Fitting is one :func:`~scio_recorder.collect.collect` pass with one reducer
per layer (streaming, bounded memory); each reducer sees the layer's
output through :class:`~._layers.Mapped` (pooling, Gram statistics, ...).
"""

from __future__ import annotations

__all__ = ["MahalanobisEnsemble"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import SharedCovariance, Tee

from ._bank import Bank
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
    from collections.abc import Mapping, Sequence

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
