"""What every explanation shares: the net's inputs, layers by call, edits.

* the inputs: :func:`arguments` reads the one form every public function
  takes (a tensor, a tuple, a mapping, a :class:`CallInputs`), and
  :func:`run_net` calls the recorder on it;
* the layers: :func:`select_calls` and :func:`select_calls_in_order` turn
  selectors into call labels, :func:`in_call_order` orders edits as the
  calls end (a list of postprocessors is consumed in that order);
* the passes: :func:`run_keeping` (one pass keeping copies of some calls'
  outputs), :func:`run_edited` (one pass with edits, through
  ``activation_postproc``), :func:`put` (a part of a tensor replaced);
* the residual stream of a block: :func:`stream_of`, :func:`with_stream`,
  :func:`check_like`, :func:`grid_columns`;
* the arguments, checked before the first pass and named in the message:
  :func:`check_recorder`, :func:`check_pair` (clean and corrupted inputs of
  one batch), :func:`as_positions` and :func:`check_positions` (positions
  as ints, in range), :func:`check_callable`, :func:`check_flag`,
  :func:`check_max_batch`, :func:`check_where`; :func:`one_number`, the
  check of what a user's metric returns;
* :func:`find_module`: the final norm or the unembedding, named or found by
  their usual names (the logit lens, ``patch_sweep``'s ``read_at``).
"""

from __future__ import annotations

__all__ = [
    "arguments",
    "as_positions",
    "batch_of",
    "check_callable",
    "check_flag",
    "check_like",
    "check_max_batch",
    "check_pair",
    "check_positions",
    "check_recorder",
    "check_where",
    "find_module",
    "grid_columns",
    "in_call_order",
    "one_number",
    "put",
    "run_edited",
    "run_keeping",
    "run_net",
    "select_calls",
    "select_calls_in_order",
    "stream_of",
    "with_stream",
]

import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scio_recorder._run.batches import Positions, as_arguments, first_batch_size
from scio_recorder.recorder import Recorder
from scio_recorder.select import resolve, resolve_one

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.select import Selector


def arguments(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the positional and keyword arguments that ``inputs`` stands for.

    The convention of a callable ``input=`` of
    :func:`~scio_recorder.collect.collect`
    (:func:`scio_recorder._run.batches.as_arguments`): a :class:`CallInputs` is
    both; a tuple the positional arguments; a mapping (``BatchEncoding``
    too) the keyword arguments; anything else the one positional argument.
    """
    return as_arguments(inputs, spread=True)


def run_net(rnet: Recorder, inputs: Any, **options: Any) -> Any:
    """Call ``rnet`` on ``inputs`` (see :func:`arguments`) with ``options``.

    A padded batch of a net that takes ``position_ids`` gets them from its
    ``attention_mask`` when it has none (see
    :class:`~scio_recorder._run.batches.Positions`): a row's explanation does
    not depend on its padding.
    """
    args, kwargs = Positions.of(rnet.net).add(*arguments(inputs))
    clash = sorted(kwargs.keys() & {"activation_postproc", "dont_record"})
    if clash:
        msg = (
            f"the net's keyword inputs name {clash}, an option of the recorder: "
            "rename the net's argument."
        )
        raise ValueError(msg)
    return rnet(*args, **kwargs, **options)


def one_number(value: Any, who: str, name: str) -> Tensor:
    """Check that ``value`` (what ``name`` returned) is one number."""
    if isinstance(value, Tensor) and value.numel() == 1:
        return value.reshape(())
    msg = (
        f"{who}: `{name}` returned {_shown(value)}; it must return one number as a "
        "tensor, e.g. `lambda out: out.logits[:, -1, 7].sum()` or "
        "`lambda out: out.loss` (with `labels` among the inputs)."
    )
    raise ValueError(msg)


def select_calls(
    rnet: Recorder, layers: Selector | list[Selector], who: str
) -> list[DepthIdx]:
    selectors = layers if isinstance(layers, list) else [layers]
    rows = resolve(rnet.table, rnet.net, selectors)
    if not rows:
        raise ValueError(_selects_nothing(layers, who))
    return [row.label for row in rows]


def select_calls_in_order(
    rnet: Recorder, layers: Selector | Sequence[Selector], who: str
) -> list[DepthIdx]:
    """Return the calls ``layers`` select, in the order given, without repeats.

    Each selector's calls come in table order: the rows of a grid.
    """
    selectors = list(layers) if isinstance(layers, list | range) else [layers]
    if not selectors:
        raise ValueError(_selects_nothing(layers, who))
    found: list[DepthIdx] = []
    for selector in selectors:
        for label in select_calls(rnet, [selector], who):
            if label not in found:
                found.append(label)
    return found


def _selects_nothing(layers: object, who: str) -> str:
    return (
        f"{who}: `layers={layers!r}` selects no layer: name at least one, by "
        "label, name or type; see `print(rnet)` for the labels."
    )


def in_call_order(
    rnet: Recorder, edits: Mapping[DepthIdx, Callable[[Any], Any]]
) -> list[Callable[[Any], Any]]:
    """Return the postprocessors as a list, in the order the recorded calls end.

    A list of postprocessors is consumed in that order, which the table knows
    from the reference pass.
    """
    order = sorted(edits, key=lambda label: rnet.table[label].end_order or 0)
    return [edits[label] for label in order]


def stream_of(rnet: Recorder, label: DepthIdx, value: Any, who: str) -> Tensor:
    """Return the tensor a call passes on: its output, or its output's first item.

    Blocks of older Hugging Face models return ``(hidden_states, ...)``.
    """
    if isinstance(value, Tensor):
        return value
    if isinstance(value, tuple | list) and value and isinstance(value[0], Tensor):
        first: Tensor = value[0]
        return first
    msg = (
        f"{who}: layer {rnet.table[label].describe()} outputs a "
        f"{type(value).__name__}, not a tensor nor a tuple starting with one: "
        "name a layer whose output is the residual stream, e.g. a block."
    )
    raise TypeError(msg)


def with_stream(value: Any, stream: Tensor) -> Any:
    """Return ``value`` with its stream (see :func:`stream_of`) replaced."""
    if isinstance(value, Tensor):
        return stream
    return type(value)([stream, *value[1:]])


def put(output: Tensor, values: Tensor, where: Any) -> Tensor:
    """Return ``values``, or ``output`` with ``values[where]`` put at ``where``."""
    if where is None:
        return values
    edited = output.clone()
    edited[where] = values[where]
    return edited


def run_keeping(
    rnet: Recorder, inputs: Any, labels: Sequence[DepthIdx], **options: Any
) -> tuple[Any, dict[DepthIdx, Any]]:
    """Run ``inputs`` once; return the output and copies of ``labels``' outputs."""
    with rnet.selecting(*labels, clone=True, detach=True), torch.no_grad():
        output = run_net(rnet, inputs, **options)
        return output, {label: rnet.activations[label] for label in labels}


def run_edited(
    rnet: Recorder, target: Any, edits: dict[DepthIdx, Callable[[Any], Any]]
) -> Any:
    """Run ``target`` with ``edits`` applied to the outputs of their labels."""
    with rnet.selecting(*edits), torch.no_grad():
        return run_net(rnet, target, activation_postproc=in_call_order(rnet, edits))


def check_like(
    rnet: Recorder, label: DepthIdx, got: Tensor, want: Tensor, who: str
) -> None:
    if got.shape[1:] != want.shape[1:]:
        msg = (
            f"{who}: layer {rnet.table[label].describe()} outputs "
            f"{list(got.shape)} on the corrupted input and {list(want.shape)} on "
            "the clean one: pass inputs of the same length (pad them, with an "
            "`attention_mask`)."
        )
        raise ValueError(msg)


def grid_columns(
    rnet: Recorder,
    positions: list[int] | None,
    streams: Mapping[DepthIdx, Tensor],
    who: str,
) -> list[int]:
    """Return the grid's columns: ``positions``, checked against every stream.

    Default every position (dimension 1) of the first layer's stream.
    """
    for label, stream in streams.items():
        where = f"layer {rnet.table[label].describe()}'s output {list(stream.shape)}"
        if stream.dim() < 2:  # noqa: PLR2004 ([batch, positions, ...])
            msg = (
                f"{who}: {where} has no position dimension (dimension 1): name "
                "layers whose outputs are [batch, positions, ...], e.g. blocks."
            )
            raise ValueError(msg)
        if positions is not None:
            check_positions(positions, stream.shape[1], "positions", who, where)
    if positions is not None:
        return positions
    return list(range(next(iter(streams.values())).shape[1]))


_NORMS = (
    "transformer.ln_f",  # GPT-2, GPT-J
    "model.norm",  # Llama, Mistral, Qwen, Gemma
    "gpt_neox.final_layer_norm",  # Pythia
    "model.decoder.final_layer_norm",  # OPT
    "transformer.norm_f",
    "ln_final",  # TransformerLens
)


_UNEMBEDS = ("lm_head", "embed_out", "unembed")


def find_module(
    rnet: Recorder, chosen: nn.Module | Selector | None, role: str, who: str
) -> nn.Module:
    """Return the final norm or the unembedding (``role``): the user's, or found.

    Found by its usual names, then (the unembedding) Hugging Face's
    ``get_output_embeddings()``, or (the norm) the last ``*Norm`` called.
    """
    names = _NORMS if role == "norm" else _UNEMBEDS
    if isinstance(chosen, nn.Module):
        return chosen
    if chosen is not None:
        row = resolve_one(rnet.table, rnet.net, chosen, f"{who}: `{role}=`")
        return row.module
    net = rnet.net
    modules: dict[str, nn.Module] = dict(net.named_modules())
    for name in names:
        if name in modules:
            return modules[name]
    getter = getattr(net, "get_output_embeddings", None)
    if role == "unembed" and callable(getter):
        found = getter()  # Hugging Face's unembedding
        if isinstance(found, nn.Module):
            return found
    if role == "norm":  # the last norm called: the final one of a transformer
        rows = [
            row
            for row in rnet.table.values()
            if type(row.module).__name__.endswith("Norm") and row.end_order is not None
        ]
        if rows:
            return max(rows, key=lambda row: row.end_order or 0).module
    example = {"norm": '"transformer.ln_f"', "unembed": '"lm_head"'}[role]
    msg = (
        f"{who}: found no {role} module in {type(net).__name__} (looked for "
        f"{', '.join(names)}"
        + (", then the last *Norm called" if role == "norm" else "")
        + f"): name it, e.g. `{role}={example}` (a name, label or any selector "
        f"of one call, or a module)"
        + (", or `norm=torch.nn.Identity()` for none." if role == "norm" else ".")
    )
    raise ValueError(msg)


# -- the arguments ------------------------------------------------------------


def check_recorder(rnet: object, who: str) -> None:
    """Refuse anything but a :class:`~scio_recorder.Recorder` as ``rnet``."""
    if not isinstance(rnet, Recorder):
        msg = (
            f"{who}: `rnet` must be a Recorder wrapping the net, got a "
            f"{type(rnet).__name__}: wrap it first, e.g. `rnet = "
            "Recorder(net, input_size=(1, 3, 32, 32))` or `Recorder(model, "
            'input_data={"input_ids": ids})`.'
        )
        raise TypeError(msg)


def check_callable(value: object, name: str, who: str, example: str) -> None:
    """Refuse a ``name=`` that is not callable, showing ``example``."""
    if not callable(value):
        msg = (
            f"{who}: `{name}` must be a function of the net's output, got "
            f"{_shown(value)}: e.g. `{name}={example}`."
        )
        raise TypeError(msg)


def check_flag(value: object, name: str, who: str) -> None:
    """Refuse a ``name=`` that is not ``True`` or ``False``."""
    if not isinstance(value, bool):
        msg = f"{who}: `{name}` must be True or False, got {_shown(value)}."
        raise TypeError(msg)


def batch_of(inputs: Any, name: str, who: str) -> int:
    """Return the batch size of ``inputs`` (dim 0 of its first tensor), or raise."""
    size = first_batch_size(*arguments(inputs))
    if size is not None:
        return size
    msg = (
        f"{who}: `{name}` holds no tensor with a batch dimension "
        f"({_shown(inputs)}); pass a tensor, a tuple of positional arguments "
        "or a mapping of keyword arguments (e.g. a tokenizer's output)."
    )
    raise ValueError(msg)


def check_pair(first: Any, second: Any, names: tuple[str, str], who: str) -> int:
    """Check that two inputs to compare have one batch size; return it."""
    sizes = [
        batch_of(value, name, who)
        for value, name in zip((first, second), names, strict=True)
    ]
    if sizes[0] != sizes[1]:
        msg = (
            f"{who}: `{names[0]}` has a batch of {sizes[0]} and `{names[1]}` of "
            f"{sizes[1]}: pass inputs of one batch size, the i-th "
            f"`{names[0]}` sample paired with the i-th `{names[1]}` one."
        )
        raise ValueError(msg)
    return sizes[0]


def as_positions(value: Any, name: str, who: str) -> list[int] | None:
    """Return ``value`` (``None`` or an iterable of ints) as a list, or raise.

    The range is checked where the length is known (:func:`check_positions`).
    """
    if value is None:
        return None
    hint = f"e.g. `{name}=[3]` for one position, or `{name}=range(2, 6)`"
    if isinstance(value, int | str | bytes) or (
        isinstance(value, Tensor) and value.dim() == 0
    ):
        msg = f"{who}: `{name}` must be an iterable of ints, got {value!r}: {hint}."
        raise TypeError(msg)
    try:
        items = list(value)
    except TypeError:
        msg = (
            f"{who}: `{name}` must be an iterable of ints, got {_shown(value)}: {hint}."
        )
        raise TypeError(msg) from None
    wrong = [item for item in items if not _is_index(item)]
    if wrong:
        msg = (
            f"{who}: `{name}` holds {wrong[0]!r}, not an int: give positions as "
            f"ints, {hint}."
        )
        raise TypeError(msg)
    kept = [operator.index(item) for item in items]
    if not kept:
        msg = (
            f"{who}: `{name}` is empty: give at least one position, or leave "
            f"`{name}=None` for every position."
        )
        raise ValueError(msg)
    return kept


def _is_index(item: Any) -> bool:
    """Whether ``item`` is an int (an integer 0-d tensor, a NumPy int), not a bool."""
    if isinstance(item, bool):
        return False
    try:
        operator.index(item)
    except TypeError:
        return False
    return True


def check_positions(
    positions: list[int], length: int, name: str, who: str, where: str
) -> None:
    """Refuse a position outside ``[-length, length)`` (``where`` says of what)."""
    bad = [p for p in positions if not -length <= p < length]
    if bad:
        shown = bad[0] if len(bad) == 1 else bad
        msg = (
            f"{who}: `{name}` holds {shown}, out of range for the {length} "
            f"positions of {where}: give indices from {-length} to {length - 1}."
        )
        raise ValueError(msg)


def check_max_batch(max_batch: object, batch: int, who: str) -> None:
    """Refuse a ``max_batch`` that is not ``None`` nor an int of at least ``batch``."""
    if max_batch is None:
        return
    if not isinstance(max_batch, int) or isinstance(max_batch, bool):
        msg = (
            f"{who}: `max_batch` must be an int (the most rows in one pass) or "
            f"None, got {_shown(max_batch)}."
        )
        raise TypeError(msg)
    if max_batch < batch:
        msg = (
            f"{who}: `max_batch={max_batch}` is below the batch size {batch} of "
            "the inputs: allow at least one copy of the batch."
        )
        raise ValueError(msg)


def check_where(where: Any, value: Tensor, who: str, layer: str) -> None:
    """Refuse a ``where`` that does not index ``value`` (``layer``'s output)."""
    if where is None:
        return
    try:
        value[where]
    except (IndexError, TypeError, ValueError, RuntimeError) as error:
        msg = (
            f"{who}: `where={where!r}` does not index the output "
            f"{list(value.shape)} of layer {layer} ({error}): give an index of "
            "that shape, e.g. `where=(slice(None), 3)` for position or channel "
            "3 of every sample."
        )
        raise ValueError(msg) from None


def _shown(value: object) -> str:
    """Describe ``value`` in a message: a tensor by its shape, else its type."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return f"a {type(value).__name__}"
