"""Tensor-parallel models recorded and edited as if whole: 2 gloo processes on CPU.

Three shardings of small language models built from configs:

* ``hf``: a Llama loaded with transformers' ``from_pretrained(..., tp_plan="auto")``
  (the checkpoint is a random Llama saved by the test, nothing downloaded);
* ``torch-llama``: the same Llama sharded by torch's ``parallelize_module``
  (``ColwiseParallel`` q/k/v/gate/up, ``RowwiseParallel`` o/down);
* ``torch-gpt2``: a GPT-2 whose MLPs are sharded by ``parallelize_module``
  (``c_fc`` column-parallel with ``use_local_output=False``, so the hooks
  see ``DTensor`` outputs; ``c_proj`` row-parallel). torch's styles shard
  ``nn.Linear`` only, so the MLPs' ``Conv1D`` layers are made ``nn.Linear``
  first (the same function of the same weights); GPT-2's attention fuses
  q, k and v in one ``Conv1D``, which no column split can shard head-wise.

Each rank records, edits and generates; the parent process checks every
value against the unsharded model run alone, recorded by hand-written
hooks. The workers are this file run as a script under ``torchrun`` (transformers'
``tp_plan`` reads the launcher's environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.distributed as dist
import transformers
from torch import Tensor, nn

from scio_recorder import Recorder
from scio_recorder._engine.shards import tensor_parallel
from scio_recorder.activations import write
from scio_recorder.collect import collect
from scio_recorder.ood import KNN

WORLD = 2
IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
IDS2 = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
MASK = torch.ones(2, 8, dtype=torch.long)

Q = "model.layers.0.self_attn.q_proj"  # column-parallel
O_PROJ = "model.layers.0.self_attn.o_proj"  # row-parallel
DOWN = "model.layers.0.mlp.down_proj"  # row-parallel: its input is sharded
UP = "model.layers.1.mlp.up_proj"  # column-parallel
LLAMA_OUT = [Q, O_PROJ, UP, "model.layers.1", "lm_head"]
C_FC = "transformer.h.0.mlp.c_fc"  # column-parallel, DTensor output
ACT = "transformer.h.0.mlp.act"  # runs on the DTensor piece
C_PROJ = "transformer.h.0.mlp.c_proj"  # row-parallel
GPT2_OUT = [C_FC, ACT, C_PROJ, "transformer.h.1"]


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config).eval()


def gpt2() -> nn.Module:
    """A GPT-2 whose MLP layers are ``nn.Linear`` (the same function)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    for block in model.transformer.h:
        for name in ("c_fc", "c_proj"):
            conv = getattr(block.mlp, name)
            linear = nn.Linear(*conv.weight.shape)  # Conv1D's weight is [in, out]
            with torch.no_grad():
                linear.weight.copy_(conv.weight.T)
                linear.bias.copy_(conv.bias)
            setattr(block.mlp, name, linear)
    return model


def scale_middle(t: Tensor) -> Tensor:
    """An edit across both ranks' pieces of a column-parallel output."""
    t = t.clone()
    t[..., 10:22] *= -8
    return t


def boost_middle(t: Tensor) -> None:
    """An in-place edit across both pieces of a row-parallel input."""
    t[..., 20:40] *= -4


# -- the workers -----------------------------------------------------------------


def labels(rnet: Recorder) -> dict[str, tuple[int, int]]:
    return {row.name: row.label for row in rnet.table.rows if row.call_index == 0}


def run_llama(model: nn.Module, tag: str, out: Path, rank: int) -> dict[str, Tensor]:
    saved: dict[str, Tensor] = {}
    rnet = Recorder(model, input_data={"input_ids": IDS})
    at = labels(rnet)
    rnet.record(*LLAMA_OUT, inputs=[DOWN])
    with torch.no_grad():
        rnet(input_ids=IDS)
        for name in LLAMA_OUT:
            saved[f"{tag}/out/{name}"] = rnet.activations[at[name]]
        saved[f"{tag}/in/{DOWN}"] = rnet.inputs_of(DOWN)[0].args[0]
        edits = {Q: scale_middle}
        saved[f"{tag}/edit"] = rnet(input_ids=IDS, activation_postproc=edits).logits
        halve = {DOWN: boost_middle}
        saved[f"{tag}/input-edit"] = rnet(input_ids=IDS, input_postproc=halve).logits
        saved[f"{tag}/generate"] = rnet.generate(
            IDS, max_new_tokens=4, do_sample=False, activation_postproc=edits
        )
    local = Recorder(model, input_data={"input_ids": IDS}, shards="local")
    local.record(Q)
    with torch.no_grad():
        local(input_ids=IDS)
    saved[f"{tag}/local/{Q}"] = local.activations[at[Q]]
    if tag != "hf":
        return saved
    batches = [(IDS,), (IDS2,)]
    stats = collect(rnet, batches, {"model.norm": "moments", Q: "concat"})
    saved["hf/collect/mean"] = stats[at["model.norm"]].mean
    saved["hf/collect/concat"] = stats[at[Q]]
    knn = KNN(rnet, "model.norm").fit(batches)
    saved["hf/knn"] = knn(IDS)
    stream = [{"input_ids": ids, "attention_mask": MASK} for ids in (IDS, IDS2)]
    # one set per rank, each in its own folder (the ranks' sets are the same)
    ds = write(rnet, stream, out / f"acts-{rank}", layers=[Q, DOWN])
    for key, rows in ds[:].items():
        saved[f"hf/write/{key}"] = rows
    return saved


def run_gpt2(model: nn.Module) -> dict[str, Tensor]:
    assert tensor_parallel(model)
    rnet = Recorder(model, input_data={"input_ids": IDS})
    at = labels(rnet)
    rnet.record(*GPT2_OUT, inputs=[C_PROJ])
    saved: dict[str, Tensor] = {}
    with torch.no_grad():
        rnet(input_ids=IDS)
        for name in GPT2_OUT:
            saved[f"gpt2/out/{name}"] = rnet.activations[at[name]]
        saved[f"gpt2/in/{C_PROJ}"] = rnet.inputs_of(C_PROJ)[0].args[0]
        edits = {C_FC: scale_middle}
        saved["gpt2/edit"] = rnet(input_ids=IDS, activation_postproc=edits).logits
        saved["gpt2/generate"] = rnet.generate(
            IDS, max_new_tokens=4, do_sample=False, activation_postproc=edits
        )
    return saved


def worker(out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    warnings.simplefilter("ignore")  # transformers' notes on the configs
    dist.init_process_group("gloo")  # torchrun's rank and world size
    rank = dist.get_rank()
    try:
        saved: dict[str, Tensor] = {}
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            out / "llama", tp_plan="auto"
        ).eval()
        assert tensor_parallel(hf)  # transformers did shard it
        saved |= run_llama(hf, "hf", out, rank)
        mesh = init_device_mesh("cpu", (WORLD,))
        col, row = ColwiseParallel(), RowwiseParallel()
        plan = {
            "model.layers.*.self_attn.q_proj": col,
            "model.layers.*.self_attn.k_proj": col,
            "model.layers.*.self_attn.v_proj": col,
            "model.layers.*.self_attn.o_proj": row,
            "model.layers.*.mlp.gate_proj": col,
            "model.layers.*.mlp.up_proj": col,
            "model.layers.*.mlp.down_proj": row,
        }
        saved |= run_llama(parallelize_module(llama(), mesh, plan), "torch", out, rank)
        plan = {
            "transformer.h.*.mlp.c_fc": ColwiseParallel(use_local_output=False),
            "transformer.h.*.mlp.c_proj": row,
        }
        saved |= run_gpt2(parallelize_module(gpt2(), mesh, plan))
        tensors = {k: v.contiguous() for k, v in saved.items()}
        safetensors.torch.save_file(tensors, out / f"rank-{rank}.safetensors")
        (out / f"done-{rank}.json").write_text(json.dumps(sorted(tensors)))
    finally:
        dist.destroy_process_group()


# -- the references: the unsharded models, hand-written hooks ---------------------


def hand_records(
    model: nn.Module, outputs: list[str], inputs: list[str]
) -> dict[str, Tensor]:
    kept: dict[str, Tensor] = {}
    handles = []
    for name in outputs:
        module = model.get_submodule(name)
        handles.append(
            module.register_forward_hook(
                lambda _m, _i, o, name=name: kept.setdefault(f"out/{name}", o)
            )
        )
    for name in inputs:
        module = model.get_submodule(name)
        handles.append(
            module.register_forward_pre_hook(
                lambda _m, a, name=name: kept.setdefault(f"in/{name}", a[0].clone())
            )
        )
    try:
        with torch.no_grad():
            model(input_ids=IDS)
    finally:
        for handle in handles:
            handle.remove()
    return {k: v[0] if isinstance(v, tuple) else v for k, v in kept.items()}


def edited(model: nn.Module, name: str, edit, *, pre: bool = False) -> nn.Module:
    module = model.get_submodule(name)
    if pre:
        return module.register_forward_pre_hook(lambda _m, a: edit(a[0]))
    return module.register_forward_hook(lambda _m, _i, o: edit(o))


def reference_llama(ckpt: Path) -> dict[str, Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ref = hand_records(model, LLAMA_OUT, [DOWN])
    with torch.no_grad():
        handle = edited(model, Q, scale_middle)
        ref["edit"] = model(input_ids=IDS).logits
        ref["generate"] = model.generate(IDS, max_new_tokens=4, do_sample=False)
        handle.remove()
        handle = edited(model, DOWN, boost_middle, pre=True)
        ref["input-edit"] = model(input_ids=IDS).logits
        handle.remove()
    return ref


def reference_gpt2() -> dict[str, Tensor]:
    model = gpt2()
    ref = hand_records(model, GPT2_OUT, [C_PROJ])
    with torch.no_grad():
        ref["logits"] = model(input_ids=IDS).logits
        handle = edited(model, C_FC, scale_middle)
        ref["edit"] = model(input_ids=IDS).logits
        ref["generate"] = model.generate(IDS, max_new_tokens=4, do_sample=False)
        handle.remove()
    return ref


# The sharded passes compute the same float32 dot products in another order:
# a row-parallel layer sums each rank's K / WORLD terms, then adds the partial
# sums; a column-parallel GEMM of another width may block its K terms
# differently. Each value may thus differ by a few roundings of each dot
# product, K * eps32 relative to the magnitudes (K <= 64 here), and the
# differences carry through every layer after (at most 2 blocks of 7 matrix
# products, and the unembedding: L = 15). Bound: 2 * L * K * eps32 relative
# to the largest magnitude (2.3e-4; 1e-7 seen), far below what a wrong piece,
# a missed gather or a lost edit changes (order 1e-2 and more).
TOL = 2 * 15 * 64 * torch.finfo(torch.float32).eps


def close(got: Tensor, want: Tensor) -> None:
    scale = max(float(want.abs().max()), 1.0)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL * scale)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_two_tensor_parallel_ranks_record_edit_and_generate_as_the_whole_model(
    tmp_path,
):
    """Records, edits, generated tokens, collect, write and a fit: as unsharded."""
    llama().save_pretrained(tmp_path / "llama")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",  # torchrun: transformers' tp_plan reads its env
        "--standalone",
        f"--nproc_per_node={WORLD}",
        __file__,
        str(tmp_path),
    ]
    done = subprocess.run(  # noqa: S603 (our own interpreter and file)
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]

    ref = reference_llama(tmp_path / "llama")
    ref_gpt2 = reference_gpt2()
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    rplain = Recorder(plain.eval(), input_data={"input_ids": IDS})
    at = labels(rplain)
    batches = [(IDS,), (IDS2,)]
    stats = collect(rplain, batches, {"model.norm": "moments", Q: "concat"})
    knn = KNN(rplain, "model.norm").fit(batches)
    with torch.no_grad():
        knn_scores = knn(IDS)
    stream = [{"input_ids": ids, "attention_mask": MASK} for ids in (IDS, IDS2)]
    rows = write(rplain, stream, tmp_path / "acts-plain", layers=[Q, DOWN])[:]
    # the edits change the output far beyond the tolerance: a lost edit fails
    for edits, clean in [
        ((ref["edit"], ref["input-edit"]), ref["out/lm_head"]),
        ((ref_gpt2["edit"],), ref_gpt2["logits"]),
    ]:
        for logits in edits:
            effect = float((logits - clean).abs().max())
            assert effect > 10 * TOL * float(clean.abs().max())
    for rank in range(WORLD):
        got = safetensors.torch.load_file(tmp_path / f"rank-{rank}.safetensors")
        for tag in ("hf", "torch"):
            for name in LLAMA_OUT:
                close(got[f"{tag}/out/{name}"], ref[f"out/{name}"])
            close(got[f"{tag}/in/{DOWN}"], ref[f"in/{DOWN}"])
            close(got[f"{tag}/edit"], ref["edit"])
            close(got[f"{tag}/input-edit"], ref["input-edit"])
            assert torch.equal(got[f"{tag}/generate"], ref["generate"])
            # the local piece: this rank's half of the whole record's last dim
            piece = got[f"{tag}/local/{Q}"]
            assert piece.shape[-1] == 32 // WORLD
            whole = got[f"{tag}/out/{Q}"]
            assert torch.equal(piece, whole[..., rank * 16 : (rank + 1) * 16])
        close(got["hf/collect/mean"], stats[at["model.norm"]].mean)
        close(got["hf/collect/concat"], stats[at[Q]])
        close(got["hf/knn"], knn_scores)
        assert {k for k in got if k.startswith("hf/write/")} == {
            f"hf/write/{key}" for key in rows
        }
        for key, want in rows.items():
            if want.is_floating_point():
                close(got[f"hf/write/{key}"], want)
            else:  # the index: which row and position each token came from
                assert torch.equal(got[f"hf/write/{key}"], want)
        for name in GPT2_OUT:
            close(got[f"gpt2/out/{name}"], ref_gpt2[f"out/{name}"])
        close(got[f"gpt2/in/{C_PROJ}"], ref_gpt2[f"in/{C_PROJ}"])
        close(got["gpt2/edit"], ref_gpt2["edit"])
        assert torch.equal(got["gpt2/generate"], ref_gpt2["generate"])


def test_shards_is_whole_or_local():
    """Another value of `shards` names the argument and the accepted values."""
    with pytest.raises(
        ValueError, match=r'^`shards` is "whole" or "local", got \'all\'$'
    ):
        Recorder(nn.Linear(3, 2), input_size=(1, 3), shards="all")


def test_a_net_in_one_piece_has_no_layout_and_records_as_before():
    """No `DTensor` parameter: no layout, the usual plain records (no copy)."""
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    assert not tensor_parallel(net)
    rnet = Recorder(net, input_size=(1, 3))
    assert rnet._passes.plan.shards is None
    rnet.record((1, 1))
    x = torch.rand(2, 3)
    kept = []
    handle = net[0].register_forward_hook(lambda _m, _i, o: kept.append(o))
    rnet(x)
    handle.remove()
    assert rnet.activations[(1, 1)] is kept[0]


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
