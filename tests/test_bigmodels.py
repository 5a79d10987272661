"""Models placed by accelerate wrap with the defaults, and every job on them is exact.

accelerate places a model by hooks on its modules (``module._hf_hook``):
:func:`accelerate.cpu_offload` and :func:`accelerate.disk_offload` keep every
weight off the model (on the ``meta`` device) and load a module's weights
from an offload map just before it runs; :func:`accelerate.dispatch_model`
with a ``device_map`` puts each part on a device, here the CPU (weights in
place) or the disk (offloaded); ``from_pretrained(..., device_map=...)``
does the same from a saved checkpoint. CI has no accelerator, so the
execution device is the CPU: the placed model runs the very float32
operations of the plain one, on the very same values, in the same order.
Every result is therefore compared bit for bit (``torch.equal``) with the
same job on an undispatched twin (same seed, same weights), whose results
come from the bare model or the recorder on it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from scio_recorder import Recorder, collect
from scio_recorder._net.preserve import unload_offloaded
from scio_recorder.explain import logit_lens, patch
from scio_recorder.ood import Energy, Mahalanobis

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

B, T, VOCAB, CLASSES = 2, 6, 100, 3
PLACEMENTS = ("cpu_offload", "disk_offload", "device_map")


@dataclasses.dataclass(frozen=True)
class Arch:
    """A small causal language model and the names the jobs use."""

    build: Callable[[], nn.Module]
    base: str  # the attribute holding the decoder (without the head)
    parts: tuple[str, ...]  # the decoder's parts, covering its tensors
    blocks: tuple[str, ...]  # residual-stream blocks, relative to `base`
    inner: str  # a layer inside a block, relative to `base`
    final: str  # the final norm, relative to `base`


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=64,
        initializer_range=0.2,  # a signal well above float32 rounding
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).eval()


ARCHS = {
    "gpt2": Arch(
        _gpt2,
        "transformer",
        ("wte", "wpe", "drop", "h.0", "h.1", "ln_f"),
        ("h.0", "h.1"),
        "h.0.mlp.c_fc",
        "ln_f",
    ),
    "llama": Arch(
        _llama,
        "model",
        ("embed_tokens", "layers.0", "layers.1", "norm", "rotary_emb"),
        ("layers.0", "layers.1"),
        "layers.0.mlp.up_proj",
        "norm",
    ),
}


class Classifier(nn.Module):
    """A decoder read at its last token by a linear head: ``[batch, classes]``.

    What the OoD detectors take (logits per sample); the decoder is the
    placed language model's own, so its weights are offloaded with it.
    """

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.lm = decoder
        self.head = nn.Linear(32, CLASSES)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.lm(input_ids=input_ids).last_hidden_state
        return self.head(hidden[:, -1])


def twins(arch: Arch, *, classifier: bool = False) -> tuple[nn.Module, nn.Module]:
    """Return two equal models (same seed), the plain one first."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = arch.build()
        if classifier:
            model = Classifier(getattr(model, arch.base)).eval()
        models.append(model)
    return models[0], models[1]


def device_map(arch: Arch, *, classifier: bool = False) -> dict[str, str]:
    """Each part on the CPU or on the disk, in turn (the head on the CPU)."""
    base = "lm" if classifier else arch.base
    names = [f"{base}.{part}" for part in arch.parts]
    places = {name: ("cpu", "disk")[i % 2] for i, name in enumerate(names)}
    return places | {"head" if classifier else "lm_head": "cpu"}


def place(
    model: nn.Module, how: str, folder: Path, arch: Arch, *, classifier: bool = False
) -> nn.Module:
    """Place ``model`` as accelerate does, executing on the CPU."""
    if how == "cpu_offload":
        return accelerate.cpu_offload(model, execution_device="cpu")
    if how == "disk_offload":
        return accelerate.disk_offload(model, folder, execution_device="cpu")
    mapping = device_map(arch, classifier=classifier)
    return accelerate.dispatch_model(model, mapping, offload_dir=folder)


def ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(
        1, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed)
    )


def offloaded_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """Return every tensor the model computes with, by qualified name.

    A tensor on the ``meta`` device is read from its hook's offload map.
    """
    values = {}
    for module_name, module in model.named_modules():
        hook = getattr(module, "_hf_hook", None)
        weights = getattr(hook, "weights_map", None)
        for name, tensor in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]:
            value = weights[name] if tensor.is_meta and weights is not None else tensor
            values[f"{module_name}.{name}".lstrip(".")] = value.detach().clone()
    return values


def snapshot(model: nn.Module) -> dict[str, Any]:
    """Everything construction could change: slots, devices, hooks, values."""
    slots = {
        (module_name, name): (id(tensor), type(tensor), tensor.device, tensor.dtype)
        for module_name, module in model.named_modules()
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]
        if tensor is not None
    }
    hooks = {
        name: (id(module._hf_hook), dict(vars(module._hf_hook)))
        for name, module in model.named_modules()
        if hasattr(module, "_hf_hook")
    }
    forwards = {name: module.forward for name, module in model.named_modules()}
    return {
        "slots": slots,
        "hooks": hooks,
        "forwards": forwards,
        "training": [m.training for m in model.modules()],
    }


def assert_same_values(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]):
    assert got.keys() == want.keys()
    changed = [name for name in got if not torch.equal(got[name], want[name])]
    assert changed == [], f"values changed: {changed}"


def lm_placed(name: str, how: str, folder: Path) -> tuple[Arch, nn.Module, nn.Module]:
    """Return the architecture, the plain model and its placed twin."""
    arch = ARCHS[name]
    plain, other = twins(arch)
    return arch, plain, place(other, how, folder, arch)


# ------------------------------------------------------------------ construction


CONSTRUCTIONS_FAST = [
    ("gpt2", "disk_offload", "real"),
    ("gpt2", "disk_offload", "fake"),
    ("gpt2", "device_map", "real"),
]
CONSTRUCTIONS = [
    case if case in CONSTRUCTIONS_FAST else pytest.param(*case, marks=pytest.mark.slow)
    for case in [
        (name, how, tensors)
        for name in ARCHS
        for how in PLACEMENTS
        for tensors in ("real", "fake")
    ]
]


@pytest.mark.parametrize(("name", "how", "tensors"), CONSTRUCTIONS)
def test_construction_leaves_the_placed_model_as_it_was(name, how, tensors, tmp_path):
    """Wrapping keeps parameters, devices, hooks and the model's own outputs."""
    _, plain, model = lm_placed(name, how, tmp_path)
    x = ids()
    want = plain(x).logits
    assert any(p.is_meta for p in model.parameters())  # something is offloaded
    before = snapshot(model)
    values = offloaded_values(model)
    Recorder(model, input_data={"input_ids": x}, reference_tensors=tensors)
    after = snapshot(model)
    assert after["slots"] == before["slots"]
    assert after["hooks"].keys() == before["hooks"].keys()
    for key, (hook_id, attributes) in before["hooks"].items():
        assert after["hooks"][key][0] == hook_id
        assert {k: id(v) for k, v in after["hooks"][key][1].items()} == {
            k: id(v) for k, v in attributes.items()
        }, f"the hook of {key} changed"
    assert after["forwards"] == before["forwards"]
    assert after["training"] == before["training"]
    assert not any(isinstance(p, FakeTensor) for p in model.parameters())
    assert_same_values(offloaded_values(model), values)
    assert torch.equal(model(x).logits, want)  # the model itself still runs


def test_from_pretrained_with_a_device_map_wraps_and_records_exactly(tmp_path):
    """A model reloaded over CPU and disk wraps with the defaults, records exactly."""
    arch = ARCHS["gpt2"]
    plain, _ = twins(arch)
    plain.save_pretrained(tmp_path / "model")
    model = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "model",
        device_map=device_map(arch),
        offload_folder=tmp_path / "offload",
        attn_implementation="eager",
    )
    assert {p.device.type for p in model.parameters()} == {"cpu", "meta"}
    x = {"input_ids": ids()}
    rnet, rplain = (Recorder(m, input_data=x) for m in (model, plain))
    for r in (rnet, rplain):
        r.record("transformer.h.0", "transformer.h.1")
    out, want = rnet(**x), rplain(**x)
    assert torch.equal(out.logits, want.logits)
    for label, record in rplain.activations.items():
        assert torch.equal(rnet.activations[label][0], record[0])


def test_a_refused_offloaded_net_is_left_as_it_was(tmp_path):
    """A fake pass that stops inside an offloaded module leaves nothing behind."""

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x @ self.weight
            return y if y.sum() > 0 else -y  # a value read inside the module

    net = nn.Sequential(nn.Linear(3, 3), Branchy())
    x = torch.randn(2, 3)
    want = net(x)
    accelerate.disk_offload(net, tmp_path, execution_device="cpu")
    before, values = snapshot(net), offloaded_values(net)
    with pytest.raises(RuntimeError, match=r"reads a tensor value into Python at "):
        Recorder(net, input_data=x)
    assert snapshot(net)["slots"] == before["slots"]
    assert_same_values(offloaded_values(net), values)
    assert torch.equal(net(x), want)


@pytest.mark.parametrize("offload", ["cpu_offload", "disk_offload"])
def test_a_train_mode_reference_pass_keeps_offloaded_running_statistics(
    offload, tmp_path
):
    """BatchNorm statistics offloaded with the buffers are not updated by it."""
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    net[1].running_mean.normal_()
    want = {k: v.clone() for k, v in net.state_dict().items()}
    if offload == "cpu_offload":
        accelerate.cpu_offload(net, execution_device="cpu", offload_buffers=True)
    else:
        accelerate.disk_offload(
            net, tmp_path, execution_device="cpu", offload_buffers=True
        )
    assert net[1].running_mean.is_meta
    Recorder(net, input_size=(3, 4), mode="train")
    assert_same_values(offloaded_values(net), want)


def test_weights_left_loaded_by_an_interrupted_pass_are_offloaded_again():
    """`unload_offloaded` runs the `post_forward` a pass that raised skipped."""
    arch = ARCHS["gpt2"]
    plain, model = twins(arch)
    # Each block loads all its weights before it runs (and unloads them after).
    accelerate.cpu_offload(
        model, execution_device="cpu", preload_module_classes=["GPT2Block"]
    )
    x = ids()

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    handle = model.transformer.h[0].mlp.c_fc.register_forward_hook(stop)
    with pytest.raises(KeyboardInterrupt):
        model(x)
    handle.remove()
    block = model.transformer.h[0]
    assert not any(p.is_meta for p in block.parameters())  # left loaded
    assert unload_offloaded(model) == ["transformer.h.0"]
    assert all(p.is_meta for p in model.parameters())
    assert unload_offloaded(model) == []
    assert torch.equal(model(x).logits, plain(x).logits)


def test_input_size_makes_inputs_without_moving_a_placed_model():
    """`input_size` works on an offloaded model; `device=` is refused, saying why."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    x = torch.randn(4, 3)
    want = net(x)
    accelerate.cpu_offload(net, execution_device="cpu")
    rnet = Recorder(net, input_size=(1, 3))
    (example,), _ = rnet.example_inputs()
    assert example.device == torch.device("cpu")  # not the meta device
    msg = (
        "`device='cpu'` makes torchinfo move the net, which would undo "
        "accelerate's placement of this model"
    )
    with pytest.raises(ValueError, match=f"^{msg}"):
        Recorder(net, input_size=(1, 3), device="cpu")
    assert all(p.is_meta for p in net.parameters())
    rnet.record((1, 1))
    assert torch.equal(rnet(x), want)


# ------------------------------------------------------------------------- jobs


def both(
    name: str, how: str, folder: Path, *, classifier: bool = False
) -> tuple[Arch, Recorder, Recorder]:
    """Return the architecture and recorders on the plain and the placed twins."""
    arch = ARCHS[name]
    plain, other = twins(arch, classifier=classifier)
    model = place(other, how, folder, arch, classifier=classifier)
    x = {"input_ids": ids()}
    return arch, Recorder(plain, input_data=x), Recorder(model, input_data=x)


def stream(output: Any) -> torch.Tensor:
    """A block's residual stream: the output, or its first item."""
    return output[0] if isinstance(output, tuple) else output


def names(arch: Arch, *parts: str) -> list[str]:
    return [f"{arch.base}.{part}" for part in parts]


JOBS_FAST = [("gpt2", "disk_offload")]
JOBS_SLOW = [
    pytest.param(name, how, marks=pytest.mark.slow)
    for name in ARCHS
    for how in PLACEMENTS
    if (name, how) not in JOBS_FAST
]
JOBS = [*JOBS_FAST, *JOBS_SLOW]


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_records_and_edits_equal_the_plain_model(name, how, tmp_path):
    """Records (outputs and inputs) and an edit give what the plain model gives."""
    arch, rplain, rnet = both(name, how, tmp_path)
    blocks = names(arch, *arch.blocks)
    inner = names(arch, arch.inner)[0]
    steer = torch.randn(32) * 0.5

    def edit(output: Any) -> Any:
        stream = output[0] if isinstance(output, tuple) else output
        edited = stream + steer
        return (edited, *output[1:]) if isinstance(output, tuple) else edited

    results = []
    for r in (rplain, rnet):
        r.record(*blocks, inner, inputs=inner)
        out = r(input_ids=ids(2), activation_postproc={blocks[0]: edit})
        results.append((out.logits, dict(r.activations), dict(r.inputs)))
    (want, want_records, want_inputs), (got, records, inputs) = results
    assert torch.equal(got, want)
    assert records.keys() == want_records.keys()
    for label, record in want_records.items():
        stream = records[label][0] if isinstance(record, tuple) else records[label]
        expected = record[0] if isinstance(record, tuple) else record
        assert stream.device == torch.device("cpu")  # where the layer ran
        assert torch.equal(stream, expected)
    for label, call in want_inputs.items():
        assert torch.equal(inputs[label].args[0], call.args[0])


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_generate_with_an_edit_equals_the_plain_model(name, how, tmp_path):
    """Steered greedy generation: the same tokens and the same step records."""
    arch, rplain, rnet = both(name, how, tmp_path)
    block = names(arch, arch.blocks[1])[0]
    steer = torch.randn(32)

    def edit(output: Any) -> Any:
        stream = output[0] if isinstance(output, tuple) else output
        return (
            (stream + steer, *output[1:])
            if isinstance(output, tuple)
            else stream + steer
        )

    results = []
    for r in (rplain, rnet):
        r.record(block)
        tokens = r.generate(
            ids()[:1],
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
            activation_postproc={block: edit},
        )
        results.append((tokens, [dict(step) for step in r.steps]))
    (want, want_steps), (got, steps) = results
    assert torch.equal(got, want)
    assert len(steps) == len(want_steps) == 4
    for step, want_step in zip(steps, want_steps, strict=True):
        for label, record in want_step.items():
            first = record[0] if isinstance(record, tuple) else record
            mine = step[label][0] if isinstance(record, tuple) else step[label]
            assert torch.equal(mine, first)


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_collect_equals_the_plain_model(name, how, tmp_path):
    """Streamed statistics and kept rows equal the plain model's, bit for bit."""
    arch, rplain, rnet = both(name, how, tmp_path / "offload")
    inner = names(arch, arch.inner)[0]
    batches = [{"input_ids": ids(seed)} for seed in range(3)]
    keep = {inner: "moments", f"{arch.base}.{arch.final}": "concat"}
    got = collect(rnet, batches, keep, input="input_ids")
    want = collect(rplain, batches, keep, input="input_ids")
    assert got.keys() == want.keys()
    for label in want:
        assert_tree_equal(got[label], want[label])


def assert_tree_equal(got: Any, want: Any) -> None:
    """Assert that two nests of tensors are equal, bit for bit."""
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_tree_equal(got[key], want[key])
    elif isinstance(want, list | tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_tree_equal(g, w)
    elif dataclasses.is_dataclass(want):
        assert_tree_equal(dataclasses.asdict(got), dataclasses.asdict(want))
    else:
        assert got == want


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_detectors_equal_the_plain_model(name, how, tmp_path):
    """A feature detector's fit and scores, a logit detector's scores: equal."""
    _, rplain, rnet = both(name, how, tmp_path, classifier=True)
    data = [(ids(seed), torch.arange(B) % CLASSES + seed % 2) for seed in range(4)]
    test = ids(99)
    results = []
    for r in (rplain, rnet):
        maha = Mahalanobis(r).fit(data, target=1)
        results.append((maha.means, maha.precision, maha(test), Energy(r)(test)))
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_explain_equals_the_plain_model(name, how, tmp_path):
    """Patching a block at one token, and the logit lens: equal."""
    arch, rplain, rnet = both(name, how, tmp_path)
    blocks = names(arch, *arch.blocks)
    clean, corrupted = {"input_ids": ids(1)}, {"input_ids": ids(2)}
    results = []
    for r in (rplain, rnet):
        patched = patch(r, clean, corrupted, blocks[0], where=(slice(None), 2))
        lens = logit_lens(r, clean, blocks)
        results.append((patched.logits, lens))
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)


# --------------------------------------------------------------- early exit


def weight_loads(model: nn.Module) -> list[str]:
    """Record the name of each module whose offloaded weights a pass loads.

    A forward pre-hook on each module whose accelerate hook offloads; it
    fires just before the hook's ``pre_forward`` loads the weights.
    """
    loads: list[str] = []
    for name, module in model.named_modules():
        if getattr(getattr(module, "_hf_hook", None), "offload", False):
            module.register_forward_pre_hook(
                lambda _m, _a, name=name: loads.append(name)
            )
    return loads


def offloaded_on_meta(model: nn.Module) -> dict[str, bool]:
    """Whether each offloaded module's parameters are back on ``meta``."""
    return {
        name: all(p.is_meta for p in module.parameters(recurse=False))
        for name, module in model.named_modules()
        if getattr(getattr(module, "_hf_hook", None), "offload", False)
    }


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_early_exit_records_equal_the_plain_models_full_pass(name, how, tmp_path):
    """A pass that stops after block 0 records what a full pass of the plain model does.

    It loads fewer offloaded weights, and leaves every offloaded module's
    weights back on ``meta``; the next full pass is unchanged.
    """
    arch, rplain, rnet = both(name, how, tmp_path)
    first = names(arch, arch.blocks[0])[0]
    inner = names(arch, arch.inner)[0]
    for r in (rplain, rnet):
        r.record(first, inner)
    x = ids(3)
    with torch.no_grad():
        want = rplain(input_ids=x)
        loads = weight_loads(rnet.net)
        assert rnet(input_ids=x, early_exit=True) is None
        early = len(loads)
        loads.clear()
        full = rnet(input_ids=x)
    assert 0 < early < len(loads)  # the blocks after block 0 were not loaded
    assert torch.equal(full.logits, want.logits)
    for label, record in rplain.activations.items():
        assert torch.equal(stream(rnet.activations[label]), stream(record))
    assert all(offloaded_on_meta(rnet.net).values())


def test_early_exit_inside_a_preloaded_block_leaves_no_weight_loaded():
    """Stopping inside a block whose hook loads all its weights offloads them again.

    With ``preload_module_classes`` a block's hook loads the weights of the
    whole block before it runs and offloads them after; a pass that stops
    inside the block skips that ``post_forward``: the pass runs it.
    """
    plain, model = twins(ARCHS["gpt2"])
    accelerate.cpu_offload(
        model, execution_device="cpu", preload_module_classes=["GPT2Block"]
    )
    x = ids()
    rnet = Recorder(model, input_data={"input_ids": x})
    rnet.record("transformer.h.0.mlp.c_fc")
    with torch.no_grad():
        assert rnet(input_ids=x, early_exit=True) is None
        assert all(p.is_meta for p in model.parameters())
        _, seen = plain_hooked(plain, "transformer.h.0.mlp.c_fc", x)
        assert torch.equal(rnet.activations_of("transformer.h.0.mlp.c_fc")[0], seen)
        assert torch.equal(model(x).logits, plain(x).logits)


def plain_hooked(net: nn.Module, name: str, x: torch.Tensor) -> tuple[Any, Any]:
    """Run ``net`` with a hand-written forward hook on ``name``; return both outputs."""
    seen: list[Any] = []
    handle = net.get_submodule(name).register_forward_hook(
        lambda _m, _a, out: seen.append(out)
    )
    try:
        return net(x), seen[0]
    finally:
        handle.remove()


@pytest.mark.parametrize(("name", "how"), JOBS)
def test_collect_exits_early_on_a_placed_model_as_on_the_plain_one(name, how, tmp_path):
    """`collect` exits early on a placed model and gives the plain model's results."""
    arch, rplain, rnet = both(name, how, tmp_path / "offload")
    inner = names(arch, arch.inner)[0]
    batches = [{"input_ids": ids(seed)} for seed in range(3)]
    keep = {inner: "moments", names(arch, arch.blocks[0])[0]: "count"}
    loads = weight_loads(rnet.net)
    got = collect(rnet, batches, keep, input="input_ids")
    early = len(loads)
    loads.clear()
    full = collect(rnet, batches, keep, input="input_ids", early_exit=False)
    want = collect(rplain, batches, keep, input="input_ids", early_exit=False)
    assert early < len(loads)
    for label in want:
        assert_tree_equal(got[label], want[label])
        assert_tree_equal(full[label], want[label])
    assert all(offloaded_on_meta(rnet.net).values())
