"""Hallucination scores from internal states, against float64 hand computations.

EigenScore (INSIDE), LLM-Check's hidden and attention scores, Lookback
Lens's ratios and classifier, and the probes with their label-shuffle
control. Each score is written out again here in numpy float64 (``slogdet``
of the regularised Gram matrix, loops over heads and tokens) from the
hidden states and attention weights Hugging Face returns
(``output_hidden_states``, ``output_attentions``), an independent path from
the detectors' recorded layers. Float64 on both sides from the same float32
activations: the only differences are eigenvalue vs determinant roundings,
a few ``eps64`` times the condition of the matrix, hence ``rtol=1e-8``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scio_recorder import Recorder
from scio_recorder.ood import (
    AttentionScore,
    EigenScore,
    HiddenScore,
    LookbackRatio,
    Probe,
    attention_score,
    eigen_score,
    evaluate,
    hidden_score,
    lookback_ratios,
)

transformers = pytest.importorskip("transformers")
VOCAB = 64


def _gpt2(seed: int = 0, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=32,
        attn_implementation="eager", bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def _hand_eigen(z: np.ndarray, alpha: float) -> float:
    """``log det(Z J Z^T + alpha I) / K`` in float64, J the feature centring."""
    k, d = z.shape
    j = np.eye(d) - np.ones((d, d)) / d
    sign, logdet = np.linalg.slogdet(z @ j @ z.T + alpha * np.eye(k))
    assert sign > 0
    return logdet / k


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(2, 6),
    d=st.integers(2, 12),
    alpha=st.sampled_from([1e-3, 1e-1, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_eigen_score_is_the_log_determinant_over_k(k, d, alpha, seed):
    z = np.random.default_rng(seed).normal(size=(3, k, d))
    got = eigen_score(torch.from_numpy(z), alpha)
    want = [_hand_eigen(one, alpha) for one in z]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-8, atol=1e-10)


def test_identical_answers_score_lower_than_spread_ones():
    gen = torch.Generator().manual_seed(0)
    one = torch.randn(1, 16, generator=gen)
    same = one.expand(5, 16) + 1e-3 * torch.randn(5, 16, generator=gen)
    spread = torch.randn(5, 16, generator=gen)
    assert float(eigen_score(same)) < float(eigen_score(spread)) - 3


def _hand_attention(weights: np.ndarray, length: int, normalisation: str) -> float:
    """The paper's: sum over heads of ``log det(A) / m`` of the real tokens'
    kernel; lm-polygraph's: minus the mean over heads of ``log det(A)``."""
    per = []
    for a in weights:
        sub = a[-length:, -length:] if length else a
        sign, logdet = np.linalg.slogdet(sub)  # lower triangular: sum log diag
        assert sign > 0
        per.append(logdet / sub.shape[0] if normalisation == "paper" else logdet)
    return float(np.sum(per) if normalisation == "paper" else -np.mean(per))


def _left_padded(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    return {"input_ids": ids * mask, "attention_mask": mask}


def _hf(net, batch):
    positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return net(**batch, position_ids=positions, output_hidden_states=True,
                   output_attentions=True)  # fmt: skip


@pytest.mark.parametrize("normalisation", ["paper", "polygraph"])
def test_attention_score_against_the_determinant_of_each_heads_kernel(normalisation):
    net = _gpt2()
    batch = _left_padded()
    rnet = Recorder(net, input_data={"input_ids": batch["input_ids"]})
    got = AttentionScore(rnet, "transformer.h.1.attn", normalisation=normalisation)(
        batch
    )
    attentions = _hf(net, batch).attentions[1].to(torch.float64).numpy()
    lengths = batch["attention_mask"].sum(1).tolist()
    want = [_hand_attention(attentions[b], lengths[b], normalisation) for b in range(3)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-8)
    fn = attention_score(
        torch.from_numpy(attentions),
        batch["attention_mask"],
        normalisation=normalisation,
    )
    np.testing.assert_allclose(fn.numpy(), want, rtol=1e-8)


def test_hidden_score_against_the_log_determinant_of_the_real_tokens():
    net = _gpt2()
    batch = _left_padded(1)
    rnet = Recorder(net, input_data={"input_ids": batch["input_ids"]})
    got = HiddenScore(rnet, "transformer.h.0", alpha=1e-2)(**batch)
    hidden = _hf(net, batch).hidden_states[1].to(torch.float64).numpy()
    mask = batch["attention_mask"].numpy().astype(bool)
    want = [_hand_eigen(hidden[b][mask[b]], 1e-2) for b in range(3)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-8)
    fn = hidden_score(torch.from_numpy(hidden), batch["attention_mask"], 1e-2)
    np.testing.assert_allclose(fn.numpy(), want, rtol=1e-8)


def test_a_row_scores_the_same_alone_and_left_padded():
    net = _gpt2()
    batch = _left_padded(2)
    rnet = Recorder(net, input_data={"input_ids": batch["input_ids"]})
    hidden = HiddenScore(rnet, "transformer.h.1")
    att = AttentionScore(rnet, "transformer.h.0.attn")
    alone = {"input_ids": batch["input_ids"][2:, 4:]}
    # Float32 activations of one row along two paths (batch of 3 with padding,
    # batch of 1): the kernels may round differently, a few float32 eps of
    # each activation, amplified by at most the log-determinant's condition.
    for det in (hidden, att):
        np.testing.assert_allclose(
            det(batch)[2:].numpy(), det(alone).numpy(), rtol=1e-4
        )


def _hand_lookback(w: np.ndarray, context: int, length: int) -> np.ndarray:
    """``[T, H]`` lookback ratios of one left-padded row, by loops."""
    heads, width, _ = w.shape
    start = width - length
    out = np.full((width, heads), np.nan)
    for t in range(start + context, width):
        for h in range(heads):
            ctx = w[h, t, start : start + context].mean()
            new = w[h, t, start + context : t + 1].mean()
            out[t, h] = ctx / (ctx + new)
    return out


def test_lookback_ratios_against_loops_over_steps_and_heads():
    net = _gpt2()
    batch = _left_padded(3)
    context = torch.tensor([4, 2, 1])
    rnet = Recorder(net, input_data={"input_ids": batch["input_ids"]})
    layers = ["transformer.h.0.attn", "transformer.h.1.attn"]
    got = LookbackRatio(rnet, layers).ratios(dict(batch, context=context))
    out = _hf(net, batch)
    lengths = batch["attention_mask"].sum(1).tolist()
    for layer in range(2):
        w = out.attentions[layer].to(torch.float64).numpy()
        for b in range(3):
            want = _hand_lookback(w[b], int(context[b]), lengths[b])
            np.testing.assert_allclose(
                got[b, :, 2 * layer : 2 * layer + 2].numpy(), want, rtol=1e-10
            )
    assert got[0, :4].isnan().all()
    assert got[0, 4:].isfinite().all()


def test_lookback_ratios_of_uniform_attention():
    w = torch.tril(torch.ones(1, 1, 4, 4))
    w = w / w.sum(-1, keepdim=True)
    ctx = torch.tensor([[True, True, False, False]])
    got = lookback_ratios(w, ctx)[0, :, 0]
    # uniform: each key 1/(t+1); context mean = new mean at every step
    assert got[:2].isnan().all()
    assert torch.allclose(got[2:], torch.tensor([0.5, 0.5], dtype=torch.float64))


def test_the_lookback_classifier_separates_context_reading_heads():
    # "Faithful" rows repeat their context (heads look back at it); the
    # others continue with fresh tokens: the ratios differ, and the fitted
    # classifier ranks them. Layer 0's queries and keys are set so that a
    # token attends to its copies (q = 3 x, k = x: a match scores about 8).
    net = _gpt2()
    with torch.no_grad():
        attn = net.transformer.h[0].attn.c_attn
        attn.weight[:, :32] = torch.cat([3 * torch.eye(16), torch.eye(16)], 1)
        attn.bias[:32] = 0
    rnet = Recorder(net, input_data={"input_ids": torch.ones(1, 8, dtype=torch.long)})
    gen = torch.Generator().manual_seed(0)

    def batch(n):
        ctx = torch.randint(1, VOCAB, (n, 4), generator=gen)
        fresh = torch.randint(1, VOCAB, (n, 4), generator=gen)
        label = torch.arange(n) % 2
        tail = torch.where(label[:, None] == 0, ctx, fresh)
        return {
            "input_ids": torch.cat([ctx, tail], 1),
            "context": torch.full((n,), 4),
            "label": label,
        }

    layers = ["transformer.h.0.attn", "transformer.h.1.attn"]
    det = LookbackRatio(rnet, layers).fit([batch(64)], target="label")
    test = batch(64)
    scores = det(test)
    labels = test["label"]
    auroc = (scores[labels == 1][:, None] > scores[labels == 0][None]).double().mean()
    assert auroc > 0.9


def test_eigen_score_detector_against_hidden_states_with_clipping(tmp_path):
    net = _gpt2()
    batch = _left_padded(4)
    batch = {k: torch.cat([v, v.flip(0)]) for k, v in batch.items()}  # 2 x K=3
    rnet = Recorder(net, input_data={"input_ids": batch["input_ids"]})
    det = EigenScore(rnet, "transformer.h.0", samples=3)
    hidden = _hf(net, batch).hidden_states[1].to(torch.float64).numpy()
    last = hidden[:, -1]  # left padded: the last position is the last real token
    want = [_hand_eigen(last[:3], 1e-3), _hand_eigen(last[3:], 1e-3)]
    np.testing.assert_allclose(det(batch).numpy(), want, rtol=1e-8)
    # clipping: per-neuron quantiles of every real token of the fit batches
    fit = _left_padded(5)
    clipped = EigenScore(rnet, "transformer.h.0", samples=3, clip=0.1).fit([fit])
    tokens = _hf(net, fit).hidden_states[1].to(torch.float64).numpy()
    tokens = tokens[fit["attention_mask"].numpy().astype(bool)]
    low, high = np.quantile(tokens, 0.1, axis=0), np.quantile(tokens, 0.9, axis=0)
    cl = np.clip(last, low, high)
    want = [_hand_eigen(cl[:3], 1e-3), _hand_eigen(cl[3:], 1e-3)]
    np.testing.assert_allclose(clipped(batch).numpy(), want, rtol=1e-8)
    assert not np.allclose(clipped(batch).numpy(), det(batch).numpy())
    path = clipped.save(tmp_path / "eigen.safetensors")
    again = EigenScore(rnet, "transformer.h.0", samples=3, clip=0.1).load(path)
    assert torch.equal(again(batch), clipped(batch))
    with pytest.raises(ValueError, match="N \\* samples rows"):
        det({k: v[:4] for k, v in batch.items()})


def _facts(net_seed: int = 0):
    """A tiny GPT-2 that "knows" half its subjects: their embeddings carry a
    direction the others lack (a planted, real signal in the residual stream).
    Rows: 3 filler tokens, then a subject; label 1: an unknown subject."""
    net = _gpt2(net_seed)
    gen = torch.Generator().manual_seed(1)
    subjects = torch.arange(10, VOCAB)
    known = torch.randperm(len(subjects), generator=gen)[: len(subjects) // 2]
    is_known = torch.zeros(VOCAB, dtype=torch.bool)
    is_known[subjects[known]] = True
    direction = torch.randn(16, generator=gen)
    with torch.no_grad():
        net.transformer.wte.weight[is_known] += 0.3 * direction / direction.norm()
    # Probe train and test rows use disjoint subjects: the probe must learn
    # "known", not the subjects' identities.
    order = subjects[torch.randperm(len(subjects), generator=gen)]
    halves = order[: len(order) // 2], order[len(order) // 2 :]

    def rows(pool, n):
        subj = pool[torch.randint(0, len(pool), (n,), generator=gen)]
        filler = torch.randint(1, 10, (n, 3), generator=gen)
        ids = torch.cat([filler, subj[:, None]], 1)
        return {"input_ids": ids, "label": (~is_known[subj]).long()}

    train = [rows(halves[0], 100), rows(halves[0], 100)]
    test = [rows(halves[1], 200)]
    return net, train, test


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [0, 8])
def test_the_probe_finds_the_unknown_facts_and_its_shuffle_control_does_not(
    hidden, tmp_path
):
    net, train, test = _facts()
    rnet = Recorder(net, input_data={"input_ids": train[0]["input_ids"]})
    probe = Probe(rnet, "transformer.h.1", hidden=hidden)
    report = probe.control(train, test, target="label", shuffles=5)
    assert report["auroc"] >= 0.95
    assert report["control"] <= 0.65
    assert len(report["controls"]) == 5
    # the probe is left fitted on the true labels: its held-out AUROC again
    scores, labels = probe(test[0]), test[0]["label"]
    auroc = (scores[labels == 1][:, None] > scores[labels == 0][None]).double().mean()
    assert float(auroc) == pytest.approx(report["auroc"])
    path = probe.save(tmp_path / "probe.safetensors")
    again = Probe(rnet, "transformer.h.1", hidden=hidden).load(path)
    assert torch.equal(again(test[0]), scores)
    # the protocol's evaluate: unknown facts as the "OoD" set
    known = [{"input_ids": test[0]["input_ids"][labels == 0]}]
    unknown = [{"input_ids": test[0]["input_ids"][labels == 1]}]
    result = evaluate({"probe": probe}, known, unknown, input=lambda b: b)
    assert result["probe"]["AUROC"] == pytest.approx(report["auroc"])


def test_probe_logits_against_a_hand_logistic_model():
    net, train, _ = _facts()
    rnet = Recorder(net, input_data={"input_ids": train[0]["input_ids"]})
    probe = Probe(rnet, "transformer.h.0", steps=20).fit(train, target="label")
    hidden = _hf(
        net,
        {
            "input_ids": train[0]["input_ids"],
            "attention_mask": torch.ones(100, 4, dtype=torch.long),
        },
    )
    x = hidden.hidden_states[1][:, -1].to(torch.float64).numpy()
    p = {k: v.numpy() for k, v in probe.state().items()}
    want = ((x - p["mean"]) / p["std"]) @ p["w"] + p["b"]
    np.testing.assert_allclose(probe(train[0]).numpy(), want, rtol=1e-8)


def test_probe_refuses_labels_that_are_not_binary_and_batches_without_them():
    net, train, _ = _facts()
    rnet = Recorder(net, input_data={"input_ids": train[0]["input_ids"]})
    bad = [dict(train[0], label=train[0]["label"] * 2)]
    with pytest.raises(ValueError, match="must be 0 or 1"):
        Probe(rnet, "transformer.h.1").fit(bad, target="label")
    with pytest.raises(KeyError, match="a batch has no key 'y'"):
        Probe(rnet, "transformer.h.1").fit(train, target="y")


def test_attention_detectors_name_eager_attention_when_weights_are_absent():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20,
                                     attn_implementation="sdpa")  # fmt: skip
    net = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(1, 20, (2, 4))
    rnet = Recorder(net, input_data={"input_ids": ids})
    with pytest.raises(ValueError, match="eager"):
        AttentionScore(rnet, "transformer.h.0.attn")(input_ids=ids)


@settings(max_examples=25, deadline=None)
@given(
    width=st.integers(2, 8),
    heads=st.integers(1, 3),
    data=st.data(),
)
def test_lookback_ratios_lie_in_0_1_and_are_1_on_context_only_attention(
    width, heads, data
):
    context = data.draw(st.integers(1, width - 1))
    seed = data.draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    logits = torch.randn(1, heads, width, width, generator=gen, dtype=torch.float64)
    w = torch.softmax(logits.masked_fill(~causal, -torch.inf), dim=-1)
    ctx = torch.arange(width)[None] < context
    got = lookback_ratios(w, ctx)
    steps = got[0, context:]
    assert got[0, :context].isnan().all()
    assert ((steps > 0) & (steps < 1)).all()
    # attention on the context only (every new token's weight 0): ratio 1
    only = torch.zeros_like(w)
    only[..., :context] = w[..., :context]
    assert torch.equal(lookback_ratios(only, ctx)[0, context:], torch.ones_like(steps))


def test_the_lookback_classifier_saves_and_loads(tmp_path):
    net = _gpt2()
    batch = dict(_left_padded(6), context=torch.tensor([3, 2, 1]))
    rnet = Recorder(net, input_data={"input_ids": batch["input_ids"]})
    layers = ["transformer.h.0.attn", "transformer.h.1.attn"]
    labelled = dict(batch, label=torch.tensor([0, 1, 1]))
    det = LookbackRatio(rnet, layers).fit([labelled], target="label")
    path = det.save(tmp_path / "lens.safetensors")
    again = LookbackRatio(rnet, layers).load(path)
    assert torch.equal(again(batch), det(batch))
    # the classifier's logit: the mean ratios of a row, weighted
    feats = det.features(batch)
    w, b = det.state()["w"], det.state()["b"]
    assert torch.allclose(det(batch), feats @ w + b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="layers"):
        LookbackRatio(rnet, layers[:1]).load(path)
