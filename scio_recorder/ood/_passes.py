"""The passes that fit and score detectors, shared between detectors.

:func:`run_passes` scores one batch for several detectors of one recorder:
one pass of the net for all that edit nothing, one per edit for the others,
and the passes of their own for detectors that need them (ODIN, NAC).
:func:`fit_detectors` fits several detectors with one
:func:`~scio_recorder.collect.collect` pass over the data, all or nothing.
"""

from __future__ import annotations

__all__ = [
    "all_or_nothing",
    "check_reiterable",
    "fit_detectors",
    "in_subfolder",
    "run_passes",
]

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scio_recorder._run.batches import Positions
from scio_recorder.reduce import Tee

from ._checks import check_batches, checked_targets
from ._protocol import fit_pass, run_pass
from ._rows import empty_batch, input_rows_non_finite

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable, Sequence

    from torch import Tensor

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

    from ._protocol import Detector, Pass


def fit_detectors(
    detectors: Mapping[str, Detector] | Sequence[Detector],
    batches: Iterable[Any],
    *,
    input: Any = 0,  # noqa: A002 (collect's name)
    target: Any = None,
    **options: Any,
) -> None:
    """Fit several detectors of one recorder with one ``collect`` pass.

    What each detector collects is merged: detectors reading the same layer
    share its records (a :class:`~scio_recorder.reduce.Tee` of their
    reducers), so the data set is run through the net once. Detectors with a
    fit of their own (ViM's two passes) are fitted after, on their own.

    All or nothing: if any fit fails, every detector is left as it was (one
    fitted before keeps its old state), and the error is raised.

    Parameters
    ----------
    detectors : mapping or sequence of Detector
        Detectors of the same recorder.
    batches : iterable
        In-distribution batches. When they are iterated more than once (a
        ViM among the detectors, or a detector with a fit of its own next to
        shared ones), an iterable that starts over (a list, a
        ``DataLoader``); a generator or an iterator is a ``TypeError``,
        raised before the first pass.
    input, target, **options
        As for :meth:`Detector.fit`. With several ``collect`` runs, each
        gets a subfolder of ``spill_dir``: ``shared`` for the shared pass,
        ``<i>-<Class>`` for the fit of the ``i``-th detector (ViM then uses
        ``pass-0`` and ``pass-1`` inside it).

    Raises
    ------
    TypeError
        For a one-shot iterator that would be iterated more than once, or
        ``batches`` given as a tensor or a mapping.
    ValueError
        As :meth:`Detector.fit` and :func:`~scio_recorder.collect.collect`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.ood import KNN, Mahalanobis, ReAct, fit_detectors
    >>> net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> rnet = Recorder(net, input_size=(1, 3))
    >>> found = [Mahalanobis(rnet), KNN(rnet, k=2), ReAct(rnet, layer="1")]
    >>> fit_detectors(found, [(torch.randn(16, 3), torch.arange(16) % 2)], target=1)
    >>> [detector.fitted for detector in found]
    [True, True, True]

    """
    group = (
        list(detectors.values()) if isinstance(detectors, Mapping) else list(detectors)
    )
    check_batches(batches, "fit_detectors")
    if not group:
        return
    rnet = group[0].rnet
    if any(d.rnet is not rnet for d in group):
        msg = "fit_detectors: every detector must wrap the same Recorder"
        raise ValueError(msg)
    shared = [d for d in group if d.needs_fit and not d.own_fit]
    own = [(i, d) for i, d in enumerate(group) if d.needs_fit and d not in shared]
    names = ", ".join(type(d).__name__ for d in shared)
    passes = [(f"one shared by {names}", 1)] if shared else []
    passes += [(f"{type(d).__name__}.fit", d.fit_passes) for _, d in own]
    check_reiterable(batches, passes, "fit_detectors")
    # Each collect run gets its own spill folder (resumable on its own);
    # a single run keeps `spill_dir` itself, as it always did.
    split = len(passes) > 1
    with all_or_nothing(group):
        if shared:
            _fit_together(
                rnet,
                shared,
                batches,
                input=input,
                target=target,
                **(in_subfolder(options, "shared") if split else options),
            )
        for i, detector in own:
            sub = f"{i}-{type(detector).__name__}"
            detector.fit(
                batches,
                input=input,
                target=target,
                **(in_subfolder(options, sub) if split else options),
            )
        for detector in group:
            if not detector.needs_fit:
                detector.fit(batches, input=input, target=target, **options)


def check_reiterable(
    batches: object, passes: Sequence[tuple[str, int]], who: str
) -> None:
    """Refuse a one-shot iterator for fits that iterate ``batches`` again.

    ``passes`` names each fit and how many times it iterates ``batches``.
    Called before the first pass, so that nothing is computed in vain.
    """
    total = sum(n for _, n in passes)
    if total > 1 and isinstance(batches, Iterator):
        what = ", ".join(
            f"{name} ({n} passes)" if n > 1 else name for name, n in passes
        )
        msg = (
            f"{who} iterates `batches` {total} times ({what}), but got a "
            f"{type(batches).__name__}, which can be iterated only once (the "
            "second pass would find it exhausted). Pass a list or a DataLoader, "
            "or an object whose __iter__ starts over."
        )
        raise TypeError(msg)


def in_subfolder(options: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``options`` with ``spill_dir`` (if any) replaced by ``spill_dir/name``.

    Two collect runs with other arguments cannot share a spill folder (the
    second would refuse the first's manifest): each pass of a multi-pass
    fit gets a subfolder.
    """
    spill_dir = options.get("spill_dir")
    if spill_dir is None:
        return dict(options)
    return {**options, "spill_dir": Path(spill_dir) / name}


@contextlib.contextmanager
def all_or_nothing(detectors: Sequence[Detector]) -> Generator[None, None, None]:
    """Restore every detector's attributes if the block raises.

    Fits rebind attributes (never change tensors in place), so a shallow copy
    of each detector's ``__dict__`` is its whole state, fitted flag included.
    """
    saved = [(detector, dict(vars(detector))) for detector in detectors]
    try:
        yield
    except BaseException:
        for detector, attributes in saved:
            vars(detector).clear()
            vars(detector).update(attributes)
        raise


def run_passes(
    rnet: Recorder,
    detectors: Sequence[Detector],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    logits: list[Tensor] | None = None,
) -> list[Tensor]:
    """Score one batch for every detector, in order.

    One pass for all that edit nothing, one pass per edit for the others
    (:meth:`Detector.edit_passes`), and the passes of their own for
    detectors with :attr:`Detector.own_passes` (:meth:`Detector.score_inputs`).
    ``logits``, if given, gets the logits of the pass that scored each
    detector, in order (for the closed-set accuracy of ``evaluate``); for a
    detector with passes of its own, those of the unedited net.
    """
    for detector in detectors:
        if detector.rnet is not rnet:
            msg = "run_passes: every detector must wrap the same Recorder"
            raise ValueError(msg)
        detector.check_fitted()
    empty = empty_batch(args, kwargs)
    if empty is not None:
        if logits is not None:
            logits.extend(empty.reshape(0, 0) for _ in detectors)
        return [empty for _ in detectors]
    args, kwargs = Positions.of(rnet.net).add(args, dict(kwargs))
    scores, passes = _score_shared(rnet, detectors, args, kwargs)
    for i, detector in enumerate(detectors):
        if not detector.shares_pass:
            scores[i], scored = detector.score_alone(args, kwargs)
            if scored is not None:
                passes[i] = scored
    if logits is not None:
        _fill_unedited(rnet, detectors, passes, args, kwargs)
        logits.extend(passes[i].logits for i in range(len(detectors)))
    return [scores[i] for i in range(len(detectors))]


def _score_shared(
    rnet: Recorder,
    detectors: Sequence[Detector],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> tuple[dict[int, Tensor], dict[int, Pass]]:
    """Score the detectors that share one unedited pass, by index."""
    plain = [(i, d) for i, d in enumerate(detectors) if d.shares_pass]
    if not plain:
        return {}, {}
    result = run_pass(
        rnet,
        args,
        kwargs,
        outputs=[label for _, d in plain for label in d.outputs()],
        inputs=[label for _, d in plain for label in d.inputs()],
    )
    bad = input_rows_non_finite(args, kwargs)
    scores = {i: detector.score_shared(result, bad) for i, detector in plain}
    return scores, dict.fromkeys(scores, result)


def _fill_unedited(
    rnet: Recorder,
    detectors: Sequence[Detector],
    passes: dict[int, Pass],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> None:
    """Give detectors with passes of their own the unedited net's pass."""
    unedited = next((p for i, p in passes.items() if not detectors[i].edits), None)
    for i, detector in enumerate(detectors):
        if detector.own_passes:
            if unedited is None:
                unedited = run_pass(rnet, args, kwargs)
            passes[i] = unedited


def _fit_together(
    rnet: Recorder,
    shared: list[Detector],
    batches: Iterable[Any],
    *,
    input: Any,  # noqa: A002 (collect's name)
    target: Any,
    **options: Any,
) -> None:
    """One collect pass for the detectors' merged keeps; then each reads its part."""
    keys: dict[Any, list[tuple[Detector, Any]]] = {}
    for detector in shared:
        for key, reducer in detector.fit_keep().items():
            keys.setdefault(key, []).append((detector, reducer))
    needs_target = any(d.needs_target for d in shared)
    if needs_target and target is None:
        names = ", ".join(sorted({type(d).__name__ for d in shared if d.needs_target}))
        msg = f"{names} need class labels: pass `target=` to fit_detectors."
        raise ValueError(msg)
    keep = {
        key: users[0][1] if len(users) == 1 else Tee(*(r for _, r in users))
        for key, users in keys.items()
    }
    who = {
        key: ", ".join(sorted({type(d).__name__ for d, _ in users}))
        for key, users in keys.items()
    }
    found = fit_pass(
        rnet,
        keep,
        batches,
        who=who,
        input=input,
        target=checked_targets(target, input, shared) if needs_target else None,
        **options,
    )
    views: dict[int, dict[DepthIdx, Any]] = {id(d): {} for d in shared}
    for key, users in keys.items():
        label, value = found[key]
        for position, (detector, _) in enumerate(users):
            views[id(detector)][label] = value if len(users) == 1 else value[position]
    for detector in shared:
        detector.fit_from(views[id(detector)])
        detector._fitted = True  # noqa: SLF001 (the protocol's own flag)
