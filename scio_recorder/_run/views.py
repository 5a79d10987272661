"""What a recorder shows: its records, selection, table, and printed forms.

:class:`RecorderViews` is the base of :class:`~scio_recorder.Recorder` that
holds its read-only face: the records of the latest pass
(``activations``, ``inputs``, ``gradients``, by label or by selector), what
is selected, the layer table and its printed forms (the reference
``repr``, the compact table, HTML for Jupyter), and the execution graph of
one pass (which records nothing). It reads the recorder's
passes (:class:`~scio_recorder._engine.passes.Passes`) and selection,
which :class:`~scio_recorder.Recorder` sets; it changes nothing.
"""

from __future__ import annotations

__all__ = ["RecorderViews", "labels_text"]

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from torch import nn

from scio_recorder._engine.state import CallInputs, Records
from scio_recorder.layers import example_inputs
from scio_recorder.select import resolve

if TYPE_CHECKING:
    import torch
    from torch.nn.parameter import Parameter
    from torchinfo.model_statistics import ModelStatistics

    from scio_recorder._engine.passes import Passes
    from scio_recorder._engine.plan import RecordOptions, Selection
    from scio_recorder.graph import ExecutionGraph
    from scio_recorder.layers import DepthIdx, LayerTable
    from scio_recorder.select import Selector


def labels_text(labels: tuple[DepthIdx, ...]) -> str:
    """Return labels as printed: ``"1-1, 2-3"``."""
    return ", ".join(f"{d}-{i}" for d, i in labels)


class RecorderViews(nn.Module):
    """The read-only face of a :class:`~scio_recorder.Recorder` (its base)."""

    _passes: Passes
    _table: LayerTable
    _net: nn.Module
    _selection: Selection
    _params: dict[str, Parameter]
    _summary_kwargs: dict[str, Any]

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
        >>> from scio_recorder import Recorder
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
        from scio_recorder.graph import trace_graph  # noqa: PLC0415 (loaded when first used)

        if not args and not kwargs:
            args, kwargs = self.example_inputs()
        selection = self._selection
        recorded = {*selection.outputs, *selection.inputs, *selection.grads}
        with self._passes.suspended():  # an open scope ignores this pass
            return trace_graph(
                self._net,
                self._table,
                args,
                kwargs,
                recorded=recorded,
                depth=depth,
                roll=roll,
            )

    # -- views -------------------------------------------------------------

    def example_inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Return the inputs the table was built from, as ``(args, kwargs)``.

        Fresh random tensors of ``input_size`` (torchinfo's dtypes, batch
        dimension and device), or ``input_data``; ``rnet(*args, **kwargs)``
        then runs a pass like the reference pass.

        Examples
        --------
        >>> from scio_recorder import Recorder
        >>> from torch import nn
        >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(4, 3))
        >>> args, kwargs = rnet.example_inputs()
        >>> args[0].shape, kwargs
        (torch.Size([4, 3]), {})

        """
        return example_inputs(self._net, self._summary_kwargs)

    @property
    def steps(self) -> tuple[MappingProxyType[DepthIdx, Any], ...]:
        """The outputs recorded at each forward step of the latest :meth:`generate`.

        One read-only mapping label -> output per call of the net, in order
        (empty after any other pass).
        """
        table = self._table
        return tuple(
            MappingProxyType(Records(step, table, "activations"))
            for step in self._passes.latest.steps
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
        return self._passes.activations()

    @property
    def inputs(self) -> MappingProxyType[DepthIdx, CallInputs]:
        """Inputs of the latest pass: label -> ``CallInputs(args, kwargs)``.

        Taken when each selected call starts (see ``record(inputs=...)``).

        Examples
        --------
        >>> from scio_recorder import Recorder
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> rnet.record(inputs="2")  # penultimate features: input of the head
        >>> _ = rnet(torch.ones(4, 3))
        >>> rnet.inputs[(1, 3)].args[0].shape
        torch.Size([4, 2])

        """
        return self._passes.inputs()

    @property
    def gradients(self) -> MappingProxyType[DepthIdx, Any]:
        """Output gradients of the latest pass, filled in by ``backward()``.

        Label -> the gradient of the loss with respect to what that call
        passed on (same structure as the output; ``None`` where no gradient
        arrived). Empty until a pass with ``record(grads=...)``.

        Examples
        --------
        >>> from scio_recorder import Recorder
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> rnet.record(grads=(1, 1))
        >>> rnet(torch.ones(1, 3)).sum().backward()
        >>> rnet.gradients[(1, 1)].shape
        torch.Size([1, 2])

        """
        return self._passes.gradients()

    @property
    def params(self) -> MappingProxyType[str, Parameter]:
        """Parameters selected with ``record(params=...)``, by qualified name.

        Examples
        --------
        >>> from scio_recorder import Recorder
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
        return self._passes.plan.options

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
        >>> from scio_recorder import Recorder
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
        return self._records_of("activations", selector)

    def inputs_of(self, selector: Selector) -> tuple[CallInputs, ...]:
        """Return the latest pass's inputs of the rows ``selector`` picks.

        As :meth:`activations_of`, for inputs recorded with
        ``record(inputs=...)``.

        Examples
        --------
        >>> from scio_recorder import Recorder
        >>> import torch
        >>> from torch import nn
        >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
        >>> rnet.record(inputs="0")
        >>> _ = rnet(torch.ones(4, 3))
        >>> rnet.inputs_of("0")[0].args[0].shape
        torch.Size([4, 3])

        """
        return self._records_of("inputs", selector)

    def gradients_of(self, selector: Selector) -> tuple[Any, ...]:
        """Return the latest pass's output gradients of the rows ``selector`` picks.

        As :meth:`activations_of`, for gradients recorded with
        ``record(grads=...)`` (filled in by ``backward()``).

        Examples
        --------
        >>> from scio_recorder import Recorder
        >>> import torch
        >>> from torch import nn
        >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 2)), input_size=(1, 3))
        >>> rnet.record(grads="0")
        >>> rnet(torch.ones(4, 3)).sum().backward()
        >>> rnet.gradients_of("0")[0]
        tensor([[1., 1.],
                [1., 1.],
                [1., 1.],
                [1., 1.]])

        """
        return self._records_of("gradients", selector)

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
        return self._passes.hooks.modules

    def __repr__(self) -> str:
        """Return the torchinfo table and the recorded labels."""
        selection = self._selection
        table = repr(self.summary)
        extra = "".join(
            f"\nAlso recording {what}: {labels_text(labels)}"
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
            + f"\nCurrently recording: {labels_text(selection.outputs) or None}"
            + extra
            + "\n"
            + table[0] * table.find("\n")
        )

    def compact(self, width: int = 100, *, depth: int | None = None) -> str:
        """Return the layer table in at most ``width`` columns, recorded rows marked.

        :meth:`LayerTable.compact <scio_recorder.LayerTable.compact>` with a
        first column ``rec`` once something is recorded (``o`` output, ``i``
        input, ``g`` output gradient) and a footer saying what is recorded.
        ``print(rnet)`` (the reference table) is unchanged.

        Parameters
        ----------
        width : int
            The most characters a line may have (default 100).
        depth : int, optional
            Show rows down to this depth (default: the recorder's ``depth``).

        Examples
        --------
        >>> from scio_recorder import Recorder
        >>> from torch import nn
        >>> rnet = Recorder(
        ...     nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5)
        ... )
        >>> _ = rnet.record((1, 2))
        >>> print(rnet.compact())
        rec  label  name  type        output shape  params
        ---  -----  ----  ----------  ------------  ------
             0-1    -     Sequential  [1, 4]             -
             1-1    0     Linear      [1, 4]            24
        o    1-2    1     ReLU        [1, 4]             -
        Total params: 24 (trainable 24)
        3 rows; reference pass in eval mode
        Currently recording: outputs 1-2 (rec: o output)

        """
        from scio_recorder._support import render as _render  # noqa: PLC0415 (rendering only, kept out of the class's module header)

        selection = self._selection
        marks, notes = _render.selection_marks(
            selection.outputs, selection.inputs, selection.grads, selection.params
        )
        text = self._table.compact(width, depth=depth, marks=marks)
        lines = [line for note in notes for line in _render.wrap(note, width)]
        return "\n".join([text, *lines])

    def _repr_html_(self) -> str:
        """Return the compact table as HTML, recorded rows shaded (for Jupyter)."""
        from scio_recorder._support import render as _render  # noqa: PLC0415 (rendering only, kept out of the class's module header)

        selection = self._selection
        marks, notes = _render.selection_marks(
            selection.outputs, selection.inputs, selection.grads, selection.params
        )
        caption = f"Recorder of {type(self._net).__name__}. " + (
            " ".join(notes) if notes else "Currently recording: None"
        )
        return self._table.to_html(marks=marks, caption=caption)

    def _records_of(self, kind: str, selector: Selector) -> tuple[Any, ...]:
        """Return the latest records of ``kind`` of the rows ``selector`` picks."""
        labels = [row.label for row in resolve(self._table, self._net, [selector])]
        return self._passes.records_of(kind, labels, selector)  # type: ignore[no-any-return]
