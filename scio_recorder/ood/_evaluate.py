"""Score data sets with several detectors, sharing passes, and rate them.

:func:`score_sets` runs each batch once for all the detectors that edit
nothing (their features and logits recorded together) and once per edit for
the others. :func:`evaluate` scores in-distribution data and one or several
OoD sets that way and computes :mod:`~scio_recorder.ood.metrics` for each
detector: an :class:`~scio_recorder.ood.Evaluation` (one OoD set), or for
several named OoD sets one :class:`~scio_recorder.ood.OoDResults`; those
results and their tables are in ``_results``.
"""

from __future__ import annotations

__all__ = ["evaluate", "score_batches", "score_sets"]

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import torch
from torch import Tensor

from scio_recorder._run.batches import as_arguments, batch_getter

from ._checks import check_batches
from ._passes import run_passes
from ._protocol import Detector
from ._results import Evaluation, OoDResults, _checked_groups

if TYPE_CHECKING:
    from collections.abc import Callable


def _score(  # noqa: PLR0913 (the data, how to read it, where it came from)
    detectors: Mapping[str, Detector],
    batches: Iterable[Any],
    *,
    input: Any,  # noqa: A002 (collect's name)
    target: Any = None,
    name: str | None = None,
    where: tuple[str, str] = ("score_batches", "batches"),
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Each detector's scores, and its accuracy when ``target`` is given.

    ``where``: the function and the argument the batches came from, for the
    message refusing a tensor given as batches.
    """
    check_batches(batches, *where)
    if not detectors:
        msg = "evaluate needs at least one detector: a mapping name -> detector"
        raise ValueError(msg)
    get = batch_getter(input, "input")
    labels_of: Callable[[Any], Any] | None = (
        None if target is None else batch_getter(target, "target")
    )
    from_callable = callable(input) and not isinstance(input, int | str)
    groups: dict[int, list[str]] = {}
    for key, detector in detectors.items():
        if not isinstance(detector, Detector):
            msg = f"detectors[{key!r}] is a {type(detector).__name__}, not a Detector"
            raise TypeError(msg)
        groups.setdefault(id(detector.rnet), []).append(key)
    parts: dict[str, list[Tensor]] = {key: [] for key in detectors}
    correct = dict.fromkeys(detectors, 0)
    total = 0
    for index, batch in enumerate(batches):
        args, kwargs = as_arguments(get(batch), spread=from_callable)
        labels = None if labels_of is None else _labels(labels_of(batch), index)
        for keys in groups.values():
            rnet = detectors[keys[0]].rnet
            logits: list[Tensor] = []
            scores = run_passes(
                rnet, [detectors[k] for k in keys], args, kwargs, logits=logits
            )
            for key, score, pass_logits in zip(keys, scores, logits, strict=True):
                parts[key].append(score.detach().to("cpu"))
                if labels is not None:
                    correct[key] += _correct(pass_logits, labels, index, key)
        total += 0 if labels is None else labels.shape[0]
    if not any(parts.values()):
        what = "the batches are" if name is None else f"set {name!r} is"
        msg = f"{what} empty: there is nothing to score"
        raise ValueError(msg)
    accuracy = (
        {}
        if target is None or not total
        else {key: count / total for key, count in correct.items()}
    )
    return {key: torch.cat(values) for key, values in parts.items()}, accuracy


def _labels(value: Any, index: int) -> Tensor:
    labels = value if isinstance(value, Tensor) else torch.as_tensor(value)
    if labels.dim() != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
        msg = (
            f"evaluate: the labels of in-distribution batch {index} are "
            f"{labels.dtype} of shape {list(labels.shape)}: `target=` must pick "
            "integer class indices, one per sample (shape [batch])."
        )
        raise ValueError(msg)
    return labels.to("cpu")


def _correct(logits: Tensor, labels: Tensor, index: int, key: str) -> int:
    if logits.dim() != 2 or logits.shape[0] != labels.shape[0]:  # noqa: PLR2004 ([B, C])
        msg = (
            f"evaluate: for the accuracy of {key!r}, the net's logits of "
            f"in-distribution batch {index} must be [batch, classes] with one row "
            f"per label, got {list(logits.shape)} for {labels.shape[0]} labels. "
            "Drop `target=` (no accuracy), or fix it."
        )
        raise ValueError(msg)
    if not labels.shape[0]:  # an empty batch: nothing ran, nothing to count
        return 0
    return int((logits.detach().argmax(dim=1).to("cpu") == labels).sum())


def score_batches(
    detectors: Mapping[str, Detector],
    batches: Iterable[Any],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
) -> dict[str, Tensor]:
    """Return each detector's scores on every batch, concatenated, sharing passes.

    Detectors of the same recorder share passes (as :func:`score_sets`).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.ood import MSP, Energy
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> scores = score_batches(
    ...     {"MSP": MSP(rnet), "Energy": Energy(rnet)},
    ...     [torch.randn(5, 3), torch.randn(2, 3)],
    ...     input=None,
    ... )
    >>> {name: tuple(s.shape) for name, s in scores.items()}
    {'MSP': (7,), 'Energy': (7,)}

    """
    return _score(detectors, batches, input=input)[0]


def score_sets(
    detectors: Mapping[str, Detector],
    sets: Mapping[str, Iterable[Any]],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
) -> dict[str, dict[str, Tensor]]:
    """Score several data sets with several detectors, sharing passes.

    Each batch runs once through the net for all the detectors of a recorder
    that edit nothing (everything they read recorded together), and once per
    edit for the others (ReAct, ASH, ...). Scores are higher for OoD.

    Parameters
    ----------
    detectors : Mapping of str to Detector
        Fitted detectors, by name (of one recorder or several).
    sets : Mapping of str to iterable
        Data sets by name, each an iterable of batches (a list, a
        ``DataLoader``).
    input : int, str, callable or None
        How to take the net's input out of a batch (as for ``collect``):
        ``0`` for ``(x, y)`` batches, ``None`` for bare inputs.

    Returns
    -------
    dict of str to dict of str to Tensor
        ``{set_name: {detector_name: scores}}``, scores ``[samples]`` on the
        CPU, in batch order.

    Raises
    ------
    ValueError
        For no detector, or a set with no batch.
    TypeError
        For something in ``detectors`` that is not a :class:`Detector`, or a
        set given as a tensor (pass ``[x]``: a list of batches).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.ood import MSP, Energy, score_sets
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> scores = score_sets(
    ...     {"MSP": MSP(rnet), "Energy": Energy(rnet)},
    ...     {"test": [torch.randn(8, 3)], "noise": [9 * torch.randn(5, 3)]},
    ...     input=None,
    ... )
    >>> {s: {d: len(v) for d, v in by.items()} for s, by in scores.items()}
    {'test': {'MSP': 8, 'Energy': 8}, 'noise': {'MSP': 5, 'Energy': 5}}

    """
    if not isinstance(sets, Mapping):
        msg = (
            f"score_sets takes the data sets as a mapping name -> batches, got a "
            f"{type(sets).__name__}: e.g. `{{'test': test_batches}}`, or use "
            "score_batches for one set."
        )
        raise TypeError(msg)
    for name, batches in sets.items():  # all of them, before scoring any
        check_batches(batches, "score_sets", f"sets[{name!r}]")
    return {
        name: _score(
            detectors,
            batches,
            input=input,
            name=name,
            where=("score_sets", f"sets[{name!r}]"),
        )[0]
        for name, batches in sets.items()
    }


@overload
def evaluate(
    detectors: Mapping[str, Detector],
    id_batches: Iterable[Any],
    ood_batches: Mapping[str, Iterable[Any]],
    *,
    input: Any = 0,
    target: Any = None,
    near: Sequence[str] | None = None,
    far: Sequence[str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> OoDResults: ...


@overload
def evaluate(
    detectors: Mapping[str, Detector],
    id_batches: Iterable[Any],
    ood_batches: Iterable[Any],
    *,
    input: Any = 0,
    target: Any = None,
    near: Sequence[str] | None = None,
    far: Sequence[str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> Evaluation: ...


def evaluate(  # noqa: PLR0913 (the data, how to read it, the groups)
    detectors: Mapping[str, Detector],
    id_batches: Iterable[Any],
    ood_batches: Iterable[Any] | Mapping[str, Iterable[Any]],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
    target: Any = None,
    near: Sequence[str] | None = None,
    far: Sequence[str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> Evaluation | OoDResults:
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
    target : int, str, callable or None
        How to take the class labels out of an in-distribution batch (as for
        ``collect``, e.g. ``1`` for ``(x, y)`` batches): the closed-set
        accuracy of each detector's pass (the argmax of its logits, computed
        in the same pass: the net's own for detectors that edit nothing) is
        then in ``.accuracy`` and in the tables. Default: no accuracy.
    near, far : sequence of str, optional
        Names of OoD sets forming the near-OoD and far-OoD groups, whose
        means are columns of the tables (as in OpenOOD's).
    groups : Mapping of str to sequence of str, optional
        Other named groups of sets (``near=``/``far=`` add to them).

    Returns
    -------
    Evaluation, or OoDResults
        An :class:`Evaluation` for one OoD set; an :class:`OoDResults`
        (a mapping set name -> :class:`Evaluation`) when ``ood_batches`` is
        a mapping.

    Raises
    ------
    ValueError
        For a group naming an unknown set (naming it and the sets), groups
        with one unnamed OoD set, bad labels, or empty data.
    TypeError
        For data given as a tensor, not an iterable of batches (pass
        ``[x]``: a list of one batch), checked before anything is scored.

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
    >>> list(result), sorted(result["MSP"])[:4]
    (['MSP', 'Energy'], ['AUPR-IN', 'AUPR-OUT', 'AUROC', 'FPR95-ID'])
    >>> results = evaluate(
    ...     {"MSP": MSP(rnet), "Energy": Energy(rnet)},
    ...     [(torch.randn(16, 3), torch.arange(16) % 4)],
    ...     {"near": [(2 * torch.randn(16, 3),)], "far": [(9 * torch.randn(16, 3),)]},
    ...     target=1,
    ...     near=["near"],
    ...     far=["far"],
    ... )
    >>> results.columns, sorted(results.accuracy)
    (['near', 'far', 'near mean', 'far mean'], ['Energy', 'MSP'])

    """
    named = dict(groups or {})
    for group, members in (("near mean", near), ("far mean", far)):
        if members is not None:
            named[group] = list(members)
    check_batches(id_batches, "evaluate", "id_batches")
    ood_sets = (
        {f"ood_batches[{k!r}]": v for k, v in ood_batches.items()}
        if isinstance(ood_batches, Mapping)
        else {"ood_batches": ood_batches}
    )
    for where, data in ood_sets.items():
        check_batches(data, "evaluate", where)
    id_scores, accuracy = _score(
        detectors,
        id_batches,
        input=input,
        target=target,
        where=("evaluate", "id_batches"),
    )
    if not isinstance(ood_batches, Mapping):
        if named:
            msg = (
                f"evaluate: groups {list(named)} name OoD sets, but `ood_batches` "
                "is one unnamed set: pass a mapping name -> batches."
            )
            raise ValueError(msg)
        ood = _score(detectors, ood_batches, input=input)[0]
        return Evaluation(id_scores, ood, accuracy=accuracy)
    _checked_groups(named, list(ood_batches))  # before scoring the OoD sets
    return OoDResults(
        {
            name: Evaluation(
                id_scores,
                _score(detectors, data, input=input, name=name)[0],
                name,
                accuracy=accuracy,
            )
            for name, data in ood_batches.items()
        },
        groups=named,
    )
