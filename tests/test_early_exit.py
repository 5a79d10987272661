"""Early exit: ``rnet(x, early_exit=True)`` stops after the last recorded call.

The oracle is the full pass of the same recorder on the same input: the
layers up to the last recorded call run the same float32 operations on the
same tensors, so the records are compared bit for bit. The work saved is
measured by the module calls that start (forward pre-hooks of the test's own
on every module): an early pass makes exactly the calls of the full pass up
to the end of the last recorded call, and none after.
"""

from __future__ import annotations

import re

import pytest
import torch
import transformers
from torch import nn

from scio_recorder import CallPlanError, Recorder, collect
from scio_recorder.collect import InputOf
from scio_recorder.ood import KLMatching, Mahalanobis
from tests.test_passes import Watch

# -- the nets --------------------------------------------------------------------


def mlp() -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    net = nn.Sequential(
        nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )
    return net, {"input": torch.randn(5, 6)}, "2"


def cnn() -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    ).eval()
    return net, {"input": torch.randn(4, 3, 12, 12)}, "3"


LM = {
    "vocab_size": 100,
    "initializer_range": 0.2,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "attn_implementation": "eager",
}


def gpt2() -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    config = transformers.GPT2Config(
        n_layer=4, n_embd=32, n_head=2, n_positions=32, **LM
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, {"input_ids": torch.randint(0, 100, (2, 7))}, "transformer.h.1"


def llama() -> tuple[nn.Module, dict[str, torch.Tensor], str]:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        **LM,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    return model, {"input_ids": torch.randint(0, 100, (2, 7))}, "model.layers.1"


NETS = {"mlp": mlp, "cnn": cnn, "gpt2": gpt2, "llama": llama}


class Starts:
    """The qualified names of the module calls that start, in order."""

    def __init__(self, net: nn.Module) -> None:
        self.names: list[str] = []
        self.handles = [
            module.register_forward_pre_hook(
                lambda _m, _a, name=name: self.names.append(name)
            )
            for name, module in net.named_modules()
        ]

    def run(self, call, *args, **kwargs):
        """Return ``call(*args, **kwargs)`` and the names of the calls it started."""
        self.names = []
        out = call(*args, **kwargs)
        return out, self.names

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def first_after(names: list[str], layer: str) -> int:
    """Index of the first call that starts after ``layer``'s call (and its subtree)."""
    start = names.index(layer)
    inside = [i for i, name in enumerate(names) if name.startswith(layer + ".")]
    return max([start, *inside]) + 1


@pytest.mark.parametrize("make", NETS.values(), ids=NETS.keys())
@pytest.mark.parametrize("what", ["output", "input"])
def test_early_exit_records_equal_a_full_pass_and_skip_the_rest(make, what):
    """Records equal the full pass's bit for bit; no call after the last recorded one.

    ``what="input"`` records the inputs of the layer: the pass stops before
    the layer runs.
    """
    torch.manual_seed(0)
    net, inputs, layer = make()
    starts = Starts(net)  # before the recorder: their hooks fire first
    rnet = Recorder(net, input_data=inputs)
    if what == "output":
        rnet.record(layer)
    else:
        rnet.record(inputs=layer)
    with torch.no_grad():
        out, full_calls = starts.run(rnet, **inputs)
        full = dict(rnet.activations), {k: v.args for k, v in rnet.inputs.items()}
        watch = Watch(net)
        result, early_calls = starts.run(rnet, **inputs, early_exit=True)
        watch.assert_clean()
    assert out is not None
    assert result is None
    early = dict(rnet.activations), {k: v.args for k, v in rnet.inputs.items()}
    assert early[0].keys() == full[0].keys()
    assert early[1].keys() == full[1].keys()
    for mapping, expected in zip(early, full, strict=True):
        for label, value in mapping.items():
            got = value if isinstance(value, torch.Tensor) else value[0]
            want = expected[label]
            want = want if isinstance(want, torch.Tensor) else want[0]
            assert torch.equal(got, want), label
    # The work saved: exactly the calls of the full pass up to the layer.
    stop = first_after(full_calls, layer) if what == "output" else None
    if stop is None:
        stop = full_calls.index(layer) + 1  # the layer's pre-hook stops the pass
    assert early_calls == full_calls[:stop]
    assert len(early_calls) < len(full_calls)
    starts.remove()


# -- refusals ---------------------------------------------------------------------


@pytest.fixture
def small() -> tuple[nn.Sequential, Recorder]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return net, Recorder(net, input_size=(1, 4))


NOTHING = (
    "`early_exit=True` stops the pass after the last recorded call, and {why}: "
    "select layers with `rnet.record(...)`, or drop `early_exit`."
)


def test_early_exit_with_nothing_recorded_is_refused(small):
    """Nothing recorded, or ``dont_record``: refused, saying what to do."""
    _net, rnet = small
    x = torch.ones(2, 4)
    with pytest.raises(
        ValueError, match=f"^{re.escape(NOTHING.format(why='nothing is recorded'))}$"
    ):
        rnet(x, early_exit=True)
    rnet.record((1, 1))
    why = "`dont_record=True` records nothing"
    with pytest.raises(ValueError, match=f"^{re.escape(NOTHING.format(why=why))}$"):
        rnet(x, early_exit=True, dont_record=True)


def test_early_exit_takes_a_bool_only(small):
    """A truthy non-bool (`"no"`, `1`) is refused, never taken for True."""
    _net, rnet = small
    rnet.record((1, 1))
    x = torch.ones(2, 4)
    for value in ("no", 1, "yes"):
        with pytest.raises(
            TypeError, match=rf"^`early_exit` must be True or False, got {value!r}$"
        ):
            rnet(x, early_exit=value)
        with pytest.raises(TypeError, match=r"^`early_exit` must be True or False"):
            rnet.forward(x, early_exit=value)
    assert rnet(x, early_exit=False) is not None


def test_early_exit_with_gradients_is_refused(small):
    """Gradients selected, or an input that requires grad: refused (no output)."""
    net, rnet = small
    rnet.record((1, 1), grads=(1, 2))
    msg = (
        "`early_exit=True` returns no output, and the gradients of 1-2 "
        "(`record(grads=...)`) need a backward from it: record without "
        "`grads=`, or drop `early_exit`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet(torch.ones(2, 4), early_exit=True)
    rnet.record((1, 1))
    x = torch.ones(2, 4, requires_grad=True)
    msg = (
        "`early_exit=True` returns no output, and an input requires grad: its "
        "gradient needs a backward from the output. Pass inputs that do not "
        "require grad (`x.detach()`), run under `torch.no_grad()`, or drop "
        "`early_exit`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet(x, early_exit=True)
    with torch.no_grad():  # no backward can come: allowed
        assert rnet(x, early_exit=True) is None
    assert torch.equal(rnet.activations[(1, 1)], net[0](x).detach())


def test_early_exit_is_refused_by_generate_and_call_method():
    """Generation needs every step's logits: refused, never passed to the net."""
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, **LM)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.tensor([[1, 2, 3]])
    rnet = Recorder(model, input_data={"input_ids": ids})
    rnet.record("transformer.h.0")
    msg = (
        "`rnet.generate(..., early_exit=True)` is refused: `generate` needs the "
        "output of every forward step it makes (`generate`: the logits of each "
        "step), so no step may stop early. Drop `early_exit`."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        rnet.generate(ids, max_new_tokens=2, early_exit=True)
    with pytest.raises(ValueError, match=r"^`rnet\.forward\(\.\.\., early_exit=True"):
        rnet.call_method("forward", ids, early_exit=True)


def test_early_exit_is_refused_in_a_compiled_pass(small):
    """A compiled graph runs whole: refused before Dynamo, with the reason."""
    _net, rnet = small
    rnet.record((1, 1))
    rnet.compile(backend="eager", fullgraph=True)
    msg = (
        "`early_exit=True` runs in eager passes only (a compiled graph runs "
        "whole): call the recorder uncompiled to stop after the last recorded call."
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(msg)}$"):
        rnet(torch.ones(2, 4), early_exit=True)


# -- the call plan, and nothing left half-open ----------------------------------


class Repeat(nn.Module):
    """``a`` once per row of the input, then ``b`` (unless ``skip_b``), then ``c``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.skip_b = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(x.shape[0]):
            x = self.a(x)
        if not self.skip_b:
            x = self.b(x)
        return self.c(x)


def test_the_call_plan_check_holds_for_the_calls_that_ran():
    """An extra call before the stop raises; a recorded call that never comes too."""
    net = Repeat()
    rnet = Recorder(net, input_size=(1, 4), force_static_flow=False)
    rnet.record("a", "b")
    watch = Watch(net)
    with pytest.raises(CallPlanError, match=r"module `a` .* called at least 2 times"):
        rnet(torch.ones(2, 4), early_exit=True)
    watch.assert_clean()
    assert dict(rnet.activations) == {}
    net.skip_b = True
    with pytest.raises(CallPlanError, match=r"^Missing \[\(1, 2\)\] activations"):
        rnet(torch.ones(1, 4), early_exit=True)
    watch.assert_clean()
    net.skip_b = False
    x = torch.ones(1, 4)
    assert rnet(x, early_exit=True) is None
    assert torch.equal(rnet.activations[(1, 2)], net.b(net.a(x)))


def test_early_exit_leaves_another_recorders_scope_right(small):
    """Another recorder's scope drops the half-made pass and records the next one."""
    net, rnet = small
    other = Recorder(net, input_size=(1, 4))
    rnet.record((1, 1))
    other.record((1, 3))
    x = torch.ones(2, 4)
    watch = Watch(net)
    with other.scope() as scope:
        assert rnet(x, early_exit=True) is None
        net(x)
    watch.assert_clean()
    assert scope.passes == 1
    assert torch.equal(scope[(1, 3)][0], net(x))
    assert torch.equal(rnet.activations[(1, 1)], net[0](x))


def test_early_exit_inside_a_scope_feeds_the_scope(small):
    """``rnet(x, early_exit=True)`` in its own scope is one fed pass."""
    net, rnet = small
    rnet.record((1, 1))
    x = torch.ones(2, 4)
    with rnet.scope("sum") as scope:
        rnet(x, early_exit=True)
        rnet(x, early_exit=True)
    assert scope.passes == 2
    assert torch.equal(scope[(1, 1)], 2 * net[0](x).double())


# -- collect and detector fits ----------------------------------------------------


def counted(net: nn.Module) -> dict[str, int]:
    """Count the calls of every module that complete; return the live counts."""
    counts = dict.fromkeys((name for name, _ in net.named_modules()), 0)
    for name, module in net.named_modules():

        def count(_m, _a, _out, name=name):
            counts[name] += 1

        module.register_forward_hook(count)
    return counts


BATCHES = [(torch.randn(6, 4), torch.arange(6) % 3) for _ in range(3)]


@pytest.mark.parametrize(
    ("keep", "options", "last_runs"),
    [
        ({"0": "concat"}, {}, False),  # an intermediate layer: stops by default
        ({InputOf("2"): "moments"}, {}, False),
        ({"0": "concat", "": "concat"}, {}, True),  # the net's output: full
        ({"0": "concat"}, {"grad": True}, True),
        ({"0": "concat"}, {"early_exit": False}, True),
        ({"0": "concat", "": "concat"}, {"early_exit": True}, True),  # no saving
    ],
    ids=["layer", "input", "output kept", "grad", "False", "True with output"],
)
def test_collect_exits_early_unless_the_output_or_gradients_are_needed(
    small, keep, options, last_runs
):
    """``early_exit=None`` stops early exactly when it can; results are the same."""
    net, rnet = small
    counts = counted(net)
    result = collect(rnet, BATCHES, keep, **options)
    assert counts["2"] == (3 if last_runs else 0)  # the last Linear
    full = collect(rnet, BATCHES, keep, early_exit=False)
    for label, value in full.items():
        got = result[label]
        if isinstance(value, torch.Tensor):
            assert torch.equal(got, value), label
        else:
            assert torch.equal(got.mean, value.mean), label


def test_collect_checks_early_exit(small):
    """``early_exit`` is None, True or False."""
    _, rnet = small
    msg = "`early_exit` must be None, True or False, got 'yes'"
    with pytest.raises(TypeError, match=f"^{re.escape(msg)}$"):
        collect(rnet, BATCHES, {"0": "concat"}, early_exit="yes")


def test_a_feature_detector_fits_with_early_exit_a_logit_detector_does_not(small):
    """Mahalanobis (the last Linear's input) stops early; KLMatching reads logits."""
    net, rnet = small
    counts = counted(net)
    maha = Mahalanobis(rnet).fit(BATCHES, target=1)
    assert counts["2"] == 0
    full = Mahalanobis(rnet).fit(BATCHES, target=1, early_exit=False)
    assert counts["2"] == 3
    x = torch.randn(5, 4)
    assert torch.equal(maha(x), full(x))  # scoring: two full passes
    before = counts["2"]
    KLMatching(rnet).fit(BATCHES)
    assert counts["2"] == before + 3


# -- dispatched models ---------------------------------------------------------


def test_early_exit_under_accelerate_cpu_offload():
    """An offloaded GPT-2: early records equal full ones; the next pass is unchanged.

    accelerate's hooks move each module's weights in before its forward and
    out after it; a pass that stops must leave them ready for the next one.
    """
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model, inputs, layer = gpt2()
    with torch.no_grad():
        expected = model(**inputs).logits
    model = accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    rnet = Recorder(model, input_data=inputs)
    rnet.record(layer)
    with torch.no_grad():
        out = rnet(**inputs)
        full = dict(rnet.activations)
        devices = {name: p.device for name, p in model.named_parameters()}
        watch = Watch(model)
        assert rnet(**inputs, early_exit=True) is None
        watch.assert_clean()
        for label, value in full.items():
            assert torch.equal(rnet.activations[label], value)
        assert {name: p.device for name, p in model.named_parameters()} == devices
        assert torch.equal(rnet(**inputs).logits, out.logits)
        assert torch.equal(model(**inputs).logits, expected)
