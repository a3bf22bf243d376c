"""The BabyAI trainer's speed: env steps/s of the jitted JAX rollout and policy-update time per
iteration, GRPO vs LVRL (Oracle values) vs PPO (MLP critic), and LVRL's overhead over GRPO.

Three ``Trainer``s on the experiment's config (``experiments/configs/lvrl_babyai_jax.yaml``:
8 groups x 8 rollouts, budget 64, symbolic MLP on ``babyai_jax``) are compiled (2 warm-up
iterations each), then the methods alternate, one iteration each per round, and the medians
over rounds are reported (alternating spreads the machine's load over all methods alike):

- ``time/iteration`` (rollout + signals + advantages + update + metrics), ``time/update``
  (π_old, mini-batch PPO steps), rollout seconds and env steps/s (B x T slots of the scan /
  rollout seconds), LVRL's value-signal seconds (the Oracle values are recorded inside the
  scan; the signal builds the trajectories' value queries and the group context);
- baseline for env steps/s: the host text env loop the text trainer uses (``LocalVectorEnv``
  over ``BabyAITextEnv``, random admissible actions; no policy at all), same tasks.

RESULT lines (ratio > 1 = jaxdm better): ``lvrl_trainer_env_steps`` (host text loop vs JAX
rollout), ``lvrl_trainer_lvrl_overhead`` (GRPO vs LVRL seconds per iteration; ratio ≥ 0.91 is
LVRL's overhead ≤ 10 %), ``lvrl_trainer_ppo`` (GRPO vs PPO).

    python benchmarks/lvrl_trainer.py --quick     # 3 rounds, ~1-2 min with compilation
    python benchmarks/lvrl_trainer.py             # 15 rounds
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from jaxdm import config as cfgmod

BASE = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "lvrl_babyai_jax.yaml"
METHODS = {"grpo": ["algo.advantage=grpo"],
           "lvrl": ["algo.advantage=lvrl", "value={kind: oracle}"],
           "ppo": ["algo.advantage=gae", "critic.kind=mlp"]}


def host_env_steps_per_s(num_envs: int, group_size: int, steps: int, room_size: int) -> float:
    """Env steps/s of the text trainer's host loop: LocalVectorEnv over BabyAITextEnv."""
    from jaxdm.envs.babyai import BabyAIParams
    from jaxdm.envs.babyai.text import BabyAITextEnv
    from jaxdm.envs.local import LocalVectorEnv

    env = BabyAITextEnv(room_size, BabyAIParams.for_split("train", max_steps=steps))
    venv = LocalVectorEnv(env, num_envs, group_size=group_size, max_steps=steps)
    rng = np.random.default_rng(0)
    _, infos = venv.reset(0)
    venv.step([rng.choice(i["admissible_actions"]) for i in infos])  # warm the jitted step
    venv.reset(0)
    n, t0 = 0, time.perf_counter()
    infos = [{"admissible_actions": ["go forward"]}] * num_envs
    for _ in range(steps):
        acts = [rng.choice(i.get("admissible_actions") or ["go forward"]) for i in infos]
        res = venv.step(acts)
        live = [not i.get("inactive", False) and not i.get("skipped", False)
                for i in res.infos]
        n += int(np.sum(live))
        infos = res.infos
        if res.dones.all():
            break
    dt = time.perf_counter() - t0
    venv.close()
    return n / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 15)
    from jaxdm.rl.trainer import Trainer, TrainConfig

    tmp = Path(tempfile.mkdtemp(prefix="lvrl_trainer_bench_"))
    trainers = {}
    t0 = time.perf_counter()
    for m, extra in METHODS.items():
        cfg = cfgmod.load_config(TrainConfig, str(BASE), [
            f"out_dir={tmp / m}", "eval_tasks=0", "checkpoint_every=0", "iterations=1000000",
            *extra])
        trainers[m] = Trainer(cfg, log=False)
        for _ in range(2):
            trainers[m].iteration_step()
    compile_s = time.perf_counter() - t0
    recs = {m: [] for m in METHODS}
    for _ in range(rounds):
        for m, tr in trainers.items():
            recs[m].append(tr.iteration_step())
    cfg = trainers["grpo"].cfg
    slots = cfg.tasks_per_iter * cfg.group_size * cfg.max_actions
    med = {m: {k: float(np.median([r.get(k, 0.0) for r in rs])) for k in (
        "time/iteration", "time/update", "time/generation", "time/values",
        "rollout/env_steps", "rollout/env_steps_per_s")} for m, rs in recs.items()}
    print(f"{rounds} rounds after {compile_s:.0f} s of compilation/warm-up; machine shared "
          f"with other jobs (loaded); B x T = {cfg.tasks_per_iter * cfg.group_size} x "
          f"{cfg.max_actions}")
    print("| method | s / iteration | update s | rollout s | env steps/s (slots) | "
          "executed steps | value signal s |")
    print("|---|---|---|---|---|---|---|")
    for m, d in med.items():
        print(f"| {m} | {d['time/iteration']:.3f} | {d['time/update']:.3f} | "
              f"{d['time/generation']:.4f} | {slots / d['time/generation']:.0f} | "
              f"{d['rollout/env_steps']:.0f} | {d['time/values']:.4f} |")
    for tr in trainers.values():
        tr.close()
    host = host_env_steps_per_s(cfg.tasks_per_iter * cfg.group_size, cfg.group_size,
                                16 if args.quick else cfg.max_actions,
                                int(cfg.env.kwargs["room_size"]))
    jax_sps = float(np.median([slots / r["time/generation"] for r in recs["grpo"]]))
    g, lv, pp = (med[m]["time/iteration"] for m in ("grpo", "lvrl", "ppo"))
    print(f"LVRL overhead over GRPO: {100 * (lv / g - 1):+.1f} % per iteration (goal <= 10 %); "
          f"PPO {100 * (pp / g - 1):+.1f} %")
    print(f"RESULT lvrl_trainer_env_steps: baseline {host:.0f} steps/s, jaxdm {jax_sps:.0f} "
          f"steps/s, ratio {jax_sps / host:.2f}x")
    print(f"RESULT lvrl_trainer_lvrl_overhead: baseline {g:.3f} s/iteration, jaxdm {lv:.3f} "
          f"s/iteration, ratio {g / lv:.2f}x")
    print(f"RESULT lvrl_trainer_ppo: baseline {g:.3f} s/iteration, jaxdm {pp:.3f} "
          f"s/iteration, ratio {g / pp:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
