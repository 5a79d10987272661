"""The :class:`Recorder`: record and edit the outputs of layers of a net.

The public contract is the one of the reference ``scio`` Recorder (same
constructor, ``record``, ``forward``, ``activations``, ``recording``,
``recorded_modules``, ``recorded_params``, ``net``, ``summary`` and ``repr``),
so code written for it runs unchanged. On top of it:

* hooks sit only on modules with a selected call (see :mod:`._hooks`);
* labels follow the calls of the reference pass (see :mod:`.layers`);
* each pass checks the call plan: every hooked module must be called exactly
  as often as the layer table says, or the pass raises and keeps nothing;
* records modified in place after they were taken are detected (warning), and
  ``record(..., clone=True)`` keeps them exact;
* the state of a pass is local to that pass, so threads and nested recorders
  work;
* ``torch.compile(rnet, fullgraph=True)`` traces the whole recording pass
  into one graph, and :meth:`Recorder.export` exports it with the records as
  outputs (see :mod:`._compiled` and ``docs/compile.md``).
"""

from __future__ import annotations

__all__ = [
    "CallInputs",
    "CallPlanError",
    "InPlaceWarning",
    "Postprocessor",
    "RecordOptions",
    "Recorder",
    "Selection",
]

import contextlib
import copy
import dataclasses
import difflib
import inspect
import os
import sys
import warnings
import weakref
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.nn.modules import module as _module_impl

from ._compiled import (
    GradDeposits,
    TracedPass,
    entry_point,
    export_records,
    traced_key,
    traced_plan,
    unwrap_compiled,
)
from ._flow import table_of
from ._hooks import (
    ACTIVE,
    CallInputs,
    CallPlan,
    CallPlanError,
    EndSpec,
    GradSlot,
    HookSet,
    PassState,
    Postprocessor,
    RecordOptions,
    drop_copied_hooks,
    enter_trace,
    exit_trace,
    new_token,
)
from .graph import ExecutionGraph, trace_graph
from .layers import DepthIdx, Layer, LayerTable, example_inputs
from .scope import Scope, ScopeState
from .select import Selector, as_label, index_like, resolve

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from torch.nn.parameter import Parameter
    from torchinfo.model_statistics import ModelStatistics
    from typing_extensions import Self


class InPlaceWarning(UserWarning):
    """A record was modified in place after it was taken.

    Raised (as a warning) at the end of a pass, once per label and recorder,
    when a tensor of ``rnet.activations`` changed after it was recorded, for
    example by a later ``ReLU(inplace=True)``. Silence it with
    ``warnings.simplefilter("ignore", InPlaceWarning)``, or keep exact records
    with ``rnet.record(..., clone=True)``.
    """


_DEFAULT_SUMMARY_KWARGS: dict[str, Any] = {
    "col_names": ("input_size", "output_size", "num_params", "params_percent"),
    "depth": torch.inf,
    "row_settings": ("var_names", "depth"),
    "verbose": 0,
}


class Recorder(nn.Module):
    """Wrap a network to record, and edit in flight, the outputs of its layers.

    A reference forward pass through :func:`torchinfo.summary` labels every
    module call ``(depth, idx)``; ``print(rnet)`` shows the labels. Select
    layers with :meth:`record`, call ``rnet(x)`` as you would call ``net(x)``,
    and read :attr:`activations`.

    Parameters
    ----------
    net : torch.nn.Module
        The network to record. It is kept as the submodule ``_net``.
    force_static_flow : bool, default True
        If true, refuse networks with data-dependent control flow: a forward
        on fake tensors (shapes without values, nothing computed) with the
        table's example inputs must read no tensor value into Python
        (``if x.sum() > 0``, ``x.item()``, ``x.tolist()``), unless
        :func:`torch.fx.symbolic_trace` traces the net. Control flow on
        shapes, ``print``, keyword-only arguments and Hugging Face models
        pass; the error names the line that reads a value. With ``False`` any
        network is accepted. Either way every recording pass checks that each
        recorded module is called as often as in the reference pass, and
        raises otherwise, so a dynamic flow gives either the right
        activations or an error. See ``docs/guarantees.md``.
    reference_tensors : {"real", "fake"}, default "real"
        ``"fake"`` runs the reference pass on fake tensors: the same table,
        without computing anything (wrapping a large model then costs a
        fraction of one forward), and the static-flow check is done by the
        same pass. Where fake tensors cannot run the net (an operation
        without a fake kernel, a data-dependent shape or read, lazy modules,
        a recorder inside the net, a net torchinfo would move to another
        device) the pass runs on real tensors, with a warning. See
        ``docs/labels.md``.
    **summary_kwargs
        Passed to :func:`torchinfo.summary`. ``input_data`` or ``input_size``
        is required. Defaults: ``col_names=("input_size", "output_size",
        "num_params", "params_percent")``, ``depth=inf``,
        ``row_settings=("var_names", "depth")``, ``verbose=0``. Use
        ``mode="train"`` to build the table in train mode. The net is left
        as it was: every submodule's ``training`` flag, every parameter's
        ``requires_grad`` and every buffer (BatchNorm running statistics)
        are put back after the reference pass.

    Raises
    ------
    ValueError
        If neither ``input_data`` nor ``input_size`` is given.
    RuntimeError
        If ``force_static_flow`` is true and the net's control flow depends on
        the data (see above).

    Warnings
    --------
    InPlaceWarning
        At the end of a pass whose records were modified in place afterwards.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> toynet = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU())
    >>> rnet = Recorder(toynet, input_size=(1, 5))
    >>> print(repr(rnet).splitlines()[5])
    ├─Linear (0): 1-1                        [1, 5]                    [1, 4]                    24                         61.54%
    >>> rnet.record((0, 1), (1, 3))
    >>> rnet.recording
    ((0, 1), (1, 3))
    >>> out = rnet(torch.rand(1, 5))
    >>> list(rnet.activations)
    [(1, 3), (0, 1)]
    >>> torch.equal(rnet.activations[(0, 1)], out)
    True

    """  # noqa: E501 (a table row is long)

    _net_direct: nn.Module
    _latest: _Latest
    _plan: CallPlan

    def __init__(
        self,
        net: nn.Module,
        /,
        *,
        force_static_flow: bool = True,
        reference_tensors: Literal["real", "fake"] = "real",
        **summary_kwargs: Any,
    ) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            msg = (
                f"`Recorder` wraps a `torch.nn.Module`, got {type(net).__name__}. "
                "Wrap your callable in a module first."
            )
            raise TypeError(msg)
        if not {"input_size", "input_data"} & summary_kwargs.keys():
            msg = "You must provide `input_data` or `input_size`"
            raise ValueError(msg)
        net, compiler = unwrap_compiled(net)
        drop_copied_hooks(net)  # of a net copied while another recorder hooked it
        self._net = net
        self._token = new_token()
        self._hooks = HookSet(self, self._token)
        self._deposits = GradDeposits()
        self._summary_kwargs = _DEFAULT_SUMMARY_KWARGS | summary_kwargs
        self._table = table_of(
            net,
            self._summary_kwargs,
            check_flow=force_static_flow,
            fake=_fake_reference(reference_tensors),
        )
        self._latest = _Latest()
        # A plain attribute: reading a submodule goes through the slower
        # `nn.Module.__getattr__`, and forward reads it on every pass.
        object.__setattr__(self, "_net_direct", net)
        self._params: dict[str, Parameter] = {}
        self._selection = Selection()
        self._plan = CallPlan.empty(self._table.mode_description)
        self._traced_key = traced_key(self._plan, self._token, self._deposits)
        self._scopes: list[Scope] = []
        self._warned_inplace: set[tuple[str, DepthIdx]] = set()
        self._compiler = compiler
        self._enter(compiler)

    def _enter(self, compiler: Callable[[Any], Any] | None) -> None:
        """Set the entry point that Dynamo compiles (see ``entry_point``).

        With ``compiler`` (``Recorder(torch.compile(net))``), do what
        ``nn.Module.compile`` does, with the settings the net was compiled
        with: the recorder's whole pass is traced as one graph.
        """
        entry = entry_point(self, self._token)
        object.__setattr__(self, "__call__", entry)
        if compiler is not None:
            object.__setattr__(self, "_compiled_call_impl", compiler(entry))

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compile the recorder's pass in place, as ``nn.Module.compile`` does.

        The arguments are those of :func:`torch.compile`. Unlike
        ``nn.Module.compile``, which compiles the ``_call_impl`` that every
        module shares (so Dynamo's recompile limit would count all compiled
        modules of the process), this compiles the recorder's own entry point.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
        >>> rnet.record((1, 1))
        >>> rnet.compile(fullgraph=True, backend="eager")
        >>> out = rnet(torch.ones(4, 3))
        >>> rnet.activations[(1, 1)].shape
        torch.Size([4, 2])

        """
        entry = self.__dict__["__call__"]
        compiled = torch.compile(entry, *args, **kwargs)
        object.__setattr__(self, "_compiled_call_impl", compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call :meth:`forward`, skipping ``nn.Module.__call__`` when it can.

        ``nn.Module.__call__`` handles hooks, tracing and compilation; when
        none of these apply to the recorder itself, it only calls ``forward``,
        at a cost (two Python frames and a dozen checks) comparable to a small
        layer's whole forward. Any hook on the recorder, global module hooks,
        JIT tracing, ``torch.fx`` tracing (which patches
        ``nn.Module.__call__``) or ``rnet.compile()`` goes through it as usual,
        and so does a pass that Dynamo traces (it traces torch's own path with
        fewer guards than this one's checks).
        """
        if torch.compiler.is_compiling():  # Dynamo traces torch's own path best
            return _MODULE_CALL(self, *args, **kwargs)
        if (
            self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
            or nn.Module.__call__ is not _MODULE_CALL
            or _GLOBAL_HOOKS[0]
            or _GLOBAL_HOOKS[1]
            or _GLOBAL_HOOKS[2]
            or _GLOBAL_HOOKS[3]
            or self.__dict__.get("_compiled_call_impl") is not None
            or torch._C._get_tracing_state()  # noqa: SLF001 (what torch checks)
        ):
            # Looked up now: `torch.fx` tracing patches `nn.Module.__call__`.
            return nn.Module.__call__(self, *args, **kwargs)
        return self._fast_forward(*args, **kwargs)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Let the fast path of ``__call__`` call a subclass's own ``forward``."""
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            cls._fast_forward = cls.forward

    # -- selection -------------------------------------------------------

    def record(  # noqa: PLR0913 (keyword-only options)
        self,
        *selectors: Selector,
        inputs: Selector | None = None,
        grads: Selector | None = None,
        params: Selector | None = None,
        clone: bool = False,
        detach: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Set what is recorded (replacing the previous selection).

        Parameters
        ----------
        *selectors : label, name, module, type, predicate, ...
            The layers whose outputs are recorded into :attr:`activations`.
            The reference form is a label ``(depth, idx)`` as printed in the
            table; also accepted: a qualified module name (``"layer1.0.conv1"``,
            every call), ``(name, k)`` (its k-th call), a module, a module type
            (``nn.Linear``), a predicate over :class:`~scio_recorder.Layer`
            rows, :func:`~scio_recorder.children` / :func:`~scio_recorder.modules`
            (see :mod:`scio_recorder.select`). Duplicates and order are
            ignored; nothing records nothing.
        inputs : selector or list of selectors, optional
            Layers whose call inputs are recorded into :attr:`inputs`, as
            ``CallInputs(args, kwargs)`` taken when the call starts.
        grads : selector or list of selectors, optional
            Layers whose output gradients are recorded into :attr:`gradients`
            during ``backward()`` (the gradient of what the layer passes on,
            i.e. after any postprocessor).
        params : selector or list of selectors, optional
            Modules (any selector) or parameter names (``"fc.weight"``) whose
            parameters :attr:`params` and :attr:`param_grads` show.
        clone : bool, default False
            Record copies, taken before any postprocessor, so later in-place
            operations of the net cannot change them.
        detach : bool, default False
            Record tensors detached from the autograd graph.
        device : torch.device or str, optional
            Move records to this device (a copy from CUDA to CPU synchronises
            with the device, as any such copy does).
        dtype : torch.dtype, optional
            Cast floating-point records to this dtype.

        Raises
        ------
        ValueError
            If a selector matches nothing or a row that cannot be recorded;
            the selection is then left unchanged.
        TypeError
            If a selector is of no known form, or ``dtype`` is no dtype.
        RuntimeError
            If a :meth:`scope` of this recorder is open.

        Examples
        --------
        >>> from torch import nn
        >>> rnet = Recorder(
        ...     nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5)
        ... )
        >>> rnet.record((1, 2), (1, 1), (1, 2), clone=True)
        >>> rnet.recording
        ((1, 1), (1, 2))
        >>> rnet.record(nn.Linear, inputs="0")
        >>> rnet.recording, rnet.selection.inputs
        (((1, 1),), ((1, 1),))
        >>> rnet.record(1, 2)
        Traceback (most recent call last):
        ...
        ValueError: Following layers not found: {1, 2}. Did you mean `rnet.record((1, 2))`? Operation cancelled

        """  # noqa: E501 (doctest output)
        if self._scopes:
            msg = (
                "Cannot change the selection while a `rnet.scope()` is open: "
                "its records would mix two selections. Call `rnet.record(...)` "
                "before entering the scope."
            )
            raise RuntimeError(msg)
        self._check_labels(selectors)
        net, table = self._net, self._table
        outputs = resolve(table, net, selectors)
        input_rows = resolve(table, net, _as_list(inputs))
        grad_rows = resolve(table, net, _as_list(grads))
        param_map = self._resolve_params(_as_list(params))
        if dtype is not None and not isinstance(dtype, torch.dtype):
            msg = f"`dtype` must be a `torch.dtype`, got {dtype!r}"
            raise TypeError(msg)
        options = RecordOptions(
            clone=bool(clone),
            detach=bool(detach),
            device=torch.device(device) if device is not None else None,
            dtype=dtype,
        )
        self._plan = _make_plan(table, outputs, input_rows, grad_rows, options)
        self._selection = Selection(
            tuple(sorted(row.label for row in outputs)),
            tuple(sorted(row.label for row in input_rows)),
            tuple(sorted(row.label for row in grad_rows)),
            tuple(param_map),
        )
        self._params = param_map
        self._traced_key = traced_key(self._plan, self._token, self._deposits)
        self._hooks.place(list(self._plan.ends), list(self._plan.starts))

    def _check_labels(self, selectors: tuple[Selector, ...]) -> None:
        """Check label-like selectors with the reference Recorder's messages."""
        table = self._table
        labels = [as_label(s) or s for s in selectors if _looks_like_label(s)]
        unknown = {s for s in labels if s not in table}
        if unknown:
            hint = ""
            if len(selectors) == 2 and all(map(index_like, selectors)):  # noqa: PLR2004 (a pair)
                hint = f"Did you mean `rnet.record({selectors})`? "
            shown = "{" + ", ".join(map(repr, sorted(unknown, key=repr))) + "}"
            msg = f"Following layers not found: {shown}. {hint}Operation cancelled"
            raise ValueError(msg)
        refused = [table[s] for s in sorted(set(labels)) if not table[s].recordable]
        if refused:
            lines = [f"- {row.describe()}: {row.reason}" for row in refused]
            names = {row.name for row in refused}
            children = [
                f"`{row.label}`"
                for row in table.rows
                if row.recordable
                and any(row.name.startswith(f"{name}.") for name in names)
            ]
            if children:
                examples = ", ".join(children[:3])
                lines.append(f"Record its submodules' calls instead, e.g. {examples}.")
            msg = "These layers cannot be recorded:\n" + "\n".join(lines)
            raise ValueError(msg + "\nOperation cancelled")

    def _resolve_params(self, selectors: list[Selector]) -> dict[str, Parameter]:
        named = dict(self._net.named_parameters())
        by_id = {id(p): name for name, p in named.items()}
        found: dict[str, Parameter] = {}
        module_selectors = []
        modules = {name for name, _ in self._net.named_modules(remove_duplicate=False)}
        for selector in selectors:
            if isinstance(selector, str) and selector in named:
                found[selector] = named[selector]
            elif isinstance(selector, str) and selector not in modules:
                close = difflib.get_close_matches(selector, [*named, *modules], n=3)
                hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?"
                msg = (
                    f"No parameter or module named `{selector}` in the net."
                    f"{hint if close else ''} `dict(net.named_parameters())` lists "
                    "the parameter names. Operation cancelled"
                )
                raise ValueError(msg)
            else:
                module_selectors.append(selector)
        for row in resolve(self._table, self._net, module_selectors):
            for param in row.module.parameters():
                name = by_id.get(id(param))
                if name is not None:
                    found[name] = param
        return {name: found[name] for name in named if name in found}

    # -- the pass --------------------------------------------------------

    def forward(
        self,
        *args: Any,
        activation_postproc: Postprocessor | Sequence[Postprocessor] | None = None,
        dont_record: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Call the net, recording the selected layers and editing them.

        Parameters
        ----------
        *args, **kwargs
            Passed to the net.
        activation_postproc : Postprocessor or list of Postprocessor, optional
            Edits recorded outputs before the net goes on, with the contract
            ``postproc(output) -> replacement output or None`` (``None`` keeps
            the output). It runs after recording, on the real output, so an
            in-place edit shows in the record. One callable serves every
            recorded call; a list is consumed one item per recorded call, in
            the order recorded outputs are produced (the order forward hooks
            fire: a container comes after its children). Extra items are
            ignored, too few raise; the list itself is not modified.
        dont_record : bool, default False
            Record nothing (postprocessors still run).

        Returns
        -------
        Any
            What ``net(*args, **kwargs)`` returns.

        Raises
        ------
        CallPlanError
            If a recorded module is called more or fewer times than in the
            reference pass (labels would be wrong); no activations are kept.
        ValueError
            If ``activation_postproc`` is a list with too few items.

        Warns
        -----
        InPlaceWarning
            If a record was modified in place after it was taken (once per
            label and recorder).

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> rnet = Recorder(
        ...     nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5)
        ... )
        >>> rnet.record((1, 1))
        >>> out = rnet(torch.ones(1, 5), activation_postproc=lambda t: t.clamp(max=0))
        >>> bool((out == 0).all())
        True

        """
        if torch.compiler.is_compiling():
            return self._traced_forward(args, kwargs, activation_postproc, dont_record)
        return self._eager_forward(
            *args,
            activation_postproc=activation_postproc,
            dont_record=dont_record,
            **kwargs,
        )

    def _eager_forward(
        self,
        *args: Any,
        activation_postproc: Postprocessor | Sequence[Postprocessor] | None = None,
        dont_record: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run :meth:`forward` outside Dynamo (``__call__``'s fast path calls it).

        ``__call__`` has already asked whether Dynamo is tracing; asking again
        would cost every eager pass a second check.
        """
        net = self._net_direct
        states = ACTIVE.states
        key = self._token
        outer = states.get(key)
        plan = self._plan
        if outer is None and not plan.ends and not plan.starts:  # nothing recorded
            latest = self._latest
            if (
                latest.activations
                or latest.inputs
                or latest.grads
                or latest.traced_grads
            ):
                self._clear()
            return net(*args, **kwargs)
        scope = outer if isinstance(outer, ScopeState) else None
        state = PassState(
            plan,
            activation_postproc,
            dont_record,
            net.training,
            None if scope is None else scope.grad_sink,
        )
        states[key] = state
        try:
            out = net(*args, **kwargs)
            state.check_counts()
        except BaseException:
            self._clear()
            raise
        finally:
            if outer is None:
                del states[key]
            else:
                states[key] = outer
        self._publish(state)
        if scope is not None:
            scope.feed(state)
        return out

    def _traced_forward(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        dont_record: bool,  # noqa: FBT001 (private, mirrors forward)
    ) -> Any:
        """Run the pass as Dynamo traces it (``torch.compile``, ``torch.export``).

        Everything here is traced into the graph: the hooks read the state
        from the recorder's trace box instead of the thread-local registry,
        the call plan is checked when the graph is traced, and the records
        are graph outputs that Dynamo stores into the latest records after
        every call (see :mod:`._compiled`).
        """
        if self._scopes:
            msg = (
                "`rnet.scope()` (and `collect`, which uses it) runs eagerly: "
                "its reducers keep Python state that a compiled graph cannot "
                "update. Call the recorder uncompiled inside the scope, or "
                "compile the net and read `rnet.activations` after each call."
            )
            raise RuntimeError(msg)
        net = self._net_direct
        latest = self._latest
        # The one guard on the selection (see TracedPlan).
        traced = traced_plan(self._traced_key)
        if not traced.ends and not traced.starts:  # nothing recorded
            latest.activations, latest.inputs, latest.grads = {}, {}, {}
            latest.traced_grads = {}
            return net(*args, **kwargs)
        state = TracedPass(traced, self._plan, postproc, dont_record, net.training)
        enter_trace(state)
        try:
            out = net(*args, **kwargs)
        finally:
            exit_trace(state)
        state.check_counts()
        if state.grad_targets:
            self._deposits.grads = {}  # replaced after every call of the graph
        latest.activations = state.records
        latest.inputs = state.inputs
        latest.grads = {}
        latest.traced_grads = state.grad_targets
        return out

    _fast_forward = _eager_forward
    """What ``__call__``'s fast path runs (a subclass's own ``forward``)."""

    def _clear(self) -> None:
        latest = self._latest
        latest.activations, latest.inputs, latest.grads = {}, {}, {}
        latest.traced_grads = {}

    def _publish(self, state: PassState) -> None:
        """Make ``state``'s records the latest pass's (called after success).

        Then compare the version counter of every recorded tensor with the one
        it had when recorded: a change means an in-place operation overwrote
        the record afterwards.
        """
        latest = self._latest
        latest.activations = state.records
        latest.inputs = state.inputs
        latest.grads = state.grads
        latest.traced_grads = {}
        for label, kind, tensor, version in state.versions:
            if tensor._version != version:  # noqa: SLF001 (version counter)
                self._warn_inplace(label, kind)

    def _warn_inplace(self, label: DepthIdx, kind: str) -> None:
        if (kind, label) in self._warned_inplace:
            return
        self._warned_inplace.add((kind, label))
        row = self._table[label]
        what = "output" if kind == "activations" else "inputs"
        msg = (
            f"The record of layer {row.describe()} was modified in place "
            "after it was recorded (e.g. by a later `inplace=True` "
            f"operation): `rnet.{kind}[{label}]` no longer holds that "
            f"layer's {what}. Use `rnet.record(..., clone=True)` to keep an "
            "exact copy. Shown once per layer and recorder."
        )
        warnings.warn(msg, InPlaceWarning, stacklevel=_user_stacklevel())

    def scope(
        self,
        reduce: Any = "all",
        *,
        condition: Callable[[], object] | None = None,
        inputs: Any = "all",
        input_args: int | str | Sequence[int | str] | None = None,
    ) -> Scope:
        """Accumulate the records of every pass while a ``with`` block is open.

        Inside the block, each pass of the net is recorded: calls through the
        recorder (``rnet(x)``) and direct calls of the net (``net(x)``, as
        with MMRazor's recorders) made in the same thread. Each pass is checked
        against the call plan as usual, and its records are fed to one reducer
        per label and kind (outputs, inputs, gradients as they arrive).

        Parameters
        ----------
        reduce : str, callable or Reducer, or a dict of them per label
            How outputs (and output gradients) are reduced across passes.
            ``"all"`` keeps every record (one per pass); ``"sum"``, ``"mean"``,
            ``"max"``, ``"min"`` reduce elementwise across passes; a function
            ``(acc, new) -> acc`` folds; a :class:`~scio_recorder.reduce.Reducer`
            is used as given (a fresh copy per label). A dict maps labels or
            qualified names to any of these (others keep ``"all"``).
        condition : callable, optional
            ``condition() -> bool``, asked once per completed pass: the pass's
            outputs, inputs and gradients are kept only when it returns true
            (torchfunc's ``condition``). ``scope.passes`` counts every pass,
            ``scope.kept`` the kept ones.
        inputs : str, callable or Reducer, or a dict of them per label
            How the inputs of layers recorded with ``record(inputs=...)`` are
            reduced across passes, in the same forms as ``reduce``
            (torchfunc's ``ForwardPre(reduction=...)``). ``"all"`` (the
            default) keeps every call's whole ``CallInputs``; anything else
            reduces one argument per call, so memory does not grow with the
            number of passes.
        input_args : int, str or a sequence of them, optional
            Which arguments ``inputs`` reduces: positional indices and
            keyword names. ``None`` (the default): the first tensor argument.
            A sequence reduces each and makes ``scope.inputs[label]`` a dict
            argument -> result.

        Returns
        -------
        Scope
            A context manager; after (or during) the block, ``scope[label]``
            is the reduced result, ``scope.count[label]`` the number of
            records reduced, ``scope.inputs[label]`` the inputs.

        Raises
        ------
        ValueError, TypeError
            For an unknown reduction or a bad ``input_args`` (when the scope
            is made), or an argument that a call does not receive (at that
            pass).

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> rnet.record((1, 1), inputs=(1, 2))
        >>> with rnet.scope("sum", inputs="mean") as scope:
        ...     _ = net(torch.ones(1, 3))  # direct calls are recorded too
        ...     _ = rnet(torch.ones(1, 3))
        >>> expected = 2 * net[0](torch.ones(1, 3))
        >>> torch.allclose(scope[(1, 1)], expected.double())  # sums are float64
        True
        >>> scope.passes, scope.count[(1, 1)], scope.inputs[(1, 2)].shape
        (2, 2, torch.Size([1, 2]))

        """
        return Scope(self, reduce, condition, inputs, input_args)

    @contextlib.contextmanager
    def selecting(  # noqa: PLR0913 (the options of record)
        self,
        *selectors: Selector,
        inputs: Selector | None = None,
        grads: Selector | None = None,
        clone: bool = False,
        detach: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> Iterator[Self]:
        """Record this selection inside a ``with`` block, then restore the previous.

        The previous selection (outputs, inputs, gradients, parameters) and
        record options come back on exit, also after an exception. Tools
        that run the recorder for their own purpose (``collect``, the OoD
        detectors, ``explain``) use it, so that a user's selection survives.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> rnet = Recorder(
        ...     nn.Sequential(nn.Linear(3, 2), nn.ReLU()), input_size=(1, 3)
        ... )
        >>> rnet.record((1, 2))
        >>> with rnet.selecting((1, 1)):
        ...     _ = rnet(torch.ones(1, 3))
        ...     list(rnet.activations)
        [(1, 1)]
        >>> rnet.recording
        ((1, 2),)

        """
        previous, options = self._selection, self._plan.options
        self.record(
            *selectors,
            inputs=inputs,
            grads=grads,
            clone=clone,
            detach=detach,
            device=device,
            dtype=dtype,
        )
        try:
            yield self
        finally:
            self.record(
                *previous.outputs,
                inputs=list(previous.inputs),
                grads=list(previous.grads),
                params=list(previous.params),
                clone=options.clone,
                detach=options.detach,
                device=options.device,
                dtype=options.dtype,
            )

    def graph(
        self,
        *args: Any,
        depth: int | None = None,
        roll: bool = False,
        **kwargs: Any,
    ) -> ExecutionGraph:
        """Run one pass of the net on the given inputs; return its execution graph.

        Module calls are nodes labelled like the table, the tensor operations
        between them (``add``, ``cat``, ``flatten``, ``getitem``, ...) are
        nodes too, and edges follow the data. Nothing is recorded into
        :attr:`activations`, the output is not returned, autograd is left as
        it is (``torch.no_grad()`` works, ``requires_grad`` is never set), no
        hook, mode or patch remains afterwards, the net's modes, flags and
        buffers are as before the pass, and fused kernels (the
        ``TransformerEncoder`` fast path) run as in a plain pass. See
        ``docs/graph.md``.

        Parameters
        ----------
        *args, **kwargs
            The net's inputs; none given: the input the table was built
            from (random tensors of ``input_size``, or ``input_data``).
        depth : int, optional
            Module calls deeper than ``depth`` fold into their ancestor at
            that depth, which keeps its own label. ``None``: down to the
            leaves (modules that call no submodule). The net's keyword
            arguments cannot be named ``depth`` or ``roll`` here: call
            :func:`scio_recorder.graph.trace_graph` for those.
        roll : bool
            Repeated calls of one module become one node with a call count.

        Returns
        -------
        ExecutionGraph
            ``.nodes``, ``.edges``, ``.to_dot()``, ``.render(path)``, other
            views with ``.at_depth(d)`` and ``.rolled()``.

        Raises
        ------
        GraphError
            If the pass raised; chained to that error, it holds the graph up
            to the failing call in ``.graph`` (that node has ``failed=True``).

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> rnet = Recorder(net, input_size=(1, 4))
        >>> rnet.record((1, 3))
        >>> graph = rnet.graph(torch.ones(5, 4))
        >>> [n.title() for n in graph.nodes if n.recorded]
        ['Linear (2): 1-3']
        >>> len(graph.nodes), graph.nodes[1].shapes
        (5, ((5, 3),))
        >>> print(graph.to_dot().splitlines()[0])
        digraph execution_graph {

        """
        if not args and not kwargs:
            args, kwargs = example_inputs(self._net, self._summary_kwargs)
        selection = self._selection
        recorded = {*selection.outputs, *selection.inputs, *selection.grads}
        states = ACTIVE.states
        own = states.pop(self._token, None)  # an open scope ignores this pass
        try:
            return trace_graph(
                self._net,
                self._table,
                args,
                kwargs,
                recorded=recorded,
                depth=depth,
                roll=roll,
            )
        finally:
            if own is not None:
                states[self._token] = own

    # -- views -------------------------------------------------------------

    def export(
        self,
        *args: Any,
        activation_postproc: Postprocessor | Sequence[Postprocessor] | None = None,
        strict: bool = False,
        dynamic_shapes: Any = None,
        **kwargs: Any,
    ) -> torch.export.ExportedProgram:
        """Export the pass, with the records as outputs, through :func:`torch.export.export`.

        The program runs the net and returns ``(output, activations)``, where
        ``activations`` maps each recorded label, as a string (``"2-1"``), to
        that call's output; when inputs are recorded, ``(output, activations,
        inputs)`` with ``inputs`` mapping labels to ``CallInputs``. A detector
        built on recorded features can then be deployed, saved with
        :func:`torch.export.save`, without Python hooks. Exporting leaves the net's
        modes, ``requires_grad`` flags and buffers as they were.

        Parameters
        ----------
        *args, **kwargs
            Example inputs of the net, as for :func:`torch.export.export`.
        activation_postproc : Postprocessor or list of Postprocessor, optional
            Edits applied in the exported program, as in :meth:`forward`.
        strict : bool, default False
            Passed to :func:`torch.export.export` (``True``: trace with Dynamo).
        dynamic_shapes : optional
            Passed to :func:`torch.export.export` (e.g. a dynamic batch size).

        Returns
        -------
        torch.export.ExportedProgram
            ``program.module()(*args, **kwargs)`` gives what is described above.

        Raises
        ------
        ValueError
            If gradients are selected: an exported program has no backward.
        RuntimeError
            If a :meth:`scope` is open, or the call plan does not hold.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> rnet = Recorder(net, input_size=(1, 5))
        >>> rnet.record((1, 2))
        >>> program = rnet.export(torch.ones(3, 5))
        >>> out, activations = program.module()(torch.ones(3, 5))
        >>> list(activations), activations["1-2"].shape
        (['1-2'], torch.Size([3, 4]))

        """  # noqa: E501 (the summary line names the torch function)
        if self._selection.grads:
            msg = (
                "Cannot export the gradients of "
                f"{_labels(self._selection.grads)}: an exported program runs "
                "the forward pass only. Select without `grads=` to export, and "
                "record gradients with the eager or compiled recorder."
            )
            raise ValueError(msg)
        return export_records(
            self,
            self._net,
            args,
            kwargs,
            postproc=activation_postproc,
            strict=strict,
            dynamic_shapes=dynamic_shapes,
        )

    @property
    def net(self) -> nn.Module:
        """The wrapped network."""
        return self._net

    @property
    def table(self) -> LayerTable:
        """The layer table: one :class:`~scio_recorder.Layer` per label."""
        return self._table

    @property
    def summary(self) -> ModelStatistics:
        """The :func:`torchinfo.summary` result whose ``repr`` is the table."""
        return self._table.statistics

    @property
    def activations(self) -> MappingProxyType[DepthIdx, Any]:
        """Records of the latest pass: label -> that call's output (read-only).

        Keys are in the order outputs were produced. Empty after a failed pass
        or a pass with ``dont_record=True``.
        """
        latest = self._latest
        if type(latest.activations) is dict:  # first look at this pass
            latest.activations = _Records(
                latest.activations, self._table, "activations"
            )
        return MappingProxyType(latest.activations)

    @property
    def inputs(self) -> MappingProxyType[DepthIdx, CallInputs]:
        """Inputs of the latest pass: label -> ``CallInputs(args, kwargs)``.

        Taken when each selected call starts (see ``record(inputs=...)``).

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> rnet.record(inputs="2")  # penultimate features: input of the head
        >>> _ = rnet(torch.ones(4, 3))
        >>> rnet.inputs[(1, 3)].args[0].shape
        torch.Size([4, 2])

        """
        latest = self._latest
        if type(latest.inputs) is dict:  # first look at this pass
            latest.inputs = _Records(latest.inputs, self._table, "inputs")
        return MappingProxyType(latest.inputs)

    @property
    def gradients(self) -> MappingProxyType[DepthIdx, Any]:
        """Output gradients of the latest pass, filled in by ``backward()``.

        Label -> the gradient of the loss with respect to what that call
        passed on (same structure as the output; ``None`` where no gradient
        arrived). Empty until a pass with ``record(grads=...)``.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> rnet.record(grads=(1, 1))
        >>> rnet(torch.ones(1, 3)).sum().backward()
        >>> rnet.gradients[(1, 1)].shape
        torch.Size([1, 2])

        """
        latest = self._latest
        grads = {k: v.value() for k, v in latest.grads.items()}
        if latest.traced_grads:  # the latest pass was a compiled one
            deposits = self._deposits
            for label, target in latest.traced_grads.items():
                grads[label] = deposits.value(target)
        return MappingProxyType(grads)

    @property
    def params(self) -> MappingProxyType[str, Parameter]:
        """Parameters selected with ``record(params=...)``, by qualified name.

        Examples
        --------
        >>> from torch import nn
        >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
        >>> rnet.record(params="0")
        >>> list(rnet.params)
        ['0.weight', '0.bias']

        """
        return MappingProxyType(self._params)

    @property
    def param_grads(self) -> dict[str, torch.Tensor | None]:
        """The ``.grad`` of each selected parameter, as torch accumulated it.

        ``backward()`` adds into ``.grad``: zero it (``net.zero_grad()``)
        before the backward whose gradients you want (GradNorm-style scores).
        """
        return {name: param.grad for name, param in self._params.items()}

    @property
    def record_options(self) -> RecordOptions:
        """The ``clone``/``detach``/``device``/``dtype`` options of ``record``."""
        return self._plan.options

    @property
    def selection(self) -> Selection:
        """What is recorded: output, input and gradient labels, parameter names."""
        return self._selection

    def activations_of(self, selector: Selector) -> tuple[Any, ...]:
        """Return the latest pass's records of the rows ``selector`` picks.

        Records come in table order, which is call order for the calls of one
        module: ``rnet.activations_of("block.relu")`` gives each call's output.

        Raises
        ------
        KeyError
            If a selected row was not recorded in the latest pass.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> relu = nn.ReLU()
        >>> net = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> rnet.record(relu)
        >>> _ = rnet(torch.ones(1, 3))
        >>> len(rnet.activations_of("1"))
        2

        """
        rows = resolve(self._table, self._net, [selector])
        records = self._latest.activations
        missing = [row.label for row in rows if row.label not in records]
        if missing:
            msg = (
                f"Labels {missing} were not recorded in the latest pass. "
                f"Record them first: `rnet.record({selector!r})`."
            )
            raise KeyError(msg)
        return tuple(records[row.label] for row in rows)

    @property
    def recording(self) -> tuple[DepthIdx, ...]:
        """The labels whose outputs are recorded, sorted."""
        return self._selection.outputs

    @property
    def recorded_modules(self) -> dict[DepthIdx, nn.Module]:
        """Recorded label -> its module, in table order."""
        wanted = set(self._selection.outputs)
        return {
            row.label: row.module for row in self._table.rows if row.label in wanted
        }

    @property
    def recorded_params(self) -> dict[str, Parameter]:
        """Named parameters (``_net.`` prefix) of the recorded modules."""
        params = {
            id(param)
            for module in self.recorded_modules.values()
            for param in module.parameters()
        }
        return {name: p for name, p in self.named_parameters() if id(p) in params}

    @property
    def hooked_modules(self) -> tuple[nn.Module, ...]:
        """The modules that currently carry a hook of this recorder."""
        return self._hooks.modules

    # The attributes a copy (deep copy, pickle) builds afresh: what ties a
    # recorder to its hooks, its passes and its process.
    _FRESH = frozenset(
        {
            "_deposits",
            "_hooks",
            "_token",
            "_latest",
            "_scopes",
            "_warned_inplace",
            "_compiled_call_impl",
            "_traced_key",
            "__call__",
        }
    )

    def __deepcopy__(self, memo: dict[int, Any]) -> Recorder:
        """Return a recorder of a deep copy of the net, with its own hooks.

        The default copy would carry this recorder's hooks onto the copied
        modules (as inert hooks). Here the hooks are lifted while the net, the
        table and the selection are copied (module references follow the
        copy), then placed again on both. Records of the latest pass are not
        copied.
        """
        self._hooks.remove()
        try:
            new = type(self).__new__(type(self))
            memo[id(self)] = new
            for name, value in self.__dict__.items():
                if name == "_compiler":  # shared: a copied backend is another one
                    object.__setattr__(new, name, value)
                elif name not in self._FRESH:
                    object.__setattr__(new, name, copy.deepcopy(value, memo))
            new._renew()  # noqa: SLF001 (a recorder's own)
        finally:
            self._hooks.place(list(self._plan.ends), list(self._plan.starts))
        return new

    def __getstate__(self) -> dict[str, Any]:
        """Return what ``pickle`` (and ``torch.save``) store of the recorder.

        The net, the table and the selection; not the records of the latest
        pass, nor the hooks (the unpickled recorder places its own).

        Raises
        ------
        TypeError
            For a recorder of a ``torch.compile``-d net, whose compiler
            cannot be pickled.
        """
        if self._compiler is not None:
            msg = (
                "Cannot pickle a Recorder of a torch.compile-d net: the "
                "compiler cannot be pickled. Save the net's weights "
                "(`torch.save(rnet.net.state_dict(), path)`) and the records "
                "(`scio_recorder.io.save_records(path, rnet.activations, "
                "rnet)`), then wrap the loaded net in a new Recorder."
            )
            raise TypeError(msg)
        return {k: v for k, v in self.__dict__.items() if k not in self._FRESH}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild an unpickled recorder: its own token, hooks and entry point."""
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        # The pickled hooks came back as inert ones: this recorder places its own.
        drop_copied_hooks(self._net)
        self._renew()

    def _renew(self) -> None:
        """Build the attributes of ``_FRESH`` and place the hooks (copies only)."""
        token = new_token()
        hooks = HookSet(self, token)
        object.__setattr__(self, "_token", token)
        object.__setattr__(self, "_hooks", hooks)
        object.__setattr__(self, "_latest", _Latest())
        object.__setattr__(self, "_deposits", GradDeposits())
        self._enter(self._compiler)
        object.__setattr__(self, "_scopes", [])
        object.__setattr__(self, "_warned_inplace", set())
        plan: CallPlan = self.__dict__["_plan"]
        key = traced_key(plan, token, self.__dict__["_deposits"])
        object.__setattr__(self, "_traced_key", key)
        hooks.place(list(plan.ends), list(plan.starts))

    def __repr__(self) -> str:
        """Return the torchinfo table and the recorded labels."""
        selection = self._selection
        table = repr(self.summary)
        extra = "".join(
            f"\nAlso recording {what}: {_labels(labels)}"
            for what, labels in (
                ("inputs", selection.inputs),
                ("gradients", selection.grads),
            )
            if labels
        )
        if selection.params:
            extra += f"\nAlso recording parameters: {', '.join(selection.params)}"
        return (
            "Recorder instance for the following network\n"
            + table
            + f"\nCurrently recording: {_labels(selection.outputs) or None}"
            + extra
            + "\n"
            + table[0] * table.find("\n")
        )


_MODULE_CALL = nn.Module.__call__
_GLOBAL_HOOKS = (
    _module_impl._global_forward_pre_hooks,  # noqa: SLF001 (what torch checks)
    _module_impl._global_forward_hooks,  # noqa: SLF001 (what torch checks)
    _module_impl._global_backward_pre_hooks,  # noqa: SLF001 (what torch checks)
    _module_impl._global_backward_hooks,  # noqa: SLF001 (what torch checks)
)
_TORCH_MODULE_FILE = os.path.normcase(inspect.getfile(nn.Module))
_PACKAGE_DIR = os.path.normcase(Path(__file__).parent)


def _user_stacklevel() -> int:
    """Return the ``stacklevel`` that points a warning at the user's code.

    Counts frames from the caller of this function up to the first one
    outside this package and outside torch's ``Module.__call__`` machinery.
    """
    level = 1
    frame = sys._getframe(1)  # noqa: SLF001 (the only way to walk the stack)
    while frame is not None:
        filename = os.path.normcase(frame.f_code.co_filename)
        if not filename.startswith(_PACKAGE_DIR) and filename != _TORCH_MODULE_FILE:
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


class _Records(dict[Any, Any]):
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
        raise KeyError(_missing_record(key, self._table(), self._kind)) from None


def _missing_record(key: object, table: LayerTable | None, kind: str) -> str:
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


class _Latest:
    """The records of the latest completed pass (a plain object: cheap to set)."""

    __slots__ = ("activations", "grads", "inputs", "traced_grads")

    def __init__(self) -> None:
        self.activations: dict[DepthIdx, Any] = {}
        self.inputs: dict[DepthIdx, CallInputs] = {}
        self.grads: dict[DepthIdx, GradSlot] = {}
        self.traced_grads: dict[DepthIdx, Any] = {}
        """Label -> what a compiled pass passed on (gradients: ``GradDeposits``)."""


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


def _labels(labels: tuple[DepthIdx, ...]) -> str:
    return ", ".join(f"{d}-{i}" for d, i in labels)


def _looks_like_label(value: object) -> bool:
    """Whether the reference Recorder would have taken ``value`` as a label."""
    return index_like(value) or (
        isinstance(value, tuple) and bool(value) and all(map(index_like, value))
    )


def _as_list(selectors: Selector | None) -> list[Selector]:
    if selectors is None:
        return []
    if isinstance(selectors, list | set | frozenset):
        return list(selectors)
    return [selectors]


def _make_plan(
    table: LayerTable,
    outputs: list[Layer],
    inputs: list[Layer],
    grads: list[Layer],
    options: RecordOptions,
) -> CallPlan:
    """Return the call plan that captures the given rows."""
    out_labels = {row.label for row in outputs}
    grad_labels = {row.label for row in grads}
    in_labels = {row.label for row in inputs}
    ends: dict[nn.Module, tuple[EndSpec | None, ...]] = {}
    starts: dict[nn.Module, tuple[DepthIdx | None, ...]] = {}
    describe: dict[nn.Module, str] = {}
    for row in (*outputs, *grads, *inputs):
        module = row.module
        if module in describe:
            continue
        calls = table.calls_of(module)
        if any(call.label in out_labels or call.label in grad_labels for call in calls):
            ends[module] = tuple(
                EndSpec(call.label, call.label in out_labels, call.label in grad_labels)
                if call.label in out_labels or call.label in grad_labels
                else None
                for call in table.call_plan(module)
            )
        if any(call.label in in_labels for call in calls):
            starts[module] = tuple(
                call.label if call.label in in_labels else None for call in calls
            )
        name = f"`{row.name}`" if row.name else "the whole net"
        describe[module] = (
            f"module {name} ({type(module).__name__}, "
            f"label{'s' if len(calls) > 1 else ''} "
            f"{', '.join(call.label_str for call in calls)})"
        )
    return CallPlan(
        ends, starts, describe, options, table.mode_description, len(out_labels)
    )


def _fake_reference(reference_tensors: str) -> bool:
    if reference_tensors not in {"real", "fake"}:
        msg = f'`reference_tensors` is "real" or "fake", got {reference_tensors!r}.'
        raise ValueError(msg)
    return reference_tensors == "fake"
