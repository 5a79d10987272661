"""Reducers: fold records across calls, or stream statistics over a data set.

One protocol, two jobs
----------------------
A recorded layer produces one *record* (a tensor, usually a batch) per call.
Two things are commonly done with a stream of records, and both are served by
the same small protocol, :class:`Reducer`:

* **Folding across calls or passes** (``torchfunc`` parity): keep every record
  (:class:`Keep`), or fold them elementwise with ``acc = fn(acc, new)``
  (:class:`Fold`, and the ready folds :class:`Sum`, :class:`Max`,
  :class:`Min`, :class:`RecordMean`). Records must have equal shapes.
  :func:`make_reducer` turns ``"all"``, ``"keep"``, ``"sum"``, ``"mean"``,
  ``"max"``, ``"min"`` or a callable into a reducer.
* **Data-set statistics over samples**: dim 0 of every record is the sample
  (batch) dimension and the other dims are the features (flattened where a
  matrix is needed): :class:`Count`, :class:`Moments`, :class:`Covariance`,
  :class:`SharedCovariance`, :class:`MinMax`, :class:`Gram`,
  :class:`FeatureMapGram`, :class:`Quantiles`, :class:`Concat`, and
  :class:`PerClass` to split any of them by class label.

A reducer is a plain object::

    r.update(record, target=None)  # feed one record (target: class labels)
    r.merge(other)  # absorb a reducer of the same kind/config
    r.result()  # the current result; state is kept
    r.state() / r.load_state(s)  # flat dict of tensors, to save or gather
    r.fresh()  # a new empty reducer with the same config
    r.count  # samples seen (records, for folds)

Why one protocol: the code that feeds records (a recorder hook, a loop over a
data loader, a distributed job) does not need to know what is computed, and
a new statistic plugs in by implementing five methods.

Why mergeable: the statistics are exact *and* mergeable, so a data set can be
split across ranks, shards or threads, each part reduced on its own
(:meth:`fresh` builds the per-part reducers) and the parts merged in any
order. Moments use Welford/Chan updates in float64 (one two-pass batch
statistic per update, then a Chan merge), so a long stream with a large
offset keeps its precision. :meth:`state` is a flat ``dict[str, Tensor]`` that
``torch.save`` and ``torch.distributed`` gather handle directly.

Conventions
-----------
* Accumulators live on the record's device; :meth:`update` never synchronises
  with the host (no ``.item()``), except :class:`PerClass` (one sync per update
  to split the batch by label) and :class:`SharedCovariance` without
  ``num_classes`` (one sync to grow the class table), and :class:`Concat`,
  whose job is to copy to the CPU.
* **Result dtypes.** Anything computed by arithmetic (sums, means, moments,
  covariances, Gram matrices, quantiles) is accumulated and returned in
  ``float64``. Reducers that only select or store values (:class:`Keep`,
  :class:`Concat`, :class:`Max`, :class:`Min`, :class:`MinMax`, a user
  :class:`Fold`) return the input's dtype.
* Built-in reducers detach records (statistics carry no autograd graph).
* ``float64`` is not supported on Apple MPS: reduce on the CPU there.

Where the code lives
--------------------
This package is the public home of every reducer; import them from here. It
re-exports the protocol, :func:`make_reducer` and the reducers, implemented
in private modules by concept:

* ``_base``: the :class:`Reducer` protocol and the plumbing the built-in
  reducers share (record checks, counts and shapes in states), and
  :func:`check_class_labels` (also what ``collect`` checks targets with);
* ``_folds``: :class:`Keep`, :class:`Fold`, :class:`Sum`,
  :class:`RecordMean`, :class:`Max`, :class:`Min`, and :class:`Count`;
* ``_moments``: :class:`Moments`, :class:`Covariance`, :class:`Gram`;
* ``_per_class``: :class:`SharedCovariance`, :class:`PerClass`;
* ``_extremes``: :class:`MinMax`, :class:`FeatureMapGram`;
* ``_concat``: :class:`Concat`;
* ``_quantiles``: :class:`Quantiles`, :func:`quantile_rank_bound`;
* ``_make``: :func:`make_reducer` and the names it accepts;
* ``_tee``: :class:`Tee`, one record fed to several reducers.

Re-exported names keep the ``__module__`` of the file that defines them (so
``inspect.getsource`` and tracebacks find them). What is written to disk
(saved results, checkpoint fingerprints) names the public path,
``scio_recorder.reduce``, whatever file implements it (see
``scio_recorder._support.public.public_module``).

Examples
--------
>>> import torch
>>> from scio_recorder.reduce import Moments
>>> parts = [Moments(), Moments()]
>>> parts[0].update(torch.tensor([[1.0], [2.0]]))
>>> parts[1].update(torch.tensor([[3.0], [4.0], [5.0]]))
>>> total = parts[0].fresh()
>>> for part in reversed(parts):
...     total.merge(part)
>>> stats = total.result()
>>> stats.count, stats.mean.item(), stats.var.item()
(5, 3.0, 2.5)

"""

from __future__ import annotations

__all__ = [
    "REDUCTION_NAMES",
    "Concat",
    "Count",
    "CountResult",
    "Covariance",
    "CovarianceResult",
    "FeatureMapGram",
    "FeatureMapGramResult",
    "Fold",
    "Gram",
    "GramResult",
    "Keep",
    "Max",
    "Min",
    "MinMax",
    "MinMaxResult",
    "Moments",
    "MomentsResult",
    "PerClass",
    "Quantiles",
    "RecordMean",
    "Reducer",
    "SharedCovariance",
    "SharedCovarianceResult",
    "Sum",
    "Tee",
    "check_class_labels",
    "make_reducer",
    "quantile_rank_bound",
]

from ._base import Reducer, check_class_labels
from ._concat import Concat
from ._extremes import FeatureMapGram, FeatureMapGramResult, MinMax, MinMaxResult
from ._folds import Count, CountResult, Fold, Keep, Max, Min, RecordMean, Sum
from ._make import REDUCTION_NAMES, make_reducer
from ._moments import (
    Covariance,
    CovarianceResult,
    Gram,
    GramResult,
    Moments,
    MomentsResult,
)
from ._per_class import PerClass, SharedCovariance, SharedCovarianceResult
from ._quantiles import Quantiles, quantile_rank_bound
from ._tee import Tee
