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
* every parameter: the same object stays registered. A forward pass does
  not write parameters, but hooks may swap them: accelerate's
  ``AlignDevicesHook`` (:func:`accelerate.cpu_offload`,
  :func:`accelerate.disk_offload`, :func:`accelerate.dispatch_model`) loads
  an offloaded module's weights from its ``weights_map`` before the module
  runs and registers new parameters on the ``meta`` device after it; a pass
  that raises inside such a module leaves its weights loaded. Whatever the
  pass did, the net keeps the very parameters it had;
* the state of accelerate's hooks (the ``_hf_hook`` of each module): their
  attributes, and the contents of the dictionaries they hold (the map of tied
  weights loaded on a device, shared by all hooks, which a pass that raises
  inside a module leaves filled), and the values of buffers offloaded with
  ``offload_buffers=True`` (a CPU offload map hands the pass its own tensor,
  which a train-mode pass updates). The hooks are found by attribute, so
  accelerate is never imported.

Parameters are not copied (a forward pass does not write them); lazy
parameters and buffers that the pass materializes stay materialized.
"""

from __future__ import annotations

__all__ = ["SavedBuffers", "placed_by_accelerate", "preserved", "unload_offloaded"]

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parameter import is_lazy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from torch import Tensor, nn


@contextlib.contextmanager
def preserved(net: nn.Module) -> Iterator[None]:
    """Restore the modes, parameters, buffers and accelerate hooks of ``net`` on exit.

    Parameters
    ----------
    net : torch.nn.Module
        The net whose submodules' ``training`` flags, parameters (the objects
        in their slots and their ``requires_grad``), buffers and accelerate
        hooks' state are put back as they were on entry.

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
    restores = [_modes(net), _parameters(net), _hooks(net), SavedBuffers(net).restore]
    try:
        yield
    finally:
        for restore in restores:
            restore()


def _modes(net: nn.Module) -> Callable[[], None]:
    """Snapshot every submodule's ``training`` flag; return its restorer."""
    flags = [(module, module.training) for module in net.modules()]

    def restore() -> None:
        for module, training in flags:
            module.training = training

    return restore


def _parameters(net: nn.Module) -> Callable[[], None]:
    """Snapshot which parameter sits in each slot, and its ``requires_grad``."""
    params = [
        (module, name, param, param.requires_grad)
        for module in net.modules()
        for name, param in module._parameters.items()  # noqa: SLF001 (the slots themselves)
        if param is not None and not is_lazy(param)
    ]

    def restore() -> None:
        for module, name, param, requires_grad in params:
            if module._parameters.get(name) is not param:  # noqa: SLF001 (swapped in the pass)
                module._parameters[name] = param  # noqa: SLF001
            if param.requires_grad != requires_grad:
                param.requires_grad_(requires_grad)

    return restore


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
            if module._buffers.get(name) is not buffer:  # noqa: SLF001 (a buffer reassigned in the pass)
                module._buffers[name] = buffer  # noqa: SLF001
            # Compared, not told by `_version`: the batch norm kernels update
            # running statistics without bumping it.
            if not buffer.is_meta and not torch.equal(buffer, saved):
                with torch.no_grad(), torch.inference_mode(buffer.is_inference()):
                    buffer.copy_(saved)

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
