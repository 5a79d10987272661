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
  work.
"""

from __future__ import annotations

__all__ = ["CallPlanError", "InPlaceWarning", "Postprocessor", "Recorder"]

import warnings
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._hooks import (
    ACTIVE_PASSES,
    CallPlan,
    CallPlanError,
    HookSet,
    PassState,
    Postprocessor,
    RecordOptions,
)
from .layers import DepthIdx, LayerTable, build_table

if TYPE_CHECKING:
    from torch.nn.parameter import Parameter
    from torchinfo.model_statistics import ModelStatistics


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
        If true, refuse networks that :func:`torch.fx.symbolic_trace` cannot
        trace (data-dependent control flow). With ``False`` any network is
        accepted: every recording pass checks that each recorded module is
        called as often as in the reference pass, and raises otherwise, so a
        dynamic flow gives either the right activations or an error.
    **summary_kwargs
        Passed to :func:`torchinfo.summary`. ``input_data`` or ``input_size``
        is required. Defaults: ``col_names=("input_size", "output_size",
        "num_params", "params_percent")``, ``depth=inf``,
        ``row_settings=("var_names", "depth")``, ``verbose=0``. Use
        ``mode="train"`` to build the table in train mode.

    Raises
    ------
    ValueError
        If neither ``input_data`` nor ``input_size`` is given.
    RuntimeError
        If ``force_static_flow`` is true and the net cannot be traced.

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
    >>> print(repr(rnet).splitlines()[4])
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

    def __init__(
        self,
        net: nn.Module,
        /,
        *,
        force_static_flow: bool = True,
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
        self._net = net
        if force_static_flow:
            _check_static_flow(net)
        self._token = object()
        self._hooks = HookSet(self, self._token)
        self._table = build_table(net, _DEFAULT_SUMMARY_KWARGS | summary_kwargs)
        self._activations: dict[DepthIdx, Any] = {}
        self._warned_inplace: set[DepthIdx] = set()
        self.record()

    # -- selection -------------------------------------------------------

    def record(
        self,
        *depth_idxs: DepthIdx,
        clone: bool = False,
        detach: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Set the recorded layers (replacing the previous selection).

        Parameters
        ----------
        *depth_idxs : tuple of (int, int)
            Labels ``(depth, idx)`` of the layers to record, as printed in the
            table. Duplicates and order are ignored; no label records nothing.
        clone : bool, default False
            Record a copy of each output, taken before any postprocessor, so
            later in-place operations of the net cannot change it.
        detach : bool, default False
            Record outputs detached from the autograd graph.
        device : torch.device or str, optional
            Move records to this device (a copy from CUDA to CPU synchronises
            with the device, as any such copy does).
        dtype : torch.dtype, optional
            Cast floating records to this dtype.

        Raises
        ------
        ValueError
            If a label is not in the table or cannot be recorded; the
            selection is then left unchanged.

        Examples
        --------
        >>> from torch import nn
        >>> rnet = Recorder(
        ...     nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5)
        ... )
        >>> rnet.record((1, 2), (1, 1), (1, 2), clone=True)
        >>> rnet.recording
        ((1, 1), (1, 2))
        >>> rnet.record(1, 2)
        Traceback (most recent call last):
        ...
        ValueError: Following layers not found: {1, 2}. Did you mean `rnet.record((1, 2))`? Operation cancelled

        """  # noqa: E501 (doctest output)
        table = self._table
        wanted = set(depth_idxs)
        unknown = {
            label for label in wanted if not _is_label(label) or label not in table
        }
        if unknown:
            hint = ""
            if len(depth_idxs) == 2 and all(  # noqa: PLR2004 (a pair)
                isinstance(item, int) for item in depth_idxs
            ):
                hint = f"Did you mean `rnet.record({depth_idxs})`? "
            shown = "{" + ", ".join(map(repr, sorted(unknown, key=repr))) + "}"
            msg = f"Following layers not found: {shown}. {hint}Operation cancelled"
            raise ValueError(msg)
        refused = [
            table[label] for label in sorted(wanted) if not table[label].recordable
        ]
        if refused:
            lines = [f"- {row.describe()}: {row.reason}" for row in refused]
            children = self._recordable_children(refused)
            if children:
                lines.append(f"Record its submodules' calls instead, e.g. {children}.")
            msg = "These layers cannot be recorded:\n" + "\n".join(lines)
            msg += "\nOperation cancelled"
            raise ValueError(msg)
        if dtype is not None and not isinstance(dtype, torch.dtype):
            msg = f"`dtype` must be a `torch.dtype`, got {dtype!r}"
            raise TypeError(msg)
        options = RecordOptions(
            clone=bool(clone),
            detach=bool(detach),
            device=torch.device(device) if device is not None else None,
            dtype=dtype,
        )
        labels: dict[nn.Module, tuple[DepthIdx | None, ...]] = {}
        describe: dict[nn.Module, str] = {}
        for row in table.rows:
            if row.label not in wanted or row.module in labels:
                continue
            plan = table.call_plan(row.module)
            labels[row.module] = tuple(
                call.label if call.label in wanted else None for call in plan
            )
            calls = table.calls_of(row.module)
            name = f"`{row.name}`" if row.name else "the whole net"
            describe[row.module] = (
                f"module {name} ({type(row.module).__name__}, "
                f"label{'s' if len(calls) > 1 else ''} "
                f"{', '.join(call.label_str for call in calls)})"
            )
        self._plan = CallPlan(labels, describe, options, table.mode_description)
        self._recording = tuple(sorted(wanted))
        self._hooks.place(list(labels))

    def _recordable_children(self, refused: list[Any]) -> str:
        names = {row.name for row in refused}
        found = [
            f"`{row.label}`"
            for row in self._table.rows
            if row.recordable and any(row.name.startswith(f"{name}.") for name in names)
        ]
        return ", ".join(found[:3])

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
        RuntimeError
            If a recorded module is called more or fewer times than in the
            reference pass (labels would be wrong); no activations are kept.
        ValueError
            If ``activation_postproc`` is a list with too few items.

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
        net = self._net
        state = PassState(
            self._plan,
            activation_postproc,
            dont_record=dont_record,
            training=net.training,
        )
        states = ACTIVE_PASSES.get()
        token = ACTIVE_PASSES.set(
            {self._token: state} if states is None else {**states, self._token: state}
        )
        try:
            out = net(*args, **kwargs)
            state.check_counts()
        except BaseException:
            self._activations = {}
            raise
        finally:
            ACTIVE_PASSES.reset(token)
        self._activations = state.records
        if state.versions:
            self._check_versions(state)
        return out

    def _check_versions(self, state: PassState) -> None:
        for label, tensors in state.versions:
            if label in self._warned_inplace:
                continue
            if any(tensor._version != version for tensor, version in tensors):  # noqa: SLF001 (version counter)
                self._warned_inplace.add(label)
                row = self._table[label]
                msg = (
                    f"The record of layer {row.describe()} was modified in place "
                    "after it was recorded (e.g. by a later `inplace=True` "
                    f"operation): `rnet.activations[{label}]` no longer holds "
                    "that layer's output. Use `rnet.record(..., clone=True)` to "
                    "keep an exact copy. Shown once per layer and recorder."
                )
                warnings.warn(msg, InPlaceWarning, stacklevel=4)

    # -- views -------------------------------------------------------------

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
        return MappingProxyType(self._activations)

    @property
    def recording(self) -> tuple[DepthIdx, ...]:
        """The recorded labels, sorted."""
        return self._recording

    @property
    def recorded_modules(self) -> dict[DepthIdx, nn.Module]:
        """Recorded label -> its module, in table order."""
        wanted = set(self._recording)
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

    def __repr__(self) -> str:
        """Return the torchinfo table and the recorded labels."""
        recording = ", ".join(f"{d}-{i}" for d, i in self._recording)
        table = repr(self.summary)
        return (
            "Recorder instance for the following network\n"
            + table
            + f"\nCurrently recording: {recording or None}\n"
            + table[0] * table.find("\n")
        )


def _is_label(label: object) -> bool:
    return (
        isinstance(label, tuple)
        and len(label) == 2  # noqa: PLR2004 (a pair)
        and all(isinstance(item, int) and not isinstance(item, bool) for item in label)
    )


def _check_static_flow(net: nn.Module) -> None:
    """Refuse a net that :func:`torch.fx.symbolic_trace` cannot trace."""
    try:
        torch.fx.symbolic_trace(net)
    except Exception as error:
        msg = (
            "The control flow of the input network is not static: "
            "`torch.fx.symbolic_trace` cannot trace it (see traceback). Pass "
            "`force_static_flow=False` to accept it anyway: every pass then "
            "checks that recorded modules are called as in the reference pass "
            "and raises otherwise. See `help(Recorder)`"
        )
        raise RuntimeError(msg) from error
