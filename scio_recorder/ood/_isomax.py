"""IsoMax, post hoc: prototypes in the logit space, fitted to a trained net.

IsoMax (Macêdo et al., 2021) trains a net whose logits are minus the
distances of its features to learned class prototypes, scaled by an
entropic scale. scio 1.1 applies it to a net trained otherwise: the
prototypes live in the space of the net's logits and are optimised after
training, on the fit data's logits, and the score is the probability of
the scaled distances. One pass of the net keeps the fit data's logits and
labels (``N x C`` float32); the optimisation runs on them after.
"""

from __future__ import annotations

__all__ = ["IsoMax", "fit_prototypes", "isomax_probabilities"]

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._bank import Bank
from ._checks import check_count, check_number
from ._classes import ClassConditional, check_at
from ._outputs import as_logits, output_label
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

    from ._protocol import Pass

_F32 = torch.float32


def isomax_probabilities(
    logits: Tensor, prototypes: Tensor, entropic_scale: float, dist_norm: float = 2.0
) -> Tensor:
    """Return ``softmax_c(-entropic_scale ||z - p_c||)``, ``[batch, classes]``.

    ``z`` the logits ``[batch, C]``, ``p_c`` the prototypes ``[classes, C]``,
    ``||.||`` the ``dist_norm``-norm (computed by :func:`torch.cdist`; for
    a row whose norm overflows, on the row divided by its largest entry,
    then scaled back). The distances are shifted by the nearest's before
    the softmax (the same probabilities), so that finite logits never give
    NaN.

    Examples
    --------
    >>> import torch
    >>> p = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    >>> isomax_probabilities(torch.tensor([[0.0, 0.0]]), p, 1.0)  # d = 0 and 5
    tensor([[0.9933, 0.0067]])

    """
    prototypes = prototypes.to(logits)
    distances = torch.cdist(logits, prototypes, p=dist_norm)
    overflow = ~torch.isfinite(distances).all(dim=1) & torch.isfinite(logits).all(dim=1)
    if bool(overflow.any()):
        # The norm's powers overflow (|z| ~ 1e30 squared, in float32): those
        # rows again, divided by their largest entry first, then scaled back.
        z = logits[overflow]
        scale = torch.maximum(
            z.abs().amax(dim=1, keepdim=True), prototypes.abs().amax()
        )
        scaled = torch.linalg.vector_norm(
            (z[:, None, :] - prototypes[None]) / scale[:, :, None],
            ord=dist_norm,
            dim=2,
        )
        distances[overflow] = scaled * scale
    # softmax is the same for distances shifted by the nearest's, and the
    # product with the scale cannot then make every class -inf (NaN)
    nearest = distances.amin(dim=1, keepdim=True)
    return torch.softmax(-entropic_scale * (distances - nearest), dim=1)


def fit_prototypes(  # noqa: PLR0913 (the data, then scio's hyperparameters)
    logits: Tensor,
    labels: Tensor,
    classes: int,
    *,
    entropic_scale: float,
    steps: int,
    lr: float,
    dist_norm: float = 2.0,
    batch_size: int | None = None,
    seed: int = 0,
) -> Tensor:
    """Return the prototypes ``[classes, C]`` minimising IsoMax's cross-entropy.

    Adam (``lr``, ``eps=1e-8``) from prototypes at 0 (the paper's start),
    ``steps`` steps on the mean cross-entropy of
    ``-entropic_scale ||z - p_c||`` with the labels, in the logits' dtype:
    each step on every sample (``batch_size=None``, scio's), or on the next
    ``batch_size`` samples of an order drawn by a generator seeded with
    ``seed`` (a new order each epoch).

    Examples
    --------
    >>> import torch
    >>> z = torch.tensor([[4.0, 0.0], [0.0, 4.0]])
    >>> p = fit_prototypes(
    ...     z, torch.tensor([0, 1]), 2, entropic_scale=1.0, steps=200, lr=0.1
    ... )
    >>> bool((p.argmax(dim=1) == torch.tensor([0, 1])).all())
    True

    """
    prototypes = torch.zeros(
        classes, logits.shape[1], dtype=logits.dtype, device=logits.device
    )
    prototypes.requires_grad_()
    optimizer = torch.optim.Adam([prototypes], lr=lr, eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = logits.shape[0]
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator) if batch_size else None
    at = 0
    with torch.inference_mode(mode=False), torch.enable_grad():
        for _ in range(steps):
            z, y = logits, labels
            if batch_size and order is not None:
                if at >= n:
                    order, at = torch.randperm(n, generator=generator), 0
                pick = order[at : at + batch_size].to(logits.device)
                z, y, at = logits[pick], labels[pick], at + batch_size
            optimizer.zero_grad()
            distances = torch.cdist(z, prototypes, p=dist_norm)
            loss_fn(-entropic_scale * distances, y).backward()
            optimizer.step()
    return prototypes.detach()


class IsoMax(ClassConditional):
    r"""IsoMax, post hoc (Macêdo et al., IEEE TNNLS 2021; scio 1.1's reading).

    The paper trains a net with *isometric* logits, $-\|h - p_c\|$ the
    distance of its features $h$ to learned class prototypes $p_c$,
    through a softmax with an entropic scale $E_s$. Here, as in scio 1.1,
    the net is trained already: the prototypes live in the space of its
    logits $z = f(x)$, and ``fit`` (labelled in-distribution data,
    ``target=`` needed) optimises them on the fit data's logits
    (:func:`fit_prototypes`: Adam from zeros, ``steps`` steps at ``lr`` on
    the cross-entropy of $-E_s \|z - p_c\|$ with the labels). Then
    ``score_classes(x)`` $= -\mathrm{softmax}_c(-E_s \|z - p_c\|)$ (minus each class's
    probability, :func:`isomax_probabilities`) and ``score(x)`` reads it at
    the closest prototype (the largest probability: minus the maximum
    probability, default) or at the predicted class (``at="predicted"``,
    scio's reading).

    scio 1.1's ``IsoMax`` conformity is ``-score_classes(x)`` (its
    parameter ``n_steps`` is ``steps``). The distances come from
    :func:`torch.cdist` (ours) where scio subtracts ``[N, C, C]`` tensors:
    the same numbers to float rounding, which the optimiser's steps carry
    (the tests compare AUROCs). Fitting keeps the ``N x C`` logits of the
    fit data; each step costs ``N x classes x C``.

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier: logits ``[batch, C]``).
    entropic_scale : float, default 10.0
        $E_s$ (the paper's).
    steps : int, default 1000
        Optimiser steps (scio's ``n_steps``); 0 keeps the prototypes at 0.
    lr : float, default 0.1
        Adam's learning rate.
    seed : int, default 0
        Seeds the order of the mini-batches (with ``batch_size``).
    batch_size : int, optional
        Samples per step; default all of them (scio's, deterministic).
    dist_norm : float, default 2.0
        The order of the distance's norm (scio's name).
    at : {"closest", "predicted"}
        Which class's probability is the score.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> _ = torch.manual_seed(0)
    >>> rnet = Recorder(nn.Sequential(nn.Linear(4, 3)), input_size=(1, 4))
    >>> isomax = IsoMax(rnet, steps=50)
    >>> isomax.fit([(torch.randn(30, 4), torch.arange(30) % 3)], target=1)
    IsoMax(entropic_scale=10.0, steps=50, lr=0.1, seed=0, batch_size=None, dist_norm=2.0, fitted)
    >>> isomax.prototypes.shape, isomax(torch.randn(5, 4)).shape
    (torch.Size([3, 3]), torch.Size([5]))

    """  # noqa: E501 (doctest output)

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(  # noqa: PLR0913 (scio's hyperparameters, the optimiser's, the reading)
        self,
        rnet: Recorder,
        *,
        entropic_scale: float = 10.0,
        steps: int = 1000,
        lr: float = 0.1,
        seed: int = 0,
        batch_size: int | None = None,
        dist_norm: float = 2.0,
        at: str = "closest",
    ) -> None:
        """Check the hyperparameters."""
        self.at = check_at("IsoMax", at)
        for name, value in (
            ("entropic_scale", entropic_scale),
            ("lr", lr),
            ("dist_norm", dist_norm),
        ):
            check_number("IsoMax", name, value, zero=False)
        check_count("IsoMax", "steps", steps, low=0)
        check_count("IsoMax", "seed", seed, low=0)
        if batch_size is not None:
            check_count("IsoMax", "batch_size", batch_size, low=1)
        super().__init__(rnet)
        self.entropic_scale, self.lr = float(entropic_scale), float(lr)
        self.dist_norm = float(dist_norm)
        self.steps, self.seed, self.batch_size = steps, seed, batch_size
        self.label: DepthIdx = output_label(rnet)
        self.prototypes = torch.zeros(0, 0, dtype=_F32)

    def fit_keep(self) -> dict[Any, Any]:
        """Keep the net's logits and labels (a bank, ``N x C``)."""
        return {self.label: Bank(lambda out: as_logits(out, "IsoMax"))}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Optimise the prototypes on the fit data's logits."""
        logits, labels = result[self.label]
        if labels is None or labels.numel() == 0:
            msg = "IsoMax: the fit data hold no labelled sample; fit on labelled data."
            raise ValueError(msg)
        classes = max(int(logits.shape[1]), int(labels.max()) + 1)
        self.prototypes = fit_prototypes(
            logits,
            labels,
            classes,
            entropic_scale=self.entropic_scale,
            steps=self.steps,
            lr=self.lr,
            dist_norm=self.dist_norm,
            batch_size=self.batch_size,
            seed=self.seed,
        )

    def class_scores(self, result: Pass) -> Tensor:
        """Return minus each class's IsoMax probability, ``[batch, classes]``."""
        logits = as_logits(result.logits, "IsoMax")
        if logits.shape[1] != self.prototypes.shape[1]:
            msg = (
                f"IsoMax: the net gives {logits.shape[1]} logits, but the "
                f"prototypes were fitted on {self.prototypes.shape[1]}: fit it "
                "again on this net."
            )
            raise ValueError(msg)
        probabilities = isomax_probabilities(
            logits.to(_F32), self.prototypes, self.entropic_scale, self.dist_norm
        )
        return -probabilities

    def config(self) -> dict[str, Any]:
        """Return the hyperparameters (``at`` reads the state, it is not part of it)."""
        return {
            "entropic_scale": self.entropic_scale,
            "steps": self.steps,
            "lr": self.lr,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "dist_norm": self.dist_norm,
        }

    def state(self) -> dict[str, Tensor]:
        """Return the prototypes."""
        return {"prototypes": self.prototypes}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the prototypes ``[classes, logits]`` (float32)."""
        return {"prototypes": StateEntry(("classes", "logits"), _F32)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the prototypes."""
        self.prototypes = state["prototypes"]
