"""Collect layer statistics and features over a whole data set.

:func:`collect` runs a :class:`~scio_recorder.Recorder` over every batch of an
iterable (a ``DataLoader``, a list, a generator) and feeds what the chosen
layers output to reducers (:mod:`scio_recorder.reduce`):

* streaming statistics whose memory does not grow with the data set (moments,
  covariances, per-class statistics, Gram matrices, quantile sketches, ...),
  exact and in float64;
* ``"concat"``: the per-sample features themselves, kept on the CPU and
  spilled to disk beyond a memory budget; the result is one tensor, memory
  mapped from its file when it was spilled.

With a ``spill_dir`` the run checkpoints as it goes (reducer states, spilled
rows and a manifest, written atomically), so an interrupted run, rerun with
the same arguments, resumes after its last checkpoint and gives exactly the
result of an uninterrupted run. Under :mod:`torch.distributed` each rank
reduces its shard, then the statistics are merged and the concatenations
gathered. :func:`estimate` says beforehand how many bytes a run handles.

Why: out-of-distribution scores and probes need statistics or features of a
few layers over a whole training set, and the loop that computes them is
easy to get subtly wrong: autograd graphs kept alive, the recorder's
selection left changed, every feature held in RAM, hours lost to a crash,
ranks not merged. This module writes that loop once. Semantics and file
layout are documented in ``docs/collect.md``.

Examples
--------
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> from scio_recorder.collect import collect
>>> _ = torch.manual_seed(0)
>>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
>>> rnet = Recorder(net, input_size=(1, 5))
>>> data = [(torch.randn(8, 5), torch.randint(0, 3, (8,))) for _ in range(4)]
>>> result = collect(rnet, data, {(1, 1): "concat", "2": "moments"})
>>> result[(1, 1)].shape, result[(1, 3)].count, result.samples
(torch.Size([32, 4]), 32, 32)

"""

from __future__ import annotations

__all__ = [
    "CONCAT",
    "MANIFEST",
    "STATISTICS",
    "BatchSpec",
    "CollectResult",
    "Estimate",
    "Gather",
    "LabelEstimate",
    "ReducerSpec",
    "collect",
    "estimate",
]

import dataclasses
import hashlib
import importlib
import importlib.metadata
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import safetensors.torch
import torch
from torch import Tensor

from . import reduce as _reduce
from .io import load_records, save_records
from .layers import DepthIdx
from .recorder import Recorder
from .reduce import (
    Concat,
    Count,
    Covariance,
    Gram,
    Keep,
    MinMax,
    Moments,
    PerClass,
    Quantiles,
    Reducer,
    SharedCovariance,
    make_reducer,
)
from .select import resolve

if TYPE_CHECKING:
    from .layers import Layer, LayerTable
    from .select import Selector

logger = logging.getLogger(__name__)

ReducerSpec: TypeAlias = str | Reducer | Callable[[Any, Any], Any]
"""What :func:`collect` accepts per selector: ``"concat"``, a name, a reducer,
or a fold function ``fn(acc, new) -> acc`` (see :func:`collect`)."""

BatchSpec: TypeAlias = int | str | Callable[[Any], Any] | None
"""How to take the input (or the target) out of a batch (see :func:`collect`)."""

Gather: TypeAlias = Literal["all", 0] | None
"""Where merged results go under :mod:`torch.distributed` (see :func:`collect`)."""

CONCAT = "concat"
"""The spec that concatenates per-sample features (with spilling)."""

STATISTICS: Mapping[str, Callable[[], Reducer]] = MappingProxyType(
    {
        "count": Count,
        "moments": Moments,
        "covariance": Covariance,
        "gram": Gram,
        "minmax": MinMax,
    }
)
"""Names of data-set statistics :func:`collect` accepts besides ``"concat"``
and the names of :func:`~scio_recorder.reduce.make_reducer`."""

MANIFEST = "collect-manifest.json"
"""The manifest file written in ``spill_dir``."""

_FORMAT = 1
_CHUNK_BYTES = 1 << 26  # distributed transfers move at most 64 MiB at a time
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_STATES = ("states-0.safetensors", "states-1.safetensors")
_TYPE_KEY = "__collect_type__"
_META_PREFIX = "collect."


# ======================================================================= specs
def _template(selector: Selector, spec: object) -> Reducer | None:
    """Return the reducer template of ``spec``; ``None`` means concatenate."""
    where = f"keep[{selector!r}]"
    if isinstance(spec, str):
        if spec == CONCAT:
            return None
        if spec in STATISTICS:
            return STATISTICS[spec]()
        try:
            return make_reducer(spec)
        except ValueError as error:
            names = ", ".join(repr(n) for n in (CONCAT, *STATISTICS))
            msg = f"{where}: {error}; collect also accepts {names}"
            raise ValueError(msg) from None
    if type(spec) is Concat:
        return None
    try:
        return make_reducer(spec)  # type: ignore[arg-type] # checked by make_reducer
    except TypeError as error:
        msg = (
            f"{where}: {error}. Use 'concat', a statistic name "
            f"({', '.join(map(repr, STATISTICS))}), a reducer instance such as "
            "`Moments()`, or a fold function fn(acc, new) -> acc."
        )
        raise TypeError(msg) from None


def _needs_target(reducer: Reducer | None) -> bool:
    return isinstance(reducer, PerClass | SharedCovariance)


def _stored(reducer: Reducer | None) -> bool:
    """Whether the reducer keeps every sample (its memory grows with them)."""
    if reducer is None or isinstance(reducer, Keep | Concat):
        return True
    return isinstance(reducer, Quantiles) and reducer.exact


def _describe_value(value: object, depth: int = 0) -> str:  # noqa: PLR0911 (one branch per kind)
    """Describe a configuration value deterministically (no addresses)."""
    if depth > 4:  # noqa: PLR2004 (enough for nested reducers)
        return "..."
    if isinstance(value, Tensor):
        data = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]
        return f"Tensor({list(value.shape)}, {value.dtype}, sha256:{digest})"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, list | tuple):
        items = ", ".join(_describe_value(v, depth + 1) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items})"
    if isinstance(value, dict):
        items = ", ".join(
            f"{k!r}: {_describe_value(v, depth + 1)}"
            for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))
        )
        return "{" + items + "}"
    if isinstance(value, Reducer):
        return _describe_reducer(value, depth + 1)
    owner = getattr(value, "__self__", None)
    if owner is not None and callable(value):  # a bound method
        name = getattr(value, "__name__", "?")
        return f"{_describe_value(owner, depth + 1)}.{name}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    return _ADDRESS.sub("", repr(value))


def _describe_reducer(reducer: Reducer | None, depth: int = 0) -> str:
    """Describe a reducer's class and configuration, for the fingerprint."""
    if reducer is None:
        return CONCAT
    cls = type(reducer)
    fields = getattr(reducer, "__dict__", None)
    if not isinstance(fields, dict):
        return f"{cls.__module__}.{cls.__qualname__}({_ADDRESS.sub('', repr(reducer))})"
    parts = ", ".join(
        f"{k}={_describe_value(v, depth)}" for k, v in sorted(fields.items())
    )
    return f"{cls.__module__}.{cls.__qualname__}({parts})"


def _describe_spec(spec: BatchSpec) -> str:
    if spec is None or isinstance(spec, int | str):
        return repr(spec)
    return _describe_value(spec)


def _short_name(reducer: Reducer | None) -> str:
    return CONCAT if reducer is None else type(reducer).__name__


@dataclasses.dataclass
class _Slot:
    """One recorded label: its row, its reducer (or concat store)."""

    label: DepthIdx
    row: Layer
    selector: Selector
    template: Reducer | None  # None: concatenate
    reducer: Reducer | None = None
    store: _ConcatStore | None = None
    # a resumed state on the CPU, reloaded on the device of the first record
    pending: dict[str, Tensor] | None = None

    def update(self, value: Any, target: Tensor | None) -> None:
        """Feed one record to the reducer or the concat store."""
        if self.store is not None:
            self.store.update(value)
            return
        assert self.reducer is not None  # noqa: S101 (set for reducers)
        assert self.template is not None  # noqa: S101 (idem)
        if self.pending is not None:
            if isinstance(value, Tensor) and value.device.type != "cpu":
                reducer = self.template.fresh()
                reducer.load_state(
                    {k: v.to(value.device) for k, v in self.pending.items()}
                )
                self.reducer = reducer
            self.pending = None
        self.reducer.update(value, target)

    @property
    def key(self) -> str:
        return _label_str(self.label)


def _label_str(label: DepthIdx) -> str:
    return f"{label[0]}-{label[1]}"


def _parse_label(text: str) -> DepthIdx:
    depth, _, idx = text.partition("-")
    return int(depth), int(idx)


def _plan(
    rnet: Recorder, keep: Mapping[Selector, ReducerSpec]
) -> tuple[list[_Slot], dict[Selector, tuple[DepthIdx, ...]]]:
    """Resolve ``keep`` into one slot per label, in table order."""
    if not isinstance(keep, Mapping):
        msg = (
            "`keep` must be a mapping selector -> reducer spec, e.g. "
            f'{{(1, 3): "concat", "fc": "moments"}}; got {type(keep).__name__}'
        )
        raise TypeError(msg)
    if not keep:
        msg = "`keep` is empty: say which layers to keep, e.g. {(1, 3): 'concat'}"
        raise ValueError(msg)
    slots: dict[DepthIdx, _Slot] = {}
    labels_of: dict[Selector, tuple[DepthIdx, ...]] = {}
    for selector, spec in keep.items():
        rows = resolve(rnet.table, rnet.net, [selector])
        template = _template(selector, spec)
        labels_of[selector] = tuple(row.label for row in rows)
        for row in rows:
            if row.label in slots:
                msg = (
                    f"Layer {row.describe()} is selected by both "
                    f"{slots[row.label].selector!r} and {selector!r} in `keep`; "
                    "each label gets one reducer. Use a narrower selector, or "
                    "collect twice."
                )
                raise ValueError(msg)
            slots[row.label] = _Slot(row.label, row, selector, template)
    order = {label: i for i, label in enumerate(rnet.table)}
    return sorted(slots.values(), key=lambda s: order[s.label]), labels_of


# ==================================================================== estimate
@dataclasses.dataclass(frozen=True)
class LabelEstimate:
    """The memory estimate of one label (see :func:`estimate`).

    Attributes
    ----------
    label : DepthIdx
        The layer label.
    name : str
        The module's qualified name.
    reducer : str
        ``"concat"`` or the reducer's class name.
    shape : tuple of int or None
        The per-sample shape of the output (``None`` when the output is not
        a single tensor).
    elements : int
        Elements per sample.
    itemsize : int
        Bytes per element (the dtype seen in the reference pass; 4 when
        unknown).
    stored : bool
        Whether the reducer keeps every sample (``"concat"``, ``Keep``, exact
        ``Quantiles``), so that its memory grows with the data set.
    state_bytes : int or None
        The fixed size of a streaming reducer's state (float64 accumulators),
        for the reducers whose size is known in advance; ``None`` otherwise.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
    >>> est = estimate(rnet, {(1, 1): "moments"})
    >>> row = est.labels[0]
    >>> row.shape, row.bytes_per_sample, row.stored, row.state_bytes
    ((4,), 16, False, 64)

    """

    label: DepthIdx
    name: str
    reducer: str
    shape: tuple[int, ...] | None
    elements: int
    itemsize: int
    stored: bool
    state_bytes: int | None

    @property
    def bytes_per_sample(self) -> int:
        """Bytes of one sample's record: ``elements * itemsize``."""
        return self.elements * self.itemsize


@dataclasses.dataclass(frozen=True)
class Estimate:
    """How many bytes a :func:`collect` run handles, from the layer table.

    Attributes
    ----------
    labels : tuple of LabelEstimate
        One estimate per label, in table order.
    num_samples : int or None
        The number of samples the totals are for (``None``: unknown).

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_size=(1, 5))
    >>> est = estimate(rnet, {(1, 1): "concat", (1, 3): "moments"}, 1000)
    >>> est.per_sample, est.total, est.stored_total
    ({(1, 1): 16, (1, 3): 12}, 28000, 16000)
    >>> print(est)
    label  name  reducer  shape  bytes/sample  stored  state
    1-1    0     concat   [4]    16 B          yes     -
    1-3    2     Moments  [3]    12 B          no      48 B
    records: 28 B per sample, 27.3 KiB for 1,000 samples
    kept (grows with samples): 16 B per sample, 15.6 KiB for 1,000 samples
    streaming states: 48 B

    """

    labels: tuple[LabelEstimate, ...]
    num_samples: int | None = None

    @property
    def per_sample(self) -> dict[DepthIdx, int]:
        """Bytes per sample of each label's record."""
        return {row.label: row.bytes_per_sample for row in self.labels}

    @property
    def bytes_per_sample(self) -> int:
        """Bytes per sample of all records together."""
        return sum(row.bytes_per_sample for row in self.labels)

    @property
    def stored_bytes_per_sample(self) -> int:
        """Bytes per sample kept by the reducers that keep every sample."""
        return sum(row.bytes_per_sample for row in self.labels if row.stored)

    @property
    def total(self) -> int | None:
        """Bytes of all records for ``num_samples`` samples (``None``: unknown)."""
        if self.num_samples is None:
            return None
        return self.bytes_per_sample * self.num_samples

    @property
    def stored_total(self) -> int | None:
        """Bytes kept (RAM or disk) for ``num_samples`` samples."""
        if self.num_samples is None:
            return None
        return self.stored_bytes_per_sample * self.num_samples

    @property
    def state_bytes(self) -> int:
        """Bytes of the streaming states whose size is known."""
        return sum(row.state_bytes or 0 for row in self.labels)

    def summary(self) -> str:
        """Say in one line what a run needs (for logs and progress bars).

        Examples
        --------
        >>> Estimate((), num_samples=None).summary()
        'records 0 B/sample; kept 0 B/sample'

        """
        kept = f"kept {_human(self.stored_bytes_per_sample)}/sample"
        if self.stored_total is not None:
            kept += f" ({_human(self.stored_total)} for {self.num_samples:,} samples)"
        return f"records {_human(self.bytes_per_sample)}/sample; {kept}"

    def __str__(self) -> str:
        """Return a table of the labels and the totals."""
        header = (
            "label",
            "name",
            "reducer",
            "shape",
            "bytes/sample",
            "stored",
            "state",
        )
        lines = [
            (
                _label_str(row.label),
                row.name or "-",
                row.reducer,
                "?" if row.shape is None else str(list(row.shape)),
                _human(row.bytes_per_sample),
                "yes" if row.stored else "no",
                "-" if row.state_bytes is None else _human(row.state_bytes),
            )
            for row in self.labels
        ]
        widths = [max(len(line[i]) for line in (header, *lines)) for i in range(6)]
        text = [
            "  ".join(
                [*(c.ljust(w) for c, w in zip(line, widths, strict=False)), line[-1]]
            ).rstrip()
            for line in (header, *lines)
        ]
        for title, per, total in (
            ("records", self.bytes_per_sample, self.total),
            (
                "kept (grows with samples)",
                self.stored_bytes_per_sample,
                self.stored_total,
            ),
        ):
            line = f"{title}: {_human(per)} per sample"
            if total is not None:
                line += f", {_human(total)} for {self.num_samples:,} samples"
            text.append(line)
        text.append(f"streaming states: {_human(self.state_bytes)}")
        return "\n".join(text)


def _human(n: float) -> str:
    """Format a byte count: ``512 B``, ``1.5 KiB``, ``2.0 GiB``."""
    if n < 1024:  # noqa: PLR2004 (one KiB)
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":  # noqa: PLR2004 (next unit)
            break
    return f"{n:.1f} {unit}"


def _per_sample(output_size: list[Any]) -> tuple[tuple[int, ...] | None, int]:
    """Return the per-sample shape (or None) and element count of a row."""
    if not output_size:
        return None, 0
    if all(isinstance(n, int) for n in output_size):
        shape = tuple(int(n) for n in output_size[1:])
        return shape, math.prod(shape)
    total = 0
    for part in output_size:  # several tensors: count each without its dim 0
        if isinstance(part, list) and part and all(isinstance(n, int) for n in part):
            total += math.prod(part[1:])
    return None, total


def _itemsize(table: LayerTable, label: DepthIdx) -> int:
    """Bytes per element of a row's output in the reference pass (default 4)."""
    index = next(i for i, row in enumerate(table.rows) if row.label == label)
    rows = table.statistics.summary_list
    row = table[label]
    if index < len(rows) and all(isinstance(n, int) for n in row.output_size):
        elements: int = math.prod(row.output_size)
        nbytes = getattr(rows[index], "output_bytes", 0)
        if elements and isinstance(nbytes, int) and nbytes % elements == 0:
            size = int(nbytes) // elements
            if size in {1, 2, 4, 8, 16}:
                return size
    return 4


def _state_bytes(reducer: Reducer | None, elements: int, itemsize: int) -> int | None:
    """Return the size of a streaming reducer's state, when known in advance."""
    f = elements
    known: list[tuple[type, int]] = [
        (Count, 16),
        (Moments, 16 * f),
        (Covariance, 8 * (f + f * f)),
        (Gram, 8 * f * f),
        (MinMax, 2 * f * itemsize),
    ]
    for cls, size in known:
        if isinstance(reducer, cls):
            return size
    if isinstance(reducer, SharedCovariance) and reducer.num_classes is not None:
        c = reducer.num_classes
        return 8 * (c + c * f + f * f)
    return None


def _estimate(
    slots: list[_Slot], table: LayerTable, num_samples: int | None
) -> Estimate:
    rows = []
    for slot in slots:
        shape, elements = _per_sample(slot.row.output_size)
        itemsize = _itemsize(table, slot.label)
        rows.append(
            LabelEstimate(
                label=slot.label,
                name=slot.row.name,
                reducer=_short_name(slot.template),
                shape=shape,
                elements=elements,
                itemsize=itemsize,
                stored=_stored(slot.template),
                state_bytes=None
                if _stored(slot.template)
                else _state_bytes(slot.template, elements, itemsize),
            )
        )
    return Estimate(tuple(rows), num_samples)


def estimate(
    rnet: Recorder,
    keep: Mapping[Selector, ReducerSpec],
    num_samples: int | None = None,
) -> Estimate:
    """Estimate the bytes a :func:`collect` run with ``keep`` handles.

    Per label, the bytes of one sample's record are the row's
    ``output_size`` (as torchinfo reports it for the reference input) without
    its batch dim, times the element size of the dtype seen in the reference
    pass (4, float32, when unknown). Nothing is run.

    Parameters
    ----------
    rnet : Recorder
        The recorder whose table is used.
    keep : Mapping
        As for :func:`collect`: selector -> reducer spec.
    num_samples : int, optional
        The number of samples, for the totals.

    Returns
    -------
    Estimate
        Per-label rows and totals; ``print`` it for a table.

    Raises
    ------
    ValueError, TypeError
        As :func:`collect` for a bad ``keep``.

    Examples
    --------
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    >>> rnet = Recorder(net, input_size=(1, 3, 10, 10))
    >>> est = estimate(rnet, {(1, 1): "concat"}, num_samples=50_000)
    >>> est.per_sample[(1, 1)], est.total
    (2048, 102400000)
    >>> est.summary()
    'records 2.0 KiB/sample; kept 2.0 KiB/sample (97.7 MiB for 50,000 samples)'

    """
    slots, _ = _plan(rnet, keep)
    return _estimate(slots, rnet.table, num_samples)


# ============================================================= batch plumbing
def _getter(spec: BatchSpec, what: str) -> Callable[[Any], Any]:
    """Return a function taking the input (or target) out of a batch."""
    if spec is None:
        return lambda batch: batch
    if isinstance(spec, int) and not isinstance(spec, bool):
        return _by_index(spec, what)
    if isinstance(spec, str):
        return _by_key(spec, what)
    if callable(spec) and not isinstance(spec, bool):
        return spec
    msg = f"`{what}` must be an int, a str, a callable or None, got {spec!r}"
    raise TypeError(msg)


def _by_index(index: int, what: str) -> Callable[[Any], Any]:
    def by_index(batch: Any) -> Any:
        if isinstance(batch, Tensor):
            msg = (
                f"`{what}={index}` takes item {index} of a tuple or list batch, "
                f"but the batch is a tensor. Pass `{what}=None` to use the whole "
                "batch" + (" as the input." if what == "input" else ".")
            )
            raise TypeError(msg)
        try:
            return batch[index]
        except (IndexError, KeyError, TypeError) as error:
            msg = (
                f"`{what}={index}`: cannot take item {index} of the batch, a "
                f"{type(batch).__name__} ({error}). Pass `{what}=` an index, a "
                "key or a callable batch -> value."
            )
            raise ValueError(msg) from error

    return by_index


def _by_key(key: str, what: str) -> Callable[[Any], Any]:
    def by_key(batch: Any) -> Any:
        if not isinstance(batch, Mapping):
            msg = (
                f"`{what}={key!r}` takes a key of a dict batch, but the batch "
                f"is a {type(batch).__name__}. Pass an index or a callable."
            )
            raise TypeError(msg)
        if key not in batch:
            msg = (
                f"`{what}={key!r}`: the batch has no such key; its keys are "
                f"{list(batch)}."
            )
            raise KeyError(msg)
        return batch[key]

    return by_key


def _arguments(
    value: Any, *, from_callable: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Turn an input into positional and keyword arguments of the net."""
    if from_callable and isinstance(value, tuple):
        return value, {}
    if from_callable and isinstance(value, Mapping):
        return (), dict(value)
    return (value,), {}


def _move(value: Any, device: torch.device) -> Any:
    """Move the tensors in ``value`` to ``device`` (async toward accelerators)."""
    if isinstance(value, Tensor):
        # A copy toward the CPU must be synchronous: an asynchronous one
        # returns before the data has arrived.
        return value.to(device, non_blocking=device.type != "cpu")
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_move(v, device) for v in value)
    if isinstance(value, list):
        return [_move(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


def _first_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Return dim 0 of the first tensor among the arguments (no host sync)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    return None


def _total_samples(batches: object) -> int | None:
    """Return the number of samples a ``DataLoader`` yields, when known."""
    if not isinstance(batches, torch.utils.data.DataLoader):
        return None
    size = batches.batch_size
    if size is None:
        return None
    try:
        n = len(batches.sampler)  # type: ignore[arg-type]
    except TypeError:
        return None
    return (n // size) * size if batches.drop_last else n


# =============================================================== concatenation
def _bytes_of(chunk: Tensor) -> Any:
    """Return a buffer over the bytes of a contiguous CPU tensor (no copy)."""
    return chunk.reshape(-1).view(torch.uint8).numpy()


def _map_file(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    """Return a tensor backed by a private (copy-on-write) mapping of ``path``."""
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.from_file(str(path), shared=False, size=numel, dtype=dtype).view(shape)


def _fsync(path: Path) -> None:
    with path.open("rb") as file:
        os.fsync(file.fileno())


class _Folder:
    """Where concatenations spill: ``spill_dir``, or a temporary folder."""

    def __init__(self, path: Path | None) -> None:
        self.persistent = path is not None
        self._path = path
        self._temporary: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._temporary = Path(tempfile.mkdtemp(prefix="scio-collect-"))
            self._path = self._temporary
        return self._path

    def new_file(self, name: str) -> Path:
        """Create ``name`` empty, unlinking any old file (mappings survive)."""
        path = self.path / name
        path.unlink(missing_ok=True)
        path.touch()
        return path

    def cleanup(self) -> None:
        """Remove a temporary folder (mapped results stay valid on POSIX)."""
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)


class _ConcatStore:
    """The rows of one label: chunks in RAM, then appended to one raw file."""

    def __init__(self, label: DepthIdx, folder: _Folder) -> None:
        self.label = label
        self.folder = folder
        self.chunks: list[Tensor] = []
        self.mem_rows = 0
        self.mem_bytes = 0
        self.disk_rows = 0
        self.disk_bytes = 0
        self.dtype: torch.dtype | None = None
        self.shape: tuple[int, ...] | None = None
        self.file: Path | None = None

    @property
    def rows(self) -> int:
        return self.disk_rows + self.mem_rows

    @property
    def file_name(self) -> str:
        return f"concat-{_label_str(self.label)}.bin"

    def update(self, value: object) -> None:
        if not isinstance(value, Tensor) or value.dim() < 1:
            kind = type(value).__name__ if not isinstance(value, Tensor) else "0-d"
            msg = (
                f"'concat' of layer {_label_str(self.label)} needs tensor records "
                f"with a batch dim 0, got a {kind} record. Record a layer that "
                "outputs a tensor, or pass a reducer that handles this output."
            )
            raise TypeError(msg)
        shape = tuple(value.shape[1:])
        if self.shape is None or self.dtype is None:
            self.shape, self.dtype = shape, value.dtype
        elif shape != self.shape or value.dtype != self.dtype:
            msg = (
                f"'concat' of layer {_label_str(self.label)}: every record must "
                f"have the same per-sample shape and dtype; got {list(shape)} "
                f"{value.dtype} after {list(self.shape)} {self.dtype}"
            )
            raise ValueError(msg)
        chunk = value.detach().to(
            "cpu", memory_format=torch.contiguous_format, copy=True
        )
        self.chunks.append(chunk)
        self.mem_rows += chunk.shape[0]
        self.mem_bytes += chunk.numel() * chunk.element_size()

    def spill(self, *, durable: bool = False) -> None:
        """Append the rows held in RAM to the file, then free them."""
        if self.file is None:
            self.file = self.folder.new_file(self.file_name)
        if not self.chunks:
            return
        with self.file.open("r+b") as file:
            # Anything past the committed length is from an interrupted write.
            file.seek(self.disk_bytes)
            file.truncate()
            for chunk in self.chunks:
                file.write(_bytes_of(chunk))
            file.flush()
            if durable:
                os.fsync(file.fileno())
        # one assignment, so that an interrupt cannot count rows twice
        self.disk_rows, self.disk_bytes, self.chunks, self.mem_rows, self.mem_bytes = (
            self.disk_rows + self.mem_rows,
            self.disk_bytes + self.mem_bytes,
            [],
            0,
            0,
        )

    def attach(self, entry: Mapping[str, Any], where: Path) -> None:
        """Take over the committed rows of a saved run (truncating the rest)."""
        path = self.folder.path / self.file_name
        nbytes, rows = int(entry["bytes"]), int(entry["rows"])
        if entry.get("dtype") is None:  # no row yet
            return
        size = path.stat().st_size if path.is_file() else 0
        if size < nbytes:
            msg = (
                f"The spilled rows of layer {_label_str(self.label)} in '{where}' "
                f"are incomplete ({size} bytes, the manifest says "
                f"{nbytes}): the folder was modified. Pass `resume=False` to "
                "start over."
            )
            raise ValueError(msg)
        if size > nbytes:
            os.truncate(path, nbytes)
        self.file = path
        self.disk_rows, self.disk_bytes = rows, nbytes
        self.dtype = _dtype(str(entry["dtype"]))
        self.shape = tuple(int(n) for n in entry["shape"])

    def entry(self) -> dict[str, Any]:
        return {
            "file": self.file_name,
            "rows": self.disk_rows,
            "bytes": self.disk_bytes,
            "dtype": _dtype_name(self.dtype) if self.dtype is not None else None,
            "shape": None if self.shape is None else list(self.shape),
        }

    def tensor(self) -> Tensor | None:
        """All rows as one tensor (memory mapped if any went to disk)."""
        if self.shape is None or self.dtype is None:
            return None
        if self.file is None:
            if len(self.chunks) == 1:
                return self.chunks[0]
            if not self.chunks:
                return torch.empty((0, *self.shape), dtype=self.dtype)
            whole = torch.cat(self.chunks)
            self.chunks = [whole]
            return whole
        self.spill()
        return _map_file(self.file, self.dtype, (self.rows, *self.shape))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        msg = f"unknown dtype {name!r}"
        raise ValueError(msg)  # noqa: TRY004 (a bad value in a file)
    return dtype


# ================================================================ checkpoints
def _library_version() -> str:
    package = sys.modules.get(__package__ or "scio_recorder")
    version = getattr(package, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version("scio-recorder")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _write_atomic(
    path: Path, write: Callable[[Path], object], *, durable: bool
) -> None:
    """Write ``path`` through a temporary file and :func:`os.replace`."""
    handle, name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        if durable:
            _fsync(temporary)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _flat_states(
    slots: list[_Slot], devices: dict[str, torch.device] | None = None
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


def _load_states(
    slots: list[_Slot], states: Mapping[str, Tensor], device: torch.device | None
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
class _Saved:
    batches: int = 0
    samples: int = 0
    complete: bool = False


class _Checkpoints:
    """The manifest and the reducer states in ``spill_dir``."""

    def __init__(
        self, folder: Path, fingerprint: dict[str, Any], *, durable: bool
    ) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self.durable = durable
        self.manifest = folder / MANIFEST
        self.states: str | None = None
        self.saved = _Saved()

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
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
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
        slots: list[_Slot],
        *,
        resume: bool,
        device: torch.device | None,
    ) -> _Saved:
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
        if not isinstance(saved, dict):
            saved = {}
        lines: list[str] = []
        for key in sorted(set(saved) | set(self.fingerprint)):
            old, new = saved.get(key), self.fingerprint.get(key)
            if old == new:
                continue
            if isinstance(old, dict) and isinstance(new, dict):
                lines.extend(
                    f"- {key} of {sub}: saved {_plain(old.get(sub))}, "
                    f"now {_plain(new.get(sub))}"
                    for sub in sorted(set(old) | set(new))
                    if old.get(sub) != new.get(sub)
                )
            else:
                lines.append(f"- {key}: saved {_plain(old)}, now {_plain(new)}")
        msg = (
            f"'{self.folder}' holds a collect run with other arguments:\n"
            + "\n".join(lines)
            + "\nUse another `spill_dir`, or pass `resume=False` to start over "
            "(this deletes the saved run)."
        )
        raise ValueError(msg)

    def _resume(
        self, data: dict[str, Any], slots: list[_Slot], device: torch.device | None
    ) -> None:
        try:
            batches, samples = int(data["batches"]), int(data["samples"])
            complete = bool(data["complete"])
            states_name = data["states"]
            concat = data["concat"]
        except (KeyError, TypeError, ValueError) as error:
            msg = (
                f"The manifest '{self.manifest}' is malformed ({error!r}). Pass "
                "`resume=False` to start over."
            )
            raise ValueError(msg) from error
        if states_name is not None:
            if states_name not in _STATES:
                msg = (
                    f"The manifest '{self.manifest}' names the states file "
                    f"{states_name!r}, not one this version writes. Pass "
                    "`resume=False` to start over."
                )
                raise ValueError(msg)
            path = self.folder / str(states_name)
            if not path.is_file():
                msg = (
                    f"The reducer states '{path}' named by the manifest are "
                    "missing. Pass `resume=False` to start over."
                )
                raise ValueError(msg)
            _load_states(slots, safetensors.torch.load_file(str(path)), device)
            self.states = str(states_name)
        for slot in slots:
            if slot.store is not None and slot.key in concat:
                slot.store.attach(concat[slot.key], self.folder)
        self._remove_stale()
        self.saved = _Saved(batches, samples, complete)
        logger.info(
            "collect: resuming from '%s' after %d batches (%d samples)",
            self.folder,
            batches,
            samples,
        )

    def _remove_stale(self) -> None:
        """Remove temporary files left by an interrupted manifest write."""
        for path in self.folder.iterdir():
            if path.name.startswith(f".{MANIFEST}.") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)

    def _clear(self, data: dict[str, Any] | None) -> None:
        self.manifest.unlink(missing_ok=True)
        if data is not None:
            concat = data.get("concat")
            if isinstance(concat, dict):
                for entry in concat.values():
                    name = entry.get("file") if isinstance(entry, dict) else None
                    if isinstance(name, str) and "/" not in name and "\\" not in name:
                        (self.folder / name).unlink(missing_ok=True)
        for name in _STATES:
            (self.folder / name).unlink(missing_ok=True)
        self._remove_stale()

    def save(
        self, slots: list[_Slot], batches: int, samples: int, *, complete: bool
    ) -> None:
        """Spill the rows, write the states, then the manifest (the commit).

        States alternate between two files: the one written is never the one
        the manifest on disk names, so an interrupted checkpoint leaves the
        previous one intact.
        """
        for slot in slots:
            if slot.store is not None:
                slot.store.spill(durable=self.durable)
        states = _flat_states(slots)
        name = _STATES[1] if self.states == _STATES[0] else _STATES[0]
        path = self.folder / name
        metadata = {"batches": str(batches), "samples": str(samples)}
        safetensors.torch.save_file(states, str(path), metadata)
        if self.durable:
            _fsync(path)
        manifest = {
            "format": _FORMAT,
            "fingerprint": self.fingerprint,
            "batches": batches,
            "samples": samples,
            "complete": complete,
            "states": name,
            "concat": {
                slot.key: slot.store.entry() for slot in slots if slot.store is not None
            },
        }
        text = json.dumps(manifest, indent=1, sort_keys=True)
        _write_atomic(
            self.manifest,
            lambda path: path.write_text(text, "utf-8"),
            durable=self.durable,
        )
        self.states = name
        self.saved = _Saved(batches, samples, complete)


def _plain(value: object) -> str:
    return value if isinstance(value, str) else repr(value)


# ==================================================================== progress
class _Bar(Protocol):
    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


class _TextBar:
    """A progress line on stderr when tqdm is not installed."""

    def __init__(self, total: int | None, desc: str) -> None:
        self.total = total
        self.desc = desc
        self.n = 0
        self.start = time.monotonic()
        self.shown = self.start

    def update(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.shown >= 5.0:  # noqa: PLR2004 (seconds between lines)
            self.shown = now
            self._show(now)

    def _show(self, now: float) -> None:
        rate = self.n / max(now - self.start, 1e-9)
        total = f"/{self.total:,}" if self.total is not None else ""
        sys.stderr.write(
            f"{self.desc}: {self.n:,}{total} sample ({rate:.1f} sample/s)\n"
        )

    def close(self) -> None:
        self._show(time.monotonic())


def _bar(
    *, progress: bool | None, total: int | None, initial: int, desc: str
) -> _Bar | None:
    try:
        tqdm_module = importlib.import_module("tqdm")
    except ImportError:
        tqdm_module = None
    if progress is None:
        progress = tqdm_module is not None and sys.stderr.isatty()
    if not progress:
        return None
    if tqdm_module is None:
        return _TextBar(total, desc)
    bar: _Bar = tqdm_module.tqdm(
        total=total,
        initial=initial,
        unit="sample",
        unit_scale=True,
        desc=desc,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    return bar


# ================================================================= distributed
def _distributed() -> tuple[int, int] | None:
    """``(rank, world_size)`` when a process group is initialised."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def _comm_device() -> torch.device:
    """CUDA for NCCL (which moves only CUDA tensors), else the CPU."""
    if str(torch.distributed.get_backend()) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Gather one byte string from every rank (no pickle)."""
    dist = torch.distributed
    world = dist.get_world_size()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    lengths = [int(s.item()) for s in sizes]
    buffer = torch.zeros(max(*lengths, 1), dtype=torch.uint8)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffer = buffer.to(device)
    buffers = [torch.empty_like(buffer) for _ in range(world)]
    dist.all_gather(buffers, buffer)
    return [
        b[:n].cpu().numpy().tobytes() for b, n in zip(buffers, lengths, strict=True)
    ]


@dataclasses.dataclass
class _Merged:
    results: dict[DepthIdx, Any]
    reducers: dict[DepthIdx, Reducer]
    samples: int
    batches: int
    rank_samples: tuple[int, ...]
    files: dict[DepthIdx, Path]


def _concat_meta(tensor: Tensor | None) -> dict[str, Any]:
    if tensor is None:
        return {"rows": 0, "dtype": None, "shape": None}
    return {
        "rows": int(tensor.shape[0]),
        "dtype": _dtype_name(tensor.dtype),
        "shape": list(tensor.shape[1:]),
    }


def _merge_across_ranks(  # noqa: PLR0913 (keyword-only settings)
    slots: list[_Slot],
    local: dict[DepthIdx, Tensor | None],
    *,
    samples: int,
    batches: int,
    gather: Gather,
    folder: _Folder,
    budget: int | None,
    digest: str,
) -> _Merged:
    """Merge statistics and gather concatenations across the process group."""
    device = _comm_device()
    meta = {
        "digest": digest,
        "samples": samples,
        "batches": batches,
        "concat": {
            slot.key: _concat_meta(local[slot.label])
            for slot in slots
            if slot.store is not None
        },
    }
    raw = _all_gather_bytes(json.dumps(meta).encode(), device)
    metas = [json.loads(item) for item in raw]
    if any(m["digest"] != digest for m in metas):
        msg = (
            "collect was called with different labels, reducers or batch specs "
            "on different ranks; every rank must call it with the same arguments."
        )
        raise RuntimeError(msg)
    if not any(int(m["batches"]) for m in metas):
        msg = "`batches` yielded no batch on any rank: there is nothing to collect."
        raise ValueError(msg)
    rank_samples = tuple(int(m["samples"]) for m in metas)
    merged = _Merged(
        {},
        {},
        sum(rank_samples),
        sum(int(m["batches"]) for m in metas),
        rank_samples,
        {},
    )
    _merge_statistics(slots, merged, device)
    for slot in slots:
        if slot.store is not None:
            entries = [m["concat"][slot.key] for m in metas]
            tensor, path = _gather_rows(
                slot,
                local[slot.label],
                entries=entries,
                gather=gather,
                folder=folder,
                budget=budget,
                device=device,
            )
            merged.results[slot.label] = tensor
            merged.reducers[slot.label] = _concat_reducer(tensor)
            if path is not None:
                merged.files[slot.label] = path
    return merged


def _merge_statistics(
    slots: list[_Slot], merged: _Merged, device: torch.device
) -> None:
    """Give every rank the merge, in rank order, of every rank's states."""
    devices: dict[str, torch.device] = {}
    payload = safetensors.torch.save(_flat_states(slots, devices))
    parts = [safetensors.torch.load(raw) for raw in _all_gather_bytes(payload, device)]
    for slot in slots:
        if slot.template is None:
            continue
        target = devices.get(slot.key)
        total = slot.template.fresh()
        prefix = f"{slot.key}/"
        for states in parts:
            part = slot.template.fresh()
            part.load_state(
                {
                    key.removeprefix(prefix): value
                    if target is None
                    else value.to(target)
                    for key, value in states.items()
                    if key.startswith(prefix)
                }
            )
            total.merge(part)
        merged.reducers[slot.label] = total
        merged.results[slot.label] = total.result()


def _gather_rows(  # noqa: C901, PLR0912, PLR0913 (one transfer protocol)
    slot: _Slot,
    source: Tensor | None,
    *,
    entries: list[dict[str, Any]],
    gather: Gather,
    folder: _Folder,
    budget: int | None,
    device: torch.device,
) -> tuple[Tensor | None, Path | None]:
    """Gather a concatenation's rows in rank order (all ranks, or rank 0)."""
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    known = [e for e in entries if e["dtype"] is not None]
    if not known:
        return None, None
    dtype, shape = _dtype(known[0]["dtype"]), tuple(known[0]["shape"])
    if any((_dtype(e["dtype"]), tuple(e["shape"])) != (dtype, shape) for e in known):
        msg = (
            f"'concat' of layer {slot.key}: ranks recorded different per-sample "
            "shapes or dtypes"
        )
        raise RuntimeError(msg)
    rows = [int(e["rows"]) for e in entries]
    row_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    offsets = [sum(rows[:r]) * row_bytes for r in range(world)]
    total = sum(rows)
    mine = (
        source.reshape(-1).view(torch.uint8)
        if source is not None and source.numel()
        else torch.empty(0, dtype=torch.uint8)
    )
    dest: Tensor | None = None
    path: Path | None = None
    if gather == "all" or rank == 0:
        nbytes = total * row_bytes
        if nbytes and (folder.persistent or (budget is not None and nbytes > budget)):
            path = folder.new_file(f"gathered-{slot.key}.bin")
            os.truncate(path, nbytes)
            dest = torch.from_file(
                str(path), shared=True, size=nbytes, dtype=torch.uint8
            )
        else:
            dest = torch.empty(nbytes, dtype=torch.uint8)
        dest[offsets[rank] : offsets[rank] + mine.numel()].copy_(mine)
    per = max(1, _CHUNK_BYTES // max(row_bytes, 1)) * row_bytes
    for src in range(world):
        size = rows[src] * row_bytes
        if size == 0 or (gather == 0 and src == 0):
            continue
        for lo in range(0, size, per):
            hi = min(size, lo + per)
            at = offsets[src]
            if rank == src:
                chunk = mine[lo:hi].to(device)
                if gather == "all":
                    dist.broadcast(chunk, src)
                else:
                    dist.send(chunk, dst=0)
            elif gather == "all" or rank == 0:
                buffer = torch.empty(hi - lo, dtype=torch.uint8, device=device)
                if gather == "all":
                    dist.broadcast(buffer, src)
                else:
                    dist.recv(buffer, src=src)
                assert dest is not None  # noqa: S101 (receiving ranks have one)
                dest[at + lo : at + hi].copy_(buffer)
    if dest is None:
        return None, None
    if path is None:
        return dest.view(dtype).view((total, *shape)), None
    del dest  # unmap the writable mapping, then map privately
    return _map_file(path, dtype, (total, *shape)), path


def _concat_reducer(tensor: Tensor | None) -> Concat:
    """Return a :class:`~scio_recorder.reduce.Concat` holding ``tensor`` (no copy)."""
    reducer = Concat()
    if tensor is not None:
        reducer.load_state({"count": torch.tensor(tensor.shape[0]), "data": tensor})
    return reducer


# ===================================================================== results
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
            f"{_label_str(label)}: {_show(value, label in self.files)}"
            for label, value in self._results.items()
        )
        return (
            f"CollectResult(samples={self.samples}, batches={self.batches}, "
            f"{{{items}}})"
        )

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
        records = {label: _encode(value) for label, value in self._results.items()}
        metadata = {
            _META_PREFIX + "format": str(_FORMAT),
            _META_PREFIX + "samples": str(self.samples),
            _META_PREFIX + "batches": str(self.batches),
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
        records = load_records(path, table)
        if records.metadata.get(_META_PREFIX + "format") is None:
            msg = (
                f"'{records.path}' holds records but no collect results; load it "
                "with `scio_recorder.io.load_records`."
            )
            raise ValueError(msg)
        known = {
            f"{t.__module__}:{t.__qualname__}": t
            for t in (*_result_types(), *types)
            if dataclasses.is_dataclass(t)
        }
        results: dict[DepthIdx, Any] = {}
        for key, value in records.items():
            label = key if isinstance(key, tuple) else _parse_label(key)
            results[label] = _decode(value, known)
        return cls(
            results,
            samples=int(records.metadata[_META_PREFIX + "samples"]),
            batches=int(records.metadata[_META_PREFIX + "batches"]),
            table=table.table if isinstance(table, Recorder) else table,
        )


def _show(value: Any, mapped: bool) -> str:  # noqa: FBT001 (private helper)
    if isinstance(value, Tensor):
        extra = ", mmap" if mapped else ""
        return f"Tensor{list(value.shape)}{extra}"
    return type(value).__name__


def _result_types() -> list[type]:
    return [
        t
        for name in _reduce.__all__
        if isinstance(t := getattr(_reduce, name), type) and dataclasses.is_dataclass(t)
    ]


def _encode(value: Any) -> Any:
    """Turn a result into what :func:`~scio_recorder.io.save_records` stores."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        out: dict[str, Any] = {_TYPE_KEY: f"{cls.__module__}:{cls.__qualname__}"}
        for field in dataclasses.fields(value):
            out[field.name] = _encode(getattr(value, field.name))
        return out
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _encode(v) for k, v in value.items()}
        if all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            items = {str(k): _encode(v) for k, v in value.items()}
            return {_TYPE_KEY: "intdict", "items": items}
        msg = "collect results can be saved with str or int dict keys only"
        raise TypeError(msg)
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_encode(v) for v in value)
    return value


def _decode(value: Any, known: Mapping[str, type]) -> Any:
    """Undo :func:`_encode`, rebuilding only the dataclasses in ``known``."""
    if isinstance(value, dict):
        kind = value.get(_TYPE_KEY)
        if kind == "intdict" and isinstance(value.get("items"), dict):
            return {int(k): _decode(v, known) for k, v in value["items"].items()}
        fields = {k: _decode(v, known) for k, v in value.items() if k != _TYPE_KEY}
        if isinstance(kind, str) and kind in known:
            return known[kind](**fields)
        return {k: _decode(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, known) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v, known) for v in value)
    return value


# ===================================================================== collect
def _record_options(rnet: Recorder) -> dict[str, Any]:
    """Return the recorder's clone/detach/device/dtype options, to restore them."""
    options = rnet.record_options
    return {
        "clone": options.clone,
        "detach": options.detach,
        "device": options.device,
        "dtype": options.dtype,
    }


class _Run:
    """The per-batch loop of :func:`collect`."""

    def __init__(  # noqa: PLR0913 (the loop's settings)
        self,
        rnet: Recorder,
        slots: list[_Slot],
        *,
        get_input: Callable[[Any], Any],
        input_is_callable: bool,
        get_target: Callable[[Any], Any] | None,
        grad: bool,
        device: torch.device | None,
        to: torch.device | None,
        budget: int | None,
        checkpoints: _Checkpoints | None,
        every: int,
    ) -> None:
        self.rnet = rnet
        self.slots = slots
        self.get_input = get_input
        self.input_is_callable = input_is_callable
        self.get_target = get_target
        self.grad = grad
        self.device = device
        self.to = to
        self.budget = budget
        self.checkpoints = checkpoints
        self.every = every
        self.bar: _Bar | None = None
        self.samples = 0
        self.batches = 0
        self.peak = 0
        self.consistent = True
        self.stores = [s.store for s in slots if s.store is not None]

    def arguments(self, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return _arguments(self.get_input(batch), from_callable=self.input_is_callable)

    def run(self, batches: Iterable[Any], saved: _Saved) -> None:
        self.samples, self.batches = saved.samples, saved.batches
        skip = saved.batches
        if saved.complete and skip and _length(batches) == skip:
            return  # a finished run, rerun on the same (sized) batches
        skipped_samples: int | None = 0
        index = 0
        try:
            for batch in batches:
                if index < skip:
                    size = _first_batch_size(*self.arguments(batch))
                    skipped_samples = (
                        None
                        if size is None or skipped_samples is None
                        else skipped_samples + size
                    )
                    index += 1
                    if index == skip:
                        self._check_skipped(skipped_samples, saved)
                    continue
                self.step(batch)
                index += 1
            self._check_exhausted(index, skip)
        except BaseException:
            if self.checkpoints is not None and self.consistent:
                self._checkpoint_after_error()
            raise
        if self.checkpoints is not None:
            self.checkpoints.save(self.slots, self.batches, self.samples, complete=True)

    def _checkpoint_after_error(self) -> None:
        assert self.checkpoints is not None  # noqa: S101 (checked by the caller)
        if self.checkpoints.saved.batches == self.batches:
            return
        try:
            self.checkpoints.save(
                self.slots, self.batches, self.samples, complete=False
            )
        except Exception:
            logger.exception("collect: could not checkpoint after the error")

    @staticmethod
    def _check_exhausted(index: int, skip: int) -> None:
        if index < skip:
            msg = (
                f"`batches` yielded {index} batches, but the run saved in "
                f"spill_dir had already reduced {skip}: the batches differ. "
                "Resume with the same batches, or pass `resume=False`."
            )
            raise ValueError(msg)

    def _check_skipped(self, skipped: int | None, saved: _Saved) -> None:
        if skipped is not None and skipped != saved.samples:
            msg = (
                f"The first {saved.batches} batches hold {skipped} samples, but "
                f"the run saved in spill_dir reduced {saved.samples} samples from "
                "them: the batches differ (the loader must yield the same batches "
                "in the same order). Resume with the same batches, or pass "
                "`resume=False`."
            )
            raise ValueError(msg)

    def _inputs(
        self, batch: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any], Tensor | None]:
        args, kwargs = self.arguments(batch)
        target = self.get_target(batch) if self.get_target is not None else None
        if target is not None and not isinstance(target, Tensor):
            target = torch.as_tensor(target)
        if self.device is not None:
            args, kwargs = _move(args, self.device), _move(kwargs, self.device)
            target = _move(target, self.device)
        if self.to is not None and target is not None:
            target = _move(target, self.to)
        return args, kwargs, target

    def step(self, batch: Any) -> None:
        args, kwargs, target = self._inputs(batch)
        with torch.set_grad_enabled(self.grad):
            self.rnet(*args, **kwargs)
        records = self.rnet.activations
        size = _first_batch_size(args, kwargs)
        self.consistent = False
        for slot in self.slots:
            value = records[slot.label]
            if self.to is not None:
                value = _move(value, self.to)
            slot.update(value, target)
            if size is None and isinstance(value, Tensor) and value.dim() >= 1:
                size = int(value.shape[0])
        self.samples += size or 0
        self.batches += 1
        self.consistent = True
        if self.bar is not None:
            self.bar.update(size or 0)
        held = sum(store.mem_bytes for store in self.stores)
        self.peak = max(self.peak, held)
        if self.budget is not None and held > self.budget:
            for store in self.stores:
                store.spill()
        if self.checkpoints is not None and self.batches % self.every == 0:
            self.checkpoints.save(
                self.slots, self.batches, self.samples, complete=False
            )


def _length(batches: object) -> int | None:
    try:
        return len(batches)  # type: ignore[arg-type]
    except TypeError:
        return None


def _fingerprint(
    slots: list[_Slot], input_spec: BatchSpec, target_spec: BatchSpec
) -> dict[str, Any]:
    return {
        "library_version": _library_version(),
        "labels": {
            slot.key: f"`{slot.row.name}` ({type(slot.row.module).__name__}, "
            f"call {slot.row.call_index})"
            for slot in slots
        },
        "reducers": {slot.key: _describe_reducer(slot.template) for slot in slots},
        "input": _describe_spec(input_spec),
        "target": _describe_spec(target_spec),
    }


def _check_options(
    *,
    memory_budget: int | None,
    checkpoint_every: int | None,
    spill_dir: object,
    gather: object,
    progress: object,
) -> None:
    if memory_budget is not None and (
        isinstance(memory_budget, bool)
        or not isinstance(memory_budget, int)
        or memory_budget < 0
    ):
        msg = f"`memory_budget` must be a number of bytes >= 0, got {memory_budget!r}"
        raise ValueError(msg)
    if checkpoint_every is not None:
        if (
            isinstance(checkpoint_every, bool)
            or not isinstance(checkpoint_every, int)
            or checkpoint_every < 1
        ):
            msg = f"`checkpoint_every` must be an int >= 1, got {checkpoint_every!r}"
            raise ValueError(msg)
        if spill_dir is None:
            msg = (
                "`checkpoint_every` needs a `spill_dir` to write checkpoints to: "
                "pass `spill_dir=...`, or drop `checkpoint_every`."
            )
            raise ValueError(msg)
    if isinstance(gather, bool) or gather not in ("all", 0, None):
        msg = f"`gather` must be 'all', 0 or None, got {gather!r}"
        raise ValueError(msg)
    if progress is not None and not isinstance(progress, bool):
        msg = f"`progress` must be None, True or False, got {progress!r}"
        raise TypeError(msg)


def collect(  # noqa: C901, PLR0912, PLR0913, PLR0915 (the documented options)
    rnet: Recorder,
    batches: Iterable[Any],
    keep: Mapping[Selector, ReducerSpec],
    *,
    input: BatchSpec = 0,  # noqa: A002 (the documented name)
    target: BatchSpec = None,
    grad: bool = False,
    device: torch.device | str | None = None,
    to: torch.device | str | None = None,
    memory_budget: int | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    resume: bool = True,
    checkpoint_every: int | None = None,
    progress: bool | None = None,
    gather: Gather = "all",
    clone: bool = False,
    durable: bool = False,
) -> CollectResult:
    """Run the recorder over every batch and reduce the chosen layers' outputs.

    For each batch, the input is taken out of the batch (``input``), moved to
    ``device``, and passed through ``rnet`` with exactly the labels of
    ``keep`` recorded; each label's record (moved to ``to``) feeds that
    label's reducer, with the batch's class labels (``target``) when given.
    The net runs in whatever mode you set (``collect`` never calls
    ``eval()``: call ``net.eval()`` first for dropout-free, running-stat
    batch norm features), under :func:`torch.no_grad` unless ``grad=True``.
    The recorder's selection (and its record options) is restored at the
    end, also after an error.

    Parameters
    ----------
    rnet : Recorder
        The recorder wrapping the net.
    batches : iterable
        Any iterable of batches: a ``DataLoader``, a list, a generator. To
        resume, it must yield the same batches in the same order.
    keep : Mapping
        Selector -> reducer spec. A selector is a label ``(depth, idx)``, a
        qualified name, or anything :func:`scio_recorder.select.resolve`
        accepts; it must resolve to at least one label, and each label gets
        its own fresh reducer. A spec is ``"concat"`` (per-sample features
        kept on the CPU, spilled to disk beyond ``memory_budget``; a
        ``Concat()`` instance means the same), a statistic name
        (``"moments"``, ``"covariance"``, ``"gram"``, ``"minmax"``,
        ``"count"``), any :func:`~scio_recorder.reduce.make_reducer` spec
        (``"all"``, ``"sum"``, ..., a fold function), or a reducer instance,
        used as a template (``.fresh()`` per label; it is not modified).
    input : int, str, callable or None, default 0
        How to get the net's input from a batch: the item at an index of a
        tuple or list batch, the value at a key of a dict batch, the whole
        batch (``None``), or ``input(batch)``, whose result is passed as the
        positional arguments when it is a tuple, as keyword arguments when it
        is a dict, else as the one argument.
    target : int, str, callable or None, default None
        The same forms, for per-sample integer class labels passed to the
        reducers (:class:`~scio_recorder.reduce.PerClass` and
        :class:`~scio_recorder.reduce.SharedCovariance` need them).
    grad : bool, default False
        Run the passes with autograd enabled (records are still detached by
        the reducers).
    device : torch.device or str, optional
        Move inputs and targets here before the pass (asynchronously toward
        an accelerator: use a ``DataLoader`` with ``pin_memory=True``).
    to : torch.device or str, optional
        Move records here before reducing (by default they stay where the
        net produced them; concatenations always go to the CPU).
    memory_budget : int, optional
        Bytes of concatenated rows to hold in RAM: beyond it, every
        concatenation is appended to a file (in ``spill_dir``, else a
        temporary folder) and its RAM freed. RAM then stays under the budget
        plus one batch's rows. ``None``: no limit.
    spill_dir : str or os.PathLike, optional
        Folder for spilled rows, checkpoints (reducer states, safetensors)
        and the manifest (JSON); enables resuming. Checkpoints write the
        concatenated rows there too, so concatenations come back memory
        mapped from ``spill_dir`` (see :attr:`CollectResult.files`). Under
        :mod:`torch.distributed` each rank uses ``spill_dir/rank-<r>``.
    resume : bool, default True
        With ``spill_dir``: if it holds a run with the same arguments, skip
        the batches it completed (they are still drawn from ``batches``, the
        net does not run on them) and go on from its last checkpoint; a run
        with other arguments is a ``ValueError``. ``False`` deletes the saved
        run and starts over.
    checkpoint_every : int, optional
        Batches between checkpoints (needs ``spill_dir``); default: every
        batch. An error or ``KeyboardInterrupt`` between batches also
        checkpoints the batches completed.
    progress : bool, optional
        A tqdm bar (``unit="sample"``) on stderr. ``None``: shown when stderr
        is a terminal and tqdm is installed (on rank 0 only, under
        :mod:`torch.distributed`).
    gather : {"all", 0, None}, default "all"
        Under an initialised :mod:`torch.distributed` process group: ``"all"``
        gives every rank the merged statistics and all concatenated rows
        (rank 0's, then rank 1's, ...); ``0`` gives every rank the merged
        statistics and only rank 0 the concatenations (``None`` elsewhere);
        ``None`` merges nothing (local results). Ignored otherwise.
    clone : bool, default False
        Record copies (``rnet.record(..., clone=True)``), for nets that modify
        a recorded output in place later in the same pass (e.g. a
        ``ReLU(inplace=True)`` after a recorded layer): without it, the
        reducers would see the modified values (the recorder warns with
        :class:`~scio_recorder.InPlaceWarning`).
    durable : bool, default False
        ``fsync`` every checkpoint's files, so that a checkpoint also survives
        a power loss or an operating-system crash (an exception, a
        ``KeyboardInterrupt`` or a killed process never lose one). Costs a
        few milliseconds per checkpoint on most disks.

    Returns
    -------
    CollectResult
        A read-only mapping label -> result, with ``samples``, ``batches``,
        ``estimate``, ``reducers``, ``save()`` and more.

    Raises
    ------
    ValueError
        For a bad ``keep`` or option, a spill folder holding a run with other
        arguments, batches that differ from the saved run's, or no batch.
    TypeError
        For a spec or batch of the wrong kind.

    Examples
    --------
    Per-class means and the shared covariance of the penultimate layer (the
    Mahalanobis detector of Lee et al. 2018), and the logits themselves:

    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.reduce import SharedCovariance
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_size=(1, 5))
    >>> data = torch.utils.data.TensorDataset(torch.randn(40, 5), torch.arange(40) % 3)
    >>> loader = torch.utils.data.DataLoader(data, batch_size=16)
    >>> result = collect(
    ...     rnet,
    ...     loader,
    ...     {"1": SharedCovariance(num_classes=3), (1, 3): "concat"},
    ...     target=1,
    ... )
    >>> stats = result[(1, 2)]
    >>> stats.class_counts.tolist(), stats.cov.shape, result[(1, 3)].shape
    ([14, 13, 13], torch.Size([4, 4]), torch.Size([40, 3]))
    >>> result.samples, result.batches
    (40, 3)

    """
    _check_options(
        memory_budget=memory_budget,
        checkpoint_every=checkpoint_every,
        spill_dir=spill_dir,
        gather=gather,
        progress=progress,
    )
    slots, labels_of = _plan(rnet, keep)
    if target is None:
        for slot in slots:
            if _needs_target(slot.template):
                msg = (
                    f"keep[{slot.selector!r}] is a {_short_name(slot.template)}, "
                    "which needs per-sample class labels: pass `target=` (e.g. "
                    "`target=1` for (input, label) batches)."
                )
                raise ValueError(msg)
    get_input = _getter(input, "input")
    get_target = None if target is None else _getter(target, "target")
    in_device = None if device is None else torch.device(device)
    out_device = None if to is None else torch.device(to)
    dist_info = _distributed()
    world = dist_info[1] if dist_info is not None else 1
    rank = dist_info[0] if dist_info is not None else 0

    fingerprint = _fingerprint(slots, input, target)
    if world > 1:
        fingerprint["rank"] = f"{rank} of {world}"
    digest = hashlib.sha256(
        json.dumps(
            {k: v for k, v in fingerprint.items() if k != "rank"}, sort_keys=True
        ).encode()
    ).hexdigest()

    folder_path = None
    if spill_dir is not None:
        folder_path = Path(spill_dir)
        if world > 1:
            folder_path /= f"rank-{rank}"
    folder = _Folder(folder_path)
    for slot in slots:
        if slot.template is None:
            slot.store = _ConcatStore(slot.label, folder)
        else:
            slot.reducer = slot.template.fresh()
    checkpoints = (
        None
        if folder_path is None
        else _Checkpoints(folder_path, fingerprint, durable=durable)
    )
    num_samples = _total_samples(batches)
    est = _estimate(slots, rnet.table, num_samples)
    run = _Run(
        rnet,
        slots,
        get_input=get_input,
        input_is_callable=callable(input) and not isinstance(input, int | str),
        get_target=get_target,
        grad=grad,
        device=in_device,
        to=out_device,
        budget=memory_budget,
        checkpoints=checkpoints,
        every=checkpoint_every or 1,
    )
    selection, options = rnet.selection, _record_options(rnet)
    try:
        changed = False
        try:
            rnet.record(*(slot.label for slot in slots), clone=clone)
            changed = True
            saved = _Saved()
            if checkpoints is not None:
                saved = checkpoints.open(slots, resume=resume, device=out_device)
            run.bar = _bar(
                progress=progress if progress is not None or rank == 0 else False,
                total=num_samples,
                initial=saved.samples,
                desc=_description(est),
            )
            if run.bar is not None or memory_budget is not None:
                _announce(est, memory_budget, folder_path)
            run.run(batches, saved)
        finally:
            if changed:
                rnet.record(
                    *selection.outputs,
                    inputs=list(selection.inputs),
                    grads=list(selection.grads),
                    params=list(selection.params),
                    **options,
                )
            if run.bar is not None:
                run.bar.close()
        local = {
            slot.label: slot.store.tensor() for slot in slots if slot.store is not None
        }
        if world > 1 and gather is not None:
            merged = _merge_across_ranks(
                slots,
                local,
                samples=run.samples,
                batches=run.batches,
                gather=gather,
                folder=folder,
                budget=memory_budget,
                digest=digest,
            )
        else:
            merged = _local_results(slots, local, run)
    finally:
        folder.cleanup()
    return CollectResult(
        {slot.label: merged.results[slot.label] for slot in slots},
        samples=merged.samples,
        batches=merged.batches,
        estimate=est,
        reducers={slot.label: merged.reducers[slot.label] for slot in slots},
        labels_of=labels_of,
        rank_samples=merged.rank_samples,
        peak_bytes=run.peak,
        files=merged.files if folder.persistent else {},
        table=rnet.table,
    )


def _description(est: Estimate) -> str:
    """Return the progress bar's title: labels, and the bytes to keep."""
    n = len(est.labels)
    text = f"collect {n} label{'s' if n != 1 else ''}"
    if est.stored_total:
        text += f" ({_human(est.stored_total)} to keep)"
    return text


def _announce(est: Estimate, budget: int | None, folder: Path | None) -> None:
    """Log what the run needs, and whether concatenations will spill."""
    logger.info("collect: %s", est.summary())
    if (
        budget is not None
        and est.stored_total is not None
        and est.stored_total > budget
    ):
        logger.info(
            "collect: concatenations exceed the memory budget (%s): they will "
            "spill to '%s'",
            _human(budget),
            folder if folder is not None else "a temporary folder",
        )


def _local_results(
    slots: list[_Slot], local: dict[DepthIdx, Tensor | None], run: _Run
) -> _Merged:
    """Return this process's results (no distributed merge)."""
    if run.batches == 0:
        msg = (
            "`batches` yielded no batch: there is nothing to collect. Check the "
            "data loader (an empty dataset, or drop_last=True with fewer "
            "samples than batch_size)."
        )
        raise ValueError(msg)
    results: dict[DepthIdx, Any] = {}
    reducers: dict[DepthIdx, Reducer] = {}
    files: dict[DepthIdx, Path] = {}
    for slot in slots:
        if slot.store is not None:
            results[slot.label] = local[slot.label]
            reducers[slot.label] = _concat_reducer(local[slot.label])
            if slot.store.file is not None:
                files[slot.label] = slot.store.file
        else:
            assert slot.reducer is not None  # noqa: S101 (set for reducers)
            results[slot.label] = slot.reducer.result()
            reducers[slot.label] = slot.reducer
    return _Merged(results, reducers, run.samples, run.batches, (run.samples,), files)
