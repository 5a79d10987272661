"""Recording inside graphs that ``torch.compile`` traces or ``torch.export`` exports.

Why it is built this way:

* **The pass state is found without the thread-local registry.** Dynamo
  cannot trace the pass registry of eager mode as it is used there. While a
  compiled pass is traced, :func:`run_traced` puts a :class:`TracedPass`
  into :data:`.hooks.TRACING`, which the hooks read first. Dynamo sees an
  attribute of an object that exists before the frame, so the hooks inline
  into the graph and leave only tensor operations behind. The records are
  graph outputs, which Dynamo stores into ``rnet``'s latest records after
  every call.
* **Few guards.** Guards run on every call of a compiled graph. The selection
  reaches the graph as one constant, :class:`TracedPlan` (through
  :func:`traced_plan`, which Dynamo runs when tracing), guarded by the
  recorder's int ``traced_key``; hooks look modules up by ``id``. An equal
  selection gets the same key, so it finds its graph again. The trace reads
  nothing else of the recorder's state when it succeeds (the plan and the
  net's mode word the errors), and enters the pass without going through
  ``_call_impl`` and ``Recorder.forward`` when they would only pass the call
  on (:func:`entry_point`).
* **No import of Dynamo.** Nothing here imports ``torch._dynamo`` (seconds):
  ``torch.compile`` loads it, and only a compiled net needs it.
* **Checks happen when the graph is traced.** A compiled graph fixes the
  sequence of module calls, and Dynamo guards on what could change it (the
  mode, grad mode, the hooks, the selection's key). Checking the call plan
  once per trace is therefore checking it for every call the graph serves.
  A mismatch raises :class:`~scio_recorder.CallPlanError` while tracing.
* **Gradients travel through the autograd graph.** A tensor hook cannot write
  into Python state from inside a compiled backward graph. Instead the output
  of a layer whose gradient is recorded goes through :class:`_GradProbe`, an
  identity whose backward hands the incoming gradient to the opaque custom
  operator ``scio_recorder::deposit_grad``. That operator runs as Python when
  the backward runs, and files a copy of the gradient under the address of the
  output it belongs to, in the recorder's :class:`GradDeposits` (a fresh dict
  per pass), so two passes followed by one backward keep their gradients
  apart, as in eager mode.
"""

from __future__ import annotations

__all__ = [
    "GradDeposits",
    "TracedPass",
    "TracedPlan",
    "entry_point",
    "export_records",
    "run_traced",
    "traced_key",
    "traced_plan",
    "unwrap_compiled",
]

import inspect
import itertools
import sys
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module_impl

from scio_recorder._net.preserve import preserved
from scio_recorder._support.tree import iter_tensors, map_tensors
from scio_recorder.layers import label_str

from .hooks import enter_trace, exit_trace
from .plan import EndSpec, convert
from .state import CallInputs, PassState

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scio_recorder._support.errors import CallPlanError
    from scio_recorder.layers import DepthIdx

    from .plan import CallPlan, Postprocessor


Address = tuple[int, torch.device, tuple[int, ...], tuple[int, ...]]


def _address(tensor: Tensor) -> Address:
    """Where a tensor's elements are; the same for every alias of one output."""
    return (tensor.data_ptr(), tensor.device, tuple(tensor.shape), tensor.stride())


class GradDeposits:
    """The gradients that compiled backward passes delivered, by output address.

    One per recorder. Every compiled pass replaces :attr:`grads` with an
    empty dict, so a gradient filed before the latest pass never shows as
    one of its gradients, even when an output reuses the memory of an older
    one.
    """

    __slots__ = ("__weakref__", "grads", "key")

    _count = itertools.count()

    def __init__(self) -> None:
        self.grads: dict[Address, Tensor] = {}
        self.key = next(self._count)
        _DEPOSITS[self.key] = self

    def value(self, target: Any) -> Any:
        """Return the gradients of the tensors of ``target`` (``None`` if none came)."""
        grads = self.grads
        return map_tensors(lambda tensor: grads.get(_address(tensor)), target)


_DEPOSITS: weakref.WeakValueDictionary[int, GradDeposits] = (
    weakref.WeakValueDictionary()
)


def _deposit_grad(grad: Tensor, output: Tensor, key: int) -> Tensor:
    """File a copy of ``grad``, the gradient of ``output``; return another copy.

    Both are copies: the compiled backward graph may reuse the memory of its
    own buffers once they are dead, and a custom operator's result must not
    alias its inputs.
    """
    deposits = _DEPOSITS.get(key)
    if deposits is not None:
        deposits.grads[_address(output)] = grad.detach().clone()
    return grad.clone()


def _deposit_grad_fake(grad: Tensor, output: Tensor, key: int) -> Tensor:  # noqa: ARG001 (the signature)
    return torch.empty_like(grad)


# `torch.library.custom_op` came with torch 2.4; on 2.3 the package still
# imports, and only gradients inside a compiled graph are refused.
HAS_DEPOSIT_OP = hasattr(torch.library, "custom_op")
if HAS_DEPOSIT_OP:
    torch.library.custom_op("scio_recorder::deposit_grad", mutates_args=())(
        _deposit_grad
    ).register_fake(_deposit_grad_fake)


class _GradProbe(torch.autograd.Function):
    """Identity whose backward files the gradient (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, key: int) -> Tensor:
        ctx.save_for_backward(tensor)
        ctx.key = key
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (tensor,) = ctx.saved_tensors
        return torch.ops.scio_recorder.deposit_grad(grad, tensor, ctx.key), None


class TracedPlan(NamedTuple):
    """What a traced pass needs of a recorder's plan, as constants.

    Read in the graph through :func:`traced_plan`, which Dynamo runs when it
    traces and takes as a constant, so that the only guard on the whole
    selection is the equality of the recorder's int ``_traced_key`` (guards
    are evaluated on every call: on a batch-1 MLP the guards on the plan's
    dicts, tuples and options cost more than its kernels' launch).
    """

    token: int
    ends: tuple[tuple[int, tuple[tuple[DepthIdx, bool, bool] | None, ...]], ...]
    """``CallPlan.ends`` as ``(id(module), specs)`` pairs, each spec a plain tuple.

    Plain tuples, not :class:`EndSpec`: Dynamo of torch 2.11 cannot unpack a
    named tuple read from this plan (``InternalTorchDynamoError:
    NotImplementedError`` in its ``iter`` polyfill, seen on CUDA).
    """
    starts: tuple[tuple[int, tuple[DepthIdx | None, ...]], ...]
    """``CallPlan.starts`` as ``(id(module), labels)`` pairs."""
    options: tuple[bool, bool, torch.device | None, torch.dtype | None] | None
    """``(clone, detach, device, dtype)``, ``None`` when records are the tensors."""
    deposit_key: int
    copied: tuple[DepthIdx, ...] = ()
    """``CallPlan.copied``: outputs recorded as copies (a tuple: a constant)."""
    copied_inputs: tuple[DepthIdx, ...] = ()
    """``CallPlan.copied_inputs``."""


def _plain(
    specs: tuple[EndSpec | None, ...],
) -> tuple[tuple[DepthIdx, bool, bool] | None, ...]:
    """Return ``specs`` as plain tuples (see :attr:`TracedPlan.ends`)."""
    return tuple(None if s is None else (s.label, s.output, s.grad) for s in specs)


_TRACED_PLANS: list[TracedPlan] = []
_TRACED_KEYS: dict[TracedPlan, int] = {}
_TRACED_LOCK = threading.Lock()


def traced_key(plan: CallPlan, token: int, deposits: GradDeposits) -> int:
    """Return the int that names ``plan`` of recorder ``token`` in compiled passes.

    The same plan gets the same key, so that a selection that comes back
    finds its compiled graph again.
    """
    content = TracedPlan(
        token,
        tuple((id(m), _plain(specs)) for m, specs in plan.ends.items()),
        tuple((id(m), labels) for m, labels in plan.starts.items()),
        plan.options.as_tuple() if plan.options.transforms else None,
        deposits.key,
        tuple(sorted(plan.copied)),
        tuple(sorted(plan.copied_inputs)),
    )
    with _TRACED_LOCK:  # two threads must not give two plans one key
        key = _TRACED_KEYS.get(content)
        if key is None:
            key = _TRACED_KEYS[content] = len(_TRACED_PLANS)
            _TRACED_PLANS.append(content)
    return key


def _traced_plan(key: int) -> TracedPlan:
    """Return the plan named ``key`` (a Dynamo constant: see :class:`TracedPlan`)."""
    return _TRACED_PLANS[key]


# What `torch.compiler.assume_constant_result` does, without the import of
# `torch._dynamo` it makes (a second or more: half the package's import time
# otherwise). `tests/test_compile.py` checks that the decorator marks a
# function the same way, and that a selection coming back finds its graph.
_traced_plan._dynamo_marked_constant = True  # type: ignore[attr-defined]  # noqa: SLF001 (Dynamo's mark)
traced_plan: Callable[[int], TracedPlan] = _traced_plan
"""Dynamo calls it when tracing and takes the result as a constant, unguarded."""


class TracedPass(PassState):
    """The state of one pass traced by Dynamo (or run by non-strict export).

    The same plan and the same checks as :class:`~.state.PassState`, without
    what cannot live in a graph: version counters (in-place changes are left
    to functionalization, see the docs) and tensor hooks (gradients go through
    :class:`_GradProbe`).

    Every object the trace reads costs a guard on every call of the graph,
    so the success path reads only the constant :class:`TracedPlan` and what
    it is given; the recorder's :class:`~.plan.CallPlan` and the net's mode
    are read on failure only, to word the error (``passes.plan``,
    ``net.training``). ``PassState.__init__`` is not called: it reads the
    plan.
    """

    def __init__(
        self,
        traced: TracedPlan,
        passes: Any,
        net: nn.Module,
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        dont_record: bool,  # noqa: FBT001 (mirrors PassState)
    ) -> None:
        self.passes = passes
        self.net = net
        self.postproc = postproc
        self.dont_record = dont_record
        self.watched = []  # `postprocess` refreshes their versions: none here
        self.records = {}
        self.token = traced.token
        self.options = traced.options
        self.deposit_key = traced.deposit_key
        self.copied = traced.copied
        self.copied_inputs = traced.copied_inputs
        # Comprehensions: Dynamo traces `dict(pairs)` through a polyfill,
        # whose globals are then guarded on every call.
        self.ends = {key: specs for key, specs in traced.ends}  # noqa: C416
        self.starts_plan = {key: labels for key, labels in traced.starts}  # noqa: C416
        self.outer: TracedPass | None = None  # see hooks.enter_trace
        self.inputs = {}
        self.grad_targets: dict[DepthIdx, Any] = {}
        # Calls so far, by id(module).
        self.end_counts: dict[int, int] = {}
        self.start_counts: dict[int, int] = {}

    def _for_errors(self) -> None:
        """Read what error messages need (see the class docstring)."""
        self.plan = self.passes.plan
        self.training = self.net.training

    def extra_call(self, module: nn.Module, calls: int, expected: int) -> CallPlanError:
        """Return the error for the ``calls``-th call of ``module`` (one too many)."""
        self._for_errors()
        return super().extra_call(module, calls, expected)

    def no_grad_message(self, module: nn.Module, label: DepthIdx) -> str:
        """Return the error message for a gradient that cannot flow back."""
        self._for_errors()
        return super().no_grad_message(module, label)

    def too_few_message(self, given: int) -> str:
        """Return the error message for a postprocessor list that is too short."""
        self._for_errors()
        return super().too_few_message(given)

    def check_counts(self) -> None:
        """Raise :class:`CallPlanError` unless every hooked module ran as planned.

        Checked when the graph is traced: the counts are those of the traced
        call sequence, which the graph's guards keep fixed.
        """
        fewer_ok = self.dont_record
        for counts, planned in (
            (self.end_counts, self.ends),
            (self.start_counts, self.starts_plan),
        ):
            for key, calls in planned.items():
                observed = counts.get(key, 0)
                if observed != len(calls) and not (fewer_ok and observed < len(calls)):
                    self.raise_mismatch()

    def raise_mismatch(self) -> None:
        """Raise the eager pass's error for these counts (on failure only)."""
        self._for_errors()
        plan = self.plan
        self.counts = [self.end_counts.get(id(m), 0) for m in plan.end_slots]
        self.starts = [self.start_counts.get(id(m), 0) for m in plan.start_slots]
        super().check_counts()

    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Handle the start of a call of a module whose inputs are captured."""
        key = id(module)
        plan = self.starts_plan.get(key)
        if plan is None:
            return
        k = self.start_counts.get(key, 0)
        self.start_counts[key] = k + 1
        if k >= len(plan):
            raise self.extra_call(module, k + 1, len(plan))
        label = plan[k]
        if label is None or self.dont_record:
            return
        copy = label in self.copied_inputs
        self.inputs[label] = CallInputs(
            tuple(self.apply(args, copy=copy)), dict(self.apply(kwargs, copy=copy))
        )

    def on_output(self, module: nn.Module, output: Any) -> Any:
        """Handle the end of a call of a hooked ``module``."""
        key = id(module)
        specs = self.ends.get(key)
        if specs is None:
            return None
        k = self.end_counts.get(key, 0)
        self.end_counts[key] = k + 1
        if k >= len(specs):
            raise self.extra_call(module, k + 1, len(specs))
        spec = specs[k]
        if spec is None:
            return None
        label, wants_output, wants_grad = spec
        result = None
        if wants_output:
            copy = label in self.copied  # taken after the postprocessor, as eager
            if not self.dont_record and not copy:
                self.records[label] = self.apply(output)
            if self.postproc is not None:
                result = self.postprocess(label, output)
            if not self.dont_record and copy:
                self.records[label] = self.apply(output, copy=True)
        if wants_grad and not self.dont_record and torch.is_grad_enabled():
            if not HAS_DEPOSIT_OP:
                msg = (
                    "Recording gradients inside a compiled graph needs torch >= "
                    "2.4 (`torch.library.custom_op`). Record them with the "
                    "uncompiled recorder, or upgrade torch."
                )
                raise RuntimeError(msg)
            passed_on = output if result is None else result
            self.check_grad(module, label, passed_on)
            key = self.deposit_key
            result = map_tensors(lambda t: _GradProbe.apply(t, key), passed_on)  # type: ignore[no-untyped-call]
            self.grad_targets[label] = result
        return result

    def apply(self, value: Any, *, copy: bool = False) -> Any:
        """Return the record of ``value`` (see :class:`~.plan.RecordOptions`).

        ``copy``: a copy whatever the options (a record that a later in-place
        operation overwrites, see ``CallPlan.copied``).
        """
        options = self.options
        if options is None and not copy:
            return value
        clone, detach, device, dtype = options or (False, False, None, None)
        clone = clone or copy
        return map_tensors(
            lambda tensor: convert(tensor, clone, detach, device, dtype), value
        )

    def check_grad(self, module: nn.Module, label: DepthIdx, output: Any) -> None:
        """Raise unless a gradient can flow back into ``output``."""
        if not any(tensor.requires_grad for tensor in iter_tensors(output)):
            raise RuntimeError(self.no_grad_message(module, label))


def run_traced(  # noqa: PLR0913 (the pass's options)
    passes: Any,
    net: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    postproc: Any,
    dont_record: bool,
) -> Any:
    """Run the pass of ``passes`` (a recorder's ``Passes``) as Dynamo traces it.

    Everything here is traced into the graph: the hooks read the state from
    the trace box instead of the thread-local registry, the call plan is
    checked when the graph is traced, and the records are graph outputs that
    Dynamo stores into the latest records after every call (see the module
    docstring).
    """
    if passes.listeners:
        msg = (
            "`rnet.scope()` (and `collect`, which uses it) runs eagerly: "
            "its reducers keep Python state that a compiled graph cannot "
            "update. Call the recorder uncompiled inside the scope, or "
            "compile the net and read `rnet.activations` after each call."
        )
        raise RuntimeError(msg)
    latest = passes.latest
    # The one guard on the selection (see TracedPlan).
    traced = traced_plan(passes.traced_key)
    if not traced.ends and not traced.starts:  # nothing recorded
        latest.activations, latest.inputs, latest.grads = {}, {}, {}
        latest.traced_grads = {}
        return net(*args, **kwargs)
    state = TracedPass(traced, passes, net, postproc, dont_record)
    enter_trace(state)
    try:
        out = net(*args, **kwargs)
    finally:
        exit_trace(state)
    state.check_counts()
    if state.grad_targets:
        passes.deposits.grads = {}  # replaced after every call of the graph
    latest.activations = state.records
    latest.inputs = state.inputs
    latest.grads = {}
    latest.traced_grads = state.grad_targets
    return out


def entry_point(recorder: nn.Module, token: int) -> Callable[..., Any]:
    """Return the function through which Dynamo enters ``recorder``'s pass.

    Dynamo caches compiled graphs per code object, at most
    ``torch._dynamo.config.recompile_limit`` (8) per code object. Entered
    through ``Recorder.__call__``, every recorder of a process would share
    one code object, and the ninth compiled recorder would fail. This
    function gets a code object of its own, so the limit counts the
    selections of one recorder. It is the recorder's ``__call__`` attribute,
    which ``torch.compile(rnet)`` compiles, and what ``Recorder(torch.compile
    (net))`` compiles. It holds the recorder weakly: the recorder keeps it.

    Like the fast path of ``Recorder.__call__``, when Dynamo traces a call
    without keyword arguments of a recorder that has no hook of its own (and
    no global module hook) and no ``forward`` of a subclass, it runs the
    pass directly: ``nn.Module._call_impl`` and ``Recorder.forward`` would
    only pass the call on, and what Dynamo reads through them (the method
    lookups, ``forward``'s default options) is guarded on every call of the
    graph. Anything else goes through them.
    """
    ref = weakref.ref(recorder)
    compiling = torch.compiler.is_compiling  # a local: fewer, cheaper guards
    global_hooks = _GLOBAL_HOOKS

    def call(*args: Any, **kwargs: Any) -> Any:
        target: Any = ref()
        if target is None:
            msg = "This recorder no longer exists."
            raise ReferenceError(msg)
        if (
            kwargs
            or not compiling()
            or target._own_forward  # noqa: SLF001 (the recorder's, as below)
            or target._forward_hooks  # noqa: SLF001 (as `_call_impl` reads them)
            or target._forward_pre_hooks  # noqa: SLF001
            or target._backward_hooks  # noqa: SLF001
            or target._backward_pre_hooks  # noqa: SLF001
            or global_hooks[0]
            or global_hooks[1]
            or global_hooks[2]
            or global_hooks[3]
        ):
            return target._call_impl(*args, **kwargs)  # noqa: SLF001 (as nn.Module)
        # Read through `ref()`, not kept in the closure: Dynamo reads
        # `traced_key` of a closure's object lazily, and cannot then pass it
        # to `traced_plan`.
        return run_traced(
            target._passes,  # noqa: SLF001 (the recorder's own)
            target._net_direct,  # noqa: SLF001 (the recorder's own)
            args,
            kwargs,
            postproc=None,
            dont_record=False,
        )

    name = f"recorder_{token}_call"
    code = call.__code__.replace(co_name=name)  # a new code object
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=name)
    call.__code__ = code
    call.__name__ = call.__qualname__ = name
    return call


_GLOBAL_HOOKS = (
    _module_impl._global_forward_pre_hooks,  # noqa: SLF001 (what torch checks)
    _module_impl._global_forward_hooks,  # noqa: SLF001 (what torch checks)
    _module_impl._global_backward_pre_hooks,  # noqa: SLF001 (what torch checks)
    _module_impl._global_backward_hooks,  # noqa: SLF001 (what torch checks)
)


def unwrap_compiled(net: nn.Module) -> tuple[nn.Module, Callable[[Any], Any] | None]:
    """Split ``torch.compile(net)`` into ``net`` and the compiler it was given.

    A recorder of a compiled net records the net itself (its labels are the
    ones of the uncompiled net; the compiled wrapper adds no layer) and
    compiles its own pass with the same settings: hooks inside a graph that
    the recorder does not trace could not reach the recorder's pass. Returns
    ``(net, None)`` for a net that is not compiled.
    """
    # Read from `sys.modules`: `torch._dynamo` is loaded by `torch.compile`,
    # and without it no net is compiled (importing it costs seconds).
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    if optimized is None or not isinstance(net, optimized):
        return net, None
    compiler = getattr(net, "dynamo_ctx", None)
    inner = getattr(net, "_orig_mod", None)
    if compiler is None or not isinstance(inner, nn.Module):
        msg = (
            "This version of torch hides how a compiled module was compiled, "
            "so its recorder cannot compile its pass the same way. Wrap the "
            "net first and compile the recorder: "
            "`rnet = torch.compile(Recorder(net, ...))`."
        )
        raise TypeError(msg)
    return inner, compiler


class _ExportRoot(nn.Module):
    """The module ``torch.export`` exports: the pass, with records as outputs."""

    def __init__(
        self,
        recorder: nn.Module,
        postproc: Postprocessor | Sequence[Postprocessor] | None,
    ) -> None:
        super().__init__()
        self.recorder = recorder
        self.postproc = postproc

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        recorder: Any = self.recorder
        if self.postproc is not None:
            kwargs = {**kwargs, "activation_postproc": self.postproc}
        out = recorder(*args, **kwargs)
        activations = {label_str(k): v for k, v in recorder.activations.items()}
        if not recorder.selection.inputs:
            return out, activations
        inputs = {label_str(k): v for k, v in recorder.inputs.items()}
        return out, activations, inputs


def _positional(
    net: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any
) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """Bind the example inputs to the net's signature, as positional arguments.

    The exported module takes ``*args, **kwargs``, for which ``torch.export``
    accepts dynamic shapes of positional arguments only; ``dynamic_shapes``
    (by name or position, as for the net) is translated to match.
    """
    try:
        bound = inspect.signature(net.forward).bind(*args, **kwargs)
    except TypeError as error:
        msg = f"The example inputs do not fit the net's forward: {error}."
        raise TypeError(msg) from None
    names = list(bound.arguments)[: len(bound.args)]
    if dynamic_shapes is None:
        return bound.args, bound.kwargs, None
    if isinstance(dynamic_shapes, dict):
        unknown = set(dynamic_shapes) - set(bound.arguments)
        keyword_only = set(dynamic_shapes) & set(bound.kwargs)
        if unknown or keyword_only:
            msg = (
                f"`dynamic_shapes` names {sorted(unknown | keyword_only)}, which "
                "are not positional arguments of the net's forward given in the "
                f"example inputs ({', '.join(names)})."
            )
            raise ValueError(msg)
        specs = tuple(dynamic_shapes.get(name) for name in names)
    else:
        specs = tuple(dynamic_shapes)
        if any(spec is not None for spec in specs[len(names) :]):
            msg = (
                f"`dynamic_shapes` has {len(specs)} entries, but the example "
                f"inputs give {len(names)} positional arguments "
                f"({', '.join(names)}); keyword-only arguments cannot be dynamic."
            )
            raise ValueError(msg)
        specs = specs[: len(names)] + (None,) * (len(names) - len(specs))
    return bound.args, bound.kwargs, (specs,)


def export_records(  # noqa: PLR0913 (the options of torch.export.export)
    recorder: nn.Module,
    net: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    grads: Sequence[DepthIdx],
    postproc: Postprocessor | Sequence[Postprocessor] | None,
    strict: bool,
    dynamic_shapes: Any,
) -> torch.export.ExportedProgram:
    """Export ``recorder``'s pass; see :meth:`Recorder.export`.

    Refused when gradients are selected (``grads``): a program has no backward.
    """
    if grads:
        msg = (
            f"Cannot export the gradients of {', '.join(map(label_str, grads))}: "
            "an exported program runs the forward pass only. Select without "
            "`grads=` to export, and record gradients with the eager or "
            "compiled recorder."
        )
        raise ValueError(msg)
    args, kwargs, dynamic_shapes = _positional(net, args, kwargs, dynamic_shapes)
    root = _ExportRoot(recorder, postproc)
    with preserved(recorder, writes=False), warnings.catch_warnings():
        # Strict export lists the records it stores as "side effects".
        warnings.filterwarnings(
            "ignore", message="While compiling, we found certain side effects"
        )
        return torch.export.export(
            root, args, kwargs, strict=strict, dynamic_shapes=dynamic_shapes
        )
