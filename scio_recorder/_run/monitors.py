"""Per-token detectors as monitors of ``generate``: a score per step, and a stop.

The step loop's side: the detectors satisfy :class:`Monitor` as they are
(:class:`~scio_recorder.ood.Mahalanobis` and the others built with
``token="each"``, :class:`~scio_recorder.ood.Surprisal`), so this module,
below the recorder, never imports :mod:`scio_recorder.ood`, which stands
above it.

``rnet.generate(**inputs, max_new_tokens=N, monitors={"m": det})`` runs the
net's own ``generate`` (with its KV cache) and scores every step with each
monitor, a detector built with ``token="each"``
(``TokenScoring`` in ``scio_recorder.ood``), from that step's own forward: the
records of the layers the detector reads (forward hooks on their modules
while ``generate`` runs) and the step's logits. After the call,
``rnet.monitor_scores["m"]`` is ``[B, N]``, NaN where a row had finished.

Which token a step scores (the detector's ``step_position``):

* ``"fed"`` (the feature and logit detectors): step ``s`` scores the token
  its forward read, whose next-token distribution it gives: the last prompt
  token at step 0, then the token chosen at step ``s - 1``. Of the final
  sequence (prompt of width ``P``), that is position ``P - 1 + s``.
* ``"chosen"`` (:class:`~scio_recorder.ood.Surprisal`): step ``s`` scores
  the token it chose, at position ``P + s``.

The scores equal ``det.score_tokens`` of the final sequence at those
positions (up to the float32 difference between a cached step and a full
pass). Greedy search and sampling (``num_return_sequences`` too: a row per
sequence); a beam search is refused (its rows are candidates, reordered
between steps, which a row's scores cannot follow).

``stop_when={"m": threshold}`` (or ``{"m": (threshold, window)}``: the mean
of the row's latest ``window`` step scores) stops a row whose score exceeds
the threshold (a detector's ``calibrate`` threshold): the
row keeps the token of the step that crossed it, then emits only padding,
and its later monitor scores are NaN. ``rnet.monitor_stops`` ``[B]`` gives
the step at which each row was stopped (``-1``: never). ``on_step`` is a
hook for an action of the user's own: called after each step with the
step's index, the monitors' scores ``{name: [B]}`` and the rows flagged by
``stop_when``, it may return a bool ``[B]`` of further rows to stop (abstain)
or do something else (steer through the recorder's edits, log).
"""

from __future__ import annotations

__all__ = ["Monitor", "MonitorStep", "generate_monitored"]

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch import nn

    from scio_recorder.layers import DepthIdx, LayerTable

    class Recorder(Protocol):
        """What a monitored ``generate`` uses of the recorder."""

        @property
        def net(self) -> nn.Module:
            """The wrapped net."""

        @property
        def table(self) -> LayerTable:
            """The layer table."""

        monitor_scores: dict[str, Tensor]
        monitor_stops: Tensor

        def call_method(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
            """Run a method of the net that calls its forward."""


class Monitor(Protocol):
    """What ``generate(monitors=...)`` asks of a detector.

    A detector of :mod:`scio_recorder.ood` built with ``token="each"`` (or
    :class:`~scio_recorder.ood.Surprisal`) is one as it is.
    """

    token_each: bool
    """Whether it scores every token (only such detectors monitor)."""

    def check_fitted(self) -> None:
        """Raise unless fitted."""

    def outputs(self) -> Iterable[DepthIdx]:
        """Return the layers whose outputs it reads."""

    def inputs(self) -> Iterable[DepthIdx]:
        """Return the layers whose inputs it reads."""

    def score_step(
        self,
        logits: Tensor,
        outputs: Mapping[DepthIdx, Tensor],
        inputs: Mapping[DepthIdx, Tensor],
        tokens: Tensor,
    ) -> Tensor:
        """Score one step from its own records, ``[B]``."""


@dataclasses.dataclass(frozen=True)
class MonitorStep:
    """What ``on_step`` gets after each step of a monitored ``generate``.

    ``step``: the step's index (0: the prefill); ``scores``: each monitor's
    score of the step, ``[B]`` (NaN for finished rows); ``flagged``: the
    rows ``stop_when`` stops at this step; ``tokens``: the sequences so far,
    the step's chosen token last.
    """

    step: int
    scores: Mapping[str, Tensor]
    flagged: Tensor
    tokens: Tensor


OnStep = Callable[[MonitorStep], Tensor | None]


def _first_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, tuple | list) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


def _check_monitors(
    monitors: Mapping[str, Any], stop_when: Mapping[str, Any]
) -> dict[str, tuple[float, int]]:
    if not isinstance(monitors, Mapping) or not monitors:
        msg = (
            "generate: monitors must be a non-empty mapping name -> detector, "
            f"got {monitors!r}; e.g. `monitors={{'m': Surprisal(rnet)}}`."
        )
        raise TypeError(msg)
    for name, det in monitors.items():
        if not getattr(det, "token_each", False) or not callable(
            getattr(det, "score_step", None)
        ):
            msg = (
                f"generate: monitor {name!r} must be a detector scoring every "
                "token (built with `token='each'`, or Surprisal), got "
                f"{type(det).__name__}."
            )
            raise TypeError(msg)
        det.check_fitted()
    rules = {}
    for name, rule in stop_when.items():
        if name not in monitors:
            msg = (
                f"generate: stop_when names {name!r}, which is not a monitor; "
                f"the monitors are {sorted(monitors)}."
            )
            raise KeyError(msg)
        threshold, window = rule if isinstance(rule, tuple) else (rule, 1)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            msg = f"generate: the window of stop_when[{name!r}] must be an int >= 1"
            raise ValueError(msg)
        rules[name] = (float(threshold), window)
    return rules


def _eos_ids(rnet: Recorder, kwargs: Mapping[str, Any]) -> set[int]:
    if "eos_token_id" in kwargs:  # the call's, None too (no end token)
        found = kwargs["eos_token_id"]
    else:
        config = kwargs.get("generation_config") or getattr(
            rnet.net, "generation_config", None
        )
        found = getattr(config, "eos_token_id", None)
    if found is None:
        return set()
    return {int(i) for i in (found if isinstance(found, list | tuple) else [found])}


def _refuse_beams(rnet: Recorder, kwargs: Mapping[str, Any]) -> None:
    """Refuse a beam search: its rows are candidates, not the batch's rows."""
    if "num_beams" in kwargs:
        beams = kwargs["num_beams"]
    else:
        config = kwargs.get("generation_config") or getattr(
            rnet.net, "generation_config", None
        )
        beams = getattr(config, "num_beams", None)
    if beams is not None and int(beams) > 1:
        msg = (
            f"generate: monitors score the rows of a greedy or sampled generation; "
            f"a beam search (num_beams={int(beams)}) keeps candidate rows that it "
            "reorders between steps, which a row's scores cannot follow: pass "
            "`num_beams=1` (greedy, or `do_sample=True`), or score the beams' "
            "final sequences with `det.score_tokens`."
        )
        raise ValueError(msg)


def _pad_id(rnet: Recorder, kwargs: Mapping[str, Any]) -> int | None:
    if "pad_token_id" in kwargs:
        found = kwargs["pad_token_id"]
    else:
        config = kwargs.get("generation_config") or getattr(
            rnet.net, "generation_config", None
        )
        found = getattr(config, "pad_token_id", None)
    return None if found is None else int(found)


def _rows_to_stop(extra: Any, rows: int) -> Tensor:
    """Return ``on_step``'s rows to stop as a bool ``[rows]``, or refuse it."""
    stop = torch.as_tensor(extra).cpu()
    if stop.shape != (rows,) or stop.dtype != torch.bool:
        msg = (
            f"generate: on_step returned {stop.dtype} of shape {list(stop.shape)}; "
            f"return None, or a bool tensor of one value per row, shape [{rows}] "
            "(the rows of the generation: prompts x num_return_sequences)."
        )
        raise ValueError(msg)
    return stop


class _Watch:
    """The hooks and the per-step scoring of one monitored ``generate``."""

    def __init__(  # noqa: PLR0913 (the recorder, the monitors and what to do)
        self,
        rnet: Recorder,
        monitors: Mapping[str, Monitor],
        rules: Mapping[str, tuple[float, int]],
        *,
        on_step: OnStep | None,
        eos: set[int],
        batch: int,
    ) -> None:
        self.rnet, self.monitors, self.rules = rnet, dict(monitors), dict(rules)
        self.on_step, self.eos = on_step, eos
        self.outputs: dict[DepthIdx, Tensor | None] = {}
        self.inputs: dict[DepthIdx, Tensor | None] = {}
        self.logits: Tensor | None = None
        self.step = 0
        self.done = torch.zeros(batch, dtype=torch.bool)
        self.stops = torch.full((batch,), -1, dtype=torch.int64)
        self.scores: dict[str, list[Tensor]] = {name: [] for name in monitors}
        self.handles: list[Any] = []
        # what each monitor reads, resolved once (not per step)
        self.reads = {
            name: (tuple(det.outputs()), tuple(det.inputs()))
            for name, det in self.monitors.items()
        }
        self.eos_ids = torch.tensor(sorted(eos), dtype=torch.int64)

    def hook(self) -> None:
        """Register the forward hooks on the modules the monitors read."""
        table = self.rnet.table
        outs = {label for d in self.monitors.values() for label in d.outputs()}
        ins = {label for d in self.monitors.values() for label in d.inputs()}
        for label in outs:
            self.handles.append(
                table[label].module.register_forward_hook(self._keep_output(label))
            )
        for label in ins:
            self.handles.append(
                table[label].module.register_forward_pre_hook(self._keep_input(label))
            )
        self.handles.append(self.rnet.net.register_forward_hook(self._keep_logits))

    def unhook(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()

    def _keep_output(self, label: DepthIdx) -> Callable[..., None]:
        def keep(_m: Any, _args: Any, output: Any) -> None:
            value = _first_tensor(output)
            self.outputs[label] = None if value is None else value[:, -1:].detach()

        return keep

    def _keep_input(self, label: DepthIdx) -> Callable[..., None]:
        def keep(_m: Any, args: Any) -> None:
            value = _first_tensor(args)
            self.inputs[label] = None if value is None else value[:, -1:].detach()

        return keep

    def _keep_logits(self, _m: Any, _args: Any, output: Any) -> None:
        logits = getattr(output, "logits", None)
        if logits is None:
            logits = _first_tensor(output)
        self.logits = None if logits is None else logits[:, -1:].detach()

    def score_step(self, tokens: Tensor) -> Tensor:
        """Score the step that just chose ``tokens[:, -1]``; return rows to stop."""
        if self.logits is None:
            msg = "generate: the monitored step gave no logits"
            raise ValueError(msg)
        if self.step == 0 and tokens.shape[0] != self.done.shape[0]:
            # num_return_sequences: rows of the prompt repeated
            self.done = torch.zeros(tokens.shape[0], dtype=torch.bool)
            self.stops = torch.full((tokens.shape[0],), -1, dtype=torch.int64)
        device = tokens.device
        step_scores = {}
        for name, det in self.monitors.items():
            score = self._score(name, det, tokens).to("cpu", torch.float64)
            if self.step:  # no row is done before the first step
                score = score.masked_fill(self.done, math.nan)
            self.scores[name].append(score)
            step_scores[name] = score
        flagged = torch.zeros_like(self.done)
        for name, (threshold, window) in self.rules.items():
            recent = torch.stack(self.scores[name][-window:], dim=1)
            level = recent.nanmean(dim=1) if window > 1 else recent[:, 0]
            flagged |= (level > threshold) & ~self.done
        if self.on_step is not None:
            extra = self.on_step(
                MonitorStep(self.step, step_scores, flagged.clone(), tokens)
            )
            if extra is not None:
                flagged |= _rows_to_stop(extra, self.done.shape[0]) & ~self.done
        self.stops[flagged & (self.stops < 0)] = self.step
        self.done |= flagged
        if self.eos:
            chosen = tokens[:, -1].to("cpu", torch.int64)
            self.done |= torch.isin(chosen, self.eos_ids).reshape(self.done.shape)
        self.step += 1
        return flagged.to(device)

    def _score(self, name: str, det: Monitor, tokens: Tensor) -> Tensor:
        """One detector's score of the step, ``[B]``, from the step's records."""
        assert self.logits is not None  # noqa: S101 (score_step checked it)
        outs, ins = self.reads[name]
        outputs = {k: v for k in outs if (v := self.outputs.get(k)) is not None}
        inputs = {k: v for k in ins if (v := self.inputs.get(k)) is not None}
        return det.score_step(self.logits, outputs, inputs, tokens)

    def results(self, width: int | None) -> dict[str, Tensor]:
        """Return each monitor's ``[B, N]`` scores (NaN past the last step)."""
        out = {}
        for name, columns in self.scores.items():
            table = (
                torch.stack(columns, dim=1)
                if columns
                else torch.zeros(self.done.shape[0], 0, dtype=torch.float64)
            )
            if width is not None and table.shape[1] < width:
                pad = torch.full(
                    (table.shape[0], width - table.shape[1]),
                    math.nan,
                    dtype=torch.float64,
                )
                table = torch.cat([table, pad], dim=1)
            out[name] = table
        return out


def generate_monitored(  # noqa: PLR0913 (generate's arguments, then the monitors)
    rnet: Recorder,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    monitors: Mapping[str, Monitor],
    stop_when: Mapping[str, Any] | None,
    on_step: OnStep | None,
    options: Mapping[str, Any],
) -> Any:
    """Run ``rnet.generate`` with monitors (see the module's docstring).

    Sets ``rnet.monitor_scores`` (name -> ``[B, N]``) and
    ``rnet.monitor_stops`` (``[B]``, the step a row was stopped at, -1:
    never); returns what ``generate`` returns.
    """
    import transformers  # noqa: PLC0415 (only for generate)

    rules = _check_monitors(monitors, stop_when or {})
    _refuse_beams(rnet, kwargs)
    ids = kwargs.get("input_ids", args[0] if args else None)
    if not isinstance(ids, Tensor):
        msg = "generate: monitors need the prompt's input_ids (a [B, P] tensor)"
        raise TypeError(msg)
    watch = _Watch(
        rnet,
        monitors,
        rules,
        on_step=on_step,
        eos=_eos_ids(rnet, kwargs),
        batch=ids.shape[0],
    )

    class _Criterion(transformers.StoppingCriteria):
        def __call__(self, input_ids: Tensor, scores: Tensor, **_: Any) -> Tensor:  # noqa: ARG002 (transformers' signature)
            return watch.score_step(input_ids)

    class _Pad(transformers.LogitsProcessor):
        """Make a row stopped by a monitor emit only the pad token."""

        def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:  # noqa: ARG002 (transformers' signature)
            stopped = (watch.stops >= 0).to(scores.device)
            if pad is None or not bool(stopped.any()):
                return scores
            only = torch.full_like(scores[0], -math.inf)
            only[pad] = 0.0
            return torch.where(stopped[:, None], only, scores)

    pad = _pad_id(rnet, kwargs)
    if rules and pad is None:
        msg = (
            "generate: stop_when pads the rows it stops, but no pad token is "
            "known; pass `pad_token_id=`."
        )
        raise ValueError(msg)
    criteria = transformers.StoppingCriteriaList(kwargs.pop("stopping_criteria", []))
    criteria.append(_Criterion())
    processors = transformers.LogitsProcessorList(kwargs.pop("logits_processor", []))
    processors.append(_Pad())
    kwargs["logits_processor"] = processors
    watch.hook()
    try:
        out = rnet.call_method(
            "generate", *args, stopping_criteria=criteria, **kwargs, **options
        )
    finally:
        watch.unhook()
    width = kwargs.get("max_new_tokens")
    rnet.monitor_scores = watch.results(width if isinstance(width, int) else None)
    rnet.monitor_stops = watch.stops
    return out
