"""Harness overhead per decision beyond the model calls (goal <= 2 ms on CPU).

Runs DECISION GYM test tasks through ``jaxdm.harness.Harness`` with the SimulatedLLM and the
key-reading NoisyOracle and measures, per decision, the wall time spent outside the agent-LLM
and decision-model calls: building the decision-point questions, the modes, the records, the
prompt, the bookkeeping and the env step itself (so the figure is an upper bound on the
harness's own cost). Configurations: the LLM alone (tool, parameters, stop), a tool + params
CASCADE, and shadow mode with every optional step on (eight questions per step answered by the
model). Time is CPU time of this process (``time.process_time``): the round's CPU time minus
the CPU time spent inside the agent-LLM and decision-model calls (wrapped), so other jobs on a
loaded machine do not inflate it; the wall-clock figure the harness itself records
(``Episode.overhead_s``) is printed too. Medians over alternated rounds. The baseline is the
2 ms budget (no other harness to compare with here); ratio = budget / measured, > 1 means
within the goal.

Usage: python benchmarks/harness_overhead.py [--quick]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxdm.envs.decision_gym import DecisionGym, GymParams  # noqa: E402
from jaxdm.harness import (BACKEND_COST_ONLY, Delegation, Harness, NoisyOracle,  # noqa: E402
                           SimulatedLLM)
from jaxdm.harness.llm import STRONG, WEAK  # noqa: E402

BUDGET_MS = 2.0
ALL_ON = dataclasses.replace(BACKEND_COST_ONLY, memory=True, reflection=True, cheap_tier=True,
                             read_back=True, window=4)


class CpuTimed:
    """Wraps an agent LLM (``act``) or a decision model (``choose``) and sums the CPU time
    spent inside it."""

    total = 0.0

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def act(self, req):
        t0 = time.process_time()
        try:
            return self.inner.act(req)
        finally:
            CpuTimed.total += time.process_time() - t0

    def choose(self, questions):
        t0 = time.process_time()
        try:
            return self.inner.choose(questions)
        finally:
            CpuTimed.total += time.process_time() - t0


def configs():
    llm, cheap = CpuTimed(SimulatedLLM(STRONG, 0)), CpuTimed(SimulatedLLM(WEAK, 0))
    dm = CpuTimed(NoisyOracle(seed=0))
    return {
        "llm_alone": Harness(llm),
        "cascade_tool_params": Harness(llm, dm, [Delegation("tool", "cascade", 0.7),
                                                 Delegation("params", "cascade", 0.7)]),
        "shadow_all_points": Harness(llm, dm, settings=ALL_ON, cheap_llm=cheap, shadow=True),
    }


def one_round(h: Harness, tasks: range) -> tuple[float, int, float]:
    """(CPU ms per decision outside model calls, decisions, wall ms per decision recorded by
    the harness)."""
    env, params = DecisionGym(), GymParams(split="test")
    CpuTimed.total = 0.0
    c0 = time.process_time()
    eps = [h.run_task(env, i, params) for i in tasks]
    cpu = time.process_time() - c0 - CpuTimed.total
    n = sum(len(e.decisions) for e in eps)
    wall = sum(e.overhead_s for e in eps)
    return cpu / n * 1e3, n, wall / n * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer tasks and rounds (< 60 s)")
    args = ap.parse_args()
    tasks, rounds = (range(10), 3) if args.quick else (range(40), 5)
    hs = configs()
    for h in hs.values():  # warm-up (imports, caches)
        one_round(h, range(2))
    per = {k: [] for k in hs}
    counts = {}
    for _ in range(rounds):
        for name, h in hs.items():  # alternated rounds
            ms, n, wall = one_round(h, tasks)
            per[name].append(ms)
            counts[name] = (n, wall)
    print(f"{'configuration':22s} {'decisions/round':>15s} {'CPU ms/decision (median)':>25s} "
          f"{'wall ms/decision (last round)':>30s}")
    for name, v in per.items():
        print(f"{name:22s} {counts[name][0]:15d} {statistics.median(v):25.3f} "
              f"{counts[name][1]:30.3f}   rounds: " + ", ".join(f"{x:.3f}" for x in v))
    for name, v in per.items():
        m = statistics.median(v)
        print(f"RESULT harness_overhead_{name}: baseline {BUDGET_MS:.3f} ms/decision, "
              f"jaxdm {m:.3f} ms/decision, ratio {BUDGET_MS / m:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
