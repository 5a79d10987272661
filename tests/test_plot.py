"""Pictures under the Agg backend: axes, artists, and PNG files."""

from __future__ import annotations

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
    assert [len(ax.images) for ax in fig.axes] == [2, 2, 2]
    assert [ax.get_title() for ax in fig.axes] == ["a", "b", "c"]
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
