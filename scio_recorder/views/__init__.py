"""Interactive views: attention, logit lens, patching grids, layer tables, OoD results.

Each function returns a :class:`View`: one self-contained HTML page (its
data, style and script inline; nothing is loaded from the network, so it
works offline and in an exported notebook) that Jupyter shows, that
``.save("x.html")`` writes, and whose static picture (matplotlib, the
``plot`` extra) ``.figure()`` returns and ``.save("x.png")`` writes.

| view | shows | hover shows |
|---|---|---|
| :func:`attention_view` | attention per head | a weight; a token's row |
| :func:`lens_view` | :func:`~scio_recorder.explain.logit_lens` | the top-k tokens |
| :func:`patching_view` | :func:`~scio_recorder.explain.patch_sweep` | the value |
| :func:`layer_view` | the layer table as a tree | shapes, parameters |
| :func:`ood_view` | :func:`~scio_recorder.ood.evaluate` | bin counts, ROC points |
| :func:`circuit_view` | a circuit (``edge_attribution``) | an edge's score |
| :func:`token_view` | a text shaded by per-token scores | a token's score |

The attention weights are recorded (eager attention), or recomputed from
recorded queries and keys by :func:`attention_from_qk`.

Importing this package loads neither matplotlib nor the OoD catalogue:
they load when a picture is drawn or OoD results are read.

This package is the public face; one view a private module (``_attention``,
``_lens``, ``_patching``, ``_layers``, ``_ood``), the page shell in
``_base``, the scripts and styles in ``_static/``.

Examples
--------
>>> import torch
>>> from scio_recorder.views import patching_view
>>> view = patching_view(torch.eye(2), layers=["a", "b"], metric="recovered")
>>> view
<patching view: Activation patching>
>>> "<script>" in view.html()
True
"""

from __future__ import annotations

__all__ = [
    "View",
    "attention_from_qk",
    "attention_view",
    "circuit_view",
    "layer_view",
    "lens_view",
    "ood_view",
    "patching_view",
    "token_view",
]

from ._attention import attention_from_qk, attention_view
from ._base import View
from ._circuit import circuit_view
from ._layers import layer_view
from ._lens import lens_view
from ._ood import ood_view
from ._patching import patching_view
from ._tokens import token_view
