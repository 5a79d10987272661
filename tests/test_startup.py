"""What starting costs: the modules ``import scio_recorder`` and the CLI load.

``import scio_recorder`` loads what a plain recorder needs, nothing more: no
compiler (``torch._dynamo``), no plotting, graph drawing or language-model
library, not the OoD catalogue nor data-set collection; those load when
first used. ``scio-recorder --help`` and argument errors answer before the
commands' work is imported. Each check runs in a fresh interpreter and reads
``sys.modules``; what ``import torch`` itself loads is not counted against us.
Times are measured in ``benchmarks/startup.py``, not here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import scio_recorder

ROOT = Path(scio_recorder.__file__).resolve().parents[1]

HEAVY = (
    # compilers and exporters: loaded by `torch.compile` / `rnet.export` only
    "torch._dynamo",
    "torch._inductor",
    "torch.export",
    "torch._export",
    "sympy",
    # optional libraries
    "matplotlib",
    "graphviz",
    "transformers",
    "accelerate",
    "tqdm.notebook",
    "tqdm.auto",
    "ipywidgets",
    "IPython",
    "pandas",
    "scipy",
    "sklearn",
    "faiss",
    # our tools on top of a recorder
    "scio_recorder.ood",
    "scio_recorder.explain",
    "scio_recorder.collect",
    "scio_recorder.graph",
    "scio_recorder.plot",
    "scio_recorder.io",
    "scio_recorder.group",
    "scio_recorder.calls",
    "scio_recorder.checks",
    "scio_recorder.heads",
    "scio_recorder.data",
    "scio_recorder.demo",
    "scio_recorder.recipes",
    "scio_recorder.cli",
    "scio_recorder.sae",
    "scio_recorder.views",
)
"""Modules (and their submodules) that ``import scio_recorder`` must not load."""

# Each step runs in one fresh interpreter, after `import torch`; the modules
# it loaded are written out as JSON, by step.
_STEPS = """
import json, sys
import torch
steps = {}
seen = set(sys.modules)
def step(name):
    global seen
    steps[name] = sorted(set(sys.modules) - seen)
    seen = set(sys.modules)
"""


def _run_steps(body: str) -> dict[str, set[str]]:
    """Run ``body`` (which calls ``step(name)``) in a fresh interpreter."""
    code = _STEPS + textwrap.dedent(body) + "\nprint(json.dumps(steps))\n"
    done = subprocess.run(  # noqa: S603 (our own interpreter and code)
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        cwd=ROOT,  # imports this checkout's package
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    return {name: set(modules) for name, modules in json.loads(last).items()}


def _heavy(modules: set[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``modules`` that are in ``heavy`` or below one of them."""
    return sorted(
        m for m in modules if any(m == h or m.startswith(f"{h}.") for h in heavy)
    )


@pytest.fixture(scope="module")
def library_steps() -> dict[str, set[str]]:
    return _run_steps(
        """
        import scio_recorder
        step("import")
        from torch import nn
        from scio_recorder import Recorder
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        rnet = Recorder(net, input_size=(1, 4), force_static_flow=False)
        rnet.record((1, 1))
        rnet(torch.ones(3, 4))
        repr(rnet)
        step("plain recorder")
        Recorder(net, input_size=(1, 4))
        step("checked recorder")
        scio_recorder.collect
        step("collect")
        import scio_recorder.ood
        step("ood face")
        from scio_recorder.ood import Energy
        Energy(rnet)(torch.ones(3, 4))
        step("one detector")
        """
    )


def test_import_loads_no_compiler_no_tool_no_optional_library(library_steps):
    """`import scio_recorder` loads the recorder and nothing of `HEAVY`."""
    loaded = library_steps["import"]
    assert "scio_recorder.recorder" in loaded  # the check saw the import
    assert _heavy(loaded) == []


def test_a_plain_recorder_pass_loads_no_compiler(library_steps):
    """Building a recorder (no static-flow check), a pass, its table: no more.

    The default static-flow check is the next test.
    """
    assert _heavy(library_steps["plain recorder"]) == []


def test_the_default_check_loads_no_compiler_on_a_net_that_reads_no_value(
    library_steps,
):
    """`force_static_flow=True` watches the reference pass: no fake tensors, no Dynamo.

    Only a net that reads tensor values into Python gets a fake-tensor pass
    (``scio_recorder._run.flow``), whose ``FakeTensorMode`` imports ``torch._dynamo``.
    """
    assert _heavy(library_steps["checked recorder"]) == []


def test_ood_detectors_load_one_family_at_a_time(library_steps):
    """The OoD face loads no detector; one detector loads its own family."""
    assert _heavy(library_steps["ood face"], ("scio_recorder.ood._",)) == []
    one = library_steps["one detector"]
    assert "scio_recorder.ood._logits" in one
    assert (
        _heavy(one, ("scio_recorder.ood._prototypes", "scio_recorder.ood._edits")) == []
    )
    assert _heavy(one, ("torch._dynamo", "matplotlib", "transformers")) == []


def test_a_lazy_name_loads_its_module(library_steps):
    """`scio_recorder.collect` (the callable subpackage) loads on first use."""
    assert "scio_recorder.collect" in library_steps["collect"]


def test_lazy_names_are_listed_and_importable():
    """Lazy names show in `dir()`, import by name, and resolve to their objects."""
    from scio_recorder import CollectResult, collect, ood  # noqa: PLC0415 (tested)
    from scio_recorder.collect import _collect  # noqa: PLC0415 (its source)
    from scio_recorder.ood import Energy, _logits  # noqa: PLC0415 (tested)

    assert {"collect", "CollectResult", "Records", "RecorderGroup"} <= set(
        dir(scio_recorder)
    )
    assert set(ood.__all__) <= set(dir(ood))
    assert collect is sys.modules["scio_recorder.collect"]
    assert collect.collect is _collect.collect
    assert CollectResult.__module__ == "scio_recorder.collect._results"
    assert Energy is _logits.Energy
    assert vars(ood)["Energy"] is Energy  # bound once: later reads are plain
    with pytest.raises(
        AttributeError,
        match=re.escape("module 'scio_recorder.ood' has no attribute 'NoSuch"),
    ):
        _ = ood.NoSuchDetector


@pytest.mark.slow
def test_opening_a_view_loads_no_plotting_and_no_ood_catalogue():
    """The views load when imported; a page is made without matplotlib or OoD."""
    steps = _run_steps(
        """
        import scio_recorder
        step("import")
        from scio_recorder.views import layer_view, patching_view
        from torch import nn
        rnet = scio_recorder.Recorder(
            nn.Linear(2, 2), input_size=(1, 2), force_static_flow=False
        )
        patching_view(torch.ones(2, 3)).html()
        layer_view(rnet).html()
        step("views")
        """
    )
    assert _heavy(steps["import"]) == []
    assert "scio_recorder.views" in steps["views"]
    assert _heavy(steps["views"], HEAVY[:-1]) == []


def test_cli_help_and_usage_errors_answer_before_the_work_is_imported(tmp_path):
    """`--help`, a command's `--help` and argument errors import no command."""
    steps = _run_steps(
        f"""
        import contextlib, io, runpy
        codes = []
        for argv in (
            ["--help"],
            ["summary", "--help"],
            ["graph", "--help"],
            ["summary"],
            ["graph", "mlp", "--depth", "-1"],
            ["--version"],
        ):
            sys.argv = ["scio-recorder", *argv]
            with contextlib.redirect_stdout(io.StringIO()) as out, \\
                    contextlib.redirect_stderr(io.StringIO()) as err:
                try:
                    runpy.run_module("scio_recorder", run_name="__main__")
                except SystemExit as exit:
                    codes.append((exit.code, out.getvalue() + err.getvalue()))
        open({str(tmp_path / "codes.json")!r}, "w").write(json.dumps(codes))
        step("cli")
        """
    )
    codes = json.loads((tmp_path / "codes.json").read_text(encoding="utf-8"))
    assert [code for code, _ in codes] == [0, 0, 0, 2, 2, 0]
    assert codes[0][1].startswith("usage: scio-recorder")
    assert "the following arguments are required: TARGET" in codes[3][1]
    assert "argument --depth: give an integer >= 0" in codes[4][1]
    assert "scio_recorder.cli" in steps["cli"]
    assert (
        _heavy(steps["cli"], tuple(h for h in HEAVY if h != "scio_recorder.cli")) == []
    )
