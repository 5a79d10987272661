"""Small networks that reproduce the structures torchinfo 1.8.0 mislabels.

Each net is tiny (a few ``Linear(4, 4)``) so that tests stay fast; the
``forward`` of each one is simple enough to be recomputed by hand as an oracle.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Block(nn.Module):
    """``act(lin(x))`` where ``act`` is given, so two blocks can share it."""

    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.lin(x))


class SharedActNet(nn.Module):
    """Two blocks that share one ``ReLU`` instance: ``b2(b1(x))``."""

    def __init__(self) -> None:
        super().__init__()
        relu = nn.ReLU()
        self.b1 = Block(relu)
        self.b2 = Block(relu)

    def forward(self, x: Tensor) -> Tensor:
        return self.b2(self.b1(x))


class ListNet(nn.Module):
    """Loops over a ``ModuleList`` (never called) and a shared ``ReLU``."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = self.act(layer(x))
        return x


def reused_relu_seq() -> nn.Sequential:
    """``Sequential(Linear, relu, Linear, relu)`` with one ``relu`` instance."""
    relu = nn.ReLU()
    return nn.Sequential(nn.Linear(4, 4), relu, nn.Linear(4, 4), relu)


class ReversedNet(nn.Module):
    """Children declared ``c, b, a`` but called ``a, b, c``."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Linear(6, 3)
        self.b = nn.Linear(5, 6)
        self.a = nn.Linear(4, 5)

    def forward(self, x: Tensor) -> Tensor:
        return self.c(self.b(self.a(x)))


class Inner(nn.Module):
    """``act(lin(x))``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.lin(x))


class DirectChildNet(nn.Module):
    """The root calls ``self.block.lin`` directly; ``self.block`` never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.block = Inner()
        self.post = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.post(self.block.lin(self.pre(x)))


class Holder(nn.Module):
    """A never-called container with a parameter of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(4, 4)
        self.lin2 = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.ones(4))


class HolderNet(nn.Module):
    """Calls ``h.lin1``, ``mid``, ``h.lin2``: two container rows for ``h``."""

    def __init__(self) -> None:
        super().__init__()
        self.h = Holder()
        self.mid = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.h.lin1(x) * self.h.scale
        return self.h.lin2(self.mid(x))


class Split(nn.Module):
    """Returns a tuple of two halves."""

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x[:, :2], x[:, 2:]


class ToDict(nn.Module):
    """Returns a dict of two tensors."""

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        return {"a": x * 2, "b": x + 1}


class StructuredNet(nn.Module):
    """``lin``, then a tuple-returning and a dict-returning module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.split = Split()
        self.todict = ToDict()

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.split(self.lin(x))
        d = self.todict(torch.cat([b, a], dim=1))
        return d["a"] + d["b"]


class TrainOnlyNet(nn.Module):
    """``train_only`` is called only in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.train_only = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = self.lin(x)
        if self.training:
            x = self.train_only(x)
        return x


class LoopNet(nn.Module):
    """Calls ``lin`` once per row of the input (a loop count from the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(int(x.shape[0])):
            x = self.lin(x)
        return x


class BranchNet(nn.Module):
    """``a`` runs once more when the input sums to a positive number."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:
            x = self.a(x)
        return self.a(self.b(x))


class SelfCallModule(nn.Module):
    """Calls itself once (a call nested in a call of the same module)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor, n: int = 1) -> Tensor:
        if n:
            x = self(x, n - 1) * 2
        return self.lin(x)


class SelfCallNet(nn.Module):
    """Wraps a :class:`SelfCallModule`."""

    def __init__(self) -> None:
        super().__init__()
        self.rec = SelfCallModule()

    def forward(self, x: Tensor) -> Tensor:
        return self.rec(x)


class PreBlock(nn.Module):
    """``lin(pre(x))`` where ``pre`` is a module passed to ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor, pre: nn.Module) -> Tensor:
        return self.lin(pre(x))


class PassedModuleNet(nn.Module):
    """The root passes its own ``norm`` to ``blk``, which calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Linear(4, 4)
        self.blk = PreBlock()

    def forward(self, x: Tensor) -> Tensor:
        return self.blk(x, self.norm)


class InPlaceBlock(nn.Module):
    """torchvision's ``BasicBlock`` at toy size: ``out += identity``, in-place ReLUs.

    ``relu`` overwrites ``bn1``'s output, ``out += identity`` overwrites
    ``bn2``'s, and the ReLU called again overwrites the sum: a record of any
    of them taken as the very tensor would hold a later value.
    """

    def __init__(self, channels: int = 3, *, inplace: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=inplace)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.inplace:
            out += identity
        else:
            out = out + identity
        return self.relu(out)


def inplace_blocks(*, inplace: bool = True) -> nn.Sequential:
    """A stem (conv, BN, ReLU) and two :class:`InPlaceBlock`, in eval mode."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 3, 3, padding=1),
        nn.BatchNorm2d(3),
        nn.ReLU(inplace=inplace),
        InPlaceBlock(inplace=inplace),
        InPlaceBlock(inplace=inplace),
    )
    for module in net.modules():  # running statistics away from 0 and 1
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return net.eval()
