r"""The nodes of a decoder's graph for edge attribution: where they read and write.

A source writes a term into the residual stream (``"input"``, each head
``"a{l}.h{h}"``, each MLP ``"m{l}"``), a destination reads the stream before
its normalisation (each head's ``<q>``, ``<k>``, ``<v>``, each MLP,
``"logits"``), as in Hanna et al.'s EAP-IG code. The layout is found for
GPT-2 and Llama-style decoders, or named for any net (:class:`Components`);
:mod:`._edges` scores the edges between them.
"""

from __future__ import annotations

__all__ = [
    "Attention",
    "Components",
    "Dest",
    "Layout",
    "Source",
    "find_layout",
    "sorted_nodes",
]

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from torch import nn


# -- the layout: where each node's output and input are ------------------------


@dataclass(frozen=True)
class Source:
    name: str
    order: int
    """Sources feed destinations of a larger order."""
    module: str
    """The module whose output (kind "output") or first input ("input",
    "head") holds the source's term."""
    kind: str
    cols: slice | None = None
    """A head's columns in the output projection's input."""


@dataclass(frozen=True)
class Dest:
    name: str
    order: int
    norm: str
    """The module whose first input is the destination's input."""
    proj: str | None = None
    """For a head's q/k/v: the projection after ``norm`` ..."""
    cols: slice | None = None
    """... and the head's columns of its output."""
    qk: Attention | None = None
    """For a head's q or k on a net whose projections give the attention's
    queries and keys as they are (no rotation): what AtP*'s fix reads."""


@dataclass(frozen=True)
class Attention:
    """A head's attention, recomputed from its projections (AtP*'s QK fix)."""

    attention: str
    """The attention module (its ``scaling``)."""
    output: str
    """The output projection, whose input holds the head's output ..."""
    head: slice
    """... at these columns."""
    queries: slice
    keys: slice
    values: slice
    """The head's columns of the projection's output."""
    letter: str


@dataclass
class Layout:
    sources: list[Source]
    dests: list[Dest]
    aliases: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Components:
    """A net's components, named for :func:`edge_attribution`.

    For a net whose stream is ``x = input(...)``, then ``x = x + c(x)`` for
    each component ``c`` in order, then ``final(x)``: the sources are
    ``"input"`` and the components, the destinations the components and
    ``"logits"``, each component named by its module name.

    Parameters
    ----------
    input : str
        The module whose output starts the stream (an embedding).
    components : sequence of str
        The modules that read the stream (their first positional input) and
        add their output to it, in the order they run.
    final : str
        The module that reads the final stream (a norm, or the unembedding).

    Examples
    --------
    >>> Components("embed", ["a", "m"], "unembed").components
    ('a', 'm')

    """

    input: str
    components: Sequence[str]
    final: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", tuple(self.components))


def find_layout(net: nn.Module, components: Components | None, who: str) -> Layout:
    """Return the nodes of ``net`` (``who``: the function asking, for errors)."""
    modules = dict(net.named_modules())
    if components is not None:
        names = [components.input, *components.components, components.final]
        missing = [name for name in names if name not in modules]
        if missing:
            msg = (
                f"{who}: `components` names {missing}, not modules of "
                f"{type(net).__name__}: give names from `net.named_modules()`."
            )
            raise ValueError(msg)
        sources = [Source("input", 0, components.input, "output")]
        dests = []
        for i, name in enumerate(components.components, start=1):
            sources.append(Source(name, i, name, "output"))
            dests.append(Dest(name, i, name))
        dests.append(Dest("logits", len(names), components.final))
        return Layout(sources, dests)
    config = getattr(net, "config", None)
    if "transformer.h.0.attn.c_attn" in modules and config is not None:
        return _gpt2(config)
    if "model.layers.0.self_attn.q_proj" in modules and config is not None:
        return _llama(config)
    msg = (
        f"{who}: found no decoder layout in {type(net).__name__} (GPT-2's "
        "`transformer.h`, Llama's `model.layers`): name the components, e.g. "
        '`components=Components("embed", ["blocks.0.attn", "blocks.0.mlp"], '
        '"ln_final")`.'
    )
    raise ValueError(msg)


def _gpt2(config: Any) -> Layout:
    layers, heads = int(config.n_layer), int(config.n_head)
    width = int(config.n_embd)
    size = width // heads
    sources = [Source("input", 0, "transformer.h.0", "input")]
    dests = []
    for layer in range(layers):
        block = f"transformer.h.{layer}"
        for head in range(heads):
            cols = slice(head * size, (head + 1) * size)
            sources.append(
                Source(
                    f"a{layer}.h{head}",
                    2 * layer + 1,
                    f"{block}.attn.c_proj",
                    "head",
                    cols,
                )
            )
            spans = [
                slice(i * width + head * size, i * width + (head + 1) * size)
                for i in range(3)
            ]
            for i, letter in enumerate("qkv"):
                qk = Attention(
                    f"{block}.attn",
                    f"{block}.attn.c_proj",
                    cols,
                    queries=spans[0],
                    keys=spans[1],
                    values=spans[2],
                    letter=letter,
                )
                dests.append(
                    Dest(
                        f"a{layer}.h{head}<{letter}>",
                        2 * layer + 1,
                        f"{block}.ln_1",
                        f"{block}.attn.c_attn",
                        spans[i],
                        qk if letter != "v" else None,
                    )
                )
        sources.append(Source(f"m{layer}", 2 * layer + 2, f"{block}.mlp", "output"))
        dests.append(Dest(f"m{layer}", 2 * layer + 2, f"{block}.ln_2"))
    dests.append(Dest("logits", 2 * layers + 1, "transformer.ln_f"))
    return Layout(sorted_nodes(sources), sorted_nodes(dests))


def _llama(config: Any) -> Layout:
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    groups = int(getattr(config, "num_key_value_heads", None) or heads)
    size = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    per_group = heads // groups
    sources = [Source("input", 0, "model.layers.0", "input")]
    dests = []
    aliases = {}
    for layer in range(layers):
        block = f"model.layers.{layer}"
        norm, attn = f"{block}.input_layernorm", f"{block}.self_attn"
        for head in range(heads):
            cols = slice(head * size, (head + 1) * size)
            sources.append(
                Source(
                    f"a{layer}.h{head}", 2 * layer + 1, f"{attn}.o_proj", "head", cols
                )
            )
            dests.append(
                Dest(
                    f"a{layer}.h{head}<q>", 2 * layer + 1, norm, f"{attn}.q_proj", cols
                )
            )
        for group in range(groups):
            first = group * per_group
            cols = slice(group * size, (group + 1) * size)
            for letter in "kv":
                name = f"a{layer}.h{first}<{letter}>"
                dests.append(
                    Dest(name, 2 * layer + 1, norm, f"{attn}.{letter}_proj", cols)
                )
                for head in range(first + 1, first + per_group):
                    aliases[f"a{layer}.h{head}<{letter}>"] = name
        sources.append(Source(f"m{layer}", 2 * layer + 2, f"{block}.mlp", "output"))
        dests.append(
            Dest(f"m{layer}", 2 * layer + 2, f"{block}.post_attention_layernorm")
        )
    dests.append(Dest("logits", 2 * layers + 1, "model.norm"))
    return Layout(sorted_nodes(sources), sorted_nodes(dests), aliases)


def sorted_nodes(items: list[Any]) -> list[Any]:
    """Order nodes as the authors' graph: by layer, heads before the MLP."""
    return sorted(items, key=lambda item: item.order)


# -- the scores ---------------------------------------------------------------
