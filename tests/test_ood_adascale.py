"""AdaScale against AdaSCALE's formula written out by hand.

The oracle follows the paper's code (OpenOOD v1.5's ``adascale_a`` and
``adascale_l`` postprocessors and ``AdaScaleANet``/``AdaScaleLNet``), read
for the formula: the gradient of the predicted logit with respect to the
input; the fraction ``o`` of input entries with the smallest ``|grad|``
moved by ``0.5 sign(grad)``; ``Q' = sum_{top-k1(f)} relu(f') + lambda
sum_{top-k2(f)} |f - f'|``; ``p = p_min + (1 - ECDF(Q')) (p_max - p_min)``
over the fit samples' ``Q'``; ``s = sum relu(f) / sum of its top ``n -
round(n p)``; A: ``-logsumexp(fc(f exp(s)))``, L: ``-logsumexp(fc(f) s^2)``.
The net is cut by hand (``net.body``, ``net.fc``), the perturbation and the
ECDF are plain torch ops.

Both sides take the same float32 features from the same inputs (the
gradients of the same ops); ``Q'``, the ECDF and the scale are float64 on
both sides. The scores differ by the rounding of the last float32 layer on
other shapes: rtol 1e-5.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import AdaScale, Scale, evaluate, fit_detectors
from scio_recorder.ood._adascale import ada_scale

F64 = torch.float64


class Net(nn.Module):
    """Convolutions, a 100-unit penultimate ReLU, then the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(32, 100),
            nn.ReLU(),
        )
        self.fc = nn.Linear(100, 4)

    def forward(self, x):
        return self.fc(self.body(x))


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    net = Net().eval()
    gen = torch.Generator().manual_seed(1)
    fit = [torch.randn(16, 3, 6, 6, generator=gen) for _ in range(3)]
    x = torch.randn(7, 3, 6, 6, generator=gen)
    return net, Recorder(net, input_size=(1, 3, 6, 6)), fit, x


def pair(net, x, o=0.05, step=0.5):
    """The logits, f and f' of the paper, by hand."""
    leaf = x.clone().requires_grad_()
    logits = net(leaf)
    top = logits[torch.arange(len(x)), logits.argmax(1)]
    (grad,) = torch.autograd.grad(top.sum(), leaf)
    flat = grad.abs().flatten(1)
    n = int(flat.shape[1] * o)
    index = torch.topk(flat, n, dim=1, largest=False).indices
    mask = torch.zeros_like(flat).scatter(1, index, 1.0).view_as(x)
    moved = x + grad.sign() * mask * step
    with torch.no_grad():
        return logits.detach(), net.body(x), net.body(moved)


def q_prime(f, moved, k1=5, k2=1, lam=10.0):
    """Q' with OpenOOD's k1 = 5 %, k2 = 1 % of 100 features: 5 and 1."""
    f, moved = f.to(F64), moved.to(F64)
    kept = torch.relu(moved).gather(1, f.topk(k1, dim=1).indices).sum(1)
    shift = (f - moved).abs().gather(1, f.topk(k2, dim=1).indices).sum(1)
    return kept + lam * shift


def adascale_oracle(net, fit, x, variant, *, low=0.75, high=0.85):
    fitted = torch.cat([q_prime(*pair(net, xb)[1:]) for xb in fit])
    logits, f, moved = pair(net, x)
    q = q_prime(f, moved)
    ecdf = (fitted[None, :] <= q[:, None]).to(F64).mean(dim=1)
    p = low + (1 - ecdf) * (high - low)
    active = torch.relu(f).to(F64)
    n = active.shape[1]
    ks = (n - torch.round(n * p)).long()
    top = torch.stack([active[i].topk(int(k)).values.sum() for i, k in enumerate(ks)])
    scale = active.sum(1) / top
    with torch.no_grad():
        if variant == "A":
            z = net.fc(f * torch.exp(scale).float()[:, None])
        else:
            z = logits * scale.float()[:, None] ** 2
    return -torch.logsumexp(z, dim=1), p


@pytest.mark.parametrize("variant", ["A", "L"])
def test_adascale_is_the_papers_formula(setup, variant):
    net, rnet, fit, x = setup
    ada = AdaScale(rnet, "body.5", variant=variant).fit(fit, input=None)
    want, p = adascale_oracle(net, fit, x, variant)
    assert len(set(p.tolist())) > 3  # the percentile does adapt
    torch.testing.assert_close(ada(x), want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ada.bank, ada.bank.sort().values)
    assert len(ada.bank) == 48


def test_adascale_with_a_fixed_percentile_is_scale(setup):
    # p_min = p_max: every sample's percentile is p, as SCALE's (Xu et al.)
    # on non-negative activations.
    _, rnet, fit, x = setup
    ada = AdaScale(rnet, "body.5", percentiles=(0.65, 0.65)).fit(fit, input=None)
    torch.testing.assert_close(ada(x), Scale(rnet, "body.5")(x), rtol=1e-5, atol=1e-6)


def test_ada_scale_keeps_at_least_one_value():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    # round(4 * 0.9) = 4: OpenOOD's top-0 sum would divide by zero.
    assert ada_scale(x, torch.tensor([0.9])).tolist() == [2.5]


def test_adascale_shares_evaluate_saves_and_loads(setup, tmp_path):
    net, rnet, fit, x = setup
    ada = AdaScale(rnet, "body.5", variant="L", lmbda=1.0)
    scale = Scale(rnet, "body.5")
    fit_detectors([ada, scale], fit, input=None)  # AdaScale fits on its own
    assert ada.fitted
    result = evaluate({"ada": ada, "scale": scale}, [x], [3 * x], input=None)
    assert set(result) == {"ada", "scale"}
    assert all(p.grad is None for p in net.parameters())
    path = ada.save(tmp_path / "ada.safetensors")
    again = AdaScale(rnet, "body.5", variant="L", lmbda=1.0).load(path)
    assert torch.equal(again(x), ada(x))
    with pytest.raises(ValueError, match=r"configured otherwise \(variant: saved"):
        AdaScale(rnet, "body.5", lmbda=1.0).load(path)


def test_adascale_follows_the_data_rules(setup):
    _, rnet, fit, x = setup
    ada = AdaScale(rnet, "body.5").fit(fit, input=None)
    hostile = x.clone()
    hostile[2, 0, 0, 0] = float("nan")
    scores = ada(hostile)
    assert torch.isnan(scores[2])
    torch.testing.assert_close(scores[[0, 1, 3]], ada(x)[[0, 1, 3]], rtol=1e-6, atol=0)
    assert ada(x[:0]).shape == (0,)
    bad = [fit[0], hostile]
    with pytest.raises(
        ValueError,
        match=r"^AdaScale: 1 of the 23 fit samples have non-finite features "
        r"\(NaN or Inf\) at layer 2-6 \(ReLU `body.5`\) \(output\)",
    ):
        AdaScale(rnet, "body.5").fit(bad, input=None)


def test_adascale_refuses_bad_hyperparameters_naming_them(setup):
    _, rnet, fit, _ = setup
    cases = {
        "variant must be one of ['A', 'L'], got 'B'": {"variant": "B"},
        "percentiles must be fractions (p_min, p_max) with 0 <= p_min <= p_max "
        "< 1, got (75, 85) (OpenOOD's [75, 85] is (0.75, 0.85))": {
            "percentiles": (75, 85)
        },
        "percentiles must be a pair of fractions (p_min, p_max), got 0.8": {
            "percentiles": 0.8
        },
        "k1 must be a fraction in (0, 1], got 5": {"k1": 5},
        "o must be a fraction in (0, 1], got 0": {"o": 0},
        "lmbda must be >= 0 and step > 0, got -1, 0.5": {"lmbda": -1},
    }
    for message, kwargs in cases.items():
        with pytest.raises(ValueError, match=f"^AdaScale: {re.escape(message)}"):
            AdaScale(rnet, "body.5", **kwargs)
    with pytest.raises(TypeError, match=r"^AdaScale\.fit runs its own gradient loop"):
        AdaScale(rnet, "body.5").fit(fit, input=None, spill_dir="x")
    with pytest.raises(
        TypeError, match=r"^AdaScale perturbs the net's first positional input"
    ):
        AdaScale(rnet, "body.5").fit([torch.zeros(2, 3, 6, 6).long()], input=None)
