"""Output faults the CLI jobs (bench, screen) must turn into named errors: an unusable
``--out`` and a disk that fills up mid-run. Shared by their reliability tests."""
from __future__ import annotations

import errno
import os
from pathlib import Path

OWN_FILE_TEXT = "mine"   # what an existing file given as --out holds (and must keep)


def bad_output_path(tmp_path: Path, where: str) -> Path:
    """An ``--out`` no job can write: under /proc (``"proc"``) or an existing file
    (``"file"``, holding ``OWN_FILE_TEXT``)."""
    if where == "proc":
        return Path("/proc/jaxdm-x")
    if where != "file":
        raise ValueError(f"where must be 'proc' or 'file', got {where!r}")
    out = tmp_path / "a_file"
    out.write_text(OWN_FILE_TEXT)
    return out


def assert_named_error(rc: int, err: str, *names: str) -> None:
    """The CLI's output-error exit: rc 2, no traceback, every one of ``names`` in stderr."""
    assert rc == 2 and "Traceback" not in err and all(n in err for n in names), err


def assert_bad_output_refused(rc: int, err: str, out: Path) -> None:
    """A ``bad_output_path`` was refused by name and an existing file was left as it was."""
    assert_named_error(rc, err, str(out))
    if out.is_file():
        assert out.read_text() == OWN_FILE_TEXT


def fill_disk_at(monkeypatch, file_suffix: str, nth: int) -> None:
    """From the ``nth`` fsync of a file whose path ends with ``file_suffix`` on, fsync raises
    ENOSPC (the disk is full); ``monkeypatch.undo()`` empties it again."""
    real_fsync = os.fsync
    calls = {"n": 0}

    def full_disk(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(file_suffix):
            calls["n"] += 1
            if calls["n"] >= nth:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
