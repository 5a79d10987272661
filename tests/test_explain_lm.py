"""`explain` on language models, against hand-written hooks and autograd.

GPT-2 and Llama (grouped-query attention: 4 query heads, 2 key/value heads)
from tiny configs. Every reference is written with plain forward hooks
(``register_forward_hook``) and :func:`torch.autograd.grad` on the bare
model, never through the recorder.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import CallInputs, Recorder
from scio_recorder.explain import (
    ablate,
    attribution_patch,
    cache_run,
    layer_means,
    logit_lens,
    patch,
    patch_sweep,
)

B, T, VOCAB = 2, 6, 100
GOOD, BAD = 7, 11  # the tokens whose logit difference is the metric


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
    )
    config._attn_implementation = "eager"  # HF's own switch
    config.loss_type = "ForCausalLM"
    return transformers.GPT2LMHeadModel(config)


def llama() -> nn.Module:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        initializer_range=0.2,
        attn_implementation="eager",
        loss_type="ForCausalLM",
    )
    return transformers.LlamaForCausalLM(config)


# (builder, the blocks, final norm, unembedding) by name
MODELS = {
    "gpt2": (gpt2, "transformer.h", "transformer.ln_f", "lm_head"),
    "llama": (llama, "model.layers", "model.norm", "lm_head"),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def lm(request):
    """(model, recorder, blocks, norm, unembedding) of a tiny trained-free LM."""
    build, blocks, norm, head = MODELS[request.param]
    torch.manual_seed(0)
    model = build().eval()
    ids = torch.zeros(B, T, dtype=torch.long)
    rnet = Recorder(model, input_data={"input_ids": ids}, force_static_flow=False)
    modules = dict(model.named_modules())
    return model, rnet, list(modules[blocks]), modules[norm], modules[head]


def pair():
    """A clean and a corrupted prompt differing at position 2, with a mask."""
    torch.manual_seed(1)
    clean = torch.randint(0, VOCAB, (B, T))
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % VOCAB
    mask = torch.ones(B, T, dtype=torch.long)
    return (
        transformers.BatchEncoding({"input_ids": clean, "attention_mask": mask}),
        transformers.BatchEncoding({"input_ids": corrupted, "attention_mask": mask}),
    )


def stream(output):
    return output[0] if isinstance(output, tuple) else output


def replaced(output, new):
    return (new, *output[1:]) if isinstance(output, tuple) else new


@contextlib.contextmanager
def hooked(module, hook):
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def block_outputs(model, blocks, inputs, *, grad=False):
    """Each block's output stream on ``inputs``, by forward hooks."""
    kept = []
    handles = [
        b.register_forward_hook(lambda _m, _i, o: kept.append(stream(o)))
        for b in blocks
    ]
    try:
        with torch.set_grad_enabled(grad):
            out = model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return out, kept


def logit_diff(out):
    logits = out.logits[:, -1]
    return (logits[:, GOOD] - logits[:, BAD]).mean()


def count_passes(model):
    """A forward pre-hook on the model counting its passes: (counter, handle)."""
    passes = [0]

    def count(_module, _args):
        passes[0] += 1

    return passes, model.register_forward_pre_hook(count)


def test_patch_and_ablate_take_keyword_inputs(lm):
    """A tokenizer's output reaches the model as keywords, attention mask and all."""
    model, rnet, blocks, _, _ = lm
    clean, corrupted = pair()
    _, clean_streams = block_outputs(model, blocks, clean)

    def put(position):
        def hook(_module, _args, output):
            new = stream(output).clone()
            new[:, position] = clean_streams[0][:, position]
            return replaced(output, new)

        return hook

    with hooked(blocks[0], put(2)), torch.no_grad():
        want = model(**corrupted).logits
    got = patch(rnet, clean, corrupted, (3, 1), where=(slice(None), 2))
    # the same float32 ops on the same inputs, in the same order: bit-exact
    assert torch.equal(got.logits, want)

    def zero(_module, _args, output):
        return replaced(output, torch.zeros_like(stream(output)))

    with hooked(blocks[1], zero), torch.no_grad():
        want = model(**clean).logits
    assert torch.equal(ablate(rnet, clean, (3, 2)).logits, want)
    both = CallInputs((), dict(clean))  # positional and keyword arguments
    assert torch.equal(ablate(rnet, both, (3, 2)).logits, want)
    assert rnet.recording == ()


def test_one_source_pass_serves_every_patched_call_and_patch(lm):
    model, rnet, _, _, _ = lm
    clean, corrupted = pair()
    passes, handle = count_passes(model)
    try:
        patch(rnet, clean, corrupted, [(3, 1), (3, 2)], where=(slice(None), 2))
        assert passes[0] == 2  # one source pass for both patched calls, one target
        passes[0] = 0
        cache = cache_run(rnet, clean, [(3, 1), (3, 2)])
        results = [
            patch(rnet, cache, corrupted, (3, 1 + layer), where=(slice(None), p))
            for layer in range(2)
            for p in range(T)
        ]
        assert passes[0] == 1 + 2 * T  # the loop's count: one source pass
    finally:
        handle.remove()
    direct = patch(rnet, clean, corrupted, (3, 2), where=(slice(None), 3))
    assert torch.equal(results[T + 3].logits, direct.logits)
    embedding = next(n for n, m in model.named_modules() if isinstance(m, nn.Embedding))
    msg = f"patch: the cached source run lacks layer 2-1 (Embedding `{embedding}`)"
    with pytest.raises(KeyError, match=re.escape(msg) + ".*cache_run"):
        patch(rnet, cache, corrupted, (2, 1))


def sweep_by_hand(model, blocks, clean, corrupted, positions):
    """The patching grid as a loop of single runs with a forward hook each."""
    _, clean_streams = block_outputs(model, blocks, clean)
    grid = torch.empty(len(blocks), len(positions))
    for i, block in enumerate(blocks):
        for j, position in enumerate(positions):

            def hook(_module, _args, output, i=i, position=position):
                new = stream(output).clone()
                new[:, position] = clean_streams[i][:, position]
                return replaced(output, new)

            with hooked(block, hook), torch.no_grad():
                grid[i, j] = logit_diff(model(**corrupted))
    return grid


@pytest.mark.parametrize(
    ("max_batch", "reuse_prefix"),
    [(None, True), (3 * B, True), (B, True), (None, False), (3 * B, False)],
)
def test_patch_sweep_equals_a_loop_of_hooked_runs(lm, max_batch, reuse_prefix):
    model, rnet, blocks, _, _ = lm
    clean, corrupted = pair()
    positions = range(T)
    want = sweep_by_hand(model, blocks, clean, corrupted, positions)
    passes, handle = count_passes(model)
    try:
        got = patch_sweep(
            rnet,
            clean,
            corrupted,
            [(3, 1), (3, 2)],
            logit_diff,
            positions=positions,
            max_batch=max_batch,
            reuse_prefix=reuse_prefix,
        )
    finally:
        handle.remove()
    per_pass = T if max_batch is None else max_batch // B  # cells in one pass
    if reuse_prefix:  # a clean pass, a corrupted pass, then each row's chunks
        assert passes[0] == 2 + 2 * -(-T // per_pass)
    else:  # a clean pass, then the whole grid (or its chunks)
        assert passes[0] == 1 + (1 if max_batch is None else -(-2 * T // per_pass))
    if reuse_prefix and max_batch == B:
        # One cell a pass: the blocks after the patch run the same float32
        # ops on the same [B, T, D] tensors as the hooked run (the blocks
        # before it are answered with the outputs the corrupted run computed
        # on the same rows): bit for bit.
        assert torch.equal(got, want)
    # Several cells a pass run the same float32 ops on [cells * B, T, D]
    # instead of [B, T, D]: matmul kernels may block the reduction over the
    # hidden size (32 to 128 terms) differently, so each product can differ
    # by a few ulps (eps = 1.2e-7 relative), carried through ~15 ops of 2
    # blocks to logit differences of magnitude ~2: 1e-5 absolute bounds that
    # with room (on this CPU they are equal bit for bit), while a wrong cell
    # (another position patched) differs by > 1e-2.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (want[:, 2] - want[:, 0]).abs().max() > 1e-2  # the grid has signal
    assert rnet.recording == ()


def runs_of(modules):
    """Forward pre-hooks counting the runs of each module: (counts, handles)."""
    counts = [0] * len(modules)

    def hook(k):
        def count(_module, _args):
            counts[k] += 1

        return count

    return counts, [m.register_forward_pre_hook(hook(k)) for k, m in enumerate(modules)]


def first_leaf(block):
    """A module inside ``block`` that runs once whenever the block's forward does.

    GPT-2's first norm, Llama's attention.
    """
    return next(iter(block.children()))


def test_patch_sweep_runs_only_the_blocks_after_the_patched_call(lm):
    """The blocks before the patch are answered from the corrupted run, not run."""
    model, rnet, blocks, _, head = lm
    clean, corrupted = pair()
    inner = [first_leaf(block) for block in blocks]
    counts, handles = runs_of([*inner, head])
    try:
        patch_sweep(rnet, clean, corrupted, [(3, 1), (3, 2)], logit_diff)
    finally:
        for handle in handles:
            handle.remove()
    # Block 0 runs in the clean and the corrupted passes only; block 1 there
    # and in row 0's pass (after the patch at block 0); row 1 patches the
    # last block: nothing of the stack runs. The head runs in every pass.
    assert counts == [2, 3, 4]
    assert not [name for name, m in model.named_modules() if "forward" in vars(m)]


def test_patch_sweep_inside_a_block_runs_that_block(lm):
    """A patch at a block's sub-layer runs that block, the blocks before answered."""
    model, rnet, blocks, _, _ = lm
    clean, corrupted = pair()
    inner = first_leaf(blocks[1])
    name = next(n for n, m in model.named_modules() if m is inner)
    kept = []
    with hooked(inner, lambda _m, _i, o: kept.append(o)), torch.no_grad():
        model(**clean)
    want = torch.empty(1, 2)
    for j, position in enumerate([1, 4]):

        def hook(_module, _args, output, position=position):
            new = stream(output).clone()
            new[:, position] = stream(kept[0])[:, position]
            return replaced(output, new)

        with hooked(inner, hook), torch.no_grad():
            want[0, j] = logit_diff(model(**corrupted))
    counts, handles = runs_of([first_leaf(blocks[0])])
    try:
        got = patch_sweep(
            rnet, clean, corrupted, name, logit_diff, positions=[1, 4], max_batch=B
        )
    finally:
        for handle in handles:
            handle.remove()
    assert counts == [2]  # block 0: the clean and the corrupted pass only
    assert torch.equal(got, want)  # one cell a pass: the same ops, bit for bit


def test_read_at_runs_the_unembedding_at_those_positions_only(lm):
    """The metric sees the logits at ``read_at``, in that order; the head no more."""
    _, rnet, _, _, head = lm
    clean, corrupted = pair()

    def at_5_and_2(out):  # with read_at=[5, 2]: index 0 is position 5, 1 is 2
        return out.logits[:, 0, GOOD].sum() - out.logits[:, 1, BAD].sum()

    def full(out):
        return out.logits[:, 5, GOOD].sum() - out.logits[:, 2, BAD].sum()

    want = patch_sweep(rnet, clean, corrupted, [(3, 1), (3, 2)], full)
    widths = []
    with hooked(head, lambda _m, args, _o: widths.append(args[0].shape[1])):
        got = patch_sweep(
            rnet, clean, corrupted, [(3, 1), (3, 2)], at_5_and_2, read_at=[5, -4]
        )
    assert widths == [2, 2, 2, 2]  # clean, corrupted, two rows: 2 positions each
    # The unembedding's product on 2 positions instead of 6: a GEMM of
    # another shape may block its 32-term dot products differently, a few
    # ulps (1.2e-7 relative) of logits of magnitude ~5, summed over B = 2:
    # 1e-5 absolute bounds that with room (equal bit for bit on this CPU).
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    with_lm_head = patch_sweep(
        rnet, clean, corrupted, (3, 1), at_5_and_2, read_at=[5, 2], unembed=head
    )
    torch.testing.assert_close(with_lm_head, got[:1], rtol=0, atol=1e-5)


class Blocks(nn.Module):
    """A stack of residual blocks in a ModuleList, outputs ``(stream, extra)``."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(depth))
        self.lm_head = nn.Linear(8, 10)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h, _ = block(h)
        return self.lm_head(h)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.mix = nn.Linear(8, 8)

    def forward(self, h):
        mixed = self.mix(h.cumsum(1))  # later positions read earlier ones
        return h + torch.tanh(self.fc(h) + mixed), mixed.mean()


@pytest.fixture(scope="module")
def stack():
    torch.manual_seed(0)
    net = Blocks().eval()
    return net, Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])


def test_patch_and_ablate_edit_the_stream_of_a_tuple_output(stack):
    """A block returning ``(stream, extra)`` has its stream patched or ablated."""
    net, rnet = stack
    clean, corrupted = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 2, 9, 4, 5]])
    block = net.blocks[1]
    kept = []
    with hooked(block, lambda _m, _i, o: kept.append(o)), torch.no_grad():
        net(clean)

    def put(_module, _args, output):
        new = output[0].clone()
        new[:, 2] = kept[0][0][:, 2]
        return (new, *output[1:])

    with hooked(block, put), torch.no_grad():
        want = net(corrupted)
    got = patch(rnet, clean, corrupted, "blocks.1", where=(slice(None), 2))
    assert torch.equal(got, want)  # the same ops on the same tensors

    def zero(_module, _args, output):
        return (torch.zeros_like(output[0]), *output[1:])

    with hooked(block, zero), torch.no_grad():
        want = net(corrupted)
    assert torch.equal(ablate(rnet, corrupted, "blocks.1"), want)


def test_a_net_without_a_block_stack_or_in_training_runs_every_block(stack):
    """No ModuleList, a net in training mode, ``reuse_prefix=False``: batched."""
    net, rnet = stack
    clean, corrupted = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 2, 9, 4, 5]])
    labels = ["blocks.0", "blocks.1.fc", "blocks.2"]

    def metric(out):
        return out[:, -1].sum()

    def sweep(**options):
        passes, handle = count_passes(net)
        try:
            grid = patch_sweep(rnet, clean, corrupted, labels, metric, **options)
        finally:
            handle.remove()
        return grid, passes[0]

    reused, passes = sweep()
    assert passes == 2 + 3  # clean, corrupted, one per row
    batched, passes = sweep(reuse_prefix=False)
    assert passes == 2  # clean, then the whole grid
    # one cell's batch (1 row) against 15 copies in one pass: see
    # test_patch_sweep_equals_a_loop_of_hooked_runs; magnitudes ~1
    torch.testing.assert_close(reused, batched, rtol=0, atol=1e-5)
    net.train()  # no dropout here, but a net in training mode is not reused
    try:
        in_training, passes = sweep()
    finally:
        net.eval()
    assert passes == 2
    assert torch.equal(in_training, batched)
    twice = Twice()
    trnet = Recorder(twice, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    passes, handle = count_passes(twice)
    try:
        patch_sweep(trnet, clean, corrupted, "block", metric)
    finally:
        handle.remove()
    assert passes[0] == 2  # no ModuleList: the batched grid


@settings(max_examples=20, deadline=None)
@given(
    layers=st.lists(
        st.sampled_from(
            ["embed", "blocks.0", "blocks.1.fc", "blocks.1", "blocks.2.mix", "blocks.2"]
        ),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    positions=st.lists(st.integers(-5, 4), min_size=1, max_size=5),
    cells_a_pass=st.one_of(st.none(), st.integers(1, 6)),
)
def test_reused_prefix_equals_single_patched_runs(
    stack, layers, positions, cells_a_pass
):
    """Any rows (blocks, sub-layers, before the stack), positions and chunks."""
    net, rnet = stack
    g = torch.Generator().manual_seed(len(positions))
    clean = torch.randint(0, 10, (2, 5), generator=g)
    corrupted = torch.randint(0, 10, (2, 5), generator=g)
    grid = patch_sweep(
        rnet,
        clean,
        corrupted,
        layers,
        lambda o: o[:, -1].sum(),
        positions=positions,
        max_batch=None if cells_a_pass is None else 2 * cells_a_pass,
    )
    modules = dict(net.named_modules())
    for i, layer in enumerate(layers):
        module = modules[layer]
        kept = []
        keep = hooked(module, lambda _m, _i, o, kept=kept: kept.append(stream(o)))
        with keep, torch.no_grad():
            net(clean)
        for j, p in enumerate(positions):

            def put(_module, _args, output, p=p, source=kept[0]):
                new = stream(output).clone()
                new[:, p] = source[:, p]
                return replaced(output, new)

            with hooked(module, put), torch.no_grad():
                single = net(corrupted)[:, -1].sum()
            if cells_a_pass == 1:  # the same ops on the same rows: bit for bit
                assert torch.equal(grid[i, j], single)
            # batched float32 products (see the GPT-2 sweep test): a few ulps
            torch.testing.assert_close(grid[i, j], single, rtol=0, atol=1e-5)
    assert not [n for n, m in net.named_modules() if "forward" in vars(m)]


def test_patch_sweep_refuses_a_loss_other_lengths_and_a_small_max_batch(lm):
    _, rnet, _, _, _ = lm
    clean, corrupted = pair()
    with_labels = {**corrupted, "labels": corrupted["input_ids"]}
    msg = r"patch_sweep: `metric` returned None; it must return one number"
    with pytest.raises(ValueError, match=msg):
        patch_sweep(rnet, clean, with_labels, (3, 1), lambda out: out.loss)
    shorter = {k: v[:, :-1] for k, v in corrupted.items()}
    msg = (
        r"patch_sweep: layer 3-1 \(\w+ `[\w.]+`\) outputs \[\d+, 5, 32\] on the "
        r"corrupted input and \[2, 6, 32\] on the clean one: pass inputs of the "
        r"same length"
    )
    with pytest.raises(ValueError, match=msg):
        patch_sweep(rnet, clean, shorter, (3, 1), logit_diff, positions=[0])
    msg = r"patch_sweep: `max_batch=1` is below the batch size 2 of the inputs"
    with pytest.raises(ValueError, match=msg):
        patch_sweep(rnet, clean, corrupted, (3, 1), logit_diff, max_batch=1)


def test_attribution_patch_equals_autograd_by_hand(lm):
    """(clean - corrupted) x gradient of the loss, by hooks and autograd.grad."""
    model, rnet, blocks, _, _ = lm
    clean, corrupted = pair()
    labels = corrupted["input_ids"]
    _, clean_streams = block_outputs(model, blocks, clean)
    out, acts = block_outputs(model, blocks, {**corrupted, "labels": labels}, grad=True)
    grads = torch.autograd.grad(out.loss, acts)
    want = torch.stack(
        [
            ((c - a) * g).sum((0, 2))
            for c, a, g in zip(clean_streams, acts, grads, strict=True)
        ]
    ).detach()
    model.zero_grad(set_to_none=True)
    got = attribution_patch(
        rnet,
        clean,
        {**corrupted, "labels": labels},  # `labels` reaches the model's loss
        [(3, 1), (3, 2)],
        lambda out: out.loss,
    )
    # the same ops on the same tensors, in the same order: equal up to the
    # order autograd accumulates the gradient, a few ulps of values ~1e-2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in model.parameters())
    some = attribution_patch(
        rnet, clean, corrupted, (3, 2), logit_diff, positions=[5, 2]
    )
    assert some.shape == (1, 2)


def test_logit_lens_equals_norm_and_unembedding_by_hand(lm):
    model, rnet, blocks, norm, head = lm
    clean, _ = pair()
    out, streams = block_outputs(model, blocks, clean)
    with torch.no_grad():
        want = torch.stack([head(norm(s)) for s in streams])
    got = logit_lens(rnet, clean, [(3, 1), (3, 2)])  # norm and head found
    assert torch.equal(got, want)
    assert torch.equal(got[-1], out.logits)  # the last stream: the output
    named = logit_lens(rnet, clean, (3, 1), norm=norm, unembed="lm_head")
    assert torch.equal(named[0], want[0])


def test_logit_lens_says_how_to_name_what_it_cannot_find():
    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    rnet = Recorder(net, input_data=[torch.zeros(1, 3, dtype=torch.long)])
    ids = torch.tensor([[1, 2, 3]])
    msg = (
        "logit_lens: found no norm module in Sequential (looked for "
        "transformer.ln_f, model.norm, gpt_neox.final_layer_norm, "
        "model.decoder.final_layer_norm, transformer.norm_f, ln_final, then the "
        'last *Norm called): name it, e.g. `norm="transformer.ln_f"` (a name, '
        "label or any selector of one call, or a module), or "
        "`norm=torch.nn.Identity()` for none."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        logit_lens(rnet, ids, "1")
    msg = r"logit_lens: found no unembed module in Sequential .*`unembed=\"lm_head\"`"
    with pytest.raises(ValueError, match=msg):
        logit_lens(rnet, ids, "1", norm=nn.Identity())
    lens = logit_lens(rnet, ids, "1", norm=nn.Identity(), unembed="2")
    with torch.no_grad():
        assert torch.equal(lens[0], net(ids))


def test_layer_means_of_keyword_batches(lm):
    model, rnet, blocks, _, _ = lm
    clean, corrupted = pair()
    batches = [dict(clean), dict(corrupted)]
    means = layer_means(rnet, batches, (3, 1), input=dict)  # a dict: keywords
    kept = [block_outputs(model, blocks, b)[1][0] for b in batches]
    want = torch.cat(kept).double().mean(0)
    # float32 features averaged in float64 in another order
    torch.testing.assert_close(means[(3, 1)], want, rtol=1e-12, atol=1e-12)


class Twice(nn.Module):
    """One block called twice: two calls, two labels, one module."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.block = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + torch.tanh(self.block(h))
        h = h + torch.tanh(self.block(h))
        return self.head(h)


def test_a_reused_module_is_patched_per_call():
    """Patching the block's second call leaves its first call alone."""
    torch.manual_seed(0)
    net = Twice()
    rnet = Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])
    first, second = (row.label for row in rnet.table.calls_of(net.block))
    clean, corrupted = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 2, 9, 4, 5]])

    def calls(ids):
        kept = []
        with hooked(net.block, lambda _m, _i, o: kept.append(o)), torch.no_grad():
            net(ids)
        return kept

    clean_calls = calls(clean)
    count = [0]

    def second_only(_module, _args, output):
        count[0] += 1
        if count[0] == 2:  # the second call
            new = output.clone()
            new[:, 2] = clean_calls[1][:, 2]
            return new
        return None

    with hooked(net.block, second_only), torch.no_grad():
        want = net(corrupted)
    got = patch(rnet, clean, corrupted, second, where=(slice(None), 2))
    assert torch.equal(got, want)
    with torch.no_grad():
        assert not torch.equal(got, net(corrupted))
    grid = patch_sweep(rnet, clean, corrupted, [first, second], lambda o: o[0, 2, 0])
    # position 2 of the second call, as the hand hook patched it; batched
    # float32 (see test_patch_sweep_equals_a_loop_of_hooked_runs)
    torch.testing.assert_close(grid[1, 2], want[0, 2, 0], rtol=0, atol=1e-6)
    with torch.no_grad():
        assert torch.equal(grid[0, 0], net(corrupted)[0, 2, 0])  # nothing changed


@pytest.fixture(scope="module")
def twice():
    torch.manual_seed(0)
    net = Twice()
    return net, Recorder(net, input_data=[torch.zeros(1, 5, dtype=torch.long)])


@settings(max_examples=15, deadline=None)
@given(
    positions=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    max_batch=st.one_of(st.none(), st.integers(2, 12)),
)
def test_patch_sweep_any_positions_and_chunks_equal_single_patches(
    twice, positions, max_batch
):
    """Every cell of any grid, in any chunking, is its single patched run."""
    net, rnet = twice
    g = torch.Generator().manual_seed(len(positions))
    clean = torch.randint(0, 10, (2, 5), generator=g)
    corrupted = torch.randint(0, 10, (2, 5), generator=g)
    labels = [row.label for row in rnet.table.calls_of(net.block)]
    grid = patch_sweep(
        rnet,
        clean,
        corrupted,
        labels,
        lambda o: o[:, -1].sum(),
        positions=positions,
        max_batch=max_batch,
    )
    cache = cache_run(rnet, clean, labels)
    for i, label in enumerate(labels):
        for j, p in enumerate(positions):
            single = patch(rnet, cache, corrupted, label, where=(slice(None), p))
            # batched float32 products (see the GPT-2 sweep test): a few ulps
            torch.testing.assert_close(
                grid[i, j], single[:, -1].sum(), rtol=0, atol=1e-5
            )


# -- arguments, checked before the grid runs -----------------------------------


def test_patch_sweep_names_the_argument_it_refuses(lm):
    """The issue's cases: positions out of range or empty, batches that differ."""
    model, rnet, _, _, _ = lm
    clean, corrupted = pair()
    block = rnet.table[(3, 1)].describe()
    passes, handle = count_passes(model)
    try:
        for bad in ([6], [-7], [0, 17, -9]):
            shown = bad[0] if len(bad) == 1 else bad[1:]
            msg = (
                f"patch_sweep: `positions` holds {shown}, out of range for the 6 "
                f"positions of layer {block}'s output [2, 6, 32]: give indices "
                "from -6 to 5."
            )
            with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
                patch_sweep(rnet, clean, corrupted, (3, 1), logit_diff, positions=bad)
        assert passes[0] == 3  # the clean pass gives the length: nothing more
        passes[0] = 0
        one = {k: v[:1] for k, v in corrupted.items()}
        refusals = [
            (
                {"corrupted": one},
                ValueError,
                (
                    "`clean` has a batch of 2 and `corrupted` of 1: pass inputs of one "
                    "batch size, the i-th `clean` sample paired with the i-th "
                    "`corrupted` one."
                ),
            ),
            (
                {"positions": []},
                ValueError,
                (
                    "`positions` is empty: give at least one position, or leave "
                    "`positions=None` for every position."
                ),
            ),
            (
                {"positions": 17},
                TypeError,
                (
                    "`positions` must be an iterable of ints, got 17: e.g. "
                    "`positions=[3]` for one position, or `positions=range(2, 6)`."
                ),
            ),
            (
                {"positions": [1, 2.0]},
                TypeError,
                (
                    "`positions` holds 2.0, not an int: give positions as ints, e.g. "
                    "`positions=[3]` for one position, or `positions=range(2, 6)`."
                ),
            ),
            ({"positions": [True]}, TypeError, "`positions` holds True, not an int"),
            (
                {"max_batch": 2.5},
                TypeError,
                (
                    "`max_batch` must be an int (the most rows in one pass) or None, "
                    "got 2.5."
                ),
            ),
            (
                {"max_batch": 1},
                ValueError,
                (
                    "`max_batch=1` is below the batch size 2 of the inputs: allow at "
                    "least one copy of the batch."
                ),
            ),
            ({"metric": "logits"}, TypeError, "`metric` must be a function of"),
            (
                {"reuse_prefix": "yes"},
                TypeError,
                "`reuse_prefix` must be True or False, got 'yes'.",
            ),
            ({"read_at": []}, ValueError, "`read_at` is empty"),
            (
                {"layers": []},
                ValueError,
                (
                    "`layers=[]` selects no layer: name at least one, by label, name "
                    "or type; see `print(rnet)` for the labels."
                ),
            ),
            ({"read_at": -1}, TypeError, "`read_at` must be an iterable of ints"),
        ]
        for options, error, message in refusals:
            arguments = {
                "corrupted": corrupted,
                "layers": (3, 1),
                "metric": logit_diff,
                **options,
            }
            with pytest.raises(error, match=f"^patch_sweep: {re.escape(message)}"):
                patch_sweep(rnet, clean, **arguments)
        assert passes[0] == 0  # each refused before any pass
    finally:
        handle.remove()
    msg = (
        "patch_sweep: `read_at` holds 6, out of range for the 6 positions of the "
        "unembedding's input, "
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        patch_sweep(rnet, clean, corrupted, (3, 1), logit_diff, read_at=[6])
    assert rnet.recording == ()
    assert not [n for n, m in model.named_modules() if "forward" in vars(m)]


def test_attribution_patch_and_logit_lens_name_what_they_refuse(lm):
    model, rnet, _, _, _ = lm
    clean, corrupted = pair()
    block = rnet.table[(3, 1)].describe()
    msg = (
        f"attribution_patch: `positions` holds 6, out of range for the 6 "
        f"positions of layer {block}'s output [2, 6, 32]"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        attribution_patch(rnet, clean, corrupted, (3, 1), logit_diff, positions=[6])
    one = {k: v[:1] for k, v in corrupted.items()}
    with pytest.raises(ValueError, match=r"^attribution_patch: `clean` has a batch"):
        attribution_patch(rnet, clean, one, (3, 1), logit_diff)
    with pytest.raises(TypeError, match=r"^attribution_patch: `metric` must be a"):
        attribution_patch(rnet, clean, corrupted, (3, 1), None)
    with pytest.raises(TypeError, match=r"^logit_lens: `rnet` must be a Recorder"):
        logit_lens(model, clean, (3, 1))
    head = next(n for n, m in model.named_modules() if m is lm[4])
    inner = next(  # the MLP's first layer: wider than the residual stream
        name
        for name, _ in model.named_modules()
        if name.endswith((".0.mlp.c_fc", ".0.mlp.gate_proj"))
    )
    msg = (
        r"^logit_lens: the norm \(\w+\) and the unembedding \(\w+\) do not apply "
        r"to the output \[2, 6, (128|64)\] of layer .*: name layers whose outputs are "
        r"residual streams \(blocks\), or pass the model's own `norm=` and "
        r"`unembed=`\.$"
    )
    with pytest.raises(ValueError, match=msg):
        logit_lens(rnet, clean, inner, unembed=head)


@settings(max_examples=30, deadline=None)
@given(
    length=st.integers(1, 6),
    positions=st.lists(st.integers(-8, 8), min_size=1, max_size=4),
)
def test_positions_are_refused_exactly_when_out_of_range(twice, length, positions):
    """Any positions against any sequence length: in [-T, T) runs, else refused."""
    _, rnet = twice
    ids = torch.arange(length)[None] % 10
    bad = [p for p in positions if not -length <= p < length]
    if not bad:
        grid = patch_sweep(
            rnet, ids, ids, "block", lambda o: o.sum(), positions=positions
        )
        assert grid.shape == (2, len(positions))
        return
    shown = bad[0] if len(bad) == 1 else bad
    msg = (
        f"patch_sweep: `positions` holds {shown}, out of range for the {length} "
        f"positions of layer "
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        patch_sweep(rnet, ids, ids, "block", lambda o: o.sum(), positions=positions)
