"""A private file written whole (shared/files.py)."""
import os
import stat

import pytest

from corral.shared import files


def test_it_is_written_whole_and_private_whatever_the_umask(tmp_path):
    path = str(tmp_path / "state.json")
    old = os.umask(0)
    try:
        files.write_private(path, "one")
        files.write_private(path, "two", sync=True)
    finally:
        os.umask(old)
    assert open(path).read() == "two" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    path = str(tmp_path / "state.json")
    files.write_private(path, "old")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", refuse)
    with pytest.raises(OSError):
        files.write_private(path, "new")
    assert open(path).read() == "old" and os.listdir(tmp_path) == ["state.json"]
