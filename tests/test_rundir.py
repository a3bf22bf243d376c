"""jaxdm.rundir: one lock per run folder (two real processes), output paths as named errors."""
import os
import subprocess
import sys
import time

import pytest

from jaxdm.rundir import (RUN_LOCK_FILE, RunFolderBusy, RunFolderError, listed_files,
                          lock_run_dir, prepare_out_dir)

HOLD = ("import sys, time\nfrom jaxdm.rundir import lock_run_dir\n"
        "lock = lock_run_dir(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(60)\n")


def test_a_second_process_fails_at_once_naming_the_folder_and_pid(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(RunFolderBusy, match=rf"{out.resolve()} is in use by another job "
                                                rf"\(process {holder.pid}\)"):
            lock_run_dir(out)
        assert time.monotonic() - t0 < 5   # at once, not after a wait
    finally:
        holder.kill()   # SIGKILL: the kernel drops the lock, no stale lock stays
        holder.wait()
    with lock_run_dir(out) as lock:
        assert (out / RUN_LOCK_FILE).read_text().strip() == str(os.getpid())
        assert listed_files(out) == []   # the lock file is not one of the run's files
    assert lock.folder == out.resolve()


def test_the_lock_is_counted_within_a_process_and_abandon_leaves_no_folder(tmp_path):
    out = tmp_path / "new"
    outer = lock_run_dir(out)
    inner = lock_run_dir(out)   # harness all: each command takes it again
    inner.release()
    code = "import sys\nfrom jaxdm.rundir import lock_run_dir\nlock_run_dir(sys.argv[1])\n"
    busy = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert busy.returncode != 0 and "RunFolderBusy" in busy.stderr   # still held by outer
    outer.abandon()   # refused before any work: the folder it created goes
    assert not out.exists()
    kept = tmp_path / "kept"
    lock = lock_run_dir(kept)
    (kept / "metrics.jsonl").write_text("")
    lock.abandon()
    assert kept.is_dir()   # it holds a file now: never removed


def test_output_paths_that_cannot_be_used(tmp_path):
    f = tmp_path / "F"
    f.write_text("x")
    with pytest.raises(RunFolderError, match=r"output folder .*F is a file"):
        prepare_out_dir(f)
    with pytest.raises(RunFolderError, match=r"cannot create output folder .*F/sub"):
        prepare_out_dir(f / "sub")
    with pytest.raises(RunFolderError, match=r"cannot create output folder /proc/jaxdm-x"):
        prepare_out_dir("/proc/jaxdm-x")
    assert prepare_out_dir(tmp_path / "a" / "b").is_dir()


def test_train_dm_bad_out_paths_are_named_errors_and_leave_nothing(tmp_path, capsys):
    from jaxdm.cli import main
    data = tmp_path / "d.jsonl"
    data.write_text('{"context": "c", "questions": [{"question": "q", "answer": "yes"}]}\n'
                    "{oops\n")
    f = tmp_path / "F"
    f.write_text("x")
    assert main(["train-dm", "--data", str(data), "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"run folder {f} is a file" in err and "Traceback" not in err
    assert main(["train-dm", "--data", str(data), "--out", "/proc/jaxdm-x"]) == 2
    assert "cannot create run folder /proc/jaxdm-x" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["train-dm", "--data", str(data), "--out", str(out)]) == 2   # bad data
    assert f"{data}:2: invalid JSON" in capsys.readouterr().err
    assert not out.exists()   # a failed run leaves no empty folder
