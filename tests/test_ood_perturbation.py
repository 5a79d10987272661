"""FeatureSqueezing, Odds and the input preprocessing of the Mahalanobis family.

Oracles: the squeezers against SciPy's ``vectorized_filter`` with
``np.median`` (scio's own) and the bit-depth formula; the scores written out
with the net called directly (``net(x)``, ``softmax``, the norms), Odds'
statistics and z-scores with loops over the classes and ``torch.var``, the
preprocessing step with ``torch.autograd.grad`` of the distance written out
on the net cut by hand. Our detectors run the net through the recorder in
other batch shapes than the oracles: float32 logits then differ by a few
roundings (``eps32`` times their magnitude), which bounds each comparison.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.ndimage import vectorized_filter
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import (
    RMDS,
    FeatureSqueezing,
    Mahalanobis,
    MahalanobisEnsemble,
    Odds,
    evaluate,
    fit_detectors,
)
from scio_recorder.ood._perturbation import (
    bits_squeeze,
    gradient_step,
    median_squeeze,
    sample_noise,
)

F64 = torch.float64
EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture
def setup():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64, 8),
        nn.Tanh(),
        nn.Linear(8, 3),
    ).eval()
    x = torch.rand(45, 1, 4, 4)
    y = torch.arange(45) % 3
    return net, Recorder(net, input_size=(1, 1, 4, 4)), [(x, y)], torch.rand(6, 1, 4, 4)


def logits_of(net, x):
    with torch.no_grad():
        return net(x)


# ----------------------------------------------------------------- squeezers
@settings(max_examples=40, deadline=None)
@given(
    shape=st.sampled_from([(3, 7), (2, 5, 6), (2, 3, 5, 4)]),
    size=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_median_squeeze_is_scipys_vectorized_median(shape, size, seed):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(seed))
    axes = {2: (1,), 3: (1, 2), 4: (2, 3)}[len(shape)]
    want = vectorized_filter(x.numpy(), np.median, size=size, axes=axes)
    assert torch.equal(median_squeeze(x, size), torch.from_numpy(want))


def test_bits_squeeze_rounds_to_bin_centres():
    x = torch.tensor([0.0, 0.1, 0.126, 0.5, 0.99, 1.0])
    want = torch.tensor([np.round(v * 8) / 8 + 1 / 16 for v in x.tolist()])
    assert torch.equal(bits_squeeze(x, 3), want.float())


def test_feature_squeezing_is_the_largest_l1_distance_of_the_softmaxes(setup):
    net, rnet, _, x = setup
    p = torch.softmax(logits_of(net, x).double(), dim=1)
    squeezed = [bits_squeeze(x, 2), median_squeeze(x, 2)]
    d = torch.stack(
        [
            (p - torch.softmax(logits_of(net, s).double(), dim=1)).abs().sum(dim=1)
            for s in squeezed
        ],
        dim=1,
    )
    detector = FeatureSqueezing(rnet, squeezers=["bits:2", "median:2"])
    # Probabilities (<= 1) of float32 logits: 3 classes, a few roundings each.
    tol = {"rtol": 0, "atol": 16 * 3 * EPS32}
    torch.testing.assert_close(detector(x).double(), d.amax(dim=1), **tol)
    mean = FeatureSqueezing(rnet, squeezers=["bits:2", "median:2"], aggregation="mean")
    torch.testing.assert_close(mean(x).double(), d.mean(dim=1), **tol)
    norm = FeatureSqueezing(
        rnet, squeezers=["bits:2", "median:2"], aggregation=2.0, dist_norm=1
    )
    torch.testing.assert_close(norm(x).double(), d.norm(dim=1), **tol)


def test_feature_squeezing_takes_callables(setup):
    net, rnet, _, x = setup
    detector = FeatureSqueezing(rnet, squeezers=lambda t: t.flip(-1))
    p = torch.softmax(logits_of(net, x), dim=1)
    q = torch.softmax(logits_of(net, x.flip(-1)), dim=1)
    torch.testing.assert_close(detector(x), (p - q).abs().sum(dim=1))
    assert detector.config()["squeezers"] == ["<lambda>"]


@pytest.mark.parametrize(
    ("squeezers", "message"),
    [
        ("bits:0", "FeatureSqueezing: 'bits:n' needs 0 < n < 32, got 'bits:0'"),
        (
            "median:0",
            "FeatureSqueezing: 'median:s' needs a size s >= 1, got 'median:0'",
        ),
        (
            ["blur:2"],
            (
                "FeatureSqueezing: squeezer 'blur:2' is not 'bits:n' (n-bit "
                "depth), 'median:s' (median filter of size s) or a callable "
                "`x -> squeezed x`."
            ),
        ),
        ([], "FeatureSqueezing: give at least one squeezer, e.g. ['bits:3']."),
    ],
)
def test_feature_squeezing_refuses_unknown_squeezers(setup, squeezers, message):
    _, rnet, _, _ = setup
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FeatureSqueezing(rnet, squeezers=squeezers)


def fewer_rows(t):
    return t[:1]


def to_double(t):
    return t.double()


def nothing(t):
    return None


@pytest.mark.parametrize(
    ("squeezer", "error", "got"),
    [
        # one row was broadcast against the batch's: silently wrong scores
        (fewer_rows, ValueError, "a tensor of shape [1, 1, 4, 4] and dtype float32"),
        (to_double, ValueError, "a tensor of shape [3, 1, 4, 4] and dtype float64"),
        (nothing, TypeError, "a NoneType"),
    ],
)  # fmt: skip
def test_feature_squeezing_checks_the_squeezed_input_naming_the_squeezer(
    squeezer, error, got
):
    rnet = Recorder(
        nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), input_size=(1, 1, 4, 4)
    )
    detector = FeatureSqueezing(rnet, squeezers=["bits:3", squeezer])
    message = (
        f"FeatureSqueezing: squeezer {squeezer.__name__!r} returned {got}, where the "
        "input is a tensor of shape [3, 1, 4, 4] and dtype torch.float32. A "
        "squeezer returns the squeezed input: a tensor of its shape and dtype."
    )
    message = message.replace("dtype float", "dtype torch.float")
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        detector(torch.rand(3, 1, 4, 4))


def test_feature_squeezing_refuses_token_ids():
    rnet = Recorder(nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2)),
                    input_data=torch.zeros(1, 3, dtype=torch.long))  # fmt: skip
    with pytest.raises(
        TypeError, match=r"must be a floating tensor; got a torch\.int64"
    ):
        FeatureSqueezing(rnet, squeezers="bits:3")(torch.zeros(2, 3, dtype=torch.long))


def test_median_squeeze_refuses_four_dimensional_samples():
    with pytest.raises(
        ValueError, match=r"samples of 1, 2 or 3 dims .* \[1, 2, 2, 2\]"
    ):
        median_squeeze(torch.zeros(2, 1, 2, 2, 2), 2)


# ----------------------------------------------------------------- noise
@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 150), start=st.integers(0, 150), seed=st.integers(0, 9))
def test_sample_noise_depends_on_the_sample_and_seed_only(count, start, seed):
    x = torch.rand(2, 3, generator=torch.Generator().manual_seed(seed))
    whole = sample_noise(x[0], start + count, seed=seed)
    part = sample_noise(x[0].clone(), count, seed=seed, start=start)
    assert torch.equal(part, whole[start:])
    assert bool((whole.abs() <= 1).all())
    assert not torch.equal(sample_noise(x[1], count, seed=seed), part[:0].new_zeros(0))
    assert not torch.equal(sample_noise(x[0], 64, seed=seed + 1), whole[:64]) or (
        start + count < 64
    )


def test_sample_noise_keeps_the_samples_dtype():
    x = torch.rand(4, dtype=F64)
    noise = sample_noise(x, 3, seed=0)
    assert noise.dtype == F64
    assert noise.shape == (3, 4)
    half = sample_noise(x.half(), 3, seed=0)
    assert half.dtype == torch.float16


# ----------------------------------------------------------------- Odds
def odds_oracle(net, train, x, *, epsilon, draws, seed, scale="std"):
    """Odds written out: per-class shift statistics, then the z-scores' sum."""
    (fit_x, y) = train[0]
    classes = 3
    rows = {c: [] for c in range(classes)}
    for xi, yi in zip(fit_x, y.tolist(), strict=True):
        clean = logits_of(net, xi[None])[0].double()
        noisy = logits_of(net, xi + epsilon * sample_noise(xi, draws, seed=seed))
        noisy = noisy.double()
        rows[yi].append((noisy - noisy[:, yi : yi + 1]) - (clean - clean[yi]))
    mean = torch.stack([torch.cat(rows[c]).mean(0) for c in range(classes)])
    var = torch.stack([torch.cat(rows[c]).var(0) for c in range(classes)])
    spread = var if scale == "variance" else var.sqrt()
    scores = torch.zeros(len(x), classes, dtype=F64)
    for b, xb in enumerate(x):
        clean = logits_of(net, xb[None])[0].double()
        noisy = logits_of(net, xb + epsilon * sample_noise(xb, draws, seed=seed))
        shift = noisy.double().mean(0) - clean
        for c in range(classes):
            for z in range(classes):
                if z != c:
                    g = shift[z] - shift[c]
                    scores[b, c] += (g - mean[c, z]) / spread[c, z]
    return mean, var, scores


def odds_tolerance(net, odds, train, x):
    """Bounds from float32 logits computed in other batch shapes.

    A logit is off by a few roundings of each layer's dot products, ``16
    eps32 max|z|``; a shift row combines four logits (``4`` of that), and
    its mean too; a variance of rows of size ``r`` moves by ``2 r`` times
    the rows' error. A z-score ``(g - mu) / s`` is then off by ``(dg +
    dmu) / s + |z| ds / s`` (``ds = dvar / (2 s)`` for a deviation), summed
    over the other classes.
    """
    (fit_x, _) = train[0]
    z_max = float(logits_of(net, torch.cat([fit_x, x])).abs().max())
    row_error = 4 * 16 * EPS32 * (z_max + 1)
    shift, _ = odds.shifts((x,), {})
    g = shift[:, None, :] - shift[:, :, None]
    spread = odds.std.square() if odds.scale == "variance" else odds.std
    size = g.abs().amax() + odds.mean.abs().amax() + 2 * odds.std.amax()
    variance_error = 2 * float(size) * row_error
    d_spread = (
        variance_error if odds.scale == "variance" else variance_error / (2 * odds.std)
    )
    z = ((g - odds.mean) / spread).abs()
    per_z = (2 * row_error + z * d_spread) / spread
    per_z = per_z.where(~torch.eye(3, dtype=torch.bool), 0)
    return row_error, variance_error, per_z.sum(dim=2)


@pytest.mark.parametrize("scale", ["std", "variance"])
def test_odds_is_the_sum_of_the_standardised_shifts(setup, scale):
    net, rnet, train, x = setup
    mean, var, want = odds_oracle(
        net, train, x, epsilon=0.2, draws=40, seed=3, scale=scale
    )
    odds = Odds(rnet, epsilon=0.2, noise_samples=40, seed=3, scale=scale)
    odds.fit(train, target=1)
    row_error, variance_error, tol = odds_tolerance(net, odds, train, x)
    torch.testing.assert_close(odds.mean, mean, rtol=0, atol=row_error)
    torch.testing.assert_close(odds.std.square(), var, rtol=0, atol=variance_error)
    mine = odds.score_classes(x)
    assert bool(((mine - want).abs() <= tol).all())
    predicted = logits_of(net, x).argmax(dim=1)
    rows = torch.arange(len(x))
    assert bool(((odds(x) - want[rows, predicted]).abs() <= tol[rows, predicted]).all())
    closest = Odds(rnet, epsilon=0.2, noise_samples=40, seed=3, scale=scale,
                   at="closest").fit(train, target=1)  # fmt: skip
    assert torch.equal(closest(x), mine.amin(dim=1))


def test_odds_detect_and_rectify_take_the_extreme_z_score(setup):
    _, rnet, train, x = setup
    sums = Odds(rnet, epsilon=0.2, noise_samples=8).fit(train, target=1)
    shift, _ = sums.shifts((x,), {})
    z = ((shift[:, None, :] - shift[:, :, None]) - sums.mean) / sums.std
    off = ~torch.eye(3, dtype=torch.bool)
    for name, want in (
        ("detect", z.where(off, -torch.inf).amax(dim=2)),
        ("rectify", z.where(off, torch.inf).amin(dim=2)),
        ("sum", z.where(off, 0).sum(dim=2)),
    ):
        odds = Odds(rnet, epsilon=0.2, noise_samples=8, z_aggregation=name)
        odds.load_state(sums.state())
        odds._fitted = True
        torch.testing.assert_close(odds.score_classes(x), want, rtol=0, atol=1e-9)


def test_odds_scores_an_input_alike_in_any_batch(setup):
    _, rnet, train, x = setup
    odds = Odds(rnet, epsilon=0.2, noise_samples=100).fit(train, target=1)
    alone = torch.cat([odds(x[i : i + 1]) for i in range(len(x))])
    order = torch.randperm(len(x))
    shuffled = odds(x[order])[order.argsort()]
    # The same noise for each sample; its passes come in other batch shapes.
    torch.testing.assert_close(alone, odds(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(shuffled, odds(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(odds(x), odds(x))
    other = Odds(rnet, epsilon=0.2, noise_samples=100, seed=1).fit(train, target=1)
    assert not torch.allclose(other(x), odds(x))


def test_odds_scores_a_class_without_fit_samples_inf(setup):
    _, rnet, train, x = setup
    (fit_x, y) = train[0]
    odds = Odds(rnet, epsilon=0.2, noise_samples=4, at="closest")
    odds.fit([(fit_x[y < 2], y[y < 2])], target=1)
    scores = odds.score_classes(x)
    assert bool(torch.isinf(scores[:, 2]).all())
    assert bool(torch.isfinite(scores[:, :2]).all())


def test_odds_saves_and_loads(setup, tmp_path):
    _, rnet, train, x = setup
    odds = Odds(rnet, epsilon=0.2, noise_samples=8).fit(train, target=1)
    path = odds.save(tmp_path / "odds.safetensors")
    again = Odds(rnet, epsilon=0.2, noise_samples=8).load(path)
    assert torch.equal(again(x), odds(x))
    with pytest.raises(ValueError, match=r"configured otherwise \(epsilon: saved"):
        Odds(rnet, epsilon=0.3, noise_samples=8).load(path)


def test_odds_refuses_what_it_cannot_use(setup):
    _, rnet, train, _ = setup
    with pytest.raises(ValueError, match=r"^Odds\.fit needs class labels: pass"):
        Odds(rnet, epsilon=0.1).fit(train)
    with pytest.raises(TypeError, match=r"^Odds\.fit runs its own loop .* spill_dir"):
        Odds(rnet, epsilon=0.1).fit(train, target=1, spill_dir="x")
    for epsilon in (-1.0, 0, 0.0):  # no noise: every z-score would be x / 0
        with pytest.raises(
            ValueError, match=r"^Odds: epsilon must be a finite number > 0, got"
        ):
            Odds(rnet, epsilon=epsilon)
    with pytest.raises(ValueError, match=r"^Odds: noise_samples must be an int >= 1"):
        Odds(rnet, epsilon=0.1, noise_samples=0)
    with pytest.raises(ValueError, match=r"^Odds: z_aggregation must be one of"):
        Odds(rnet, epsilon=0.1, z_aggregation="max")
    bad = [(train[0][0], train[0][1] + 5)]
    with pytest.raises(
        ValueError, match=r"^Odds\.fit: class label 7 in batch 0 .* outside \[0, 3\)"
    ):
        Odds(rnet, epsilon=0.1).fit(bad, target=1)


# ----------------------------------------------------------------- epsilon
def test_gradient_step_moves_against_the_sign_of_the_gradient(setup):
    net, rnet, _, x = setup
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(net(leaf)[:, 1].square().sum(), leaf)
    (moved,), clean = gradient_step(
        rnet, (x,), {}, lambda p: [p.logits[:, 1].square().sum()],
        epsilon=0.1, who="test",
    )  # fmt: skip
    assert torch.equal(moved, x - 0.1 * grad.sign())
    assert torch.equal(clean.logits, logits_of(net, x))
    assert not clean.logits.requires_grad
    assert all(p.grad is None for p in net.parameters())


def preprocessed_distances(net, detector, x, epsilon, *, upto, background=False):
    """Lee et al.'s step written out: ``-eps sign(grad d_closest)``, then ``d``."""
    means, precision = detector.means.to(F64), detector.precision.to(F64)

    def class_distances(features):
        d = torch.stack(
            [(((features - m) @ precision) * (features - m)).sum(1) for m in means],
            dim=1,
        )
        if background:
            mu0 = detector.background_mean.to(F64)
            d = (
                d
                - (
                    ((features - mu0) @ detector.background_precision)
                    * (features - mu0)
                ).sum(1)[:, None]
            )
        return d

    leaf = x.clone().requires_grad_()
    d = class_distances(net[:upto](leaf).flatten(1).to(F64))
    closest = d.gather(1, d.detach().argmin(dim=1)[:, None]).sum()
    (grad,) = torch.autograd.grad(closest, leaf)
    step = grad.sign().where(grad.abs() > EPS32, 0)
    with torch.no_grad():
        return class_distances(net[:upto](x - epsilon * step).flatten(1).to(F64))


@pytest.mark.parametrize("kind", [Mahalanobis, RMDS])
def test_mahalanobis_epsilon_scores_the_preprocessed_input(setup, kind):
    net, rnet, train, x = setup
    detector = kind(rnet, epsilon=0.05).fit(train, target=1)
    want = preprocessed_distances(
        net, detector, x, 0.05, upto=5, background=kind is RMDS
    )
    # The same float32 features (net[:5] is the last Linear's input) and
    # steps; float64 distances of well-conditioned tanh features.
    torch.testing.assert_close(detector.score_classes(x), want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(detector(x), want.amin(dim=1), rtol=1e-9, atol=1e-9)
    detector.at = "predicted"
    predicted = logits_of(net, x).argmax(dim=1)
    torch.testing.assert_close(detector(x), want[torch.arange(len(x)), predicted])


@pytest.mark.parametrize("kind", [Mahalanobis, RMDS])
def test_epsilon_zero_keeps_the_scores_bit_for_bit(setup, kind):
    _, rnet, train, x = setup
    before = kind(rnet).fit(train, target=1)
    after = kind(rnet, epsilon=0.0).fit(train, target=1)
    assert not after.own_passes
    assert torch.equal(after(x), before(x))
    assert torch.equal(after.score_classes(x), before.score_classes(x))


def test_ensemble_epsilon_moves_the_input_per_layer(setup):
    net, rnet, train, x = setup
    layers = ["1", "4"]
    ens = MahalanobisEnsemble(rnet, layers, pool=None, epsilon=0.05)
    ens.fit(train, target=1)
    per_layer = []
    for i, upto in enumerate((2, 5)):
        one = Mahalanobis(rnet, layer=layers[i]).fit(train, target=1)
        torch.testing.assert_close(one.means, ens.means[i])
        per_layer.append(preprocessed_distances(net, one, x, 0.05, upto=upto))
    summed = per_layer[0] + per_layer[1]
    torch.testing.assert_close(ens.score_classes(x), summed, rtol=1e-7, atol=1e-9)
    closest = per_layer[0].amin(dim=1) + per_layer[1].amin(dim=1)
    torch.testing.assert_close(ens(x), closest, rtol=1e-7, atol=1e-9)
    plain = MahalanobisEnsemble(rnet, layers, pool=None).fit(train, target=1)
    assert torch.equal(
        MahalanobisEnsemble(rnet, layers, pool=None, epsilon=0).fit(train, target=1)(x),
        plain(x),
    )
    with pytest.raises(ValueError, match=r"^MahalanobisEnsemble: aggregation='fisher'"):
        MahalanobisEnsemble(rnet, layers, aggregation="fisher", epsilon=0.1)


def test_own_passes_join_fit_detectors_and_evaluate(setup):
    _, rnet, train, x = setup
    detectors = {
        "maha": Mahalanobis(rnet, epsilon=0.05),
        "odds": Odds(rnet, epsilon=0.2, noise_samples=8),
        "squeeze": FeatureSqueezing(rnet, squeezers="bits:2"),
    }
    fit_detectors(list(detectors.values()), train, target=1)
    results = evaluate(detectors, [x], [torch.rand(5, 1, 4, 4) + 1], input=None)
    assert set(results) == set(detectors)
    for name, detector in detectors.items():
        assert torch.equal(results.id_scores[name], detector(x)), name
