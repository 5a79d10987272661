"""Sets written by independent workers: one part each, then :func:`merge`.

Holds :func:`write_part` (what ``write(..., part=K, parts=N)`` runs),
:func:`merge` (the set of every finished part, as one
:class:`~scio_recorder.activations.ActivationDataset`; ``scio-recorder
merge FOLDER`` calls it).

Why: a SLURM job array, a pool of Ray actors or a few spot instances never
form a :mod:`torch.distributed` process group; each worker only knows its
own part. A part is written exactly as rank ``K`` of a world of ``N``
writes its shards under ``torch.distributed`` (``_loop.RankWriter``, the
same shard names, the same shuffle streams, the same checkpoints), into a
folder of its own, ``part-<K>.partial``, renamed ``part-<K>`` once
finished: a part is replaced whole or not at all, and a re-run touches no
other part. A finished part is a set of its own (its manifest, checksums
and statistics, readable alone). The merge then does what rank 0 does once
every rank has finished: :func:`~._manifest.assemble` with every part's
shards and statistics (merged with Chan's rule, in float64). The merged
set's shards are hard links to the parts' (a copy where the file system has
none), so the merged set stays as it is while a part is re-run, until the
next merge.
"""

from __future__ import annotations

__all__ = ["merge", "part_folder", "write_part"]

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scio_recorder._support.files import differences, fsync_folder
from scio_recorder._support.lock import FolderLock
from scio_recorder._support.parts import weights_digest

from ._dataset import ActivationDataset
from ._loop import RankWriter
from ._manifest import assemble, load_statistics, model_info, read_manifest
from ._shards import check_shard
from ._tokens import INDEX

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator


SPLIT = "split"
"""The manifest key of a part: ``{"part": K, "parts": N}``."""

WEIGHTS = "weights"
"""The manifest key of a part's weights digest (:func:`weights_digest`)."""

_PART = re.compile(r"part-(\d{5,})")
_PARTIAL = re.compile(r"part-(\d{5,})\.partial")
_LOGGER = "scio_recorder.activations"


def part_folder(folder: Path, part: int) -> Path:
    """Return the folder of a finished part (``part-00003``)."""
    return folder / f"part-{part:05d}"


def _partial(folder: Path, part: int) -> Path:
    return folder / f"part-{part:05d}.partial"


def _lock(folder: Path, name: str, tool: str, option: str) -> FolderLock:
    return FolderLock(
        folder,
        name=name,
        tool=tool,
        option=option,
        files="shards and checkpoints",
        logger=_LOGGER,
        stacklevel=5,
    )


@contextlib.contextmanager
def _holding(lock: FolderLock) -> Iterator[None]:
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def write_part(
    job: Any,
    batches: Iterable[Any],
    run_writer: Callable[[Any, RankWriter, Iterable[Any]], None],
) -> ActivationDataset:
    """Write part ``job.split[0]`` of the set in ``job.folder``; return it alone.

    ``job`` is ``_write``'s description of the write, ``run_writer`` its
    loop (given, not imported: ``_write`` imports this module).
    """
    assert job.split is not None  # noqa: S101 (only called for parts)
    part, parts = job.split
    top = job.folder
    final, partial = part_folder(top, part), _partial(top, part)
    with _holding(_lock(top, f"part-{part:05d}.lock", "activation write", "part")):
        if final.is_dir() and not job.overwrite:
            done = _finished(final, job, part, parts)
            if done is not None:
                return done
        if job.overwrite and partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True)
        writer = RankWriter(
            partial,
            job.specs,
            part=0,
            rank=part,
            fingerprint=job.fingerprint,
            shard_size=job.shard_size,
            shuffle=job.shuffle_buffer,
            seed=job.seed,
            stats=job.stats,
            dtype=job.dtype,
            durable=False,
            early_exit=job.early_exit,
        )
        writer.resume()
        run_writer(job, writer, batches)
        summary = writer.describe()
        summary["tokens"] = writer.tokens
        if writer.tokens == 0:
            shutil.rmtree(partial, ignore_errors=True)
            msg = (
                f"Part {part} of {parts}: the batches gave no token to store (no "
                "batch, or every token masked out). Give every part some tokens "
                "(e.g. fewer parts than batches)."
            )
            raise ValueError(msg)
        # The ranks before and after this one hold no row in the part's own
        # manifest: its rows count from 0, and it reads as a set alone.
        empty = {"rows": 0, "tokens": 0, "shards": [], "columns": None}
        ranks = [summary if k == part else {**empty, "rank": k} for k in range(parts)]
        assemble(
            partial,
            None,
            part=0,
            fingerprint=job.fingerprint,
            ranks=ranks,
            statistics=[writer.saved_statistics()] if writer.moments else None,
            layers=[spec.name for spec in job.specs],
            calls={spec.name: spec.describe() for spec in job.specs},
            sparse={
                spec.name: spec.sparse.info(writer.dtype)
                for spec in job.specs
                if spec.sparse is not None
            },
            model=model_info(job.rnet.net),
            metadata=job.metadata,
            extra={
                SPLIT: {"part": part, "parts": parts},
                WEIGHTS: weights_digest(job.rnet.net),
            },
        )
        writer.remove_files()
        _replace(final, partial)
    return ActivationDataset(final)


def _finished(final: Path, job: Any, part: int, parts: int) -> ActivationDataset | None:
    """Return the finished part if written with the same arguments; else refuse."""
    fix = f"Pass `overwrite=True` to write part {part} anew (only its files)."
    manifest = read_manifest(final, fix=fix)
    if manifest is None:
        return None  # a folder left without its manifest: written anew
    saved = manifest["parts"][0]["fingerprint"]
    weights = weights_digest(job.rnet.net)
    lines = differences(saved, job.fingerprint)
    if manifest.get(SPLIT) != {"part": part, "parts": parts}:
        lines.append(f"- split: saved {manifest.get(SPLIT)}")
    if manifest.get(WEIGHTS) != weights:
        lines.append(f"- model weights: saved {manifest.get(WEIGHTS)}, now {weights}")
    if not lines:
        return ActivationDataset(final)
    msg = (
        f"'{final}' holds part {part} written with other arguments:\n"
        + "\n".join(lines)
        + f"\n{fix}"
    )
    raise ValueError(msg)


def _replace(final: Path, partial: Path) -> None:
    """Put the finished ``partial`` folder in the place of ``final``.

    A finished part already there is moved aside first and deleted after:
    the part is its old state or its new one, apart from the moment
    between the two renames, when it is missing (a merge then says so).
    """
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.{secrets.token_hex(6)}.old")
        final.rename(old)
    partial.rename(final)
    fsync_folder(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -------------------------------------------------------------------- merge


def _scan(folder: Path) -> tuple[dict[int, Path], set[int]]:
    """Return the finished parts' folders by number, and the unfinished parts."""
    finished: dict[int, Path] = {}
    unfinished: set[int] = set()
    if folder.is_dir():
        for path in folder.iterdir():
            if not path.is_dir():
                continue
            if (match := _PART.fullmatch(path.name)) is not None:
                finished[int(match[1])] = path
            elif (match := _PARTIAL.fullmatch(path.name)) is not None:
                unfinished.add(int(match[1]))
    return finished, unfinished


def _read_parts(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Return every part's folder and manifest, in part order, checked."""
    finished, unfinished = _scan(folder)
    if not finished:
        msg = (
            f"'{folder}' holds no finished part (no part-<K> folder"
            + (f"; parts {sorted(unfinished)} are unfinished" if unfinished else "")
            + "): write the parts with `write(..., part=K, parts=N)` first."
        )
        raise FileNotFoundError(msg)
    manifests: dict[int, dict[str, Any]] = {}
    for number, path in sorted(finished.items()):
        fix = (
            f"Write part {number} again with `write(..., part={number}, "
            "overwrite=True)`."
        )
        manifest = read_manifest(path, fix=fix)
        split = None if manifest is None else manifest.get(SPLIT)
        if manifest is None or split is None or split.get("part") != number:
            msg = f"'{path}' is not a finished part {number} of a set. {fix}"
            raise ValueError(msg)
        manifests[number] = manifest
    first = min(manifests)
    parts = manifests[first][SPLIT]["parts"]
    for number, manifest in manifests.items():
        if manifest[SPLIT]["parts"] != parts:
            msg = (
                f"Part {number} in '{finished[number]}' was written as one of "
                f"{manifest[SPLIT]['parts']} parts, part {first} as one of "
                f"{parts}: write every part with the same `parts`."
            )
            raise ValueError(msg)
    missing = [k for k in range(parts) if k not in manifests]
    if missing:
        words = ", ".join(map(str, missing))
        running = sorted(set(missing) & unfinished)
        msg = (
            f"The set in '{folder}' has {parts} parts, and part"
            f"{'s' if len(missing) > 1 else ''} {words} "
            f"{'are' if len(missing) > 1 else 'is'} missing"
            + (
                f" (part{'s' if len(running) > 1 else ''} "
                f"{', '.join(map(str, running))} unfinished: interrupted, or "
                "still running)"
                if running
                else ""
            )
            + ": write "
            + ("them" if len(missing) > 1 else "it")
            + " with `write(..., part=K, parts="
            + f"{parts})`, then merge again."
        )
        raise ValueError(msg)
    return [(finished[k], manifests[k]) for k in range(parts)]


def _check_same(parts: list[tuple[Path, dict[str, Any]]]) -> None:
    """Refuse a part written with other layers, dtype, model or arguments."""
    base = parts[0][1]
    for number, (path, manifest) in enumerate(parts[1:], start=1):
        lines = differences(
            base["parts"][0]["fingerprint"], manifest["parts"][0]["fingerprint"]
        )
        for key in ("class", "name_or_path"):
            if base["model"].get(key) != manifest["model"].get(key):
                lines.append(
                    f"- model {key}: part 0 {base['model'].get(key)!r}, "
                    f"part {number} {manifest['model'].get(key)!r}"
                )
        old, new = base["model"].get("config"), manifest["model"].get("config")
        if old != new:
            found = differences(old, new) if isinstance(new, dict) else []
            lines.extend(
                f"- model config {line.removeprefix('- ')}"
                for line in found or [f"- : {old!r} and {new!r}"]
            )
        lines.extend(
            f"- layer {name}: part 0 {base['layers'].get(name)}, part {number} "
            f"{manifest['layers'].get(name)}"
            for name in sorted(set(base["layers"]) | set(manifest["layers"]))
            if base["layers"].get(name) != manifest["layers"].get(name)
        )
        if base.get(WEIGHTS) != manifest.get(WEIGHTS):
            lines.append(
                f"- model weights: part 0 {base.get(WEIGHTS)}, part {number} "
                f"{manifest.get(WEIGHTS)} (digests of sampled values: another "
                "checkpoint)"
            )
        if base.get("metadata") != manifest.get("metadata"):
            lines.append(
                f"- metadata: part 0 {base.get('metadata')!r}, part {number} "
                f"{manifest.get('metadata')!r}"
            )
        if lines:
            msg = (
                f"Part {number} in '{path}' was not written as part 0 was "
                "(saved: part 0's, now: this part's):\n"
                + "\n".join(lines)
                + f"\nWrite part {number} again with the arguments of the "
                "others (`overwrite=True`), or every part anew."
            )
            raise ValueError(msg)


def _summary(path: Path, manifest: dict[str, Any], number: int) -> dict[str, Any]:
    """Return part ``number`` as the summary its rank would have sent to rank 0."""
    shards = [entry for entry in manifest["shards"] if entry["rank"] == number]
    columns = {
        name: {"dtype": entry["dtype"], "shape": entry["shape"]}
        for name, entry in manifest["layers"].items()
    }
    columns[INDEX] = {"dtype": "int64", "shape": [2]}
    for entry in shards:
        shapes = {
            name: (_dtype(info["dtype"]), [int(entry["tokens"]), *info["shape"]])
            for name, info in columns.items()
        }
        problem = check_shard(path / entry["file"], shapes)
        if problem is not None:
            msg = (
                f"The shard '{path / entry['file']}' of part {number} is not what "
                f"its manifest says ({problem}). Write part {number} again with "
                f"`write(..., part={number}, overwrite=True)`."
            )
            raise ValueError(msg)
    return {
        "rank": number,
        "rows": manifest["parts"][0]["rank_rows"][number],
        "tokens": manifest["tokens"],
        "shards": [
            {key: entry[key] for key in ("file", "tokens", "crc32") if key in entry}
            for entry in shards
        ],
        "columns": columns,
    }


def _dtype(name: str) -> Any:
    from scio_recorder._support.files import parse_dtype  # noqa: PLC0415 (one use)

    return parse_dtype(name)


def _link(source: Path, target: Path) -> None:
    """Make ``target`` the file ``source`` is (a hard link; else a copy), atomically."""
    with contextlib.suppress(FileNotFoundError):
        if source.samefile(target):
            return
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    try:
        try:
            os.link(source, temporary)
        except OSError:  # a file system without hard links
            shutil.copyfile(source, temporary)
        temporary.replace(target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def merge(folder: str | os.PathLike[str]) -> ActivationDataset:
    """Merge the parts written by ``write(..., part=K, parts=N)`` into one set.

    Every part ``0`` to ``N - 1`` must be finished (a missing or
    unfinished part is named), and written with the same layers, dtype,
    model (class, name, config and :func:`weights_digest`) and arguments
    as part 0 (a part that
    differs is named with what differs). The set's manifest lists every
    part's shards in part order, part 0's rows first (each part's row
    numbers follow the rows of the parts before it); the statistics are
    merged with Chan's rule in float64, as ranks' are under
    :mod:`torch.distributed`; the shards are hard links to the parts'
    (copies on a file system without hard links). Merging again gives the
    same set; after a part is re-run, the same set if the part's tokens
    are the same. No process group is created.

    Parameters
    ----------
    folder : str or os.PathLike
        The folder the parts were written to (the ``path`` of ``write``).

    Returns
    -------
    ActivationDataset
        The merged set, memory mapped.

    Raises
    ------
    FileNotFoundError
        If the folder holds no finished part.
    ValueError
        If a part is missing, damaged, or written with other arguments.
    RuntimeError
        When a write or a merge holds the folder, or a part being written.

    Examples
    --------
    >>> import tempfile, torch, transformers
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.activations import merge, write
    >>> _ = torch.manual_seed(0)
    >>> model = transformers.GPT2Model(
    ...     transformers.GPT2Config(
    ...         n_layer=1,
    ...         n_embd=8,
    ...         n_head=2,
    ...         vocab_size=20,
    ...         n_positions=16,
    ...         bos_token_id=0,
    ...         eos_token_id=0,
    ...     )
    ... ).eval()
    >>> ids = torch.randint(0, 20, (4, 5))
    >>> rnet = Recorder(model, input_data={"input_ids": ids[:1]})
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     for k in range(2):  # two workers, each knowing only its part
    ...         _ = write(
    ...             rnet,
    ...             [ids[2 * k : 2 * k + 2]],
    ...             folder,
    ...             layers=["h.0"],
    ...             mask=None,
    ...             part=k,
    ...             parts=2,
    ...         )
    ...     ds = merge(folder)
    ...     len(ds), ds.index[[0, -1]].tolist()
    (20, [[0, 0], [3, 4]])

    """
    top = Path(folder)
    if not top.is_dir():
        msg = f"'{top}' is not a folder: give the folder the parts were written to."
        raise FileNotFoundError(msg)
    with _holding(_lock(top, "write.lock", "activation merge", "folder")):
        parts = _read_parts(top)
        locks = [
            _lock(top, f"part-{k:05d}.lock", "activation merge", "folder")
            for k in range(len(parts))
        ]
        with contextlib.ExitStack() as stack:
            for lock in locks:  # no part is replaced while it is read
                stack.enter_context(_holding(lock))
            return _merge(top, _read_parts(top))


def _previous(top: Path) -> set[str]:
    """Return the files of the set a merge replaces; refuse any other set.

    A set that is not a merge of parts (written by ``write`` without
    ``part``, or appended to after its merge) is never replaced: its tokens
    would be lost.
    """
    fix = "Delete its manifest.json to merge the parts again."
    previous = read_manifest(top, fix=fix)
    if previous is None:
        return set()
    if previous.get(SPLIT) is None or len(previous["parts"]) != 1:
        msg = (
            f"'{top}' holds a set that is not a merge of its parts (written "
            "without `part=`, or appended to after its merge): merging would "
            "replace it and lose its tokens. Merge the parts in a folder of "
            "their own, or move the set away."
        )
        raise ValueError(msg)
    files = {str(entry["file"]) for entry in previous["shards"]}
    if previous.get("stats"):
        files.add(str(previous["stats"]))
    return files


def _merge(top: Path, parts: list[tuple[Path, dict[str, Any]]]) -> ActivationDataset:
    _check_same(parts)
    previous = _previous(top)
    base = parts[0][1]
    summaries = [
        _summary(path, manifest, number)
        for number, (path, manifest) in enumerate(parts)
    ]
    statistics = None
    if base.get("stats") is not None:
        statistics = [
            load_statistics(
                path,
                manifest,
                fix=f"Write part {number} again with `write(..., part={number}, "
                "overwrite=True)`.",
            )
            for number, (path, manifest) in enumerate(parts)
        ]
    listed: set[str] = set()
    for (path, _), summary in zip(parts, summaries, strict=True):
        for entry in summary["shards"]:
            _link(path / entry["file"], top / entry["file"])
            listed.add(entry["file"])
    manifest = assemble(
        top,
        None,
        part=0,
        fingerprint=base["parts"][0]["fingerprint"],
        ranks=summaries,
        statistics=statistics,
        layers=list(base["layers"]),
        calls={name: entry.get("call") for name, entry in base["layers"].items()},
        sparse={
            name: entry["sparse"]
            for name, entry in base["layers"].items()
            if "sparse" in entry
        },
        model=base["model"],
        metadata=base.get("metadata"),
        extra={SPLIT: {"parts": len(parts)}, WEIGHTS: base.get(WEIGHTS)},
    )
    for name in previous - listed - {manifest.get("stats")}:  # the earlier merge's
        (top / name).unlink(missing_ok=True)
    return ActivationDataset(top)
