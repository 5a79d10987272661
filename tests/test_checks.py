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

import re

import pytest
import torch
from torch import nn

from scio_recorder import CheckReport, Recorder, check
from scio_recorder._batches import Positions
from scio_recorder.checks import CHECKS
from tests.lms import bert, gpt2, llama, padded
from tests.nets import LoopNet


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b|: the report's measure, computed here."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max())


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
        "call net.eval()"
    )
    assert check(net.eval(), torch.randn(5, 4)).failed == ()


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
