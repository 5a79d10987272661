"""The state of one recording pass, and the records it leaves behind.

A :class:`PassState` lives for one pass of the net: the calls counted so
far (one slot per hooked module, see :class:`~.plan.CallPlan`), the records
being built, the version counters that detect later in-place changes, the
gradient slots. It is created when the pass opens and dropped when it closes
(see :mod:`.passes`), never stored on a module, so concurrent passes from two
threads, and nested recorders, never mix. A :class:`Listener` stands in the
registry when no pass runs (an open scope), and hooks find nothing to do.

:class:`Latest` holds the records of the latest completed pass; the views
``rnet.activations`` and ``rnet.inputs`` wrap them in :class:`Records`,
whose ``KeyError`` says what to write instead.
"""

from __future__ import annotations

__all__ = [
    "CallInputs",
    "GradSlot",
    "Latest",
    "Listener",
    "PassState",
    "Records",
    "check_edit",
    "edit_name",
    "missing_record",
    "pick_argument",
    "user_stacklevel",
]

import inspect
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd import Variable

from scio_recorder._net.quantized import refuse_gradients
from scio_recorder._support.tree import (
    iter_tensors,
    map_leaves,
    map_tensors,
    tensor_items,
)

from .plan import reshaping

if TYPE_CHECKING:
    from scio_recorder._support.errors import CallPlanError
    from scio_recorder.layers import DepthIdx, LayerTable

    from .plan import CallPlan, EndSpec, Postprocessor, RecordOptions


class CallInputs(NamedTuple):
    """The inputs of one call: positional ``args`` and keyword ``kwargs``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def pick_argument(
    inputs: CallInputs,
    arg: int | str | None,
    layer: str,
    option: str = "input_args=",
) -> Any:
    """Return one argument of a call.

    ``arg`` is a positional index, a keyword name, or ``None`` for the first
    tensor argument. ``layer`` describes the layer and ``option`` names the
    option that chooses the argument, for the message raised when the call
    has no such argument.

    Examples
    --------
    >>> import torch
    >>> call = CallInputs((torch.zeros(2), 3), {"mask": None})
    >>> pick_argument(call, None, "1-1").shape, pick_argument(call, 1, "1-1")
    (torch.Size([2]), 3)
    >>> pick_argument(call, "scale", "1-1 (Mix `mix`)")
    Traceback (most recent call last):
    ...
    ValueError: Cannot reduce the inputs of 1-1 (Mix `mix`): the call has no keyword argument 'scale'. Name an argument the module receives with `input_args=` (ints for positional arguments, strings for keyword ones).

    """  # noqa: E501 (doctest output)
    if arg is None:
        for value in (*inputs.args, *inputs.kwargs.values()):
            if isinstance(value, Tensor):
                return value
        msg = (
            f"Cannot reduce the inputs of {layer}: the call has no tensor "
            f"argument. Name the argument with `{option}`."
        )
        raise ValueError(msg)
    if isinstance(arg, str):
        if arg in inputs.kwargs:
            return inputs.kwargs[arg]
        where = f"keyword argument {arg!r}"
    elif -len(inputs.args) <= arg < len(inputs.args):
        return inputs.args[arg]
    else:
        where = f"positional argument {arg}"
    msg = (
        f"Cannot reduce the inputs of {layer}: the call has no {where}. Name an "
        f"argument the module receives with `{option}` (ints for positional "
        "arguments, strings for keyword ones)."
    )
    raise ValueError(msg)


GRADIENTS_TAKER = "A pass that captures the gradients of `record(grads=...)`"
"""What the refusal of a gradient pass names (:meth:`PassState.watch_grad`)."""


class GradSlot:
    """The gradient of one recorded output, filled in during backward.

    Tensor hooks on the output (registered before any later in-place change,
    so they see the gradient of the value the layer produced) store each
    tensor's gradient. When a ``sink`` is given (an open scope), the whole
    structure is handed to it once the backward pass that delivered the
    gradients has finished, with ``None`` for tensors that got none.
    """

    __slots__ = ("grads", "options", "queued", "sink", "template")

    def __init__(
        self,
        output: Any,
        options: RecordOptions,
        sink: Callable[[Any], None] | None,
    ) -> None:
        self.options = options
        self.sink = sink
        self.queued = False
        leaves: list[Tensor] = []

        def index(tensor: Tensor) -> Any:
            leaves.append(tensor)
            return _Leaf(len(leaves) - 1)

        if isinstance(output, Tensor):  # the common case, without a tree walk
            leaves.append(output)
            self.template: Any = _Leaf(0)
        else:
            self.template = map_tensors(index, output)
        self.grads: list[Tensor | None] = [None] * len(leaves)
        for i, leaf in enumerate(leaves):
            if leaf.requires_grad:
                leaf.register_hook(self._hook(i))  # type: ignore[no-untyped-call]

    def _hook(self, i: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            self.grads[i] = self.options.apply(grad)
            if self.sink is not None and not self.queued:
                # Runs once this backward pass is over (as DDP's hooks do).
                self.queued = True
                Variable._execution_engine.queue_callback(self._flush)  # noqa: SLF001 (no public API)

        return hook

    def _flush(self) -> None:
        self.queued = False
        if self.sink is not None:
            self.sink(self.value())

    def value(self) -> Any:
        """Return the gradients in the output's structure (``None`` if missing)."""
        grads = self.grads
        return map_leaves(grads.__getitem__, self.template, _Leaf)


class _Leaf(int):
    """Position of a tensor leaf inside a record template."""


class Uncaptured:
    """Stands for a gradient selected but not captured: the pass ran without autograd.

    Kept in the pass's ``grads`` where a :class:`GradSlot` would be, so that
    reading ``rnet.gradients[label]`` afterwards says why there is none
    (:class:`Gradients`), instead of an empty mapping with no word.
    """

    __slots__ = ()


UNCAPTURED = Uncaptured()
"""The one :class:`Uncaptured`."""

_NO_INPUTS: dict[DepthIdx, CallInputs] = {}
_NO_GRADS: dict[DepthIdx, GradSlot | Uncaptured] = {}
GradSink = Callable[["DepthIdx"], Callable[[Any], None] | None]
"""``grad_sink(label)``: where that label's gradient goes once it arrives."""


class Listener:
    """What the registry holds for a recorder while no pass of it runs.

    An open scope registers one (see :class:`~scio_recorder.scope.Scope`):
    its submodules called outside a pass find it, and the hooks do nothing.
    ``plan`` is ``None``, which no hook's plan is, so the hooks' fast path
    (``state.plan is plan``) leads here.
    """

    plan: CallPlan | None = None
    grad_sink: GradSink | None = None

    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Ignore a call start outside a pass."""

    def on_output(self, module: nn.Module, output: Any) -> Any:
        """Ignore a call end outside a pass."""

    def feed(self, state: PassState) -> None:
        """Receive a completed pass made while this listener was registered."""

    def dropped(self) -> None:
        """Learn that the pass in progress failed, and was dropped."""


class PassState:
    """Everything that lives for one pass of the net.

    Built on every pass, so only what every pass needs is set in
    ``__init__``; the rest starts as class-level defaults (shared empty dicts
    are replaced, never written, see ``on_input`` and ``watch_grad``).
    ``counts[slot]`` counts the calls of the hooked module of that slot
    (``plan.end_slots``), ``starts[slot]`` the call starts of a pre-hooked
    one; ``plain`` says that a recorded output is stored as it is (no
    postprocessor, ``dont_record`` off): the hooks' fast path.
    """

    post_index = 0
    input_postproc: dict[DepthIdx, Postprocessor] | None = None
    """Label -> the edit of that call's first positional input."""
    grad_sink: GradSink | None = None
    inputs: dict[DepthIdx, CallInputs] = _NO_INPUTS
    grads: dict[DepthIdx, GradSlot | Uncaptured] = _NO_GRADS
    grads_checked = False
    """Whether this pass checked that the net passes gradients (``watch_grad``)."""

    def __init__(
        self,
        plan: CallPlan,
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        dont_record: bool,  # noqa: FBT001 (positional: built on every pass)
        training: bool,  # noqa: FBT001 (positional: built on every pass)
        grad_sink: GradSink | None = None,
    ) -> None:
        self.plan = plan
        self.postproc = postproc
        self.dont_record = dont_record
        self.plain = postproc is None and not dont_record and plan.shards is None
        self.training = training
        if grad_sink is not None:
            self.grad_sink = grad_sink
        self.counts = plan.zero_counts[:]
        self.starts = plan.zero_starts[:]
        self.records: dict[DepthIdx, Any] = {}
        # Every recorded tensor and its version counter when recorded, checked
        # at the end of the pass to detect in-place modifications of records
        # (two flat lists: checked in one comprehension, see `changed`).
        self.watched: list[Tensor] = []
        self.versions: list[int] = []

    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        """Handle the start of a call of a module whose inputs are captured.

        Returns ``(args, kwargs)`` with the first positional argument edited
        when ``input_postproc`` edits this call, else ``None``.
        """
        plan = self.plan
        label = self.next_entry(module, plan.start_slots, self.starts, plan.starts)
        if label is None:
            return None
        pieces = args
        if plan.shards is not None:  # a tensor-parallel net: whole inputs
            args = plan.shards.whole(module, args, "input")
        if not self.dont_record and label not in plan.unrecorded:
            self.record_inputs(label, args, kwargs)
        edit = None if self.input_postproc is None else self.input_postproc.get(label)
        if edit is None:
            return None
        if not args:
            msg = (
                f"`input_postproc` edits the first positional input of "
                f"{plan.describe[module]}, but call {label[0]}-{label[1]} got "
                "none (only keyword arguments). Edit the output of the module "
                "that computes it instead, with `activation_postproc`."
            )
            raise ValueError(msg)
        new = edit(args[0])
        if new is not None and new is not args[0] and not isinstance(edit, reshaping):
            check_edit(
                new,
                args[0],
                "first positional input",
                lambda: (
                    f"{edit_name(edit)} (`input_postproc`) of call "
                    f"{label[0]}-{label[1]} of {plan.describe[module]}"
                ),
            )
        if plan.shards is not None and args is not pieces:
            # the edit (or the whole, edited in place) goes back as this rank's piece
            whole = args if new is None else (new, *args[1:])
            return plan.shards.piece(module, whole, pieces, "input"), kwargs
        if new is None:
            return None
        return (new, *args[1:]), kwargs

    def record_inputs(self, label: DepthIdx, args: Any, kwargs: Any) -> None:
        """Record the inputs of ``label``'s call (with their version counters)."""
        if self.inputs is _NO_INPUTS:
            self.inputs = {}
        plan = self.plan
        options = plan.options
        if label in plan.copied_inputs:  # overwritten later: a copy, exact
            options = plan.copy_options
        if options.transforms:
            args, kwargs = options.apply(args), options.apply(kwargs)
        record = CallInputs(tuple(args), dict(kwargs))
        self.inputs[label] = record
        if not options.clone:
            for item in (*record.args, *record.kwargs.values()):
                self.watch_record(item)

    def on_output(self, module: nn.Module, output: Any) -> Any:
        """Handle the end of a call of a hooked ``module`` (the general path).

        The hooks of :mod:`.hooks` count calls themselves and call
        :meth:`end_call`; this finds the module's slot first, for a hook
        placed by another plan than this pass's.
        """
        plan = self.plan
        spec = self.next_entry(module, plan.end_slots, self.counts, plan.ends)
        if spec is None:
            return None
        return self.end_call(module, spec, output)

    def next_entry(
        self,
        module: nn.Module,
        slots: dict[nn.Module, int],
        counts: list[int],
        plans: dict[nn.Module, tuple[Any, ...]],
    ) -> Any:
        """Count a call of ``module``; return its entry of the plan (or ``None``).

        ``None`` too for a module hooked after this pass started (not in this
        pass's plan); one call too many raises :class:`CallPlanError`.
        """
        slot = slots.get(module)
        if slot is None:
            return None
        entries = plans[module]
        k = counts[slot]
        counts[slot] = k + 1
        if k >= len(entries):
            raise self.extra_call(module, k + 1, len(entries))
        return entries[k]

    def end_call(self, module: nn.Module, spec: EndSpec, output: Any) -> Any:
        """Capture what ``spec`` asks of a call's ``output``; return its edit."""
        label, wants_output, wants_grad = spec
        if not wants_output:
            if not self.dont_record:
                self.watch_grad(module, label, output)
            return None
        plan = self.plan
        options = plan.options
        shards, piece = plan.shards, output
        if shards is not None:  # a tensor-parallel net: whole outputs
            output = shards.whole(module, output, "output")
        record = None
        copy = False
        if not self.dont_record and label not in plan.unrecorded:
            if label in plan.copied:
                # A later in-place operation overwrites this output (the
                # reference pass saw it): the record is a copy, taken after the
                # postprocessor (below), so that an in-place edit shows in it
                # as in any record. A copy needs no version counter.
                copy = True
                self.records[label] = None  # its place in the records' order
            else:
                record = options.apply(output) if options.transforms else output
                self.records[label] = record
        result = (
            None if self.postproc is None else self.postprocess(label, output, module)
        )
        if copy:
            self.records[label] = plan.copy_options.apply(output)
        if shards is not None and output is not piece and self.postproc is not None:
            # the edit (or the whole, edited in place) goes back as this rank's piece
            result = shards.piece(
                module, output if result is None else result, piece, "output"
            )
        if record is not None and not options.clone:
            self.watch_record(record)
        if wants_grad and not self.dont_record:
            self.watch_grad(module, label, output if result is None else result)
        return result

    def postprocess(
        self, label: DepthIdx, output: Any, module: nn.Module | None = None
    ) -> Any:
        """Run the postprocessor of ``label``'s call on ``output``; return its result.

        One callable edits every call; a dict (label -> callable, resolved
        from the selectors of ``activation_postproc``) edits its labels only;
        a list is consumed one item per recorded call. A result that is not
        ``None`` nor ``output`` itself must match ``output`` (see
        :func:`check_edit`; ``module`` names the layer, eager passes only).
        """
        postproc = self.postproc
        if callable(postproc):
            func = postproc
        elif isinstance(postproc, dict):
            func = postproc.get(label)
            if func is None:
                return None
        else:
            assert postproc is not None  # noqa: S101 (checked by the caller)
            if self.post_index >= len(postproc):
                raise ValueError(self.too_few_message(len(postproc)))
            func = postproc[self.post_index]
            self.post_index += 1
        result = func(output)
        if (
            result is not None
            and result is not output
            and module is not None
            and not isinstance(func, reshaping)
        ):
            check_edit(
                result,
                output,
                "output",
                lambda: (
                    f"{edit_name(func)} (`activation_postproc`) of call "
                    f"{label[0]}-{label[1]} of {self.plan.describe[module]}"
                ),
            )
        if self.watched:  # in-place edits by postprocessors are the user's
            self.versions = [t._version for t in self.watched]  # noqa: SLF001
        return result

    def watch_record(self, record: Any) -> None:
        """Keep the version counter of a record (one tensor: without a tree walk)."""
        if isinstance(record, Tensor):
            try:
                version = record._version  # noqa: SLF001 (version counter)
            except RuntimeError:  # inference tensors have no version counter
                return
            self.watched.append(record)
            self.versions.append(version)
        else:
            self.watch(record)

    def watch(self, record: Any) -> None:
        """Keep the version counter of every tensor inside ``record``."""
        for tensor in iter_tensors(record):
            if not tensor.is_inference():  # inference tensors have no counter
                self.watched.append(tensor)
                self.versions.append(tensor._version)  # noqa: SLF001 (version counter)

    def changed(self) -> list[tuple[DepthIdx, str]]:
        """Return ``(label, kind)`` of each record changed in place since taken.

        The pass compares every version counter at once, in one
        comprehension (the usual answer: none changed), and asks this only
        when one changed: the labels are looked up for changed tensors.
        """
        found: list[tuple[DepthIdx, str]] = []
        for tensor, version in zip(self.watched, self.versions, strict=True):
            if tensor._version == version:  # noqa: SLF001 (version counter)
                continue
            for kind, records in (
                ("activations", self.records),
                ("inputs", self.inputs),
            ):
                for label, record in records.items():
                    if any(t is tensor for t in iter_tensors(record)):
                        found.append((label, kind))
        return list(dict.fromkeys(found))

    def watch_grad(self, module: nn.Module, label: DepthIdx, output: Any) -> None:
        """Capture the gradient that will flow back into ``output``.

        In a pass without gradients (``torch.no_grad()``,
        ``torch.inference_mode()``) nothing is captured: the same selection
        serves clean runs without gradients and runs with them. The label is
        kept as :data:`UNCAPTURED`, so that reading its gradient says why
        there is none.
        """
        if not torch.is_grad_enabled():
            if self.grads is _NO_GRADS:
                self.grads = {}
            self.grads[label] = UNCAPTURED
            return
        if not self.grads_checked:  # once a pass, at its first gradient
            self.grads_checked = True
            plan = self.plan
            if plan.grad_net is not None:  # quantized since the selection?
                refuse_gradients(plan.grad_net, GRADIENTS_TAKER, plan.grad_layers)
        if not (
            output.requires_grad
            if isinstance(output, Tensor)
            else any(t.requires_grad for t in iter_tensors(output))
        ):
            raise RuntimeError(self.no_grad_message(module, label))
        sink = self.grad_sink(label) if self.grad_sink is not None else None
        if self.grads is _NO_GRADS:
            self.grads = {}
        self.grads[label] = GradSlot(output, self.plan.options, sink)

    def extra_call(self, module: nn.Module, calls: int, expected: int) -> CallPlanError:
        """Return the error for the ``calls``-th call of ``module`` (one too many)."""
        return self.plan.mismatch(
            module,
            f"at least {calls} times",
            expected,
            training=self.training,
            grad=torch.is_grad_enabled(),
        )

    def no_grad_message(self, module: nn.Module, label: DepthIdx) -> str:
        """Return the error message for a gradient that cannot flow back."""
        return (
            f"Cannot capture the gradient of {self.plan.describe[module]} at "
            f"label {label[0]}-{label[1]}: its output does not require grad "
            "(nothing before it requires grad: no parameter before it has "
            "`requires_grad=True`, and neither has the input). Set "
            "`requires_grad_()` on the input, or record without `grads=`."
        )

    def too_few_message(self, given: int) -> str:
        """Return the error message for a postprocessor list that is too short."""
        return (
            "There were not enough postprocessing functions for every recorded "
            f"layer: {given} given, {self.plan.outputs_per_pass} recorded calls "
            "per pass. If you wish to use the same function for every recorded "
            "layer, use the signature `rnet(*args, activation_postproc: "
            "Postprocessor, **kwargs)`. See `help(rnet.forward)` for more "
            "information"
        )

    def check_counts(self) -> None:
        """Raise :class:`CallPlanError` unless every hooked module ran as planned.

        With ``dont_record`` fewer calls are accepted (nothing is recorded, and
        the reference Recorder accepted them); extra calls raise in the hook.
        """
        plan = self.plan
        if (
            self.counts == plan.expected_counts
            and self.starts == plan.expected_start_counts
        ):
            return  # the usual case, checked in C
        for module, slot in plan.start_slots.items():
            observed, expected = self.starts[slot], len(plan.starts[module])
            if observed != expected and not (self.dont_record and observed < expected):
                raise plan.mismatch(
                    module,
                    f"{observed} time{'s' if observed != 1 else ''}",
                    expected,
                    training=self.training,
                    grad=torch.is_grad_enabled(),
                )
        for module, slot in plan.end_slots.items():
            specs = plan.ends[module]
            observed, expected = self.counts[slot], len(specs)
            if observed == expected or (self.dont_record and observed < expected):
                continue
            error = plan.mismatch(
                module,
                f"{observed} time{'s' if observed != 1 else ''}",
                expected,
                training=self.training,
                grad=torch.is_grad_enabled(),
            )
            missing = sorted(
                spec.label for spec in specs[observed:] if spec is not None
            )
            if missing:
                error.args = (f"Missing {missing} activations. {error.args[0]}",)
            raise error


def edit_name(func: Callable[..., Any]) -> str:
    """Return how a message names an edit: its ``__qualname__`` (else its repr)."""
    name = getattr(func, "__qualname__", None)
    return f"`{name}`" if isinstance(name, str) else repr(func)


def check_edit(result: Any, original: Any, what: str, where: Callable[[], str]) -> None:
    """Raise unless an edit's ``result`` can replace ``original``.

    The same tensors at the same places (the containers may differ: a list
    for a tuple), each of the same shape and dtype. Under autocast a dtype
    may change (autocast casts the next operation's inputs anyway).
    ``where()`` names the edit and the layer, for the message; it runs only
    when the check fails.
    """
    if (
        isinstance(original, Tensor)
        and isinstance(result, Tensor)
        and result.shape == original.shape
        and result.dtype == original.dtype
    ):
        return  # the common case
    got: list[tuple[tuple[Any, ...], Tensor]] = list(tensor_items(result))
    want: list[tuple[tuple[Any, ...], Tensor]] = list(tensor_items(original))
    problem = _mismatch(got, want, what)
    if problem is None:
        return
    msg = (
        f"The edit {where()} returned {problem}. An edit returns `None` (to "
        "keep the value, e.g. after changing it in place) or a replacement "
        "with the same tensors, of the same shapes and dtypes."
    )
    raise ValueError(msg)


def _mismatch(
    got: list[tuple[tuple[Any, ...], Tensor]],
    want: list[tuple[tuple[Any, ...], Tensor]],
    what: str,
) -> str | None:
    """Say how the tensors ``got`` differ from those ``want``, ``None`` if they fit."""
    if [path for path, _ in got] != [path for path, _ in want]:
        return (
            f"tensors at {_paths(got)}, where the {what} has tensors at {_paths(want)}"
        )
    for (path, new), (_, old) in zip(got, want, strict=True):
        if new.shape != old.shape or (
            new.dtype != old.dtype and not _autocasting(old.device.type)
        ):
            at = f" at {_path(path)}" if path else ""
            return f"{_describe(new)}{at}, where the {what} is {_describe(old)}"
    return None


def _describe(tensor: Tensor) -> str:
    return f"a tensor of shape {list(tensor.shape)} and dtype {tensor.dtype}"


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{key!r}]" for key in path)


def _paths(items: list[tuple[tuple[Any, ...], Tensor]]) -> str:
    if not items:
        return "no place (no tensor)"
    return ", ".join(_path(path) or "the top (a tensor)" for path, _ in items)


def _autocasting(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``."""
    try:
        return bool(torch.is_autocast_enabled(device_type))  # type: ignore[call-arg,unused-ignore]
    except TypeError:  # torch < 2.4 takes no device type
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return bool(torch.is_autocast_enabled())


class Latest:
    """The records of the latest completed pass (a plain object: cheap to set)."""

    __slots__ = ("activations", "grads", "inputs", "steps", "traced_grads")

    def __init__(self) -> None:
        self.steps: list[dict[DepthIdx, Any]] = []
        """The outputs of every forward step of the latest ``call_method``."""
        self.activations: dict[DepthIdx, Any] = {}
        self.inputs: dict[DepthIdx, CallInputs] = {}
        self.grads: dict[DepthIdx, GradSlot | Uncaptured] = {}
        self.traced_grads: dict[DepthIdx, Any] = {}
        """Label -> what a compiled pass passed on (gradients: ``GradDeposits``)."""


class Gradients(dict[Any, Any]):
    """The gradients of a pass that ran without autograd for some of its labels.

    Indexing one of them raises a ``KeyError`` naming the labels whose
    gradients the pass did not capture, and why (``rnet.gradients`` was
    silently empty after a ``torch.no_grad()`` pass).
    """

    __slots__ = ("missed",)

    def __init__(self, values: dict[Any, Any], missed: list[str]) -> None:
        super().__init__(values)
        self.missed = missed
        """The labels' descriptions, by label: what the message names."""

    def message(self) -> str:
        """Say which gradients were not captured, and how to capture them."""
        return (
            f"The gradients of {', '.join(self.missed)} were not captured: the "
            "latest pass recorded them (`record(grads=...)`) but ran without "
            "autograd (under `torch.no_grad()` or `torch.inference_mode()`), so "
            "no gradient flows back to them. Run the pass with gradients "
            "enabled, then call `backward()`."
        )

    def __missing__(self, key: object) -> Any:
        """Raise ``KeyError``; for a label not captured, say why."""
        raise KeyError(self.message())


class Records(dict[Any, Any]):
    """The records of one pass, keyed by label, with a helpful ``KeyError``.

    ``rnet.activations["layer3"]`` (a name where a label is expected) or a
    label that was not recorded say what to do instead of a bare
    ``KeyError``. The keys stay labels (the reference contract); the table is
    held weakly, so a kept mapping does not keep the net alive.
    """

    __slots__ = ("_kind", "_table")

    def __init__(self, records: dict[Any, Any], table: LayerTable, kind: str) -> None:
        super().__init__(records)
        self._table = weakref.ref(table)
        self._kind = kind

    def __missing__(self, key: object) -> Any:
        raise KeyError(missing_record(key, self._table(), self._kind)) from None


def missing_record(key: object, table: LayerTable | None, kind: str) -> str:
    """Say why ``rnet.<kind>[key]`` is missing, and what to write instead."""
    where = f"`rnet.{kind}`"
    if table is None:
        return f"{key!r} is not a label recorded in this pass of {where}."
    if isinstance(key, str):
        labels = [row.label for row in table.rows if row.name == key and row.recordable]
        if not labels:
            return (
                f"{where} is keyed by `(depth, idx)` labels, and no module is "
                f"named {key!r}: see `print(rnet)` for the labels and names."
            )
        calls = ", ".join(map(str, labels))
        instead = f"`rnet.{kind}[{labels[0]}]`"
        if kind == "activations":
            instead = (
                f"`rnet.activations_of({key!r})` (every recorded call of it) "
                f"or {instead}"
            )
        return (
            f"{where} is keyed by `(depth, idx)` labels, not names: use "
            f"{instead}; {key!r} is labelled {calls}."
        )
    if isinstance(key, tuple) and key in table:
        record = f"inputs={key!r}" if kind == "inputs" else repr(key)
        return (
            f"Layer {table[key].describe()} has no record in {where} of the "
            f"latest pass: record it with `rnet.record({record})`, then run a pass."
        )
    return f"{key!r} is not a label of this net: see `print(rnet)` for the labels."


_TORCH_MODULE_FILE = os.path.normcase(inspect.getfile(nn.Module))
_PACKAGE_DIR = os.path.normcase(Path(__file__).parent.parent)


def user_stacklevel() -> int:
    """Return the ``stacklevel`` that points a warning at the user's code.

    Counts frames from the caller of this function up to the first one
    outside this package, torch's ``Module.__call__`` machinery and
    torchinfo: a pass run by a summary (a recorder's reference pass,
    ``torchinfo.summary(rnet, ...)``) was asked for by the line that asked
    for the summary, not by torchinfo's own ``model(**x)``.
    """
    torchinfo = sys.modules.get("torchinfo")
    skipped = [_PACKAGE_DIR]
    if torchinfo is not None and torchinfo.__file__:
        skipped.append(os.path.normcase(Path(torchinfo.__file__).parent))
    inside = tuple(skipped)
    level = 1
    frame = sys._getframe(1)  # noqa: SLF001 (the only way to walk the stack)
    while frame is not None:
        filename = os.path.normcase(frame.f_code.co_filename)
        if not filename.startswith(inside) and filename != _TORCH_MODULE_FILE:
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level
