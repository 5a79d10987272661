"""scio_recorder.sae.attach: an SAE in the net for the tools that run their passes.

Inside ``attach``, every pass of the net is spliced, whoever runs it; the
oracle is the same splice given to ``rnet(...)`` as a postprocessor, or a
hand-written forward hook left on the net for the tool's run (the same
operations on the same tensors: equal bit for bit), and, for the latents
read as a layer, ``sae.encode`` of the recorded layer.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.activations import SparseLatents, write
from scio_recorder.collect import InputOf, collect
from scio_recorder.explain import patch_sweep
from scio_recorder.ood import KNN
from scio_recorder.sae import attach, splice
from tests.test_sae import VOCAB, D, gpt2, random_sae

BLOCK = "transformer.h.0"


@pytest.fixture(scope="module")
def lm():
    model = gpt2()
    ids = torch.randint(1, VOCAB, (4, 6), generator=torch.Generator().manual_seed(1))
    return model, Recorder(model, input_data={"input_ids": ids}), ids


def test_inside_attach_every_pass_is_spliced_and_after_nothing_is_left(lm):
    """rnet(x), the net called directly, generate: spliced; after, as it was."""
    model, rnet, ids = lm
    sae = random_sae(d_sae=48, activation="topk", k=6)
    block = model.transformer.h[0]
    hooks = (len(block._forward_hooks), len(block._forward_pre_hooks))
    root = len(model._forward_pre_hooks)
    with torch.no_grad():
        expected = rnet(input_ids=ids, activation_postproc={BLOCK: splice(sae)}).logits
        plain = model(input_ids=ids).logits
        options = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
        steps = splice(sae, keep_steps=True)
        generated = rnet.generate(
            ids[:1], activation_postproc={BLOCK: steps}, **options
        )
        sp = splice(sae, keep_steps=True)
        with attach(rnet, {BLOCK: sp}):
            through = rnet(input_ids=ids).logits
            direct = model(input_ids=ids).logits
            assert isinstance(block.sae, nn.Module)
            sp.clear()
            attached = rnet.generate(ids[:1], **options)
        after = model(input_ids=ids).logits
    assert torch.equal(attached, generated)
    assert len(sp.steps) == 3
    assert all(torch.equal(a, b) for a, b in zip(sp.steps, steps.steps, strict=True))
    assert torch.equal(through, expected)
    assert torch.equal(direct, expected)
    assert sp.latents is sp.steps[-1]
    assert [tuple(s.shape) for s in sp.steps] == [(1, 6, 48), (1, 1, 48), (1, 1, 48)]
    assert torch.equal(after, plain)
    assert not hasattr(block, "sae")
    assert (len(block._forward_hooks), len(block._forward_pre_hooks)) == hooks
    assert len(model._forward_pre_hooks) == root


def test_attach_splices_the_call_a_label_names():
    """A module called twice: only the call its label names is spliced."""
    shared = nn.Linear(D, D)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared = shared

        def forward(self, x):
            return self.shared(torch.tanh(self.shared(x)))

    net = Twice()
    rnet = Recorder(net, input_size=(2, D))
    second = rnet.table.calls_of(shared)[1].label
    sae = random_sae(d_sae=48)
    x = torch.randn(3, D)
    with torch.no_grad():
        expected = sae(shared(torch.tanh(shared(x))))
        with attach(rnet, {second: splice(sae)}, name="dictionary"):
            out = net(x)
            out_again = net(x)  # counts start over at each root call
    assert torch.equal(out, expected)
    assert torch.equal(out_again, expected)


def test_the_latents_are_a_layer_that_collect_reduces(lm):
    """A recorder made inside the block records `<module>.sae.latents`: encode's."""
    model, rnet, ids = lm
    sae = random_sae(d_sae=48)
    batches = [ids[:2], ids[2:]]
    with torch.no_grad(), rnet.selecting(BLOCK):
        blocks = []
        for batch in batches:
            rnet(input_ids=batch)
            blocks.append(rnet.activations_of(BLOCK)[0])
        expected = torch.cat([sae.encode(b) for b in blocks]).reshape(-1, 48)
    with attach(rnet, {BLOCK: splice(sae, keep_error=True)}):
        inside = Recorder(model, input_data={"input_ids": ids})
        name = f"{BLOCK}.sae.latents"
        (row,) = inside.table.calls_of(model.transformer.h[0].sae.latents)
        assert row.name == name
        assert row.output_size == [4, 6, 48]
        kept = collect(inside, batches, {name: "all"}, input=None)
        (label,) = kept.labels_of[name]
    latents = torch.cat(kept[label]).reshape(-1, 48)
    assert torch.equal(latents, expected)


def test_patch_sweep_runs_the_spliced_model(lm):
    """patch_sweep inside attach equals a loop of hooked runs of the spliced model.

    The loop: for each cell, the corrupted input with block 0 spliced by a
    hand-written hook, and the patched block's output at the cell's
    position taken from the clean run of the spliced model.
    """
    model, rnet, ids = lm
    sae = random_sae(d_sae=48)
    clean, corrupted = {"input_ids": ids[:2]}, {"input_ids": ids[2:]}
    blocks = [model.transformer.h[0], model.transformer.h[1]]

    def metric(out):
        return (out.logits[:, -1, 3] - out.logits[:, -1, 5]).mean()

    def run(inputs, patch=None):
        kept = {}

        def hook(index):
            def fn(_module, _args, out):
                out = sae(out) if index == 0 else out
                if patch is not None and patch[0] == index:
                    out = out.clone()
                    out[:, patch[1]] = patch[2][:, patch[1]]
                kept[index] = out
                return out

            return fn

        handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)]
        try:
            with torch.no_grad():
                return model(**inputs), kept
        finally:
            for handle in handles:
                handle.remove()

    _, streams = run(clean)
    expected = torch.tensor(
        [
            [float(metric(run(corrupted, (i, j, streams[i]))[0])) for j in range(6)]
            for i in range(2)
        ]
    )
    names = ["transformer.h.0", "transformer.h.1"]
    with attach(rnet, {BLOCK: splice(sae)}):
        grid = patch_sweep(rnet, clean, corrupted, names, metric)
        looped = patch_sweep(rnet, clean, corrupted, names, metric, max_batch=2)
    plain = patch_sweep(rnet, clean, corrupted, names, metric)
    # One cell per pass runs the loop's operations on the same tensors (bit
    # for bit, as patch_sweep says); a row's cells batched in one pass
    # round like any batched matrix product: a few eps32 of the logits.
    assert torch.equal(looped, expected)
    assert torch.allclose(grid, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(grid, plain, rtol=0, atol=1e-3)


def test_an_ood_score_on_sae_latents():
    """KNN on the latents layer: the distance to the nearest fit sample's latents."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, D), nn.ReLU(), nn.Linear(D, 3))
    rnet = Recorder(net, input_size=(1, 5))
    sae = random_sae(d_sae=48, activation="topk", k=5)
    fit = [torch.randn(20, 5), torch.randn(20, 5)]
    query = torch.randn(7, 5) * 3
    with attach(rnet, {"1": splice(sae, keep_error=True)}):
        inside = Recorder(net, input_size=(1, 5))
        knn = KNN(inside, layer="1.sae.latents").fit(fit, input=None)
        scores = knn.score(query)
    with torch.no_grad():
        bank = nn.functional.normalize(
            torch.cat([sae.encode(net[:2](x)) for x in fit]), dim=1
        )
        z = nn.functional.normalize(sae.encode(net[:2](query)), dim=1)
        # Tolerance: a squared distance ||z||^2 + ||b||^2 - 2 z.b of unit
        # vectors of 48 latents is off by a few eps32 * 48; its square root
        # near a distance d by that over 2 d.
        expected = torch.cdist(z, bank).min(dim=1).values
    assert torch.allclose(scores, expected, rtol=0, atol=1e-5)
    assert knn.bank.shape == (40, 48)


def test_write_stores_the_spliced_model_and_the_latents(lm, tmp_path):
    """write inside attach: the latents layer dense, and SparseLatents of the block."""
    model, rnet, ids = lm
    sae = random_sae(d_sae=48, activation="topk", k=6)
    with attach(rnet, {BLOCK: splice(sae, keep_error=True)}):
        inside = Recorder(model, input_data={"input_ids": ids})
        ds = write(
            inside,
            [ids],
            tmp_path / "set",
            layers={
                "dense": f"{BLOCK}.sae.latents",
                "sparse": SparseLatents(sae, BLOCK),
            },
            mask=None,
        )
    assert ds.dims == {"dense": 48, "sparse": 48}
    values = ds[:]
    assert torch.equal(values["dense"], values["sparse"])
    with torch.no_grad(), rnet.selecting(BLOCK):
        rnet(input_ids=ids)
        expected = sae.encode(rnet.activations_of(BLOCK)[0].reshape(-1, D))
    assert torch.equal(values["dense"], expected)


def test_attach_reads_a_transcoder_s_input():
    """InputOf(module) gives a transcoder's read, as input_postproc does."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, D), nn.Sequential(nn.Linear(D, 8), nn.ReLU()))
    rnet = Recorder(net, input_size=(1, 4))
    tc = random_sae(d_sae=48, d_out=8, transcoder=True)
    x = torch.randn(5, 4)
    with torch.no_grad():
        sp = splice(tc)
        expected = rnet(x, activation_postproc={"1": sp}, input_postproc={"1": sp.read})
        sp = splice(tc)
        with attach(rnet, {InputOf("1"): sp.read, "1": sp}):
            out = net(x)
    assert torch.equal(out, expected)
    assert torch.equal(out, tc(net[0](x)))


def test_attach_names_what_it_refuses(lm):
    """Not a dict, a selector of several calls, a name taken."""
    model, rnet, _ = lm
    sp = splice(random_sae(d_sae=48))
    with pytest.raises(TypeError, match=r"^`attach` takes a dict"), attach(rnet, sp):
        pass
    msg = "`attach`: layer <class 'transformers.models.gpt2.modeling_gpt2.GPT2Block'>"
    with (
        pytest.raises(ValueError, match=f"^{re.escape(msg)}"),
        attach(rnet, {type(model.transformer.h[0]): sp}),
    ):
        pass
    with (
        pytest.raises(ValueError, match="already has a child 'attn'"),
        attach(rnet, {BLOCK: sp}, name="attn"),
    ):
        pass
    assert not model.transformer.h[0]._forward_hooks
