"""ReAct's variants: symmetric clipping, several layers, one threshold or one each.

Oracles: the thresholds are ``torch.quantile`` (linear) of the activations
recorded by a plain forward hook, pooled over the layers for a shared
threshold; the scores are the energy of the net run by hand with the
layers clamped (``nn.Sequential`` sliced). The clipped pass and the hand
run compute the same float32 ops in the same order: equal bit for bit.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import ReAct
from scio_recorder.reduce import quantile_rank_bound

F64 = torch.float64


@pytest.fixture
def setup():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(4, 16), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 3)
    ).eval()
    return net, Recorder(net, input_size=(1, 4)), [torch.randn(50, 4)]


def outputs(net, x, upto):
    with torch.no_grad():
        return net[:upto](x)


def energy(logits):
    return -torch.logsumexp(logits, dim=1)


def run_clipped(net, x, bounds):
    """The net with ``bounds[i] = (low, high)`` clamping the output of layer i."""
    with torch.no_grad():
        for i, layer in enumerate(net):
            x = layer(x)
            if i in bounds:
                low, high = bounds[i]
                x = x.clamp(min=low, max=high)
    return x


def quantiles(values, levels):
    flat = torch.cat([v.reshape(-1) for v in values]).to(F64)
    return [float(torch.quantile(flat, q)) for q in levels]


def test_symmetric_clips_from_both_quantiles(setup):
    net, rnet, train = setup
    react = ReAct(rnet, layer="0", percentile=0.8, symmetric=True).fit(
        train, input=None
    )
    low, high = quantiles([outputs(net, train[0], 1)], [0.2, 0.8])
    assert float(react.lowers[0]) == pytest.approx(low, rel=1e-6)
    assert float(react.threshold) == pytest.approx(high, rel=1e-6)
    x = 2 * torch.randn(9, 4)
    want = energy(run_clipped(net, x, {0: (react.lowers[0], react.thresholds[0])}))
    assert torch.equal(react(x), want)


def test_several_layers_share_one_threshold_by_default(setup):
    net, rnet, train = setup
    react = ReAct(rnet, layers=["0", "1"], percentile=0.9).fit(train, input=None)
    (high,) = quantiles([outputs(net, train[0], 1), outputs(net, train[0], 2)], [0.9])
    assert react.thresholds.shape == (1,)
    assert float(react.threshold) == pytest.approx(high, rel=1e-6)
    x = 2 * torch.randn(9, 4)
    t = react.threshold
    assert torch.equal(
        react(x), energy(run_clipped(net, x, {0: (None, t), 1: (None, t)}))
    )


def test_per_layer_thresholds_with_a_percentile_each(setup):
    net, rnet, train = setup
    react = ReAct(
        rnet, layers=["0", "1"], percentile=[0.7, 0.95], symmetric=True, per_layer=True
    ).fit(train, input=None)
    bounds = {}
    for i, (upto, level) in enumerate(((1, 0.7), (2, 0.95))):
        low, high = quantiles([outputs(net, train[0], upto)], [1 - level, level])
        assert float(react.lowers[i]) == pytest.approx(low, rel=1e-6)
        assert float(react.thresholds[i]) == pytest.approx(high, rel=1e-6)
        bounds[i] = (react.lowers[i], react.thresholds[i])
    x = 2 * torch.randn(9, 4)
    assert torch.equal(react(x), energy(run_clipped(net, x, bounds)))


def test_the_sketch_pools_layers_too(setup):
    net, rnet, train = setup
    react = ReAct(rnet, layers=["0", "1"], exact=False).fit(train, input=None)
    values = torch.cat(
        [outputs(net, train[0], 1).reshape(-1), outputs(net, train[0], 2).reshape(-1)]
    )
    # The sketch's proven rank bound, on the pooled stream of both layers.
    rank = int((values < react.threshold).sum())
    bound = quantile_rank_bound(len(values), 1024)
    assert abs(rank - 0.9 * len(values)) <= bound + 1


def test_variants_save_and_load(setup, tmp_path):
    _, rnet, train = setup
    react = ReAct(rnet, layers=["0", "1"], symmetric=True, per_layer=True)
    react.fit(train, input=None)
    path = react.save(tmp_path / "react.safetensors")
    again = ReAct(rnet, layers=["0", "1"], symmetric=True, per_layer=True).load(path)
    x = torch.randn(5, 4)
    assert torch.equal(again(x), react(x))
    with pytest.raises(
        ValueError, match=r"configured otherwise \(per_layer, symmetric"
    ):
        ReAct(rnet, layers=["0", "1"]).load(path)
    single = ReAct(rnet, layer="0").fit(train, input=None)
    assert set(single.state()) == {"threshold"}
    assert single.config() == {"layer": [1, 1], "percentile": 0.9, "exact": True}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "ReAct: give the layer to clip, `layer=`, or several, `layers=[...]`"),
        (
            {"layer": "0", "layers": ["1"]},
            "ReAct: give the layer to clip, `layer=`, or several, `layers=[...]`",
        ),
        (
            {"layer": "0", "symmetric": True, "percentile": 0.4},
            (
                "ReAct: symmetric clipping needs percentile > 0.5 (the lower "
                "threshold is the 1 - percentile quantile), got 0.4"
            ),
        ),
        (
            {"layers": ["0", "1"], "percentile": [0.9, 0.8]},
            (
                "ReAct: percentile is [0.9, 0.8]; give one fraction, or one per "
                "layer (2) with `per_layer=True`."
            ),
        ),
    ],
)
def test_react_refuses_what_it_cannot_do(setup, options, message):
    _, rnet, _ = setup
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        ReAct(rnet, **options)
