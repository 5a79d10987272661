"""The passes the library runs on its own leave the user's net as it was.

torchinfo's reference pass puts the whole net in one mode and restores only
the top module's flag; in train mode it also updates BatchNorm running
statistics. Construction, the graph pass and export must leave every
submodule's ``training`` flag, every parameter's ``requires_grad`` and the
whole ``state_dict`` bit-identical.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder._preserve import preserved

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
