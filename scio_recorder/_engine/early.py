"""Early exit: a pass that stops once every recorded call has happened.

``rnet(x, early_exit=True)`` (and ``collect``, by default, when the kept
layers do not include the net's output) needs only the calls up to the last
recorded one; the layers after it, the unembedding of a language model or
the head of a classifier, are skipped.

Why it is built this way:

* **An exception stops the net.** Nothing else can stop a ``forward``
  written by someone else from the outside. The hook of the last needed call
  raises :class:`EarlyExit` once that call is recorded; the pass that opened
  (:meth:`~.passes.Passes.run`) catches its own, publishes the records and
  returns ``None``. It derives from ``BaseException``, as
  ``KeyboardInterrupt`` does, so that no ``except Exception`` inside the
  net swallows it; and torch runs no ``always_call`` hook for it, so it
  ends exactly like an interrupted pass, through the one clean-up path of
  :meth:`~.passes.Passes.close` (the scopes of other recorders open on the
  net drop their half-made pass at their next root call or when they close).
* **Normal passes pay nothing.** An early-exit pass runs on a twin of the
  plan (:func:`early_plan`: equal content, another object), so every hook
  takes its general path (``state.plan is not hook.plan``) into
  :class:`EarlyExitState`, which counts what is still needed; the hooks'
  fast path, that of every other pass, is unchanged.
* **A pass that stops returns nothing**, so :func:`check_early_exit`
  refuses one that a backward would need (selected gradients, an input
  that requires grad) or that records nothing.
* **The call-plan check holds for the calls that ran.** A call beyond the
  table's count still raises in the hook; every needed call has run when the
  pass stops, by construction; a pass that ends without stopping (a recorded
  call never came) gets the full check, which names the missing calls.
"""

from __future__ import annotations

__all__ = ["EarlyExit", "EarlyExitState", "check_early_exit", "early_plan"]

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._support.tree import iter_tensors
from scio_recorder.layers import label_str

from .state import PassState

if TYPE_CHECKING:
    from torch import nn

    from .plan import CallPlan, Selection

Needs = tuple[list[int], list[int]]
"""Per slot of a plan's ends and starts: the calls a pass needs before it stops."""


def check_early_exit(
    selection: Selection,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    dont_record: bool,
    value: object,
) -> None:
    """Refuse ``early_exit=value`` (truthy) unless ``True`` and it can apply.

    A pass that stops returns no output: it must record something, select no
    gradient, and take no input that requires grad with autograd on (a
    backward would need the output).
    """
    if value is not True:
        msg = f"`early_exit` must be True or False, got {value!r}"
        raise TypeError(msg)
    if dont_record or not (selection.outputs or selection.inputs):
        why = (
            "`dont_record=True` records nothing"
            if dont_record
            else "nothing is recorded"
        )
        msg = (
            "`early_exit=True` stops the pass after the last recorded call, "
            f"and {why}: select layers with `rnet.record(...)`, or drop "
            "`early_exit`."
        )
        raise ValueError(msg)
    if selection.grads:
        grads = ", ".join(map(label_str, selection.grads))
        msg = (
            f"`early_exit=True` returns no output, and the gradients of {grads} "
            "(`record(grads=...)`) need a backward from it: record without "
            "`grads=`, or drop `early_exit`."
        )
        raise ValueError(msg)
    if torch.is_grad_enabled() and any(
        t.requires_grad for t in iter_tensors((args, kwargs))
    ):
        msg = (
            "`early_exit=True` returns no output, and an input requires grad: "
            "its gradient needs a backward from the output. Pass inputs that "
            "do not require grad (`x.detach()`), run under `torch.no_grad()`, "
            "or drop `early_exit`."
        )
        raise ValueError(msg)


class EarlyExit(BaseException):
    """Raised by a hook once an early-exit pass has made every needed call.

    Caught by the pass that opened ``state``; one that reaches the user
    would mean a pass of another recorder let it through.
    """

    def __init__(self, state: EarlyExitState) -> None:
        super().__init__("early exit of a recording pass (caught by the pass)")
        self.state = state


def _needs(plan: CallPlan) -> Needs:
    """Return, per slot, how many calls come before the last recorded one, +1.

    A call counts when its output (or, for starts, its inputs) is recorded;
    calls hooked only to be edited are not waited for (their edits could
    change only what comes after the last record).
    """
    ends = []
    for specs in plan.ends.values():
        last = 0
        for k, spec in enumerate(specs):
            if spec is not None and spec.output and spec.label not in plan.unrecorded:
                last = k + 1
        ends.append(last)
    starts = []
    for labels in plan.starts.values():
        last = 0
        for k, label in enumerate(labels):
            if label is not None and label not in plan.unrecorded:
                last = k + 1
        starts.append(last)
    return ends, starts


def early_plan(plan: CallPlan) -> tuple[CallPlan, Needs]:
    """Return the twin of ``plan`` that early-exit passes run on, and its needs."""
    return dataclasses.replace(plan), _needs(plan)


class EarlyExitState(PassState):
    """The state of a pass that stops after the last recorded call.

    ``plan`` is a twin from :func:`early_plan`; ``pending`` counts the slots
    whose needed calls have not all happened yet.
    """

    exited = False
    """Whether the pass stopped early (then no call-plan check is left to do)."""

    def __init__(  # noqa: PLR0913, PLR0917 (PassState's, and the needs)
        self,
        plan: CallPlan,
        needs: Needs,
        postproc: Any,
        dont_record: bool,  # noqa: FBT001 (PassState's)
        training: bool,  # noqa: FBT001 (PassState's)
        grad_sink: Any = None,
    ) -> None:
        super().__init__(plan, postproc, dont_record, training, grad_sink)
        self.end_needs, self.start_needs = needs
        self.pending = sum(1 for n in (*self.end_needs, *self.start_needs) if n)

    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        """Record a call's inputs; stop if it was the last call needed."""
        result = PassState.on_input(self, module, args, kwargs)
        slot = self.plan.start_slots.get(module)
        if slot is not None and self.starts[slot] == self.start_needs[slot]:
            self.satisfied()
        return result

    def on_output(self, module: nn.Module, output: Any) -> Any:
        """Record a call's output; stop if it was the last call needed."""
        result = PassState.on_output(self, module, output)
        slot = self.plan.end_slots.get(module)
        if slot is not None and self.counts[slot] == self.end_needs[slot]:
            self.satisfied()
        return result

    def satisfied(self) -> None:
        """Count a slot whose needed calls all happened; stop after the last."""
        self.pending -= 1
        if not self.pending:
            self.exited = True
            raise EarlyExit(self)

    def check_counts(self) -> None:
        """Check the call plan, unless the pass stopped early (see the module)."""
        if not self.exited:
            PassState.check_counts(self)
