"""The values a forward reads into Python, and whether they change anything.

A forward's Python code can depend on tensor *values* through a read that
turns a value into a Python object, the subject of this module, or through
a shape that depends on values (``x[x > 0]``, ``nonzero``, read through
``.shape``), which no watch here sees (:mod:`scio_recorder._run.flow` says what
catches it). The reads: ``bool(t)`` (``if x.sum() > 0:``,
``if t.any():``, ``pad_id in ids``), ``t.item()``, ``int(t)``, ``float(t)``,
an index taken from a tensor, ``torch.equal``, ``torch.allclose``,
``t.tolist()``, and the reads C++ makes when a tensor stands for a number
(``torch.zeros(t)``). All of them but ``tolist`` go through an operator
tagged ``torch.Tag.data_dependent_output`` (``aten._local_scalar_dense``,
``aten.equal``, ``aten.allclose``), which a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` sees; ``tolist``
reads memory directly and is wrapped for the duration of a watch.

* :func:`watching` runs code under such a mode, :class:`Watch`, which lists
  every read with what it returned and where (the innermost frame of the
  net's own code), and can *force* the outcomes of the first yes/no reads.
  The mode only observes (it calls each operator as it comes, on real
  tensors), so the pass is the one a plain pass makes, fused fast paths
  included (``MultiheadAttention`` and ``TransformerEncoderLayer`` skip theirs
  for tensor subclasses and torch-function modes, not for dispatch modes). It
  costs one Python call per operator.
* :func:`without_effect` decides whether the reads of a pass change nothing
  the pass computes. A read of a *number* (``item()`` of a float, ``int``,
  ``tolist``) has too many outcomes to try: it may change anything. A *yes/no*
  read (one that returns a Python ``bool``: a boolean tensor read as a
  scalar, ``torch.equal``, ``torch.allclose``) has two, and both are tried:
  the pass is run again with the read forced to its other outcome, the reads
  before it answered as in the pass branched from, those after it as the data
  says. A forced pass may read more yes/no values, whose other outcomes are
  tried in turn: the passes walk the whole tree of outcomes (a node is a
  prefix of forced outcomes), at most ``MAX_PASSES`` of them. The reads are
  without effect when every forced pass makes exactly the module calls of the
  natural pass (same modules, same order, same nesting) and every call
  returns bit-identical tensors, the net's own output included: what such a
  read decides is only a side effect (a warning, a log line, a print).

Why trying the outcomes is enough: given the net, its parameters and the
inputs, the forward's Python code is a deterministic function of the outcomes
of its reads, so which reads happen next, which modules run and what they
return are functions of the outcomes so far. Every sequence of yes/no
outcomes that some data could produce is a path of the tree, so when every
path computes the same calls and values, no data of these shapes makes the
forward compute anything else through these reads. Forcing may also try
paths that no data reaches (``x.all()`` true while ``x.any()`` is false):
they can only find more effects, never fewer. The forced passes run on the
same inputs as the natural one (the random state is set back before each,
then to where the caller's pass left it), so they differ from it only by the
forced outcomes.

What a watch cannot see: a read of memory outside the forward's operators
(``numpy()``, ``data_ptr()``, a C extension), and a shape that depends on
values (``x[x > 0]``) read through ``.shape``.

Side effects of the forced passes: they run the other branch's Python code.
Its warnings, log records and prints are silenced (process-wide, for their
duration), and so are those of the natural pass run again. The net is put
back as it was after each pass (:func:`~scio_recorder._net.preserve.preserved`):
modes, parameters, buffers, and every module's plain attributes with the
containers they hold, so a branch no data reached cannot leave
``self.safe = True`` behind. What a branch changes outside the net's modules
stays: globals and module-level state, a cache outside the modules
(transformers' ``logger.warning_once``; a ``functools.cache``), files
written, and random states other than torch's (the torch random state is
set back, below); so do the attributes of objects a module holds that are
not containers, namespaces or dataclasses (a logger, a tokenizer).

A model placed by accelerate runs its hooks (which load offloaded weights,
from a safetensors file for disk offload: reads that are not the net's) with
the watch paused (:func:`accelerate_hooks_in`).
"""

from __future__ import annotations

__all__ = [
    "MAX_PASSES",
    "DataRead",
    "Watch",
    "accelerate_hooks_in",
    "rng_state",
    "set_rng_state",
    "watching",
    "without_effect",
]

import contextlib
import dataclasses
import io
import linecache
import logging
import os
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torchinfo.torchinfo as _torchinfo_impl
from torch.utils._python_dispatch import TorchDispatchMode

from scio_recorder._net.preserve import preserved
from scio_recorder._support.tree import iter_tensors
from scio_recorder.layers import example_inputs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import FrameType

    from torch import Tensor, nn

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # noqa: PTH120 (a prefix)
# the library's own folder, scio_recorder/ (this module is in scio_recorder/_run/)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # noqa: PTH120
_TORCHINFO_DIR = os.path.dirname(_torchinfo_impl.__file__) + os.sep  # noqa: PTH120
_LIBRARY_DIRS = (_TORCH_DIR, _OWN_DIR, _TORCHINFO_DIR)

MAX_PASSES = 16
"""How many forced passes :func:`without_effect` runs at most."""


@dataclasses.dataclass(frozen=True)
class DataRead:
    """Where a forward read a tensor value into Python, and what it read.

    Attributes
    ----------
    location : str
        ``file:line`` of the innermost frame outside torch, torchinfo and this
        package (the net's own code), ``"an unknown line"`` if none.
    code : str
        The source line there, ``""`` if unknown.
    outcome : bool or None
        What a yes/no read returned; ``None`` for a read of a number.

    Examples
    --------
    >>> DataRead("net.py:12", "if x.sum() > 0:", outcome=True).describe()
    'net.py:12 (`if x.sum() > 0:`)'

    """

    location: str
    code: str
    outcome: bool | None = None

    def describe(self) -> str:
        """Say where the value was read, e.g. ``net.py:12 (`if x.sum() > 0:`)``."""
        return f"{self.location} (`{self.code}`)" if self.code else self.location

    @classmethod
    def at(cls, frame: FrameType | None, outcome: bool | None = None) -> DataRead:  # noqa: FBT001 (a value)
        """Describe a read made in ``frame`` (the net's innermost frame above it)."""
        while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
            frame = frame.f_back
        if frame is None:
            return cls("an unknown line", "", outcome)
        filename, line = frame.f_code.co_filename, frame.f_lineno
        code = linecache.getline(filename, line).strip()
        return cls(f"{filename}:{line}", code, outcome)


_READ_OPS: dict[Any, bool] = {}
"""Whether each operator seen so far reads a value (``data_dependent_output``)."""


def _reads(func: Any) -> bool:
    known = _READ_OPS.get(func)
    if known is None:
        known = _READ_OPS[func] = torch.Tag.data_dependent_output in func.tags
    return known


class Watch(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """List the reads of a pass; answer the first yes/no ones as ``forced`` says.

    ``forced[i]`` is returned by the ``i``-th yes/no read instead of what it
    computed. ``reads`` lists every read, in order, with what it returned.
    Reads made while ``paused`` is positive are not listed. Use it through
    :func:`watching`.
    """

    def __init__(self, forced: Sequence[bool] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.forced = tuple(forced)
        self.reads: list[DataRead] = []
        self.questions = 0
        self.paused = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Call ``func``; note (and maybe force) what it returns if it reads a value."""
        out = func(*args, **(kwargs or {}))
        if _reads(func) and not self.paused:
            frame = sys._getframe(1)  # noqa: SLF001 (the reader's stack)
            if isinstance(out, bool):
                if self.questions < len(self.forced):
                    out = self.forced[self.questions]
                self.questions += 1
                self.reads.append(DataRead.at(frame, out))
            else:
                self.reads.append(DataRead.at(frame))
        return out


# torch wraps a mode's `__torch_dispatch__` in `torch._disable_dynamo`, which
# imports Dynamo on its first call (about a second, and a reference to the
# process group that `docs/collect.md` warns about). A watch is never traced
# by Dynamo (a compiled module inside the net runs eagerly under a dispatch
# mode), so its own function is put back once the class is made.
Watch.__torch_dispatch__ = vars(Watch)["__torch_dispatch__"].__wrapped__  # type: ignore[method-assign]

_WATCHES = threading.local()
_TOLIST_LOCK = threading.Lock()
_tolist_users = [0]


def _tolist(self: Tensor) -> Any:
    """``Tensor.tolist``, noted as a read of numbers by the thread's watch."""
    watch: Watch | None = getattr(_WATCHES, "watch", None)
    if watch is not None and not watch.paused:
        watch.reads.append(DataRead.at(sys._getframe(1)))  # noqa: SLF001 (the reader)
    return torch._C.TensorBase.tolist(self)  # noqa: SLF001 (the original method)


@contextlib.contextmanager
def watching(net: nn.Module | None, forced: Sequence[bool] = ()) -> Iterator[Watch]:
    """Watch the reads of the enclosed code in this thread.

    ``Tensor.tolist`` is wrapped (for every thread, noting reads in the
    watching ones) while a watch is open; accelerate's hooks on the modules
    of ``net`` run with the watch paused.

    Examples
    --------
    >>> import torch
    >>> x = torch.tensor([1.0, -2.0])
    >>> with watching(None) as watch:
    ...     positive = bool(x.sum() > 0)
    >>> positive, [read.outcome for read in watch.reads]
    (False, [False])
    >>> with watching(None, forced=[True]):
    ...     bool(x.sum() > 0)
    True

    """
    watch = Watch(forced)

    @contextlib.contextmanager
    def paused() -> Iterator[None]:
        watch.paused += 1
        try:
            yield
        finally:
            watch.paused -= 1

    with _TOLIST_LOCK:
        if _tolist_users[0] == 0:
            torch.Tensor.tolist = _tolist  # type: ignore[method-assign,assignment]
        _tolist_users[0] += 1
    previous = getattr(_WATCHES, "watch", None)
    _WATCHES.watch = watch
    try:
        with accelerate_hooks_in(net, paused), watch:
            yield watch
    finally:
        _WATCHES.watch = previous
        with _TOLIST_LOCK:
            _tolist_users[0] -= 1
            if _tolist_users[0] == 0:
                del torch.Tensor.tolist


@contextlib.contextmanager
def accelerate_hooks_in(
    net: nn.Module | None,
    around: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Iterator[None]:
    """Run the ``pre_forward``/``post_forward`` of accelerate's hooks in ``around()``.

    A model placed by accelerate (``dispatch_model``, ``cpu_offload``,
    ``disk_offload``, ``from_pretrained(..., device_map=...)``) has a hook on
    its modules (``module._hf_hook``) whose ``pre_forward`` moves the inputs
    to the module's execution device and, for an offloaded module, loads its
    weights from the offload map into new parameters; ``post_forward`` sets
    them back on the ``meta`` device. Passes of the library's own run these
    hooks as accelerate's, not the net's, code: the fake reference pass lifts
    its fake mode around them (accelerate rebuilds a parameter with
    ``type(param)(value)``, which a fake tensor's class refuses; the hooks
    then place real weights one module at a time, as in a real pass, while
    the module's own computation stays fake), and a watch pauses (loading a
    disk-offloaded module reads values). Each hook's methods are shadowed by
    instance attributes for the duration, then removed.
    """
    hooks = {
        id(hook): hook
        for module in (net.modules() if net is not None else ())
        if (hook := getattr(module, "_hf_hook", None)) is not None
    }
    patched: list[tuple[Any, str]] = []
    try:
        for hook in hooks.values():
            if not hasattr(hook, "__dict__"):  # not accelerate's
                continue
            for name in ("pre_forward", "post_forward"):
                method = getattr(hook, name, None)
                if method is None or name in vars(hook):
                    continue
                setattr(hook, name, _inside(method, around))
                patched.append((hook, name))
        yield
    finally:
        for hook, name in patched:
            delattr(hook, name)


def _inside(
    method: Any, around: Callable[[], contextlib.AbstractContextManager[Any]]
) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        with around():
            return method(*args, **kwargs)

    return call


# -- whether the reads change anything -------------------------------------------


RngState = tuple["Tensor", list["Tensor"] | None]


def rng_state() -> RngState:
    """Return the CPU random state and, if CUDA is in use, CUDA's."""
    initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    cuda = torch.cuda.get_rng_state_all() if initialized else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: RngState) -> None:
    """Set the random state returned by :func:`rng_state`."""
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


class _Differs(Exception):  # noqa: N818 (a signal, not an error)
    """A forced pass computes something else; ends it at once."""


class _Tap:
    """Hooks on every module that note its calls and outputs, or compare them.

    The natural pass notes each call's start and end and a copy of the
    tensors each call returns; a forced pass compares them as they come
    (``reference``) and stops at the first difference.
    """

    def __init__(self, net: nn.Module, reference: _Tap | None) -> None:
        self.net = net
        self.reference = reference
        self.watch: Watch | None = None  # paused while comparing (`torch.equal` reads)
        self.events: list[tuple[int, bool]] = []
        self.outputs: list[list[Tensor]] = []

    def _event(self, module: nn.Module, end: bool) -> None:  # noqa: FBT001 (a value)
        event = (id(module), end)
        reference = self.reference
        if reference is not None and (
            len(reference.events) <= len(self.events)
            or reference.events[len(self.events)] != event
        ):
            raise _Differs
        self.events.append(event)

    def pre(self, module: nn.Module, _args: object) -> None:
        self._event(module, end=False)

    def post(self, module: nn.Module, _args: object, output: Any) -> None:
        self._event(module, end=True)
        tensors = list(iter_tensors(output))
        if self.reference is None:
            self.outputs.append([t.detach().clone() for t in tensors])
            return
        expected = self.reference.outputs[len(self.outputs)]
        if self.watch is not None:
            self.watch.paused += 1
        try:
            same = len(tensors) == len(expected) and all(
                a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
                for a, b in zip(tensors, expected, strict=True)
            )
        finally:
            if self.watch is not None:
                self.watch.paused -= 1
        if not same:
            raise _Differs
        self.outputs.append([])

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        handles = []
        try:
            for module in self.net.modules():
                handles.append(module.register_forward_pre_hook(self.pre))
                handles.append(module.register_forward_hook(self.post))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def complete(self) -> bool:
        """Whether this forced pass ended where the reference pass did."""
        return self.reference is None or len(self.events) == len(self.reference.events)


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Silence warnings, log records and prints (a pass run again or forced)."""
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    sink = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(disabled)


def _tapped_pass(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    forced: Sequence[bool],
    reference: _Tap | None,
) -> tuple[_Tap, list[DataRead]]:
    """Run one pass like the reference pass, tapped and watched."""
    tap = _Tap(net, reference)
    train = str(summary_kwargs.get("mode", "eval")) == "train"
    with (
        _silenced(),
        preserved(net),
        torch.no_grad(),
        watching(net, forced) as watch,
        tap.installed(),
    ):
        tap.watch = watch
        args, kwargs = example_inputs(net, summary_kwargs)
        net.train(train)
        net(*args, **kwargs)
    return tap, watch.reads


def without_effect(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    reads: Sequence[DataRead],
    before: RngState,
) -> bool:
    """Whether the values read by a pass change nothing that pass computes.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        The reference pass's keyword arguments (inputs, ``mode``).
    reads : sequence of DataRead
        The reads that pass made (a :class:`Watch`'s ``reads``).
    before : tuple
        The random state before that pass (:func:`rng_state`): every pass
        here starts from it, so that ``input_size`` draws the same inputs.

    Returns
    -------
    bool
        ``True`` when every read is a yes/no whose other outcomes, tried as
        the module's docstring says, give the same module calls and
        bit-identical outputs; ``False`` otherwise (a read of a number, a
        difference, a forced pass that raises, or more than
        :data:`MAX_PASSES` forced passes to run).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> class Logs(nn.Module):
    ...     def forward(self, x):
    ...         if (x == 0).any():
    ...             print("a zero")
    ...         return x + 1
    >>> before = rng_state()
    >>> with watching(None) as watch:
    ...     _ = Logs()(torch.ones(2))
    >>> without_effect(Logs(), {"input_data": torch.ones(2)}, watch.reads, before)
    True

    """
    if any(read.outcome is None for read in reads):
        return False
    if not reads:
        return True
    after = rng_state()
    try:
        set_rng_state(before)
        natural, reads = _tapped_pass(net, summary_kwargs, (), None)
        return _every_path_the_same(net, summary_kwargs, natural, reads, before)
    finally:
        set_rng_state(after)


def _every_path_the_same(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    natural: _Tap,
    reads: Sequence[DataRead],
    before: RngState,
) -> bool:
    """Whether every forced path of ``reads`` computes what ``natural`` did."""
    if any(read.outcome is None for read in reads):
        return False
    pending = _branches(reads, 0)
    for _ in range(MAX_PASSES):
        if not pending:
            return True
        path = pending.pop(0)
        set_rng_state(before)
        try:
            tap, seen = _tapped_pass(net, summary_kwargs, path, natural)
        except Exception:  # noqa: BLE001 (a difference, or an error: an effect)
            return False
        if not tap.complete() or any(read.outcome is None for read in seen):
            return False
        pending += _branches(seen, len(path))
    return not pending


def _branches(reads: Sequence[DataRead], start: int) -> list[tuple[bool, ...]]:
    """List the forced outcomes that flip each yes/no read from the ``start``-th on."""
    outcomes = [bool(read.outcome) for read in reads]
    return [
        (*outcomes[:index], not outcomes[index])
        for index in range(start, len(outcomes))
    ]
