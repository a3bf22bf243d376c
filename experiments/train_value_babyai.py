"""A learned LVRL value model (issue 40 §3, seed 001 §4.2): SmolLM2-135M trained by packed SFT
on BabyAI text states labelled by the Oracle, evaluated on held-out tasks.

1. **Data**: noisy-solver rollout groups (``lvrl_smollm2_values.record_groups``: rollout k
   follows the BFS solver with probability q_k) on *train*-split tasks; every interior state's
   value question is the trainer's own (``values_signal``: deterministic group summaries, the
   target rollout left out of its context), labelled with the Oracle's V = clip(1 - n/L, 0, 1)
   (``jaxdm.train.value_data``: a graded Yes/No target per state, one packed line per rollout).
   The evaluation groups come from the *id_test* split: other tasks (other seeds and layouts).
2. **Training**: ``jaxdm train-dm``'s library function (readout mode: the Yes/No label logits
   the value model reads; LoRA on every projection, per-layer remat, checkpoints: a rerun
   resumes).
3. **Evaluation** on the held-out groups: untrained SmolLM2, the trained adapter and the Oracle
   through the same ``values_signal`` path; within-trajectory Pearson r with the Oracle (mean
   over rollouts), pooled Pearson / Spearman r, and the sign agreement of the anchored step
   advantages A_t = V(s_{t+1}) - V(s_t) over the interior differences (what LVRL trains on).
   Goals (issue 40): within-trajectory r >= 0.6, sign agreement >= 75 %.

Writes ``--out``: ``data.json``, ``value_train.jsonl``, ``test_trajectories.jsonl``,
``train/`` (train-dm's folder: metrics, curves, adapter), ``eval/*.json`` (values per model),
``results.json`` / ``results.md`` and ``value_curves.png``. Every stage skips what is done.

    nice -n 10 python experiments/train_value_babyai.py --out runs/value_babyai
    python experiments/train_value_babyai.py --out /tmp/vb --quick
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))
from jaxdm.jsonl import write_atomic, write_json  # noqa: E402

SIGNAL_KEYS = ("budget", "summary_steps")


def signal_opts(args) -> dict:
    return dict(num_steps=args.budget, max_steps_per_rollout=args.summary_steps)


def record(args, split: str, groups: int, seed: int):
    from experiments.lvrl_smollm2_values import record_groups
    qs = [float(x) for x in args.q.split(",")]
    return record_groups(groups, args.rollouts, args.budget, args.room_size, qs, seed,
                         args.max_plan, split=split)


def write_data(out: Path, args) -> dict:
    from jaxdm.rl.values import OracleValueModel, values_signal
    from jaxdm.train.data import write_states
    from jaxdm.train.value_data import ValueLabeller, value_lines
    from jaxdm.trajectory import write_jsonl
    done = out / "data.json"
    asked = {"train_groups": args.train_groups, "test_groups": args.test_groups,
             "rollouts": args.rollouts, "budget": args.budget, "room_size": args.room_size,
             "q": args.q, "max_plan": args.max_plan, "summary_steps": args.summary_steps,
             "seed": args.seed}
    if done.is_file():
        info = json.loads(done.read_text())
        if info["setup"] != asked:
            raise SystemExit(f"{out}: its data was made with {info['setup']}, this run asks "
                             f"{asked}; use another --out")
        return info
    t0 = time.perf_counter()
    train, train_g = record(args, "train", args.train_groups, args.seed)
    labeller = ValueLabeller(OracleValueModel())
    values_signal(train, train_g, labeller, **signal_opts(args))
    lines, stats = value_lines(labeller.asked)
    write_states(out / "value_train.jsonl", lines)
    test, test_g = record(args, "id_test", args.test_groups, args.seed + 1)
    write_jsonl(out / "test_trajectories.jsonl", test)
    write_json(out / "test_groups.json", [int(g) for g in test_g])
    info = {"setup": asked, "labels": stats, "train_rollouts": len(train),
            "train_successes": int(sum(t.success for t in train)),
            "test_rollouts": len(test), "test_successes": int(sum(t.success for t in test)),
            "train_tasks": sorted({t.metadata["key"] for t in train}),
            "test_tasks": sorted({t.metadata["key"] for t in test}),
            "seconds": round(time.perf_counter() - t0, 1)}
    write_json(done, info, indent=2)
    return info


def train(out: Path, args) -> dict:
    from jaxdm.train.sft import TrainDMConfig
    from jaxdm.train.sft import train as run_train
    cfg = TrainDMConfig(data=str(out / "value_train.jsonl"), model="smollm2",
                        out_dir=str(out / "train"), mode="readout", epochs=args.epochs,
                        lr=args.lr, lora_rank=args.rank, lora_alpha=float(args.rank),
                        save_every=args.save_every, max_steps=args.max_steps, seed=args.seed,
                        adapter_dtype="float16", q_bucket=8, min_trunk=args.min_trunk,
                        dtype=args.dtype, progress=not args.no_progress)
    return run_train(cfg)


def values_of(out: Path, name: str, spec: str | None, trajs, gids, args) -> dict:
    """The value signal of one model on the test groups (cached in eval/<name>.json)."""
    from jaxdm.rl.values import OracleValueModel, ReadoutValueModel, values_signal
    f = out / "eval" / f"{name}.json"
    if f.is_file():
        d = json.loads(f.read_text())
        return {"values": np.asarray(d["values"], float), "rows": np.asarray(d["rows"], bool),
                "seconds": d["seconds"]}
    t0 = time.perf_counter()
    if spec is None:
        model = OracleValueModel()
    else:
        from jaxdm.decision import make_backend
        model = ReadoutValueModel(make_backend({"kind": "local_readout", "path": spec}))
    print(f"values: {name} ...", file=sys.stderr, flush=True)
    sig = values_signal(trajs, gids, model, **signal_opts(args))
    d = {"values": np.asarray(sig.values, float).tolist(),
         "rows": np.asarray(sig.value_rows, bool).tolist(),
         "seconds": round(time.perf_counter() - t0, 1)}
    f.parent.mkdir(parents=True, exist_ok=True)
    write_json(f, d)
    return {"values": np.asarray(d["values"]), "rows": np.asarray(d["rows"]),
            "seconds": d["seconds"]}


def agreement(trajs, gids, model: dict, oracle: dict, budget: int) -> dict:
    """How a value model's values and step advantages agree with the Oracle's."""
    from scipy.stats import pearsonr, spearmanr

    from jaxdm.rl.advantages import lvrl_advantages
    lengths = np.array([len(t.steps) for t in trajs])
    ok = model["rows"] & oracle["rows"]
    inner = [(i, np.arange(1, n)) for i, n in enumerate(lengths) if ok[i] and n > 1]
    a = np.concatenate([model["values"][i, t] for i, t in inner])
    b = np.concatenate([oracle["values"][i, t] for i, t in inner])
    per = []
    for i, t in inner:
        x, y = model["values"][i, t], oracle["values"][i, t]
        if len(t) >= 3 and np.std(x) > 0 and np.std(y) > 0:
            per.append(float(pearsonr(x, y)[0]))
    mask = np.arange(budget)[None] < lengths[:, None]
    rewards = np.array([t.reward for t in trajs], np.float32)
    groups = int(np.max(gids)) + 1
    adv = [np.asarray(lvrl_advantages(s["values"].astype(np.float32), rewards, gids, mask,
                                      num_groups=groups, value_rows=ok))
           for s in (model, oracle)]
    interior = mask & ok[:, None] & (np.arange(budget)[None] >= 1) & \
        (np.arange(budget)[None] < (lengths - 1)[:, None])
    moving = interior & (adv[1] != 0)          # steps where the Oracle's value changes
    pooled = len(a) >= 3 and np.std(a) > 0 and np.std(b) > 0
    return {
        "states": int(len(a)), "rollouts": len(inner),
        "value_mean": float(a.mean()), "value_std": float(a.std()),
        "within_trajectory_pearson": float(np.mean(per)) if per else None,
        "within_trajectory_n": len(per),
        "pooled_pearson": float(pearsonr(a, b)[0]) if pooled else None,
        "pooled_spearman": float(spearmanr(a, b)[0]) if pooled else None,
        "sign_agreement_interior": float(np.mean(np.sign(adv[0][interior]) ==
                                                 np.sign(adv[1][interior])))
        if interior.any() else None,
        "sign_agreement_where_oracle_moves": float(np.mean(np.sign(adv[0][moving]) ==
                                                           np.sign(adv[1][moving])))
        if moving.any() else None,
        "interior_diffs": int(interior.sum()), "oracle_moving_diffs": int(moving.sum()),
        "seconds": model["seconds"]}


def plot(trajs, models: dict, path: Path, n: int = 8) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [i for i, t in enumerate(trajs) if len(t.steps) > 2][:n]
    if not rows:
        return
    cols = min(4, len(rows))
    nrow = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrow, cols, figsize=(3.3 * cols, 2.5 * nrow), squeeze=False)
    for ax, i in zip(axes.ravel(), rows):
        k = len(trajs[i].steps)
        for name, m in models.items():
            ax.plot(range(k + 1), m["values"][i, :k + 1], label=name)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{trajs[i].metadata.get('id')}: "
                     f"{'success' if trajs[i].success else 'failure'}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(rows):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=6)
    fig.suptitle("Held-out BabyAI tasks (id_test): value curves, anchored ends", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    from jaxdm.rundir import lock_run_dir, prepare_out_dir
    from jaxdm.trajectory import read_jsonl
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-groups", type=int, default=12)
    ap.add_argument("--test-groups", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--room-size", type=int, default=7)
    ap.add_argument("--max-plan", type=float, default=0.6)
    ap.add_argument("--q", default="0.9,0.7,0.5,0.3")
    ap.add_argument("--summary-steps", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--min-trunk", type=int, default=1024)
    ap.add_argument("--save-every", type=int, default=8)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the frozen weights' precision in training (bfloat16: mixed precision, "
                         "fp32 adapters and optimiser; ~1.6x faster on a CPU with AMX)")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.train_groups, args.test_groups, args.rollouts = 1, 1, 2
        args.budget, args.max_steps, args.min_trunk = 8, 2, 64
    out = prepare_out_dir(args.out)
    lock = lock_run_dir(out)
    data = write_data(out, args)
    print(json.dumps({k: v for k, v in data.items() if not k.endswith("_tasks")}),
          file=sys.stderr)
    summary = train(out, args)
    trajs = read_jsonl(out / "test_trajectories.jsonl")
    gids = np.asarray(json.loads((out / "test_groups.json").read_text()), np.int32)
    models = {"oracle": values_of(out, "oracle", None, trajs, gids, args),
              "smollm2 (untrained)": values_of(out, "untrained", "smollm2", trajs, gids, args),
              "smollm2 (trained)": values_of(out, "trained", summary["adapter"], trajs, gids,
                                             args)}
    rows = {name: agreement(trajs, gids, m, models["oracle"], args.budget)
            for name, m in models.items() if name != "oracle"}

    def f(x, pct=False):
        return "-" if x is None else (f"{100 * x:.0f} %" if pct else f"{x:.3f}")
    md = ["| value model | states | value mean (sd) | within-trajectory r | pooled r | "
          "Spearman | sign agreement (interior) | where the Oracle moves | s |",
          "|" + "---|" * 9]
    for name, r in rows.items():
        md.append(f"| {name} | {r['states']} | {r['value_mean']:.3f} ({r['value_std']:.3f}) | "
                  f"{f(r['within_trajectory_pearson'])} (n={r['within_trajectory_n']}) | "
                  f"{f(r['pooled_pearson'])} | {f(r['pooled_spearman'])} | "
                  f"{f(r['sign_agreement_interior'], True)} | "
                  f"{f(r['sign_agreement_where_oracle_moves'], True)} | {r['seconds']} |")
    result = {"data": {k: v for k, v in data.items()},
              "train": {k: summary.get(k) for k in ("steps_done", "steps_total", "questions",
                                                    "states", "lora", "seconds",
                                                    "adapter_bytes")},
              "rows": rows,
              "goals": {"within_trajectory_pearson": 0.6, "sign_agreement_interior": 0.75}}
    write_json(out / "results.json", result, indent=2)
    write_atomic(out / "results.md", "\n".join(md) + "\n")
    plot(trajs, models, out / "value_curves.png")
    lock.release()
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
