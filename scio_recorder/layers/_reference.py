"""The reference pass: one forward of the net that labels every module call.

:func:`run_reference` runs :func:`torchinfo.summary` (patched for the pass:
:mod:`._torchinfo`) with a :class:`CallLog` of its own on every module,
which logs each call as it starts and ends and adds the container rows of
the labelling rule (the package's docstring); the package's
:func:`~scio_recorder.layers.build_table` turns the log into the table. The net is left
as it was (:func:`~scio_recorder._net.preserve.preserved`), torchinfo's global
cache too; a net placed by accelerate stays where it is
(:func:`reference_kwargs`). :func:`example_inputs` makes inputs like the
reference pass's, for later passes.
"""

from __future__ import annotations

__all__ = [
    "NOT_A_CALL_NOTE",
    "CallLog",
    "example_inputs",
    "reference_kwargs",
    "run_reference",
]

import contextlib
import dataclasses
import itertools
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torchinfo
import torchinfo.torchinfo as _torchinfo_impl
from torch import Tensor
from torchinfo.layer_info import prod

from scio_recorder._net.preserve import placed_by_accelerate, preserved
from scio_recorder._support.tree import iter_tensors

from ._hints import token_model_hint
from ._torchinfo import (
    SUMMARY_OPTIONS,
    Row,
    assign_params,
    restatistics,
    summary_patches,
)

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.hooks import RemovableHandle
    from torchinfo.model_statistics import ModelStatistics


_NOT_CALLED_NOTE = "(not called)"
NOT_A_CALL_NOTE = "(not a call)"


@dataclasses.dataclass
class _Call:
    """A module call logged during the reference pass."""

    info: Row
    name: str
    module: nn.Module
    call_index: int
    end_order: int | None = None


class CallLog:
    """Hooks on every module of a net that log its calls in order."""

    def __init__(self, net: nn.Module, batch_dim: int | None) -> None:
        self.net = net
        self.batch_dim = batch_dim
        self.names: dict[nn.Module, list[str]] = {}
        for name, module in net.named_modules(remove_duplicate=False):
            self.names.setdefault(module, []).append(name)
        # Rows in table order: call rows and inserted container rows.
        self.rows: list[Row] = []
        self.calls: dict[Row, _Call] = {}
        self.stack: list[_Call] = []
        self.hierarchy: dict[int, tuple[str, Row]] = {}  # depth -> name, row
        self.containers: dict[Row, str] = {}  # container row -> qualified name
        self.counts: dict[nn.Module, int] = {}
        self.ends = 0
        self.seen: set[int] = set()
        # The tensors of each call's inputs (when it starts) and output (when
        # it ends) with their version counters, compared once the pass is
        # over: a counter that moved means a later in-place operation
        # overwrote that record (see `overwritten`).
        self.watched: list[tuple[Row, str, list[Tensor], list[int]]] = []

    def install(self) -> list[RemovableHandle]:
        handles = []
        for module in self.names:
            handles.append(
                module.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
            )
            handles.append(module.register_forward_hook(self._hook))
        return handles

    def _pick_name(self, module: nn.Module) -> str:
        """Choose the qualified name of ``module`` for a call in context."""
        names = self.names[module]
        if len(names) == 1:
            return names[0]
        parent = self.stack[-1].name.split(".") if self.stack else []
        if parent == [""]:
            parent = []

        def score(name: str) -> tuple[bool, int]:
            owner = name.split(".")[:-1]
            common = 0
            for a, b in zip(owner, parent, strict=False):
                if a != b:
                    break
                common += 1
            return common == len(owner), common

        best = max(map(score, names))
        tied = [name for name in names if score(name) == best]
        # A module registered under several names of one parent (a ReLU at
        # positions 1 and 3 of a Sequential) takes them in turn, call by call.
        return tied[self.counts.get(module, 0) % len(tied)]

    def _new_row(self, name: str, module: nn.Module, depth: int) -> Row:
        var_name = name.rsplit(".", 1)[-1] if name else type(module).__name__
        parent = self.hierarchy.get(depth - 1)
        info = Row(var_name, module, depth, parent[1] if parent else None)
        info.calculate_num_params()
        info.check_recursive(self.seen)
        self.seen.add(info.layer_id)
        self.rows.append(info)
        self.hierarchy[depth] = (name, info)
        for deeper in [d for d in self.hierarchy if d > depth]:
            del self.hierarchy[deeper]
        return info

    def _pre_hook(self, module: nn.Module, args: object, kwargs: object) -> None:
        name = self._pick_name(module)
        parts = name.split(".") if name else []
        depth = len(parts)
        for d in range(1, depth):
            ancestor = ".".join(parts[:d])
            shown = self.hierarchy.get(d)
            if shown is None or shown[0] != ancestor:
                container = self.net.get_submodule(ancestor)
                row = self._new_row(ancestor, container, d)
                row.is_container = True
                self.containers[row] = ancestor
        info = self._new_row(name, module, depth)
        index = self.counts.get(module, 0)
        self.counts[module] = index + 1
        call = _Call(info, name, module, index)
        self.calls[info] = call
        self.stack.append(call)
        self._watch(info, "inputs", (args, kwargs))

    def _watch(self, info: Row, what: str, value: object) -> None:
        tensors = [t for t in iter_tensors(value) if not t.is_inference()]
        if tensors:
            versions = [t._version for t in tensors]  # noqa: SLF001 (version counter)
            self.watched.append((info, what, tensors, versions))

    def overwritten(self) -> dict[Row, frozenset[str]]:
        """Return, per call, what a later in-place operation overwrote; forget all."""
        found: dict[Row, set[str]] = {}
        for info, what, tensors, versions in self.watched:
            if [t._version for t in tensors] != versions:  # noqa: SLF001
                found.setdefault(info, set()).add(what)
        self.watched = []
        return {info: frozenset(whats) for info, whats in found.items()}

    def _hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        # The innermost open call of this module is the one ending.
        for position in range(len(self.stack) - 1, -1, -1):
            call = self.stack[position]
            if call.module is module:
                del self.stack[position]
                break
        else:  # pragma: no cover - torch pairs pre-hooks and hooks
            return
        info = call.info
        if info.contains_lazy_param:
            info.calculate_num_params()
        info.input_size, _ = info.calculate_size(inputs, self.batch_dim)
        info.output_size, elem_bytes = info.calculate_size(outputs, self.batch_dim)
        info.output_bytes = elem_bytes * prod(info.output_size)
        info.executed = True
        info.calculate_macs()
        call.end_order = self.ends
        self.ends += 1
        self._watch(info, "output", outputs)

    def unwind(self) -> None:
        """Forget calls left open; write the notes of rows that are not calls."""
        for call in self.calls.values():
            if call.end_order is None:
                call.info.note = "(no output)"
        for row in self.containers:
            row.note = (
                NOT_A_CALL_NOTE if row.module in self.counts else _NOT_CALLED_NOTE
            )
        self.stack.clear()


def example_inputs(
    net: nn.Module, summary_kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return ``(args, kwargs)`` for a pass like the reference pass.

    ``input_data`` is used as given; ``input_size`` makes random tensors as
    torchinfo does (same dtypes, batch dim and device); the summary's other
    keyword arguments that are not torchinfo options go to the net.

    Examples
    --------
    >>> from torch import nn
    >>> args, kwargs = example_inputs(nn.Linear(4, 2), {"input_size": (3, 4)})
    >>> [a.shape for a in args], kwargs
    ([torch.Size([3, 4])], {})

    """
    x, _ = _torchinfo_impl.process_input(
        summary_kwargs.get("input_data"),
        summary_kwargs.get("input_size"),
        summary_kwargs.get("batch_dim"),
        _input_device(net, summary_kwargs),
        summary_kwargs.get("dtypes"),
    )
    kwargs = {k: v for k, v in summary_kwargs.items() if k not in SUMMARY_OPTIONS}
    if isinstance(x, Mapping):
        return (), {**x, **kwargs}
    return tuple(x or ()), kwargs


def _input_device(net: nn.Module, summary_kwargs: Mapping[str, Any]) -> torch.device:
    """Return where ``input_size`` makes the example inputs.

    ``device`` if given, else the device of the net's first parameter or
    buffer that is not on the ``meta`` device (an offloaded one is), else CPU.
    """
    device = summary_kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for tensor in (*net.parameters(), *net.buffers()):
        if not tensor.is_meta:
            return tensor.device
    return torch.device("cpu")


def reference_kwargs(net: nn.Module, summary_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return torchinfo's arguments for a reference pass that leaves ``net`` in place.

    torchinfo moves the net to ``device`` when given and, when only
    ``input_size`` is, to the first parameter's CUDA device, or CUDA if
    available, or CPU. For a net placed by accelerate (``dispatch_model``,
    ``cpu_offload``, ``disk_offload``, ``from_pretrained(...,
    device_map=...)``) that would undo its device map, and it fails on
    offloaded parameters (on the ``meta`` device). For such a net,
    ``input_size`` becomes ``input_data`` made as torchinfo makes it, on the
    device of the first parameter or buffer not on ``meta`` (else CPU), which
    accelerate's hooks move to each module's execution device; ``device`` is
    refused. Any other net's arguments are returned as they are.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        Keyword arguments for :func:`torchinfo.summary`.

    Returns
    -------
    dict
        The arguments to give :func:`torchinfo.summary`.

    Raises
    ------
    ValueError
        If ``device`` is given for a net placed by accelerate.

    Examples
    --------
    >>> from torch import nn
    >>> reference_kwargs(nn.Linear(3, 2), {"input_size": (1, 3)})
    {'input_size': (1, 3)}

    """
    kwargs = summary_kwargs
    if not placed_by_accelerate(net):
        return kwargs
    device = kwargs.get("device")
    if device is not None:
        msg = (
            f"`device={device!r}` makes torchinfo move the net, which would undo "
            "accelerate's placement of this model (its modules have accelerate "
            "hooks, from `dispatch_model`, `cpu_offload`, `disk_offload` or "
            "`from_pretrained(..., device_map=...)`). Drop `device`: the "
            "reference pass leaves the model where it is (accelerate's hooks "
            "move the inputs to each module's execution device), or pass "
            "`input_data` on the device you want."
        )
        raise ValueError(msg)
    if kwargs.get("input_data") is not None or kwargs.get("input_size") is None:
        return kwargs
    kwargs = dict(kwargs)
    kwargs["input_data"], _ = _torchinfo_impl.process_input(
        None,
        kwargs.pop("input_size"),
        kwargs.get("batch_dim"),
        _input_device(net, kwargs),
        kwargs.pop("dtypes", None),
    )
    return kwargs


def run_reference(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    *,
    around: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> tuple[CallLog, dict[Row, frozenset[str]], ModelStatistics, str]:
    """Run the reference pass of ``net``; return what it saw.

    The call log (its rows, in table order), what a later in-place operation
    overwrote per call, torchinfo's statistics over the rows, and the mode
    (``"train"`` or ``"eval"``); :func:`~scio_recorder.layers.build_table`
    makes the table of them. ``net`` is left as it was.
    """
    if not {"input_size", "input_data"} & summary_kwargs.keys():
        msg = "You must provide `input_data` or `input_size`"
        raise ValueError(msg)
    kwargs = dict(reference_kwargs(net, summary_kwargs))
    if kwargs.get("cache_forward_pass"):
        warnings.warn(
            "`cache_forward_pass=True` is ignored by `Recorder`: torchinfo keys "
            "its cache by class name, so a cached pass could label the modules "
            "of another network. Drop the argument to silence this warning.",
            UserWarning,
            stacklevel=4,  # the recorder's caller (via build_table, table_of)
        )
    kwargs["cache_forward_pass"] = False
    verbose = kwargs.get("verbose", 0)
    kwargs["verbose"] = 0
    mode = "train" if str(kwargs.get("mode", "eval")) == "train" else "eval"

    log = CallLog(net, kwargs.get("batch_dim"))
    before = _first_device(net)
    name = type(net).__name__
    previous = _torchinfo_impl._cached_forward_pass.get(name)  # noqa: SLF001 (no public API)
    handles = log.install()
    try:
        with (
            preserved(net),
            summary_patches(log.rows),
            around() if around is not None else contextlib.nullcontext(),
        ):
            try:
                summary = torchinfo.summary(net, **kwargs)
            except RuntimeError as error:
                hint = token_model_hint(net, summary_kwargs, error)
                if hint is None:
                    raise
                raise RuntimeError(hint) from error
            # Read before the net's buffers and parameters are put back (in
            # place): only the pass's own in-place operations count.
            overwritten = log.overwritten()
    finally:
        for handle in handles:
            handle.remove()
        log.unwind()
        # torchinfo stores every pass in a global cache keyed by class name,
        # whatever `cache_forward_pass` says, overwriting the entry of any net
        # of the same class name: put back what was there, so our entry cannot
        # keep `net` alive (torchinfo issue 369) and other entries survive.
        cache = _torchinfo_impl._cached_forward_pass  # noqa: SLF001 (no public API)
        if previous is None:
            cache.pop(name, None)
        else:
            cache[name] = previous

    _warn_if_moved(net, before, kwargs)
    shared = assign_params(net, log.rows)
    statistics = restatistics(summary, log.rows, shared)
    if verbose:
        print(statistics)  # noqa: T201 (the user asked torchinfo to print)
    return log, overwritten, statistics, mode


def _first_device(net: nn.Module) -> torch.device | None:
    """Return the device of the net's first parameter or buffer (``None``: none)."""
    for tensor in itertools.chain(net.parameters(), net.buffers()):
        return tensor.device
    return None


def _warn_if_moved(
    net: nn.Module, before: torch.device | None, kwargs: Mapping[str, Any]
) -> None:
    """Warn when torchinfo moved ``net`` to another device that nobody asked for.

    Given ``input_size`` alone, torchinfo moves a CPU net to CUDA when CUDA is
    available (the reference ``Recorder`` too, so the move stays; a net
    placed by accelerate never moves, see :func:`reference_kwargs`).
    """
    after = _first_device(net)
    if before is None or after is None or after == before or "device" in kwargs:
        return
    msg = (
        f"Building the layer table moved the net from {before} to {after}: "
        "torchinfo does so when only `input_size` is given and a CUDA device is "
        "available (as the reference Recorder does), so inputs on "
        f"{before} no longer fit it. To keep the net where it is, pass "
        f"`device={str(before)!r}` or `input_data` (an example input on the "
        "device you want) instead of `input_size`."
    )
    warnings.warn(msg, UserWarning, stacklevel=5)  # the recorder's caller
