"""Record what chosen functions and methods return, by their import path.

:class:`CallRecorder` is this library's version of MMRazor's
``FunctionOutputsRecorder`` and ``MethodOutputsRecorder``: give it dotted paths
such as ``"pkg.module.func"`` or ``"pkg.module.Class.method"``, run code inside
``with recorder:``, and read what each callable returned, in order.

It works by replacing the attribute named by the path (``func`` on the module
``pkg.module``, ``method`` on the class ``Class``) with a recording wrapper for
the duration of the block. Two consequences shape the design:

**Patch where the callable is looked up, not where it is defined.** Python
code finds a function at call time by looking a name up somewhere. After
``from a import f`` the module ``b`` holds its *own* reference ``b.f``, and its
code calls ``f(...)`` through ``b``'s globals. Replacing ``a.f`` does not touch
that reference, so those calls are not recorded; the path to give is
``"b.f"``. Code that writes ``a.f(...)`` (for example ``F.relu(...)`` after
``import torch.nn.functional as F``) looks ``f`` up on ``a`` at every call, so
``"a.f"`` is the right path for it. This is MMRazor's rule: a function defined
in ``mmdet/core/anchor/utils.py`` and imported into
``mmdet/models/dense_heads/anchor_head.py`` is recorded as
``"mmdet.models.dense_heads.anchor_head.anchor_inside_flags"``.

**Restore always, and exactly.** Leaving a wrapper behind would silently change
the program for everything that runs afterwards, so the block's exit restores
the original attribute whatever happens inside it (an exception, a
``KeyboardInterrupt``). It puts back the very object that was in the owner's
``__dict__`` (a ``staticmethod`` or ``classmethod`` object stays one), and a
method the class only inherited is deleted again rather than left behind as a
copy. Several recorders may watch the same attribute, nested or not, in any
order: the attribute is patched once, while at least one of them is active,
and every active recorder receives the calls.

Importing this module patches nothing; paths are imported and resolved when a
recorder is created, and patched only inside its ``with`` block.
"""

from __future__ import annotations

__all__ = ["CallRecorder"]

import difflib
import functools
import importlib
import sys
import threading
import types
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import TypeAlias

    from typing_extensions import Self

    _Sink: TypeAlias = Callable[[tuple[Any, ...], dict[str, Any], Any], None]

_Inputs = tuple[tuple[Any, ...], dict[str, Any]]

# ``Py_TPFLAGS_IMMUTABLETYPE``: built-in types whose attributes cannot be set.
_IMMUTABLE_TYPE_FLAG = 1 << 8

# Guards the patch registry and the activity of every recorder.
_LOCK = threading.RLock()


class _Target(NamedTuple):
    """A resolved path: the attribute ``name`` of the object ``owner``."""

    path: str
    owner: object
    name: str


class _Call(NamedTuple):
    """One recorded call: the return value and, if kept, the arguments."""

    output: Any
    inputs: _Inputs | None


class _Patch:
    """The recording wrapper installed on one attribute, shared by recorders.

    The attribute is replaced when the first recorder watching it becomes
    active and restored when the last one stops; in between, each call is
    passed to every subscribed sink.
    """

    def __init__(self, owner: object, name: str) -> None:
        self.owner = owner
        self.name = name
        self.sinks: tuple[_Sink, ...] = ()
        namespace = _namespace(owner)
        self.had_own = namespace is not None and name in namespace
        self.saved: object = namespace.get(name) if namespace is not None else None
        self.replacement = self._make_replacement()

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Return a function that calls ``func`` and reports the call."""

        @functools.wraps(func)
        def recording(*args: Any, **kwargs: Any) -> Any:
            output = func(*args, **kwargs)
            for sink in self.sinks:
                sink(args, kwargs, output)
            return output

        return recording

    def _make_replacement(self) -> object:
        """Build the object to store in place of the attribute.

        On a class it keeps the attribute's binding behaviour: a function
        stays a function (bound to the instance), a static or class method
        stays one, a callable that does not bind (a built-in function) becomes
        a static method, and any other descriptor is wrapped after binding.
        """
        owner, name = self.owner, self.name
        if not isinstance(owner, type):
            return self.wrap(getattr(owner, name))
        raw = _class_attribute(owner, name)
        if isinstance(raw, staticmethod):
            return staticmethod(self.wrap(raw.__func__))
        if isinstance(raw, classmethod):
            return classmethod(self.wrap(raw.__func__))
        if isinstance(raw, types.FunctionType):
            return self.wrap(raw)
        if callable(raw) and not hasattr(type(raw), "__get__"):
            return staticmethod(self.wrap(raw))
        return _BindThenRecord(raw, self)

    def install(self) -> None:
        """Replace the attribute with the recording wrapper."""
        setattr(self.owner, self.name, self.replacement)

    def uninstall(self) -> None:
        """Put back the original attribute, or remove it if it was inherited."""
        if self.had_own:
            setattr(self.owner, self.name, self.saved)
        else:
            delattr(self.owner, self.name)


class _BindThenRecord:
    """A descriptor that binds the original descriptor, then records the call."""

    def __init__(self, raw: Any, patch: _Patch) -> None:
        self._raw = raw
        self._patch = patch

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return self._patch.wrap(self._raw.__get__(instance, owner))


# The active patches, by ``(id(owner), name)``; each keeps its owner alive.
_PATCHES: dict[tuple[int, str], _Patch] = {}


class CallRecorder:
    """Record the return values of functions and methods named by import path.

    Inside ``with recorder:`` every call of each target, from any thread,
    appends its return value to that path's record, in the order the calls
    return. Outside the block nothing is patched.

    Parameters
    ----------
    *paths : str
        Dotted import paths of the callables to record: ``"pkg.module.func"``,
        ``"pkg.module.Class.method"`` or ``"pkg.module.Outer.Inner.method"``.
        Give the path where the callable is *looked up when called*, not where
        it is defined: after ``from a import f`` in module ``b``, calls to
        ``f`` made by ``b`` are recorded with ``"b.f"``, not ``"a.f"``. A
        method path patches the named class only: calls on its instances and
        on instances of subclasses that do not override the method are
        recorded. Static and class methods, and methods inherited from a base
        class, are supported. Repeated paths are recorded once.
    keep_inputs : bool, default False
        Also keep the arguments of every call, read with :meth:`inputs`.

    Raises
    ------
    ValueError
        If a path is malformed, or does not resolve (the message names the
        part that failed and suggests close matches).
    TypeError
        If a path names something that is not callable or cannot be patched
        (an attribute of a built-in type).

    Notes
    -----
    Paths are imported and resolved when the recorder is created, and patched
    when it is entered. Exiting the block always restores the original
    attributes exactly, also after an exception or a ``KeyboardInterrupt``.

    Records accumulate over successive ``with`` blocks until :meth:`clear`.
    A recorder may be entered again while active (nested, or from another
    thread): it stays active until the outermost block ends. Several
    recorders may record the same path at once; each receives every call.

    Return values and arguments are kept as they are, not copied: an object
    mutated after the call shows its new state in the record. A call that
    raises records nothing.

    Examples
    --------
    >>> import json
    >>> from scio_recorder.calls import CallRecorder
    >>> rec = CallRecorder("json.dumps")
    >>> with rec:
    ...     first = json.dumps([1, 2])
    ...     second = json.dumps({"a": None})
    >>> rec["json.dumps"]
    ('[1, 2]', '{"a": null}')
    >>> rec.get("json.dumps", 1)
    '{"a": null}'
    >>> json.dumps(3)  # not recorded: the block has ended
    '3'
    >>> len(rec["json.dumps"])
    2
    >>> rec
    CallRecorder('json.dumps')
    """

    def __init__(self, *paths: str, keep_inputs: bool = False) -> None:
        if not paths:
            msg = "CallRecorder needs at least one path, e.g. 'pkg.module.func'"
            raise ValueError(msg)
        unique = tuple(dict.fromkeys(paths))
        self._targets = tuple(_resolve(path) for path in unique)
        self._keep_inputs = bool(keep_inputs)
        self._calls: dict[str, list[_Call]] = {path: [] for path in unique}
        self._depth = 0
        self._subscriptions: list[tuple[tuple[int, str], _Sink]] = []

    # ------------------------------------------------------------------ state
    @property
    def paths(self) -> tuple[str, ...]:
        """The recorded paths, in the order given."""
        return tuple(self._calls)

    @property
    def keep_inputs(self) -> bool:
        """Whether the arguments of each call are kept."""
        return self._keep_inputs

    @property
    def active(self) -> bool:
        """Whether the recorder is inside a ``with`` block."""
        return self._depth > 0

    # ---------------------------------------------------------------- context
    def __enter__(self) -> Self:
        """Patch the targets (on the first entry) and return the recorder."""
        with _LOCK:
            if self._depth == 0:
                self._subscribe()
            self._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        """Restore the targets when the outermost block ends."""
        with _LOCK:
            if self._depth == 0:
                msg = "CallRecorder.__exit__ called on a recorder that is not active"
                raise RuntimeError(msg)
            self._depth -= 1
            if self._depth == 0:
                self._unsubscribe()

    def _subscribe(self) -> None:
        """Add this recorder's sinks to the patches, installing them as needed."""
        try:
            for target in self._targets:
                key = (id(target.owner), target.name)
                patch = _PATCHES.get(key)
                if patch is None:
                    try:
                        patch = _Patch(target.owner, target.name)
                        patch.install()
                    except (AttributeError, LookupError, TypeError) as error:
                        msg = (
                            f"cannot record {target.path!r}: replacing "
                            f"`{target.name}` failed: {error}"
                        )
                        raise TypeError(msg) from error
                    _PATCHES[key] = patch
                sink = functools.partial(self._append, target.path)
                patch.sinks = (*patch.sinks, sink)
                self._subscriptions.append((key, sink))
        except BaseException:
            self._unsubscribe()
            raise

    def _unsubscribe(self) -> None:
        """Remove this recorder's sinks; restore attributes nobody watches."""
        errors: list[BaseException] = []
        while self._subscriptions:
            key, sink = self._subscriptions.pop()
            patch = _PATCHES[key]
            patch.sinks = tuple(s for s in patch.sinks if s is not sink)
            if not patch.sinks:
                del _PATCHES[key]
                try:
                    patch.uninstall()
                except Exception as error:  # noqa: BLE001 - restore the others first
                    errors.append(error)
        if errors:
            raise errors[0]

    def _append(
        self,
        path: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        inputs = (args, kwargs) if self._keep_inputs else None
        self._calls[path].append(_Call(output, inputs))

    # ---------------------------------------------------------------- results
    def _records(self, path: str) -> list[_Call]:
        try:
            return self._calls[path].copy()
        except KeyError:
            known = ", ".join(map(repr, self._calls))
            msg = f"{path!r} is not recorded by this recorder; its paths are {known}"
            raise KeyError(msg) from None

    def outputs(self, path: str) -> tuple[Any, ...]:
        """Return the recorded return values of ``path``, in call order.

        Parameters
        ----------
        path : str
            One of the paths given to the recorder, spelled the same way.

        Returns
        -------
        tuple
            One return value per recorded call. ``rec[path]`` is the same.

        Raises
        ------
        KeyError
            If ``path`` is not one of the recorder's paths.

        Examples
        --------
        >>> import json
        >>> from scio_recorder.calls import CallRecorder
        >>> with CallRecorder("json.loads") as rec:
        ...     _ = json.loads("[1, 2]"), json.loads("true")
        >>> rec.outputs("json.loads")
        ([1, 2], True)
        """
        return tuple(call.output for call in self._records(path))

    def __getitem__(self, path: str) -> tuple[Any, ...]:
        return self.outputs(path)

    def inputs(self, path: str) -> tuple[_Inputs, ...]:
        """Return the arguments of the recorded calls of ``path``.

        Parameters
        ----------
        path : str
            One of the paths given to the recorder.

        Returns
        -------
        tuple of (tuple, dict)
            One ``(args, kwargs)`` pair per recorded call, aligned with
            :meth:`outputs`. For a method called on an instance, ``args``
            starts with the instance (``self``); for a class method, with the
            class.

        Raises
        ------
        KeyError
            If ``path`` is not one of the recorder's paths.
        RuntimeError
            If the recorder was created without ``keep_inputs=True``.

        Examples
        --------
        >>> import json
        >>> from scio_recorder.calls import CallRecorder
        >>> with CallRecorder("json.dumps", keep_inputs=True) as rec:
        ...     _ = json.dumps([1], indent=2)
        >>> rec.inputs("json.dumps")
        ((([1],), {'indent': 2}),)
        """
        records = self._records(path)
        if not self._keep_inputs:
            msg = (
                "this recorder does not keep inputs; "
                "create it with CallRecorder(..., keep_inputs=True)"
            )
            raise RuntimeError(msg)
        return tuple(call.inputs for call in records if call.inputs is not None)

    def get(self, path: str, index: int) -> Any:
        """Return the return value of one recorded call of ``path``.

        The equivalent of MMRazor's ``get_record_data(record_idx=index)``.

        Parameters
        ----------
        path : str
            One of the paths given to the recorder.
        index : int
            The position of the call among the recorded calls of ``path``,
            counted from 0; negative values count from the end.

        Returns
        -------
        Any
            That call's return value.

        Raises
        ------
        KeyError
            If ``path`` is not one of the recorder's paths.
        IndexError
            If there is no recorded call at ``index``.

        Examples
        --------
        >>> import json
        >>> from scio_recorder.calls import CallRecorder
        >>> with CallRecorder("json.dumps") as rec:
        ...     _ = [json.dumps(n) for n in range(3)]
        >>> rec.get("json.dumps", 2)
        '2'
        """
        outputs = self.outputs(path)
        try:
            return outputs[index]
        except IndexError:
            msg = (
                f"{path!r} has {len(outputs)} recorded calls; "
                f"index {index} is out of range"
            )
            raise IndexError(msg) from None

    def clear(self) -> None:
        """Forget every recorded call; the recorder stays active if it was."""
        for calls in self._calls.values():
            calls.clear()

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __contains__(self, path: object) -> bool:
        return path in self._calls

    def __repr__(self) -> str:
        args = [repr(path) for path in self._calls]
        if self._keep_inputs:
            args.append("keep_inputs=True")
        return f"{type(self).__name__}({', '.join(args)})"


# ------------------------------------------------------------------ resolution
def _namespace(owner: object) -> dict[str, Any] | None:
    """Return ``vars(owner)``, or ``None`` if ``owner`` has no ``__dict__``."""
    try:
        return dict(vars(owner))
    except TypeError:
        return None


def _class_attribute(cls: type, name: str) -> object:
    """Return the raw attribute ``name`` of ``cls`` or of the first base holding it.

    Raises ``LookupError`` if no class of ``cls.__mro__`` defines ``name``.
    """
    for klass in cls.__mro__:
        namespace = vars(klass)
        if name in namespace:
            return namespace[name]
    raise LookupError(name)


def _suggestion(name: str, candidates: list[str]) -> str:
    """Return ``"; did you mean `x`?"`` for the closest candidate, or ``""``."""
    matches = difflib.get_close_matches(name, candidates, n=1)
    return f"; did you mean `{matches[0]}`?" if matches else ""


def _import_longest_prefix(path: str, parts: list[str]) -> tuple[object, int]:
    """Import the longest proper prefix of ``parts`` that is a module.

    Returns the module and the number of parts it spans. A module that exists
    but fails to import (even because one of its own imports is missing)
    raises its own error.
    """
    for end in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:end])
        try:
            return importlib.import_module(module_name), end
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if module_name != missing and not module_name.startswith(missing + "."):
                raise
    top = parts[0]
    loaded = sorted({name.partition(".")[0] for name in sys.modules})
    msg = (
        f"cannot record {path!r}: there is no module named `{top}`"
        f"{_suggestion(top, loaded)}"
    )
    if not msg.endswith("?"):
        msg += "; check the spelling and that the package is installed"
    raise ValueError(msg)


def _resolve(path: str) -> _Target:
    """Resolve ``path`` to the owner of its last component, checking the target."""
    if not isinstance(path, str):
        msg = f"paths must be strings like 'pkg.module.func', got {path!r}"
        raise TypeError(msg)
    parts = path.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):  # noqa: PLR2004
        msg = (
            f"cannot record {path!r}: a path is 'module.function' or "
            "'module.Class.method', dotted names of an importable module "
            "followed by attribute names"
        )
        raise ValueError(msg)
    owner, end = _import_longest_prefix(path, parts)
    for i in range(end, len(parts)):
        name = parts[i]
        try:
            attribute = getattr(owner, name)
        except AttributeError:
            prefix = ".".join(parts[:i])
            hint = _suggestion(name, dir(owner))
            msg = f"cannot record {path!r}: `{prefix}` has no attribute `{name}`"
            msg += hint or f"; check the spelling (see dir({prefix}))"
            raise ValueError(msg) from None
        if i < len(parts) - 1:
            owner = attribute
    name = parts[-1]
    if not callable(attribute):
        msg = (
            f"cannot record {path!r}: it is a {type(attribute).__name__} object, "
            "not a function or method"
        )
        raise TypeError(msg)
    if isinstance(owner, type):
        owner_path = ".".join(parts[:-1])
        if owner.__flags__ & _IMMUTABLE_TYPE_FLAG:
            msg = (
                f"cannot record {path!r}: `{owner_path}` is a built-in type whose "
                "attributes cannot be replaced; record a Python subclass's "
                "method, or a function that calls it"
            )
            raise TypeError(msg)
        try:
            _class_attribute(owner, name)
        except LookupError:
            msg = (
                f"cannot record {path!r}: `{name}` is not defined on `{owner_path}` "
                "or its base classes (it comes from the metaclass or __getattr__)"
            )
            raise TypeError(msg) from None
    return _Target(path, owner, name)
