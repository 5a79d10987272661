"""scio_recorder.sae.evaluate: each measure against a hand computation.

The hand computation runs the model with hand-written forward hooks (the
block's output kept; replaced by ``sae(x)``; replaced by zeros), keeps the
tokens of the padding mask, concatenates every batch's, and writes each
measure's formula out in float64 over the whole stream at once. The float32
values are the same tensors on both sides (the same operations on the same
inputs); only the order of the float64 sums differs: a relative error of a
few ``N * eps64`` for ``N`` terms, far below the ``1e-9`` asked.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from scio_recorder import Recorder
from scio_recorder.collect import InputOf
from scio_recorder.sae import evaluate
from tests.test_sae import VOCAB, D, gpt2, random_sae

REL = 1e-9


def wide_sae(activation="relu", **options):
    """96 latents, some of which never fire on the stream (dead)."""
    return random_sae(activation, d_sae=96, gain=8, bias=0.3, shift=-0.2, **options)


@pytest.fixture(scope="module")
def lm():
    model = gpt2()
    g = torch.Generator().manual_seed(1)
    batches = []
    for rows in (3, 2):
        ids = torch.randint(1, VOCAB, (rows, 9), generator=g)
        mask = torch.ones(rows, 9, dtype=torch.long)
        mask[0, :4] = 0  # left padding
        batches.append({"input_ids": ids, "attention_mask": mask})
    rnet = Recorder(model, input_data={"input_ids": batches[0]["input_ids"]})
    return model, rnet, batches


def run(model, batch, *, module, write=None, read=None):
    """Logits, and the vectors at ``module`` (its output; or ``read``'s input)."""
    kept = {}

    def keep_output(_m, _a, out):
        kept["y"] = out
        return None if write is None else write(out, kept)

    handles = [module.register_forward_hook(keep_output)]
    if read is not None:
        handles.append(
            read.register_forward_pre_hook(lambda _m, a: kept.update(x=a[0]))
        )
    try:
        with torch.no_grad():  # each row's tokens numbered from 0, as evaluate does
            mask = batch["attention_mask"]
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
            logits = model(**batch, position_ids=positions).logits
    finally:
        for handle in handles:
            handle.remove()
    return logits, kept


@torch.no_grad()
def by_hand(model, batches, sae, module, read=None):
    """Every measure, written out over the concatenated stream."""
    ys, y_hats, latents, losses, kls = [], [], [], [[], [], []], []
    for batch in batches:
        keep = batch["attention_mask"].bool()
        clean, kept = run(model, batch, module=module, read=read)
        x = kept.get("x", kept["y"])
        spliced, _ = run(
            model,
            batch,
            module=module,
            read=read,
            write=(lambda _o, k: sae(k.get("x", k["y"]))),
        )
        zero, _ = run(
            model, batch, module=module, write=lambda o, _k: torch.zeros_like(o)
        )
        f = sae.encode(x)
        y_hat = sae.decode(f) if sae.transcoder else sae.decode(f, x=x)
        ys.append(kept["y"][keep])
        y_hats.append(y_hat[keep])
        latents.append(f[keep])
        pairs = keep[:, :-1] & keep[:, 1:]
        labels = batch["input_ids"][:, 1:][pairs]
        for k, logits in enumerate((clean, spliced, zero)):
            losses[k].append(
                F.cross_entropy(logits[:, :-1][pairs], labels, reduction="none")
            )
        p = F.log_softmax(clean[keep].double(), dim=-1)
        q = F.log_softmax(spliced[keep].double(), dim=-1)
        kls.append((p.exp() * (p - q)).sum(-1))
    y = torch.cat(ys).double()
    y_hat = torch.cat(y_hats).double()
    f = torch.cat(latents)
    fired = (f != 0).sum(0)
    loss = [float(torch.cat(part).double().mean()) for part in losses]
    return {
        "tokens": y.shape[0],
        "mse": float(((y - y_hat) ** 2).mean()),
        "explained_variance": float(
            1 - ((y - y_hat) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
        ),
        "l0": float((f != 0).sum(1).double().mean()),
        "dead": int((fired == 0).sum()),
        "frequency": fired.double() / y.shape[0],
        "loss_clean": loss[0],
        "loss_spliced": loss[1],
        "loss_zero": loss[2],
        "loss_recovered": (loss[2] - loss[1]) / (loss[2] - loss[0]),
        "kl": float(torch.cat(kls).mean()),
    }


def assert_measures(got, expected):
    for name, value in expected.items():
        if name == "frequency":
            assert torch.equal(got.frequency, value)
        elif isinstance(value, int):
            assert getattr(got, name) == value, name
        else:
            assert math.isclose(getattr(got, name), value, rel_tol=REL), name


def test_every_measure_equals_the_hand_computation(lm):
    """MSE, explained variance, L0, dead latents, losses, recovered, KL: by hand."""
    model, rnet, batches = lm
    sae = wide_sae()
    got = evaluate(rnet, sae, batches, layer="transformer.h.0")
    expected = by_hand(model, batches, sae, model.transformer.h[0])
    assert_measures(got, expected)
    assert got.tokens == 3 * 9 - 4 + 2 * 9 - 4  # the padding left out
    assert 0 < got.dead < 96  # the dead count is not vacuous
    assert 0 < got.l0 < 96
    assert got.loss_clean != got.loss_spliced != got.loss_zero
    sae_only = evaluate(rnet, sae, batches, layer="transformer.h.0", lm=False)
    assert sae_only.loss_clean is None
    assert sae_only.as_dict() == {
        **got.as_dict(),
        **dict.fromkeys(
            ["loss_clean", "loss_spliced", "loss_zero", "loss_recovered", "kl"]
        ),
    }


def test_a_transcoder_s_measures_read_its_input(lm):
    """A transcoder read at the MLP's input, written at its output: by hand too."""
    model, rnet, batches = lm
    tc = wide_sae("topk", k=12, transcoder=True)
    mlp = model.transformer.h[1].mlp
    got = evaluate(
        rnet,
        tc,
        batches,
        layer="transformer.h.1.mlp",
        reads=InputOf("transformer.h.1.mlp"),
    )
    expected = by_hand(model, batches, tc, mlp, read=mlp)
    assert_measures(got, expected)
    assert got.l0 == 12.0


def test_the_table_and_what_evaluate_refuses(lm):
    """The Markdown table; reads for an SAE, none for a transcoder, no ids."""
    _, rnet, batches = lm
    sae = wide_sae()
    table = evaluate(rnet, sae, batches[:1], layer="transformer.h.0").table()
    assert table.splitlines()[:3] == [
        "| measure | value |",
        "|---|---|",
        "| tokens | 23 |",
    ]
    assert re.search(r"^\| loss_recovered \| -?\d", table, re.MULTILINE)
    with pytest.raises(ValueError, match=r"^`reads=` is for transcoders"):
        evaluate(rnet, sae, batches, layer="transformer.h.0", reads="transformer.h.0")
    tc = wide_sae(transcoder=True)
    with pytest.raises(ValueError, match=r"^A transcoder reads somewhere else"):
        evaluate(rnet, tc, batches, layer="transformer.h.0")
    embeds = [
        {"inputs_embeds": torch.randn(2, 5, D), "attention_mask": torch.ones(2, 5)}
    ]
    with pytest.raises(ValueError, match=r"^The batches hold no token ids"):
        evaluate(rnet, sae, embeds, layer="transformer.h.0")
    measured = evaluate(rnet, sae, embeds, layer="transformer.h.0", lm=False)
    assert measured.tokens == 10
