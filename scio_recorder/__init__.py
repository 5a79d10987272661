"""scio_recorder: look inside PyTorch networks while they run.

Wrap a network in a :class:`Recorder`, print it to see every module call
labelled ``depth-idx``, select labels with :meth:`Recorder.record`, call it as
the network, and read :attr:`Recorder.activations`.

Examples
--------
>>> import torch
>>> from torch import nn
>>> from scio_recorder import Recorder
>>> rnet = Recorder(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), input_size=(1, 5))
>>> rnet.record((1, 1))
>>> _ = rnet(torch.rand(2, 5))
>>> rnet.activations[(1, 1)].shape
torch.Size([2, 4])

"""

from ._hooks import CallPlanError, Postprocessor
from .layers import DepthIdx, Layer, LayerTable
from .recorder import InPlaceWarning, Recorder

__all__ = [
    "CallPlanError",
    "DepthIdx",
    "InPlaceWarning",
    "Layer",
    "LayerTable",
    "Postprocessor",
    "Recorder",
]

__version__ = "0.1.0"
