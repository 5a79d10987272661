"""The one walk over nested values: ``scio_recorder._support.tree``."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.modeling_outputs import BaseModelOutput

from scio_recorder._support.tree import iter_tensors, map_tensors, tensor_items

Pair = collections.namedtuple("Pair", "a b")  # noqa: PYI024 (a plain namedtuple on purpose)


class Ordered(collections.OrderedDict):  # type: ignore[type-arg]
    """An OrderedDict subclass (pytree would treat it as a leaf)."""


@dataclasses.dataclass
class Box:
    x: Any
    y: Any = None


@dataclasses.dataclass(frozen=True)
class FrozenBox:
    x: Any
    y: Any = None


@dataclasses.dataclass
class Doubling:
    """A dataclass whose ``__post_init__`` must not run again on a rebuild."""

    x: Any

    def __post_init__(self) -> None:
        if isinstance(self.x, int):
            self.x *= 2


tensors = st.integers(1, 3).map(torch.randn)
leaves = st.one_of(
    tensors, st.none(), st.integers(-5, 5), st.text(max_size=3), st.just(Doubling(3))
)


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text("abcd", min_size=1, max_size=2)
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.builds(Pair, children, children),
        st.dictionaries(keys, children, max_size=3),
        st.dictionaries(keys, children, max_size=3).map(collections.OrderedDict),
        st.dictionaries(keys, children, max_size=3).map(Ordered),
        st.builds(Box, children, children),
        st.builds(FrozenBox, children, children),
        # A model output's first field is a tensor (its constructor reads
        # anything else as key/value pairs).
        st.builds(BaseModelOutput, tensors, children, children),
    )


values = st.recursive(leaves, containers, max_leaves=12)


def plus_one(tensor: torch.Tensor) -> torch.Tensor:
    return tensor + 1


def assert_mapped(before: Any, after: Any) -> None:
    """``after`` is ``before`` with every tensor +1, same types, other leaves kept."""
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor)
        assert after is not before
        assert torch.equal(after, before + 1)
        return
    assert type(after) is type(before)
    if dataclasses.is_dataclass(before):
        assert after is not before
        for field in dataclasses.fields(before):
            assert_mapped(getattr(before, field.name), getattr(after, field.name))
        if isinstance(before, dict):  # a model output: items are its fields
            assert list(after.keys()) == list(before.keys())
            for key in after:
                assert after[key] is getattr(after, key)
        return
    if isinstance(before, dict):
        assert after is not before
        assert list(after.keys()) == list(before.keys())
        for key in before:
            assert_mapped(before[key], after[key])
        return
    if isinstance(before, list | tuple):
        assert len(after) == len(before)
        for x, y in zip(before, after, strict=True):
            assert_mapped(x, y)
        return
    assert after is before  # any other leaf is the very object


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_map_tensors_rebuilds_the_structure_with_fn_on_every_tensor(value: Any) -> None:
    """Same types and shape; ``fn`` on every tensor; nothing else touched."""
    found = list(iter_tensors(value))
    seen: list[torch.Tensor] = []

    def fn(tensor: torch.Tensor) -> torch.Tensor:
        seen.append(tensor)
        return plus_one(tensor)

    mapped = map_tensors(fn, value)
    assert_mapped(value, mapped)
    # Every tensor once, in iteration order; the input is left as it was.
    assert [id(t) for t in seen] == [id(t) for t in found]
    assert [id(t) for t in iter_tensors(value)] == [id(t) for t in found]
    # Paths lead to the tensors.
    for path, tensor in tensor_items(value):
        node = value
        for key in path:
            node = (
                getattr(node, key) if dataclasses.is_dataclass(node) else node[key]  # type: ignore[index]
            )
        assert node is tensor
    assert [id(t) for _, t in tensor_items(value)] == [id(t) for t in found]


def test_other_containers_keep_their_type() -> None:
    """defaultdict keeps its factory, struct sequences and UserDict their type."""
    x = torch.ones(2)
    factory = collections.defaultdict(list, {"a": x})
    out = map_tensors(plus_one, factory)
    assert type(out) is collections.defaultdict
    assert out.default_factory is list
    assert torch.equal(out["a"], x + 1)
    assert factory["a"] is x

    maxed = torch.max(torch.tensor([[1.0, 3.0]]), dim=1)
    out_max = map_tensors(plus_one, maxed)
    assert type(out_max) is type(maxed)
    assert torch.equal(out_max.values, maxed.values + 1)

    user = collections.UserDict({"a": x})
    out_user = map_tensors(plus_one, user)
    assert type(out_user) is collections.UserDict
    assert torch.equal(out_user["a"], x + 1)
    assert user["a"] is x


def test_model_output_rebuild_keeps_missing_fields_out_of_the_dict() -> None:
    """A ModelOutput's None fields stay None and out of its keys."""
    out = BaseModelOutput(last_hidden_state=torch.zeros(1), attentions=(torch.ones(1),))
    mapped = map_tensors(plus_one, out)
    assert list(mapped.keys()) == ["last_hidden_state", "attentions"]
    assert mapped.hidden_states is None
    assert mapped.to_tuple()[0] is mapped.last_hidden_state
    assert [path for path, _ in tensor_items(out)] == [
        ("last_hidden_state",),
        ("attentions", 0),
    ]
