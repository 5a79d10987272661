"""SAEs built and saved by SAELens itself: the reference of test_sae_saelens.

Run by ``tests/test_sae_saelens.py`` under the interpreter
``$SAELENS_PYTHON`` (a virtual environment with ``sae-lens`` installed):
``python tests/saelens_reference.py FOLDER``. ``FOLDER/cases.json`` lists
the cases (``name``, the SAELens config ``cfg``, the input ``shape``). For
each, SAELens builds the SAE from the config (``SAE.from_dict``), its
parameters are drawn at random (seeded), it is saved with
``sae.save_model(FOLDER/name)``, and ``FOLDER/name/reference.safetensors``
gets the input ``x`` and what SAELens computes of it: ``latents =
sae.encode(x)``, ``decoded = sae.decode(latents)`` (right after the
encode: a normalising SAE reads the input's scale the encode left on the
module) and ``out = sae(x)``. Nothing of SAELens is imported unless run as
a script, so the module imports under any Python (pytest collects
doctests from it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def build(folder: Path) -> list[str]:
    """Build, save and run every case of ``folder/cases.json``; return their names."""
    import torch  # noqa: PLC0415 (run under SAELENS_PYTHON only)
    from sae_lens import SAE  # noqa: PLC0415 (idem)
    from safetensors.torch import save_file  # noqa: PLC0415 (idem)

    cases: list[dict[str, Any]] = json.loads((folder / "cases.json").read_text())
    done = []
    for number, case in enumerate(cases):
        generator = torch.Generator().manual_seed(1000 + number)
        sae = SAE.from_dict(case["cfg"])
        with torch.no_grad():
            for name, parameter in sae.named_parameters():
                values = torch.randn(parameter.shape, generator=generator)
                if name == "threshold":  # positive, some latents above it
                    values = values.abs() * 0.5
                elif name.startswith("b_"):
                    values = values * 0.1
                else:
                    values = values / parameter.shape[0] ** 0.5
                parameter.copy_(values.to(parameter.dtype))
        sae.eval()
        target = folder / case["name"]
        sae.save_model(target)
        x = torch.randn(case["shape"], generator=generator) * 3 + 0.5
        with torch.no_grad():
            latents = sae.encode(x)
            decoded = sae.decode(latents)
            out = sae(x)
        tensors = {"x": x, "latents": latents, "decoded": decoded, "out": out}
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(target / "reference.safetensors"),
        )
        done.append(case["name"])
    return done


if __name__ == "__main__":
    names = build(Path(sys.argv[1]))
    print(json.dumps(names))
