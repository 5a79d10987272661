"""Activation datasets: many layers of a model over a token stream, on disk.

:func:`write` runs a :class:`~scio_recorder.Recorder` over batches of token
ids and writes the activations of several layers, for the tokens the
padding mask keeps, to a folder of safetensors shards listed by a JSON
manifest: one forward per batch for every layer, optionally shuffled
across the whole set with a bounded buffer, resumable after an
interruption, one set of shards per rank under :mod:`torch.distributed`,
with running statistics on the way. :class:`ActivationDataset` reads the
folder back as a memory-mapped :class:`torch.utils.data.Dataset`.

Why: probes, sparse autoencoders and transcoders train on millions of
tokens' activations; the loop that makes such a set (padding, shuffling,
shards, crashes, ranks) is easy to get subtly wrong, and a set is only
useful if something reads it back fast. The format and the reasons for it
are in ``docs/activations.md``.

This package is the public face; its private modules, one concept each:

* ``_write``: :func:`write`, its options, the folder's state (return,
  refuse, resume, append), the lock, the ranks;
* ``_loop``: one rank's loop, shards and checkpoints;
* ``_tokens``: layers resolved and named, batches to arguments and masks,
  the kept rows of a record, casts;
* ``_shuffle``: the shuffle buffer;
* ``_shards``: safetensors shards written without a copy, mapped back;
* ``_manifest``: the set's manifest, checked and assembled;
* ``_parts``: parts written by independent workers (``write(...,
  part=K, parts=N)``, no process group) and :func:`merge`;
* ``_dataset``: :class:`ActivationDataset`;
* ``_arrow``: the set exported as Arrow files, which Hugging Face
  ``datasets`` opens (``ActivationDataset.to_arrow``);
* ``_sparse``: :class:`SparseLatents`, an SAE's latents stored sparsely;
* ``_stream``: :func:`token_batches` (a stream's batches as ``write`` takes
  them, for tools that measure over the same tokens).

Examples
--------
>>> import tempfile, torch, transformers
>>> from scio_recorder import Recorder
>>> from scio_recorder.activations import write
>>> model = transformers.GPT2Model(
...     transformers.GPT2Config(
...         n_layer=2,
...         n_embd=8,
...         n_head=2,
...         vocab_size=20,
...         n_positions=16,
...         bos_token_id=0,
...         eos_token_id=0,
...     )
... ).eval()
>>> ids = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(0))
>>> rnet = Recorder(model, input_data={"input_ids": ids})
>>> with tempfile.TemporaryDirectory() as folder:
...     ds = write(rnet, [ids], folder, layers=["h.0", "h.1"], mask=None)
...     len(ds), {name: tuple(v.shape) for name, v in ds[0].items()}
(12, {'h.0': (8,), 'h.1': (8,)})

"""

from __future__ import annotations

__all__ = [
    "MANIFEST",
    "ActivationDataset",
    "SparseLatents",
    "TokenBatch",
    "merge",
    "token_batches",
    "write",
]

from ._dataset import ActivationDataset
from ._manifest import MANIFEST
from ._parts import merge
from ._sparse import SparseLatents
from ._stream import TokenBatch, token_batches
from ._write import write
