"""A trained judge: SmolLM2-135M as a Hindsight + Progress judge, before vs after packed SFT.

1. Trajectories: the native ALFWorld engine's noisy expert on *training* floor plans (split
   "train") and five of the six task types; the sixth (``--held-out-type``, default cool) is
   never trained on.
2. Labels (``jaxdm.train.judge_data.judge_lines``): every action judged under Hindsight +
   Progress; an engine milestone -> "yes", a no-op -> "no"; the other actions get the
   0.5 target ``["yes", "no"]`` (``--other either``, the default: the judge learns that a
   no-op ranks below every state-changing action) or are left out (``--other skip``, the
   v3 judge's recipe); counted in data.json. ``--class-weights balanced`` weighs each label
   kind's questions by n / (3 n_kind) in the loss (no-ops are ~1 in 9 labels; the v5 recipe),
   ``none`` (the default, v3 / v4) leaves every weight 1.
3. ``jaxdm train-dm`` (readout mode: the Yes/No label logits the judge reads; LoRA on every
   projection, per-layer remat, orbax checkpoints every few steps, so a rerun resumes). The
   adapter folder it exports (``train/adapter``) is what ``jaxdm screen --judge`` loads.
4. Evaluation on held-out trajectories: *unseen* floor plans (split "valid_unseen"), all six
   task types (so the held-out type too), judges: SmolLM2 untrained, trained, Oracle; the
   Progress question under Prefix and Hindsight, with ``jaxdm screen``'s scoring job and
   metrics (``--stage screen``: the whole screen job, Value passes too, twice the time).
   Writes ``before_after.md`` / ``.json`` (milestone - no-op gap, Recall@R, miss rates).

Every stage skips what is already done in ``--out``; a killed run resumes.

    nice -n 10 python experiments/train_judge.py --out runs/train_judge       # CPU budget run
    python experiments/train_judge.py --out /tmp/tj --quick                    # smoke run
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from jaxdm.jsonl import write_atomic, write_json
from jaxdm.train.judge_data import OTHER_LABELS

HELD_OUT_TYPE = "pick_cool_then_place_in_recep"
ROWS = (("progress", "hindsight"), ("progress", "prefix"))


def write_data(out: Path, args) -> dict:
    from jaxdm.envs.alfworld import noisy_expert_trajectories
    from jaxdm.envs.alfworld.world import TASK_TYPES
    from jaxdm.train.data import write_states
    from jaxdm.train.judge_data import judge_lines
    from jaxdm.trajectory import write_jsonl
    done = out / "data.json"
    if done.is_file():
        info = json.loads(done.read_text())
        made = {"other": info.get("other", "skip"), "train_trajectories":
                info["train_trajectories"], "test_trajectories": info["test_trajectories"],
                "class_weights": info.get("class_weights", "none")}
        asked = {"other": args.other, "train_trajectories": args.train_trajectories,
                 "test_trajectories": args.test_trajectories,
                 "class_weights": args.class_weights}
        if made != asked:
            raise SystemExit(f"{out}: its data was made with {made}, this run asks {asked}; "
                             "use another --out")
        return info
    train_types = [t for t in TASK_TYPES if t != args.held_out_type]
    train = noisy_expert_trajectories(args.train_trajectories, seed=args.seed,
                                      task_types=train_types, budget=args.budget, split="train")
    test = noisy_expert_trajectories(args.test_trajectories, seed=args.seed + 1,
                                     budget=args.test_budget, split="valid_unseen")
    write_jsonl(out / "train_trajectories.jsonl", train)
    write_jsonl(out / "test_trajectories.jsonl", test)
    lines, stats = judge_lines(train, question="progress", context="hindsight",
                               other=args.other, class_weights=None
                               if args.class_weights == "none" else args.class_weights)
    write_states(out / "judge_train.jsonl", lines)
    info = {"train_trajectories": len(train), "train_types": train_types,
            "held_out_type": args.held_out_type, "test_trajectories": len(test),
            "test_split": "valid_unseen", "budget": args.budget,
            "test_budget": args.test_budget, "labels": stats, "other": args.other,
            "class_weights": args.class_weights, "lines": len(lines)}
    write_json(done, info, indent=2)
    return info


def train(out: Path, args) -> dict:
    from jaxdm.train.sft import TrainDMConfig
    from jaxdm.train.sft import train as run_train
    cfg = TrainDMConfig(data=str(out / "judge_train.jsonl"), model="smollm2",
                        out_dir=str(out / "train"), mode="readout", epochs=args.epochs,
                        lr=args.lr, lora_rank=args.rank, lora_alpha=float(args.rank),
                        save_every=args.save_every, max_steps=args.max_steps, seed=args.seed,
                        adapter_dtype="float16", q_bucket=4, min_trunk=args.min_trunk,
                        progress=not args.no_progress)
    t0 = time.perf_counter()
    summary = run_train(cfg)
    summary["wall_s_this_process"] = round(time.perf_counter() - t0, 1)
    return summary


def screen(out: Path, adapter: Path, args) -> dict:
    from jaxdm.screen.run import ScreenConfig, run
    cfg = ScreenConfig(trajectories=str(out / "test_trajectories.jsonl"),
                       judges=("smollm2", str(adapter), "oracle"), expansions=(),
                       out_dir=str(out / "screen"), progress=not args.no_progress)
    resume = (out / "screen" / "screen.json").is_file()
    return run(cfg, resume=resume)


def evaluate(out: Path, adapter: Path, args) -> dict:
    """Progress under Prefix and Hindsight only (the judge's trained question; the screen's
    Value passes cost as much again on this CPU): the screen's scoring job
    (``jaxdm.roles.jobs.score_trajectories``) and metrics (``jaxdm.screen.metrics``), the
    judges built by the screen's ``build_judges``. Passes are cached in ``out/eval`` (resume);
    passes an earlier ``jaxdm screen`` run wrote to ``out/screen/scores.jsonl`` are reused."""
    import numpy as np

    from jaxdm.roles.jobs import score_trajectories
    from jaxdm.jsonl import read_records
    from jaxdm.screen import metrics
    from jaxdm.screen.run import build_judges
    from jaxdm.trajectory import read_jsonl
    trajs = read_jsonl(out / "test_trajectories.jsonl")
    cache = out / "eval"
    cache.mkdir(exist_ok=True)
    screened: dict = {}
    if (out / "screen" / "scores.jsonl").is_file():
        for _, r in read_records(out / "screen" / "scores.jsonl"):
            screened.setdefault((r["judge"], r["question"], r["context"]), {}).setdefault(
                r["traj"], {})[r["t"]] = r["score"]
    specs = {"smollm2-135m": "smollm2", "trained": str(adapter), "oracle": "oracle"}
    summary: dict = {}
    built: dict = {}
    for name, spec in specs.items():
        for q, c in ROWS:
            f = cache / f"{name}_{q}_{c}.json"
            if f.is_file():
                per = [np.asarray(x, float) for x in json.loads(f.read_text())]
            elif (name, q, c) in screened and len(screened[(name, q, c)]) == len(trajs):
                got = screened[(name, q, c)]
                per = [np.asarray([got[i].get(t, np.nan) for t in range(len(tr.steps))], float)
                       for i, tr in enumerate(trajs)]
            else:
                if name not in built:
                    [(_, built[name])] = build_judges([spec])
                print(f"scoring {name} {q}/{c} ...", file=sys.stderr, flush=True)
                res = score_trajectories(built[name], trajs, question=q, context=c)
                per = res.per_trajectory()
            write_json(f, [[None if not np.isfinite(v) else float(v) for v in x]
                                     for x in per])
            per = [np.asarray([np.nan if v is None else v for v in x], float) for x in per]
            types = [tr.action_types for tr in trajs]
            by_type: dict = {}
            for i, tr in enumerate(trajs):
                by_type.setdefault(tr.task_type or "unknown", []).append(i)
            summary.setdefault(name, {})[f"{q}/{c}"] = {
                "overall": metrics.summarize(per, types),
                "by_task_type": {k: metrics.summarize([per[i] for i in v], [types[i] for i in v])
                                 for k, v in sorted(by_type.items())}}
    return {"summary": summary}


def table(result: dict, trained: str, held_out: str) -> tuple[str, list[dict]]:
    from jaxdm.screen.run import task_group  # noqa: F401  (types are the screen's labels)
    short = {"pick_cool_then_place_in_recep": "cool", "pick_clean_then_place_in_recep": "clean",
             "pick_heat_then_place_in_recep": "heat", "pick_and_place_simple": "pick",
             "look_at_obj_in_light": "look", "pick_two_obj_and_place": "pick two"}
    ho = short.get(held_out, held_out)
    rows = []
    names = {"smollm2-135m": "SmolLM2-135M (untrained)", trained: "SmolLM2-135M trained judge",
             "oracle": "Oracle"}
    for judge, label in names.items():
        block = result["summary"].get(judge, {})
        for q, c in ROWS:
            m = block.get(f"{q}/{c}")
            if not m:
                continue
            o = m["overall"]
            h = m["by_task_type"].get(ho, {})
            rows.append({"judge": label, "question": q, "context": c,
                         "milestone": o["mean_milestone"], "other": o["mean_other"],
                         "no_op": o["mean_no_op"], "gap": o["gap"],
                         "recall_at_r": o["recall_at_r"], "milestone_miss": o["milestone_miss"],
                         "noop_miss": o["noop_miss"], "gap_held_out_type": h.get("gap"),
                         "recall_held_out_type": h.get("recall_at_r")})

    def f(x):
        return "-" if x is None else f"{x:.3f}"
    md = ["| judge | context | milestone | other | no-op | gap | Recall@R | milestone miss | "
          f"no-op miss | gap ({ho}, held out) | Recall@R ({ho}) |", "|" + "---|" * 11]
    for r in rows:
        md.append(f"| {r['judge']} | {r['context']} | {f(r['milestone'])} | {f(r['other'])} | "
                  f"{f(r['no_op'])} | {f(r['gap'])} | {f(r['recall_at_r'])} | "
                  f"{f(r['milestone_miss'])} | {f(r['noop_miss'])} | "
                  f"{f(r['gap_held_out_type'])} | {f(r['recall_held_out_type'])} |")
    return "\n".join(md), rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-trajectories", type=int, default=60)
    ap.add_argument("--test-trajectories", type=int, default=12)
    ap.add_argument("--budget", type=int, default=14, help="action budget of training "
                    "trajectories (shorter contexts: cheaper steps on CPU)")
    ap.add_argument("--test-budget", type=int, default=20, help="as the demo")
    ap.add_argument("--held-out-type", default=HELD_OUT_TYPE)
    ap.add_argument("--other", choices=OTHER_LABELS, default="either",
                    help="labels of actions that are neither milestone nor no-op: either "
                         "(a 0.5 target) or skip (left out of training)")
    ap.add_argument("--class-weights", choices=("none", "balanced"), default="none",
                    help="loss weight per label kind (balanced: n / (kinds * n_kind))")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--min-trunk", type=int, default=640)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage", choices=("data", "train", "screen", "all"), default="all",
                    help="all: data, train, then the Progress evaluation; screen: the whole "
                         "jaxdm screen job (Value passes too) instead")
    ap.add_argument("--adapter-to", help="copy the trained adapter folder here at the end")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.train_trajectories, args.test_trajectories = 2, 2
        args.budget = args.test_budget = 8
        args.max_steps, args.min_trunk = 2, 64
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").is_file() \
        else {}
    t = time.perf_counter()
    data = write_data(out, args)
    print(json.dumps(data), file=sys.stderr)
    if args.stage == "data":
        return data
    t = time.perf_counter()
    summary = train(out, args)
    timing["train_s"] = timing.get("train_s", 0.0) + summary["seconds"]
    write_json(out / "timing.json", timing, indent=2)
    adapter = Path(summary["adapter"])
    if args.adapter_to:
        dest = Path(args.adapter_to)
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("adapter.json", "adapter.safetensors"):
            shutil.copy2(adapter / f, dest / f)
    if args.stage == "train":
        return summary
    t = time.perf_counter()
    if args.stage == "screen":
        result = screen(out, adapter, args)
        trained_name = adapter.resolve().name
    else:
        result = evaluate(out, adapter, args)
        trained_name = "trained"
    timing[f"{args.stage}_s"] = round(time.perf_counter() - t, 1)
    md, rows = table(result, trained_name, args.held_out_type)
    report = {"data": data, "train": {k: summary[k] for k in (
        "steps_done", "steps_total", "questions", "states", "lora", "adapter_bytes")},
        "timing": timing, "rows": rows}
    write_json(out / "before_after.json", report, indent=2)
    write_atomic(out / "before_after.md", md + "\n")
    write_json(out / "timing.json", timing, indent=2)
    print(md)
    return report


if __name__ == "__main__":
    main()
