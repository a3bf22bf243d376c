"""The harness sensitivity table (issue 40 §4): does the tool CASCADE's advantage over the LLM
alone survive a weaker decision model, overlapping confidence and errors correlated with the
LLM's? All parties are simulations: the strong ``SimulatedLLM`` and the ``NoisyOracle``.

Per setting and harness seed it runs ``jaxdm harness shadow|fit|run|compare`` through the
library (as ``harness_decision_gym.py`` does) with ``experiments/configs/harness_sensitivity.yaml``
(DECISION GYM base, the strong simulated LLM, the fitted tool CASCADE arm, the fixed-0.5 tool
CASCADE arm, the LLM alone) and these decision models:

- ``acc0.70`` ... ``acc0.95``: accuracy 0.7 / 0.8 / 0.9 / 0.95, informative confidence, ρ = 0;
- ``overlap``: accuracy 0.9, confidence Beta(3, 2) right vs Beta(2.5, 2) wrong (AUC 0.56);
- ``rho0.5`` / ``rho0.8``: accuracy 0.9, informative, errors coupled with the LLM's at latent
  correlation ρ (``jaxdm.harness.coupling``; both parties at ρ).

A harness seed s sets the tasks (``agent.task_offset`` = 10000·s: seed 0 plays the tasks of
``experiments/results/harness``), the LLMs' seeds (s) and the decision model's (1 + s). The
shadow records also give what the setting really was: the decision model's and the LLM's
accuracy at the tool point, the phi coefficient of their errors and the AUC of the model's
confidence for right vs wrong answers. Results: ``experiments/results/harness_sensitivity/``
(``table.md``, ``summary.json``, ``sensitivity.png``, ``PRODUCED_BY.txt``; each run's folder
under ``runs/``), mean ± 95 % t-interval over the seeds (``experiments/intervals.py``).
Resumable: a finished run (its ``report.json``) is read, not rerun; an interrupted one resumes;
``--overwrite`` runs everything again.

    python experiments/harness_sensitivity.py --quick      # ~20 s: 2 settings, 2 seeds, tiny
    python experiments/harness_sensitivity.py              # the README table (~15 min, 2 cores)
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from intervals import t_interval  # noqa: E402
from jaxdm.harness.cli import COMMANDS  # noqa: E402
from jaxdm.harness.config import load  # noqa: E402
from jaxdm.harness.coupling import error_correlation  # noqa: E402
from jaxdm.harness.dm import CONFIDENCE_SETTINGS, confidence_auc  # noqa: E402
from jaxdm.harness.errors import HarnessError  # noqa: E402
from jaxdm.harness.llm import STRONG  # noqa: E402
from jaxdm.jsonl import read_records, write_atomic, write_json  # noqa: E402

# name -> (decision-model accuracy, confidence setting, correlation ρ)
SETTINGS = {
    "acc0.70": (0.70, "informative", 0.0),
    "acc0.80": (0.80, "informative", 0.0),
    "acc0.90": (0.90, "informative", 0.0),
    "acc0.95": (0.95, "informative", 0.0),
    "overlap": (0.90, "overlap", 0.0),
    "rho0.5": (0.90, "informative", 0.5),
    "rho0.8": (0.90, "informative", 0.8),
}
SEEDS = (0, 1, 2)
TASK_OFFSET_PER_SEED = 10_000
ARMS = ("tool_cascade_fitted", "tool_cascade_fixed_0.5")
# measured: 13 s per run at 60 / 60 / 60 on the loaded 2 cores; these take ~1 min per run
SIZES = dict(shadow_tasks=150, test_tasks=300, stage2_tasks=300)
QUICK_SIZES = dict(shadow_tasks=8, test_tasks=8, stage2_tasks=8)
OUT = ROOT / "experiments" / "results" / "harness_sensitivity"


def overrides_for(setting: str, seed: int, sizes: dict, out: Path) -> list[str]:
    """The config overrides of one run (setting, harness seed)."""
    acc, conf, rho = SETTINGS[setting]
    dm = (f"{{kind: oracle_noisy, default_accuracy: {acc}, seed: {1 + seed}, "
          f"confidence: {conf}, correlation: {rho}}}")
    llm = "{{kind: simulated, profile: {}, seed: %d, correlation: %s}}" % (seed, rho)
    return [f"dm={dm}", "llm=" + llm.format("strong"), "cheap_llm=" + llm.format("weak"),
            f"seed={seed}",
            f"agent.task_offset={TASK_OFFSET_PER_SEED * seed}", f"out_dir={out}",
            "progress=false"] + [f"{k}={v}" for k, v in sizes.items()]


def shadow_diagnostics(out: Path, point: str = "tool") -> dict:
    """From the shadow records at ``point``: the decision model's and the LLM's accuracy, the
    phi coefficient of their errors and the AUC of the model's confidence (right vs wrong)."""
    dm_err, llm_err, conf = [], [], []
    for _, r in read_records(out / "shadow_decisions.jsonl"):
        if r.get("point") != point or r.get("answer") is None or r.get("dm_choice") is None \
                or r.get("llm_choice") is None:
            continue
        dm_err.append(r["dm_choice"] not in r["answer"])
        llm_err.append(r["llm_choice"] not in r["answer"])
        conf.append(float(r["confidence"]))
    d, l_, c = np.array(dm_err, float), np.array(llm_err, float), np.array(conf)
    phi = float(np.corrcoef(d, l_)[0, 1]) if d.std() > 0 and l_.std() > 0 else float("nan")
    right, wrong = c[d == 0], c[d == 1]
    auc = float(np.mean(right[:, None] > wrong[None, :]) +
                0.5 * np.mean(right[:, None] == wrong[None, :])) if right.size and wrong.size \
        else float("nan")
    return {"n": int(d.size), "dm_accuracy": float(1 - d.mean()) if d.size else float("nan"),
            "llm_accuracy": float(1 - l_.mean()) if d.size else float("nan"),
            "error_phi": phi, "confidence_auc": auc}


def run_one(setting: str, seed: int, sizes: dict, root: Path, overwrite: bool) -> dict:
    """One (setting, seed): the four harness commands (skipped when finished), then its row."""
    out = root / "runs" / f"{setting}_seed{seed}"
    done = (out / "report.json").is_file()
    wall = None
    if overwrite or not done:
        cfg = load("sensitivity", overrides_for(setting, seed, sizes, out))
        resume = out.is_dir() and not overwrite
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        for name in ("shadow", "fit", "run", "compare"):
            COMMANDS[name](cfg, overwrite=overwrite, resume=resume)
        wall = time.perf_counter() - t0
        write_json(out / "wall.json", {"wall_s": wall, "commit": git_head()})
    made = json.loads((out / "wall.json").read_text()) if (out / "wall.json").is_file() else {}
    wall, commit = made.get("wall_s"), made.get("commit")
    report = json.loads((out / "report.json").read_text())
    arms = report["summary"]["arms"]
    ref = arms["llm_alone"]
    row = {"setting": setting, "seed": seed, "wall_s": wall, "commit": commit, "n": ref["n"],
           "llm_alone_success": ref["success"], "llm_alone_cost": ref["cost"]}
    for arm in ARMS:
        a = arms[arm]
        tool = a["points"].get("tool", {})
        row[arm] = {"success": a["success"], "cost": a["cost"],
                    "gap": a["success"] - ref["success"],
                    "saving": 1.0 - a["cost"] / ref["cost"],
                    "delegated": tool.get("dm", 0) / tool["n"] if tool.get("n") else 0.0}
    th = json.loads((out / "thresholds.json").read_text()).get("tool", {})
    row["fitted_tau"] = th.get("threshold")
    s1 = next((r for r in report.get("stage1", []) if r["name"] == "tool_cascade_fitted"), None)
    row["stage1_passed"] = bool(s1 and s1["passed"])
    s2 = report.get("stage2") or []
    row["stage2"] = None if not s2 else {k: s2[0][k] for k in (
        "success_ref", "success", "saving", "p_holm", "passed")}
    row["shadow"] = shadow_diagnostics(out)
    return row


def _mean_ci(values) -> tuple[float, float]:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    if len(vals) < 2:
        return (float(vals[0]) if vals else float("nan"), float("nan"))
    m, h = t_interval(vals)
    return float(m), float(h)


def aggregate(rows: list[dict]) -> dict:
    """Per setting: mean ± 95 % t half-width over its seeds of every reported value."""
    out = {}
    for setting in SETTINGS:
        rs = [r for r in rows if r["setting"] == setting]
        if not rs:
            continue
        acc, conf, rho = SETTINGS[setting]
        agg = {"accuracy": acc, "confidence": conf, "correlation": rho, "seeds": len(rs),
               "llm_alone_success": _mean_ci([r["llm_alone_success"] for r in rs]),
               "fitted_tau": [r["fitted_tau"] for r in rs],
               "stage1_passed": sum(r["stage1_passed"] for r in rs),
               "stage2_passed": sum(bool(r["stage2"] and r["stage2"]["passed"]) for r in rs),
               "expected_error_phi": (error_correlation(rho, acc, STRONG.acc("tool"))
                                      if rho > 0 else 0.0),
               "beta_auc": confidence_auc(*CONFIDENCE_SETTINGS.get(conf))}
        for arm in ARMS:
            agg[arm] = {k: _mean_ci([r[arm][k] for r in rs])
                        for k in ("success", "gap", "saving", "delegated")}
        agg["shadow"] = {k: _mean_ci([r["shadow"][k] for r in rs])
                         for k in ("dm_accuracy", "llm_accuracy", "error_phi", "confidence_auc")}
        out[setting] = agg
    return out


REFERENCE = "acc0.90"  # the harness results' decision model: the paired comparisons' baseline


def paired(rows: list[dict], reference: str = REFERENCE) -> dict:
    """Per setting: mean ± 95 % t half-width over seeds of (setting − ``reference``) for each
    arm's gap and saving, seed by seed (same seed: same tasks and model seeds)."""
    by = {(r["setting"], r["seed"]): r for r in rows}
    out = {}
    for setting in SETTINGS:
        seeds = [s for (name, s) in by if name == setting and (reference, s) in by]
        if setting == reference or len(seeds) < 2:
            continue
        out[setting] = {arm: {k: _mean_ci([by[(setting, s)][arm][k] - by[(reference, s)][arm][k]
                                           for s in seeds]) for k in ("gap", "saving")}
                        for arm in ARMS}
        out[setting]["seeds"] = len(seeds)
    return out


def _fmt(mh: tuple[float, float], pct: bool = False, signed: bool = False) -> str:
    m, h = mh
    if not np.isfinite(m):
        return "-"
    scale, unit = (100.0, " pp" if signed else " %") if pct else (1.0, "")
    sign = "+" if signed else ""
    body = f"{m * scale:{sign}.1f}" if pct else f"{m:{sign}.3f}"
    half = "" if not np.isfinite(h) else (f" ± {h * scale:.1f}" if pct else f" ± {h:.3f}")
    return f"{body}{half}{unit}"


def table_md(agg: dict, sizes: dict, diffs: dict | None = None) -> str:
    """The README table: one line per setting."""
    lines = [
        "# Harness sensitivity (simulations): CASCADE vs the LLM alone", "",
        "All parties are simulated (strong `SimulatedLLM`, `NoisyOracle` decision model). "
        f"DECISION GYM base; per run shadow {sizes['shadow_tasks']}, test "
        f"{sizes['test_tasks']}, Stage 2 {sizes['stage2_tasks']} tasks; mean ± 95 % "
        "t-interval over the harness seeds (tasks, LLM and decision-model seeds). gap = "
        "success − LLM alone's on the same tasks (pp); saving = 1 − cost / LLM alone's cost; "
        "delegated = share of tool decisions the model took. Shadow columns: what the setting "
        "measured at the tool point (model / LLM accuracy, phi of their errors, AUC of the "
        "model's confidence right vs wrong).", "",
        "| setting | DM acc | confidence (Beta AUC) | ρ (expected phi) | LLM alone success | "
        "fitted: gap | fitted: saving | fitted: delegated | fixed 0.5: gap | fixed 0.5: saving "
        "| τ fitted per seed | Stage 1 / Stage 2 passed | shadow: DM acc / LLM acc / phi / AUC |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in agg.items():
        f, x, sh = a["tool_cascade_fitted"], a["tool_cascade_fixed_0.5"], a["shadow"]
        taus = ", ".join("LLM" if t is None else f"{t:.2f}" for t in a["fitted_tau"])
        lines.append(
            f"| {name} | {a['accuracy']:.2f} | {a['confidence']} ({a['beta_auc']:.2f}) | "
            f"{a['correlation']:.1f} ({a['expected_error_phi']:.2f}) | "
            f"{_fmt(a['llm_alone_success'])} | {_fmt(f['gap'], True, True)} | "
            f"{_fmt(f['saving'], True)} | {_fmt(f['delegated'], True)} | "
            f"{_fmt(x['gap'], True, True)} | {_fmt(x['saving'], True)} | {taus} | "
            f"{a['stage1_passed']}/{a['seeds']}, {a['stage2_passed']}/{a['seeds']} | "
            f"{sh['dm_accuracy'][0]:.3f} / {sh['llm_accuracy'][0]:.3f} / "
            f"{sh['error_phi'][0]:.2f} / {sh['confidence_auc'][0]:.2f} |")
    if diffs:
        lines += ["", f"Paired over seeds, setting − {REFERENCE} (the same seed plays the same "
                  "tasks; pp of gap / of saving):", "",
                  "| setting | fitted: Δ gap | fitted: Δ saving | fixed 0.5: Δ gap | "
                  "fixed 0.5: Δ saving |", "|---|---|---|---|---|"]
        for name, d in diffs.items():
            f, x = d["tool_cascade_fitted"], d["tool_cascade_fixed_0.5"]
            lines.append(f"| {name} | {_fmt(f['gap'], True, True)} | "
                         f"{_fmt(f['saving'], True, True)} | {_fmt(x['gap'], True, True)} | "
                         f"{_fmt(x['saving'], True, True)} |")
    return "\n".join(lines) + "\n"


def plot(agg: dict, path: Path) -> None:
    """Success gap and cost saving per setting (fitted and fixed-0.5 CASCADE), 95 % t bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(agg)
    xs = np.arange(len(names))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, key, title in ((axes[0], "gap", "success − LLM alone (pp)"),
                           (axes[1], "saving", "cost saving vs LLM alone (%)")):
        for k, (arm, label) in enumerate(((ARMS[0], "CASCADE fitted τ"),
                                          (ARMS[1], "CASCADE τ = 0.5"))):
            m = np.array([agg[n][arm][key][0] for n in names]) * 100
            h = np.nan_to_num(np.array([agg[n][arm][key][1] for n in names]) * 100)
            ax.errorbar(xs + (k - 0.5) * 0.2, m, yerr=h, fmt="o", capsize=4, label=label)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xticks(xs, names, rotation=30)
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle("Harness sensitivity (simulated LLM and decision model), mean ± 95 % t over "
                 "seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_head() -> str:
    """The checkout's HEAD commit ("unknown" without git)."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=False).stdout.strip() \
            or "unknown"
    except OSError:
        return "unknown"


def produced_by(path: Path, argv: list[str], rows: list[dict], total_s: float) -> None:
    """Who made the results: command, commit, machine, wall time and commit per run."""
    commit = git_head()
    cpu = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                   check=False).stdout.splitlines():
            if line.startswith("Model name"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    walls = [f"{r['setting']}_seed{r['seed']}: "
             + ("(unrecorded)" if r["wall_s"] is None else f"{r['wall_s']:.0f} s")
             + f" at commit {r.get('commit') or 'unrecorded'}" for r in rows]
    write_atomic(path, "\n".join([
        "python experiments/harness_sensitivity.py " + " ".join(argv),
        f"HEAD {commit} when this file was written (each run's own commit below; "
        "the results are committed after it)",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.python_version()}, "
        f"CPU {cpu}, 2 cores shared with other jobs (a loaded machine)",
        f"this invocation: {total_s:.0f} s", "wall time per run (that run alone):", *walls]) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="2 settings x 2 seeds at tiny sizes (default --out: "
                         "runs/harness_sensitivity_quick)")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--out", default=None)
    ap.add_argument("--overwrite", action="store_true", help="run finished settings again")
    args = ap.parse_args(argv)
    settings = args.settings.split(",")
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        raise HarnessError(f"unknown setting(s) {bad}; known: {list(SETTINGS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        sizes = QUICK_SIZES
        if args.settings == ",".join(SETTINGS):
            settings = ["acc0.90", "rho0.8"]
        if args.seeds == ",".join(map(str, SEEDS)):
            seeds = [0, 1]
    else:
        sizes = SIZES
    # --quick writes under the git-ignored runs/, never over the README's results
    root = Path(args.out) if args.out else (ROOT / "runs" / "harness_sensitivity_quick"
                                            if args.quick else OUT)
    t0 = time.perf_counter()
    rows = []
    for setting in settings:
        for seed in seeds:
            row = run_one(setting, seed, sizes, root, args.overwrite)
            rows.append(row)
            f = row["tool_cascade_fitted"]
            print(f"== {setting} seed {seed}: LLM alone {row['llm_alone_success']:.3f}, fitted "
                  f"gap {f['gap']:+.3f} saving {f['saving']:+.1%}, shadow phi "
                  f"{row['shadow']['error_phi']:.2f}"
                  + ("" if row["wall_s"] is None else f" ({row['wall_s']:.0f} s)"), flush=True)
    agg = aggregate(rows)
    diffs = paired(rows)
    write_json(root / "summary.json", {"sizes": sizes, "settings": agg,
                                       f"paired_vs_{REFERENCE}": diffs, "runs": rows})
    text = table_md(agg, sizes, diffs)
    write_atomic(root / "table.md", text)
    plot(agg, root / "sensitivity.png")
    produced_by(root / "PRODUCED_BY.txt", list(argv if argv is not None else sys.argv[1:]),
                rows, time.perf_counter() - t0)
    print(text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"harness_sensitivity: error: {e}", file=sys.stderr)
        sys.exit(2)
