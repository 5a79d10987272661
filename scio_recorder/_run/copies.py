"""Copies of a recorder: a deep copy or a pickle that places its own hooks.

The default copy of an ``nn.Module`` would carry the recorder's hooks onto
the copied modules (as inert hooks), with its passes and its entry point,
which belong to this recorder and this process. :class:`RecorderCopies`, a
base of :class:`~scio_recorder.Recorder`, copies the net, the table and the
selection, and builds the rest afresh (:meth:`RecorderCopies._renew`): its
own token, hooks and entry point. The records of the latest pass are not
copied.
"""

from __future__ import annotations

__all__ = ["RecorderCopies"]

import copy
from typing import TYPE_CHECKING, Any

from scio_recorder._engine.hooks import drop_copied_hooks
from scio_recorder._engine.passes import Passes

from .views import RecorderViews

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Self

    from scio_recorder._engine.plan import CallPlan


class RecorderCopies(RecorderViews):
    """The copies of a recorder (its base, below :class:`~scio_recorder.Recorder`)."""

    _net_direct: Any
    _compiler: Callable[[Any], Any] | None

    def _enter(self, compiler: Callable[[Any], Any] | None) -> None:
        """Set the entry point (the recorder's: see ``Recorder._enter``)."""
        raise NotImplementedError

    # The attributes a copy (deep copy, pickle) builds afresh: what ties a
    # recorder to its hooks, its passes and its process.
    _FRESH = frozenset({"_passes", "_compiled_call_impl", "__call__", "_gate"})

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        """Return a recorder of a deep copy of the net, with its own hooks.

        The hooks are lifted while the net, the table and the selection are
        copied, then placed on both; the latest records are not copied.
        """
        passes = self._passes
        passes.hooks.remove()
        try:
            new = type(self).__new__(type(self))
            memo[id(self)] = new
            for name, value in self.__dict__.items():
                if name == "_compiler":  # shared: a copied backend is another one
                    object.__setattr__(new, name, value)
                elif name not in self._FRESH:
                    object.__setattr__(new, name, copy.deepcopy(value, memo))
            new._renew(copy.deepcopy(passes.plan, memo))  # noqa: SLF001 (a recorder's own)
        finally:
            passes.hooks.place(passes.plan)
        return new

    def __getstate__(self) -> dict[str, Any]:
        """Return what ``pickle`` (and ``torch.save``) store: net, table, selection.

        Not the latest records, nor the hooks (the unpickled recorder places
        its own).

        Raises
        ------
        TypeError
            For a recorder of a ``torch.compile``-d net, whose compiler
            cannot be pickled.
        """
        if self._compiler is not None:
            msg = (
                "Cannot pickle a Recorder of a torch.compile-d net: the "
                "compiler cannot be pickled. Save the net's weights "
                "(`torch.save(rnet.net.state_dict(), path)`) and the records "
                "(`scio_recorder.io.save_records(path, rnet.activations, "
                "rnet)`), then wrap the loaded net in a new Recorder."
            )
            raise TypeError(msg)
        state = {k: v for k, v in self.__dict__.items() if k not in self._FRESH}
        state["_plan"] = self._passes.plan
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild an unpickled recorder: its own token, hooks and entry point."""
        plan = state.pop("_plan")
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        self._renew(plan)

    def _renew(self, plan: CallPlan) -> None:
        """Give a copy its own passes (token, hooks, records) and entry point.

        The copied net's inert hooks are dropped; the copy places its own.
        """
        drop_copied_hooks(self._net)
        passes = Passes(self, self._table, plan, self._net_direct)
        object.__setattr__(self, "_passes", passes)
        self._enter(self._compiler)
