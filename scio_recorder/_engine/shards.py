"""Tensor-parallel nets: which values a hook sees are one rank's piece, made whole.

A net sharded across processes by torch's
:func:`~torch.distributed.tensor.parallel.parallelize_module`
(``ColwiseParallel``, ``RowwiseParallel``) or by transformers' tensor
parallelism (``from_pretrained(..., tp_plan="auto")``) holds its sharded
parameters as :class:`~torch.distributed.tensor.DTensor`, each rank its piece.
What a hook sees at such a layer is that rank's piece of the layer's tensor:

* a *column-parallel* layer (a ``Linear`` whose weight is sharded along its
  output features, dim 0; an ``Embedding`` sharded along its embedding
  dimension, dim 1) returns this rank's slice of the last dimension of its
  output, as a plain tensor (torch's ``use_local_output=True``, transformers'
  ``"colwise"``) or as a ``DTensor``;
* a *row-parallel* layer (a ``Linear`` sharded along its input features,
  dim 1) takes this rank's slice of the last dimension of its input, plain
  or as a ``DTensor`` (torch's styles hand the hooks a ``DTensor``), and
  returns the whole output (summed across ranks);
* a ``DTensor`` anywhere in an output or an input carries its own layout;
  a tensor still waiting for a collective (torch's row-parallel outputs are
  ``AsyncCollectiveTensor``) is waited for.

:class:`Shards` makes each of those whole before a recorder sees it, so that
records and edits are those of the unsharded net: a plain slice is gathered
along the last dimension (:meth:`DTensor.full_tensor`, the layer's full width
taken from its weight, so uneven slices work), a ``DTensor`` by its
placements. An edit's result, a whole tensor, is cut back into this rank's
piece without communication (every rank holds the same whole:
:func:`~torch.distributed.tensor.distribute_tensor` with
``src_data_rank=None``), in the layout the layer returned. Gathering is a
collective: every rank must record the same calls, which holds for tensor
parallelism (every rank runs the same forward on the same inputs).

What stays a piece: a module with no sharded parameter that computes on a
piece (the activation between a column- and a row-parallel layer of an MLP,
``act_fn`` in Llama): record the column-parallel layer before it, or its
row-parallel successor's input. Meshes of more than one dimension are left
as they are.
"""

from __future__ import annotations

__all__ = ["Shards", "tensor_parallel"]

import sys
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from scio_recorder._support.tree import iter_tensors, map_tensors

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Side = Literal["input", "output"]

# Which dimension of a 2-D weight, sharded, splits which side's last dimension.
_SIDES: dict[str, dict[int, Side]] = {
    "Linear": {0: "output", 1: "input"},  # weight [out, in]
    "Conv1D": {1: "output", 0: "input"},  # transformers' GPT-2 layers: [in, out]
    "Embedding": {1: "output"},  # weight [num, dim]; dim 0 sums, output whole
}


def tensor_parallel(net: nn.Module) -> bool:
    """Whether ``net`` holds ``DTensor`` parameters (sharded across ranks).

    Its ranks then run the same passes on the same data: ``collect`` merges
    nothing across them and ``activations.write`` writes one set per rank.

    Examples
    --------
    >>> from torch import nn
    >>> tensor_parallel(nn.Linear(2, 2))
    False

    """
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor can exist
        return False
    from torch.distributed.tensor import DTensor  # noqa: PLC0415 (distributed nets only)

    return any(isinstance(p, DTensor) for p in net.parameters())


class _Rule:
    """A layer's sharded side: a plain tensor ``local`` wide slices ``full``."""

    __slots__ = ("full", "local", "mesh", "side")

    def __init__(self, side: Side, mesh: DeviceMesh, full: int, local: int) -> None:
        self.side = side
        self.mesh = mesh
        self.full = full
        self.local = local


class Shards:
    """The tensor-parallel layout of a net's layers, and the way to whole tensors.

    Parameters
    ----------
    rules : dict
        Module -> its sharded side (built by :meth:`of`).

    Examples
    --------
    >>> from torch import nn
    >>> Shards.of(nn.Linear(2, 2)) is None  # no DTensor parameter
    True

    """

    def __init__(self, rules: dict[nn.Module, _Rule]) -> None:
        self.rules = rules

    @classmethod
    def of(cls, net: nn.Module) -> Shards | None:
        """Return the layout of ``net``; ``None`` if it holds no ``DTensor``."""
        if not tensor_parallel(net):
            return None
        from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415 (distributed nets only)

        rules: dict[nn.Module, _Rule] = {}
        for module in net.modules():
            weight = module._parameters.get("weight")  # noqa: SLF001 (its own, not a child's)
            sides = _SIDES.get(type(module).__name__)
            if not isinstance(weight, DTensor) or sides is None or weight.ndim != 2:  # noqa: PLR2004 (a matrix)
                continue
            mesh = weight.device_mesh
            (placement,) = weight.placements if mesh.ndim == 1 else (None,)
            if not isinstance(placement, Shard):
                continue
            dim = placement.dim % 2
            side = sides.get(dim)
            if side is not None:
                local = weight.to_local().shape[dim]
                rules[module] = _Rule(side, mesh, weight.shape[dim], local)
        return cls(rules)

    # -- whole --------------------------------------------------------------
    def whole(self, module: nn.Module, value: Any, side: Side) -> Any:
        """Return ``value`` (a call's output, or its ``args``) with pieces made whole.

        ``value`` itself when nothing in it is a piece.
        """
        rule = self.rules.get(module)
        plain = rule if rule is not None and rule.side == side else None
        if (
            side == "input"
            and plain is not None
            and value
            and _is_piece(value[0], plain)
        ):
            value = (_gather(value[0], plain), *value[1:])
            plain = None
        if side == "output" and plain is not None and _is_piece(value, plain):
            return _gather(value, plain)
        return _whole_dtensors(value)

    def piece(self, module: nn.Module, whole: Any, like: Any, side: Side) -> Any:
        """Cut ``whole`` (what :meth:`whole` gave, maybe edited) as ``like`` was."""
        if whole is like:
            return whole
        rule = self.rules.get(module)
        if rule is not None and rule.side == side:
            if side == "input" and like and _is_piece(like[0], rule):
                return (_scatter(whole[0], rule), *whole[1:])
            if side == "output" and _is_piece(like, rule):
                return _scatter(whole, rule)
        return _like_dtensors(whole, like)


def _is_piece(value: Any, rule: _Rule) -> bool:
    """Whether ``value`` is a plain tensor sliced along its last dim by ``rule``."""
    return (
        type(value) is Tensor or (isinstance(value, Tensor) and not _is_dtensor(value))
    ) and (value.ndim > 0 and value.shape[-1] == rule.local and rule.local != rule.full)


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor  # noqa: PLC0415 (distributed nets only)

    return isinstance(value, DTensor)


def _gather(piece: Tensor, rule: _Rule) -> Tensor:
    """Gather this rank's last-dim slice ``piece`` into the whole tensor."""
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415

    shape = (*piece.shape[:-1], rule.full)
    stride = torch.empty(shape, device="meta").stride()
    spread = DTensor.from_local(
        piece.contiguous(),
        rule.mesh,
        [Shard(piece.ndim - 1)],
        run_check=False,
        shape=torch.Size(shape),
        stride=stride,
    )
    return spread.full_tensor()


def _scatter(whole: Tensor, rule: _Rule) -> Tensor:
    """Cut this rank's last-dim slice of ``whole`` (no communication)."""
    from torch.distributed.tensor import Shard, distribute_tensor  # noqa: PLC0415

    spread = distribute_tensor(
        whole, rule.mesh, [Shard(whole.ndim - 1)], src_data_rank=None
    )
    return spread.to_local()


def _whole_dtensors(value: Any) -> Any:
    """``value`` with every ``DTensor`` inside replaced by its whole tensor.

    A tensor still waiting for a collective (torch's row-parallel outputs are
    ``AsyncCollectiveTensor``) is waited for: a record is a plain tensor.
    """
    from torch.distributed._functional_collectives import (  # noqa: PLC0415
        AsyncCollectiveTensor,
    )

    found = False

    def whole(tensor: Tensor) -> Tensor:
        nonlocal found
        if isinstance(tensor, AsyncCollectiveTensor):
            found = True
            return tensor.wait()
        if not _is_dtensor(tensor):
            return tensor
        found = True
        return tensor.full_tensor()  # type: ignore[attr-defined, no-any-return]

    out = map_tensors(whole, value)
    return out if found else value


def _like_dtensors(whole: Any, like: Any) -> Any:
    """Cut every tensor of ``whole`` whose counterpart in ``like`` is a ``DTensor``."""
    from torch.distributed.tensor import DTensor, Replicate  # noqa: PLC0415

    wholes = iter(list(iter_tensors(whole)))
    out = []
    for original in iter_tensors(like):
        tensor = next(wholes, None)
        if (
            isinstance(original, DTensor)
            and tensor is not None
            and not _is_dtensor(tensor)
        ):
            mesh = original.device_mesh
            spread = DTensor.from_local(
                tensor, mesh, [Replicate()] * mesh.ndim, run_check=False
            )
            tensor = spread.redistribute(mesh, original.placements)
        out.append(tensor)
    replacements = iter(out)
    return map_tensors(lambda _: next(replacements), whole)
