"""Env-worker backends: in-process vs VectorEnv worker processes vs Ray actors, in one run.

Workloads (a deterministic random-admissible-action policy, auto-reset on, measured as env
steps/s of the whole batch):
- ``toy_sleepNms``: the toy ordering task wrapped in ``DelayedEnv`` sleeping N ms per step (an
  env that waits on something else: a browser, a simulator, a remote service);
- ``toy_busyNms``: the same, spinning one core for N ms per step (a compute-bound env);
- ``alfworld``: the native ALFWorld engine on generated train problems (~ms per step).
Baseline: one in-process env stepping the batch slot by slot. jaxdm: ``VectorEnv`` with W
worker processes (``backend="process"``) and with W Ray actors on a local Ray instance
(``backend="ray"``). Rounds alternate baseline / process / Ray; medians are reported;
pool start-up (and Ray's own start) is excluded from the rates and printed separately.

Usage: python benchmarks/env_workers.py [--quick] [--no-ray]
       [--plan toy_sleep10ms:32:8:10:3,alfworld:32:2:20:3]   (workload:batch:workers:steps:rounds)
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from env_rounds import alternated_rates
from jaxdm.envs.vector import EnvFactory, VectorEnv

TOY = "jaxdm.envs.toy:make_ordering_env"


def _workload(name: str) -> EnvFactory:
    if name == "alfworld":
        return EnvFactory("jaxdm.envs.alfworld:AlfWorldEnv")
    for kind in ("sleep", "busy"):
        if name.startswith(f"toy_{kind}") and name.endswith("ms"):
            delay = float(name[len(f"toy_{kind}"):-2]) / 1000
            return EnvFactory("jaxdm.envs.toy.delayed:make_delayed_env",
                              {"target": TOY, "step_delay_s": delay, "busy": kind == "busy"})
    raise ValueError(f"unknown workload {name!r}: alfworld, toy_sleep<N>ms or toy_busy<N>ms")


def _policy(admissible, rng: random.Random) -> str:
    return rng.choice(admissible) if admissible else "look"


def _inprocess_round(env, batch: int, steps: int, seed: int) -> float:
    rngs = [random.Random(seed * 1000 + i) for i in range(batch)]
    slots = []
    for i in range(batch):
        _, state = env.reset(seed + i)
        slots.append([state, env.reset_info(state)["admissible_actions"], 0])
    t0 = time.perf_counter()
    for _ in range(steps):
        for i, (state, admissible, resets) in enumerate(slots):
            _, state, _, done, info = env.step(0, state, _policy(admissible, rngs[i]))
            if done:  # VectorEnv's auto-reset seeds (group size 1)
                resets += 1
                _, state = env.reset(seed + i + resets * batch)
                info = env.reset_info(state)
            slots[i] = [state, info["admissible_actions"], resets]
    return batch * steps / (time.perf_counter() - t0)


def _vector_round(venv: VectorEnv, batch: int, steps: int, seed: int) -> float:
    rngs = [random.Random(seed * 1000 + i) for i in range(batch)]
    _, infos = venv.reset(seed)
    admissible = [i["admissible_actions"] for i in infos]
    t0 = time.perf_counter()
    for _ in range(steps):
        out = venv.step([_policy(admissible[i], rngs[i]) for i in range(batch)])
        for i, info in enumerate(out.infos):
            admissible[i] = info.get("reset_info", info).get("admissible_actions", [])
    return batch * steps / (time.perf_counter() - t0)


def measure(name: str, batch: int, workers: int, steps: int, rounds: int,
            backends: tuple[str, ...]) -> list[str]:
    factory = _workload(name)
    env = factory()
    if hasattr(env, "warm_up"):
        env.warm_up()
    pools, startup = {}, {}
    try:
        for backend in backends:
            t0 = time.perf_counter()
            pools[backend] = VectorEnv(factory, batch, num_workers=workers, auto_reset=True,
                                       env_name=name, backend=backend)
            startup[backend] = time.perf_counter() - t0
    except BaseException:
        for pool in pools.values():
            pool.close()
        raise
    inprocess, rates = alternated_rates(_inprocess_round, _vector_round, env, pools,
                                        batch=batch, steps=steps, rounds=rounds, warm_steps=1)
    base = statistics.median(inprocess)
    starts = ", ".join(f"{b} {s:.1f}s" for b, s in startup.items())
    lines = [f"# {name}: batch {batch}, {workers} workers, {steps} steps x {rounds} rounds; "
             f"in-process {base:.1f} steps/s; pool start-up {starts}"]
    for backend in backends:
        med = statistics.median(rates[backend])
        lines.append(f"RESULT env_workers_{name}_{backend}{workers}: baseline {base:.1f} "
                     f"steps/s, jaxdm {med:.1f} steps/s, ratio {med / base:.2f}x")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small workload (< 60 s)")
    ap.add_argument("--no-ray", action="store_true", help="process pool and in-process only")
    ap.add_argument("--plan", default=None,
                    help="comma-separated workload:batch:workers:steps:rounds entries")
    args = ap.parse_args()
    plan = None
    if args.plan:
        try:
            plan = [(name, *map(int, rest)) for name, *rest in
                    (entry.split(":") for entry in args.plan.split(","))]
            for entry in plan:
                _workload(entry[0])
                if len(entry) != 5 or min(entry[1:]) < 1:
                    raise ValueError(f"{entry}: need workload:batch:workers:steps:rounds >= 1")
        except ValueError as e:
            ap.error(f"--plan: {e}")
    backends = ("process",)
    if not args.no_ray:
        try:
            import ray
        except ImportError:
            print("# ray is not installed (pip install 'jaxdm[ray]'): process pool only")
        else:
            t0 = time.perf_counter()
            ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
            print(f"# local Ray instance started in {time.perf_counter() - t0:.1f}s")
            backends = ("process", "ray")
    if plan is not None:
        pass
    elif args.quick:
        plan = [("toy_sleep20ms", 16, 4, 4, 2), ("alfworld", 16, 2, 4, 2)]
    else:
        plan = [(f"toy_sleep{ms}ms", 32, 8, 20, 3) for ms in (0, 1, 10, 50)]
        plan += [("toy_busy10ms", 32, 2, 10, 3), ("toy_busy10ms", 32, 8, 10, 3),
                 ("alfworld", 32, 2, 30, 3), ("alfworld", 32, 8, 30, 3)]
    lines = []
    for name, batch, workers, steps, rounds in plan:
        block = measure(name, batch, workers, steps, rounds, backends)
        print("\n".join(block[:1]), flush=True)
        lines += block
    print()
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
