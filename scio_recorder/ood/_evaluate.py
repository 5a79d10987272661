"""Score data sets with several detectors, sharing passes, and rate them.

:func:`evaluate` runs each batch once for all the detectors that edit
nothing (their features and logits recorded together) and once per edit for
the others, then computes :mod:`~scio_recorder.ood.metrics` for each
detector. An :class:`Evaluation` is a mapping detector name -> metrics that
prints as a table and keeps the scores (for histograms and ROC curves).
"""

from __future__ import annotations

__all__ = ["Evaluation", "evaluate", "score_batches"]

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from scio_recorder.collect._loop import as_arguments, batch_getter

from ._base import Detector, run_passes
from .metrics import METRICS, ood_metrics


class Evaluation(Mapping[str, dict[str, float]]):
    """Detector name -> metrics: ``AUROC``, ``AUPR-IN``, ``AUPR-OUT``, ``FPR95TPR``.

    Attributes
    ----------
    id_scores, ood_scores : dict of str to Tensor
        Each detector's scores on the in-distribution and the OoD data.
    name : str
        The OoD set's name (for tables and plots).
    """

    def __init__(
        self,
        id_scores: dict[str, Tensor],
        ood_scores: dict[str, Tensor],
        name: str = "OoD",
    ) -> None:
        """Compute the metrics of each detector."""
        self.id_scores = id_scores
        self.ood_scores = ood_scores
        self.name = name
        self._metrics = {
            key: ood_metrics(id_scores[key], ood_scores[key]) for key in id_scores
        }

    def __getitem__(self, key: str) -> dict[str, float]:
        """Return the metrics of detector ``key``."""
        return self._metrics[key]

    def __iter__(self) -> Iterator[str]:
        """Iterate over detector names, in the order given."""
        return iter(self._metrics)

    def __len__(self) -> int:
        """Return the number of detectors."""
        return len(self._metrics)

    def table(self) -> str:
        """Return the metrics as a Markdown table, one row per detector."""
        head = f"| detector ({self.name}) | " + " | ".join(METRICS) + " |"
        rule = "|---|" + "---:|" * len(METRICS)
        rows = [
            f"| {key} | " + " | ".join(f"{values[m]:.3f}" for m in METRICS) + " |"
            for key, values in self._metrics.items()
        ]
        return "\n".join([head, rule, *rows])

    def __str__(self) -> str:
        """Return :meth:`table`."""
        return self.table()

    def __repr__(self) -> str:
        """Show the detectors and their AUROC."""
        inner = ", ".join(
            f"{k}: AUROC {v['AUROC']:.3f}" for k, v in self._metrics.items()
        )
        return f"Evaluation({self.name}; {inner})"


def score_batches(
    detectors: Mapping[str, Detector],
    batches: Iterable[Any],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
) -> dict[str, Tensor]:
    """Return each detector's scores on every batch, concatenated, sharing passes.

    Detectors of the same recorder share passes (:func:`run_passes`).
    """
    if not detectors:
        msg = "evaluate needs at least one detector: a mapping name -> detector"
        raise ValueError(msg)
    get = batch_getter(input, "input")
    from_callable = callable(input) and not isinstance(input, int | str)
    groups: dict[int, list[str]] = {}
    for key, detector in detectors.items():
        if not isinstance(detector, Detector):
            msg = f"detectors[{key!r}] is a {type(detector).__name__}, not a Detector"
            raise TypeError(msg)
        groups.setdefault(id(detector.rnet), []).append(key)
    parts: dict[str, list[Tensor]] = {key: [] for key in detectors}
    for batch in batches:
        args, kwargs = as_arguments(get(batch), from_callable=from_callable)
        for keys in groups.values():
            rnet = detectors[keys[0]].rnet
            scores = run_passes(rnet, [detectors[k] for k in keys], args, kwargs)
            for key, score in zip(keys, scores, strict=True):
                parts[key].append(score.detach().to("cpu"))
    if not any(parts.values()):
        msg = "the batches are empty: there is nothing to score"
        raise ValueError(msg)
    return {key: torch.cat(values) for key, values in parts.items()}


def evaluate(
    detectors: Mapping[str, Detector],
    id_batches: Iterable[Any],
    ood_batches: Iterable[Any] | Mapping[str, Iterable[Any]],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
) -> Any:
    """Score in- and out-of-distribution data with every detector; rate them.

    Parameters
    ----------
    detectors : Mapping of str to Detector
        Fitted detectors, by name.
    id_batches : iterable
        In-distribution batches.
    ood_batches : iterable, or a mapping name -> iterable
        OoD batches; several sets by name share the in-distribution scores.
    input : int, str, callable or None
        How to take the net's input out of a batch (as for ``collect``).

    Returns
    -------
    Evaluation, or dict of str to Evaluation
        One per OoD set when ``ood_batches`` is a mapping.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.ood import MSP, Energy, evaluate
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> result = evaluate(
    ...     {"MSP": MSP(rnet), "Energy": Energy(rnet)},
    ...     [torch.randn(16, 3)],
    ...     [5 * torch.randn(16, 3)],
    ...     input=None,
    ... )
    >>> list(result), sorted(result["MSP"])
    (['MSP', 'Energy'], ['AUPR-IN', 'AUPR-OUT', 'AUROC', 'FPR95TPR'])

    """
    id_scores = score_batches(detectors, id_batches, input=input)
    if isinstance(ood_batches, Mapping):
        return {
            name: Evaluation(
                id_scores, score_batches(detectors, data, input=input), name
            )
            for name, data in ood_batches.items()
        }
    return Evaluation(id_scores, score_batches(detectors, ood_batches, input=input))
