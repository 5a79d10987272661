"""Sequence parallelism: records gathered along the sequence, or refused.

torch's ``SequenceParallel`` on a layer norm, then a
``ColwiseParallel(input_layouts=Shard(1))`` and a
``RowwiseParallel(output_layouts=Shard(1))``: between the styled layers,
plain tensors are each rank's slice of the sequence. The row-parallel
layer's output was recorded as that slice (``[2, 2, 8]`` of ``[2, 4, 8]``),
with no word. Now it is gathered along the dimension its style shards, an
edit of it is cut back along it, and a module that no style placed (whose
tensors may be slices with no layout saying so) is refused.

The two-rank run is this file run as a script under ``torchrun`` (gloo, on
the CPU); the parent checks every value against the unsharded block run
alone, recorded by hand-written hooks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.distributed as dist
from torch import Tensor, nn

from scio_recorder import Recorder

WORLD = 2
X = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
NAMES = ["norm", "up", "down"]


class Block(nn.Module):
    """A pre-norm MLP block with its residual sum: x + down(act(up(norm(x))))."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.down = nn.Linear(16, 8)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


def block() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def sequence_parallel(net: nn.Module, mesh: object) -> nn.Module:
    from torch.distributed.tensor import Shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    plan = {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    }
    return parallelize_module(net, mesh, plan)


def negate_middle(t: Tensor) -> Tensor:
    """An edit across both ranks' slices of the sequence."""
    t = t.clone()
    t[:, 1:3] *= -3
    return t


REFUSAL = (
    "Cannot record the whole net (Block), `act` whole: the net is sequence-parallel "
    "(`norm` (SequenceParallel), `up` (ColwiseParallel), `down` (RowwiseParallel) "
    "take or give plain tensors that are this rank's slice of the sequence), and a "
    "module that no parallel style placed computes on such slices with no layout "
    "saying so. Record the layers the styles placed (their records are gathered "
    'along the dimension their style shards), or pass `shards="local"` to keep '
    "each rank's pieces."
)


def worker(out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        net = sequence_parallel(block(), mesh)
        length = X.shape[1] // WORLD
        mine = X[:, rank * length : (rank + 1) * length]
        rnet = Recorder(net, input_data=mine)
        rnet.record(*NAMES, inputs=["up", "down"])
        saved: dict[str, Tensor] = {}
        with torch.no_grad():
            rnet(mine)
            for name in NAMES:
                saved[f"out/{name}"] = rnet.activations_of(name)[0]
            for name in ("up", "down"):
                saved[f"in/{name}"] = rnet.inputs_of(name)[0].args[0]
            edited = rnet(mine, activation_postproc={"down": negate_middle})
            saved["edit"] = edited  # this rank's slice of the net's output
        try:
            rnet.record("act", "")
        except ValueError as error:
            (out / f"refusal-{rank}.txt").write_text(str(error))
        local = Recorder(net, input_data=mine, shards="local")
        local.record("down")
        with torch.no_grad():
            local(mine)
        saved["local/down"] = local.activations_of("down")[0]
        # torch's reduce-scatter leaves a tensor waiting for its collective
        # (AsyncCollectiveTensor) where no record made it whole: wait for it
        tensors = {
            k: (v.wait() if hasattr(v, "wait") else v).contiguous()
            for k, v in saved.items()
        }
        safetensors.torch.save_file(tensors, out / f"rank-{rank}.safetensors")
    finally:
        dist.destroy_process_group()


def hand(net: nn.Module) -> dict[str, Tensor]:
    """The unsharded block's records by hand-written hooks, and the edited output."""
    kept: dict[str, Tensor] = {}
    handles = [
        net.get_submodule(n).register_forward_hook(
            lambda _m, _i, o, n=n: kept.setdefault(f"out/{n}", o)
        )
        for n in NAMES
    ]
    handles += [
        net.get_submodule(n).register_forward_pre_hook(
            lambda _m, a, n=n: kept.setdefault(f"in/{n}", a[0])
        )
        for n in ("up", "down")
    ]
    with torch.no_grad():
        net(X)
        for handle in handles:
            handle.remove()
        handle = net.down.register_forward_hook(lambda _m, _i, o: negate_middle(o))
        kept["edit"] = net(X)
        handle.remove()
    return kept


# A row-parallel layer sums each rank's 16 / WORLD products, then adds the
# partial sums: another order than the unsharded GEMM's 16 terms, so each
# value may differ by a few roundings of a dot product (K = 16 terms, eps32
# relative to the magnitudes), carried through the residual sum. Bound:
# 4 * K * eps32 relative to the largest magnitude (7.6e-6), far below what a
# missed gather (a wrong shape) or a lost edit (a factor -3) changes.
TOL = 4 * 16 * torch.finfo(torch.float32).eps


def close(got: Tensor, want: Tensor) -> None:
    scale = max(float(want.abs().max()), 1.0)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL * scale)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_two_sequence_parallel_ranks_record_whole_tensors_and_edit_them(tmp_path):
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={WORLD}",
        __file__,
        str(tmp_path),
    ]
    done = subprocess.run(  # noqa: S603 (our own interpreter and file)
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    ref = hand(block())
    effect = float((ref["edit"] - (X + ref["out/down"])).abs().max())
    assert effect > 10 * TOL  # the edit changes the output beyond the tolerance
    length = X.shape[1] // WORLD
    for rank in range(WORLD):
        got = safetensors.torch.load_file(tmp_path / f"rank-{rank}.safetensors")
        for key in ("out/norm", "out/up", "out/down", "in/up", "in/down"):
            assert got[key].shape == ref[key].shape, key  # whole, not a slice
            close(got[key], ref[key])
        mine = slice(rank * length, (rank + 1) * length)
        close(got["edit"], ref["edit"][:, mine])  # the edit cut back along dim 1
        close(got["local/down"], ref["out/down"][:, mine])  # shards="local": a slice
        refusal = (tmp_path / f"refusal-{rank}.txt").read_text()
        assert refusal == REFUSAL


@pytest.mark.slow  # a process group and DTensor's first use: seconds
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_a_one_rank_sequence_parallel_net_refuses_what_no_style_placed(tmp_path):
    """One gloo rank in this process: the layout is read, the refusal is whole."""
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1
    )
    try:
        net = sequence_parallel(block(), init_device_mesh("cpu", (1,)))
        rnet = Recorder(net, input_data=X)
        shards = rnet._passes.plan.shards
        assert {net.get_submodule(n) for n in NAMES} == shards.styled
        assert [local.dim for local in shards.outputs.values()] == [1]  # down's
        with pytest.raises(ValueError, match=f"^{re.escape(REFUSAL)}$"):
            rnet.record("act", "")
        assert rnet.recording == ()  # a refused request changes nothing
        rnet.record("down")
        with torch.no_grad():
            rnet(X)
        close(rnet.activations_of("down")[0], hand(block())["out/down"])
        Recorder(net, input_data=X, shards="local").record("act")  # pieces: allowed
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
