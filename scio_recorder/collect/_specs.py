"""What :func:`~scio_recorder.collect.collect` is asked to keep, resolved per label.

Holds the public spec types and names (``ReducerSpec``, ``BatchSpec``,
``Gather``, ``CONCAT``, ``STATISTICS``, re-exported by
:mod:`scio_recorder.collect`), the turning of one spec into a reducer
template, and :func:`plan`, which resolves ``keep`` into one :class:`Slot`
per recorded label, in table order.

Why a module of its own: the plan is the one structure every other part of a
run works on (the estimate, the loop, checkpoints, the distributed merge);
keeping it apart lets each of them depend on it and on nothing else.
"""

from __future__ import annotations

__all__ = [
    "CONCAT",
    "STATISTICS",
    "BatchSpec",
    "Gather",
    "ReducerSpec",
    "Slot",
    "keeps_samples",
    "needs_target",
    "plan",
    "short_name",
    "template_of",
]

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from torch import Tensor

from scio_recorder.layers import label_str
from scio_recorder.reduce import (
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
from scio_recorder.select import resolve

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx, Layer
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

    from ._spill import ConcatStore

ReducerSpec: TypeAlias = str | Reducer | Callable[[Any, Any], Any]
"""What :func:`~scio_recorder.collect.collect` accepts per selector: ``"concat"``, a
name, a reducer, or a fold function ``fn(acc, new) -> acc`` (see
:func:`~scio_recorder.collect.collect`)."""

BatchSpec: TypeAlias = int | str | Callable[[Any], Any] | None
"""How to take the input (or the target) out of a batch (see
:func:`~scio_recorder.collect.collect`)."""

Gather: TypeAlias = Literal["all", 0] | None
"""Where merged results go under :mod:`torch.distributed` (see
:func:`~scio_recorder.collect.collect`)."""

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
"""Names of data-set statistics :func:`~scio_recorder.collect.collect` accepts besides
``"concat"`` and the names of :func:`~scio_recorder.reduce.make_reducer`."""


def template_of(selector: Selector, spec: object) -> Reducer | None:
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


def needs_target(reducer: Reducer | None) -> bool:
    return isinstance(reducer, PerClass | SharedCovariance)


def keeps_samples(reducer: Reducer | None) -> bool:
    """Whether the reducer keeps every sample (its memory grows with them)."""
    if reducer is None or isinstance(reducer, Keep | Concat):
        return True
    return isinstance(reducer, Quantiles) and reducer.exact


def short_name(reducer: Reducer | None) -> str:
    return CONCAT if reducer is None else type(reducer).__name__


@dataclasses.dataclass
class Slot:
    """One recorded label: its row, its reducer (or concat store)."""

    label: DepthIdx
    row: Layer
    selector: Selector
    template: Reducer | None  # None: concatenate
    reducer: Reducer | None = None
    store: ConcatStore | None = None
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
        return label_str(self.label)


def plan(
    rnet: Recorder, keep: Mapping[Selector, ReducerSpec]
) -> tuple[list[Slot], dict[Selector, tuple[DepthIdx, ...]]]:
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
    slots: dict[DepthIdx, Slot] = {}
    labels_of: dict[Selector, tuple[DepthIdx, ...]] = {}
    for selector, spec in keep.items():
        rows = resolve(rnet.table, rnet.net, [selector])
        template = template_of(selector, spec)
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
            slots[row.label] = Slot(row.label, row, selector, template)
    order = {label: i for i, label in enumerate(rnet.table)}
    return sorted(slots.values(), key=lambda s: order[s.label]), labels_of
