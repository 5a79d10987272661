"""Selecting layers by name, call, module, type, predicate and registration.

Every selection is checked against the layer table, and every record against
the same layers applied by hand with functional ops.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder, children, modules

X = (1, 4)  # input_size of every reference pass


class Inner(nn.Module):
    """``act(lin(x))``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


class Nested(nn.Module):
    """A stem, a nested block, a ``ModuleList`` loop and a ReLU called 3 times.

    Table (label, name, call)::

        0-1 -          0     1-5 relu     1
        1-1 stem       0     1-6 layers   - (container)
        1-2 relu       0     2-4 layers.1 0
        1-3 block      0     1-7 relu     2
        2-1 block.lin  0     1-8 head     0
        2-2 block.act  0
        1-4 layers     - (container)
        2-3 layers.0   0
    """

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(4, 4)
        self.relu = nn.ReLU()
        self.block = Inner()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        x = self.relu(self.stem(x))
        x = self.block(x)
        for layer in self.layers:
            x = self.relu(layer(x))
        return self.head(x)


def oracle(net, x):
    """Return ``{label: output}`` of every call of ``Nested``, computed by hand."""
    out = {}
    out[(1, 1)] = h = F.linear(x, net.stem.weight, net.stem.bias)
    out[(1, 2)] = h = torch.relu(h)
    out[(2, 1)] = h = F.linear(h, net.block.lin.weight, net.block.lin.bias)
    out[(2, 2)] = out[(1, 3)] = h = torch.relu(h)
    out[(2, 3)] = h = F.linear(h, net.layers[0].weight, net.layers[0].bias)
    out[(1, 5)] = h = torch.relu(h)
    out[(2, 4)] = h = F.linear(h, net.layers[1].weight, net.layers[1].bias)
    out[(1, 7)] = h = torch.relu(h)
    out[(1, 8)] = out[(0, 1)] = F.linear(h, net.head.weight, net.head.bias)
    return out


CALL_NAMES = ("", "stem", "relu", "block", "block.lin", "block.act")
CALL_NAMES += ("layers.0", "layers.1", "head")


@pytest.fixture
def net():
    return Nested()


@pytest.fixture
def rnet(net):
    return Recorder(net, input_size=X)


@pytest.fixture
def x():
    return torch.randn(3, 4)


def check_records(rnet, net, x, labels):
    """Run a pass and check that exactly ``labels`` were recorded, by hand."""
    rnet(x)
    expected = oracle(net, x)
    assert sorted(rnet.activations) == sorted(labels)
    for label in labels:
        torch.testing.assert_close(rnet.activations[label], expected[label])


# ------------------------------------------------------------ by name, by call


def test_name_of_a_reused_module_selects_every_call(rnet, net, x):
    """``record("relu")`` gives one label per call of the shared ReLU."""
    rnet.record("relu")
    assert rnet.recording == ((1, 2), (1, 5), (1, 7))
    check_records(rnet, net, x, [(1, 2), (1, 5), (1, 7)])


def test_nested_qualified_name_selects_its_call(rnet, net, x):
    """A dotted name reaches a module inside a block."""
    rnet.record("block.lin")
    assert rnet.recording == ((2, 1),)
    check_records(rnet, net, x, [(2, 1)])


def test_name_inside_a_module_list_selects_its_call(rnet, net, x):
    """``"layers.1"`` selects the second module of the ``ModuleList``."""
    rnet.record("layers.1")
    assert rnet.recording == ((2, 4),)
    check_records(rnet, net, x, [(2, 4)])


def test_any_name_of_a_module_registered_twice_selects_all_its_calls():
    """A ReLU at positions 1 and 3 of a Sequential: ``"1"`` and ``"3"`` alike."""
    relu = nn.ReLU()
    net = nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 4), relu)
    rnet = Recorder(net, input_size=X)
    rnet.record("1")
    by_first = rnet.recording
    rnet.record("3")
    assert rnet.recording == by_first == ((1, 2), (1, 4))
    x = torch.randn(2, 4)
    rnet(x)
    first = torch.relu(F.linear(x, net[0].weight, net[0].bias))
    second = torch.relu(F.linear(first, net[2].weight, net[2].bias))
    torch.testing.assert_close(rnet.activations[(1, 2)], first)
    torch.testing.assert_close(rnet.activations[(1, 4)], second)


def test_empty_name_selects_the_whole_net(rnet, net, x):
    """The root's qualified name ``""`` selects the whole net's call."""
    rnet.record("")
    out = rnet(x)
    assert rnet.recording == ((0, 1),)
    assert rnet.activations[(0, 1)] is out


@pytest.mark.parametrize(("k", "label"), [(0, (1, 2)), (1, (1, 5)), (2, (1, 7))])
def test_name_and_call_index_select_one_call(rnet, net, x, k, label):
    """``("relu", k)`` selects the k-th call only."""
    rnet.record(("relu", k))
    assert rnet.recording == (label,)
    check_records(rnet, net, x, [label])


@pytest.mark.parametrize("k", [3, -1])
def test_call_index_out_of_range_raises(rnet, k):
    """A call index the module never reaches says which indices exist."""
    msg = (
        "Module `relu` is called 3 times in the reference pass, so its calls are "
        f"numbered 0 to 2, not {k}. Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(("relu", k))


def test_call_index_of_a_module_called_once_uses_singular(rnet):
    """A module called once is said to be called ``1 time``."""
    msg = (
        "Module `head` is called 1 time in the reference pass, so its calls are "
        "numbered 0 to 0, not 1. Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(("head", 1))


def test_name_and_call_selector_accepted_for_inputs(rnet, net, x):
    """``(name, k)`` works for ``inputs=`` as for outputs."""
    rnet.record(inputs=("relu", 1))
    rnet(x)
    assert rnet.selection.inputs == ((1, 5),)
    torch.testing.assert_close(rnet.inputs[(1, 5)].args[0], oracle(net, x)[(2, 3)])


# ----------------------------------------------------- by module, type, predicate


def test_module_instance_selects_every_call(rnet, net, x):
    """Passing the shared ReLU instance selects its three calls."""
    rnet.record(net.relu)
    assert rnet.recording == ((1, 2), (1, 5), (1, 7))
    check_records(rnet, net, x, [(1, 2), (1, 5), (1, 7)])


def test_module_instance_not_called_raises(rnet):
    """A module foreign to the net is refused."""
    msg = (
        "The module Linear given is not called in the reference pass of this "
        "net. Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(nn.Linear(4, 4))


def test_type_selects_every_linear_call(rnet, net, x):
    """``nn.Linear`` selects every call of every Linear, nested ones included."""
    rnet.record(nn.Linear)
    linears = [(1, 1), (1, 8), (2, 1), (2, 3), (2, 4)]
    assert rnet.recording == tuple(linears)
    check_records(rnet, net, x, linears)


def test_type_not_called_raises(rnet):
    """A type with no call in the net is refused."""
    msg = (
        "No module of type `Conv2d` is called in the reference pass. "
        "Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(nn.Conv2d)


def test_predicate_over_rows_selects_matching_calls(rnet, net, x):
    """A predicate over ``Layer`` rows selects the rows it accepts."""
    rnet.record(lambda row: row.call_index == 1)
    assert rnet.recording == ((1, 5),)
    check_records(rnet, net, x, [(1, 5)])


def test_predicate_sees_only_recordable_rows(rnet):
    """Container rows are never offered to a predicate, so never selected."""
    seen = []
    rnet.record(lambda row: seen.append(row) or row.name == "layers.0")
    assert rnet.recording == ((2, 3),)
    assert all(row.recordable for row in seen)
    assert {row.label for row in seen} == set(rnet.table) - {(1, 4), (1, 6)}


def test_predicate_selecting_nothing_raises(rnet):
    """A predicate that accepts no row is refused, naming the predicate."""

    def never(_row):
        return False

    msg = f"The predicate {never!r} selects no row. Operation cancelled"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(never)


def test_list_of_selectors_is_their_union(rnet, net, x):
    """A list mixes forms; the result is the union."""
    rnet.record(["stem", ("relu", 2), net.block.act])
    assert rnet.recording == ((1, 1), (1, 7), (2, 2))
    check_records(rnet, net, x, [(1, 1), (1, 7), (2, 2)])


def test_set_of_selectors_is_their_union(rnet, net, x):
    """A set of names is the union of their calls."""
    rnet.record({"head", "block.lin"})
    assert rnet.recording == ((1, 8), (2, 1))
    check_records(rnet, net, x, [(1, 8), (2, 1)])


def test_overlapping_selectors_record_each_label_once(rnet, net, x):
    """A name, its type and a label that overlap give each label once."""
    rnet.record("relu", nn.ReLU, (1, 5), ["relu"])
    assert rnet.recording == ((1, 2), (1, 5), (1, 7), (2, 2))
    check_records(rnet, net, x, [(1, 2), (1, 5), (1, 7), (2, 2)])


def test_recording_is_sorted_whatever_the_selector_order(rnet):
    """``rnet.recording`` holds sorted labels, not the order given."""
    rnet.record("head", "block.act", ("relu", 2), "stem")
    assert rnet.recording == ((1, 1), (1, 7), (1, 8), (2, 2))


def test_selector_of_unknown_form_raises_type_error(rnet):
    """A float is no selector: the message lists the accepted forms."""
    msg = (
        "Cannot select layers with 3.5 (float). Use a label `(depth, idx)`, a "
        "qualified name, `(name, call)`, a module, a module type, a predicate "
        "over rows, or `children()`/`modules()`. Operation cancelled"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        rnet.record(3.5)


# --------------------------------------------------------- children / modules


def test_children_by_type_and_index_needs_both(rnet, net, x):
    """``children(types=Linear, indices=(0, 1, 4))``: Linear children at 0 and 4."""
    # children: 0 stem (Linear), 1 relu, 2 block, 3 layers, 4 head (Linear)
    rnet.record(children(types=nn.Linear, indices=(0, 1, 4)))
    assert rnet.recording == ((1, 1), (1, 8))
    check_records(rnet, net, x, [(1, 1), (1, 8)])


def test_children_both_conditions_select_less_than_torchfunc_either(rnet, net):
    """torchfunc takes either condition: it would also pick the ReLU at index 1."""
    types, indices = (nn.Linear,), {0, 1, 4}
    either = [
        module
        for index, module in enumerate(net.children())
        if isinstance(module, types) or index in indices
    ]
    rnet.record(either)
    torchfunc_labels = rnet.recording
    rnet.record(children(types=types, indices=indices))
    assert torchfunc_labels == ((1, 1), (1, 2), (1, 5), (1, 7), (1, 8))
    assert set(rnet.recording) < set(torchfunc_labels)
    assert rnet.recording == ((1, 1), (1, 8))


def test_children_by_index_only(rnet):
    """``children(indices=2)`` is the block (its own call, not its children)."""
    rnet.record(children(indices=2))
    assert rnet.recording == ((1, 3),)


def test_children_by_type_only_ignores_grandchildren(rnet):
    """``children(types=nn.ReLU)`` does not reach ``block.act``."""
    rnet.record(children(types=nn.ReLU))
    assert rnet.recording == ((1, 2), (1, 5), (1, 7))


def test_children_without_conditions_select_every_called_child(rnet):
    """Every child's calls; the uncalled ``ModuleList`` is skipped."""
    rnet.record(children())
    assert rnet.recording == ((1, 1), (1, 2), (1, 3), (1, 5), (1, 7), (1, 8))


def test_children_selecting_no_called_module_raises(rnet):
    """Only the never-called ``ModuleList`` matches: refused."""
    msg = "`children(types=['ModuleList'], indices=None)` selects no called module. "
    msg += "Operation cancelled"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record(children(types=nn.ModuleList))


def test_modules_by_type_and_index_needs_both(rnet, net, x):
    """``modules(types=Linear, indices=(1, 2, 4))``: Linear modules at 1 and 4."""
    # modules: 0 net, 1 stem, 2 relu, 3 block, 4 block.lin, 5 block.act, ...
    rnet.record(modules(types=nn.Linear, indices=(1, 2, 4)))
    assert rnet.recording == ((1, 1), (2, 1))
    check_records(rnet, net, x, [(1, 1), (2, 1)])


def test_modules_both_conditions_select_less_than_torchfunc_either(rnet, net):
    """torchfunc would also pick every Linear and the ReLU at index 2."""
    types, indices = (nn.Linear,), {1, 2, 4}
    either = [
        module
        for index, module in enumerate(net.modules())
        if isinstance(module, types) or index in indices
    ]
    rnet.record(either)
    torchfunc_labels = set(rnet.recording)
    rnet.record(modules(types=types, indices=indices))
    assert set(rnet.recording) < torchfunc_labels
    assert torchfunc_labels - set(rnet.recording) == {
        (1, 2), (1, 5), (1, 7), (1, 8), (2, 3), (2, 4)
    }  # fmt: skip


def test_modules_index_zero_is_the_whole_net(rnet):
    """Position 0 of ``net.modules()`` is the net itself."""
    rnet.record(modules(indices=0))
    assert rnet.recording == ((0, 1),)


def test_modules_by_type_reaches_nested_modules(rnet):
    """``modules(types=nn.ReLU)`` includes ``block.act``."""
    rnet.record(modules(types=nn.ReLU))
    assert rnet.recording == ((1, 2), (1, 5), (1, 7), (2, 2))


# ------------------------------------------------------------- refused names


def test_unknown_name_suggests_close_names(rnet):
    """A typo gives a ValueError with a "Did you mean" hint."""
    msg = (
        "No module named `blok` is called in the reference pass. Did you mean "
        "`block`, `block.lin`, `block.act`? `print(rnet.table)` lists the "
        "qualified names. Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record("blok")


def test_unknown_name_without_close_match_has_no_hint(rnet):
    """A name far from every qualified name gets no suggestion."""
    msg = (
        "No module named `zzzzzz` is called in the reference pass. "
        "`print(rnet.table)` lists the qualified names. Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record("zzzzzz")


def test_unknown_name_in_a_call_selector_suggests_close_names(rnet):
    """``("rleu", 0)`` is refused with the hint for the name."""
    with pytest.raises(ValueError, match=r"Did you mean `relu`\?"):
        rnet.record(("rleu", 0))


def test_container_name_is_refused_with_the_reason(rnet):
    """The ``ModuleList`` is never called: its name cannot be recorded."""
    msg = (
        "Layer 1-4 (ModuleList `layers`) cannot be recorded: it is a container "
        "that is never called in the reference pass; only its submodules run. "
        "Operation cancelled"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.record("layers")


def test_failed_record_keeps_previous_selection(rnet, net, x):
    """A selection with one unknown name changes nothing."""
    rnet.record("stem", inputs="head")
    before = rnet.selection
    with pytest.raises(ValueError, match="Did you mean"):
        rnet.record("head", "blok")
    assert rnet.selection == before
    check_records(rnet, net, x, [(1, 1)])


def test_failed_record_keeps_hooks(rnet, net):
    """The hooks of the previous selection stay, and no new one is added."""
    rnet.record("stem", inputs="head")
    forward = {m: dict(m._forward_hooks) for m in net.modules()}
    pre = {m: dict(m._forward_pre_hooks) for m in net.modules()}
    with pytest.raises(ValueError, match="cannot be recorded"):
        rnet.record(nn.ReLU, grads="layers")
    assert {m: dict(m._forward_hooks) for m in net.modules()} == forward
    assert {m: dict(m._forward_pre_hooks) for m in net.modules()} == pre
    assert set(rnet.hooked_modules) == {net.stem, net.head}


def test_failed_input_selection_keeps_output_selection(rnet):
    """An error in ``inputs=`` cancels the output selection given with it."""
    rnet.record("stem")
    with pytest.raises(ValueError, match="No module named `hed`"):
        rnet.record("head", inputs="hed")
    assert rnet.recording == ((1, 1),)
    assert rnet.selection.inputs == ()


# -------------------------------------------------------------- table, views


def test_printed_table_lists_qualified_names(rnet, capsys):
    """``print(rnet.table)`` has a row with label, dotted name, type and call."""
    print(rnet.table)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["label", "name", "type", "call", "output", "shape"]
    assert "2-1    block.lin  Linear      0     [1, 4]" in lines
    assert "1-7    relu       ReLU        2     [1, 4]" in lines


def test_printed_table_explains_container_rows(rnet, capsys):
    """A container row shows why it cannot be recorded."""
    print(rnet.table)
    lines = capsys.readouterr().out.splitlines()
    assert lines.count(
        "1-4    layers     ModuleList  -     (it is a container that is never "
        "called in the reference pass; only its submodules run)"
    ) == 1  # fmt: skip


def test_activations_of_gives_every_call_in_call_order(rnet, net, x):
    """``activations_of("relu")`` is the three ReLU outputs, first call first."""
    rnet.record("relu", "head")
    rnet(x)
    expected = oracle(net, x)
    records = rnet.activations_of("relu")
    assert isinstance(records, tuple)
    assert len(records) == 3
    for record, label in zip(records, [(1, 2), (1, 5), (1, 7)], strict=True):
        torch.testing.assert_close(record, expected[label])


def test_activations_of_accepts_any_selector(rnet, net, x):
    """A type selects the records of its rows, in table order."""
    rnet.record(nn.Linear)
    rnet(x)
    expected = oracle(net, x)
    records = rnet.activations_of(nn.Linear)
    order = [(1, 1), (2, 1), (2, 3), (2, 4), (1, 8)]  # table order
    assert len(records) == len(order)
    for record, label in zip(records, order, strict=True):
        torch.testing.assert_close(record, expected[label])


def test_activations_of_unrecorded_name_raises_key_error(rnet, x):
    """A name whose calls were not recorded gives a KeyError saying what to do."""
    rnet.record("stem")
    rnet(x)
    msg = (
        "Labels [(1, 8)] were not recorded in the latest pass. "
        "Record them first: `rnet.record('head')`."
    )
    with pytest.raises(KeyError, match=f"^{re.escape(repr(msg))}$"):
        rnet.activations_of("head")


def test_activations_of_before_any_pass_raises_key_error(rnet):
    """Selected but not yet run: every label is missing."""
    rnet.record("relu")
    with pytest.raises(KeyError, match=re.escape("Labels [(1, 2), (1, 5), (1, 7)]")):
        rnet.activations_of("relu")


# ------------------------------------------------------------------ property

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(subset=st.sets(st.sampled_from(CALL_NAMES)))
def test_names_select_the_union_of_their_rows(rnet, net, subset):
    """Recorded labels are the call rows whose ``.name`` is in the subset."""
    rnet.record(subset)
    expected = sorted(
        row.label
        for row in rnet.table.rows
        if row.name in subset and row.call_index is not None
    )
    assert rnet.recording == tuple(expected)
    x = torch.randn(2, 4)
    check_records(rnet, net, x, expected)


@SETTINGS
@given(names=st.lists(st.sampled_from(CALL_NAMES), min_size=1, max_size=4))
def test_names_as_separate_arguments_equal_names_as_one_list(rnet, names):
    """``record(a, b)`` and ``record([a, b])`` select the same labels."""
    rnet.record(*names)
    separate = rnet.recording
    rnet.record(list(reversed(names)))
    assert rnet.recording == separate
