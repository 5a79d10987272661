"""The detector protocol, and the passes that score batches for detectors.

A :class:`Detector` scores the inputs of an unmodified net wrapped in a
:class:`~scio_recorder.Recorder`. It declares what a pass must record (the
outputs and inputs of labelled layers), or the edit it applies in flight at
one layer, and computes its score from that pass (:class:`Pass`). This lets
:func:`run_passes` serve several detectors with one pass of the net: one
pass for all that edit nothing, one per edit for the others.

Fitting goes through :func:`~scio_recorder.collect.collect` (streaming,
bounded memory, resumable, ``torch.distributed``-aware); fitted state is a
flat dict of tensors, saved and loaded through :mod:`scio_recorder.io`
(safetensors, no pickle).
"""

from __future__ import annotations

__all__ = [
    "Detector",
    "NotFittedError",
    "Pass",
    "fit_detectors",
    "last_linear",
    "logits_of",
    "one_label",
    "run_passes",
]

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from scio_recorder._hooks import pick_argument
from scio_recorder._outputs import logits_of
from scio_recorder.collect import InputOf, collect
from scio_recorder.io import load_records, save_records
from scio_recorder.recorder import Recorder
from scio_recorder.reduce import Tee
from scio_recorder.select import resolve_one

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.select import Selector


class NotFittedError(RuntimeError):
    """A detector that needs fitting was asked to score before :meth:`~Detector.fit`."""


@dataclasses.dataclass
class Pass:
    """What one pass of the net gave the detectors: logits and records."""

    logits: Tensor
    outputs: Mapping[DepthIdx, Any]
    inputs: Mapping[DepthIdx, Tensor]


def one_label(rnet: Recorder, layer: Selector, who: str) -> DepthIdx:
    """Resolve ``layer`` to exactly one label whose output is a tensor."""
    row = resolve_one(rnet.table, rnet.net, layer, who)
    size = row.output_size
    if not (isinstance(size, list) and size and all(isinstance(n, int) for n in size)):
        msg = (
            f"{who}: layer {row.describe()} outputs {size}, not one tensor; "
            "choose a layer whose output is a tensor."
        )
        raise ValueError(msg)
    return row.label


def last_linear(rnet: Recorder, fc: Selector | None, who: str) -> DepthIdx:
    """Return the label of ``fc``, or of the last ``nn.Linear`` the net calls."""
    if fc is not None:
        label = one_label(rnet, fc, who)
        if not isinstance(rnet.table[label].module, nn.Linear):
            module = type(rnet.table[label].module).__name__
            msg = f"{who}: fc={fc!r} is a {module}; it must be an nn.Linear."
            raise TypeError(msg)
        return label
    linears = [
        row.label
        for row in rnet.table.values()
        if row.recordable and isinstance(row.module, nn.Linear)
    ]
    if not linears:
        msg = (
            f"{who}: the net calls no nn.Linear; name its classification layer "
            "with `fc=` (an nn.Linear), or give `layer=`."
        )
        raise ValueError(msg)
    return linears[-1]


class Detector:
    """An OoD detector on a recorded net: ``score(x)`` is higher for OoD inputs.

    Subclasses say what a pass records (:meth:`outputs`, :meth:`inputs`) or
    which edit they apply (:attr:`edits`, :meth:`edit`), how they score a
    pass (:meth:`score_pass`), and, when they need fitting, what to collect
    (:meth:`fit_keep`) and how to read the result (:meth:`fit_from`).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net; it is used as is (its selection is restored after
        every pass the detector makes).
    layer : selector, optional
        Anything :meth:`Recorder.record` takes, resolving to one call.
    """

    needs_fit: ClassVar[bool] = False
    needs_target: ClassVar[bool] = False
    edits: ClassVar[bool] = False
    # -- own passes (ood-single: ODIN's backward pass): see score_inputs ----
    own_passes: ClassVar[bool] = False

    def __init__(self, rnet: Recorder, *, layer: Selector | None = None) -> None:
        """Keep the recorder; subclasses resolve their layers here."""
        if not isinstance(rnet, Recorder):
            msg = (
                f"{type(self).__name__} takes a Recorder, got {type(rnet).__name__}: "
                "wrap the net first, e.g. `Recorder(net, input_size=(1, 3, 32, 32))`."
            )
            raise TypeError(msg)
        self.rnet = rnet
        self.layer = layer
        self._fitted = not self.needs_fit

    # -- what a pass needs ---------------------------------------------------
    def outputs(self) -> tuple[DepthIdx, ...]:
        """Labels whose outputs :meth:`score_pass` reads."""
        return ()

    def inputs(self) -> tuple[DepthIdx, ...]:
        """Labels whose (first tensor) inputs :meth:`score_pass` reads."""
        return ()

    def edit_label(self) -> DepthIdx:
        """Return the label whose output :meth:`edit` changes (edit detectors)."""
        raise NotImplementedError

    def edit(self, output: Tensor) -> Tensor:
        """Return the edited output of :meth:`edit_label` (edit detectors)."""
        raise NotImplementedError

    def score_pass(self, result: Pass) -> Tensor:
        """Return the scores ``[batch]`` of one pass."""
        raise NotImplementedError

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the scores of the net's inputs from passes of the detector's own.

        For detectors whose passes no other detector can share (:attr:`own_passes`,
        e.g. ODIN's gradient with respect to the input).
        """
        raise NotImplementedError

    # -- fitting -----------------------------------------------------------
    def fit_keep(self) -> dict[Any, Any]:
        """Return what to collect on the fit data (``collect``'s ``keep``)."""
        return {}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Set the fitted state from the collected results, by label."""

    @property
    def fitted(self) -> bool:
        """Whether the detector can score (always, for those needing no fit)."""
        return self._fitted

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,
        **options: Any,
    ) -> Self:
        """Fit on in-distribution batches with one ``collect`` pass.

        A no-op for detectors that need no fitting.

        Parameters
        ----------
        batches : iterable
            In-distribution batches (a ``DataLoader``, a list, ...).
        input, target
            How to take the input and the class labels out of a batch, as
            for :func:`~scio_recorder.collect.collect`; ``target`` is needed
            by detectors with class statistics.
        **options
            Passed to :func:`~scio_recorder.collect.collect` (``device``,
            ``memory_budget``, ``spill_dir`` to resume, ``progress``, ...).

        Returns
        -------
        Detector
            ``self``, fitted.
        """
        keep = self.fit_keep()
        if keep:
            if self.needs_target and target is None:
                msg = (
                    f"{type(self).__name__}.fit needs class labels: pass `target=` "
                    "(e.g. `target=1` for (input, label) batches)."
                )
                raise ValueError(msg)
            result = collect(
                self.rnet,
                batches,
                keep,
                input=input,
                target=target if self.needs_target else None,
                **options,
            )
            self.fit_from(result)
        self._fitted = True
        return self

    def _keep_key(self, label: DepthIdx, kind: str) -> Any:
        return InputOf(label) if kind == "input" else label

    # -- scoring -----------------------------------------------------------
    def score(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the OoD scores ``[batch]`` of the net's inputs (higher: OoD).

        Runs one pass of the net (under ``torch.no_grad()``); the recorder's
        selection and its latest records are those of that pass during it,
        and the selection is restored after.
        """
        (scores,) = run_passes(self.rnet, [self], args, kwargs)
        return scores

    __call__ = score

    def check_fitted(self) -> None:
        """Raise :class:`NotFittedError` if the detector cannot score yet."""
        if not self._fitted:
            msg = (
                f"{type(self).__name__} must be fitted before scoring: call "
                f"`detector.fit(batches{', target=1' if self.needs_target else ''})` "
                "on in-distribution data, or `detector.load(path)`."
            )
            raise NotFittedError(msg)

    # -- state -------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """Return the hyperparameters and layers, JSON-able (checked on load)."""
        return {}

    def state(self) -> dict[str, Tensor]:
        """Return the fitted state, a flat dict of tensors."""
        return {}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the fitted state from :meth:`state`'s dict."""

    def save(self, path: str | Path) -> Path:
        """Save the fitted state to a safetensors file (with the config).

        Examples
        --------
        >>> import tempfile, torch
        >>> from torch import nn
        >>> from scio_recorder import Recorder
        >>> from scio_recorder.ood import KNN
        >>> rnet = Recorder(
        ...     nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), input_size=(1, 3)
        ... )
        >>> knn = KNN(rnet, k=2).fit([torch.randn(8, 3)], input=None)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = knn.save(folder + "/knn.safetensors")
        ...     again = KNN(rnet, k=2).load(path)
        >>> torch.equal(again(torch.ones(1, 3)), knn(torch.ones(1, 3)))
        True

        """
        self.check_fitted()
        meta = {
            "ood.detector": type(self).__name__,
            "ood.config": json.dumps(self.config(), sort_keys=True),
        }
        return save_records(path, self.state(), extra_metadata=meta)

    def load(self, path: str | Path) -> Self:
        """Load a state saved by :meth:`save` by a detector of the same config."""
        records = load_records(path)
        meta = records.metadata
        name = meta.get("ood.detector")
        if name != type(self).__name__:
            msg = (
                f"'{path}' holds the state of a {name or 'non-detector file'}, not "
                f"of a {type(self).__name__}."
            )
            raise ValueError(msg)
        saved = json.loads(meta.get("ood.config", "{}"))
        mine = json.loads(json.dumps(self.config(), sort_keys=True))
        if saved != mine:
            diff = sorted(
                k for k in saved.keys() | mine.keys() if saved.get(k) != mine.get(k)
            )
            was = [saved.get(k) for k in diff]
            now = [mine.get(k) for k in diff]
            msg = (
                f"'{path}' was saved by a {name} configured otherwise "
                f"({', '.join(diff)}: saved {was}, now {now}); make the detector "
                "with the same arguments."
            )
            raise ValueError(msg)
        self.load_state({str(k): v for k, v in records.items()})
        self._fitted = True
        return self

    def __repr__(self) -> str:
        """Show the class, the config and whether it is fitted."""
        config = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        fitted = (
            ""
            if not self.needs_fit
            else (", fitted" if self._fitted else ", not fitted")
        )
        return f"{type(self).__name__}({config}{fitted})"


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

    Parameters
    ----------
    detectors : mapping or sequence of Detector
        Detectors of the same recorder.
    batches : iterable
        In-distribution batches; with a ViM among the detectors, an
        iterable that can be iterated again (a list, a ``DataLoader``).
    input, target, **options
        As for :meth:`Detector.fit`.

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
    if not group:
        return
    rnet = group[0].rnet
    if any(d.rnet is not rnet for d in group):
        msg = "fit_detectors: every detector must wrap the same Recorder"
        raise ValueError(msg)
    shared = [d for d in group if d.needs_fit and type(d).fit is Detector.fit]
    if shared:
        _fit_together(rnet, shared, batches, input=input, target=target, **options)
    for detector in group:
        if detector not in shared:
            detector.fit(batches, input=input, target=target, **options)


def run_passes(
    rnet: Recorder,
    detectors: Sequence[Detector],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> list[Tensor]:
    """Score one batch for every detector, in order.

    One pass for all that edit nothing, one pass per edit for the others,
    and the passes of their own for detectors with :attr:`Detector.own_passes`.
    """
    for detector in detectors:
        if detector.rnet is not rnet:
            msg = "run_passes: every detector must wrap the same Recorder"
            raise ValueError(msg)
        detector.check_fitted()
    scores: dict[int, Tensor] = {}
    plain = [(i, d) for i, d in enumerate(detectors) if not (d.edits or d.own_passes)]
    if plain:
        outputs = sorted({label for _, d in plain for label in d.outputs()})
        inputs = sorted({label for _, d in plain for label in d.inputs()})
        with rnet.selecting(*outputs, inputs=inputs), torch.no_grad():
            out = rnet(*args, **kwargs)
            result = _pass(rnet, out)
        for i, detector in plain:
            scores[i] = detector.score_pass(result)
    for i, detector in enumerate(detectors):
        if detector.edits:
            with rnet.selecting(detector.edit_label()), torch.no_grad():
                out = rnet(*args, activation_postproc=detector.edit, **kwargs)
                scores[i] = detector.score_pass(_pass(rnet, out))
    for i, detector in enumerate(detectors):
        if detector.own_passes:
            scores[i] = detector.score_inputs(args, kwargs)
    return [scores[i] for i in range(len(detectors))]


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
    result = collect(
        rnet,
        batches,
        keep,
        input=input,
        target=target if needs_target else None,
        **options,
    )
    views: dict[int, dict[DepthIdx, Any]] = {id(d): {} for d in shared}
    for key, users in keys.items():
        (label,) = result.labels_of[key]
        value = result[label]
        for position, (detector, _) in enumerate(users):
            views[id(detector)][label] = value if len(users) == 1 else value[position]
    for detector in shared:
        detector.fit_from(views[id(detector)])
        detector._fitted = True  # noqa: SLF001 (the protocol's own flag)


def _pass(rnet: Recorder, out: Any) -> Pass:
    inputs = {
        label: pick_argument(call, None, rnet.table[label].describe())
        for label, call in rnet.inputs.items()
    }
    return Pass(logits_of(out), dict(rnet.activations), inputs)
