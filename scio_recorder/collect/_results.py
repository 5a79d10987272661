"""The results of a collect run: :class:`CollectResult`, and its file format.

Holds :class:`CollectResult` (public, re-exported by
:mod:`scio_recorder.collect`), a read-only mapping label -> result with the
run's counts, reducers and files, and the encoding of results (dataclasses,
int-keyed dicts) into what :func:`~scio_recorder.io.save_records` stores and
back, without pickle.

Why: results are what outlives a run; they must be saved and loaded safely,
with the layer table checked, apart from the machinery that produced them.
"""

from __future__ import annotations

__all__ = [
    "META_PREFIX",
    "TYPE_KEY",
    "CollectResult",
    "decode",
    "encode",
    "result_types",
    "show_value",
]

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from torch import Tensor

from scio_recorder import reduce as _reduce
from scio_recorder._support.public import public_module
from scio_recorder._support.render import html_table
from scio_recorder.io import load_records, save_records
from scio_recorder.layers import DepthIdx, as_table, label_str, parse_label

from ._checkpoint import FORMAT

if TYPE_CHECKING:
    import os
    from pathlib import Path

    from scio_recorder.layers import LayerTable
    from scio_recorder.recorder import Recorder
    from scio_recorder.reduce import Reducer
    from scio_recorder.select import Selector

    from ._estimate import Estimate

TYPE_KEY = "__collect_type__"
META_PREFIX = "collect."


class CollectResult(Mapping[DepthIdx, Any]):
    """The results of :func:`collect`: a read-only mapping label -> result.

    Each value is the reducer's ``result()``; for ``"concat"``, one tensor of
    all rows (memory mapped from its file when it was spilled: see
    :attr:`files`), or ``None`` on ranks other than 0 with ``gather=0``.

    Attributes
    ----------
    samples : int
        Samples reduced (all ranks together, when merged).
    batches : int
        Batches reduced (all ranks together, when merged).
    estimate : Estimate or None
        The memory estimate computed at the start (``None`` when loaded).
    reducers : Mapping of DepthIdx to Reducer
        The reducer of each label, to merge with other runs or save their
        states (for ``"concat"``, a :class:`~scio_recorder.reduce.Concat`
        holding the tensor). Empty when loaded from a file.
    labels_of : Mapping
        Each selector of ``keep`` -> the labels it resolved to.
    rank_samples : tuple of int
        Samples per rank, in rank order (one item when not distributed), to
        undo a sampler's interleaving of concatenated rows.
    peak_bytes : int
        The most bytes concatenations held in RAM at once (measured after
        each batch, before spilling).
    files : Mapping of DepthIdx to pathlib.Path
        The file behind each memory-mapped concatenation.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.collect import collect
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
    >>> result = collect(rnet, [torch.ones(4, 3)], {(1, 1): "moments"}, input=None)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = result.save(folder + "/")
    ...     loaded = CollectResult.load(path, rnet.table)
    >>> loaded[(1, 1)].count, loaded.samples, type(loaded[(1, 1)]).__name__
    (4, 4, 'MomentsResult')

    """

    def __init__(  # noqa: PLR0913 (all keyword-only data)
        self,
        results: dict[DepthIdx, Any],
        *,
        samples: int,
        batches: int,
        estimate: Estimate | None = None,
        reducers: Mapping[DepthIdx, Reducer] | None = None,
        labels_of: Mapping[Selector, tuple[DepthIdx, ...]] | None = None,
        rank_samples: tuple[int, ...] = (),
        peak_bytes: int = 0,
        files: Mapping[DepthIdx, Path] | None = None,
        table: LayerTable | None = None,
    ) -> None:
        self._results = results
        self.samples = samples
        self.batches = batches
        self.estimate = estimate
        self.reducers: Mapping[DepthIdx, Reducer] = MappingProxyType(
            dict(reducers or {})
        )
        self.labels_of: Mapping[Selector, tuple[DepthIdx, ...]] = MappingProxyType(
            dict(labels_of or {})
        )
        self.rank_samples = rank_samples or (samples,)
        self.peak_bytes = peak_bytes
        self.files: Mapping[DepthIdx, Path] = MappingProxyType(dict(files or {}))
        self._table = table

    def __getitem__(self, label: DepthIdx) -> Any:
        """Return the result of ``label``."""
        return self._results[label]

    def __iter__(self) -> Iterator[DepthIdx]:
        """Iterate over labels in table order."""
        return iter(self._results)

    def __len__(self) -> int:
        """Return the number of labels."""
        return len(self._results)

    def __repr__(self) -> str:
        items = ", ".join(
            f"{label_str(label)}: {show_value(value, label in self.files)}"
            for label, value in self._results.items()
        )
        return (
            f"CollectResult(samples={self.samples}, batches={self.batches}, "
            f"{{{items}}})"
        )

    def _repr_html_(self) -> str:
        """Return an HTML table, one row per label (what Jupyter shows)."""
        rows = []
        for label, value in self._results.items():
            row = self._table.get(label) if self._table is not None else None
            name = (row.name or "-") if row is not None else "-"
            kind = type(row.module).__name__ if row is not None else "-"
            shown = show_value(value, label in self.files)
            rows.append([label_str(label), name, kind, shown])
        caption = f"CollectResult: {self.samples} samples in {self.batches} batches"
        return html_table(["label", "name", "type", "result"], rows, caption=caption)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save the results to one safetensors file with a label map.

        Results may be tensors, ``None``, numbers, strings, and tuples, lists,
        dicts (string or int keys) and dataclasses of those (all the built-in
        reducers' results). The file is written by
        :func:`~scio_recorder.io.save_records` (with the layer table, so that
        :meth:`load` can check the labels), atomically.

        Parameters
        ----------
        path : str or os.PathLike
            The file, or a directory (see :func:`~scio_recorder.io.save_records`).

        Returns
        -------
        pathlib.Path
            The file written.

        Raises
        ------
        TypeError
            If a result holds something else.
        """
        records = {label: encode(value) for label, value in self._results.items()}
        metadata = {
            META_PREFIX + "format": str(FORMAT),
            META_PREFIX + "samples": str(self.samples),
            META_PREFIX + "batches": str(self.batches),
        }
        return save_records(path, records, self._table, extra_metadata=metadata)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        table: LayerTable | Recorder | None = None,
        *,
        types: Iterable[type] = (),
    ) -> CollectResult:
        """Load results saved by :meth:`save`, checking the label map.

        The file is read with safetensors only (no pickle). Dataclass results
        are rebuilt for the result classes of :mod:`scio_recorder.reduce` and
        for the classes in ``types``; others come back as dicts.

        Parameters
        ----------
        path : str or os.PathLike
            The file, or a directory holding ``records.safetensors``.
        table : LayerTable or Recorder, optional
            Check that each label names the same module call as when saved.
        types : iterable of type, optional
            More dataclasses to rebuild (e.g. your own reducers' results).

        Returns
        -------
        CollectResult
            With ``samples`` and ``batches`` as saved; no reducers.

        Raises
        ------
        ValueError
            If the file was not written by :meth:`save`, or (with ``table``)
            a label names another module; see
            :func:`~scio_recorder.io.load_records`.
        """
        layers = as_table(table, "`table=` of CollectResult.load")
        records = load_records(path, layers)
        if records.metadata.get(META_PREFIX + "format") is None:
            msg = (
                f"'{records.path}' holds records but no collect results; load it "
                "with `scio_recorder.io.load_records`."
            )
            raise ValueError(msg)
        known = {
            f"{public_module(t)}:{t.__qualname__}": t
            for t in (*result_types(), *types)
            if dataclasses.is_dataclass(t)
        }
        results: dict[DepthIdx, Any] = {}
        for key, value in records.items():
            label = key if isinstance(key, tuple) else parse_label(key)
            results[label] = decode(value, known)
        return cls(
            results,
            samples=int(records.metadata[META_PREFIX + "samples"]),
            batches=int(records.metadata[META_PREFIX + "batches"]),
            table=layers,
        )


def show_value(value: Any, mapped: bool) -> str:  # noqa: FBT001 (private helper)
    if isinstance(value, Tensor):
        extra = ", mmap" if mapped else ""
        return f"Tensor{list(value.shape)}{extra}"
    return type(value).__name__


def result_types() -> list[type]:
    return [
        t
        for name in _reduce.__all__
        if isinstance(t := getattr(_reduce, name), type) and dataclasses.is_dataclass(t)
    ]


def encode(value: Any) -> Any:
    """Turn a result into what :func:`~scio_recorder.io.save_records` stores."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        out: dict[str, Any] = {TYPE_KEY: f"{public_module(cls)}:{cls.__qualname__}"}
        for field in dataclasses.fields(value):
            out[field.name] = encode(getattr(value, field.name))
        return out
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: encode(v) for k, v in value.items()}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            items = {str(k): encode(v) for k, v in value.items()}
            return {TYPE_KEY: "intdict", "items": items}
        msg = "collect results can be saved with str or int dict keys only"
        raise TypeError(msg)
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(encode(v) for v in value)
    return value


def decode(value: Any, known: Mapping[str, type]) -> Any:
    """Undo :func:`encode`, rebuilding only the dataclasses in ``known``."""
    if isinstance(value, dict):
        kind = value.get(TYPE_KEY)
        if kind == "intdict" and isinstance(value.get("items"), dict):
            return {int(k): decode(v, known) for k, v in value["items"].items()}
        fields = {k: decode(v, known) for k, v in value.items() if k != TYPE_KEY}
        if isinstance(kind, str) and kind in known:
            return known[kind](**fields)
        return {k: decode(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, known) for v in value]
    if isinstance(value, tuple):
        return tuple(decode(v, known) for v in value)
    return value
