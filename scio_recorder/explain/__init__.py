"""Explanations on a recorded net: Grad-CAM, activation patching, ablation.

Every layer is named as for :meth:`~scio_recorder.Recorder.record`: a
selector picks *calls* (labels), not modules, so the two calls of a reused
module are patched, ablated or read apart. Every edit goes through the
recorder's postprocessing path (``rnet(x, activation_postproc=...)``), so the
call-plan checks and the in-place safety of any recorded pass hold. The
recorder's selection is restored afterwards
(:meth:`~scio_recorder.Recorder.selecting`), and the net's parameters'
``.grad`` are never touched.

The net's inputs (``x``, ``source``, ``target``, ``clean``, ``corrupted``)
take one form everywhere: a tensor is the one positional argument, a tuple
the positional arguments, a mapping (a tokenizer's ``BatchEncoding``
included) the keyword arguments (``input_ids``, ``attention_mask``,
``labels``, ...), and a :class:`~scio_recorder.CallInputs` ``(args,
kwargs)`` both. (A net whose one argument is a dict takes ``(mapping,)``.)

| family | functions |
|---|---|
| heatmaps of a convolutional layer | :func:`grad_cam` (Selvaraju et al. 2017) |
| gradients, integrated or not (as captum) | :func:`integrated_gradients`, |
| | :func:`saliency`, :func:`input_x_gradient`, :func:`smoothgrad` |
| a source run's activations in a target run | :func:`patch`, :func:`cache_run`, |
| | :class:`ActivationCache` |
| the patching grid, layers x positions | :func:`patch_sweep` |
| its linear estimate, one backward pass | :func:`attribution_patch` |
| the final norm and unembedding on residual streams | :func:`logit_lens` |
| layers zeroed or set to their mean | :func:`ablate`, :func:`layer_means` |
| circuits: a score per edge between components | :func:`edge_attribution`, |
| | :func:`faithfulness`, :class:`EdgeScores`, :class:`Components` |

This package is the public face; one family a private module
(``_gradcam``, ``_gradients``, ``_edges``, ``_patching``, ``_sweeps``,
``_attribution``, ``_lens``, ``_ablation``), what they share in ``_base``
(the inputs' one form, layers by call, edits in call order, the residual
stream of a block), and in
``_prefix`` how :func:`patch_sweep` runs a block stack's prefix once (the
blocks before a patch answered from the corrupted run).

Examples
--------
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> from scio_recorder.explain import ablate, patch
>>> _ = torch.manual_seed(0)
>>> net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
>>> rnet = Recorder(net, input_size=(1, 3))
>>> a, b = torch.randn(1, 3), torch.randn(1, 3)
>>> torch.equal(patch(rnet, a, b, layers="1"), net(a))  # all of it: a's output
True
>>> ablate(rnet, b, layers="1").shape
torch.Size([1, 2])

"""

from __future__ import annotations

__all__ = [
    "ActivationCache",
    "Components",
    "EdgeScores",
    "ablate",
    "attribution_patch",
    "cache_run",
    "edge_attribution",
    "faithfulness",
    "grad_cam",
    "input_x_gradient",
    "integrated_gradients",
    "layer_means",
    "logit_lens",
    "patch",
    "patch_sweep",
    "saliency",
    "smoothgrad",
]

from ._ablation import ablate, layer_means
from ._attribution import attribution_patch
from ._circuits import EdgeScores
from ._edges import edge_attribution, faithfulness
from ._gradcam import grad_cam
from ._gradients import input_x_gradient, integrated_gradients, saliency, smoothgrad
from ._lens import logit_lens
from ._nodes import Components
from ._patching import ActivationCache, cache_run, patch
from ._sweeps import patch_sweep
