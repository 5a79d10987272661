"""The layer table: one labelled row per module call of a reference pass.

A :class:`LayerTable` is pure data, built once per :class:`~scio_recorder.Recorder`
by :func:`build_table`. It runs :func:`torchinfo.summary` (which gives the
reference scio Recorder its labels and its printed table) and, during the same
forward pass, logs every module call itself. The rows are rebuilt from that log
because torchinfo 1.8.0 mislabels a few common structures:

* a module instance shared by several blocks is shown under the *last* block
  that declares it, with a phantom copy of that block's row before its first
  call (the reference Recorder then silently records the wrong call);
* containers that never run (``ModuleList``, ``ModuleDict``, a parent whose
  children are called directly) are inserted as rows, and the same row object
  is inserted again for each group of children, so one label is printed twice;
* calls that nest inside a call of the same module are counted by the order in
  which they *end*, not start.

The labelling rule (documented in ``docs/labels.md``):

1. Every module call of the reference pass gives one row, in the order the
   calls start. Its depth is the number of components of the module's
   qualified name (the root net has depth 0). A module registered under several
   names takes the name that continues the enclosing call's name (so a shared
   ``ReLU`` called inside ``b1`` is ``b1.act``, not ``b2.act``).
2. Before a call row whose ancestors (by qualified name) are not the rows just
   above it, a *container row* is inserted for each missing ancestor, as
   torchinfo does. Container rows are not calls: they cannot be recorded.
3. ``idx`` counts rows of the same depth from the top of the table, starting
   at 1. The root net is ``(0, 1)``.

Wherever torchinfo already gives one row per call, this yields exactly
torchinfo's rows and labels, so tables and code written for the reference
Recorder agree.

This package is the public face; the table itself (:class:`Layer`,
:class:`LayerTable`, labels, :func:`as_table`, :func:`build_table`, which
turns the call log into rows) is in ``_table``, the reference pass in
``_reference`` (the call log, the pass that fills it, the example inputs),
the bridge to torchinfo in ``_torchinfo`` (its rows and statistics, the
patches of one summary, nested tensors' sizes).
"""

from __future__ import annotations

__all__ = [
    "DepthIdx",
    "Layer",
    "LayerTable",
    "RaggedDim",
    "as_table",
    "build_table",
    "example_inputs",
    "label_str",
    "nested_size",
    "parse_label",
    "reference_kwargs",
]
from ._reference import example_inputs, reference_kwargs
from ._table import (
    DepthIdx,
    Layer,
    LayerTable,
    as_table,
    build_table,
    label_str,
    parse_label,
)
from ._torchinfo import RaggedDim, nested_size
