"""scio 1.1's conformities on a saved net and data: the reference of test_ood_scio.

Run by ``tests/test_ood_scio.py`` under the interpreter ``$SCIO_PYTHON``
(scio-pypi 1.1 needs Python >= 3.12): ``python tests/scio_reference.py
FOLDER``. ``FOLDER`` holds ``net.pt`` (the whole net, pickled),
``data.pt`` (``calib_x``, ``calib_y``, ``query_x``) and ``configs.json``
(one score a row: ``name``, scio's ``score`` class, its ``params``, the
``layers`` recorded as ``[depth, idx]``, ``dtype`` and scio's ``mode``).
It writes ``out.pt``: ``name -> {"out": logits, "conformity": [Q,
classes]}``. Nothing of scio is imported unless run as a script, so the
module imports under any Python (pytest collects doctests from it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def conformities(folder: Path) -> dict[str, dict[str, Any]]:
    """Return scio's output and conformity for each config of ``folder``."""
    import torch  # noqa: PLC0415 (run under SCIO_PYTHON only)
    from scio import scores  # noqa: PLC0415 (idem)
    from scio.recorder import Recorder  # noqa: PLC0415 (idem)

    net = torch.load(folder / "net.pt", weights_only=False).eval()
    data = torch.load(folder / "data.pt")
    configs = json.loads((folder / "configs.json").read_text())
    results = {}
    for config in configs:
        dtype = getattr(torch, config["dtype"])
        model = net.to(dtype)
        rnet = Recorder(model, input_data=data["query_x"][:1].to(dtype))
        rnet.record(*(tuple(label) for label in config["layers"]))
        params = dict(config["params"])
        if "prior" in params.get("test", {}):
            params["test"] = {
                **params["test"],
                "prior": torch.tensor(params["test"]["prior"], dtype=dtype),
            }
        score = getattr(scores, config["score"])(**params, mode=config["mode"])
        score.fit(rnet, data["calib_x"].to(dtype), data["calib_y"])
        out, conformity = score(data["query_x"].to(dtype))
        results[config["name"]] = {
            "out": out.detach(),
            "conformity": conformity.detach(),
        }
    return results


if __name__ == "__main__":
    where = Path(sys.argv[1])
    import torch

    torch.save(conformities(where), where / "out.pt")
