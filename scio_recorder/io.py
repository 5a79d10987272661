"""Save records to a safetensors file and load them back, safely.

:func:`save_records` writes records (``rnet.activations`` or any mapping from
labels ``(depth, idx)`` or strings to tensors and nested tuples, lists and dicts
of them) to one `safetensors <https://huggingface.co/docs/safetensors>`_ file.
The structure of each record and a *label map* (for each label: the module's
qualified name, call index and type, and each tensor's shape and dtype) are
stored as JSON in the file's metadata. :func:`load_records` reads the file
with safetensors only, never :mod:`pickle` nor :func:`torch.load`, so loading
an untrusted file cannot run code. It checks every tensor against the label
map, and the label map against a layer table when one is given.

The file layout is documented in ``docs/saving.md``.

Examples
--------
>>> import tempfile
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> from scio_recorder.io import load_records, save_records
>>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5))
>>> rnet.record((1, 1), (1, 2))
>>> _ = rnet(torch.rand(2, 5))
>>> with tempfile.TemporaryDirectory() as folder:
...     path = save_records(folder, rnet.activations, rnet.table)
...     loaded = load_records(path, rnet.table)
>>> path.name
'records.safetensors'
>>> list(loaded)
[(1, 1), (1, 2)]
>>> torch.equal(loaded[(1, 2)], rnet.activations[(1, 2)])
True
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_FILENAME",
    "FORMAT_VERSION",
    "MAX_NESTING",
    "RecordInfo",
    "RecordKey",
    "Records",
    "load_records",
    "save_records",
]

import dataclasses
import functools
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import safetensors
import safetensors.torch
import torch

from ._support.files import dtype_name, library_version, write_atomic
from .layers import DepthIdx, as_table, label_str

if TYPE_CHECKING:
    from .layers import Layer
    from .recorder import Recorder

RecordKey: TypeAlias = DepthIdx | str
"""The key of a record: a layer label ``(depth, idx)`` or a string."""

FORMAT_VERSION = 1
"""The version of the file layout written by :func:`save_records`."""

DEFAULT_FILENAME = "records.safetensors"
"""The file name used when :func:`save_records` is given a directory."""

MAX_NESTING = 250
"""The deepest nesting of tuples, lists and dicts a record may have.

A tensor inside 250 nested lists saves and loads; one more level is refused
by :func:`save_records` (before anything is written) and, in a file made by
other means, by :func:`load_records`. Both walk the structure recursively:
the limit keeps them, and the JSON of the label map (two levels per
container), well inside Python's default recursion limit of 1000.
"""

_PREFIX = "scio_recorder."
_FORMAT_KEY = _PREFIX + "format_version"
_VERSION_KEY = _PREFIX + "version"
_TORCH_KEY = _PREFIX + "torch_version"
_RECORDS_KEY = _PREFIX + "records"
_STRING_PREFIX = "str:"
_LEAF_TYPES = "tensors, None, bool, int, float and str"

PathLike: TypeAlias = str | os.PathLike[str]


# ----------------------------------------------------------------- public types


@dataclasses.dataclass(frozen=True)
class RecordInfo:
    """What the label map of a file says about one record.

    Attributes
    ----------
    key : tuple of (int, int) or str
        The record's key: a label ``(depth, idx)`` or a string.
    name : str or None
        The qualified name of the recorded module (``""`` for the whole net),
        or ``None`` when the record was saved without a table or has a
        string key.
    call_index : int or None
        Which call of the module the record is (0 for the first), or ``None``
        as for ``name`` (and for container rows, which are not calls).
    module_type : str or None
        The class name of the module, or ``None`` as for ``name``.
    shapes : Mapping of str to tuple of int
        The shape of each tensor of the record, by its path in the record:
        ``""`` for a record that is a tensor, else the indices and dict keys
        from the record down to the tensor joined by ``/`` (``"0"``,
        ``"logits"``, ``"1/logits"``), with ``%`` and ``/`` in dict keys
        written ``%25`` and ``%2F``.
    dtypes : Mapping of str to torch.dtype
        The dtype of each tensor of the record, by its path as in ``shapes``.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from scio_recorder.io import load_records, save_records
    >>> records = {(1, 2): {"logits": torch.zeros(2, 3), "n": 7}}
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     loaded = load_records(save_records(folder, records))
    >>> info = loaded.label_map[(1, 2)]
    >>> info.name is None, dict(info.shapes), dict(info.dtypes)
    (True, {'logits': (2, 3)}, {'logits': torch.float32})

    """

    key: RecordKey
    name: str | None
    call_index: int | None
    module_type: str | None
    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, torch.dtype]

    def describe(self) -> str:
        """Describe the record's module in words, for messages.

        Examples
        --------
        >>> from types import MappingProxyType as M
        >>> RecordInfo((1, 1), "0", 0, "Linear", M({}), M({})).describe()
        '`0` (Linear, call 0)'

        """
        return _describe_module(self.name, self.module_type, self.call_index)


class Records(Mapping[RecordKey, Any]):
    """Records loaded by :func:`load_records`: a read-only mapping.

    Maps each key (a label ``(depth, idx)`` as a tuple, or a string) to its
    record, in the order they were saved.

    Attributes
    ----------
    label_map : Mapping of key to RecordInfo
        The label map stored in the file, read-only.
    metadata : Mapping of str to str
        The file's other metadata, read-only: ``scio_recorder.format_version``,
        ``scio_recorder.version`` (of the library that wrote the file),
        ``scio_recorder.torch_version`` and the ``extra_metadata`` given to
        :func:`save_records`.
    path : pathlib.Path
        The file read.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from scio_recorder.io import load_records, save_records
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_records(folder, {"fn.out": torch.ones(2)})
    ...     loaded = load_records(path)
    >>> loaded["fn.out"]
    tensor([1., 1.])
    >>> loaded.metadata["scio_recorder.format_version"]
    '1'
    >>> loaded["other"] = torch.ones(1)
    Traceback (most recent call last):
    ...
    TypeError: 'Records' object does not support item assignment

    """

    def __init__(
        self,
        records: dict[RecordKey, Any],
        label_map: dict[RecordKey, RecordInfo],
        metadata: dict[str, str],
        path: Path,
    ) -> None:
        self._records = records
        self.label_map: Mapping[RecordKey, RecordInfo] = MappingProxyType(label_map)
        self.metadata: Mapping[str, str] = MappingProxyType(metadata)
        self.path = path

    def __getitem__(self, key: RecordKey) -> Any:
        """Return the record saved under ``key``."""
        return self._records[key]

    def __iter__(self) -> Iterator[RecordKey]:
        """Iterate over keys in the order they were saved."""
        return iter(self._records)

    def __len__(self) -> int:
        """Return the number of records."""
        return len(self._records)

    def __repr__(self) -> str:
        keys = ", ".join(_key_str(key) for key in self._records)
        return f"<Records from '{self.path}': {keys or 'no records'}>"


# ------------------------------------------------------------------------ save


def save_records(
    path: PathLike,
    records: Mapping[DepthIdx, object]
    | Mapping[str, object]
    | Mapping[RecordKey, object],
    table: Mapping[DepthIdx, Layer] | Recorder | None = None,
    *,
    extra_metadata: Mapping[str, str] | None = None,
) -> Path:
    """Save records to one safetensors file.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write. If it is an existing directory, or a string ending
        with ``/`` (created if missing), the file is ``records.safetensors``
        inside it. An existing file is replaced; the file is written to a
        temporary name first, so a failed save leaves no partial file.
    records : Mapping
        Key -> record. A key is a label ``(depth, idx)`` of non-negative
        ints, or a string (e.g. for records that do not come from a
        :class:`~scio_recorder.Recorder`). A record is a tensor, ``None``, a
        bool, int, float or str, or a tuple, list or dict (with str keys) of
        records. Tuple and dict subclasses (named tuples, ``OrderedDict``)
        come back as plain tuples and dicts.
    table : LayerTable or Recorder, optional
        The layer table the labels come from (or the Recorder holding it).
        When given, the label map stores each label's module name, call index
        and module type, which :func:`load_records` can check; every label
        must be in the table. Without it, only shapes and dtypes are stored.
    extra_metadata : Mapping of str to str, optional
        More metadata to store; keys must not start with ``scio_recorder.``.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    TypeError
        If a key is neither a label nor a string, a record holds an object of
        another type, a dict key is not a string, a tensor is sparse, nested,
        quantized or on the meta device, or its dtype cannot be stored in
        safetensors; or if ``extra_metadata`` is not str -> str.
    ValueError
        If ``table`` is given and a label is not in it, an ``extra_metadata``
        key starts with ``scio_recorder.``, or a string key or dict key holds
        a lone surrogate (safetensors keys must be UTF-8).

    Notes
    -----
    Tensors are detached and copied to the CPU. Views that do not span their
    whole storage, non-contiguous tensors and tensors sharing storage are
    copied into compact tensors (safetensors refuses shared storage). A tensor
    that appears several times (the same view of the same storage, e.g. the
    net's output also recorded as its last layer's output) is stored once and
    every occurrence refers to it; :func:`load_records` gives all of them the
    same tensor.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> x = torch.arange(6.0).reshape(2, 3)
    >>> records = {(1, 1): x, (1, 2): (x.t(), None), "fn.out": {"a/b": 1.5}}
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_records(folder + "/run/", records)
    ...     loaded = load_records(path)
    >>> path.parent.name, path.name
    ('run', 'records.safetensors')
    >>> loaded[(1, 2)][1], loaded["fn.out"]
    (None, {'a/b': 1.5})
    >>> dict(loaded.label_map[(1, 2)].shapes)
    {'0': (3, 2)}

    """
    layers = as_table(table, "`table=` of save_records")
    metadata = _check_extra_metadata(extra_metadata)
    encoder = _Encoder()
    entries: list[dict[str, Any]] = []
    for key, record in records.items():
        prefix = _key_prefix(key)
        entry: dict[str, Any] = {"key": list(key) if isinstance(key, tuple) else key}
        if layers is not None and isinstance(key, tuple):
            row = layers.get(key)
            if row is None:
                msg = (
                    f"Cannot save the record of layer {prefix}: it is not in the "
                    "given table. Pass the table of the Recorder that made the "
                    "records, or save without `table=`."
                )
                raise ValueError(msg)
            entry["name"] = row.name
            entry["call_index"] = row.call_index
            entry["module_type"] = type(row.module).__name__
        encoder.records[_key_str(key)] = record
        entry["record"] = encoder.encode(record, prefix, _key_str(key), "")
        entries.append(entry)
    metadata |= {
        _FORMAT_KEY: str(FORMAT_VERSION),
        _VERSION_KEY: library_version(),
        _TORCH_KEY: str(torch.__version__),
        _RECORDS_KEY: json.dumps(entries, separators=(",", ":"), allow_nan=False),
    }
    target = _resolve(path, writing=True)
    write_atomic(
        target,
        lambda path: safetensors.torch.save_file(
            encoder.tensors, str(path), metadata=metadata
        ),
    )
    return target


class _Encoder:
    """Flatten records into tensors by key and JSON-able structure nodes."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        # A view seen before -> the key it is stored under.
        self._views: dict[tuple[Any, ...], str] = {}
        # Storages already used by a stored tensor.
        self._storages: set[int] = set()
        # The tensors given, kept alive so that their addresses stay theirs
        # (a mapping may compute its values on access).
        self._given: list[torch.Tensor] = []
        # Each record by its name in messages, to measure one nested too deeply.
        self.records: dict[str, object] = {}

    def encode(
        self, value: object, key: str, record: str, where: str, depth: int = 0
    ) -> Any:
        if depth > MAX_NESTING:
            raise ValueError(_too_deep(self.records[record], record, where))
        if isinstance(value, torch.Tensor):
            return self._tensor(value, key, record, where)
        scalar = _scalar_node(value)
        if scalar is not None:
            return scalar
        if isinstance(value, tuple | list):
            kind = "tuple" if isinstance(value, tuple) else "list"
            items = [
                self.encode(item, f"{key}/{i}", record, f"{where}[{i}]", depth + 1)
                for i, item in enumerate(value)
            ]
            return {"type": kind, "items": items}
        if isinstance(value, dict):
            pairs = []
            for name, item in value.items():
                if not isinstance(name, str):
                    msg = (
                        f"Cannot save the record of {record}: the dict at "
                        f"`{where or 'top level'}` has the key {name!r} "
                        f"({type(name).__name__}); only str keys can be saved."
                    )
                    raise TypeError(msg)
                node = self.encode(
                    item,
                    f"{key}/{_escape(name)}",
                    record,
                    f"{where}[{name!r}]",
                    depth + 1,
                )
                pairs.append([str(name), node])
            return {"type": "dict", "items": pairs}
        msg = (
            f"Cannot save the record of {record}: `{where or 'the record'}` is "
            f"a {type(value).__name__}. Records may hold {_LEAF_TYPES}, and "
            "tuples, lists and dicts with str keys of those."
        )
        raise TypeError(msg)

    def _tensor(
        self, tensor: torch.Tensor, key: str, record: str, where: str
    ) -> dict[str, Any]:
        problem = _unsavable(tensor)
        if problem:
            shown = where or "the record"
            msg = f"Cannot save the record of {record}: `{shown}` {problem}"
            raise TypeError(msg)
        node = {
            "type": "tensor",
            "key": key,
            "shape": list(tensor.shape),
            "dtype": dtype_name(tensor.dtype),
        }
        view = None
        self._given.append(tensor)
        if tensor.numel() and tensor.untyped_storage().data_ptr():
            view = (
                tensor.device,
                tensor.untyped_storage().data_ptr(),
                tensor.storage_offset(),
                tuple(tensor.shape),
                tensor.stride(),
                tensor.dtype,
            )
            if view in self._views:
                node["key"] = self._views[view]
                return node
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.to("cpu")
        data = data.resolve_conj().resolve_neg()
        storage = data.untyped_storage()
        compact = (
            data.is_contiguous()
            and data.storage_offset() == 0
            and storage.nbytes() == data.numel() * data.element_size()
        )
        if not compact or storage.data_ptr() in self._storages:
            data = data.clone(memory_format=torch.contiguous_format)
        if data.untyped_storage().data_ptr():
            self._storages.add(data.untyped_storage().data_ptr())
        self.tensors[key] = data
        if view is not None:
            self._views[view] = key
        return node


def _too_deep(value: object, record: str, where: str) -> str:
    """Return the message for a record nested deeper than :data:`MAX_NESTING`."""
    depth = _nesting_depth(value)
    how_deep = (
        "holds itself, so it is infinitely deep"
        if depth is None
        else f"is nested {depth} containers deep"
    )
    return (
        f"Cannot save the record of {record}: it {how_deep} (`{where:.40}...`), "
        f"deeper than the limit scio_recorder.io.MAX_NESTING = {MAX_NESTING} "
        "that `load_records` reads back. Flatten it (e.g. into a dict with str "
        "keys) or save its parts under several keys. Nothing was written."
    )


def _nesting_depth(value: object) -> int | None:
    """Return how many containers deep ``value`` is, ``None`` if it holds itself.

    The depth of the deepest item: iterative, so any depth is measured
    without recursion. A tensor and ``[]`` are 0 deep, ``[tensor]`` and
    ``[[]]`` 1, ``{"a": [tensor]}`` 2.
    """
    deepest = 0
    on_path: set[int] = set()
    stack: list[tuple[object, int, bool]] = [(value, 0, True)]
    while stack:
        item, depth, entering = stack.pop()
        if not entering:
            on_path.discard(id(item))
            continue
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, tuple | list):
            children = list(item)
        else:
            continue
        if id(item) in on_path:
            return None
        on_path.add(id(item))
        stack.append((item, depth, False))
        stack.extend((child, depth + 1, True) for child in children)
    return deepest


def _scalar_node(value: object) -> dict[str, Any] | None:
    """Return the node of a non-tensor leaf, or ``None`` if not a leaf."""
    if value is None:
        return {"type": "none"}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": int(value)}
    if isinstance(value, float):
        return {"type": "float", "value": float(value).hex()}
    if isinstance(value, str):
        return {"type": "str", "value": str(value)}
    return None


def _unsavable(tensor: torch.Tensor) -> str:
    """Say why ``tensor`` cannot be stored, or return ``""``."""
    if tensor.is_nested:
        return "is a nested tensor; save its components as a list instead."
    if tensor.layout != torch.strided:
        return f"is a {tensor.layout} tensor; convert it with `.to_dense()` first."
    if tensor.is_quantized:
        return "is a quantized tensor; convert it with `.dequantize()` first."
    if tensor.device.type == "meta":
        return "is on the meta device and has no data."
    if not _dtype_supported(tensor.dtype):
        return (
            f"has dtype {dtype_name(tensor.dtype)}, which safetensors cannot "
            "store; cast it (e.g. `.float()`) first."
        )
    return ""


@functools.cache
def _dtype_supported(dtype: torch.dtype) -> bool:
    """Whether the installed safetensors can store ``dtype``."""
    try:
        safetensors.torch.save({"probe": torch.zeros(1, dtype=dtype)})
    except Exception:  # noqa: BLE001 (any failure means "cannot store")
        return False
    return True


def _check_extra_metadata(extra: Mapping[str, str] | None) -> dict[str, str]:
    if extra is None:
        return {}
    checked = {}
    for key, value in extra.items():
        if not isinstance(key, str) or not isinstance(value, str):
            msg = (
                f"`extra_metadata` must map str to str, got {key!r}: {value!r}; "
                "encode other values yourself (e.g. with `json.dumps`)."
            )
            raise TypeError(msg)
        if key.startswith(_PREFIX):
            msg = (
                f"`extra_metadata` key {key!r} starts with {_PREFIX!r}, which is "
                "reserved for scio_recorder's own metadata; rename it."
            )
            raise ValueError(msg)
        checked[key] = value
    return checked


# ------------------------------------------------------------------------ load


def load_records(
    path: PathLike,
    table: Mapping[DepthIdx, Layer] | Recorder | None = None,
    *,
    device: torch.device | str = "cpu",
) -> Records:
    """Load records saved by :func:`save_records`, checking them.

    The file is read with safetensors only: no :mod:`pickle`, no
    :func:`torch.load`, so an untrusted file cannot run code.

    Parameters
    ----------
    path : str or os.PathLike
        The file to read, or a directory holding ``records.safetensors``.
    table : LayerTable or Recorder, optional
        If given, check that each saved label names, in this table, the same
        module (qualified name and type) and the same call as when it was
        saved.
    device : torch.device or str, default "cpu"
        Where to put the tensors (they are read to the CPU, then moved).

    Returns
    -------
    Records
        Key -> record, in the order saved, with ``.label_map`` and
        ``.metadata``. Labels come back as tuples ``(depth, idx)``.

    Raises
    ------
    FileNotFoundError
        If there is no such file.
    ValueError
        If the file is not a safetensors file written by :func:`save_records`,
        is in a newer format than this version reads, or is corrupted (a
        tensor's shape or dtype disagrees with the label map, a tensor is
        missing or not in the label map, the metadata is malformed); or if
        ``table`` is given and a saved label is missing from it or names
        another module or call, or the file was saved without a table.

    Examples
    --------
    >>> import tempfile
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
    >>> rnet.record((1, 1))
    >>> _ = rnet(torch.rand(2, 5))
    >>> other = Recorder(nn.Sequential(nn.ReLU()), input_size=(1, 5))
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save_records(folder, rnet.activations, rnet)
    ...     loaded = load_records(path, rnet)
    ...     load_records(path, other)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Layer 1-1 was saved from module `0` (Linear, call 0), but in the given table 1-1 is module `0` (ReLU, call 0)...
    >>> loaded.label_map[(1, 1)].describe()
    '`0` (Linear, call 0)'

    """  # noqa: E501 (doctest output)
    layers = as_table(table, "`table=` of load_records")
    target = torch.device(device)
    source = _resolve(path, writing=False)
    if not source.is_file():
        msg = f"No records file at '{source}'"
        raise FileNotFoundError(msg)
    try:
        with safetensors.safe_open(str(source), framework="pt") as file:
            metadata = dict(file.metadata() or {})
            entries = _read_header(source, metadata)
            decoder = _Decoder(source, file, target)
            records: dict[RecordKey, Any] = {}
            label_map: dict[RecordKey, RecordInfo] = {}
            for position, raw in enumerate(entries):
                key, info_fields = _read_entry(raw, position, decoder)
                if key in records:
                    decoder.fail(f"the key {_key_str(key)} appears twice")
                decoder.shapes, decoder.dtypes = {}, {}
                records[key] = decoder.decode(raw["record"], _key_str(key), ())
                label_map[key] = RecordInfo(
                    key,
                    *info_fields,
                    shapes=MappingProxyType(decoder.shapes),
                    dtypes=MappingProxyType(decoder.dtypes),
                )
            unused = sorted(set(file.keys()) - decoder.used)
            if unused:
                decoder.fail(f"it holds tensors that no record uses: {unused}")
    except safetensors.SafetensorError as error:
        msg = (
            f"'{source}' is not a valid safetensors file ({error}). It was not "
            "written by `save_records`, or it is damaged."
        )
        raise ValueError(msg) from error
    if layers is not None:
        _check_table(label_map, layers)
    del metadata[_RECORDS_KEY]
    return Records(records, label_map, metadata, source)


def _read_header(source: Path, metadata: dict[str, str]) -> list[Any]:
    """Check the format version and return the parsed label map entries."""
    if _FORMAT_KEY not in metadata or _RECORDS_KEY not in metadata:
        msg = (
            f"'{source}' is a safetensors file but not a records file written by "
            f"`save_records`: its metadata has no {_FORMAT_KEY!r} and "
            f"{_RECORDS_KEY!r}. Read it with `safetensors.torch.load_file`."
        )
        raise ValueError(msg)
    text = metadata[_FORMAT_KEY]
    if not (text.isascii() and text.isdigit()):
        msg = _corrupted(source, f"its format version {text!r} is not an integer")
        raise ValueError(msg)
    version = int(text)
    if version > FORMAT_VERSION:
        msg = (
            f"'{source}' uses records format {version}, written by scio_recorder "
            f"{metadata.get(_VERSION_KEY, '(unknown version)')}; this "
            f"scio_recorder ({library_version()}) reads formats up to "
            f"{FORMAT_VERSION}. Upgrade scio_recorder to load it."
        )
        raise ValueError(msg)
    try:
        entries = json.loads(metadata[_RECORDS_KEY])
    except (ValueError, RecursionError) as error:
        msg = _corrupted(source, f"its label map is not valid JSON ({error})")
        raise ValueError(msg) from error
    if not isinstance(entries, list):
        msg = _corrupted(source, "its label map is not a JSON list")
        raise ValueError(msg)  # noqa: TRY004 (a corrupted file, like the others)
    return entries


class _Decoder:
    """Rebuild records from JSON nodes and the file's tensors, checking both."""

    def __init__(self, source: Path, file: Any, device: torch.device) -> None:
        self.source = source
        self.file = file
        self.keys = set(file.keys())
        self.device = device
        self.used: set[str] = set()
        self.loaded: dict[str, torch.Tensor] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}

    def fail(self, problem: str) -> NoReturn:
        raise ValueError(_corrupted(self.source, problem))

    def node_type(self, node: object, where: str) -> str:
        if not isinstance(node, dict) or not isinstance(node.get("type"), str):
            self.fail(f"the structure of {where} has a malformed node {node!r:.80}")
        kind: str = node["type"]
        return kind

    def decode(self, node: Any, where: str, path: tuple[str, ...]) -> Any:  # noqa: C901, PLR0911 (one branch per node type)
        if len(path) > MAX_NESTING:
            self.fail(
                f"the structure of {where:.60}... is nested more than "
                f"scio_recorder.io.MAX_NESTING = {MAX_NESTING} containers deep, "
                "the limit `save_records` writes"
            )
        kind = self.node_type(node, where)
        value = node.get("value")
        if kind == "tensor":
            return self._tensor(node, where, "/".join(path))
        if kind == "none":
            return None
        if kind == "bool" and isinstance(value, bool):
            return value
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "float" and isinstance(value, str):
            try:
                return float.fromhex(value)
            except ValueError:
                self.fail(f"{where} holds the malformed float {value!r:.80}")
        if kind == "str" and isinstance(value, str):
            return value
        items = node.get("items")
        if kind in {"tuple", "list"} and isinstance(items, list):
            rebuilt = [
                self.decode(item, f"{where}[{i}]", (*path, str(i)))
                for i, item in enumerate(items)
            ]
            return tuple(rebuilt) if kind == "tuple" else rebuilt
        if kind == "dict" and isinstance(items, list):
            result: dict[str, Any] = {}
            for pair in items:
                if not (
                    isinstance(pair, list)
                    and len(pair) == 2  # noqa: PLR2004 (a pair)
                    and isinstance(pair[0], str)
                    and pair[0] not in result
                ):
                    self.fail(f"a dict of {where} has a malformed item {pair!r:.80}")
                result[pair[0]] = self.decode(
                    pair[1], f"{where}[{pair[0]!r}]", (*path, _escape(pair[0]))
                )
            return result
        self.fail(f"the structure of {where} has a malformed node {node!r:.80}")
        return None  # pragma: no cover - fail raises

    def _tensor(self, node: dict[str, Any], where: str, path: str) -> torch.Tensor:
        key, shape, dtype = node.get("key"), node.get("shape"), node.get("dtype")
        if not (
            isinstance(key, str)
            and isinstance(dtype, str)
            and isinstance(shape, list)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in shape)
        ):
            self.fail(f"the tensor node of {where} is malformed: {node!r:.80}")
        if key not in self.keys:
            self.fail(f"the tensor {key!r} of {where} is missing from the file")
        tensor = self.loaded.get(key)
        if tensor is None:
            tensor = self.file.get_tensor(key)
            if self.device.type != "cpu":
                tensor = tensor.to(self.device)
            self.loaded[key] = tensor
        found = (tuple(tensor.shape), dtype_name(tensor.dtype))
        expected = (tuple(shape), dtype)
        if found != expected:
            self.fail(
                f"the tensor {key!r} of {where} has shape {found[0]} and dtype "
                f"{found[1]}, but the label map says shape {expected[0]} and "
                f"dtype {expected[1]}. The file was modified or damaged after "
                "it was saved"
            )
        self.used.add(key)
        self.shapes[path] = found[0]
        self.dtypes[path] = tensor.dtype
        return tensor


def _read_entry(
    raw: object, position: int, decoder: _Decoder
) -> tuple[RecordKey, tuple[str | None, int | None, str | None]]:
    """Return the key and module fields of one label map entry, checked."""
    if not isinstance(raw, dict) or "key" not in raw or "record" not in raw:
        decoder.fail(f"entry {position} of its label map is malformed: {raw!r:.80}")
    fields: dict[str, Any] = raw
    key = fields["key"]
    if isinstance(key, list) and len(key) == 2 and all(_is_index(n) for n in key):  # noqa: PLR2004 (a pair)
        key = (key[0], key[1])
    elif not isinstance(key, str):
        decoder.fail(f"entry {position} of its label map has the bad key {key!r:.80}")
    name, call_index, module_type = (
        fields.get("name"),
        fields.get("call_index"),
        fields.get("module_type"),
    )
    if not (
        (name is None or isinstance(name, str))
        and (call_index is None or _is_index(call_index))
        and (module_type is None or isinstance(module_type, str))
    ):
        decoder.fail(f"the module fields of {_key_str(key)} are malformed")
    return key, (name, call_index, module_type)


def _check_table(
    label_map: Mapping[RecordKey, RecordInfo], layers: Mapping[DepthIdx, Layer]
) -> None:
    """Check that each saved label names the same module call in ``layers``."""
    advice = (
        "Rebuild the Recorder with the same net and input as when saving, or "
        "load without `table=` to skip this check."
    )
    for key, info in label_map.items():
        if not isinstance(key, tuple):
            continue
        label = _key_str(key)
        if info.name is None:
            msg = (
                f"Layer {label} was saved without a layer table, so it cannot be "
                "checked against the given table. Load without `table=`, or "
                "save with `table=` to store the module of each label."
            )
            raise ValueError(msg)
        saved = f"module {info.describe()}"
        row = layers.get(key)
        if row is None:
            msg = (
                f"Layer {label} was saved from {saved}, but the given table has "
                f"no layer {label}. {advice}"
            )
            raise ValueError(msg)
        current = (row.name, type(row.module).__name__, row.call_index)
        if current != (info.name, info.module_type, info.call_index):
            msg = (
                f"Layer {label} was saved from {saved}, but in the given table "
                f"{label} is module {_describe_module(*current)}. {advice}"
            )
            raise ValueError(msg)


# --------------------------------------------------------------------- helpers


def _resolve(path: PathLike, *, writing: bool) -> Path:
    """Return the file for ``path``, which may name a directory."""
    text = os.fspath(path)
    resolved = Path(text)
    if resolved.is_dir() or text.endswith(("/", os.sep)):
        if writing:
            resolved.mkdir(parents=True, exist_ok=True)
        return resolved / DEFAULT_FILENAME
    return resolved


def _key_prefix(key: object) -> str:
    """Return the tensor key of the record saved under ``key``."""
    if isinstance(key, tuple) and len(key) == 2 and all(map(_is_index, key)):  # noqa: PLR2004 (a pair)
        return label_str(key)
    if isinstance(key, str):
        return _STRING_PREFIX + _escape(key)
    msg = (
        f"Cannot save the record keyed {key!r} ({type(key).__name__}): keys must "
        "be labels `(depth, idx)` of non-negative ints, or strings."
    )
    raise TypeError(msg)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _key_str(key: RecordKey) -> str:
    """Show a key in messages: ``1-3`` for a label, ``'name'`` for a string."""
    return label_str(key) if isinstance(key, tuple) else repr(key)


def _escape(name: str) -> str:
    """Escape ``%`` and ``/`` so that ``/`` separates path components only."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as error:
        msg = (
            f"Cannot save the key {name!r}: it is not valid Unicode (it holds a "
            "lone surrogate), and safetensors keys must be UTF-8."
        )
        raise ValueError(msg) from error
    return name.replace("%", "%25").replace("/", "%2F")


def _describe_module(
    name: str | None, module_type: str | None, call: int | None
) -> str:
    shown = f"`{name}`" if name else "the whole net"
    call_text = "not a call" if call is None else f"call {call}"
    return f"{shown} ({module_type}, {call_text})"


def _corrupted(source: Path, problem: str) -> str:
    return f"The records file '{source}' is corrupted: {problem}."
