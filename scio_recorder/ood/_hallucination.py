r"""Hallucination scores of language models from their internal states.

* :class:`EigenScore` (INSIDE, Chen et al., ICLR 2024): the spread of ``K``
  sampled answers to one question in a middle layer, the mean log
  eigenvalue of their regularised feature covariance
  (:func:`eigen_score`), with the paper's optional test-time feature
  clipping;
* :class:`HiddenScore` and :class:`AttentionScore` (LLM-Check,
  Sriramanan et al., NeurIPS 2024): one answer's hidden-state matrix
  (:func:`hidden_score`) or attention kernel (:func:`attention_score`);
* :class:`LookbackRatio` (Lookback Lens, Chuang et al., EMNLP 2024): the
  share of each head's attention on the context at each generated token
  (:func:`lookback_ratios`), features of a fitted logistic classifier;
* :class:`Probe`: a linear or small MLP probe on one layer's token
  (SAPLMA, semantic-entropy probes), with a label-shuffle control
  (:meth:`Probe.control`).

Each is a :class:`~scio_recorder.ood.Detector` (fit, score, save and load,
``evaluate``) whose passes are its own; a batch is given as the net's
keyword arguments or as one mapping (``det(batch)``), and the keys a
detector reads besides the net's (``context=`` of :class:`LookbackRatio`)
are taken out of it before the net is called. All scores are computed in
float64. Higher is more likely hallucinated for :class:`EigenScore` (answers
that disagree), and for the fitted :class:`LookbackRatio` and
:class:`Probe` (label 1: hallucinated); LLM-Check's two scores are given
as the paper writes them (their direction is the data's to tell: rate it
with ``evaluate``; lm-polygraph's normalisation of the attention score
negates it).
"""

from __future__ import annotations

__all__ = [
    "AttentionScore",
    "EigenScore",
    "HiddenScore",
    "LookbackRatio",
    "Probe",
    "attention_score",
    "eigen_score",
    "hidden_score",
    "lookback_ratios",
]

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._run.batches import Positions

from ._checks import check_batches, one_label
from ._layers import pool_features
from ._protocol import Detector, Pass, run_pass
from ._saving import StateEntry
from ._tokens import token_arguments

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64
NORMALISATIONS = ("paper", "polygraph")
"""The normalisations of :func:`attention_score`."""


def _mean_log_eig(z: Tensor, alpha: float) -> Tensor:
    r"""Mean log eigenvalue of $Z J_d Z^\top + \alpha I$ for each ``[..., K, D]``."""
    z = z.to(_F64)
    centred = z - z.mean(dim=-1, keepdim=True)  # Z J_d: J_d idempotent
    gram = centred @ centred.transpose(-1, -2)
    eye = torch.eye(gram.shape[-1], dtype=_F64, device=gram.device)
    values = torch.linalg.eigvalsh(gram + alpha * eye)
    positive = torch.where(values > 0, values, 1e-10)  # as lm-polygraph 0.7.0
    mean: Tensor = positive.log().mean(dim=-1)
    return mean


def eigen_score(embeddings: Tensor, alpha: float = 1e-3) -> Tensor:
    r"""Return INSIDE's EigenScore of ``K`` answers' embeddings, ``[N]``.

    For one question, $Z \in \mathbb{R}^{K \times d}$ holds the sentence
    embeddings of its ``K`` sampled answers (a row each);
    $\Sigma = Z J_d Z^\top$ with $J_d = I_d - \frac1d \mathbf{1}\mathbf{1}^\top$
    (each embedding centred over its $d$ features, the paper's Eq. 4), and

    .. math:: \mathrm{EigenScore} = \frac1K \log\det(\Sigma + \alpha I_K)
              = \frac1K \sum_{i=1}^K \log \lambda_i ,

    a non-positive eigenvalue replaced by ``1e-10`` (as lm-polygraph 0.7.0).
    Answers that agree (a known fact) span little: a low score.

    Parameters
    ----------
    embeddings : Tensor
        ``[N, K, d]`` (``N`` questions) or ``[K, d]``.
    alpha : float, default 1e-3
        The ridge $\alpha$.

    Returns
    -------
    Tensor
        ``[N]`` (``[]`` for one question), float64.

    Examples
    --------
    >>> import torch
    >>> same = torch.ones(4, 8) * torch.arange(8.0)  # four identical answers
    >>> spread = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    >>> bool(eigen_score(same) < eigen_score(spread))
    True

    """
    if embeddings.dim() not in {2, 3}:
        msg = (
            f"eigen_score takes [N, K, d] or [K, d] embeddings, got "
            f"{list(embeddings.shape)}"
        )
        raise ValueError(msg)
    return _mean_log_eig(embeddings, alpha)


def hidden_score(
    hidden: Tensor, mask: Tensor | None = None, alpha: float = 1e-3
) -> Tensor:
    r"""Return LLM-Check's hidden score of each row's hidden states, ``[B]``.

    For a row's real tokens $H \in \mathbb{R}^{m \times d}$ at one layer,
    $\Sigma = H J_d H^\top + \alpha I_m$ (the reference code's
    ``centered_svd_val``: the features centred, then the ``m x m`` Gram
    matrix) and the score is the mean log singular value (here: eigenvalue,
    $\Sigma$ is symmetric positive definite) of $\Sigma$,
    $\frac1m \log\det\Sigma$: the paper's normalisation, the log-determinant
    divided by the number of tokens (it equals $\frac2m \sum_i \log
    \sigma_i(J_d H^\top)$ but for $\alpha$). The same formula as
    :func:`eigen_score`, over one answer's tokens instead of ``K`` answers.

    Parameters
    ----------
    hidden : Tensor
        ``[B, T, d]``.
    mask : Tensor, optional
        ``[B, T]``, nonzero at the tokens to take (the answer's real
        tokens); default every token.
    alpha : float, default 1e-3
        The ridge.

    Examples
    --------
    >>> import torch
    >>> h = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    >>> hidden_score(h).shape
    torch.Size([2])

    """
    if hidden.dim() != 3:  # noqa: PLR2004 ([B, T, d])
        msg = f"hidden_score takes [B, T, d] hidden states, got {list(hidden.shape)}"
        raise ValueError(msg)
    keep = _keep(mask, hidden.shape[:2], hidden.device)
    out = torch.full(hidden.shape[:1], math.nan, dtype=_F64, device=hidden.device)
    for row in range(hidden.shape[0]):
        if bool(keep[row].any()):
            out[row] = _mean_log_eig(hidden[row][keep[row]], alpha)
    return out


def attention_score(
    weights: Tensor, mask: Tensor | None = None, *, normalisation: str = "paper"
) -> Tensor:
    r"""Return LLM-Check's attention score of each row's attention kernels, ``[B]``.

    A head's causal attention kernel $A^h$ (over a row's ``m`` real tokens)
    is lower triangular: $\log\det A^h = \sum_t \log A^h_{tt}$. Two
    normalisations, which rank rows differently (rows of different lengths):

    * ``"paper"``: $\sum_h \frac1m \log\det A^h$, the mean log diagonal of
      each head summed over the ``H`` heads (LLM-Check's
      ``get_attn_eig_prod``);
    * ``"polygraph"``: $-\frac1H \sum_h \log\det A^h$, the whole log
      diagonal of each head averaged over the heads and negated
      (lm-polygraph 0.7.0's ``AttentionScore``, ``gen_only=False``, without
      its ``1e-12`` inside the log).

    Parameters
    ----------
    weights : Tensor
        ``[B, H, T, T]`` (one layer's attention weights).
    mask : Tensor, optional
        ``[B, T]``, nonzero at the tokens to take; default every token.
    normalisation : {"paper", "polygraph"}, default "paper"

    Examples
    --------
    >>> import torch
    >>> a = torch.tril(torch.ones(1, 2, 3, 3))
    >>> a = a / a.sum(-1, keepdim=True)  # each head: diagonal 1, 1/2, 1/3
    >>> round(float(attention_score(a)), 6)  # 2 * (log 1 + log 1/2 + log 1/3) / 3
    -1.194506
    >>> round(float(attention_score(a, normalisation="polygraph")), 6)  # log 6
    1.791759

    """
    if weights.dim() != 4:  # noqa: PLR2004 ([B, H, T, T])
        msg = f"attention_score takes [B, H, T, T] weights, got {list(weights.shape)}"
        raise ValueError(msg)
    if normalisation not in NORMALISATIONS:
        msg = (
            f"attention_score: normalisation must be one of {list(NORMALISATIONS)}, "
            f"got {normalisation!r}"
        )
        raise ValueError(msg)
    keep = _keep(mask, (weights.shape[0], weights.shape[2]), weights.device)
    diag = weights.to(_F64).diagonal(dim1=-2, dim2=-1).log()  # [B, H, T]
    count = keep.sum(dim=1)
    logdet = diag.masked_fill(~keep[:, None], 0).sum(dim=-1)  # [B, H]
    if normalisation == "paper":
        out = (logdet / count.clamp(min=1)[:, None]).sum(dim=1)
    else:
        out = -logdet.mean(dim=1)
    return torch.where(count > 0, out, math.nan)


def lookback_ratios(
    weights: Tensor, context: Tensor, real: Tensor | None = None
) -> Tensor:
    r"""Return each head's lookback ratio at each generated token, ``[B, T, H]``.

    At a new (non-context) token $t$ as a query, head $h$'s mean attention
    on the context tokens $A^{ctx}$ and on the new tokens up to and
    including $t$, $A^{new}$, give
    $\mathrm{LR}_t^h = A^{ctx} / (A^{ctx} + A^{new})$ (Lookback Lens, Eq.
    1): the step that fed token $t$ with the KV cache on. NaN at the
    context, the padding, and a row without context.

    Parameters
    ----------
    weights : Tensor
        ``[B, H, T, T]``, one layer's attention weights.
    context : Tensor
        ``[B, T]`` bool, True at the context (prompt) tokens.
    real : Tensor, optional
        ``[B, T]``, nonzero at the real tokens; default all.

    Examples
    --------
    >>> import torch
    >>> w = torch.tril(torch.ones(1, 1, 3, 3))
    >>> w = w / w.sum(-1, keepdim=True)
    >>> ctx = torch.tensor([[True, False, False]])
    >>> lookback_ratios(w, ctx)[0, :, 0].tolist()  # t=2: (1/3) / (1/3 + 1/3)
    [nan, 0.5, 0.5]

    """
    batch, _, width, _ = weights.shape
    keep = _keep(real, (batch, width), weights.device)
    ctx = context.to(weights.device).bool() & keep
    new = ~context.to(weights.device).bool() & keep
    w = weights.to(_F64)  # [B, H, Tq, Tk]
    causal = torch.ones(width, width, dtype=torch.bool, device=w.device).tril()
    on_ctx = (w * ctx[:, None, None, :]).sum(-1) / ctx.sum(-1).clamp(min=1)[
        :, None, None
    ]
    new_keys = new[:, None, :] & causal[None]  # [B, Tq, Tk]
    on_new = (w * new_keys[:, None]).sum(-1) / new_keys.sum(-1).clamp(min=1)[:, None]
    ratio = (on_ctx / (on_ctx + on_new)).transpose(1, 2)  # [B, T, H]
    steps = new & ctx.any(dim=1, keepdim=True)
    return ratio.masked_fill(~steps[..., None], math.nan)


def _keep(mask: Tensor | None, shape: Sequence[int], device: torch.device) -> Tensor:
    if mask is None:
        return torch.ones(*shape, dtype=torch.bool, device=device)
    return mask.to(device).reshape(*shape) != 0


def _fit_logistic(  # noqa: PLR0913 (the data, then the optimiser's knobs)
    x: Tensor,
    y: Tensor,
    *,
    hidden: int,
    weight_decay: float,
    steps: int,
    seed: int,
) -> dict[str, Tensor]:
    """Fit a logistic (``hidden=0``) or one-hidden-layer probe, float64, full batch."""
    gen = torch.Generator().manual_seed(seed)
    d = x.shape[1]
    params: dict[str, Tensor] = {}
    if hidden:
        params["w1"] = torch.randn(d, hidden, generator=gen, dtype=_F64) / math.sqrt(d)
        params["b1"] = torch.zeros(hidden, dtype=_F64)
        params["w"] = torch.randn(hidden, generator=gen, dtype=_F64) / math.sqrt(hidden)
    else:
        params["w"] = torch.zeros(d, dtype=_F64)
    params["b"] = torch.zeros((), dtype=_F64)
    for p in params.values():
        p.requires_grad_(True)  # noqa: FBT003 (torch's API)
    opt = torch.optim.LBFGS(
        list(params.values()), max_iter=steps, line_search_fn="strong_wolfe"
    )
    target = y.to(_F64)

    def closure() -> Tensor:
        opt.zero_grad()
        logits = _probe_logits(params, x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        ridge = sum((p**2).sum() for k, p in params.items() if k.startswith("w"))
        loss = loss + weight_decay * ridge
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    with torch.inference_mode(mode=False), torch.enable_grad():
        opt.step(closure)  # type: ignore[no-untyped-call]
    return {k: p.detach() for k, p in params.items()}


def _probe_logits(params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    if "w1" in params:
        x = torch.relu(x @ params["w1"] + params["b1"])
    return x @ params["w"] + params["b"]


def _auroc(scores: Tensor, labels: Tensor) -> float:
    """AUROC of ``scores`` for ``labels == 1`` (ties count half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if pos.numel() == 0 or neg.numel() == 0:
        msg = "Probe.control: the held-out labels hold a single class"
        raise ValueError(msg)
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).to(_F64) + 0.5 * (diff == 0).to(_F64)).mean())


class _Internal(Detector):
    """A detector of language models reading its layers in passes of its own.

    ``score(batch)`` or ``score(**batch)``; the keys of :attr:`extra_keys`
    are taken out of the batch before the net is called. ``fit`` iterates
    mapping batches, ``target=`` naming the key of the labels.
    """

    own_passes = True
    extra_keys: tuple[str, ...] = ()

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        mask: str | None = "attention_mask",
    ) -> None:
        super().__init__(rnet, layer=layer)
        self.label: DepthIdx = one_label(rnet, layer, type(self).__name__)
        self.mask_arg = mask

    def layers_read(self) -> list[tuple[DepthIdx, str]]:
        return [(self.label, "output")]

    def score(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the scores of a batch (the net's keyword arguments, or a mapping)."""
        args, kwargs = token_arguments(args, kwargs)
        return super().score(*args, **kwargs)

    __call__ = score

    def score_alone(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Pass | None]:
        """Score one batch (a mapping spread into the net's keyword arguments)."""
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return super().score_alone(args, kwargs)

    def split(self, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Return the net's arguments and the detector's own keys of a batch."""
        net = {k: v for k, v in kwargs.items() if k not in self.extra_keys}
        own = {k: kwargs[k] for k in self.extra_keys if k in kwargs}
        return net, own

    def read(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the layer's output in one pass of the detector's own."""
        result = run_pass(self.rnet, args, kwargs, outputs=[self.label])
        return result.outputs[self.label]  # type: ignore[no-any-return]

    def real(self, kwargs: Mapping[str, Any], shape: Sequence[int]) -> Tensor | None:
        """Return the batch's padding mask ``[B, T]`` (None: every token real)."""
        mask = kwargs.get(self.mask_arg) if self.mask_arg is not None else None
        return None if mask is None else torch.as_tensor(mask).reshape(*shape) != 0

    def fit_batches(
        self, batches: Iterable[Any], target: str | None
    ) -> Iterable[tuple[tuple[Any, ...], dict[str, Any], Any]]:
        """Yield each fit batch's net arguments (with positions) and its labels."""
        name = type(self).__name__
        check_batches(batches, f"{name}.fit")
        positions = Positions.of(self.rnet.net)
        for batch in batches:
            if not isinstance(batch, Mapping):
                msg = (
                    f"{name}.fit takes batches that are mappings (the net's keyword "
                    f"arguments, and the labels under `target`), got "
                    f"{type(batch).__name__}"
                )
                raise TypeError(msg)
            kwargs = dict(batch)
            labels = kwargs.pop(target, None) if target is not None else None
            if target is not None and labels is None:
                msg = f"{name}.fit: a batch has no key {target!r} (the labels)"
                raise KeyError(msg)
            args, kwargs = positions.add((), kwargs)
            yield args, kwargs, labels


class _Pooled(_Internal):
    """Reads one layer's pooled token: the ``"last"`` or the ``"mean"`` real token."""

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        token: str = "last",  # noqa: S107 (not a password)
        mask: str | None = "attention_mask",
    ) -> None:
        super().__init__(rnet, layer, mask=mask)
        if token not in {"last", "mean"}:
            msg = (
                f"{type(self).__name__}: token must be 'last' or 'mean', got {token!r}"
            )
            raise ValueError(msg)
        self.token = token

    def pooled(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return each row's pooled feature vector ``[B, d]`` in float64."""
        value = self.read(args, kwargs)
        if isinstance(value, tuple | list):
            value = value[0]
        real = self.real(kwargs, value.shape[:2]) if value.dim() == 3 else None  # noqa: PLR2004
        return pool_features(value, token=self.token, mask=real)


class EigenScore(_Pooled):
    r"""INSIDE's EigenScore of ``K`` sampled answers to each question.

    A batch holds ``N * samples`` rows: the ``samples`` answers to each
    question, consecutive. Each answer's sentence embedding is its
    ``token`` (``"last"`` real token, the paper's choice, or ``"mean"``)
    at ``layer`` (the paper reads a middle layer), and ``score`` gives
    :func:`eigen_score` of each question's ``K x d`` embeddings, ``[N]``.

    Test-time feature clipping (the paper's section 3.2): with ``clip=p``,
    :meth:`fit` takes the per-neuron ``p`` and ``1 - p`` quantiles of the
    layer's activations over every real token of in-distribution batches
    (the paper's memory bank of token embeddings; ``p = 0.002`` is its 0.2 %)
    and scoring clamps each neuron of the embeddings to them. Where this
    differs from the paper: it clips activations inside the model (a later
    layer's) while the ``K`` answers are sampled, so that the clipping
    changes the answers themselves; here the answers are given, and the
    clipping applies to the features read. Without ``clip`` no fit is needed.

    Parameters
    ----------
    rnet : Recorder
        A language model.
    layer : selector
        The layer whose output (or first output) ``[B, T, d]`` is read.
    samples : int
        ``K``, the answers per question.
    alpha : float, default 1e-3
    token : {"last", "mean"}, default "last"
    clip : float, optional
        The clipping quantile ``p`` in ``(0, 0.5)``.
    mask : str, optional, default "attention_mask"
        The net's argument holding the padding mask.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=20)
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (6, 5))  # 2 questions x 3 answers
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> EigenScore(rnet, "transformer.h.0", samples=3)(input_ids=ids).shape
    torch.Size([2])

    """

    def __init__(  # noqa: PLR0913 (the layer, then keyword-only options)
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        samples: int,
        alpha: float = 1e-3,
        token: str = "last",  # noqa: S107 (not a password)
        clip: float | None = None,
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the layer, ``K`` and the options."""
        super().__init__(rnet, layer, token=token, mask=mask)
        if not (isinstance(samples, int) and samples >= 2):  # noqa: PLR2004
            msg = f"EigenScore: samples (K) must be an int >= 2, got {samples!r}"
            raise ValueError(msg)
        if clip is not None and not 0 < clip < 0.5:  # noqa: PLR2004
            msg = f"EigenScore: clip must lie in (0, 0.5) (e.g. 0.002), got {clip!r}"
            raise ValueError(msg)
        self.samples, self.alpha, self.clip = samples, float(alpha), clip
        self.needs_fit = clip is not None  # type: ignore[misc]
        self._fitted = not self.needs_fit
        self.low: Tensor | None = None
        self.high: Tensor | None = None

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = None,  # noqa: A002, ARG002 (the protocol's name; mappings only)
        target: Any = None,  # noqa: ARG002 (no labels)
        **options: Any,  # noqa: ARG002 (the protocol's signature)
    ) -> Self:
        """Fit the clipping quantiles on every real token of ``batches`` (mappings)."""
        if self.clip is None:
            self._fitted = True
            return self
        bank = []
        for args, kwargs, _ in self.fit_batches(batches, None):
            value = self.read(args, kwargs)
            value = value[0] if isinstance(value, tuple | list) else value
            real = self.real(kwargs, value.shape[:2])
            flat = value.detach().to(_F64)
            bank.append(
                flat.reshape(-1, flat.shape[-1]) if real is None else flat[real]
            )
        tokens = torch.cat(bank)
        self.low = torch.quantile(tokens, self.clip, dim=0)
        self.high = torch.quantile(tokens, 1 - self.clip, dim=0)
        self._fitted = True
        return self

    def embeddings(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the (clipped) embeddings ``[N, K, d]`` of a batch of answers."""
        args, kwargs = token_arguments(args, kwargs)
        self.check_fitted()
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return self._embeddings(args, kwargs)

    def _embeddings(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        emb = self.pooled(args, kwargs)
        if emb.shape[0] % self.samples:
            msg = (
                f"EigenScore: a batch holds N * samples rows (samples={self.samples} "
                f"answers per question, consecutive), got {emb.shape[0]} rows"
            )
            raise ValueError(msg)
        if self.low is not None and self.high is not None:
            emb = torch.minimum(torch.maximum(emb, self.low), self.high)
        return emb.reshape(-1, self.samples, emb.shape[-1])

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return :func:`eigen_score` of each question's answers, ``[N]``."""
        return eigen_score(self._embeddings(args, kwargs), self.alpha)

    def config(self) -> dict[str, Any]:
        return {
            "layer": list(self.label),
            "samples": self.samples,
            "alpha": self.alpha,
            "token": self.token,
            "clip": self.clip,
        }

    def state(self) -> dict[str, Tensor]:
        if self.low is None or self.high is None:
            return {}
        return {"low": self.low, "high": self.high}

    def state_entries(self) -> dict[str, StateEntry]:
        if self.clip is None:
            return {}
        return {"low": StateEntry((None,), _F64), "high": StateEntry((None,), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        if self.clip is not None:
            self.low, self.high = state["low"], state["high"]


class HiddenScore(_Internal):
    r"""LLM-Check's hidden score: :func:`hidden_score` of each row's real tokens.

    Reads ``layer``'s output ``[B, T, d]`` (its first output for a block
    returning a tuple); ``span="all"`` takes every real token, an int ``s``
    the real tokens from the row's ``s``-th on (the answer after a prompt of
    ``s`` tokens, as the reference code's ``tok_lens``). No fitting. The
    normalisation is the paper's (:func:`hidden_score`); higher: more
    likely hallucinated.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=20)
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (3, 5))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> HiddenScore(rnet, "transformer.h.1")(input_ids=ids).shape
    torch.Size([3])

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        alpha: float = 1e-3,
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the layer and the ridge."""
        super().__init__(rnet, layer, mask=mask)
        self.alpha = float(alpha)

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return :func:`hidden_score` of each row, ``[B]``."""
        value = self.read(args, kwargs)
        value = value[0] if isinstance(value, tuple | list) else value
        return hidden_score(value, self.real(kwargs, value.shape[:2]), self.alpha)

    def config(self) -> dict[str, Any]:
        return {"layer": list(self.label), "alpha": self.alpha}


def _weights(who: str, value: Any) -> Tensor:
    """Return the attention weights (the second output) of an attention module."""
    weights = value[1] if isinstance(value, tuple | list) and len(value) > 1 else None
    if not isinstance(weights, Tensor) or weights.dim() != 4:  # noqa: PLR2004
        msg = (
            f"{who} reads an attention module's weights [B, H, T, T] (its second "
            "output): name the attention module (e.g. 'transformer.h.0.attn') and "
            'load the model with `attn_implementation="eager"`, whose attention '
            "returns its weights."
        )
        raise ValueError(msg)
    return weights


class AttentionScore(_Internal):
    r"""LLM-Check's attention score: :func:`attention_score` of one attention module.

    ``layer`` names an attention module of a model with eager attention
    (``attn_implementation="eager"``), whose second output is its weights.
    ``normalisation="paper"`` is the paper's, ``"polygraph"``
    lm-polygraph 0.7.0's (:func:`attention_score`). No fitting.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(
    ...     n_layer=1, n_embd=8, n_head=2, vocab_size=20, attn_implementation="eager"
    ... )
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (3, 5))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> AttentionScore(rnet, "transformer.h.0.attn")(input_ids=ids).shape
    torch.Size([3])

    """

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        normalisation: str = "paper",
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the attention module and the normalisation."""
        super().__init__(rnet, layer, mask=mask)
        if normalisation not in NORMALISATIONS:
            msg = (
                f"AttentionScore: normalisation must be one of "
                f"{list(NORMALISATIONS)}, got {normalisation!r}"
            )
            raise ValueError(msg)
        self.normalisation = normalisation

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return :func:`attention_score` of each row, ``[B]``."""
        weights = _weights("AttentionScore", self.read(args, kwargs))
        real = self.real(kwargs, (weights.shape[0], weights.shape[2]))
        return attention_score(weights, real, normalisation=self.normalisation)

    def config(self) -> dict[str, Any]:
        return {"layer": list(self.label), "normalisation": self.normalisation}


class LookbackRatio(_Internal):
    r"""Lookback Lens: each head's lookback ratio per generated token, and a classifier.

    ``layers`` are attention modules of a model with eager attention.
    :meth:`ratios` gives :func:`lookback_ratios` of every head of every
    layer, ``[B, T, L * H]``, NaN but at the new tokens; the batch holds,
    under ``context=``, the number of context (prompt) tokens of each row
    ``[B]`` (counted among its real tokens: a left-padded row counts from
    its first real token). :meth:`features` averages a row's steps (the
    paper's span features), and :meth:`fit` fits a logistic classifier
    (L2, float64) on them with labels under ``target`` (1: hallucinated);
    ``score`` is its logit.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(
    ...     n_layer=2, n_embd=8, n_head=2, vocab_size=20, attn_implementation="eager"
    ... )
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (4, 6))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> lr = LookbackRatio(rnet, ["transformer.h.0.attn", "transformer.h.1.attn"])
    >>> batch = {"input_ids": ids, "context": torch.tensor([3, 3, 4, 2])}
    >>> lr.ratios(batch).shape
    torch.Size([4, 6, 4])
    >>> _ = lr.fit([dict(batch, label=torch.tensor([0, 1, 0, 1]))], target="label")
    >>> lr(batch).shape
    torch.Size([4])

    """

    needs_fit = True

    def __init__(
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        context: str = "context",
        weight_decay: float = 1e-3,
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the attention modules, the context key and the ridge."""
        if isinstance(layers, str) or not layers:
            msg = f"LookbackRatio: layers must be a non-empty list, got {layers!r}"
            raise ValueError(msg)
        super().__init__(rnet, layers[0], mask=mask)
        self.labels = [one_label(rnet, layer, "LookbackRatio") for layer in layers]
        self.context, self.weight_decay = context, float(weight_decay)
        self.extra_keys = (context,)
        self.params: dict[str, Tensor] = {}

    def layers_read(self) -> list[tuple[DepthIdx, str]]:
        return [(label, "output") for label in self.labels]

    def _ratios(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        net, own = self.split(kwargs)
        if self.context not in own:
            msg = (
                f"LookbackRatio: the batch has no key {self.context!r}, the number "
                "of context (prompt) tokens of each row [B]"
            )
            raise KeyError(msg)
        result = run_pass(self.rnet, args, net, outputs=self.labels)
        out = []
        for label in self.labels:
            weights = _weights("LookbackRatio", result.outputs[label])
            batch, _, width, _ = weights.shape
            real = self.real(net, (batch, width))
            keep = torch.ones(batch, width, dtype=torch.bool) if real is None else real
            rank = keep.cumsum(dim=1)  # 1 at a row's first real token
            counts = torch.as_tensor(own[self.context]).reshape(-1, 1)
            ctx = keep & (rank <= counts)
            out.append(lookback_ratios(weights, ctx, keep))
        return torch.cat(out, dim=-1)

    def ratios(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the lookback ratios ``[B, T, L * H]`` (layer-major), NaN off steps."""
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return self._ratios(args, kwargs)

    def _features(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        return self._ratios(args, kwargs).nanmean(dim=1)

    def features(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return each row's lookback ratios averaged over its steps, ``[B, L * H]``."""
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return self._features(args, kwargs)

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = None,  # noqa: A002, ARG002 (the protocol's name; mappings only)
        target: Any = "label",
        **options: Any,  # noqa: ARG002 (the protocol's signature)
    ) -> Self:
        """Fit the logistic classifier on the features of labelled batches."""
        xs, ys = [], []
        for args, kwargs, labels in self.fit_batches(batches, target):
            xs.append(self._features(args, kwargs))
            ys.append(torch.as_tensor(labels).reshape(-1))
        self.params = _fit_logistic(
            torch.cat(xs), torch.cat(ys), hidden=0, weight_decay=self.weight_decay,
            steps=200, seed=0,
        )  # fmt: skip
        self._fitted = True
        return self

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the classifier's logit of each row, ``[B]``."""
        return _probe_logits(self.params, self._features(args, kwargs))

    def config(self) -> dict[str, Any]:
        return {
            "layers": [list(label) for label in self.labels],
            "context": self.context,
            "weight_decay": self.weight_decay,
        }

    def state(self) -> dict[str, Tensor]:
        return dict(self.params)

    def state_entries(self) -> dict[str, StateEntry]:
        return {"w": StateEntry((None,), _F64), "b": StateEntry((), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.params = dict(state)


class Probe(_Pooled):
    r"""A linear or one-hidden-layer probe on one layer's token, fitted on labels.

    SAPLMA (Azaria and Mitchell, 2023) and semantic-entropy probes (Kossen
    et al., 2024) read one layer's token (``token="last"``: the last real
    token; ``"mean"``: the mean of the real tokens) and classify it:
    ``hidden=0`` a logistic regression, ``hidden=h`` one ReLU layer of ``h``
    units. The features are standardised with the fit's mean and standard
    deviation; the probe is fitted full-batch (L-BFGS, L2 ``weight_decay``,
    float64, seeded). ``score`` is its logit (label 1: hallucinated).

    :meth:`control` says what a probe of this configuration learns from
    nothing: its held-out AUROC after fitting on shuffled labels, averaged
    over ``shuffles`` shuffles (one shuffle alone is noisy).

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=20)
    >>> net = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 20, (8, 5))
    >>> rnet = Recorder(net, input_data={"input_ids": ids})
    >>> batch = {"input_ids": ids, "label": torch.arange(8) % 2}
    >>> probe = Probe(rnet, "transformer.h.1").fit([batch], target="label")
    >>> probe(input_ids=ids).shape
    torch.Size([8])

    """

    needs_fit = True

    def __init__(  # noqa: PLR0913 (the layer, then keyword-only options)
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        token: str = "last",  # noqa: S107 (not a password)
        hidden: int = 0,
        weight_decay: float = 1e-3,
        steps: int = 200,
        seed: int = 0,
        mask: str | None = "attention_mask",
    ) -> None:
        """Keep the layer and the probe's shape and training."""
        super().__init__(rnet, layer, token=token, mask=mask)
        if not (isinstance(hidden, int) and hidden >= 0):
            msg = f"Probe: hidden must be an int >= 0 (0: linear), got {hidden!r}"
            raise ValueError(msg)
        self.hidden, self.weight_decay = hidden, float(weight_decay)
        self.steps, self.seed = int(steps), int(seed)
        self.params: dict[str, Tensor] = {}

    def pooled_batches(
        self, batches: Iterable[Any], target: str
    ) -> tuple[Tensor, Tensor]:
        """Return the pooled features ``[N, d]`` and the labels ``[N]`` of batches."""
        xs, ys = [], []
        for args, kwargs, labels in self.fit_batches(batches, target):
            xs.append(self.pooled(args, kwargs))
            ys.append(torch.as_tensor(labels).reshape(-1))
        y = torch.cat(ys)
        if not bool(((y == 0) | (y == 1)).all()):
            msg = "Probe.fit: the labels must be 0 or 1 (1: hallucinated / unknown)"
            raise ValueError(msg)
        return torch.cat(xs), y

    def fit_features(self, x: Tensor, y: Tensor) -> Self:
        """Fit the probe on pooled features ``[N, d]`` and 0/1 labels ``[N]``."""
        mean, std = x.mean(dim=0), x.std(dim=0).clamp(min=1e-12)
        params = _fit_logistic(
            (x - mean) / std, y, hidden=self.hidden, weight_decay=self.weight_decay,
            steps=self.steps, seed=self.seed,
        )  # fmt: skip
        self.params = {"mean": mean, "std": std, **params}
        self._fitted = True
        return self

    def fit(
        self,
        batches: Iterable[Any],
        *,
        input: Any = None,  # noqa: A002, ARG002 (the protocol's name; mappings only)
        target: Any = "label",
        **options: Any,  # noqa: ARG002 (the protocol's signature)
    ) -> Self:
        """Fit on labelled batches (mappings; the 0/1 labels under ``target``)."""
        return self.fit_features(*self.pooled_batches(batches, target))

    def score_features(self, x: Tensor) -> Tensor:
        """Return the probe's logits of pooled features ``[N, d]``."""
        self.check_fitted()
        p = self.params
        return _probe_logits(p, (x.to(_F64) - p["mean"]) / p["std"])

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the probe's logit of each row, ``[B]``."""
        return self.score_features(self.pooled(args, kwargs))

    def control(
        self,
        train: Iterable[Any],
        test: Iterable[Any],
        *,
        target: str = "label",
        shuffles: int = 5,
    ) -> dict[str, Any]:
        """Return the held-out AUROC of the probe and of its label-shuffle control.

        Fits a probe of this configuration on ``train`` (this one: it is
        left fitted on the true labels), and ``shuffles`` others on
        ``train`` with its labels permuted (seeds ``0 .. shuffles - 1``);
        each is rated by its AUROC on ``test``'s true labels.

        Returns
        -------
        dict
            ``"auroc"`` (the probe), ``"control"`` (the mean over the
            shuffles) and ``"controls"`` (each shuffle's).
        """
        x, y = self.pooled_batches(train, target)
        xt, yt = self.pooled_batches(test, target)
        controls = []
        for i in range(shuffles):
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(i))
            self.fit_features(x, y[perm])
            controls.append(_auroc(self.score_features(xt), yt))
        self.fit_features(x, y)
        auroc = _auroc(self.score_features(xt), yt)
        return {
            "auroc": auroc,
            "control": sum(controls) / len(controls),
            "controls": controls,
        }

    def config(self) -> dict[str, Any]:
        return {
            "layer": list(self.label),
            "token": self.token,
            "hidden": self.hidden,
            "weight_decay": self.weight_decay,
            "steps": self.steps,
            "seed": self.seed,
        }

    def state(self) -> dict[str, Tensor]:
        return dict(self.params)

    def state_entries(self) -> dict[str, StateEntry]:
        entries = {
            "mean": StateEntry(("features",), _F64),
            "std": StateEntry(("features",), _F64),
            "b": StateEntry((), _F64),
        }
        if self.hidden:
            entries["w1"] = StateEntry(("features", self.hidden), _F64)
            entries["b1"] = StateEntry((self.hidden,), _F64)
            entries["w"] = StateEntry((self.hidden,), _F64)
        else:
            entries["w"] = StateEntry(("features",), _F64)
        return entries

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.params = dict(state)
