"""Tests of :class:`scio_recorder.calls.CallRecorder`."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from scio_recorder import calls
from scio_recorder.calls import CallRecorder

if TYPE_CHECKING:
    from types import ModuleType

TOY = "calls_toy_module"


def load_module(name: str, file: Path) -> ModuleType:
    """Import ``file`` as the module ``name`` (kept in ``sys.modules``).

    pytest runs with ``--import-mode=importlib``, so ``tests/`` is not on
    ``sys.path``; registering the module by name makes its dotted paths
    importable by the recorder, whichever way pytest is launched.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_toy_module() -> ModuleType:
    return load_module(TOY, Path(__file__).with_name("calls_toy_module.py"))


toy_module = load_toy_module()


@pytest.fixture(autouse=True)
def no_patch_left():
    """Every test must leave no patch installed."""
    yield
    assert calls._PATCHES == {}


# ------------------------------------------------------------ MMRazor parity
def test_mmrazor_function_outputs_example():
    """MMRazor's FunctionOutputsRecorder('toy_module.toy_func') example."""
    r1 = CallRecorder(f"{TOY}.toy_func")
    with r1:
        out1 = toy_module.toy_func()
        out2 = toy_module.toy_func()
        out3 = toy_module.toy_func()
    data_buffer = r1[f"{TOY}.toy_func"]
    assert data_buffer == (out1, out2, out3)
    assert r1.get(f"{TOY}.toy_func", 2) == out3


def test_mmrazor_method_outputs_example():
    """MMRazor's MethodOutputsRecorder('toy_module.Toy.toy_func') example."""
    toy = toy_module.Toy()
    r1 = CallRecorder(f"{TOY}.Toy.toy_func")
    with r1:
        out1 = toy.toy_func()
        out2 = toy.toy_func()
        out3 = toy.toy_func()
    assert r1[f"{TOY}.Toy.toy_func"] == (out1, out2, out3)
    assert r1.get(f"{TOY}.Toy.toy_func", 2) == out3


def test_outputs_and_getitem_agree():
    """``rec.outputs(path)`` and ``rec[path]`` return the same tuple."""
    with CallRecorder(f"{TOY}.double") as rec:
        toy_module.double(1)
        toy_module.double(5)
    assert rec.outputs(f"{TOY}.double") == rec[f"{TOY}.double"] == (2, 10)


def test_several_paths_are_recorded_separately():
    """Each path has its own record."""
    with CallRecorder(f"{TOY}.double", f"{TOY}.Toy.add") as rec:
        toy_module.double(3)
        toy_module.Toy().add(1, y=2)
        toy_module.double(4)
    assert rec[f"{TOY}.double"] == (6, 8)
    assert rec[f"{TOY}.Toy.add"] == (3,)


# ------------------------------------------------------ where it is looked up
RULE_A = """
def f(x):
    return x + 1
"""
RULE_B = """
from calls_rule_a import f

def g(x):
    return f(x) * 10
"""


@pytest.fixture
def rule_modules(tmp_path):
    """Modules ``calls_rule_a`` (defines ``f``) and ``calls_rule_b`` (imports it)."""
    (tmp_path / "calls_rule_a.py").write_text(RULE_A, encoding="utf-8")
    (tmp_path / "calls_rule_b.py").write_text(RULE_B, encoding="utf-8")
    a = load_module("calls_rule_a", tmp_path / "calls_rule_a.py")
    b = load_module("calls_rule_b", tmp_path / "calls_rule_b.py")
    yield a, b
    del sys.modules["calls_rule_a"], sys.modules["calls_rule_b"]


def test_defining_module_path_misses_calls_through_an_imported_name(rule_modules):
    """Recording ``a.f`` does not see ``b``'s calls to its own name ``f``."""
    a, b = rule_modules
    with CallRecorder("calls_rule_a.f") as rec:
        assert b.g(1) == 20
        assert a.f(5) == 6
    assert rec["calls_rule_a.f"] == (6,)


def test_importing_module_path_records_its_calls(rule_modules):
    """Recording ``b.f`` sees the calls that ``b`` makes."""
    _, b = rule_modules
    with CallRecorder("calls_rule_b.f") as rec:
        assert b.g(1) == 20
        assert b.g(2) == 30
    assert rec["calls_rule_b.f"] == (2, 3)


def test_torch_multihead_attention_uses_its_imported_xavier_uniform():
    """MultiheadAttention calls ``xavier_uniform_`` imported into its module."""
    defined = "torch.nn.init.xavier_uniform_"
    used = "torch.nn.modules.activation.xavier_uniform_"
    with CallRecorder(defined, used) as rec:
        mha = nn.MultiheadAttention(embed_dim=4, num_heads=2)
    assert rec[defined] == ()
    assert len(rec[used]) == 1
    assert rec.get(used, 0) is mha.in_proj_weight


# --------------------------------------------------------------------- torch
def test_torch_relu_module_calls_functional_relu():
    """``nn.ReLU`` calls ``F.relu``, looked up on ``torch.nn.functional``."""
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU())
    x = torch.randn(2, 5)
    with CallRecorder("torch.nn.functional.relu") as rec:
        y = net(x)
    h = torch.relu(net[0](x))
    relus = rec["torch.nn.functional.relu"]
    assert len(relus) == 2
    assert torch.equal(relus[0], h)
    assert torch.equal(relus[1], torch.relu(net[2](h)))
    assert relus[1] is y


def test_torch_relu_through_the_callers_module_alias():
    """``activation.F.relu`` names the same attribute as ``functional.relu``."""
    net = nn.ReLU()
    x = torch.randn(3)
    with (
        CallRecorder("torch.nn.modules.activation.F.relu") as via_alias,
        CallRecorder("torch.nn.functional.relu") as direct,
    ):
        y = net(x)
    assert via_alias["torch.nn.modules.activation.F.relu"] == (y,)
    assert direct["torch.nn.functional.relu"] == (y,)
    assert torch.equal(y, x.clamp(min=0))


# ------------------------------------------------------------------- restore
def snapshot(obj: object) -> dict[str, object]:
    return dict(vars(obj))


def test_restores_after_exception():
    """An exception inside the block still restores the original function."""
    before = snapshot(toy_module)
    rec = CallRecorder(f"{TOY}.double")

    def fail_inside_block() -> None:
        with rec:
            toy_module.double(1)
            msg = "boom"
            raise ValueError(msg)

    with pytest.raises(ValueError, match="boom"):
        fail_inside_block()
    assert snapshot(toy_module) == before
    assert rec[f"{TOY}.double"] == (2,)


def test_restores_after_keyboard_interrupt():
    """A KeyboardInterrupt inside the block still restores the original."""
    before = snapshot(toy_module)
    rec = CallRecorder(f"{TOY}.interrupt", f"{TOY}.double")

    def interrupt_inside_block() -> None:
        with rec:
            toy_module.double(2)
            toy_module.interrupt()

    with pytest.raises(KeyboardInterrupt):
        interrupt_inside_block()
    assert snapshot(toy_module) == before
    assert rec[f"{TOY}.double"] == (4,)
    assert rec[f"{TOY}.interrupt"] == ()


def test_call_that_raises_records_nothing_and_propagates():
    """A recorded callable that raises records nothing; the error propagates."""
    with CallRecorder(f"{TOY}.fail") as rec, pytest.raises(RuntimeError, match="x"):
        toy_module.fail("x")
    assert rec[f"{TOY}.fail"] == ()


def test_patches_only_inside_the_block():
    """Creating a recorder patches nothing; the block patches; exit restores."""
    original = toy_module.double
    rec = CallRecorder(f"{TOY}.double")
    assert toy_module.double is original
    with rec:
        assert toy_module.double is not original
        assert toy_module.double.__wrapped__ is original
        assert toy_module.double.__name__ == "double"
    assert toy_module.double is original
    toy_module.double(7)
    assert rec[f"{TOY}.double"] == ()


def test_nested_recorders_on_one_path():
    """Inner and outer both record; inner exit keeps the outer patch."""
    original = toy_module.double
    path = f"{TOY}.double"
    outer, inner = CallRecorder(path), CallRecorder(path)
    with outer:
        toy_module.double(1)
        with inner:
            toy_module.double(2)
        assert toy_module.double is not original
        toy_module.double(3)
    assert toy_module.double is original
    assert outer[path] == (2, 4, 6)
    assert inner[path] == (4,)


def test_recorders_may_exit_out_of_order():
    """Exiting the outer recorder first still restores the original at the end."""
    original = toy_module.double
    path = f"{TOY}.double"
    first, second = CallRecorder(path), CallRecorder(path)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    toy_module.double(1)
    second.__exit__(None, None, None)
    assert toy_module.double is original
    assert first[path] == ()
    assert second[path] == (2,)


def test_reentering_accumulates_until_clear():
    """Records accumulate over successive blocks until ``clear()``."""
    path = f"{TOY}.double"
    rec = CallRecorder(path)
    with rec:
        toy_module.double(1)
    with rec:
        toy_module.double(2)
    assert rec[path] == (2, 4)
    rec.clear()
    assert rec[path] == ()
    with rec:
        toy_module.double(3)
    assert rec[path] == (6,)


def test_nested_entries_of_one_recorder_record_once():
    """A recorder entered twice records each call once and stays active."""
    path = f"{TOY}.double"
    rec = CallRecorder(path)
    with rec:
        with rec:
            toy_module.double(1)
        assert rec.active
        toy_module.double(2)
    assert not rec.active
    assert rec[path] == (2, 4)


def test_exit_without_enter_raises():
    """``__exit__`` on an inactive recorder is an error."""
    rec = CallRecorder(f"{TOY}.double")
    msg = "CallRecorder.__exit__ called on a recorder that is not active"
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        rec.__exit__(None, None, None)


def test_failed_enter_restores_the_targets_already_patched():
    """If one target cannot be patched, the others are restored."""
    before = snapshot(toy_module)
    rec = CallRecorder(f"{TOY}.double", f"{TOY}.SLOTTED.value")
    msg = f"cannot record '{TOY}.SLOTTED.value': replacing `value` failed: "
    with pytest.raises(TypeError, match=re.escape(msg)), rec:
        pass
    assert snapshot(toy_module) == before
    assert not rec.active


# ---------------------------------------------------------- kinds of methods
def test_staticmethod_is_recorded_and_restored_exactly():
    """A staticmethod is recorded via class and instance, then put back as is."""
    cls = toy_module.Toy
    before = snapshot(cls)
    with CallRecorder(f"{TOY}.Toy.static_double") as rec:
        assert isinstance(vars(cls)["static_double"], staticmethod)
        cls.static_double(1)
        cls().static_double(2)
    assert snapshot(cls) == before
    assert rec[f"{TOY}.Toy.static_double"] == (2, 4)


def test_classmethod_is_recorded_and_restored_exactly():
    """A classmethod binds to the class it is called on, then is put back."""
    cls = toy_module.Toy
    before = snapshot(cls)
    with CallRecorder(f"{TOY}.Toy.class_name") as rec:
        assert isinstance(vars(cls)["class_name"], classmethod)
        cls.class_name()
        toy_module.SubToy().class_name("!")
    assert snapshot(cls) == before
    assert rec[f"{TOY}.Toy.class_name"] == ("Toy", "SubToy!")


def test_inherited_method_is_patched_on_the_named_class_then_removed():
    """``SubToy.add`` records SubToy calls only and leaves no copy behind."""
    sub, base = toy_module.SubToy, toy_module.Toy
    before_sub, before_base = snapshot(sub), snapshot(base)
    assert "add" not in vars(sub)
    with CallRecorder(f"{TOY}.SubToy.add") as rec:
        sub().add(1, 2)
        base().add(10, 20)
    assert snapshot(sub) == before_sub
    assert snapshot(base) == before_base
    assert rec[f"{TOY}.SubToy.add"] == (3,)


def test_base_class_method_records_subclasses_that_do_not_override():
    """``Toy.add`` sees calls on SubToy instances but not on an override."""
    with CallRecorder(f"{TOY}.Toy.add") as rec:
        toy_module.Toy().add(1)
        toy_module.SubToy().add(2)
        toy_module.OverridingToy().add(3)
    assert rec[f"{TOY}.Toy.add"] == (1, 2)


def test_nested_class_method():
    """A method of a nested class is reached through the outer class."""
    with CallRecorder(f"{TOY}.Toy.Inner.triple") as rec:
        toy_module.Toy.Inner().triple(2)
    assert rec[f"{TOY}.Toy.Inner.triple"] == (6,)


def test_inherited_builtin_method_of_a_python_subclass():
    """A built-in method inherited by a Python class is recorded and removed."""
    cls = toy_module.ToyList
    before = snapshot(cls)
    items = cls()
    with CallRecorder(f"{TOY}.ToyList.append", keep_inputs=True) as rec:
        items.append(1)
        cls.append(items, 2)
    assert items == [1, 2]
    assert snapshot(cls) == before
    assert rec[f"{TOY}.ToyList.append"] == (None, None)
    assert rec.inputs(f"{TOY}.ToyList.append") == (((1,), {}), ((items, 2), {}))


# ---------------------------------------------------------------- keep_inputs
def test_keep_inputs_records_args_and_kwargs():
    """With keep_inputs, each call's (args, kwargs) is kept, self included."""
    toy = toy_module.Toy()
    with CallRecorder(f"{TOY}.Toy.add", f"{TOY}.double", keep_inputs=True) as rec:
        toy.add(1, y=2)
        toy_module.double(x=4)
    assert rec.inputs(f"{TOY}.Toy.add") == (((toy, 1), {"y": 2}),)
    assert rec.inputs(f"{TOY}.double") == (((), {"x": 4}),)
    assert rec[f"{TOY}.double"] == (8,)


def test_inputs_without_keep_inputs_raises():
    """``inputs`` refuses a recorder that does not keep them."""
    rec = CallRecorder(f"{TOY}.double")
    msg = (
        "this recorder does not keep inputs; "
        "create it with CallRecorder(..., keep_inputs=True)"
    )
    with pytest.raises(RuntimeError, match=re.escape(msg)):
        rec.inputs(f"{TOY}.double")


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            f"{TOY}.dubble",
            (
                f"cannot record '{TOY}.dubble': `{TOY}` has no attribute `dubble`; "
                "did you mean `double`?"
            ),
        ),
        (
            f"{TOY}.Toy.ad",
            (
                f"cannot record '{TOY}.Toy.ad': `{TOY}.Toy` has no attribute `ad`; "
                "did you mean `add`?"
            ),
        ),
        (
            f"{TOY}.Tyo.add",
            (
                f"cannot record '{TOY}.Tyo.add': `{TOY}` has no attribute `Tyo`; "
                "did you mean `Toy`?"
            ),
        ),
        (
            f"{TOY}.zzzzzz",
            (
                f"cannot record '{TOY}.zzzzzz': `{TOY}` has no attribute `zzzzzz`; "
                f"check the spelling (see dir({TOY}))"
            ),
        ),
        (
            "calls_toy_modul.toy_func",
            (
                "cannot record 'calls_toy_modul.toy_func': there is no module named "
                f"`calls_toy_modul`; did you mean `{TOY}`?"
            ),
        ),
        (
            "qqqqqqqqqqqq.f",
            (
                "cannot record 'qqqqqqqqqqqq.f': there is no module named "
                "`qqqqqqqqqqqq`; check the spelling and that the package is installed"
            ),
        ),
    ],
)
def test_unresolvable_path_names_the_failing_part(path, message):
    """A path that does not resolve raises ValueError naming the failing part."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        CallRecorder(path)


@pytest.mark.parametrize("path", ["toy_func", f"{TOY}..double", f"{TOY}.1x", ""])
def test_malformed_path(path):
    """A path must be dotted identifiers: a module, then attributes."""
    message = (
        f"cannot record {path!r}: a path is 'module.function' or "
        "'module.Class.method', dotted names of an importable module "
        "followed by attribute names"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        CallRecorder(path)


def test_non_callable_target():
    """A path to a non-callable attribute raises TypeError."""
    message = (
        f"cannot record '{TOY}.TOY_CONSTANT': it is a int object, "
        "not a function or method"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        CallRecorder(f"{TOY}.TOY_CONSTANT")


def test_builtin_type_method_cannot_be_recorded():
    """Attributes of built-in (immutable) types cannot be replaced."""
    message = (
        "cannot record 'builtins.list.append': `builtins.list` is a built-in "
        "type whose attributes cannot be replaced; record a Python subclass's "
        "method, or a function that calls it"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        CallRecorder("builtins.list.append")


def test_no_path():
    """A recorder needs at least one path."""
    message = "CallRecorder needs at least one path, e.g. 'pkg.module.func'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        CallRecorder()


def test_non_string_path():
    """Paths must be strings."""
    message = "paths must be strings like 'pkg.module.func', got 3"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        CallRecorder(3)  # type: ignore[arg-type]


def test_missing_dependency_of_an_existing_module_propagates(tmp_path, monkeypatch):
    """A module that exists but fails to import raises its own error."""
    (tmp_path / "calls_broken_dep.py").write_text(
        "import calls_no_such_dependency_xyz\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="calls_no_such_dependency_xyz"):
        CallRecorder("calls_broken_dep.f")


def test_unknown_path_in_results():
    """Asking for a path the recorder does not record raises KeyError."""
    rec = CallRecorder(f"{TOY}.double")
    message = f"'nope' is not recorded by this recorder; its paths are '{TOY}.double'"
    with pytest.raises(KeyError, match=re.escape(message)):
        rec["nope"]


def test_get_out_of_range():
    """``get`` with no call at that index raises IndexError."""
    with CallRecorder(f"{TOY}.double") as rec:
        toy_module.double(1)
    assert rec.get(f"{TOY}.double", -1) == 2
    message = f"'{TOY}.double' has 1 recorded calls; index 1 is out of range"
    with pytest.raises(IndexError, match=f"^{re.escape(message)}$"):
        rec.get(f"{TOY}.double", 1)


# -------------------------------------------------------------- container API
def test_len_iter_contains_and_duplicate_paths():
    """A recorder iterates over its paths, given once each, in order."""
    rec = CallRecorder(f"{TOY}.double", f"{TOY}.Toy.add", f"{TOY}.double")
    assert len(rec) == 2
    assert list(rec) == [f"{TOY}.double", f"{TOY}.Toy.add"]
    assert rec.paths == (f"{TOY}.double", f"{TOY}.Toy.add")
    assert f"{TOY}.Toy.add" in rec
    assert "x.y" not in rec


def test_repr_shows_paths():
    """The repr lists the paths and keep_inputs."""
    assert repr(CallRecorder(f"{TOY}.double")) == f"CallRecorder('{TOY}.double')"
    rec = CallRecorder(f"{TOY}.double", f"{TOY}.Toy.add", keep_inputs=True)
    expected = f"CallRecorder('{TOY}.double', '{TOY}.Toy.add', keep_inputs=True)"
    assert repr(rec) == expected


# ------------------------------------------------------------------- threads
def test_calls_from_other_threads_are_recorded():
    """While active, calls from every thread are recorded."""
    path = f"{TOY}.double"
    with CallRecorder(path) as rec:
        threads = [
            threading.Thread(target=toy_module.double, args=(i,)) for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(rec[path]) == [2 * i for i in range(8)]


# ---------------------------------------------------------------- hypothesis
@given(st.lists(st.tuples(st.booleans(), st.integers()), max_size=30))
def test_recorded_outputs_equal_returned_outputs(calls_to_make):
    """For any sequence of calls, the records are the returned values in order."""
    toy = toy_module.Toy()
    with CallRecorder(f"{TOY}.double", f"{TOY}.Toy.add") as rec:
        returned = [
            toy.add(n, y=1) if use_method else toy_module.double(n)
            for use_method, n in calls_to_make
        ]
    doubled = [
        out for out, (m, _) in zip(returned, calls_to_make, strict=True) if not m
    ]
    added = [out for out, (m, _) in zip(returned, calls_to_make, strict=True) if m]
    assert list(rec[f"{TOY}.double"]) == doubled
    assert list(rec[f"{TOY}.Toy.add"]) == added
