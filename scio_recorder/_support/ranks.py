"""Where a process stands in a :mod:`torch.distributed` group; byte exchanges.

Holds :func:`rank_and_world` (``(rank, world_size)`` when a process group is
initialised), :func:`comm_device` (where the backend moves tensors) and
:func:`all_gather_bytes` (one byte string from every rank, without pickle).

Why: :func:`scio_recorder.collect.collect` and
:func:`scio_recorder.activations.write` both run one process per rank and
exchange small descriptions (manifests, states) between them; one protocol
serves both.
"""

from __future__ import annotations

__all__ = ["all_gather_bytes", "comm_device", "rank_and_world"]

import torch


def rank_and_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` when a process group is initialised."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def comm_device() -> torch.device:
    """CUDA for NCCL (which moves only CUDA tensors), else the CPU."""
    if str(torch.distributed.get_backend()) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Gather one byte string from every rank (no pickle)."""
    dist = torch.distributed
    world = dist.get_world_size()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    lengths = [int(s.item()) for s in sizes]
    buffer = torch.zeros(max(*lengths, 1), dtype=torch.uint8)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffer = buffer.to(device)
    buffers = [torch.empty_like(buffer) for _ in range(world)]
    dist.all_gather(buffers, buffer)
    return [
        b[:n].cpu().numpy().tobytes() for b, n in zip(buffers, lengths, strict=True)
    ]
