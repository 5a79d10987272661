"""Names of a public face that are imported when first used, not with the face.

``import scio_recorder`` imports what a plain recorder needs, and nothing
else: data-set collection, the OoD catalogue, saved records and the other
tools come with their first use. A face (a package's ``__init__``) lists
such names in a map, name -> the module that defines it, and takes its
module ``__getattr__`` and ``__dir__`` from :func:`lazy_attributes`
(:pep:`562`). The first access imports the module and binds the name in the
face, so later accesses are plain attribute reads; ``dir()``, ``from face
import *`` (through ``__all__``) and ``from face import Name`` see the lazy
names like the others.

Type checkers and the docs read the same names from ``import`` lines under
``TYPE_CHECKING`` in the face; ``tests/test_startup.py`` checks that the
map, those lines and ``__all__`` agree, and which modules ``import
scio_recorder`` loads.
"""

from __future__ import annotations

__all__ = ["lazy_attributes"]

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


def lazy_attributes(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``__getattr__`` and ``__dir__`` for the lazy names of ``package``.

    Parameters
    ----------
    package : str
        The face's ``__name__``.
    exports : mapping of str to str
        Each lazy name -> the module that defines it, relative to ``package``
        (``"._logits"``). A name that is a submodule of ``package`` maps to
        that submodule (``"collect": ".collect"``).

    Returns
    -------
    tuple
        The face's ``__getattr__`` (imports the module, binds the name in the
        face, returns it) and ``__dir__`` (the face's names and the lazy ones).

    Examples
    --------
    >>> import sys, types
    >>> face = types.ModuleType("face_example")
    >>> sys.modules["face_example"] = face
    >>> face.__getattr__, face.__dir__ = lazy_attributes(
    ...     "face_example", {"JSONDecoder": "json"}
    ... )
    >>> "JSONDecoder" in dir(face), "JSONDecoder" in vars(face)
    (True, False)
    >>> face.JSONDecoder.__name__, "JSONDecoder" in vars(face)
    ('JSONDecoder', True)
    >>> del sys.modules["face_example"]

    """

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module hook, PEP 562)
        where = exports.get(name)
        if where is None:
            msg = f"module {package!r} has no attribute {name!r}"
            raise AttributeError(msg)
        module = importlib.import_module(where, package)
        namespace = vars(sys.modules[package])
        if name in namespace:  # a submodule, bound by its own import
            return namespace[name]
        value = getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807 (the module hook, PEP 562)
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
