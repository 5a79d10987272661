"""What researchers report of an SAE over a token stream: :func:`evaluate`.

For each batch (as :func:`scio_recorder.activations.write` takes them:
padding and, with ``skip_bos``, the first token of each row left out),
three passes of the model: clean (the layer's vectors recorded), with the
SAE spliced (:func:`~scio_recorder.sae.splice`, no error term) and with the
layer's output zero-ablated. Over the kept tokens ``t``, with ``y_t`` the
vectors the SAE should give (a transcoder: the output it writes), ``x_t``
what it reads, ``f_t = encode(x_t)`` and ``ŷ_t = decode(f_t)``:

* ``mse = Σ ||y_t - ŷ_t||² / (N d_out)``, per element as SAELens reports it;
* ``explained_variance = 1 - Σ ||y_t - ŷ_t||² / Σ ||y_t - ȳ||²``, ``ȳ``
  the mean over the whole stream;
* ``l0``: the mean number of nonzero latents per token;
* ``frequency``: per latent, the fraction of tokens where it is nonzero;
  ``dead``: the latents that never are;
* ``loss_clean``, ``loss_spliced``, ``loss_zero``: the next-token
  cross-entropy (mean over the predictions whose position and next
  position are both kept) clean, with the SAE spliced, and with the
  layer zero-ablated; ``loss_recovered = (loss_zero - loss_spliced) /
  (loss_zero - loss_clean)``, the fraction of the loss the SAE recovers;
* ``kl``: the mean over kept positions of ``KL(p_clean || p_spliced) =
  Σ_v p_clean(v) (log p_clean(v) - log p_spliced(v))``, the next-token
  distributions' log-softmax computed in float64.

Sums are float64, fed batch by batch; memory does not grow with the stream.
"""

from __future__ import annotations

__all__ = ["Measures", "evaluate"]

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from torch import Tensor

from scio_recorder.activations import token_batches
from scio_recorder.collect import InputOf
from scio_recorder.select import resolve_one

from ._autoencoder import SparseAutoencoder
from ._splice import _first, splice

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scio_recorder.layers import Layer
    from scio_recorder.recorder import Recorder

_F64 = torch.float64
_KL_CHUNK = 256  # positions of the KL divergence computed at once


@dataclasses.dataclass(frozen=True)
class Measures:
    """The measures of an SAE over a token stream (see :func:`evaluate`).

    Attributes
    ----------
    tokens : int
        The tokens measured.
    mse, explained_variance, l0 : float
        Reconstruction error per element, fraction of variance explained,
        mean nonzero latents per token.
    frequency : Tensor
        ``[d_sae]`` float64: the fraction of tokens where each latent fires.
    dead : int
        Latents that never fire.
    loss_clean, loss_spliced, loss_zero, loss_recovered, kl : float or None
        The language-model measures (``None`` with ``lm=False``).
    """

    tokens: int
    mse: float
    explained_variance: float
    l0: float
    frequency: Tensor
    dead: int
    loss_clean: float | None = None
    loss_spliced: float | None = None
    loss_zero: float | None = None
    loss_recovered: float | None = None
    kl: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        """Return the numbers by name (``frequency`` left out)."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "frequency"
        }

    def table(self, digits: int = 4) -> str:
        """Return the measures as a Markdown table, one row each.

        Examples
        --------
        >>> import torch
        >>> m = Measures(10, 0.5, 0.25, 3.0, torch.zeros(4, dtype=torch.float64), 4)
        >>> print(m.table())
        | measure | value |
        |---|---|
        | tokens | 10 |
        | mse | 0.5 |
        | explained_variance | 0.25 |
        | l0 | 3 |
        | dead | 4 |

        """
        rows = ["| measure | value |", "|---|---|"]
        for name, value in self.as_dict().items():
            if value is None:
                continue
            shown = f"{value:.{digits}g}" if isinstance(value, float) else str(value)
            rows.append(f"| {name} | {shown} |")
        return "\n".join(rows)


class _Sums:
    """The float64 sums the measures are made of."""

    def __init__(self, d_sae: int) -> None:
        self.tokens = 0
        self.sse = 0.0
        self.sum_y: Tensor | None = None
        self.sum_sq = 0.0
        self.nonzero = 0
        self.fired = torch.zeros(d_sae, dtype=torch.int64)
        self.losses = [0.0, 0.0, 0.0]
        self.predictions = 0
        self.kl = 0.0
        self.positions = 0

    def add_sae(self, y: Tensor, y_hat: Tensor, latents: Tensor) -> None:
        y, y_hat = y.to(_F64), y_hat.to(_F64)
        self.tokens += int(y.shape[0])
        self.sse += float(((y - y_hat) ** 2).sum())
        total = y.sum(0).cpu()
        self.sum_y = total if self.sum_y is None else self.sum_y + total
        self.sum_sq += float((y**2).sum())
        active = latents != 0
        self.nonzero += int(active.sum())
        self.fired += active.sum(0).cpu()

    def add_lm(self, logits: list[Tensor], ids: Tensor, keep: Tensor) -> None:
        pairs = keep[:, :-1] & keep[:, 1:]
        targets = ids[:, 1:].to(logits[0].device)[pairs.to(logits[0].device)]
        self.predictions += int(targets.shape[0])
        for k, value in enumerate(logits):
            predicted = value[:, :-1][pairs.to(value.device)].float()
            loss = F.cross_entropy(predicted, targets, reduction="none")
            self.losses[k] += float(loss.to(_F64).sum())
        where = keep.to(logits[0].device)
        clean_rows, spliced_rows = logits[0][where], logits[1][where]
        # In float64: KL is a sum of differences of close logs, which float32
        # would round to a few 1e-7 of each log; a chunk of positions at a
        # time bounds the memory (two [positions, vocabulary] float64 tensors).
        for start in range(0, int(clean_rows.shape[0]), _KL_CHUNK):
            clean = F.log_softmax(clean_rows[start : start + _KL_CHUNK].to(_F64), -1)
            spliced = F.log_softmax(
                spliced_rows[start : start + _KL_CHUNK].to(_F64), -1
            )
            self.kl += float((clean.exp() * (clean - spliced)).sum())
        self.positions += int(clean_rows.shape[0])

    def result(self, *, lm: bool) -> Measures:
        n = self.tokens
        if n == 0 or self.sum_y is None:
            msg = (
                "The batches gave no token to measure (no batch, or every token "
                "masked out)."
            )
            raise ValueError(msg)
        d_out = int(self.sum_y.shape[0])
        total = self.sum_sq - float((self.sum_y**2).sum()) / n
        frequency = self.fired.to(_F64) / n
        measures = Measures(
            tokens=n,
            mse=self.sse / (n * d_out),
            explained_variance=1 - self.sse / total if total > 0 else float("nan"),
            l0=self.nonzero / n,
            frequency=frequency,
            dead=int((self.fired == 0).sum()),
        )
        if not lm:
            return measures
        count = max(self.predictions, 1)
        clean, spliced, zero = (loss / count for loss in self.losses)
        gap = zero - clean
        return dataclasses.replace(
            measures,
            loss_clean=clean,
            loss_spliced=spliced,
            loss_zero=zero,
            loss_recovered=(zero - spliced) / gap if gap != 0 else float("nan"),
            kl=self.kl / max(self.positions, 1),
        )


def _logits_of(out: Any, logits: Callable[[Any], Tensor] | None) -> Tensor:
    if logits is not None:
        return logits(out)
    value = getattr(out, "logits", None)
    if isinstance(value, Tensor):
        return value
    if isinstance(out, Tensor):
        return out
    msg = (
        f"The model returns a {type(out).__name__} without `logits`: pass "
        "`logits=lambda out: ...` (the [batch, positions, vocabulary] tensor), "
        "or `lm=False` for the SAE's measures only."
    )
    raise TypeError(msg)


def _zeros(output: Any) -> Any:
    value, rebuild = _first(output, "edits")
    return rebuild(torch.zeros_like(value))


def evaluate(  # noqa: C901, PLR0913 (the documented options)
    rnet: Recorder,
    sae: SparseAutoencoder,
    batches: Iterable[Any],
    *,
    layer: Any,
    reads: Any = None,
    mask: Any = "attention_mask",
    input: Any = None,  # noqa: A002 (write's name)
    skip_bos: bool = False,
    device: torch.device | str | None = None,
    lm: bool = True,
    logits: Callable[[Any], Tensor] | None = None,
) -> Measures:
    """Measure ``sae`` spliced at ``layer`` over a token stream.

    Three passes per batch, under :func:`torch.no_grad`: clean, with the SAE
    spliced (no error term), with ``layer`` zero-ablated; the measures and
    their formulas are in :class:`Measures` and the module's docstring
    (``scio_recorder.sae._evaluate``).

    Parameters
    ----------
    rnet : Recorder
        The language model, wrapped. Its selection is restored after.
    sae : SparseAutoencoder
        The SAE or transcoder.
    batches : iterable
        Batches of token ids, as :func:`scio_recorder.activations.write`
        takes them.
    layer : selector
        The call whose output the SAE reconstructs (a transcoder: writes).
    reads : selector, optional
        A transcoder's input: a call's output, or ``InputOf(selector)`` for
        a module's first input (``InputOf("transformer.h.3.mlp")``).
    mask, input, skip_bos, device
        As for :func:`~scio_recorder.activations.write`.
    lm : bool, default True
        Also measure the language model's loss and KL divergence (needs
        logits and token ids); ``False``: the SAE's measures only, from one
        pass per batch.
    logits : callable, optional
        ``logits(output) -> [batch, positions, vocabulary]``; default
        ``output.logits``, or the output itself if it is a tensor.

    Returns
    -------
    Measures

    Raises
    ------
    ValueError
        If ``reads`` is missing for a transcoder or given for an SAE, no token
        is kept, or a layer does not select one call.

    Examples
    --------
    >>> import torch, transformers
    >>> from scio_recorder import Recorder
    >>> from scio_recorder.sae import SparseAutoencoder, evaluate
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2,
    ...     vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0)  # fmt: skip
    >>> model = transformers.GPT2LMHeadModel(config).eval()
    >>> ids = torch.randint(1, 50, (2, 8))
    >>> rnet = Recorder(model, input_data={"input_ids": ids})
    >>> sae = SparseAutoencoder(16, 64, activation="topk", k=8)
    >>> m = evaluate(rnet, sae, [ids], layer="transformer.h.0", mask=None)
    >>> m.tokens, m.l0, sorted(m.as_dict())[:4]
    (16, 8.0, ['dead', 'explained_variance', 'kl', 'l0'])

    """
    if not isinstance(sae, SparseAutoencoder):
        msg = f"`evaluate` takes a SparseAutoencoder, not a {type(sae).__name__}."
        raise TypeError(msg)
    if (reads is None) == sae.transcoder:
        msg = (
            "A transcoder reads somewhere else than it writes: pass `reads=` (a "
            "layer, or `InputOf(module)`)."
            if reads is None
            else "`reads=` is for transcoders; this SAE reads where it writes: "
            "leave it out."
        )
        raise ValueError(msg)
    write_row = resolve_one(rnet.table, rnet.net, layer, "`evaluate`", hint="{label}")
    read_row: Layer | None = None
    read_input = isinstance(reads, InputOf)
    if reads is not None:
        target = reads.selector if isinstance(reads, InputOf) else reads
        read_row = resolve_one(
            rnet.table, rnet.net, target, "`evaluate` (reads)", hint="{label}"
        )
    outputs = [write_row.label]
    if read_row is not None and not read_input:
        outputs.append(read_row.label)
    inputs = [read_row.label] if read_row is not None and read_input else []
    sums = _Sums(sae.d_sae)
    stream = token_batches(
        rnet, batches, mask=mask, input=input, skip_bos=skip_bos, device=device
    )
    with torch.no_grad(), rnet.selecting(*outputs, inputs=inputs):
        for batch in stream:
            if lm and batch.ids is None:
                msg = (
                    "The batches hold no token ids to measure the loss with: "
                    "pass `lm=False` for the SAE's measures only."
                )
                raise ValueError(msg)
            clean_out = rnet(*batch.args, early_exit=not lm, **batch.kwargs)
            y = _first(rnet.activations[write_row.label], "measures")[0]
            if read_row is None:
                x = y
            elif read_input:
                x = _first(rnet.inputs[read_row.label].args, "reads")[0]
            else:
                x = _first(rnet.activations[read_row.label], "reads")[0]
            keep = batch.keep.to(y.device)
            if not lm:
                latents = sae.encode(x)
                sums.add_sae(y[keep], sae.decode(latents, x=x)[keep], latents[keep])
                continue
            sp = splice(sae)
            edits: dict[Any, Any] = {write_row.label: sp}
            input_edits: dict[Any, Any] = {}
            if read_row is not None:
                (input_edits if read_input else edits)[read_row.label] = sp.read
            spliced_out = rnet(
                *batch.args,
                activation_postproc=edits,
                input_postproc=input_edits or None,
                **batch.kwargs,
            )
            assert sp.latents is not None  # noqa: S101 (the pass called it)
            latents = sp.latents
            sums.add_sae(y[keep], sae.decode(latents, x=x)[keep], latents[keep])
            zero_out = rnet(
                *batch.args,
                activation_postproc={write_row.label: _zeros},
                **batch.kwargs,
            )
            assert batch.ids is not None  # noqa: S101 (checked above)
            sums.add_lm(
                [_logits_of(out, logits) for out in (clean_out, spliced_out, zero_out)],
                batch.ids,
                batch.keep,
            )
    return sums.result(lm=lm)
