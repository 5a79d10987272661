"""Properties of `Recorder` on random nested `nn.Sequential` nets (hypothesis).

A net is drawn as a *spec* (plain data, so hypothesis shrinks and prints it
well) and built under a drawn torch seed. The oracle walks the net by hand
with functional ops, numbering calls in the order they start: depth is the
nesting level, idx counts calls of that depth from the top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
import torchinfo
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchinfo.enums import Units

from scio_recorder import Recorder

if TYPE_CHECKING:
    from collections.abc import Callable

# Each example seeds torch itself (the autouse `seed` fixture runs once per test).
SETTINGS = settings(max_examples=30, deadline=None)
SUMMARY_KWARGS = {
    "col_names": ("input_size", "output_size", "num_params", "params_percent"),
    "depth": float("inf"),
    "row_settings": ("var_names", "depth"),
    "verbose": 0,
}
LEAVES = ("linear", "relu", "tanh", "identity", "shared")


def specs(max_nesting: int) -> st.SearchStrategy[list]:
    """Return a strategy for the spec of a `Sequential`, nested at most that deep.

    A spec is a list of items: a leaf name from `LEAVES` (``"linear"`` with its
    output width) or a nested spec. ``"shared"`` is one `ReLU` instance reused
    wherever it appears.
    """
    leaf = st.sampled_from(LEAVES).flatmap(
        lambda kind: (
            st.tuples(st.just("linear"), st.integers(1, 4))
            if kind == "linear"
            else st.just(kind)
        )
    )
    if max_nesting == 0:
        return st.lists(leaf, min_size=1, max_size=4)
    return st.lists(leaf | specs(max_nesting - 1), min_size=1, max_size=4)


def build(spec: list, width: int, shared: nn.ReLU) -> tuple[nn.Sequential, int]:
    """Build the `Sequential` of ``spec`` for inputs of ``width`` features."""
    layers: list[nn.Module] = []
    for item in spec:
        if isinstance(item, list):
            layer, width = build(item, width, shared)
        elif isinstance(item, tuple):
            layer, width = nn.Linear(width, item[1]), item[1]
        else:
            layer = {
                "relu": nn.ReLU,
                "tanh": nn.Tanh,
                "identity": nn.Identity,
                "shared": lambda: shared,
            }[item]()
        layers.append(layer)
    return nn.Sequential(*layers), width


def count_shared(spec: list) -> int:
    """Return how many times the shared `ReLU` appears in ``spec``."""
    return sum(
        count_shared(item) if isinstance(item, list) else item == "shared"
        for item in spec
    )


class Pass(NamedTuple):
    """What the oracle computed for one pass."""

    outputs: dict[tuple[int, int], torch.Tensor]  # label -> output, start order
    ends: list[tuple[int, int]]  # labels in the order calls end
    final: torch.Tensor  # what the net returns


def oracle(
    net: nn.Sequential,
    x: torch.Tensor,
    edits: dict[tuple[int, int], Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> Pass:
    """Run ``net`` by hand with functional ops, labelling calls as they start.

    ``edits`` maps labels to postprocessors: the output of that call is
    recorded, then replaced by ``edit(output)`` before the walk goes on.
    """
    edits = edits or {}
    counters: dict[int, int] = {}
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    ends: list[tuple[int, int]] = []

    def run(module: nn.Module, h: torch.Tensor, depth: int) -> torch.Tensor:
        counters[depth] = counters.get(depth, 0) + 1
        label = (depth, counters[depth])
        outputs[label] = h  # placeholder: keeps the start order
        if isinstance(module, nn.Sequential):
            for child in module:
                h = run(child, h, depth + 1)
        elif isinstance(module, nn.Linear):
            h = F.linear(h, module.weight, module.bias)
        elif isinstance(module, nn.ReLU):
            h = torch.relu(h)
        elif isinstance(module, nn.Tanh):
            h = torch.tanh(h)
        else:
            assert isinstance(module, nn.Identity)
        outputs[label] = h
        ends.append(label)
        return edits[label](h) if label in edits else h

    final = run(net, x, 0)
    return Pass(outputs, ends, final)


def shift(amount: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Return a postprocessor adding ``amount``."""
    return lambda tensor: tensor + amount


@st.composite
def cases(draw: st.DrawFn, *, allow_shared: bool = True) -> tuple:
    """Draw ``(net, rnet, x, selection)``: a wrapped random net and labels."""
    spec_strategy = specs(max_nesting=3)
    if not allow_shared:
        spec_strategy = spec_strategy.filter(lambda spec: count_shared(spec) <= 1)
    spec = draw(spec_strategy)
    width = draw(st.integers(1, 4))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    net, _ = build(spec, width, nn.ReLU())
    rnet = Recorder(net, input_size=(1, width))
    x = torch.rand(draw(st.integers(1, 3)), width)
    recordable = [row.label for row in rnet.table.values() if row.recordable]
    selection = draw(st.lists(st.sampled_from(recordable), unique=True))
    return net, rnet, x, selection


@SETTINGS
@given(cases())
def test_labels_are_unique(case):
    """No two rows of the table share a label."""
    _, rnet, _, _ = case
    labels = [row.label for row in rnet.table.rows]
    assert len(set(labels)) == len(labels)


@SETTINGS
@given(cases())
def test_table_has_one_row_per_call_labelled_by_start_order(case):
    """The rows are the calls, labelled `(depth, idx)` in the order they start."""
    net, rnet, x, _ = case
    assert list(rnet.table) == list(oracle(net, x).outputs)


@SETTINGS
@given(cases())
def test_records_equal_the_oracle(case):
    """Each recorded label holds the output of that call, computed by hand."""
    net, rnet, x, selection = case
    rnet.record(*selection)
    rnet(x)
    expected = oracle(net, x).outputs
    assert set(rnet.activations) == set(selection)
    for label in selection:
        torch.testing.assert_close(rnet.activations[label], expected[label])


@SETTINGS
@given(cases())
def test_postproc_list_applies_in_the_order_calls_end(case):
    """List items edit the recorded calls in the order those calls end."""
    net, rnet, x, selection = case
    rnet.record(*selection)
    # One more item than needed: extra items must be ignored.
    funcs = [shift(i + 1) for i in range(len(selection) + 1)]
    fired = [label for label in oracle(net, x).ends if label in selection]
    edited = oracle(net, x, dict(zip(fired, funcs, strict=False)))
    out = rnet(x, activation_postproc=funcs)
    torch.testing.assert_close(out, edited.final)
    assert list(rnet.activations) == fired
    for label in selection:
        torch.testing.assert_close(rnet.activations[label], edited.outputs[label])


@SETTINGS
@given(cases())
def test_output_equals_the_net_output(case):
    """`rnet(x)` is bitwise `net(x)` whatever is recorded."""
    net, rnet, x, selection = case
    rnet.record(*selection)
    assert torch.equal(rnet(x), net(x))


@pytest.mark.slow
@SETTINGS
@given(cases())
def test_hooks_sit_exactly_on_selected_modules(case):
    """Exactly the modules of the selected rows carry a hook, one each."""
    net, rnet, _, selection = case
    rnet.record(*selection)
    selected = {id(rnet.table[label].module) for label in selection}
    hooked = {id(m): len(m._forward_hooks) for m in net.modules() if m._forward_hooks}
    assert hooked == dict.fromkeys(selected, 1)
    assert {id(m) for m in rnet.hooked_modules} == selected


@SETTINGS
@given(cases(allow_shared=False))
def test_table_matches_torchinfo_without_shared_modules(case):
    """Without shared modules the rows are torchinfo's rows, labels in order."""
    net, rnet, x, _ = case
    try:
        summary = torchinfo.summary(net, input_size=(1, x.shape[1]), **SUMMARY_KWARGS)
    finally:
        torchinfo.torchinfo.clear_cached_forward_pass()
    assert list(rnet.table) == [
        (info.depth, info.depth_index) for info in summary.summary_list
    ]


@SETTINGS
@given(cases(allow_shared=False))
def test_summary_repr_matches_torchinfo_without_shared_modules(case):
    """Without shared modules `repr(rnet.summary)` is torchinfo's own table.

    One mend aside: torchinfo 1.8 prints its unit enum as `Units.MEGABYTES`
    on Python >= 3.11 (`M` before); ours prints `M` on every version.
    """
    net, rnet, x, _ = case
    try:
        summary = torchinfo.summary(net, input_size=(1, x.shape[1]), **SUMMARY_KWARGS)
    finally:
        torchinfo.torchinfo.clear_cached_forward_pass()
    theirs = repr(summary)
    for unit in Units:
        theirs = theirs.replace(f"(Units.{unit.name})", f"({unit.value})")
    assert repr(rnet.summary) == theirs
