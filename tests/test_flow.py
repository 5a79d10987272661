"""The static-flow check and the fake reference pass (``scio_recorder._run.flow``)."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
import transformers
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor

from scio_recorder import CallPlanError, Recorder, models
from scio_recorder._run.flow import check_static_flow, fake_table
from scio_recorder.layers import build_table
from tests.nets import (
    DirectChildNet,
    HolderNet,
    ListNet,
    PassedModuleNet,
    ReversedNet,
    SelfCallNet,
    SharedActNet,
    StructuredNet,
    TrainOnlyNet,
    reused_relu_seq,
)

THIS_FILE = Path(__file__).name
X = (2, 4)


def gpt2(**options: int) -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, **options
    )
    return transformers.GPT2LMHeadModel(config).eval()


def llama(**options: int) -> nn.Module:
    config = transformers.LlamaConfig(
        **options,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


def bert(**options: int) -> nn.Module:
    config = transformers.BertConfig(
        **options,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return transformers.BertModel(config).eval()


def tokens() -> dict[str, Tensor]:
    """A tokenizer-like batch with padding (HF then checks the mask in eager)."""
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0  # right padding: left padding without position ids warns
    return {"input_ids": torch.randint(0, 100, (2, 16)), "attention_mask": mask}


class Branchy(nn.Module):
    """``if x.sum() > 0``: the flow depends on the values of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:  # the data-dependent branch
            return self.linear(x)
        return -x


class ItemLoop(nn.Module):
    """Loops as many times as a value of the input says."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(int(x.abs().max().item() * 3) + 1):  # reads a value
            x = self.linear(x)
        return x


class ShapeLoop(nn.Module):
    """Loops over the batch: flow on shapes, not on values."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(x.shape[0]):
            x = self.linear(x)
        return x


class Printing(nn.Module):
    """Prints in its forward and takes a keyword-only argument (fx refuses both)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor, *, scale: float = 2.0) -> Tensor:
        print("shape", tuple(x.shape))
        return self.linear(x) * scale


@torch.library.custom_op("scio_test_flow::opaque", mutates_args=())
def opaque(x: Tensor) -> Tensor:
    """An operation with no fake kernel: fake tensors cannot run it."""
    return x.clone()


class Opaque(nn.Module):
    """Uses an operation without a fake kernel, and branches on a shape."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] > 0:  # fx cannot trace a branch on a shape
            x = opaque(x)
        return self.linear(x)


# -- item 1: the static-flow check ---------------------------------------------


@pytest.mark.parametrize("factory", [gpt2, llama, bert])
@pytest.mark.parametrize("padded", [False, True])
def test_hugging_face_models_wrap_with_the_default_check(factory, padded):
    """GPT-2, Llama (grouped-query) and BERT wrap without `force_static_flow`."""
    net = factory()
    data = tokens() if padded else {"input_ids": torch.randint(0, 100, (2, 16))}
    rnet = Recorder(net, input_data=data)
    rnet.record((1, 1))
    with torch.no_grad():
        rnet(**data)
    assert list(rnet.activations) == [(1, 1)]


@pytest.mark.parametrize("net", [Branchy(), ItemLoop()], ids=["branch", "item"])
def test_data_dependent_flow_is_refused_naming_the_line(net):
    """The error names the file, line and code that read a value, and the fix."""
    source = type(net).forward.__code__
    lines = Path(source.co_filename).read_text().splitlines()
    line = next(
        number
        for number in range(source.co_firstlineno, len(lines))
        if "x.sum() > 0" in lines[number - 1] or ".item()" in lines[number - 1]
    )
    pattern = (
        rf"reads a tensor value into Python at \S*{re.escape(THIS_FILE)}:{line} "
        r"\(`.+`\).*Pass `force_static_flow=False` to accept it anyway"
    )
    with pytest.raises(RuntimeError, match=pattern) as excinfo:
        Recorder(net, input_size=(1, 3))
    # Raised from fx's own error (a TraceError, or int() of a Proxy).
    assert isinstance(excinfo.value.__cause__, torch.fx.proxy.TraceError | TypeError)


def test_data_dependent_flow_is_refused_with_the_fake_reference_tensors():
    """`reference_tensors="fake"` checks the flow in the same pass, same message."""
    with pytest.raises(RuntimeError, match=r"x\.sum\(\) > 0.*force_static_flow"):
        Recorder(Branchy(), input_size=(1, 3), reference_tensors="fake")


def test_shape_dependent_loop_is_accepted():
    """A loop over ``range(x.shape[0])`` depends on shapes, not values: accepted.

    A pass with another batch size calls the recorded module another number of
    times, which the per-pass call-plan check refuses (as documented).
    """
    rnet = Recorder(ShapeLoop(), input_size=(2, 3))
    assert [row.label_str for row in rnet.table.values()] == ["0-1", "1-1", "1-2"]


@pytest.mark.parametrize(
    ("net", "kwargs"),
    [(Printing(), {"scale": 3.0}), (Opaque(), {})],
    ids=["print-kwonly", "no-fake-kernel"],
)
def test_print_keyword_only_and_unsupported_ops_are_accepted(net, kwargs, capsys):
    """What fx cannot trace but is no data-dependent flow wraps by default."""
    with pytest.raises(Exception):  # noqa: B017, PT011 (fx refused these before)
        torch.fx.symbolic_trace(net)
    rnet = Recorder(net, input_size=(1, 3), **kwargs)
    capsys.readouterr()
    x = torch.rand(2, 3)
    assert torch.equal(rnet(x, **kwargs), net(x, **kwargs))


def test_fx_traceable_net_that_reads_a_value_is_still_accepted():
    """`x * y.item()` traces in fx (accepted before): fx's word keeps it."""

    class Scaled(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            return x * x.mean().item()

    check_static_flow(Scaled(), {"input_size": (1, 3)})


def test_check_leaves_no_compiled_state_and_the_net_as_it_was():
    """No Dynamo cache entry or counter; modes, flags and buffers restored."""
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout()).train()
    net[2].eval()
    net[0].bias.requires_grad_(False)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    frames = dict(torch._dynamo.utils.counters["frames"])
    Recorder(net, input_size=(4, 3), mode="train")
    Recorder(net, input_size=(4, 3), mode="train", reference_tensors="fake")
    assert dict(torch._dynamo.utils.counters["frames"]) == frames
    for module in net.modules():
        code = type(module).forward.__code__
        assert torch._dynamo.eval_frame._debug_get_cache_entry_list(code) == []
    assert [m.training for m in net.modules()] == [True, True, True, False]
    assert not net[0].bias.requires_grad
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items())


# -- the check on real tensors: yes/no reads tried both ways ---------------------

FIRST_BLOCK = {
    gpt2: "transformer.h.0",
    llama: "model.layers.0",
    bert: "encoder.layer.0",
}


@pytest.mark.parametrize("factory", [gpt2, llama, bert])
@pytest.mark.parametrize(
    "pad_at", [None, 0, -1], ids=["no-pad", "pad-first", "pad-last"]
)
def test_hugging_face_models_with_a_pad_token_wrap_and_record_exactly(factory, pad_at):
    """A config with `pad_token_id` wraps with the defaults and records exactly.

    Without an attention mask, transformers reads `pad_token_id in
    input_ids[:, [-1, 0]]` to decide whether to log a warning: a yes/no read
    whose other outcome calls the same modules. The record of the first block
    equals what a hand-written forward hook on the same module keeps.
    """
    net = factory(pad_token_id=0)
    ids = torch.randint(1, 100, (2, 16))
    if pad_at is not None:
        ids[:, pad_at] = 0
    rnet = Recorder(net, input_data={"input_ids": ids})
    assert _calls(rnet) == _calls(
        Recorder(net, input_data={"input_ids": ids}, force_static_flow=False)
    )
    rnet.record(FIRST_BLOCK[factory])
    block = net.get_submodule(FIRST_BLOCK[factory])
    kept = []
    handle = block.register_forward_hook(lambda _m, _i, out: kept.append(out))
    try:
        with torch.no_grad():
            rnet(input_ids=ids)
    finally:
        handle.remove()
    (label,) = rnet.activations
    assert rnet.table[label].module is block
    # the same tensors, computed once on the same path: bit for bit
    torch.testing.assert_close(rnet.activations[label], kept[0], rtol=0, atol=0)


def test_fake_reference_tensors_fall_back_on_the_padding_warning_s_read():
    """docs/transformers.md: a config with `pad_token_id`, ids without a mask.

    transformers' padding warning reads `pad_token_id in input_ids[:, [-1,
    0]]`, which fake tensors cannot answer: the table comes from the real
    pass, with a warning saying so. With an attention mask there is no read,
    and the fake pass builds it.
    """
    # The docs said such a config passes with reference_tensors="fake".
    net = gpt2(pad_token_id=0)  # (BERT, here, runs no such warning)
    ids = torch.randint(1, 100, (2, 16))
    real = Recorder(net, input_data={"input_ids": ids})
    with pytest.warns(UserWarning, match="ran on real tensors") as caught:
        fake = Recorder(net, input_data={"input_ids": ids}, reference_tensors="fake")
    (message,) = (str(w.message) for w in caught)
    assert message.startswith(
        '`reference_tensors="fake"` ran on real tensors: the forward reads a tensor '
        "value at "
    )
    assert message.endswith(
        "(`if self.config.pad_token_id in input_ids[:, [-1, 0]]:`)."
    )
    assert _calls(fake) == _calls(real)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    masked = Recorder(net, input_data=batch, reference_tensors="fake")  # no warning
    assert _calls(masked) == _calls(Recorder(net, input_data=batch))


def _calls(rnet):
    return [
        (r.label, r.name, r.module, r.call_index, r.end_order) for r in rnet.table.rows
    ]


class WarnsOnZeros(nn.Module):
    """Warns, logs and prints when its input holds a zero; calls the same modules."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        if (x == 0).any():  # a yes/no read: only a warning depends on it
            warnings.warn("zeros in the input", UserWarning, stacklevel=2)
            logging.getLogger("tests.flow").warning("zeros")
            print("zeros")
        return self.linear(x)


class Nested(nn.Module):
    """Calls `deep` only when two yes/no reads are both true."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.deep = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        if (x > 0).all():  # true on inputs in (0, 1)
            x = x * 2
            if (x > 10).any():  # false there: `deep` never runs on such data
                x = self.deep(x)
        return self.linear(x)


class Guarded(nn.Module):
    """Raises on a negative input; calls the same module otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        if (x < 0).any():  # a yes/no read whose other outcome raises
            msg = "negative input"
            raise ValueError(msg)
        return self.linear(x)


class SignFlip(nn.Module):
    """The same module call either way; the read decides the output's sign."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x)
        return y if y.sum() > 0 else -y  # a yes/no read deciding the output


class Hidden(nn.Module):
    """The read changes a call's output, which the net's output never shows."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        if (x == 0).any():  # decides the input of `linear`
            x = x + 1
        return self.linear(x) * 0


class ManyWarnings(nn.Module):
    """``n`` yes/no reads, each deciding only a warning: ``2**n`` paths."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        for k in range(self.n):
            if (x > k).any():  # only a warning depends on it
                warnings.warn(f"above {k}", UserWarning, stacklevel=2)
        return self.linear(x)


class TolistLoop(nn.Module):
    """Calls its layer once per positive row: a read of numbers by `tolist`."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        for value in x.sum(1).tolist():  # a read of numbers
            if value > 0:
                x = self.linear(x)
        return x


def test_a_read_that_decides_only_a_warning_is_accepted_and_its_other_branch_silent(
    capsys, caplog
):
    """Both outcomes compute the same; the forced branch warns, logs nothing."""
    net = WarnsOnZeros()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the forced branch's warning would raise
        rnet = Recorder(net, input_size=(2, 3))  # random inputs: no zero
    assert capsys.readouterr() == ("", "")
    assert not caplog.records
    plain = Recorder(net, input_size=(2, 3), force_static_flow=False)
    assert _calls(rnet) == _calls(plain)
    with pytest.warns(UserWarning, match="zeros in the input"):
        Recorder(net, input_data=torch.zeros(2, 3))  # the real branch still warns
    assert capsys.readouterr().out == "zeros\n"


def test_the_forced_passes_leave_the_random_state_where_the_reference_pass_does():
    """Drawing after construction gives what it gives without the check."""
    torch.manual_seed(0)
    Recorder(WarnsOnZeros(), input_size=(2, 3), force_static_flow=False)
    expected = torch.rand(4)
    torch.manual_seed(0)
    Recorder(WarnsOnZeros(), input_size=(2, 3))
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize(
    ("net", "line"),
    [
        (Branchy(), "if x.sum() > 0:"),
        (Nested(), "if (x > 0).all():"),
        (Guarded(), "if (x < 0).any():"),
        (SignFlip(), "return y if y.sum() > 0 else -y"),
        (Hidden(), "if (x == 0).any():"),
        (ItemLoop(), "for _ in range(int("),
        (TolistLoop(), "for value in x.sum(1).tolist():"),
        (ManyWarnings(5), "if (x > k).any():"),
    ],
    ids=["branch", "nested", "raises", "sign", "hidden", "item", "tolist", "too-many"],
)
def test_reads_that_change_what_the_net_computes_are_refused(net, line):
    """Calls, an output, a call's output, an error, numbers, 32 paths: refused.

    The message names the first line that reads a value (on fake tensors, as
    the check always has) and the fix.
    """
    pattern = (
        rf"reads a tensor value into Python at \S*{re.escape(THIS_FILE)}:\d+ "
        rf"\(`{re.escape(line)}.*`\), so which modules run may depend on the "
        r"data .*Pass `force_static_flow=False`"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ManyWarnings' own warnings
        with pytest.raises(RuntimeError, match=pattern):
            Recorder(net, input_data=torch.rand(2, 3))


def test_every_path_of_a_few_yes_no_reads_is_tried_and_accepted():
    """Three reads deciding warnings only: seven forced passes, all the same."""
    net = ManyWarnings(3)
    x = torch.rand(2, 3)
    with pytest.warns(UserWarning, match="above 0") as caught:  # the reference pass's
        rnet = Recorder(net, input_data=x)
    assert [str(w.message) for w in caught] == ["above 0"]  # forced ones silent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = Recorder(net, input_data=x, force_static_flow=False)
    assert _calls(rnet) == _calls(plain)


# -- item 7: the fake reference pass --------------------------------------------

TABLE_NETS = [
    (SharedActNet, X, {}),
    (ListNet, X, {}),
    (reused_relu_seq, X, {}),
    (ReversedNet, X, {}),
    (DirectChildNet, X, {}),
    (HolderNet, X, {}),
    (StructuredNet, X, {}),
    (TrainOnlyNet, X, {"mode": "train"}),
    (models.demo_model, (2, 3, 32, 32), {"mode": "train"}),
    (SelfCallNet, X, {}),
    (PassedModuleNet, X, {}),
    (models.demo_model, (2, 3, 32, 32), {}),
]


def same_tables(real, fake):
    assert str(real) == str(fake)
    assert repr(real.statistics) == repr(fake.statistics)
    for a, b in zip(real.rows, fake.rows, strict=True):
        assert (a.label, a.name, a.module, a.call_index, a.end_order) == (
            b.label,
            b.name,
            b.module,
            b.call_index,
            b.end_order,
        )
        assert (a.input_size, a.output_size, a.num_params) == (
            b.input_size,
            b.output_size,
            b.num_params,
        )


@pytest.mark.parametrize(("factory", "size", "options"), TABLE_NETS)
def test_fake_reference_tensors_gives_the_same_table(factory, size, options):
    """Rows, sizes, parameter counts and the printed table are identical."""
    net = factory()
    kwargs = {"input_size": size, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the real pass
        fake = Recorder(
            net, force_static_flow=False, reference_tensors="fake", **kwargs
        )
    real = Recorder(net, force_static_flow=False, **kwargs)
    same_tables(real.table, fake.table)
    assert repr(real) == repr(fake)


@pytest.mark.parametrize(("factory", "size", "options"), TABLE_NETS)
def test_the_check_leaves_the_table_as_a_pass_without_it_gives(factory, size, options):
    """The watched reference pass gives the rows of an unwatched one."""
    net = factory()
    kwargs = {"input_size": size, **options}
    same_tables(
        Recorder(net, force_static_flow=False, **kwargs).table,
        Recorder(net, **kwargs).table,
    )


@pytest.mark.parametrize("factory", [gpt2, llama])
def test_fake_reference_tensors_gives_the_same_table_on_transformers(factory):
    """GPT-2 and Llama configs: identical tables, default check included."""
    net = factory()
    data = tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fake = Recorder(net, input_data=data, reference_tensors="fake")
    same_tables(Recorder(net, input_data=data).table, fake.table)


class Spy(nn.Module):
    """Notes the type of every tensor its forward sees, outside the net.

    (In the net, a list would be put back as it was after the library's
    passes, as every attribute is.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.note = SEEN.extend

    def forward(self, x: Tensor) -> Tensor:
        out = self.linear(x)
        self.note([type(x), type(out)])
        return out


SEEN: list[type] = []


def test_fake_reference_tensors_computes_nothing():
    """The forward sees fake tensors only; parameters stay the same real tensors."""
    SEEN.clear()
    net = Spy()
    params = {name: (p, p.clone()) for name, p in net.named_parameters()}
    Recorder(net, input_size=(1, 3), reference_tensors="fake")
    assert [FakeTensor, FakeTensor] == SEEN  # one pass: table and check
    for name, param in net.named_parameters():
        assert param is params[name][0]
        assert type(param) is nn.Parameter
        assert torch.equal(param, params[name][1])
    SEEN.clear()
    Recorder(net, input_size=(1, 3), reference_tensors="real", force_static_flow=False)
    assert [Tensor, Tensor] == SEEN


def test_fake_reference_tensors_falls_back_to_real_with_a_warning():
    """An operation without a fake kernel: real pass, same table, warned why."""
    net = Opaque()
    with pytest.warns(UserWarning, match=r"ran on real tensors: fake tensors cannot"):
        fake = Recorder(net, input_size=(1, 3), reference_tensors="fake")
    same_tables(Recorder(net, input_size=(1, 3)).table, fake.table)


def test_fake_reference_tensors_falls_back_on_lazy_modules():
    """A lazy module would be materialized with fake parameters: real pass."""
    net = nn.Sequential(nn.LazyLinear(2))
    with pytest.warns(UserWarning, match="lazy parameters"):
        fake_table(net, {"input_size": (1, 3)}, check_flow=True)
    assert net[0].weight.shape == (2, 3)
    assert type(net[0].weight) is nn.Parameter
    lazy = nn.Sequential(nn.LazyLinear(2))  # the default check, after the pass
    assert Recorder(lazy, input_size=(1, 3)).table[(1, 1)].output_size == [1, 2]


def test_reference_tensors_must_be_real_or_fake():
    """Another value names the argument and the accepted values."""
    with pytest.raises(ValueError, match=r'`reference_tensors` is "real" or "fake"'):
        Recorder(nn.Linear(3, 2), input_size=(1, 3), reference_tensors="meta")


def test_fake_table_equals_build_table_in_train_mode_with_batch_norm():
    """Train-mode BatchNorm: same table, running statistics untouched."""
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    options = {"input_size": (4, 3), "mode": "train"}
    fake = fake_table(net, options, check_flow=False)
    assert int(net[1].num_batches_tracked) == 0
    assert torch.equal(net[1].running_mean, torch.zeros(3))
    same_tables(build_table(net, options), fake)


class ShapeBranch(nn.Module):
    """Calls ``b`` when some row's first feature is positive: a shape decides."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        selected = h[h[:, 0] > 0]  # boolean indexing: a data-dependent shape
        if selected.shape[0] > 0:  # no value read: the check does not see it
            h = self.b(h)
        return h


CALLED_0_TIMES = (
    "Missing [(1, 2)] activations. Call plan mismatch: module `b` (Linear, label "
    "1-2) was called 0 times in this pass, but the layer table expects 1 call. "
    "Labels cannot be matched to calls, so no activations were kept. Likely "
    "causes: the mode differs from the reference pass (table built in eval mode "
    "with gradients disabled; this pass ran in eval mode with gradients "
    "disabled: build the table in the mode you run with `Recorder(net, ..., "
    'mode="train")`, or call `rnet.eval()`), a fused fast path that skips '
    "submodules in some modes, or control flow that depends on the input "
    "(data-dependent branches or loops)."
)


def test_a_flow_on_a_data_dependent_shape_is_accepted_and_the_call_plan_catches_it():
    """The documented limit of the check (docs/guarantees.md) and what covers it."""
    torch.manual_seed(0)
    net = ShapeBranch().eval()
    x = torch.randn(8, 4)
    with torch.no_grad():
        assert bool((net.a(x)[:, 0] > 0).any())  # the branch runs on x
    rnet = Recorder(net, input_data=[x])  # accepted, default check on
    rnet.record("b")
    with torch.no_grad():
        sign = net.a.weight[0].sign()
        skip = -100 * sign[None].expand(3, 4)  # every row's first feature < 0
        assert not bool((net.a(skip)[:, 0] > 0).any())
        with pytest.raises(CallPlanError, match=f"^{re.escape(CALLED_0_TIMES)}$"):
            rnet(skip)
        assert rnet.activations == {}  # no partial records
        rnet(x)
    assert rnet.recording == ((1, 2),)
