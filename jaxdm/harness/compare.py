"""``jaxdm harness compare``: Stage 1 (each candidate arm alone vs the reference: non-inferior
and cheaper, Holm; ``jaxdm.stats``), the registered Stage 2 selection run combined on NEW test
tasks (indices after Stage 1's), ``report.json``, ``report.md`` and the figures
``frontier.png`` and ``savings_by_point.png``."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxdm import jsonl, stats
from jaxdm.harness.arms import run_arm, save_arm
from jaxdm.harness.config import ArmConfig, HarnessConfig
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.journal import command_journal, read_json, recorded
from jaxdm.harness.passes import build_harness, read_rows, run_episodes
from jaxdm.harness.report import frontier_figure, nan_to_none, report_markdown, savings_figure
from jaxdm.harness.thresholds import load_thresholds
from jaxdm.stats import Arm


def _arms_from_files(out: Path, names: Sequence[str]) -> tuple[dict[str, Any], int]:
    """The arms' per-task outcomes on the tasks complete in every one of them (the tests are
    paired; an incomplete episode counts for no arm), and how many tasks that leaves out."""
    rows = {n: read_rows(out / "runs" / n / "episodes.jsonl") for n in names}
    flagged = {r["task_id"] for rs in rows.values() for r in rs if r.get("incomplete")}
    arms = {}
    for n, rs in rows.items():
        rs = [r for r in rs if r["task_id"] not in flagged]
        if not rs:
            raise HarnessError(f"{out / 'runs' / n / 'episodes.jsonl'}: no task is complete in "
                               f"every arm ({len(flagged)} incomplete); run the command again "
                               f"with --resume once the servers answer")
        arms[n] = Arm(np.array([r["success"] for r in rs], dtype=float),
                      np.array([r["cost"] for r in rs], dtype=float),
                      tuple(r["task_id"] for r in rs))
    return arms, len(flagged)


@recorded("compare")
def cmd_compare(cfg: HarnessConfig) -> dict[str, Any]:
    """``jaxdm harness compare``: Stage 1 on the arms' files, the registered Stage 2 combination on
    new test tasks, ``report.json`` / ``report.md`` and the figures; returns the report."""
    out = Path(cfg.out_dir)
    sp = out / "summary.json"
    if not sp.is_file():
        raise HarnessError(f"{sp} does not exist (run `jaxdm harness run` first)")
    summary = read_json(sp)
    # A candidate's point is its configured delegation's: a fitted CASCADE whose fit left the
    # point to the LLM runs with no delegation (the summary's point is None) and is still
    # tested (it is the LLM alone, so it cannot pass the cost test).
    configured = {a.name: a.delegations for a in cfg.arms}
    cands = [(n, s["point"] or (configured[n][0].point if len(configured.get(n, ())) == 1
                                else None))
             for n, s in summary["arms"].items() if s.get("candidate")]
    if any(p is None for _, p in cands):
        raise HarnessError("candidate arms must have exactly one delegation (their point)")
    report: dict[str, Any] = {"summary": summary}
    if cands:
        reg = stats.register(cands, margin=cfg.stats.margin, alpha=cfg.stats.alpha,
                             ni_method=cfg.stats.ni_method, cost_method=cfg.stats.cost_method)
        arms1, report["excluded_tasks_stage1"] = _arms_from_files(
            out, ["llm_alone"] + [n for n, _ in cands])
        ref = arms1.pop("llm_alone")
        r1 = stats.stage1(reg, ref, arms1)
        sel = stats.stage2_selection(r1)
        report["stage1"] = r1.table()
        report["stage2_selection"] = sel
        report["registration"] = reg.digest
        chosen = [n for n in sel.values() if n is not None]
        report["stage2_delegations"] = list(chosen)
        if chosen:  # nothing passed: the LLM keeps every point and there is no Stage 2 test
            idx2 = range(cfg.test_tasks, cfg.test_tasks + cfg.stage2_tasks)
            thresholds = load_thresholds(out)
            journal = command_journal(cfg, "compare")
            ref2 = run_episodes(cfg, build_harness(cfg, (), None), "test", idx2, "stage2 llm_alone",
                                journal)
            arms_by_name = {a.name: a for a in cfg.arms}
            arm = ArmConfig("combined", tuple(d for n in chosen
                                              for d in arms_by_name[n].delegations))
            eps2, dels2 = run_arm(cfg, arm, thresholds, idx2, "stage2 combined", {}, journal)
            s2: dict[str, Any] = {"arms": {}}
            save_arm(out, "stage2_llm_alone", ref2, s2, [])
            save_arm(out, "stage2_combined", eps2, s2, dels2)
            report["stage2_arms"] = s2["arms"]
            arms2, report["excluded_tasks_stage2"] = _arms_from_files(
                out, ["stage2_llm_alone", "stage2_combined"])
            r2 = stats.stage2(r1, arms2["stage2_llm_alone"], {"combined": arms2["stage2_combined"]})
            report["stage2"] = r2.table()
    jsonl.write_json(out / "report.json", report, default=nan_to_none)
    text = report_markdown(cfg, report, load_thresholds(out))
    jsonl.write_atomic(out / "report.md", text)
    frontier_figure(summary, out / "frontier.png")
    savings_figure(summary, out / "savings_by_point.png")
    print(text)
    return report


__all__ = ["cmd_compare"]
