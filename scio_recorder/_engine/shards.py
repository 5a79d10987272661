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

Sequence parallelism (torch's ``SequenceParallel`` on norms, a
``ColwiseParallel(input_layouts=Shard(1))`` after them and a
``RowwiseParallel(output_layouts=Shard(1))`` before the next) hands plain
tensors that are this rank's slice of the *sequence* between layers. Which
dimension a styled layer's plain output is sharded on, its style says: the
placements its output hook turns into a local tensor (torch's styles keep
them in the hook, :func:`_local_output`), so such an output is gathered
along that dimension (the ranks' sizes gathered first, so uneven slices
work) and an edit cut back along it. A module outside the styles in such a
net computes on a slice no layout names (a residual sum, the decoder layer
around it): :meth:`Shards.refuse` refuses to record it, instead of
recording a slice as the whole.

What stays a piece in plain tensor parallelism: a module with no sharded
parameter that computes on a piece (the activation between a column- and a
row-parallel layer of an MLP, ``act_fn`` in Llama): record the
column-parallel layer before it, or its row-parallel successor's input.
Meshes of more than one dimension are left as they are.
"""

from __future__ import annotations

__all__ = ["Shards", "tensor_parallel"]

import functools
import sys
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from scio_recorder._support.tree import iter_tensors, map_tensors

if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch.distributed.device_mesh import DeviceMesh

    from scio_recorder.layers import Layer

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


class _Local:
    """A styled layer's plain output: this rank's piece along ``dim`` of the whole."""

    __slots__ = ("dim", "mesh")

    def __init__(self, mesh: DeviceMesh, dim: int) -> None:
        self.mesh = mesh
        self.dim = dim


class Shards:
    """The tensor-parallel layout of a net's layers, and the way to whole tensors.

    Parameters
    ----------
    rules : dict
        Module -> its sharded side (built by :meth:`of`).
    outputs : dict, optional
        Module -> the dimension other than the last its plain output is
        sharded on (sequence parallelism, read from the styles' hooks).
    sliced : list of str, optional
        The styles that hand plain sequence slices between layers, named
        (``"`norm` (SequenceParallel)"``): a net with any is sequence-parallel.
    styled : set of modules, optional
        The modules a parallel style placed, whose records have a layout.

    Examples
    --------
    >>> from torch import nn
    >>> Shards.of(nn.Linear(2, 2)) is None  # no DTensor parameter
    True

    """

    def __init__(
        self,
        rules: dict[nn.Module, _Rule],
        outputs: dict[nn.Module, _Local] | None = None,
        sliced: list[str] | None = None,
        styled: set[nn.Module] | None = None,
    ) -> None:
        self.rules = rules
        self.outputs = outputs or {}
        self.sliced = sliced or []
        self.styled = styled or set()

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
        outputs: dict[nn.Module, _Local] = {}
        sliced: list[str] = []
        styled: set[nn.Module] = set()
        for name, module in net.named_modules():
            if not getattr(module, "_distribute_module_applied", False):
                continue
            styled.add(module)
            found = _local_output(module)
            if found is not None and found[1] != -1:
                outputs[module] = _Local(*found)
            style = _sequence_style(module)
            if style is not None:
                sliced.append(f"`{name or type(module).__name__}` ({style})")
        return cls(rules, outputs, sliced, styled)

    def refuse(self, rows: Sequence[Layer]) -> None:
        """Refuse to record ``rows`` whose values may be a sequence slice.

        In a sequence-parallel net (:attr:`sliced`), a module that no style
        placed computes on plain tensors that may be this rank's slice of
        the sequence, with no layout to gather them by.
        """
        if not self.sliced:
            return
        unplaced = list(
            dict.fromkeys(
                f"`{row.name}`"
                if row.name
                else f"the whole net ({type(row.module).__name__})"
                for row in rows
                if row.module not in self.styled
            )
        )
        if not unplaced:
            return
        names = ", ".join(unplaced[:3])
        more = f" and {len(unplaced) - 3} more" if len(unplaced) > 3 else ""  # noqa: PLR2004
        styles = ", ".join(self.sliced[:3])
        msg = (
            f"Cannot record {names}{more} whole: the net is sequence-parallel "
            f"({styles} take or give plain tensors that are this rank's slice of "
            "the sequence), and a module that no parallel style placed computes "
            "on such slices with no layout saying so. Record the layers the "
            "styles placed (their records are gathered along the dimension "
            'their style shards), or pass `shards="local"` to keep each '
            "rank's pieces."
        )
        raise ValueError(msg)

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
        local = self.outputs.get(module) if side == "output" else None
        if local is not None and _is_plain(value) and value.ndim > local.dim:
            return _gather_along(value, local)
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
        local = self.outputs.get(module) if side == "output" else None
        if local is not None and _is_plain(like) and like.ndim > local.dim:
            return _scatter_along(whole, local)
        return _like_dtensors(whole, like)


def _is_plain(value: Any) -> bool:
    """Whether ``value`` is a tensor that is not a ``DTensor``."""
    return isinstance(value, Tensor) and not _is_dtensor(value)


def _hook_partials(hooks: Any, name: str) -> list[tuple[functools.partial[Any], Any]]:
    """Return torch's style functions ``name`` in ``hooks``, with their mesh.

    ``distribute_module`` registers ``lambda ...: output_fn(mod, outputs,
    device_mesh)``: the function (a ``functools.partial`` of the style's
    static method, its layouts bound) and the mesh are the lambda's cells.
    """
    found = []
    for hook in hooks.values():
        cells = [_content(cell) for cell in getattr(hook, "__closure__", None) or ()]
        mesh = next((c for c in cells if type(c).__name__ == "DeviceMesh"), None)
        found += [
            (cell, mesh)
            for cell in cells
            if isinstance(cell, functools.partial)
            and getattr(cell.func, "__name__", "") == name
        ]
    return found


def _content(cell: Any) -> Any:
    """Return what a closure cell holds (``None`` if it is empty)."""
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _sharded_dim(placements: Any) -> int | None:
    """Return the dim of the one ``Shard`` of a 1-D mesh's placements (else None)."""
    from torch.distributed.tensor import Shard  # noqa: PLC0415 (distributed nets only)

    if isinstance(placements, tuple) and len(placements) == 1:
        (placement,) = placements
        if isinstance(placement, Shard):
            return int(placement.dim)
    return None


def _local_output(module: nn.Module) -> tuple[DeviceMesh, int] | None:
    """Return the mesh and the dim a styled layer's plain output is sharded on.

    ``ColwiseParallel`` and ``RowwiseParallel`` bind ``(output_layouts,
    use_local_output)`` to their output function; ``SequenceParallel``
    binds ``(use_local_output,)``, its output sharded as its input is (the
    ``sequence_sharding`` bound to its input function). ``None``: the
    output stays a ``DTensor`` (its placements say), or no style says.
    """
    for output_fn, mesh in _hook_partials(module._forward_hooks, "_prepare_output_fn"):  # noqa: SLF001
        args = output_fn.args
        if mesh is None or mesh.ndim != 1 or not args or args[-1] is not True:
            continue
        if len(args) == 2:  # noqa: PLR2004 (output_layouts, use_local_output)
            dim = _sharded_dim(args[0])
        else:  # SequenceParallel: as its input
            inputs = _hook_partials(module._forward_pre_hooks, "_prepare_input_fn")  # noqa: SLF001
            dim = _sharded_dim(inputs[0][0].args[0]) if inputs else None
        if dim is not None:
            return mesh, dim
    return None


def _sequence_style(module: nn.Module) -> str | None:
    """Name the style of ``module`` if it takes or gives plain sequence slices.

    A plain input that its input function declares sharded on a dimension
    other than the last (``input_layouts=Shard(1)``, ``SequenceParallel``'s
    sequence dim), or a plain output sharded so (:func:`_local_output`).
    """
    style = None
    for input_fn, _ in _hook_partials(module._forward_pre_hooks, "_prepare_input_fn"):  # noqa: SLF001
        dim = _sharded_dim(input_fn.args[0]) if input_fn.args else None
        if dim is not None and dim != -1:
            style = input_fn.func.__qualname__.split(".")[0]
    found = _local_output(module)
    if found is not None and found[1] != -1:
        for output_fn, _ in _hook_partials(module._forward_hooks, "_prepare_output_fn"):  # noqa: SLF001
            style = output_fn.func.__qualname__.split(".")[0]
    return style


def _gather_along(piece: Tensor, local: _Local) -> Tensor:
    """Gather this rank's slice ``piece`` along ``local.dim`` into the whole tensor.

    The ranks' sizes along that dim are gathered first (a reduce-scatter
    of an uneven length leaves uneven slices).
    """
    import torch.distributed as dist  # noqa: PLC0415 (distributed nets only)
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415

    dim = local.dim % piece.ndim
    mine = torch.tensor([piece.shape[dim]], device=piece.device)
    sizes = [torch.empty_like(mine) for _ in range(local.mesh.size())]
    dist.all_gather(sizes, mine, group=local.mesh.get_group())
    shape = list(piece.shape)
    shape[dim] = int(sum(int(size) for size in sizes))
    stride = torch.empty(shape, device="meta").stride()
    spread = DTensor.from_local(
        piece.contiguous(),
        local.mesh,
        [Shard(dim)],
        run_check=False,
        shape=torch.Size(shape),
        stride=stride,
    )
    return spread.full_tensor()


def _scatter_along(whole: Tensor, local: _Local) -> Tensor:
    """Cut this rank's slice of ``whole`` along ``local.dim`` (no communication)."""
    from torch.distributed.tensor import Shard, distribute_tensor  # noqa: PLC0415

    spread = distribute_tensor(
        whole, local.mesh, [Shard(local.dim % whole.ndim)], src_data_rank=None
    )
    return spread.to_local()


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
