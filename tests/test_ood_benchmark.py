"""The OpenOOD-style benchmark runner: protocol, seeds, spread, group means."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from scio_recorder import Recorder, ood
from scio_recorder.models import demo_model
from scio_recorder.ood import KNN, Detector, OoDResults
from scio_recorder.ood._catalogue import LANGUAGE_MODELS
from scio_recorder.ood.benchmark import (
    CATALOGUE,
    BenchmarkResults,
    catalogue,
    load_benchmark,
    run_benchmark,
)

FEW = ["MSP", "Energy", "KNN", "Mahalanobis"]
SETS = ["digits-6-9", "noise", "inverted", "rotated"]


@pytest.fixture(scope="module")
def two_seeds() -> BenchmarkResults:
    return run_benchmark(FEW, seeds=(0, 1), quick=True)


# ----------------------------------------------------------------- the protocol
@pytest.mark.parametrize("seed", [0, 1])
def test_the_digits_protocol_is_an_open_set_split(seed):
    data = load_benchmark("digits", seed=seed)
    train_x, train_y = data.train
    test_x, test_y = data.test
    val_x, val_y = data.val
    assert data.num_classes == 6
    assert data.input_size == (1, 1, 8, 8)
    # ID: digits 0-5 only, split three ways without overlap, every ID image used
    for labels in (train_y, test_y, val_y):
        assert int(labels.max()) <= 5
        assert set(labels.tolist()) == set(range(6))
    assert len(train_x) + len(val_x) + len(test_x) == 1083  # digits 0-5
    rows = {tuple(x.flatten().tolist()) for x in torch.cat([train_x, val_x, test_x])}
    assert len(rows) > 1000  # (a few digits are drawn identically)
    # near-OoD: the digits the net never sees; far-OoD: the test digits changed
    assert list(data.near) == ["digits-6-9"]
    assert list(data.far) == ["noise", "inverted", "rotated"]
    assert len(data.near["digits-6-9"]) == 714
    assert torch.equal(data.far["inverted"], 1 - test_x)
    assert torch.equal(data.far["rotated"], torch.rot90(test_x, 1, dims=(2, 3)))
    for x in data.far.values():
        assert x.shape == test_x.shape
        assert float(x.min()) >= 0
        assert float(x.max()) <= 1


def test_each_seed_draws_its_own_split():
    first, second = load_benchmark(seed=0), load_benchmark(seed=1)
    assert not torch.equal(first.test[0], second.test[0])
    assert not torch.equal(first.far["noise"], second.far["noise"])
    again = load_benchmark(seed=0)
    assert torch.equal(first.train[0], again.train[0])
    assert torch.equal(first.far["noise"], again.far["noise"])


def test_the_blobs_protocol_has_the_hard_near_sets():
    data = load_benchmark("blobs", seed=0, quick=True)
    assert list(data.near) == ["shapes", "colours"]
    assert list(data.far) == ["noise"]
    assert data.input_size == (1, 3, 32, 32)


def test_unknown_benchmark_names_the_known_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown benchmark 'mnist'; choose among \['digits', 'blobs'\]",
    ):
        load_benchmark("mnist")
    with pytest.raises(ValueError, match=r"unknown benchmark 'mnist'"):
        run_benchmark(["MSP"], benchmark="mnist")


def test_catalogue_builds_every_detector_for_both_nets():
    classes = {
        getattr(ood, name)
        for name in ood.__all__
        if isinstance(getattr(ood, name), type)
        and issubclass(getattr(ood, name), Detector)
        and getattr(ood, name) not in {Detector, ood.ClassConditional}
        and name not in LANGUAGE_MODELS  # language models only
    }
    rnet = Recorder(demo_model(), input_size=(1, 3, 32, 32))
    built = catalogue(rnet, blocks=("features.1", "features.4"))
    assert {type(d) for d in built.values()} == classes  # the whole catalogue
    # Keys are class names; Mahalanobis++ and RMDS++ are normalize=True.
    assert all(type(d).__name__ == name.removesuffix("++") for name, d in built.items())
    assert [n for n, d in built.items() if getattr(d, "normalize", False)] == [
        "Mahalanobis++",
        "RMDS++",
    ]
    assert tuple(built) == CATALOGUE  # the names run_benchmark knows


# ----------------------------------------------------------- seeds and spread
def test_results_have_the_sets_the_groups_and_one_value_per_seed(two_seeds):
    results = two_seeds
    assert results.seeds == [0, 1]
    assert results.detectors == FEW
    assert results.columns == [*SETS, "near mean", "far mean"]
    assert results.groups == {"near mean": ["digits-6-9"], "far mean": SETS[1:]}
    assert all(isinstance(run.results, OoDResults) for run in results.runs)
    assert len(results.accuracy) == 2
    assert all(0.8 < a <= 1 for a in results.accuracy)
    for detector in FEW:
        for column in results.columns:
            assert len(results.values(detector, column, "AUROC")) == 2


def test_mean_and_std_are_over_the_seeds(two_seeds):
    results = two_seeds
    for detector in FEW:
        for metric in ("AUROC", "FPR95-ID"):
            # the far mean is taken per seed over its three sets, then over seeds
            per_seed = [
                math.fsum(run.results[s][detector][metric] for s in SETS[1:]) / 3
                for run in results.runs
            ]
            # fsum of three values, then of two: a few float64 roundings of
            # numbers <= 1, so 1e-12 is far above the error and far below 1e-3
            assert results.values(detector, "far mean", metric) == pytest.approx(
                per_seed, abs=1e-12
            )
            assert results.mean(detector, "far mean", metric) == pytest.approx(
                statistics.mean(per_seed), abs=1e-12
            )
            assert results.std(detector, "far mean", metric) == pytest.approx(
                statistics.stdev(per_seed), abs=1e-12
            )
            near = [run.results["digits-6-9"][detector][metric] for run in results.runs]
            assert results.values(detector, "near mean", metric) == near


def test_seeds_spread_the_numbers(two_seeds):
    spreads = [two_seeds.std(d, c, "AUROC") for d in FEW for c in two_seeds.columns]
    assert max(spreads) > 0.001  # another split and other weights: other numbers


def test_a_seed_gives_the_same_numbers_alone_or_among_others(two_seeds):
    alone = run_benchmark(FEW, seeds=(1,), quick=True)
    for detector in FEW:
        for column in two_seeds.columns:
            for metric in ("AUROC", "FPR95-ID", "AUPR-IN"):
                assert (
                    alone.values(detector, column, metric)
                    == two_seeds.values(detector, column, metric)[1:]
                )
    assert alone.std("KNN", "noise", "AUROC") == 0.0  # one seed: no spread
    assert alone.accuracy == two_seeds.accuracy[1:]


def test_the_tables_are_aligned_and_name_their_conventions(two_seeds):
    text = str(two_seeds)
    assert "mean ± std over the seeds (sample std, n - 1)" in text
    assert "FPR95-ID: false-positive rate at 95 % ID recall (ID positive" in text
    assert "AUROC < 0.5 means a reversed ranking" in text
    blocks = text.split("\n\n")[1:]
    assert [b.splitlines()[0] for b in blocks] == ["AUROC", "FPR95-ID"]
    for block in blocks:
        lines = block.splitlines()[1:]
        assert len(lines) == 1 + len(FEW)
        assert len({len(line) for line in lines}) == 1  # right-aligned cells
    knn = two_seeds.mean("KNN", "far mean", "AUROC")
    assert f"{knn:.3f} ± " in text
    markdown = two_seeds.to_markdown(["AUROC"], columns=["near mean", "far mean"])
    assert "| detector | near mean | far mean |" in markdown
    assert markdown.count("\n| ") == 1 + len(FEW)


def test_bad_names_are_refused_naming_the_known_ones(two_seeds):
    with pytest.raises(
        ValueError, match=r"unknown detectors \['KNNN'\]; the catalogue has \[.*'KNN'"
    ):
        run_benchmark(["KNNN"], seeds=(0,))
    with pytest.raises(ValueError, match=r"at least one seed"):
        run_benchmark(["MSP"], seeds=())
    with pytest.raises(
        ValueError, match=r"^unknown metric 'AUC'; choose among AUROC, AUPR-IN"
    ):
        two_seeds.to_text(["AUC"])
    with pytest.raises(
        ValueError, match=r"unknown columns \['mnist'\]; the results have"
    ):
        two_seeds.to_markdown(columns=["mnist"])
    with pytest.raises(KeyError, match=r"no detector named 'ViM'"):
        two_seeds.mean("ViM", "noise", "AUROC")


@pytest.mark.slow
def test_detectors_of_your_own_are_built_for_each_seed():
    built = []

    def make(rnet):
        built.append(rnet)
        return KNN(rnet, k=3)

    results = run_benchmark({"KNN k=3": make}, seeds=(0, 1), quick=True)
    assert results.detectors == ["KNN k=3"]
    assert len(built) == 2
    assert built[0] is not built[1]  # a new net per seed


def test_the_thread_count_is_restored():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # not the 1 the run asks for (the tests run on 1)
    try:
        run_benchmark(["MSP"], seeds=(0,), quick=True, threads=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
