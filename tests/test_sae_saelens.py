"""SAEs read by `load_saelens` against SAELens itself, architecture by architecture.

SAELens is not a dependency: its SAEs come from a subprocess,
``$SAELENS_PYTHON tests/saelens_reference.py FOLDER``, an interpreter where
``sae-lens`` is installed. SAELens builds each SAE of ``CASES`` from its
config, draws its parameters at random, saves it (``sae.save_model``), and
computes ``encode``, ``decode`` and the forward of a random input; here
the saved folder is read with :func:`load_saelens` and the same three are
compared. Without ``SAELENS_PYTHON`` (CI) the module is skipped. Run it
with::

    python3.11 -m venv /work/venvs/saelens
    /work/venvs/saelens/bin/pip install torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu
    /work/venvs/saelens/bin/pip install sae-lens
    SAELENS_PYTHON=/work/venvs/saelens/bin/python \
        python -m pytest tests/test_sae_saelens.py -m slow

Tolerances, from float32 (``eps32``) and the magnitudes: a pre-activation
is a dot product of ``d_in`` terms plus a bias; two implementations may
round each term and the sum differently, by at most about ``d_in * eps32
* (|x| @ |W_enc| + |b_enc|)`` per latent (a normalised input first carries
a few roundings of its own, relative to its size: folded into the same
bound with a factor 4). ``decode`` is compared on SAELens's own latents,
so its bound is the same with ``d_sae`` terms. The forward carries the
latents' bound through ``|W_dec|``. Which latents fire (top-k, JumpReLU's
threshold) is compared exactly: the random data have no near-ties. On
torch 2.13's CPU kernels both sides run the same operations in the same
order, and every number is in fact equal bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import safetensors.torch
import torch

from scio_recorder.sae import SparseAutoencoder, load_saelens
from scio_recorder.sae._saelens import ARCHITECTURES

SAELENS_PYTHON = os.environ.get("SAELENS_PYTHON", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (SAELENS_PYTHON and Path(SAELENS_PYTHON).exists()),
        reason="set SAELENS_PYTHON to a Python with sae-lens installed",
    ),
]
REFERENCE = Path(__file__).with_name("saelens_reference.py")
EPS32 = torch.finfo(torch.float32).eps
D_IN, D_SAE, D_OUT = 24, 96, 20
SHAPE = [4, 7, D_IN]


def _case(name: str, architecture: str, shape: list[int] | None = None, **cfg):
    config = {"architecture": architecture, "d_in": D_IN, "d_sae": D_SAE, **cfg}
    return {"name": name, "cfg": config, "shape": shape or SHAPE}


CASES = [
    _case("standard", "standard", apply_b_dec_to_input=True),
    _case("standard_no_b_dec", "standard", apply_b_dec_to_input=False),
    _case("topk", "topk", k=8, apply_b_dec_to_input=True),
    _case("topk_rescaled", "topk", k=8, rescale_acts_by_decoder_norm=True),
    _case("jumprelu", "jumprelu", apply_b_dec_to_input=True),
    _case("jumprelu_no_b_dec", "jumprelu", apply_b_dec_to_input=False),
    _case(
        "constant_norm_rescale",
        "standard",
        normalize_activations="constant_norm_rescale",
    ),
    _case("layer_norm", "jumprelu", normalize_activations="layer_norm"),
    _case(
        "expected_average_only_in",
        "topk",
        k=4,
        normalize_activations="expected_average_only_in",
    ),
    _case(
        "hook_z",
        "standard",
        shape=[4, 7, 4, D_IN // 4],
        reshape_activations="hook_z",
        metadata={"hook_name": "blocks.0.attn.hook_z"},
    ),
    _case("transcoder", "transcoder", d_out=D_OUT, apply_b_dec_to_input=False),
    _case(
        "transcoder_same_width",
        "transcoder",
        d_out=D_IN,
        apply_b_dec_to_input=False,
    ),
    _case(
        "skip_transcoder", "skip_transcoder", d_out=D_OUT, apply_b_dec_to_input=False
    ),
    _case(
        "jumprelu_transcoder",
        "jumprelu_transcoder",
        d_out=D_OUT,
        apply_b_dec_to_input=False,
    ),
    _case(
        "jumprelu_skip_transcoder",
        "jumprelu_skip_transcoder",
        d_out=D_OUT,
        apply_b_dec_to_input=False,
        normalize_activations="constant_norm_rescale",
    ),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("saelens")
    (folder / "cases.json").write_text(json.dumps(CASES))
    done = subprocess.run(  # noqa: S603 (the tester's interpreter, our script)
        [SAELENS_PYTHON, str(REFERENCE), str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        case["name"] for case in CASES
    ]
    return folder


def _bound(terms: int, inputs: torch.Tensor, weights: torch.Tensor, bias):
    """``terms * eps32 * (|inputs| @ |weights| + |bias|)``, per output element."""
    return 4 * terms * EPS32 * (inputs.abs() @ weights.abs() + bias.abs())


def _assert_within(ours, theirs, bound, what):
    excess = (ours - theirs).abs() - bound
    assert bool((excess <= 0).all()), (what, float(excess.max()))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_encode_decode_and_forward_equal_saelens(saved, case):
    """Latents, reconstruction and output equal SAELens's to float32 precision."""
    folder = saved / case["name"]
    sae = load_saelens(folder)
    assert isinstance(sae, SparseAutoencoder)
    ref = safetensors.torch.load_file(str(folder / "reference.safetensors"))
    x, latents = ref["x"], ref["latents"]
    with torch.no_grad():
        ours = sae.encode(x)
        decoded = sae.decode(latents) if sae.transcoder else sae.decode(latents, x=x)
        out = sae(x)
        # Magnitudes for the bounds: the input as the encoder reads it, and
        # the scale a normalising SAE maps its output back with.
        flat = x.flatten(-2) if sae.hook_z else x
        sae_in, stats = sae._normalised(flat)
        scale = 1 / stats[0] if len(stats) == 1 else stats[-1] if stats else 1
        bound_f = _bound(D_IN, sae_in, sae.W_enc, sae.b_enc)
        if sae.rescale_acts_by_decoder_norm:
            bound_f = bound_f * sae.W_dec.norm(dim=-1)
        dec_in = latents
        if sae.rescale_acts_by_decoder_norm:
            dec_in = latents / sae.W_dec.norm(dim=-1)
        bound_d = _bound(D_SAE, dec_in, sae.W_dec, sae.b_dec)
        if sae.normalize != "none" and not sae.transcoder:
            bound_d = bound_d * (scale + 1)
        bound_o = bound_d + bound_f @ sae.W_dec.abs()
        if sae.W_skip is not None:
            bound_o = bound_o + _bound(D_IN, flat, sae.W_skip.T, torch.zeros(()))
    assert ours.shape == latents.shape
    assert torch.equal(ours != 0, latents != 0), "different latents fire"
    _assert_within(ours, latents, bound_f, "encode")
    assert decoded.shape == ref["decoded"].shape
    _assert_within(decoded, ref["decoded"], bound_d.reshape(decoded.shape), "decode")
    assert out.shape == ref["out"].shape
    _assert_within(out, ref["out"], bound_o.reshape(out.shape), "forward")
    # Some latents fire and some do not: the comparison is not of zeros.
    assert 0 < float((latents != 0).float().mean()) < 1


def test_the_architectures_compared_are_those_load_saelens_reads(saved):
    """Every architecture the reader accepts is among the cases compared."""
    assert {case["cfg"]["architecture"] for case in CASES} == set(ARCHITECTURES)
