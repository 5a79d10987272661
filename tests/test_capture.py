"""Capturing inputs, output gradients and parameters, besides outputs.

Every capture is checked against a manual computation: the layers applied by
hand with functional ops, and gradients taken with :func:`torch.autograd.grad`
on that hand-made graph.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import CallInputs, InPlaceWarning, Recorder

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def mlp():
    """``Linear(6, 5), ReLU, Linear(5, 4), ReLU, Linear(4, 3)``."""
    return nn.Sequential(
        nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)
    )


def mlp_by_hand(net, x):
    """Return ``(hidden1, penultimate, logits)`` of :func:`mlp`, by hand."""
    h1 = F.linear(x, net[0].weight, net[0].bias)
    penultimate = torch.relu(F.linear(torch.relu(h1), net[2].weight, net[2].bias))
    return h1, penultimate, F.linear(penultimate, net[4].weight, net[4].bias)


@pytest.fixture
def net():
    return mlp()


@pytest.fixture
def rnet(net):
    return Recorder(net, input_size=(1, 6))


@pytest.fixture
def x():
    return torch.randn(7, 6)


def all_hooks(net):
    """Return every module hook of every module of ``net``, as counts."""
    return {
        name: (
            len(m._forward_hooks),
            len(m._forward_pre_hooks),
            len(m._backward_hooks),
            len(m._backward_pre_hooks),
        )
        for name, m in net.named_modules()
        if m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or m._backward_pre_hooks
    }


# ===================================================================== inputs


def test_inputs_are_call_inputs_of_args_and_kwargs(rnet, x):
    """``rnet.inputs[label]`` is a ``CallInputs(args, kwargs)``."""
    rnet.record(inputs="4")
    rnet(x)
    record = rnet.inputs[(1, 5)]
    assert isinstance(record, CallInputs)
    assert isinstance(record.args, tuple)
    assert len(record.args) == 1
    assert record.kwargs == {}


def test_penultimate_features_are_the_input_of_the_head(rnet, net, x):
    """Input of the final Linear equals the features computed by hand."""
    rnet.record(inputs="4")
    rnet(x)
    _, penultimate, _ = mlp_by_hand(net, x)
    torch.testing.assert_close(rnet.inputs[(1, 5)].args[0], penultimate)


def test_first_layer_input_is_the_net_input(rnet, x):
    """Without options the record is the very tensor given to the net."""
    rnet.record(inputs="0")
    rnet(x)
    assert rnet.inputs[(1, 1)].args[0] is x


def test_inputs_selection_does_not_record_outputs(rnet, x):
    """``record(inputs=...)`` alone leaves ``activations`` empty."""
    rnet.record(inputs=nn.Linear)
    rnet(x)
    assert dict(rnet.activations) == {}
    assert list(rnet.inputs) == [(1, 1), (1, 3), (1, 5)]


def test_inputs_and_outputs_recorded_together(rnet, net, x):
    """Output of layer 0 and input of layer 2 come from the same pass."""
    rnet.record("0", inputs=["2", "4"])
    rnet(x)
    h1, penultimate, _ = mlp_by_hand(net, x)
    torch.testing.assert_close(rnet.activations[(1, 1)], h1)
    torch.testing.assert_close(rnet.inputs[(1, 3)].args[0], torch.relu(h1))
    torch.testing.assert_close(rnet.inputs[(1, 5)].args[0], penultimate)


class Attention(nn.Module):
    """A Hugging Face-style module: ``forward(hidden_states, attention_mask=...)``."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, hidden_states, attention_mask=None, scale=1.0):
        out = self.proj(hidden_states) * scale
        if attention_mask is not None:
            out = out * attention_mask
        return out


class Encoder(nn.Module):
    """Calls its layer with keyword arguments only."""

    def __init__(self):
        super().__init__()
        self.layer = Attention()

    def forward(self, x, mask):
        return self.layer(hidden_states=x, attention_mask=mask, scale=2.0)


def test_keyword_inputs_are_captured_in_kwargs():
    """A layer called with keywords has empty ``args`` and its ``kwargs``."""
    x, mask = torch.randn(2, 4), (torch.rand(2, 4) > 0.5).float()
    net = Encoder()
    rnet = Recorder(net, input_data={"x": x, "mask": mask})
    rnet.record(inputs="layer")
    out = rnet(x, mask)
    record = rnet.inputs[(1, 1)]
    assert record.args == ()
    assert list(record.kwargs) == ["hidden_states", "attention_mask", "scale"]
    assert record.kwargs["hidden_states"] is x
    assert record.kwargs["attention_mask"] is mask
    assert record.kwargs["scale"] == 2.0
    expected = F.linear(x, net.layer.proj.weight, net.layer.proj.bias) * 2.0 * mask
    torch.testing.assert_close(out, expected)


def inplace_net():
    """``Linear(3, 3), ReLU(inplace=True)``: the ReLU overwrites its input."""
    return nn.Sequential(nn.Linear(3, 3), nn.ReLU(inplace=True))


def test_inplace_module_input_is_the_pre_call_value_by_default(recwarn):
    """The ReLU overwrites its recorded input: the record is a copy, exact, silent."""
    net = inplace_net()
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record(inputs="1")
    x = torch.randn(4, 3)
    out = rnet(x)
    expected = F.linear(x, net[0].weight, net[0].bias)
    assert (expected < 0).any()
    assert torch.equal(rnet.inputs[(1, 2)].args[0], expected)
    assert rnet.inputs[(1, 2)].args[0] is not out
    assert not [w for w in recwarn if issubclass(w.category, InPlaceWarning)]


def test_inplace_module_input_unseen_by_the_reference_pass_warns():
    """A ReLU made in-place after the table: the record changes, a warning says so."""
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    rnet = Recorder(net, input_size=(1, 3))
    net[1].inplace = True
    rnet.record(inputs="1")
    msg = (
        "The record of layer 1-2 (ReLU `1`) was modified in place after it was "
        "recorded by an in-place operation that the reference pass did not run "
        "(records a later in-place operation overwrites in the reference pass are "
        "copies): `rnet.inputs[(1, 2)]` no longer holds that layer's inputs. Use "
        "`rnet.record(..., clone=True)` to keep an exact copy. Shown once per "
        "layer and recorder."
    )
    with pytest.warns(InPlaceWarning, match=f"^{re.escape(msg)}$"):
        out = rnet(torch.randn(4, 3))
    assert rnet.inputs[(1, 2)].args[0] is out  # it now holds the ReLU output


def test_inplace_module_input_with_clone_is_the_pre_call_value(recwarn):
    """``clone=True`` keeps the Linear output the ReLU received, negatives too."""
    net = inplace_net()
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record(inputs="1", clone=True)
    x = torch.randn(4, 3)
    rnet(x)
    expected = F.linear(x, net[0].weight, net[0].bias)
    assert (expected < 0).any()
    torch.testing.assert_close(rnet.inputs[(1, 2)].args[0], expected)
    assert not [w for w in recwarn if issubclass(w.category, InPlaceWarning)]


# ================================================================== gradients


def test_gradient_equals_autograd_grad_of_the_activation(rnet, net, x):
    """``rnet.gradients[label]`` is d loss / d (that layer's output)."""
    rnet.record(grads="2")
    rnet(x).pow(2).sum().backward()
    h1 = F.linear(x, net[0].weight, net[0].bias)
    h2 = F.linear(torch.relu(h1), net[2].weight, net[2].bias)
    loss = F.linear(torch.relu(h2), net[4].weight, net[4].bias).pow(2).sum()
    (expected,) = torch.autograd.grad(loss, h2)
    torch.testing.assert_close(rnet.gradients[(1, 3)], expected)


def test_gradients_of_every_layer_equal_retain_grad(rnet, net, x):
    """Each Linear's output gradient equals ``.grad`` of a retained tensor."""
    rnet.record(grads=nn.Linear)
    target = torch.randn(7, 3)
    F.mse_loss(rnet(x), target).backward()
    h1 = F.linear(x, net[0].weight, net[0].bias)
    h2 = F.linear(torch.relu(h1), net[2].weight, net[2].bias)
    h3 = F.linear(torch.relu(h2), net[4].weight, net[4].bias)
    for h in (h1, h2, h3):
        h.retain_grad()
    F.mse_loss(h3, target).backward()
    for label, h in zip([(1, 1), (1, 3), (1, 5)], [h1, h2, h3], strict=True):
        torch.testing.assert_close(rnet.gradients[label], h.grad)


def test_gradients_are_empty_before_backward(rnet, x):
    """Until ``backward()`` the gradient of a selected label is ``None``."""
    rnet.record(grads="0")
    rnet(x)
    assert dict(rnet.gradients) == {(1, 1): None}


def test_gradients_selection_does_not_record_outputs(rnet, x):
    """``record(grads=...)`` alone leaves ``activations`` empty."""
    rnet.record(grads="0")
    rnet(x).sum().backward()
    assert dict(rnet.activations) == {}
    assert list(rnet.gradients) == [(1, 1)]


@SETTINGS
@given(
    batch=st.integers(1, 4),
    label=st.sampled_from([(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]),
)
def test_gradient_of_any_layer_equals_autograd_grad(rnet, net, batch, label):
    """For any layer and batch size the gradient equals ``autograd.grad``."""
    x = torch.randn(batch, 6)
    rnet.record(grads=label)
    rnet(x).logsumexp(1).sum().backward()
    outputs = {}
    h = x
    for i, layer in enumerate(net):
        h = outputs[(1, i + 1)] = layer(h)  # no hook of this recorder's pass
    (expected,) = torch.autograd.grad(h.logsumexp(1).sum(), outputs[label])
    torch.testing.assert_close(rnet.gradients[label], expected)


def small_cnn():
    """Three conv blocks, global average pooling and a linear classifier."""

    def block(c_in, c_out):
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU())

    return nn.Sequential(
        nn.Sequential(block(3, 4), block(4, 6), block(6, 8)),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


def test_grad_cam_of_the_last_conv_block_equals_manual_grad_cam():
    """Grad-CAM from recorded output and gradient equals the autograd version."""
    net = small_cnn()
    rnet = Recorder(net, input_size=(1, 3, 8, 8))
    rnet.record("0.2", grads="0.2")
    x = torch.randn(2, 3, 8, 8)
    logits = rnet(x)
    classes = logits.argmax(1)
    logits.gather(1, classes[:, None]).sum().backward()
    act, grad = rnet.activations[(2, 3)], rnet.gradients[(2, 3)]
    cam = torch.relu((grad.mean((2, 3), keepdim=True) * act).sum(1))

    features = x
    for block in net[0]:
        conv = block[0]
        features = torch.relu(F.conv2d(features, conv.weight, conv.bias, padding=1))
    pooled = features.mean((2, 3))
    manual_logits = F.linear(pooled, net[3].weight, net[3].bias)
    score = manual_logits.gather(1, classes[:, None]).sum()
    (manual_grad,) = torch.autograd.grad(score, features)
    weights = manual_grad.mean((2, 3), keepdim=True)
    manual_cam = torch.relu((weights * features).sum(1))

    torch.testing.assert_close(act, features)
    torch.testing.assert_close(grad, manual_grad)
    torch.testing.assert_close(cam, manual_cam)
    assert cam.shape == (2, 8, 8)


def test_grads_under_no_grad_record_none(rnet, x):
    """A selection with gradients records none in a ``torch.no_grad()`` pass.

    The outputs are recorded as usual, and the same selection records the
    gradients of a pass with gradients: clean and corrupted runs share it.
    """
    rnet.record("0", grads="0")
    # Reading one of them says why there is none (it was silently empty,
    # also after a later backward()).
    missed = (
        "The gradients of 1-1 (Linear `0`) were not captured: the latest pass "
        "recorded them (`record(grads=...)`) but ran without autograd (under "
        "`torch.no_grad()` or `torch.inference_mode()`), so no gradient flows "
        "back to them. Run the pass with gradients enabled, then call `backward()`."
    )
    with torch.no_grad():
        out = rnet(x)
    assert set(rnet.activations) == {(1, 1)}
    assert dict(rnet.gradients) == {}
    rnet.net(x).sum().backward()  # a backward of another graph
    with pytest.raises(KeyError, match=f"^{re.escape(repr(missed))}$"):
        rnet.gradients[(1, 1)]
    with pytest.raises(KeyError, match=f"^{re.escape(repr(missed))}$"):
        rnet.gradients_of("0")
    with torch.inference_mode():
        rnet(x)
    assert dict(rnet.gradients) == {}
    with pytest.raises(KeyError, match=f"^{re.escape(repr(missed))}$"):
        rnet.gradients[(1, 1)]
    rnet(x).sum().backward()
    assert rnet.gradients[(1, 1)].shape == rnet.activations[(1, 1)].shape
    assert out.shape == rnet(x).shape


def test_grads_where_nothing_requires_grad_raise_runtime_error(x):
    """With gradients on, an output that cannot get one is refused, named."""
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).requires_grad_(False)
    rnet = Recorder(net, input_size=(1, 4))
    rnet.record(grads="0")
    msg = (
        "Cannot capture the gradient of module `0` (Linear, label 1-1) at label "
        "1-1: its output does not require grad (nothing before it requires "
        "grad: no parameter before it has `requires_grad=True`, and neither has "
        "the input). Set `requires_grad_()` on the input, or record without "
        "`grads=`."
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(msg)}$"):
        rnet(torch.randn(2, 4))
    assert dict(rnet.activations) == {}
    assert dict(rnet.gradients) == {}


class TupleOut(nn.Module):
    """Returns ``(h, (2 h, arange), {"k": h.sum(1)})``: one leaf needs no grad."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        return h, (h * 2, torch.arange(3.0)), {"k": h.sum(1)}


class TupleNet(nn.Module):
    """Combines every leaf of :class:`TupleOut`'s output into a scalar."""

    def __init__(self):
        super().__init__()
        self.two = TupleOut()

    def forward(self, x):
        a, (b, c), d = self.two(x)
        return (a * b).sum() + (c * a).sum() + d["k"].pow(2).sum()


def test_gradient_of_a_tuple_output_mirrors_its_structure():
    """Tuple, nested tuple and dict kept; ``None`` for the no-grad leaf."""
    net = TupleNet()
    rnet = Recorder(net, input_size=(2, 3))
    rnet.record("two", grads="two")
    loss = rnet(torch.randn(2, 3))
    a, (b, _c), d = rnet.activations[(1, 1)]
    expected = torch.autograd.grad(loss, [a, b, d["k"]], retain_graph=True)
    loss.backward()
    ga, (gb, gc), gd = rnet.gradients[(1, 1)]
    assert gc is None
    assert list(gd) == ["k"]
    torch.testing.assert_close(ga, expected[0])
    torch.testing.assert_close(gb, expected[1])
    torch.testing.assert_close(gd["k"], expected[2])


def test_gradient_of_a_postprocessed_output_is_taken_with_respect_to_the_replacement(
    rnet, net, x
):
    """With a postprocessor, the gradient is that of what flows on (3 * out)."""
    rnet.record("0", grads="0")
    out = rnet(x, activation_postproc=lambda out: 3 * out)
    out.pow(2).sum().backward()
    h1 = F.linear(x, net[0].weight, net[0].bias)
    replaced = 3 * h1
    manual_out = net[4](net[3](net[2](net[1](replaced))))
    loss = manual_out.pow(2).sum()
    expected, wrt_original = torch.autograd.grad(loss, [replaced, h1])
    torch.testing.assert_close(out, manual_out)
    torch.testing.assert_close(rnet.activations[(1, 1)], h1)
    torch.testing.assert_close(rnet.gradients[(1, 1)], expected)
    torch.testing.assert_close(rnet.gradients[(1, 1)], wrt_original / 3)


def test_gradient_of_an_output_later_modified_in_place_is_of_the_produced_value():
    """A ReLU(inplace=True) after the layer: the gradient is w.r.t. its output."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record(grads="0")
    x = torch.randn(5, 3)
    rnet(x).pow(2).sum().backward()
    h = F.linear(x, net[0].weight, net[0].bias)
    out = F.linear(torch.relu(h), net[2].weight, net[2].bias)
    (expected,) = torch.autograd.grad(out.pow(2).sum(), h)
    assert (expected == 0).any()  # the ReLU's mask shows in the gradient
    torch.testing.assert_close(rnet.gradients[(1, 1)], expected)


def test_each_pass_has_its_own_gradients(rnet, net):
    """A second pass replaces the gradients; the first backward's are gone."""
    rnet.record(grads="4")
    rnet(torch.randn(2, 6)).sum().backward()
    x = torch.randn(3, 6)
    rnet(x).pow(2).sum().backward()
    *_, logits = mlp_by_hand(net, x)
    torch.testing.assert_close(rnet.gradients[(1, 5)], 2 * logits)


def test_no_hook_remains_after_backward_and_deleting_the_recorder(net, x):
    """After backward, ``del rnet`` and ``gc.collect()`` no module has hooks."""
    rnet = Recorder(net, input_size=(1, 6))
    rnet.record("0", inputs="2", grads=nn.Linear, params="4")
    rnet(x).sum().backward()
    assert all_hooks(net) != {}
    del rnet
    gc.collect()
    assert all_hooks(net) == {}


# ================================================================= parameters


def test_params_of_a_type_are_the_parameter_objects(rnet, net):
    """``record(params=nn.Linear)`` maps qualified names to the Parameters."""
    rnet.record(params=nn.Linear)
    assert list(rnet.params) == [
        "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"
    ]  # fmt: skip
    for name, param in rnet.params.items():
        assert param is net.get_parameter(name)


def test_params_by_parameter_name(rnet, net):
    """``record(params="4.weight")`` selects that one parameter."""
    rnet.record(params="4.weight")
    assert dict(rnet.params) == {"4.weight": net[4].weight}
    assert rnet.params["4.weight"] is net[4].weight
    assert rnet.selection.params == ("4.weight",)


def test_params_by_module_name_and_parameter_name_together(rnet, net):
    """A module name and a parameter name mix; order follows the net."""
    rnet.record(params=["4.bias", "0"])
    assert list(rnet.params) == ["0.weight", "0.bias", "4.bias"]


def test_params_mapping_is_read_only(rnet):
    """``rnet.params`` cannot be assigned to."""
    rnet.record(params="0")
    with pytest.raises(TypeError):
        rnet.params["0.weight"] = None  # type: ignore[index]


def test_param_grads_equal_manual_gradients(rnet, net, x):
    """After zero_grad + backward, ``param_grads`` equals autograd's."""
    rnet.record(params=nn.Linear)
    rnet(torch.randn(2, 6)).sum().backward()  # stale gradients to clear
    net.zero_grad()
    target = torch.randint(0, 3, (7,))
    F.cross_entropy(rnet(x), target).backward()
    params = [net.get_parameter(name) for name in rnet.params]
    *_, logits = mlp_by_hand(net, x)
    expected = torch.autograd.grad(F.cross_entropy(logits, target), params)
    assert list(rnet.param_grads) == list(rnet.params)
    for grad, manual in zip(rnet.param_grads.values(), expected, strict=True):
        torch.testing.assert_close(grad, manual)


def test_param_grads_are_none_before_backward(rnet):
    """A parameter that never received a gradient shows ``None``."""
    rnet.record(params="2.bias")
    assert rnet.param_grads == {"2.bias": None}


def test_gradnorm_score_equals_manual_computation():
    """GradNorm: per-sample L1 norm of d KL(u || softmax) / d head weight."""
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
    rnet = Recorder(net, input_size=(1, 6))
    rnet.record(params="2.weight")
    x = torch.randn(5, 6)
    scores = []
    for sample in x:
        net.zero_grad()
        logits = rnet(sample[None])
        uniform = torch.full_like(logits, 1 / logits.shape[1])
        F.kl_div(logits.log_softmax(1), uniform, reduction="sum").backward()
        scores.append(rnet.param_grads["2.weight"].abs().sum())

    manual = []
    for sample in x:
        features = torch.tanh(F.linear(sample[None], net[0].weight, net[0].bias))
        logits = F.linear(features, net[2].weight, net[2].bias)
        c = logits.shape[1]
        kl = ((1 / c) * (torch.log(torch.tensor(1 / c)) - logits.log_softmax(1))).sum()
        (grad,) = torch.autograd.grad(kl, net[2].weight)
        manual.append(grad.abs().sum())
    torch.testing.assert_close(torch.stack(scores), torch.stack(manual))
    assert len(set(torch.stack(manual).tolist())) == 5  # the score is per sample


# ==================================================================== options


def test_detach_applies_to_inputs(rnet, x):
    """``detach=True``: the recorded input needs no grad though the net's does."""
    rnet.record(inputs="2", detach=True)
    rnet(x)
    record = rnet.inputs[(1, 3)].args[0]
    assert not record.requires_grad
    assert record.grad_fn is None


def test_detach_keeps_gradients_captured(rnet, net, x):
    """Detached records still let ``backward()`` fill in the gradients."""
    rnet.record("0", grads="0", detach=True)
    rnet(x).sum().backward()
    assert not rnet.activations[(1, 1)].requires_grad
    h1 = F.linear(x, net[0].weight, net[0].bias)
    (expected,) = torch.autograd.grad(net[4:](net[1:4](h1)).sum(), h1)
    torch.testing.assert_close(rnet.gradients[(1, 1)], expected)


def test_dtype_applies_to_inputs_and_gradients(rnet, net, x):
    """``dtype=torch.float64`` casts outputs, inputs and gradients."""
    rnet.record("0", inputs="4", grads="4", dtype=torch.float64)
    rnet(x).sum().backward()
    h1, penultimate, _ = mlp_by_hand(net, x)
    output, features = rnet.activations[(1, 1)], rnet.inputs[(1, 5)].args[0]
    grad = rnet.gradients[(1, 5)]
    assert output.dtype == features.dtype == grad.dtype == torch.float64
    torch.testing.assert_close(output, h1.double())
    torch.testing.assert_close(features, penultimate.double())
    torch.testing.assert_close(grad, torch.ones(7, 3, dtype=torch.float64))


def test_dtype_leaves_non_floating_inputs_alone():
    """An integer input keeps its dtype under ``dtype=torch.float64``."""
    net = nn.Sequential(nn.Embedding(10, 3), nn.Linear(3, 2))
    idx = torch.tensor([[1, 2], [3, 4]])
    rnet = Recorder(net, input_data=idx)
    rnet.record(inputs="0", dtype=torch.float64)
    rnet(idx)
    assert rnet.inputs[(1, 1)].args[0].dtype == torch.int64
    assert torch.equal(rnet.inputs[(1, 1)].args[0], idx)


def test_device_applies_to_inputs_and_gradients(rnet, x):
    """``device="meta"`` moves outputs, inputs and gradients."""
    rnet.record("0", inputs="2", grads="0", device="meta")
    out = rnet(x)
    out.sum().backward()
    assert out.device.type == "cpu"
    assert rnet.activations[(1, 1)].device.type == "meta"
    assert rnet.inputs[(1, 3)].args[0].device.type == "meta"
    assert rnet.gradients[(1, 1)].device.type == "meta"
    assert rnet.gradients[(1, 1)].shape == (7, 5)


def test_clone_applies_to_inputs(rnet, x):
    """``clone=True`` records a copy of the input, not the tensor given."""
    rnet.record(inputs="0", clone=True)
    rnet(x)
    record = rnet.inputs[(1, 1)].args[0]
    assert record is not x
    assert record.data_ptr() != x.data_ptr()
    torch.testing.assert_close(record, x)


def test_dtype_that_is_no_dtype_is_refused(rnet):
    """``dtype="float64"`` (a string) raises TypeError."""
    msg = "`dtype` must be a `torch.dtype`, got 'float64'"
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        rnet.record(inputs="0", dtype="float64")


# ========================================================= reference contract


def test_label_selection_still_records_outputs(rnet, net, x):
    """``rnet.record((1, 3))`` records that layer's output as before."""
    rnet.record((1, 3))
    rnet(x)
    h1 = F.linear(x, net[0].weight, net[0].bias)
    expected = F.linear(torch.relu(h1), net[2].weight, net[2].bias)
    assert list(rnet.activations) == [(1, 3)]
    torch.testing.assert_close(rnet.activations[(1, 3)], expected)


def test_several_labels_still_record_in_hook_order(rnet, net, x):
    """``rnet.record((1, 3), (1, 1))``: sorted selection, outputs in pass order."""
    rnet.record((1, 3), (1, 1))
    rnet(x)
    h1, _, _ = mlp_by_hand(net, x)
    assert rnet.recording == ((1, 1), (1, 3))
    assert list(rnet.activations) == [(1, 1), (1, 3)]
    torch.testing.assert_close(rnet.activations[(1, 1)], h1)


def test_repr_without_inputs_has_no_extra_line(rnet):
    """Recording outputs only: the repr ends as the reference one does."""
    rnet.record((1, 3))
    lines = repr(rnet).splitlines()
    assert lines[-2] == "Currently recording: 1-3"
    assert not [line for line in lines if line.startswith("Also recording")]


def test_repr_lists_recorded_inputs(rnet):
    """With inputs selected, a line "Also recording inputs: ..." follows."""
    rnet.record((1, 3), inputs=["4", "0"])
    lines = repr(rnet).splitlines()
    assert lines[-3:-1] == [
        "Currently recording: 1-3",
        "Also recording inputs: 1-1, 1-5",
    ]
    assert lines[-1] == "=" * len(lines[-1])


def test_repr_lists_inputs_gradients_and_parameters(rnet):
    """Each kind of capture has its own line, in this order."""
    rnet.record(inputs="0", grads="2", params="4.bias")
    assert repr(rnet).splitlines()[-5:-1] == [
        "Currently recording: None",
        "Also recording inputs: 1-1",
        "Also recording gradients: 1-3",
        "Also recording parameters: 4.bias",
    ]
