"""The logit lens as a grid: the top token per layer and position, top-k on hover."""

from __future__ import annotations

__all__ = ["lens_view"]

from typing import TYPE_CHECKING, Any

import torch

from ._base import View, names, new_figure, one_sample, rounded, short, tick_labels

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from matplotlib.figure import Figure
    from torch import Tensor

_TEXT = 12  # characters of a token shown in the static picture


def _decoder(decode: Any) -> Callable[[int], str]:
    if decode is None:
        return str
    if callable(getattr(decode, "decode", None)):  # a tokenizer
        return lambda index: str(decode.decode([index]))
    if callable(decode):
        return lambda index: str(decode(index))
    msg = (
        "lens_view: `decode` must be a tokenizer (with .decode) or a function "
        f"token id -> text, got a {type(decode).__name__}"
    )
    raise TypeError(msg)


class _LensView(View):
    kind = "lens"

    def figure(self) -> Figure:
        top = self.data["top"]
        probs = torch.tensor([[cell[0][1] or 0.0 for cell in row] for row in top])
        rows, cols = probs.shape
        fig = new_figure(min(16, 4.0 + 0.9 * cols), min(12, 2.6 + 0.4 * rows))
        ax = fig.add_subplot()
        image = ax.imshow(probs.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
        width, height = fig.get_size_inches()
        if (width - 3.5) / cols >= 0.7:  # noqa: PLR2004 (room for _TEXT characters at 7 pt)
            for i, row in enumerate(top):
                for j, cell in enumerate(row):
                    token, p = cell[0][0], cell[0][1] or 0.0
                    colour = "white" if p > 0.5 else "black"  # noqa: PLR2004 (the darker half)
                    ax.text(
                        j,
                        i,
                        short(token, _TEXT),
                        ha="center",
                        va="center",
                        fontsize=7,
                        color=colour,
                    )
        layers = [short(name) for name in self.data["layers"]]
        positions = [short(name) for name in self.data["positions"]]
        at_rows = tick_labels(layers, height - 2.2, 8)
        at_cols = tick_labels(positions, width - 3.5, 8)
        ax.set_yticks(at_rows, [layers[i] for i in at_rows], fontsize=8)
        ax.set_xticks(at_cols, [positions[j] for j in at_cols], rotation=90, fontsize=8)
        ax.set_xlabel("input position")
        ax.set_ylabel("layer")
        ax.set_title(self.title, fontsize=10)
        fig.colorbar(image, ax=ax, label="probability of the top token", shrink=0.8)
        return fig


def lens_view(  # noqa: PLR0913 (the lens, then keyword-only options)
    lens: Tensor,
    tokens: Sequence[Any] | None = None,
    *,
    decode: Any = None,
    layers: Sequence[Any] | None = None,
    sample: int = 0,
    k: int = 5,
    title: str = "Logit lens",
) -> View:
    """Return the logit-lens grid: the top token per layer and position.

    Each cell shows the token the layer's residual stream predicts at that
    position, on a background as dark as its probability; hovering it shows
    the ``k`` most probable tokens and their probabilities (the softmax of
    the lens' logits).

    Parameters
    ----------
    lens : Tensor
        Logits, ``[layers, batch, positions, vocabulary]`` from
        :func:`~scio_recorder.explain.logit_lens` (or a tuned lens), or
        ``[layers, positions, vocabulary]``.
    tokens : sequence, optional
        The input tokens (as text), one per position; default ``0, 1, ...``.
    decode : tokenizer or callable, optional
        Turns a token id into text: a tokenizer (its ``decode([id])``) or a
        function ``id -> str``; default the id.
    layers : sequence, optional
        A name per layer (the selectors given to ``logit_lens``).
    sample : int, default 0
        The sample of the batch shown.
    k : int, default 5
        Tokens shown on hover.
    title : str, default "Logit lens"

    Returns
    -------
    View

    Examples
    --------
    >>> import torch
    >>> lens = torch.tensor(
    ...     [[[0.0, 2.0, 0.0]], [[3.0, 0.0, 0.0]]]
    ... )  # 2 layers, 1 position
    >>> view = lens_view(lens, ["x"], decode=lambda i: "abc"[i], k=2)
    >>> view.data["top"][0][0]
    [['b', 0.786986, 1], ['a', 0.106507, 0]]

    """
    found = one_sample(
        torch.as_tensor(lens).detach(),
        ["layers", "batch", "positions", "vocabulary"],
        sample,
        "lens_view",
        "lens",
    )
    n_layers, n_positions, vocabulary = found.shape
    if not 1 <= k <= vocabulary:
        msg = f"lens_view: k={k}; use 1 to the vocabulary's size, {vocabulary}"
        raise ValueError(msg)
    text = _decoder(decode)
    probs = torch.softmax(found.to("cpu", torch.float64), dim=-1)
    values, indices = probs.topk(k, dim=-1)
    top = [
        [
            [
                [text(index), rounded(value), index]
                for value, index in zip(
                    values[i, j].tolist(), indices[i, j].tolist(), strict=True
                )
            ]
            for j in range(n_positions)
        ]
        for i in range(n_layers)
    ]
    data = {
        "top": top,
        "layers": names(layers, n_layers, "layers", "lens_view"),
        "positions": names(tokens, n_positions, "tokens", "lens_view"),
        "k": k,
    }
    view = _LensView(data, title=title)
    view.height = min(900, 160 + 26 * n_layers)
    return view
