"""The hooks a recorder puts on the modules it records, and how they find a pass.

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
  ``pickle`` and ``copy.deepcopy`` of a recorded net work, also while a
  scope or ``generate`` is open (their hooks on the net are
  :class:`RootHook` objects), and the copy is the plain net (it records
  nothing, carries no open pass, and drops those hooks on its first pass).
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
    "DroppedHook",
    "HookSet",
    "RootHook",
    "drop_copied_hooks",
    "enter_trace",
    "exit_trace",
    "new_token",
]

import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.utils.hooks import RemovableHandle

    from .plan import CallPlan, EndSpec


class _Active(threading.local):
    """Per thread: token of each recorder with a pass or scope open -> state.

    A thread-local dict, mutated in place by ``Recorder.forward`` and scopes
    (each restores what it replaced): cheaper than a ``ContextVar`` on every
    pass, and a forward pass never yields to other code of the same thread.
    """

    def __init__(self) -> None:
        # A PassState, or a Listener (typed Any: the hooks' fast path reads
        # attributes only a PassState has, once `state.plan` told them apart).
        self.states: dict[int, Any] = {}


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
    recorders chain through ``outer``. See :mod:`.compiled`.
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


def _traced_state(token: int) -> Any:
    """Return the traced pass of recorder ``token`` (``None`` if not traced)."""
    state = TRACING.state
    while state is not None and state.token != token:
        state = state.outer
    return state


_DROPPED = -1
"""The token of a hook copied with the net: no recorder has it."""


class _RecorderHook:
    """A hook of one recorder on a user's module: it serves that recorder's passes.

    What is registered on the module is the bound method :meth:`fire` of an
    object of a module-level class: a bound method calls as fast as a plain
    function (a ``__call__`` costs about 60 ns more per call), and unlike a
    closure it can be copied. ``pickle``, ``torch.save`` and
    ``copy.deepcopy`` of the net (which carry the modules' hook dicts) copy
    the object as a :class:`DroppedHook`, whose token no recorder has: the
    copy records nothing, into no recorder, and its hooks remove themselves
    on its first pass (a module carrying hooks keeps fused kernels off).
    """

    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token

    def __reduce__(self) -> tuple[type[DroppedHook], tuple[()]]:
        """Copy (pickle, deep copy) to a hook that does nothing and drops itself."""
        return DroppedHook, ()

    def fire(self, module: nn.Module, *_: Any) -> Any:
        """Serve a call (overridden); here: a copied hook drops itself."""
        if self.token == _DROPPED and not torch.compiler.is_compiling():
            drop_copied_hooks(module, recurse=False)


class _PreHook(_RecorderHook):
    """The forward pre-hook of a module whose inputs are recorded."""

    __slots__ = ()

    def fire(self, module: nn.Module, args: Any, kwargs: Any = None) -> Any:
        """Hand the start of a call to this recorder's pass, if one is open.

        Returns the edited ``(args, kwargs)`` when the pass edits them.
        """
        if TRACING.state is None:  # eager
            state = ACTIVE.states.get(self.token)
        else:  # a compiled pass being traced
            state = _traced_state(self.token)
        if state is not None:
            return state.on_input(module, args, kwargs)
        if self.token == _DROPPED:
            _RecorderHook.fire(self, module)
        return None


class _PostHook(_RecorderHook):
    """The forward hook of one hooked module, made for one plan.

    It counts the module's calls in its slot of the pass's counts and, on
    the common path (the pass's plan is its plan, the call's output is one
    tensor recorded as it is: no postprocessor, no option, no gradient),
    stores the record and its version counter itself, in this one frame: a
    hook runs on every recorded call, and each Python call it saves is a
    good part of what it costs. Anything else goes to :meth:`PassState.end_call
    <scio_recorder._engine.state.PassState.end_call>` (or, for another plan's
    pass, to ``on_output``, which finds the slot itself).
    """

    __slots__ = ("labels", "plain", "plan", "slot", "specs")

    def __init__(
        self, token: int, plan: CallPlan, slot: int, specs: tuple[EndSpec | None, ...]
    ) -> None:
        super().__init__(token)
        self.plan = plan
        self.slot = slot
        self.specs = specs
        self.labels = tuple(None if spec is None else spec.label for spec in specs)
        """The label of each call (``None``: counted, not captured)."""
        self.plain = not plan.options.transforms and all(
            spec is None
            or not (
                spec.grad or spec.label in plan.unrecorded or spec.label in plan.copied
            )
            for spec in specs
        )
        """Whether every call's record is the output itself, with no gradient
        (nor a copy: see :attr:`CallPlan.copied <.plan.CallPlan.copied>`)."""

    def fire(self, module: nn.Module, _args: Any, output: Any) -> Any:  # noqa: PLR0911 (one frame, every path returns early)
        """Count a call of ``module`` and capture what the plan asks of it."""
        if TRACING.state is not None:  # a compiled pass being traced
            traced = _traced_state(self.token)
            return None if traced is None else traced.on_output(module, output)
        state = ACTIVE.states.get(self.token)
        if state is None:
            if self.token == _DROPPED:
                _RecorderHook.fire(self, module)
            return None
        if state.plan is not self.plan:  # another plan's pass, or an idle scope
            return state.on_output(module, output)
        counts, slot = state.counts, self.slot
        k = counts[slot]
        counts[slot] = k + 1
        try:
            label = self.labels[k]
        except IndexError:
            raise state.extra_call(module, k + 1, len(self.labels)) from None
        if label is None:
            return None
        if self.plain and state.plain and type(output) is Tensor:
            state.records[label] = output
            try:
                version = output._version  # noqa: SLF001 (version counter)
            except RuntimeError:  # inference tensors have no version counter
                return None
            state.watched.append(output)
            state.versions.append(version)
            return None
        return state.end_call(module, self.specs[k], output)


class RootHook(_RecorderHook):
    """A hook that a scope or ``generate`` puts on the net for its block.

    It calls ``call`` (a method of :class:`~.passes.RootPasses`, which opens
    and closes the passes of direct calls). Like every hook of a recorder it
    is copied (``pickle``, ``torch.save``, ``copy.deepcopy`` of the net or
    the recorder while the block is open) as a :class:`DroppedHook`: the copy
    carries no open pass, and its first call drops the copied hook.
    """

    __slots__ = ("call",)

    def __init__(self, token: int, call: Callable[..., Any]) -> None:
        super().__init__(token)
        self.call = call

    def fire(self, module: nn.Module, *args: Any) -> Any:
        """Call ``call``; in a copy (see :meth:`_RecorderHook.fire`), drop itself."""
        if self.token == _DROPPED:  # a deep copy keeps this function
            return _RecorderHook.fire(self, module)
        return self.call(module, *args)


class DroppedHook(_PostHook):
    """What a recorder's hook becomes in a pickled or deep-copied net.

    It does nothing, and removes itself from the module on its first call (a
    module carrying hooks keeps fused kernels off), so the copy behaves as the
    plain net. A :class:`Recorder` wrapping such a net removes them at once.
    Loading a net pickled while recorded needs this class, hence
    ``scio_recorder``, importable.
    """

    __slots__ = ()

    def __init__(self) -> None:
        self.token = _DROPPED

    def fire(self, module: nn.Module, *_: Any) -> None:
        """Remove this recorder's copied hooks from ``module``."""
        if not torch.compiler.is_compiling():
            drop_copied_hooks(module, recurse=False)


def drop_copied_hooks(net: nn.Module, *, recurse: bool = True) -> None:
    """Remove every copied recorder hook from ``net``'s modules (or ``net`` only).

    A copied hook is a bound method whose object is a :class:`DroppedHook`
    (``pickle``) or whose token is the dropped one (``copy.deepcopy`` copies
    the object, and keeps the method's function).
    """
    for module in net.modules() if recurse else (net,):
        for hooks, with_kwargs in (
            (module._forward_hooks, module._forward_hooks_with_kwargs),  # noqa: SLF001 (no public API lists hooks)
            (module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs),  # noqa: SLF001
        ):
            for key in [k for k, hook in hooks.items() if _is_dropped(hook)]:
                # torch reads the with-kwargs flag before calling a hook, so
                # removing both while a pass runs the hooks is safe.
                del hooks[key]
                with_kwargs.pop(key, None)
                module._forward_hooks_always_called.pop(key, None)  # noqa: SLF001


def _is_dropped(hook: object) -> bool:
    owner = getattr(hook, "__self__", None)
    return isinstance(owner, _RecorderHook) and owner.token == _DROPPED


def _remove_all(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


class HookSet:
    """The forward hooks of one recorder, removed when it is collected."""

    def __init__(self, owner: object, token: int) -> None:
        self._token = token
        self._pre_hook = _PreHook(token)
        self._handles: list[RemovableHandle] = []
        self._finalizer = weakref.finalize(owner, _remove_all, self._handles)
        self.modules: tuple[nn.Module, ...] = ()

    def place(self, plan: CallPlan) -> None:
        """Put a hook on exactly the modules ``plan`` hooks (and pre-hooks)."""
        _remove_all(self._handles)
        self._handles.extend(
            module.register_forward_pre_hook(self._pre_hook.fire, with_kwargs=True)
            for module in plan.starts
        )
        self._handles.extend(
            module.register_forward_hook(_PostHook(self._token, plan, slot, specs).fire)
            for slot, (module, specs) in enumerate(plan.ends.items())
        )
        self.modules = tuple(dict.fromkeys([*plan.ends, *plan.starts]))

    def add_for(self, plan: CallPlan, *, skip: CallPlan) -> list[RemovableHandle]:
        """Place hooks where ``plan`` has some and ``skip`` none; return them.

        The modules both hook keep ``skip``'s hooks, which serve a pass of
        ``plan`` through its general path (they find their slot in it).
        """
        handles = [
            module.register_forward_pre_hook(self._pre_hook.fire, with_kwargs=True)
            for module in plan.starts
            if module not in skip.starts
        ]
        handles += [
            module.register_forward_hook(_PostHook(self._token, plan, slot, specs).fire)
            for slot, (module, specs) in enumerate(plan.ends.items())
            if module not in skip.ends
        ]
        return handles

    def remove(self) -> None:
        """Remove every hook; safe to call twice."""
        _remove_all(self._handles)
        self.modules = ()

    def __len__(self) -> int:
        """Return the number of hooks in place."""
        return len(self._handles)
