"""LVOPD on BabyAI (seed 001 §4.3, CPU-sized): LVRL alone vs LVRL + LVOPD vs pure OPD vs
trajectory-gated OPD, distilling a weak student from a strong privileged teacher.

Setup: the first LVRL BabyAI loop's env, student MLP (7 x 7 egocentric view, no compass),
rollout, LVRL advantages (Oracle values, q ** plan length) and PPO loss
(``experiments/babyai_loop.py``, imported through ``lvrl_babyai.py``'s re-exports). The teacher is ``jaxdm.rl.babyai_teacher``: a *privileged* MLP that sees the BFS
distance field's cost-to-go of each move at the agent's pose (the standard teacher-student
setup; distillation only needs its log-probs over the same 6 actions at the student's
states), trained by SFT (cross-entropy) on the solver's actions at the states noisy solvers
visit on training layouts. Its log-probs at the student's states are computed by replaying
each rollout's actions from the same resets (deterministic env; the replayed student
features are checked equal to the rollout's). Every method minimises the LVRL clipped
surrogate plus ``coef`` · Σ w_a · KL(π_student ‖ π_teacher) / #actions, with the gate w from
``jaxdm.rl.distill.GATES`` computed on the host over the whole iteration batch (LVRL
advantages are already batch-normalised, so normalize="none"):

- ``lvrl``: no distillation (coef 0);
- ``lvrl_lvopd``: w = max(0, −Â) (LVOPD);
- ``opd_pure``: w = 1 on every action;
- ``opd_trajectory``: w = 1 on every action of a failed episode, 0 on successes.

The KL is the library's top-k reverse KL (``lvopd_distill_loss``) with the whole 6-action
support (k = K_T = 6 here: the policy has 6 outputs, not a 151k vocabulary).

    python experiments/lvopd_babyai.py --quick     # smoke
    python experiments/lvopd_babyai.py             # 3 seeds
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lvrl_babyai as lb  # noqa: E402

from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams  # noqa: E402
from jaxdm.envs.babyai.value import distance_field  # noqa: E402
from jaxdm.rl import babyai_teacher as bt  # noqa: E402
from jaxdm.rl.distill import gate_weights, lvopd_distill_loss  # noqa: E402

METHODS = {"lvrl": None, "lvrl_lvopd": "lvopd", "opd_pure": "pure",
           "opd_trajectory": "trajectory"}


def teacher_logprobs_along(env, teacher, env_params, task_keys, group_size, actions, mask):
    """The teacher's log-probs [B, T, 6] at the states of a ``lb.rollout`` batch, by replaying
    its actions from the same resets (the env is deterministic); also the replayed student
    features [B, T, F] (the caller checks them against the rollout's)."""
    keys = jnp.repeat(task_keys, group_size, axis=0)
    _, s0 = jax.vmap(env.reset_env, in_axes=(0, None))(keys, env_params)
    fields = jax.vmap(distance_field)(s0)

    def body(st, xs):
        a, alive = xs
        lp = jax.nn.log_softmax(jax.vmap(bt.teacher_logits, in_axes=(None, 0, 0))(
            teacher, st, fields))
        feats = lb.features(jax.vmap(env.get_obs)(st))
        _, st2, _, _, _, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
            keys, st, a, env_params)
        st2 = jax.tree.map(lambda n, o: jnp.where(
            alive.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), st2, st)
        return st2, (lp, feats)

    _, (lp, feats) = jax.lax.scan(body, s0, (actions.T, mask.T))
    return lp.swapaxes(0, 1), feats.swapaxes(0, 1)


def make_collect(env, cfg):
    train_params = BabyAIParams.for_split("train", max_steps=cfg.max_steps)

    def collect(params, teacher, key):
        k_task, k_roll, k_noise = jax.random.split(key, 3)
        task_keys = jax.random.split(k_task, cfg.groups)
        batch = lb.rollout(env, params, k_roll, train_params, task_keys, cfg.group_size, True,
                           cfg.max_steps, cfg.oracle_q or None)
        adv, _ = lb.advantages(batch, None, cfg, "lvrl_oracle", k_noise)
        t_lp, feats = teacher_logprobs_along(env, teacher, train_params, task_keys,
                                             cfg.group_size, batch["actions"], batch["mask"])
        replay_err = jnp.max(jnp.where(batch["mask"][..., None],
                                       jnp.abs(feats - batch["feats"]), 0.0))
        return batch, adv, t_lp, replay_err

    return collect


def make_update(cfg, optimizer):
    def update(params, opt_state, data, key, coef):
        b, t = data["mask"].shape
        ids = jnp.broadcast_to(jnp.arange(lb.NUM_ACT, dtype=jnp.int32), (b, t, lb.NUM_ACT))

        def loss(p, mb):
            pg, m = lb.loss_fn(p, mb, cfg, "lvrl_oracle")
            logits = lb.mlp(p["pi"], mb["feats"])
            n = mb["mask"].shape[0]
            dl, dm = lvopd_distill_loss(
                logits, ids[:n], mb["t_lp"], mb["w"], jnp.broadcast_to(jnp.arange(t), (n, t)),
                mb["mask"], k=lb.NUM_ACT, impl="reference")
            return pg + coef * dl, (m, dm)

        def epoch(carry, k):
            params, opt_state = carry
            perm = jax.random.permutation(k, b).reshape(cfg.minibatches, -1)

            def step(carry, idx):
                params, opt_state = carry
                mb = jax.tree.map(lambda a: a[idx], data)
                (_, (m, dm)), grads = jax.value_and_grad(loss, has_aux=True)(params, mb)
                up, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, up), opt_state), dm["lvopd/kl_mean"]

            (params, opt_state), kl = jax.lax.scan(step, (params, opt_state), perm)
            return (params, opt_state), kl.mean()

        (params, opt_state), kl = jax.lax.scan(epoch, (params, opt_state),
                                               jax.random.split(key, cfg.epochs))
        return params, opt_state, kl[-1]

    return update


def compile_programs(env, cfg) -> dict:
    """The jitted programs every method shares (the coefficient is an argument, so all
    methods run the same compiled update)."""
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    return {"optimizer": optimizer,
            "collect": jax.jit(jax.vmap(make_collect(env, cfg), in_axes=(0, None, 0))),
            "update": jax.jit(jax.vmap(make_update(cfg, optimizer),
                                       in_axes=(0, 0, 0, 0, None))),
            "ev_id": jax.jit(jax.vmap(lb.make_eval(env, cfg, "id_test"))),
            "ev_ood": jax.jit(jax.vmap(lb.make_eval(env, cfg, "ood_test")))}


def run_method(programs, cfg, method, teacher, seeds, coef, log) -> dict:
    gate = METHODS[method]
    optimizer, collect, update = (programs[k] for k in ("optimizer", "collect", "update"))
    ev_id, ev_ood = programs["ev_id"], programs["ev_ood"]
    coef = jnp.float32(0.0 if gate is None else coef)
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    params, opt_state = jax.vmap(lambda k: lb.init_state(k, cfg, optimizer))(
        jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys))
    curves = {"iteration": [], "train": [], "kl": [], "gate": [], "id_iter": [], "id": []}
    t0 = time.perf_counter()
    for it in range(cfg.iterations):
        if it % cfg.eval_every == 0:
            ek = jax.vmap(lambda k: jax.random.fold_in(k, 10_000 + it))(keys)
            curves["id_iter"].append(it)
            curves["id"].append(np.asarray(ev_id(params, ek)).tolist())
            log({"method": method, "iteration": it, "id_success": curves["id"][-1]})
        ik = jax.vmap(lambda k: jax.random.fold_in(k, 1 + it))(keys)
        batch, adv, t_lp, replay_err = collect(params, teacher, ik)
        if float(jnp.max(replay_err)) != 0.0:
            raise RuntimeError(f"iteration {it}: replaying the rollout's actions did not "
                               f"reproduce its states (feature error {jnp.max(replay_err)})")
        mask, adv_h = np.asarray(batch["mask"]), np.asarray(adv, np.float32)
        w = np.stack([gate_weights(gate or "pure", adv_h[s], mask[s],
                                   success=np.asarray(batch["success"][s]), normalize="none")
                      for s in range(len(seeds))])
        data = {"feats": batch["feats"], "actions": batch["actions"], "logp": batch["logp"],
                "mask": batch["mask"], "adv": adv, "targets": jnp.zeros(mask.shape),
                "old_v": jnp.zeros(mask.shape), "t_lp": t_lp, "w": jnp.asarray(w)}
        params, opt_state, kl = update(params, opt_state, data,
                                       jax.vmap(lambda k: jax.random.fold_in(k, 7))(ik), coef)
        succ = np.asarray(batch["success"]).mean(1)
        gate_mean = float(w[mask].mean()) if gate else 0.0
        curves["iteration"].append(it)
        curves["train"].append(succ.tolist())
        curves["kl"].append(np.asarray(kl).tolist())
        curves["gate"].append(gate_mean)
        log({"method": method, "iteration": it, "train_success": succ.tolist(),
             "kl": np.asarray(kl).tolist(), "gate_mean": gate_mean})
        print(f"  {method} it {it:3d} train {succ.mean():.3f} kl {np.mean(kl):.3f} "
              f"gate {gate_mean:.2f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    ek = jax.vmap(lambda k: jax.random.fold_in(k, 10_000 + cfg.iterations))(keys)
    curves["id_iter"].append(cfg.iterations)
    curves["id"].append(np.asarray(ev_id(params, ek)).tolist())
    curves["ood"] = np.asarray(ev_ood(params, ek)).tolist()
    log({"method": method, "iteration": cfg.iterations, "id_success": curves["id"][-1],
         "ood_success": curves["ood"]})
    curves["seconds"] = time.perf_counter() - t0
    return curves


def plot(results: dict, out: Path, cfg, teacher_train: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for i, (m, c) in enumerate(results.items()):
        for ax, key, xs in ((axes[0], "train", c["iteration"]), (axes[1], "id", c["id_iter"]),
                            (axes[2], "kl", c["iteration"])):
            arr = np.asarray(c[key])
            mean = arr.mean(1)
            se = arr.std(1, ddof=1) / np.sqrt(arr.shape[1]) if arr.shape[1] > 1 else 0 * mean
            ax.plot(xs, mean, label=m, color=f"C{i}")
            ax.fill_between(xs, mean - se, mean + se, color=f"C{i}", alpha=0.2)
    for ax in axes[:2]:
        ax.axhline(teacher_train, color="grey", ls="--", lw=0.8)
        ax.set_ylim(-0.02, 1.02)
    for ax, title in zip(axes, ("student success, train rollouts", "student success, ID eval",
                                "KL(student ‖ teacher), last epoch")):
        ax.set_title(f"BabyAI LVOPD: {title}", fontsize=9)
        ax.set_xlabel(f"iteration ({cfg.groups} groups x {cfg.group_size} rollouts)")
    axes[0].set_ylabel("mean ± s.e. over seeds (dashed: teacher)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "success_curves.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--coef", type=float, default=1.0, help="distillation coefficient")
    ap.add_argument("--out", default="experiments/results/lvopd_babyai")
    args = ap.parse_args(argv)
    cfg = lb.Config()
    sft_episodes, sft_steps = 256, 1500
    if args.quick:
        cfg = dataclasses.replace(cfg, iterations=3, eval_every=2, eval_episodes=16, groups=4,
                                  group_size=4, max_steps=32)
        sft_episodes, sft_steps = 48, 300
        args.out += "_quick"
    if args.iterations:
        cfg = dataclasses.replace(cfg, iterations=args.iterations)
    methods = [m for m in args.methods.split(",") if m]
    if any(m not in METHODS for m in methods):
        raise SystemExit(f"unknown method in {methods}; known: {list(METHODS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = BabyAIEnv(7)
    t0 = time.perf_counter()
    teacher, rep = bt.sft_teacher(env, jax.random.key(123), episodes=sft_episodes,
                                  steps=sft_steps, max_steps=cfg.max_steps)
    t_succ = {split: bt.teacher_success(env, teacher, jax.random.key(5 + i), split,
                                        episodes=cfg.eval_episodes, max_steps=cfg.max_steps)
              for i, split in enumerate(("train", "id_test", "ood_test"))}
    print(f"SFT teacher (privileged): label accuracy {rep.label_accuracy:.3f} on held-out "
          f"states of {rep.states}; success (sampled) train {t_succ['train']:.3f}, ID "
          f"{t_succ['id_test']:.3f}, OOD {t_succ['ood_test']:.3f} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    log_f = open(out / "metrics.jsonl", "w")

    def log(rec):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    teacher_info = {"label_accuracy": rep.label_accuracy, "states": rep.states,
                    "sft_steps": rep.sft_steps, "sft_episodes": sft_episodes,
                    "success": t_succ}
    log({"teacher": teacher_info})
    results = {}
    programs = compile_programs(env, cfg)
    for m in methods:
        results[m] = run_method(programs, cfg, m, teacher, seeds, args.coef, log)
        plot(results, out, cfg, t_succ["train"])
    log_f.close()
    lines = ["| method | train success (last 5 it.) | ID success % (mean ± s.e.) | "
             "OOD success % (mean ± s.e.) | final KL to teacher |", "|---|---|---|---|---|"]
    se = lambda a: a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else 0.0  # noqa: E731
    for m, c in results.items():
        tr = np.asarray(c["train"])[-5:].mean()
        fin, ood = np.asarray(c["id"][-1]) * 100, np.asarray(c["ood"]) * 100
        lines.append(f"| {m} | {tr:.3f} | {fin.mean():.1f} ± {se(fin):.1f} | "
                     f"{ood.mean():.1f} ± {se(ood):.1f} | {np.mean(c['kl'][-1]):.3f} |")
    table = "\n".join(lines)
    print(table)
    (out / "summary.json").write_text(json.dumps({
        "config": dataclasses.asdict(cfg), "seeds": seeds, "coef": args.coef,
        "teacher": teacher_info, "curves": results,
        "wall_seconds": time.perf_counter() - t0}, indent=1))
    (out / "table.md").write_text(table + "\n")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    (out / "PRODUCED_BY.txt").write_text(f"python experiments/lvopd_babyai.py "
                                         f"{' '.join(argv or sys.argv[1:])} at {rev}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
