"""JointEnergy against ``-sum_c log(1 + exp(z_c))`` written out in float64."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scio_recorder import Recorder
from scio_recorder.ood import JointEnergy
from scio_recorder.ood._logits import joint_energy_score


def test_joint_energy_is_minus_the_summed_free_energies():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5)).eval()
    x = torch.randn(8, 4)
    with torch.no_grad():
        z = net(x).double()
    want = -torch.log1p(torch.exp(z)).sum(dim=1)
    # 5 float32 terms of at most |z| + log 2, each rounded a few times.
    tol = 4 * 5 * torch.finfo(torch.float32).eps * (z.abs() + 1).sum(dim=1)
    got = JointEnergy(Recorder(net, input_size=(1, 4)))(x).double()
    assert bool(((got - want).abs() <= tol).all())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=6))
def test_joint_energy_score_neither_overflows_nor_underflows(values):
    z = torch.tensor([values], dtype=torch.float64)
    # log(1 + e^v) = max(v, 0) + log1p(e^-|v|), exact for any v.
    want = -sum(max(v, 0.0) + math.log1p(math.exp(-abs(v))) for v in values)
    got = float(joint_energy_score(z)[0])
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
