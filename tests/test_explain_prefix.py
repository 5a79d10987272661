"""`explain._prefix`: calls answered from a cache, and nothing left behind.

The dispatcher that answers a module's calls during a patching sweep is
installed on the module itself (its ``forward``); these tests pin that it
answers only the thread and the ``with`` block that asked, and that the
module comes back as it was, whatever happens inside.
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
from scio_recorder.explain._prefix import answered_blocks, answering, find_stack


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
