"""The catalogue: every detector of :mod:`scio_recorder.ood`, once, in order.

:data:`DETECTORS` is one ordered table of ``(name, factory)`` rows, a row a
detector, in the order the benchmark's tables and the demo show them: the
name they show, and how to build the detector for a trained classifier
(:class:`Classifier`: the wrapped net and the layers the detectors read).
Every list of the detectors is this table or is checked against it:

* :func:`~scio_recorder.ood.benchmark.catalogue` builds it for a net, and
  :data:`~scio_recorder.ood.benchmark.CATALOGUE` is its names (what
  :func:`~scio_recorder.ood.benchmark.run_benchmark` takes by name, and the
  demo's list);
* ``benchmarks/ood.py`` measures it;
* the package's face lists each class the table builds, with the module
  that defines it, in ``__all__``, its lazy map and its imports for type
  checkers; the docs give each class a row of the OoD page's table and a
  section of the API page, and state how many rows the table has:
  ``tests/test_package.py`` fails on any difference.

Adding a detector: its class in its family module, one row here; then the
test names what else must say so (the face's lists, which type checkers
and the docs read as written; the docs' table, API page and count).
"""

from __future__ import annotations

__all__ = ["DETECTORS", "LANGUAGE_MODELS", "Classifier"]

import dataclasses
from typing import TYPE_CHECKING

from ._adascale import AdaScale
from ._calibration import ODIN, TempScale
from ._collapse import NCI, NECO, Residual
from ._core import CORE
from ._coverage import NAC
from ._edits import VRA, RankFeat
from ._features import KNN, RMDS, Mahalanobis
from ._gradient import GradNorm
from ._gram import Gram
from ._isomax import IsoMax
from ._jtla import JTLA
from ._logits import MSP, Energy, Entropy, JointEnergy, MaxLogit
from ._multilayer import MahalanobisEnsemble
from ._neighbours import LID, DkNN, Trust
from ._ora import ORA
from ._perturbation import FeatureSqueezing, Odds
from ._probabilities import GEN, KLMatching
from ._prototypes import DICE, SHE, NNGuide, fDBD
from ._shaping import ASH, ReAct, Scale
from ._vim import ViM
from ._weiper import WeiPer

if TYPE_CHECKING:
    from collections.abc import Callable

    from scio_recorder.recorder import Recorder

    from ._protocol import Detector


LANGUAGE_MODELS = (
    "Surprisal",
    "EigenScore",
    "HiddenScore",
    "AttentionScore",
    "LookbackRatio",
    "Probe",
)
"""The detectors of the face that score a language model's tokens or answers,
not a classifier's inputs: the catalogue does not build them (its table is of
detectors for a trained classifier); they have pages of their own."""


@dataclasses.dataclass(frozen=True)
class Classifier:
    """A trained classifier, wrapped, and the layers the catalogue's detectors read.

    Detectors that read the logits or the last ``nn.Linear`` find them
    themselves; the others read the layers named here.
    """

    rnet: Recorder
    penultimate: str
    """The activation that ReAct, ASH, Scale, VRA and AdaScale edit."""
    blocks: tuple[str, ...]
    """Feature maps of the convolutional part, shallow to deep (RankFeat's
    edited passes, Gram's layers)."""
    d: int
    """ViM's and Residual's principal dimensions."""
    logits: int
    """The number of classes (NECO's principal dimensions)."""

    @property
    def deep(self) -> list[str]:
        """The blocks and the penultimate activation (the multi-layer detectors')."""
        return [*self.blocks, self.penultimate]


DETECTORS: tuple[tuple[str, Callable[[Classifier], Detector]], ...] = (
    ("MSP", lambda net: MSP(net.rnet)),
    ("MaxLogit", lambda net: MaxLogit(net.rnet)),
    ("Energy", lambda net: Energy(net.rnet)),
    ("Entropy", lambda net: Entropy(net.rnet)),
    ("GEN", lambda net: GEN(net.rnet)),
    ("KLMatching", lambda net: KLMatching(net.rnet)),
    ("TempScale", lambda net: TempScale(net.rnet)),
    ("ODIN", lambda net: ODIN(net.rnet)),
    ("ReAct", lambda net: ReAct(net.rnet, layer=net.penultimate)),
    ("ASH", lambda net: ASH(net.rnet, layer=net.penultimate)),
    ("Scale", lambda net: Scale(net.rnet, layer=net.penultimate)),
    ("Mahalanobis", lambda net: Mahalanobis(net.rnet)),
    ("KNN", lambda net: KNN(net.rnet, k=10)),
    ("ViM", lambda net: ViM(net.rnet, d=net.d)),
    ("DICE", lambda net: DICE(net.rnet)),
    ("SHE", lambda net: SHE(net.rnet)),
    ("NNGuide", lambda net: NNGuide(net.rnet)),
    ("RMDS", lambda net: RMDS(net.rnet)),
    ("fDBD", lambda net: fDBD(net.rnet)),
    ("GradNorm", lambda net: GradNorm(net.rnet)),
    ("NAC", lambda net: NAC(net.rnet, layers=net.deep)),
    ("MahalanobisEnsemble", lambda net: MahalanobisEnsemble(net.rnet, layers=net.deep)),
    ("Gram", lambda net: Gram(net.rnet, layers=list(net.blocks))),
    ("NCI", lambda net: NCI(net.rnet)),
    ("NECO", lambda net: NECO(net.rnet, d=net.logits)),
    ("Residual", lambda net: Residual(net.rnet, d=net.d)),
    ("RankFeat", lambda net: RankFeat(net.rnet, layers=list(net.blocks))),
    ("VRA", lambda net: VRA(net.rnet, layer=net.penultimate)),
    ("AdaScale", lambda net: AdaScale(net.rnet, layer=net.penultimate)),
    ("Mahalanobis++", lambda net: Mahalanobis(net.rnet, normalize=True)),
    ("RMDS++", lambda net: RMDS(net.rnet, normalize=True)),
    ("LID", lambda net: LID(net.rnet, k=10)),
    ("Trust", lambda net: Trust(net.rnet, alpha=0.1)),
    ("DkNN", lambda net: DkNN(net.rnet, layers=net.deep, k=10)),
    (
        "JTLA",
        lambda net: JTLA(
            net.rnet, layers=net.deep, test={"type": "multinomial", "k": 10}
        ),
    ),
    ("IsoMax", lambda net: IsoMax(net.rnet)),
    ("JointEnergy", lambda net: JointEnergy(net.rnet)),
    (
        "FeatureSqueezing",
        lambda net: FeatureSqueezing(net.rnet, squeezers=["bits:3", "median:2"]),
    ),
    ("Odds", lambda net: Odds(net.rnet, epsilon=0.1, noise_samples=32)),
    # WeiPer's perturbations from a generator of its own: the same for every
    # net and seed, whatever torch's global generator has drawn before.
    ("WeiPer", lambda net: WeiPer(net.rnet, generator=0)),
    ("CORE", lambda net: CORE(net.rnet)),
    ("ORA", lambda net: ORA(net.rnet)),
)
"""Every detector, in the benchmark's order: ``(name, factory)``.

The name is the class's, except ``"Mahalanobis++"`` and ``"RMDS++"``
(``normalize=True``); a factory builds an unfitted detector for a
:class:`Classifier`. Hyperparameters are the detectors' defaults except
where a value is given here (the reasons are on
:func:`~scio_recorder.ood.benchmark.catalogue`)."""
