"""Scopes: records of many passes, reduced across passes (torchfunc parity).

Every reduction is checked against the same reduction done by hand over the
layers applied with functional ops, pass by pass.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import threading

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import CallPlanError, Recorder, children
from scio_recorder.reduce import Keep, Sum

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def mnist_mlp():
    """torchfunc's example MLP for MNIST."""
    return nn.Sequential(
        nn.Linear(784, 100),
        nn.ReLU(),
        nn.Linear(100, 50),
        nn.ReLU(),
        nn.Linear(50, 10),
    )


def small():
    """``Linear(3, 4), ReLU, Linear(4, 2)``."""
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def small_by_hand(net, x):
    """Return ``{label: output}`` of :func:`small`, by hand."""
    h1 = F.linear(x, net[0].weight, net[0].bias)
    h2 = torch.relu(h1)
    return {(1, 1): h1, (1, 2): h2, (1, 3): F.linear(h2, net[2].weight, net[2].bias)}


@pytest.fixture
def net():
    return small()


@pytest.fixture
def rnet(net):
    return Recorder(net, input_size=(1, 3))


@pytest.fixture
def batches():
    return [torch.randn(4, 3) for _ in range(3)]


def net_hooks(net):
    """Return the sizes of the hook dicts of ``net`` itself."""
    return (
        len(net._forward_hooks),
        len(net._forward_pre_hooks),
        len(net._forward_hooks_always_called),
    )


# ================================================================== torchfunc


def test_torchfunc_example_summing_inputs_via_relu_outputs():
    """Inputs of Linear(100, 50) and Linear(50, 10) summed = ReLU outputs summed."""
    net = mnist_mlp()
    rnet = Recorder(net, input_size=(1, 784))
    # the ReLUs at indices 1 and 3 feed the Linear layers at indices 2 and 4
    rnet.record(children(indices=(1, 3)))
    images = [torch.randn(16, 784) for _ in range(3)]
    with rnet.scope("sum") as scope:
        for batch in images:
            net(batch)

    total_2 = torch.zeros(16, 100, dtype=torch.float64)
    total_4 = torch.zeros(16, 50, dtype=torch.float64)
    for batch in images:
        h = torch.relu(F.linear(batch, net[0].weight, net[0].bias))
        total_2 += h.double()
        total_4 += torch.relu(F.linear(h, net[2].weight, net[2].bias)).double()
    torch.testing.assert_close(scope[(1, 2)], total_2)
    torch.testing.assert_close(scope[(1, 4)], total_4)
    assert scope.count == {(1, 2): 3, (1, 4): 3}


def test_torchfunc_example_summing_recorded_inputs():
    """The same sums from ``children(indices=(2, 4))`` inputs, summed by hand."""
    net = mnist_mlp()
    rnet = Recorder(net, input_size=(1, 784))
    rnet.record(inputs=children(indices=(2, 4)))
    images = [torch.randn(16, 784) for _ in range(3)]
    with rnet.scope() as scope:
        for batch in images:
            net(batch)
    assert list(scope) == []  # no output is recorded
    assert {label: len(v) for label, v in scope.inputs.items()} == {
        (1, 3): 3, (1, 5): 3
    }  # fmt: skip
    summed = {
        label: sum(call.args[0] for call in calls)
        for label, calls in scope.inputs.items()
    }

    expected_2 = expected_4 = 0
    for batch in images:
        h = torch.relu(F.linear(batch, net[0].weight, net[0].bias))
        expected_2 = expected_2 + h
        expected_4 = expected_4 + torch.relu(F.linear(h, net[2].weight, net[2].bias))
    torch.testing.assert_close(summed[(1, 3)], expected_2)
    torch.testing.assert_close(summed[(1, 5)], expected_4)


# ================================================================= reductions


def passes_by_hand(net, batches, label):
    return [small_by_hand(net, x)[label] for x in batches]


def test_reduce_all_keeps_every_pass(rnet, net, batches):
    """``"all"`` (the default) gives the list of every pass's record."""
    rnet.record("0")
    with rnet.scope() as scope:
        for x in batches:
            net(x)
    records = scope[(1, 1)]
    assert isinstance(records, list)
    for record, expected in zip(
        records, passes_by_hand(net, batches, (1, 1)), strict=True
    ):
        torch.testing.assert_close(record, expected)


def test_reduce_sum_equals_manual_sum(rnet, net, batches):
    """``"sum"`` is the elementwise sum across passes, in float64."""
    rnet.record("0")
    with rnet.scope("sum") as scope:
        for x in batches:
            net(x)
    expected = sum(r.double() for r in passes_by_hand(net, batches, (1, 1)))
    assert scope[(1, 1)].dtype == torch.float64
    torch.testing.assert_close(scope[(1, 1)], expected)


def test_reduce_mean_equals_manual_mean(rnet, net, batches):
    """``"mean"`` is the elementwise mean across passes, in float64."""
    rnet.record("2")
    with rnet.scope("mean") as scope:
        for x in batches:
            rnet(x)
    records = passes_by_hand(net, batches, (1, 3))
    expected = sum(r.double() for r in records) / len(records)
    torch.testing.assert_close(scope[(1, 3)], expected)


@pytest.mark.parametrize(
    ("name", "fold"), [("max", torch.maximum), ("min", torch.minimum)]
)
def test_reduce_max_and_min_equal_manual_folds(rnet, net, batches, name, fold):
    """``"max"``/``"min"`` fold elementwise, keeping the record dtype."""
    rnet.record("0")
    with rnet.scope(name) as scope:
        for x in batches:
            net(x)
    records = passes_by_hand(net, batches, (1, 1))
    expected = records[0]
    for record in records[1:]:
        expected = fold(expected, record)
    assert scope[(1, 1)].dtype == torch.float32
    torch.testing.assert_close(scope[(1, 1)], expected)


def test_reduce_callable_folds_with_it(rnet, net, batches):
    """A function ``(acc, new) -> acc`` folds the records in pass order."""
    rnet.record("0")
    with rnet.scope(lambda acc, new: 0.5 * acc + new) as scope:
        for x in batches:
            net(x)
    records = passes_by_hand(net, batches, (1, 1))
    expected = 0.5 * (0.5 * records[0] + records[1]) + records[2]
    torch.testing.assert_close(scope[(1, 1)], expected)


def test_reduce_reducer_object_is_a_template_per_label(rnet, net, batches):
    """One ``Sum()`` given: each label gets its own fresh copy; it stays empty."""
    template = Sum()
    rnet.record("0", "2")
    with rnet.scope(template) as scope:
        for x in batches:
            net(x)
    for label in [(1, 1), (1, 3)]:
        expected = sum(r.double() for r in passes_by_hand(net, batches, label))
        torch.testing.assert_close(scope[label], expected)
    assert template.count == 0


def test_reduce_keep_reducer_equals_all(rnet, net, batches):
    """``Keep()`` gives the same list as ``"all"``."""
    rnet.record("1")
    with rnet.scope(Keep()) as scope:
        for x in batches:
            net(x)
    records = scope[(1, 2)]
    for record, expected in zip(
        records, passes_by_hand(net, batches, (1, 2)), strict=True
    ):
        torch.testing.assert_close(record, expected)


def test_reduce_dict_gives_each_label_its_reduction(rnet, net, batches):
    """A dict maps labels (or names) to reductions; others keep every record."""
    rnet.record("0", "1", "2")
    with rnet.scope({(1, 1): "sum", "2": "max"}) as scope:
        for x in batches:
            net(x)
    torch.testing.assert_close(
        scope[(1, 1)], sum(r.double() for r in passes_by_hand(net, batches, (1, 1)))
    )
    torch.testing.assert_close(
        scope[(1, 3)], torch.stack(passes_by_hand(net, batches, (1, 3))).amax(0)
    )
    assert len(scope[(1, 2)]) == 3


def test_unknown_reduction_fails_when_the_scope_is_made(rnet):
    """A bad name is refused by ``rnet.scope(...)``, before any pass."""
    msg = (
        "unknown reduction 'median'; valid names: 'all', 'keep', 'sum', 'mean', "
        "'max', 'min' (or pass a callable fn(acc, new) -> acc, or a Reducer)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.scope("median")


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    name=st.sampled_from(["sum", "mean", "max", "min"]),
)
def test_named_reductions_equal_manual_reductions(rnet, net, sizes, name):
    """For any number of passes, each named reduction equals the manual one."""
    rnet.record("0")
    batches = [torch.randn(2, 3) * size for size in sizes]
    with rnet.scope(name) as scope:
        for x in batches:
            net(x)
    stacked = torch.stack(passes_by_hand(net, batches, (1, 1)))
    expected = {
        "sum": stacked.double().sum(0),
        "mean": stacked.double().mean(0),
        "max": stacked.amax(0),
        "min": stacked.amin(0),
    }[name]
    torch.testing.assert_close(scope[(1, 1)], expected)
    assert scope.passes == scope.count[(1, 1)] == len(sizes)


# ============================================================ passes, counts


def test_condition_keeps_only_passes_where_it_is_true(rnet, net, batches):
    """``condition`` is asked at each pass; only kept passes are reduced."""
    keep = iter([True, False, True])
    rnet.record("0")
    with rnet.scope("sum", condition=lambda: next(keep)) as scope:
        for x in batches:
            net(x)
    records = passes_by_hand(net, batches, (1, 1))
    torch.testing.assert_close(scope[(1, 1)], records[0].double() + records[2].double())
    assert scope.count == {(1, 1): 2}
    assert scope.passes == 3


def test_condition_keeps_inputs_of_kept_passes_only(rnet, net, batches):
    """Inputs follow the condition too."""
    keep = iter([False, True, False])
    rnet.record(inputs="2")
    with rnet.scope(condition=lambda: next(keep)) as scope:
        for x in batches:
            net(x)
    (kept,) = scope.inputs[(1, 3)]
    torch.testing.assert_close(kept.args[0], small_by_hand(net, batches[1])[(1, 2)])


def test_count_samples_and_passes(rnet, net):
    """``count`` per label, ``samples`` = sum of batch sizes, ``passes`` overall."""
    rnet.record("0", "2")
    with rnet.scope("sum") as scope:
        for size in (2, 2, 2):
            net(torch.randn(size, 3))
    assert scope.passes == 3
    assert scope.count == {(1, 1): 3, (1, 3): 3}
    assert scope.samples == {(1, 1): 6, (1, 3): 6}


def test_samples_counts_batches_of_different_sizes(rnet, net):
    """With ``"all"`` batches may differ in size; samples add up."""
    rnet.record("0")
    with rnet.scope() as scope:
        for size in (1, 5, 2):
            net(torch.randn(size, 3))
    assert scope.samples == {(1, 1): 8}
    assert [r.shape[0] for r in scope[(1, 1)]] == [1, 5, 2]


def test_scope_before_any_pass_is_empty(rnet):
    """A scope with no pass has no label, and indexing it raises KeyError."""
    rnet.record("0")
    with rnet.scope() as scope:
        pass
    assert scope.passes == 0
    assert len(scope) == 0
    assert (1, 1) not in scope
    msg = (
        "No output of (1, 1) was fed to this scope: record it with "
        "`rnet.record(...)` before entering the scope, and run a pass."
    )
    with pytest.raises(KeyError, match=f"^{re.escape(repr(msg))}$"):
        scope[(1, 1)]


def test_direct_net_calls_and_recorder_calls_are_both_passes(rnet, net, batches):
    """``net(x)`` and ``rnet(x)`` inside the block each add one pass."""
    rnet.record("0")
    with rnet.scope() as scope:
        net(batches[0])
        rnet(batches[1])
        net(batches[2])
    assert scope.passes == 3
    for record, expected in zip(
        scope[(1, 1)], passes_by_hand(net, batches, (1, 1)), strict=True
    ):
        torch.testing.assert_close(record, expected)


def test_direct_net_call_publishes_activations(rnet, net, batches):
    """A direct pass inside the block also updates ``rnet.activations``."""
    rnet.record("0")
    with rnet.scope():
        net(batches[0])
        torch.testing.assert_close(
            rnet.activations[(1, 1)], small_by_hand(net, batches[0])[(1, 1)]
        )


def test_calls_after_the_block_are_not_recorded(rnet, net, batches):
    """Once the block ends, direct calls feed nothing."""
    rnet.record("0")
    with rnet.scope() as scope:
        net(batches[0])
    net(batches[1])
    rnet(batches[2])
    assert scope.passes == 1
    assert len(scope[(1, 1)]) == 1


def test_submodule_called_alone_is_not_a_pass(rnet, net, batches):
    """Calling a recorded submodule directly is no pass of the net."""
    rnet.record("0")
    with rnet.scope() as scope:
        net[0](batches[0])
    assert scope.passes == 0


# ============================================================ errors, cleanup


class Branchy(nn.Module):
    """Calls ``lin`` twice when the input sums to a positive number."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        if x.sum() > 0:
            h = self.lin(h)
        return h


def test_extra_call_inside_a_scope_raises_call_plan_error():
    """A direct pass calling ``lin`` twice (table: once) raises; later passes count."""
    net = Branchy()
    rnet = Recorder(net, input_data=-torch.ones(1, 3), force_static_flow=False)
    rnet.record("lin")
    with rnet.scope() as scope:
        net(-torch.ones(1, 3))
        with pytest.raises(CallPlanError, match="was called at least 2 times"):
            net(torch.ones(1, 3))
        net(-2 * torch.ones(1, 3))
    assert scope.passes == 2
    expected = [
        F.linear(v * torch.ones(1, 3), net.lin.weight, net.lin.bias) for v in (-1, -2)
    ]
    for record, manual in zip(scope[(1, 1)], expected, strict=True):
        torch.testing.assert_close(record, manual)


def test_missing_call_inside_a_scope_raises_call_plan_error():
    """A direct pass calling ``lin`` once (table: twice) raises; later passes count."""
    net = Branchy()
    rnet = Recorder(net, input_data=torch.ones(1, 3), force_static_flow=False)
    rnet.record(("lin", 1))
    with rnet.scope() as scope:
        net(torch.ones(1, 3))
        with pytest.raises(CallPlanError, match=re.escape("Missing [(1, 2)]")):
            net(-torch.ones(1, 3))
        assert dict(rnet.activations) == {}
        net(2 * torch.ones(1, 3))
    assert scope.passes == 2
    assert scope.count == {(1, 2): 2}


class Fragile(nn.Module):
    """Raises ``exc`` after its first layer when ``exc`` is set."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.exc = None

    def forward(self, x):
        h = self.lin(x)
        if self.exc is not None:
            raise self.exc
        return torch.relu(h)


def fragile_scope(exc_type):
    """Run 3 direct passes, the second raising ``exc_type``; return the scope."""
    net = Fragile()
    rnet = Recorder(net, input_size=(1, 3), force_static_flow=False)
    rnet.record("lin")
    values = [1.0, 2.0, 3.0]
    with rnet.scope() as scope:
        for value in values:
            net.exc = exc_type("boom") if value == 2.0 else None
            with contextlib.suppress(exc_type):
                net(value * torch.ones(1, 3))
    expected = [
        F.linear(v * torch.ones(1, 3), net.lin.weight, net.lin.bias) for v in (1.0, 3.0)
    ]
    return scope, expected


def test_exception_in_the_net_drops_the_partial_pass():
    """A pass that raised (caught in the block) is dropped; the next is right."""
    scope, expected = fragile_scope(ValueError)
    assert scope.passes == 2
    for record, manual in zip(scope[(1, 1)], expected, strict=True):
        torch.testing.assert_close(record, manual)


def test_keyboard_interrupt_in_the_net_drops_the_partial_pass():
    """A KeyboardInterrupt caught in the block is dropped like any exception."""
    scope, expected = fragile_scope(KeyboardInterrupt)
    assert scope.passes == 2
    for record, manual in zip(scope[(1, 1)], expected, strict=True):
        torch.testing.assert_close(record, manual)


def test_block_leaves_no_hook_on_the_net(rnet, net, batches):
    """After the block the net's hook dicts are back to their sizes before."""
    rnet.record("")  # a hook of the recorder itself on the net
    before = net_hooks(net)
    with rnet.scope():
        assert net_hooks(net) != before
        net(batches[0])
    assert net_hooks(net) == before


def raise_inside(context):
    """Enter ``context`` and raise ``ValueError("boom")`` in the block."""
    with context:
        msg = "boom"
        raise ValueError(msg)


def test_block_raising_leaves_no_hook_on_the_net(rnet, net):
    """An exception leaving the block still removes the scope's hooks."""
    rnet.record("0")
    before = net_hooks(net)
    with pytest.raises(ValueError, match=r"^boom$"):
        raise_inside(rnet.scope())
    assert net_hooks(net) == before
    rnet.record("2")  # the recorder accepts a new selection again


def test_scopes_of_two_recorders_closed_out_of_order_keep_recording(net):
    """Closing the first-opened scope first leaves the other one recording."""
    first = Recorder(net, input_size=(1, 3))
    first.record("0")
    second = Recorder(net, input_size=(1, 3))
    second.record("2")
    scope_1, scope_2 = first.scope(), second.scope()
    x = torch.randn(2, 3)

    def out_of_order():
        scope_1.__enter__()
        scope_2.__enter__()
        scope_1.__exit__(None, None, None)
        net(x)
        scope_2.__exit__(None, None, None)

    contextvars.copy_context().run(out_of_order)  # no state leaks to other tests
    assert scope_2.passes == 1
    (record,) = scope_2[(1, 3)]
    torch.testing.assert_close(record, small_by_hand(net, x)[(1, 3)])


def test_record_inside_an_open_scope_raises(rnet):
    """Changing the selection in the block is refused."""
    rnet.record("0")
    msg = (
        "Cannot change the selection while a `rnet.scope()` is open: its records "
        "would mix two selections. Call `rnet.record(...)` before entering the scope."
    )
    with rnet.scope(), pytest.raises(RuntimeError, match=f"^{re.escape(msg)}$"):
        rnet.record("2")
    assert rnet.recording == ((1, 1),)


def test_scope_cannot_be_entered_twice_at_once(rnet):
    """A scope already open refuses a second ``with``."""
    scope = rnet.scope()
    msg = "This scope is already open; use `rnet.scope()` for another one."
    with scope, pytest.raises(RuntimeError, match=f"^{re.escape(msg)}$"):
        scope.__enter__()


def test_calls_from_another_thread_are_not_recorded(rnet, net, batches):
    """Only the thread that opened the scope feeds it."""
    rnet.record("0")
    with rnet.scope() as scope:
        thread = threading.Thread(target=net, args=(batches[0],))
        thread.start()
        thread.join()
        net(batches[1])
    assert scope.passes == 1
    (record,) = scope[(1, 1)]
    torch.testing.assert_close(record, small_by_hand(net, batches[1])[(1, 1)])


# ============================================================ records_of, grads


def test_records_of_gives_pass_major_call_order_records():
    """A ReLU called twice, two passes: pass 1 call 1, pass 1 call 2, pass 2 ..."""
    relu = nn.ReLU()
    net = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record(relu)
    xs = [torch.randn(2, 3), torch.randn(2, 3)]
    with rnet.scope() as scope:
        for x in xs:
            net(x)
    expected = []
    for x in xs:
        first = torch.relu(F.linear(x, net[0].weight, net[0].bias))
        expected += [first, torch.relu(F.linear(first, net[2].weight, net[2].bias))]
    records = scope.records_of(relu)
    assert len(records) == 4
    for record, manual in zip(records, expected, strict=True):
        torch.testing.assert_close(record, manual)


def test_records_of_with_a_reduction_gives_one_result_per_row(rnet, net, batches):
    """With ``"sum"``, ``records_of`` is each selected row's sum, table order."""
    rnet.record(nn.Linear)
    with rnet.scope("sum") as scope:
        for x in batches:
            net(x)
    sums = scope.records_of(nn.Linear)
    for result, label in zip(sums, [(1, 1), (1, 3)], strict=True):
        expected = sum(r.double() for r in passes_by_hand(net, batches, label))
        torch.testing.assert_close(result, expected)


def test_records_of_unfed_selector_raises_key_error(rnet, net, batches):
    """A row that was not recorded has no records in the scope."""
    rnet.record("0")
    with rnet.scope() as scope:
        net(batches[0])
    msg = "No record of '2' was fed to this scope."
    with pytest.raises(KeyError, match=f"^{re.escape(repr(msg))}$"):
        scope.records_of("2")


def test_gradients_are_fed_during_backward_inside_the_block(rnet, net, batches):
    """Each backward in the block feeds the scope's gradients (summed here)."""
    rnet.record(grads="0")
    with rnet.scope("sum") as scope:
        for x in batches:
            net(x).pow(2).sum().backward()
    expected = 0
    for x in batches:
        h1 = F.linear(x, net[0].weight, net[0].bias)
        out = F.linear(torch.relu(h1), net[2].weight, net[2].bias)
        expected = expected + torch.autograd.grad(out.pow(2).sum(), h1)[0].double()
    torch.testing.assert_close(scope.gradients[(1, 1)], expected)


def test_gradients_with_reduce_all_are_kept_per_pass(rnet, net, batches):
    """With ``"all"`` one gradient per backward, in order."""
    rnet.record(grads="2")
    with rnet.scope() as scope:
        for x in batches:
            rnet(x).logsumexp(1).sum().backward()
    grads = scope.gradients[(1, 3)]
    assert len(grads) == 3
    for grad, x in zip(grads, batches, strict=True):
        out = small_by_hand(net, x)[(1, 3)]
        torch.testing.assert_close(grad, torch.softmax(out, 1))


class PairOut(nn.Module):
    """Returns ``(h, h.sum(1))``; both need grad."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        return h, h.sum(1)


class FirstOnly(nn.Module):
    """Uses only the first item of :class:`PairOut`'s output (like HF outputs)."""

    def __init__(self):
        super().__init__()
        self.pair = PairOut()

    def forward(self, x):
        return self.pair(x)[0]


def test_gradient_of_a_tuple_with_an_unused_item_is_fed_with_none():
    """The latest pass shows ``(grad, None)`` for a tuple whose 2nd item is unused."""
    net = FirstOnly()
    rnet = Recorder(net, input_size=(2, 3))
    rnet.record(grads="pair")
    rnet(torch.randn(2, 3)).pow(2).sum().backward()
    grad, unused = rnet.gradients[(1, 1)]
    assert unused is None
    assert grad.shape == (2, 3)


def test_gradient_of_a_tuple_with_an_unused_item_is_fed_to_the_scope():
    """In a scope, each backward feeds ``(grad, None)`` as ``rnet.gradients`` shows."""
    net = FirstOnly()
    rnet = Recorder(net, input_size=(2, 3))
    rnet.record(grads="pair")
    xs = [torch.randn(2, 3), torch.randn(2, 3)]
    with rnet.scope() as scope:
        for x in xs:
            rnet(x).pow(2).sum().backward()
    grads = scope.gradients[(1, 1)]
    assert len(grads) == 2
    for (grad, unused), x in zip(grads, xs, strict=True):
        assert unused is None
        h = F.linear(x, net.pair.lin.weight, net.pair.lin.bias)
        torch.testing.assert_close(grad, 2 * h)


def test_backward_after_the_block_feeds_nothing(rnet, net, batches):
    """A gradient arriving once the block has ended is not fed."""
    rnet.record(grads="0")
    with rnet.scope() as scope:
        out = net(batches[0])
    out.sum().backward()
    assert scope.gradients == {}
    assert rnet.gradients[(1, 1)] is not None  # the latest pass still has it


# ====================================================== condition, once a pass


@pytest.mark.parametrize("direct", [True, False], ids=["net(x)", "rnet(x)"])
def test_stateful_condition_is_asked_once_per_pass_with_gradients(
    rnet, net, batches, direct
):
    """With ``grads=``, ``condition()`` is still asked once a pass, and the
    gradients follow the decision taken for their own pass."""
    answers = [True, False, True, False, True]
    asked = []

    def condition():
        asked.append(answers[len(asked)])
        return asked[-1]

    rnet.record("0", grads="2")
    xs = [torch.randn(4, 3) for _ in answers]
    with rnet.scope("all", condition=condition) as scope:
        for x in xs:
            out = net(x) if direct else rnet(x)
            out.sum().backward()
    assert len(asked) == len(answers)
    assert scope.passes == 5
    assert scope.kept == 3
    kept_x = [x for x, keep in zip(xs, answers, strict=True) if keep]
    assert len(scope[(1, 1)]) == 3
    for record, x in zip(scope[(1, 1)], kept_x, strict=True):
        torch.testing.assert_close(record, small_by_hand(net, x)[(1, 1)])
    # d(sum(out))/d(out) is all ones, one record per kept pass
    grads = scope.gradients[(1, 3)]
    assert len(grads) == 3
    assert all(torch.equal(g, torch.ones(4, 2)) for g in grads)


def test_gradients_of_two_passes_then_one_backward_follow_their_pass(rnet, net):
    """Two passes, then one backward: each gradient follows its own pass."""
    answers = iter([False, True])
    rnet.record(grads="2")
    with rnet.scope("all", condition=lambda: next(answers)) as scope:
        a = rnet(torch.randn(2, 3))
        b = rnet(torch.randn(2, 3))
        (a.sum() + 3 * b.sum()).backward()
    (grad,) = scope.gradients[(1, 3)]
    torch.testing.assert_close(grad, torch.full((2, 2), 3.0))
    assert (scope.passes, scope.kept) == (2, 1)


def test_kept_equals_passes_without_condition(rnet, net, batches):
    rnet.record("0")
    with rnet.scope("sum") as scope:
        for x in batches:
            net(x)
    assert scope.passes == scope.kept == len(batches)


# ===================================================== inputs reduced on the fly


def inputs_by_hand(net, batches):
    """The input of ``net[2]`` (label 1-3) at each pass."""
    return [small_by_hand(net, x)[(1, 2)] for x in batches]


@pytest.mark.parametrize("spec", ["sum", "mean", "max", "min"])
def test_inputs_reduced_over_50_passes_equal_the_kept_inputs_reduced_by_hand(net, spec):
    """50 passes reduced on the fly equal the same reduction of the kept inputs."""
    batches = [torch.randn(4, 3) for _ in range(50)]
    reduced = Recorder(net, input_size=(1, 3))
    reduced.record(inputs="2")
    kept = Recorder(net, input_size=(1, 3))
    kept.record(inputs="2")
    with reduced.scope(inputs=spec) as a, kept.scope() as b:
        for x in batches:
            net(x)
    whole = torch.stack([call.args[0] for call in b.inputs[(1, 3)]])
    expected = {
        "sum": whole.double().sum(0),
        "mean": whole.double().mean(0),
        "max": whole.amax(0),
        "min": whole.amin(0),
    }[spec]
    # Both sides reduce the very same float32 tensors; sums and means are
    # accumulated in float64 in another order than torch's: float64 rounding
    # over 50 terms of O(1) stays far below 1e-12.
    torch.testing.assert_close(a.inputs[(1, 3)], expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        whole, torch.stack(inputs_by_hand(net, batches))
    )  # and the kept inputs are the layer's inputs


def test_reduced_inputs_memory_does_not_grow_with_passes(net):
    """A reduced scope holds one accumulator per label, whatever the passes."""
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record(inputs="2")

    def held_bytes(scope):
        return sum(
            t.numel() * t.element_size()
            for store in scope._inputs.values()
            for r in store.values()
            for t in r.state().values()
        )

    sizes = []
    with rnet.scope(inputs="sum") as scope:
        for passes in (1, 10, 50):
            while scope.passes < passes:
                net(torch.randn(4, 3))
            sizes.append(held_bytes(scope))
    assert sizes[0] == sizes[1] == sizes[2] > 0
    with rnet.scope() as whole:  # "all" grows, for contrast
        for _ in range(3):
            net(torch.randn(4, 3))
    assert len(whole.inputs[(1, 3)]) == 3


def test_inputs_reduced_by_named_positional_and_keyword_arguments():
    """``input_args`` names positional and keyword arguments; each is reduced."""

    class Mix(nn.Module):
        def forward(self, x, y, *, scale):
            return x * scale + y

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = Mix()

        def forward(self, x):
            return self.mix(x, x + 1, scale=2 * x)

    net = Net()
    rnet = Recorder(net, input_data=[torch.zeros(2, 3)])
    rnet.record(inputs="mix")
    xs = [torch.randn(2, 3) for _ in range(4)]
    with rnet.scope(inputs={"mix": "sum"}, input_args=(1, "scale")) as scope:
        for x in xs:
            rnet(x)
    got = scope.inputs[(1, 1)]
    assert set(got) == {1, "scale"}
    torch.testing.assert_close(got[1], sum((x + 1).double() for x in xs))
    torch.testing.assert_close(got["scale"], sum((2 * x).double() for x in xs))
    with rnet.scope(inputs="max", input_args="scale") as single:
        for x in xs:
            rnet(x)
    torch.testing.assert_close(
        single.inputs[(1, 1)], torch.stack([2 * x for x in xs]).amax(0)
    )


def test_input_reduction_defaults_to_the_first_tensor_argument(rnet, net, batches):
    rnet.record(inputs="2")
    with rnet.scope(inputs=Sum()) as scope:
        for x in batches:
            net(x)
    expected = sum(h.double() for h in inputs_by_hand(net, batches))
    torch.testing.assert_close(scope.inputs[(1, 3)], expected)


def test_input_argument_missing_is_a_clear_error_and_leaves_no_hook(rnet, net):
    rnet.record(inputs="2")
    before = net_hooks(net)
    msg = (
        "Cannot reduce the inputs of 1-3 (Linear `2`): the call has no keyword "
        "argument 'mask'. Name an argument the module receives with "
        "`input_args=` (ints for positional arguments, strings for keyword ones)."
    )
    with (
        pytest.raises(ValueError, match=f"^{re.escape(msg)}$"),
        rnet.scope(inputs="sum", input_args="mask"),
    ):
        net(torch.randn(2, 3))
    assert net_hooks(net) == before
    x = torch.randn(2, 3)
    rnet(x)
    torch.testing.assert_close(
        rnet.inputs[(1, 3)].args[0], small_by_hand(net, x)[(1, 2)]
    )


def test_bad_input_args_fail_when_the_scope_is_made(rnet):
    msg = (
        "input_args takes positional indices (int) and keyword names (str), got "
        "1.5; e.g. `input_args=0` or `input_args=(0, 'mask')`."
    )
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        rnet.scope(inputs="sum", input_args=(0, 1.5))
