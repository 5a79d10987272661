"""OoD metrics against scikit-learn and hand-written definitions; results tables.

The metrics are computed in float64 from the same scores on both sides, so
they agree with scikit-learn to float64 rounding of a sum of at most ~50
terms in [0, 1] (abs 1e-12 is far above it, far below any real difference,
which is at least 1 / (50 * 50)).
"""

from __future__ import annotations

import math
import re
import sys

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
    fpr_at_id_recall,
    fpr_at_ood_recall,
    fpr_at_tpr,
    ood_metrics,
    roc_curve,
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
    with pytest.raises(ValueError, match=r"^recall must be in \(0, 1\], got 95"):
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
