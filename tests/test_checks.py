"""scio_recorder.check: each check flagged by a model built to fail it.

A clean model passes every check; a left-padded GPT-2 without position ids
fails "batch", BatchNorm in train mode fails "batch", dropout fails
"determinism", a bfloat16 copy warns "dtype", an in-place ReLU after a
recorded convolution warns "inplace" (and one nobody could foresee fails
it), a module that computes another way when hooked changes "recording",
and calls that follow the input fail "calls". Magnitudes are checked
against the same quantity computed here from plain runs of the model.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import CheckReport, Recorder, check
from scio_recorder._run.batches import Positions
from scio_recorder.checks import CHECKS
from scio_recorder.checks._measure import difference
from tests.lms import bert, gpt2, llama, padded
from tests.nets import LoopNet


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|: the report's measure, computed here."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


def relative32(a: torch.Tensor, b: torch.Tensor) -> float:
    """The same measure, the difference taken in float32 (as the check's is)."""
    return float((a - b).abs().max()) / float(b.abs().max())


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def conv_bn(*, inplace: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=inplace)
    ).eval()


# -- clean models pass -----------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "mlp",
        pytest.param("gpt2-positions", marks=pytest.mark.slow),
        pytest.param("llama-left", marks=pytest.mark.slow),
        pytest.param("bert-right", marks=pytest.mark.slow),
    ],
)
def test_clean_jobs_pass_every_check(case):
    """Nothing to report: every line PASS (GPT-2 with derived position ids too)."""
    if case == "mlp":
        report = check(mlp(), torch.randn(5, 4))
    elif case == "gpt2-positions":
        model = gpt2()
        report = check(model, Positions(model).add((), padded("left"))[1])
    elif case == "llama-left":  # rotary positions: a shift changes only roundings
        report = check(llama(), padded("left"))
    else:
        report = check(bert(), padded("right"))
    assert report.failed == ()
    assert report.warned == ()
    assert [line.name for line in report.lines] == list(CHECKS)
    assert report.passed


# -- each check flagged by a model built to fail it ----------------------------


def test_left_padded_gpt2_without_position_ids_fails_batch():
    """The padded rows' records follow their padding; the magnitude is the rows'."""
    model = gpt2()
    batch = padded("left")
    report = check(model, batch, layers=["transformer.h.0", "transformer.h.1"])
    assert report.failed == ("batch",)
    line = report["batch"]
    # The same measure from plain runs: each block's output, batched and alone.
    worst, worst_row = 0.0, -1
    with torch.no_grad():
        seen = []
        handles = [
            model.get_submodule(n).register_forward_hook(
                lambda _m, _a, out: seen.append(
                    out[0] if isinstance(out, tuple) else out
                )
            )
            for n in ("transformer.h.0", "transformer.h.1")
        ]
        model(**batch)
        batched = seen[:]
        for row, kept in enumerate(batch["attention_mask"].bool()):
            seen.clear()
            model(input_ids=batch["input_ids"][row, kept][None])
            for whole, single in zip(batched, seen, strict=True):
                diff = relative(whole[row, kept][None], single)
                if diff > worst:
                    worst, worst_row = diff, row
        for handle in handles:
            handle.remove()
    assert line.magnitude == pytest.approx(worst, rel=1e-9)
    assert line.where.endswith(f", row {worst_row}")
    assert line.cause.startswith(
        f"row {worst_row}'s records change with its padding: the model takes "
        "position_ids and the batch has none, so the row's tokens are numbered from "
        "its padding; pass position_ids = (mask.cumsum(-1) - 1).clamp(min=0)"
    )


def test_batchnorm_in_train_mode_fails_batch_and_the_net_is_left_as_it_was():
    """Batch statistics tie rows together; the running statistics stay as they were."""
    net = conv_bn().train()
    bn = net[1]
    before = bn.running_mean.clone(), int(bn.num_batches_tracked)
    report = check(net, torch.randn(4, 3, 6, 6))
    assert report.failed == ("batch",)
    assert report["batch"].cause == (
        "a BatchNorm in train mode (`1`) normalizes with the batch's own statistics, "
        "so a row's records depend on its batch-mates: call net.eval()"
    )
    assert torch.equal(bn.running_mean, before[0])
    assert int(bn.num_batches_tracked) == before[1]
    assert all(module.training for module in net.modules())


def test_dropout_left_on_fails_determinism():
    """Two passes draw other dropout masks."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    report = check(net.train(), torch.randn(5, 4))
    assert "determinism" in report.failed
    assert report["determinism"].cause == (
        "dropout is active (`1` in train mode): each pass draws other masks; "
        "call net.eval(), or keep it if you want random records (MC dropout)"
    )
    assert check(net.eval(), torch.randn(5, 4)).failed == ()


def test_dropout_in_train_mode_warns_even_when_the_passes_drop_nothing():
    """p = 0.001 on a few values: the compared passes draw no zero, yet the
    records are scaled by 1/(1-p), not the eval-mode ones. The modules tell."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(4, 8),
        nn.Dropout(0.001),
        nn.Linear(8, 8),
        nn.AlphaDropout(0.001),
        nn.FeatureAlphaDropout(0.001),
        nn.Dropout1d(0.001),
        nn.Dropout(0.0),  # drops nothing: not named
    )
    batch = torch.randn(6, 4)
    with torch.no_grad():  # the records when nothing is dropped: scaled
        hidden = net[0](batch)
        kept = net[1](hidden)
    # the kept values are x * (1 / (1 - p)): two float32 roundings against the
    # one of x / (1 - p), so at most 2 eps relative each
    eps = torch.finfo(torch.float32).eps
    assert bool((kept == 0).any()) or torch.allclose(
        kept, hidden / (1 - 0.001), rtol=2 * eps, atol=0
    )
    assert not torch.allclose(hidden, hidden / (1 - 0.001), rtol=100 * eps, atol=0)
    line = check(net, batch)["determinism"]
    assert line.status in {"WARN", "FAIL"}  # WARN when the draws agreed
    assert line.cause.startswith("dropout is active (`1`, `3`, `4` and 1 more in ")
    assert line.cause.endswith(
        "call net.eval(), or keep it if you want random records (MC dropout)"
    )
    small = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.001), nn.Linear(8, 2))
    line = check(small, batch)["determinism"]
    assert line.status == "WARN"  # 16 values, p = 0.001: these draws keep all
    assert line.magnitude == 0
    assert line.cause.startswith(
        "dropout is active (`1` in train mode, p > 0): the two passes gave "
        "bit-equal records here"
    )


@pytest.mark.parametrize("mode", ["eval", "p=0"])
def test_dropout_that_drops_nothing_is_not_named(mode):
    torch.manual_seed(0)
    p = 0.0 if mode == "p=0" else 0.5
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(p), nn.Linear(8, 2))
    report = check(net.eval() if mode == "eval" else net.train(), torch.randn(5, 4))
    assert report.failed == ()
    assert report.warned == ()
    assert "dropout" not in str(report)


def test_bfloat16_model_warns_dtype_with_its_relative_error():
    """A bfloat16 copy's records against a float32 copy: the error, per layer."""
    net = mlp().bfloat16()
    x = torch.randn(5, 4).bfloat16()
    report = check(net, x)
    assert report.warned == ("dtype",)
    assert report.failed == ()
    line = report["dtype"]
    assert line.cause.startswith(
        "the model computes in bfloat16: its records carry bfloat16 rounding "
        "(eps 0.0078), up to this relative error against a float32 copy"
    )
    with torch.no_grad():
        want = relative(net(x), mlp().bfloat16().float()(x.float()))
    assert line.layers["0-1"] == pytest.approx(want, rel=1e-9)
    assert 0 < line.magnitude < 0.5


def test_inplace_relu_after_a_recorded_conv_warns_and_records_stay_exact():
    """Known in advance: the conv's output is copied; the check says so."""
    net = conv_bn(inplace=True)
    report = check(net, torch.randn(4, 3, 6, 6))
    assert report.warned == ("inplace",)
    assert report.failed == ()
    assert report["inplace"].where == "1-2 (BatchNorm2d `1`)"
    assert report["inplace"].cause.startswith(
        "a later in-place operation overwrites these outputs (e.g. "
        "ReLU(inplace=True) after them): the recorder copies them"
    )


def test_inplace_change_nobody_could_foresee_fails_inplace():
    """A ReLU made in-place after the table was built: the record changed."""
    net = conv_bn()
    rnet = Recorder(net, input_size=(1, 3, 6, 6))
    net[2].inplace = True
    report = rnet.check(torch.randn(4, 3, 6, 6))
    assert report.failed == ("inplace",)
    assert report["inplace"].where == "1-2 (BatchNorm2d `1`)"
    assert report["inplace"].cause.endswith(
        "rnet.record(..., clone=True) keeps it exact"
    )


class FastUnlessHooked(nn.Module):
    """Computes its Linear in float64 unless a hook is on it (a fused fast path)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lin._forward_hooks or self.lin._forward_pre_hooks:
            return self.lin(x)
        w, b = self.lin.weight.double(), self.lin.bias.double()
        return (x.double() @ w.T + b).float()


def test_a_module_computing_another_way_when_hooked_changes_recording():
    """Outputs with and without the recorder differ by roundings: WARN."""
    torch.manual_seed(0)
    net = FastUnlessHooked()
    x = torch.randn(6, 16)
    report = check(net, x)
    assert report.warned == ("recording",)
    with torch.no_grad():
        want = relative(net.lin(x), net(x))
    assert report["recording"].magnitude == pytest.approx(want, rel=1e-9)
    assert "a module computes another way when a hook is on it" in (
        report["recording"].cause
    )


def test_calls_that_follow_the_input_fail_calls():
    """A loop over the rows: the batch makes more calls than the reference pass."""
    rnet = Recorder(LoopNet(), input_size=(1, 4), force_static_flow=False)
    report = rnet.check(torch.randn(3, 4))
    assert report.failed == ("calls",)
    assert report["calls"].where == (
        "module `lin` (Linear, label 1-1) was called at least 2 times in this pass, "
        "but the layer table expects 1 call"
    )
    assert set(report.warned) == {"recording", "batch", "determinism", "dtype"}


# -- the report and the recorder afterwards ------------------------------------


def test_report_is_a_text_and_an_html_table():
    report = check(conv_bn(inplace=True), torch.randn(2, 3, 6, 6))
    lines = str(report).splitlines()
    assert re.fullmatch(r"check +result +magnitude +where +likely cause", lines[0])
    assert [line.split()[:2] for line in lines[2:]] == [
        ["recording", "PASS"],
        ["batch", "PASS"],
        ["determinism", "PASS"],
        ["dtype", "PASS"],
        ["inplace", "WARN"],
        ["calls", "PASS"],
    ]
    html = report._repr_html_()
    assert html.startswith("<table>")
    assert html.endswith("</table>")
    assert html.count("<tr") == len(CHECKS) + 1  # and the header
    assert 'color:#9a6700;font-weight:bold">WARN</td>' in html
    assert repr(report).startswith("CheckReport(recording PASS, batch PASS")
    assert isinstance(report, CheckReport)
    with pytest.raises(KeyError, match="No check named 'speed'"):
        report["speed"]


def test_rnet_check_leaves_the_recorder_as_it_was():
    """Selection, options, random state: as before; only the selection is checked."""
    net = conv_bn(inplace=True)
    rnet = Recorder(net, input_size=(1, 3, 6, 6))
    rnet.record((1, 1), clone=True)
    batch = torch.randn(4, 3, 6, 6)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    report = rnet.check(batch)
    after = torch.rand(3)
    assert torch.equal(after, expected)
    assert rnet.recording == ((1, 1),)
    assert rnet.record_options.clone
    assert set(report["batch"].layers) == {"1-1"}
    with pytest.raises(ValueError, match=r"^`rows` must be an int >= 1"):
        rnet.check(torch.randn(4, 3, 6, 6), rows=0)


def test_one_row_without_padding_cannot_be_compared():
    report = check(mlp(), torch.randn(1, 4))
    assert report.warned == ("batch",)
    assert report["batch"].cause.startswith("the batch has one row and no padding")


# -- what the check cannot compare, it says (never a PASS for nothing) ---------


class Flat(nn.Module):
    """Flattens [B, T, 4] to [B*T, 4] before a BatchNorm: no record has dim 0 B."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.bn(x.reshape(-1, 4)))


def test_records_without_a_batch_dimension_are_reported_not_passed():
    """[B*T, F] records cannot be cut by row without guessing T: never PASS.

    Nothing is compared, but a BatchNorm in train mode ties the rows together
    whatever the layout: that cause is certain, so the line FAILs, naming it.
    """
    torch.manual_seed(0)
    net = Flat().train()
    x = torch.randn(3, 5, 4)
    with torch.no_grad():  # the rows do mix: row 0 in the batch is not row 0 alone
        assert relative(net(x)[:5], net(x[:1])) > 0.1
    line = check(net, x)["batch"]
    assert line.status == "FAIL"
    assert line.magnitude is None
    assert line.layers == {}
    assert line.cause == (
        "a BatchNorm in train mode (`bn`) normalizes with the batch's own "
        "statistics, so a row's records depend on its batch-mates: call "
        "net.eval(); not compared: records of 0-1 (Flat (the whole net)), 1-1 "
        "(BatchNorm1d `bn`), 1-2 (Linear `lin`) have no batch dimension of size 3 "
        "(a record of the whole batch, or rows reshaped into another dimension)"
    )
    eval_line = check(net.eval(), x)["batch"]  # no certain cause: WARN
    assert eval_line.status == "WARN"
    assert eval_line.cause.startswith("not compared: records of 0-1 (Flat")


class Pooled(nn.Module):
    """A per-row field beside a statistic of the batch (``shared``: keepdim)."""

    def __init__(self, *, keepdim: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.keepdim = keepdim

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.lin(x)
        return {"h": h, "mean": h.mean(0, keepdim=self.keepdim)}


def test_a_field_of_the_whole_batch_is_reported_beside_the_compared_ones():
    """The per-row field is compared; the mean over the batch is named, not passed."""
    torch.manual_seed(0)
    line = check(Pooled(keepdim=False).eval(), torch.randn(5, 4))["batch"]
    assert line.status == "WARN"
    assert set(line.layers) == {"0-1", "1-1"}
    assert line.cause.startswith(
        "each row's records alone equal its records in the batch"
    )
    assert line.cause.endswith(
        ", where compared; not compared: records of 0-1 (Pooled (the whole net)) "
        "have no batch dimension of size 5 (a record of the whole batch, or rows "
        "reshaped into another dimension)"
    )


def test_a_record_shared_by_the_rows_is_compared_with_the_row_alone():
    """A [1, F] mean over the batch, against the row alone's: it mixes rows."""
    torch.manual_seed(0)
    net = Pooled(keepdim=True).eval()
    x = torch.randn(5, 4)
    line = check(net, x)["batch"]
    assert line.status == "FAIL"
    with torch.no_grad():  # the mean of the batch against each row's own "mean"
        want = max(
            relative32(net(x)["mean"], net(x[r : r + 1])["mean"]) for r in range(5)
        )
    assert line.magnitude == pytest.approx(want, rel=1e-9)
    assert line.where.startswith("0-1 (Pooled (the whole net)), row ")
    assert "records depend on its batch-mates" in line.cause


# -- state kept between passes -------------------------------------------------


class Stream(nn.Module):
    """Streaming state in a buffer, changed in place and returned as is."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("state", torch.zeros(5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(self.lin(x))
        return self.state


def test_state_kept_in_a_buffer_fails_determinism_and_nothing_else():
    """Two passes differ by what the first left in the buffer; the others do not."""
    torch.manual_seed(0)
    net = Stream().eval()
    x = torch.randn(5, 4)
    report = check(net, x)
    assert report.failed == ("determinism",)
    line = report["determinism"]
    with torch.no_grad():  # two plain passes from the state the check found
        fresh = Stream().eval()
        fresh.load_state_dict(net.state_dict())
        first, second = fresh(x).clone(), fresh(x).clone()
    assert line.magnitude == pytest.approx(relative(second, first), rel=1e-9)
    assert line.where == "0-1 (Stream (the whole net))"
    assert line.cause.startswith(
        "state kept between passes: a pass changes the buffer `state` in place and "
        "the next pass reads it"
    )
    assert report["recording"].status == "PASS"
    assert report["dtype"].status == "PASS"
    assert torch.equal(net.state, torch.zeros(5, 4))  # left as it was


class Counter(nn.Module):
    """State in a plain attribute: the check cannot put it back."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


def test_state_outside_the_buffers_is_named_on_the_lines_it_moves():
    """No fused path, no ill-conditioned layer: the passes started elsewhere."""
    torch.manual_seed(0)
    report = check(Counter().eval(), torch.randn(5, 4))
    assert report["determinism"].cause == (
        "two passes on the same batch differ, even from the same random state and "
        "buffers: the net keeps state between passes outside its buffers (an "
        "attribute a pass changes)"
    )
    note = (
        "the net keeps state between passes (see determinism), so the passes "
        "compared here did not start from the same state: this difference may come "
        "from that"
    )
    for name in ("recording", "batch", "dtype"):
        assert report[name].status == "FAIL"
        assert report[name].cause == note


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.randn_like(x)


def test_random_draws_outside_dropout_are_named():
    torch.manual_seed(0)
    report = check(Noisy().eval(), torch.randn(5, 4))
    assert report["determinism"].cause.endswith(
        "the forward draws random numbers (a random operation other than an "
        "nn.Dropout in train mode, in `Noisy`)"
    )
    assert report["recording"].status == "PASS"  # the same random state: equal
    assert report["dtype"].cause.startswith("the forward draws random numbers")


# -- NaN and infinities in the records ------------------------------------------


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def test_nan_the_net_computes_on_every_pass_is_named_not_failed():
    """log of negatives: the same NaN on every pass, and in float64 too. The
    comparing lines pass; recording warns, naming where the NaN appear."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), Log(), nn.Linear(8, 2)).eval()
    batch = torch.randn(6, 4)
    with torch.no_grad():
        logged = torch.log(net[0](batch))
    nan = int(logged.isnan().sum())
    assert 0 < nan < logged.numel()
    report = check(net, batch)
    assert report.failed == ()
    assert report.warned == ("recording",)
    for name in ("batch", "determinism", "dtype", "inplace", "calls"):
        assert report[name].status == "PASS", name
    line = report["recording"]
    assert line.magnitude == 0  # the outputs are bit-equal, NaN and all
    assert line.where == "1-2 (Log `1`)"  # Linear `0` ends first, without NaN
    assert (
        f"but the records hold NaN: first in 1-2 (Log `1`) ({nan} of its "
        f"{logged.numel()} values), and 2 calls after it;"
    ) in line.cause
    assert "NaN" not in report["dtype"].cause


class NanThatMoves(Counter):
    """NaN in column ``calls % 4``: at other places on each pass (state kept
    outside the buffers)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x).index_fill(1, torch.tensor([self.calls % 4]), math.nan)


def test_nan_at_other_places_on_another_pass_still_fails():
    report = check(NanThatMoves().eval(), torch.randn(5, 4))
    line = report["determinism"]
    assert line.status == "FAIL"
    assert line.magnitude == math.inf
    assert "outside its buffers" in line.cause


class Overflow(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(100 * x)


class Cancel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x


def test_dtype_names_the_side_whose_nan_or_inf_the_other_lacks():
    """exp(100 x) overflows float32 (inf) and not float64; inf - inf is NaN in
    float32 only. The dtype line names the first: the overflow."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), Overflow(), Cancel()).eval()
    batch = torch.randn(5, 4)
    with torch.no_grad():
        assert bool(net(batch).isnan().any())
        assert not bool(net.double()(batch.double()).isnan().any())
    net.float()
    report = check(net, batch)
    line = report["dtype"]
    assert line.status == "FAIL"
    assert line.where == "1-2 (Overflow `1`)"
    assert line.cause == (
        "the record holds inf in float32 where the float64 copy does not: float32 "
        "overflows; compute in float64"
    )
    line = check(net, batch, layers=["2"])["dtype"]
    assert line.cause == (
        "the record holds NaN in float32 where the float64 copy does not: the "
        "float32 computation makes NaN that the float64 one does not"
    )
    recording = report["recording"]
    assert recording.status == "WARN"
    assert "but the records hold inf: first in 1-2 (Overflow `1`) (" in recording.cause


_SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0])


def _oracle(a: list[float], b: list[float], dtype: torch.dtype) -> float:
    """difference by hand: equal iff the same NaN and equal elsewhere; else
    max |a - b| over max |b| on the values finite on both sides (the
    subtraction rounded to ``dtype``, as a tensor's is), inf for a NaN or an
    infinity on one side only."""
    if [math.isnan(x) for x in a] != [math.isnan(y) for y in b]:
        return math.inf
    kept = [(x, y) for x, y in zip(a, b, strict=True) if not math.isnan(x)]
    if any(x != y for x, y in kept if math.isinf(x) or math.isinf(y)):
        return math.inf
    finite = [(x, y) for x, y in kept if math.isfinite(x) and math.isfinite(y)]
    cast = np.float32 if dtype == torch.float32 else np.float64
    diff = max((abs(float(cast(x) - cast(y))) for x, y in finite), default=0.0)
    scale = max((abs(y) for _, y in finite), default=0.0)
    if scale == 0:
        return math.inf if diff > 0 else 0.0
    return diff / scale


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    size=st.integers(1, 6),
)
def test_difference_counts_nan_at_the_same_places_as_equal(data, dtype, size):
    value = st.one_of(st.floats(-(2.0**100), 2.0**100, width=32), _SPECIAL)
    a = data.draw(st.lists(value, min_size=size, max_size=size))
    edits = data.draw(st.lists(st.tuples(st.integers(0, size - 1), value)))
    b = list(a)
    for i, v in edits:
        b[i] = v
    got = difference(torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype))
    assert got == _oracle(a, b, dtype)


def test_difference_compares_a_complex_record_part_by_part():
    a = torch.tensor([complex(math.nan, 1.0), complex(2.0, 2.0)])
    assert difference(a, a.clone()) == 0
    b = torch.tensor([complex(1.0, math.nan), complex(2.0, 2.0)])
    assert difference(a, b) == math.inf  # NaN in another part


# -- the dtype line of models a wider copy cannot stand for -----------------------


class Int8Linear(nn.Module):
    """int8 weights with a scale, dequantized in the forward (bitsandbytes-like)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        weight = torch.randn(4, 4)
        scale = weight.abs().amax(1, keepdim=True) / 127
        self.weight = nn.Parameter(
            (weight / scale).round().to(torch.int8), requires_grad=False
        )
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.weight.to(x.dtype) * self.scale.to(x.dtype)).T


def test_quantized_weights_are_not_passed_by_a_copy_that_keeps_them():
    """int8 weights stay int8 in a float64 copy: the line says it cannot check."""
    report = check(Int8Linear().eval(), torch.randn(3, 4))
    line = report["dtype"]
    assert line.status == "WARN"
    assert line.magnitude is None
    assert line.cause.startswith(
        "not checked: quantized weights (`Int8Linear` (Parameter)): a wider copy "
        "keeps their quantized values"
    )


@pytest.mark.parametrize("kind", ["weight-only", "dynamic"])
def test_torchao_models_warn_dtype_instead_of_passing_or_raising(kind):
    """Weight-only: the copy was still int8 (a false PASS); dynamic: it raised."""
    quantization = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    config = {
        "weight-only": quantization.Int8WeightOnlyConfig,
        "dynamic": quantization.Int8DynamicActivationInt8WeightConfig,
    }[kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's notes on its kernels
        quantization.quantize_(net, config)
    report = check(net, torch.randn(4, 32))
    assert report["dtype"].status == "WARN"
    assert report["dtype"].cause.startswith(
        "not checked: quantized weights (`0` (Int8Tensor), `2` (Int8Tensor)): "
    )


class Float32Only(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            msg = "float32 only"
            raise TypeError(msg)
        return self.lin(x)


def test_a_wider_copy_that_raises_is_reported_and_the_report_kept():
    report = check(Float32Only().eval(), torch.randn(3, 4))
    assert report["dtype"].status == "WARN"
    assert report["dtype"].cause == (
        "not checked: a copy of the model in float64 raised TypeError (float32 only)"
    )
    assert report.failed == ()


def test_a_tensor_parallel_model_skips_the_wider_copy_on_every_rank(tmp_path):
    """DTensor parameters (a one-rank mesh here): no copy, a WARN saying why.

    The skip is decided by the model's structure, the same on every rank, so
    no rank copies (and dies) while another waits in a collective.
    """
    dist = pytest.importorskip("torch.distributed")
    parallel = pytest.importorskip("torch.distributed.tensor.parallel")
    mesh = pytest.importorskip("torch.distributed.device_mesh")

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
        parallel.parallelize_module(
            net,
            mesh.init_device_mesh("cpu", (1,)),
            {"0": parallel.ColwiseParallel(), "2": parallel.RowwiseParallel()},
        )
        report = check(net, torch.randn(3, 4))
    finally:
        dist.destroy_process_group()
    assert report["dtype"].status == "WARN"
    assert report["dtype"].cause == (
        "not checked: a tensor-parallel model (DTensor parameters): a wider copy "
        "would copy every rank's shards; check the unsharded model"
    )
    assert report.failed == ()


# -- the batch dimension -----------------------------------------------------------


def test_a_sequence_first_lstm_is_not_failed_for_mixing_time_steps():
    """[T, B, F] into nn.LSTM: dim 0 is time, so the batch cannot be cut there."""
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 4).eval()
    x = torch.randn(7, 3, 4)
    line = check(lstm, x)["batch"]
    assert line.status == "WARN"
    assert line.cause == (
        "cannot split the batch: `LSTM` (LSTM, batch_first=False) takes [7, 3, 4], "
        "its batch on dim 1, and the inputs' dim 0 (7) is not that batch (a "
        "sequence-first input); pass batch_dim=1 if dim 1 of the inputs is their batch"
    )
    report = check(lstm, x, batch_dim=1)  # each row cut on dim 1, run alone
    with torch.no_grad():
        want = max(
            relative(whole[:, r : r + 1] if whole.dim() == 3 else whole, single)
            for r in range(3)
            for whole, single in zip(
                [lstm(x)[0], *lstm(x)[1]],
                [lstm(x[:, r : r + 1])[0], *lstm(x[:, r : r + 1])[1]],
                strict=True,
            )
        )
    assert report["batch"].status == "PASS"
    assert report["batch"].magnitude == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match=r"^`batch_dim` must be None"):
        check(lstm, x, batch_dim=-1)


class Transposing(nn.Module):
    """Takes [B, T, F] and feeds its sequence-first LSTM [T, B, F]."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x.transpose(0, 1))[0].transpose(0, 1)


def test_a_net_that_transposes_for_its_lstm_splits_on_dim_0():
    torch.manual_seed(0)
    line = check(Transposing().eval(), torch.randn(3, 7, 4))["batch"]
    assert line.status == "PASS"
    assert set(line.layers) == {"0-1", "1-1"}


# -- rows that cannot run alone ----------------------------------------------------


def test_an_all_padding_row_is_skipped_and_the_others_compared():
    """Row 1 is all padding: said so; rows 0 and 2 are compared, equal up to rounding.

    The magnitude is the one plain runs give: each compared row's block
    output, batched (its kept positions) against the row run alone.
    """
    model = gpt2()
    mask = torch.tensor([[1] * 8, [0] * 8, [0] * 5 + [1] * 3])
    batch = {
        "input_ids": torch.randint(1, 50, (3, 8)) * mask,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    line = check(model, batch, layers=["transformer.h.1"])["batch"]
    assert line.status == "WARN"
    seen = []
    handle = model.transformer.h[1].register_forward_hook(
        lambda _m, _a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        model(**batch)
        batched = seen.pop()
        want = 0.0
        for row in (0, 2):
            kept = mask[row].bool()
            model(**{k: v[row, kept][None] for k, v in batch.items()})
            want = max(want, relative32(batched[row, kept][None], seen.pop()))
    handle.remove()
    (got,) = line.layers.values()  # transformer.h.1
    assert got == pytest.approx(want, rel=1e-9, abs=0)
    # A row alone is computed by other kernels than the batch of 3 (another
    # GEMM blocking): each value may differ by a few float32 roundings of its
    # dot products (K <= 64 terms), carried through the 2 blocks' ~15 ops. It
    # was bit-equal on one CPU and 6.3e-08 on another (AVX2): bound it by
    # 2 * 15 * 64 * eps32 (2.3e-4) relative, the rounding the check allows.
    assert got <= 2 * 15 * 64 * torch.finfo(torch.float32).eps
    assert line.cause.endswith(
        "where compared; row 1 has no real token (all padding): not run alone"
    )
    assert "raised" not in line.cause


class Picky(nn.Module):
    """Refuses a batch of one row whose first value is negative."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1 and bool(x[0, 0] < 0):
            msg = "negative lead"
            raise ValueError(msg)
        return self.lin(x)


def test_a_row_that_raises_alone_does_not_stop_the_others():
    torch.manual_seed(0)
    x = torch.randn(4, 4).abs()
    x[1, 0] = -1.0
    line = check(Picky().eval(), x, force_static_flow=False)["batch"]
    assert line.status == "WARN"
    assert line.cause.endswith(
        "; row 1 alone raised ValueError (negative lead): not compared"
    )
    assert "padding" not in line.cause
    assert set(line.layers) == {"0-1", "1-1"}  # rows 0, 2 and 3


# -- a recorder given to the function ------------------------------------------------


def test_check_of_a_recorder_is_its_own_check():
    net = conv_bn(inplace=True)
    rnet = Recorder(net, input_size=(1, 3, 6, 6))
    batch = torch.randn(4, 3, 6, 6)
    assert str(check(rnet, batch)) == str(rnet.check(batch))
    with pytest.raises(
        TypeError,
        match=r"^`net` is already a Recorder: the Recorder keywords "
        r"force_static_flow cannot apply to it\. Call `rnet\.check\(batch, \.\.\.\)`",
    ):
        check(rnet, batch, force_static_flow=False)


def test_the_padding_warning_points_at_the_line_that_asked_for_the_summary():
    """A recorder run by torchinfo's pass: the warning names this file."""
    torchinfo = pytest.importorskip("torchinfo")
    rnet = Recorder(gpt2(), input_data={"input_ids": torch.ones(1, 4, dtype=int)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torchinfo.summary(rnet, input_data=padded("left"), verbose=0)
    shown = [w for w in caught if "A left-padded batch" in str(w.message)]
    assert [w.filename for w in shown] == [__file__]


# -- nothing silently wrong, round 5 -------------------------------------------------


class FunctionalDropout(nn.Module):
    """Dropout by ``F.dropout`` in the forward: no module type tells it."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.lin(x), self.p, training=self.training)


def test_a_functional_dropout_that_drops_nothing_warns_determinism():
    """p = 0.01 on 12 values: the passes drop nothing and agree, but they drew.

    The records are scaled by 1/(1-p) (not the eval-mode ones): the
    generators' states before and after a pass tell it, and name the module.
    """
    torch.manual_seed(0)
    net = FunctionalDropout(0.01).train()
    x = torch.randn(3, 4)
    with torch.no_grad():  # the check's first pass draws from seed 0: drops none
        torch.manual_seed(0)
        kept = net(x)
        assert bool((kept != 0).all())
        assert not torch.equal(kept, net.lin(x))  # scaled by 1/(1-p)
    report = check(net, x)
    line = report["determinism"]
    assert line.status == "WARN"
    assert line.magnitude == 0
    assert line.cause.startswith(
        "the forward draws random numbers (in `FunctionalDropout`): the two passes "
        "gave bit-equal records here, but each pass draws its own"
    )
    assert report.warned == ("determinism",)
    assert check(net.eval(), x).warned == ()  # training=False: no draw


def test_a_functional_dropout_that_drops_fails_and_the_drawing_module_is_named():
    """The innermost module whose call drew is named, not the root around it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), FunctionalDropout(0.5)).train()
    report = check(net, torch.randn(6, 4))
    line = report["determinism"]
    assert line.status == "FAIL"
    assert line.cause.endswith(
        "the forward draws random numbers (a random operation other than an "
        "nn.Dropout in train mode, in `1`)"
    )
    # the other lines' differences are said to come from the draws
    assert report["batch"].cause.startswith("the forward draws random numbers")


@given(draw=st.sampled_from(["torch", "python", "numpy", "none"]))
@settings(max_examples=8, deadline=None)
def test_random_state_differs_exactly_when_a_generator_drew(draw):
    import random  # noqa: PLC0415 (the generator under test)

    from scio_recorder.checks._random import RandomState  # noqa: PLC0415

    before = RandomState.now()
    {
        "torch": lambda: torch.rand(1),
        "python": random.random,
        "numpy": np.random.rand,  # the global generator, on purpose
        "none": lambda: torch.ones(1) * 2,
    }[draw]()
    assert (RandomState.now() == before) == (draw == "none")


def test_an_empty_batch_is_refused_naming_its_shape():
    """No row: every line would compare nothing (five PASS over 0 values)."""
    with pytest.raises(
        ValueError,
        match=r"^`check` got an empty batch: an input of shape \[0, 4\] has no row "
        r"on its batch dimension \(dim 0\)",
    ):
        check(mlp(), torch.randn(0, 4))
    rnet = Recorder(mlp(), input_size=(1, 4))
    with pytest.raises(ValueError, match=r"input of shape \[0, 4\]"):
        rnet.check(torch.randn(0, 4))
    lstm = nn.LSTM(4, 4).eval()
    with pytest.raises(ValueError, match=r"shape \[7, 0, 4\] has no row .* \(dim 1\)"):
        check(lstm, torch.randn(7, 0, 4), batch_dim=1)


def test_records_that_hold_no_value_are_refused():
    """Rows, but no position: the records are empty, nothing to compare."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3)).eval()
    with pytest.raises(
        ValueError,
        match=r"^`check` has nothing to compare: the records of the checked calls "
        r"hold no value \(0-1 \(Sequential \(the whole net\)\): \[2, 0, 3\]",
    ):
        check(net, torch.randn(2, 0, 4))


def test_batchnorm1d_in_train_mode_fails_batch_saying_once_that_rows_cannot_run():
    """A row alone cannot run in train mode; the cause is certain: FAIL, said once."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)).train()
    report = check(net, torch.randn(6, 4))
    assert report.failed == ("batch",)
    assert not report.passed
    line = report["batch"]
    assert line.magnitude is None
    assert line.cause.startswith(
        "a BatchNorm in train mode (`1`) normalizes with the batch's own statistics, "
        "so a row's records depend on its batch-mates: call net.eval(); rows 0, 1, "
        "2, 3, 4 and 5 alone raised ValueError (Expected more than 1 value per "
        "channel when training"
    )
    assert line.cause.count("alone raised") == 1
    assert line.cause.count("BatchNorm") == 1
    assert line.cause.endswith(": not compared")


def test_the_report_is_a_read_only_mapping_of_its_lines():
    from collections.abc import Mapping  # noqa: PLC0415

    report = check(mlp(), torch.randn(5, 4))
    assert isinstance(report, Mapping)
    assert "batch" in report
    assert "nope" not in report
    assert 0 not in report
    assert list(report) == list(CHECKS)
    assert len(report) == len(CHECKS)
    assert dict(report.items()) == {line.name: line for line in report.lines}
    assert report.get("nope") is None
    with pytest.raises(KeyError, match=r"No check named 'nope': the checks are"):
        report["nope"]
    with pytest.raises(TypeError):
        report["batch"] = report["dtype"]  # type: ignore[index]


def bloom() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BloomConfig(
        vocab_size=100, hidden_size=16, n_layer=2, n_head=2, pad_token_id=0
    )
    return transformers.BloomForCausalLM(config).eval()


@pytest.mark.slow
def test_a_clean_float32_bloom_left_padded_does_not_fail_dtype():
    """The float64 copy computes NaN at the padding (a fully masked softmax made
    in float32: finfo(float64).min is -inf there), which spreads to the kept
    positions of the next layer. Kept positions are compared; the copy's own
    NaN are named, never a FAIL."""
    model = bloom()
    batch = padded("left")
    keep = batch["attention_mask"].bool()
    report = check(model, batch)
    assert "dtype" not in report.failed
    line = report["dtype"]
    assert line.status == "WARN"
    assert "the float64 copy computes as NaN or inf and the float32 model does " in (
        line.cause
    )
    # layer 0's MLP: NaN at the padding only, so its kept positions are compared,
    # against the float64 copy's by hand-written hooks
    name = "transformer.h.0.mlp"
    line = check(model, batch, layers=[name])["dtype"]
    assert line.status == "PASS"
    seen = []
    for copy in (model, bloom().double()):
        handle = copy.get_submodule(name).register_forward_hook(
            lambda _m, _a, out: seen.append(out)
        )
        with torch.no_grad():
            copy(**batch)
        handle.remove()
    narrow, wide = seen[0][keep], seen[1][keep]
    assert bool(seen[1][~keep].isnan().any())  # the copy's NaN at the padding
    assert line.magnitude == pytest.approx(relative32(narrow.double(), wide), rel=1e-6)
