"""One process of a (multi-process) trainer run on CPU, driven by test_rl_multihost.py.

    python multihost_rl_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT_DIR MODE [KEY=V...]

Runs the ``cpu_smoke`` preset (``ITERATIONS`` iterations; the mesh spans every process's
devices; more config overrides after MODE) in ``OUT_DIR/run``, acting on a 1-device copy
of the policy (``act_on_local_copy``). With NUM_PROCESSES=1 it is a plain one-process run (no ``jax.distributed``; on N devices
it is then the reference of N processes: the same acting, the same N-device update). MODE:

- ``full``: train to the end;
- ``kill``: check LVRL's ``rms`` scale over every process's rows (``check_lvrl_rms``), train
  one iteration (its checkpoint is written), touch ``OUT_DIR/stopped<ID>`` and wait to be
  SIGKILLed by the test;
- ``resume``: resume the killed run from its checkpoint and train to the end.

Process 0 writes the final policy parameters (``OUT_DIR/params.npz``) and the metric
records (``OUT_DIR/records.json``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ITERATIONS = 2
PRESET = Path(__file__).resolve().parents[2] / "experiments/configs/teacher_grpo_cpu_smoke.yaml"


def check_lvrl_rms(process_id: int, num_processes: int) -> None:
    """Each process holds its block of groups of one LVRL batch; its step
    advantages with the ``rms`` scale of every process's rows (``distributed.lvrl_rms``)
    equal, bit for bit, the one-process advantages of its rows."""
    import numpy as np

    from jaxdm.rl import distributed
    from jaxdm.rl.values.estimator import lvrl_step_advantages

    rng = np.random.default_rng(0)
    groups, size, t = 2 * num_processes, 3, 5
    b = groups * size
    values = rng.uniform(0, 1, (b, t + 1)).astype(np.float32)
    rewards = rng.integers(0, 2, b).astype(np.float32)
    returns = np.repeat(rewards[:, None], t, 1) - 0.1
    lengths = rng.integers(1, t + 1, b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    rows = np.ones(b, bool)
    rows[[1, b - 2]] = False  # value queries that failed: the GRPO fallback
    group_ids = np.repeat(np.arange(groups), size)
    want = np.asarray(lvrl_step_advantages(values, rows, rewards, returns, group_ids, mask,
                                           num_groups=groups, normalize="rms"))
    mine = slice(process_id * b // num_processes, (process_id + 1) * b // num_processes)
    local = groups // num_processes
    raw = lvrl_step_advantages(values[mine], rows[mine], rewards[mine], returns[mine],
                               group_ids[mine] - process_id * local, mask[mine],
                               num_groups=local, normalize="none")
    got = distributed.lvrl_rms(raw, rows[mine], mask[mine], 1e-6)
    assert np.array_equal(got, want[mine]), np.abs(got - want[mine]).max()
    assert not np.array_equal(got, np.asarray(raw))  # the scale is not 1


def main(coordinator: str, num_processes: int, process_id: int, out_dir: str,
         mode: str, *overrides: str) -> None:
    import jax
    import numpy as np


    from jaxdm import config as cfgmod
    from jaxdm.models import sharding as sh
    from jaxdm.rl.trainer import TrainConfig, Trainer

    if num_processes > 1:
        assert sh.initialize_distributed(coordinator, num_processes, process_id)
        assert jax.process_count() == num_processes
        if mode == "kill":
            check_lvrl_rms(process_id, num_processes)
    cfg = cfgmod.load_config(TrainConfig, PRESET, [
        "progress=false", f"iterations={ITERATIONS}", "eval_tasks=4", "mesh_data=-1",
        "act_on_local_copy=true", f"out_dir={out_dir}/run", *overrides])
    tr = Trainer(cfg, log=False)
    if mode == "kill":
        tr.run(stop_after=1)  # its periodic checkpoint (checkpoint_every=1) is step 1
        Path(out_dir, f"stopped{process_id}").touch()
        time.sleep(600)  # the test SIGKILLs both processes here (no clean shutdown)
        raise SystemExit("not killed")
    recs = tr.run(resume=mode == "resume")
    params = tr.dist.act_params(tr.params)  # the 1-device copy every process acts with
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(params)}
    tr.close()
    if jax.process_index() == 0:
        np.savez(f"{out_dir}/params.npz", **flat)
        Path(out_dir, "records.json").write_text(json.dumps(recs))
    if num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
         *sys.argv[6:])
