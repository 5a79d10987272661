"""Tests of `scio_recorder.io`: saving and loading records as safetensors."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest
import safetensors
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import scio_recorder
from scio_recorder import Recorder
from scio_recorder.io import (
    DEFAULT_FILENAME,
    FORMAT_VERSION,
    MAX_NESTING,
    RecordInfo,
    RecordKey,
    Records,
    load_records,
    save_records,
)

if TYPE_CHECKING:
    from pathlib import Path

ADVICE = (
    "Rebuild the Recorder with the same net and input as when saving, or load "
    "without `table=` to skip this check."
)


# --------------------------------------------------------------------- helpers


class Pair(nn.Module):
    """Return a tuple of two tensors."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x + 1


class Heads(nn.Module):
    """Return a dict of tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.logits = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.logits(x), "features": x}


class Net(nn.Module):
    """Linear, then a tuple-returning module, then a dict-returning one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.pair = Pair()
        self.heads = Heads()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        a, b = self.pair(self.fc(x))
        out: dict[str, torch.Tensor] = self.heads(a + b)
        return out


def recorded_net() -> Recorder:
    """Return a Recorder of `Net` that recorded every layer once."""
    rnet = Recorder(Net(), input_size=(2, 5))
    rnet.record(*[label for label, row in rnet.table.items() if row.recordable])
    rnet(torch.rand(2, 5))
    return rnet


def assert_same(expected: Any, actual: Any) -> None:
    """Assert that ``actual`` is ``expected`` rebuilt: same types and values."""
    if isinstance(expected, torch.Tensor):
        assert type(actual) is torch.Tensor
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        assert torch.equal(actual, expected.detach())
    elif isinstance(expected, float):
        assert type(actual) is float
        assert actual.hex() == expected.hex()  # exact, NaN and -0.0 included
    elif isinstance(expected, tuple | list):
        assert type(actual) is (tuple if isinstance(expected, tuple) else list)
        assert len(actual) == len(expected)
        for item, got in zip(expected, actual, strict=True):
            assert_same(item, got)
    elif isinstance(expected, dict):
        assert type(actual) is dict
        assert list(actual) == list(expected)
        for name, item in expected.items():
            assert_same(item, actual[name])
    else:
        assert type(actual) is type(expected)
        assert actual == expected


def rewrite(path: Path, edit: Any) -> None:
    """Rewrite the file at ``path`` with ``edit(metadata, tensors)`` applied."""
    tensors = safetensors.torch.load_file(path)
    with safetensors.safe_open(str(path), framework="pt") as file:
        metadata = dict(file.metadata())
    edit(metadata, tensors)
    safetensors.torch.save_file(tensors, path, metadata=metadata)


def edit_label_map(edit: Any) -> Any:
    """Return a `rewrite` edit applying ``edit(entries)`` to the label map."""

    def apply(metadata: dict[str, str], _tensors: dict[str, torch.Tensor]) -> None:
        entries = json.loads(metadata["scio_recorder.records"])
        edit(entries)
        metadata["scio_recorder.records"] = json.dumps(entries)

    return apply


# ------------------------------------------------------------------ round trip


def test_round_trip_recorder_activations(tmp_path: Path) -> None:
    """Activations of a Recorder (tensor, tuple and dict records) round-trip."""
    rnet = recorded_net()
    path = save_records(tmp_path / "run.safetensors", rnet.activations, rnet.table)
    loaded = load_records(path, rnet.table)
    assert list(loaded) == list(rnet.activations)
    assert isinstance(loaded[(1, 2)], tuple)
    assert isinstance(loaded[(1, 3)], dict)
    for label, record in rnet.activations.items():
        assert_same(record, loaded[label])


def test_label_map_stores_table_rows(tmp_path: Path) -> None:
    """The label map holds each label's module name, call, type, shapes, dtypes."""
    rnet = recorded_net()
    loaded = load_records(save_records(tmp_path / "r", rnet.activations, rnet))
    assert loaded.label_map[(1, 3)] == RecordInfo(
        (1, 3),
        "heads",
        0,
        "Heads",
        {"logits": (2, 3), "features": (2, 4)},
        {"logits": torch.float32, "features": torch.float32},
    )
    root = loaded.label_map[(0, 1)]
    assert (root.name, root.module_type, root.call_index) == ("", "Net", 0)
    assert root.describe() == "the whole net (Net, call 0)"


def test_same_tensor_is_stored_once(tmp_path: Path) -> None:
    """A tensor recorded under several labels is stored once and shared on load."""
    rnet = recorded_net()
    path = save_records(tmp_path / "r", rnet.activations, rnet)
    keys = set(safetensors.torch.load_file(path))
    assert keys == {"1-1", "1-2/0", "1-2/1", "2-1", "1-3/features"}
    loaded = load_records(path)
    assert loaded[(0, 1)]["logits"] is loaded[(2, 1)]
    assert loaded[(1, 3)]["logits"] is loaded[(2, 1)]


def test_views_and_shared_storage_round_trip(tmp_path: Path) -> None:
    """Non-contiguous views and tensors sharing storage are saved as their values."""
    base = torch.arange(24.0).reshape(4, 6)
    records = {
        (1, 1): base,
        (1, 2): base[1],
        (1, 3): base.t(),
        (1, 4): base[:, ::2],
        (1, 5): base[0, 0],
        (1, 6): base[:0],
        (1, 7): base.sum(0).expand(3, 6),
        (1, 8): base.view(-1),
    }
    loaded = load_records(save_records(tmp_path / "r", records))
    for label, record in records.items():
        assert_same(record, loaded[label])
        assert loaded[label].is_contiguous()


def test_string_keys_and_labels_round_trip(tmp_path: Path) -> None:
    """String keys (even one spelled like a label, or with `/`) keep their records."""
    records: dict[RecordKey, Any] = {
        (1, 3): torch.ones(2),
        "1-3": torch.zeros(2),
        "fn/out%": (torch.full((1,), 3.0), {"a/b": torch.ones(1)}),
        "": torch.arange(3),
    }
    path = save_records(tmp_path / "r", records)
    assert set(safetensors.torch.load_file(path)) == {
        "1-3",
        "str:1-3",
        "str:fn%2Fout%25/0",
        "str:fn%2Fout%25/1/a%2Fb",
        "str:",
    }
    loaded = load_records(path)
    assert list(loaded) == list(records)
    for key, record in records.items():
        assert_same(record, loaded[key])


def test_python_scalars_and_none_round_trip(tmp_path: Path) -> None:
    """None, bools, ints of any size, floats (NaN, inf, -0.0) and str round-trip."""
    record = [None, True, 2**100, -0.0, math.nan, -math.inf, 0.1, "é/%", {"n": 1}]
    loaded = load_records(save_records(tmp_path / "r", {"x": record}))
    assert_same(record, loaded["x"])


def test_subclasses_come_back_as_plain_containers(tmp_path: Path) -> None:
    """Named tuples and dict subclasses are rebuilt as plain tuples and dicts."""
    from collections import OrderedDict, namedtuple  # noqa: PLC0415 (local use)

    point = namedtuple("point", "x y")  # noqa: PYI024 (the test needs a plain one)
    record = OrderedDict(p=point(torch.ones(1), 2))
    loaded = load_records(save_records(tmp_path / "r", {"x": record}))
    assert_same({"p": (torch.ones(1), 2)}, loaded["x"])


class Computed(Mapping[str, torch.Tensor]):
    """A mapping whose values are new views, copied when saved, at each access."""

    def __getitem__(self, key: str) -> torch.Tensor:
        return torch.full((2000,), float(key))[::2]

    def __iter__(self) -> Iterator[str]:
        return iter(map(str, range(8)))

    def __len__(self) -> int:
        return 8


def test_computed_values_are_not_mistaken_for_one_another(tmp_path: Path) -> None:
    """Tensors made on access, freed and reallocated, are each saved."""
    loaded = load_records(save_records(tmp_path / "r", Computed()))
    for key in map(str, range(8)):
        assert torch.equal(loaded[key], torch.full((1000,), float(key)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_saved_from_cpu_copies(tmp_path: Path) -> None:
    """Tensors on a GPU are saved, and `device=` loads them back there."""
    record = (torch.arange(6.0, device="cuda").reshape(2, 3).t(), torch.ones(1))
    path = save_records(tmp_path / "r", {(1, 1): record})
    loaded = load_records(path)
    assert_same(tuple(t.cpu() for t in record), loaded[(1, 1)])
    assert load_records(path, device="cuda")[(1, 1)][0].is_cuda


def test_lone_surrogate_key_raises(tmp_path: Path) -> None:
    """A key that cannot be UTF-8 encoded is refused before anything is written."""
    msg = (
        "Cannot save the key '\\ud800': it is not valid Unicode (it holds a lone "
        "surrogate), and safetensors keys must be UTF-8."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        save_records(tmp_path / "r", {"\ud800": torch.ones(1)})
    assert not (tmp_path / "r").exists()


def test_grad_tensors_are_saved_detached(tmp_path: Path) -> None:
    """Tensors that require grad are saved as their values, without the graph."""
    weight = torch.ones(3, requires_grad=True)
    loaded = load_records(save_records(tmp_path / "r", {(1, 1): weight * 2}))
    assert not loaded[(1, 1)].requires_grad
    assert torch.equal(loaded[(1, 1)], torch.full((3,), 2.0))


def test_empty_records_round_trip(tmp_path: Path) -> None:
    """An empty mapping gives a file that loads as no records."""
    loaded = load_records(save_records(tmp_path / "r", {}))
    assert len(loaded) == 0
    assert repr(loaded) == f"<Records from '{tmp_path / 'r'}': no records>"


def test_device_argument_moves_tensors(tmp_path: Path) -> None:
    """`device=` puts the loaded tensors on that device."""
    path = save_records(
        tmp_path / "r", {(1, 1): torch.ones(2), (1, 2): [torch.ones(1)]}
    )
    loaded = load_records(path, device=torch.device("meta"))
    assert loaded[(1, 1)].device.type == "meta"
    assert loaded[(1, 2)][0].device.type == "meta"


def test_records_mapping_is_read_only(tmp_path: Path) -> None:
    """The loaded mapping and its label map cannot be assigned to."""
    loaded = load_records(save_records(tmp_path / "r", {(1, 1): torch.ones(1)}))
    assert isinstance(loaded, Records)
    with pytest.raises(TypeError):
        loaded[(1, 2)] = torch.ones(1)  # type: ignore[index]
    with pytest.raises(TypeError):
        loaded.label_map[(1, 2)] = loaded.label_map[(1, 1)]  # type: ignore[index]
    assert repr(loaded) == f"<Records from '{tmp_path / 'r'}': 1-1>"


# ----------------------------------------------------------------------- paths


def test_directory_path_writes_default_file(tmp_path: Path) -> None:
    """An existing directory, or a string ending with `/`, gets records.safetensors."""
    assert save_records(tmp_path, {"a": torch.ones(1)}) == tmp_path / DEFAULT_FILENAME
    new = f"{tmp_path}/new/"
    assert (
        save_records(new, {"a": torch.ones(1)}) == tmp_path / "new" / DEFAULT_FILENAME
    )
    assert list(load_records(new)) == ["a"]
    assert list(load_records(tmp_path)) == ["a"]


def test_failed_save_keeps_old_file(tmp_path: Path) -> None:
    """A save that fails leaves the existing file and no temporary file."""
    path = save_records(tmp_path / "r", {"a": torch.ones(1)})
    with pytest.raises(TypeError):
        save_records(path, {"a": torch.ones(1, dtype=torch.complex128)})
    assert torch.equal(load_records(path)["a"], torch.ones(1))
    assert [child.name for child in tmp_path.iterdir()] == ["r"]


def nested(depth: int) -> object:
    """A tensor inside ``depth`` lists (and a dict every tenth level)."""
    record: object = torch.arange(3.0)
    for level in range(depth):
        record = {"k": record} if level % 10 == 9 else [record]
    return record


def test_nesting_up_to_the_limit_round_trips(tmp_path: Path) -> None:
    """A record exactly MAX_NESTING deep saves and loads back."""
    record = nested(MAX_NESTING)
    loaded = load_records(save_records(tmp_path / "r", {"deep": record}))["deep"]
    for level in reversed(range(MAX_NESTING)):
        loaded = loaded["k"] if level % 10 == 9 else loaded[0]
    assert torch.equal(loaded, torch.arange(3.0))


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 5000])
def test_nesting_beyond_the_limit_is_refused_before_writing(
    tmp_path: Path, depth: int
) -> None:
    """Saving a record deeper than the limit names both, and writes nothing."""
    msg = (
        f"Cannot save the record of 'deep': it is nested {depth} containers deep "
        f".* deeper than the limit scio_recorder.io.MAX_NESTING = {MAX_NESTING} "
        "that `load_records` reads back. Flatten it"
    )
    with pytest.raises(ValueError, match=msg):
        save_records(tmp_path / "r", {"deep": nested(depth)})
    assert list(tmp_path.iterdir()) == []


def test_record_holding_itself_is_refused(tmp_path: Path) -> None:
    """A list that contains itself is refused with a ValueError, not recursion."""
    loop: list[object] = [torch.ones(1)]
    loop.append(loop)
    with pytest.raises(ValueError, match="it holds itself, so it is infinitely deep"):
        save_records(tmp_path / "r", {(1, 1): {"a": loop}})
    assert list(tmp_path.iterdir()) == []


def test_load_refuses_a_file_nested_beyond_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file nested deeper than MAX_NESTING (not by save_records) is corrupted."""
    monkeypatch.setattr(scio_recorder.io, "MAX_NESTING", MAX_NESTING + 1)
    path = save_records(tmp_path / "r", {"deep": nested(MAX_NESTING + 1)})
    monkeypatch.setattr(scio_recorder.io, "MAX_NESTING", MAX_NESTING)
    msg = (
        f"The records file '{path}' is corrupted: the structure of .* is nested "
        f"more than scio_recorder.io.MAX_NESTING = {MAX_NESTING} containers deep"
    )
    with pytest.raises(ValueError, match=msg):
        load_records(path)


def test_missing_file_raises(tmp_path: Path) -> None:
    """Loading a file that does not exist raises FileNotFoundError."""
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"No records file at '{tmp_path / 'no'}'")
    ):
        load_records(tmp_path / "no")


# ---------------------------------------------------------------- save errors


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ((1, 2, 3), "(1, 2, 3) (tuple)"),
        ((1, -1), "(1, -1) (tuple)"),
        ((True, 1), "(True, 1) (tuple)"),
        (3, "3 (int)"),
    ],
)
def test_bad_key_raises(tmp_path: Path, key: Any, shown: str) -> None:
    """A key that is neither a label nor a string is refused."""
    msg = (
        f"Cannot save the record keyed {shown}: keys must be labels `(depth, idx)` "
        "of non-negative ints, or strings."
    )
    with pytest.raises(TypeError, match=re.escape(msg)):
        save_records(tmp_path / "r", {key: torch.ones(1)})


def test_unsupported_leaf_raises(tmp_path: Path) -> None:
    """A record holding another object type is refused, naming where it is."""
    msg = (
        "Cannot save the record of 1-1: `[1]['x']` is a complex. Records may hold "
        "tensors, None, bool, int, float and str, and tuples, lists and dicts with "
        "str keys of those."
    )
    with pytest.raises(TypeError, match=re.escape(msg)):
        save_records(tmp_path / "r", {(1, 1): [torch.ones(1), {"x": 1j}]})


def test_non_str_dict_key_raises(tmp_path: Path) -> None:
    """A dict with a non-str key is refused."""
    msg = (
        "Cannot save the record of 'f': the dict at `[0]` has the key 1 (int); "
        "only str keys can be saved."
    )
    with pytest.raises(TypeError, match=re.escape(msg)):
        save_records(tmp_path / "r", {"f": [{1: torch.ones(1)}]})


@pytest.mark.parametrize(
    ("tensor", "problem"),
    [
        (
            torch.ones(1, dtype=torch.complex128),
            (
                "has dtype complex128, which safetensors cannot store; cast it "
                "(e.g. `.float()`) first."
            ),
        ),
        (
            torch.eye(2).to_sparse(),
            "is a torch.sparse_coo tensor; convert it with `.to_dense()` first.",
        ),
        (torch.ones(1, device="meta"), "is on the meta device and has no data."),
    ],
)
def test_unsavable_tensor_raises(
    tmp_path: Path, tensor: torch.Tensor, problem: str
) -> None:
    """Tensors safetensors cannot store are refused with the reason."""
    msg = f"Cannot save the record of 1-1: `the record` {problem}"
    with pytest.raises(TypeError, match=re.escape(msg)):
        save_records(tmp_path / "r", {(1, 1): tensor})


def test_save_label_not_in_table_raises(tmp_path: Path) -> None:
    """With a table, every label saved must be in it."""
    rnet = Recorder(nn.Sequential(nn.Linear(2, 2)), input_size=(1, 2))
    msg = (
        "Cannot save the record of layer 4-2: it is not in the given table. Pass "
        "the table of the Recorder that made the records, or save without `table=`."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        save_records(tmp_path / "r", {(4, 2): torch.ones(1)}, rnet.table)


def test_extra_metadata_round_trips(tmp_path: Path) -> None:
    """`extra_metadata` is stored and comes back in `.metadata` with the versions."""
    path = save_records(
        tmp_path / "r", {"a": torch.ones(1)}, extra_metadata={"run": "7"}
    )
    assert dict(load_records(path).metadata) == {
        "run": "7",
        "scio_recorder.format_version": str(FORMAT_VERSION),
        "scio_recorder.version": scio_recorder.__version__,
        "scio_recorder.torch_version": torch.__version__,
    }


def test_reserved_extra_metadata_key_raises(tmp_path: Path) -> None:
    """`extra_metadata` keys may not use the `scio_recorder.` prefix."""
    msg = (
        "`extra_metadata` key 'scio_recorder.version' starts with 'scio_recorder.', "
        "which is reserved for scio_recorder's own metadata; rename it."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        save_records(tmp_path / "r", {}, extra_metadata={"scio_recorder.version": "9"})


def test_non_str_extra_metadata_raises(tmp_path: Path) -> None:
    """`extra_metadata` values must be strings."""
    msg = (
        "`extra_metadata` must map str to str, got 'epoch': 3; encode other values "
        "yourself (e.g. with `json.dumps`)."
    )
    with pytest.raises(TypeError, match=re.escape(msg)):
        save_records(tmp_path / "r", {}, extra_metadata={"epoch": 3})  # type: ignore[dict-item]


# ------------------------------------------------------------- table checks


def test_load_with_table_of_other_net_raises(tmp_path: Path) -> None:
    """A label naming another module in the given table is reported."""
    rnet = Recorder(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5))
    rnet.record((1, 1))
    rnet(torch.rand(1, 5))
    path = save_records(tmp_path / "r", rnet.activations, rnet.table)
    other = Recorder(nn.Sequential(nn.ReLU(), nn.Linear(5, 4)), input_size=(1, 5))
    msg = (
        "Layer 1-1 was saved from module `0` (Linear, call 0), but in the given "
        f"table 1-1 is module `0` (ReLU, call 0). {ADVICE}"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(path, other.table)
    assert torch.equal(load_records(path)[(1, 1)], rnet.activations[(1, 1)])


def test_load_with_other_call_raises(tmp_path: Path) -> None:
    """A label naming another call of the same module is reported."""
    relu = nn.ReLU()
    rnet = Recorder(nn.Sequential(relu, nn.Linear(2, 2), relu), input_size=(1, 2))
    path = save_records(tmp_path / "r", {(1, 3): torch.ones(1)}, rnet)
    other = Recorder(nn.Sequential(relu, nn.Linear(2, 2), nn.ReLU()), input_size=(1, 2))
    # In `other`, 1-3 is a distinct ReLU named `2`, called once.
    msg = (
        "Layer 1-3 was saved from module `2` (ReLU, call 1), but in the given "
        f"table 1-3 is module `2` (ReLU, call 0). {ADVICE}"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(path, other)


def test_load_label_missing_from_table_raises(tmp_path: Path) -> None:
    """A saved label absent from the given table is reported."""
    rnet = recorded_net()
    path = save_records(tmp_path / "r", {(2, 1): rnet.activations[(2, 1)]}, rnet)
    other = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
    msg = (
        "Layer 2-1 was saved from module `heads.logits` (Linear, call 0), but the "
        f"given table has no layer 2-1. {ADVICE}"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(path, other)


def test_load_with_table_of_file_saved_without_table_raises(tmp_path: Path) -> None:
    """A file saved without a table cannot be checked against one."""
    rnet = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
    records: dict[RecordKey, Any] = {(1, 1): torch.ones(1), "f": torch.ones(1)}
    path = save_records(tmp_path / "r", records)
    msg = (
        "Layer 1-1 was saved without a layer table, so it cannot be checked "
        "against the given table. Load without `table=`, or save with `table=` "
        "to store the module of each label."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(path, rnet)


def test_string_keys_are_not_checked_against_table(tmp_path: Path) -> None:
    """String keys load with a table: only labels are checked."""
    rnet = Recorder(nn.Sequential(nn.Linear(5, 4)), input_size=(1, 5))
    path = save_records(tmp_path / "r", {"fn": torch.ones(1)}, rnet)
    assert load_records(path, rnet).label_map["fn"].name is None


# ---------------------------------------------------------------- corruption


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A file holding a 2x4 tensor under 1-1 and a tuple under 1-2."""
    records = {(1, 1): torch.ones(2, 4), (1, 2): (torch.zeros(3), torch.ones(1))}
    return save_records(tmp_path / "r.safetensors", records)


def test_corrupted_shape_raises(saved: Path) -> None:
    """A tensor whose shape disagrees with the label map is reported."""

    def shrink(entries: list[Any]) -> None:
        entries[0]["record"]["shape"] = [3, 4]

    rewrite(saved, edit_label_map(shrink))
    msg = (
        f"The records file '{saved}' is corrupted: the tensor '1-1' of 1-1 has "
        "shape (2, 4) and dtype float32, but the label map says shape (3, 4) and "
        "dtype float32. The file was modified or damaged after it was saved."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(saved)


def test_corrupted_dtype_raises(saved: Path) -> None:
    """A tensor whose dtype disagrees with the label map is reported."""

    def recast(metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
        tensors["1-2/0"] = tensors["1-2/0"].double()

    rewrite(saved, recast)
    msg = (
        f"The records file '{saved}' is corrupted: the tensor '1-2/0' of 1-2[0] "
        "has shape (3,) and dtype float64, but the label map says shape (3,) and "
        "dtype float32."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(saved)


def test_missing_tensor_raises(saved: Path) -> None:
    """A tensor of the label map missing from the file is reported."""
    rewrite(saved, lambda _metadata, tensors: tensors.pop("1-2/1"))
    msg = (
        f"The records file '{saved}' is corrupted: the tensor '1-2/1' of 1-2[1] is "
        "missing from the file."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(saved)


def test_unlisted_tensor_raises(saved: Path) -> None:
    """A tensor of the file that no record uses is reported."""
    rewrite(saved, lambda _metadata, tensors: tensors.update(extra=torch.ones(1)))
    msg = (
        f"The records file '{saved}' is corrupted: it holds tensors that no record "
        "uses: ['extra']."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(saved)


def test_malformed_label_map_json_raises(saved: Path) -> None:
    """A label map that is not JSON is reported as corruption."""

    def garble(metadata: dict[str, str], _tensors: dict[str, torch.Tensor]) -> None:
        metadata["scio_recorder.records"] = "[{"

    rewrite(saved, garble)
    msg = f"The records file '{saved}' is corrupted: its label map is not valid JSON"
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(saved)


def test_newer_format_raises(saved: Path) -> None:
    """A file in a newer format asks to upgrade."""

    def bump(metadata: dict[str, str], _tensors: dict[str, torch.Tensor]) -> None:
        metadata["scio_recorder.format_version"] = str(FORMAT_VERSION + 1)
        metadata["scio_recorder.version"] = "9.0"

    rewrite(saved, bump)
    msg = (
        f"'{saved}' uses records format {FORMAT_VERSION + 1}, written by "
        f"scio_recorder 9.0; this scio_recorder ({scio_recorder.__version__}) "
        f"reads formats up to {FORMAT_VERSION}. Upgrade scio_recorder to load it."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(saved)


def test_plain_safetensors_file_raises(tmp_path: Path) -> None:
    """A safetensors file not written by save_records is refused."""
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file({"w": torch.ones(1)}, path)
    msg = (
        f"'{path}' is a safetensors file but not a records file written by "
        "`save_records`: its metadata has no 'scio_recorder.format_version' and "
        "'scio_recorder.records'. Read it with `safetensors.torch.load_file`."
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_records(path)


def test_file_is_readable_by_plain_safetensors(saved: Path) -> None:
    """Any safetensors reader gets the tensors under the documented keys."""
    tensors = safetensors.torch.load_file(saved)
    assert sorted(tensors) == ["1-1", "1-2/0", "1-2/1"]
    with safetensors.safe_open(str(saved), framework="pt") as file:
        entries = json.loads(file.metadata()["scio_recorder.records"])
    assert entries[1] == {
        "key": [1, 2],
        "record": {
            "type": "tuple",
            "items": [
                {"type": "tensor", "key": "1-2/0", "shape": [3], "dtype": "float32"},
                {"type": "tensor", "key": "1-2/1", "shape": [1], "dtype": "float32"},
            ],
        },
    }


# -------------------------------------------------------------------- safety


class Payload:
    """Unpickling this runs ``os.makedirs(marker)``: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.makedirs, (str(self.marker),)


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_pickle_file_does_not_run_code(tmp_path: Path, writer: str) -> None:
    """A pickle (or torch.save) file with a code payload is refused, unexecuted."""
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Payload(control)))  # noqa: S301 (shows the payload runs)
    assert control.is_dir()
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.safetensors"
    if writer == "pickle":
        path.write_bytes(pickle.dumps({"1-1": Payload(marker)}))
    else:
        torch.save({"1-1": Payload(marker)}, path)
    with pytest.raises(ValueError, match=r"is not a valid safetensors file"):
        load_records(path)
    assert not marker.exists()


def test_crafted_metadata_does_not_run_code(saved: Path, tmp_path: Path) -> None:
    """A label map with pickled or code-like nodes is refused as corruption."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(Payload(marker)).hex()

    def craft(entries: list[Any]) -> None:
        entries[0]["record"] = {"type": "pickle", "value": payload}

    rewrite(saved, edit_label_map(craft))
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"The records file '{saved}' is corrupted: the structure of 1-1 has a "
            "malformed node"
        ),
    ):
        load_records(saved)
    assert not marker.exists()


def test_load_never_unpickles(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading calls neither torch.load nor pickle."""

    def forbidden(*_args: Any, **_kwargs: Any) -> Any:
        msg = "load_records must not unpickle"
        raise AssertionError(msg)

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    loaded = load_records(saved)
    assert torch.equal(loaded[(1, 1)], torch.ones(2, 4))


# ---------------------------------------------------------------- hypothesis

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Draw a tensor: any of DTYPES, 0 to 3 dims (empty ones too), maybe a view."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if dtype.is_floating_point:
        tensor = (torch.randn(shape, generator=generator) * 100).to(dtype)
    elif dtype == torch.bool:
        tensor = torch.randint(0, 2, shape, generator=generator).bool()
    else:
        info = torch.iinfo(dtype)
        low, high = max(info.min, -(2**40)), min(info.max, 2**40)
        tensor = torch.randint(low, high, shape, generator=generator).to(dtype)
    view = draw(st.sampled_from(["none", "transpose", "step", "expand"]))
    if view == "transpose" and tensor.dim() >= 2:
        return tensor.transpose(0, 1)
    if view == "step" and tensor.dim() >= 1:
        return tensor[::2]
    if view == "expand":
        return tensor.unsqueeze(0).expand(2, *tensor.shape)
    return tensor


LEAVES = (
    tensors()
    | st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
)
STRUCTURES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=3)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
KEYS = st.tuples(st.integers(0, 4), st.integers(1, 9)) | st.text(max_size=6)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(records=st.dictionaries(KEYS, STRUCTURES, max_size=4), repeat=st.booleans())
def test_random_structures_round_trip(
    tmp_path: Path, records: dict[Any, Any], repeat: bool
) -> None:
    """Random nested records of random tensors and scalars round-trip exactly."""
    if repeat and records:  # the same objects again, under another key
        records["again"] = next(iter(records.values()))
    loaded = load_records(save_records(tmp_path / "h.safetensors", records))
    assert list(loaded) == list(records)
    for key, record in records.items():
        assert_same(record, loaded[key])
