"""What every file the library writes shares: atomic writes, the version, dtypes.

Holds :func:`write_atomic` (write through a temporary file in the target's
folder, ``fsync`` it, :func:`os.replace` it onto the target, ``fsync`` the
folder), :func:`fsync_file` and :func:`fsync_folder`, :func:`library_version`
(``scio_recorder.__version__``, read when needed), the one map between
dtypes and the names written in files (:func:`dtype_name`,
:func:`parse_dtype`), and what checks a manifest before a run resumes from
it (:func:`manifest_digest`, written into the files a manifest names;
:func:`is_count`; :func:`differences`, the lines that say how a saved run's
arguments differ from this run's).

Why: records files (:mod:`scio_recorder.io`), detector states
(:mod:`scio_recorder.ood`), the checkpoints and spill files of
:mod:`scio_recorder.collect` and the activation sets of
:mod:`scio_recorder.activations` are all written this way; each had its own copy,
and the copies drifted (one did not ``fsync``, the CLI read the version from
the installed distribution where the files read the package).
"""

from __future__ import annotations

__all__ = [
    "DTYPES",
    "TEMPORARY_SUFFIX",
    "differences",
    "dtype_name",
    "fsync_file",
    "fsync_folder",
    "is_count",
    "is_file_name",
    "is_temporary",
    "library_version",
    "manifest_digest",
    "parse_dtype",
    "write_atomic",
]

import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

DIST_NAME = "scio-recorder"
"""The distribution's name (``pip install scio-recorder``)."""

TEMPORARY_SUFFIX = ".tmp"
"""How the temporary files of :func:`write_atomic` end; they start with a dot."""


# ------------------------------------------------------------------ versions


def library_version() -> str:
    """Return ``scio_recorder.__version__``, read when needed (no import cycle).

    Falls back to the installed distribution's version, then ``"unknown"``.

    Examples
    --------
    >>> import scio_recorder
    >>> library_version() == scio_recorder.__version__
    True

    """
    package = sys.modules.get("scio_recorder")
    version = getattr(package, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -------------------------------------------------------------------- dtypes


def _dtypes() -> dict[str, torch.dtype]:
    found = {
        str(value).removeprefix("torch."): value
        for value in vars(torch).values()
        if isinstance(value, torch.dtype)
    }
    return dict(sorted(found.items()))


DTYPES = MappingProxyType(_dtypes())
"""Every torch dtype by the name written in files (``"float32"``, ``"int64"``).

One name per dtype, the one ``str(dtype)`` shows without ``torch.``: aliases
(``"float"``, ``"half"``) are not names of the map.
"""


def dtype_name(dtype: torch.dtype) -> str:
    """Return the name that files hold for ``dtype``.

    Examples
    --------
    >>> import torch
    >>> dtype_name(torch.float32), dtype_name(torch.half)
    ('float32', 'float16')

    """
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    """Return the dtype a file names; raise naming the name if it is none.

    Examples
    --------
    >>> parse_dtype("bfloat16")
    torch.bfloat16
    >>> parse_dtype("float")
    Traceback (most recent call last):
    ...
    ValueError: unknown dtype 'float' (a file names dtypes as 'float32', 'int64', ...)

    """
    dtype = DTYPES.get(name)
    if dtype is None:
        msg = f"unknown dtype {name!r} (a file names dtypes as 'float32', 'int64', ...)"
        raise ValueError(msg)
    return dtype


# ---------------------------------------------------------------- the writes


def fsync_file(path: Path) -> None:
    """Flush ``path``'s data to the disk."""
    with path.open("rb") as file:
        os.fsync(file.fileno())


def fsync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries (a rename into it) to the disk.

    A no-op where folders cannot be opened (Windows).
    """
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows: a folder cannot be opened
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse it
            os.fsync(handle)
    finally:
        os.close(handle)


def is_temporary(path: Path, target: str) -> bool:
    """Say whether ``path`` is a temporary file of a write of ``target``."""
    return path.name.startswith(f".{target}.") and path.name.endswith(TEMPORARY_SUFFIX)


def write_atomic(
    path: Path, write: Callable[[Path], object], *, durable: bool = True
) -> None:
    """Write ``path`` whole or not at all.

    ``write(temporary)`` writes a temporary file in ``path``'s folder (named
    ``.<name>.<random>.tmp``); then, if ``durable``, the file is flushed to
    the disk; it replaces ``path`` (:func:`os.replace`, atomic on one file
    system); and, if ``durable``, the folder is flushed too, so that the
    rename survives a power loss. On any error the temporary file is removed
    and ``path`` is left as it was.

    Parameters
    ----------
    path : Path
        The file to write.
    write : callable
        Writes the content to the path it is given.
    durable : bool, default True
        ``fsync`` the file and the folder (slower, survives a power loss).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     target = Path(folder) / "a.txt"
    ...     write_atomic(target, lambda path: path.write_text("hello"))
    ...     target.read_text(), sorted(p.name for p in Path(folder).iterdir())
    ('hello', ['a.txt'])

    """
    handle, name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX
    )
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        if durable:
            fsync_file(temporary)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if durable:
        fsync_folder(path.parent)


# ----------------------------------------------------------------- manifests


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """Return a digest of a manifest's JSON content (the same after a round trip).

    Examples
    --------
    >>> manifest_digest({"a": 1, "b": [2]}) == manifest_digest({"b": [2], "a": 1})
    True

    """
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def is_count(value: object) -> TypeGuard[int]:
    """Return whether ``value`` is an int >= 0 (not a bool).

    Examples
    --------
    >>> is_count(0), is_count(-1), is_count(True), is_count(2.0)
    (True, False, False, False)

    """
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_file_name(value: object) -> TypeGuard[str]:
    """Return whether ``value`` names a file in a folder (no path, not ``.``/``..``).

    What a manifest names is joined to its folder and may be deleted: an
    edited name must not reach outside the folder, or be the folder itself.

    Examples
    --------
    >>> [is_file_name(v) for v in ["a.bin", "", ".", "..", "a/b", 3]]
    [True, False, False, False, False, False]

    """
    return (
        isinstance(value, str)
        and value not in ("", ".", "..")
        and "/" not in value
        and "\\" not in value
        and "\0" not in value
    )


def differences(saved: object, now: Mapping[str, Any]) -> list[str]:
    """Return one line per field where a saved fingerprint differs from ``now``.

    A field that is a dict on both sides gets one line per differing key.

    Examples
    --------
    >>> differences({"seed": 0, "layers": {"a": 1}}, {"seed": 1, "layers": {"a": 2}})
    ['- layers of a: saved 1, now 2', '- seed: saved 0, now 1']

    """
    if not isinstance(saved, dict):
        saved = {}
    lines: list[str] = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if old == new:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            lines.extend(
                f"- {key} of {sub}: saved {_plain(old.get(sub))}, "
                f"now {_plain(new.get(sub))}"
                for sub in sorted(set(old) | set(new))
                if old.get(sub) != new.get(sub)
            )
        else:
            lines.append(f"- {key}: saved {_plain(old)}, now {_plain(new)}")
    return lines


def _plain(value: object) -> str:
    return value if isinstance(value, str) else repr(value)
