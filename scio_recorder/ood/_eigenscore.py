r"""EigenScore (INSIDE, Chen et al., ICLR 2024): the spread of ``K`` sampled answers.

The mean log eigenvalue of the regularised covariance of ``K`` answers'
embeddings in a middle layer (:func:`eigen_score`), with the paper's
optional test-time feature clipping (:class:`EigenScore`). Higher: answers
that disagree, more likely hallucinated.
"""

from __future__ import annotations

__all__ = ["EigenScore", "eigen_score"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder._run.batches import Positions

from ._saving import StateEntry
from ._states import (
    Pooled,
    mean_log_eig,
)
from ._tokens import token_arguments

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


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
    return mean_log_eig(embeddings, alpha)


class EigenScore(Pooled):
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

    EACH_REFUSED: ClassVar[str] = (
        "has no per-token reading: EigenScore scores the spread of K sampled "
        "answers' sentence embeddings (one vector per answer); for a score per "
        "token use Surprisal, or Mahalanobis/DkNN/JTLA with token='each'."
    )

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
