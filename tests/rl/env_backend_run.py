"""One trainer iteration per env backend, in a fresh process (``tests/rl/test_rl_env_backend.py``):
``python env_backend_run.py OUT_DIR RAY_ADDRESS`` writes ``<backend>.npz`` (the iteration's
metrics and the updated parameters) for the process pool and for Ray actors of the cluster at
RAY_ADDRESS. Its own process because a driver reads Ray's token authentication setting
(``RAY_AUTH_MODE``) when it first imports ray."""
from __future__ import annotations

import os
import sys

import jax
import numpy as np

from jaxdm import config as cfgmod
from jaxdm.rl.trainer import TrainConfig, Trainer

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
        "model.num_kv_heads=1", "model.head_dim=16", "policy.form=option",
        "policy.max_prompt_tokens=96", "progress=false", "algo.kl_coef=0.0", "mesh_data=1",
        "env.name=toy_ordering", "max_actions=4", "tasks_per_iter=2", "group_size=2",
        "algo.mini_batch=8", "algo.advantage=grpo", "teacher.kind=none", "optim.lr=1e-2",
        "iterations=1", "checkpoint_every=0", "env.num_workers=2"]
METRICS = ("train/success", "train/reward", "train/actions", "loss/total")


def main(out: str, address: str) -> None:
    runs = {"process": [],
            "ray": ["env.backend=ray", f"env.ray={{address: '{address}', num_cpus: 1}}"]}
    for backend, extra in runs.items():
        cfg = cfgmod.load_config(TrainConfig, None,
                                 [*TINY, f"out_dir={os.path.join(out, backend)}", *extra])
        tr = Trainer(cfg, log=False)
        try:
            rec = tr.iteration_step()
            leaves = [np.asarray(a) for a in jax.tree.leaves(tr.params)]
            used = tr.collector.venv.backend
            workers = list(tr.collector.venv.worker_pids)
        finally:
            tr.close()
        np.savez(os.path.join(out, f"{backend}.npz"), used=used, workers=np.array(workers),
                 metrics=np.array([rec[k] for k in METRICS]),
                 **{f"p{i}": a for i, a in enumerate(leaves)})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
