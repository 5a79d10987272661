"""The docs site's own code: Sphinx roles become links, a raw role fails the build."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

DOCS = Path(__file__).resolve().parent.parent / "docs"


def load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def roles():
    return load("griffe_roles")


@pytest.fixture(scope="module")
def package():
    return griffe.load("scio_recorder", search_paths=[str(DOCS.parent)])


def test_roles_become_links_to_the_canonical_path(roles, package):
    recorder = package["Recorder"].final_target
    text = (
        "See :meth:`record`, :class:`~scio_recorder.Layer` and "
        ":mod:`scio_recorder.select`."
    )
    out = roles.convert(text, recorder, package)
    assert ":meth:" not in out
    assert ":class:" not in out
    link = '<autoref identifier="scio_recorder.recorder.Recorder.record" optional>'
    assert link in out
    assert "<code>record()</code>" in out
    link = '<autoref identifier="scio_recorder.layers.Layer" optional>'
    assert link + "<code>Layer</code>" in out
    assert (
        '<autoref identifier="scio_recorder.select" optional>'
        "<code>scio_recorder.select</code>"
    ) in out


def test_names_outside_the_package_stay_code(roles, package):
    out = roles.convert(
        ":func:`torch.compile` and :class:`~torch.nn.Module`", package, package
    )
    assert out == "`torch.compile()` and `Module`"


def test_relative_names_resolve_through_the_enclosing_scopes(roles, package):
    forward = package["Recorder"].final_target["forward"]
    out = roles.convert(":attr:`activations`", forward, package)
    assert 'identifier="scio_recorder.recorder.Recorder.activations"' in out


def test_a_raw_role_left_in_a_page_fails_the_build():
    hooks = load("hooks")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_path="api/x.md"))
    assert hooks.on_post_page("<p><code>record()</code></p>", page, {}) is not None
    expected = r"api/x.md: raw Sphinx roles \[':func:<code>'\]"
    with pytest.raises(ValueError, match=expected):
        hooks.on_post_page("<p>:func:<code>record</code></p>", page, {})
