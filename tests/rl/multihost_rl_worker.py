"""One process of a (multi-process) trainer run on CPU, driven by test_rl_multihost.py.

    python multihost_rl_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT_DIR MODE

Runs the ``cpu_smoke`` preset (``ITERATIONS`` iterations; the mesh spans every process's
devices) in ``OUT_DIR/run``, acting on a 1-device copy of the policy (``act_on_local_copy``).
With NUM_PROCESSES=1 it is a plain one-process run (no ``jax.distributed``; on N devices
it is then the reference of N processes: the same acting, the same N-device update). MODE:

- ``full``: train to the end;
- ``kill``: train one iteration (its checkpoint is written), touch ``OUT_DIR/stopped<ID>``
  and wait to be SIGKILLed by the test;
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


def main(coordinator: str, num_processes: int, process_id: int, out_dir: str,
         mode: str) -> None:
    import jax
    import numpy as np

    from jaxdm import config as cfgmod
    from jaxdm.models import sharding as sh
    from jaxdm.rl.trainer import TrainConfig, Trainer

    if num_processes > 1:
        assert sh.initialize_distributed(coordinator, num_processes, process_id)
        assert jax.process_count() == num_processes
    cfg = cfgmod.load_config(TrainConfig, PRESET, [
        "progress=false", f"iterations={ITERATIONS}", "eval_tasks=4", "mesh_data=-1",
        "act_on_local_copy=true", f"out_dir={out_dir}/run"])
    tr = Trainer(cfg, log=False)
    if mode == "kill":
        tr.run(stop_after=1)  # its periodic checkpoint (checkpoint_every=1) is step 1
        Path(out_dir, f"stopped{process_id}").touch()
        time.sleep(600)  # the test SIGKILLs both processes here (no clean shutdown)
        raise SystemExit("not killed")
    recs = tr.run(resume=mode == "resume")
    params = tr.params if tr.dist is None else tr.dist.local_params(tr.params)
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(params)}
    tr.close()
    if jax.process_index() == 0:
        np.savez(f"{out_dir}/params.npz", **flat)
        Path(out_dir, "records.json").write_text(json.dumps(recs))
    if num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
