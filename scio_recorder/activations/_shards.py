"""Shards: safetensors files written without a copy, read through memory maps.

Holds :func:`write_shard` (columns given as lists of row chunks, written
straight from the tensors' memory after a safetensors header, atomically,
with the file's CRC-32 computed on the way), :class:`ShardReader` (the
header parsed, the file mapped once, each column a tensor view into the
mapping, the CRC-32 checked on request) and :func:`check_shard` (the size
a header promises against the file).

Why: an activation set is a few layers of many tokens. The ``safetensors``
library would first copy every column into one bytes object; writing the
header and then each chunk's bytes avoids both the concatenation and the
copy, and gives files any safetensors reader opens. Reading maps each file
with :func:`torch.from_file` (a private mapping that keeps no file
descriptor open, so thousands of shards stay cheap), and columns are views
of the mapping: a batch read is one ``index_select`` per shard and layer.
Columns are laid out by decreasing element size so that each starts on a
multiple of its element size, which a typed view of the bytes needs.

The checksum is CRC-32 (:func:`zlib.crc32`, the standard library's, about
1 GB/s): a damaged shard (a flipped bit in its values or its index) reads
as the wrong rows with no other sign, and a hash of the bytes as written
is what tells. It is computed from the chunks' memory while writing them
(no second read), and checked against the whole file when a reader maps it
(``docs/activations.md`` says when, and its cost).
"""

from __future__ import annotations

__all__ = [
    "CHECKSUM",
    "HEADER_LIMIT",
    "ShardReader",
    "check_shard",
    "checksum",
    "read_header",
    "write_shard",
]

import json
import struct
import zlib
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._support.files import write_atomic

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

CHECKSUM = True
"""Whether :func:`write_shard` computes the CRC-32 (off only to measure its
cost, ``benchmarks/activations.py``; a shard then has none to check)."""

HEADER_LIMIT = 100_000_000
"""The largest header a shard may have (safetensors' own limit), in bytes."""

_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}


def _bytes(chunk: Tensor) -> Any:
    """Return a buffer over the bytes of a CPU tensor (no copy if contiguous)."""
    return chunk.contiguous().reshape(-1).view(torch.uint8).numpy()


def write_shard(
    path: Path,
    columns: Mapping[str, Sequence[Tensor]],
    metadata: Mapping[str, str],
    *,
    durable: bool,
) -> str | None:
    """Write ``columns`` (name -> row chunks) as one safetensors file, atomically.

    The chunks of a column share their dtype and trailing shape; the
    column's tensor is their concatenation along dim 0, which is never
    built: each chunk's bytes go to the file in turn. A column of one chunk
    may be of any shape (0-d included). Returns the file's CRC-32 as 8 hex
    digits (:func:`checksum` of the file gives the same), computed from the
    bytes as they are written; ``None`` when :data:`CHECKSUM` is off.
    """
    order = sorted(
        columns,
        key=lambda name: -torch.empty((), dtype=columns[name][0].dtype).element_size(),
    )
    header: dict[str, Any] = {}
    offset = 0
    for name in order:
        chunks = columns[name]
        first = chunks[0]
        shape = list(first.shape)
        if len(chunks) > 1:
            shape[0] = sum(int(chunk.shape[0]) for chunk in chunks)
        nbytes = sum(chunk.numel() * chunk.element_size() for chunk in chunks)
        header[name] = {
            "dtype": _CODES[first.dtype],
            "shape": shape,
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned

    crc: list[int] = []

    def write(temporary: Path) -> None:
        head = struct.pack("<Q", len(text)) + text
        running = zlib.crc32(head) if CHECKSUM else 0
        with temporary.open("wb") as file:
            file.write(head)
            for name in order:
                for chunk in columns[name]:
                    if chunk.numel():
                        data = _bytes(chunk)
                        file.write(data)
                        if CHECKSUM:
                            running = zlib.crc32(data, running)
        crc[:] = [running]

    write_atomic(path, write, durable=durable)
    return f"{crc[0]:08x}" if CHECKSUM else None


def checksum(data: Any) -> str:
    """Return the CRC-32 of ``data`` (a file's bytes, or a buffer) as 8 hex digits.

    Examples
    --------
    >>> checksum(b"shard")
    '9801adcc'

    """
    return f"{zlib.crc32(data):08x}"


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """Return a shard's header and where its data starts; raise if unreadable."""
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) < 8:  # noqa: PLR2004 (the length field)
            msg = f"'{path}' is not a safetensors file: it is shorter than 8 bytes"
            raise ValueError(msg)
        (length,) = struct.unpack("<Q", head)
        if length > HEADER_LIMIT:
            msg = f"'{path}' is not a safetensors file: its header length is {length}"
            raise ValueError(msg)
        text = file.read(length)
    try:
        header = json.loads(text)
    except ValueError as error:
        msg = f"'{path}' is not a safetensors file: its header is not JSON ({error})"
        raise ValueError(msg) from error
    if not isinstance(header, dict):
        msg = f"'{path}' is not a safetensors file: its header is not an object"
        raise ValueError(msg)  # noqa: TRY004 (a damaged file, not a wrong argument)
    return header, 8 + length


def check_shard(  # noqa: PLR0911 (one answer per problem)
    path: Path, columns: Mapping[str, tuple[torch.dtype, list[int]]]
) -> str | None:
    """Say what is wrong with a shard (``None``: nothing), given what it must hold.

    ``columns`` maps each column's name to its dtype and shape.
    """
    if not path.is_file():
        return "the file is missing"
    try:
        header, start = read_header(path)
    except (OSError, ValueError) as error:
        return str(error)
    header.pop("__metadata__", None)
    if set(header) != set(columns):
        return f"it holds {sorted(header)}, not {sorted(columns)}"
    end = 0
    for name, (dtype, shape) in columns.items():
        entry = header[name]
        if not isinstance(entry, dict):
            return f"its entry {name!r} is not an object"
        if entry.get("dtype") != _CODES.get(dtype) or entry.get("shape") != shape:
            return (
                f"{name!r} is {entry.get('dtype')} {entry.get('shape')}, not "
                f"{_CODES.get(dtype)} {shape}"
            )
        offsets = entry.get("data_offsets")
        size = torch.empty((), dtype=dtype).element_size()
        for n in shape:
            size *= n
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2  # noqa: PLR2004 (begin, end)
            or offsets[1] - offsets[0] != size
            or offsets[0] % torch.empty((), dtype=dtype).element_size()
        ):
            return f"{name!r} has the data offsets {offsets!r}"
        end = max(end, offsets[1])
    actual = path.stat().st_size
    if actual != start + end:
        return f"it is {actual} bytes, its header says {start + end}"
    return None


class ShardReader:
    """One shard mapped into memory, its columns as tensor views.

    The mapping is private (copy-on-write: writing into a column never
    reaches the file) and keeps no file descriptor. Build one per process:
    a :class:`~scio_recorder.activations.ActivationDataset` does so in each
    ``DataLoader`` worker.
    """

    def __init__(self, path: Path, crc32: str | None = None) -> None:
        """Map ``path``; with ``crc32``, check the whole file's bytes against it first.

        Raises
        ------
        ValueError
            If the file's CRC-32 is not ``crc32`` (naming both).
        """
        header, start = read_header(path)
        header.pop("__metadata__", None)
        size = path.stat().st_size
        mapped = (
            torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
            if size
            else torch.empty(0, dtype=torch.uint8)
        )
        if crc32 is not None:
            found = checksum(mapped.numpy())
            if found != crc32:
                msg = (
                    f"its bytes have the CRC-32 {found}, not the {crc32} written: "
                    "the file was damaged (or edited) after it was written"
                )
                raise ValueError(msg)
        self.columns: dict[str, Tensor] = {}
        for name, entry in header.items():
            dtype = _DTYPES[entry["dtype"]]
            begin, end = entry["data_offsets"]
            raw = mapped[start + begin : start + end]
            self.columns[name] = raw.view(dtype).view(entry["shape"])
