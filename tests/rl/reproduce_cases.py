"""Short trainer runs whose metrics and final params are pinned in ``reproduce_fixture.json``.

The fixture was recorded on the pre-redesign trainer (commit 38aa7b4, the closed
teacher-GRPO pipeline); ``test_rl_reproduce.py`` runs the same cases on today's trainer and
requires identical per-iteration metrics and parameter checksums, so the stage/registry
redesign provably reproduces the old teacher-GRPO, GRPO and GiGPO runs on the same seeds.

Regenerate (only when a numeric change is intended, and say so in the commit)::

    .venv/bin/python -m tests.rl.reproduce_cases --write
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import jax
import numpy as np

FIXTURE = Path(__file__).with_name("reproduce_fixture.json")
REPO_ROOT = Path(__file__).resolve().parents[2]
PRESETS = REPO_ROOT / "experiments" / "configs"

# name -> (preset, overrides). The toy_ordering cases share every shape and loss setting, so
# they compile once; cpu_smoke (KL on, other shapes) compiles its own step.
CASES = {
    "cpu_smoke_teacher": ("cpu_smoke", ["progress=false", "iterations=2", "eval_tasks=8"]),
    "toy_ordering_grpo": ("toy_ordering", ["iterations=3", "tasks_per_iter=4", "eval_tasks=8",
                                           "eval_seeds=[0]", "algo.advantage=grpo",
                                           "teacher.kind=none"]),
    "toy_ordering_teacher": ("toy_ordering", ["iterations=3", "tasks_per_iter=4",
                                              "eval_tasks=8", "eval_seeds=[0]",
                                              "algo.advantage=teacher"]),
    "toy_ordering_gigpo": ("toy_ordering", ["iterations=3", "tasks_per_iter=4", "eval_tasks=8",
                                            "eval_seeds=[0]", "algo.advantage=gigpo",
                                            "teacher.kind=none", "seed=1", "model.init_seed=1"]),
}
# metric keys compared exactly (times, costs and counters of other stages are not)
KEYS = ("train/success", "train/reward", "train/actions", "train/invalid_frac",
        "train/truncated_frac", "adv/mean", "adv/std", "adv/min", "adv/max",
        "adv/nonzero_frac", "loss/total", "loss/pg", "loss/kl", "loss/entropy",
        "optim/grad_norm", "ppo/clip_frac", "ppo/approx_kl", "ppo/kl_ref", "ppo/entropy",
        "ppo/updates", "teacher/requests", "teacher/missing", "teacher/score_mean",
        "eval/All")


def params_checksum(params) -> list[list[float]]:
    """Per leaf (in tree order): [sum, sum of squares, first element] in float64."""
    out = []
    for leaf in jax.tree.leaves(params):
        a = np.asarray(leaf, np.float64)
        out.append([float(a.sum()), float((a * a).sum()), float(a.reshape(-1)[0])])
    return out


def run_case(name: str, out_dir: str | Path, *, resume: bool = False) -> dict:
    from jaxdm import config as cfgmod
    from jaxdm.rl.trainer import TrainConfig, Trainer

    preset, overrides = CASES[name]
    cfg = cfgmod.load_config(TrainConfig, PRESETS / f"teacher_grpo_{preset}.yaml",
                             [*overrides, "progress=false", f"out_dir={out_dir}"])
    tr = Trainer(cfg, log=False)
    try:
        recs = tr.run(resume=resume)
        params = tr.params
    finally:
        tr.close()
    rows = [{k: r[k] for k in KEYS if k in r} for r in recs]
    return {"records": rows, "params": params_checksum(params)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name in CASES:
            out[name] = run_case(name, Path(d) / name)
            print(name, out[name]["records"][-1], flush=True)
    if args.write:
        FIXTURE.write_text(json.dumps(out, indent=1) + "\n")
        print("wrote", FIXTURE)


if __name__ == "__main__":
    main()
