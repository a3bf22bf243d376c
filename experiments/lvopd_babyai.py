"""LVOPD on BabyAI (seed 001 §4.3, appendix E; CPU-sized), through the library trainer: LVRL
alone vs LVRL + LVOPD vs pure OPD vs trajectory-gated OPD on the LVRL experiment's setting,
distilling a from-scratch student from a strong privileged teacher.

Every run is one ``jaxdm.rl.trainer.Trainer`` on ``experiments/configs/lvopd_babyai_jax.yaml``
(= the LVRL experiment's ``lvrl_oracle`` run of ``lvrl_babyai.py``: JAX BabyAI six-room pickup,
rooms of 7, door distance 1-3, budget 64, the compass, an MLP student 2 x 128 on the symbolic
view, 8 x 8 rollouts per iteration, LVRL advantages on Oracle values, 4 PPO epochs) plus:

- ``teacher.kind: babyai_privileged``: ``jaxdm.rl.babyai_teacher``'s MLP that sees the BFS
  distance field's cost-to-go of each move (SFT on solver labels, trained once and cached);
  the ``teacher_topk`` signal is its log-probs over all 6 actions (K_T = 6) at every state the
  student acted in, one jitted vmapped pass over the rollout's recorded env states;
- ``algo.terms: {lvopd: c}``: the distillation term, c · Σ w_a · KL(π_student ‖ π_teacher) /
  #actions (the library's top-k reverse KL with k = K_T = 6 = the whole action set, the MLP's
  output layer as the "LM head"), the gate w (``algo.lvopd_gate``) computed on the host over
  the whole iteration batch before mini-batching.

Methods (``METHODS``): ``lvrl`` (the same term at weight 0: the KL to the teacher is logged,
nothing is distilled), ``lvrl_lvopd`` (w = max(0, −Â), Â the batch-std-normalised LVRL step
advantages), ``opd_pure`` (w = 1), ``opd_trajectory`` (w = 1 on every action of a failed
episode, 0 on successes). All share the LVRL surrogate, seeds, tasks and optimiser.

Outputs (``--out``): ``runs/<method>/seed_<s>/`` (each trainer's run directory),
``metrics.jsonl`` (every record, tagged, written as the runs go), ``success_curves.png``,
``summary.json``, ``table.md``, ``PRODUCED_BY.txt``.

    python experiments/lvopd_babyai.py --quick     # smoke (~2-4 min loaded)
    python experiments/lvopd_babyai.py             # 4 methods x 3 seeds (the README run)
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from jaxdm import config as cfgmod
from jaxdm.jsonl import write_atomic, write_json

METHODS = {
    "lvrl": ["algo.terms={lvopd: 0.0}"],
    "lvrl_lvopd": ["algo.lvopd_gate=lvopd"],
    "opd_pure": ["algo.lvopd_gate=pure"],
    "opd_trajectory": ["algo.lvopd_gate=trajectory"],
}
BASE = Path(__file__).resolve().parent / "configs" / "lvopd_babyai_jax.yaml"
CURVE_KEYS = {"train": "train/success", "kl": "lvopd/kl_mean", "gate": "lvopd/gate_mean",
              "gated": "lvopd/gated_token_fraction", "all_fail": "train/all_fail_groups",
              "iter_seconds": "time/iteration", "teacher_seconds": "time/teacher_topk"}


def train_config(method: str, seed: int, out: Path, overrides: list[str], coef: float):
    from jaxdm.rl.trainer import TrainConfig

    return cfgmod.load_config(TrainConfig, str(BASE), [
        f"seed={seed}", f"model.init_seed={seed}", f"out_dir={out}",
        f"algo.terms={{lvopd: {coef}}}", *overrides, *METHODS[method]])


def teacher_report(cfg, episodes: int) -> dict:
    """The teacher acting alone (actions sampled) on train / ID / OOD tasks at the budget."""
    import jax

    from jaxdm.envs.babyai import BabyAIEnv
    from jaxdm.rl import babyai_teacher as bt

    tk = bt.build_topk_teacher(cfg)
    env = BabyAIEnv(int(cfg.env.kwargs["room_size"]))
    return {"source": tk.source, **{split: bt.teacher_success(
        env, tk.params, jax.random.key(5 + i), split, episodes=episodes,
        max_steps=cfg.max_actions) for i, split in enumerate(("train", "id_test", "ood_test"))}}


def run_one(method: str, seed: int, out: Path, overrides: list[str], coef: float, log, *,
            resume: bool = False, overwrite: bool = False) -> dict:
    from lvrl_babyai import run_curves  # experiments/ (this script's folder)

    from jaxdm.rl.trainer import train_run

    cfg = train_config(method, seed, out / "runs" / method / f"seed_{seed}", overrides, coef)
    t0 = time.perf_counter()
    recs = train_run(cfg, resume=resume, overwrite=overwrite, log=False)
    for r in recs:
        log({"method": method, "seed": seed, **{k: v for k, v in r.items()
                                                 if not isinstance(v, (list, dict))}})
    curve = run_curves(recs, CURVE_KEYS, defaults=dict.fromkeys(CURVE_KEYS.values(), 0.0))
    curve["wall"] = time.perf_counter() - t0
    print(f"  {method} seed {seed}: train {np.mean(curve['train'][:5]):.3f} -> "
          f"{np.mean(curve['train'][-10:]):.3f}, ID {curve['id'][-1]:.3f}, OOD "
          f"{curve['ood'][-1]:.3f}, KL {curve['kl'][0]:.2f} -> {curve['kl'][-1]:.2f} "
          f"({curve['wall']:.0f} s)", flush=True)
    return curve


def plot(results: dict, out: Path, teacher: dict) -> None:
    from intervals import t_interval  # experiments/ (this script's folder)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    panels = ((axes[0], "train", "iteration"), (axes[1], "id", "id_iter"),
              (axes[2], "ood", "id_iter"), (axes[3], "kl", "iteration"))
    for i, (m, runs) in enumerate(results.items()):
        for ax, key, xk in panels:
            arr = np.asarray([r[key] for r in runs])
            xs, mean = runs[0][xk], arr.mean(0)
            ci = t_interval(arr)[1] if len(arr) > 1 else 0 * mean  # 95 % t-interval
            ax.plot(xs, mean, label=m, color=f"C{i}")
            ax.fill_between(xs, mean - ci, mean + ci, color=f"C{i}", alpha=0.2)
    for ax, split in zip(axes[:3], ("train", "id_test", "ood_test")):
        ax.axhline(teacher[split], color="grey", ls="--", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
    titles = ("success, train (d 1-3)", "success, ID eval (d 1-3)", "success, OOD eval (d 4-5)",
              "KL(student ‖ teacher), mean over actions")
    for ax, title in zip(axes, titles):
        ax.set_title(f"BabyAI LVOPD: {title}", fontsize=9)
        ax.set_xlabel("iteration (8 groups x 8 rollouts)")
    axes[0].set_ylabel("mean ± 95 % t-interval over seeds (dashed: teacher)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "success_curves.png", dpi=110)
    plt.close(fig)


def first_reaching(iters, per_seed, level):
    for it, v in zip(iters, np.asarray(per_seed).mean(0)):
        if v >= level:
            return int(it)
    return None


def table(results: dict) -> tuple[list[str], dict]:
    from intervals import t_interval  # experiments/ (this script's folder)

    ci = lambda a: t_interval(a)[1] if len(a) > 1 else 0.0  # noqa: E731  (95 % t half-width)
    lines = ["| method | train success, first 10 it. -> last 10 | ID success % (final) | "
             "ID success % (mid-run) | OOD success % | iterations to 50 % ID | KL to teacher, "
             "first 5 it. -> last 5 | gate mean (share > 0) | s / it. |",
             "|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for m, runs in results.items():
        train = np.asarray([r["train"] for r in runs])
        ids, oods = np.asarray([r["id"] for r in runs]), np.asarray([r["ood"] for r in runs])
        kl = np.asarray([r["kl"] for r in runs])
        mid = len(runs[0]["id_iter"]) // 2 - 1
        to50 = first_reaching(runs[0]["id_iter"], ids, 0.5)
        gate = float(np.mean([r["gate"] for r in runs]))
        gated = float(np.mean([r["gated"] for r in runs]))
        it_s = float(np.mean([np.median(r["iter_seconds"][1:] or r["iter_seconds"])
                              for r in runs]))
        summary[m] = {"train_first10": float(train[:, :10].mean()),
                      "train_last10": float(train[:, -10:].mean()),
                      "id": ids[:, -1].tolist(), "id_mid": ids[:, mid].tolist(),
                      "id_mid_iteration": runs[0]["id_iter"][mid], "ood": oods[:, -1].tolist(),
                      "iterations_to_50_id": to50, "kl_first5": float(kl[:, :5].mean()),
                      "kl_last5": float(kl[:, -5:].mean()), "gate_mean": gate,
                      "gated_fraction": gated, "seconds_per_iteration": it_s,
                      "wall_seconds": [r["wall"] for r in runs]}
        gate_txt = "– (weight 0)" if m == "lvrl" else f"{gate:.2f} ({gated:.2f})"
        lines.append(
            f"| {m} | {train[:, :10].mean():.3f} -> {train[:, -10:].mean():.3f} "
            f"| {100 * ids[:, -1].mean():.1f} ± {100 * ci(ids[:, -1]):.1f} "
            f"| {100 * ids[:, mid].mean():.1f} ± {100 * ci(ids[:, mid]):.1f} "
            f"(it. {runs[0]['id_iter'][mid]}) "
            f"| {100 * oods[:, -1].mean():.1f} ± {100 * ci(oods[:, -1]):.1f} "
            f"| {to50 if to50 is not None else '> ' + str(runs[0]['id_iter'][-1])} "
            f"| {kl[:, :5].mean():.2f} -> {kl[:, -5:].mean():.2f} | {gate_txt} | {it_s:.2f} |")
    return lines, summary


def main(argv=None) -> int:
    from lvrl_babyai import (add_experiment_args, experiment_setup,  # experiments/
                             write_produced_by)

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_experiment_args(ap, METHODS, "experiments/results/lvopd_babyai")
    ap.add_argument("--coef", type=float, default=1.0, help="distillation coefficient")
    args = ap.parse_args(argv)
    overrides, methods, seeds, out = experiment_setup(args, METHODS)
    t0 = time.perf_counter()
    cfg0 = train_config("lvrl_lvopd", 0, out, overrides, args.coef)
    teacher = teacher_report(cfg0, cfg0.eval_tasks or 64)
    print(f"teacher {teacher}", flush=True)
    write_produced_by(out, "lvopd_babyai.py", argv)
    log_f = open(out / "metrics.jsonl", "w")  # rebuilt: run_one gives each run's whole history

    def log(rec):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    log({"teacher": teacher})
    results: dict[str, list] = {m: [] for m in methods}
    for s in seeds:  # seed-major: a cut run still compares every method on the seeds done
        print(f"[seed {s}] methods {methods}", flush=True)
        for m in methods:
            results[m].append(run_one(m, s, out, overrides, args.coef, log,
                                      resume=args.resume, overwrite=args.overwrite))
        plot(results, out, teacher)
        lines, summary = table(results)
        write_atomic(out / "table.md", "\n".join(lines) + "\n")
    log_f.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    write_json(out / "summary.json", {
        "base_config": BASE.name, "overrides": overrides, "seeds": seeds, "coef": args.coef,
        "teacher": teacher, "methods": summary, "wall_seconds": time.perf_counter() - t0,
        "cpu_seconds": ru.ru_utime + ru.ru_stime, "curves": results}, indent=1)
    print("\n".join(lines))
    print(f"wall {time.perf_counter() - t0:.0f} s, CPU {ru.ru_utime + ru.ru_stime:.0f} s; "
          f"outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
