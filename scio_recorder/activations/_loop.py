"""One rank's part of a write: the batch loop, the shards, the checkpoints.

Holds :class:`RankWriter`: it runs the recorder over the batches (one
forward per batch for every layer, stopped after the last layer stored),
takes the kept tokens of each layer
(``_tokens``), feeds them through the shuffle buffer (``_shuffle``) into
pending rows, cuts full shards (``_shards``), keeps the running statistics
(:class:`scio_recorder.reduce.Moments`, in float64, before the cast), and
checkpoints: the progress file (JSON) names the shards written and a state
file (the buffer's rows and its generator, the pending rows, the
statistics), and is replaced atomically; state files alternate between
two names, so the one a progress file names is never overwritten.

Why a checkpoint is what it is: a resumed write must give the same set in
the same order. The shards already written are kept; the rows still in the
buffer or pending, and where the random numbers stood, are exactly what
the next shards are made of. A checkpoint is written after a batch that
completed a shard (with a shuffle buffer: once as many tokens have been
written as the buffer holds, so that saving the buffer costs at most what
writing the shards did), at the end, and after an error between batches.
"""

from __future__ import annotations

__all__ = ["RankWriter", "progress_name", "shard_name"]

import errno
import json
import logging
import re
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import safetensors.torch
import torch
from torch import Tensor

from scio_recorder._support.files import (
    differences,
    dtype_name,
    is_count,
    manifest_digest,
    parse_dtype,
    write_atomic,
)
from scio_recorder.reduce import Moments

from ._manifest import is_crc32
from ._shards import check_shard, write_shard
from ._shuffle import ShuffleBuffer
from ._tokens import INDEX, pick, record_tensor, take

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    from scio_recorder._support.progress import Bar
    from scio_recorder.recorder import Recorder

    from ._tokens import Batches, LayerSpec

logger = logging.getLogger("scio_recorder.activations")

PROGRESS_FORMAT = "scio_recorder.activations.progress/1"
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def shard_name(part: int, rank: int, number: int) -> str:
    """Return the file name of a shard."""
    return f"shard-p{part}-r{rank}-{number:05d}.safetensors"


def progress_name(part: int, rank: int) -> str:
    """Return the file name of a rank's progress (its checkpoints' manifest)."""
    return f"progress-p{part}-r{rank}.json"


def stream_seed(seed: int, part: int, rank: int) -> int:
    """Return the shuffle seed of one rank of one part (independent streams)."""
    state = np.random.SeedSequence([seed, part, rank]).generate_state(1, np.uint64)
    return int(state[0]) >> 1


class RankWriter:
    """The tokens of one rank's batches, written as shards with checkpoints."""

    def __init__(  # noqa: PLR0913 (the write's settings)
        self,
        folder: Path,
        specs: list[LayerSpec],
        *,
        part: int,
        rank: int,
        fingerprint: dict[str, Any],
        shard_size: int,
        shuffle: int | None,
        seed: int,
        stats: bool,
        dtype: torch.dtype | None,
        durable: bool,
        expected: dict[str, tuple[torch.dtype, list[int]]] | None = None,
        early_exit: bool = True,
    ) -> None:
        self.folder = folder
        self.options = {"early_exit": True} if early_exit else {}
        """The recorder's own options of every pass (``write(early_exit=)``)."""
        self.specs = specs
        self.part, self.rank = part, rank
        self.fingerprint = fingerprint
        self.shard_size = shard_size
        self.dtype = dtype
        self.durable = durable
        self.progress = folder / progress_name(part, rank)
        stem = self.progress.name.removesuffix(".json")
        self.state_names = (f"{stem}-a.safetensors", f"{stem}-b.safetensors")
        self.buffer = (
            None
            if shuffle is None
            else ShuffleBuffer(shuffle, seed=stream_seed(seed, part, rank))
        )
        self.moments = (
            {spec.name: (Moments(), Moments()) for spec in specs} if stats else {}
        )
        self.shards: list[dict[str, Any]] = []
        self.committed = 0
        self.pending: dict[str, list[Tensor]] = {}
        self.pending_rows = 0
        # Each column's dtype and row size: the set's when appending, else
        # the first batch's.
        self.columns: dict[str, tuple[torch.dtype, list[int]]] | None = expected
        self.batches = self.rows = self.tokens_in = 0
        self.digest = ""  # of the batches taken (see `Batches.digest`)
        self.saved_batches = 0
        self.since = 0  # tokens written to shards since the last checkpoint
        self.state_name: str | None = None
        self.complete = False
        self.consistent = True

    # -- tokens in, shards out -------------------------------------------

    @property
    def tokens(self) -> int:
        """Tokens written to shards so far."""
        return sum(int(entry["tokens"]) for entry in self.shards)

    def feed(self, stored: dict[str, Tensor], recorded: dict[str, Tensor]) -> None:
        """Take one batch's kept tokens (columns of the same rows) in."""
        for name, (moments, norms) in self.moments.items():
            values = recorded[name]
            moments.update(values)
            norms.update(torch.linalg.vector_norm(values.double(), dim=1, keepdim=True))
        self._check_columns(stored)
        out = stored if self.buffer is None else self.buffer.push(stored)
        rows = int(out[INDEX].shape[0])
        if rows:
            for name, value in out.items():
                self.pending.setdefault(name, []).append(value)
            self.pending_rows += rows
        while self.pending_rows >= self.shard_size:
            self._write_pending(self.shard_size)

    def _check_columns(self, stored: Mapping[str, Tensor]) -> None:
        found = {
            name: (value.dtype, list(value.shape[1:])) for name, value in stored.items()
        }
        if self.columns is None:
            self.columns = found
            return
        for name, (dtype, shape) in found.items():
            if (dtype, shape) != self.columns[name]:
                old_dtype, old_shape = self.columns[name]
                msg = (
                    f"Layer {name!r} gave {dtype} rows of size {shape} in batch "
                    f"{self.batches}, where the set holds {old_dtype} rows of size "
                    f"{old_shape}: every token of a layer must have the same size "
                    "and dtype (pass `dtype=` to cast them all)."
                )
                raise ValueError(msg)

    def _write_pending(self, rows: int) -> None:
        """Write the first ``rows`` pending rows as the next shard."""
        chunks: dict[str, list[Tensor]] = {name: [] for name in self.pending}
        rest: dict[str, list[Tensor]] = {name: [] for name in self.pending}
        for name, values in self.pending.items():
            need = rows
            for value in values:
                if need >= value.shape[0]:
                    chunks[name].append(value)
                    need -= int(value.shape[0])
                elif need > 0:
                    chunks[name].append(value[:need])
                    rest[name].append(value[need:])
                    need = 0
                else:
                    rest[name].append(value)
        number = len(self.shards)
        name = shard_name(self.part, self.rank, number)
        crc = write_shard(
            self.folder / name,
            chunks,
            {"part": str(self.part), "rank": str(self.rank), "shard": str(number)},
            durable=self.durable,
        )
        entry: dict[str, Any] = {"file": name, "tokens": rows}
        if crc is not None:
            entry["crc32"] = crc
        self.shards.append(entry)
        self.since += rows
        self.pending = rest
        self.pending_rows -= rows

    def finish(self) -> None:
        """Empty the buffer and the pending rows into the last shards."""
        if self.buffer is not None and self.buffer.fill:
            out = self.buffer.flush()
            for name, value in out.items():
                self.pending.setdefault(name, []).append(value)
            self.pending_rows += int(out[INDEX].shape[0])
        while self.pending_rows >= self.shard_size:
            self._write_pending(self.shard_size)
        if self.pending_rows:
            self._write_pending(self.pending_rows)
        self.complete = True

    # -- the loop ----------------------------------------------------------

    def run(  # noqa: C901 (the loop, its skips and its error paths)
        self,
        rnet: Recorder,
        batches: Iterable[Any],
        source: Batches,
        bar: Bar | None,
    ) -> None:
        """Write the tokens of every batch not written yet, then finish."""
        if self.complete:
            return
        skip = self.saved_batches
        skipped = ""
        index = -1
        try:
            for index, batch in enumerate(batches):
                if index < skip:
                    args, kwargs = source.arguments(batch, index)
                    mask = source.padding_mask(batch, index)
                    skipped = source.digest(skipped, args, kwargs, mask)
                    if index == skip - 1:
                        self._check_skipped(skipped)
                    continue
                kept = self.step(rnet, batch, index, source)
                if bar is not None:
                    bar.update(kept)
                if self.shards[self.committed :] and (
                    self.buffer is None or self.since >= self.buffer.capacity
                ):
                    self.save()
            self._check_exhausted(index + 1, skip)
            self.consistent = False
            self.finish()
            self.save()
            self.consistent = True
        except BaseException as error:
            if self.consistent and self.batches > self.saved_batches:
                try:
                    self.save()
                except Exception:
                    logger.exception(
                        "activations: could not checkpoint after the error"
                    )
            if isinstance(error, OSError) and error.errno in _FULL_DISK:
                committed = self.shards[: self.committed]
                tokens = sum(int(entry["tokens"]) for entry in committed)
                msg = (
                    f"The disk holding '{self.folder}' is full ({error}). The "
                    f"{len(committed)} shards committed so far ({tokens} tokens) "
                    "are valid and kept: free some space (or move the folder) "
                    "and call `write` again with the same arguments to resume "
                    "after them."
                )
                raise OSError(error.errno, msg) from error
            raise

    def _check_exhausted(self, count: int, skip: int) -> None:
        if count < skip:
            msg = (
                f"`batches` yielded {count} batches, but the write saved in "
                f"'{self.folder}' had already taken {skip}: the batches differ. "
                "Resume with the same batches, or pass `overwrite=True`."
            )
            raise ValueError(msg)

    def _check_skipped(self, digest: str) -> None:
        if digest == self.digest:
            return
        msg = (
            f"The first {self.saved_batches} batches are not those the write saved "
            f"in '{self.folder}' took from them (their token ids or masks differ): "
            "the batches differ, and must come in the same order. Resume with the "
            "same batches, or pass `overwrite=True` to start over."
        )
        raise ValueError(msg)

    def step(self, rnet: Recorder, batch: Any, index: int, source: Batches) -> int:
        """Run one batch and feed its kept tokens; return how many."""
        args, kwargs, mask = source.checked(batch, index)
        digest = source.digest(self.digest, args, kwargs, mask)
        args, kwargs = source.positions.add(*source.move(args, kwargs))
        with torch.no_grad():
            rnet(*args, **self.options, **kwargs)
        records, inputs = rnet.activations, rnet.inputs
        values = [
            record_tensor(
                pick(inputs[spec.row.label], spec)
                if spec.of_input
                else records[spec.row.label],
                spec,
            )
            for spec in self.specs
        ]
        shape = (int(values[0].shape[0]), int(values[0].shape[1]))
        keep = source.kept(mask, shape, index)
        stored: dict[str, Tensor] = {}
        recorded: dict[str, Tensor] = {}
        for spec, value in zip(self.specs, values, strict=True):
            if spec.sparse is None:
                rows, cast = take(value, keep, spec, self.dtype)
            else:  # the SAE's latents stored (for the statistics), packed
                latents, cast = spec.sparse.pack(
                    take(value, keep, spec, None)[0],
                    spec.name,
                    self.dtype,
                    kept=bool(self.moments),
                )
                rows = cast if latents is None else latents
            recorded[spec.name] = rows
            stored[spec.name] = cast.to("cpu", memory_format=torch.contiguous_format)
        where = keep.nonzero().to("cpu")
        where[:, 0] += self.rows
        stored[INDEX] = where
        kept = int(where.shape[0])
        self.consistent = False
        self.feed(stored, recorded)
        self.batches += 1
        self.rows += int(keep.shape[0])
        self.tokens_in += kept
        self.digest = digest
        self.consistent = True
        return kept

    # -- checkpoints -----------------------------------------------------

    def _state(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if self.buffer is not None:
            for name, value in self.buffer.state().items():
                out[f"buffer/{name}"] = value
        for name, values in self.pending.items():
            if values:
                out[f"pending/{name}"] = torch.cat(values)
        for name, (moments, norms) in self.moments.items():
            for key, value in moments.state().items():
                out[f"stats/{name}/{key}"] = value.to("cpu")
            for key, value in norms.state().items():
                out[f"norms/{name}/{key}"] = value.to("cpu")
        return out

    def describe(self) -> dict[str, Any]:
        """Return the progress record of this rank (what a checkpoint commits)."""
        columns = None
        if self.columns is not None:
            columns = {
                name: {"dtype": dtype_name(dtype), "shape": shape}
                for name, (dtype, shape) in self.columns.items()
            }
        return {
            "format": PROGRESS_FORMAT,
            "fingerprint": self.fingerprint,
            "part": self.part,
            "rank": self.rank,
            "batches": self.batches,
            "rows": self.rows,
            "tokens_in": self.tokens_in,
            "digest": self.digest,
            "shards": list(self.shards),
            "columns": columns,
            "complete": self.complete,
        }

    def save(self) -> None:
        """Commit a checkpoint: the state file, then the progress file."""
        record = self.describe()
        first, second = self.state_names
        name = second if self.state_name == first else first
        record["state"] = name
        state = {key: [value.contiguous()] for key, value in self._state().items()}
        write_shard(
            self.folder / name,
            state,
            {"progress": manifest_digest(record)},
            durable=self.durable,
        )
        text = json.dumps(record, indent=1, sort_keys=True)
        write_atomic(
            self.progress,
            lambda path: path.write_text(text, "utf-8"),
            durable=self.durable,
        )
        self.state_name = name
        self.committed = len(self.shards)
        self.saved_batches = self.batches
        self.since = 0

    def saved_statistics(self) -> dict[str, Tensor]:
        """Return the statistics' states, for the set's manifest (CPU tensors)."""
        return {
            key: value
            for key, value in self._state().items()
            if key.startswith(("stats/", "norms/"))
        }

    # -- resuming --------------------------------------------------------

    def _malformed(self, what: str, cause: BaseException | None = None) -> NoReturn:
        msg = (
            f"The progress file '{self.progress}' of the unfinished write in "
            f"'{self.folder}' is damaged or was edited: {what}. Pass "
            "`overwrite=True` to start the write over."
        )
        raise ValueError(msg) from cause

    def resume(self) -> bool:
        """Take the saved progress over, if any; return whether there was one.

        Shards of this rank and part that no checkpoint lists (written after
        the last one) are removed either way.
        """
        if not self.progress.is_file():
            self._remove_stale()
            return False
        try:
            record = json.loads(self.progress.read_text(encoding="utf-8"))
        except ValueError as error:
            self._malformed(f"it is not JSON ({error})", error)
        if not isinstance(record, dict) or record.get("format") != PROGRESS_FORMAT:
            self._malformed("it is not a progress file this version reads")
        saved = record.get("fingerprint")
        if saved != self.fingerprint:
            lines = differences(saved, self.fingerprint)
            msg = (
                f"'{self.folder}' holds an unfinished write with other arguments:\n"
                + "\n".join(lines)
                + "\nCall `write` with the same arguments to finish it, pass "
                "`overwrite=True` to start over (this deletes it), or use another "
                "folder."
            )
            raise ValueError(msg)
        self._validate(record)
        self._load_state(record)
        self._remove_stale()
        logger.info(
            "activations: resuming '%s' after %d batches (%d shards)",
            self.folder,
            self.batches,
            len(self.shards),
        )
        return True

    def _validate(self, record: dict[str, Any]) -> None:  # noqa: C901 (one check per field)
        for field in ("batches", "rows", "tokens_in"):
            if not is_count(record.get(field)):
                self._malformed(f"{field!r} is {record.get(field)!r}, not a count")
        if not isinstance(record.get("digest"), str):
            self._malformed(f"'digest' is {record.get('digest')!r}")
        if not isinstance(record.get("complete"), bool):
            self._malformed(f"'complete' is {record.get('complete')!r}")
        shards = record.get("shards")
        if not isinstance(shards, list):
            self._malformed(f"'shards' is {shards!r}, not a list")
        columns = record.get("columns")
        parsed: dict[str, tuple[torch.dtype, list[int]]] | None = None
        if columns is not None:
            names = {spec.name for spec in self.specs} | {INDEX}
            if not isinstance(columns, dict) or set(columns) != names:
                self._malformed(f"'columns' is {columns!r}")
            try:
                parsed = {
                    name: (
                        parse_dtype(entry["dtype"]),
                        [int(n) for n in entry["shape"]],
                    )
                    for name, entry in columns.items()
                }
            except (KeyError, TypeError, ValueError) as error:
                self._malformed(f"'columns' is {columns!r}", error)
        for number, entry in enumerate(shards):
            expected = shard_name(self.part, self.rank, number)
            if (
                not isinstance(entry, dict)
                or entry.get("file") != expected
                or not is_count(entry.get("tokens"))
                or ("crc32" in entry and not is_crc32(entry["crc32"]))
                or parsed is None
            ):
                self._malformed(f"shard {number} is {entry!r}")
            shapes = {
                name: (dtype, [int(entry["tokens"]), *shape])
                for name, (dtype, shape) in parsed.items()
            }
            problem = check_shard(self.folder / expected, shapes)
            if problem is not None:
                msg = (
                    f"The shard '{self.folder / expected}' of the unfinished write in "
                    f"'{self.folder}' is not what its progress file says ({problem}). "
                    "Pass `overwrite=True` to start the write over."
                )
                raise ValueError(msg)
        self.columns = parsed
        self.shards = [dict(entry) for entry in shards]
        self.committed = len(self.shards)
        self.batches = self.saved_batches = int(record["batches"])
        self.rows = int(record["rows"])
        self.tokens_in = int(record["tokens_in"])
        self.digest = str(record["digest"])
        self.complete = bool(record["complete"])

    def _load_state(self, record: dict[str, Any]) -> None:
        name = record.get("state")
        if name not in self.state_names:
            self._malformed(f"'state' is {name!r}")
        path = self.folder / str(name)
        try:
            with safetensors.safe_open(str(path), "pt") as file:
                metadata = file.metadata() or {}
            state = safetensors.torch.load_file(str(path))
        except (
            OSError,
            ValueError,
            RuntimeError,
            safetensors.SafetensorError,
        ) as error:
            msg = (
                f"The state file '{path}' of the unfinished write in '{self.folder}' "
                f"cannot be read ({error}). Pass `overwrite=True` to start over."
            )
            raise ValueError(msg) from error
        if metadata.get("progress") != manifest_digest(record):
            self._malformed(f"it does not match the state file '{path.name}'")
        try:
            self._take(state)
        except (KeyError, RuntimeError, ValueError) as error:
            self._malformed(
                f"the state file '{path.name}' does not fit it ({error!r})", error
            )
        self.state_name = str(name)

    def _take(self, state: dict[str, Tensor]) -> None:
        groups: dict[str, dict[str, Tensor]] = {}
        for key, value in state.items():
            head, _, rest = key.partition("/")
            groups.setdefault(head, {})[rest] = value
        if self.buffer is not None:
            self.buffer.load_state(groups.get("buffer", {}))
        pending = groups.get("pending", {})
        self.pending = {name: [value] for name, value in pending.items()}
        self.pending_rows = int(pending[INDEX].shape[0]) if pending else 0
        for name, (moments, norms) in self.moments.items():
            for holder, group in ((moments, "stats"), (norms, "norms")):
                prefix = f"{name}/"
                holder.load_state(
                    {
                        key.removeprefix(prefix): value
                        for key, value in groups.get(group, {}).items()
                        if key.startswith(prefix)
                    }
                )

    def _remove_stale(self) -> None:
        """Remove shards past the checkpoint and temporary files of this rank."""
        listed = {entry["file"] for entry in self.shards}
        shard = rf"shard-p{self.part}-r{self.rank}-\d+\.safetensors"
        own = "|".join(
            [shard, *map(re.escape, (self.progress.name, *self.state_names))]
        )
        stale = re.compile(shard)
        # another rank's temporaries are its files being written right now
        # (`write_atomic` names them `.<name>.<random>.tmp`): only ours go
        temporary = re.compile(rf"\.({own})\.[^.]+\.tmp")
        for path in self.folder.iterdir():
            if (
                stale.fullmatch(path.name) and path.name not in listed
            ) or temporary.fullmatch(path.name):
                path.unlink(missing_ok=True)

    def remove_files(self) -> None:
        """Remove this rank's progress and state files (the set is committed)."""
        for name in (self.progress.name, *self.state_names):
            (self.folder / name).unlink(missing_ok=True)
