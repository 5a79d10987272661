"""One forward pass, captured: every module call and every tensor operation.

:func:`capture` runs the net once and returns a :class:`Capture`: the module
calls (leaf or container), the tensor operations, the net's inputs and
outputs, and for each of them the producers of the tensors it consumed.
Views at any depth are derived from it afterwards (``_views``), so the pass
runs once whatever is drawn.

How it sees the pass, and why this way:

* **Operations** through a :class:`torch.overrides.TorchFunctionMode`,
  entered for this pass only (modes are per thread) and left in ``finally``:
  nothing in torch is patched, and Python-level tensor methods (``x.view``,
  ``x + y``, ``x[0]``) are seen too.
* **Module boundaries** through a wrapper set as the instance attribute
  ``forward`` of every submodule for the pass and removed in ``finally``, not
  through hooks: ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention``
  leave their fused fast path when any hook is attached to them, and the
  graph pass must not change which kernel runs. For the same reason, inside
  modules with such a fast path (in eval mode) operations are not traced
  (the mode would make torch take the slow path): their module calls are
  still seen, tensors made inside by untraced operations are attributed to
  the region's inputs, and the region's outputs to its last call.
* **Data flow** by tensor identity: each tensor produced is mapped to its
  producer in a weak-key identity dictionary (no tensor is kept alive, no
  id is reused).

Nothing is recorded into the recorder, no hook is added, ``requires_grad``
is never set, and the pass works under ``torch.no_grad()``.
"""

from __future__ import annotations

__all__ = ["Call", "Capture", "Op", "Source", "capture"]

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from scio_recorder._support.tree import tensor_items
from scio_recorder.layers import nested_size

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from scio_recorder.layers import DepthIdx, LayerTable

Source = tuple[str, int]
"""A producer: ``("input", i)``, ``("call", i)`` or ``("op", i)``."""

Shape = tuple[Any, ...]

_FAST_PATH: tuple[type[nn.Module], ...] = (
    nn.TransformerEncoder,
    nn.TransformerEncoderLayer,
    nn.MultiheadAttention,
)
"""Modules whose forward takes a fused path unless a torch function mode is on."""

_LOCK = threading.RLock()  # one capture at a time: forwards are patched


@dataclasses.dataclass
class Call:
    """One module call of the pass."""

    index: int
    module: nn.Module
    name: str
    type: str
    depth: int
    parent: int | None
    label: DepthIdx | None = None
    inputs: list[tuple[Source, Shape]] = dataclasses.field(default_factory=list)
    shapes: tuple[Shape, ...] = ()
    children: int = 0
    ended: bool = False
    untraced: bool = False
    last_child: int | None = None

    @property
    def leaf(self) -> bool:
        """Whether the call made no module call of its own."""
        return self.children == 0


@dataclasses.dataclass
class Op:
    """One tensor operation of the pass (a torch function or tensor method)."""

    index: int
    name: str
    owner: int | None
    inputs: list[tuple[Source, Shape]]
    shapes: tuple[Shape, ...]


@dataclasses.dataclass
class Capture:
    """Everything one pass did, in the order it happened."""

    inputs: list[tuple[str, Shape]]
    calls: list[Call]
    ops: list[Op]
    outputs: list[tuple[str, Source | None, Shape]]
    order: list[Source]
    failed: Source | None = None
    error: BaseException | None = None


def shape_of(tensor: Tensor) -> Shape:
    """Return the shape of ``tensor`` (sizes of a nested one, ragged dims marked)."""
    if tensor.is_nested:
        return tuple(nested_size(tensor))
    return tuple(int(n) for n in tensor.shape)


def flatten(value: Any, prefix: str) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(path, tensor)`` for every tensor inside ``value``.

    A path is ``prefix`` followed by ``.key`` for each level (see
    :func:`~scio_recorder._support.tree.tensor_items`).
    """
    for path, tensor in tensor_items(value):
        yield prefix + "".join(f".{key}" for key in path), tensor


def _op_name(func: Any) -> str:
    name = str(getattr(func, "__name__", None) or repr(func))
    if name == "__get__":  # a property such as `x.T`
        owner = getattr(func, "__self__", None)
        name = str(getattr(owner, "__name__", "get"))
    return name.strip("_") or name


class _Tracer(TorchFunctionMode):
    """The state of one capture: the mode, and the module-call bookkeeping."""

    def __init__(
        self, table: LayerTable | None, names: Mapping[nn.Module, str]
    ) -> None:
        super().__init__()
        self.table = table
        self.started: dict[int, int] = {}  # rows started per depth (no table)
        self.containers: set[str] = set()  # uncalled containers given a row
        self.all_names: dict[nn.Module, list[str]] = {}
        self.shared: dict[tuple[nn.Module, nn.Module], int] = {}
        self.names = names
        self.producers: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.calls: list[Call] = []
        self.ops: list[Op] = []
        self.order: list[Source] = []
        self.stack: list[int] = []
        self.ended: dict[nn.Module, int] = {}
        self.failed: Source | None = None

    # -- producers ---------------------------------------------------------
    def sources(self, args: Any, kwargs: Any) -> list[tuple[Source, Shape]]:
        """Return the producers of the tensors among ``args`` and ``kwargs``."""
        found: list[tuple[Source, Shape]] = []
        for _, tensor in flatten((args, kwargs), ""):
            source: Source | None = self.producers.get(tensor)  # type: ignore[no-untyped-call]
            if source is None:
                found.extend(self.region_inputs(tensor))
            else:
                found.append((source, shape_of(tensor)))
        return found

    def region_inputs(self, tensor: Tensor) -> list[tuple[Source, Shape]]:
        """Inside an untraced region, an unknown tensor came from its inputs."""
        for index in reversed(self.stack):
            call = self.calls[index]
            if call.untraced:
                shape = shape_of(tensor)
                return [(source, shape) for source, _ in call.inputs]
        return []  # a parameter, a buffer or a constant

    def produced(self, value: Any, source: Source, *, only_new: bool = False) -> None:
        for _, tensor in flatten(value, ""):
            if only_new and tensor in self.producers:
                continue
            self.producers[tensor] = source

    # -- operations --------------------------------------------------------
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``func``; note it as an operation when it returns tensors."""
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except BaseException:
            if self.failed is None:
                self.failed = self._new_op(func, args, kwargs, ())
            raise
        tensors = [t for _, t in flatten(out, "")]
        if tensors:
            source = self._new_op(func, args, kwargs, tuple(map(shape_of, tensors)))
            self.produced(out, source)
        return out

    def _new_op(
        self, func: Any, args: Any, kwargs: Any, shapes: tuple[Shape, ...]
    ) -> Source:
        index = len(self.ops)
        owner = self.stack[-1] if self.stack else None
        self.ops.append(
            Op(index, _op_name(func), owner, self.sources(args, kwargs), shapes)
        )
        self.order.append(("op", index))
        return ("op", index)

    # -- module calls ------------------------------------------------------
    def call(
        self, module: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        parent = self.stack[-1] if self.stack else None
        index = len(self.calls)
        name = self.names.get(module, "")
        call = Call(
            index,
            module,
            name,
            type(module).__name__,
            len(name.split(".")) if name else 0,
            parent,
            inputs=self.sources(args, kwargs),
            untraced=_may_take_a_fast_path(module),
        )
        if self.table is None:
            call.label = self._start_label(call, parent)
        if parent is not None:
            self.calls[parent].children += 1
        self.calls.append(call)
        self.order.append(("call", index))
        self.stack.append(index)
        try:
            if call.untraced:
                with torch._C.DisableTorchFunction():  # noqa: SLF001 (keeps the fast path)
                    out = forward(*args, **kwargs)
            else:
                out = forward(*args, **kwargs)
        except BaseException:
            if self.failed is None:
                self.failed = ("call", index)
            self._label(call)
            raise
        finally:
            self.stack.pop()
        self._label(call)
        call.ended = True
        call.shapes = tuple(shape_of(t) for _, t in flatten(out, ""))
        if parent is not None:
            self.calls[parent].last_child = index
        if call.leaf:
            self.produced(out, ("call", index))
        elif call.untraced and call.last_child is not None:
            # made by untraced operations after its last call: attribute them
            self.produced(out, ("call", call.last_child), only_new=True)
        return out

    def _start_label(self, call: Call, parent: int | None) -> DepthIdx:
        """Label a call at its start as the table would, from this pass alone.

        The table's rows are the module tree of the calls: a call sits one
        level under its calling module per name level between them, a
        container that is never called itself (a ``ModuleList``) holding a
        row of its own (the first time one of its modules is called); ``idx``
        counts rows per depth in start order.
        """
        if parent is None:
            depth = 0
        else:
            above = self.calls[parent]
            call.name = self._shared_name(call, above)
            base, depth = above.name, above.label[0] if above.label else 0
            prefix = f"{base}." if base else ""
            if call.name.startswith(prefix) and call.name != base:
                parts = call.name[len(prefix) :].split(".")
                for level in range(1, len(parts)):  # uncalled containers between
                    container = prefix + ".".join(parts[:level])
                    if container not in self.containers:
                        self.containers.add(container)
                        self._next_idx(depth + level)
                depth += len(parts)
            else:  # a module called from outside its parent: one level down
                depth += 1
        return (depth, self._next_idx(depth))

    def _shared_name(self, call: Call, above: Call) -> str:
        """Name a module registered at several paths by its call's rank.

        Its k-th call under the same calling module takes the k-th of its
        paths below that module, as the table's rows do.
        """
        names = self.all_names.get(call.module, [])
        if len(names) < 2:  # noqa: PLR2004 (shared: two paths or more)
            return call.name
        prefix = f"{above.name}." if above.name else ""
        below = [name for name in names if name.startswith(prefix)] or names
        key = (above.module, call.module)
        k = self.shared.get(key, 0)
        self.shared[key] = k + 1
        return below[k % len(below)]

    def _next_idx(self, depth: int) -> int:
        self.started[depth] = self.started.get(depth, 0) + 1
        return self.started[depth]

    def _label(self, call: Call) -> None:
        """Label the call as the table does: the k-th call of its module to end."""
        if self.table is None:  # labelled when it started
            return
        k = self.ended.get(call.module, 0)
        self.ended[call.module] = k + 1
        rows = self.table.calls_of(call.module)
        if k < len(rows):
            call.label = rows[k].label
            call.name = rows[k].name


def _may_take_a_fast_path(module: nn.Module) -> bool:
    """Return whether torch may run ``module`` through a fused kernel.

    Only the conditions on the mode and on autograd are checked here; the
    others are torch's to check.
    """
    if not isinstance(module, _FAST_PATH) or module.training:
        return False
    return not (
        torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())
    )


def _names(net: nn.Module) -> dict[nn.Module, str]:
    names: dict[nn.Module, str] = {}
    for name, module in net.named_modules(remove_duplicate=False):
        names.setdefault(module, name)
    return names


@dataclasses.dataclass
class _Patched:
    modules: list[tuple[nn.Module, Any]]


_ABSENT = object()


def _patch(net: nn.Module, tracer: _Tracer) -> _Patched:
    patched = _Patched([])
    for module in dict.fromkeys(net.modules()):
        previous = module.__dict__.get("forward", _ABSENT)
        forward = module.forward

        def wrapper(
            *args: Any,
            _module: nn.Module = module,
            _forward: Callable[..., Any] = forward,
            **kwargs: Any,
        ) -> Any:
            return tracer.call(_module, _forward, args, kwargs)

        module.__dict__["forward"] = wrapper
        patched.modules.append((module, previous))
    return patched


def _unpatch(patched: _Patched) -> None:
    for module, previous in patched.modules:
        if previous is _ABSENT:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = previous


def capture(
    net: nn.Module,
    table: LayerTable | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Capture:
    """Run ``net(*args, **kwargs)`` once and return what it did.

    Module calls are labelled by ``table`` (the Recorder's); without one,
    each call is labelled ``(depth, idx)`` at its start, ``depth`` its
    nesting depth (the net's own call is 0) and ``idx`` its rank among the
    calls started at that depth (from 1): the table's rule applied to this
    pass.

    The pass's exception, if any, is kept in :attr:`Capture.error` (not
    raised), with what ran before it.
    """
    tracer = _Tracer(table, _names(net))
    if table is None:
        for name, module in net.named_modules(remove_duplicate=False):
            tracer.all_names.setdefault(module, []).append(name)
    named_inputs = list(flatten(args, "input"))
    for key, value in kwargs.items():
        named_inputs.extend(flatten(value, key))
    if len(named_inputs) == 1 and named_inputs[0][0] == "input.0":
        named_inputs = [("input", named_inputs[0][1])]
    inputs = []
    for i, (name, tensor) in enumerate(named_inputs):
        inputs.append((name, shape_of(tensor)))
        tracer.producers[tensor] = ("input", i)
    error: BaseException | None = None
    out: Any = None
    with _LOCK:
        patched = _patch(net, tracer)
        try:
            with tracer:
                out = net(*args, **kwargs)
        except Exception as caught:  # noqa: BLE001 (kept, raised by the caller)
            error = caught
        finally:
            _unpatch(patched)
    outputs = []
    if error is None:
        named_out = list(flatten(out, "output"))
        if len(named_out) == 1:
            named_out = [("output", named_out[0][1])]
        for name, tensor in named_out:
            producer = tracer.producers.get(tensor)  # type: ignore[no-untyped-call]
            outputs.append((name, producer, shape_of(tensor)))
    return Capture(
        inputs, tracer.calls, tracer.ops, outputs, tracer.order, tracer.failed, error
    )
