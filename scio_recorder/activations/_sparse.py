"""An SAE's latents of a layer, stored sparsely: :class:`SparseLatents`.

``write(..., layers={"latents": SparseLatents(sae, "transformer.h.6",
k=32)})`` encodes each kept token's vector of the layer with
``sae.encode`` and stores, per token, ``k`` (index, value) pairs: the ``k``
latents largest in magnitude, largest first. That is every nonzero latent
of a top-k SAE with that ``k``, and of any SAE at a token with at most
``k`` nonzeros (the other pairs hold the value 0); with
``nonzeros=True``, a token with more than ``k`` nonzeros stops the write,
naming the count, so nothing is dropped silently.

The pairs of a token are packed into one ``uint8`` column of the shard
(the values' bytes, then the indices': int16 below 32,768 latents, else
int32), so that the shuffle buffer, shards, checkpoints, resumption and
appends treat the column as any other; the manifest's entry for the layer
says how to unpack it (``"sparse": {"size", "k", "values", "indices",
"nonzeros"}``), and :class:`~scio_recorder.activations.ActivationDataset`
gives the latents back dense (``[d_sae]`` per token) or as the pairs.

Why here and not in :mod:`scio_recorder.sae`: the set's format is this
package's; an SAE is anything with ``encode`` and ``d_sae``.
"""

from __future__ import annotations

__all__ = [
    "SparseLatents",
    "densify",
    "sparse_info",
    "unpack",
]

import hashlib
import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from scio_recorder._support.files import dtype_name, parse_dtype

if TYPE_CHECKING:
    from collections.abc import Mapping

_INT16_LATENTS = 1 << 15  # int16 holds the indices 0 .. 32767


def _item_size(dtype: torch.dtype) -> int:
    """Return the bytes of one element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


class SparseLatents:
    """A ``layers=`` entry of :func:`write`: an SAE's latents of a layer, sparse.

    Parameters
    ----------
    sae : SparseAutoencoder or any object with ``encode`` and ``d_sae``
        Its ``encode(rows)`` maps the layer's kept vectors ``[tokens, d]`` to
        latents ``[tokens, d_sae]``.
    layer : selector
        The layer the SAE reads, as in ``layers=`` (a transcoder reads an
        input: ``InputOf("...mlp")``).
    k : int, optional
        The (index, value) pairs stored per token; default the SAE's ``k`` (a
        top-k SAE's).
    nonzeros : bool, default False
        Store every nonzero latent: ``k`` is then the most a token may have,
        and a token with more stops the write (``False``: the ``k`` largest,
        the rest dropped).

    Examples
    --------
    >>> import tempfile, torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.activations import ActivationDataset, SparseLatents, write
    >>> from scio_recorder.sae import SparseAutoencoder
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    >>> rnet = Recorder(net, input_data=torch.zeros(1, 2, dtype=torch.long))
    >>> sae = SparseAutoencoder(8, 64, activation="topk", k=4)
    >>> ids = torch.arange(10).reshape(2, 5)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     ds = write(rnet, [ids], folder, mask=None,
    ...                layers={"f": SparseLatents(sae, "1")})  # fmt: skip
    ...     dense = ds[:3]["f"]
    ...     pairs = ActivationDataset(folder, latents="sparse")[:3]
    >>> dense.shape, sorted(pairs), pairs["f.indices"].shape
    (torch.Size([3, 64]), ['f.indices', 'f.values'], torch.Size([3, 4]))
    >>> torch.equal(dense, sae.encode(net(ids).reshape(10, 8))[:3])
    True

    """

    def __init__(
        self,
        sae: Any,
        layer: Any,
        *,
        k: int | None = None,
        nonzeros: bool = False,
    ) -> None:
        size = getattr(sae, "d_sae", None)
        if not callable(getattr(sae, "encode", None)) or not isinstance(size, int):
            msg = (
                f"`SparseLatents` takes an SAE (an object with `encode` and "
                f"`d_sae`, e.g. a `scio_recorder.sae.SparseAutoencoder`), got "
                f"{type(sae).__name__}."
            )
            raise TypeError(msg)
        if k is None:
            k = getattr(sae, "k", None)
            if k is None:
                msg = (
                    "`SparseLatents` needs `k`, the (index, value) pairs stored per "
                    "token (a top-k SAE gives its own): e.g. `k=64`, with "
                    "`nonzeros=True` to refuse tokens with more nonzero latents."
                )
                raise ValueError(msg)
        try:
            k = operator.index(k)
        except TypeError as error:
            msg = f"`k` must be an int, got {k!r}."
            raise TypeError(msg) from error
        if not 1 <= k <= size:
            msg = f"`k` must be from 1 to the SAE's {size} latents, got {k}."
            raise ValueError(msg)
        if not isinstance(nonzeros, bool):
            msg = f"`nonzeros` must be True or False, got {nonzeros!r}."
            raise TypeError(msg)
        self.sae, self.layer, self.k, self.nonzeros = sae, layer, k, nonzeros
        self.size = size
        self._digest: tuple[tuple[int, ...], str] | None = None

    def __repr__(self) -> str:
        extra = ", nonzeros=True" if self.nonzeros else ""
        return f"SparseLatents({self.sae!r}, {self.layer!r}, k={self.k}{extra})"

    def index_dtype(self) -> torch.dtype:
        """int16 below 32,768 latents, else int32."""
        return torch.int16 if self.size <= _INT16_LATENTS else torch.int32

    def info(self, dtype: torch.dtype | None) -> dict[str, Any]:
        """Return how the pairs are stored, in the manifest's words."""
        return {
            "size": self.size,
            "k": self.k,
            "values": dtype_name(torch.float32 if dtype is None else dtype),
            "indices": dtype_name(self.index_dtype()),
            "nonzeros": self.nonzeros,
        }

    def row_bytes(self, dtype: torch.dtype | None) -> int:
        """Bytes stored per token."""
        values = torch.float32 if dtype is None else dtype
        return self.k * (_item_size(values) + _item_size(self.index_dtype()))

    def describe(self) -> str:
        """Return the SAE and the storage in words, with a digest of its weights."""
        how = f"every nonzero (at most {self.k})" if self.nonzeros else f"top {self.k}"
        return (
            f"sparse latents ({how} of {self.size}) of "
            f"{type(self.sae).__name__} sha256:{self.weights_digest()[:16]}"
        )

    def weights_digest(self) -> str:
        """Return a digest of the SAE's parameters and buffers (its ``state_dict``)."""
        state = getattr(self.sae, "state_dict", None)
        tensors: Mapping[str, Tensor] = state() if callable(state) else {}
        versions = tuple(t._version for t in tensors.values())  # noqa: SLF001 (torch's in-place counter)
        if self._digest is not None and self._digest[0] == versions:
            return self._digest[1]
        hasher = hashlib.sha256(repr(self.sae).encode())
        for name, value in tensors.items():
            flat = value.detach().to("cpu").contiguous().reshape(-1)
            hasher.update(f"{name}{value.dtype}{list(value.shape)}".encode())
            hasher.update(flat.view(torch.uint8).numpy().tobytes())
        digest = hasher.hexdigest()
        self._digest = (versions, digest)
        return digest

    def pack(
        self, rows: Tensor, name: str, dtype: torch.dtype | None, *, kept: bool = False
    ) -> tuple[Tensor | None, Tensor]:
        """Return the latents stored of ``rows`` (``[tokens, d]``), and their pairs.

        The pairs are ``[tokens, row_bytes]`` ``uint8``: the ``k`` values
        (cast to ``dtype``, default float32), then their indices. With
        ``kept``, the first is the dense ``[tokens, d_sae]`` latents the pairs
        hold (the ``k`` stored, the others 0), before the cast: what the set
        reads back dense, and what ``stats=True`` describes; else ``None``.
        """
        latents = self.sae.encode(rows)
        if not isinstance(latents, Tensor) or list(latents.shape) != [
            rows.shape[0],
            self.size,
        ]:
            shape = list(latents.shape) if isinstance(latents, Tensor) else None
            msg = (
                f"Layer {name!r}: the SAE's `encode` gave {shape} for "
                f"{rows.shape[0]} tokens, not [tokens, d_sae] = "
                f"[{rows.shape[0]}, {self.size}]."
            )
            raise ValueError(msg)
        if self.nonzeros and latents.shape[0]:
            most = int((latents != 0).sum(1).max())
            if most > self.k:
                msg = (
                    f"Layer {name!r}: a token has {most} nonzero latents, more "
                    f"than `k={self.k}` stores with `nonzeros=True`: write the set "
                    f"again with `k={most}` or more (`overwrite=True`), or with "
                    "`nonzeros=False` to keep the largest k."
                )
                raise ValueError(msg)
        values_dtype = torch.float32 if dtype is None else dtype
        indices = latents.abs().topk(self.k, dim=1).indices
        values = latents.gather(1, indices)
        stored = values.to(values_dtype)
        if not bool(torch.isfinite(stored).all()):
            overflow = torch.isinf(stored) & torch.isfinite(values)
            if bool(overflow.any()):
                big = float(values[overflow].abs().max())
                msg = (
                    f"Layer {name!r}: latents up to {big:.4g} overflow "
                    f"{values_dtype}: store them as `dtype=torch.bfloat16` or "
                    "`dtype=torch.float32`."
                )
                raise ValueError(msg)
        packed = torch.cat(
            [
                stored.contiguous().view(torch.uint8),
                indices.to(self.index_dtype()).contiguous().view(torch.uint8),
            ],
            dim=1,
        )
        if not kept:
            return None, packed
        return torch.zeros_like(latents).scatter_(1, indices, values), packed


def sparse_info(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return a manifest layer entry's sparse description, checked (``None``: dense)."""
    info = entry.get("sparse")
    if info is None:
        return None
    try:
        out: dict[str, Any] = {
            "size": int(info["size"]),
            "k": int(info["k"]),
            "values": parse_dtype(info["values"]),
            "indices": parse_dtype(info["indices"]),
            "nonzeros": bool(info["nonzeros"]),
        }
    except (KeyError, TypeError, ValueError) as error:
        msg = f"its 'sparse' entry {info!r} is not valid ({error})"
        raise ValueError(msg) from error
    width = out["k"] * (_item_size(out["values"]) + _item_size(out["indices"]))
    if list(entry.get("shape", [])) != [width] or entry.get("dtype") != "uint8":
        msg = (
            f"its 'sparse' entry {info!r} does not match its shape {entry.get('shape')}"
        )
        raise ValueError(msg)
    return out


def unpack(packed: Tensor, info: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """Return the ``[..., k]`` int64 indices and values packed in ``packed``."""
    split = info["k"] * _item_size(info["values"])
    values = packed[..., :split].contiguous().view(info["values"])
    indices = packed[..., split:].contiguous().view(info["indices"]).to(torch.int64)
    return indices, values


def densify(indices: Tensor, values: Tensor, size: int) -> Tensor:
    """Return the dense ``[..., size]`` latents of (index, value) pairs."""
    shape = (*values.shape[:-1], size)
    return torch.zeros(shape, dtype=values.dtype).scatter_(-1, indices, values)
