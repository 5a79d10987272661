"""Build the notebooks from their sources, and execute them.

``python notebooks/run.py`` rebuilds ``notebooks/NAME.ipynb`` from
``notebooks/src/NAME.md`` (and ``mahalanobis.ipynb`` from the recipe page),
stored without outputs; ``--check`` fails instead if one is out of date;
``--execute DIR`` runs every notebook in a fresh kernel (nbclient) and
writes the executed copies, outputs and pictures included, into ``DIR``
(the docs build shows those), printing each one's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from from_markdown import build

HERE = Path(__file__).resolve().parent
SOURCES = {
    **{path.stem: path for path in sorted((HERE / "src").glob("*.md"))},
    "mahalanobis": HERE.parent / "docs" / "recipes" / "mahalanobis.md",
}


def text_of(notebook: dict[str, object]) -> str:
    return json.dumps(notebook, indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if a notebook is stale"
    )
    parser.add_argument("--execute", type=Path, metavar="DIR", help="execute into DIR")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args()
    stale = []
    for name, source in SOURCES.items():
        path = HERE / f"{name}.ipynb"
        text = text_of(build(source))
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            if args.check:
                stale.append(path.name)
            else:
                path.write_text(text, encoding="utf-8")
                print(f"built {path.name}")
    if stale:
        print(f"stale notebooks: {stale}; run `python notebooks/run.py`")
        return 1
    if args.execute is None:
        return 0
    import nbformat  # noqa: PLC0415 (only to execute)
    from nbclient import NotebookClient  # noqa: PLC0415

    args.execute.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        notebook = nbformat.read(HERE / f"{name}.ipynb", as_version=4)
        start = time.perf_counter()
        NotebookClient(
            notebook,
            timeout=args.timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(args.execute)}},
        ).execute()
        nbformat.write(notebook, args.execute / f"{name}.ipynb")
        print(f"executed {name}.ipynb in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
