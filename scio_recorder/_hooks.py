"""Forward hooks and the state of one recording pass.

Why it is built this way:

* **Hooks only where needed.** A :class:`HookSet` puts one forward hook on
  each module that has at least one selected call, and none elsewhere, so
  unrecorded layers run at full speed (and fused kernels such as the
  ``TransformerEncoderLayer`` fast path, which torch disables for any module
  carrying hooks, stay fused).
* **No reference to the recorder.** A hook closes over an opaque token only.
  The state of the pass in progress is found through a :class:`ContextVar`
  mapping tokens to :class:`PassState` objects, so the recorder can be
  collected while hooks exist; a :func:`weakref.finalize` then removes them.
* **State local to the pass.** A :class:`PassState` lives for one call of
  ``Recorder.forward``. Each thread (and each asyncio task) sees its own
  context, so concurrent passes never mix, and a call of the net that did not
  go through the recorder finds no state and is ignored.
"""

from __future__ import annotations

__all__ = [
    "ACTIVE_PASSES",
    "CallPlan",
    "CallPlanError",
    "HookSet",
    "PassState",
    "RecordOptions",
    "Postprocessor",
]

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from .layers import DepthIdx

Postprocessor: TypeAlias = Callable[[Any], Any]
"""``postproc(output) -> replacement output or None``."""

ACTIVE_PASSES: ContextVar[dict[object, PassState] | None] = ContextVar(
    "scio_recorder_active_passes", default=None
)
"""Token of each recorder with a pass in progress in this context -> its state."""


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    """How recorded outputs are stored (see :meth:`Recorder.record`)."""

    clone: bool = False
    detach: bool = False
    device: torch.device | None = None
    dtype: torch.dtype | None = None

    @property
    def transforms(self) -> bool:
        """Whether the record differs from the very output tensor."""
        return (
            self.clone
            or self.detach
            or self.device is not None
            or self.dtype is not None
        )

    def apply(self, value: Any) -> Any:
        """Return the record of ``value``: tensors anywhere inside are converted."""
        return _map_tensors(value, self._tensor)

    def _tensor(self, tensor: Tensor) -> Tensor:
        out = tensor.detach() if self.detach else tensor
        if self.device is not None or self.dtype is not None:
            moved = out.to(device=self.device, dtype=self.dtype)
            if moved is not out:
                return moved
        return out.clone() if self.clone else out


class CallPlanError(RuntimeError):
    """A recorded module was not called as often as in the reference pass.

    Labels name calls by their rank, so when the number of calls differs no
    label can be trusted: the pass keeps no activations.
    """


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """What to do at each call of each hooked module, fixed for one pass.

    ``labels[module][k]`` is the label recorded at the k-th call of ``module``
    to *end* in a pass (``None`` when that call is not recorded);
    ``describe[module]`` names the module and its labels for messages;
    ``reference`` says how the reference pass ran.
    """

    labels: dict[nn.Module, tuple[DepthIdx | None, ...]]
    describe: dict[nn.Module, str]
    options: RecordOptions
    reference: str

    def mismatch(
        self,
        module: nn.Module,
        observed: str,
        expected: int,
        *,
        training: bool,
        grad: bool,
    ) -> CallPlanError:
        """Return the error for ``module`` called ``observed`` times."""
        now = f"{'train' if training else 'eval'} mode with gradients " + (
            "enabled" if grad else "disabled"
        )
        return CallPlanError(
            f"Call plan mismatch: {self.describe[module]} was called {observed} "
            f"in this pass, but the layer table expects {expected} "
            f"call{'s' if expected != 1 else ''}. Labels cannot be matched to "
            "calls, so no activations were kept. Likely causes: the mode differs "
            f"from the reference pass (table built in {self.reference}; this "
            f"pass ran in {now}: build the table in the mode you run with "
            '`Recorder(net, ..., mode="train")`, or call `rnet.eval()`), a '
            "fused fast path that skips submodules in some modes, or control "
            "flow that depends on the input (data-dependent branches or loops)."
        )


class PassState:
    """Everything that lives for one ``Recorder.forward`` call."""

    __slots__ = (
        "counts",
        "dont_record",
        "grad",
        "plan",
        "post_index",
        "postproc",
        "records",
        "training",
        "versions",
    )

    def __init__(
        self,
        plan: CallPlan,
        postproc: Postprocessor | Sequence[Postprocessor] | None,
        *,
        dont_record: bool,
        training: bool,
    ) -> None:
        self.plan = plan
        self.training = training
        self.grad = torch.is_grad_enabled()
        self.postproc = postproc
        self.post_index = 0
        self.dont_record = dont_record
        self.counts: dict[nn.Module, int] = {}
        self.records: dict[DepthIdx, Any] = {}
        # label -> (tensors of the record, their version counters); checked
        # at the end of the pass to detect in-place modifications.
        self.versions: list[tuple[DepthIdx, list[tuple[Tensor, int]]]] = []

    def on_output(self, module: nn.Module, output: Any) -> Any:
        """Handle the end of a call of a hooked ``module``; see ``_make_hook``."""
        plan = self.plan.labels.get(module)
        if plan is None:  # hooked after this pass started
            return None
        k = self.counts.get(module, 0)
        self.counts[module] = k + 1
        if k >= len(plan):
            raise self.plan.mismatch(
                module,
                f"at least {k + 1} times",
                len(plan),
                training=self.training,
                grad=self.grad,
            )
        label = plan[k]
        if label is None:
            return None
        options = self.plan.options
        record = None
        if not self.dont_record:
            record = options.apply(output) if options.transforms else output
            self.records[label] = record
        postproc = self.postproc
        result = None
        if postproc is not None:
            if callable(postproc):
                result = postproc(output)
            else:
                if self.post_index >= len(postproc):
                    raise ValueError(self.too_few_message(len(postproc)))
                func = postproc[self.post_index]
                self.post_index += 1
                result = func(output)
        if record is not None and not options.clone:
            self.versions.append((label, _versions(record)))
        return result

    def too_few_message(self, given: int) -> str:
        recorded = sum(
            label is not None
            for labels in self.plan.labels.values()
            for label in labels
        )
        return (
            f"There were not enough postprocessing functions for every recorded "
            f"layer: {given} given, {recorded} recorded calls per pass. If you "
            "wish to use the same function for every recorded layer, use the "
            "signature `rnet(*args, activation_postproc: Postprocessor, "
            "**kwargs)`. See `help(rnet.forward)` for more information"
        )

    def check_counts(self) -> None:
        """Raise :class:`CallPlanError` unless every hooked module ran as planned.

        With ``dont_record`` fewer calls are accepted (nothing is recorded, and
        the reference Recorder accepted them); extra calls raise in the hook.
        """
        counts = self.counts
        for module, labels in self.plan.labels.items():
            observed = counts.get(module, 0)
            expected = len(labels)
            if observed != expected and not (self.dont_record and observed < expected):
                error = self.plan.mismatch(
                    module,
                    f"{observed} time{'s' if observed != 1 else ''}",
                    expected,
                    training=self.training,
                    grad=self.grad,
                )
                missing = sorted(x for x in labels[observed:] if x is not None)
                if missing:
                    error.args = (f"Missing {missing} activations. {error.args[0]}",)
                raise error


def _versions(record: Any) -> list[tuple[Tensor, int]]:
    found: list[tuple[Tensor, int]] = []

    def visit(tensor: Tensor) -> Tensor:
        try:
            found.append((tensor, tensor._version))  # noqa: SLF001 (version counter)
        except RuntimeError:  # inference tensors have no version counter
            pass
        return tensor

    _map_tensors(record, visit)
    return found


def _map_tensors(value: Any, func: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``func`` to every tensor in nested tuples, lists and dicts."""
    if isinstance(value, Tensor):
        return func(value)
    if isinstance(value, tuple):
        mapped = [_map_tensors(item, func) for item in value]
        if hasattr(value, "_fields"):  # namedtuple
            return type(value)(*mapped)
        return tuple(mapped)
    if isinstance(value, list):
        return [_map_tensors(item, func) for item in value]
    if isinstance(value, dict):
        return type(value)(
            {key: _map_tensors(item, func) for key, item in value.items()}
        )
    return value


def _make_hook(token: object) -> Callable[[nn.Module, Any, Any], Any]:
    """Return a forward hook that serves the passes of one recorder."""
    get = ACTIVE_PASSES.get

    def hook(module: nn.Module, _args: Any, output: Any) -> Any:
        states = get()
        if states is None:
            return None
        state = states.get(token)
        if state is None:
            return None
        return state.on_output(module, output)

    return hook


def _remove_all(handles: list[RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


class HookSet:
    """The forward hooks of one recorder, removed when it is collected."""

    def __init__(self, owner: object, token: object) -> None:
        self._hook = _make_hook(token)
        self._handles: list[RemovableHandle] = []
        self._finalizer = weakref.finalize(owner, _remove_all, self._handles)
        self.modules: tuple[nn.Module, ...] = ()

    def place(self, modules: Sequence[nn.Module]) -> None:
        """Hook exactly ``modules`` (in this order), unhooking every other."""
        _remove_all(self._handles)
        self._handles.extend(
            module.register_forward_hook(self._hook) for module in modules
        )
        self.modules = tuple(modules)

    def remove(self) -> None:
        """Remove every hook; safe to call twice."""
        _remove_all(self._handles)
        self.modules = ()

    def __len__(self) -> int:
        """Return the number of hooks in place."""
        return len(self._handles)
