"""The two regimes of per-token OoD, on a tiny GPT-2 trained here on a toy language.

The language: a walk on a ring of 32 tokens, each step +1 (probability 0.8)
or +2; language A walks the ring of tokens 0-31, language B (the fluent
shift) the ring of tokens 32-63 by the same rule. The model is trained on
both, the detectors fitted on A only.

* A random span of 5 tokens injected into an A sequence is what the model
  finds unlikely: its surprisal catches it (AUROC, and the peak is at the
  span), and a monitor with a calibrated threshold stops generation there.
* B is predicted as well as A: its mean surprisal does not tell them apart,
  while a Mahalanobis distance on the hidden states (fitted on A) does.
"""

from __future__ import annotations

import math

import pytest
import torch

from scio_recorder import Recorder
from scio_recorder.ood import Mahalanobis, Surprisal
from scio_recorder.ood.metrics import auroc

transformers = pytest.importorskip("transformers")

RING, LENGTH, SPAN = 32, 24, 5
EACH = "each"  # `token=` (named: not a password, for ruff)


def walks(n: int, offset: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` walks of LENGTH tokens on the ring starting at ``offset``."""
    start = torch.randint(0, RING, (n, 1), generator=gen)
    steps = 1 + (torch.rand(n, LENGTH - 1, generator=gen) > 0.8).long()
    return offset + (torch.cat([start, start + steps.cumsum(1)], 1) % RING)


def inject(ids: torch.Tensor, gen: torch.Generator, low: int, high: int) -> tuple:
    """Replace a span of SPAN random tokens starting in [low, high); return it."""
    out = ids.clone()
    starts = torch.randint(low, high, (ids.shape[0],), generator=gen)
    for row, start in enumerate(starts.tolist()):
        out[row, start : start + SPAN] = torch.randint(0, RING, (SPAN,), generator=gen)
    return out, starts


def train() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=2 * RING, n_positions=LENGTH,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0,
    )  # fmt: skip
    net = transformers.GPT2LMHeadModel(config)
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(200):
        ids = torch.cat([walks(24, 0, gen), walks(24, RING, gen)])
        loss = net(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()


@pytest.fixture(scope="module")
def lm() -> tuple[Recorder, torch.Generator]:
    net = train()
    gen = torch.Generator().manual_seed(2)
    return Recorder(net, input_data={"input_ids": walks(2, 0, gen)}), gen


def batches(ids: torch.Tensor, size: int = 50) -> list[dict[str, torch.Tensor]]:
    return [
        {"input_ids": part, "attention_mask": torch.ones_like(part)}
        for part in ids.split(size)
    ]


def scores(det: object, ids: torch.Tensor, method: str = "__call__") -> torch.Tensor:
    return torch.cat([getattr(det, method)(b) for b in batches(ids)])


@pytest.mark.slow
def test_surprisal_catches_an_injected_span_at_the_span(
    lm: tuple[Recorder, torch.Generator],
) -> None:
    rnet, gen = lm
    clean = walks(200, 0, gen)
    spans, starts = inject(walks(200, 0, gen), gen, 4, LENGTH - SPAN)
    det = Surprisal(rnet, reduce="max")
    rate = auroc(scores(det, clean), scores(det, spans))
    assert rate >= 0.95
    tokens = scores(det, spans, "score_tokens").nan_to_num(nan=-math.inf)
    peaks = tokens.argmax(dim=1)
    near = (peaks >= starts - SPAN) & (peaks < starts + 2 * SPAN)
    assert float(near.double().mean()) >= 0.9


@pytest.mark.slow
def test_a_fluent_shift_is_invisible_to_surprisal_and_plain_to_mahalanobis(
    lm: tuple[Recorder, torch.Generator],
) -> None:
    rnet, gen = lm
    fit, held, shifted = walks(300, 0, gen), walks(200, 0, gen), walks(200, RING, gen)
    mean = Surprisal(rnet, reduce="mean")
    assert auroc(scores(mean, held), scores(mean, shifted)) <= 0.6
    maha = Mahalanobis(rnet, token=EACH, mask="attention_mask").fit(batches(fit))
    assert auroc(scores(maha, held), scores(maha, shifted)) >= 0.95


class _Force(transformers.LogitsProcessor):
    """Make ``generate`` emit the given continuation (a forced continuation)."""

    def __init__(self, forced: torch.Tensor, prompt: int) -> None:
        self.forced, self.prompt = forced, prompt

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt
        out = torch.full_like(scores, -math.inf)
        rows = torch.arange(scores.shape[0])
        out[rows, self.forced[:, step]] = 0.0
        return out


@pytest.mark.slow
def test_a_calibrated_monitor_stops_generation_on_an_injected_span(
    lm: tuple[Recorder, torch.Generator],
) -> None:
    rnet, gen = lm
    prompt = 8
    det = Surprisal(rnet, reduce="max")
    # row level: at most alpha of in-distribution rows have a token above it
    threshold = det.calibrate(batches(walks(400, 0, gen)), alpha=0.05, per="row")
    stopped = {}
    for kind in ("clean", "span"):
        ids = walks(100, 0, gen)
        if kind == "span":
            ids, _ = inject(ids, gen, prompt + 2, LENGTH - SPAN)
        out = rnet.generate(
            input_ids=ids[:, :prompt],
            attention_mask=torch.ones_like(ids[:, :prompt]),
            max_new_tokens=LENGTH - prompt,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            logits_processor=transformers.LogitsProcessorList(
                [_Force(ids[:, prompt:], prompt)]
            ),
            monitors={"s": det},
            stop_when={"s": threshold},
        )
        stops = rnet.monitor_stops
        stopped[kind] = float((stops >= 0).double().mean())
        for row in torch.nonzero(stops >= 0).reshape(-1).tolist():
            # the forced tokens up to the stop, then nothing but padding
            at = prompt + int(stops[row])
            assert torch.equal(out[row, prompt : at + 1], ids[row, prompt : at + 1])
            assert bool((out[row, at + 1 :] == 0).all())
    assert stopped["span"] >= 0.9
    assert stopped["clean"] <= 0.1
