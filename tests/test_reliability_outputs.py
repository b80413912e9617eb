"""bertkit.outputs: refuse outputs that would destroy something; atomic, readable, no temp left behind."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from bertkit.errors import BertkitError
from bertkit.outputs import atomic_open, atomic_write, check_output_dir, check_output_file


def test_output_dir_new_empty_and_existing(tmp_path):
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text("{}")
    with pytest.raises(BertkitError, match="already holds .*results.json.*--overwrite"):
        check_output_dir(run)
    check_output_dir(run, overwrite=True)
    assert (run / "results.json").read_text() == "{}"  # checking never deletes


def test_output_dir_that_is_a_file_or_under_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(BertkitError, match="existing file, not a folder"):
        check_output_dir(f, overwrite=True)
    with pytest.raises(BertkitError, match="not a folder"):
        check_output_dir(f / "sub")


def test_output_file_equal_to_an_input_directly_or_by_link(tmp_path):
    data = tmp_path / "in.txt"
    data.write_text("precious\n")
    link = tmp_path / "link.txt"
    link.symlink_to(data)
    hard = tmp_path / "hard.txt"
    os.link(data, hard)
    for out in (data, link, hard, tmp_path / "." / "in.txt"):
        with pytest.raises(BertkitError, match="also an input"):
            check_output_file(out, inputs=[data], overwrite=True)
    assert data.read_text() == "precious\n"


def test_output_file_refuses_non_regular_and_existing(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("x")
    link = tmp_path / "l.txt"
    link.symlink_to(target)
    with pytest.raises(BertkitError, match="symbolic link"):
        check_output_file(link, overwrite=True)
    with pytest.raises(BertkitError, match="a folder"):
        check_output_file(tmp_path, overwrite=True)
    with pytest.raises(BertkitError, match="not a regular file"):
        check_output_file("/dev/null", overwrite=True)
    with pytest.raises(BertkitError, match="already exists.*--overwrite"):
        check_output_file(target)
    check_output_file(target, overwrite=True)
    check_output_file(tmp_path / "fresh.txt")


def test_atomic_write_is_readable_by_others_under_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_open(tmp_path / "a.txt") as h:
            h.write("hello")
        atomic_write(tmp_path / "b.bin", lambda tmp: open(tmp, "wb").write(b"x"))
    finally:
        os.umask(old)
    for name in ("a.txt", "b.bin"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644
    assert (tmp_path / "a.txt").read_text() == "hello"


def test_atomic_write_failure_keeps_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def disk_full(tmp):
        open(tmp, "w").write("partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)

    with pytest.raises(OSError) as info:
        atomic_write(target, disk_full)
    assert info.value.errno == errno.ENOSPC
    with pytest.raises(RuntimeError):
        with atomic_open(target) as h:
            h.write("partial")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_atomic_write_never_replaces_a_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("keep")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with pytest.raises(BertkitError, match="not a regular file"):
        with atomic_open(link) as h:
            h.write("x")
    assert link.is_symlink() and real.read_text() == "keep"
