"""A self-check of a recording job: are the records what you think they are.

:func:`scio_recorder.check` (also :meth:`Recorder.check
<scio_recorder.Recorder.check>` and ``scio-recorder check``) runs the user's
model on the user's batch a few times and reports six checks, one line
each, PASS, WARN or FAIL, with the largest difference, where it is, and its
likely cause in words:

* ``"recording"``: the net's outputs with the recorder and without it
  (no hook at all), same random state: bit-equal; and the records hold no
  NaN or inf (else WARN, naming the first call that has them);
* ``"batch"``: each row's records batched against the row run alone, its
  padding removed (a 2-D ``attention_mask`` tells which columns are
  padding): equal up to float rounding. This catches position ids that
  follow the padding, ``BatchNorm`` in train mode and any leak across rows;
* ``"determinism"``: two passes on the batch, the second from where the
  first left the net: bit-equal (dropout left on, random operations, state
  kept between passes, nondeterministic kernels); a pass that draws random
  numbers (the global generators' states before and after it: a dropout
  module in train mode with ``p > 0``, ``F.dropout`` in a forward,
  ``torch.randn_like``) warns even when the two passes agree;
* ``"dtype"``: the records against those of a copy of the model in a wider
  dtype (float32 for bfloat16 and float16 models, float64 for float32
  ones), as relative error per layer;
* ``"inplace"``: the records a later in-place operation overwrites (known
  from the reference pass, and copied so that they stay exact), and any
  record changed in place that nobody could know in advance;
* ``"calls"``: each checked call ran as in the reference pass (the call
  plan).

An empty batch, or records that hold no value, is refused (a
``ValueError`` naming the shape): every comparison would be over nothing.
What a check could not compare makes it WARN, never PASS (FAIL where the
cause is certain all the same: a BatchNorm in train mode), and its cause
says what and why: records with no batch dimension (a record's batch
dimension is told by its shapes, batched and alone), inputs whose dim 0 is
not the batch (a sequence-first module shows it; ``batch_dim=`` says
where it is), rows of padding only, rows that raise alone, and models a
wider copy cannot stand for (quantized, tensor-parallel). Every compared
pass starts from the buffers the check found, and its records are copies
taken as it ends, so state kept between passes shows in ``determinism``
only.

Tolerances. Records computed by different kernels (a batch of 5 rows is
not blocked as a batch of 1) differ by roundings: up to ``1024 eps`` of the
record's dtype, relative to the record's largest magnitude, is rounding
(PASS); beyond ``100`` times that, or beyond 0.5, it is not (FAIL); in
between, WARN. Bit-equal checks (recording, determinism) pass only when
equal; a difference within the rounding tolerance warns. A NaN equals a
NaN at the same place; a NaN or an infinity on one side only is an
infinite difference.

Why a package of its own: the checks run the recorder and its net many
times and compare what they give, which no pass of the engine does; it is
loaded when first used (``scio_recorder.check``, ``rnet.check``), not by
``import scio_recorder``. It takes the recorder as it is given (the
recorder's module imports it, not the other way round). This face
re-exports; the parts, each readable alone:

* ``_report``: :class:`CheckLine`, :class:`CheckReport` and their tables;
* ``_measure``: the relative difference of two records, and its verdict;
* ``_passes``: the compared passes, from the random state and buffers the
  check found;
* ``_random``: whether a pass drew random numbers, and which modules drew;
* ``_rows`` and ``_batch``: rows alone against the batch (the records'
  batch dimension, padding cut), and the batch line with its causes;
* ``_exact``: recording and determinism, the bit-equal checks;
* ``_dtype``: the wider copy;
* ``_plan``: in-place overwrites and the call plan;
* ``_check``: the entry points, which run the checks in order.
"""

from __future__ import annotations

__all__ = ["CHECKS", "CheckLine", "CheckReport", "check_net", "check_recorder"]

from ._check import check_net, check_recorder
from ._report import CHECKS, CheckLine, CheckReport
