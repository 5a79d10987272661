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
    "StateEntry",
    "all_or_nothing",
    "check_reiterable",
    "fit_detectors",
    "in_subfolder",
    "last_linear",
    "logits_of",
    "one_label",
    "run_passes",
]

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from scio_recorder._batches import as_arguments, batch_getter, first_batch_size
from scio_recorder._engine.state import pick_argument
from scio_recorder._outputs import logits_of
from scio_recorder.collect import InputOf, collect
from scio_recorder.io import load_records, save_records
from scio_recorder.layers import label_str
from scio_recorder.recorder import Recorder
from scio_recorder.reduce import Tee
from scio_recorder.select import resolve_one

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable, Sequence

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


@dataclasses.dataclass(frozen=True)
class StateEntry:
    """One tensor of a detector's fitted state, as :meth:`Detector.load` checks it.

    Attributes
    ----------
    shape : tuple of int, str or None
        Its size along each dimension: an ``int`` is fixed by the net (a
        layer's number of features, from the recorder's layer table), a
        ``str`` names a size set by the fit (``"classes"``, ``"samples"``)
        that must be the same in every entry naming it, ``None`` is not
        checked (a size the layer table does not know).
    dtype : torch.dtype
        The dtype the detector computes in. A stored tensor of another dtype
        of the same kind (floating point, or integer) is converted to it; one
        of another kind is refused.

    Examples
    --------
    >>> import torch
    >>> StateEntry(("classes", 16), torch.float64)
    StateEntry(shape=('classes', 16), dtype=torch.float64)

    """

    shape: tuple[int | str | None, ...]
    dtype: torch.dtype


def per_sample_size(rnet: Recorder, label: DepthIdx, kind: str) -> list[int] | None:
    """Return the per-sample shape of a layer's output or (first) input, if known."""
    row = rnet.table[label]
    size = row.output_size if kind == "output" else row.input_size
    if isinstance(size, list) and size and all(_is_size(n) for n in size):
        return list(size[1:])
    return None


def feature_count(rnet: Recorder, label: DepthIdx, kind: str) -> int | None:
    """Return the number of features per sample of a layer's output or input."""
    size = per_sample_size(rnet, label, kind)
    return None if size is None else math.prod(size)


def check_feature_count(
    detector: Detector, label: DepthIdx, kind: str, *, got: int, expected: int
) -> None:
    """Refuse scoring features whose size is not the fitted one, naming the layer."""
    if got != expected:
        msg = (
            f"{type(detector).__name__}: layer "
            f"{detector.rnet.table[label].describe()} ({kind}) gives {got} "
            f"features per sample, but the detector was fitted on {expected}: score "
            "inputs of the shape it was fitted on (e.g. images of the fit's "
            "size), or fit it again on such inputs."
        )
        raise ValueError(msg)


def _is_size(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


class NonFinite:
    """A reducer counting the samples that hold a NaN or an infinity.

    Teed with a detector's own reducer (:func:`finite_keep`), so that the fit
    refuses non-finite features with their count (:func:`finite_result`)
    instead of failing later in ``linalg``. The count stays on the records'
    device until :meth:`result`.

    Examples
    --------
    >>> import torch
    >>> r = NonFinite()
    >>> r.update(torch.tensor([[1.0, float("nan")], [1.0, 2.0], [float("inf"), 0]]))
    >>> r.result(), r.count
    (2, 3)

    """

    def __init__(self) -> None:
        """Start with no sample seen."""
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.bad = torch.zeros((), dtype=torch.int64)

    @property
    def count(self) -> int:
        """Samples seen."""
        return self.n

    def update(self, value: Any, target: Tensor | None = None) -> None:  # noqa: ARG002 (the protocol)
        """Count the samples of ``value`` with a non-finite entry."""
        flat = value.detach().reshape(value.shape[0], -1)
        bad = (~torch.isfinite(flat)).any(dim=1).sum()
        self.bad = self.bad.to(flat.device) + bad
        self.n += flat.shape[0]

    def merge(self, other: NonFinite) -> None:
        """Add ``other``'s counts."""
        self.bad = self.bad + other.bad.to(self.bad.device)
        self.n += other.n

    def result(self) -> int:
        """Return the number of non-finite samples (one host read)."""
        return int(self.bad)

    def state(self) -> dict[str, Tensor]:
        """Return the counts."""
        return {"count": torch.tensor(self.n), "bad": self.bad}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the counts."""
        self.n, self.bad = int(state["count"]), state["bad"].to(torch.int64)

    def fresh(self) -> NonFinite:
        """Return an empty counter."""
        return NonFinite()

    def __repr__(self) -> str:
        """Show the class."""
        return "NonFinite()"


def finite_keep(reducer: Any) -> Tee:
    """Return ``reducer`` teed with a :class:`NonFinite` count of its samples."""
    return Tee(reducer, NonFinite())


def finite_result(detector: Detector, label: DepthIdx, kind: str, value: Any) -> Any:
    """Return the result of a :func:`finite_keep`; refuse non-finite samples."""
    result, bad = value
    if bad:
        count = getattr(result, "count", None)
        check_finite_samples(detector, label, kind, bad=bad, n=count)
    return result


def check_finite_samples(
    detector: Detector, label: DepthIdx, kind: str, *, bad: int, n: int | None
) -> None:
    """Raise if ``bad`` fit samples hold non-finite features, naming the layer."""
    if bad:
        of = f" of the {n}" if n is not None else ""
        msg = (
            f"{type(detector).__name__}: {bad}{of} fit samples have non-finite "
            f"features (NaN or Inf) at layer "
            f"{detector.rnet.table[label].describe()} ({kind}), so the fitted "
            "state would be NaN. Drop or repair those samples before fitting "
            "(find them with `torch.isfinite` on the inputs, or on the layer's "
            "records from `collect`), or look for an overflow in the net (e.g. "
            "float16)."
        )
        raise ValueError(msg)


@dataclasses.dataclass
class CheckedTargets:
    """A ``target=`` for ``collect`` that checks class labels before any reducer.

    Checked per batch, before the net runs and before any class table grows:
    integer dtype, one label per sample, each in ``[0, num_classes)``.
    """

    spec: Any
    input: Any
    num_classes: int | None
    who: str
    seen: int = dataclasses.field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Resolve the getters (refusing a bad ``target=`` at once)."""
        self._target = batch_getter(self.spec, "target")
        self._input = (
            None if callable(self.input) else batch_getter(self.input, "input")
        )

    def __call__(self, batch: Any) -> Any:
        """Return the batch's labels, checked."""
        target = self._target(batch)
        index, self.seen = self.seen, self.seen + 1
        labels = target if isinstance(target, Tensor) else torch.as_tensor(target)
        where = f"batch {index} of the fit data"
        classes = f"[0, {self.num_classes})" if self.num_classes else "[0, classes)"
        if (
            labels.is_floating_point()
            or labels.is_complex()
            or labels.dtype == torch.bool
        ):
            msg = (
                f"{self.who}: the class labels of {where} are {labels.dtype}, not "
                f"integers: pass integer class indices in {classes}, one per sample "
                "(e.g. `labels.long()`)."
            )
            raise TypeError(msg)
        size = None
        if self._input is not None:
            args, kwargs = as_arguments(self._input(batch), spread=False)
            size = first_batch_size(args, kwargs)
        if labels.dim() != 1 or (size is not None and labels.shape[0] != size):
            msg = (
                f"{self.who}: {where} has "
                f"{'?' if size is None else size} samples but labels of shape "
                f"{list(labels.shape)}: pass one class index per sample, shape "
                f"[{'batch' if size is None else size}] (`target=` picks the labels "
                "out of each batch)."
            )
            raise ValueError(msg)
        if labels.numel():
            low, high = (int(v) for v in torch.stack([labels.min(), labels.max()]))
            bad = low if low < 0 else high
            if low < 0 or (self.num_classes is not None and high >= self.num_classes):
                count = (
                    f"the {self.num_classes} classes of the net"
                    if self.num_classes is not None
                    else "class indices"
                )
                msg = (
                    f"{self.who}: class label {bad} in {where} is outside "
                    f"{classes} ({count}); labels must be class indices: drop "
                    "those samples, or fix `target=`"
                    + (
                        ", or pass `num_classes=` covering every class."
                        if self.num_classes is not None
                        else "."
                    )
                )
                raise ValueError(msg)
        return target


def checked_targets(
    target: Any,
    input: Any,  # noqa: A002 (collect's name)
    detectors: Sequence[Detector],
) -> CheckedTargets:
    """Return ``target`` wrapped to check labels for the detectors that use them."""
    users = [d for d in detectors if d.needs_target]
    known = [n for d in users if (n := getattr(d, "num_classes", None)) is not None]
    who = ", ".join(sorted({type(d).__name__ for d in users})) + ".fit"
    return CheckedTargets(target, input, min(known) if known else None, who)


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
    fit_passes: ClassVar[int] = 1
    """How many times :meth:`fit` iterates ``batches`` (ViM: 2)."""
    own_passes: ClassVar[bool] = False
    """Whether scoring needs passes of its own that no other detector can
    share (ODIN's gradient with respect to the input, NAC's backward): see
    :meth:`score_inputs`."""

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

        For detectors whose passes no other detector can share
        (:attr:`own_passes`: ODIN's gradient with respect to the input,
        NAC's backward pass with autograd on).
        """
        raise NotImplementedError

    def edit_passes(self) -> list[tuple[DepthIdx, Any]]:
        """Return one ``(label, edit)`` per pass an edit detector needs.

        Default: the one pass editing :meth:`edit_label` with :meth:`edit`;
        RankFeat at two blocks gives two.
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
                target=checked_targets(target, input, [self])
                if self.needs_target
                else None,
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
            read += [(label, "output") for label, _ in self.edit_passes()]
        return read

    def _layer_shapes(self) -> dict[str, list[int]]:
        shapes = {}
        for label, kind in self.layers_read():
            size = per_sample_size(self.rnet, label, kind)
            if size is not None:
                shapes[f"{label_str(label)} {kind}"] = size
        return shapes

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
        self.check_fitted()
        meta = {
            "ood.detector": type(self).__name__,
            "ood.config": json.dumps(self.config(), sort_keys=True),
            "ood.layers": json.dumps(self._layer_shapes(), sort_keys=True),
        }
        return save_records(path, self.state(), extra_metadata=meta)

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
        records = load_records(path)
        source = records.path
        meta = records.metadata
        name = meta.get("ood.detector")
        if name != type(self).__name__:
            msg = (
                f"'{source}' holds the state of a {name or 'non-detector file'}, not "
                f"of a {type(self).__name__}."
            )
            raise ValueError(msg)
        saved = _metadata_json(source, meta, "ood.config", required=True)
        mine = json.loads(json.dumps(self.config(), sort_keys=True))
        if saved != mine:
            diff = sorted(
                k for k in saved.keys() | mine.keys() if saved.get(k) != mine.get(k)
            )
            was = [saved.get(k) for k in diff]
            now = [mine.get(k) for k in diff]
            msg = (
                f"'{source}' was saved by a {name} configured otherwise "
                f"({', '.join(diff)}: saved {was}, now {now}); make the detector "
                "with the same arguments."
            )
            raise ValueError(msg)
        self._check_layers(source, _metadata_json(source, meta, "ood.layers"))
        self.load_state(self._checked_state(source, records))
        self._fitted = True
        return self

    def _check_layers(self, source: Path, saved: dict[str, Any]) -> None:
        """Compare the saved per-sample shapes of the layers read with this net's."""
        for label, kind in self.layers_read():
            was = saved.get(f"{label_str(label)} {kind}")
            now = per_sample_size(self.rnet, label, kind)
            if was is not None and now is not None and was != now:
                msg = (
                    f"'{source}' holds a {type(self).__name__} state fitted on layer "
                    f"{label_str(label)} whose {kind} was {was} per sample, but in "
                    f"this net layer {self.rnet.table[label].describe()} has the "
                    f"{kind} {now}: the state does not fit this net. Load it into "
                    "a detector on the net it was fitted on (same net and "
                    "`input_size`), or fit this one again."
                )
                raise ValueError(msg)

    def _checked_state(
        self, source: Path, records: Mapping[Any, Any]
    ) -> dict[str, Tensor]:
        """Check the records against :meth:`state_entries`; convert dtypes."""
        who = type(self).__name__
        entries = self.state_entries()
        found = {
            k if isinstance(k, str) else label_str(k): v for k, v in records.items()
        }
        expected = ", ".join(map(repr, entries)) or "no entry"
        missing = [k for k in entries if k not in found]
        if missing:
            msg = (
                f"'{source}' holds an incomplete {who} state: entry "
                f"{', '.join(map(repr, missing))} is missing (a {who} state has "
                f"{expected}; the file has {', '.join(map(repr, found)) or 'none'}). "
                "The file was cut or edited: save the fitted detector again."
            )
            raise ValueError(msg)
        extra = [k for k in found if k not in entries]
        if extra:
            msg = (
                f"'{source}' holds unexpected entries {', '.join(map(repr, extra))} "
                f"besides the {who} state ({expected}): it was not written by "
                f"{who}.save, or was edited. Save the fitted detector again."
            )
            raise ValueError(msg)
        layer = self._layer_text()
        sizes: dict[str, tuple[int, str]] = {}
        state: dict[str, Tensor] = {}
        for key, entry in entries.items():
            value = found[key]
            where = f"'{source}': entry {key!r} of the {who} state"
            if not isinstance(value, Tensor):
                msg = f"{where} is a {type(value).__name__}, not a tensor."
                raise ValueError(msg)  # noqa: TRY004 (a bad file, as the others)
            _check_shape(where, layer, value, entry, sizes=sizes, key=key)
            state[key] = _checked_dtype(where, value, entry)
        return state

    def _layer_text(self) -> str:
        read = self.layers_read()
        if not read:
            return "this net"
        label, kind = read[0]
        return f"layer {self.rnet.table[label].describe()} ({kind})"

    def __repr__(self) -> str:
        """Show the class, the config and whether it is fitted."""
        config = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        fitted = (
            ""
            if not self.needs_fit
            else (", fitted" if self._fitted else ", not fitted")
        )
        return f"{type(self).__name__}({config}{fitted})"


def _metadata_json(
    source: Path, meta: Mapping[str, str], key: str, *, required: bool = False
) -> dict[str, Any]:
    """Parse one JSON object of a detector file's metadata, naming what is bad."""
    text = meta.get(key)
    if text is None:
        if not required:
            return {}  # files saved before this entry existed
        msg = (
            f"'{source}' has no {key!r} metadata entry: it was not written by "
            "`Detector.save`, or was edited. Save the fitted detector again."
        )
        raise ValueError(msg)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        msg = (
            f"'{source}': its {key!r} metadata entry is not valid JSON ({error}); "
            "the file was edited or damaged. Save the fitted detector again."
        )
        raise ValueError(msg) from error
    if not isinstance(value, dict):
        msg = (
            f"'{source}': its {key!r} metadata entry is a JSON "
            f"{type(value).__name__}, not an object; the file was edited or "
            "damaged. Save the fitted detector again."
        )
        raise ValueError(msg)  # noqa: TRY004 (a bad file, as the others)
    return value


def _check_shape(  # noqa: PLR0913 (the entry, its context, the sizes seen)
    where: str,
    layer: str,
    value: Tensor,
    entry: StateEntry,
    *,
    sizes: dict[str, tuple[int, str]],
    key: str,
) -> None:
    """Check one entry's shape against its declaration and the named sizes."""
    shown = "[" + ", ".join("?" if n is None else str(n) for n in entry.shape) + "]"
    got = list(value.shape)
    bad = len(got) != len(entry.shape) or any(
        isinstance(want, int) and have != want
        for have, want in zip(got, entry.shape, strict=False)
    )
    if bad:
        msg = (
            f"{where} has shape {got}, but on {layer} it must be {shown}: the "
            "state was saved from another net or layer. Load it into a "
            "detector on the net it was fitted on, or fit this one again."
        )
        raise ValueError(msg)
    for have, want in zip(got, entry.shape, strict=True):
        if isinstance(want, str):
            size, other = sizes.setdefault(want, (have, key))
            if size != have:
                msg = (
                    f"{where} has shape {got} ({want}: {have}), but entry "
                    f"{other!r} has {want}: {size}; the entries do not belong "
                    "together. Save the fitted detector again."
                )
                raise ValueError(msg)


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "floating-point" if dtype.is_floating_point else "integer"


def _checked_dtype(where: str, value: Tensor, entry: StateEntry) -> Tensor:
    """Convert ``value`` to the declared dtype, or refuse another kind."""
    have, want = _dtype_kind(value.dtype), _dtype_kind(entry.dtype)
    if have != want:
        msg = (
            f"{where} is {value.dtype} ({have}), but it must be {want} "
            f"({entry.dtype}): refused, as converting it would change what it "
            "means. Save the fitted detector again."
        )
        raise ValueError(msg)
    converted = value.to(entry.dtype)
    if want == "floating-point":
        bad = int((~torch.isfinite(converted)).sum())
        if bad:
            after = (
                f", after conversion to {entry.dtype}"
                if value.dtype != entry.dtype
                else ""
            )
            msg = (
                f"{where} holds {bad} non-finite values (NaN or Inf{after}): "
                "scores would be NaN. Fit the detector again on finite data "
                "and save it."
            )
            raise ValueError(msg)
    return converted


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
        For a one-shot iterator that would be iterated more than once.
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
    if not group:
        return
    rnet = group[0].rnet
    if any(d.rnet is not rnet for d in group):
        msg = "fit_detectors: every detector must wrap the same Recorder"
        raise ValueError(msg)
    shared = [d for d in group if d.needs_fit and type(d).fit is Detector.fit]
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
    scores: dict[int, Tensor] = {}
    passes: dict[int, Pass] = {}
    plain = [(i, d) for i, d in enumerate(detectors) if not (d.edits or d.own_passes)]
    if plain:
        outputs = sorted({label for _, d in plain for label in d.outputs()})
        inputs = sorted({label for _, d in plain for label in d.inputs()})
        with rnet.selecting(*outputs, inputs=inputs), torch.no_grad():
            out = rnet(*args, **kwargs)
            result = _pass(rnet, out)
        for i, detector in plain:
            scores[i] = detector.score_pass(result)
            passes[i] = result
    for i, detector in enumerate(detectors):
        if detector.edits:
            results = []
            for label, edit in detector.edit_passes():
                with rnet.selecting(label), torch.no_grad():
                    out = rnet(*args, activation_postproc=edit, **kwargs)
                    results.append(_pass(rnet, out))
            scores[i] = detector.score_passes(results)
            passes[i] = results[0]
        elif detector.own_passes:
            scores[i] = detector.score_inputs(args, kwargs)
    if logits is not None:
        _fill_unedited(rnet, detectors, passes, args, kwargs)
        logits.extend(passes[i].logits for i in range(len(detectors)))
    return [scores[i] for i in range(len(detectors))]


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
                with torch.no_grad():
                    out = rnet(*args, dont_record=True, **kwargs)
                unedited = _pass(rnet, out)
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
    result = collect(
        rnet,
        batches,
        keep,
        input=input,
        target=checked_targets(target, input, shared) if needs_target else None,
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
