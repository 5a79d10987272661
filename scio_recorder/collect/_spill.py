"""Concatenated rows kept in RAM, spilled to raw files, memory mapped back.

Holds :class:`ConcatStore`, the rows of one ``"concat"`` label (CPU chunks,
appended to one raw file when the memory budget is exceeded or a checkpoint
is written), :class:`SpillFolder`, where those files go (``spill_dir`` or a
temporary folder), :class:`SpillLock`, the lock file that keeps a second run
out of a ``spill_dir`` in use, and the helpers that write tensor bytes and
map files back as tensors (privately, copy-on-write).

Why: features of a whole data set may not fit in RAM; raw files appended in
place and mapped back give one tensor without ever holding every row, and
the committed length of each file is what checkpoints record and resume from.
Two runs sharing a folder would truncate and append each other's rows and
overwrite each other's checkpoints, silently: the lock refuses the second.
"""

from __future__ import annotations

__all__ = [
    "LOCK",
    "ConcatStore",
    "SpillFolder",
    "SpillLock",
    "bytes_of",
    "describe_owner",
    "map_file",
    "pid_alive",
]

import contextlib
import datetime as dt
import json
import logging
import math
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._files import dtype_name, parse_dtype
from scio_recorder.layers import label_str

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx

logger = logging.getLogger("scio_recorder.collect")

LOCK = "collect.lock"
"""The lock file of a ``spill_dir`` in use (JSON: pid, host, start time)."""

# The locks this process holds (path -> token), to tell a lock of another
# thread of this process (live) from one left by an earlier process that had
# the same pid (stale).
_HELD: dict[str, str] = {}
_HELD_LOCK = threading.Lock()


def bytes_of(chunk: Tensor) -> Any:
    """Return a buffer over the bytes of a contiguous CPU tensor (no copy)."""
    return chunk.reshape(-1).view(torch.uint8).numpy()


def map_file(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    """Return a tensor backed by a private (copy-on-write) mapping of ``path``."""
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.from_file(str(path), shared=False, size=numel, dtype=dtype).view(shape)


class SpillFolder:
    """Where concatenations spill: ``spill_dir``, or a temporary folder."""

    def __init__(self, path: Path | None) -> None:
        self.persistent = path is not None
        self._path = path
        self._temporary: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._temporary = Path(tempfile.mkdtemp(prefix="scio-collect-"))
            self._path = self._temporary
        return self._path

    def new_file(self, name: str) -> Path:
        """Create ``name`` empty, unlinking any old file (mappings survive)."""
        path = self.path / name
        path.unlink(missing_ok=True)
        path.touch()
        return path

    def cleanup(self) -> None:
        """Remove a temporary folder (mapped results stay valid on POSIX)."""
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)


class ConcatStore:
    """The rows of one label: chunks in RAM, then appended to one raw file."""

    def __init__(self, label: DepthIdx, folder: SpillFolder) -> None:
        self.label = label
        self.folder = folder
        self.chunks: list[Tensor] = []
        self.mem_rows = 0
        self.mem_bytes = 0
        self.disk_rows = 0
        self.disk_bytes = 0
        self.dtype: torch.dtype | None = None
        self.shape: tuple[int, ...] | None = None
        self.file: Path | None = None

    @property
    def rows(self) -> int:
        return self.disk_rows + self.mem_rows

    @property
    def file_name(self) -> str:
        return f"concat-{label_str(self.label)}.bin"

    def update(self, value: object) -> None:
        if not isinstance(value, Tensor) or value.dim() < 1:
            kind = type(value).__name__ if not isinstance(value, Tensor) else "0-d"
            msg = (
                f"'concat' of layer {label_str(self.label)} needs tensor records "
                f"with a batch dim 0, got a {kind} record. Record a layer that "
                "outputs a tensor, or pass a reducer that handles this output."
            )
            raise TypeError(msg)
        shape = tuple(value.shape[1:])
        if self.shape is None or self.dtype is None:
            self.shape, self.dtype = shape, value.dtype
        elif shape != self.shape or value.dtype != self.dtype:
            msg = (
                f"'concat' of layer {label_str(self.label)}: every record must "
                f"have the same per-sample shape and dtype; got {list(shape)} "
                f"{value.dtype} after {list(self.shape)} {self.dtype}"
            )
            raise ValueError(msg)
        chunk = value.detach().to(
            "cpu", memory_format=torch.contiguous_format, copy=True
        )
        self.chunks.append(chunk)
        self.mem_rows += chunk.shape[0]
        self.mem_bytes += chunk.numel() * chunk.element_size()

    def spill(self, *, durable: bool = False) -> None:
        """Append the rows held in RAM to the file, then free them."""
        if self.file is None:
            self.file = self.folder.new_file(self.file_name)
        if not self.chunks:
            return
        with self.file.open("r+b") as file:
            # Anything past the committed length is from an interrupted write.
            file.seek(self.disk_bytes)
            file.truncate()
            for chunk in self.chunks:
                file.write(bytes_of(chunk))
            file.flush()
            if durable:
                os.fsync(file.fileno())
        # one assignment, so that an interrupt cannot count rows twice
        self.disk_rows, self.disk_bytes, self.chunks, self.mem_rows, self.mem_bytes = (
            self.disk_rows + self.mem_rows,
            self.disk_bytes + self.mem_bytes,
            [],
            0,
            0,
        )

    def attach(self, entry: Mapping[str, Any], where: Path) -> None:
        """Take over the committed rows of a saved run (truncating the rest)."""
        path = self.folder.path / self.file_name
        nbytes, rows = int(entry["bytes"]), int(entry["rows"])
        if entry.get("dtype") is None:  # no row yet
            return
        size = path.stat().st_size if path.is_file() else 0
        if size < nbytes:
            msg = (
                f"The spilled rows of layer {label_str(self.label)} in '{where}' "
                f"are incomplete ({size} bytes, the manifest says "
                f"{nbytes}): the folder was modified. Pass `resume=False` to "
                "start over."
            )
            raise ValueError(msg)
        if size > nbytes:
            os.truncate(path, nbytes)
        self.file = path
        self.disk_rows, self.disk_bytes = rows, nbytes
        self.dtype = parse_dtype(str(entry["dtype"]))
        self.shape = tuple(int(n) for n in entry["shape"])

    def entry(self) -> dict[str, Any]:
        return {
            "file": self.file_name,
            "rows": self.disk_rows,
            "bytes": self.disk_bytes,
            "dtype": dtype_name(self.dtype) if self.dtype is not None else None,
            "shape": None if self.shape is None else list(self.shape),
        }

    def tensor(self) -> Tensor | None:
        """All rows as one tensor (memory mapped if any went to disk)."""
        if self.shape is None or self.dtype is None:
            return None
        if self.file is None:
            if len(self.chunks) == 1:
                return self.chunks[0]
            if not self.chunks:
                return torch.empty((0, *self.shape), dtype=self.dtype)
            whole = torch.cat(self.chunks)
            self.chunks = [whole]
            return whole
        self.spill()
        return map_file(self.file, self.dtype, (self.rows, *self.shape))


class SpillLock:
    """The lock file of a ``spill_dir``: one run at a time per folder.

    :meth:`acquire` creates ``folder/collect.lock`` atomically
    (``O_CREAT | O_EXCL``) with the owner's pid, host, start time and a
    random token; :meth:`release` removes it if it is still this run's. A
    lock whose owner is a process of this host that no longer runs is stale:
    it is taken over, with a warning. Any other lock (a live process, another
    thread of this process, another host) makes :meth:`acquire` raise.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / LOCK
        self.token: str | None = None

    def acquire(self) -> None:
        """Take the lock, or raise ``RuntimeError`` naming its live owner."""
        self.folder.mkdir(parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "token": token,
        }
        text = json.dumps(owner, indent=1).encode()
        for _ in range(8):  # each retry follows the removal of a stale lock
            try:
                handle = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            try:
                os.write(handle, text)
            finally:
                os.close(handle)
            self.token = token
            with _HELD_LOCK:
                _HELD[str(self.path.resolve())] = token
            return
        msg = (
            f"Could not lock '{self.folder}': its lock file '{self.path}' keeps "
            "reappearing. Another run is starting there: use another `spill_dir`."
        )
        raise RuntimeError(msg)

    def release(self) -> None:
        """Remove the lock file if this run still owns it."""
        if self.token is None:
            return
        with _HELD_LOCK:
            _HELD.pop(str(self.path.resolve()), None)
        owner = self._read()
        if owner is not None and owner.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        self.token = None

    def _read(self) -> dict[str, Any] | None:
        """Return the owner written in the lock file (None: no lock file)."""
        for _ in range(20):  # a lock just created may not be written yet
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
            try:
                owner = json.loads(text)
            except ValueError:
                owner = None
            if isinstance(owner, dict):
                return owner
            time.sleep(0.025)
        return {}  # unreadable: an owner we cannot name, treated as live

    def _take_over_if_stale(self) -> None:
        owner = self._read()
        if owner is None:  # released meanwhile: try again
            return
        if not self._is_stale(owner):
            raise RuntimeError(self._busy_message(owner))
        # Move the stale lock aside (atomic: one taker wins), and check that
        # what was moved is the lock judged stale, not a new one.
        aside = self.folder / f".{LOCK}.{secrets.token_hex(6)}.stale"
        try:
            self.path.rename(aside)
        except FileNotFoundError:
            return
        try:
            moved = json.loads(aside.read_text(encoding="utf-8"))
        except ValueError:
            moved = {}
        if moved != owner:  # a fresh lock: put it back (never over another)
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        msg = (
            f"collect: '{self.folder}' was locked by {describe_owner(owner)}, "
            "which no longer runs: taking the stale lock over."
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=4)
        logger.warning("%s", msg)

    def _is_stale(self, owner: dict[str, Any]) -> bool:
        pid, host = owner.get("pid"), owner.get("host")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return False
        if host != socket.gethostname():
            return False  # cannot tell whether it runs
        if pid == os.getpid():
            with _HELD_LOCK:
                held = _HELD.get(str(self.path.resolve()))
            return held is None or held != owner.get("token")
        return not pid_alive(pid)

    def _busy_message(self, owner: dict[str, Any]) -> str:
        who = describe_owner(owner) if owner else "an owner it does not name"
        if owner.get("pid") == os.getpid() and owner.get("host") == (
            socket.gethostname()
        ):
            who += " (this process: another thread)"
        return (
            f"'{self.folder}' is in use by another collect run: locked by {who} "
            f"(lock file '{self.path}'). Two runs in one `spill_dir` would "
            "overwrite each other's rows and checkpoints. Wait for that run to "
            "end, use another `spill_dir`, or delete the lock file if you are "
            "sure no run uses the folder."
        )


def describe_owner(owner: Mapping[str, Any]) -> str:
    return (
        f"pid {owner.get('pid')} on host {owner.get('host')!r}, "
        f"started {owner.get('started')}"
    )


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (unknown: True)."""
    if os.name == "nt":  # os.kill(pid, 0) would terminate it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # runs, as another user
        return True
    except OSError:
        return True
    return True
