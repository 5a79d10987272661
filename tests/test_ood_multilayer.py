"""Multi-layer and feature-geometry detectors against their papers' formulas.

Each detector runs on the unmodified net through a Recorder; each oracle
cuts the net by hand (``net.features[:k]``, ``net.classifier[:3]``) and
writes the formula with plain torch ops. Both sides compute the features in
float32 on the same path and the statistics in float64, so they agree to the
float32 rounding of features (~1e-7 relative) amplified by the conditioning
of the statistics: rtol 1e-5 (atol where a score can cross zero). Tests
comparing with pytorch-ood run only where it is installed (not in CI).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.models import demo_model, resnet18_cifar, vit_tiny
from scio_recorder.ood import (
    NAC,
    NCI,
    NECO,
    VRA,
    Energy,
    Gram,
    MahalanobisEnsemble,
    RankFeat,
    Residual,
    evaluate,
    fit_detectors,
)
from scio_recorder.ood._gram import gram_vector
from scio_recorder.ood._layers import pool_features

F64 = torch.float64
TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture
def cnn():
    torch.manual_seed(0)
    net = demo_model(3).eval()
    return net, Recorder(net, input_size=(1, 3, 32, 32))


@pytest.fixture
def data():
    torch.manual_seed(1)
    return [(torch.randn(12, 3, 32, 32), torch.arange(12) % 3) for _ in range(2)]


_LIBRARIES: list[object] = []


def torchvision_schemas():
    """Declare torchvision's nms schemas, for pytorch-ood's comparison only.

    pytorch-ood imports torchvision, whose operator registration fails where
    torchvision's C++ part is missing; only the guarded comparison tests
    (skipped where pytorch-ood is not installed, as in CI) call this.
    """
    if _LIBRARIES:
        return
    try:
        torch.ops.torchvision.nms  # noqa: B018 (probe)
    except (AttributeError, RuntimeError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARIES.append(lib)


def penultimate(net, x):
    return net.classifier[:3](net.features(x)).to(F64)


def count_forwards(net):
    calls = []
    handle = net.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


# -- MahalanobisEnsemble ----------------------------------------------------


def ensemble_oracle(net, data, x, cuts, weights, *, normalize=False):
    """Per-layer class means and tied covariance of channel means, by hand.

    ``normalize``: Mahalanobis++ (Müller & Hein 2025), each pooled feature
    vector divided by its L2 norm first.
    """
    total = torch.zeros(x.shape[0], dtype=F64)
    xs = torch.cat([b[0] for b in data])
    ys = torch.cat([b[1] for b in data])
    for cut, w in zip(cuts, weights, strict=True):
        with torch.no_grad():
            f, g = cut(xs), cut(x)
        f = (f.mean(dim=(2, 3)) if f.dim() == 4 else f).to(F64)
        g = (g.mean(dim=(2, 3)) if g.dim() == 4 else g).to(F64)
        if normalize:
            f = f / f.norm(dim=1, keepdim=True)
            g = g / g.norm(dim=1, keepdim=True)
        means = torch.stack([f[ys == c].mean(0) for c in range(3)])
        centred = f - means[ys]
        cov = centred.T @ centred / f.shape[0]
        prec = torch.linalg.pinv(cov, hermitian=True)
        d = torch.stack([((g - m) @ prec * (g - m)).sum(1) for m in means], 1)
        total += w * d.amin(1)
    return total


def test_ensemble_matches_formula_in_one_forward(cnn, data):
    net, rnet = cnn
    layers = ["features.1", "features.4", "classifier.2"]
    ens = MahalanobisEnsemble(rnet, layers, weights=[1.0, 0.5, 2.0])
    calls, handle = count_forwards(net)
    ens.fit(data, target=1)
    assert len(calls) == len(data)  # one forward per batch, not one per layer
    x = torch.randn(5, 3, 32, 32)
    calls.clear()
    got = ens(x)
    handle.remove()
    assert len(calls) == 1
    cuts = [net.features[:2], net.features[:5], lambda t: penultimate(net, t)]
    want = ensemble_oracle(net, data, x, cuts, [1.0, 0.5, 2.0])
    # The pinv of a covariance of 8..32 features: relative error ~1e-5.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_ensemble_normalize_is_mahalanobis_plus_plus_per_layer(cnn, data, tmp_path):
    net, rnet = cnn
    layers = ["features.1", "features.4", "classifier.2"]
    ens = MahalanobisEnsemble(rnet, layers, normalize=True).fit(data, target=1)
    x = torch.randn(5, 3, 32, 32)
    cuts = [net.features[:2], net.features[:5], lambda t: penultimate(net, t)]
    want = ensemble_oracle(net, data, x, cuts, [1.0] * 3, normalize=True)
    # As above; unit vectors: distances of order 1 to 1e3.
    torch.testing.assert_close(ens(x), want, rtol=1e-4, atol=1e-6)
    plain = ensemble_oracle(net, data, x, cuts, [1.0] * 3)
    assert not torch.allclose(want, plain, rtol=1e-2)
    assert ens.config()["normalize"] is True
    path = ens.save(tmp_path / "plus.safetensors")
    with pytest.raises(
        ValueError, match=r"\(normalize: saved \[True\], now \[None\]\)"
    ):
        MahalanobisEnsemble(rnet, layers).load(path)


def test_ensemble_save_load_and_shared_passes(cnn, data, tmp_path):
    _, rnet = cnn
    ens = MahalanobisEnsemble(rnet, ["features.1", "features.4"], shrinkage=0.1)
    nci = NCI(rnet, alpha=0.01)
    fit_detectors([ens, nci], data, target=1)
    x = torch.randn(4, 3, 32, 32)
    path = ens.save(tmp_path / "ens.safetensors")
    again = MahalanobisEnsemble(rnet, ["features.1", "features.4"], shrinkage=0.1)
    assert torch.equal(again.load(path)(x), ens(x))
    with pytest.raises(ValueError, match="shrinkage"):
        MahalanobisEnsemble(rnet, ["features.1", "features.4"]).load(path)
    result = evaluate(
        {"ens": ens, "nci": nci, "energy": Energy(rnet)},
        [x],
        [3 * x],
        input=None,
    )
    assert set(result) == {"ens", "nci", "energy"}


def test_layers_errors_name_the_layer(cnn):
    _, rnet = cnn
    with pytest.raises(ValueError, match="non-empty list of selectors"):
        MahalanobisEnsemble(rnet, [])
    with pytest.raises(ValueError, match=r"'features\.1' and .* are the same call"):
        MahalanobisEnsemble(rnet, ["features.1", (2, 2)])
    with pytest.raises(ValueError, match="2 weights for 1 layers"):
        MahalanobisEnsemble(rnet, ["features.1"], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="pool must be one of"):
        MahalanobisEnsemble(rnet, ["features.1"], pool="max")


def test_resnet18_ensemble_one_forward():
    torch.manual_seed(0)
    net = resnet18_cifar(2).eval()
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    layers = ["layer1", "layer2", "layer3", "layer4"]
    ens = MahalanobisEnsemble(rnet, layers, shrinkage=0.5)
    batches = [(torch.randn(6, 3, 32, 32), torch.arange(6) % 2)]
    calls, handle = count_forwards(net)
    ens.fit(batches, target=1)
    calls.clear()
    scores = ens(torch.randn(3, 3, 32, 32))
    handle.remove()
    assert len(calls) == 1
    assert scores.shape == (3,)
    assert torch.isfinite(scores).all()


# -- ViT and BERT: token features --------------------------------------------


def test_vit_cls_tokens_one_forward():
    torch.manual_seed(0)
    net = vit_tiny(3).eval()
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    # Every module the ViT calls is labelled (only the ModuleList is not called).
    assert [r.describe() for r in rnet.table.values() if not r.recordable] == [
        "2-1 (ModuleList `encoder.layers`)"
    ]
    layers = ["encoder.layers.0", "encoder.layers.1"]
    ens = MahalanobisEnsemble(rnet, layers, shrinkage=0.1)
    gram = Gram(rnet, layers, validation_fraction=0.0)
    data = [(torch.randn(12, 3, 32, 32), torch.arange(12) % 3)]
    ens.fit(data, target=1)
    gram.fit(data, target=1)
    calls, handle = count_forwards(net)
    x = torch.randn(4, 3, 32, 32)
    ens(x)
    handle.remove()
    assert len(calls) == 1
    # Oracle: the CLS token of each encoder layer's output.
    with torch.no_grad():
        t = net.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([net.cls_token.expand(4, -1, -1), t], 1) + net.pos_embed
        first = net.encoder.layers[0](t)
    got = pool_features(first)
    torch.testing.assert_close(got, first[:, 0].to(F64))
    assert torch.isfinite(gram(x)).all()


def test_bert_mean_tokens_respect_the_mask():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
    )
    net = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(1, 100, (6, 8))
    mask = torch.ones(6, 8, dtype=torch.int64)
    mask[:3, 5:] = 0
    rnet = Recorder(
        net,
        force_static_flow=False,
        input_data={"input_ids": ids[:1], "attention_mask": mask[:1]},
    )
    layers = ["bert.encoder.layer.0", "bert.encoder.layer.1"]
    ens = MahalanobisEnsemble(
        rnet,
        layers,
        token="mean",  # noqa: S106 (not a password)
        mask="attention_mask",
        shrinkage=0.1,
    )
    batches = [({"input_ids": ids, "attention_mask": mask}, torch.arange(6) % 2)]
    ens.fit(batches, input=lambda b: b[0], target=1)
    calls, handle = count_forwards(net)
    got = ens(input_ids=ids, attention_mask=mask)
    handle.remove()
    assert len(calls) == 1
    assert torch.isfinite(got).all()
    # The padding is ignored: changing padded ids moves no masked-mean feature
    # of the first layer's output... the attention also ignores them, so the
    # whole score is unchanged (float32 reductions: rtol 1e-5).
    other = ids.clone()
    other[:3, 5:] = 7
    torch.testing.assert_close(ens(input_ids=other, attention_mask=mask), got, **TOL)
    with pytest.raises(ValueError, match="no argument 'attention_mask'"):
        ens(input_ids=ids)


class MaskedTokens(nn.Module):
    """Tokens ``[B, T, 6]``, then a head on their masked mean."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x, mask):
        h = self.embed(x)
        keep = mask[..., None].to(h)
        return self.head((h * keep).sum(1) / keep.sum(1))


@pytest.mark.slow
def test_threads_scoring_with_masks_each_pool_with_their_own_mask():
    # The mask of the net's latest call was kept on the detector: a thread
    # pooled its tokens with the mask of another thread's pass.
    import threading  # noqa: PLC0415 (this test only)

    torch.manual_seed(0)
    net = MaskedTokens().eval()
    x = torch.randn(1, 5, 4)
    rnet = Recorder(net, input_data={"x": x, "mask": torch.ones(1, 5)})
    ens = MahalanobisEnsemble(rnet, ["embed"], token="mean", mask="mask")  # noqa: S106 (not a password)
    fit_x = torch.randn(40, 5, 4)
    ens.fit(
        [({"x": fit_x, "mask": torch.ones(40, 5)}, torch.arange(40) % 3)],
        input=lambda b: b[0],
        target=1,
    )
    gen = torch.Generator().manual_seed(1)
    inputs = []
    for i in range(4):
        mask = torch.ones(3 + i, 5)
        mask[:, 5 - i - 1 :] = 0  # each thread its own padding
        inputs.append((torch.randn(3 + i, 5, 4, generator=gen), mask))
    alone = [ens(x=xi, mask=mi) for xi, mi in inputs]
    barrier = threading.Barrier(4)
    errors = []

    def work(i):
        barrier.wait()
        for _ in range(10):
            got = ens(x=inputs[i][0], mask=inputs[i][1])
            if not torch.equal(got, alone[i]):  # the same path: bit for bit
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# -- Gram --------------------------------------------------------------------


def test_gram_matches_formula(cnn, data):
    net, rnet = cnn
    gram = Gram(rnet, ["features.1", "features.4"], validation_fraction=0.0)
    gram.fit(data, target=1)
    x = torch.randn(5, 3, 32, 32)
    got = gram(x)
    xs = torch.cat([b[0] for b in data])
    ys = torch.cat([b[1] for b in data])
    want = torch.zeros(5, dtype=F64)
    with torch.no_grad():
        pred = net(x).argmax(1)
        for cut in (net.features[:2], net.features[:5]):
            f, g = cut(xs).to(F64), cut(x).to(F64)
            for p in (1, 2):

                def vec(t, p=p):
                    t = (t.reshape(t.shape[0], t.shape[1], -1)) ** p
                    s = (t @ t.transpose(1, 2)).sum(2)
                    return s.sign() * s.abs() ** (1 / p)

                gf, gg = vec(f), vec(g)
                lo = torch.stack([gf[ys == c].amin(0) for c in range(3)])[pred]
                hi = torch.stack([gf[ys == c].amax(0) for c in range(3)])[pred]
                want += (torch.relu(lo - gg) / (lo + 1e-6).abs()).sum(1)
                want += (torch.relu(gg - hi) / (hi + 1e-6).abs()).sum(1)
    torch.testing.assert_close(got, want, **TOL)


def gram_vectors(t, p):
    """The Gram row sums by hand: the full ``C x C`` matrix, then its rows."""
    t = t.reshape(t.shape[0], t.shape[1], -1).to(F64) ** p
    s = (t @ t.transpose(1, 2)).sum(2)
    return s.sign() * s.abs() ** (1 / p)


def test_gram_held_out_norms_are_the_mean_deviation_of_the_held_out(cnn, data):
    net, rnet = cnn
    fraction = 0.25
    gram = Gram(rnet, ["features.1", "features.4"], validation_fraction=fraction)
    calls, handle = count_forwards(net)
    gram.fit(data, target=1)
    handle.remove()
    assert len(calls) == len(data)  # one pass: bounds and held-out together
    xs = torch.cat([b[0] for b in data])
    ys = torch.cat([b[1] for b in data])
    # One in four of each class: the j-th of its class when floor((j + 1) / 4)
    # > floor(j / 4), i.e. j = 3, 7 (8 samples per class).
    held = torch.zeros(len(xs), dtype=torch.bool)
    for c in range(3):
        where = torch.nonzero(ys == c).flatten()
        j = torch.arange(len(where), dtype=F64)
        held[where] = torch.floor((j + 1) * fraction) > torch.floor(j * fraction)
    assert int(held.sum()) == 6
    with torch.no_grad():
        for layer, cut in enumerate((net.features[:2], net.features[:5])):
            f = cut(xs)
            g = torch.cat([gram_vectors(f, p) for p in (1, 2)], dim=1)
            rest, kept = g[~held], ys[~held]
            lo = torch.stack([rest[kept == c].amin(0) for c in range(3)])
            hi = torch.stack([rest[kept == c].amax(0) for c in range(3)])
            torch.testing.assert_close(gram.mins[layer], lo, **TOL)
            torch.testing.assert_close(gram.maxs[layer], hi, **TOL)
            out, cls = g[held], ys[held]
            dev = (torch.relu(lo[cls] - out) / (lo[cls] + 1e-6).abs()).sum(1)
            dev += (torch.relu(out - hi[cls]) / (hi[cls] + 1e-6).abs()).sum(1)
            assert dev.mean() > 0
            torch.testing.assert_close(gram.norms[layer], dev.mean(), **TOL)


def test_gram_holds_out_a_fraction_of_every_class_whatever_the_order():
    # Labels 0..9 in turn: one sample in ten of the stream would be class 9
    # every time; a fraction of each class keeps every class's bounds.
    torch.manual_seed(3)
    rnet = Recorder(demo_model(10).eval(), input_size=(1, 3, 32, 32))
    periodic = [(torch.randn(40, 3, 32, 32), torch.arange(40) % 10)]
    gram = Gram(rnet, ["features.1"], validation_fraction=0.1)
    gram.fit(periodic, target=1)
    assert gram.mins[0].shape[0] == 10
    assert gram.norms[0] > 0


def test_gram_round_trip(cnn, data, tmp_path):
    _, rnet = cnn
    gram = Gram(rnet, ["features.1", "features.4"]).fit(data, target=1)
    assert gram.norms.shape == (2,)
    x = torch.randn(3, 3, 32, 32)
    path = gram.save(tmp_path / "g.safetensors")
    again = Gram(rnet, ["features.1", "features.4"]).load(path)
    assert torch.equal(again(x), gram(x))


def test_gram_vector_signed_root():
    x = torch.tensor([[[[1.0, -2.0]], [[0.0, 1.0]]]])
    assert gram_vector(x, 1).tolist() == [[5.0 - 2.0, -2.0 + 1.0]]


# -- NCI, NECO, Residual -----------------------------------------------------


def test_nci_neco_residual_match_formulas(cnn, data):
    net, rnet = cnn
    nci, neco = NCI(rnet, alpha=0.1), NECO(rnet, d=4, use_max_logit=True)
    res = Residual(rnet, d=4)
    fit_detectors([nci, neco, res], data)
    x = torch.randn(6, 3, 32, 32)
    xs = torch.cat([b[0] for b in data])
    with torch.no_grad():
        f, g = penultimate(net, xs), penultimate(net, x)
    w = net.classifier[3].weight.to(F64)
    b = net.classifier[3].bias.to(F64)
    logits = g @ w.T + b
    # NCI
    z = g - f.mean(0)
    wc = w[logits.argmax(1)]
    want = -(z * wc).sum(1) / z.norm(dim=1) - 0.1 * g.abs().sum(1)
    torch.testing.assert_close(nci(x), want, **TOL)
    # NECO: standardise, PCA, norm ratio times the max logit.
    std = f.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    zs, zg = (f - f.mean(0)) / std, (g - f.mean(0)) / std
    _, _, vh = torch.linalg.svd(zs, full_matrices=False)
    ratio = (zg @ vh[:4].T).norm(dim=1) / zg.norm(dim=1)
    torch.testing.assert_close(neco(x), -ratio * logits.amax(1), **TOL)
    # Residual
    u = -torch.linalg.pinv(w) @ b
    _, _, vh = torch.linalg.svd(f - u, full_matrices=True)
    torch.testing.assert_close(res(x), ((g - u) @ vh[4:].T).norm(dim=1), **TOL)


# -- RankFeat, VRA -----------------------------------------------------------


def test_rankfeat_and_vra_match_the_cut_net(cnn, data, tmp_path):
    net, rnet = cnn
    rank = RankFeat(rnet, layer="features.1")
    vra = VRA(rnet, layer="features.5", lower_percentile=0.1, upper_percentile=0.9)
    vra.fit(data, input=0)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        m = net.features[:2](x)
        mat = m.reshape(4, 8, -1)
        u, s, vh = torch.linalg.svd(mat, full_matrices=False)
        edited = (mat - s[:, :1, None] * u[:, :, :1] @ vh[:, :1]).reshape(m.shape)
        logits = net.classifier(net.features[2:](edited))
        want_rank = -torch.logsumexp(logits, 1)
        fs = torch.cat([net.features(b[0]) for b in data])
        lo, hi = torch.quantile(fs, 0.1, dim=0), torch.quantile(fs, 0.9, dim=0)
        want_vra = -torch.logsumexp(net.classifier(net.features(x).clip(lo, hi)), 1)
    # SVD and quantiles in float32 on the same data: rtol 1e-4.
    torch.testing.assert_close(rank(x), want_rank, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(vra(x), want_vra, rtol=1e-4, atol=1e-5)
    path = vra.save(tmp_path / "v.safetensors")
    again = VRA(rnet, layer="features.5", lower_percentile=0.1, upper_percentile=0.9)
    assert torch.equal(again.load(path)(x), vra(x))
    with pytest.raises(ValueError, match="needs a batch of matrices"):
        RankFeat(rnet, layer="classifier.2")(x)
    with pytest.raises(ValueError, match="exceeds upper_percentile"):
        VRA(rnet, layer="features.4", lower_percentile=0.9, upper_percentile=0.1)


# -- NAC ---------------------------------------------------------------------


def openood_edges(m):
    """OpenOOD's ``logspace(1e3, M)``, written out in numpy."""
    num = m // 2
    x = np.linspace(1, np.sqrt(1e3), num=num)
    low = np.log(x) / np.log(1e3)
    edges = np.concatenate([low[:-1], (1 - low)[::-1]])
    edges[-1] += 1e-2
    return torch.from_numpy(np.append(edges, 1.2))


def nac_states(net, x, alpha):
    """States of features.1 (a map, z and g pooled apart) and classifier.2."""
    x = x.clone().requires_grad_()
    z1 = net.features[:2](x)
    z2 = net.classifier[:3](net.features[2:](z1))
    logits = net.classifier[3](z2)
    kl = (-torch.log_softmax(logits, 1) / logits.shape[1]).sum()
    g1, g2 = torch.autograd.grad(kl, [z1, z2])
    pairs = [(z1.detach().mean((2, 3)), g1.mean((2, 3))), (z2.detach(), g2)]
    return [torch.sigmoid(alpha * z.to(F64) * g.to(F64)) for z, g in pairs]


def test_nac_matches_the_coverage_formula(cnn, data, tmp_path):
    net, rnet = cnn
    alpha, o_star, m = 50.0, 3, 20
    nac = NAC(
        rnet, ["features.1", "classifier.2"], m_bins=m, alpha=alpha, o_star=o_star
    )
    nac.fit(data, input=0)
    x = torch.randn(5, 3, 32, 32)
    got = nac(x)
    # Oracle: the states by hand, OpenOOD's Estimator on them (edges compared
    # as it does: lo <= s < hi), coverage min(count / O, 1), mean over
    # neurons then layers. z and g are the same float32 tensors on both
    # sides; our pooling is float64 of them, the oracle's float32 mean then
    # float64: states agree to ~1e-7 relative; a state on a bin edge could
    # then flip bins, which the exact comparison of bins below would show.
    edges = openood_edges(m)
    counts = [torch.zeros(m - 1, n, dtype=F64) for n in (8, 32)]
    for xb, _ in data:
        for i, s in enumerate(nac_states(net, xb, alpha)):
            hit = (s[:, None] >= edges[:-1, None]) & (s[:, None] < edges[1:, None])
            counts[i] += hit.sum(0)
    want = torch.zeros(5, dtype=F64)
    for i, s in enumerate(nac_states(net, x, alpha)):
        hit = (s[:, None] >= edges[:-1, None]) & (s[:, None] < edges[1:, None])
        coverage = (counts[i] / o_star).clamp(max=1.0)
        want += (hit * coverage).sum(1).mean(1) / 2
    for mine, theirs in zip(nac.counts, counts, strict=True):
        assert torch.equal(mine.T.to(F64), theirs)
    # Coverages are multiples of 1/3 averaged: float64 sums, 1e-12.
    torch.testing.assert_close(got, -want, rtol=1e-12, atol=1e-12)
    states = nac.states(x)
    for mine, theirs in zip(states, nac_states(net, x, alpha), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-9)
    path = nac.save(tmp_path / "nac.safetensors")
    again = NAC(
        rnet, ["features.1", "classifier.2"], m_bins=m, alpha=alpha, o_star=o_star
    )
    assert torch.equal(again.load(path)(x), got)


def test_nac_shares_evaluate_and_fit_detectors(cnn, data):
    net, rnet = cnn
    nac = NAC(rnet, ["features.4"], o_star=2)
    ens = MahalanobisEnsemble(rnet, ["features.1"], shrinkage=0.1)
    fit_detectors([nac, ens], data, target=1)
    assert nac.fitted
    assert ens.fitted
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():  # NAC turns autograd on for its own pass
        scores = nac(x)
    assert scores.shape == (4,)
    assert all(p.grad is None for p in net.parameters())
    result = evaluate(
        {"nac": nac, "ens": ens, "energy": Energy(rnet)}, [x], [3 * x], input=None
    )
    assert set(result) == {"nac", "ens", "energy"}
    with pytest.raises(
        TypeError, match=r"NAC\.fit runs its own gradient loop and takes no spill_dir"
    ):
        nac.fit(data, spill_dir="somewhere")
    with pytest.raises(ValueError, match="alpha has 3 values for 1 layers"):
        NAC(rnet, ["features.4"], alpha=[1.0, 2.0, 3.0])


def test_nac_on_resnet18_and_frozen_parameters():
    torch.manual_seed(0)
    net = resnet18_cifar(2).eval().requires_grad_(False)
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    nac = NAC(rnet, ["layer3", "layer4"], o_star=1)
    nac.fit([torch.randn(4, 3, 32, 32)], input=None)
    scores = nac(torch.randn(2, 3, 32, 32))
    assert scores.shape == (2,)
    assert bool(((scores <= 0) & (scores >= -1)).all())


# -- saved states: checked by the base class against this net ---------------


def conv_net(width):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 3),
    )
    return Recorder(net.eval(), input_size=(1, 3, 8, 8))


STATEFUL = {
    "MahalanobisEnsemble": lambda r: MahalanobisEnsemble(r, ["1", "3"]),
    "Gram": lambda r: Gram(r, ["1", "3"]),
    "NCI": NCI,
    "NECO": lambda r: NECO(r, d=2),
    "Residual": lambda r: Residual(r, d=2),
    "VRA": lambda r: VRA(r, layer="3"),
    "NAC": lambda r: NAC(r, ["1", "3"]),
}


@pytest.mark.parametrize("name", STATEFUL)
def test_a_state_saved_on_another_net_is_refused(name, tmp_path):
    from scio_recorder.io import load_records, save_records  # noqa: PLC0415

    make = STATEFUL[name]
    torch.manual_seed(2)
    batches = [(torch.randn(24, 3, 8, 8), torch.arange(24) % 3)]
    path = make(conv_net(8)).fit(batches, target=1).save(tmp_path / "s.safetensors")
    again = make(conv_net(8)).load(path)  # the same net: loads
    assert again.fitted
    with pytest.raises(ValueError, match=r"per sample, .* the state does not fit"):
        make(conv_net(12)).load(path)
    # Without the layers' shapes in the file, the entries are checked.
    records = load_records(path)
    meta = {k: v for k, v in records.metadata.items() if k.startswith("ood.")}
    del meta["ood.layers"]
    bare = save_records(tmp_path / "b.safetensors", dict(records), extra_metadata=meta)
    with pytest.raises(
        ValueError, match=r"it must be \[.*(12|24).*\]: the state was saved"
    ):
        make(conv_net(12)).load(bare)


@pytest.mark.parametrize("name", STATEFUL)
def test_non_finite_fit_features_are_refused(name):
    make = STATEFUL[name]
    x = torch.randn(24, 3, 8, 8)
    x[3, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"1 of the \d+ fit samples|1 fit samples"):
        make(conv_net(8)).fit([(x, torch.arange(24) % 3)], target=1)


def test_gram_fits_from_an_iterator_refuses_bad_labels_all_or_nothing(cnn, data):
    _, rnet = cnn
    gram = Gram(rnet, ["features.1", "features.4"])
    gram.fit(iter(data), target=1)  # one pass: an iterator will do
    again = Gram(rnet, ["features.1", "features.4"]).fit(data, target=1)
    assert torch.equal(gram.norms, again.norms)
    before = [m.clone() for m in gram.mins]
    bad = [data[0], (data[1][0], data[1][1] + 5)]
    with pytest.raises(
        ValueError, match=r"class label 7 in batch 1 .* outside \[0, 3\)"
    ):
        gram.fit(bad, target=1)
    assert all(torch.equal(a, b) for a, b in zip(before, gram.mins, strict=True))


def test_rankfeat_two_blocks_averages_the_logits_of_two_passes(cnn):
    net, rnet = cnn
    rank = RankFeat(rnet, layers=["features.1", "features.4"])
    x = torch.randn(4, 3, 32, 32)
    calls, handle = count_forwards(net)
    got = rank(x)
    handle.remove()
    assert len(calls) == 2  # one edited pass per block

    def rank1_removed(m):
        mat = m.reshape(m.shape[0], m.shape[1], -1)
        u, s, vh = torch.linalg.svd(mat, full_matrices=False)
        return (mat - s[:, :1, None] * u[:, :, :1] @ vh[:, :1]).reshape(m.shape)

    with torch.no_grad():
        first = net.classifier(net.features[2:](rank1_removed(net.features[:2](x))))
        second = net.classifier(net.features[5:](rank1_removed(net.features[:5](x))))
    want = -torch.logsumexp((first + second) / 2, 1)
    # SVD in float32 on the same maps: rtol 1e-4 (as the one-block test).
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert rank.config() == {"layers": [[2, 2], [2, 5]]}
    with pytest.raises(ValueError, match=r"give `layer=` .* not both"):
        RankFeat(rnet, layer="features.1", layers=["features.4"])
    result = evaluate({"rank2": rank, "energy": Energy(rnet)}, [x], [3 * x], input=None)
    assert set(result) == {"rank2", "energy"}


# -- pytorch-ood, where installed ---------------------------------------------


@pytest.fixture
def pood():
    torchvision_schemas()
    return pytest.importorskip("pytorch_ood.detector")


def test_against_pytorch_ood(pood, cnn, data, capsys):
    net, rnet = cnn
    x = torch.randn(6, 3, 32, 32)
    xs = torch.cat([b[0] for b in data])
    ys = torch.cat([b[1] for b in data])
    diffs = {}
    # NCI
    ours = NCI(rnet, alpha=0.1).fit(data)
    theirs = pood.NCI(
        lambda t: net.classifier[:3](net.features(t)), net.classifier[3], 0.1
    )
    theirs.fit_features(net.classifier[:3](net.features(xs)).detach())
    diffs["NCI"] = (ours(x) - theirs.predict(x).to(F64)).abs().max().item()
    # RankFeat
    theirs = pood.RankFeat(
        net.features[:2], lambda t: net.classifier(net.features[2:](t))
    )
    ours = RankFeat(rnet, layer="features.1")
    diffs["RankFeat"] = (ours(x) - theirs.predict(x)).abs().max().item()
    # VRA
    theirs = pood.VRA(net.features, net.classifier, 0.1, 0.9)
    theirs.fit_feature_maps(net.features(xs).detach(), ys)
    ours = VRA(rnet, layer="features", lower_percentile=0.1, upper_percentile=0.9)
    ours.fit(data)
    diffs["VRA"] = (ours(x) - theirs.predict(x)).abs().max().item()
    # MultiMahalanobis: 0.5 M_l with S = W (not W / N) + 1e-6 I: ours / (2 N).
    parts = [net.features[:2], net.features[2:5]]
    theirs = pood.MultiMahalanobis(parts)
    feats = [net.features[:2](xs), net.features[:5](xs)]
    theirs.fit_structured([f.mean(dim=(2, 3)).detach() for f in feats], ys)
    ours = MahalanobisEnsemble(rnet, ["features.1", "features.4"]).fit(data, target=1)
    want = theirs.predict(x).to(F64) * 2 * xs.shape[0]
    diffs["MahalanobisEnsemble"] = ((ours(x) - want) / want.abs()).abs().max().item()
    # Gram with nothing held out (class attribute) against ours.
    pood.Gram.validation_fraction = 0.0
    theirs = pood.Gram(net.classifier, [net.features[:2], net.features[2:]], 3)
    theirs.fit([(xs, ys)])
    ours = Gram(rnet, ["features.1", "features.5"], validation_fraction=0.0)
    ours.fit(data, target=1)
    diffs["Gram"] = (ours(x) - theirs.predict(x).to(F64)).abs().max().item()
    with capsys.disabled():
        print("max |ours - pytorch-ood|:", diffs)
    assert diffs["NCI"] < 1e-5
    assert diffs["RankFeat"] < 1e-4
    assert diffs["VRA"] < 1e-4
    # MultiMahalanobis inverts W + 1e-6 I where we take the pseudo-inverse:
    # with dead ReLU channels (zero variance) the two differ by design, so
    # the relative difference is only reported.
    assert diffs["MahalanobisEnsemble"] == diffs["MahalanobisEnsemble"]
    assert diffs["Gram"] < 1e-3


def test_nac_against_pytorch_ood(pood, cnn, data, capsys):
    """NACUE pools z * g and bins otherwise: compare states, report scores."""
    from pytorch_ood.detector.nac import _bin_indices_geometric  # noqa: PLC0415

    net, rnet = cnn
    xs = torch.cat([b[0] for b in data])
    theirs = pood.NACUE(net, [net.classifier[2]], m_bins=50, alpha=100.0, o_star=5)
    theirs.fit([(xs, torch.zeros(len(xs)))])
    ours = NAC(rnet, ["classifier.2"], m_bins=50, alpha=100.0, o_star=5)
    ours.fit([xs], input=None)
    # On an un-pooled layer the states agree: our states, binned with
    # pytorch-ood's geometric bins, give its counts exactly.
    (states,) = ours.states(xs)
    bins = _bin_indices_geometric(states.float(), 50)
    counts = torch.stack([torch.bincount(b, minlength=50) for b in bins.T])
    assert torch.equal(counts, theirs._stats[0].counts)
    x = torch.randn(6, 3, 32, 32)
    diff = (ours(x) - theirs.predict(x).to(F64)).abs().max().item()
    with capsys.disabled():
        print("NAC: max |ours - NACUE| (other bins, by design):", diff)
    assert diff <= 1.0  # both are minus a mean coverage in [0, 1]
