"""Softmax scores at a temperature: TempScale (fitted ``T``) and ODIN.

Both score ``-max_c softmax(f(x) / T)_c``. ``TempScale`` fits ``T`` by the
negative log-likelihood of labelled in-distribution data (Guo et al. 2017);
``ODIN`` (Liang et al. 2018) first moves the input against the gradient of
the temperature-scaled cross-entropy of its predicted class, which needs
passes of its own (a forward and a backward pass with autograd on the input,
then a forward pass on the perturbed input): they are not shared with other
detectors.
"""

from __future__ import annotations

__all__ = ["ODIN", "TempScale", "fit_temperature"]

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ._inputs import floating_input
from ._outputs import as_logits, output_label
from ._protocol import Detector, run_pass
from ._saving import StateEntry

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scio_recorder.layers import DepthIdx
    from scio_recorder.recorder import Recorder

    from ._protocol import Pass

_F64 = torch.float64


def _nll_slope(logits: Tensor, targets: Tensor, beta: float) -> float:
    """``d/d beta`` of the mean NLL of ``softmax(beta z)``: ``E_p[z] - z_y``."""
    p = torch.softmax(beta * logits, dim=1)
    picked = logits.gather(1, targets[:, None])[:, 0]
    return float(((p * logits).sum(dim=1) - picked).mean())


def fit_temperature(logits: Tensor, targets: Tensor) -> float:
    """Return the ``T`` that minimises the mean NLL of ``softmax(logits / T)``.

    The NLL is convex in ``beta = 1 / T``, its slope ``mean(E_p[z] - z_y)``
    increasing; the root of the slope is found by bisection in float64, to
    the precision of float64 (not a fixed number of optimiser steps).

    Examples
    --------
    >>> import math, torch
    >>> logits = torch.tensor([[2.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    >>> t = fit_temperature(logits, torch.tensor([0, 0, 1, 1]))  # 3 of 4 right
    >>> round(t, 6), round(2 / math.log(3), 6)  # softmax(2 / T) = 3/4
    (1.820478, 1.820478)

    """
    z = logits.to(_F64)
    y = targets.to(torch.int64)
    if _nll_slope(z, y, 0.0) >= 0:
        return math.inf  # the logits predict the targets no better than chance
    lo, hi = 0.0, 1.0
    # <= 0: with separable logits the slope underflows to 0 as T -> 0
    while _nll_slope(z, y, hi) <= 0:
        lo, hi = hi, 2 * hi
        if hi > 2.0**60:
            msg = (
                "TempScale: the NLL keeps decreasing as T -> 0 (the logits "
                "separate every fit sample's target with a margin): fit on "
                "held-out data the net does not classify perfectly, or give `t=`."
            )
            raise ValueError(msg)
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in {lo, hi}:
            break
        if _nll_slope(z, y, mid) < 0:
            lo = mid
        else:
            hi = mid
    return 1.0 / ((lo + hi) / 2)


class _LogitBank:
    """A reducer: the net's logits and the targets, on the CPU (a bank, ``N x C``)."""

    def __init__(self) -> None:
        self.logits: list[Tensor] = []
        self.targets: list[Tensor] = []

    @property
    def count(self) -> int:
        return sum(len(t) for t in self.targets)

    def update(self, value: Any, target: Tensor | None = None) -> None:
        if target is None:
            msg = "TempScale needs class labels: pass `target=` to fit."
            raise ValueError(msg)
        logits = as_logits(value, "TempScale").detach().float().cpu()
        self.logits.append(logits)
        self.targets.append(torch.as_tensor(target).reshape(-1).cpu().to(torch.int64))

    def merge(self, other: _LogitBank) -> None:
        self.logits += other.logits
        self.targets += other.targets

    def result(self) -> tuple[Tensor, Tensor]:
        if not self.targets:
            return torch.zeros(0, 0), torch.zeros(0, dtype=torch.int64)
        return torch.cat(self.logits), torch.cat(self.targets)

    def state(self) -> dict[str, Tensor]:
        logits, targets = self.result()
        return {"logits": logits, "targets": targets}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        self.logits, self.targets = [state["logits"]], [state["targets"]]

    def fresh(self) -> _LogitBank:
        return _LogitBank()


def _check_t(who: str, name: str, t: float) -> None:
    if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
        msg = f"{who}: the temperature {name} must be a number > 0, got {t!r}"
        raise ValueError(msg)


class TempScale(Detector):
    r"""Temperature scaling (Guo et al., ICML 2017).

    $\mathrm{score}(x) = -\max_c \mathrm{softmax}(f(x) / T)_c$.

    ``fit`` (labelled in-distribution data, ``target=`` needed) finds the
    $T$ minimising the mean negative log-likelihood $\mathrm{NLL}(T) =
    \mathrm{mean}_i [\mathrm{logsumexp}(z_i / T) - z_{i, y_i} / T]$; with ``t=``
    given there is
    nothing to fit.

    Where our reading decided: pytorch-ood 0.4 (``TemperatureScaling``) runs
    50 L-BFGS iterations at learning rate 0.01 from ``T = 1``, which stops
    near the optimum; we find the exact minimiser (bisection on the slope in
    $1 / T$, where the NLL is convex; :func:`fit_temperature`), so the two
    ``T`` differ slightly. Labels are checked as for every detector: class
    indices of the net, ``[0, C)`` (pytorch-ood ignores samples with a
    negative label; drop them from the fit data instead). Fitting keeps the
    fit data's logits and labels in memory (a bank of $N \times C$ float32,
    $C$ the classes), since the optimum needs every logit at every step; a
    held-out set of a few thousand samples is what the paper uses. Logits
    that predict the labels no better than chance give $T = \infty$ (every
    score $-1 / C$).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier: its logits are ``[batch, classes]``).
    t : float, optional
        A given temperature (no fitting); default: fitted.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> x = torch.randn(64, 3)
    >>> y = rnet.net(x).argmax(1).where(torch.arange(64) % 3 > 0, 0)
    >>> ts = TempScale(rnet).fit([(x, y)], target=1)
    >>> ts(torch.randn(5, 3)).shape, float(ts.t) > 0
    (torch.Size([5]), True)

    """

    needs_fit: ClassVar[bool] = True
    needs_target: ClassVar[bool] = True

    def __init__(self, rnet: Recorder, t: float | None = None) -> None:
        """Find the net's output; keep ``t`` when given."""
        if t is not None:
            _check_t("TempScale", "t", t)
        super().__init__(rnet)
        self.label: DepthIdx = output_label(rnet)
        self.given = t
        self.t = torch.tensor(math.nan if t is None else float(t), dtype=_F64)
        self._fitted = t is not None

    def fit_keep(self) -> dict[Any, Any]:
        """Return the logits and labels to keep (nothing when ``t`` was given)."""
        return {} if self.given is not None else {self.label: _LogitBank()}

    def fit_from(self, result: Mapping[DepthIdx, Any]) -> None:
        """Fit the temperature (nothing to do when ``t`` was given)."""
        if self.given is not None:
            return
        logits, targets = result[self.label]
        if targets.numel() == 0:
            msg = "TempScale: the fit data hold no sample; fit on labelled data."
            raise ValueError(msg)
        self.t = torch.tensor(fit_temperature(logits, targets), dtype=_F64)

    def score_pass(self, result: Pass) -> Tensor:
        """Return minus the largest probability at temperature ``T``."""
        logits = as_logits(result.logits, "TempScale")
        scaled = logits / self.t.to(logits)
        return -torch.softmax(scaled, dim=1).amax(dim=1)

    def config(self) -> dict[str, Any]:
        """Return the given temperature (``None``: fitted)."""
        return {"t": self.given}

    def state(self) -> dict[str, Tensor]:
        """Return the temperature."""
        return {"t": self.t.reshape(1)}

    def state_entries(self) -> dict[str, StateEntry]:
        """Return the entries: the temperature ``[1]``."""
        return {"t": StateEntry((1,), _F64)}

    def load_state(self, state: Mapping[str, Tensor]) -> None:
        """Set the temperature."""
        self.t = state["t"].reshape(()).to(_F64)


class ODIN(Detector):
    r"""ODIN (Liang et al., ICLR 2018): temperature and input preprocessing.

    With $S(x; T) = \mathrm{softmax}(f(x) / T)$ and $\hat y = \operatorname{argmax}_c
    f(x)_c$, the input moves against the gradient of the cross-entropy of its
    prediction: $\hat x = x - \epsilon \, \mathrm{sign}(\nabla_x (-\log
    S_{\hat y}(x; T)))$ ($\epsilon$ = ``eps``; each channel's sign divided by
    ``norm_std[c]`` when given), and $\mathrm{score}(x) = -\max_c S_c(\hat x;
    T)$. No fitting.

    Where our reading decided, with pytorch-ood 0.4: the perturbed input is
    the net's first positional argument (a floating tensor; other arguments
    are passed as they are); the gradient is that of the batch's mean loss
    (the sign per sample is the same as for its own loss when samples do not
    interact: call ``net.eval()``); only the input's gradient is computed
    (no parameter's ``.grad`` is touched). Costs three passes (forward and
    backward with autograd, then forward on $\hat x$) that no other detector
    shares; ``evaluate`` runs them on their own. pytorch-ood's ``criterion``
    is not offered (the cross-entropy, the paper's).

    Parameters
    ----------
    rnet : Recorder
        The wrapped net (a classifier: its logits are ``[batch, classes]``).
    eps : float, default 0.0014
        The step size (pytorch-ood's default, the paper's CIFAR value).
    temperature : float, default 1000.0
        ``T``.
    norm_std : list of float, optional
        Per-channel standard deviations of the input normalisation, so that
        ``eps`` is on the unnormalised scale.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from scio_recorder import Recorder
    >>> rnet = Recorder(nn.Sequential(nn.Linear(3, 4)), input_size=(1, 3))
    >>> ODIN(rnet, eps=0.01)(torch.randn(5, 3)).shape
    torch.Size([5])

    """

    own_passes = True

    def __init__(
        self,
        rnet: Recorder,
        eps: float = 0.0014,
        temperature: float = 1000.0,
        norm_std: list[float] | None = None,
    ) -> None:
        """Check the hyperparameters."""
        _check_t("ODIN", "temperature", temperature)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or eps < 0:
            msg = f"ODIN: eps must be a number >= 0, got {eps!r}"
            raise ValueError(msg)
        super().__init__(rnet)
        self.eps = float(eps)
        self.temperature = float(temperature)
        self.norm_std = None if norm_std is None else [float(s) for s in norm_std]

    def perturb(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        r"""Return $\hat x$, the first positional input moved against the gradient.

        $\hat x = x - \epsilon \, \mathrm{sign}(\nabla_x (-\log S_{\hat y}(x; T)))$.
        """
        x = floating_input(args, "ODIN")
        with torch.inference_mode(mode=False), torch.enable_grad():
            leaf = x.detach().clone().requires_grad_()
            out = run_pass(
                self.rnet, (leaf, *args[1:]), kwargs, grad=True, who="ODIN"
            ).logits
            logits = as_logits(out, "ODIN") / self.temperature
            loss = torch.nn.functional.cross_entropy(logits, logits.argmax(dim=1))
            (grad,) = torch.autograd.grad(loss, leaf)
        step = grad.sign()
        if self.norm_std is not None:
            std = torch.tensor(self.norm_std, dtype=step.dtype, device=step.device)
            if step.dim() < 2 or step.shape[1] != len(std):  # noqa: PLR2004 (batch, channels)
                msg = (
                    f"ODIN: norm_std has {len(std)} values but the input is "
                    f"{list(step.shape)}; give one per channel (dim 1)."
                )
                raise ValueError(msg)
            step = step / std.reshape(1, -1, *([1] * (step.dim() - 2)))
        return x.detach() - self.eps * step

    def score_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Tensor:
        """Perturb the input, then score it at temperature ``T``."""
        x_hat = self.perturb(args, kwargs)
        out = run_pass(self.rnet, (x_hat, *args[1:]), kwargs).logits
        logits = as_logits(out, "ODIN") / self.temperature
        return -torch.softmax(logits, dim=1).amax(dim=1)

    def config(self) -> dict[str, Any]:
        """Return ``eps``, the temperature and ``norm_std``."""
        return {
            "eps": self.eps,
            "temperature": self.temperature,
            "norm_std": self.norm_std,
        }
