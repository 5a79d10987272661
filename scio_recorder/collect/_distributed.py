"""Merging statistics and gathering concatenations across torch.distributed ranks.

Holds :func:`merge_across_ranks` (every rank gets the merge, in rank order,
of every rank's reducer states, and the concatenated rows of all ranks, or
rank 0 only), the byte-level collectives it uses (no pickle), and
:class:`Merged`, the results of a run, merged or not.

Why: under :mod:`torch.distributed` each rank reduces its own shard; the
statistics of the whole data set are the merge of the shards' states, and
concatenations must arrive in rank order, in bounded chunks, possibly
straight into a file.
"""

from __future__ import annotations

__all__ = [
    "CHUNK_BYTES",
    "Merged",
    "concat_meta",
    "concat_reducer",
    "gather_rows",
    "merge_across_ranks",
    "merge_states",
    "merge_statistics",
]

import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from torch import Tensor

from scio_recorder._support.files import dtype_name, parse_dtype
from scio_recorder._support.ranks import all_gather_bytes, comm_device
from scio_recorder.reduce import Concat, Reducer

from ._checkpoint import flat_states
from ._spill import map_file

if TYPE_CHECKING:
    from pathlib import Path

    from scio_recorder.layers import DepthIdx

    from ._specs import Gather, Slot
    from ._spill import SpillFolder

CHUNK_BYTES = 1 << 26  # distributed transfers move at most 64 MiB at a time


@dataclasses.dataclass
class Merged:
    results: dict[DepthIdx, Any]
    reducers: dict[DepthIdx, Reducer]
    samples: int
    batches: int
    rank_samples: tuple[int, ...]
    files: dict[DepthIdx, Path]


def concat_meta(tensor: Tensor | None) -> dict[str, Any]:
    if tensor is None:
        return {"rows": 0, "dtype": None, "shape": None}
    return {
        "rows": int(tensor.shape[0]),
        "dtype": dtype_name(tensor.dtype),
        "shape": list(tensor.shape[1:]),
    }


def merge_across_ranks(  # noqa: PLR0913 (keyword-only settings)
    slots: list[Slot],
    local: dict[DepthIdx, Tensor | None],
    *,
    samples: int,
    batches: int,
    gather: Gather,
    folder: SpillFolder,
    budget: int | None,
    digest: str,
) -> Merged:
    """Merge statistics and gather concatenations across the process group."""
    device = comm_device()
    meta = {
        "digest": digest,
        "samples": samples,
        "batches": batches,
        "concat": {
            slot.key: concat_meta(local[slot.label])
            for slot in slots
            if slot.store is not None
        },
    }
    raw = all_gather_bytes(json.dumps(meta).encode(), device)
    metas = [json.loads(item) for item in raw]
    if any(m["digest"] != digest for m in metas):
        msg = (
            "collect was called with different labels, reducers or batch specs "
            "on different ranks; every rank must call it with the same arguments."
        )
        raise RuntimeError(msg)
    if not any(int(m["batches"]) for m in metas):
        msg = "`batches` yielded no batch on any rank: there is nothing to collect."
        raise ValueError(msg)
    rank_samples = tuple(int(m["samples"]) for m in metas)
    merged = Merged(
        {},
        {},
        sum(rank_samples),
        sum(int(m["batches"]) for m in metas),
        rank_samples,
        {},
    )
    merge_statistics(slots, merged, device)
    for slot in slots:
        if slot.store is not None:
            entries = [m["concat"][slot.key] for m in metas]
            tensor, path = gather_rows(
                slot,
                local[slot.label],
                entries=entries,
                gather=gather,
                folder=folder,
                budget=budget,
                device=device,
            )
            merged.results[slot.label] = tensor
            merged.reducers[slot.label] = concat_reducer(tensor)
            if path is not None:
                merged.files[slot.label] = path
    return merged


def merge_statistics(slots: list[Slot], merged: Merged, device: torch.device) -> None:
    """Give every rank the merge, in rank order, of every rank's states."""
    devices: dict[str, torch.device] = {}
    payload = safetensors.torch.save(flat_states(slots, devices))
    parts = [safetensors.torch.load(raw) for raw in all_gather_bytes(payload, device)]
    merge_states(slots, parts, merged, devices)


def merge_states(
    slots: list[Slot],
    parts: list[dict[str, Tensor]],
    merged: Merged,
    devices: dict[str, torch.device],
) -> None:
    """Merge flat reducer states (:func:`flat_states`), in order, into ``merged``.

    The merge of ranks' states (:func:`merge_statistics`) and of the parts
    of independent workers (``_parts``): each label's fresh reducer merges
    every part's, in order, on the device of ``devices`` (else the CPU).
    """
    for slot in slots:
        if slot.template is None:
            continue
        target = devices.get(slot.key)
        total = slot.template.fresh()
        prefix = f"{slot.key}/"
        for states in parts:
            part = slot.template.fresh()
            part.load_state(
                {
                    key.removeprefix(prefix): value
                    if target is None
                    else value.to(target)
                    for key, value in states.items()
                    if key.startswith(prefix)
                }
            )
            total.merge(part)
        merged.reducers[slot.label] = total
        merged.results[slot.label] = total.result()


def gather_rows(  # noqa: C901, PLR0912, PLR0913 (one transfer protocol)
    slot: Slot,
    source: Tensor | None,
    *,
    entries: list[dict[str, Any]],
    gather: Gather,
    folder: SpillFolder,
    budget: int | None,
    device: torch.device,
) -> tuple[Tensor | None, Path | None]:
    """Gather a concatenation's rows in rank order (all ranks, or rank 0)."""
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    known = [e for e in entries if e["dtype"] is not None]
    if not known:
        return None, None
    dtype, shape = parse_dtype(known[0]["dtype"]), tuple(known[0]["shape"])
    if any(
        (parse_dtype(e["dtype"]), tuple(e["shape"])) != (dtype, shape) for e in known
    ):
        msg = (
            f"'concat' of layer {slot.key}: ranks recorded different per-sample "
            "shapes or dtypes"
        )
        raise RuntimeError(msg)
    rows = [int(e["rows"]) for e in entries]
    row_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    offsets = [sum(rows[:r]) * row_bytes for r in range(world)]
    total = sum(rows)
    mine = (
        source.reshape(-1).view(torch.uint8)
        if source is not None and source.numel()
        else torch.empty(0, dtype=torch.uint8)
    )
    dest: Tensor | None = None
    path: Path | None = None
    if gather == "all" or rank == 0:
        nbytes = total * row_bytes
        if nbytes and (folder.persistent or (budget is not None and nbytes > budget)):
            path = folder.new_file(f"gathered-{slot.key}.bin")
            os.truncate(path, nbytes)
            dest = torch.from_file(
                str(path), shared=True, size=nbytes, dtype=torch.uint8
            )
        else:
            dest = torch.empty(nbytes, dtype=torch.uint8)
        dest[offsets[rank] : offsets[rank] + mine.numel()].copy_(mine)
    per = max(1, CHUNK_BYTES // max(row_bytes, 1)) * row_bytes
    for src in range(world):
        size = rows[src] * row_bytes
        if size == 0 or (gather == 0 and src == 0):
            continue
        for lo in range(0, size, per):
            hi = min(size, lo + per)
            at = offsets[src]
            if rank == src:
                chunk = mine[lo:hi].to(device)
                if gather == "all":
                    dist.broadcast(chunk, src)
                else:
                    dist.send(chunk, dst=0)
            elif gather == "all" or rank == 0:
                buffer = torch.empty(hi - lo, dtype=torch.uint8, device=device)
                if gather == "all":
                    dist.broadcast(buffer, src)
                else:
                    dist.recv(buffer, src=src)
                assert dest is not None  # noqa: S101 (receiving ranks have one)
                dest[at + lo : at + hi].copy_(buffer)
    if dest is None:
        return None, None
    if path is None:
        return dest.view(dtype).view((total, *shape)), None
    del dest  # unmap the writable mapping, then map privately
    return map_file(path, dtype, (total, *shape)), path


def concat_reducer(tensor: Tensor | None) -> Concat:
    """Return a :class:`~scio_recorder.reduce.Concat` holding ``tensor`` (no copy)."""
    reducer = Concat()
    if tensor is not None:
        reducer.load_state({"count": torch.tensor(tensor.shape[0]), "data": tensor})
    return reducer
