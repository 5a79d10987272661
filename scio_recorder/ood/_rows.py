"""The rows of a batch that the detectors score: empty batches, non-finite rows.

The protocol (:mod:`._protocol`) applies these rules for every detector, so
that no detector states them:

* an empty batch scores as an empty ``[0]`` tensor, without running the net
  (:func:`empty_batch`);
* a row holding a NaN or an infinity (in the net's inputs,
  :func:`input_rows_non_finite`; in the logits or a record a detector reads,
  :func:`pass_rows_non_finite`) scores NaN, and never changes the other
  rows' scores: the detector scores the pass restricted to the finite rows
  (:func:`score_finite_rows`), and an edit in flight edits the finite rows
  only (:func:`finite_rows_edit`).
"""

from __future__ import annotations

__all__ = [
    "PassLike",
    "empty_batch",
    "finite_rows_edit",
    "input_rows_non_finite",
    "pass_rows_non_finite",
    "score_finite_rows",
]

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import Tensor

from scio_recorder._run.batches import first_batch_size
from scio_recorder._support.tree import iter_tensors

from ._checks import rows_not_finite

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from typing_extensions import Self

    from scio_recorder.layers import DepthIdx


class PassLike(Protocol):
    """What these rules read of a pass: its logits, records and ``take``.

    A structural type of ``_protocol.Pass``, so that this module stays below
    the protocol, which uses it.
    """

    logits: Tensor
    outputs: Mapping[DepthIdx, Any]
    inputs: Mapping[DepthIdx, Tensor]

    def take(self, rows: Tensor) -> Self:
        """Return the pass restricted to ``rows``."""
        ...


P = TypeVar("P", bound=PassLike)


def empty_batch(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor | None:
    """Return the empty scores ``[0]`` of an empty batch; ``None`` for another batch.

    An empty batch (dim 0 of its first tensor argument is 0) is not run
    through the net: many nets and detectors cannot reshape 0 samples. The
    scores are float32, on the input's device.
    """
    first = next((t for t in iter_tensors((args, dict(kwargs))) if t.dim()), None)
    if first is None or first.shape[0] != 0:
        return None
    return torch.empty(0, device=first.device)


def input_rows_non_finite(
    args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Tensor | None:
    """Return ``[batch]`` bools: a NaN or infinity in that row of the inputs.

    Over the floating tensors among the net's arguments whose dim 0 is the
    batch's (that of the first tensor argument); ``None`` without any.
    """
    n = first_batch_size(tuple(args), dict(kwargs))
    if n is None:
        return None
    bad: Tensor | None = None
    for t in iter_tensors((args, dict(kwargs))):
        if t.dim() and t.shape[0] == n and (t.is_floating_point() or t.is_complex()):
            rows = rows_not_finite(t)
            bad = rows if bad is None else bad | rows.to(bad.device)
    return bad


def pass_rows_non_finite(
    result: PassLike, outputs: Iterable[DepthIdx], inputs: Iterable[DepthIdx]
) -> Tensor | None:
    """``[batch]`` bools: a non-finite entry in that row of the logits or records."""
    logits = result.logits
    if logits.dim() == 0:
        return None
    n = logits.shape[0]
    read = [logits, *(result.outputs[label] for label in outputs)]
    read += [result.inputs[label] for label in inputs]
    bad = torch.zeros(n, dtype=torch.bool, device=logits.device)
    for t in read:
        if (
            isinstance(t, Tensor)
            and t.dim()
            and t.shape[0] == n
            and (t.is_floating_point() or t.is_complex())
        ):
            bad = bad | rows_not_finite(t).to(bad.device)
    return bad


def score_finite_rows(  # noqa: PLR0913 (the passes, the score, what it reads)
    results: Sequence[P],
    score: Callable[[Sequence[P]], Tensor],
    *,
    outputs: Sequence[DepthIdx],
    inputs: Sequence[DepthIdx],
    bad_inputs: Tensor | None = None,
    trailing: tuple[int, ...] = (),
) -> Tensor:
    """Score the finite rows of ``results`` with ``score``; NaN for the others.

    A row is non-finite where ``bad_inputs`` says so (the net's inputs), or
    where the logits or a record the detector reads (the ``outputs`` and
    ``inputs`` of these labels) hold a NaN or an infinity, in any of the
    passes. When every row is finite (one host read to know it), ``score``
    gets the passes as they are; otherwise the passes restricted to the
    finite rows (their ``take``), so that nothing computed over the batch
    sees a bad row, and the scores of the others are NaN. ``score`` may give
    more than one score a row (``[rows, ...]``, scores per class):
    ``trailing`` is their shape when no row is finite.
    """
    bad = bad_inputs
    for result in results:
        rows = pass_rows_non_finite(result, outputs, inputs)
        if rows is not None:
            bad = rows if bad is None else bad | rows.to(bad.device)
    if bad is None or not bool(bad.any()):
        return score(results)
    keep = torch.nonzero(~bad).reshape(-1)
    if keep.numel() == 0:
        return torch.full((*bad.shape, *trailing), float("nan"), device=bad.device)
    scores = score([result.take(keep) for result in results])
    out = torch.full(
        (*bad.shape, *scores.shape[1:]),
        float("nan"),
        dtype=scores.dtype,
        device=scores.device,
    )
    out[keep.to(scores.device)] = scores
    return out


def finite_rows_edit(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Return ``fn`` applied to the finite rows of a floating tensor only."""

    def edit(output: Any) -> Any:
        if not (
            isinstance(output, Tensor)
            and output.is_floating_point()
            and output.dim()
            and output.shape[0]
        ):
            return fn(output)
        finite = ~rows_not_finite(output)
        if bool(finite.all()):
            return fn(output)
        if not bool(finite.any()):
            return output
        edited = fn(output[finite])
        full = torch.full_like(output, float("nan"), dtype=edited.dtype)
        full[finite] = edited
        return full

    return edit
