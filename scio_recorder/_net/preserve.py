"""Leave a net as it was around the passes the library runs on its own.

The reference pass (:func:`torchinfo.summary` puts the whole net in one mode
and restores only the top module's flag), the graph pass and export run the
user's net for inspection; none of them may change it. :func:`preserved`
snapshots what such a pass can change and puts it back exactly, in
``finally``:

* the ``training`` flag of every submodule (set directly, without calling an
  overridden ``train()``), so a BatchNorm or Dropout frozen with ``.eval()``
  inside a net in train mode stays frozen;
* ``requires_grad`` of every parameter;
* every buffer: the same tensor object stays registered, and its values are
  copied back where the pass changed them in place (BatchNorm running
  statistics and ``num_batches_tracked`` in train mode). This costs a copy
  of the buffers for the duration of the pass;
* every parameter: the same object stays registered, with its values. A
  forward may write a parameter in place (a data-dependent initialization,
  Glow's ``ActNorm``: ``if not self.initialized: self.loc.data.copy_(...)``,
  which the static-flow check's forced branches run): a dispatch mode
  (:class:`ParameterWrites`) copies a parameter just before the first
  operator that writes its memory (through the parameter, ``.data`` or a
  view), and its values are copied back at the end; a parameter whose
  ``.data`` the pass rebinds gets its old tensor back, unless the pass moved
  it to another real device (torchinfo moves the net to the device it runs
  on, as the reference Recorder does: the move stays, for the buffers
  too). Only what is written is copied. Hooks may also swap parameters: accelerate's
  ``AlignDevicesHook`` (:func:`accelerate.cpu_offload`,
  :func:`accelerate.disk_offload`, :func:`accelerate.dispatch_model`) loads
  an offloaded module's weights from its ``weights_map`` before the module
  runs and registers new parameters on the ``meta`` device after it; a pass
  that raises inside such a module leaves its weights loaded. Whatever the
  pass did, the net keeps the very parameters it had;
* every module's plain attributes (the entries of its ``__dict__`` that are
  not parameters, buffers, submodules, hooks or ``nn.Module``'s own
  bookkeeping, such as ``self.safe = True`` set in a forward): an attribute
  set, rebound or deleted by the pass gets its old object back, and the
  contents of the mutable containers these attributes hold (``list``,
  ``dict``, ``set``, ``OrderedDict``, ``defaultdict``, ``deque``, and the
  attributes of ``SimpleNamespace`` and dataclass instances, such as a
  Hugging Face config), nested to any depth (through tuples too), are put
  back in place. Identities are kept: nothing is copied but the containers'
  lists of items (a config shared by many modules stays one object, the
  user's own). A module with lazy parameters keeps what its materialization
  set (``in_features``);
* the state of accelerate's hooks (the ``_hf_hook`` of each module): their
  attributes, and the contents of the dictionaries they hold (the map of tied
  weights loaded on a device, shared by all hooks, which a pass that raises
  inside a module leaves filled), and the values of buffers offloaded with
  ``offload_buffers=True`` (a CPU offload map hands the pass its own tensor,
  which a train-mode pass updates). The hooks are found by attribute, so
  accelerate is never imported.

Parameters are copied only when written; lazy parameters and buffers that
the pass materializes stay materialized. Passes that cannot write real
memory (a fake-tensor pass, a symbolic trace, ``torch.export``) run without
the dispatch mode (``preserved(net, writes=False)``).

What cannot be put back, because it lies outside the net's modules or is
not Python data: globals and module-level state (a counter in the net's
module, ``functools.cache`` entries, transformers' ``warning_once``
cache), files written and anything printed or logged, the state of other
objects a module holds (a logger, a tokenizer, a class instance that is not
a dataclass: the attribute gets the object back, not the object's
attributes), the values of tensors held as plain attributes or in
containers and written in place, parameter memory written from outside
torch's operators (``numpy()`` views, a C extension), the class of a
module (``__class__``), submodules registered or replaced by the pass, and
random states other than torch's (Python's ``random``, numpy's; the
static-flow check restores torch's, :mod:`scio_recorder._run.watch`).
"""

from __future__ import annotations

__all__ = [
    "ParameterWrites",
    "SavedBuffers",
    "placed_by_accelerate",
    "preserved",
    "unload_offloaded",
]

import collections
import contextlib
import dataclasses
import types
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parameter import is_lazy
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from torch import Tensor, nn


@contextlib.contextmanager
def preserved(net: nn.Module, *, writes: bool = True) -> Iterator[None]:
    """Restore the modes, parameters, buffers and accelerate hooks of ``net`` on exit.

    Parameters
    ----------
    net : torch.nn.Module
        The net whose submodules' ``training`` flags, parameters (the objects
        in their slots, their values and their ``requires_grad``), buffers,
        plain attributes (and the containers they hold) and accelerate
        hooks' state are put back as they were on entry.
    writes : bool, default True
        Watch the block's operators for writes to the parameters' memory
        (:class:`ParameterWrites`) and put the values back. ``False`` for
        blocks that write no real memory (fake tensors, tracing, export),
        where parameters keep only their objects and ``requires_grad``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    >>> _ = net[1].eval()
    >>> with preserved(net):
    ...     _ = net.train()(torch.rand(3, 2))
    >>> net.training, net[1].training, net[1].num_batches_tracked.item()
    (True, False, 0)
    >>> _ = net.train()(torch.rand(3, 2))  # a pass of its own changes the net
    >>> net[1].training
    True

    """
    restores = [
        _modes(net),
        _parameters(net),
        _attributes(net),
        _hooks(net),
        SavedBuffers(net).restore,
    ]
    guard = ParameterWrites(net) if writes else None
    try:
        with guard if guard is not None else contextlib.nullcontext():
            yield
    finally:
        for restore in restores:
            restore()
        if guard is not None:
            guard.restore()


def _modes(net: nn.Module) -> Callable[[], None]:
    """Snapshot every submodule's ``training`` flag; return its restorer."""
    flags = [(module, module.training) for module in net.modules()]

    def restore() -> None:
        for module, training in flags:
            module.training = training

    return restore


def _parameters(net: nn.Module) -> Callable[[], None]:
    """Snapshot each slot's parameter, its ``requires_grad`` and its ``.data``.

    ``.data`` is kept as an alias (no copy): a pass that rebinds it
    (``param.data = other``) gets the old tensor back.
    """
    params = [
        (module, name, param, param.requires_grad, param.data)
        for module in net.modules()
        for name, param in module._parameters.items()  # noqa: SLF001 (the slots themselves)
        if param is not None and not is_lazy(param)
    ]

    def restore() -> None:
        for module, name, param, requires_grad, data in params:
            if module._parameters.get(name) is not param:  # noqa: SLF001 (swapped in the pass)
                module._parameters[name] = param  # noqa: SLF001
            if not _moved(data, param.data) and not _same_tensor(param, data):
                param.data = data
            if param.requires_grad != requires_grad:
                param.requires_grad_(requires_grad)

    return restore


def _moved(before: Tensor, after: Tensor) -> bool:
    """Whether a tensor rebound by the pass was moved to another real device.

    torchinfo moves the net to the device it runs on (given ``device=``, or
    ``input_size`` alone where CUDA is available), as the reference
    Recorder does: ``module.to`` rebinds each parameter's ``.data`` and each
    buffer's slot, and that move stays, parameters and buffers together
    (``layers._reference._warn_if_moved`` says so). A tensor loaded from
    ``meta`` (accelerate's offload) or sent to it is not such a move: it is
    put back (a move to ``meta`` swaps the parameters themselves, which
    are put back too).
    """
    return not before.is_meta and not after.is_meta and after.device != before.device


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` still views ``b``'s memory the way it did (else it was rebound).

    ``True`` where either has no memory to compare (:func:`_storage_key`).
    """
    key_a, key_b = _storage_key(a), _storage_key(b)
    if key_a is None or key_b is None:
        return True
    return (
        key_a == key_b
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and a.dtype == b.dtype
    )


_PLAIN = (torch.Tensor, torch.nn.Parameter)

_WRITTEN: dict[Any, tuple[int, ...]] = {}
"""The positions of the arguments each operator seen so far writes (its schema's)."""


def _written_arguments(func: Any) -> tuple[int, ...]:
    known = _WRITTEN.get(func)
    if known is None:
        schema = func._schema  # noqa: SLF001 (the operator's declared aliasing)
        known = _WRITTEN[func] = tuple(
            index
            for index, argument in enumerate(schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write
        )
    return known


def _storage_key(tensor: Tensor) -> int | None:
    """Return the address of a tensor's memory, ``None`` where it has none here.

    Only plain tensors and parameters have one: a fake, functional or other
    subclass tensor (a fake pass's, torchao's) is not asked.
    """
    if type(tensor) not in _PLAIN or tensor.is_meta:
        return None
    try:
        key = tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 (no storage: fake, functional, a subclass)
        return None
    return key or None


class ParameterWrites(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Copy each parameter of a net before the first operator that writes it.

    A dispatch mode, entered for a pass of the library's own
    (:func:`preserved`): every operator whose schema writes an argument
    (``copy_``, ``add_``, ``fill_``, an ``out=``, foreach in-place ops) is
    checked for an argument sharing a parameter's memory, whether passed as
    the parameter, its ``.data`` or a view; that parameter's values are
    copied once, before the write. :meth:`restore` copies them back. Costs
    one Python call per operator; copies only what is written.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Linear(2, 2)
    >>> before = net.weight.detach().clone()
    >>> guard = ParameterWrites(net)
    >>> with guard, torch.no_grad():
    ...     _ = net.weight.data.mul_(0)  # a write through .data
    >>> guard.written()
    ['weight']
    >>> guard.restore()
    >>> torch.equal(net.weight, before)
    True

    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owners: dict[int, list[tuple[str, Tensor]]] = {}
        for name, param in net.named_parameters(remove_duplicate=True):
            key = None if is_lazy(param) else _storage_key(param)
            if key is not None:
                self.owners.setdefault(key, []).append((name, param))
        self.saved: dict[int, tuple[str, Tensor, Tensor]] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Copy the parameters ``func`` is about to write, then call it."""
        kwargs = kwargs or {}
        positions = _written_arguments(func) if self.owners else ()
        if positions:
            names = [a.name for a in func._schema.arguments]  # noqa: SLF001
            for index in positions:
                value = args[index] if index < len(args) else kwargs.get(names[index])
                for tensor in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(tensor, torch.Tensor):
                        self._save(tensor)
        return func(*args, **kwargs)

    def _save(self, tensor: Tensor) -> None:
        key = _storage_key(tensor)
        for name, param in self.owners.get(key, []) if key is not None else []:
            if id(param) not in self.saved:
                with torch.no_grad():
                    copy = param.detach().clone()
                self.saved[id(param)] = (name, param, copy)

    def written(self) -> list[str]:
        """Return the names of the parameters written so far, in order."""
        return [name for name, _, _ in self.saved.values()]

    def restore(self) -> None:
        """Copy the values of every parameter written back into it."""
        for _, param, copy in self.saved.values():
            if param.is_meta:  # moved to meta since: no values to put back
                continue
            values = copy.to(param.device)
            with torch.inference_mode(param.is_inference()), torch.no_grad():
                if not torch.equal(param, values):
                    param.copy_(values)
        self.saved.clear()


# torch wraps a mode's `__torch_dispatch__` in `torch._disable_dynamo`, which
# imports Dynamo on its first call (about a second): a pass of the library's
# own is never traced by Dynamo, so the function is put back as written (as
# for `_watch.Watch`).
ParameterWrites.__torch_dispatch__ = vars(ParameterWrites)[  # type: ignore[method-assign]
    "__torch_dispatch__"
].__wrapped__


_MODULE_OWN: frozenset[str] | None = None


def _module_own() -> frozenset[str]:
    """Return the ``__dict__`` keys of ``nn.Module`` itself (flags, slots, hooks).

    Plus ``_hf_hook``, whose state :func:`_hooks` puts back.
    """
    global _MODULE_OWN  # noqa: PLW0603 (computed once, on first use)
    if _MODULE_OWN is None:
        _MODULE_OWN = frozenset(vars(torch.nn.Module())) | {"_hf_hook"}
    return _MODULE_OWN


_MISSING = object()
_MAPPINGS = frozenset({dict, collections.OrderedDict, collections.defaultdict})
_CONTAINERS = _MAPPINGS | {list, collections.deque, set}
_PASS_THROUGH = frozenset({tuple, frozenset})


def _attributes(net: nn.Module) -> Callable[[], None]:
    """Snapshot every module's plain attributes and the containers they hold.

    A module whose parameters or buffers are lazy is left out: its
    materialization sets attributes (``in_features``) that must stay.
    """
    own = _module_own()
    modules = []
    contents = _Contents()
    for module in net.modules():
        if any(is_lazy(t) for t in _slots(module)):
            continue
        entries = {k: v for k, v in vars(module).items() if k not in own}
        modules.append((module, entries))
        for value in entries.values():
            contents.take(value)

    def restore() -> None:
        for module, entries in modules:
            current = vars(module)
            for key in [k for k in current if k not in own and k not in entries]:
                del current[key]
            for key, value in entries.items():
                if current.get(key, _MISSING) is not value:
                    current[key] = value
        contents.restore()

    return restore


def _slots(module: nn.Module) -> list[Any]:
    """Return the module's own parameters and buffers (``None`` slots included)."""
    return [*module._parameters.values(), *module._buffers.values()]  # noqa: SLF001 (the slots themselves)


class _Contents:
    """The items of every mutable container reachable from some values.

    Walks lists, deques, dicts (plain, ordered, default), sets, tuples and
    frozensets (which hold no state of their own but may hold containers),
    and the ``__dict__`` of ``SimpleNamespace`` and dataclass instances (the
    fields of a dataclass with ``slots=True``, which has none);
    everything else is an atom, kept by identity. Each container is noted
    once (shared and cyclic ones too), with its items as a list of the very
    objects it held: :meth:`restore` puts them back in place where they
    differ (compared by identity), so containers keep their identity and
    hold their old objects again.
    """

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.saved: list[tuple[Any, list[Any]]] = []
        self.slotted: list[tuple[Any, list[tuple[str, Any]]]] = []

    def take(self, value: Any) -> None:
        """Note the containers reachable from ``value`` and their items."""
        stack = [value]
        while stack:
            item = stack.pop()
            kind = type(item)
            if kind in _PASS_THROUGH:
                if id(item) not in self.seen:
                    self.seen.add(id(item))
                    stack.extend(item)
                continue
            instance = dataclasses.is_dataclass(item) and not isinstance(item, type)
            if instance and not hasattr(item, "__dict__"):  # slots=True
                if id(item) not in self.seen:
                    self.seen.add(id(item))
                    fields = [
                        (f.name, getattr(item, f.name, _MISSING))
                        for f in dataclasses.fields(item)
                    ]
                    self.slotted.append((item, fields))
                    stack.extend(value for _, value in fields)
                continue
            if kind is types.SimpleNamespace or instance:
                item, kind = vars(item), dict
            elif kind not in _CONTAINERS:
                continue
            if id(item) in self.seen:
                continue
            self.seen.add(id(item))
            if kind in _MAPPINGS:
                pairs = list(item.items())
                self.saved.append((item, pairs))
                stack.extend(v for _, v in pairs)
            else:
                items = list(item)
                self.saved.append((item, items))
                stack.extend(items)

    def restore(self) -> None:
        """Put back the items of every container noted, where they changed."""
        for container, items in self.saved:
            now = list(container.items() if isinstance(container, dict) else container)
            if len(now) == len(items) and all(
                _same(a, b) for a, b in zip(now, items, strict=True)
            ):
                continue
            container.clear()
            if isinstance(container, (dict, set)):
                container.update(items)
            else:
                container.extend(items)
        for instance, fields in self.slotted:
            for name, value in fields:
                if getattr(instance, name, _MISSING) is value:
                    continue
                if value is _MISSING:
                    object.__delattr__(instance, name)
                else:  # frozen ones too
                    object.__setattr__(instance, name, value)


def _same(a: Any, b: Any) -> bool:
    """Whether two items (or two ``(key, value)`` pairs) are the same objects."""
    if type(a) is tuple and type(b) is tuple and len(a) == len(b) == 2:  # noqa: PLR2004 (a pair)
        return a[0] is b[0] and a[1] is b[1]
    return a is b


class SavedBuffers:
    """Every buffer of a net as found: the object in its slot and a copy of its values.

    :func:`preserved` puts them back on exit; the self-check
    (:mod:`scio_recorder.checks`) puts them back before each pass it
    compares, and asks which ones a pass changed (:meth:`changed`). Lazy
    buffers are left out (a pass materializes them).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.BatchNorm1d(2))
    >>> saved = SavedBuffers(net)
    >>> _ = net(torch.rand(3, 2))
    >>> [name for name, _ in saved.changed()]
    ['0.running_mean', '0.running_var', '0.num_batches_tracked']
    >>> saved.restore()
    >>> saved.changed()
    []

    """

    def __init__(self, net: nn.Module) -> None:
        with torch.no_grad():
            self.saved = [
                (
                    f"{prefix}.{name}" if prefix else name,
                    module,
                    name,
                    buffer,
                    buffer.clone(),
                )
                for prefix, module in net.named_modules()
                for name, buffer in module._buffers.items()  # noqa: SLF001 (non-persistent ones too)
                if buffer is not None and not is_lazy(buffer)
            ]

    def restore(self) -> None:
        """Put every buffer back: the object in its slot, its values copied back."""
        for _, module, name, buffer, saved in self.saved:
            current = module._buffers.get(name)  # noqa: SLF001 (the slot)
            target = buffer
            if (
                current is not None
                and current is not buffer
                and _moved(buffer, current)
            ):
                target = current  # moved with the net (torchinfo's move): kept
            elif current is not buffer:  # reassigned in the pass
                module._buffers[name] = buffer  # noqa: SLF001
            # Compared, not told by `_version`: the batch norm kernels update
            # running statistics without bumping it.
            if target.is_meta:
                continue
            values = saved.to(target.device)
            if not torch.equal(target, values):
                with torch.inference_mode(target.is_inference()), torch.no_grad():
                    target.copy_(values)

    def changed(self) -> list[tuple[str, nn.Module]]:
        """Return the buffers changed since: reassigned, or changed in place.

        Each as its qualified name and its module. A buffer on ``meta``
        (offloaded: accelerate swaps it in and out at every call) is not
        looked at.
        """
        return [
            (qualified, module)
            for qualified, module, name, buffer, saved in self.saved
            if not buffer.is_meta
            and (
                module._buffers.get(name) is not buffer  # noqa: SLF001 (reassigned)
                or not torch.equal(buffer, saved)
            )
        ]


def placed_by_accelerate(net: nn.Module) -> bool:
    """Say whether accelerate placed ``net`` (a module of it has a ``_hf_hook``).

    Such a net must not be moved (``net.to(device)`` would undo its device
    map, and fails on offloaded parameters, which sit on the ``meta`` device).

    Examples
    --------
    >>> from torch import nn
    >>> placed_by_accelerate(nn.Linear(2, 2))
    False

    """
    return any(hasattr(module, "_hf_hook") for module in net.modules())


def unload_offloaded(net: nn.Module) -> list[str]:
    """Offload again the weights that an interrupted pass left loaded.

    accelerate's hook on an offloaded module loads its weights in
    ``pre_forward`` and puts them back on ``meta`` in ``post_forward``, both
    inside the module's ``forward``; a pass that stops inside that forward
    (an exception, an early exit from a submodule's hook under
    ``preload_module_classes``) skips ``post_forward`` and leaves the weights
    on the execution device until the module's next pass. This runs the
    skipped ``post_forward`` (with no output to move) of every offloading
    hook whose module still holds a parameter off ``meta``.

    Parameters
    ----------
    net : torch.nn.Module
        The net, placed by accelerate or not (then nothing is done).

    Returns
    -------
    list of str
        The qualified names of the modules put back.

    Examples
    --------
    >>> from torch import nn
    >>> unload_offloaded(nn.Linear(2, 2))
    []

    """
    unloaded = []
    for name, module in net.named_modules():
        hook = getattr(module, "_hf_hook", None)
        offloads = [
            h
            for h in _accelerate_hooks_of(module)
            if getattr(h, "offload", False)
            and getattr(h, "weights_map", None) is not None
        ]
        if hook is None or not offloads:
            continue
        recurse = any(getattr(h, "place_submodules", False) for h in offloads)
        if any(not p.is_meta for p in module.parameters(recurse=recurse)):
            hook.post_forward(module, None)
            unloaded.append(name)
    return unloaded


def _accelerate_hooks(net: nn.Module) -> list[Any]:
    """Return accelerate's hooks on the modules of ``net``, each once.

    A module's ``_hf_hook`` is one hook or a ``SequentialHook`` holding
    several in ``hooks``.
    """
    found = {
        id(hook): hook
        for module in net.modules()
        for hook in _accelerate_hooks_of(module)
    }
    return list(found.values())


def _accelerate_hooks_of(module: nn.Module) -> list[Any]:
    """Return the hooks in ``module._hf_hook`` (a ``SequentialHook`` unpacked)."""
    hooks: list[Any] = []
    stack = [getattr(module, "_hf_hook", None)]
    while stack:
        hook = stack.pop()
        if hook is not None:
            hooks.append(hook)
            stack.extend(reversed(getattr(hook, "hooks", ())))
    return hooks


def _hooks(net: nn.Module) -> Callable[[], None]:
    """Snapshot each accelerate hook's attributes and its dictionaries' contents.

    A dictionary is restored in place (hooks share the map of tied weights),
    with its nested dictionaries copied one level down (that map holds a
    dictionary of loaded copies per weight).
    """
    states = []
    offloaded = _offloaded_buffers(net)
    for hook in _accelerate_hooks(net):
        if not hasattr(hook, "__dict__"):  # not accelerate's: nothing to keep
            continue
        attributes = dict(vars(hook))
        contents = [
            (value, {key: _copy_dict(item) for key, item in value.items()})
            for value in attributes.values()
            if type(value) is dict
        ]
        states.append((hook, attributes, contents))

    def restore() -> None:
        for hook, attributes, contents in states:
            current = vars(hook)
            current.clear()
            current.update(attributes)
            for mapping, saved in contents:
                mapping.clear()
                for key, (item, inner) in saved.items():
                    if inner is not None:
                        item.clear()
                        item.update(inner)
                    mapping[key] = item
        for value, copy in offloaded:
            if not torch.equal(value, copy):
                with torch.no_grad():
                    value.copy_(copy)

    return restore


def _offloaded_buffers(net: nn.Module) -> list[tuple[Tensor, Tensor]]:
    """Return ``(value, copy)`` of each buffer offloaded by accelerate.

    With ``offload_buffers=True`` a buffer sits on ``meta`` and its values in
    the hook's ``weights_map``; a CPU offload map hands the pass that very
    tensor, so a train-mode pass updates BatchNorm statistics in the map (a
    disk map hands a fresh copy, which a pass cannot write back).
    """
    values: list[tuple[Tensor, Tensor]] = []
    with torch.no_grad():
        for module in net.modules():
            for hook in _accelerate_hooks_of(module):
                weights = getattr(hook, "weights_map", None)
                if weights is None or not getattr(hook, "offload", False):
                    continue
                recurse = bool(getattr(hook, "place_submodules", False))
                for name, buffer in module.named_buffers(recurse=recurse):
                    value = weights.get(name) if buffer.is_meta else None
                    if isinstance(value, torch.Tensor):
                        values.append((value, value.clone()))
    return values


def _copy_dict(value: Any) -> tuple[Any, dict[Any, Any] | None]:
    return (value, dict(value)) if type(value) is dict else (value, None)
