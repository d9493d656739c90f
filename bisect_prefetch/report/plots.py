"""PNG plots: two runs' metric curves, and where gradient digests first differ.

Inputs are plain data (metric -> {step: value}, digest records), so
plots can be drawn from run directories long after the runs. matplotlib runs
headless (Agg). Figure sizes are fixed by the data's shape, not the screen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
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
    if not getattr(fig, "laid_out", False):  # group_figure lays its own out around its key
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


KEY_LINE_IN = 0.18  # a line of the segments' key under the plots, in inches


def group_figure_size(n_metrics: int, n_segments: int = 0) -> tuple[int, int]:
    """Pixel size of `plot_group`'s PNG for that many metrics (and a run's segments, each a
    line of the key under the plots)."""
    key = (n_segments + 0.5) * KEY_LINE_IN if n_segments > 1 else 0.0
    return max(6, 5 * n_metrics) * DPI, int(round((4 + key) * DPI))


def plain_log_ticks(ax) -> None:
    """Tick labels of a log axis as `1e-07`: the default formatter writes mathtext
    (`$\\mathdefault{10^{-7}}$`), which shows raw with mathtext off (_pyplot)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.0e}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


Segment = tuple[int, int, str]  # first step, last step, the mask it ran


def _draw_segments(ax, segments: list[Segment], *, label: bool) -> None:
    """A run of several masks: a line where each segment begins, its number on top (the key
    under the plots names each number's steps and mask)."""
    for number, (first, last, _) in enumerate(segments, start=1):
        if first > 1:
            ax.axvline(first - 0.5, color="tab:gray", ls="-", lw=0.8)
        if label:
            ax.text((first + last) / 2, 1.0, f"segment {number}" if len(segments) <= 4 else str(number),
                    transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7,
                    color="tab:gray", clip_on=False)


def _segment_key(fig, segments: list[Segment], height_in: float) -> None:
    """Under the plots, a line a segment: `segment 2, steps 21-40: keep-only:...`."""
    for number, (first, last, mask) in enumerate(segments, start=1):
        y = (len(segments) - number + 0.5) * KEY_LINE_IN / height_in
        fig.text(0.01, y, f"segment {number}, steps {first}-{last}: {mask}", fontsize=7,
                 ha="left", va="center", color="dimgray")


def plot_group(a: Mapping[str, Series], b: Mapping[str, Series], path: str | Path,
               **options) -> Path:
    """`group_figure` written to a PNG."""
    return _save(_pyplot(), group_figure(a, b, **options), path)


def group_figure(
    a: Mapping[str, Series],
    b: Mapping[str, Series],
    *,
    first_diff: Mapping[str, int | None] | None = None,
    title: str = "",
    labels: tuple[str, str] = ("run A", "run B"),
    segments: list[Segment] | None = None,
    stopped_at: int | None = None,
):
    """One column per metric: A and B curves on top, log-scale |A - B| below.

    A dashed vertical line marks the metric's first differing step (given, or
    found here). Steps where the runs agree exactly have no |A - B| point (log 0).
    segments: B's masks by step, when it ran several (boundaries drawn, each mask named
    over its steps). stopped_at: the step B was stopped at on its first difference; a
    metric that had not moved by then says so rather than "identical".
    """
    plt = _pyplot()
    names = [n for n in a if n in b] or sorted(set(a) | set(b))
    several = segments if segments and len(segments) > 1 else []
    fig_w, fig_h = group_figure_size(len(names), len(several))
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
            plain_log_ticks(bottom)
        else:
            bottom.text(0.5, 0.5, _no_difference_words(diffs, stopped_at),
                        transform=bottom.transAxes, ha="center", va="center", fontsize=8,
                        wrap=True)
            bottom.set_yticks([])
        step = (first_diff or {}).get(name) if first_diff is not None else None
        if first_diff is None or name not in first_diff:
            step = first_differing_step(sa, sb)
        for ax in (top, bottom):
            if step is not None:
                ax.axvline(step, color="black", ls=":", lw=1)
            if stopped_at is not None and step is None:  # where the digests stopped it
                ax.axvline(stopped_at, color="tab:red", ls="--", lw=0.8)
            if several:
                _draw_segments(ax, several, label=ax is top)
        top.set_title(name + (f" (first diff at step {step})" if step is not None else ""),
                      fontsize=9, pad=14 if several else 6)
        top.legend(fontsize=7)
        bottom.set_xlabel("step")
        bottom.set_ylabel("|A - B|")
    if title:
        fig.suptitle(title, fontsize=10)
    # The plots above the segments' key (tight_layout leaves figure text where it is).
    key = (len(several) + 0.5) * KEY_LINE_IN / (fig_h / DPI) if several else 0.0
    fig.tight_layout(rect=(0, key, 1, 1))
    fig.laid_out = True
    if several:
        _segment_key(fig, several, fig_h / DPI)
    return fig


def _no_difference_words(diffs: list, stopped_at: int | None) -> str:
    if diffs:
        return "non-finite differences"
    if stopped_at is not None:
        return (f"stopped at step {stopped_at} on a parameter digest;\n"
                "the printed metrics had not moved")
    return "identical"


MAX_HEATMAP_ROWS = 60


def digest_difference_matrix(
    records_a: Iterable[DigestRecord], records_b: Iterable[DigestRecord],
    *, units: Sequence[str] | None = None,
) -> tuple[list[int], list[tuple[int, str]], list[list[float]]]:
    """Steps, (rank, param) rows and a row-by-step grid: 0 equal, 1 differs, 0.5 only in one run.

    Steps are those both runs recorded (a run stopped at its first difference has no
    later ones: they are not a difference). Rows are the parameters that differ and, given
    the units, the other parameters of their units; ordered by the step they first differ
    at; at most MAX_HEATMAP_ROWS.
    """
    da = {(r.step, r.rank, r.param): r.digest for r in records_a}
    db = {(r.step, r.rank, r.param): r.digest for r in records_b}
    steps = sorted({k[0] for k in da} & {k[0] for k in db})
    rows = sorted({k[1:] for k in da if k[0] in set(steps)} | {k[1:] for k in db if k[0] in set(steps)})
    col = {s: i for i, s in enumerate(steps)}
    grid = {row: [0.0] * len(steps) for row in rows}
    for key in set(da) | set(db):
        step, row = key[0], key[1:]
        if step not in col:
            continue
        if key not in da or key not in db:
            grid[row][col[step]] = 0.5
        elif da[key] != db[key]:
            grid[row][col[step]] = 1.0

    def first_bad(row: tuple[int, str]) -> float:
        return next((i for i, v in enumerate(grid[row]) if v > 0), math.inf)

    differing = [r for r in rows if first_bad(r) < math.inf]
    if units is not None:
        unit_of = {r: _unit_of(r[1], units) for r in rows}
        touched = {unit_of[r] for r in differing}
        rows = [r for r in rows if r in set(differing) or (unit_of[r] is not None and unit_of[r] in touched)]
    rows.sort(key=lambda r: (first_bad(r), r))
    rows = rows[:MAX_HEATMAP_ROWS]
    return steps, rows, [grid[r] for r in rows]


def _unit_of(param: str, units: Sequence[str]) -> str | None:
    """The longest unit name the parameter's name begins with (`layers.4` for
    `layers.4.attn.weight`; the root unit, named "", holds what no other unit does)."""
    name = param.split("@", 1)[0]
    found = [u for u in units if u and (name == u or name.startswith(u + "."))]
    return max(found, key=len) if found else ("" if "" in units else None)


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
    *, title: str = "", units: Sequence[str] | None = None,
) -> Path:
    """Heat map of step x (rank, param): where two runs' gradient digests differ (units:
    only the differing parameters and the rest of their units)."""
    plt = _pyplot()
    from matplotlib.colors import ListedColormap

    steps, rows, grid = digest_difference_matrix(records_a, records_b, units=units)
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
