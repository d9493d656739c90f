"""What runs inside the user's job works on the job's Python: 3.9 and later.

MindSpore's images commonly run Python 3.9 and this machine has no 3.9 interpreter, so
vermin reads the source for features newer than 3.9 (zip(strict=...), match, ...).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bisect_prefetch"
IN_JOB = [PACKAGE / "adapters", PACKAGE / "vocab.py"]  # the adapter dir and its vocabulary


def _vermin(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "-t=3.9-", "--no-tips", "--violations",
         *map(str, paths)],
        capture_output=True, text=True, check=False,
    )


def test_the_in_job_code_needs_nothing_newer_than_python_3_9():
    result = _vermin(*IN_JOB)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_catches_a_3_10_feature(tmp_path):
    newer = tmp_path / "newer.py"
    newer.write_text("def pairs(a, b):\n    return list(zip(a, b, strict=True))\n")
    result = _vermin(newer)
    assert result.returncode != 0 and "zip(strict)" in result.stdout
