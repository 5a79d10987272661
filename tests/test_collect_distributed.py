"""collect under torch.distributed: 2 CPU processes on the gloo backend.

Each rank reduces its ``DistributedSampler`` shard (``shuffle=False``); the
merged statistics and gathered concatenations must equal a single-process run
on the whole data set (concatenations up to the sampler's rank-strided row
order). The workers are this file run as a script, so that nothing depends
on how pytest imports test modules.
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
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from scio_recorder import Recorder
from scio_recorder.collect import CollectResult, collect
from scio_recorder.reduce import SharedCovariance

WORLD = 2
N = 24  # divisible by WORLD: DistributedSampler pads nothing
BATCH = 5


def make_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def make_dataset() -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(N, 5, generator=gen)
    y = torch.randint(0, 3, (N,), generator=gen)
    return torch.utils.data.TensorDataset(x, y)


def keep() -> dict:
    return {
        (1, 1): "concat",
        (1, 2): "moments",
        (1, 3): SharedCovariance(num_classes=3),
    }


def worker(rank: int, init_file: str, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD
    )
    try:
        net = make_net()
        data = make_dataset()
        sampler = DistributedSampler(data, num_replicas=WORLD, rank=rank, shuffle=False)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
        rnet = Recorder(net, input_size=(1, 5))
        info = {}

        everywhere = collect(rnet, loader, keep(), target=1)
        everywhere.save(out / f"all-{rank}.safetensors")
        info["rank_samples"] = list(everywhere.rank_samples)
        info["batches"] = everywhere.batches

        # rank 0 only, gathered into a file (tiny budget, per-rank spill dirs)
        to_zero = collect(
            rnet,
            loader,
            keep(),
            target=1,
            gather=0,
            memory_budget=64,
            spill_dir=out / "spill",
        )
        to_zero.save(out / f"zero-{rank}.safetensors")
        info["zero_files"] = sorted(str(p) for p in to_zero.files.values())

        local = collect(rnet, loader, keep(), target=1, gather=None)
        local.save(out / f"local-{rank}.safetensors")

        # DDP: record the inner module
        ddp = DistributedDataParallel(make_net())
        inner = Recorder(ddp.module, input_size=(1, 5))
        wrapped = collect(inner, loader, keep(), target=1)
        wrapped.save(out / f"ddp-{rank}.safetensors")
        (out / f"info-{rank}.json").write_text(json.dumps(info))
    finally:
        dist.destroy_process_group()


def reference() -> CollectResult:
    loader = DataLoader(make_dataset(), batch_size=BATCH)
    return collect(Recorder(make_net(), input_size=(1, 5)), loader, keep(), target=1)


# The ranks run batches of other sizes than the one-process reference (3 + 3
# batches of 5, 5, 2 rows vs 5 batches of 5, ...) in processes with another
# thread count, so the float32 GEMMs that make the features may block
# differently: each feature may differ from the reference by a few float32
# roundings of its dot product (K = 5 terms at most here). The float64
# statistics then differ by as much, relative to the features' magnitude;
# products (covariances) double it. A bound of 4 * K roundings per factor is
# far above what happens (2.6e-8 relative seen on an AMD EPYC) and far below
# any real error (a lost or doubled sample moves a mean by ~1/24).
F32_ROUNDINGS = 2 * 4 * 5 * torch.finfo(torch.float32).eps  # ~9.5e-6


def assert_stats_equal(got: CollectResult, want: CollectResult) -> None:
    for label in [(1, 2), (1, 3)]:
        a, b = got[label], want[label]
        for field in a.__dataclass_fields__:
            x, y = getattr(a, field), getattr(b, field)
            if isinstance(x, torch.Tensor):
                scale = max(float(y.abs().max()), 1.0) if y.numel() else 1.0
                torch.testing.assert_close(
                    x, y, rtol=F32_ROUNDINGS, atol=F32_ROUNDINGS * scale
                )
            else:
                assert x == y, field


def interleaved(rows: torch.Tensor) -> torch.Tensor:
    """Undo DistributedSampler's striding: rank r holds samples r, r + W, ..."""
    per = rows.shape[0] // WORLD
    return rows.reshape(WORLD, per, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_two_gloo_ranks_match_one_process(tmp_path):
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    init_file = str(tmp_path / "init")
    procs = [
        subprocess.Popen(  # noqa: S603 (our own interpreter and file)
            [sys.executable, __file__, str(rank), init_file, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outputs.append(output)
    assert [p.returncode for p in procs] == [0] * WORLD, "\n".join(outputs)

    want = reference()
    for rank in range(WORLD):
        info = json.loads((tmp_path / f"info-{rank}.json").read_text())
        assert info["rank_samples"] == [N // WORLD] * WORLD
        assert info["batches"] == want.batches + WORLD - 1  # 3 + 3 vs 5 batches

        for kind in ("all", "ddp"):
            got = CollectResult.load(tmp_path / f"{kind}-{rank}.safetensors")
            assert got.samples == N
            assert_stats_equal(got, want)
            torch.testing.assert_close(interleaved(got[(1, 1)]), want[(1, 1)])

        zero = CollectResult.load(tmp_path / f"zero-{rank}.safetensors")
        assert_stats_equal(zero, want)
        if rank == 0:
            torch.testing.assert_close(interleaved(zero[(1, 1)]), want[(1, 1)])
            assert info["zero_files"] == [
                str(tmp_path / "spill" / "rank-0" / "gathered-1-1.bin")
            ]
        else:
            assert zero[(1, 1)] is None
            assert info["zero_files"] == []

        local = CollectResult.load(tmp_path / f"local-{rank}.safetensors")
        assert local.samples == N // WORLD
        torch.testing.assert_close(local[(1, 1)], want[(1, 1)][rank::WORLD])


if __name__ == "__main__":
    worker(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
