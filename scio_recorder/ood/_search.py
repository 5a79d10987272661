"""One nearest-neighbour search for every detector that needs one.

:class:`~scio_recorder.ood.KNN`, :class:`~scio_recorder.ood.NNGuide`,
:class:`~scio_recorder.ood.LID`, :class:`~scio_recorder.ood.Trust`,
:class:`~scio_recorder.ood.DkNN` and :class:`~scio_recorder.ood.JTLA` look
up the ``k`` rows of a bank of fit features nearest to each query with
:func:`nearest`. The search is exact and works in blocks: queries in blocks
of at most 1024 rows, the bank in blocks sized so that a block of the bank
and its block of distances fit a memory budget; each block's ``k`` best are
merged into the running ``k`` best. Its memory does not grow with the bank,
which may be a memory-mapped tensor (``collect`` spills a large bank to
disk): only one block of it is read at a time.

Two backends compute a block's ``k`` best: torch (``||q||^2 + ||b||^2 - 2
q.b`` by a matrix product, then ``topk``; any device) and ``faiss``
(``faiss.knn``, when ``faiss`` is installed: the ``faiss`` extra); by
default faiss for queries on the CPU, torch otherwise.

**The same results, and ties.** Both backends return, per query, the
``k`` best values sorted, and among equal values keep and list the lower
bank index first (torch's ``topk`` and faiss's heap may choose any of
several rows equal at the ``k``-th place: where they had to choose, the
block is sorted whole). The two compute a distance with other roundings (a
few float32 ``eps`` times ``||q||^2 + ||b||^2``): the values agree to that
rounding, and the indices wherever no two bank rows lie at the same
distance, to that rounding, across the ``k``-th place (two copies of a row
are always at the same distance: the lower index comes first).
"""

from __future__ import annotations

__all__ = [
    "BACKENDS",
    "METRICS",
    "Neighbours",
    "check_search",
    "faiss_available",
    "nearest",
]

import dataclasses
import importlib.util
import math
from typing import Any

import torch
from torch import Tensor

from scio_recorder._support.extras import install_hint

METRICS = ("l2", "ip")
"""``"l2"``: squared Euclidean distance, nearest first; ``"ip"``: inner
product, largest first."""
BACKENDS = ("auto", "torch", "faiss")
DEFAULT_BUDGET = 128 * 2**20
"""Bytes a search may use besides the queries, the bank and the result."""
_QUERY_ROWS = 1024
_F32 = torch.float32


@dataclasses.dataclass(frozen=True)
class Neighbours:
    """The ``k`` nearest bank rows of each query: values and bank indices.

    Attributes
    ----------
    values : Tensor
        ``[queries, k]`` float32: squared Euclidean distances in increasing
        order (``"l2"``), or inner products in decreasing order (``"ip"``).
    indices : Tensor
        ``[queries, k]`` int64: the rows of the bank, in the same order;
        among equal values the lower index first.
    """

    values: Tensor
    indices: Tensor


def faiss_available() -> bool:
    """Return whether ``faiss`` can be imported (the ``faiss`` extra).

    Examples
    --------
    >>> isinstance(faiss_available(), bool)
    True

    """
    return importlib.util.find_spec("faiss") is not None


def check_search(who: str, backend: str, search_budget: int | None) -> None:
    """Refuse an unknown search backend or a budget that is not a positive int."""
    if backend not in BACKENDS:
        msg = f"{who}: backend must be one of {list(BACKENDS)}, got {backend!r}"
        raise ValueError(msg)
    if search_budget is not None and (
        isinstance(search_budget, bool)
        or not isinstance(search_budget, int)
        or search_budget < 1
    ):
        msg = (
            f"{who}: search_budget must be a number of bytes (an int >= 1) or "
            f"None, got {search_budget!r}"
        )
        raise ValueError(msg)


def nearest(  # noqa: PLR0913 (the search's options, keyword-only)
    queries: Tensor,
    bank: Tensor,
    k: int,
    *,
    metric: str = "l2",
    exclude: Tensor | None = None,
    memory_budget: int | None = None,
    backend: str = "auto",
) -> Neighbours:
    """Return the ``k`` rows of ``bank`` nearest to each query, exactly.

    Parameters
    ----------
    queries : Tensor
        ``[Q, F]``, on any device (the search runs there).
    bank : Tensor
        ``[N, F]``, on any device; read one block at a time (a
        memory-mapped tensor stays on disk but for the block being read).
        Both are compared in float32.
    k : int
        Neighbours per query, ``1 <= k <= N`` (``N - 1`` with ``exclude``).
    metric : {"l2", "ip"}
        Squared Euclidean distance (smallest first) or inner product
        (largest first).
    exclude : Tensor, optional
        ``[Q]`` int64: a bank row to leave out of each query's neighbours
        (``torch.arange(N)`` when the queries are the bank itself: each
        sample's neighbours without itself).
    memory_budget : int, optional
        Bytes for a block of the bank and its distances; default 128 MiB.
        A block holds at least ``k + 1`` rows of the bank.
    backend : {"auto", "torch", "faiss"}
        ``"auto"``: faiss when it is installed and the queries are on the
        CPU, torch otherwise.

    Returns
    -------
    Neighbours
        ``values`` and ``indices``, ``[Q, k]``, on the queries' device. A
        query holding a NaN or an infinity is infinitely far from every row
        (values ``inf``, ``-inf`` for ``"ip"``; indices ``0 .. k - 1``).

    Raises
    ------
    ValueError
        For shapes that do not match, ``k`` out of range, an unknown
        ``metric`` or ``backend``, or ``exclude`` of another shape.
    ImportError
        For ``backend="faiss"`` without faiss installed.

    Examples
    --------
    >>> import torch
    >>> bank = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    >>> found = nearest(torch.tensor([[0.9, 0.0]]), bank, 2, backend="torch")
    >>> found.indices.tolist(), [round(v, 4) for v in found.values[0].tolist()]
    ([[1, 0]], [0.01, 0.81])
    >>> nearest(bank, bank, 1, exclude=torch.arange(3), backend="torch").indices
    tensor([[1],
            [0],
            [1]])

    """
    _check(queries, bank, k, metric=metric, exclude=exclude, backend=backend)
    budget = DEFAULT_BUDGET if memory_budget is None else int(memory_budget)
    device = queries.device
    use_faiss = backend == "faiss" or (
        backend == "auto" and device.type == "cpu" and faiss_available()
    )
    n, features = bank.shape
    q_rows, b_rows = _blocks(queries.shape[0], n, features, k, budget)
    values, indices = [], []
    for q_start in range(0, queries.shape[0], q_rows):
        block = queries[q_start : q_start + q_rows].to(_F32)
        skip = None if exclude is None else exclude[q_start : q_start + q_rows]
        if use_faiss:
            best = _search_faiss(
                block, bank, k, metric=metric, exclude=skip, b_rows=b_rows
            )
        else:
            best = _search_torch(
                block, bank, k, metric=metric, exclude=skip, b_rows=b_rows
            )
        values.append(best[0])
        indices.append(best[1])
    if not values:
        empty = torch.zeros(0, k, dtype=_F32, device=device)
        return Neighbours(empty, empty.to(torch.int64))
    keys, rows = torch.cat(values).to(device), torch.cat(indices).to(device)
    bad = ~torch.isfinite(queries).all(dim=1)
    if bool(bad.any()):
        # A query with a NaN or an infinity is infinitely far from every row.
        keys[bad] = math.inf
        rows[bad] = torch.arange(k, device=device)
    # Internally, smaller is nearer for both metrics (inner products negated).
    return Neighbours(keys if metric == "l2" else -keys, rows)


def _check(  # noqa: PLR0913 (the arguments of nearest)
    queries: Tensor,
    bank: Tensor,
    k: int,
    *,
    metric: str,
    exclude: Tensor | None,
    backend: str,
) -> None:
    if metric not in METRICS:
        msg = f"nearest: metric must be one of {list(METRICS)}, got {metric!r}"
        raise ValueError(msg)
    if backend not in BACKENDS:
        msg = f"nearest: backend must be one of {list(BACKENDS)}, got {backend!r}"
        raise ValueError(msg)
    if backend == "faiss" and not faiss_available():
        msg = (
            "nearest: backend='faiss' needs faiss, which is not installed: "
            f"{install_hint('faiss', 'faiss-cpu')}; or use backend='torch'."
        )
        raise ImportError(msg)
    if queries.dim() != 2 or bank.dim() != 2 or queries.shape[1] != bank.shape[1]:  # noqa: PLR2004 (matrices)
        msg = (
            "nearest: queries [Q, F] and bank [N, F] must be matrices with the "
            f"same F, got {list(queries.shape)} and {list(bank.shape)}"
        )
        raise ValueError(msg)
    available = bank.shape[0] - (exclude is not None)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= available:
        left = " (each query's own row left out)" if exclude is not None else ""
        msg = (
            f"nearest: k must be an int in [1, {available}], the bank's "
            f"{bank.shape[0]} rows{left}; got {k!r}"
        )
        raise ValueError(msg)
    if exclude is not None and tuple(exclude.shape) != (queries.shape[0],):
        msg = (
            f"nearest: exclude must hold one bank row per query, shape "
            f"[{queries.shape[0]}], got {list(exclude.shape)}"
        )
        raise ValueError(msg)


def _blocks(q: int, n: int, features: int, k: int, budget: int) -> tuple[int, int]:
    """Rows of a block of queries and of the bank within ``budget`` bytes.

    A block of the bank costs its rows and their distances to the block of
    queries (float32, and a mask of the same size): ``4 F + 5 q`` bytes a
    row; the block of queries ``4 q F``.
    """
    q_rows = max(1, min(q, _QUERY_ROWS))
    per_row = 4 * features + 5 * q_rows
    b_rows = (budget - 4 * q_rows * features) // per_row
    return q_rows, max(1, min(n, max(k + 1, b_rows)))


def _sorted_pairs(values: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """Sort each row by value, the lower index first among equal values."""
    by_index = indices.argsort(dim=1)
    values, indices = values.gather(1, by_index), indices.gather(1, by_index)
    by_value = values.argsort(dim=1, stable=True)
    return values.gather(1, by_value), indices.gather(1, by_value)


def _merge(
    best: tuple[Tensor, Tensor] | None, new: tuple[Tensor, Tensor], k: int
) -> tuple[Tensor, Tensor]:
    """Keep the ``k`` best of the running best and a later block's best.

    Both are sorted by (value, index) and the running best's indices are
    all lower, so a stable sort of the two side by side keeps that order.
    """
    if best is None:
        return new[0][:, :k], new[1][:, :k]
    values = torch.cat([best[0], new[0]], dim=1)
    indices = torch.cat([best[1], new[1].to(best[1].device)], dim=1)
    order = values.argsort(dim=1, stable=True)[:, :k]
    return values.gather(1, order), indices.gather(1, order)


def _keys(block: Tensor, part: Tensor, metric: str) -> Tensor:
    """Return ``[q, b]`` keys, smaller = nearer."""
    if metric == "ip":
        return (block @ part.T).neg_()
    # One [q, b] buffer: the products, then in place (-2 q.b exact) + ||b||^2
    # + ||q||^2.
    keys = (block @ part.T).mul_(-2).add_(part.square().sum(dim=1)[None, :])
    return keys.add_(block.square().sum(dim=1, keepdim=True)).clamp_(min=0)


def _smallest(keys: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Return the ``k`` smallest keys of each row, lower indices first among equals."""
    wanted = min(k + 1, keys.shape[1])
    values, indices = keys.topk(wanted, dim=1, largest=False, sorted=True)
    if wanted > k:
        # topk may keep any of several columns equal to the k-th value: where
        # the next one is equal too, it had to choose; sort those rows whole.
        cut = (values[:, k - 1] == values[:, k]).nonzero().reshape(-1)
        if cut.numel():
            ordered = keys[cut].sort(dim=1, stable=True)
            values[cut] = ordered.values[:, :wanted]
            indices[cut] = ordered.indices[:, :wanted]
        values, indices = values[:, :k], indices[:, :k]
    return _sorted_pairs(values, indices)


def _search_torch(  # noqa: PLR0913 (one block of queries and the search's options)
    block: Tensor,
    bank: Tensor,
    k: int,
    *,
    metric: str,
    exclude: Tensor | None,
    b_rows: int,
) -> tuple[Tensor, Tensor]:
    best = None
    rows = torch.arange(block.shape[0], device=block.device)
    for start in range(0, bank.shape[0], b_rows):
        part = bank[start : start + b_rows].to(device=block.device, dtype=_F32)
        local = None if exclude is None else exclude.to(block.device) - start
        values, indices = _block_best(
            block, part, k, metric=metric, own=local, rows=rows
        )
        del part  # before the next block is read
        best = _merge(best, (values, indices + start), k)
    assert best is not None  # noqa: S101 (the bank has rows: checked)
    return best


def _block_best(  # noqa: PLR0913 (a block of queries, one of the bank, the options)
    block: Tensor,
    part: Tensor,
    k: int,
    *,
    metric: str,
    own: Tensor | None,
    rows: Tensor,
) -> tuple[Tensor, Tensor]:
    """Return the ``k`` best of one block of the bank (its distances die here)."""
    keys = _keys(block, part, metric)
    if own is not None:
        inside = (own >= 0) & (own < part.shape[0])
        keys[rows[inside], own[inside]] = math.inf
    return _smallest(keys, k)


def _search_faiss(  # noqa: PLR0913 (one block of queries and the search's options)
    block: Tensor,
    bank: Tensor,
    k: int,
    *,
    metric: str,
    exclude: Tensor | None,
    b_rows: int,
) -> tuple[Tensor, Tensor]:
    import faiss  # type: ignore[import-not-found,unused-ignore] # noqa: PLC0415 (optional)

    kind: Any = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    queries = block.detach().cpu().contiguous().numpy()
    skip = None if exclude is None else exclude.cpu()
    # k (one more where a query's own row may be among them), and one more
    # to see whether faiss had to choose among values equal to the last one.
    needed = k + (skip is not None)
    best = None
    for start in range(0, bank.shape[0], b_rows):
        part = bank[start : start + b_rows].detach().to("cpu", _F32).contiguous()
        rows = part.numpy()
        search = _faiss_search(faiss, rows, kind, negate=metric == "ip")
        own = None if skip is None else skip - start
        keys, indices = search(queries, min(len(rows), needed + 1))
        values, indices = _best(keys, indices, own, k)
        if keys.shape[1] > needed:
            tied = (keys[:, needed - 1] == keys[:, needed]).nonzero().reshape(-1)
            if tied.numel():
                # Ties across the last place: those rows against the whole block.
                every, where = search(queries[tied.numpy()], len(rows))
                mine = None if own is None else own[tied]
                values[tied], indices[tied] = _best(every, where, mine, k)
        best = _merge(best, (values, indices + start), k)
    assert best is not None  # noqa: S101 (the bank has rows: checked)
    return best


def _best(
    keys: Tensor, indices: Tensor, own: Tensor | None, k: int
) -> tuple[Tensor, Tensor]:
    """Return the ``k`` best of faiss's candidates, a query's own row left out."""
    if own is not None:
        keys = keys.masked_fill(indices == own[:, None], math.inf)
    values, indices = _sorted_pairs(keys.nan_to_num(nan=math.inf), indices)
    return values[:, :k], indices[:, :k]


def _faiss_search(faiss: Any, rows: Any, kind: Any, *, negate: bool) -> Any:
    """Return ``search(queries, k) -> (keys, indices)`` over ``rows`` with faiss.

    Keys are smaller for nearer rows (inner products negated), in faiss's
    order.
    """

    def search(queries: Any, k: int) -> tuple[Tensor, Tensor]:
        found, where = faiss.knn(queries, rows, k, metric=kind)
        keys = torch.from_numpy(found)
        return (-keys if negate else keys), torch.from_numpy(where).to(torch.int64)

    return search
