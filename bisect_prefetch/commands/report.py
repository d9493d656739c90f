"""`bisect-prefetch report`: rebuild a state dir's HTML report from its journal and run dirs."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.files import check_writable
from bisect_prefetch.report.html import build_report


def report(state: Path, *, html_out: Path | None, console: Console) -> int:
    if not state.is_dir():
        raise BisectPrefetchError(f"no such state dir: {state}")
    if html_out is not None:
        check_writable(html_out)
    console.print(f"wrote {build_report(state, html_out)}", markup=False)
    return 0
