"""The `Recorder` contract: the reference ``scio`` Recorder's behaviour, plus ours.

Activations are checked against :func:`toy_oracle`, which re-applies the toy
net's layers by hand with functional ops (so no hook can fire in the oracle).
"""

from __future__ import annotations

import gc
import re
import threading
import types
import warnings
import weakref
from types import MappingProxyType

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
import torchinfo
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchinfo.model_statistics import ModelStatistics

import scio_recorder
from scio_recorder import InPlaceWarning, Recorder

TOY_INPUT_SIZE = (1, 5)


def toy_oracle(net, x, edit=None, edited=()):
    """Return ``{label: output}`` of the toy net computed layer by layer.

    ``edit`` (if given) is applied to the output of each label in ``edited``
    before the computation goes on, as a postprocessor would be.
    """

    def step(label, value):
        outputs[label] = value
        return edit(value) if edit is not None and label in edited else value

    outputs = {}
    h = step((1, 1), F.linear(x, net[0].weight, net[0].bias))
    h = step((1, 2), torch.relu(h))
    h = step((1, 3), F.linear(h, net[2].weight, net[2].bias))
    h = step((1, 4), torch.relu(h))
    outputs[(0, 1)] = h
    outputs["out"] = step((0, 1), h)
    return outputs


def hook_counts(net):
    """Return the number of forward hooks on each module of ``net``."""
    return [len(module._forward_hooks) for module in net.modules()]


@pytest.fixture
def rnet(toynet):
    """The toy net wrapped, recording nothing."""
    return Recorder(toynet, input_size=TOY_INPUT_SIZE)


@pytest.fixture
def x():
    """A batch of 3 inputs for the toy net."""
    return torch.rand(3, 5)


class DataDependent(nn.Module):
    """A net whose control flow depends on the values of its input."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.linear(x)
        return -x


class Scaled(nn.Module):
    """A net with a keyword argument."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x, *, scale=1.0):
        return self.linear(x) * scale


class Fragile(nn.Module):
    """A net that raises between its two layers when ``fail`` is set."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.second = nn.Linear(3, 3)
        self.fail = False

    def forward(self, x):
        h = self.first(x)
        if self.fail:
            msg = "boom"
            raise RuntimeError(msg)
        return self.second(h)


class Outer(nn.Module):
    """A net with a `Recorder` as a submodule."""

    def __init__(self, inner):
        super().__init__()
        self.pre = nn.Linear(5, 5)
        self.inner = inner
        self.post = nn.Linear(3, 2)

    def forward(self, x):
        return self.post(self.inner(self.pre(x)))


# -- construction -------------------------------------------------------------


def test_recorder_wraps_the_net(toynet):
    """`Recorder(net, input_size=...)` is a module whose `net` is the given net."""
    rnet = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    assert isinstance(rnet, nn.Module)
    assert rnet.net is toynet


def test_net_is_registered_as_submodule_named_net(rnet, toynet):
    """The wrapped net is the submodule `_net`, as in the reference."""
    assert dict(rnet.named_children()) == {"_net": toynet}


def test_missing_input_size_and_data_raises(toynet):
    """Without `input_data` or `input_size` the constructor raises ValueError."""
    msg = "You must provide `input_data` or `input_size`"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        Recorder(toynet)


def test_input_data_is_accepted_instead_of_input_size(toynet):
    """`input_data` is enough to build the table."""
    rnet = Recorder(toynet, input_data=torch.rand(2, 5))
    assert list(rnet.table) == [(0, 1), (1, 1), (1, 2), (1, 3), (1, 4)]


def test_static_flow_check_refuses_data_dependent_net():
    """`force_static_flow=True` (default) refuses data-dependent control flow."""
    with pytest.raises(RuntimeError, match=re.escape("`force_static_flow=False`")):
        Recorder(DataDependent(), input_size=(1, 3))


def test_static_flow_error_is_chained_from_the_fx_error():
    """The refusal is raised `from` the `torch.fx` tracing error."""
    with pytest.raises(RuntimeError) as excinfo:
        Recorder(DataDependent(), input_size=(1, 3))
    assert isinstance(excinfo.value.__cause__, torch.fx.proxy.TraceError)


def test_static_flow_check_can_be_disabled():
    """With `force_static_flow=False` a data-dependent net is wrapped and runs."""
    net = DataDependent()
    rnet = Recorder(net, input_size=(1, 3), force_static_flow=False)
    rnet.record((1, 1))
    x = torch.rand(2, 3)
    assert torch.equal(rnet(x), net(x))


def test_static_flow_check_passes_over_a_recording_recorder_inside_the_net():
    """`torch.fx` sees an inner recorder with a selection as one leaf call.

    The tracer patches `nn.Module.__call__`; the recorder's own `__call__`
    must go through the patched one, not run a recording pass on proxies.
    """
    inner = Recorder(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), input_size=(1, 3))
    inner.record((1, 1))
    outer = Recorder(nn.Sequential(inner, nn.Linear(3, 2)), input_size=(1, 3))
    outer.record((1, 2))
    x = torch.rand(2, 3)
    assert torch.equal(outer(x), outer.net(x))
    assert list(inner.activations) == [(1, 1)]


def test_recorded_layer_left_uncalled_raises_runtime_error():
    """A pass that skips a recorded layer raises the reference's "Missing" error."""
    rnet = Recorder(DataDependent(), input_size=(1, 3), force_static_flow=False)
    rnet.record((1, 1))
    with pytest.raises(
        RuntimeError, match=f"^{re.escape('Missing [(1, 1)] activations.')}"
    ):
        rnet(-torch.rand(2, 3))


def test_recorded_layer_left_uncalled_keeps_no_activations():
    """After a pass that skipped a recorded layer `activations` is empty."""
    rnet = Recorder(DataDependent(), input_size=(1, 3), force_static_flow=False)
    rnet.record((1, 1))
    rnet(torch.rand(2, 3))
    with pytest.raises(RuntimeError, match=r"^Missing"):
        rnet(-torch.rand(2, 3))
    assert dict(rnet.activations) == {}


# -- repr ---------------------------------------------------------------------


def test_repr_starts_with_header(rnet):
    """`repr(rnet)` starts with the reference's header line."""
    assert repr(rnet).startswith("Recorder instance for the following network\n")


def test_repr_contains_labelled_torchinfo_table(rnet):
    """`repr(rnet)` contains the torchinfo table, with `depth-idx` labels."""
    text = repr(rnet)
    assert repr(rnet.summary) in text
    assert "├─Linear (2): 1-3 " in text


def test_repr_says_nothing_is_recorded_by_default(rnet):
    """A fresh recorder reports `Currently recording: None`."""
    assert repr(rnet).splitlines()[-2] == "Currently recording: None"


def test_repr_lists_recorded_labels(rnet):
    """After `record((0, 1), (1, 3))` the repr reports `0-1, 1-3`."""
    rnet.record((1, 3), (0, 1))
    assert repr(rnet).splitlines()[-2] == "Currently recording: 0-1, 1-3"


def test_repr_ends_with_rule_of_table_width(rnet):
    """The last line is a rule of `=` as wide as the table."""
    lines = repr(rnet).splitlines()
    width = len(lines[1])
    assert lines[1] == "=" * width
    assert lines[-1] == "=" * width


def test_repr_of_toy_net_matches_golden_file(rnet, expected):
    """The full repr of the toy net is exactly the reference's documented one."""
    expected("toynet_repr.txt", repr(rnet))


# -- the documented example ----------------------------------------------------


def test_activations_is_a_read_only_mapping(rnet, x):
    """`activations` is a `types.MappingProxyType`."""
    rnet.record((0, 1), (1, 3))
    rnet(x)
    assert isinstance(rnet.activations, MappingProxyType)


def test_activations_are_keyed_in_hook_firing_order(rnet, x):
    """Keys follow the order outputs are produced: `(1, 3)` before `(0, 1)`."""
    rnet.record((0, 1), (1, 3))
    rnet(x)
    assert list(rnet.activations) == [(1, 3), (0, 1)]


def test_activations_equal_manual_computation(rnet, toynet, x):
    """Each record equals the output of its layer computed by hand."""
    rnet.record((0, 1), (1, 3))
    rnet(x)
    oracle = toy_oracle(toynet, x)
    torch.testing.assert_close(rnet.activations[(1, 3)], oracle[(1, 3)])
    torch.testing.assert_close(rnet.activations[(0, 1)], oracle[(0, 1)])


def test_every_label_records_its_own_layer_output(rnet, toynet, x):
    """Recording every label gives each layer's own output."""
    rnet.record(*rnet.table)
    rnet(x)
    oracle = toy_oracle(toynet, x)
    assert set(rnet.activations) == set(rnet.table)
    for label, value in rnet.activations.items():
        torch.testing.assert_close(value, oracle[label])


def test_whole_net_record_is_the_returned_tensor(rnet, x):
    """`activations[(0, 1)]` is the very tensor the pass returns."""
    rnet.record((0, 1), (1, 3))
    out = rnet(x)
    assert rnet.activations[(0, 1)] is out


def test_activations_are_empty_before_any_pass(rnet):
    """A recorder that has not run yet has no activations."""
    rnet.record((0, 1))
    assert dict(rnet.activations) == {}


def test_each_pass_replaces_the_previous_records(rnet, toynet):
    """A second pass's activations are those of its own input."""
    rnet.record((1, 3))
    rnet(torch.rand(3, 5))
    second = torch.rand(3, 5)
    rnet(second)
    torch.testing.assert_close(
        rnet.activations[(1, 3)], toy_oracle(toynet, second)[(1, 3)]
    )


def test_each_call_of_a_shared_module_is_recorded_under_its_label():
    """A module called twice records each call under its own label."""
    relu = nn.ReLU()
    net = nn.Sequential(nn.Linear(5, 4), relu, nn.Linear(4, 3), relu)
    rnet = Recorder(net, input_size=TOY_INPUT_SIZE)
    rnet.record((1, 2), (1, 4))
    x = torch.rand(3, 5)
    rnet(x)
    oracle = toy_oracle(net, x)
    torch.testing.assert_close(rnet.activations[(1, 2)], oracle[(1, 2)])
    torch.testing.assert_close(rnet.activations[(1, 4)], oracle[(1, 4)])


# -- record -----------------------------------------------------------------------


def test_recording_is_sorted_without_duplicates(rnet):
    """`recording` is the sorted tuple of the selection, duplicates dropped."""
    rnet.record((1, 3), (0, 1), (1, 3), (1, 1))
    assert rnet.recording == ((0, 1), (1, 1), (1, 3))


def test_recording_is_empty_by_default(rnet):
    """A fresh recorder records nothing."""
    assert rnet.recording == ()


def test_record_replaces_previous_selection(rnet):
    """`record` sets the selection; it does not add to it."""
    rnet.record((1, 1))
    rnet.record((1, 3))
    assert rnet.recording == ((1, 3),)


def test_record_unknown_label_raises(rnet):
    """An unknown label raises ValueError naming it."""
    msg = "Following layers not found: {(1, 0)}. Operation cancelled"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record((1, 0))


def test_record_names_only_the_unknown_labels(rnet):
    """With known and unknown labels mixed, only the unknown ones are named."""
    msg = "Following layers not found: {(2, 1)}. Operation cancelled"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record((1, 3), (2, 1))


def test_failed_record_keeps_previous_selection(rnet, toynet, x):
    """After a failed `record`, the previous selection still records."""
    rnet.record((1, 3))
    with pytest.raises(ValueError, match=r"^Following layers not found"):
        rnet.record((0, 1), (1, 0))
    assert rnet.recording == ((1, 3),)
    rnet(x)
    assert list(rnet.activations) == [(1, 3)]


def test_failed_record_keeps_hooks_in_place(rnet, toynet):
    """After a failed `record`, the hooks are those of the previous selection."""
    rnet.record((1, 3))
    before = hook_counts(toynet)
    with pytest.raises(ValueError, match=r"^Following layers not found"):
        rnet.record((1, 1), (1, 0))
    assert hook_counts(toynet) == before


def test_record_with_two_ints_hints_at_a_tuple(rnet):
    """`record(1, 3)` suggests `rnet.record((1, 3))`."""
    msg = (
        "Following layers not found: {1, 3}. "
        "Did you mean `rnet.record((1, 3))`? Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(1, 3)


def test_record_accepts_numpy_integer_labels(rnet):
    """Labels made of numpy integers select the layer, as in the reference."""
    rnet.record((np.int64(1), np.int64(3)))
    assert rnet.recording == ((1, 3),)


def test_record_nothing_gives_empty_activations(rnet, x):
    """`record()` records nothing: a pass leaves `activations` empty."""
    rnet.record((1, 3))
    rnet.record()
    rnet(x)
    assert rnet.recording == ()
    assert dict(rnet.activations) == {}


# -- the pass -------------------------------------------------------------------------

SELECTIONS = [(), ((0, 1),), ((0, 1), (1, 3)), ((1, 1), (1, 2), (1, 3), (1, 4))]


@pytest.mark.parametrize("labels", SELECTIONS, ids=str)
def test_call_returns_exactly_the_net_output(rnet, toynet, x, labels):
    """`rnet(x)` is bitwise `net(x)` whatever is recorded."""
    rnet.record(*labels)
    assert torch.equal(rnet(x), toynet(x))


@pytest.mark.parametrize("labels", SELECTIONS, ids=str)
def test_backward_gives_the_net_gradients(toynet, x, labels):
    """`rnet(x).sum().backward()` gives the parameter grads of `net(x)`."""
    toynet(x).sum().backward()
    expected = [param.grad.clone() for param in toynet.parameters()]
    toynet.zero_grad()
    rnet = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    rnet.record(*labels)
    rnet(x).sum().backward()
    for param, grad in zip(toynet.parameters(), expected, strict=True):
        torch.testing.assert_close(param.grad, grad)


def test_keyword_arguments_reach_the_net():
    """Keyword arguments other than the recorder's own are passed to the net."""
    net = Scaled()
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 1))
    x = torch.rand(2, 3)
    out = rnet(x, scale=3.0, activation_postproc=lambda _: None)
    torch.testing.assert_close(out, net(x, scale=3.0))
    assert not torch.allclose(out, net(x))


# -- activation_postproc -------------------------------------------------------------


def clamp(tensor):
    """Postprocessor used in several tests."""
    return tensor.clamp(min=0.1, max=0.2)


def test_single_postproc_edits_every_recorded_output(rnet, toynet, x):
    """One callable is applied to every recorded output; its result goes on."""
    rnet.record((0, 1), (1, 3))
    out = rnet(x, activation_postproc=clamp)
    oracle = toy_oracle(toynet, x, edit=clamp, edited={(1, 3), (0, 1)})
    torch.testing.assert_close(out, oracle["out"])


def test_postproc_runs_after_recording(rnet, toynet, x):
    """Records hold the outputs before the postprocessor's replacement."""
    rnet.record((0, 1), (1, 3))
    rnet(x, activation_postproc=clamp)
    oracle = toy_oracle(toynet, x, edit=clamp, edited={(1, 3), (0, 1)})
    torch.testing.assert_close(rnet.activations[(1, 3)], oracle[(1, 3)])
    torch.testing.assert_close(rnet.activations[(0, 1)], oracle[(0, 1)])


def test_postproc_returning_none_keeps_the_output(rnet, toynet, x):
    """A postprocessor returning None leaves the output unchanged."""
    rnet.record((0, 1), (1, 3))
    seen = []
    out = rnet(x, activation_postproc=seen.append)
    assert len(seen) == 2
    assert torch.equal(out, toynet(x))


def test_postproc_receives_the_recorded_tensor(rnet, x):
    """The postprocessor gets the very tensor that is recorded."""
    rnet.record((1, 3))
    seen = []
    rnet(x, activation_postproc=seen.append)
    assert seen[0] is rnet.activations[(1, 3)]


def test_in_place_postproc_edit_shows_in_the_record(rnet, toynet, x):
    """Documented: an in-place edit by a postprocessor also changes the record."""

    def double_in_place(tensor):
        tensor.mul_(2)

    rnet.record((1, 3))
    with torch.no_grad():
        out = rnet(x, activation_postproc=double_in_place)
    oracle = toy_oracle(toynet, x, edit=lambda t: 2 * t, edited={(1, 3)})
    torch.testing.assert_close(rnet.activations[(1, 3)], 2 * oracle[(1, 3)])
    torch.testing.assert_close(out, oracle["out"])


def test_in_place_postproc_on_aliased_outputs_does_not_warn(rnet, toynet, x):
    """An in-place postprocessor edit is documented behaviour: no InPlaceWarning."""

    def clamp_in_place(tensor):
        tensor.clamp_(max=0.1)

    rnet.record((1, 4), (0, 1))  # the Sequential returns the last ReLU's output
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", InPlaceWarning)
        out = rnet(x, activation_postproc=clamp_in_place)
    expected = toy_oracle(toynet, x)[(1, 4)].clamp(max=0.1)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(rnet.activations[(1, 4)], expected)


def test_postproc_list_is_consumed_in_hook_firing_order(rnet, toynet, x):
    """List items go one per recorded call: `(1, 3)` first, container `(0, 1)` last."""

    def add_one(tensor):
        return tensor + 1

    def times_ten(tensor):
        return tensor * 10

    rnet.record((0, 1), (1, 3))
    out = rnet(x, activation_postproc=[add_one, times_ten])
    h = toy_oracle(toynet, x, edit=add_one, edited={(1, 3)})[(0, 1)]
    torch.testing.assert_close(out, h * 10)


def test_postproc_list_extra_items_are_ignored(rnet, toynet, x):
    """Items beyond the number of recorded calls are never called."""

    def never(_tensor):
        pytest.fail("an extra postprocessor was called")

    rnet.record((1, 3))
    out = rnet(x, activation_postproc=[clamp, never, never])
    oracle = toy_oracle(toynet, x, edit=clamp, edited={(1, 3)})
    torch.testing.assert_close(out, oracle["out"])


def test_postproc_list_restarts_at_each_pass(rnet, toynet, x):
    """Each pass consumes the list from its first item."""
    rnet.record((1, 3))
    funcs = [clamp]
    rnet(x, activation_postproc=funcs)
    out = rnet(x, activation_postproc=funcs)
    oracle = toy_oracle(toynet, x, edit=clamp, edited={(1, 3)})
    torch.testing.assert_close(out, oracle["out"])


def test_postproc_list_too_short_raises(rnet, x):
    """Fewer items than recorded calls raises ValueError."""
    rnet.record((0, 1), (1, 3))
    with pytest.raises(
        ValueError, match=r"^There were not enough postprocessing functions"
    ):
        rnet(x, activation_postproc=[clamp])


def test_postproc_list_too_short_keeps_no_activations(rnet, x):
    """A pass that ran out of postprocessors leaves `activations` empty."""
    rnet.record((0, 1), (1, 3))
    rnet(x)
    with pytest.raises(ValueError, match=r"^There were not enough"):
        rnet(x, activation_postproc=[clamp])
    assert dict(rnet.activations) == {}


def test_postproc_list_is_not_modified(rnet, x):
    """The caller's list is left as it was."""
    rnet.record((0, 1), (1, 3))
    funcs = [clamp, clamp, clamp]
    before = list(funcs)
    rnet(x, activation_postproc=funcs)
    assert funcs == before


def test_dont_record_records_nothing(rnet, x):
    """With `dont_record=True` `activations` is empty after the pass."""
    rnet.record((0, 1), (1, 3))
    rnet(x)
    rnet(x, dont_record=True)
    assert dict(rnet.activations) == {}


def test_dont_record_still_postprocesses(rnet, toynet, x):
    """With `dont_record=True` the postprocessors still edit the outputs."""
    rnet.record((0, 1), (1, 3))
    out = rnet(x, activation_postproc=clamp, dont_record=True)
    oracle = toy_oracle(toynet, x, edit=clamp, edited={(1, 3), (0, 1)})
    torch.testing.assert_close(out, oracle["out"])


# -- failures during a pass -------------------------------------------------------


@pytest.fixture
def fragile():
    """A `Fragile` net and its recorder, recording both layers."""
    net = Fragile()
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 1), (1, 2))
    return net, rnet


def test_failed_pass_keeps_no_activations(fragile):
    """A pass where the net raises leaves `activations` empty (no partial record)."""
    net, rnet = fragile
    rnet(torch.rand(2, 3))
    net.fail = True
    with pytest.raises(RuntimeError, match=r"^boom$"):
        rnet(torch.rand(2, 3))
    assert dict(rnet.activations) == {}


def test_pass_after_failed_pass_records(fragile):
    """After a failed pass the next pass records correctly."""
    net, rnet = fragile
    net.fail = True
    with pytest.raises(RuntimeError, match=r"^boom$"):
        rnet(torch.rand(2, 3))
    net.fail = False
    x = torch.rand(2, 3)
    out = rnet(x)
    first = F.linear(x, net.first.weight, net.first.bias)
    assert list(rnet.activations) == [(1, 1), (1, 2)]
    torch.testing.assert_close(rnet.activations[(1, 1)], first)
    assert rnet.activations[(1, 2)] is out


def test_failed_pass_keeps_hooks(fragile):
    """An exception inside the net leaves the hooks as they were."""
    net, rnet = fragile
    before = hook_counts(net)
    net.fail = True
    with pytest.raises(RuntimeError, match=r"^boom$"):
        rnet(torch.rand(2, 3))
    assert hook_counts(net) == before


def test_keyboard_interrupt_in_postproc_keeps_hooks_and_no_activations(rnet, toynet, x):
    """A KeyboardInterrupt from a postprocessor leaves hooks and no activations."""

    def interrupt(_tensor):
        raise KeyboardInterrupt

    rnet.record((0, 1), (1, 3))
    rnet(x)
    before = hook_counts(toynet)
    with pytest.raises(KeyboardInterrupt):
        rnet(x, activation_postproc=interrupt)
    assert hook_counts(toynet) == before
    assert dict(rnet.activations) == {}


# -- views ------------------------------------------------------------------------


def test_recorded_modules_maps_labels_to_modules(rnet, toynet):
    """`recorded_modules` maps each recorded label to its module object."""
    rnet.record((1, 3), (0, 1))
    modules = rnet.recorded_modules
    assert list(modules) == [(0, 1), (1, 3)]
    assert modules[(0, 1)] is toynet
    assert modules[(1, 3)] is toynet[2]


def test_recorded_params_are_those_of_recorded_modules(rnet, toynet):
    """`recorded_params` holds only recorded modules' parameters, `_net.`-prefixed."""
    rnet.record((1, 2), (1, 3))
    params = rnet.recorded_params
    assert list(params) == ["_net.2.weight", "_net.2.bias"]
    assert params["_net.2.weight"] is toynet[2].weight
    assert params["_net.2.bias"] is toynet[2].bias


def test_recorded_params_of_whole_net_are_all_params(rnet, toynet):
    """Recording `(0, 1)` makes every parameter a recorded one."""
    rnet.record((0, 1))
    assert list(rnet.recorded_params) == [
        "_net.0.weight",
        "_net.0.bias",
        "_net.2.weight",
        "_net.2.bias",
    ]


def test_state_dict_is_the_net_state_dict_under_net_prefix(rnet, toynet):
    """`rnet.state_dict()` holds exactly the net's entries, prefixed `_net.`."""
    assert list(rnet.state_dict()) == [f"_net.{key}" for key in toynet.state_dict()]


def test_summary_is_torchinfo_statistics_shown_in_repr(rnet):
    """`summary` is a torchinfo `ModelStatistics` whose repr is in `repr(rnet)`."""
    assert isinstance(rnet.summary, ModelStatistics)
    assert repr(rnet.summary) in repr(rnet)


def test_table_is_built_in_eval_mode_by_default(rnet):
    """By default the table's reference pass runs in eval mode, without grad."""
    assert rnet.table.mode == "eval"
    assert rnet.table.grad_enabled is False


def test_table_can_be_built_in_train_mode(toynet):
    """`Recorder(..., mode="train")` builds the table in train mode, without grad."""
    rnet = Recorder(toynet, input_size=TOY_INPUT_SIZE, mode="train")
    assert rnet.table.mode == "train"
    assert rnet.table.grad_enabled is False


# -- several recorders ----------------------------------------------------------------


def test_two_recorders_each_see_only_their_labels(toynet, x):
    """Two recorders on one net with different selections never mix records."""
    first = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    second = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    first.record((1, 1))
    second.record((0, 1), (1, 3))
    first(x)
    assert list(first.activations) == [(1, 1)]
    assert dict(second.activations) == {}
    second(x)
    assert list(first.activations) == [(1, 1)]
    assert list(second.activations) == [(1, 3), (0, 1)]


def test_two_recorders_with_one_label_record_their_own_inputs(toynet):
    """Two recorders of the same label each keep the output of their own pass."""
    first = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    second = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    first.record((1, 3))
    second.record((1, 3))
    x1, x2 = torch.rand(3, 5), torch.rand(3, 5)
    first(x1)
    second(x2)
    torch.testing.assert_close(
        first.activations[(1, 3)], toy_oracle(toynet, x1)[(1, 3)]
    )
    torch.testing.assert_close(
        second.activations[(1, 3)], toy_oracle(toynet, x2)[(1, 3)]
    )


def test_calling_the_net_directly_records_nothing(toynet, x):
    """Calling the wrapped net itself leaves every recorder's activations alone."""
    first = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    second = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    first.record((1, 3))
    second.record((0, 1))
    first(x)
    kept = first.activations[(1, 3)]
    toynet(torch.rand(3, 5))
    assert list(first.activations) == [(1, 3)]
    assert first.activations[(1, 3)] is kept
    assert dict(second.activations) == {}


def test_nested_recorders_both_record_in_one_call(toynet):
    """A recorder inside a net wrapped by another recorder: both record."""
    inner = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    inner.record((1, 3))
    outer_net = Outer(inner)
    outer = Recorder(outer_net, input_size=TOY_INPUT_SIZE, force_static_flow=False)
    assert outer.table[(3, 3)].module is toynet[2]
    outer.record((3, 3), (1, 2))
    x = torch.rand(3, 5)
    out = outer(x)
    pre = F.linear(x, outer_net.pre.weight, outer_net.pre.bias)
    oracle = toy_oracle(toynet, pre)
    torch.testing.assert_close(inner.activations[(1, 3)], oracle[(1, 3)])
    torch.testing.assert_close(outer.activations[(3, 3)], oracle[(1, 3)])
    torch.testing.assert_close(outer.activations[(1, 2)], oracle[(0, 1)])
    torch.testing.assert_close(
        out, F.linear(oracle[(0, 1)], outer_net.post.weight, outer_net.post.bias)
    )


# -- hooks and life cycle -------------------------------------------------------------


def test_no_hook_while_nothing_is_recorded(rnet, toynet):
    """A recorder that records nothing puts no hook on the net."""
    assert hook_counts(toynet) == [0, 0, 0, 0, 0]


def test_hooks_only_on_modules_with_a_selected_call(rnet, toynet):
    """Exactly the modules of recorded labels carry one hook each."""
    rnet.record((0, 1), (1, 3))
    assert hook_counts(toynet) == [1, 0, 0, 1, 0]
    assert rnet.hooked_modules == (toynet, toynet[2])


def test_record_moves_the_hooks(rnet, toynet):
    """A new selection moves the hooks to its modules."""
    rnet.record((0, 1), (1, 3))
    rnet.record((1, 1))
    assert hook_counts(toynet) == [0, 1, 0, 0, 0]


def test_module_called_twice_carries_one_hook():
    """A module with two recorded calls carries a single hook."""
    relu = nn.ReLU()
    net = nn.Sequential(nn.Linear(5, 4), relu, nn.Linear(4, 3), relu)
    rnet = Recorder(net, input_size=TOY_INPUT_SIZE)
    rnet.record((1, 2), (1, 4))
    assert len(relu._forward_hooks) == 1


def test_deleting_the_recorder_removes_its_hooks():
    """`del rnet; gc.collect()` leaves no forward hook on any module of the net."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU())
    rnet = Recorder(net, input_size=TOY_INPUT_SIZE)
    rnet.record(*rnet.table)
    rnet(torch.rand(3, 5))
    del rnet
    gc.collect()
    assert hook_counts(net) == [0, 0, 0, 0, 0]


@pytest.mark.slow
def test_net_is_collected_after_recorder_and_net_are_deleted():
    """Nothing (torchinfo's cache included) keeps the net alive after `del`."""
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU())
    rnet = Recorder(net, input_size=TOY_INPUT_SIZE)
    rnet.record((0, 1), (1, 3))
    rnet(torch.rand(3, 5))
    ref = weakref.ref(net)
    del rnet
    gc.collect()
    del net
    gc.collect()
    assert ref() is None


def test_torchinfo_cache_does_not_hold_the_net(toynet):
    """torchinfo's global forward-pass cache holds no row of the wrapped net."""
    Recorder(toynet, input_size=TOY_INPUT_SIZE)
    cached = torchinfo.torchinfo._cached_forward_pass
    assert not any(info.module is toynet for infos in cached.values() for info in infos)


# -- threads ------------------------------------------------------------------------


def test_concurrent_passes_from_two_threads_stay_separate(toynet):
    """Two threads calling one recorder get correct outputs and whole records."""
    rnet = Recorder(toynet, input_size=TOY_INPUT_SIZE)
    rnet.record((0, 1), (1, 3))
    passes = 50
    inputs = [[torch.rand(4, 5) for _ in range(passes)] for _ in range(2)]
    expected = [[toy_oracle(toynet, x)["out"] for x in batch] for batch in inputs]
    barrier = threading.Barrier(2)
    failures = []
    observed = []

    def work(thread):
        try:
            barrier.wait()
            for i, x in enumerate(inputs[thread]):
                out = rnet(x)
                observed.append(dict(rnet.activations))
                torch.testing.assert_close(out, expected[thread][i])
        except BaseException as error:  # noqa: BLE001 (re-raised by the main thread)
            failures.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    assert len(observed) == 2 * passes
    for acts in observed:
        assert list(acts) == [(1, 3), (0, 1)]
        torch.testing.assert_close(acts[(0, 1)], torch.relu(acts[(1, 3)]))


# -- package ------------------------------------------------------------------------


def test_all_names_are_unique_and_importable():
    """Every name of `__all__` is listed once and is an attribute of the package."""
    assert len(set(scio_recorder.__all__)) == len(scio_recorder.__all__)
    for name in scio_recorder.__all__:
        assert getattr(scio_recorder, name) is not None


def test_all_includes_the_reference_exports():
    """`__all__` is a superset of the reference's: `DepthIdx` and `Recorder`."""
    assert {"DepthIdx", "Recorder"} <= set(scio_recorder.__all__)


def test_star_import_gives_exactly_all():
    """`from scio_recorder import *` binds exactly the names of `__all__`."""
    namespace = {}
    exec("from scio_recorder import *", namespace)  # noqa: S102 (fixed source)
    del namespace["__builtins__"]
    assert sorted(namespace) == sorted(scio_recorder.__all__)


def test_every_public_attribute_is_in_all():
    """No public attribute of the package is missing from `__all__`.

    Modules are left out, except `collect`: a callable module that stands for
    the function of the same name. `dir()` lists the names loaded on first use
    too (the face's `__dir__`).
    """
    public = {
        name
        for name in dir(scio_recorder)
        if not name.startswith("_")
        and not (
            isinstance(value := getattr(scio_recorder, name), types.ModuleType)
            and not callable(value)
        )
    }
    assert public == set(scio_recorder.__all__)


def test_deepcopy_gives_an_independent_recorder_of_a_copied_net():
    """``copy.deepcopy(rnet)`` records its own copy of the net, with its own hooks."""
    import copy  # noqa: PLC0415 (only this test needs it)

    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 1), inputs=(1, 3))
    clone = copy.deepcopy(rnet)
    x = torch.randn(2, 3)
    out, out_clone = rnet(x), clone(x)
    assert clone.net is not net
    assert clone.table[(1, 1)].module is clone.net[0]
    assert [len(m._forward_hooks) for m in net] == [1, 0, 0]
    assert [len(m._forward_hooks) for m in clone.net] == [1, 0, 0]
    assert [len(m._forward_pre_hooks) for m in clone.net] == [0, 0, 1]
    torch.testing.assert_close(out_clone, out)
    torch.testing.assert_close(clone.activations[(1, 1)], net[0](x))
    assert clone.activations[(1, 1)] is not rnet.activations[(1, 1)]
    assert list(clone.inputs) == [(1, 3)]
    del clone
    gc.collect()
    assert [len(m._forward_hooks) for m in net] == [1, 0, 0]
    assert torch.equal(rnet(x), out)


def test_pickle_gives_a_recorder_of_a_copied_net():
    """``pickle`` and ``torch.save`` of a recorder give a working recorder."""
    import io  # noqa: PLC0415 (only this test needs it)
    import pickle  # noqa: PLC0415

    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 1), inputs=(1, 3), grads=(1, 2))
    x = torch.randn(2, 3, requires_grad=True)
    rnet(x)
    buffer = io.BytesIO()
    torch.save(rnet, buffer)
    buffer.seek(0)
    for copied in (
        pickle.loads(pickle.dumps(rnet)),  # noqa: S301 (our own bytes)
        torch.load(buffer, weights_only=False),
    ):
        assert copied.net is not net
        assert not copied.activations  # the latest records are not saved
        # Only the copy's own hooks: the pickled ones were dropped.
        assert [len(m._forward_hooks) for m in copied.net] == [1, 1, 0]
        assert [len(m._forward_pre_hooks) for m in copied.net] == [0, 0, 1]
        out = copied(x)
        out.sum().backward()
        assert torch.equal(out, rnet(x))  # same weights, same ops
        assert list(copied.activations) == [(1, 1)]
        assert list(copied.inputs) == [(1, 3)]
        assert copied.gradients[(1, 2)].shape == (2, 3)


def test_pickling_a_recorder_of_a_compiled_net_says_what_to_save():
    """The refusal names the cause and the state dict and records to save."""
    import pickle  # noqa: PLC0415 (only this test needs it)

    rnet = Recorder(torch.compile(nn.Linear(3, 2)), input_size=(1, 3))
    with pytest.raises(
        TypeError,
        match=r"torch\.compile-d net.*rnet\.net\.state_dict\(\).*save_records",
    ):
        pickle.dumps(rnet)


# -- helpful KeyErrors ---------------------------------------------------------


def test_activations_by_name_say_to_use_labels_or_activations_of():
    """``rnet.activations["2"]`` names the accessor and the label to use."""
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record("2")
    rnet(torch.ones(1, 3))
    msg = (
        "`rnet.activations` is keyed by `(depth, idx)` labels, not names: use "
        "`rnet.activations_of('2')` (every recorded call of it) or "
        "`rnet.activations[(1, 3)]`; '2' is labelled (1, 3)."
    )
    with pytest.raises(KeyError, match=re.escape(msg)):
        rnet.activations["2"]
    assert list(rnet.activations) == [(1, 3)]  # keys stay labels
    assert "2" not in rnet.activations
    assert isinstance(rnet.activations, MappingProxyType)
    (record,) = rnet.activations_of("2")
    assert record is rnet.activations[(1, 3)]


def test_missing_labels_and_unknown_names_say_what_to_do():
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record("2", inputs="0")
    rnet(torch.ones(1, 3))
    cases = {
        (1, 1): "Layer 1-1 (Linear `0`) has no record in `rnet.activations` of the "
        "latest pass: record it with `rnet.record((1, 1))`, then run a pass.",
        (7, 7): "(7, 7) is not a label of this net: see `print(rnet)` for the labels.",
        "fc": "`rnet.activations` is keyed by `(depth, idx)` labels, and no module "
        "is named 'fc': see `print(rnet)` for the labels and names.",
    }
    for key, msg in cases.items():
        with pytest.raises(KeyError, match=re.escape(msg)):
            rnet.activations[key]
    msg = (
        "`rnet.inputs` is keyed by `(depth, idx)` labels, not names: use "
        "`rnet.inputs[(1, 1)]`; '0' is labelled (1, 1)."
    )
    with pytest.raises(KeyError, match=re.escape(msg)):
        rnet.inputs["0"]
    msg = "record it with `rnet.record(inputs=(1, 3))`"
    with pytest.raises(KeyError, match=re.escape(msg)):
        rnet.inputs[(1, 3)]


def test_a_kept_activations_mapping_does_not_keep_the_net_alive():
    net = nn.Sequential(nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 1))
    rnet(torch.ones(1, 3))
    acts = rnet.activations
    ref = weakref.ref(net)
    del net, rnet
    gc.collect()
    assert ref() is None
    assert list(acts) == [(1, 1)]
    with pytest.raises(KeyError, match="not a label recorded in this pass"):
        acts["0"]


def test_subclass_forward_runs_on_the_fast_path(toynet):
    """A subclass's own `forward` is what `rnet(x)` calls, hooks or not."""
    calls = []

    class Counting(Recorder):
        def forward(self, *args, **kwargs):
            calls.append(1)
            return super().forward(*args, **kwargs)

    rnet = Counting(toynet, input_size=(1, 5))
    rnet.record((1, 1))
    x = torch.rand(2, 5)
    assert torch.equal(rnet(x), toynet(x))
    assert calls == [1]
    assert torch.equal(rnet.activations[(1, 1)], toynet[0](x))


def test_edits_by_selector_from_several_threads_count_each_call_once():
    """Threads editing a call the selection does not hook share its extra hooks.

    Two sets of hooks on one module would count each call twice and fail the
    call-plan check; the extra hooks are gone once the last pass ends.
    """
    import threading  # noqa: PLC0415

    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)]).eval()
    rnet = Recorder(net, input_size=(1, 8))
    rnet.record("0")
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = net[3:](net[:3](x) * 0)
    errors: list[str] = []

    def work() -> None:
        try:
            for _ in range(100):
                with torch.no_grad():
                    out = rnet(x, activation_postproc={"2": lambda t: t * 0})
                assert torch.equal(out, expected)
                assert list(rnet.activations) == [(1, 1)]
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(repr(error))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert not net[2]._forward_hooks


# -- edits that cannot replace what they edit ------------------------------------


def widen(t):
    """An edit that doubles the last dimension (a wrong shape)."""
    return torch.cat([t, t], dim=-1)


def to_double(t):
    """An edit that returns float64 (a wrong dtype)."""
    return t.double()


EDIT_TAIL = (
    r"\. An edit returns `None` \(to keep the value, e\.g\. after changing it in "
    r"place\) or a replacement with the same tensors, of the same shapes and "
    r"dtypes\.$"
)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (
            {"activation_postproc": {"0": widen}},
            (
                "`widen` (`activation_postproc`) of call 1-1 of module `0` (Linear, "
                "label 1-1) returned a tensor of shape [3, 8] and dtype torch.float32, "
                "where the output is a tensor of shape [3, 4] and dtype torch.float32"
            ),
        ),
        (
            {"activation_postproc": {(1, 3): to_double}},
            (
                "`to_double` (`activation_postproc`) of call 1-3 of module `2` "
                "(Linear, label 1-3) returned a tensor of shape [3, 3] and dtype "
                "torch.float64, where the output is a tensor of shape [3, 3] and "
                "dtype torch.float32"
            ),
        ),
        (
            {"input_postproc": {"2": widen}},
            (
                "`widen` (`input_postproc`) of call 1-3 of module `2` (Linear, label "
                "1-3) returned a tensor of shape [3, 8] and dtype torch.float32, where "
                "the first positional input is a tensor of shape [3, 4] and dtype "
                "torch.float32"
            ),
        ),
    ],
    ids=["output shape", "output dtype", "input shape"],
)
def test_an_edit_by_selector_of_the_wrong_kind_names_the_layer_and_the_edit(
    rnet, x, options, problem
):
    """A wrong shape or dtype fails where the edit is made, naming both.

    It used to fail later, inside the next module, naming neither.
    """
    rnet.record((1, 1))
    rnet(x)
    with pytest.raises(ValueError, match="^The edit " + re.escape(problem) + EDIT_TAIL):
        rnet(x, **options)
    assert dict(rnet.activations) == {}  # the failed pass kept nothing


@pytest.mark.parametrize("form", ["callable", "list"])
def test_a_plain_postprocessor_of_the_wrong_shape_names_the_layer(rnet, x, form):
    """The same check for a callable or a list of postprocessors."""
    rnet.record((1, 1), (1, 3))
    postproc = widen if form == "callable" else [clamp, widen]
    label, name, width = ((1, 1), "0", 4) if form == "callable" else ((1, 3), "2", 3)
    problem = (
        f"`widen` (`activation_postproc`) of call {label[0]}-{label[1]} of module "
        f"`{name}` (Linear, label {label[0]}-{label[1]}) returned a tensor of shape "
        f"[3, {2 * width}]"
    )
    with pytest.raises(ValueError, match="^The edit " + re.escape(problem)):
        rnet(x, activation_postproc=postproc)


class TupleOut(nn.Module):
    """A block that returns ``(hidden, extra)``, as many Hugging Face blocks do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h, {"aux": h.sum(dim=-1)}


class TupleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = TupleOut()

    def forward(self, x):
        h, extra = self.block(x)
        return h + extra["aux"][:, None]


def _double_in_place(out):
    out[0].mul_(2)


@pytest.mark.parametrize(
    ("edit", "oracle"),
    [
        (lambda out: None, lambda h: h + h.sum(-1, keepdim=True)),
        (_double_in_place, lambda h: 2 * h + h.sum(-1, keepdim=True)),
        (lambda out: (out[0] * 2, out[1]), lambda h: 2 * h + h.sum(-1, keepdim=True)),
        (
            lambda out: [out[0], {"aux": out[1]["aux"] + 1}],
            lambda h: h + (h.sum(-1, keepdim=True) + 1),
        ),
    ],
    ids=["None", "in place", "a tuple", "a list with a dict"],
)
def test_legal_edits_of_a_nested_output_stay_legal(edit, oracle):
    """``None``, in-place edits, the same tensors in another container: accepted.

    The output is the net's computation with the edit written out by hand
    (the same float32 ops on the same tensors: equal bit for bit).
    """
    net = TupleNet()
    rnet = Recorder(net, input_size=(2, 4))
    x = torch.rand(2, 4)
    out = rnet(x, activation_postproc={"block": edit})
    assert torch.equal(out, oracle(net.block.lin(x)))


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            lambda out: out[0],
            (
                "tensors at the top (a tensor), where the output has tensors at [0], "
                "[1]['aux']"
            ),
        ),
        (
            lambda out: (out[0], {"aux": out[1]["aux"][:1]}),
            (
                "a tensor of shape [1] and dtype torch.float32 at [1]['aux'], "
                "where the output is a tensor of shape [2] and dtype torch.float32"
            ),
        ),
    ],
    ids=["a tensor for a tuple", "a wrong shape inside"],
)
def test_an_edit_of_a_nested_output_that_does_not_fit_names_the_place(edit, problem):
    """A tensor for a tuple, or a wrong shape inside: named with its place."""
    rnet = Recorder(TupleNet(), input_size=(2, 4))
    with pytest.raises(ValueError, match=re.escape(f"returned {problem}.")):
        rnet(torch.rand(2, 4), activation_postproc={"block": edit})


def test_an_edit_may_change_the_dtype_under_autocast(rnet, toynet, x):
    """Under autocast the next operation casts its inputs: a dtype change is legal."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = rnet(x, activation_postproc={"0": lambda t: t.float() * 2})
        expected = toynet[2:](toynet[1](toynet[0](x).float() * 2))
    assert torch.equal(out, expected)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
)
def test_an_edit_is_accepted_exactly_when_shape_and_dtype_match(rows, cols, dtype):
    """Over shapes and dtypes: refused iff the replacement is not ``[3, 4]`` f32."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU())
    rnet = Recorder(net, input_size=(1, 5))
    x = torch.rand(3, 5)
    edit = {"0": lambda _t: torch.zeros(rows, cols, dtype=dtype)}
    if (rows, cols, dtype) == (3, 4, torch.float32):
        assert torch.equal(rnet(x, activation_postproc=edit), torch.zeros(3, 4))
    else:
        with pytest.raises(ValueError, match=r"^The edit `test_an_edit_is_accepted"):
            rnet(x, activation_postproc=edit)


def test_a_reshaping_edit_may_change_shapes_and_keeps_its_name():
    """`reshaping(fn)` skips the fit check; unwrapped, the same edit is refused."""
    from scio_recorder import reshaping  # noqa: PLC0415 (the public name is the point)

    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    x = torch.rand(5, 3)

    def keep_two(t):
        return t[:2]

    out = rnet(x, input_postproc={"2": reshaping(keep_two)})
    # rows are independent: the same values, up to float32 rounding (the last
    # layer runs on 2 rows here and on 5 in net(x): another GEMM blocking may
    # round its 3-term dot products otherwise, a few eps of their magnitude)
    eps = torch.finfo(torch.float32).eps
    want = net(x)[:2].detach()
    torch.testing.assert_close(
        out, want, rtol=0, atol=8 * eps * max(float(want.abs().max()), 1.0)
    )
    rnet.record((1, 1))
    out = rnet(x, activation_postproc={(1, 1): reshaping(keep_two)})
    assert out.shape == (2, 2)
    assert rnet.activations[(1, 1)].shape == (5, 3)  # the layer's own output
    with pytest.raises(
        ValueError, match=r"^The edit `test_a_reshaping_edit.*keep_two`"
    ):
        rnet(x, input_postproc={"2": keep_two})
    assert repr(reshaping(keep_two)).startswith("reshaping(<function")
    with pytest.raises(
        TypeError, match=r"^reshaping takes an edit \(a callable\), got int"
    ):
        reshaping(3)  # type: ignore[arg-type]
