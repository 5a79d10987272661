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
:func:`mahalanobis_scores` is the Mahalanobis score written out from the
statistics of :class:`~scio_recorder.reduce.SharedCovariance` (differentiable;
it was ``scio_recorder.recipes.mahalanobis_scores``).

| family | detectors |
|---|---|
| from the logits | :class:`MSP`, :class:`MaxLogit`, :class:`Energy`, :class:`Entropy` |
| from the predicted distribution | :class:`GEN`, :class:`KLMatching` |
| softmax at a temperature | :class:`TempScale`, :class:`ODIN` (input perturbation) |
| an edit in flight, then energy | :class:`ReAct`, :class:`ASH`, :class:`Scale` |
| from features | :class:`Mahalanobis`, :class:`KNN`, :class:`ViM` |
| prototypes, last layer | :class:`DICE`, :class:`SHE`, :class:`NNGuide`, |
| | :class:`RMDS`, :class:`fDBD` |
| from gradients | :class:`GradNorm`, :class:`NAC` (a backward pass per batch) |
| several layers, one pass | :class:`MahalanobisEnsemble`, :class:`Gram` |
| the classifier's features | :class:`NCI`, :class:`NECO`, :class:`Residual` |
| an edit of a block in flight | :class:`RankFeat`, :class:`VRA` |

This package is the public face; one detector family a private module
(``_logits``, ``_probabilities``, ``_calibration``, ``_shaping``,
``_features``, ``_prototypes``, ``_gradient``, ``_multilayer``,
``_collapse``, ``_edits``, ``_coverage``), the protocol in
``_protocol``, the shared passes in ``_passes``, the checks every
detector applies in ``_checks``, :func:`evaluate` in ``_evaluate``.

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
    "DICE",
    "GEN",
    "KNN",
    "MSP",
    "NAC",
    "NCI",
    "NECO",
    "ODIN",
    "RMDS",
    "SHE",
    "VRA",
    "Detector",
    "Energy",
    "Entropy",
    "Evaluation",
    "GradNorm",
    "Gram",
    "KLMatching",
    "Mahalanobis",
    "MahalanobisEnsemble",
    "MaxLogit",
    "NNGuide",
    "NotFittedError",
    "OoDResults",
    "Pass",
    "RankFeat",
    "ReAct",
    "Residual",
    "Scale",
    "StateEntry",
    "TempScale",
    "ViM",
    "evaluate",
    "fDBD",
    "fit_detectors",
    "mahalanobis_scores",
    "score_sets",
]

from ._calibration import ODIN, TempScale
from ._collapse import NCI, NECO, Residual
from ._coverage import NAC
from ._edits import VRA, RankFeat
from ._evaluate import Evaluation, OoDResults, evaluate, score_sets
from ._features import KNN, Mahalanobis, ViM, mahalanobis_scores
from ._gradient import GradNorm
from ._logits import MSP, Energy, Entropy, MaxLogit
from ._multilayer import Gram, MahalanobisEnsemble
from ._passes import fit_detectors
from ._probabilities import GEN, KLMatching
from ._protocol import Detector, NotFittedError, Pass, StateEntry
from ._prototypes import DICE, RMDS, SHE, NNGuide, fDBD
from ._shaping import ASH, ReAct, Scale
