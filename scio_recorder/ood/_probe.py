r"""Probes of one layer's token (SAPLMA, semantic-entropy probes), with a control.

:class:`Probe`: a linear or small MLP probe (label 1: hallucinated), and
:meth:`Probe.control`, the same probe fitted on shuffled labels: what a
probe learns from nothing.
"""

from __future__ import annotations

__all__ = ["Probe"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder._run.batches import Positions

from ._saving import StateEntry
from ._states import (
    Pooled,
    auroc_of,
    fit_logistic,
    probe_logits,
)
from ._tokens import check_reduce, reduce_tokens, token_arguments

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from typing_extensions import Self

    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


class Probe(Pooled):
    r"""A linear or one-hidden-layer probe on one layer's token, fitted on labels.

    SAPLMA (Azaria and Mitchell, 2023) and semantic-entropy probes (Kossen
    et al., 2024) read one layer's token (``token="last"``: the last real
    token; ``"mean"``: the mean of the real tokens) and classify it:
    ``hidden=0`` a logistic regression, ``hidden=h`` one ReLU layer of ``h``
    units. The features are standardised with the fit's mean and standard
    deviation; the probe is fitted full-batch (L-BFGS, L2 ``weight_decay``,
    float64, seeded). ``score`` is its logit (label 1: hallucinated).

    ``token="each"``: a probe of every token. ``fit`` reads the labels
    ``[B, T]`` per token under ``target=`` (0/1; negative, e.g. ``-100``,
    and padding skipped), every real token a sample; :meth:`score_tokens`
    gives each token's logit ``[B, T]`` (NaN at the padding; a row scores
    the same alone and in a padded batch) and ``score`` reduces a row by
    ``reduce=`` (:func:`~scio_recorder.ood._tokens.reduce_tokens`).

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
    TOKENS: ClassVar[tuple[str, ...]] = ("last", "mean", "each")

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
        reduce: str | int = "mean",
    ) -> None:
        """Keep the layer and the probe's shape and training."""
        super().__init__(rnet, layer, token=token, mask=mask)
        self.reduce = check_reduce("Probe", reduce)
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
        for index, (args, kwargs, labels) in enumerate(
            self.fit_batches(batches, target)
        ):
            if self.token != "each":  # noqa: S105 (not a password)
                xs.append(self.pooled(args, kwargs))
                ys.append(torch.as_tensor(labels).reshape(-1))
                continue
            value, real = self.token_features(args, kwargs)
            y = torch.as_tensor(labels)
            if tuple(y.shape) != tuple(real.shape):
                msg = (
                    f"Probe.fit with token='each': batch {index} has tokens "
                    f"{list(real.shape)} but labels of shape {list(y.shape)}: pass "
                    "one 0/1 label per token, [B, T] (-100: skip the token)."
                )
                raise ValueError(msg)
            keep = real & (y.to(real.device) >= 0)
            xs.append(value[keep])
            ys.append(y.to(real.device)[keep])
        y = torch.cat(ys)
        if not bool(((y == 0) | (y == 1)).all()):
            msg = "Probe.fit: the labels must be 0 or 1 (1: hallucinated / unknown)"
            raise ValueError(msg)
        return torch.cat(xs), y

    def fit_features(self, x: Tensor, y: Tensor) -> Self:
        """Fit the probe on pooled features ``[N, d]`` and 0/1 labels ``[N]``."""
        mean, std = x.mean(dim=0), x.std(dim=0).clamp(min=1e-12)
        params = fit_logistic(
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
        return probe_logits(p, (x.to(_F64) - p["mean"]) / p["std"])

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the probe's logit of each row, ``[B]`` (reduced per token)."""
        if self.token == "each":  # noqa: S105 (not a password)
            return reduce_tokens(self.token_logits(args, kwargs), self.reduce)
        return self.score_features(self.pooled(args, kwargs))

    # -- per token (token="each") -------------------------------------------
    def token_features(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Tensor, Tensor]:
        """Return every token's features ``[B, T, d]`` (float64) and the real ones."""
        value = self.read(args, kwargs)
        if isinstance(value, tuple | list):
            value = value[0]
        if value.dim() != 3:  # noqa: PLR2004 (a batch of token sequences)
            msg = (
                f"Probe: token='each' reads a [B, T, d] layer, but {self.label} "
                f"gave {list(value.shape)}; pick a layer of token features."
            )
            raise ValueError(msg)
        real = self.real(kwargs, value.shape[:2])
        if real is None:
            real = torch.ones(value.shape[:2], dtype=torch.bool)
        return value.detach().to(_F64), real.to(value.device)

    def token_logits(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return the probe's logit of every token ``[B, T]``, NaN at the padding."""
        value, real = self.token_features(args, kwargs)
        logits = self.score_features(value.reshape(-1, value.shape[2]))
        return logits.reshape(real.shape).masked_fill(~real, math.nan)

    def score_tokens(self, *args: Any, **kwargs: Any) -> Tensor:
        """Return the probe's logit of every token, float64 ``[B, T]``.

        ``token="each"`` only; NaN at the padding. A padded batch gets the
        position ids a row has alone. ``probe.score_tokens(batch)`` takes
        one mapping as the net's keyword arguments.
        """
        if self.token != "each":  # noqa: S105 (not a password)
            msg = (
                "Probe.score_tokens scores every token: build the probe with "
                "`token='each'` and fit it on per-token labels."
            )
            raise ValueError(msg)
        self.check_fitted()
        args, kwargs = token_arguments(args, kwargs)
        args, kwargs = Positions.of(self.rnet.net).add(args, kwargs)
        return self.token_logits(args, kwargs)

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
            controls.append(auroc_of(self.score_features(xt), yt))
        self.fit_features(x, y)
        auroc = auroc_of(self.score_features(xt), yt)
        return {
            "auroc": auroc,
            "control": sum(controls) / len(controls),
            "controls": controls,
        }

    def config(self) -> dict[str, Any]:
        return {
            "layer": list(self.label),
            "token": self.token,
            **({"reduce": self.reduce} if self.token == "each" else {}),  # noqa: S105
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
