"""The seven jobs of ``docs/transformers.md``, against hand-written oracles.

GPT-2 and Llama (grouped-query attention: 4 query heads, 2 key/value heads)
built from tiny configs (no download), eager attention. Every reference is
computed on the bare model with ``register_forward_hook``,
``register_forward_pre_hook`` and :func:`torch.autograd.grad`, never through
the recorder. Where both sides run the same float32 operations on the same
tensors in the same order, they are compared bit for bit (``torch.equal``).
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import transformers
from torch import nn

from scio_recorder import CallPlanError, Recorder
from scio_recorder.explain import logit_lens, patch_sweep
from scio_recorder.heads import head_count, zero_heads

B, T, VOCAB = 2, 6, 100
GOOD, BAD = 7, 11  # the tokens whose logit difference is the patching metric


def gpt2() -> nn.Module:
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
    return transformers.GPT2LMHeadModel(config)


def llama() -> nn.Module:
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
    return transformers.LlamaForCausalLM(config)


# builder, block names, final norm, unembedding, attention output projection
MODELS = {
    "gpt2": (
        gpt2,
        ["transformer.h.0", "transformer.h.1"],
        "transformer.ln_f",
        "lm_head",
        "transformer.h.0.attn.c_proj",
    ),
    "llama": (
        llama,
        ["model.layers.0", "model.layers.1"],
        "model.norm",
        "lm_head",
        "model.layers.0.self_attn.o_proj",
    ),
}


def tokens(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(1, VOCAB, (B, T))


class LM:
    """A tiny model, its default recorder and the names of its parts."""

    def __init__(self, kind: str) -> None:
        build, self.blocks, norm, head, self.proj = MODELS[kind]
        self.kind = kind
        torch.manual_seed(0)
        self.model = build().eval()
        self.modules = dict(self.model.named_modules())
        self.norm, self.head = self.modules[norm], self.modules[head]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no refusal: a clean wrap
            self.rnet = Recorder(self.model, input_data={"input_ids": tokens()})

    def block(self, i: int) -> nn.Module:
        return self.modules[self.blocks[i]]


@pytest.fixture(scope="module", params=sorted(MODELS))
def lm(request: pytest.FixtureRequest) -> LM:
    return LM(request.param)


@contextlib.contextmanager
def hooks(*handles: torch.utils.hooks.RemovableHandle):
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def captured_outputs(modules, run):
    """Run ``run()`` with a forward hook on each module; return (result, outputs)."""
    kept: list[list[torch.Tensor]] = [[] for _ in modules]
    handles = [
        m.register_forward_hook(lambda _m, _a, out, k=k: kept[k].append(out))
        for k, m in enumerate(modules)
    ]
    with hooks(*handles):
        result = run()
    return result, kept


# -- (a) wrapping --------------------------------------------------------------


def test_default_wrap_accepts_the_model_and_fake_tensors_give_the_same_table(lm):
    """No `force_static_flow=False`; the table without compute is identical."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to real tensors would warn
        fake = Recorder(
            lm.model, input_data={"input_ids": tokens()}, reference_tensors="fake"
        )
    real = lm.rnet
    assert str(real.table) == str(fake.table)
    assert repr(real) == repr(fake)
    for a, b in zip(real.table.rows, fake.table.rows, strict=True):
        assert (a.label, a.name, a.module, a.call_index, a.end_order) == (
            b.label,
            b.name,
            b.module,
            b.call_index,
            b.end_order,
        )
        assert (a.input_size, a.output_size, a.num_params) == (
            b.input_size,
            b.output_size,
            b.num_params,
        )


# -- (b) every residual stream -------------------------------------------------


def test_caching_every_residual_stream_equals_forward_hooks(lm):
    ids = tokens(2)
    lm.rnet.record(*lm.blocks)
    with torch.no_grad():
        out = lm.rnet(input_ids=ids)
    with torch.no_grad():
        want_out, want = captured_outputs(
            [lm.block(i) for i in range(2)], lambda: lm.model(input_ids=ids)
        )
    assert torch.equal(out.logits, want_out.logits)
    for i, name in enumerate(lm.blocks):
        (got,) = lm.rnet.activations_of(name)
        assert torch.equal(got, want[i][0])  # the very same computation: bit-exact


# -- (c) logit lens ------------------------------------------------------------


def test_logit_lens_equals_norm_and_unembedding_of_hooked_streams(lm):
    ids = tokens(3)
    lens = logit_lens(lm.rnet, {"input_ids": ids}, lm.blocks)
    with torch.no_grad():
        _, streams = captured_outputs(
            [lm.block(i) for i in range(2)], lambda: lm.model(input_ids=ids)
        )
        want = torch.stack([lm.head(lm.norm(s[0])) for s in streams])
    assert lens.shape == (2, B, T, VOCAB)
    assert torch.equal(lens, want)


# -- (d) steering during generate ----------------------------------------------


def test_steering_generate_equals_a_forward_hook_at_every_step(lm):
    ids = tokens(4)[:1]
    torch.manual_seed(5)
    vector = 3 * torch.randn(lm.model.config.hidden_size)
    options = {"max_new_tokens": 5, "do_sample": False, "use_cache": True}
    options["pad_token_id"] = 0

    def add(output: torch.Tensor) -> torch.Tensor:
        return output + vector

    # the oracle: a forward hook on block 1 adds the vector, another one on
    # the model counts its forward calls, a third keeps block 0's outputs
    kept: list[torch.Tensor] = []
    steered: list[torch.Tensor] = []
    calls = [0]

    def steer(_m, _a, output):
        steered.append(output)
        return output + vector

    def count(_m, _a):
        calls[0] += 1

    with (
        hooks(
            lm.block(1).register_forward_hook(steer),
            lm.block(0).register_forward_hook(lambda _m, _a, o: kept.append(o)),
            lm.model.register_forward_pre_hook(count),
        ),
        torch.no_grad(),
    ):
        want = lm.model.generate(ids, **options)
    plain = lm.model.generate(ids, **options)
    assert not torch.equal(want, plain)  # the steering changes the tokens

    lm.rnet.record(*lm.blocks)
    got = lm.rnet.generate(ids, activation_postproc={lm.blocks[1]: add}, **options)
    assert torch.equal(got, want)
    assert len(lm.rnet.steps) == calls[0] == 5  # prefill + 4 decoded tokens
    # each step's records: taken before the edit, as the hook saw them
    labels = [
        next(row.label for row in lm.rnet.table.rows if row.name == name)
        for name in lm.blocks
    ]
    for step, block0, block1 in zip(lm.rnet.steps, kept, steered, strict=True):
        assert torch.equal(step[labels[0]], block0)
        assert torch.equal(step[labels[1]], block1)
    assert lm.rnet.activations.keys() == lm.rnet.steps[-1].keys()


class Stepper(nn.Module):
    """Calls its layer a second time from its second forward call on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.layer(x)
        return self.layer(y) if self.calls > 1 else y

    def generate(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):
            x = self(x)
        return x


def test_a_step_with_another_call_count_is_named_in_the_error():
    net = Stepper()
    rnet = Recorder(net, input_size=(1, 3), force_static_flow=False)
    net.calls = 0  # the reference pass called it once
    rnet.record("layer")
    msg = (
        r"In forward step 1 of `rnet.generate\(...\)`.*`layer`.*called at least 2 times"
    )
    with pytest.raises(CallPlanError, match=msg):
        rnet.generate(torch.ones(1, 3), 3)


# -- (e) zeroing one attention head --------------------------------------------


def test_zeroing_one_head_equals_a_pre_hook_and_differs_from_slicing_v_proj(lm):
    ids = tokens(6)
    heads = head_count(lm.rnet, lm.proj)
    config = lm.model.config
    assert heads == config.num_attention_heads if lm.kind == "llama" else 2
    size = config.hidden_size // heads  # per head, in the projection's input
    head = 1

    def zero_slice(_m, args):
        x = args[0].clone()
        x[..., head * size : (head + 1) * size] = 0
        return (x, *args[1:])

    proj = lm.modules[lm.proj]
    with hooks(proj.register_forward_pre_hook(zero_slice)), torch.no_grad():
        want = lm.model(input_ids=ids).logits
    with torch.no_grad():
        plain = lm.model(input_ids=ids).logits
        got = lm.rnet(
            input_ids=ids, input_postproc={lm.proj: zero_heads([head], heads)}
        ).logits
    assert torch.equal(got, want)
    assert not torch.equal(got, plain)
    with torch.no_grad():  # with a callable for the recorded outputs as well
        also = lm.rnet(
            input_ids=ids,
            activation_postproc=lambda _output: None,
            input_postproc={lm.proj: zero_heads([head], heads)},
        ).logits
    assert torch.equal(also, want)
    if lm.kind != "llama":
        return
    # Grouped-query attention: 4 query heads share 2 key/value heads, query
    # heads 2g and 2g + 1 reading value head g (`repeat_kv`). Zeroing value
    # head g's slice of v_proj's output zeroes the output of *both* query
    # heads of its group, not of head 1 alone: it equals zero_heads([0, 1]),
    # and differs from zeroing head 1 at o_proj's input, where each query
    # head has a slice of its own.
    kv_heads = config.num_key_value_heads
    group = head // (heads // kv_heads)

    def zero_value(_m, _a, output):
        output = output.clone()
        output[..., group * size : (group + 1) * size] = 0
        return output

    v_proj = lm.modules[lm.proj.replace("o_proj", "v_proj")]
    with hooks(v_proj.register_forward_hook(zero_value)), torch.no_grad():
        sliced_v = lm.model(input_ids=ids).logits
    with torch.no_grad():
        both = lm.rnet(
            input_ids=ids, input_postproc={lm.proj: zero_heads([0, 1], heads)}
        )
    assert not torch.allclose(sliced_v, got)
    assert group == 0  # head 1 shares value head 0 with head 0
    # the zeroed values make those heads' outputs exactly 0 (weights @ 0),
    # the rest is the same computation: the same logits up to the order of
    # float32 sums in o_proj (exact on this CPU; 1e-6 absolute covers a few
    # ulps of logits of magnitude ~1)
    torch.testing.assert_close(sliced_v, both.logits, rtol=0, atol=1e-6)


# -- (f) gradients at every block ----------------------------------------------


def test_gradients_at_every_block_equal_autograd_and_no_grad_records_none(lm):
    ids = tokens(7)
    lm.rnet.record(grads=lm.blocks)
    lm.rnet(input_ids=ids, labels=ids).loss.backward()
    lm.model.zero_grad(set_to_none=True)
    out, streams = captured_outputs(
        [lm.block(i) for i in range(2)], lambda: lm.model(input_ids=ids, labels=ids)
    )
    want = torch.autograd.grad(out.loss, [s[0] for s in streams])
    for name, grad in zip(lm.blocks, want, strict=True):
        (got,) = lm.rnet.gradients_of(name)
        # the same graph, differentiated by the same engine: bit-exact
        assert torch.equal(got, grad)
    with torch.no_grad():
        lm.rnet(input_ids=ids)  # the same selection: no error, no gradient
    assert dict(lm.rnet.gradients) == {}
    # the labels were recorded, without autograd: the error says so
    with pytest.raises(KeyError, match=r"were not captured: .* without autograd"):
        lm.rnet.gradients_of(lm.blocks[0])


# -- (g) inputs ----------------------------------------------------------------


def test_inputs_of_equals_pre_hook_captures(lm):
    ids = tokens(8)
    chosen = [lm.proj, lm.blocks[1]]
    lm.rnet.record(inputs=chosen)
    with torch.no_grad():
        lm.rnet(input_ids=ids)
    kept = []
    handles = [
        lm.modules[name].register_forward_pre_hook(
            lambda _m, args, kwargs: kept.append((args, kwargs)), with_kwargs=True
        )
        for name in chosen
    ]
    with hooks(*handles), torch.no_grad():
        lm.model(input_ids=ids)
    for name, (args, kwargs) in zip(chosen, kept, strict=True):
        (got,) = lm.rnet.inputs_of(name)
        assert len(got.args) == len(args)
        assert sorted(got.kwargs) == sorted(kwargs)
        pairs = [*zip(got.args, args, strict=True)]
        pairs += [(got.kwargs[key], value) for key, value in kwargs.items()]
        for a, b in pairs:
            assert type(a) is type(b)
            if isinstance(b, torch.Tensor):  # a KV cache is a new object per run
                assert torch.equal(a, b)
        assert isinstance(got.args[0], torch.Tensor)


# -- (h) the activation-patching grid ------------------------------------------


def logit_diff(out) -> torch.Tensor:
    logits = out.logits[:, -1]
    return (logits[:, GOOD] - logits[:, BAD]).mean()


def test_patch_sweep_equals_a_loop_of_hooked_runs(lm):
    clean = tokens(9)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % VOCAB
    with torch.no_grad():
        _, streams = captured_outputs(
            [lm.block(i) for i in range(2)], lambda: lm.model(input_ids=clean)
        )
    want = torch.empty(2, T)
    for i in range(2):
        for p in range(T):

            def put(_m, _a, output, i=i, p=p):
                output = output.clone()
                output[:, p] = streams[i][0][:, p]
                return output

            with hooks(lm.block(i).register_forward_hook(put)), torch.no_grad():
                want[i, p] = logit_diff(lm.model(input_ids=corrupted))
    passes = [0]

    def count(_m, _a):
        passes[0] += 1

    with hooks(lm.model.register_forward_pre_hook(count)):
        got = patch_sweep(
            lm.rnet,
            {"input_ids": clean},
            {"input_ids": corrupted},
            lm.blocks,
            logit_diff,
        )
    # the clean run, the corrupted run (every block's output kept), then one
    # pass per row of the grid, the blocks before the patch answered
    assert passes[0] == 2 + 2
    # A row's pass runs the same float32 ops on [T * B, T, D] rows instead
    # of [B, T, D]: matmul kernels may block the sums over the hidden size
    # (32 to 64 terms) differently, a few ulps (eps = 1.2e-7 relative) per
    # product, carried through ~15 ops of 2 blocks to logit differences of
    # magnitude ~1: 1e-5 absolute bounds that with room, while a wrong cell
    # (another position patched) differs by > 1e-2.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (want[:, 2] - want[:, 0]).abs().max() > 1e-2  # the grid has signal
