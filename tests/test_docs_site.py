"""The docs site's own code: Sphinx roles become links, a raw role fails the build."""

from __future__ import annotations

import importlib.util
import os
import re
import types
from pathlib import Path

import pytest

import scio_recorder

griffe = pytest.importorskip("griffe")

DOCS = Path(__file__).resolve().parent.parent / "docs"


def load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def roles():
    return load("griffe_roles")


@pytest.fixture(scope="module")
def package():
    return griffe.load("scio_recorder", search_paths=[str(DOCS.parent)])


def test_roles_become_links_to_the_canonical_path(roles, package):
    recorder = package["Recorder"].final_target
    text = (
        "See :meth:`record`, :class:`~scio_recorder.Layer` and "
        ":mod:`scio_recorder.select`."
    )
    out = roles.convert(text, recorder, package)
    assert ":meth:" not in out
    assert ":class:" not in out
    link = '<autoref identifier="scio_recorder.recorder.Recorder.record" optional>'
    assert link in out
    assert "<code>record()</code>" in out
    link = '<autoref identifier="scio_recorder.layers._table.Layer" optional>'
    assert link + "<code>Layer</code>" in out
    assert (
        '<autoref identifier="scio_recorder.select" optional>'
        "<code>scio_recorder.select</code>"
    ) in out


def test_names_outside_the_package_stay_code(roles, package):
    out = roles.convert(
        ":func:`torch.compile` and :class:`~torch.nn.Module`", package, package
    )
    assert out == "`torch.compile()` and `Module`"


def test_relative_names_resolve_through_the_enclosing_scopes(roles, package):
    forward = package["Recorder"].final_target["forward"]
    out = roles.convert(":attr:`activations`", forward, package)
    assert 'identifier="scio_recorder.recorder.Recorder.activations"' in out


def test_a_raw_role_left_in_a_page_fails_the_build():
    hooks = load("hooks")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_path="api/x.md"))
    assert hooks.on_post_page("<p><code>record()</code></p>", page, {}) is not None
    expected = r"api/x.md: raw Sphinx roles \[':func:<code>'\]"
    with pytest.raises(ValueError, match=expected):
        hooks.on_post_page("<p>:func:<code>record</code></p>", page, {})


def notebook_page(tmp_path: Path, *, execute: bool) -> str:
    """Render a two-cell notebook (one prints) as the docs build does."""
    nbformat = pytest.importorskip("nbformat")
    nbconvert2 = pytest.importorskip("mkdocs_jupyter.nbconvert2")
    v4 = pytest.importorskip("nbformat.v4")

    source = tmp_path / "small.ipynb"
    cells = [
        v4.new_markdown_cell("# Small"),
        v4.new_code_cell("x = 1 + 1\nprint(x)"),
        v4.new_code_cell("y = 3"),
    ]
    nbformat.write(v4.new_notebook(cells=cells), source)
    if execute:
        execute_module = load_notebooks_execute()
        target = tmp_path / "executed" / "small.ipynb"
        execute_module.execute(source, target, timeout=120)
        source = target
    return str(nbconvert2.nb2html(str(source)))


def load_notebooks_execute() -> types.ModuleType:
    return load("hooks")._execute_module()


@pytest.mark.slow
def test_the_hook_passes_an_executed_notebook_page_and_fails_an_unexecuted_one(
    tmp_path,
):
    hooks = load("hooks")
    page = types.SimpleNamespace(
        file=types.SimpleNamespace(src_path="notebooks/small.ipynb")
    )
    executed = notebook_page(tmp_path, execute=True)
    assert "jp-OutputArea-output" in executed
    assert hooks.on_post_page(executed, page, {}) == executed

    unexecuted = notebook_page(tmp_path, execute=False)
    with pytest.raises(
        ValueError, match=r"notebooks/small.ipynb: the notebook page shows no output"
    ):
        hooks.on_post_page(unexecuted, page, {})
    # outputs elsewhere on the page, but the printing cell shows none
    lost = executed.replace("jp-RenderedText jp-OutputArea-output", "jp-RenderedText")
    lost = '<div class="jp-OutputArea-output"></div>' + lost
    with pytest.raises(
        ValueError,
        match=r"notebooks/small.ipynb: code cell 1 \('x = 1 \+ 1'\) prints but shows",
    ):
        hooks.on_post_page(lost, page, {})
    # a markdown page is not checked for outputs
    other = types.SimpleNamespace(file=types.SimpleNamespace(src_path="start.md"))
    assert hooks.on_post_page("<p>text</p>", other, {}) == "<p>text</p>"


@pytest.mark.slow
def test_executed_notebooks_are_cached_by_notebook_and_package_source(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    v4 = pytest.importorskip("nbformat.v4")

    execute = load_notebooks_execute()
    package = tmp_path / "package"
    package.mkdir()
    (package / "code.py").write_text("A = 1\n")
    source = tmp_path / "small.ipynb"
    nbformat.write(v4.new_notebook(cells=[v4.new_code_cell("print(1)")]), source)
    cache = tmp_path / "cache"

    first, fresh = execute.executed(source, cache, package=package)
    assert fresh
    assert nbformat.read(first, as_version=4).cells[0].outputs[0].text == "1\n"
    again, fresh = execute.executed(source, cache, package=package)
    assert (again, fresh) == (first, False)  # reused, not executed

    (package / "code.py").write_text("A = 2\n")  # a code change re-executes
    changed, fresh = execute.executed(source, cache, package=package)
    assert fresh
    assert changed != first
    assert sorted(cache.iterdir()) == [changed]  # the stale copy is removed


@pytest.mark.slow
def test_a_failing_notebook_names_itself_and_the_cells_error(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    v4 = pytest.importorskip("nbformat.v4")

    execute = load_notebooks_execute()
    source = tmp_path / "broken.ipynb"
    cells = [
        v4.new_code_cell("x = 1"),
        v4.new_code_cell("raise KeyError('no-such-layer')"),
    ]
    nbformat.write(v4.new_notebook(cells=cells), source)
    with pytest.raises(
        execute.NotebookFailedError,
        match=r"(?s)broken.ipynb failed.*KeyError.*no-such-layer",
    ):
        execute.executed(source, tmp_path / "cache", package=tmp_path)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_formulas_become_mathml_and_one_latex2mathml_cannot_read_fails():
    """``$...$`` (arithmatex's spans and divs) is MathML in the page; no script."""
    pytest.importorskip("latex2mathml")
    hooks = load("hooks")
    page = (
        '<p>a <span class="arithmatex">\\(\\alpha &lt; \\beta_c\\)</span></p>'
        '<div class="arithmatex">\\[x^2\\]</div>'
    )
    out = hooks.mathml(page)
    assert "arithmatex" not in out
    assert out.count("<math ") == 2
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in out
    assert "&#x003B1;" in out  # alpha
    assert "&#x0003C;" in out  # the escaped "<" read as LaTeX's "<"
    with pytest.raises(ValueError, match=r"the formula 'x\^' is not LaTeX"):
        hooks.mathml('<span class="arithmatex">\\(x^\\)</span>')
    # latex2mathml prints a command it does not know as text: refused
    with pytest.raises(ValueError, match=r"uses \['\\\\lnorm'\], which latex2mathml"):
        hooks.mathml('<span class="arithmatex">\\(\\lnorm x\\)</span>')
    with pytest.raises(ValueError, match=r"uses \['&'\], which latex2mathml"):
        hooks.mathml(
            '<div class="arithmatex">\\[\\begin{aligned}a &= b\\end{aligned}\\]</div>'
        )
    table = r"\begin{array}{rl} a & = b \\ & = c \end{array}"
    assert "<mtable>" in hooks.mathml(f'<div class="arithmatex">\\[{table}\\]</div>')
    # hats and norm bars as plain characters, whatever fonts the reader has
    normed = hooks.mathml(
        '<span class="arithmatex">\\(\\hat R \\lVert f \\rVert\\)</span>'
    )
    assert '<mo stretchy="false">&#x002C6;</mo>' in normed
    assert normed.count('<mo stretchy="false">&#x02016;</mo>') == 2
    assert "&#x0005E;" not in normed
    # a display left out of its list item: arithmatex took its inner part
    with pytest.raises(ValueError, match=r"a '\$' stands beside a formula"):
        hooks.mathml('<p>$<span class="arithmatex">\\(M(f)\\)</span>$</p>')


# A formula written as code: a subscript (`d_k`, `g_yz`, `MD_0`), a power or a
# transpose (`^`), a norm (`||f||`), an indexed operator (`sum_l`, `min_c`),
# a function applied (`log(`, `softmax(`), a product (` * `), a shape (`N x C`).
ASCII_FORMULA = re.compile(
    r"\^|\|\||\b(?:sum|mean|min|max|argmax)_(?:[a-z]\b|\{)"
    r"|\b(?:log|exp|sqrt|sigmoid|softmax|logsumexp|floor)\(| \* |\b[A-Z] x [A-Z]\b"
    r"|(?<![A-Za-z_.])[A-Za-z]{1,2}_[A-Za-z0-9]{1,3}(?![A-Za-z0-9_(])"
)
# Rows of the OoD table whose score is said in words, with no formula.
PROSE_SCORES = {"ReAct", "ASH", "KNN", "RankFeat", "VRA", "DkNN", "JTLA"}


def cells(row: str) -> list[str]:
    """The cells of a Markdown table row; a ``|`` inside code or math stays."""
    out, cell, quote = [], "", None
    for char in row.strip().strip("|"):
        if char in "`$" and quote in (None, char):
            quote = None if quote else char
        if char == "|" and quote is None:
            out.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*out, cell.strip()]


def test_the_ood_tables_formulas_are_latex_not_code():
    """Each score of the detector table is ``$...$`` LaTeX; no formula as code."""
    text = (DOCS / "ood.md").read_text(encoding="utf-8")
    table = text.split("| detector | paper | score (higher: OoD) |", 1)[1]
    lines = table.splitlines()[2:]
    rows = lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    scores = {cells(row)[0].strip("`"): cells(row)[2] for row in rows}
    assert len(scores) > 30  # the whole table was read (test_package: every detector)
    assert set(scores) >= PROSE_SCORES
    for name, score in scores.items():
        assert score.count("$") % 2 == 0, f"{name}: an unclosed $ in {score!r}"
        if name not in PROSE_SCORES:
            assert "$" in score, f"{name}: its score has no $...$ formula: {score!r}"
        code = [
            span
            for span in re.findall(r"`([^`]+)`", score)
            if ASCII_FORMULA.search(span)
        ]
        assert not code, (
            f"{name}: formulas written as code, write them as $...$: {code}"
        )
    # the pattern finds what it is meant to find, and leaves arguments alone
    found = [
        s
        for s in ["sum_l sum_p", "f^(x)", "||f||_2", "g_yz", "N x C", "log(p)"]
        if ASCII_FORMULA.search(s)
    ]
    assert len(found) == 6
    assert not any(
        ASCII_FORMULA.search(s) for s in ["o_star=50", "use_max_logit", "k=10"]
    )


def test_docstring_tables_join_continuation_rows_and_faces_drop_their_private_map():
    """A ``| | more |`` row joins the row above; the private-module map is dropped."""
    roles = load("griffe_roles")
    text = "| family | names |\n|---|---|\n| a | x, |\n| | y |\n| b | z |"
    assert roles.joined_rows(text) == (
        "| family | names |\n|---|---|\n| a | x, y |\n| b | z |"
    )
    face = "Views.\n\nThis package is the public face; ``_base``,\n``_x``.\n\nMore."
    assert roles.public_only(face) == "Views.\n\nMore."
    assert roles.public_only("No map here.") == "No map here."


def test_charts_read_the_tables_the_pages_show():
    """``docs/charts.py`` finds each table it draws, with the numbers it reads."""
    charts = load("charts")
    rows = charts.auroc_rows()
    assert len(rows) == 42
    assert all(0 <= near[0] <= 1 and 0 <= far[0] <= 1 for _, near, far in rows)
    assert ("RMDS", (0.951, 0.020)) in [(name, near) for name, near, _ in rows]
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    overhead = charts.table(text, "| model | scenario | median µs |")
    assert {row[0] for row in overhead} == {"mlp", "cnn", "transformer"}
    assert all(charts.number(row[4]) > 0 for row in overhead)
    fits = charts.table(text, "| fit | 256 | 4,096 | 16,384 | growth |")
    assert [row[0] for row in fits][:2] == ["KNN", "NNGuide"]
    search = charts.table(text, "| bank rows | bank MiB | method | extra memory MiB |")
    assert {row[2] for row in search} == {"torch", "faiss", "naive"}


def test_the_header_shows_the_packages_version():
    hooks = load("hooks")
    config = hooks.on_config({"site_name": "scio-recorder"})
    assert config["site_name"] == f"scio-recorder {scio_recorder.__version__}"


# a line of a build log that warns: mkdocs' "WARNING -", a Python warning
# ("UserWarning: ..."), a kernel's or a tool's "[W ...]"/"warning:" line
WARNING_LINE = re.compile(r"\bWARNING\b|Warning:|\bwarning:", re.IGNORECASE)


def warning_lines(log: str) -> list[str]:
    """The lines of a build log that warn."""
    return [line for line in log.splitlines() if WARNING_LINE.search(line)]


def test_a_warning_line_is_found_in_a_build_log():
    log = (
        "INFO    -  Building documentation...\n"
        "WARNING -  Doc file 'a.md' contains a link 'b.md', not found.\n"
        "/x/y.py:3: UserWarning: something\n"
        "[IPKernelApp] WARNING | Kernel is running over TCP\n"
        "INFO    -  Documentation built in 3.00 seconds\n"
    )
    assert len(warning_lines(log)) == 3
    assert not warning_lines("INFO    -  Documentation built in 3.00 seconds\n")


def test_ci_keeps_the_site_builds_log_for_its_test():
    """.ci/run tees the one site build's output into the log the test reads."""
    run = (DOCS.parent / ".ci" / "run").read_text(encoding="utf-8")
    # the command (not a comment or a section's title), with its next line
    builds = re.findall(r"^[A-Z_0-9=]* ?mkdocs build [^\n]*\n[^\n]*", run, re.MULTILINE)
    assert len(builds) == 1, builds  # the site is built once
    assert 'tee "$workdir/site-build.log"' in builds[0], builds[0]
    assert 'export SCIO_DOCS_BUILD_LOG="$workdir/site-build.log"' in run


def test_the_docs_build_log_has_no_warning():
    """The build's log (``SCIO_DOCS_BUILD_LOG``, kept by .ci/run) warns nowhere.

    ``mkdocs build --strict`` fails on mkdocs' own warnings only; a notebook
    kernel's, a plugin's or a library's warning written to stderr passes it.
    """
    path = os.environ.get("SCIO_DOCS_BUILD_LOG")
    if not path:
        pytest.skip(
            "no docs build log: build with `mkdocs build --strict 2>&1 | tee LOG`"
            " and set SCIO_DOCS_BUILD_LOG=LOG (.ci/run does both)"
        )
    found = warning_lines(Path(path).read_text(encoding="utf-8", errors="replace"))
    assert not found, "warnings in the docs build log:\n" + "\n".join(found)


def test_no_page_carries_a_builders_path():
    """No built page shows where it was built (a notebook's output of a path).

    The site (``SCIO_DOCS_SITE``, built by .ci/run) may not contain a
    temporary folder's path (Python's ``tempfile`` names, ``mktemp``'s), nor
    the checkout's or the notebooks' cache's: an executed notebook that
    prints a path it wrote to must print it relative.
    """
    folder = os.environ.get("SCIO_DOCS_SITE")
    if not folder:
        pytest.skip("no built site: build it and set SCIO_DOCS_SITE=DIR (.ci/run does)")
    site = Path(folder).resolve()
    cache = os.environ.get("SCIO_DOCS_CACHE")
    places = [str(DOCS.parent.resolve())] + (
        [str(Path(cache).resolve())] if cache else []
    )
    # Python's tempfile names and mktemp's: patterns to find, not files to use
    temporary = re.compile(r"/tmp/tmp(?:[a-z0-9_]{8}|\.[A-Za-z0-9]{10})\b")  # noqa: S108
    leaks = {}
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8", errors="replace")
        found = sorted({*temporary.findall(text), *(p for p in places if p in text)})
        if found:
            leaks[str(page.relative_to(site))] = found
    assert not leaks, f"pages showing a path of the build: {leaks}"
