"""MkDocs hook: put the notebooks of ``notebooks/`` into the site.

The notebooks live at the top of the repository (CI executes them from
there); the site shows them under ``notebooks/``. Before the files are
collected, they are copied into ``docs/notebooks/`` (ignored by git), where
mkdocs-jupyter renders them. When the environment variable
``SCIO_EXECUTED_NOTEBOOKS`` names a folder (CI executes the notebooks there
first), those executed copies, with their outputs and pictures, are used.
"""

from __future__ import annotations

import os
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
