"""IsoMax (post hoc) against its formula and Adam written out.

The oracle optimises the prototypes as scio 1.1 does (``[N, C, C]``
differences, ``vector_norm``, ``torch.optim.Adam`` from zeros), in float64
so that the two distance computations (``torch.cdist`` in ours) agree to
``1e-12``-ish per step; the probabilities are ``softmax(-E_s ||z - p||)``
written out.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import IsoMax
from scio_recorder.ood._isomax import fit_prototypes

F64 = torch.float64
EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture
def setup():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).eval()
    x = torch.randn(60, 4)
    return net, Recorder(net, input_size=(1, 4)), [(x, torch.arange(60) % 3)]


def scios_prototypes(logits, labels, *, scale, steps, lr):
    """scio 1.1's ``IsoMax.calibrate``, written out."""
    prototypes = torch.zeros(3, logits.shape[1], dtype=logits.dtype, requires_grad=True)
    optimizer = torch.optim.Adam([prototypes], lr=lr, eps=1e-8)
    for _ in range(steps):
        optimizer.zero_grad()
        d = torch.linalg.vector_norm(logits[:, None] - prototypes, dim=2)
        torch.nn.functional.cross_entropy(-scale * d, labels).backward()
        optimizer.step()
    return prototypes.detach()


def test_prototypes_are_scios_adam_steps():
    torch.manual_seed(1)
    logits = 3 * torch.randn(50, 3, dtype=F64)
    labels = torch.arange(50) % 3
    want = scios_prototypes(logits, labels, scale=10.0, steps=100, lr=0.1)
    got = fit_prototypes(logits, labels, 3, entropic_scale=10.0, steps=100, lr=0.1)
    # float64 distances by two routes (mm expansion vs differences), 1e-14
    # relative per step, carried by Adam's normalised steps over 100 steps.
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_isomax_scores_minus_the_probability_of_the_scaled_distances(setup):
    net, rnet, train = setup
    isomax = IsoMax(rnet, steps=200).fit(train, target=1)
    x = torch.randn(7, 4)
    with torch.no_grad():
        z = net(x).double()
    d = torch.linalg.vector_norm(z[:, None] - isomax.prototypes.double(), dim=2)
    want = -torch.softmax(-10.0 * d, dim=1)
    # float32 logits and cdist (d^2 = |z|^2 + |p|^2 - 2 z.p): d off by a few
    # eps32 (|z|^2 + |p|^2) / (2 d); a probability moves by 2 E_s p times
    # the largest change of the row's distances.
    sizes = z.square().sum(1)[:, None] + isomax.prototypes.double().square().sum(1)
    delta = (8 * EPS32 * sizes / (2 * d)).amax(dim=1, keepdim=True)
    tol = 2 * 10.0 * want.abs() * delta + 4 * EPS32
    assert bool(((isomax.score_classes(x).double() - want).abs() <= tol).all())
    closest = want.argmin(dim=1)[:, None]
    gap = (isomax(x).double() - want.amin(dim=1)).abs()
    assert bool((gap <= tol.gather(1, closest)[:, 0]).all())
    isomax.at = "predicted"
    predicted = z.argmax(dim=1)[:, None]
    gap = (isomax(x).double() - want.gather(1, predicted)[:, 0]).abs()
    assert bool((gap <= tol.gather(1, predicted)[:, 0]).all())


def test_isomax_scores_finite_logits_of_any_size(setup):
    # x * 1e30: the logits (~1e29) are finite, cdist squared them to inf in
    # float32, and the softmax of -inf everywhere was NaN.
    _, _, train = setup
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    rnet = Recorder(net, input_size=(1, 4))
    isomax = IsoMax(rnet, steps=50).fit(train, target=1)
    x = torch.randn(3, 4)
    x[1] *= 1e30
    with torch.no_grad():
        z = net(x).double()
    assert bool(torch.isfinite(z).all())
    assert z[1].abs().max() > 1e28
    d = torch.linalg.vector_norm(z[:, None] - isomax.prototypes.double(), dim=2)
    want = -torch.softmax(-10.0 * d, dim=1)  # float64: 1e58 does not overflow
    got = isomax.score_classes(x).double()
    assert bool(torch.isfinite(got).all())
    # Row 1: the distances, ~1e29, differ by |p| ~ 1 (1e-29 relatively):
    # equal in float32 and float64 alike, each class 1/3.
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=4 * EPS32)
    assert torch.equal(got[[0, 2]], isomax.score_classes(x[[0, 2]]).double())


def test_isomax_minibatches_follow_the_seed(setup):
    _, rnet, train = setup
    a = IsoMax(rnet, steps=30, batch_size=16, seed=0).fit(train, target=1)
    b = IsoMax(rnet, steps=30, batch_size=16, seed=0).fit(train, target=1)
    c = IsoMax(rnet, steps=30, batch_size=16, seed=1).fit(train, target=1)
    assert torch.equal(a.prototypes, b.prototypes)
    assert not torch.equal(a.prototypes, c.prototypes)
    full = IsoMax(rnet, steps=30).fit(train, target=1)
    assert not torch.equal(a.prototypes, full.prototypes)


def test_isomax_saves_and_loads(setup, tmp_path):
    _, rnet, train = setup
    isomax = IsoMax(rnet, steps=20).fit(train, target=1)
    path = isomax.save(tmp_path / "isomax.safetensors")
    again = IsoMax(rnet, steps=20, at="predicted").load(path)
    x = torch.randn(5, 4)
    assert torch.equal(again.score_classes(x), isomax.score_classes(x))
    with pytest.raises(ValueError, match=r"configured otherwise \(steps: saved \[20\]"):
        IsoMax(rnet, steps=21).load(path)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"entropic_scale": 0},
            "IsoMax: entropic_scale must be a finite number > 0, got 0",
        ),
        ({"steps": -1}, "IsoMax: steps must be an int >= 0, got -1"),
        ({"lr": float("nan")}, "IsoMax: lr must be a finite number > 0, got nan"),
        ({"batch_size": 0}, "IsoMax: batch_size must be an int >= 1, got 0"),
        (
            {"at": "best"},
            "IsoMax: at must be one of ['closest', 'predicted'], got 'best'",
        ),
    ],
)
def test_isomax_refuses_bad_hyperparameters(setup, options, message):
    _, rnet, _ = setup
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        IsoMax(rnet, **options)


def test_isomax_needs_labels(setup):
    _, rnet, train = setup
    with pytest.raises(ValueError, match=r"^IsoMax\.fit needs class labels"):
        IsoMax(rnet).fit([train[0][0]], input=None)
