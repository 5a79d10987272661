"""`scio_recorder._batches`: inputs out of batches, (args, kwargs), device moves."""

from __future__ import annotations

import collections
import dataclasses

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from scio_recorder import CallInputs
from scio_recorder._batches import (
    as_arguments,
    batch_getter,
    first_batch_size,
    move_to,
)

Pair = collections.namedtuple("Pair", ["a", "b"])  # noqa: PYI024 (a test batch)


@dataclasses.dataclass
class Output:
    logits: object
    extra: object


def leaves(draw_rows):
    return st.one_of(
        draw_rows.map(lambda n: torch.arange(n * 2.0).reshape(n, 2)),
        st.integers(-3, 3),
        st.none(),
        st.text(max_size=3),
    )


ROWS = st.integers(1, 4)


def nests(rows=ROWS):
    return st.recursive(
        leaves(rows),
        lambda inner: st.one_of(
            st.tuples(inner, inner),
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from("xyz"), inner, max_size=3),
            st.builds(Pair, inner, inner),
            st.builds(Output, inner, inner),
        ),
        max_leaves=8,
    )


def same_structure(a, b, device):
    """`b` is `a` with every tensor moved to `device` and nothing else changed."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and b.device == device
            and b.shape == a.shape
            and b.dtype == a.dtype
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(
            same_structure(a[k], b[k], device) for k in a
        )
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(
            same_structure(x, y, device) for x, y in zip(a, b, strict=True)
        )
    if dataclasses.is_dataclass(a):
        return all(
            same_structure(getattr(a, f.name), getattr(b, f.name), device)
            for f in dataclasses.fields(a)
        )
    return a == b


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(nests())
def test_move_to_moves_every_tensor_and_keeps_every_type(value):
    meta = torch.device("meta")
    assert same_structure(value, move_to(value, meta), meta)


@settings(max_examples=80, deadline=None)
@given(nests(), st.booleans())
def test_as_arguments_spreads_only_what_a_callable_returned(value, spread):
    """Spread: tuple -> args, mapping -> kwargs; otherwise one argument."""
    args, kwargs = as_arguments(value, spread=spread)
    if spread and isinstance(value, tuple):
        assert args is value
        assert kwargs == {}
    elif spread and isinstance(value, dict):
        assert args == ()
        assert kwargs == value
    else:
        assert args == (value,) or args[0] is value
        assert kwargs == {}


@settings(max_examples=50, deadline=None)
@given(nests(), st.dictionaries(st.sampled_from("xyz"), nests(), max_size=2))
def test_call_inputs_are_args_and_kwargs_with_or_without_spread(args, kwargs):
    call = CallInputs((args,), kwargs)
    for spread in (True, False):
        got = as_arguments(call, spread=spread)
        assert got[0] == (args,) or got[0][0] is args
        assert got[1].keys() == kwargs.keys()


@settings(max_examples=80, deadline=None)
@given(st.lists(nests(), max_size=3), st.integers(1, 4))
def test_first_batch_size_is_dim_0_of_the_first_batched_tensor(values, rows):
    values = [*values, torch.zeros(rows, 1)]
    expected = next(
        v.shape[0] for v in values if isinstance(v, torch.Tensor) and v.dim() >= 1
    )
    assert first_batch_size(tuple(values), {}) == expected
    assert first_batch_size((), dict(enumerate(map(str, values)))) is None
    assert first_batch_size((), {"k": torch.zeros(rows, 2)}) == rows


def test_getters_name_the_option_and_what_to_do():
    take = batch_getter(2, "target")
    with pytest.raises(ValueError, match=r"^`target=2`: cannot take item 2 .* Pass"):
        take((1, 2))
    with pytest.raises(TypeError, match=r"^`input=0` takes item 0 .* `input=None`"):
        batch_getter(0, "input")(torch.zeros(2))
    with pytest.raises(KeyError, match=r"`input='x'`: the batch has no such key"):
        batch_getter("x", "input")({"y": 1})
    with pytest.raises(TypeError, match=r"^`input` must be an int, a str, a callable"):
        batch_getter(True, "input")
    assert batch_getter(None, "input")(5) == 5


def test_explain_and_collect_share_the_convention():
    """explain's inputs follow as_arguments with spread (one definition)."""
    from scio_recorder.explain._base import arguments  # noqa: PLC0415 (the user checked)

    mapping = {"ids": torch.zeros(2, 3)}
    assert arguments(mapping) == as_arguments(mapping, spread=True)
    call = CallInputs((torch.zeros(1),), {"m": 1})
    assert arguments(call) == as_arguments(call, spread=False)
