"""The passes the library runs on its own leave the user's net as it was.

torchinfo's reference pass puts the whole net in one mode and restores only
the top module's flag; in train mode it also updates BatchNorm running
statistics. Construction, the graph pass and export must leave every
submodule's ``training`` flag, every parameter's ``requires_grad`` and the
whole ``state_dict`` bit-identical.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import types
from typing import TYPE_CHECKING, Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder._net.preserve import ParameterWrites, preserved

if TYPE_CHECKING:
    from collections.abc import Callable

SIZE = (3, 4)  # input_size: a batch of 3 so that train-mode BatchNorm runs
SETTINGS = settings(max_examples=12, deadline=None)


def make_net() -> nn.Sequential:
    """Return a net with dropout, batch norm and parameters at two depths."""
    return nn.Sequential(
        nn.Linear(4, 4),
        nn.Dropout(0.5),
        nn.BatchNorm1d(4),
        nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout()),
        nn.Linear(4, 2),
    )


N_MODULES = len(list(make_net().modules()))
N_PARAMS = len(list(make_net().parameters()))
FLAGS = st.tuples(
    st.lists(st.booleans(), min_size=N_MODULES, max_size=N_MODULES),
    st.lists(st.booleans(), min_size=N_PARAMS, max_size=N_PARAMS),
)


def configured(training: list[bool], grads: list[bool]) -> nn.Sequential:
    """Return :func:`make_net` with these per-module modes and per-parameter flags."""
    net = make_net()
    for module, flag in zip(net.modules(), training, strict=True):
        module.training = flag
    for param, flag in zip(net.parameters(), grads, strict=True):
        param.requires_grad_(flag)
    # Running statistics that differ from the initial ones, so that a pass
    # that updates them (or resets them) shows.
    for module in net.modules():
        if isinstance(module, nn.BatchNorm1d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2)
            module.num_batches_tracked.fill_(7)
    return net


def state(net: nn.Module) -> tuple[list[bool], list[bool], dict[str, torch.Tensor]]:
    """Return the modes, ``requires_grad`` flags and a copy of the state dict."""
    return (
        [module.training for module in net.modules()],
        [param.requires_grad for param in net.parameters()],
        {key: value.clone() for key, value in net.state_dict().items()},
    )


def assert_unchanged(net: nn.Module, before: Any) -> None:
    """Assert that ``net`` is bit-identical to the snapshot ``before``."""
    training, grads, tensors = state(net)
    assert training == before[0], "a submodule's training flag changed"
    assert grads == before[1], "a parameter's requires_grad changed"
    changed = [k for k, v in tensors.items() if not torch.equal(v, before[2][k])]
    assert changed == [], f"state_dict entries changed: {changed}"


def construct(net: nn.Module, mode: str) -> Recorder:
    return Recorder(net, input_size=SIZE, mode=mode)


def construct_compiled(net: nn.Module, mode: str) -> Recorder:
    rnet = Recorder(torch.compile(net, backend="eager"), input_size=SIZE, mode=mode)
    rnet.compile(backend="eager")
    return rnet


def graph(net: nn.Module, mode: str) -> Recorder:
    rnet = Recorder(net, input_size=SIZE, mode=mode)
    rnet.record((1, 3))
    rnet.graph()
    return rnet


def export(net: nn.Module, mode: str) -> Recorder:
    rnet = Recorder(net, input_size=SIZE, mode=mode)
    rnet.record((1, 3))
    rnet.export(torch.rand(*SIZE))
    return rnet


OPERATIONS: list[Callable[[nn.Module, str], Recorder]] = [
    construct,
    construct_compiled,
    graph,
]


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda f: f.__name__)
@SETTINGS
@given(flags=FLAGS)
def test_passes_leave_modes_grads_and_state_dict(
    operation: Callable[[nn.Module, str], Recorder],
    mode: str,
    flags: tuple[list[bool], list[bool]],
) -> None:
    """Any per-module modes and ``requires_grad`` flags survive bit-identically."""
    net = configured(*flags)
    before = state(net)
    operation(net, mode)
    assert_unchanged(net, before)


@pytest.mark.parametrize("mode", ["eval", "train"])
@settings(max_examples=5, deadline=None)
@given(flags=FLAGS)
def test_export_leaves_modes_grads_and_state_dict(
    mode: str, flags: tuple[list[bool], list[bool]]
) -> None:
    """Export (slow: fewer examples) leaves the net as it was too."""
    net = configured(*flags)
    before = state(net)
    export(net, mode)
    assert_unchanged(net, before)


def test_frozen_submodules_stay_frozen_in_a_train_mode_net() -> None:
    """The example of the issue: Dropout and BatchNorm frozen inside a train net."""
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(), nn.BatchNorm1d(4))
    net[1].eval()
    net[2].eval()
    Recorder(net, input_size=(2, 4))
    assert [m.training for m in net] == [True, False, False]
    assert net.training


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_batchnorm_running_stats_untouched(mode: str) -> None:
    """A train-mode reference pass does not move BatchNorm's running statistics."""
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    before = {key: value.clone() for key, value in net.state_dict().items()}
    objects = dict(net.named_buffers())
    rnet = Recorder(net, input_size=(8, 4), mode=mode)
    assert rnet.table.mode == mode
    after = net.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[key], before[key]) for key in before)
    assert int(net[1].num_batches_tracked) == 0
    # The buffer objects are the ones registered before (restored in place).
    assert all(buffer is objects[name] for name, buffer in net.named_buffers())


def test_modes_restored_when_the_reference_pass_raises() -> None:
    """A failing reference pass still puts every flag back."""

    class Failing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout()
            self.bn = nn.BatchNorm1d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.bn(x)
            msg = "boom"
            raise ValueError(msg)

    net = Failing()
    net.drop.eval()
    before = state(net)
    with pytest.raises(RuntimeError, match="Failed to run torchinfo"):
        Recorder(net, input_size=(3, 4), mode="train", force_static_flow=False)
    assert_unchanged(net, before)


def test_swapped_parameters_and_hook_state_are_put_back() -> None:
    """Parameters swapped in a pass and an accelerate-style hook's state return.

    The hook is a stand-in with the attributes accelerate's ``AlignDevicesHook``
    changes during a pass (found by the ``_hf_hook`` attribute): the shared map
    of tied weights loaded on a device, and the per-pass bookkeeping.
    """
    net = nn.Sequential(nn.Linear(2, 2))
    tied: dict[int, dict[str, torch.Tensor]] = {7: {}}
    hook = types.SimpleNamespace(tied_params_map=tied, input_device=None)
    net[0]._hf_hook = hook  # type: ignore[assignment]
    weight = net[0].weight
    with preserved(net):
        net[0]._parameters["weight"] = nn.Parameter(torch.zeros(2, 2))
        tied[7]["cpu"] = torch.ones(1)  # a weight left loaded by a failed pass
        tied[8] = {}
        hook.input_device = torch.device("cpu")
        hook.tied_pointers_to_remove = {(7, "cpu")}
    assert net[0].weight is weight
    assert tied == {7: {}}
    assert hook.tied_params_map is tied
    assert vars(hook) == {"tied_params_map": tied, "input_device": None}


class Guarded(nn.Module):
    """Switches to a safe mode for good once it has seen a non-finite input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.safe = False
        self.log: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        if self.safe:
            out = out.clamp(-1, 1)
        if not torch.isfinite(x).all():
            self.safe = True
            self.log.append("non-finite")
        return out


@pytest.mark.parametrize("reference_tensors", ["real", "fake"])
def test_forced_branches_leave_the_nets_attributes(reference_tensors: str) -> None:
    """The static-flow check forces the read the other way: its branch's effects go.

    The forced pass runs ``self.safe = True`` (a branch no real data reached);
    before the fix the attribute stayed, and the plain net clamped its
    output from then on.
    """
    torch.manual_seed(0)
    net = Guarded().eval()
    x = 3 * torch.randn(2, 4)
    with torch.no_grad():
        before = net(x)
    assert before.abs().max() > 1  # so that a clamp would show
    log = net.log
    with contextlib.ExitStack() as stack:
        if reference_tensors == "fake":  # the fake pass reads: the real pass runs
            stack.enter_context(pytest.warns(UserWarning, match="ran on real tensors"))
        Recorder(net, input_data=[x], reference_tensors=reference_tensors)
    assert net.safe is False
    assert net.log == []
    assert net.log is log
    with torch.no_grad():
        assert torch.equal(net(x), before)  # the same net, the same computation


@dataclasses.dataclass
class Config:
    """A dataclass a module holds (as a Hugging Face config)."""

    scale: float = 1.0
    seen: list[int] = dataclasses.field(default_factory=list)


def test_plain_attributes_and_their_containers_are_put_back() -> None:
    """Attributes set, rebound, deleted; containers changed in place: put back."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    config = Config()
    inner = {"a": [1, 2]}
    state = types.SimpleNamespace(count=0, history=[(inner, {3})])
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    net[0].config = config
    net[1].config = config  # shared, as a config is
    net[0].state = state
    net[0].cyclic = cyclic
    net[1].gone = "deleted in the pass"
    with preserved(net):
        net[0].new = 1
        del net[1].gone
        net[0].config = Config(scale=2.0)
        config.scale = 3.0
        config.seen.append(1)
        state.count += 1
        inner["a"].append(3)
        inner["b"] = []
        state.history[0][1].add(4)
        cyclic.append(5)
        net[0].in_features = 5
    assert not hasattr(net[0], "new")
    assert net[1].gone == "deleted in the pass"
    assert net[0].config is config
    assert net[1].config is config
    assert config == Config()
    assert net[0].state is state
    assert state.count == 0
    assert state.history[0][0] is inner
    assert inner == {"a": [1, 2]}
    assert state.history[0][1] == {3}
    assert cyclic == [cyclic]
    assert net[0].in_features == 2  # Linear(2, 2)


@dataclasses.dataclass(slots=True)
class SlottedConfig:
    """A dataclass without ``__dict__``: its fields are slots."""

    calls: int = 0
    seen: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlotted:
    """Frozen: the pass can change it only through ``object.__setattr__``."""

    tag: str = "a"


def test_slotted_dataclasses_are_put_back() -> None:
    """``slots=True`` dataclasses (no ``__dict__``): fields and containers put back."""
    net = nn.Sequential(nn.Linear(2, 2))
    config, frozen = SlottedConfig(), FrozenSlotted()
    seen = config.seen
    net[0].config = config
    net[0].frozen = frozen
    with preserved(net):
        config.calls += 1
        config.seen.append(1)
        object.__setattr__(frozen, "tag", "b")
    assert net[0].config is config
    assert config.calls == 0
    assert config.seen is seen
    assert seen == []
    assert frozen.tag == "a"


class ActNorm(nn.Module):
    """Glow's ActNorm: a data-dependent initialization on its first forward.

    Once trained, ``initialized`` is true and the branch never runs; the
    static-flow check forces it (a yes/no read of a buffer).
    """

    def __init__(self, channels: int, write: str) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(channels))
        self.scale = nn.Parameter(torch.ones(channels))
        self.register_buffer("initialized", torch.tensor(data=False))
        self.write = write

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:  # a branch on the rank: no fx trace
            x = x.flatten(0, 1)
        if not self.initialized:
            with torch.no_grad():
                loc, scale = -x.mean(0), 1 / (x.std(0) + 1e-6)
                if self.write == "copy_":
                    self.loc.copy_(loc)
                    self.scale.copy_(scale)
                elif self.write == ".data":
                    self.loc.data.copy_(loc)
                    self.scale.data.mul_(scale)
                elif self.write == "view":
                    self.loc[:2] = loc[:2]
                    torch.mul(self.scale, scale, out=self.scale)
                else:  # rebind .data: no operator writes the old memory
                    self.loc.data = loc.clone()
                    self.scale.data = scale.clone()
                self.initialized.fill_(True)
        return (x + self.loc) * self.scale


@pytest.mark.parametrize("write", ["copy_", ".data", "view", "rebind"])
@pytest.mark.parametrize("force_static_flow", [True, False])
def test_parameters_written_by_a_pass_are_put_back(
    write: str, force_static_flow: bool
) -> None:
    """A forced branch initializing parameters: refused or not, the net is as it was.

    Before the fix, the refused construction left ``loc`` and ``scale`` from
    its random input (the net's output off by 5.7), and the one built with
    ``force_static_flow=False`` kept them too.
    """
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), ActNorm(4, write), nn.Linear(4, 2)).eval()
    with torch.no_grad():  # trained: initialized, loc and scale learned
        net[1].loc.copy_(torch.tensor([0.5, -0.5, 1.0, 2.0]))
        net[1].scale.copy_(torch.tensor([2.0, 3.0, 0.5, 1.5]))
        net[1].initialized.fill_(True)
    loc, scale = net[1].loc, net[1].scale
    state = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(5, 4)
    with torch.no_grad():
        before = net(x)
    if force_static_flow:
        with pytest.raises(RuntimeError, match="control flow of the input network"):
            Recorder(net, input_size=(3, 4))
    else:
        Recorder(net, input_size=(3, 4), force_static_flow=False)
    assert net[1].loc is loc
    assert net[1].scale is scale
    for key, value in net.state_dict().items():
        assert torch.equal(value, state[key]), key
    with torch.no_grad():
        assert torch.equal(net(x), before)


def test_a_pass_s_own_parameter_writes_are_put_back_and_named() -> None:
    """Through the parameter, ``.data``, a view, ``out=``, a foreach op: copied once."""
    net = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3, bias=False))
    net[1].weight = net[0].weight  # tied: one parameter, one copy
    before = {k: v.clone() for k, v in net.state_dict().items()}
    guard = ParameterWrites(net)
    with guard, torch.no_grad():
        net[0].weight.data[0].fill_(7.0)
        torch.add(net[0].bias, 1, out=net[0].bias)
        torch._foreach_mul_([net[0].weight, net[0].bias], 2.0)
        _ = net(torch.ones(1, 3))  # reads write nothing
    assert guard.written() == ["0.weight", "0.bias"]
    guard.restore()
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert guard.written() == []


def test_a_lazy_module_keeps_what_its_materialization_set() -> None:
    """``in_features``, set when the pass materializes the weight, stays."""
    net = nn.Sequential(nn.LazyLinear(3))
    Recorder(net, input_size=(1, 5))
    assert net[0].in_features == 5  # the input's width
    assert net[0].weight.shape == (3, 5)
    assert net(torch.zeros(1, 5)).shape == (1, 3)


# Nested containers as a module's attributes, and edits a pass makes to them.
LEAVES = st.one_of(st.integers(-3, 3), st.text(max_size=2), st.none())
NESTED = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.builds(
            lambda d: types.SimpleNamespace(**d),
            st.dictionaries(st.sampled_from(["p", "q"]), inner, max_size=2),
        ),
    ),
    max_leaves=10,
)


def containers(value: Any) -> list[Any]:
    """Every list, dict and namespace in ``value``, depth first."""
    found = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, types.SimpleNamespace):
            found.append(item)
            stack.extend(vars(item).values())
        elif isinstance(item, dict):
            found.append(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            if isinstance(item, list):
                found.append(item)
            stack.extend(item)
    return found


def edit(item: Any, choice: int) -> None:
    """Change ``item`` in place, one of three ways."""
    if isinstance(item, types.SimpleNamespace):
        item = vars(item)
    way = choice % 3
    if isinstance(item, dict):
        if way == 0 or not item:
            item["z"] = [9]
        elif way == 1:
            item.popitem()
        else:
            item.clear()
    elif way == 0 or not item:
        item.append([9])
    elif way == 1:
        item.clear()
    else:
        item.insert(0, item.pop())


@SETTINGS
@given(value=NESTED, choices=st.lists(st.integers(0, 10), min_size=1, max_size=4))
def test_any_nested_containers_are_put_back(value: Any, choices: list[int]) -> None:
    """Whatever a pass changes in them, in place: equal, and the same objects."""
    net = nn.Sequential(nn.Linear(2, 2))
    net[0].value = value
    before = copy.deepcopy(value)
    found = containers(value)
    with preserved(net):
        for choice in choices:
            if found:
                edit(found[choice % len(found)], choice)
    assert net[0].value is value
    assert repr(value) == repr(before)
    assert [id(c) for c in containers(value)] == [id(c) for c in found]


def test_a_move_to_meta_is_undone_parameters_and_buffers_together() -> None:
    """``net.to("meta")`` in a pass: parameters (swapped) and buffers put back.

    A move to a real device (torchinfo's ``model.to("cuda")``, kept as the
    reference Recorder keeps it) is tested on a GPU (``tests/test_gpu.py``).
    """
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    state = {k: v.clone() for k, v in net.state_dict().items()}
    with preserved(net):
        net.to("meta")
    assert {t.device.type for t in [*net.parameters(), *net.buffers()]} == {"cpu"}
    for key, value in net.state_dict().items():
        assert torch.equal(value, state[key]), key
