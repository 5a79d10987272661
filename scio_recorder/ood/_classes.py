"""Class-conditional detectors: a score per class, and which class a sample's is.

A class-conditional detector measures how well a sample fits each class
(its distance to the class mean, the neighbours of that class, ...): it
computes one score per class, ``[batch, classes]``, higher = the sample
fits that class worse (:meth:`ClassConditional.class_scores`), and the
protocol does the rest, once for all of them:

* ``score(x)``: the sample's score at one class, chosen by ``at=``:
  ``"closest"``, the class it fits best (the lowest score of its row;
  Mahalanobis' *minimum* distance), or ``"predicted"``, the class the net
  predicts (``argmax`` of the logits of the same pass), as scio reads every
  class-conditional score. A detector whose paper reads another class by
  default (SHE: the predicted one) says so.
* ``score_classes(x, mode=)``: the whole row, in one of scio's inter-class
  modes (:func:`class_mode`): ``"raw"`` as computed, ``"diff"`` and
  ``"ratio"`` the preference over the best other class.

scio's *conformity* (higher = in-distribution) is the negated score:
``score_classes(x, mode)`` is ``-conformity`` of scio's score in that
``mode``, so a score read at the predicted class is ``-conformity`` at
``argmax(logits)``, the number ``scio.eval`` ranks.
"""

from __future__ import annotations

__all__ = [
    "AT",
    "MODES",
    "ClassConditional",
    "check_at",
    "class_count",
    "class_mode",
    "predicted_classes",
]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._checks import net_classes
from ._protocol import Detector, run_pass
from ._rows import empty_batch, input_rows_non_finite, score_finite_rows

if TYPE_CHECKING:
    from ._protocol import Pass

AT = ("closest", "predicted")
"""Where ``score`` reads a class-conditional detector's scores."""
MODES = ("raw", "diff", "ratio")
"""scio's inter-class modes of :meth:`ClassConditional.score_classes`."""


def check_at(who: str, at: str) -> str:
    """Return ``at`` if it is one of :data:`AT`; raise naming the choices.

    Examples
    --------
    >>> check_at("Mahalanobis", "predicted")
    'predicted'

    """
    if at not in AT:
        msg = f"{who}: at must be one of {list(AT)}, got {at!r}"
        raise ValueError(msg)
    return at


def class_mode(conformity: Tensor, mode: str) -> Tensor:
    """Return scio's inter-class ``mode`` of a ``[batch, classes]`` conformity.

    ``"raw"``: unchanged. ``"diff"``: each class's conformity minus the
    best one, and at the best class its lead over the second,
    ``c_1 - c_2`` (so only the best class is non-negative). ``"ratio"``:
    the same with ratios, ``c / c_1`` and ``c_1 / c_2`` (meant for
    non-negative conformities). The best class is ``topk``'s first (among
    equal conformities, one of them).

    Examples
    --------
    >>> import torch
    >>> c = torch.tensor([[1.0, 4.0, 2.0]])
    >>> class_mode(c, "diff"), class_mode(c, "ratio")
    (tensor([[-3.,  2., -2.]]), tensor([[0.2500, 2.0000, 0.5000]]))

    """
    if mode not in MODES:
        msg = f"mode must be one of {list(MODES)}, got {mode!r}"
        raise ValueError(msg)
    if mode == "raw":
        return conformity
    if conformity.shape[1] < 2:  # noqa: PLR2004 (a second class to prefer over)
        msg = (
            f"mode={mode!r} compares each class with the best other one, but "
            f"there is {conformity.shape[1]} class; use mode='raw'."
        )
        raise ValueError(msg)
    rows = torch.arange(conformity.shape[0], device=conformity.device)
    first, second = conformity.topk(2, dim=1).indices.T
    best = conformity[rows, first][:, None]
    if mode == "diff":
        out = conformity - best
        out[rows, first] = -out[rows, second]
        return out
    out = conformity / best
    out[rows, first] = 1 / out[rows, second]
    return out


class ClassConditional(Detector):
    """A detector with a score per class; ``at=`` says which class a sample's is.

    Subclasses compute :meth:`class_scores` from a pass and set ``self.at``
    (checked by :func:`check_at`); :meth:`score_pass` reads the scores at
    the closest or the predicted class. A multi-layer detector whose
    closest class is chosen layer by layer overrides :meth:`closest_scores`.
    """

    at: str
    """``"closest"`` or ``"predicted"``: set by the subclass's constructor."""

    def class_scores(self, result: Pass) -> Tensor:
        """Return the scores of each class, ``[batch, classes]`` (higher: fits worse).

        Column ``c`` is class ``c`` of the net's logits; a class the detector
        has no statistics for scores ``+inf``.
        """
        raise NotImplementedError

    def closest_scores(self, result: Pass) -> Tensor:
        """Return each sample's score at the class it fits best, ``[batch]``."""
        return self.class_scores(result).amin(dim=1)

    def predicted(self, result: Pass) -> Tensor:
        """Return the class the net predicts for each sample (``argmax`` of logits)."""
        return predicted_classes(result, type(self).__name__)

    def scores_at(self, result: Pass, classes: Tensor) -> Tensor:
        """Return each sample's score at the given class, ``[batch]``.

        Default: read from :meth:`class_scores`; a detector that can compute
        one class's score alone overrides it.
        """
        scores = self.class_scores(result)
        if bool((classes >= scores.shape[1]).any()):
            msg = (
                f"{type(self).__name__}: the net predicts class "
                f"{int(classes.max())}, but the detector scores "
                f"{scores.shape[1]} classes: it was fitted for another net."
            )
            raise ValueError(msg)
        return scores.gather(1, classes.to(scores.device)[:, None])[:, 0]

    def score_pass(self, result: Pass) -> Tensor:
        """Return the score at the closest or the predicted class (``at``)."""
        if self.at == "closest":
            return self.closest_scores(result)
        return self.scores_at(result, self.predicted(result))

    def score_classes(self, *args: Any, mode: str = "raw", **kwargs: Any) -> Tensor:
        """Return the score of every class, ``[batch, classes]`` (higher: more OoD).

        One pass of the net, as :meth:`score`, with the protocol's rules: an
        empty batch gives ``[0, classes]`` without running the net, a row with
        a NaN or an infinity (in the inputs, the logits or what the detector
        reads) scores NaN in every class. ``mode`` is scio's
        inter-class mode (:func:`class_mode`), applied to the conformity
        (the negated scores): the result is ``-class_mode(-scores, mode)``,
        scio's conformity in that mode, negated.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> from scio_recorder.ood import Mahalanobis
        >>> _ = torch.manual_seed(0)
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3))
        >>> rnet = Recorder(net, input_size=(1, 3))
        >>> maha = Mahalanobis(rnet).fit(
        ...     [(torch.randn(30, 3), torch.arange(30) % 3)], target=1
        ... )
        >>> x = torch.randn(2, 3)
        >>> maha.score_classes(x).shape
        torch.Size([2, 3])
        >>> torch.equal(maha.score_classes(x).amin(dim=1), maha(x))
        True
        >>> bool((maha.score_classes(x, mode="diff") <= 0).sum(dim=1).eq(1).all())
        True

        """
        if mode not in MODES:
            msg = (
                f"{type(self).__name__}.score_classes: mode must be one of "
                f"{list(MODES)}, got {mode!r}"
            )
            raise ValueError(msg)
        self.check_fitted()
        empty = empty_batch(args, kwargs)
        if empty is not None:
            return empty.new_empty(0, net_classes(self.rnet) or 0)
        bad = input_rows_non_finite(args, kwargs)
        result = run_pass(
            self.rnet, args, kwargs, outputs=self.outputs(), inputs=self.inputs()
        )
        logits = result.logits
        width = int(logits.shape[1]) if logits.dim() == 2 else 0  # noqa: PLR2004 (a batch of logit vectors)
        return score_finite_rows(
            [result],
            lambda results: -class_mode(-self.class_scores(results[0]), mode),
            outputs=self.outputs(),
            inputs=self.inputs(),
            bad_inputs=bad,
            trailing=(width,),
        )


def predicted_classes(result: Pass, who: str) -> Tensor:
    """Return ``argmax`` of the pass's ``[batch, classes]`` logits."""
    logits = result.logits
    if logits.dim() != 2:  # noqa: PLR2004 (a batch of logit vectors)
        msg = (
            f"{who}: at='predicted' reads the class the net predicts, but its "
            f"logits are {list(logits.shape)}, not [batch, classes]; use "
            "at='closest'."
        )
        raise ValueError(msg)
    return logits.argmax(dim=1)


def class_count(fitted: int, result: Pass) -> int:
    """Return the number of classes to score: the logits' width, or the fitted count.

    ``fitted`` is the number of classes the state knows (the largest class
    seen, plus one); a net with more logits has classes without statistics.
    """
    logits = result.logits
    width = logits.shape[1] if logits.dim() == 2 else 0  # noqa: PLR2004 (a batch of logit vectors)
    return max(int(width), int(fitted))
