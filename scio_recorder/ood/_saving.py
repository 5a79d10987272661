"""A detector's fitted state in a file: the entries it declares, the checks at load.

:meth:`Detector.save <scio_recorder.ood.Detector.save>` writes the state
(a flat dict of tensors) to a safetensors file through
:func:`~scio_recorder.io.save_records`, with metadata: the detector's
class, its config and the per-sample shapes of the layers it reads
(:func:`save_state`). :meth:`Detector.load <scio_recorder.ood.Detector.load>`
checks everything once, before the detector changes (:func:`read_state`):
the file, the class, the config, the layers' shapes on this net, and each
entry against the detector's declaration (:class:`StateEntry`: its shape,
with sizes fixed by the net or named and shared between entries, and its
dtype's kind), converted to the declared dtype, finite.
"""

from __future__ import annotations

__all__ = ["Saved", "StateEntry", "read_state", "save_state"]

import dataclasses
import json
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from scio_recorder.io import load_records, save_records
from scio_recorder.layers import label_str

from ._checks import net_classes, per_sample_size

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder


@dataclasses.dataclass(frozen=True)
class StateEntry:
    """One tensor of a detector's fitted state, as :meth:`Detector.load` checks it.

    Attributes
    ----------
    shape : tuple of int, str or None
        Its size along each dimension: an ``int`` is fixed by the net (a
        layer's number of features, from the recorder's layer table), a
        ``str`` names a size set by the fit (``"classes"``, ``"samples"``)
        that must be the same in every entry naming it, except
        ``"logits"``: the net's number of logits, fixed by the net as an
        ``int`` is (where the layer table knows it); ``None`` is not
        checked (a size the layer table does not know).
    dtype : torch.dtype
        The dtype the detector computes in. A stored tensor of another dtype
        of the same kind (floating point, or integer) is converted to it; one
        of another kind is refused.

    Examples
    --------
    >>> import torch
    >>> StateEntry(("classes", 16), torch.float64)
    StateEntry(shape=('classes', 16), dtype=torch.float64)

    """

    shape: tuple[int | str | None, ...]
    dtype: torch.dtype


class Saved(Protocol):
    """What saving reads of a detector.

    (A structural type, so that this module stays below the protocol in
    :mod:`._protocol`, which uses it.)
    """

    rnet: Recorder

    def config(self) -> dict[str, Any]:
        """Return the hyperparameters and layers, JSON-able."""

    def layers_read(self) -> list[tuple[DepthIdx, str]]:
        """Return the ``(label, "output" | "input")`` pairs a pass reads or edits."""

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries of the fitted state: shapes on this net, dtypes."""


def save_state(detector: Saved, state: Mapping[str, Tensor], path: str | Path) -> Path:
    """Write ``state`` to a safetensors file, with the detector's class and config.

    The metadata also holds the per-sample shapes of the layers the
    detector reads, which :func:`read_state` checks against the net it
    loads into.
    """
    meta = {
        "ood.detector": type(detector).__name__,
        "ood.config": json.dumps(detector.config(), sort_keys=True),
        "ood.layers": json.dumps(_layer_shapes(detector), sort_keys=True),
    }
    return save_records(path, state, extra_metadata=meta)


def read_state(detector: Saved, path: str | Path) -> dict[str, Tensor]:
    """Return the state a file holds for ``detector``, checked, in the declared dtypes.

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ValueError
        Naming the file and the bad entry, if any check fails (the module's
        description lists them).
    """
    records = load_records(path)
    source = records.path
    meta = records.metadata
    name = meta.get("ood.detector")
    if name != type(detector).__name__:
        msg = (
            f"'{source}' holds the state of a {name or 'non-detector file'}, not "
            f"of a {type(detector).__name__}."
        )
        raise ValueError(msg)
    _check_config(detector, source, meta)
    _check_layers(detector, source, _metadata_json(source, meta, "ood.layers"))
    return _checked_state(detector, source, records)


def _check_config(detector: Saved, source: Path, meta: Mapping[str, str]) -> None:
    """Refuse a file saved by a detector configured otherwise, naming the keys."""
    name = meta.get("ood.detector")
    saved = _metadata_json(source, meta, "ood.config", required=True)
    mine = json.loads(json.dumps(detector.config(), sort_keys=True))
    if saved != mine:
        diff = sorted(
            k for k in saved.keys() | mine.keys() if saved.get(k) != mine.get(k)
        )
        was = [saved.get(k) for k in diff]
        now = [mine.get(k) for k in diff]
        msg = (
            f"'{source}' was saved by a {name} configured otherwise "
            f"({', '.join(diff)}: saved {was}, now {now}); make the detector "
            "with the same arguments."
        )
        raise ValueError(msg)


def _layer_shapes(detector: Saved) -> dict[str, list[int]]:
    """Return the per-sample shape of each layer read, by ``"<label> <kind>"``."""
    shapes = {}
    for label, kind in detector.layers_read():
        size = per_sample_size(detector.rnet, label, kind)
        if size is not None:
            shapes[f"{label_str(label)} {kind}"] = size
    return shapes


def _check_layers(detector: Saved, source: Path, saved: dict[str, Any]) -> None:
    """Compare the saved per-sample shapes of the layers read with this net's."""
    for label, kind in detector.layers_read():
        was = saved.get(f"{label_str(label)} {kind}")
        now = per_sample_size(detector.rnet, label, kind)
        if was is not None and now is not None and was != now:
            msg = (
                f"'{source}' holds a {type(detector).__name__} state fitted on layer "
                f"{label_str(label)} whose {kind} was {was} per sample, but in "
                f"this net layer {detector.rnet.table[label].describe()} has the "
                f"{kind} {now}: the state does not fit this net. Load it into "
                "a detector on the net it was fitted on (same net and "
                "`input_size`), or fit this one again."
            )
            raise ValueError(msg)


def _checked_state(
    detector: Saved, source: Path, records: Mapping[Any, Any]
) -> dict[str, Tensor]:
    """Check the records against the detector's ``state_entries``; convert dtypes."""
    who = type(detector).__name__
    entries = detector.state_entries()
    found = {k if isinstance(k, str) else label_str(k): v for k, v in records.items()}
    expected = ", ".join(map(repr, entries)) or "no entry"
    missing = [k for k in entries if k not in found]
    if missing:
        msg = (
            f"'{source}' holds an incomplete {who} state: entry "
            f"{', '.join(map(repr, missing))} is missing (a {who} state has "
            f"{expected}; the file has {', '.join(map(repr, found)) or 'none'}). "
            "The file was cut or edited: save the fitted detector again."
        )
        raise ValueError(msg)
    extra = [k for k in found if k not in entries]
    if extra:
        msg = (
            f"'{source}' holds unexpected entries {', '.join(map(repr, extra))} "
            f"besides the {who} state ({expected}): it was not written by "
            f"{who}.save, or was edited. Save the fitted detector again."
        )
        raise ValueError(msg)
    layer = _layer_text(detector)
    sizes: dict[str, tuple[int, str]] = {}
    state: dict[str, Tensor] = {}
    logits = net_classes(detector.rnet)
    for key, declared in entries.items():
        value = found[key]
        where = f"'{source}': entry {key!r} of the {who} state"
        if not isinstance(value, Tensor):
            msg = f"{where} is a {type(value).__name__}, not a tensor."
            raise ValueError(msg)  # noqa: TRY004 (a bad file, as the others)
        entry = declared
        if logits is not None and "logits" in declared.shape:
            fixed = tuple(logits if n == "logits" else n for n in declared.shape)
            entry = dataclasses.replace(declared, shape=fixed)
            layer = f"this net ({logits} logits)"
        _check_shape(where, layer, value, entry, sizes=sizes, key=key)
        state[key] = _checked_dtype(where, value, entry)
    return state


def _layer_text(detector: Saved) -> str:
    """Name the first layer the detector reads, for the messages."""
    read = detector.layers_read()
    if not read:
        return "this net"
    label, kind = read[0]
    return f"layer {detector.rnet.table[label].describe()} ({kind})"


def _metadata_json(
    source: Path, meta: Mapping[str, str], key: str, *, required: bool = False
) -> dict[str, Any]:
    """Parse one JSON object of a detector file's metadata, naming what is bad."""
    text = meta.get(key)
    if text is None:
        if not required:
            return {}  # files saved before this entry existed
        msg = (
            f"'{source}' has no {key!r} metadata entry: it was not written by "
            "`Detector.save`, or was edited. Save the fitted detector again."
        )
        raise ValueError(msg)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        msg = (
            f"'{source}': its {key!r} metadata entry is not valid JSON ({error}); "
            "the file was edited or damaged. Save the fitted detector again."
        )
        raise ValueError(msg) from error
    if not isinstance(value, dict):
        msg = (
            f"'{source}': its {key!r} metadata entry is a JSON "
            f"{type(value).__name__}, not an object; the file was edited or "
            "damaged. Save the fitted detector again."
        )
        raise ValueError(msg)  # noqa: TRY004 (a bad file, as the others)
    return value


def _check_shape(  # noqa: PLR0913 (the entry, its context, the sizes seen)
    where: str,
    layer: str,
    value: Tensor,
    entry: StateEntry,
    *,
    sizes: dict[str, tuple[int, str]],
    key: str,
) -> None:
    """Check one entry's shape against its declaration and the named sizes."""
    shown = "[" + ", ".join("?" if n is None else str(n) for n in entry.shape) + "]"
    got = list(value.shape)
    bad = len(got) != len(entry.shape) or any(
        isinstance(want, int) and have != want
        for have, want in zip(got, entry.shape, strict=False)
    )
    if bad:
        msg = (
            f"{where} has shape {got}, but on {layer} it must be {shown}: the "
            "state was saved from another net or layer. Load it into a "
            "detector on the net it was fitted on, or fit this one again."
        )
        raise ValueError(msg)
    for have, want in zip(got, entry.shape, strict=True):
        if isinstance(want, str):
            size, other = sizes.setdefault(want, (have, key))
            if size != have:
                msg = (
                    f"{where} has shape {got} ({want}: {have}), but entry "
                    f"{other!r} has {want}: {size}; the entries do not belong "
                    "together. Save the fitted detector again."
                )
                raise ValueError(msg)


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating-point" if dtype.is_floating_point else "integer"


def _checked_dtype(where: str, value: Tensor, entry: StateEntry) -> Tensor:
    """Convert ``value`` to the declared dtype, or refuse another kind."""
    have, want = _dtype_kind(value.dtype), _dtype_kind(entry.dtype)
    if have != want:
        msg = (
            f"{where} is {value.dtype} ({have}), but it must be {want} "
            f"({entry.dtype}): refused, as converting it would change what it "
            "means. Save the fitted detector again."
        )
        raise ValueError(msg)
    converted = value.to(entry.dtype)
    if want == "floating-point":
        bad = int((~torch.isfinite(converted)).sum())
        if bad:
            after = (
                f", after conversion to {entry.dtype}"
                if value.dtype != entry.dtype
                else ""
            )
            msg = (
                f"{where} holds {bad} non-finite values (NaN or Inf{after}): "
                "scores would be NaN. Fit the detector again on finite data "
                "and save it."
            )
            raise ValueError(msg)
    return converted
