"""`explain._prefix`: calls answered from a cache, and nothing left behind.

The dispatcher that answers a module's calls during a patching sweep is
installed on the module itself (its ``forward``); these tests pin that it
answers only the thread and the ``with`` block that asked, and that the
module comes back as it was, whatever happens inside; and that the answer
is what the block's own ``forward`` returned, so that the user's hooks of
every kind run once around an answered call, as around a real one.
"""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.explain import patch_sweep
from scio_recorder.explain._prefix import (
    answered_blocks,
    answering,
    capturing,
    find_stack,
)
from tests.test_explain_lm import VOCAB, B, T, replaced, stream
from tests.test_explain_lm import gpt2 as gpt2_model
from tests.test_explain_lm import logit_diff as _logit_diff


def test_answers_nest_and_the_module_comes_back_as_it_was():
    layer = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    want = layer(x)
    with answering({layer: lambda: "outer"}):
        assert layer(x) == "outer"
        with answering({layer: lambda: "inner"}):
            assert layer(x) == "inner"
        assert layer(x) == "outer"
    assert "forward" not in vars(layer)
    assert torch.equal(layer(x), want)


def test_an_instance_forward_is_put_back_itself():
    """A ``forward`` set on the instance (accelerate's hooks) stays the same object."""
    layer = nn.Linear(2, 2)
    calls = []

    def own(*args):
        calls.append(1)
        return nn.Linear.forward(layer, *args)

    layer.forward = own
    with answering({layer: lambda: "answered"}):
        assert layer(torch.ones(1, 2)) == "answered"
    assert vars(layer)["forward"] is own
    layer(torch.ones(1, 2))
    assert calls == [1]


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_exception_inside_removes_the_dispatcher(error):
    layer = nn.Linear(2, 2)
    with pytest.raises(error), answering({layer: lambda: "answered"}):
        raise error
    assert "forward" not in vars(layer)


def test_another_thread_runs_the_modules_own_forward():
    layer = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    want = layer(x)
    got = []
    with answering({layer: lambda: "answered"}):
        worker = threading.Thread(target=lambda: got.append(layer(x)))
        worker.start()
        worker.join()
        assert layer(x) == "answered"
    assert torch.equal(got[0], want)


def test_a_compiled_trace_runs_the_modules_own_forward(monkeypatch):
    """Under Dynamo (``is_compiling``) the dispatcher answers nothing."""
    layer = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    with answering({layer: lambda: "answered"}):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert torch.equal(layer(x), nn.Linear.forward(layer, x))


class Stacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.short = nn.ModuleList([nn.Identity(), nn.Identity()])
        self.head = nn.Linear(4, 10)

    def forward(self, ids):
        h = self.short[1](self.short[0](self.embed(ids)))
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        return self.head(h)


def test_the_stack_is_the_largest_module_list_run_once_per_pass():
    net = Stacked().eval()
    rnet = Recorder(net, input_data=[torch.zeros(1, 3, dtype=torch.long)])
    stack = find_stack(rnet)
    assert stack is not None
    assert stack.name == "layers"
    assert [row.name for row in stack.blocks] == ["layers.0", "layers.1", "layers.2"]
    row = rnet.table.calls_of(net.layers[1])[0]
    assert [b.name for b in answered_blocks(stack, row)] == ["layers.0", "layers.1"]
    head = rnet.table.calls_of(net.head)[0]
    assert len(answered_blocks(stack, head)) == 3
    net.layers[0].train()
    assert find_stack(rnet) is None  # a module in training mode: none


def test_a_metric_interrupted_leaves_no_forward_behind():
    """Ctrl-C inside a sweep's pass: every dispatcher is gone."""
    net = Stacked().eval()
    rnet = Recorder(net, input_data=[torch.zeros(1, 3, dtype=torch.long)])
    ids = torch.tensor([[1, 2, 3]])

    def metric(_out):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        patch_sweep(rnet, ids, ids, "layers.2", metric)
    assert not [n for n, m in net.named_modules() if "forward" in vars(m)]
    assert rnet.recording == ()
    grid = patch_sweep(rnet, ids, ids, "layers.2", lambda o: o[0, -1, 0], max_batch=1)
    with torch.no_grad():  # clean = corrupted: every cell is the plain output
        assert torch.equal(grid, net(ids)[0, -1, 0].expand(1, 3))


def test_the_net_run_from_another_thread_during_a_sweep_is_the_plain_net():
    net = Stacked().eval()
    rnet = Recorder(net, input_data=[torch.zeros(1, 3, dtype=torch.long)])
    clean, corrupted = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        want = net(clean)
    seen = []

    def metric(out):
        if not seen:  # the blocks are answered in this thread now
            worker = threading.Thread(target=lambda: seen.append(net(clean)))
            worker.start()
            worker.join()
        return out[0, -1, 0]

    with torch.no_grad():
        patch_sweep(rnet, clean, corrupted, "layers.2", metric)
    assert torch.equal(seen[0], want)


def test_a_copy_taken_during_a_sweep_is_the_plain_net():
    """Deepcopy and pickle inside a sweep: the copies carry no answers."""
    net = Stacked().eval()
    rnet = Recorder(net, input_data=[torch.zeros(1, 3, dtype=torch.long)])
    clean, corrupted = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        want = net(clean)
    copies = []

    def metric(out):
        if not copies:  # the blocks are answered in this thread now
            copies.append(copy.deepcopy(net))
            copies.append(pickle.loads(pickle.dumps(net)))  # noqa: S301 (our own)
            with torch.no_grad():
                copies.extend([copies[0](clean), copies[1](clean)])
        return out[0, -1, 0]

    with torch.no_grad():
        patch_sweep(rnet, clean, corrupted, "layers.2", metric)
    assert torch.equal(copies[2], want)
    assert torch.equal(copies[3], want)
    with torch.no_grad():
        assert torch.equal(copies[0](clean), want)


# --- the user's own hooks on the blocks: an answered call sees them as a real one


@pytest.fixture(scope="module")
def gpt2():
    """A 2-layer GPT-2 built from its config, its recorder and its blocks."""
    torch.manual_seed(0)
    model = gpt2_model().eval()
    ids = torch.zeros(B, T, dtype=torch.long)
    rnet = Recorder(model, input_data={"input_ids": ids}, force_static_flow=False)
    return model, rnet, list(model.transformer.h)


def squashed(output):
    """The block's output with its residual stream through ``tanh``."""
    return replaced(output, torch.tanh(stream(output)))


def squashed_args(args):
    return (torch.tanh(args[0]), *args[1:])


def _forward(blocks, **options):
    return [
        b.register_forward_hook(lambda _m, _a, o: squashed(o), **options)
        for b in blocks
    ]


def _in_place(blocks):
    def hook(_module, _args, output):
        stream(output).tanh_()  # returns None: the output changed in place

    return [b.register_forward_hook(hook) for b in blocks]


def _with_kwargs(blocks):
    def hook(_module, _args, kwargs, output):
        assert "position_ids" in kwargs  # GPT-2 passes its blocks keywords
        return squashed(output)

    return [b.register_forward_hook(hook, with_kwargs=True) for b in blocks]


def _pre(blocks):
    return [
        b.register_forward_pre_hook(lambda _m, args: squashed_args(args))
        for b in blocks
    ]


def _pre_with_kwargs(blocks):
    def hook(_module, args, kwargs):
        return squashed_args(args), kwargs

    return [b.register_forward_pre_hook(hook, with_kwargs=True) for b in blocks]


def _global(blocks):
    def hook(module, _args, output):
        return squashed(output) if any(module is b for b in blocks) else None

    return [torch.nn.modules.module.register_module_forward_hook(hook)]


def _global_always(blocks):
    def hook(module, _args, output):
        return squashed(output) if any(module is b for b in blocks) else None

    return [
        torch.nn.modules.module.register_module_forward_hook(hook, always_call=True)
    ]


def _global_pre(blocks):
    def hook(module, args):
        return squashed_args(args) if any(module is b for b in blocks) else None

    return [torch.nn.modules.module.register_module_forward_pre_hook(hook)]


class _Removes:
    """A handle taking accelerate's hook off a block."""

    def __init__(self, block):
        self.block = block

    def remove(self):
        from accelerate.hooks import remove_hook_from_module  # noqa: PLC0415

        remove_hook_from_module(self.block)


def _accelerate(blocks):
    hooks = pytest.importorskip("accelerate.hooks")

    class Squash(hooks.ModelHook):
        def pre_forward(self, _module, *args, **kwargs):
            return squashed_args(args), kwargs

        def post_forward(self, _module, output):
            return squashed(output)

    for block in blocks:  # an instance `forward` wrapping the class's
        hooks.add_hook_to_module(block, Squash())
    return [_Removes(block) for block in blocks]


HOOKS = {
    "forward": _forward,
    "forward, prepended": lambda blocks: _forward(blocks, prepend=True),
    "forward, always_call": lambda blocks: _forward(blocks, always_call=True),
    "forward, in place": _in_place,
    "forward, with_kwargs": _with_kwargs,
    "forward pre-hook": _pre,
    "forward pre-hook, with_kwargs": _pre_with_kwargs,
    "global forward": _global,
    "global forward, always_call": _global_always,
    "global forward pre-hook": _global_pre,
    "accelerate": _accelerate,
}


def _inputs():
    torch.manual_seed(1)
    clean = torch.randint(0, VOCAB, (B, T))
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1) % VOCAB
    return {"input_ids": clean}, {"input_ids": corrupted}


def _by_hand(model, blocks, clean, corrupted):
    """The grid as a loop of runs, each with one more forward hook, the patch.

    Registered after the user's hooks (as the recorder places its own, at the
    sweep's start): it reads and patches the output the user's hooks left.
    """
    kept = []
    handles = [
        b.register_forward_hook(lambda _m, _a, o: kept.append(stream(o).clone()))
        for b in blocks
    ]
    with torch.no_grad():
        model(**clean)
    for handle in handles:
        handle.remove()
    grid = torch.empty(len(blocks), T)
    for i, block in enumerate(blocks):
        for position in range(T):

            def put(_module, _args, output, i=i, position=position):
                new = stream(output).clone()
                new[:, position] = kept[i][:, position]
                return replaced(output, new)

            handle = block.register_forward_hook(put)
            with torch.no_grad():
                grid[i, position] = _logit_diff(model(**corrupted))
            handle.remove()
    return grid


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_a_users_hook_on_the_blocks_runs_once_around_an_answered_call(gpt2, kind):
    """Hooks of every kind: the reused prefix gives the grid of every block run.

    The cache is what each block's own ``forward`` returned; an answered call
    passes it through the hooks as a real call does (a cache taken after the
    hooks got a ``tanh`` hook applied twice: the grid off by ~1e-1).
    """
    model, rnet, blocks = gpt2
    clean, corrupted = _inputs()
    without = _by_hand(model, blocks, clean, corrupted)
    passes = [0]
    counter = model.register_forward_pre_hook(
        lambda *_: passes.__setitem__(0, passes[0] + 1)
    )
    handles = HOOKS[kind](blocks)
    forwards = [vars(block).get("forward") for block in blocks]  # accelerate's
    try:
        want = _by_hand(model, blocks, clean, corrupted)
        grids = {}
        for reuse in (True, False):
            passes[0] = 0
            grids[reuse] = patch_sweep(
                rnet,
                clean,
                corrupted,
                ["transformer.h.0", "transformer.h.1"],
                _logit_diff,
                max_batch=B,  # one cell a pass: the hooked run's [B, T, D] tensors
                reuse_prefix=reuse,
            )
            # the prefix reused: a clean pass, a corrupted one, a pass a cell
            assert passes[0] == (2 if reuse else 1) + 2 * T
        # the very forward attributes back (none, or accelerate's own)
        assert all(
            vars(block).get("forward") is forward
            for block, forward in zip(blocks, forwards, strict=True)
        )
    finally:
        for handle in [*handles, counter]:
            handle.remove()
    assert (want - without).abs().max() > 1e-2  # the hooks change the grid
    # One cell a pass: the blocks that run, run the same float32 ops on the
    # same [B, T, D] tensors as the hooked run, and an answered block gives
    # what its forward returned on the same rows of the corrupted run, through
    # the same hooks: bit for bit, both ways.
    assert torch.equal(grids[False], want)
    assert torch.equal(grids[True], want)


def test_capturing_keeps_what_forward_returned_before_the_hooks():
    layer = nn.Linear(2, 2)
    x = torch.ones(1, 2)
    with torch.no_grad():
        want = layer(x)
    handle = layer.register_forward_hook(lambda _m, _a, out: out.mul_(3))
    with capturing([layer]) as kept, torch.no_grad():
        got = layer(x)
    handle.remove()
    assert torch.equal(got, want * 3)  # the hook ran, in place
    assert torch.equal(kept[layer], want)  # the cache is forward's own return
    with answering({layer: kept[layer].clone}):
        handle = layer.register_forward_hook(lambda _m, _a, out: out.mul_(3))
        assert torch.equal(layer(x), got)  # the hook runs once around the answer
        handle.remove()
    assert "forward" not in vars(layer)
