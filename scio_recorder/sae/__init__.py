"""Sparse autoencoders in any model: splice, read and edit their latents.

A trained sparse autoencoder (SAE) or transcoder is a module,
:class:`SparseAutoencoder` (ReLU, top-k, JumpReLU; SAELens's parameters),
built from tensors (:meth:`SparseAutoencoder.from_state`) or read from
SAELens's saved format (:func:`load_saelens`). Spliced into a pass with
:func:`splice`, an activation postprocessor for any label of any model,
it replaces the layer's output by its reconstruction (or keeps the error
term, so the model is unchanged while its latents are read), and its
latents can be edited on the way (:func:`zero`, :func:`scale`,
:func:`set_to`, :func:`clamp`): in ``rnet(...)``, in every step of
``rnet.generate``, and, installed in the net by :func:`attach`, in the
tools that run their own passes (``collect``, ``patch_sweep``, the OoD
detectors, ``activations.write``), where the latents are a layer like
any other. :func:`evaluate` reports what researchers report of an SAE over
a token stream (MSE, explained variance, L0, dead latents, the language
model's loss spliced against clean and zero-ablated, the KL divergence).
Latents stored sparsely in activation sets:
:class:`scio_recorder.activations.Sparse`.

This package is the public face; its private modules, one concept each:

* ``_autoencoder``: :class:`SparseAutoencoder`;
* ``_saelens``: :func:`load_saelens`;
* ``_edits``: the edits of latents;
* ``_splice``: :func:`splice`, :class:`Splice`;
* ``_attach``: :func:`attach`;
* ``_evaluate``: :func:`evaluate`, :class:`Measures`.

The how-to is ``docs/sae.md``.
"""

from __future__ import annotations

__all__ = [
    "Edit",
    "Measures",
    "SparseAutoencoder",
    "Splice",
    "attach",
    "clamp",
    "evaluate",
    "load_saelens",
    "scale",
    "set_to",
    "splice",
    "zero",
]

from ._attach import attach
from ._autoencoder import SparseAutoencoder
from ._edits import Edit, clamp, scale, set_to, zero
from ._evaluate import Measures, evaluate
from ._saelens import load_saelens
from ._splice import Splice, splice
