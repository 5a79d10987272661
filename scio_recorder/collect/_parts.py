"""Collect runs of independent workers: one part each, then :func:`merge`.

Holds :func:`save_part` (what ``collect(..., part=K, parts=N, save=folder)``
writes at the end of a run: every reducer's state and every concatenation,
in one safetensors file, atomically) and :func:`merge` (the result a
single :func:`~scio_recorder.collect.collect` over every part's batches
gives).

Why: a SLURM job array or a pool of Ray actors has no process group to
merge over; each worker saves what a rank would send, and the merge does
what ranks do once every rank has finished (``_distributed.merge_states``:
each label's reducer merges every part's state in part order, Chan's rule
for moments and covariances, in float64; quantile sketches, per-class
statistics; concatenations put end to end, part 0's rows first).
"""

from __future__ import annotations

__all__ = ["PART_FORMAT", "merge", "part_file", "save_part"]

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors
import safetensors.torch
import torch

from scio_recorder._support.files import differences, write_atomic

from ._checkpoint import fingerprint_of, flat_states
from ._distributed import Merged, concat_meta, concat_reducer, merge_states
from ._results import CollectResult
from ._specs import plan

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping

    from torch import Tensor

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._specs import ReducerSpec, Slot

PART_FORMAT = "scio_recorder.collect.part/1"
"""The format of a part's file (its ``__metadata__``'s ``"format"``)."""

_PART = re.compile(r"collect-part-(\d{5,})\.safetensors")


def part_file(folder: Path, part: int) -> Path:
    """Return the file of part ``part`` in ``folder``."""
    return folder / f"collect-part-{part:05d}.safetensors"


def save_part(  # noqa: PLR0913 (what a part holds)
    folder: Path,
    *,
    part: int,
    parts: int,
    slots: list[Slot],
    local: Mapping[DepthIdx, Tensor | None],
    fingerprint: dict[str, Any],
    samples: int,
    batches: int,
    weights: str | None = None,
) -> Path:
    """Write part ``part``'s reducer states and concatenations; return the file.

    The file is replaced atomically (a temporary file renamed,
    :func:`~scio_recorder._support.files.write_atomic`), so a part killed while
    saving leaves its previous file, or none, and never another part's.
    ``weights``: the net's
    :func:`~scio_recorder._support.parts.weights_digest`, which the merge
    compares across parts.
    """
    columns: dict[str, Tensor] = {
        f"state/{key}": value for key, value in flat_states(slots).items()
    }
    concat: dict[str, Any] = {}
    for slot in slots:
        if slot.store is None:
            continue
        tensor = local[slot.label]
        concat[slot.key] = concat_meta(tensor)
        if tensor is not None:
            columns[f"concat/{slot.key}"] = tensor.contiguous()
    metadata = {
        "format": PART_FORMAT,
        "part": str(part),
        "parts": str(parts),
        "samples": str(samples),
        "batches": str(batches),
        "fingerprint": json.dumps(fingerprint, sort_keys=True),
        "concat": json.dumps(concat, sort_keys=True),
    }
    if weights is not None:
        metadata["weights"] = weights
    folder.mkdir(parents=True, exist_ok=True)
    path = part_file(folder, part)
    write_atomic(
        path,
        lambda temporary: safetensors.torch.save_file(
            columns, str(temporary), metadata
        ),
    )
    return path


def _files(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> list[Path]:
    """Return the part files: a folder's ``collect-part-*``, or the files given."""
    if isinstance(paths, str) or not isinstance(paths, Iterable):
        folder = Path(paths)
        if not folder.is_dir():
            msg = (
                f"'{folder}' is not a folder: give the folder passed as `save=`, "
                "or a list of the parts' files."
            )
            raise FileNotFoundError(msg)
        found = sorted(p for p in folder.iterdir() if _PART.fullmatch(p.name))
        if not found:
            msg = (
                f"'{folder}' holds no part (no collect-part-<K>.safetensors): run "
                "`collect(..., part=K, parts=N, save=folder)` first."
            )
            raise FileNotFoundError(msg)
        return found
    return [Path(p) for p in paths]


def _read(path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Return a part's metadata (parsed) and tensors, or raise naming the file."""
    try:
        with safetensors.safe_open(str(path), "pt") as file:
            raw = file.metadata() or {}
            tensors = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 (not a dict)
        if raw.get("format") != PART_FORMAT:
            msg = f"it is not a part of a collect run ({PART_FORMAT})"
            raise ValueError(msg)  # noqa: TRY301 (named with the others below)
        meta: dict[str, Any] = {
            key: int(raw[key]) for key in ("part", "parts", "samples", "batches")
        }
        meta["fingerprint"] = json.loads(raw["fingerprint"])
        meta["concat"] = json.loads(raw["concat"])
        meta["weights"] = raw.get("weights")  # None: saved before it was
    except (OSError, ValueError, KeyError, safetensors.SafetensorError) as error:
        msg = (
            f"'{path}' cannot be read as a part of a collect run ({error}). Run "
            "the part again with `collect(..., part=K, parts=N, save=...)`."
        )
        raise ValueError(msg) from error
    return meta, tensors


def _ordered(
    read: list[tuple[Path, dict[str, Any], dict[str, Tensor]]],
) -> list[tuple[Path, dict[str, Any], dict[str, Tensor]]]:
    """Return the parts in part order; refuse duplicates, mixed counts, gaps."""
    parts = read[0][1]["parts"]
    by_part: dict[int, tuple[Path, dict[str, Any], dict[str, Tensor]]] = {}
    for item in read:
        path, meta, _ = item
        if meta["parts"] != parts:
            msg = (
                f"'{path}' is part {meta['part']} of {meta['parts']} parts, "
                f"'{read[0][0]}' one of {parts}: run every part with the same "
                "`parts`."
            )
            raise ValueError(msg)
        if meta["part"] in by_part:
            msg = (
                f"Part {meta['part']} is given twice: '{by_part[meta['part']][0]}' "
                f"and '{path}'. Give each part once."
            )
            raise ValueError(msg)
        by_part[meta["part"]] = item
    missing = [k for k in range(parts) if k not in by_part]
    if missing:
        msg = (
            f"The run has {parts} parts, and part{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))} "
            f"{'are' if len(missing) > 1 else 'is'} missing: run "
            f"`collect(..., part=K, parts={parts}, save=...)` for "
            f"{'them' if len(missing) > 1 else 'it'}, then merge again."
        )
        raise ValueError(msg)
    return [by_part[k] for k in range(parts)]


def _check(
    ordered: list[tuple[Path, dict[str, Any], dict[str, Tensor]]],
    slots: list[Slot],
) -> None:
    """Refuse parts run with other arguments, or with reducers other than ``keep``."""
    base = ordered[0][1]["fingerprint"]
    weights = ordered[0][1].get("weights")
    for number, (path, meta, _) in enumerate(ordered[1:], start=1):
        lines = differences(base, meta["fingerprint"])
        if meta.get("weights") != weights:
            # a worker that built its net with another seed or checkpoint
            lines.append(f"- model weights: saved {weights}, now {meta.get('weights')}")
        if lines:
            msg = (
                f"Part {number} in '{path}' was not run as part 0 was (saved: part "
                "0's, now: this part's):\n"
                + "\n".join(lines)
                + f"\nRun part {number} again with the arguments and the model of "
                "the others."
            )
            raise ValueError(msg)
    expected = fingerprint_of(slots, None, None)
    for key in ("labels", "reducers"):
        if base.get(key) != expected[key]:
            lines = differences({key: base.get(key)}, {key: expected[key]})
            msg = (
                f"The parts were run with other {key} than `keep` gives (saved: the "
                "parts', now: `keep`'s):\n"
                + "\n".join(lines)
                + "\nMerge with the `rnet` and `keep` the parts were run with."
            )
            raise ValueError(msg)


def merge(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    rnet: Recorder,
    keep: Mapping[Selector, ReducerSpec],
) -> CollectResult:
    """Merge the parts saved by ``collect(..., part=K, parts=N, save=folder)``.

    Gives the result one :func:`~scio_recorder.collect.collect` over every
    part's batches, in part order, gives: each label's statistics are the
    merge of the parts' reducer states in part order (what ranks do under
    :mod:`torch.distributed`: Chan's rule for moments and covariances, in
    float64, quantile sketches, per-class statistics), and each
    concatenation is the parts' rows end to end, part 0's first. Every part
    ``0`` to ``N - 1`` must be there (a missing one is named), run with the
    same arguments (a part that differs is named, with what differs). No
    process group is created.

    Parameters
    ----------
    paths : str, os.PathLike or iterable of them
        The folder given as ``save=`` (its ``collect-part-<K>.safetensors``
        files), or the parts' files.
    rnet : Recorder
        A recorder of the same net (its layer table resolves ``keep``).
    keep : Mapping
        The ``keep`` of the parts: the reducers are built from it (a
        reducer's configuration is not stored in a part, only its state),
        and checked against the parts' labels and reducers.

    Returns
    -------
    CollectResult
        With ``samples`` and ``batches`` summed over the parts and
        ``rank_samples`` the samples of each part, in part order.

    Raises
    ------
    FileNotFoundError
        If ``paths`` is a folder holding no part.
    ValueError
        If a part is missing, given twice, damaged, or run with other
        arguments, or ``keep`` does not give the parts' reducers.

    Examples
    --------
    >>> import tempfile, torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.collect import collect, merge
    >>> _ = torch.manual_seed(0)
    >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5))
    >>> data = [torch.randn(8, 5) for _ in range(4)]
    >>> keep = {(1, 1): "moments", (1, 2): "concat"}
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     for k in range(2):  # two workers, each with its half of the batches
    ...         _ = collect(
    ...             rnet,
    ...             data[2 * k : 2 * k + 2],
    ...             keep,
    ...             input=None,
    ...             part=k,
    ...             parts=2,
    ...             save=folder,
    ...         )
    ...     merged = merge(folder, rnet, keep)
    >>> whole = collect(rnet, data, keep, input=None)
    >>> torch.equal(merged[(1, 2)], whole[(1, 2)]), merged.rank_samples
    (True, (16, 16))
    >>> torch.allclose(merged[(1, 1)].mean, whole[(1, 1)].mean, rtol=0, atol=1e-12)
    True

    """
    slots, labels_of = plan(rnet, keep)
    read = [(path, *_read(path)) for path in _files(paths)]
    if not read:
        msg = "No part was given: give the folder passed as `save=`, or the files."
        raise ValueError(msg)
    ordered = _ordered(read)
    _check(ordered, slots)
    parts = [
        {
            key.removeprefix("state/"): value
            for key, value in tensors.items()
            if key.startswith("state/")
        }
        for _, _, tensors in ordered
    ]
    samples = tuple(meta["samples"] for _, meta, _ in ordered)
    merged = Merged(
        {},
        {},
        sum(samples),
        sum(meta["batches"] for _, meta, _ in ordered),
        samples,
        {},
    )
    merge_states(slots, parts, merged, {})
    for slot in slots:
        if slot.template is not None:
            continue
        chunks = [
            tensors[f"concat/{slot.key}"]
            for _, _, tensors in ordered
            if f"concat/{slot.key}" in tensors
        ]
        tensor = torch.cat(chunks) if chunks else None
        merged.results[slot.label] = tensor
        merged.reducers[slot.label] = concat_reducer(tensor)
    return CollectResult(
        {slot.label: merged.results[slot.label] for slot in slots},
        samples=merged.samples,
        batches=merged.batches,
        reducers={slot.label: merged.reducers[slot.label] for slot in slots},
        labels_of=labels_of,
        rank_samples=merged.rank_samples,
        table=rnet.table,
    )
