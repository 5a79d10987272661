"""Recording inside ``torch.compile`` (``fullgraph=True``) and ``torch.export``.

Every test compares with the eager recorder. Most compile with Dynamo's
``"eager"`` backend (the traced graph runs the very same kernels, so records
are compared bit for bit) or ``"aot_eager"`` (AOTAutograd's functionalised
forward and backward, with the same kernels); a few use inductor, whose fused
kernels may round differently: those compare with a tolerance derived from
float32 precision (see ``_close``), and the net's output with the compiled
plain net's, bit for bit (same graph, same kernels).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch._dynamo.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from scio_recorder import CallPlanError, Recorder
from scio_recorder.models import resnet18_cifar, tiny_mlp

from .nets import ListNet, SharedActNet, reused_relu_seq

EPS = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    """Start every test with empty Dynamo caches (and leave them empty)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _close(actual: Tensor, expected: Tensor, depth: int = 8) -> bool:
    """Whether two float32 results of differently fused kernels agree.

    Each output element is a sum of ``k`` products; reordering or fusing it
    changes the result by at most about ``k * eps`` times the sum of the
    magnitudes. The nets here are a few layers of ``k <= 128``, so
    ``depth * 128 * eps`` relative to the largest magnitude bounds the error
    with a wide margin, while a wrong record (another layer's output, a stale
    pass) misses by orders of magnitude more.
    """
    scale = float(expected.abs().max()) + 1.0
    return bool((actual - expected).abs().max() <= depth * 128 * EPS * scale)


def _recordable(rnet: Recorder) -> list[tuple[int, int]]:
    return [row.label for row in rnet.table.rows if row.recordable]


def _compiled(rnet: nn.Module, backend: Any = "eager") -> Any:
    return torch.compile(rnet, fullgraph=True, backend=backend)


def _mlp() -> nn.Module:
    return tiny_mlp(64, 128).eval()


def _eager_records(rnet: Recorder, *args: Any, **kwargs: Any) -> dict[Any, Any]:
    with torch.no_grad():
        rnet(*args, **kwargs)
    return dict(rnet.activations)


# -- outputs of any selection ----------------------------------------------


@pytest.mark.parametrize(
    ("make", "size"),
    [
        pytest.param(SharedActNet, (1, 4), marks=pytest.mark.slow),
        pytest.param(ListNet, (1, 4), marks=pytest.mark.slow),
        pytest.param(reused_relu_seq, (1, 4), marks=pytest.mark.slow),
        (_mlp, (1, 64)),  # the fast representative
    ],
)
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_fullgraph_records_any_selection_as_eager_does(make, size, data):
    net = make()
    rnet = Recorder(net, input_size=size)
    labels = data.draw(
        st.lists(st.sampled_from(_recordable(rnet)), min_size=1, unique=True)
    )
    rnet.record(*labels)
    x = torch.randn(3, size[1])
    eager = _eager_records(rnet, x)
    with torch.no_grad():
        out = _compiled(rnet)(x)
    assert torch.equal(out, net(x))
    assert list(rnet.activations) == list(eager)  # the order hooks fire
    for label, record in eager.items():
        assert torch.equal(rnet.activations[label], record), label


def test_compile_without_fullgraph_has_no_graph_break():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2), (1, 4), inputs=(1, 3), grads=(1, 2))
    explanation = torch._dynamo.explain(rnet)(torch.randn(2, 64))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_every_layer_of_a_resnet_records_as_eager_does():
    net = resnet18_cifar().eval()
    rnet = Recorder(net, input_size=(1, 3, 32, 32))
    rnet.record(*_recordable(rnet))
    x = torch.randn(2, 3, 32, 32)
    with warnings.catch_warnings():  # in-place ReLUs overwrite some records
        warnings.simplefilter("ignore")
        eager = _eager_records(rnet, x)
    with torch.no_grad():
        _compiled(rnet)(x)
    assert rnet.activations.keys() == eager.keys()
    assert len(eager) > 50
    for label, record in eager.items():
        assert torch.equal(rnet.activations[label], record), label


@pytest.mark.slow
def test_inductor_records_match_eager_and_output_matches_compiled_plain_net():
    net = _mlp()
    rnet = Recorder(net, input_size=(1, 64))
    rnet.record(*_recordable(rnet))
    x = torch.randn(4, 64)
    eager = _eager_records(rnet, x)
    with torch.no_grad():
        plain = torch.compile(net, fullgraph=True)(x)
        out = torch.compile(rnet, fullgraph=True)(x)
    assert torch.equal(out, plain)
    assert rnet.activations.keys() == eager.keys()
    for label, record in eager.items():
        assert _close(rnet.activations[label], record), label


# -- inputs, postprocessors, dont_record, options ----------------------------


def test_inputs_are_recorded_under_compile():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record(inputs=[(1, 1), (1, 3)])
    x = torch.randn(3, 64)
    with torch.no_grad():
        rnet(x)
        eager = dict(rnet.inputs)
        _compiled(rnet)(x)
    assert rnet.inputs.keys() == eager.keys()
    for label, call in eager.items():
        assert torch.equal(rnet.inputs[label].args[0], call.args[0])
        assert rnet.inputs[label].kwargs == call.kwargs == {}


def _double(t: Tensor) -> Tensor:
    return 2 * t


def _zero(t: Tensor) -> None:
    t.zero_()


@pytest.mark.parametrize(
    "postproc", [_double, [_double, _zero], _zero], ids=["one", "list", "inplace"]
)
def test_postprocessors_edit_as_in_eager(postproc):
    net = _mlp()
    rnet = Recorder(net, input_size=(1, 64))
    rnet.record((1, 2), (1, 4))
    x = torch.randn(3, 64)
    with torch.no_grad():
        expected = rnet(x, activation_postproc=postproc)
        records = dict(rnet.activations)
        out = _compiled(rnet)(x, activation_postproc=postproc)
    assert not torch.equal(expected, net(x))  # the edit changed something
    assert torch.equal(out, expected)
    for label, record in records.items():
        assert torch.equal(rnet.activations[label], record)


def test_too_short_postprocessor_list_fails_when_traced():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2), (1, 4))
    with pytest.raises(Exception, match="not enough postprocessing functions"):
        _compiled(rnet)(torch.randn(1, 64), activation_postproc=[_double])


def test_dont_record_runs_postprocessors_and_records_nothing():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2))
    x = torch.randn(3, 64)
    with torch.no_grad():
        expected = rnet(x, dont_record=True, activation_postproc=_double)
        _compiled(rnet)(x)
        assert rnet.activations
        out = _compiled(rnet)(x, dont_record=True, activation_postproc=_double)
    assert torch.equal(out, expected)
    assert dict(rnet.activations) == {}


@pytest.mark.parametrize(
    "options",
    [
        {"detach": True},
        {"clone": True},
        {"dtype": torch.float64},
        {"device": "cpu"},
        {"clone": True, "detach": True, "dtype": torch.float16},
    ],
)
def test_record_options_apply_under_compile(options):
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2), **options)
    x = torch.randn(3, 64)
    rnet(x)
    eager = rnet.activations[(1, 2)]
    _compiled(rnet, "aot_eager")(x)
    record = rnet.activations[(1, 2)]
    assert record.dtype == eager.dtype
    assert record.device == eager.device
    assert record.requires_grad == eager.requires_grad
    assert torch.equal(record, eager)


def test_inplace_overwritten_record_holds_what_eager_holds():
    # The reference pass saw the ReLU overwrite the Linear's output: eager and
    # compiled records are copies (exact), with or without clone=True.
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    rnet = Recorder(net, input_size=(1, 4))
    x = torch.randn(8, 4)
    for clone in (False, True):
        rnet.record((1, 1), clone=clone)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            rnet(x)
            eager = rnet.activations[(1, 1)]
            _compiled(rnet, "aot_eager")(x)
        assert torch.equal(rnet.activations[(1, 1)], eager)
        with torch.no_grad():
            assert torch.equal(eager, net[0](x))
        assert bool((eager < 0).any())


# -- gradients -------------------------------------------------------------


def test_gradients_flow_back_through_the_compiled_graph():
    net = _mlp()
    rnet = Recorder(net, input_size=(1, 64))
    rnet.record((1, 4), grads=[(1, 2), (1, 4)])
    x = torch.randn(3, 64)
    rnet(x).square().sum().backward()
    eager = dict(rnet.gradients)
    out = _compiled(rnet, "aot_eager")(x)
    assert dict(rnet.gradients) == {(1, 2): None, (1, 4): None}  # no backward yet
    out.square().sum().backward()
    assert rnet.gradients.keys() == eager.keys()
    for label, grad in eager.items():
        assert _close(rnet.gradients[label], grad), label


def test_gradients_after_a_postprocessor_are_of_what_is_passed_on():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2), grads=(1, 2))
    x = torch.randn(3, 64)
    rnet(x, activation_postproc=_double).sum().backward()
    eager = rnet.gradients[(1, 2)]
    _compiled(rnet, "aot_eager")(x, activation_postproc=_double).sum().backward()
    assert _close(rnet.gradients[(1, 2)], eager)


def test_two_compiled_passes_then_one_backward_keep_the_latest_pass_gradients():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record(grads=(1, 2))
    x1, x2 = torch.randn(3, 64), torch.randn(3, 64)
    (rnet(x1).sum() + 3 * rnet(x2).square().sum()).backward()
    eager = rnet.gradients[(1, 2)]
    compiled = _compiled(rnet, "aot_eager")
    (compiled(x1).sum() + 3 * compiled(x2).square().sum()).backward()
    assert _close(rnet.gradients[(1, 2)], eager)


@pytest.mark.slow
def test_gradients_without_grad_mode_are_not_recorded_when_traced():
    # As in eager mode: a pass under no_grad records no gradient, and the
    # same selection serves passes with gradients.
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2), grads=(1, 2))
    compiled = _compiled(rnet, "aot_eager")
    x = torch.randn(1, 64)
    with torch.no_grad():
        out = compiled(x)
    assert dict(rnet.gradients) == {}
    assert torch.equal(rnet.activations[(1, 2)], rnet.net[:2](x))
    compiled(x).sum().backward()
    assert (1, 2) in rnet.gradients
    assert out.shape == (1, 10)


# -- recompiles and the call plan --------------------------------------------


def test_each_selection_compiles_once_and_never_serves_stale_records():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(rnet, fullgraph=True, backend=counter)
    x = torch.randn(2, 64)
    selections = [[(1, 2)], [(1, 4)], [(1, 2), (1, 4)], [(1, 2)], [(1, 4)]]
    frames = []
    with torch.no_grad():
        for selection in selections:
            rnet.record(*selection)
            compiled(x)
            compiled(x)
            assert sorted(rnet.activations) == selection
            frames.append(counter.frame_count)
    assert frames == [1, 2, 3, 3, 3]


def test_same_selection_recorded_again_does_not_recompile():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(rnet, fullgraph=True, backend=counter)
    with torch.no_grad():
        rnet.record((1, 2))
        compiled(torch.randn(2, 64))
        rnet.record((1, 2))
        compiled(torch.randn(2, 64))
    assert counter.frame_count == 1


class _ScaledRecorder(Recorder):
    """A subclass with its own `forward`: the compiled entry must call it."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return 2 * super().forward(*args, **kwargs)


# torch warns that a global hook also fires for `torch.compile`'s wrapper
# module (our hook counts the recorder's calls only).
@pytest.mark.filterwarnings(
    "ignore:Using `torch.compile.module.` when there are global"
)
@pytest.mark.parametrize("hooked", ["recorder hook", "global hook", "subclass"])
def test_the_compiled_entry_runs_what_calling_the_recorder_runs(hooked):
    """Hooks on the recorder, global module hooks and a subclass's `forward` run.

    The compiled entry skips `_call_impl` and `forward` only when they would
    just pass the call on; here each one does more, as in eager mode.
    """
    make = _ScaledRecorder if hooked == "subclass" else Recorder
    rnet = make(_mlp(), input_size=(1, 64))
    rnet.record((1, 2))
    calls: list[str] = []
    if hooked == "recorder hook":
        handle = rnet.register_forward_hook(lambda *_: calls.append("hook"))
    elif hooked == "global hook":
        handle = nn.modules.module.register_module_forward_hook(
            lambda module, *_: calls.append("hook") if module is rnet else None
        )
    x = torch.randn(2, 64)
    try:
        with torch.no_grad():
            expected = rnet(x)
            eager_calls = list(calls)
            out = _compiled(rnet)(x)
    finally:
        if hooked != "subclass":
            handle.remove()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)  # same kernels
    assert calls == eager_calls * 2
    assert sorted(rnet.activations) == [(1, 2)]


def test_the_plan_lookup_carries_the_mark_of_torchs_constant_decorator():
    """`traced_plan` is marked as `torch.compiler.assume_constant_result` marks.

    The package sets Dynamo's mark itself: the decorator imports
    `torch._dynamo` (seconds, at every `import scio_recorder`). A torch that
    marks another way fails here; the test above shows that the mark works
    (a selection that comes back finds its graph).
    """
    from scio_recorder._engine.compiled import traced_plan  # noqa: PLC0415

    def probe() -> int:
        return 0

    marks = vars(torch.compiler.assume_constant_result(probe))
    assert marks  # the decorator marks the function itself
    assert {name: vars(traced_plan).get(name) for name in marks} == marks


class _TrainTwice(nn.Module):
    """Calls ``lin`` twice in train mode, once in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.lin(x)
        return self.lin(x) if self.training else x


# Dynamo compiles the frames of the eager fallback too, and its inspection
# of their tensors warns (torch's warning, not ours).
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not")
def test_call_plan_is_checked_when_the_graph_is_traced():
    net = _TrainTwice().eval()
    rnet = Recorder(net, input_size=(1, 4), force_static_flow=False)
    rnet.record((1, 1))
    compiled = _compiled(rnet)
    compiled(torch.randn(2, 4))
    net.train()  # the mode is guarded: the next call traces again and fails
    with pytest.raises(Exception, match="Call plan mismatch"):
        compiled(torch.randn(2, 4))
    # Without fullgraph, Dynamo falls back to the eager pass, which raises.
    with pytest.raises(CallPlanError):
        torch.compile(rnet, backend="eager")(torch.randn(2, 4))


def test_scope_refuses_a_compiled_pass_with_a_clear_message():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record((1, 2))
    with (
        rnet.scope(),
        pytest.raises(Exception, match=r"`rnet.scope\(\)` .* runs eagerly"),
    ):
        _compiled(rnet)(torch.randn(1, 64))


# -- a compiled net inside a recorder --------------------------------------


def test_recorder_of_a_compiled_net_records_its_labels_compiled():
    net = _mlp()
    counter = torch._dynamo.testing.CompileCounter()
    rnet = Recorder(
        torch.compile(net, fullgraph=True, backend=counter), input_size=(1, 64)
    )
    assert rnet.net is net
    assert repr(rnet) == repr(Recorder(net, input_size=(1, 64)))
    rnet.record((1, 2), (1, 4))
    x = torch.randn(3, 64)
    with torch.no_grad():
        out = rnet(x)
    assert counter.frame_count == 1  # the recorder's whole pass, in one graph
    assert torch.equal(out, net(x))
    assert torch.equal(rnet.activations[(1, 2)], torch.relu(net[0](x)))
    copied = copy.deepcopy(rnet)
    with torch.no_grad():
        copied(x)
    assert counter.frame_count == 2
    assert torch.equal(copied.activations[(1, 4)], rnet.activations[(1, 4)])


def test_compiled_net_called_directly_records_nothing_without_graph_break():
    net = _mlp()
    rnet = Recorder(net, input_size=(1, 64))
    rnet.record((1, 2))
    with torch.no_grad():
        out = torch.compile(net, fullgraph=True, backend="eager")(torch.ones(1, 64))
    assert torch.equal(out, net(torch.ones(1, 64)))
    assert dict(rnet.activations) == {}


# -- export ----------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True])
def test_export_returns_output_and_records_by_label_string(strict):
    net = _mlp()
    rnet = Recorder(net, input_size=(1, 64))
    rnet.record((1, 2), (1, 4))
    program = rnet.export(torch.randn(2, 64), strict=strict)
    assert isinstance(program, torch.export.ExportedProgram)
    x = torch.randn(2, 64)
    eager = _eager_records(rnet, x)
    with torch.no_grad():
        out, activations = program.module()(x)
    assert torch.equal(out, net(x))
    assert sorted(activations) == ["1-2", "1-4"]
    for (depth, idx), record in eager.items():
        assert torch.equal(activations[f"{depth}-{idx}"], record)


def test_export_with_inputs_postprocessor_and_a_dynamic_batch():
    net = _mlp()
    rnet = Recorder(net, input_size=(1, 64))
    rnet.record((1, 2), inputs=(1, 5))
    batch = torch.export.Dim("batch")
    program = rnet.export(
        torch.randn(2, 64),
        activation_postproc=_double,
        dynamic_shapes=({0: batch},),
    )
    x = torch.randn(5, 64)
    with torch.no_grad():
        expected = rnet(x, activation_postproc=_double)
        out, activations, inputs = program.module()(x)
    assert torch.equal(out, expected)
    assert torch.equal(activations["1-2"], rnet.activations[(1, 2)])
    assert torch.equal(inputs["1-5"].args[0], rnet.inputs[(1, 5)].args[0])


def test_export_refuses_gradients():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    rnet.record(grads=(1, 2))
    with pytest.raises(ValueError, match="runs the forward pass only"):
        rnet.export(torch.randn(2, 64))


def test_past_the_recompile_limit_a_new_selection_fails_or_runs_eagerly():
    rnet = Recorder(_mlp(), input_size=(1, 64))
    x = torch.randn(2, 64)
    labels = [(1, 1), (1, 2), (1, 3)]
    with torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():
        compiled = _compiled(rnet)
        for label in labels[:2]:
            rnet.record(label)
            compiled(x)
        rnet.record(labels[2])
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            compiled(x)
        # Without fullgraph Dynamo runs the eager pass: records stay right.
        relaxed = torch.compile(rnet, backend="eager")
        relaxed(x)
        assert list(rnet.activations) == [labels[2]]
        assert torch.equal(rnet.activations[labels[2]], rnet.net[:3](x))  # 1-3: "2"


def test_nested_recorders_record_inside_one_compiled_graph():
    inner = Recorder(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), input_size=(1, 8))
    inner.record((1, 1))
    outer = Recorder(nn.Sequential(inner, nn.Linear(8, 2)), input_size=(1, 8))
    outer.record((1, 1), (1, 2))
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = outer(x)
        outer_records, inner_records = dict(outer.activations), dict(inner.activations)
        out = _compiled(outer)(x)
    assert torch.equal(out, expected)
    for label, record in outer_records.items():
        assert torch.equal(outer.activations[label], record)
    assert torch.equal(inner.activations[(1, 1)], inner_records[(1, 1)])


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: Tensor, scale: Tensor | None = None) -> Tensor:
        out = self.lin(x)
        return out if scale is None else out * scale


def test_export_takes_dynamic_shapes_by_argument_name():
    rnet = Recorder(_Scaled(), input_size=(1, 4))
    rnet.record((1, 1))
    batch = torch.export.Dim("batch")
    program = rnet.export(
        torch.randn(2, 4),
        scale=torch.full((1,), 2.0),
        dynamic_shapes={"x": {0: batch}, "scale": None},
    )
    x, scale = torch.randn(7, 4), torch.full((1,), 3.0)
    with torch.no_grad():
        out, activations = program.module()(x, scale)  # positional, in order
        expected = rnet(x, scale=scale)
    assert torch.equal(out, expected)
    assert torch.equal(activations["1-1"], rnet.activations[(1, 1)])
    with pytest.raises(ValueError, match="not positional arguments"):
        rnet.export(torch.randn(2, 4), dynamic_shapes={"y": None})


def test_recompile_limit_counts_one_recorders_selections_not_all_recorders():
    # Dynamo caches at most `recompile_limit` graphs per code object; every
    # recorder enters through a code object of its own, so more recorders
    # than the limit each compile (through a shared one the last one failed).
    x = torch.randn(2, 4)
    limit = 3
    with torch._dynamo.config.patch(recompile_limit=limit), torch.no_grad():
        for _ in range(limit + 2):
            net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            rnet = Recorder(net, input_size=(1, 4))
            rnet.record((1, 1))
            _compiled(rnet)(x)
            assert torch.equal(rnet.activations[(1, 1)], net[0](x))


@pytest.mark.slow
def test_compile_in_place_records_and_counts_per_recorder():
    x = torch.randn(2, 4)
    with torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():
        for _ in range(4):  # more recorders than the limit
            net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            rnet = Recorder(net, input_size=(1, 4))
            rnet.record((1, 2))
            rnet.compile(fullgraph=True, backend="eager")
            assert torch.equal(rnet(x), net(x))
            assert torch.equal(rnet.activations[(1, 2)], net(x))
