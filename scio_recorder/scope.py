"""Scopes: accumulate the records of many passes, reduced on the fly.

``with rnet.scope(reduce) as scope:`` records every pass of the net made in
the block, whether it goes through the recorder (``rnet(x)``) or calls the net
directly (``net(x)``, the way MMRazor's and torchfunc's recorders are used),
and feeds each pass's records to one reducer per label.

Why it is built this way: a pass made directly through the net has no
``Recorder.forward`` around it to set up and check its state. While a scope is
open, the net itself carries three hooks that delimit such passes: a
pre-hook (first of all pre-hooks) opens a :class:`~._engine.state.PassState`, a
forward hook marks that the call completed, and a last forward hook with
``always_call=True`` closes it, checking the call plan when the call completed
and discarding the partial pass when it raised. Leaving the block removes the
three hooks, also after an exception. Passes are found through the same
thread-local mapping as explicit passes, so only the thread that opened the
scope is recorded.

``condition()`` is asked once per completed pass, when the pass is fed; its
answer is kept on a small ticket that the pass's gradient sinks share, so the
gradients that ``backward()`` delivers later follow the same decision as the
outputs and inputs of that pass.

The passes themselves are opened, checked, published and closed by the
recorder's :class:`~scio_recorder._engine.passes.Passes`, as for ``rnet(x)``;
the scope registers a :class:`ScopeState` (a listener) there, and receives
every completed pass. Of its recorder the scope uses only the public ``net``
and ``table`` (the :class:`ScopeOwner` protocol), so this module does not
import the recorder (which imports it): no import circle.
"""

from __future__ import annotations

__all__ = ["Scope", "ScopeOwner", "ScopeState"]

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor, nn

from ._engine.passes import Passes, RootPasses
from ._engine.state import CallInputs, Listener, PassState, pick_argument
from .reduce import Keep, make_reducer
from .select import resolve

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

    from .layers import DepthIdx, LayerTable
    from .reduce import Reducer
    from .select import Selector

InputArg = int | str
"""A positional index or a keyword name of a call's inputs."""


class ScopeOwner(Protocol):
    """What a :class:`Scope` uses of its :class:`~scio_recorder.Recorder`."""

    @property
    def net(self) -> nn.Module:
        """The wrapped network."""
        ...

    @property
    def table(self) -> LayerTable:
        """The layer table."""
        ...


class _Ticket:
    """Whether the scope keeps one pass; shared by that pass's gradient sinks."""

    __slots__ = ("keep",)

    def __init__(self) -> None:
        self.keep: bool | None = None  # decided when the pass is fed


class ScopeState(Listener):
    """The listener a scope registers: it receives the recorder's passes.

    Registered while no pass of the recorder runs, so that hooks find
    nothing to do (see :class:`~scio_recorder._engine.state.Listener`).
    """

    __slots__ = ("scope", "ticket")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.ticket: _Ticket | None = None  # of the pass in progress

    def grad_sink(self, label: DepthIdx) -> Callable[[Any], None]:
        """Return where the gradient of ``label`` goes when it arrives.

        Called while the pass runs; the sink holds that pass's ticket, which
        :meth:`feed` fills with the condition's answer.
        """
        ticket = self.ticket
        if ticket is None:
            ticket = self.ticket = _Ticket()
        scope = self.scope
        return lambda grad: scope.feed_grad(label, grad, ticket)

    def feed(self, state: PassState) -> None:
        """Feed a completed pass to the scope; settle its gradients' ticket."""
        ticket, self.ticket = self.ticket, None
        keep = self.scope.feed(state)
        if ticket is not None:
            ticket.keep = keep

    def dropped(self) -> None:
        """Forget the failed pass's gradients' ticket."""
        self.ticket = None


class Scope:
    """The records of every pass made while a ``with`` block is open.

    Made by :meth:`Recorder.scope`; see there for the parameters.

    Attributes
    ----------
    passes : int
        Number of passes fed (those that passed the call-plan check), kept
        or not.
    kept : int
        Number of those passes that ``condition`` kept (all of them without
        a condition).
    count : Mapping
        Label -> number of output records reduced.
    samples : Mapping
        Label -> number of samples seen (sum of the first dimension of the
        output records that are tensors).
    inputs : Mapping
        Label -> the inputs of every kept pass: with ``inputs="all"`` (the
        default) the list of ``CallInputs``; otherwise the reduced result of
        the chosen argument, or a dict argument -> result when
        ``input_args`` names several.
    gradients : Mapping
        Label -> reduced output gradients, fed as ``backward()`` delivers
        them while the scope is open.
    """

    def __init__(  # noqa: PLR0913, PLR0917 (made by Recorder.scope only)
        self,
        recorder: ScopeOwner,
        passes: Passes,
        reduce: Any,
        condition: Callable[[], object] | None,
        inputs: Any = "all",
        input_args: InputArg | Sequence[InputArg] | None = None,
    ) -> None:
        """Prepare a scope of ``recorder``; see :meth:`Recorder.scope`."""
        self.recorder = recorder
        """The recorder (or what stands for it) whose passes are reduced."""
        self._passes = passes
        self._specs, self._default = _split_specs(reduce)
        self._input_specs, self._input_default = _split_specs(inputs)
        self._input_args, self._input_many = _check_input_args(input_args)
        self._condition = condition
        self.passes = 0
        self.kept = 0
        self._outputs: dict[DepthIdx, Reducer] = {}
        self._grads: dict[DepthIdx, Reducer] = {}
        self._inputs: dict[DepthIdx, dict[Any, Reducer]] = {}
        self._samples: dict[DepthIdx, int] = {}
        self._open = False
        self._direct: RootPasses | None = None

    # -- context -----------------------------------------------------------

    def __enter__(self) -> Self:
        """Start recording every pass of the net made in this thread."""
        if self._open:
            msg = "This scope is already open; use `rnet.scope()` for another one."
            raise RuntimeError(msg)
        state = ScopeState(self)
        self._direct = RootPasses(self._passes, self.recorder.net, state)
        self._direct.__enter__()
        self._passes.listeners.append(self)
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
        self._passes.listeners.remove(self)
        if self._direct is not None:
            self._direct.__exit__()
        self._direct = None

    # -- feeding -----------------------------------------------------------

    def _reducer(
        self,
        label: DepthIdx,
        specs: Mapping[Any, Any],
        default: Any,
    ) -> Reducer:
        row = self.recorder.table[label]
        spec = specs.get(label, specs.get(row.name, default))
        reducer = make_reducer(spec)
        if reducer is spec:  # a reducer given as a template: one per label
            reducer = reducer.fresh()
        return reducer

    def _output_reducer(
        self, store: dict[DepthIdx, Reducer], label: DepthIdx
    ) -> Reducer:
        reducer = store.get(label)
        if reducer is None:
            reducer = store[label] = self._reducer(label, self._specs, self._default)
        return reducer

    def feed(self, state: PassState) -> bool:
        """Feed the records of a completed pass; return whether it was kept.

        ``condition()`` is asked here, once per pass.
        """
        self.passes += 1
        if self._condition is not None and not self._condition():
            return False
        self.kept += 1
        for label, record in state.records.items():
            self._output_reducer(self._outputs, label).update(record)
            if isinstance(record, Tensor) and record.dim() > 0:
                self._samples[label] = self._samples.get(label, 0) + record.shape[0]
        for label, inputs in state.inputs.items():
            self._feed_inputs(label, inputs)
        return True

    def _feed_inputs(self, label: DepthIdx, inputs: CallInputs) -> None:
        store = self._inputs.get(label)
        if store is None:
            store = self._inputs[label] = {}
            template = self._reducer(label, self._input_specs, self._input_default)
            if self._input_args is None or _keeps_all(template):
                store[None] = template
            else:
                for arg in self._input_args:
                    store[arg] = template.fresh()
        for arg, reducer in store.items():
            if arg is None and _keeps_all(reducer):
                reducer.update(inputs)
            else:
                layer = self.recorder.table[label]
                reducer.update(pick_argument(inputs, arg, layer.describe()))

    def feed_grad(
        self, label: DepthIdx, grad: Any, ticket: _Ticket | None = None
    ) -> None:
        """Feed the gradient of ``label`` (ignored once the scope is closed).

        ``ticket`` carries the decision taken for the pass the gradient
        belongs to; a gradient of a pass the condition dropped is dropped.
        """
        if not self._open or (ticket is not None and ticket.keep is False):
            return
        self._output_reducer(self._grads, label).update(grad)

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
    def inputs(self) -> dict[DepthIdx, Any]:
        """Label -> the inputs of every kept pass, kept whole or reduced.

        With ``inputs="all"`` (the default): the list of ``CallInputs`` of
        every kept pass, in order. With a reduction: its result for the
        chosen argument, or a dict argument -> result when ``input_args``
        names several.
        """
        out: dict[DepthIdx, Any] = {}
        for label, store in self._inputs.items():
            if None in store:
                out[label] = store[None].result()
            else:
                results = {arg: r.result() for arg, r in store.items()}
                out[label] = results if self._input_many else results.popitem()[1]
        return out

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
        recorder = self.recorder
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


# ------------------------------------------------------------------ helpers
def _split_specs(spec: Any) -> tuple[dict[Any, Any], Any]:
    """Split a reduce spec into a per-label/name dict and a default; check all."""
    if isinstance(spec, Mapping):
        specs: dict[Any, Any] = dict(spec)
        default: Any = "all"
    else:
        specs, default = {}, spec
    make_reducer(default)  # fail early on a bad spec
    for one in specs.values():
        make_reducer(one)
    return specs, default


def _check_input_args(
    args: InputArg | Sequence[InputArg] | None,
) -> tuple[tuple[InputArg, ...] | None, bool]:
    """Return the arguments to reduce, and whether several were asked for."""
    if args is None:
        return None, False
    several = isinstance(args, Sequence) and not isinstance(args, str)
    many: Sequence[InputArg] = args if several else (args,)  # type: ignore[assignment]
    for arg in many:
        if isinstance(arg, bool) or not isinstance(arg, int | str):
            msg = (
                f"input_args takes positional indices (int) and keyword names "
                f"(str), got {arg!r}; e.g. `input_args=0` or `input_args=(0, 'mask')`."
            )
            raise TypeError(msg)
    return tuple(many), several


def _keeps_all(reducer: Reducer) -> bool:
    """Whether ``reducer`` keeps records whole (``"all"``/``"keep"``)."""
    return type(reducer) is Keep
