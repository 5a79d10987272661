"""The protocol's data rules, the same for every detector of the catalogue.

One rule each, checked over the whole catalogue
(:func:`scio_recorder.ood.benchmark.catalogue`) on a small CNN:

* a fit refuses non-finite features with their count and the layer;
* a scored row with a NaN or an infinity scores NaN, and the other rows
  score as without it (a hypothesis test over which rows and which value);
* an empty batch scores an empty ``[0]`` tensor;
* fit labels are class indices of the net, checked the same way;
* a bfloat16 net fits and scores;
* data given as a tensor (not an iterable of batches) is refused, naming
  the argument and the fix;
* several threads scoring with one fitted detector each get the scores of
  their own inputs, and the recorder's selection and latest records are
  left as they were.
"""

from __future__ import annotations

import re
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scio_recorder import Recorder
from scio_recorder.models import digits_cnn
from scio_recorder.ood import (
    KNN,
    NAC,
    RMDS,
    Gram,
    Mahalanobis,
    ReAct,
    ViM,
    evaluate,
    fit_detectors,
    score_sets,
)
from scio_recorder.ood._edits import remove_rank1
from scio_recorder.ood._evaluate import score_batches
from scio_recorder.ood.benchmark import catalogue

N_FIT = 96


def trained_like(dtype: torch.dtype = torch.float32):
    """digits_cnn(3) whose logits are standardised: it predicts every class."""
    torch.manual_seed(0)
    net = digits_cnn(3).eval()
    x = torch.rand(N_FIT, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fc = net.classifier[3]
        logits = net(x)
        std = logits.std(0)
        fc.weight /= std[:, None]
        fc.bias.sub_(logits.mean(0)).div_(std)
        y = net(x).argmax(1)
    assert (y.bincount(minlength=3) > 0).all()  # SHE: a sample of each class
    # One label in four wrong, as for a trained net (TempScale's T > 0).
    y = torch.where(torch.arange(N_FIT) % 4 == 0, (y + 1) % 3, y)
    net = net.to(dtype)
    rnet = Recorder(net, input_data=torch.zeros(1, 1, 8, 8, dtype=dtype))
    x = x.to(dtype)
    return rnet, [(x[:48], y[:48]), (x[48:], y[48:])]


_CATALOGUE = catalogue(trained_like()[0])
NAMES = list(_CATALOGUE)
FITTED_NAMES = [n for n, d in _CATALOGUE.items() if d.needs_fit]
LABELLED_NAMES = [n for n, d in _CATALOGUE.items() if d.needs_target]
# NaN for every other fitted detector, infinity for the others.
BAD_VALUES = [float("nan"), float("inf"), float("-inf")]


@pytest.fixture(scope="module")
def model():
    """The recorder and the fit batches (detectors made fresh per test)."""
    return trained_like()


@pytest.fixture(scope="module")
def fitted(model):
    rnet, train = model
    detectors = catalogue(rnet)
    fit_detectors(detectors, train, target=1)
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    clean = {name: d(x) for name, d in detectors.items()}
    return detectors, x, clean


def first_layer_read(detector):
    """The (label, kind) a fit of ``detector`` reads first (the net's output)."""
    read = detector.layers_read()
    if read:
        return read[0]
    return next(label for label in detector.rnet.table if label[0] == 0), "output"


# ------------------------------------------------------------- fit: refused
@pytest.mark.parametrize(
    ("name", "bad"),
    [(n, BAD_VALUES[i % 3]) for i, n in enumerate(FITTED_NAMES)],
)
def test_every_fit_refuses_non_finite_features_naming_count_and_layer(model, name, bad):
    rnet, train = model
    x, y = train[1]
    x = x.clone()
    x[[3, 40], 0, 4, 4] = bad
    detector = catalogue(rnet)[name]
    label, kind = first_layer_read(detector)
    layer = re.escape(f"{rnet.table[label].describe()} ({kind})")
    cls = type(detector).__name__  # Mahalanobis++ is a Mahalanobis
    pattern = (
        rf"^{cls}: 2 of the {N_FIT} fit samples have non-finite features "
        rf"\(NaN or Inf\) at layer {layer}, so the fitted state would be NaN\."
    )
    with pytest.raises(ValueError, match=pattern):
        detector.fit([train[0], (x, y)], target=1)
    assert not detector.fitted


def test_fit_detectors_refuses_non_finite_features_naming_the_readers(model):
    rnet, train = model
    x, y = train[0]
    x = x.clone()
    x[7] = float("nan")
    detectors = catalogue(rnet)
    # The first key of the shared pass with a bad sample: the net's output,
    # kept by the detectors that read the logits of the fit data (IsoMax,
    # JTLA, KLMatching, TempScale; ViM, NAC, AdaScale and Odds fit on their
    # own).
    root = next(label for label in rnet.table if label[0] == 0)
    readers = sorted(
        name
        for name, d in detectors.items()
        if d.needs_fit and not d.own_fit and root in d.fit_keep()
    )
    assert readers == ["IsoMax", "JTLA", "KLMatching", "TempScale"]
    with pytest.raises(
        ValueError,
        match=rf"^{', '.join(readers)}: 1 of the 96 fit samples have non-finite "
        r"features \(NaN or Inf\) at layer 0-1 \(Sequential \(the whole net\)\) ",
    ):
        fit_detectors(detectors, [(x, y), train[1]], target=1)
    assert not any(d.fitted for d in detectors.values() if d.needs_fit)


def test_rmds_names_the_count_of_fit_samples(model):
    # It printed `<built-in method count of tuple object ...>` (its result
    # is a tuple, whose `count` is a method).
    rnet, train = trained_like()
    x, y = train[0]
    x = x.clone()
    x[0] = float("inf")
    with pytest.raises(
        ValueError, match=r"^RMDS: 1 of the 48 fit samples have non-finite features"
    ):
        RMDS(rnet).fit([(x, y)], target=1)


# ---------------------------------------------------------- scoring: NaN rows
@settings(max_examples=12, deadline=None)
@given(
    rows=st.sets(st.integers(0, 4), min_size=1),
    value=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    where=st.tuples(st.integers(0, 7), st.integers(0, 7)),
)
def test_a_non_finite_row_scores_nan_and_leaves_the_others(fitted, rows, value, where):
    """Every detector, alone and in the shared passes of ``score_batches``."""
    detectors, x, clean = fitted
    bad = sorted(rows)
    good = [i for i in range(len(x)) if i not in rows]
    hostile = x.clone()
    hostile[bad, 0, where[0], where[1]] = value
    shared = score_batches(detectors, [hostile], input=None)
    for name, detector in detectors.items():
        for scores in (detector(hostile), shared[name]):
            assert scores.shape == (len(x),), name
            assert torch.isnan(scores[bad]).all(), name
            # The others: the scores of the clean batch (the same pass of
            # the net), up to the float rounding of a computation over fewer
            # rows (a matrix product blocked otherwise). KNN's distances
            # come from ||a||^2 + ||b||^2 - 2 a.b of unit float32 vectors:
            # ~5e-7 absolute on d^2, ~1e-5 on d ~ 0.02, 5e-4 of the largest
            # score; ViM's residual norms on this untrained net are at
            # float64 rounding, times alpha ~ 1e14. A bad row harming its
            # neighbours gives NaN or an error, far outside 1e-3.
            scale = float(clean[name].double().abs().max())
            torch.testing.assert_close(
                scores[good].double(),
                clean[name][good].double(),
                rtol=0,
                atol=1e-3 * scale,
                msg=name,
            )


def test_rankfeat_scores_a_batch_holding_a_nan_row(fitted):
    # linalg.svd raised LinAlgError for the whole batch.
    detectors, x, clean = fitted
    hostile = x.clone()
    hostile[2] = float("nan")
    scores = detectors["RankFeat"](hostile)
    assert torch.isnan(scores[2])
    assert torch.equal(scores[[0, 1, 3, 4]], clean["RankFeat"][[0, 1, 3, 4]])


def test_nac_scores_a_nan_input_nan(model):
    # NAC gave a NaN input -0.0: a NaN state falls in no bin of OpenOOD's.
    rnet, train = model
    nac = NAC(rnet, ["features.3", "classifier.2"]).fit(train)
    x = torch.rand(3, 1, 8, 8)
    x[1, 0, 0, 0] = float("nan")
    assert torch.isnan(nac(x)[1])
    scores = nac.score_inputs((x,), {})  # its own computation, too
    assert torch.isnan(scores[1])
    assert torch.isfinite(scores[[0, 2]]).all()


# ----------------------------------------------------------- empty batches
@pytest.mark.parametrize("name", NAMES)
def test_every_detector_scores_an_empty_batch_as_an_empty_tensor(fitted, name):
    detectors, x, _ = fitted
    scores = detectors[name](x[:0])
    assert scores.shape == (0,)
    assert scores.is_floating_point()


def test_evaluate_skips_empty_batches(fitted):
    detectors, x, clean = fitted
    scores = score_batches(detectors, [x[:0], x, x[:0]], input=None)
    for name in detectors:
        assert torch.equal(scores[name], clean[name]), name
    labelled = [(x[:0], torch.zeros(0, dtype=torch.int64)), (x, torch.arange(5) % 3)]
    result = evaluate(
        {"MSP": detectors["MSP"]}, labelled, [(x[:0],), (2 * x,)], input=0, target=1
    )
    assert result.id_scores["MSP"].shape == (5,)


# ------------------------------------------------------------------ labels
@pytest.mark.parametrize("name", LABELLED_NAMES)
def test_every_labelled_fit_checks_labels_against_the_classes(model, name):
    rnet, train = model
    x, y = train[1]
    y = y.clone()
    y[5] = 3  # the net has 3 classes
    detector = catalogue(rnet)[name]
    cls = type(detector).__name__  # Mahalanobis++ is a Mahalanobis
    hint = (
        ", or pass `num_classes=` covering every class" if cls == "Mahalanobis" else ""
    )
    msg = (
        f"{cls}.fit: class label 3 in batch 1 of the fit data is outside [0, 3) "
        "(the 3 classes of the net); labels must be class indices: drop those "
        f"samples, or fix `target=`{hint}."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        detector.fit([train[0], (x, y)], target=1)
    y[5] = -1
    with pytest.raises(ValueError, match=r"class label -1 in batch 1 .* outside"):
        detector.fit([train[0], (x, y)], target=1)


def test_fit_detectors_checks_labels_once_for_every_labelled_detector(model):
    rnet, train = model
    x, y = train[0]
    detectors = catalogue(rnet)
    shared = [n for n in LABELLED_NAMES if not detectors[n].own_fit]
    names = ", ".join(sorted({type(detectors[n]).__name__ for n in shared}))
    # Odds fits on its own (its own passes); the shared pass is checked first.
    with pytest.raises(
        ValueError, match=f"^{re.escape(names)}.fit: class label 3 in batch 0"
    ):
        fit_detectors(detectors, [(x, y + 1), train[1]], target=1)


# ---------------------------------------------------------------- bfloat16
def test_every_detector_fits_and_scores_a_bfloat16_net():
    rnet, train = trained_like(torch.bfloat16)
    detectors = catalogue(rnet)
    for name, detector in detectors.items():
        detector.fit(train, target=1)
        # not fit samples: at one, Trust is infinite (distance 0 to its class)
        scores = detector(train[0][0][:4] + 0.5)
        assert scores.shape == (4,), name
        assert torch.isfinite(scores.double()).all(), name


def test_remove_rank1_computes_its_svd_in_float32_for_half_maps():
    # linalg.svd has no bfloat16 kernel: RankFeat failed on a bfloat16 net.
    x = torch.randn(3, 4, 5, 6)
    for dtype in (torch.bfloat16, torch.float16):
        got = remove_rank1(x.to(dtype))
        assert got.dtype == dtype
        want = remove_rank1(x.to(dtype).float()).to(dtype)
        assert torch.equal(got, want)


# -------------------------------------------------- data given as a tensor
def test_a_tensor_given_for_batches_is_refused_naming_the_fix(model):
    rnet, train = model
    x = train[0][0]
    fix = (
        "is a tensor of shape [48, 1, 8, 8], not an iterable of batches: "
        "iterating it would give its 48 rows, each as a batch without the batch "
        "dimension. Pass a list of batches, e.g. `[x]` for this one batch "
        "(`[(x, y)]` with labels), or a DataLoader."
    )
    detectors = {"MSP": catalogue(rnet)["MSP"]}
    calls = {
        "evaluate: `id_batches` ": lambda: evaluate(detectors, x, [x], input=None),
        "evaluate: `ood_batches` ": lambda: evaluate(detectors, [x], x, input=None),
        "evaluate: `ood_batches['far']` ": lambda: evaluate(
            detectors, [x], {"far": x}, input=None
        ),
        "score_sets: `sets['test']` ": lambda: score_sets(
            detectors, {"test": x}, input=None
        ),
        "score_batches: `batches` ": lambda: score_batches(detectors, x, input=None),
        "KNN.fit: `batches` ": lambda: KNN(rnet).fit(x, input=None),
        "ViM.fit: `batches` ": lambda: ViM(rnet, d=2).fit(x, input=None),
        "Gram.fit: `batches` ": lambda: Gram(rnet, ["features.3"]).fit(x, target=1),
        "NAC.fit: `batches` ": lambda: NAC(rnet, ["features.3"]).fit(x, input=None),
        "fit_detectors: `batches` ": lambda: fit_detectors(
            [Mahalanobis(rnet)], x, target=1
        ),
    }
    for start, call in calls.items():
        with pytest.raises(TypeError, match=f"^{re.escape(start + fix)}$"):
            call()


def test_a_mapping_given_for_batches_is_refused(model):
    rnet, _ = model
    with pytest.raises(
        TypeError,
        match=r"^KNN\.fit: `batches` is a dict \(a mapping\), not an iterable of "
        r"batches: iterating it would give its keys \['x'\]\. Pass a list",
    ):
        KNN(rnet).fit({"x": torch.zeros(4, 1, 8, 8)}, input="x")


# ---------------------------------------------------------- layer messages
def test_a_layer_typo_reads_as_one_sentence(model):
    rnet, _ = model
    msg = (
        "ReAct: layer 'classifier.9' is not a layer of this net: No module named "
        "`classifier.9` is called in the reference pass. Did you mean "
        "`classifier.3`, `classifier.2`, `classifier.1`? `print(rnet.table)` lists "
        "the qualified names."
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        ReAct(rnet, layer="classifier.9")
    with pytest.raises(ValueError, match=r"not found: \{\(9, 9\)\}\.$"):
        KNN(rnet, layer=(9, 9))


# ------------------------------------------------------- one pass for all fits
class CountingLoader:
    """An iterable of batches that counts how often it is read."""

    def __init__(self, batches):
        self.batches, self.iterations, self.reads = batches, 0, 0

    def __iter__(self):
        self.iterations += 1
        for batch in self.batches:
            self.reads += 1
            yield batch


STATISTICS_FITS = [
    "TempScale",
    "KLMatching",
    "DICE",
    "SHE",
    "NNGuide",
    "RMDS",
    "fDBD",
    "NCI",
    "NECO",
    "Residual",
    "VRA",
    "Gram",
    "MahalanobisEnsemble",
    "Mahalanobis",
    "KNN",
]


def test_fit_detectors_reads_the_data_once_for_every_fit_by_statistics(model):
    rnet, train = model
    six = [(x[i : i + 16], y[i : i + 16]) for x, y in train for i in (0, 16, 32)]
    catalogued = catalogue(rnet)
    detectors = {name: catalogued[name] for name in STATISTICS_FITS}
    loader = CountingLoader(six)
    fit_detectors(detectors, loader, target=1)
    assert (loader.iterations, loader.reads) == (1, 6)  # was 3 and 18 (Gram: 2)
    assert all(d.fitted for d in detectors.values())
    # The same states as each fitted alone.
    x = train[0][0][:5]
    for name in STATISTICS_FITS:
        alone = catalogue(rnet)[name].fit(six, target=1)
        torch.testing.assert_close(alone(x), detectors[name](x), rtol=0, atol=0)


def test_evaluate_refuses_nan_scores_naming_the_detector_and_the_set(fitted):
    detectors, x, _ = fitted
    hostile = x.clone()
    hostile[[1, 3]] = float("inf")
    msg = (
        "evaluate: 'MSP' scored 2 of the 5 samples of the OoD set 'far' NaN: "
        "those samples hold a NaN or an infinity"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        evaluate({"MSP": detectors["MSP"]}, [x], {"far": [hostile]}, input=None)
    with pytest.raises(ValueError, match=r"samples of the in-distribution data NaN"):
        evaluate({"MSP": detectors["MSP"]}, [hostile], [x], input=None)


# ------------------------------------------------------------- threads
def scores_in_threads(score, inputs, repeats):
    """Each input scored ``repeats`` times, one thread per input, all at once."""
    barrier = threading.Barrier(len(inputs))
    found = [[] for _ in inputs]
    errors = []

    def work(i):
        barrier.wait()
        try:
            for _ in range(repeats):
                found[i].append(score(inputs[i]))
        except Exception as error:  # noqa: BLE001 (reported by the test)
            errors.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found, errors


def check_threads(score, repeats=20):
    """Four threads of other batch sizes: each gets its own scores, bit for bit.

    The oracle is the same call made alone: the same float32 tensors on the
    same path (torch on the tests' one thread), so the scores are equal.
    """
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.rand(4 + i, 1, 8, 8, generator=gen) for i in range(4)]
    alone = [score(x) for x in inputs]
    found, errors = scores_in_threads(score, inputs, repeats)
    assert errors == []
    for i, scores in enumerate(found):
        for got in scores:
            assert torch.equal(got, alone[i])


@pytest.mark.parametrize(
    "name",
    [
        "KNN",  # one shared pass
        pytest.param("ReAct", marks=pytest.mark.slow),  # an edit
        pytest.param("RankFeat", marks=pytest.mark.slow),  # edits at two blocks
        pytest.param("JTLA", marks=pytest.mark.slow),  # several layers
        pytest.param("ODIN", marks=pytest.mark.slow),  # a gradient of the input
        pytest.param("NAC", marks=pytest.mark.slow),  # a backward
        pytest.param("AdaScale", marks=pytest.mark.slow),  # both, then an edit
    ],
)
def test_threads_scoring_one_detector_each_get_their_own_scores(fitted, name):
    # Passes changed the recorder's selection and read its latest records:
    # a thread got another's scores, or a CallPlanError.
    check_threads(fitted[0][name])


@pytest.mark.slow
def test_threads_scoring_every_detector_each_get_their_own_scores(fitted):
    detectors = fitted[0]
    failed = []
    for name, detector in detectors.items():
        gen = torch.Generator().manual_seed(3)
        inputs = [torch.rand(4 + i, 1, 8, 8, generator=gen) for i in range(4)]
        alone = [detector(x) for x in inputs]
        found, errors = scores_in_threads(detector, inputs, 5)
        if errors or any(
            not torch.equal(got, alone[i]) for i, s in enumerate(found) for got in s
        ):
            failed.append(name)
    assert failed == []
    # the shared passes of several detectors, as evaluate runs them
    check_threads(
        lambda x: torch.stack(list(score_batches(detectors, [x], input=None).values())),
        repeats=3,
    )


def test_scoring_leaves_the_selection_and_the_latest_records(fitted):
    detectors, x, _ = fitted
    rnet = detectors["KNN"].rnet
    rnet.record("features.0", inputs="classifier.3")
    try:
        out = rnet(x)
        latest = rnet.activations[(2, 1)]
        for name in ("KNN", "ReAct", "ODIN"):
            detectors[name](x[:2])
        assert rnet.selection.outputs == ((2, 1),)
        assert rnet.selection.inputs == ((2, 12),)
        assert list(rnet.activations) == [(2, 1)]
        assert rnet.activations[(2, 1)] is latest
        assert torch.equal(rnet(x), out)
    finally:
        rnet.record()
