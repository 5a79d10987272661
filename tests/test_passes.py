"""Every pass life cycle ends cleanly, whatever interrupts it.

A ``KeyboardInterrupt`` (Ctrl-C) is a ``BaseException``: torch runs no
``always_call`` forward hook after it, and ``except Exception`` blocks miss
it. For each entry point that runs passes (``rnet(x)``, a scope, ``generate``,
``call_method``, ``collect``, detector fits), one is raised from inside the
net on its N-th call; afterwards no pass is left open in the registry, no
hook is left on the net, grad mode is what it was, and the next pass records
exactly what a pass before the interrupt recorded (the same ops on the same
inputs: equal bit for bit).

And a copy (``pickle``, ``torch.save``, ``copy.deepcopy``) of the net or of
the recorder works whatever pass or scope is open, and carries none.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import transformers
from torch import nn

from scio_recorder import Recorder, collect
from scio_recorder._engine.hooks import ACTIVE
from scio_recorder.ood import NAC, Mahalanobis

X = torch.linspace(-1, 1, 12).reshape(3, 4)


class Tripwire(nn.Identity):
    """The identity, raising ``KeyboardInterrupt`` on its ``armed``-th call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.armed: int | None = None

    def arm(self, call: int) -> None:
        """Raise on the ``call``-th call from now (1: the next)."""
        self.calls, self.armed = 0, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.armed:
            self.armed = None
            raise KeyboardInterrupt
        return x


class TripNet(nn.Sequential):
    """``Linear, Tripwire, ReLU, Linear``, with a method calling itself twice."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(4, 8), Tripwire(), nn.ReLU(), nn.Linear(8, 3))

    def twice(self, x: torch.Tensor) -> torch.Tensor:
        return self(self(x)[:, :1].expand(-1, 4))


def hooks_of(net: nn.Module) -> dict[str, tuple[list[str], list[str]]]:
    """The kinds of every module's forward hooks and pre-hooks, by name.

    The kind is the class of the hook's object (a recorder re-places equal
    hooks when a tool restores its selection, so not the objects).
    """

    def kinds(hooks: dict[int, object]) -> list[str]:
        return [type(getattr(h, "__self__", h)).__name__ for h in hooks.values()]

    return {
        name: (kinds(m._forward_hooks), kinds(m._forward_pre_hooks))
        for name, m in net.named_modules()
    }


class Watch:
    """What must be as it was after an interrupt: hooks, registry, grad mode."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.hooks = hooks_of(net)
        self.grad = torch.is_grad_enabled()

    def assert_clean(self) -> None:
        assert ACTIVE.states == {}  # no pass or scope of any recorder left open
        assert hooks_of(self.net) == self.hooks
        assert torch.is_grad_enabled() is self.grad


@pytest.fixture
def trip() -> tuple[TripNet, Recorder]:
    torch.manual_seed(0)
    net = TripNet()
    rnet = Recorder(net, input_size=(1, 4))
    rnet.record((1, 1), (1, 3), inputs=(1, 4))
    return net, rnet


def records(rnet: Recorder) -> dict[object, torch.Tensor]:
    out = dict(rnet.activations)
    out.update({("in", k): v.args[0] for k, v in rnet.inputs.items()})
    return out


def assert_equal_records(a: dict[object, torch.Tensor], b: dict[object, torch.Tensor]):
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]), key


@pytest.mark.parametrize("edits", [False, True], ids=["plain", "edits-by-selector"])
def test_interrupted_forward_leaves_nothing_open(trip, edits):
    """``rnet(x)`` interrupted: nothing left, the next pass records as before."""
    net, rnet = trip
    options = {"activation_postproc": {"2": lambda t: t * 2}} if edits else {}
    rnet(X, **options)
    before = records(rnet)
    watch = Watch(net)
    net[1].arm(1)
    with pytest.raises(KeyboardInterrupt):
        rnet(X, **options)
    watch.assert_clean()
    assert dict(rnet.activations) == {}  # the interrupted pass kept nothing
    rnet(X, **options)
    assert_equal_records(records(rnet), before)
    watch.assert_clean()


@pytest.mark.parametrize("how", ["direct", "through rnet"])
def test_interrupted_scope_leaves_nothing_open(trip, how):
    """A scope's pass interrupted: the block ends clean, the next scope is right."""
    net, rnet = trip
    run = net if how == "direct" else rnet
    with rnet.scope() as scope:
        run(X)
    before = scope[(1, 3)]
    watch = Watch(net)
    net[1].arm(2)

    def two_passes() -> None:
        with rnet.scope() as scope:
            opened.append(scope)
            run(X)
            run(X)

    opened = []
    with pytest.raises(KeyboardInterrupt):
        two_passes()
    (scope,) = opened
    watch.assert_clean()
    assert scope.passes == 1  # the interrupted pass was not fed
    net(X)  # a direct call outside any scope records nothing, and does not fail
    with rnet.scope() as scope:
        run(X)
    assert torch.equal(scope[(1, 3)][0], before[0])
    watch.assert_clean()


def test_interrupt_caught_inside_a_scope_drops_only_that_pass(trip):
    """Ctrl-C caught in the block: the next direct pass opens afresh and is fed."""
    net, rnet = trip
    watch = Watch(net)
    with rnet.scope() as scope:
        net[1].arm(1)
        with pytest.raises(KeyboardInterrupt):
            net(X)
        net(X)
    watch.assert_clean()
    assert scope.passes == 1
    assert torch.equal(scope[(1, 1)][0], net[0](X))


def test_interrupted_call_method_leaves_nothing_open(trip):
    """``call_method`` interrupted in its second step: the next call is right."""
    net, rnet = trip
    rnet.call_method("twice", X)
    before = [dict(step) for step in rnet.steps]
    watch = Watch(net)
    net[1].arm(2)
    with pytest.raises(KeyboardInterrupt):
        rnet.call_method("twice", X)
    watch.assert_clean()
    rnet.call_method("twice", X)
    watch.assert_clean()
    assert len(rnet.steps) == len(before) == 2
    for step, expected in zip(rnet.steps, before, strict=True):
        assert_equal_records(dict(step), expected)


def tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=32
    )
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("edits", [False, True], ids=["plain", "edits-by-selector"])
def test_interrupted_generate_leaves_nothing_open(edits):
    """Ctrl-C in a step of ``generate``: the next ``generate`` works, as before.

    Before the fix, every later ``generate`` raised "was called inside a pass
    of the same recorder".
    """
    model = tiny_gpt2()
    ids = torch.tensor([[1, 2, 3]])
    rnet = Recorder(model, input_data={"input_ids": ids})
    rnet.record("transformer.h.0")
    options = {"do_sample": False, "max_new_tokens": 3, "pad_token_id": 0}
    if edits:
        options["activation_postproc"] = {"transformer.h.1.mlp": lambda t: t * 0.5}
    out = rnet.generate(ids, **options)
    before = [dict(step) for step in rnet.steps]
    watch = Watch(model)
    calls = []

    def interrupt(*_):
        calls.append(1)
        if len(calls) == 2:  # the first decoding step, after the prefill
            raise KeyboardInterrupt

    handle = model.transformer.h[1].register_forward_pre_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            rnet.generate(ids, **options)
    finally:
        handle.remove()
    watch.assert_clean()
    again = rnet.generate(ids, **options)
    watch.assert_clean()
    assert torch.equal(again, out)
    assert len(rnet.steps) == len(before) == 3
    for step, expected in zip(rnet.steps, before, strict=True):
        for label, value in expected.items():
            assert torch.equal(step[label][0], value[0]), label


def test_interrupted_collect_leaves_nothing_open(trip):
    """``collect`` interrupted mid-run: selection, hooks and grad mode restored."""
    net, rnet = trip
    batches = [(X, torch.tensor([0, 1, 2]))] * 3
    expected = collect(rnet, batches, {(1, 3): "concat"})
    selection = rnet.selection
    watch = Watch(net)
    net[1].arm(2)
    with pytest.raises(KeyboardInterrupt):
        collect(rnet, batches, {(1, 3): "concat"})
    watch.assert_clean()
    assert rnet.selection == selection
    again = collect(rnet, batches, {(1, 3): "concat"})
    assert torch.equal(again[(1, 3)], expected[(1, 3)])
    watch.assert_clean()


@pytest.mark.parametrize(
    "detector",
    [Mahalanobis, lambda rnet: NAC(rnet, layers=["2"])],
    ids=["Mahalanobis", "NAC"],
)
def test_interrupted_fit_leaves_nothing_open(detector):
    """A detector's fit interrupted (``collect``'s loop, NAC's gradient loop)."""
    torch.manual_seed(0)
    net = TripNet()
    rnet = Recorder(net, input_size=(1, 4))
    batches = [(torch.randn(6, 4), torch.arange(6) % 3) for _ in range(3)]
    expected = detector(rnet).fit(batches, target=1)
    selection = rnet.selection
    watch = Watch(net)
    net[1].arm(2)
    interrupted = detector(rnet)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(batches, target=1)
    watch.assert_clean()
    assert rnet.selection == selection
    assert not interrupted.fitted
    again = detector(rnet).fit(batches, target=1)
    watch.assert_clean()
    assert torch.equal(again(X), expected(X))


# -- copies while a pass is open ------------------------------------------------


def _pickled(value: object) -> object:
    return pickle.loads(pickle.dumps(value))  # noqa: S301 (our own bytes)


def _saved(value: object) -> object:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIERS = {"deepcopy": copy.deepcopy, "pickle": _pickled, "torch.save": _saved}
IDS = torch.tensor([[1, 2, 3]])
GENERATE = {"do_sample": False, "max_new_tokens": 3, "pad_token_id": 0}


@pytest.fixture(scope="module")
def lm() -> tuple[nn.Module, Recorder, torch.Tensor]:
    """A tiny GPT-2, its recorder (one block recorded) and its generation."""
    torch.manual_seed(0)
    model = tiny_gpt2()
    rnet = Recorder(model, input_data={"input_ids": IDS})
    rnet.record("transformer.h.0")
    return model, rnet, rnet.generate(IDS, **GENERATE)


def n_hooks(net: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in net.modules())


@pytest.mark.parametrize("copier", COPIERS.values(), ids=COPIERS.keys())
@pytest.mark.parametrize("what", ["net", "recorder"])
@pytest.mark.parametrize("when", ["nothing open", "scope open", "generate step open"])
def test_copies_work_while_a_scope_or_generate_is_open(lm, copier, what, when):
    """Copying the net or the recorder works at any time; the copy has no open pass.

    It used to fail with "cannot pickle '_thread.lock' object" while a scope
    or ``generate`` was open. The copy computes what the net computes, and
    records nothing into the original's scope; a copied recorder records
    and generates on its own.
    """
    model, rnet, generated = lm
    hooks = n_hooks(model)
    copies = []

    def copy_now(_output):
        copies.append(copier(model if what == "net" else rnet))

    if when == "nothing open":
        copy_now(None)
    elif when == "scope open":
        with rnet.scope() as scope:
            copy_now(None)
            model(IDS)
            if what == "net":  # the copy's passes are not the recorder's
                copies[0](IDS)
        assert scope.passes == 1
    else:
        steps = []

        def edit(output):
            steps.append(1)
            if len(steps) == 2:  # in the first decoding step
                copy_now(output)

        edits = {"activation_postproc": {"transformer.h.1": edit}}
        assert torch.equal(rnet.generate(IDS, **GENERATE, **edits), generated)
    (copied,) = copies
    watch = Watch(model)
    assert n_hooks(model) == hooks
    with torch.no_grad():
        expected = model(IDS).logits
    if what == "net":
        with torch.no_grad():
            assert torch.equal(copied(IDS).logits, expected)
        assert n_hooks(copied) == 0  # the copied hooks dropped themselves
    else:
        assert n_hooks(copied.net) == hooks  # its own hooks only
        assert copied.recording == rnet.recording
        assert torch.equal(copied.generate(IDS, **GENERATE), generated)
        copied.record("transformer.h.1")  # no scope of the copy is open
        with torch.no_grad():
            assert torch.equal(copied(IDS).logits, expected)
        assert list(copied.activations) == list(copied.recording)
    watch.assert_clean()
    assert torch.equal(rnet.generate(IDS, **GENERATE), generated)


# -- a pass that records nothing is the net's call ------------------------------


def test_a_pass_recording_nothing_clears_the_records_and_feeds_a_scope(trip):
    """The shortcut for passes that record nothing keeps every duty of a pass.

    It clears the latest records, is fed to an open scope, and an inner call
    made from an edit (whose extra hooks are on the net) is its own pass.
    """
    net, rnet = trip
    rnet(X)
    assert dict(rnet.activations)
    rnet.record()
    out = rnet(X)
    assert dict(rnet.activations) == {}
    assert torch.equal(out, net(X))
    with rnet.scope() as scope:
        rnet(X)
        rnet(X)
    assert scope.passes == 2
    inner = []

    def edit(t):
        inner.append(rnet(X))  # a nested pass, recording nothing
        return t * 2

    watch = Watch(net)
    edited = rnet(X, activation_postproc={"2": edit})
    watch.assert_clean()
    assert len(inner) == 1
    assert torch.equal(inner[0], net(X))
    h = torch.relu(net[0](X)) * 2
    assert torch.equal(edited, net[3](h))
