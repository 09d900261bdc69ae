"""hpp.fileio.write_atomic: text, bytes or a writer; the mode a new file gets; nothing left behind on failure."""

from __future__ import annotations

import os
import stat

import pytest

from hpp.fileio import write_atomic


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_text_bytes_and_writer_land_whole_with_the_mode_of_a_new_file(tmp_path):
    (tmp_path / "plain").write_text("x")                     # what open() gives a new file under this umask
    write_atomic(tmp_path / "a.json", '{"a": 1}\n')
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    write_atomic(tmp_path / "c.txt", lambda tmp: tmp.write_text("from a writer"))
    assert (tmp_path / "a.json").read_text() == '{"a": 1}\n'
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "c.txt").read_text() == "from a writer"
    assert {_mode(tmp_path / n) for n in ("a.json", "b.bin", "c.txt")} == {_mode(tmp_path / "plain")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.bin", "c.txt", "plain"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "plan.json"
    write_atomic(target, "old")

    def half(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]
