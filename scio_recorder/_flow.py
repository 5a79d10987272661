"""The static-flow check and the fake reference pass.

Both run the user's net under :class:`~torch._subclasses.fake_tensor.FakeTensorMode`:
every tensor the net computes is a *fake* tensor, which has a shape, a dtype
and a device but no values, and no kernel computes anything (the net's real
parameters and buffers are seen through fake copies made on first use, which
share no memory and cost none). Shapes are concrete, so control flow on
shapes runs as usual; reading a *value* into Python (``if x.sum() > 0``,
``x.item()``, ``int(x)``, ``x.tolist()``, ``torch.equal``) raises
:class:`~torch._subclasses.fake_tensor.DataDependentOutputException` at the
line that reads it.

* :func:`check_static_flow` is the ``force_static_flow`` check of
  :class:`~scio_recorder.Recorder`: a net is refused when a fake pass on the
  table's example inputs reads a tensor value into Python *and* the net is
  not traceable by :func:`torch.fx.symbolic_trace` (which accepted every net
  it refused before). Libraries written for :func:`torch.compile` and
  :func:`torch.export` (Hugging Face ``transformers``) skip their eager-only
  value checks on fake tensors, so their models pass. An operation that fake
  tensors cannot run (no fake kernel, a data-dependent output *shape* such as
  ``x[x > 0]``) ends the check without a verdict: the net is accepted.
* :func:`fake_table` builds the layer table from a fake reference pass
  (``Recorder(..., reference_tensors="fake")``) and falls back to the real pass,
  with a warning, where the fake one cannot run.

A model placed by accelerate (its modules carry ``_hf_hook``: offloaded
weights are loaded just before a module runs) is faked like any other, except
that accelerate's hooks run on real tensors (:func:`fake_pass`): they load one
module's real weights at a time, as in a real pass, while the module's own
computation stays fake.

Nothing is compiled: no Dynamo cache, no graph, no state is left behind; the
net's modes, ``requires_grad`` flags, parameters, buffers and accelerate
hooks' state are restored (:func:`~scio_recorder._preserve.preserved`).
"""

from __future__ import annotations

__all__ = [
    "DataRead",
    "check_static_flow",
    "fake_pass",
    "fake_table",
    "table_of",
]

import contextlib
import dataclasses
import functools
import os
import traceback
import warnings
from typing import TYPE_CHECKING, Any

import torch
import torchinfo.torchinfo as _torchinfo_impl
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.nn.parameter import is_lazy

from ._engine.passes import is_recorder
from ._preserve import preserved
from .layers import LayerTable, build_table, example_inputs, reference_kwargs

if TYPE_CHECKING:
    from collections.abc import Iterator

# torch's modules whose fast path is skipped for tensor subclasses (their
# forward checks `has_torch_function`): a fake pass would call other modules.
_TYPE_CHECKED_FAST_PATHS = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerEncoder,
)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # noqa: PTH120 (a prefix)
_OWN_DIR = os.path.dirname(__file__) + os.sep  # noqa: PTH120 (a prefix)
_TORCHINFO_DIR = os.path.dirname(_torchinfo_impl.__file__) + os.sep  # noqa: PTH120


@dataclasses.dataclass(frozen=True)
class DataRead:
    """Where a fake pass read a tensor value into Python.

    Attributes
    ----------
    location : str
        ``file:line`` of the innermost frame outside torch, torchinfo and this
        package (the net's own code), ``"an unknown line"`` if none.
    code : str
        The source line there, ``""`` if unknown.
    error : BaseException
        The exception fake tensors raised.
    """

    location: str
    code: str
    error: BaseException

    def describe(self) -> str:
        """Say where the value was read, e.g. ``net.py:12 (`if x.sum() > 0:`)``."""
        return f"{self.location} (`{self.code}`)" if self.code else self.location


def _find(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """Return the first exception of ``kind`` in the cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _data_read(error: BaseException) -> DataRead | None:
    """Return where ``error`` (or its causes) read a value, ``None`` if not."""
    read = _find(error, DataDependentOutputException)
    if read is None:
        return None
    frames = [
        frame
        for frame in traceback.extract_tb(read.__traceback__)
        if not frame.filename.startswith((_TORCH_DIR, _OWN_DIR, _TORCHINFO_DIR))
    ]
    if not frames:
        return DataRead("an unknown line", "", read)
    frame = frames[-1]
    code = (frame.line or "").strip()
    return DataRead(f"{frame.filename}:{frame.lineno}", code, read)


@contextlib.contextmanager
def fake_pass(net: nn.Module | None = None) -> Iterator[None]:
    """Run the enclosed code on fake tensors (real tensors are faked on use).

    accelerate's hooks on the modules of ``net`` (see :func:`_real_hooks`) run
    on real tensors.
    """
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        torch.no_grad(),
        _real_hooks(net),
    ):
        yield


@contextlib.contextmanager
def _real_hooks(net: nn.Module | None) -> Iterator[None]:
    """Run the ``pre_forward``/``post_forward`` of accelerate's hooks unfaked.

    A model placed by accelerate (``dispatch_model``, ``cpu_offload``,
    ``disk_offload``, ``from_pretrained(..., device_map=...)``) has a hook on
    its modules (``module._hf_hook``) whose ``pre_forward`` moves the inputs
    to the module's execution device and, for an offloaded module, loads its
    weights from the offload map into new parameters; ``post_forward`` sets
    them back on the ``meta`` device. Under the fake mode those parameters
    would be fake, and accelerate rebuilds a parameter with
    ``type(param)(value)``, which a fake tensor's class refuses. With the fake
    mode lifted around the hooks, they place real weights (one module at a
    time, as in a real pass: a disk-offloaded module is read from disk) and
    the module's own computation stays fake. The hooks compute nothing
    themselves, and fake inputs stay fake through them (a fake tensor runs in
    its own mode). Each hook's methods are shadowed by instance attributes
    for the duration of the pass, then removed.
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
                setattr(hook, name, _unfaked(method))
                patched.append((hook, name))
        yield
    finally:
        for hook, name in patched:
            delattr(hook, name)


def _unfaked(method: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return method(*args, **kwargs)

    return call


def _fx_traces(net: nn.Module) -> BaseException | None:
    """Return the error of :func:`torch.fx.symbolic_trace`, ``None`` if it traces."""

    class _Tracer(torch.fx.Tracer):
        """The default tracer, which does not trace into recorders inside the net.

        A recorder's forward has its own checks (and state): tracing it with
        proxies would fail for reasons that have nothing to do with the net.
        """

        def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
            return is_recorder(m) or super().is_leaf_module(m, module_qualified_name)

    try:
        with preserved(net):  # accelerate's hooks run in a trace too
            _Tracer().trace(net)
    except Exception as error:  # noqa: BLE001 (any failure is the answer)
        return error
    return None


def _refuse(read: DataRead, fx_error: BaseException) -> RuntimeError:
    msg = (
        "The control flow of the input network is not static: its forward "
        f"reads a tensor value into Python at {read.describe()}, so which "
        "modules run may depend on the data (and `torch.fx.symbolic_trace` "
        "cannot trace it either, see traceback). Pass `force_static_flow=False` "
        "to accept it anyway: every pass then checks that recorded modules are "
        "called as in the reference pass and raises otherwise. See "
        "`help(Recorder)`"
    )
    error = RuntimeError(msg)
    error.__cause__ = fx_error
    return error


def _judge(net: nn.Module, read: DataRead | None) -> None:
    """Raise if ``read`` is a data-dependent read and fx cannot trace ``net``."""
    if read is None:
        return
    fx_error = _fx_traces(net)
    if fx_error is not None:
        raise _refuse(read, fx_error)


def check_static_flow(net: nn.Module, summary_kwargs: dict[str, Any]) -> None:
    """Refuse ``net`` if its forward reads tensor values into Python.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        The table's keyword arguments (``input_data`` or ``input_size``,
        ``mode``, the net's keyword inputs): the check runs the same pass.

    Raises
    ------
    RuntimeError
        If a fake pass reads a tensor value into Python (the message names the
        line) and :func:`torch.fx.symbolic_trace` cannot trace ``net``; raised
        from the fx error.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> class Branchy(nn.Module):
    ...     def forward(self, x):
    ...         return x if x.sum() > 0 else -x
    >>> check_static_flow(nn.Linear(3, 2), {"input_size": (1, 3)})
    >>> check_static_flow(Branchy(), {"input_size": (1, 3)})
    Traceback (most recent call last):
    ...
    RuntimeError: The control flow of the input network is not static: ...

    """
    reason = _check_unsafe(net)
    if reason is None:
        _judge(net, _fake_forward(net, summary_kwargs))
        return
    # A fake pass could change the net (`reason`): fx alone decides, as before.
    fx_error = _fx_traces(net)
    if fx_error is not None:
        msg = (
            "The control flow of the input network may not be static: "
            "`torch.fx.symbolic_trace` cannot trace it (see traceback), and "
            f"the fake-tensor check cannot run because {reason}. Pass "
            "`force_static_flow=False` to accept it anyway: every pass then "
            "checks that recorded modules are called as in the reference pass "
            "and raises otherwise. See `help(Recorder)`"
        )
        raise RuntimeError(msg) from fx_error


def _fake_forward(net: nn.Module, summary_kwargs: dict[str, Any]) -> DataRead | None:
    """Run one fake pass of ``net``; return where it read a value, if it did."""
    train = str(summary_kwargs.get("mode", "eval")) == "train"
    try:
        with preserved(net), fake_pass(net):
            args, kwargs = example_inputs(net, summary_kwargs)
            net.train(train)
            net(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 (anything else: no verdict)
        return _data_read(error)
    return None


def _check_unsafe(net: nn.Module) -> str | None:
    """Say why a fake pass could change ``net``, ``None`` if it cannot."""
    if any(is_lazy(tensor) for tensor in [*net.parameters(), *net.buffers()]):
        return "the net has lazy parameters, which a pass materializes"
    if any(is_recorder(module) for module in net.modules()):
        return "the net contains a recorder, which would record fake tensors"
    return None


def _fake_unsafe(net: nn.Module, summary_kwargs: dict[str, Any]) -> str | None:
    """Say why a fake reference pass could differ from a real one, if it could."""
    reason = _check_unsafe(net)
    if reason is not None:
        return reason
    fast = [m for m in net.modules() if isinstance(m, _TYPE_CHECKED_FAST_PATHS)]
    if fast:
        return (
            f"{type(fast[0]).__name__} takes its fused fast path only on real "
            "tensors, so a fake pass would call other modules"
        )
    tensors = [*net.parameters(), *net.buffers()]
    device = summary_kwargs.get("device")
    if device is None and summary_kwargs.get("input_data") is None:
        device = _torchinfo_impl.get_device(net, None)
    if device is not None and any(
        tensor.device != torch.device(device) for tensor in tensors
    ):
        return f"torchinfo moves the net to {device}, which a fake pass cannot do"
    return None


def fake_table(
    net: nn.Module, summary_kwargs: dict[str, Any], *, check_flow: bool
) -> LayerTable:
    """Build the layer table from a fake reference pass where one can run.

    Parameters
    ----------
    net : torch.nn.Module
        The network.
    summary_kwargs : dict
        Keyword arguments for :func:`torchinfo.summary`.
    check_flow : bool
        Whether to refuse a net that reads tensor values into Python (the
        check of :func:`check_static_flow`, done by the same pass).

    Returns
    -------
    LayerTable
        The table, identical to the one of a real reference pass.

    Raises
    ------
    RuntimeError
        As :func:`check_static_flow`, when ``check_flow`` is true.

    Warns
    -----
    UserWarning
        When the pass runs on real tensors after all, saying why.

    Examples
    --------
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    >>> table = fake_table(net, {"input_size": (1, 2)}, check_flow=True)
    >>> [row.output_size for row in table.values()]
    [[1, 3], [1, 3], [1, 3]]

    """
    summary_kwargs = reference_kwargs(net, summary_kwargs)
    reason = _fake_unsafe(net, summary_kwargs)
    if reason is None:
        try:
            table = build_table(
                net, summary_kwargs, around=functools.partial(fake_pass, net)
            )
        except Exception as error:  # noqa: BLE001 (fall back to the real pass)
            read = _data_read(error)
            if check_flow:
                _judge(net, read)
            if read is not None:
                reason = f"the forward reads a tensor value at {read.describe()}"
            else:
                reason = f"fake tensors cannot run it ({_root(error)})"
        else:
            _assert_real(net)
            return table
        check_flow = False  # the fake pass checked it
    warnings.warn(
        f'`reference_tensors="fake"` ran on real tensors: {reason}.',
        UserWarning,
        stacklevel=4,  # the caller of `Recorder`
    )
    return _real_table(net, summary_kwargs, check_flow=check_flow)


def _real_table(
    net: nn.Module, summary_kwargs: dict[str, Any], *, check_flow: bool
) -> LayerTable:
    """Build the table from a real pass, then check the flow if asked.

    The check comes second: the real pass materializes lazy parameters, after
    which a fake pass can run.
    """
    table = build_table(net, summary_kwargs)
    if check_flow:
        check_static_flow(net, summary_kwargs)
    return table


def _root(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _assert_real(net: nn.Module) -> None:
    """Check that no parameter or buffer of ``net`` was replaced by a fake one."""
    for name, tensor in [*net.named_parameters(), *net.named_buffers()]:
        if isinstance(tensor, FakeTensor):  # pragma: no cover - a torch change
            msg = f"The fake reference pass replaced `{name}` by a fake tensor."
            raise RuntimeError(msg)  # noqa: TRY004 (a broken invariant, not a type)


def table_of(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    *,
    check_flow: bool,
    fake: bool,
) -> LayerTable:
    """Return the layer table of ``net``, checking its flow if asked.

    The :class:`~scio_recorder.Recorder` entry point: with ``fake`` the table
    comes from :func:`fake_table`; else from a real pass, followed by
    :func:`check_static_flow` if ``check_flow``.
    """
    summary_kwargs = reference_kwargs(net, summary_kwargs)
    if fake:
        return fake_table(net, summary_kwargs, check_flow=check_flow)
    return _real_table(net, summary_kwargs, check_flow=check_flow)
