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
(see the docs page "Write your own detector"). A class-conditional detector
(:class:`ClassConditional`: Mahalanobis, RMDS, MahalanobisEnsemble,
KLMatching, SHE, Trust, DkNN, JTLA, IsoMax, Odds) also gives
``score_classes(x)``, one score per class, and reads the closest or the
predicted class (``at=``).
:func:`mahalanobis_scores` is the Mahalanobis score written out from the
statistics of :class:`~scio_recorder.reduce.SharedCovariance` (differentiable;
it was ``scio_recorder.recipes.mahalanobis_scores``).

| family | detectors |
|---|---|
| from the logits | :class:`MSP`, :class:`MaxLogit`, :class:`Energy`, |
| | :class:`Entropy`, :class:`JointEnergy` |
| prototypes of the logits | :class:`IsoMax` (fitted post hoc) |
| from the predicted distribution | :class:`GEN`, :class:`KLMatching` |
| softmax at a temperature | :class:`TempScale`, :class:`ODIN` (input perturbation) |
| an edit in flight, then energy | :class:`ReAct`, :class:`ASH`, :class:`Scale`, |
| | :class:`AdaScale` (passes of its own) |
| from features | :class:`Mahalanobis`, :class:`KNN`, :class:`ViM` |
| prototypes, last layer | :class:`DICE`, :class:`SHE`, :class:`NNGuide`, |
| | :class:`RMDS`, :class:`fDBD` |
| from gradients | :class:`GradNorm`, :class:`NAC` (a backward pass per batch) |
| several layers, one pass | :class:`MahalanobisEnsemble`, :class:`Gram` |
| the nearest fit samples | :class:`LID`, :class:`Trust`, :class:`DkNN`, |
| | :class:`JTLA` (layers in one pass) |
| the classifier's features | :class:`NCI`, :class:`NECO`, :class:`Residual` |
| an edit of a block in flight | :class:`RankFeat`, :class:`VRA` |
| the classifier's weights | :class:`WeiPer` (perturbed), :class:`CORE` (their span), |
| | :class:`ORA` (the angles to its boundaries) |
| the input moved | :class:`FeatureSqueezing`, :class:`Odds` (noise); ``epsilon=`` of |
| | :class:`Mahalanobis`, :class:`RMDS`, :class:`MahalanobisEnsemble` |
| a language model, per token | :class:`Surprisal`; ``token="each"`` of |
| | :class:`Mahalanobis`, :class:`MahalanobisEnsemble`, :class:`DkNN`, |
| | :class:`JTLA`, :class:`Probe`, :class:`MSP`, :class:`MaxLogit`, |
| | :class:`Energy`, :class:`Entropy`, :class:`GEN` (``score_tokens``, |
| | ``calibrate``) |
| hallucination, internal states | :class:`EigenScore`, :class:`HiddenScore`, |
| | :class:`AttentionScore`, :class:`LookbackRatio`, :class:`Probe` |

This package is the public face; one detector family a private module
(``_logits``, ``_probabilities``, ``_calibration``, ``_shaping``,
``_adascale``, ``_features``, ``_vim``, ``_prototypes``, ``_gradient``,
``_gram``, ``_multilayer``, ``_collapse``, ``_edits``, ``_coverage``,
``_neighbours``, ``_jtla``, ``_isomax``, ``_perturbation``, ``_weiper``,
``_core``, ``_ora``, ``_lm``, ``_eigenscore``, ``_llmcheck``, ``_lookback``,
``_probe``), each standing on the shared ground floor and the protocol,
never on another family (WeiPer, CORE and ORA share their base
in ``_weights``, the hallucination scores theirs in ``_states``). The
ground floor:
``_layers`` (layers resolved and pooled, the bases of the detectors that
read one layer, several layers, their nearest fit samples, or edit a layer),
``_geometry`` (norms, Mahalanobis distances, class sums), ``_inputs`` (the
input moved: epsilon, the gradient step, noise), ``_outputs`` (the logits,
their scores, the predicted label). The protocol in ``_protocol``
(class-conditional reading in ``_classes``, layer aggregation in
``_pvalues``), the nearest-neighbour search in ``_search`` (its fit bank in
``_bank``), the shared passes in ``_passes``, the checks every detector
applies in ``_checks``, the rows it scores (empty batches, non-finite rows)
in ``_rows``, :func:`evaluate` in ``_evaluate`` (its results and their
tables in ``_results``).

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
    "CORE",
    "DICE",
    "GEN",
    "JTLA",
    "KNN",
    "LID",
    "MSP",
    "NAC",
    "NCI",
    "NECO",
    "ODIN",
    "ORA",
    "RMDS",
    "SHE",
    "VRA",
    "AdaScale",
    "AttentionScore",
    "ClassConditional",
    "Detector",
    "DkNN",
    "EigenScore",
    "Energy",
    "Entropy",
    "Evaluation",
    "FeatureSqueezing",
    "GradNorm",
    "Gram",
    "HiddenScore",
    "IsoMax",
    "JointEnergy",
    "KLMatching",
    "LookbackRatio",
    "Mahalanobis",
    "MahalanobisEnsemble",
    "MaxLogit",
    "NNGuide",
    "NotFittedError",
    "Odds",
    "OoDResults",
    "Pass",
    "Probe",
    "RankFeat",
    "ReAct",
    "Residual",
    "Scale",
    "StateEntry",
    "Surprisal",
    "TempScale",
    "Trust",
    "ViM",
    "WeiPer",
    "attention_score",
    "eigen_score",
    "evaluate",
    "fDBD",
    "fit_detectors",
    "hidden_score",
    "lookback_ratios",
    "mahalanobis_scores",
    "score_sets",
]

from typing import TYPE_CHECKING

from scio_recorder._support.lazy import lazy_attributes

# Each public name -> the module that defines it, imported when the name is
# first used (see `scio_recorder._support.lazy`); the imports under `TYPE_CHECKING`
# say the same to type checkers and the docs.
__getattr__, __dir__ = lazy_attributes(
    __name__,
    {
        "ASH": "._shaping",
        "AdaScale": "._adascale",
        "CORE": "._core",
        "ClassConditional": "._classes",
        "DICE": "._prototypes",
        "Detector": "._protocol",
        "DkNN": "._neighbours",
        "Energy": "._logits",
        "Entropy": "._logits",
        "Evaluation": "._results",
        "FeatureSqueezing": "._perturbation",
        "GEN": "._probabilities",
        "GradNorm": "._gradient",
        "Gram": "._gram",
        "IsoMax": "._isomax",
        "JTLA": "._jtla",
        "JointEnergy": "._logits",
        "KLMatching": "._probabilities",
        "KNN": "._features",
        "LID": "._neighbours",
        "MSP": "._logits",
        "Mahalanobis": "._features",
        "MahalanobisEnsemble": "._multilayer",
        "MaxLogit": "._logits",
        "NAC": "._coverage",
        "NCI": "._collapse",
        "NECO": "._collapse",
        "NNGuide": "._prototypes",
        "NotFittedError": "._protocol",
        "ODIN": "._calibration",
        "ORA": "._ora",
        "Odds": "._perturbation",
        "OoDResults": "._results",
        "Pass": "._protocol",
        "RMDS": "._features",
        "RankFeat": "._edits",
        "ReAct": "._shaping",
        "Residual": "._collapse",
        "SHE": "._prototypes",
        "Scale": "._shaping",
        "StateEntry": "._saving",
        "Surprisal": "._lm",
        "AttentionScore": "._llmcheck",
        "EigenScore": "._eigenscore",
        "HiddenScore": "._llmcheck",
        "LookbackRatio": "._lookback",
        "Probe": "._probe",
        "attention_score": "._llmcheck",
        "eigen_score": "._eigenscore",
        "hidden_score": "._llmcheck",
        "lookback_ratios": "._lookback",
        "TempScale": "._calibration",
        "Trust": "._neighbours",
        "VRA": "._edits",
        "ViM": "._vim",
        "WeiPer": "._weiper",
        "evaluate": "._evaluate",
        "fDBD": "._prototypes",
        "fit_detectors": "._passes",
        "mahalanobis_scores": "._features",
        "score_sets": "._evaluate",
    },
)

if TYPE_CHECKING:
    from ._adascale import AdaScale
    from ._calibration import ODIN, TempScale
    from ._classes import ClassConditional
    from ._collapse import NCI, NECO, Residual
    from ._core import CORE
    from ._coverage import NAC
    from ._edits import VRA, RankFeat
    from ._eigenscore import EigenScore, eigen_score
    from ._evaluate import evaluate, score_sets
    from ._features import KNN, RMDS, Mahalanobis, mahalanobis_scores
    from ._gradient import GradNorm
    from ._gram import Gram
    from ._isomax import IsoMax
    from ._jtla import JTLA
    from ._llmcheck import AttentionScore, HiddenScore, attention_score, hidden_score
    from ._lm import Surprisal
    from ._logits import MSP, Energy, Entropy, JointEnergy, MaxLogit
    from ._lookback import LookbackRatio, lookback_ratios
    from ._multilayer import MahalanobisEnsemble
    from ._neighbours import LID, DkNN, Trust
    from ._ora import ORA
    from ._passes import fit_detectors
    from ._perturbation import FeatureSqueezing, Odds
    from ._probabilities import GEN, KLMatching
    from ._probe import Probe
    from ._protocol import Detector, NotFittedError, Pass
    from ._prototypes import DICE, SHE, NNGuide, fDBD
    from ._results import Evaluation, OoDResults
    from ._saving import StateEntry
    from ._shaping import ASH, ReAct, Scale
    from ._vim import ViM
    from ._weiper import WeiPer
