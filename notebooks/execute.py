"""Execute a notebook (or a docs page's code), and keep the results in a cache.

One function executes (:func:`execute`): a fresh ``python3`` kernel through
nbclient, its working folder a new temporary folder (a notebook writes
nothing into the repository), the executed copy, outputs and pictures
included, written to a target path. A cell that raises stops it with
:class:`NotebookFailedError`, whose message names the notebook and carries
the cell's source and traceback; so does a cell that writes to stderr (a
warning a reader would see in red, :func:`stderr_of`).

:func:`executed` is what the docs build calls for each notebook: the cached
copy when one exists for the same notebook content *and* the same package
source (``scio_recorder/**/*.py``), else a new execution into the cache.
:func:`page_files` does the same for a docs page whose code writes files
the site shows (the views of ``docs/views.md``): its ```python blocks run
in a fresh interpreter, in a temporary folder, and the files they write are
kept. ``python notebooks/run.py --execute DIR`` uses :func:`execute` too.

The cache is outside the checkout: ``$SCIO_DOCS_CACHE``, else
``$XDG_CACHE_HOME/scio-recorder/docs`` (``~/.cache/scio-recorder/docs``).
Kernels and pages run torch on one thread (``OMP_NUM_THREADS=1``), so that
two can run side by side on two cores (``docs/hooks.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scio_recorder"


def cache_folder() -> Path:
    """Return the cache of executed notebooks and pages (outside the checkout)."""
    named = os.environ.get("SCIO_DOCS_CACHE")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "scio-recorder" / "docs"


CACHE = cache_folder() / "notebooks"
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


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
    from traitlets.config import Config  # noqa: PLC0415

    notebook = nbformat.read(source, as_version=4)
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="scio-notebook-") as folder,
        tempfile.TemporaryDirectory(prefix="scio-kernel-") as sockets,
    ):
        # the kernel over local sockets, in a folder of their own: over TCP,
        # ipykernel warns (on stderr, into the build log) that it is unencrypted
        config = Config()
        config.KernelManager.transport = "ipc"
        config.KernelManager.ip = str(Path(sockets, "kernel"))
        client = NotebookClient(
            notebook,
            config=config,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": folder}},
        )
        try:
            client.execute(env={**os.environ, **THREADS})
        except (CellExecutionError, CellTimeoutError) as error:
            msg = (
                f"{source.name} failed to execute (fix the notebook's source):\n{error}"
            )
            raise NotebookFailedError(msg) from error
    seconds = time.perf_counter() - start
    for index, text in stderr_of(notebook):
        msg = (
            f"{source.name}: code cell {index} writes to stderr, which the page "
            f"would show in red:\n{text.strip()}\nFix the cause (or the cell)."
        )
        raise NotebookFailedError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    nbformat.write(notebook, partial)
    partial.replace(target)
    return seconds


def stderr_of(notebook: object) -> list[tuple[int, str]]:
    """Return ``(code cell number, text)`` of each output on stderr, numbered from 1."""
    found = []
    cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]  # type: ignore[index]
    for number, cell in enumerate(cells, start=1):
        for output in cell.get("outputs", []):
            if output.get("name") == "stderr":
                text = output.get("text", "")
                found.append((number, text if isinstance(text, str) else "".join(text)))
    return found


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


BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_DRIVER = """
import re, sys
page = open(sys.argv[1], encoding="utf-8").read()
namespace = {"__name__": "__main__"}
for index, block in enumerate(re.findall(sys.argv[2], page, re.MULTILINE | re.DOTALL)):
    exec(compile(block, f"{sys.argv[1]} (python block {index})", "exec"), namespace)
"""


def page_files(
    page: Path,
    cache: Path | None = None,
    *,
    package: Path = PACKAGE,
    timeout: int = 600,
) -> tuple[Path, bool]:
    """Return a folder of the files the code of ``page`` writes, running it if needed.

    The page's ```python blocks run in order, in one namespace, in a fresh
    interpreter whose working folder is the result: ``cache/NAME-HASH/``
    (:func:`fingerprint` of the page and the package). Returns the folder
    and whether the code ran now.

    Raises
    ------
    NotebookFailedError
        If the code raised, or wrote to stderr.
    """
    cache = cache_folder() / "pages" if cache is None else cache
    key = fingerprint(page, package)
    target = cache / f"{page.stem}-{key}"
    if target.is_dir():
        return target, False
    partial = cache / f"{page.stem}-{key}.partial"
    if partial.exists():
        for path in sorted(partial.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    partial.mkdir(parents=True)
    done = subprocess.run(  # noqa: S603 (our own interpreter and page)
        [sys.executable, "-c", _DRIVER, str(page), BLOCK.pattern],
        cwd=partial,
        env={**os.environ, **THREADS, "PYTHONPATH": str(package.parent)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode or done.stderr.strip():
        problem = "failed" if done.returncode else "wrote to stderr"
        msg = f"{page.name}: its code {problem}:\n{done.stderr.strip()[-3000:]}"
        raise NotebookFailedError(msg)
    partial.replace(target)
    for old in cache.glob(f"{page.stem}-*"):
        if old != target and old.name.rsplit("-", 1)[0] == page.stem and old.is_dir():
            for path in sorted(old.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            old.rmdir()
    return target, True
