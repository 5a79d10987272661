"""WeiPer, CORE and ORA against their authors' code (or, for CORE, the paper).

Oracles, each independent of the package:

* WeiPer: the reference's scoring, ported below from the authors' fork of
  OpenOOD, ``mgranz/weiper`` at commit
  ``1c27a4f7458570f60091d9c581e7fad6e5e369d1`` (MIT licence, OpenOOD's:
  ``Weiper/OpenOOD/LICENSE``), files
  ``openood/postprocessors/weiper_kldiv/utils.py``
  (``calculate_WeiPerKLDiv_score`` and what it calls) and
  ``weiper_kldiv_postprocessor.py`` (its ``setup``, the fit). Ported as
  written but for the progress bars (dropped), the device (the CPU) and
  the random draws: the reference draws new perturbations at every call
  (its postprocessor passes ``W_tilde=``, which
  ``calculate_WeiPerKLDiv_score`` takes into ``**params``, not as
  ``perturbed_fc``), so the oracle seeds torch's generator before each
  call: every draw is then the noise ours is given.
* ORA: OpenOOD pull request #311, ``ORAPostprocessor`` from
  ``berkerdemirel/OpenOOD`` at commit
  ``25c9df08817b18bce65a00e7624cfad819ce76bb`` (MIT licence, OpenOOD's),
  ported but for ``.cuda()`` and the progress bar.
* CORE: the code of OpenOOD pull request #312 could not be read (no copy
  of its branch was found); the oracle is the paper's formula (arXiv
  2603.18290) as ``CORE``'s docstring reads it, written out in float64 with
  a pseudo-inverse projection.

Tolerances: both sides compute the same float32 features and perturbed
logits with the same operations on the same shapes (so the same bins);
the rest differs in float32 (the references) against float64 (ours), a
few float32 ulps of magnitudes near one: rtol 1e-5 (~80 eps_32), atol
1e-5, the issue's bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the reference's alias)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import CORE, MSP, ORA, WeiPer, evaluate, fit_detectors
from scio_recorder.ood._weiper import (
    reference_weights,
    symmetric_kl,
    uniform_smoothing,
    weiper_densities,
    weiper_edges,
)

F64 = torch.float64
TOL = {"rtol": 1e-5, "atol": 1e-5}


class Net(nn.Module):
    """A small MLP with OpenOOD's interface (``fc``, ``return_feature``)."""

    def __init__(self, d_in: int = 5, width: int = 16, classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, width), nn.ReLU())
        self.fc = nn.Linear(width, classes)

    def forward(self, x, return_feature=False):
        feature = self.body(x)
        out = self.fc(feature)
        return (out, feature) if return_feature else out


def make(d_in=5, width=16, classes=3, seed=0):
    torch.manual_seed(seed)
    net = Net(d_in, width, classes).eval()
    return net, Recorder(net, input_size=(1, d_in))


# ------------------------------------------------------- the WeiPer reference
# Ported from mgranz/weiper @ 1c27a4f7458570f60091d9c581e7fad6e5e369d1 (MIT),
# Weiper/OpenOOD/openood/postprocessors/weiper_kldiv/utils.py.
def ref_linspace(start, stop, num: int):
    steps = torch.arange(num, dtype=torch.float32, device=start.device) / (num - 1)
    for _ in range(start.ndim):
        steps = steps.unsqueeze(-1)
    return start[None] + steps * (stop - start)[None]


def ref_batch_histogram(  # noqa: PLR0917 (the reference's signature)
    samples,
    n_bins=100,
    batch_size=1000,
    device="cpu",
    bins_min_max=None,
    probability=False,
):
    eps = 1e-8
    samples = samples.to(device)
    low, high = bins_min_max
    bins = ref_linspace(low, high + eps, num=n_bins + 1)[:, None].repeat(
        1, samples.shape[1]
    )
    bins = torch.cat([bins, torch.ones(1, bins.shape[-1]) * np.inf], dim=0)
    bins = torch.cat([-torch.ones(1, bins.shape[-1]) * np.inf, bins], dim=0)
    bin_length = bins[2:3] - bins[1:2] + 1e-12
    if samples.shape[0] > batch_size:
        samples = samples.split(batch_size)
        densities = torch.zeros(n_bins + 2, samples[0].shape[1])
        for samples in samples:  # noqa: B020 (the reference's loop, kept)
            density = torch.logical_and(
                (samples[None] < bins[1:, None]), (samples[None] >= bins[:-1, None])
            )
            density = density.to(torch.float32).mean(dim=1)
            densities += density.cpu()
        densities /= len(samples)
        density = densities
    else:
        density = torch.logical_and(
            (samples[None] < bins[1:, None]), (samples[None] >= bins[:-1, None])
        )
        density = density.to(torch.float32).mean(dim=1)
    if not probability:
        density /= bin_length
    else:
        density = density[1:-1] / density.sum(dim=0)[None]
    return density, bins


class RefUniformKernel(nn.Module):
    def __init__(self, dim, kernel_size=10):
        super().__init__()
        self.kernel = nn.Conv1d(
            dim, dim, kernel_size, padding="same", padding_mode="replicate"
        )
        self.kernel.weight.data = torch.zeros_like(self.kernel.weight.data)
        self.kernel.weight.data[range(dim), range(dim)] = (
            torch.ones(1, dim, kernel_size) / kernel_size
        )
        self.kernel.bias.data = torch.zeros_like(self.kernel.bias)

    @torch.no_grad()
    def forward(self, densities):
        return self.kernel(densities.T).T


def ref_weiper_space(model, latents, perturbed_fc, perturbation_distance, n_repeats):
    random_perturbs = [
        perturbation_distance
        * F.normalize(torch.randn_like(model.fc.weight.data), dim=1)
        for _ in range(n_repeats)
    ]
    random_perturbs = [
        pert * model.fc.weight.norm(dim=1)[:, None] for pert in random_perturbs
    ]

    def build_lin():
        weight = model.fc.weight.data
        bias = model.fc.bias.data
        weight_ = torch.cat([weight + pert for pert in random_perturbs], dim=0)
        bias_ = torch.cat([bias for _ in range(n_repeats)], dim=0)
        fc = nn.Linear(latents[0].shape[-1], n_repeats * weight.shape[0])
        fc.weight.data = weight_
        fc.bias.data = bias_
        return fc

    if perturbed_fc is None:
        perturbed_fc = build_lin()
    with torch.no_grad():
        logits = torch.cat([perturbed_fc(x) for x in latents.split(200)], dim=0)
    return logits, perturbed_fc


def ref_density(latents, min_train, max_train, n_bins=100):
    density = [
        ref_batch_histogram(
            chunk.T, n_bins, bins_min_max=(min_train, max_train), probability=True
        )[0]
        for chunk in latents.split(100, dim=0)
    ]
    return torch.cat(density, dim=-1)


def ref_kldiv(p, q, eps, kernel):
    q_ = kernel(q)
    q_ += eps
    p_ = (p + eps).clone()
    p_ /= p_.sum(dim=0)
    q_ /= q_.sum(dim=0)
    q_p = q_.log()[:, None] - p_.log()[..., None]
    return -(p_[..., None] * q_p).sum(dim=0) - (q_[:, None] * (-q_p)).sum(dim=0)


def ref_uncertainty(density, density_train_mean, kernel, eps):
    uncertainty = []
    for dens_t in density.split(100, dim=-1):
        s = 100
        if dens_t.shape[-1] < 100:
            s = dens_t.shape[-1]
            dens_t = torch.cat(  # noqa: PLW2901 (the reference's padding)
                [dens_t, torch.ones(dens_t.shape[0], 100 - s)], dim=-1
            ).clone()
        uncertainty.append(ref_kldiv(density_train_mean, dens_t, eps, kernel)[:, :s])
    return torch.cat(uncertainty, dim=-1)[0]


def ref_weiper_kldiv_score(
    model,
    latents,
    *,
    n_bins,
    perturbation_distance,
    n_repeats,
    smoothing,
    smoothing_perturbed,
    lambda_1,
    lambda_2,
    train_min_max,
    train_densities=None,
    epsilon=0.01,
    epsilon_noise=0.025,
):
    latents_weiper, _ = ref_weiper_space(
        model, latents, None, perturbation_distance, n_repeats
    )
    (min_train, max_train), (min_weiper_train, max_weiper_train) = train_min_max
    densities = ref_density(latents, min_train, max_train, n_bins)
    densities_weiper = ref_density(
        latents_weiper, min_weiper_train, max_weiper_train, n_bins
    )
    if train_densities is None:
        return densities.mean(dim=-1)[:, None], densities_weiper.mean(dim=-1)[:, None]
    densities_train_mean, densities_weiper_train_mean = train_densities
    n_classes = int(latents_weiper.shape[-1] / n_repeats)
    msp_weiper = torch.cat(
        [
            latents_weiper[:, i * n_classes : (i + 1) * n_classes]
            .softmax(dim=-1)
            .max(dim=-1)[0][:, None]
            for i in range(n_repeats)
        ],
        dim=-1,
    ).mean(dim=-1)
    kernel = RefUniformKernel(100, smoothing)
    kernel_noise = RefUniformKernel(100, smoothing_perturbed)
    uncertainties = ref_uncertainty(
        densities, densities_train_mean, kernel, eps=epsilon
    )
    uncertainties_weiper = ref_uncertainty(
        densities_weiper, densities_weiper_train_mean, kernel_noise, eps=epsilon_noise
    )
    return -(uncertainties + lambda_1 * uncertainties_weiper - lambda_2 * msp_weiper)


class RefWeiPer:
    """The postprocessor's ``setup`` and ``postprocess`` (exact_minmax=True).

    ``seed`` is set before each of the reference's draws (see the module).
    """

    def __init__(self, seed, **args):
        self.seed, self.args = seed, args

    def kwargs(self):
        a = self.args
        return {
            "n_bins": a["n_bins"],
            "perturbation_distance": a["perturbation_distance"],
            "n_repeats": a["n_repeats"],
            "smoothing": a["smoothing"],
            "smoothing_perturbed": a["smoothing_perturbed"],
            "lambda_1": a["lambda_1"],
            "lambda_2": a["lambda_2"],
        }

    @torch.no_grad()
    def setup(self, net, latents_loader):
        w_tilde = None
        latents_min, latents_max = np.inf, -np.inf
        weiper_min, weiper_max = np.inf, -np.inf
        for latents in latents_loader:
            torch.manual_seed(self.seed)
            weiper_latents, w_tilde = ref_weiper_space(
                net,
                latents,
                w_tilde,
                self.args["perturbation_distance"],
                self.args["n_repeats"],
            )
            latents_min = min(latents_min, latents.min())
            latents_max = max(latents_max, latents.max())
            weiper_min = min(weiper_min, weiper_latents.min())
            weiper_max = max(weiper_max, weiper_latents.max())
        self.train_min_max = (latents_min, latents_max), (weiper_min, weiper_max)
        n_bins = self.args["n_bins"]
        dens = torch.zeros(n_bins, latents_loader[0].shape[0])
        dens_weiper = torch.zeros(n_bins, latents_loader[0].shape[0])
        for latents in latents_loader:
            torch.manual_seed(self.seed)
            d, dw = ref_weiper_kldiv_score(
                net, latents, train_min_max=self.train_min_max, **self.kwargs()
            )
            dens += d
            dens_weiper += dw
        dens /= len(latents_loader)
        dens_weiper /= len(latents_loader)
        self.train_densities = (
            dens.mean(dim=-1)[:, None],
            dens_weiper.mean(-1)[:, None],
        )

    @torch.no_grad()
    def postprocess(self, net, feature):
        torch.manual_seed(self.seed)
        return ref_weiper_kldiv_score(
            net,
            feature,
            train_min_max=self.train_min_max,
            train_densities=self.train_densities,
            **self.kwargs(),
        )


def reference_noise(net, seed, r):
    """The noise the reference draws after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return torch.stack([torch.randn_like(net.fc.weight.data) for _ in range(r)])


def weiper_case(
    *,
    width=16,
    classes=3,
    r=100,
    bins=100,
    lambda1=2.5,
    lambda2=0.1,
    sizes=(64, 64, 64, 40),
    queries=130,
    seed=3,
):
    """Fit ours and the reference on the same batches; score ``queries`` samples."""
    net, rnet = make(width=width, classes=classes)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(n, 5, generator=gen) for n in sizes]
    x = 1.5 * torch.randn(queries, 5, generator=gen)
    args = {
        "n_bins": bins,
        "perturbation_distance": 1.8,
        "n_repeats": r,
        "smoothing": 4,
        "smoothing_perturbed": 15,
        "lambda_1": lambda1,
        "lambda_2": lambda2,
    }
    ref = RefWeiPer(seed, **args)
    with torch.no_grad():
        ref.setup(net, [net(b, return_feature=True)[1] for b in batches])
        expected = -ref.postprocess(net, net(x, return_feature=True)[1])
    noise = reference_noise(net, seed, r)
    return net, rnet, batches, x, expected, noise


# ------------------------------------------------------------------ WeiPer
@pytest.mark.slow  # the reference's histograms: about a second
def test_weiper_reference_mode_equals_the_authors_code():
    """Defaults, a short last fit batch, 130 queries: chunks of 100 and 30."""
    _, rnet, batches, x, expected, noise = weiper_case()
    ours = WeiPer(rnet, reference=True, perturbations=noise).fit(batches, input=None)
    torch.testing.assert_close(ours(x).to(expected.dtype), expected, **TOL)


@pytest.mark.slow  # the reference's histograms: about a second
def test_weiper_chunked_histograms_over_1000_values_equal_the_reference():
    """F = 1,100 features and r C = 1,100 perturbed logits: chunks 1,000 + 100."""
    _, rnet, batches, x, expected, noise = weiper_case(
        width=1100, classes=11, sizes=(50, 30), queries=40
    )
    ours = WeiPer(rnet, reference=True, perturbations=noise).fit(batches, input=None)
    torch.testing.assert_close(ours(x).to(expected.dtype), expected, **TOL)
    default = WeiPer(rnet, perturbations=noise).fit(batches, input=None)
    assert not torch.allclose(default(x).to(expected.dtype), expected, **TOL)


@pytest.mark.slow  # the reference's histograms: about a second
def test_weiper_default_differs_only_by_the_fit_mean():
    """Equal batches: the mean of batch means is the mean; ours equals the reference."""
    _, rnet, batches, x, expected, noise = weiper_case(sizes=(50, 50, 50))
    ours = WeiPer(rnet, perturbations=noise).fit(batches, input=None)
    torch.testing.assert_close(ours(x).to(expected.dtype), expected, **TOL)
    # With a short last batch the two fit means differ, and so do the scores.
    _, rnet, batches, x, expected, noise = weiper_case(sizes=(60, 60, 10))
    ours = WeiPer(rnet, perturbations=noise).fit(batches, input=None)
    assert not torch.allclose(ours(x).to(expected.dtype), expected, **TOL)


@pytest.mark.slow  # the reference's histograms: about a second
def test_weiper_lambdas_zero_is_the_latent_divergence_alone():
    _, rnet, batches, x, expected, noise = weiper_case(lambda1=0.0, lambda2=0.0)
    ours = WeiPer(rnet, lambda1=0, lambda2=0, reference=True, perturbations=noise).fit(
        batches, input=None
    )
    torch.testing.assert_close(ours(x).to(expected.dtype), expected, **TOL)
    # ... which is the symmetric KL written out in float64 from the densities.
    f = torch.cat([rnet.net.body(b) for b in batches]).detach().double()
    low, high = f.min().float(), f.max().float()
    edges = weiper_edges(low, high, 100).double()
    fx = rnet.net.body(x).detach().double()

    def hist(rows):
        out = torch.zeros(rows.shape[0], 100, dtype=F64)
        for i, row in enumerate(rows):
            for v in row:
                k = int((edges <= v).sum()) - 1
                if 0 <= k < 100:
                    out[i, k] += 1 / rows.shape[1]
        return out

    fit_mean = torch.stack(
        [hist(rnet.net.body(b).detach().double()).mean(0) for b in batches]
    )
    p = fit_mean.mean(0) + 0.01
    p = p / p.sum()
    q = hist(fx)
    padded = torch.cat([q[:, :1], q, q[:, -1:], q[:, -1:]], dim=1)  # size 4: 1 + 2
    q = torch.stack([padded[:, i : i + 4].mean(1) for i in range(100)], dim=1) + 0.01
    q = q / q.sum(1, keepdim=True)
    by_hand = (p * (p / q).log()).sum(1) + (q * (q / p).log()).sum(1)
    torch.testing.assert_close(ours(x).double(), by_hand, **TOL)


def test_weiper_msp_score_is_the_mean_msp_of_the_copies():
    net, rnet = make()
    w = WeiPer(rnet, r=7, score="msp", generator=5).fit(
        [torch.randn(40, 5)], input=None
    )
    x = torch.randn(9, 5)
    f = net.body(x).detach().double()
    b = net.fc.bias.detach().double()
    msp = torch.stack(
        [(f @ wt.double().T + b).softmax(1).amax(1) for wt in w.perturbed]
    ).mean(0)
    torch.testing.assert_close(w(x).double(), -msp, rtol=1e-6, atol=1e-6)


def test_weiper_perturbations_are_proportional_and_seeded():
    net, rnet = make()
    a = WeiPer(rnet, r=5, generator=11)
    b = WeiPer(rnet, r=5, generator=torch.Generator().manual_seed(11))
    assert torch.equal(a.perturbed, b.perturbed)
    assert not torch.equal(a.perturbed, WeiPer(rnet, r=5, generator=12).perturbed)
    w = net.fc.weight.detach()
    shift = (a.perturbed - w).norm(dim=2)  # delta ||w_c|| for every copy and class
    torch.testing.assert_close(shift, 1.8 * w.norm(dim=1).expand(5, -1))
    with pytest.raises(ValueError, match=r"perturbations must be \[r, C, F\]"):
        WeiPer(rnet, r=5, perturbations=torch.randn(4, 3, 16))
    with pytest.raises(ValueError, match="score must be 'kld' or 'msp'"):
        WeiPer(rnet, score="energy")
    with pytest.raises(ValueError, match="delta must be a positive number"):
        WeiPer(rnet, delta=0)


def test_weiper_helpers_against_their_definitions():
    edges = torch.tensor([0.0, 1.0, 2.0, 3.0])
    v = torch.tensor([[-1.0, 0.0, 0.999, 2.5, 3.0, 7.0]])
    torch.testing.assert_close(
        weiper_densities(v, edges, torch.ones(6)),
        torch.tensor([[2 / 6, 0.0, 1 / 6]], dtype=F64),
    )
    d = torch.rand(3, 12, dtype=F64)
    conv = RefUniformKernel(3, 4).double()
    torch.testing.assert_close(uniform_smoothing(d, 4), conv(d.T).T.detach())
    torch.testing.assert_close(
        reference_weights(2500).sum(), torch.tensor(1.0, dtype=F64)
    )
    assert reference_weights(2500)[-1] == 1 / (3 * 500)
    p = torch.rand(10, dtype=F64)
    q = torch.rand(4, 10, dtype=F64)
    kl = symmetric_kl(p, q, 0.0)
    p, q = p / p.sum(), q / q.sum(1, keepdim=True)
    torch.testing.assert_close(kl, (p * (p / q).log() + q * (q / p).log()).sum(1))


@pytest.mark.slow  # 40 examples: about a second
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 5),
    values=st.integers(1, 40),
    bins=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
def test_weiper_histograms_equal_the_references_comparisons(rows, values, bins, seed):
    """Any values, any bins: the same bin as the reference's ``>=`` and ``<``."""
    gen = torch.Generator().manual_seed(seed)
    # rounded values: many fall exactly on an edge or on the fit's extremes
    v = (torch.randn(rows, values, generator=gen) * 4).round() / 4
    low, high = v.min() + 0.25, v.max() - 0.25
    expected = ref_batch_histogram(
        v.T, bins, bins_min_max=(low, high), probability=True
    )[0]
    edges = weiper_edges(low, high, bins)
    got = weiper_densities(v, edges, torch.full((values,), 1 / values, dtype=F64))
    torch.testing.assert_close(got.float(), expected.T)


@pytest.mark.slow  # 40 examples: about a second
@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 30), size=st.integers(1, 30), seed=st.integers(0, 99))
def test_uniform_smoothing_is_the_references_conv1d(length, size, seed):
    """Any width, odd or even, against the 'same'-padded, replicate Conv1d."""
    size = min(size, length)
    d = torch.rand(2, length, dtype=F64, generator=torch.Generator().manual_seed(seed))
    conv = RefUniformKernel(2, size).double()
    torch.testing.assert_close(uniform_smoothing(d, size), conv(d.T).T.detach())


# ------------------------------------------------------------- the ORA reference
# Ported from berkerdemirel/OpenOOD @ 25c9df08817b18bce65a00e7624cfad819ce76bb
# (OpenOOD PR #311, MIT), openood/postprocessors/ora_postprocessor.py.
class RefORA:
    def __init__(self, aggregation="mean"):
        self.aggregation = aggregation

    @torch.no_grad()
    def setup(self, net, loader):
        num_classes = net.fc.weight.shape[0]
        class_sum = torch.zeros(num_classes, net.fc.weight.shape[1])
        class_count = torch.zeros(num_classes)
        for data, labels in loader:
            _, feature = net(data, return_feature=True)
            class_sum.index_add_(0, labels, feature)
            class_count.index_add_(
                0, labels, torch.ones_like(labels, dtype=torch.float)
            )
        class_means = class_sum / class_count.clamp(min=1).unsqueeze(1)
        self.mean_of_class_means = class_means.mean(dim=0)
        self.num_classes = num_classes

    @torch.no_grad()
    def postprocess(self, net, data):
        output, feature = net(data, return_feature=True)
        preds = output.argmax(dim=1)
        max_logits = output.max(dim=1).values
        w = net.fc.weight
        centered_feats = feature - self.mean_of_class_means
        norm_centered_feats = F.normalize(centered_feats, p=2, dim=1)
        trajectory = torch.zeros(feature.size(0), self.num_classes)
        for c in range(self.num_classes):
            logit_diff = max_logits - output[:, c]
            weight_diff = w[preds] - w[c]
            weight_diff_norm_sq = (weight_diff * weight_diff).sum(dim=1)
            scale = (logit_diff / weight_diff_norm_sq).unsqueeze(1)
            feats_db = feature - scale * weight_diff
            centered_db = feats_db - self.mean_of_class_means
            norm_centered_db = F.normalize(centered_db, p=2, dim=1)
            cos_sim = (norm_centered_feats * norm_centered_db).sum(dim=1)
            trajectory[:, c] = torch.arccos(cos_sim.clamp(-1.0, 1.0)) / torch.pi
        if self.aggregation == "min":
            trajectory = torch.where(
                torch.isnan(trajectory),
                torch.full_like(trajectory, float("inf")),
                trajectory,
            )
            score = trajectory.min(dim=1).values
        else:
            trajectory = torch.nan_to_num(trajectory, nan=0.0)
            if self.aggregation == "max":
                score = trajectory.max(dim=1).values
            else:
                score = trajectory.mean(dim=1)
        return preds, score


def labelled(n_batches=3, n=40, classes=4, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(n, 5, generator=gen),
            torch.randint(0, classes, (n,), generator=gen),
        )
        for _ in range(n_batches)
    ]


@pytest.mark.parametrize("aggregation", ["mean", "max", "min"])
def test_ora_equals_the_pull_request(aggregation):
    net, rnet = make(classes=4)
    train = labelled()
    ours = ORA(rnet, aggregation=aggregation).fit(train, target=1)
    ref = RefORA(aggregation)
    ref.setup(net, train)
    x = 2 * torch.randn(50, 5, generator=torch.Generator().manual_seed(9))
    _, expected = ref.postprocess(net, x)
    torch.testing.assert_close(ours(x).float(), -expected, **TOL)


def test_ora_class_without_samples_counts_as_zero_mean():
    net, rnet = make(classes=4)
    train = [(x, y.clamp(max=2)) for x, y in labelled()]  # class 3 never seen
    ours = ORA(rnet).fit(train, target=1)
    ref = RefORA()
    ref.setup(net, train)
    torch.testing.assert_close(ours.centre.float(), ref.mean_of_class_means)


# ------------------------------------------------------------- CORE, by formula
def core_by_hand(net, train, x):
    """The paper's score written out in float64 (pseudo-inverse projection)."""
    w = net.fc.weight.detach().double()
    b = net.fc.bias.detach().double()
    project = torch.linalg.pinv(w) @ w  # onto the span of W's rows

    def parts(f):
        energy = torch.logsumexp(f @ w.T + b, dim=1)
        res = f - f @ project.T
        m = means - means @ project.T
        cos = (res @ m.T) / (res.norm(dim=1)[:, None] * m.norm(dim=1)[None, :])
        return energy, cos.amax(dim=1)

    feats = torch.cat([net.body(xb) for xb, _ in train]).detach().double()
    labels = torch.cat([yb for _, yb in train])
    means = torch.stack([feats[labels == c].mean(0) for c in range(w.shape[0])])
    e_fit, m_fit = parts(feats)
    e, m = parts(net.body(x).detach().double())
    return -(
        (e - e_fit.mean()) / e_fit.std(unbiased=False)
        + (m - m_fit.mean()) / m_fit.std(unbiased=False)
    )


def test_core_equals_the_papers_formula():
    net, rnet = make(classes=4)
    train = labelled()
    ours = CORE(rnet).fit(train, target=1)
    x = 2 * torch.randn(30, 5, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(
        ours(x), core_by_hand(net, train, x), rtol=1e-9, atol=1e-9
    )


def test_core_refuses_a_class_without_samples_and_needs_labels():
    _, rnet = make(classes=4)
    train = [(x, y.clamp(max=2)) for x, y in labelled()]
    with pytest.raises(ValueError, match="no fit sample of class 3"):
        CORE(rnet).fit(train, target=1)
    with pytest.raises(ValueError, match="needs class labels"):
        CORE(rnet).fit(train)


# ------------------------------------------------------------------ the protocol
def trio(rnet):
    return {
        "WeiPer": WeiPer(rnet, r=10, bins=20, generator=0),
        "CORE": CORE(rnet),
        "ORA": ORA(rnet),
        "MSP": MSP(rnet),
    }


def test_fit_detectors_and_evaluate_count_their_passes():
    """Fit: ORA in the shared pass, WeiPer's and CORE's two each; score: one pass."""
    net, rnet = make(classes=4)
    train = labelled()
    apart = trio(rnet)
    for detector in apart.values():
        detector.fit(train, target=1)
    together = trio(rnet)
    calls = []
    handle = net.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        fit_detectors(together, train, target=1)
        assert len(calls) == len(train) * (1 + 2 + 2)
        calls.clear()
        x = torch.randn(20, 5)
        result = evaluate(together, [x[:8], x[8:]], [3 * torch.randn(6, 5)], input=None)
        assert len(calls) == 3  # 3 batches, one shared pass each
    finally:
        handle.remove()
    for name, one in apart.items():
        for key, value in one.state().items():
            torch.testing.assert_close(together[name].state()[key], value)
        scores = torch.cat([one(x[:8]), one(x[8:])])
        torch.testing.assert_close(result.id_scores[name], scores)


def test_states_save_and_load(tmp_path):
    _, rnet = make(classes=4)
    train = labelled()
    x = torch.randn(7, 5)
    fresh = {
        "WeiPer": WeiPer(rnet, r=10, bins=20, generator=99),
        "CORE": CORE(rnet),
        "ORA": ORA(rnet),
    }
    for name, detector in trio(rnet).items():
        if name == "MSP":
            continue
        detector.fit(train, target=1)
        path = detector.save(tmp_path / f"{name}.safetensors")
        again = fresh[name].load(path)
        assert torch.equal(again(x), detector(x)), name
    with pytest.raises(ValueError, match="configured otherwise"):
        WeiPer(rnet, r=10, bins=30).load(tmp_path / "WeiPer.safetensors")


def test_non_finite_rows_score_nan_and_the_others_as_without_them():
    _, rnet = make(classes=4)
    train = labelled()
    x = torch.randn(6, 5)
    bad = x.clone()
    bad[2] = math.nan
    for name, detector in trio(rnet).items():
        detector.fit(train, target=1)
        scores = detector(bad)
        assert scores[2].isnan(), name
        keep = torch.tensor([0, 1, 3, 4, 5])
        torch.testing.assert_close(scores[keep], detector(x[keep]))
