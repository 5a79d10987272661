"""Leave a net as it was around the passes the library runs on its own.

The reference pass (:func:`torchinfo.summary` puts the whole net in one mode
and restores only the top module's flag), the graph pass and export run the
user's net for inspection; none of them may change it. :func:`preserved`
snapshots what such a pass can change and puts it back exactly, in
``finally``:

* the ``training`` flag of every submodule (set directly, without calling an
  overridden ``train()``), so a BatchNorm or Dropout frozen with ``.eval()``
  inside a net in train mode stays frozen;
* ``requires_grad`` of every parameter;
* every buffer: the same tensor object stays registered, and its values are
  copied back where the pass changed them in place (BatchNorm running
  statistics and ``num_batches_tracked`` in train mode). This costs a copy
  of the buffers for the duration of the pass.

Parameters are not copied (a forward pass does not write them); lazy
parameters and buffers that the pass materializes stay materialized.
"""

from __future__ import annotations

__all__ = ["preserved"]

import contextlib
from typing import TYPE_CHECKING

import torch
from torch.nn.parameter import is_lazy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch import Tensor, nn


@contextlib.contextmanager
def preserved(net: nn.Module) -> Iterator[None]:
    """Restore the modes, ``requires_grad`` flags and buffers of ``net`` on exit.

    Parameters
    ----------
    net : torch.nn.Module
        The net whose submodules' ``training`` flags, parameters'
        ``requires_grad`` and buffers are put back as they were on entry.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    >>> _ = net[1].eval()
    >>> with preserved(net):
    ...     _ = net.train()(torch.rand(3, 2))
    >>> net.training, net[1].training, net[1].num_batches_tracked.item()
    (True, False, 0)
    >>> _ = net.train()(torch.rand(3, 2))  # a pass of its own changes the net
    >>> net[1].training
    True

    """
    flags = [(module, module.training) for module in net.modules()]
    grads = [(param, param.requires_grad) for param in net.parameters()]
    buffers: list[tuple[nn.Module, str, Tensor, Tensor]] = []
    with torch.no_grad():
        for module in net.modules():
            for name, buffer in module._buffers.items():  # noqa: SLF001 (non-persistent ones too)
                if buffer is None or is_lazy(buffer):
                    continue
                buffers.append((module, name, buffer, buffer.clone()))
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training
        for param, requires_grad in grads:
            if param.requires_grad != requires_grad:
                param.requires_grad_(requires_grad)
        for module, name, buffer, saved in buffers:
            if module._buffers.get(name) is not buffer:  # noqa: SLF001 (a buffer reassigned in the pass)
                module._buffers[name] = buffer  # noqa: SLF001
            # Compared, not told by `_version`: the batch norm kernels update
            # running statistics without bumping it.
            if not torch.equal(buffer, saved):
                with torch.no_grad(), torch.inference_mode(buffer.is_inference()):
                    buffer.copy_(saved)
