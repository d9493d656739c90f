"""Files the tool writes: atomic, and readable by others as the umask allows."""

from __future__ import annotations

import os
import stat

import pytest

from bisect_prefetch.errors import BisectPrefetchError
from bisect_prefetch.files import new_file_mode, write_text_atomic


@pytest.fixture
def umask():
    def set_umask(value: int) -> None:
        os.umask(value)

    before = os.umask(0o022)
    os.umask(before)
    yield set_umask
    os.umask(before)


def test_written_files_honour_the_umask(tmp_path, umask):
    umask(0o022)
    path = tmp_path / "report.html"
    write_text_atomic(path, "<html></html>\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == "<html></html>\n"
    umask(0o077)
    write_text_atomic(path, "again\n")  # a rewrite gets the mode a new file would
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert new_file_mode() == 0o600


def test_a_write_leaves_no_temp_file_and_replaces_the_old_one(tmp_path):
    path = tmp_path / "state" / "bisect.json"
    write_text_atomic(path, "1\n")
    write_text_atomic(path, "2\n")
    assert path.read_text() == "2\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["bisect.json"]


def test_a_place_that_cannot_be_written_is_one_error(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(BisectPrefetchError, match="cannot write"):
        write_text_atomic(tmp_path / "file" / "x.json", "{}")
