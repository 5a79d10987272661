"""On a CUDA device: records stay there, nothing syncs, results match the CPU.

Each job runs on the GPU and is checked three ways:

* against the same job on the GPU without the library (a hand-written
  ``register_forward_hook``, :func:`torch.autograd.grad`, the bare net): the
  same kernels on the same tensors, so **bit for bit**;
* against the same job on the CPU, **within float32 tolerance**: GPU and CPU
  kernels sum their dot products in different orders (blocked, split-K,
  fused multiply-adds), so each result may differ by a rounding per term
  summed. With TF32 off (cuBLAS and cuDNN, see :func:`float32_kernels`), a
  result that sums ``K`` terms along the deepest chain of reductions
  (``K`` = the sum of the reduction lengths of the layers it went through)
  differs by at most about ``K * eps32 * scale``, ``eps32 = 1.19e-7``, with
  ``scale`` the magnitude of the values summed (bounded here by the largest
  magnitude of the reference, at least 1). Each test states its ``K``;
* that records sit on the layer's device, that no recorded pass makes the
  host wait for the device (``torch.cuda.set_sync_debug_mode("error")``
  turns a synchronising call into an error; the one synchronisation the
  library makes on purpose, a record copied to the CPU with
  ``record(..., device="cpu")``, is shown to be one), and that memory comes
  back to where it was.

The whole module is skipped without CUDA (``pytest -m gpu`` selects it).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import warnings
from typing import TYPE_CHECKING, Any

import pytest
import torch
from torch import nn

from scio_recorder import Recorder, collect
from scio_recorder.explain import patch_sweep
from scio_recorder.ood import Energy, Mahalanobis

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = torch.device("cuda:0")  # a tensor's device always has its index
EPS = torch.finfo(torch.float32).eps
MLP_TERMS = 3 * 32  # the reduction lengths of the MLP's three Linear layers
# GPT-2 below (width 32, 2 heads of 16, 6 tokens, MLP 128): per block, two
# layer norms (2 x 2 x 32), the QKV projection (32), scores (16), softmax and
# weighted sum (2 x 6), the output projection (32), the MLP (32 + 128); then
# the final norm (64) and the unembedding (32). About 850: 1000 is the bound.
GPT2_TERMS = 1000
VOCAB, T = 100, 6


@pytest.fixture(autouse=True)
def float32_kernels() -> Iterator[None]:
    """Turn TF32 off for cuBLAS and cuDNN (plain float32 kernels), then restore."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """Make any host-device synchronisation inside the block an error."""
    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    try:
        with warnings.catch_warnings():
            # torch warns that the mode is a prototype each time it is set
            warnings.filterwarnings("ignore", "Synchronization debug mode")
            torch.cuda.set_sync_debug_mode("error")
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def allocated() -> int:
    """Bytes held by tensors on the device, once its queue has drained."""
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(DEVICE)


def assert_close(got: torch.Tensor, want: torch.Tensor, terms: int) -> None:
    """Assert ``got`` equals ``want`` up to ``terms`` float32 roundings (see above)."""
    got, want = got.detach(), want.detach()
    scale = max(float(want.abs().max()), 1.0)
    tolerance = terms * EPS * scale
    torch.testing.assert_close(got.to(want.device), want, rtol=0, atol=tolerance)


def assert_close_to_cpu(gpu: torch.Tensor, cpu: torch.Tensor, terms: int) -> None:
    """Assert ``gpu`` is on the device and equals ``cpu`` up to ``terms`` roundings."""
    assert gpu.device == DEVICE
    assert_close(gpu, cpu, terms)


def mlp() -> nn.Sequential:
    """A float32 MLP whose first layer is orthogonal.

    Its output, on standard normal inputs, has a covariance near the identity
    (well conditioned): the features of the Mahalanobis test.
    """
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)
    )
    nn.init.orthogonal_(net[0].weight)
    return net.eval()


def on_both(net: nn.Module, x: torch.Tensor) -> tuple[Recorder, Recorder]:
    """Recorders on ``net`` (CPU) and on a copy of it on the GPU."""
    gpu = copy.deepcopy(net).to(DEVICE)
    return Recorder(net, input_data=x), Recorder(gpu, input_data=x.to(DEVICE))


def hooked(net: nn.Module, names: list[str], *args: Any, **kwargs: Any) -> Any:
    """Run ``net`` with hand-written forward hooks; return output and outputs seen."""
    seen: dict[str, Any] = {}
    handles = [
        net.get_submodule(name).register_forward_hook(
            lambda _m, _a, out, name=name: seen.setdefault(name, out)
        )
        for name in names
    ]
    try:
        return net(*args, **kwargs), seen
    finally:
        for handle in handles:
            handle.remove()


def stream(output: Any) -> torch.Tensor:
    """A block's residual stream: the output, or its first item."""
    return output[0] if isinstance(output, tuple) else output


def gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=64,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


def tokens(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (2, T), generator=generator)


# ------------------------------------------------------------------- the core


def test_records_stay_on_the_gpu_equal_a_hook_and_match_the_cpu():
    """Records: on the layer's device, a hook's tensors, the CPU's within rounding."""
    x = torch.randn(16, 32)
    rcpu, rgpu = on_both(mlp(), x)
    names = ["0", "2", "4"]
    for rnet in (rcpu, rgpu):
        rnet.record(*names)
    out = rgpu(x.to(DEVICE))
    want, seen = hooked(rgpu.net, names, x.to(DEVICE))
    assert torch.equal(out, want)
    rcpu(x)
    for name in names:
        (record,) = rgpu.activations_of(name)
        assert record.device == seen[name].device == out.device
        assert torch.equal(record, seen[name])
        (reference,) = rcpu.activations_of(name)
        assert_close_to_cpu(record, reference, MLP_TERMS)


def test_a_cpu_net_given_input_size_alone_moves_as_torchinfo_moves_it_and_is_said():
    """torchinfo moves a CPU net to CUDA given `input_size` alone: kept, and warned.

    The reference Recorder moves it too (code written for it may rely on
    it); `device="cpu"` keeps the net where it is.
    """
    net = nn.Sequential(mlp(), nn.BatchNorm1d(32))
    with pytest.warns(UserWarning, match="moved the net from cpu to cuda"):
        Recorder(net, input_size=(2, 32))
    # parameters and buffers together (the buffers were put back on the CPU)
    assert all(p.is_cuda for p in net.parameters())
    assert all(b.is_cuda for b in net.buffers())
    kept = mlp()
    Recorder(kept, input_size=(1, 32), device="cpu")
    assert next(kept.parameters()).device.type == "cpu"


def test_a_recorded_and_edited_pass_never_syncs_with_the_host():
    """Recording outputs and inputs, and an edit in flight, never make the host wait."""
    x = torch.randn(16, 32, device=DEVICE)
    rnet = Recorder(mlp().to(DEVICE), input_data=x)
    rnet.record("0", "2", inputs="4")
    shift = torch.ones(32, device=DEVICE)
    devices: list[torch.device] = []

    def edit(output: torch.Tensor) -> torch.Tensor:
        devices.append(output.device)  # edits run where the layer ran
        return output + shift

    rnet(x)  # first pass: lazy CUDA initialisation outside the check
    with no_host_sync():
        out = rnet(x, activation_postproc={"2": edit})
    assert devices == [x.device]
    unedited, _ = hooked(rnet.net, [], x)
    assert not torch.equal(out, unedited)
    assert rnet.activations_of("2")[0].device == x.device


def test_a_cpu_copy_of_a_record_is_the_one_synchronisation():
    """`record(..., device="cpu")` copies to the host: that call syncs, on purpose."""
    x = torch.randn(16, 32, device=DEVICE)
    rnet = Recorder(mlp().to(DEVICE), input_data=x)
    rnet.record("2", device="cpu")
    rnet(x)
    with no_host_sync(), pytest.raises(RuntimeError, match="synchroniz"):
        rnet(x)
    rnet.record("2")
    with no_host_sync():
        rnet(x)


def test_memory_comes_back_after_passes_and_after_the_recorder():
    """Passes leave no memory behind; dropping the recorder frees its records."""
    net = mlp().to(DEVICE)
    x = torch.randn(64, 32, device=DEVICE)
    net(x)  # cuBLAS workspaces and the allocator's first blocks
    start = allocated()
    rnet = Recorder(net, input_data=x)
    rnet.record("0", "2", "4", inputs="2")
    out = rnet(x)
    del out
    steady = allocated()  # the latest pass's records, held by the recorder
    for _ in range(3):
        out = rnet(x)
        del out
        assert allocated() == steady
    del rnet
    assert allocated() == start


def test_capture_of_inputs_and_gradients_on_the_gpu():
    """Inputs and output gradients: on the device, equal to autograd's."""
    x = torch.randn(16, 32)
    rcpu, rgpu = on_both(mlp(), x)
    for rnet, xs in ((rcpu, x), (rgpu, x.to(DEVICE))):
        rnet.record("2", inputs="2", grads="2")
        rnet(xs).square().sum().backward()
    (grad,) = rgpu.gradients_of("2")
    (call,) = rgpu.inputs_of("2")
    assert call.args[0].device.type == DEVICE.type
    # The oracle: autograd on the bare GPU net, the same kernels.
    net = rgpu.net
    xs = x.to(DEVICE)
    hidden = net[1](net[0](xs))
    middle = net[2](hidden)
    loss = net[4](net[3](middle)).square().sum()
    (want,) = torch.autograd.grad(loss, middle)
    assert torch.equal(grad, want)
    assert torch.equal(call.args[0], hidden)
    assert_close_to_cpu(grad, rcpu.gradients_of("2")[0], 2 * MLP_TERMS)


# --------------------------------------------------------- data-set scale


def test_collect_on_the_gpu_keeps_statistics_there_and_matches_the_cpu():
    """Moments stay on the device (unless `to=`), rows go to the CPU, values match."""
    torch.manual_seed(1)
    batches = [torch.randn(32, 32) for _ in range(4)]
    rcpu, rgpu = on_both(mlp(), batches[0])
    keep = {"2": "moments", "4": "concat"}
    cpu = collect(rcpu, batches, keep, input=None)
    gpu = collect(rgpu, batches, keep, input=None, device=DEVICE)
    moved = collect(rgpu, batches, keep, input=None, device=DEVICE, to="cpu")
    middle, last = (1, 3), (1, 5)  # the labels of "2" and "4"
    # The logits (rows, concatenated on the CPU): the MLP's K roundings.
    assert gpu[last].device.type == "cpu"
    assert_close(gpu[last], cpu[last], MLP_TERMS)
    # The moments of layer "2" (two Linear layers deep, K = 64): its
    # features differ by `K * eps * max|f|`, so their mean by as much and
    # their variance by `2 * max|f|` times that (float64 work after).
    got, want, there = gpu[middle], cpu[middle], moved[middle]
    assert got.mean.device == DEVICE
    assert there.mean.device.type == "cpu"
    with torch.no_grad():
        features = rcpu.net[:3](torch.cat(batches))
    f = float(features.abs().max())
    rounding = 64 * EPS * f
    torch.testing.assert_close(got.mean.cpu(), want.mean, rtol=0, atol=rounding)
    torch.testing.assert_close(got.var.cpu(), want.var, rtol=0, atol=2 * f * rounding)
    # The same float32 records reduced on the CPU: float64 sums in another
    # order, 128 terms of at most `f**2`.
    ulps64 = 128 * torch.finfo(torch.float64).eps * max(f * f, 1.0)
    torch.testing.assert_close(there.mean, got.mean.cpu(), rtol=0, atol=ulps64)
    torch.testing.assert_close(there.var, got.var.cpu(), rtol=0, atol=4 * ulps64)


def test_detectors_fit_and_score_on_the_gpu_as_on_the_cpu():
    """Mahalanobis (features) and Energy (logits) on the GPU match the CPU."""
    torch.manual_seed(2)
    data = [(torch.randn(64, 32), torch.arange(64) % 3) for _ in range(4)]
    test = torch.randn(16, 32)
    rcpu, rgpu = on_both(mlp(), test)
    maha_cpu = Mahalanobis(rcpu).fit(data, target=1)
    maha_gpu = Mahalanobis(rgpu).fit(data, target=1, device=DEVICE)
    assert maha_gpu.means.device.type == DEVICE.type
    # Features differ by K roundings (relative K * eps); the covariance by
    # twice that; its pseudo-inverse by cond(cov) times the covariance's
    # relative error; a score, a quadratic form, by the sum of these.
    cond = float(torch.linalg.cond(torch.linalg.pinv(maha_cpu.precision)))
    assert cond < 1e4  # the bound below means something
    relative = (4 + 2 * cond) * MLP_TERMS * EPS
    got, want = maha_gpu(test.to(DEVICE)), maha_cpu(test)
    assert got.device.type == DEVICE.type
    torch.testing.assert_close(got.cpu(), want, rtol=relative, atol=0)
    # Energy is 1-Lipschitz in the logits (max norm): K roundings of them,
    # plus a few of the log-sum-exp itself.
    energy = Energy(rgpu)(test.to(DEVICE))
    assert_close_to_cpu(energy, Energy(rcpu)(test), MLP_TERMS + 8)


# --------------------------------------------------------- language models


def test_generate_with_an_edit_on_the_gpu():
    """Steered greedy decoding on the GPU: a hook's tokens, edits on the device."""
    model = gpt2().to(DEVICE)
    ids = tokens()[:1].to(DEVICE)
    rnet = Recorder(model, input_data={"input_ids": ids})
    block = "transformer.h.1"
    rnet.record(block)
    steer = torch.randn(32, device=DEVICE)
    devices = set()

    def steered(output: Any) -> Any:
        if isinstance(output, tuple):
            return (output[0] + steer, *output[1:])
        return output + steer

    def edit(output: Any) -> Any:
        devices.add(stream(output).device)  # edits run where the layer ran
        return steered(output)

    options = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    got = rnet.generate(ids, activation_postproc={block: edit}, **options)
    module = model.get_submodule(block)
    handle = module.register_forward_hook(lambda _m, _a, out: steered(out))
    try:
        want = model.generate(ids, **options)
    finally:
        handle.remove()
    assert torch.equal(got, want)
    assert devices == {ids.device}
    assert len(rnet.steps) == 4
    for step in rnet.steps:
        assert [stream(record).device for record in step.values()] == [ids.device]


def test_patch_sweep_on_the_gpu_matches_the_cpu():
    """An activation-patching grid on the GPU equals the CPU's within rounding."""
    model = gpt2()
    clean = {"input_ids": tokens(1)}
    corrupted = {"input_ids": tokens(2)}
    rcpu = Recorder(model, input_data=clean)
    clean_gpu = {"input_ids": clean["input_ids"].to(DEVICE)}
    corrupted_gpu = {"input_ids": corrupted["input_ids"].to(DEVICE)}
    rgpu = Recorder(copy.deepcopy(model).to(DEVICE), input_data=clean_gpu)
    blocks = ["transformer.h.0", "transformer.h.1"]

    def metric(out: Any) -> torch.Tensor:
        return (out.logits[:, -1, 7] - out.logits[:, -1, 11]).mean()

    want = patch_sweep(rcpu, clean, corrupted, blocks, metric)
    got = patch_sweep(rgpu, clean_gpu, corrupted_gpu, blocks, metric)
    with torch.no_grad():
        logits = model(**clean).logits
    # a difference of two logits: twice the logits' rounding
    tolerance = 2 * GPT2_TERMS * EPS * max(float(logits.abs().max()), 1.0)
    assert got.device.type == DEVICE.type
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=tolerance)


def test_compiled_recording_on_the_gpu():
    """`rnet.compile()` (Inductor) records on the device what eager records, rounded."""
    pytest.importorskip("triton")
    x = torch.randn(16, 32, device=DEVICE)
    net = mlp().to(DEVICE)
    eager = Recorder(net, input_data=x)
    eager.record("0", "2")
    want = eager(x)
    records = [eager.activations_of(name)[0] for name in ("0", "2")]
    rnet = Recorder(net, input_data=x)
    rnet.record("0", "2")
    rnet.compile()
    got = rnet(x)
    # Inductor fuses and reorders float32 work: rounding, not bits.
    assert_close(got, want, MLP_TERMS)
    for name, reference in zip(("0", "2"), records, strict=True):
        (record,) = rnet.activations_of(name)
        assert record.device == x.device
        assert_close(record, reference, MLP_TERMS)


# ------------------------------------------------------- placed by accelerate


@pytest.mark.parametrize("how", ["cpu_offload", "device_map"])
def test_a_model_placed_by_accelerate_records_on_its_execution_device(how):
    """Offloaded weights run on the GPU: records there, equal to the plain model's."""
    accelerate = pytest.importorskip("accelerate")
    plain = gpt2().to(DEVICE)
    model = gpt2()  # the same seed: the same weights
    if how == "cpu_offload":
        accelerate.cpu_offload(model, execution_device=DEVICE)
    else:  # with the GPU as main device, "cpu" parts are offloaded to the CPU
        mapping = {
            "transformer.wte": 0,
            "transformer.wpe": "cpu",
            "transformer.drop": 0,
            "transformer.h.0": "cpu",
            "transformer.h.1": 0,
            "transformer.ln_f": "cpu",
            "lm_head": 0,
        }
        model = accelerate.dispatch_model(model, mapping)
    ids = tokens().to(DEVICE)
    blocks = ["transformer.h.0", "transformer.h.1"]
    rnet = Recorder(model, input_data={"input_ids": ids})
    rnet.record(*blocks)
    out = rnet(input_ids=ids)
    want, seen = hooked(plain, blocks, input_ids=ids)
    assert torch.equal(out.logits, want.logits)
    for name in blocks:
        record = stream(rnet.activations_of(name)[0])
        assert record.device == ids.device
        assert torch.equal(record, stream(seen[name]))
