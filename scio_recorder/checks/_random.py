"""Whether a pass draws random numbers: the random generators' states around it.

A forward that draws random numbers gives random records, even when two
passes happen to agree (a dropout of ``p = 0.01`` on a few values drops
none in two passes, and what it keeps is scaled by ``1/(1-p)``). Which
module types draw is no answer (``F.dropout(x, p, training=self.training)``
in a ``forward``, ``torch.randn_like``, a sampling): the generators tell.
:class:`RandomState` is the state of every global random generator a
forward may draw from (torch's CPU generator, each CUDA device's once CUDA
is in use, Python's ``random``, NumPy's global one), taken in a few
microseconds; two states differ exactly when something drew in between.
:func:`drawers` names the modules whose calls drew, and :func:`unseen`
the devices whose generators are not read (a draw there cannot be told).
A private ``torch.Generator`` passed to a random operation is not a global
generator: its draws are not seen.
"""

from __future__ import annotations

__all__ = ["RandomState", "drawers", "unseen"]

import dataclasses
import random
import sys
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import Tensor, nn


@dataclasses.dataclass(frozen=True, eq=False)
class RandomState:
    """The states of the global random generators, at one moment.

    Examples
    --------
    >>> import torch
    >>> before = RandomState.now()
    >>> _ = torch.ones(3) + 1
    >>> RandomState.now() == before
    True
    >>> _ = torch.rand(3)
    >>> RandomState.now() == before
    False

    """

    cpu: Tensor
    cuda: tuple[Tensor, ...]
    python: Any
    numpy: Any

    @classmethod
    def now(cls) -> RandomState:
        """Return the generators' states now."""
        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        cuda = tuple(torch.cuda.get_rng_state_all()) if initialized else ()
        numpy = sys.modules.get("numpy")
        state = None
        if numpy is not None:
            kind, keys, *rest = numpy.random.get_state()
            state = (kind, keys.tobytes(), *rest)
        return cls(torch.get_rng_state(), cuda, random.getstate(), state)

    def __eq__(self, other: object) -> bool:
        """Whether no generator drew between the two states."""
        if not isinstance(other, RandomState):
            return NotImplemented
        return (
            torch.equal(self.cpu, other.cpu)
            and len(self.cuda) == len(other.cuda)
            and all(map(torch.equal, self.cuda, other.cuda))
            and self.python == other.python
            and self.numpy == other.numpy
        )

    __hash__ = None  # type: ignore[assignment]  # compared by value, not hashed


def drawers(net: nn.Module, run: Any) -> list[str]:
    """Return the modules whose calls drew random numbers in one call of ``run()``.

    The innermost ones: a module is named when one of its calls drew and
    no call of a module inside it did (the root by its type's name). Empty
    when the draws happened outside every module's call (a forward's own
    code draws inside the root's call, so never).
    """
    modules = list(net.named_modules())
    drew: set[str] = set()
    starts: dict[int, list[RandomState]] = {}

    def before(module: nn.Module, _args: Any) -> None:
        starts.setdefault(id(module), []).append(RandomState.now())

    def after(name: str) -> Any:
        def hook(module: nn.Module, _args: Any, _output: Any) -> None:
            stack = starts.get(id(module))
            if stack and stack.pop() != RandomState.now():
                drew.add(name)

        return hook

    handles = []
    for name, module in modules:
        handles.append(module.register_forward_pre_hook(before))
        handles.append(module.register_forward_hook(after(name)))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    root = type(net).__name__

    def inside(inner: str, outer: str) -> bool:
        return inner != outer and (not outer or inner.startswith(f"{outer}."))

    return [
        name or root
        for name, _ in modules
        if name in drew and not any(inside(other, name) for other in drew)
    ]


def unseen(net: nn.Module) -> list[str]:
    """Return the devices of the net's tensors whose random generators are not read.

    (Not the CPU's nor CUDA's: :class:`RandomState` reads those.)
    """
    devices = {t.device.type for t in (*net.parameters(), *net.buffers())}
    return sorted(devices - {"cpu", "cuda", "meta"})
