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
    "InputOf",
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

from scio_recorder._engine.state import CallInputs, pick_argument
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
    check_class_labels,
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


@dataclasses.dataclass(frozen=True)
class InputOf:
    """A key of ``collect``'s ``keep``: the *inputs* of the selected layers.

    ``keep={InputOf("fc"): SharedCovariance(10)}`` reduces what the layer
    ``fc`` receives (e.g. the penultimate features a Mahalanobis detector
    needs, when ``fc`` is the last ``Linear``) instead of what it outputs.
    The result is keyed by the layer's label, as for outputs; a label is
    kept once per run (its output or one of its inputs).

    Parameters
    ----------
    selector
        Anything :meth:`~scio_recorder.Recorder.record` accepts.
    arg : int or str, optional
        Which argument: a positional index or a keyword name. ``None`` (the
        default): the first tensor argument.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.collect import InputOf, collect
    >>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    >>> rnet = Recorder(net, input_size=(1, 5))
    >>> data = [torch.randn(8, 5) for _ in range(3)]
    >>> result = collect(rnet, data, {InputOf("2"): "moments"}, input=None)
    >>> result[(1, 3)].mean.shape  # the 4 features fed to the last Linear
    torch.Size([4])

    """

    selector: Any
    arg: int | str | None = None

    def __post_init__(self) -> None:
        """Check ``arg``."""
        arg = self.arg
        if arg is not None and (
            isinstance(arg, bool) or not isinstance(arg, int | str)
        ):
            msg = (
                f"InputOf: arg must be a positional index (int), a keyword name "
                f"(str) or None (the first tensor argument), got {arg!r}"
            )
            raise TypeError(msg)


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
    of_input: bool = False  # reduce an argument of the call, not its output
    arg: int | str | None = None  # which argument (None: the first tensor)
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

    def value_of(
        self, outputs: Mapping[DepthIdx, Any], inputs: Mapping[DepthIdx, Any]
    ) -> Any:
        """Return this slot's record from a pass's outputs and inputs."""
        if not self.of_input:
            return outputs[self.label]
        call: CallInputs = inputs[self.label]
        return pick_argument(
            call,
            self.arg,
            self.row.describe(),
            f"InputOf({self.selector.selector!r}, arg=...)",
        )

    def check_target(self, target: Tensor) -> None:
        """Check class labels (on the CPU) for a reducer that takes them."""
        if needs_target(self.template):
            num_classes = getattr(self.template, "num_classes", None)
            who = f"keep[{self.selector!r}]: {short_name(self.template)}"
            check_class_labels(target, num_classes, who)

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
        of_input = isinstance(selector, InputOf)
        inner = selector.selector if isinstance(selector, InputOf) else selector
        rows = resolve(rnet.table, rnet.net, [inner])
        template = template_of(selector, spec)
        labels_of[selector] = tuple(row.label for row in rows)
        for row in rows:
            if row.label in slots:
                msg = (
                    f"Layer {row.describe()} is selected by both "
                    f"{slots[row.label].selector!r} and {selector!r} in `keep`; "
                    "each label gets one reducer (its output or one of its "
                    "inputs). Use a narrower selector, or collect twice."
                )
                raise ValueError(msg)
            arg = selector.arg if isinstance(selector, InputOf) else None
            slots[row.label] = Slot(row.label, row, selector, template, of_input, arg)
    order = {label: i for i, label in enumerate(rnet.table)}
    return sorted(slots.values(), key=lambda s: order[s.label]), labels_of
