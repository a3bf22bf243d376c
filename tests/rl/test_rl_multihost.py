"""Two JAX processes on 127.0.0.1 (CPU, gloo collectives) run the trainer like one process.

``multihost_rl_worker.py`` runs the ``cpu_smoke`` preset as one process (2 devices, acting
on a 1-device copy of the policy: ``act_on_local_copy``) and as two processes of 1 device
each (``jaxdm.rl.distributed``: each plays half the task groups with its rows of the
one-process sampling noise, uploads its block of every global mini-batch). The test
SIGKILLs both processes after the first iteration's checkpoint, and two fresh processes
resume the run. It ends with the one-process parameters (within ``PARAM_TOL``, see there),
the same episodes, evaluation and (to 1e-6) losses. Every process is started and ended
here, each wait bounded.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "multihost_rl_worker.py")
TIMEOUT_S = 600
# The reference is one process on 2 devices acting on a 1-device copy of the policy
# (``act_on_local_copy``): the rollout program of each of the two processes and the same
# 2-device update program. Measured: max |Δparam| = 0 (bit for bit). Against one process
# on 1 device (another gradient summation order) it was 2.7e-6, on 2 devices acting on the
# FSDP-sharded policy 4.4e-6: AdamW enlarges last-bit gradient differences where |g| ~ eps.
PARAM_TOL = 1e-6
# episode metrics that must match the one-process run exactly (same episodes)
EXACT = ("train/success", "train/reward", "train/actions", "train/invalid_frac",
         "train/truncated_frac", "env/errors", "ppo/updates", "eval/All", "teacher/requests",
         "teacher/missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(out_dir, mode: str, num_processes: int, devices: int = 1
           ) -> list[subprocess.Popen]:
    # One persistent compilation cache for every worker: the resuming pair reuses the
    # programs the killed pair compiled. The workers are compile-bound (~120 programs each,
    # the train step the largest): XLA's backend optimisations off (CPU time -40%; the same
    # flags everywhere, and still bit for bit equal).
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
                         f"--xla_backend_optimization_level=0",
               JAX_COMPILATION_CACHE_DIR=str(out_dir.parent / "xla_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    coordinator = f"127.0.0.1:{_free_port()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(num_processes):
        with open(out_dir / f"{mode}{i}.log", "w") as log:  # a file: a full pipe never blocks
            procs.append(subprocess.Popen(
                [sys.executable, WORKER, coordinator, str(num_processes), str(i), str(out_dir),
                 mode], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
    return procs


def _log(p: subprocess.Popen) -> str:
    out_dir, mode, i = p.args[5], p.args[6], p.args[4]
    with open(os.path.join(out_dir, f"{mode}{i}.log")) as f:
        return f.read()[-4000:]


def _wait(procs: list[subprocess.Popen], deadline: float) -> list[tuple[int, str]]:
    out = []
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            _end(procs)
            raise AssertionError(f"worker {p.args[3:]} still running at the deadline")
        out.append((p.returncode, _log(p)))
    return out


def _end(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every process still running (all before waiting for any)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _params(out_dir) -> dict[str, np.ndarray]:
    return dict(np.load(out_dir / "params.npz"))


@pytest.mark.slow
def test_two_processes_killed_and_resumed_train_like_one(tmp_path):
    deadline = time.monotonic() + TIMEOUT_S
    single, killed = tmp_path / "single", tmp_path / "killed"
    groups = [_start(single, "full", 1, devices=2), _start(killed, "kill", 2)]
    try:
        while not all((killed / f"stopped{i}").exists() for i in range(2)):
            for p in groups[1]:
                assert p.poll() is None, _log(p)
            assert time.monotonic() < deadline, "the two processes never stopped"
            time.sleep(0.5)
        _end(groups[1])  # SIGKILL both, each right after its first checkpoint
        (rc, text), = _wait(groups[0], deadline)
        assert rc == 0, text[-4000:]
        assert (killed / "run" / "checkpoints" / "1").is_dir()
        assert not (killed / "run" / "checkpoints" / "2").exists()
        groups.append(_start(killed, "resume", 2))
        for rc, text in _wait(groups[2], deadline):
            assert rc == 0, text[-4000:]
    finally:
        for g in groups:
            _end(g)

    want, got = _params(single), _params(killed)
    assert got.keys() == want.keys()
    diff = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    print(f"max |two-process param - one-process param| = {diff:.3g}")
    assert diff <= PARAM_TOL, diff
    ref = json.loads((single / "records.json").read_text())
    # the two-process run's metrics file (process 0 wrote it; killed at step 1, resumed):
    # one record per step, the same episodes and evaluation as one process
    recs = [json.loads(line) for line in
            (killed / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [r["step"] for r in ref]
    for g, r in zip(recs, ref):
        for k in EXACT:
            assert (k in g) == (k in r), k
            if k in r:
                assert g[k] == r[k], (r["step"], k, g[k], r[k])
        for k in ("adv/mean", "adv/std", "loss/total", "loss/kl", "optim/grad_norm",
                  "teacher/requests", "teacher/score_mean", "teacher/score_std"):
            if k in r:
                assert abs(g[k] - r[k]) <= 1e-6 * max(1.0, abs(r[k])), (r["step"], k, g[k], r[k])
    assert sum("loss/total" in r for r in recs) == 2 and recs[-1]["eval/All"] > 0
