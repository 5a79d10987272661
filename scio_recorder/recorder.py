"""The :class:`Recorder`: record and edit the outputs of layers of a net.

The public contract is the one of the reference ``scio`` Recorder (same
constructor, ``record``, ``forward``, ``activations``, ``recording``,
``recorded_modules``, ``recorded_params``, ``net``, ``summary`` and ``repr``),
so code written for it runs unchanged. On top of it:

* hooks sit only on modules with a selected call (see :mod:`._engine`);
* labels follow the calls of the reference pass (see :mod:`.layers`);
* each pass checks the call plan: every hooked module must be called exactly
  as often as the layer table says, or the pass raises and keeps nothing;
* records are exact by default: those a later in-place operation overwrites
  in the reference pass are copies, and any other in-place change warns;
* the state of a pass is local to it, so threads and nested recorders work;
* ``torch.compile(rnet, fullgraph=True)`` traces the whole recording pass
  into one graph, and :meth:`Recorder.export` exports it with the records as
  outputs (see :mod:`._engine.compiled` and ``docs/compile.md``);
* :func:`check` and :meth:`Recorder.check` check a recording job (see
  :mod:`.checks`, which they load when first used);
* language models: :meth:`Recorder.generate` runs the net's own method with
  a checked, edited pass per forward step, and edits can be keyed by layer
  (``activation_postproc={selector: fn}``, ``input_postproc=``).

This module is the face: construction, selection (resolved by
:mod:`.select` into a plan, :mod:`._engine.plan`) and the passes (run by the
recorder's :class:`~._engine.passes.Passes`, which holds its hooks and
latest records). What a recorder shows (its records, tables and printed
forms, the execution graph of a pass) is its base
:class:`~._views.RecorderViews`; how it is copied (deep copies, pickles) is
:class:`~._copies.RecorderCopies`.
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
    "check",
]

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.nn.modules import module as _module_impl

from ._engine.compiled import entry_point, export_records, unwrap_compiled
from ._engine.early import check_early_exit
from ._engine.hooks import drop_copied_hooks
from ._engine.passes import Passes
from ._engine.plan import (
    CallPlan,
    Edits,
    Postprocessor,
    RecordOptions,
    Selection,
    make_plan,
)
from ._engine.shards import Shards
from ._engine.state import CallInputs
from ._net.quantized import refuse_gradients
from ._run.batches import PaddingWatch
from ._run.copies import RecorderCopies
from ._run.flow import table_of
from ._support.errors import CallPlanError, InPlaceWarning
from .scope import Scope
from .select import (
    Selector,
    as_list,
    check_labels,
    resolve,
    resolve_callables,
    resolve_params,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from torch.nn.parameter import Parameter
    from typing_extensions import Self

    from .checks import CheckReport


_DEFAULT_SUMMARY_KWARGS: dict[str, Any] = {
    "col_names": ("input_size", "output_size", "num_params", "params_percent"),
    "depth": torch.inf,
    "row_settings": ("var_names", "depth"),
    "verbose": 0,
}


class Recorder(RecorderCopies):
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
        Refuse a net whose control flow depends on the data (the reference
        pass reads a tensor value into Python, and the value changes what
        the net computes); the error names the line. ``False`` accepts any
        net. Either way every pass checks the call plan, so a dynamic flow
        gives the right records or an error (``docs/guarantees.md``).
    reference_tensors : {"real", "fake"}, default "real"
        ``"fake"``: the reference pass runs on fake tensors (the same table,
        nothing computed), or on real ones with a warning where fake ones
        cannot run the net (``docs/labels.md``).
    shards : {"whole", "local"}, default "whole"
        For a tensor-parallel net: ``"whole"`` records and edits the
        unsharded layer's tensors, ``"local"`` each rank's piece
        (``docs/bigmodels.md``).
    **summary_kwargs
        Passed to :func:`torchinfo.summary`; ``input_data`` or ``input_size``
        is required. Defaults: ``col_names=("input_size", "output_size",
        "num_params", "params_percent")``, ``depth=inf``,
        ``row_settings=("var_names", "depth")``, ``verbose=0``;
        ``mode="train"`` builds the table in train mode. The net is left as
        it was (modes, ``requires_grad``, buffers).

    Raises
    ------
    ValueError
        If neither ``input_data`` nor ``input_size`` is given.
    RuntimeError
        If ``force_static_flow`` is true and the net's control flow depends on
        the data (see above).

    Warns
    -----
    InPlaceWarning, UserWarning
        As :meth:`forward`.

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
    _padding: PaddingWatch
    _passes: Passes
    _gate: _Gate
    monitor_scores: dict[str, torch.Tensor]
    """Each monitor's scores ``[B, N]`` of the latest monitored :meth:`generate`."""
    monitor_stops: torch.Tensor
    """The step at which each row was stopped (``stop_when``), ``-1``: never."""

    def __init__(
        self,
        net: nn.Module,
        /,
        *,
        force_static_flow: bool = True,
        reference_tensors: Literal["real", "fake"] = "real",
        shards: Literal["whole", "local"] = "whole",
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
        self._summary_kwargs = _DEFAULT_SUMMARY_KWARGS | summary_kwargs
        self._table = table_of(
            net,
            self._summary_kwargs,
            check_flow=force_static_flow,
            fake=_fake_reference(reference_tensors),
        )
        # A plain attribute: reading a submodule goes through the slower
        # `nn.Module.__getattr__`, and forward reads it on every pass.
        object.__setattr__(self, "_net_direct", net)
        object.__setattr__(self, "_padding", PaddingWatch())
        self._params: dict[str, Parameter] = {}
        self._selection = Selection()
        if shards not in {"whole", "local"}:
            msg = f'`shards` is "whole" or "local", got {shards!r}'
            raise ValueError(msg)
        self._shards = Shards.of(net) if shards == "whole" else None
        empty = CallPlan.empty(self._table.mode_description, self._shards)
        self._passes = Passes(self, self._table, empty, net)
        self._compiler = compiler
        self._enter(compiler)

    def _enter(self, compiler: Callable[[Any], Any] | None) -> None:
        """Set the entry point that Dynamo compiles (see ``entry_point``).

        With ``compiler`` (``Recorder(torch.compile(net))``), compile it as
        the net was: the whole pass is traced as one graph.
        """
        entry = entry_point(self, self._passes.token)
        object.__setattr__(self, "__call__", entry)
        object.__setattr__(self, "_gate", _Gate(self, self._passes))
        if compiler is not None:
            object.__setattr__(self, "_compiled_call_impl", compiler(entry))
            self._gate.compiled = True

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Compile the recorder's pass in place, as ``nn.Module.compile`` does.

        The arguments are those of :func:`torch.compile`; the recorder's own
        entry point is compiled (not the ``_call_impl`` every module shares).

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
        self._gate.compiled = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call :meth:`forward`, skipping ``nn.Module.__call__`` when it can.

        Hooks on the recorder, global hooks, tracing, Dynamo and
        ``rnet.compile()`` go through ``nn.Module.__call__``; otherwise its
        cost (comparable to a small layer's forward) is skipped, and an idle
        pass is the net's call itself. The checks read plain attributes
        (:class:`_Gate`).
        """
        # `torch.compiler.is_compiling()`, in one Python call instead of two:
        # Dynamo folds the function to True; non-strict export sets the flag.
        if _is_dynamo_compiling() or _COMPILER_FLAGS._is_compiling_flag:  # noqa: SLF001
            return _MODULE_CALL(
                self, *args, **kwargs
            )  # Dynamo traces torch's path best
        gate = self._gate
        if (
            gate.forward_hooks
            or gate.forward_pre_hooks
            or gate.backward_hooks
            or gate.backward_pre_hooks
            or gate.compiled
            or _GLOBAL_FORWARD_PRE_HOOKS
            or _GLOBAL_FORWARD_HOOKS
            or _GLOBAL_BACKWARD_PRE_HOOKS
            or _GLOBAL_BACKWARD_HOOKS
            or nn.Module.__call__ is not _MODULE_CALL
            or _tracing_state()
        ):
            if kwargs.get("early_exit") and gate.compiled:
                # said here: Dynamo would hide the message of `forward`'s refusal
                raise RuntimeError(_EARLY_EXIT_COMPILED)
            # Looked up now: `torch.fx` tracing patches `nn.Module.__call__`.
            return nn.Module.__call__(self, *args, **kwargs)
        if kwargs or gate.own_forward:
            return self._fast_forward(*args, **kwargs)
        passes = gate.passes
        if passes.idle:  # nothing recorded, edited or listened to
            return passes.net(*args)
        return passes.run(passes.net, args, kwargs, None, False)  # noqa: FBT003 (dont_record)

    _own_forward = False
    """Whether a subclass defines its own ``forward`` (``__call__`` calls it)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Let the fast path of ``__call__`` call a subclass's own ``forward``."""
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__:
            cls._fast_forward = cls.forward
            cls._own_forward = True

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
            The layers whose outputs are recorded into :attr:`activations`: a
            label ``(depth, idx)`` as printed, a qualified name (every call),
            ``(name, k)``, a module, a type, a predicate over rows, ...
            (:mod:`scio_recorder.select`). Duplicates and order are ignored;
            nothing records nothing.
        inputs : selector or list of selectors, optional
            Layers whose call inputs are recorded into :attr:`inputs`, as
            ``CallInputs(args, kwargs)`` taken when the call starts.
        grads : selector or list of selectors, optional
            Layers whose output gradients (after any postprocessor) are
            recorded into :attr:`gradients` during ``backward()``.
        params : selector or list of selectors, optional
            Modules (any selector) or parameter names (``"fc.weight"``) whose
            parameters :attr:`params` and :attr:`param_grads` show.
        clone : bool, default False
            Record copies of everything, taken before any postprocessor (not
            needed for exactness: ``docs/guarantees.md``).
        detach : bool, default False
            Record tensors detached from the autograd graph.
        device : torch.device or str, optional
            Move records to this device.
        dtype : torch.dtype, optional
            Cast floating-point records to this dtype.

        Raises
        ------
        ValueError
            If a selector matches nothing or a row that cannot be recorded,
            or gradients cannot be recorded (the selection is unchanged).
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
        if self._passes.listeners:
            msg = (
                "Cannot change the selection while a `rnet.scope()` is open: "
                "its records would mix two selections. Call `rnet.record(...)` "
                "before entering the scope."
            )
            raise RuntimeError(msg)
        net, table = self._net, self._table
        check_labels(table, selectors)
        outputs = resolve(table, net, selectors)
        input_rows = resolve(table, net, as_list(inputs))
        grad_rows = resolve(table, net, as_list(grads))
        if grad_rows:
            refuse_gradients(net, "`record(grads=...)`")
        if self._shards is not None:  # a sequence slice is not recorded as whole
            self._shards.refuse([*outputs, *input_rows, *grad_rows])
        param_map = resolve_params(table, net, as_list(params))
        if dtype is not None and not isinstance(dtype, torch.dtype):
            msg = f"`dtype` must be a `torch.dtype`, got {dtype!r}"
            raise TypeError(msg)
        options = RecordOptions(
            clone=bool(clone),
            detach=bool(detach),
            device=torch.device(device) if device is not None else None,
            dtype=dtype,
        )
        plan = make_plan(
            table,
            outputs,
            input_rows,
            grad_rows,
            options,
            shards=self._shards,
            grad_net=net,
        )
        self._selection = Selection(
            tuple(sorted(row.label for row in outputs)),
            tuple(sorted(row.label for row in input_rows)),
            tuple(sorted(row.label for row in grad_rows)),
            tuple(param_map),
        )
        self._params = param_map
        self._passes.select(plan)

    # -- the pass --------------------------------------------------------

    def forward(
        self,
        *args: Any,
        activation_postproc: Postprocessor
        | Sequence[Postprocessor]
        | Mapping[Selector, Postprocessor]
        | None = None,
        dont_record: bool = False,
        input_postproc: Mapping[Selector, Postprocessor] | None = None,
        early_exit: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Call the net, recording the selected layers and editing them.

        Parameters
        ----------
        *args, **kwargs
            Passed to the net.
        activation_postproc : Postprocessor, list of them, or dict, optional
            ``postproc(output) -> replacement output or None`` (``None``
            keeps it), run after recording: one callable for every recorded
            call, a list consumed one item per recorded call in the order
            their outputs are produced, or ``{selector: postproc}`` for those
            calls only, recorded or not (``docs/capture.md``, "Editing in
            flight").
        dont_record : bool, default False
            Record nothing (postprocessors still run).
        input_postproc : dict, optional
            ``{selector: fn}``: ``fn(first_input) -> replacement or None``
            edits the first positional input of those calls before the module
            runs; recorded inputs are taken before the edit.
        early_exit : bool, default False
            Stop the pass once every recorded call has happened and return
            ``None``; the records are those of a full pass. Refused when
            nothing is recorded, when gradients are selected, or when an input
            requires grad with autograd on; eager passes only
            (``docs/capture.md``, "Early exit").

        Returns
        -------
        Any
            What ``net(*args, **kwargs)`` returns; ``None`` with
            ``early_exit=True``.

        Raises
        ------
        CallPlanError
            If a recorded module is called more or fewer times than in the
            reference pass (labels would be wrong); no activations are kept.
        ValueError
            If ``activation_postproc`` is a list with too few items, an edit
            returns a replacement that does not fit what it replaces (naming
            the edit and the layer), or ``early_exit=True`` cannot apply.

        Warns
        -----
        InPlaceWarning
            If a record was modified in place after it was taken by an
            operation the reference pass did not run (once per label).
        UserWarning
            Once, when a left-padded batch without ``position_ids`` reaches a
            model with learned absolute positions (``docs/guarantees.md``).

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
        if not torch.compiler.is_compiling():
            return self._eager_forward(
                *args,
                activation_postproc=activation_postproc,
                dont_record=dont_record,
                input_postproc=input_postproc,
                early_exit=early_exit,
                **kwargs,
            )
        if early_exit:
            raise RuntimeError(_EARLY_EXIT_COMPILED)
        if self._edits(activation_postproc, input_postproc) is not None:
            msg = (
                "Edits given by selector (`activation_postproc` as a dict, "
                "`input_postproc`) run in eager passes only: give a callable "
                "or a list under `torch.compile`, or call the recorder uncompiled."
            )
            raise RuntimeError(msg)
        return self._passes.run_traced(
            self._net_direct, args, kwargs, activation_postproc, dont_record
        )

    def _edits(self, postproc: Any, input_postproc: Any) -> Edits | None:
        """Resolve edits given by selector to labels (``None``: none given)."""
        if input_postproc is None and (
            postproc is None or not isinstance(postproc, Mapping)
        ):  # `postproc is None` first: a compiled pass then guards no `Mapping`
            return None
        table, net = self._table, self._net
        outputs = postproc
        if isinstance(postproc, Mapping):
            outputs = resolve_callables(table, net, postproc, "activation_postproc")
        inputs = resolve_callables(table, net, input_postproc or {}, "input_postproc")
        return Edits(outputs, inputs)

    def _eager_forward(
        self,
        *args: Any,
        activation_postproc: Any = None,
        dont_record: bool = False,
        input_postproc: Mapping[Selector, Postprocessor] | None = None,
        early_exit: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run :meth:`forward` outside Dynamo (``__call__``'s fast path, checked)."""
        edits = None
        if input_postproc is not None or isinstance(activation_postproc, Mapping):
            edits = self._edits(activation_postproc, input_postproc)
        if early_exit:
            check_early_exit(
                self._selection, args, kwargs, dont_record=dont_record, value=early_exit
            )
        if "attention_mask" in kwargs and not self._padding.done:
            self._padding.see(self._net_direct, kwargs)
        return self._passes.run(
            self._net_direct,
            args,
            kwargs,
            activation_postproc,
            dont_record,
            edits,
            early_exit,
        )

    _fast_forward = _eager_forward
    """What ``__call__``'s fast path runs (a subclass's own ``forward``)."""

    def check(
        self,
        batch: Any,
        *,
        layers: Any = None,
        rows: int = 8,
        dtype_copy: bool = True,
        batch_dim: int | None = None,
    ) -> CheckReport:
        """Check this recording job on ``batch``: see :func:`scio_recorder.check`.

        The checked calls are ``layers``, else the selection, else every
        recordable call.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
        >>> Recorder(net, input_size=(1, 3)).check(torch.randn(4, 3)).failed
        ()

        """
        from .checks import check_recorder  # noqa: PLC0415 (loaded when first used)

        options = {"layers": layers, "rows": rows, "dtype_copy": dtype_copy}
        return check_recorder(self, batch, **options, batch_dim=batch_dim)

    def generate(  # noqa: PLR0913 (the recorder's options, then the monitors)
        self,
        *args: Any,
        activation_postproc: Any = None,
        dont_record: bool = False,
        input_postproc: Mapping[Selector, Postprocessor] | None = None,
        early_exit: bool = False,
        monitors: Mapping[str, Any] | None = None,
        stop_when: Mapping[str, Any] | None = None,
        on_step: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run the net's own ``generate``, recording and editing every forward step.

        :meth:`call_method` with ``"generate"``: each forward call (the
        prefill, then one per decoded token) is a checked pass, edited as in
        :meth:`forward`; :attr:`steps` holds every step's records
        (``docs/transformers.md``).

        ``monitors={name: detector}`` (detectors built with ``token="each"``,
        or :class:`~scio_recorder.ood.Surprisal`) scores every step, with the
        KV cache on, into ``self.monitor_scores[name]`` ``[B, new_tokens]``;
        ``stop_when={name: threshold}`` stops the rows whose score crosses
        it (``self.monitor_stops``: the step each row stopped at, -1 never);
        ``on_step`` is called after each step with a
        :class:`~scio_recorder._run.monitors.MonitorStep` and may return the
        rows to stop (:mod:`scio_recorder._run.monitors`).

        Returns
        -------
        Any
            What ``net.generate(*args, **kwargs)`` returns.

        Raises
        ------
        CallPlanError
            Naming the forward step whose calls differ from the plan.
        ValueError
            With ``early_exit=True`` (generation needs every step's logits).

        Examples
        --------
        >>> import torch, transformers
        >>> config = transformers.GPT2Config(
        ...     n_layer=1, n_embd=8, n_head=2, vocab_size=20
        ... )
        >>> model = transformers.GPT2LMHeadModel(config).eval()
        >>> ids = torch.tensor([[1, 2, 3]])
        >>> rnet = Recorder(model, input_data={"input_ids": ids})
        >>> rnet.record("transformer.h.0")
        >>> out = rnet.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
        >>> len(rnet.steps), out.shape
        (3, torch.Size([1, 6]))

        """
        if monitors is not None or stop_when is not None or on_step is not None:
            from ._run.monitors import generate_monitored  # noqa: PLC0415 (when used)

            return generate_monitored(
                self,
                args,
                kwargs,
                monitors=monitors or {},
                stop_when=stop_when,
                on_step=on_step,
                options={
                    "activation_postproc": activation_postproc,
                    "dont_record": dont_record,
                    "input_postproc": input_postproc,
                    "early_exit": early_exit,
                },
            )
        return self.call_method(
            "generate",
            *args,
            activation_postproc=activation_postproc,
            dont_record=dont_record,
            input_postproc=input_postproc,
            early_exit=early_exit,
            **kwargs,
        )

    def call_method(
        self,
        name: str,
        /,
        *args: Any,
        activation_postproc: Any = None,
        dont_record: bool = False,
        input_postproc: Mapping[Selector, Postprocessor] | None = None,
        early_exit: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run a method of the net that calls its forward, one pass per call.

        See :meth:`generate`, which is ``call_method("generate", ...)``; any
        method (``net.sample``, a beam search) runs the same way.

        Raises
        ------
        AttributeError
            If the net has no such method.
        ValueError
            With ``early_exit=True``: the method needs every step's output.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> class Twice(nn.Sequential):
        ...     def twice(self, x):
        ...         return self(self(x))
        >>> rnet = Recorder(Twice(nn.Linear(2, 2)), input_size=(1, 2))
        >>> rnet.record((1, 1))
        >>> _ = rnet.call_method("twice", torch.ones(1, 2))
        >>> len(rnet.steps)
        2

        """
        if early_exit:
            msg = (
                f"`rnet.{name}(..., early_exit=True)` is refused: `{name}` "
                "needs the output of every forward step it makes (`generate`: "
                "the logits of each step), so no step may stop early. Drop "
                "`early_exit`."
            )
            raise ValueError(msg)
        method = getattr(self._net, name, None)
        if not callable(method):
            msg = (
                f"The net ({type(self._net).__name__}) has no method {name!r}: "
                "`rnet.call_method` runs a method of the net, e.g. `generate`."
            )
            raise AttributeError(msg)  # noqa: TRY004 (what getattr raises)
        edits = self._edits(activation_postproc, input_postproc)
        postproc = activation_postproc if edits is None else edits
        return self._passes.run_steps(
            self._net, method, args, kwargs, postproc, dont_record, name
        )

    def scope(
        self,
        reduce: Any = "all",
        *,
        condition: Callable[[], object] | None = None,
        inputs: Any = "all",
        input_args: int | str | Sequence[int | str] | None = None,
    ) -> Scope:
        """Accumulate the records of every pass while a ``with`` block is open.

        Every pass of the net in this thread, through the recorder or a direct
        call of the net, is checked and its records fed to one reducer per
        label and kind (``docs/capture.md``).

        Parameters
        ----------
        reduce : str, callable or Reducer, or a dict of them per label
            How outputs (and output gradients) are reduced across passes:
            ``"all"`` keeps every record; ``"sum"``, ``"mean"``, ``"max"``,
            ``"min"`` elementwise; ``(acc, new) -> acc`` folds; a
            :class:`~scio_recorder.reduce.Reducer` (a fresh copy per label).
        condition : callable, optional
            ``condition() -> bool``, asked once per pass: its records are kept
            only when true (``scope.passes`` counts every pass, ``scope.kept``
            the kept ones).
        inputs : str, callable or Reducer, or a dict of them per label
            How recorded inputs are reduced, as ``reduce``; ``"all"`` keeps
            each ``CallInputs``, anything else one argument per call.
        input_args : int, str or a sequence of them, optional
            Which arguments ``inputs`` reduces (default: the first tensor); a
            sequence makes ``scope.inputs[label]`` a dict argument -> result.

        Returns
        -------
        Scope
            ``scope[label]`` the reduced result, ``scope.count[label]`` the
            records reduced, ``scope.inputs[label]`` the inputs.

        Raises
        ------
        ValueError, TypeError
            For an unknown reduction or a bad ``input_args``, or an argument
            that a call does not receive (at that pass).

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
        return Scope(self, self._passes, reduce, condition, inputs, input_args)

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

        The previous selection and record options come back on exit, also
        after an exception (what ``collect``, the detectors and ``explain``
        use, so that a user's selection survives).

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
        previous = self._selection, self._params, self._passes.plan
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
        finally:  # the saved plan comes back as it was: nothing is resolved again
            self._selection, self._params, plan = previous
            self._passes.select(plan)

    def export(
        self,
        *args: Any,
        activation_postproc: Postprocessor | Sequence[Postprocessor] | None = None,
        strict: bool = False,
        dynamic_shapes: Any = None,
        **kwargs: Any,
    ) -> torch.export.ExportedProgram:
        """Export the pass, with the records as outputs, through :func:`torch.export.export`.

        The program returns ``(output, activations)`` (labels as strings,
        ``"2-1"``), and ``inputs`` third when inputs are recorded: records
        without Python hooks (``docs/compile.md``). The net is left as it was.

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
        return export_records(
            self,
            self._net,
            args,
            kwargs,
            grads=self._selection.grads,
            postproc=activation_postproc,
            strict=strict,
            dynamic_shapes=dynamic_shapes,
        )


def check(  # noqa: PLR0913 (the net, the batch, then keyword-only options)
    net: nn.Module,
    batch: Any,
    *,
    layers: Any = None,
    rows: int = 8,
    dtype_copy: bool = True,
    batch_dim: int | None = None,
    **recorder_kwargs: Any,
) -> CheckReport:
    """Check a recording job: run ``net`` on ``batch`` a few ways and compare.

    Wraps ``net`` in a :class:`Recorder` (``recorder_kwargs``; ``batch`` is
    the reference input unless one is given) and runs the checks of
    :mod:`scio_recorder.checks` (``docs/trusting.md``). A recorder given as
    ``net`` is checked as it is (``net.check(batch, ...)``).

    Parameters
    ----------
    net : torch.nn.Module
        The model, in the mode you run it in.
    batch : tensor, mapping or tuple
        What you call the net with: a tensor (the one input), a mapping
        (keyword arguments), a tuple (positional ones) or a ``CallInputs``.
    layers : selector or list of selectors, optional
        The calls to check; default: every recordable call.
    rows : int, default 8
        How many rows to run alone (the most padded first).
    dtype_copy : bool, default True
        Compare with a copy of the model in a wider dtype; ``False`` skips it.
    batch_dim : int, optional
        The inputs' batch dimension; default: 0, unless a sequence-first
        module shows otherwise (then the batch check says it cannot split).
    **recorder_kwargs
        Passed to :class:`Recorder` (not with a recorder as ``net``).

    Returns
    -------
    CheckReport
        One line per check, a read-only mapping of check name to line;
        ``report.failed``, ``report.warned``; printed, a table.

    Raises
    ------
    ValueError
        An empty batch (no row on its batch dimension), or records that
        hold no value: every comparison would be over nothing.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4), nn.ReLU(True))
    >>> check(net.eval(), torch.randn(6, 2, 8)).warned  # the ReLU overwrites 1-2
    ('inplace',)
    >>> check(net.train(), torch.randn(6, 2, 8)).failed  # batch statistics
    ('batch',)

    """
    from .checks import check_net  # noqa: PLC0415 (loaded when first used)

    options = {"layers": layers, "rows": rows, "dtype_copy": dtype_copy}
    options |= {"batch_dim": batch_dim}
    return check_net(Recorder, net, batch, options, recorder_kwargs)


_EARLY_EXIT_COMPILED = (
    "`early_exit=True` runs in eager passes only (a compiled graph runs "
    "whole): call the recorder uncompiled to stop after the last recorded call."
)


class _Gate:
    """What ``Recorder.__call__`` reads on every call, as plain attributes.

    A recorder's own attributes are read through ``nn.Module``'s attribute
    machinery (it defines ``__getattr__``), about five times slower than an
    attribute of a plain object; the hook dicts are the recorder's very
    dicts (``nn.Module`` never replaces them).
    """

    __slots__ = (
        "backward_hooks",
        "backward_pre_hooks",
        "compiled",
        "forward_hooks",
        "forward_pre_hooks",
        "own_forward",
        "passes",
    )

    def __init__(self, recorder: Recorder, passes: Passes) -> None:
        self.forward_hooks = recorder._forward_hooks  # noqa: SLF001 (what torch checks)
        self.forward_pre_hooks = recorder._forward_pre_hooks  # noqa: SLF001
        self.backward_hooks = recorder._backward_hooks  # noqa: SLF001
        self.backward_pre_hooks = recorder._backward_pre_hooks  # noqa: SLF001
        self.compiled = recorder.__dict__.get("_compiled_call_impl") is not None
        self.own_forward = recorder._own_forward  # noqa: SLF001 (its class's)
        self.passes = passes


_MODULE_CALL = nn.Module.__call__
_GLOBAL_FORWARD_PRE_HOOKS = _module_impl._global_forward_pre_hooks  # noqa: SLF001 (what torch checks)
_GLOBAL_FORWARD_HOOKS = _module_impl._global_forward_hooks  # noqa: SLF001
_GLOBAL_BACKWARD_PRE_HOOKS = _module_impl._global_backward_pre_hooks  # noqa: SLF001
_GLOBAL_BACKWARD_HOOKS = _module_impl._global_backward_hooks  # noqa: SLF001
_is_dynamo_compiling = getattr(
    torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling
)
"""Bound once (Dynamo knows the function, not the path to it)."""


class _CompilingFlag:
    """``torch.compiler``'s flag, for a torch that has none (reads the function)."""

    @property
    def _is_compiling_flag(self) -> bool:
        return bool(torch.compiler.is_compiling())


_COMPILER_FLAGS: Any = (
    torch.compiler
    if hasattr(torch.compiler, "_is_compiling_flag")
    else _CompilingFlag()
)
"""Where ``torch.compiler.is_compiling()`` reads whether export or compile runs."""
_tracing_state = torch._C._get_tracing_state  # noqa: SLF001 (what torch checks)


def _fake_reference(reference_tensors: str) -> bool:
    if reference_tensors not in {"real", "fake"}:
        msg = f'`reference_tensors` is "real" or "fake", got {reference_tensors!r}.'
        raise ValueError(msg)
    return reference_tensors == "fake"
