"""What ``jaxdm harness fit`` and ``compare`` show: ``report.md`` (arms, thresholds, the Stage 1
/ 2 tables, the drift monitor, savings by point) and the figures ``calibration.png``,
``frontier.png`` and ``savings_by_point.png``, each written whole (a temporary file renamed
over it)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Mapping, Sequence

from jaxdm.harness.config import HarnessConfig
from jaxdm.harness.fit import binned, isotonic
from jaxdm.jsonl import OutputError
from jaxdm.runlog import pyplot


def nan_to_none(x):
    """``x`` with a float nan as None (the JSON writers' ``default``)."""
    return None if isinstance(x, float) and math.isnan(x) else x


def report_markdown(cfg: HarnessConfig, report: Mapping, thresholds: Mapping | None) -> str:
    """``report.md``'s text: the arms table, the fitted thresholds, the Stage 1 / 2 tables, the
    Stage 2 combination, the drift monitor and savings by point."""
    s = report["summary"]
    ref = s["arms"]["llm_alone"]
    lines = [f"# Harness report ({cfg.env.variant}, LLM {cfg.llm.get('profile', cfg.llm['kind'])}"
             f", decision model {cfg.dm.get('kind')})", "",
             f"Test tasks per arm: {ref['n']}; Stage 2: {cfg.stage2_tasks} new tasks; margin "
             f"{cfg.stats.margin:g}, alpha {cfg.stats.alpha:g} ({cfg.stats.ni_method} "
             f"non-inferiority, {cfg.stats.cost_method} cost test, Holm).", "",
             "| arm | success | cost/task (USD) | saving | wall (s, simulated) | LLM calls | "
             "DM calls | DM failures | incomplete |", "|---|---|---|---|---|---|---|---|---|"]
    for name, a in s["arms"].items():
        saving = 1 - a["cost"] / ref["cost"] if ref["cost"] else 0.0
        lines.append(f"| {name} | {a['success']:.3f} | {a['cost']:.5f} | {saving:+.1%} | "
                     f"{a['seconds']:.0f} | {a['llm_calls']} | {a['dm_calls']} | "
                     f"{a['dm_failures']} | {a.get('incomplete', 0)} |")
    incomplete = sum(a.get("incomplete", 0) for a in s["arms"].values())
    if incomplete or report.get("excluded_tasks_stage1") or report.get("excluded_tasks_stage2"):
        lines += ["", f"Incomplete episodes (a call got no answer: not counted as a success or "
                      f"a failure): {incomplete} over the arms; tasks left out of the paired "
                      f"tests: Stage 1 {report.get('excluded_tasks_stage1', 0)}, Stage 2 "
                      f"{report.get('excluded_tasks_stage2', 0)}."]
    if thresholds:
        lines += ["", "## Fitted thresholds (shadow mode, fit split)", "",
                  "| point | n | DM accuracy | ECE | q_L | ΔC (USD) | V (USD) | τ* | threshold | "
                  "share above |", "|---|---|---|---|---|---|---|---|---|---|"]
        for p, f in thresholds.items():
            th = "LLM keeps" if f["threshold"] is None else f"{f['threshold']:.3f}"
            lines.append(f"| {p} | {f['n']} | {f['dm_accuracy']:.3f} | {f['ece']:.3f} | "
                         f"{f['q_llm']:.3f} | {f['delta_cost']:.5f} | {f['value']:.3f} | "
                         f"{f['tau_star']:.3f} | {th} | {f['share_above']:.3f} |")
    for stage in ("stage1", "stage2"):
        if stage not in report:
            continue
        title = ("Stage 1: each delegation alone" if stage == "stage1" else
                 "Stage 2: the registered combination on new tasks")
        lines += ["", f"## {title}", "",
                  "| candidate | point | success ref | success | diff | lower bound | p (NI) | "
                  "saving | p (cost) | p Holm | passed |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in report[stage]:
            saving = r["saving"]
            lines.append(f"| {r['name']} | {r['point']} | {r['success_ref']:.3f} | "
                         f"{r['success']:.3f} | {r['diff']:+.3f} | {r['lower_bound']:+.3f} | "
                         f"{r['p_noninferiority']:.4f} | {saving:+.1%} | {r['p_cost']:.4f} | "
                         f"{r['p_holm']:.4f} | {'yes' if r['passed'] else 'no'} |")
    if "stage2_delegations" in report:
        chosen = report["stage2_delegations"] or "none (the LLM keeps every point)"
        lines += ["", f"Stage 2 combination (registered rule: per point the passing delegation "
                      f"with the largest saving): {chosen}"]
    drifts = [(n, a["drift"]) for n, a in s["arms"].items() if a.get("drift")]
    if drifts:
        lines += ["", "## Drift monitor (share of answers above τ, sliding window, test tasks)",
                  "", "| arm | point | τ | share at fit | share now | refit flagged |",
                  "|---|---|---|---|---|---|"]
        for n, d in drifts:
            lines.append(f"| {n} | {d['point']} | {d['threshold']:.3f} | "
                         f"{d['reference_share']:.3f} | {d['final_share']:.3f} | "
                         f"{'yes' if d['needs_refit'] else 'no'} |")
    lines += ["", "## Savings by point (single-delegation arms vs the LLM alone)", "",
              "| arm | point | saving per task (USD) | success diff |", "|---|---|---|---|"]
    for name, a in s["arms"].items():
        if a.get("point"):
            lines.append(f"| {name} | {a['point']} | {ref['cost'] - a['cost']:+.5f} | "
                         f"{a['success'] - ref['success']:+.3f} |")
    return "\n".join(lines) + "\n"


def _save_figure(fig, path: Path) -> None:
    """``fig`` as a PNG at ``path``, whole (a temporary file renamed over it) or
    ``OutputError``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from e


def calibration_figure(dec: Sequence[Mapping], fits: Mapping, path: Path) -> None:
    """``calibration.png``: per fitted point, the shadow answers' binned accuracy vs confidence, the
    isotonic fit, τ* and the threshold (nothing when no point was fitted)."""
    plt = pyplot()
    pts = list(fits)
    if not pts:
        return
    cols = min(4, len(pts))
    rows = math.ceil(len(pts) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    for ax, p in zip(axes.flat, pts):
        rs = [r for r in dec if r["point"] == p and r.get("confidence") is not None
              and r.get("dm_correct") is not None]
        x = [r["confidence"] for r in rs]
        y = [float(r["dm_correct"]) for r in rs]
        bins = [b for b in binned(x, y) if b["n"]]
        ax.plot([0, 1], [0, 1], ":", color="grey")
        ax.scatter([b["confidence"] for b in bins], [b["accuracy"] for b in bins],
                   s=[10 + b["n"] / 2 for b in bins], label="binned")
        xs, fit = isotonic(x, y)
        ax.step(xs, fit, where="post", label="isotonic")
        f = fits[p]
        ax.axhline(f["tau_star"], color="red", lw=0.8, label="τ*")
        if f["threshold"] is not None:
            ax.axvline(f["threshold"], color="green", lw=0.8, label="threshold")
        ax.set_title(p)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
    for ax in list(axes.flat)[len(pts):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


def frontier_figure(summary: Mapping, path: Path) -> None:
    """``frontier.png``: success vs cost per task for every arm and the CASCADE threshold sweep."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    fr = sorted(summary.get("frontier", []), key=lambda f: f["cost"])
    if fr:
        ax.plot([f["cost"] for f in fr], [f["success"] for f in fr], "o-", color="black",
                label="CASCADE threshold sweep", zorder=3)
        for f in fr:
            ax.annotate(f"τ={f['threshold']:.2g}", (f["cost"], f["success"]), fontsize=7,
                        xytext=(3, -10), textcoords="offset points")
    markers = "sD^v<>pP*Xhd"
    for i, (name, a) in enumerate(summary["arms"].items()):
        ax.scatter([a["cost"]], [a["success"]], marker=markers[i % len(markers)], s=36,
                   label=name, zorder=4)
    ax.set_xlabel("cost per task (USD)")
    ax.set_ylabel("task success")
    ax.set_title("cost vs success (same test tasks)")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


def savings_figure(summary: Mapping, path: Path) -> None:
    """``savings_by_point.png``: the cost saving vs the LLM alone of each single-point arm."""
    plt = pyplot()
    ref = summary["arms"]["llm_alone"]
    rows = [(n, a) for n, a in summary["arms"].items() if a.get("point")]
    fig, ax = plt.subplots(figsize=(6, 0.35 * max(3, len(rows)) + 1))
    if rows and ref["cost"]:
        ax.barh([n for n, _ in rows], [1 - a["cost"] / ref["cost"] for _, a in rows])
        ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("cost saving vs the LLM alone")
    ax.set_title("savings by delegation")
    fig.tight_layout()
    _save_figure(fig, path)
    plt.close(fig)


__all__ = ["nan_to_none", "report_markdown", "calibration_figure", "frontier_figure",
           "savings_figure"]
