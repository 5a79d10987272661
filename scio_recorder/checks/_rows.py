"""Each row run alone, against its part of the batch's records.

The batch check (:mod:`._batch`) runs a few rows alone (the most padded
first: :func:`rows_to_check`), their padding cut (a 2-D ``attention_mask``
tells which columns are padding: :func:`padding`), and :class:`Rows`
compares each record of a row alone with the row's part of the batched
record. Which part that is, the record's shapes tell, batched and alone
(:func:`_row_slice`): the one dimension of the batch's size that is 1 in
the row alone (a sequence-first layer's output is cut on dim 1). A record
of size 1 there is shared by every row (a broadcast table) and compared on
a row without padding; any other is a record of the whole batch, which no
row alone can be compared with. :meth:`Rows.notes` says what was not
compared, and why: a check never passes what it did not compare.
"""

from __future__ import annotations

__all__ = ["Rows", "padding", "rows_to_check"]

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from scio_recorder._support.tree import iter_tensors, map_tensors

from ._measure import difference
from ._passes import NORMS, in_train_mode
from ._report import named, named_plain, raised

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx

    from ._passes import Run


def padding(kwargs: Mapping[str, Any], size: int) -> Tensor | None:
    """Return the ``[batch, positions]`` mask of kept tokens, if the batch has one."""
    mask = kwargs.get("attention_mask")
    if isinstance(mask, Tensor) and mask.dim() == 2 and mask.shape[0] == size:  # noqa: PLR2004 (batch, positions)
        return mask != 0
    return None


def _row_alone(
    run: Run, row: int, keep: Tensor | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Row ``row`` of the batch alone, its padding (``keep`` false) removed.

    Every input with the batch's size on the batch dimension is cut there;
    the others (a scalar, a table shared by the rows) go whole.
    """
    size, dim = run.size, run.dim
    columns = None if keep is None or bool(keep.all()) else keep
    width = None if keep is None else keep.shape[0]

    def take(value: Tensor) -> Tensor:
        if value.dim() <= dim or value.shape[dim] != size:
            return value
        value = value.narrow(dim, row, 1)
        if columns is not None and value.dim() >= 2 and value.shape[1] == width:  # noqa: PLR2004
            value = value[:, columns.to(value.device)]
        return value

    return map_tensors(take, run.args), map_tensors(take, run.kwargs)


def rows_to_check(
    size: int, keep: Tensor | None, rows: int
) -> tuple[list[int], list[int]]:
    """Return the rows compared alone (the most padded first), and the empty ones.

    A row with no real token (all padding) has nothing to run alone: it is
    returned apart, so that the report says so.
    """
    if keep is None:
        return list(range(min(size, rows))), []
    real = keep.sum(1).tolist()
    empty = [r for r in range(size) if not real[r]]
    order = sorted((r for r in range(size) if real[r]), key=lambda r: (real[r], r))
    return sorted(order[:rows]), empty


_Kind = Literal["split", "shared", "whole"]
"""How a record relates to the rows: cut along the batch dimension (its size
is the batch's), shared by every row (size 1 there, as a broadcast table),
or of the whole batch (neither: a statistic over it, or rows reshaped into
another dimension)."""


@dataclasses.dataclass
class Rows:
    """What comparing rows alone with the batch found, record by record.

    A record is keyed ``(label, i)``: the ``i``-th tensor of the label's
    record. A split record must be compared on every row run alone; a
    shared one (the same tensor for every row) on one row at least, where
    its shape is the row alone's (a row without padding); a record of the
    whole batch cannot be compared by row.
    """

    per_layer: dict[str, float] = dataclasses.field(default_factory=dict)
    worst: tuple[float, torch.dtype, str, int] = (0.0, torch.float32, "", -1)
    """The largest difference, its dtype, its layer and its row."""
    failed: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """What the rows that raised alone raised: each error once, with its rows."""
    kinds: dict[tuple[DepthIdx, int], _Kind] = dataclasses.field(default_factory=dict)
    compared: set[tuple[DepthIdx, int]] = dataclasses.field(default_factory=set)
    unmatched: dict[tuple[DepthIdx, int], list[int]] = dataclasses.field(
        default_factory=dict
    )
    """The split records whose row slice did not match the row alone: the rows."""

    def compare(
        self,
        run: Run,
        batched: dict[DepthIdx, Any],
        row: int,
        keep: Tensor | None,
    ) -> None:
        """Run ``row`` alone (its padding, ``keep`` false, removed) and compare."""
        try:
            alone = run.records(*_row_alone(run, row, keep), seed=True)
        except Exception as error:  # noqa: BLE001 (what the row alone raised is the finding)
            self.failed.setdefault(raised(error), []).append(row)
            return
        stripped = keep if keep is not None and not bool(keep.all()) else None
        for label in run.labels:
            wholes = list(iter_tensors(batched[label]))
            singles = list(iter_tensors(alone[label]))
            if len(wholes) != len(singles):  # another structure: no pairing is sound
                self.kinds.update({(label, i): "whole" for i in range(len(wholes))})
                continue
            for i, (whole, single) in enumerate(zip(wholes, singles, strict=True)):
                kind, mine = _row_slice(whole, single, (row, run.size or 0), stripped)
                self.kinds[label, i] = kind
                if mine is None:
                    if kind == "split":
                        self.unmatched.setdefault((label, i), []).append(row)
                    continue
                self.compared.add((label, i))
                diff = difference(mine, single)
                key = run.rnet.table[label].label_str
                self.per_layer[key] = max(self.per_layer.get(key, 0.0), diff)
                if diff > self.worst[0]:
                    self.worst = (diff, single.dtype, run.describe(label), row)

    def notes(self, run: Run, empty: list[int]) -> list[str]:
        """Say what could not be compared, and why."""
        notes = []
        if empty:
            rows = ", ".join(map(str, empty))
            notes.append(
                f"row{'s' * (len(empty) > 1)} {rows} "
                f"{'have' if len(empty) > 1 else 'has'} no real token (all padding): "
                "not run alone"
            )
        notes += [
            f"{_rows_named(rows)} alone raised {text}: not compared"
            for text, rows in self.failed.items()
        ]
        whole = _labels_of(k for k, kind in self.kinds.items() if kind == "whole")
        shared = _labels_of(
            k
            for k, kind in self.kinds.items()
            if kind == "shared" and k not in self.compared
        )
        if whole:
            notes.append(
                f"not compared: records of {_described(run, whole)} have no batch "
                f"dimension of size {run.size} (a record of the whole batch, or rows "
                "reshaped into another dimension)"
            )
        norms = in_train_mode(run.rnet.net, NORMS)
        if norms and (whole or self.failed) and self.per_layer:
            notes.append(
                f"a BatchNorm in train mode ({named(norms)}) ties rows together "
                "whatever the layout: call net.eval()"
            )
        if shared:
            notes.append(
                f"not compared: records of {_described(run, shared)} are shared by "
                "every row (batch dimension of size 1), and no checked row alone "
                "gives them the same shape (its padding cut)"
            )
        if self.unmatched:
            missed = sorted({row for rows in self.unmatched.values() for row in rows})
            notes.append(
                f"not compared on row{'s' * (len(missed) > 1)} "
                f"{', '.join(map(str, missed))}: records of "
                f"{_described(run, _labels_of(self.unmatched))} do not have the row "
                "alone's shape once its padding is cut"
            )
        return notes


def _rows_named(rows: list[int]) -> str:
    """Name rows: ``"row 1"``, ``"rows 0, 1 and 2"``."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    return f"rows {', '.join(map(str, rows[:-1]))} and {rows[-1]}"


def _labels_of(keys: Any) -> list[DepthIdx]:
    """Return the labels of record keys ``(label, i)``, in order, once each."""
    return list(dict.fromkeys(label for label, _ in keys))


def _described(run: Run, labels: list[DepthIdx]) -> str:
    """Name the calls ``labels`` as the report does."""
    return named_plain([run.describe(label) for label in labels])


def _row_slice(
    whole: Tensor, single: Tensor, where: tuple[int, int], keep: Tensor | None
) -> tuple[_Kind, Tensor | None]:
    """Return how a record relates to the rows, and row ``row``'s part of it.

    ``where``: the row and the batch size. The record's batch dimension is
    told by its shapes, batched and alone: the one dimension of the batch's
    size that is 1 in the row alone, the others equal (a sequence-first
    layer's ``[T, B, F]`` output and ``[1, B, F]`` state are cut on dim 1).
    A padded row's part has its padding columns (``keep`` false) cut from
    dim 1 of a record batched on dim 0. ``None`` as the part: no part of
    the record has the shape of the row alone's.
    """
    size = where[1]
    if whole.dim() == single.dim():
        parts = _cuts(whole, single, where, keep)
        if len(parts) == 1 or (parts and size == 1):  # one way to cut it
            return "split", parts[0]
        if parts:  # several dimensions would do: whose rows they are is unknown
            return "whole", None
        if any(
            whole.shape[d] == size and single.shape[d] == 1 for d in range(whole.dim())
        ):  # a batch dimension, but no cut has the row alone's shape
            return "split", None
    if size > 1 and whole.dim() >= 1 and whole.shape[0] == 1:  # broadcast to every row
        return "shared", whole if whole.shape == single.shape else None
    return "whole", None


def _cuts(
    whole: Tensor, single: Tensor, where: tuple[int, int], keep: Tensor | None
) -> list[Tensor]:
    """Return row ``row``'s part of ``whole`` along each dimension that gives one."""
    row, size = where
    parts = []
    for dim in range(whole.dim()):
        if whole.shape[dim] != size or single.shape[dim] != 1:
            continue
        mine = whole.narrow(dim, row, 1)
        if dim == 0 and keep is not None and mine.shape[1:2] == keep.shape:
            mine = mine[:, keep.to(mine.device)]
        if mine.shape == single.shape:
            parts.append(mine)
    return parts
