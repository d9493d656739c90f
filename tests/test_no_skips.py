"""A green CI means the real engines ran: under CI=true and in `make test`
a skipped test fails with its reason; by hand it may skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BODIES = {
    "in_test": "import pytest\n\ndef test_engine():\n    pytest.importorskip('no_such_engine_xyz')\n",
    "module": "import pytest\nengine = pytest.importorskip('no_such_engine_xyz')\n\ndef test_x():\n    pass\n",
}


def _pytest(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_engine_skip.py"
    test.write_text(body)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "BISECT_PREFETCH_NO_SKIPS")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q",
                           "-p", "no:cacheprovider", str(test)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**clean, **env})


@pytest.mark.parametrize("where", sorted(BODIES))
@pytest.mark.parametrize("env", [{"CI": "true"}, {"BISECT_PREFETCH_NO_SKIPS": "1"}])
def test_a_skip_fails_under_ci_and_make_test(tmp_path, where, env):
    done = _pytest(tmp_path, BODIES[where], **env)
    assert done.returncode != 0, done.stdout
    assert "skipped where no skip is allowed" in done.stdout
    assert "no_such_engine_xyz" in done.stdout


def test_by_hand_a_skip_is_a_skip(tmp_path):
    done = _pytest(tmp_path, BODIES["in_test"])
    assert done.returncode == 0, done.stdout
    assert "1 skipped" in done.stdout
