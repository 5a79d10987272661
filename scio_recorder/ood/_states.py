r"""The ground floor of the hallucination scores: their base and shared tools.

What :mod:`._eigenscore`, :mod:`._llmcheck`, :mod:`._lookback` and
:mod:`._probe` share (as ``_weights`` for WeiPer, CORE and ORA): the base of
a detector reading a language model's internal states in passes of its own
(:class:`Internal`, and :class:`Pooled` for one pooled token a row), the
kept tokens of a mask, an L2 logistic fit, a probe's logits and an AUROC,
all in float64.
"""

from __future__ import annotations

__all__ = [
    "Internal",
    "Pooled",
    "attention_weights",
    "auroc_of",
    "fit_logistic",
    "keep_mask",
    "mean_log_eig",
    "probe_logits",
]

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from scio_recorder._run.batches import Positions

from ._checks import check_batches, one_label
from ._layers import pool_features
from ._protocol import Detector, Pass, run_pass
from ._tokens import token_arguments

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F64 = torch.float64


def mean_log_eig(z: Tensor, alpha: float) -> Tensor:
    r"""Mean log eigenvalue of $Z J_d Z^\top + \alpha I$ for each ``[..., K, D]``."""
    z = z.to(_F64)
    centred = z - z.mean(dim=-1, keepdim=True)  # Z J_d: J_d idempotent
    gram = centred @ centred.transpose(-1, -2)
    eye = torch.eye(gram.shape[-1], dtype=_F64, device=gram.device)
    values = torch.linalg.eigvalsh(gram + alpha * eye)
    positive = torch.where(values > 0, values, 1e-10)  # as lm-polygraph 0.7.0
    mean: Tensor = positive.log().mean(dim=-1)
    return mean


def keep_mask(
    mask: Tensor | None, shape: Sequence[int], device: torch.device
) -> Tensor:
    if mask is None:
        return torch.ones(*shape, dtype=torch.bool, device=device)
    return mask.to(device).reshape(*shape) != 0


def fit_logistic(  # noqa: PLR0913 (the data, then the optimiser's knobs)
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
        logits = probe_logits(params, x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        ridge = sum((p**2).sum() for k, p in params.items() if k.startswith("w"))
        loss = loss + weight_decay * ridge
        loss.backward()  # type: ignore[no-untyped-call]
        return loss

    with torch.inference_mode(mode=False), torch.enable_grad():
        opt.step(closure)  # type: ignore[no-untyped-call]
    return {k: p.detach() for k, p in params.items()}


def probe_logits(params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    if "w1" in params:
        x = torch.relu(x @ params["w1"] + params["b1"])
    return x @ params["w"] + params["b"]


def auroc_of(scores: Tensor, labels: Tensor) -> float:
    """AUROC of ``scores`` for ``labels == 1`` (ties count half)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if pos.numel() == 0 or neg.numel() == 0:
        msg = "Probe.control: the held-out labels hold a single class"
        raise ValueError(msg)
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).to(_F64) + 0.5 * (diff == 0).to(_F64)).mean())


class Internal(Detector):
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


class Pooled(Internal):
    """Reads one layer's pooled token: the ``"last"`` or the ``"mean"`` real token."""

    EACH_REFUSED: ClassVar[str] = ""
    """Why ``token="each"`` has no reading here, and what to use instead."""
    TOKENS: ClassVar[tuple[str, ...]] = ("last", "mean")
    """The values of ``token=`` the detector takes."""

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        token: str = "last",  # noqa: S107 (not a password)
        mask: str | None = "attention_mask",
    ) -> None:
        super().__init__(rnet, layer, mask=mask)
        if token == "each" and self.EACH_REFUSED:  # noqa: S105 (not a password)
            msg = f"{type(self).__name__}: token='each' {self.EACH_REFUSED}"
            raise ValueError(msg)
        if token not in self.TOKENS:
            taken = " or ".join(repr(t) for t in self.TOKENS)
            msg = f"{type(self).__name__}: token must be {taken}, got {token!r}"
            raise ValueError(msg)
        self.token = token

    def pooled(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Return each row's pooled feature vector ``[B, d]`` in float64."""
        value = self.read(args, kwargs)
        if isinstance(value, tuple | list):
            value = value[0]
        real = self.real(kwargs, value.shape[:2]) if value.dim() == 3 else None  # noqa: PLR2004
        return pool_features(value, token=self.token, mask=real)


def attention_weights(who: str, value: Any) -> Tensor:
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
