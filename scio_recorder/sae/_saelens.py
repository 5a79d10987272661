"""Reading SAELens's saved format: :func:`load_saelens`.

A SAELens SAE saved with ``sae.save_model(folder)`` is a folder holding
``cfg.json`` (the config: ``architecture``, ``d_in``, ``d_sae``, ``dtype``,
``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``,
``k``, ``d_out``, ``metadata`` with the ``hook_name`` it was trained on, ...)
and ``sae_weights.safetensors`` (the state dict). Pretrained SAEs on the
Hugging Face Hub in SAELens's format are the same two files: download them
yourself (``huggingface_hub.snapshot_download``) and load the folder;
nothing here downloads.

Why an own reader: SAELens imports TransformerLens and ties an SAE to its
own model classes; the formulas are a few lines (``_autoencoder``), and
the parity tests (``tests/test_sae_saelens.py``) compare every architecture
read here with SAELens itself.
"""

from __future__ import annotations

__all__ = ["ARCHITECTURES", "load_saelens"]

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from scio_recorder._support.files import parse_dtype

from ._autoencoder import SparseAutoencoder

if TYPE_CHECKING:
    import os

ARCHITECTURES = {
    "standard": ("relu", False),
    "topk": ("topk", False),
    "jumprelu": ("jumprelu", False),
    "transcoder": ("relu", True),
    "skip_transcoder": ("relu", True),
    "jumprelu_transcoder": ("jumprelu", True),
    "jumprelu_skip_transcoder": ("jumprelu", True),
}
"""SAELens's architectures read here -> (activation, transcoder)."""

CONFIG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"

# SAELens's `normalize_activations` values: those applied at inference, and
# those it folds into the weights (at the end of training, or when loading a
# pretrained SAE with its scaling factor), which an SAE loaded from disk
# leaves alone, as SAELens's `load_from_disk` does.
_RUNTIME = ("none", "constant_norm_rescale", "layer_norm")
_FOLDED = ("expected_average_only_in", "covariance_whitening")


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    if not path.is_file():
        what = "no such folder" if not folder.is_dir() else f"it holds no {CONFIG}"
        msg = (
            f"'{folder}' is not a SAELens SAE folder ({what}): give the folder "
            f"`sae.save_model(folder)` wrote, holding {CONFIG} and {WEIGHTS}."
        )
        raise FileNotFoundError(msg)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        msg = f"'{path}' is not JSON ({error}): a SAELens config is a JSON object."
        raise ValueError(msg) from error
    if not isinstance(config, dict):
        msg = f"'{path}' holds a {type(config).__name__}, not a SAELens config object."
        raise ValueError(msg)  # noqa: TRY004 (a bad file, not a bad argument type)
    return _legacy(config)


def _legacy(config: dict[str, Any]) -> dict[str, Any]:
    """Read a config written before SAELens 6 as SAELens 6 reads it."""
    config = dict(config)
    if "architecture" not in config:
        config["architecture"] = "standard"
        config.setdefault("apply_b_dec_to_input", True)
        kwargs = config.get("activation_fn_kwargs") or {}
        activation = config.get("activation_fn", config.get("activation_fn_str"))
        if activation == "topk" and kwargs.get("k") is not None:
            config["architecture"] = "topk"
            config["k"] = kwargs["k"]
    normalize = config.get("normalize_activations")
    if isinstance(normalize, bool) or normalize is None:
        config["normalize_activations"] = (
            "expected_average_only_in" if normalize else "none"
        )
    return config


def _check_weights(
    state: dict[str, torch.Tensor], architecture: str, path: Path
) -> None:
    required = {"W_enc", "b_enc", "W_dec", "b_dec"}
    if ARCHITECTURES[architecture][0] == "jumprelu":
        required.add("threshold")
    if "skip" in architecture:
        required.add("W_skip")
    missing, extra = required - set(state), set(state) - required
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks {sorted(missing)}")
        if extra:
            parts.append(f"holds {sorted(extra)}, which this reader does not apply")
        msg = (
            f"The weights '{path}' of a {architecture!r} SAE {' and '.join(parts)}: "
            f"they must be {sorted(required)} (an SAE saved by an inference "
            "class of SAELens 6, `sae.save_model(folder)`)."
        )
        raise ValueError(msg)


def _top_k(config: dict[str, Any], path: Path) -> int:
    """Return a top-k config's ``k``, or say in the file's name what is wrong."""
    if "k" not in config:
        msg = (
            f"'{path}' is a {config['architecture']!r} SAE but has no 'k' (the "
            "number of latents it keeps, which SAELens's top-k configs store): "
            'add it, e.g. `"k": 32`, as the SAE was trained.'
        )
        raise ValueError(msg)
    k = config["k"]
    if isinstance(k, bool) or not isinstance(k, int):
        msg = f"'{path}' has 'k' = {k!r}: it must be an integer (the latents kept)."
        raise ValueError(msg)  # noqa: TRY004 (a bad file, not a bad argument type)
    return k


def load_saelens(
    folder: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> SparseAutoencoder:
    """Load an SAE or transcoder saved in SAELens's format.

    Reads ``folder/cfg.json`` and ``folder/sae_weights.safetensors`` (what
    SAELens's ``sae.save_model(folder)`` writes, and what its pretrained
    releases hold) and returns the :class:`SparseAutoencoder` that computes
    what SAELens computes: architectures ``"standard"``, ``"topk"`` (with
    ``rescale_acts_by_decoder_norm``), ``"jumprelu"``, ``"transcoder"``,
    ``"skip_transcoder"``, ``"jumprelu_transcoder"`` and
    ``"jumprelu_skip_transcoder"``; ``apply_b_dec_to_input``;
    ``normalize_activations`` ``"constant_norm_rescale"`` and
    ``"layer_norm"`` applied per input (``"expected_average_only_in"`` and
    ``"covariance_whitening"`` are left out, as SAELens's ``load_from_disk``
    does: SAELens folds them into the weights); ``reshape_activations=
    "hook_z"``. Configs written before SAELens 6 are read as SAELens reads
    them. Nothing is downloaded.

    Parameters
    ----------
    folder : str or os.PathLike
        The SAE's folder.
    dtype : torch.dtype, optional
        The parameters' dtype; default the config's ``dtype``.
    device : torch.device or str, optional
        Where to put the parameters (default the CPU).

    Returns
    -------
    SparseAutoencoder
        With ``sae.config``, the config as read (its ``metadata.hook_name``
        says where the SAE was trained: a TransformerLens hook name, e.g.
        ``"blocks.8.hook_resid_pre"``, the input of block 8 in a Hugging Face
        model).

    Raises
    ------
    FileNotFoundError
        If the folder holds no ``cfg.json`` or no weights.
    ValueError
        For an architecture or normalisation this reader does not compute
        (gated SAEs, ...), weights that do not match the config, a top-k
        config without its ``k``, or weights with a NaN or an infinity.

    Examples
    --------
    >>> import json, tempfile, torch, safetensors.torch
    >>> from pathlib import Path
    >>> from scio_recorder.sae import load_saelens
    >>> state = {"W_enc": torch.randn(4, 6), "b_enc": torch.zeros(6),
    ...          "W_dec": torch.randn(6, 4), "b_dec": torch.zeros(4)}  # fmt: skip
    >>> config = {"architecture": "topk", "k": 2, "d_in": 4, "d_sae": 6,
    ...           "dtype": "float32", "apply_b_dec_to_input": True}  # fmt: skip
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     _ = Path(folder, "cfg.json").write_text(json.dumps(config))
    ...     safetensors.torch.save_file(state, f"{folder}/sae_weights.safetensors")
    ...     sae = load_saelens(folder)
    >>> sae.activation, sae.k, sae.apply_b_dec_to_input
    ('topk', 2, True)

    """
    import safetensors.torch  # noqa: PLC0415 (imported when used)

    root = Path(folder)
    config = _read_config(root)
    architecture = config["architecture"]
    if architecture not in ARCHITECTURES:
        listed = ", ".join(repr(a) for a in ARCHITECTURES)
        msg = (
            f"'{root / CONFIG}' is a {architecture!r} SAE, which this reader "
            f"does not compute; it reads {listed}."
        )
        raise ValueError(msg)
    normalize = config.get("normalize_activations", "none")
    if normalize in _FOLDED:
        normalize = "none"
    if normalize not in _RUNTIME:
        msg = (
            f"'{root / CONFIG}' has `normalize_activations={normalize!r}`, which "
            f"this reader does not apply (it applies {list(_RUNTIME)})."
        )
        raise ValueError(msg)
    weights = root / WEIGHTS
    if not weights.is_file():
        msg = f"'{root}' holds {CONFIG} but no {WEIGHTS}: copy the SAE's weights there."
        raise FileNotFoundError(msg)
    state = safetensors.torch.load_file(str(weights))
    _check_weights(state, architecture, weights)
    activation, transcoder = ARCHITECTURES[architecture]
    stored = str(config.get("dtype", "float32")).removeprefix("torch.")
    sae = SparseAutoencoder.from_state(
        W_enc=state["W_enc"],
        b_enc=state["b_enc"],
        W_dec=state["W_dec"],
        b_dec=state["b_dec"],
        activation=activation,
        k=_top_k(config, root / CONFIG) if activation == "topk" else None,
        threshold=state.get("threshold"),
        apply_b_dec_to_input=bool(config.get("apply_b_dec_to_input", False))
        and not transcoder,
        W_skip=state.get("W_skip"),
        normalize=normalize,
        rescale_acts_by_decoder_norm=bool(
            config.get("rescale_acts_by_decoder_norm", False)
        ),
        transcoder=transcoder,
        hook_z=config.get("reshape_activations") == "hook_z",
        dtype=parse_dtype(stored) if dtype is None else dtype,
        device=torch.device("cpu") if device is None else device,
    )
    sae.config = config
    return sae
