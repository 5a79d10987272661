r"""What the detectors of the classification layer's weights share.

The detectors are one a module (:mod:`._weiper`, :mod:`._core`,
:mod:`._ora`); here, their base (the layer ``fc`` found and read, its
weight and bias in float64), the class sums by label, and the two-pass fit
that WeiPer and CORE share.

All three read the input ``f`` of the classification layer ``fc`` (an
``nn.Linear``, by default the last one the net calls, as
:class:`~scio_recorder.ood.ViM` does) and use its weight ``W`` (``C x F``)
and bias ``b``:

* :class:`~scio_recorder.ood.WeiPer` perturbs ``W`` ``r`` times and
  compares the histograms of a sample's features and of its perturbed
  logits with the fit data's (Granz, Heurich & Landgraf, NeurIPS 2024);
* :class:`~scio_recorder.ood.CORE` splits ``f`` into its part in the span
  of ``W``'s rows and the orthogonal residual: the energy of the first, the
  cosine of the second to the class means (Yang, Kim & Bahk, 2026);
* :class:`~scio_recorder.ood.ORA` measures the angles between ``f`` and its
  projections on the decision boundaries, seen from the mean of the class
  means (Demirel et al., NeurIPS 2025).

Fitting streams (:func:`~scio_recorder.collect.collect`): ORA's class means
in one pass shared with the other detectors; WeiPer (the bins' range, then
the densities) and CORE (the class means, then the spread of the residual
cosines) in two passes of their own, as :class:`~scio_recorder.ood.ViM`.
"""

from __future__ import annotations

__all__: list[str] = []

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder.collect import collect

from ._checks import check_batches
from ._geometry import ClassSums
from ._layers import LastLayer
from ._passes import all_or_nothing, check_reiterable, in_subfolder
from ._protocol import Detector, fit_pass

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


_F64 = torch.float64
_F32 = torch.float32


class _Classifier(LastLayer):
    """A detector of ``fc``'s input features, reading ``fc``'s weight when scoring."""

    needs_fit: ClassVar[bool] = True


class _LabelSums(ClassSums):
    """A reducer: per-class sums and counts of ``fc``'s input, by label."""

    def __init__(self, classes: int, who: str) -> None:
        super().__init__()
        self.classes, self.who = classes, who

    def update(self, value: Any, target: Tensor | None = None) -> None:
        if target is None:
            msg = f"{self.who} needs class labels: pass `target=` to fit."
            raise ValueError(msg)
        f = value.detach().reshape(value.shape[0], -1)
        by = torch.as_tensor(target, device=f.device).reshape(-1).long()
        self.add(self.classes, f, by)

    def fresh(self) -> _LabelSums:
        return _LabelSums(self.classes, self.who)


def _fit_two(  # noqa: PLR0913 (the detector, its two passes, the data's options)
    detector: Detector,
    first: Mapping[Any, Any],
    second: Any,
    batches: Iterable[Any],
    *,
    input: Any,  # noqa: A002 (collect's name)
    target: Any,
    options: Mapping[str, Any],
) -> None:
    """Run a two-pass fit: ``first`` (a keep), then ``second(result) -> keep``.

    ``second`` gets the first pass's results by key and returns the second
    pass's keep (reducers made with what the first found), and a function
    ``finish(result)`` that sets the state; all or nothing. With
    ``spill_dir``, the passes use its subfolders ``pass-0`` and ``pass-1``.
    """
    name = type(detector).__name__
    check_batches(batches, f"{name}.fit")
    passes = [("one for its statistics", 1), ("one for their spread", 1)]
    check_reiterable(batches, passes, f"{name}.fit")
    with all_or_nothing([detector]):
        found = fit_pass(
            detector.rnet,
            first,
            batches,
            who=dict.fromkeys(first, name),
            input=input,
            target=target,
            **in_subfolder(options, "pass-0"),
        )
        keep, finish = second({key: value for key, (_, value) in found.items()})
        result = collect(
            detector.rnet,
            batches,
            keep,
            input=input,
            target=target,
            **in_subfolder(options, "pass-1"),
        )
        finish(result)
        detector._fitted = True  # noqa: SLF001 (the fit's own flag)
