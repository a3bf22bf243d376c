"""Run directories and interruptions (issue 15 #2-#6): nothing lost, nothing silently wrong."""
import dataclasses

import jax
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm import rundir, runlog
from jaxdm.rl.checkpoint import Checkpointer
from jaxdm.rl.errors import NonFiniteLossError
from jaxdm.rl.state import NonFiniteCheckpointError
from jaxdm.rl.trainer import Trainer, run_layout, train_run
from jaxdm.rundir import ResumeMismatchError, RunExistsError
from tests.rl import test_rl_trainer as base


def cfg_at(path, *extra):
    return base.ordering_cfg(path, "checkpoint_every=0", *extra)


def leaves(tr):
    return [np.asarray(x) for x in jax.tree.leaves((tr.state.params, tr.state.opt_states,
                                                    jax.random.key_data(tr.state.key)))]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tr = Trainer(cfg_at(tmp_path_factory.mktemp("full")), log=False)
    tr.run()
    out = leaves(tr), tr.state.cursor, tr.state.host_rng.bit_generator.state
    tr.close()
    return out


def interrupt_in_iteration_2(tr, obj, name, nth):
    """Make the ``nth`` call of ``obj.name`` during iteration 2 raise KeyboardInterrupt."""
    orig, calls = getattr(obj, name), {"n": 0}

    def wrapped(*a, **kw):
        if tr.state.iteration == 1:
            calls["n"] += 1
            if calls["n"] == nth:
                raise KeyboardInterrupt
        return orig(*a, **kw)
    return wrapped


@pytest.mark.parametrize("point", ["rollout", "mid_update", "before_record"])
def test_sigint_checkpoints_only_a_finished_iteration(tmp_path, uninterrupted, point,
                                                      monkeypatch):
    """Ctrl-C in iteration 2 (during its rollout, after one of its mini-batch updates, or
    after it finished but before its metrics record) saves iteration 1's state; resuming
    gives exactly the uninterrupted run (params, optimiser, key, cursor, host RNG)."""
    tr = Trainer(cfg_at(tmp_path), log=False)
    if point == "rollout":
        tr.venv.step_wait = interrupt_in_iteration_2(tr, tr.venv, "step_wait", 2)
    elif point == "mid_update":
        tr.train_step = interrupt_in_iteration_2(tr, tr, "train_step", 2)
    else:
        orig, calls = runlog.MetricsWriter.write, {"n": 0}

        def write(self, step, metrics):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
            return orig(self, step, metrics)
        monkeypatch.setattr(runlog.MetricsWriter, "write", write)
    with pytest.raises(KeyboardInterrupt):
        tr.run()
    assert tr.checkpointer.latest_step() == 1 and tr.iteration == 1
    tr.close()
    monkeypatch.undo()
    resumed = Trainer(cfg_at(tmp_path), log=False)
    resumed.run(resume=True)
    want, cursor, rng = uninterrupted
    for a, b in zip(want, leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    assert resumed.state.cursor == cursor and resumed.state.host_rng.bit_generator.state == rng
    assert [r["step"] for r in runlog.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    resumed.close()


def test_fresh_run_refuses_a_run_dir_unless_overwrite(tmp_path):
    cfg = cfg_at(tmp_path, "iterations=1", "checkpoint_every=1")
    tr = Trainer(cfg, log=False)
    tr.run()
    tr.close()
    before = (tmp_path / "metrics.jsonl").read_text()
    again = Trainer(cfg, log=False)
    with pytest.raises(RunExistsError, match=r"out_dir .* already holds a training run "
                                             r"\(checkpoints, config.yaml, curves.png, "
                                             r"metrics.jsonl\); pass --resume .* or --overwrite"):
        again.run()
    assert (tmp_path / "metrics.jsonl").read_text() == before  # nothing touched
    assert again.checkpointer.all_steps() == [1]
    recs = again.run(overwrite=True)
    assert [r["step"] for r in recs] == [1] and again.checkpointer.all_steps() == [1]
    again.close()


def test_resume_refuses_changed_settings_and_keeps_final_eval_once(tmp_path):
    cfg = cfg_at(tmp_path, "iterations=1", "eval_tasks=2", "eval_seeds=[0]")
    tr = Trainer(cfg, log=False)
    tr.run()
    tr.close()
    changed = cfg_at(tmp_path, "iterations=1", "eval_tasks=2", "eval_seeds=[0]",
                     "optim.lr=0.5", "seed=7")
    t2 = Trainer(changed, log=False)
    with pytest.raises(ResumeMismatchError, match=r"optim.lr: 0.003 -> 0.5, seed: 0 -> 7"):
        t2.run(resume=True)
    t2.close()
    # a shape change is named by its config key before orbax sees the arrays
    wider = cfg_at(tmp_path, "iterations=1", "eval_tasks=2", "eval_seeds=[0]",
                   "model.hidden_size=64")
    with pytest.raises(ResumeMismatchError, match=r"model.hidden_size: 32 -> 64"):
        rundir.check_folder(tmp_path, run_layout(wider, Checkpointer(tmp_path / "checkpoints")),
                            cfgmod.to_dict(wider), resume=True, overwrite=False)
    # iterations and checkpointing may change; resuming the finished run evaluates nothing
    t3 = Trainer(dataclasses.replace(cfg, checkpoint_every=5), log=False)
    t3.run(resume=True)
    t3.close()
    recs = runlog.read_metrics(tmp_path / "metrics.jsonl")
    assert [("train/success" in r, "eval/All" in r) for r in recs] == [(True, False),
                                                                        (False, True)]
    # resumed with more iterations: trains on and evaluates again at the new end (the
    # evaluation at the old end does not count as the final one)
    t4 = Trainer(dataclasses.replace(cfg, iterations=2), log=False)
    t4.run(resume=True)
    t4.close()
    recs = runlog.read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], "train/success" in r, "eval/All" in r) for r in recs] == [
        (1, True, False), (1, False, True), (2, True, False), (2, False, True)]


def test_torn_last_metrics_line_is_dropped_on_resume(tmp_path, capsys):
    cfg = cfg_at(tmp_path, "iterations=2", "checkpoint_every=1")
    tr = Trainer(cfg, log=False)
    tr.run(stop_after=1)
    tr.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "time": 17000.5, "train/succ')  # a crash mid-write
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: invalid JSON"):
        runlog.read_metrics(tmp_path / "metrics.jsonl")
    t2 = Trainer(cfg, log=False)
    t2.run(resume=True)
    t2.close()
    assert "dropping a torn last line" in capsys.readouterr().err
    assert [r["step"] for r in runlog.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_nonfinite_loss_stops_naming_iteration_and_term(tmp_path):
    cfg = cfg_at(tmp_path, "iterations=3", "checkpoint_every=1")
    tr = Trainer(cfg, log=False)
    step = tr.train_step

    def poisoned(params, opts, batch):
        if tr.state.iteration == 1:  # iteration 2: a NaN advantage reaches the loss
            batch = dict(batch, adv=batch["adv"] * np.float32("nan"))
        return step(params, opts, batch)
    tr.train_step = poisoned
    with pytest.raises(NonFiniteLossError, match=r"iteration 2: non-finite loss/pg"):
        tr.run()
    assert tr.checkpointer.latest_step() == 1 and tr.iteration == 1
    assert all(np.isfinite(x).all() for x in leaves(tr))
    last = runlog.read_metrics(tmp_path / "metrics.jsonl")[-1]
    assert last["step"] == 2 and last["run/nonfinite"] == "loss/pg"
    tr.close()


def test_checkpoint_with_nan_tensors_fails_or_warns(tmp_path):
    cfg = cfg_at(tmp_path, "iterations=1")
    tr = Trainer(cfg, log=False)
    pol = tr.state.params["policy"]
    tr.state.params["policy"] = jax.tree.map(lambda x: x * np.float32("nan"), pol)
    tr.state.iteration = 1
    tr.save()
    tr.close()
    t2 = Trainer(cfg, log=False)
    with pytest.raises(NonFiniteCheckpointError, match=r"checkpoint step 1 holds NaN/inf.*"
                                                       r"on_nonfinite_checkpoint=warn"):
        t2.restore()
    t2.close()
    t3 = Trainer(dataclasses.replace(cfg, on_nonfinite_checkpoint="warn"), log=False)
    with pytest.warns(RuntimeWarning, match="holds NaN/inf"):
        assert t3.restore()
    assert t3.iteration == 1
    t3.close()


@pytest.mark.slow
def test_real_sigint_then_resume_matches_pinned_run(tmp_path, delay=0.2):
    """A real Ctrl-C (SIGINT to the training process) at a point inside iteration 2, then
    --resume: the final params equal the pinned uninterrupted cpu_smoke run."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.rl.reproduce_cases import FIXTURE, REPO_ROOT, run_case
    out = tmp_path / "run"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    code = ("from tests.rl.reproduce_cases import run_case; "
            f"run_case('cpu_smoke_teacher', {str(out)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while not (out / "metrics.jsonl").exists() or \
            not (out / "metrics.jsonl").read_text().count("\n"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    time.sleep(delay)  # somewhere in iteration 2 (rollout, scoring or update)
    proc.send_signal(signal.SIGINT)
    log = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode != 0 and "KeyboardInterrupt" in log, log[-2000:]
    got = run_case("cpu_smoke_teacher", out, resume=True)
    want = json.loads(FIXTURE.read_text())["cpu_smoke_teacher"]
    # to float rounding: the pinned fixture is bit-exact only on the CPU it was recorded on
    np.testing.assert_allclose(np.asarray(got["params"]), np.asarray(want["params"]),
                               rtol=1e-5, atol=1e-5)
    steps = [r["step"] for r in runlog.read_metrics(out / "metrics.jsonl")]
    assert steps == [1, 2, 2]


def test_train_run_gives_the_whole_run_when_resumed(tmp_path):
    # Trainer.run returns only what it added; experiments summarise whole runs (train_run)
    cfg = cfg_at(tmp_path, "iterations=2", "checkpoint_every=1")
    tr = Trainer(cfg, log=False)
    first = tr.run(stop_after=1)
    tr.close()
    recs = train_run(cfg, resume=True, log=False)
    assert recs[:len(first)] == runlog.read_metrics(tmp_path / "metrics.jsonl")[:len(first)]
    assert sorted({r["step"] for r in recs}) == [1, 2]
    assert train_run(cfg, resume=True, log=False) == recs   # finished: nothing added
    with pytest.raises(RunExistsError):
        train_run(cfg, log=False)                             # never overwritten unasked
