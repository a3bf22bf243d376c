"""Harness episodes inline vs on env workers (``env.backend``: ``jaxdm.harness.pool``).

Workload: a harness shadow pass (the smoke preset's simulated agent LLM and noisy-oracle
decision model, every question asked) over N DECISION GYM fit tasks, the env wrapped in
``DelayedEnv`` sleeping D ms per step (an env that waits: a sandbox, a browser, a remote
service; D = 0 is DECISION GYM itself, well under a millisecond per step). Baseline: the
inline backend (each episode ``Harness.run_task`` in this process, one after another: the loop
before env workers existed). jaxdm: ``EpisodeRunner`` on W worker processes with 2 episodes in
flight per worker (and W Ray actors with ``--ray``). Measured: episodes/s of the whole pass,
pool start and close included (what a pass costs), and derived from it the rate after the
pool's start (the pool's start and close timed apart, subtracted). Rounds alternate
baseline / ours; medians reported. Every backend's episodes are checked equal to the
baseline's (timings aside). Each pass starts its own workers (``close_kept_pools`` after it).

Usage: python benchmarks/harness_env_workers.py [--quick] [--ray]
       [--plan sleep50ms:32:8:3,sleep10ms:32:4:3,sleep0ms:32:2:3]   (workload:tasks:workers:rounds)
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

from jaxdm.jsonl import without_keys   # light: no JAX

# Light imports only at the top: spawned env workers import this script again as their main
# module (the ``jaxdm`` CLI's main module is light too); the harness is imported in the calls.

TIMING = {"seconds", "overhead_s"}
_timeless = functools.partial(without_keys, keys=TIMING)


def _factory(workload: str):
    from jaxdm.envs.vector import EnvFactory  # noqa: PLC0415 - see the imports
    if not (workload.startswith("sleep") and workload.endswith("ms")):
        raise ValueError(f"unknown workload {workload!r}: sleep<N>ms")
    delay = float(workload[len("sleep"):-2]) / 1000
    return EnvFactory("jaxdm.envs.toy.delayed:make_delayed_env",
                      {"target": "jaxdm.envs.decision_gym:DecisionGym", "step_delay_s": delay})


def _pass(workers, factory, tasks: int) -> tuple[float, list]:
    from jaxdm.envs.decision_gym import GymParams  # noqa: PLC0415 - see the imports
    from jaxdm.harness.config import load  # noqa: PLC0415
    from jaxdm.harness.passes import build_harness  # noqa: PLC0415
    from jaxdm.harness.pool import EpisodeRunner, close_kept_pools  # noqa: PLC0415

    cfg = load("smoke", ["progress=false"])
    harness = build_harness(cfg, (), None, shadow=True)
    params = GymParams(variant=cfg.env.variant, strict=cfg.env.strict,
                       max_steps=cfg.env.max_steps, split="fit")
    runner = EpisodeRunner(workers, factory, params, max_failed_share=0.05)
    t0 = time.perf_counter()
    eps = [ep for _, _, ep in runner.play(range(tasks), lambda i: harness.for_episode())]
    close_kept_pools()   # each pass starts its workers (a one-pass command)
    return time.perf_counter() - t0, [_timeless(e.to_dict()) for e in eps]


def _start_close(workers, factory, params_split: str = "fit") -> float:
    """Seconds to start and close the pool alone (the same workers and slots as a pass)."""
    from jaxdm.envs.decision_gym import GymParams  # noqa: PLC0415 - see the imports
    from jaxdm.envs.vector import VectorEnv  # noqa: PLC0415

    t0 = time.perf_counter()
    VectorEnv(factory, workers.slots, num_workers=workers.num_workers,
              params=GymParams(split=params_split), backend=workers.backend,
              backend_options=dict(workers.ray) or None).close()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one small plan (~40 s)")
    ap.add_argument("--ray", action="store_true", help="also Ray actors on a local instance")
    ap.add_argument("--plan", default="sleep50ms:32:8:3,sleep10ms:32:4:3,sleep0ms:32:2:3")
    args = ap.parse_args(argv)
    from jaxdm.harness.pool import EnvWorkersConfig  # noqa: PLC0415 - see the imports

    plan = "sleep10ms:16:4:2,sleep0ms:16:2:2" if args.quick else args.plan
    if args.ray:
        import ray  # noqa: PLC0415 - optional extra
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    for item in plan.split(","):
        workload, tasks, n_workers, rounds = item.split(":")
        tasks, n_workers, rounds = int(tasks), int(n_workers), int(rounds)
        factory = _factory(workload)
        backends = {"inline": EnvWorkersConfig(),
                    "process": EnvWorkersConfig("process", n_workers)}
        if args.ray:
            backends["ray"] = EnvWorkersConfig("ray", n_workers, ray={"num_cpus": 0.25})
        times: dict[str, list[float]] = {k: [] for k in backends}
        overhead: dict[str, list[float]] = {k: [] for k in backends if k != "inline"}
        reference = None
        for _ in range(rounds):
            for name, w in backends.items():
                seconds, eps = _pass(w, factory, tasks)
                if reference is None:
                    reference = eps
                assert eps == reference, f"{name}: episodes differ from the inline pass"
                times[name].append(seconds)
                if name != "inline":
                    overhead[name].append(_start_close(w, factory))
        base = tasks / statistics.median(times["inline"])
        for name in backends:
            if name == "inline":
                continue
            ours = tasks / statistics.median(times[name])
            print(f"{workload}, {tasks} tasks, {n_workers} {name} workers: inline "
                  f"{base:.2f} episodes/s, {name} {ours:.2f} episodes/s (pool start and close "
                  f"included; medians of {rounds}: {[round(t, 2) for t in times[name]]} s vs "
                  f"inline {[round(t, 2) for t in times['inline']]} s)", flush=True)
            print(f"RESULT harness_env_{workload}_{name}{n_workers}: baseline {base:.3f} "
                  f"episodes/s, jaxdm {ours:.3f} episodes/s, ratio {ours / base:.2f}x",
                  flush=True)
            # derived: the pass without its pool's start and close (measured apart)
            pool_s = statistics.median(overhead[name])
            steady = tasks / max(statistics.median(times[name]) - pool_s, 1e-9)
            print(f"  pool start + close alone: median {pool_s:.2f} s; without it the pass "
                  f"runs {steady:.2f} episodes/s", flush=True)
            print(f"RESULT harness_env_{workload}_{name}{n_workers}_after_start: baseline "
                  f"{base:.3f} episodes/s, jaxdm {steady:.3f} episodes/s, ratio "
                  f"{steady / base:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
