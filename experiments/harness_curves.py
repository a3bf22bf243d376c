"""Cost-quality curves per decision point (issue 40 §1): task success against the share of a
point's decisions delegated to the decision model, for the TRAINED model, a noisy oracle and
a random router, with APGR (the average performance-gap recovered, RouteLLM's summary).

Each curve is a CASCADE sweep on one point (the model answers every decision there; at
threshold τ its answer is taken when its confidence is ≥ τ, else the agent LLM decides), all
arms on the same test tasks through ``jaxdm harness run``, from
``experiments/configs/harness_trained_dm.yaml`` (the trained model, the weak-on-stop/params
simulated LLM). The decision models:

- ``trained``: the SFT'd SmolLM2 folder (``--model``);
- ``noisy_oracle``: ``oracle_noisy`` at accuracy 0.9 with informative confidence (the
  harness results' reference decision model);
- ``random``: the trained model's answers with a uniformly random confidence
  (``random_confidence``): its delegated share is set by τ alone, RouteLLM's random router.

APGR: with x the share of the point's decisions kept at the LLM (the "strong" side), PGR(x) =
(success(x) − success(x = 0)) / (success(x = 1) − success(x = 0)), x = 0 the model deciding
every one (τ = 0), x = 1 the LLM alone; APGR is the area under PGR over x in [0, 1]
(trapezoids over the measured points). A random router's APGR is about 0.5; a router that
keeps the model's wrong answers at the LLM scores above it. Undefined (None) where the two
ends have the same success. Outputs in ``--out``: ``curves.json``, ``curves.md``,
``curves.png`` and the harness folder (``summary.json``, ``runs/``; resumable).

    python experiments/harness_curves.py --model runs/dm_gym/run/model --out runs/curves
    python experiments/harness_curves.py --quick --model tests-tiny-folder --out /tmp/c
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxdm.harness.arms import cmd_run  # noqa: E402
from jaxdm.harness.config import ArmConfig, DelegationConfig, load  # noqa: E402
from jaxdm.jsonl import write_atomic, write_json  # noqa: E402

CONFIG = ROOT / "experiments" / "configs" / "harness_trained_dm.yaml"
NOISY_ORACLE = {"kind": "oracle_noisy", "default_accuracy": 0.9, "seed": 1}


def decision_models(model: str | dict, point: str) -> dict[str, dict]:
    """name -> decision-model spec of the three curves at ``point`` (``model``: the trained
    model's folder, or a whole spec for tests)."""
    trained = model if isinstance(model, dict) else {
        "kind": "local_likelihood", "path": model, "name": "smollm2-sft"}
    trained = {"kind": "points_only", "points": [point], "dm": trained}
    return {"trained": trained, "noisy_oracle": NOISY_ORACLE,
            "random": {"kind": "random_confidence", "dm": trained, "seed": 0}}


def arms(model, points, thresholds) -> tuple[ArmConfig, ...]:
    """One CASCADE arm per (point, decision model, threshold)."""
    return tuple(
        ArmConfig(f"{p}_{name}_{th:g}", (DelegationConfig(p, "cascade", th),), dm=spec)
        for p in points for name, spec in decision_models(model, p).items()
        for th in thresholds)


def apgr(points: list[tuple[float, float]]) -> float | None:
    """Area under PGR over x (share kept at the LLM) from (x, success) points that include
    x = 0 and x = 1; None when success(0) == success(1)."""
    pts = sorted(points)
    lo = [s for x, s in pts if x == 0.0]
    hi = [s for x, s in pts if x == 1.0]
    if not lo or not hi or hi[-1] == lo[0]:
        return None
    pgr = [(x, (s - lo[0]) / (hi[-1] - lo[0])) for x, s in pts]
    return float(sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pgr, pgr[1:])))


def curves(summary: dict, points, thresholds) -> dict:
    """Per point and decision model: the (share delegated, success, cost, τ) points, the LLM
    alone's success, and APGR."""
    arms_ = summary["arms"]
    ref = arms_["llm_alone"]
    out: dict = {}
    for p in points:
        out[p] = {}
        for name in ("trained", "noisy_oracle", "random"):
            pts = []
            for th in thresholds:
                a = arms_[f"{p}_{name}_{th:g}"]
                c = a["points"].get(p, {"n": 0, "dm": 0})
                share = c["dm"] / c["n"] if c["n"] else 0.0
                pts.append({"threshold": th, "delegated": share, "success": a["success"],
                            "cost": a["cost"], "decisions": c["n"]})
            xs = [(1.0 - q["delegated"], q["success"]) for q in pts]
            # τ = 0 delegates every decision: that run is x = 0 exactly; the LLM alone is x = 1
            xs = [(0.0 if q["threshold"] == 0.0 else x, s) for q, (x, s) in zip(pts, xs)]
            xs.append((1.0, ref["success"]))
            out[p][name] = {"points": pts, "apgr": apgr(xs)}
        out[p]["llm_alone"] = {"success": ref["success"], "cost": ref["cost"]}
    return out


def figure(data: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(5.2 * len(data), 4.2), squeeze=False)
    for ax, (p, d) in zip(axes[0], data.items()):
        for name, style in (("trained", "o-"), ("noisy_oracle", "s--"), ("random", "^:")):
            pts = sorted(d[name]["points"], key=lambda q: q["delegated"])
            a = d[name]["apgr"]
            ax.plot([0.0] + [q["delegated"] for q in pts],
                    [d["llm_alone"]["success"]] + [q["success"] for q in pts], style,
                    label=f"{name} (APGR {'n/a' if a is None else f'{a:.2f}'})")
        ax.set_xlabel(f"share of {p} decisions delegated to the decision model")
        ax.set_ylabel("task success")
        ax.set_title(f"CASCADE on {p}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(data: dict) -> str:
    lines = ["| point | decision model | APGR | τ: delegated share → success |", "|---|---|---|---|"]
    for p, d in data.items():
        for name in ("trained", "noisy_oracle", "random"):
            a = d[name]["apgr"]
            pts = ", ".join(f"{q['threshold']:g}: {q['delegated']:.2f} → {q['success']:.3f}"
                            for q in d[name]["points"])
            lines.append(f"| {p} | {name} | {'n/a' if a is None else f'{a:.2f}'} | {pts} |")
        lines.append(f"| {p} | LLM alone | - | {d['llm_alone']['success']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the trained decision model's HF folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", default="stop,params")
    ap.add_argument("--thresholds", default="0,0.6,0.8,0.9,0.97")
    ap.add_argument("--test-tasks", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="2 tasks, 2 thresholds, stop only")
    ap.add_argument("--set", action="append", default=[], help="a HarnessConfig override")
    args = ap.parse_args(argv)
    points = ("stop",) if args.quick else tuple(args.points.split(","))
    ths = (0.0, 0.9) if args.quick else tuple(float(t) for t in args.thresholds.split(","))
    if 0.0 not in ths:
        raise SystemExit("--thresholds must include 0 (the model deciding every decision)")
    out = Path(args.out)
    model = json.loads(args.model) if args.model.startswith("{") else args.model
    where = [] if isinstance(model, dict) else [f"dm.dm.path={model}"]  # the config's own dm
    cfg = load(str(CONFIG), [f"out_dir={out}", f"test_tasks={2 if args.quick else args.test_tasks}",
                             "frontier_thresholds=[]", "progress=false", *where, *args.set])
    cfg = dataclasses.replace(cfg, arms=arms(model, points, ths))
    out.mkdir(parents=True, exist_ok=True)
    cmd_run(cfg, resume=True)
    summary = json.loads((out / "summary.json").read_text())
    data = curves(summary, points, ths)
    write_json(out / "curves.json", data, indent=2)
    write_atomic(out / "curves.md", markdown(data))
    figure(data, out / "curves.png")
    print(markdown(data))
    return data


if __name__ == "__main__":
    main()
