"""Named groups of recordings, entered and left together.

:class:`RecorderGroup` is this library's version of MMRazor's
``RecorderManager``: several recordings (module outputs or inputs, function or
method outputs, parameters) under keys chosen by the user, all started and
stopped by one ``with`` block. Build it from MMRazor-style config dicts with
:meth:`RecorderGroup.from_config`, or from members you made yourself (a
:meth:`Recorder.scope`, a :class:`~scio_recorder.CallRecorder`, or any
context manager).

Module entries of a config are served by one :class:`~scio_recorder.Recorder`
and one :meth:`~scio_recorder.Recorder.scope` over the whole group, so they
keep the Recorder's guarantees: every call is labelled and checked against the
call plan. That recorder selects (and hooks) its layers only while the group
is open: no hook or patch of the group survives the block.
"""

from __future__ import annotations

__all__ = ["RecorderGroup"]

import contextlib
from typing import TYPE_CHECKING, Any

from .calls import CallRecorder
from .recorder import Recorder
from .scope import Scope
from .select import resolve

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from types import TracebackType

    from torch import nn
    from typing_extensions import Self

_MODULE_KINDS = {"ModuleOutputs": "outputs", "ModuleInputs": "inputs"}
_CALL_KINDS = ("FunctionOutputs", "MethodOutputs")
_KINDS = (*_MODULE_KINDS, *_CALL_KINDS, "Parameter")


class _ModuleEntry:
    """Every call's output or input of one module, in call order."""

    def __init__(self, scope: Scope, name: str, kind: str) -> None:
        self.scope, self.name, self.kind = scope, name, kind

    @property
    def data(self) -> list[Any]:
        if self.kind == "outputs":
            try:
                return self.scope.records_of(self.name)
            except KeyError:  # nothing recorded yet: an empty buffer
                return []
        recorder = self.scope.recorder
        rows = resolve(recorder.table, recorder.net, [self.name])
        labels = [row.label for row in rows]
        per_label = [self.scope.inputs.get(label, []) for label in labels]
        return [
            inputs.args for calls in zip(*per_label, strict=True) for inputs in calls
        ]


class _ParameterEntry:
    """One parameter of the net."""

    def __init__(self, param: nn.Parameter) -> None:
        self.param = param

    @property
    def data(self) -> list[Any]:
        return [self.param]


class _HookedScope:
    """A scope whose recorder selects (and hooks) its layers only while open.

    So no hook of the group stays on the net outside its ``with`` block: on
    exit the recorder's previous selection comes back
    (:meth:`Recorder.selecting`), whatever it was.
    """

    def __init__(
        self, recorder: Recorder, outputs: list[str], inputs: list[str]
    ) -> None:
        self.recorder, self.outputs, self.inputs = recorder, outputs, inputs
        self.scope = recorder.scope()
        self._open: contextlib.ExitStack | None = None

    def __enter__(self) -> Scope:
        with contextlib.ExitStack() as stack:
            stack.enter_context(
                self.recorder.selecting(*self.outputs, inputs=self.inputs)
            )
            scope = stack.enter_context(self.scope)
            self._open = stack.pop_all()
        return scope

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._open = self._open, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)


class _CallEntry:
    """The outputs of one function or method."""

    def __init__(self, recorder: CallRecorder, path: str) -> None:
        self.recorder, self.path = recorder, path

    @property
    def data(self) -> list[Any]:
        return list(self.recorder[self.path])


class RecorderGroup:
    """Recordings under user keys, entered and left by one ``with`` block.

    Parameters
    ----------
    members : Mapping[str, Any]
        Key -> a context manager to enter with the group: a
        :meth:`Recorder.scope`, a :class:`~scio_recorder.CallRecorder`, or
        anything with ``__enter__``/``__exit__``.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import CallRecorder, Recorder, RecorderGroup
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> rnet = Recorder(net, input_size=(1, 2))
    >>> rnet.record("0")
    >>> group = RecorderGroup(
    ...     {
    ...         "linear": rnet.scope(),
    ...         "relu": CallRecorder("torch.nn.functional.relu"),
    ...     }
    ... )
    >>> with group:
    ...     out = net(torch.ones(1, 2))
    >>> torch.equal(group.get("relu"), out)
    True
    >>> len(group.data("linear"))
    1

    """

    def __init__(self, members: Mapping[str, Any]) -> None:
        for key, member in members.items():
            if not (hasattr(member, "__enter__") and hasattr(member, "__exit__")):
                msg = (
                    f"Member {key!r} of a `RecorderGroup` must be a context manager "
                    "(a `rnet.scope()`, a `CallRecorder`, ...), got "
                    f"{type(member).__name__}."
                )
                raise TypeError(msg)
        self._members = dict(members)
        self._entries: dict[str, Any] = {}
        self._stack: contextlib.ExitStack | None = None
        self.recorder: Recorder | None = None

    @classmethod
    def from_config(  # noqa: C901 (one branch per entry kind)
        cls,
        config: Mapping[str, Mapping[str, Any]],
        net: nn.Module | None = None,
        /,
        **recorder_kwargs: Any,
    ) -> RecorderGroup:
        """Build a group from MMRazor-style config dicts.

        Parameters
        ----------
        config : Mapping[str, Mapping]
            Key -> ``{"type": kind, "source": where}`` with kind one of
            ``"ModuleOutputs"``, ``"ModuleInputs"`` (source: a qualified module
            name; every call is kept, in call order), ``"FunctionOutputs"``,
            ``"MethodOutputs"`` (source: an import path, see
            :class:`~scio_recorder.CallRecorder`) or ``"Parameter"`` (source:
            a qualified parameter name).
        net : torch.nn.Module, optional
            The network, required when a module or parameter entry exists.
        **recorder_kwargs
            Passed to :class:`~scio_recorder.Recorder` (``input_size`` or
            ``input_data`` is required for its reference pass).

        Returns
        -------
        RecorderGroup
            ``group.recorder`` is the Recorder serving the module entries.

        Raises
        ------
        ValueError
            For an unknown ``type``, a missing ``source``, or module entries
            without ``net``.

        Examples
        --------
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 1))
        >>> group = RecorderGroup.from_config(
        ...     {
        ...         "conv1_rec": {"type": "ModuleOutputs", "source": "0"},
        ...         "w": {"type": "Parameter", "source": "1.weight"},
        ...     },
        ...     net,
        ...     input_size=(1, 1, 1, 1),
        ... )
        >>> with group:
        ...     _ = net(torch.rand(1, 1, 1, 1))
        >>> group.get("conv1_rec").shape, group.get("w") is net[1].weight
        (torch.Size([1, 1, 1, 1]), True)

        """
        outputs: dict[str, str] = {}
        inputs: dict[str, str] = {}
        params: dict[str, str] = {}
        calls: dict[str, str] = {}
        for key, entry in config.items():
            kind, source = entry.get("type"), entry.get("source")
            if kind not in _KINDS:
                msg = (
                    f"Entry {key!r} has type {kind!r}; use one of "
                    f"{', '.join(map(repr, _KINDS))}."
                )
                raise ValueError(msg)
            if not isinstance(source, str):
                msg = f"Entry {key!r} needs a `source` string, got {source!r}."
                raise ValueError(msg)  # noqa: TRY004 (a bad config value)
            store = {
                "ModuleOutputs": outputs,
                "ModuleInputs": inputs,
                "Parameter": params,
            }.get(kind, calls)
            store[key] = source
        members: dict[str, Any] = {}
        recorder = None
        if outputs or inputs or params:
            if net is None:
                msg = (
                    "Module and parameter entries need the network: "
                    "`RecorderGroup.from_config(config, net, input_size=...)`."
                )
                raise ValueError(msg)
            recorder = Recorder(net, **recorder_kwargs)
            hooked = _HookedScope(
                recorder, sorted(set(outputs.values())), sorted(set(inputs.values()))
            )
            # Check every selector now, so a bad source fails at build time.
            recorder.record(
                *hooked.outputs, inputs=hooked.inputs, params=list(params.values())
            )
            named = dict(recorder.params)
            recorder.record()
            members["\0scope"] = hooked
        if calls:
            members["\0calls"] = CallRecorder(*dict.fromkeys(calls.values()))
        group = cls(members)
        group.recorder = recorder
        for key, source in outputs.items():
            group._entries[key] = _ModuleEntry(
                members["\0scope"].scope, source, "outputs"
            )
        for key, source in inputs.items():
            group._entries[key] = _ModuleEntry(
                members["\0scope"].scope, source, "inputs"
            )
        for key, source in params.items():
            group._entries[key] = _ParameterEntry(named[source])
        for key, source in calls.items():
            group._entries[key] = _CallEntry(members["\0calls"], source)
        return group

    # -- context -----------------------------------------------------------

    def __enter__(self) -> Self:
        """Enter every member, in order; leave those entered if one fails."""
        if self._stack is not None:
            msg = "This group is already open."
            raise RuntimeError(msg)
        with contextlib.ExitStack() as stack:
            for member in self._members.values():
                stack.enter_context(member)
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leave every member, in reverse order, whatever happened."""
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    # -- access ------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        """Return the member (or config entry) under ``key``."""
        if key in self._entries:
            return self._entries[key]
        if key in self._members and not key.startswith("\0"):
            return self._members[key]
        raise KeyError(self._unknown(key))

    def __iter__(self) -> Iterator[str]:
        """Iterate over the user keys."""
        yield from self._entries
        yield from (key for key in self._members if not key.startswith("\0"))

    def __len__(self) -> int:
        """Return the number of user keys."""
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        """Return whether ``key`` names a recording of the group."""
        return key in self._entries or (
            isinstance(key, str) and key in self._members and not key.startswith("\0")
        )

    def _unknown(self, key: str) -> str:
        return f"No recording named {key!r}; the group has {sorted(self)}."

    def data(self, key: str) -> list[Any]:
        """Return every record of ``key``, in call order (MMRazor's ``data_buffer``).

        For a scope member, that is ``scope[label]`` of its only recorded label
        with ``reduce="all"``; give config entries or call recorders for other
        cases.
        """
        member = self[key]
        if isinstance(member, _ModuleEntry | _ParameterEntry | _CallEntry):
            return member.data
        if isinstance(member, CallRecorder):
            paths = member.paths
            if len(paths) != 1:
                msg = (
                    f"Member {key!r} records {len(paths)} paths; read one with "
                    f"`group[{key!r}][path]`."
                )
                raise ValueError(msg)
            return list(member[paths[0]])
        if isinstance(member, Scope):
            labels = list(member)
            if len(labels) != 1:
                msg = (
                    f"Member {key!r} recorded {len(labels)} labels; read one with "
                    f"`group[{key!r}][label]`."
                )
                raise ValueError(msg)
            result = member[labels[0]]
            return result if isinstance(result, list) else [result]
        msg = f"Member {key!r} ({type(member).__name__}) has no records to list."
        raise TypeError(msg)

    def get(self, key: str, index: int = 0) -> Any:
        """Return record ``index`` of ``key`` (MMRazor's ``get_record_data``)."""
        data = self.data(key)
        if not -len(data) <= index < len(data):
            msg = f"{key!r} has {len(data)} records; index {index} is out of range."
            raise IndexError(msg)
        return data[index]
