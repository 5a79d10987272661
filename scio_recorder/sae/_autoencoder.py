"""The sparse autoencoder as a module: :class:`SparseAutoencoder`.

One class covers the families in use, with SAELens's parameter names and
shapes (``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_out]``,
``b_dec [d_out]``), so that a SAELens state dict loads as it is:

* ``activation="relu"`` (SAELens's "standard"), ``"topk"`` (the ``k``
  largest pre-activations, then ReLU) and ``"jumprelu"`` (ReLU, zero where
  the pre-activation is not above ``threshold``);
* ``apply_b_dec_to_input``: ``b_dec`` subtracted from the input first;
* transcoders (``transcoder=True``): the input is read at one place and the
  output written at another (``d_out`` may differ from ``d_in``), with an
  optional skip connection ``W_skip [d_out, d_in]``;
* the input normalisations SAELens applies at inference
  (``"constant_norm_rescale"``, ``"layer_norm"``; the others are folded into
  the weights and act as ``"none"``), TopK's
  ``rescale_acts_by_decoder_norm``, and ``hook_z`` inputs ``[..., heads,
  head_dim]``.

Why one class and plain tensors: the formulas are SAELens's, line for line
(the parity tests compare them with SAELens itself), but nothing here is
stateful: where SAELens keeps an input's normalisation between ``encode``
and ``decode`` on the module, :meth:`SparseAutoencoder.decode` takes the
input (``x=``) instead, so that one SAE serves several threads and layers.

Low precision: weights are held in the dtype given. With float16 or
bfloat16 weights, the input is normalised and ``b_dec`` subtracted in
float32, the product with ``W_enc`` runs in the weights' dtype, and the
bias, the activation (the threshold's comparison, the top-k) and the
latents are float32: the choice of which latents fire is not left to a
rounding of the pre-activations.
"""

from __future__ import annotations

__all__ = ["ACTIVATIONS", "NORMALIZATIONS", "SparseAutoencoder"]

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from typing_extensions import Self

ACTIVATIONS = ("relu", "topk", "jumprelu")
"""The activations :class:`SparseAutoencoder` computes."""

NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")
"""The input normalisations it applies at inference (SAELens's names)."""

_LOW = (torch.float16, torch.bfloat16)
_LN_EPS = 1e-5  # SAELens's layer-norm epsilon


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        msg = f"`{name}` must be one of {listed}, got {value!r}."
        raise ValueError(msg)


def _check_k(activation: str, k: object, d_sae: int) -> int | None:
    if activation != "topk":
        if k is not None:
            msg = (
                f"`k={k!r}` is for `activation='topk'`; a {activation} SAE takes "
                "no `k`: leave it out."
            )
            raise ValueError(msg)
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_sae:
        msg = f"A top-k SAE needs `k`, an int from 1 to d_sae = {d_sae}, got {k!r}."
        raise ValueError(msg)
    return k


def _check_shapes(
    tensors: dict[str, Tensor], w_skip: Tensor | None
) -> tuple[int, int, int]:
    """Check ``from_state``'s tensors against each other; return the sizes."""
    for name, value in tensors.items():
        if not isinstance(value, Tensor):
            msg = f"`{name}` must be a tensor, got {type(value).__name__}."
            raise TypeError(msg)
    w_enc, w_dec = tensors["W_enc"], tensors["W_dec"]
    if w_enc.dim() != 2 or w_dec.dim() != 2:  # noqa: PLR2004 (matrices)
        msg = (
            f"`W_enc` must be [d_in, d_sae] and `W_dec` [d_sae, d_out] (as in "
            f"SAELens), got shapes {list(w_enc.shape)} and {list(w_dec.shape)}."
        )
        raise ValueError(msg)
    d_in, d_sae = (int(n) for n in w_enc.shape)
    d_out = int(w_dec.shape[1])
    expected = {"W_dec": [d_sae, d_out], "b_enc": [d_sae], "b_dec": [d_out]}
    for name, shape in expected.items():
        if list(tensors[name].shape) != shape:
            msg = (
                f"`{name}` has shape {list(tensors[name].shape)}, but `W_enc` "
                f"{list(w_enc.shape)} and `W_dec` {list(w_dec.shape)} make it "
                f"{shape} (W_enc is [d_in, d_sae], W_dec [d_sae, d_out], as in "
                "SAELens: pass a transposed matrix as `.T`)."
            )
            raise ValueError(msg)
    if w_skip is not None and list(w_skip.shape) != [d_out, d_in]:
        msg = (
            f"`W_skip` has shape {list(w_skip.shape)}, not [d_out, d_in] = "
            f"{[d_out, d_in]}."
        )
        raise ValueError(msg)
    return d_in, d_sae, d_out


def _check_dtype(dtype: object) -> None:
    """Refuse a parameters' dtype that is not floating point (naming it)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        msg = (
            f"`dtype` must be a floating-point torch.dtype (an SAE's parameters "
            f"are trained), got {dtype!r}."
        )
        raise TypeError(msg)


def _check_finite(name: str, given: Tensor | float, copied: Tensor) -> None:
    """Refuse a tensor of ``from_state`` with a NaN or an infinity, naming it.

    ``given`` is what was passed, ``copied`` its copy in the parameters'
    dtype (a finite value can overflow there).
    """
    bad = ~torch.isfinite(copied)
    if not bool(bad.any()):
        return
    where = [int(i) for i in bad.nonzero()[0]]
    value = copied[tuple(where)].item()
    count = int(bad.sum())
    values = "value" if count == 1 else "values"
    given = torch.as_tensor(given)
    if bool(torch.isfinite(given).all()):
        cause = f"its finite values overflow {copied.dtype}: choose a wider `dtype`"
    else:
        cause = "every latent it reaches would be NaN: pass finite weights"
    msg = (
        f"`{name}` has {count} non-finite {values} (the first, at {where}, is "
        f"{value}): {cause}."
    )
    raise ValueError(msg)


def _thresholds(threshold: Tensor | float, d_sae: int) -> Tensor:
    """Return JumpReLU's thresholds ``[d_sae]`` (one number: the same for all)."""
    value = torch.as_tensor(threshold)
    if value.dim() == 0:
        value = value.expand(d_sae)
    if list(value.shape) != [d_sae]:
        msg = f"`threshold` has shape {list(value.shape)}, not [d_sae] = [{d_sae}]."
        raise ValueError(msg)
    return value


class SparseAutoencoder(nn.Module):
    """A sparse autoencoder or transcoder: ``encode``, ``decode``, ``forward``.

    ``encode(x)`` gives the latents ``[..., d_sae]``, ``decode(f)`` the
    reconstruction ``[..., d_out]``, and ``forward(x) = decode(encode(x))``
    (with the skip connection of a skip transcoder). The parameters are
    SAELens's: ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae,
    d_out]``, ``b_dec [d_out]``, ``threshold [d_sae]`` (JumpReLU),
    ``W_skip [d_out, d_in]`` (skip transcoders). A new module is initialised
    as SAELens does (Kaiming-uniform ``W_dec``, ``W_enc`` its transpose,
    zero biases and thresholds); :meth:`from_state` builds one from tensors
    and :func:`~scio_recorder.sae.load_saelens` from a SAELens folder.

    Parameters
    ----------
    d_in : int
        The size of the vectors read.
    d_sae : int
        The number of latents.
    activation : {"relu", "topk", "jumprelu"}, default "relu"
        ReLU (SAELens's "standard"); the ``k`` largest pre-activations, then
        ReLU; or ReLU where the pre-activation is above ``threshold``, zero
        elsewhere.
    k : int, optional
        The number of latents a top-k SAE keeps (``activation="topk"`` only).
    d_out : int, optional
        The size of the vectors written; default ``d_in``.
    apply_b_dec_to_input : bool, default False
        Subtract ``b_dec`` from the input before encoding (needs ``d_out ==
        d_in``; not for transcoders).
    normalize : {"none", "constant_norm_rescale", "layer_norm"}, default "none"
        SAELens's ``normalize_activations`` applied at inference: each input
        vector scaled to norm ``sqrt(d_in)`` (and the output scaled back), or
        standardised (and the output mapped back by its mean and standard
        deviation; a transcoder's output is not mapped back, as in SAELens).
    rescale_acts_by_decoder_norm : bool, default False
        Top-k only: pre-activations multiplied by the norms of ``W_dec``'s
        rows before the top-k, latents divided by them before decoding.
    transcoder : bool, optional
        Whether the output is written somewhere other than where the input
        is read (see :func:`~scio_recorder.sae.splice`); default: when
        ``d_out != d_in``.
    skip : bool, default False
        A skip connection ``W_skip`` (a skip transcoder).
    hook_z : bool, default False
        Inputs may come as ``[..., heads, head_dim]`` (TransformerLens's
        ``hook_z``), flattened to ``d_in`` first.
    dtype : torch.dtype, optional
        The parameters' dtype (default: torch's default dtype).
    device : torch.device or str, optional
        The parameters' device.

    Attributes
    ----------
    d_in, d_sae, d_out : int
        The sizes.
    activation : str
        The activation.
    k : int or None
        A top-k SAE's ``k``.
    transcoder : bool
        Whether it is a transcoder.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.sae import SparseAutoencoder
    >>> _ = torch.manual_seed(0)
    >>> sae = SparseAutoencoder(8, 32, activation="topk", k=4)
    >>> x = torch.randn(2, 5, 8)
    >>> f = sae.encode(x)
    >>> f.shape, int((f != 0).sum(-1).max()), sae(x).shape
    (torch.Size([2, 5, 32]), 4, torch.Size([2, 5, 8]))
    >>> sae
    SparseAutoencoder(d_in=8, d_sae=32, activation='topk', k=4)

    """

    W_enc: nn.Parameter
    b_enc: nn.Parameter
    W_dec: nn.Parameter
    b_dec: nn.Parameter
    threshold: nn.Parameter | None
    W_skip: nn.Parameter | None

    def __init__(  # noqa: PLR0913 (the documented options)
        self,
        d_in: int,
        d_sae: int,
        *,
        activation: str = "relu",
        k: int | None = None,
        d_out: int | None = None,
        apply_b_dec_to_input: bool = False,
        normalize: str = "none",
        rescale_acts_by_decoder_norm: bool = False,
        transcoder: bool | None = None,
        skip: bool = False,
        hook_z: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for name, size in (("d_in", d_in), ("d_sae", d_sae), ("d_out", d_out)):
            if size is not None and (
                isinstance(size, bool) or not isinstance(size, int) or size < 1
            ):
                msg = f"`{name}` must be an int >= 1, got {size!r}."
                raise ValueError(msg)
        _check_choice("activation", activation, ACTIVATIONS)
        _check_choice("normalize", normalize, NORMALIZATIONS)
        self.d_in, self.d_sae = d_in, d_sae
        self.d_out = d_in if d_out is None else d_out
        self.activation = activation
        self.k = _check_k(activation, k, d_sae)
        self.transcoder = (
            self.d_out != self.d_in if transcoder is None else bool(transcoder)
        )
        if apply_b_dec_to_input and (self.transcoder or self.d_out != self.d_in):
            msg = (
                "`apply_b_dec_to_input=True` subtracts `b_dec` (the output's bias) "
                "from the input, which a transcoder cannot do (its input and "
                "output are different vectors): leave it False."
            )
            raise ValueError(msg)
        if rescale_acts_by_decoder_norm and activation != "topk":
            msg = (
                "`rescale_acts_by_decoder_norm=True` is an option of top-k SAEs "
                f"(SAELens's), not of a {activation} SAE: leave it False."
            )
            raise ValueError(msg)
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        self.normalize = normalize
        self.rescale_acts_by_decoder_norm = bool(rescale_acts_by_decoder_norm)
        self.hook_z = bool(hook_z)
        if dtype is not None:
            _check_dtype(dtype)
        options: dict[str, Any] = {"dtype": dtype, "device": device}
        w_dec = torch.empty(d_sae, self.d_out, **options)
        nn.init.kaiming_uniform_(w_dec)
        self.W_dec = nn.Parameter(w_dec)
        if self.d_out == d_in:
            self.W_enc = nn.Parameter(w_dec.detach().T.clone().contiguous())
        else:
            w_enc = torch.empty(d_in, d_sae, **options)
            nn.init.kaiming_uniform_(w_enc)
            self.W_enc = nn.Parameter(w_enc)
        self.b_enc = nn.Parameter(torch.zeros(d_sae, **options))
        self.b_dec = nn.Parameter(torch.zeros(self.d_out, **options))
        self.threshold = (
            nn.Parameter(torch.zeros(d_sae, **options))
            if activation == "jumprelu"
            else None
        )
        self.W_skip = (
            nn.Parameter(torch.zeros(self.d_out, d_in, **options)) if skip else None
        )
        self.config: dict[str, Any] | None = None
        """The SAELens config it was read from, by :func:`load_saelens`."""

    # -- construction from tensors ------------------------------------------

    @classmethod
    def from_state(  # noqa: PLR0913 (SAELens's tensors and options)
        cls,
        *,
        W_enc: Tensor,  # noqa: N803 (SAELens's names)
        b_enc: Tensor,
        W_dec: Tensor,  # noqa: N803 (SAELens's names)
        b_dec: Tensor,
        activation: str = "relu",
        k: int | None = None,
        threshold: Tensor | float | None = None,
        apply_b_dec_to_input: bool = False,
        W_skip: Tensor | None = None,  # noqa: N803 (SAELens's names)
        normalize: str = "none",
        rescale_acts_by_decoder_norm: bool = False,
        transcoder: bool | None = None,
        hook_z: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Self:
        """Build an SAE from plain tensors (copied), laid out as in SAELens.

        Parameters
        ----------
        W_enc : Tensor
            ``[d_in, d_sae]``.
        b_enc : Tensor
            ``[d_sae]``.
        W_dec : Tensor
            ``[d_sae, d_out]``.
        b_dec : Tensor
            ``[d_out]``.
        activation : {"relu", "topk", "jumprelu"}, default "relu"
            As for the class.
        k : int, optional
            For ``"topk"`` (required there, refused elsewhere).
        threshold : Tensor or float, optional
            For ``"jumprelu"`` (required there, refused elsewhere): one per
            latent ``[d_sae]``, or one for all.
        apply_b_dec_to_input : bool, default False
            Subtract ``b_dec`` from the input first.
        W_skip : Tensor, optional
            ``[d_out, d_in]``: a skip transcoder's skip connection.
        normalize, rescale_acts_by_decoder_norm, transcoder, hook_z
            As for the class.
        dtype : torch.dtype, optional
            The parameters' dtype; default ``W_enc``'s.
        device : torch.device or str, optional
            The parameters' device; default ``W_enc``'s.

        Returns
        -------
        SparseAutoencoder

        Raises
        ------
        ValueError
            If the shapes do not fit together, or ``k`` or ``threshold`` is
            missing where it is needed or given where it is not, or a tensor
            has a NaN or an infinity (named).
        TypeError
            If the weights (with no ``dtype``) or ``dtype`` are not floating
            point.

        Examples
        --------
        >>> import torch
        >>> from scio_recorder.sae import SparseAutoencoder
        >>> W = torch.tensor([[1.0, -1.0], [0.0, 2.0]])  # d_in 2, d_sae 2
        >>> sae = SparseAutoencoder.from_state(
        ...     W_enc=W, b_enc=torch.zeros(2), W_dec=W.T, b_dec=torch.zeros(2),
        ...     activation="jumprelu", threshold=0.5,
        ... )  # fmt: skip
        >>> sae.encode(torch.tensor([[1.0, 1.0]]))  # pre-activations 1 and 1
        tensor([[1., 1.]], grad_fn=<MulBackward0>)
        >>> sae.encode(torch.tensor([[0.4, 2.0]]))  # 0.4 is not above 0.5
        tensor([[0.0000, 3.6000]], grad_fn=<MulBackward0>)

        """
        tensors = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}
        d_in, d_sae, d_out = _check_shapes(tensors, W_skip)
        if (threshold is None) == (activation == "jumprelu"):
            msg = (
                "A JumpReLU SAE needs `threshold` (a tensor [d_sae] or a number)."
                if threshold is None
                else f"`threshold` is for `activation='jumprelu'`, not {activation!r}: "
                "leave it out."
            )
            raise ValueError(msg)
        if dtype is None and not W_enc.is_floating_point():
            msg = (
                f"`W_enc` has dtype {W_enc.dtype}, but an SAE's weights are floating "
                "point: pass floating-point tensors (`W_enc.float()`), or choose "
                "the parameters' dtype with `dtype=torch.float32`."
            )
            raise TypeError(msg)
        dtype = W_enc.dtype if dtype is None else dtype
        _check_dtype(dtype)
        device = W_enc.device if device is None else device
        sae = cls(
            d_in,
            d_sae,
            activation=activation,
            k=k,
            d_out=d_out,
            apply_b_dec_to_input=apply_b_dec_to_input,
            normalize=normalize,
            rescale_acts_by_decoder_norm=rescale_acts_by_decoder_norm,
            transcoder=transcoder,
            skip=W_skip is not None,
            hook_z=hook_z,
            dtype=dtype,
            device="meta",
        )
        state = dict(tensors)
        if threshold is not None:
            state["threshold"] = _thresholds(threshold, d_sae)
        if W_skip is not None:
            state["W_skip"] = W_skip
        copied = {
            name: value.detach()
            .to(device=device, dtype=dtype)
            .clone(memory_format=torch.contiguous_format)
            for name, value in state.items()
        }
        for name, value in copied.items():
            _check_finite(name, state[name], value)
        sae.load_state_dict(copied, assign=True)
        return sae

    # -- the maps -------------------------------------------------------------

    def extra_repr(self) -> str:
        """Sizes and options that differ from the defaults."""
        parts = [f"d_in={self.d_in}", f"d_sae={self.d_sae}"]
        if self.d_out != self.d_in:
            parts.append(f"d_out={self.d_out}")
        parts.append(f"activation={self.activation!r}")
        if self.k is not None:
            parts.append(f"k={self.k}")
        flags = {
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "rescale_acts_by_decoder_norm": self.rescale_acts_by_decoder_norm,
            "hook_z": self.hook_z,
            "skip": self.W_skip is not None,
        }
        parts += [f"{name}=True" for name, on in flags.items() if on]
        if self.transcoder and self.d_out == self.d_in:
            parts.append("transcoder=True")
        if self.normalize != "none":
            parts.append(f"normalize={self.normalize!r}")
        if self.W_enc.dtype != torch.get_default_dtype():
            parts.append(f"dtype={self.W_enc.dtype}")
        return ", ".join(parts)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the encoder's activation and of the latents.

        float32 for float16 and bfloat16 weights, else the weights' dtype.
        """
        dtype = self.W_enc.dtype
        return torch.float32 if dtype in _LOW else dtype

    def _flat(self, x: Tensor) -> Tensor:
        """Return ``x`` as ``[..., d_in]``, checked (``hook_z`` inputs flattened)."""
        if not isinstance(x, Tensor):
            msg = f"An SAE encodes a tensor, not a {type(x).__name__}."
            raise TypeError(msg)
        if (
            self.hook_z
            and x.dim() >= 2  # noqa: PLR2004 (heads, head_dim)
            and x.shape[-1] != self.d_in
            and x.shape[-2] * x.shape[-1] == self.d_in
        ):
            x = x.flatten(-2)
        if x.dim() == 0 or x.shape[-1] != self.d_in:
            msg = (
                f"This SAE reads vectors of size d_in = {self.d_in}, but got a "
                f"tensor of shape {list(x.shape)}: apply it to the layer it was "
                "trained on (a transcoder reads where `splice(...).read` is "
                "placed)."
            )
            raise ValueError(msg)
        return x

    def _normalised(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Return the input as the encoder reads it, and what maps the output back.

        The input cast to the compute dtype, normalised, ``b_dec`` subtracted
        (in SAELens's order).
        """
        sae_in = x.to(self.compute_dtype)
        stats: tuple[Tensor, ...] = ()
        if self.normalize == "constant_norm_rescale":
            coeff = (self.d_in**0.5) / sae_in.norm(dim=-1, keepdim=True)
            sae_in = sae_in * coeff
            stats = (coeff,)
        elif self.normalize == "layer_norm":
            mu = sae_in.mean(dim=-1, keepdim=True)
            sae_in = sae_in - mu
            std = sae_in.std(dim=-1, keepdim=True)
            sae_in = sae_in / (std + _LN_EPS)
            stats = (mu, std)
        if self.apply_b_dec_to_input:
            sae_in = sae_in - self.b_dec.to(sae_in.dtype)
        return sae_in, stats

    def pre_activations(self, x: Tensor) -> Tensor:
        """Return the encoder's pre-activations ``[..., d_sae]``.

        For a top-k SAE with ``rescale_acts_by_decoder_norm``, multiplied by
        the decoder's row norms (what the top-k ranks).
        """
        return self._pre(self._normalised(self._flat(x))[0])

    def _pre(self, sae_in: Tensor) -> Tensor:
        w = self.W_enc
        if w.dtype in _LOW:
            pre = (sae_in.to(w.dtype) @ w).float() + self.b_enc.float()
        else:
            pre = sae_in @ w + self.b_enc
        if self.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1).to(pre.dtype)
        return pre

    def _activate(self, pre: Tensor) -> Tensor:
        if self.activation == "relu":
            return pre.relu()
        if self.activation == "topk":
            assert self.k is not None  # noqa: S101 (set with the activation)
            values, indices = torch.topk(pre, k=self.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, indices, values.relu())
        assert self.threshold is not None  # noqa: S101 (set with the activation)
        mask = (pre > self.threshold.to(pre.dtype)).to(pre.dtype)
        return pre.relu() * mask

    def encode(self, x: Tensor) -> Tensor:
        """Return the latents ``[..., d_sae]`` of ``x`` (``[..., d_in]``).

        In :attr:`compute_dtype` (float32 for low-precision weights).

        Raises
        ------
        ValueError
            If the last dimension of ``x`` is not ``d_in``.
        """
        sae_in, _ = self._normalised(self._flat(x))
        return self._activate(self._pre(sae_in))

    def _stats(self, x: Tensor | None) -> tuple[Tensor, ...]:
        """Return what maps the output back for input ``x`` (``()``: nothing)."""
        if self.normalize == "none" or self.transcoder:
            return ()
        if x is None:
            msg = (
                f"This SAE normalises each input vector ({self.normalize!r}), so "
                "its output is mapped back with the input's own scale: call "
                "`decode(latents, x=x)` with the input that was encoded."
            )
            raise ValueError(msg)
        return self._normalised(self._flat(x))[1]

    def _decoder_input(self, latents: Tensor) -> Tensor:
        if latents.shape[-1] != self.d_sae:
            msg = (
                f"This SAE decodes latents of size d_sae = {self.d_sae}, but got a "
                f"tensor of shape {list(latents.shape)}."
            )
            raise ValueError(msg)
        f = latents.to(self.W_dec.dtype)
        if self.rescale_acts_by_decoder_norm:
            f = f * (1 / self.W_dec.norm(dim=-1))
        return f

    def decode(self, latents: Tensor, *, x: Tensor | None = None) -> Tensor:
        """Return the reconstruction ``[..., d_out]`` of ``latents``.

        Parameters
        ----------
        latents : Tensor
            ``[..., d_sae]``.
        x : Tensor, optional
            The input that was encoded: needed by an SAE that normalises its
            input (the output is mapped back to that input's scale); with it,
            a skip transcoder adds its skip connection, and a ``hook_z`` input
            ``[..., heads, head_dim]`` gets its shape back. SAELens's
            ``decode`` reads the normalisation its last ``encode`` left on
            the module instead.

        Returns
        -------
        Tensor
            In the weights' dtype.
        """
        out = self._decoder_input(latents) @ self.W_dec + self.b_dec
        stats = self._stats(x)
        if len(stats) == 1:
            out = out / stats[0].to(out.dtype)
        elif stats:
            mu, std = stats
            out = out * std.to(out.dtype) + mu.to(out.dtype)
        if x is not None:
            if self.W_skip is not None:
                out = out + self._flat(x).to(out.dtype) @ self.W_skip.T
            if self.hook_z and x.shape[-1] != self.d_in and out.shape[-1] == self.d_in:
                out = out.reshape(*out.shape[:-1], *x.shape[-2:])
        return out

    def decode_change(self, change: Tensor, *, x: Tensor | None = None) -> Tensor:
        """Return ``decode(a, x=x) - decode(b, x=x)`` for ``change = a - b``, directly.

        The decoder is affine: the difference is ``change @ W_dec`` (scaled
        back for a normalising SAE), with no bias and no skip connection, so
        latents left unchanged contribute exactly zero. What
        :func:`~scio_recorder.sae.splice` adds to a layer's output with
        ``keep_error=True`` and an edit.
        """
        out = self._decoder_input(change) @ self.W_dec
        stats = self._stats(x)
        if len(stats) == 1:
            out = out / stats[0].to(out.dtype)
        elif stats:
            out = out * stats[1].to(out.dtype)
        if (
            x is not None
            and self.hook_z
            and x.shape[-1] != self.d_in
            and out.shape[-1] == self.d_in
        ):
            out = out.reshape(*out.shape[:-1], *x.shape[-2:])
        return out

    def forward(self, x: Tensor) -> Tensor:
        """Return ``decode(encode(x), x=x)``: the reconstruction (or transcoding)."""
        return self.decode(self.encode(x), x=x)
