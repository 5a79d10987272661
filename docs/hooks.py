"""MkDocs hook: put the notebooks of ``notebooks/`` into the site.

The notebooks live at the top of the repository (CI executes them from
there); the site shows them under ``notebooks/``. Before the files are
collected, they are copied into ``docs/notebooks/`` (ignored by git), where
mkdocs-jupyter renders them. When the environment variable
``SCIO_EXECUTED_NOTEBOOKS`` names a folder (CI executes the notebooks there
first), those executed copies, with their outputs and pictures, are used.

After each page is rendered, a Sphinx role left as text (``:func:`` before
some code: a docstring role that ``docs/griffe_roles.py`` did not convert)
fails the build, naming the page.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def on_config(config: Any) -> Any:
    executed = os.environ.get("SCIO_EXECUTED_NOTEBOOKS")
    source = Path(executed) if executed else ROOT / "notebooks"
    target = Path(config["docs_dir"]) / "notebooks"
    target.mkdir(exist_ok=True)
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = source / notebook.name
        shutil.copyfile(path if path.is_file() else notebook, target / notebook.name)
    return config


RAW_ROLE = re.compile(
    r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj):(?:<code>|`)"
)


def on_post_page(output: str, page: Any, config: Any) -> str:  # noqa: ARG001 (mkdocs' signature)
    found = sorted(set(RAW_ROLE.findall(output)))
    if found:
        msg = (
            f"{page.file.src_path}: raw Sphinx roles {found} in the rendered page; "
            "write the reference so that docs/griffe_roles.py converts it "
            "(`:func:`name``, `:class:`~package.Name``)."
        )
        raise ValueError(msg)
    return output
