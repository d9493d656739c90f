"""PNG plots: two runs' metric curves, and where gradient digests first differ.

Inputs are plain data (metric -> {step: value}, digest records), so
plots can be drawn from run directories long after the runs. matplotlib runs
headless (Agg). Figure sizes are fixed by the data's shape, not the screen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from bisect_prefetch.files import save_figure_atomic
from bisect_prefetch.metrics.digests import DigestRecord

DPI = 100
Series = Mapping[int, float]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    # Names come from jobs and files (a metric `$loss$`, a unit `a_$b`): plain text,
    # never mathtext, which would fail on them after a whole bisection's runs.
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | Path) -> Path:
    """Lay out, write atomically and close a figure (pyplot keeps every open one alive)."""
    fig.tight_layout()
    path = Path(path)
    save_figure_atomic(fig, path, dpi=DPI)
    plt.close(fig)
    return path


def _same(x: float, y: float) -> bool:
    # Bitwise view of equality, as the comparison uses: NaN equals NaN.
    return x == y or (math.isnan(x) and math.isnan(y))


def first_differing_step(a: Series, b: Series) -> int | None:
    """First step present in both where the values are not equal (None if none)."""
    for step in sorted(set(a) & set(b)):
        if not _same(a[step], b[step]):
            return step
    return None


def group_figure_size(n_metrics: int) -> tuple[int, int]:
    """Pixel size of `plot_group`'s PNG for that many metrics."""
    return max(6, 5 * n_metrics) * DPI, 6 * DPI


def plot_group(
    a: Mapping[str, Series],
    b: Mapping[str, Series],
    path: str | Path,
    *,
    first_diff: Mapping[str, int | None] | None = None,
    title: str = "",
    labels: tuple[str, str] = ("run A", "run B"),
) -> Path:
    """One column per metric: A and B curves on top, log-scale |A - B| below.

    A dashed vertical line marks the metric's first differing step (given, or
    found here). Steps where the runs agree exactly have no |A - B| point (log 0).
    """
    plt = _pyplot()
    names = [n for n in a if n in b] or sorted(set(a) | set(b))
    fig_w, fig_h = group_figure_size(len(names))
    fig, axes = plt.subplots(2, max(1, len(names)), figsize=(fig_w / DPI, fig_h / DPI),
                             squeeze=False, sharex="col")
    for col, name in enumerate(names):
        sa, sb = a.get(name, {}), b.get(name, {})
        top, bottom = axes[0][col], axes[1][col]
        for series, label, style in ((sa, labels[0], "-"), (sb, labels[1], "--")):
            steps = sorted(series)
            top.plot(steps, [series[s] for s in steps], style, label=label, lw=1.2)
        common = sorted(set(sa) & set(sb))
        diffs = [(s, abs(sa[s] - sb[s])) for s in common if not _same(sa[s], sb[s])]
        diffs = [(s, d) for s, d in diffs if d > 0 or math.isnan(d)]
        finite = [(s, d) for s, d in diffs if math.isfinite(d)]
        if finite:
            bottom.semilogy([s for s, _ in finite], [d for _, d in finite], "o-", ms=3,
                            color="tab:red")
        else:
            bottom.text(0.5, 0.5, "identical" if not diffs else "non-finite differences",
                        transform=bottom.transAxes, ha="center", va="center")
            bottom.set_yticks([])
        step = (first_diff or {}).get(name) if first_diff is not None else None
        if first_diff is None or name not in first_diff:
            step = first_differing_step(sa, sb)
        for ax in (top, bottom):
            if step is not None:
                ax.axvline(step, color="black", ls=":", lw=1)
        top.set_title(name + (f" (first diff at step {step})" if step is not None else ""),
                      fontsize=9)
        top.legend(fontsize=7)
        bottom.set_xlabel("step")
        bottom.set_ylabel("|A - B|")
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(plt, fig, path)


MAX_HEATMAP_ROWS = 60


def digest_difference_matrix(
    records_a: Iterable[DigestRecord], records_b: Iterable[DigestRecord]
) -> tuple[list[int], list[tuple[int, str]], list[list[float]]]:
    """Steps, (rank, param) rows and a row-by-step grid: 0 equal, 1 differs, 0.5 only in one run.

    Rows that ever differ come first, ordered by the step they first differ at,
    then the rest; at most MAX_HEATMAP_ROWS rows.
    """
    da = {(r.step, r.rank, r.param): r.digest for r in records_a}
    db = {(r.step, r.rank, r.param): r.digest for r in records_b}
    steps = sorted({k[0] for k in da} | {k[0] for k in db})
    rows = sorted({k[1:] for k in da} | {k[1:] for k in db})
    col = {s: i for i, s in enumerate(steps)}
    grid = {row: [0.0] * len(steps) for row in rows}
    for key in set(da) | set(db):
        step, row = key[0], key[1:]
        if key not in da or key not in db:
            grid[row][col[step]] = 0.5
        elif da[key] != db[key]:
            grid[row][col[step]] = 1.0

    def first_bad(row: tuple[int, str]) -> float:
        return next((i for i, v in enumerate(grid[row]) if v > 0), math.inf)

    rows.sort(key=lambda r: (first_bad(r), r))
    rows = rows[:MAX_HEATMAP_ROWS]
    return steps, rows, [grid[r] for r in rows]


def heatmap_figure_size(n_rows: int, n_steps: int) -> tuple[int, int]:
    """Pixel size of `plot_digest_heatmap`'s PNG."""
    width = min(16, max(6, 0.25 * n_steps + 3))
    height = min(14, max(3, 0.22 * n_rows + 1.5))
    return int(round(width * DPI)), int(round(height * DPI))


def _finish_heatmap(plt, fig, ax, *, drawn: bool, path: str | Path, title: str) -> Path:
    """Title and save a digest heat map; an empty one says so instead of drawing axes."""
    if not drawn:
        ax.text(0.5, 0.5, "no digest records", ha="center", va="center", transform=ax.transAxes)
        ax.axis("off")
    ax.set_title(title, fontsize=9)
    return _save(plt, fig, path)


def plot_digest_heatmap(
    records_a: Iterable[DigestRecord], records_b: Iterable[DigestRecord], path: str | Path,
    *, title: str = "",
) -> Path:
    """Heat map of step x (rank, param): where two runs' gradient digests differ."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    steps, rows, grid = digest_difference_matrix(records_a, records_b)
    fig_w, fig_h = heatmap_figure_size(len(rows), len(steps))
    fig, ax = plt.subplots(figsize=(fig_w / DPI, fig_h / DPI))
    if rows and steps:
        cmap = ListedColormap(["#e8e8e8", "#f0b000", "#c00000"])
        ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=1,
                  extent=(steps[0] - 0.5, steps[-1] + 0.5, len(rows) - 0.5, -0.5))
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"r{rank} {param}" for rank, param in rows], fontsize=6)
        ax.set_xlabel("step")
    return _finish_heatmap(
        plt, fig, ax, drawn=bool(rows and steps), path=path,
        title=title or "gradient digests: red differs, amber in one run only, grey equal")


def plot_unit_heatmap(
    units: list[str], steps: list[int], counts: Mapping[tuple[str, int], int], path: str | Path,
    *, first: tuple[str, int] | None = None, title: str = "",
) -> Path:
    """Heat map of units x steps: how many digest records differ, the first divergence boxed.

    counts: (unit, step) -> differing records (parameters x ranks) of that unit at that step.
    """
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    fig_w, fig_h = heatmap_figure_size(len(units), len(steps))
    fig, ax = plt.subplots(figsize=(fig_w / DPI, fig_h / DPI))
    if units and steps:
        row = {u: i for i, u in enumerate(units)}
        col = {s: i for i, s in enumerate(steps)}
        grid = [[0.0] * len(steps) for _ in units]
        for (unit, step), n in counts.items():
            if unit in row and step in col:
                grid[row[unit]][col[step]] = float(n)
        top = max((max(r) for r in grid), default=0.0) or 1.0
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="Reds", vmin=0,
                          vmax=top, extent=(-0.5, len(steps) - 0.5, len(units) - 0.5, -0.5))
        fig.colorbar(image, ax=ax, label="differing digests")
        ax.set_yticks(range(len(units)))
        ax.set_yticklabels(units, fontsize=7)
        shown = range(0, len(steps), max(1, len(steps) // 20))
        ax.set_xticks(list(shown))
        ax.set_xticklabels([str(steps[i]) for i in shown], fontsize=7)
        ax.set_xlabel("step")
        if first is not None and first[0] in row and first[1] in col:
            x, y = col[first[1]], row[first[0]]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="black",
                                   linewidth=2))
    return _finish_heatmap(
        plt, fig, ax, drawn=bool(units and steps), path=path,
        title=title or "gradient digests per unit: differing records, first divergence boxed")
