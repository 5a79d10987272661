"""collect(..., part=K, parts=N, save=folder) and collect.merge: no process group.

Worker K reduces the K-th run of consecutive batches and saves its reducers'
states and concatenations; ``merge`` must give the result of one ``collect``
over every batch: moments and covariances to 1e-12 (Chan's merge of the
parts against one running update, both in float64), counts and
concatenations exactly, per-class statistics per class, and the quantile
sketch the merge of the parts' sketches in part order (the sketch is not
the one-pass sketch: it is checked against each part's reducer merged by
hand, and against the exact quantiles within its rank bound).
"""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.collect import collect, merge
from scio_recorder.reduce import (
    Covariance,
    Moments,
    PerClass,
    Quantiles,
    SharedCovariance,
)

N, BATCH, PARTS = 36, 4, 3  # 9 batches, 3 per part


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(5, 4),
        nn.ReLU(),
        nn.Linear(4, 4),
        nn.Tanh(),
        nn.Linear(4, 3),
        nn.ReLU(),
    )


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(N, 5, generator=gen) + 100.0  # an offset: precision matters
    y = torch.randint(0, 3, (N,), generator=gen)
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, N, BATCH)]


def share(part: int, parts: int = PARTS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = batches()
    size = -(-len(data) // parts)
    return data[part * size : (part + 1) * size]


def keep() -> dict:
    return {
        (1, 1): "concat",
        (1, 2): Moments(),
        (1, 3): Covariance(),
        (1, 4): SharedCovariance(num_classes=3),
        (1, 5): PerClass(Moments(), num_classes=3),
        (1, 6): Quantiles([0.1, 0.5, 0.9], k=8),
    }


@pytest.fixture
def rnet() -> Recorder:
    return Recorder(make_net(), input_size=(1, 5))


@pytest.fixture
def no_process_group(monkeypatch):
    def refuse(*args, **kwargs):
        msg = "a process group was created"
        raise AssertionError(msg)

    if dist.is_available():
        monkeypatch.setattr(dist, "init_process_group", refuse)
    yield
    assert not (dist.is_available() and dist.is_initialized())


def run_parts(rnet, folder, parts=PARTS, **options):
    return [
        collect(
            rnet, share(k, parts), keep(), target=1, part=k, parts=parts, save=folder,
            **options,
        )
        for k in range(parts)
    ]  # fmt: skip


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal to 1e-12 relative to the largest value (float64 on both sides)."""
    assert got.dtype == want.dtype == torch.float64
    scale = want.abs().max().clamp_min(1.0)
    return bool((got - want).abs().max() <= 1e-12 * scale)


def test_parts_merge_to_the_one_process_result(rnet, tmp_path, no_process_group):
    results = run_parts(rnet, tmp_path)
    merged = merge(tmp_path, rnet, keep())
    whole = collect(rnet, batches(), keep(), target=1)
    assert merged.samples == whole.samples == N
    assert merged.batches == whole.batches
    assert merged.rank_samples == (12, 12, 12)
    assert torch.equal(merged[(1, 1)], whole[(1, 1)])  # concatenation, in order
    moments, want = merged[(1, 2)], whole[(1, 2)]
    assert moments.count == want.count
    for field in ("mean", "var", "m2"):
        if hasattr(want, field):
            assert close(getattr(moments, field), getattr(want, field)), field
    assert close(merged[(1, 3)].cov, whole[(1, 3)].cov)
    assert close(merged[(1, 3)].mean, whole[(1, 3)].mean)
    cov, want_cov = merged[(1, 4)], whole[(1, 4)]
    assert close(cov.cov, want_cov.cov)
    assert close(cov.means, want_cov.means)
    assert torch.equal(cov.class_counts, want_cov.class_counts)
    assert merged[(1, 5)].keys() == whole[(1, 5)].keys()  # PerClass: per class
    for c, value in whole[(1, 5)].items():
        assert close(merged[(1, 5)][c].mean, value.mean)
        assert close(merged[(1, 5)][c].var, value.var)
    # the quantile sketch: the parts' sketches merged in part order, ...
    label = (1, 6)
    by_hand = keep()[label].fresh()
    for result in results:
        by_hand.merge(result.reducers[label])
    assert torch.equal(merged[label], by_hand.result())
    # ... whose ranks are within the sketch's bound of the levels asked for
    values = collect(rnet, batches(), {label: "concat"})[label]
    bound = merged.reducers[label].rank_error_bound
    for j, q in enumerate((0.1, 0.5, 0.9)):
        got = merged[label][j]
        assert ((values < got).sum(0) <= q * N + bound).all()
        assert ((values <= got).sum(0) >= q * N - bound).all()


def test_merge_takes_files_in_any_order_and_again(rnet, tmp_path):
    run_parts(rnet, tmp_path)
    files = sorted(tmp_path.glob("collect-part-*.safetensors"), reverse=True)
    assert [f.name for f in files][-1] == "collect-part-00000.safetensors"
    first, second = merge(files, rnet, keep()), merge(tmp_path, rnet, keep())
    assert torch.equal(first[(1, 1)], second[(1, 1)])
    assert torch.equal(first[(1, 2)].mean, second[(1, 2)].mean)


def test_a_missing_part_is_named(rnet, tmp_path):
    collect(rnet, share(1), keep(), target=1, part=1, parts=PARTS, save=tmp_path)
    with pytest.raises(ValueError, match="has 3 parts, and parts 0, 2 are missing"):
        merge(tmp_path, rnet, keep())
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        merge(tmp_path / "nothing", rnet, keep())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no part"):
        merge(tmp_path / "empty", rnet, keep())


def test_a_part_given_twice_or_of_another_count_is_refused(rnet, tmp_path):
    run_parts(rnet, tmp_path, parts=2)
    files = sorted(tmp_path.glob("*.safetensors"))
    with pytest.raises(ValueError, match="Part 1 is given twice"):
        merge([*files, files[1]], rnet, keep())
    collect(rnet, share(0, 3), keep(), target=1, part=0, parts=3, save=tmp_path / "b")
    with pytest.raises(ValueError, match="part 0 of 3 parts"):
        merge(
            [files[1], tmp_path / "b" / "collect-part-00000.safetensors"], rnet, keep()
        )


def test_a_part_run_otherwise_is_refused_naming_the_difference(rnet, tmp_path):
    collect(rnet, share(0, 2), keep(), target=1, part=0, parts=2, save=tmp_path)
    other = {**keep(), (1, 6): Quantiles([0.1, 0.5, 0.9], k=16)}
    collect(rnet, share(1, 2), other, target=1, part=1, parts=2, save=tmp_path)
    with pytest.raises(ValueError, match=r"Part 1 in .* was not run as part 0") as info:
        merge(tmp_path, rnet, keep())
    assert "- reducers of 1-6:" in str(info.value)
    assert "k=8" in str(info.value)


def test_a_part_of_other_weights_is_refused(rnet, tmp_path):
    # A worker that built its net without the seed: its statistics describe
    # another model, and merging them with the others' would be silently wrong.
    collect(rnet, share(0, 2), keep(), target=1, part=0, parts=2, save=tmp_path)
    other = make_net()
    with torch.no_grad():
        other[0].weight.add_(0.5)
    collect(
        Recorder(other, input_size=(1, 5)), share(1, 2), keep(), target=1, part=1,
        parts=2, save=tmp_path,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"Part 1 in .* was not run as part 0") as info:
        merge(tmp_path, rnet, keep())
    assert "- model weights: saved " in str(info.value)
    assert "the model of the others" in str(info.value)


def test_a_merge_with_another_keep_is_refused(rnet, tmp_path):
    run_parts(rnet, tmp_path, parts=2)
    with pytest.raises(ValueError, match="other labels than `keep` gives"):
        merge(tmp_path, rnet, {(1, 1): "concat"})


def test_a_part_rerun_replaces_its_own_file_only(rnet, tmp_path):
    run_parts(rnet, tmp_path, parts=2)
    other = (tmp_path / "collect-part-00000.safetensors").read_bytes()
    before = merge(tmp_path, rnet, keep())

    def dying():
        yield from share(1, 2)[:1]
        msg = "killed"
        raise KeyboardInterrupt(msg)

    with pytest.raises(KeyboardInterrupt):
        collect(rnet, dying(), keep(), target=1, part=1, parts=2, save=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "collect-part-00000.safetensors",
        "collect-part-00001.safetensors",
    ]
    collect(rnet, share(1, 2), keep(), target=1, part=1, parts=2, save=tmp_path)
    assert (tmp_path / "collect-part-00000.safetensors").read_bytes() == other
    after = merge(tmp_path, rnet, keep())
    assert torch.equal(after[(1, 1)], before[(1, 1)])
    assert torch.equal(after[(1, 2)].mean, before[(1, 2)].mean)


def test_a_part_spills_to_a_folder_of_its_own(rnet, tmp_path):
    collect(
        rnet, share(0, 2), keep(), target=1, part=0, parts=2, save=tmp_path / "parts",
        spill_dir=tmp_path / "spill", memory_budget=0,
    )  # fmt: skip
    assert (tmp_path / "spill" / "part-0" / "collect-manifest.json").is_file()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"part": 0, "parts": 2}, "needs `save=`"),
        ({"save": "x"}, "pass it with `part=` and `parts=`"),
        ({"part": 0, "save": "x"}, "`part` was given without `parts`"),
        ({"part": 3, "parts": 2, "save": "x"}, "got part=3, parts=2"),
    ],
)
def test_bad_parts_are_refused(rnet, tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        collect(rnet, share(0, 2), keep(), target=1, **options)


def test_a_part_in_a_process_group_is_refused(rnet, tmp_path, monkeypatch):
    monkeypatch.setattr("scio_recorder.collect._collect.rank_and_world", lambda: (0, 2))
    with pytest.raises(RuntimeError, match="process group of 2 ranks"):
        collect(rnet, share(0, 2), keep(), target=1, part=0, parts=2, save=tmp_path)


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, N // BATCH - 1), max_size=4, unique=True))
def test_any_split_of_the_batches_merges_to_the_one_process_result(cuts):
    """Parts of any sizes: the moments to 1e-12, the concatenation exactly."""
    rnet = Recorder(make_net(), input_size=(1, 5))
    small = {(1, 1): "concat", (1, 2): Moments(), (1, 6): Covariance()}
    data = batches()
    bounds = [0, *sorted(cuts), len(data)]
    parts = len(bounds) - 1
    with tempfile.TemporaryDirectory() as folder:
        for part in range(parts):
            mine = data[bounds[part] : bounds[part + 1]]
            collect(rnet, mine, small, part=part, parts=parts, save=folder)
        merged = merge(folder, rnet, small)
    whole = collect(rnet, data, small)
    assert torch.equal(merged[(1, 1)], whole[(1, 1)])
    assert close(merged[(1, 2)].mean, whole[(1, 2)].mean)
    assert close(merged[(1, 2)].var, whole[(1, 2)].var)
    assert close(merged[(1, 6)].cov, whole[(1, 6)].cov)
    assert merged.rank_samples == tuple(
        BATCH * (bounds[k + 1] - bounds[k]) for k in range(parts)
    )
