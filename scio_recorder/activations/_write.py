"""The entry point :func:`write`: options, the folder's state, ranks, the manifest.

:func:`write` runs in three stages. :func:`_prepare` checks its options,
resolves the layers (``_tokens``) and describes the write (a :class:`_Job`,
which holds the folder's lock while the write runs: one write at a time,
:class:`scio_recorder._support.lock.FolderLock`). :func:`_execute` decides what the
folder's state asks (a finished set with the same arguments is returned;
other arguments are refused; an unfinished write resumes; ``append=True``
starts a new part) and runs this rank's :class:`~._loop.RankWriter`.
:func:`_finish` adds the part to the set's manifest (``_manifest``): under
:mod:`torch.distributed`, rank 0 does so once every rank has finished,
with every rank's shards and statistics.
"""

from __future__ import annotations

__all__ = ["write"]

import contextlib
import dataclasses
import json
import logging
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch

from scio_recorder._engine.shards import tensor_parallel
from scio_recorder._run.batches import (
    POSITION_IDS,
    batch_getter,
    check_position_ids,
    padding_unwatched,
)
from scio_recorder._run.fingerprint import describe_spec
from scio_recorder._support.files import differences, dtype_name, parse_dtype
from scio_recorder._support.lock import FolderLock
from scio_recorder._support.parts import check_part, refuse_process_group
from scio_recorder._support.progress import make_bar
from scio_recorder._support.ranks import all_gather_bytes, comm_device, rank_and_world

from ._dataset import ActivationDataset
from ._loop import RankWriter, progress_name
from ._manifest import assemble, model_info, read_manifest
from ._parts import write_part
from ._tokens import INDEX, Batches, describe_layers, resolve_layers

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable, Iterator

    from scio_recorder.recorder import Recorder

    from ._tokens import LayerSpec

logger = logging.getLogger("scio_recorder.activations")

SHARD_BYTES = 1 << 27
"""The default size of a shard (128 MiB), from the layers' sizes in the table."""

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_OURS = re.compile(
    r"(manifest\.json|stats-p\d+\.safetensors|shard-p\d+-r\d+-\d+\.safetensors"
    r"|progress-p\d+-r\d+(\.json|-[ab]\.safetensors)|write(-r\d+)?\.lock"
    r"|\..*\.tmp)"
)


def _check_options(  # noqa: PLR0913 (one check per option)
    *,
    dtype: object,
    seed: object,
    shuffle_buffer: object,
    skip_bos: object,
    stats: object,
    overwrite: object,
    append: object,
    shard_size: object,
    progress: object,
    metadata: object,
    mask: object,
    early_exit: object,
) -> None:
    if dtype is not None and dtype not in _FLOATS:
        msg = (
            f"`dtype` must be None (each layer's own dtype) or one of "
            f"torch.bfloat16, torch.float16, torch.float32, torch.float64; got "
            f"{dtype!r}"
        )
        raise TypeError(msg)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        msg = f"`seed` must be an int >= 0, got {seed!r}"
        raise ValueError(msg)
    for name, value in (("shuffle_buffer", shuffle_buffer), ("shard_size", shard_size)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            msg = f"`{name}` must be None or a number of tokens >= 1, got {value!r}"
            raise ValueError(msg)
    _check_flags(skip_bos=skip_bos, stats=stats, overwrite=overwrite, append=append)
    for name, value in (("progress", progress), ("early_exit", early_exit)):
        if value is not None and not isinstance(value, bool):
            msg = f"`{name}` must be None, True or False, got {value!r}"
            raise TypeError(msg)
    if metadata is not None:
        _check_metadata(metadata)
    if mask is not None:
        batch_getter(mask, "mask")


def _check_flags(**flags: object) -> None:
    """Refuse a flag that is not a bool, and ``overwrite`` with ``append``."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            msg = f"`{name}` must be True or False, got {value!r}"
            raise TypeError(msg)
    if flags["overwrite"] and flags["append"]:
        msg = (
            "`overwrite=True` deletes the set and `append=True` adds to it: pass "
            "one of them."
        )
        raise ValueError(msg)


def _check_metadata(metadata: object) -> None:
    """Refuse metadata that strict JSON cannot hold."""
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as error:
        msg = f"`metadata` must be JSON (dicts, lists, str, numbers): {error}"
        raise TypeError(msg) from error
    where = _non_finite(metadata, "metadata")
    if where is not None:
        msg = (
            f"`{where[0]}` is {where[1]!r}, which strict JSON has no number "
            "for: `manifest.json` would be refused by strict JSON readers. "
            "Store it as a string (e.g. 'nan') or as null."
        )
        raise ValueError(msg)


def _non_finite(value: object, where: str) -> tuple[str, float] | None:
    """Return the path and value of the first NaN or infinity in JSON ``value``."""
    if isinstance(value, float) and not math.isfinite(value):
        return where, value
    if isinstance(value, dict):
        items: Iterable[tuple[object, object]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _non_finite(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def default_shard_size(specs: list[LayerSpec], dtype: torch.dtype | None) -> int:
    """Tokens per shard: about :data:`SHARD_BYTES`, from the table's sizes."""
    size = 4 if dtype is None else torch.empty((), dtype=dtype).element_size()
    per_token = 16  # the index
    for spec in specs:
        if spec.sparse is not None:
            per_token += spec.sparse.row_bytes(dtype)
            continue
        shape = spec.row.input_size if spec.of_input else spec.row.output_size
        if isinstance(shape, list) and shape and isinstance(shape[0], list):
            shape = shape[0]
        known = isinstance(shape, list) and all(isinstance(n, int) for n in shape)
        width = math.prod(shape[2:]) if known and len(shape) > 2 else 1024  # noqa: PLR2004 (batch, positions, ...)
        per_token += width * size
    return max(1024, SHARD_BYTES // per_token // 1024 * 1024)


def _fingerprint(  # noqa: PLR0913 (what makes a set)
    rnet: Recorder,
    specs: list[LayerSpec],
    *,
    dtype: torch.dtype | None,
    seed: int,
    shuffle_buffer: int | None,
    skip_bos: bool,
    stats: bool,
    input: Any,  # noqa: A002 (the documented name)
    mask: Any,
    shard_size: int,
    world: int,
    position_ids: str | None,
) -> dict[str, Any]:
    net = type(rnet.net)
    # Only when derived: a set written without derived position ids (before
    # the option, or with `position_ids=None`) keeps its fingerprint.
    derived = {} if position_ids is None else {"position_ids": position_ids}
    return derived | {
        "model": f"{net.__module__}.{net.__qualname__}",
        "layers": describe_layers(specs),
        "dtype": None if dtype is None else dtype_name(dtype),
        "seed": seed,
        "shuffle_buffer": shuffle_buffer,
        "skip_bos": skip_bos,
        "stats": stats,
        "input": describe_spec(input),
        "mask": describe_spec(mask),
        "shard_size": shard_size,
        "world": world,
    }


def _clear(folder: Path) -> None:
    """Delete the files a write made in ``folder`` (locks aside), nothing else."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if _OURS.fullmatch(path.name) and not path.name.endswith(".lock"):
            path.unlink(missing_ok=True)


def _foreign(folder: Path) -> list[str]:
    """Files in ``folder`` that no write of the library made."""
    if not folder.is_dir():
        return []
    return sorted(
        path.name for path in folder.iterdir() if not _OURS.fullmatch(path.name)
    )


def _barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()


def write(  # noqa: PLR0913 (the documented options)
    rnet: Recorder,
    batches: Iterable[Any],
    path: str | os.PathLike[str],
    *,
    layers: Any,
    mask: Any = "attention_mask",
    dtype: torch.dtype | None = None,
    seed: int = 0,
    shuffle_buffer: int | None = None,
    skip_bos: bool = False,
    input: Any = None,  # noqa: A002 (the documented name)
    stats: bool = False,
    overwrite: bool = False,
    append: bool = False,
    shard_size: int | None = None,
    device: torch.device | str | None = None,
    progress: bool | None = None,
    metadata: Any = None,
    position_ids: str | None = POSITION_IDS,
    early_exit: bool | None = None,
    part: int | None = None,
    parts: int | None = None,
) -> ActivationDataset:
    """Write the activations of several layers over a token stream to a folder.

    Each batch goes through ``rnet`` once (one forward for every layer,
    under :func:`torch.no_grad`); from each layer's record, the tokens the
    padding mask keeps are written, with their ``(row, column)``, to
    safetensors shards in ``path``, listed by ``path/manifest.json``. Read
    the set back with :class:`ActivationDataset` (which this returns).

    Parameters
    ----------
    rnet : Recorder
        The recorder wrapping the model. Its selection is restored at the end.
    batches : iterable
        Batches of token ids: mappings of the net's keyword inputs (dicts, a
        tokenizer's ``BatchEncoding``) or tensors of ids ``[batch, positions]``.
        To resume, the same batches in the same order.
    path : str or os.PathLike
        The folder of the set (created if needed).
    layers : list of selectors, or dict
        The layers to store, each a selector that picks exactly one call of
        the forward (a label, a qualified name, ``(name, k)``, ...; a module
        called twice needs ``(name, k)``), stored under its name: a
        qualified name as given, a label as ``"depth-idx"``, ``(name, k)``
        as ``"name:k"``. An :class:`~scio_recorder.collect.InputOf` stores
        the input of a call (``InputOf("...o_proj")``: every attention
        head's output side by side, see :mod:`scio_recorder.heads`) as
        ``"name:input"``. A dict ``{name: selector}`` chooses the names.
        Each layer's record must be ``[batch, positions, ...]``; trailing
        dimensions are flattened into one vector per token.
    mask : str, int, callable or None, default "attention_mask"
        The padding mask's entry in each batch (1 or True: keep; 0:
        padding), as a key, an index or ``mask(batch)``. ``None``: every
        token is kept (refused if a batch holds the config's
        ``pad_token_id``). A batch without the entry is refused, naming it.
    dtype : torch.dtype, optional
        Store every layer in this floating dtype (bfloat16, float16,
        float32); ``None`` keeps each layer's dtype. A cast that overflows
        (float16 beyond 65504) is refused, naming the layer.
    seed : int, default 0
        The seed of the shuffle.
    shuffle_buffer : int, optional
        ``None`` writes tokens in order (rows, then positions). An int
        shuffles across the whole set with a buffer of that many tokens
        (each arriving token takes a random slot and the one there is
        written; at the end the buffer is written in a random order): a
        permutation of the unshuffled set, reproducible from ``seed``; a
        buffer larger than the set gives a uniform permutation.
    skip_bos : bool, default False
        Drop the first kept token of each row.
    input : int, str, callable or None, default None
        ``None`` passes a mapping batch as keyword arguments and a tensor as
        the one positional input; the other forms are :func:`collect`'s.
    stats : bool, default False
        Compute each layer's mean, population variance and mean L2 norm per
        token, in float64 from the values before the cast (``ds.stats``):
        those stored, so for :class:`SparseLatents` the latents read back
        dense (the ``k`` kept, zeros elsewhere).
    overwrite : bool, default False
        Delete the set in ``path`` (its own files only) and write it anew.
    append : bool, default False
        Add this token stream to the finished set in ``path`` as a new part
        (same layers, dtypes and ``stats``; shuffled within the part). Rows
        of the index go on counting from the set's. An unfinished part
        resumes.
    shard_size : int, optional
        Tokens per shard; default: about 128 MiB of rows.
    device : torch.device or str, optional
        Move each batch's tensors here before the pass.
    progress : bool, optional
        A tqdm bar in tokens/s on stderr (default: when stderr is a terminal,
        on rank 0).
    metadata : JSON, optional
        Stored in the manifest as ``"metadata"`` (the tokenizer's name, the
        corpus, ...).
    position_ids : {"from_mask", None}, default "from_mask"
        ``"from_mask"``: when the net's forward takes ``position_ids`` and
        ``attention_mask`` and a batch has a 2-D ``attention_mask`` and no
        ``position_ids``, give it ``attention_mask.cumsum(-1) - 1`` (0 at
        the padding), as Hugging Face's ``generate`` does, so that a row's
        tokens are numbered from 0 whatever its padding: left or right
        padding give the row's activations alone. Models that number padded
        rows themselves (RoBERTa's family, OPT, encoder-decoders) are left
        as they are. ``None``: batches are passed as they are (GPT-2 or
        BERT then number a left-padded row's tokens from its padding).
    early_exit : bool, optional
        Stop each pass once every stored layer has been recorded (see
        ``rnet(x, early_exit=True)``): the layers after the last stored one
        do not run, and the set is that of full passes. ``None`` (the
        default): stop early unless a stored layer is the net's output (the
        root row, depth 0). ``True``: always (refused as by the recorder).
        ``False``: full passes. Layers that do not run have no side effect
        either (a ``BatchNorm`` after the last stored layer does not update
        its running statistics in train mode).
    part, parts : int, optional
        Write part ``part`` (0 to ``parts - 1``) of a set written by
        ``parts`` independent workers, with no process group and no
        knowledge of the others (a SLURM array task, a Ray actor, a plain
        process): it goes to ``path/part-<part>`` (written in
        ``path/part-<part>.partial``, renamed when finished, so a part is
        replaced whole or not at all, and never another's), with its own
        checksums and statistics; :func:`merge` then makes the set of every
        part, part 0's rows first. Give both or neither. A finished part
        with the same arguments is returned as it is; an unfinished one
        resumes; ``overwrite=True`` writes the part anew (only its files).
        See "Many machines" in ``docs/activations.md``.

    Returns
    -------
    ActivationDataset
        The set, memory mapped (with ``part``: the part alone, its rows
        counted from 0).

    Raises
    ------
    ValueError
        For a bad option or layer (one that selects several calls), a folder
        holding a set or an unfinished write with other arguments (naming
        the folder and the differences), batches that differ from a resumed
        write's, a mask of the wrong shape, padding without a mask, a dtype
        that overflows, no token at all.
    TypeError, KeyError
        For a batch without the mask entry, options of the wrong type.
    OSError
        For a full disk: the shards committed so far stay valid, and a new
        call with the same arguments resumes after them.
    RuntimeError
        When another write holds the folder's lock.

    Examples
    --------
    >>> import tempfile, torch, transformers
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.activations import write
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(
    ...     n_layer=2,
    ...     n_embd=16,
    ...     n_head=2,
    ...     vocab_size=50,
    ...     n_positions=32,
    ...     bos_token_id=0,
    ...     eos_token_id=0,
    ... )
    >>> model = transformers.GPT2Model(config).eval()
    >>> ids = torch.randint(0, 50, (4, 8))
    >>> mask = torch.ones(4, 8, dtype=torch.long)
    >>> mask[0, :3] = 0  # left padding in the first row
    >>> rnet = Recorder(model, input_data={"input_ids": ids[:1]})
    >>> batches = [
    ...     {"input_ids": ids[:2], "attention_mask": mask[:2]},
    ...     {"input_ids": ids[2:], "attention_mask": mask[2:]},
    ... ]
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     ds = write(rnet, batches, folder, layers=["h.0", "h.1"], shuffle_buffer=8)
    ...     len(ds), ds.layers, ds[0]["h.1"].shape, ds.index.shape
    (29, ('h.0', 'h.1'), torch.Size([16]), torch.Size([29, 2]))

    """
    check_part(part, parts, append=append)
    job = _prepare(
        rnet,
        path,
        split=None if part is None or parts is None else (part, parts),
        layers=layers,
        mask=mask,
        dtype=dtype,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        skip_bos=skip_bos,
        input=input,
        stats=stats,
        overwrite=overwrite,
        append=append,
        shard_size=shard_size,
        device=device,
        progress=progress,
        metadata=metadata,
        position_ids=position_ids,
        early_exit=early_exit,
    )
    if job.split is not None:
        return write_part(job, batches, run_writer)
    with job.holding():
        added = _execute(job, batches)
        if added is not None:
            _finish(job, added)
    return ActivationDataset(job.folder)


@dataclasses.dataclass
class _Job:
    """A write as :func:`_prepare` describes it: nothing read or written yet."""

    rnet: Recorder
    specs: list[LayerSpec]
    source: Batches
    folder: Path
    rank: int
    world: int
    fingerprint: dict[str, Any]
    """What makes the set: the same in every part, checked on resume."""
    shard_size: int
    dtype: torch.dtype | None
    seed: int
    shuffle_buffer: int | None
    stats: bool
    overwrite: bool
    append: bool
    progress: bool | None
    metadata: Any
    position_ids: str | None
    early_exit: bool
    split: tuple[int, int] | None = None
    """``(part, parts)``: one part of a set written by independent workers."""

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the folder's lock (one write at a time) while the write runs.

        A folder the write created is removed again if it is left empty (a
        refused write leaves no folder behind).
        """
        world, rank, folder = self.world, self.rank, self.folder
        lock = FolderLock(
            folder,
            name="write.lock" if world == 1 else f"write-r{rank}.lock",
            tool="activation write",
            option="path",
            files="shards and checkpoints",
            logger="scio_recorder.activations",
        )
        created = not folder.exists()
        lock.acquire()
        try:
            yield
        finally:
            lock.release()
            if created and world == 1 and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


@dataclasses.dataclass
class _Part:
    """The part a write added: its writer, its index, the set's manifest before."""

    writer: RankWriter
    index: int
    previous: dict[str, Any] | None


def _prepare(  # noqa: PLR0913 (write's options)
    rnet: Recorder,
    path: str | os.PathLike[str],
    *,
    split: tuple[int, int] | None = None,
    layers: Any,
    mask: Any,
    dtype: torch.dtype | None,
    seed: int,
    shuffle_buffer: int | None,
    skip_bos: bool,
    input: Any,  # noqa: A002 (write's name)
    stats: bool,
    overwrite: bool,
    append: bool,
    shard_size: int | None,
    device: torch.device | str | None,
    progress: bool | None,
    metadata: Any,
    position_ids: str | None,
    early_exit: bool | None,
) -> _Job:
    """Check the options, resolve the layers, and describe the write."""
    _check_options(
        dtype=dtype,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        skip_bos=skip_bos,
        stats=stats,
        overwrite=overwrite,
        append=append,
        shard_size=shard_size,
        progress=progress,
        metadata=metadata,
        mask=mask,
        early_exit=early_exit,
    )
    check_position_ids(position_ids)
    specs = resolve_layers(rnet, layers)
    if early_exit is None:  # stop early unless the net's output is stored
        early_exit = all(spec.of_input or spec.row.label[0] != 0 for spec in specs)
    source = Batches(
        rnet,
        input=input,
        mask=mask,
        skip_bos=skip_bos,
        device=None if device is None else torch.device(device),
        position_ids=position_ids,
    )
    # Tensor parallelism: every rank runs the same batches and holds the same
    # whole records, so each rank writes a set of its own (to its own folder).
    placed = None if tensor_parallel(rnet.net) else rank_and_world()
    rank, world = placed if placed is not None else (0, 1)
    if split is not None:  # a part is written as rank `part` of `parts`
        refuse_process_group(world)
        rank, world = split
    size = shard_size if shard_size is not None else default_shard_size(specs, dtype)
    fingerprint = _fingerprint(
        rnet,
        specs,
        dtype=dtype,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        skip_bos=skip_bos,
        stats=stats,
        input=input,
        mask=mask,
        shard_size=size,
        world=world,
        position_ids=position_ids,
    )
    if split is not None:
        fingerprint["parts"] = split[1]
    return _Job(
        rnet,
        specs,
        source,
        Path(path),
        rank,
        world,
        fingerprint,
        size,
        dtype=dtype,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        stats=stats,
        overwrite=overwrite,
        append=append,
        progress=progress,
        metadata=metadata,
        position_ids=position_ids,
        early_exit=early_exit,
        split=split,
    )


def _execute(job: _Job, batches: Iterable[Any]) -> _Part | None:
    """Write this rank's part of the set (``None``: the set is there already).

    What the folder holds decides: a finished set with the same arguments
    is kept as it is; one with other arguments is refused (unless
    ``append``); an unfinished write resumes. The recorder selects exactly
    the stored layers during the loop, and its selection comes back after.
    """
    folder, specs = job.folder, job.specs
    manifest = _read_folder(
        folder, overwrite=job.overwrite, append=job.append, rank=job.rank
    )
    index, expected = 0, None
    if manifest is not None:
        first = manifest["parts"][0]["fingerprint"]
        if not job.append:
            if first == job.fingerprint:
                _barrier(job.world)
                return None
            lines = differences(first, job.fingerprint)
            msg = (
                f"'{folder}' holds an activation set written with other "
                "arguments:\n" + "\n".join(lines) + "\nPass `overwrite=True` to "
                "write it anew (this deletes it), `append=True` to add these "
                "tokens to it, or use another folder."
            )
            raise ValueError(msg)
        index = len(manifest["parts"])
        expected = _check_append(manifest, job.fingerprint, specs, folder)
    _barrier(job.world)
    writer = RankWriter(
        folder,
        specs,
        part=index,
        rank=job.rank,
        fingerprint=job.fingerprint,
        shard_size=job.shard_size,
        shuffle=job.shuffle_buffer,
        seed=job.seed,
        stats=job.stats,
        dtype=job.dtype,
        durable=False,
        expected=expected,
        early_exit=job.early_exit,
    )
    writer.resume()
    run_writer(job, writer, batches)
    return _Part(writer, index, manifest)


def run_writer(job: _Job, writer: RankWriter, batches: Iterable[Any]) -> None:
    """Run ``writer`` over the batches, with exactly the stored layers selected."""
    rnet, specs = job.rnet, job.specs
    bar = make_bar(
        progress=job.progress if job.progress is not None or job.rank == 0 else False,
        total=None,
        initial=writer.tokens_in,
        desc=f"write {len(specs)} layer{'s' if len(specs) != 1 else ''}",
        unit="tok",
    )
    try:
        with (
            rnet.selecting(
                *(spec.row.label for spec in specs if not spec.of_input),
                inputs=[spec.row.label for spec in specs if spec.of_input],
            ),
            padding_unwatched(rnet, job.position_ids),
        ):
            writer.run(rnet, batches, job.source, bar)
    finally:
        if bar is not None:
            bar.close()


def _read_folder(
    folder: Path, *, overwrite: bool, append: bool, rank: int
) -> dict[str, Any] | None:
    """Return the set's checked manifest (``None``: none), or refuse the folder.

    ``overwrite`` clears it (rank 0); a folder with files of others, or an
    unfinished write asked to ``append``, is refused.
    """
    fix = (
        "Pass `overwrite=True` to write the set anew (this deletes it), or "
        "use another folder."
    )
    manifest = None if overwrite else read_manifest(folder, fix=fix)
    if overwrite:
        if rank == 0:
            _clear(folder)
    elif manifest is None and not (folder / progress_name(0, rank)).is_file():
        foreign = _foreign(folder)
        if foreign:
            msg = (
                f"'{folder}' holds files that are not an activation set "
                f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): "  # noqa: PLR2004
                "write a set into a new or empty folder."
            )
            raise ValueError(msg)
    if append and manifest is None and (folder / progress_name(0, rank)).is_file():
        msg = (
            f"'{folder}' holds an unfinished write (interrupted before its "
            "set was finished), not a set to append to: call `write` again "
            "with that write's arguments and batches, without `append=True`, "
            "to resume and finish it, then append; or pass `overwrite=True` "
            "to start over (this deletes it)."
        )
        raise ValueError(msg)
    return manifest


def _check_append(
    manifest: dict[str, Any],
    fingerprint: dict[str, Any],
    specs: list[LayerSpec],
    folder: Path,
) -> dict[str, tuple[torch.dtype, list[int]]]:
    """Refuse an append that does not fit the set; return its columns."""
    first = manifest["parts"][0]["fingerprint"]
    for key in ("model", "layers", "stats"):
        if first.get(key) != fingerprint.get(key):
            lines = differences({key: first.get(key)}, {key: fingerprint.get(key)})
            msg = (
                f"Cannot append to the set in '{folder}': its {key} differ:\n"
                + "\n".join(lines)
                + "\nAppend with the same layers and `stats`, or write another set."
            )
            raise ValueError(msg)
    columns = {
        name: (parse_dtype(entry["dtype"]), list(entry["shape"]))
        for name, entry in manifest["layers"].items()
    }
    dtype = fingerprint.get("dtype")
    for spec in specs:
        if spec.sparse is not None:
            info = spec.sparse.info(None if dtype is None else parse_dtype(dtype))
            if manifest["layers"][spec.name].get("sparse") != info:
                msg = (
                    f"Cannot append to the set in '{folder}': layer {spec.name!r} "
                    f"is stored as {manifest['layers'][spec.name].get('sparse')}, "
                    f"not {info}: append with the set's `dtype`."
                )
                raise ValueError(msg)
            continue
        stored = columns[spec.name][0]
        if dtype is not None and dtype != dtype_name(stored):
            msg = (
                f"Cannot append to the set in '{folder}': layer {spec.name!r} is "
                f"stored as {dtype_name(stored)}, not {dtype}: pass "
                f"`dtype=torch.{dtype_name(stored)}`."
            )
            raise ValueError(msg)
    columns[INDEX] = (torch.int64, [2])
    return columns


def _finish(job: _Job, part: _Part) -> None:
    """Add this part to the manifest (rank 0, with every rank's shards)."""
    writer, previous = part.writer, part.previous
    world, fingerprint = job.world, job.fingerprint
    summary = writer.describe()
    summary["tokens"] = writer.tokens
    statistics = writer.saved_statistics() if writer.moments else None
    if world > 1:
        device = comm_device()
        summaries = [
            json.loads(raw)
            for raw in all_gather_bytes(json.dumps(summary).encode(), device)
        ]
        if any(s["fingerprint"] != fingerprint for s in summaries):
            msg = (
                "`write` was called with different arguments on different ranks; "
                "every rank must call it with the same ones."
            )
            raise RuntimeError(msg)
        payload = safetensors.torch.save(statistics) if statistics is not None else b""
        gathered = all_gather_bytes(payload, device)
        states = (
            [safetensors.torch.load(raw) for raw in gathered]
            if statistics is not None
            else None
        )
    else:
        summaries = [summary]
        states = [statistics] if statistics is not None else None
    total = sum(int(s["tokens"]) for s in summaries)
    if total == 0 and previous is None:
        writer.remove_files()  # refused: no unfinished write is left behind
        msg = (
            "The batches gave no token to store (no batch, or every token masked "
            "out): there is no set to write."
        )
        raise ValueError(msg)
    if job.rank == 0:
        specs = job.specs
        assemble(
            job.folder,
            previous,
            part=part.index,
            fingerprint=fingerprint,
            ranks=summaries,
            statistics=states,
            layers=[spec.name for spec in specs],
            calls={spec.name: spec.describe() for spec in specs},
            sparse={
                spec.name: spec.sparse.info(writer.dtype)
                for spec in specs
                if spec.sparse is not None
            },
            model=model_info(job.rnet.net),
            metadata=job.metadata,
        )
    _barrier(world)
    writer.remove_files()
