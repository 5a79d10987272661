"""The neighbour and class-conditional detectors against scio-pypi 1.1 itself.

scio 1.1 needs Python >= 3.12 and faiss: its numbers come from a
subprocess, ``$SCIO_PYTHON tests/scio_reference.py FOLDER`` (an interpreter
where ``scio-pypi`` is installed), on the same net and data saved to
``FOLDER``. Without ``SCIO_PYTHON`` (CI) the module is skipped. Run it with
``SCIO_PYTHON=/path/to/python3.12 python -m pytest tests/test_ood_scio.py
-m slow``.

The net is the digits CNN of the benchmark, trained for a few seconds
(digits 0-5); the fit data its training set, the queries 100 test digits
and 100 digits 6-9. For each score, ours and scio's agree after the
documented mapping (``docs/migrate/scio.md``): ``score_classes(x) =
-conformity``, scio reading every score at the predicted class.

Tolerances, from float32 (``eps32``) and the magnitudes (scio computes in
the features' dtype, we in float64 where we can): a squared distance from
``||q||^2 + ||b||^2 - 2 q.b`` is off by a few ``eps32 (||q||^2 + ||b||^2)``
(its terms' rounding, in each of two implementations); a ratio or a log
ratio of such distances carries their relative errors; a p-value ``m / N``
is exact but for its float32 rounding, and a combination of ``L`` of them
carries ``L`` roundings of each log or inverse. The Mahalanobis family runs
in float64 on both sides; scio inverts the covariance, we take the
pseudo-inverse (equal for an invertible one): ``cond(S) * eps64``.
Neighbour identities (hence every count) are compared exactly: the data
have no ties.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scio_recorder import Recorder
from scio_recorder.data import train_classifier
from scio_recorder.models import digits_cnn
from scio_recorder.ood import (
    JTLA,
    KNN,
    LID,
    RMDS,
    DkNN,
    Mahalanobis,
    MahalanobisEnsemble,
    Trust,
)
from scio_recorder.ood._protocol import run_pass
from scio_recorder.ood._search import nearest
from scio_recorder.ood.benchmark import load_benchmark

SCIO_PYTHON = os.environ.get("SCIO_PYTHON", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (SCIO_PYTHON and Path(SCIO_PYTHON).exists()),
        reason="set SCIO_PYTHON to a Python >= 3.12 with scio-pypi 1.1 installed",
    ),
]
EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps
REFERENCE = Path(__file__).with_name("scio_reference.py")
F32, F64 = "float32", "float64"
# digits CNN labels: (2, 7) the last conv's ReLU [64, 4, 4], (2, 11) the
# penultimate ReLU [64], (2, 12) the logits [6].
DEEP, PENULTIMATE, LOGITS = (2, 7), (2, 11), (2, 12)
# The Mahalanobis family on a small MLP with Gaussian data: the digits
# CNN's features have dead units, whose covariance scio cannot invert.
MLP_LAYERS = [(1, 2), (1, 4)]
PRIOR = [[1.5 + 0.1 * i + 0.01 * j for j in range(6)] for i in range(6)]


def scio_config(name, score, layers, dtype=F32, mode="raw", **params):
    return {
        "name": name,
        "score": score,
        "params": params,
        "layers": [list(label) for label in layers],
        "dtype": dtype,
        "mode": mode,
    }


DIGITS = [
    scio_config("knn", "KNN", [PENULTIMATE], k=5),
    scio_config("lid", "LID", [PENULTIMATE], k=10),
    scio_config("trust", "Trust", [PENULTIMATE], alpha=0.1, k=10),
    scio_config("dknn", "DkNN", [DEEP, PENULTIMATE], k=10),
    scio_config(
        "dknn-fisher", "DkNN", [DEEP, PENULTIMATE], k=10, per_layer=True,
        aggregation="fisher",
    ),
    scio_config(
        "dknn-harmonic", "DkNN", [DEEP, PENULTIMATE], k=10, per_layer=True,
        aggregation="harmonic",
    ),
    scio_config(
        "jtla-mle", "JTLA", [DEEP, PENULTIMATE],
        test={"type": "multinomial", "mode": "mle", "k": 10},
    ),
    scio_config(
        "jtla-mle-min-adv", "JTLA", [DEEP, PENULTIMATE],
        test={"type": "multinomial", "mode": "mle", "k": 10},
        layer_aggregation="min", class_aggregation="adv",
    ),
    scio_config(
        "jtla-map", "JTLA", [DEEP, PENULTIMATE],
        test={"type": "multinomial", "mode": "map", "k": 10, "prior": PRIOR},
        layer_aggregation="geometric",
    ),
    # scio's DCM surprise subtracts float32 log-gammas of ~10^3: run it in
    # float64 (our tests are float64).
    scio_config(
        "jtla-dcm", "JTLA", [DEEP, PENULTIMATE], dtype=F64,
        test={"type": "multinomial", "mode": "dcm", "k": 10, "prior": PRIOR},
        layer_aggregation="harmonic",
    ),
]  # fmt: skip
MLP = [
    scio_config("maha", "DeepMahalanobis", [MLP_LAYERS[1]], dtype=F64),
    scio_config("maha-diff", "DeepMahalanobis", [MLP_LAYERS[1]], F64, mode="diff"),
    scio_config("rmd", "RelativeMahalanobis", [MLP_LAYERS[1]], dtype=F64),
    scio_config("maha-layers", "DeepMahalanobis", MLP_LAYERS, dtype=F64),
]


def run_scio(folder, net, data, configs):
    """Save the net, data and configs; return scio's results."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(net, folder / "net.pt")
    torch.save(data, folder / "data.pt")
    (folder / "configs.json").write_text(json.dumps(configs))
    subprocess.run(  # noqa: S603 (the interpreter the user named)
        [SCIO_PYTHON, str(REFERENCE), str(folder)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return torch.load(folder / "out.pt")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    bench = load_benchmark("digits", seed=0)
    torch.manual_seed(0)
    net = digits_cnn(bench.num_classes)
    train_classifier(net, *bench.train, epochs=15, seed=0)
    net.eval()
    query = torch.cat([bench.test[0][:100], bench.near["digits-6-9"][:100]])
    data = {"calib_x": bench.train[0], "calib_y": bench.train[1], "query_x": query}
    scio = run_scio(tmp_path_factory.mktemp("digits"), net, data, DIGITS)
    return net, data, scio


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 10),
        torch.nn.Tanh(),
        torch.nn.Linear(10, 8),
        torch.nn.Tanh(),
        torch.nn.Linear(8, 4),
    ).double()
    x = torch.randn(400, 6, dtype=torch.float64)
    data = {
        "calib_x": x,
        "calib_y": torch.arange(400) % 4,
        "query_x": 2 * torch.randn(60, 6, dtype=torch.float64),
    }
    return net, data, run_scio(tmp_path_factory.mktemp("mlp"), net, data, MLP)


def ours(net, data, detector_class, *args, dtype=torch.float32, **kwargs):
    """Fit our detector on the same data; return it and the queries."""
    model = copy.deepcopy(net).to(dtype)
    rnet = Recorder(model, input_data=data["query_x"][:1].to(dtype))
    detector = detector_class(rnet, *args, backend="torch", **kwargs)
    fit = [(data["calib_x"].to(dtype), data["calib_y"])]
    return detector.fit(fit, target=1), data["query_x"].to(dtype)


def plain(net, data, detector_class, *args, dtype=torch.float64, **kwargs):
    """As :func:`ours`, for detectors without a search (no ``backend``)."""
    model = copy.deepcopy(net).to(dtype)
    rnet = Recorder(model, input_data=data["query_x"][:1].to(dtype))
    fit = [(data["calib_x"].to(dtype), data["calib_y"])]
    detector = detector_class(rnet, *args, **kwargs).fit(fit, target=1)
    return detector, data["query_x"].to(dtype)


def a_pass(detector, x):
    """One pass recording what ``detector`` reads."""
    return run_pass(
        detector.rnet, (x,), {}, outputs=detector.outputs(), inputs=detector.inputs()
    )


def conformity(result):
    """scio's conformity in float64; its dtype's extremes back to +-inf."""
    c = result["conformity"]
    big = torch.finfo(c.dtype).max
    c = c.double()
    c[c == big], c[c == -big] = torch.inf, -torch.inf
    return c


def assert_close(mine, theirs, tolerance):
    """Equal within ``tolerance`` where finite, with the same infinities."""
    mine, theirs = mine.double(), theirs.double()
    assert torch.equal(torch.isinf(mine), torch.isinf(theirs))
    assert torch.equal(mine[torch.isinf(mine)], theirs[torch.isinf(theirs)])
    finite = torch.isfinite(theirs)
    tolerance = torch.as_tensor(tolerance, dtype=torch.float64).expand_as(mine)
    gap = (mine - theirs).abs()[finite]
    assert bool((gap <= tolerance[finite]).all()), float(
        (gap - tolerance[finite]).max()
    )


def assert_predicted(detector, x, result, tolerance, scale=1.0):
    """``at="predicted"`` reads scio's conformity at the net's prediction."""
    detector.at = "predicted"
    predicted = result["out"].argmax(dim=1)[:, None]
    expected = -conformity(result).gather(1, predicted)[:, 0]
    tolerance = torch.as_tensor(tolerance, dtype=torch.float64)
    if tolerance.dim() == 2:
        tolerance = tolerance.gather(1, predicted)[:, 0]
    assert_close(detector(x).double() * scale, expected, tolerance)


def squared_error(z, bank):
    """The rounding bound of a squared distance ``||q - b||^2``, per query."""
    return 8 * EPS32 * (z.square().sum(dim=1) + bank.square().sum(dim=1).max())


def test_knn_squared_is_minus_scios_conformity(digits):
    net, data, scio = digits
    knn, x = ours(net, data, KNN, layer=PENULTIMATE, k=5)
    # Both normalise the features: ||q||^2 + ||b||^2 = 2.
    assert_close(knn(x) ** 2, -conformity(scio["knn"])[:, 0], 16 * EPS32)


def test_lid_is_minus_scios_conformity(digits):
    net, data, scio = digits
    lid, x = ours(net, data, LID, layer=PENULTIMATE, k=10)
    mine = lid(x).double()
    # LID = 2k / S, S = sum_i log(d2_k / d2_i): each log ratio is off by the
    # relative errors of its two squared distances.
    z = lid.features(a_pass(lid, x)).float()
    d2 = nearest(z, lid.bank, 10, backend="torch").values.double()
    err = squared_error(z, lid.bank).double()[:, None]
    s = (d2[:, -1:] / d2).log().sum(dim=1)
    ds = (err / d2 + err / d2[:, -1:]).sum(dim=1)
    assert_close(mine, -conformity(scio["lid"])[:, 0], mine.abs() * ds / s)


def test_trust_is_minus_scios_conformity(digits):
    net, data, scio = digits
    trust, x = ours(net, data, Trust, layer=PENULTIMATE, alpha=0.1, k=10)
    result = a_pass(trust, x)
    d = trust.distances(result).double()
    mine = trust.class_scores(result).double()
    # trust_c = d_other / d_c: the relative errors of two distances, each
    # half that of its square.
    z = trust.features(result).float()
    rel = squared_error(z, trust.bank).double()[:, None] / (2 * d.square())
    tol = mine.abs() * 2 * rel.amax(dim=1, keepdim=True) + 4 * EPS32 * mine.abs()
    assert_close(mine, -conformity(scio["trust"]), tol)
    assert_predicted(trust, x, scio["trust"], tol)


def combined_tolerance(values, aggregation, layers=2):
    """The float32 rounding of ``layers`` p-values ``m / N``, combined.

    Each p-value is off by ``eps32`` relative (scio divides in float32);
    a log adds ``eps32 |log p|``, and ``|log p_l| <= |sum_l log p_l|``.
    """
    v = values.abs()
    if aggregation == "fisher":
        return 4 * EPS32 * layers * v.clamp(min=1)
    if aggregation == "geometric":
        return 4 * EPS32 * v * (1 + layers * v.log().abs().nan_to_num(posinf=0))
    return 4 * EPS32 * layers * v


def test_dknn_counts_are_scios(digits):
    net, data, scio = digits
    dknn, x = ours(net, data, DkNN, [DEEP, PENULTIMATE], k=10, pool=None)
    assert torch.equal(dknn.score_classes(x).double(), -conformity(scio["dknn"]))
    assert_predicted(dknn, x, scio["dknn"], 0.0)


@pytest.mark.parametrize("aggregation", ["fisher", "harmonic"])
def test_dknn_aggregated_p_values_are_scios(digits, aggregation):
    net, data, scio = digits
    dknn, x = ours(
        net, data, DkNN, [DEEP, PENULTIMATE], k=10, pool=None, aggregation=aggregation
    )
    mine = dknn.score_classes(x).double()
    tol = combined_tolerance(mine, aggregation)
    assert_close(mine, -conformity(scio[f"dknn-{aggregation}"]), tol)


JTLA_CASES = {
    # scio's name: (our test options, aggregation, class aggregation, dtype)
    "jtla-mle": ({"mode": "mle"}, "fisher", "nat", torch.float32),
    "jtla-mle-min-adv": ({"mode": "mle"}, "min", "adv", torch.float32),
    "jtla-map": ({"mode": "map", "prior": PRIOR}, "geometric", "nat", torch.float32),
    "jtla-dcm": ({"mode": "dcm", "prior": PRIOR}, "harmonic", "nat", torch.float64),
}


@pytest.mark.parametrize("name", list(JTLA_CASES))
def test_jtla_is_scios_with_in_sample_reference(digits, name):
    net, data, scio = digits
    test, aggregation, classes, dtype = JTLA_CASES[name]
    jtla, x = ours(
        net,
        data,
        JTLA,
        [DEEP, PENULTIMATE],
        test={"type": "multinomial", "k": 10, **test},
        aggregation=aggregation,
        class_aggregation=classes,
        pool=None,
        leave_one_out=False,  # scio 1.1's reference counts a sample among its own
        dtype=dtype,
    )
    mine = jtla.score_classes(x).double()
    # "adv" divides two "min" combinations: their relative errors add.
    tol = combined_tolerance(mine, aggregation)
    assert_close(mine, -conformity(scio[name]), 2 * tol if classes == "adv" else tol)


def test_jtla_leaves_each_fit_sample_out_by_default(digits):
    # Our default reference leaves the sample out of its own neighbours:
    # other p-values than scio's in-sample ones.
    net, data, scio = digits
    jtla, x = ours(
        net, data, JTLA, [DEEP, PENULTIMATE], test={"type": "multinomial", "k": 10},
        pool=None,
    )  # fmt: skip
    assert not torch.allclose(
        jtla.score_classes(x).double(), -conformity(scio["jtla-mle"])
    )


def mahalanobis_tolerance(detector, values):
    """``cond(S) * F * eps64`` relative, from the detector's precision matrix."""
    cond = torch.linalg.cond(detector.precision)
    return values.abs() * cond * detector.precision.shape[0] * 16 * EPS64


def test_mahalanobis_at_predicted_is_scios_deep_mahalanobis(mlp):
    net, data, scio = mlp
    n = len(data["calib_y"])
    maha, x = plain(net, data, Mahalanobis, layer=MLP_LAYERS[1])
    # scio's covariance divides by N - 1, ours by N.
    mine = maha.score_classes(x) * (n - 1) / n
    assert_close(mine, -conformity(scio["maha"]), mahalanobis_tolerance(maha, mine))
    diff = maha.score_classes(x, mode="diff") * (n - 1) / n
    assert_close(
        diff, -conformity(scio["maha-diff"]), mahalanobis_tolerance(maha, mine)
    )
    tol = mahalanobis_tolerance(maha, mine)
    assert_predicted(maha, x, scio["maha"], tol, scale=(n - 1) / n)


def test_rmds_at_predicted_is_scios_relative_mahalanobis(mlp):
    net, data, scio = mlp
    n = len(data["calib_y"])
    rmds, x = plain(net, data, RMDS, layer=MLP_LAYERS[1])
    mine = rmds.score_classes(x) * (n - 1) / n
    cond = torch.linalg.cond(rmds.background_precision)
    tol = mahalanobis_tolerance(rmds, mine) + mine.abs() * cond * 8 * 16 * EPS64
    assert_close(mine, -conformity(scio["rmd"]), tol + 1e-9)


def test_ensemble_at_predicted_is_scios_deep_mahalanobis_on_layers(mlp):
    net, data, scio = mlp
    n = len(data["calib_y"])
    ens, x = plain(net, data, MahalanobisEnsemble, MLP_LAYERS, pool=None)
    mine = ens.score_classes(x) * (n - 1) / n
    cond = max(float(torch.linalg.cond(p)) for p in ens.precisions)
    assert_close(mine, -conformity(scio["maha-layers"]), mine.abs() * cond * 1e-13)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-m", "slow", *sys.argv[1:]]))
