"""Reducers against direct float64 computations, over splits and merge orders."""

from __future__ import annotations

import dataclasses
import io
import itertools
import math
import random
import re
from typing import TYPE_CHECKING, Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import scio_recorder.reduce._per_class as per_class_module
from scio_recorder.reduce import (
    REDUCTION_NAMES,
    Concat,
    Count,
    CountResult,
    Covariance,
    CovarianceResult,
    FeatureMapGram,
    FeatureMapGramResult,
    Fold,
    Gram,
    GramResult,
    Keep,
    Max,
    Min,
    MinMax,
    MinMaxResult,
    Moments,
    MomentsResult,
    PerClass,
    Quantiles,
    RecordMean,
    Reducer,
    SharedCovariance,
    SharedCovarianceResult,
    Sum,
    make_reducer,
    quantile_rank_bound,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

F64 = torch.float64
SETTINGS = settings(max_examples=20, deadline=None)
CLASSES = 3


# ------------------------------------------------------------------ streams
@dataclasses.dataclass
class Stream:
    """A data set cut into records, and a way to spread them over parts."""

    data: Tensor  # all samples, concatenated
    labels: Tensor  # the class of each sample
    chunks: list[Tensor]  # the records, in stream order
    targets: list[Tensor]  # the labels of each record
    assignment: list[int]  # the part each record goes to
    parts: int
    seed: int  # drives the merge order

    @property
    def direct(self) -> Tensor:
        return self.data.to(F64)


def _cut(draw: Any, n: int) -> list[int]:
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    return [0, *cuts, n]


@st.composite
def streams(
    draw: Any,
    sample_shape: tuple[int, ...] | None = None,
    max_rows: int = 40,
    integer: bool = False,
) -> Stream:
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(1, max_rows))
    if sample_shape is None:
        sample_shape = draw(st.sampled_from([(), (1,), (3,), (2, 3)]))
    dtype = draw(st.sampled_from([torch.float32, F64]))
    offset = draw(st.sampled_from([0.0, 1e3]))
    gen = torch.Generator().manual_seed(seed)
    if integer:
        data = torch.randint(-3, 4, (n, *sample_shape), generator=gen).to(dtype)
    else:
        data = (torch.randn(n, *sample_shape, generator=gen, dtype=F64) + offset).to(
            dtype
        )
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    bounds = _cut(draw, n)
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    targets = [labels[a:b] for a, b in itertools.pairwise(bounds)]
    parts = draw(st.integers(1, len(chunks)))
    assignment = draw(
        st.lists(st.integers(0, parts - 1), min_size=len(chunks), max_size=len(chunks))
    )
    return Stream(data, labels, chunks, targets, assignment, parts, seed)


@st.composite
def record_streams(draw: Any) -> Stream:
    """Records of one shape (for the elementwise folds): one per chunk."""
    seed = draw(st.integers(0, 2**32 - 1))
    count = draw(st.integers(1, 10))
    shape = draw(st.sampled_from([(), (3,), (2, 2)]))
    dtype = draw(st.sampled_from([torch.float32, F64]))
    gen = torch.Generator().manual_seed(seed)
    data = torch.randn(count, *shape, generator=gen, dtype=F64).to(dtype)
    parts = draw(st.integers(1, count))
    assignment = draw(
        st.lists(st.integers(0, parts - 1), min_size=count, max_size=count)
    )
    none = torch.zeros(0, dtype=torch.int64)
    return Stream(data, none, list(data), [none] * count, assignment, parts, seed)


def one_pass(factory: Callable[[], Reducer], stream: Stream) -> Reducer:
    reducer = factory()
    for chunk, target in zip(stream.chunks, stream.targets, strict=True):
        reducer.update(chunk, target)
    return reducer


def merged(factory: Callable[[], Reducer], stream: Stream) -> Reducer:
    """Reduce each part on its own, then merge them in a random tree."""
    proto = factory()
    parts = [proto.fresh() for _ in range(stream.parts)]
    for chunk, target, part in zip(
        stream.chunks, stream.targets, stream.assignment, strict=True
    ):
        parts[part].update(chunk, target)
    rng = random.Random(stream.seed)
    rng.shuffle(parts)
    while len(parts) > 1:  # merge two random parts, in a random direction
        i, j = rng.sample(range(len(parts)), 2)
        parts[i].merge(parts[j])
        del parts[j]
    if rng.random() < 0.5:  # sometimes merge into a fresh reducer
        total = proto.fresh()
        total.merge(parts[0])
        return total
    return parts[0]


def reloaded(factory: Callable[[], Reducer], reducer: Reducer) -> Reducer:
    """Round-trip the state through torch.save / torch.load(weights_only)."""
    buffer = io.BytesIO()
    torch.save(reducer.state(), buffer)
    buffer.seek(0)
    again = factory()
    again.load_state(torch.load(buffer, weights_only=True))
    return again


def assert_same(actual: Any, expected: Any, tol: float = 1e-9) -> None:
    """Compare results: dataclasses, dicts, lists, tensors and numbers."""
    if dataclasses.is_dataclass(actual):
        assert type(actual) is type(expected)
        for field in dataclasses.fields(actual):
            assert_same(getattr(actual, field.name), getattr(expected, field.name), tol)
    elif isinstance(actual, dict):
        assert actual.keys() == expected.keys()
        for key in actual:
            assert_same(actual[key], expected[key], tol)
    elif isinstance(actual, list):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e, tol)
    elif isinstance(actual, torch.Tensor):
        torch.testing.assert_close(
            actual, expected, rtol=tol, atol=tol, equal_nan=True, check_dtype=True
        )
    else:
        assert actual == expected


def check(
    factory: Callable[[], Reducer],
    stream: Stream,
    expected: Any,
    tol: float = 1e-9,
) -> None:
    """One pass, split-and-merged, and reloaded all agree with ``expected``."""
    single = one_pass(factory, stream)
    assert_same(single.result(), expected, tol)
    assert_same(merged(factory, stream).result(), expected, tol)
    assert_same(reloaded(factory, single).result(), expected, tol)
    assert_same(single.result(), expected, tol)  # result() kept the state


# ------------------------------------------------------- direct computations
def flat(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).to(F64)


def direct_var(x: Tensor, ddof: int) -> Tensor:
    mean = x.mean(0)
    n = x.shape[0]
    if n - ddof <= 0:
        return torch.full_like(mean, math.nan)
    return ((x - mean) ** 2).sum(0) / (n - ddof)


def direct_moments(data: Tensor) -> MomentsResult:
    x = data.to(F64)
    var = direct_var(x, 1)
    return MomentsResult(
        count=x.shape[0],
        mean=x.mean(0),
        var=var,
        var_population=direct_var(x, 0),
        std=var.sqrt(),
    )


def direct_cov(data: Tensor) -> CovarianceResult:

    x = flat(data)
    n = x.shape[0]
    centred = x - x.mean(0)
    comoment = centred.T @ centred
    cov = comoment / (n - 1) if n > 1 else torch.full_like(comoment, math.nan)
    return CovarianceResult(n, x.mean(0), cov, comoment / n)


def direct_shared(data: Tensor, labels: Tensor) -> SharedCovarianceResult:

    x = flat(data)
    n, features = x.shape
    means = torch.zeros(CLASSES, features, dtype=F64)
    counts = torch.zeros(CLASSES, dtype=torch.int64)
    within = torch.zeros(features, features, dtype=F64)
    for c in range(CLASSES):
        rows = x[labels == c]
        counts[c] = rows.shape[0]
        if rows.shape[0]:
            means[c] = rows.mean(0)
            centred = rows - means[c]
            within += centred.T @ centred
    dof = n - int((counts > 0).sum())
    unbiased = within / dof if dof > 0 else torch.full_like(within, math.nan)
    return SharedCovarianceResult(n, counts, means, within / n, unbiased)


def direct_fmgram(data: Tensor, power: int, *, row_sums: bool) -> FeatureMapGramResult:

    grams = []
    for sample in data.to(F64):
        f = sample.reshape(sample.shape[0], -1) ** power
        g = f @ f.T
        if row_sums:
            g = g.sum(1)
        grams.append(g.sign() * g.abs() ** (1 / power))
    stacked = torch.stack(grams)
    return FeatureMapGramResult(data.shape[0], stacked.amin(0), stacked.amax(0))


# --------------------------------------------------------- statistics, merged
@SETTINGS
@given(stream=streams())
def test_moments(stream: Stream) -> None:
    check(Moments, stream, direct_moments(stream.data))


@SETTINGS
@given(stream=streams())
def test_moments_match_torch_var(stream: Stream) -> None:
    res = one_pass(Moments, stream).result()
    x = stream.direct
    if x.shape[0] > 1:
        torch.testing.assert_close(res.var, x.var(0), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(res.var_population, x.var(0, correction=0))
    assert res.mean.shape == x.shape[1:]


@SETTINGS
@given(stream=streams())
def test_covariance(stream: Stream) -> None:
    check(Covariance, stream, direct_cov(stream.data))
    if stream.data.shape[0] > 1:
        cov = one_pass(Covariance, stream).result().cov
        expected = torch.cov(flat(stream.data).T).reshape(cov.shape)
        torch.testing.assert_close(cov, expected, rtol=1e-9, atol=1e-9)


@SETTINGS
@given(stream=streams())
def test_shared_covariance(stream: Stream) -> None:
    expected = direct_shared(stream.data, stream.labels)
    check(lambda: SharedCovariance(num_classes=CLASSES), stream, expected)


@SETTINGS
@given(stream=streams())
def test_shared_covariance_grows_without_num_classes(stream: Stream) -> None:
    """Without num_classes the table has as many rows as the largest label."""
    expected = direct_shared(stream.data, stream.labels)
    rows = int(stream.labels.max()) + 1
    expected = dataclasses.replace(
        expected,
        class_counts=expected.class_counts[:rows],
        means=expected.means[:rows],
    )
    check(SharedCovariance, stream, expected)


@SETTINGS
@given(stream=streams())
def test_minmax(stream: Stream) -> None:

    expected = MinMaxResult(stream.data.amin(0), stream.data.amax(0))
    check(MinMax, stream, expected)  # exact, in the input dtype


@SETTINGS
@given(stream=streams())
def test_gram(stream: Stream) -> None:

    x = flat(stream.data)
    n = x.shape[0]
    check(Gram, stream, GramResult(n, x.T @ x, x.T @ x / n))


@SETTINGS
@given(
    stream=streams(sample_shape=(3, 2, 2)),
    power=st.sampled_from([1, 2, 3]),
    row_sums=st.booleans(),
)
def test_feature_map_gram(stream: Stream, power: int, row_sums: bool) -> None:
    expected = direct_fmgram(stream.data, power, row_sums=row_sums)
    check(lambda: FeatureMapGram(power, row_sums=row_sums), stream, expected)


@SETTINGS
@given(stream=streams())
def test_count(stream: Stream) -> None:
    expected = CountResult(len(stream.chunks), stream.data.shape[0])
    check(Count, stream, expected)
    assert one_pass(Count, stream).count == stream.data.shape[0]


@SETTINGS
@given(stream=streams(), q=st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_quantiles_exact(stream: Stream, q: list[float]) -> None:
    x = stream.direct
    expected = torch.quantile(flat(x), torch.tensor(q, dtype=F64), dim=0)
    expected = expected.reshape(len(q), *x.shape[1:])
    check(lambda: Quantiles(q), stream, expected)
    pooled = torch.quantile(x.flatten(), torch.tensor(q, dtype=F64))
    check(lambda: Quantiles(q, per_feature=False), stream, pooled)


@SETTINGS
@given(stream=streams())
def test_concat(stream: Stream) -> None:
    single = one_pass(Concat, stream)
    assert torch.equal(single.result(), stream.data)  # rows in stream order
    assert single.nbytes == stream.data.numel() * stream.data.element_size()
    assert single.count == stream.data.shape[0]
    together = merged(Concat, stream).result()  # rows in merge order
    assert together.dtype == stream.data.dtype
    assert torch.equal(
        together.flatten().sort().values, stream.data.flatten().sort().values
    )
    assert torch.equal(reloaded(Concat, single).result(), stream.data)


@SETTINGS
@given(stream=streams())
def test_per_class_moments(stream: Stream) -> None:
    expected = {
        c: direct_moments(stream.data[stream.labels == c])
        for c in sorted(set(stream.labels.tolist()))
    }
    check(lambda: PerClass(Moments, num_classes=CLASSES), stream, expected)
    assert one_pass(lambda: PerClass(Moments()), stream).count == stream.data.shape[0]


@SETTINGS
@given(stream=streams(sample_shape=(2, 1, 3)))
def test_per_class_feature_map_gram(stream: Stream) -> None:
    expected = {
        c: direct_fmgram(stream.data[stream.labels == c], 2, row_sums=True)
        for c in sorted(set(stream.labels.tolist()))
    }
    check(lambda: PerClass(lambda: FeatureMapGram(2, row_sums=True)), stream, expected)


# ------------------------------------------------------------------- folds
FOLDS = {
    "sum": (Sum, lambda x: x.to(F64).sum(0), True),
    "mean": (RecordMean, lambda x: x.to(F64).mean(0), True),
    "max": (Max, lambda x: x.amax(0), False),
    "min": (Min, lambda x: x.amin(0), False),
    "fold-add": (lambda: Fold(torch.add), lambda x: x.sum(0), False),
    "make-sum": (lambda: make_reducer("sum"), lambda x: x.to(F64).sum(0), True),
}


@pytest.mark.parametrize(
    ("factory", "direct", "to_f64"), list(FOLDS.values()), ids=list(FOLDS)
)
@SETTINGS
@given(stream=record_streams())
def test_folds(
    factory: Callable[[], Reducer],
    direct: Callable[[Tensor], Tensor],
    to_f64: bool,
    stream: Stream,
) -> None:
    expected = direct(stream.data)
    tol = 1e-9 if stream.data.dtype == F64 or to_f64 else 1e-5
    check(factory, stream, expected, tol)
    assert one_pass(factory, stream).count == len(stream.chunks)
    assert expected.dtype == (F64 if to_f64 else stream.data.dtype)


@SETTINGS
@given(stream=record_streams())
def test_keep(stream: Stream) -> None:
    single = one_pass(Keep, stream)
    assert single.count == len(stream.chunks)
    kept = single.result()
    assert all(a is b for a, b in zip(kept, stream.chunks, strict=True))
    together = merged(Keep, stream).result()  # records in merge order
    assert sorted(t.flatten().tolist() for t in together) == sorted(
        t.flatten().tolist() for t in stream.chunks
    )
    again = reloaded(Keep, single).result()
    assert all(torch.equal(a, b) for a, b in zip(again, stream.chunks, strict=True))


def test_fold_with_non_tensor_accumulator() -> None:
    r = Fold(lambda acc, new: [*acc, new], name="append")
    r.update([1])
    r.update(2)
    assert r.result() == [1, 2]
    assert repr(r) == "Fold(append, count=2)"
    with pytest.raises(TypeError, match="not a tensor"):
        r.state()


def test_folds_own_their_first_record() -> None:
    record = torch.ones(3, dtype=F64)
    for factory in (Sum, Max, Min, RecordMean):
        r = factory()
        r.update(record)
        record.add_(10)
        assert torch.equal(r.result(), torch.ones(3, dtype=F64)), factory
        record.sub_(10)


def test_elementwise_folds_need_equal_shapes() -> None:
    r = Sum()
    r.update(torch.ones(2, 3))
    with pytest.raises(ValueError, match="equal shapes"):
        r.update(torch.ones(1, 3))  # would broadcast silently
    other = Sum()
    other.update(torch.ones(3))
    with pytest.raises(ValueError, match="equal shapes"):
        r.merge(other)


# --------------------------------------------------- numerical stability
def test_moments_stable_with_large_offset() -> None:
    """``1e6 + N(0, 1)`` in float32: the variance stays close to 1."""
    gen = torch.Generator().manual_seed(1)
    data = (1e6 + torch.randn(100_000, 2, generator=gen, dtype=F64)).float()
    r = Moments()
    for batch in data.split(1000):
        r.update(batch)
    var = r.result().var
    assert torch.allclose(var, torch.ones(2, dtype=F64), atol=0.03)
    torch.testing.assert_close(var, data.double().var(0), rtol=1e-9, atol=0)
    # The naive float32 sum of squares the test guards against fails badly.
    s = data.sum(0)
    sq = (data * data).sum(0)
    naive = (sq - s * s / data.shape[0]) / (data.shape[0] - 1)
    assert ((naive - 1).abs() > 1).all()


def test_float64_offset_beyond_sum_of_squares() -> None:
    """At offset 1e9 even float64 sums of squares fail; Chan merges do not."""
    gen = torch.Generator().manual_seed(2)
    data = 1e9 + torch.randn(20_000, 3, generator=gen, dtype=F64)
    labels = torch.randint(0, CLASSES, (20_000,), generator=gen)
    moments, cov, shared = Moments(), Covariance(), SharedCovariance(CLASSES)
    for batch, target in zip(data.split(50), labels.split(50), strict=True):
        for r in (moments, cov, shared):
            r.update(batch, target)
    centred = data - data.mean(0)
    torch.testing.assert_close(moments.result().var, centred.var(0), rtol=1e-7, atol=0)
    torch.testing.assert_close(
        cov.result().cov,
        centred.T @ centred / (data.shape[0] - 1),
        rtol=1e-6,
        atol=1e-7,
    )
    expected = direct_shared(data, labels).cov
    torch.testing.assert_close(shared.result().cov, expected, rtol=1e-6, atol=1e-7)
    naive = (data * data).mean(0) - data.mean(0) ** 2
    assert ((naive - 1).abs() > 0.5).any()


def test_single_sample_batches() -> None:
    gen = torch.Generator().manual_seed(3)
    data = 5 + torch.randn(300, 2, generator=gen, dtype=F64)
    r = Moments()
    for row in data.split(1):
        r.update(row)
    assert_same(r.result(), direct_moments(data))


# -------------------------------------------------------- approximate quantiles
QS = [i / 20 for i in range(21)]


def rank_distance(data: Tensor, result: Tensor, qs: list[float]) -> Tensor:
    """Per feature, the distance of ``q n`` to the rank interval of each answer."""
    values = data.reshape(data.shape[0], -1).T.to(F64).sort(dim=1).values.contiguous()
    answers = result.reshape(len(qs), -1).T.contiguous()
    below = torch.searchsorted(values, answers)  # #{x < y}
    upto = torch.searchsorted(values, answers, right=True)  # #{x <= y}
    target = torch.tensor(qs, dtype=F64) * data.shape[0]
    return torch.maximum(below - target, target - upto).clamp(min=0).amax()


def a_priori(n: int, k: int) -> float:
    return n * (math.floor(math.log2(n / k)) + 1) / k if n >= k else 0.0


def max_retained(n: int, k: int) -> int:
    levels = math.floor(math.log2(n / k)) + 2 if n >= k else 1
    return k * levels


@pytest.mark.parametrize("order", ["random", "sorted", "reversed"])
def test_sketch_error_within_bound_1e5(order: str) -> None:
    n, k = 100_000, 256
    gen = torch.Generator().manual_seed(4)
    data = torch.randn(n, 2, generator=gen, dtype=F64)
    if order == "sorted":
        data = data.sort(dim=0).values
    elif order == "reversed":
        data = data.sort(dim=0, descending=True).values
    r = Quantiles(QS, exact=False, k=k)
    seen = 0
    for batch in data.split(1000):
        r.update(batch)
        seen += batch.shape[0]
        assert r.retained < max_retained(seen, k)
    error = rank_distance(data, r.result(), QS)
    bound = r.rank_error_bound
    assert error <= bound <= quantile_rank_bound(n, k) <= a_priori(n, k)
    assert error / n < 0.01  # in practice far below the bound (~3.5 %)


def test_sketch_merged_parts_within_bound() -> None:
    n, k = 60_000, 128
    gen = torch.Generator().manual_seed(5)
    data = torch.rand(n, 3, generator=gen, dtype=torch.float32) ** 3
    parts = [Quantiles(QS, exact=False, k=k) for _ in range(7)]
    for i, batch in enumerate(data.split(777)):
        parts[(i * 5) % 7].update(batch)
    total = parts[3]
    for i in (6, 0, 2, 5, 1, 4):
        total.merge(parts[i])
    assert total.count == n
    error = rank_distance(data, total.result(), QS)
    assert error <= total.rank_error_bound <= quantile_rank_bound(n, k)
    assert total.retained < max_retained(n, k)


@SETTINGS
@given(
    stream=streams(sample_shape=(2,), max_rows=3000),
    k=st.sampled_from([2, 4, 6, 16, 64]),
    ties=st.booleans(),
)
def test_sketch_bound_property(stream: Stream, k: int, ties: bool) -> None:
    data = stream.data.round() if ties else stream.data
    stream = dataclasses.replace(
        stream, chunks=list(data.split([c.shape[0] for c in stream.chunks]))
    )
    n = data.shape[0]
    for reducer in (one_pass, merged):
        r = reducer(lambda: Quantiles(QS, exact=False, k=k), stream)
        assert isinstance(r, Quantiles)
        error = rank_distance(data, r.result(), QS)
        assert error <= r.rank_error_bound <= quantile_rank_bound(n, k)
        assert quantile_rank_bound(n, k) <= a_priori(n, k)
        assert r.retained < max_retained(n, k)
        again = reloaded(lambda: Quantiles(QS, exact=False, k=k), r)
        assert torch.equal(again.result(), r.result())


def test_sketch_small_stream_is_exact_order_statistic() -> None:
    r = Quantiles([0.0, 0.5, 1.0], exact=False, k=64)
    r.update(torch.tensor([5.0, 1.0, 3.0, 2.0, 4.0]))
    assert r.rank_error_bound == 0
    assert r.result().tolist() == [1.0, 3.0, 5.0]


def test_quantile_shapes() -> None:
    x = torch.randn(10, 2, 3)
    assert Quantiles(0.5).fresh().__class__ is Quantiles
    for exact in (True, False):
        r = Quantiles(0.5, exact=exact)
        r.update(x)
        assert r.result().shape == (2, 3)
        r = Quantiles([0.1, 0.9], exact=exact)
        r.update(x)
        assert r.result().shape == (2, 2, 3)
        r = Quantiles([0.1, 0.9], per_feature=False, exact=exact)
        r.update(x)
        assert r.result().shape == (2,)
        assert r.count == 10


# ------------------------------------------------------------ protocol & API
def all_reducers() -> list[Reducer]:
    return [
        Keep(),
        Fold(torch.add),
        Sum(),
        Max(),
        Min(),
        RecordMean(),
        Count(),
        Moments(),
        Covariance(),
        SharedCovariance(2),
        PerClass(Moments),
        MinMax(),
        Gram(),
        FeatureMapGram(),
        Quantiles(0.5),
        Quantiles(0.5, exact=False),
        Concat(),
    ]


@pytest.mark.parametrize("reducer", all_reducers(), ids=repr)
def test_protocol_fresh_and_empty_state(reducer: Reducer) -> None:
    assert isinstance(reducer, Reducer)
    x = torch.rand(4, 3, 2)
    reducer.update(x, torch.tensor([0, 1, 1, 0]))
    empty = reducer.fresh()
    assert type(empty) is type(reducer)
    assert empty.count == 0
    assert reducer.count in {1, 4}
    before = reducer.state()
    reducer.merge(empty)  # merging an empty reducer changes nothing
    after = reducer.state()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[key], after[key]) for key in before)
    again = reducer.fresh()
    again.load_state(empty.state())  # an empty state loads
    assert again.count == 0
    assert all(isinstance(v, torch.Tensor) for v in reducer.state().values())


@pytest.mark.parametrize(
    "reducer",
    [r for r in all_reducers() if not isinstance(r, (Keep, Fold, PerClass))],
    ids=repr,
)
def test_empty_result_raises(reducer: Reducer) -> None:
    if isinstance(reducer, Count):
        assert reducer.result() == CountResult(0, 0)
        return
    with pytest.raises(ValueError, match="no"):
        reducer.result()


def test_empty_fold_and_keep() -> None:
    assert Keep().result() == []
    with pytest.raises(ValueError, match="no record"):
        Sum().result()
    assert PerClass(Moments).result() == {}


def test_empty_batches_are_ignored() -> None:
    r = Moments()
    r.update(torch.zeros(0, 3))
    r.update(torch.ones(2, 3))
    r.update(torch.zeros(0, 3))
    assert r.count == 2
    assert r.result().mean.tolist() == [1.0, 1.0, 1.0]


def test_make_reducer() -> None:
    expected = {
        "all": Keep,
        "keep": Keep,
        "sum": Sum,
        "mean": RecordMean,
        "max": Max,
        "min": Min,
    }
    assert set(expected) == set(REDUCTION_NAMES)
    for name, cls in expected.items():
        assert type(make_reducer(name)) is cls
    fold = make_reducer(torch.maximum)
    assert isinstance(fold, Fold)
    assert fold.name == "maximum"
    moments = Moments()
    assert make_reducer(moments) is moments


def test_make_reducer_errors() -> None:
    with pytest.raises(ValueError, match="unknown reduction 'median'") as info:
        make_reducer("median")
    for name in REDUCTION_NAMES:
        assert repr(name) in str(info.value)
    with pytest.raises(ValueError, match="valid names"):
        make_reducer("Sum")
    with pytest.raises(TypeError, match="pass an instance"):
        make_reducer(Moments)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="make_reducer needs"):
        make_reducer(3)  # type: ignore[arg-type]


def test_merge_checks_kind_and_config() -> None:
    with pytest.raises(TypeError, match="cannot merge a Sum into a Moments"):
        Moments().merge(Sum())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="different configurations"):
        Quantiles(0.5, k=64).merge(Quantiles(0.5, k=128))
    with pytest.raises(ValueError, match="different configurations"):
        FeatureMapGram(1).merge(FeatureMapGram(2))
    a, b = Moments(), Moments()
    a.update(torch.ones(2, 3))
    b.update(torch.ones(2, 4))
    with pytest.raises(ValueError, match="per-sample shape"):
        a.merge(b)


def test_record_checks() -> None:
    r = Moments()
    r.update(torch.ones(2, 3))
    with pytest.raises(ValueError, match="same per-sample shape"):
        r.update(torch.ones(2, 4))
    with pytest.raises(ValueError, match="batch dimension"):
        r.update(torch.tensor(1.0))
    with pytest.raises(TypeError, match="reduces tensors"):
        r.update([1.0, 2.0])
    with pytest.raises(ValueError, match=r"\[B, C, \.\.\.\]"):
        FeatureMapGram().update(torch.ones(3))
    with pytest.raises(ValueError, match="power"):
        FeatureMapGram(0)
    with pytest.raises(ValueError, match="even"):
        Quantiles(0.5, k=7)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Quantiles(1.5)


def test_per_class_label_checks() -> None:
    r = PerClass(Moments, num_classes=2)
    x = torch.ones(3, 2)
    with pytest.raises(ValueError, match="needs per-sample class labels"):
        r.update(x)
    with pytest.raises(TypeError, match="integers"):
        r.update(x, torch.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        r.update(x, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        r.update(x, torch.tensor([0, 1, 2]))
    assert r.count == 0  # a rejected batch feeds no class
    with pytest.raises(ValueError, match="needs per-sample class labels"):
        SharedCovariance().update(x)


def test_per_class_state_and_reducers() -> None:
    r = PerClass(lambda: PerClass(Count))  # nested: keys "a/b/..."
    r.update(torch.ones(4, 1), torch.tensor([3, 1, 3, 3]))
    state = r.state()
    assert set(state) == {"1/1/records", "1/1/samples", "3/3/records", "3/3/samples"}
    again = PerClass(lambda: PerClass(Count))
    again.load_state(state)
    assert again.result() == {
        1: {1: CountResult(1, 1)},
        3: {3: CountResult(1, 3)},
    }
    assert list(again.reducers) == [1, 3]


def test_shared_covariance_merges_different_table_sizes() -> None:
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(30, 2, generator=gen, dtype=F64)
    y = torch.cat([torch.zeros(10), torch.ones(10), torch.full((10,), 4)]).long()
    a, b = SharedCovariance(), SharedCovariance()
    a.update(x[:20], y[:20])  # classes 0, 1
    b.update(x[20:], y[20:])  # class 4 only
    a.merge(b)
    res = a.result()
    assert res.class_counts.tolist() == [10, 10, 0, 0, 10]
    centred = x - torch.stack([x[y == c].mean(0) for c in y.tolist()])
    torch.testing.assert_close(res.cov, centred.T @ centred / 30)
    torch.testing.assert_close(res.cov_unbiased, centred.T @ centred / 27)


def test_update_never_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No host sync in update: the tensor-to-Python conversions all raise."""
    reducers = [
        r
        for r in all_reducers()
        if not isinstance(r, (PerClass, Concat))  # documented exceptions
        and not (isinstance(r, SharedCovariance) and r.num_classes is None)
    ]
    batches = [torch.rand(5, 3, 2) for _ in range(4)]
    target = torch.tensor([0, 1, 1, 0, 1])

    def sync(*args: object, **kwargs: object) -> None:
        msg = "host sync in update"
        raise AssertionError(msg)

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    # The class-label check reads the labels, on the CPU only (it is skipped
    # on accelerators: test_label_check_is_skipped_off_the_cpu); these CPU
    # tensors stand in for accelerator ones, so take it out here.
    monkeypatch.setattr(per_class_module, "check_class_labels", lambda *_: None)
    for r in reducers:
        for batch in batches:
            r.update(batch, target)
        other = r.fresh()  # merging: no sync either
        other.update(batches[0], target)
        r.merge(other)
    monkeypatch.undo()
    assert all(r.count in {5, 25} for r in reducers)


def test_sync_check_catches_a_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: the documented sync is caught."""

    def sync(*args: object, **kwargs: object) -> None:
        msg = "host sync in update"
        raise AssertionError(msg)

    monkeypatch.setattr(torch.Tensor, "__int__", sync)
    with pytest.raises(AssertionError, match="host sync"):
        SharedCovariance().update(torch.rand(2, 3), torch.tensor([0, 1]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_update_never_syncs() -> None:
    device = torch.device("cuda")
    reducers = [
        r
        for r in all_reducers()
        if not isinstance(r, (PerClass, Concat, Keep))
        and not (isinstance(r, SharedCovariance) and r.num_classes is None)
    ]
    batches = [torch.rand(5, 3, 2, device=device) for _ in range(4)]
    target = torch.tensor([0, 1, 1, 0, 1], device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for r in reducers:
            for batch in batches:
                r.update(batch, target)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    mean = next(r for r in reducers if isinstance(r, Moments)).result().mean
    assert mean.device.type == "cuda"
    torch.testing.assert_close(mean, torch.cat(batches).double().mean(0))


# ------------------------------------------------------------- class labels
LABEL_REDUCERS = {
    "PerClass": lambda n: PerClass(Moments, num_classes=n),
    "SharedCovariance": lambda n: SharedCovariance(num_classes=n),
}


@pytest.mark.parametrize("name", list(LABEL_REDUCERS))
@pytest.mark.parametrize("bad", [7, 5, -1])
def test_labels_outside_the_range_name_reducer_value_range_and_fix(name, bad) -> None:
    """Every per-class reducer refuses a label outside [0, num_classes)."""
    r = LABEL_REDUCERS[name](5)
    msg = (
        f"{name}: class label {bad} is outside [0, 5). Labels must be class "
        "indices in [0, num_classes): drop those samples, or pass a num_classes "
        "that covers every class."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        r.update(torch.ones(3, 2), torch.tensor([0, bad, 1]))
    assert r.count == 0  # nothing was fed
    r.update(torch.ones(3, 2), torch.tensor([0, 4, 1]))
    assert r.count == 3


@pytest.mark.parametrize("name", list(LABEL_REDUCERS))
def test_negative_labels_without_num_classes_are_refused(name) -> None:
    """Without ``num_classes`` a negative label is refused by every reducer."""
    r = LABEL_REDUCERS[name](None)
    msg = (
        f"{name}: class label -1 is negative. Labels must be class indices >= 0: "
        "drop those samples (e.g. an ignore index such as -1), or map them to a "
        "class of their own."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        r.update(torch.ones(3, 2), torch.tensor([0, -1, 1]))
    assert r.count == 0


def test_label_check_is_skipped_off_the_cpu() -> None:
    """With ``num_classes`` on a non-CPU device (meta here) update reads no label."""
    r = SharedCovariance(num_classes=3)
    x = torch.randn(5, 2, device="meta")
    r.update(x, torch.tensor([0, 1, 7, 0, 1], device="meta"))  # no data to read
    assert r.state()["class_counts"].device.type == "meta"
