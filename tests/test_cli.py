"""The command line: summary, graph, demo, and one-line errors."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from scio_recorder import Recorder, plot
from scio_recorder._support.extras import INSTALL_DOT
from scio_recorder.cli import main
from scio_recorder.demo import DETECTORS, SLOW, gradcam_layer, run_demo
from scio_recorder.graph import ExecutionGraph
from scio_recorder.models import digits_cnn, resnet18_cifar
from scio_recorder.ood.benchmark import CATALOGUE, load_benchmark


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_of_a_module_callable_is_the_compact_table(capsys):
    argv = [
        "summary",
        "scio_recorder.models:resnet18_cifar",
        "--input-size",
        "1,3,32,32",
    ]
    code, out, err = run(capsys, *argv)
    assert code == 0
    assert err == ""
    torch.manual_seed(0)
    rnet = Recorder(resnet18_cifar().eval(), input_size=(1, 3, 32, 32))
    assert out == rnet.compact() + "\n"
    assert max(map(len, out.splitlines())) <= 100
    assert "Recorder instance" not in out
    assert "Currently recording" not in out


def test_summary_full_is_the_reference_table_without_the_recorder_wrapper(capsys):
    argv = ["summary", "scio_recorder.models:resnet18_cifar", "--full"]
    code, out, _ = run(capsys, *argv, "--input-size", "1,3,32,32")
    assert code == 0
    rnet = Recorder(resnet18_cifar().eval(), input_size=(1, 3, 32, 32))
    assert out == f"{rnet.summary}\n"
    assert "Recorder instance" not in out


@pytest.mark.parametrize("width", ["60", "150"])
def test_summary_width_bounds_every_line(capsys, width):
    code, out, _ = run(
        capsys, "summary", "resnet18_cifar", "--width", width,
        "--record", "layer4.1.conv2", "layer2.0.downsample.0",
    )  # fmt: skip
    assert code == 0
    assert max(map(len, out.splitlines())) <= int(width)


@pytest.mark.parametrize("width", ["39", "x"])
def test_summary_width_below_40_is_a_usage_error(capsys, width):
    with pytest.raises(SystemExit) as exit_:
        main(["summary", "mlp", "--width", width])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        "argument --width: give the most characters per line, an integer >= 40" in err
    )


def test_summary_too_narrow_for_the_model_names_the_width_that_works(capsys):
    code, _, err = run(
        capsys, "summary", "resnet18_cifar", "--width", "40", "--record", "fc"
    )
    assert code == 2
    assert re.search(r"--width 40: width=40 is too narrow .* give width >= \d+", err)


def test_summary_record_marks_the_rows_and_says_what_is_recorded(capsys):
    code, out, _ = run(capsys, "summary", "mlp", "--record", "1-1", "4")
    assert code == 0
    table, recorded = out.split("\nrecorded in one pass on the input above:\n")
    marked = [line.split()[1] for line in table.splitlines() if line.startswith("o ")]
    assert marked == ["1-1", "1-5"]
    assert "Currently recording: outputs 1-1, 1-5 (rec: o output)" in table
    assert "Currently recording: None" not in out
    lines = recorded.splitlines()
    assert lines[0].split() == ["label", "name", "shape", "mean", "std", "min", "max"]
    assert [line.split()[:2] for line in lines[2:]] == [["1-1", "0"], ["1-5", "4"]]


def test_summary_of_a_file_callable_with_arguments_and_weights(capsys, tmp_path):
    source = tmp_path / "my_models.py"
    source.write_text(
        textwrap.dedent(
            """
            from torch import nn

            def build(width, depth=1):
                layers = [nn.Linear(4, width), nn.ReLU()]
                for _ in range(depth - 1):
                    layers += [nn.Linear(width, width), nn.ReLU()]
                return nn.Sequential(*layers, nn.Linear(width, 2))
            """
        )
    )
    weights = tmp_path / "w.safetensors"
    state = {
        "0.weight": torch.ones(8, 4), "0.bias": torch.zeros(8),
        "2.weight": torch.ones(8, 8), "2.bias": torch.zeros(8),
        "4.weight": torch.ones(2, 8), "4.bias": torch.zeros(2),
    }  # fmt: skip
    save_file(state, weights)
    code, out, _ = run(
        capsys, "summary", f"{source}:build", "--arg", "8", "--kwarg", "depth=2",
        "--input-size", "3,4", "--weights", str(weights), "--record", "1-5", "0",
    )  # fmt: skip
    assert code == 0
    assert re.search(r"^o +1-5 +4 +Linear +\[3, 2\] +18$", out, re.MULTILINE)
    lines = out.split("recorded in one pass on the input above:")[1].splitlines()
    assert lines[3].split()[:4] == ["1-1", "0", "[3,", "8]"]
    assert lines[4].split()[:4] == ["1-5", "4", "[3,", "2]"]


def test_summary_of_a_transformers_model_from_a_file(capsys, tmp_path):
    pytest.importorskip("transformers")
    source = tmp_path / "bert.py"
    source.write_text(
        textwrap.dedent(
            """
            import transformers

            def small_bert(layers=2):
                config = transformers.BertConfig(
                    vocab_size=50, hidden_size=16, num_hidden_layers=layers,
                    num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=16,
                )
                return transformers.BertModel(config)
            """
        )
    )
    data = tmp_path / "inputs.safetensors"
    save_file(
        {
            "input_ids": torch.randint(0, 50, (2, 6)),
            "attention_mask": torch.ones(2, 6, dtype=torch.long),
        },
        data,
    )
    code, out, _ = run(
        capsys, "summary", f"{source}:small_bert", "--kwarg", "layers=1",
        "--input-data", str(data), "--record", "encoder.layer.0.output.dense",
    )  # fmt: skip
    assert code == 0
    assert "BertModel" in out
    recorded = out.split("recorded in one pass")[1]
    assert re.search(
        r"\d-\d+ +encoder\.layer\.0\.output\.dense +\[2, 6, 16\]", recorded
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["summary", "nope"], "unknown model 'nope': give package.module:callable"),
        (["summary", "no_such_pkg:thing"], "cannot import 'no_such_pkg'"),
        (
            ["summary", "scio_recorder.models:nothing"],
            "'scio_recorder.models' has no attribute 'nothing'",
        ),
        (["summary", "demo", "--input-size", "1,3,x"], "bad --input-size '1,3,x'"),
        (
            ["summary", "demo", "--input-size", "1,1,8,8"],
            (
                "the model's forward raised RuntimeError: Given groups=1, weight "
                "of size [8, 3, 3, 3], expected input[1, 1, 8, 8] to have 3 channels"
            ),
        ),
        (
            ["summary", "demo", "--input-size", "1,1,8,8"],
            (
                "it was given --input-size 1,1,8,8 (float32 tensors of shapes "
                "[1, 1, 8, 8]); fix --input-size or --input-data"
            ),
        ),
        (
            ["summary", "mlp", "--vocab-size", "10"],
            "--vocab-size goes with --input-ids SHAPE",
        ),
        (
            ["summary", "mlp", "--input-ids", "2,x"],
            "bad --input-ids '2,x': give integers with the batch, e.g. 2,64",
        ),
        (
            ["summary", "mlp", "--input-ids", "2,8"],
            "--input-ids needs the vocabulary size: give --vocab-size N",
        ),
        (
            ["summary", "demo", "--weights", "missing.safetensors"],
            "no weights file 'missing.safetensors'",
        ),
        (
            ["summary", "demo", "--record", "9-9"],
            (
                "--record 9-9: Following layers not found: {(9, 9)}. Operation "
                "cancelled (`scio-recorder summary` without --record lists the labels"
            ),
        ),
        (["graph", "demo", "-o", "g.jpg"], "Cannot render to 'jpg'"),
        (
            ["summary", "scio_recorder.models:DemoCNN"],
            "give the model's input: --input-size",
        ),
    ],
)
def test_errors_are_one_line_and_exit_2(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("scio-recorder: error: ")
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "summary", "nope"],
        ["summary", "--debug", "nope"],
        ["summary", "nope", "--debug"],
        ["graph", "nope", "--debug"],
    ],
)
def test_debug_shows_the_traceback_before_or_after_the_command(capsys, argv):
    # every error line suggests --debug: it works wherever the user puts it
    with pytest.raises(Exception, match="unknown model 'nope'"):
        main(argv)


def test_without_debug_the_command_does_not_turn_it_on(capsys):
    # the command's parser must not write debug=False over a --debug given
    # before it, nor True where none was given
    assert run(capsys, "summary", "nope")[0] == 2


def write(tmp_path, name, source):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


LINEAR = """
from torch import nn

def build():
    return nn.Linear(4, 2)
"""


@pytest.mark.parametrize(
    ("prologue", "status"),
    [
        ("import sys\nsys.exit(0)\n", "with exit code 0"),
        ("import sys\nsys.exit()\n", "with exit code 0"),
        ("raise SystemExit(3)\n", "with exit code 3"),
        ("import sys\nsys.exit('no GPU here')\n", "with the message 'no GPU here'"),
    ],
)
def test_a_target_that_exits_at_import_is_an_error_naming_it(
    capsys, tmp_path, prologue, status
):
    source = write(tmp_path, "exits_at_import.py", prologue + LINEAR)
    target = f"{source}:build"
    code, out, err = run(capsys, "summary", target, "--input-size", "1,4")
    assert code == 2  # not a silent success
    assert out == ""
    assert err.startswith(f"scio-recorder: error: the target {target!r} called ")
    assert f"sys.exit {status}" in err
    assert 'if __name__ == "__main__":' in err
    assert "exits_at_import" not in sys.modules  # no half-imported module kept


def test_a_target_that_exits_while_building_is_an_error_naming_it(capsys, tmp_path):
    source = write(
        tmp_path,
        "exits_in_factory.py",
        """
        import sys

        def build():
            sys.exit(0)
        """,
    )
    target = f"{source}:build"
    code, _, err = run(capsys, "graph", target, "--input-size", "1,4")
    assert code == 2
    assert f"the target {target!r} called sys.exit with exit code 0" in err


def test_ctrl_c_in_a_target_still_interrupts(tmp_path):
    source = write(tmp_path, "interrupted.py", "raise KeyboardInterrupt\n" + LINEAR)
    with pytest.raises(KeyboardInterrupt):
        main(["summary", f"{source}:build", "--input-size", "1,4"])


ARGPARSE_AT_IMPORT = """
import argparse
import sys

from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=3)
SEEN_ARGV = list(sys.argv)
WIDTH = parser.parse_args().width

def build():
    return nn.Sequential(nn.Linear(4, WIDTH), nn.ReLU())
"""


def test_a_target_parsing_argv_at_import_sees_none_of_our_arguments(
    capsys, tmp_path, monkeypatch
):
    source = write(tmp_path, "parses_argv.py", ARGPARSE_AT_IMPORT)
    target = f"{source}:build"
    # the console script: main() reads sys.argv, full of our own options, which
    # the target's parser would refuse with its own usage as if it were ours
    argv = ["scio-recorder", "summary", target, "--input-size", "2,4", "--depth", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    code = main()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    assert re.search(r"^1-1 +0 +Linear ", out, re.MULTILINE)
    assert "[2, 3]" in out  # the target's own default width
    seen = sys.modules["parses_argv"].SEEN_ARGV
    assert seen == [target]
    assert sys.argv == argv  # restored


def test_a_target_whose_argparse_fails_reports_the_target(capsys, tmp_path):
    source = write(
        tmp_path,
        "needs_argv.py",
        ARGPARSE_AT_IMPORT.replace("default=3", "required=True"),
    )
    target = f"{source}:build"
    argv_before = list(sys.argv)
    code, _, err = run(capsys, "summary", target, "--input-size", "1,4")
    assert code == 2
    # argparse prints the target's usage under the target's name, not ours
    assert err.startswith(f"usage: {source.name}:build [-h] --width WIDTH")
    assert f"the target {target!r} called sys.exit with exit code 2" in err
    assert sys.argv == argv_before


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (
            "1,99999999999999999999999",
            (
                "bad --input-size '1,99999999999999999999999': "
                "99999999999999999999999 is not a size; give integers from 1 to "
                "2147483647"
            ),
        ),
        ("1,2147483648", "2147483648 is not a size"),
        ("1,0", "bad --input-size '1,0': 0 is not a size"),
        ("1,8;1,-8", "bad --input-size '1,8;1,-8': -8 is not a size"),
        (
            "1,100000,100000,100000",
            (
                "--input-size '1,100000,100000,100000' asks for "
                "1,000,000,000,000,000 input values"
            ),
        ),
    ],
)
def test_input_sizes_are_bounded_with_a_message(capsys, sizes, message):
    code, _, err = run(capsys, "summary", "mlp", f"--input-size={sizes}")
    assert code == 2
    assert err.count("\n") == 1
    assert message in err
    assert "frame #" not in err  # no C++ backtrace
    assert "give" in err  # and what to do


# valid sizes stay small (at most 64**4 values): a big valid shape would allocate
SIZE = st.one_of(
    st.integers(1, 64), st.integers(-(2**70), 0), st.integers(2**31, 2**70)
)


@given(st.lists(SIZE, min_size=1, max_size=4))
@settings(max_examples=40, deadline=None)
def test_any_input_size_is_a_table_or_a_one_line_error(sizes):
    # only sizes a model rejects may reach torch; all others stop with a message
    text = ",".join(str(n) for n in sizes)
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()) as err,
    ):
        code = main(["summary", "mlp", f"--input-size={text}"])
    if code == 0:
        return
    assert code == 2
    line = err.getvalue()
    assert line.count("\n") == 1
    assert "frame #" not in line
    if any(not 0 < n < 2**31 for n in sizes):
        assert f"bad --input-size {text!r}" in line


@pytest.mark.parametrize("command", ["summary", "graph"])
@pytest.mark.parametrize("depth", ["-1", "-3", "x", "1.5"])
def test_depth_is_a_non_negative_int_for_every_command(capsys, command, depth):
    with pytest.raises(SystemExit) as exit_:
        main([command, "mlp", "--depth", depth])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --depth: give an integer >= 0" in err
    assert f"not {depth!r}" in err


@pytest.mark.parametrize("command", ["summary", "graph"])
def test_depth_zero_is_the_model_as_one_row_or_node(capsys, command):
    code, out, _ = run(capsys, command, "mlp", "--depth", "0")
    assert code == 0
    assert "Linear" not in out


@pytest.mark.parametrize(
    ("content", "name"),
    [(b"hello", "notes.txt"), (b"", "empty.safetensors")],
)
def test_input_data_that_is_not_safetensors_names_the_file(
    capsys, tmp_path, content, name
):
    path = tmp_path / name
    path.write_bytes(content)
    code, _, err = run(capsys, "summary", "mlp", "--input-data", str(path))
    assert code == 2
    assert err.count("\n") == 1
    expected = f"cannot read --input-data {str(path)!r}: it is not a safetensors file"
    assert expected in err
    assert "safetensors.torch.save_file(" in err


def test_input_data_saved_with_torch_save_names_the_file(capsys, tmp_path):
    path = tmp_path / "inputs.pt"
    torch.save({"0": torch.ones(1, 16)}, path)
    code, _, err = run(capsys, "summary", "mlp", "--input-data", str(path))
    assert code == 2
    assert f"--input-data {str(path)!r}: it is not a safetensors file" in err
    assert "torch.save/pickle files are not read" in err


def test_the_cli_passes_leave_every_module_in_eval_mode(capsys, tmp_path):
    # the CLI puts the model in eval mode; the reference pass of the table, the
    # recorded pass and the graph pass must neither flip it back nor change a
    # submodule's own mode
    source = write(
        tmp_path,
        "mode_probe.py",
        """
        from torch import nn

        SEEN = []
        BUILT = []

        class Probe(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
                self.head = nn.Linear(4, 2)

            def forward(self, x):
                SEEN.append(tuple(m.training for m in self.modules()))
                return self.head(self.body(x))

        def build():
            BUILT.append(Probe().train())
            return BUILT[-1]
        """,
    )
    target = f"{source}:build"
    for argv in (["summary", "--record", "body"], ["graph"]):
        code, _, err = run(capsys, argv[0], target, "--input-size", "1,4", *argv[1:])
        assert code == 0, err
        probe = sys.modules.pop("mode_probe")  # each run imports the file anew
        # summary: the table's reference pass, then --record's; graph: its own
        # pass only (no table is built)
        assert len(probe.SEEN) == (2 if argv[0] == "summary" else 1)
        assert all(not any(modes) for modes in probe.SEEN)
        (net,) = probe.BUILT
        assert not any(m.training for m in net.modules())


GPT2_FILE = """
import transformers

def small_gpt2():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
    )
"""


@pytest.fixture
def gpt2_file(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_gpt.py").write_text(GPT2_FILE)
    yield "my_gpt.py:small_gpt2"
    sys.modules.pop("my_gpt", None)


def test_input_ids_make_a_language_model_run_in_summary_and_record(capsys, gpt2_file):
    code, out, err = run(
        capsys, "summary", gpt2_file, "--input-ids", "2,8",
        "--record", "transformer.h.0.mlp.c_fc", "lm_head",
    )  # fmt: skip
    assert code == 0, err
    assert "GPT2LMHeadModel" in out
    recorded = out.split("recorded in one pass")[1]
    # vocab_size from the model's config: the logits have 100 classes
    assert re.search(r" lm_head +\[2, 8, 100\] ", recorded)
    assert re.search(r" transformer\.h\.0\.mlp\.c_fc +\[2, 8, 128\] ", recorded)


def test_summary_counts_a_tied_weight_once(capsys, gpt2_file):
    """GPT-2's ``lm_head`` shares ``wte``'s weight: totals count it once."""
    transformers = pytest.importorskip("transformers")
    net = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
    )
    unique = sum(p.numel() for p in net.parameters())  # each Parameter once
    code, out, err = run(capsys, "summary", gpt2_file, "--input-ids", "1,8")
    assert code == 0, err
    assert f"Total params: {unique:,} (trainable {unique:,})" in out.splitlines()
    assert "Tied weights (transformer.wte.weight = lm_head.weight)" in out
    code, out, err = run(
        capsys, "summary", gpt2_file, "--input-ids", "1,8", "--full"
    )  # fmt: skip
    assert code == 0, err
    assert f"Total params: {unique:,}" in out.splitlines()
    assert f"Trainable params: {unique:,}" in out.splitlines()


def test_input_ids_draw_the_graph_of_a_language_model(capsys, gpt2_file, tmp_path):
    out_file = tmp_path / "gpt.dot"
    code, out, err = run(
        capsys, "graph", gpt2_file, "--input-ids", "1,5", "--vocab-size", "50",
        "--depth", "2", "-o", str(out_file),
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith(f"wrote {out_file}")
    dot = out_file.read_text()
    assert "input_ids" in dot
    assert "attention_mask" in dot  # the forward takes one: an all-ones mask
    assert "Embedding (transformer.wte): 2-1" in dot


def test_input_ids_are_int64_below_the_vocabulary_with_a_mask(monkeypatch):
    from scio_recorder.cli import _model, _parser  # noqa: PLC0415 (private helpers)

    pytest.importorskip("transformers")
    namespace = {}
    exec(GPT2_FILE, namespace)  # noqa: S102 (the test's own source)
    net = namespace["small_gpt2"]()
    args = _parser._build_parser().parse_args(
        ["summary", "x:y", "--input-ids", "3,7", "--vocab-size", "5"]
    )
    given = _model._inputs(args, None, net)
    data = given.kwargs["input_data"]
    assert set(data) == {"input_ids", "attention_mask"}
    assert data["input_ids"].dtype == torch.int64
    assert data["input_ids"].shape == (3, 7)
    assert 0 <= int(data["input_ids"].min()) <= int(data["input_ids"].max()) < 5
    assert torch.equal(data["attention_mask"], torch.ones(3, 7, dtype=torch.int64))
    # a forward without attention_mask gets the ids alone, positionally
    embed = torch.nn.Embedding(5, 4)
    given = _model._inputs(args, None, embed)
    assert isinstance(given.kwargs["input_data"], list)


def test_float_input_to_a_language_model_says_to_use_input_ids(capsys, gpt2_file):
    code, _, err = run(capsys, "summary", gpt2_file, "--input-size", "1,8")
    assert code == 2
    assert err.count("\n") == 1
    assert (
        "the model's forward raised RuntimeError: Expected tensor for argument" in err
    )
    assert (
        "it was given --input-size 1,8 (float32 tensors of shapes [1, 8]); if it "
        "takes token ids, use --input-ids SHAPE --vocab-size N instead of "
        "--input-size"
    ) in err


def test_a_module_path_naming_a_local_file_suggests_the_file_form(capsys, gpt2_file):
    code, _, err = run(capsys, "summary", "my_gpt:small_gpt2", "--input-ids", "1,4")
    assert code == 2
    assert (
        "cannot import 'my_gpt': No module named 'my_gpt'. There is a file "
        "my_gpt.py: to load a model from a file, write my_gpt.py:small_gpt2"
    ) in err


BROKEN_FILE = """
from torch import nn

def build():
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(5, 2))
"""


def test_graph_of_a_failing_model_writes_the_partial_graph(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_net.py").write_text(BROKEN_FILE)
    code, _, err = run(
        capsys, "graph", "broken_net.py:build", "--input-size", "1,4", "-o", "b.dot"
    )
    assert code == 2
    assert err.count("\n") == 1
    assert (
        "the model's forward raised RuntimeError at Linear (2): 1-3: mat1 and mat2 "
        "shapes cannot be multiplied (1x3 and 5x2); it was given --input-size 1,4 "
        "(float32 tensors of shapes [1, 4]); fix --input-size or --input-data"
    ) in err
    assert "the graph up to there (the failing call in red) was written to b.dot" in err
    dot = (tmp_path / "b.dot").read_text()
    assert 'label="Linear (2): 1-3", shape=box' in dot
    assert 'color="#c00000"' in dot  # the failing call
    # without -o, the partial graph is printed and the error still says where
    code, out, err = run(capsys, "graph", "broken_net.py:build", "--input-size", "1,4")
    assert code == 2
    assert out.splitlines()[-1].endswith("<- 2 FAILED")
    assert "the graph up to there is printed above" in err
    sys.modules.pop("broken_net", None)


def test_graph_writes_dot_and_svg(capsys, tmp_path):
    dot = tmp_path / "g.dot"
    code, out, _ = run(capsys, "graph", "demo", "--depth", "1", "-o", str(dot))
    assert code == 0
    assert out.startswith(f"wrote {dot} (4 nodes, 3 edges)")
    assert 'label="Sequential (features): 1-1' in dot.read_text()
    code, out, _ = run(capsys, "graph", "mlp")
    assert code == 0
    assert out.splitlines()[0] == "ExecutionGraph(7 nodes, 6 edges, depth=None)"


@pytest.mark.slow
def test_demo_quick_prints_the_table_and_writes_the_pictures(
    capsys, tmp_path, monkeypatch
):
    pytest.importorskip("matplotlib")
    drawn = {}

    def keep(draw):
        def wrapper(*args, **kwargs):
            drawn[draw.__name__] = fig = draw(*args, **kwargs)
            return fig

        return wrapper

    for name in ("gradcam_overlay", "score_histograms"):
        monkeypatch.setattr(plot, name, keep(getattr(plot, name)))
    code, out, _ = run(capsys, "demo", "--quick", "--out", str(tmp_path / "demo"))
    assert code == 0
    assert "Recorder instance" not in out  # the compact table, no wrapper
    assert "|" not in out  # aligned text, no Markdown pipes
    # the digits benchmark, its conventions named, near/far sets and means
    assert "ID digits 0-5" in out
    assert "FPR95-ID: false-positive rate at 95 % ID recall (ID positive" in out
    # one seed (--quick): no spread shown, and the header says so
    assert "1 seed (0); one run: no spread over seeds" in out
    assert " ± " not in out.split("no spread over seeds", 1)[1].split("\n", 1)[1]
    header = re.search(
        r"^detector +digits-6-9 +noise +inverted +rotated +near mean +far mean$",
        out,
        re.MULTILINE,
    )
    assert header is not None, out
    for name in ("MSP", "Energy", "ReAct", "Mahalanobis", "KNN", "ViM", "Gram"):
        assert re.search(rf"^{name} +\d\.\d{{3}} +\d\.\d{{3}}", out, re.MULTILINE), name
    # the default set: the catalogue but its slowest (--all: every one)
    assert "fit 35 of the catalogue's 42 detectors (--all: every one)" in out
    for name in ("NAC", "Odds", "IsoMax"):
        assert not re.search(rf"^{name} ", out, re.MULTILINE), name
    files = {p.name for p in (tmp_path / "demo").iterdir()}
    assert {"scores-digits-6-9.png", "roc-digits-6-9.png", "gradcam.png"} <= files
    assert {"graph.svg", "graph.dot"} & files
    # the pictures say whose net they show: one seed, the table is over seeds
    assert "pictures of the net of seed 0:" in out
    assert drawn["score_histograms"].get_supxlabel() == "the net of seed 0"
    # Grad-CAM: of the last convolution, named from the table (it is
    # `features.5`, label 2-6: the second of the net's three Conv2d)
    cam = drawn["gradcam_overlay"]
    assert cam.get_suptitle() == (
        "Grad-CAM of features.5 (2-6, Conv2d: the last convolution)\nthe net of seed 0"
    )
    net = digits_cnn(6)
    convs = [n for n, m in net.named_modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs[-1] == "features.5"
    # each panel: the true digit (four test digits, then one unseen of each)
    _, test_labels = load_benchmark("digits", seed=0).test
    titles = [ax.get_title() for ax in cam.axes[:8]]
    assert [t.split(":")[0] for t in titles] == [
        *(f"test digit {d}" for d in test_labels[:4].tolist()),
        "unseen digit 6",
        "unseen digit 7",
        "unseen digit 8",
        "unseen digit 9",
    ]
    assert all(re.fullmatch(r".*: predicted [0-5]", t) for t in titles)
    # the digit stays visible: its outline is drawn over the heat
    assert all(len(ax.collections) > 0 for ax in cam.axes[:8])


@pytest.mark.slow
def test_demo_without_dot_says_which_program_to_install(tmp_path, monkeypatch):
    """Without Graphviz's ``dot``, the demo names that program and how to get it."""

    def no_dot(*args, **kwargs):
        raise RuntimeError(INSTALL_DOT)

    monkeypatch.setattr(ExecutionGraph, "render", no_dot)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no plots
    lines = []
    result = run_demo(tmp_path, quick=True, echo=lines.append)
    assert [p.name for p in result.files] == ["graph.dot"]
    assert (
        "execution graph written as DOT (for SVG, install Graphviz's `dot` "
        "program: `apt-get install graphviz`, `conda install graphviz` or "
        "`brew install graphviz`)"
    ) in lines


def test_the_gradcam_layer_of_a_net_without_convolution_is_refused():
    rnet = Recorder(torch.nn.Sequential(torch.nn.Linear(4, 2)), input_size=(1, 4))
    with pytest.raises(
        ValueError,
        match=r"^Sequential has no nn.Conv2d call to draw the Grad-CAM of; "
        r"print\(rnet.compact\(\)\) lists its layers$",
    ):
        gradcam_layer(rnet)


@pytest.mark.slow
def test_demo_is_deterministic_for_a_seed():
    quiet = {"echo": lambda _line: None, "quick": True}
    first = run_demo(None, seed=3, **quiet)
    second = run_demo(None, seed=3, **quiet)
    for name, evaluation in first.evaluations.items():
        for detector, metrics in evaluation.items():
            assert second.evaluations[name][detector] == metrics
    assert first.accuracy == second.accuracy
    assert first.table() == second.table()


def test_demo_all_rates_every_detector_of_the_catalogue(capsys, tmp_path, monkeypatch):
    """``--all`` asks for the whole catalogue; the default leaves the slowest out."""
    asked = []

    def record(out, **options):
        asked.append(options)

    monkeypatch.setattr("scio_recorder.demo.run_demo", record)
    for extra in ([], ["--all"]):
        code, _, _ = run(capsys, "demo", "--quick", "--out", str(tmp_path), *extra)
        assert code == 0
    assert asked == [
        {"seed": 0, "quick": True},
        {"seed": 0, "quick": True, "detectors": None},
    ]
    assert set(DETECTORS) | set(SLOW) == set(CATALOGUE)
    assert [n for n in CATALOGUE if n in DETECTORS] == list(DETECTORS)
    assert len(DETECTORS) == 35


def test_demo_refuses_a_bad_out_before_the_run(capsys, tmp_path, monkeypatch):
    """A file or an unmakeable folder as --out: said at once, nothing run."""

    def never(*_args, **_kwargs):
        msg = "the demo ran"
        raise AssertionError(msg)

    monkeypatch.setattr("scio_recorder.demo.run_demo", never)
    afile = tmp_path / "afile"
    afile.write_text("")
    code, _, err = run(capsys, "demo", "--quick", "--out", str(afile))
    assert code == 2
    assert f"--out {afile} is a file, not a folder: give a folder" in err
    code, _, err = run(capsys, "demo", "--out", str(afile / "below"))
    assert code == 2
    assert f"--out {afile / 'below'}: cannot make that folder" in err


@pytest.mark.slow
def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`scio-recorder summary ... | head`: no error when the pipe closes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "scio_recorder", "summary", "transformer"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before the first line
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert err == b""


def test_demo_refuses_an_unknown_ood_set():
    with pytest.raises(
        ValueError, match=r"unknown OoD set \['shapes'\]; the digits benchmark has"
    ):
        run_demo(None, quick=True, echo=lambda _line: None, ood=("shapes",))


# -- check ----------------------------------------------------------------------


@pytest.mark.slow
def test_check_of_left_padded_gpt2_fails_batch_without_position_ids(capsys, gpt2_file):
    """--padding left --position-ids none: the batch check fails, exit code 1."""
    code, out, err = run(
        capsys, "check", gpt2_file, "--input-ids", "3,8", "--padding", "left",
        "--position-ids", "none",
    )  # fmt: skip
    assert code == 1, err
    lines = out.splitlines()
    assert re.fullmatch(r"check +result +magnitude +where +likely cause", lines[0])
    assert [line.split()[:2] for line in lines[2:]] == [
        ["recording", "PASS"],
        ["batch", "FAIL"],
        ["determinism", "PASS"],
        ["dtype", "PASS"],
        ["inplace", "PASS"],
        ["calls", "PASS"],
    ]
    assert "'s records change with its padding: the model takes position_ids" in out
    # Derived from the mask (the default), every check passes.
    code, out, err = run(
        capsys, "check", gpt2_file, "--input-ids", "3,8", "--padding", "left",
        "--record", "transformer.h.1",
    )  # fmt: skip
    assert code == 0, err
    assert " FAIL " not in out
    assert "each of the 1 checked calls ran as in the reference pass" in out


def test_check_prints_the_report_of_rnet_check(capsys, tmp_path):
    """The command prints rnet.check's table for the model and input it builds."""
    from scio_recorder.models import tiny_mlp  # noqa: PLC0415

    x = torch.randn(4, 16)
    save_file({"0": x}, tmp_path / "x.safetensors")
    code, out, _ = run(
        capsys, "check", "mlp", "--input-data", str(tmp_path / "x.safetensors")
    )
    assert code == 0
    torch.manual_seed(0)  # as the command builds the model
    rnet = Recorder(tiny_mlp().eval(), force_static_flow=False, input_data=[x])
    assert out == f"{rnet.check(x)}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["check", "mlp", "--rows", "0"],
            "--rows 0: give the number of rows to run alone, >= 1",
        ),
        (
            ["check", "mlp", "--padding", "left"],
            (
                "--padding left needs --input-ids and a model whose forward takes "
                "an attention_mask (the padding is marked there)"
            ),
        ),
    ],
)
def test_check_errors_name_the_option(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err == f"scio-recorder: error: {message} (--debug shows the traceback)\n"
