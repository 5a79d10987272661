"""Pictures under the Agg backend: axes, artists, and PNG files."""

from __future__ import annotations

import itertools
import re
import sys

import pytest
import torch

pytest.importorskip("matplotlib")

from scio_recorder import plot
from scio_recorder.ood import Evaluation


@pytest.fixture
def evaluation():
    gen = torch.Generator().manual_seed(0)
    inside = {"A": torch.randn(40, generator=gen), "B": torch.randn(40, generator=gen)}
    outside = {
        "A": torch.randn(30, generator=gen) + 2,
        "B": torch.randn(30, generator=gen),
    }
    return Evaluation(inside, outside, "noise")


def saves_a_png(fig, tmp_path):
    path = tmp_path / "fig.png"
    fig.savefig(path)
    return path.read_bytes().startswith(b"\x89PNG")


def test_score_histograms_one_panel_per_detector(evaluation, tmp_path):
    fig = plot.score_histograms(evaluation)
    assert [ax.get_title() for ax in fig.axes] == [
        f"A (AUROC {evaluation['A']['AUROC']:.2f})",
        f"B (AUROC {evaluation['B']['AUROC']:.2f})",
    ]
    assert all(len(ax.patches) == 2 * 40 for ax in fig.axes)  # two histograms
    assert saves_a_png(fig, tmp_path)
    with pytest.raises(KeyError, match=re.escape("no detector named ['C']")):
        plot.score_histograms(evaluation, ["C"])


def test_roc_curves_in_one_panel_or_a_given_axes(evaluation, tmp_path):
    fig = plot.roc_curves(evaluation)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines][:2] == [
        f"A ({evaluation['A']['AUROC']:.2f})",
        f"B ({evaluation['B']['AUROC']:.2f})",
    ]
    assert saves_a_png(fig, tmp_path)
    other = plot.score_histograms(evaluation, ["A"])
    assert plot.roc_curves(evaluation, ["B"], ax=other.axes[0]) is other


def test_gradcam_overlay_and_feature_maps(tmp_path):
    fig = plot.gradcam_overlay(
        torch.rand(3, 3, 8, 8), torch.rand(3, 8, 8), titles=["a", "b", "c"]
    )
    *panels, _colour_bar = fig.axes
    assert [len(ax.images) for ax in panels] == [2, 2, 2]
    assert [ax.get_title() for ax in panels] == ["a", "b", "c"]
    assert saves_a_png(fig, tmp_path)
    with pytest.raises(ValueError, match="must share the batch"):
        plot.gradcam_overlay(torch.rand(3, 3, 8, 8), torch.rand(3, 4, 4))
    maps = plot.feature_maps(torch.rand(1, 20, 5, 5), max_maps=12, title="conv1")
    assert len(maps.axes) == 12
    assert maps.get_suptitle() == "conv1"
    with pytest.raises(ValueError, match=r"^feature_maps takes \[C, H, W\]"):
        plot.feature_maps(torch.rand(5, 5))


def test_activation_histograms(tmp_path):
    fig = plot.activation_histograms(
        {(1, 1): torch.randn(8, 4), "fc": torch.rand(8, 2), (2, 1): None}
    )
    assert [ax.get_title() for ax in fig.axes] == ["1-1", "fc"]
    assert saves_a_png(fig, tmp_path)
    with pytest.raises(ValueError, match="no tensor among the records"):
        plot.activation_histograms({})


def test_without_matplotlib_the_error_says_how_to_install(monkeypatch, evaluation):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(
        RuntimeError, match=re.escape("pip install 'scio-recorder[plot]'")
    ):
        plot.score_histograms(evaluation)


# ------------------------------------------------- pictures fit for a talk
def many(count: int, *, size: int = 30, heavy: bool = False) -> Evaluation:
    gen = torch.Generator().manual_seed(1)
    draw = (
        (lambda: torch.rand(size, generator=gen) ** -3)  # Pareto-like tail
        if heavy
        else (lambda: torch.randn(size, generator=gen))
    )
    names = [f"D{i}" for i in range(count)]
    return Evaluation({n: draw() for n in names}, {n: draw() + 1 for n in names}, "far")


@pytest.mark.parametrize(
    ("count", "columns"),
    [
        (1, 4),
        (5, 4),
        pytest.param(7, 4, marks=pytest.mark.slow),
        pytest.param(9, 4, marks=pytest.mark.slow),
    ],
)
def test_score_histograms_no_empty_panel_and_one_figure_legend(count, columns):
    fig = plot.score_histograms(many(count), columns=columns)
    assert len(fig.axes) == count  # one panel per detector, nothing else
    rows, cols = fig.axes[0].get_subplotspec().get_geometry()[:2]
    assert rows * cols - count < rows  # balanced: no row mostly empty
    assert [ax.get_legend() for ax in fig.axes] == [None] * count
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["in-distribution", "far"]


def test_score_histograms_of_several_sets_share_one_legend(evaluation):
    other = Evaluation(evaluation.id_scores, evaluation.ood_scores, "flat")
    fig = plot.score_histograms({"noise": evaluation, "flat": other})
    assert len(fig.axes) == 4
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "in-distribution",
        "noise",
        "flat",
    ]
    colours = {  # the same set, the same colour in every panel
        (c.get_label(), c.patches[0].get_facecolor())
        for ax in fig.axes
        for c in ax.containers
    }
    assert len(colours) == 3


def test_score_histograms_log_symlog_and_clipped_axes():
    heavy = many(2, size=200, heavy=True)
    fig = plot.score_histograms(heavy, scale="log")
    assert {ax.get_xscale() for ax in fig.axes} == {"log"}
    edges = [p.get_x() for p in fig.axes[0].containers[0].patches]
    ratios = [b / a for a, b in itertools.pairwise(edges)]
    assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)  # log-spaced bins

    assert {
        ax.get_xscale() for ax in plot.score_histograms(many(2), scale="symlog").axes
    } == {"symlog"}
    with pytest.raises(
        ValueError,
        match=r"scale='log' needs positive scores, but detector 'D0' .* scale='symlog'",
    ):
        plot.score_histograms(many(2), scale="log")
    with pytest.raises(
        ValueError, match=r"scale='cubic'; use one of \('linear', 'log', 'symlog'\)"
    ):
        plot.score_histograms(heavy, scale="cubic")

    scores = torch.cat([heavy.id_scores["D0"], heavy.ood_scores["D0"]]).double()
    low, high = torch.quantile(scores, torch.tensor([0.05, 0.95], dtype=torch.float64))
    fig = plot.score_histograms(heavy, ["D0"], clip=(0.05, 0.95))
    (ax,) = fig.axes
    patches = [p for bars in ax.containers for p in bars.patches]
    left = min(p.get_x() for p in patches)
    right = max(p.get_x() + p.get_width() for p in patches)
    # numpy's and torch's linear quantile interpolation agree to a few ulps
    assert (left, right) == pytest.approx((low.item(), high.item()), rel=1e-9)
    assert "clipped to the 0.05-0.95 quantiles" in ax.get_xlabel()
    # clipped scores are counted in the end bins: every set still sums to 1
    for bars in ax.containers:
        assert sum(p.get_height() for p in bars.patches) == pytest.approx(1)
    with pytest.raises(ValueError, match=r"clip=\(0.9, 0.1\) must be two quantiles"):
        plot.score_histograms(heavy, clip=(0.9, 0.1))


def test_detector_colours_are_distinct_for_any_count():
    for count in (1, 10, 11, 25, 60):
        assert len(set(plot.detector_colours(count))) == count
    fig = plot.roc_curves(many(25))
    curves = fig.axes[0].lines[:25]
    assert len({(line.get_color(), line.get_linestyle()) for line in curves}) == 25
    assert len({line.get_color() for line in curves}) == 25
    assert len(plot.pr_curves(many(25)).axes[0].lines) == 25 + 1  # and chance


def test_pr_curves_equal_scikit_learn(evaluation, tmp_path):
    metrics = pytest.importorskip("sklearn.metrics")
    fig = plot.pr_curves(evaluation)
    (ax,) = fig.axes
    for line, name in zip(ax.lines, ["A", "B"], strict=False):
        inside = evaluation.id_scores[name].double().numpy()
        outside = evaluation.ood_scores[name].double().numpy()
        labels = [0] * inside.size + [1] * outside.size
        precision, recall, _ = metrics.precision_recall_curve(
            labels, list(inside) + list(outside)
        )
        # the same counts divided the same way: equal to the last bit
        assert line.get_xdata().tolist() == recall.tolist()
        assert line.get_ydata().tolist() == precision.tolist()
        assert line.get_label() == (
            f"{name} (AUPR-In {evaluation[name]['AUPR-IN']:.2f}, "
            f"AUPR-Out {evaluation[name]['AUPR-OUT']:.2f})"
        )
    assert ax.lines[-1].get_ydata()[0] == pytest.approx(30 / 70)  # chance
    assert saves_a_png(fig, tmp_path)
    # ID positive: scikit-learn on negated scores, ID labelled 1
    (ax,) = plot.pr_curves(evaluation, ["A"], positive="id").axes
    inside = evaluation.id_scores["A"].double().numpy()
    outside = evaluation.ood_scores["A"].double().numpy()
    precision, recall, _ = metrics.precision_recall_curve(
        [1] * inside.size + [0] * outside.size, list(-inside) + list(-outside)
    )
    assert ax.lines[0].get_xdata().tolist() == recall.tolist()
    assert ax.lines[0].get_ydata().tolist() == precision.tolist()
    with pytest.raises(ValueError, match=r"positive='both'; use 'ood'"):
        plot.pr_curves(evaluation, positive="both")


def test_pr_curves_take_what_roc_curves_takes(evaluation):
    other = Evaluation(evaluation.id_scores, evaluation.ood_scores, "flat")
    results = {"noise": evaluation, "flat": other}
    fig = plot.pr_curves(results)
    assert [ax.get_title() for ax in fig.axes] == [
        "precision-recall, noise (OOD positive)",
        "precision-recall, flat (OOD positive)",
    ]
    host = plot.roc_curves(evaluation)
    assert plot.pr_curves(results, sets=["flat"], ax=host.axes[0]) is host
    with pytest.raises(ValueError, match=r"^pr_curves: one `ax` cannot hold the 2"):
        plot.pr_curves(results, ax=host.axes[0])


def test_gradcam_overlay_blends_and_names_layer_and_classes():
    cams = torch.zeros(2, 8, 8)
    cams[:, 2:4, 2:4] = 1.0
    fig = plot.gradcam_overlay(
        torch.rand(2, 3, 8, 8),
        cams,
        layer="features.3 (2-4)",
        predicted=torch.tensor([1, 2]),
        true=[1, 0],
        class_names=["circle", "square", "star"],
        alpha=0.6,
    )
    *panels, bar = fig.axes
    assert fig.get_suptitle() == "Grad-CAM of features.3 (2-4)"
    assert [ax.get_title() for ax in panels] == [
        "predicted square, true square",
        "predicted star, true circle",
    ]
    assert panels[1].title.get_color() == "#c00000"  # the wrong one in red
    assert bar.get_ylabel() == "Grad-CAM (0: no evidence, 1: most)"
    assert bar.get_ylim() == (0.0, 1.0)
    heat = panels[0].images[1]
    alpha = heat.get_alpha()
    assert alpha.max() == pytest.approx(0.6)
    assert alpha[0, 0] == 0  # no heat: the image shows unchanged
    with pytest.raises(ValueError, match=r"class 3 has no entry in the 3 class_names"):
        plot.gradcam_overlay(
            torch.rand(1, 3, 8, 8), cams[:1], predicted=[3], class_names=["a", "b", "c"]
        )
    with pytest.raises(ValueError, match=r"true= has 1 entries for 2 images"):
        plot.gradcam_overlay(torch.rand(2, 3, 8, 8), cams, true=[0])
