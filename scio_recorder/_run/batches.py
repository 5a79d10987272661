"""How the net's inputs come out of a batch, and how batches move between devices.

Holds the getters of ``input=`` and ``target=`` (:func:`batch_getter`: an
index, a key, a callable or ``None`` for the whole batch), the one
convention that turns an input into the net's positional and keyword
arguments (:func:`as_arguments`), :func:`move_to` (a device move that keeps
the nesting) and :func:`first_batch_size`; and the position ids of padded
batches: :class:`Positions` (``position_ids`` derived from the padding mask,
as Hugging Face's ``generate`` derives them), :func:`padding_hazard` (a
module, the net or inside it, whose absolute positions a left-padded batch
shifts) and :class:`PaddingWatch` (the warning when a left-padded batch
reaches it without ``position_ids``).

Why: :func:`scio_recorder.collect.collect`, the detectors of
:mod:`scio_recorder.ood` and :mod:`scio_recorder.explain` all take batches
and inputs the same way; each had its own copy (or imported a private
module of another subpackage), and a convention that differs between them
surprises. A row's activations must not depend on its padding: a model
with absolute positions (GPT-2, BERT) numbers the tokens of a left-padded
row from the padding's first column unless it is given ``position_ids``,
so every path of the library that feeds batches to a net derives them the
same way, here.
"""

from __future__ import annotations

__all__ = [
    "POSITION_IDS",
    "Hazard",
    "PaddingWatch",
    "Positions",
    "argument",
    "as_arguments",
    "batch_getter",
    "check_position_ids",
    "first_batch_size",
    "index_getter",
    "key_getter",
    "move_to",
    "padding_hazard",
    "padding_unwatched",
    "position_scheme",
    "takes_argument",
    "watch_padding",
]

import contextlib
import inspect
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from torch import Tensor, nn

from scio_recorder._engine.state import CallInputs, user_stacklevel
from scio_recorder._support.tree import map_tensors

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

POSITION_IDS = "from_mask"
"""The default of the ``position_ids`` option: derived from the padding mask."""

Scheme = Literal["absolute", "relative", "own"]


def batch_getter(spec: object, what: str) -> Callable[[Any], Any]:
    """Return a function taking the input (or target) out of a batch.

    ``spec`` is ``None`` (the whole batch), an int (an item of a tuple or
    list batch), a str (a key of a dict batch) or a callable ``batch ->
    value``; ``what`` names the option (``"input"``, ``"target"``) in the
    messages.

    Examples
    --------
    >>> batch_getter(1, "target")(("x", "y")), batch_getter("y", "target")({"y": 2})
    ('y', 2)
    >>> batch_getter(1.5, "target")
    Traceback (most recent call last):
    ...
    TypeError: `target` must be an int, a str, a callable or None, got 1.5

    """
    if spec is None:
        return lambda batch: batch
    if isinstance(spec, int) and not isinstance(spec, bool):
        return index_getter(spec, what)
    if isinstance(spec, str):
        return key_getter(spec, what)
    if callable(spec) and not isinstance(spec, bool):
        return spec
    msg = f"`{what}` must be an int, a str, a callable or None, got {spec!r}"
    raise TypeError(msg)


def index_getter(index: int, what: str) -> Callable[[Any], Any]:
    """Return a function taking item ``index`` of a tuple or list batch."""

    def by_index(batch: Any) -> Any:
        if isinstance(batch, Tensor):
            msg = (
                f"`{what}={index}` takes item {index} of a tuple or list batch, "
                f"but the batch is a tensor. Pass `{what}=None` to use the whole "
                "batch" + (" as the input." if what == "input" else ".")
            )
            raise TypeError(msg)
        try:
            return batch[index]
        except (IndexError, KeyError, TypeError) as error:
            msg = (
                f"`{what}={index}`: cannot take item {index} of the batch, a "
                f"{type(batch).__name__} ({error}). Pass `{what}=` an index, a "
                "key or a callable batch -> value."
            )
            raise ValueError(msg) from error

    return by_index


def key_getter(key: str, what: str) -> Callable[[Any], Any]:
    """Return a function taking ``key`` of a dict batch."""

    def by_key(batch: Any) -> Any:
        if not isinstance(batch, Mapping):
            msg = (
                f"`{what}={key!r}` takes a key of a dict batch, but the batch "
                f"is a {type(batch).__name__}. Pass an index or a callable."
            )
            raise TypeError(msg)
        if key not in batch:
            msg = (
                f"`{what}={key!r}`: the batch has no such key; its keys are "
                f"{list(batch)}."
            )
            raise KeyError(msg)
        return batch[key]

    return by_key


def as_arguments(value: Any, *, spread: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Turn an input into the net's positional and keyword arguments.

    A :class:`~scio_recorder.CallInputs` is both, always. With ``spread``
    (what a callable ``input=`` returned; the inputs of
    :mod:`scio_recorder.explain`), a tuple (a named tuple too) is the
    positional arguments and a mapping (a tokenizer's ``BatchEncoding``
    too) the keyword arguments. Anything else, and anything without
    ``spread`` (an item taken by index or key, the whole batch), is the one
    positional argument.

    Examples
    --------
    >>> as_arguments((1, 2), spread=True), as_arguments((1, 2), spread=False)
    (((1, 2), {}), (((1, 2),), {}))
    >>> as_arguments({"ids": 3}, spread=True)
    ((), {'ids': 3})
    >>> from scio_recorder import CallInputs
    >>> as_arguments(CallInputs((1,), {"mask": 0}), spread=False)
    ((1,), {'mask': 0})

    """
    if isinstance(value, CallInputs):
        return tuple(value.args), dict(value.kwargs)
    if spread and isinstance(value, tuple):
        return value, {}
    if spread and isinstance(value, Mapping):
        return (), dict(value)
    return (value,), {}


def move_to(value: Any, device: torch.device) -> Any:
    """Move the tensors in ``value`` to ``device`` (async toward accelerators).

    Any nesting that :func:`~scio_recorder._support.tree.map_tensors` walks is kept:
    named tuples, dict subclasses, dataclasses (model outputs).

    Examples
    --------
    >>> import torch
    >>> moved = move_to({"x": (torch.zeros(1), 2)}, torch.device("meta"))
    >>> moved["x"][0].device, moved["x"][1]
    (device(type='meta'), 2)

    """
    # A copy toward the CPU must be synchronous: an asynchronous one returns
    # before the data has arrived.
    non_blocking = device.type != "cpu"
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), value)


def first_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """Return dim 0 of the first tensor among the arguments (no host sync).

    Examples
    --------
    >>> import torch
    >>> first_batch_size((3, torch.zeros(())), {"x": torch.zeros(4, 2)})
    4
    >>> first_batch_size((), {}) is None
    True

    """
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    return None


# -- position ids of padded batches ------------------------------------------

_POSITION_NAMES = (
    "wpe",
    "position_embeddings",
    "position_embedding",
    "embed_positions",
    "pos_embed",
    "pos_embedding",
    "positional_embedding",
)
"""Attribute names of learned absolute position embeddings (GPT-2, BERT, ...)."""


def check_position_ids(value: object) -> None:
    """Refuse a ``position_ids`` option other than ``"from_mask"`` and ``None``.

    Examples
    --------
    >>> check_position_ids("from_mask"), check_position_ids(None)
    (None, None)
    >>> check_position_ids(True)
    Traceback (most recent call last):
    ...
    ValueError: `position_ids` must be "from_mask" (derive them from the padding mask when the net takes them and the batch has none) or None (pass the batch as it is), got True

    """  # noqa: E501 (doctest output)
    if value is None or (isinstance(value, str) and value == POSITION_IDS):
        return
    msg = (
        f'`position_ids` must be "{POSITION_IDS}" (derive them from the padding '
        "mask when the net takes them and the batch has none) or None (pass the "
        f"batch as it is), got {value!r}"
    )
    raise ValueError(msg)


def _parameters(net: nn.Module) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(net.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a signature
        return None


def position_scheme(net: nn.Module) -> Scheme | None:
    """Say how ``net`` numbers positions, as far as deriving them is concerned.

    ``None``: its forward takes no ``position_ids`` or no ``attention_mask``
    (nothing to derive). ``"own"``: it numbers a padded row itself and ids
    numbered from 0 would be wrong or useless: an encoder-decoder, a
    multimodal model (its own position scheme), a position embedding with a
    ``padding_idx`` (RoBERTa and its family number from ``padding_idx + 1``
    with the padding skipped) or whose ``forward`` is its own (OPT's takes
    the mask). ``"absolute"``: a learned position embedding (an
    ``nn.Embedding`` named like GPT-2's ``wpe`` or BERT's
    ``position_embeddings``): a left-padded row without ``position_ids`` is
    numbered from the padding. ``"relative"``: anything else (rotary
    embeddings, as Llama's), where a shift of every position changes only
    roundings.

    Examples
    --------
    >>> import transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)
    >>> position_scheme(transformers.GPT2Model(config))
    'absolute'
    >>> position_scheme(nn.Linear(2, 2)) is None
    True

    """
    if not {"position_ids", "attention_mask"} <= _names(net):
        return None
    return _embedding_scheme(net)


def _names(net: nn.Module) -> set[str]:
    """Return the names of the parameters of ``net``'s forward."""
    return {p.name for p in _parameters(net) or ()}


def _embedding_scheme(net: nn.Module) -> Scheme:
    """Say how ``net`` numbers positions, from its config and its embeddings."""
    config = getattr(net, "config", None)
    if getattr(config, "is_encoder_decoder", False) or (
        getattr(config, "vision_config", None) is not None
    ):
        return "own"
    scheme: Scheme = "relative"
    for name, module in net.named_modules():
        if name.rsplit(".", 1)[-1] not in _POSITION_NAMES:
            continue
        if not isinstance(module, nn.Embedding):
            continue
        if module.padding_idx is not None or type(module).forward is not (
            nn.Embedding.forward
        ):
            return "own"
        scheme = "absolute"
    return scheme


def takes_argument(net: nn.Module, name: str) -> tuple[bool, int | None]:
    """Return whether ``net``'s forward takes ``name``, and its positional index.

    Examples
    --------
    >>> import transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)
    >>> takes_argument(transformers.GPT2Model(config), "attention_mask")
    (True, 2)
    >>> takes_argument(nn.Linear(2, 2), "attention_mask")
    (False, None)

    """
    positional = _positional(net)
    index = positional.index(name) if name in positional else None
    return name in _names(net), index


def _positional(net: nn.Module) -> list[str]:
    """Return the names of the parameters of ``net``'s forward taken by position."""
    return [
        p.name
        for p in _parameters(net) or ()
        if p.kind in {p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD}
    ]


class Hazard(NamedTuple):
    """A module whose learned absolute positions a left-padded batch shifts.

    ``module`` is the net itself (``name == ""``) or a module inside it
    (a Hugging Face model in a user's wrapper); ``takes_ids``: whether its
    forward takes ``position_ids`` (the net's own forward does not pass
    them on, or it is the net and takes none).
    """

    module: nn.Module
    name: str
    takes_ids: bool


def padding_hazard(net: nn.Module) -> Hazard | None:
    """Return the module of ``net`` a left-padded batch numbers from its padding.

    ``None`` when the net takes ``position_ids`` itself (derived ones reach
    it: :class:`Positions`) or no module is concerned. Else, when the net's
    own forward takes no ``position_ids``, a module (the net included)
    whose forward takes an ``attention_mask`` and that holds a learned
    absolute position embedding (:func:`position_scheme` ``"absolute"``
    but for ``position_ids``): the outermost one whose forward takes
    ``position_ids`` (a Hugging Face model in a wrapper that does not pass
    them on), else the innermost (a model whose forward takes none,
    DistilBERT-like). Nothing the library derives reaches it; a
    left-padded row's activations depend on its padding.

    Examples
    --------
    >>> import transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)
    >>> class Wrap(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.lm = transformers.GPT2Model(config)
    ...
    ...     def forward(self, input_ids, attention_mask=None):
    ...         return self.lm(input_ids, attention_mask=attention_mask)[0]
    >>> padding_hazard(Wrap())[1:]
    ('lm', True)
    >>> padding_hazard(transformers.GPT2Model(config)) is None
    True

    """
    if "position_ids" in _names(net):
        return None
    embeddings = [
        name
        for name, module in net.named_modules()
        if isinstance(module, nn.Embedding)
        and name.rsplit(".", 1)[-1] in _POSITION_NAMES
    ]
    if not embeddings:
        return None
    modules = dict(net.named_modules())
    found: list[Hazard] = []
    for embedding in embeddings:
        parts = embedding.split(".")
        # the embedding's ancestors, outermost first (the net is "")
        for name in ["", *(".".join(parts[:i]) for i in range(1, len(parts)))]:
            module = modules[name]
            names = _names(module)
            if "attention_mask" in names and _embedding_scheme(module) == "absolute":
                found.append(Hazard(module, name, "position_ids" in names))
    # The outermost module that takes position_ids (a model in a wrapper), else
    # the innermost that takes the mask (the model whose forward takes none).
    with_ids = [hazard for hazard in found if hazard.takes_ids]
    if with_ids:
        return with_ids[0]
    return found[-1] if found else None


def watch_padding(rnet: nn.Module, kwargs: Mapping[str, Any]) -> None:
    """Let a recorder's :class:`PaddingWatch` see a call it does not run itself.

    For the passes a detector runs (scores, gradient fits): they reach the
    net without the recorder's ``__call__``, which watches direct calls.
    """
    watch: PaddingWatch = vars(rnet)["_padding"]  # the recorder's watch
    net = rnet.net
    if "attention_mask" in kwargs and not watch.done and isinstance(net, nn.Module):
        watch.see(net, kwargs)


def argument(
    name: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    index: int | None,
) -> Any:
    """Return the argument ``name`` (positional ``index``) of a call, or ``None``."""
    if name in kwargs:
        return kwargs[name]
    if index is not None and index < len(args):
        return args[index]
    return None


class Positions:
    """Position ids derived from the padding mask, for the batches of one net.

    Made once per run (:func:`~scio_recorder.collect.collect`,
    :func:`~scio_recorder.activations.write`, a fit, an explanation): with
    ``mode="from_mask"`` and a net whose forward takes ``position_ids`` and
    ``attention_mask`` (and does not number padded rows itself, see
    :func:`position_scheme`), :meth:`add` gives every batch that has a 2-D
    ``attention_mask`` and no ``position_ids`` the ids Hugging Face's
    ``generate`` gives it: ``mask.cumsum(-1) - 1``, 0 at the padding. A
    row's real tokens are then numbered 0, 1, ... whatever its padding, as
    when it runs alone. With ``mode=None``, or any other net, batches pass
    as they are.

    Examples
    --------
    >>> import torch, transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10)
    >>> positions = Positions(transformers.GPT2Model(config))
    >>> mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])
    >>> args, kwargs = positions.add((), {"input_ids": mask, "attention_mask": mask})
    >>> kwargs["position_ids"]
    tensor([[0, 0, 0, 1],
            [0, 1, 2, 0]])

    """

    __slots__ = ("active", "input_index", "mask_index", "positions_index")

    def __init__(self, net: nn.Module, mode: str | None = POSITION_IDS) -> None:
        check_position_ids(mode)
        self.active = mode is not None and position_scheme(net) in {
            "absolute",
            "relative",
        }
        self.mask_index: int | None = None
        self.positions_index: int | None = None
        self.input_index: int | None = None
        if self.active:
            positional = _positional(net)
            where = {name: i for i, name in enumerate(positional)}
            self.mask_index = where.get("attention_mask")
            self.positions_index = where.get("position_ids")
            self.input_index = 0 if positional else None

    @classmethod
    def of(cls, net: nn.Module, mode: str | None = POSITION_IDS) -> Positions:
        """Return the positions of ``net`` in ``mode``, made once per net.

        The net's forward and modules are looked at once, not at every call
        (``Detector.score``, the explanations, every ``collect`` run).
        """
        check_position_ids(mode)
        if mode is None:
            return _OFF
        positions = _POSITIONS.get(net)
        if positions is None:
            positions = _POSITIONS[net] = cls(net)
        return positions

    def add(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Return the net's arguments with ``position_ids`` derived, if needed."""
        if not self.active:
            return args, kwargs
        if argument("position_ids", args, kwargs, self.positions_index) is not None:
            return args, kwargs
        mask = argument("attention_mask", args, kwargs, self.mask_index)
        if not isinstance(mask, Tensor) or mask.dim() != 2:  # noqa: PLR2004 (batch, positions)
            return args, kwargs
        length = _length(args, kwargs, self.input_index)
        if length is not None and length > mask.shape[1]:
            return args, kwargs  # not a mask of these tokens: leave it to the net
        positions = mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(mask == 0, 0)
        if length is not None and length < mask.shape[1]:  # a cache holds the rest
            positions = positions[:, -length:]
        return args, {**kwargs, "position_ids": positions}


_POSITIONS: weakref.WeakKeyDictionary[nn.Module, Positions] = (
    weakref.WeakKeyDictionary()
)
""":meth:`Positions.of`'s: one per net, dropped with it."""

_OFF = Positions(nn.Module(), None)
""":meth:`Positions.of`'s with ``mode=None``: passes every batch as it is."""


def _length(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int | None
) -> int | None:
    """Return the number of positions of the net's token input, when found."""
    for name in ("input_ids", "inputs_embeds"):
        value = kwargs.get(name)
        if isinstance(value, Tensor) and value.dim() >= 2:  # noqa: PLR2004
            return int(value.shape[1])
    value = args[index] if index is not None and index < len(args) else None
    if isinstance(value, Tensor) and value.dim() >= 2:  # noqa: PLR2004
        return int(value.shape[1])
    return None


class PaddingWatch:
    """Warn once when a left-padded batch reaches a net with absolute positions.

    A recorder holds one; its direct calls (``rnet(**batch)``) stay the
    user's calls: nothing is added to them. But a batch with an
    ``attention_mask`` whose first column pads some row, and no
    ``position_ids``, given to a net with learned absolute positions
    (:func:`position_scheme` ``"absolute"``) numbers that row's tokens from
    its padding: its activations differ from the row alone. So does any
    batch, whatever the library derives, when those positions are a
    module's the net's forward gives no ``position_ids`` to
    (:func:`padding_hazard`: a wrapper around a Hugging Face model, a
    model whose forward takes none). That is worth one
    :class:`UserWarning` per recorder, naming the module and the fix. Only
    calls with an ``attention_mask`` keyword are looked at (direct calls;
    ``write``, ``collect`` and the detectors' passes through
    :func:`watch_padding` too), until the warning is given or the net is
    found not to be concerned.
    """

    __slots__ = ("done", "hazard", "scheme")

    def __init__(self) -> None:
        self.done = False
        self.scheme: Scheme | Literal["unknown"] | None = "unknown"
        self.hazard: Hazard | None = None

    def see(self, net: nn.Module, kwargs: Mapping[str, Any]) -> None:
        """Look at the keyword arguments of one direct call of ``net``."""
        if kwargs.get("position_ids") is not None:
            return
        if self.scheme == "unknown":
            self.scheme = position_scheme(net)
            if self.scheme is None:
                self.hazard = padding_hazard(net)
        if self.scheme != "absolute" and self.hazard is None:
            self.done = True
            return
        mask = kwargs["attention_mask"]
        if not isinstance(mask, Tensor) or mask.dim() != 2 or not mask.shape[1]:  # noqa: PLR2004 (batch, positions)
            return
        if not bool((mask[:, 0] == 0).any()):
            return
        self.done = True
        msg = (
            "A left-padded batch (its `attention_mask` starts with padding) and no "
            f"`position_ids` reached {type(net).__name__}, whose positions are "
            "learned absolute ones: each padded row's tokens are numbered from its "
            "padding, so its activations differ from the row run alone. Pass "
            "`position_ids=(mask.cumsum(-1) - 1).clamp(min=0)` with the batch, pad "
            "on the right (`tokenizer.padding_side = 'right'`), or use "
            "`scio_recorder.collect` / `activations.write`, which derive them "
            "(`position_ids='from_mask'`). Shown once per recorder."
        )
        if self.hazard is not None:
            msg = _hazard_message(net, self.hazard)
        warnings.warn(msg, UserWarning, stacklevel=user_stacklevel())


def _hazard_message(net: nn.Module, hazard: Hazard) -> str:
    """Say which module numbers a left-padded row from its padding, and the fix."""
    inner = type(hazard.module).__name__
    root = type(net).__name__
    if not hazard.name:  # the net itself, whose forward takes no position_ids
        where = (
            f"{root}, whose positions are learned absolute ones and whose forward "
            "takes no `position_ids`"
        )
        fix = "Pad on the right (`tokenizer.padding_side = 'right'`)."
    elif hazard.takes_ids:
        where = (
            f"`{hazard.name}` ({inner}) inside {root}, whose positions are learned "
            f"absolute ones and to which {root}'s forward gives no `position_ids`"
        )
        fix = (
            "Pad on the right (`tokenizer.padding_side = 'right'`), or pass "
            f"`position_ids` through {root}'s forward to `{hazard.name}` (`write`, "
            "`collect` and the detectors then derive them from the mask)."
        )
    else:
        where = (
            f"`{hazard.name}` ({inner}) inside {root}, whose positions are learned "
            "absolute ones and whose forward takes no `position_ids`"
        )
        fix = "Pad on the right (`tokenizer.padding_side = 'right'`)."
    return (
        "A left-padded batch (its `attention_mask` starts with padding) reached "
        f"{where}: each padded row's tokens are numbered from its padding, so its "
        "activations differ from the row run alone, and `write`, `collect` and "
        f"the detectors cannot derive position ids for it. {fix} Shown once per "
        "recorder."
    )


@contextlib.contextmanager
def padding_unwatched(rnet: nn.Module, mode: str | None) -> Iterator[None]:
    """Keep a recorder's :class:`PaddingWatch` quiet inside, when ``mode`` is ``None``.

    A run with ``position_ids=None`` passes the batches as they are because
    its caller said so: it is not the direct call the warning is for.
    """
    watch: PaddingWatch = vars(rnet)["_padding"]  # the recorder's watch
    if mode is not None or watch.done:
        yield
        return
    watch.done = True
    try:
        yield
    finally:
        watch.done = False
