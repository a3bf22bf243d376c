"""The harness experiment on DECISION GYM (seed 003's protocol at our sizes).

For each variant (base, shift, hard) and each simulated agent LLM (strong + expensive, weak +
cheap) it runs the four harness jobs (``jaxdm harness shadow|fit|run|compare``) with the
Oracle-noisy decision model (``oracle_noisy``: key-reading, accuracy 0.9, informative but
uncalibrated confidence) from ``experiments/configs/harness_decision_gym.yaml``: shadow mode on
fit-split tasks, per-point thresholds, every arm and control on the same test tasks, the
registered Stage 1 / Stage 2 tests (jaxdm.stats), and writes
``experiments/results/harness/<variant>_<llm>/`` plus a combined ``summary.md``.

``--smollm2 N`` also runs shadow mode with SmolLM2-135M (constrained readout) as the decision
model on N fit tasks of the base variant, to put a real small model on the same calibration
plot (it is too slow on 2 CPU cores for whole arms). Readout labels options A-Z, so the
69-option tool question is a decision-model failure (counted; the LLM decides), which is the
failure path working as designed; option likelihood answers it but took 86-156 s per tool
question on the 2 loaded cores.

    python experiments/harness_decision_gym.py --quick         # ~2 min: small sizes
    python experiments/harness_decision_gym.py                 # the README numbers
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxdm.harness.cli import COMMANDS  # noqa: E402
from jaxdm.harness.config import load  # noqa: E402
from jaxdm.harness.errors import HarnessError  # noqa: E402
from jaxdm.harness.shadow import cmd_shadow  # noqa: E402
from jaxdm.harness.thresholds import cmd_fit  # noqa: E402
from jaxdm.jsonl import write_atomic  # noqa: E402

VARIANTS = ("base", "shift", "hard")
LLMS = ("strong", "weak")


def run_setting(variant: str, llm: str, sizes: dict, out_root: Path, progress: bool,
                overwrite: bool = False, resume: bool = False) -> dict:
    out = out_root / f"{variant}_{llm}"
    overrides = [f"env.variant={variant}", f"llm.profile={llm}", f"out_dir={out}",
                 f"progress={'true' if progress else 'false'}"] + \
        [f"{k}={v}" for k, v in sizes.items()]
    cfg = load("decision_gym", overrides)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for name in ("shadow", "fit", "run", "compare"):
        COMMANDS[name](cfg, overwrite=overwrite, resume=resume)
    report = json.loads((out / "report.json").read_text())
    report["wall_s"] = time.perf_counter() - t0
    return report


def _row(report: dict, arm: str) -> dict:
    return report["summary"]["arms"].get(arm, {})


def summary_md(reports: dict, sizes: dict) -> str:
    lines = ["# Harness on DECISION GYM: summary", "",
             f"Sizes: base {sizes}; shift and hard half the test and Stage 2 tasks. Decision model: oracle_noisy (accuracy 0.9). Success = task "
             "success on the same test tasks; saving = 1 - cost / cost of the LLM alone; "
             "Stage 1 'pass' = non-inferior (3-point margin, Tango) and cheaper (paired t), "
             "Holm over the 11 registered candidates.", "",
             "| setting | LLM alone | tool cascade (fitted τ) | no threshold | fixed 0.5 | "
             "DM shortlist (ASSIST) | BM25 shortlist | reflect TRIGGER | random trigger | "
             "Stage 1 passed | Stage 2 |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def cell(rep, arm):
        a, ref = _row(rep, arm), _row(rep, "llm_alone")
        if not a:
            return "-"
        saving = 1 - a["cost"] / ref["cost"] if ref.get("cost") else 0.0
        return f"{a['success']:.3f} ({saving:+.0%})"

    for key, rep in reports.items():
        ref = _row(rep, "llm_alone")
        passed = [r["name"] for r in rep.get("stage1", []) if r["passed"]]
        s2 = rep.get("stage2")
        s2txt = "none selected" if not s2 else (
            f"{s2[0]['success_ref']:.3f} → {s2[0]['success']:.3f}, saving "
            f"{s2[0]['saving']:+.1%}, p={s2[0]['p_holm']:.3g} "
            f"({'passed' if s2[0]['passed'] else 'failed'})")
        th = json.loads((Path(rep["out"]) / "thresholds.json").read_text()).get("tool", {})
        tau = th.get("threshold")
        lines.append(
            f"| {key} | {ref['success']:.3f} (${ref['cost']:.4f}) | "
            f"{cell(rep, 'tool_cascade_fitted')} τ={'LLM' if tau is None else f'{tau:.2f}'} | "
            f"{cell(rep, 'tool_replace_no_threshold')} | {cell(rep, 'tool_cascade_fixed_0.5')} | "
            f"{cell(rep, 'tool_assist_dm')} | {cell(rep, 'tool_assist_bm25')} | "
            f"{cell(rep, 'reflect_trigger')} | {cell(rep, 'reflect_random_trigger')} | "
            f"{', '.join(passed) or 'none'} | {s2txt} |")
    return "\n".join(lines) + "\n"


def smollm2_shadow(n: int, out_root: Path, progress: bool, overwrite: bool = False) -> None:
    out = out_root / "base_strong_smollm2"
    cfg = load("decision_gym", [
        "dm={kind: local_readout, path: smollm2}", f"shadow_tasks={n}", f"out_dir={out}",
        f"progress={'true' if progress else 'false'}",
        "agent={memory: false, reflection: false, cheap_tier: false, read_back: false}",
        "fit.points=[tool, params, stop]", "fit.min_support=2"])
    out.mkdir(parents=True, exist_ok=True)
    cmd_shadow(cfg, overwrite=overwrite)
    cmd_fit(cfg, overwrite=overwrite)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (~2 min)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--llms", default=",".join(LLMS))
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "harness"))
    ap.add_argument("--smollm2", type=int, default=0, metavar="N",
                    help="also shadow SmolLM2-135M on N base fit tasks")
    ap.add_argument("--only-smollm2", action="store_true", help="skip the oracle_noisy settings")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--overwrite", action="store_true",
                    help="run the settings again where --out already holds their results")
    ap.add_argument("--resume", action="store_true",
                    help="continue interrupted settings (finished commands and episodes kept)")
    args = ap.parse_args(argv)
    if args.only_smollm2:
        smollm2_shadow(args.smollm2 or 5, Path(args.out), not args.no_progress, args.overwrite)
        return 0
    sizes = (dict(shadow_tasks=30, test_tasks=20, stage2_tasks=20) if args.quick else
             dict(shadow_tasks=150, test_tasks=200, stage2_tasks=200))
    # Shift and Hard at half the test size (2 CPU cores); base carries the main tests.
    secondary = dict(sizes, test_tasks=sizes["test_tasks"] // 2,
                     stage2_tasks=sizes["stage2_tasks"] // 2)
    out_root = Path(args.out)
    reports = {}
    for variant in args.variants.split(","):
        for llm in args.llms.split(","):
            rep = run_setting(variant, llm, sizes if variant == "base" else secondary,
                              out_root, not args.no_progress, args.overwrite, args.resume)
            rep["sizes"] = sizes if variant == "base" else secondary
            rep["out"] = str(out_root / f"{variant}_{llm}")
            reports[f"{variant}/{llm}"] = rep
            print(f"== {variant}/{llm} done in {rep['wall_s']:.0f} s", flush=True)
    text = summary_md(reports, sizes)
    write_atomic(out_root / "summary.md", text)
    print(text)
    if args.smollm2:
        smollm2_shadow(args.smollm2, out_root, not args.no_progress, args.overwrite)
    return 0



if __name__ == "__main__":
    try:
        sys.exit(main())
    except HarnessError as e:
        print(f"harness_decision_gym: error: {e}", file=sys.stderr)
        sys.exit(2)
