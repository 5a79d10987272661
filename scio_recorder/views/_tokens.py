"""The token view: a text with each token shaded by a score, several side by side."""

from __future__ import annotations

__all__ = ["token_view"]

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ._base import View, finite, new_figure, rounded

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure
    from torch import Tensor

_PER_LINE = 16
"""Tokens per line of the static picture."""


_RED = (214 / 255, 39 / 255, 40 / 255)
"""The page's red (``rgba(214, 39, 40, alpha)``), drawn on white."""


def _shade(alpha: float) -> tuple[float, float, float]:
    """Return the page's red at opacity ``alpha`` over white, as RGB."""
    r, g, b = _RED
    return (1 - alpha * (1 - r), 1 - alpha * (1 - g), 1 - alpha * (1 - b))


class _TokenView(View):
    kind = "tokens"

    def figure(self) -> Figure:
        tokens = self.data["tokens"]
        scores = self.data["scores"]
        lines = max(1, math.ceil(len(tokens) / _PER_LINE))
        fig = new_figure(10, 0.6 + len(scores) * (0.5 + 0.35 * lines))
        for k, score in enumerate(scores):
            ax = fig.add_subplot(len(scores), 1, k + 1)
            ax.set_axis_off()
            ax.set_xlim(0, _PER_LINE)
            ax.set_ylim(lines, 0)
            ax.set_title(score["name"], fontsize=9, loc="left")
            span = score["high"] - score["low"]
            for i, (token, value) in enumerate(
                zip(tokens, score["values"], strict=True)
            ):
                level = (
                    0.0 if value is None or span <= 0 else (value - score["low"]) / span
                )
                # the shown values are rounded, the range not: clamp
                face = _shade(0.0 if value is None else 0.85 * min(max(level, 0), 1))
                ax.text(
                    i % _PER_LINE + 0.5,
                    i // _PER_LINE + 0.5,
                    token,
                    ha="center",
                    va="center",
                    fontsize=8,
                    family="monospace",
                    bbox={"facecolor": face, "edgecolor": "none", "pad": 1.5},
                )
        return fig


def token_view(
    tokens: Sequence[Any],
    scores: Mapping[str, Any] | Tensor | Sequence[float],
    *,
    title: str = "Token scores",
) -> View:
    """Return a text with each token shaded by a score; hovering shows the value.

    Each score gets its own copy of the text, side by side (surprisal next
    to a Mahalanobis distance, say), shaded white (its lowest finite value
    in the text) to red (its highest). A NaN (padding, a first token
    without a surprisal) is left unshaded and shows "no score".

    Parameters
    ----------
    tokens : sequence
        One row's tokens, as text (e.g. ``tokenizer.convert_ids_to_tokens``
        or ``[tokenizer.decode([i]) for i in ids]``).
    scores : mapping name -> ``[T]``, or one ``[T]``
        Scores of the tokens, e.g. one row of
        :meth:`~scio_recorder.ood._tokens.TokenScoring.score_tokens`.
    title : str, default "Token scores"

    Returns
    -------
    View
        ``.html()``, ``.save("tokens.html")``, ``.figure()``,
        ``.save("tokens.png")``; shown in Jupyter.

    Examples
    --------
    >>> import torch
    >>> view = token_view(
    ...     ["The", " cat", " sat"],
    ...     {"surprisal": torch.tensor([float("nan"), 2.0, 0.5])},
    ... )
    >>> view.data["scores"][0]["values"], view.data["scores"][0]["high"]
    ([None, 2.0, 0.5], 2.0)

    """
    named = dict(scores) if isinstance(scores, Mapping) else {"score": scores}
    if not named:
        msg = "token_view: scores is empty; give at least one score per token"
        raise ValueError(msg)
    words = [str(token) for token in tokens]
    panels = []
    for name, values in named.items():
        row = torch.as_tensor(values).detach().to("cpu", torch.float64).reshape(-1)
        if row.numel() != len(words):
            msg = (
                f"token_view: score {name!r} has {row.numel()} values for "
                f"{len(words)} tokens; give one per token (one row of score_tokens)"
            )
            raise ValueError(msg)
        shown = row[row.isfinite()]
        panels.append(
            {
                "name": str(name),
                "values": finite(row.tolist()),
                "low": rounded(float(shown.min())) if shown.numel() else 0.0,
                "high": rounded(float(shown.max())) if shown.numel() else 1.0,
            }
        )
    view = _TokenView({"tokens": words, "scores": panels}, title=title)
    view.height = min(900, 140 + 60 * len(panels) * max(1, len(words) // 40 + 1))
    return view
