"""jaxdm.rundir: one lock per run folder (two real processes), output paths as named errors."""
import json
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


# ---- open_run: refuse, resume, overwrite, the settings diff ------------------------------
from jaxdm.jsonl import OutputError  # noqa: E402
from jaxdm.rundir import (Layout, ResumeMismatchError, RunExistsError, UnitLog,  # noqa: E402
                          open_run, read_saved, refuse_overwrite)

LAYOUT = Layout("job.json", ("units.jsonl", "figs", "harness_*"), kind="a test run",
                free=("threads",))


def opened(out, settings, **flags):
    run = open_run(out, LAYOUT, settings, resume=flags.get("resume", False),
                   overwrite=flags.get("overwrite", False))
    run.release()
    return run


def test_a_fresh_run_records_its_settings_and_refuses_a_folder_holding_a_run(tmp_path):
    out = tmp_path / "run"
    run = opened(out, {"seed": 0, "threads": 2})
    assert not run.resumed and json.loads((out / "job.json").read_text()) == {"seed": 0,
                                                                              "threads": 2}
    (out / "units.jsonl").write_text('{"u": 1}\n')
    with pytest.raises(RunExistsError, match=r"output folder .*run already holds a test run "
                                             r"\(job.json, units.jsonl\); pass --resume to "
                                             r"continue it or --overwrite to replace it"):
        opened(out, {"seed": 0, "threads": 2})
    assert (out / "units.jsonl").read_text() == '{"u": 1}\n'   # nothing touched
    with pytest.raises(RunFolderError, match="--resume and --overwrite exclude each other"):
        opened(out, {"seed": 0}, resume=True, overwrite=True)


def test_a_folder_of_other_files_is_refused_unless_the_layout_allows_them(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunExistsError, match=r"already holds files \(notes.txt\)"):
        opened(tmp_path, {"seed": 0})
    with pytest.raises(RunExistsError, match=r"--resume: .* holds no test run \(no job.json\) "
                                             r"but is not empty \(notes.txt\)"):
        opened(tmp_path, {"seed": 0}, resume=True)
    loose = Layout("job.json", (), foreign_files=True)
    run = open_run(tmp_path, loose, {"seed": 0}, resume=False, overwrite=False)
    run.release()
    assert not run.resumed and (tmp_path / "job.json").is_file()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_resume_continues_with_the_same_settings_and_names_every_changed_key(tmp_path):
    opened(tmp_path, {"seed": 0, "lr": 0.003, "threads": 2, "judges": ["a"]})
    run = opened(tmp_path, {"seed": 0, "lr": 0.003, "threads": 8, "judges": ("a",)},
                 resume=True)   # threads is free; a tuple is its saved list
    assert run.resumed
    with pytest.raises(ResumeMismatchError,
                       match=r"--resume: .* holds a test run with different settings: "
                             r"lr: 0.003 -> 0.5, new: \(absent\) -> 1, seed: 0 -> 7; resume with "
                             r"the saved settings \(.*job.json\), or use --overwrite / another "
                             r"--out; free to change: \['threads'\]"):
        opened(tmp_path, {"seed": 7, "lr": 0.5, "threads": 2, "judges": ["a"], "new": 1},
               resume=True)
    secret = Layout("job.json", (), view=lambda s: {f"settings.{k}": v for k, v in s.items()})
    with pytest.raises(ResumeMismatchError, match=r"different settings: settings.api_key: "
                                                  r"\(absent\) -> <value hidden>; "):
        open_run(tmp_path, secret, {"seed": 0, "lr": 0.003, "threads": 2, "judges": ["a"],
                                    "api_key": "x"}, resume=True, overwrite=False)
    # on an empty folder --resume starts fresh
    assert not opened(tmp_path / "empty", {"seed": 0}, resume=True).resumed


def test_overwrite_removes_only_the_jobs_own_outputs(tmp_path):
    opened(tmp_path, {"seed": 0})
    (tmp_path / "units.jsonl").write_text('{"u": 1}\n')
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "a.png").write_text("png")
    (tmp_path / "harness_a").mkdir()   # a pattern of the layout's outputs
    (tmp_path / "harness_b.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    run = opened(tmp_path, {"seed": 1}, overwrite=True)
    assert not run.resumed
    assert listed_files(tmp_path) == ["job.json", "notes.txt"]
    assert json.loads((tmp_path / "job.json").read_text()) == {"seed": 1}


def test_a_refused_open_leaves_no_folder_and_a_busy_folder_is_named(tmp_path):
    out = tmp_path / "new"
    bad = Layout("job.json", (), load=lambda p: (_ for _ in ()).throw(RunFolderError("bad")))
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "job.json").write_text("{}")
    with pytest.raises(RunFolderError, match="bad"):
        open_run(tmp_path / "held", bad, {}, resume=True, overwrite=False)
    assert sorted(os.listdir(tmp_path / "held")) == ["job.json"]   # lock file removed again
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=rf"in use by another job \(process "
                                                rf"{holder.pid}\)"):
            opened(out, {"seed": 0})
        assert listed_files(out) == []   # nothing written
    finally:
        holder.kill()
        holder.wait()


def test_an_atomic_write_that_raises_leaves_the_old_file_and_no_partial_one(tmp_path,
                                                                         monkeypatch):
    run = opened(tmp_path, {"seed": 0})
    run.write("report.md", "old\n")

    def interrupted(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.write("report.md", "new and longer\n")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(
        OSError(28, "No space left on device")))
    with pytest.raises(OutputError, match=r"cannot write .*report.md: no space left on device"):
        run.write_json("report.md", {"new": 1})
    monkeypatch.undo()
    assert (tmp_path / "report.md").read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == [RUN_LOCK_FILE, "job.json", "report.md"]


APPEND_THEN_DIE = (
    "import os, signal, sys\nfrom pathlib import Path\nfrom jaxdm.rundir import RunDir, Layout\n"
    "from jaxdm.rundir import lock_run_dir\nout = Path(sys.argv[1])\n"
    "run = RunDir(out, Layout('job.json', ()), lock_run_dir(out), False)\n"
    "run.append('units.jsonl', [{'unit': 0}, {'unit': 1}])\nrun.append('units.jsonl', "
    "[{'unit': 2}])\nwith open(out / 'units.jsonl', 'a') as f:\n"
    "    f.write('{\"unit\": 3, \"half')\n    f.flush()\nos.kill(os.getpid(), signal.SIGKILL)\n")


def test_appends_survive_a_kill_and_a_torn_last_line_is_dropped(tmp_path, capsys):
    died = subprocess.run([sys.executable, "-c", APPEND_THEN_DIE, str(tmp_path)])
    assert died.returncode == -9
    got = read_saved(tmp_path / "units.jsonl")
    assert [r for _, r in got] == [{"unit": 0}, {"unit": 1}, {"unit": 2}]
    assert "dropping a torn last line" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('[1]\n{"unit": 0}\n')
    with pytest.raises(RunFolderError, match=r"bad.jsonl:1: expected a JSON object, got list; "
                                             r"use --overwrite to start again"):
        read_saved(tmp_path / "bad.jsonl")


def test_done_markers_one_line_per_unit_the_latest_holds(tmp_path):
    log = UnitLog(tmp_path / "units.jsonl", ("backend", "level"), what="bench unit")
    log.start()
    log.mark({"backend": "a", "level": "l1", "n": 1})
    log.mark({"backend": "a", "level": "l2", "n": 2})
    log.put({"backend": "a", "level": "l1", "n": 3})   # a saved unit: replaced in place
    log.put({"backend": "b", "level": "l1", "n": 4})   # a new one: appended
    assert [json.loads(s) for s in (tmp_path / "units.jsonl").read_text().splitlines()] == [
        {"backend": "a", "level": "l1", "n": 3}, {"backend": "a", "level": "l2", "n": 2},
        {"backend": "b", "level": "l1", "n": 4}]
    with open(tmp_path / "units.jsonl", "a") as f:   # a later line of a unit holds
        f.write('{"backend": "a", "level": "l2", "n": 5}\n{"backend": "c", "lev')
    again = UnitLog(tmp_path / "units.jsonl", ("backend", "level"), what="bench unit")
    saved = again.load(required=("n",))
    assert {k: r["n"] for k, r in saved.items()} == {("a", "l1"): 3, ("a", "l2"): 5,
                                                     ("b", "l1"): 4}
    assert again.lines == 4 and again.done(("a", "l2")) and not again.done(("c", "l1"))
    again.keep(saved.values())
    assert len((tmp_path / "units.jsonl").read_text().splitlines()) == 3
    (tmp_path / "units.jsonl").write_text('{"backend": "a", "level": "l1"}\n')
    with pytest.raises(RunFolderError, match=r"units.jsonl:1: not a bench unit \(no \['n'\]\)"):
        again.load(required=("n",))


def test_an_error_in_the_jobs_opening_work_abandons_the_folder(tmp_path):
    out = tmp_path / "new"
    run = open_run(out, Layout("job.json", ("units.jsonl",)), {"seed": 0}, resume=False,
                   overwrite=False)
    (out / "job.json").unlink()   # as if the store's own first writes had not happened yet
    with pytest.raises(ValueError, match="saved units unreadable"):
        with run.abandoned_on_error():
            raise ValueError("saved units unreadable")
    assert not out.exists()   # the folder this open created is gone, and its lock with it
    lock_run_dir(out).abandon()   # free again (same process: the count went back to zero)


def test_refuse_overwrite_names_what_is_there(tmp_path):
    done = tmp_path / "summary.json"
    refuse_overwrite([done, tmp_path / "report.md"], overwrite=False)   # nothing there
    done.write_text("{}")
    with pytest.raises(FileExistsError, match=r"summary\.json; pass --overwrite"):
        refuse_overwrite([done, tmp_path / "report.md"], overwrite=False)
    refuse_overwrite([done], overwrite=True)
