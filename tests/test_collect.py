"""Tests of scio_recorder.collect: reductions, spilling, resume, progress."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import safetensors
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import CallInputs, InPlaceWarning, Recorder
from scio_recorder.collect import (
    LOCK,
    MANIFEST,
    CollectResult,
    Estimate,
    InputOf,
    collect,
    estimate,
)
from scio_recorder.io import save_records
from scio_recorder.reduce import (
    Count,
    CountResult,
    Covariance,
    Gram,
    MinMax,
    Moments,
    MomentsResult,
    PerClass,
    Quantiles,
    SharedCovariance,
)

F64 = torch.float64


# --------------------------------------------------------------------- helpers
def deep_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(3, 4),
        nn.Tanh(),
        nn.Linear(4, 4),
        nn.ReLU(),
        nn.Linear(4, 3),
        nn.Tanh(),
        nn.Linear(3, 3),
        nn.Sigmoid(),
        nn.Linear(3, 2),
        nn.Identity(),
    )


@functools.cache
def shared_rnet() -> Recorder:
    """One recorder reused across hypothesis examples (collect restores it)."""
    return Recorder(deep_net(), input_size=(1, 3))


def layer_outputs(net: nn.Sequential, x: torch.Tensor) -> list[torch.Tensor]:
    """The output of every layer of a Sequential, as its forward computes it."""
    outs = []
    with torch.no_grad():
        for layer in net:
            x = layer(x)
            outs.append(x)
    return outs


def make_batches(sizes: list[int], features: int = 3, classes: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(n, features, generator=gen),
            torch.randint(0, classes, (n,), generator=gen),
        )
        for n in sizes
    ]


def per_batch_features(net: nn.Sequential, batches) -> list[list[torch.Tensor]]:
    """features[layer][batch], computed batch by batch as collect sees them."""
    per_batch = [layer_outputs(net, x) for x, _ in batches]
    return [[outs[i] for outs in per_batch] for i in range(len(net))]


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> None:
    torch.testing.assert_close(a.to(F64), b.to(F64), rtol=tol, atol=tol, equal_nan=True)


class Flaky:
    """Yields batches; raises ``error`` when batch ``at`` is requested (once)."""

    def __init__(self, batches, at: int, error: BaseException) -> None:
        self.batches = batches
        self.at = at
        self.error = error
        self.armed = True

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            if i == self.at and self.armed:
                self.armed = False
                raise self.error
            yield batch


class FailingMoments(Moments):
    """Moments that raise once, in the update of the batch numbered ``left``."""

    left: dict[str, Any] = {"n": None, "error": RuntimeError}  # noqa: RUF012

    def update(self, value, target=None):
        left = FailingMoments.left
        if left["n"] is not None:
            if left["n"] == 0:
                left["n"] = None
                msg = "injected failure in a reducer"
                raise left["error"](msg)
            left["n"] -= 1
        super().update(value, target)


class Spy(Count):
    """Count that notes whether its records require grad."""

    seen: list[bool] = []  # noqa: RUF012

    def update(self, value, target=None):
        Spy.seen.append(value.requires_grad)
        super().update(value, target)


def count_calls(net: nn.Module) -> list[int]:
    """Count the passes that start (an early exit never ends the root call)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1

    net.register_forward_pre_hook(hook)
    return calls


def equal_results(a: Any, b: Any) -> bool:
    """Exact equality of results: tensors, dataclasses, dicts, lists."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and torch.equal(a.nan_to_num(123.0), b.nan_to_num(123.0))
        )
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(
            equal_results(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal_results(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(map(equal_results, a, b))
    return a == b


# ------------------------------------------------ reductions equal the oracle
KEEP = {
    (1, 1): "concat",
    (1, 2): "moments",
    (1, 3): Covariance(),
    (1, 4): Gram(),
    (1, 5): MinMax(),
    (1, 6): Quantiles([0.0, 0.3, 0.5, 1.0]),
    (1, 7): SharedCovariance(num_classes=3),
    (1, 8): PerClass(Moments, num_classes=3),
    (1, 9): "count",
    (1, 10): "all",
}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5))
def test_every_reduction_equals_the_direct_computation(sizes):
    rnet = shared_rnet()
    batches = make_batches(sizes)
    result = collect(rnet, batches, KEEP, target=1)
    feats = per_batch_features(rnet.net, batches)
    full = [torch.cat(f) for f in feats]
    y = torch.cat([t for _, t in batches])
    n = sum(sizes)
    assert result.samples == n
    assert result.batches == len(sizes)

    assert torch.equal(result[(1, 1)], full[0])

    mom = result[(1, 2)]
    x = full[1].to(F64)
    assert mom.count == n
    assert_close(mom.mean, x.mean(0))
    assert_close(mom.var_population, x.var(0, correction=0))
    if n > 1:
        assert_close(mom.var, x.var(0))

    cov = result[(1, 3)]
    x = full[2].to(F64)
    assert_close(cov.mean, x.mean(0))
    assert_close(cov.cov_population, torch.cov(x.T, correction=0).reshape(4, 4))

    x = full[3].to(F64)
    assert_close(result[(1, 4)].sum, x.T @ x)

    mm = result[(1, 5)]
    assert torch.equal(mm.min, full[4].amin(0))
    assert torch.equal(mm.max, full[4].amax(0))

    q = torch.tensor([0.0, 0.3, 0.5, 1.0], dtype=F64)
    assert_close(result[(1, 6)], torch.quantile(full[5].to(F64), q, dim=0))

    shared = result[(1, 7)]
    x = full[6].to(F64)
    within = torch.zeros(3, 3, dtype=F64)
    for c in range(3):
        part = x[y == c]
        assert shared.class_counts[c] == part.shape[0]
        if part.shape[0]:
            assert_close(shared.means[c], part.mean(0))
            centred = part - part.mean(0)
            within += centred.T @ centred
    assert_close(shared.cov, within / n)

    per_class = result[(1, 8)]
    x = full[7].to(F64)
    assert sorted(per_class) == sorted(set(y.tolist()))
    for c, res in per_class.items():
        assert res.count == int((y == c).sum())
        assert_close(res.mean, x[y == c].mean(0))

    assert result[(1, 9)] == CountResult(records=len(sizes), samples=n)
    kept = result[(1, 10)]
    assert len(kept) == len(sizes)
    assert all(torch.equal(a, b) for a, b in zip(kept, feats[9], strict=True))


def test_selectors_names_and_labels_of():
    rnet = Recorder(deep_net(), input_size=(1, 3))
    result = collect(rnet, make_batches([4, 4]), {nn.Tanh: "moments", "0": "concat"})
    assert list(result) == [(1, 1), (1, 2), (1, 6)]
    assert result.labels_of[nn.Tanh] == ((1, 2), (1, 6))
    assert result.labels_of["0"] == ((1, 1),)
    assert isinstance(result[(1, 2)], MomentsResult)
    assert "CollectResult(samples=8, batches=2" in repr(result)


def test_collect_result_shows_as_an_html_table_in_jupyter():
    rnet = Recorder(deep_net(), input_size=(1, 3))
    result = collect(rnet, make_batches([4, 4]), {nn.Tanh: "moments", "0": "concat"})
    html = result._repr_html_()
    assert "<caption>CollectResult: 8 samples in 2 batches</caption>" in html
    assert html.count("<tr>") == 1 + len(result)
    assert (
        '<td style="text-align:left">1-2</td><td style="text-align:left">1</td>' in html
    )
    assert ">Tanh</td>" in html


def test_per_class_statistics_with_dict_batches():
    net = nn.Sequential(nn.Linear(3, 2))
    rnet = Recorder(net, input_size=(1, 3))
    gen = torch.Generator().manual_seed(1)
    batches = [
        {"x": torch.randn(6, 3, generator=gen), "y": torch.tensor([0, 1, 1, 2, 0, 1])}
        for _ in range(3)
    ]
    result = collect(
        rnet,
        batches,
        {(1, 1): PerClass(Covariance, num_classes=3)},
        input="x",
        target="y",
    )
    with torch.no_grad():
        x = torch.cat([net(b["x"]) for b in batches]).to(F64)
    y = torch.cat([b["y"] for b in batches])
    for c in range(3):
        res = result[(1, 1)][c]
        assert res.count == int((y == c).sum())
        assert_close(res.mean, x[y == c].mean(0))
        assert_close(res.cov, torch.cov(x[y == c].T))


def test_input_forms():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 2)
            self.b = nn.Linear(3, 2)

        def forward(self, x, z):
            return self.a(x) + self.b(z)

    net = TwoInputs()
    rnet = Recorder(net, input_data=[torch.zeros(1, 3), torch.zeros(1, 3)])
    xs, zs = torch.randn(5, 3), torch.randn(5, 3)
    keep = {"a": "concat", "b": "concat"}
    by_tuple = collect(rnet, [(xs, zs, 0)], keep, input=lambda b: (b[0], b[1]))
    by_kwargs = collect(rnet, [(xs, zs)], keep, input=lambda b: {"x": b[0], "z": b[1]})
    with torch.no_grad():
        assert torch.equal(by_tuple[(1, 1)], net.a(xs))
        assert torch.equal(by_kwargs[(1, 2)], net.b(zs))

    single = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    whole = collect(single, [xs], {(1, 1): "concat"}, input=None)
    assert whole[(1, 1)].shape == (5, 2)
    with pytest.raises(TypeError, match="input=None"):
        collect(single, [xs], {(1, 1): "concat"})
    with pytest.raises(ValueError, match="cannot take item 3"):
        collect(single, [(xs,)], {(1, 1): "concat"}, input=3)
    with pytest.raises(KeyError, match="no such key"):
        collect(single, [{"x": xs}], {(1, 1): "concat"}, input="image")


def test_device_and_to_options():
    rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    batches = make_batches([3, 2])
    a = collect(rnet, batches, {(1, 1): "moments"}, device="cpu", to="cpu", target=1)
    b = collect(rnet, batches, {(1, 1): "moments"})
    assert equal_results(a[(1, 1)], b[(1, 1)])


# ------------------------------------------------------------------- spilling
@pytest.mark.parametrize("width", [64, 4])
def test_spill_with_tiny_budget_equals_in_memory(width, tmp_path):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, width), nn.ReLU())
    rnet = Recorder(net, input_size=(1, 3))
    batches = make_batches([8] * 12)
    keep = {(1, 1): "concat", (1, 2): "concat"}
    ram = collect(rnet, batches, keep)
    budget = 1024
    spilled = collect(rnet, batches, keep, memory_budget=budget)
    batch_bytes = 2 * 8 * width * 4
    for label in keep:
        assert isinstance(spilled[label], torch.Tensor)
        assert torch.equal(spilled[label], ram[label])
    assert spilled.peak_bytes <= budget + batch_bytes
    assert ram.peak_bytes == 12 * batch_bytes

    on_disk = collect(rnet, batches, keep, memory_budget=budget, spill_dir=tmp_path)
    for label in keep:
        assert torch.equal(on_disk[label], ram[label])
        path = on_disk.files[label]
        assert path.parent == tmp_path
        assert path.stat().st_size == ram[label].numel() * 4
    assert on_disk.peak_bytes <= batch_bytes  # checkpoints spill every batch
    assert "mmap" in repr(on_disk)
    # the mapping is private: writing to the result does not touch the file
    before = path.read_bytes()
    on_disk[(1, 2)][0, 0] = 1234.0
    assert path.read_bytes() == before


def test_streaming_memory_does_not_grow():
    rnet = Recorder(nn.Sequential(nn.Linear(3, 5)), input_size=(1, 3))
    keep = {(1, 1): "covariance"}

    def state_bytes(result: CollectResult) -> int:
        state = result.reducers[(1, 1)].state()
        return sum(t.numel() * t.element_size() for t in state.values())

    small = collect(rnet, make_batches([4] * 2), keep)
    large = collect(rnet, make_batches([4] * 40), keep)
    assert state_bytes(small) == state_bytes(large)
    assert large.peak_bytes == 0


# ------------------------------------------------------- interrupt and resume
RESUME_KEEP = {
    (1, 1): "concat",
    (1, 2): FailingMoments(),
    (1, 3): SharedCovariance(num_classes=3),
    (1, 4): Quantiles([0.1, 0.9], exact=False, k=8),
    (1, 5): "concat",
}


def uninterrupted(batches):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    return collect(rnet, batches, RESUME_KEEP, target=1)


def assert_same(a: CollectResult, b: CollectResult) -> None:
    assert list(a) == list(b)
    for label in a:
        assert equal_results(a[label], b[label]), label
    assert (a.samples, a.batches) == (b.samples, b.batches)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("where", ["loader", "input", "reducer"])
@pytest.mark.parametrize("every", [None, 3])
def test_interrupt_then_resume_equals_uninterrupted(tmp_path, error, where, every):
    batches = make_batches([5, 3, 4, 5, 2, 5, 1, 4])
    expected = uninterrupted(batches)
    net = deep_net()
    rnet = Recorder(net, input_size=(1, 3))
    calls = count_calls(net)
    at = 5
    source: Any = batches
    get_input: Any = 0
    if where == "loader":
        source = Flaky(batches, at, error("injected failure in the loader"))
    elif where == "input":
        state = {"n": 0}

        def get_input(batch):
            state["n"] += 1
            if state["n"] == at + 1:
                msg = "injected failure in the input"
                raise error(msg)
            return batch[0]

    else:
        FailingMoments.left.update(n=at, error=error)

    kwargs = {"target": 1, "spill_dir": tmp_path, "checkpoint_every": every}
    with pytest.raises(error, match="injected"):
        collect(rnet, source, RESUME_KEEP, input=get_input, **kwargs)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    # between batches everything completed is checkpointed; within a batch's
    # reduction, the last checkpoint stands
    saved = manifest["batches"]
    assert saved == (at if where != "reducer" else (at if every is None else 3))
    assert not manifest["complete"]
    ran = at + (where == "reducer")  # the failing reducer ran after the pass
    assert calls[0] == ran

    resumed = collect(rnet, source, RESUME_KEEP, input=get_input, **kwargs)
    assert calls[0] == ran + len(batches) - saved  # skipped batches are not run
    assert_same(resumed, expected)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["complete"]
    assert manifest["batches"] == len(batches)
    with safetensors.safe_open(tmp_path / manifest["states"], "pt") as file:
        assert file.metadata()["batches"] == str(len(batches))


def test_finished_run_is_not_recomputed(tmp_path):
    batches = make_batches([4, 4, 4])
    net = deep_net()
    rnet = Recorder(net, input_size=(1, 3))
    calls = count_calls(net)
    first = collect(
        rnet, batches, RESUME_KEEP, target=1, spill_dir=tmp_path, durable=True
    )
    assert calls[0] == 3
    again = collect(rnet, batches, RESUME_KEEP, target=1, spill_dir=tmp_path)
    assert calls[0] == 3
    assert_same(first, again)
    fresh = collect(
        rnet, batches, RESUME_KEEP, target=1, spill_dir=tmp_path, resume=False
    )
    assert calls[0] == 6
    assert_same(first, fresh)
    assert torch.equal(first[(1, 1)], fresh[(1, 1)])  # old mapping still valid


def test_manifest_mismatch_names_the_difference(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([3, 3])
    collect(rnet, batches, {(1, 1): "concat", (1, 2): "moments"}, spill_dir=tmp_path)
    with pytest.raises(ValueError, match=r"reducers of 1-2.*Covariance") as info:
        collect(
            rnet, batches, {(1, 1): "concat", (1, 2): "covariance"}, spill_dir=tmp_path
        )
    assert "another `spill_dir`" in str(info.value)
    assert "resume=False" in str(info.value)
    with pytest.raises(ValueError, match="input: saved 0, now 'x'"):
        collect(
            rnet,
            [{"x": x} for x, _ in batches],
            {(1, 1): "concat", (1, 2): "moments"},
            input="x",
            spill_dir=tmp_path,
        )
    result = collect(
        rnet,
        batches,
        {(1, 1): "concat", (1, 2): "covariance"},
        spill_dir=tmp_path,
        resume=False,
    )
    assert result[(1, 2)].count == 6


def test_resume_with_other_batches_is_refused(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([4, 4, 4, 4])
    with pytest.raises(RuntimeError):
        collect(
            rnet,
            Flaky(batches, 3, RuntimeError()),
            {(1, 1): "concat"},
            spill_dir=tmp_path,
        )
    with pytest.raises(ValueError, match="the batches differ"):
        collect(
            rnet, make_batches([3, 3, 3, 3]), {(1, 1): "concat"}, spill_dir=tmp_path
        )
    with pytest.raises(ValueError, match="yielded 2 batches"):
        collect(rnet, batches[:2], {(1, 1): "concat"}, spill_dir=tmp_path)
    result = collect(rnet, batches, {(1, 1): "concat"}, spill_dir=tmp_path)
    assert result[(1, 1)].shape == (16, 4)


def test_truncated_spill_file_is_refused(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([4, 4, 4])
    with pytest.raises(RuntimeError):
        collect(
            rnet,
            Flaky(batches, 2, RuntimeError()),
            {(1, 1): "concat"},
            spill_dir=tmp_path,
        )
    (tmp_path / "concat-1-1.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="incomplete"):
        collect(rnet, batches, {(1, 1): "concat"}, spill_dir=tmp_path)


# ------------------------------------------------- one run per spill folder
LOCK_CHILD = """
import sys, torch
from torch import nn
from scio_recorder import Recorder
from scio_recorder.collect import collect

torch.manual_seed(0)
rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))

def batches():
    yield torch.ones(2, 3)
    print("holding", flush=True)
    sys.stdin.readline()  # the parent says when to go on
    yield torch.ones(2, 3)

collect(rnet, batches(), {(1, 1): "concat"}, input=None, spill_dir=sys.argv[1])
print("done", flush=True)
"""


@pytest.mark.slow
def test_a_second_process_in_a_locked_spill_dir_is_refused(tmp_path):
    """A real second process holds the folder: the run is refused, naming the
    folder, the owner's pid and what to do; once it has ended, the folder is
    free (and the lock file gone)."""
    rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    with subprocess.Popen(  # noqa: S603 (this interpreter, a fixed script)
        [sys.executable, "-c", LOCK_CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        try:
            assert child.stdout.readline().strip() == "holding"
            owner = json.loads((tmp_path / LOCK).read_text())
            assert owner["pid"] == child.pid
            assert owner["host"] == socket.gethostname()
            pattern = (
                rf"'{re.escape(str(tmp_path))}' is in use by another collect run: "
                rf"locked by pid {child.pid} on host .*Wait for that run to end, "
                r"use another `spill_dir`, or delete the lock file"
            )
            with pytest.raises(RuntimeError, match=pattern):
                collect(
                    rnet,
                    [torch.ones(2, 3)],
                    {(1, 1): "concat"},
                    input=None,
                    spill_dir=tmp_path,
                )
            # the refused run touched nothing of the owner's run
            assert json.loads((tmp_path / LOCK).read_text()) == owner
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
            assert child.wait(timeout=60) == 0
        finally:
            child.kill()
    assert not (tmp_path / LOCK).exists()
    result = collect(
        rnet,
        [torch.ones(2, 3)] * 2,
        {(1, 1): "concat"},
        input=None,
        spill_dir=tmp_path,
    )  # the child's finished run, resumed
    assert result.samples == 4


def test_a_second_thread_in_a_locked_spill_dir_is_refused(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    other = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([2, 2])
    inside, leave = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def slow():
        yield batches[0]
        inside.set()
        leave.wait(30)
        yield batches[1]

    def first():
        results["first"] = collect(rnet, slow(), {(1, 1): "concat"}, spill_dir=tmp_path)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(30)
        with pytest.raises(RuntimeError, match=r"this process: another thread"):
            collect(other, batches, {(1, 1): "concat"}, spill_dir=tmp_path)
    finally:
        leave.set()
        thread.join(30)
    assert results["first"][(1, 1)].shape == (4, 4)
    assert not (tmp_path / LOCK).exists()


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("whose", ["dead process", "earlier process, same pid"])
def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, whose):
    pid = dead_pid() if whose == "dead process" else os.getpid()
    stale = {"pid": pid, "host": socket.gethostname(), "started": "x", "token": "0"}
    (tmp_path / LOCK).write_text(json.dumps(stale))
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([2, 3])
    with pytest.warns(RuntimeWarning, match=rf"locked by pid {pid} .*no longer runs"):
        result = collect(rnet, batches, {(1, 1): "concat"}, spill_dir=tmp_path)
    assert result[(1, 1)].shape == (5, 4)
    assert not (tmp_path / LOCK).exists()


def test_a_lock_of_another_host_is_not_taken_over(tmp_path):
    owner = {"pid": 1, "host": "elsewhere.invalid", "started": "x", "token": "0"}
    (tmp_path / LOCK).write_text(json.dumps(owner))
    rnet = Recorder(deep_net(), input_size=(1, 3))
    with pytest.raises(RuntimeError, match=r"pid 1 on host 'elsewhere\.invalid'"):
        collect(rnet, make_batches([2]), {(1, 1): "concat"}, spill_dir=tmp_path)
    assert json.loads((tmp_path / LOCK).read_text()) == owner


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_lock_is_removed_after_an_error(tmp_path, error):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([2, 2, 2])
    with pytest.raises(error):
        collect(
            rnet,
            Flaky(batches, 1, error("injected")),
            {(1, 1): "concat"},
            spill_dir=tmp_path,
        )
    assert not (tmp_path / LOCK).exists()
    result = collect(rnet, batches, {(1, 1): "concat"}, spill_dir=tmp_path)
    assert result[(1, 1)].shape == (6, 4)


# ------------------------------------------------ damaged or edited manifests
DAMAGE_KEEP = {(1, 1): "concat", (1, 2): "moments", (1, 3): "concat"}


@functools.cache
def interrupted_run() -> tuple[Path, dict[str, Any]]:
    """A run interrupted after 3 of 5 batches: its folder and its manifest."""
    folder = Path(tempfile.mkdtemp(prefix="scio-test-interrupted-"))
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([4, 3, 5, 4, 4])
    with pytest.raises(RuntimeError):
        collect(rnet, Flaky(batches, 3, RuntimeError()), DAMAGE_KEEP, spill_dir=folder)
    return folder, json.loads((folder / MANIFEST).read_text())


def damaged_copy(where: Path) -> Path:
    folder, _ = interrupted_run()
    shutil.copytree(folder, where)
    return where


WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.lists(st.integers(-3, 40), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
FIELDS = [
    ("batches",),
    ("samples",),
    ("complete",),
    ("states",),
    ("concat",),
    ("format",),
    ("fingerprint",),
    *(
        ("concat", key, field)
        for key in ("1-1", "1-3")
        for field in ("file", "rows", "bytes", "dtype", "shape")
    ),
]


def same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    field=st.sampled_from(FIELDS),
    value=st.one_of(WRONG, st.just("<delete>")),
)
def test_a_damaged_manifest_is_refused_never_resumed(field, value):
    """Any field set to a wrong type, a negative or an inconsistent value (or
    deleted) is a ValueError naming the folder and `resume=False`."""
    _, manifest = interrupted_run()
    data = json.loads(json.dumps(manifest))
    *parents, last = field
    holder = data
    for key in parents:
        holder = holder[key]
    if value == "<delete>":
        del holder[last]
    else:
        if same_json(holder[last], value):
            return  # not a change
        holder[last] = value
    with tempfile.TemporaryDirectory() as where:
        folder = damaged_copy(Path(where) / "run")
        (folder / MANIFEST).write_text(json.dumps(data))
        rnet = shared_rnet()
        batches = make_batches([4, 3, 5, 4, 4])
        with pytest.raises(ValueError, match=re.escape(str(folder))) as info:
            collect(rnet, batches, DAMAGE_KEEP, spill_dir=folder)
        assert "resume=False" in str(info.value)
        result = collect(rnet, batches, DAMAGE_KEEP, spill_dir=folder, resume=False)
        assert result.samples == 20


@pytest.mark.parametrize(
    ("field", "value"),
    [("batches", -2), ("batches", 1), ("samples", 11), ("complete", True)],
)
def test_consistent_looking_edits_are_refused(tmp_path, field, value):
    """Edits of the right type and range: the states file names the truth.
    (A negative batch count used to resume into 550 samples instead of 400.)"""
    folder = damaged_copy(tmp_path / "run")
    data = json.loads((folder / MANIFEST).read_text())
    data[field] = value
    (folder / MANIFEST).write_text(json.dumps(data))
    rnet = Recorder(deep_net(), input_size=(1, 3))
    with pytest.raises(ValueError, match=rf"'{re.escape(str(folder))}'.*edited"):
        collect(rnet, make_batches([4, 3, 5, 4, 4]), DAMAGE_KEEP, spill_dir=folder)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_a_damaged_states_file_is_a_value_error_naming_it(tmp_path, damage):
    folder = damaged_copy(tmp_path / "run")
    path = folder / json.loads((folder / MANIFEST).read_text())["states"]
    raw = path.read_bytes()
    path.write_bytes(
        {"empty": b"", "truncated": raw[: len(raw) // 2], "garbage": b"x" * 64}[damage]
    )
    rnet = Recorder(deep_net(), input_size=(1, 3))
    with pytest.raises(ValueError, match=rf"'{re.escape(str(path))}'.*cannot be read"):
        collect(rnet, make_batches([4, 3, 5, 4, 4]), DAMAGE_KEEP, spill_dir=folder)


def test_a_states_file_without_the_digest_still_resumes(tmp_path):
    """States written before the manifest digest: resumed, fields still checked."""
    folder = damaged_copy(tmp_path / "run")
    path = folder / json.loads((folder / MANIFEST).read_text())["states"]
    with safetensors.safe_open(path, "pt") as file:
        meta = file.metadata()
        states = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118
    meta.pop("manifest", None)
    safetensors.torch.save_file(states, str(path), meta)
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([4, 3, 5, 4, 4])
    resumed = collect(rnet, batches, DAMAGE_KEEP, spill_dir=folder)
    expected = collect(rnet, batches, DAMAGE_KEEP)
    for label in expected:
        assert equal_results(resumed[label], expected[label])


# ------------------------------------------------------------------- progress
def test_progress_silent_when_not_a_tty(capsys):
    rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    collect(rnet, make_batches([3, 3]), {(1, 1): "moments"})
    assert capsys.readouterr().err == ""


def test_progress_forced(capsys):
    rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    collect(rnet, make_batches([3, 3]), {(1, 1): "moments"}, progress=True)
    err = capsys.readouterr().err
    assert "sample" in err
    assert "6" in err


def test_estimate_is_logged_with_a_budget(caplog):
    rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    data = torch.utils.data.TensorDataset(torch.randn(10, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    with caplog.at_level(logging.INFO, logger="scio_recorder.collect"):
        result = collect(rnet, loader, {(1, 1): "concat"}, memory_budget=16)
    assert "kept 8 B/sample (80 B for 10 samples)" in caplog.text
    assert "exceed the memory budget" in caplog.text
    assert result.estimate is not None
    assert result.estimate.num_samples == 10


# ------------------------------------------------------------------- estimate
def test_estimate_matches_hand_computation():
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10))
    rnet = Recorder(net, input_size=(1, 3, 10, 10))
    est = estimate(
        rnet, {(1, 1): "concat", (1, 4): "moments", (1, 3): Covariance()}, 100
    )
    assert isinstance(est, Estimate)
    assert est.per_sample == {(1, 1): 8 * 8 * 8 * 4, (1, 3): 512 * 4, (1, 4): 10 * 4}
    assert est.bytes_per_sample == 2048 + 2048 + 40
    assert est.total == 100 * (2048 + 2048 + 40)
    assert est.stored_total == 100 * 2048
    rows = {row.label: row for row in est.labels}
    assert rows[(1, 1)].shape == (8, 8, 8)
    assert rows[(1, 4)].state_bytes == 2 * 10 * 8
    assert rows[(1, 3)].state_bytes == 8 * (512 + 512 * 512)
    assert "1-1    0     concat" in str(est)


def test_estimate_uses_the_reference_dtype():
    net = nn.Sequential(nn.Linear(5, 4)).double()
    rnet = Recorder(net, input_data=torch.zeros(1, 5, dtype=torch.float64))
    est = estimate(rnet, {(1, 1): "concat"}, 3)
    assert est.labels[0].itemsize == 8
    assert est.per_sample == {(1, 1): 32}
    assert estimate(rnet, {(1, 1): "concat"}).total is None


# -------------------------------------------------------- selection, autograd
def select_everything(rnet: Recorder) -> None:
    rnet.record((1, 3), inputs=(1, 1), grads=(1, 3), params="0", clone=True, dtype=F64)


def test_selection_restored_after_collect():
    rnet = Recorder(deep_net(), input_size=(1, 3))
    select_everything(rnet)
    before, options = rnet.selection, rnet.record_options
    collect(rnet, make_batches([2]), {(1, 5): "concat"})
    assert rnet.selection == before
    assert rnet.record_options == options
    out = rnet(torch.randn(2, 3))
    assert rnet.activations[(1, 3)].dtype == F64
    assert out.shape == (2, 2)


def test_selection_restored_after_an_error():
    rnet = Recorder(deep_net(), input_size=(1, 3))
    select_everything(rnet)
    before, options = rnet.selection, rnet.record_options
    with pytest.raises(RuntimeError, match="boom"):
        collect(
            rnet,
            Flaky(make_batches([2, 2]), 1, RuntimeError("boom")),
            {(1, 5): "concat"},
        )
    assert rnet.selection == before
    assert rnet.record_options == options


@pytest.mark.parametrize("grad", [False, True])
def test_grad_flag(grad):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    Spy.seen = []
    collect(rnet, make_batches([2, 2]), {(1, 1): Spy()}, grad=grad)
    assert Spy.seen == [grad, grad]


def test_clone_keeps_outputs_modified_in_place_later():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True))
    rnet = Recorder(net, input_size=(1, 3))
    x = torch.randn(6, 3)
    result = collect(rnet, [x], {(1, 1): "concat"}, input=None, clone=True)
    with torch.no_grad():
        assert torch.equal(result[(1, 1)], net[0](x))
    assert (result[(1, 1)] < 0).any()
    # Full passes run the in-place ReLU: the records are copies (the
    # reference pass saw the ReLU overwrite the Linear's output), exact.
    with warnings.catch_warnings():
        warnings.simplefilter("error", InPlaceWarning)
        result = collect(rnet, [x], {(1, 1): "concat"}, input=None, early_exit=False)
    with torch.no_grad():
        assert torch.equal(result[(1, 1)], net[0](x))
    # By default the pass stops after the Linear: the ReLU never runs.
    result = collect(rnet, [x], {(1, 1): "concat"}, input=None)
    with torch.no_grad():
        assert torch.equal(result[(1, 1)], net[0](x))


# ---------------------------------------------------------------- errors
def test_argument_errors(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([2])
    with pytest.raises(ValueError, match="selected by both"):
        collect(rnet, batches, {(1, 1): "concat", nn.Linear: "moments"})
    with pytest.raises(ValueError, match="needs per-sample class labels"):
        collect(rnet, batches, {(1, 1): SharedCovariance()})
    with pytest.raises(ValueError, match="collect also accepts 'concat'"):
        collect(rnet, batches, {(1, 1): "median"})
    with pytest.raises(TypeError, match="instance"):
        collect(rnet, batches, {(1, 1): Moments})
    with pytest.raises(ValueError, match="not found"):
        collect(rnet, batches, {(5, 5): "concat"})
    with pytest.raises(ValueError, match="is empty"):
        collect(rnet, batches, {})
    with pytest.raises(ValueError, match="gather"):
        collect(rnet, batches, {(1, 1): "concat"}, gather=1)
    with pytest.raises(ValueError, match="needs a `spill_dir`"):
        collect(rnet, batches, {(1, 1): "concat"}, checkpoint_every=2)
    with pytest.raises(ValueError, match="no batch"):
        collect(rnet, [], {(1, 1): "concat"})
    with pytest.raises(TypeError, match="cannot give its state"):
        collect(rnet, batches * 2, {(1, 1): lambda a, b: [a, b]}, spill_dir=tmp_path)


# ---------------------------------------------------------------- save / load
def test_save_and_load_round_trip(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    result = collect(rnet, make_batches([4, 5]), KEEP, target=1)
    path = result.save(tmp_path / "results.safetensors")
    loaded = CollectResult.load(path, rnet)
    assert (loaded.samples, loaded.batches) == (9, 2)
    for label in KEEP:
        assert equal_results(loaded[label], result[label]), label
    other = Recorder(nn.Sequential(nn.ReLU()), input_size=(1, 3))
    with pytest.raises(ValueError, match="given table"):
        CollectResult.load(path, other)


def test_load_refuses_plain_records(tmp_path):
    path = save_records(tmp_path / "r.safetensors", {"x": torch.ones(1)})
    with pytest.raises(ValueError, match="load_records"):
        CollectResult.load(path)


def test_unknown_dataclasses_load_as_dicts(tmp_path):
    @dataclasses.dataclass
    class Mine:
        total: torch.Tensor

    result = CollectResult({(1, 1): Mine(torch.ones(2))}, samples=1, batches=1)
    path = result.save(tmp_path / "r.safetensors")
    plain = CollectResult.load(path)[(1, 1)]
    assert isinstance(plain, dict)
    assert torch.equal(plain["total"], torch.ones(2))
    rebuilt = CollectResult.load(path, types=[Mine])[(1, 1)]
    assert isinstance(rebuilt, Mine)


def test_unreadable_manifest(tmp_path):
    rnet = Recorder(deep_net(), input_size=(1, 3))
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        collect(rnet, make_batches([2]), {(1, 1): "concat"}, spill_dir=tmp_path)
    result = collect(
        rnet, make_batches([2]), {(1, 1): "concat"}, spill_dir=tmp_path, resume=False
    )
    assert result[(1, 1)].shape == (2, 4)
    assert json.loads((tmp_path / MANIFEST).read_text())["complete"]


def test_progress_disabled(capsys):
    rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    collect(rnet, make_batches([3]), {(1, 1): "moments"}, progress=False)
    assert capsys.readouterr().err == ""


def test_docs_examples_run(tmp_path, monkeypatch):
    """The examples of docs/collect.md before its distributed section run."""
    text = (Path(__file__).parents[1] / "docs" / "collect.md").read_text("utf-8")
    local = text[: text.index("## Distributed runs")]
    blocks = re.findall(r"^```python\n(.*?)^```", local, re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_collect"}
    for block in blocks:
        exec(compile(block, "docs/collect.md", "exec"), namespace)  # noqa: S102
    assert namespace["result"][(1, 3)].shape == (1000, 4)
    assert (tmp_path / "runs" / "train-feats" / MANIFEST).is_file()


# ------------------------------------------------------------ layer inputs
def test_input_of_reduces_what_the_layer_receives():
    """``InputOf`` statistics equal the same statistics of the inputs by hand."""
    rnet = Recorder(deep_net(), input_size=(1, 3))
    batches = make_batches([4, 5, 3])
    result = collect(
        rnet,
        batches,
        {InputOf("4"): SharedCovariance(num_classes=3), InputOf(nn.Sigmoid): "concat"},
        target=1,
    )
    feats = per_batch_features(rnet.net, batches)
    y = torch.cat([t for _, t in batches])
    x = torch.cat(feats[3]).to(F64)  # the input of layer "4" is the output of "3"
    shared = result[(1, 5)]
    within = torch.zeros(4, 4, dtype=F64)
    for c in range(3):
        part = x[y == c]
        assert_close(shared.means[c], part.mean(0))
        within += (part - part.mean(0)).T @ (part - part.mean(0))
    assert_close(shared.cov, within / x.shape[0])
    assert torch.equal(result[(1, 8)], torch.cat(feats[6]))
    assert result.labels_of[InputOf(nn.Sigmoid)] == ((1, 8),)
    assert rnet.recording == ()  # the selection is restored


def test_input_of_a_keyword_argument():
    class Mix(nn.Module):
        def forward(self, x, *, scale):
            return x * scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = Mix()

        def forward(self, x):
            return self.mix(x, scale=x + 1)

    rnet = Recorder(Net(), input_data=[torch.zeros(2, 3)])
    data = [torch.randn(4, 3) for _ in range(3)]
    result = collect(rnet, data, {InputOf("mix", arg="scale"): "concat"}, input=None)
    assert torch.equal(result[(1, 1)], torch.cat(data) + 1)
    msg = (
        "Cannot reduce the inputs of 1-1 (Mix `mix`): the call has no keyword "
        "argument 'mask'. Name an argument the module receives with "
        "`InputOf('mix', arg=...)` (ints for positional arguments, strings for "
        "keyword ones)."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        collect(rnet, data, {InputOf("mix", arg="mask"): "concat"}, input=None)


def test_output_and_input_of_one_label_are_refused():
    rnet = Recorder(deep_net(), input_size=(1, 3))
    with pytest.raises(ValueError, match="is selected by both"):
        collect(rnet, make_batches([2]), {"0": "moments", InputOf("0"): "moments"})


def test_input_of_a_bad_arg_is_a_type_error():
    with pytest.raises(TypeError, match=r"^InputOf: arg must be a positional index"):
        InputOf("0", arg=1.5)


# ------------------------------------------------------------- class labels
@pytest.mark.parametrize(
    "reducer",
    [SharedCovariance(num_classes=3), PerClass(Moments, num_classes=3)],
    ids=["SharedCovariance", "PerClass"],
)
@pytest.mark.parametrize("bad", [7, -1])
def test_collect_checks_class_labels_before_any_reducer_sees_them(reducer, bad):
    """A label outside [0, 3) fails with the reducer, the value, the range and
    the fix; the model records exactly afterwards and keeps no hook."""
    net = deep_net()
    rnet = Recorder(net, input_size=(1, 3))
    rnet.record((1, 2))
    hooks_before = [len(m._forward_hooks) for m in net.modules()]
    x = torch.randn(4, 3)
    batches = [(x, torch.tensor([0, 1, 2, 1])), (x, torch.tensor([0, bad, 2, 1]))]
    name = type(reducer).__name__
    msg = (
        f"keep[(1, 3)]: {name}: class label {bad} is outside [0, 3). Labels must "
        "be class indices in [0, num_classes): drop those samples, or pass a "
        "num_classes that covers every class."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        collect(rnet, batches, {(1, 3): reducer}, target=1)
    assert [len(m._forward_hooks) for m in net.modules()] == hooks_before
    assert rnet.recording == ((1, 2),)
    rnet(x)
    torch.testing.assert_close(rnet.activations[(1, 2)], layer_outputs(net, x)[1])


# ------------------------------------------------- device moves of nested values
Pair = collections.namedtuple("Pair", "a b")  # noqa: PYI024 (a plain namedtuple on purpose)


class SwapPair(nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> Pair:
        return Pair(pair[1] * 2, pair[0] + 1)


class PairNet(nn.Module):
    """A parameter-free net (it runs on the meta device too) of a named tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.swap = SwapPair()

    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.swap(pair)[0]


class Seen(Count):
    """Count that keeps the records it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[Any] = []

    def update(self, value, target=None):
        self.values.append(value)
        super().update(value, target)


@pytest.mark.parametrize("option", ["device", "to"])
def test_device_moves_named_tuple_arguments_and_records(option):
    """`device=` moves named-tuple arguments, `to=` named-tuple records."""
    # torchinfo (the reference pass) cannot count named-tuple inputs: the
    # reference input is a plain tuple, the batches pass named tuples.
    rnet = Recorder(PairNet(), input_data=[(torch.zeros(1, 3), torch.zeros(1, 3))])
    seen = Seen()
    batch = Pair(torch.randn(4, 3), torch.randn(4, 3))
    collect(rnet, [batch], {(1, 1): seen}, input=lambda b: (b,), **{option: "meta"})
    (record,) = seen.values
    # With `device=` the net ran on meta tensors (the argument was moved);
    # with `to=` the record was moved after the CPU pass.
    assert type(record) is Pair
    assert [t.device.type for t in record] == ["meta", "meta"]
    assert [t.shape for t in record] == [(4, 3), (4, 3)]


def test_collect_runs_under_its_three_spellings():
    """The module, the name bound in the package, and the function agree."""
    import scio_recorder  # noqa: PLC0415 (the spellings tested)
    import scio_recorder.collect as face  # noqa: PLC0415
    from scio_recorder import collect as bound  # noqa: PLC0415

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU())
    rnet = Recorder(net, input_size=(1, 5))
    data = [(torch.randn(3, 5), 0) for _ in range(2)]
    results = [
        spelling(rnet, data, {(1, 1): "concat"})[(1, 1)]
        for spelling in (scio_recorder.collect, bound, face.collect, face)
    ]
    for result in results[1:]:
        assert torch.equal(result, results[0])  # the same pass, the same tensors
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        face(rnet, data)


def test_a_callable_input_may_return_call_inputs():
    """`CallInputs` is args and kwargs, as in `explain` (one convention)."""

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
            return self.fc(x) * scale

    rnet = Recorder(Scaled(), input_size=(1, 3))
    data = [torch.randn(4, 3)]
    got = collect(
        rnet,
        data,
        {(0, 1): "concat"},
        input=lambda batch: CallInputs((batch,), {"scale": 2.0}),
    )
    with torch.no_grad():
        expected = rnet.net(data[0], scale=2.0)
    assert torch.equal(got[(0, 1)], expected)  # the same layer on the same batch
