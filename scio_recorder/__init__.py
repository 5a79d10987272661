"""scio_recorder: look inside PyTorch networks while they run.

Wrap a network in a :class:`Recorder`, print it to see every module call
labelled ``depth-idx``, select labels (or names, types, predicates) with
:meth:`Recorder.record`, call it as the network, and read
:attr:`Recorder.activations` — or edit them in flight with
``activation_postproc``.

``import scio_recorder`` loads the recorder and what it needs; the tools
built on it (:mod:`~scio_recorder.collect`, saved records, groups, the
subpackages) load when first used, by any spelling
(``scio_recorder.collect``, ``from scio_recorder import collect``).

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

import typing

from ._engine.plan import Postprocessor, reshaping
from ._engine.state import CallInputs
from ._support.errors import CallPlanError, InPlaceWarning
from ._support.lazy import lazy_attributes as _lazy_attributes
from .layers import DepthIdx, Layer, LayerTable
from .recorder import Recorder, Selection, check
from .reduce import Reducer, make_reducer
from .scope import Scope
from .select import children, modules

# Imported when first used (see `scio_recorder._support.lazy`): what a plain
# recorder does not need.
__getattr__, __dir__ = _lazy_attributes(
    __name__,
    {
        "CallRecorder": ".calls",
        "CheckReport": ".checks",
        "CollectResult": ".collect",
        "Estimate": ".collect",
        "RecordInfo": ".io",
        "RecorderGroup": ".group",
        "Records": ".io",
        "collect": ".collect",
        "estimate": ".collect",
        "load_records": ".io",
        "save_records": ".io",
    },
)

if typing.TYPE_CHECKING:
    # `scio_recorder.collect` is the subpackage, callable: calling it calls
    # the function `collect` (see `scio_recorder.collect._collect.
    # CollectModule`). Type checkers are told it is the function, which is
    # how it is called.
    from .calls import CallRecorder
    from .checks import CheckReport
    from .collect import CollectResult, Estimate, collect, estimate
    from .group import RecorderGroup
    from .io import RecordInfo, Records, load_records, save_records

__all__ = [
    "CallInputs",
    "CallPlanError",
    "CallRecorder",
    "CheckReport",
    "CollectResult",
    "DepthIdx",
    "Estimate",
    "InPlaceWarning",
    "Layer",
    "LayerTable",
    "Postprocessor",
    "RecordInfo",
    "Recorder",
    "RecorderGroup",
    "Records",
    "Reducer",
    "Scope",
    "Selection",
    "check",
    "children",
    "collect",
    "estimate",
    "load_records",
    "make_reducer",
    "modules",
    "reshaping",
    "save_records",
]

__version__ = "0.1.0"
