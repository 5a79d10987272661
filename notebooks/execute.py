"""Execute a notebook, and keep executed copies in a cache.

One function executes (:func:`execute`): a fresh ``python3`` kernel through
nbclient, its working folder a new temporary folder (a notebook writes
nothing into the repository), the executed copy, outputs and pictures
included, written to a target path. A cell that raises stops it with
:class:`NotebookFailedError`, whose message names the notebook and carries
the cell's source and traceback.

:func:`executed` is what the docs build calls for each notebook: the cached
copy when one exists for the same notebook content *and* the same package
source (``scio_recorder/**/*.py``), else a new execution into the cache.
``python notebooks/run.py --execute DIR`` uses :func:`execute` too.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "notebooks"
PACKAGE = ROOT / "scio_recorder"


class NotebookFailedError(RuntimeError):
    """A cell of a notebook raised while it was executed."""


def execute(source: Path, target: Path, *, timeout: int = 600) -> float:
    """Execute the notebook ``source`` in a fresh kernel; write it to ``target``.

    Returns the seconds it took. The kernel's working folder is a new
    temporary folder, removed afterwards. ``target`` is written only when
    every cell ran (through a temporary file, so a half-written copy is never
    left there).

    Raises
    ------
    NotebookFailedError
        If a cell raised (or ran past ``timeout`` seconds): the message names
        ``source`` and holds nbclient's report (the cell and its traceback).
    """
    import nbformat  # noqa: PLC0415 (only to execute)
    from nbclient import NotebookClient  # noqa: PLC0415
    from nbclient.exceptions import CellExecutionError, CellTimeoutError  # noqa: PLC0415

    notebook = nbformat.read(source, as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scio-notebook-") as folder:
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": folder}},
        )
        try:
            client.execute()
        except (CellExecutionError, CellTimeoutError) as error:
            msg = (
                f"{source.name} failed to execute (fix the notebook's source):\n{error}"
            )
            raise NotebookFailedError(msg) from error
    seconds = time.perf_counter() - start
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    nbformat.write(notebook, partial)
    partial.replace(target)
    return seconds


def fingerprint(source: Path, package: Path = PACKAGE) -> str:
    """Return the hash of ``source``'s content and of every ``package/**/*.py``.

    A change to the notebook or to any source file of the package changes
    it (file paths are hashed with their contents, so a rename counts too).
    """
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for path in sorted(package.rglob("*.py")):
        digest.update(b"\0" + path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def executed(
    source: Path, cache: Path = CACHE, *, package: Path = PACKAGE, timeout: int = 600
) -> tuple[Path, bool]:
    """Return the executed copy of ``source`` from ``cache``, executing it if needed.

    The copy is ``cache/NAME-HASH.ipynb`` with the hash of
    :func:`fingerprint`; older copies of the same notebook are removed.
    Returns the path and whether it was executed now (``False``: reused).
    """
    key = fingerprint(source, package)
    target = cache / f"{source.stem}-{key}.ipynb"
    if target.is_file():
        return target, False
    execute(source, target, timeout=timeout)
    for old in cache.glob(f"{source.stem}-*.ipynb"):
        if old != target and old.stem.rsplit("-", 1)[0] == source.stem:
            old.unlink(missing_ok=True)
    return target, True
