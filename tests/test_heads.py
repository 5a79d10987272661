"""`heads`: head edits against slicing by hand, and every argument checked at the call.

The edits' effect on real attention (GPT-2, Llama with grouped-query
attention) is tested against pre-hooks in ``tests/test_transformers.py``;
here, the functions themselves and what they refuse.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.heads import head_count, heads_view, scale_heads, zero_heads


@settings(max_examples=40, deadline=None)
@given(
    num_heads=st.integers(1, 5),
    size=st.integers(1, 3),
    factors=st.dictionaries(
        st.integers(0, 4), st.floats(-3, 3, allow_nan=False), max_size=5
    ),
)
def test_scale_heads_multiplies_each_heads_slice(num_heads, size, factors):
    """Head h is the slice ``[h * size, (h + 1) * size)`` of the last dimension."""
    factors = {h: f for h, f in factors.items() if h < num_heads}
    x = torch.arange(2.0 * num_heads * size).reshape(2, num_heads * size) - 3
    want = x.clone()
    for head, factor in factors.items():
        # float32 of the factor, times each value: the one rounding the edit does
        scale = torch.tensor(factor, dtype=x.dtype)
        want[:, head * size : (head + 1) * size] = (
            x[:, head * size : (head + 1) * size] * scale
        )
    got = scale_heads(factors, num_heads)(x)
    assert torch.equal(got, want)
    assert torch.equal(x, torch.arange(2.0 * num_heads * size).reshape(2, -1) - 3)
    zeroed = zero_heads(list(factors), num_heads)(x)
    for head in range(num_heads):
        part = zeroed[:, head * size : (head + 1) * size]
        whole = x[:, head * size : (head + 1) * size]
        assert torch.equal(part, torch.zeros_like(whole) if head in factors else whole)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: scale_heads({1.5: 0.0}, 4),
            TypeError,
            (
                "scale_heads: head 1.5 (a key of `factors`) is not an int: give head "
                "indices from 0 to 3."
            ),
        ),
        (
            lambda: scale_heads({4: 0.0}, 4),
            ValueError,
            (
                "scale_heads: head 4 (a key of `factors`) does not exist: there are 4 "
                "heads, 0 to 3."
            ),
        ),
        (
            lambda: scale_heads({-1: 0.0}, 4),
            ValueError,
            "scale_heads: head -1 (a key of `factors`) does not exist",
        ),
        (
            lambda: scale_heads({True: 0.0}, 4),
            TypeError,
            "scale_heads: head True (a key of `factors`) is not an int",
        ),
        (
            lambda: scale_heads({1: "0.5"}, 4),
            TypeError,
            (
                "scale_heads: `factors[1]` is '0.5', not a number: give each head's "
                "scale as a float, e.g. `{1: 0.5}`."
            ),
        ),
        (
            lambda: scale_heads({1: float("nan")}, 4),
            ValueError,
            "scale_heads: `factors[1]` is nan: a scale must be finite",
        ),
        (
            lambda: scale_heads([0.5, 1.0], 2),
            TypeError,
            (
                "scale_heads: `factors` must be a mapping from head to scale, got "
                "[0.5, 1.0]: e.g. `scale_heads({1: 0.5}, num_heads=2)` halves head 1."
            ),
        ),
        (
            lambda: scale_heads({0: 0.5}, 2.0),
            TypeError,
            (
                "scale_heads: `num_heads` must be an int, got 2.0: give the number of "
                "query heads (`head_count(rnet, selector)` reads it)."
            ),
        ),
        (
            lambda: scale_heads({}, 0),
            ValueError,
            "scale_heads: `num_heads=0`: there is at least one head.",
        ),
        (
            lambda: zero_heads(1, 4),
            TypeError,
            (
                "zero_heads: `heads` must be an iterable of head indices, got 1: e.g. "
                "`zero_heads([1], num_heads=4)`."
            ),
        ),
        (
            lambda: zero_heads([0, 4], 4),
            ValueError,
            "zero_heads: head 4 (in `heads`) does not exist: there are 4 heads",
        ),
        (
            lambda: zero_heads(["0"], 4),
            TypeError,
            "zero_heads: head '0' (in `heads`) is not an int",
        ),
        (
            lambda: heads_view(torch.zeros(2, 8), 1.5),
            TypeError,
            "heads_view: `num_heads` must be an int, got 1.5",
        ),
        (
            lambda: heads_view([1.0, 2.0], 2),
            TypeError,
            "heads_view: `x` must be a tensor [..., heads * head_size], got list",
        ),
        (
            lambda: head_count(nn.Linear(2, 2), "0"),
            TypeError,
            "head_count: `rnet` must be a Recorder wrapping the model, got a Linear",
        ),
    ],
)
def test_every_argument_is_checked_at_the_call(call, error, message):
    """Refused when the edit is made, naming the argument, not at the first pass."""
    with pytest.raises(error, match=f"^{re.escape(message)}"):
        call()


def test_head_count_reads_the_enclosing_module_or_says_to_give_it():
    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_heads = 2
            self.out = nn.Linear(4, 4)

        def forward(self, x):
            return self.out(x)

    net = nn.Sequential(Attention(), nn.Linear(4, 4))
    rnet = Recorder(net, input_size=(1, 4))
    assert head_count(rnet, "0.out") == 2
    msg = (
        "No module enclosing 1-2 (Linear `1`) says how many heads it has (none "
        "of num_heads, num_attention_heads, n_head, n_heads, on the module or "
        "its `config`): give `num_heads=` yourself."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        head_count(rnet, "1")
