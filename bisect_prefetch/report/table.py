"""Terminal tables for matrix results and A/A groups, shaped like the reported ones.

Everything here takes the JSON forms (plain dicts), so a table can be rebuilt
from files as well as from a live result. `matrix_rows` is the one place that
decides the columns; the Markdown report uses it too.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from bisect_prefetch.vocab import DIVERGED

STAT_FIELDS = (("mae", "MAE"), ("p95", "P95"), ("max_abs", "max abs"))


def fmt_number(value: float | int | str | None) -> str:
    """Short, exact-enough text for a statistic: `-` for none, 3 significant digits.

    Strict JSON carries non-finite values as the strings "inf", "-inf", "nan".
    """
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if value == 0:
        return "0"
    return f"{value:.3g}"


def fmt_step(step: int | None) -> str:
    return "-" if step is None else str(step)


def metric_names(cells: list[dict]) -> list[str]:
    """Metric names over all cells, in first-seen order (cells may lack some)."""
    names: list[str] = []
    for cell in cells:
        for name in cell.get("metrics") or {}:
            if name not in names:
                names.append(name)
    return names


def expectation_text(cell: dict) -> str:
    mark = "ok" if cell["expectation_met"] else "FAILED"
    return f"{cell['expect']}: {mark}"


def matrix_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a matrix result: one row a cell, in the matrix's order."""
    names = metric_names(result["cells"])
    headers = ["cell", "verdict", "first diff step"]
    for name in names:
        headers += [f"{name} {title}" for _, title in STAT_FIELDS]
    headers += ["runs", DIVERGED, "expect"]  # runs, and how many of them diverged
    rows = []
    for cell in result["cells"]:
        row = [cell["name"], cell["verdict"], fmt_step(cell.get("first_diff_step"))]
        for name in names:
            stats = (cell.get("metrics") or {}).get(name) or {}
            row += [fmt_number(stats.get(field)) for field, _ in STAT_FIELDS]
        row += [str(cell["runs"]), str(cell["divergences"]), expectation_text(cell)]
        rows.append(row)
    return headers, rows


def matrix_summary(result: dict) -> str:
    """One line: how many cells met their expectation."""
    cells = result["cells"]
    failed = [c["name"] for c in cells if not c["expectation_met"]]
    if not failed:
        return f"all {len(cells)} expectations met"
    return f"{len(failed)} of {len(cells)} expectations FAILED: {', '.join(failed)}"


def matrix_table(result: dict) -> Table:
    headers, rows = matrix_rows(result)
    table = Table(title=f"matrix {result.get('matrix', '')}".strip(), title_justify="left")
    numeric = {h for h in headers if h not in ("cell", "verdict", "expect")}
    for header in headers:
        table.add_column(header, justify="right" if header in numeric else "left")
    for cell, row in zip(result["cells"], rows, strict=True):
        style = None if cell["expectation_met"] else "bold red"
        table.add_row(*row, style=style)
    return table


def group_table(group: dict, *, title: str = "") -> Table:
    """An A/A group's comparison: metric, first differing step, MAE, P95, max abs."""
    table = Table(title=title or None, title_justify="left")
    for header, justify in (("metric", "left"), ("first diff step", "right"),
                            *((t, "right") for _, t in STAT_FIELDS),
                            ("steps differing", "right")):
        table.add_column(header, justify=justify)
    for name, stats in (group.get("metrics") or {}).items():
        differing = f"{stats.get('steps_differing', 0)}/{stats.get('steps_compared', 0)}"
        first = fmt_step(stats.get("first_diff_step"))
        if stats.get("first_diff_step") is not None and stats.get("first_diff_rank") is not None:
            first += f" (rank {stats['first_diff_rank']})"
        table.add_row(name, first,
                      *(fmt_number(stats.get(f)) for f, _ in STAT_FIELDS), differing)
    return table


def print_table(table: Table, console: Console) -> None:
    """Print a table whole: off a terminal (CI logs) rows are never cut to 80 columns."""
    if console.is_terminal:
        console.print(table)
        return
    width = Measurement.get(console, console.options.update_width(10_000), table).maximum
    wide = Console(file=console.file, width=max(width, console.width),
                   color_system=console.color_system, highlight=False)
    wide.print(table)


def print_matrix(result: dict, console: Console) -> None:
    print_table(matrix_table(result), console)
    console.print(matrix_summary(result), markup=False, soft_wrap=True)
