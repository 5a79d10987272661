"""Integrated gradients, saliency, input x gradient, SmoothGrad: against captum.

The oracle is captum 0.9 (in the dev extra; these tests skip without it), on
a small CNN and on the tiny GPT-2 of :mod:`tests.lms` (layer integrated
gradients at the token embedding, as captum's tutorials do). The formulas
are also checked without captum: completeness on a net whose integral is
known, and each rule's points and weights against their definitions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.explain import (
    input_x_gradient,
    integrated_gradients,
    saliency,
    smoothgrad,
)
from scio_recorder.explain._gradients import METHODS, rule
from tests import lms

EPS = torch.finfo(torch.float32).eps


def close(
    got: torch.Tensor, want: torch.Tensor, ulps: float = 256, scale: float = 0.0
) -> None:
    """Assert equality to float32 rounding.

    The two sides sum the same float32 terms in other orders (and through
    other kernels for other batch shapes), so they differ by a few units in
    the last place of the largest term: ``ulps`` float32 eps of the largest
    magnitude (or of ``scale``, the terms' magnitude where they cancel).
    """
    assert not got.requires_grad  # ours are detached
    got, want = got.detach(), want.detach()
    scale = max(float(want.abs().max()), float(got.abs().max()), scale, 1e-6)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=ulps * EPS * scale)


def cnn() -> tuple[nn.Module, Recorder]:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=1),
        nn.Tanh(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 3),
    ).eval()
    return net, Recorder(net, input_size=(1, 3, 6, 6))


def images() -> torch.Tensor:
    return torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))


# -- the rules, without captum -------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@given(steps=st.integers(2, 40))
@settings(max_examples=10, deadline=None)
def test_rules_integrate_polynomials(method: str, steps: int) -> None:
    """Every rule integrates x on [0, 1]: the middle and Gauss-Legendre exactly.

    Captum's left, right and "trapezoid" rules are off by half a step (its
    trapezoid halves the end steps of 1/n at n points, weights summing to
    1 - 1/n).
    """
    sizes, alphas = rule(method, steps, "t")
    assert len(sizes) == len(alphas) == steps
    assert all(0 <= a <= 1 for a in alphas)
    integral = sum(w * a for w, a in zip(sizes, alphas, strict=True))
    if method in {"riemann_left", "riemann_right", "riemann_trapezoid"}:
        assert abs(integral - 0.5) == pytest.approx(0.5 / steps, abs=1e-6)
    else:
        assert integral == pytest.approx(0.5, abs=1e-6)
    if method == "gausslegendre":  # exact up to degree 2 * steps - 1
        cubic = sum(w * a**3 for w, a in zip(sizes, alphas, strict=True))
        assert cubic == pytest.approx(0.25, abs=1e-9)


def test_rules_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="not an integration rule"):
        rule("simpson", 10, "t")
    with pytest.raises(ValueError, match="at least 2"):
        rule("riemann_left", 1, "t")
    assert rule("gausslegendre", 1, "t") == ([1.0], [0.5])


def test_completeness_on_a_quadratic() -> None:
    """F(x) = sum(x^2): IG is x^2 - x'^2 (the midpoint rule is exact on a line)."""

    class Square(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.double() ** 2).sum(1, keepdim=True)

    rnet = Recorder(Square(), input_size=(1, 4), dtypes=[torch.float32])
    x = torch.randn(3, 4)
    base = torch.randn(3, 4)
    attr, delta = integrated_gradients(
        rnet, x, target=0, baselines=base, steps=7, method="riemann_middle",
        return_delta=True,
    )  # fmt: skip
    want = x.double() ** 2 - base.double() ** 2
    close(attr.double(), want, ulps=64)
    assert delta.abs().max() < 64 * EPS * float(want.abs().sum(1).max())


def test_internal_batches_change_nothing_but_rounding() -> None:
    _, rnet = cnn()
    x = images()
    whole = integrated_gradients(rnet, x, target=[0, 2], steps=9)
    parts = integrated_gradients(rnet, x, target=[0, 2], steps=9, internal_batch_size=5)
    close(parts, whole)
    noise = torch.Generator().manual_seed(3)
    one = smoothgrad(rnet, x, 1, samples=6, generator=noise.manual_seed(3))
    split = smoothgrad(
        rnet, x, 1, samples=6, internal_batch_size=5, generator=noise.manual_seed(3)
    )
    close(split, one)


def test_errors_say_what_to_do() -> None:
    _, rnet = cnn()
    x = images()
    with pytest.raises(ValueError, match="internal_batch_size"):
        integrated_gradients(rnet, x, target=0, internal_batch_size=1)
    with pytest.raises(ValueError, match="out of range"):
        integrated_gradients(rnet, x, target=7)
    with pytest.raises(TypeError, match="class indices are integers"):
        saliency(rnet, x, target=torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="one class per sample"):
        saliency(rnet, x, target=[0, 1, 2])
    with pytest.raises(ValueError, match="does not fit"):
        integrated_gradients(rnet, x, target=0, baselines=torch.zeros(3, 3, 6, 6))
    with pytest.raises(ValueError, match="one number per row"):
        saliency(rnet, x, target=lambda out: out.sum())
    with pytest.raises(TypeError, match="return_delta"):
        integrated_gradients(rnet, x, 0, None, 50, "gausslegendre", None, None, 1)  # type: ignore[arg-type]


def test_parameters_grads_untouched() -> None:
    net, rnet = cnn()
    integrated_gradients(rnet, images(), target=0, steps=4, layer="2")
    assert all(p.grad is None for p in net.parameters())


# -- captum ---------------------------------------------------------------------


@pytest.fixture
def captum() -> object:
    return pytest.importorskip("captum.attr")


@pytest.mark.parametrize("method", METHODS)
def test_ig_equals_captum_on_a_cnn(captum: object, method: str) -> None:
    net, rnet = cnn()
    x = images()
    base = torch.full_like(x, 0.1)
    ours, delta = integrated_gradients(
        rnet,
        x,
        target=[2, 0],
        baselines=base,
        steps=8,
        method=method,
        return_delta=True,
    )
    theirs, their_delta = captum.IntegratedGradients(net).attribute(  # type: ignore[attr-defined]
        x, baselines=base, target=[2, 0], n_steps=8, method=method,
        return_convergence_delta=True,
    )  # fmt: skip
    close(ours, theirs)
    # a difference of sums: ulps of the summed terms
    close(delta, their_delta, scale=float(theirs.abs().sum((1, 2, 3)).max()))


def test_layer_ig_equals_captum_on_a_cnn(captum: object) -> None:
    net, rnet = cnn()
    x = images()
    ours, delta = integrated_gradients(
        rnet, x, target=1, steps=10, layer="3", internal_batch_size=6, return_delta=True
    )
    theirs, their_delta = captum.LayerIntegratedGradients(net, net[2]).attribute(  # type: ignore[attr-defined]
        x, target=1, n_steps=10, internal_batch_size=6, return_convergence_delta=True
    )
    close(ours, theirs)
    close(delta, their_delta, scale=float(theirs.abs().sum((1, 2, 3)).max()))


def test_saliency_input_x_gradient_smoothgrad_equal_captum(captum: object) -> None:
    net, rnet = cnn()
    x = images()
    xg = x.clone().requires_grad_()  # captum warns on inputs that need no grad
    for absolute in (True, False):
        close(
            saliency(rnet, x, target=[1, 2], absolute=absolute),
            captum.Saliency(net).attribute(xg, target=[1, 2], abs=absolute),  # type: ignore[attr-defined]
        )
    close(
        input_x_gradient(rnet, x, target=0),
        captum.InputXGradient(net).attribute(xg, target=0),  # type: ignore[attr-defined]
    )
    close(
        input_x_gradient(rnet, x, target=0, layer="1"),
        captum.LayerGradientXActivation(net, net[1]).attribute(xg, target=0),  # type: ignore[attr-defined]
    )
    torch.manual_seed(5)
    ours = smoothgrad(rnet, x, target=2, samples=7, stdev=0.3, absolute=True)
    torch.manual_seed(5)
    theirs = captum.NoiseTunnel(captum.Saliency(net)).attribute(  # type: ignore[attr-defined]
        x, nt_type="smoothgrad", nt_samples=7, stdevs=0.3, target=2
    )
    close(ours, theirs)


def test_predicted_class_by_default(captum: object) -> None:
    net, rnet = cnn()
    x = images()
    predicted = net(x).argmax(1)
    close(
        integrated_gradients(rnet, x, steps=5),
        captum.IntegratedGradients(net).attribute(x, target=predicted, n_steps=5),  # type: ignore[attr-defined]
    )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid"])
def test_layer_ig_on_gpt2_embeddings_equals_captum(captum: object, method: str) -> None:
    """Token attributions at the embedding, keyword inputs, as captum's tutorial."""
    model = lms.gpt2()
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, lms.VOCAB, (2, 6), generator=gen)
    mask = torch.ones_like(ids)
    ref = torch.zeros_like(ids)
    ref[:, 0] = ids[:, 0]
    rnet = Recorder(model, input_data={"input_ids": ids, "attention_mask": mask})

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).logits[:, -1]

    ours, delta = integrated_gradients(
        rnet, {"input_ids": ids, "attention_mask": mask}, target=[3, 7], baselines=ref,
        steps=12, method=method, layer="transformer.wte", return_delta=True,
    )  # fmt: skip
    theirs, their_delta = captum.LayerIntegratedGradients(  # type: ignore[attr-defined]
        forward, model.transformer.wte
    ).attribute(
        ids, baselines=ref, target=[3, 7], additional_forward_args=(mask,),
        n_steps=12, method=method, return_convergence_delta=True,
    )  # fmt: skip
    assert ours.shape == (2, 6, 16)
    close(ours, theirs)
    close(delta, their_delta, scale=float(theirs.abs().sum((1, 2)).max()))
    fn = lambda out: out.logits[:, -1, 3]  # noqa: E731
    grads = saliency(rnet, {"input_ids": ids}, target=fn, layer="transformer.wte")
    theirs = captum.LayerGradientXActivation(  # type: ignore[attr-defined]
        lambda i: model(input_ids=i).logits[:, -1], model.transformer.wte,
        multiply_by_inputs=False,
    ).attribute(ids, target=3)  # fmt: skip
    close(grads, theirs.abs())
    with pytest.raises(ValueError, match="layer="):
        saliency(rnet, {"input_ids": ids})


def test_float_inputs_of_a_tuple_are_each_attributed() -> None:
    class Two(nn.Module):
        def forward(
            self, a: torch.Tensor, b: torch.Tensor, n: torch.Tensor
        ) -> torch.Tensor:
            return (a * b).sum(1, keepdim=True) + n[:, :1]

    rnet = Recorder(
        Two(),
        input_data=[
            torch.ones(1, 3),
            torch.ones(1, 3),
            torch.ones(1, 1, dtype=torch.long),
        ],
    )
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    n = torch.tensor([[1], [2]])
    ga, gb = saliency(rnet, (a, b, n), target=0, absolute=False)
    close(ga, b)
    close(gb, a)
    attr_a, attr_b = integrated_gradients(rnet, (a, b, n), target=0, steps=3)
    # a*b integrated from 0 along both: each gets half of a*b (exact for a quadratic)
    close(attr_a + attr_b, a * b, ulps=64)
    assert np.isfinite(attr_a.numpy()).all()


@pytest.mark.slow
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_row_is_attributed_as_alone(side: str) -> None:
    # The target is each row's last real token: a right-padded row's last
    # position is padding, whose logits are not the row's.
    lm = lms.gpt2()
    batch = lms.padded(side)
    rlm = Recorder(lm, input_data=batch)
    options = {"layer": "transformer.wte", "steps": 4}
    padded = integrated_gradients(rlm, batch, target=7, **options).sum(-1)
    predicted = saliency(rlm, batch, layer="transformer.wte").sum(-1)
    for row, length in enumerate(lms.LENGTHS):
        real = batch["attention_mask"][row].bool()
        alone = {
            "input_ids": batch["input_ids"][row : row + 1, real],
            "attention_mask": torch.ones(1, length, dtype=torch.long),
        }
        by_itself = integrated_gradients(rlm, alone, target=7, **options).sum(-1)[0]
        # float32 sums of 16 terms of magnitude <= 1 through two layers
        torch.testing.assert_close(padded[row, real], by_itself, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(
            predicted[row, real],
            saliency(rlm, alone, layer="transformer.wte").sum(-1)[0],
            rtol=1e-4,
            atol=1e-6,
        )
