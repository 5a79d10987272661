"""The Mahalanobis recipe end to end, its helpers, the deprecated module."""

from __future__ import annotations

import contextlib
import importlib
import io
import itertools
import json
import math
import re
from importlib import resources
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from sklearn.metrics import roc_auc_score

from scio_recorder import recipes
from scio_recorder.data import (
    class_colours,
    load_digits,
    make_blobs_images,
    train_classifier,
)
from scio_recorder.ood import mahalanobis_scores
from scio_recorder.ood.metrics import auroc

ROOT = Path(__file__).parents[1]
RECIPE = ROOT / "docs" / "recipes" / "mahalanobis.md"
NOTEBOOK = ROOT / "notebooks" / "mahalanobis.ipynb"


def recipe_blocks() -> list[str]:
    """The Python code blocks of the recipe, in order."""
    text = RECIPE.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 5, "the recipe lost its code blocks"
    return blocks


def recipe_code() -> str:
    return "\n".join(recipe_blocks())


# ------------------------------------------------------------------ the recipe


@pytest.fixture(scope="module")
def recipe_run():
    """Run the recipe's code once: its namespace and printed lines.

    On one torch thread: on a busy machine (CI, other jobs), threads that spin
    waiting for each other can make a tiny training loop ten times slower.
    """
    code = compile(recipe_code(), str(RECIPE), "exec")
    namespace: dict[str, object] = {"__name__": "recipe"}
    out = io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out):
            exec(code, namespace)  # noqa: S102 (the documentation's own code)
    finally:
        torch.set_num_threads(threads)
    return namespace, out.getvalue().splitlines()


@pytest.mark.slow
def test_recipe_runs_end_to_end(recipe_run):
    """The recipe trains, calibrates and separates OoD data as its text says."""
    namespace, printed = recipe_run
    assert namespace["train_accuracy"] > 0.9
    assert namespace["test_accuracy"] > 0.9
    assert namespace["auroc_noise"] > 0.9
    assert namespace["auroc_squares"] > 0.8
    stats = namespace["stats"]
    assert stats.count == 2000
    assert stats.class_counts.tolist() == [200] * 10
    assert "2-9 (ReLU `classifier.2`)" in printed
    # the recipe's detector scores minus mahalanobis_scores, from the same
    # features and statistics (float64 both, other operation orders)
    maha, test_x = namespace["maha"], namespace["test_x"]
    torch.testing.assert_close(
        mahalanobis_scores(namespace["features"], stats.means, stats.cov),
        -maha(test_x[:8]),
    )


@pytest.mark.slow
def test_recipe_comments_match_printed_lines(recipe_run):
    """The ``# ...`` line after each print shows what that print prints.

    Decimal numbers may move a little with the machine, the thread count or
    the torch version (training amplifies rounding), so they are compared
    within 2 % or 2 units in their last place; everything else exactly.
    """
    _, printed = recipe_run
    lines = recipe_code().splitlines()
    expected = [
        line.strip()[2:]
        for previous, line in itertools.pairwise(lines)
        if line.strip().startswith("# ")
        and ("print(" in previous or previous.strip().endswith(")"))
    ]
    assert len(printed) == len(expected), (printed, expected)
    number = re.compile(r"-?\d+\.\d+")
    for want, got in zip(expected, printed, strict=True):
        assert number.sub("#", want) == number.sub("#", got), (want, got)
        for a, b in zip(number.findall(want), number.findall(got), strict=True):
            ulp = 10.0 ** -len(a.split(".")[1])
            assert abs(float(a) - float(b)) <= max(2 * ulp, 0.02 * abs(float(a))), (
                want,
                got,
            )


def test_notebook_holds_the_recipe_code():
    """The notebook's code cells are the recipe's blocks, without output lines."""
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in cells)
    code = ["".join(c["source"]) for c in cells]
    expected = []
    for block in recipe_blocks():
        kept: list[str] = []
        for line in block.splitlines():
            if line.startswith("# ") and kept and "print(" in kept[-1]:
                continue
            kept.append(line)
        expected.append("\n".join(kept))
    assert [c.strip("\n") for c in code] == [e.strip("\n") for e in expected]


# ------------------------------------------------------------ make_blobs_images


@pytest.mark.parametrize("pattern", ["blob", "square", "noise"])
def test_make_blobs_images_is_deterministic_under_a_seed(pattern):
    x1, y1 = make_blobs_images(
        64, num_classes=5, image_size=16, pattern=pattern, seed=7
    )
    torch.manual_seed(123)  # the global generator plays no part
    x2, y2 = make_blobs_images(
        64, num_classes=5, image_size=16, pattern=pattern, seed=7
    )
    assert torch.equal(x1, x2)
    assert torch.equal(y1, y2)
    x3, _ = make_blobs_images(64, num_classes=5, image_size=16, pattern=pattern, seed=8)
    assert not torch.equal(x1, x3)


def test_make_blobs_images_shapes_and_labels():
    x, y = make_blobs_images(103, num_classes=10, image_size=12, seed=0)
    assert x.shape == (103, 3, 12, 12)
    assert x.dtype == torch.float32
    assert y.dtype == torch.int64
    counts = torch.bincount(y, minlength=10)
    assert counts.max() - counts.min() <= 1
    assert int(counts.sum()) == 103


def test_make_blobs_images_colour_is_the_class():
    x, y = make_blobs_images(200, num_classes=4, noise=0.0, seed=0)
    mean_colour = x.mean(dim=(2, 3))  # [N, 3]
    colours = class_colours(4)
    nearest = (mean_colour @ colours.T).argmax(1)
    assert torch.equal(nearest, y)


def test_make_blobs_images_noise_pattern_has_no_object():
    x, _ = make_blobs_images(500, pattern="noise", seed=0)
    assert abs(x.mean().item()) < 0.01
    assert abs(x.std().item() - 1.0) < 0.01


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_samples": -1},
        {"num_samples": 4, "num_classes": 0},
        {"num_samples": 4, "image_size": 0},
        {"num_samples": 4, "noise": -0.1},
        {"num_samples": 4, "pattern": "stripes"},
    ],
)
def test_make_blobs_images_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="make_blobs_images"):
        make_blobs_images(**kwargs)


def test_class_colours_have_equal_norm_and_zero_sum():
    colours = class_colours(7).double()
    zeros = torch.zeros(7, dtype=torch.float64)
    assert torch.allclose(colours.sum(1), zeros, atol=1e-6)
    norms = torch.full((7,), math.sqrt(1.5), dtype=torch.float64)
    assert torch.allclose(colours.norm(dim=1), norms)
    with pytest.raises(ValueError, match="num_classes"):
        class_colours(0)


def test_train_classifier_fits_separable_data():
    torch.manual_seed(0)
    x = torch.randn(300, 2)
    y = (x[:, 0] + x[:, 1] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    accuracy = train_classifier(net, x, y, epochs=30, batch_size=50, lr=0.05)
    assert accuracy > 0.95
    assert not net.training


# ----------------------------------------------------------- mahalanobis_scores


def direct_scores(features, means, cov):
    """Score each sample on its own: -min_c (f - mu_c)^T cov^-1 (f - mu_c)."""
    inverse = torch.linalg.inv(cov.double())
    scores = []
    for f in features.double():
        distances = [float((f - m) @ inverse @ (f - m)) for m in means.double()]
        scores.append(-min(distances))
    return torch.tensor(scores, dtype=torch.float64)


@st.composite
def problems(draw):
    n = draw(st.integers(1, 6))
    c = draw(st.integers(1, 4))
    f = draw(st.integers(1, 4))
    values = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=32)
    features = torch.tensor(draw(st.lists(values, min_size=n * f, max_size=n * f)))
    means = torch.tensor(draw(st.lists(values, min_size=c * f, max_size=c * f)))
    entries = st.floats(-2, 2, allow_nan=False, allow_infinity=False, width=32)
    a = torch.tensor(draw(st.lists(entries, min_size=f * f, max_size=f * f)))
    a = a.reshape(f, f).double()
    cov = a @ a.T + 0.5 * torch.eye(f, dtype=torch.float64)  # eigenvalues >= 0.5
    return features.reshape(n, f), means.reshape(c, f), cov


@settings(max_examples=60, deadline=None)
@given(problems())
def test_mahalanobis_scores_equal_the_direct_computation(problem):
    features, means, cov = problem
    got = mahalanobis_scores(features, means, cov)
    want = direct_scores(features, means, cov)
    assert got.dtype == torch.float64
    assert got.shape == (features.shape[0],)
    assert torch.allclose(got, want, rtol=1e-8, atol=1e-8)
    assert bool((got <= 1e-9).all())


def test_mahalanobis_scores_ignore_dead_features():
    """A zero-variance feature (a dead ReLU) leaves the score finite."""
    torch.manual_seed(0)
    live = torch.randn(50, 3).double()
    features = torch.cat([live, torch.zeros(50, 1, dtype=torch.float64)], dim=1)
    means = torch.cat([torch.randn(4, 3).double(), torch.zeros(4, 1)], dim=1)
    cov = torch.zeros(4, 4, dtype=torch.float64)
    cov[:3, :3] = torch.cov(live.T)
    got = mahalanobis_scores(features, means, cov)
    assert bool(torch.isfinite(got).all())
    assert torch.allclose(got, direct_scores(live, means[:, :3], cov[:3, :3]))


def test_mahalanobis_scores_flatten_feature_maps_and_check_shapes():
    features = torch.randn(5, 2, 1, 1)
    means = torch.randn(3, 2)
    cov = torch.eye(2)
    flat = mahalanobis_scores(features.flatten(1), means, cov)
    assert torch.equal(mahalanobis_scores(features, means, cov), flat)
    with pytest.raises(ValueError, match="class_means"):
        mahalanobis_scores(features, torch.randn(3, 4), cov)
    with pytest.raises(ValueError, match="class_means"):
        mahalanobis_scores(features, torch.zeros(0, 2), cov)
    with pytest.raises(ValueError, match="shared_cov"):
        mahalanobis_scores(features, means, torch.eye(3))


# --------------------------------------------------- the deprecated module


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("mahalanobis_scores", "scio_recorder.ood"),
        ("make_blobs_images", "scio_recorder.data"),
        ("train_classifier", "scio_recorder.data"),
        ("class_colours", "scio_recorder.data"),
        ("Pattern", "scio_recorder.data"),
    ],
)
def test_recipes_names_still_import_with_a_warning_naming_their_new_place(name, where):
    """The public API is a contract: the old import works, and says where to go."""
    msg = (
        rf"^scio_recorder\.recipes\.{name} moved: import it from {re.escape(where)} "
        rf"\(`from {re.escape(where)} import {name}`\); scio_recorder\.recipes will "
        r"be removed\.$"
    )
    with pytest.warns(DeprecationWarning, match=msg):
        old = getattr(recipes, name)
    assert old is getattr(importlib.import_module(where), name)
    with pytest.warns(DeprecationWarning, match=msg):
        exec(f"from scio_recorder.recipes import {name}", {})  # noqa: S102 (fixed)
    assert name in dir(recipes)


def test_mahalanobis_scores_lives_in_ood_next_to_its_detector():
    """One definition, defined in ood (not re-created by the old module)."""
    assert mahalanobis_scores.__module__ == "scio_recorder.ood._features"
    assert "mahalanobis_scores" in importlib.import_module("scio_recorder.ood").__all__


# ------------------------------------------------------------------------ auroc


def test_recipes_auroc_is_removed_and_names_its_replacement():
    """Only one AUROC is left: the removed name says what to use, and how."""
    msg = (
        r"scio_recorder.recipes.auroc was removed: .* returned 1 - x where "
        r"scio_recorder.ood.metrics.auroc returns x on the same lists. Use "
        r"`from scio_recorder.ood.metrics import auroc`: .* counts OoD samples as "
        r"positives \(higher score = more OoD"
    )
    with pytest.raises(ImportError, match=msg):
        from scio_recorder.recipes import auroc as _  # noqa: PLC0415, F401
    with pytest.raises(ImportError, match=msg):
        recipes.auroc  # noqa: B018 (the attribute access is the test)
    assert "auroc" not in recipes.__all__
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        recipes.nothing  # noqa: B018


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=1, max_size=20),
    st.lists(st.integers(-3, 3), min_size=1, max_size=20),
)
def test_negated_confidence_scores_give_the_removed_auroc(pos, neg):
    """The migration the message gives: ``auroc(-in, -out)`` is the old number.

    The removed function was P(in > out) + P(in == out) / 2 on confidence
    scores (higher = more in-distribution); sklearn with the in-distribution
    samples as positives is the oracle. Small integers make ties the rule.
    """
    old = roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg)
    got = auroc(-np.array(pos, dtype=float), -np.array(neg, dtype=float))
    # sums of at most 400 pair counts in float64: a few ulps
    assert got == pytest.approx(old, abs=1e-12)
    assert auroc(pos, neg) == pytest.approx(1 - old, abs=1e-12)


# ------------------------------------------------------------------ load_digits
def test_the_shipped_digits_are_scikit_learns():
    datasets = pytest.importorskip("sklearn.datasets")
    reference = datasets.load_digits()
    counts, labels = load_digits(normalize=False)
    assert counts.shape == (1797, 1, 8, 8)
    assert counts.dtype == torch.float32
    assert np.array_equal(counts[:, 0].numpy(), reference.images)  # exact: 0..16
    assert np.array_equal(labels.numpy(), reference.target)
    images, again = load_digits()
    assert torch.equal(images, counts / 16)
    assert torch.equal(labels, again)


def test_the_digits_ship_with_their_licence():
    folder = resources.files("scio_recorder") / "_data"
    licence = (folder / "LICENSE-digits").read_text(encoding="utf-8")
    assert "BSD 3-Clause" in licence
    assert "UCI" in licence
    assert "scikit-learn" in licence
