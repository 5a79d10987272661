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
dispatcher. Hooks run around it as around any call, so the recorder's
call counts and edits hold. What this assumes of a block: its effect on the
rest of the pass is its output (not, e.g., a key/value cache that a later
layer reads); ``patch_sweep(..., reuse_prefix=False)`` runs every block.
"""

from __future__ import annotations

__all__ = ["Stack", "answered_blocks", "answering", "find_stack"]

import contextlib
import dataclasses
import threading
import types
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

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
    """A module's ``forward`` while a sweep answers its calls."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.saved = module.__dict__.get("forward", _ABSENT)
        self.answers: dict[int, list[Callable[[], Any]]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            answers = self.answers.get(threading.get_ident())
            if answers:
                return answers[-1]()
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

    Nested blocks of one thread answer with the innermost answer.
    """
    thread = threading.get_ident()
    taken: list[nn.Module] = []
    try:
        with _LOCK:
            for module, answer in answers.items():
                dispatcher = _DISPATCHERS.get(id(module))
                if dispatcher is None:
                    dispatcher = _DISPATCHERS[id(module)] = _Dispatcher(module)
                    dispatcher.install()
                dispatcher.answers.setdefault(thread, []).append(answer)
                taken.append(module)
        yield
    finally:
        with _LOCK:
            for module in taken:
                dispatcher = _DISPATCHERS[id(module)]
                mine = dispatcher.answers[thread]
                mine.pop()
                if not mine:
                    del dispatcher.answers[thread]
                if not dispatcher.answers:
                    dispatcher.uninstall()
                    del _DISPATCHERS[id(module)]
