"""How many bytes a collect run handles, computed from the layer table.

Holds :class:`Estimate` and :class:`LabelEstimate` (public, re-exported by
:mod:`scio_recorder.collect`) and :func:`estimate_slots`, which builds an
estimate from a plan (:mod:`scio_recorder._specs`) without running the net:
per-sample shapes and dtypes come from the reference pass's ``output_size``,
streaming states' sizes from the reducers' known layouts.

Why: a run that concatenates features over a whole data set may need more
RAM or disk than is there; saying so before the first batch (in logs, the
progress bar, or on request through :func:`~scio_recorder.collect.estimate`)
is cheaper than finding out hours in.
"""

from __future__ import annotations

__all__ = [
    "Estimate",
    "LabelEstimate",
    "estimate_slots",
    "human",
    "itemsize_of",
    "per_sample_shape",
    "state_bytes_of",
]

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from scio_recorder._support.render import free_table
from scio_recorder.layers import label_str
from scio_recorder.reduce import (
    Count,
    Covariance,
    Gram,
    MinMax,
    Moments,
    Reducer,
    SharedCovariance,
)

from ._specs import keeps_samples, short_name

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx, LayerTable

    from ._specs import Slot


@dataclasses.dataclass(frozen=True)
class LabelEstimate:
    """The memory estimate of one label (see :func:`~scio_recorder.collect.estimate`).

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
    >>> from scio_recorder.collect import estimate
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
    >>> from scio_recorder.collect import estimate
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
        kept = f"kept {human(self.stored_bytes_per_sample)}/sample"
        if self.stored_total is not None:
            kept += f" ({human(self.stored_total)} for {self.num_samples:,} samples)"
        return f"records {human(self.bytes_per_sample)}/sample; {kept}"

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
                label_str(row.label),
                row.name or "-",
                row.reducer,
                "?" if row.shape is None else str(list(row.shape)),
                human(row.bytes_per_sample),
                "yes" if row.stored else "no",
                "-" if row.state_bytes is None else human(row.state_bytes),
            )
            for row in self.labels
        ]
        text = free_table(header, lines)
        for title, per, total in (
            ("records", self.bytes_per_sample, self.total),
            (
                "kept (grows with samples)",
                self.stored_bytes_per_sample,
                self.stored_total,
            ),
        ):
            line = f"{title}: {human(per)} per sample"
            if total is not None:
                line += f", {human(total)} for {self.num_samples:,} samples"
            text.append(line)
        text.append(f"streaming states: {human(self.state_bytes)}")
        return "\n".join(text)


def human(n: float) -> str:
    """Format a byte count: ``512 B``, ``1.5 KiB``, ``2.0 GiB``."""
    if n < 1024:  # noqa: PLR2004 (one KiB)
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":  # noqa: PLR2004 (next unit)
            break
    return f"{n:.1f} {unit}"


def per_sample_shape(output_size: list[Any]) -> tuple[tuple[int, ...] | None, int]:
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


def itemsize_of(table: LayerTable, label: DepthIdx) -> int:
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


def state_bytes_of(reducer: Reducer | None, elements: int, itemsize: int) -> int | None:
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


def estimate_slots(
    slots: list[Slot], table: LayerTable, num_samples: int | None
) -> Estimate:
    rows = []
    for slot in slots:
        # For an input, torchinfo's input_size lists every tensor argument:
        # the estimate counts them all (an upper bound when one is kept).
        size = slot.row.input_size if slot.of_input else slot.row.output_size
        shape, elements = per_sample_shape(size)
        itemsize = itemsize_of(table, slot.label)
        rows.append(
            LabelEstimate(
                label=slot.label,
                name=slot.row.name,
                reducer=short_name(slot.template),
                shape=shape,
                elements=elements,
                itemsize=itemsize,
                stored=keeps_samples(slot.template),
                state_bytes=None
                if keeps_samples(slot.template)
                else state_bytes_of(slot.template, elements, itemsize),
            )
        )
    return Estimate(tuple(rows), num_samples)
