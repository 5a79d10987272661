"""From a batch and a pass to the tokens kept: layers, masks, casts.

Holds :class:`LayerSpec` and :func:`resolve_layers` (the ``layers=`` of
:func:`~scio_recorder.activations.write`, each resolved to exactly one call
per forward and named), :class:`Batches` (a batch to the net's arguments,
its padding mask, and the tokens kept: ``skip_bos`` included), and
:func:`take` (one layer's record to the ``[tokens, d]`` rows kept, cast,
with the overflow check).

Why: what a token is (a position the mask keeps, in row-major order), and
what is refused (no mask where a batch has padding, a layer not called once
per forward, a dtype that cannot hold the values), is decided once, here;
the writer only moves rows.
"""

from __future__ import annotations

__all__ = [
    "INDEX",
    "Batches",
    "LayerSpec",
    "describe_layers",
    "first_tensor",
    "pick",
    "record_tensor",
    "resolve_layers",
    "take",
    "token_ids",
]

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._engine.state import pick_argument
from scio_recorder._run.batches import (
    Positions,
    argument,
    as_arguments,
    batch_getter,
    move_to,
    takes_argument,
    watch_padding,
)
from scio_recorder.collect import InputOf
from scio_recorder.layers import label_str
from scio_recorder.select import as_label, resolve_one

from ._sparse import SparseLatents

if TYPE_CHECKING:
    from collections.abc import Callable

    from scio_recorder.layers import Layer
    from scio_recorder.recorder import Recorder

INDEX = "__index__"
"""The column of a shard holding each token's ``(row, column)``."""


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One stored layer: its name, its call, and what of the call is stored."""

    name: str
    row: Layer
    of_input: bool = False
    arg: int | str | None = None
    sparse: SparseLatents | None = None

    def describe(self) -> str:
        """Describe the call in words, for fingerprints and messages."""
        row = self.row
        what = "output" if not self.of_input else f"input {self.arg!r}"
        call = (
            f"{what} of `{row.name}` ({type(row.module).__name__}, call "
            f"{row.call_index}, {row.label_str})"
        )
        return (
            call if self.sparse is None else f"{self.sparse.describe()} of the {call}"
        )


def _name_of(selector: Any, row: Layer) -> str:
    label = as_label(selector)
    if label is not None:
        return label_str(label)
    if isinstance(selector, str):
        return selector
    if isinstance(selector, InputOf):
        base = _name_of(selector.selector, row)
        return f"{base}:input" + ("" if selector.arg is None else f".{selector.arg}")
    if (
        isinstance(selector, tuple)
        and len(selector) == 2  # noqa: PLR2004 (a name-call pair)
        and isinstance(selector[0], str)
    ):
        return f"{selector[0]}:{selector[1]}"
    return row.label_str


def _as_items(layers: object) -> list[tuple[str | None, Any]]:
    if isinstance(layers, Mapping):
        for name in layers:
            if not isinstance(name, str):
                msg = (
                    f"`layers` as a dict maps names to selectors; its key {name!r} "
                    "is not a str."
                )
                raise TypeError(msg)
        return list(layers.items())
    if isinstance(layers, list) or (
        isinstance(layers, tuple) and as_label(layers) is None
    ):
        return [(None, selector) for selector in layers]
    msg = (
        f"`layers` must be a list of selectors (e.g. `['transformer.h.0', "
        f"'transformer.h.5']`) or a dict {{name: selector}}, got {layers!r}."
    )
    raise TypeError(msg)


def resolve_layers(rnet: Recorder, layers: object) -> list[LayerSpec]:
    """Resolve ``layers=`` to one :class:`LayerSpec` per stored layer, checked.

    Each selector must pick exactly one call of the forward (a module called
    twice needs ``(name, k)`` or a label); names must be unique and are
    never the reserved column name.
    """
    items = _as_items(layers)
    if not items:
        msg = "`layers` is empty: give at least one layer to store."
        raise ValueError(msg)
    specs: list[LayerSpec] = []
    seen: dict[tuple[Any, ...], str] = {}
    for given, entry in items:
        sparse = entry if isinstance(entry, SparseLatents) else None
        selector = entry.layer if isinstance(entry, SparseLatents) else entry
        of_input = isinstance(selector, InputOf)
        target = selector.selector if isinstance(selector, InputOf) else selector
        row = resolve_one(
            rnet.table,
            rnet.net,
            target,
            "`layers`",
            hint="`layers=[{label}]`",
        )
        name = given if given is not None else _name_of(selector, row)
        if given is None and sparse is not None:
            name = f"{name}:latents"
        arg = selector.arg if isinstance(selector, InputOf) else None
        if name == INDEX or not name:
            msg = f"`layers`: {name!r} cannot name a layer (reserved or empty)."
            raise ValueError(msg)
        key = (row.label, of_input, arg, id(sparse))
        if key in seen or name in seen.values():
            other = seen.get(key, name)
            msg = (
                f"`layers`: {selector!r} stores the same call or name as {other!r}: "
                "give each call once, under its own name."
            )
            raise ValueError(msg)
        seen[key] = name
        specs.append(LayerSpec(name, row, of_input, arg, sparse))
    return specs


def describe_layers(specs: list[LayerSpec]) -> dict[str, str]:
    """Return the layers of a fingerprint: name -> the call in words."""
    return {spec.name: spec.describe() for spec in specs}


def first_tensor(value: object) -> object:
    """Return the tensor a record stands for: itself, or a tuple's first item."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, tuple | list) and value:
        return value[0]
    if isinstance(value, Mapping) and value:  # a model output
        return next(iter(value.values()))
    return value


def record_tensor(value: object, spec: LayerSpec) -> Tensor:
    """Return the ``[batch, positions, ...]`` tensor of a layer's record, checked."""
    record = first_tensor(value)
    if not isinstance(record, Tensor):
        msg = (
            f"Layer {spec.name!r} ({spec.describe()}) gives a "
            f"{type(record).__name__}, not a tensor: store a layer whose output "
            "is a `[batch, positions, ...]` tensor."
        )
        raise TypeError(msg)
    if record.dim() < 2:  # noqa: PLR2004 (batch, positions)
        msg = (
            f"Layer {spec.name!r} ({spec.describe()}) gives a tensor of shape "
            f"{list(record.shape)}, not [batch, positions, ...]: store a layer "
            "with one vector per token (a block, an MLP, an attention output, "
            "the input of an output projection)."
        )
        raise ValueError(msg)
    return record


def take(
    record: Tensor,
    keep: Tensor,
    spec: LayerSpec,
    dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor]:
    """Return one layer's kept rows ``[tokens, d]``: as recorded, and as stored.

    ``keep`` is the ``[batch, positions]`` mask of the tokens kept. The rows
    stored are cast to ``dtype`` (``None``: the record's); a cast that
    overflows (a finite value that becomes infinite) is refused, naming the
    layer.
    """
    if tuple(record.shape[:2]) != tuple(keep.shape):
        msg = (
            f"Layer {spec.name!r} ({spec.describe()}) gives a tensor of shape "
            f"{list(record.shape)}, not [batch, positions, ...] = "
            f"[{keep.shape[0]}, {keep.shape[1]}, ...] as the batch's tokens: store "
            "a layer with one vector per token."
        )
        raise ValueError(msg)
    rows = record[keep.to(record.device)]
    rows = rows.reshape(rows.shape[0], math.prod(record.shape[2:]))
    if dtype is None or dtype == rows.dtype:
        return rows, rows
    if not rows.is_floating_point():
        msg = (
            f"Layer {spec.name!r} ({spec.describe()}) records {rows.dtype} values, "
            f"which `dtype={dtype}` does not cast: pass `dtype=None` to keep them."
        )
        raise TypeError(msg)
    stored = rows.to(dtype)
    if not bool(torch.isfinite(stored).all()):
        overflow = torch.isinf(stored) & torch.isfinite(rows)
        if bool(overflow.any()):
            big = float(rows[overflow].abs().max())
            msg = (
                f"Layer {spec.name!r} ({spec.describe()}) holds values up to "
                f"{big:.4g} in magnitude, which overflow {dtype} (largest "
                f"{torch.finfo(dtype).max:.4g}): store it as `dtype=torch.bfloat16` "
                "(the range of float32) or `dtype=torch.float32`."
            )
            raise ValueError(msg)
    return rows, stored


def _padding_id(rnet: Recorder) -> int | None:
    """Return the config's padding token id, when it is not also BOS or EOS."""
    config = getattr(rnet.net, "config", None)
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int) or isinstance(pad, bool):
        return None
    special: list[object] = []
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        special.extend(value if isinstance(value, list | tuple) else [value])
    return None if pad in special else pad


def token_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """Return the ``[batch, positions]`` token ids among the arguments, if any."""
    ids = kwargs.get("input_ids")
    if isinstance(ids, Tensor):
        return ids
    for value in (*args, *kwargs.values()):
        if (
            isinstance(value, Tensor)
            and value.dim() == 2  # noqa: PLR2004 (batch, positions)
            and not value.is_floating_point()
            and value.dtype != torch.bool
        ):
            return value
    return None


_TUPLES = "input=lambda b: {'input_ids': b[0], 'attention_mask': b[1]}, mask=1"
"""The options for ``(ids, mask)`` batches: the model sees the mask too."""

_ACCEPTED = (
    "a batch is token ids: a tensor [batch, positions], or a "
    "mapping of the net's keyword inputs (a tokenizer's output, "
    "`{'input_ids': ..., 'attention_mask': ...}`); other forms with `input=` "
    f"(e.g. `{_TUPLES}` for (ids, mask) tuples)."
)


def check_batch(batch: object, index: int, input: Any) -> None:  # noqa: A002 (the documented name)
    """Refuse a batch that is not token ids, naming it and what is accepted.

    With ``input=None`` a batch is a tensor or a mapping; lists, strings,
    ``None``, numpy arrays and tuples (``(ids, mask)``: an ``input=`` that
    gives the model the mask too, and ``mask=1``) are named with the fix.
    With ``input=`` given, ``None`` and strings are refused; the rest is what
    ``input`` takes from it.
    """
    if isinstance(batch, Tensor | Mapping) or (
        input is not None and not isinstance(batch, str | bytes) and batch is not None
    ):
        return
    what = "None" if batch is None else f"a {type(batch).__name__}"
    if type(batch).__module__ == "numpy":
        what = f"a numpy {type(batch).__name__}"
    hint = ""
    if isinstance(batch, str | bytes):
        hint = " Tokenize the text first (`tokenizer(texts, return_tensors='pt')`)."
    elif isinstance(batch, list):
        hint = " Make a tensor of the ids (`torch.tensor(ids)`), or tokenize them."
    elif isinstance(batch, tuple):
        hint = (
            f" For (ids, mask) tuples pass `{_TUPLES}`: the model needs the mask too."
        )
    elif hasattr(batch, "__array__"):
        hint = " Convert it with `torch.as_tensor(batch)`."
    msg = f"Batch {index} is {what}: {_ACCEPTED}{hint}"
    raise TypeError(msg)


class Batches:
    """How a batch becomes the net's arguments and a mask of the tokens kept."""

    def __init__(  # noqa: PLR0913 (the write's options about batches)
        self,
        rnet: Recorder,
        *,
        input: Any,  # noqa: A002 (the documented name)
        mask: Any,
        skip_bos: bool,
        device: torch.device | None,
        position_ids: str | None = None,
    ) -> None:
        self.input = input
        self.get_input: Callable[[Any], Any] = batch_getter(input, "input")
        self.spread = callable(input) and not isinstance(input, int | str)
        self.mask = mask
        self.get_mask = None if mask is None else batch_getter(mask, "mask")
        self.skip_bos = skip_bos
        self.device = device
        self.padding_id = _padding_id(rnet)
        self.positions = Positions.of(rnet.net, position_ids)
        """Position ids from the padding mask (``write(position_ids=)``)."""
        self.rnet = rnet
        self.takes_mask = takes_argument(rnet.net, "attention_mask")
        """Whether the net's forward takes ``attention_mask``, and where."""

    def checked(
        self, batch: Any, index: int
    ) -> tuple[tuple[Any, ...], dict[str, Any], Tensor | None]:
        """Return batch ``index``'s arguments and padding mask, every check made.

        What a batch is (:meth:`arguments`), padding without a mask
        (:meth:`check_no_padding`), the mask's shape against the ids
        (:meth:`check_mask_shape`), and padding the net cannot see
        (:meth:`check_mask_seen`), before anything runs.
        """
        args, kwargs = self.arguments(batch, index)
        self.check_no_padding(args, kwargs, index)
        mask = self.padding_mask(batch, index)
        self.check_mask_shape(mask, args, kwargs, index)
        self.check_mask_seen(mask, args, kwargs, index)
        return args, kwargs, mask

    def check_mask_seen(
        self,
        mask: Tensor | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        index: int,
    ) -> None:
        """Refuse padding the net cannot see; watch a left-padded mask.

        ``mask`` chooses the tokens stored, and the net sees only what
        ``input=`` gives it (``write`` adds no input but position ids derived
        from an ``attention_mask`` the net is given). A mask that pads some
        row, when the net's forward takes an ``attention_mask`` and the
        batch gives it none, would let the model attend to the padding and
        shift the row's positions: refused, naming the fix. Where the net
        takes no ``attention_mask``, a left-padded mask is shown to the
        recorder's padding watch (a Hugging Face model inside the net that
        numbers positions from the padding is warned about once).
        """
        if mask is None or bool(mask.all()):
            return
        takes, where = self.takes_mask
        if argument("attention_mask", args, kwargs, where) is not None:
            return
        if not takes:
            watch_padding(self.rnet, {"attention_mask": mask})
            return
        net = type(self.rnet.net).__name__
        msg = (
            f"`mask={self.mask!r}` of batch {index} pads some rows, but the net's "
            f"inputs give {net} no `attention_mask`, which its forward takes: the "
            "model would attend to the padding (and number a left-padded row's "
            "tokens from it), so a padded row's activations would depend on it. "
            "Give the model the mask too, e.g. for (ids, mask) tuples "
            f"`{_TUPLES}` (`write` adds no input to the model's but position "
            "ids). If the mask's zeros are not padding (a choice of the tokens "
            "stored), give the model its own `attention_mask`."
        )
        raise ValueError(msg)

    def arguments(
        self, batch: Any, index: int
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Return the net's positional and keyword arguments for batch ``index``.

        The one check of what a batch is (:func:`check_batch`), before
        anything runs.
        """
        check_batch(batch, index, self.input)
        value = self.get_input(batch)
        spread = self.spread or (self.input is None and isinstance(value, Mapping))
        args, kwargs = as_arguments(value, spread=spread)
        if not any(isinstance(v, Tensor) for v in (*args, *kwargs.values())):
            msg = (
                f"Batch {index} gives the net no tensor (`input={self.input!r}` "
                f"took a {type(value).__name__} from it): {_ACCEPTED}"
            )
            raise TypeError(msg)
        return args, kwargs

    def move(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Return the arguments moved to ``device`` (as they are without one)."""
        if self.device is None:
            return args, kwargs
        return move_to(args, self.device), move_to(kwargs, self.device)

    @staticmethod
    def digest(
        previous: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        mask: Tensor | None,
    ) -> str:
        """Return the digest of the batches so far, given the previous one.

        It covers the tensors among the net's arguments and the mask (dtype,
        shape, values): a resumed write checks that the batches it skips are
        those it wrote.
        """
        hasher = hashlib.sha256(previous.encode())
        values = [*args, *(kwargs[key] for key in sorted(kwargs)), mask]
        for value in values:
            if isinstance(value, Tensor):
                flat = value.detach().to("cpu").contiguous().reshape(-1)
                hasher.update(f"{value.dtype}{list(value.shape)}".encode())
                hasher.update(flat.view(torch.uint8).numpy().tobytes())
        return hasher.hexdigest()

    def padding_mask(self, batch: Any, index: int) -> Tensor | None:
        """Return the batch's ``[batch, positions]`` mask (``None``: ``mask=None``)."""
        if self.get_mask is None:
            return None
        if isinstance(self.mask, str) and not isinstance(batch, Mapping):
            msg = (
                f"`mask={self.mask!r}` names an entry of the batch, but batch "
                f"{index} is a {type(batch).__name__}, which has none: pass "
                "`mask=None` to keep every token (no padding), or batches as "
                "dicts holding the mask (a tokenizer's output)."
            )
            raise TypeError(msg)
        if isinstance(self.mask, str) and self.mask not in batch:
            msg = (
                f"`mask={self.mask!r}`: batch {index} has no such entry (its keys "
                f"are {list(batch)}). Pass the name of the padding mask, or "
                "`mask=None` if no batch has padding."
            )
            raise KeyError(msg)
        value = self.get_mask(batch)
        if not isinstance(value, Tensor):
            value = torch.as_tensor(value)
        if value.dim() != 2:  # noqa: PLR2004 (batch, positions)
            msg = (
                f"`mask={self.mask!r}` of batch {index} has shape "
                f"{list(value.shape)}: a padding mask is [batch, positions]."
            )
            raise ValueError(msg)
        if value.dtype != torch.bool:
            if not bool(((value == 0) | (value == 1)).all()):
                msg = (
                    f"`mask={self.mask!r}` of batch {index} holds values other than "
                    "0 and 1: a padding mask is 1 (or True) for the tokens to keep "
                    "and 0 for padding."
                )
                raise ValueError(msg)
            value = value != 0
        return value

    def check_mask_shape(
        self,
        mask: Tensor | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        index: int,
    ) -> None:
        """Refuse a mask of another shape than the batch's token ids, before the pass.

        The net would fail on it with a bare error (a reshape inside the
        attention), or, where the net does not read it, :meth:`kept` would.
        """
        ids = token_ids(args, kwargs)
        if mask is None or ids is None or tuple(mask.shape) == tuple(ids.shape):
            return
        msg = (
            f"`mask={self.mask!r}` of batch {index} has shape {list(mask.shape)}, "
            f"but its token ids are {list(ids.shape)}: a padding mask has one "
            "entry per token id (the same rows and positions)."
        )
        raise ValueError(msg)

    def check_no_padding(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], index: int
    ) -> None:
        """Refuse ``mask=None`` on a batch holding the config's padding token."""
        if self.get_mask is not None or self.padding_id is None:
            return
        ids = token_ids(args, kwargs)
        if ids is not None and bool((ids == self.padding_id).any()):
            msg = (
                f"Batch {index} holds the padding token id {self.padding_id} "
                "(`config.pad_token_id`), but `mask=None` keeps every token, "
                "padding included: pass `mask='attention_mask'` with batches that "
                "hold the tokenizer's attention mask."
            )
            raise ValueError(msg)

    def kept(self, mask: Tensor | None, shape: tuple[int, int], index: int) -> Tensor:
        """Return the ``[batch, positions]`` mask of the tokens stored."""
        if mask is None:
            keep = torch.ones(shape, dtype=torch.bool)
        elif tuple(mask.shape) != shape:
            msg = (
                f"`mask={self.mask!r}` of batch {index} has shape "
                f"{list(mask.shape)}, but the batch's tokens are {list(shape)} "
                "(the layers' first two dimensions): give the mask of these inputs."
            )
            raise ValueError(msg)
        else:
            keep = mask
        if self.skip_bos:
            keep = keep & (keep.cumsum(1) != 1)
        return keep


def pick(value: Any, spec: LayerSpec) -> Any:
    """Return the argument of a recorded call that an ``InputOf`` layer stores."""
    return pick_argument(value, spec.arg, spec.describe(), option="InputOf(..., arg=)")
