"""Markdown for a matrix result, for files and for GitHub's job summary.

When `$GITHUB_STEP_SUMMARY` names a file, the table is appended to it (GitHub
renders that file on the job page); other writers may share it, so never
overwrite.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.files import write_text_atomic
from bisect_prefetch.judge.faults import fault_lines
from bisect_prefetch.report.table import matrix_rows, matrix_summary

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


# Terminal colour and title sequences (CSI, OSC) from job logs: no meaning in Markdown.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(text: str) -> str:
    """Text as Markdown shows it, never as markup: job logs reach these cells.

    A pipe would split the cell and a newline end the row; `<`, `>` and `&` would be raw
    HTML (GitHub renders some of it); brackets and parentheses would make a link or an
    image (`![x](url)`); ANSI sequences are dropped, other control characters and format
    characters (a right-to-left override turns the rest of a line around) written as
    escapes.
    """
    text = _ANSI.sub("", str(text))
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    text = "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) == "Cf" else c for c in text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
            .replace("[", "\\[").replace("]", "\\]").replace("(", "\\(").replace(")", "\\)")
            .replace("!", "\\!")
            .replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " "))


def matrix_markdown(result: dict) -> str:
    headers, rows = matrix_rows(result)
    title = f"### bisect-prefetch matrix {_escape(result.get('matrix', ''))}".rstrip()
    lines = [title, "", _escape(matrix_summary(result)), ""]
    lines.append("| " + " | ".join(_escape(h) for h in headers) + " |")
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        lines.append("| " + " | ".join(_escape(v) for v in row) + " |")
    runs = [run for cell in result.get("cells", [])
            for run in (cell.get("group") or {}).get("run_details") or []]
    faults = fault_lines(runs)
    if faults:
        lines += ["", "Infrastructure faults (runs left out of every verdict):", ""]
        lines += [f"- {_escape(line)}" for line in faults]
    return "\n".join(lines) + "\n"


def publish_markdown(
    result: dict, path: Path | None = None, *, env: Mapping[str, str] = os.environ
) -> list[Path]:
    """Write the Markdown to PATH (if given) and append it to the step summary (if set).

    Returns the files written to.
    """
    text = matrix_markdown(result)
    written = []
    if path is not None:
        write_text_atomic(path, text)
        written.append(Path(path))
    summary = env.get(SUMMARY_ENV)
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as exc:
            raise BisectPrefetchError(
                f"cannot append to ${SUMMARY_ENV} ({summary}): {exc.strerror}"
            ) from None
        written.append(Path(summary))
    return written
