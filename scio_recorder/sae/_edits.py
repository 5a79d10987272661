"""Edits of latents: :func:`zero`, :func:`scale`, :func:`set_to`, :func:`clamp`.

An edit is any ``edit(latents) -> latents or None`` (``None``: changed in
place); :func:`~scio_recorder.sae.splice` hands it a copy of the latents
``[..., d_sae]`` of each pass, so the latents :attr:`Splice.latents` shows
stay those ``encode`` gave. These four make the common ones, each on a few
features (latent indices), at every token: ablate (``zero``), amplify or
damp (``scale``), pin (``set_to``, e.g. to steer: "clamp feature 12 to
10"), bound (``clamp``). For positions, thresholds or anything else, write
the function.
"""

from __future__ import annotations

__all__ = ["Edit", "clamp", "scale", "set_to", "zero"]

import dataclasses
import operator
from collections.abc import Iterable
from typing import Any

from torch import Tensor


def _features(features: object) -> tuple[int, ...]:
    """Return ``features`` (an int, ints, a 1-D tensor of ints) as a tuple, checked."""
    if isinstance(features, Tensor):
        if features.dim() > 1 or features.is_floating_point():
            msg = (
                f"`features` must be latent indices (ints), got a {features.dtype} "
                f"tensor of shape {list(features.shape)}."
            )
            raise TypeError(msg)
        items: list[Any] = features.reshape(-1).tolist()
    elif isinstance(features, Iterable) and not isinstance(features, str | bytes):
        items = list(features)
    else:
        items = [features]
    try:
        out = tuple(operator.index(i) for i in items)
    except TypeError as error:
        msg = f"`features` must be latent indices (ints), got {features!r}."
        raise TypeError(msg) from error
    if not out or min(out) < 0:
        msg = f"`features` must be one or more latent indices >= 0, got {features!r}."
        raise ValueError(msg)
    return out


@dataclasses.dataclass(frozen=True)
class Edit:
    """One edit of some latents at every token (made by :func:`zero`, ...).

    Called with latents ``[..., d_sae]``, it changes them in place and
    returns them.
    """

    kind: str
    features: tuple[int, ...]
    value: float = 0.0
    low: float | None = None
    high: float | None = None

    def __call__(self, latents: Tensor) -> Tensor:
        """Apply the edit to ``latents`` in place; return them."""
        size = latents.shape[-1]
        if max(self.features) >= size:
            msg = (
                f"{self!r} edits latent {max(self.features)}, but the SAE has "
                f"{size} latents (0 to {size - 1})."
            )
            raise IndexError(msg)
        index = list(self.features)
        if self.kind == "zero":
            latents[..., index] = 0
        elif self.kind == "scale":
            latents[..., index] *= self.value
        elif self.kind == "set_to":
            latents[..., index] = self.value
        else:
            latents[..., index] = latents[..., index].clamp(self.low, self.high)
        return latents

    def __repr__(self) -> str:
        features = list(self.features)
        if self.kind == "zero":
            return f"zero({features})"
        if self.kind == "clamp":
            return f"clamp({features}, min={self.low}, max={self.high})"
        return f"{self.kind}({features}, {self.value})"


def zero(features: int | Iterable[int] | Tensor) -> Edit:
    """Return the edit setting ``features`` to zero (ablating them).

    Examples
    --------
    >>> import torch
    >>> zero([1, 3])(torch.ones(1, 4))
    tensor([[1., 0., 1., 0.]])

    """
    return Edit("zero", _features(features))


def scale(features: int | Iterable[int] | Tensor, by: float) -> Edit:
    """Return the edit multiplying ``features`` by ``by``.

    Examples
    --------
    >>> import torch
    >>> scale(0, 3.0)(torch.ones(1, 2))
    tensor([[3., 1.]])

    """
    return Edit("scale", _features(features), value=float(by))


def set_to(features: int | Iterable[int] | Tensor, value: float) -> Edit:
    """Return the edit setting ``features`` to ``value`` at every token (steering).

    Examples
    --------
    >>> import torch
    >>> set_to(1, 10.0)(torch.zeros(2, 3))
    tensor([[ 0., 10.,  0.],
            [ 0., 10.,  0.]])

    """
    return Edit("set_to", _features(features), value=float(value))


def clamp(
    features: int | Iterable[int] | Tensor,
    *,
    min: float | None = None,  # noqa: A002 (torch.clamp's names)
    max: float | None = None,  # noqa: A002 (torch.clamp's names)
) -> Edit:
    """Return the edit bounding ``features`` to ``[min, max]`` (either may be open).

    Examples
    --------
    >>> import torch
    >>> clamp([0, 1], max=2.0)(torch.tensor([[5.0, 1.0, 5.0]]))
    tensor([[2., 1., 5.]])

    """
    if min is None and max is None:
        msg = "`clamp` needs `min`, `max` or both."
        raise ValueError(msg)
    return Edit(
        "clamp",
        _features(features),
        low=None if min is None else float(min),
        high=None if max is None else float(max),
    )
