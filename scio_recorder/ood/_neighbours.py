"""Detectors from the nearest fit samples: LID, Trust, DkNN (JTLA in ``_jtla``).

Each keeps a bank of the fit samples' features (and their class labels)
and looks up a sample's nearest ones with the shared search
(:func:`~._search.nearest`: exact, in blocks of bounded memory, faiss when
installed). Fitting is one streaming :func:`~scio_recorder.collect.collect`
pass that keeps the features (:class:`Bank`); what needs the whole bank (a
fit sample's neighbours among the others, leaving itself out) is computed
after it. **The bank grows with the fit data** (``N x F`` float32), as
KNN's: fit on a subset of a large training set.

Conventions follow scio 1.1 (``scio.scores``), each mapping said on the
detector: squared Euclidean distances where scio's faiss index gives them,
features flattened and not normalised unless ``act_norm=``, multi-layer
features per layer (``pool=None`` flattens a feature map as scio does;
``pool="mean"``, our default for every multi-layer detector, averages it
per channel).
"""

from __future__ import annotations

__all__ = ["LID", "DkNN", "Trust", "lid_estimate", "trust_scores"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.reduce import Concat

from ._bank import Bank
from ._checks import check_count
from ._classes import ClassConditional, check_at, class_count
from ._layers import TOKENS, Features, Neighbourhoods, enough_samples, label_counts
from ._pvalues import check_aggregation, combine, p_values
from ._saving import StateEntry
from ._search import check_search, nearest
from ._tokens import TokenScoring

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._protocol import Pass

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64


# ----------------------------------------------------------------- LID
def lid_estimate(squared: Tensor) -> Tensor:
    """Return the maximum-likelihood LID of each row of squared distances.

    ``squared`` ``[Q, k]``, the squared distances to the ``k`` nearest
    neighbours, increasing. With ``r_i`` the distances: ``LID = -1 / ((1 /
    k) sum_i log(r_i / r_k))`` (Amsaleg et al. 2015; Ma et al., ICLR 2018),
    ``0`` where the nearest distance is 0 and ``inf`` where all are equal
    (scio's conventions).

    Examples
    --------
    >>> import torch
    >>> lid_estimate(torch.tensor([[1.0, 4.0], [0.0, 1.0]]))
    tensor([2.8854, 0.0000])

    """
    k = squared.shape[1]
    ratios = squared[:, -1:] / squared
    # log of squared distances: twice the log of distances.
    estimate = 2 * k / ratios.log().sum(dim=1)
    at_a_sample = squared[:, 0] == 0
    zero = torch.zeros((), dtype=estimate.dtype, device=estimate.device)
    # `nan_to_num` would also turn `inf` into the largest float: keep it `inf`
    estimate = torch.where(at_a_sample, zero, estimate)
    return estimate.nan_to_num(nan=math.inf, posinf=math.inf, neginf=-math.inf)


class LID(Features):
    r"""Local intrinsic dimensionality (Ma et al., ICLR 2018), as scio 1.1 scores it.

    ``fit`` keeps the features of the fit data (a bank of $N \times F$ float32,
    spilled to disk by ``collect`` beyond a ``memory_budget``; no labels).
    ``score(x)`` is the maximum-likelihood estimate of the local intrinsic
    dimensionality at ``x`` from its ``k`` nearest bank features,
    :func:`lid_estimate`: higher = the neighbourhood is spread in more
    dimensions than the data's, more OoD.

    scio 1.1's ``LID`` conformity is minus this score (it estimates from
    squared distances and doubles: the same number). Features are not
    normalised (scio's ``act_norm=None``), the distances Euclidean.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net.
    layer : selector, optional
        Features: that layer's output; default the input of the last
        ``nn.Linear``.
    k : int
        Neighbours, at least 2 (with 1 the estimate is always infinite).
    backend : {"auto", "torch", "faiss"}
        The search's (:func:`~scio_recorder.ood._search.nearest`).
    search_budget : int, optional
        Bytes for a block of the search; default 128 MiB.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> lid = LID(Recorder(net, input_size=(1, 3)), k=5)
    >>> lid.fit([torch.randn(64, 3)], input=None)(torch.randn(4, 3)).shape
    torch.Size([4])

    """

    needs_fit: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        k: int,
        backend: str = "auto",
        search_budget: int | None = None,
    ) -> None:
        """Resolve the features' layer; check ``k`` and the search options."""
        check_count("LID", "k", k, low=1)
        if k < 2:  # noqa: PLR2004 (an estimate from one neighbour is infinite)
            msg = f"LID: k must be at least 2 (one distance gives no estimate), got {k}"
            raise ValueError(msg)
        check_search("LID", backend, search_budget)
        super().__init__(rnet, layer)
        self.k = k
        self.backend, self.search_budget = backend, search_budget
        self.bank = torch.zeros(0, 0)

    def fit_keep(self) -> dict[Any, Any]:
        """Every feature row."""
        return {self._keep_key(self.label, self.kind): Concat()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the features (float32)."""
        rows = result[self.label]
        flat = rows.reshape(rows.shape[0], -1)
        enough_samples("LID", self.k, flat.shape[0])
        self.bank = flat.to(_F32)

    def score_pass(self, result: Pass) -> Tensor:
        """Return the LID estimate from the ``k`` nearest bank features."""
        found = nearest(
            self.features(result).to(_F32),
            self.bank,
            self.k,
            backend=self.backend,
            memory_budget=self.search_budget,
        )
        return lid_estimate(found.values)

    def config(self) -> dict[str, Any]:
        """Return the layer and ``k``."""
        return {**super().config(), "k": self.k}

    def state(self) -> dict[str, Tensor]:
        """Return the bank."""
        return {"bank": self.bank}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the features ``[N, F]``, float32."""
        return {"bank": StateEntry(("samples", self.feature_count()), _F32)}

    def fitted_features(self) -> int:
        """Return the features' size of the bank."""
        return int(self.bank.shape[1])

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the bank."""
        enough_samples("LID", self.k, state["bank"].shape[0])
        self.bank = state["bank"]


# ----------------------------------------------------------------- Trust
def trust_scores(distances: Tensor) -> Tensor:
    """Return each class's trust: the closest *other* class's distance over its own.

    ``distances`` ``[Q, C]``, to each class's high-density set: ``trust_c =
    min_{c' != c} d_c' / d_c`` (Jiang et al., NeurIPS 2018, Algorithm 2);
    ``0 / 0`` (two sets at distance 0, or none reachable) is 1, as in scio.

    Examples
    --------
    >>> import torch
    >>> trust_scores(torch.tensor([[1.0, 2.0, 4.0]]))
    tensor([[2.0000, 0.5000, 0.2500]])

    """
    two = distances.topk(2, dim=1, largest=False).values
    first, second = two[:, :1], two[:, 1:]
    # The closest other class: the second for the closest class (unless two
    # share the smallest distance), the closest for every other class.
    closest = (distances == first) & (second > first)
    other = torch.where(closest, second, first)
    trust = other / distances  # `inf` stays `inf` (a class out of reach)
    return trust.nan_to_num(nan=1.0, posinf=math.inf, neginf=-math.inf)


class Trust(ClassConditional, Features):
    r"""Trust score (Jiang et al., NeurIPS 2018), as scio 1.1 computes it.

    ``fit`` (labelled in-distribution data, ``target=`` needed) keeps, per
    class, the **alpha-high-density set** of its fit features: the class's
    samples without the fraction ``alpha`` whose ``k``-th nearest neighbour
    within the class (leaving the sample itself out) is farthest
    ($\lfloor \alpha n_c \rfloor$ removed; among equal distances the earlier
    sample first). With $d_c(x)$ the Euclidean distance of $x$'s features to
    the nearest point of class $c$'s set: $\mathrm{trust}_c(x) = \min_{c' \ne c}
    d_{c'}(x) / d_c(x)$ (:func:`trust_scores`), and ``score_classes(x)`` $=
    -\mathrm{trust}_c(x)$. ``score(x)`` $= -\mathrm{trust}$: at the closest class
    (default; its trust is the ratio of the two smallest distances, at least
    1) or at the predicted one (``at="predicted"``, the paper's and scio's
    reading).

    A class without fit samples is at distance ``inf``. Features are not
    normalised (scio's ``act_norm=None``).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier).
    layer : selector, optional
        Features: that layer's output; default the input of the last
        ``nn.Linear``.
    alpha : float
        The fraction of each class's fit samples left out, in ``[0, 1)``.
    k : int, default 10
        The neighbour whose distance measures density (scio's default).
    at : {"closest", "predicted"}
        Which class's trust is the score.
    backend, search_budget
        The search's options (:func:`~scio_recorder.ood._search.nearest`).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> trust = Trust(Recorder(net, input_size=(1, 3)), alpha=0.1, k=3)
    >>> trust.fit([(torch.randn(40, 3), torch.arange(40) % 2)], target=1)
    Trust(layer=[1, 3], features='input', alpha=0.1, k=3, fitted)
    >>> trust.score_classes(torch.randn(4, 3)).shape
    torch.Size([4, 2])

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (scio's hyperparameters and the search's)
        self,
        rnet: Recorder,
        layer: Selector | None = None,
        *,
        alpha: float,
        k: int = 10,
        at: str = "closest",
        backend: str = "auto",
        search_budget: int | None = None,
    ) -> None:
        """Resolve the features' layer; check the hyperparameters."""
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, int | float)
            or not 0 <= alpha < 1
        ):
            msg = f"Trust: alpha must be a fraction in [0, 1), got {alpha!r}"
            raise ValueError(msg)
        check_count("Trust", "k", k, low=1)
        self.at = check_at("Trust", at)
        check_search("Trust", backend, search_budget)
        super().__init__(rnet, layer)
        self.alpha, self.k = float(alpha), k
        self.backend, self.search_budget = backend, search_budget
        self.bank = torch.zeros(0, 0)
        self.class_sizes = torch.zeros(0, dtype=_I64)

    def fit_keep(self) -> dict[Any, Any]:
        """Every feature row and its label."""
        return {self._keep_key(self.label, self.kind): Bank()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep each class's alpha-high-density set, the classes one after another."""
        rows, labels = result[self.label]
        assert labels is not None  # noqa: S101 (needs_target: fit passes labels)
        seen = torch.unique(labels).tolist()
        if len(seen) < 2:  # noqa: PLR2004 (trust compares with another class)
            msg = (
                "Trust needs fit samples of at least two classes (a class's trust "
                "is the distance to the closest *other* class over its own); the "
                f"targets hold only class {seen[0] if seen else 'none'}. Check "
                "`target=` and the batches."
            )
            raise ValueError(msg)
        classes = max(self.num_classes or 0, int(labels.max()) + 1)
        kept, sizes = [], []
        for c in range(classes):
            population = rows[labels == c]
            kept.append(self._dense(population, c))
            sizes.append(kept[-1].shape[0])
        self.bank = torch.cat(kept)
        self.class_sizes = torch.tensor(sizes, dtype=_I64)

    def _dense(self, population: Tensor, c: int) -> Tensor:
        """Return the class's samples without the ``floor(alpha n)`` least dense."""
        n = population.shape[0]
        drop = int(self.alpha * n)
        if drop == 0:
            return population
        if self.k > n - 1:
            msg = (
                f"Trust: class {c} has {n} fit samples, so a sample has {n - 1} "
                f"other ones, fewer than k={self.k}: fit on more data of that "
                "class, or lower k (or alpha=0, which needs no neighbours)."
            )
            raise ValueError(msg)
        kth = nearest(
            population,
            population,
            self.k,
            exclude=torch.arange(n),
            backend=self.backend,
            memory_budget=self.search_budget,
        ).values[:, -1]
        # Remove the largest k-th distances; among equal ones the earlier sample.
        removed = torch.sort(kth, descending=True, stable=True).indices[:drop]
        keep = torch.ones(n, dtype=torch.bool)
        keep[removed] = False
        return population[keep]

    def distances(self, result: Pass) -> Tensor:
        """Return the distance to each class's dense set, ``[batch, classes]``."""
        z = self.features(result).to(_F32)
        columns, start = [], 0
        for size in self.class_sizes.tolist():
            if size == 0:
                columns.append(torch.full((z.shape[0],), math.inf, device=z.device))
            else:
                found = nearest(
                    z,
                    self.bank[start : start + size],
                    1,
                    backend=self.backend,
                    memory_budget=self.search_budget,
                )
                columns.append(found.values[:, 0].sqrt())
            start += size
        return torch.stack(columns, dim=1)

    def class_scores(self, result: Pass) -> Tensor:
        """Return minus the trust of each class."""
        d = self.distances(result)
        width = class_count(d.shape[1], result)
        if width > d.shape[1]:
            pad = d.new_full((d.shape[0], width - d.shape[1]), math.inf)
            d = torch.cat([d, pad], dim=1)
        return -trust_scores(d)

    def config(self) -> dict[str, Any]:
        """Return the layer, ``alpha`` and ``k``."""
        return {**super().config(), "alpha": self.alpha, "k": self.k}

    def state(self) -> dict[str, Tensor]:
        """Return the kept features and the number of each class's."""
        return {"bank": self.bank, "class_sizes": self.class_sizes}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the kept features ``[M, F]`` (float32), one class after another.

        And ``class_sizes`` ``[classes]``, how many rows each class has.
        """
        return {
            "bank": StateEntry(("kept", self.feature_count()), _F32),
            "class_sizes": StateEntry(("classes",), _I64),
        }

    def fitted_features(self) -> int:
        """Return the features' size of the bank."""
        return int(self.bank.shape[1])

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the kept features and the class sizes (they must add up)."""
        if int(state["class_sizes"].sum()) != state["bank"].shape[0]:
            msg = (
                f"Trust: the class sizes add up to {int(state['class_sizes'].sum())} "
                f"rows but the bank has {state['bank'].shape[0]}; the state was "
                "edited. Save the fitted detector again."
            )
            raise ValueError(msg)
        self.bank, self.class_sizes = state["bank"], state["class_sizes"]


class DkNN(TokenScoring, Neighbourhoods):
    r"""Deep k-nearest neighbours (Papernot & McDaniel, 2018), as scio 1.1 scores it.

    ``fit`` (labelled in-distribution data, ``target=`` needed) keeps, for
    each layer of ``layers`` (read in one pass), the fit samples' features
    and labels. The conformity of ``x`` to class ``c`` counts the fit
    samples of class ``c`` among the ``k`` nearest neighbours of ``x``'s
    features, layer by layer:

    * ``aggregation=None`` (scio's default): the counts summed over the
      layers, $\sum_l n_{lc}(x)$;
    * ``aggregation=<name>`` (scio's ``per_layer=True``): each layer's count
      becomes a p-value against the fit samples' own counts, *leaving each
      sample out of its own neighbours* ($p_{lc} = \#\{i : a_{li} < n_{lc}(x)\}
      / N$, $a_{li}$ the neighbours of fit sample $i$ of its class: fewer
      agreeing neighbours than ``x`` has), and the layers' p-values are
      combined by the named rule (:func:`~._pvalues.combine`: ``"fisher"``
      sums their logs, ...).

    ``score_classes(x) = -conformity``; ``score(x)`` at the closest class
    (the one with the highest conformity; default) or the predicted one
    (``at="predicted"``, scio's reading).

    Where our reading decided: features are pooled per layer as for every
    multi-layer detector (``pool="mean"``); ``pool=None`` flattens them as
    scio does. scio's ``per_class`` calibration is not offered. Neighbours
    at equal distances: the earlier fit sample first.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier).
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    k : int
        Neighbours per layer.
    aggregation : str, optional
        ``None`` or one of :data:`~._pvalues.AGGREGATIONS`.
    at : {"closest", "predicted"}
        Which class's conformity is the score.
    act_norm : float, optional
        Divide each sample's features by their ``act_norm``-norm (scio's
        option; default as scio's DkNN: none).
    index_metric : {"l2", "ip"}
        Euclidean neighbours or largest inner products (scio's option).
    pool, token, mask
        How a layer's output becomes features
        (:func:`~scio_recorder.ood._layers.pool_features`). ``token="each"``:
        a score per token of ``[B, T, D]`` layers
        (:mod:`~scio_recorder.ood._tokens`): the bank holds every real
        token of the fit data (a bank: it grows with the tokens), a class
        per token from ``target="labels"`` or ``"input_ids"`` (one class
        without a target), ``score_tokens`` ``[B, T]``; needs
        ``aggregation=None`` and ``at="closest"``.
    reduce : {"mean", "max", "last"} or int, default "mean"
        With ``token="each"``: how ``score`` reduces a row's token scores.
    backend, search_budget
        The search's options (:func:`~scio_recorder.ood._search.nearest`).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> _ = torch.manual_seed(0)
    >>> rnet = Recorder(demo_model(3), input_size=(1, 3, 32, 32))
    >>> data = [(torch.randn(24, 3, 32, 32), torch.arange(24) % 3)]
    >>> dknn = DkNN(rnet, ["features.1", "features.4"], k=5, aggregation="fisher")
    >>> dknn.fit(data, target=1).score_classes(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 3])

    """

    TOKENS: ClassVar[tuple[str, ...]] = (*TOKENS, "each")

    def __init__(  # noqa: PLR0913 (scio's hyperparameters, pooling and search)
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        k: int,
        reduce: str | int = "mean",
        aggregation: str | None = None,
        at: str = "closest",
        act_norm: float | None = None,
        index_metric: str = "l2",
        pool: str | None = "mean",
        token: str = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
        backend: str = "auto",
        search_budget: int | None = None,
    ) -> None:
        """Resolve the layers; check the hyperparameters."""
        self.k = check_count("DkNN", "k", k, low=1)
        check_aggregation("DkNN", aggregation, none=True)
        self.aggregation = aggregation
        super().__init__(
            rnet,
            layers,
            at=at,
            act_norm=act_norm,
            index_metric=index_metric,
            pool=pool,
            token=token,
            mask=mask,
            backend=backend,
            search_budget=search_budget,
        )
        self.init_tokens("each" if token == "each" else None, mask, reduce)  # noqa: S105 (not a password)
        if self.token_each and (aggregation is not None or at != "closest"):
            msg = (
                "DkNN: token='each' counts each token's neighbours of its closest "
                "class: drop `aggregation=` and `at=`."
            )
            raise ValueError(msg)
        if self.token_each:
            self.num_classes = None  # the classes the fit's target shows
        self.class_count = 0
        self.calibration = torch.zeros(0, 0)

    # -- per token (token="each") -------------------------------------------
    def fit_token_start(self) -> None:
        """Start the banks of tokens."""
        self.token_bank_start()

    def fit_token_batch(self, result: Pass, keep: Tensor, target: Tensor) -> None:
        """Keep the real tokens' features and classes."""
        self.token_bank_batch(result, keep, target)

    def fit_token_end(self) -> None:
        """Set the banks, their classes and the class count."""
        self.token_bank_end()
        enough_samples("DkNN", self.k, int(self.bank_labels.shape[0]))
        self.class_count = int(self.bank_labels.max()) + 1

    def token_scores(self, result: Pass) -> Tensor:
        """Return minus each token's agreeing neighbours at its closest class."""
        shape = result.outputs[self.labels[0]].shape[:2]
        counts = None
        for bank, label in zip(self.banks, self.labels, strict=True):
            queries = self.token_features(result, label)
            near = self.search(queries, bank, self.k)
            found = label_counts(self.bank_labels, near, self.class_count)
            counts = found if counts is None else counts + found
        assert counts is not None  # noqa: S101 (resolve_labels: one layer at least)
        return -counts.amax(dim=1).to(_F64).reshape(shape)

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the banks; with an aggregation, the fit samples' own counts."""
        self.keep_banks(result)
        n = self.bank_labels.shape[0]
        enough_samples("DkNN", self.k, n, loo=self.aggregation is not None)
        self.class_count = self.classes()
        if self.aggregation is None:
            return
        calibration = []
        for bank in self.banks:
            near = self.search(bank, bank, self.k, exclude=torch.arange(n))
            agree = (self.bank_labels[near] == self.bank_labels[:, None]).sum(dim=1)
            # As scores (higher = more OoD), sorted: minus the agreeing counts.
            calibration.append((-agree.to(_F64)).sort().values)
        self.calibration = torch.stack(calibration)

    def conformity(self, result: Pass) -> Tensor:
        """Return the conformity to each class, ``[batch, classes]`` (float64)."""
        width = class_count(self.class_count, result)
        counts = [
            label_counts(self.bank_labels, self.search(z, bank, self.k), width)
            for z, bank in zip(self.layer_features(result), self.banks, strict=True)
        ]
        if self.aggregation is None:
            return torch.stack(counts).sum(dim=0).to(_F64)
        p = torch.stack(
            [
                p_values(reference.to(n.device), -n.to(_F64), ties=False)
                for reference, n in zip(self.calibration, counts, strict=True)
            ]
        )
        return combine(p, self.aggregation, dim=0)

    def class_scores(self, result: Pass) -> Tensor:
        """Return minus the conformity to each class."""
        return -self.conformity(result)

    def config(self) -> dict[str, Any]:
        """Return the layers, pooling, ``k`` and the aggregation."""
        out = {**super().config(), "k": self.k, "aggregation": self.aggregation}
        return {**out, **({"reduce": self.reduce} if self.token_each else {})}

    def state(self) -> dict[str, Tensor]:
        """Return the banks, labels, class count and calibration."""
        out = {f"bank.{i}": bank for i, bank in enumerate(self.banks)}
        out["labels"] = self.bank_labels
        out["class_count"] = torch.tensor([self.class_count], dtype=_I64)
        if self.aggregation is not None:
            out["calibration"] = self.calibration
        return out

    def state_entries(self) -> dict[str, StateEntry]:
        """Per layer ``i`` ``bank.i``; ``labels``, ``class_count``, ``calibration``.

        ``calibration`` ``[layers, samples]`` (with an aggregation): minus
        each fit sample's agreeing neighbours, sorted.
        """
        out = self.bank_entries()
        out["class_count"] = StateEntry((1,), _I64)
        if self.aggregation is not None:
            out["calibration"] = StateEntry((len(self.labels), "samples"), _F64)
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the banks, labels and calibration."""
        self.banks = [state[f"bank.{i}"] for i in range(len(self.labels))]
        self.bank_labels = state["labels"]
        self.class_count = int(state["class_count"][0])
        if self.aggregation is not None:
            self.calibration = state["calibration"]
