"""The notebooks are built from their sources and stored without outputs.

Every docs build executes them (``docs/hooks.py``, cached in
``.cache/notebooks/``; a failing cell fails the build) and shows them
executed; ``tests/test_docs_site.py`` tests the execution and the check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
run = pytest.importorskip("run")  # notebooks/run.py


@pytest.mark.parametrize("name", sorted(run.SOURCES))
def test_notebook_is_its_source_without_outputs(name):
    path = NOTEBOOKS / f"{name}.ipynb"
    assert path.read_text(encoding="utf-8") == run.text_of(run.build(run.SOURCES[name]))
    notebook = json.loads(path.read_text(encoding="utf-8"))
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code
    assert all(
        cell["outputs"] == [] and cell["execution_count"] is None for cell in code
    )


def test_every_notebook_is_in_the_docs_navigation_or_offered_by_its_page():
    """A notebook is a page of the site, or a download linked from its docs page.

    A notebook built from a docs page (the Mahalanobis recipe) is not
    executed again by the build: the page shows the same code with outputs.
    """
    nav = (NOTEBOOKS.parent / "mkdocs.yml").read_text(encoding="utf-8")
    docs = NOTEBOOKS.parent / "docs"
    for name, source in run.SOURCES.items():
        if source.resolve().is_relative_to(docs.resolve()):
            page = source.read_text(encoding="utf-8")
            assert f"downloads/{name}.ipynb" in page, source
            assert f"notebooks/{name}.ipynb" not in nav
        else:
            assert f"notebooks/{name}.ipynb" in nav


@pytest.mark.parametrize("name", sorted(run.SOURCES))
def test_notebook_headings_hold_no_code(name):
    """The notebook pages' table of contents drops a heading's code span.

    Its link then names an anchor the page does not have ("Steering during
    `generate`" linked to ``#steering-during``): headings are plain words.
    """
    notebook = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))
    headings = [
        line
        for cell in notebook["cells"]
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).splitlines()
        if line.startswith("#")
    ]
    assert headings
    assert [line for line in headings if "`" in line] == []
