"""Activation sets written on a Ray cluster: a recorder per actor, a part per task.

:class:`PartWriters` starts actors that each build a
:class:`~scio_recorder.Recorder` once (``make_recorder()``, on the actor's
machine, with its GPU), then runs ``write(..., part=K, parts=N)`` for each
part it is given: the part's batches come from ``batches(K, N)``, called in
the actor (a function that reads the part's shard of the corpus, or takes
the part's split of a materialised Ray dataset: :class:`DatasetParts`).
:func:`write_parts` does it all and merges
(:func:`~scio_recorder.activations.merge`).

Why: LLM batch inference across many nodes runs on Ray; what it lacks is a
way to write one activation set from many actors that may die. A part is
the unit of retry: an actor killed mid-part is restarted by Ray
(``max_restarts``) and its task retried (``max_task_retries``), and the
retried ``write`` resumes the part from its last checkpoint in
``part-<K>.partial`` (shards written after it are removed), so the merged
set has no duplicate row and no partial shard. No ``torch.distributed``
process group is created. The folder must be on a file system every actor
and the driver see.

Ray is imported when first used (the optional extra ``ray``:
``pip install scio-recorder[ray]``).
"""

from __future__ import annotations

__all__ = ["DatasetParts", "PartWriters", "write_parts"]

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._parts import merge

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scio_recorder.recorder import Recorder

    from ._dataset import ActivationDataset


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as error:
        msg = (
            "scio_recorder.activations.ray needs Ray: `pip install "
            "scio-recorder[ray]` (or `pip install ray`)."
        )
        raise ImportError(msg) from error


class DatasetParts:
    """Part ``K`` of ``N`` of a Ray dataset, as batches of tensors: ``batches(K, N)``.

    The dataset is materialised once (in the driver, when this is made), so
    that its split is the same every time a part is run or retried:
    ``dataset.split(N)[K].iter_torch_batches(batch_size=batch_size)``, each
    batch a dict of the dataset's columns as tensors (give it the model's
    keyword inputs only: ``input_ids``, ``attention_mask``, ...). A
    callable to give :meth:`PartWriters.submit` or :func:`write_parts`.

    Parameters
    ----------
    dataset : ray.data.Dataset
        The token stream, one row per sequence.
    batch_size : int
        Sequences per batch.

    Examples
    --------
    With Ray running::

        ds = ray.data.read_parquet("tokens/").select_columns(["input_ids"])
        batches = DatasetParts(ds, batch_size=32)
        acts = write_parts(make_recorder, batches, "acts", parts=16, ...)

    >>> DatasetParts.__name__
    'DatasetParts'

    """

    def __init__(self, dataset: Any, *, batch_size: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            msg = f"`batch_size` must be an int >= 1, got {batch_size!r}"
            raise TypeError(msg)
        if batch_size < 1:
            msg = f"`batch_size` must be an int >= 1, got {batch_size!r}"
            raise ValueError(msg)
        self.dataset = dataset.materialize()
        self.batch_size = batch_size

    def __call__(self, part: int, parts: int) -> Iterable[Any]:
        """Return part ``part`` of ``parts``'s batches."""
        split = self.dataset.split(parts)[part]
        return split.iter_torch_batches(batch_size=self.batch_size)  # type: ignore[no-any-return]


class _Writer:
    """The actor: one recorder, built once; one ``write`` per part it is given."""

    def __init__(self, make_recorder: Callable[[], Recorder]) -> None:
        self.rnet = make_recorder()

    def write(
        self,
        batches: Callable[[int, int], Iterable[Any]],
        path: str,
        part: int,
        parts: int,
        options: dict[str, Any],
    ) -> dict[str, int]:
        from ._write import write  # noqa: PLC0415 (in the actor)

        ds = write(
            self.rnet, batches(part, parts), path, part=part, parts=parts, **options
        )
        return {"part": part, "tokens": len(ds), "pid": os.getpid()}


class PartWriters:
    """A pool of Ray actors writing the parts of activation sets.

    Parameters
    ----------
    make_recorder : callable
        Builds the :class:`~scio_recorder.Recorder` of an actor (called once
        in each actor, on its machine; it must be picklable, e.g. a
        module-level function).
    actors : int, default 2
        How many actors (each runs one part at a time).
    max_restarts : int, default 3
        How often Ray restarts an actor that died; its task of the moment is
        retried as often (``max_task_retries``) and resumes the part.
    **actor_options
        Given to ``ray.remote`` for each actor: ``num_cpus``, ``num_gpus``,
        ``resources``, ``runtime_env``, ...

    Attributes
    ----------
    actors : list
        The actors' handles (``ray.kill`` one to see a part retried).

    Examples
    --------
    A pool is made after ``ray.init()``, and parts are written with
    :meth:`write` (or :meth:`submit`, which returns Ray's references)::

        pool = PartWriters(make_recorder, actors=4, num_gpus=1)
        ds = pool.write(batches, "acts", parts=64, layers=["model.layers.8"])

    >>> PartWriters.__name__
    'PartWriters'

    """

    def __init__(
        self,
        make_recorder: Callable[[], Recorder],
        *,
        actors: int = 2,
        max_restarts: int = 3,
        **actor_options: Any,
    ) -> None:
        if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
            msg = f"`actors` must be an int >= 1, got {actors!r}"
            raise ValueError(msg)
        ray = _ray()
        remote = ray.remote(
            max_restarts=max_restarts, max_task_retries=max_restarts, **actor_options
        )(_Writer)
        self.actors = [remote.remote(make_recorder) for _ in range(actors)]

    def submit(
        self,
        batches: Callable[[int, int], Iterable[Any]],
        path: str | os.PathLike[str],
        *,
        parts: int,
        **options: Any,
    ) -> list[Any]:
        """Give part ``K`` to actor ``K % actors``; return Ray's references.

        ``batches(K, parts)`` gives part ``K``'s batches (called in the
        actor, again when the part is retried: it must give the same
        batches); ``options`` are :func:`~scio_recorder.activations.write`'s
        (``layers=`` included). Each reference gives ``{"part", "tokens",
        "pid"}`` once its part is written.
        """
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
            msg = f"`parts` must be an int >= 1, got {parts!r}"
            raise ValueError(msg)
        folder = str(Path(path).resolve())
        return [
            self.actors[part % len(self.actors)].write.remote(
                batches, folder, part, parts, options
            )
            for part in range(parts)
        ]

    def write(
        self,
        batches: Callable[[int, int], Iterable[Any]],
        path: str | os.PathLike[str],
        *,
        parts: int,
        **options: Any,
    ) -> ActivationDataset:
        """Write every part (:meth:`submit`), wait for them, and merge them."""
        _ray().get(self.submit(batches, path, parts=parts, **options))
        return merge(path)


def write_parts(  # noqa: PLR0913 (the pool's and the write's options)
    make_recorder: Callable[[], Recorder],
    batches: Callable[[int, int], Iterable[Any]],
    path: str | os.PathLike[str],
    *,
    parts: int,
    actors: int = 2,
    max_restarts: int = 3,
    actor_options: dict[str, Any] | None = None,
    **options: Any,
) -> ActivationDataset:
    """Write an activation set as ``parts`` parts on Ray actors, then merge it.

    ``PartWriters(make_recorder, actors=..., max_restarts=...,
    **actor_options).write(batches, path, parts=parts, **options)``; see
    :class:`PartWriters`. Call ``ray.init(...)`` first (or let Ray start a
    local cluster).

    Returns
    -------
    ActivationDataset
        The merged set.

    Examples
    --------
    On a cluster, with a function giving part ``K`` of ``N``'s batches::

        ds = write_parts(
            make_recorder,
            batches,
            "acts",
            parts=16,
            layers=["transformer.h.6"],
            actors=8,
            actor_options={"num_gpus": 1},
        )

    >>> write_parts.__name__
    'write_parts'

    """
    pool = PartWriters(
        make_recorder,
        actors=actors,
        max_restarts=max_restarts,
        **(actor_options or {}),
    )
    return pool.write(batches, path, parts=parts, **options)
