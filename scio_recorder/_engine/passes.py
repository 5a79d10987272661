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
* :meth:`open_direct`: a pass made by calling the net directly while a
  scope is open (the scope's hooks on the net call it);
* :meth:`listen` / :meth:`unlisten`: a scope registers its listener, which
  receives every completed pass (:meth:`Listener.feed <.state.Listener.feed>`);
* :meth:`run_private`: a pass of a tool's own (an OoD detector's), on a plan
  of its own, which changes no selection and publishes nothing: its records
  are returned to the caller, so that threads sharing a recorder never see
  each other's (see the method).

Opening a pass registers a fresh :class:`~.state.PassState` under the token
(remembering what was registered before: a scope's listener, or an outer
pass of the same recorder). Every pass ends in :meth:`Passes.close`, however
it ends (returned, raised, or interrupted by a ``KeyboardInterrupt``, for
which torch runs no ``always_call`` hook: a scope's or ``generate``'s
:class:`RootPasses` then closes it at the next root call or when its block
ends): the registry gets back what it held, a pass that completed is checked
against the call plan, then published as the latest records (and fed to the
listener); one that failed clears the latest records.
"""

from __future__ import annotations

__all__ = ["Passes", "RootPasses", "is_recorder"]

import contextlib
import threading
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from scio_recorder._net.preserve import placed_by_accelerate, unload_offloaded
from scio_recorder._support.errors import CallPlanError, InPlaceWarning

from .compiled import GradDeposits, run_traced, traced_key
from .early import EarlyExit, EarlyExitState, early_plan
from .hooks import ACTIVE, HookSet, RootHook, _PostHook, _PreHook, new_token
from .plan import Edits, RecordOptions, make_plan, with_edits
from .state import (
    CallInputs,
    Gradients,
    GradSlot,
    Latest,
    Listener,
    PassState,
    Records,
    user_stacklevel,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from torch import nn
    from torch.utils.hooks import RemovableHandle
    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx, LayerTable

    from .early import Needs
    from .plan import CallPlan


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
    net : nn.Module
        The net its passes call.
    """

    def __init__(
        self, owner: object, table: LayerTable, plan: CallPlan, net: nn.Module
    ) -> None:
        self.token = new_token()
        self.table = table
        self.net = net
        self.hooks = HookSet(owner, self.token)
        self.latest = Latest()
        self.deposits = GradDeposits()
        self.listeners: list[Any] = []
        """The scopes open on this recorder (a selection cannot change then)."""
        self.warned: set[tuple[str, DepthIdx]] = set()
        self.lock = threading.Lock()
        self.extra_hooks: dict[int, list[Any]] = {}
        """id of an extended plan -> [passes using it, its extra hooks]."""
        self.busy = 0
        """Listeners registered and extended edit plans in use, in all threads."""
        self.idle = True
        """Whether a pass is the net's call and nothing more (:meth:`update_idle`)."""
        self.plan = plan
        self.traced_key = 0
        self.early_cache: tuple[CallPlan, CallPlan, Needs] | None = None
        """The latest plan run with early exit, its twin and needs."""
        self.placed: bool | None = None
        """Whether accelerate placed the net (found at the first stopped pass)."""
        self.private_token = new_token()
        """The token of the private passes (:meth:`run_private`)."""
        self.private_plans: dict[Any, CallPlan] = {}
        self.private_hooks: dict[tuple[nn.Module, str], list[Any]] = {}
        """(module, "pre" | "post") -> [private passes using it, its handle]."""
        self.select(plan)

    # -- the selection -----------------------------------------------------
    def select(self, plan: CallPlan) -> None:
        """Make ``plan`` the plan of the following passes; place its hooks."""
        self.plan = plan
        self.edit_plans: dict[Any, CallPlan] = {}
        self.traced_key = traced_key(plan, self.token, self.deposits)
        self.hooks.place(plan)
        self.update_idle()

    def update_idle(self) -> None:
        """Say whether a plain pass (no option) is just the net's call.

        It is when the plan hooks nothing, the latest records are empty (a
        pass would clear them) and no listener (a scope, ``generate``) nor
        extended edit plan is in use in any thread (a pass would be fed to
        the listener, or counted by the extra hooks). ``Recorder.__call__``
        then calls the net at once. Recomputed wherever one of these
        changes; publishing a pass (:meth:`close`) only clears it.
        """
        plan, latest = self.plan, self.latest
        self.idle = not (
            plan.ends
            or plan.starts
            or self.busy
            or latest.activations
            or latest.inputs
            or latest.grads
            or latest.traced_grads
            or latest.steps
        )

    def add_busy(self, n: int) -> None:
        """Count a listener or an extended edit plan in (+1) or out (-1)."""
        with self.lock:
            self.busy += n
        self.update_idle()

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
    def run(  # noqa: PLR0913, PLR0917 (the options of Recorder.forward)
        self,
        net: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        postproc: Any,
        dont_record: bool,  # noqa: FBT001 (positional: called on every pass)
        edits: Edits | None = None,
        early_exit: bool = False,  # noqa: FBT001, FBT002 (positional, as the others)
        plan: CallPlan | None = None,
    ) -> Any:
        """Run ``net(*args, **kwargs)`` as one recording pass; return its output.

        ``edits`` (``activation_postproc`` or ``input_postproc`` given by
        selector, resolved to labels) replaces ``postproc``; calls that are
        edited but not recorded get hooks for this pass only (the pass then
        runs again through here, on the extended ``plan``). With
        ``early_exit`` the pass stops after the last recorded call and
        returns ``None`` (see :mod:`.early`; the recorder checked that
        something is recorded). One frame for the usual pass: on a small
        net, each Python call is a visible share of a pass.
        """
        states = ACTIVE.states
        outer = states.get(self.token)
        if plan is None:
            plan = self.plan
            if edits is not None:
                with self.editing(edits) as extended:
                    return self.run(
                        net,
                        args,
                        kwargs,
                        edits,
                        dont_record,
                        None,
                        early_exit,
                        extended,
                    )
            if outer is None and not plan.ends and not plan.starts:
                if not self.idle:  # nothing recorded, nothing edited: clear the latest
                    self.clear()
                return net(*args, **kwargs)
        if early_exit:
            listener = outer if isinstance(outer, Listener) else None
            state = self.early_state(
                plan, postproc, dont_record, net.training, listener
            )
        elif outer is None and type(postproc) is not Edits:  # the usual pass
            state = PassState(plan, postproc, dont_record, net.training)
        else:
            listener = outer if isinstance(outer, Listener) else None
            state = self.new_state(plan, postproc, dont_record, net.training, listener)
        states[self.token] = state
        try:
            out = net(*args, **kwargs)
        except EarlyExit as stop:
            if stop.state is not state:  # not this pass's: it fails this pass too
                self.close(state, outer, False, states)  # noqa: FBT003 (completed)
                raise
            self.settle(net)  # the modules it stopped in (accelerate)
            out = None  # every recorded call happened; the rest did not run
        except BaseException:  # KeyboardInterrupt included
            self.close(state, outer, False, states)  # noqa: FBT003 (completed)
            raise
        self.close(state, outer, True, states)  # noqa: FBT003 (completed)
        return out

    def settle(self, net: nn.Module) -> None:
        """Offload again the weights a stopped pass left loaded (accelerate).

        A pass that stops inside an offloaded module skips the ``post_forward``
        of its accelerate hook (:func:`~scio_recorder._net.preserve.unload_offloaded`
        runs it); a net that accelerate did not place costs one look, once.
        """
        if self.placed is None:
            self.placed = placed_by_accelerate(net)
        if self.placed:
            unload_offloaded(net)

    def early_state(
        self,
        plan: CallPlan,
        postproc: Any,
        dont_record: bool,  # noqa: FBT001 (the pass's flag)
        training: bool,  # noqa: FBT001 (the net's flag)
        listener: Listener | None,
    ) -> PassState:
        """Return the state of an early-exit pass (see :mod:`.early`)."""
        cached = self.early_cache
        if cached is None or cached[0] is not plan:
            cached = self.early_cache = (plan, *early_plan(plan))
        _, twin, needs = cached
        return self.new_state(twin, postproc, dont_record, training, listener, needs)

    @staticmethod
    def new_state(  # noqa: PLR0913, PLR0917 (a pass's options)
        plan: CallPlan,
        postproc: Any,
        dont_record: bool,  # noqa: FBT001 (the pass's flag)
        training: bool,  # noqa: FBT001 (the net's flag)
        listener: Listener | None,
        needs: Needs | None = None,
    ) -> PassState:
        """Return the state of a pass; ``postproc`` may be :class:`Edits`.

        With ``needs``, that of an early-exit pass (``plan`` is then a twin
        from :func:`~.early.early_plan`).
        """
        edits = postproc if isinstance(postproc, Edits) else None
        if edits is not None:
            postproc = edits.outputs or None
        grad_sink = None if listener is None else listener.grad_sink
        if needs is None:
            state = PassState(plan, postproc, dont_record, training, grad_sink)
        else:
            state = EarlyExitState(
                plan, needs, postproc, dont_record, training, grad_sink
            )
        if edits is not None and edits.inputs:
            state.input_postproc = edits.inputs
        return state

    @contextlib.contextmanager
    def editing(self, edits: Edits) -> Iterator[CallPlan]:
        """Yield the plan that also hooks the calls ``edits`` edits.

        The current plan when it hooks them all; otherwise a plan extended
        with those calls (kept for the next passes with the same labels),
        whose extra hooks stay in place for the ``with`` block only.
        """
        plan = self.plan
        # `edits.outputs` is a dict by label, or the callable (list, None)
        # of `activation_postproc` given with `input_postproc` alone: that
        # edits recorded calls only, which the plan hooks already.
        outputs = edits.outputs if isinstance(edits.outputs, Mapping) else {}
        key = (frozenset(outputs), frozenset(edits.inputs))
        extended = self.edit_plans.get(key)
        if extended is None:
            extended = with_edits(plan, self.table, *key)
            self.edit_plans[key] = extended
        if extended is plan:
            yield plan
            return
        # Passes of two threads with the same edits share one set of extra
        # hooks (two sets would count each call twice): the first to come
        # places them, the last to leave removes them.
        with self.lock:
            users = self.extra_hooks.get(id(extended))
            if users is None:
                users = self.extra_hooks[id(extended)] = [
                    0,
                    self.hooks.add_for(extended, skip=plan),
                ]
            users[0] += 1
            self.busy += 1
        self.update_idle()
        try:
            yield extended
        finally:
            with self.lock:
                users[0] -= 1
                self.busy -= 1
                if not users[0]:
                    for handle in users[1]:
                        handle.remove()
                    del self.extra_hooks[id(extended)]
            self.update_idle()

    # -- private passes ----------------------------------------------------
    def run_private(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        outputs: Sequence[DepthIdx] = (),
        inputs: Sequence[DepthIdx] = (),
        postproc: Any = None,
    ) -> tuple[Any, PassState]:
        """Run one pass of the net for a tool; return its output and its state.

        The pass records the outputs of ``outputs`` and the inputs of
        ``inputs`` (and ``postproc`` edits recorded outputs, as
        ``activation_postproc`` does: one callable, or a dict by label), on
        a plan of its own: the recorder's selection is not changed, its
        latest records are not replaced, no scope is fed. Its hooks carry a
        token of their own (so the selection's hooks, and a selection
        changed meanwhile, never count its calls), shared by the private
        passes of every thread that need the same module and removed when
        the last one ends. Several threads can so run private passes of one
        recorder, and each gets the records of its own pass: what the OoD
        detectors score from. The call plan is checked as for any pass
        (:class:`CallPlanError`); the records are the state's ``records``
        and ``inputs``.
        """
        key = (tuple(outputs), tuple(inputs))
        plan = self.private_plans.get(key)
        if plan is None:
            table = self.table
            plan = make_plan(
                table,
                [table[label] for label in outputs],
                [table[label] for label in inputs],
                [],
                RecordOptions(),
            )
            self.private_plans[key] = plan
        net = self.net
        state = PassState(plan, postproc, False, net.training)  # noqa: FBT003 (dont_record)
        states = ACTIVE.states
        token = self.private_token
        outer = states.get(token)
        # hidden from this thread's open scope (its hooks on the net would
        # open a pass of theirs), as an execution graph's passes are
        with self.suspended(), self.private_hooked(plan):
            states[token] = state
            try:
                out = net(*args, **kwargs)
            finally:
                if outer is None:
                    del states[token]
                else:
                    states[token] = outer
        state.check_counts()
        watched = state.watched
        if watched and [t._version for t in watched] != state.versions:  # noqa: SLF001
            for label, kind in state.changed():
                self.warn_inplace(label, kind)
        return out, state

    @contextlib.contextmanager
    def private_hooked(self, plan: CallPlan) -> Iterator[None]:
        """Put a private hook on every module ``plan`` hooks, for the block.

        One hook per module (and kind) whatever the number of private
        passes using it, in any thread: two would count each call twice. A
        hook made for one plan serves a pass of another through the general
        path (it finds the module's slot in that pass's plan).
        """
        token = self.private_token
        wanted = [(module, "pre") for module in plan.starts]
        wanted += [(module, "post") for module in plan.ends]
        slots = {module: slot for slot, module in enumerate(plan.ends)}
        with self.lock:
            for key in wanted:
                users = self.private_hooks.get(key)
                if users is None:
                    module, kind = key
                    if kind == "pre":
                        handle = module.register_forward_pre_hook(
                            _PreHook(token).fire, with_kwargs=True
                        )
                    else:
                        hook = _PostHook(token, plan, slots[module], plan.ends[module])
                        handle = module.register_forward_hook(hook.fire)
                    users = self.private_hooks[key] = [0, handle]
                users[0] += 1
        try:
            yield
        finally:
            with self.lock:
                for key in wanted:
                    users = self.private_hooks[key]
                    users[0] -= 1
                    if not users[0]:
                        users[1].remove()
                        del self.private_hooks[key]

    # -- compiled passes ---------------------------------------------------
    def run_traced(
        self,
        net: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        postproc: Any,
        dont_record: bool,  # noqa: FBT001 (mirrors run)
    ) -> Any:
        """Run the pass as Dynamo traces it (``torch.compile``, ``torch.export``).

        Everything here is traced into the graph: the hooks read the state
        from the trace box instead of the thread-local registry, the call
        plan is checked when the graph is traced, and the records are graph
        outputs that Dynamo stores into the latest records after every call
        (see :mod:`.compiled`).
        """
        return run_traced(
            self, net, args, kwargs, postproc=postproc, dont_record=dont_record
        )

    # -- methods that call the net repeatedly (generate) -------------------
    def run_steps(  # noqa: PLR0913, PLR0917 (a pass's options, and the method)
        self,
        net: nn.Module,
        method: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        postproc: Any,
        dont_record: bool,  # noqa: FBT001 (a pass's flag)
        name: str,
    ) -> Any:
        """Call ``method(*args, **kwargs)``, one recording pass per call of ``net``.

        Each root call of the net (a forward step of ``generate``: the
        prefill, then one per decoded token) is a pass, checked against the
        call plan, edited by ``postproc``; the latest records are the last
        step's, :attr:`Latest.steps` every step's outputs. An open scope
        receives every step.
        """
        outer = ACTIVE.states.get(self.token)
        if isinstance(outer, PassState):
            msg = (
                f"`rnet.{name}(...)` was called inside a pass of the same "
                "recorder (from a postprocessor?): call it outside."
            )
            raise RuntimeError(msg)  # noqa: TRY004 (a state, not a type, is wrong)
        steps = _Steps(outer)
        named: list[CallPlanError] = []  # the errors that name their step

        def failed(error: BaseException) -> BaseException:
            if not isinstance(error, CallPlanError) or error in named:
                return error
            named.append(
                CallPlanError(
                    f"In forward step {len(steps.states)} of `rnet.{name}(...)` "
                    "(step 0 is the first call of the net, e.g. the prefill of "
                    f"`generate`, then one per decoded token): {error}"
                )
            )
            return named[-1]

        edits = postproc if isinstance(postproc, Edits) else None
        with contextlib.ExitStack() as stack:
            plan = (
                self.plan if edits is None else stack.enter_context(self.editing(edits))
            )
            stack.enter_context(
                RootPasses(
                    self,
                    net,
                    steps,
                    plan=plan,
                    postproc=postproc,
                    dont_record=dont_record,
                    failed=failed,
                )
            )
            try:
                out = method(*args, **kwargs)
            except CallPlanError as error:  # also one raised during a step
                if error in named:
                    raise
                raise failed(error) from error
        self.latest.steps = [state.records for state in steps.states]
        self.idle = False
        if not steps.states:
            msg = (
                f"`rnet.{name}(...)` never called the net: nothing was recorded "
                "or edited. Call the method that runs the net's forward."
            )
            warnings.warn(msg, UserWarning, stacklevel=user_stacklevel())
        return out

    def records_of(self, kind: str, labels: Sequence[DepthIdx], selector: Any) -> Any:
        """Return the latest records of ``kind`` at ``labels``, or say what to record.

        ``kind`` is ``"activations"``, ``"inputs"`` or ``"gradients"``.
        """
        latest = self.latest
        records: Mapping[DepthIdx, Any] = latest.activations
        if kind == "inputs":
            records = latest.inputs
        elif kind == "gradients":
            records = self.gradient_records()
        missing = [label for label in labels if label not in records]
        if missing and isinstance(records, Gradients):
            raise KeyError(records.message())
        if missing:
            option = {"activations": "", "inputs": "inputs=", "gradients": "grads="}
            msg = (
                f"Labels {missing} were not recorded"
                f"{'' if kind == 'activations' else f' ({kind})'} in the latest pass. "
                f"Record them first: `rnet.record({option[kind]}{selector!r})`."
            )
            raise KeyError(msg)
        return tuple(records[label] for label in labels)

    # -- scopes: listeners and direct passes -------------------------------
    def listen(self, listener: Listener) -> Any:
        """Register ``listener`` for the passes to come; return what it replaced."""
        states = ACTIVE.states
        previous = states.get(self.token)
        states[self.token] = listener
        self.add_busy(1)
        return previous

    def unlisten(self, listener: Listener, previous: Any) -> None:
        """Undo :meth:`listen` (the registry: if ``listener`` is still there)."""
        states = ACTIVE.states
        if states.get(self.token) is listener:
            if previous is None:
                del states[self.token]
            else:
                states[self.token] = previous
        self.add_busy(-1)

    def listening(self, listener: Listener) -> bool:
        """Whether ``listener`` is registered in this thread, no pass open."""
        return ACTIVE.states.get(self.token) is listener

    def open_direct(
        self,
        listener: Listener,
        training: bool,  # noqa: FBT001 (the net's flag)
        plan: CallPlan | None = None,
        postproc: Any = None,
        dont_record: bool = False,  # noqa: FBT001, FBT002 (a pass's flag)
    ) -> PassState:
        """Open a pass of the net called directly, for ``listener``."""
        plan = self.plan if plan is None else plan
        state = self.new_state(plan, postproc, dont_record, training, listener)
        ACTIVE.states[self.token] = state
        return state

    def close(
        self,
        state: PassState,
        outer: Any,
        completed: bool,  # noqa: FBT001 (positional: called on every pass)
        states: dict[int, Any],
    ) -> bool:
        """End the pass ``state``; return whether it completed and was published.

        The one end of every pass (``rnet(x)``, a scope's direct passes, the
        steps of ``generate``), whatever ended it: the registry ``states``
        (this thread's ``ACTIVE.states``) gets back ``outer``, what it held
        when the pass opened (a scope's listener, an outer pass, or nothing).
        A pass that did not complete (its call raised anything,
        ``KeyboardInterrupt`` included) is dropped: the latest records are
        cleared and the listener is told. One that completed is checked
        against the call plan (which raises on a mismatch, dropping it),
        published as the latest records and fed to the listener; then the
        version counter of every record is compared with the one it had
        when recorded: a change means that an in-place operation overwrote
        the record afterwards (a warning).
        """
        if outer is None:
            states.pop(self.token, None)
            listener = None
        else:
            states[self.token] = outer
            listener = outer if isinstance(outer, Listener) else None
        if not completed:
            self.settle(self.net)  # the modules it stopped in (accelerate)
            self.drop(listener)
            return False
        plan = state.plan
        if (
            state.counts != plan.expected_counts
            or state.starts != plan.expected_start_counts
        ):
            try:
                state.check_counts()  # raises, unless the pass exited early
            except BaseException:
                self.drop(listener)
                raise
        latest = self.latest
        latest.activations = state.records
        latest.inputs = state.inputs
        latest.grads = state.grads
        if latest.traced_grads:
            latest.traced_grads = {}
        if latest.steps:
            latest.steps = []
        self.idle = False
        watched = state.watched
        if watched and [t._version for t in watched] != state.versions:  # noqa: SLF001
            for label, kind in state.changed():
                self.warn_inplace(label, kind)
        if listener is not None:
            listener.feed(state)
        return True

    def drop(self, listener: Listener | None) -> None:
        """Forget a pass that failed: clear the latest records, tell ``listener``."""
        self.clear()
        if listener is not None:
            listener.dropped()

    def is_open(self, state: PassState) -> bool:
        """Whether ``state`` is this thread's open pass of this recorder."""
        return ACTIVE.states.get(self.token) is state

    # -- records -----------------------------------------------------------
    def clear(self) -> None:
        """Forget the latest records (after a failed pass)."""
        latest = self.latest
        latest.activations, latest.inputs, latest.grads = {}, {}, {}
        latest.traced_grads = {}
        latest.steps = []
        self.update_idle()

    def warn_inplace(self, label: DepthIdx, kind: str) -> None:
        """Warn, once per label and kind, that a record was changed in place."""
        if (kind, label) in self.warned:
            return
        self.warned.add((kind, label))
        row = self.table[label]
        what = "output" if kind == "activations" else "inputs"
        msg = (
            f"The record of layer {row.describe()} was modified in place "
            "after it was recorded by an in-place operation that the reference "
            "pass did not run (records a later in-place operation overwrites in "
            "the reference pass are copies): "
            f"`rnet.{kind}[{label}]` no longer holds that "
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
        return MappingProxyType(self.gradient_records())

    def gradient_records(self) -> dict[DepthIdx, Any]:
        """Return the latest pass's output gradients, by label.

        Labels whose gradients a pass without autograd did not capture are
        left out, and indexing them says so (:class:`~.state.Gradients`).
        """
        latest = self.latest
        grads = {
            k: v.value() for k, v in latest.grads.items() if isinstance(v, GradSlot)
        }
        if latest.traced_grads:  # the latest pass was a compiled one
            deposits = self.deposits
            for label, target in latest.traced_grads.items():
                grads[label] = deposits.value(target)
        if len(grads) < len(latest.grads):
            table = self.table
            missed = [
                table[label].describe()
                for label, slot in latest.grads.items()
                if not isinstance(slot, GradSlot)
            ]
            return Gradients(grads, missed)
        return grads


class _Steps(Listener):
    """Collects the passes of each forward step; hands them on to a scope."""

    def __init__(self, outer: Any) -> None:
        self.states: list[PassState] = []
        self.outer = outer if isinstance(outer, Listener) else None
        if self.outer is not None:
            self.grad_sink = self.outer.grad_sink

    def feed(self, state: PassState) -> None:
        """Keep a completed step; an open scope receives it too."""
        self.states.append(state)
        if self.outer is not None:
            self.outer.feed(state)

    def dropped(self) -> None:
        """Pass a failed step on to an open scope."""
        if self.outer is not None:
            self.outer.dropped()


class RootPasses:
    """One pass per root call of the net while a ``with`` block is open.

    For passes that go through no ``rnet(x)``: the net called directly in a
    scope, the forward steps of ``generate``. Three hooks on the net delimit
    each pass: a pre-hook (first of all) opens it, a forward hook marks that
    the call returned, a last forward hook with ``always_call=True`` closes
    it (see :meth:`Passes.close`). Only the thread that opened the
    block is recorded, and only while ``listener`` is what the registry
    holds (an explicit ``rnet(x)`` inside runs as usual).

    ``failed`` turns a failed check into the error to raise (a step number,
    for ``generate``).
    """

    def __init__(  # noqa: PLR0913 (a pass's options)
        self,
        passes: Passes,
        net: nn.Module,
        listener: Listener,
        *,
        plan: CallPlan | None = None,
        postproc: Any = None,
        dont_record: bool = False,
        failed: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        self.passes, self.net, self.listener = passes, net, listener
        self.plan, self.postproc, self.dont_record = plan, postproc, dont_record
        self.failed = failed
        self.current: PassState | None = None
        self.completed = False
        self._previous: Any = None
        self._handles: list[RemovableHandle] = []

    def __enter__(self) -> Self:
        """Register the listener and the three hooks on the net."""
        self._previous = self.passes.listen(self.listener)
        net, token = self.net, self.passes.token
        # Copyable hooks: the net can be saved or copied while the block is open.
        self._handles = [
            net.register_forward_pre_hook(
                RootHook(token, self._open).fire, prepend=True
            ),
            net.register_forward_hook(RootHook(token, self._mark_completed).fire),
            net.register_forward_hook(
                RootHook(token, self._close).fire, always_call=True
            ),
        ]
        return self

    def __exit__(self, *_: object) -> None:
        """Drop a pass left open; remove the hooks; put back what the registry held."""
        self._drop_stale()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.passes.unlisten(self.listener, self._previous)
        self._previous = None

    def _drop_stale(self) -> None:
        """Drop this thread's pass that a ``BaseException`` left open.

        torch runs ``always_call`` hooks after an ``Exception`` only: after
        a ``KeyboardInterrupt`` (or ``SystemExit``) raised inside the net,
        :meth:`_close` never ran, and the pass would stay registered, seen
        by every later call of a hooked module. It is dropped (as any failed
        pass, by :meth:`Passes.close`) when the next root call opens, and
        when the block closes. A pass open in another thread is not this
        thread's to drop.
        """
        current = self.current
        if current is not None and self.passes.is_open(current):
            self.current = None
            self.passes.close(current, self.listener, False, ACTIVE.states)  # noqa: FBT003 (completed)

    def _open(self, module: nn.Module, _args: Any) -> None:
        passes, listener = self.passes, self.listener
        # A net calling itself at the root is not supported: its inner call
        # drops the pass of the outer one and opens its own, whose call-plan
        # check then fails, loudly.
        self._drop_stale()
        if not passes.listening(listener):  # an explicit pass, or another thread
            return
        self.current = passes.open_direct(
            listener, module.training, self.plan, self.postproc, self.dont_record
        )
        self.completed = False

    def _mark_completed(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        if self.current is not None:
            self.completed = True

    def _close(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        current, passes = self.current, self.passes
        if current is None or not passes.is_open(current):
            return
        completed = self.completed
        self.current, self.completed = None, False
        try:
            passes.close(current, self.listener, completed, ACTIVE.states)
        except BaseException as error:
            if self.failed is None:
                raise
            raise self.failed(error) from error


def is_recorder(module: object) -> bool:
    """Whether ``module`` is a recorder (it holds the passes of one).

    For the modules below :mod:`scio_recorder.recorder`, which cannot import
    it: a net containing a recorder is traced and faked differently.
    """
    return isinstance(getattr(module, "__dict__", {}).get("_passes"), Passes)
