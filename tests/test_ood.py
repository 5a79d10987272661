"""OoD detectors against their papers' formulas, on a net cut by hand.

Each detector runs on the unmodified net through a Recorder; each oracle
runs the same net cut by hand into a backbone and a head (as pytorch-ood
makes its users do) and applies the paper's formula. Both sides compute the
same float32 features from the same inputs on the same path, so scores agree
to float32 rounding of the formula (rtol 1e-5); fitted statistics are
computed by hand batch by batch, as ``collect`` sees them.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import (
    ASH,
    KNN,
    MSP,
    RMDS,
    Energy,
    Entropy,
    Evaluation,
    GradNorm,
    Mahalanobis,
    MaxLogit,
    NotFittedError,
    ReAct,
    Scale,
    ViM,
    evaluate,
    fit_detectors,
)
from scio_recorder.ood.metrics import ALL_METRICS, ood_metrics

F64 = torch.float64


class Net(nn.Module):
    """Feature maps, then a small MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        )
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(16, 8)
        self.act = nn.ReLU()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.act(self.fc1(self.flatten(self.features(x)))))


def backbone(net, x):
    return net.features(x)


def head(net, h):
    return net.fc(net.act(net.fc1(net.flatten(h))))


def penultimate(net, x):
    return net.act(net.fc1(net.flatten(net.features(x))))


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net().eval()


@pytest.fixture
def rnet(net):
    return Recorder(net, input_size=(1, 3, 6, 6))


@pytest.fixture
def data():
    gen = torch.Generator().manual_seed(1)
    train = [
        (
            torch.randn(16, 3, 6, 6, generator=gen),
            torch.randint(0, 3, (16,), generator=gen),
        )
        for _ in range(4)
    ]
    x = torch.randn(10, 3, 6, 6, generator=gen)
    return train, x


def close(a, b):
    torch.testing.assert_close(a.to(F64), b.to(F64), rtol=1e-5, atol=1e-6)


def energy(logits, t=1.0):
    return -t * torch.logsumexp(logits / t, dim=1)


# ------------------------------------------------------------ from the logits
def test_logit_detectors_equal_their_formulas(net, rnet, data):
    _, x = data
    with torch.no_grad():
        logits = net(x)
    p = logits.softmax(1)
    close(MSP(rnet)(x), -p.max(1).values)
    close(MaxLogit(rnet)(x), -logits.max(1).values)
    close(Energy(rnet)(x), energy(logits))
    close(Energy(rnet, t=2.0)(x), energy(logits, 2.0))
    close(Entropy(rnet)(x), -(p * p.log()).sum(1))


# --------------------------------------------------------------- edits
def test_react_clips_at_the_exact_quantile_of_the_fit_activations(net, rnet, data):
    train, x = data
    react = ReAct(rnet, layer="features.2").fit(train)
    with torch.no_grad():
        acts = torch.cat([backbone(net, xb).reshape(-1) for xb, _ in train])
        threshold = torch.quantile(acts.to(F64), 0.9)
        want = energy(head(net, backbone(net, x).clamp(max=threshold.float())))
    close(react.threshold, threshold)
    close(react(x), want)


def ash_by_hand(h, percentile, variant):
    """ASH on flattened feature maps, with a sort instead of top-k."""
    flat = h.reshape(h.shape[0], -1)
    n = flat.shape[1]
    k = n - round(n * percentile)
    order = flat.argsort(dim=1, descending=True)[:, :k]
    mask = torch.zeros_like(flat).scatter(1, order, 1.0)
    s1 = flat.sum(1, keepdim=True)
    if variant == "ash-p":
        out = flat * mask
    elif variant == "ash-b":
        out = mask * s1 / k
    else:
        pruned = flat * mask
        out = pruned * torch.exp(s1 / pruned.sum(1, keepdim=True))
    return out.reshape(h.shape)


@pytest.mark.parametrize("variant", ["ash-p", "ash-b", "ash-s"])
def test_ash_equals_the_paper_on_a_hand_cut_net(net, rnet, data, variant):
    _, x = data
    got = ASH(rnet, layer=(2, 3), variant=variant, percentile=0.5)(x)
    with torch.no_grad():
        want = energy(head(net, ash_by_hand(backbone(net, x), 0.5, variant)))
    close(got, want)


def test_scale_multiplies_the_unpruned_activations(net, rnet, data):
    _, x = data
    with torch.no_grad():
        h = backbone(net, x)
        flat = h.reshape(10, -1)
        top = flat.sort(dim=1, descending=True).values[:, : 16 - round(16 * 0.65)]
        factor = torch.exp(flat.sum(1) / top.sum(1))
        want = energy(head(net, h * factor[:, None, None, None]))
    close(Scale(rnet, layer="features.2")(x), want)


# ------------------------------------------------------------ features
def features_by_batch(net, batches):
    with torch.no_grad():
        return torch.cat([penultimate(net, xb) for xb, _ in batches])


def test_mahalanobis_is_the_distance_to_the_closest_class(net, rnet, data):
    train, x = data
    maha = Mahalanobis(rnet).fit(train, target=1)
    f = features_by_batch(net, train).to(F64)
    y = torch.cat([yb for _, yb in train])
    means = torch.stack([f[y == c].mean(0) for c in range(3)])
    centred = f - means[y]
    precision = torch.linalg.pinv(centred.T @ centred / len(f), hermitian=True)
    with torch.no_grad():
        g = penultimate(net, x).to(F64)
    want = torch.stack([(((g - m) @ precision) * (g - m)).sum(1) for m in means]).amin(
        0
    )
    close(maha(x), want)


def test_mahalanobis_on_a_named_layer_reads_its_output(net, rnet, data):
    train, x = data
    maha = Mahalanobis(rnet, layer="fc1").fit(train, target=1)
    assert maha.config() == {"layer": [1, 3], "features": "output"}
    assert maha(x).shape == (10,)


def test_knn_is_the_distance_to_the_kth_normalised_neighbour(net, rnet, data):
    train, x = data
    knn = KNN(rnet, k=3).fit(train)
    bank = F.normalize(features_by_batch(net, train), dim=1)
    with torch.no_grad():
        z = F.normalize(penultimate(net, x), dim=1)
    distances = ((z[:, None, :] - bank[None, :, :]) ** 2).sum(-1).sqrt()
    close(knn(x), distances.sort(dim=1).values[:, 2])


def test_vim_equals_the_paper(net, rnet, data):
    train, x = data
    vim = ViM(rnet, d=3).fit(train)
    w, b = net.fc.weight.detach().to(F64), net.fc.bias.detach().to(F64)
    u = -torch.linalg.pinv(w) @ b
    f = features_by_batch(net, train).to(F64)
    second = (f - u).T @ (f - u) / len(f)
    values, vectors = torch.linalg.eigh(second)
    residual = vectors[:, values.argsort(descending=True)[3:]]
    logits = f @ w.T + b
    alpha = logits.max(1).values.mean() / ((f - u) @ residual).norm(dim=1).mean()
    with torch.no_grad():
        g = penultimate(net, x).to(F64)
    want = alpha * ((g - u) @ residual).norm(dim=1) - torch.logsumexp(g @ w.T + b, 1)
    close(vim.alpha, alpha)
    close(vim(x), want)


# ------------------------------------------------------------ gradients
def test_gradnorm_equals_autograd_sample_by_sample(net, rnet, data):
    """The closed form equals the L1 norm of dKL/dW from autograd."""
    _, x = data
    got = GradNorm(rnet, t=2.0)(x)
    want = []
    for sample in x:
        w = net.fc.weight.detach().clone().requires_grad_()
        with torch.no_grad():
            f = penultimate(net, sample[None])
        z = F.linear(f, w, net.fc.bias.detach())
        uniform = torch.full_like(z, 1 / z.shape[1])
        kl = (uniform * (uniform.log() - torch.log_softmax(z / 2.0, dim=1))).sum()
        (grad,) = torch.autograd.grad(kl, w)
        want.append(-grad.abs().sum())
    close(got, torch.stack(want))
    assert net.fc.weight.grad is None


# ----------------------------------------------------------- the net as found
def test_fitting_and_scoring_leave_the_net_and_the_selection_as_found(net, rnet, data):
    train, x = data
    rnet.record((1, 4), inputs="fc")
    detectors = [
        ReAct(rnet, layer="features.2").fit(train),
        Mahalanobis(rnet).fit(train, target=1),
        ViM(rnet, d=3).fit(train),
        ASH(rnet, layer="features.2"),
        Scale(rnet, layer="features.2"),
        KNN(rnet, k=2).fit(train),
        GradNorm(rnet),
        MSP(rnet),
    ]
    for detector in detectors:
        detector(x)
    assert rnet.selection.outputs == ((1, 4),)
    assert rnet.selection.inputs == ((1, 5),)
    with torch.no_grad():
        out = rnet(x)
        assert torch.equal(out, net(x))
    assert torch.equal(rnet.activations[(1, 4)], penultimate(net, x))
    assert all(p.grad is None for p in net.parameters())


# ----------------------------------------------------------- bad requests
def test_bad_requests_name_the_fix(rnet, data):
    train, x = data
    with pytest.raises(
        ValueError, match=r"^ReAct: layer 'nope' is not a layer of this net"
    ):
        ReAct(rnet, layer="nope")
    with pytest.raises(ValueError, match=r"selects 2 calls \(1-3, 1-5\); name one"):
        ASH(rnet, layer=nn.Linear)
    with pytest.raises(
        TypeError,
        match=r"^ViM: fc='features.0' is a Conv2d; it must be an nn.Linear\.$",
    ):
        ViM(rnet, d=2, fc="features.0")
    with pytest.raises(ValueError, match=r"^ViM: d must be an int in \[1, 8\)"):
        ViM(rnet, d=8)
    msg = (
        "ReAct must be fitted before scoring: call `detector.fit(batches)` on "
        "in-distribution data, or `detector.load(path)`."
    )
    with pytest.raises(NotFittedError, match=f"^{re.escape(msg)}$"):
        ReAct(rnet, layer="fc1")(x)
    saving = msg.replace("before scoring", "before saving")
    with pytest.raises(NotFittedError, match=f"^{re.escape(saving)}$"):
        ReAct(rnet, layer="fc1").save("never-written.safetensors")
    with pytest.raises(
        ValueError, match=r"^Mahalanobis.fit needs class labels: pass `target=`"
    ):
        Mahalanobis(rnet).fit(train)
    one_class = [(xb, torch.zeros_like(yb)) for xb, yb in train]
    msg = (
        "Mahalanobis needs at least two classes in the fit data; the targets hold "
        "only class 0. Check `target=` and the batches."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        Mahalanobis(rnet).fit(one_class, target=1)
    # RMDS said "Mahalanobis": the name of the class it builds on
    with pytest.raises(
        ValueError, match=f"^{re.escape(msg.replace('Mahalanobis', 'RMDS'))}$"
    ):
        RMDS(rnet).fit(one_class, target=1)
    with pytest.raises(
        ValueError, match=r"^Mahalanobis: num_classes must be an int >= 2, got 1$"
    ):
        Mahalanobis(rnet, num_classes=1)
    with pytest.raises(
        ValueError, match=r"^KNN: k=100 is more than the 64 fit samples"
    ):
        KNN(rnet, k=100).fit(train)
    with pytest.raises(ValueError, match=r"^ASH: variant must be one of"):
        ASH(rnet, layer="fc1", variant="ash-x")
    with pytest.raises(
        ValueError, match=r"^ReAct: percentile must be a fraction in \[0, 1\)"
    ):
        ReAct(rnet, layer="fc1", percentile=90)
    with pytest.raises(
        TypeError, match=r"^MSP takes a Recorder, got Net: wrap the net"
    ):
        MSP(rnet.net)


def test_a_layer_that_outputs_no_tensor_is_refused():
    class Pair(nn.Module):
        def forward(self, x):
            return x, x

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair = Pair()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            a, b = self.pair(x)
            return self.fc(a + b)

    rnet = Recorder(Two(), input_size=(1, 4))
    msg = (
        "Scale: layer 1-1 (Pair `pair`) outputs a tuple, not one tensor; choose a "
        "layer whose output is a tensor."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        Scale(rnet, layer="pair")(torch.ones(2, 4))
    assert rnet.recording == ()  # the selection is back


# ----------------------------------------------------------- save and load
def test_fitted_state_saves_and_loads(rnet, data, tmp_path):
    train, x = data
    for make in (
        lambda: ReAct(rnet, layer="features.2"),
        lambda: Mahalanobis(rnet),
        lambda: KNN(rnet, k=2),
        lambda: ViM(rnet, d=3),
    ):
        fitted = make().fit(train, target=1)
        path = fitted.save(tmp_path / f"{type(fitted).__name__}.safetensors")
        again = make().load(path)
        assert torch.equal(again(x), fitted(x))
    with pytest.raises(
        ValueError, match=r"configured otherwise \(k: saved \[2\], now \[5\]\)"
    ):
        KNN(rnet, k=5).load(tmp_path / "KNN.safetensors")
    with pytest.raises(ValueError, match=r"holds the state of a KNN, not of a ViM"):
        ViM(rnet, d=3).load(tmp_path / "KNN.safetensors")


# ----------------------------------------------------------- evaluate
def test_evaluate_shares_passes_and_gives_the_metrics(net, rnet, data):
    train, x = data
    detectors = {
        "MSP": MSP(rnet),
        "Energy": Energy(rnet),
        "MaxLogit": MaxLogit(rnet),
        "Entropy": Entropy(rnet),
        "Mahalanobis": Mahalanobis(rnet).fit(train, target=1),
        "KNN": KNN(rnet, k=2).fit(train),
        "ReAct": ReAct(rnet, layer="features.2").fit(train),
        "ASH": ASH(rnet, layer="features.2"),
    }
    calls = []
    handle = net.register_forward_pre_hook(lambda *_: calls.append(1))
    ood = [3 * torch.randn(8, 3, 6, 6)]
    try:
        result = evaluate(detectors, [x[:5], x[5:]], ood, input=None)
    finally:
        handle.remove()
    assert len(calls) == 3 * 3  # 3 batches x (1 shared pass + 2 edits)
    assert isinstance(result, Evaluation)
    assert list(result) == list(detectors)
    for name, detector in detectors.items():
        old = ood_metrics(detector(x), detector(ood[0]))  # the four of before
        assert {key: result[name][key] for key in old} == old
        assert result[name] == ood_metrics(
            detector(x), detector(ood[0]), names=ALL_METRICS
        )
    assert result.table().splitlines()[0] == (
        "| detector (OoD) | AUROC | AUPR-IN | AUPR-OUT | FPR95TPR |"
    )
    several = evaluate(detectors, [x], {"a": ood, "b": [x]}, input=None)
    assert several["b"]["MSP"]["AUROC"] == 0.5


# ----------------------------------------------------------- metrics
scores = st.lists(st.integers(-3, 3), min_size=1, max_size=25)


@settings(max_examples=80, deadline=None)
@given(scores, scores)
def test_metrics_equal_scikit_learn_ties_included(id_scores, ood_scores):
    """Small integer scores make ties the rule; scikit-learn is the oracle."""
    labels = [0] * len(id_scores) + [1] * len(ood_scores)
    values = [float(s) for s in id_scores + ood_scores]
    got = ood_metrics(id_scores, ood_scores)
    assert got["AUROC"] == pytest.approx(roc_auc_score(labels, values), abs=1e-12)
    assert got["AUPR-OUT"] == pytest.approx(
        average_precision_score(labels, values), abs=1e-12
    )
    flipped = [1 - v for v in labels]
    assert got["AUPR-IN"] == pytest.approx(
        average_precision_score(flipped, [-v for v in values]), abs=1e-12
    )
    fpr, tpr, _ = roc_curve(labels, values, drop_intermediate=False)
    assert got["FPR95TPR"] == pytest.approx(fpr[(tpr >= 0.95).argmax()], abs=1e-12)


def test_metrics_refuse_empty_and_nan():
    with pytest.raises(ValueError, match=r"^id_scores is empty"):
        ood_metrics([], [1.0])
    with pytest.raises(ValueError, match=r"^ood_scores holds NaN scores"):
        ood_metrics([1.0], [float("nan")])


def test_fit_detectors_is_one_pass_with_the_same_fits(net, rnet, data):
    """Detectors reading the same layer share its records: one pass, same state."""
    train, _ = data

    def make():
        return [
            Mahalanobis(rnet),
            KNN(rnet, k=2),
            ReAct(rnet, layer="features.2"),
            MSP(rnet),
        ]

    apart = make()
    for detector in apart:
        detector.fit(train, target=1)
    together = make()
    calls = []
    handle = net.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        fit_detectors(together, train, target=1)
    finally:
        handle.remove()
    assert len(calls) == len(train)
    for one, other in zip(apart, together, strict=True):
        assert one.fitted
        assert other.fitted
        for key, value in one.state().items():
            torch.testing.assert_close(other.state()[key], value, rtol=0, atol=0)
    with pytest.raises(
        ValueError, match=r"^Mahalanobis need class labels: pass `target=`"
    ):
        fit_detectors(make(), train)


# ------------------------------------------------------ multi-pass fits
class FailsOnPass:
    """A re-iterable of batches whose ``n``-th iteration (from 1) raises."""

    def __init__(self, batches, n: int) -> None:
        self.batches, self.n, self.passes = batches, n, 0

    def __iter__(self):
        self.passes += 1
        for i, batch in enumerate(self.batches):
            if self.passes == self.n and i == 1:
                msg = f"injected failure in pass {self.n}"
                raise RuntimeError(msg)
            yield batch


def count_passes(net):
    calls = []
    return calls, net.register_forward_pre_hook(lambda *_: calls.append(1))


def test_vim_fit_with_a_spill_dir_keeps_each_pass_apart(rnet, data, tmp_path):
    """Both passes checkpoint in their own subfolder; a rerun resumes both."""
    train, x = data
    plain = ViM(rnet, d=3).fit(train)
    spilled = ViM(rnet, d=3).fit(train, spill_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pass-0", "pass-1"]
    again = ViM(rnet, d=3).fit(train, spill_dir=tmp_path)  # resumes both passes
    for other in (spilled, again):
        # the same reductions of the same batches in the same order: bit-exact
        assert torch.equal(other.residual, plain.residual)
        assert torch.equal(other.alpha, plain.alpha)
        assert torch.equal(other(x), plain(x))


@pytest.mark.parametrize("kind", ["generator", "iterator"])
def test_multi_pass_fits_refuse_one_shot_iterators_up_front(net, rnet, data, kind):
    train, _ = data

    def one_shot():
        return (b for b in train) if kind == "generator" else iter(train)

    calls, handle = count_passes(net)
    try:
        with pytest.raises(
            TypeError,
            match=r"^ViM\.fit iterates `batches` 2 times .*can be iterated only "
            r"once.*Pass a list or a DataLoader",
        ):
            ViM(rnet, d=3).fit(one_shot())
        with pytest.raises(
            TypeError,
            match=r"^fit_detectors iterates `batches` 3 times \(one shared by KNN, "
            r"ViM\.fit \(2 passes\)\).*Pass a list or a DataLoader",
        ):
            fit_detectors([KNN(rnet), ViM(rnet, d=3)], one_shot())
    finally:
        handle.remove()
    assert calls == []  # refused before the first pass
    # one pass in all: a generator is fine
    found = [KNN(rnet), Mahalanobis(rnet)]
    fit_detectors(found, one_shot(), target=1)
    assert all(d.fitted for d in found)


def test_fit_detectors_with_a_vim_and_a_spill_dir(rnet, data, tmp_path):
    train, x = data
    apart = [Mahalanobis(rnet).fit(train, target=1), ViM(rnet, d=3).fit(train)]
    together = [Mahalanobis(rnet), ViM(rnet, d=3)]
    fit_detectors(together, train, target=1, spill_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1-ViM", "shared"]
    assert sorted(p.name for p in (tmp_path / "1-ViM").iterdir()) == [
        "pass-0",
        "pass-1",
    ]
    for one, other in zip(apart, together, strict=True):
        assert torch.equal(one(x), other(x))


def test_fit_detectors_is_all_or_nothing(rnet, data):
    """A failure in any pass leaves every detector as it was: unfitted ones
    unfitted, fitted ones with their old state (not half of a new one)."""
    train, x = data
    knn = KNN(rnet, k=2).fit(train[:1])
    vim = ViM(rnet, d=3).fit(train[:2])
    old_bank, old_alpha, old_residual = knn.bank, vim.alpha, vim.residual
    old_scores = knn(x), vim(x)
    maha = Mahalanobis(rnet)
    for n in (1, 2, 3):  # the shared pass, ViM's first, ViM's second
        with pytest.raises(RuntimeError, match=f"injected failure in pass {n}"):
            fit_detectors([knn, maha, vim], FailsOnPass(train, n), target=1)
        assert knn.fitted
        assert vim.fitted
        assert not maha.fitted
        assert knn.bank is old_bank
        assert vim.alpha is old_alpha
        assert vim.residual is old_residual
        assert torch.equal(knn(x), old_scores[0])
        assert torch.equal(vim(x), old_scores[1])
    # a failure in a detector's reading of the shared pass: the same
    one_class = [(xb, torch.zeros_like(yb)) for xb, yb in train]
    with pytest.raises(ValueError, match="at least two classes"):
        fit_detectors([knn, maha], one_class, target=1)
    assert knn.bank is old_bank
    assert not maha.fitted
    # and a lone ViM whose second pass fails keeps its old fit
    with pytest.raises(RuntimeError, match="injected failure in pass 2"):
        vim.fit(FailsOnPass(train, 2))
    assert vim.alpha is old_alpha
    assert vim.residual is old_residual
