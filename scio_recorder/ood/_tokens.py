"""Per-token scores of token sequences: ``token="each"``, reductions, calibration.

A detector built with ``token="each"`` (and ``mask=`` naming the net's
padding mask, e.g. ``"attention_mask"``) scores every token of a batch of
token sequences, not one pooled vector per row:

* at fit, every real (unpadded) token is a sample, and the statistics are
  streamed (moments, not a bank of every token);
* :meth:`TokenScoring.score_tokens` gives a float64 ``[B, T]``, NaN at the
  padding (and wherever the detector has no score: :class:`Surprisal` at a
  row's first real token); a padded batch gets the position ids a row has
  alone (:class:`~scio_recorder._run.batches.Positions`), so that a row scores
  the same alone and in a left- or right-padded batch;
* ``det(batch)`` reduces each row's token scores by ``reduce=``
  (:func:`reduce_tokens`: ``"mean"``, ``"max"``, ``"last"``, or an int
  ``w``, the largest mean of ``w`` consecutive real tokens);
* :meth:`TokenScoring.calibrate` gives a conformal threshold.

A batch may be given as the net's keyword arguments (``det(**batch)``) or
as one mapping (``det(batch)``, the way tokenizers give them).
"""

from __future__ import annotations

__all__ = [
    "REDUCES",
    "TokenScoring",
    "check_reduce",
    "conformal_threshold",
    "logit_tokens",
    "reduce_tokens",
    "token_arguments",
]

import math
import threading
import weakref
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._run.batches import Positions

from ._checks import check_batches
from ._protocol import Detector, Pass, run_pass
from ._rows import empty_batch, input_rows_non_finite, score_finite_rows

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx

_F64 = torch.float64
REDUCES = ("mean", "max", "last")
"""The named reductions of a row's token scores; an int ``w`` is a window."""
_TOKEN_LEVEL = ("token", "row")


def check_reduce(who: str, reduce: Any) -> str | int:
    """Return ``reduce`` if it is one of :data:`REDUCES` or a window ``w >= 1``.

    Examples
    --------
    >>> check_reduce("doc", 3), check_reduce("doc", "max")
    (3, 'max')
    >>> check_reduce("doc", "sum")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: doc: reduce must be one of ['mean', 'max', 'last'] or an int window ...

    """
    window = isinstance(reduce, int) and not isinstance(reduce, bool) and reduce >= 1
    if not window and reduce not in REDUCES:
        msg = (
            f"{who}: reduce must be one of {list(REDUCES)} or an int window "
            f"w >= 1, got {reduce!r}"
        )
        raise ValueError(msg)
    return reduce  # type: ignore[no-any-return]


def reduce_tokens(scores: Tensor, reduce: str | int = "mean") -> Tensor:
    """Reduce each row's finite token scores ``[B, T]`` to one score, ``[B]``.

    NaN entries (padding, tokens without a score) are skipped: ``"mean"``
    and ``"max"`` of the finite entries, ``"last"`` the last finite entry,
    an int ``w`` the largest mean of ``w`` consecutive finite entries (the
    mean of them all in a row with fewer). A row without a finite entry
    gives NaN.

    Examples
    --------
    >>> import torch
    >>> nan = float("nan")
    >>> s = torch.tensor([[nan, 1.0, 3.0, 2.0], [4.0, nan, nan, nan]])
    >>> [reduce_tokens(s, r).tolist() for r in ("mean", "max", "last", 2)]
    [[2.0, 4.0], [3.0, 4.0], [2.0, 4.0], [2.5, 4.0]]

    """
    finite = torch.isfinite(scores)
    if reduce == "mean":
        total = scores.masked_fill(~finite, 0).sum(dim=1)
        count = finite.sum(dim=1)
        return torch.where(count > 0, total / count.clamp(min=1), math.nan)
    if reduce == "max":
        top = scores.masked_fill(~finite, -math.inf).amax(dim=1)
        return torch.where(finite.any(dim=1), top, math.nan)
    if reduce == "last":
        width = scores.shape[1]
        at = width - 1 - finite.flip(1).to(torch.int8).argmax(dim=1)
        last = scores.gather(1, at[:, None])[:, 0]
        return torch.where(finite.any(dim=1), last, math.nan)
    window = int(reduce)
    out = torch.full(scores.shape[:1], math.nan, dtype=scores.dtype)
    for row in range(scores.shape[0]):
        values = scores[row][finite[row]]
        if values.numel() == 0:
            continue
        if values.numel() <= window:
            out[row] = values.mean()
        else:
            out[row] = values.unfold(0, window, 1).mean(dim=1).max()
    return out.to(scores.device)


def conformal_threshold(scores: Tensor, alpha: float) -> float:
    r"""Return the conformal threshold of calibration scores at level ``alpha``.

    The $\lceil (n + 1)(1 - \alpha) \rceil$-th smallest of the $n$ scores
    (NaN, the padding, left out; an infinite score counts, at its end): a
    new score exchangeable with them exceeds it with probability at most
    $\alpha$ (split-conformal, finite-sample corrected). ``inf`` when $n$ is
    too small for ``alpha`` (nothing may then be flagged).

    Examples
    --------
    >>> import torch
    >>> conformal_threshold(torch.arange(1.0, 20.0), 0.1)  # ceil(20 * 0.9) = 18th
    18.0
    >>> conformal_threshold(torch.arange(1.0, 5.0), 0.1)
    inf
    >>> conformal_threshold(torch.arange(1.0, 150.0), 0.18)  # 150 * 0.82 = 123
    123.0
    >>> conformal_threshold(torch.tensor([1.0, 2.0, float("inf")] * 3), 0.3)
    inf

    """
    if not 0 < alpha < 1:
        msg = f"calibrate: alpha must lie in (0, 1), got {alpha!r}"
        raise ValueError(msg)
    values = scores.reshape(-1)
    # an infinite score is a score (the most or least unusual): leaving it
    # out would lower the threshold below the guarantee
    values = values[~torch.isnan(values)].to(_F64).sort().values
    n = values.numel()
    if n == 0:
        msg = "calibrate: the calibration batches gave no score (all NaN: padding)"
        raise ValueError(msg)
    # exactly, of the decimal written: in floats (n + 1) * (1 - alpha) can
    # exceed an integer it equals (150 * (1 - 0.18) = 123.00000000000001),
    # and its ceiling take the next score
    k = math.ceil((n + 1) * (1 - Fraction(str(float(alpha)))))
    return math.inf if k > n else float(values[k - 1])


def logit_tokens(logits: Tensor, score: Callable[[Tensor], Tensor]) -> Tensor:
    """Apply a score of ``[N, V]`` logits to every position of ``[B, T, V]``.

    Examples
    --------
    >>> import torch
    >>> logit_tokens(torch.zeros(2, 3, 5), lambda z: z.amax(dim=1)).shape
    torch.Size([2, 3])

    """
    if logits.dim() != 3:  # noqa: PLR2004 (a language model's [B, T, V])
        msg = (
            "token='each' scores a language model's next-token distributions: "
            f"logits [B, T, V], got {list(logits.shape)}"
        )
        raise ValueError(msg)
    flat = logits.reshape(-1, logits.shape[2])
    return score(flat).reshape(logits.shape[:2])


def token_arguments(
    args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Spread one mapping argument (``det(batch)``) into keyword arguments.

    Examples
    --------
    >>> token_arguments(({"input_ids": 1},), {})
    ((), {'input_ids': 1})
    >>> token_arguments((2,), {"attention_mask": 3})
    ((2,), {'attention_mask': 3})

    """
    if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
        return (), dict(args[0])
    return tuple(args), dict(kwargs)


class _Kept(threading.local):
    """The arguments of the net's latest call, per thread."""

    values: dict[str, Tensor | None]

    def __init__(self) -> None:
        self.values = {}


def _keeper(
    owner: weakref.ref[TokenScoring], names: dict[str, int | str]
) -> Callable[..., None]:
    def keep(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        detector = owner()
        if detector is None:
            return
        kept = {}
        for key, where in names.items():
            if isinstance(where, str):
                found = kwargs.get(where)
                if found is None and key == "ids" and args:
                    found = args[0]  # the ids given as the first positional
            else:
                found = args[where] if -len(args) <= where < len(args) else None
            kept[key] = found if isinstance(found, Tensor) else None
        detector._kept.values = kept  # noqa: SLF001 (its own state)

    return keep


class TokenScoring(Detector):
    """A detector that can score every token (``token="each"``).

    A mixin placed first among a detector's bases: with ``token="each"``
    the detector's :meth:`token_scores` give ``[B, T]`` per pass, which
    :meth:`score_tokens` masks and ``score`` reduces by ``reduce=``;
    otherwise the detector is as before. Subclasses call
    :meth:`init_tokens` in their constructor, and fit per token in
    :meth:`fit_tokens` (``fit`` goes there with ``token="each"``).
    """

    token_each: bool = False
    """Whether the detector scores every token (``token="each"``)."""
    reduce: str | int = "mean"
    """How ``score`` reduces a row's token scores."""
    mask_arg: int | str | None = None
    """The net's argument holding the padding mask (``mask=``)."""
    step_position: str = "fed"
    """Which token a generation step scores: ``"fed"`` (the token the
    step's forward read, whose next-token distribution it gives) or
    ``"chosen"`` (the token the step chose: :class:`Surprisal`)."""

    def init_tokens(
        self,
        token: str | None,
        mask: int | str | None,
        reduce: str | int,
        *,
        ids: int | str | None = None,
    ) -> None:
        """Check and keep ``token=``, ``mask=`` and ``reduce=``; hook the net.

        ``ids``: the net's argument holding the token ids, for detectors
        that read them (:class:`Surprisal`).
        """
        who = type(self).__name__
        if token not in (None, "each"):
            msg = (
                f"{who}: token must be 'each' (a score per token) or None (one "
                f"score per sample, as before), got {token!r}"
            )
            raise ValueError(msg)
        self.token_each = token == "each"  # noqa: S105 (not a password)
        self.reduce = check_reduce(who, reduce)
        if mask is not None and (
            isinstance(mask, bool) or not isinstance(mask, int | str)
        ):
            msg = (
                f"{who}: mask must name an argument of the net (a keyword str or a "
                f"positional int), got {mask!r}; e.g. `mask='attention_mask'`."
            )
            raise TypeError(msg)
        self.mask_arg = mask
        self._kept = _Kept()
        names = {} if mask is None else {"mask": mask}
        if ids is not None:
            names["ids"] = ids
        if self.token_each:
            # fitted alone, never in a pass shared with class-level detectors
            # (fit_detectors): per instance, over the class's own_fit
            self.__dict__["own_fit"] = True
        if self.token_each and names:
            self._token_hook = self.rnet.net.register_forward_pre_hook(
                _keeper(weakref.ref(self), names), with_kwargs=True
            )

    def token_config(self) -> dict[str, Any]:
        """Return ``token``, ``mask`` and ``reduce`` when ``token="each"``."""
        if not self.token_each:
            return {}
        return {"token": "each", "mask": self.mask_arg, "reduce": self.reduce}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Set :attr:`~Detector.own_fit` as if :meth:`fit` were the protocol's."""
        super().__init_subclass__(**kwargs)
        cls.own_fit = cls.fit not in {Detector.fit, TokenScoring.fit}

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = 0,  # noqa: A002 (collect's name)
        target: Any = None,
        **options: Any,
    ) -> Self:
        """Fit as the detector does, or on every token (``token="each"``).

        With ``token="each"``: :meth:`fit_tokens` (``input`` unused: each
        batch is the net's keyword arguments; ``device`` the one option).
        """
        if not self.token_each:
            return super().fit(batches, input=input, target=target, **options)
        device = options.pop("device", None)
        if options:
            msg = (
                f"{type(self).__name__}.fit with token='each' runs its own loop and "
                f"takes no {', '.join(sorted(options))}; drop them."
            )
            raise TypeError(msg)
        if self.needs_fit:
            self.fit_tokens(batches, target=target, device=device)
        self._fitted = True
        return self

    # -- a generation step (a monitor of ``generate``) ----------------------
    def score_step(
        self,
        logits: Tensor,
        outputs: Mapping[DepthIdx, Tensor],
        inputs: Mapping[DepthIdx, Tensor],
        tokens: Tensor,
    ) -> Tensor:
        """Score one generation step from its own records, ``[B]``.

        What :mod:`scio_recorder._run.monitors` calls at each step of a
        monitored ``generate``: ``logits`` ``[B, 1, V]``, the step's records
        of the layers the detector reads (:meth:`outputs`, :meth:`inputs`:
        ``[B, 1, ...]``) and ``tokens``, the sequences so far (the step's
        chosen token last). The step scores the token of
        :attr:`step_position`.
        """
        width = 2 if self.step_position == "chosen" else 1
        rows = logits.shape[0]
        self._kept.values = {
            "mask": torch.ones(rows, width, dtype=torch.int64),
            "ids": tokens[:, -width:],
        }
        result = Pass(
            logits.expand(-1, width, -1),
            {k: v.expand(-1, width, *v.shape[2:]) for k, v in outputs.items()},
            {k: v.expand(-1, width, *v.shape[2:]) for k, v in inputs.items()},
        )
        return self.token_scores(result)[:, -1]

    # -- what subclasses give ------------------------------------------------
    def token_scores(self, result: Pass) -> Tensor:
        """Return the scores of every token of a pass, ``[B, T]``."""
        raise NotImplementedError

    def fit_token_batch(self, result: Pass, keep: Tensor, target: Tensor) -> None:
        """Feed one fit batch: ``keep`` ``[B, T]`` the tokens to fit on."""
        raise NotImplementedError

    def fit_token_start(self) -> None:
        """Start a per-token fit (fresh statistics)."""

    def fit_token_end(self) -> None:
        """End a per-token fit: set the fitted state."""

    # -- the mask and the ids of a pass -------------------------------------
    def kept(self, name: str, result: Pass) -> Tensor | None:
        """Return the net's argument ``name`` (``"mask"``, ``"ids"``) of the pass.

        Read from the net's latest call in this thread, restricted to the
        pass's rows.
        """
        value = self._kept.values.get(name)
        if value is not None and result.rows is not None:
            value = value[result.rows.to(value.device)]
        return value

    def token_mask(self, result: Pass, shape: torch.Size) -> Tensor:
        """Return the pass's real tokens, bool ``[B, T]`` (all without ``mask=``)."""
        mask = self.kept("mask", result) if self.mask_arg is not None else None
        if mask is None:
            if self.mask_arg is not None:
                msg = (
                    f"{type(self).__name__}: the net's latest call had no argument "
                    f"{self.mask_arg!r} (mask=); pass the padding mask to the net "
                    "under that name, or drop `mask=`."
                )
                raise ValueError(msg)
            return torch.ones(shape, dtype=torch.bool)
        return mask.reshape(shape) != 0

    def masked_token_scores(self, result: Pass) -> Tensor:
        """Return :meth:`token_scores`, float64, NaN at the padding."""
        scores = self.token_scores(result).to(_F64)
        keep = self.token_mask(result, scores.shape).to(scores.device)
        return scores.masked_fill(~keep, math.nan)

    # -- scoring -------------------------------------------------------------
    def score_pass(self, result: Pass) -> Tensor:
        """Reduce the token scores (``token="each"``), else the detector's score."""
        if not self.token_each:
            return super().score_pass(result)
        return reduce_tokens(self.masked_token_scores(result), self.reduce)

    def score(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the scores ``[batch]``; ``det(batch)`` spreads a mapping batch."""
        if self.token_each:
            args, kwargs = token_arguments(args, kwargs)
        return super().score(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return :meth:`score`."""
        return self.score(*args, **kwargs)

    def score_tokens(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the score of every token, float64 ``[B, T]``, NaN at the padding.

        ``token="each"`` only. One pass of the net, as ``score`` (a padded
        batch gets position ids from its mask; a row with a NaN in what the
        detector reads scores NaN everywhere). ``det.score_tokens(batch)``
        takes one mapping as the net's keyword arguments.
        """
        self.check_token_mode("score_tokens")
        self.check_fitted()
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        empty = empty_batch(args, kwargs)
        if empty is not None:
            return empty.new_empty(0, 0).to(_F64)
        bad = input_rows_non_finite(args, kwargs)
        result = run_pass(
            self.rnet, args, kwargs, outputs=self.outputs(), inputs=self.inputs()
        )
        width = int(result.logits.shape[1])
        return score_finite_rows(
            [result],
            lambda results: self.masked_token_scores(results[0]),
            outputs=self.outputs(),
            inputs=self.inputs(),
            bad_inputs=bad,
            trailing=(width,),
        )

    def check_token_mode(self, what: str) -> None:
        """Refuse ``what`` (a per-token method) without ``token="each"``."""
        if not self.token_each:
            msg = (
                f"{type(self).__name__}.{what} scores every token: build the "
                "detector with `token='each'` (and `mask='attention_mask'`)."
            )
            raise ValueError(msg)

    def calibrate(
        self,
        batches: Iterable[Any],
        alpha: float = 0.05,
        *,
        per: str = "token",
    ) -> float:
        r"""Return a threshold flagging at most ``alpha`` of in-distribution scores.

        Split-conformal (:func:`conformal_threshold`): the
        $\lceil (n + 1)(1 - \alpha) \rceil$-th smallest of the $n$ scores of
        held-out in-distribution ``batches`` (not the fit's), so that a new
        in-distribution score exceeds it with probability at most
        ``alpha``. ``per="token"``: every token's score (the threshold of a
        generation monitor, :meth:`score_tokens`); ``per="row"``: each
        row's reduced score (``det(batch)``). Each batch is a mapping of the
        net's keyword arguments (or a tensor of ids).

        Examples
        --------
        >>> import torch, transformers
        >>> from scio_recorder import Recorder
        >>> from scio_recorder.ood import Surprisal
        >>> config = transformers.GPT2Config(
        ...     n_layer=1, n_embd=8, n_head=2, vocab_size=20
        ... )
        >>> net = transformers.GPT2LMHeadModel(config).eval()
        >>> ids = torch.randint(1, 20, (4, 6))
        >>> rnet = Recorder(net, input_data={"input_ids": ids})
        >>> batches = [{"input_ids": torch.randint(1, 20, (4, 6))} for _ in range(5)]
        >>> thr = Surprisal(rnet).calibrate(batches, alpha=0.2)
        >>> isinstance(thr, float)
        True

        """
        self.check_token_mode("calibrate")
        if per not in _TOKEN_LEVEL:
            msg = f"calibrate: per must be one of {list(_TOKEN_LEVEL)}, got {per!r}"
            raise ValueError(msg)
        check_batches(batches, f"{type(self).__name__}.calibrate")
        found = []
        for batch in batches:
            scores = self.score_tokens(batch) if per == "token" else self(batch)
            found.append(scores.reshape(-1).cpu())
        return conformal_threshold(torch.cat(found), alpha)

    # -- fitting -------------------------------------------------------------
    def fit_tokens(
        self,
        batches: Iterable[Any],
        *,
        target: Any = None,
        device: Any = None,
    ) -> None:
        """Fit on every real token of ``batches`` (``token="each"``).

        Each batch is a mapping of the net's keyword arguments (or a tensor
        of ids). ``target``: ``None`` (one class), or a key of the batch
        holding ``[B, T]`` integer class ids per token (``"labels"``;
        ``"input_ids"`` conditions on the token itself); tokens whose class
        is negative (``-100``, Hugging Face's "ignore") are skipped. A
        target key other than the ids is not passed to the net.
        """
        who = f"{type(self).__name__}.fit"
        check_batches(batches, who)
        if target is not None and not isinstance(target, str):
            msg = (
                f"{who}: with token='each', target must be None (one class) or the "
                f"key of a [B, T] batch entry of class ids per token (e.g. "
                f"'labels', 'input_ids'), got {target!r}"
            )
            raise TypeError(msg)
        self.fit_token_start()
        positions = Positions.of(self.rnet.net)
        for index, batch in enumerate(batches):
            args, kwargs, labels = _split_target(batch, target, who, index)
            if device is not None:
                kwargs = {
                    k: v.to(device) if isinstance(v, Tensor) else v
                    for k, v in kwargs.items()
                }
                args = tuple(a.to(device) if isinstance(a, Tensor) else a for a in args)
            args, kwargs = positions.add(args, kwargs)
            if empty_batch(args, kwargs) is not None:
                continue
            result = run_pass(
                self.rnet, args, kwargs, outputs=self.outputs(), inputs=self.inputs()
            )
            shape = result.logits.shape[:2]
            keep = self.token_mask(result, shape)
            if labels is None:
                labels = torch.zeros(shape, dtype=torch.int64)
            _check_labels(labels, shape, who, index)
            keep &= labels.to(keep.device) >= 0
            self.fit_token_batch(result, keep, labels.to(torch.int64))
        self.fit_token_end()


def _split_target(
    batch: Any, target: str | None, who: str, index: int
) -> tuple[tuple[Any, ...], dict[str, Any], Tensor | None]:
    if isinstance(batch, Tensor):
        args: tuple[Any, ...] = (batch,)
        kwargs: dict[str, Any] = {}
        if target is not None:
            msg = f"{who}: target={target!r} names a key, but batch {index} is a tensor"
            raise TypeError(msg)
        return args, kwargs, None
    if not isinstance(batch, Mapping):
        msg = (
            f"{who}: with token='each', each batch must be a mapping of the net's "
            f"keyword arguments (input_ids, attention_mask, ...), got "
            f"{type(batch).__name__} for batch {index}"
        )
        raise TypeError(msg)
    kwargs = dict(batch)
    if target is None:
        return (), kwargs, None
    if target not in kwargs:
        msg = (
            f"{who}: batch {index} has no key {target!r} (target=); its keys are "
            f"{sorted(kwargs)}"
        )
        raise KeyError(msg)
    labels = kwargs[target] if target == "input_ids" else kwargs.pop(target)
    return (), kwargs, torch.as_tensor(labels)


def _check_labels(labels: Tensor, shape: torch.Size, who: str, index: int) -> None:
    if labels.is_floating_point() or labels.dtype == torch.bool:
        msg = (
            f"{who}: the per-token classes of batch {index} are {labels.dtype}, not "
            "integers: pass integer class ids (e.g. `labels.long()`)."
        )
        raise TypeError(msg)
    if tuple(labels.shape) != tuple(shape):
        msg = (
            f"{who}: batch {index} has tokens {list(shape)} but per-token classes "
            f"of shape {list(labels.shape)}: pass one class id per token, [B, T]."
        )
        raise ValueError(msg)
