"""The BabyAI credit-assignment experiment (seed 001 §4.2, CPU-sized), through the library
trainer: GRPO vs PPO (learned critic, GAE) vs LVRL with the Oracle value and a noisy Oracle.

Every run is one ``jaxdm.rl.trainer.Trainer`` (the same update loop, estimators, loss terms,
``TrainState`` and orbax checkpoints as the text policies) on the base config
``experiments/configs/lvrl_babyai_jax.yaml``:

- Policy ``policy.kind: symbolic_mlp`` (``jaxdm.rl.symbolic``): an MLP (2 x 128 tanh) on the
  one-hot symbolic 7 x 7 view, heading and mission, plus (``env.kwargs.compass``) the target's
  offset in the agent's frame; a softmax over the 6 effective actions.
- Env ``env.name: babyai_jax`` (``jaxdm.rl.jax_envs``): the JAX BabyAI six-room pickup world
  played by the jitted rollout (``jaxdm.rl.jax_rollout``: ``lax.scan`` over the vmapped env,
  step keys from ``envs.core.step_key``); training and ID evaluation on door distance 1-3,
  OOD on 4-5; reward 1 for picking up the target.
- 8 task groups x 8 rollouts per iteration, identical seeds, task sampling, budget and
  optimiser for every method (Adam, lr 1e-3, clip 1.0, 4 PPO epochs of 512-row mini-batches,
  clip 0.2, entropy 0.01, no KL).
- Methods (``METHODS``): ``grpo`` (outcome advantages); ``ppo`` (``gae`` with an MLP critic,
  ``critic.kind: mlp``, γ 0.99, λ 0.95, batch-normalised); ``lvrl_oracle`` (``lvrl``, value
  model ``oracle``: q ** plan length from the env's distance field, q = 0.9, recorded in the
  rollout); ``lvrl_noisy`` (the same + Gaussian noise σ = ``--noise``, clipped to [0, 1];
  the default σ is the mean |ΔV| between consecutive states under the initial policy, i.e.
  noise as large as the value changes LVRL credits); ``lvrl_drift``: the Oracle's value of
  state t lowered by σ · t instead (a systematic downward drift with the step index, the
  error SmolLM2's values showed, of the same per-step size); ``grpo_shaped`` / ``ppo_shaped``: the
  Oracle value as a potential-based shaping reward r_t + γ V(s_t+1) − V(s_t) (0 after the
  last action) for GRPO with step rewards and for PPO's GAE, the controls that say what
  LVRL's anchors and group baseline add beyond the shaping itself (the Oracle's V = q^plan
  length makes LVRL-Oracle an exact potential-based shaping).

Outputs (``--out``): ``runs/<method>/seed_<s>/`` (each trainer's run directory: config,
metrics.jsonl, checkpoints, curves), ``metrics.jsonl`` (every record, tagged with method and
seed), ``success_curves.png`` (train / ID / OOD success, mean ± s.e. over seeds),
``summary.json``, ``table.md`` and ``PRODUCED_BY.txt`` (commit and command).

A run's start record is its ``config.yaml`` and its end record its final evaluation line with
the checkpoint of its last iteration (``jaxdm.rl.trainer``); ``--resume`` re-reads finished
runs, continues an interrupted one from its last checkpoint (its metrics cut back to it) and
rebuilds the outputs above from every run's history, so a kill anywhere resumes to an
uninterrupted experiment's results (tests/experiments/test_lvrl_babyai_resume.py).

    python experiments/lvrl_babyai.py --quick          # smoke (~1-2 min)
    python experiments/lvrl_babyai.py                  # the README run
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxdm import config as cfgmod
from jaxdm.jsonl import write_atomic, write_json
from jaxdm.rundir import lock_run_dir

METHODS = {
    "grpo": ["algo.advantage=grpo"],
    "ppo": ["algo.advantage=gae", "critic.kind=mlp"],
    "lvrl_oracle": ["algo.advantage=lvrl", "value={kind: oracle}"],
    "lvrl_noisy": ["algo.advantage=lvrl", "value={kind: oracle, noise: NOISE}"],
    # the same size as a systematic error: every state's value lowered by NOISE per step
    "lvrl_drift": ["algo.advantage=lvrl", "value={kind: oracle, drift: NOISE}"],
    # the same Oracle values as a potential-based shaping reward for GRPO and PPO (issue 40 §4)
    "grpo_shaped": ["algo.advantage=grpo_shaped", "value={kind: oracle}"],
    "ppo_shaped": ["algo.advantage=gae_shaped", "critic.kind=mlp", "value={kind: oracle}"],
}
BASE = Path(__file__).resolve().parent / "configs" / "lvrl_babyai_jax.yaml"
DEFAULT_NOISE = 0.02  # mean |V(s_t+1) - V(s_t)| under the initial policy (measure_noise)


def train_config(method: str, seed: int, out: Path, overrides: list[str], noise: float):
    from jaxdm.rl.trainer import TrainConfig

    extra = [o.replace("NOISE", repr(noise)) for o in METHODS[method]]
    return cfgmod.load_config(TrainConfig, str(BASE), [
        f"seed={seed}", f"model.init_seed={seed}", f"critic.init_seed={seed}",
        f"out_dir={out}", *overrides, *extra])


def measure_noise(overrides: list[str]) -> float:
    """Mean |ΔV| of the Oracle between consecutive interior states, initial policy."""
    import tempfile

    from jaxdm.rl.trainer import Trainer

    with tempfile.TemporaryDirectory() as scratch:   # its own folder: jobs never share one
        cfg = train_config("lvrl_oracle", 0, Path(scratch), overrides, 0.0)
        tr = Trainer(cfg, log=False)
        eb, _ = tr.collector.collect(tr.params, __import__("jax").random.key(0), 0)
        diffs = [np.abs(np.diff(np.asarray(tj.metadata["oracle_values"][:-1])))
                 for tj in eb.trajectories]
        tr.close()
    d = np.concatenate([x for x in diffs if x.size])
    return float(d.mean())


CURVE_KEYS = {"train": "train/success", "all_fail": "train/all_fail_groups",
              "value_states": "value/states", "value_seconds": "value/total_seconds",
              "iter_seconds": "time/iteration", "update_seconds": "time/update"}


def add_experiment_args(ap: argparse.ArgumentParser, methods: Sequence[str], out: str) -> None:
    """The options both BabyAI experiments take (this one and ``lvopd_babyai.py``)."""
    ap.add_argument("--quick", action="store_true", help="smoke run (~1-2 min)")
    ap.add_argument("--methods", default=",".join(methods))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--set", action="append", default=[],
                    help="extra TrainConfig override key=value (repeatable)")
    ap.add_argument("--out", default=out)
    ap.add_argument("--resume", action="store_true",
                    help="continue the experiment in --out: finished runs are kept")
    ap.add_argument("--overwrite", action="store_true", help="replace the experiment in --out")


def experiment_setup(args: argparse.Namespace, known: Sequence[str]
                     ) -> tuple[list[str], list[str], list[int], Path]:
    """(TrainConfig overrides, methods, seeds, the output folder) of ``add_experiment_args``'
    options. Refuses to write over an earlier experiment unless asked: ``--resume`` keeps
    every finished (method, seed) run and continues the others from their checkpoints,
    ``--overwrite`` starts every run again."""
    overrides = list(args.set)
    out = args.out
    if args.quick:
        overrides += ["iterations=3", "eval_every=2", "eval_tasks=16", "tasks_per_iter=4",
                      "group_size=4", "max_actions=32", "eval_seeds=[0]"]
        out += "_quick"
    if args.iterations:
        overrides.append(f"iterations={args.iterations}")
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in known]
    if bad:
        raise SystemExit(f"unknown method(s) {bad}; known: {list(known)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(out)
    if args.resume and args.overwrite:
        raise SystemExit("--resume and --overwrite exclude each other")
    lock_run_dir(out)   # the folder is this job's until the process ends
    held = [p.name for p in (out / "metrics.jsonl", out / "runs") if p.exists()]
    if held and not (args.resume or args.overwrite):
        raise SystemExit(f"{out} holds results of an earlier run ({', '.join(held)}); pass "
                         f"--resume to continue it (finished runs are kept) or --overwrite to "
                         f"replace it")
    return overrides, methods, seeds, out


def write_produced_by(out: Path, script: str, argv: Sequence[str] | None, *extra: str) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    write_atomic(out / "PRODUCED_BY.txt", "\n".join([
        f"commit {commit}", f"command python experiments/{script} "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}", *extra]) + "\n")


def run_curves(recs, series: dict[str, str], defaults: dict[str, float] | None = None) -> dict:
    """A Trainer run's curves: ID / OOD success at each evaluation (``id_iter``, ``id``,
    ``ood``, fractions) and ``series`` at each training iteration (``iteration``, ...)."""
    from jaxdm.runlog import metric_series

    ev = metric_series(recs, {"id": "eval/All", "ood": "eval/ood"}, present="eval/All")
    curve = metric_series(recs, series, present="train/success", defaults=defaults)
    curve.update(id_iter=ev["iteration"], id=[v / 100.0 for v in ev["id"]],
                 ood=[v / 100.0 for v in ev["ood"]])
    return curve


def run_one(method: str, seed: int, out: Path, overrides: list[str], noise: float, log, *,
            resume: bool = False, overwrite: bool = False) -> dict:
    cfg = train_config(method, seed, out / "runs" / method / f"seed_{seed}", overrides, noise)
    t0 = time.perf_counter()
    from jaxdm.rl.trainer import train_run
    recs = train_run(cfg, resume=resume, overwrite=overwrite, log=False)
    wall = time.perf_counter() - t0
    for r in recs:
        log({"method": method, "seed": seed, **{k: v for k, v in r.items()
                                                 if not isinstance(v, (list, dict))}})
    curve = run_curves(recs, CURVE_KEYS, defaults={"value/states": 0,
                                                   "value/total_seconds": 0.0})
    curve["wall"] = wall
    tr_succ = curve["train"]
    print(f"  {method} seed {seed}: train {np.mean(tr_succ[:5]):.3f} -> "
          f"{np.mean(tr_succ[-10:]):.3f}, ID {curve['id'][-1]:.3f}, OOD {curve['ood'][-1]:.3f}"
          f" ({wall:.0f} s)", flush=True)
    return curve


def iterations_to(iters, per_seed, level=0.5):
    """First evaluated iteration whose seed-mean success ≥ level (None if never)."""
    for it, v in zip(iters, np.asarray(per_seed).mean(0)):
        if v >= level:
            return int(it)
    return None


def plot(results: dict, out: Path, budget: int) -> None:
    from intervals import t_interval  # experiments/ (this script's folder)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for i, (m, runs) in enumerate(results.items()):
        for ax, key, xk in ((axes[0], "train", "iteration"), (axes[1], "id", "id_iter"),
                            (axes[2], "ood", "id_iter"), (axes[3], "all_fail", "iteration")):
            arr = np.asarray([r[key] for r in runs])
            xs = runs[0][xk]
            mean = arr.mean(0)
            ci = t_interval(arr)[1] if len(arr) > 1 else 0 * mean  # 95 % t-interval
            ax.plot(xs, mean, label=m, color=f"C{i}")
            ax.fill_between(xs, mean - ci, mean + ci, color=f"C{i}", alpha=0.2)
    titles = ("success, train (d 1-3)", "success, ID eval (d 1-3)", "success, OOD eval (d 4-5)",
              "train: share of groups where all 8 rollouts fail")
    for ax, title in zip(axes, titles):
        ax.set_title(f"BabyAI {title}", fontsize=9)
        ax.set_xlabel("iteration (8 groups x 8 rollouts)")
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel(f"success (mean ± 95 % t-interval, budget {budget})")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "success_curves.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_experiment_args(ap, METHODS, "experiments/results/lvrl_babyai")
    ap.add_argument("--noise", type=float, default=DEFAULT_NOISE,
                    help="lvrl_noisy's σ (-1: measure the mean |ΔV| first)")
    args = ap.parse_args(argv)
    overrides, methods, seeds, out = experiment_setup(args, METHODS)
    noise = measure_noise(overrides) if args.noise < 0 else args.noise
    write_produced_by(out, "lvrl_babyai.py", argv, f"noise {noise}")
    log_f = open(out / "metrics.jsonl", "w")  # rebuilt: run_one gives each run's whole history

    def log(rec):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    t0 = time.perf_counter()
    results: dict[str, list] = {}
    for m in methods:
        print(f"[{m}] seeds {seeds}", flush=True)
        results[m] = [run_one(m, s, out, overrides, noise, log, resume=args.resume,
                              overwrite=args.overwrite) for s in seeds]
    log_f.close()
    cfg0 = train_config("grpo", 0, out, overrides, noise)
    plot(results, out, cfg0.max_actions)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    summary = {"base_config": str(BASE.name), "overrides": overrides, "seeds": seeds,
               "noise": noise, "wall_seconds": time.perf_counter() - t0,
               "cpu_seconds": ru.ru_utime + ru.ru_stime, "methods": {}}
    lines = ["| method | train success, first 5 it. -> last 10 | all-fail groups, first 5 it. "
             "| ID success % | OOD success % | iterations to 50 % ID | value queries / it. "
             "| s / it. (update) |",
             "|---|---|---|---|---|---|---|---|"]
    from intervals import t_interval  # experiments/ (this script's folder)

    ci = lambda a: t_interval(a)[1] if len(a) > 1 else 0.0  # noqa: E731  (95 % t half-width)
    for m, runs in results.items():
        train = np.asarray([r["train"] for r in runs])
        fail0 = float(np.asarray([r["all_fail"][:5] for r in runs]).mean())
        idf = np.asarray([r["id"][-1] for r in runs])
        oodf = np.asarray([r["ood"][-1] for r in runs])
        to50 = iterations_to(runs[0]["id_iter"], [r["id"] for r in runs])
        states = float(np.mean([np.mean(r["value_states"]) for r in runs]))
        vsec = float(np.mean([np.mean(r["value_seconds"]) for r in runs]))
        it_s = float(np.mean([np.median(r["iter_seconds"][1:] or r["iter_seconds"])
                              for r in runs]))
        up_s = float(np.mean([np.median(r["update_seconds"][1:] or r["update_seconds"])
                              for r in runs]))
        summary["methods"][m] = {
            "train_first5": float(train[:, :5].mean()), "train_last10": float(
                train[:, -10:].mean()), "all_fail_first5": fail0, "id": idf.tolist(),
            "ood": oodf.tolist(), "iterations_to_50_id": to50,
            "value_states_per_iteration": states, "value_seconds_per_iteration": vsec,
            "seconds_per_iteration": it_s, "update_seconds_per_iteration": up_s,
            "wall_seconds": [r["wall"] for r in runs]}
        cost = (f"{states:.0f} states, {1e3 * vsec:.0f} ms (Oracle, 0 tokens)"
                if m.startswith("lvrl") else "-")
        lines.append(
            f"| {m} | {train[:, :5].mean():.3f} -> {train[:, -10:].mean():.3f} | {fail0:.2f} "
            f"| {100 * idf.mean():.1f} ± {100 * ci(idf):.1f} "
            f"| {100 * oodf.mean():.1f} ± {100 * ci(oodf):.1f} "
            f"| {to50 if to50 is not None else '> ' + str(runs[0]['id_iter'][-1])} | {cost} "
            f"| {it_s:.2f} ({up_s:.2f}) |")
    write_json(out / "summary.json", summary, indent=1)
    write_atomic(out / "table.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wall {summary['wall_seconds']:.0f} s, CPU {summary['cpu_seconds']:.0f} s; "
          f"outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
