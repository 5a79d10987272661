"""The compared passes: the recorder run on the batch from the state found.

:class:`Run` holds the recorder, the checked labels and the batch, and runs
one recorded pass at a time (:meth:`Run.records`): from a fixed random
state (:func:`seeded`, so that dropout draws alike) and from the buffers as
the check found them (:class:`~scio_recorder._net.preserve.SavedBuffers`, put
back before each pass), returning copies of the records taken as the pass
ends. So state kept between passes shows in ``determinism`` only
(:meth:`Run.changed` names the buffers a pass changed), and a record that
is a buffer the next pass updates is never compared with itself.
:func:`compared` measures two passes layer by layer. The modules that make
a net's passes differ in train mode, which the causes name, are found here
too: batch norms (:func:`in_train_mode`) and dropouts that drop
(:func:`dropping`: ``p > 0``). Each pass also notes whether it drew
random numbers (:attr:`Run.drew`: the global random generators' states
before and after it, :mod:`._random`), so that a random draw no module
type tells (``F.dropout`` in a ``forward``, ``torch.randn_like``) is
named, even when the passes it makes happen to agree.
"""

from __future__ import annotations

__all__ = [
    "NORMS",
    "Run",
    "compared",
    "dropping",
    "in_train_mode",
    "seeded",
]

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from scio_recorder._run.batches import first_batch_size
from scio_recorder._support.tree import map_tensors

from ._measure import difference, pairs
from ._random import RandomState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scio_recorder._net.preserve import SavedBuffers
    from scio_recorder.layers import DepthIdx, Layer


_SEED = 0
"""The random state every compared pass starts from (dropout draws alike)."""


@dataclasses.dataclass
class Run:
    """The recorder, the batch, and what each pass gave."""

    rnet: Any
    """The :class:`~scio_recorder.Recorder` (this module sits below it)."""
    labels: list[DepthIdx]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    batch_dim: int | None
    """The batch dimension the user named; ``None``: dim 0, unless the net says not."""
    state: SavedBuffers
    """The net's buffers as the check found them, put back before each pass."""
    output: Any = None
    """The net's output of the latest pass (a copy taken as the pass ended)."""
    drew: bool = False
    """Whether the latest pass drew from a global random generator."""

    @property
    def dim(self) -> int:
        """The dimension the rows are split on."""
        return self.batch_dim or 0

    @property
    def size(self) -> int | None:
        """The batch size (``None``: no input has the batch dimension)."""
        return _batch_size(self.args, self.kwargs, self.dim)

    def records(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        seed: bool,
        restore: bool = True,
    ) -> dict[DepthIdx, Any]:
        """Run one recorded pass; return copies of its records, taken as it ends.

        From the fixed random state if ``seed``, and from the state the net
        was found in if ``restore`` (its buffers put back). Copies, because
        a record may be a tensor that the net changes later (a buffer it
        returns and updates at the next pass): two passes' records would
        then be one tensor, always equal to itself.
        """
        args = self.args if args is None else args
        kwargs = self.kwargs if kwargs is None else kwargs
        if restore:
            self.state.restore()
        with seeded(enabled=seed):
            before = RandomState.now()
            self.output = _copied(self.rnet(*args, **kwargs))
            self.drew = RandomState.now() != before
        return {label: _copied(value) for label, value in self.rnet.activations.items()}

    def plain(self) -> Any:
        """Run the net with no hook at all, from the fixed state; return its output."""
        with self.rnet.selecting():
            self.records(seed=True)
        return self.output

    def changed(self) -> list[str]:
        """Return the buffers a pass changed, but a train-mode BatchNorm's statistics.

        Those statistics change at every pass in train mode, but a pass in
        train mode does not read them.
        """
        return [
            name
            for name, module in self.state.changed()
            if not (isinstance(module, NORMS) and module.training)
        ]

    def describe(self, label: DepthIdx) -> str:
        """Return how the report names the call ``label``."""
        row: Layer = self.rnet.table[label]
        return row.describe()


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any], dim: int) -> int | None:
    """Return dim ``dim`` of the first tensor among the arguments that has it."""
    if dim == 0:
        return first_batch_size(args, kwargs)
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor) and value.dim() > dim:
            return int(value.shape[dim])
    return None


def _copied(value: Any) -> Any:
    """Return ``value`` with each tensor cloned (a record as it is now)."""
    return map_tensors(lambda tensor: tensor.clone(), value)


@contextlib.contextmanager
def seeded(*, enabled: bool) -> Iterator[None]:
    """Start what runs inside from the check's random state, if ``enabled``."""
    if enabled:
        torch.manual_seed(_SEED)
    yield


def compared(
    run: Run, records: dict[DepthIdx, Any], reference: dict[DepthIdx, Any]
) -> tuple[dict[str, float], tuple[float, torch.dtype, str]]:
    """Compare two passes' records, layer by layer.

    Return the largest relative difference per layer, and the largest of
    all with the reference's dtype and the layer it is at.
    """
    per_layer: dict[str, float] = {}
    worst = (0.0, torch.float32, "")
    for label in run.labels:
        for a, b in pairs(records[label], reference[label]):
            diff = difference(a, b)
            key = run.rnet.table[label].label_str
            per_layer[key] = max(per_layer.get(key, 0.0), diff)
            if diff > worst[0]:
                worst = (diff, b.dtype, run.describe(label))
    return per_layer, worst


# -- what makes passes differ in train mode ----------------------------------


def in_train_mode(
    net: nn.Module,
    kinds: tuple[type[nn.Module], ...],
    where: Callable[[Any], bool] | None = None,
) -> list[str]:
    """Return the qualified names of the modules of ``kinds`` in train mode.

    ``where``: only those for which it holds.
    """
    return [
        name or type(module).__name__
        for name, module in net.named_modules()
        if isinstance(module, kinds)
        and module.training
        and (where is None or where(module))
    ]


def dropping(net: nn.Module) -> list[str]:
    """Return the qualified names of the dropout modules that drop: train mode, p > 0.

    Every torch dropout module (``nn.Dropout``, ``nn.Dropout1d`` to ``3d``,
    ``nn.AlphaDropout``, ``nn.FeatureAlphaDropout``) derives from
    ``_DropoutNd``.
    """
    return in_train_mode(net, _DROPOUTS, lambda module: module.p > 0)


_DROPOUTS = (nn.modules.dropout._DropoutNd,)  # noqa: SLF001 (the base of every dropout)


NORMS = (nn.modules.batchnorm._BatchNorm,)  # noqa: SLF001 (the base of every BatchNorm)
