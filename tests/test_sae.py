"""scio_recorder.sae: the SAE module, SAELens's format, splicing and edits.

Oracles: the formulas written out with torch operations (the same float32
operations in the same order as the module, so equal bit for bit), and
hand-written forward hooks on the same GPT-2 returning ``sae(x)`` (or the
latents edited by hand, decoded): a splice runs the same operations on
the same tensors, so the logits must be equal, not close. Where the splice
computes another expression of the same value (the error term kept with an
edit), the tolerance is derived from float32 in a comment. The parity with
SAELens itself is in ``tests/test_sae_saelens.py``.
"""

from __future__ import annotations

import json
import re

import pytest
import safetensors.torch
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.sae import (
    SparseAutoencoder,
    clamp,
    load_saelens,
    scale,
    set_to,
    splice,
    zero,
)

EPS32 = torch.finfo(torch.float32).eps
VOCAB, D = 50, 16
BLOCK = "transformer.h.0"


def gpt2(layers: int = 2) -> nn.Module:
    """A small GPT-2 language model from a config (random weights), in eval mode."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=D,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def lm() -> tuple[nn.Module, Recorder, torch.Tensor]:
    model = gpt2()
    ids = torch.randint(1, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    return model, Recorder(model, input_data={"input_ids": ids}), ids


def random_sae(
    activation="relu",
    d_in=D,
    d_sae=64,
    seed=0,
    *,
    gain=1.0,
    bias=0.1,
    shift=0.0,
    **options,
):
    """An SAE whose latents are neither all zero nor all firing.

    ``W_enc`` is ``gain / sqrt(d_in)`` times a normal draw, ``b_enc`` ``bias``
    times one plus ``shift`` (``shift < 0``: fewer latents fire).
    """
    g = torch.Generator().manual_seed(seed)
    d_out = options.pop("d_out", d_in)
    state = {
        "W_enc": torch.randn(d_in, d_sae, generator=g) * gain / d_in**0.5,
        "b_enc": torch.randn(d_sae, generator=g) * bias + shift,
        "W_dec": torch.randn(d_sae, d_out, generator=g) / d_sae**0.5,
        "b_dec": torch.randn(d_out, generator=g) * 0.1,
    }
    if activation == "jumprelu":
        options["threshold"] = torch.rand(d_sae, generator=g) * 0.3
    if activation == "topk":
        options.setdefault("k", 8)
    return SparseAutoencoder.from_state(**state, activation=activation, **options)


# -- the module --------------------------------------------------------------


@pytest.mark.parametrize("apply_b_dec", [False, True])
@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu"])
def test_encode_and_decode_are_the_formulas(activation, apply_b_dec):
    """encode is act((x - b_dec?) @ W_enc + b_enc), decode f @ W_dec + b_dec."""
    sae = random_sae(activation, apply_b_dec_to_input=apply_b_dec)
    x = torch.randn(4, 5, D, generator=torch.Generator().manual_seed(2)) * 2
    with torch.no_grad():
        sae_in = x - sae.b_dec if apply_b_dec else x
        pre = sae_in @ sae.W_enc + sae.b_enc
        if activation == "relu":
            expected = pre.relu()
        elif activation == "jumprelu":
            expected = pre.relu() * (pre > sae.threshold).float()
        else:
            values, indices = pre.topk(8, dim=-1, sorted=False)
            expected = torch.zeros_like(pre).scatter(-1, indices, values.relu())
        latents = sae.encode(x)
        assert torch.equal(latents, expected)
        assert torch.equal(sae.decode(latents), latents @ sae.W_dec + sae.b_dec)
        assert torch.equal(sae(x), sae.decode(latents))
    assert 0 < float((latents != 0).float().mean()) < 1


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 12),
    st.integers(2, 40),
    st.data(),
)
def test_activations_keep_what_they_promise(rows, d_in, d_sae, data):
    """Top-k keeps the k largest (ReLU'd), JumpReLU what is above its threshold."""
    k = data.draw(st.integers(1, d_sae))
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d_in, generator=g)
    topk = random_sae("topk", d_in=d_in, d_sae=d_sae, seed=seed, k=k)
    jump = random_sae("jumprelu", d_in=d_in, d_sae=d_sae, seed=seed)
    with torch.no_grad():
        pre = topk.pre_activations(x)
        f = topk.encode(x)
        assert int((f != 0).sum(-1).max()) <= k
        kept = pre.topk(k, dim=-1).values[:, -1:]
        assert bool(((f == 0) | (pre >= kept)).all())  # only the k largest
        assert bool(((f == 0) | (f == pre)).all())  # at their value
        assert bool(((f != 0) == ((pre >= kept) & (pre > 0))).all())
        pre = jump.pre_activations(x)
        f = jump.encode(x)
        fires = (pre > jump.threshold) & (pre > 0)
        assert torch.equal(f != 0, fires)
        assert torch.equal(f[fires], pre[fires])


def test_low_precision_weights_give_float32_activations():
    """bfloat16 weights: the product in bfloat16, bias and activation in float32."""
    sae = random_sae("jumprelu").to(torch.bfloat16)
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        latents = sae.encode(x)
        pre = (x.to(torch.bfloat16) @ sae.W_enc).float() + sae.b_enc.float()
        expected = pre.relu() * (pre > sae.threshold.float()).float()
        out = sae.decode(latents)
    assert sae.W_enc.dtype == torch.bfloat16
    assert sae.compute_dtype == torch.float32
    assert latents.dtype == torch.float32
    assert torch.equal(latents, expected)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, latents.to(torch.bfloat16) @ sae.W_dec + sae.b_dec)


def test_normalising_saes_map_the_output_back_with_the_input():
    """constant_norm_rescale and layer_norm: decode needs the input, and uses it."""
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(4)) * 7
    rescale = random_sae(normalize="constant_norm_rescale")
    layer = random_sae(normalize="layer_norm")
    with torch.no_grad():
        coeff = D**0.5 / x.norm(dim=-1, keepdim=True)
        f = rescale.encode(x)
        assert torch.equal(f, ((x * coeff) @ rescale.W_enc + rescale.b_enc).relu())
        expected = (f @ rescale.W_dec + rescale.b_dec) / coeff
        assert torch.equal(rescale.decode(f, x=x), expected)
        mu = x.mean(-1, keepdim=True)
        std = (x - mu).std(-1, keepdim=True)
        f = layer.encode(x)
        z = (x - mu) / (std + 1e-5)
        assert torch.equal(f, (z @ layer.W_enc + layer.b_enc).relu())
        expected = (f @ layer.W_dec + layer.b_dec) * std + mu
        assert torch.equal(layer.decode(f, x=x), expected)
    with pytest.raises(ValueError, match=r"call `decode\(latents, x=x\)` with"):
        layer.decode(f)


def test_the_state_dict_is_saelens_s():
    """Parameter names and shapes are SAELens's, so its state dicts load as they are."""
    sae = SparseAutoencoder(6, 10, activation="jumprelu", d_out=4, skip=True)
    shapes = {name: list(p.shape) for name, p in sae.state_dict().items()}
    assert shapes == {
        "W_enc": [6, 10],
        "b_enc": [10],
        "W_dec": [10, 4],
        "b_dec": [4],
        "threshold": [10],
        "W_skip": [4, 6],
    }
    assert sae.transcoder
    copy = random_sae("jumprelu", d_in=6, d_sae=10, d_out=4, W_skip=torch.ones(4, 6))
    sae.load_state_dict(copy.state_dict())
    x = torch.randn(3, 6)
    assert torch.equal(sae(x), copy(x))


def test_from_state_copies_and_checks_the_tensors():
    """from_state copies the tensors, and names what does not fit."""
    w = torch.randn(4, 6)
    sae = SparseAutoencoder.from_state(
        W_enc=w, b_enc=torch.zeros(6), W_dec=w.T, b_dec=torch.zeros(4)
    )
    w.zero_()
    assert bool(sae.W_enc.abs().sum() > 0)
    assert sae.W_dec.is_contiguous()
    bad = {"W_enc": w, "b_enc": torch.zeros(6), "W_dec": w, "b_dec": torch.zeros(4)}
    msg = (
        "`W_dec` has shape [4, 6], but `W_enc` [4, 6] and `W_dec` [4, 6] make it "
        "[6, 6] (W_enc is [d_in, d_sae], W_dec [d_sae, d_out], as in SAELens: "
        "pass a transposed matrix as `.T`)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        SparseAutoencoder.from_state(**bad)
    good = {**bad, "W_dec": w.T}
    with pytest.raises(ValueError, match=r"^A top-k SAE needs `k`, an int from 1"):
        SparseAutoencoder.from_state(**good, activation="topk")
    with pytest.raises(ValueError, match=r"^`k=3` is for `activation='topk'`"):
        SparseAutoencoder.from_state(**good, k=3)
    with pytest.raises(ValueError, match=r"^A JumpReLU SAE needs `threshold`"):
        SparseAutoencoder.from_state(**good, activation="jumprelu")
    with pytest.raises(
        ValueError, match=r"^`threshold` is for `activation='jumprelu'`"
    ):
        SparseAutoencoder.from_state(**good, threshold=0.1)
    with pytest.raises(ValueError, match=r"^`apply_b_dec_to_input=True` subtracts"):
        SparseAutoencoder.from_state(**good, apply_b_dec_to_input=True, transcoder=True)
    with pytest.raises(ValueError, match=r"^`activation` must be one of 'relu'"):
        SparseAutoencoder.from_state(**good, activation="gated")
    with pytest.raises(ValueError, match=r"^This SAE reads vectors of size d_in = 4"):
        sae.encode(torch.zeros(2, 5))


def _weights(d_in=4, d_sae=6):
    w = torch.randn(d_in, d_sae)
    return {
        "W_enc": w,
        "b_enc": torch.zeros(d_sae),
        "W_dec": w.T,
        "b_dec": torch.zeros(d_in),
    }


@pytest.mark.parametrize(
    ("name", "bad", "shown"),
    [
        ("W_enc", float("nan"), "nan"),
        ("b_enc", float("inf"), "inf"),
        ("W_dec", float("-inf"), "-inf"),
        ("b_dec", float("nan"), "nan"),
        ("threshold", float("nan"), "nan"),
        ("W_skip", float("inf"), "inf"),
    ],
)
def test_from_state_refuses_a_non_finite_weight_naming_the_tensor(name, bad, shown):
    # Accepted: every latent was NaN.
    tensors = _weights()
    extra = {"threshold": torch.zeros(6), "W_skip": torch.zeros(4, 4)}
    tensors.update({key: value for key, value in extra.items() if key == name})
    tensors[name] = tensors[name].clone()
    where = [1] * tensors[name].dim()
    tensors[name][tuple(where)] = bad
    activation = "jumprelu" if name == "threshold" else "relu"
    msg = (
        f"`{name}` has 1 non-finite value (the first, at {where}, is {shown}): "
        "every latent it reaches would be NaN: pass finite weights."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        SparseAutoencoder.from_state(**tensors, activation=activation)


def test_from_state_refuses_weights_that_overflow_the_dtype():
    tensors = _weights()
    tensors["W_dec"] = tensors["W_dec"].clone()
    tensors["W_dec"][2, 3] = 1e6  # finite in float32, above float16's 65504
    tensors["W_dec"][4, 0] = -1e6
    msg = (
        "`W_dec` has 2 non-finite values (the first, at [2, 3], is inf): its "
        "finite values overflow torch.float16: choose a wider `dtype`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        SparseAutoencoder.from_state(**tensors, dtype=torch.float16)


def test_from_state_names_integer_weights_and_their_dtype():
    # torch's "Only Tensors of floating point ... can require gradients".
    tensors = {name: value.round().long() for name, value in _weights().items()}
    msg = (
        "`W_enc` has dtype torch.int64, but an SAE's weights are floating point: "
        "pass floating-point tensors (`W_enc.float()`), or choose the parameters' "
        "dtype with `dtype=torch.float32`."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        SparseAutoencoder.from_state(**tensors)
    sae = SparseAutoencoder.from_state(**tensors, dtype=torch.float32)  # as it says
    assert torch.equal(sae.W_enc, tensors["W_enc"].float())
    msg = (
        "`dtype` must be a floating-point torch.dtype (an SAE's parameters are "
        "trained), got torch.int32."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        SparseAutoencoder.from_state(**_weights(), dtype=torch.int32)
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        SparseAutoencoder(4, 6, dtype=torch.int32)


# -- SAELens's format (the parity with SAELens: test_sae_saelens.py) ------------


def save_saelens(folder, config, state):
    folder.mkdir()
    (folder / "cfg.json").write_text(json.dumps(config))
    safetensors.torch.save_file(state, str(folder / "sae_weights.safetensors"))


def test_load_saelens_reads_configs_of_every_age(tmp_path):
    """Configs of SAELens 6 and from before 6 are read as SAELens reads them."""
    sae = random_sae("topk", k=5)
    state = {k: v.detach() for k, v in sae.state_dict().items()}
    save_saelens(
        tmp_path / "v6",
        {"architecture": "topk", "k": 5, "d_in": D, "d_sae": 64, "dtype": "float32"},
        state,
    )
    old = {
        "d_in": D,
        "d_sae": 64,
        "dtype": "torch.float32",
        "hook_point": "blocks.0.hook_resid_pre",
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": 5},
        "normalize_activations": False,
    }
    save_saelens(tmp_path / "v5", old, state)
    x = torch.randn(3, D)
    for name, apply_b_dec in (("v6", False), ("v5", True)):
        loaded = load_saelens(tmp_path / name)
        assert (loaded.activation, loaded.k) == ("topk", 5)
        assert loaded.apply_b_dec_to_input is apply_b_dec  # SAELens's defaults
        expected = SparseAutoencoder.from_state(
            **state, activation="topk", k=5, apply_b_dec_to_input=apply_b_dec
        )
        assert torch.equal(loaded.encode(x), expected.encode(x))
    assert loaded.config["hook_point"] == "blocks.0.hook_resid_pre"
    half = load_saelens(tmp_path / "v6", dtype=torch.float16)
    assert half.W_dec.dtype == torch.float16


def test_load_saelens_names_what_it_cannot_read(tmp_path):
    """A missing folder, an architecture not computed, weights that do not fit."""
    with pytest.raises(FileNotFoundError, match="is not a SAELens SAE folder"):
        load_saelens(tmp_path / "nothing")
    state = {k: v.detach() for k, v in random_sae().state_dict().items()}
    save_saelens(tmp_path / "gated", {"architecture": "gated", "d_in": D}, state)
    msg = "is a 'gated' SAE, which this reader does not compute; it reads 'standard'"
    with pytest.raises(ValueError, match=msg):
        load_saelens(tmp_path / "gated")
    save_saelens(tmp_path / "jump", {"architecture": "jumprelu", "d_in": D}, state)
    with pytest.raises(ValueError, match=r"SAE lacks \['threshold'\]"):
        load_saelens(tmp_path / "jump")
    # A top-k config without its k: a bare KeyError: 'k'.
    save_saelens(tmp_path / "topk", {"architecture": "topk", "d_in": D}, state)
    path = tmp_path / "topk" / "cfg.json"
    msg = (
        f"'{path}' is a 'topk' SAE but has no 'k' (the number of latents it "
        'keeps, which SAELens\'s top-k configs store): add it, e.g. `"k": 32`, '
        "as the SAE was trained."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        load_saelens(tmp_path / "topk")
    path.write_text(json.dumps({"architecture": "topk", "d_in": D, "k": 2.5}))
    msg = f"'{path}' has 'k' = 2.5: it must be an integer (the latents kept)."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        load_saelens(tmp_path / "topk")


# -- edits ----------------------------------------------------------------------


def test_edits_change_the_features_named():
    """zero, scale, set_to and clamp act on their features at every token."""
    f = torch.arange(12.0).reshape(2, 6)
    assert zero([1, 4])(f.clone())[:, [1, 4]].eq(0).all()
    assert torch.equal(scale(2, 0.5)(f.clone())[:, 2], f[:, 2] * 0.5)
    assert torch.equal(
        set_to(torch.tensor([0]), 9.0)(f.clone())[:, 0], torch.full((2,), 9.0)
    )
    clamped = clamp([3, 5], min=4.0, max=10.0)(f.clone())
    assert clamped[:, [3, 5]].tolist() == [[4.0, 5.0], [9.0, 10.0]]
    assert torch.equal(clamped[:, :3], f[:, :3])
    assert repr(zero(3)) == "zero([3])"
    with pytest.raises(
        IndexError, match=r"^zero\(\[6\]\) edits latent 6, but the SAE has 6 latents"
    ):
        zero(6)(f)
    with pytest.raises(TypeError, match="must be latent indices"):
        zero(1.5)
    with pytest.raises(ValueError, match="needs `min`, `max` or both"):
        clamp(1)


# -- splicing in GPT-2 --------------------------------------------------------


def hooked_logits(model, ids, fn, module=None):
    """The logits with a hand-written forward hook returning ``fn(output)``."""
    module = module or model.transformer.h[0]
    handle = module.register_forward_hook(lambda _m, _a, out: fn(out))
    try:
        with torch.no_grad():
            return model(input_ids=ids).logits
    finally:
        handle.remove()


def test_keep_error_leaves_the_logits_unchanged_and_reads_the_latents(lm):
    """keep_error=True: the logits are the unspliced model's; sp.latents its encode."""
    model, rnet, ids = lm
    sae = random_sae("topk")
    sp = splice(sae, keep_error=True)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with rnet.selecting(BLOCK):
            out = rnet(input_ids=ids, activation_postproc={BLOCK: sp}).logits
            block = rnet.activations_of(BLOCK)[0]
    assert torch.equal(out, plain)
    assert sp.latents.shape == (3, 7, 64)
    assert torch.equal(sp.latents, sae.encode(block))


def test_splicing_equals_a_hook_returning_the_reconstruction(lm):
    """Without the error term, the logits are a hook's returning sae(x)."""
    model, rnet, ids = lm
    sae = random_sae("jumprelu")
    expected = hooked_logits(model, ids, sae)
    with torch.no_grad():
        out = rnet(input_ids=ids, activation_postproc={BLOCK: splice(sae)}).logits
        plain = model(input_ids=ids).logits
    assert torch.equal(out, expected)
    assert not torch.equal(out, plain)


@pytest.mark.parametrize(
    "edit",
    [
        zero([6]),
        pytest.param(scale([4, 7], 4.0), marks=pytest.mark.slow),
        pytest.param(set_to(5, 2.5), marks=pytest.mark.slow),
        pytest.param([clamp(6, max=0.01), zero(7)], marks=pytest.mark.slow),
    ],
    ids=repr,
)
def test_an_edit_equals_a_hook_editing_the_latents_by_hand(lm, edit):
    """An edit of the latents equals a hook that edits them itself and decodes."""
    model, rnet, ids = lm
    sae = random_sae("relu")

    def by_hand(x):
        f = sae.encode(x)
        f = f.clone()
        for one in edit if isinstance(edit, list) else [edit]:
            index = list(one.features)
            if one.kind == "zero":
                f[..., index] = 0
            elif one.kind == "scale":
                f[..., index] = f[..., index] * one.value
            elif one.kind == "set_to":
                f[..., index] = one.value
            else:
                f[..., index] = torch.minimum(f[..., index], torch.tensor(one.high))
        return sae.decode(f)

    expected = hooked_logits(model, ids, by_hand)
    sp = splice(sae, edit=edit)
    with torch.no_grad():
        out = rnet(input_ids=ids, activation_postproc={BLOCK: sp}).logits
        unedited = rnet(input_ids=ids, activation_postproc={BLOCK: splice(sae)}).logits
    assert torch.equal(out, expected)
    assert not torch.equal(out, unedited)


def test_an_edit_with_the_error_kept_adds_the_change_of_the_reconstruction(lm):
    """keep_error with an edit: y + decode(edited) - decode(f), to float32 rounding."""
    model, rnet, ids = lm
    sae = random_sae("relu")
    edit = set_to([2, 9], 3.0)

    def by_hand(y):
        f = sae.encode(y)
        return y + sae.decode(edit(f.clone())) - sae.decode(f)

    expected = hooked_logits(model, ids, by_hand)
    sp = splice(sae, keep_error=True, edit=edit)
    with torch.no_grad(), rnet.selecting(BLOCK):
        out = rnet(input_ids=ids, activation_postproc={BLOCK: sp}).logits
        y = rnet.activations_of(BLOCK)[0]
        plain = model(input_ids=ids).logits
        # Tolerance. The two expressions of the block's new output differ by
        # the roundings of decode(edited), decode(f) and the sums with y: a
        # few eps32 * size per feature, size = max(|y| + 2 (|f| @ |W_dec| +
        # |b_dec|)). The rest of the model carries a change of the block's
        # output to the logits with a gain measured here: the logits' change
        # for every feature moved by +-`step` (random signs; linear at this
        # scale), divided by `step`. Bound: 8 eps32 * size * gain.
        f = sp.latents
        step = 1e-4
        signs = torch.randint(0, 2, y.shape, generator=torch.Generator().manual_seed(0))
        moved = hooked_logits(model, ids, lambda o: o + step * (2 * signs - 1))
        gain = float((moved - plain).abs().max()) / step
        size = float(
            (y.abs() + 2 * (f.abs() @ sae.W_dec.abs() + sae.b_dec.abs())).max()
        )
    bound = 8 * EPS32 * size * gain
    assert float((out - expected).abs().max()) <= bound
    assert float((out - plain).abs().max()) > 1000 * bound


def test_splicing_holds_at_every_step_of_generate(lm):
    """In generate: kept error = plain; spliced, edited = hand hooks, per step."""
    model, rnet, ids = lm
    sae = random_sae("topk")
    prompt = ids[:1]
    options = {
        "max_new_tokens": 4,
        "do_sample": False,
        "pad_token_id": 0,
        "return_dict_in_generate": True,
        "output_logits": True,
    }

    def hooked_generate(fn):
        handle = model.transformer.h[0].register_forward_hook(lambda _m, _a, o: fn(o))
        try:
            with torch.no_grad():
                return model.generate(prompt, **options)
        finally:
            handle.remove()

    with torch.no_grad():
        plain = model.generate(prompt, **options)
        sp = splice(sae, keep_error=True, keep_steps=True)
        with rnet.selecting(BLOCK):
            kept = rnet.generate(prompt, activation_postproc={BLOCK: sp}, **options)
            steps = [
                step[rnet.table.calls_of(model.transformer.h[0])[0].label]
                for step in rnet.steps
            ]
    assert torch.equal(kept.sequences, plain.sequences)
    assert all(
        torch.equal(a, b) for a, b in zip(kept.logits, plain.logits, strict=True)
    )
    assert len(sp.steps) == 4
    assert [tuple(s.shape) for s in sp.steps] == [(1, 7, 64)] + [(1, 1, 64)] * 3
    assert all(
        torch.equal(f, sae.encode(y)) for f, y in zip(sp.steps, steps, strict=True)
    )
    assert sp.latents is sp.steps[-1]

    def edited(x):
        f = sae.encode(x).clone()
        f[..., [4, 6, 7]] = 0
        return sae.decode(f)

    for fn, sp in ((sae, splice(sae)), (edited, splice(sae, edit=zero([4, 6, 7])))):
        expected = hooked_generate(fn)
        with torch.no_grad():
            got = rnet.generate(prompt, activation_postproc={BLOCK: sp}, **options)
        assert torch.equal(got.sequences, expected.sequences)
        assert all(
            torch.equal(a, b) for a, b in zip(got.logits, expected.logits, strict=True)
        )


def test_a_transcoder_reads_one_place_and_writes_another(lm):
    """A transcoder's read (an output or an input) feeds the write of the same pass."""
    model, rnet, ids = lm
    tc = random_sae("relu", transcoder=True, seed=5)
    mlp, ln = model.transformer.h[1].mlp, model.transformer.h[1].ln_2
    kept = {}
    handles = [
        ln.register_forward_hook(lambda _m, _a, out: kept.update(x=out)),
        mlp.register_forward_hook(lambda _m, _a, _out: tc(kept["x"])),
    ]
    try:
        with torch.no_grad():
            expected = model(input_ids=ids).logits
    finally:
        for handle in handles:
            handle.remove()
    mlp_name, ln_name = "transformer.h.1.mlp", "transformer.h.1.ln_2"
    with torch.no_grad():
        sp = splice(tc)
        from_output = rnet(
            input_ids=ids, activation_postproc={ln_name: sp.read, mlp_name: sp}
        ).logits
        sp2 = splice(tc)
        from_input = rnet(
            input_ids=ids,
            activation_postproc={mlp_name: sp2},
            input_postproc={mlp_name: sp2.read},
        ).logits
        plain = model(input_ids=ids).logits
        kept_error = rnet(
            input_ids=ids,
            activation_postproc={mlp_name: (sp3 := splice(tc, keep_error=True))},
            input_postproc={mlp_name: sp3.read},
        ).logits
    assert torch.equal(from_output, expected)
    assert torch.equal(from_input, expected)
    assert torch.equal(kept_error, plain)
    assert torch.equal(sp3.latents, sp2.latents)
    msg = "This transcoder's input was not read in this pass: place `sp.read`"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        rnet(input_ids=ids, activation_postproc={mlp_name: splice(tc)})


def test_splice_edits_a_tuple_s_first_tensor_and_names_wrong_layers():
    """A tuple output keeps its other items; a layer of another width is refused."""

    class Pair(nn.Module):
        def forward(self, x):
            return x * 2, x.sum()

    net = nn.Sequential(Pair())
    rnet = Recorder(net, input_size=(2, D))
    sae = random_sae()
    x = torch.randn(2, D)
    with torch.no_grad():
        out = rnet(x, activation_postproc={"0": splice(sae)})
    assert torch.equal(out[0], sae(x * 2))
    assert torch.equal(out[1], x.sum())
    narrow = random_sae(d_in=8)
    with pytest.raises(
        ValueError,
        match=r"^This SAE reads vectors of size d_in = 8, but got a tensor of shape",
    ):
        rnet(x, activation_postproc={"0": splice(narrow)})
    with pytest.raises(TypeError, match="must be a function of the latents"):
        splice(sae, edit=3)
    with pytest.raises(TypeError, match=r"`sp\.read` is where a transcoder reads"):
        splice(sae).read(x)
