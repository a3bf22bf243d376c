"""``jaxdm harness run``: every arm (the LLM alone first: the reference) on ``test_tasks``
test-split tasks, plus a CASCADE threshold sweep for the cost-vs-success frontier; writes per
arm ``runs/<arm>/decisions.jsonl`` (every decision: point, mode, who decided, confidence,
correct, cost, latency) and ``episodes.jsonl``, and ``summary.json`` (with the drift monitor
of fitted CASCADE arms)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdm import jsonl
from jaxdm.harness.agent import Episode
from jaxdm.harness.config import ArmConfig, DelegationConfig, HarnessConfig
from jaxdm.harness.dm import RandomTrigger
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.fit import DriftMonitor
from jaxdm.harness.journal import Journal, command_journal, recorded
from jaxdm.harness.modes import Delegation
from jaxdm.harness.passes import (arm_summary, build_harness, complete_episodes, decision_rows,
                                  episode_rows, run_episodes, write_rows)
from jaxdm.harness.thresholds import load_thresholds


def _delegations(arm: ArmConfig, thresholds: Mapping[str, Any] | None) -> list[Delegation]:
    out = []
    for i, d in enumerate(arm.delegations):
        where = f"arm {arm.name!r} delegations[{i}]"
        th = d.threshold
        if d.fitted:
            if thresholds is None:
                raise HarnessError(f"{where}: fitted threshold but no thresholds.json (run "
                                   "`jaxdm harness fit` first)")
            if d.point not in thresholds:
                raise HarnessError(f"{where}: thresholds.json has no point {d.point!r}")
            th = thresholds[d.point]["threshold"]
            if th is None:
                continue  # the fit leaves this point to the LLM
        try:
            out.append(Delegation(d.point, d.mode, th, d.k))
        except ValueError as e:
            raise HarnessError(f"{where}: {e}") from None
    return out


def run_arm(cfg: HarnessConfig, arm: ArmConfig, thresholds, indices, desc, rates,
            journal: Journal | None = None) -> tuple:
    """Runs one arm's pass on ``indices`` (test split): its delegations (fitted ones from
    ``thresholds``), its own decision model or a random trigger copying the call ``rates`` of an
    earlier TRIGGER arm; returns (episodes, delegations)."""
    dels = _delegations(arm, thresholds)
    dm = None
    if arm.random_trigger_like is not None:
        if arm.random_trigger_like not in rates:
            raise HarnessError(f"arm {arm.name!r}: random_trigger_like "
                               f"{arm.random_trigger_like!r} must name an earlier TRIGGER arm")
        if len(dels) != 1 or dels[0].mode != "trigger":
            raise HarnessError(f"arm {arm.name!r}: a random trigger needs exactly one TRIGGER "
                               "delegation")
        dm = RandomTrigger(rates[arm.random_trigger_like].get(dels[0].point, 0.0), cfg.seed)
    h = build_harness(cfg, dels, arm.dm, dm=dm)
    eps = run_episodes(cfg, h, "test", indices, desc, journal)
    return eps, dels


def _run_rates(eps: Sequence[Episode]) -> dict[str, float]:
    """Share of decisions at each loop point where the optional step ran (option 0)."""
    out: dict[str, list[int]] = {}
    for e in complete_episodes(eps):
        for r in e.decisions:
            if r.choice is not None:
                out.setdefault(r.point, []).append(int(r.choice == 0))
    return {p: float(np.mean(v)) for p, v in out.items()}


@recorded("run")
def cmd_run(cfg: HarnessConfig) -> dict[str, Any]:
    """``jaxdm harness run``: the LLM alone, every arm and the CASCADE frontier on the same test
    tasks; writes ``runs/<arm>/`` and ``summary.json`` and returns the summary."""
    out = Path(cfg.out_dir)
    thresholds = load_thresholds(out)
    idx = range(cfg.test_tasks)
    summary: dict[str, Any] = {"arms": {}, "frontier": []}
    t0 = time.perf_counter()
    journal = command_journal(cfg, "run")
    ref = run_episodes(cfg, build_harness(cfg, (), None), "test", idx, "llm_alone", journal)
    save_arm(out, "llm_alone", ref, summary, [])
    rates: dict[str, dict[str, float]] = {}
    for arm in cfg.arms:
        eps, dels = run_arm(cfg, arm, thresholds, idx, arm.name, rates, journal)
        rates[arm.name] = _run_rates(eps)
        save_arm(out, arm.name, eps, summary, dels, arm)
        drift = _drift(arm, dels, eps, thresholds)
        if drift is not None:
            summary["arms"][arm.name]["drift"] = drift
    # the frontier: CASCADE on one point across thresholds (+ the fitted one)
    ths = list(cfg.frontier_thresholds)
    if thresholds and cfg.frontier_point in thresholds and \
            thresholds[cfg.frontier_point]["threshold"] is not None:
        ths.append(float(thresholds[cfg.frontier_point]["threshold"]))
    for th in sorted(set(ths)):
        arm = ArmConfig(f"frontier_{cfg.frontier_point}_{th:g}",
                        (DelegationConfig(cfg.frontier_point, "cascade", th),))
        eps, _ = run_arm(cfg, arm, thresholds, idx, arm.name, rates, journal)
        s = arm_summary(arm.name, eps)
        summary["frontier"].append({"threshold": th, "success": s["success"], "cost": s["cost"]})
    summary["wall_s"] = time.perf_counter() - t0
    jsonl.write_json(out / "summary.json", summary)
    for name, s in summary["arms"].items():
        print(f"{name:28s} success {s['success']:.3f}  cost/task ${s['cost']:.5f}  "
              f"LLM calls {s['llm_calls']:5d} ({s['llm_failures']} failed)  DM calls "
              f"{s['dm_calls']:5d} ({s['dm_failures']} failed)  incomplete {s['incomplete']}")
    return summary


def _drift(arm: ArmConfig, dels: Sequence[Delegation], eps: Sequence[Episode],
           thresholds: Mapping | None, window: int = 100, tolerance: float = 0.15
           ) -> dict | None:
    """The drift monitor over a fitted CASCADE arm's answers at its point, in task order:
    share above τ in a sliding window vs the shadow-mode share at fit time."""
    fitted = [d for d in arm.delegations if d.fitted]
    if len(dels) != 1 or not fitted or thresholds is None:
        return None
    d = dels[0]
    ref = thresholds[d.point]["share_above"]
    confs = [r.confidence for e in complete_episodes(eps) for r in e.decisions
             if r.point == d.point and r.confidence is not None]
    if not confs:
        return None
    m = DriftMonitor(d.tau, ref, window=min(window, len(confs)), tolerance=tolerance)
    flagged_at = None
    for i, c in enumerate(confs):
        m.update(c)
        if flagged_at is None and m.needs_refit:
            flagged_at = i
    return {"point": d.point, "threshold": d.tau, "reference_share": ref,
            "final_share": m.share, "window": m.window, "tolerance": tolerance,
            "needs_refit": m.needs_refit, "first_flag_at": flagged_at,
            "shares": m.history[::max(1, len(m.history) // 50)]}


def save_arm(out: Path, name: str, eps: Sequence[Episode], summary: dict, dels, arm=None):
    """Writes an arm's ``runs/<name>/decisions.jsonl`` and ``episodes.jsonl`` and adds its summary
    (delegations, candidate, point) to ``summary["arms"]``."""
    d = out / "runs" / name
    write_rows(d / "decisions.jsonl", decision_rows(eps, name))
    write_rows(d / "episodes.jsonl", episode_rows(eps))
    s = arm_summary(name, eps)
    s["delegations"] = [x.name for x in dels]
    s["candidate"] = bool(arm.candidate) if arm is not None else False
    s["point"] = dels[0].point if len(dels) == 1 else None
    summary["arms"][name] = s


__all__ = ["cmd_run", "run_arm", "save_arm"]
