"""scio_recorder.activations.ray: parts written by Ray actors, one killed mid-part.

A local Ray (2 CPUs) runs 2 actors, each with its own recorder of a tiny
GPT-2; part 1's actor is killed (``ray.kill``) in the middle of its part,
after it has written shards and a checkpoint. Ray restarts it
(``max_restarts``) and retries the task, which resumes the part: the merged
set must equal, bit for bit, a one-process ``write`` of the same stream (so
no row is duplicated or lost), with no partial shard or checkpoint left, and
no process group anywhere. Skipped where Ray is not installed; run it with
``python -m pytest tests/test_activations_ray.py -m slow`` in an environment
with ``pip install -e .[dev,ray]``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from scio_recorder.activations import ActivationDataset, merge, write
from tests.test_activations_parts import (
    OPTIONS,
    assert_same_set,
    make_batches,
    recorder,
    share,
)

ray = pytest.importorskip("ray")

from scio_recorder.activations.ray import (  # noqa: E402 (after the skip)
    DatasetParts,
    PartWriters,
    write_parts,
)

ROOT = str(Path(__file__).resolve().parents[1])


def part_batches(folder: str):
    """Part K's batches; part 1 stops after 2 batches the first time, and waits."""
    marker = Path(folder) / "killed-here"

    def batches(part: int, parts: int):
        for index, batch in enumerate(share(part, parts)):
            if part == 1 and index == 1 and not marker.exists():
                marker.write_text(str(os.getpid()))
                time.sleep(600)  # killed here
            yield batch
        # in the actor, at the end of its part's batches
        assert not torch.distributed.is_initialized(), "a process group was made"

    return batches


@pytest.fixture(scope="module")
def cluster():
    """A local Ray of 2 CPUs whose workers import this checkout."""
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "OMP_NUM_THREADS")}
    os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["OMP_NUM_THREADS"] = "1"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        torch.set_num_threads(threads)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow
def test_two_actors_one_killed_mid_part(tmp_path, cluster):
    folder = tmp_path / "parts"
    folder.mkdir()
    options = {**OPTIONS, "shard_size": 4}  # part 1's first batch is one shard
    one = write(recorder(), make_batches(), tmp_path / "one", **options)
    pool = PartWriters(recorder, actors=2, max_restarts=2, num_cpus=1)
    refs = pool.submit(part_batches(str(folder)), folder, parts=2, **options)
    marker = folder / "killed-here"
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert time.monotonic() < deadline, "part 1 never reached its batch 1"
        time.sleep(0.1)
    partial = folder / "part-00001.partial"
    assert (partial / "progress-p0-r1.json").is_file()  # a checkpoint
    assert list(partial.glob("shard-*"))  # shards before the kill
    ray.kill(pool.actors[1], no_restart=False)
    done = ray.get(refs, timeout=300)
    assert {d["part"] for d in done} == {0, 1}
    assert done[1]["pid"] != int(marker.read_text())  # a new actor finished it
    # the pool stays usable: the parts again are the finished parts, returned
    again = ray.get(pool.submit(part_batches(str(folder)), folder, parts=2, **options))
    assert [d["tokens"] for d in again] == [d["tokens"] for d in done]
    merged = merge(folder)
    assert_same_set(merged, one)
    names = sorted(p.name for p in folder.rglob("*") if p.name != "killed-here")
    assert not [n for n in names if n.startswith(("progress", ".")) or "partial" in n]
    assert not [n for n in names if n.endswith(".lock")]
    assert ActivationDataset(folder / "part-00001").manifest["split"] == {
        "part": 1,
        "parts": 2,
    }


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*is deprecated:DeprecationWarning")  # Ray Data's
def test_parts_of_a_ray_dataset(tmp_path, cluster):
    """Batches from a Ray dataset: its split, part by part, on 2 actors."""
    pytest.importorskip("ray.data")
    rows = [
        {
            "input_ids": batch["input_ids"][r].numpy(),
            "attention_mask": batch["attention_mask"][r].numpy(),
        }
        for batch in make_batches()
        for r in range(batch["input_ids"].shape[0])
    ]
    batches = DatasetParts(ray.data.from_items(rows), batch_size=2)
    merged = write_parts(
        recorder, batches, tmp_path / "parts", parts=2, actors=2, max_restarts=1,
        actor_options={"num_cpus": 1}, **OPTIONS,
    )  # fmt: skip
    stream = [batch for part in range(2) for batch in batches(part, 2)]
    assert sum(len(batch["input_ids"]) for batch in stream) == len(rows)
    one = write(recorder(), stream, tmp_path / "one", **OPTIONS)
    assert_same_set(merged, one)
    kept = sum(int(batch["attention_mask"].sum()) for batch in make_batches())
    assert len(merged) == kept
