"""The package's layout: public faces keep `__all__` honest, no import circle.

The import graph is read from the source (every `import` and `from ... import`
of our own modules, including those under `TYPE_CHECKING` and inside
functions), so a circle hidden from the interpreter by a lazy import still
fails here.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

import scio_recorder

PACKAGE = Path(scio_recorder.__file__).parent
ROOT = "scio_recorder"
DEPRECATED = {f"{ROOT}.recipes"}
"""Modules whose every name warns, pointing to its new place."""


def module_names() -> list[str]:
    """Every module of the package, packages included, sorted."""
    found = pkgutil.walk_packages([str(PACKAGE)], prefix=f"{ROOT}.")
    return sorted([ROOT, *(info.name for info in found)])


def public_faces() -> list[str]:
    """Modules users import: no private segment, `__main__` aside."""
    return [
        name
        for name in module_names()
        if not any(part.startswith("_") for part in name.split("."))
    ]


def source_of(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin)


def is_package(name: str) -> bool:
    return source_of(name).name == "__init__.py"


def imports_of(name: str, known: set[str]) -> set[str]:
    """The modules of ours that module ``name`` imports, anywhere in its code."""
    tree = ast.parse(source_of(name).read_text(encoding="utf-8"))
    base = name if is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{anchor}.{node.module}" if node.module else anchor
            else:
                module = node.module or ""
            # `from pkg import sub` imports the submodule `pkg.sub`
            targets = [
                f"{module}.{alias.name}"
                if f"{module}.{alias.name}" in known
                else module
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one circle of ``graph`` (a list of modules), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (circle := visit(nxt)) is not None:
                return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)) is not None:
            return circle
    return None


def test_no_import_circle():
    """No module imports (directly or not) a module that imports it back."""
    known = set(module_names())
    graph = {name: imports_of(name, known) for name in known}
    # A package's `__init__` re-exports its private modules, which import
    # their siblings; an edge from a private module up to its own package's
    # face would be a circle, and is one: nothing is exempt.
    assert find_circle(graph) is None, " -> ".join(find_circle(graph) or [])


def private_imports_of(name: str, known: set[str]) -> set[str]:
    """The private modules of other subpackages that module ``name`` imports.

    A subpackage (``collect``, ``graph``, ``ood``, ``reduce``, ``_engine``,
    ...) shows other modules its public face only; its private modules
    (``scio_recorder.<sub>._<part>``) are imported from inside it alone.
    Shared private machinery lives in top-level private modules
    (``scio_recorder._run.batches``, ``scio_recorder._support.files``, ...).
    """
    found = set()
    for target in imports_of(name, known):
        parts = target.split(".")
        if len(parts) < 3 or not parts[2].startswith("_"):
            continue
        subpackage = ".".join(parts[:2])
        if not (name == subpackage or name.startswith(f"{subpackage}.")):
            found.add(target)
    return found


def test_no_module_imports_another_subpackages_private_module():
    known = set(module_names())
    bad = {
        name: sorted(found)
        for name in sorted(known)
        if (found := private_imports_of(name, known))
    }
    assert bad == {}, (
        "import these names from the subpackage's public face, or move them to "
        f"a shared private module: {bad}"
    )


def test_the_private_import_check_is_not_vacuous(monkeypatch, tmp_path):
    """It sees the import that `ood` made of `collect._loop` before the fix."""
    fake = tmp_path / "fake.py"
    fake.write_text("from ._protocol import Detector\n")
    real = source_of
    monkeypatch.setitem(
        globals(),
        "source_of",
        lambda name: fake if name == f"{ROOT}.ood._fake" else real(name),
    )
    monkeypatch.setitem(globals(), "is_package", lambda name: False)
    known = {*module_names(), f"{ROOT}.ood._fake"}
    assert private_imports_of(f"{ROOT}.ood._fake", known) == set()  # its own, relative
    fake.write_text("from scio_recorder.collect._loop import Run\n")
    assert private_imports_of(f"{ROOT}.ood._fake", known) == {f"{ROOT}.collect._loop"}
    fake.write_text("from ..reduce._base import check_class_labels\n")
    assert private_imports_of(f"{ROOT}.ood._fake", known) == {f"{ROOT}.reduce._base"}


def test_the_circle_finder_finds_a_circle():
    """The check above is not vacuous."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_reduce_and_collect_are_subpackages_that_import_nothing_above_them():
    """`reduce` depends on nothing of ours; `collect` not on the CLI or plots."""
    known = set(module_names())
    for name in known:
        if name.startswith(f"{ROOT}.reduce"):
            assert {
                m for m in imports_of(name, known) if not m.startswith(f"{ROOT}.reduce")
            } == set(), name
        if name.startswith(f"{ROOT}.collect"):
            assert f"{ROOT}.cli" not in imports_of(name, known), name
    assert is_package(f"{ROOT}.reduce")
    assert is_package(f"{ROOT}.collect")


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter():
    """Each module imports on its own (no import-order dependence)."""
    code = (
        "import importlib, subprocess, sys\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m.startswith('scio_recorder')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
    )
    names = [n for n in module_names() if not n.endswith("__main__")]
    done = subprocess.run(  # noqa: S603 (our own interpreter and modules)
        [sys.executable, "-c", code, *names],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", public_faces())
def test_all_of_each_public_module_is_honest(name):
    """`__all__` lists each name once, each exists, and star-import binds them."""
    if name in DEPRECATED:  # each name warns (see test_recipes.py); pytest
        warnings.simplefilter("ignore", DeprecationWarning)  # restores filters
    module = importlib.import_module(name)
    names = getattr(module, "__all__", None)
    if name.endswith("__main__"):
        return
    assert names is not None, f"{name} has no __all__"
    assert len(set(names)) == len(names)
    for attr in names:
        assert hasattr(module, attr), f"{name}.{attr}"
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)  # noqa: S102 (fixed source)
    del namespace["__builtins__"]
    namespace.pop("__warningregistry__", None)  # a deprecated module's warnings
    assert sorted(namespace) == sorted(names)


# the faces that only re-export their private parts
FACES_DEFINING_NOTHING = [
    f"{ROOT}.{face}"
    for face in (
        "reduce",
        "collect",
        "explain",
        "checks",
        "sae",
        "views",
        "activations",
    )
]


@pytest.mark.parametrize("name", FACES_DEFINING_NOTHING)
def test_subpackage_faces_export_every_public_name(name):
    """No public, non-module attribute of a face is missing from `__all__`."""
    module = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType)
        and attr != "annotations"  # `from __future__ import annotations`
    }
    assert public == set(module.__all__)


@pytest.mark.parametrize("name", FACES_DEFINING_NOTHING)
def test_reexports_keep_their_defining_module(name):
    """Re-exported classes and functions keep `__module__`: getsource works."""
    module = importlib.import_module(name)
    for attr in module.__all__:
        value = getattr(module, attr)
        if not isinstance(value, type | types.FunctionType):
            continue
        assert value.__module__.startswith(f"{name}._"), (attr, value.__module__)
        assert f"{attr}" in inspect.getsource(value)


def test_collect_is_the_module_and_calls_the_function():
    """`scio_recorder.collect` is the subpackage, callable as the function."""
    import scio_recorder.collect as face  # noqa: PLC0415 (the spelling tested)
    from scio_recorder import collect  # noqa: PLC0415 (the spelling tested)
    from scio_recorder.collect import _collect  # noqa: PLC0415

    assert isinstance(face, types.ModuleType)
    assert face is collect is scio_recorder.collect is sys.modules[f"{ROOT}.collect"]
    assert face.collect is _collect.collect
    assert isinstance(face.collect, types.FunctionType)
    assert face.InputOf.__name__ == "InputOf"
    assert callable(face)
    # inspect and help: the signature is the function's, the doc the module's,
    # which says that calling it calls the function
    assert inspect.signature(face) == inspect.signature(face.collect)
    assert face.__doc__ is not None
    assert "The module is callable" in face.__doc__
    assert face.__doc__.startswith("Collect layer statistics and features")
    assert "keep" in face.collect.__doc__
    assert "def collect(" in inspect.getsource(face.collect)
    assert "sys.modules[__name__].__class__" in inspect.getsource(face)


def lazy_faces() -> list[str]:
    """The faces that import some names when first used (`_lazy.lazy_attributes`)."""
    return [
        name
        for name in module_names()
        if is_package(name)
        and "lazy_attributes(" in source_of(name).read_text(encoding="utf-8")
    ]


def lazy_map_and_typing_imports(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """Read a lazy face's map and its imports under `TYPE_CHECKING` (name -> module)."""
    tree = ast.parse(source_of(name).read_text(encoding="utf-8"))
    lazy: dict[str, str] = {}
    typing: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "lazy_attributes"
        ):
            lazy.update(ast.literal_eval(node.value.args[1]))
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                if isinstance(inner, ast.ImportFrom) and inner.level:
                    module = "." * inner.level + (inner.module or "")
                    typing.update({a.asname or a.name: module for a in inner.names})
    return lazy, typing


def test_lazy_faces_are_found():
    """The check below is not vacuous: the root and `ood` are lazy faces."""
    assert {ROOT, f"{ROOT}.ood"} <= set(lazy_faces())


@pytest.mark.parametrize("name", lazy_faces())
def test_lazy_face_tells_type_checkers_and_docs_the_same_names(name):
    """Each lazy name is imported under `TYPE_CHECKING` from its module, and public.

    Type checkers and the docs (griffe) read those imports; the interpreter
    reads the map. Adding a name to the face: one map line, one import line
    under `TYPE_CHECKING`, one `__all__` entry.
    """
    lazy, typing = lazy_map_and_typing_imports(name)
    module = importlib.import_module(name)
    missing = {k: v for k, v in lazy.items() if typing.get(k) != v}
    assert missing == {}, (
        f"import these names under `TYPE_CHECKING` in {name}, from these modules: "
        f"{missing}"
    )
    unmapped = {
        k: v for k, v in typing.items() if k not in lazy and k in module.__all__
    }
    assert unmapped == {}, f"add these names to the lazy map of {name}: {unmapped}"
    assert set(lazy) <= set(module.__all__), (
        f"add to `__all__`: {set(lazy) - set(module.__all__)}"
    )
    assert set(lazy) <= set(dir(module))


def test_the_lazy_face_reader_sees_both_lists(monkeypatch, tmp_path):
    """It reads the map and the `TYPE_CHECKING` imports (so a drift shows)."""
    fake = tmp_path / "__init__.py"
    fake.write_text(
        "from typing import TYPE_CHECKING\n"
        "__getattr__, __dir__ = lazy_attributes(__name__, {'A': '._a', 'B': '._b'})\n"
        "if TYPE_CHECKING:\n"
        "    from ._a import A\n"
        "    from ..c import C as D\n",
        encoding="utf-8",
    )
    monkeypatch.setitem(globals(), "source_of", lambda _name: fake)
    assert lazy_map_and_typing_imports("x") == (
        {"A": "._a", "B": "._b"},
        {"A": "._a", "D": "..c"},
    )


# ------------------------------------------------------------ the OoD catalogue
REPO = PACKAGE.parent
CATALOGUE_COUNTS = (
    # "32 of the catalogue's 39": the demo's default set, then the catalogue
    r"(?P<part>\d+) of the catalogue's (?P<all>\d+)",
    r"(?P<part>\d+) of the (?P<all>\d+) (?:OoD )?detectors",
    r"\((?P<part>\d+) of (?P<all>\d+), every family",
    r"whole catalogue of (?P<all>\d+)",
    r"(?P<all>\d+) post-hoc\s+detectors",
    r"(?P<all>\d+)-detector benchmark",
    r"all (?P<all>\d+) detectors of `scio_recorder\.ood`",
    r"OoD benchmark '\w+': (?P<all>\d+) detectors",  # the docs' results tables
)
"""How the docs, the README and the CLI state the catalogue's size (not the
changelog: what a release had stays as it was)."""


@functools.cache
def built_catalogue() -> dict[str, object]:
    """The benchmark's catalogue, built once for the digits CNN."""
    from scio_recorder import Recorder  # noqa: PLC0415 (only here)
    from scio_recorder.models import digits_cnn  # noqa: PLC0415
    from scio_recorder.ood import benchmark  # noqa: PLC0415

    return benchmark.catalogue(Recorder(digits_cnn(6), input_size=(1, 1, 8, 8)))


def catalogue_count_statements() -> list[tuple[str, re.Match[str]]]:
    """Every statement of the catalogue's size: (file, match)."""
    paths = [
        REPO / "README.md",
        REPO / "benchmarks" / "README.md",
        *sorted((PACKAGE / "cli").glob("*.py")),
        PACKAGE / "demo.py",
        *sorted((REPO / "docs").rglob("*.md")),
    ]
    found = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for pattern in CATALOGUE_COUNTS:
            found += [(path.name, m) for m in re.finditer(pattern, text)]
    return found


def test_the_catalogue_is_the_one_list_of_detectors():
    """Every list of the OoD detectors is the catalogue's table, or agrees with it.

    The benchmark's catalogue and its names are built from the table; the
    face exports each class it builds from the module that defines it (the
    map, `__all__` and the imports for type checkers, as written) and no
    other detector; the docs give each a row of the OoD page's table and a
    section of the API page, and every count they state is the table's.
    """
    from scio_recorder.demo import DETECTORS as DEMO  # noqa: PLC0415 (only here)
    from scio_recorder.ood import _catalogue, benchmark  # noqa: PLC0415

    names = [name for name, _ in _catalogue.DETECTORS]
    built = built_catalogue()
    assert list(built) == names == list(benchmark.CATALOGUE)
    assert len(set(names)) == len(names)
    defined = {type(d).__name__: type(d).__module__ for d in built.values()}
    face = f"{ROOT}.ood"
    ood = importlib.import_module(face)
    lazy, typing = lazy_map_and_typing_imports(face)
    wanted = {name: "." + module.rpartition(".")[2] for name, module in defined.items()}
    assert {k: lazy.get(k) for k in wanted} == wanted, "the face's lazy map"
    assert {k: typing.get(k) for k in wanted} == wanted, "its TYPE_CHECKING imports"
    assert set(wanted) <= set(ood.__all__), "its __all__"
    exported = {
        name
        for name in ood.__all__
        if isinstance(value := getattr(ood, name), type)
        and issubclass(value, ood.Detector)
        and value not in {ood.Detector, ood.ClassConditional}
    }
    exported -= set(_catalogue.LANGUAGE_MODELS)  # not for classifiers
    assert exported == set(wanted), "detectors the catalogue does not build"
    docs = REPO / "docs"
    families = ("ood-logits.md", "ood-features.md", "ood-layers.md", "ood-gradients.md")
    api = re.findall(
        r"^::: scio_recorder\.ood\.(\w+)$",
        "".join((docs / "api" / f).read_text(encoding="utf-8") for f in families),
        flags=re.MULTILINE,
    )
    assert sorted(api) == sorted(wanted), "docs/api/ood-*.md, one page a family"
    index = (docs / "api" / "ood-detectors.md").read_text(encoding="utf-8")
    listed = re.findall(r"`(\w+)`[,.]", "".join(re.findall(r"(?m)^- .*$", index)))
    assert sorted(listed) == sorted(wanted), "its index"
    page = (docs / "ood.md").read_text(encoding="utf-8")
    table = page[page.index("| detector | paper |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE)
    assert sorted(rows) == sorted(wanted), "docs/ood.md's table of detectors"
    counts = catalogue_count_statements()
    assert {m.re.pattern for _, m in counts} == set(CATALOGUE_COUNTS)  # each found
    wrong = [
        (where, m.group(0))
        for where, m in counts
        if int(m["all"]) != len(names)
        or ("part" in m.groupdict() and int(m["part"]) != len(DEMO))
    ]
    assert wrong == [], f"the catalogue has {len(names)}, the demo {len(DEMO)}"


def test_benchmarks_measure_the_package_catalogue(monkeypatch):
    """`benchmarks/ood.py` builds the package's catalogue, not a list of its own."""
    from scio_recorder.ood.benchmark import CATALOGUE  # noqa: PLC0415

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "ood_benchmark", REPO / "benchmarks" / "ood.py"
    )
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)  # its dataclasses look it up
    spec.loader.exec_module(script)
    net = script.build("demo", script.data(16, 16, seed=0))
    assert tuple(script.catalogue(net)) == CATALOGUE


def test_no_detector_family_imports_another():
    """A family module (one defining catalogue detectors) imports no other family.

    The families stand on the ground floor (``_layers``, ``_geometry``,
    ``_inputs``, ``_outputs``) and the protocol; a helper two families share
    moves down there.
    """
    families = {type(d).__module__ for d in built_catalogue().values()}
    assert len(families) > 10  # the check is not vacuous
    known = set(module_names())
    crossing = {
        family: sorted(imports_of(family, known) & families) for family in families
    }
    assert {k: v for k, v in crossing.items() if v} == {}
