"""Rollout pipeline: sequential vs two-half pipelined rollouts over real ALFWorld env workers.

``jaxdm.rl.rollout.rollout`` runs, per turn, one policy call for all live episodes, then one
env step (baseline, ``pipeline=False``). With ``pipeline=True`` the slots form two halves: the
policy generates for one half while the other half's envs step in the ``VectorEnv`` workers
(``step_async`` with ``None`` for the idle half), so host env time hides behind generation at
the cost of two policy calls per turn.

Workload: native ALFWorld engine (generated train problems) in a ``VectorEnv`` with 2
workers, one batch of episodes per round, both modes on the same pool and the same tasks. The
policy is a stand-in for accelerator generation: it sleeps (releasing the GIL, as a device
call does) and picks an admissible action deterministically from (goal, step), so both modes
play identical episodes (checked). Two latency models, each its own result line:

* ``rollout_pipeline``: ``--gen-ms`` (20 ms) per call whatever the batch size, as for
  memory-bound decoding; the pipeline makes twice as many calls.
* ``rollout_pipeline_batch_scaled``: ``--gen-ms`` per full-batch call, scaled by the share of
  the batch in the call (a half-batch call costs half), as for compute-bound generation.

Rate: turns/s = agent actions executed (summed over episodes) per second of rollout wall
time (``RolloutResult.wall_s``, reset included; pool start-up excluded). Rounds alternate
baseline / pipelined; medians are reported.

    python benchmarks/rl_rollout_pipeline.py --quick
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib

import jax

from jaxdm.envs.vector import EnvFactory, VectorEnv
from jaxdm.rl.policy import ActionOut
from jaxdm.rl.rollout import rollout


class SleepPolicy:
    """Deterministic admissible-action picker that sleeps like a device call."""

    form = "option"

    def __init__(self, gen_s: float, batch: int, scaled: bool):
        self.gen_s, self.batch, self.scaled = gen_s, batch, scaled

    def act(self, params, states, key, *, greedy=False, pad_to=None):
        share = len(states) / self.batch if self.scaled else 1.0
        time.sleep(self.gen_s * share)
        outs = []
        for s in states:
            options = s.admissible or ("look",)
            pick = zlib.crc32(f"{s.goal}|{s.steps_taken}|{s.observation}".encode())
            action = options[pick % len(options)]
            outs.append(ActionOut(action=action, valid=True, raw=action, logp=0.0, unit={}))
        return outs


def _signature(res) -> list:
    return [[a.command for a in e.actions] for e in res.episodes]


def measure(batch: int, workers: int, max_actions: int, rounds: int, gen_ms: float,
            group_size: int) -> list[str]:
    factory = EnvFactory("jaxdm.envs.alfworld:AlfWorldEnv", {})
    t0 = time.perf_counter()
    venv = VectorEnv(factory, batch, num_workers=workers, group_size=group_size,
                     max_steps=max_actions, env_name="alfworld")
    startup = time.perf_counter() - t0
    lines = [f"# ALFWorld VectorEnv: {batch} slots (groups of {group_size}), {workers} workers, "
             f"max {max_actions} actions, {rounds} rounds per mode; pool start-up "
             f"{startup:.1f}s; stand-in generation {gen_ms:.0f} ms per call"]
    try:
        key = jax.random.key(0)
        # warm-up: imports, caches and the first episodes of every worker
        rollout(SleepPolicy(0.0, batch, False), None, venv, seed=10_000, key=key,
                max_actions=min(3, max_actions))
        for scaled in (False, True):
            policy = SleepPolicy(gen_ms / 1000.0, batch, scaled)
            rates: dict[str, list[float]] = {"seq": [], "pip": []}
            detail: dict[str, list[tuple]] = {"seq": [], "pip": []}
            for r in range(rounds):
                seed = 100 * r  # fresh tasks each round, the same for both modes
                runs = {}
                for mode in ("seq", "pip"):
                    res = rollout(policy, None, venv, seed=seed, key=key,
                                  max_actions=max_actions, pipeline=mode == "pip")
                    runs[mode] = res
                    rates[mode].append(res.num_actions / res.wall_s)
                    detail[mode].append((res.wall_s, res.generation_s, res.env_s,
                                         res.overlap_s, res.policy_calls))
                if _signature(runs["seq"]) != _signature(runs["pip"]):
                    raise AssertionError("pipelined and sequential rollouts played different "
                                         "episodes")
            name = "rollout_pipeline_batch_scaled" if scaled else "rollout_pipeline"
            base, ours = statistics.median(rates["seq"]), statistics.median(rates["pip"])
            for mode, label in (("seq", "sequential"), ("pip", "pipelined")):
                wall, gen, env, ovl, calls = (statistics.median(x) for x in zip(*detail[mode]))
                lines.append(f"# {name} {label}: wall {wall:.3f}s, generation {gen:.3f}s, "
                             f"env wait {env:.3f}s, overlap {ovl:.3f}s, {calls:.0f} policy "
                             f"calls, {res.num_actions} actions")
            lines.append(f"RESULT {name}: baseline {base:.1f} turns/s, jaxdm {ours:.1f} "
                         f"turns/s, ratio {ours / base:.2f}x")
    finally:
        venv.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 60 s)")
    parser.add_argument("--gen-ms", type=float, default=20.0,
                        help="stand-in generation latency per (full-batch) call, ms")
    args = parser.parse_args()
    if args.quick:
        lines = measure(batch=16, workers=2, max_actions=10, rounds=3, gen_ms=args.gen_ms,
                        group_size=4)
    else:
        lines = measure(batch=64, workers=4, max_actions=30, rounds=5, gen_ms=args.gen_ms,
                        group_size=8)
    for line in lines:
        print(line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
