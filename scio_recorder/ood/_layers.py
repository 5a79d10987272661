"""What detectors read and edit in a net: layers, pooled, and the bases that read them.

The ground floor of the detector families (with :mod:`._geometry`,
:mod:`._inputs` and :mod:`._outputs`); a family module imports these and
the protocol, never another family.

* :func:`resolve_labels`: ``layers=[...]``, any number of selectors, each
  resolving to one call; a pass records all of them at once, so scoring a
  batch is **one** forward pass of the unmodified net, whatever the number
  of layers (OpenOOD needs the net rewritten to return a feature list;
  pytorch-ood re-runs the prefix of the net per layer).
* Pooling (:func:`pool_features`, :func:`pooled_size`): a ``[B, C, H, W]``
  feature map is averaged over ``H, W`` per channel (``pool="mean"``); a
  ``[B, T, D]`` token sequence gives its first real token (``token="cls"``),
  its last (``token="last"``, a causal language model's summary of the
  row) or its mean over the tokens the padding mask keeps
  (``token="mean"``, ``mask=``): a padded row's features are the row's
  alone; ``[B, F]`` is kept; ``pool=None`` flattens every sample. A
  fit's reducer sees a layer's output through :class:`Mapped` (pooling,
  Gram statistics, ...).
* ``mask=``: a padding mask is an argument of the net, not a layer's
  output; ``mask="attention_mask"`` (a keyword) or an int (a positional
  argument) names it, and the detector reads it from each call of the net
  (a forward pre-hook on the wrapped net that keeps a reference to it).
* The bases: :class:`Features` (one layer's output, or the last
  ``nn.Linear``'s input), :class:`MultiLayer` (several layers in one pass),
  :class:`Neighbourhoods` (several layers and a bank of each one's fit
  features, searched for the nearest), :class:`Shaping` (an edit of one
  layer in flight, the score from the edited logits).
"""

from __future__ import annotations

__all__ = [
    "MAP_RANK",
    "POOLS",
    "SEQUENCE_RANK",
    "TOKENS",
    "Features",
    "LastLayer",
    "Mapped",
    "MultiLayer",
    "Neighbourhoods",
    "Shaping",
    "check_choice",
    "enough_samples",
    "label_counts",
    "pool_features",
    "pooled_size",
    "resolve_labels",
]

import math
import threading
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn
from torch.nn import functional

from ._bank import Bank
from ._checks import (
    check_feature_count,
    feature_count,
    last_linear,
    one_label,
    one_tensor,
    per_sample_size,
)
from ._classes import ClassConditional, check_at
from ._geometry import check_act_norm, normalized
from ._outputs import energy_score
from ._protocol import Detector, Pass
from ._saving import StateEntry
from ._search import check_search, nearest

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder
    from scio_recorder.select import Selector

_F32, _F64, _I64 = torch.float32, torch.float64, torch.int64
MAP_RANK, SEQUENCE_RANK = 4, 3
"""The ranks of a batch of feature maps ``[B, C, H, W]`` and of token sequences
``[B, T, D]``."""
POOLS = ("mean", None)
TOKENS = ("cls", "mean", "last")
_SUM = "sum"  # NAC's pooling of maps and tokens (OpenOOD's): a sum, not a mean


def resolve_labels(
    rnet: Recorder, layers: Sequence[Selector], who: str
) -> list[DepthIdx]:
    """Resolve each selector of ``layers`` to one call; refuse none or repeats.

    Examples
    --------
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(), input_size=(1, 3, 32, 32))
    >>> resolve_labels(rnet, ["features.1", "features.4"], "doc")
    [(2, 2), (2, 5)]

    """
    if isinstance(layers, str) or not isinstance(layers, list | tuple) or not layers:
        msg = (
            f"{who}: layers must be a non-empty list of selectors (labels, "
            f"names, ...), got {layers!r}; e.g. `layers=['layer1', 'layer2']`."
        )
        raise ValueError(msg)
    labels = [one_label(rnet, layer, who) for layer in layers]
    seen: dict[DepthIdx, Any] = {}
    for layer, label in zip(layers, labels, strict=True):
        if label in seen:
            msg = (
                f"{who}: layers {seen[label]!r} and {layer!r} are the same call "
                f"{rnet.table[label].describe()}; name each layer once."
            )
            raise ValueError(msg)
        seen[label] = layer
    return labels


def pool_features(
    value: Tensor,
    pool: str | None = "mean",
    token: str = "cls",  # noqa: S107 (not a password)
    mask: Tensor | None = None,
    *,
    detach: bool = True,
) -> Tensor:
    """Return one feature vector per sample, ``[B, F]``, in float64.

    ``pool="mean"``: a ``[B, C, H, W]`` map is averaged over ``H, W``; a
    ``[B, T, D]`` sequence gives, per row, its first real token
    (``token="cls"``: the first token ``mask`` keeps, ``[B, T]`` with
    nonzero = a real token; the first token without a mask), its last real
    token (``token="last"``: the usual summary of a row for a causal
    language model, whose first token sees only itself) or the mean of its
    real tokens (``token="mean"``; every token without a mask): a left- or
    right-padded row gives the features of the row alone. A row without a
    real token gives its first (``"cls"``), last (``"last"``) or no token
    (``"mean"``: zeros). Other shapes are flattened. ``pool=None`` flattens
    every sample. ``pool="sum"`` and ``token="sum"`` sum instead of
    averaging (NAC's option: OpenOOD's pooling). ``detach=False`` keeps the
    autograd graph (a gradient with respect to the input through the pooled
    features).

    Examples
    --------
    >>> import torch
    >>> pool_features(torch.ones(2, 3, 4, 4)).shape
    torch.Size([2, 3])
    >>> x = torch.tensor([[[1.0], [3.0], [100.0]]])
    >>> pool_features(x, token="mean", mask=torch.tensor([[1, 1, 0]])).tolist()
    [[2.0]]
    >>> left = torch.tensor([[0, 1, 1]])  # a left-padded row
    >>> (
    ...     pool_features(x, token="cls", mask=left),
    ...     pool_features(x, token="last", mask=left),
    ... )
    (tensor([[3.]], dtype=torch.float64), tensor([[100.]], dtype=torch.float64))

    """
    value = (value.detach() if detach else value).to(_F64)
    if pool is None:
        return value.reshape(value.shape[0], -1)
    if value.dim() == MAP_RANK:
        return value.sum(dim=(2, 3)) if pool == _SUM else value.mean(dim=(2, 3))
    if value.dim() == SEQUENCE_RANK:
        if token in {"cls", "last"}:
            last = token == "last"  # noqa: S105 (not a password)
            return value[_rows(value), _end_token(value, mask, last=last)]
        if mask is None:
            return value.sum(dim=1) if token == _SUM else value.mean(dim=1)
        keep = mask.to(device=value.device, dtype=_F64).reshape(*value.shape[:2], 1)
        total = (value * keep).sum(dim=1)
        return total if token == _SUM else total / keep.sum(dim=1).clamp(min=1.0)
    return value.reshape(value.shape[0], -1)


def _rows(value: Tensor) -> Tensor:
    return torch.arange(value.shape[0], device=value.device)


def _end_token(value: Tensor, mask: Tensor | None, *, last: bool) -> Tensor:
    """Return each row's first (``last``: last) real token's position, ``[B]``.

    Without a mask, the first (last) position. ``argmax`` gives the first
    of equal maxima, so that of the mask is the first kept token; of the
    mask reversed, the last.
    """
    length = value.shape[1]
    if mask is None:
        end = length - 1 if last else 0
        return torch.full((value.shape[0],), end, device=value.device)
    keep = mask.to(value.device).reshape(value.shape[0], length) != 0
    if last:
        return length - 1 - keep.flip(1).to(torch.int8).argmax(dim=1)
    return keep.to(torch.int8).argmax(dim=1)


def pooled_size(
    rnet: Recorder, label: DepthIdx, pool: str | None = "mean"
) -> int | None:
    """Return the number of features :func:`pool_features` gives a layer's output.

    From the recorder's layer table (``None`` when it does not know the
    layer's shape): the channels of a map, the width of a token sequence,
    else every entry of a sample.

    Examples
    --------
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.models import demo_model
    >>> rnet = Recorder(demo_model(), input_size=(1, 3, 32, 32))
    >>> pooled_size(rnet, (2, 2)), pooled_size(rnet, (2, 2), pool=None)
    (8, 8192)

    """
    size = per_sample_size(rnet, label, "output")
    if size is None:
        return None
    if pool is not None and len(size) == MAP_RANK - 1:
        return size[0]
    if pool is not None and len(size) == SEQUENCE_RANK - 1:
        return size[1]
    return math.prod(size)


def check_choice(who: str, name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        msg = f"{who}: {name} must be one of {list(choices)}, got {value!r}"
        raise ValueError(msg)


class Mapped:
    """A reducer fed ``fn(record)`` instead of the record (``fn``: pooling, ...).

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.reduce import Moments
    >>> r = Mapped(Moments(), lambda t: 2 * t)
    >>> r.update(torch.ones(3, 2))
    >>> r.result().mean.tolist(), r.count
    ([2.0, 2.0], 3)

    """

    def __init__(self, inner: Any, fn: Callable[[Tensor], Tensor]) -> None:
        """Wrap ``inner``."""
        self.inner, self.fn = inner, fn

    @property
    def count(self) -> int:
        """Samples seen."""
        return int(self.inner.count)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        """Feed ``fn(value)``."""
        self.inner.update(self.fn(value), target)

    def merge(self, other: Mapped) -> None:
        """Absorb another's inner reducer."""
        self.inner.merge(other.inner)

    def result(self) -> Any:
        """Return the inner result."""
        return self.inner.result()

    def state(self) -> dict[str, Tensor]:
        """Return the inner state."""
        return dict(self.inner.state())

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the inner state."""
        self.inner.load_state(state)

    def fresh(self) -> Mapped:
        """Return an empty reducer of the same config."""
        return Mapped(self.inner.fresh(), self.fn)


class Features(Detector):
    """A detector reading one layer's output, or the last Linear's input."""

    def __init__(self, rnet: Recorder, layer: Selector | None) -> None:
        super().__init__(rnet, layer=layer)
        name = type(self).__name__
        if layer is None:
            self.label: DepthIdx = last_linear(rnet, None, name)
            self.kind = "input"
        else:
            self.label = one_label(rnet, layer, name)
            self.kind = "output"

    def outputs(self) -> tuple[DepthIdx, ...]:
        return (self.label,) if self.kind == "output" else ()

    def inputs(self) -> tuple[DepthIdx, ...]:
        return (self.label,) if self.kind == "input" else ()

    def features(self, result: Pass) -> Tensor:
        """Return the pass's features ``[batch, F]``, F checked against the fit."""
        store = result.outputs if self.kind == "output" else result.inputs
        value = store[self.label]
        flat = value.reshape(value.shape[0], -1)
        check_feature_count(
            self,
            self.label,
            self.kind,
            got=flat.shape[1],
            expected=self.fitted_features(),
        )
        return flat

    def fitted_features(self) -> int:
        """Return the number of features per sample the state was fitted on."""
        raise NotImplementedError

    def feature_count(self) -> int | None:
        """Return the number of features per sample in the layer table."""
        return feature_count(self.rnet, self.label, self.kind)

    def config(self) -> dict[str, Any]:
        return {"layer": list(self.label), "features": self.kind}


class MultiLayer(Detector):
    """A detector reading several layers' outputs in one pass."""

    POOLS: ClassVar[tuple[str | None, ...]] = POOLS
    """The values of ``pool=`` the detector takes."""
    TOKENS: ClassVar[tuple[str, ...]] = TOKENS
    """The values of ``token=`` the detector takes."""

    def __init__(
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        pool: str | None = "mean",
        token: str = "cls",  # noqa: S107 (not a password)
        mask: int | str | None = None,
    ) -> None:
        super().__init__(rnet)
        who = type(self).__name__
        check_choice(who, "pool", pool, self.POOLS)
        check_choice(who, "token", token, self.TOKENS)
        if mask is not None and (
            isinstance(mask, bool) or not isinstance(mask, int | str)
        ):
            msg = (
                f"{who}: mask must name an argument of the net (a keyword str or a "
                f"positional int), got {mask!r}; e.g. `mask='attention_mask'`."
            )
            raise TypeError(msg)
        self.labels = resolve_labels(rnet, layers, who)
        self.pool, self.token, self.mask = pool, token, mask
        self._masks = _Masks()
        """The mask of the net's latest call, per thread (passes of several
        threads: each scores with the mask of its own pass)."""
        if mask is not None:
            self._hook = rnet.net.register_forward_pre_hook(
                _mask_keeper(weakref.ref(self), mask), with_kwargs=True
            )

    def outputs(self) -> tuple[DepthIdx, ...]:
        return tuple(self.labels)

    def current_mask(self, rows: Tensor | None = None) -> Tensor | None:
        """Return the mask the net received in this thread's latest call (``mask=``).

        ``rows``: those rows of it only (a :class:`~._protocol.Pass`
        restricted to its finite rows holds their indices).
        """
        if self.mask is None:
            return None
        value = self._masks.value
        if value is None:
            msg = (
                f"{type(self).__name__}: the net's latest call had no argument "
                f"{self.mask!r} (mask=); pass the padding mask to the net under "
                "that name, or drop `mask=`."
            )
            raise ValueError(msg)
        if rows is not None:
            return value[rows.to(value.device)]
        return value

    def features(
        self, value: Tensor, rows: Tensor | None = None, *, detach: bool = True
    ) -> Tensor:
        """Pool one layer's record into ``[B, F]`` float64 features.

        ``rows``: the rows of the batch ``value`` holds (``Pass.rows``), for
        the padding mask; ``None``: all of them. ``detach=False`` keeps the
        autograd graph.
        """
        mask = self.current_mask(rows)
        return pool_features(value, self.pool, self.token, mask, detach=detach)

    def config(self) -> dict[str, Any]:
        return {
            "layers": [list(label) for label in self.labels],
            "pool": self.pool,
            "token": self.token,
            "mask": self.mask,
        }


class _Masks(threading.local):
    """The padding mask the net received in this thread's latest call."""

    value: Tensor | None = None


def _mask_keeper(
    owner: weakref.ref[MultiLayer], where: int | str
) -> Callable[..., None]:
    def keep(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        detector = owner()
        if detector is None:
            return
        if isinstance(where, str):
            found = kwargs.get(where)
        else:
            found = args[where] if -len(args) <= where < len(args) else None
        detector._masks.value = found if isinstance(found, Tensor) else None  # noqa: SLF001 (its own state)

    return keep


def enough_samples(who: str, k: int, n: int, *, loo: bool = False) -> None:
    """Refuse ``k`` neighbours out of ``n`` fit samples (``n - 1`` leaving one out)."""
    have = n - loo
    if k > have:
        others = " other" if loo else ""
        msg = (
            f"{who}: k={k} neighbours, but a fit sample has {have}{others} fit "
            "samples; fit on more data or lower k."
        )
        raise ValueError(msg)


def label_counts(labels: Tensor, indices: Tensor, classes: int) -> Tensor:
    """Count each class among the neighbours ``indices`` ``[Q, k]``: ``[Q, classes]``.

    Examples
    --------
    >>> import torch
    >>> label_counts(torch.tensor([0, 1, 1]), torch.tensor([[0, 1], [1, 2]]), 3)
    tensor([[1, 1, 0],
            [0, 2, 0]])

    """
    found = labels.to(indices.device)[indices]
    counts = torch.zeros(indices.shape[0], classes, dtype=_I64, device=indices.device)
    return counts.scatter_add_(1, found, torch.ones_like(found))


class Neighbourhoods(ClassConditional, MultiLayer):
    """A multi-layer detector keeping a bank of each layer's fit features."""

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (the layers, the features and the search)
        self,
        rnet: Recorder,
        layers: Sequence[Selector],
        *,
        at: str,
        act_norm: float | None,
        index_metric: str,
        pool: str | None,
        token: str,
        mask: int | str | None,
        backend: str,
        search_budget: int | None,
    ) -> None:
        who = type(self).__name__
        self.at = check_at(who, at)
        self.act_norm = check_act_norm(who, act_norm)
        if index_metric not in ("l2", "ip"):
            msg = f"{who}: index_metric must be 'l2' or 'ip', got {index_metric!r}"
            raise ValueError(msg)
        check_search(who, backend, search_budget)
        super().__init__(rnet, layers, pool=pool, token=token, mask=mask)
        self.index_metric = index_metric
        self.backend, self.search_budget = backend, search_budget
        self.banks: list[Tensor] = []
        self.bank_labels = torch.zeros(0, dtype=_I64)

    def fit_keep(self) -> dict[Any, Any]:
        """Each layer's (pooled) features with the class labels."""
        return {label: Bank(self.features) for label in self.labels}

    def keep_banks(self, result: Mapping[DepthIdx, Any]) -> None:
        """Set ``banks`` and ``bank_labels`` from the collected banks."""
        banks = []
        classes = None
        for label in self.labels:
            rows, classes = result[label]
            banks.append(normalized(rows, self.act_norm))
        assert classes is not None  # noqa: S101 (needs_target: fit passes labels)
        self.banks, self.bank_labels = banks, classes

    def classes(self) -> int:
        """Return the number of classes: the net's logits, or the labels'."""
        return max(self.num_classes or 0, int(self.bank_labels.max()) + 1)

    def layer_features(self, result: Pass) -> list[Tensor]:
        """Return each layer's features of a pass, float32, normalised as the bank.

        ``token="each"``: every token's, ``[B * T, F]`` (:meth:`token_features`).
        """
        if self.token == "each":  # noqa: S105 (not a password)
            return [self.token_features(result, label) for label in self.labels]
        return [
            normalized(self.features(result.outputs[label]).to(_F32), self.act_norm)
            for label in self.labels
        ]

    # -- a bank of every fit token (token="each") ---------------------------
    def token_features(self, result: Pass, label: DepthIdx) -> Tensor:
        """Return every token's features at ``label``, ``[B * T, F]`` float32."""
        value = result.outputs[label].detach()
        flat = value.reshape(value.shape[0] * value.shape[1], -1).float()
        return normalized(flat, self.act_norm)

    def token_bank_start(self) -> None:
        """Start the banks of fit tokens."""
        self._token_rows: list[list[Tensor]] = [[] for _ in self.labels]
        self._token_labels: list[Tensor] = []

    def token_bank_batch(self, result: Pass, keep: Tensor, target: Tensor) -> None:
        """Keep the real tokens' features and classes."""
        rows = keep.reshape(-1)
        for bank, label in zip(self._token_rows, self.labels, strict=True):
            features = self.token_features(result, label)
            bank.append(features[rows.to(features.device)].cpu())
        self._token_labels.append(target.reshape(-1)[rows.to(target.device)].cpu())

    def token_bank_end(self) -> None:
        """Set the banks and their classes from the kept tokens."""
        self.banks = [torch.cat(rows) for rows in self._token_rows]
        self.bank_labels = torch.cat(self._token_labels)
        del self._token_rows, self._token_labels

    def search(
        self, queries: Tensor, bank: Tensor, k: int, exclude: Tensor | None = None
    ) -> Tensor:
        """Return the bank indices of each query's ``k`` nearest, ``[Q, k]``."""
        return nearest(
            queries,
            bank,
            k,
            metric=self.index_metric,
            exclude=exclude,
            backend=self.backend,
            memory_budget=self.search_budget,
        ).indices

    def bank_entries(self) -> dict[str, StateEntry]:
        """Per layer ``i``: ``bank.i`` ``[samples, F_i]`` float32; ``labels``."""
        out = {
            f"bank.{i}": StateEntry(
                ("samples", pooled_size(self.rnet, label, self.pool)), _F32
            )
            for i, label in enumerate(self.labels)
        }
        out["labels"] = StateEntry(("samples",), _I64)
        return out

    def config(self) -> dict[str, Any]:
        """Return the layers, the pooling, the norm and the metric."""
        return {
            **super().config(),
            "act_norm": self.act_norm,
            "index_metric": self.index_metric,
        }


class Shaping(Detector):
    """An edit at ``layer``, the score from the edited logits."""

    edits: ClassVar[bool] = True

    def __init__(
        self,
        rnet: Recorder,
        layer: Selector,
        *,
        detector: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__(rnet, layer=layer)
        self.label: DepthIdx = one_label(rnet, layer, type(self).__name__)
        self.detector = detector or energy_score

    def edit_label(self) -> DepthIdx:
        return self.label

    def edit(self, output: Tensor) -> Tensor:
        """Return the shaped output; refuse an output that is not one tensor."""
        who = type(self).__name__
        return self.shape(one_tensor(output, self.rnet, self.label, who))

    def shape(self, output: Tensor) -> Tensor:
        """Return the edited activations."""
        raise NotImplementedError

    def score_pass(self, result: Pass) -> Tensor:
        return self.detector(result.logits)


class LastLayer(Detector):
    """A detector reading the input of the classification layer ``fc``.

    The base of the detectors of the classifier's features (DICE, SHE,
    NNGuide, fDBD) and weights (WeiPer, CORE, ORA): ``fc`` is the last
    ``nn.Linear`` the net calls unless given.
    """

    def __init__(self, rnet: Recorder, fc: Selector | None) -> None:
        super().__init__(rnet)
        self.label: DepthIdx = last_linear(rnet, fc, type(self).__name__)
        linear = rnet.table[self.label].module
        assert isinstance(linear, nn.Linear)  # noqa: S101 (last_linear checks it)
        self.linear = linear

    def inputs(self) -> tuple[DepthIdx, ...]:
        """Return the input of ``fc``."""
        return (self.label,)

    def features(self, result: Pass) -> Tensor:
        """Return ``fc``'s input, ``[batch, F]``."""
        f = result.inputs[self.label]
        return f.reshape(f.shape[0], -1)

    def logits(self, f: Tensor) -> Tensor:
        """Return ``fc(f)``, in ``f``'s dtype (the net's own operation)."""
        bias = self.linear.bias
        return functional.linear(
            f,
            self.linear.weight.detach().to(f),
            None if bias is None else bias.detach().to(f),
        )

    def weight64(self) -> Tensor:
        """Return ``W`` in float64."""
        return self.linear.weight.detach().to(_F64)

    def bias64(self) -> Tensor:
        """Return ``b`` in float64 (zeros without a bias)."""
        bias = self.linear.bias
        w = self.linear.weight
        return (
            bias.detach().to(_F64)
            if bias is not None
            else torch.zeros(w.shape[0], dtype=_F64, device=w.device)
        )

    def config(self) -> dict[str, Any]:
        """Return ``fc``'s label."""
        return {"fc": list(self.label)}


# ----------------------------------------------------------------- DICE
