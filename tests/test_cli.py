"""The command line: summary, graph, demo, and one-line errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
from safetensors.torch import save_file

from scio_recorder import Recorder
from scio_recorder.cli import main
from scio_recorder.demo import run_demo
from scio_recorder.models import resnet18_cifar


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_of_a_module_callable_is_the_recorder_table(capsys):
    code, out, err = run(
        capsys,
        "summary",
        "scio_recorder.models:resnet18_cifar",
        "--input-size",
        "1,3,32,32",
    )
    assert code == 0
    assert err == ""
    torch.manual_seed(0)
    table = repr(Recorder(resnet18_cifar().eval(), input_size=(1, 3, 32, 32)))
    assert out.splitlines()[:12] == table.splitlines()[:12]


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
    assert "├─Linear (4): 1-5" in out
    lines = out.split("recorded in one pass on the input above:")[1].splitlines()
    # ones everywhere: each Linear sums its inputs; the input is uniform in [0, 1)
    assert lines[1].split()[:5] == ["1-1", "(Linear", "`0`)", "[3,", "8]"]
    assert lines[2].split()[:5] == ["1-5", "(Linear", "`4`)", "[3,", "2]"]


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
    assert (
        "(Linear `encoder.layer.0.output.dense`) [2, 6, 16]"
        in out.split("recorded in one pass")[1]
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
            "the model does not run on that input",
        ),
        (
            ["summary", "demo", "--weights", "missing.safetensors"],
            "no weights file 'missing.safetensors'",
        ),
        (
            ["summary", "demo", "--record", "9-9"],
            "Following layers not found: {(9, 9)}",
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


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(Exception, match="unknown model"):
        main(["--debug", "summary", "nope"])


def test_graph_writes_dot_and_svg(capsys, tmp_path):
    dot = tmp_path / "g.dot"
    code, out, _ = run(capsys, "graph", "demo", "--depth", "1", "-o", str(dot))
    assert code == 0
    assert out.startswith(f"wrote {dot} (4 nodes, 3 edges)")
    assert 'label="Sequential (features): 1-1' in dot.read_text()
    code, out, _ = run(capsys, "graph", "mlp")
    assert code == 0
    assert out.splitlines()[0] == "ExecutionGraph(7 nodes, 6 edges, depth=None)"


def test_demo_quick_prints_the_table_and_writes_the_pictures(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, _ = run(capsys, "demo", "--quick", "--out", str(tmp_path / "demo"))
    assert code == 0
    assert (
        "| detector | AUROC noise | FPR95 noise | AUROC shapes | FPR95 shapes |" in out
    )
    for name in ("MSP", "Energy", "ReAct", "ASH", "Mahalanobis", "KNN"):
        assert f"| {name} | " in out
    files = {p.name for p in (tmp_path / "demo").iterdir()}
    assert {"scores-noise.png", "roc-noise.png", "gradcam.png"} <= files
    assert {"graph.svg", "graph.dot"} & files


def test_demo_is_deterministic_for_a_seed():
    quiet = {"echo": lambda _line: None, "quick": True}
    first = run_demo(None, seed=3, **quiet)
    second = run_demo(None, seed=3, **quiet)
    for name, evaluation in first.evaluations.items():
        for detector, metrics in evaluation.items():
            assert second.evaluations[name][detector] == metrics
    assert first.accuracy == second.accuracy
