"""LVOPD on BabyAI (seed 001 §4.3, CPU-sized): LVRL alone vs LVRL + LVOPD vs pure OPD vs
trajectory-gated OPD, distilling a weak student from an SFT teacher.

Setup: the LVRL BabyAI experiment's env, student MLP, rollout, LVRL advantages (Oracle
values, q ** plan length) and PPO loss (``experiments/lvrl_babyai.py``, imported). The
teacher is the same MLP trained by SFT (cross-entropy) on the greedy actions of the
shortest-path agent (``jaxdm.rl.mc_validation.field_policy`` with eps = 0, a BFS solver) at
the states a noisy (eps = 0.3) version of it visits on training layouts. Every method
minimises the LVRL clipped surrogate plus ``coef`` · Σ w_a · KL(π_student ‖ π_teacher) /
#actions, with the gate w from ``jaxdm.rl.distill.GATES`` computed on the host over the
whole iteration batch (LVRL advantages are already batch-normalised, so normalize="none"):

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
from jaxdm.rl import mc_validation as mc  # noqa: E402
from jaxdm.rl.distill import gate_weights, lvopd_distill_loss  # noqa: E402

METHODS = {"lvrl": None, "lvrl_lvopd": "lvopd", "opd_pure": "pure",
           "opd_trajectory": "trajectory"}


def sft_teacher(env, cfg, key, *, episodes: int, steps: int, eps: float = 0.3):
    """(teacher MLP params, its greedy-label accuracy on held-out visited states)."""
    params_env = BabyAIParams.for_split("train", max_steps=cfg.max_steps)
    ep = mc.babyai_record_episodes(env, params_env, key, episodes, eps)
    h = ep.actions.shape[1] + 1
    ii, tt = np.nonzero(np.arange(h)[None] < ep.lengths[:, None])
    states = jax.tree.map(lambda x: x[ii, tt], ep.states)
    labels = jax.vmap(mc.field_policy, in_axes=(None, 0, 0, None))(
        jax.random.key(0), states, ep.fields[ii], 0.0)
    feats = lb.features(jax.vmap(env.get_obs)(states))
    n = feats.shape[0]
    perm = np.random.default_rng(0).permutation(n)
    test, train = perm[: n // 10], perm[n // 10:]
    opt = optax.adam(1e-3)
    params = lb.init_mlp(jax.random.fold_in(key, 1), [lb.FEAT, cfg.hidden, cfg.hidden,
                                                     lb.NUM_ACT])
    state = opt.init(params)

    @jax.jit
    def step(params, state, idx):
        def loss(p):
            lp = jax.nn.log_softmax(lb.mlp(p, feats[idx]))
            return -jnp.mean(jnp.take_along_axis(lp, labels[idx][:, None], -1))
        g = jax.grad(loss)(params)
        up, state = opt.update(g, state, params)
        return optax.apply_updates(params, up), state

    rng = np.random.default_rng(1)
    for _ in range(steps):
        params, state = step(params, state, jnp.asarray(rng.choice(train, 512)))
    acc = float(jnp.mean(jnp.argmax(lb.mlp(params, feats[test]), -1) == labels[test]))
    return params, acc


def make_collect(env, cfg):
    train_params = BabyAIParams.for_split("train", max_steps=cfg.max_steps)

    def collect(params, teacher, key):
        k_task, k_roll, k_noise = jax.random.split(key, 3)
        batch = lb.rollout(env, params, k_roll, train_params,
                           jax.random.split(k_task, cfg.groups), cfg.group_size, True,
                           cfg.max_steps, cfg.oracle_q or None)
        adv, _ = lb.advantages(batch, None, cfg, "lvrl_oracle", k_noise)
        t_lp = jax.nn.log_softmax(lb.mlp(teacher, batch["feats"]))
        return batch, adv, t_lp

    return collect


def make_update(cfg, optimizer, coef: float):
    def update(params, opt_state, data, key):
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


def run_method(env, cfg, method, teacher, seeds, coef, log) -> dict:
    gate = METHODS[method]
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    collect = jax.jit(jax.vmap(make_collect(env, cfg), in_axes=(0, None, 0)))
    update = jax.jit(jax.vmap(make_update(cfg, optimizer, 0.0 if gate is None else coef)))
    ev_id = jax.jit(jax.vmap(lb.make_eval(env, cfg, "id_test")))
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    params, opt_state = jax.vmap(lambda k: lb.init_state(k, cfg, optimizer))(
        jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys))
    curves = {"train": [], "kl": [], "id_iter": [], "id": []}
    for it in range(cfg.iterations):
        if it % cfg.eval_every == 0 or it == cfg.iterations - 1:
            ek = jax.vmap(lambda k: jax.random.fold_in(k, 10_000 + it))(keys)
            sid = np.asarray(ev_id(params, ek))
            curves["id_iter"].append(it)
            curves["id"].append(sid.tolist())
        ik = jax.vmap(lambda k: jax.random.fold_in(k, 1 + it))(keys)
        batch, adv, t_lp = collect(params, teacher, ik)
        mask, adv_h = np.asarray(batch["mask"]), np.asarray(adv, np.float32)
        w = np.stack([gate_weights(gate or "pure", adv_h[s], mask[s],
                                   success=np.asarray(batch["success"][s]), normalize="none")
                      for s in range(len(seeds))])
        data = {"feats": batch["feats"], "actions": batch["actions"], "logp": batch["logp"],
                "mask": batch["mask"], "adv": adv, "targets": jnp.zeros(mask.shape),
                "old_v": jnp.zeros(mask.shape), "t_lp": t_lp, "w": jnp.asarray(w)}
        params, opt_state, kl = update(params, opt_state, data,
                                       jax.vmap(lambda k: jax.random.fold_in(k, 7))(ik))
        succ = np.asarray(batch["success"]).mean(1)
        curves["train"].append(succ.tolist())
        curves["kl"].append(np.asarray(kl).tolist())
        log({"method": method, "iteration": it, "train_success": succ.tolist(),
             "kl": np.asarray(kl).tolist(), "gate_mean": float(w[mask].mean())})
        print(f"  {method} it {it:3d} train {succ.mean():.3f} kl {np.mean(kl):.3f} "
              f"gate {w[mask].mean():.2f}", flush=True)
    return curves


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
    sft_episodes, sft_steps = 512, 3000
    if args.quick:
        cfg = dataclasses.replace(cfg, iterations=3, eval_every=2, eval_episodes=16, groups=4,
                                  group_size=4, max_steps=32)
        sft_episodes, sft_steps = 64, 300
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
    teacher, acc = sft_teacher(env, cfg, jax.random.key(123), episodes=sft_episodes,
                               steps=sft_steps)
    ev = jax.jit(lb.make_eval(env, cfg, "train"))
    ev_id = jax.jit(lb.make_eval(env, cfg, "id_test"))
    t_train = float(ev({"pi": teacher}, jax.random.key(5)))
    t_id = float(ev_id({"pi": teacher}, jax.random.key(6)))
    print(f"SFT teacher: label accuracy {acc:.3f}, success train layouts {t_train:.3f}, "
          f"ID {t_id:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    log_f = open(out / "metrics.jsonl", "w")

    def log(rec):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    log({"teacher_label_accuracy": acc, "teacher_train_success": t_train,
         "teacher_id_success": t_id})
    results = {m: run_method(env, cfg, m, teacher, seeds, args.coef, log) for m in methods}
    log_f.close()
    lines = ["| method | train success (last 5 it.) | final ID success % (mean ± std) |",
             "|---|---|---|"]
    for m, c in results.items():
        tr = np.asarray(c["train"])[-5:].mean()
        fin = np.asarray(c["id"][-1]) * 100
        lines.append(f"| {m} | {tr:.3f} | {fin.mean():.1f} ± {fin.std():.1f} |")
    table = "\n".join(lines)
    print(table)
    (out / "summary.json").write_text(json.dumps({
        "config": dataclasses.asdict(cfg), "seeds": seeds, "coef": args.coef,
        "teacher": {"label_accuracy": acc, "train_success": t_train, "id_success": t_id},
        "curves": results, "wall_seconds": time.perf_counter() - t0}, indent=1))
    (out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
