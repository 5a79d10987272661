"""Deprecated: the helpers of the recipes live in :mod:`scio_recorder.data` and :mod:`scio_recorder.ood`.

Every name of this module still works, with a :class:`DeprecationWarning`
that names its new place:

| name | now |
|---|---|
| ``mahalanobis_scores`` | :func:`scio_recorder.ood.mahalanobis_scores` |
| ``make_blobs_images``, ``train_classifier``, ``class_colours``, ``Pattern`` | :mod:`scio_recorder.data` |

``auroc`` was removed: it rated scores with the in-distribution samples as
positives, and returned ``1 - x`` where :func:`scio_recorder.ood.metrics.auroc`
returns ``x`` on the same lists. Importing it raises an :class:`ImportError`
that says what to use.

Examples
--------
>>> import warnings
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     from scio_recorder.recipes import mahalanobis_scores
>>> print(caught[0].message)
scio_recorder.recipes.mahalanobis_scores moved: import it from scio_recorder.ood (`from scio_recorder.ood import mahalanobis_scores`); scio_recorder.recipes will be removed.

"""  # noqa: E501 (a table, doctest output)

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    "Pattern": "scio_recorder.data",
    "class_colours": "scio_recorder.data",
    "make_blobs_images": "scio_recorder.data",
    "train_classifier": "scio_recorder.data",
    "mahalanobis_scores": "scio_recorder.ood",
}
"""Each name of this module, by the module that now holds it."""

# each name is provided, with a warning, by `__getattr__`
__all__ = [
    "Pattern",  # noqa: F822 (from `__getattr__`)
    "class_colours",  # noqa: F822 (from `__getattr__`)
    "mahalanobis_scores",  # noqa: F822 (from `__getattr__`)
    "make_blobs_images",  # noqa: F822 (from `__getattr__`)
    "train_classifier",  # noqa: F822 (from `__getattr__`)
]

_AUROC_REMOVED = (
    "scio_recorder.recipes.auroc was removed: it counted in-distribution "
    "samples as positives (higher score = more in-distribution) and so returned "
    "1 - x where scio_recorder.ood.metrics.auroc returns x on the same lists. "
    "Use `from scio_recorder.ood.metrics import auroc`: `auroc(id_scores, "
    "ood_scores)` counts OoD samples as positives (higher score = more OoD, the "
    "convention of every detector of scio_recorder.ood), i.e. it is the "
    "probability that an OoD sample scores higher than an in-distribution one. "
    "For confidence scores (higher = more in-distribution, as "
    "`mahalanobis_scores` returns), negate them: `auroc(-in_scores, "
    "-out_scores)` is the number the removed function gave."
)


def __getattr__(name: str) -> Any:
    """Return a moved name with a :class:`DeprecationWarning`; raise for ``auroc``.

    ``from scio_recorder.recipes import auroc`` raises :class:`ImportError`
    with the message, which names the replacement and its convention.
    """
    if name == "auroc":
        raise ImportError(_AUROC_REMOVED, name=__name__)
    where = _MOVED.get(name)
    if where is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    warnings.warn(
        f"{__name__}.{name} moved: import it from {where} (`from {where} import "
        f"{name}`); {__name__} will be removed.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(where), name)


def __dir__() -> list[str]:
    """List the moved names too."""
    return sorted([*globals(), *_MOVED])
