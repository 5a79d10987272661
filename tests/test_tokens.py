"""Per-token scores of language models (``token=EACH``), on tiny GPT-2 and Llama.

The oracles are independent of the library: the token features are read by
a hand-written forward hook on the plain model (position ids written out
as ``mask.cumsum(-1) - 1``, Hugging Face's numbering of a padded row), and
the class statistics, the Mahalanobis distances and the surprisals are
written out in float64.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from scio_recorder import Recorder
from scio_recorder.ood import (
    GEN,
    JTLA,
    MSP,
    NAC,
    DkNN,
    EigenScore,
    Energy,
    Entropy,
    Mahalanobis,
    MahalanobisEnsemble,
    MaxLogit,
    Probe,
    Surprisal,
    fit_detectors,
)
from scio_recorder.ood._tokens import (
    TokenScoring,
    conformal_threshold,
    reduce_tokens,
    token_arguments,
)
from tests.lms import LENGTHS, VOCAB, gpt2, llama, padded

if TYPE_CHECKING:
    from scio_recorder._run.monitors import MonitorStep

EACH, ALL = "each", "all"  # `token=` values (named: not passwords, for ruff)
MODELS = {"gpt2": (gpt2, "transformer.h.1"), "llama": (llama, "model.layers.1")}
# Float32 features through different batch shapes and kernels: the features
# agree to a few float32 eps (1.2e-7) times their magnitude (~1); a squared
# Mahalanobis distance (~10-50, a quadratic form through a precision matrix of
# condition ~1e3) then to ~1e-3 relative at worst; 1e-4 relative is what we
# see with a margin of 10 either way, so we hold the scores to rtol 1e-3.
RTOL_ACROSS_BATCHES = 1e-3


def fit_batches(seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """Eight padded batches, both sides, with per-token labels in [0, 3)."""
    out = []
    for i in range(8):
        batch = padded("left" if i % 2 else "right", seed + i)
        batch["labels"] = (batch["input_ids"] % 3).masked_fill(
            batch["attention_mask"] == 0, -100
        )
        out.append(batch)
    return out


def hand_features(
    net: torch.nn.Module, module: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The module's output ``[B, T, D]`` from a hook on the plain model, float64."""
    seen: list[torch.Tensor] = []

    def hook(_m: object, _args: object, output: object) -> None:
        value = output[0] if isinstance(output, tuple) else output
        assert isinstance(value, torch.Tensor)
        seen.append(value.detach().to(torch.float64))

    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            net(
                input_ids=batch["input_ids"],
                attention_mask=mask,
                position_ids=positions,
            )
    finally:
        handle.remove()
    return seen[0]


def hand_statistics(
    net: torch.nn.Module, module: torch.nn.Module, batches: list, key: str | None
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Class means and the tied population covariance of the real tokens."""
    feats, labels = [], []
    for batch in batches:
        f = hand_features(net, module, batch)
        keep = batch["attention_mask"] != 0
        lab = torch.zeros_like(batch["input_ids"]) if key is None else batch[key]
        keep &= lab >= 0
        feats.append(f[keep])
        labels.append(lab[keep])
    x, y = torch.cat(feats), torch.cat(labels)
    means = {int(c): x[y == c].mean(dim=0) for c in y.unique()}
    centred = torch.stack([x[i] - means[int(y[i])] for i in range(len(y))])
    return means, centred.T @ centred / len(y)


def module_of(net: torch.nn.Module, name: str) -> torch.nn.Module:
    return dict(net.named_modules())[name]


@pytest.fixture(scope="module", params=sorted(MODELS))
def lm(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, Recorder, str]:
    make, layer = MODELS[request.param]
    net = make()
    return net, Recorder(net, input_data=padded("left")), layer


@pytest.mark.parametrize("key", [None, "labels", "input_ids"])
def test_mahalanobis_per_token_equals_float64_hand_computation(
    lm: tuple[torch.nn.Module, Recorder, str], key: str | None
) -> None:
    net, rnet, layer = lm
    data = fit_batches()
    det = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    det.fit(data, target=key)
    module = module_of(net, layer)
    means, cov = hand_statistics(net, module, data, key)
    # class means equal the hand class means, in the order of the classes seen
    assert det.classes.tolist() == sorted(means)
    hand_means = torch.stack([means[c] for c in sorted(means)])
    torch.testing.assert_close(det.means, hand_means, rtol=0, atol=1e-9)
    precision = torch.linalg.pinv(cov, hermitian=True)
    for side in ("left", "right"):
        batch = padded(side, seed=42)
        got = det.score_tokens(batch)
        f = hand_features(net, module, batch)
        d = f[:, :, None, :] - hand_means[None, None]
        want = torch.einsum("btcf,fg,btcg->btc", d, precision, d).amin(dim=2)
        want = want.masked_fill(batch["attention_mask"] == 0, math.nan)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("side", ["left", "right"])
def test_nan_exactly_at_padding_and_a_row_alone_equals_batched(
    lm: tuple[torch.nn.Module, Recorder, str], side: str
) -> None:
    _, rnet, layer = lm
    det = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    det.fit(fit_batches())
    batch = padded(side, seed=7)
    scores = det.score_tokens(batch)
    assert torch.equal(scores.isnan(), batch["attention_mask"] == 0)
    rows = det(batch)
    for i, length in enumerate(LENGTHS):
        real = batch["attention_mask"][i] != 0
        ids = batch["input_ids"][i, real][None]
        alone = det.score_tokens(input_ids=ids, attention_mask=torch.ones_like(ids))
        assert alone.shape == (1, length)
        torch.testing.assert_close(
            alone[0], scores[i, real], rtol=RTOL_ACROSS_BATCHES, atol=0
        )
        torch.testing.assert_close(
            det({"input_ids": ids, "attention_mask": torch.ones_like(ids)})[0],
            rows[i],
            rtol=RTOL_ACROSS_BATCHES,
            atol=0,
        )


def test_reductions_of_the_token_scores(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    _, rnet, layer = lm
    batch = padded("left", seed=3)
    tokens = None
    for reduce in ("mean", "max", "last", 2):
        det = Mahalanobis(
            rnet, layer, token=EACH, mask="attention_mask", reduce=reduce
        ).fit(fit_batches())
        tokens = det.score_tokens(batch)
        torch.testing.assert_close(det(batch), reduce_tokens(tokens, reduce))
    assert tokens is not None
    # "last" is the last real token of a left-padded row: the last column
    last = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask", reduce="last")
    torch.testing.assert_close(last.fit(fit_batches())(batch), tokens[:, -1])


def test_save_and_load_a_per_token_detector(
    lm: tuple[torch.nn.Module, Recorder, str], tmp_path: object
) -> None:
    _, rnet, layer = lm
    det = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    det.fit(fit_batches(), target="labels")
    path = det.save(f"{tmp_path}/det.safetensors")
    again = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask").load(path)
    batch = padded("right", seed=5)
    torch.testing.assert_close(
        again.score_tokens(batch), det.score_tokens(batch), equal_nan=True
    )
    with pytest.raises(ValueError, match="config"):
        Mahalanobis(rnet, layer, token=EACH, mask="attention_mask", reduce="max").load(
            path
        )


def test_per_token_refusals(lm: tuple[torch.nn.Module, Recorder, str]) -> None:
    _, rnet, layer = lm
    with pytest.raises(ValueError, match="token must be 'each'"):
        Mahalanobis(rnet, layer, token=ALL)
    with pytest.raises(ValueError, match="reduce must be one of"):
        Mahalanobis(rnet, layer, token=EACH, reduce="median")
    with pytest.raises(ValueError, match="drop `at=`"):
        Mahalanobis(rnet, layer, token=EACH, at="predicted")
    det = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    bad = padded("left")
    bad["labels"] = torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"one class id per token, \[B, T\]"):
        det.fit([bad], target="labels")
    with pytest.raises(KeyError, match="no key 'classes'"):
        det.fit([padded("left")], target="classes")
    with pytest.raises(ValueError, match="build the detector with `token='each'`"):
        Mahalanobis(rnet, layer).score_tokens(padded("left"))


def test_a_per_token_detector_fits_alone_in_fit_detectors(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    _, rnet, layer = lm
    det = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    assert det.own_fit
    assert not Mahalanobis.own_fit
    fit_detectors([det], fit_batches())
    alone = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    torch.testing.assert_close(det.means, alone.fit(fit_batches()).means)


def _reduce_by_hand(row: list[float], reduce: str | int) -> float:
    values = [v for v in row if math.isfinite(v)]
    if not values:
        return math.nan
    if reduce == "mean":
        return sum(values) / len(values)
    if reduce == "max":
        return max(values)
    if reduce == "last":
        return values[-1]
    w = int(reduce)
    if len(values) <= w:
        return sum(values) / len(values)
    return max(sum(values[i : i + w]) / w for i in range(len(values) - w + 1))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(
            st.one_of(st.just(math.nan), st.floats(-100, 100)), min_size=5, max_size=5
        ),
        min_size=1,
        max_size=4,
    ),
    reduce=st.sampled_from(["mean", "max", "last", 1, 2, 3, 7]),
)
def test_reduce_tokens_matches_a_python_loop(
    rows: list[list[float]], reduce: str | int
) -> None:
    got = reduce_tokens(torch.tensor(rows, dtype=torch.float64), reduce)
    want = torch.tensor([_reduce_by_hand(r, reduce) for r in rows], dtype=torch.float64)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    alpha=st.floats(0.01, 0.5),
    seed=st.integers(0, 2**16),
)
def test_conformal_threshold_is_the_corrected_order_statistic(
    n: int, alpha: float, seed: int
) -> None:
    scores = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    thr = conformal_threshold(scores, alpha)
    k = math.ceil((n + 1) * (1 - Fraction(str(alpha))))  # exact arithmetic
    if k > n:
        assert thr == math.inf
    else:
        assert thr == float(scores.double().sort().values[k - 1])
        # at most alpha of the calibration scores lie above it (the bound)
        assert float((scores.double() > thr).float().mean()) <= alpha


@pytest.mark.parametrize(
    ("n", "alpha", "k"), [(149, 0.18, 123), (19, 0.7, 6), (999, 0.18, 820)]
)
def test_conformal_threshold_counts_exactly(n: int, alpha: float, k: int) -> None:
    # (n + 1)(1 - alpha) is an integer here, which float arithmetic overshoots
    # (150 * (1 - 0.18) = 123.00000000000001): the k-th score, not the next
    scores = torch.arange(1.0, n + 1.0)
    assert conformal_threshold(scores, alpha) == float(k)


def test_conformal_threshold_counts_infinite_scores() -> None:
    # a third of the calibration scores are +inf: left out, the threshold
    # would be a finite score that a third of new scores exceed, not 0.3
    scores = torch.tensor([1.0, 2.0, math.inf] * 3 + [math.nan])
    assert conformal_threshold(scores, 0.3) == math.inf  # ceil(10 * 0.7) = 7th of 9
    assert conformal_threshold(scores, 0.5) == 2.0  # ceil(10 * 0.5) = 5th
    assert conformal_threshold(-scores, 0.3) == -1.0


def test_token_arguments_spreads_one_mapping_only() -> None:
    ids = torch.ones(1, 2, dtype=torch.int64)
    assert token_arguments(({"input_ids": ids},), {})[1]["input_ids"] is ids
    assert token_arguments((ids,), {}) == ((ids,), {})
    assert VOCAB > 3  # the labels of fit_batches are classes of the vocabulary


def hand_logits(net: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The plain model's logits with Hugging Face's position ids, float64."""
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = net(
            input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions
        )
    return out.logits.to(torch.float64)


@pytest.mark.parametrize("side", ["left", "right"])
def test_surprisal_equals_the_float64_negative_log_probability(
    lm: tuple[torch.nn.Module, Recorder, str], side: str
) -> None:
    net, rnet, _ = lm
    batch = padded(side, seed=11)
    got = Surprisal(rnet).score_tokens(batch)
    logits = hand_logits(net, batch)
    mask = batch["attention_mask"]
    want = torch.full(mask.shape, math.nan, dtype=torch.float64)
    for b in range(mask.shape[0]):
        for t in range(1, mask.shape[1]):
            if mask[b, t] and mask[b, t - 1]:
                p = torch.softmax(logits[b, t - 1], dim=0)
                want[b, t] = -math.log(float(p[batch["input_ids"][b, t]]))
    # NaN at the padding and at each row's first real token, nowhere else
    first = mask.argmax(dim=1)
    assert all(got[b, int(first[b])].isnan() for b in range(mask.shape[0]))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6, equal_nan=True)
    rows = Surprisal(rnet, reduce="max")(batch)
    torch.testing.assert_close(rows, reduce_tokens(want, "max"), rtol=0, atol=1e-6)


def _gen(p: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    p = p.clamp(1e-7, 1 - 1e-7)
    return (p**gamma * (1 - p) ** gamma).mean(dim=-1)


HAND = {
    MSP: lambda z: -torch.softmax(z, -1).amax(-1),
    MaxLogit: lambda z: -z.amax(-1),
    Energy: lambda z: -torch.logsumexp(z, -1),
    Entropy: lambda z: -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1),
    GEN: lambda z: _gen(torch.softmax(z, -1)),
}


@pytest.mark.parametrize("kind", list(HAND), ids=lambda k: k.__name__)
def test_logit_detectors_score_each_next_token_distribution(
    lm: tuple[torch.nn.Module, Recorder, str], kind: type
) -> None:
    net, rnet, _ = lm
    batch = padded("left", seed=13)
    det = kind(rnet, token=EACH, mask="attention_mask", reduce="last")
    got = det.score_tokens(batch)
    want = HAND[kind](hand_logits(net, batch))
    want = want.masked_fill(batch["attention_mask"] == 0, math.nan)
    # the detectors compute in float32 from float32 logits (~1-10): a few eps
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(det(batch), want[:, -1], rtol=1e-5, atol=1e-5)
    assert kind(rnet)(**batch).shape[0] == 3  # without token=: as before


def _monitors(rnet: Recorder, layer: str) -> dict[str, TokenScoring]:
    maha = Mahalanobis(rnet, layer, token=EACH, mask="attention_mask")
    return {
        "surprisal": Surprisal(rnet),
        "maha": maha.fit(fit_batches()),
        "energy": Energy(rnet, token=EACH, mask="attention_mask"),
    }


GREEDY = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}


def test_monitor_scores_equal_the_final_sequences_token_scores(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    _, rnet, layer = lm
    batch, n = padded("left", seed=17), 6
    monitors = _monitors(rnet, layer)
    out = rnet.generate(**batch, max_new_tokens=n, **GREEDY, monitors=monitors)
    width = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones(3, n, dtype=torch.int64)], 1)
    assert out.shape == (3, width + n)
    assert rnet.monitor_stops.tolist() == [-1, -1, -1]
    for name, det in monitors.items():
        scores = rnet.monitor_scores[name]
        assert scores.shape == (3, n)
        assert not scores.isnan().any()
        full = det.score_tokens(input_ids=out, attention_mask=mask)
        # "fed": step s scores position P - 1 + s; "chosen": position P + s
        start = width - 1 if det.step_position == "fed" else width
        # a cached step against a full pass: float32 kernels differ by a few
        # eps (1.2e-7) of values ~1-50: 1e-5 absolute, as the issue asks
        torch.testing.assert_close(
            scores, full[:, start : start + n], rtol=0, atol=1e-5
        )


def test_stop_when_stops_the_rows_that_cross_and_pads_them(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    _, rnet, layer = lm
    batch, n = padded("left", seed=17), 6
    monitors = _monitors(rnet, layer)
    rnet.generate(**batch, max_new_tokens=n, **GREEDY, monitors=monitors)
    free = rnet.monitor_scores["surprisal"]
    threshold = float(free[0].median())  # row 0 crosses it within n steps
    seen: list[int] = []

    def on_step(step: MonitorStep) -> None:
        seen.append(step.step)
        assert set(step.scores) == set(monitors)

    out = rnet.generate(
        **batch,
        max_new_tokens=n,
        **GREEDY,
        monitors=monitors,
        stop_when={"surprisal": threshold},
        on_step=on_step,
    )
    stops = rnet.monitor_stops
    width = batch["input_ids"].shape[1]
    assert seen == list(range(len(seen)))
    for row in range(3):
        crossed = (free[row] > threshold).nonzero().reshape(-1)
        # greedy and deterministic: a row runs as without the monitor up to
        # its first crossing, and stops there
        expected = int(crossed[0]) if crossed.numel() else -1
        assert int(stops[row]) == expected
        if expected >= 0:
            after = out[row, width + expected + 1 :]
            assert bool((after == 0).all())  # nothing but padding after its stop
            scores = rnet.monitor_scores["surprisal"][row]
            assert scores[expected + 1 :].isnan().all()
            assert not scores[: expected + 1].isnan().any()


def test_monitor_refusals(lm: tuple[torch.nn.Module, Recorder, str]) -> None:
    _, rnet, _ = lm
    batch = padded("left")
    with pytest.raises(TypeError, match="built with `token='each'`"):
        rnet.generate(**batch, max_new_tokens=2, **GREEDY, monitors={"m": MSP(rnet)})
    with pytest.raises(KeyError, match="not a monitor"):
        rnet.generate(
            **batch,
            max_new_tokens=2,
            **GREEDY,
            monitors={"s": Surprisal(rnet)},
            stop_when={"x": 1.0},
        )


def test_a_monitored_beam_search_is_refused(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    # a beam search hands the stopping criteria 2 x num_beams candidate rows
    # per prompt, reordered between steps: no row of the batch to score
    _, rnet, _ = lm
    batch = padded("left")
    with pytest.raises(ValueError, match=r"beam search \(num_beams=2\)"):
        rnet.generate(
            **batch, max_new_tokens=2, num_beams=2, pad_token_id=0,
            monitors={"s": Surprisal(rnet)},
        )  # fmt: skip


def test_mahalanobis_ensemble_per_token_is_the_weighted_sum_of_hand_distances(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    net, rnet, layer = lm
    first = layer.replace(".1", ".0")
    data = fit_batches()
    det = MahalanobisEnsemble(
        rnet, [first, layer], token=EACH, mask="attention_mask", weights=[0.5, 2.0]
    ).fit(data, target="labels")
    batch = padded("right", seed=23)
    want = torch.zeros(batch["input_ids"].shape, dtype=torch.float64)
    for name, weight in ((first, 0.5), (layer, 2.0)):
        module = module_of(net, name)
        means, cov = hand_statistics(net, module, data, "labels")
        hand_means = torch.stack([means[c] for c in sorted(means)])
        precision = torch.linalg.pinv(cov, hermitian=True)
        d = hand_features(net, module, batch)[:, :, None, :] - hand_means[None, None]
        want += weight * torch.einsum("btcf,fg,btcg->btc", d, precision, d).amin(2)
    want = want.masked_fill(batch["attention_mask"] == 0, math.nan)
    torch.testing.assert_close(
        det.score_tokens(batch), want, rtol=0, atol=1e-6, equal_nan=True
    )
    assert "each" not in MahalanobisEnsemble(rnet, [layer]).config().values()
    with pytest.raises(ValueError, match="drop `at=`"):
        MahalanobisEnsemble(rnet, [layer], token=EACH, at="predicted")


def test_monitors_follow_num_return_sequences(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    _, rnet, _ = lm
    batch = padded("left", seed=29)
    out = rnet.generate(
        **batch,
        max_new_tokens=3,
        do_sample=True,
        num_return_sequences=2,
        pad_token_id=0,
        eos_token_id=None,
        monitors={"s": Surprisal(rnet)},
    )
    scores = rnet.monitor_scores["s"]
    assert out.shape[0] == scores.shape[0] == 6
    mask = batch["attention_mask"].repeat_interleave(2, dim=0)
    mask = torch.cat([mask, torch.ones(6, 3, dtype=torch.int64)], 1)
    full = Surprisal(rnet).score_tokens(input_ids=out, attention_mask=mask)
    width = batch["input_ids"].shape[1]
    torch.testing.assert_close(scores, full[:, width:], rtol=0, atol=1e-5)


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    left=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_row_scores_the_same_alone_and_padded_in_any_batch(
    lengths: list[int], left: bool, seed: int
) -> None:
    rnet, det = _PROPERTY["rnet"], _PROPERTY["det"]
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=gen)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        if left:
            mask[row, width - length :] = 1
        else:
            mask[row, :length] = 1
    ids = ids * mask
    surprisal = Surprisal(rnet)
    together = det.score_tokens(input_ids=ids, attention_mask=mask)
    surprised = surprisal.score_tokens(input_ids=ids, attention_mask=mask)
    assert torch.equal(together.isnan(), mask == 0)
    for row in range(len(lengths)):
        real = mask[row] != 0
        alone_ids = ids[row, real][None]
        ones = torch.ones_like(alone_ids)
        torch.testing.assert_close(
            det.score_tokens(input_ids=alone_ids, attention_mask=ones)[0],
            together[row, real],
            rtol=RTOL_ACROSS_BATCHES,
            atol=0,
        )
        # surprisals (~4) of float32 logits: a few float32 eps of the logits
        torch.testing.assert_close(
            surprisal.score_tokens(input_ids=alone_ids, attention_mask=ones)[0],
            surprised[row, real],
            rtol=0,
            atol=1e-5,
            equal_nan=True,
        )


def _property_setup() -> dict[str, object]:
    rnet = Recorder(llama(), input_data=padded("left"))
    det = Mahalanobis(rnet, "model.layers.1", token=EACH, mask="attention_mask")
    return {"rnet": rnet, "det": det.fit(fit_batches())}


class _Lazy(dict):
    """The property test's recorder and detector, built on first use."""

    def __missing__(self, key: str) -> object:
        self.update(_property_setup())
        return self[key]


_PROPERTY = _Lazy()


def test_dknn_per_token_counts_each_tokens_neighbours_by_hand(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    net, rnet, layer = lm
    data, k = fit_batches(), 5
    det = DkNN(rnet, [layer], k=k, token=EACH, mask="attention_mask")
    det.fit(data, target="input_ids")
    module = module_of(net, layer)
    bank = torch.cat(
        [hand_features(net, module, b)[b["attention_mask"] != 0] for b in data]
    )
    labels = torch.cat([b["input_ids"][b["attention_mask"] != 0] for b in data])
    batch = padded("left", seed=31)
    queries = hand_features(net, module, batch)
    want = torch.full(batch["input_ids"].shape, math.nan, dtype=torch.float64)
    for b, t in (batch["attention_mask"] != 0).nonzero().tolist():
        distances = (bank - queries[b, t]).pow(2).sum(dim=1)
        near = distances.argsort(stable=True)[:k]
        want[b, t] = -float(torch.bincount(labels[near]).max())
    got = det.score_tokens(batch)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="drop `aggregation=`"):
        DkNN(rnet, [layer], k=k, token=EACH, aggregation="fisher")


def test_stop_when_over_a_window_and_rows_stopped_by_on_step(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    _, rnet, _ = lm
    batch, n = padded("left", seed=37), 6
    surprisal = Surprisal(rnet)
    options = {"max_new_tokens": n, **GREEDY, "monitors": {"s": surprisal}}
    rnet.generate(**batch, **options)
    free = rnet.monitor_scores["s"]
    pairs = (free[:, 1:] + free[:, :-1]) / 2  # step s >= 1: mean of s - 1 and s
    threshold = float(pairs[1].median())
    rnet.generate(**batch, **options, stop_when={"s": (threshold, 2)})
    for row in range(3):
        # step 0's window holds step 0 alone
        levels = torch.cat([free[row, :1], pairs[row]])
        crossed = (levels > threshold).nonzero().reshape(-1)
        expected = int(crossed[0]) if crossed.numel() else -1
        assert int(rnet.monitor_stops[row]) == expected

    def abstain(step: MonitorStep) -> torch.Tensor | None:
        return torch.tensor([False, True, False]) if step.step == 2 else None

    out = rnet.generate(**batch, **options, on_step=abstain)
    assert rnet.monitor_stops.tolist() == [-1, 2, -1]
    width = batch["input_ids"].shape[1]
    assert bool((out[1, width + 3 :] == 0).all())
    assert rnet.monitor_scores["s"][1, 3:].isnan().all()
    assert not rnet.monitor_scores["s"][[0, 2]].isnan().any()
    # one value for every row is not broadcast: it would stop them all
    for wrong in ([True], torch.tensor([1, 0, 0])):
        with pytest.raises(ValueError, match="a bool tensor of one value per row"):
            rnet.generate(**batch, **options, on_step=lambda _step, w=wrong: w)


def _kl_tests(counts: torch.Tensor, expected: torch.Tensor, k: int) -> torch.Tensor:
    """KL(counts / k || expected_c / sum), float64 ``[Q, C]``, written out."""
    out = torch.zeros(counts.shape[0], expected.shape[0], dtype=torch.float64)
    for q in range(counts.shape[0]):
        for c in range(expected.shape[0]):
            total, e = 0.0, expected[c] / expected[c].sum()
            for j in range(counts.shape[1]):
                n = float(counts[q, j]) / k
                if n > 0:
                    total += math.inf if e[j] == 0 else n * math.log(n / float(e[j]))
            out[q, c] = total
    return out


def test_jtla_per_token_tests_each_token_against_the_classes_by_hand(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    net, rnet, layer = lm
    data, k = fit_batches(), 5
    det = JTLA(
        rnet,
        [layer],
        test={"type": "multinomial", "k": k},
        token=EACH,
        mask="attention_mask",
    )
    assert not det.pred_conditional
    det.fit(data, target="labels")
    module = module_of(net, layer)

    def unit(f: torch.Tensor) -> torch.Tensor:  # scio's act_norm=2
        return f / f.norm(dim=-1, keepdim=True)

    bank = unit(
        torch.cat(
            [hand_features(net, module, b)[b["attention_mask"] != 0] for b in data]
        )
    )
    labels = torch.cat([b["labels"][b["attention_mask"] != 0] for b in data])
    n, classes = len(labels), int(labels.max()) + 1

    def counts_of(queries: torch.Tensor, *, loo: bool) -> torch.Tensor:
        found = torch.zeros(len(queries), classes, dtype=torch.int64)
        for q, z in enumerate(queries):
            products = bank @ z
            if loo:
                products[q] = -math.inf
            near = (-products).argsort(stable=True)[:k]  # largest inner products
            found[q] = torch.bincount(labels[near], minlength=classes)
        return found

    own = counts_of(bank, loo=True)
    expected = torch.stack(
        [own[labels == c].sum(dim=0).double() for c in range(classes)]
    )
    reference = _kl_tests(own, expected, k)  # [N, C]
    batch = padded("right", seed=29)
    real = batch["attention_mask"] != 0
    queries = unit(hand_features(net, module, batch)[real])
    tests = _kl_tests(counts_of(queries, loo=False), expected, k)
    p = (reference[None] >= tests[:, None]).sum(dim=1).double() / n  # [Q, C]
    want = torch.full(real.shape, math.nan, dtype=torch.float64)
    want[real] = -p.log().amax(dim=1)  # fisher over one layer: log p
    got = det.score_tokens(batch)
    # Equal count vectors test equal both ways; the float32 neighbours of the
    # detector are the float64 ones here (no near-ties), so p agrees to the
    # rounding of the tests' tie tolerance: a few float64 eps.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12, equal_nan=True)
    with pytest.raises(ValueError, match="drop `pred_conditional=`"):
        JTLA(
            rnet,
            [layer],
            test={"type": "multinomial", "k": k},
            token=EACH,
            pred_conditional=True,
        )


def test_jtla_per_token_row_alone_equals_padded() -> None:
    rnet = Recorder(llama(), input_data=padded("left"))
    det = JTLA(
        rnet,
        ["model.layers.1"],
        test={"type": "multinomial", "k": 5},
        token=EACH,
        mask="attention_mask",
        reduce="max",
    ).fit(fit_batches(), target="labels")
    for side in ("left", "right"):
        batch = padded(side, seed=13)
        scores, rows = det.score_tokens(batch), det(batch)
        assert torch.equal(scores.isnan(), batch["attention_mask"] == 0)
        for i in range(len(LENGTHS)):
            real = batch["attention_mask"][i] != 0
            ids = batch["input_ids"][i, real][None]
            alone = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            # neighbours of float32 features: the same sets alone and padded
            # (features a few eps apart, no near-ties), so equal p-values
            torch.testing.assert_close(
                det.score_tokens(alone)[0], scores[i, real], rtol=0, atol=1e-12
            )
            torch.testing.assert_close(det(alone)[0], rows[i], rtol=0, atol=1e-12)


def test_detectors_without_a_per_token_reading_say_why() -> None:
    rnet = Recorder(gpt2(), input_data=padded("left"))
    with pytest.raises(ValueError, match=r"NAC: token=.each. has no per-token.*Surp"):
        NAC(rnet, ["transformer.h.1"], token=EACH)
    with pytest.raises(ValueError, match="NAC: token='each'"):
        NAC(rnet, ["transformer.h.0", "transformer.h.1"], token=["cls", EACH])
    with pytest.raises(ValueError, match=r"EigenScore: token=.each. has no.*Surp"):
        EigenScore(rnet, "transformer.h.1", samples=3, token=EACH)


def test_surprisal_monitor_scores_a_step_without_a_pass(
    lm: tuple[torch.nn.Module, Recorder, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    net, rnet, _ = lm
    batch, n = padded("left", seed=19), 5
    det = Surprisal(rnet)

    def refuse(*_args: object, **_kwargs: object) -> torch.Tensor:
        msg = "a pass built for a generation step"
        raise AssertionError(msg)

    with monkeypatch.context() as patch:
        patch.setattr(Surprisal, "token_scores", refuse)
        out = rnet.generate(**batch, max_new_tokens=n, **GREEDY, monitors={"s": det})
    width = batch["input_ids"].shape[1]
    mask = torch.cat([batch["attention_mask"], torch.ones(3, n, dtype=torch.int64)], 1)
    logits = hand_logits(net, {"input_ids": out, "attention_mask": mask})
    want = torch.empty(3, n, dtype=torch.float64)
    for b in range(3):
        for s in range(n):
            p = torch.softmax(logits[b, width - 1 + s], dim=0)
            want[b, s] = -math.log(float(p[out[b, width + s]]))
    # a cached step against a full pass: float32 logits a few eps (1.2e-7) of
    # values ~1-50 apart, the step's float32 sum ~1e-7: 1e-5 absolute
    torch.testing.assert_close(rnet.monitor_scores["s"], want, rtol=0, atol=1e-5)


def _token_labels(batches: list[dict[str, torch.Tensor]]) -> list[dict]:
    """The batches with a 0/1 label per token (-100 at the padding)."""
    out = []
    for batch in batches:
        mask = batch["attention_mask"]
        label = (batch["input_ids"] % 2).masked_fill(mask == 0, -100)
        out.append({**{k: batch[k] for k in ("input_ids", "attention_mask")},
                    "label": label})  # fmt: skip
    return out


def test_probe_per_token_is_the_probe_of_the_hand_tokens(
    lm: tuple[torch.nn.Module, Recorder, str],
) -> None:
    net, rnet, layer = lm
    data = _token_labels(fit_batches())
    det = Probe(rnet, layer, token=EACH, steps=50).fit(data, target="label")
    module = module_of(net, layer)
    x = torch.cat([hand_features(net, module, b)[b["label"] >= 0] for b in data])
    y = torch.cat([b["label"][b["label"] >= 0] for b in data])
    hand = Probe(rnet, layer, steps=50).fit_features(x, y)
    for key, value in hand.params.items():
        # the same float32 features, widened; L-BFGS from the same seed
        torch.testing.assert_close(det.params[key], value, rtol=1e-6, atol=1e-9)
    batch = padded("left", seed=23)
    f = hand_features(net, module, batch)
    p = det.params
    want = ((f - p["mean"]) / p["std"]) @ p["w"] + p["b"]  # a logistic probe
    want = want.masked_fill(batch["attention_mask"] == 0, math.nan)
    got = det.score_tokens(batch)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6, equal_nan=True)
    with pytest.raises(ValueError, match=r"one 0/1 label per token"):
        det.fit([{**data[0], "label": data[0]["label"][:, 1:]}], target="label")


def test_probe_per_token_row_alone_equals_padded() -> None:
    rnet = Recorder(llama(), input_data=padded("left"))
    det = Probe(rnet, "model.layers.1", token=EACH, reduce=2, steps=50)
    det.fit(_token_labels(fit_batches()), target="label")
    for side in ("left", "right"):
        batch = padded(side, seed=3)
        scores, rows = det.score_tokens(batch), det(batch)
        assert torch.equal(scores.isnan(), batch["attention_mask"] == 0)
        for i in range(len(LENGTHS)):
            real = batch["attention_mask"][i] != 0
            ids = batch["input_ids"][i, real][None]
            alone = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            # float32 features a few eps (1.2e-7) apart across batch shapes,
            # standardised and weighed by a probe of weights ~1 over d = 16
            # features: logits ~1e-6 apart; 1e-5 with a margin
            torch.testing.assert_close(
                det.score_tokens(alone)[0], scores[i, real],
                rtol=RTOL_ACROSS_BATCHES, atol=1e-5,
            )  # fmt: skip
            torch.testing.assert_close(
                det(alone)[0], rows[i], rtol=RTOL_ACROSS_BATCHES, atol=1e-5
            )


def test_save_and_load_per_token_jtla_and_probe(tmp_path: object) -> None:
    rnet = Recorder(gpt2(), input_data=padded("left"))
    layer, test = "transformer.h.1", {"type": "multinomial", "k": 5}
    jtla = JTLA(rnet, [layer], test=test, token=EACH, mask="attention_mask")
    jtla.fit(fit_batches(), target="labels")
    probe = Probe(rnet, layer, token=EACH, reduce="max", steps=20)
    probe.fit(_token_labels(fit_batches()), target="label")
    batch = padded("right", seed=5)
    for name, det, fresh in (
        ("jtla", jtla, JTLA(rnet, [layer], test=test, token=EACH,
                            mask="attention_mask")),
        ("probe", probe, Probe(rnet, layer, token=EACH, reduce="max", steps=20)),
    ):  # fmt: skip
        again = fresh.load(det.save(f"{tmp_path}/{name}.safetensors"))
        torch.testing.assert_close(
            again.score_tokens(batch), det.score_tokens(batch), equal_nan=True
        )
        torch.testing.assert_close(again(batch), det(batch), equal_nan=True)
