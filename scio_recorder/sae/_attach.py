"""An SAE installed in the net for a ``with`` block: :func:`attach`.

``activation_postproc={label: sp}`` splices an SAE into the passes one
calls; ``collect``, ``patch_sweep``, the OoD detectors and
``activations.write`` run their own passes and take no postprocessor.
:func:`attach` installs the same postprocessors in the net itself for a
``with`` block, as forward hooks (and pre-hooks, for inputs) on the
modules of the selected calls: every pass of the net inside the block,
whoever runs it, is spliced.

A :class:`~scio_recorder.sae.Splice` is also added to the spliced module
as a child (``name``, default ``"sae"``), whose own child ``latents``
(an identity) outputs the latents: a recorder made inside the block lists
the row ``"<module>.sae.latents"``, so the latents are a layer that
``collect`` reduces, a detector reads (an OoD score on SAE latents) and
``activations.write`` stores. On exit the hooks and the children are
removed and the net is as it was.

Why hooks and a child module: the recorder's own hooks only run in its
passes; plain hooks run in all of them, and a child module called in the
hook is what torchinfo (and so a recorder's table) sees as a call.
"""

from __future__ import annotations

__all__ = ["attach"]

import contextlib
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from scio_recorder.collect import InputOf
from scio_recorder.select import resolve_one

from ._splice import Splice

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from torch.utils.hooks import RemovableHandle

    from scio_recorder.layers import Layer
    from scio_recorder.recorder import Recorder


class _Attached(nn.Module):
    """The child of a spliced module: calls the splice, latents through ``latents``."""

    def __init__(self, splice: Splice) -> None:
        super().__init__()
        self.latents = nn.Identity()
        # Not a submodule: the SAE's parameters stay out of the net's.
        self.__dict__["splice"] = splice

    def forward(self, output: Any) -> Any:
        splice: Splice = self.__dict__["splice"]
        return splice.apply(output, through=self.latents)


class _Counts(threading.local):
    """Per thread: the calls of each hooked module since the net's last root call.

    Keyed by target (one per selector given): ``calls[key]`` counts the
    calls of its module started; ``open[key]`` holds, for each call started
    and not ended, whether it is edited.
    """

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}
        self.open: dict[int, list[bool]] = {}


def _check_name(name: object) -> str | None:
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        msg = (
            f"`name` must be a Python identifier (a module's name) or None, got "
            f"{name!r}."
        )
        raise ValueError(msg)
    return name


def _holds_child(module: nn.Module, name: str | None) -> bool:
    """Whether the latents' child is added to ``module`` (see :func:`attach`)."""
    return name is not None and not isinstance(module, nn.Sequential)


@contextlib.contextmanager
def attach(
    rnet: Recorder,
    postprocs: Mapping[Any, Callable[[Any], Any]],
    *,
    name: str | None = "sae",
) -> Iterator[None]:
    """Install splices (or any postprocessors) in the net for a ``with`` block.

    Each key selects one call of ``rnet``'s table (a label, a qualified
    name, ``(name, k)``, ...; ``InputOf(selector)`` for the first input of a
    call, where a transcoder reads); its value is called on that call's
    output (or input) as ``activation_postproc`` would be, in every pass of
    the net made inside the block: ``rnet(...)``, ``rnet.generate``, the net
    called directly, ``collect``, ``patch_sweep``, the detectors,
    ``activations.write``. A :class:`~scio_recorder.sae.Splice` is also
    added to its module as the child ``name``, whose child ``latents``
    outputs the latents: a :class:`~scio_recorder.Recorder` made inside the
    block records them as the layer ``"<module>.<name>.latents"``.

    Records of a spliced call, in any recorder, are its spliced output
    (what the rest of the net sees). A recorder made inside the block lists
    the children's rows: use it inside the block only. No child is added to
    an ``nn.Sequential`` (its forward runs every child it holds) or with
    ``name=None``: the latents are then read from the splice only
    (``sp.latents``).

    Parameters
    ----------
    rnet : Recorder
        Resolves the selectors; its net gets the hooks.
    postprocs : dict
        Selector -> postprocessor: a ``splice(...)``, a transcoder's
        ``sp.read``, or any ``fn(output) -> replacement or None``.
    name : str or None, default "sae"
        The name of the child added to each spliced module (``None``: none).

    Yields
    ------
    None

    Raises
    ------
    ValueError
        If a selector does not select exactly one call, a module already
        has a child ``name``, or two postprocessors share a call.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.collect import collect
    >>> from scio_recorder.sae import SparseAutoencoder, attach, splice
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> rnet = Recorder(net, input_size=(1, 4))
    >>> sp = splice(SparseAutoencoder(8, 16), keep_error=True)
    >>> data = [torch.randn(3, 4) for _ in range(2)]
    >>> with attach(rnet, {"0": sp}):
    ...     inside = Recorder(net, input_size=(1, 4))  # sees the latents
    ...     kept = collect(inside, data, {"0.sae.latents": "moments"}, input=None)
    ...     (label,) = kept.labels_of["0.sae.latents"]
    >>> kept[label].mean.shape
    torch.Size([16])
    >>> hasattr(net[0], "sae")  # the net as it was
    False

    """
    name = _check_name(name)
    net = rnet.net
    targets = _targets(rnet, postprocs, name)
    counts = _Counts()
    handles: list[RemovableHandle] = []
    added: list[tuple[nn.Module, str]] = []

    def reset(_module: nn.Module, _args: Any) -> None:
        counts.calls.clear()
        counts.open.clear()

    try:
        handles.append(net.register_forward_pre_hook(reset, prepend=True))
        for key, (row, of_input, fn) in enumerate(targets):
            module, index = row.module, row.call_index
            handles.append(
                module.register_forward_pre_hook(
                    _start_hook(fn if of_input else None, index, key, counts),
                    prepend=True,
                )
            )
            if of_input:
                continue
            call = fn
            if (
                isinstance(fn, Splice)
                and name is not None
                and _holds_child(module, name)
            ):
                child = _Attached(fn)
                module.add_module(name, child)
                added.append((module, name))
                call = child
            handles.append(
                module.register_forward_hook(_end_hook(call, key, counts), prepend=True)
            )
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module, child_name in added:
            del module._modules[child_name]  # noqa: SLF001 (the child we added)


def _targets(
    rnet: Recorder, postprocs: Mapping[Any, Callable[[Any], Any]], name: str | None
) -> list[tuple[Layer, bool, Callable[[Any], Any]]]:
    """Resolve ``attach``'s dict: (row, whether an input, postprocessor) each."""
    if not isinstance(postprocs, Mapping) or not postprocs:
        msg = (
            "`attach` takes a dict {selector: postprocessor}, e.g. "
            "`{'transformer.h.6': splice(sae)}`."
        )
        raise TypeError(msg)
    net = rnet.net
    targets: list[tuple[Layer, bool, Callable[[Any], Any]]] = []
    seen: set[tuple[Any, bool]] = set()
    for selector, fn in postprocs.items():
        if not callable(fn):
            msg = f"`attach`: the value for {selector!r} is not callable: {fn!r}."
            raise TypeError(msg)
        of_input = isinstance(selector, InputOf)
        target = selector.selector if isinstance(selector, InputOf) else selector
        row = resolve_one(rnet.table, net, target, "`attach`", hint="{label}")
        if (row.label, of_input) in seen:
            msg = f"`attach`: {selector!r} is given twice (as {row.label_str})."
            raise ValueError(msg)
        seen.add((row.label, of_input))
        taken = name in row.module._modules or any(  # noqa: SLF001 (children by name)
            row.module is other.module
            for other, _, f in targets
            if isinstance(f, Splice)
        )
        if isinstance(fn, Splice) and _holds_child(row.module, name) and taken:
            msg = (
                f"`attach`: the module of {selector!r} already has a child "
                f"{name!r}: pass another `name=` (a module spliced at two of its "
                "calls needs two `attach` blocks, with two names)."
            )
            raise ValueError(msg)
        targets.append((row, of_input, fn))
    return targets


def _start_hook(
    fn: Callable[[Any], Any] | None,
    index: int | None,
    key: int,
    counts: _Counts,
) -> Callable[[nn.Module, Any], Any]:
    """Count a call of the module where it starts; edit its input if ``fn``.

    Without ``fn`` (an output is edited), whether this call is the one
    edited goes on the module's stack, for :func:`_end_hook`.
    """

    def hook(module: nn.Module, args: Any) -> Any:
        number = counts.calls.get(key, 0)
        counts.calls[key] = number + 1
        chosen = index is None or number == index
        if fn is None:
            counts.open.setdefault(key, []).append(chosen)
            return None
        if not chosen or not args:
            return None
        if not isinstance(args[0], Tensor):
            msg = (
                f"`attach`: the first input of {type(module).__name__} is a "
                f"{type(args[0]).__name__}, not a tensor."
            )
            raise TypeError(msg)
        new = fn(args[0])
        return None if new is None else (new, *args[1:])

    return hook


def _end_hook(
    fn: Callable[[Any], Any], key: int, counts: _Counts
) -> Callable[[nn.Module, Any, Any], Any]:
    """Edit the output of the call :func:`_start_hook` chose."""

    def hook(_module: nn.Module, _args: Any, output: Any) -> Any:
        stack = counts.open.get(key)
        if stack and stack.pop():
            return fn(output)
        return None

    return hook
