"""An activation set as Arrow files, which Hugging Face ``datasets`` opens.

Holds :func:`to_arrow`: one Arrow IPC stream file per shard (the format of
``datasets``' own cache files, which ``datasets.Dataset.from_file`` maps),
with one column per layer (a fixed-size list of floats per token; Arrow has
no bfloat16, so bfloat16 layers become float32) and ``row`` and ``column``
(int64), in the set's order. ``pyarrow`` is imported when an export is
asked for, not before.

Why: SAELens and other tools read activation caches as ``datasets`` tables;
the set itself stays in safetensors (``docs/activations.md`` says why), and
this export is the bridge, a shard at a time, in bounded memory.
"""

from __future__ import annotations

__all__ = ["ROWS_PER_BATCH", "to_arrow"]

import importlib
import json
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._support.files import write_atomic

from ._tokens import INDEX

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from torch import Tensor

ROWS_PER_BATCH = 65536
"""Tokens per Arrow record batch (what an export holds in memory at once)."""


def _pyarrow() -> tuple[Any, Any]:
    try:
        pa = importlib.import_module("pyarrow")
        ipc = importlib.import_module("pyarrow.ipc")
    except ImportError as error:
        msg = (
            "ActivationDataset.to_arrow needs pyarrow, which is not installed: "
            "`pip install pyarrow` (Hugging Face `datasets` brings it too)."
        )
        raise ImportError(msg) from error
    return pa, ipc


def _value_type(pa: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.float16:
        return pa.float16()
    if dtype == torch.float64:
        return pa.float64()
    return pa.float32()  # float32, and bfloat16 (which Arrow lacks) widened


def to_arrow(  # noqa: PLR0913 (the set, read shard by shard)
    shards: Sequence[Mapping[str, Tensor]],
    *,
    offsets: Sequence[int],
    layers: Sequence[str],
    dims: Mapping[str, int],
    dtypes: Mapping[str, torch.dtype],
    manifest: Mapping[str, Any],
    folder: Path,
) -> list[Path]:
    """Write each shard's columns as an Arrow stream file in ``folder``."""
    pa, ipc = _pyarrow()
    fields = [
        pa.field(name, pa.list_(_value_type(pa, dtypes[name]), dims[name]))
        for name in layers
    ]
    fields += [pa.field("row", pa.int64()), pa.field("column", pa.int64())]
    summary = {key: manifest[key] for key in ("format", "tokens", "layers", "model")}
    schema = pa.schema(
        fields, metadata={"scio_recorder.activations": json.dumps(summary)}
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (columns, offset) in enumerate(zip(shards, offsets, strict=True)):

        def write(
            temporary: Path,
            columns: Mapping[str, Tensor] = columns,
            offset: int = offset,
        ) -> None:
            total = int(columns[INDEX].shape[0])
            with (
                pa.OSFile(str(temporary), "wb") as sink,
                ipc.new_stream(sink, schema) as writer,
            ):
                for start in range(0, total, ROWS_PER_BATCH):
                    stop = min(total, start + ROWS_PER_BATCH)
                    arrays = []
                    for name in layers:
                        values = columns[name][start:stop]
                        if values.dtype == torch.bfloat16:
                            values = values.float()
                        flat = pa.array(values.contiguous().reshape(-1).numpy())
                        arrays.append(
                            pa.FixedSizeListArray.from_arrays(flat, dims[name])
                        )
                    where = columns[INDEX][start:stop]
                    arrays.append(pa.array((where[:, 0] + offset).numpy()))
                    arrays.append(pa.array(where[:, 1].contiguous().numpy()))
                    writer.write_batch(pa.record_batch(arrays, schema=schema))

        path = folder / f"data-{number:05d}-of-{len(shards):05d}.arrow"
        write_atomic(path, write)
        paths.append(path)
    return paths
