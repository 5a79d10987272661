"""Explanations against hand computations: Grad-CAM, patching, ablation."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from torch import nn

from scio_recorder import CallInputs, Recorder
from scio_recorder.explain import ablate, cache_run, grad_cam, layer_means, patch


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 5, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        h = self.relu(self.conv1(x))
        return self.fc(self.pool(self.conv2(h)).flatten(1))


@pytest.fixture
def net():
    torch.manual_seed(0)
    return ConvNet().eval()


@pytest.fixture
def rnet(net):
    return Recorder(net, input_size=(1, 3, 8, 8))


def cam_by_hand(net, x, target):
    """Grad-CAM of conv2 by hand: autograd on a hand-written forward."""
    h = torch.relu(net.conv1(x))
    maps = net.conv2(h)
    logits = net.fc(maps.mean((2, 3)))
    chosen = logits.gather(1, target[:, None]).sum()
    (grads,) = torch.autograd.grad(chosen, maps)
    cam = torch.relu((grads.mean((2, 3), keepdim=True) * maps).sum(1))
    cam = F.interpolate(
        cam[:, None], size=x.shape[-2:], mode="bilinear", align_corners=False
    )[:, 0]
    return (cam / cam.flatten(1).amax(1).clamp(min=1e-38)[:, None, None]).detach()


def test_grad_cam_equals_the_formula_and_leaves_grads_alone(net, rnet):
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        predicted = net(x).argmax(1)
    cams = grad_cam(rnet, x, layer="conv2")
    # same float32 ops on the same inputs, autograd through the same graph
    torch.testing.assert_close(cams, cam_by_hand(net, x, predicted))
    target = torch.tensor([0, 1, 2, 0])
    torch.testing.assert_close(
        grad_cam(rnet, x, "conv2", target), cam_by_hand(net, x, target)
    )
    torch.testing.assert_close(
        grad_cam(rnet, x, "conv2", 2), cam_by_hand(net, x, torch.full((4,), 2))
    )
    assert all(p.grad is None for p in net.parameters())
    assert rnet.recording == ()
    assert grad_cam(rnet, x, "conv2", upsample=False).shape == (4, 8, 8)


def test_grad_cam_refuses_a_layer_without_feature_maps(rnet):
    msg = (
        "grad_cam: layer 1-5 (Linear `fc`) outputs [2, 3]; Grad-CAM needs feature "
        "maps [batch, channels, height, width]: name a convolutional layer."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        grad_cam(rnet, torch.randn(2, 3, 8, 8), "fc")
    msg = (
        "grad_cam: layer <class 'torch.nn.modules.conv.Conv2d'> selects 2 calls "
        "(1-1, 1-3); name one of them, e.g. `layer=(1, 1)`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        grad_cam(rnet, torch.randn(2, 3, 8, 8), nn.Conv2d)


def rest_after_relu(net, h):
    return net.fc(net.pool(net.conv2(h)).flatten(1))


def test_patch_substitutes_the_source_activation(net, rnet):
    source, target = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        h_source = torch.relu(net.conv1(source))
        h_target = torch.relu(net.conv1(target))
        whole = rest_after_relu(net, h_source)
        mixed = h_target.clone()
        mixed[:, 1] = h_source[:, 1]
        channel = rest_after_relu(net, mixed)
    torch.testing.assert_close(patch(rnet, source, target, "relu"), whole)
    torch.testing.assert_close(
        patch(rnet, source, target, "relu", where=(slice(None), 1)), channel
    )
    assert rnet.recording == ()


def test_patch_of_another_shape_says_what_to_do(rnet):
    """Batches checked before any pass; other shapes named with the layer."""
    msg = (
        "patch: `source` has a batch of 2 and `target` of 1: pass inputs of one "
        "batch size, the i-th `source` sample paired with the i-th `target` one."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        patch(rnet, torch.randn(2, 3, 8, 8), torch.randn(1, 3, 8, 8), "relu")
    msg = (
        "patch: layer 1-2 (ReLU `relu`) outputs [2, 4, 6, 6] on `target` and "
        "[2, 4, 8, 8] on `source`: pass a source and a target of the same shape "
        "(batch and length; pad them, with an `attention_mask`)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        patch(rnet, torch.randn(2, 3, 8, 8), torch.randn(2, 3, 6, 6), "relu")
    cache = cache_run(rnet, torch.randn(2, 3, 8, 8), "relu")
    with pytest.raises(ValueError, match=r"outputs \[3, 4, 8, 8\] on `target`"):
        patch(rnet, cache, torch.randn(3, 3, 8, 8), "relu")
    assert rnet.recording == ()


@pytest.mark.parametrize(
    "where", [(slice(None), 4), (slice(None), 0, 0, 0, 0), "channel", (0, 9)]
)
def test_patch_and_ablate_refuse_a_where_that_does_not_index_the_output(rnet, where):
    """`where` is tried on the layer's output; the message names it and the shape."""
    x = torch.randn(2, 3, 8, 8)
    msg = (
        rf"^patch: `where={re.escape(repr(where))}` does not index the output "
        r"\[2, 4, 8, 8\] of layer 1-2 \(ReLU `relu`\) \(.*\): give an index of "
        r"that shape, e\.g\. `where=\(slice\(None\), 3\)`"
    )
    passes = [0]
    handle = rnet.net.register_forward_pre_hook(
        lambda _m, _a: passes.__setitem__(0, passes[0] + 1)
    )
    try:
        with pytest.raises(ValueError, match=msg):
            patch(rnet, x, x, "relu", where=where)
        assert passes[0] == 1  # refused after the source pass, before the target
    finally:
        handle.remove()
    with pytest.raises(ValueError, match="^ablate" + msg[len("^patch") :]):
        ablate(rnet, x, "relu", where=where)
    assert rnet.recording == ()


@pytest.mark.parametrize(
    ("call", "who"),
    [
        (lambda net, x: grad_cam(net, x, "conv2"), "grad_cam"),
        (lambda net, x: patch(net, x, x, "relu"), "patch"),
        (lambda net, x: cache_run(net, x, "relu"), "cache_run"),
        (lambda net, x: ablate(net, x, "relu"), "ablate"),
        (lambda net, x: layer_means(net, [x], "relu", input=None), "layer_means"),
    ],
)
def test_every_function_refuses_a_bare_net(net, call, who):
    msg = (
        f"{who}: `rnet` must be a Recorder wrapping the net, got a ConvNet: wrap "
        "it first, e.g. `rnet = Recorder(net, input_size=(1, 3, 32, 32))`"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}"):
        call(net, torch.randn(2, 3, 8, 8))


@pytest.mark.parametrize(
    ("target", "error", "message"),
    [
        (3, ValueError, "`target` holds class 3, out of range for the 3 classes"),
        (-1, ValueError, "`target=-1` is a negative class"),
        (True, TypeError, "`target` is True: pass a class index"),
        (1.5, TypeError, "`target` is 1.5: pass a class index"),
        (torch.tensor([0.0, 1.0]), TypeError, "`target` is a torch.float32 tensor"),
        (torch.tensor([0, 5]), ValueError, "`target` holds class 5, out of range"),
        (torch.tensor([0, 1, 2]), ValueError, "`target` holds 3 classes for a batch"),
        (
            torch.zeros(2, 1, dtype=torch.long),
            ValueError,
            r"`target` has shape \[2, 1\]",
        ),
    ],
)
def test_grad_cam_refuses_a_target_that_names_no_class(rnet, target, error, message):
    with pytest.raises(error, match=f"^grad_cam: {message}"):
        grad_cam(rnet, torch.randn(2, 3, 8, 8), "conv2", target=target)
    with pytest.raises(TypeError, match=r"^grad_cam: `upsample` must be True or"):
        grad_cam(rnet, torch.randn(2, 3, 8, 8), "conv2", upsample="yes")
    one = grad_cam(rnet, torch.randn(2, 3, 8, 8), "conv2", torch.tensor(2))
    assert one.shape == (2, 8, 8)  # one class for all, as a 0-d tensor


def test_zero_and_mean_ablation(net, rnet):
    x = torch.randn(3, 3, 8, 8)
    data = [torch.randn(5, 3, 8, 8) for _ in range(2)]
    with torch.no_grad():
        zero = rest_after_relu(net, torch.zeros(3, 4, 8, 8))
        feats = torch.cat([torch.relu(net.conv1(b)) for b in data]).double()
        mean = feats.mean(0)
        meaned = rest_after_relu(net, mean.float().expand(3, 4, 8, 8))
    torch.testing.assert_close(ablate(rnet, x, "relu"), zero)
    means = layer_means(rnet, data, "relu", input=None)
    # the same float32 features, averaged in float64 in another order
    torch.testing.assert_close(means[(1, 2)], mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ablate(rnet, x, "relu", means=means), meaned)
    with pytest.raises(KeyError, match="no mean for layer 1-1"):
        ablate(rnet, x, "conv1", means=means)


def test_ablating_two_layers_applies_each_edit_to_its_own_layer(net, rnet):
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        want = net.fc(torch.zeros(2, 5))
    got = ablate(rnet, x, ["conv1", "pool"])
    torch.testing.assert_close(got, want)


def test_ablate_refuses_means_that_is_not_a_mapping(rnet):
    """A bare tensor for `means` names `means` and what to pass, before running."""
    x = torch.randn(2, 3, 8, 8)
    msg = (
        r"ablate: `means` must be a mapping from layer to mean activation, got "
        r"a Tensor of shape \[4, 8, 8\]: pass `means=layer_means\(rnet, batches, "
        r"layers\)`"
    )
    with pytest.raises(TypeError, match=msg):
        ablate(rnet, x, "relu", means=torch.zeros(4, 8, 8))
    with pytest.raises(TypeError, match="got a list"):
        ablate(rnet, x, "relu", means=[torch.zeros(4, 8, 8)])


def test_ablate_refuses_a_mean_that_is_not_a_tensor(rnet):
    with pytest.raises(
        TypeError, match=r"ablate: `means\[\(1, 2\)\]` is a float, not a tensor"
    ):
        ablate(rnet, torch.randn(2, 3, 8, 8), "relu", means={(1, 2): 0.5})


@pytest.mark.parametrize("key", [(7, 7), "no_such_layer"])
def test_ablate_refuses_a_key_that_is_not_a_layer(rnet, key):
    msg = (
        rf"ablate: the key {re.escape(repr(key))} of `means` is not a layer of "
        r"this net .*see `print\(rnet\)` for the labels"
    )
    with pytest.raises(ValueError, match=msg):
        ablate(rnet, torch.randn(2, 3, 8, 8), "relu", means={key: torch.zeros(4)})


def test_ablate_refuses_a_mean_of_the_wrong_shape(rnet):
    msg = (
        r"ablate: `means\[\(1, 2\)\]` has shape \[5\], which does not broadcast "
        r"to the output \[2, 4, 8, 8\] of layer 1-2 \(ReLU `relu`\): pass the "
        r"layer's mean activation, of shape \[4, 8, 8\]"
    )
    with pytest.raises(ValueError, match=msg):
        ablate(rnet, torch.randn(2, 3, 8, 8), "relu", means={(1, 2): torch.zeros(5)})


def test_ablate_means_keyed_by_name_and_broadcast(net, rnet):
    """A selector key and a broadcastable mean act as the full label-keyed mean."""
    x = torch.randn(2, 3, 8, 8)
    per_channel = torch.arange(4.0).reshape(4, 1, 1)
    full = {(1, 2): per_channel.expand(4, 8, 8).clone()}
    want = ablate(rnet, x, "relu", means=full)
    # the same float32 values put in the same place: bit-exact
    assert torch.equal(ablate(rnet, x, "relu", means={"relu": per_channel}), want)
    # a mean for a layer not ablated is ignored (layer_means of a superset)
    more = {**full, (1, 1): torch.zeros(1)}
    assert torch.equal(ablate(rnet, x, "relu", means=more), want)


def test_grad_cam_takes_keyword_inputs_and_a_scalar_function(net, rnet):
    """`x` as keywords; `target` a function of the output (a loss, a logit sum)."""
    x = torch.randn(4, 3, 8, 8)
    # the same ops as with target=1: the scalar is the sum of logit 1
    got = grad_cam(rnet, {"x": x}, "conv2", target=lambda out: out[:, 1].sum())
    torch.testing.assert_close(got, cam_by_hand(net, x, torch.full((4,), 1)))
    both = grad_cam(rnet, CallInputs((x,), {}), "conv2", target=1)
    torch.testing.assert_close(both, got)
    msg = (
        r"grad_cam: `target` returned a tensor of shape \[4\]; it must return one "
        r"number as a tensor, e.g. `lambda out: out.logits\[:, -1, 7\].sum\(\)`"
    )
    with pytest.raises(ValueError, match=msg):
        grad_cam(rnet, x, "conv2", target=lambda out: out[:, 1])
    assert all(p.grad is None for p in net.parameters())


def test_grad_cam_without_an_image_says_to_pass_upsample_false():
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)

        def forward(self, flat):
            return self.conv(flat.reshape(-1, 1, 4, 4)).sum((1, 2, 3))[:, None]

    rnet = Recorder(Flat(), input_size=(1, 16))
    msg = (
        "grad_cam: `upsample=True` resizes to the input image, but no input is "
        "a [batch, channels, height, width] tensor: pass `upsample=False`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        grad_cam(rnet, torch.randn(2, 16), "conv", target=0)
    assert grad_cam(rnet, torch.randn(2, 16), "conv", 0, upsample=False).shape == (
        2,
        4,
        4,
    )


def test_patch_and_ablate_take_every_form_of_inputs(net, rnet):
    """A tensor, a tuple, a mapping and CallInputs are the same call."""
    source, target = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    want = patch(rnet, source, target, "relu")
    for s, t in [
        ((source,), (target,)),
        ({"x": source}, {"x": target}),
        (CallInputs((), {"x": source}), CallInputs((target,), {})),
    ]:
        assert torch.equal(patch(rnet, s, t, "relu"), want)
    assert torch.equal(
        ablate(rnet, {"x": target}, "relu"), ablate(rnet, target, "relu")
    )
    with pytest.raises(ValueError, match=r"keyword inputs name \['dont_record'\]"):
        patch(rnet, {"x": source, "dont_record": True}, target, "relu")
