"""One object runs every pass of a recorder: it opens, publishes and closes.

A :class:`Passes` belongs to one :class:`~scio_recorder.Recorder` and holds
all that ties the recorder to its passes: its token in the registry of open
passes (:data:`.hooks.ACTIVE`), its hooks, the current :class:`~.plan.CallPlan`,
the records of the latest pass, the gradient deposits of compiled passes, the
open scopes. Every kind of pass goes through it, so the life cycle exists
once:

* :meth:`run`: a pass through ``rnet(x)`` (``Recorder.forward``), eager;
* :meth:`run_traced`: the same pass as Dynamo traces it (``torch.compile``,
  ``torch.export``);
* :meth:`open_direct` / :meth:`close_direct`: a pass made by calling the net
  directly while a scope is open (the scope's hooks on the net call them);
* :meth:`listen` / :meth:`unlisten`: a scope registers its listener, which
  receives every completed pass (:meth:`Listener.feed <.state.Listener.feed>`).

Opening a pass registers a fresh :class:`~.state.PassState` under the token
(remembering what was registered before: a scope's listener, or an outer
pass of the same recorder), closing puts back what was there; a pass that
completes is checked against the call plan, then published as the latest
records (and fed to the listener); one that fails clears the latest records.
"""

from __future__ import annotations

__all__ = ["Passes", "is_recorder"]

import contextlib
import warnings
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .compiled import GradDeposits, TracedPass, traced_key, traced_plan
from .hooks import ACTIVE, HookSet, enter_trace, exit_trace, new_token
from .state import (
    CallInputs,
    InPlaceWarning,
    Latest,
    Listener,
    PassState,
    Records,
    user_stacklevel,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from torch import nn

    from scio_recorder.layers import DepthIdx, LayerTable

    from .plan import CallPlan, Postprocessor


class Passes:
    """The passes of one recorder: its plan, hooks and latest records.

    Parameters
    ----------
    owner : object
        The recorder; the hooks are removed when it is collected.
    table : LayerTable
        Its layer table (for messages and record views).
    plan : CallPlan
        The plan to start with (placed at once).
    """

    def __init__(self, owner: object, table: LayerTable, plan: CallPlan) -> None:
        self.token = new_token()
        self.table = table
        self.hooks = HookSet(owner, self.token)
        self.latest = Latest()
        self.deposits = GradDeposits()
        self.listeners: list[Any] = []
        """The scopes open on this recorder (a selection cannot change then)."""
        self.warned: set[tuple[str, DepthIdx]] = set()
        self.plan = plan
        self.traced_key = 0
        self.select(plan)

    # -- the selection -----------------------------------------------------
    def select(self, plan: CallPlan) -> None:
        """Make ``plan`` the plan of the following passes; place its hooks."""
        self.plan = plan
        self.traced_key = traced_key(plan, self.token, self.deposits)
        self.hooks.place(plan)

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Hide this recorder's open pass or scope from the hooks for a while.

        A pass made inside (an execution graph's) is then recorded by no
        scope of this recorder.
        """
        states = ACTIVE.states
        own = states.pop(self.token, None)
        try:
            yield
        finally:
            if own is not None:
                states[self.token] = own

    # -- eager passes ------------------------------------------------------
    def run(
        self,
        net: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        dont_record: bool,  # noqa: FBT001 (positional: called on every pass)
    ) -> Any:
        """Run ``net(*args, **kwargs)`` as one recording pass; return its output."""
        states = ACTIVE.states
        key = self.token
        outer = states.get(key)
        plan = self.plan
        if outer is None and not plan.ends and not plan.starts:  # nothing recorded
            latest = self.latest
            if (
                latest.activations
                or latest.inputs
                or latest.grads
                or latest.traced_grads
            ):
                self.clear()
            return net(*args, **kwargs)
        listener = outer if isinstance(outer, Listener) else None
        state = PassState(
            plan,
            postproc,
            dont_record,
            net.training,
            None if listener is None else listener.grad_sink,
        )
        states[key] = state
        try:
            out = net(*args, **kwargs)
            state.check_counts()
        except BaseException:
            self.clear()
            raise
        finally:
            if outer is None:
                del states[key]
            else:
                states[key] = outer
        self.publish(state)
        if listener is not None:
            listener.feed(state)
        return out

    # -- compiled passes ---------------------------------------------------
    def run_traced(
        self,
        net: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        dont_record: bool,  # noqa: FBT001 (mirrors run)
    ) -> Any:
        """Run the pass as Dynamo traces it (``torch.compile``, ``torch.export``).

        Everything here is traced into the graph: the hooks read the state
        from the trace box instead of the thread-local registry, the call
        plan is checked when the graph is traced, and the records are graph
        outputs that Dynamo stores into the latest records after every call
        (see :mod:`.compiled`).
        """
        if self.listeners:
            msg = (
                "`rnet.scope()` (and `collect`, which uses it) runs eagerly: "
                "its reducers keep Python state that a compiled graph cannot "
                "update. Call the recorder uncompiled inside the scope, or "
                "compile the net and read `rnet.activations` after each call."
            )
            raise RuntimeError(msg)
        latest = self.latest
        # The one guard on the selection (see TracedPlan).
        traced = traced_plan(self.traced_key)
        if not traced.ends and not traced.starts:  # nothing recorded
            latest.activations, latest.inputs, latest.grads = {}, {}, {}
            latest.traced_grads = {}
            return net(*args, **kwargs)
        state = TracedPass(traced, self.plan, postproc, dont_record, net.training)
        enter_trace(state)
        try:
            out = net(*args, **kwargs)
        finally:
            exit_trace(state)
        state.check_counts()
        if state.grad_targets:
            self.deposits.grads = {}  # replaced after every call of the graph
        latest.activations = state.records
        latest.inputs = state.inputs
        latest.grads = {}
        latest.traced_grads = state.grad_targets
        return out

    # -- scopes: listeners and direct passes -------------------------------
    def listen(self, listener: Listener) -> Any:
        """Register ``listener`` for the passes to come; return what it replaced."""
        states = ACTIVE.states
        previous = states.get(self.token)
        states[self.token] = listener
        return previous

    def unlisten(self, listener: Listener, previous: Any) -> None:
        """Undo :meth:`listen` (if ``listener`` is still the one registered)."""
        states = ACTIVE.states
        if states.get(self.token) is listener:
            if previous is None:
                del states[self.token]
            else:
                states[self.token] = previous

    def listening(self, listener: Listener) -> bool:
        """Whether ``listener`` is registered in this thread, no pass open."""
        return ACTIVE.states.get(self.token) is listener

    def open_direct(self, listener: Listener, training: bool) -> PassState:  # noqa: FBT001 (the net's flag)
        """Open a pass of the net called directly, for ``listener``'s scope."""
        state = PassState(self.plan, None, False, training, listener.grad_sink)  # noqa: FBT003 (dont_record)
        ACTIVE.states[self.token] = state
        return state

    def close_direct(
        self,
        listener: Listener,
        state: PassState,
        completed: bool,  # noqa: FBT001 (whether the call returned)
    ) -> bool:
        """Close a direct pass; return whether it completed and was published.

        ``listener`` is registered again. A pass whose call raised is
        dropped; one that completed is checked against the call plan (which
        raises on a mismatch), published and fed to ``listener``.
        """
        states = ACTIVE.states
        if states.get(self.token) is state:
            states[self.token] = listener
        if not completed:
            self.clear()
            return False
        try:
            state.check_counts()
        except BaseException:
            self.clear()
            raise
        self.publish(state)
        listener.feed(state)
        return True

    def is_open(self, state: PassState) -> bool:
        """Whether ``state`` is this thread's open pass of this recorder."""
        return ACTIVE.states.get(self.token) is state

    # -- records -----------------------------------------------------------
    def clear(self) -> None:
        """Forget the latest records (after a failed pass)."""
        latest = self.latest
        latest.activations, latest.inputs, latest.grads = {}, {}, {}
        latest.traced_grads = {}

    def publish(self, state: PassState) -> None:
        """Make ``state``'s records the latest pass's (called after success).

        Then compare the version counter of every recorded tensor with the one
        it had when recorded: a change means an in-place operation overwrote
        the record afterwards.
        """
        latest = self.latest
        latest.activations = state.records
        latest.inputs = state.inputs
        latest.grads = state.grads
        latest.traced_grads = {}
        for label, kind, tensor, version in state.versions:
            if tensor._version != version:  # noqa: SLF001 (version counter)
                self.warn_inplace(label, kind)

    def warn_inplace(self, label: DepthIdx, kind: str) -> None:
        """Warn, once per label and kind, that a record was changed in place."""
        if (kind, label) in self.warned:
            return
        self.warned.add((kind, label))
        row = self.table[label]
        what = "output" if kind == "activations" else "inputs"
        msg = (
            f"The record of layer {row.describe()} was modified in place "
            "after it was recorded (e.g. by a later `inplace=True` "
            f"operation): `rnet.{kind}[{label}]` no longer holds that "
            f"layer's {what}. Use `rnet.record(..., clone=True)` to keep an "
            "exact copy. Shown once per layer and recorder."
        )
        warnings.warn(msg, InPlaceWarning, stacklevel=user_stacklevel())

    def activations(self) -> MappingProxyType[DepthIdx, Any]:
        """Return the latest pass's outputs, read-only (see ``rnet.activations``)."""
        latest = self.latest
        if type(latest.activations) is dict:  # first look at this pass
            latest.activations = Records(latest.activations, self.table, "activations")
        return MappingProxyType(latest.activations)

    def inputs(self) -> MappingProxyType[DepthIdx, CallInputs]:
        """Return the latest pass's inputs, read-only (see ``rnet.inputs``)."""
        latest = self.latest
        if type(latest.inputs) is dict:  # first look at this pass
            latest.inputs = Records(latest.inputs, self.table, "inputs")
        return MappingProxyType(latest.inputs)

    def gradients(self) -> MappingProxyType[DepthIdx, Any]:
        """Return the latest pass's output gradients (see ``rnet.gradients``)."""
        latest = self.latest
        grads = {k: v.value() for k, v in latest.grads.items()}
        if latest.traced_grads:  # the latest pass was a compiled one
            deposits = self.deposits
            for label, target in latest.traced_grads.items():
                grads[label] = deposits.value(target)
        return MappingProxyType(grads)


def is_recorder(module: object) -> bool:
    """Whether ``module`` is a recorder (it holds the passes of one).

    For the modules below :mod:`scio_recorder.recorder`, which cannot import
    it: a net containing a recorder is traced and faked differently.
    """
    return isinstance(getattr(module, "__dict__", {}).get("_passes"), Passes)
