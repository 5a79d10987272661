"""The ``docs`` extra brings everything ``mkdocs build`` needs.

``pip install -e ".[docs]"`` then ``mkdocs build`` once failed: the build
executes the notebooks (``docs/hooks.py``), and they import transformers,
draw with matplotlib and display execution graphs (the graphviz package),
none of which the extra brought. Here every import of the notebooks' code
cells and of the build's own scripts is read (``ast``), and each package it
needs must come with the project or with the ``docs`` extra (directly or as
a dependency of what the extra lists, read from the installed metadata).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

requirements = pytest.importorskip("packaging.requirements")
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
# what `mkdocs build` runs besides the pages: the hooks and what they load
BUILD_SCRIPTS = ("docs/hooks.py", "docs/griffe_roles.py", "notebooks/execute.py")
LOCAL = {"scio_recorder", "execute", "from_markdown"}  # this repository's code


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _missing_docs_extra() -> list[str]:
    """Return the ``docs`` extra's distributions not installed here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    missing = []
    for spec in project["project"]["optional-dependencies"]["docs"]:
        name = requirements.Requirement(spec).name
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


# The closure of the extra is read from the installed metadata: with the
# README's `pip install -e ".[dev]"` alone, there is nothing to read.
if _missing := _missing_docs_extra():
    pytest.skip(
        f"the docs extra is not installed ({', '.join(_missing)} missing): "
        'pip install -e ".[docs]" to run these tests',
        allow_module_level=True,
    )


def extras() -> tuple[list[str], dict[str, list[str]]]:
    """Return the project's dependencies and its extras, as written."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return project["project"]["dependencies"], project["project"][
        "optional-dependencies"
    ]


def closure(specs: list[str]) -> set[str]:
    """Return the names of ``specs`` and of all they require (installed metadata).

    A requirement's extras count (``mkdocstrings[python]`` brings
    ``mkdocstrings-python``).
    """
    seen: set[tuple[str, str]] = set()
    todo = [requirements.Requirement(spec) for spec in specs]
    while todo:
        requirement = todo.pop()
        name = normalise(requirement.name)
        for extra in {"", *requirement.extras}:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            try:
                required = importlib.metadata.requires(name) or []
            except importlib.metadata.PackageNotFoundError:
                continue
            for spec in required:
                child = requirements.Requirement(spec)
                if child.marker is None or child.marker.evaluate({"extra": extra}):
                    todo.append(child)
    return {name for name, _ in seen}


def imported_modules(source: str) -> set[str]:
    """Return the top-level modules ``source`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


@functools.cache
def notebook_code() -> dict[str, str]:
    """Return each notebook's code cells as Python (IPython magics replaced)."""
    code = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        lines = [
            line
            for cell in cells
            if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines()
        ]
        code[path.name] = "\n".join(
            # `%matplotlib inline` needs matplotlib; other magics, nothing
            ("import matplotlib" if line.startswith("%matplotlib") else "pass")
            if line.startswith(("%", "!"))
            else line
            for line in lines
        )
    return code


@functools.cache
def needed_by_the_build() -> dict[str, tuple[set[str], set[str]]]:
    """Return each module the site build imports -> (its distributions, where)."""
    sources = dict(notebook_code())
    for script in BUILD_SCRIPTS:
        sources[script] = (ROOT / script).read_text(encoding="utf-8")
    owners = importlib.metadata.packages_distributions()
    needed: dict[str, tuple[set[str], set[str]]] = {}
    for where, source in sources.items():
        for module in imported_modules(source) - LOCAL:
            if module in sys.stdlib_module_names:
                continue
            assert module in owners, f"{where} imports {module}, not installed here"
            dists = {normalise(dist) for dist in owners[module]}
            needed.setdefault(module, (dists, set()))[1].add(where)
    return needed


def needed_extras() -> dict[str, set[str]]:
    """Return the extras the notebooks' pictures need -> the notebooks."""
    uses = {
        # `from scio_recorder import plot` or `scio_recorder.plot`: matplotlib
        "plot": re.compile(r"\bimport plot\b|\bscio_recorder\.plot\b|\bplot\."),
        # a graph shown in a notebook renders to SVG: the graphviz package
        "graph": re.compile(r"\.graph\("),
    }
    found: dict[str, set[str]] = {}
    for name, code in notebook_code().items():
        for extra, pattern in uses.items():
            if pattern.search(code):
                found.setdefault(extra, set()).add(name)
    return found


def test_the_notebooks_draw_pictures_and_graphs_and_use_transformers():
    """The reading of the notebooks finds what made the build fail."""
    assert set(needed_extras()) == {"plot", "graph"}
    assert "transformers" in needed_by_the_build()
    assert "nbclient" in needed_by_the_build()  # notebooks/execute.py
    assert "griffe" in needed_by_the_build()  # docs/griffe_roles.py


def test_the_docs_extra_brings_what_the_site_build_imports():
    """Every package the notebooks and the build scripts need, from the extra."""
    base, optional = extras()
    provided = closure([*base, *optional["docs"]])
    missing: dict[str, set[str]] = {}
    for module, (dists, where) in needed_by_the_build().items():
        if not dists & provided:
            missing.setdefault(module, set()).update(where)
    for extra, where in needed_extras().items():
        listed = {normalise(requirements.Requirement(s).name) for s in optional[extra]}
        for name in listed - provided:
            missing.setdefault(name, set()).update(where)
    assert missing == {}, (
        f"the `docs` extra of pyproject.toml lacks {sorted(missing)}, which "
        f"the site build needs: { ({k: sorted(v) for k, v in missing.items()}) }"
    )


@pytest.mark.slow
def test_a_notebook_runs_without_a_warning_in_the_build_log(tmp_path, capfd):
    """The kernel speaks over local sockets: no "Kernel is running over TCP" line.

    Each executed notebook's kernel wrote that warning to the build log (seven
    of them in one build); ``notebooks/execute.py`` starts it with the IPC
    transport, its sockets in the notebook's temporary working folder.
    """
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        execute = importlib.import_module("execute")
    finally:
        sys.path.remove(str(ROOT / "notebooks"))
    cell = nbformat.v4.new_code_cell("import os\nprint(os.listdir('.'))")
    source = tmp_path / "one.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), source)
    execute.execute(source, tmp_path / "out.ipynb", timeout=120)
    log = capfd.readouterr()
    assert "WARNING" not in log.err + log.out
    shown = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs
    assert shown[0]["text"].strip() == "[]"  # its sockets gone, nothing left there
    assert not list(Path.cwd().glob("kernel*-ipc-*"))
