"""Statistics split by class label: :class:`SharedCovariance`, :class:`PerClass`.

Both need per-sample integer class labels (``update(value, target)``).
:class:`SharedCovariance` computes per-class means and the covariance shared
by all classes (the tied covariance of the Mahalanobis detector) in one
vectorised pass per batch; :class:`PerClass` wraps any reducer, keeping one
per class label seen.

Import them from :mod:`scio_recorder.reduce`, their public home.
"""

from __future__ import annotations

__all__ = [
    "PerClass",
    "SharedCovariance",
    "SharedCovarianceResult",
]

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ._base import (
    _F64,
    Reducer,
    _Base,
    _batch,
    _count_tensor,
    _FeatureShape,
    _flat,
    _get,
    _labels,
    _shape_tensor,
    check_class_labels,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from typing_extensions import Self


@dataclasses.dataclass(frozen=True)
class SharedCovarianceResult:
    """The result of :class:`SharedCovariance`, in float64.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import SharedCovariance
    >>> r = SharedCovariance(num_classes=3)
    >>> r.update(torch.tensor([[1.0], [3.0], [7.0]]), torch.tensor([2, 2, 0]))
    >>> res = r.result()
    >>> res.class_counts.tolist(), res.means.flatten().tolist(), res.cov.item()
    ([1, 0, 2], [7.0, 0.0, 2.0], 0.6666666666666666)

    """

    count: int
    """Samples seen, ``N``."""
    class_counts: Tensor
    """Samples per class, ``[C]`` (int64)."""
    means: Tensor
    """Per-class means, ``[C, F]`` (zero for a class never seen)."""
    cov: Tensor
    """Shared covariance $W / N$ (Lee et al. 2018), ``[F, F]``."""
    cov_unbiased: Tensor
    r"""Pooled unbiased covariance $W / (N - C_\mathrm{seen})$, ``[F, F]``."""


class SharedCovariance(_Base, _FeatureShape):
    r"""Per-class means and the covariance shared by all classes.

    With $W = \sum_c \sum_{i \in c} (x_i - \mu_c)(x_i - \mu_c)^\top$ the
    pooled within-class co-moment, ``cov`` $= W / N$ is the tied covariance
    of the Mahalanobis detector of Lee et al. (2018), and ``cov_unbiased``
    $= W / (N - C)$ ($C$: classes seen) the pooled unbiased estimate.

    Per-class counts and sums of a batch come from ``index_add_`` (no host
    sync when ``num_classes`` is given). The batch then enters the running
    state as in Welford's update, for all classes at once: with $a_i$ the
    mean of sample $i$'s class before the batch (its batch mean for a
    class first seen) and $m_i$ after it, $W$ grows by $\sum_i (x_i -
    a_i)(x_i - m_i)^\top$, which equals Chan's $W_b + (n_a n_b / n) (m_b -
    m_a)(m_b - m_a)^\top$ per class. It costs one ``[F, batch] @ [batch, F]`` product,
    whatever the number of classes (Chan's rule over the class table costs
    ``[F, C] @ [C, F]``: five times more with 1,000 classes and batches of
    256). Two reducers merge (:meth:`merge`) by Chan's rule.

    Parameters
    ----------
    num_classes : int, optional
        Number of classes; labels must lie in ``[0, num_classes)``. Without
        it the class table grows to the largest label seen, at the cost of
        one host sync per update. Labels are checked on the CPU (a label
        outside the range, or negative, raises ``ValueError`` naming it); on
        an accelerator with ``num_classes`` they are not checked here, to
        keep ``update`` free of host syncs (:func:`~scio_recorder.collect.collect`
        checks targets before moving them).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import SharedCovariance
    >>> r = SharedCovariance(num_classes=2)
    >>> x = torch.tensor([[0.0], [2.0], [10.0], [14.0]])
    >>> r.update(x, torch.tensor([0, 0, 1, 1]))
    >>> res = r.result()
    >>> res.means.flatten().tolist(), res.cov.item(), res.cov_unbiased.item()
    ([1.0, 12.0], 2.5, 5.0)

    """

    def __init__(self, num_classes: int | None = None) -> None:
        if num_classes is not None and num_classes < 1:
            msg = f"SharedCovariance: num_classes must be >= 1, got {num_classes}"
            raise ValueError(msg)
        self.num_classes = num_classes
        self._reset()

    def _config(self) -> tuple[Any, ...]:
        return (self.num_classes,)

    def _reset(self) -> None:
        self._n = 0
        self._shape = None
        self._counts: Tensor | None = None  # [C] float64
        self._means: Tensor | None = None  # [C, F]
        self._within: Tensor | None = None  # [F, F]

    @property
    def count(self) -> int:
        """Samples seen."""
        return self._n

    def _grow(self, classes: int) -> None:
        """Pad the class table to ``classes`` rows."""
        if self._counts is None or self._means is None:
            return
        extra = classes - self._counts.shape[0]
        if extra > 0:
            self._counts = torch.cat([self._counts, self._counts.new_zeros(extra)])
            self._means = torch.cat(
                [self._means, self._means.new_zeros(extra, self._means.shape[1])]
            )

    def _combine(self, nb: Tensor, mb: Tensor, wb: Tensor, total: int) -> None:
        if self._counts is None or self._means is None or self._within is None:
            self._counts, self._means, self._within = nb, mb, wb
            self._n = total
            return
        classes = max(self._counts.shape[0], nb.shape[0])
        self._grow(classes)
        device = self._counts.device
        nb = torch.cat(
            [nb.to(device), nb.new_zeros(classes - nb.shape[0], device=device)]
        )
        mb = torch.cat(
            [
                mb.to(device),
                mb.new_zeros(classes - mb.shape[0], mb.shape[1], device=device),
            ]
        )
        na, ma = self._counts, self._means
        n = na + nb
        safe_n = n.clamp(min=1)
        delta = mb - ma
        weight = na * nb / safe_n
        self._within = (
            self._within + wb.to(device) + (delta * weight[:, None]).T @ delta
        )
        self._means = ma + delta * (nb / safe_n)[:, None]
        self._counts = n
        self._n += total

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Feed a batch with its class labels ``target`` (shape ``[batch]``)."""
        x = _batch(value, "SharedCovariance")
        labels = _labels(target, x.shape[0], "SharedCovariance")
        self._check_features(x, "SharedCovariance")
        if x.shape[0] == 0:
            return
        flat = _flat(x)
        labels = labels.to(device=flat.device, dtype=torch.int64)
        if self.num_classes is not None:
            classes = self.num_classes
            if labels.device.type == "cpu":  # no host sync on an accelerator
                check_class_labels(labels, classes, "SharedCovariance")
        else:  # one host sync: the class table grows to the largest label
            check_class_labels(labels, None, "SharedCovariance")
            classes = int(labels.max()) + 1
            if self._counts is not None:
                classes = max(classes, self._counts.shape[0])
        nb = flat.new_zeros(classes).index_add_(0, labels, flat.new_ones(flat.shape[0]))
        sums = flat.new_zeros(classes, flat.shape[1]).index_add_(0, labels, flat)
        if self._counts is None or self._means is None or self._within is None:
            mb = sums / nb.clamp(min=1)[:, None]
            centred = flat - mb[labels]
            self._combine(nb, mb, centred.T @ centred, flat.shape[0])
            return
        self._grow(classes)
        self._welford(flat, labels, nb, sums)

    def _welford(self, flat: Tensor, labels: Tensor, nb: Tensor, sums: Tensor) -> None:
        """Add a batch to a started state (see the class docstring).

        Everything is computed per sample (``[batch, F]``), not per class: a
        ``[C, F]`` temporary costs as much as the product itself with
        thousands of classes.
        """
        assert self._counts is not None  # noqa: S101 (a started state)
        assert self._means is not None  # noqa: S101
        assert self._within is not None  # noqa: S101
        device = self._counts.device
        if flat.device != device:  # the state stays where it is
            flat, labels = flat.to(device), labels.to(device)
            nb, sums = nb.to(device), sums.to(device)
        n = self._counts + nb
        batch = nb[labels]
        mb = sums[labels] / batch[:, None]  # the batch mean of each sample's class
        ma = self._means[labels]
        before = torch.where((self._counts[labels] > 0)[:, None], ma, mb)
        after = torch.addcmul(ma, mb - ma, (batch / n[labels])[:, None])
        # Symmetric in exact arithmetic, not quite in rounding: `result`
        # averages `W` with its transpose once.
        self._within = torch.addmm(self._within, (flat - before).T, flat - after)
        # A class present several times gets the same row each time.
        self._means = self._means.index_copy(0, labels, after)
        self._counts = n
        self._n += flat.shape[0]

    def merge(self, other: Self) -> None:
        """Absorb ``other`` (class by class, Chan's rule)."""
        self._check_peer(other)
        self._peer_shape(other, "SharedCovariance")
        if other._counts is None or other._means is None or other._within is None:
            return
        self._combine(
            other._counts.clone(), other._means.clone(), other._within.clone(), other._n
        )

    def result(self) -> SharedCovarianceResult:
        """Return counts, per-class means and the shared covariance."""
        if self._n == 0 or self._counts is None or self._means is None:
            msg = "SharedCovariance: no sample seen yet"
            raise ValueError(msg)
        assert self._within is not None  # noqa: S101 (set with the counts)
        seen = int((self._counts > 0).sum())
        dof = self._n - seen
        within = (self._within + self._within.T) / 2
        unbiased = within / dof if dof > 0 else torch.full_like(within, math.nan)
        return SharedCovarianceResult(
            count=self._n,
            class_counts=self._counts.round().to(torch.int64),
            means=self._means.clone(),
            cov=within / self._n,
            cov_unbiased=unbiased,
        )

    def state(self) -> dict[str, Tensor]:
        """Return the counts, ``feature_shape``, ``means`` and ``within``."""
        out = {"count": _count_tensor(self._n)}
        if self._shape is not None:
            out["feature_shape"] = _shape_tensor(self._shape)
        if (
            self._counts is not None
            and self._means is not None
            and self._within is not None
        ):
            out["class_counts"] = self._counts
            out["means"] = self._means
            out["within"] = self._within
        return out

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the state by ``state``."""
        self._reset()
        self._n = int(_get(state, "count", "SharedCovariance"))
        if "feature_shape" in state:
            self._shape = torch.Size(state["feature_shape"].tolist())
        if "class_counts" in state:
            self._counts = state["class_counts"].to(_F64)
            self._means = _get(state, "means", "SharedCovariance").to(_F64)
            self._within = _get(state, "within", "SharedCovariance").to(_F64)


class PerClass(_Base):
    """One reducer per class label: ``{label: reducer}``.

    Each batch is split by ``target`` (one host sync per update, to learn
    which labels are present) and each part fed to the reducer of its class,
    created on first sight with ``factory()``.

    Parameters
    ----------
    factory : callable or Reducer
        Makes an empty reducer (a class such as ``Moments``, or a
        ``lambda``); a reducer instance is used through its :meth:`fresh`.
    num_classes : int, optional
        If given, labels outside ``[0, num_classes)`` raise ``ValueError``.
        Negative labels always raise (labels are class indices).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments, PerClass
    >>> r = PerClass(Moments, num_classes=3)
    >>> r.update(torch.tensor([[1.0], [5.0], [3.0]]), torch.tensor([0, 2, 0]))
    >>> {c: res.mean.item() for c, res in r.result().items()}
    {0: 2.0, 2: 5.0}

    """

    def __init__(
        self, factory: Callable[[], Reducer] | Reducer, num_classes: int | None = None
    ) -> None:
        if isinstance(factory, Reducer) and not isinstance(factory, type):
            self._factory: Callable[[], Reducer] = factory.fresh
        elif callable(factory):
            self._factory = factory
        else:
            msg = f"PerClass needs a reducer factory, got {factory!r}"
            raise TypeError(msg)
        self.num_classes = num_classes
        self._reset()

    def _config(self) -> tuple[Any, ...]:
        return (self.num_classes,)

    def _reset(self) -> None:
        self._reducers: dict[int, Reducer] = {}

    @property
    def count(self) -> int:
        """Samples seen, all classes together."""
        return sum(r.count for r in self._reducers.values())

    @property
    def reducers(self) -> dict[int, Reducer]:
        """The reducer of each class seen, by label (a new dict)."""
        return dict(sorted(self._reducers.items()))

    def _reducer(self, label: int) -> Reducer:
        self._check_labels([label])
        if label not in self._reducers:
            self._reducers[label] = self._factory()
        return self._reducers[label]

    def _check_labels(self, labels: list[int]) -> None:
        if labels:
            check_class_labels(torch.tensor(labels), self.num_classes, "PerClass")

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Split the batch by ``target`` and feed each class's reducer."""
        x = _batch(value, "PerClass")
        labels = _labels(target, x.shape[0], "PerClass").to(x.device)
        if x.shape[0] == 0:
            return
        present, sizes = torch.unique(labels, sorted=True, return_counts=True)
        classes = [int(label) for label in present.tolist()]  # the host sync
        split = sizes.tolist()
        self._check_labels(classes)  # before any reducer is created or fed
        reducers = [self._reducer(label) for label in classes]
        order = torch.argsort(labels, stable=True)
        parts = torch.split(x[order], split)
        label_parts = torch.split(labels[order], split)
        for reducer, part, part_labels in zip(
            reducers, parts, label_parts, strict=True
        ):
            reducer.update(part, part_labels)

    def merge(self, other: Self) -> None:
        """Merge class by class; classes only ``other`` saw are added."""
        self._check_peer(other)
        for label, reducer in other._reducers.items():
            self._reducer(label).merge(reducer)

    def result(self) -> dict[int, Any]:
        """Return ``{label: result}`` for every class seen, by label."""
        return {label: r.result() for label, r in sorted(self._reducers.items())}

    def state(self) -> dict[str, Tensor]:
        """Return every class's state, keys prefixed by ``"<label>/"``."""
        return {
            f"{label}/{key}": value
            for label, reducer in sorted(self._reducers.items())
            for key, value in reducer.state().items()
        }

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Replace the per-class reducers by those in ``state``."""
        grouped: dict[int, dict[str, Tensor]] = {}
        for key, value in state.items():
            prefix, sep, rest = key.partition("/")
            if not sep:
                msg = f"PerClass.load_state: key {key!r} has no '<label>/' prefix"
                raise KeyError(msg)
            grouped.setdefault(int(prefix), {})[rest] = value
        self._reset()
        for label, sub in sorted(grouped.items()):
            self._reducer(label).load_state(sub)
