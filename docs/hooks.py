"""MkDocs hook: put the notebooks of ``notebooks/`` into the site.

The notebooks live at the top of the repository (tests execute them from
there); the site shows them under ``notebooks/``. When the environment
variable ``SCIO_EXECUTED_NOTEBOOKS`` names a folder (CI executes the
notebooks there first), those executed copies, with their outputs and
pictures, are used instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def on_files(files: Files, config: Any) -> Files:
    executed = os.environ.get("SCIO_EXECUTED_NOTEBOOKS")
    source = Path(executed) if executed else ROOT / "notebooks"
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = source / notebook.name
        if not path.is_file():
            path = notebook
        files.append(
            File.generated(
                config,
                f"notebooks/{notebook.name}",
                abs_src_path=str(path),
            )
        )
    return files
