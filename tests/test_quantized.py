"""Quantized models: torchao's int8 (weight-only, dynamic) and bitsandbytes' 8-bit.

They wrap with the defaults; records and edits are bit-equal to hand-written
hooks on the same quantized model; gradients are exact through weight-only
layers (those of the float model with the dequantized weights) and refused
through dynamically quantized ones (torch passes none to their input).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest
import torch
import transformers
from torch import Tensor, nn

from scio_recorder import Recorder
from scio_recorder._net.quantized import _passes_no_gradient, gradient_cuts
from scio_recorder.data import train_classifier
from scio_recorder.explain import attribution_patch
from scio_recorder.explain import grad_cam as cam
from scio_recorder.ood import NAC, ODIN, AdaScale, Mahalanobis

quantization = pytest.importorskip("torchao.quantization")

IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
DOWN = "model.layers.0.mlp.down_proj"
BLOCK = "model.layers.1"


def llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


def quantized(kind: str) -> nn.Module:
    model = llama()
    config = {
        "weight-only": quantization.Int8WeightOnlyConfig,
        "dynamic": quantization.Int8DynamicActivationInt8WeightConfig,
    }[kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's notes on its kernels
        quantization.quantize_(model, config)
    return model


def hand(model: nn.Module, names: list[str], **hooks) -> tuple[dict, Tensor]:
    """Records by hand-written forward hooks; ``hooks``: name -> an edit."""
    kept: dict[str, Tensor] = {}
    handles = [
        model.get_submodule(n).register_forward_hook(
            lambda _m, _i, o, n=n: kept.setdefault(n, o)
        )
        for n in names
    ]
    handles += [
        model.get_submodule(n.replace("__", ".")).register_forward_hook(
            lambda _m, _i, o, edit=edit: edit(o)
        )
        for n, edit in hooks.items()
    ]
    try:
        with torch.no_grad():
            logits = model(input_ids=IDS).logits
    finally:
        for handle in handles:
            handle.remove()
    return kept, logits


def twice(t: Tensor) -> Tensor:
    return 2 * t


@pytest.mark.parametrize(
    "kind", [pytest.param("weight-only", marks=pytest.mark.slow), "dynamic"]
)
def test_torchao_int8_models_wrap_record_and_edit_as_hand_hooks(kind):
    """Records and an edited pass, bit for bit (the same quantized computation)."""
    model = quantized(kind)
    assert type(model.get_submodule(DOWN).weight).__name__ == "Int8Tensor"
    records_and_edits_match_hand_hooks(model)


def records_and_edits_match_hand_hooks(model: nn.Module) -> None:
    """Records and an edited pass, against hand-written hooks, bit for bit."""
    rnet = Recorder(model, input_data={"input_ids": IDS})
    rnet.record(DOWN, BLOCK)
    with torch.no_grad():
        logits = rnet(input_ids=IDS).logits
    records = {name: rnet.activations_of(name)[0] for name in (DOWN, BLOCK)}
    with torch.no_grad():
        edited = rnet(input_ids=IDS, activation_postproc={DOWN: twice}).logits
    kept, want = hand(model, [DOWN, BLOCK])
    # the same tensors, computed once on the same path: bit for bit
    assert torch.equal(logits, want)
    for name in (DOWN, BLOCK):
        torch.testing.assert_close(records[name], kept[name], rtol=0, atol=0)
    _, want_edited = hand(model, [], **{DOWN.replace(".", "__"): twice})
    assert torch.equal(edited, want_edited)
    assert not torch.equal(edited, logits)


def dequantized(model: nn.Module) -> nn.Module:
    """The float model whose linear weights are the int8 weights, dequantized."""
    float_model = llama()
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if module is not model else None
        if type(weight).__name__ == "Int8Tensor":
            target = float_model.get_submodule(name)
            with torch.no_grad():
                target.weight.copy_(weight.dequantize())
    return float_model


# The weight-only kernel computes (x @ W_int8) * scale, the float model
# x @ (W_int8 * scale): the same products rounded in another order, a few
# float32 roundings per dot product of K <= 128 terms, carried through the
# layers after (2 blocks of 7 products, the unembedding: L = 15) and once
# more by the backward. Bound: 2 * 2 * L * K * eps32 relative to the largest
# magnitude (9e-4; a few 1e-7 seen); a gradient that missed a path through a
# layer would be off by order 1.
TOL = 2 * 2 * 15 * 128 * torch.finfo(torch.float32).eps


def close(got: Tensor, want: Tensor) -> None:
    scale = max(float(want.abs().max()), 1.0)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL * scale)


def test_weight_only_gradients_are_those_of_the_dequantized_float_model():
    """Gradients to the input and at a layer equal the dequantized model's."""
    model = quantized("weight-only")
    assert gradient_cuts(model) == []
    reference = dequantized(model)
    rnet = Recorder(model, input_data={"input_ids": IDS})
    rnet.record(grads=[DOWN])
    embeds = model.model.embed_tokens(IDS).detach().requires_grad_()
    rnet(inputs_embeds=embeds).logits.square().sum().backward()
    grad_at_down = rnet.gradients_of(DOWN)[0]

    kept = {}

    def keep_grad(_module: nn.Module, _inputs: object, output: Tensor) -> None:
        output.register_hook(lambda grad: kept.setdefault("g", grad))

    plain = reference.model.embed_tokens(IDS).detach().requires_grad_()
    handle = reference.get_submodule(DOWN).register_forward_hook(keep_grad)
    reference(inputs_embeds=plain).logits.square().sum().backward()
    handle.remove()
    close(grad_at_down, kept["g"])
    close(embeds.grad, plain.grad)
    assert float(embeds.grad.abs().max()) > 0


def refusal(who: str, cuts: list[str]) -> str:
    """The whole message of a refused gradient: the layers and the fix."""
    named = ", ".join(f"`{name}`" for name in cuts[:3])
    more = f" and {len(cuts) - 3} more" if len(cuts) > 3 else ""
    return (
        f"{who} takes gradients through the net, but {len(cuts)} of its layers "
        f"({named}{more}) quantize their input to int8 (torchao's dynamic "
        "activation quantization), and torch passes no gradient through that "
        "rounding: every gradient before them would silently miss their "
        "paths. Use the float model, or one quantized weight-only "
        "(`Int8WeightOnlyConfig`), whose input gradients are exact."
    )


def test_gradients_through_dynamically_quantized_layers_are_refused():
    """torch passes no gradient to their input: refused, naming the layers."""
    model = quantized("dynamic")
    cuts = gradient_cuts(model)
    assert cuts[:3] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
    ]
    assert len(cuts) == 2 * 7 + 1  # 7 linear layers a block, and the unembedding
    rnet = Recorder(model, input_data={"input_ids": IDS})
    msg = refusal("`record(grads=...)`", cuts)
    assert "`model.layers.0.self_attn.v_proj` and 12 more)" in msg
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(BLOCK, grads=[BLOCK])
    assert rnet.recording == ()  # a refused request changes nothing
    # why: a quantized layer's output depends on its input, yet carries no
    # gradient back to it
    x = torch.randn(2, 8, 128, requires_grad=True)
    layer = model.get_submodule(DOWN)
    out = layer(x)
    assert not torch.equal(out, layer(2 * x))
    assert not out.requires_grad


class Residual(nn.Module):
    """``a``, then a skip connection around ``b``: h + b(h)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        return h + self.b(h)


def test_gradients_selected_before_quantization_are_refused_at_the_pass():
    """Selected while float, quantized after: each gradient pass refuses.

    Before, the gradient of ``a`` was the skip path's alone (the identity's:
    all ones for a sum), with no error. The oracle: the float net's gradient
    of ``a`` by a hand-written tensor hook, which differs from that.
    """
    torch.manual_seed(0)
    net = Residual()
    x = torch.randn(2, 32)
    kept = {}

    def keep_grad(_module: nn.Module, _inputs: object, output: Tensor) -> None:
        output.register_hook(lambda grad: kept.setdefault("a", grad))

    handle = net.a.register_forward_hook(keep_grad)
    net(x).sum().backward()
    handle.remove()
    assert not torch.equal(kept["a"], torch.ones(2, 32))  # the float gradient
    rnet = Recorder(net, input_size=(2, 32))
    rnet.record("a", grads="a")  # float: accepted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's notes on its kernels
        quantization.quantize_(
            net, quantization.Int8DynamicActivationInt8WeightConfig()
        )
    who = "A pass that captures the gradients of `record(grads=...)`"
    with pytest.raises(ValueError, match=f"^{re.escape(refusal(who, ['a', 'b']))}$"):
        rnet(x)
    assert rnet.activations == {}  # the refused pass kept nothing
    with torch.no_grad():  # a pass that takes no gradient records as before
        out = rnet(x)
    assert torch.equal(rnet.activations_of("a")[0], net.a(x))
    assert out.shape == (2, 32)


def test_attribution_patch_refuses_instead_of_dropping_the_quantized_paths():
    """Before: zeros where the float model has values (the finding); now refused.

    The float model's estimate at a corrupted position is not zero: the
    gradient flows through the attention and MLP layers after the block,
    which the quantized layers cut.
    """
    clean = {"input_ids": IDS[:1]}
    corrupted = {"input_ids": IDS[:1].clone()}
    corrupted["input_ids"][0, 3] = 7

    def metric(out: Any) -> Tensor:
        return out.logits[0, -1, 5] - out.logits[0, -1, 9]

    float_rnet = Recorder(llama(), input_data=clean)
    estimate = attribution_patch(
        float_rnet, clean, corrupted, ["model.layers.0"], metric
    )
    assert float(estimate[0, 3].abs()) > 0
    model = quantized("dynamic")
    rnet = Recorder(model, input_data=clean)
    msg = refusal("attribution_patch", gradient_cuts(model))
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        attribution_patch(rnet, clean, corrupted, ["model.layers.0"], metric)
    assert rnet.recording == ()


DYNAMIC = {
    "int8": "Int8DynamicActivationInt8WeightConfig",
    "intx": "Int8DynamicActivationIntxWeightConfig",  # its weights: another class
}


def small_cnn(dynamic: str = "int8") -> nn.Module:
    """A classifier whose two last layers torchao quantizes dynamically."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),  # 32 features: Intx's groups of 32
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 3),
    ).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's notes on its kernels
        quantization.quantize_(net, getattr(quantization, DYNAMIC[dynamic])())
    return net


IMAGES = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
LABELS = torch.tensor([0, 1, 2, 0, 1, 2])


def grad_cam(rnet: Recorder) -> object:
    return cam(rnet, IMAGES, "0")


def odin(rnet: Recorder) -> object:
    return ODIN(rnet)(IMAGES)


def mahalanobis_preprocessing(rnet: Recorder) -> object:
    detector = Mahalanobis(rnet, layer="5", epsilon=0.01)
    detector.fit([(IMAGES, LABELS)], input=0, target=1)  # no gradient: fitted
    return detector(IMAGES)


def nac_fit(rnet: Recorder) -> object:
    detector = NAC(rnet, ["5"])
    try:
        return detector.fit([(IMAGES, LABELS)])
    finally:
        assert detector.counts == []  # the refused fit changed nothing


def adascale_fit(rnet: Recorder) -> object:
    return AdaScale(rnet, "5").fit([(IMAGES, LABELS)])


@pytest.mark.parametrize(
    ("who", "run"),
    [
        ("`record(grads=...)`", lambda rnet: rnet.record(grads="0")),
        ("grad_cam", grad_cam),
        ("ODIN", odin),  # the detectors' shared pass (`run_pass(grad=True)`)
        ("Mahalanobis", mahalanobis_preprocessing),  # `gradient_step`
        ("NAC", nac_fit),  # a fit's own gradient loop
        ("AdaScale", adascale_fit),
        (
            "train_classifier",
            lambda rnet: train_classifier(rnet.net, IMAGES, LABELS, epochs=1),
        ),
    ],
    ids=["record", "grad_cam", "ODIN", "gradient_step", "NAC", "AdaScale", "train"],
)
@pytest.mark.parametrize(
    "dynamic", ["int8", pytest.param("intx", marks=pytest.mark.slow)]
)
def test_every_gradient_path_refuses_with_the_same_message(who, run, dynamic):
    """Explanations and detectors that differentiate the net: one check, one message.

    For each of torchao's dynamic int8 configurations (whose weights are of
    other classes, saying it by other attributes).
    """
    net = small_cnn(dynamic)
    cuts = gradient_cuts(net)
    assert cuts == ["4", "6"]
    rnet = Recorder(net, input_size=(1, 3, 8, 8))
    with pytest.raises(ValueError, match=f"^{re.escape(refusal(who, cuts))}$"):
        run(rnet)


@pytest.mark.parametrize(
    ("config", "cuts"),
    [
        ("Int8DynamicActivationInt8WeightConfig", True),
        ("Int8DynamicActivationIntxWeightConfig", True),
        ("Int8WeightOnlyConfig", False),
        ("IntxWeightOnlyConfig", False),
    ],
)
def test_a_torchao_layer_is_asked_whether_a_gradient_reaches_its_input(config, cuts):
    """Whatever attribute its weight carries: the layer's own answer.

    The oracle: the dequantized float layer's input gradient, which a layer
    that passes one equals (weight-only), and which one that cuts it lacks.
    """
    torch.manual_seed(0)
    layer = nn.Linear(32, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's notes on its kernels
        quantization.quantize_(layer, getattr(quantization, config)())
    rng = torch.get_rng_state()
    assert _passes_no_gradient(layer, layer.weight) is cuts  # the marks not read
    assert torch.equal(torch.get_rng_state(), rng)  # asked without a random draw
    x = torch.randn(4, 32, requires_grad=True)
    out = layer(x)
    if cuts:
        assert not out.requires_grad or x.grad is None
        assert gradient_cuts(nn.Sequential(layer)) == ["0"]
        return
    out.square().sum().backward()
    float_layer = nn.Linear(32, 8)
    with torch.no_grad():
        float_layer.weight.copy_(layer.weight.dequantize())
        float_layer.bias.copy_(layer.bias)
    plain = x.detach().clone().requires_grad_()
    float_layer(plain).square().sum().backward()
    # the same dequantized weights, computed by other kernels: float32 rounding
    # of sums of 32 products of magnitude ~1, a few ulps of the largest
    scale = float(plain.grad.abs().max())
    torch.testing.assert_close(x.grad, plain.grad, rtol=1e-5, atol=1e-5 * scale)
    assert gradient_cuts(nn.Sequential(layer)) == []


@pytest.mark.slow
def test_bitsandbytes_8bit_model_on_the_cpu_wraps_records_and_edits(tmp_path):
    """transformers' `load_in_8bit` on the CPU: records and edits as hand hooks."""
    pytest.importorskip("bitsandbytes")
    llama().save_pretrained(tmp_path / "llama")
    config = transformers.BitsAndBytesConfig(load_in_8bit=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitsandbytes' notes on casts
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / "llama", quantization_config=config, device_map="cpu"
        ).eval()
        assert model.get_submodule(DOWN).weight.dtype == torch.int8
        records_and_edits_match_hand_hooks(model)
