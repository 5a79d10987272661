"""JTLA: joint statistical testing across layers (Raghuram et al., ICML 2021).

Per layer, the classes of a sample's ``k`` nearest fit samples are a count
vector; each class has an expected count vector (the fit samples of that
class, each among the others); a test measures how far the sample's counts
lie from a class's expectation (:func:`multinomial_tests`). Each layer's
test becomes a p-value against the fit samples' own tests, the layers'
p-values are combined (:mod:`._pvalues`), and a class's conformity is the
combination for that class. Follows scio 1.1's ``JTLA``.
"""

from __future__ import annotations

__all__ = [
    "JTLA",
    "dcm_surprise",
    "multinomial_tests",
    "parse_test",
    "tie_tolerance",
    "valid_expectations",
]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._checks import check_count
from ._classes import class_count
from ._layers import TOKENS, Neighbourhoods, enough_samples, label_counts
from ._outputs import as_logits, output_label
from ._pvalues import check_aggregation, combine, p_values
from ._saving import StateEntry
from ._tokens import TokenScoring

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._bank import Bank
    from ._protocol import Pass

_F64, _I64 = torch.float64, torch.int64
_BIG = torch.finfo(_F64).max
TEST_MODES = ("mle", "map", "dcm")


def parse_test(test: Any) -> dict[str, Any]:
    """Return JTLA's ``test`` checked and completed, JSON-able.

    scio's spelling: ``{"type": "multinomial", "mode": "mle" | "map" |
    "dcm", "k": int, "prior": float or [C, C] list (optional),
    "special_prior": float (optional)}``; ``"name"`` is taken for
    ``"type"``, and ``mode`` defaults to ``"mle"``.

    Examples
    --------
    >>> parse_test({"name": "multinomial", "k": 10})
    {'type': 'multinomial', 'mode': 'mle', 'k': 10}

    """
    if not isinstance(test, dict):
        msg = (
            "JTLA: test must be a dict as scio spells it, e.g. "
            f"`{{'type': 'multinomial', 'k': 10}}`, got {test!r}"
        )
        raise TypeError(msg)
    known = {"type", "name", "mode", "k", "prior", "special_prior"}
    unknown = sorted(set(test) - known)
    if unknown:
        msg = f"JTLA: test has unknown keys {unknown}; it takes {sorted(known)}"
        raise ValueError(msg)
    kind = test.get("type", test.get("name"))
    if kind != "multinomial":
        msg = (
            f"JTLA: the only test is 'multinomial' (test['type']), got {kind!r}; "
            "e.g. `test={'type': 'multinomial', 'k': 10}`."
        )
        raise ValueError(msg)
    mode = test.get("mode", "mle")
    if mode not in TEST_MODES:
        msg = f"JTLA: test['mode'] must be one of {list(TEST_MODES)}, got {mode!r}"
        raise ValueError(msg)
    out: dict[str, Any] = {
        "type": "multinomial",
        "mode": mode,
        "k": check_count("JTLA", "test['k']", test.get("k"), low=1),
    }
    for key in ("prior", "special_prior"):
        if key in test:
            value = test[key]
            out[key] = value.tolist() if isinstance(value, Tensor) else value
    if "special_prior" in out and not isinstance(out["special_prior"], int | float):
        value = out["special_prior"]
        msg = f"JTLA: test['special_prior'] must be a number, got {value!r}"
        raise TypeError(msg)
    return out


def prior_matrix(test: Mapping[str, Any], classes: int) -> Tensor:
    """Return the ``[C, C]`` Dirichlet prior (row ``c``: class ``c``'s test).

    ``special_prior=eps``: ``1 + eps / C`` off the diagonal and ``2 - (C -
    1) eps / C`` on it (the authors' "special prior"); else ``prior``
    (default 1) broadcast.
    """
    if "special_prior" in test:
        eps = float(test["special_prior"])
        prior = torch.full((classes, classes), 1 + eps / classes, dtype=_F64)
        return prior.fill_diagonal_(2 - (classes - 1) * eps / classes)
    value = torch.as_tensor(test.get("prior", 1.0), dtype=_F64)
    try:
        return torch.broadcast_to(value, (classes, classes)).clone()
    except RuntimeError as error:
        msg = (
            f"JTLA: test['prior'] of shape {list(value.shape)} does not "
            f"broadcast to [{classes}, {classes}] (one row per class)."
        )
        raise ValueError(msg) from error


def dcm_surprise(counts: Tensor, alpha: Tensor) -> Tensor:
    """Return the Dirichlet-compound-multinomial surprise of ``counts``.

    ``-log P(counts | n, alpha)`` for ``DirMult(n, alpha)``, ``n`` the
    counts' sum: ``counts`` ``[Q, C]``, ``alpha`` ``[..., C]`` broadcast
    against them. Written out in full (the oracle of
    :func:`multinomial_tests`, which sums only the classes counted).

    Examples
    --------
    >>> import torch
    >>> c = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    >>> round(float(dcm_surprise(c, torch.tensor([1.0, 1.0], dtype=torch.float64))), 4)
    1.0986

    """
    gln = torch.special.gammaln
    n = counts.sum(dim=-1)
    a = alpha.sum(dim=-1)
    constant = gln(n + a) - gln(n + 1) - gln(a) + gln(alpha).sum(dim=-1)
    surprise: Tensor = (
        constant + gln(counts + 1).sum(dim=-1) - gln(counts + alpha).sum(dim=-1)
    )
    return surprise


_BLOCK = 2**22
"""Terms of :func:`multinomial_tests` computed at once (``C x rows x k``)."""


def multinomial_tests(counts: Tensor, expected: Tensor, mode: str) -> Tensor:
    """Return the test of each count vector against each class, ``[C, Q]``, float64.

    ``counts`` ``[Q, C]`` (the classes of ``k`` neighbours), ``expected``
    ``[C, C]`` (row ``c``: class ``c``'s expected counts, or for ``"dcm"``
    its Dirichlet parameters ``alpha``). Higher = farther from the class.

    * ``"mle"``, ``"map"``: ``KL(counts / k || expected_c / sum(expected_c))``,
      ``inf`` where the expectation is 0 and the count is not, and for a
      class whose expectation is not a distribution (a zero sum: a class
      without fit samples; a negative entry);
    * ``"dcm"``: ``-log P(counts | k, alpha_c)`` (:func:`dcm_surprise`).

    Only the classes counted (at most ``k`` per row) enter the sums, their
    terms summed in increasing order: two count vectors that differ by a
    permutation of classes of equal expectation test exactly equal (scio
    sums every class in class order, in the features' dtype, so such ties
    may differ there by a rounding).

    Examples
    --------
    >>> import torch
    >>> expected = torch.tensor([[3.0, 1.0], [0.0, 4.0]], dtype=torch.float64)
    >>> multinomial_tests(torch.tensor([[2, 0]]), expected, "mle").T
    tensor([[0.2877,    inf]], dtype=torch.float64)

    """
    expected = expected.to(device=counts.device, dtype=_F64)
    classes = expected.shape[0]
    k = int(counts[0].sum()) if counts.shape[0] else 1
    per_row = max(1, _BLOCK // max(1, classes * k))
    blocks = [
        _tests(counts[start : start + per_row], expected, mode, k)
        for start in range(0, counts.shape[0], per_row)
    ]
    if not blocks:
        return torch.zeros(classes, 0, dtype=_F64, device=counts.device)
    return torch.cat(blocks, dim=1)


def _tests(counts: Tensor, expected: Tensor, mode: str, k: int) -> Tensor:
    """:func:`multinomial_tests` of one block of rows."""
    gln = torch.special.gammaln
    # The (at most k) classes counted in each row, and their counts.
    n, counted = counts.topk(min(k, counts.shape[1]), dim=1)
    n = n.to(_F64)
    present = n > 0
    if mode == "dcm":
        alpha = expected[:, counted]  # [C, Q, k]
        terms = gln(n + 1) - gln(n + alpha) + gln(alpha)
        terms = torch.where(present, terms, 0.0).sort(dim=2).values.sum(dim=2)
        a = expected.sum(dim=1, keepdim=True)
        tests: Tensor = gln(k + a) - math.lgamma(k + 1) - gln(a) + terms
    else:
        total = expected.sum(dim=1, keepdim=True)
        q = expected / total
        p = n / k
        terms = p * (p.log() - q[:, counted].log())  # [C, Q, k]
        terms = torch.where(present, terms, 0.0).sort(dim=2).values.sum(dim=2)
        invalid = (total <= 0) | (expected < 0).any(dim=1, keepdim=True)
        tests = torch.where(invalid, math.inf, terms)
    return tests.nan_to_num(nan=math.inf, posinf=math.inf)


_EPS = torch.finfo(_F64).eps


def tie_tolerance(expected: Tensor, k: int, mode: str) -> Tensor:
    """Return how far apart two equal tests can be computed, per class: ``[..., C]``.

    ``expected`` ``[..., C, C]`` (as for :func:`multinomial_tests`). Two
    count vectors can test mathematically equal (``(2, 2, 2)`` and ``(4, 1,
    1)`` against the expectation ``(4, 2, 2)``, ``k = 6``) and land a few
    float64 ulps apart. The bound: each of the ``<= k`` terms is computed
    to ``~3 eps`` of its magnitude, and their sum adds ``(k - 1) eps`` of
    the sum of the magnitudes ``M``, so a test is within ``(k + 2) eps M``
    of its exact value, and two equal tests within twice that. ``M``: for
    ``"mle"``/``"map"`` (``sum_j p_j (log p_j - log q_j)``, ``sum p = 1``)
    at most ``log k + max_j |log q_j|``; for ``"dcm"`` the constant's three
    log-gammas plus ``k`` times the largest ``|log-gamma|`` of a term (each
    with ``+1`` for the log-gamma's own rounding). A class whose
    expectation is no distribution gets 0 (its tests are ``inf``).

    Examples
    --------
    >>> import torch
    >>> expected = torch.tensor([[4.0, 2.0, 2.0]], dtype=torch.float64)
    >>> tests = multinomial_tests(torch.tensor([[2, 2, 2], [4, 1, 1]]), expected, "mle")
    >>> bool(tests[0, 0] != tests[0, 1])  # equal in exact arithmetic
    True
    >>> bool((tests[0, 0] - tests[0, 1]).abs() <= tie_tolerance(expected, 6, "mle")[0])
    True

    """
    expected = expected.to(_F64)
    if mode == "dcm":
        gln = torch.special.gammaln
        alpha = expected.clamp(min=_EPS)
        a = alpha.sum(dim=-1)
        lgk = math.lgamma(k + 1)
        per_term = (
            gln(1 + alpha).abs() + gln(k + alpha).abs() + gln(alpha).abs()
        ).amax(dim=-1)
        magnitude = gln(k + a).abs() + gln(a).abs() + lgk + 3 + k * (lgk + per_term + 3)
    else:
        total = expected.sum(dim=-1, keepdim=True)
        q = expected / total.clamp(min=_EPS)
        logs = torch.where(q > 0, q.log().abs(), 0.0).amax(dim=-1)
        magnitude = math.log(k) + logs + 1
    tolerance = 2 * (k + 2) * _EPS * magnitude
    return torch.where(valid_expectations(expected, mode), tolerance, 0.0)


def valid_expectations(expected: Tensor, mode: str) -> Tensor:
    """Return which classes' expectations are distributions, ``[..., C]`` bool.

    ``"mle"``/``"map"``: non-negative counts of positive sum (not so for a
    class without fit samples, with ``"map"``'s default prior too);
    ``"dcm"``: positive Dirichlet parameters.

    Examples
    --------
    >>> import torch
    >>> valid_expectations(torch.tensor([[3.0, 1.0], [0.0, 0.0]]), "mle").tolist()
    [True, False]

    """
    if mode == "dcm":
        return (expected > 0).all(dim=-1)
    return (expected.sum(dim=-1) > 0) & (expected >= 0).all(dim=-1)


class _Predicted:
    """A reducer: the class the net predicts for each fit sample (CPU)."""

    def __init__(self) -> None:
        self.rows: list[Tensor] = []

    @property
    def count(self) -> int:
        return sum(r.shape[0] for r in self.rows)

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        logits = as_logits(value, "JTLA")
        self.rows.append(logits.detach().argmax(dim=1).to("cpu", _I64))

    def merge(self, other: _Predicted) -> None:
        self.rows += other.rows

    def result(self) -> Tensor:
        return torch.cat(self.rows) if self.rows else torch.zeros(0, dtype=_I64)

    def state(self) -> dict[str, Tensor]:
        return {"predicted": self.result()}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.rows = [state["predicted"]]

    def fresh(self) -> _Predicted:
        return _Predicted()


class _Both:
    """A bank and the predictions on one record (when a layer is the output)."""

    def __init__(self, bank: Bank, predicted: _Predicted) -> None:
        self.bank, self.predicted = bank, predicted

    @property
    def count(self) -> int:
        return self.bank.count

    def update(self, value: Any, target: Tensor | None = None) -> None:
        self.bank.update(value, target)
        self.predicted.update(value, target)

    def merge(self, other: _Both) -> None:
        self.bank.merge(other.bank)
        self.predicted.merge(other.predicted)

    def result(self) -> tuple[tuple[Tensor, Tensor | None], Tensor]:
        return self.bank.result(), self.predicted.result()

    def state(self) -> dict[str, Tensor]:
        return {**self.bank.state(), **self.predicted.state()}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.bank.load_state(state)
        self.predicted.load_state(state)

    def fresh(self) -> _Both:
        return _Both(self.bank.fresh(), self.predicted.fresh())


class JTLA(TokenScoring, Neighbourhoods):
    r"""JTLA (Raghuram et al., ICML 2021), as scio 1.1 scores it.

    ``fit`` (labelled in-distribution data, ``target=`` needed) keeps, for
    each layer of ``layers`` (read in one pass), the fit samples' features
    (L2-normalised, scio's ``act_norm=2``), their labels and the classes the
    net predicts. Then, per layer ``l``:

    1. the counts $n_l(z)$: the classes of the ``k`` nearest fit samples
       of $z$ (largest inner products, scio's ``index_metric="ip"``), each
       fit sample among the others (leaving itself out);
    2. per class $c$, the expected counts: the sum of $n_l$ over the fit
       samples of true class $c$, and over those the net predicts as
       $c$ (plus ``prior - 1`` for ``mode="map"``; the Dirichlet
       parameters for ``"dcm"``);
    3. the test $T_{lc}(z)$ of $n_l(z)$ against class $c$
       (:func:`multinomial_tests`), on every fit sample: the reference.

    ``score_classes(x)``: with $p_{lc}(x)$ the fraction of fit samples
    whose $T_{lc}$ is at least $T_{lc}(x)$, $q_c(x)$ the layers' p-values
    combined (``aggregation``, scio's ``layer_aggregation``; ``"fisher"``:
    $\sum_l \log p_{lc}$), from the predicted-class tests (scio's
    ``pred_conditional=True``) or the true-class ones: the conformity is
    $q_c$ (``class_aggregation="nat"``) or $q_c$ of the predicted-class
    tests over the largest *other* $q$ of the true-class tests
    (``"adv"``); ``score_classes(x) = -conformity``. ``score(x)`` at the
    closest class (the highest conformity; default) or the predicted one
    (``at="predicted"``, scio's reading).

    Where our reading decided: the fit samples' reference tests count
    their neighbours leaving themselves out, as their expected counts do
    (``leave_one_out=True``); scio 1.1 counts each fit sample among its
    own neighbours for the reference (``leave_one_out=False`` reproduces
    it). Features pooled per layer (``pool="mean"``; ``pool=None`` flattens
    as scio). Not offered: scio's ``"lpe"`` aggregation and its ``:n``
    tuples of layers.

    Ties: two different count vectors can test mathematically equal; scio's
    float32 arithmetic makes such tests bit-equal, ours (float64) may land
    a few ulps apart. A fit sample's test counts as at least ``T_lc(x)``
    when it is within :func:`tie_tolerance` below it (the rounding bound of
    a test, derived from float64's ``eps``, ``k`` and the expectation), so
    equal tests count as equal. A class without fit samples (in the true
    labels, or never predicted on the fit data with ``pred_conditional``)
    has no expected counts (``mode="mle"``, and ``"map"`` with its
    default prior): nothing conforms to it, its p-values are 0 (with
    ``"fisher"`` its score is ``+inf``), as DkNN's class without fit
    samples is at distance ``inf``; it is never the closest class.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier).
    layers : list of selectors
        Each resolves to one call whose output is a tensor.
    test : dict
        As scio spells it (:func:`parse_test`), e.g. ``{"type":
        "multinomial", "mode": "mle", "k": 10}``.
    aggregation : str, default "fisher"
        One of :data:`~._pvalues.AGGREGATIONS`.
    at : {"closest", "predicted"}
        Which class's conformity is the score.
    class_aggregation : {"nat", "adv"}
        scio's option (above).
    pred_conditional : bool, optional
        Test against the classes as the net predicts them on the fit data
        (default: ``True``; ``False`` with ``token="each"``, which takes no
        other).
    leave_one_out : bool, default True
        See above.
    act_norm, index_metric, pool, token, mask, backend, search_budget
        As for :class:`~scio_recorder.ood.DkNN` (here ``act_norm=2.0``,
        ``index_metric="ip"``, scio's defaults for JTLA). ``token="each"``:
        a score per token of ``[B, T, D]`` layers
        (:mod:`~scio_recorder.ood._tokens`): the banks hold every real token
        of the fit data, a class per token from ``target="labels"`` (a
        ``[B, T]`` batch entry) or ``"input_ids"``, each fit token tested
        leaving itself out; ``score_tokens`` ``[B, T]`` is minus the
        conformity of the closest class. Needs the true classes only
        (``pred_conditional=False``: a language model's predictions are
        next tokens, not the classes of ``target=``), ``at="closest"`` and
        ``class_aggregation="nat"``.
    reduce : {"mean", "max", "last"} or int, default "mean"
        With ``token="each"``: how ``score`` reduces a row's token scores.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> _ = torch.manual_seed(0)
    >>> rnet = Recorder(demo_model(3), input_size=(1, 3, 32, 32))
    >>> data = [(torch.randn(24, 3, 32, 32), torch.arange(24) % 3)]
    >>> jtla = JTLA(
    ...     rnet, ["features.1", "features.4"], test={"type": "multinomial", "k": 5}
    ... )
    >>> jtla.fit(data, target=1).score_classes(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 3])

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True
    TOKENS: ClassVar[tuple[str, ...]] = (*TOKENS, "each")

    def __init__(  # noqa: PLR0913 (scio's hyperparameters, pooling and search)
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        test: dict[str, Any],
        reduce: str | int = "mean",
        aggregation: str = "fisher",
        at: str = "closest",
        class_aggregation: str = "nat",
        pred_conditional: bool | None = None,
        leave_one_out: bool = True,
        act_norm: float | None = 2.0,
        index_metric: str = "ip",
        pool: str | None = "mean",
        token: str = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
        backend: str = "auto",
        search_budget: int | None = None,
    ) -> None:
        """Resolve the layers; check the hyperparameters."""
        self.test = parse_test(test)
        self.k: int = self.test["k"]
        check_aggregation("JTLA", aggregation, none=False)
        if class_aggregation not in ("nat", "adv"):
            msg = (
                "JTLA: class_aggregation must be 'nat' or 'adv', got "
                f"{class_aggregation!r}"
            )
            raise ValueError(msg)
        self.aggregation = aggregation
        self.class_aggregation = class_aggregation
        each = token == "each"  # noqa: S105 (not a password)
        if each and (pred_conditional or at != "closest" or class_aggregation != "nat"):
            msg = (
                "JTLA: token='each' tests each token against the true classes of "
                "the fit tokens (a language model predicts next tokens, not the "
                "classes of target=): drop `pred_conditional=`, `at=` and "
                "`class_aggregation=`."
            )
            raise ValueError(msg)
        self.pred_conditional = (
            not each if pred_conditional is None else bool(pred_conditional)
        )
        self.leave_one_out = bool(leave_one_out)
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
        self.init_tokens("each" if each else None, mask, reduce)
        if each:
            self.num_classes = None  # the classes the fit's target shows
        self.output = output_label(rnet)
        # Per conditioning (true, then predicted): [layers, C, C] and the
        # sorted reference tests [C, layers, samples].
        self.expected = torch.zeros(0, 0, 0, 0, dtype=_F64)
        self.reference = torch.zeros(0, 0, 0, 0, dtype=_F64)

    def conditionings(self) -> int:
        """Return 2 (true and predicted classes) or 1 (true classes only)."""
        return 2 if self.pred_conditional else 1

    def fit_keep(self) -> dict[Any, Any]:
        """Each layer's features and labels; the net's predictions."""
        keep = super().fit_keep()
        if not self.pred_conditional:
            return keep
        if self.output in keep:
            keep[self.output] = _Both(keep[self.output], _Predicted())
        else:
            keep[self.output] = _Predicted()
        return keep

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Keep the banks; compute the expected counts and the reference tests."""
        predicted = None
        if self.pred_conditional:
            value = result[self.output]
            if self.output in self.labels:
                bank_result, predicted = value
                result = {**result, self.output: bank_result}
            else:
                predicted = value
        self.keep_banks(result)
        self.fit_tests(predicted)

    def fit_tests(self, predicted: Tensor | None) -> None:
        """Compute the expected counts and the reference tests of the banks."""
        n = self.bank_labels.shape[0]
        enough_samples("JTLA", self.k, n, loo=True)
        classes = self.classes()
        if predicted is not None:
            classes = max(classes, int(predicted.max()) + 1)
        groups = [self.bank_labels] + ([predicted] if predicted is not None else [])
        prior = prior_matrix(self.test, classes)
        expected, reference = [], []
        for bank in self.banks:
            everyone = torch.arange(n)
            near = self.search(bank, bank, self.k, exclude=everyone)
            counts = label_counts(self.bank_labels, near, classes)
            if not self.leave_one_out:
                near = self.search(bank, bank, self.k)
            own = label_counts(self.bank_labels, near, classes)
            per_group = [self._expected(counts, group, prior) for group in groups]
            expected.append(torch.stack(per_group))
            reference.append(
                torch.stack(
                    [multinomial_tests(own, e, self.test["mode"]) for e in per_group]
                )
            )
        # Expected [conditionings, layers, C, C], tests [conditionings, C, layers, N].
        self.expected = torch.stack(expected, dim=1)
        tests = torch.stack(reference, dim=2).clamp(max=_BIG)
        self.reference = tests.sort(dim=-1).values

    def _expected(self, counts: Tensor, group: Tensor, prior: Tensor) -> Tensor:
        """Return each class's expected counts ``[C, C]`` from its fit samples' counts.

        ``"mle"``: the sum of the counts; ``"map"``: plus ``prior - 1``;
        ``"dcm"``: plus ``prior`` (the Dirichlet parameters).
        """
        classes = prior.shape[0]
        sums = torch.zeros(classes, classes, dtype=_F64)
        sums.index_add_(0, group, counts.to(_F64))
        mode = self.test["mode"]
        if mode == "mle":
            return sums
        return sums + prior - 1 if mode == "map" else sums + prior

    def layer_tests(self, result: Pass) -> Tensor:
        """Return the tests ``[conditionings, C, layers, batch]`` of a pass."""
        classes = self.expected.shape[-1]
        width = class_count(classes, result)
        tests = []
        for i, (z, bank) in enumerate(
            zip(self.layer_features(result), self.banks, strict=True)
        ):
            counts = label_counts(
                self.bank_labels, self.search(z, bank, self.k), classes
            )
            tests.append(
                torch.stack(
                    [
                        multinomial_tests(
                            counts, self.expected[g, i], self.test["mode"]
                        )
                        for g in range(self.expected.shape[0])
                    ]
                )
            )
        out = torch.stack(tests, dim=2).clamp(max=_BIG)
        if width > classes:
            pad = out.new_full((*out.shape[:1], width - classes, *out.shape[2:]), _BIG)
            out = torch.cat([out, pad], dim=1)
        return out

    def conformity(self, result: Pass) -> Tensor:
        """Return the conformity to each class, ``[batch, classes]`` (float64)."""
        tests = self.layer_tests(result)
        classes = self.reference.shape[1]
        reference = self.reference.to(tests.device)
        mode = self.test["mode"]
        # [g, layers, C] -> [g, C, layers, 1]: per class and layer
        tolerance = tie_tolerance(self.expected, self.k, mode)
        valid = valid_expectations(self.expected, mode)
        tolerance = tolerance.transpose(1, 2)[..., None].to(tests.device)
        valid = valid.transpose(1, 2)[..., None].to(tests.device)
        if tests.shape[1] > classes:
            # Classes the fit never saw: every fit sample tests finite below.
            extra = reference.new_full(
                (reference.shape[0], tests.shape[1] - classes, *reference.shape[2:]),
                -_BIG,
            )
            reference = torch.cat([reference, extra], dim=1)
            pad = (tolerance.shape[0], tests.shape[1] - classes, *tolerance.shape[2:])
            tolerance = torch.cat([tolerance, tolerance.new_zeros(pad)], dim=1)
            valid = torch.cat([valid, valid.new_ones(pad)], dim=1)
        # A fit sample's test counts as ">=" within the rounding of equal
        # tests (tie_tolerance); a class whose expectation is no
        # distribution (no fit sample of it) is conformed to by nothing: p 0.
        p = p_values(reference, tests - tolerance).masked_fill(~valid, 0.0)
        # p [conditionings, C, layers, batch] -> combined over layers: [g, C, batch]
        q = combine(p, self.aggregation, dim=2).transpose(1, 2)
        natural = q[-1]
        if self.class_aggregation == "nat":
            return natural
        true = q[0]
        top = true.topk(2, dim=1)
        best_other = top.values[:, :1].expand_as(true).clone()
        rows = torch.arange(true.shape[0], device=true.device)
        best_other[rows, top.indices[:, 0]] = top.values[:, 1]
        # 0 / 0 is 0 (scio's); scio also turns +-inf into its dtype's extremes.
        return (natural / best_other).nan_to_num(
            nan=0.0, posinf=math.inf, neginf=-math.inf
        )

    def class_scores(self, result: Pass) -> Tensor:
        """Return minus the conformity to each class."""
        return -self.conformity(result)

    # -- per token (token="each") -------------------------------------------
    def fit_token_start(self) -> None:
        """Start the banks of tokens."""
        self.token_bank_start()

    def fit_token_batch(self, result: Pass, keep: Tensor, target: Tensor) -> None:
        """Keep the real tokens' features and classes."""
        self.token_bank_batch(result, keep, target)

    def fit_token_end(self) -> None:
        """Set the banks; test every fit token against the classes."""
        self.token_bank_end()
        self.fit_tests(None)

    def token_scores(self, result: Pass) -> Tensor:
        """Return minus each token's conformity to its closest class, ``[B, T]``."""
        shape = result.outputs[self.labels[0]].shape[:2]
        return -self.conformity(result).amax(dim=1).reshape(shape)

    def config(self) -> dict[str, Any]:
        """Return the layers, pooling, the test and the aggregations."""
        return {
            **self.token_config(),
            **super().config(),
            "test": self.test,
            "aggregation": self.aggregation,
            "class_aggregation": self.class_aggregation,
            "pred_conditional": self.pred_conditional,
            "leave_one_out": self.leave_one_out,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the banks, labels, expected counts and reference tests."""
        out = {f"bank.{i}": bank for i, bank in enumerate(self.banks)}
        out["labels"] = self.bank_labels
        out["expected"] = self.expected
        out["reference"] = self.reference
        return out

    def state_entries(self) -> dict[str, StateEntry]:
        """Per layer ``i`` ``bank.i``; ``labels``; ``expected``; ``reference``.

        ``expected`` ``[g, layers, C, C]`` and ``reference`` ``[g, C,
        layers, samples]`` (sorted tests, ``inf`` stored as the largest
        float64), ``g`` 2 with ``pred_conditional`` (true, predicted), else 1.
        """
        layers, g = len(self.labels), self.conditionings()
        out = self.bank_entries()
        out["expected"] = StateEntry((g, layers, "classes", "classes"), _F64)
        out["reference"] = StateEntry((g, "classes", layers, "samples"), _F64)
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the banks, labels, expected counts and reference tests."""
        self.banks = [state[f"bank.{i}"] for i in range(len(self.labels))]
        self.bank_labels = state["labels"]
        self.expected, self.reference = state["expected"], state["reference"]
