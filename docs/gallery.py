"""Make the gallery's execution graphs: ``python docs/gallery.py``.

Runs the Python blocks of ``docs/gallery.md`` in order, in one namespace,
as ``tests/test_docs.py`` does, so the pictures are made by exactly the code
the page shows; each block stores DOT text in ``pictures[name]``, and each is
rendered here with Graphviz's ``dot`` to ``docs/images/gallery/<name>.svg``.
Needs Graphviz's ``dot`` and ``transformers`` (for GPT-2). Each SVG must
stay under 300 KB (the docs are committed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
PAGE = DOCS / "gallery.md"
OUT = DOCS / "images" / "gallery"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
LIMIT = 300_000  # bytes per SVG


def main() -> int:
    program = shutil.which("dot")
    if program is None:
        print("Graphviz's `dot` is missing: apt-get install graphviz", file=sys.stderr)
        return 1
    namespace: dict[str, object] = {"__name__": "__main__"}
    for index, block in enumerate(BLOCK.findall(PAGE.read_text(encoding="utf-8"))):
        code = compile(block, f"{PAGE.name} (python block {index})", "exec")
        exec(code, namespace)  # noqa: S102 (our own page)
    pictures = namespace.get("pictures")
    if not isinstance(pictures, dict):
        print(f"{PAGE} must fill a dict `pictures` (name -> DOT text)")
        return 1
    OUT.mkdir(parents=True, exist_ok=True)
    linked = set(re.findall(r"images/gallery/([\w-]+)\.svg", PAGE.read_text("utf-8")))
    if linked != set(pictures):
        print(f"page links {sorted(linked)}, blocks make {sorted(pictures)}")
        return 1
    for name, dot in pictures.items():
        svg = subprocess.run(  # noqa: S603 (our DOT text, dot from PATH)
            [program, "-Tsvg"], input=dot, capture_output=True, text=True, check=True
        ).stdout
        path = OUT / f"{name}.svg"
        path.write_text(svg, encoding="utf-8")
        size = path.stat().st_size
        print(f"{path.relative_to(DOCS.parent)}: {size / 1000:.0f} KB")
        if size > LIMIT:
            print(f"{path} is over {LIMIT // 1000} KB: draw less (depth=)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
