"""Scores per class, their reading at ``at=``, scio's modes, layer aggregation.

The class-conditional detectors (Mahalanobis, RMDS, MahalanobisEnsemble,
KLMatching, SHE; Trust, DkNN and JTLA in ``test_ood_neighbours.py``) give
``score_classes(x)``, one score per class; ``score(x)`` reads it at the
closest class (the row's minimum, or each layer's closest for the
ensemble's sum) or at the predicted one. The oracles write each class's
score with plain torch ops on the net cut by hand, in float64 from the same
float32 features: the scores agree to the rounding of the statistics,
rtol 1e-9 relative to the (well-conditioned, tanh) covariances. The modes
and the p-value combinations are checked against loops written out.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import (
    RMDS,
    SHE,
    KLMatching,
    Mahalanobis,
    MahalanobisEnsemble,
)
from scio_recorder.ood._classes import class_mode
from scio_recorder.ood._pvalues import combine, p_values

F64 = torch.float64
CLOSE = {"rtol": 1e-9, "atol": 1e-12}


@pytest.fixture
def setup():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3)
    ).eval()
    x = torch.randn(90, 5)
    with torch.no_grad():
        # Standardised logits: the net predicts every class, as a trained one.
        logits = net(x)
        net[4].weight /= logits.std(0)[:, None]
        net[4].bias.sub_(logits.mean(0)).div_(logits.std(0))
    y = torch.arange(90) % 3
    return net, Recorder(net, input_size=(1, 5)), [(x, y)], 2 * torch.randn(7, 5)


def features(net, x, upto):
    with torch.no_grad():
        return net[:upto](x).to(F64)


def distances(f, fit, y):
    """Mahalanobis distances of ``f`` to each class of ``fit``: tied W / N."""
    means = torch.stack([fit[y == c].mean(0) for c in range(3)])
    centred = fit - means[y]
    precision = torch.linalg.pinv(centred.T @ centred / len(fit), hermitian=True)
    return torch.stack([(((f - m) @ precision) * (f - m)).sum(1) for m in means], dim=1)


def predicted(net, x):
    with torch.no_grad():
        return net(x).argmax(dim=1)


def test_mahalanobis_scores_each_class_and_reads_one(setup):
    net, rnet, train, x = setup
    (fit_x, y) = train[0]
    want = distances(features(net, x, 4), features(net, fit_x, 4), y)
    maha = Mahalanobis(rnet).fit(train, target=1)
    torch.testing.assert_close(maha.score_classes(x), want, **CLOSE)
    torch.testing.assert_close(maha(x), want.amin(dim=1), **CLOSE)
    at = Mahalanobis(rnet, at="predicted").fit(train, target=1)
    reading = want.gather(1, predicted(net, x)[:, None])[:, 0]
    torch.testing.assert_close(at(x), reading, **CLOSE)


def test_a_class_absent_from_the_fit_scores_inf(setup):
    _, rnet, train, x = setup
    (fit_x, y) = train[0]
    keep = y != 1
    maha = Mahalanobis(rnet).fit([(fit_x[keep], y[keep])], target=1)
    scores = maha.score_classes(x)
    assert scores.shape == (7, 3)
    assert bool(torch.isinf(scores[:, 1]).all())
    assert bool(torch.isfinite(scores[:, [0, 2]]).all())


def test_rmds_scores_each_class_relative_to_the_background(setup):
    net, rnet, train, x = setup
    (fit_x, y) = train[0]
    f, fit = features(net, x, 4), features(net, fit_x, 4)
    mu0 = fit.mean(0)
    precision0 = torch.linalg.pinv((fit - mu0).T @ (fit - mu0) / len(fit))
    background = (((f - mu0) @ precision0) * (f - mu0)).sum(1)
    want = distances(f, fit, y) - background[:, None]
    rmds = RMDS(rnet, at="predicted").fit(train, target=1)
    torch.testing.assert_close(rmds.score_classes(x), want, **CLOSE)
    reading = want.gather(1, predicted(net, x)[:, None])[:, 0]
    torch.testing.assert_close(rmds(x), reading, **CLOSE)


def test_the_ensemble_sums_each_class_over_layers(setup):
    net, rnet, train, x = setup
    (fit_x, y) = train[0]
    layers = [(1, 2), (1, 4)]  # the two tanh
    per_layer = [
        distances(features(net, x, upto), features(net, fit_x, upto), y)
        for upto in (2, 4)
    ]
    ens = MahalanobisEnsemble(rnet, layers, weights=[1.0, 0.5]).fit(train, target=1)
    summed = per_layer[0] + 0.5 * per_layer[1]
    torch.testing.assert_close(ens.score_classes(x), summed, **CLOSE)
    # The closest class of each layer, as before:
    closest = per_layer[0].amin(1) + 0.5 * per_layer[1].amin(1)
    torch.testing.assert_close(ens(x), closest, **CLOSE)
    ens.at = "predicted"
    reading = summed.gather(1, predicted(net, x)[:, None])[:, 0]
    torch.testing.assert_close(ens(x), reading, **CLOSE)


@pytest.mark.parametrize("aggregation", ["fisher", "harmonic", "min"])
def test_the_ensemble_combines_p_values_of_the_fit_distances(setup, aggregation):
    net, rnet, train, x = setup
    (fit_x, y) = train[0]
    ens = MahalanobisEnsemble(rnet, [(1, 2), (1, 4)], aggregation=aggregation)
    ens.fit(train, target=1)
    p = []
    for upto in (2, 4):
        fit = features(net, fit_x, upto)
        own = distances(fit, fit, y).gather(1, y[:, None])[:, 0].tolist()
        mine = distances(features(net, x, upto), fit, y)
        p.append(
            [
                [sum(d >= float(mine[i, c]) for d in own) / len(own) for c in range(3)]
                for i in range(len(x))
            ]
        )
    rules = {
        "fisher": lambda v: sum(math.log(u) if u > 0 else -math.inf for u in v),
        "harmonic": lambda v: 0.0 if 0 in v else len(v) / sum(1 / u for u in v),
        "min": min,
    }
    want = -torch.tensor(
        [
            [rules[aggregation]([p[0][i][c], p[1][i][c]]) for c in range(3)]
            for i in range(7)
        ],
        dtype=F64,
    )
    got = ens.score_classes(x)
    torch.testing.assert_close(got, want, **CLOSE)
    torch.testing.assert_close(ens(x), want.amin(dim=1), **CLOSE)


def test_the_ensemble_refuses_weights_with_an_aggregation(setup):
    _, rnet, _, _ = setup
    with pytest.raises(
        ValueError,
        match=r"^MahalanobisEnsemble: weights weigh the sum of distances, but "
        r"aggregation='fisher' combines p-values, unweighted; drop one of them\.$",
    ):
        MahalanobisEnsemble(rnet, [(1, 2)], weights=[2.0], aggregation="fisher")


def test_an_aggregated_ensemble_saves_its_reference(setup, tmp_path):
    _, rnet, train, x = setup
    ens = MahalanobisEnsemble(rnet, [(1, 2), (1, 4)], aggregation="geometric")
    path = ens.fit(train, target=1).save(tmp_path / "ens.safetensors")
    again = MahalanobisEnsemble(rnet, [(1, 2), (1, 4)], aggregation="geometric")
    assert torch.equal(again.load(path).score_classes(x), ens.score_classes(x))
    plain = MahalanobisEnsemble(rnet, [(1, 2), (1, 4)])
    with pytest.raises(ValueError, match=r"configured otherwise \(aggregation:"):
        plain.load(path)


def test_klmatching_scores_the_kl_to_each_typical_posterior(setup):
    net, rnet, train, x = setup
    klm = KLMatching(rnet).fit(train)
    with torch.no_grad():
        p_fit = net(train[0][0]).to(F64).softmax(1)
        p = net(x).to(F64).softmax(1)
    typical = torch.stack([p_fit[p_fit.argmax(1) == c].mean(0) for c in range(3)])
    want = torch.stack([(p * (p / d).log()).sum(1) for d in typical], dim=1)
    torch.testing.assert_close(klm.score_classes(x), want, **CLOSE)
    klm.at = "predicted"
    torch.testing.assert_close(klm(x), want.gather(1, p.argmax(1)[:, None])[:, 0])


def test_she_reads_the_predicted_class_by_default_or_the_closest(setup):
    net, rnet, train, x = setup
    (fit_x, y) = train[0]
    fit = features(net, fit_x, 4)
    right = predicted(net, fit_x) == y
    patterns = torch.stack([fit[right & (y == c)].mean(0) for c in range(3)])
    want = -features(net, x, 4) @ patterns.T
    she = SHE(rnet).fit(train, target=1)
    torch.testing.assert_close(she.score_classes(x), want, **CLOSE)
    torch.testing.assert_close(
        she(x), want.gather(1, predicted(net, x)[:, None])[:, 0], **CLOSE
    )
    she.at = "closest"
    torch.testing.assert_close(she(x), want.amin(dim=1), **CLOSE)


def mode_oracle(conformity, mode):
    """scio's modes, written out row by row."""
    out = conformity.clone()
    for i, row in enumerate(conformity.tolist()):
        best = max(range(len(row)), key=lambda c: (row[c], -c))
        second = max(row[c] for c in range(len(row)) if c != best)
        for c, value in enumerate(row):
            if mode == "diff":
                out[i, c] = row[best] - second if c == best else value - row[best]
            else:
                out[i, c] = row[best] / second if c == best else value / row[best]
    return out


@pytest.mark.parametrize("mode", ["diff", "ratio"])
def test_modes_are_the_preference_over_the_best_other_class(mode):
    conformity = torch.rand(20, 5, dtype=F64) + 0.1
    # scio's ratio at the best class is 1 / (c_2 / c_1): a rounding from c_1 / c_2.
    torch.testing.assert_close(
        class_mode(conformity, mode), mode_oracle(conformity, mode), rtol=4e-16, atol=0
    )


def test_score_classes_applies_a_mode_to_the_conformity(setup):
    _, rnet, train, x = setup
    maha = Mahalanobis(rnet).fit(train, target=1)
    raw = maha.score_classes(x)
    torch.testing.assert_close(
        maha.score_classes(x, mode="diff"), -mode_oracle(-raw, "diff"), **CLOSE
    )
    with pytest.raises(
        ValueError,
        match=r"^Mahalanobis\.score_classes: mode must be one of \['raw', 'diff', "
        r"'ratio'\], got 'rank'$",
    ):
        maha.score_classes(x, mode="rank")


def test_at_is_checked_at_construction(setup):
    _, rnet, _, _ = setup
    message = "RMDS: at must be one of ['closest', 'predicted'], got 'true'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        RMDS(rnet, at="true")


def test_p_values_count_the_reference_at_least_as_high():
    reference = torch.tensor([0.5, 1.0, 1.0, 2.0, 7.0], dtype=F64)
    scores = torch.tensor([[1.0, -3.0], [7.0, 8.0]], dtype=F64)
    want = [
        [sum(r >= s for r in reference.tolist()) / 5 for s in row]
        for row in scores.tolist()
    ]
    assert p_values(reference, scores).tolist() == want
    strict = [
        [sum(r > s for r in reference.tolist()) / 5 for s in row]
        for row in scores.tolist()
    ]
    assert p_values(reference, scores, ties=False).tolist() == strict


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("sum", sum),
        ("mean", lambda v: sum(v) / len(v)),
        ("min", min),
        ("max", max),
        ("fisher", lambda v: sum(math.log(u) for u in v)),
        ("harmonic", lambda v: len(v) / sum(1 / u for u in v)),
        ("geometric", lambda v: math.exp(sum(math.log(u) for u in v) / len(v))),
    ],
)
def test_combine_is_scios_rule(name, rule):
    p = torch.rand(6, 4, dtype=F64) + 0.01
    want = torch.tensor([rule(row) for row in p.tolist()], dtype=F64)
    torch.testing.assert_close(combine(p, name, dim=1), want, rtol=1e-14, atol=0)


def test_score_classes_follows_the_protocols_data_rules(setup):
    _, rnet, train, x = setup
    maha = Mahalanobis(rnet).fit(train, target=1)
    # An empty batch runs nothing and has no row.
    assert maha.score_classes(x[:0]).shape == (0, 3)
    # A non-finite row scores NaN in every class; the others as without it.
    bad = x.clone()
    bad[2, 1] = float("nan")
    scores = maha.score_classes(bad)
    assert bool(scores[2].isnan().all())
    keep = [0, 1, 3, 4, 5, 6]
    # Batches of 7 and 6 rows: the net's float32 GEMMs may round otherwise,
    # a few eps32 of the features, amplified by the covariance: rtol 1e-5.
    torch.testing.assert_close(
        scores[keep], maha.score_classes(x[keep]), rtol=1e-5, atol=0
    )


def test_a_neighbour_fit_refuses_non_finite_features(setup):
    _, rnet, train, _ = setup
    x, y = train[0]
    bad = x.clone()
    bad[4, 0] = float("nan")
    from scio_recorder.ood import DkNN  # noqa: PLC0415 (this test's own)

    with pytest.raises(
        ValueError, match=r"^DkNN: 1 of the 90 fit samples have non-finite"
    ):
        DkNN(rnet, [(1, 2)], k=3).fit([(bad, y)], target=1)
