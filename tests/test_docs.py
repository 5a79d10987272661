"""The Python examples of the README and the docs run as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/capture.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(document: str) -> list[str]:
    return BLOCK.findall((ROOT / document).read_text(encoding="utf-8"))


@pytest.mark.parametrize("document", DOCUMENTS)
def test_document_examples_run(document):
    """Every ```python block of the document runs, in order, in one namespace."""
    blocks = python_blocks(document)
    assert blocks, f"{document} has no Python example"
    namespace: dict[str, object] = {"__name__": f"docs_{Path(document).stem}"}
    for block in blocks:
        exec(compile(block, document, "exec"), namespace)  # noqa: S102 (our own docs)
