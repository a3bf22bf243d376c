"""Does a trained judge read the trajectory, or match surface cues? (issue 40 §2)

Two held-out test sets, both on *unseen* floor plans (split "valid_unseen"), all six task
types:

- ``standard``: the noisy expert's trajectories the judge run evaluated on
  (``--run``/test_trajectories.jsonl, from ``experiments/train_judge.py``);
- ``cue-controlled``: the noisy expert under ``CUE_CONTROLLED``
  (``jaxdm.envs.alfworld.experts``): no no-op says "Nothing happens." (every no-op is a repeated
  look / examine / inventory with ordinary feedback, beside first looks that are no no-ops),
  decoy takes and puts of objects the task does not need (a milestone's verbs, no progress),
  and on Clean / Heat / Cool tasks a put before the state change whose exact command, repeated
  after it, is the place milestone.

Judges: the given SmolLM2 judges (adapter folders or names ``jaxdm screen`` knows), the Oracle,
the three-rule keyword judge and a bag-of-words logistic regression fitted on the judge run's
own training trajectories and labels (``jaxdm.screen.baselines``). The Progress question under
Hindsight (the judges' trained request), the screen's scoring job and metrics, and
trajectory-bootstrap 95 % intervals. Writes ``cues.md`` / ``cues.json`` and ``cues.png``;
every judge x set's scores are cached in ``--out/scores`` (a rerun resumes).

    python experiments/judge_cues.py --run runs/train_judge_v4 --out runs/judge_cues \\
        --judge trained=runs/train_judge_v4/train/adapter --judge v3=smollm2-judge
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jaxdm.jsonl import write_atomic, write_json

METRICS = ("gap", "recall_at_r", "noop_miss", "milestone_miss")
QUESTION, CONTEXT = "progress", "hindsight"


def cue_set(out: Path, args):
    from jaxdm.envs.alfworld import noisy_expert_trajectories
    from jaxdm.envs.alfworld.experts import CUE_CONTROLLED
    from jaxdm.trajectory import read_jsonl, write_jsonl
    path = out / "cue_trajectories.jsonl"
    if not path.is_file():
        trajs = noisy_expert_trajectories(args.n_cue, seed=args.seed, budget=args.budget,
                                          split="valid_unseen", config=CUE_CONTROLLED)
        write_jsonl(path, trajs)
    return read_jsonl(path)


def cue_counts(trajs) -> dict:
    """What the cue-controlled set holds that misleads a surface rule."""
    out = {"actions": 0, "milestone": 0, "no_op": 0, "other": 0, "no_op_nothing_happens": 0,
           "decoy_takes": 0, "repeated_command_milestones": 0}
    for tr in trajs:
        seen = set()
        for t, (step, kind) in enumerate(zip(tr.steps, tr.action_types)):
            out["actions"] += 1
            out[kind] += 1
            out["no_op_nothing_happens"] += kind == "no_op" and tr.feedback(t).startswith(
                "Nothing happens")
            out["decoy_takes"] += kind == "other" and step.action.startswith("take ")
            out["repeated_command_milestones"] += kind == "milestone" and step.action in seen
            seen.add(step.action)
    return out


def scores_of(out: Path, name: str, spec, set_name: str, trajs, built: dict) -> list:
    """Per-trajectory scores (cached as JSON; NaN where a score failed)."""
    from jaxdm.roles.jobs import score_trajectories
    from jaxdm.screen.run import build_judges
    f = out / "scores" / f"{name}_{set_name}.json"
    if f.is_file():
        return [np.asarray([np.nan if v is None else v for v in x], float)
                for x in json.loads(f.read_text())]
    if callable(spec):
        per = [np.asarray(spec(tr), float) for tr in trajs]
    else:
        if name not in built:
            [(_, built[name])] = build_judges([spec])
        print(f"scoring {name} on {set_name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        per = score_trajectories(built[name], trajs, question=QUESTION,
                                 context=CONTEXT).per_trajectory()
        print(f"  {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    f.parent.mkdir(parents=True, exist_ok=True)
    write_json(f, [[None if not np.isfinite(v) else float(v) for v in x] for x in per])
    return per


def figure(path: Path, rows: list[dict], sets: list[str], judges: list[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    width = 0.8 / len(judges)
    for ax, key, title in zip(axes, ("gap", "noop_miss", "recall_at_r"),
                              ("milestone - no-op gap (higher is better)",
                               "no-op miss (lower is better)", "Recall@R (higher is better)")):
        for j, judge in enumerate(judges):
            xs, ys, lo, hi = [], [], [], []
            for s, set_name in enumerate(sets):
                r = next(r for r in rows if r["judge"] == judge and r["set"] == set_name)
                xs.append(s + (j - (len(judges) - 1) / 2) * width)
                ys.append(r[key])
                lo.append(r[key] - r["ci"][key][0])
                hi.append(r["ci"][key][1] - r[key])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=judge)
        ax.set_xticks(range(len(sets)), sets)
        ax.set_title(title, fontsize=9)
        ax.axhline(0, color="k", lw=0.5)
    axes[0].legend(fontsize=7)
    fig.suptitle("Progress / Hindsight on unseen floor plans; bars: trajectory-bootstrap 95 % "
                 "intervals", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    from jaxdm.rundir import lock_run_dir, prepare_out_dir
    from jaxdm.screen import metrics
    from jaxdm.screen.baselines import BagOfWordsJudge, keyword_scores
    from jaxdm.trajectory import read_jsonl
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="an experiments/train_judge.py run folder "
                    "(its train_trajectories.jsonl and test_trajectories.jsonl)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--judge", action="append", default=[], metavar="NAME=SPEC",
                    help="a SmolLM2 judge: an adapter folder or a judge name (repeatable)")
    ap.add_argument("--n-cue", type=int, default=24)
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args(argv)
    run = Path(args.run)
    for f in ("train_trajectories.jsonl", "test_trajectories.jsonl"):
        if not (run / f).is_file():
            raise SystemExit(f"--run {run}: {f} is missing (run experiments/train_judge.py)")
    judges: dict = {}
    for item in args.judge:
        name, sep, spec = item.partition("=")
        if not sep or not name or not spec:
            raise SystemExit(f"--judge wants NAME=SPEC, got {item!r}")
        if name in judges:
            raise SystemExit(f"--judge: two judges named {name!r}")
        judges[name] = spec
    out = prepare_out_dir(args.out)
    lock = lock_run_dir(out)
    t0 = time.perf_counter()
    bow = BagOfWordsJudge(other="either").fit(read_jsonl(run / "train_trajectories.jsonl"))
    judges |= {"oracle": "oracle", "keyword rule": keyword_scores, "bag-of-words LR": bow.scores}
    sets = {"standard": read_jsonl(run / "test_trajectories.jsonl"),
            "cue-controlled": cue_set(out, args)}
    built: dict = {}
    rows = []
    for set_name, trajs in sets.items():
        types = [tr.action_types for tr in trajs]
        for name, spec in judges.items():
            per = scores_of(out, name.replace(" ", "_"), spec, set_name, trajs, built)
            if any(np.isnan(x).any() for x in per):
                raise SystemExit(f"{name} on {set_name}: failed scores; rerun to retry them")
            s = metrics.summarize(per, types)
            ci = metrics.bootstrap_intervals(per, types, METRICS, n_resamples=args.resamples)
            rows.append({"judge": name, "set": set_name, **{k: s[k] for k in METRICS},
                         "mean_milestone": s["mean_milestone"], "mean_other": s["mean_other"],
                         "mean_no_op": s["mean_no_op"], "n_traj": s["n_traj"],
                         "n_gap": s["n_gap"], "ci": ci})

    def f(r, k):
        return f"{r[k]:.3f} ({r['ci'][k][0]:.2f}-{r['ci'][k][1]:.2f})"
    md = ["| set | judge | milestone | other | no-op | gap | Recall@R | no-op miss | "
          "milestone miss |", "|" + "---|" * 9]
    for r in rows:
        md.append(f"| {r['set']} | {r['judge']} | {r['mean_milestone']:.3f} | "
                  f"{r['mean_other']:.3f} | {r['mean_no_op']:.3f} | {f(r, 'gap')} | "
                  f"{f(r, 'recall_at_r')} | {f(r, 'noop_miss')} | {f(r, 'milestone_miss')} |")
    report = {"run": str(run), "judges": {k: (v if isinstance(v, str) else k)
                                          for k, v in judges.items()},
              "sets": {k: {"trajectories": len(v), **cue_counts(v)} for k, v in sets.items()},
              "question": QUESTION, "context": CONTEXT, "rows": rows,
              "bootstrap": {"resamples": args.resamples, "level": 0.95, "unit": "trajectory"},
              "seconds": round(time.perf_counter() - t0, 1)}
    write_json(out / "cues.json", report, indent=2)
    write_atomic(out / "cues.md", "\n".join(md) + "\n")
    figure(out / "cues.png", rows, list(sets), list(judges))
    lock.release()
    print("\n".join(md))
    return report


if __name__ == "__main__":
    main()
