"""VectorEnv throughput section (assembled into benchmarks/env_throughput.py by the lead).

Workloads: batches of episodes of the native ALFWorld engine (generated train problems) and
of WebShop (generated catalogue), stepped with the same deterministic random-admissible-
action policy (auto-reset on), measured as env steps/s. Baseline: one in-process env
stepping the batch slot by slot. jaxdm: ``VectorEnv`` with 2 and with 8 worker processes
(pool start-up excluded from the rates, reported separately). Rounds alternate baseline /
2 workers / 8 workers; medians are reported. ``--quick`` runs ALFWorld only (WebShop
workers each load spaCy for the reward, which takes seconds per worker on 2 cores).

Run alone: ``python benchmarks/env_vector_section.py [--quick]``.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from env_rounds import alternated_rates
from jaxdm.envs.vector import EnvFactory, VectorEnv

SEARCH = "search[<your query>]"
WORKLOADS = {
    "alfworld": ("jaxdm.envs.alfworld:AlfWorldEnv", {}),
    "webshop": ("jaxdm.envs.webshop:make_webshop_env",
                {"generate": {"seed": 0, "num_products": 1000}}),
}


def _policy(admissible: list[str], goal: str, rng: random.Random) -> str:
    """Uniform over admissible actions; a WebShop search uses 1-3 words of the goal."""
    if not admissible:
        return "look"
    action = rng.choice(admissible)
    if action == SEARCH:
        words = goal.split(", and price lower")[0].split() or ["item"]
        action = f"search[{' '.join(rng.sample(words, k=min(len(words), rng.randint(1, 3))))}]"
    return action


def _baseline_round(env, batch: int, steps: int, seed: int) -> float:
    rngs = [random.Random(seed * 1000 + i) for i in range(batch)]
    slots = []
    for i in range(batch):
        _, state = env.reset(seed + i)
        info = env.reset_info(state)
        slots.append([state, info["admissible_actions"], info["goal"], 0])
    t0 = time.perf_counter()
    for _ in range(steps):
        for i, (state, admissible, goal, resets) in enumerate(slots):
            action = _policy(admissible, goal, rngs[i])
            _, state, _, done, info = env.step(0, state, action)
            if done:  # same auto-reset seeds as VectorEnv (group size 1)
                resets += 1
                _, state = env.reset(seed + i + resets * batch)
                info = env.reset_info(state)
                goal = info["goal"]
            slots[i] = [state, info["admissible_actions"], goal, resets]
    return batch * steps / (time.perf_counter() - t0)


def _vector_round(venv: VectorEnv, batch: int, steps: int, seed: int) -> float:
    rngs = [random.Random(seed * 1000 + i) for i in range(batch)]
    _, infos = venv.reset(seed)
    admissible = [i["admissible_actions"] for i in infos]
    goals = [i["goal"] for i in infos]
    t0 = time.perf_counter()
    for _ in range(steps):
        out = venv.step([_policy(admissible[i], goals[i], rngs[i]) for i in range(batch)])
        for i, info in enumerate(out.infos):
            if "reset_info" in info:
                info = info["reset_info"]
                goals[i] = info["goal"]
            admissible[i] = info.get("admissible_actions", [])
    return batch * steps / (time.perf_counter() - t0)


def _measure(name: str, batch: int, steps: int, rounds: int) -> list[str]:
    target, kwargs = WORKLOADS[name]
    factory = EnvFactory(target, kwargs)
    env = factory()
    if hasattr(env, "warm_up"):
        env.warm_up()
    t0 = time.perf_counter()
    pools = {n: VectorEnv(factory, batch, num_workers=n, auto_reset=True, env_name=name)
             for n in (2, 8)}
    startup = time.perf_counter() - t0
    baseline, rates = alternated_rates(_baseline_round, _vector_round, env, pools, batch=batch,
                                       steps=steps, rounds=rounds, warm_steps=2)
    base = statistics.median(baseline)
    lines = [f"# VectorEnv {name}: batch {batch}, {steps} steps x {rounds} rounds; "
             f"start-up of the 2- and 8-worker pools {startup:.1f}s"]
    for n in (2, 8):
        med = statistics.median(rates[n])
        lines.append(f"RESULT vectorenv_{name}_{n}workers: baseline {base:.1f} steps/s, "
                     f"jaxdm {med:.1f} steps/s, ratio {med / base:.2f}x")
    return lines


def _pipelined_round(pools, batch: int, steps: int, seed: int, policy_s: float) -> float:
    """Two half-batch pools: while one steps its envs (step_async), the 'policy' of the other
    runs; ``policy_s`` of sleep stands in for an accelerator forward pass per half batch."""
    half = batch // 2
    rngs = [random.Random(seed * 1000 + i) for i in range(batch)]
    admissible, goals = [None] * batch, [None] * batch

    def absorb(k, infos):
        for j, info in enumerate(infos):
            info = info.get("reset_info", info)
            if "goal" in info:
                goals[k * half + j] = info["goal"]
            admissible[k * half + j] = info.get("admissible_actions", [])

    def policy(k):
        time.sleep(policy_s)
        return [_policy(admissible[k * half + j], goals[k * half + j], rngs[k * half + j])
                for j in range(half)]

    for k, pool in enumerate(pools):
        absorb(k, pool.reset(seed + k * half)[1])
    t0 = time.perf_counter()
    acts0 = policy(0)
    for _ in range(steps):
        pools[0].step_async(acts0)
        acts1 = policy(1)  # overlaps pool 0's env steps
        absorb(0, pools[0].step_wait().infos)
        pools[1].step_async(acts1)
        acts0 = policy(0)  # overlaps pool 1's env steps
        absorb(1, pools[1].step_wait().infos)
    return batch * steps / (time.perf_counter() - t0)


def _sequential_round(env, batch: int, steps: int, seed: int, policy_s: float) -> float:
    """In-process baseline of ``_pipelined_round``: policy, then env steps, per half batch."""
    half = batch // 2
    rngs = [random.Random(seed * 1000 + i) for i in range(batch)]
    slots = []
    for i in range(batch):
        _, state = env.reset(seed + i)
        info = env.reset_info(state)
        slots.append([state, info["admissible_actions"], info["goal"]])
    t0 = time.perf_counter()
    for _ in range(steps):
        for k in range(2):
            time.sleep(policy_s)
            acts = [_policy(slots[i][1], slots[i][2], rngs[i])
                    for i in range(k * half, (k + 1) * half)]
            for j, action in enumerate(acts):
                i = k * half + j
                _, state, _, done, info = env.step(0, slots[i][0], action)
                if done:
                    _, state = env.reset(seed + i + batch)
                    info = env.reset_info(state)
                    slots[i][2] = info["goal"]
                slots[i][0], slots[i][1] = state, info["admissible_actions"]
    return batch * steps / (time.perf_counter() - t0)


def _measure_overlap(name: str, batch: int, steps: int, rounds: int,
                     policy_s: float) -> list[str]:
    target, kwargs = WORKLOADS[name]
    factory = EnvFactory(target, kwargs)
    env = factory()
    if hasattr(env, "warm_up"):
        env.warm_up()
    pools = [VectorEnv(factory, batch // 2, num_workers=1, auto_reset=True, env_name=name)
             for _ in range(2)]
    base, ours = [], []
    try:
        for r in range(rounds):
            base.append(_sequential_round(env, batch, steps, r, policy_s))
            ours.append(_pipelined_round(pools, batch, steps, r, policy_s))
    finally:
        for pool in pools:
            pool.close()
    b, o = statistics.median(base), statistics.median(ours)
    return [f"# VectorEnv overlap {name}: 2 half-batch pools (1 worker each) with step_async, "
            f"simulated policy latency {policy_s * 1000:.0f} ms per half batch",
            f"RESULT vectorenv_{name}_overlap: baseline {b:.1f} steps/s, jaxdm {o:.1f} steps/s, "
            f"ratio {o / b:.2f}x"]


def run(quick: bool) -> list[str]:
    if quick:
        return (_measure("alfworld", batch=16, steps=10, rounds=3)
                + _measure_overlap("alfworld", batch=16, steps=10, rounds=3, policy_s=0.01))
    lines = []
    for name in WORKLOADS:
        lines += _measure(name, batch=32, steps=50, rounds=5)
    lines += _measure_overlap("webshop", batch=32, steps=30, rounds=3, policy_s=0.02)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    results = run(args.quick)
    for line in results:
        print(line)
    sys.stdout.flush()
