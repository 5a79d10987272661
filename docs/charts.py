"""Draw the docs' charts from the tables the pages show: ``python docs/charts.py``.

Each chart reads a Markdown table of a page (the numbers a reader can check
there) and draws it with matplotlib into ``docs/images/``:

* ``digits-auroc.png``: the AUROC of each detector on the digits benchmark,
  near and far means with their spread over the seeds (``images/ood-table.md``,
  made by ``docs/pictures.py``), shown on the OoD page;
* ``overhead.png``: what recording costs, each scenario's ratio to a plain
  pass (``benchmarks.md``, ``benchmarks/overhead.py``);
* ``memory.png``: the memory a fit takes by the number of fit samples, and
  the nearest-neighbour search's by the bank's size (``benchmarks.md``).

``tests/test_docs_extras.py`` checks that each table is found with the
columns a chart reads.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
IMAGES = DOCS / "images"


def table(text: str, header: str) -> list[list[str]]:
    """Return the rows (cells as text) of the table whose header starts ``header``."""
    start = text.index(header)
    lines = text[start:].splitlines()
    rows = []
    for line in lines[2:]:  # past the header and the rule
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    """``"+12.74"``, ``"1,024"``, ``"0.951 ± 0.020"`` -> the first number."""
    found = re.search(r"[-+]?[\d,]*\.?\d+", cell)
    if found is None:
        msg = f"no number in {cell!r}"
        raise ValueError(msg)
    return float(found[0].replace(",", ""))


def spread(cell: str) -> tuple[float, float]:
    """``"0.951 ± 0.020"`` -> ``(0.951, 0.020)``."""
    mean, _, std = cell.partition("±")
    return float(mean), float(std or 0)


def auroc_rows() -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    """Return each detector's near and far mean AUROC (with spread), from the table."""
    text = (IMAGES / "ood-table.md").read_text(encoding="utf-8")
    start = text.index("**AUROC**")  # the AUROC table comes first
    first = text[start : text.index("**FPR95-ID**")]
    header = first[first.index("| detector |") :].splitlines()[0]
    columns = [c.strip() for c in header.strip().strip("|").split("|")]
    near, far = columns.index("near mean"), columns.index("far mean")
    return [
        (row[0], spread(row[near]), spread(row[far]))
        for row in table(first, "| detector |")
    ]


def figure(width: float, height: float):  # noqa: ANN201 (matplotlib's Figure)
    from matplotlib.figure import Figure  # noqa: PLC0415 (the plot extra)

    return Figure(figsize=(width, height), layout="constrained")


def digits_auroc() -> Path:
    rows = sorted(auroc_rows(), key=lambda row: row[1][0])
    fig = figure(8, 0.22 * len(rows) + 1.4)
    ax = fig.add_subplot()
    ys = range(len(rows))
    for offset, index, label, colour in (
        (-0.2, 1, "near mean (unseen digits 6-9)", "#1f77b4"),
        (0.2, 2, "far mean (noise, inverted, rotated)", "#ff7f0e"),
    ):
        ax.barh(
            [y + offset for y in ys],
            [row[index][0] for row in rows],
            xerr=[row[index][1] for row in rows],
            height=0.4,
            color=colour,
            label=label,
            error_kw={"elinewidth": 0.8, "capsize": 1.5},
        )
    ax.axvline(0.5, color="grey", linestyle=":", linewidth=1)
    ax.set_yticks(list(ys), [row[0] for row in rows], fontsize=7)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("AUROC (mean ± std over the seeds; below 0.5: a reversed ranking)")
    ax.set_title("The digits benchmark: AUROC per detector", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    path = IMAGES / "digits-auroc.png"
    fig.savefig(path, dpi=100)
    return path


def overhead() -> Path:
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    rows = table(text, "| model | scenario | median µs |")
    models = list(dict.fromkeys(row[0] for row in rows))
    fig = figure(10, 3.6)
    axes = fig.subplots(1, len(models), sharey=False)
    for ax, model in zip(axes, models, strict=True):
        mine = [row for row in rows if row[0] == model and "grad" not in row[1]]
        names = [row[1] for row in mine]
        ratios = [number(row[4]) for row in mine]
        colours = ["#1f77b4" if n.startswith("recorder") else "#999999" for n in names]
        ax.barh(range(len(names)), ratios, color=colours)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.axvline(1, color="black", linewidth=0.8)
        ax.set_xlim(0, max(1.6, max(ratios) + 0.05))  # from 0: bars in proportion
        ax.invert_yaxis()
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("time / plain pass", fontsize=8)
    fig.suptitle(
        "What recording costs (blue: the recorder, grey: hand-written hooks)",
        fontsize=10,
    )
    path = IMAGES / "overhead.png"
    fig.savefig(path, dpi=100)
    return path


def memory() -> Path:
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    fits = table(text, "| fit | 256 | 4,096 | 16,384 | growth |")
    search = table(text, "| bank rows | bank MiB | method | extra memory MiB |")
    fig = figure(10, 3.8)
    left, right = fig.subplots(1, 2)
    sizes = [256, 4096, 16384]
    for row in fits:
        label = row[0].replace("`", "")
        left.plot(sizes, [number(c) for c in row[1:4]], marker="o", label=label)
    left.set_xscale("log")
    left.set_xticks(sizes, ["256", "4,096", "16,384"])
    left.set_xlabel("fit samples")
    left.set_ylabel("peak memory of the fit (MiB)")
    left.set_title("A fit's memory by its samples (demo CNN)", fontsize=9)
    left.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    for method in dict.fromkeys(row[2] for row in search):
        mine = [row for row in search if row[2] == method]
        right.plot(
            [number(row[0]) for row in mine],
            [number(row[3]) for row in mine],
            marker="o",
            label=method,
        )
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("bank rows")
    right.set_ylabel("extra memory of the search (MiB)")
    right.set_title("Nearest-neighbour search by the bank's size", fontsize=9)
    right.legend(fontsize=8)
    path = IMAGES / "memory.png"
    fig.savefig(path, dpi=100)
    return path


def main() -> int:
    for draw in (digits_auroc, overhead, memory):
        print(draw())
    return 0


if __name__ == "__main__":
    sys.exit(main())
