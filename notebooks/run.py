"""Build the notebooks from their sources, and execute them.

``python notebooks/run.py`` rebuilds ``notebooks/NAME.ipynb`` from
``notebooks/src/NAME.md`` (and ``mahalanobis.ipynb`` from the recipe page),
stored without outputs; ``--check`` fails instead if one is out of date;
``--execute DIR`` runs every notebook in a fresh kernel (nbclient) and
writes the executed copies, outputs and pictures included, into ``DIR``,
printing each one's time. The docs build executes them itself (through the
same function, :func:`execute.execute`, with a cache: ``docs/hooks.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from execute import NotebookFailedError, execute
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
    for name in SOURCES:
        target = args.execute / f"{name}.ipynb"
        try:
            seconds = execute(HERE / f"{name}.ipynb", target, timeout=args.timeout)
        except NotebookFailedError as error:
            print(error)
            return 1
        print(f"executed {name}.ipynb in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
