"""The plan of a recording pass: what to capture at each call, fixed per selection.

:meth:`Recorder.record` resolves its selectors (see :mod:`scio_recorder.select`)
into rows of the layer table; :func:`make_plan` turns those rows into a
:class:`CallPlan`: for each hooked module, what to do at its k-th call, how
many calls a pass must make, and the slot that the module's hook counts in.
Everything that can be computed once per selection is computed here, so that
the hooks (:mod:`.hooks`) do nothing per call that a selection could have
done.
"""

from __future__ import annotations

__all__ = [
    "CallPlan",
    "Edits",
    "EndSpec",
    "Postprocessor",
    "RecordOptions",
    "Selection",
    "convert",
    "make_plan",
    "reshaping",
    "with_edits",
]

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from scio_recorder._net.quantized import weighted_layers
from scio_recorder._support.errors import CallPlanError
from scio_recorder._support.tree import map_tensors

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import torch
    from torch import Tensor, nn

    from scio_recorder.layers import DepthIdx, Layer, LayerTable

    from .shards import Shards

Postprocessor: TypeAlias = Callable[[Any], Any]
"""``postproc(output) -> replacement output or None``."""


class reshaping:  # noqa: N801 (used as a function: `reshaping(fn)`)
    """Mark an edit that changes the shape or dtype of what it edits on purpose.

    An edit's replacement must otherwise have the shapes and dtypes of what it
    replaces (the check that names a wrong edit where it is made); wrapped in
    ``reshaping``, an edit may return anything, for the net to take from
    there: keep some positions of a sequence, prune tokens, cast.

    Parameters
    ----------
    edit : callable
        ``edit(value) -> replacement or None``, as for ``activation_postproc``
        and ``input_postproc``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder, reshaping
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)),
    ...                 input_size=(1, 3))  # fmt: skip
    >>> keep_two = reshaping(lambda x: x[:2])  # the second Linear sees 2 rows
    >>> rnet(torch.rand(5, 3), input_postproc={"1": keep_two}).shape
    torch.Size([2, 2])

    """

    __slots__ = ("__qualname__", "__wrapped__")

    def __init__(self, edit: Callable[[Any], Any]) -> None:
        """Wrap ``edit``."""
        if not callable(edit):
            msg = f"reshaping takes an edit (a callable), got {type(edit).__name__}"
            raise TypeError(msg)
        self.__wrapped__ = edit
        self.__qualname__ = getattr(edit, "__qualname__", repr(edit))

    def __call__(self, value: Any) -> Any:
        """Return the wrapped edit's result."""
        return self.__wrapped__(value)

    def __repr__(self) -> str:
        """Show the wrapped edit."""
        return f"reshaping({self.__wrapped__!r})"


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    """How records are stored (see :meth:`Recorder.record`)."""

    clone: bool = False
    detach: bool = False
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    transforms: bool = dataclasses.field(init=False, repr=False)
    """Whether the record differs from the very tensor (derived)."""

    def __post_init__(self) -> None:
        transforms = (
            self.clone
            or self.detach
            or self.device is not None
            or self.dtype is not None
        )
        object.__setattr__(self, "transforms", transforms)

    def apply(self, value: Any) -> Any:
        """Return the record of ``value``: tensors anywhere inside are converted."""
        return map_tensors(self._tensor, value) if self.transforms else value

    def _tensor(self, tensor: Tensor) -> Tensor:
        return convert(tensor, self.clone, self.detach, self.device, self.dtype)

    def as_tuple(self) -> tuple[bool, bool, torch.device | None, torch.dtype | None]:
        """Return ``(clone, detach, device, dtype)`` (see :func:`convert`)."""
        return (self.clone, self.detach, self.device, self.dtype)


def convert(
    tensor: Tensor,
    clone: bool,  # noqa: FBT001
    detach: bool,  # noqa: FBT001
    device: torch.device | None,
    dtype: torch.dtype | None,
) -> Tensor:
    """Return the record of ``tensor`` under the options of :class:`RecordOptions`."""
    out = tensor.detach() if detach else tensor
    if device is not None or (dtype is not None and out.is_floating_point()):
        moved = out.to(device=device, dtype=dtype if out.is_floating_point() else None)
        if moved is not out:
            return moved
    return out.clone() if clone else out


class EndSpec(NamedTuple):
    """What to capture when a call ends: its label, output and/or gradient.

    ``output``: the output is recorded (unless the label is one the plan
    hooks for an edit only, see :attr:`CallPlan.unrecorded`) and goes
    through the pass's postprocessor.
    """

    label: DepthIdx
    output: bool
    grad: bool


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """What to do at each call of each hooked module, fixed for one pass.

    ``ends[module][k]`` says what to capture when the k-th call of ``module``
    to *end* in a pass ends (``None``: nothing, but the call is counted);
    ``starts[module][k]`` is the label whose inputs are captured when the
    k-th call *starts*; ``describe[module]`` names the module and its labels
    for messages; ``reference`` says how the reference pass ran.
    """

    ends: dict[nn.Module, tuple[EndSpec | None, ...]]
    starts: dict[nn.Module, tuple[DepthIdx | None, ...]]
    describe: dict[nn.Module, str]
    options: RecordOptions
    reference: str
    outputs_per_pass: int
    unrecorded: frozenset[DepthIdx] = frozenset()
    """Labels hooked only to be edited (``activation_postproc`` or
    ``input_postproc`` given as a dict): their calls are edited, not recorded."""
    copied: frozenset[DepthIdx] = frozenset()
    """Recorded labels whose output a later in-place operation overwrote in
    the reference pass (:attr:`Layer.overwritten <scio_recorder.layers.Layer.
    overwritten>`): their records are copies, taken when the call ends (and
    its postprocessor ran), so that they stay exact. Empty with
    ``options.clone`` (every record is a copy) and on nets without in-place
    operations: no copy at all."""
    copied_inputs: frozenset[DepthIdx] = frozenset()
    """The same for recorded inputs: labels whose inputs were overwritten."""
    shards: Shards | None = dataclasses.field(default=None, compare=False, repr=False)
    """The tensor-parallel layout of the net, whose pieces the pass makes whole
    (see :mod:`.shards`); ``None`` for a net in one piece."""
    grad_net: nn.Module | None = dataclasses.field(
        default=None, compare=False, repr=False
    )
    """The net, in a plan that captures gradients: each pass that captures one
    first checks that the net's layers still pass gradients to their inputs
    (:func:`~scio_recorder._net.quantized.refuse_gradients`: a model quantized
    after the selection); ``None`` when no gradient is selected."""
    end_slots: dict[nn.Module, int] = dataclasses.field(init=False, repr=False)
    """The slot of each hooked module in a pass's call counts (derived)."""
    expected_counts: list[int] = dataclasses.field(init=False, repr=False)
    """Calls per pass of the module of each slot (derived; never mutated)."""
    start_slots: dict[nn.Module, int] = dataclasses.field(init=False, repr=False)
    """The slot of each pre-hooked module in a pass's start counts (derived)."""
    expected_start_counts: list[int] = dataclasses.field(init=False, repr=False)
    """Call starts per pass of the module of each slot (derived)."""
    grad_layers: tuple[nn.Module, ...] = dataclasses.field(init=False, repr=False)
    """The modules of :attr:`grad_net` that hold a weight, the ones a gradient
    pass looks at (derived: a walk of the net's modules costs more than the
    look)."""
    zero_counts: list[int] = dataclasses.field(init=False, repr=False)
    """A zero per slot: a pass's counts start as a copy (derived; never mutated)."""
    zero_starts: list[int] = dataclasses.field(init=False, repr=False)
    """A zero per start slot (derived; never mutated)."""
    copy_options: RecordOptions = dataclasses.field(init=False, repr=False)
    """``options`` with ``clone``: how the records of :attr:`copied` and
    :attr:`copied_inputs` are taken (a device or dtype move that copies
    already is not copied again, see :func:`convert`; derived)."""

    def __post_init__(self) -> None:
        derived = {
            "end_slots": {module: i for i, module in enumerate(self.ends)},
            "expected_counts": [len(specs) for specs in self.ends.values()],
            "start_slots": {module: i for i, module in enumerate(self.starts)},
            "expected_start_counts": [len(labels) for labels in self.starts.values()],
            "zero_counts": [0] * len(self.ends),
            "zero_starts": [0] * len(self.starts),
            "copy_options": dataclasses.replace(self.options, clone=True),
            "grad_layers": ()
            if self.grad_net is None
            else weighted_layers(self.grad_net),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @classmethod
    def empty(cls, reference: str, shards: Shards | None = None) -> CallPlan:
        """Return the plan that records nothing."""
        return cls({}, {}, {}, RecordOptions(), reference, 0, shards=shards)

    def mismatch(
        self,
        module: nn.Module,
        observed: str,
        expected: int,
        *,
        training: bool,
        grad: bool,
    ) -> CallPlanError:
        """Return the error for ``module`` called ``observed`` times."""
        now = f"{'train' if training else 'eval'} mode with gradients " + (
            "enabled" if grad else "disabled"
        )
        return CallPlanError(
            f"Call plan mismatch: {self.describe[module]} was called {observed} "
            f"in this pass, but the layer table expects {expected} "
            f"call{'s' if expected != 1 else ''}. Labels cannot be matched to "
            "calls, so no activations were kept. Likely causes: the mode differs "
            f"from the reference pass (table built in {self.reference}; this "
            f"pass ran in {now}: build the table in the mode you run with "
            '`Recorder(net, ..., mode="train")`, or call `rnet.eval()`), a '
            "fused fast path that skips submodules in some modes, or control "
            "flow that depends on the input (data-dependent branches or loops)."
        )


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a recorder records (see :meth:`Recorder.record`).

    Attributes
    ----------
    outputs, inputs, grads : tuple of DepthIdx
        Sorted labels whose outputs, inputs and output gradients are recorded.
    params : tuple of str
        Qualified names of the selected parameters.
    """

    outputs: tuple[DepthIdx, ...] = ()
    inputs: tuple[DepthIdx, ...] = ()
    grads: tuple[DepthIdx, ...] = ()
    params: tuple[str, ...] = ()


def make_plan(  # noqa: PLR0913 (the rows of each kind)
    table: LayerTable,
    outputs: list[Layer],
    inputs: list[Layer],
    grads: list[Layer],
    options: RecordOptions,
    *,
    edits: Sequence[Layer] = (),
    input_edits: Sequence[Layer] = (),
    shards: Shards | None = None,
    grad_net: nn.Module | None = None,
) -> CallPlan:
    """Return the call plan that captures the given rows.

    ``edits`` and ``input_edits`` are rows hooked only to be edited (their
    outputs, or their inputs), not recorded unless also in ``outputs`` or
    ``inputs``; ``shards``: see :attr:`CallPlan.shards`; ``grad_net``: see
    :attr:`CallPlan.grad_net` (kept only when ``grads`` is not empty).
    """
    out_labels = {row.label for row in outputs}
    grad_labels = {row.label for row in grads}
    in_labels = {row.label for row in inputs}
    unrecorded = {row.label for row in edits} - out_labels
    unrecorded |= {row.label for row in input_edits} - in_labels
    ends_at = out_labels | {row.label for row in edits}
    starts_at = in_labels | {row.label for row in input_edits}
    ends: dict[nn.Module, tuple[EndSpec | None, ...]] = {}
    starts: dict[nn.Module, tuple[DepthIdx | None, ...]] = {}
    describe: dict[nn.Module, str] = {}
    for row in (*outputs, *grads, *inputs, *edits, *input_edits):
        module = row.module
        if module in describe:
            continue
        calls = table.calls_of(module)
        if any(call.label in ends_at or call.label in grad_labels for call in calls):
            ends[module] = tuple(
                EndSpec(call.label, call.label in ends_at, call.label in grad_labels)
                if call.label in ends_at or call.label in grad_labels
                else None
                for call in table.call_plan(module)
            )
        if any(call.label in starts_at for call in calls):
            starts[module] = tuple(
                call.label if call.label in starts_at else None for call in calls
            )
        name = f"`{row.name}`" if row.name else "the whole net"
        describe[module] = (
            f"module {name} ({type(module).__name__}, "
            f"label{'s' if len(calls) > 1 else ''} "
            f"{', '.join(call.label_str for call in calls)})"
        )
    copied: frozenset[DepthIdx] = frozenset()
    copied_inputs: frozenset[DepthIdx] = frozenset()
    if not options.clone:  # with it, every record is a copy already
        copied = frozenset(row.label for row in outputs if "output" in row.overwritten)
        copied_inputs = frozenset(
            row.label for row in inputs if "inputs" in row.overwritten
        )
    return CallPlan(
        ends,
        starts,
        describe,
        options,
        table.mode_description,
        len(out_labels),
        frozenset(unrecorded),
        copied,
        copied_inputs,
        shards,
        grad_net if grad_labels else None,
    )


@dataclasses.dataclass(frozen=True)
class Edits:
    """The edits of one pass, by label: of outputs, and of first inputs.

    What ``activation_postproc`` and ``input_postproc`` become when given as
    ``{selector: fn}``: each selector resolved to the labels it picks.
    """

    outputs: dict[DepthIdx, Postprocessor] = dataclasses.field(default_factory=dict)
    inputs: dict[DepthIdx, Postprocessor] = dataclasses.field(default_factory=dict)


def with_edits(
    plan: CallPlan,
    table: LayerTable,
    edits: frozenset[DepthIdx],
    input_edits: frozenset[DepthIdx],
) -> CallPlan:
    """Return ``plan``, or ``plan`` extended to hook the edited calls too.

    The recorded rows stay those of ``plan``; calls edited but not recorded
    are hooked and counted, and left out of the records.
    """
    outputs, grads, inputs = [], [], []
    for specs in plan.ends.values():
        for spec in specs:
            if spec is not None and spec.label not in plan.unrecorded:
                if spec.output:
                    outputs.append(spec.label)
                if spec.grad:
                    grads.append(spec.label)
    for labels in plan.starts.values():
        inputs += [x for x in labels if x is not None and x not in plan.unrecorded]
    if edits <= set(outputs) and input_edits <= set(inputs):
        return plan

    def rows(labels: Iterable[DepthIdx]) -> list[Layer]:
        return [table[label] for label in labels]

    return make_plan(
        table,
        rows(outputs),
        rows(inputs),
        rows(grads),
        plan.options,
        edits=rows(sorted(edits)),
        input_edits=rows(sorted(input_edits)),
        shards=plan.shards,
        grad_net=plan.grad_net,
    )
