"""The reader: :class:`ActivationDataset`, a map-style dataset over a set's shards.

Why this shape: training a probe or a sparse autoencoder reads random
batches of tokens many times over. Each shard is mapped once per process
(:class:`~._shards.ShardReader`: no load, no file descriptor kept), a batch
of indices is served by one ``index_select`` per shard and layer
(``__getitems__``, which a ``DataLoader`` calls with a whole batch), and
the maps are opened again in each ``DataLoader`` worker rather than shared
or pickled.
"""

from __future__ import annotations

__all__ = ["ActivationDataset"]

import bisect
import operator
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from scio_recorder._support.files import parse_dtype

from ._arrow import to_arrow
from ._manifest import MANIFEST, load_moments, load_statistics, read_manifest
from ._shards import ShardReader, check_shard
from ._sparse import densify, sparse_info, unpack
from ._tokens import INDEX

if TYPE_CHECKING:
    import os as _os

_PROGRESS = re.compile(r"progress-p\d+-r\d+\.json")
_FIX = "Write the set again with `write(..., overwrite=True)`, or restore the folder."


class _Stats(Mapping[str, Mapping[str, Tensor]]):
    """Per-layer statistics; a missing layer's error says why."""

    def __init__(self, values: dict[str, dict[str, Tensor]], path: Path) -> None:
        self._values = values
        self._path = path

    def __getitem__(self, name: str) -> Mapping[str, Tensor]:
        if name in self._values:
            return self._values[name]
        if not self._values:
            msg = (
                f"The set in '{self._path}' was written without statistics: write "
                "it with `stats=True` for `ds.stats`."
            )
        else:
            msg = f"No layer {name!r} in the set; its layers are {list(self._values)}."
        raise KeyError(msg)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<statistics of {list(self._values)}>"


_BAD_INDEX = (
    "Index a set with an int, a list or 1-D tensor of ints, a boolean mask or "
    "a slice, not {item!r}"
)


def _one_int(item: Any) -> int:
    """Return ``item`` as an int; refuse a float, a string, ... (as sequences do)."""
    try:
        return operator.index(item)
    except TypeError as error:
        raise TypeError(_BAD_INDEX.format(item=item)) from error


class ActivationDataset(Dataset[dict[str, Tensor]]):
    """The activation set written by :func:`write` in ``path``, memory mapped.

    ``len(ds)`` is the number of tokens; ``ds[i]`` is ``{layer: tensor
    [d]}`` for token ``i`` (in the stored order: shuffled if the set was
    written with ``shuffle_buffer``), and ``ds.index[i]`` its ``(row,
    column)`` in the token stream. ``ds[indices]`` (a list, a tensor or an
    array of ints, a boolean mask of ``len(ds)``, a slice) gives ``{layer:
    tensor [n, d]}`` at once. A
    :class:`~torch.utils.data.DataLoader` with a ``batch_size`` reads a
    batch in one go (``__getitems__``), from any number of workers, each
    mapping the shards itself.

    What is checked, and when: at construction, the manifest (every field,
    and their consistency: each shard listed once under its own name, in
    order, row offsets that follow from the parts' rows, token and row
    counts that are the sums of the shards' and parts') and each shard's
    header and size; on the **first read of each shard** (the first item,
    batch or index read from it, in each process), its CRC-32 against the
    one written (``verify=True``, the default: one pass over the shard's
    bytes, about 1 GB/s); on the first read of :attr:`stats`, the
    statistics file's CRC-32. A mismatch raises ``ValueError`` naming the
    file. Sets written before checksums were stored are read unchecked.

    Parameters
    ----------
    path : str or os.PathLike
        The set's folder (it holds ``manifest.json``).
    latents : {"dense", "sparse"}, default "dense"
        How layers stored sparsely
        (:class:`~scio_recorder.activations.SparseLatents`) are given back:
        dense, ``{name: [d_sae]}`` per token; or as their stored pairs,
        ``{"<name>.indices": [k] int64, "<name>.values": [k]}`` (the ``k``
        largest latents, largest first; unused pairs hold the value 0).
    verify : bool, default True
        Check each shard's CRC-32 when it is first read; ``False`` skips
        it (a set on a trusted disk, read once).

    Attributes
    ----------
    path : Path
        The folder.
    layers : tuple of str
        The layers' names, in the order written.
    dtypes : dict
        Each layer's stored dtype (a sparse layer's: its values').
    dims : dict
        Each layer's vector size ``d`` (a sparse layer's: ``d_sae``).
    sparse : dict
        The layers stored sparsely: name -> ``{"size", "k", "values",
        "indices", "nonzeros"}``.

    Raises
    ------
    FileNotFoundError
        If ``path`` holds no set.
    ValueError
        If the set is unfinished (a write was interrupted: resume it), or
        its manifest is damaged or inconsistent, or a shard's header or size
        is not what the manifest says (at construction); a shard whose bytes
        are not those written (its first read, with ``verify``); a damaged
        statistics file (the first read of :attr:`stats`).

    Examples
    --------
    >>> import tempfile, torch, transformers
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.activations import ActivationDataset, write
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
    >>> ids = torch.randint(0, 20, (3, 5))
    >>> rnet = Recorder(model, input_data={"input_ids": ids})
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     _ = write(rnet, [ids], folder, layers=["h.0"], mask=None)
    ...     ds = ActivationDataset(folder)
    ...     loader = torch.utils.data.DataLoader(ds, batch_size=4)
    ...     len(ds), ds.index[:2].tolist(), [b["h.0"].shape[0] for b in loader]
    (15, [[0, 0], [0, 1]], [4, 4, 4, 3])

    """

    def __init__(
        self,
        path: str | _os.PathLike[str],
        *,
        latents: str = "dense",
        verify: bool = True,
    ) -> None:
        if latents not in ("dense", "sparse"):
            msg = f"`latents` must be 'dense' or 'sparse', got {latents!r}."
            raise ValueError(msg)
        if not isinstance(verify, bool):
            msg = f"`verify` must be True or False, got {verify!r}"
            raise TypeError(msg)
        self.latents = latents
        self.path = Path(path)
        self.verify = verify
        fix = _FIX
        manifest = read_manifest(self.path, fix=fix)
        if manifest is None:
            unfinished = self.path.is_dir() and any(
                _PROGRESS.fullmatch(p.name) for p in self.path.iterdir()
            )
            if unfinished:
                msg = (
                    f"The activation set in '{self.path}' is unfinished (a write was "
                    "interrupted): call `write` again with the same arguments to "
                    "resume and finish it."
                )
                raise ValueError(msg)
            msg = (
                f"'{self.path}' holds no activation set (no {MANIFEST}): write one "
                "with `scio_recorder.activations.write`."
            )
            raise FileNotFoundError(msg)
        self._manifest = manifest
        layers = manifest["layers"]
        self.layers = tuple(layers)
        self._stored = {
            name: (parse_dtype(entry["dtype"]), int(entry["shape"][0]))
            for name, entry in layers.items()
        }
        self.sparse = _sparse_layers(layers, latents, self.path / MANIFEST, fix)
        self.dtypes = {
            name: self.sparse[name]["values"] if name in self.sparse else dtype
            for name, (dtype, _) in self._stored.items()
        }
        self.dims = {
            name: self.sparse[name]["size"] if name in self.sparse else width
            for name, (_, width) in self._stored.items()
        }
        self._files = [entry["file"] for entry in manifest["shards"]]
        counts = [int(entry["tokens"]) for entry in manifest["shards"]]
        self._offsets = [int(entry["row_offset"]) for entry in manifest["shards"]]
        self._starts = [0]
        for count in counts:
            self._starts.append(self._starts[-1] + count)
        self._starts_tensor = torch.tensor(self._starts, dtype=torch.int64)
        for file, count in zip(self._files, counts, strict=True):
            columns = {
                name: (dtype, [count, width])
                for name, (dtype, width) in self._stored.items()
            }
            columns[INDEX] = (torch.int64, [count, 2])
            problem = check_shard(self.path / file, columns)
            if problem is not None:
                msg = (
                    f"The shard '{self.path / file}' of the activation set is not "
                    f"what the manifest says: {problem}. {fix}"
                )
                raise ValueError(msg)
        self._crc32 = [entry.get("crc32") for entry in manifest["shards"]]
        self._verified: set[int] = set()
        """Shards whose CRC-32 was checked (in this process or before a fork)."""
        self._readers: dict[int, ShardReader] = {}
        self._pid = os.getpid()
        self._index: Tensor | None = None
        self._stats: _Stats | None = None

    # -- what the set is ---------------------------------------------------

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest (``manifest.json``) as a dict: model, layers, shards, parts."""
        return self._manifest

    @property
    def index(self) -> Tensor:
        """``[len(ds), 2]`` int64: each token's (row of the stream, column).

        Rows count the rows of the token stream from 0 (under
        :mod:`torch.distributed`: rank 0's rows, then rank 1's, ...; for an
        appended part, after the set's); the column is the position in the
        row as given, padding included. Read from the shards on first use.
        """
        if self._index is None:
            parts = []
            for shard, offset in enumerate(self._offsets):
                where = self._reader(shard).columns[INDEX].clone()
                where[:, 0] += offset
                parts.append(where)
            self._index = (
                torch.cat(parts) if parts else torch.empty((0, 2), dtype=torch.int64)
            )
        return self._index

    @property
    def stats(self) -> Mapping[str, Mapping[str, Tensor]]:
        """Per-layer statistics of a set written with ``stats=True`` (float64).

        ``ds.stats[name]`` has ``"mean"`` and ``"var"`` (population variance)
        per feature, ``"norm"`` (the mean L2 norm of a token's vector) and
        ``"count"`` (tokens), computed before the cast to the stored dtype.
        """
        if self._stats is None:
            values: dict[str, dict[str, Tensor]] = {}
            name = self._manifest.get("stats")
            if name:
                states = load_statistics(self.path, self._manifest, fix=_FIX)
                for layer in self.layers:
                    values[layer] = _layer_stats(states, layer)
            self._stats = _Stats(values, self.path)
        return self._stats

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        return (
            f"ActivationDataset('{self.path}', tokens={len(self)}, "
            f"layers={list(self.layers)})"
        )

    # -- reading ----------------------------------------------------------

    def _reader(self, shard: int) -> ShardReader:
        if self._pid != os.getpid():  # a DataLoader worker: its own maps
            self._readers, self._pid = {}, os.getpid()
        reader = self._readers.get(shard)
        if reader is None:
            path = self.path / self._files[shard]
            crc = (
                None
                if shard in self._verified or not self.verify
                else self._crc32[shard]
            )
            try:
                reader = ShardReader(path, crc)
            except ValueError as error:
                msg = (
                    f"The shard '{path}' of the activation set in '{self.path}' is "
                    f"damaged: {error}. {_FIX} (`ActivationDataset(path, "
                    "verify=False)` reads it unchecked.)"
                )
                raise ValueError(msg) from error
            self._verified.add(shard)
            self._readers[shard] = reader
        return reader

    def __getitem__(self, item: Any) -> dict[str, Tensor]:
        """Token ``item`` as ``{layer: [d]}``; a list, tensor or slice: ``[n, d]``.

        A boolean mask of ``len(ds)`` (a tensor, an array or a list) selects
        the tokens where it is true, as in torch and numpy.
        """
        selected = self._selected(item)
        if isinstance(selected, Tensor):
            return self._gather(selected)
        n = len(self)
        if not -n <= selected < n:
            msg = f"index {selected} is out of range for a set of {n} tokens"
            raise IndexError(msg)
        i = selected % n
        shard = bisect.bisect_right(self._starts, i) - 1
        columns = self._reader(shard).columns
        local = i - self._starts[shard]
        return self._unpacked({name: columns[name][local] for name in self.layers})

    def _unpacked(self, out: dict[str, Tensor]) -> dict[str, Tensor]:
        """Give the sparse layers of ``out`` back dense, or as their pairs."""
        if not self.sparse:
            return out
        result: dict[str, Tensor] = {}
        for key, value in out.items():
            info = self.sparse.get(key)
            if info is None:
                result[key] = value
                continue
            indices, values = unpack(value, info)
            if self.latents == "dense":
                result[key] = densify(indices, values, info["size"])
            else:
                result[f"{key}.indices"] = indices
                result[f"{key}.values"] = values
        return result

    def _selected(self, item: Any) -> Tensor | int:
        """Return the tokens ``item`` selects (1-D), or its one int; refuse the rest."""
        n = len(self)
        if isinstance(item, slice):
            return torch.tensor(range(n)[item], dtype=torch.int64)
        if not isinstance(item, list | tuple | Tensor) and not hasattr(
            item, "__array__"
        ):
            return _one_int(item)
        try:
            indices = torch.as_tensor(item)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(_BAD_INDEX.format(item=item)) from error
        if not indices.numel() and indices.dim() == 1:
            return indices.to(torch.int64)  # `[]`: no token (as_tensor makes floats)
        if indices.dtype == torch.bool:
            if indices.shape != (n,):
                msg = (
                    f"A boolean mask of shape {list(indices.shape)} does not fit a "
                    f"set of {n} tokens: give one of shape [{n}]."
                )
                raise IndexError(msg)
            return indices.nonzero().squeeze(1)
        if indices.is_floating_point() or indices.is_complex():
            msg = (
                f"Index a set with ints or a boolean mask, not {indices.dtype} "
                "values: round them and convert them with `.long()` first."
            )
            raise TypeError(msg)
        if indices.dim() == 0:
            return int(indices)
        if indices.dim() > 1:
            msg = (
                "Index a set with one int or a 1-D sequence of them, not a tensor "
                f"of shape {list(indices.shape)}: flatten it first."
            )
            raise IndexError(msg)
        return indices.to(torch.int64)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Tensor]]:
        """Return a batch of tokens (what a ``DataLoader`` asks), read in one go."""
        batch = self._gather(torch.as_tensor(indices, dtype=torch.int64))
        keys = list(batch)
        rows = zip(*(batch[key].unbind(0) for key in keys), strict=True)
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def _gather(
        self, indices: Tensor, *, index: str | None = None
    ) -> dict[str, Tensor]:
        """Read tokens ``indices`` of every layer (and, as ``index``, their index)."""
        n = len(self)
        if indices.numel() and not bool(((indices >= -n) & (indices < n)).all()):
            bad = indices[(indices < -n) | (indices >= n)][0]
            msg = f"index {int(bad)} is out of range for a set of {n} tokens"
            raise IndexError(msg)
        indices = indices % max(n, 1)
        count = indices.shape[0]
        sizes = dict(self._stored)
        columns = {name: name for name in self.layers}
        if index is not None:
            sizes[index] = (torch.int64, 2)
            columns[index] = INDEX
        out = {
            key: torch.empty((count, width), dtype=dtype)
            for key, (dtype, width) in sizes.items()
        }
        shards = torch.searchsorted(self._starts_tensor, indices, right=True) - 1
        for shard in torch.unique(shards).tolist():
            where = (shards == shard).nonzero().squeeze(1)
            local = indices[where] - self._starts[shard]
            stored = self._reader(shard).columns
            whole = where.shape[0] == count
            for key, column in columns.items():
                rows = stored[column].index_select(0, local)
                if column == INDEX:
                    rows[:, 0] += self._offsets[shard]
                if whole:
                    out[key] = rows
                else:
                    out[key][where] = rows
        return self._unpacked(out)

    def loader(  # noqa: PLR0913 (a DataLoader's options)
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        index: bool = False,
        drop_last: bool = False,
        num_workers: int = 0,
        generator: torch.Generator | None = None,
    ) -> DataLoader[dict[str, Tensor]]:
        """Return a ``DataLoader`` of batches ``{layer: [n, d]}``, read at once.

        The fast way to read: each batch is one ``ds[indices]`` (a gather
        per shard and layer), not ``n`` items stacked. ``index=True`` adds
        ``"index"``, the batch's rows of :attr:`index` (for labels);
        ``shuffle``, ``drop_last``, ``num_workers`` and ``generator`` are the
        ``DataLoader``'s (each worker maps the shards itself). A
        ``DataLoader(ds, batch_size=...)`` gives the same batches, item by
        item then stacked: several times slower.

        Examples
        --------
        >>> import tempfile, torch
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> from scio_recorder.activations import write
        >>> net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
        >>> rnet = Recorder(net, input_data=torch.zeros(1, 2, dtype=torch.long))
        >>> ids = torch.arange(10).reshape(2, 5)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     ds = write(rnet, [ids], folder, layers=["1"], mask=None)
        ...     [tuple(b["1"].shape) for b in ds.loader(4, index=True)]
        [(4, 3), (4, 3), (2, 3)]

        """
        if index and "index" in self.layers:
            msg = (
                "`index=True` adds the key 'index' to each batch, which is also "
                "the name of a layer of this set: read the index with "
                "`ds.index[indices]` instead."
            )
            raise ValueError(msg)
        sampler: Sampler[int] = (
            RandomSampler(self, generator=generator)
            if shuffle
            else SequentialSampler(self)
        )
        return DataLoader(
            _Batches(self, index=index),
            batch_size=None,
            sampler=BatchSampler(sampler, batch_size, drop_last=drop_last),
            num_workers=num_workers,
        )

    def to_arrow(self, folder: str | _os.PathLike[str]) -> list[Path]:
        """Export the set as Arrow files that Hugging Face ``datasets`` opens.

        One Arrow IPC stream file per shard, ``folder/data-<k>-of-<n>.arrow``,
        in the set's order: a column per layer (a fixed-size list of ``d``
        floats; bfloat16 becomes float32, which Arrow has, and float16 stays),
        then ``row`` and ``column`` (int64, as :attr:`index`). Open them with
        ``datasets.concatenate_datasets([datasets.Dataset.from_file(str(p))
        for p in paths])``. Memory holds 65,536 tokens at a time.

        Returns
        -------
        list of Path
            The files written, in order.

        Raises
        ------
        ImportError
            If pyarrow is not installed (the message says how to install it).
        ValueError
            If the set holds latents stored sparsely (not exported).
        """
        if self.sparse:
            msg = (
                f"`to_arrow` exports dense layers; {sorted(self.sparse)} are stored "
                "sparsely (`SparseLatents`): write a set without them to export it."
            )
            raise ValueError(msg)
        return to_arrow(
            [self._reader(shard).columns for shard in range(len(self._files))],
            offsets=self._offsets,
            layers=self.layers,
            dims=self.dims,
            dtypes=self.dtypes,
            manifest=self._manifest,
            folder=Path(folder),
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the maps (a worker maps the shards itself)."""
        state = self.__dict__.copy()
        state["_readers"] = {}
        state["_index"] = None
        return state


class _Batches(Dataset[dict[str, Tensor]]):
    """A set read by batches of indices (what :meth:`ActivationDataset.loader` uses)."""

    def __init__(self, data: ActivationDataset, *, index: bool) -> None:
        self.data = data
        self.index = index

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, indices: list[int]) -> dict[str, Tensor]:
        where = torch.as_tensor(indices, dtype=torch.int64)
        return self.data._gather(where, index="index" if self.index else None)  # noqa: SLF001 (this module's own class)


def _sparse_layers(
    layers: Mapping[str, Any], latents: str, manifest: Path, fix: str
) -> dict[str, dict[str, Any]]:
    """Return the layers stored sparsely and how (see ``_sparse.sparse_info``)."""
    sparse: dict[str, dict[str, Any]] = {}
    for name, entry in layers.items():
        try:
            info = sparse_info(entry)
        except ValueError as error:
            msg = (
                f"The manifest '{manifest}' of the activation set is damaged or "
                f"was edited: layer {name!r}: {error}. {fix}"
            )
            raise ValueError(msg) from error
        if info is None:
            continue
        sparse[name] = info
        for key in (f"{name}.indices", f"{name}.values"):
            if latents == "sparse" and key in layers:
                msg = (
                    f"`latents='sparse'` gives layer {name!r} as {key!r}, which "
                    "is also a layer of the set: read it with `latents='dense'`."
                )
                raise ValueError(msg)
    return sparse


def _layer_stats(states: Mapping[str, Tensor], layer: str) -> dict[str, Tensor]:
    values = load_moments(states, f"stats/{layer}/").result()
    norms = load_moments(states, f"norms/{layer}/").result()
    return {
        "mean": values.mean,
        "var": values.var_population,
        "norm": norms.mean[0],
        "count": torch.tensor(values.count),
    }
