"""Fixtures for every test, the package's doctests included.

Only what must also hold in ``scio_recorder/``'s doctests is here; the tests'
own fixtures are in ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest
import torch
import torchinfo.torchinfo as torchinfo_impl
from torch import nn


@pytest.fixture(autouse=True)
def reference_passes_on_the_cpu(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine with CUDA, leave CPU nets on the CPU in tests not marked ``gpu``.

    Given ``input_size`` alone, torchinfo moves a net whose parameters are on
    the CPU to CUDA when CUDA is available (the Recorder keeps that, as the
    reference does, and warns): the tests and doctests written for the CPU
    would then feed CPU inputs to a GPU net. Here torchinfo chooses as on a
    machine without CUDA; the move itself is tested in tests/test_gpu.py.
    """
    if not torch.cuda.is_available() or request.node.get_closest_marker("gpu"):
        return
    choose = torchinfo_impl.get_device

    def as_without_cuda(model: nn.Module, input_data: object) -> torch.device | None:
        device = choose(model, input_data)
        if device is not None and device.type == "cuda":
            on_cuda = any(p.is_cuda for p in model.parameters())
            return device if on_cuda else torch.device("cpu")
        return device

    monkeypatch.setattr(torchinfo_impl, "get_device", as_without_cuda)
