"""activations.write(..., part=K, parts=N) and merge: many workers, no process group.

Worker K writes part K of a tiny GPT-2's token stream (the K-th run of
consecutive batches) knowing nothing of the others; ``merge`` must give the
set a one-process ``write`` of the whole stream gives: the same rows in the
same order (part 0's first), bit for bit (every write runs the same batch
shapes through the same kernels in one process), valid checksums, and the
same statistics up to float64 rounding (Chan's merge of the parts against
one running update: 1e-12 relative). The subprocess test runs the workers
as separate processes, as a SLURM array would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scio_recorder import Recorder
from scio_recorder.activations import ActivationDataset, merge, write
from scio_recorder.cli import main as cli_main
from tests.lms import VOCAB, gpt2

LAYERS = ["transformer.h.0", "transformer.h.1"]
ROWS, POSITIONS, BATCHES = 3, 8, 4
OPTIONS = {"layers": LAYERS, "stats": True, "shard_size": 7}


def make_batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for b in range(BATCHES):
        ids = torch.randint(1, VOCAB, (ROWS, POSITIONS), generator=gen)
        mask = torch.ones(ROWS, POSITIONS, dtype=torch.long)
        mask[b % ROWS, : 1 + b] = 0  # left padding
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def share(part: int, parts: int) -> list[dict[str, torch.Tensor]]:
    """Part K's batches: the K-th run of consecutive batches."""
    batches = make_batches()
    size = -(-len(batches) // parts)
    return batches[part * size : (part + 1) * size]


def recorder() -> Recorder:
    model = gpt2()
    return Recorder(model, input_data={"input_ids": make_batches()[0]["input_ids"][:1]})


@pytest.fixture(scope="module")
def rnet() -> Recorder:
    return recorder()


@pytest.fixture
def no_process_group(monkeypatch):
    """Fail if anything creates a process group; check none exists after."""

    def refuse(*args, **kwargs):
        msg = "a process group was created"
        raise AssertionError(msg)

    if dist.is_available():
        monkeypatch.setattr(dist, "init_process_group", refuse)
        monkeypatch.setattr(dist, "new_group", refuse)
    yield
    assert not (dist.is_available() and dist.is_initialized())


def write_parts(rnet: Recorder, folder: Path, parts: int = 2, **options) -> None:
    for part in range(parts):
        write(
            rnet,
            share(part, parts),
            folder,
            part=part,
            parts=parts,
            **OPTIONS,
            **options,
        )


def rows(ds: ActivationDataset) -> dict[str, torch.Tensor]:
    return ds[list(range(len(ds)))]


def assert_same_set(got: ActivationDataset, want: ActivationDataset) -> None:
    """Bit for bit the same rows and index; statistics to 1e-12; checksums valid."""
    assert len(got) == len(want)
    assert got.layers == want.layers
    assert torch.equal(got.index, want.index)
    a, b = rows(got), rows(want)
    for name in want.layers:
        assert a[name].dtype == b[name].dtype
        assert torch.equal(a[name], b[name]), name
    for name in want.layers:
        for key, value in want.stats[name].items():
            other = got.stats[name][key]
            if value.is_floating_point():
                scale = value.abs().max().clamp_min(1.0)
                assert (other - value).abs().max() <= 1e-12 * scale, (name, key)
            else:
                assert torch.equal(other, value), (name, key)
    for entry in got.manifest["shards"]:
        data = (got.path / entry["file"]).read_bytes()
        assert f"{zlib.crc32(data):08x}" == entry["crc32"]
    stats = (got.path / got.manifest["stats"]).read_bytes()
    assert f"{zlib.crc32(stats):08x}" == got.manifest["stats_crc32"]


def test_two_parts_merge_to_the_one_process_set(rnet, tmp_path, no_process_group):
    one = write(rnet, make_batches(), tmp_path / "one", **OPTIONS)
    write_parts(rnet, tmp_path / "parts")
    merged = merge(tmp_path / "parts")
    assert_same_set(merged, one)
    # part 0's rows first, then part 1's: the rows of (part, row)
    manifest = merged.manifest
    assert [e["rank"] for e in manifest["shards"]] == sorted(
        e["rank"] for e in manifest["shards"]
    )
    assert manifest["parts"][0]["rank_rows"] == [2 * ROWS, 2 * ROWS]
    assert manifest["split"] == {"parts": 2}
    # each part is a set of its own, with its own checksums and statistics
    for part in range(2):
        alone = ActivationDataset(tmp_path / "parts" / f"part-{part:05d}")
        assert alone.manifest["split"] == {"part": part, "parts": 2}
        assert alone.index[0, 0] == 0
        assert alone.stats[LAYERS[0]]["count"] == len(alone)
    # nothing of the writes is left: no progress, state, lock or temporary file
    names = sorted(p.name for p in (tmp_path / "parts").rglob("*"))
    assert not [n for n in names if n.startswith(("progress", ".")) or "lock" in n]


def test_merging_twice_gives_the_same_set(rnet, tmp_path, no_process_group):
    write_parts(rnet, tmp_path)
    merge(tmp_path)
    first = (tmp_path / "manifest.json").read_bytes()
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    merge(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == first
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == files


class KilledError(Exception):
    """The worker dies in the middle of its part."""


def dying(batches, after: int):
    for index, batch in enumerate(batches):
        if index == after:
            raise KilledError
        yield batch


def test_a_part_killed_and_rerun_leaves_the_merged_set_unchanged(
    rnet, tmp_path, no_process_group
):
    write_parts(rnet, tmp_path)
    before = merge(tmp_path)
    manifest = (tmp_path / "manifest.json").read_bytes()
    want = rows(before)
    # part 1 rewritten, and killed after its first batch
    with pytest.raises(KilledError):
        write(
            rnet, dying(share(1, 2), 1), tmp_path, part=1, parts=2, overwrite=True,
            **OPTIONS,
        )  # fmt: skip
    assert (tmp_path / "part-00001.partial").is_dir()
    assert (tmp_path / "part-00001").is_dir()  # the finished part is untouched
    again = ActivationDataset(tmp_path)
    got = rows(again)  # every shard read: checksums checked
    assert all(torch.equal(got[n], want[n]) for n in LAYERS)
    assert (tmp_path / "manifest.json").read_bytes() == manifest
    # part 0's files are never touched by part 1's re-run
    part0 = {p.name: p.stat().st_ino for p in (tmp_path / "part-00000").iterdir()}
    write(rnet, share(1, 2), tmp_path, part=1, parts=2, overwrite=True, **OPTIONS)
    assert not (tmp_path / "part-00001.partial").exists()
    assert {
        p.name: p.stat().st_ino for p in (tmp_path / "part-00000").iterdir()
    } == part0
    after = merge(tmp_path)
    assert (tmp_path / "manifest.json").read_bytes() == manifest
    assert_same_set(after, before)


def test_a_part_killed_the_first_time_is_missing_then_resumes(
    rnet, tmp_path, no_process_group
):
    one = write(rnet, make_batches(), tmp_path / "one", **OPTIONS)
    folder = tmp_path / "parts"
    write(rnet, share(0, 2), folder, part=0, parts=2, **OPTIONS)
    with pytest.raises(KilledError):
        write(rnet, dying(share(1, 2), 1), folder, part=1, parts=2, **OPTIONS)
    with pytest.raises(ValueError, match=r"part 1 is missing \(part 1 unfinished"):
        merge(folder)
    # the re-run resumes after the checkpoint of the batch it finished
    write(rnet, share(1, 2), folder, part=1, parts=2, **OPTIONS)
    assert_same_set(merge(folder), one)


def test_a_set_that_is_not_a_merge_is_never_replaced(rnet, tmp_path):
    write_parts(rnet, tmp_path)
    merge(tmp_path)
    grown = write(rnet, make_batches()[:1], tmp_path, append=True, **OPTIONS)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="not a merge of its parts"):
        merge(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == files
    assert len(ActivationDataset(tmp_path)) == len(grown)


def test_a_missing_part_is_named(rnet, tmp_path, no_process_group):
    write(rnet, share(0, 3), tmp_path, part=0, parts=3, **OPTIONS)
    with pytest.raises(ValueError, match="has 3 parts, and parts 1, 2 are missing"):
        merge(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no finished part"):
        merge(tmp_path / "part-00000")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"layers": ["transformer.h.1"]}, "- layers"),
        ({"dtype": torch.float16}, "- dtype: saved None, now float16"),
        ({"skip_bos": True}, "- skip_bos: saved False, now True"),
        ({"metadata": {"run": 2}}, "- metadata: part 0 None, part 1 {'run': 2}"),
    ],
    ids=["layers", "dtype", "arguments", "metadata"],
)
def test_a_part_written_otherwise_is_refused_naming_it(
    rnet, tmp_path, options, named, no_process_group
):
    write(rnet, share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    write(rnet, share(1, 2), tmp_path, part=1, parts=2, **{**OPTIONS, **options})
    with pytest.raises(
        ValueError, match=r"Part 1 in .* was not written as part 0"
    ) as info:
        merge(tmp_path)
    assert named in str(info.value)
    assert not (tmp_path / "manifest.json").exists()


def test_a_part_of_another_model_is_refused_naming_the_config(tmp_path):
    write(recorder(), share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    other = recorder()
    other.net.config.layer_norm_epsilon = 1e-3  # same class and shapes
    write(other, share(1, 2), tmp_path, part=1, parts=2, **OPTIONS)
    with pytest.raises(ValueError, match="model config layer_norm_epsilon"):
        merge(tmp_path)


def test_a_part_of_other_weights_is_refused_naming_them(tmp_path):
    write(recorder(), share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    other = recorder()
    with torch.no_grad():
        other.net.transformer.h[1].mlp.c_proj.weight.mul_(1.5)  # same config
    write(other, share(1, 2), tmp_path, part=1, parts=2, **OPTIONS)
    with pytest.raises(
        ValueError, match=r"- model weights: part 0 [0-9a-f]{16}, part 1"
    ):
        merge(tmp_path)
    with pytest.raises(
        ValueError, match=r"holds part 1 written with other(.|\n)*weights"
    ):
        write(recorder(), share(1, 2), tmp_path, part=1, parts=2, **OPTIONS)


def test_parts_written_with_other_counts_are_refused(rnet, tmp_path):
    write(rnet, share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    write(rnet, share(1, 3), tmp_path, part=1, parts=3, **OPTIONS)
    with pytest.raises(ValueError, match="one of 3 parts, part 0 as one of 2"):
        merge(tmp_path)


def test_a_finished_part_is_returned_and_other_arguments_refused(rnet, tmp_path):
    first = write(rnet, share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    files = {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()}
    again = write(rnet, share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    assert again.path == first.path
    assert {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()} == files
    with pytest.raises(ValueError, match=r"holds part 0 written with other(.|\n)*seed"):
        write(rnet, share(0, 2), tmp_path, part=0, parts=2, seed=1, **OPTIONS)


@pytest.mark.parametrize(
    ("part", "parts", "error", "message"),
    [
        (0, None, ValueError, "`part` was given without `parts`"),
        (None, 2, ValueError, "`parts` was given without `part`"),
        (2, 2, ValueError, "got part=2, parts=2"),
        (-1, 2, ValueError, "got part=-1"),
        (0, 0, ValueError, "`parts` >= 1"),
        (True, 2, TypeError, "`part` must be an int"),
        (0, "2", TypeError, "`parts` must be an int"),
    ],
)
def test_bad_parts_are_refused(rnet, tmp_path, part, parts, error, message):  # noqa: PLR0917 (the parameters)
    with pytest.raises(error, match=message):
        write(rnet, share(0, 2), tmp_path, part=part, parts=parts, **OPTIONS)
    assert not list(tmp_path.iterdir())


def test_a_part_with_append_or_in_a_process_group_is_refused(
    rnet, tmp_path, monkeypatch
):
    with pytest.raises(ValueError, match="pass one of them"):
        write(rnet, share(0, 2), tmp_path, part=0, parts=2, append=True, **OPTIONS)
    monkeypatch.setattr(
        "scio_recorder.activations._write.rank_and_world", lambda: (1, 4)
    )
    with pytest.raises(RuntimeError, match="process group of 4 ranks"):
        write(rnet, share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)


def test_the_command_line_merges_and_names_a_missing_part(rnet, tmp_path, capsys):
    write(rnet, share(0, 2), tmp_path, part=0, parts=2, **OPTIONS)
    assert cli_main(["merge", str(tmp_path)]) == 2
    assert "part 1 is missing" in capsys.readouterr().err
    write(rnet, share(1, 2), tmp_path, part=1, parts=2, **OPTIONS)
    assert cli_main(["merge", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    ds = ActivationDataset(tmp_path)
    assert out == (
        f"merged 2 parts into '{tmp_path / 'manifest.json'}': {len(ds)} tokens, "
        f"{4 * ROWS} rows, layers {', '.join(LAYERS)}\n"
    )


# -- two processes, as two tasks of a SLURM array ---------------------------


def worker(part: int, parts: int, folder: str) -> None:
    rnet = recorder()
    if part < 0:  # the one-process reference
        write(rnet, make_batches(), folder, **OPTIONS)
        return
    write(rnet, share(part, parts), folder, part=part, parts=parts, **OPTIONS)
    print(json.dumps({"initialized": dist.is_available() and dist.is_initialized()}))


@pytest.mark.slow
def test_two_processes_write_parts_that_merge_to_one_set(tmp_path):
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)

    def spawn(part: int, folder: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(  # noqa: S603 (our own interpreter and file)
            [sys.executable, __file__, str(part), "2", str(folder)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    procs = [spawn(1, tmp_path / "parts"), spawn(0, tmp_path / "parts")]
    procs.append(spawn(-1, tmp_path / "one"))
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outputs.append(output)
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(outputs)
    for output in outputs[:2]:
        assert json.loads(output.strip().splitlines()[-1]) == {"initialized": False}
    assert_same_set(merge(tmp_path / "parts"), ActivationDataset(tmp_path / "one"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    cuts=st.lists(st.integers(1, BATCHES - 1), max_size=BATCHES - 1, unique=True),
    shard_size=st.integers(1, 20),
)
def test_any_split_of_the_stream_merges_to_the_one_process_set(
    rnet, tmp_path_factory, cuts, shard_size
):
    """Parts of any sizes (consecutive runs of batches) and any shard size."""
    folder = tmp_path_factory.mktemp("split")
    options = {**OPTIONS, "shard_size": shard_size}
    batches = make_batches()
    bounds = [0, *sorted(cuts), BATCHES]
    parts = len(bounds) - 1
    for part in reversed(range(parts)):  # in any order
        mine = batches[bounds[part] : bounds[part + 1]]
        write(rnet, mine, folder / "parts", part=part, parts=parts, **options)
    one = write(rnet, batches, folder / "one", **options)
    assert_same_set(merge(folder / "parts"), one)
