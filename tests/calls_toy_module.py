"""A toy module for ``tests/test_calls.py``: the targets of :class:`CallRecorder`.

``toy_func`` and ``Toy.toy_func`` are MMRazor's documented ``toy_module``
examples. The other names cover the shapes a recorded path can take: static
and class methods, a method inherited from a base class, a nested class, a
non-callable attribute, functions that raise, and an instance whose
attributes cannot be set.

The tests load this file under the module name ``calls_toy_module`` (see
``load_toy_module`` in ``tests/test_calls.py``), so the dotted paths given to
the recorder are ``calls_toy_module.toy_func``, ``calls_toy_module.Toy.toy_func``
and so on.
"""

from __future__ import annotations

import random

TOY_CONSTANT = 42


def toy_func() -> int:
    """Return a random integer, as in MMRazor's ``toy_module.toy_func``."""
    return random.randint(0, 1000000)


def double(x: int) -> int:
    """Return ``2 * x``."""
    return 2 * x


def fail(message: str) -> None:
    """Raise ``RuntimeError(message)``."""
    raise RuntimeError(message)


def interrupt() -> None:
    """Raise ``KeyboardInterrupt``, as if the user pressed Ctrl-C."""
    raise KeyboardInterrupt


class Toy:
    """MMRazor's ``toy_module.Toy`` with more kinds of methods."""

    def toy_func(self) -> int:
        """Return a random integer, as in MMRazor's ``Toy.toy_func``."""
        return random.randint(0, 1000000)

    def add(self, x: int, y: int = 0) -> int:
        """Return ``x + y``."""
        return x + y

    @staticmethod
    def static_double(x: int) -> int:
        """Return ``2 * x`` (a static method)."""
        return 2 * x

    @classmethod
    def class_name(cls, suffix: str = "") -> str:
        """Return the name of the class it is called on, plus ``suffix``."""
        return cls.__name__ + suffix

    class Inner:
        """A nested class."""

        def triple(self, x: int) -> int:
            """Return ``3 * x``."""
            return 3 * x


class SubToy(Toy):
    """A subclass that inherits every method of :class:`Toy`."""


class OverridingToy(Toy):
    """A subclass that overrides :meth:`Toy.add`."""

    def add(self, x: int, y: int = 0) -> int:
        """Return ``x + y + 100``."""
        return x + y + 100


class ToyList(list[int]):
    """A ``list`` subclass: ``append`` is a built-in method it inherits."""


class Slotted:
    """A class without instance ``__dict__``: its instances cannot be patched."""

    __slots__ = ()

    def value(self) -> int:
        """Return 1."""
        return 1


SLOTTED = Slotted()
