"""A block stack's prefix run once: the blocks before a patch answered from a cache.

A cell of a patching grid changes the net at one call; every call that ends
before it saw the same inputs as in the corrupted run, so (deterministic, in
eval mode) it returns the same output. For a stack of blocks (GPT-2's
``transformer.h``, Llama's ``model.layers``), ``patch_sweep`` runs the
corrupted input once, keeps every block's output, and in each cell's pass
answers the blocks that end before the patched call from
that cache instead of running them: only the blocks after it run.

* :func:`find_stack`: the net's block stack, the largest ``nn.ModuleList``
  whose modules each run once per pass, or ``None`` (not a stack, or the net
  in training mode, where dropout makes the runs differ);
* :func:`answered_blocks`: the blocks a patch at one call leaves as they were;
* :func:`capturing`: the ``with`` block of the corrupted run, which keeps what
  each block's own ``forward`` returned;
* :func:`answering`: the ``with`` block in which those calls are answered.

Answering a call replaces the module's ``forward``, the only way torch leaves
to skip a module's work (a hook runs around it, not instead). One dispatcher
per module is installed while at least one sweep uses it and removed by the
last, which puts back the very attribute that was there (an instance
``forward`` of accelerate's hooks stays theirs); a ``KeyboardInterrupt``
removes it too. It answers only the thread that asked, inside its ``with``
block: any other caller (another thread, a compiled trace) runs the module's
own ``forward``; a copy of the module (``copy.deepcopy``, pickle,
``torch.save``) taken meanwhile gets the module's own ``forward``, not the
dispatcher.

The cache is kept by the same dispatcher, in the corrupted run: what the
``forward`` it stands for returned (cloned, since a hook may change it in
place), before any forward hook saw it. Every hook then runs around an
answered call as around a real one, on the same inputs, so it sees and
returns the same values: the module's forward pre-hooks and forward hooks
(``with_kwargs``, ``always_call``), the global ones
(``torch.nn.modules.module.register_module_forward_hook``), the recorder's
(its call counts and edits hold), and accelerate's, which live inside the
instance ``forward`` (skipped with it, their effect is in the answer). A
cache read by a forward hook (the recorder's, as before) would hold the
output after the hooks that ran before it, which the answered call then
passes through those hooks again: a block hook ``tanh`` applied twice. Hooks
on the modules *inside* an answered block do not run (their effect on the
block's output is in the answer; their side effects, such as recording, are
not repeated). What this assumes of a block: its effect on the rest of the
pass is its output (not, e.g., a key/value cache that a later layer reads),
and its hooks give the same result on the same values in every pass (no
randomness, no state changed from pass to pass);
``patch_sweep(..., reuse_prefix=False)`` runs every block.
"""

from __future__ import annotations

__all__ = ["Stack", "answered_blocks", "answering", "capturing", "find_stack"]

import contextlib
import dataclasses
import functools
import threading
import types
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scio_recorder._support.tree import map_tensors

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from scio_recorder.layers import Layer
    from scio_recorder.recorder import Recorder


@dataclasses.dataclass(frozen=True)
class Stack:
    """A block stack: its qualified name and each block's one call, in call order."""

    name: str
    blocks: tuple[Layer, ...]


def find_stack(rnet: Recorder) -> Stack | None:
    """Return the net's block stack, or ``None`` where there is none to reuse.

    The stack is the ``nn.ModuleList`` with the most modules (at least two)
    whose every module has exactly one call in the table; ``None`` also when
    any module of the net is in training mode.
    """
    net = rnet.net
    if any(module.training for module in net.modules()):
        return None
    found: Stack | None = None
    for name, container in net.named_modules():
        if not isinstance(container, nn.ModuleList) or len(container) < 2:  # noqa: PLR2004 (a stack)
            continue
        rows = [rnet.table.call_plan(block) for block in container]
        if any(len(calls) != 1 for calls in rows):
            continue
        if found is None or len(rows) > len(found.blocks):
            blocks = sorted((calls[0] for calls in rows), key=_end)
            found = Stack(name, tuple(blocks))
    return found


def _end(row: Layer) -> int:
    return row.end_order or 0


def answered_blocks(stack: Stack, row: Layer) -> tuple[Layer, ...]:
    """Return the blocks that a patch at ``row`` leaves as in the corrupted run.

    Those whose call ends when ``row``'s does or before, except the block
    ``row`` is inside of (it runs, with the patch inside it); the block that
    *is* ``row`` is answered, and the patch applies to its answer.
    """
    return tuple(
        block
        for block in stack.blocks
        if _end(block) <= _end(row) and not row.name.startswith(f"{block.name}.")
    )


_LOCK = threading.Lock()
_ABSENT = object()


class _Dispatcher:
    """A module's ``forward`` while a sweep answers its calls or keeps them."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.saved = module.__dict__.get("forward", _ABSENT)
        self.handlers: dict[int, list[Callable[[Callable[[], Any]], Any]]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            handlers = self.handlers.get(threading.get_ident())
            if handlers:
                return handlers[-1](functools.partial(self.forward, *args, **kwargs))
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run what ``forward`` was before the dispatcher (the class's, or theirs)."""
        if self.saved is _ABSENT:
            return type(self.module).forward(self.module, *args, **kwargs)
        return self.saved(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        """Give a copy of the module (deepcopy, pickle) its own ``forward``.

        Not this dispatcher: the copy carries no sweep, so that it runs whole
        in this thread too, during the sweep and after it.
        """
        if self.saved is _ABSENT:
            return (_own_forward, (self.module,))
        return (_same, (self.saved,))

    def install(self) -> None:
        object.__setattr__(self.module, "forward", self)

    def uninstall(self) -> None:
        namespace = self.module.__dict__
        if namespace.get("forward") is not self:  # replaced meanwhile: theirs
            return
        if self.saved is _ABSENT:
            del namespace["forward"]
        else:
            namespace["forward"] = self.saved


def _own_forward(module: nn.Module) -> Any:
    """Return the class's ``forward`` bound to ``module``."""
    return types.MethodType(type(module).forward, module)


def _same(value: Any) -> Any:
    return value


_DISPATCHERS: dict[int, _Dispatcher] = {}
"""The installed dispatchers, by ``id`` of their module (alive while installed)."""


@contextlib.contextmanager
def answering(answers: Mapping[nn.Module, Callable[[], Any]]) -> Iterator[None]:
    """Answer this thread's calls of each module with ``answers[module]()``.

    The module's ``forward`` does not run; its hooks run around the answer.
    Nested blocks of one thread answer with the innermost answer.
    """
    with _handling({module: _answer_with(a) for module, a in answers.items()}):
        yield


def _answer_with(answer: Callable[[], Any]) -> Callable[[Callable[[], Any]], Any]:
    return lambda _forward: answer()


@contextlib.contextmanager
def capturing(modules: Iterable[nn.Module]) -> Iterator[dict[nn.Module, Any]]:
    """Keep what each module's own ``forward`` returns in this thread's calls.

    Yields a dict, filled as the modules run: ``module ->`` its last call's
    return value, every tensor in it detached and cloned (a forward hook
    changing the output in place leaves it as ``forward`` returned it). The
    value is the one :func:`answering` must give for the hooks around an
    answered call to see what they see around a real one.
    """
    kept: dict[nn.Module, Any] = {}

    def keeper(module: nn.Module) -> Callable[[Callable[[], Any]], Any]:
        def keep(forward: Callable[[], Any]) -> Any:
            output = forward()
            kept[module] = map_tensors(_copy, output)
            return output

        return keep

    with _handling({module: keeper(module) for module in modules}):
        yield kept


def _copy(tensor: Tensor) -> Tensor:
    return tensor.detach().clone()


@contextlib.contextmanager
def _handling(
    handlers: Mapping[nn.Module, Callable[[Callable[[], Any]], Any]],
) -> Iterator[None]:
    """Hand this thread's calls of each module to ``handlers[module]``.

    A handler gets the call of the module's real ``forward`` (no argument)
    and returns what the call returns. The innermost ``with`` block wins.
    """
    thread = threading.get_ident()
    taken: list[nn.Module] = []
    try:
        with _LOCK:
            for module, handler in handlers.items():
                dispatcher = _DISPATCHERS.get(id(module))
                if dispatcher is None:
                    dispatcher = _DISPATCHERS[id(module)] = _Dispatcher(module)
                    dispatcher.install()
                dispatcher.handlers.setdefault(thread, []).append(handler)
                taken.append(module)
        yield
    finally:
        with _LOCK:
            for module in taken:
                dispatcher = _DISPATCHERS[id(module)]
                mine = dispatcher.handlers[thread]
                mine.pop()
                if not mine:
                    del dispatcher.handlers[thread]
                if not dispatcher.handlers:
                    dispatcher.uninstall()
                    del _DISPATCHERS[id(module)]
