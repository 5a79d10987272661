"""activations.write under torch.distributed: 2 CPU processes on gloo.

Rank r writes batches r, r + 2, ... of one token stream into one folder;
the set must be the union of the ranks' shards, and equal, token for
token, to a one-process write of the whole stream (each token found by its
row and column), with the same statistics. Every write runs in a process
of its own with one thread, on batches of the same shapes, so the float32
activations are computed the same way on both sides: compared bit for bit.
The workers are this file run as a script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import transformers

from scio_recorder import Recorder
from scio_recorder.activations import ActivationDataset, write

WORLD = 2
BATCHES = 5  # rank 0 gets 3, rank 1 gets 2
ROWS, POSITIONS, VOCAB = 3, 8, 40
LAYERS = ["h.0", "h.1"]


def make_model() -> transformers.GPT2Model:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2Model(config).eval()


def make_batches() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for b in range(BATCHES):
        ids = torch.randint(1, VOCAB, (ROWS, POSITIONS), generator=gen)
        mask = torch.ones(ROWS, POSITIONS, dtype=torch.long)
        mask[b % ROWS, : 1 + b] = 0  # left padding
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def run(folder: Path, batches: list[dict[str, torch.Tensor]]) -> None:
    model = make_model()
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"][:1]})
    write(
        rnet, batches, folder, layers=LAYERS, stats=True, shuffle_buffer=7, shard_size=6
    )


def worker(rank: int, init_file: str, folder: Path) -> None:
    if rank < 0:  # the one-process reference
        run(folder, make_batches())
        return
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD
    )
    try:
        run(folder, make_batches()[rank::WORLD])
        # a second call finds the finished set, on every rank
        run(folder, make_batches()[rank::WORLD])
    finally:
        dist.destroy_process_group()


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603 (our own interpreter and file)
        [sys.executable, __file__, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def global_rows(ds: ActivationDataset) -> torch.Tensor:
    """Each token's row in the whole stream: rank r's batch k is batch r + 2k."""
    rank_of = torch.cat(
        [
            torch.full((entry["tokens"],), entry["rank"])
            for entry in ds.manifest["shards"]
        ]
    )
    offsets = {entry["rank"]: entry["row_offset"] for entry in ds.manifest["shards"]}
    local = ds.index[:, 0] - torch.tensor([offsets[int(r)] for r in rank_of])
    batch = rank_of + WORLD * (local // ROWS)
    return batch * ROWS + local % ROWS


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_two_gloo_ranks_write_the_union(tmp_path):
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    init_file = str(tmp_path / "init")
    procs = [
        spawn([str(rank), init_file, str(tmp_path / "ranks")], env)
        for rank in range(WORLD)
    ]
    procs.append(spawn(["-1", init_file, str(tmp_path / "one")], env))
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outputs.append(output)
    assert [p.returncode for p in procs] == [0] * (WORLD + 1), "\n".join(outputs)

    ranks = ActivationDataset(tmp_path / "ranks")
    one = ActivationDataset(tmp_path / "one")
    assert len(ranks) == len(one)
    assert sorted({entry["rank"] for entry in ranks.manifest["shards"]}) == [0, 1]
    assert ranks.manifest["parts"][0]["world"] == WORLD
    names = sorted(p.name for p in (tmp_path / "ranks").iterdir())
    assert not [n for n in names if n.startswith(("progress", "write"))], names
    # each rank's rows come after the rows of the ranks before it
    offsets = {e["rank"]: e["row_offset"] for e in ranks.manifest["shards"]}
    assert offsets == {0: 0, 1: 3 * ROWS}

    # the union, token by token
    rows = global_rows(ranks)
    key = rows * POSITIONS + ranks.index[:, 1]
    want_key = one.index[:, 0] * POSITIONS + one.index[:, 1]
    assert sorted(key.tolist()) == sorted(want_key.tolist())
    order = torch.argsort(key)
    want_order = torch.argsort(want_key)
    got, want = ranks[order], one[want_order]
    for name in LAYERS:
        assert torch.equal(got[name], want[name]), name

    # statistics merged across ranks: Chan's rule over other splits, float64
    # roundings of sums of O(1) values
    for name in LAYERS:
        for field in ("mean", "var", "norm"):
            torch.testing.assert_close(
                ranks.stats[name][field], one.stats[name][field], rtol=1e-12, atol=1e-12
            )
        assert int(ranks.stats[name]["count"]) == len(one)
    json.dumps(ranks.manifest)  # the manifest is JSON


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
