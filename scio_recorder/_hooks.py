"""Forward hooks and the state of one recording pass.

Why it is built this way:

* **Hooks only where needed.** A :class:`HookSet` puts one forward hook on
  each module that has at least one selected call (and a forward pre-hook on
  those whose inputs are captured), and none elsewhere, so unrecorded layers
  run at full speed (and fused kernels such as the ``TransformerEncoderLayer``
  fast path, which torch disables for any module carrying hooks, stay fused).
* **No reference to the recorder.** A hook holds an int token only.
  The state of the pass in progress is found through a thread-local mapping
  from tokens to states, so the recorder can be collected while hooks exist;
  a :func:`weakref.finalize` then removes them.
* **The user's net stays savable.** Hooks are objects of a module-level class
  that pickle and deep-copy to a :class:`DroppedHook`: ``torch.save(net)``,
  ``pickle`` and ``copy.deepcopy`` of a recorded net work, and the copy is
  the plain net (it records nothing, and drops those hooks on its first
  pass).
* **State local to the pass.** A :class:`PassState` lives for one pass. Each
  thread sees its own mapping, so concurrent passes never mix, and a call of
  the net that did not go through the recorder (or an open
  :meth:`Recorder.scope`) finds no state and is ignored.
* **Labels are call ranks.** The k-th call of a module to end in a pass is the
  k-th entry of its plan; the pass checks that every hooked module ran exactly
  as often as in the reference pass, so a label never names the wrong call.
"""

from __future__ import annotations

__all__ = [
    "ACTIVE",
    "TRACING",
    "CallInputs",
    "CallPlan",
    "CallPlanError",
    "DroppedHook",
    "EndSpec",
    "HookSet",
    "PassState",
    "Postprocessor",
    "RecordOptions",
    "convert",
    "drop_copied_hooks",
    "enter_trace",
    "exit_trace",
    "new_token",
    "pick_argument",
]

import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

import torch
from torch import Tensor, nn
from torch.autograd import Variable

from ._tree import iter_tensors, map_leaves, map_tensors

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from .layers import DepthIdx

Postprocessor: TypeAlias = Callable[[Any], Any]
"""``postproc(output) -> replacement output or None``."""


class _Handler(Protocol):
    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> None: ...

    def on_output(self, module: nn.Module, output: Any) -> Any: ...


class _Active(threading.local):
    """Per thread: token of each recorder with a pass or scope open -> state.

    A thread-local dict, mutated in place by ``Recorder.forward`` and scopes
    (each restores what it replaced): cheaper than a ``ContextVar`` on every
    pass, and a forward pass never yields to other code of the same thread.
    """

    def __init__(self) -> None:
        self.states: dict[int, _Handler] = {}


ACTIVE = _Active()
"""This thread's open passes and scopes (see :class:`_Active`)."""

_TOKENS = itertools.count()


def new_token() -> int:
    """Return a token no other recorder has, to find its state in :data:`ACTIVE`.

    An int, not an ``object()``: Dynamo can trace ``ACTIVE.states.get(int)``,
    so a compiled net called directly (not through its recorder) runs its
    hooks inside the graph, finds no pass and records nothing, as in eager
    mode, instead of breaking the graph.
    """
    return next(_TOKENS)


class TraceBox:
    """Holds the states of the compiled passes Dynamo is tracing.

    The hooks of every recorder read :data:`TRACING` first: Dynamo can trace
    that (an attribute of an object made before the frame), not the
    thread-local :data:`ACTIVE`. ``state`` is ``None`` whenever Python runs
    the code for real (Dynamo only pretends to set it while tracing), so
    eager hooks read one attribute and go on to :data:`ACTIVE`. One box serves
    every recorder, read and written only by functions of this module, so
    that Dynamo reaches it through a single source (two paths to one object
    would cost a Python identity guard on every call); states of nested
    recorders chain through ``outer``. See :mod:`._compiled`.
    """

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state: Any = None


TRACING = TraceBox()
"""The compiled passes being traced (see :class:`TraceBox`)."""


def enter_trace(state: Any) -> None:
    """Make ``state`` (with ``token`` and ``outer`` attributes) the innermost."""
    state.outer = TRACING.state
    TRACING.state = state


def exit_trace(state: Any) -> None:
    """Undo :func:`enter_trace` of ``state``."""
    TRACING.state = state.outer


class CallPlanError(RuntimeError):
    """A recorded module was not called as often as in the reference pass.

    Labels name calls by their rank, so when the number of calls differs no
    label can be trusted: the pass keeps no activations.
    """


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
    """What to capture when a call ends: its label, output and/or gradient."""

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
    expected: dict[nn.Module, int] = dataclasses.field(init=False, repr=False)
    """Calls per pass of each hooked module (derived, for a fast check)."""
    expected_starts: dict[nn.Module, int] = dataclasses.field(init=False, repr=False)
    """Call starts per pass of each pre-hooked module (derived)."""

    def __post_init__(self) -> None:
        expected = {module: len(plan) for module, plan in self.ends.items() if plan}
        object.__setattr__(self, "expected", expected)
        starts = {module: len(plan) for module, plan in self.starts.items() if plan}
        object.__setattr__(self, "expected_starts", starts)

    @classmethod
    def empty(cls, reference: str) -> CallPlan:
        """Return the plan that records nothing."""
        return cls({}, {}, {}, RecordOptions(), reference, 0)

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


_NO_STARTS: dict[nn.Module, int] = {}
_NO_INPUTS: dict[DepthIdx, CallInputs] = {}
_NO_GRADS: dict[DepthIdx, GradSlot] = {}


class PassState:
    """Everything that lives for one pass of the net.

    Built on every pass, so only what every pass needs is set in
    ``__init__``; the rest starts as class-level defaults (shared empty dicts
    are replaced, never written, see ``on_input`` and ``watch_grad``).
    """

    post_index = 0
    grad_sink: Callable[[DepthIdx], Callable[[Any], None] | None] | None = None
    starts: dict[nn.Module, int] = _NO_STARTS
    inputs: dict[DepthIdx, CallInputs] = _NO_INPUTS
    grads: dict[DepthIdx, GradSlot] = _NO_GRADS

    def __init__(
        self,
        plan: CallPlan,
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        dont_record: bool,  # noqa: FBT001 (positional: built on every pass)
        training: bool,  # noqa: FBT001 (positional: built on every pass)
        grad_sink: Callable[[DepthIdx], Callable[[Any], None] | None] | None = None,
    ) -> None:
        self.plan = plan
        self.postproc = postproc
        self.dont_record = dont_record
        self.training = training
        if grad_sink is not None:
            self.grad_sink = grad_sink
        self.counts: dict[nn.Module, int] = {}
        self.records: dict[DepthIdx, Any] = {}
        # (label, kind, tensor, version), one per recorded tensor, checked at
        # the end of the pass to detect in-place modifications of records.
        self.versions: list[tuple[DepthIdx, str, Tensor, int]] = []

    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Handle the start of a call of a module whose inputs are captured."""
        plan = self.plan.starts.get(module)
        if plan is None:
            return
        if self.starts is _NO_STARTS:
            self.starts, self.inputs = {}, {}
        k = self.starts.get(module, 0)
        self.starts[module] = k + 1
        if k >= len(plan):
            raise self.extra_call(module, k + 1, len(plan))
        label = plan[k]
        if label is None or self.dont_record:
            return
        options = self.plan.options
        if options.transforms:
            args, kwargs = options.apply(args), options.apply(kwargs)
        record = CallInputs(tuple(args), dict(kwargs))
        self.inputs[label] = record
        if not options.clone:
            versions = self.versions
            for item in (*record.args, *record.kwargs.values()):
                if isinstance(item, Tensor):  # the common case, without a tree walk
                    try:
                        version = item._version  # noqa: SLF001 (version counter)
                    except RuntimeError:  # inference tensors have no version counter
                        continue
                    versions.append((label, "inputs", item, version))
                else:
                    versions += _versions(label, "inputs", item)

    def on_output(self, module: nn.Module, output: Any) -> Any:  # noqa: C901 (the hot path, kept in one frame on purpose)
        """Handle the end of a call of a hooked ``module``; see ``_make_hook``.

        On every recorded call: kept lean (locals, tuple unpacking, the
        single-tensor case inline).
        """
        plan = self.plan
        specs = plan.ends.get(module)
        if specs is None:  # hooked after this pass started
            return None
        counts = self.counts
        k = counts.get(module, 0)
        counts[module] = k + 1
        try:
            spec = specs[k]
        except IndexError:
            raise self.extra_call(module, k + 1, len(specs)) from None
        if spec is None:
            return None
        label, wants_output, wants_grad = spec
        if not wants_output:
            if not self.dont_record:
                self.watch_grad(module, label, output)
            return None
        options = plan.options
        record = None
        if not self.dont_record:
            record = options.apply(output) if options.transforms else output
            self.records[label] = record
        result = None if self.postproc is None else self.postprocess(output)
        if record is not None and not options.clone:
            if isinstance(record, Tensor):
                try:
                    version = record._version  # noqa: SLF001 (version counter)
                except RuntimeError:  # inference tensors have no version counter
                    pass
                else:
                    self.versions.append((label, "activations", record, version))
            else:
                self.versions += _versions(label, "activations", record)
        if wants_grad and not self.dont_record:
            self.watch_grad(module, label, output if result is None else result)
        return result

    def postprocess(self, output: Any) -> Any:
        """Run the next postprocessor on ``output``; return its result."""
        postproc = self.postproc
        if callable(postproc):
            result = postproc(output)
        else:
            assert postproc is not None  # noqa: S101 (checked by the caller)
            if self.post_index >= len(postproc):
                raise ValueError(self.too_few_message(len(postproc)))
            func = postproc[self.post_index]
            self.post_index += 1
            result = func(output)
        if self.versions:  # in-place edits by postprocessors are the user's
            self.versions = [
                (label, kind, t, t._version)  # noqa: SLF001 (version counter)
                for label, kind, t, _ in self.versions
            ]
        return result

    def watch_grad(self, module: nn.Module, label: DepthIdx, output: Any) -> None:
        """Capture the gradient that will flow back into ``output``."""
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
            "(the pass ran under `torch.no_grad()` or `torch.inference_mode()`"
            ", or nothing before it requires grad). Run the pass with "
            "gradients enabled, or record without `grads=`."
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
        counts = self.counts
        plan_ = self.plan
        if counts == plan_.expected and self.starts == plan_.expected_starts:
            return  # the usual case, checked in C
        for module, expected in plan_.expected_starts.items():
            observed = self.starts.get(module, 0)
            if observed != expected and not (self.dont_record and observed < expected):
                raise plan_.mismatch(
                    module,
                    f"{observed} time{'s' if observed != 1 else ''}",
                    expected,
                    training=self.training,
                    grad=torch.is_grad_enabled(),
                )
        for module, plan in self.plan.ends.items():
            observed = counts.get(module, 0)
            expected = len(plan)
            if observed == expected or (self.dont_record and observed < expected):
                continue
            error = self.plan.mismatch(
                module,
                f"{observed} time{'s' if observed != 1 else ''}",
                expected,
                training=self.training,
                grad=torch.is_grad_enabled(),
            )
            missing = sorted(spec.label for spec in plan[observed:] if spec is not None)
            if missing:
                error.args = (f"Missing {missing} activations. {error.args[0]}",)
            raise error


def _versions(
    label: DepthIdx, kind: str, record: Any
) -> list[tuple[DepthIdx, str, Tensor, int]]:
    """Return the version entries of every tensor of ``record``."""
    return [
        (label, kind, tensor, tensor._version)  # noqa: SLF001 (version counter)
        for tensor in iter_tensors(record)
        if not tensor.is_inference()  # inference tensors have no version counter
    ]


def _traced_state(token: int) -> Any:
    """Return the traced pass of recorder ``token`` (``None`` if not traced)."""
    state = TRACING.state
    while state is not None and state.token != token:
        state = state.outer
    return state


class _RecorderHook:
    """A hook of one recorder on a user's module: it serves that recorder's passes.

    An object of a module-level class, not a closure, so that the user's net
    can still be saved while it is recorded: ``pickle``, ``torch.save`` and
    ``copy.deepcopy`` of the net (which carry the modules' hook dicts) turn
    it into a :class:`DroppedHook`, so the copy records nothing, into no
    recorder, and drops those hooks on its first pass.
    """

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token

    def __reduce__(self) -> tuple[type[DroppedHook], tuple[()]]:
        """Copy (pickle, deep copy) to a hook that does nothing and drops itself."""
        return DroppedHook, ()

    def _state(self) -> Any:
        if TRACING.state is None:  # eager
            return ACTIVE.states.get(self.token)
        return _traced_state(self.token)  # a compiled pass being traced


class _PreHook(_RecorderHook):
    __slots__ = ()

    def __call__(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        state = self._state()
        if state is not None:
            state.on_input(module, args, kwargs)


class _PostHook(_RecorderHook):
    __slots__ = ()

    def __call__(self, module: nn.Module, _args: Any, output: Any) -> Any:
        state = self._state()
        if state is None:
            return None
        return state.on_output(module, output)


class DroppedHook:
    """What a recorder's hook becomes in a pickled or deep-copied net.

    It does nothing, and removes itself from the module on its first call (a
    module carrying hooks keeps fused kernels off), so the copy behaves as the
    plain net. A :class:`Recorder` wrapping such a net removes them at once.
    Loading a net pickled while recorded needs this class, hence
    ``scio_recorder``, importable.
    """

    __slots__ = ()

    def __call__(self, module: nn.Module, *_: Any) -> None:
        if not torch.compiler.is_compiling():
            drop_copied_hooks(module, recurse=False)


def drop_copied_hooks(net: nn.Module, *, recurse: bool = True) -> None:
    """Remove every :class:`DroppedHook` from ``net``'s modules (or ``net`` only)."""
    for module in net.modules() if recurse else (net,):
        for hooks, with_kwargs in (
            (module._forward_hooks, module._forward_hooks_with_kwargs),  # noqa: SLF001 (no public API lists hooks)
            (module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs),  # noqa: SLF001
        ):
            for key in [k for k, hook in hooks.items() if type(hook) is DroppedHook]:
                # torch reads the with-kwargs flag before calling a hook, so
                # removing both while a pass runs the hooks is safe.
                del hooks[key]
                with_kwargs.pop(key, None)


def _remove_all(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


class HookSet:
    """The forward hooks of one recorder, removed when it is collected."""

    def __init__(self, owner: object, token: int) -> None:
        self._pre_hook, self._hook = _PreHook(token), _PostHook(token)
        self._handles: list[RemovableHandle] = []
        self._finalizer = weakref.finalize(owner, _remove_all, self._handles)
        self.modules: tuple[nn.Module, ...] = ()

    def place(
        self, modules: Sequence[nn.Module], inputs: Sequence[nn.Module] = ()
    ) -> None:
        """Put hooks on exactly ``modules``, and pre-hooks on ``inputs``."""
        _remove_all(self._handles)
        self._handles.extend(
            module.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
            for module in inputs
        )
        self._handles.extend(
            module.register_forward_hook(self._hook) for module in modules
        )
        self.modules = tuple(dict.fromkeys([*modules, *inputs]))

    def add(self, handle: RemovableHandle) -> None:
        """Keep ``handle`` to remove it with the others."""
        self._handles.append(handle)

    def remove(self) -> None:
        """Remove every hook; safe to call twice."""
        _remove_all(self._handles)
        self.modules = ()

    def __len__(self) -> int:
        """Return the number of hooks in place."""
        return len(self._handles)
