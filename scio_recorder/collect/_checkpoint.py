"""Checkpoints of a collect run in ``spill_dir``, and resuming from them.

Holds :class:`Checkpoints` (the manifest, the reducer states, the commit
order that makes a checkpoint atomic, the checks made before resuming), the
run's fingerprint (a deterministic description of the labels, reducers and
batch specs, compared with the saved one), and the
flattening of reducer states into one safetensors dict (also what the
distributed merge sends, see :mod:`scio_recorder._distributed`). Files are
written atomically by :func:`scio_recorder._support.files.write_atomic`.

Why: a long run interrupted by a crash or a kill must resume, rerun with the
same arguments, exactly where its last checkpoint left it, and must refuse
to resume a run made with other arguments.
"""

from __future__ import annotations

__all__ = [
    "FORMAT",
    "MANIFEST",
    "STATE_FILES",
    "Checkpoints",
    "Saved",
    "entry_problem",
    "fingerprint_of",
    "flat_states",
    "load_states",
]

import dataclasses
import json
import logging
import math
from typing import TYPE_CHECKING, Any, NoReturn

import safetensors.torch
import torch
from torch import Tensor

from scio_recorder._run.fingerprint import describe_reducer, describe_spec
from scio_recorder._support.files import (
    differences,
    fsync_file,
    is_count,
    is_file_name,
    is_temporary,
    library_version,
    manifest_digest,
    parse_dtype,
    write_atomic,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from ._specs import BatchSpec, Slot

# The logger of the public module: one logger for everything a run reports.
logger = logging.getLogger("scio_recorder.collect")

MANIFEST = "collect-manifest.json"
"""The manifest file written in ``spill_dir``."""

FORMAT = 1
STATE_FILES = ("states-0.safetensors", "states-1.safetensors")


def fingerprint_of(
    slots: list[Slot], input_spec: BatchSpec, target_spec: BatchSpec
) -> dict[str, Any]:
    return {
        "library_version": library_version(),
        "labels": {
            slot.key: f"`{slot.row.name}` ({type(slot.row.module).__name__}, "
            f"call {slot.row.call_index})"
            for slot in slots
        },
        "reducers": {slot.key: describe_reducer(slot.template) for slot in slots},
        "input": describe_spec(input_spec),
        "target": describe_spec(target_spec),
    }


def flat_states(
    slots: list[Slot], devices: dict[str, torch.device] | None = None
) -> dict[str, Tensor]:
    """Return the reducers' states as one flat dict, keys ``"<label>/<key>"``.

    ``devices`` (if given) receives the device of each label's state.
    """
    out: dict[str, Tensor] = {}
    for slot in slots:
        if slot.reducer is None:
            continue
        try:
            state = slot.reducer.state()
        except TypeError as error:
            msg = (
                f"The reducer of layer {slot.key} cannot give its state as "
                f"tensors ({error}), which checkpoints (`spill_dir`) and "
                "distributed merges (`gather`) need. Use another reducer, or "
                "no `spill_dir` and `gather=None`."
            )
            raise TypeError(msg) from error
        for key, value in state.items():
            if devices is not None:
                devices.setdefault(slot.key, value.device)
            out[f"{slot.key}/{key}"] = value.detach().to(
                "cpu", memory_format=torch.contiguous_format, copy=True
            )
    return out


def load_states(
    slots: list[Slot], states: Mapping[str, Tensor], device: torch.device | None
) -> None:
    """Load flat states into fresh reducers of ``slots`` (replacing theirs)."""
    grouped: dict[str, dict[str, Tensor]] = {}
    for key, value in states.items():
        label, _, rest = key.partition("/")
        grouped.setdefault(label, {})[rest] = (
            value if device is None else value.to(device)
        )
    for slot in slots:
        if slot.template is None:
            continue
        reducer = slot.template.fresh()
        state = grouped.get(slot.key, {})
        reducer.load_state(state)
        slot.reducer = reducer
        slot.pending = state if device is None else None


@dataclasses.dataclass
class Saved:
    batches: int = 0
    samples: int = 0
    complete: bool = False


class Checkpoints:
    """The manifest and the reducer states in ``spill_dir``."""

    def __init__(
        self, folder: Path, fingerprint: dict[str, Any], *, durable: bool
    ) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self.durable = durable
        self.manifest = folder / MANIFEST
        self.states: str | None = None
        self.saved = Saved()

    def _read(self, *, strict: bool) -> dict[str, Any] | None:
        if not self.manifest.is_file():
            return None
        try:
            data = json.loads(self.manifest.read_text(encoding="utf-8"))
        except ValueError as error:
            if not strict:
                return None
            msg = (
                f"The manifest '{self.manifest}' is not valid JSON ({error}). Pass "
                "`resume=False` to start over, or use another `spill_dir`."
            )
            raise ValueError(msg) from error
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            if not strict:
                return None
            msg = (
                f"'{self.manifest}' is not a manifest this version of "
                "scio_recorder reads. Pass `resume=False` to start over, or use "
                "another `spill_dir`."
            )
            raise ValueError(msg)
        return data

    def open(
        self,
        slots: list[Slot],
        *,
        resume: bool,
        device: torch.device | None,
    ) -> Saved:
        """Resume the saved run (checked), or clear it and start afresh."""
        self.folder.mkdir(parents=True, exist_ok=True)
        data = self._read(strict=resume)
        if data is not None and resume:
            self._check(data)
            self._resume(data, slots, device)
        else:
            self._clear(data)
        return self.saved

    def _check(self, data: dict[str, Any]) -> None:
        saved = data.get("fingerprint")
        if saved == self.fingerprint:
            return
        lines = differences(saved, self.fingerprint)
        msg = (
            f"'{self.folder}' holds a collect run with other arguments:\n"
            + "\n".join(lines)
            + "\nUse another `spill_dir`, or pass `resume=False` to start over "
            "(this deletes the saved run)."
        )
        raise ValueError(msg)

    def _resume(
        self, data: dict[str, Any], slots: list[Slot], device: torch.device | None
    ) -> None:
        saved, states_name, concat = self._validate(data, slots)
        path = self.folder / states_name
        states = self._load_states_file(path, data, saved)
        try:
            load_states(slots, states, device)
        except Exception as error:
            msg = (
                f"The reducer states '{path}' in '{self.folder}' do not fit this "
                f"run's reducers ({error!r}): the folder was modified. Pass "
                "`resume=False` to start over."
            )
            raise ValueError(msg) from error
        self.states = states_name
        for slot in slots:
            if slot.store is not None:
                slot.store.attach(concat[slot.key], self.folder)
        self._remove_stale()
        self.saved = saved
        logger.info(
            "collect: resuming from '%s' after %d batches (%d samples)",
            self.folder,
            saved.batches,
            saved.samples,
        )

    def _malformed(self, what: str) -> NoReturn:
        msg = (
            f"The manifest '{self.manifest}' of the saved run in '{self.folder}' "
            f"is damaged or was edited: {what}. Pass `resume=False` to start "
            "over (this deletes the saved run)."
        )
        raise ValueError(msg)

    def _validate(
        self, data: dict[str, Any], slots: list[Slot]
    ) -> tuple[Saved, str, dict[str, Any]]:
        """Check every field of a manifest against itself and this run."""
        for field in ("batches", "samples", "complete", "states", "concat"):
            if field not in data:
                self._malformed(f"it has no {field!r}")
        counts = {}
        for field in ("batches", "samples"):
            value = data[field]
            if not is_count(value):
                self._malformed(f"{field!r} is {value!r}, not a number of {field} >= 0")
            counts[field] = value
        complete = data["complete"]
        if not isinstance(complete, bool):
            self._malformed(f"'complete' is {complete!r}, not true or false")
        states_name = data["states"]
        if states_name not in STATE_FILES:
            self._malformed(
                f"'states' is {states_name!r}, not one of the states files this "
                f"version writes ({', '.join(STATE_FILES)})"
            )
        concat = data["concat"]
        stores = {slot.key: slot.store for slot in slots if slot.store is not None}
        if not isinstance(concat, dict) or set(concat) != set(stores):
            keys = sorted(concat) if isinstance(concat, dict) else concat
            self._malformed(
                f"'concat' lists {keys!r}, not the concatenated layers {sorted(stores)}"
            )
        for key, store in stores.items():
            problem = entry_problem(concat[key], store.file_name)
            if problem is not None:
                self._malformed(f"'concat' of layer {key}: {problem}")
        saved = Saved(counts["batches"], counts["samples"], complete)
        return saved, str(states_name), concat

    def _load_states_file(
        self, path: Path, data: dict[str, Any], saved: Saved
    ) -> dict[str, Tensor]:
        """Read the states file, checked against the manifest that names it."""
        if not path.is_file():
            msg = (
                f"The reducer states '{path}' named by the manifest of "
                f"'{self.folder}' are missing. Pass `resume=False` to start over."
            )
            raise ValueError(msg)
        try:
            with safetensors.safe_open(str(path), "pt") as file:
                metadata = file.metadata() or {}
                states = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 (not a dict)
        except Exception as error:
            msg = (
                f"The reducer states '{path}' in '{self.folder}' cannot be read "
                f"(truncated, empty or not safetensors: {error}). Pass "
                "`resume=False` to start over."
            )
            raise ValueError(msg) from error
        expected = {"batches": str(saved.batches), "samples": str(saved.samples)}
        if "manifest" in metadata:  # written since the digest was added
            expected["manifest"] = manifest_digest(data)
        for key, value in expected.items():
            if metadata.get(key) != value:
                self._malformed(
                    f"it does not match the states file '{path.name}' it names "
                    f"({key}: {metadata.get(key)!r} in the states file)"
                )
        return states

    def _remove_stale(self) -> None:
        """Remove temporary files left by an interrupted manifest write."""
        for path in self.folder.iterdir():
            if is_temporary(path, MANIFEST):
                path.unlink(missing_ok=True)

    def _clear(self, data: dict[str, Any] | None) -> None:
        self.manifest.unlink(missing_ok=True)
        if data is not None:
            concat = data.get("concat")
            if isinstance(concat, dict):
                for entry in concat.values():
                    name = entry.get("file") if isinstance(entry, dict) else None
                    if is_file_name(name):
                        (self.folder / name).unlink(missing_ok=True)
        for name in STATE_FILES:
            (self.folder / name).unlink(missing_ok=True)
        self._remove_stale()

    def save(
        self, slots: list[Slot], batches: int, samples: int, *, complete: bool
    ) -> None:
        """Spill the rows, write the states, then the manifest (the commit).

        States alternate between two files: the one written is never the one
        the manifest on disk names, so an interrupted checkpoint leaves the
        previous one intact.
        """
        for slot in slots:
            if slot.store is not None:
                slot.store.spill(durable=self.durable)
        states = flat_states(slots)
        name = STATE_FILES[1] if self.states == STATE_FILES[0] else STATE_FILES[0]
        path = self.folder / name
        manifest = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "batches": batches,
            "samples": samples,
            "complete": complete,
            "states": name,
            "concat": {
                slot.key: slot.store.entry() for slot in slots if slot.store is not None
            },
        }
        # The states file carries a digest of the manifest that will name it:
        # resuming checks that the two belong together (an edited manifest
        # would otherwise resume into a wrong result).
        metadata = {
            "batches": str(batches),
            "samples": str(samples),
            "manifest": manifest_digest(manifest),
        }
        safetensors.torch.save_file(states, str(path), metadata)
        if self.durable:
            fsync_file(path)
        text = json.dumps(manifest, indent=1, sort_keys=True)
        write_atomic(
            self.manifest,
            lambda path: path.write_text(text, "utf-8"),
            durable=self.durable,
        )
        self.states = name
        self.saved = Saved(batches, samples, complete)


def entry_problem(entry: object, file_name: str) -> str | None:  # noqa: PLR0911 (one check per field)
    """Say what is wrong with a manifest's entry of a concatenation (None: nothing)."""
    if not isinstance(entry, dict):
        return f"the entry is {entry!r}, not an object"
    if entry.get("file") != file_name:
        return f"'file' is {entry.get('file')!r}, not {file_name!r}"
    rows, nbytes = entry.get("rows"), entry.get("bytes")
    if not is_count(rows) or not is_count(nbytes):
        return f"'rows' and 'bytes' are {rows!r} and {nbytes!r}, not counts >= 0"
    dtype, shape = entry.get("dtype"), entry.get("shape")
    if dtype is None or shape is None:
        if dtype is not None or shape is not None or rows or nbytes:
            return (
                f"'dtype' {dtype!r} and 'shape' {shape!r} (null before the first "
                f"row) do not fit {rows} rows of {nbytes} bytes"
            )
        return None
    if not isinstance(shape, list) or not all(is_count(n) for n in shape):
        return f"'shape' is {shape!r}, not a list of sizes >= 0"
    try:
        parsed = parse_dtype(dtype) if isinstance(dtype, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        return f"'dtype' is {dtype!r}, not a torch dtype"
    row_bytes = math.prod(shape) * torch.empty((), dtype=parsed).element_size()
    if nbytes != rows * row_bytes:
        return (
            f"{rows} rows of shape {shape} {dtype} are {rows * row_bytes} bytes, "
            f"not {nbytes}"
        )
    return None
