"""MkDocs hook: put the notebooks of ``notebooks/`` into the site, executed.

The notebooks live at the top of the repository, stored without outputs; the
site shows them under ``notebooks/``. Before the files are collected, every
build (``mkdocs build`` and each rebuild of ``mkdocs serve``) executes each
notebook in a fresh kernel, its working folder a temporary folder
(``notebooks/execute.py``, the function ``python notebooks/run.py --execute``
uses too), and copies the executed notebook into ``docs/notebooks/``
(ignored by git), where mkdocs-jupyter renders it. Executed copies are cached
in ``.cache/notebooks/`` (ignored by git) under a hash of the notebook *and*
of the package's source files (``scio_recorder/**/*.py``): a rebuild with
neither changed reuses them in milliseconds, a code change re-executes. A
notebook whose cell raises fails the build with that cell's error.

After each page is rendered:

* a Sphinx role left as text (``:func:`` before some code: a docstring role
  that ``docs/griffe_roles.py`` did not convert) fails the build, naming the
  page;
* a notebook page without outputs, or with a code cell that prints but shows
  no output, fails the build (:func:`check_notebook_page`).
"""

from __future__ import annotations

import html
import importlib.util
import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("mkdocs.hooks.notebooks")


def _execute_module() -> Any:
    """Import ``notebooks/execute.py`` (not a package: loaded by path)."""
    name = "scio_notebooks_execute"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "notebooks" / "execute.py"
    )
    assert spec is not None  # noqa: S101 (the file is part of the repository)
    assert spec.loader is not None  # noqa: S101
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def on_config(config: Any) -> Any:
    """Execute the notebooks (or reuse the cached copies) into ``docs/notebooks``."""
    execute = _execute_module()
    target = Path(config["docs_dir"]) / "notebooks"
    target.mkdir(exist_ok=True)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        log.info("notebook %s: executing (or reusing the cache)", notebook.name)
        path, fresh = execute.executed(notebook)
        log.info(
            "notebook %s: %s %s",
            notebook.name,
            "executed into" if fresh else "reused",
            path.relative_to(ROOT),
        )
        shutil.copyfile(path, target / notebook.name)
    return config


RAW_ROLE = re.compile(
    r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj):(?:<code>|`)"
)

_CELL = re.compile(r'<div\s[^>]*class="[^"]*\bjp-CodeCell\b[^"]*"[^>]*\sid="cell-id=')
_SOURCE = re.compile(r'<div class="clipboard-copy-txt"[^>]*>(.*?)</div>', re.DOTALL)
_UNRUN = re.compile(r'jp-InputArea-prompt">In\s*\[\s*\]:')
_OUTPUT = re.compile(r'class="[^"]*\bjp-OutputArea-output\b')
_TAG = re.compile(r"<[^>]+>")


def check_notebook_page(output: str, name: str) -> None:
    """Fail if the rendered notebook page ``output`` was not executed.

    Each code cell (``jp-CodeCell``) must have run (no ``In [ ]:`` prompt);
    one whose source calls ``print(`` or ``display(`` must show an output
    area (``jp-OutputArea-output``); and the page must show at least one.

    Raises
    ------
    ValueError
        Naming the page and the first cell at fault: the notebook was not
        executed, or its outputs were lost (see this module's docstring).
    """
    starts = [match.start() for match in _CELL.finditer(output)]
    if starts and not _OUTPUT.search(output):
        msg = (
            f"{name}: the notebook page shows no output in its {len(starts)} code "
            "cells: it was rendered unexecuted (docs/hooks.py's on_config "
            "executes every notebook; was it bypassed?)"
        )
        raise ValueError(msg)
    for number, (start, end) in enumerate(
        zip(starts, [*starts[1:], len(output)], strict=True), start=1
    ):
        cell = output[start:end]
        found = _SOURCE.search(cell)
        source = html.unescape(_TAG.sub("", found.group(1))) if found else ""
        first = source.strip().splitlines()[0] if source.strip() else ""
        if _UNRUN.search(cell):
            problem = "was not run (its prompt is `In [ ]:`)"
        elif re.search(r"\b(?:print|display)\(", source) and not _OUTPUT.search(cell):
            problem = "prints but shows no output"
        else:
            continue
        msg = (
            f"{name}: code cell {number} ({first!r}) {problem}: the notebook was "
            "rendered unexecuted or its outputs were lost"
        )
        raise ValueError(msg)


def on_post_page(output: str, page: Any, config: Any) -> str:  # noqa: ARG001 (mkdocs' signature)
    """Check a rendered page: no raw Sphinx role; a notebook shows outputs."""
    found = sorted(set(RAW_ROLE.findall(output)))
    if found:
        msg = (
            f"{page.file.src_path}: raw Sphinx roles {found} in the rendered page; "
            "write the reference so that docs/griffe_roles.py converts it "
            "(`:func:`name``, `:class:`~package.Name``)."
        )
        raise ValueError(msg)
    if page.file.src_path.endswith(".ipynb"):
        check_notebook_page(output, page.file.src_path)
    return output
