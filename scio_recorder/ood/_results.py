"""The results of an evaluation and their tables.

An :class:`Evaluation` (one OoD set: a mapping detector name -> metrics,
keeping the scores for histograms and ROC curves) and an :class:`OoDResults`
(several named OoD sets: a mapping set name -> :class:`Evaluation`) that
prints, exports and plots as one detector x set table of every metric, with
near/far group means as in OpenOOD's tables; :func:`legend` explains a
metric under a table. The tables are written by
:func:`~scio_recorder._support.render.metric_table`.
:func:`~scio_recorder.ood.evaluate` (``_evaluate``) makes them.
"""

from __future__ import annotations

__all__ = ["ACC", "Evaluation", "OoDResults", "legend"]

import html
import importlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from scio_recorder._support.render import metric_table

from .metrics import (
    ALL_METRICS,
    METRICS,
    TABLE_METRICS,
    check_metric_names,
    describe_metric,
    metric_function,
    ood_metrics,
)

ACC = "ACC"
"""The column of the closed-set accuracy of the in-distribution data."""

_LEGEND = {
    "AUROC": "AUROC: OoD positive, higher is better.\n"
    "AUROC < 0.5 means a reversed ranking: the detector ranks ID above OoD.",
    "FPR95-ID": "FPR95-ID: false-positive rate at 95 % ID recall (ID positive, "
    "OpenOOD v1.5's FPR@95; OpenOOD's since August 2023 is FPR95-OOD): the "
    "fraction of OoD samples taken for ID at the threshold "
    "keeping 95 % of ID; lower is better.",
    "FPR95-OOD": "FPR95-OOD: the fraction of ID samples flagged at 95 % OoD recall "
    "(OoD positive, OpenOOD's FPR@95 since August 2023); lower is better.",
    "FPR95TPR": "FPR95TPR: FPR95-OOD under its old name (OoD positive).",
    "AUPR-IN": "AUPR-IN: average precision, ID positive; higher is better.",
    "AUPR-OUT": "AUPR-OUT: average precision, OoD positive; higher is better.",
    ACC: "ACC: closed-set accuracy on the ID data, from the logits of the pass "
    "that scored each detector.",
}


def legend(metric: str) -> str:
    """Return the lines a results table prints to explain ``metric``."""
    return _LEGEND.get(metric) or describe_metric(metric)


class Evaluation(Mapping[str, dict[str, float]]):
    """Detector name -> metrics, on one OoD set.

    Each detector's metrics are :data:`~scio_recorder.ood.metrics.ALL_METRICS`:
    ``AUROC``, ``AUPR-IN``, ``AUPR-OUT``, ``FPR95TPR`` (OoD positive, the old
    name), ``FPR95-ID`` (ID positive, OpenOOD v1.5's FPR@95) and ``FPR95-OOD``
    (OoD positive, the same as ``FPR95TPR``; OpenOOD's FPR@95 since August
    2023). Any other metric of
    :func:`~scio_recorder.ood.metrics.metric_function` (``MCC``,
    ``pAUROC@0.1``, ...) is computed on request from the kept scores
    (:meth:`metric`, and the results tables' ``metrics=``).

    Attributes
    ----------
    id_scores, ood_scores : dict of str to Tensor
        Each detector's scores on the in-distribution and the OoD data.
    name : str
        The OoD set's name (for tables and plots).
    accuracy : dict of str to float
        Each detector's closed-set accuracy on the in-distribution data (when
        :func:`evaluate` had ``target=``), else empty.

    Examples
    --------
    >>> import torch
    >>> ev = Evaluation({"a": torch.tensor([0.0, 1.0])}, {"a": torch.tensor([2.0])})
    >>> ev["a"]["AUROC"], ev["a"]["FPR95-ID"], ev.metric("a", "MCC")
    (1.0, 0.0, 1.0)

    """

    def __init__(
        self,
        id_scores: dict[str, Tensor],
        ood_scores: dict[str, Tensor],
        name: str = "OoD",
        *,
        accuracy: Mapping[str, float] | None = None,
    ) -> None:
        """Compute the metrics of each detector."""
        self.id_scores = id_scores
        self.ood_scores = ood_scores
        self.name = name
        self.accuracy = dict(accuracy or {})
        for key, scores in id_scores.items():
            _refuse_nan(key, scores, "the in-distribution data")
            _refuse_nan(key, ood_scores[key], f"the OoD set {name!r}")
        self._metrics = {
            key: ood_metrics(id_scores[key], ood_scores[key], names=ALL_METRICS)
            for key in id_scores
        }
        self._requested: dict[tuple[str, str], float] = {}

    def metric(self, key: str, name: str) -> float:
        """Return metric ``name`` of detector ``key``, computing it if needed.

        ``name`` is any metric :func:`~scio_recorder.ood.metrics.metric_function`
        knows; those outside :data:`~scio_recorder.ood.metrics.ALL_METRICS`
        are computed from the kept scores once, then cached.

        Raises
        ------
        KeyError
            For an unknown detector.
        ValueError
            For an unknown metric name.
        """
        if key not in self._metrics:
            msg = f"no detector named {key!r}; the evaluation has {list(self)}"
            raise KeyError(msg)
        if name in self._metrics[key]:
            return self._metrics[key][name]
        function = metric_function(name)
        if (key, name) not in self._requested:
            self._requested[key, name] = function(
                self.id_scores[key], self.ood_scores[key]
            )
        return self._requested[key, name]

    def __getitem__(self, key: str) -> dict[str, float]:
        """Return the metrics of detector ``key``."""
        return self._metrics[key]

    def __iter__(self) -> Iterator[str]:
        """Iterate over detector names, in the order given."""
        return iter(self._metrics)

    def __len__(self) -> int:
        """Return the number of detectors."""
        return len(self._metrics)

    @property
    def results(self) -> OoDResults:
        """Return the :class:`OoDResults` of this one set (its tables)."""
        return OoDResults({self.name: self})

    def table(self) -> str:
        """Return the metrics as a Markdown table, one row per detector.

        The four :data:`~scio_recorder.ood.metrics.METRICS` (``FPR95TPR``: OoD
        positive), as always; :meth:`to_markdown` gives the results tables.
        """
        header = [f"detector ({self.name})", *METRICS]
        rows = [
            [key, *(f"{values[m]:.3f}" for m in METRICS)]
            for key, values in self._metrics.items()
        ]
        return "\n".join(metric_table(header, rows, markdown=True))

    def to_text(self, metrics: Sequence[str] | None = None) -> str:
        """Return the aligned plain-text tables (:meth:`OoDResults.to_text`)."""
        return self.results.to_text(metrics)

    def to_markdown(self, metrics: Sequence[str] | None = None) -> str:
        """Return the Markdown tables (:meth:`OoDResults.to_markdown`)."""
        return self.results.to_markdown(metrics)

    def to_pandas(self, metrics: Sequence[str] | None = None) -> Any:
        """Return a ``pandas.DataFrame`` (:meth:`OoDResults.to_pandas`)."""
        return self.results.to_pandas(metrics)

    def _repr_html_(self) -> str:
        return self.results._repr_html_()

    def __str__(self) -> str:
        """Return :meth:`to_text`."""
        return self.to_text()

    def __repr__(self) -> str:
        """Show the detectors and their AUROC."""
        inner = ", ".join(
            f"{k}: AUROC {v['AUROC']:.3f}" for k, v in self._metrics.items()
        )
        return f"Evaluation({self.name}; {inner})"


class OoDResults(Mapping[str, Evaluation]):
    """The results of several OoD sets: set name -> :class:`Evaluation`.

    Indexing works as on the dict :func:`evaluate` returned before
    (``results["noise"]["MSP"]["AUROC"]``); the object is also one detector x
    set table of every metric, with the means of named groups of sets
    (``near``/``far`` as in OpenOOD's tables), and the closed-set accuracy on
    the in-distribution data when :func:`evaluate` had ``target=``. It
    prints aligned (``str``), and gives :meth:`to_markdown`,
    :meth:`to_pandas` and an HTML table in Jupyter; every function of
    :mod:`scio_recorder.plot` that draws evaluations accepts it.

    Parameters
    ----------
    evaluations : Mapping of str to Evaluation
        One per OoD set, scored by the same detectors on the same ID data.
    groups : Mapping of str to sequence of str, optional
        Named groups of sets (e.g. ``{"near": ["a"], "far": ["b", "c"]}``):
        each gets a column of the mean over its sets, after the sets.

    Examples
    --------
    >>> import torch
    >>> from scio_recorder.ood import Evaluation, OoDResults
    >>> inside = {"A": torch.arange(10.0)}
    >>> results = OoDResults(
    ...     {
    ...         "far": Evaluation(inside, {"A": torch.arange(10.0) + 9}, "far"),
    ...         "near": Evaluation(inside, {"A": torch.arange(10.0) + 5}, "near"),
    ...     },
    ...     groups={"all": ["far", "near"]},
    ... )
    >>> results["far"]["A"]["AUROC"], results.value("A", "all", "AUROC")
    (0.995, 0.935)
    >>> print(results.to_text(["AUROC"]))  # doctest: +NORMALIZE_WHITESPACE
    OoD detection: 1 detectors x 2 OoD sets; groups: all = far, near
    AUROC: OoD positive, higher is better.
    AUROC < 0.5 means a reversed ranking: the detector ranks ID above OoD.
    <BLANKLINE>
    AUROC
    detector    far   near    all
    A         0.995  0.875  0.935

    """

    def __init__(
        self,
        evaluations: Mapping[str, Evaluation],
        *,
        groups: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Check the sets and the groups."""
        self._sets = dict(evaluations)
        if not self._sets:
            msg = "OoDResults needs at least one OoD set: a mapping name -> Evaluation"
            raise ValueError(msg)
        first = next(iter(self._sets.values()))
        self.detectors = list(first)
        for name, evaluation in self._sets.items():
            if list(evaluation) != self.detectors:
                msg = (
                    f"OoDResults: set {name!r} was scored by {list(evaluation)}, "
                    f"but the others by {self.detectors}: evaluate every set with "
                    "the same detectors."
                )
                raise ValueError(msg)
        self.accuracy: dict[str, float] = dict(first.accuracy)
        self.groups = _checked_groups(groups or {}, list(self._sets))

    # -- the mapping of the old dict --------------------------------------
    def __getitem__(self, key: str) -> Evaluation:
        """Return the :class:`Evaluation` of OoD set ``key``."""
        return self._sets[key]

    def __iter__(self) -> Iterator[str]:
        """Iterate over the OoD sets' names, in the order given."""
        return iter(self._sets)

    def __len__(self) -> int:
        """Return the number of OoD sets."""
        return len(self._sets)

    @property
    def sets(self) -> list[str]:
        """The OoD sets' names."""
        return list(self._sets)

    @property
    def id_scores(self) -> dict[str, Tensor]:
        """Each detector's scores on the in-distribution data."""
        return next(iter(self._sets.values())).id_scores

    # -- the table ---------------------------------------------------------
    def value(self, detector: str, column: str, metric: str) -> float:
        """Return ``metric`` of ``detector`` on a set, or its mean over a group.

        Raises
        ------
        KeyError
            Naming the unknown detector, column or metric, and the known ones.
        """
        if detector not in self.detectors:
            msg = f"no detector named {detector!r}; the results have {self.detectors}"
            raise KeyError(msg)
        try:
            check_metric_names([metric])
        except ValueError as error:
            raise KeyError(str(error)) from None
        if column in self._sets:
            return self._sets[column].metric(detector, metric)
        if column in self.groups:
            values = [
                self._sets[s].metric(detector, metric) for s in self.groups[column]
            ]
            return math.fsum(values) / len(values)
        msg = (
            f"no OoD set or group named {column!r}; the results have the sets "
            f"{self.sets} and the groups {list(self.groups)}"
        )
        raise KeyError(msg)

    @property
    def columns(self) -> list[str]:
        """The sets, then the groups (their means)."""
        return [*self._sets, *self.groups]

    def _metrics(self, metrics: Sequence[str] | None) -> list[str]:
        return check_metric_names(TABLE_METRICS if metrics is None else metrics)

    def _blocks(
        self, metrics: Sequence[str] | None
    ) -> list[tuple[str, list[str], list[list[str]]]]:
        """``(title, header, rows)`` per metric, then the accuracy."""
        blocks = []
        for metric in self._metrics(metrics):
            rows = [
                [name, *(f"{self.value(name, c, metric):.3f}" for c in self.columns)]
                for name in self.detectors
            ]
            blocks.append((metric, ["detector", *self.columns], rows))
        if self.accuracy:
            rows = [[name, f"{self.accuracy[name]:.3f}"] for name in self.detectors]
            blocks.append((ACC, ["detector", ACC], rows))
        return blocks

    def _head(self, metrics: Sequence[str] | None) -> list[str]:
        groups = "; ".join(f"{g} = {', '.join(s)}" for g, s in self.groups.items())
        lines = [
            f"OoD detection: {len(self.detectors)} detectors x {len(self._sets)} "
            f"OoD sets" + (f"; groups: {groups}" if groups else "")
        ]
        shown = self._metrics(metrics)
        legends = [legend(m) for m in shown]
        if self.accuracy:
            legends.append(_LEGEND[ACC])
        lines += [line for legend in legends for line in legend.split("\n")]
        return lines

    def to_text(self, metrics: Sequence[str] | None = None) -> str:
        """Return one aligned plain-text table per metric (and the accuracy).

        Parameters
        ----------
        metrics : sequence of str, optional
            Default :data:`~scio_recorder.ood.metrics.TABLE_METRICS`:
            ``AUROC``, ``FPR95-ID`` (ID positive, as OpenOOD v1.5), ``AUPR-IN``,
            ``AUPR-OUT``; any name of
            :func:`~scio_recorder.ood.metrics.metric_function` (``MCC``,
            ``pAUROC@0.1``, ``TPR@FPR0.05``, ...) on request.
        """
        out = self._head(metrics)
        for title, header, rows in self._blocks(metrics):
            out += ["", title, *metric_table(header, rows)]
        return "\n".join(out)

    def to_markdown(self, metrics: Sequence[str] | None = None) -> str:
        """Return one Markdown table per metric (and the accuracy), legend first."""
        out = [f"{line}  " for line in self._head(metrics)]
        for title, header, rows in self._blocks(metrics):
            out += ["", f"**{title}**", "", *metric_table(header, rows, markdown=True)]
        return "\n".join(out)

    def to_pandas(self, metrics: Sequence[str] | None = None) -> Any:
        """Return a ``pandas.DataFrame``: a row per detector, columns (metric, set).

        The columns are a ``MultiIndex`` of (metric, set or group), then
        ``("ACC", "ID")`` when the accuracy is known; values are floats.

        Raises
        ------
        ImportError
            If pandas is not installed (the message says how to install it).
        """
        try:
            pandas = importlib.import_module("pandas")
        except ImportError as error:
            msg = (
                "OoDResults.to_pandas needs pandas, which is not installed: "
                "`pip install pandas`; or use str(results) or "
                "results.to_markdown(), which need nothing."
            )
            raise ImportError(msg) from error
        columns = [(m, c) for m in self._metrics(metrics) for c in self.columns]
        data = [[self.value(name, c, m) for m, c in columns] for name in self.detectors]
        if self.accuracy:
            columns.append((ACC, "ID"))
            for row, name in zip(data, self.detectors, strict=True):
                row.append(self.accuracy[name])
        return pandas.DataFrame(
            data,
            index=pandas.Index(self.detectors, name="detector"),
            columns=pandas.MultiIndex.from_tuples(columns, names=["metric", "set"]),
        )

    def _repr_html_(self) -> str:
        parts = [f"<p>{'<br>'.join(map(html.escape, self._head(None)))}</p>"]
        for title, header, rows in self._blocks(None):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
            body = "".join(
                "<tr><th>"
                + html.escape(row[0])
                + "</th>"
                + "".join(f'<td style="text-align:right">{c}</td>' for c in row[1:])
                + "</tr>"
                for row in rows
            )
            parts.append(
                f"<table><caption>{html.escape(title)}</caption>"
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            )
        return "\n".join(parts)

    def __str__(self) -> str:
        """Return :meth:`to_text`."""
        return self.to_text()

    def __repr__(self) -> str:
        """Show the sets, the groups and the detectors."""
        groups = f", groups={self.groups}" if self.groups else ""
        return f"OoDResults(sets={self.sets}{groups}, detectors={self.detectors})"


def _refuse_nan(key: str, scores: Tensor, where: str) -> None:
    """Refuse NaN scores, naming the detector, the data and the count."""
    scores = torch.as_tensor(scores)
    bad = int(torch.isnan(scores).sum()) if scores.is_floating_point() else 0
    if bad:
        msg = (
            f"evaluate: {key!r} scored {bad} of the {scores.numel()} samples of "
            f"{where} NaN: those samples hold a NaN or an infinity (in the "
            "inputs, or in what the detector reads: look for an overflow). "
            "Drop them (e.g. keep `torch.isfinite(x).flatten(1).all(1)`), then "
            "evaluate again."
        )
        raise ValueError(msg)


def _checked_groups(
    groups: Mapping[str, Sequence[str]], sets: list[str]
) -> dict[str, list[str]]:
    checked: dict[str, list[str]] = {}
    for group, members in groups.items():
        if isinstance(members, str):
            members = [members]  # noqa: PLW2901 (one set named alone)
        names = list(members)
        unknown = [name for name in names if name not in sets]
        if unknown or not names:
            what = f"unknown OoD sets {unknown}" if unknown else "no OoD set"
            msg = (
                f"group {group!r} names {what}; the OoD sets are {sets}: name "
                "groups with the keys of `ood_batches`."
            )
            raise ValueError(msg)
        if group in sets:
            msg = (
                f"group {group!r} has the name of an OoD set; name it otherwise "
                "(its mean is a column next to the sets')."
            )
            raise ValueError(msg)
        checked[group] = names
    return checked
