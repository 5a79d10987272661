"""The parts of an execution graph: :class:`Node`, :class:`Edge`, :class:`Cluster`.

They live below the graph (``_model``) and its drawing (``_dot``), which both
use them.
"""

from __future__ import annotations

__all__ = ["Cluster", "Edge", "Node", "NodeKind"]

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from scio_recorder.layers import label_str

if TYPE_CHECKING:
    from scio_recorder.layers import DepthIdx

Shape = tuple[Any, ...]

NodeKind = Literal["input", "module", "function", "output"]


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the graph.

    Attributes
    ----------
    kind : {"input", "module", "function", "output"}
        What the node stands for.
    name : str
        The qualified module name (module nodes), the operation's name
        (``add``, ``cat``, ``flatten``, ``getitem``, ...), or the input's /
        output's path (``input``, ``attention_mask``, ``output.logits``).
    label : tuple of int or None
        The table's ``(depth, idx)`` label of a module call.
    shapes : tuple
        The shapes of the tensors it output (a ragged dimension of a nested
        tensor shows as ``<=n``).
    recorded : bool
        Whether the recorder's selection records this call (output, input or
        gradient).
    failed : bool
        Whether the pass raised here (see :class:`GraphError`).
    type : str or None
        The module's class name (module nodes).
    calls : int
        How many calls the node stands for (more than one when rolled).
    scope : tuple of str
        The clusters (containers) around the node, outermost first.
    """

    kind: NodeKind
    name: str
    label: DepthIdx | None = None
    shapes: tuple[Shape, ...] = ()
    recorded: bool = False
    failed: bool = False
    type: str | None = None
    calls: int = 1
    scope: tuple[str, ...] = ()

    def title(self) -> str:
        """Return the node's words, as the table writes them: ``Linear (fc): 1-3``."""
        if self.kind == "module":
            where = f" ({self.name})" if self.name else ""
            label = f": {label_str(self.label)}" if self.label is not None else ""
            return f"{self.type}{where}{label}"
        return self.name


class Edge(NamedTuple):
    """Data flow: ``source`` produced a tensor of ``shape`` that ``target`` used."""

    source: int
    target: int
    shape: Shape


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A module call shown as a box around the nodes it holds (a container)."""

    key: str
    label: DepthIdx | None
    name: str
    type: str
    parent: str | None
    failed: bool = False
    recorded: bool = False

    def title(self) -> str:
        """Return the container's words, as the table writes them."""
        label = f": {label_str(self.label)}" if self.label is not None else ""
        return f"{self.type} ({self.name}){label}"
