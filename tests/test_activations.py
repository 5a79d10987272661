"""scio_recorder.activations: write a token stream's activations, read them back.

The oracle of the stored values is a hand-written forward hook (or pre-hook,
for the input of an output projection) on the same model, run on the same
batches: the same float32 operations on the same inputs, so the stored
float32 rows must equal the hook's kept tokens bit for bit, and bfloat16
rows the hook's values cast to bfloat16. Statistics are checked against a
float64 two-pass computation written out here.
"""

from __future__ import annotations

import errno
import importlib
import json
import math
import re
import socket
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder, activations
from scio_recorder.activations import ActivationDataset, _shuffle, write
from scio_recorder.activations import _loop as _writer
from scio_recorder.collect import InputOf

VOCAB = 50
ROWS, POSITIONS = 3, 10


def gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).eval()


MODELS = {
    "gpt2": (
        gpt2,
        {
            "transformer.h.0": "output",
            "transformer.h.1": "output",
            "transformer.h.1.mlp": "output",
            "transformer.h.0.attn.c_proj": "input",
        },
    ),
    "llama": (
        llama,
        {
            "model.layers.0": "output",
            "model.layers.1": "output",
            "model.layers.0.mlp": "output",
            "model.layers.1.self_attn.o_proj": "input",
        },
    ),
}


def make_batches(
    side: str, n_batches: int = 3, *, seed: int = 1
) -> list[dict[str, torch.Tensor]]:
    """Batches of ids with padding on one side (row lengths vary, one row empty)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(n_batches):
        ids = torch.randint(1, VOCAB, (ROWS, POSITIONS), generator=gen)
        mask = torch.zeros(ROWS, POSITIONS, dtype=torch.long)
        for r in range(ROWS):
            length = [POSITIONS, 4, 7, 0, 1, 9][(b * ROWS + r) % 6]
            if side == "right":
                mask[r, :length] = 1
            else:
                mask[r, POSITIONS - length :] = 1
        ids[mask == 0] = 0
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def recorder(model: nn.Module) -> Recorder:
    ids = torch.ones(1, 4, dtype=torch.long)
    return Recorder(model, input_data={"input_ids": ids})


def layers_of(spec: dict[str, str]) -> list[Any]:
    return [name if what == "output" else InputOf(name) for name, what in spec.items()]


def stored_name(name: str, what: str) -> str:
    return name if what == "output" else f"{name}:input"


def hooked(
    model: nn.Module, spec: dict[str, str], batches: list[dict[str, torch.Tensor]]
) -> dict[str, list[torch.Tensor]]:
    """Each layer's output (or first input) per batch, by plain hooks."""
    seen: dict[str, list[torch.Tensor]] = {
        stored_name(n, w): [] for n, w in spec.items()
    }
    handles = []
    for name, what in spec.items():
        module = model.get_submodule(name)
        key = stored_name(name, what)
        if what == "output":

            def hook(_m, _args, out, key=key):
                seen[key].append((out[0] if isinstance(out, tuple) else out).clone())

            handles.append(module.register_forward_hook(hook))
        else:

            def pre(_m, args, key=key):
                seen[key].append(args[0].clone())

            handles.append(module.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            for batch in batches:
                # as `write` passes them: each row's tokens numbered from 0
                model(**batch, position_ids=numbered(batch["attention_mask"]))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def numbered(mask: torch.Tensor) -> torch.Tensor:
    """Each row's kept tokens numbered 0, 1, ... in order; 0 at the padding."""
    positions = torch.zeros_like(mask)
    for row in range(mask.shape[0]):
        kept = mask[row].bool()
        positions[row, kept] = torch.arange(int(kept.sum()))
    return positions


def kept_rows(
    values: list[torch.Tensor],
    batches: list[dict[str, torch.Tensor]],
    *,
    skip_bos=False,
) -> torch.Tensor:
    """The hook's tokens that the mask keeps, rows then positions."""
    out = []
    for value, batch in zip(values, batches, strict=True):
        keep = batch["attention_mask"].bool()
        if skip_bos:
            keep = keep & (keep.cumsum(1) != 1)
        out.append(value[keep].reshape(int(keep.sum()), math.prod(value.shape[2:])))
    return torch.cat(out)


def kept_index(batches, *, skip_bos=False) -> torch.Tensor:
    out, rows = [], 0
    for batch in batches:
        keep = batch["attention_mask"].bool()
        if skip_bos:
            keep = keep & (keep.cumsum(1) != 1)
        where = keep.nonzero()
        where[:, 0] += rows
        rows += keep.shape[0]
        out.append(where)
    return torch.cat(out)


def everything(ds: ActivationDataset) -> dict[str, torch.Tensor]:
    return ds[torch.arange(len(ds))]


# ---------------------------------------------------------------- the values


def _matrix() -> list[Any]:
    """Every model x padding side x dtype; two of them run by default."""
    fast = {("gpt2", "left", None), ("llama", "right", torch.bfloat16)}
    return [
        pytest.param(
            model,
            side,
            dtype,
            marks=() if (model, side, dtype) in fast else pytest.mark.slow,
            id=f"{model}-{side}-{dtype}",
        )
        for model in sorted(MODELS)
        for side in ("left", "right")
        for dtype in (None, torch.float32, torch.bfloat16)
    ]


@pytest.mark.parametrize(("model_name", "side", "dtype"), _matrix())
def test_stored_tokens_equal_a_forward_hook(tmp_path, model_name, side, dtype):
    """Every kept token of every layer equals the hook's (float32: bit for bit;
    bfloat16: the hook's value cast), with its (row, column); padding is never
    stored."""
    build, spec = MODELS[model_name]
    model = build()
    batches = make_batches(side)
    ds = write(
        recorder(model),
        batches,
        tmp_path / "set",
        layers=layers_of(spec),
        dtype=dtype,
        shard_size=17,
    )
    want = hooked(model, spec, batches)
    index = kept_index(batches)
    assert len(ds) == int(sum(b["attention_mask"].sum() for b in batches))
    assert torch.equal(ds.index, index)
    got = everything(ds)
    assert list(got) == [stored_name(n, w) for n, w in spec.items()]
    for name, values in want.items():
        rows = kept_rows(values, batches)
        if dtype is not None:
            rows = rows.to(dtype)
        assert got[name].dtype == rows.dtype
        assert torch.equal(got[name], rows), name
    # no stored token is padding
    masks = torch.cat([b["attention_mask"] for b in batches])
    assert bool(masks[ds.index[:, 0], ds.index[:, 1]].all())
    assert len(ds.manifest["shards"]) == -(-len(ds) // 17)


def test_the_pass_stops_after_the_last_stored_layer(tmp_path):
    """The layers after the last stored one do not run (early exit, by
    default), and the set equals the one a full pass (`early_exit=False`)
    writes."""
    model = gpt2()
    rnet = recorder(model)
    batches = make_batches("left", 2)
    calls = {"lm_head": 0, "h.1": 0}
    model.lm_head.register_forward_hook(
        lambda *_: calls.__setitem__("lm_head", calls["lm_head"] + 1)
    )
    model.transformer.h[1].register_forward_hook(
        lambda *_: calls.__setitem__("h.1", calls["h.1"] + 1)
    )
    early = write(rnet, batches, tmp_path / "early", layers=["transformer.h.0"])
    assert calls == {"lm_head": 0, "h.1": 0}
    full = write(
        rnet, batches, tmp_path / "full", layers=["transformer.h.0"], early_exit=False
    )
    assert calls == {"lm_head": 2, "h.1": 2}
    assert_same_set(early, full)
    forced = write(
        rnet, batches, tmp_path / "forced", layers=["transformer.h.0"], early_exit=True
    )
    assert calls == {"lm_head": 2, "h.1": 2}
    assert_same_set(early, forced)


def test_early_exit_by_default_runs_the_whole_net_when_its_output_is_stored(
    tmp_path,
):
    """`early_exit=None` stops early unless a stored layer is the net's output
    (depth 0), as `collect`'s; another value is refused, named."""
    model = gpt2()
    rnet = recorder(model)
    calls = {"lm_head": 0}
    model.lm_head.register_forward_hook(
        lambda *_: calls.__setitem__("lm_head", calls["lm_head"] + 1)
    )
    batches = make_batches("right", 1)
    write(rnet, batches, tmp_path / "a", layers={"logits": (0, 1)})
    assert calls == {"lm_head": 1}
    with pytest.raises(
        TypeError, match=r"^`early_exit` must be None, True or False, got 1$"
    ):
        write(rnet, batches, tmp_path / "b", layers=["transformer.h.0"], early_exit=1)


@pytest.mark.parametrize("side", ["left", "right"])
def test_skip_bos_drops_the_first_kept_token_of_each_row(tmp_path, side):
    model = gpt2()
    batches = make_batches(side)
    ds = write(
        recorder(model),
        batches,
        tmp_path,
        layers=["transformer.h.1"],
        skip_bos=True,
    )
    want = hooked(model, {"transformer.h.1": "output"}, batches)["transformer.h.1"]
    assert torch.equal(ds.index, kept_index(batches, skip_bos=True))
    rows = kept_rows(want, batches, skip_bos=True)
    assert torch.equal(everything(ds)["transformer.h.1"], rows)


def test_labels_and_name_call_pairs_are_named_as_documented(tmp_path):
    model = gpt2()
    rnet = recorder(model)
    label = rnet.table.calls_of(model.transformer.h[0])[0].label
    ds = write(
        rnet,
        make_batches("right", 1),
        tmp_path,
        layers=[label, ("transformer.h.1", 0), InputOf("transformer.ln_f")],
    )
    assert ds.layers == (
        f"{label[0]}-{label[1]}",
        "transformer.h.1:0",
        "transformer.ln_f:input",
    )
    named = write(
        rnet,
        make_batches("right", 1),
        tmp_path / "named",
        layers={"resid0": "transformer.h.0"},
    )
    assert named.layers == ("resid0",)
    assert torch.equal(named[0]["resid0"], ds[0][f"{label[0]}-{label[1]}"])


def test_shards_are_safetensors_files(tmp_path):
    """Any safetensors reader opens a shard, and reads what the dataset does."""
    ds = write(
        recorder(gpt2()),
        make_batches("left"),
        tmp_path,
        layers=["transformer.h.0", "transformer.h.1"],
        dtype=torch.bfloat16,
        shard_size=11,
    )
    start = 0
    for entry in ds.manifest["shards"]:
        with safetensors.safe_open(str(tmp_path / entry["file"]), "pt") as file:
            assert sorted(file.keys()) == [
                "__index__",
                "transformer.h.0",
                "transformer.h.1",
            ]
            for name in ds.layers:
                tensor = file.get_tensor(name)
                assert tensor.dtype == torch.bfloat16
                want = ds[torch.arange(start, start + entry["tokens"])][name]
                assert torch.equal(tensor, want)
        start += entry["tokens"]
    assert start == len(ds)


def test_a_write_starting_leaves_other_ranks_temporaries_alone(tmp_path):
    """A rank starting (or resuming) removes its own stale temporaries only.

    Another rank's `.<shard>.<random>.tmp` is a shard it is writing right
    now: removing it made that rank's rename fail (a CI failure of the
    two-rank test, when one rank started while the other was writing).
    """
    theirs = tmp_path / ".shard-p0-r1-00000.safetensors.k3j2h1g0.tmp"
    ours = tmp_path / ".shard-p0-r0-00000.safetensors.a1b2c3d4.tmp"
    our_progress = tmp_path / ".progress-p0-r0.json.e5f6g7h8.tmp"
    for path in (theirs, ours, our_progress):
        path.write_bytes(b"partial")
    write(recorder(gpt2()), make_batches("left"), tmp_path, layers=["transformer.h.0"])
    assert theirs.read_bytes() == b"partial"
    assert not ours.exists()
    assert not our_progress.exists()


def test_the_manifest_describes_the_set(tmp_path):
    ds = write(
        recorder(llama()),
        make_batches("left"),
        tmp_path,
        layers=["model.layers.1"],
        dtype=torch.bfloat16,
        metadata={"tokenizer": "none (random ids)"},
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest == ds.manifest
    assert manifest["model"]["class"].endswith("LlamaForCausalLM")
    assert manifest["model"]["config"]["hidden_size"] == 16
    assert manifest["layers"]["model.layers.1"]["dtype"] == "bfloat16"
    assert manifest["layers"]["model.layers.1"]["shape"] == [16]
    assert "LlamaDecoderLayer" in manifest["layers"]["model.layers.1"]["call"]
    assert manifest["metadata"] == {"tokenizer": "none (random ids)"}
    assert manifest["tokens"] == len(ds)
    assert ds.dtypes == {"model.layers.1": torch.bfloat16}
    assert ds.dims == {"model.layers.1": 16}
    assert repr(ds) == (
        f"ActivationDataset('{tmp_path}', tokens={len(ds)}, layers=['model.layers.1'])"
    )


def test_the_recorders_selection_is_restored(tmp_path):
    rnet = recorder(gpt2())
    rnet.record("transformer.ln_f")
    before = rnet.recording
    write(rnet, make_batches("left", 1), tmp_path, layers=["transformer.h.0"])
    assert rnet.recording == before


def test_a_tensor_batch_with_mask_none_keeps_every_token(tmp_path):
    model = gpt2()
    ids = torch.randint(1, VOCAB, (2, 5))
    ds = write(recorder(model), [ids], tmp_path, layers=["transformer.h.0"], mask=None)
    with torch.no_grad():
        want = model(ids, output_hidden_states=True).hidden_states[1]
    assert torch.equal(everything(ds)["transformer.h.0"], want.reshape(10, -1))


def test_a_tokenizers_batch_encoding_is_a_batch(tmp_path):
    """A `BatchEncoding` (what a tokenizer returns) passes as keyword inputs,
    its attention mask found by name; `device=` moves it first."""
    model = gpt2()
    batches = make_batches("left", 2)
    encodings = [transformers.BatchEncoding(dict(b)) for b in batches]
    ds = write(
        recorder(model),
        encodings,
        tmp_path,
        layers=["transformer.h.1"],
        device="cpu",
    )
    want = hooked(model, {"transformer.h.1": "output"}, batches)["transformer.h.1"]
    assert torch.equal(everything(ds)["transformer.h.1"], kept_rows(want, batches))


def test_input_by_key_and_the_mask_by_callable(tmp_path):
    """`input=` and `mask=` take collect's forms: a key, an index, a callable."""
    model = gpt2()
    batches = make_batches("right", 2)
    tupled = [(b["input_ids"], b["attention_mask"]) for b in batches]
    ds = write(
        recorder(model),
        tupled,
        tmp_path,
        layers=["transformer.h.0"],
        input=lambda b: {"input_ids": b[0], "attention_mask": b[1]},
        mask=1,
    )
    assert torch.equal(ds.index, kept_index(batches))


# ------------------------------------------------------------------- shuffle


def test_shuffle_is_a_reproducible_permutation_of_the_unshuffled_set(tmp_path):
    model = gpt2()
    rnet = recorder(model)
    batches = make_batches("left", 4)
    layers = ["transformer.h.0", "transformer.h.1"]
    plain = write(rnet, batches, tmp_path / "plain", layers=layers)
    runs = {
        key: write(
            rnet,
            batches,
            tmp_path / f"{key[0]}-{key[1]}",
            layers=layers,
            seed=key[0],
            shuffle_buffer=key[1],
            shard_size=13,
        )
        for key in [(0, 16), (0, 1000), (1, 16)]
    }
    again = write(
        rnet,
        batches,
        tmp_path / "again",
        layers=layers,
        seed=0,
        shuffle_buffer=16,
        shard_size=13,
    )
    order = {tuple(row) for row in plain.index.tolist()}
    base = everything(plain)
    position = {tuple(row): i for i, row in enumerate(plain.index.tolist())}
    for ds in runs.values():
        assert len(ds) == len(plain)
        assert {tuple(row) for row in ds.index.tolist()} == order  # a permutation
        got = everything(ds)
        where = torch.tensor([position[tuple(row)] for row in ds.index.tolist()])
        for name in layers:  # each token keeps its own vectors
            assert torch.equal(got[name], base[name][where])
    assert not torch.equal(runs[0, 16].index, plain.index)
    assert not torch.equal(runs[0, 16].index, runs[1, 16].index)
    assert torch.equal(again.index, runs[0, 16].index)  # the seed decides
    assert torch.equal(
        everything(again)["transformer.h.1"], everything(runs[0, 16])["transformer.h.1"]
    )


def loop_shuffle(capacity: int, chunks: list[torch.Tensor], seed: int) -> list[int]:
    """The shuffle buffer token by token, drawing the same random numbers."""
    gen = torch.Generator().manual_seed(seed)
    buffer: list[int] = []
    out: list[int] = []
    for chunk in chunks:
        values = chunk.tolist()
        take = min(len(values), capacity - len(buffer))
        buffer.extend(values[:take])
        rest = values[take:]
        if not rest:
            continue
        slots = torch.randint(capacity, (len(rest),), generator=gen).tolist()
        for value, slot in zip(rest, slots, strict=True):
            out.append(buffer[slot])
            buffer[slot] = value
    order = torch.randperm(len(buffer), generator=gen).tolist()
    out.extend(buffer[i] for i in order)
    return out


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 40),
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    seed=st.integers(0, 2**31),
)
def test_the_shuffle_buffer_is_the_token_by_token_loop(capacity, sizes, seed):
    """Chunks handled at once give the loop's order (chains of tokens drawing
    one slot included), hence a permutation of what came in."""
    start = 0
    chunks = []
    for size in sizes:
        chunks.append(torch.arange(start, start + size))
        start += size
    buffer = _shuffle.ShuffleBuffer(capacity, seed=seed)
    out = [buffer.push({"x": chunk, "y": -chunk})["x"] for chunk in chunks]
    flushed = buffer.flush() or {"x": torch.empty(0, dtype=torch.int64)}
    assert torch.equal(flushed.get("y", -flushed["x"]), -flushed["x"])
    got = torch.cat([*out, flushed["x"]]).tolist()
    assert got == loop_shuffle(capacity, chunks, seed)
    assert sorted(got) == list(range(start))


def test_the_shuffle_buffer_state_resumes_the_same_order():
    chunks = [torch.arange(i * 7, i * 7 + 7) for i in range(6)]
    whole = _shuffle.ShuffleBuffer(10, seed=3)
    first = [whole.push({"x": c})["x"] for c in chunks]
    first.append(whole.flush()["x"])
    part = _shuffle.ShuffleBuffer(10, seed=3)
    second = [part.push({"x": c})["x"] for c in chunks[:3]]
    state = {k: v.clone() for k, v in part.state().items()}
    resumed = _shuffle.ShuffleBuffer(10, seed=99)
    resumed.load_state(state)
    second += [resumed.push({"x": c})["x"] for c in chunks[3:]]
    second.append(resumed.flush()["x"])
    assert torch.equal(torch.cat(first), torch.cat(second))


# ----------------------------------------------------------- masks, a toy net


class Toy(nn.Module):
    """Token ids to vectors, position-dependent: quick for property tests."""

    def __init__(self, width: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, width)
        self.proj = nn.Linear(width, width)

    def forward(self, input_ids, attention_mask=None):
        x = self.embed(input_ids) + torch.arange(input_ids.shape[1])[:, None]
        return self.proj(x)


def toy_recorder() -> Recorder:
    return Recorder(Toy(), input_data={"input_ids": torch.ones(1, 3, dtype=torch.long)})


@settings(max_examples=25, deadline=None)
@given(
    masks=st.lists(
        st.lists(
            st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=4
        ),
        min_size=1,
        max_size=3,
    ),
    skip_bos=st.booleans(),
    buffer=st.one_of(st.none(), st.integers(1, 30)),
    shard_size=st.integers(1, 9),
)
def test_any_mask_keeps_exactly_its_tokens(
    tmp_path_factory, masks, skip_bos, buffer, shard_size
):
    """Whatever the masks (rows all padding included), buffer and shard sizes:
    the stored tokens are exactly the kept ones, each with its own vector."""
    gen = torch.Generator().manual_seed(0)
    batches = []
    for mask in masks:
        m = torch.tensor(mask, dtype=torch.long)
        batches.append(
            {
                "input_ids": torch.randint(1, VOCAB, m.shape, generator=gen),
                "attention_mask": m,
            }
        )
    if not int(sum(int(kept_index([b], skip_bos=skip_bos).shape[0]) for b in batches)):
        return  # no token: refused, tested elsewhere
    rnet = toy_recorder()
    folder = tmp_path_factory.mktemp("set")
    ds = write(
        rnet,
        batches,
        folder,
        layers=["proj"],
        skip_bos=skip_bos,
        shuffle_buffer=buffer,
        shard_size=shard_size,
    )
    want_index = kept_index(batches, skip_bos=skip_bos)
    net = rnet.net
    with torch.no_grad():
        values = [net(**b) for b in batches]
    want = kept_rows(values, batches, skip_bos=skip_bos)
    position = {tuple(row): i for i, row in enumerate(want_index.tolist())}
    got_index = ds.index.tolist()
    assert sorted(got_index) == sorted(want_index.tolist())
    where = torch.tensor([position[tuple(row)] for row in got_index])
    assert torch.equal(everything(ds)["proj"], want[where])
    if buffer is None:
        assert got_index == want_index.tolist()


# ------------------------------------------------------------------ resuming


class InterruptError(RuntimeError):
    pass


def interrupt_after(monkeypatch, shards: int, error: BaseException) -> dict[str, int]:
    """Make the writer raise ``error`` when it writes shard number ``shards``."""
    calls = {"n": 0}
    real = _writer.write_shard

    def flaky(path, *args, **kwargs):
        if path.name.startswith("shard-"):
            if calls["n"] == shards:
                raise error
            calls["n"] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_writer, "write_shard", flaky)
    return calls


def assert_same_set(a: ActivationDataset, b: ActivationDataset) -> None:
    assert len(a) == len(b)
    assert a.layers == b.layers
    assert torch.equal(a.index, b.index)
    x, y = everything(a), everything(b)
    for name in a.layers:
        assert torch.equal(x[name], y[name])
    assert [e["tokens"] for e in a.manifest["shards"]] == [
        e["tokens"] for e in b.manifest["shards"]
    ]


@pytest.mark.parametrize(
    ("buffer", "when"),
    [
        pytest.param(
            buffer, when, marks=() if (buffer, when) == (23, 2) else pytest.mark.slow
        )
        for buffer in (None, 23)
        for when in (0, 2, 5)
    ],
)
def test_a_write_interrupted_after_some_shards_resumes_into_the_same_set(
    tmp_path, monkeypatch, buffer, when
):
    rnet = recorder(gpt2())
    batches = make_batches("left", 6)
    options: dict[str, Any] = {
        "layers": ["transformer.h.0", "transformer.h.1"],
        "shuffle_buffer": buffer,
        "shard_size": 7,
        "stats": True,
        "dtype": torch.bfloat16,
    }
    whole = write(rnet, batches, tmp_path / "whole", **options)
    with monkeypatch.context() as patch:
        interrupt_after(patch, when, InterruptError("stop"))
        with pytest.raises(InterruptError, match="stop"):
            write(rnet, batches, tmp_path / "cut", **options)
    assert not (tmp_path / "cut" / "manifest.json").exists()
    if (tmp_path / "cut" / "progress-p0-r0.json").exists():
        with pytest.raises(ValueError, match=r"is unfinished .* call `write` again"):
            ActivationDataset(tmp_path / "cut")
    resumed = write(rnet, batches, tmp_path / "cut", **options)
    assert_same_set(resumed, whole)
    for name in whole.layers:
        for key in ("mean", "var", "norm", "count"):
            assert torch.equal(resumed.stats[name][key], whole.stats[name][key])
    leftovers = sorted(
        p.name
        for p in (tmp_path / "cut").iterdir()
        if "progress" in p.name or p.name.startswith(".")
    )
    assert leftovers == []


def test_an_interrupt_between_batches_is_checkpointed(tmp_path):
    """An error raised by the batches (a KeyboardInterrupt) checkpoints the
    batches done; the rerun skips them without running the net."""
    rnet = recorder(gpt2())
    batches = make_batches("right", 5)
    options: dict[str, Any] = {
        "layers": ["transformer.h.1"],
        "shard_size": 4,
        "shuffle_buffer": 9,
    }
    whole = write(rnet, batches, tmp_path / "whole", **options)

    def stopping():
        yield from batches[:3]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write(rnet, stopping(), tmp_path / "cut", **options)
    progress = json.loads((tmp_path / "cut" / "progress-p0-r0.json").read_text())
    assert progress["batches"] == 3
    passes = {"n": 0}
    handle = rnet.net.register_forward_pre_hook(
        lambda *_: passes.__setitem__("n", passes["n"] + 1)
    )
    try:
        resumed = write(rnet, batches, tmp_path / "cut", **options)
    finally:
        handle.remove()
    assert passes["n"] == 2
    assert_same_set(resumed, whole)


def test_a_full_disk_keeps_the_shards_written_so_far(tmp_path, monkeypatch):
    rnet = recorder(gpt2())
    batches = make_batches("left", 6)
    options: dict[str, Any] = {"layers": ["transformer.h.0"], "shard_size": 5}
    whole = write(rnet, batches, tmp_path / "whole", **options)
    folder = tmp_path / "full"
    with monkeypatch.context() as patch:
        interrupt_after(patch, 4, OSError(errno.ENOSPC, "No space left on device"))
        pattern = (
            rf"The disk holding '{re.escape(str(folder))}' is full .*No space left on "
            r"device.*\. The \d+ shards committed so far \(\d+ tokens\) are valid and "
            r"kept: free some space .* call `write` again with the same arguments"
        )
        with pytest.raises(OSError, match=pattern) as info:
            write(rnet, batches, folder, **options)
    assert info.value.errno == errno.ENOSPC
    progress = json.loads((folder / "progress-p0-r0.json").read_text())
    assert 1 <= len(progress["shards"]) <= 4
    for number, entry in enumerate(progress["shards"]):  # valid, and the set's
        want = safetensors.torch.load_file(
            str(tmp_path / "whole" / whole.manifest["shards"][number]["file"])
        )
        got = safetensors.torch.load_file(str(folder / entry["file"]))
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in got)
    assert_same_set(write(rnet, batches, folder, **options), whole)


def test_other_batches_on_resume_are_refused(tmp_path, monkeypatch):
    rnet = recorder(gpt2())
    batches = make_batches("left", 4)
    options: dict[str, Any] = {"layers": ["transformer.h.0"], "shard_size": 5}
    with monkeypatch.context() as patch:
        interrupt_after(patch, 6, InterruptError("stop"))  # in batch 2 of 4
        with pytest.raises(InterruptError):
            write(rnet, batches, tmp_path, **options)
    other = make_batches("right", 4)
    with pytest.raises(
        ValueError,
        match=r"token ids or masks differ\): the batches differ.*`overwrite=True`",
    ):
        write(rnet, other, tmp_path, **options)
    with pytest.raises(
        ValueError, match=r"yielded 1 batches, but .* had already taken"
    ):
        write(rnet, batches[:1], tmp_path, **options)
    with pytest.raises(
        ValueError,
        match=r"unfinished write with other arguments:\n- seed: saved 0, now 1",
    ):
        write(rnet, batches, tmp_path, **options, seed=1)


@pytest.mark.slow
def test_a_damaged_progress_file_is_refused(tmp_path, monkeypatch):
    rnet = recorder(gpt2())
    batches = make_batches("left", 4)
    options: dict[str, Any] = {"layers": ["transformer.h.0"], "shard_size": 5}
    with monkeypatch.context() as patch:
        interrupt_after(patch, 6, InterruptError("stop"))  # in batch 2 of 4
        with pytest.raises(InterruptError):
            write(rnet, batches, tmp_path, **options)
    path = tmp_path / "progress-p0-r0.json"
    record = json.loads(path.read_text())
    for field, value in [("batches", 1), ("rows", -1), ("shards", "x")]:
        edited = dict(record, **{field: value})
        path.write_text(json.dumps(edited))
        with pytest.raises(
            ValueError, match=r"damaged or was edited: .*`overwrite=True`"
        ):
            write(rnet, batches, tmp_path, **options)
    path.write_text(json.dumps(record))
    (tmp_path / record["shards"][0]["file"]).write_bytes(b"\0" * 12)
    with pytest.raises(ValueError, match="is not what its progress file says"):
        write(rnet, batches, tmp_path, **options)
    ds = write(rnet, batches, tmp_path, **options, overwrite=True)
    assert len(ds) == int(sum(b["attention_mask"].sum() for b in batches))


# --------------------------------------------------------- the folder's state


def test_a_finished_set_with_the_same_arguments_is_returned_as_it_is(tmp_path):
    rnet = recorder(gpt2())
    batches = make_batches("left", 2)
    first = write(rnet, batches, tmp_path, layers=["transformer.h.0"], shuffle_buffer=5)
    stamp = (tmp_path / "manifest.json").stat().st_mtime_ns

    def untouched():
        pytest.fail("the batches were read")
        yield

    again = write(
        rnet, untouched(), tmp_path, layers=["transformer.h.0"], shuffle_buffer=5
    )
    assert (tmp_path / "manifest.json").stat().st_mtime_ns == stamp
    assert_same_set(again, first)
    pattern = (
        rf"'{re.escape(str(tmp_path))}' holds an activation set written with other "
        r"arguments:\n- shuffle_buffer: saved 5, now 6\nPass `overwrite=True`"
    )
    with pytest.raises(ValueError, match=pattern):
        write(rnet, batches, tmp_path, layers=["transformer.h.0"], shuffle_buffer=6)
    new = write(
        rnet,
        batches,
        tmp_path,
        layers=["transformer.h.0"],
        shuffle_buffer=6,
        overwrite=True,
    )
    assert not torch.equal(new.index, first.index)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["manifest.json", *[e["file"] for e in new.manifest["shards"]]]


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(
        ValueError, match=r"holds files that are not an activation set \(notes\.txt\)"
    ):
        write(
            recorder(gpt2()),
            make_batches("left", 1),
            tmp_path,
            layers=["transformer.h.0"],
        )
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_append_adds_a_stream_and_equals_one_write_of_both(tmp_path):
    rnet = recorder(gpt2())
    first, second = make_batches("left", 2, seed=1), make_batches("right", 3, seed=2)
    options: dict[str, Any] = {
        "layers": ["transformer.h.0", "transformer.h.1"],
        "stats": True,
        "shard_size": 8,
    }
    write(rnet, first, tmp_path / "grown", **options)
    grown = write(rnet, second, tmp_path / "grown", **options, append=True)
    both = write(rnet, first + second, tmp_path / "both", **options)
    assert len(grown.manifest["parts"]) == 2
    assert torch.equal(grown.index, both.index)  # rows go on counting
    x, y = everything(grown), everything(both)
    for name in both.layers:
        assert torch.equal(x[name], y[name])
        # Chan's merge of the two parts against one pass over both: float64
        # roundings of a few additions, relative to the values (~1).
        for key in ("mean", "var", "norm"):
            torch.testing.assert_close(
                grown.stats[name][key], both.stats[name][key], rtol=1e-12, atol=1e-12
            )
        assert int(grown.stats[name]["count"]) == len(both)
    # the first call again: the set (both parts) as it is
    same = write(rnet, first, tmp_path / "grown", **options)
    assert len(same) == len(grown)
    with pytest.raises(ValueError, match=r"Cannot append .*its layers differ"):
        write(
            rnet,
            second,
            tmp_path / "grown",
            layers=["transformer.h.0"],
            stats=True,
            append=True,
        )
    with pytest.raises(ValueError, match=r"stored as float32, not bfloat16"):
        write(
            rnet,
            second,
            tmp_path / "grown",
            **options,
            append=True,
            dtype=torch.bfloat16,
        )


# ---------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    "model_name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)]
)
def test_statistics_equal_a_float64_two_pass_computation(tmp_path, model_name):
    """Mean, population variance and mean norm, from the values before the cast."""
    build, spec = MODELS[model_name]
    model = build()
    batches = make_batches("left", 4)
    ds = write(
        recorder(model),
        batches,
        tmp_path,
        layers=layers_of(spec),
        stats=True,
        dtype=torch.bfloat16,
        shuffle_buffer=10,
    )
    for name, values in hooked(model, spec, batches).items():
        x = kept_rows(values, batches).double()
        mean = x.sum(0) / x.shape[0]
        var = ((x - mean) ** 2).sum(0) / x.shape[0]
        norm = torch.linalg.vector_norm(x, dim=1).sum() / x.shape[0]
        got = ds.stats[name]
        # Chan's merge of per-batch two-pass summaries against one two-pass
        # sum: a few float64 roundings of sums of O(1) values.
        torch.testing.assert_close(got["mean"], mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["var"], var, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["norm"], norm, rtol=1e-12, atol=1e-12)
        assert int(got["count"]) == x.shape[0]
        assert got["mean"].dtype == torch.float64


def test_statistics_of_a_set_written_without_them_say_so(tmp_path):
    ds = write(
        recorder(gpt2()), make_batches("left", 1), tmp_path, layers=["transformer.h.0"]
    )
    assert len(ds.stats) == 0
    with pytest.raises(
        KeyError, match=r"written without statistics: write it with `stats=True`"
    ):
        ds.stats["transformer.h.0"]


# ------------------------------------------------------------------ reading


def test_a_dataloader_with_two_workers_reads_the_set(tmp_path):
    ds = write(
        recorder(gpt2()),
        make_batches("left", 4),
        tmp_path,
        layers=["transformer.h.0", "transformer.h.1"],
        shard_size=6,
        dtype=torch.bfloat16,
    )
    for shard in range(2):  # maps opened in this process must not travel
        ds[shard * 6]
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2)
    batches = list(loader)
    whole = everything(ds)
    for name in ds.layers:
        got = torch.cat([b[name] for b in batches])
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, whole[name])
    shuffled = torch.utils.data.DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert sum(b["transformer.h.0"].shape[0] for b in shuffled) == len(ds)


def test_the_loader_reads_batches_at_once_with_their_index(tmp_path):
    ds = write(
        recorder(gpt2()),
        make_batches("right", 3),
        tmp_path,
        layers=["transformer.h.0", "transformer.h.1"],
        shard_size=6,
    )
    whole = everything(ds)
    batches = list(ds.loader(5, index=True))
    assert [b["transformer.h.0"].shape[0] for b in batches[:-1]] == [5] * (
        len(batches) - 1
    )
    for name in ds.layers:
        assert torch.equal(torch.cat([b[name] for b in batches]), whole[name])
    assert torch.equal(torch.cat([b["index"] for b in batches]), ds.index)
    gen = torch.Generator().manual_seed(0)
    shuffled = list(
        ds.loader(4, shuffle=True, index=True, num_workers=2, generator=gen)
    )
    index = torch.cat([b["index"] for b in shuffled])
    assert sorted(index.tolist()) == sorted(ds.index.tolist())
    assert not torch.equal(index, ds.index)
    position = {tuple(row): i for i, row in enumerate(ds.index.tolist())}
    where = torch.tensor([position[tuple(row)] for row in index.tolist()])
    got = torch.cat([b["transformer.h.1"] for b in shuffled])
    assert torch.equal(got, whole["transformer.h.1"][where])  # rows keep their index
    assert [len(b["transformer.h.0"]) for b in ds.loader(4, drop_last=True)] == [4] * (
        len(ds) // 4
    )


def test_the_loader_refuses_an_index_key_that_names_a_layer(tmp_path):
    ds = write(
        recorder(gpt2()),
        make_batches("right", 1),
        tmp_path,
        layers={"index": "transformer.h.0"},
    )
    with pytest.raises(ValueError, match=r"also the name of a layer of this set"):
        ds.loader(4, index=True)
    assert next(iter(ds.loader(4)))["index"].shape == (4, 16)


def test_items_slices_and_lists_read_the_same_tokens(tmp_path):
    ds = write(
        recorder(gpt2()),
        make_batches("right", 3),
        tmp_path,
        layers=["transformer.h.0"],
        shard_size=4,
    )
    n = len(ds)
    column = torch.stack([ds[i]["transformer.h.0"] for i in range(n)])
    assert torch.equal(ds[:]["transformer.h.0"], column)
    assert torch.equal(ds[[n - 1, 0, 5]]["transformer.h.0"], column[[n - 1, 0, 5]])
    assert torch.equal(ds[-1]["transformer.h.0"], column[-1])
    assert torch.equal(ds[2:9:3]["transformer.h.0"], column[2:9:3])
    for bad in (n, -n - 1):
        with pytest.raises(
            IndexError, match=rf"index {bad} is out of range for a set of {n} tokens"
        ):
            ds[bad]
    with pytest.raises(IndexError, match=rf"index {n} is out of range"):
        ds[[0, n]]


def test_masks_arrays_and_reversed_slices_select_as_torch_does(tmp_path):
    """A boolean mask selects where it is true (never rows 0 and 1)."""
    ds = write(
        recorder(gpt2()),
        make_batches("right", 2),
        tmp_path,
        layers=["transformer.h.0"],
        shard_size=4,
    )
    n = len(ds)
    column = ds[:]["transformer.h.0"]
    keep = torch.zeros(n, dtype=torch.bool)
    keep[[3, 5]] = True
    for mask in (keep, keep.numpy(), keep.tolist()):
        assert torch.equal(ds[mask]["transformer.h.0"], column[keep])
    assert torch.equal(ds[np.array([4, 1])]["transformer.h.0"], column[[4, 1]])
    assert torch.equal(ds[np.int64(2)]["transformer.h.0"], column[2])
    assert torch.equal(ds[torch.tensor(2)]["transformer.h.0"], column[2])
    assert torch.equal(ds[::-1]["transformer.h.0"], column.flip(0))
    assert ds[[]]["transformer.h.0"].shape == (0, column.shape[1])
    with pytest.raises(
        IndexError, match=rf"mask of shape \[3\] does not fit a set of {n}"
    ):
        ds[torch.ones(3, dtype=torch.bool)]
    with pytest.raises(TypeError, match=r"not torch.float32 values: round them"):
        ds[torch.tensor([1.0, 2.0])]
    with pytest.raises(IndexError, match=r"not a tensor of shape \[1, 2\]: flatten"):
        ds[torch.tensor([[0, 1]])]
    for bad in (1.7, "transformer.h.0", None):
        with pytest.raises(TypeError, match=r"Index a set with an int, .* not "):
            ds[bad]


def test_a_missing_or_damaged_set_is_refused(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"holds no activation set \(no manifest\.json\)"
    ):
        ActivationDataset(tmp_path)
    write(
        recorder(gpt2()), make_batches("left", 1), tmp_path, layers=["transformer.h.0"]
    )
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    shard = tmp_path / manifest["shards"][0]["file"]
    data = shard.read_bytes()
    shard.write_bytes(data[:-4])
    with pytest.raises(
        ValueError,
        match=r"is not what the manifest says: it is \d+ bytes, its header says \d+",
    ):
        ActivationDataset(tmp_path)
    shard.write_bytes(data)
    for edit in ({"tokens": 1}, {"format": "x"}, {"shards": [{"file": "../x"}]}):
        (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **edit}))
        with pytest.raises(ValueError, match=r"manifest .* is damaged or was edited"):
            ActivationDataset(tmp_path)


# ------------------------------------------------------------------- errors


def test_a_tensor_batch_cannot_carry_the_mask(tmp_path):
    ids = torch.randint(1, VOCAB, (2, 5))
    pattern = (
        r"`mask='attention_mask'` names an entry of the batch, but batch 0 is a "
        r"Tensor, which has none: pass `mask=None` to keep every token"
    )
    with pytest.raises(TypeError, match=pattern):
        write(recorder(gpt2()), [ids], tmp_path, layers=["transformer.h.0"])


def test_a_mask_named_but_absent_is_refused_naming_it(tmp_path):
    batch = {"input_ids": torch.randint(1, VOCAB, (2, 5))}
    with pytest.raises(
        KeyError,
        match=(
            r"`mask='attention_mask'`: batch 0 has no such entry "
            r"\(its keys are \['input_ids'\]\)"
        ),
    ):
        write(recorder(gpt2()), [batch], tmp_path, layers=["transformer.h.0"])


def test_padding_without_a_mask_is_refused(tmp_path):
    model = gpt2()
    model.config.pad_token_id = 7
    ids = torch.randint(8, VOCAB, (2, 5))
    ids[1, -2:] = 7
    # With a pad_token_id, the model reads its ids to warn about padding:
    # the flow is then not provably static.
    rnet = Recorder(
        model,
        input_data={"input_ids": torch.ones(1, 4, dtype=torch.long)},
        force_static_flow=False,
    )
    pattern = (
        r"Batch 0 holds the padding token id 7 \(`config.pad_token_id`\), but "
        r"`mask=None` keeps every token"
    )
    with pytest.raises(ValueError, match=pattern):
        write(rnet, [ids], tmp_path, layers=["transformer.h.0"], mask=None)


def test_a_layer_called_several_times_per_forward_is_refused(tmp_path):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 4)
            self.block = nn.Linear(4, 4)

        def forward(self, input_ids):
            return self.block(self.block(self.embed(input_ids)))

    rnet = Recorder(
        Twice(), input_data={"input_ids": torch.ones(1, 3, dtype=torch.long)}
    )
    ids = torch.randint(1, VOCAB, (2, 5))
    with pytest.raises(
        ValueError,
        match=(
            r"`layers`: layer 'block' selects 2 calls \(1-2, 1-3\); name one of "
            r"them, e.g. `layers=\[\(1, 2\)\]`"
        ),
    ):
        write(rnet, [ids], tmp_path, layers=["block"], mask=None)
    ds = write(rnet, [ids], tmp_path, layers=[("block", 1)], mask=None)
    assert ds.layers == ("block:1",)


def test_a_dtype_that_overflows_is_refused_naming_the_layer(tmp_path):
    rnet = toy_recorder()
    with torch.no_grad():
        rnet.net.proj.weight.mul_(1e5)
    ids = torch.randint(1, VOCAB, (2, 5))
    pattern = (
        r"Layer 'proj' \(output of `proj` \(Linear, call 0, 1-2\)\) holds values up to "
        r"[\d.e+]+ in magnitude, which overflow torch.float16 \(largest 6.55e\+04\): "
        r"store it as `dtype=torch.bfloat16`"
    )
    with pytest.raises(ValueError, match=pattern):
        write(rnet, [ids], tmp_path, layers=["proj"], mask=None, dtype=torch.float16)


def test_a_second_write_in_a_locked_folder_is_refused(tmp_path):
    owner = {"pid": 1, "host": "elsewhere.invalid", "started": "x", "token": "0"}
    (tmp_path / "write.lock").write_text(json.dumps(owner))
    pattern = (
        rf"'{re.escape(str(tmp_path))}' is in use by another activation write run: "
        r"locked by pid 1 on host 'elsewhere\.invalid'"
    )
    with pytest.raises(RuntimeError, match=pattern):
        write(
            recorder(gpt2()),
            make_batches("left", 1),
            tmp_path,
            layers=["transformer.h.0"],
        )
    assert socket.gethostname() != "elsewhere.invalid"


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"layers": []}, ValueError, r"`layers` is empty"),
        (
            {"layers": "transformer.h.0"},
            TypeError,
            r"`layers` must be a list of selectors",
        ),
        (
            {"layers": ["nope"]},
            ValueError,
            r"`layers`: layer 'nope' is not a layer of this net",
        ),
        (
            {"layers": ["transformer.h.0", "transformer.h.0"]},
            ValueError,
            r"stores the same call or name",
        ),
        (
            {"dtype": torch.int8},
            TypeError,
            r"`dtype` must be None \(each layer's own dtype\)",
        ),
        (
            {"shuffle_buffer": 0},
            ValueError,
            r"`shuffle_buffer` must be None or a number of tokens >= 1, got 0",
        ),
        ({"seed": -1}, ValueError, r"`seed` must be an int >= 0, got -1"),
        ({"skip_bos": 1}, TypeError, r"`skip_bos` must be True or False, got 1"),
        ({"overwrite": True, "append": True}, ValueError, r"pass one of them"),
        ({"metadata": {"x": object()}}, TypeError, r"`metadata` must be JSON"),
        ({"mask": 1.5}, TypeError, r"`mask` must be an int, a str, a callable or None"),
    ],
)
def test_bad_options_are_refused(tmp_path, options, error, pattern):
    kwargs: dict[str, Any] = {"layers": ["transformer.h.0"], **options}
    with pytest.raises(error, match=pattern):
        write(recorder(gpt2()), make_batches("left", 1), tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())


def test_no_token_is_refused(tmp_path):
    batch = make_batches("left", 1)[0]
    batch["attention_mask"] = torch.zeros_like(batch["attention_mask"])
    with pytest.raises(ValueError, match=r"The batches gave no token to store"):
        write(recorder(gpt2()), [batch], tmp_path, layers=["transformer.h.0"])


def test_the_progress_bar_counts_tokens(tmp_path, capsys):
    write(
        recorder(gpt2()),
        make_batches("left", 2),
        tmp_path,
        layers=["transformer.h.0"],
        progress=True,
    )
    err = capsys.readouterr().err
    assert "write 1 layer" in err
    assert "tok" in err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_arrow_export_opens_with_hugging_face_datasets(tmp_path, dtype):
    """Each shard becomes an Arrow file `datasets` maps: the same tokens, rows
    and columns in the same order (bfloat16 widened to float32, exactly)."""
    datasets = pytest.importorskip("datasets")
    ds = write(
        recorder(gpt2()),
        make_batches("left", 3),
        tmp_path / "set",
        layers=["transformer.h.0", "transformer.h.1"],
        dtype=dtype,
        shard_size=9,
        shuffle_buffer=7,
    )
    paths = ds.to_arrow(tmp_path / "arrow")
    assert [p.name for p in paths] == [
        f"data-{k:05d}-of-{len(paths):05d}.arrow" for k in range(len(paths))
    ]
    table = datasets.concatenate_datasets(
        [datasets.Dataset.from_file(str(p)) for p in paths]
    ).with_format("torch")
    assert len(table) == len(ds)
    rows = table[:]  # every row, as tensors
    whole = everything(ds)
    for name in ds.layers:
        assert torch.equal(rows[name], whole[name].float())
    assert torch.equal(rows["row"], ds.index[:, 0])
    assert torch.equal(rows["column"], ds.index[:, 1])


def test_an_arrow_export_without_pyarrow_says_how_to_get_it(tmp_path, monkeypatch):
    ds = write(
        recorder(gpt2()), make_batches("left", 1), tmp_path, layers=["transformer.h.0"]
    )
    real = importlib.import_module

    def refuse(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", refuse)
    with pytest.raises(
        ImportError,
        match=r"needs pyarrow, which is not installed: `pip install pyarrow`",
    ):
        ds.to_arrow(tmp_path / "arrow")


def test_the_face_exports_its_names():
    assert activations.__all__ == [
        "MANIFEST",
        "ActivationDataset",
        "SparseLatents",
        "TokenBatch",
        "merge",
        "token_batches",
        "write",
    ]
    assert activations.MANIFEST == "manifest.json"


# ------------------------------------------------- checks on what is read back


def toy_set(folder, *, stats=False, batches=2, shard_size=8, world_rows=None):
    """A set of the toy net: 2 batches of 3 x 5 ids, no padding, 8-token shards."""
    gen = torch.Generator().manual_seed(5)
    ids = [torch.randint(1, VOCAB, (3, 5), generator=gen) for _ in range(batches)]
    return write(
        toy_recorder(),
        ids,
        folder,
        layers=["proj"],
        mask=None,
        shard_size=shard_size,
        stats=stats,
    )


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_each_shard_stores_the_crc32_of_its_bytes(tmp_path):
    import zlib  # noqa: PLC0415 (the oracle of this test)

    ds = toy_set(tmp_path)
    shards = ds.manifest["shards"]
    assert len(shards) == 4  # 30 tokens in shards of 8
    for entry in shards:
        data = (tmp_path / entry["file"]).read_bytes()
        assert entry["crc32"] == f"{zlib.crc32(data):08x}"


@pytest.mark.parametrize("where", ["values", "index"])
def test_a_flipped_bit_in_a_shard_is_refused_on_its_first_read(tmp_path, where):
    # It read back as the wrong rows, with no error.
    ds = toy_set(tmp_path)
    clean = ActivationDataset(tmp_path, verify=False)[:]
    clean_index = ds.index
    entry = ds.manifest["shards"][1]
    path = tmp_path / entry["file"]
    header, start = activations._shards.read_header(path)
    column = "proj" if where == "values" else "__index__"
    flip(path, start + header[column]["data_offsets"][0] + 5)
    opened = ActivationDataset(tmp_path)  # the header and the size are as written
    assert torch.equal(opened[0]["proj"], clean["proj"][0])  # shard 0: intact
    message = (
        f"The shard '{path}' of the activation set in '{tmp_path}' is damaged: its "
        f"bytes have the CRC-32 {activations._shards.checksum(path.read_bytes())}, "
        f"not the {entry['crc32']} written: the file was damaged (or edited) after "
        "it was written. Write the set again with `write(..., overwrite=True)`, or "
        "restore the folder. (`ActivationDataset(path, verify=False)` reads it "
        "unchecked.)"
    )
    for read in (lambda d: d[8], lambda d: d[:], lambda d: d.index):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            read(ActivationDataset(tmp_path))
    unchecked = ActivationDataset(tmp_path, verify=False)
    read_back = unchecked[:]["proj"] if where == "values" else unchecked.index
    truth = clean["proj"] if where == "values" else clean_index
    assert not torch.equal(read_back, truth)  # what verify=False would not see


DAMAGED = "The manifest '{}' of the activation set is damaged or was edited: "
REWRITE = (
    "Write the set again with `write(..., overwrite=True)`, or restore the folder."
)


def test_a_set_with_checksums_refuses_one_taken_out_naming_the_file(tmp_path):
    """Format 2 (every shard and the statistics checksummed): a `crc32` or
    `stats_crc32` taken out of the manifest is refused, naming the file."""
    # Taking them out turned the checks off: a damaged shard read silently.
    ds = toy_set(tmp_path, stats=True)
    assert ds.manifest["format"] == "scio_recorder.activations/2"
    original = (tmp_path / "manifest.json").read_text()
    shard = ds.manifest["shards"][2]["file"]
    flip(tmp_path / shard, (tmp_path / shard).stat().st_size - 2)  # a value
    edited_manifest(tmp_path, lambda m: m["shards"][2].pop("crc32"))
    message = (
        DAMAGED.format(tmp_path / "manifest.json")
        + f"the shard '{shard}' has no 'crc32', which every set of format "
        "'scio_recorder.activations/2' records, so it could not be verified. " + REWRITE
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ActivationDataset(tmp_path)
    (tmp_path / "manifest.json").write_text(original)
    edited_manifest(tmp_path, lambda m: m.pop("stats_crc32"))
    message = (
        DAMAGED.format(tmp_path / "manifest.json")
        + f"the statistics file '{ds.manifest['stats']}' has no 'stats_crc32', "
        "which every set of format 'scio_recorder.activations/2' records, so it "
        "could not be verified. " + REWRITE
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ActivationDataset(tmp_path)


def test_a_set_written_before_the_checksums_reads_unverified(tmp_path, monkeypatch):
    """Format 1 (no checksums: before them, or written with them off) reads
    as it is; an append to it stays format 1 and checks the checksums it has."""
    monkeypatch.setattr(activations._shards, "CHECKSUM", False)
    ds = toy_set(tmp_path)
    assert ds.manifest["format"] == "scio_recorder.activations/1"
    assert all("crc32" not in entry for entry in ds.manifest["shards"])
    assert [part["checksums"] for part in ds.manifest["parts"]] == [False]
    truth = ds[:]["proj"].clone()
    monkeypatch.setattr(activations._shards, "CHECKSUM", True)
    gen = torch.Generator().manual_seed(6)
    more = [torch.randint(1, VOCAB, (3, 5), generator=gen)]
    grown = write(
        toy_recorder(), more, tmp_path, layers=["proj"], mask=None, shard_size=8,
        append=True,
    )  # fmt: skip
    assert grown.manifest["format"] == "scio_recorder.activations/1"
    new = [entry for entry in grown.manifest["shards"] if entry["part"] == 1]
    assert new
    assert all("crc32" in entry for entry in new)
    assert torch.equal(ActivationDataset(tmp_path)[: len(truth)]["proj"], truth)
    flip(tmp_path / new[0]["file"], (tmp_path / new[0]["file"]).stat().st_size - 2)
    with pytest.raises(ValueError, match=r"is damaged: its bytes have the CRC-32 "):
        ActivationDataset(tmp_path)[len(truth)]


def _lowered(m):
    """A set of format 2 lowered to format 1 by hand, its checksums taken out."""
    m["format"] = "scio_recorder.activations/1"
    for entry in m["shards"]:
        entry.pop("crc32")
    m.pop("stats_crc32")


@pytest.mark.parametrize("marker", ["checksums", "rank_rows"])
def test_a_set_lowered_to_format_1_by_hand_is_refused(tmp_path, marker):
    """Its parts say that they were written with checksums (``checksums``;
    before that field, ``rank_rows``, which came with them)."""
    # A damaged value read back as it was, with no error.
    ds = toy_set(tmp_path, stats=True)
    assert [part["checksums"] for part in ds.manifest["parts"]] == [True]
    shard = ds.manifest["shards"][2]["file"]
    flip(tmp_path / shard, (tmp_path / shard).stat().st_size - 2)  # a value
    if marker == "rank_rows":  # a set written before the parts' "checksums"
        edited_manifest(tmp_path, lambda m: m["parts"][0].pop("checksums"))
    original = (tmp_path / "manifest.json").read_text()
    edited_manifest(tmp_path, _lowered)
    why = (
        "although part 0 was written by a version that stores a checksum for "
        "each file and writes the format 'scio_recorder.activations/2' (the "
        "manifest says 'scio_recorder.activations/1': was it lowered by hand?), "
        "so it could not be verified. "
    )
    message = (
        DAMAGED.format(tmp_path / "manifest.json")
        + "the shard 'shard-p0-r0-00000.safetensors' has no 'crc32', "
        + why
        + REWRITE
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ActivationDataset(tmp_path)
    (tmp_path / "manifest.json").write_text(original)
    edited_manifest(tmp_path, lambda m: m.pop("stats_crc32"))
    edited_manifest(tmp_path, lambda m: m.update(format="scio_recorder.activations/1"))
    message = (
        DAMAGED.format(tmp_path / "manifest.json")
        + f"the statistics file '{ds.manifest['stats']}' has no 'stats_crc32', "
        + why
        + REWRITE
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ActivationDataset(tmp_path)


def test_a_set_of_format_1_written_before_the_checksums_still_reads(tmp_path):
    """No ``checksums`` and no ``rank_rows`` in its part: written before them."""
    truth = toy_set(tmp_path, stats=True)[:]["proj"].clone()

    def older(m):
        _lowered(m)
        for part in m["parts"]:
            del part["checksums"], part["rank_rows"]

    edited_manifest(tmp_path, older)
    assert torch.equal(ActivationDataset(tmp_path)[:]["proj"], truth)
    edited_manifest(tmp_path, lambda m: m["parts"][0].update(checksums="yes"))
    with pytest.raises(ValueError, match=r"was edited: 'parts' is \["):
        ActivationDataset(tmp_path)


def test_verify_must_be_a_bool(tmp_path):
    toy_set(tmp_path)
    with pytest.raises(TypeError, match=r"^`verify` must be True or False, got 1$"):
        ActivationDataset(tmp_path, verify=1)


def test_a_damaged_statistics_file_is_named(tmp_path):
    # safetensors' bare SafetensorError named neither the file nor the set.
    ds = toy_set(tmp_path, stats=True)
    path = tmp_path / ds.manifest["stats"]
    data = path.read_bytes()
    fix = (
        "It is damaged or was edited. Write the set again with "
        "`write(..., overwrite=True)`, or restore the folder."
    )
    start = f"The statistics file '{path}' of the activation set in '{tmp_path}' "
    flip(path, 3)  # the header's length
    with pytest.raises(ValueError, match=f"^{re.escape(start)}cannot be read: .*"):
        ActivationDataset(tmp_path).stats  # noqa: B018 (the property reads the file)
    path.write_bytes(data)
    flip(path, len(data) - 3)  # a value: safetensors reads it without complaint
    bad = activations._shards.checksum(path.read_bytes())
    message = (
        f"{start}cannot be read: its bytes have the CRC-32 {bad}, not the "
        f"{ds.manifest['stats_crc32']} written. {fix}"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ActivationDataset(tmp_path).stats  # noqa: B018


def edited_manifest(folder, edit):
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _twice(m):
    m["shards"].insert(2, dict(m["shards"][1]))
    m["tokens"] += m["shards"][1]["tokens"]
    m["parts"][0]["tokens"] += m["shards"][1]["tokens"]


def _moved(m):
    m["shards"][1]["row_offset"] = 2


def _swapped(m):
    m["shards"][1], m["shards"][2] = m["shards"][2], m["shards"][1]


def _part_tokens(m):
    m["parts"][0]["tokens"] += 1


def _rows(m):
    m["rows"] += 1


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_twice, "the shard 'shard-p0-r0-00001.safetensors' is listed twice"),
        (
            _moved,
            (
                "the shard 'shard-p0-r0-00001.safetensors' has the row offset 2, "
                "but the rows before it are 0"
            ),
        ),
        (
            _swapped,
            (
                "the shard 'shard-p0-r0-00002.safetensors' is not shard 1 of its "
                "part and rank"
            ),
        ),
        (_part_tokens, "part 0 holds 31 tokens, but its shards hold 30"),
        (_rows, "'rows' is 7, but its parts hold 6"),
    ],
)
def test_a_manifest_whose_parts_disagree_is_refused_on_open(tmp_path, edit, problem):
    # A shard listed twice or a moved row_offset was read without complaint.
    toy_set(tmp_path)
    edited_manifest(tmp_path, edit)
    message = (
        f"The manifest '{tmp_path / 'manifest.json'}' of the activation set is "
        f"damaged or was edited: {problem}. Write the set again with "
        "`write(..., overwrite=True)`, or restore the folder."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ActivationDataset(tmp_path)


def test_an_appended_set_has_consistent_offsets(tmp_path):
    toy_set(tmp_path)
    gen = torch.Generator().manual_seed(6)
    more = [torch.randint(1, VOCAB, (2, 5), generator=gen)]
    ds = write(
        toy_recorder(), more, tmp_path, layers=["proj"], mask=None, shard_size=8,
        append=True,
    )  # fmt: skip
    assert [e["row_offset"] for e in ds.manifest["shards"]] == [0] * 4 + [6, 6]
    assert [p["rank_rows"] for p in ds.manifest["parts"]] == [[6], [2]]
    assert ds.index[-1].tolist() == [7, 4]


@pytest.mark.parametrize("existed", [True, False])
def test_a_refused_write_leaves_nothing_behind(tmp_path, existed):
    # Its progress files marked the folder as an interrupted write: the same
    # call with real batches failed again, until `overwrite=True`.
    folder = tmp_path / "set"
    if existed:
        folder.mkdir()
    empty = torch.zeros(0, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^The batches gave no token to store"):
        write(toy_recorder(), [empty], folder, layers=["proj"], mask=None)
    assert (list(folder.iterdir()) == []) if existed else not folder.exists()
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    assert len(write(toy_recorder(), [ids], folder, layers=["proj"], mask=None)) == 10


ACCEPTED = (
    "a batch is token ids: a tensor [batch, positions], or a "
    "mapping of the net's keyword inputs (a tokenizer's output, "
    "`{'input_ids': ..., 'attention_mask': ...}`); other forms with `input=` "
    "(e.g. `input=lambda b: {'input_ids': b[0], 'attention_mask': b[1]}, mask=1` "
    "for (ids, mask) tuples)."
)


@pytest.mark.parametrize(
    ("batch", "what", "hint"),
    [
        (
            [[1, 2, 3]],
            "a list",
            " Make a tensor of the ids (`torch.tensor(ids)`), or tokenize them.",
        ),
        (
            "some text",
            "a str",
            " Tokenize the text first (`tokenizer(texts, return_tensors='pt')`).",
        ),
        (None, "None", ""),
        (np.ones((2, 3), dtype=np.int64), "a numpy ndarray",
         " Convert it with `torch.as_tensor(batch)`."),
        (
            (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3)),
            "a tuple",
            (" For (ids, mask) tuples pass `input=lambda b: {'input_ids': b[0], "
             "'attention_mask': b[1]}, mask=1`: the model needs the mask too."),
        ),
    ],
)  # fmt: skip
def test_a_batch_of_another_form_is_named_with_what_is_accepted(
    tmp_path, batch, what, hint
):
    # It crashed deep inside the model (embedding(): argument 'indices' ...).
    ok = torch.ones(2, 3, dtype=torch.long)
    message = f"Batch 1 is {what}: {ACCEPTED}{hint}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        write(toy_recorder(), [ok, batch], tmp_path / "set", layers=["proj"], mask=None)


def test_an_ids_mask_tuple_is_a_batch_with_input_and_mask(tmp_path):
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, 3:] = 0
    ds = write(
        toy_recorder(), [(ids, mask)], tmp_path, layers=["proj"],
        input=lambda b: {"input_ids": b[0], "attention_mask": b[1]}, mask=1,
    )  # fmt: skip
    assert len(ds) == 8
    with pytest.raises(TypeError, match=r"^Batch 0 gives the net no tensor"):
        write(toy_recorder(), [(None, mask)], tmp_path / "b", layers=["proj"],
              input=0, mask=1)  # fmt: skip
    # A net whose forward takes no attention_mask: the mask only chooses tokens.
    plain = nn.Sequential(nn.Embedding(VOCAB, 3), nn.Linear(3, 3))
    rnet = Recorder(plain, input_data=torch.ones(1, 3, dtype=torch.long))
    ds = write(rnet, [(ids, mask)], tmp_path / "c", layers=["1"], input=0, mask=1)
    with torch.no_grad():
        assert torch.equal(ds[:]["1"], plain(ids)[mask.bool()])


def test_a_mask_of_other_rows_is_refused_before_the_pass(tmp_path):
    # GPT-2 failed on it inside its attention: a bare RuntimeError.
    batch = make_batches("left", 1)[0]
    batch["attention_mask"] = torch.ones(ROWS + 1, POSITIONS, dtype=torch.long)
    message = (
        f"`mask='attention_mask'` of batch 0 has shape [{ROWS + 1}, {POSITIONS}], "
        f"but its token ids are [{ROWS}, {POSITIONS}]: a padding mask has one "
        "entry per token id (the same rows and positions)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        write(recorder(gpt2()), [batch], tmp_path, layers=["transformer.h.0"])


def test_append_to_an_unfinished_write_says_how_to_finish_it(tmp_path, monkeypatch):
    # It said "the batches differ".
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(1, VOCAB, (2, 5), generator=gen) for _ in range(3)]
    interrupt_after(monkeypatch, 3, KeyboardInterrupt())  # in the second batch
    with pytest.raises(KeyboardInterrupt):
        write(toy_recorder(), ids, tmp_path, layers=["proj"], mask=None, shard_size=4)
    monkeypatch.undo()
    assert (tmp_path / "progress-p0-r0.json").is_file()
    message = (
        f"'{tmp_path}' holds an unfinished write (interrupted before its set was "
        "finished), not a set to append to: call `write` again with that write's "
        "arguments and batches, without `append=True`, to resume and finish it, "
        "then append; or pass `overwrite=True` to start over (this deletes it)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        write(toy_recorder(), ids[::-1], tmp_path, layers=["proj"], mask=None,
              shard_size=4, append=True)  # fmt: skip
    ds = write(toy_recorder(), ids, tmp_path, layers=["proj"], mask=None, shard_size=4)
    assert len(ds) == 30


@pytest.mark.parametrize(
    ("metadata", "where", "value"),
    [
        ({"lr": float("nan")}, "metadata['lr']", "nan"),
        ({"runs": [{"loss": 1.0}, {"loss": float("inf")}]},
         "metadata['runs'][1]['loss']", "inf"),
        (float("-inf"), "metadata", "-inf"),
    ],
)  # fmt: skip
def test_metadata_holding_nan_or_infinity_is_refused_naming_the_key(
    tmp_path, metadata, where, value
):
    # It was written into manifest.json, which strict JSON readers refuse.
    message = (
        f"`{where}` is {value}, which strict JSON has no number for: "
        "`manifest.json` would be refused by strict JSON readers. Store it as a "
        "string (e.g. 'nan') or as null."
    )
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        write(toy_recorder(), [ids], tmp_path / "set", layers=["proj"], mask=None,
              metadata=metadata)  # fmt: skip
    assert not (tmp_path / "set").exists()
