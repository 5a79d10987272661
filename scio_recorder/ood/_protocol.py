"""The detector protocol: what a detector declares, how it fits, scores and saves.

A :class:`Detector` scores the inputs of an unmodified net wrapped in a
:class:`~scio_recorder.Recorder`. It declares what a pass must record (the
outputs and inputs of labelled layers), or the edit it applies in flight at
one layer, and computes its score from that pass (:class:`Pass`).
A detector scores a batch alone with :meth:`Detector.score` (one pass, the
passes of its edits, or passes of its own); :func:`run_pass` is that pass.
Because a detector *declares* what it reads, the shared passes
(:mod:`._passes`) can serve several detectors with one pass of the net.

The data rules are the protocol's, the same for every detector (a detector
states none of them): at scoring, an empty batch scores ``[0]`` and a
non-finite row scores NaN without touching the others (:mod:`._rows`; a
pass restricted to the finite rows is :meth:`Pass.take`); at fit,
non-finite features are refused with their count and layer
(:func:`fit_pass`), and class labels are checked (:mod:`._checks`).

Fitting goes through :func:`~scio_recorder.collect.collect` (streaming,
bounded memory, resumable, ``torch.distributed``-aware); fitted state is a
flat dict of tensors (:class:`StateEntry` declares each), saved and loaded
through :mod:`scio_recorder.io` (safetensors, no pickle) and checked on load
(:mod:`._saving`).
"""

from __future__ import annotations

__all__ = [
    "Detector",
    "Edit",
    "NotFittedError",
    "Pass",
    "edit_map",
    "fit_pass",
    "gradient_fit_inputs",
    "run_pass",
]

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder._engine.state import pick_argument
from scio_recorder._net.outputs import logits_of
from scio_recorder._net.quantized import refuse_gradients
from scio_recorder._run.batches import (
    POSITION_IDS,
    Positions,
    as_arguments,
    batch_getter,
    move_to,
    padding_unwatched,
    watch_padding,
)
from scio_recorder._support.errors import NotFittedError
from scio_recorder.collect import InputOf, collect
from scio_recorder.recorder import Recorder

from ._checks import (
    check_batches,
    checked_targets,
    count_non_finite,
    net_classes,
    refuse_non_finite,
)
from ._rows import (
    empty_batch,
    finite_rows_edit,
    input_rows_non_finite,
    score_finite_rows,
)
from ._saving import StateEntry, read_state, save_state

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence
    from pathlib import Path

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.select import Selector


@dataclasses.dataclass
class Pass:
    """What one pass of the net gave the detectors: logits and records.

    ``rows``: which rows of the batch it holds (``None``: all of them, in
    order); a pass restricted to the finite rows (:meth:`take`) holds their
    indices, so that a detector reading per-batch state from elsewhere (the
    padding mask of a net's argument) takes the same rows.
    """

    logits: Tensor
    outputs: Mapping[DepthIdx, Any]
    inputs: Mapping[DepthIdx, Tensor]
    rows: Tensor | None = None

    def take(self, rows: Tensor) -> Pass:
        """Return this pass restricted to ``rows`` (indices into its batch).

        Every tensor with the batch's rows (dim 0 as the logits') is indexed;
        others are kept as they are.
        """
        n = self.logits.shape[0] if self.logits.dim() else None

        def pick(value: Any) -> Any:
            if isinstance(value, Tensor) and value.dim() and value.shape[0] == n:
                return value[rows.to(value.device)]
            return value

        before = self.rows
        return Pass(
            pick(self.logits),
            {label: pick(v) for label, v in self.outputs.items()},
            {label: pick(v) for label, v in self.inputs.items()},
            rows if before is None else before[rows.to(before.device)],
        )


def run_pass(  # noqa: PLR0913 (the net's arguments, then what to record or edit)
    rnet: Recorder,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    outputs: Iterable[DepthIdx] = (),
    inputs: Iterable[DepthIdx] = (),
    edit: Edit | None = None,
    grad: bool = False,
    finite_rows: bool = True,
    who: str = "a detector",
) -> Pass:
    """Run the net once under ``torch.no_grad()``; return what it gave.

    The pass records the outputs and the (first tensor) inputs of the given
    labels, or, with ``edit=(label, fn)``, edits that label's output with
    ``fn`` in flight (and records it); ``edit={label: fn, ...}`` edits
    several labels in the one pass (each with its own ``fn``); with
    neither, it records nothing. The edit sees the finite rows of the
    output only (an SVD or a batch statistic of the edit is not spoiled by a
    NaN row); the others stay as they are, non-finite (``finite_rows=False``:
    it sees every row, for an edit made per row of the batch). With ``grad=True``
    the pass runs with autograd on (for a gradient with respect to the
    input: pass a leaf that requires it), also inside ``torch.no_grad()`` or
    ``torch.inference_mode()``; a net with layers that pass no gradient to
    their input is refused first, naming ``who`` (the detector)
    (:func:`~scio_recorder._net.quantized.refuse_gradients`, the check of every
    gradient through the net).

    The one way every detector runs the net: a private pass of the recorder
    (``Passes.run_private``), on a plan of its own. The recorder's selection
    and its latest records are not touched, and the records come back with
    this call, not through ``rnet.activations``: several threads can score
    with detectors of one recorder (one detector too), and each gets the
    scores of its own inputs. The pass runs eagerly, also for a compiled
    recorder. A left-padded batch that the net would number from its
    padding is shown to the recorder's padding watch (one warning per
    recorder, as for its direct calls).
    """
    watch_padding(rnet, kwargs)
    labels: list[DepthIdx]
    postproc: Any = None
    if edit is not None:
        edits = edit_map(edit)
        labels = sorted(edits)
        wrap = finite_rows_edit if finite_rows else _same
        postproc = {label: wrap(fn) for label, fn in edits.items()}
        in_labels: list[DepthIdx] = []
    else:
        labels, in_labels = sorted(set(outputs)), sorted(set(inputs))
    if grad:
        refuse_gradients(rnet.net, who)
    passes = rnet._passes  # noqa: SLF001 (the recorder's own passes: no public face)
    with _grad_mode(grad):
        out, state = passes.run_private(
            args, kwargs, outputs=labels, inputs=in_labels, postproc=postproc
        )
    table = rnet.table
    found_inputs = {
        label: pick_argument(call, None, table[label].describe())
        for label, call in state.inputs.items()
    }
    return Pass(logits_of(out), dict(state.records), found_inputs)


def _same(fn: Any) -> Any:
    return fn


Edit = tuple["DepthIdx", Any] | Mapping["DepthIdx", Any]
"""One edit pass: ``(label, fn)``, or ``{label: fn, ...}`` for several labels."""


def edit_map(edit: Edit) -> dict[DepthIdx, Any]:
    """Return an edit pass as ``{label: fn}``."""
    if isinstance(edit, Mapping):
        return dict(edit)
    label, fn = edit
    return {label: fn}


@contextlib.contextmanager
def _grad_mode(grad: bool) -> Iterator[None]:  # noqa: FBT001 (internal)
    """``torch.no_grad()``, or autograd on (out of inference mode too)."""
    if not grad:
        with torch.no_grad():
            yield
        return
    with torch.inference_mode(mode=False), torch.enable_grad():
        yield


def fit_pass(  # noqa: PLR0913 (the data, how to read it, who asks)
    rnet: Recorder,
    keep: Mapping[Any, Any],
    batches: Iterable[Any],
    *,
    who: Mapping[Any, str],
    input: Any,  # noqa: A002 (collect's name)
    target: Any,
    **options: Any,
) -> dict[Any, tuple[DepthIdx, Any]]:
    """One ``collect`` pass of ``keep``; non-finite samples refused.

    Every reducer is teed with a count of the samples holding a NaN or an
    infinity (:func:`~._checks.count_non_finite`); any such sample refuses
    the fit, naming ``who[key]`` (the detectors keeping that key), the
    layer and the count. Returns each key's label and its result.
    """
    result = collect(
        rnet, batches, count_non_finite(keep), input=input, target=target, **options
    )
    collected = {
        key: (label, result[label])
        for key in keep
        for label in result.labels_of[key][:1]
    }
    values = refuse_non_finite(who, rnet, keep, collected)
    return {key: (collected[key][0], values[key]) for key in keep}


def gradient_fit_inputs(  # noqa: PLR0913 (the data, how to read it, who asks)
    rnet: Recorder,
    batches: Iterable[Any],
    *,
    input: Any,  # noqa: A002 (collect's name)
    device: torch.device | str | None,
    options: Mapping[str, Any],
    who: str,
    state: str,
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Return the net's arguments of each batch, for a fit with its own gradient loop.

    For the detectors whose fit needs autograd (NAC, AdaScale), which
    ``collect`` does not give: ``input`` as for ``collect``, ``device`` moves
    each batch's input, empty batches are skipped, and a padded batch gets
    the position ids ``collect`` gives it (:class:`~scio_recorder._run.batches.
    Positions`; ``position_ids=None`` among ``options`` passes the batches
    as they are, as ``collect``'s). Refused at once (before any batch):
    ``collect``'s other options (``state`` says what the detector keeps
    instead), and batches given as a tensor or a mapping.
    """
    options = dict(options)
    mode = options.pop("position_ids", POSITION_IDS)
    if options:
        msg = (
            f"{who}.fit runs its own gradient loop and takes no "
            f"{', '.join(sorted(options))}; its state is {state}. Drop them "
            f"(fit {who} apart from fit_detectors when sharing a spill_dir)."
        )
        raise TypeError(msg)
    positions = Positions.of(rnet.net, mode)
    check_batches(batches, f"{who}.fit")
    take = batch_getter(input, "input")
    where = None if device is None else torch.device(device)

    def inputs() -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
        with padding_unwatched(rnet, mode):
            for batch in batches:
                args, kwargs = as_arguments(take(batch), spread=callable(input))
                if empty_batch(args, kwargs) is not None:
                    continue
                if where is not None:
                    args, kwargs = move_to(args, where), move_to(kwargs, where)
                yield positions.add(args, kwargs)

    return inputs()


class Detector:
    """An OoD detector on a recorded net: ``score(x)`` is higher for OoD inputs.

    Subclasses say what a pass records (:meth:`outputs`, :meth:`inputs`) or
    which edit they apply (:attr:`edits`, :meth:`edit`), how they score a
    pass (:meth:`score_pass`), and, when they need fitting, what to collect
    (:meth:`fit_keep`) and how to read the result (:meth:`fit_from`).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net; it is used as is (scoring runs passes of the
        detector's own, which leave the recorder's selection and latest
        records as they were; fitting restores the selection after).
    layer : selector, optional
        Anything :meth:`Recorder.record` takes, resolving to one call.
    """

    needs_fit: ClassVar[bool] = False
    needs_target: ClassVar[bool] = False
    edits: ClassVar[bool] = False
    fit_passes: ClassVar[int] = 1
    """How many times :meth:`fit` iterates ``batches`` (ViM: 2)."""
    own_passes: bool = False
    """Whether scoring needs passes of its own that no other detector can
    share (ODIN's gradient with respect to the input, NAC's backward): see
    :meth:`score_inputs`. A class attribute; a detector whose passes depend
    on its configuration sets it per instance (``Mahalanobis(epsilon > 0)``)."""
    own_fit: ClassVar[bool] = False
    """Whether the detector overrides :meth:`fit` with a fit of its own (ViM's
    two passes), so that :func:`~._passes.fit_detectors` fits it on its own
    instead of in the pass it shares with the others. Set for each subclass
    from whether it defines ``fit``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Set :attr:`own_fit` from whether the class overrides :meth:`fit`."""
        super().__init_subclass__(**kwargs)
        cls.own_fit = cls.fit is not Detector.fit

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
        self.num_classes: int | None = net_classes(rnet) if self.needs_target else None
        """The classes the labels of the fit data must lie in, ``[0, C)``
        (detectors taking labels: by default the net's logits)."""

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

        For detectors whose passes no other detector can share
        (:attr:`own_passes`: ODIN's gradient with respect to the input,
        NAC's backward pass with autograd on).
        """
        raise NotImplementedError

    def edit_passes(self) -> list[Edit]:
        """Return one ``(label, edit)`` per pass an edit detector needs.

        Default: the one pass editing :meth:`edit_label` with :meth:`edit`;
        RankFeat at two blocks gives two; a pass editing several labels is
        ``{label: edit, ...}`` (ReAct on several layers).
        """
        return [(self.edit_label(), self.edit)]

    def score_passes(self, results: Sequence[Pass]) -> Tensor:
        """Return the scores from the passes of :meth:`edit_passes`, in order."""
        return self.score_pass(results[0])

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

        Raises
        ------
        TypeError
            For ``batches`` given as a tensor or a mapping (not an iterable
            of batches).
        ValueError
            For fit samples with a NaN or an infinity in what the detector
            reads (naming the layer and their count), for labels that are
            not class indices of the net, and as
            :func:`~scio_recorder.collect.collect`.
        """
        name = type(self).__name__
        check_batches(batches, f"{name}.fit")
        keep = self.fit_keep()
        if keep:
            if self.needs_target and target is None:
                msg = (
                    f"{name}.fit needs class labels: pass `target=` "
                    "(e.g. `target=1` for (input, label) batches)."
                )
                raise ValueError(msg)
            found = fit_pass(
                self.rnet,
                keep,
                batches,
                who=dict.fromkeys(keep, name),
                input=input,
                target=checked_targets(target, input, [self])
                if self.needs_target
                else None,
                **options,
            )
            self.fit_from(dict(found.values()))
        self._fitted = True
        return self

    def _keep_key(self, label: DepthIdx, kind: str) -> Any:
        return InputOf(label) if kind == "input" else label

    # -- scoring -----------------------------------------------------------
    def score(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the OoD scores ``[batch]`` of the net's inputs (higher: OoD).

        Runs one pass of the net (under ``torch.no_grad()``), a pass of the
        detector's own: the recorder's selection and its latest records are
        not touched. Several threads may score with one detector (or several
        detectors of one recorder) at once: each gets the scores of its own
        inputs (see :func:`run_pass`). A padded batch of a net that takes
        ``position_ids`` gets them from its ``attention_mask`` when it has
        none, as in the fit (``collect(position_ids="from_mask")``). An empty
        batch gives an empty ``[0]`` tensor; a sample with a NaN or an
        infinity in the inputs or in what the detector reads scores NaN, and
        the others as without it.
        """
        self.check_fitted()
        scores, _ = self.score_alone(*Positions.of(self.rnet.net).add(args, kwargs))
        return scores

    @property
    def shares_pass(self) -> bool:
        """Whether one unedited pass serves it (no edit, no passes of its own)."""
        return not (self.edits or self.own_passes)

    def score_alone(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass | None]:
        """Score one batch with passes for this detector alone.

        One pass recording what it reads, or one per edit
        (:meth:`edit_passes`), or the passes of its own
        (:meth:`score_inputs`). Returns the scores and the pass they came
        from (the first edit's; ``None`` for passes of its own or an empty
        batch), whose logits ``evaluate`` reads for the closed-set accuracy.
        The protocol's rules apply (the module's docstring): an empty batch
        runs nothing; non-finite rows score NaN.
        """
        empty = empty_batch(args, kwargs)
        if empty is not None:
            return empty, None
        bad = input_rows_non_finite(args, kwargs)
        if self.edits:
            results = [
                run_pass(self.rnet, args, kwargs, edit=edit)
                for edit in self.edit_passes()
            ]
            scores = score_finite_rows(
                results,
                self.score_passes,
                outputs=self.outputs(),
                inputs=self.inputs(),
                bad_inputs=bad,
            )
            return scores, results[0]
        if self.own_passes:
            return self.score_own(args, kwargs, bad), None
        result = run_pass(
            self.rnet, args, kwargs, outputs=self.outputs(), inputs=self.inputs()
        )
        return self.score_shared(result, bad), result

    def score_shared(self, result: Pass, bad_inputs: Tensor | None = None) -> Tensor:
        """Score a pass that recorded what this detector reads, finite rows only."""
        return score_finite_rows(
            [result],
            lambda results: self.score_pass(results[0]),
            outputs=self.outputs(),
            inputs=self.inputs(),
            bad_inputs=bad_inputs,
        )

    def score_own(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        bad_inputs: Tensor | None = None,
    ) -> Tensor:
        """Score with passes of the detector's own; NaN for non-finite input rows.

        :meth:`score_inputs` runs on the whole batch (its passes may need
        the whole input); the rows ``bad_inputs`` marks get NaN after.
        """
        if bad_inputs is None or not bool(bad_inputs.any()):
            return self.score_inputs(args, kwargs)
        if bool(bad_inputs.all()):
            return torch.full(bad_inputs.shape, float("nan"), device=bad_inputs.device)
        scores = self.score_inputs(args, kwargs)
        return scores.masked_fill(bad_inputs.to(scores.device), float("nan"))

    __call__ = score

    def check_fitted(self, before: str = "scoring") -> None:
        """Raise :class:`NotFittedError` if the detector cannot score (or save) yet."""
        if not self._fitted:
            msg = (
                f"{type(self).__name__} must be fitted before {before}: call "
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

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries of :meth:`state`: shapes on this net, dtypes.

        :meth:`load` checks a file against them (and against nothing else
        the detector would have to repeat); :meth:`load_state` then gets
        exactly these entries, of these shapes and dtypes.
        """
        return {}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the fitted state from :meth:`state`'s dict (checked by :meth:`load`)."""

    def layers_read(self) -> list[tuple[DepthIdx, str]]:
        """Return the ``(label, "output" | "input")`` pairs a pass reads or edits."""
        read = [(label, "output") for label in self.outputs()]
        read += [(label, "input") for label in self.inputs()]
        if self.edits:
            read += [
                (label, "output")
                for edit in self.edit_passes()
                for label in edit_map(edit)
            ]
        return read

    def save(self, path: str | Path) -> Path:
        """Save the fitted state to a safetensors file (with the config).

        The file holds :meth:`state`, the detector's class and config, and
        the per-sample shapes of the layers it reads, all checked by
        :meth:`load`.

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
        self.check_fitted("saving")
        return save_state(self, self.state(), path)

    def load(self, path: str | Path) -> Self:
        """Load a state saved by :meth:`save` by a detector of the same config.

        Everything is checked once, here, before the detector changes: the
        file (as :func:`~scio_recorder.io.load_records` does), the detector
        class and the config it was saved with, the per-sample shapes of the
        layers it read against this recorder's layer table, and the state
        against :meth:`state_entries`: no entry missing, none unexpected,
        each a tensor of the declared shape (sizes fixed by the layer, or
        the same in every entry), of a floating-point or integer dtype as
        declared (converted to the declared dtype; another kind is refused),
        with finite values.

        Raises
        ------
        FileNotFoundError
            If there is no such file.
        ValueError
            Naming the file and the bad entry, if any check fails.
        """
        self.load_state(read_state(self, path))
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
