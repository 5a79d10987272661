"""Collect layer statistics and features over a whole data set.

:func:`collect` runs a :class:`~scio_recorder.Recorder` over every batch of an
iterable (a ``DataLoader``, a list, a generator) and feeds what the chosen
layers output to reducers (:mod:`scio_recorder.reduce`):

* streaming statistics whose memory does not grow with the data set (moments,
  covariances, per-class statistics, Gram matrices, quantile sketches, ...),
  exact and in float64;
* ``"concat"``: the per-sample features themselves, kept on the CPU and
  spilled to disk beyond a memory budget; the result is one tensor, memory
  mapped from its file when it was spilled.

With a ``spill_dir`` the run checkpoints as it goes (reducer states, spilled
rows and a manifest, written atomically), so an interrupted run, rerun with
the same arguments, resumes after its last checkpoint and gives exactly the
result of an uninterrupted run. Under :mod:`torch.distributed` each rank
reduces its shard, then the statistics are merged and the concatenations
gathered. :func:`estimate` says beforehand how many bytes a run handles.

Why: out-of-distribution scores and probes need statistics or features of a
few layers over a whole training set, and the loop that computes them is
easy to get subtly wrong: autograd graphs kept alive, the recorder's
selection left changed, every feature held in RAM, hours lost to a crash,
ranks not merged. This module writes that loop once. Semantics and file
layout are documented in ``docs/collect.md``.

This package is the public face: it re-exports the public names defined in
its private modules, one concept each:

* ``_collect``: the entry points :func:`collect` and :func:`estimate`, the
  option checks and the assembly of the result, and the class that makes
  this module callable;
* ``_specs``: the specs of ``keep`` and their plan, one slot per label
  (``ReducerSpec``, ``BatchSpec``, ``Gather``, ``CONCAT``, ``STATISTICS``);
* ``_estimate``: :class:`Estimate`, :class:`LabelEstimate`;
* ``_loop``: the per-batch loop and the batch plumbing;
* ``_spill``: concatenations in RAM, raw files, memory maps, the lock file
  (``LOCK``) of a spill folder in use;
* ``_checkpoint``: manifest (``MANIFEST``), fingerprint, atomic writes,
  resuming;
* ``_distributed``: merging and gathering across ranks;
* ``_parts``: runs split over independent workers (``collect(...,
  part=K, parts=N, save=folder)``, no process group) and :func:`merge`;
* ``_results``: :class:`CollectResult` and its file format;
* ``_progress``: the progress bar (tqdm).

The module is callable: ``scio_recorder.collect(rnet, batches, keep)``
calls the function :func:`collect` (``import scio_recorder.collect as m``
gives this module; ``m.collect`` is the function).

Examples
--------
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> from scio_recorder.collect import collect
>>> _ = torch.manual_seed(0)
>>> net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
>>> rnet = Recorder(net, input_size=(1, 5))
>>> data = [(torch.randn(8, 5), torch.randint(0, 3, (8,))) for _ in range(4)]
>>> result = collect(rnet, data, {(1, 1): "concat", "2": "moments"})
>>> result[(1, 1)].shape, result[(1, 3)].count, result.samples
(torch.Size([32, 4]), 32, 32)

"""

from __future__ import annotations

__all__ = [
    "CONCAT",
    "LOCK",
    "MANIFEST",
    "STATISTICS",
    "BatchSpec",
    "CollectResult",
    "Estimate",
    "Gather",
    "InputOf",
    "LabelEstimate",
    "ReducerSpec",
    "collect",
    "estimate",
    "merge",
]

import sys

from ._checkpoint import MANIFEST
from ._collect import COLLECT_SIGNATURE, CollectModule, collect, estimate
from ._estimate import Estimate, LabelEstimate
from ._parts import merge
from ._results import CollectResult
from ._specs import CONCAT, STATISTICS, BatchSpec, Gather, InputOf, ReducerSpec
from ._spill import LOCK

# The module is callable (``scio_recorder.collect(rnet, ...)`` calls the
# function), and ``inspect.signature`` of it is the function's.
sys.modules[__name__].__class__ = CollectModule
__signature__ = COLLECT_SIGNATURE
del sys, CollectModule, COLLECT_SIGNATURE
