"""NAC against OpenOOD's NAC, the authors' code, written out by hand.

The oracle follows OpenOOD v1.5's ``nac`` postprocessor as the authors
published it (``openood/postprocessors/nac/``: ``KMNC``, ``Estimator``,
``StatePooling``, ``kl_grad``, ``get_state_func("sigmoid(o*g_kl)")``),
read for its formula, not copied: forward hooks keep each layer's output,
the gradient of ``sum_samples sum_c -(1/C) log softmax(logits)_c`` with
respect to it is taken, both are pooled as ``StatePooling`` does (a map:
**summed** over ``H, W``; a ViT block's tokens: summed; the final layer
norm: its first token; ``[B, F]``: as is), the state is ``1 / (1 +
exp(-sig_alpha * o * g))``; the thresholds are ``logspace(1e3, M)``; the fit
counts the states in ``[t_i, t_{i+1})``; the coverage is ``min(count / O,
1)``; a sample's score is the sum over bins of its bins' coverage, averaged
over neurons, then over layers.

Both sides take the same float32 outputs and gradients from the same net;
the oracle pools in float64 (the formula, not OpenOOD's float32 rounding),
as ours does. The states agree to float64 rounding and fall in the same
bins, so the scores (means of multiples of ``1 / O``) agree to 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scio_recorder import Recorder
from scio_recorder.models import demo_model, vit_tiny
from scio_recorder.ood import NAC, MahalanobisEnsemble

F64 = torch.float64


def openood_thresholds(m: int) -> torch.Tensor:
    """OpenOOD's ``logspace(1e3, M)``: log-spaced near 0, mirrored near 1."""
    num = m // 2
    x = np.linspace(1, np.sqrt(1e3), num=num)
    low = np.log(x) / np.log(1e3)
    edges = np.concatenate([low[:-1], (1 - low)[::-1]])
    edges[-1] += 1e-2
    return torch.from_numpy(np.append(edges, 1.2))


def openood_states(net, layers, x, sig_alpha):
    """Each layer's states ``[B, N]``: ``layers`` is ``[(module, pooling)]``."""
    kept = {}
    handles = [
        module.register_forward_hook(lambda m, _args, out: kept.__setitem__(m, out))
        for module, _ in layers
    ]
    try:
        logits = net(x)
    finally:
        for handle in handles:
            handle.remove()
    outs = [kept[module] for module, _ in layers]
    uniform = torch.ones_like(logits) / logits.shape[-1]
    loss = torch.sum(-uniform * torch.log_softmax(logits, dim=-1), dim=-1)
    grads = torch.autograd.grad(loss.sum(), outs)
    states = []
    for (_, pooling), out, grad, alpha in zip(
        layers, outs, grads, sig_alpha, strict=True
    ):
        o, g = out.detach().to(F64), grad.to(F64)
        if pooling == "map":  # avg_pooling: a sum over H, W
            o, g = o.sum(dim=(2, 3)), g.sum(dim=(2, 3))
        elif pooling == "tokens":  # pooling_vit_mlp, "avg": a sum over tokens
            o, g = o.sum(dim=1), g.sum(dim=1)
        elif pooling == "first":  # the final layer norm: the CLS token
            o, g = o[:, 0], g[:, 0]
        states.append(1 / (1 + torch.exp(-alpha * o * g)))
    return states


def openood_nac(net, layers, fit_batches, x, *, sig_alpha, m, o):
    """OpenOOD's coverage scores of ``x`` (higher: in-distribution)."""
    t = openood_thresholds(m)
    low, high = t[:-1, None], t[1:, None]
    t_act = None
    for xb in fit_batches:
        states = openood_states(net, layers, xb, sig_alpha)
        acts = [((s[:, None] >= low) & (s[:, None] < high)).sum(0) for s in states]
        t_act = (
            acts if t_act is None else [a + b for a, b in zip(t_act, acts, strict=True)]
        )
    scores = torch.zeros(x.shape[0], dtype=F64)
    for s, act in zip(openood_states(net, layers, x, sig_alpha), t_act, strict=True):
        coverage = (act.to(F64) / o).clamp(max=1.0)  # min(count / O, 1)
        hit = (s[:, None] >= low) & (s[:, None] < high)
        scores += (hit * coverage[None]).sum(dim=1).mean(dim=1) / len(layers)
    return scores


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    net = demo_model(3).eval()
    gen = torch.Generator().manual_seed(1)
    fit = [torch.randn(24, 3, 32, 32, generator=gen) for _ in range(3)]
    return net, fit, torch.randn(6, 3, 32, 32, generator=gen)


CNN_LAYERS = ["features.1", "features.5", "classifier.2"]  # map, pooled map, flat
CNN_ALPHA = [100.0, 1e5, 1e6]  # OpenOOD tunes sig_alpha per layer, as here


def cnn_oracle_layers(net):
    return [
        (net.features[1], "map"),
        (net.features[5], "map"),
        (net.classifier[2], "flat"),
    ]


def test_nac_with_sum_pooling_is_openoods_nac_on_a_cnn(cnn):
    net, fit, x = cnn
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    nac = NAC(rnet, CNN_LAYERS, pool="sum", alpha=CNN_ALPHA, m_bins=20, o_star=10)
    got = nac.fit(fit, input=None)(x)
    want = openood_nac(
        net, cnn_oracle_layers(net), fit, x, sig_alpha=CNN_ALPHA, m=20, o=10
    )
    assert len(set(want.tolist())) == len(x)  # states spread over the bins
    torch.testing.assert_close(got, -want, rtol=1e-12, atol=1e-12)


def test_nac_default_mean_is_openoods_with_alpha_over_the_map_size_squared(cnn):
    net, fit, x = cnn
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    alpha = [1e8, 1e5, 1e6]
    got = NAC(rnet, CNN_LAYERS, alpha=alpha, m_bins=20, o_star=10).fit(fit, input=None)(
        x
    )
    # features.1 is 32 x 32: OpenOOD sums over 1024 positions, twice
    sig_alpha = [alpha[0] / 1024**2, alpha[1], alpha[2]]
    want = openood_nac(
        net, cnn_oracle_layers(net), fit, x, sig_alpha=sig_alpha, m=20, o=10
    )
    # The mean and the scaled sum round apart (float64): bins agree.
    torch.testing.assert_close(got, -want, rtol=1e-12, atol=1e-12)


def test_nac_is_openoods_nac_on_a_vit():
    torch.manual_seed(0)
    net = vit_tiny().eval()
    gen = torch.Generator().manual_seed(1)
    fit = [torch.randn(24, 3, 32, 32, generator=gen) for _ in range(2)]
    x = torch.randn(6, 3, 32, 32, generator=gen)
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    alpha = [50.0, 50.0, 150.0]
    # OpenOOD's ViT layers: each block's ln_2 (tokens summed), the final ln
    # (first token).
    nac = NAC(
        rnet,
        ["encoder.layers.0.norm2", "encoder.layers.1.norm2", "norm"],
        pool="sum",
        token=["sum", "sum", "cls"],
        alpha=alpha,
        m_bins=20,
        o_star=5,
    )
    got = nac.fit(fit, input=None)(x)
    layers = [
        (net.encoder.layers[0].norm2, "tokens"),
        (net.encoder.layers[1].norm2, "tokens"),
        (net.norm, "first"),
    ]
    want = openood_nac(net, layers, fit, x, sig_alpha=alpha, m=20, o=5)
    assert len(set(want.tolist())) == len(x)
    torch.testing.assert_close(got, -want, rtol=1e-12, atol=1e-12)
    assert nac.config()["token"] == ["sum", "sum", "cls"]


def test_nac_refuses_an_unknown_pooling_naming_it():
    rnet = Recorder(demo_model(3), input_size=(1, 3, 32, 32))
    with pytest.raises(
        ValueError,
        match=r"^NAC: token must be one of \['cls', 'mean', 'sum', 'last'\], got 'max'",
    ):
        NAC(rnet, ["features.1", "classifier.2"], token=["sum", "max"])
    with pytest.raises(ValueError, match=r"^NAC: token has 3 values for 2 layers"):
        NAC(rnet, ["features.1", "classifier.2"], token=["sum"] * 3)
    with pytest.raises(
        ValueError, match=r"^MahalanobisEnsemble: pool must be one of \['mean', None\]"
    ):
        MahalanobisEnsemble(rnet, ["features.1"], pool="sum")
