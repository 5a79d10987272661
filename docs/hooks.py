"""MkDocs hook: put the executed notebooks and the views' pages into the site.

The notebooks live at the top of the repository (``notebooks/``), stored
without outputs; the site shows them under ``notebooks/``, executed. Before
the pages are read (``on_files``), every build (``mkdocs build`` and each
rebuild of ``mkdocs serve``) executes each notebook in a fresh kernel, its
working folder a temporary folder (``notebooks/execute.py``, the function
``python notebooks/run.py --execute DIR`` uses too), and runs the code of
``docs/views.md``, whose views (HTML pages and pictures) the site serves
under ``view-pages/``. Two run at a time (``SCIO_DOCS_JOBS``, default 2),
each with torch on one thread. The results are cached outside the checkout
(``notebooks/execute.py``'s ``cache_folder``: ``~/.cache/scio-recorder/docs``)
under a hash of the notebook or page *and* of the package's source files
(``scio_recorder/**/*.py``): a rebuild with neither changed reuses them, a
code change re-executes. Nothing is written into the checkout. A notebook
whose cell raises or writes to stderr (a warning a reader would see in red)
fails the build, naming the cell.

A notebook built from a docs page (``mahalanobis.ipynb``, from the recipe)
is not executed again: the page shows the same code with its outputs (and
``tests/test_docs.py`` runs it); the notebook is offered for download under
``downloads/``.

The header shows the version: ``on_config`` appends the package's
``__version__`` (read from ``scio_recorder/__init__.py``, not imported) to
the site's name.

Formulas: ``$...$`` and ``$$...$$`` in a page (``pymdownx.arithmatex``,
generic mode) become MathML when the page's HTML is made
(:func:`mathml`, with ``latex2mathml``), which browsers draw natively: no
script, no font, nothing fetched, the same offline.

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
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "docs" / "views.md"
log = logging.getLogger("mkdocs.hooks.notebooks")


def _module(name: str, path: Path) -> Any:
    """Import a module of the repository that is not in a package, by path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None  # noqa: S101 (the file is part of the repository)
    assert spec.loader is not None  # noqa: S101
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _execute_module() -> Any:
    """Import ``notebooks/execute.py``."""
    return _module("scio_notebooks_execute", ROOT / "notebooks" / "execute.py")


def _sources() -> dict[str, Path]:
    """Each notebook's source (``notebooks/run.py``'s ``SOURCES``)."""
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        return dict(
            _module("scio_notebooks_run", ROOT / "notebooks" / "run.py").SOURCES
        )
    finally:
        sys.path.remove(str(ROOT / "notebooks"))


def version() -> str:
    """Return ``scio_recorder.__version__``, read from the source."""
    source = (ROOT / "scio_recorder" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', source, re.MULTILINE)
    if found is None:  # pragma: no cover (the package always has one)
        msg = "no __version__ in scio_recorder/__init__.py"
        raise ValueError(msg)
    return found[1]


def on_config(config: Any) -> Any:
    """Show the version beside the site's name (``scio-recorder 0.1.0``)."""
    config["site_name"] = f"{config['site_name']} {version()}"
    return config


@event_priority(50)  # before mkdocs-jupyter's, which renders the notebooks it finds
def on_files(files: Any, config: Any) -> Any:
    """Execute the notebooks and the views' page (or reuse the cache); add them."""
    execute = _execute_module()
    docs = (ROOT / "docs").resolve()
    notebooks, downloads = [], []
    for name, source in _sources().items():
        path = ROOT / "notebooks" / f"{name}.ipynb"
        in_docs = source.resolve().is_relative_to(docs)
        (downloads if in_docs else notebooks).append(path)
    jobs = {f"notebook {p.name}": (execute.executed, p) for p in notebooks}
    jobs[f"page {GALLERY.name}"] = (execute.page_files, GALLERY)
    workers = int(os.environ.get("SCIO_DOCS_JOBS", "2"))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {what: pool.submit(job, path) for what, (job, path) in jobs.items()}
        done = {what: future.result() for what, future in futures.items()}
    for what, (_, fresh) in done.items():
        log.info("%s: %s", what, "executed" if fresh else "reused from the cache")
    site = execute.cache_folder() / "site"
    (site / "notebooks").mkdir(parents=True, exist_ok=True)
    for notebook in notebooks:
        path, _ = done[f"notebook {notebook.name}"]
        shutil.copyfile(path, site / "notebooks" / notebook.name)
        files.append(
            File(
                f"notebooks/{notebook.name}",
                str(site),
                config["site_dir"],
                config["use_directory_urls"],
            )
        )
    folder, _ = done[f"page {GALLERY.name}"]
    for made in sorted(folder.iterdir()):
        files.append(
            File.generated(config, f"view-pages/{made.name}", abs_src_path=str(made))
        )
    for notebook in downloads:
        files.append(
            File.generated(
                config, f"downloads/{notebook.name}", content=notebook.read_bytes()
            )
        )
    return files


_MATH = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*'
    r"\\[(\[](?P<tex>.*?)\\[)\]]\s*</(?P=tag)>",
    re.DOTALL,
)


_UNKNOWN = re.compile(r">(\\[A-Za-z]+|&)<")  # a command, or an "&" outside a table

# Glyphs a browser draws by a math font's stretchy variants: without one (a
# Linux desktop with DejaVu alone) \hat's "^" became a tall open triangle and
# the norm bars shrank below the line. Drawn as plain characters instead.
_FONT_SAFE = (
    ("<mo>&#x0005E;</mo>", '<mo stretchy="false">&#x002C6;</mo>'),  # \hat
    ("<mo>&#x02016;</mo>", '<mo stretchy="false">&#x02016;</mo>'),  # \lVert \rVert
)

# A "$" beside a formula's MathML: arithmatex took the inner part of a
# display (a "$$" block whose indentation left it out of its list item).
_STRAY_DOLLAR = re.compile(r"\$\s*<math |</math>\s*\$")


def mathml(output: str) -> str:
    """Return ``output`` with each arithmatex formula replaced by MathML.

    Hats and norm bars are drawn as plain characters (``stretchy="false"``),
    the same with or without a math font.

    Raises
    ------
    ValueError
        Naming a formula that ``latex2mathml`` cannot read, or one using a
        command it does not know, or an ``&`` outside an environment it reads
        (``array`` and ``matrix``, not ``aligned``): it would print them as
        text. Or a ``$`` left beside a formula.
    """
    from latex2mathml.converter import convert  # noqa: PLC0415 (the docs extra)

    def replace(match: re.Match[str]) -> str:
        tex = html.unescape(match["tex"])
        display = "block" if match["tag"] == "div" else "inline"
        try:
            made = convert(tex, display=display)
        except Exception as error:  # latex2mathml raises several kinds
            msg = f"the formula {tex!r} is not LaTeX that latex2mathml reads: {error}"
            raise ValueError(msg) from error
        unknown = _UNKNOWN.findall(made)
        if unknown:  # latex2mathml prints what it does not know as text
            msg = (
                f"the formula {tex!r} uses {sorted(set(unknown))}, which "
                "latex2mathml does not know (it would show as text)"
            )
            raise ValueError(msg)
        for plain, safe in _FONT_SAFE:
            made = made.replace(plain, safe)
        return made

    out = _MATH.sub(replace, output)
    stray = _STRAY_DOLLAR.search(out)
    if stray is not None:
        around = re.sub(
            r"<[^>]+>", "", out[max(0, stray.start() - 80) : stray.end() + 200]
        )
        msg = (
            f"a '$' stands beside a formula, near {around[:120]!r}: a display "
            "($$...$$) inside a list item must be indented as the item's text "
            "(4 spaces)"
        )
        raise ValueError(msg)
    return out


def on_page_content(content: str, **_: Any) -> str:
    """Turn the page's formulas into MathML."""
    return mathml(content)


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
            "cells: it was rendered unexecuted (docs/hooks.py's on_files "
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
