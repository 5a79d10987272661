"""Scopes: accumulate the records of many passes, reduced on the fly.

``with rnet.scope(reduce) as scope:`` records every pass of the net made in
the block, whether it goes through the recorder (``rnet(x)``) or calls the net
directly (``net(x)``, the way MMRazor's and torchfunc's recorders are used),
and feeds each pass's records to one reducer per label.

Why it is built this way: a pass made directly through the net has no
``Recorder.forward`` around it to set up and check its state. While a scope is
open, the net itself carries three hooks that delimit such passes: a
pre-hook (first of all pre-hooks) opens a :class:`~._hooks.PassState`, a
forward hook marks that the call completed, and a last forward hook with
``always_call=True`` closes it, checking the call plan when the call completed
and discarding the partial pass when it raised. Leaving the block removes the
three hooks, also after an exception. Passes are found through the same
thread-local mapping as explicit passes, so only the thread that opened the
scope is recorded.
"""

from __future__ import annotations

__all__ = ["Scope", "ScopeState"]

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from ._hooks import ACTIVE, PassState

if TYPE_CHECKING:
    from types import TracebackType

    from torch.utils.hooks import RemovableHandle
    from typing_extensions import Self

    from .layers import DepthIdx
    from .recorder import Recorder
    from .reduce import Reducer
    from .select import Selector


class ScopeState:
    """The handler of a recorder with an open scope and no explicit pass."""

    __slots__ = ("completed", "current", "scope")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.current: PassState | None = None
        self.completed = False

    def on_input(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        """Forward a call start to the pass in progress, if any."""
        if self.current is not None:
            self.current.on_input(module, args, kwargs)

    def on_output(self, module: nn.Module, output: Any) -> Any:
        """Forward a call end to the pass in progress, if any."""
        if self.current is None:  # a submodule called outside a pass
            return None
        return self.current.on_output(module, output)

    def grad_sink(self, label: DepthIdx) -> Callable[[Any], None]:
        """Return where the gradient of ``label`` goes when it arrives."""
        return lambda grad: self.scope.feed_grad(label, grad)

    def feed(self, state: PassState) -> None:
        """Feed a completed explicit pass to the scope."""
        self.scope.feed(state)


class Scope:
    """The records of every pass made while a ``with`` block is open.

    Made by :meth:`Recorder.scope`; see there for the parameters.

    Attributes
    ----------
    passes : int
        Number of passes fed (those that passed the call-plan check).
    count : Mapping
        Label -> number of output records reduced.
    samples : Mapping
        Label -> number of samples seen (sum of the first dimension of the
        output records that are tensors).
    inputs : Mapping
        Label -> list of ``CallInputs`` of every pass (inputs are kept whole).
    gradients : Mapping
        Label -> reduced output gradients, fed as ``backward()`` delivers
        them while the scope is open.
    """

    def __init__(
        self,
        recorder: Recorder,
        reduce: Any,
        condition: Callable[[], object] | None,
    ) -> None:
        """Prepare a scope of ``recorder``; see :meth:`Recorder.scope`."""
        from .reduce import make_reducer  # noqa: PLC0415 (reduce imports torch only)

        self._recorder = recorder
        self._make = make_reducer
        if isinstance(reduce, Mapping):
            self._specs: dict[Any, Any] = dict(reduce)
            self._default: Any = "all"
        else:
            self._specs = {}
            self._default = reduce
        make_reducer(self._default)  # fail early on a bad spec
        for spec in self._specs.values():
            make_reducer(spec)
        self._condition = condition
        self.passes = 0
        self._outputs: dict[DepthIdx, Reducer] = {}
        self._grads: dict[DepthIdx, Reducer] = {}
        self._inputs: dict[DepthIdx, list[Any]] = {}
        self._samples: dict[DepthIdx, int] = {}
        self._open = False
        self._handles: list[RemovableHandle] = []
        self._previous: Any = None
        self._state: ScopeState | None = None

    # -- context -----------------------------------------------------------

    def __enter__(self) -> Self:
        """Start recording every pass of the net made in this thread."""
        if self._open:
            msg = "This scope is already open; use `rnet.scope()` for another one."
            raise RuntimeError(msg)
        recorder = self._recorder
        state = ScopeState(self)
        key = recorder._token  # noqa: SLF001 (the scope is part of the recorder)
        self._previous = ACTIVE.states.get(key)
        ACTIVE.states[key] = state
        self._state = state
        net = recorder.net
        self._handles = [
            net.register_forward_pre_hook(self._open_pass, prepend=True),
            net.register_forward_hook(self._mark_completed),
            net.register_forward_hook(self._close_pass, always_call=True),
        ]
        recorder._scopes.append(self)  # noqa: SLF001 (the scope is part of the recorder)
        self._open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop recording; remove the hooks the scope added."""
        self._open = False
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._recorder._scopes.remove(self)  # noqa: SLF001 (the scope is part of the recorder)
        # Remove our state only (scopes of other recorders, under other keys,
        # may still be open: exits out of order are fine).
        states = ACTIVE.states
        key = self._recorder._token  # noqa: SLF001 (the scope is part of the recorder)
        if states.get(key) is self._state:
            if self._previous is None:
                del states[key]
            else:
                states[key] = self._previous
        self._previous = None
        self._state = None

    def _mine(self) -> ScopeState | None:
        state = ACTIVE.states.get(self._recorder._token)  # noqa: SLF001 (the scope is part of the recorder)
        return state if state is self._state else None

    def _open_pass(self, module: nn.Module, _args: Any) -> None:
        state = self._mine()
        if state is None:  # an explicit pass, or another thread
            return
        # A root call starts a pass. A pass left open by a `KeyboardInterrupt`
        # (torch runs no hook then) is dropped here. A net calling itself at
        # the root is not supported: its inner call restarts the pass, which
        # then fails the call-plan check, loudly.
        state.current = PassState(
            self._recorder._plan,  # noqa: SLF001 (the scope is part of the recorder)
            None,
            False,  # noqa: FBT003 (dont_record)
            module.training,
            state.grad_sink,
        )
        state.completed = False

    def _mark_completed(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        state = self._mine()
        if state is not None:
            state.completed = True

    def _close_pass(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        state = self._mine()
        if state is None or state.current is None:
            return
        current, completed = state.current, state.completed
        state.current, state.completed = None, False
        if not completed:  # the call raised: drop the pass
            self._recorder._clear()  # noqa: SLF001 (the scope is part of the recorder)
            return
        try:
            current.check_counts()
        except BaseException:
            self._recorder._clear()  # noqa: SLF001 (the scope is part of the recorder)
            raise
        self._recorder._publish(current)  # noqa: SLF001 (the scope is part of the recorder)
        self.feed(current)

    # -- feeding -----------------------------------------------------------

    def _reducer(self, store: dict[DepthIdx, Reducer], label: DepthIdx) -> Reducer:
        reducer = store.get(label)
        if reducer is None:
            row = self._recorder.table[label]
            spec = self._specs.get(label, self._specs.get(row.name, self._default))
            reducer = self._make(spec)
            if reducer is spec:  # a reducer given as a template: one per label
                reducer = reducer.fresh()
            store[label] = reducer
        return reducer

    def _keep(self) -> bool:
        return self._condition is None or bool(self._condition())

    def feed(self, state: PassState) -> None:
        """Feed the records of a completed pass."""
        self.passes += 1
        if not self._keep():
            return
        for label, record in state.records.items():
            self._reducer(self._outputs, label).update(record)
            if isinstance(record, Tensor) and record.dim() > 0:
                self._samples[label] = self._samples.get(label, 0) + record.shape[0]
        for label, inputs in state.inputs.items():
            self._inputs.setdefault(label, []).append(inputs)

    def feed_grad(self, label: DepthIdx, grad: Any) -> None:
        """Feed the gradient of ``label`` (ignored once the scope is closed)."""
        if self._open and self._keep():
            self._reducer(self._grads, label).update(grad)

    # -- results -----------------------------------------------------------

    def __getitem__(self, label: DepthIdx) -> Any:
        """Return the reduced outputs of ``label``."""
        if label not in self._outputs:
            msg = (
                f"No output of {label} was fed to this scope: record it with "
                "`rnet.record(...)` before entering the scope, and run a pass."
            )
            raise KeyError(msg)
        return self._outputs[label].result()

    def __contains__(self, label: object) -> bool:
        """Return whether outputs of ``label`` were fed."""
        return label in self._outputs

    def __iter__(self) -> Iterator[DepthIdx]:
        """Iterate over the labels whose outputs were fed."""
        return iter(self._outputs)

    def __len__(self) -> int:
        """Return the number of labels whose outputs were fed."""
        return len(self._outputs)

    @property
    def count(self) -> dict[DepthIdx, int]:
        """Label -> number of output records reduced."""
        return {label: int(r.count) for label, r in self._outputs.items()}

    @property
    def samples(self) -> dict[DepthIdx, int]:
        """Label -> number of samples (first dimension) seen in outputs."""
        return dict(self._samples)

    @property
    def inputs(self) -> dict[DepthIdx, list[Any]]:
        """Label -> the ``CallInputs`` of every pass, in order."""
        return {label: list(items) for label, items in self._inputs.items()}

    @property
    def gradients(self) -> dict[DepthIdx, Any]:
        """Label -> reduced output gradients."""
        return {label: r.result() for label, r in self._grads.items()}

    def records_of(self, selector: Selector) -> list[Any]:
        """Return the records of every call of the selected rows, in call order.

        With ``reduce="all"`` this is the list MMRazor's recorders keep
        (``data_buffer``): pass after pass, each module call in the order it
        started. With other reductions it is the reduced result of each
        selected row, in table order.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> relu = nn.ReLU()
        >>> net = nn.Sequential(nn.Linear(2, 2), relu, relu)
        >>> rnet = Recorder(net, input_size=(1, 2))
        >>> rnet.record(relu)
        >>> with rnet.scope() as scope:
        ...     _ = net(torch.ones(1, 2))
        ...     _ = net(torch.zeros(1, 2))
        >>> len(scope.records_of("1"))  # 2 calls x 2 passes
        4

        """
        from .select import resolve  # noqa: PLC0415 (avoid an import cycle)

        recorder = self._recorder
        rows = [
            row
            for row in resolve(recorder.table, recorder.net, [selector])
            if row.label in self._outputs
        ]
        if not rows:
            msg = f"No record of {selector!r} was fed to this scope."
            raise KeyError(msg)
        results = [self._outputs[row.label].result() for row in rows]
        if not all(isinstance(result, list) for result in results):
            return results
        return [item for items in zip(*results, strict=True) for item in items]
