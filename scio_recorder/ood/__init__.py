"""Out-of-distribution detection on an unmodified net, by layer label or name.

Every detector wraps a :class:`~scio_recorder.Recorder`: the layers it reads
or edits are named as for :meth:`~scio_recorder.Recorder.record` (a label, a
qualified name, a type), the net is not cut by hand into a backbone and a
head, and edits are applied in flight. ``fit`` is one streaming
:func:`~scio_recorder.collect.collect` pass over in-distribution data (two
for ViM); ``score(x)`` (or ``detector(x)``) returns one score per sample,
**higher = more likely OoD** (pytorch-ood's convention); fitted state saves
to and loads from safetensors files. :func:`evaluate` scores data sets with
several detectors sharing passes and rates them
(:mod:`scio_recorder.ood.metrics`): one :class:`OoDResults` table for
several OoD sets; :func:`score_sets` scores named sets with shared passes
for your own metrics. A detector of your own subclasses :class:`Detector`
(see the docs page "Write your own detector").

| family | detectors |
|---|---|
| from the logits | :class:`MSP`, :class:`MaxLogit`, :class:`Energy`, :class:`Entropy` |
| an edit in flight, then energy | :class:`ReAct`, :class:`ASH`, :class:`Scale` |
| from features | :class:`Mahalanobis`, :class:`KNN`, :class:`ViM` |
| from gradients | :class:`GradNorm` |

This package is the public face; one detector family a private module
(``_logits``, ``_shaping``, ``_features``, ``_gradient``), the protocol and
the shared passes in ``_base``, :func:`evaluate` in ``_evaluate``.

Examples
--------
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> from scio_recorder.ood import Energy, Mahalanobis
>>> _ = torch.manual_seed(0)
>>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
>>> rnet = Recorder(net, input_size=(1, 4))
>>> train = [(torch.randn(32, 4), torch.arange(32) % 3)]
>>> maha = Mahalanobis(rnet).fit(train, target=1)  # the last Linear's input
>>> maha(torch.randn(5, 4)).shape, Energy(rnet)(torch.randn(5, 4)).shape
(torch.Size([5]), torch.Size([5]))

"""

from __future__ import annotations

__all__ = [
    "ASH",
    "KNN",
    "MSP",
    "Detector",
    "Energy",
    "Entropy",
    "Evaluation",
    "GradNorm",
    "Mahalanobis",
    "MaxLogit",
    "NotFittedError",
    "OoDResults",
    "Pass",
    "ReAct",
    "Scale",
    "StateEntry",
    "ViM",
    "evaluate",
    "fit_detectors",
    "score_sets",
]

from ._base import Detector, NotFittedError, Pass, StateEntry, fit_detectors
from ._evaluate import Evaluation, OoDResults, evaluate, score_sets
from ._features import KNN, Mahalanobis, ViM
from ._gradient import GradNorm
from ._logits import MSP, Energy, Entropy, MaxLogit
from ._shaping import ASH, ReAct, Scale
