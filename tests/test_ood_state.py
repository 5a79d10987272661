"""Saved detector states, fit data and labels, scoring inputs: checked, named.

A state saved on one net and loaded on another, a state file missing an
entry, holding an extra one, a corrupt config or a wrong dtype; non-finite
fit features; bad class labels; scoring inputs of another feature size:
each is refused with a message naming the file or the layer, what was
expected and what was found.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.io import load_records, save_records
from scio_recorder.ood import KNN, Mahalanobis, ReAct, ViM, fit_detectors

MAKERS = {
    "Mahalanobis": Mahalanobis,
    "KNN": lambda rnet: KNN(rnet, k=2),
    "ViM": lambda rnet: ViM(rnet, d=2),
    "ReAct": lambda rnet: ReAct(rnet, layer="1"),
}
# The layer each reads (1-2: the ReLU's output; 1-3: the last Linear's input).
LAYERS = {
    "Mahalanobis": r"1-3 \(Linear `2`\) has the input",
    "KNN": r"1-3 \(Linear `2`\) has the input",
    "ViM": r"1-3 \(Linear `2`\) has the input",
    "ReAct": r"1-2 \(ReLU `1`\) has the output",
}


def recorder(width: int) -> Recorder:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3))
    return Recorder(net.eval(), input_size=(1, 4))


def train() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 4, generator=gen), torch.arange(32) % 3)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each detector fitted on the 8-unit net, saved; its file and state."""
    folder = tmp_path_factory.mktemp("states")
    rnet = recorder(8)
    out = {}
    for name, make in MAKERS.items():
        detector = make(rnet).fit(train(), target=1)
        out[name] = (detector.save(folder / f"{name}.safetensors"), detector)
    return out


def rewrite(path, tmp_path, *, state=None, meta=None):
    """Write a copy of a detector file with its state or metadata changed."""
    records = load_records(path)
    tensors = dict(records) if state is None else state
    extra = {k: v for k, v in records.metadata.items() if k.startswith("ood.")}
    extra.update(meta or {})
    extra = {k: v for k, v in extra.items() if v is not None}
    return save_records(tmp_path / "edited.safetensors", tensors, extra_metadata=extra)


# ------------------------------------------------------------ another net
@pytest.mark.parametrize("name", MAKERS)
def test_a_state_loaded_on_another_net_names_file_layer_and_shapes(saved, name):
    path, _ = saved[name]
    pattern = (
        rf"^'{re.escape(str(path))}' holds a {name} state fitted on layer "
        rf"1-\d whose (in|out)put was \[8\] per sample, but in this net layer "
        rf"{LAYERS[name]} \[16\]: the state does not fit this net\. Load it into "
        "a detector on the net it was fitted on"
    )
    with pytest.raises(ValueError, match=pattern):
        MAKERS[name](recorder(16)).load(path)


@pytest.mark.parametrize(
    ("name", "entry", "saved_shape", "wanted"),
    [
        ("IsoMax", "prototypes", [3, 3], "[classes, 5]"),
        ("Odds", "counts", [3], "[5]"),
        ("KLMatching", "typical", [3, 3], "[classes, 5]"),
    ],
)
def test_a_state_of_another_number_of_logits_is_refused_at_load(
    name, entry, saved_shape, wanted, tmp_path
):
    # IsoMax and Odds loaded it; the error came only at scoring.
    from scio_recorder import ood  # noqa: PLC0415 (this test only)

    options = {
        "IsoMax": {"steps": 5},
        "Odds": {"epsilon": 0.1, "noise_samples": 4},
        "KLMatching": {},
    }[name]
    make = getattr(ood, name)
    path = make(recorder(8), **options).fit(train(), target=1).save(tmp_path / "s")
    torch.manual_seed(0)
    five = Recorder(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5)), input_size=(1, 4)
    )
    message = (
        f"'{path}': entry {entry!r} of the {name} state has shape {saved_shape}, "
        f"but on this net (5 logits) it must be {wanted}: the state was saved "
        "from another net or layer. Load it into a detector on the net it was "
        "fitted on, or fit this one again."
    )
    detector = make(five, **options)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        detector.load(path)
    assert not detector.fitted


@pytest.mark.parametrize("name", ["Mahalanobis", "KNN", "ViM"])
def test_each_entry_shape_is_checked_against_the_layer(saved, name, tmp_path):
    # A file without the layers' shapes (as saved before they were stored):
    # the entries themselves are checked against the recorder's layer.
    path, _ = saved[name]
    edited = rewrite(path, tmp_path, meta={"ood.layers": None})
    pattern = (
        rf"^'{re.escape(str(edited))}': entry '\w+' of the {name} state has "
        r"shape \[[^\]]*8[^\]]*\], but on layer 1-3 \(Linear `2`\) \(input\) it "
        r"must be \[[^\]]*16[^\]]*\]: the state was saved from another net"
    )
    with pytest.raises(ValueError, match=pattern):
        MAKERS[name](recorder(16)).load(edited)


def test_named_sizes_must_agree_between_entries(saved, tmp_path):
    path, detector = saved["Mahalanobis"]
    state = {**detector.state(), "classes": torch.arange(2)}  # 2 classes, 3 means
    edited = rewrite(path, tmp_path, state=state)
    with pytest.raises(
        ValueError,
        match=r"entry 'means' of the Mahalanobis state has shape \[3, 8\] "
        r"\(classes: 3\), but entry 'classes' has classes: 2",
    ):
        Mahalanobis(recorder(8)).load(edited)


# ------------------------------------------------------------ damaged files
@pytest.mark.parametrize("name", MAKERS)
def test_a_missing_entry_is_named(saved, name, tmp_path):
    path, detector = saved[name]
    state = detector.state()
    gone = min(state)
    edited = rewrite(
        path, tmp_path, state={k: v for k, v in state.items() if k != gone}
    )
    pattern = (
        rf"^'{re.escape(str(edited))}' holds an incomplete {name} state: entry "
        rf"'{gone}' is missing .*save the fitted detector again\.$"
    )
    with pytest.raises(ValueError, match=pattern):
        MAKERS[name](recorder(8)).load(edited)


@pytest.mark.parametrize("name", MAKERS)
def test_an_unexpected_entry_is_named(saved, name, tmp_path):
    path, detector = saved[name]
    edited = rewrite(path, tmp_path, state={**detector.state(), "bogus": torch.ones(2)})
    pattern = (
        rf"^'{re.escape(str(edited))}' holds unexpected entries 'bogus' besides "
        rf"the {name} state"
    )
    with pytest.raises(ValueError, match=pattern):
        MAKERS[name](recorder(8)).load(edited)


@pytest.mark.parametrize("name", MAKERS)
@pytest.mark.parametrize("key", ["ood.config", "ood.layers"])
def test_corrupt_metadata_json_is_named(saved, name, key, tmp_path):
    path, _ = saved[name]
    edited = rewrite(path, tmp_path, meta={key: '{"layer": [1, '})
    pattern = (
        rf"^'{re.escape(str(edited))}': its '{key}' metadata entry is not valid "
        "JSON"
    )
    with pytest.raises(ValueError, match=pattern):
        MAKERS[name](recorder(8)).load(edited)
    edited = rewrite(path, tmp_path, meta={key: "[1, 2]"})
    with pytest.raises(ValueError, match=rf"'{key}' metadata entry is a JSON list"):
        MAKERS[name](recorder(8)).load(edited)


def test_a_missing_config_is_named(saved, tmp_path):
    path, _ = saved["KNN"]
    edited = rewrite(path, tmp_path, meta={"ood.config": None})
    with pytest.raises(ValueError, match=r"has no 'ood.config' metadata entry"):
        KNN(recorder(8), k=2).load(edited)


@pytest.mark.parametrize("name", MAKERS)
def test_float_entries_of_another_float_dtype_are_converted(saved, name, tmp_path):
    path, detector = saved[name]
    state = {
        k: v.half() if v.is_floating_point() else v for k, v in detector.state().items()
    }
    edited = rewrite(path, tmp_path, state=state)
    again = MAKERS[name](recorder(8)).load(edited)
    for key, value in again.state().items():
        assert value.dtype == detector.state()[key].dtype, key
    x = train()[0][0][:5]
    # float16 keeps 11 significant bits: the state is off by ~2^-11 relative,
    # and the scores by that times their magnitude (a few units at most here).
    torch.testing.assert_close(
        again(x).double(), detector(x).double(), rtol=4e-3, atol=4e-3
    )


@pytest.mark.parametrize("name", MAKERS)
def test_entries_of_another_dtype_kind_are_refused(saved, name, tmp_path):
    path, detector = saved[name]
    state = detector.state()
    key = next(k for k, v in state.items() if v.is_floating_point())
    edited = rewrite(path, tmp_path, state={**state, key: state[key].to(torch.int32)})
    pattern = (
        rf"^'{re.escape(str(edited))}': entry '{key}' of the {name} state is "
        r"torch.int32 \(integer\), but it must be floating-point \(torch.float\d+\): "
        "refused"
    )
    with pytest.raises(ValueError, match=pattern):
        MAKERS[name](recorder(8)).load(edited)


def test_integer_entries_of_a_float_dtype_are_refused(saved, tmp_path):
    path, detector = saved["Mahalanobis"]
    state = {**detector.state(), "classes": detector.classes.double()}
    edited = rewrite(path, tmp_path, state=state)
    with pytest.raises(
        ValueError,
        match=r"entry 'classes' of the Mahalanobis state is torch.float64 "
        r"\(floating-point\), but it must be integer \(torch.int64\): refused",
    ):
        Mahalanobis(recorder(8)).load(edited)


def test_non_finite_entries_are_refused(saved, tmp_path):
    path, detector = saved["ViM"]
    nan = torch.tensor([float("nan")], dtype=torch.float64)
    state = {**detector.state(), "alpha": nan}
    edited = rewrite(path, tmp_path, state=state)
    with pytest.raises(
        ValueError, match=r"entry 'alpha' of the ViM state holds 1 non-finite values"
    ):
        ViM(recorder(8), d=2).load(edited)


def test_the_state_is_not_changed_by_a_refused_file(saved, tmp_path):
    path, detector = saved["KNN"]
    edited = rewrite(path, tmp_path, state={"bank": detector.bank.int()})
    fresh = KNN(recorder(8), k=2)
    with pytest.raises(ValueError, match="refused"):
        fresh.load(edited)
    assert not fresh.fitted


def test_the_saved_metadata_round_trips(saved):
    path, _ = saved["ReAct"]
    meta = load_records(path).metadata
    assert json.loads(meta["ood.layers"]) == {"1-2 output": [8]}


# ------------------------------------------------------------ fit data
@pytest.mark.parametrize("name", ["Mahalanobis", "KNN", "ViM"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("together", [False, True])
def test_non_finite_fit_features_are_refused_with_their_count(name, bad, together):
    (x, y), rnet = train()[0], recorder(8)
    x = x.clone()
    x[[3, 7], 0] = bad
    detector = MAKERS[name](rnet)
    pattern = (
        rf"^{name}: 2 of the 32 fit samples have non-finite features \(NaN or Inf\) "
        r"at layer 1-3 \(Linear `2`\) \(input\), so the fitted state would be NaN\. "
        "Drop or repair those samples before fitting"
    )

    def fit() -> None:
        if together:
            fit_detectors([detector], [(x, y)], target=1)
        else:
            detector.fit([(x, y)], target=1)

    with pytest.raises(ValueError, match=pattern):
        fit()


# ------------------------------------------------------------ labels
def test_a_huge_label_is_refused_before_anything_grows():
    x, y = train()[0]
    y = y.clone()
    y[5] = 100_000_000
    msg = (
        "Mahalanobis.fit: class label 100000000 in batch 0 of the fit data is "
        "outside [0, 3) (the 3 classes of the net); labels must be class indices"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        Mahalanobis(recorder(8)).fit([(x, y)], target=1)
    with pytest.raises(ValueError, match=re.escape("label 100000000 in batch 1")):
        fit_detectors([Mahalanobis(recorder(8))], [train()[0], (x, y)], target=1)


def test_num_classes_can_be_given_and_is_checked():
    rnet = recorder(8)
    assert Mahalanobis(rnet).num_classes == 3
    with pytest.raises(ValueError, match=r"label 2 in batch 0 .* outside \[0, 2\)"):
        Mahalanobis(rnet, num_classes=2).fit(train(), target=1)
    with pytest.raises(ValueError, match=r"num_classes must be an int >= 2, got 1"):
        Mahalanobis(rnet, num_classes=1)


label_dtypes = st.sampled_from([torch.int64, torch.int32, torch.int16, torch.float32])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(-(2**40), 2**40), min_size=0, max_size=20)
    | st.lists(st.integers(0, 2), min_size=16, max_size=16),
    label_dtypes,
)
def test_labels_are_checked_against_the_batch_and_the_classes(values, dtype):
    rnet = recorder(8)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    if dtype != torch.float32:
        limit = torch.iinfo(dtype)
        values = [min(max(v, limit.min), limit.max) for v in values]
    labels = torch.tensor(values, dtype=dtype)
    detector = Mahalanobis(rnet)
    if dtype == torch.float32:
        with pytest.raises(
            TypeError,
            match=r"^Mahalanobis.fit: the class labels of batch 0 of the fit data "
            r"are torch.float32, not integers: pass integer class indices in "
            r"\[0, 3\)",
        ):
            detector.fit([(x, labels)], target=1)
    elif len(values) != 16:
        with pytest.raises(
            ValueError,
            match=rf"^Mahalanobis.fit: batch 0 of the fit data has 16 samples but "
            rf"labels of shape \[{len(values)}\]: pass one class index per sample",
        ):
            detector.fit([(x, labels)], target=1)
    elif min(values) < 0 or max(values) >= 3:
        bad = min(values) if min(values) < 0 else max(values)
        with pytest.raises(
            ValueError,
            match=rf"^Mahalanobis.fit: class label {bad} in batch 0 of the fit data "
            r"is outside \[0, 3\) \(the 3 classes of the net\)",
        ):
            detector.fit([(x, labels)], target=1)
    elif len(set(values)) < 2:
        with pytest.raises(ValueError, match="needs at least two classes"):
            detector.fit([(x, labels)], target=1)
    else:
        assert detector.fit([(x, labels)], target=1).classes.tolist() == sorted(
            set(values)
        )


# ------------------------------------------------------------ scoring inputs
@pytest.mark.parametrize("name", ["Mahalanobis", "KNN"])
def test_scoring_features_of_another_size_are_refused(name):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2, 3),
    )
    rnet = Recorder(net, input_size=(1, 1, 4, 4))
    make = Mahalanobis if name == "Mahalanobis" else KNN
    detector = make(rnet, layer="1")
    detector.fit([(torch.randn(12, 1, 4, 4), torch.arange(12) % 3)], target=1)
    msg = (
        f"{name}: layer 1-2 (ReLU `1`) (output) gives 72 features per sample, but "
        "the detector was fitted on 32: score inputs of the shape it was fitted on"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}"):
        detector(torch.randn(2, 1, 6, 6))
