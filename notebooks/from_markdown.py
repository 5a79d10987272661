"""Rebuild a notebook from a docs page.

Usage: ``python notebooks/from_markdown.py PAGE NOTEBOOK``.

Markdown between code blocks becomes markdown cells; each ```python block a
code cell, without the ``# ...`` lines that show what a ``print`` printed
(the notebook prints them). Cells are stored without outputs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BLOCK = re.compile(r"^```python\n(.*?)^```\n?", re.MULTILINE | re.DOTALL)


def lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def code_cell(block: str) -> dict[str, object]:
    kept: list[str] = []
    for line in block.strip("\n").splitlines():
        if line.startswith("# ") and kept and "print(" in kept[-1]:
            continue
        kept.append(line)
    code = "\n".join(kept)
    return {
        "cell_type": "code",
        "id": "",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": lines(code),
    }


def build(page: Path) -> dict[str, object]:
    parts = BLOCK.split(page.read_text(encoding="utf-8"))
    cells: list[dict[str, object]] = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if part.strip("\n"):
                cells.append(
                    {
                        "cell_type": "markdown",
                        "metadata": {},
                        "source": lines(part.strip("\n")),
                    }
                )
        else:
            cells.append(code_cell(part))
    for index, cell in enumerate(cells):
        cell["id"] = f"cell-{index}"
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            },
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def main() -> int:
    page, notebook = (Path(a) for a in sys.argv[1:3])
    notebook.write_text(json.dumps(build(page), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
