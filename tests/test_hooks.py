"""Hooks placement, call-plan verification, fused fast paths and in-place safety."""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from scio_recorder import CallPlanError, InPlaceWarning, Recorder
from tests.nets import (
    BranchNet,
    ListNet,
    LoopNet,
    SharedActNet,
    TrainOnlyNet,
    inplace_blocks,
)

X = (1, 4)  # input_size of every reference pass


def forward_hook_counts(root: nn.Module) -> dict[nn.Module, int]:
    """Return the number of forward hooks of each module that has any."""
    return {m: len(m._forward_hooks) for m in root.modules() if m._forward_hooks}


def inplace_warnings(records) -> list:
    """Return the InPlaceWarning entries of a list of caught warnings."""
    return [w for w in records if issubclass(w.category, InPlaceWarning)]


# ------------------------------------------------------------ hook placement


def test_no_hooks_when_recording_nothing():
    """A fresh recorder leaves no forward or pre-forward hook on any module."""
    rnet = Recorder(ListNet(), input_size=X)
    assert forward_hook_counts(rnet) == {}
    assert [m for m in rnet.modules() if m._forward_pre_hooks] == []
    assert rnet.hooked_modules == ()


def test_hooks_only_on_modules_with_a_selected_call():
    """Exactly one forward hook sits on each module with a selected call."""
    net = ListNet()
    rnet = Recorder(net, input_size=X)
    rnet.record((2, 2), (1, 4))
    assert forward_hook_counts(rnet) == {net.layers[1]: 1, net.act: 1}
    assert set(rnet.hooked_modules) == {net.layers[1], net.act}


def test_shared_module_hooked_once_for_two_labels():
    """Two selected calls of a shared ReLU put a single hook on it."""
    net = SharedActNet()
    rnet = Recorder(net, input_size=X)
    rnet.record((2, 2), (2, 4))
    assert forward_hook_counts(rnet) == {net.b1.act: 1}


def test_record_moves_hooks():
    """A new selection removes the hooks of the previous one."""
    net = ListNet()
    rnet = Recorder(net, input_size=X)
    rnet.record((2, 1))
    rnet.record((2, 3))
    assert forward_hook_counts(rnet) == {net.layers[2]: 1}


def test_record_nothing_removes_hooks():
    """``record()`` with no label removes every hook."""
    rnet = Recorder(ListNet(), input_size=X)
    rnet.record((2, 1), (1, 2))
    rnet.record()
    assert forward_hook_counts(rnet) == {}


def test_direct_net_call_records_nothing():
    """Calling ``rnet.net`` directly leaves the latest activations untouched."""
    net = ListNet()
    rnet = Recorder(net, input_size=X)
    rnet.record((2, 1))
    x = torch.randn(3, 4)
    rnet(x)
    before = dict(rnet.activations)
    rnet.net(torch.randn(3, 4))
    assert rnet.activations.keys() == before.keys()
    assert rnet.activations[(2, 1)] is before[(2, 1)]


def test_direct_net_call_returns_plain_output():
    """Calling ``rnet.net`` directly with hooks in place returns the plain output."""
    net = ListNet()
    rnet = Recorder(net, input_size=X)
    rnet.record((2, 1), (1, 6))
    x = torch.randn(3, 4)
    expected = x
    for layer in net.layers:
        expected = torch.relu(layer(expected))
    torch.testing.assert_close(rnet.net(x), expected)


# ------------------------------------------------------------ call plan


@pytest.fixture
def train_table_rnet() -> Recorder:
    """A TrainOnlyNet recorder with a train-mode table, recording both layers."""
    rnet = Recorder(TrainOnlyNet(), input_size=X, mode="train")
    rnet.record((1, 1), (1, 2))
    return rnet


def test_missing_call_in_other_mode_raises(train_table_rnet):
    """A train-only module recorded then skipped in eval raises CallPlanError."""
    rnet = train_table_rnet.eval()
    with pytest.raises(CallPlanError) as info:
        rnet(torch.randn(3, 4))
    message = str(info.value)
    for part in (
        "module `train_only` (Linear, label 1-2)",
        "called 0 times",
        "expects 1 call",
        "table built in train mode",
        "this pass ran in eval mode",
    ):
        assert part in message


def test_failed_pass_keeps_no_activations(train_table_rnet):
    """After a call-plan mismatch the activations of an earlier pass are gone."""
    rnet = train_table_rnet
    rnet(torch.randn(3, 4))
    assert list(rnet.activations) == [(1, 1), (1, 2)]
    rnet.eval()
    with pytest.raises(CallPlanError):
        rnet(torch.randn(3, 4))
    assert dict(rnet.activations) == {}


def test_good_pass_after_mismatch_records(train_table_rnet):
    """The next pass in the table's mode after a mismatch records correctly."""
    rnet = train_table_rnet.eval()
    with pytest.raises(CallPlanError):
        rnet(torch.randn(3, 4))
    rnet.train()
    x = torch.randn(3, 4)
    out = rnet(x)
    net = rnet.net
    torch.testing.assert_close(rnet.activations[(1, 1)], net.lin(x))
    torch.testing.assert_close(rnet.activations[(1, 2)], net.train_only(net.lin(x)))
    torch.testing.assert_close(out, net.train_only(net.lin(x)))


def test_extra_call_raises_at_first_extra_call():
    """A module called more often than in the table raises at its first extra call."""
    net = LoopNet()
    rnet = Recorder(net, input_size=(2, 4), force_static_flow=False)
    rnet.record((1, 1))
    started = []
    net.lin.register_forward_pre_hook(lambda module, args: started.append(module))
    with pytest.raises(CallPlanError) as info:
        rnet(torch.randn(5, 4))
    assert len(started) == 3
    message = str(info.value)
    for part in (
        "module `lin` (Linear, labels 1-1, 1-2)",
        "called at least 3 times",
        "expects 2 calls",
    ):
        assert part in message


def test_dont_record_accepts_missing_call(train_table_rnet):
    """With ``dont_record=True`` a missing call raises no error."""
    rnet = train_table_rnet.eval()
    x = torch.randn(3, 4)
    out = rnet(x, dont_record=True)
    torch.testing.assert_close(out, rnet.net.lin(x))
    assert dict(rnet.activations) == {}


def test_dont_record_still_raises_on_extra_call():
    """With ``dont_record=True`` an extra call still raises CallPlanError."""
    rnet = Recorder(LoopNet(), input_size=(2, 4), force_static_flow=False)
    rnet.record((1, 2))
    with pytest.raises(CallPlanError, match="called at least 3 times"):
        rnet(torch.randn(3, 4), dont_record=True)


# ------------------------------------------------------------ data-dependent flow


@pytest.fixture(scope="module", params=[1.0, -1.0], ids=["positive", "negative"])
def branch_rnet(request) -> Recorder:
    """BranchNet recorded on every label, built on an input of the given sign."""
    torch.manual_seed(0)
    reference = torch.full((1, 4), request.param)
    rnet = Recorder(BranchNet(), input_data=reference, force_static_flow=False)
    rnet.record(*[label for label, row in rnet.table.items() if row.recordable])
    return rnet


def branch_oracle(net: BranchNet, x: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Return ``(name, output)`` of each call of BranchNet's children, in order."""
    calls = []
    if x.sum() > 0:
        x = net.a(x)
        calls.append(("a", x))
    x = net.b(x)
    calls.append(("b", x))
    calls.append(("a", net.a(x)))
    return calls


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(
        st.floats(-10, 10, allow_nan=False, width=32), min_size=8, max_size=8
    )
)
@example(values=[1.0] * 8)
@example(values=[-1.0] * 8)
def test_data_dependent_branch_never_records_wrong_activation(branch_rnet, values):
    """With a dynamic flow the records are right or CallPlanError is raised."""
    x = torch.tensor(values).reshape(2, 4)
    rnet = branch_rnet
    try:
        out = rnet(x)
    except CallPlanError:
        reference_took_branch = len(rnet.table.calls_of(rnet.net.a)) == 2
        assert bool(x.sum() > 0) != reference_took_branch  # only a real mismatch
        assert dict(rnet.activations) == {}
        return
    expected = branch_oracle(rnet.net, x)
    calls = [row for row in rnet.table.rows if row.label[0] == 1]
    assert [row.name for row in calls] == [name for name, _ in expected]
    for row, (_, output) in zip(calls, expected, strict=True):
        torch.testing.assert_close(rnet.activations[row.label], output)
    torch.testing.assert_close(rnet.activations[(0, 1)], out)


@pytest.mark.parametrize(
    ("reference", "sign"), [(1.0, -1.0), (-1.0, 1.0)], ids=["fewer", "more"]
)
def test_data_dependent_branch_other_path_raises(reference, sign):
    """An input taking the other branch than the reference pass raises."""
    rnet = Recorder(
        BranchNet(), input_data=torch.full((1, 4), reference), force_static_flow=False
    )
    rnet.record(*[label for label, row in rnet.table.items() if row.name == "a"])
    with pytest.raises(CallPlanError, match="module `a` "):
        rnet(torch.full((2, 4), sign))


# ------------------------------------------------------------ fused fast path


@pytest.fixture
def encoder_layer() -> nn.TransformerEncoderLayer:
    """A small TransformerEncoderLayer eligible for the fused fast path."""
    return nn.TransformerEncoderLayer(d_model=16, nhead=2, batch_first=True)


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """Count calls of ``torch._transformer_encoder_layer_fwd`` (restored after)."""
    calls: list[int] = []
    fused = torch._transformer_encoder_layer_fwd

    def counting(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", counting)
    return calls


def output_by_hand_hook(module: nn.Module, run) -> object:
    """Return what ``module`` outputs during ``run()``, seen by a plain hook."""
    seen = []
    handle = module.register_forward_hook(lambda m, i, out: seen.append(out))
    try:
        run()
    finally:
        handle.remove()
    assert len(seen) == 1
    return seen[0]


def test_transformer_accepted_by_static_flow_check(encoder_layer):
    """``force_static_flow=True`` accepts a TransformerEncoderLayer.

    fx cannot trace it, but its branches read no tensor value (its fast path
    depends on the mode and on gradients, which the call plan checks), so the
    fake-tensor check of ``scio_recorder._run.flow`` lets it through.
    """
    checked = Recorder(encoder_layer, input_size=(2, 5, 16))
    unchecked = Recorder(encoder_layer, input_size=(2, 5, 16), force_static_flow=False)
    assert str(checked.table) == str(unchecked.table)


@pytest.mark.parametrize("name", ["self_attn", "linear1"])
def test_transformer_submodule_recorded_under_no_grad(encoder_layer, name):
    """Recording a submodule under no_grad in eval gives its output (oracle hook)."""
    rnet = Recorder(encoder_layer, input_size=(2, 5, 16), force_static_flow=False)
    rnet.eval()
    (label,) = [label for label, row in rnet.table.items() if row.name == name]
    module = encoder_layer.get_submodule(name)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        expected = output_by_hand_hook(module, lambda: encoder_layer(x))
        rnet.record(label)
        rnet(x)
    torch.testing.assert_close(rnet.activations[label], expected)


def test_transformer_recording_submodule_disables_fused_path(
    encoder_layer, fused_calls
):
    """Recording ``linear1`` makes the layer run its submodules, not the fused op."""
    rnet = Recorder(encoder_layer, input_size=(2, 5, 16), force_static_flow=False)
    rnet.eval()
    rnet.record((1, 4))
    with torch.no_grad():
        rnet(torch.randn(2, 5, 16))
    assert fused_calls == []
    assert rnet.activations[(1, 4)].shape == (2, 5, 2048)


def test_transformer_recording_nothing_keeps_fused_path(encoder_layer, fused_calls):
    """With nothing recorded the layer still takes the fused fast path."""
    rnet = Recorder(encoder_layer, input_size=(2, 5, 16), force_static_flow=False)
    rnet.eval()
    with torch.no_grad():
        rnet(torch.randn(2, 5, 16))
    assert fused_calls == [1]


def test_transformer_recorded_pass_matches_fused_output(encoder_layer):
    """The output of a recorded (unfused) pass matches the fused output."""
    rnet = Recorder(encoder_layer, input_size=(2, 5, 16), force_static_flow=False)
    rnet.eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        fused = rnet(x)
        rnet.record((1, 1))
        unfused = rnet(x)
    torch.testing.assert_close(unfused, fused, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------ in-place safety


@pytest.fixture
def inplace_rnet() -> Recorder:
    """``Sequential(Linear, ReLU)`` recording the Linear, the ReLU made in-place after.

    The reference pass saw no in-place operation, so the record is not a
    copy: what cannot be known in advance, which the warning is for.
    """
    relu = nn.ReLU()
    rnet = Recorder(nn.Sequential(nn.Linear(4, 4), relu), input_size=X)
    relu.inplace = True
    rnet.record((1, 1))
    return rnet


INPLACE_MATCH = (
    r"1-1 \(Linear `0`\) was modified in place.*`rnet\.record\(\.\.\., clone=True\)`"
)


def test_inplace_modification_warns_once(inplace_rnet, recwarn):
    """A record later modified in place warns once, naming the label and clone=True."""
    x = torch.randn(3, 4)
    for _ in range(3):
        inplace_rnet(x)
    caught = inplace_warnings(recwarn.list)
    assert len(caught) == 1
    assert re.search(INPLACE_MATCH, str(caught[0].message))


def test_inplace_modified_record_shows_the_change(inplace_rnet):
    """Without clone the record is the Linear output as modified by the ReLU."""
    x = torch.randn(3, 4)
    with pytest.warns(InPlaceWarning):
        out = inplace_rnet(x)
    linear = inplace_rnet.net[0]
    torch.testing.assert_close(inplace_rnet.activations[(1, 1)], torch.relu(linear(x)))
    assert inplace_rnet.activations[(1, 1)] is out


def test_inplace_warning_points_at_caller(inplace_rnet):
    """The InPlaceWarning is attributed to the line that called ``rnet(x)``."""
    with pytest.warns(InPlaceWarning) as caught:
        inplace_rnet(torch.randn(3, 4))
    assert caught[0].filename == __file__


def test_clone_record_equals_linear_output(inplace_rnet, recwarn):
    """With ``clone=True`` the record is the exact Linear output and nothing warns."""
    inplace_rnet.record((1, 1), clone=True)
    x = torch.randn(3, 4)
    inplace_rnet(x)
    torch.testing.assert_close(inplace_rnet.activations[(1, 1)], inplace_rnet.net[0](x))
    assert inplace_warnings(recwarn.list) == []


# -- exact by default: the reference pass learns what in-place ops overwrite


def hand_records(net: nn.Module, x: torch.Tensor) -> tuple[dict, dict]:
    """Run ``net(x)`` with hand hooks cloning each call's output and first input.

    Keys are ``(qualified name, k)`` for the k-th call of that module.
    """
    outputs: dict = {}
    inputs: dict = {}
    handles = []
    for name, module in net.named_modules():
        if module is net:
            continue

        def pre(m, args, name=name):
            k = sum(1 for key in inputs if key[0] == name)
            inputs[name, k] = args[0].clone()

        def post(m, args, out, name=name):
            k = sum(1 for key in outputs if key[0] == name)
            outputs[name, k] = out.clone()

        handles += [
            module.register_forward_pre_hook(pre),
            module.register_forward_hook(post),
        ]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for handle in handles:
            handle.remove()
    return outputs, inputs


@pytest.mark.parametrize("reference_tensors", ["real", "fake"])
def test_records_overwritten_in_place_are_exact_by_default(reference_tensors, recwarn):
    """Every output and input record equals a hand hook's clone, bit for bit."""
    net = inplace_blocks()
    rnet = Recorder(net, input_size=(1, 3, 8, 8), reference_tensors=reference_tensors)
    calls = [row for row in rnet.table.values() if row.recordable and row.name]
    rnet.record(*(row.label for row in calls), inputs=[row.label for row in calls])
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        rnet(x)
    outputs, inputs = hand_records(net, x)
    overwritten = 0
    for row in calls:
        key = (row.name, row.call_index)
        assert torch.equal(rnet.activations[row.label], outputs[key]), row.describe()
        assert torch.equal(rnet.inputs[row.label].args[0], inputs[key]), row.describe()
        overwritten += "output" in row.overwritten
    # stem BN, each block's bn1, bn2 and first ReLU call's input (the sum's)
    assert overwritten >= 5
    assert inplace_warnings(recwarn.list) == []


def test_table_names_what_in_place_operations_overwrite():
    """The reference pass's version counters: which outputs and inputs change later."""
    rnet = Recorder(inplace_blocks(), input_size=(1, 3, 8, 8))
    found = {
        (row.name, row.call_index): sorted(row.overwritten)
        for row in rnet.table.values()
        if row.overwritten
    }
    expected = {("1", 0): ["output"], ("2", 0): ["inputs"]}  # the stem's BN, ReLU
    for block in ("3", "4"):
        expected[f"{block}.bn1", 0] = ["output"]  # then ReLU(inplace=True)
        expected[f"{block}.relu", 0] = ["inputs"]
        expected[f"{block}.bn2", 0] = ["output"]  # then `out += identity`
        expected[f"{block}.relu", 1] = ["inputs"]  # the sum, then ReLU again
    assert found == expected


def test_clone_true_changes_no_record_of_an_in_place_net():
    """``clone=True`` gives the same records, bit for bit: the default is exact."""
    net = inplace_blocks()
    rnet = Recorder(net, input_size=(1, 3, 8, 8))
    labels = [row.label for row in rnet.table.values() if row.recordable]
    x = torch.randn(2, 3, 8, 8)
    records = {}
    for clone in (False, True):
        rnet.record(*labels, inputs=labels, clone=clone)
        with torch.no_grad():
            rnet(x)
        records[clone] = (dict(rnet.activations), dict(rnet.inputs))
    for label in labels:
        assert torch.equal(records[False][0][label], records[True][0][label])
        assert torch.equal(
            records[False][1][label].args[0], records[True][1][label].args[0]
        )


def test_no_copy_on_a_net_without_in_place_operations():
    """Without in-place operations each record is the very tensor the layer returned."""
    net = inplace_blocks(inplace=False)
    rnet = Recorder(net, input_size=(1, 3, 8, 8))
    assert not any(row.overwritten for row in rnet.table.values())
    labels = [row.label for row in rnet.table.values() if row.recordable]
    rnet.record(*labels, inputs=labels)
    assert rnet._passes.plan.copied == frozenset()
    assert rnet._passes.plan.copied_inputs == frozenset()
    seen = {}
    bn = net[3].bn2
    handle = bn.register_forward_hook(lambda m, i, out: seen.setdefault("out", out))
    try:
        with torch.no_grad():
            rnet(torch.randn(2, 3, 8, 8))
    finally:
        handle.remove()
    assert rnet.activations[rnet.table.calls_of(bn)[0].label] is seen["out"]


@settings(max_examples=25, deadline=None)
@given(
    layers=st.lists(
        st.sampled_from(["linear", "relu", "relu_", "sigmoid_", "add_"]),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 2**16),
)
def test_records_of_random_in_place_nets_equal_cloning_hooks(layers, seed):
    """Any mix of in-place and out-of-place layers: records equal cloning hooks."""

    class AddOne(nn.Module):
        def forward(self, x):
            return x.add_(1.0)

    class SigmoidInPlace(nn.Module):
        def forward(self, x):
            return x.sigmoid_()

    make = {
        "linear": lambda: nn.Linear(4, 4),
        "relu": nn.ReLU,
        "relu_": lambda: nn.ReLU(inplace=True),
        "sigmoid_": SigmoidInPlace,
        "add_": AddOne,
    }
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 4), *(make[name]() for name in layers))
    rnet = Recorder(net, input_size=X)
    labels = [row.label for row in rnet.table.values() if row.name]
    rnet.record(*labels, inputs=labels)
    x = torch.randn(3, 4)
    with torch.no_grad():
        rnet(x)
    outputs, inputs = hand_records(net, x)
    for label in labels:
        row = rnet.table[label]
        assert torch.equal(rnet.activations[label], outputs[row.name, row.call_index])
        assert torch.equal(rnet.inputs[label].args[0], inputs[row.name, row.call_index])


def test_inplace_postprocessor_changes_record_silently(recwarn):
    """An in-place postprocessor returning None changes the record, with no warning."""
    net = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
    rnet = Recorder(net, input_size=X)
    rnet.record((1, 1))

    def clamp(t: torch.Tensor) -> None:
        t.clamp_(max=0)

    x = torch.randn(3, 4)
    out = rnet(x, activation_postproc=clamp)
    clamped = net[0](x).clamp(max=0)
    torch.testing.assert_close(rnet.activations[(1, 1)], clamped)
    torch.testing.assert_close(out, torch.sigmoid(clamped))
    assert inplace_warnings(recwarn.list) == []


class WritesThroughData(nn.Module):
    """Clamps a recorded output through ``.data``, which torch does not count."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h.data.clamp_(min=0)
        return self.b(h)


def test_a_write_through_data_is_not_warned_and_check_fails_it(recwarn):
    """The documented limit: no InPlaceWarning (no version bump); the check sees it.

    The record is the clamped tensor, not the layer's output, and nothing
    warns (``.data`` has a version counter of its own); the check's
    ``"inplace"`` line compares the records with copies taken as each call
    ends, and fails naming the layer.
    """
    torch.manual_seed(0)
    net = WritesThroughData()
    rnet = Recorder(net, input_size=X)
    rnet.record("a")
    x = torch.randn(6, 4)
    with torch.no_grad():
        rnet(x)
        true = net.a(x)
    assert float(true.min()) < 0  # so that the clamp changed the record
    assert torch.equal(rnet.activations_of("a")[0], true.clamp(min=0))
    assert inplace_warnings(recwarn.list) == []
    line = rnet.check(x)["inplace"]
    assert line.status == "FAIL"
    assert line.where == "1-1 (Linear `a`)"
    clone = Recorder(net, input_size=X)
    clone.record("a", clone=True)  # the documented fix: exact whatever writes
    with torch.no_grad():
        clone(x)
    assert torch.equal(clone.activations_of("a")[0], true)


def capture_output(rnet: Recorder, x: torch.Tensor) -> torch.Tensor:
    """Run ``rnet(x)`` and return the very tensor its one recorded layer output."""
    seen = []
    rnet(x, activation_postproc=seen.append)
    (output,) = seen
    return output


@pytest.fixture
def plain_rnet() -> Recorder:
    """``Sequential(Linear, Tanh)`` recording the Linear."""
    rnet = Recorder(nn.Sequential(nn.Linear(4, 4), nn.Tanh()), input_size=X)
    rnet.record((1, 1))
    return rnet


def test_default_record_is_the_output_tensor(plain_rnet):
    """By default the record is the very output tensor, graph attached."""
    output = capture_output(plain_rnet, torch.randn(3, 4))
    record = plain_rnet.activations[(1, 1)]
    assert record is output
    assert record.grad_fn is not None


def test_detach_record_does_not_require_grad(plain_rnet):
    """``detach=True`` records tensors that do not require grad."""
    plain_rnet.record((1, 1), detach=True)
    output = capture_output(plain_rnet, torch.randn(3, 4))
    record = plain_rnet.activations[(1, 1)]
    assert output.requires_grad
    assert not record.requires_grad
    assert record.grad_fn is None


def test_detach_record_shares_storage(plain_rnet):
    """``detach=True`` records share the storage of the output (no copy)."""
    plain_rnet.record((1, 1), detach=True)
    output = capture_output(plain_rnet, torch.randn(3, 4))
    record = plain_rnet.activations[(1, 1)]
    assert record.untyped_storage().data_ptr() == output.untyped_storage().data_ptr()


def test_dtype_converts_record(plain_rnet):
    """``dtype=torch.float64`` records the output cast to float64."""
    plain_rnet.record((1, 1), dtype=torch.float64)
    x = torch.randn(3, 4)
    plain_rnet(x)
    record = plain_rnet.activations[(1, 1)]
    assert record.dtype == torch.float64
    torch.testing.assert_close(record, plain_rnet.net[0](x).double())


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_device_moves_record(plain_rnet, device):
    """``device=...`` records the output on that device."""
    plain_rnet.record((1, 1), device=device)
    x = torch.randn(3, 4)
    plain_rnet(x)
    record = plain_rnet.activations[(1, 1)]
    assert record.device == torch.device(device)
    assert record.shape == (3, 4)
    if device == "cpu":
        torch.testing.assert_close(record, plain_rnet.net[0](x))


# ------------------------------------------------------------ postprocessor order


def test_postprocessor_list_consumed_in_hook_order():
    """A postprocessor list is consumed children first, then their container."""
    net = nn.Sequential(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=X)
    rnet.record((1, 1), (2, 1), (2, 2), (1, 2))
    seen: list[tuple[int, torch.Tensor]] = []
    postprocs = [lambda t, k=k: seen.append((k, t)) for k in range(4)]
    rnet(torch.randn(3, 4), activation_postproc=postprocs)
    order = [(2, 1), (2, 2), (1, 1), (1, 2)]
    assert list(rnet.activations) == order
    assert [k for k, _ in seen] == [0, 1, 2, 3]
    assert all(
        t is rnet.activations[label] for (_, t), label in zip(seen, order, strict=True)
    )


# ----------------------------------------------------- records of nested values
@dataclasses.dataclass(frozen=True)
class Features:
    hidden: torch.Tensor
    extra: list[torch.Tensor]


class ReadsFeatures(nn.Module):
    def forward(self, features: Features) -> torch.Tensor:
        return features.hidden + features.extra[0]


class NestedNet(nn.Module):
    """Passes a frozen dataclass to one layer, returns a ModelOutput from another.

    (torchinfo's reference pass refuses dataclass *outputs* other than
    mappings, so a plain dataclass appears as an argument here.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.read = ReadsFeatures()
        self.head = HeadOut()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        self.features = Features(h, [h * 2])  # the test edits them in place
        self.out = self.head(self.read(self.features))
        return self.out.last_hidden_state


class HeadOut(nn.Module):
    def forward(self, x: torch.Tensor) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=x * 3, hidden_states=(x * 4,))


def test_clone_copies_tensors_inside_dataclasses_and_model_outputs():
    """`clone=True` copies the tensors of dataclass and ModelOutput records."""
    net = NestedNet()
    rnet = Recorder(net, input_size=(2, 3))
    rnet.record("head", inputs="read", clone=True, detach=True, dtype=torch.float64)
    rnet(torch.randn(2, 3))
    (label,) = rnet.inputs
    (arg,) = rnet.inputs[label].args
    out = rnet.activations[next(iter(rnet.activations))]
    assert type(arg) is Features
    assert type(out) is BaseModelOutput
    assert out["last_hidden_state"] is out.last_hidden_state  # item and field agree
    pairs = [
        (net.features.hidden, arg.hidden),
        (net.features.extra[0], arg.extra[0]),
        (net.out.last_hidden_state, out.last_hidden_state),
        (net.out.hidden_states[0], out.hidden_states[0]),
    ]
    kept = [original.detach().clone() for original, _ in pairs]
    with torch.no_grad():
        for original, _ in pairs:
            original.add_(100.0)
    for (_, record), before in zip(pairs, kept, strict=True):
        # Converted from the very same tensors: equal to the bit.
        assert record.dtype == torch.float64
        assert not record.requires_grad
        assert torch.equal(record, before.double())


# ------------------------------------------------------- saving a recorded net
def _torch_save_load(net: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    loaded: nn.Module = torch.load(buffer, weights_only=False)
    return loaded


def _pickle_copy(net: nn.Module) -> nn.Module:
    copied: nn.Module = pickle.loads(pickle.dumps(net))  # noqa: S301 (our own bytes)
    return copied


def _hook_count(net: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in net.modules())


@pytest.mark.parametrize(
    "copier",
    [copy.deepcopy, _pickle_copy, _torch_save_load],
    ids=["deepcopy", "pickle", "torch.save"],
)
def test_a_recorded_net_can_be_saved_and_its_copy_is_a_plain_net(copier):
    """Saving or copying the user's net works while layers are recorded.

    The copy computes the same outputs, records into no recorder, and drops
    the copied hooks on its first pass; the recorder keeps recording.
    """
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 1), inputs=(1, 3), grads=(1, 2))
    assert _hook_count(net) == 3
    copied = copier(net)
    x = torch.randn(5, 3, requires_grad=True)
    out = rnet(x)
    out.sum().backward()
    before = rnet.activations[(1, 1)], rnet.inputs[(1, 3)].args[0]
    grads = rnet.gradients[(1, 2)]

    out_copy = copied(x)
    out_copy.sum().backward()
    # The same weights, the same ops: equal to the bit.
    assert torch.equal(out_copy, out)
    assert _hook_count(copied) == 0  # dropped on the first pass
    # The copy's pass recorded nothing into the recorder.
    assert rnet.activations[(1, 1)] is before[0]
    assert rnet.inputs[(1, 3)].args[0] is before[1]
    assert rnet.gradients[(1, 2)] is grads

    # The recorder still records, with its hooks on the original net only.
    assert _hook_count(net) == 3
    x2 = torch.randn(2, 3, requires_grad=True)
    rnet(x2).sum().backward()
    with torch.no_grad():
        assert torch.equal(rnet.activations[(1, 1)], net[0](x2))
    assert rnet.gradients[(1, 2)].shape == (2, 4)
    assert rnet.inputs[(1, 3)].args[0].shape == (2, 4)


def test_a_new_recorder_of_a_copied_net_drops_the_copied_hooks():
    """Wrapping a net copied while recorded puts only the new recorder's hooks."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    first = Recorder(net, input_size=(1, 3))
    first.record((1, 1), (1, 2))
    copied = _pickle_copy(net)
    assert _hook_count(copied) == 2
    rnet = Recorder(copied, input_size=(1, 3))
    assert _hook_count(copied) == 0
    rnet.record((1, 2))
    rnet(torch.randn(2, 3))
    assert list(rnet.activations) == [(1, 2)]
