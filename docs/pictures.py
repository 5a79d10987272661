"""Make the pictures the docs show: ``python docs/pictures.py``.

Each picture is made from code in this repository, on models built in code
and data generated in code, so anyone can remake it. Rendering the graph
needs the ``graph`` extra and Graphviz's ``dot``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from scio_recorder import Recorder
from scio_recorder.models import demo_model

IMAGES = Path(__file__).resolve().parent / "images"


def demo_graph() -> Path:
    """Render the execution graph of the demo CNN, one layer recorded."""
    torch.manual_seed(0)
    rnet = Recorder(demo_model().eval(), input_size=(1, 3, 32, 32))
    rnet.record("features.3")
    return rnet.graph().render(IMAGES / "demo-graph.svg", expand_nested=True)


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    for make in (demo_graph,):
        print(make())
    return 0


if __name__ == "__main__":
    sys.exit(main())
