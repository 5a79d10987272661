"""`RecorderGroup`: MMRazor's recorder examples rewritten on this library.

Each MMRazor example (``FunctionOutputsRecorder``, ``MethodOutputsRecorder``,
``ModuleOutputsRecorder``, ``ModuleInputsRecorder``, ``ParameterRecorder``,
``RecorderManager``) is run through :meth:`RecorderGroup.from_config` and
checked against the values computed by hand.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import CallRecorder, Recorder, RecorderGroup, calls

TOY = "calls_toy_module"


def load_toy_module():
    """Import ``tests/calls_toy_module.py`` as ``calls_toy_module``.

    As in ``tests/test_calls.py``: registered in ``sys.modules`` so that the
    dotted paths given to the recorder import it.
    """
    if TOY in sys.modules:
        return sys.modules[TOY]
    spec = importlib.util.spec_from_file_location(
        TOY, Path(__file__).with_name("calls_toy_module.py")
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[TOY] = module
    spec.loader.exec_module(module)
    return module


toy_module = load_toy_module()


@pytest.fixture(autouse=True)
def no_patch_left():
    """Every test must leave no function or method patched."""
    yield
    assert calls._PATCHES == {}


def module_hooks(net):
    """Return the hooks of every module of ``net`` (name -> hook ids)."""
    return {
        name: (
            tuple(m._forward_hooks),
            tuple(m._forward_pre_hooks),
            tuple(m._forward_hooks_always_called),
        )
        for name, m in net.named_modules()
    }


class TwiceConv(nn.Module):
    """MMRazor's ToyModel: ``conv1`` is called on ``x`` and on ``x + 1``."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 1, 1)
        self.conv2 = nn.Conv2d(1, 1, 1)

    def forward(self, x):
        x1 = self.conv1(x)
        x2 = self.conv1(x + 1)
        return self.conv2(x1 + x2)


class ParamModel(nn.Module):
    """MMRazor's ParameterRecorder example model."""

    def __init__(self):
        super().__init__()
        self.toy_conv = nn.Conv2d(1, 1, 1)

    def forward(self, x):
        return self.toy_conv(x)


class ManagerModel(nn.Module):
    """MMRazor's RecorderManager example: convs plus a method's random int."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 1, 1)
        self.conv2 = nn.Conv2d(1, 1, 1)
        self.toy = toy_module.Toy()

    def forward(self, x):
        return self.conv2(self.conv1(x)) + self.toy.toy_func()


def conv(layer, x):
    """``layer(x)`` by hand (no hook can fire)."""
    return F.conv2d(x, layer.weight, layer.bias)


X = (1, 1, 1, 1)


# ============================================================ MMRazor examples


def test_function_outputs_example():
    """FunctionOutputsRecorder('toy_module.toy_func'): every return, in order."""
    group = RecorderGroup.from_config(
        {"r1": {"type": "FunctionOutputs", "source": f"{TOY}.toy_func"}}
    )
    with group:
        out1 = toy_module.toy_func()
        out2 = toy_module.toy_func()
        out3 = toy_module.toy_func()
    assert group.data("r1") == [out1, out2, out3]
    assert group.get("r1", 2) == out3


def test_method_outputs_example():
    """MethodOutputsRecorder('toy_module.Toy.toy_func'): every return, in order."""
    group = RecorderGroup.from_config(
        {"r1": {"type": "MethodOutputs", "source": f"{TOY}.Toy.toy_func"}}
    )
    toy = toy_module.Toy()
    with group:
        out1 = toy.toy_func()
        out2 = toy.toy_func()
        out3 = toy.toy_func()
    assert group.data("r1") == [out1, out2, out3]
    assert group.get("r1", 1) == out2


def test_module_outputs_example():
    """ModuleOutputsRecorder('conv1'): data[0] = conv1(x), data[1] = conv1(x + 1)."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"r1": {"type": "ModuleOutputs", "source": "conv1"}}, model, input_size=X
    )
    x = torch.randn(X)
    with group:
        model(x)
    data = group.data("r1")
    assert len(data) == 2
    torch.testing.assert_close(data[0], conv(model.conv1, x))
    torch.testing.assert_close(data[1], conv(model.conv1, x + 1))


def test_module_outputs_of_two_passes_are_pass_major():
    """Two forward passes give four records: pass 1's two calls, then pass 2's."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"r1": {"type": "ModuleOutputs", "source": "conv1"}}, model, input_size=X
    )
    xs = [torch.randn(X), torch.randn(X)]
    with group:
        for x in xs:
            model(x)
    expected = [conv(model.conv1, v) for x in xs for v in (x, x + 1)]
    for record, manual in zip(group.data("r1"), expected, strict=True):
        torch.testing.assert_close(record, manual)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(offsets=st.lists(st.floats(-3, 3), min_size=1, max_size=4))
def test_module_outputs_of_any_number_of_passes(offsets):
    """n passes give 2n records, ``conv1(x)`` then ``conv1(x + 1)`` per pass."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"r1": {"type": "ModuleOutputs", "source": "conv1"}}, model, input_size=X
    )
    xs = [torch.full(X, offset) for offset in offsets]
    with group:
        for x in xs:
            model(x)
    expected = [conv(model.conv1, v) for x in xs for v in (x, x + 1)]
    assert len(group.data("r1")) == 2 * len(offsets)
    for record, manual in zip(group.data("r1"), expected, strict=True):
        torch.testing.assert_close(record, manual)


def test_module_outputs_of_a_module_with_two_names_record_every_call():
    """As MMRazor hooks the module, ``"1"`` of a reused ReLU gives both calls."""
    relu = nn.ReLU()
    net = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
    group = RecorderGroup.from_config(
        {"r": {"type": "ModuleOutputs", "source": "1"}}, net, input_size=(1, 3)
    )
    x = torch.randn(2, 3)
    with group:
        net(x)
    first = torch.relu(F.linear(x, net[0].weight, net[0].bias))
    second = torch.relu(F.linear(first, net[2].weight, net[2].bias))
    data = group.data("r")
    assert len(data) == 2
    torch.testing.assert_close(data[0], first)
    torch.testing.assert_close(data[1], second)


def test_module_inputs_example():
    """ModuleInputsRecorder('conv1'): data[0] = (x,), data[1] = (x + 1,)."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"r1": {"type": "ModuleInputs", "source": "conv1"}}, model, input_size=X
    )
    x = torch.randn(X)
    with group:
        model(x)
    data = group.data("r1")
    assert len(data) == 2
    assert isinstance(data[0], tuple)
    assert data[0][0] is x
    torch.testing.assert_close(data[1], (x + 1,))


def test_parameter_example():
    """ParameterRecorder('toy_conv.weight'): data[0] is the parameter."""
    model = ParamModel()
    group = RecorderGroup.from_config(
        {"r1": {"type": "Parameter", "source": "toy_conv.weight"}}, model, input_size=X
    )
    assert group.data("r1") == [model.toy_conv.weight]
    assert group.get("r1") is model.toy_conv.weight


def test_recorder_manager_example():
    """RecorderManager with conv1_rec, conv2_rec and func_rec on one model."""
    model = ManagerModel()
    group = RecorderGroup.from_config(
        {
            "conv1_rec": {"type": "ModuleOutputs", "source": "conv1"},
            "conv2_rec": {"type": "ModuleOutputs", "source": "conv2"},
            "func_rec": {"type": "MethodOutputs", "source": f"{TOY}.Toy.toy_func"},
        },
        model,
        input_size=X,
    )
    x = torch.randn(X)
    with group:
        out = model(x)
    conv1_out = conv(model.conv1, x)
    conv2_out = conv(model.conv2, conv1_out)
    (value,) = group.data("func_rec")
    assert isinstance(value, int)
    torch.testing.assert_close(group.get("conv1_rec"), conv1_out)
    torch.testing.assert_close(group.get("conv2_rec"), conv2_out)
    torch.testing.assert_close(out, conv2_out + value)
    assert sorted(group) == ["conv1_rec", "conv2_rec", "func_rec"]


def test_from_config_exposes_its_recorder():
    """``group.recorder`` is the Recorder serving the module entries."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {
            "a": {"type": "ModuleOutputs", "source": "conv2"},
            "b": {"type": "ModuleInputs", "source": "conv1"},
            "w": {"type": "Parameter", "source": "conv1.bias"},
        },
        model,
        input_size=X,
    )
    assert isinstance(group.recorder, Recorder)
    assert group.recorder.net is model
    assert group.recorder.recording == ()  # selects its layers only while open
    with group:
        assert group.recorder.recording == ((1, 3),)
        assert group.recorder.selection.inputs == ((1, 1), (1, 2))
    assert group.get("w") is model.conv1.bias


def test_leaving_the_group_restores_the_recorders_previous_selection():
    """A selection made on ``group.recorder`` between blocks survives a block.

    On exit (normal or by an exception) the recorder records what it
    recorded before the block, with the hooks of that selection, and a pass
    after the block records it.
    """
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"a": {"type": "ModuleOutputs", "source": "conv2"}}, model, input_size=X
    )
    rnet = group.recorder
    rnet.record("conv1", inputs="conv2")

    def state():  # the selection, and how many hooks of each kind each module has
        hooks = module_hooks(model).items()
        counts = {name: tuple(map(len, ids)) for name, ids in hooks}
        return rnet.selection, counts

    before = state()
    with group:
        assert rnet.recording == ((1, 3),)
        model(torch.randn(X))
    assert state() == before
    with pytest.raises(ValueError, match=r"^boom$"):
        raise_inside(group, lambda: model(torch.randn(X)))
    assert state() == before
    x = torch.randn(X)
    rnet(x)
    assert set(rnet.activations) == {(1, 1), (1, 2)}  # conv1's two calls
    # the layer applied to the same inputs: the same float32 tensors
    assert torch.equal(rnet.activations[(1, 2)], model.conv1(x + 1))


def test_call_entries_only_need_no_net():
    """A config of functions and methods builds no Recorder."""
    group = RecorderGroup.from_config(
        {"f": {"type": "FunctionOutputs", "source": f"{TOY}.double"}}
    )
    assert group.recorder is None
    with group:
        toy_module.double(4)
    assert group.data("f") == [8]


def test_call_entry_before_any_call_is_empty():
    """No call in the block: the entry's records are an empty list."""
    group = RecorderGroup.from_config(
        {"f": {"type": "FunctionOutputs", "source": f"{TOY}.double"}}
    )
    with group:
        pass
    assert group.data("f") == []


def test_module_inputs_entry_before_any_pass_is_empty():
    """No pass in the block: a ModuleInputs entry has no records."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"i": {"type": "ModuleInputs", "source": "conv1"}}, model, input_size=X
    )
    with group:
        pass
    assert group.data("i") == []


def test_module_outputs_entry_before_any_pass_is_empty():
    """No pass in the block: a ModuleOutputs entry has no records, like inputs."""
    model = TwiceConv()
    group = RecorderGroup.from_config(
        {"o": {"type": "ModuleOutputs", "source": "conv1"}}, model, input_size=X
    )
    with group:
        pass
    assert group.data("o") == []


# ============================================================ config errors


def test_unknown_type_raises():
    """An unknown ``type`` names the valid ones."""
    msg = (
        "Entry 'a' has type 'Bogus'; use one of 'ModuleOutputs', 'ModuleInputs', "
        "'FunctionOutputs', 'MethodOutputs', 'Parameter'."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        RecorderGroup.from_config({"a": {"type": "Bogus", "source": "conv1"}})


def test_missing_source_raises():
    """An entry without ``source`` is refused."""
    msg = "Entry 'a' needs a `source` string, got None."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        RecorderGroup.from_config({"a": {"type": "ModuleOutputs"}})


@pytest.mark.parametrize("kind", ["ModuleOutputs", "ModuleInputs", "Parameter"])
def test_module_entry_without_net_raises(kind):
    """Module and parameter entries need the network."""
    msg = (
        "Module and parameter entries need the network: "
        "`RecorderGroup.from_config(config, net, input_size=...)`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        RecorderGroup.from_config({"a": {"type": kind, "source": "conv1"}})


def test_member_that_is_no_context_manager_raises():
    """A member must have ``__enter__`` and ``__exit__``."""
    msg = (
        "Member 'a' of a `RecorderGroup` must be a context manager (a "
        "`rnet.scope()`, a `CallRecorder`, ...), got int."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        RecorderGroup({"a": 3})


def test_unknown_key_raises_key_error():
    """``group.get`` of a key the group lacks lists the keys."""
    group = RecorderGroup.from_config(
        {"f": {"type": "FunctionOutputs", "source": f"{TOY}.double"}}
    )
    msg = "No recording named 'g'; the group has ['f']."
    with pytest.raises(KeyError, match=f"^{re.escape(repr(msg))}$"):
        group.get("g")


def test_index_out_of_range_raises_index_error():
    """``group.get(key, i)`` past the records says how many there are."""
    group = RecorderGroup.from_config(
        {"f": {"type": "FunctionOutputs", "source": f"{TOY}.double"}}
    )
    with group:
        toy_module.double(1)
    msg = "'f' has 1 records; index 1 is out of range."
    with pytest.raises(IndexError, match=f"^{re.escape(msg)}$"):
        group.get("f", 1)


# ====================================================== entering and leaving


def raise_inside(context, body=None):
    """Enter ``context``, run ``body`` if given, then raise ``ValueError("boom")``."""
    with context:
        if body is not None:
            body()
        msg = "boom"
        raise ValueError(msg)


class Fake:
    """A context manager that logs its entries and exits, or fails to enter."""

    def __init__(self, name, log, *, fail=False):
        self.name, self.log, self.fail = name, log, fail

    def __enter__(self):
        if self.fail:
            msg = f"{self.name} cannot enter"
            raise RuntimeError(msg)
        self.log.append(f"enter {self.name}")
        return self

    def __exit__(self, *exc):
        self.log.append(f"exit {self.name}")


def test_members_are_entered_in_order_and_exited_in_reverse():
    """One ``with`` enters every member, then exits them last-in first-out."""
    log = []
    group = RecorderGroup({key: Fake(key, log) for key in "abc"})
    with group:
        log.append("body")
    assert log == [
        "enter a",
        "enter b",
        "enter c",
        "body",
        "exit c",
        "exit b",
        "exit a",
    ]


def test_members_are_exited_when_the_block_raises():
    """An exception in the block still exits every member."""
    log = []
    group = RecorderGroup({key: Fake(key, log) for key in "ab"})
    with pytest.raises(ValueError, match=r"^boom$"):
        raise_inside(group)
    assert log == ["enter a", "enter b", "exit b", "exit a"]


def test_failed_enter_exits_the_members_already_entered():
    """``b`` fails to enter: ``a`` is exited, ``c`` never entered."""
    log = []
    b = Fake("b", log, fail=True)
    group = RecorderGroup({"a": Fake("a", log), "b": b, "c": Fake("c", log)})
    with pytest.raises(RuntimeError, match=r"^b cannot enter$"):
        group.__enter__()
    assert log == ["enter a", "exit a"]
    b.fail = False
    with group:  # the group was not left half open
        pass
    assert log[2:] == ["enter a", "enter b", "enter c", "exit c", "exit b", "exit a"]


def test_failed_enter_unpatches_and_unhooks_the_members_already_entered():
    """A scope and a CallRecorder entered before the failing member are undone."""
    model = TwiceConv()
    rnet = Recorder(model, input_size=X)
    rnet.record("conv1")
    before = module_hooks(model)
    original = vars(toy_module)["double"]
    group = RecorderGroup(
        {
            "scope": rnet.scope(),
            "calls": CallRecorder(f"{TOY}.double"),
            "bad": Fake("bad", [], fail=True),
        }
    )
    with pytest.raises(RuntimeError, match=r"^bad cannot enter$"):
        group.__enter__()
    assert module_hooks(model) == before
    assert vars(toy_module)["double"] is original
    rnet.record("conv2")  # no scope is left open on the recorder


def test_group_cannot_be_entered_twice_at_once():
    """A group already open refuses a second ``with``."""
    group = RecorderGroup({"a": contextlib.nullcontext()})
    with group, pytest.raises(RuntimeError, match=r"^This group is already open\.$"):
        group.__enter__()


def test_user_members_are_read_by_key():
    """A scope member reads with ``data``; a CallRecorder member too."""
    model = TwiceConv()
    rnet = Recorder(model, input_size=X)
    rnet.record("conv2")
    doubles = CallRecorder(f"{TOY}.double")
    group = RecorderGroup({"out": rnet.scope(), "double": doubles})
    x = torch.randn(X)
    with group:
        model(x)
        toy_module.double(21)
    expected = conv(model.conv2, conv(model.conv1, x) + conv(model.conv1, x + 1))
    (record,) = group.data("out")
    torch.testing.assert_close(record, expected)
    assert group.data("double") == [42]
    assert group["double"] is doubles


# ====================================================== nothing left behind


def config_group():
    model = ManagerModel()
    group = RecorderGroup.from_config(
        {
            "conv1_rec": {"type": "ModuleOutputs", "source": "conv1"},
            "in_rec": {"type": "ModuleInputs", "source": "conv2"},
            "func_rec": {"type": "MethodOutputs", "source": f"{TOY}.Toy.toy_func"},
        },
        model,
        input_size=X,
    )
    return model, group


def test_block_leaves_hooks_and_methods_as_before():
    """After the block: the same hooks as before it, the method restored."""
    model, group = config_group()
    before = module_hooks(model)
    original = vars(toy_module.Toy)["toy_func"]
    with group:
        assert vars(toy_module.Toy)["toy_func"] is not original
        model(torch.randn(X))
    assert module_hooks(model) == before
    assert vars(toy_module.Toy)["toy_func"] is original


def test_block_raising_leaves_hooks_and_methods_as_before():
    """An exception in the block: hooks and patches are undone all the same."""
    model, group = config_group()
    before = module_hooks(model)
    original = vars(toy_module.Toy)["toy_func"]
    with pytest.raises(ValueError, match=r"^boom$"):
        raise_inside(group, lambda: model(torch.randn(X)))
    assert module_hooks(model) == before
    assert vars(toy_module.Toy)["toy_func"] is original
    assert len(group.data("conv1_rec")) == 1  # the pass before the error counts


def test_passes_after_the_block_are_not_recorded():
    """Outside the block the model runs unrecorded."""
    model, group = config_group()
    with group:
        model(torch.randn(X))
    model(torch.randn(X))
    model.toy.toy_func()
    assert len(group.data("conv1_rec")) == 1
    assert len(group.data("func_rec")) == 1


def test_deleting_the_group_removes_every_hook():
    """Once the group is collected, no module of the net has a hook."""
    model, group = config_group()
    with group:
        model(torch.randn(X))
    del group
    gc.collect()
    assert all(hooks == ((), (), ()) for hooks in module_hooks(model).values())


def test_no_module_has_a_hook_after_the_block():
    """After the block no module of the net carries any hook."""
    model, group = config_group()
    with group:
        model(torch.randn(X))
    assert all(hooks == ((), (), ()) for hooks in module_hooks(model).values())
