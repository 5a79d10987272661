"""Detectors that read a layer's features: Mahalanobis, RMDS, KNN.

Features are a layer's output, or by default the input of the last
``nn.Linear`` the net calls (the penultimate features), flattened per sample
(:class:`~._layers.Features`); distances to the class means are those of
:mod:`._geometry`.
Fitting is one :func:`~scio_recorder.collect.collect` pass (ViM, in
:mod:`._vim`, takes two),
streaming: class statistics and covariances do not grow with the data (KNN
keeps its bank of features, which is what it is).
"""

from __future__ import annotations

__all__ = ["KNN", "RMDS", "Mahalanobis", "mahalanobis_scores"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import Concat, Covariance, SharedCovariance, Tee

from ._checks import (
    check_bank_k,
    check_count,
    check_feature_count,
    per_sample_size,
)
from ._classes import ClassConditional, check_at, class_count
from ._geometry import (
    class_mahalanobis,
    closest_class_sum,
    l2_rows,
    min_mahalanobis,
    spread_classes,
)
from ._inputs import check_epsilon, gradient_step
from ._layers import Features, Mapped
from ._protocol import Pass, run_pass
from ._saving import StateEntry
from ._search import check_search, nearest
from ._tokens import TokenScoring

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


def mahalanobis_scores(
    features: Tensor, class_means: Tensor, shared_cov: Tensor
) -> Tensor:
    r"""Return the Mahalanobis confidence score of each sample (Lee et al. 2018).

    $\mathrm{score}(f) = -\min_c (f - \mu_c)^\top S^+ (f - \mu_c)$, with $\mu_c$
    the class means, $S$ the covariance shared by the classes and $S^+$ its
    pseudo-inverse (the inverse when $S$ is invertible; the pseudo-inverse,
    as the reference implementation's ``pinvh``, keeps dead features of a
    ReLU layer, whose variance is zero, from breaking the score). Higher
    means more in-distribution. This is the single-layer detector without
    input preprocessing; feed it the ``means`` and ``cov`` of a
    :class:`~scio_recorder.reduce.SharedCovarianceResult`. The detector
    :class:`scio_recorder.ood.Mahalanobis` scores ``-mahalanobis_scores``
    (higher = more OoD, the convention of :mod:`scio_recorder.ood` and of
    :func:`scio_recorder.ood.metrics.auroc`).

    Computed in float64 on the device of ``features``, one class at a time
    (memory ``O(N F)``, no ``[N, C, F]`` tensor).

    Parameters
    ----------
    features : Tensor
        ``[N, F]``, or ``[N, ...]`` (flattened to ``[N, F]``).
    class_means : Tensor
        ``[C, F]``. Classes never seen in calibration (a zero count) should
        be dropped first, or they act as a class centred at their row.
    shared_cov : Tensor
        ``[F, F]``, symmetric positive semi-definite.

    Returns
    -------
    Tensor
        ``[N]``, float64; ``0`` for a sample at a class mean.

    Raises
    ------
    ValueError
        If the shapes do not match, or there is no class.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import mahalanobis_scores
    >>> means = torch.tensor([[0.0, 0.0], [10.0, 0.0]])
    >>> cov = torch.tensor([[4.0, 0.0], [0.0, 1.0]])
    >>> f = torch.tensor([[2.0, 0.0], [0.0, 2.0], [9.0, 1.0]])
    >>> mahalanobis_scores(f, means, cov)
    tensor([-1.0000, -4.0000, -1.2500], dtype=torch.float64)

    """
    flat = features.reshape(features.shape[0], -1).to(torch.float64)
    means = class_means.to(device=flat.device, dtype=torch.float64)
    cov = shared_cov.to(device=flat.device, dtype=torch.float64)
    num_features = flat.shape[1]
    is_matrix = means.dim() == 2  # noqa: PLR2004 (a matrix has two dims)
    if not is_matrix or means.shape[0] == 0 or means.shape[1] != num_features:
        msg = (
            f"mahalanobis_scores: class_means must be [C, {num_features}] with "
            f"C >= 1, got {list(means.shape)}"
        )
        raise ValueError(msg)
    if cov.shape != (num_features, num_features):
        msg = (
            f"mahalanobis_scores: shared_cov must be [{num_features}, "
            f"{num_features}], got {list(cov.shape)}"
        )
        raise ValueError(msg)
    precision = torch.linalg.pinv(cov, hermitian=True)
    return -min_mahalanobis(flat, means, precision)


class Mahalanobis(TokenScoring, ClassConditional, Features):
    r"""Mahalanobis distance to the closest class (Lee et al., NeurIPS 2018).

    ``fit`` computes the per-class means $\mu_c$ and the covariance $S$
    shared by the classes (tied, $W / N$) of the features of labelled
    in-distribution data, streaming; $\mathrm{score}(x) = \min_c (f -
    \mu_c)^\top S^+ (f - \mu_c)$, $S^+$ the pseudo-inverse (dead features of
    a ReLU layer have zero variance). The single-layer detector without
    input preprocessing. With ``normalize=True``, **Mahalanobis++** (Müller &
    Hein, ICML 2025): the same on the L2-normalised features
    $f / \|f\|_2$, to fit and to score (:func:`l2_rows`), which makes the
    features closer to the shared Gaussian the score assumes.

    Class-conditional (:class:`~scio_recorder.ood.ClassConditional`):
    ``score_classes(x)`` is $(f - \mu_c)^\top S^+ (f - \mu_c)$ for every class
    (``inf`` for a class absent from the fit data); ``at="predicted"`` reads
    it at the predicted class, as scio 1.1's ``DeepMahalanobis`` does, whose
    conformity is minus it times $(N - 1) / N$ (its covariance divides by
    $N - 1$).

    Input preprocessing (``epsilon > 0``; Lee et al.'s, scio's
    ``epsilon``): with $c^*$ the closest class of $x$, the input moves to
    $\hat x = x - \epsilon \, \mathrm{sign}(\nabla_x d_{c^*}(x))$ (gradient
    entries below the dtype's ``eps`` count as 0, as scio's; its default
    ``fgm_norm=inf`` is this sign step), and every class's score is that of
    $\hat x$; the predicted class stays the net's on $x$. It costs a forward
    and a backward pass with autograd on the input, then a forward on
    $\hat x$: the detector's own passes (:attr:`~Detector.own_passes`), as
    ODIN's. The fit is unchanged.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector, optional
        Features: that layer's output; default the input of the last
        ``nn.Linear``.
    num_classes : int, optional
        Class labels must lie in ``[0, num_classes)``; they are checked per
        batch before any statistic grows. Default: the number of logits of
        the net (its output ``[batch, C]``, else the ``out_features`` of its
        last ``nn.Linear``); when neither is known, labels are only checked
        to be non-negative.
    normalize : bool, default False
        Mahalanobis++: L2-normalise the features first.
    at : {"closest", "predicted"}
        Which class's distance is the score.
    epsilon : float, default 0.0
        Lee et al.'s input preprocessing (0: none, today's scores bit for
        bit): the input moves by $-\epsilon \, \mathrm{sign}(\nabla_x d(x))$,
        $d$ the distance to the closest class, and is scored moved
        (:meth:`class_scores_inputs`).
    token : {None, "each"}, default None
        ``"each"``: a score per token of a ``[B, T, D]`` layer
        (:mod:`~scio_recorder.ood._tokens`): every real token of the fit
        data is a sample of the streamed class statistics, ``fit(batches)``
        without a target fits one class, ``target="labels"`` (a ``[B, T]``
        batch key) or ``target="input_ids"`` a class per token;
        :meth:`score_tokens` gives ``[B, T]`` (NaN at the padding), ``score``
        reduces it by ``reduce``. Needs ``at="closest"``, no ``epsilon``.
    mask : str or int, optional
        With ``token="each"``: the net's argument holding the padding mask.
    reduce : {"mean", "max", "last"} or int, default "mean"
        With ``token="each"``: how ``score`` reduces a row's token scores
        (:func:`~scio_recorder.ood._tokens.reduce_tokens`).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> data = [(torch.randn(16, 3), torch.arange(16) % 2)]
    >>> maha = Mahalanobis(rnet).fit(data, target=1)
    >>> maha.means.shape, maha(torch.randn(5, 3)).shape
    (torch.Size([2, 4]), torch.Size([5]))
    >>> plus = Mahalanobis(rnet, normalize=True).fit(data, target=1)
    >>> plus.means.norm(dim=1).max() <= 1  # means of unit vectors
    tensor(True)
    >>> moved = Mahalanobis(rnet, epsilon=0.01).fit(data, target=1)
    >>> bool((moved(torch.randn(5, 3)) >= 0).all())
    True

    A score per token of a language model (``token="each"``):

    >>> import transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20)
    >>> lm = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (4, 6))
    >>> mask = torch.ones_like(ids)
    >>> rlm = Recorder(lm, input_data={"input_ids": ids})
    >>> per = Mahalanobis(rlm, token="each", mask="attention_mask")
    >>> per = per.fit([{"input_ids": ids, "attention_mask": mask}])
    >>> mask[0, :2] = 0  # a left-padded row
    >>> batch = {"input_ids": ids, "attention_mask": mask}
    >>> per.score_tokens(batch)[0, :3].isnan().tolist(), per(batch).shape
    ([True, True, False], torch.Size([4]))

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (the classes, the variants, the reading)
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        num_classes: int | None = None,
        normalize: bool = False,
        at: str = "closest",
        epsilon: float = 0.0,
        token: str | None = None,
        mask: int | str | None = None,
        reduce: str | int = "mean",
    ) -> None:
        """Resolve the features' layer; find or check the number of classes."""
        self.at = check_at(type(self).__name__, at)
        self.epsilon = check_epsilon(type(self).__name__, epsilon)
        self.own_passes = self.epsilon > 0
        super().__init__(rnet, layer)
        self.init_tokens(token, mask, reduce)
        if self.token_each and (at != "closest" or self.epsilon > 0):
            msg = (
                f"{type(self).__name__}: token='each' reads the closest class of "
                "each token, without input preprocessing: drop `at=` and `epsilon=`."
            )
            raise ValueError(msg)
        self.normalize = bool(normalize)
        if num_classes is None:
            # the net's logits; per token: the classes the fit's target shows
            num_classes = None if self.token_each else self.num_classes
        elif isinstance(num_classes, bool) or not isinstance(num_classes, int):
            msg = (
                f"{type(self).__name__}: num_classes must be an int >= 2, got "
                f"{num_classes!r}"
            )
            raise TypeError(msg)
        elif num_classes < 2:  # noqa: PLR2004 (class statistics need two classes)
            msg = (
                f"{type(self).__name__}: num_classes must be an int >= 2, got "
                f"{num_classes!r}"
            )
            raise ValueError(msg)
        self.num_classes: int | None = num_classes
        self.classes = torch.zeros(0, dtype=torch.int64)
        self.means = torch.zeros(0, 0, dtype=_F64)
        self.precision = torch.zeros(0, 0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Per-class means and the shared covariance."""
        stats = SharedCovariance(self.num_classes)
        return {self._keep_key(self.label, self.kind): self.normalised(stats)}

    def normalised(self, reducer: Any) -> Any:
        """Return ``reducer`` fed the L2-normalised features with ``normalize``."""
        return Mapped(reducer, l2_rows) if self.normalize else reducer

    def features(self, result: Pass) -> Tensor:
        """Return the pass's features ``[batch, F]`` (L2-normalised: ``normalize``)."""
        flat = super().features(result)
        return l2_rows(flat) if self.normalize else flat

    def config(self) -> dict[str, Any]:
        """Return the layer, and ``normalize`` when set.

        (Only when set, so that the files saved before the option load.)
        """
        return {
            **super().config(),
            **({"normalize": True} if self.normalize else {}),
            **self.token_config(),
        }

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the seen classes' means and the precision matrix."""
        self.fit_classes(result[self.label])

    # -- per token (token="each") -------------------------------------------
    def token_values(self, result: Pass) -> Tensor:
        """Return each token's features of a pass, float64 ``[B, T, F]``."""
        store = result.outputs if self.kind == "output" else result.inputs
        value = store[self.label]
        if value.dim() < 3:  # noqa: PLR2004 (a batch of token sequences)
            msg = (
                f"{type(self).__name__}: token='each' reads a [B, T, ...] layer, "
                f"but {self.rnet.table[self.label].describe()} gives "
                f"{list(value.shape)}; pick a layer of token features."
            )
            raise ValueError(msg)
        flat = value.detach().reshape(*value.shape[:2], -1).to(_F64)
        return l2_rows(flat) if self.normalize else flat

    def fit_token_start(self) -> None:
        """Start the streamed class statistics of the tokens."""
        self._token_stats = SharedCovariance(self.num_classes)

    def fit_token_batch(self, result: Pass, keep: Tensor, target: Tensor) -> None:
        """Feed the kept tokens' features and classes."""
        values = self.token_values(result)
        keep = keep.to(values.device)
        self._token_stats.update(values[keep], target.to(values.device)[keep])

    def fit_token_end(self) -> None:
        """Keep the classes' means and the precision."""
        stats = self._token_stats
        if stats.count == 0:
            msg = f"{type(self).__name__}.fit: the fit batches hold no real token"
            raise ValueError(msg)
        self.fit_classes(stats.result(), least=1)
        del self._token_stats

    def token_scores(self, result: Pass) -> Tensor:
        """Return each token's distance to its closest class, ``[B, T]``."""
        values = self.token_values(result)
        check_feature_count(
            self,
            self.label,
            self.kind,
            got=values.shape[2],
            expected=self.fitted_features(),
        )
        flat = values.reshape(-1, values.shape[2])
        distances = min_mahalanobis(flat, self.means, self.precision)
        return distances.reshape(values.shape[:2])

    def fit_classes(self, stats: Any, least: int = 2) -> None:
        """Keep the seen classes' means and the precision of a shared covariance."""
        seen = torch.nonzero(stats.class_counts > 0).reshape(-1)
        if seen.numel() < least:
            only = seen.tolist()
            msg = (
                f"{type(self).__name__} needs at least two classes in the fit "
                f"data; the targets hold only class {only[0] if only else 'none'}. "
                "Check `target=` and the batches."
            )
            raise ValueError(msg)
        self.classes = seen
        self.means = stats.means[seen]
        self.precision = torch.linalg.pinv(stats.cov, hermitian=True)

    def class_scores(self, result: Pass) -> Tensor:
        """Return the distance to each class mean, ``[batch, classes]``."""
        distances = class_mahalanobis(self.features(result), self.means, self.precision)
        return spread_classes(distances, self.classes, self.class_width(result))

    def class_width(self, result: Pass) -> int:
        """Return the number of classes scored: the net's logits, or the fitted."""
        return class_count(int(self.classes.max()) + 1, result)

    def closest_scores(self, result: Pass) -> Tensor:
        """Return the distance to the closest class mean."""
        return min_mahalanobis(self.features(result), self.means, self.precision)

    def class_scores_inputs(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass]:
        """Return the class scores of the preprocessed input, and the pass of ``x``.

        ``epsilon > 0`` only: one step against the gradient of the score at
        the closest class (:func:`~._inputs.gradient_step`), then a
        pass of the moved input.
        """
        outputs, inputs = self.outputs(), self.inputs()
        (moved,), clean = gradient_step(
            self.rnet,
            args,
            kwargs,
            lambda result: [closest_class_sum(self.class_scores(result))],
            epsilon=self.epsilon,
            who=type(self).__name__,
            outputs=outputs,
            inputs=inputs,
        )
        result = run_pass(
            self.rnet, (moved, *args[1:]), kwargs, outputs=outputs, inputs=inputs
        )
        return self.class_scores(result), clean

    def state(self) -> dict[str, Tensor]:
        """Return the classes, means and precision."""
        return {
            "classes": self.classes,
            "means": self.means,
            "precision": self.precision,
        }

    def state_entries(self) -> dict[str, StateEntry]:
        """Classes seen ``[C]``, means ``[C, F]``, precision ``[F, F]``."""
        f = self.feature_count()
        if self.token_each:
            size = per_sample_size(self.rnet, self.label, self.kind)
            f = None if size is None else math.prod(size[1:])
        return {
            "classes": StateEntry(("classes",), torch.int64),
            "means": StateEntry(("classes", f), _F64),
            "precision": StateEntry((f, f), _F64),
        }

    def fitted_features(self) -> int:
        """Return the features' size of the means."""
        return int(self.means.shape[1])

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the classes, means and precision."""
        self.classes, self.means = state["classes"], state["means"]
        self.precision = state["precision"]


class RMDS(Mahalanobis):
    r"""Relative Mahalanobis distance (Ren et al., 2021).

    ``fit`` (labelled in-distribution data, ``target=`` needed) takes the
    class means $\mu_c$ and tied covariance $S$ as :class:`Mahalanobis`
    does, and the background Gaussian of all the features, class-agnostic:
    mean $\mu_0$, covariance $S_0$ (population, $/ N$); both streaming,
    in one pass. With $\mathrm{MD}_c(f) = (f - \mu_c)^\top S^+ (f - \mu_c)$ and
    $\mathrm{MD}_0(f) = (f - \mu_0)^\top S_0^+ (f - \mu_0)$: $\mathrm{score}(x) =
    \min_c (\mathrm{MD}_c(f) - \mathrm{MD}_0(f))$.

    With ``normalize=True``, **RMDS++** (Müller & Hein, ICML 2025): the same
    on the L2-normalised features $f / \|f\|_2$ (both Gaussians, and the
    scored features).

    Where our reading decided: pseudo-inverses (dead ReLU features have zero
    variance). pytorch-ood 0.4 (``RMD``) divides neither covariance by $N$
    and adds a $10^{-6}$ ridge before inverting, so its scores are ours
    divided by $N$ (the same ranking), up to the ridge.

    Class-conditional: ``score_classes(x)`` is $\mathrm{MD}_c(f) -
    \mathrm{MD}_0(f)$ for every class; scio 1.1's ``RelativeMahalanobis``
    reads it at the predicted class (``at="predicted"``), its conformity
    minus it times $(N - 1) / N$ (both its covariances divide by $N - 1$).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector, optional
        Features: that layer's output; default the input of the last
        ``nn.Linear``.
    normalize : bool, default False
        RMDS++: L2-normalise the features first.
    at : {"closest", "predicted"}
        Which class's relative distance is the score.
    epsilon : float, default 0.0
        Lee et al.'s input preprocessing, as :class:`Mahalanobis`' (the
        step lowers the relative distance to the closest class,
        $\mathrm{MD}_{c^*}(f) - \mathrm{MD}_0(f)$, as scio's
        ``RelativeMahalanobis``).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> data = [(torch.randn(32, 3), torch.arange(32) % 2)]
    >>> rmds = RMDS(rnet).fit(data, target=1)
    >>> rmds.background_mean.shape, rmds(torch.randn(5, 3)).shape
    (torch.Size([4]), torch.Size([5]))

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        normalize: bool = False,
        at: str = "closest",
        epsilon: float = 0.0,
    ) -> None:
        """Resolve the features' layer."""
        super().__init__(rnet, layer, normalize=normalize, at=at, epsilon=epsilon)
        self.background_mean = torch.zeros(0, dtype=_F64)
        self.background_precision = torch.zeros(0, 0, dtype=_F64)

    def fit_keep(self) -> dict[Any, Any]:
        """Class statistics and the class-agnostic covariance of the same records."""
        both = Tee(SharedCovariance(self.num_classes), Covariance())
        return {self._keep_key(self.label, self.kind): self.normalised(both)}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the class and the background Gaussians."""
        classes, background = result[self.label]
        self.fit_classes(classes)
        self.background_mean = background.mean.reshape(-1)
        self.background_precision = torch.linalg.pinv(
            background.cov_population, hermitian=True
        )

    def background(self, f: Tensor) -> Tensor:
        """Return the distance to the background Gaussian, ``MD_0(f)``."""
        return min_mahalanobis(
            f, self.background_mean[None, :], self.background_precision
        )

    def class_scores(self, result: Pass) -> Tensor:
        """Return each class's distance minus the background distance."""
        f = self.features(result)
        distances = class_mahalanobis(f, self.means, self.precision)
        relative = distances - self.background(f)[:, None]
        return spread_classes(relative, self.classes, self.class_width(result))

    def closest_scores(self, result: Pass) -> Tensor:
        """Return the smallest class distance minus the background distance."""
        f = self.features(result)
        return min_mahalanobis(f, self.means, self.precision) - self.background(f)

    def state(self) -> dict[str, Tensor]:
        """Return the class statistics and the background Gaussian."""
        return {
            **super().state(),
            "background_mean": self.background_mean,
            "background_precision": self.background_precision,
        }

    def state_entries(self) -> dict[str, StateEntry]:
        """Return Mahalanobis' entries, the background mean ``[F]`` and precision."""
        f = self.feature_count()
        return {
            **super().state_entries(),
            "background_mean": StateEntry((f,), _F64),
            "background_precision": StateEntry((f, f), _F64),
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the class statistics and the background Gaussian."""
        super().load_state(state)
        self.background_mean = state["background_mean"]
        self.background_precision = state["background_precision"]


# ----------------------------------------------------------------- fDBD
class KNN(Features):
    """Distance to the k-th nearest training feature (Sun et al., ICML 2022).

    Features are L2-normalised; ``fit`` keeps those of the in-distribution
    data (a bank of ``N x F`` float32; ``collect`` spills it to disk beyond a
    ``memory_budget``); ``score(x)`` is the Euclidean distance of ``x``'s
    normalised features to its ``k``-th nearest in the bank (the shared
    search, :func:`~scio_recorder.ood._search.nearest`: exact, in blocks of
    bounded memory, faiss when installed). scio 1.1's ``KNN`` conformity
    is minus its square.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector, optional
        Features: that layer's output; default the input of the last
        ``nn.Linear``.
    k : int, default 1
        The neighbour whose distance is the score. pytorch-ood 0.4's default
        and the paper's on CIFAR-10 (50,000 training images) is 50; here it
        is 1, because the k-th neighbour must stay among the sample's own
        class for the distance to tell ID from OoD, and with a bank of a few
        hundred samples per class a k of 50 reaches across classes. On the
        digits benchmark (:func:`~scio_recorder.ood.benchmark.run_benchmark`:
        541 training digits, about 90 per class; seeds 0-2, measured in one
        run, ``benchmarks/knn_k.py``), the AUROC against the unseen
        digits 6-9 was 0.932 ± 0.038 with ``k=1``, 0.940 ± 0.041 with
        ``k=5``, 0.933 ± 0.042 with ``k=10`` and 0.880 ± 0.063 with
        ``k=50`` (far-OoD mean: 0.911, 0.911, 0.902, 0.840). With a bank of
        tens of thousands, pass ``k=50`` as the paper does.
    backend : {"auto", "torch", "faiss"}
        The search's; ``"auto"``: faiss when installed, for CPU features.
    search_budget : int, optional
        Bytes for a block of the search; default 128 MiB.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> knn = KNN(Recorder(net, input_size=(1, 3)), k=3)
    >>> knn.fit([torch.randn(16, 3)], input=None).bank.shape
    torch.Size([16, 4])

    """

    needs_fit: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        k: int = 1,
        backend: str = "auto",
        search_budget: int | None = None,
    ) -> None:
        """Resolve the features' layer; check ``k`` and the search options."""
        check_count("KNN", "k", k, low=1)
        check_search("KNN", backend, search_budget)
        super().__init__(rnet, layer)
        self.k = k
        self.backend, self.search_budget = backend, search_budget
        self.bank = torch.zeros(0, 0)

    def fit_keep(self) -> dict[Any, Any]:
        """Every feature row."""
        return {self._keep_key(self.label, self.kind): Concat()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the normalised features."""
        rows = result[self.label]
        flat = rows.reshape(rows.shape[0], -1)
        bank = torch.nn.functional.normalize(flat.float(), dim=1)
        check_bank_k("KNN", self.k, bank.shape[0])
        self.bank = bank

    def score_pass(self, result: Pass) -> Tensor:
        """Return the distance to the k-th nearest bank feature."""
        z = torch.nn.functional.normalize(self.features(result).float(), dim=1)
        found = nearest(
            z,
            self.bank,
            self.k,
            backend=self.backend,
            memory_budget=self.search_budget,
        )
        return found.values[:, -1].sqrt()

    def config(self) -> dict[str, Any]:
        """Return the layer and ``k``."""
        return {**super().config(), "k": self.k}

    def state(self) -> dict[str, Tensor]:
        """Return the bank."""
        return {"bank": self.bank}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the normalised features ``[N, F]``, float32."""
        return {"bank": StateEntry(("samples", self.feature_count()), torch.float32)}

    def fitted_features(self) -> int:
        """Return the features' size of the bank."""
        return int(self.bank.shape[1])

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the bank."""
        check_bank_k("KNN", self.k, state["bank"].shape[0])
        self.bank = state["bank"]
