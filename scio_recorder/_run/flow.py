"""The static-flow check and the fake reference pass.

The check (``force_static_flow=True``, the default of
:class:`~scio_recorder.Recorder`) refuses a net whose forward may call other
modules, or compute other values, on other data of the same shapes: a net
whose flow depends on tensor *values*. Its verdict is the one of the
fake-tensor check it replaces (:func:`_fake_verdict`, below), with one
exception and at a fraction of the cost:

1. **The reference pass is watched.** The table's own pass (torchinfo, real
   tensors) runs under :func:`~scio_recorder._run.watch.watching`, a dispatch mode
   that lists every value the forward reads into Python (``if x.sum() > 0:``,
   ``x.item()``, ``int(x)``, ``x.tolist()``, ``torch.equal``). A forward's
   Python code can depend on values through such reads, or through a shape
   that depends on values (below, not refused); a pass without any read (an
   MLP, a CNN, GPT-2 or Llama on token ids alone) is accepted there: no second
   forward runs, and the check adds one Python call per operator to the
   reference pass. Building a recorder then costs about what
   ``torchinfo.summary`` plus one forward cost (``benchmarks/construct.py``),
   where the fake-tensor forward alone cost about 10 times that on a net of
   2,000 small modules.
2. **A pass that reads values gets the fake-tensor verdict.** The forward runs
   once more, on :class:`~torch._subclasses.fake_tensor.FakeTensorMode`'s fake
   tensors (shapes, no values): reading a value raises there. No read there:
   accepted, as before (libraries written for :func:`torch.compile`, Hugging
   Face ``transformers`` among them, skip their eager-only value checks, such
   as "is the attention mask all ones?", on fake tensors). A read there, and
   :func:`torch.fx.symbolic_trace` cannot trace the net either: refused, as
   before (fx turns a read into a node of its graph; it accepted every net
   the check ever refused). An operation fake tensors cannot run ends that
   pass without a verdict: accepted, as before.
3. **Unless the reads change nothing.** Before refusing, the check asks
   whether the values the real pass read change anything it computes
   (:func:`~scio_recorder._run.watch.without_effect`): every read must be a
   yes/no, and every other outcome of every such read, tried by forcing it
   (the whole tree of outcomes, at most 16 forced passes), must give the
   same module calls and bit-identical outputs of every call. Such a read
   decides only a side effect, a warning, a log line or a print
   (transformers' ``if self.config.pad_token_id in input_ids[:, [-1, 0]]:``
   padding warning, for a config that sets ``pad_token_id``): accepted.

What it refuses is thus exactly what the fake-tensor check refused, less
the nets whose reads have no effect; and it accepts exactly what that check
accepted, plus those. Why step 3 is sound (every sequence of yes/no outcomes
some data could produce is tried, forcing can only find more effects) is
written out in :mod:`scio_recorder._run.watch`. Why step 1 is: the forward's
Python code is a function of its inputs' shapes, of the values it reads,
and of the shapes of the outputs of operators whose output shape depends
on values; without reads and without such operators, every input of these
shapes runs the same code.

What none of it sees, and so does not refuse: a flow that depends on a
value-dependent shape (``sel = x[x > 0]``, ``nonzero``, ``masked_select``,
``torch.where(mask)``; then ``if sel.shape[0] > 0:``, or a mixture of
experts running the experts ``nonzero`` found): these operators are tagged
``dynamic_output_shape``, not ``data_dependent_output``, a shape cannot be
forced as a yes/no can, and fake tensors cannot compute one (the fake pass
ends there, without a verdict: accepted). Nor a read outside the forward's
operators (``numpy()``, ``data_ptr()``). And the check sees only the paths
the example inputs lead to. The per-pass call-plan check of every
recording pass covers what is left: a recorded module called another
number of times than in the reference pass raises a ``CallPlanError``.

:func:`fake_table` builds the layer table from a fake reference pass
(``Recorder(..., reference_tensors="fake")``): the same table, nothing
computed (the net's parameters and buffers are seen through fake copies made
on first use). A fake pass without a read checks the flow by itself. Where
fake tensors cannot run the net, or it reads a value, the table comes from
the real pass (checked as above), with a warning saying why.

A model placed by accelerate (its modules carry ``_hf_hook``: offloaded
weights are loaded just before a module runs) is faked like any other, except
that accelerate's hooks run on real tensors
(:func:`~scio_recorder._run.watch.accelerate_hooks_in`); a watch pauses in them.

Nothing is compiled: no Dynamo cache, no graph, no state is left behind; the
net's modes, ``requires_grad`` flags, parameters, buffers, its modules'
plain attributes (and the containers they hold) and accelerate hooks' state
are restored after every pass (:func:`~scio_recorder._net.preserve.preserved`,
whose docstring lists what cannot be: globals, files, caches outside the
modules, random states other than torch's).
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
import gc
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

from scio_recorder._engine.passes import is_recorder
from scio_recorder._net.preserve import preserved
from scio_recorder._support.errors import first_line
from scio_recorder.layers import (
    LayerTable,
    build_table,
    example_inputs,
    reference_kwargs,
)

from .watch import (
    DataRead,
    accelerate_hooks_in,
    rng_state,
    watching,
    without_effect,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .watch import RngState

# torch's modules whose fast path is skipped for tensor subclasses (their
# forward checks `has_torch_function`): a fake pass would call other modules.
_TYPE_CHECKED_FAST_PATHS = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerEncoder,
)


# -- the check -------------------------------------------------------------------


def check_static_flow(net: nn.Module, summary_kwargs: dict[str, Any]) -> None:
    """Refuse ``net`` if its forward's flow depends on tensor values.

    Runs a reference pass of ``net`` on real tensors, watching the values it
    reads into Python, and judges them as the module's docstring says.

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
        If the forward reads a value on fake tensors (the message names the
        line), the values it reads on real tensors change what it computes,
        and :func:`torch.fx.symbolic_trace` cannot trace ``net``; raised from
        the fx error.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> class Branchy(nn.Module):
    ...     def forward(self, x):
    ...         return x if x.sum() > 0 else -x
    >>> class Warns(nn.Module):
    ...     def forward(self, x):
    ...         if (x == 0).any():
    ...             print("zeros!")  # the only effect of the read
    ...         return x + 1
    >>> check_static_flow(nn.Linear(3, 2), {"input_size": (1, 3)})
    >>> check_static_flow(Warns(), {"input_size": (1, 3)})
    >>> check_static_flow(Branchy(), {"input_size": (1, 3)})
    Traceback (most recent call last):
    ...
    RuntimeError: The control flow of the input network is not static: ...

    """
    _checked_table(net, reference_kwargs(net, summary_kwargs))


def _checked_table(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    fake_read: DataRead | None = None,
) -> LayerTable:
    """Build the table from a watched real pass; refuse a data-dependent flow.

    ``fake_read``: where a fake pass of the same inputs already read a value
    (:func:`fake_table`), so that the fake verdict needs no pass of its own.
    """
    before = rng_state()
    reads: list[DataRead] = []

    @contextlib.contextmanager
    def watched() -> Iterator[None]:
        with watching(net) as watch:
            yield
        reads.extend(watch.reads)

    table = build_table(net, summary_kwargs, around=watched)
    if reads:
        _judge(net, summary_kwargs, reads, before, fake_read)
    return table


def _judge(
    net: nn.Module,
    summary_kwargs: dict[str, Any],
    reads: list[DataRead],
    before: RngState,
    fake_read: DataRead | None,
) -> None:
    """Raise if the fake verdict refuses ``net`` and its ``reads`` have effects."""
    refusal: Exception | None
    if fake_read is not None:
        fx_error = _fx_traces(net)
        refusal = None if fx_error is None else _refuse(fake_read, fx_error)
    else:
        refusal = _fake_verdict(net, summary_kwargs)
    if refusal is not None and not without_effect(net, summary_kwargs, reads, before):
        raise refusal


def _fake_verdict(net: nn.Module, summary_kwargs: dict[str, Any]) -> Exception | None:
    """Judge ``net`` by the fake-tensor check: the error refusing it, or ``None``."""
    reason = _check_unsafe(net)
    if reason is None:
        read = _fake_forward(net, summary_kwargs)
        if read is None:
            return None
        fx_error = _fx_traces(net)
        return None if fx_error is None else _refuse(read, fx_error)
    # A fake pass could change the net (`reason`): fx alone decides, as before.
    fx_error = _fx_traces(net)
    if fx_error is None:
        return None
    msg = (
        "The control flow of the input network may not be static: "
        "`torch.fx.symbolic_trace` cannot trace it (see traceback), and "
        f"the fake-tensor check cannot run because {reason}. Pass "
        "`force_static_flow=False` to accept it anyway: every pass then "
        "checks that recorded modules are called as in the reference pass "
        "and raises otherwise. See `help(Recorder)`"
    )
    error = RuntimeError(msg)
    error.__cause__ = fx_error
    return error


def _fake_forward(net: nn.Module, summary_kwargs: dict[str, Any]) -> DataRead | None:
    """Run one fake pass of ``net``; return where it read a value, if it did."""
    train = str(summary_kwargs.get("mode", "eval")) == "train"
    try:
        with preserved(net, writes=False), fake_pass(net):
            args, kwargs = example_inputs(net, summary_kwargs)
            net.train(train)
            net(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 (anything else: no verdict)
        return _data_read(error)
    return None


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
        with preserved(net, writes=False):  # accelerate's hooks run in a trace too
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


# -- the fake reference pass -----------------------------------------------------


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
    traceback = read.__traceback__
    frame = None
    while traceback is not None:  # the innermost frame
        frame, traceback = traceback.tb_frame, traceback.tb_next
    return DataRead.at(frame)


@contextlib.contextmanager
def fake_pass(net: nn.Module | None = None) -> Iterator[None]:
    """Run the enclosed code on fake tensors (real tensors are faked on use).

    accelerate's hooks on the modules of ``net`` run on real tensors (see
    :func:`~scio_recorder._run.watch.accelerate_hooks_in`).
    """
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        torch.no_grad(),
        accelerate_hooks_in(net, unset_fake_temporarily),
    ):
        yield


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
        Whether to refuse a net whose flow depends on tensor values (the
        check of :func:`check_static_flow`, done by the same pass when it
        reads no value).

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
    read = None
    if reason is None:
        try:
            table = build_table(net, summary_kwargs, around=lambda: fake_pass(net))
        except Exception as error:  # noqa: BLE001 (fall back to the real pass)
            read = _data_read(error)
            if read is not None:
                reason = f"the forward reads a tensor value at {read.describe()}"
            else:
                reason = f"fake tensors cannot run it ({_root(error)})"
        else:
            _assert_real(net)
            return table
    # The real pass judges the flow before the warning: a refusal comes alone.
    if check_flow:
        table = _checked_table(net, summary_kwargs, fake_read=read)
    else:
        table = build_table(net, summary_kwargs)
    warnings.warn(
        f'`reference_tensors="fake"` ran on real tensors: {reason}.',
        UserWarning,
        stacklevel=4,  # the caller of `Recorder`
    )
    return table


def _root(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    return f"{type(error).__name__}: {first_line(error)}"


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
    comes from :func:`fake_table`; else from a real pass, watched by the
    static-flow check if ``check_flow`` (:func:`check_static_flow`).
    """
    summary_kwargs = reference_kwargs(net, summary_kwargs)
    with _collector_paused():
        if fake:
            return fake_table(net, summary_kwargs, check_flow=check_flow)
        if check_flow:
            return _checked_table(net, summary_kwargs)
        return build_table(net, summary_kwargs)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (if on) for the enclosed code.

    A reference pass allocates a few dozen small objects per module call
    (a row, its hooks' handles, sizes), so the collector runs every few dozen
    calls, and now and then walks every object of the process (a million
    with transformers imported): up to 40% of construction on a net of 2,000
    small modules. Nothing a pass allocates needs the cyclic collector in
    the meantime (tensors are freed by reference counting); collection
    resumes on exit.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
