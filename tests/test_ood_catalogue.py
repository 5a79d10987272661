"""The single-layer detectors of the catalogue against their papers' formulas.

TempScale, ODIN, GEN, KLMatching, DICE, SHE, NNGuide, RMDS, fDBD. Each
detector runs on the unmodified net through a Recorder; each oracle is the
paper's formula written out with plain torch ops on the net cut by hand
(``penultimate(net, x)``, ``net.fc.weight``). Both sides compute the same
float32 features from the same inputs on the same path; what differs is the
order of float reductions in the formula (and float64 against float32 for
the statistics), so scores agree to a few float32 ulps of their magnitude:
rtol 1e-5 (~80 eps_32), atol 1e-6 for scores near zero. Fitted statistics
are computed by hand from all the fit features at once.

The comparisons with pytorch-ood 0.4 (``test_*_matches_pytorch_ood``) run
only where it is installed (not in CI).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from torch import nn

from scio_recorder import Recorder
from scio_recorder.models import demo_model, resnet18_cifar
from scio_recorder.ood import (
    DICE,
    GEN,
    MSP,
    ODIN,
    RMDS,
    SHE,
    KLMatching,
    Mahalanobis,
    NNGuide,
    TempScale,
    evaluate,
    fDBD,
    fit_detectors,
)
from scio_recorder.ood._calibration import fit_temperature

F64 = torch.float64


class Net(nn.Module):
    """Feature maps, then a small MLP head."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16, width)
        self.act = nn.ReLU()
        self.fc = nn.Linear(width, 3)

    def forward(self, x):
        return self.fc(self.act(self.fc1(self.flatten(self.features(x)))))


def penultimate(net, x):
    return net.act(net.fc1(net.flatten(net.features(x))))


def standardise_logits(fc: nn.Linear, logits: torch.Tensor) -> None:
    """Make ``fc``'s logits zero-mean, unit-std per class on some data.

    A random net predicts one class for every input; with standardised
    logits it predicts every class, as a trained net does (SHE needs a
    correctly classified sample of each class).
    """
    with torch.no_grad():
        std = logits.std(0)
        fc.weight /= std[:, None]
        fc.bias.sub_(logits.mean(0)).div_(std)


@pytest.fixture
def net():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(64, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        standardise_logits(net.fc, net(x))
    return net


@pytest.fixture
def rnet(net):
    return Recorder(net, input_size=(1, 3, 6, 6))


@pytest.fixture
def data(net):
    """Four labelled batches (labels: the net's prediction 3 in 4), a test batch."""
    gen = torch.Generator().manual_seed(1)
    train = []
    for _ in range(4):
        xb = torch.randn(16, 3, 6, 6, generator=gen)
        with torch.no_grad():
            predicted = net(xb).argmax(1)
        noise = torch.randint(0, 3, (16,), generator=gen)
        train.append((xb, torch.where(torch.arange(16) % 4 == 0, noise, predicted)))
    return train, torch.randn(10, 3, 6, 6, generator=gen)


def close(a, b):
    torch.testing.assert_close(a.to(F64), b.to(F64), rtol=1e-5, atol=1e-6)


def features_of(net, batches):
    with torch.no_grad():
        return torch.cat([penultimate(net, xb) for xb, _ in batches])


def logits_of_batches(net, batches):
    with torch.no_grad():
        return torch.cat([net(xb) for xb, _ in batches])


def energy(logits):
    return -torch.logsumexp(logits, dim=1)


# ------------------------------------------------------------------ GEN
@pytest.mark.parametrize(("gamma", "m"), [(0.1, None), (0.5, 2)])
def test_gen_is_the_mean_generalised_entropy_of_the_top_m(net, rnet, data, gamma, m):
    _, x = data
    with torch.no_grad():
        p = net(x).softmax(1).clamp(1e-7, 1 - 1e-7)
    top = p.sort(dim=1, descending=True).values[:, : m or 3]
    want = (top**gamma * (1 - top) ** gamma).sum(1) / top.shape[1]
    close(GEN(rnet, gamma=gamma, M=m)(x), want)


# ------------------------------------------------------------- KLMatching
def test_klmatching_is_the_kl_to_the_closest_typical_posterior(net, rnet, data):
    train, x = data
    klm = KLMatching(rnet).fit(train)
    p_fit = logits_of_batches(net, train).to(F64).softmax(1)
    predicted = p_fit.argmax(1)
    typical = torch.stack([p_fit[predicted == k].mean(0) for k in range(3)])
    close(klm.typical, typical)
    with torch.no_grad():
        p = net(x).to(F64).softmax(1)
    kl = torch.stack([(p * (p / d).log()).sum(1) for d in typical], dim=1)
    close(klm(x), kl.min(1).values)


# -------------------------------------------------------------- TempScale
def nll(logits, targets, t):
    return F.cross_entropy(logits.to(F64) / t, targets)


def test_tempscale_minimises_the_nll_and_scores_the_scaled_msp(net, rnet, data):
    train, x = data
    ts = TempScale(rnet).fit(train, target=1)
    t = float(ts.t)
    logits = logits_of_batches(net, train)
    y = torch.cat([yb for _, yb in train])
    # The minimum of a smooth convex function: the NLL is higher on both
    # sides, and its derivative (autograd, float64) vanishes there.
    assert nll(logits, y, t) < nll(logits, y, t * 1.001)
    assert nll(logits, y, t) < nll(logits, y, t / 1.001)
    tt = torch.tensor(t, dtype=F64, requires_grad=True)
    (slope,) = torch.autograd.grad(nll(logits, y, tt), tt)
    assert abs(float(slope)) < 1e-9
    with torch.no_grad():
        want = -(net(x) / t).softmax(1).max(1).values
    close(ts(x), want)
    given = TempScale(rnet, t=2.0)
    assert given.fitted
    close(given(x), -(net(x).detach() / 2).softmax(1).max(1).values)


def test_fit_temperature_refuses_perfectly_separated_logits():
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    with pytest.raises(
        ValueError, match=r"^TempScale: the NLL keeps decreasing as T -> 0"
    ):
        fit_temperature(logits, torch.tensor([0, 1]))
    assert fit_temperature(logits, torch.tensor([1, 0])) == math.inf


# ------------------------------------------------------------------ ODIN
def test_odin_moves_the_input_against_the_gradient(net, rnet, data):
    _, x = data
    t, eps = 10.0, 0.05
    leaf = x.clone().requires_grad_()
    logits = net(leaf) / t
    loss = F.cross_entropy(logits, logits.argmax(1))
    (grad,) = torch.autograd.grad(loss, leaf)
    x_hat = x - eps * grad.sign()
    with torch.no_grad():
        want = -(net(x_hat) / t).softmax(1).max(1).values
    close(ODIN(rnet, eps=eps, temperature=t)(x), want)
    std = [0.5, 0.25, 2.0]
    x_hat = x - eps * grad.sign() / torch.tensor(std)[None, :, None, None]
    with torch.no_grad():
        want = -(net(x_hat) / t).softmax(1).max(1).values
    close(ODIN(rnet, eps=eps, temperature=t, norm_std=std)(x), want)
    assert all(p.grad is None for p in net.parameters())
    with torch.inference_mode():
        close(
            ODIN(rnet, eps=eps, temperature=t)(x), ODIN(rnet, eps=eps, temperature=t)(x)
        )


# ------------------------------------------------------------------ DICE
def test_dice_masks_the_smallest_contributions(net, rnet, data):
    train, x = data
    dice = DICE(rnet, p=0.7).fit(train)
    mean = features_of(net, train).to(F64).mean(0)
    w = net.fc.weight.detach()
    contributions = mean[None, :] * w.to(F64)
    mask = contributions > torch.quantile(contributions.flatten(), 0.7)
    assert torch.equal(dice.mask(), mask)
    with torch.no_grad():
        logits = penultimate(net, x) @ (w * mask).T + net.fc.bias
    close(dice(x), energy(logits))


# ------------------------------------------------------------------ SHE
def test_she_is_the_inner_product_with_the_predicted_class_pattern(net, rnet, data):
    train, x = data
    she = SHE(rnet).fit(train, target=1)
    f = features_of(net, train).to(F64)
    y = torch.cat([yb for _, yb in train])
    right = logits_of_batches(net, train).argmax(1) == y
    patterns = torch.stack([f[right & (y == c)].mean(0) for c in range(3)])
    close(she.patterns, patterns)
    with torch.no_grad():
        g = penultimate(net, x).to(F64)
        predicted = net(x).argmax(1)
    close(she(x), -(g * patterns[predicted]).sum(1))


def test_she_refuses_a_class_without_a_correct_sample(rnet, data):
    train, _ = data
    wrong = [(xb, torch.full_like(yb, 2)) for xb, yb in train]
    with pytest.raises(ValueError, match=r"^SHE: no fit sample of class 0, 1 is"):
        SHE(rnet).fit(wrong, target=1)


# ---------------------------------------------------------------- NNGuide
def test_nnguide_scales_the_energy_by_the_guidance(net, rnet, data):
    train, x = data
    guide = NNGuide(rnet, k=5).fit(train)
    f = features_of(net, train)
    bank = F.normalize(f, dim=1) * torch.logsumexp(net.fc(f), 1)[:, None]
    close(guide.bank, bank.detach())
    with torch.no_grad():
        g = penultimate(net, x)
        similarity = F.normalize(g, dim=1) @ bank.T
        guidance = similarity.sort(dim=1, descending=True).values[:, :5].mean(1)
        want = -guidance * torch.logsumexp(net.fc(g), 1)
    close(guide(x), want)


# ------------------------------------------------------------------ RMDS
def test_rmds_is_the_class_distance_relative_to_the_background(net, rnet, data):
    train, x = data
    rmds = RMDS(rnet).fit(train, target=1)
    f = features_of(net, train).to(F64)
    y = torch.cat([yb for _, yb in train])
    means = torch.stack([f[y == c].mean(0) for c in range(3)])
    centred = f - means[y]
    precision = torch.linalg.pinv(centred.T @ centred / len(f), hermitian=True)
    mu0 = f.mean(0)
    precision0 = torch.linalg.pinv((f - mu0).T @ (f - mu0) / len(f), hermitian=True)
    with torch.no_grad():
        g = penultimate(net, x).to(F64)
    md = torch.stack([(((g - m) @ precision) * (g - m)).sum(1) for m in means], 1)
    md0 = (((g - mu0) @ precision0) * (g - mu0)).sum(1)
    close(rmds(x), (md - md0[:, None]).min(1).values)


# ------------------------------------------------ Mahalanobis++, RMDS++
@pytest.mark.parametrize("relative", [False, True])
def test_normalize_is_the_plus_plus_score_of_l2_normalised_features(
    net, rnet, data, relative
):
    """Mahalanobis++ and RMDS++ (Müller & Hein, ICML 2025), written out."""
    train, x = data
    make = RMDS if relative else Mahalanobis
    plus = make(rnet, normalize=True).fit(train, target=1)
    f = features_of(net, train).to(F64)
    f = f / f.norm(dim=1, keepdim=True)
    y = torch.cat([yb for _, yb in train])
    means = torch.stack([f[y == c].mean(0) for c in range(3)])
    centred = f - means[y]
    precision = torch.linalg.pinv(centred.T @ centred / len(f), hermitian=True)
    with torch.no_grad():
        g = penultimate(net, x).to(F64)
    g = g / g.norm(dim=1, keepdim=True)
    md = torch.stack([(((g - m) @ precision) * (g - m)).sum(1) for m in means], 1)
    want = md.min(1).values
    if relative:
        mu0 = f.mean(0)
        precision0 = torch.linalg.pinv((f - mu0).T @ (f - mu0) / len(f), hermitian=True)
        md0 = (((g - mu0) @ precision0) * (g - mu0)).sum(1)
        want = (md - md0[:, None]).min(1).values
    # Unit features: covariances of entries ~1e-2, their pinv ~1e2 to 1e4;
    # float32 features, float64 statistics: relative ~1e-5 (rtol 1e-4).
    torch.testing.assert_close(plus(x), want, rtol=1e-4, atol=1e-6)
    plain = make(rnet).fit(train, target=1)
    assert not torch.allclose(plus(x), plain(x), rtol=1e-2)
    assert plus.config()["normalize"] is True
    assert "normalize" not in plain.config()  # files saved before still load


# ------------------------------------------------------------------ fDBD
def test_fdbd_is_the_mean_boundary_distance_over_the_distance_to_the_mean(
    net, rnet, data
):
    train, x = data
    dbd = fDBD(rnet).fit(train)
    mu = features_of(net, train).to(F64).mean(0)
    w, b = net.fc.weight.detach().to(F64), net.fc.bias.detach().to(F64)
    with torch.no_grad():
        g = penultimate(net, x).to(F64)
    want = []
    for f in g:
        z = w @ f + b
        top = int(z.argmax())
        total = sum(
            abs(z[top] - z[c]) / (w[top] - w[c]).norm() for c in range(3) if c != top
        )
        want.append(-total / 2 / (f - mu).norm())
    close(dbd(x), torch.stack(want))


# ------------------------------------------------- every one, shared passes
def make_all(rnet):
    return {
        "TempScale": TempScale(rnet),
        "ODIN": ODIN(rnet),
        "GEN": GEN(rnet),
        "KLMatching": KLMatching(rnet),
        "DICE": DICE(rnet),
        "SHE": SHE(rnet),
        "NNGuide": NNGuide(rnet, k=3),
        "RMDS": RMDS(rnet),
        "fDBD": fDBD(rnet),
    }


def test_fit_detectors_is_one_pass_with_the_same_fits(net, rnet, data):
    train, _ = data
    apart = make_all(rnet)
    for detector in apart.values():
        detector.fit(train, target=1)
    together = {**make_all(rnet), "Mahalanobis": Mahalanobis(rnet)}
    calls = []
    handle = net.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        fit_detectors(together, train, target=1)
    finally:
        handle.remove()
    assert len(calls) == len(train)
    for name, one in apart.items():
        other = together[name]
        assert other.fitted
        for key, value in one.state().items():
            torch.testing.assert_close(other.state()[key], value, rtol=0, atol=0)


def test_evaluate_shares_passes_odin_runs_its_own(net, rnet, data):
    train, x = data
    detectors = {**make_all(rnet), "MSP": MSP(rnet)}
    fit_detectors(detectors, train, target=1)
    calls = []
    handle = net.register_forward_pre_hook(lambda *_: calls.append(1))
    ood = [3 * torch.randn(8, 3, 6, 6)]
    try:
        result = evaluate(detectors, [x[:5], x[5:]], ood, input=None)
    finally:
        handle.remove()
    assert len(calls) == 3 * 3  # 3 batches x (1 shared pass + ODIN's 2 forwards)
    for name, detector in detectors.items():
        scores = torch.cat([detector(x[:5]), detector(x[5:])])
        torch.testing.assert_close(result.id_scores[name], scores, rtol=0, atol=0)


def test_fitted_state_saves_and_loads(rnet, data, tmp_path):
    train, x = data
    for name, detector in make_all(rnet).items():
        fitted = detector.fit(train, target=1)
        path = fitted.save(tmp_path / f"{name}.safetensors")
        again = make_all(rnet)[name].load(path)
        assert torch.equal(again(x), fitted(x)), name
    with pytest.raises(
        ValueError, match=r"configured otherwise \(p: saved \[0.9\], now \[0.5\]\)"
    ):
        DICE(rnet, p=0.5).load(tmp_path / "DICE.safetensors")
    with pytest.raises(
        ValueError, match=r"holds the state of a RMDS, not of a Mahalanobis"
    ):
        Mahalanobis(rnet).load(tmp_path / "RMDS.safetensors")


@pytest.mark.parametrize("name", ["DICE", "SHE", "NNGuide", "RMDS", "fDBD"])
def test_a_state_saved_on_another_net_is_refused_naming_both_shapes(
    rnet, data, tmp_path, name
):
    # The base class checks every stored shape against the recorder's layer
    # (tests/test_ood_state.py); each new detector declares its entries.
    train, _ = data
    path = make_all(rnet)[name].fit(train, target=1).save(tmp_path / "state.st")
    wider = Recorder(Net(width=12).eval(), input_size=(1, 3, 6, 6))
    pattern = (
        rf"^'{re.escape(str(path))}' holds a {name} state fitted on layer 1-\d+ "
        r"whose input was \[8\] per sample, but in this net layer .* \[12\]"
    )
    with pytest.raises(ValueError, match=pattern):
        make_all(wider)[name].load(path)


def test_bad_requests_name_the_fix(rnet, data):
    train, x = data
    with pytest.raises(
        ValueError, match=r"^TempScale: the temperature t must be a number > 0, got 0"
    ):
        TempScale(rnet, t=0)
    with pytest.raises(
        ValueError, match=r"^TempScale.fit needs class labels: pass `target=`"
    ):
        TempScale(rnet).fit(train)
    with pytest.raises(ValueError, match=r"^ODIN: eps must be a number >= 0, got -1"):
        ODIN(rnet, eps=-1)
    with pytest.raises(
        ValueError,
        match=r"^ODIN: norm_std has 2 values but the input is \[10, 3, 6, 6\]",
    ):
        ODIN(rnet, norm_std=[1.0, 2.0])(x)
    msg = (
        "ODIN perturbs the net's first positional input, which must be a "
        "floating tensor; got a torch.int64 tensor."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}"):
        ODIN(rnet)(x.long())
    with pytest.raises(ValueError, match=r"^GEN: gamma must be > 0, got 0"):
        GEN(rnet, gamma=0)
    with pytest.raises(ValueError, match=r"^GEN: M must be an int >= 1 or None"):
        GEN(rnet, M=0)
    with pytest.raises(
        ValueError,
        match=r"^DICE: p, the fraction of weights dropped, must be in \[0, 1\), got 90",
    ):
        DICE(rnet, p=90)
    with pytest.raises(
        TypeError,
        match=r"^SHE: fc='features.0' is a Conv2d; it must be an nn.Linear\.$",
    ):
        SHE(rnet, fc="features.0")
    with pytest.raises(
        ValueError, match=r"^NNGuide: k=100 is more than the 64 fit samples"
    ):
        NNGuide(rnet, k=100).fit(train)
    with pytest.raises(ValueError, match=r"^RMDS.fit needs class labels"):
        RMDS(rnet).fit(train)


# ------------------------------------------------------- the models we ship
@pytest.mark.parametrize(
    ("make", "n", "side"),
    [(demo_model, 128, 32), (resnet18_cifar, 64, 16)],  # 16 x 16: a fast ResNet
)
def test_every_detector_fits_and_scores_the_shipped_models(make, n, side):
    torch.manual_seed(0)
    model = make().eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, side, side, generator=gen)
    fc = model.classifier[3] if make is demo_model else model.fc
    with torch.no_grad():
        standardise_logits(fc, model(x))
        y = model(x).argmax(1)
    assert (y.bincount(minlength=10) > 0).all()  # SHE: a sample of each class
    train = [(x[: n // 2], y[: n // 2]), (x[n // 2 :], y[n // 2 :])]
    rnet = Recorder(model, input_size=(1, 3, side, side))
    detectors = make_all(rnet)
    detectors["TempScale"] = TempScale(rnet, t=1.5)  # every label right: T -> 0
    fit_detectors(detectors, train, target=1)
    ood = [torch.rand(4, 3, side, side, generator=gen)]
    scores = evaluate(detectors, [x[:4]], ood, input=None)
    for name in detectors:
        assert scores.id_scores[name].shape == (4,)
        assert torch.isfinite(scores.id_scores[name]).all(), name


# --------------------------------------------- pytorch-ood 0.4, where installed
@pytest.fixture(scope="module")
def pood():
    """pytorch_ood.detector, with the torchvision schemas it needs declared."""
    try:
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # already declared (torchvision, or a rerun)
        lib = None
    detector = pytest.importorskip("pytorch_ood.detector")
    yield detector
    del lib


def ours_and_theirs(pood, net, rnet, train, x):
    """(name, our scores, pytorch-ood's scores) for each detector both have."""
    f = features_of(net, train)
    y = torch.cat([yb for _, yb in train])
    logits = logits_of_batches(net, train)
    with torch.no_grad():
        g = penultimate(net, x)
        z = net(x)
    ours = make_all(rnet)
    fit_detectors(ours, train, target=1)
    pairs = []
    theirs = pood.TemperatureScaling(None).fit_logits(logits, y)
    pairs.append(("TempScale", ours["TempScale"](x), theirs.predict_logits(z)))
    odin = pood.ODIN(net, eps=0.0014, temperature=1000.0)
    pairs.append(("ODIN", ours["ODIN"](x), odin.predict(x)))
    pairs.append(("GEN", ours["GEN"](x), pood.GEN(None).predict_logits(z)))
    klm = pood.KLMatching(None).fit_logits(logits)
    pairs.append(("KLMatching", ours["KLMatching"](x), klm.predict_logits(z)))
    w, b = net.fc.weight.detach(), net.fc.bias.detach()
    dice = pood.DICE(None, w, b, p=0.9).fit_features(f, y)
    pairs.append(("DICE", ours["DICE"](x), dice.predict_features(g)))
    she = pood.SHE(None, net.fc).fit_features(f, y)
    pairs.append(("SHE", ours["SHE"](x), she.predict_features(g).detach()))
    guide = pood.NNGuide(None, net.fc, k=3).fit_features(f, y)
    pairs.append(("NNGuide", ours["NNGuide"](x), guide.predict_features(g)))
    rmd = pood.RMD(None).fit_features(f, y)
    # pytorch-ood divides no covariance by N: its scores are ours / N
    pairs.append(("RMDS", ours["RMDS"](x) / len(f), rmd.predict_features(g)))
    dbd = pood.fDBD(None, net.fc).fit_features(f)
    pairs.append(("fDBD", ours["fDBD"](x), dbd.predict_features(g)))
    return pairs


def test_the_detectors_match_pytorch_ood(pood, net, rnet, data, capsys):
    """Same scores as pytorch-ood 0.4, within float32 rounding, except where noted.

    TempScale: pytorch-ood stops L-BFGS after 50 steps, near the optimum we
    solve for exactly; RMDS: its 1e-6 ridge on N S; both a looser rtol.
    """
    train, x = data
    loose = {"TempScale": 1e-2, "RMDS": 1e-3}
    report = []
    for name, ours, others in ours_and_theirs(pood, net, rnet, train, x):
        mine, theirs = ours.to(F64), others.detach().to(F64)
        gap, size = (mine - theirs).abs().max(), theirs.abs().max()
        report.append(f"{name}: max |ours - theirs| {gap:.3g}, max |score| {size:.3g}")
        if not torch.allclose(mine, theirs, rtol=loose.get(name, 1e-5), atol=1e-6):
            report.append(f"{name} differs more than its tolerance")
    with capsys.disabled():
        print("\n" + "\n".join(report))
    assert not [line for line in report if "differs" in line]
