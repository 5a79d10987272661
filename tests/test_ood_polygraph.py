"""Parity with lm-polygraph 0.7.0 (MIT): EigenScore, AttentionScore, Mahalanobis.

lm-polygraph is not a dependency: its estimators run in a subprocess,
``$LM_POLYGRAPH_PYTHON tests/polygraph_reference.py FOLDER``, an interpreter
where it is installed, on arrays written here; without
``LM_POLYGRAPH_PYTHON`` the module is skipped. Make that interpreter with::

    python3 -m venv venv-polygraph
    venv-polygraph/bin/pip install torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu
    venv-polygraph/bin/pip install lm-polygraph==0.7.0
    LM_POLYGRAPH_PYTHON=venv-polygraph/bin/python \
        python -m pytest tests/test_ood_polygraph.py -m slow

What is compared:

* ``EigenScore``: lm-polygraph's on the embeddings our detector read (its
  ``embeddings``), equal to our scores to ``1e-8`` (both float64, the same
  formula; ``scipy.linalg.eigh`` against ``torch.linalg.eigvalsh``);
* ``AttentionScore``: lm-polygraph's on the attention weights Hugging Face
  returns for the same batch, equal to ours with
  ``normalisation="polygraph"`` (its ``1e-12`` inside the log moves a
  value by under ``1e-12 / min(diagonal)``, relative);
* Mahalanobis: its ``MahalanobisDistanceSeq`` is
  $\\sqrt{(x - \\mu)^\\top (S_{N-1} + jI)^{-1} (x - \\mu)}$, the unbiased
  covariance with a jitter ``j`` (the first of ``1e-15, 1e-14, ...`` leaving
  no negative eigenvalue: ``1e-15`` here) inverted in float64 and applied in
  float32. Ours is the squared distance with the population covariance:
  theirs is $\\sqrt{\\mathrm{ours} \\cdot (N - 1) / N}$, the same ranking;
  compared rank for rank and to float32 roundings (``rtol=1e-4``: a float32
  quadratic form of ``d = 8`` terms, of a condition number near 10);
* its ``RelativeMahalanobisDistanceSeq``, $\\mathrm{MD}(x) - \\mathrm{MD}_0(x)$
  of the square roots, ``MD_0`` fitted on background data: ours is composed
  of two :class:`~scio_recorder.ood.Mahalanobis` (one class each: ``token="each"`` on
  ``[N, 1, d]`` rows; in-domain and background,
  ``N`` samples each, so that the ``(N - 1) / N`` is common), square roots
  taken. (:class:`~scio_recorder.ood.RMDS` is Ren et al.'s own: squared
  distances, class means, the background fitted on the same data; it is
  not this score.)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import AttentionScore, EigenScore, Mahalanobis

transformers = pytest.importorskip("transformers")
PYTHON = os.environ.get("LM_POLYGRAPH_PYTHON", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (PYTHON and Path(PYTHON).exists()),
        reason="set LM_POLYGRAPH_PYTHON to a Python with lm-polygraph 0.7.0",
    ),
]
REFERENCE = Path(__file__).with_name("polygraph_reference.py")
N, D = 200, 8


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Our scores, and lm-polygraph's on the same arrays."""
    folder = tmp_path_factory.mktemp("polygraph")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32,
        attn_implementation="eager", bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    net = transformers.GPT2LMHeadModel(config).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (12, 7), generator=gen)  # 4 questions x K=3
    rnet = Recorder(net, input_data={"input_ids": ids})
    eigen = EigenScore(rnet, "transformer.h.0", samples=3)
    ours = {"eigen": eigen(input_ids=ids).numpy()}
    samples = eigen.embeddings(input_ids=ids).numpy()
    att = AttentionScore(rnet, "transformer.h.0.attn", normalisation="polygraph")
    ours["attention"] = att(input_ids=ids).numpy()
    with torch.no_grad():
        weights = net(input_ids=ids, output_attentions=True).attentions
    stacked = torch.stack(weights, 1).to(torch.float64).numpy()  # [B, L, H, T, T]
    # embeddings: in-domain, background, test (a shifted part)
    rng = np.random.default_rng(0)
    rotation = np.linalg.qr(rng.normal(size=(D, D)))[0]
    mix = rotation * np.linspace(1.0, 2.0, D)  # condition number 4
    train = rng.normal(size=(N, D)) @ mix
    background = rng.normal(size=(N, D)) * 1.5 + 0.5
    test = np.concatenate(
        [rng.normal(size=(50, D)) @ mix, rng.normal(size=(50, D)) + 1]
    )
    mahas = []
    for fit in (train, background):  # one class: token="each", one token a row
        head = nn.Sequential(nn.Identity(), nn.Linear(D, 1))
        r = Recorder(head, input_size=(1, 1, D))
        x = torch.from_numpy(fit).float()[:, None]
        det = Mahalanobis(r, "0", token="each", mask=None)  # noqa: S106 (not a password)
        mahas.append(det.fit([x], input=None))
    x_test = torch.from_numpy(test).float()[:, None]
    ours["md2"], ours["md2_0"] = (m(x_test).numpy() for m in mahas)
    np.savez(
        folder / "inputs.npz",
        samples=samples, alpha=1e-3, layer=0, lengths=np.full(12, 7),
        train=train.astype(np.float32), background=background.astype(np.float32),
        test=test.astype(np.float32),
        **{f"attention_{i}": stacked[i] for i in range(12)},
    )  # fmt: skip
    subprocess.run(  # noqa: S603 (the reference script, our interpreter)
        [PYTHON, str(REFERENCE), str(folder)], check=True, timeout=600
    )
    theirs = dict(np.load(folder / "outputs.npz"))
    return ours, theirs


def test_eigen_score_equals_lm_polygraphs(compared):
    ours, theirs = compared
    np.testing.assert_allclose(ours["eigen"], theirs["eigen"], rtol=0, atol=1e-8)


def test_attention_score_equals_lm_polygraphs_under_its_normalisation(compared):
    ours, theirs = compared
    np.testing.assert_allclose(ours["attention"], theirs["attention"], rtol=1e-8)


def test_mahalanobis_ranks_as_lm_polygraphs(compared):
    ours, theirs = compared
    assert np.array_equal(np.argsort(ours["md2"]), np.argsort(theirs["md"]))
    np.testing.assert_allclose(
        np.sqrt(ours["md2"] * (N - 1) / N), theirs["md"], rtol=1e-4
    )


def test_relative_mahalanobis_ranks_as_lm_polygraphs(compared):
    ours, theirs = compared
    scale = (N - 1) / N
    rmd = np.sqrt(ours["md2"] * scale) - np.sqrt(ours["md2_0"] * scale)
    assert np.array_equal(np.argsort(rmd), np.argsort(theirs["rmd"]))
    np.testing.assert_allclose(rmd, theirs["rmd"], rtol=1e-4, atol=1e-5)
