"""The benchmark's results: one seed's run, and the tables over the seeds.

:class:`BenchmarkRun` (one seed: the trained net and its
:class:`~scio_recorder.ood.OoDResults`) and :class:`BenchmarkResults` (every
detector x OoD set over the seeds: mean and spread, exported and printed as
tables written by :func:`~scio_recorder._support.render.metric_table`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from scio_recorder._support.render import metric_table
from scio_recorder.ood._results import OoDResults, legend
from scio_recorder.ood.metrics import check_metric_names

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scio_recorder.recorder import Recorder

    from ._data import BenchmarkData


@dataclasses.dataclass
class BenchmarkRun:
    """One seed of a benchmark: the trained net and its results."""

    seed: int
    accuracy: float
    """The net's closed-set accuracy on the ID test data."""
    results: OoDResults
    """Every detector against every OoD set, with near/far means."""
    seconds: dict[str, float]
    """Time per step: ``data``, ``train``, ``fit``, ``evaluate``."""
    rnet: Recorder = dataclasses.field(repr=False)
    """The trained net, wrapped."""
    data: BenchmarkData = dataclasses.field(repr=False)
    """The data of this seed."""


class BenchmarkResults:
    """Every detector x OoD set (and group mean), over several seeds.

    ``values(detector, column, metric)`` lists one number per seed;
    :meth:`mean` and :meth:`std` (the sample standard deviation, ``n - 1``
    in the denominator; 0 for a single seed) summarise them. A group mean
    (``"near mean"``, ``"far mean"``) is taken per seed over the group's
    sets, then summarised over the seeds, as in OpenOOD. Prints as aligned
    tables (``str``), one per metric, cells ``mean ± std``;
    :meth:`to_markdown` gives the same as Markdown.

    Attributes
    ----------
    benchmark : str
        The benchmark's name.
    runs : list of BenchmarkRun
        One per seed, in order; ``runs[i].results`` is that seed's
        :class:`~scio_recorder.ood.OoDResults` (with the scores, for plots).
    """

    def __init__(
        self, benchmark: str, runs: Sequence[BenchmarkRun], description: str = ""
    ) -> None:
        """Check that every run has the same detectors and sets."""
        if not runs:
            msg = "BenchmarkResults needs at least one run (one seed)"
            raise ValueError(msg)
        self.benchmark = benchmark
        self.runs = list(runs)
        self.description = description
        first = self.runs[0].results
        for run in self.runs[1:]:
            if (
                run.results.detectors != first.detectors
                or run.results.columns != first.columns
            ):
                msg = (
                    f"BenchmarkResults: seed {run.seed} has detectors "
                    f"{run.results.detectors} and columns {run.results.columns}, "
                    f"seed {self.runs[0].seed} {first.detectors} and {first.columns}"
                )
                raise ValueError(msg)

    @property
    def seeds(self) -> list[int]:
        """The seeds, one per run."""
        return [run.seed for run in self.runs]

    @property
    def detectors(self) -> list[str]:
        """The detectors' names, in order."""
        return self.runs[0].results.detectors

    @property
    def columns(self) -> list[str]:
        """The OoD sets, then the group means (``near mean``, ``far mean``)."""
        return self.runs[0].results.columns

    @property
    def groups(self) -> dict[str, list[str]]:
        """Group name -> its sets."""
        return self.runs[0].results.groups

    @property
    def accuracy(self) -> list[float]:
        """The net's closed-set accuracy on the ID test data, per seed."""
        return [run.accuracy for run in self.runs]

    def values(self, detector: str, column: str, metric: str) -> list[float]:
        """Return ``metric`` of ``detector`` on a set or group, one per seed.

        Raises
        ------
        KeyError
            Naming the unknown detector, column or metric, and the known ones.
        """
        return [run.results.value(detector, column, metric) for run in self.runs]

    def mean(self, detector: str, column: str, metric: str) -> float:
        """Return the mean over the seeds of :meth:`values`."""
        return _mean(self.values(detector, column, metric))

    def std(self, detector: str, column: str, metric: str) -> float:
        """Return the sample standard deviation over the seeds (0 for one seed)."""
        return _std(self.values(detector, column, metric))

    def _cells(self, metric: str, columns: Sequence[str]) -> list[list[str]]:
        return [
            [
                name,
                *(_cell(self.values(name, c, metric)) for c in columns),
            ]
            for name in self.detectors
        ]

    def _columns(self, columns: Sequence[str] | None) -> list[str]:
        chosen = self.columns if columns is None else list(columns)
        unknown = [c for c in chosen if c not in self.columns]
        if unknown:
            msg = f"unknown columns {unknown}; the results have {self.columns}"
            raise ValueError(msg)
        return chosen

    def _metrics(self, metrics: Sequence[str]) -> list[str]:
        return check_metric_names(metrics)

    def _head(self, metrics: Sequence[str]) -> list[str]:
        seeds = ", ".join(map(str, self.seeds))
        groups = "; ".join(f"{g} = {', '.join(s)}" for g, s in self.groups.items())
        acc = self.accuracy
        spread = (
            "one run: no spread over seeds (run several for mean ± std)"
            if len(self.runs) < 2  # noqa: PLR2004 (a spread needs two runs)
            else "mean ± std over the seeds (sample std, n - 1)"
        )
        count = f"{len(self.runs)} seed{'s' if len(self.runs) > 1 else ''}"
        lines = [
            (
                f"OoD benchmark {self.benchmark!r}: {len(self.detectors)} detectors, "
                f"{count} ({seeds}); {spread}"
            ),
        ]
        if self.description:
            lines.append(self.description)
        lines.append(
            f"closed-set accuracy on the ID test data {_cell(acc)}"
            + (f"; groups: {groups}" if groups else "")
        )
        lines += [line for m in metrics for line in legend(m).split("\n")]
        return lines

    def to_text(
        self,
        metrics: Sequence[str] = ("AUROC", "FPR95-ID"),
        columns: Sequence[str] | None = None,
    ) -> str:
        """Return one aligned plain-text table per metric, cells ``mean ± std``.

        Parameters
        ----------
        metrics : sequence of str, default ("AUROC", "FPR95-ID")
            Among :data:`~scio_recorder.ood.metrics.ALL_METRICS` and the others
            :func:`~scio_recorder.ood.metrics.metric_function` knows (``MCC``,
            ``pAUROC@0.1``, ...); the legend names each one's convention
            (``FPR95-ID``: ID positive, OpenOOD v1.5's).
        columns : sequence of str, optional
            Sets and groups to show; default all (:attr:`columns`).
        """
        metrics = self._metrics(metrics)
        shown = self._columns(columns)
        out = self._head(metrics)
        for metric in metrics:
            table = metric_table(["detector", *shown], self._cells(metric, shown))
            out += ["", metric, *table]
        return "\n".join(out)

    def to_markdown(
        self,
        metrics: Sequence[str] = ("AUROC", "FPR95-ID"),
        columns: Sequence[str] | None = None,
    ) -> str:
        """Return one Markdown table per metric (legend first), as :meth:`to_text`."""
        metrics = self._metrics(metrics)
        shown = self._columns(columns)
        out = [f"{line}  " for line in self._head(metrics)]
        for metric in metrics:
            out += ["", f"**{metric}** (mean ± std over {len(self.runs)} seeds)", ""]
            out += metric_table(
                ["detector", *shown], self._cells(metric, shown), markdown=True
            )
        return "\n".join(out)

    def __str__(self) -> str:
        """Return :meth:`to_text`."""
        return self.to_text()

    def __repr__(self) -> str:
        """Show the benchmark, the seeds and the detectors."""
        return (
            f"BenchmarkResults({self.benchmark!r}, seeds={self.seeds}, "
            f"columns={self.columns}, detectors={self.detectors})"
        )


def _cell(values: Sequence[float]) -> str:
    if len(values) < 2:  # noqa: PLR2004 (one run: no spread to show)
        return f"{_mean(values):.3f}"
    return f"{_mean(values):.3f} ± {_std(values):.3f}"


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:  # noqa: PLR2004 (a spread needs two values)
        return 0.0
    mean = _mean(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
