"""The shared nearest-neighbour search against a brute-force oracle.

The oracle computes every distance in float64 and sorts each row stably
(equal values: the lower bank index first, the search's stated tie rule).
On small-integer features every squared distance and inner product is an
exact float32 number in both, so the search must return exactly the
oracle's values and indices, in any block size and with either backend. On
float features the two backends round differently: values agree within a
few ``eps32 (||q||^2 + ||b||^2)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scio_recorder.ood import _search
from scio_recorder.ood._search import Neighbours, faiss_available, nearest

BACKENDS = ["torch", "faiss"] if faiss_available() else ["torch"]
EPS32 = torch.finfo(torch.float32).eps


def oracle(queries, bank, k, metric="l2", exclude=None):
    """Every distance in float64, each row sorted stably; the first k."""
    q, b = queries.double(), bank.double()
    if metric == "l2":
        keys = ((q[:, None, :] - b[None, :, :]) ** 2).sum(dim=2)
    else:
        keys = -(q @ b.T)
    if exclude is not None:
        keys[torch.arange(len(q)), exclude] = torch.inf
    order = keys.argsort(dim=1, stable=True)[:, :k]
    values = keys.gather(1, order)
    return (values if metric == "l2" else -values), order


@settings(max_examples=40, deadline=None)
@given(
    queries=st.integers(0, 12),
    rows=st.integers(2, 40),
    features=st.integers(1, 6),
    k=st.integers(1, 8),
    budget=st.sampled_from([1, 200, 2000, None]),
    metric=st.sampled_from(["l2", "ip"]),
    leave_out=st.booleans(),
    backend=st.sampled_from(BACKENDS),
    seed=st.integers(0, 2**16),
)
def test_nearest_is_the_stable_sort_of_exact_distances(  # noqa: PLR0917 (the strategy)
    queries, rows, features, k, budget, metric, leave_out, backend, seed
):
    gen = torch.Generator().manual_seed(seed)
    # Small integers (many ties): exact in float32, so no rounding to forgive.
    bank = torch.randint(-2, 3, (rows, features), generator=gen).float()
    if leave_out:
        picks = torch.randint(0, rows, (queries,), generator=gen)
        q, exclude = bank[picks], picks
    else:
        q, exclude = torch.randint(-2, 3, (queries, features), generator=gen), None
        q = q.float()
    k = min(k, rows - leave_out)
    found = nearest(
        q,
        bank,
        k,
        metric=metric,
        exclude=exclude,
        memory_budget=budget,
        backend=backend,
    )
    values, indices = oracle(q, bank, k, metric, exclude)
    assert found.indices.dtype == torch.int64
    assert found.values.dtype == torch.float32
    assert torch.equal(found.indices, indices)
    assert torch.equal(found.values.double(), values)


@pytest.mark.skipif(not faiss_available(), reason="faiss is not installed")
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_backends_agree_on_float_features(metric):
    bank, queries = torch.randn(3000, 24), torch.randn(70, 24)
    by_torch = nearest(queries, bank, 5, metric=metric, backend="torch")
    by_faiss = nearest(queries, bank, 5, metric=metric, backend="faiss")
    values, indices = oracle(queries, bank, 5, metric)
    # Each computes ||q||^2 + ||b||^2 - 2 q.b (or q.b) in float32: a few
    # eps32 of the terms' magnitude (about 2 * 24 here) from the exact value.
    scale = queries.square().sum(dim=1, keepdim=True) + bank.square().sum(1).max()
    for found in (by_torch, by_faiss):
        assert torch.equal(found.indices, indices)
        assert bool(((found.values.double() - values).abs() <= 8 * EPS32 * scale).all())


def test_blocks_of_the_bank_are_merged_in_order():
    # Three copies of each row, 4 rows a block: ties across block edges keep
    # the lower index first.
    bank = torch.arange(6.0).repeat_interleave(3)[:, None]
    found = nearest(torch.tensor([[2.0], [2.4]]), bank, 5, memory_budget=1)
    assert found.indices.tolist() == [[6, 7, 8, 3, 4], [6, 7, 8, 9, 10]]
    assert found.values[0].tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_memory_mapped_bank_is_read_block_by_block(tmp_path, backend):
    bank = torch.randint(-3, 4, (500, 8)).float()
    path = tmp_path / "bank.f32"
    bank.numpy().tofile(path)
    mapped = torch.from_numpy(
        np.memmap(path, dtype=np.float32, mode="c", shape=(500, 8))
    )
    queries = torch.randint(-3, 4, (9, 8)).float()
    found = nearest(queries, mapped, 4, memory_budget=4096, backend=backend)
    values, indices = oracle(queries, bank, 4)
    assert torch.equal(found.indices, indices)
    assert torch.equal(found.values.double(), values)


def test_blocks_fit_the_budget():
    for queries, features, budget in [
        (5000, 512, 2**27),
        (64, 2048, 2**20),
        (1, 8, 10**4),
    ]:
        q_rows, b_rows = _search._blocks(queries, 10**7, features, 10, budget)
        used = 4 * b_rows * features + 5 * q_rows * b_rows + 4 * q_rows * features
        assert used <= budget, (queries, features, budget)
        assert q_rows <= 1024
    # A budget too small for k + 1 rows still searches k + 1 at a time.
    assert _search._blocks(3, 100, 8, 10, 1) == (3, 11)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_non_finite_query_is_infinitely_far(backend):
    bank = torch.randn(20, 3)
    queries = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 0.0, 0.0]])
    found = nearest(queries, bank, 3, backend=backend)
    assert found.values[0].tolist() == [float("inf")] * 3
    assert found.indices[0].tolist() == [0, 1, 2]
    assert torch.isfinite(found.values[1]).all()
    products = nearest(queries, bank, 2, metric="ip", backend=backend)
    assert products.values[0].tolist() == [float("-inf")] * 2


def test_no_query_gives_no_row():
    found = nearest(torch.zeros(0, 3), torch.randn(5, 3), 2)
    assert isinstance(found, Neighbours)
    assert found.values.shape == (0, 2)
    assert found.indices.shape == (0, 2)
    assert found.indices.dtype == torch.int64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"k": 0},
            r"^nearest: k must be an int in \[1, 5\], the bank's 5 rows; got 0$",
        ),
        (
            {"k": 6},
            r"^nearest: k must be an int in \[1, 5\], the bank's 5 rows; got 6$",
        ),
        (
            {"k": 5, "exclude": torch.arange(2)},
            (
                r"^nearest: k must be an int in \[1, 4\], the bank's 5 rows \(each "
                r"query's own row left out\); got 5$"
            ),
        ),
        (
            {"k": 1, "exclude": torch.arange(3)},
            (
                r"^nearest: exclude must hold one bank row per query, shape \[2\], "
                r"got \[3\]$"
            ),
        ),
        (
            {"k": 1, "metric": "cosine"},
            r"^nearest: metric must be one of \['l2', 'ip'\], got 'cosine'$",
        ),
        (
            {"k": 1, "backend": "annoy"},
            (
                r"^nearest: backend must be one of \['auto', 'torch', 'faiss'\], "
                r"got 'annoy'$"
            ),
        ),
    ],
)
def test_bad_arguments_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        nearest(torch.zeros(2, 3), torch.zeros(5, 3), **kwargs)


def test_queries_and_bank_must_share_features():
    with pytest.raises(
        ValueError,
        match=r"^nearest: queries \[Q, F\] and bank \[N, F\] must be matrices with "
        r"the same F, got \[2, 3\] and \[5, 4\]$",
    ):
        nearest(torch.zeros(2, 3), torch.zeros(5, 4), 1)


def test_faiss_asked_without_faiss_names_the_extra(monkeypatch):
    monkeypatch.setattr(_search, "faiss_available", lambda: False)
    with pytest.raises(
        ImportError, match=r"pip install faiss-cpu.*'scio-recorder\[faiss\]'"
    ):
        nearest(torch.zeros(2, 3), torch.zeros(5, 3), 1, backend="faiss")
    # "auto" falls back to torch.
    found = nearest(torch.zeros(2, 3), torch.arange(15.0).reshape(5, 3), 1)
    assert found.indices.tolist() == [[0], [0]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_search_runs_on_the_queries_device():
    bank = torch.randint(-2, 3, (300, 5)).float()
    queries = torch.randint(-2, 3, (40, 5)).float()
    found = nearest(queries.cuda(), bank, 4, memory_budget=2000)
    values, indices = oracle(queries, bank, 4)
    assert found.indices.device.type == "cuda"
    assert torch.equal(found.indices.cpu(), indices)
    assert torch.equal(found.values.cpu().double(), values)
