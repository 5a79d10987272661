"""The manifest of an activation set: what it holds, checked, and its assembly.

Holds :data:`MANIFEST` (``manifest.json``, the set: layers with dtypes and
sizes, shards in reading order with their token counts and row offsets,
the parts appended, the model, the statistics file), :func:`read_manifest`
(every field checked against the others), :func:`assemble` (a new part's
ranks added to the set: shards listed in part, rank and shard order,
statistics merged with Chan's rule, files written atomically, the manifest
last) and :func:`model_info`.

Why: the manifest is the one file a reader trusts. It is written once per
part, after every rank has finished its shards, and replaced atomically, so
a set is always either its previous state or its new one; what it names
is checked before anything is read or deleted.
"""

from __future__ import annotations

__all__ = [
    "FORMAT",
    "FORMATS",
    "FORMAT_UNCHECKED",
    "MANIFEST",
    "assemble",
    "column_dtypes",
    "is_crc32",
    "load_moments",
    "load_statistics",
    "merged_statistics",
    "model_info",
    "read_manifest",
    "stats_name",
    "wrote_checksums",
]

import json
import re
from typing import TYPE_CHECKING, Any

import safetensors
import safetensors.torch

from scio_recorder._support.files import (
    is_count,
    is_file_name,
    library_version,
    parse_dtype,
    write_atomic,
)
from scio_recorder._support.public import public_module
from scio_recorder.reduce import Moments

from ._shards import checksum

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    import torch
    from torch import Tensor, nn

MANIFEST = "manifest.json"
"""The manifest file of an activation set."""

FORMAT = "scio_recorder.activations/2"
"""The format of a set with checksums (the manifest's ``"format"``): every
shard's ``crc32``, and ``stats_crc32`` with statistics, are there; a missing
one is refused, naming the shard (a set that reads as if it had none would
not be verified)."""

FORMAT_UNCHECKED = "scio_recorder.activations/1"
"""The format of a set written before the checksums (or with them off): a
shard's ``crc32``, where present, is checked; a missing one is not noticed."""

FORMATS = (FORMAT_UNCHECKED, FORMAT)
"""The formats this version reads."""


def stats_name(part: int) -> str:
    """Return the statistics file written when part ``part`` completes the set."""
    return f"stats-p{part}.safetensors"


def model_info(net: nn.Module) -> dict[str, Any]:
    """Describe the model a set came from: class, ``name_or_path``, config."""
    cls = type(net)
    info: dict[str, Any] = {"class": f"{public_module(cls)}.{cls.__qualname__}"}
    config = getattr(net, "config", None)
    if config is not None:
        info["name_or_path"] = getattr(config, "_name_or_path", None) or getattr(
            config, "name_or_path", None
        )
        try:
            info["config"] = json.loads(config.to_json_string(use_diff=False))
        except Exception:  # noqa: BLE001 (a config that is not JSON: left out)
            info["config"] = None
    return info


def _damaged(path: Path, what: str, fix: str) -> ValueError:
    return ValueError(
        f"The manifest '{path}' of the activation set is damaged or was edited: "
        f"{what}. {fix}"
    )


def read_manifest(folder: Path, *, fix: str) -> dict[str, Any] | None:  # noqa: C901, PLR0912 (one check per field)
    """Return the checked manifest of the set in ``folder`` (``None``: no set).

    ``fix`` ends the message of a damaged manifest (what the caller can do).
    """
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise _damaged(path, f"it is not JSON ({error})", fix) from error
    if not isinstance(data, dict) or data.get("format") not in FORMATS:
        found = data.get("format") if isinstance(data, dict) else None
        raise _damaged(
            path,
            f"its format is {found!r}, not {FORMAT!r} (or {FORMAT_UNCHECKED!r}, a "
            "set written before the checksums)",
            fix,
        )
    checked = data["format"] == FORMAT
    layers = data.get("layers")
    if not isinstance(layers, dict) or not layers:
        raise _damaged(path, f"'layers' is {layers!r}", fix)
    for name, entry in layers.items():
        try:
            parse_dtype(entry["dtype"])
            ok = isinstance(entry["shape"], list) and all(map(is_count, entry["shape"]))
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise _damaged(path, f"layer {name!r} is {entry!r}", fix)
    shards = data.get("shards")
    if not isinstance(shards, list):
        raise _damaged(path, f"'shards' is {shards!r}", fix)
    for entry in shards:
        if (
            not isinstance(entry, dict)
            or not is_file_name(entry.get("file"))
            or not all(
                is_count(entry.get(key))
                for key in ("tokens", "part", "rank", "row_offset")
            )
            or ("crc32" in entry and not is_crc32(entry["crc32"]))
        ):
            raise _damaged(path, f"the shard entry {entry!r} is not valid", fix)
    for field in ("tokens", "rows"):
        if not is_count(data.get(field)):
            raise _damaged(path, f"{field!r} is {data.get(field)!r}", fix)
    parts = data.get("parts")
    if (
        not isinstance(parts, list)
        or not parts
        or not all(
            isinstance(part, dict)
            and isinstance(part.get("fingerprint"), dict)
            and isinstance(part.get("checksums", False), bool)
            for part in parts
        )
    ):
        raise _damaged(path, f"'parts' is {parts!r}", fix)
    problem = _inconsistent(data)
    if problem is not None:
        raise _damaged(path, problem, fix)
    for entry in shards:
        if "crc32" not in entry:
            why = _unverified(data, entry["part"], checked=checked)
            if why is not None:
                raise _damaged(
                    path, _missing(f"the shard {entry['file']!r}", "crc32", why), fix
                )
    stats = data.get("stats")
    if stats is not None and not is_file_name(stats):
        raise _damaged(path, f"'stats' is {stats!r}", fix)
    crc = data.get("stats_crc32")
    if crc is not None and not is_crc32(crc):
        raise _damaged(path, f"'stats_crc32' is {crc!r}", fix)
    if stats is not None and crc is None:
        # The statistics are written (and checksummed) by the set's last part.
        why = _unverified(data, len(parts) - 1, checked=checked)
        if why is not None:
            raise _damaged(
                path,
                _missing(f"the statistics file {stats!r}", "stats_crc32", why),
                fix,
            )
    return data


def wrote_checksums(part: Mapping[str, Any]) -> bool:
    """Return whether the version that wrote ``part`` stored checksums.

    A part records it (``"checksums"``); a part written before that field,
    but by a version that stored its ranks' rows (``"rank_rows"``, which
    came with the checksums), had them too.

    Examples
    --------
    >>> wrote_checksums({"checksums": False, "rank_rows": [3]})
    False
    >>> wrote_checksums({"rank_rows": [3]}), wrote_checksums({"rows": 3})
    (True, False)

    """
    recorded = part.get("checksums")
    if isinstance(recorded, bool):
        return recorded
    return "rank_rows" in part


def _unverified(data: Mapping[str, Any], part: int, *, checked: bool) -> str | None:
    """Say why a checksum missing from part ``part`` is refused (``None``: it is not).

    A set of format 2 has every checksum; one of format 1 has those of the
    parts written by a version that stores them, whatever its format says:
    a format lowered by hand, with the checksums taken out, must not turn
    the check off.
    """
    if checked:
        return f"which every set of format {FORMAT!r} records"
    if wrote_checksums(data["parts"][part]):
        return (
            f"although part {part} was written by a version that stores a "
            f"checksum for each file and writes the format {FORMAT!r} (the "
            f"manifest says {FORMAT_UNCHECKED!r}: was it lowered by hand?)"
        )
    return None


def _missing(what: str, key: str, why: str) -> str:
    return f"{what} has no {key!r}, {why}, so it could not be verified"


_SHARD = re.compile(r"shard-p(\d+)-r(\d+)-(\d+)\.safetensors")
_CRC32 = re.compile(r"[0-9a-f]{8}")


def is_crc32(value: object) -> bool:
    """Return whether ``value`` is a CRC-32 as the shards store it (8 hex digits).

    Examples
    --------
    >>> is_crc32("9801adcc"), is_crc32("9801ADCC"), is_crc32(12)
    (True, False, False)

    """
    return isinstance(value, str) and _CRC32.fullmatch(value) is not None


def _inconsistent(data: dict[str, Any]) -> str | None:
    """Say how the shards, parts and counts of a manifest disagree (``None``: none).

    Every shard is listed once, under its own name (``shard-p<part>-r<rank>-
    <n>``, numbered from 0 within its part and rank); the shards come by
    part, then rank; a rank's shards share its row offset, which is the
    rows of the parts and ranks before it (from the parts' ``rank_rows``,
    where the writer stored them; else the first rank's is the rows of the
    parts before, and the others' do not decrease); the counts of tokens
    and rows are the sums of the shards' and the parts'.
    """
    parts = data["parts"]
    starts = [0]
    for number, part in enumerate(parts):
        if not is_count(part.get("rows")) or not is_count(part.get("tokens")):
            return f"part {number} is {part!r}"
        starts.append(starts[-1] + part["rows"])
    if data["rows"] != starts[-1]:
        return f"'rows' is {data['rows']}, but its parts hold {starts[-1]}"
    tokens = [0] * len(parts)
    problem = _shard_order(data["shards"], parts, starts, tokens)
    if problem is not None:
        return problem
    if data["tokens"] != sum(tokens):
        return f"'tokens' is {data['tokens']}, but its shards hold {sum(tokens)}"
    for number, part in enumerate(parts):
        if part["tokens"] != tokens[number]:
            return (
                f"part {number} holds {part['tokens']} tokens, but its shards "
                f"hold {tokens[number]}"
            )
    return None


def _shard_order(  # noqa: PLR0911 (one answer per problem)
    shards: list[dict[str, Any]],
    parts: list[dict[str, Any]],
    starts: list[int],
    tokens: list[int],
) -> str | None:
    """Check the shards' names, order and row offsets; add their tokens per part."""
    seen: set[str] = set()
    group: tuple[int, int] | None = None
    count = offset = 0
    for entry in shards:
        name, part, rank = entry["file"], entry["part"], entry["rank"]
        if name in seen:
            return f"the shard {name!r} is listed twice"
        seen.add(name)
        match = _SHARD.fullmatch(name)
        if match is None or (int(match[1]), int(match[2])) != (part, rank):
            return f"the shard entry {entry!r} does not name its part and rank"
        if part >= len(parts):
            return f"the shard {name!r} is of part {part}, but the set has {len(parts)}"
        tokens[part] += entry["tokens"]
        if (part, rank) != group:
            if group is not None and (part, rank) < group:
                return f"the shard {name!r} is out of order (by part, then rank)"
            after = offset if group is not None and group[0] == part else None
            want = _row_offset(parts[part], rank, starts[part], after=after)
            if want is None:
                return f"the shard {name!r} is of a rank its part does not have"
            group, count, offset = (part, rank), 0, entry["row_offset"]
        else:
            want = (offset, True)
        if entry["row_offset"] != want[0] if want[1] else entry["row_offset"] < want[0]:
            return (
                f"the shard {name!r} has the row offset {entry['row_offset']}, "
                f"but the rows before it are {'' if want[1] else 'at least '}"
                f"{want[0]}"
            )
        if int(match[3]) != count:
            return f"the shard {name!r} is not shard {count} of its part and rank"
        count += 1
    return None


def _row_offset(
    part: dict[str, Any], rank: int, start: int, *, after: int | None
) -> tuple[int, bool] | None:
    """Return the row offset of a part's rank, and whether it is exact.

    ``start``: the rows of the parts before; ``after``: the offset of the
    part's rank before (``None``: the first listed). A set written before
    the parts' ``rank_rows`` were stored gives only a lower bound for a rank
    after the first. ``None``: the part has no such rank.
    """
    rank_rows = part.get("rank_rows")
    if isinstance(rank_rows, list) and all(map(is_count, rank_rows)):
        if rank >= len(rank_rows):
            return None
        return start + sum(rank_rows[:rank]), True
    if after is None:
        return start, rank == 0
    return after, False


def load_statistics(
    folder: Path, manifest: Mapping[str, Any], *, fix: str
) -> dict[str, Tensor]:
    """Return the tensors of the set's statistics file, checked; raise naming it.

    Its CRC-32 (``stats_crc32``, where the writer stored it) is checked;
    a file that safetensors cannot read is named with the set.
    """
    path = folder / str(manifest["stats"])
    what = f"The statistics file '{path}' of the activation set in '{folder}'"
    try:
        data = path.read_bytes()
        crc = manifest.get("stats_crc32")
        if crc is not None and checksum(data) != crc:
            msg = f"its bytes have the CRC-32 {checksum(data)}, not the {crc} written"
            raise ValueError(msg)  # noqa: TRY301 (named with the others below)
        return safetensors.torch.load(data)
    except (OSError, ValueError, safetensors.SafetensorError) as error:
        msg = f"{what} cannot be read: {error}. It is damaged or was edited. {fix}"
        raise ValueError(msg) from error


def load_moments(states: Mapping[str, Tensor], prefix: str) -> Moments:
    """Return a :class:`Moments` from the keys of ``states`` under ``prefix``."""
    moments = Moments()
    moments.load_state(
        {
            key.removeprefix(prefix): value
            for key, value in states.items()
            if key.startswith(prefix)
        }
    )
    return moments


def merged_statistics(
    names: list[str], parts: list[Mapping[str, Tensor]]
) -> dict[str, Tensor]:
    """Merge statistics states (``stats/<name>/...``, ``norms/<name>/...``) in order."""
    out: dict[str, Tensor] = {}
    for name in names:
        for group in ("stats", "norms"):
            total = Moments()
            for states in parts:
                total.merge(load_moments(states, f"{group}/{name}/"))
            for key, value in total.state().items():
                out[f"{group}/{name}/{key}"] = value.to("cpu").contiguous()
    return out


def assemble(  # noqa: PLR0913 (what a part adds)
    folder: Path,
    previous: dict[str, Any] | None,
    *,
    part: int,
    fingerprint: dict[str, Any],
    ranks: list[dict[str, Any]],
    statistics: Sequence[Mapping[str, Tensor]] | None,
    layers: list[str],
    calls: dict[str, str],
    model: dict[str, Any],
    metadata: Any,
    sparse: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Add a finished part (every rank's summary, in rank order) to the set.

    Writes the merged statistics (a new file) and then the manifest, both
    atomically; returns the manifest. ``layers`` names the layers, ``calls``
    describes each one's call in words, ``sparse`` how the layers stored
    sparsely are packed (``_sparse.SparseLatents.info``), ``extra`` more
    keys of the manifest (a part's ``split``, ``_parts``).
    """
    rows_before = previous["rows"] if previous is not None else 0
    shards = list(previous["shards"]) if previous is not None else []
    offset = rows_before
    columns: dict[str, Any] | None = None
    for summary in ranks:
        for entry in summary["shards"]:
            shards.append(
                {
                    "file": entry["file"],
                    "tokens": entry["tokens"],
                    "part": part,
                    "rank": summary["rank"],
                    "row_offset": offset,
                    **({"crc32": entry["crc32"]} if "crc32" in entry else {}),
                }
            )
        offset += summary["rows"]
        columns = columns or summary["columns"]
    if previous is not None:
        described = previous["layers"]
    else:
        described = {
            name: {
                "dtype": columns[name]["dtype"] if columns else None,
                "shape": columns[name]["shape"] if columns else None,
                "call": call,
            }
            for name, call in calls.items()
        }
        for name, info in (sparse or {}).items():
            described[name]["sparse"] = info
    stats_file = stats_crc = None
    if statistics is not None:
        parts = list(statistics)
        if previous is not None and previous.get("stats"):
            fix = "Write the set again with `write(..., overwrite=True)`."
            parts.insert(0, load_statistics(folder, previous, fix=fix))
        merged = merged_statistics(layers, parts)
        stats_file = stats_name(part)
        data = safetensors.torch.save(merged)
        stats_crc = checksum(data)
        write_atomic(folder / stats_file, lambda path: path.write_bytes(data))
    tokens_part = sum(int(s["tokens"]) for s in ranks)
    # Format 2 only when every shard and the statistics have a checksum: an
    # append to a set written before them (or a write with them off) gives
    # a set of format 1, whose missing checksums are not noticed.
    checked = all("crc32" in entry for entry in shards) and (
        statistics is None or stats_crc is not None
    )
    manifest: dict[str, Any] = {
        "format": FORMAT if checked else FORMAT_UNCHECKED,
        "library_version": library_version(),
        "complete": True,
        "tokens": sum(int(entry["tokens"]) for entry in shards),
        "rows": offset,
        "layers": described,
        "index": {"dtype": "int64", "columns": ["row", "column"]},
        "model": model if previous is None else previous["model"],
        "metadata": metadata if previous is None else previous.get("metadata"),
        "parts": [
            *(previous["parts"] if previous is not None else []),
            {
                "fingerprint": fingerprint,
                "tokens": tokens_part,
                "rows": offset - rows_before,
                "world": len(ranks),
                "rank_rows": [int(summary["rows"]) for summary in ranks],
                "checksums": all(
                    "crc32" in entry for summary in ranks for entry in summary["shards"]
                ),
            },
        ],
        "shards": shards,
        "stats": stats_file,
        **({"stats_crc32": stats_crc} if stats_crc is not None else {}),
        **(extra or {}),
    }
    text = json.dumps(manifest, indent=1)
    write_atomic(folder / MANIFEST, lambda path: path.write_text(text, "utf-8"))
    if (
        previous is not None
        and previous.get("stats")
        and previous["stats"] != stats_file
    ):
        (folder / previous["stats"]).unlink(missing_ok=True)
    return manifest


def column_dtypes(manifest: Mapping[str, Any]) -> dict[str, torch.dtype]:
    """Each layer's stored dtype."""
    return {
        name: parse_dtype(entry["dtype"]) for name, entry in manifest["layers"].items()
    }
