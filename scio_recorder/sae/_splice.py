"""Splicing an SAE into a pass: :func:`splice` and :class:`Splice`.

A splice is an activation postprocessor, ``rnet(x,
activation_postproc={label: sp})``: at that call, the output ``y`` is
encoded, the latents are kept (:attr:`Splice.latents`), optionally edited,
and decoded, and the net goes on with

* ``decode(edit(f))`` (``keep_error=False``): the SAE's reconstruction
  replaces the layer's output, which is what "the model with the SAE
  spliced in" means in the SAE literature;
* ``y + decode(edit(f)) - decode(f)`` (``keep_error=True``): SAELens's
  ``use_error_term``, the error ``y - decode(f)`` kept. Without an edit
  the output is left exactly as it was (the postprocessor returns
  ``None``): the model computes what it computes unspliced, bit for bit,
  while the latents are read. With an edit, the change is computed as
  :meth:`SparseAutoencoder.decode_change` of ``edit(f) - f``, so latents
  the edit leaves alone contribute exactly nothing.

A transcoder reads one vector and writes another: ``sp.read`` is placed
where it reads (an ``activation_postproc`` for an output, an
``input_postproc`` for a module's input), ``sp`` where it writes, and the
read of each pass is consumed by the write of the same pass.

Why a postprocessor and not a hook: it goes wherever edits go (``rnet(...)``
and every step of ``rnet.generate``, any label of any model, edits keyed by
selector), and :func:`~scio_recorder.sae.attach` installs the same object
in the net for the tools that run their own passes.
"""

from __future__ import annotations

__all__ = ["Splice", "splice"]

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ._autoencoder import SparseAutoencoder

if TYPE_CHECKING:
    from torch import nn

LatentEdit = Callable[[Tensor], "Tensor | None"]
"""``edit(latents) -> latents or None`` (``None``: edited in place)."""


def _first(value: Any, what: str) -> tuple[Tensor, Callable[[Tensor], Any]]:
    """Return the tensor ``value`` stands for and how to put a new one in its place."""
    if isinstance(value, Tensor):
        return value, lambda new: new
    if isinstance(value, tuple | list) and value and isinstance(value[0], Tensor):
        cls = type(value)
        rest = list(value[1:])
        if cls is tuple or cls is list:
            return value[0], lambda new: cls([new, *rest])
        if hasattr(cls, "_fields"):  # a named tuple
            return value[0], lambda new: cls(new, *rest)
    msg = (
        f"A splice {what} a tensor, or a tuple whose first item is one; this "
        f"call gives a {type(value).__name__}: splice a layer whose output is "
        "the vectors the SAE reads (a block, an MLP, an attention output)."
    )
    raise TypeError(msg)


class Splice:
    """An SAE spliced at one call: the postprocessor :func:`splice` returns.

    Attributes
    ----------
    sae : SparseAutoencoder
        The SAE (or transcoder).
    keep_error : bool
        Whether the error term is kept.
    edit : callable or None
        The edit of the latents, if any.
    latents : Tensor or None
        What ``sae.encode`` gave at the latest call (before the edit),
        ``[..., d_sae]``: after a pass, that pass's; under ``generate``, the
        latest step's.
    steps : list of Tensor
        With ``keep_steps=True``, the latents of every call since the
        splice was made or :meth:`clear` was called: one per step of
        ``generate``.
    """

    def __init__(
        self,
        sae: SparseAutoencoder,
        *,
        keep_error: bool,
        edit: LatentEdit | Sequence[LatentEdit] | None,
        keep_steps: bool,
    ) -> None:
        self.sae = sae
        self.keep_error = keep_error
        self.edit = edit
        self.keep_steps = keep_steps
        self.latents: Tensor | None = None
        self.steps: list[Tensor] = []
        self._local = threading.local()

    def __repr__(self) -> str:
        options = [repr(self.sae)]
        if self.keep_error:
            options.append("keep_error=True")
        if self.edit is not None:
            options.append(f"edit={self.edit!r}")
        return f"splice({', '.join(options)})"

    def clear(self) -> None:
        """Forget the latents kept (:attr:`latents` and :attr:`steps`)."""
        self.latents = None
        self.steps = []

    # -- the two ends ------------------------------------------------------

    def read(self, value: Any) -> None:
        """Keep a transcoder's input for this pass's write; change nothing.

        Place it where the transcoder reads: ``activation_postproc={reads:
        sp.read, writes: sp}``, or ``input_postproc={module: sp.read}`` for
        a module's input.
        """
        if not self.sae.transcoder:
            msg = (
                "`sp.read` is where a transcoder reads; this SAE reads and writes "
                "the same vectors: place `sp` alone, where it reads."
            )
            raise TypeError(msg)
        self._local.pending = _first(value, "reads")[0]

    def __call__(self, output: Any) -> Any:
        """Return the output that replaces ``output`` (``None``: unchanged)."""
        return self.apply(output)

    def apply(self, output: Any, through: nn.Module | None = None) -> Any:
        """Splice at ``output``; ``through`` (a module) sees the latents first.

        What :meth:`__call__` does; :func:`~scio_recorder.sae.attach` passes
        the identity module whose output is the latents' layer.
        """
        y, rebuild = _first(output, "edits")
        sae = self.sae
        if sae.transcoder:
            x = getattr(self._local, "pending", None)
            self._local.pending = None
            if x is None:
                msg = (
                    "This transcoder's input was not read in this pass: place "
                    "`sp.read` where it reads, called before `sp` in the forward "
                    "(`activation_postproc={reads: sp.read, writes: sp}`, or "
                    "`input_postproc={module: sp.read}`)."
                )
                raise RuntimeError(msg)
        else:
            x = y
        latents = sae.encode(x)
        if through is not None:
            latents = through(latents)
        self.latents = latents
        if self.keep_steps:
            self.steps.append(latents)
        edited = self._edited(latents)
        if self.keep_error:
            if edited is None:
                return None
            change = sae.decode_change(edited - latents, x=x)
            new = y + change.to(y.dtype)
        else:
            decoded = sae.decode(latents if edited is None else edited, x=x)
            if decoded.shape != y.shape:
                msg = (
                    f"The SAE writes vectors of shape {list(decoded.shape)} where "
                    f"this call's output is {list(y.shape)}: splice it where its "
                    "output goes (a transcoder's `d_out` is its output layer's "
                    "width)."
                )
                raise ValueError(msg)
            new = decoded.to(y.dtype)
        return rebuild(new)

    def _edited(self, latents: Tensor) -> Tensor | None:
        """Return the edited copy of ``latents`` (``None``: no edit)."""
        if self.edit is None:
            return None
        edits = [self.edit] if callable(self.edit) else list(self.edit)
        value = latents.clone()
        for edit in edits:
            out = edit(value)
            if out is not None:
                if not isinstance(out, Tensor) or out.shape != latents.shape:
                    shape = list(out.shape) if isinstance(out, Tensor) else None
                    msg = (
                        f"The edit {edit!r} returned {type(out).__name__} of shape "
                        f"{shape}; an edit returns the latents "
                        f"{list(latents.shape)} (or None, having changed them in "
                        "place)."
                    )
                    raise ValueError(msg)
                value = out
        return value


def splice(
    sae: SparseAutoencoder,
    *,
    keep_error: bool = False,
    edit: LatentEdit | Sequence[LatentEdit] | None = None,
    keep_steps: bool = False,
) -> Splice:
    """Return a postprocessor splicing ``sae`` into a call: ``{label: splice(sae)}``.

    At that call the output ``y`` is encoded, the latents kept in
    ``sp.latents``, edited, decoded, and the net goes on with the
    reconstruction; with ``keep_error=True``, with ``y`` plus the change the
    edit makes to the reconstruction (``y`` itself, exactly, without an
    edit).

    Parameters
    ----------
    sae : SparseAutoencoder
        The SAE or transcoder (on the model's device).
    keep_error : bool, default False
        Keep the SAE's error term: the model computes what it computes
        unspliced, while the latents are read (and edits act on it).
    edit : callable or list of callables, optional
        ``edit(latents) -> latents or None``, applied in order to a copy of
        each call's latents ``[..., d_sae]`` before decoding:
        :func:`~scio_recorder.sae.zero`, :func:`~scio_recorder.sae.scale`,
        :func:`~scio_recorder.sae.set_to`, :func:`~scio_recorder.sae.clamp`,
        or your own.
    keep_steps : bool, default False
        Keep every call's latents in ``sp.steps`` (under ``generate``: one
        per step), not only the latest in ``sp.latents``; empty it with
        ``sp.clear()``.

    Returns
    -------
    Splice
        Pass it as ``activation_postproc={label: sp}`` (a transcoder:
        ``{reads: sp.read, writes: sp}``), or to
        :func:`~scio_recorder.sae.attach`.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.sae import SparseAutoencoder, splice, zero
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    >>> rnet = Recorder(net, input_size=(1, 4))
    >>> sae = SparseAutoencoder(8, 16, activation="topk", k=3)
    >>> x = torch.randn(5, 4)
    >>> sp = splice(sae, keep_error=True)
    >>> torch.equal(rnet(x, activation_postproc={"0": sp}), net(x))
    True
    >>> sp.latents.shape, int((sp.latents != 0).sum(-1).max())
    (torch.Size([5, 16]), 3)
    >>> ablated = splice(sae, edit=zero([0, 1]))
    >>> out = rnet(x, activation_postproc={"0": ablated})
    >>> torch.equal(out, net[1](sae.decode(zero([0, 1])(sae.encode(net[0](x))))))
    True

    """
    if not isinstance(sae, SparseAutoencoder):
        msg = (
            f"`splice` takes a SparseAutoencoder, not a {type(sae).__name__}: "
            "build one with `SparseAutoencoder.from_state(...)` or `load_saelens`."
        )
        raise TypeError(msg)
    for name, flag in (("keep_error", keep_error), ("keep_steps", keep_steps)):
        if not isinstance(flag, bool):
            msg = f"`{name}` must be True or False, got {flag!r}."
            raise TypeError(msg)
    if (
        edit is not None
        and not callable(edit)
        and (not isinstance(edit, Sequence) or not all(callable(e) for e in edit))
    ):
        msg = (
            f"`edit` must be a function of the latents or a list of them "
            f"(`zero(...)`, `scale(...)`, ...), got {edit!r}."
        )
        raise TypeError(msg)
    return Splice(sae, keep_error=keep_error, edit=edit, keep_steps=keep_steps)
