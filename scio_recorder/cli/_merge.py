"""``scio-recorder merge``: one activation set from the parts of independent workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse


def _merge(args: argparse.Namespace) -> int:
    from scio_recorder.activations import merge  # noqa: PLC0415 (heavier imports)

    ds = merge(args.folder)
    parts = len(ds.manifest["parts"][0]["rank_rows"])
    print(
        f"merged {parts} parts into '{ds.path / 'manifest.json'}': {len(ds)} "
        f"tokens, {ds.manifest['rows']} rows, layers {', '.join(ds.layers)}"
    )
    return 0
