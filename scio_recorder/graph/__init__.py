"""Execution graphs: what one forward pass did, at any depth, drawn.

:meth:`Recorder.graph <scio_recorder.Recorder.graph>` runs the net once and
returns an :class:`ExecutionGraph`: module calls labelled like the table, the
tensor operations between them, the net's inputs and outputs, and edges that
follow the data (skip connections included). Views at another depth, or with
repeated calls rolled into one node, come from the same pass. ``to_dot()``
gives Graphviz DOT source with no dependency; ``render()`` and Jupyter's rich
display draw it when the ``graph`` extra and Graphviz's ``dot`` are there. A
pass that raises gives a :class:`GraphError` holding the graph up to the
failing call. :func:`graph_of` draws a net without a Recorder (the calls
labelled by the graph pass itself), so also a net that fails on its first
pass.

This package is the public face; the parts are private modules:

* ``_capture``: the pass (a torch function mode and forward wrappers, both
  scoped to the pass), recording every call and operation;
* ``_nodes``: :class:`Node`, :class:`Edge`, :class:`Cluster`;
* ``_model``: :class:`ExecutionGraph` and its views, :class:`GraphError`;
* ``_dot``: DOT text and rendering.

Examples
--------
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> class Residual(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc = nn.Linear(4, 4)
...
...     def forward(self, x):
...         return x + self.fc(x)
>>> rnet = Recorder(Residual(), input_size=(2, 4))
>>> graph = rnet.graph()
>>> [node.title() for node in graph.nodes]
['input', 'Linear (fc): 1-1', 'add', 'output']
>>> graph.predecessors(2)  # the residual add reads the input and the Linear
[0, 1]

"""

from __future__ import annotations

__all__ = [
    "Cluster",
    "Edge",
    "ExecutionGraph",
    "GraphError",
    "Node",
    "graph_of",
    "trace_graph",
]

from ._model import ExecutionGraph, GraphError
from ._nodes import Cluster, Edge, Node
from ._trace import graph_of, trace_graph
