"""What every explanation shares: the net's inputs, layers by call, edits.

* the inputs: :func:`arguments` reads the one form every public function
  takes (a tensor, a tuple, a mapping, a :class:`CallInputs`), and
  :func:`run_net` calls the recorder on it;
* the layers: :func:`select_calls` and :func:`select_calls_in_order` turn
  selectors into call labels, :func:`in_call_order` orders edits as the
  calls end (a list of postprocessors is consumed in that order);
* the edits: :func:`put` (a part of a tensor replaced), :func:`run_edited`
  (one pass with edits, through ``activation_postproc``);
* the residual stream of a block: :func:`stream_of`, :func:`with_stream`,
  :func:`check_like`, :func:`position_list`;
* :func:`one_number`: the check of what a user's metric returns;
* :func:`find_module`: the final norm or the unembedding, named or found by
  their usual names (the logit lens, ``patch_sweep``'s ``read_at``).
"""

from __future__ import annotations

__all__ = [
    "arguments",
    "check_like",
    "find_module",
    "in_call_order",
    "one_number",
    "position_list",
    "put",
    "run_edited",
    "run_net",
    "select_calls",
    "select_calls_in_order",
    "stream_of",
    "with_stream",
]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scio_recorder._batches import as_arguments
from scio_recorder.select import resolve, resolve_one

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector


def arguments(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Return the positional and keyword arguments that ``inputs`` stands for.

    The convention of a callable ``input=`` of
    :func:`~scio_recorder.collect.collect`
    (:func:`scio_recorder._batches.as_arguments`): a :class:`CallInputs` is
    both; a tuple the positional arguments; a mapping (``BatchEncoding``
    too) the keyword arguments; anything else the one positional argument.
    """
    return as_arguments(inputs, spread=True)


def run_net(rnet: Recorder, inputs: Any, **options: Any) -> Any:
    """Call ``rnet`` on ``inputs`` (see :func:`arguments`) with ``options``."""
    args, kwargs = arguments(inputs)
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
    shown = (
        f"a tensor of shape {list(value.shape)}"
        if isinstance(value, Tensor)
        else repr(value)
        if value is None
        else f"a {type(value).__name__}"
    )
    msg = (
        f"{who}: `{name}` returned {shown}; it must return one number as a "
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
        msg = f"{who}: {layers!r} selects no layer; see `print(rnet)` for the labels."
        raise ValueError(msg)
    return [row.label for row in rows]


def select_calls_in_order(
    rnet: Recorder, layers: Selector | Sequence[Selector], who: str
) -> list[DepthIdx]:
    """Return the calls ``layers`` select, in the order given, without repeats.

    Each selector's calls come in table order: the rows of a grid.
    """
    selectors = list(layers) if isinstance(layers, list | range) else [layers]
    found: list[DepthIdx] = []
    for selector in selectors:
        for label in select_calls(rnet, [selector], who):
            if label not in found:
                found.append(label)
    return found


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


def run_edited(
    rnet: Recorder,
    target: Any,
    edits: dict[DepthIdx, Callable[[Tensor], Tensor]],
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


def position_list(positions: Iterable[int] | None, length: int) -> list[int]:
    return list(range(length)) if positions is None else [int(p) for p in positions]


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
