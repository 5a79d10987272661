"""OoD metrics against scikit-learn and hand-written definitions; results tables.

The metrics are computed in float64 from the same scores on both sides, so
they agree with scikit-learn to float64 rounding of a sum of at most ~50
terms in [0, 1] (abs 1e-12 is far above it, far below any real difference,
which is at least 1 / (50 * 50)).
"""

from __future__ import annotations

import itertools
import math
import re
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as sk
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import (
    ASH,
    MSP,
    Energy,
    Evaluation,
    OoDResults,
    evaluate,
    score_sets,
)
from scio_recorder.ood.metrics import (
    ALL_METRICS,
    METRICS,
    aupr_in,
    aupr_out,
    auroc,
    convex_hull_auroc,
    fpr_at_id_recall,
    fpr_at_ood_recall,
    fpr_at_tpr,
    mcc,
    metric_function,
    ood_metrics,
    partial_auroc,
    roc_curve,
    tnr_at_tpr,
    tpr_at_fpr,
)

TOL = 1e-12

# Small integers make ties the rule; floats (with repeats) the general case.
ints = st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=25)
floats = st.lists(
    st.sampled_from([-1.5, -0.25, 0.0, 0.1, 0.3, 2.0, 7.5]) | st.floats(-5, 5),
    min_size=1,
    max_size=25,
)
score_lists = ints | floats


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists)
def test_auroc_aupr_roc_equal_scikit_learn(id_scores, ood_scores):
    labels = [0] * len(id_scores) + [1] * len(ood_scores)  # OoD positive
    values = id_scores + ood_scores
    if len(set(labels)) == 2:
        assert auroc(id_scores, ood_scores) == pytest.approx(
            sk.roc_auc_score(labels, values), abs=TOL
        )
    assert aupr_out(id_scores, ood_scores) == pytest.approx(
        sk.average_precision_score(labels, values), abs=TOL
    )
    assert aupr_in(id_scores, ood_scores) == pytest.approx(
        sk.average_precision_score([1 - v for v in labels], [-v for v in values]),
        abs=TOL,
    )
    fpr, tpr = roc_curve(id_scores, ood_scores)
    want_fpr, want_tpr, _ = sk.roc_curve(labels, values, drop_intermediate=False)
    assert fpr.tolist() == pytest.approx(want_fpr.tolist(), abs=TOL)
    assert tpr.tolist() == pytest.approx(want_tpr.tolist(), abs=TOL)


def fpr_id_recall_by_hand(ind, ood, recall):
    """OpenOOD's FPR@95: ID positive, kept where score <= t, t the lowest keeping
    at least ``recall`` of ID; the fraction of OoD kept with them."""
    for t in sorted(set(ind)):
        if sum(v <= t for v in ind) / len(ind) >= recall - TOL:
            return sum(v <= t for v in ood) / len(ood)
    raise AssertionError


def fpr_ood_recall_by_hand(ind, ood, recall):
    """OoD positive, flagged where score >= t, t the highest flagging at least
    ``recall`` of OoD; the fraction of ID flagged with them."""
    for t in sorted(set(ood), reverse=True):
        if sum(v >= t for v in ood) / len(ood) >= recall - TOL:
            return sum(v >= t for v in ind) / len(ind)
    raise AssertionError


@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists, st.sampled_from([0.95, 0.5, 0.8, 1.0]))
def test_fpr_both_conventions_equal_their_definitions(id_scores, ood_scores, recall):
    by_id = fpr_id_recall_by_hand(id_scores, ood_scores, recall)
    by_ood = fpr_ood_recall_by_hand(id_scores, ood_scores, recall)
    assert fpr_at_id_recall(id_scores, ood_scores, recall) == by_id
    assert fpr_at_ood_recall(id_scores, ood_scores, recall) == by_ood
    assert fpr_at_tpr(id_scores, ood_scores, recall) == by_ood  # the old name
    if recall == 0.95:
        got = ood_metrics(id_scores, ood_scores, names=ALL_METRICS)
        assert (got["FPR95-ID"], got["FPR95-OOD"], got["FPR95TPR"]) == (
            by_id,
            by_ood,
            by_ood,
        )


# OpenOOD's "FPR@95", ported as the oracle of the next test from
# github.com/Jingkang50/OpenOOD, openood/evaluators/metrics.py (MIT licence):
# `fpr_recall` as of tag v1.5 (commit 8d44375e4c695d03d2b97850b754f24fd4bda447,
# 2023-06-26), ID positive; `auc_and_fpr_recall` since commit
# 873e8c291b6d983a5dfb7e9e824128000caa51a5 ("fix ood eval (ood as pos)",
# 2023-08-10), OoD positive. OpenOOD's `conf` is higher for ID: our scores negated;
# its labels are -1 for OoD.
def _openood_inputs(ind, ood):
    conf = -np.asarray([*ind, *ood], dtype=np.float64)
    label = np.asarray([0] * len(ind) + [-1] * len(ood))
    return conf, label


def openood_v15_fpr(ind, ood, tpr=0.95):
    conf, label = _openood_inputs(ind, ood)
    gt = np.ones_like(label)
    gt[label == -1] = 0
    fpr_list, tpr_list, _ = sk.roc_curve(gt, conf)
    return fpr_list[np.argmax(tpr_list >= tpr)]


def openood_873e8c2_fpr(ind, ood, tpr_th=0.95):
    conf, label = _openood_inputs(ind, ood)
    ood_indicator = np.zeros_like(label)
    ood_indicator[label == -1] = 1
    fpr_list, tpr_list, _ = sk.roc_curve(ood_indicator, -conf)
    return fpr_list[np.argmax(tpr_list >= tpr_th)]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.floats(-5, 5, allow_subnormal=False), min_size=2, max_size=50, unique=True
    ),
    st.data(),
)
def test_fpr95_id_is_openood_v1_5_and_fpr95_ood_is_openood_since_873e8c2(scores, data):
    """Scores without ties (OpenOOD's `roc_curve` drops intermediate points,
    which with ties can skip the first one reaching 95 %)."""
    # The docs said FPR95-ID was OpenOOD's FPR@95: only until August 2023.
    cut = data.draw(st.integers(1, len(scores) - 1))
    ind, ood = scores[:cut], scores[cut:]
    assert fpr_at_id_recall(ind, ood) == openood_v15_fpr(ind, ood)
    assert fpr_at_ood_recall(ind, ood) == openood_873e8c2_fpr(ind, ood)


def test_openood_changed_its_positive_class_in_873e8c2():
    ind = [float(i) for i in range(20)]  # as below: the conventions differ here
    ood = [18.5, 19.5, 30.0, 31.0]
    assert openood_v15_fpr(ind, ood) == fpr_at_id_recall(ind, ood) == 0.0
    assert openood_873e8c2_fpr(ind, ood) == fpr_at_ood_recall(ind, ood) == 1 / 20


def test_the_legend_names_openood_s_version_of_each_fpr():
    from scio_recorder.ood._results import legend  # noqa: PLC0415 (private)

    # It said "FPR95-ID ... (ID positive, OpenOOD's FPR@95)", true of v1.5 only.
    assert legend("FPR95-ID").startswith(
        "FPR95-ID: false-positive rate at 95 % ID recall (ID positive, OpenOOD "
        "v1.5's FPR@95; OpenOOD's since August 2023 is FPR95-OOD): "
    )
    assert "(OoD positive, OpenOOD's FPR@95 since August 2023)" in legend("FPR95-OOD")


def test_the_two_fpr_conventions_differ_and_are_named():
    ind = [float(i) for i in range(20)]  # 0..19
    ood = [18.5, 19.5, 30.0, 31.0]
    # 95 % of ID kept: scores <= 18, so no OoD sample taken for ID.
    assert fpr_at_id_recall(ind, ood) == 0.0
    # 95 % of OoD flagged: scores >= 18.5, so 1 of the 20 ID samples flagged.
    assert fpr_at_ood_recall(ind, ood) == 1 / 20
    assert ood_metrics(ind, ood) == {
        key: ood_metrics(ind, ood, names=ALL_METRICS)[key] for key in METRICS
    }  # the old four, unchanged
    with pytest.raises(ValueError, match=r"^recall must be a rate in \(0, 1\], got 95"):
        fpr_at_id_recall(ind, ood, 95)
    with pytest.raises(ValueError, match=r"unknown metric 'FPR95'; choose among"):
        ood_metrics(ind, ood, names=["FPR95"])


# ----------------------------------------------------------- results tables
def evaluation(name, shift, detectors=("A", "B")):
    inside = {d: torch.arange(10.0) + i for i, d in enumerate(detectors)}
    outside = {d: torch.arange(10.0) + shift * (i + 1) for i, d in enumerate(detectors)}
    return Evaluation(inside, outside, name, accuracy=dict.fromkeys(detectors, 0.5))


@pytest.fixture
def results():
    sets = {
        "near1": evaluation("near1", 2),
        "near2": evaluation("near2", 4),
        "far": evaluation("far", 12),
    }
    return OoDResults(sets, groups={"near": ["near1", "near2"], "far mean": ["far"]})


def test_results_table_is_aligned_with_group_means(results):
    text = str(results)
    lines = text.splitlines()
    assert lines[0] == (
        "OoD detection: 2 detectors x 3 OoD sets; groups: near = near1, near2; "
        "far mean = far"
    )
    assert "AUROC < 0.5 means a reversed ranking: the detector ranks ID above OoD." in (
        lines
    )
    assert any(
        line.startswith("FPR95-ID: false-positive rate at 95 % ID recall (ID positive")
        for line in lines
    )
    start = lines.index("AUROC")
    header, *rows = lines[start + 1 : start + 4]
    assert header.split() == [
        "detector",
        "near1",
        "near2",
        "far",
        "near",
        "far",
        "mean",
    ]
    # Right-aligned columns: every row ends each column where the header does.
    ends = [m.end() for m in re.finditer(r"\S+", header)]
    ends = [*ends[:5], ends[6]]  # "far mean" is one column
    for row in rows:
        assert [m.end() for m in re.finditer(r"\S+", row)][1:] == ends[1:]
    for detector, row in zip(["A", "B"], rows, strict=True):
        cells = row.split()
        assert cells[0] == detector
        near = math.fsum(results[s][detector]["AUROC"] for s in ("near1", "near2")) / 2
        assert float(cells[4]) == pytest.approx(near, abs=5e-4)  # printed to 3 places
        assert results.value(detector, "near", "AUROC") == near
        assert (
            results.value(detector, "far mean", "AUROC")
            == results["far"][detector]["AUROC"]
        )
    assert [b for b in lines if b in (*ALL_METRICS, "ACC")] == [
        "AUROC",
        "FPR95-ID",
        "AUPR-IN",
        "AUPR-OUT",
        "ACC",
    ]
    with pytest.raises(
        KeyError, match=r"no OoD set or group named 'mid'; the results have the sets"
    ):
        results.value("A", "mid", "AUROC")


def test_to_markdown_html_and_pandas(results, monkeypatch):
    md = results.to_markdown(["FPR95-OOD"])
    assert "**FPR95-OOD**" in md
    assert "| detector | near1 | near2 | far | near | far mean |" in md
    assert "|---|---:|---:|---:|---:|---:|" in md
    assert md.count("\n| A |") == 2  # FPR95-OOD and ACC
    html = results._repr_html_()
    assert html.count("<table>") == 5
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(
        ImportError, match=r"to_pandas needs pandas.*pip install pandas"
    ):
        results.to_pandas()


def test_to_pandas_frame(results):
    pytest.importorskip("pandas")
    frame = results.to_pandas()
    assert list(frame.index) == ["A", "B"]
    assert frame.loc["A", ("AUROC", "near")] == results.value("A", "near", "AUROC")
    assert frame.loc["B", ("ACC", "ID")] == 0.5


def test_groups_name_known_sets():
    sets = {"a": evaluation("a", 2)}
    with pytest.raises(
        ValueError,
        match=r"group 'far' names unknown OoD sets \['b'\]; the OoD sets are \['a'\]",
    ):
        OoDResults(sets, groups={"far": ["b"]})
    with pytest.raises(ValueError, match=r"group 'a' has the name of an OoD set"):
        OoDResults(sets, groups={"a": ["a"]})


# ----------------------------------------------------------- evaluate
@pytest.fixture
def rnet():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return Recorder(net, input_size=(1, 4))


def test_evaluate_several_sets_one_results_object(rnet):
    detectors = {"MSP": MSP(rnet), "Energy": Energy(rnet), "ASH": ASH(rnet, layer="1")}
    x, y = torch.randn(12, 4), torch.arange(12) % 3
    sets = {"near": [(2 * torch.randn(6, 4),)], "far": [(9 * torch.randn(5, 4),)]}
    results = evaluate(
        detectors,
        [(x[:7], y[:7]), (x[7:], y[7:])],
        sets,
        target=1,
        near=["near"],
        far=["far"],
    )
    assert isinstance(results, OoDResults)
    # The old access paths of the dict of Evaluations.
    assert list(results) == ["near", "far"]
    assert isinstance(results["far"], Evaluation)
    assert results["far"].name == "far"
    for name, detector in detectors.items():
        assert torch.equal(results["far"].ood_scores[name], detector(sets["far"][0][0]))
        assert torch.equal(
            results.id_scores[name], torch.cat([detector(x[:7]), detector(x[7:])])
        )
        assert (
            results["near"][name]["AUROC"]
            == ood_metrics(results.id_scores[name], detector(sets["near"][0][0]))[
                "AUROC"
            ]
        )
    assert dict(results.items()).keys() == {"near", "far"}
    assert results.columns == ["near", "far", "near mean", "far mean"]
    # Accuracy from the logits of each detector's pass: the net's own for MSP,
    # the ASH-edited ones for ASH.
    ash = detectors["ASH"]
    with torch.no_grad(), rnet.selecting(ash.edit_label()):
        plain = (rnet.net(x).argmax(1) == y).double().mean().item()
        logits = rnet(x, activation_postproc=ash.edit)
        edited = (logits.argmax(1) == y).double().mean().item()
    assert edited != plain  # the edit changes some predictions here
    assert results.accuracy["MSP"] == results.accuracy["Energy"] == plain
    assert results.accuracy["ASH"] == edited
    assert "ACC" in str(results)
    with pytest.raises(
        ValueError, match=r"group 'near mean' names unknown OoD sets \['close'\]"
    ):
        evaluate(detectors, [(x, y)], sets, near=["close"])
    with pytest.raises(
        ValueError, match=r"`ood_batches` is one unnamed set: pass a mapping"
    ):
        evaluate(detectors, [(x, y)], sets["far"], far=["far"])
    with pytest.raises(
        ValueError, match=r"labels of in-distribution batch 0 are torch.float32"
    ):
        evaluate(detectors, [(x, y.float())], sets, target=1)


def test_evaluate_one_set_keeps_the_evaluation(rnet):
    detectors = {"MSP": MSP(rnet)}
    result = evaluate(detectors, [torch.randn(8, 4)], [torch.randn(8, 4)], input=None)
    assert isinstance(result, Evaluation)
    assert (
        result.table().splitlines()[0]
        == "| detector (OoD) | AUROC | AUPR-IN | AUPR-OUT | FPR95TPR |"
    )
    assert result.accuracy == {}
    assert "FPR95-ID" in str(result)
    assert "ACC" not in str(result)
    assert "| detector | OoD |" in result.to_markdown()


def test_score_sets_shares_passes(rnet):
    detectors = {"MSP": MSP(rnet), "Energy": Energy(rnet), "ASH": ASH(rnet, layer="1")}
    sets = {
        "test": [torch.randn(5, 4), torch.randn(3, 4)],
        "noise": [torch.randn(4, 4)],
    }
    calls = []
    handle = rnet.net.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        scores = score_sets(detectors, sets, input=None)
    finally:
        handle.remove()
    assert len(calls) == 3 * 2  # 3 batches x (1 shared pass + 1 edit)
    assert list(scores) == ["test", "noise"]
    for name, detector in detectors.items():
        assert torch.equal(
            scores["test"][name], torch.cat([detector(b) for b in sets["test"]])
        )
    with pytest.raises(
        TypeError,
        match=r"score_sets takes the data sets as a mapping name -> batches, got a l",
    ):
        score_sets(detectors, sets["test"], input=None)
    with pytest.raises(
        ValueError, match=r"^set 'empty' is empty: there is nothing to score"
    ):
        score_sets(detectors, {"empty": []}, input=None)


# ----------------------------------------------------------- plots
def test_plots_accept_the_results_object(results, tmp_path):
    pytest.importorskip("matplotlib")
    from scio_recorder import plot  # noqa: PLC0415 (optional)

    fig = plot.roc_curves(results)
    assert [ax.get_title() for ax in fig.axes] == [
        "ROC, near1",
        "ROC, near2",
        "ROC, far",
    ]
    fig.savefig(tmp_path / "roc.png")
    fig = plot.score_histograms(results, ["B"], sets=["far", "near1"])
    assert [ax.get_title() for ax in fig.axes] == [
        f"B vs far (AUROC {results['far']['B']['AUROC']:.2f})",
        f"B vs near1 (AUROC {results['near1']['B']['AUROC']:.2f})",
    ]
    old = dict(results)  # what evaluate returned before: a dict of Evaluations
    assert len(plot.roc_curves(old).axes) == 3
    assert len(plot.roc_curves(results["far"]).axes) == 1
    ax = plot.score_histograms(results["far"]).axes[0]
    with pytest.raises(ValueError, match=r"one `ax` cannot hold the 3 OoD sets"):
        plot.roc_curves(results, ax=ax)
    plot.roc_curves(results, sets=["far"], ax=ax)
    with pytest.raises(KeyError, match=r"no OoD set named \['mid'\]"):
        plot.roc_curves(results, sets=["mid"])


# -- scio's measures: partial and convex-hull AUROC, MCC, rates at a rate ----
rates = st.sampled_from([0.0, 0.05, 0.1, 0.25, 0.3, 0.5, 0.75, 1.0]) | st.floats(0, 1)


def pairs_above(ood: list[float], threshold: float, *, strict: bool) -> int:
    return sum(o > threshold if strict else o >= threshold for o in ood)


@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists, st.floats(0.01, 1.0))
def test_partial_auroc_equals_scikit_learn_before_mcclish(id_scores, ood_scores, high):
    """Ties count one half, from 0: scikit-learn's area, its correction undone."""
    labels = [0] * len(id_scores) + [1] * len(ood_scores)
    if len(set(labels)) < 2:
        return
    mcclish = sk.roc_auc_score(labels, id_scores + ood_scores, max_fpr=high)
    # scikit-learn: 0.5 * (1 + (area - high**2 / 2) / (high - high**2 / 2))
    area = (2 * mcclish - 1) * (high - high**2 / 2) + high**2 / 2
    got = partial_auroc(id_scores, ood_scores, max_fpr=high)
    assert math.isclose(got, area / high, abs_tol=1e-9)  # area / high: ~1e-16 / high


@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists, rates, rates)
def test_pessimistic_partial_auroc_is_the_staircase_of_strict_pairs(
    id_scores, ood_scores, a, b
):
    """On FPR ((k-1)/N, k/N] the lower staircase flags the OoD above the k-th ID."""
    low, high = sorted((a, b))
    if high - low < 1e-3:
        return
    n, p = len(id_scores), len(ood_scores)
    ranked = sorted(id_scores, reverse=True)
    area = 0.0
    for k, kth in enumerate(ranked, start=1):
        overlap = max(0.0, min(k / n, high) - max((k - 1) / n, low))
        area += overlap * pairs_above(ood_scores, kth, strict=True) / p
    got = partial_auroc(ood_scores=ood_scores, id_scores=id_scores, max_fpr=high,
                        min_fpr=low, ties="pessimistic")  # fmt: skip
    assert math.isclose(got, area / (high - low), abs_tol=1e-9)


@settings(max_examples=100, deadline=None)
@given(score_lists, score_lists)
def test_whole_range_partial_aurocs_are_the_pair_counts(id_scores, ood_scores):
    """From 0 to 1: ties one half is `auroc`; pessimistic counts only strict pairs."""
    strict = sum(o > i for o in ood_scores for i in id_scores)
    total = len(id_scores) * len(ood_scores)
    assert math.isclose(
        partial_auroc(id_scores, ood_scores, max_fpr=1.0, ties="pessimistic"),
        strict / total,
        abs_tol=TOL,
    )
    assert math.isclose(
        partial_auroc(id_scores, ood_scores, max_fpr=1.0),
        auroc(id_scores, ood_scores),
        abs_tol=TOL,
    )


def test_pessimistic_partial_auroc_at_1e5_scores_is_the_direct_staircase():
    """10^5 tied scores: the staircase found by binary search, not by a scan.

    It took 8-12 s for 40k + 40k scores (a scan of the curve per point):
    here at 10^5 it is the strict pair count (from 0 to 1), and on a
    subsample of 1000 it is the direct left Riemann sum of the definition.
    """
    gen = torch.Generator().manual_seed(0)
    ind = (torch.randn(50_000, generator=gen, dtype=torch.float64) * 20).round()
    ood = (torch.randn(50_000, generator=gen, dtype=torch.float64) * 20 + 10).round()
    # from 0 to 1, ties counting 0: the fraction of pairs with ood > id
    below = torch.searchsorted(ind.sort().values, ood, right=False)
    strict = float(below.sum()) / (len(ind) * len(ood))
    got = partial_auroc(ind, ood, max_fpr=1.0, ties="pessimistic")
    assert math.isclose(got, strict, abs_tol=1e-12)
    # a band of FPR on a subsample: the definition written out
    ind_s, ood_s = ind[:1000].numpy(), ood[:1000].numpy()
    fpr, tpr = roc_curve(ind_s, ood_s)
    low, high = 0.05, 0.3
    xs = [low, *[f for f in fpr if low < f < high], high]
    area = sum(
        (b - a) * max(t for f, t in zip(fpr, tpr, strict=True) if f <= a + 1e-15)
        for a, b in itertools.pairwise(xs)
    )
    got = partial_auroc(ind_s, ood_s, max_fpr=high, min_fpr=low, ties="pessimistic")
    assert math.isclose(got, area / (high - low), abs_tol=1e-12)


@pytest.mark.parametrize(
    ("call", "name", "bounds"),
    [
        (lambda i, o, v: partial_auroc(i, o, max_fpr=v), "max_fpr", "[0, 1]"),
        (
            lambda i, o, v: partial_auroc(i, o, max_fpr=1, min_fpr=v),
            "min_fpr",
            "[0, 1]",
        ),
        (tpr_at_fpr, "fpr", "[0, 1]"),
        (tnr_at_tpr, "tpr", "[0, 1]"),
        (lambda i, o, v: fpr_at_tpr(i, o, tpr=v), "tpr", "(0, 1]"),
        (lambda i, o, v: fpr_at_id_recall(i, o, recall=v), "recall", "(0, 1]"),
        (lambda i, o, v: fpr_at_ood_recall(i, o, recall=v), "recall", "(0, 1]"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("value", [None, "high", [0.1], True])
def test_a_rate_of_the_wrong_type_is_named(call, name, bounds, value):
    # float(None) and float("high") gave bare errors naming no argument.
    message = (
        f"{name} must be a rate in {bounds} (a number, e.g. 0.95), got "
        f"{value!r} ({type(value).__name__})"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        call([0.1, 0.2], [0.3], value)


def test_a_rate_may_be_a_numpy_or_tensor_number():
    ind, ood = [0.1, 0.2, 0.6, 0.7], [0.5, 0.9]
    want = tpr_at_fpr(ind, ood, 0.25)
    assert tpr_at_fpr(ind, ood, np.float32(0.25)) == want
    assert tpr_at_fpr(ind, ood, torch.tensor(0.25)) == want


@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists)
def test_convex_hull_auroc_is_the_area_of_scipys_hull(id_scores, ood_scores):
    """The hull of the ROC points and (1, 0) has the area under the upper hull."""
    from scipy.spatial import ConvexHull, QhullError  # noqa: PLC0415 (a test oracle)

    fpr, tpr = roc_curve(id_scores, ood_scores)
    points = [*zip(fpr, tpr, strict=True), (1.0, 1.0), (1.0, 0.0)]
    got = convex_hull_auroc(id_scores, ood_scores)
    try:
        expected = ConvexHull(points).volume  # a 2-D hull's "volume" is its area
    except QhullError:  # all points on a line: (0,0)-(1,0)-(1,1) has area 0.5
        expected = 0.5
    assert math.isclose(got, expected, abs_tol=1e-9)
    assert got >= auroc(id_scores, ood_scores) - TOL


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists)
def test_mcc_is_the_best_of_scikit_learns_over_every_threshold(id_scores, ood_scores):
    """Every distinct score as a threshold (flag at or above), degenerate ones 0."""
    labels = [0] * len(id_scores) + [1] * len(ood_scores)
    scores = id_scores + ood_scores
    best = max(
        [0.0]
        + [
            sk.matthews_corrcoef(labels, [int(s >= t) for s in scores])
            for t in set(scores)
        ]
    )
    assert math.isclose(mcc(id_scores, ood_scores), best, abs_tol=1e-9)


@settings(max_examples=150, deadline=None)
@given(score_lists, score_lists, rates)
def test_rates_at_a_rate_are_the_best_thresholds(id_scores, ood_scores, rate):
    """TPR at FPR <= x, and TNR at TPR >= x, by trying every threshold."""
    n, p = len(id_scores), len(ood_scores)
    thresholds = [*set(id_scores + ood_scores), math.inf]
    points = [
        (pairs_above(id_scores, t, strict=False) / n,
         pairs_above(ood_scores, t, strict=False) / p)
        for t in thresholds
    ]  # fmt: skip
    best_tpr = max(t for f, t in points if f <= rate + 1e-12)
    best_tnr = max(1 - f for f, t in points if t >= rate - 1e-12)
    assert tpr_at_fpr(id_scores, ood_scores, rate) == best_tpr
    assert tnr_at_tpr(id_scores, ood_scores, rate) == best_tnr


def test_new_metrics_by_name_and_their_messages():
    """Named forms reach the functions; bad names and rates say what is allowed."""
    ind, ood = [0.1, 0.2, 0.6, 0.7], [0.5, 0.9]
    got = ood_metrics(ind, ood, names=["MCC", "AUROC-CH", "pAUROC@0.5", "TPR@FPR0.25",
                                       "TNR@TPR0.95"])  # fmt: skip
    assert got == {
        "MCC": mcc(ind, ood),
        "AUROC-CH": convex_hull_auroc(ind, ood),
        "pAUROC@0.5": partial_auroc(ind, ood, max_fpr=0.5),
        "TPR@FPR0.25": 0.5,
        "TNR@TPR0.95": 0.5,
    }
    for bad in ["pAUROC@1.5", "TPR@FPR", "MCC2", "pAUROC0.1"]:
        with pytest.raises(
            ValueError, match=rf"^unknown metric {re.escape(repr(bad))};"
        ):
            metric_function(bad)
    with pytest.raises(ValueError, match=r"^max_fpr must be a rate in \[0, 1\], got 2"):
        partial_auroc(ind, ood, max_fpr=2)
    with pytest.raises(
        ValueError, match=r"^partial_auroc needs min_fpr < max_fpr, got 0.5 and 0.5"
    ):
        partial_auroc(ind, ood, max_fpr=0.5, min_fpr=0.5)
    with pytest.raises(
        ValueError, match=r"^ties must be 'half' or 'pessimistic', got 'low'"
    ):
        partial_auroc(ind, ood, max_fpr=0.5, ties="low")
    with pytest.raises(ValueError, match=r"^fpr must be a rate in \[0, 1\], got -0.1"):
        tpr_at_fpr(ind, ood, -0.1)


def test_results_tables_compute_new_metrics_on_request():
    """OoDResults and Evaluation compute a metric outside ALL_METRICS when asked."""
    inside = {"A": torch.arange(10.0), "B": -torch.arange(10.0)}
    far = Evaluation(inside, {"A": torch.arange(10.0) + 9, "B": torch.zeros(3)}, "far")
    near = Evaluation(inside, {"A": torch.arange(10.0) + 5, "B": torch.ones(3)}, "near")
    results = OoDResults({"far": far, "near": near}, groups={"all": ["far", "near"]})
    for name in ["MCC", "pAUROC@0.2", "TNR@TPR0.9"]:
        for column, ev in [("far", far), ("near", near)]:
            expected = metric_function(name)(inside["A"], ev.ood_scores["A"])
            assert results.value("A", column, name) == expected
        mean = (results.value("A", "far", name) + results.value("A", "near", name)) / 2
        assert math.isclose(results.value("A", "all", name), mean, abs_tol=TOL)
    text = results.to_text(["MCC", "pAUROC@0.2"])
    assert "MCC: the best Matthews correlation over thresholds" in text
    assert "pAUROC@0.2: the ROC area for FPR in [0, 0.2], normalised" in text
    assert "MCC2" not in ALL_METRICS
    with pytest.raises(KeyError, match=r"unknown metric 'MCC2'; choose among"):
        results.value("A", "far", "MCC2")
    assert "MCC" not in far["A"]  # the eager dict stays ALL_METRICS


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([-math.inf, 0.0, 1.0, math.inf]), min_size=1, max_size=12),
    st.lists(st.sampled_from([-math.inf, 0.0, 1.0, math.inf]), min_size=1, max_size=12),
)
def test_infinite_scores_tie_with_their_equals(id_scores, ood_scores):
    """Equal infinities are ties: AUROC is the pair count, as for finite scores."""
    above = sum(o > i for o in ood_scores for i in id_scores)
    tied = sum(o == i for o in ood_scores for i in id_scores)
    expected = (above + tied / 2) / (len(id_scores) * len(ood_scores))
    assert math.isclose(auroc(id_scores, ood_scores), expected, abs_tol=TOL)
    assert auroc([math.inf] * 3, [math.inf] * 2) == 0.5
