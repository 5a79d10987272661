"""Concatenated rows kept in RAM, spilled to raw files, memory mapped back.

Holds :class:`ConcatStore`, the rows of one ``"concat"`` label (CPU chunks,
appended to one raw file when the memory budget is exceeded or a checkpoint
is written), :class:`SpillFolder`, where those files go (``spill_dir`` or a
temporary folder), :func:`spill_lock`, the lock file that keeps a second run
out of a ``spill_dir`` in use (:class:`scio_recorder._support.lock.FolderLock`), and
the helpers that write tensor bytes and
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
    "bytes_of",
    "map_file",
    "spill_lock",
]

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._support.files import dtype_name, parse_dtype
from scio_recorder._support.lock import FolderLock
from scio_recorder.layers import label_str

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx

logger = logging.getLogger("scio_recorder.collect")

LOCK = "collect.lock"
"""The lock file of a ``spill_dir`` in use (JSON: pid, host, start time)."""


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


def spill_lock(folder: Path) -> FolderLock:
    """Return the lock of a ``spill_dir`` (``collect.lock``), not yet taken."""
    return FolderLock(
        folder,
        name=LOCK,
        tool="collect",
        option="spill_dir",
        files="rows and checkpoints",
        logger="scio_recorder.collect",
    )
