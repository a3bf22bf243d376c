"""The BabyAI credit-assignment experiment (seed 001 §4.2, CPU-sized): GRPO vs PPO (learned
critic, GAE) vs LVRL with the Oracle value and a noisy Oracle.

Setup (our CPU-scale choices; the seed trains Qwen3 policies on text observations):

- Env: the JAX BabyAI six-room pickup world (``jaxdm.envs.babyai``), vmapped and jitted;
  training and ID evaluation on door distance 1-3 ("train" / "id_test" layouts), OOD on 4-5
  ("ood_test"); rooms of size 7 (``--room-size``; BabyAI's default is 8) and 128 steps per
  episode (``--max-steps``), where a random policy's groups all fail. Reward 1 for picking
  up the target, else 0.
- Policy: a small JAX MLP on the **symbolic 7 x 7 view** (MiniGrid's (type, colour, state)
  encoding, one-hot), the heading and the mission (target type and colour), 2 x 128 tanh,
  a softmax over the 6 effective actions (left, right, forward, pickup, drop, toggle;
  MiniGrid's no-op "done" is left out). PPO's critic is a separate MLP of the same shape
  (kept separate so GRPO, LVRL and PPO train the identical policy network).
- Batches: 8 task groups x 8 rollouts per iteration (seed §B.2), all methods with the same
  seeds, task sampling, rollout budget, optimiser (Adam, lr 1e-3, global-norm clip 1.0),
  4 PPO epochs x 4 mini-batches, clip 0.2, entropy 0.01, no KL (there is no pretrained
  reference: the policy starts from scratch).
- Advantages, through the library's estimators: ``grpo_outcome_advantages`` (GRPO),
  ``gae_advantages`` (PPO; γ = 0.99, λ = 0.95, then batch-normalised as in PPO),
  ``lvrl_step_advantages`` (LVRL, "rms" normalisation) on the ``values`` signal, here
  the BabyAI Oracle (``jaxdm.envs.babyai.value``, geometric form V = q ** plan length,
  q = 0.9, 0 when the plan is longer than the steps left; see that module for why not the
  linear form) for every visited state, or that plus Gaussian noise (σ = ``--noise``, clipped to
  [0, 1]). For speed the plan length is read from the distance field of each episode's
  initial grid (``distance_field`` once per episode, ``plan_length_from_field`` per step),
  so later door openings are credited on the step through the door. The policy loss is
  ``jaxdm.rl.losses.ppo_loss``
  (one "token" per action); PPO adds a clipped value loss (coefficient 0.5).
- The rollout/recorder is written here (a vmapped ``lax.scan`` over the JAX env, which
  produces the trainer's batch arrays: actions, log-probs, executed-action mask, rewards,
  values [B, T + 1], group ids) and calls the estimators and loss terms directly: the text
  trainer's env loop steps host-side text envs and does not host a vmapped JAX env.
- The 3 seeds of a method run in one jitted program (vmap over seeds).

Outputs (``--out``): ``metrics.jsonl`` (per method, seed and iteration: train success,
ID/OOD success at evaluations, value-query count and seconds), ``success_curves.png``
(mean ± s.e. over seeds), ``summary.json`` and a Markdown table ``table.md``.

    python experiments/lvrl_babyai.py --quick          # smoke (< 1 min)
    python experiments/lvrl_babyai.py                  # the README run (~15 min on 2 cores)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.value import distance_field, plan_length_from_field, value_from_length
from jaxdm.rl import advantages as advmod
from jaxdm.rl.losses import ppo_loss
from jaxdm.rl.values.estimator import lvrl_step_advantages

NUM_ACT = 6  # left, right, forward, pickup, drop, toggle
METHODS = ("grpo", "ppo", "lvrl_oracle", "lvrl_noisy")


@dataclasses.dataclass(frozen=True)
class Config:
    groups: int = 8
    group_size: int = 8
    max_steps: int = 128
    iterations: int = 60
    eval_every: int = 10
    eval_episodes: int = 64
    lr: float = 1e-3
    epochs: int = 4
    minibatches: int = 4
    clip_eps: float = 0.2
    entropy_coef: float = 0.01
    value_coef: float = 0.5
    gamma: float = 0.99
    lam: float = 0.95
    noise: float = 0.2
    oracle_q: float = 0.9  # V = q ** plan length (0 = the linear form 1 - n / L)
    hidden: int = 128
    normalize: str = "rms"


# ---- policy -------------------------------------------------------------------------------
def features(obs) -> jax.Array:
    """Symbolic observation -> float features [.., 7*7*20 + 4 + 17]."""
    img = obs.image.astype(jnp.int32)
    parts = [jax.nn.one_hot(img[..., 0], 11), jax.nn.one_hot(img[..., 1], 6),
             jax.nn.one_hot(img[..., 2], 3)]
    view = jnp.concatenate(parts, -1).reshape(img.shape[:-3] + (-1,))
    return jnp.concatenate([view, jax.nn.one_hot(obs.direction, 4),
                            jax.nn.one_hot(obs.mission[..., 0], 11),
                            jax.nn.one_hot(obs.mission[..., 1], 6)], -1)


FEAT = 7 * 7 * 20 + 4 + 17


def init_mlp(key, sizes):
    params = []
    for k, (a, b) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        params.append({"w": jax.random.normal(k, (a, b)) * jnp.sqrt(1.0 / a),
                       "b": jnp.zeros((b,))})
    params[-1]["w"] = params[-1]["w"] * 0.1  # near-uniform initial policy, small critic
    return params


def mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def init_state(key, cfg: Config, optimizer):
    kp, kc = jax.random.split(key)
    params = {"pi": init_mlp(kp, [FEAT, cfg.hidden, cfg.hidden, NUM_ACT]),
              "critic": init_mlp(kc, [FEAT, cfg.hidden, cfg.hidden, 1])}
    return params, optimizer.init(params)


# ---- rollout / recorder -------------------------------------------------------------------
def rollout(env, params, key, env_params, task_keys, group_size: int, with_values: bool,
            max_steps: int, oracle_q: float | None = None):
    """One batch of episodes: task_keys [G] -> B = G * group_size rollouts (no auto-reset).

    Returns a dict of batch arrays: feats [B, T, F], actions [B, T], logp [B, T], mask
    [B, T] (executed actions), reward [B], group_ids [B], values [B, T + 1] (oracle, 0s when
    ``with_values`` is False), success [B].
    """
    g = task_keys.shape[0]
    keys = jnp.repeat(task_keys, group_size, axis=0)
    b = keys.shape[0]
    obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(keys, env_params)
    if with_values:  # the oracle's distance field of each episode's initial grid
        field = jax.vmap(distance_field)(state)

        def plan_fn(st):
            return jax.vmap(plan_length_from_field)(field, st)
    else:
        def plan_fn(st):
            return jnp.zeros((b,), jnp.int32)

    def value_fn(st):
        return value_from_length(plan_fn(st), st.step_count, max_steps, oracle_q)

    n0 = plan_fn(state)
    v0 = value_fn(state)

    def body(carry, k):
        obs, state, alive, reward = carry
        x = features(obs)
        logits = mlp(params["pi"], x)
        act = jax.random.categorical(k, logits)
        logp = jax.nn.log_softmax(logits)[jnp.arange(b), act]
        obs2, state2, r, term, trunc, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
            keys, state, act, env_params)
        sel = lambda n, o: jnp.where(alive.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)  # noqa
        state2 = jax.tree.map(sel, state2, state)
        obs2 = jax.tree.map(sel, obs2, obs)
        v = value_fn(state2)
        v = jnp.where(r > 0, 1.0, v)
        n = jnp.where(r > 0, 0, plan_fn(state2))
        out = (x, act, logp, alive, v, n)
        reward = reward + jnp.where(alive, r, 0.0)
        alive = alive & ~(term | trunc)
        return (obs2, state2, alive, reward), out

    init = (obs, state, jnp.ones((b,), bool), jnp.zeros((b,)))
    (_, _, _, reward), (x, act, logp, alive, v, n) = jax.lax.scan(
        body, init, jax.random.split(key, max_steps))
    values = jnp.concatenate([v0[None], v], 0).T                                # [B, T + 1]
    return {"feats": x.swapaxes(0, 1), "actions": act.T, "logp": logp.T, "mask": alive.T,
            "reward": reward, "group_ids": jnp.repeat(jnp.arange(g), group_size),
            "values": values, "success": reward > 0,
            # share of the initial plan length covered at the closest point of the episode
            "closest": 1.0 - jnp.minimum(n0, n.min(0)) / jnp.maximum(n0, 1)}


def gae(rewards, values, mask, gamma, lam):
    """GAE(γ, λ): rewards [B, T], values [B, T + 1], bootstrap 0 after the last executed
    action (the episode ends there: success or budget); ``jaxdm.rl.advantages``."""
    adv, _ = advmod.gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    return adv


def advantages(batch, critic_values, cfg: Config, method: str, key):
    mask = batch["mask"]
    rewards = batch["reward"]
    returns = jnp.where(mask, rewards[:, None], 0.0)
    if method == "grpo":
        return advmod.grpo_outcome_advantages(returns, batch["group_ids"], mask,
                                              num_groups=cfg.groups), None
    if method == "ppo":
        lengths = mask.sum(1)
        step_r = jnp.where(jnp.arange(mask.shape[1])[None] == lengths[:, None] - 1,
                           rewards[:, None], 0.0)
        adv = gae(step_r, critic_values, mask, cfg.gamma, cfg.lam)
        targets = adv + critic_values[:, :-1]
        n = jnp.maximum(mask.sum(), 1)
        mean = jnp.sum(jnp.where(mask, adv, 0)) / n
        std = jnp.sqrt(jnp.sum(jnp.where(mask, (adv - mean) ** 2, 0)) / n)
        return jnp.where(mask, (adv - mean) / (std + 1e-8), 0.0), targets
    values = batch["values"]
    if method == "lvrl_noisy":
        values = jnp.clip(values + cfg.noise * jax.random.normal(key, values.shape), 0, 1)
    rows = jnp.ones(mask.shape[0], bool)
    return lvrl_step_advantages(values, rows, rewards, returns, batch["group_ids"], mask,
                                num_groups=cfg.groups, normalize=cfg.normalize), None


def loss_fn(params, mb, cfg: Config, method: str):
    logits = mlp(params["pi"], mb["feats"])
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, mb["actions"][..., None], -1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
    loss, metrics = ppo_loss(logp, mb["logp"], None, mb["adv"], mb["mask"],
                             clip_eps=cfg.clip_eps, kl_coef=0.0, entropy=ent,
                             entropy_coef=cfg.entropy_coef)
    if method == "ppo":
        v = mlp(params["critic"], mb["feats"])[..., 0]
        v_clip = mb["old_v"] + jnp.clip(v - mb["old_v"], -cfg.clip_eps, cfg.clip_eps)
        err = jnp.maximum((v - mb["targets"]) ** 2, (v_clip - mb["targets"]) ** 2)
        vloss = 0.5 * jnp.sum(jnp.where(mb["mask"], err, 0)) / jnp.maximum(mb["mask"].sum(), 1)
        loss = loss + cfg.value_coef * vloss
        metrics = {**metrics, "loss/value": vloss}
    return loss, metrics


def make_iteration(env, cfg: Config, method: str, optimizer):
    train_params = BabyAIParams.for_split("train", max_steps=cfg.max_steps)
    with_values = True  # oracle values: the LVRL signal, and a progress metric for all

    def iteration(params, opt_state, key):
        k_task, k_roll, k_noise, k_perm = jax.random.split(key, 4)
        task_keys = jax.random.split(k_task, cfg.groups)
        batch = rollout(env, params, k_roll, train_params, task_keys, cfg.group_size,
                        with_values, cfg.max_steps, cfg.oracle_q or None)
        b, t = batch["mask"].shape
        critic_values = None
        if method == "ppo":
            last = jnp.concatenate([batch["feats"], batch["feats"][:, -1:]], 1)
            critic_values = mlp(params["critic"], last)[..., 0]
            lengths = batch["mask"].sum(1)
            critic_values = jnp.where(jnp.arange(t + 1)[None] >= lengths[:, None], 0.0,
                                      critic_values)
        adv, targets = advantages(batch, critic_values, cfg, method, k_noise)
        data = {"feats": batch["feats"], "actions": batch["actions"], "logp": batch["logp"],
                "mask": batch["mask"], "adv": adv,
                "targets": targets if targets is not None else jnp.zeros((b, t)),
                "old_v": critic_values[:, :-1] if critic_values is not None else jnp.zeros((b, t))}

        def epoch(carry, k):
            params, opt_state = carry
            perm = jax.random.permutation(k, b).reshape(cfg.minibatches, -1)

            def step(carry, idx):
                params, opt_state = carry
                mb = jax.tree.map(lambda a: a[idx], data)
                (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                    params, mb, cfg, method)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), m["ppo/entropy"]

            (params, opt_state), ent = jax.lax.scan(step, (params, opt_state), perm)
            return (params, opt_state), ent.mean()

        (params, opt_state), ent = jax.lax.scan(epoch, (params, opt_state),
                                                jax.random.split(k_perm, cfg.epochs))
        stats = {"success": batch["success"].mean(), "entropy": ent[-1],
                 "group_all_fail": jnp.mean(jax.ops.segment_max(
                     batch["success"].astype(jnp.int32), batch["group_ids"],
                     num_segments=cfg.groups) == 0),
                 "states_valued": jnp.where(method.startswith("lvrl"), batch["mask"].sum(), 0),
                 "closest": batch["closest"].mean(),
                 "final_value": jnp.take_along_axis(
                     batch["values"], batch["mask"].sum(1)[:, None], 1).mean(),
                 "value_gain": (jnp.take_along_axis(batch["values"], batch["mask"].sum(1)[:, None],
                                                    1)[:, 0] - batch["values"][:, 0]).mean(),
                 "episode_len": batch["mask"].sum(1).mean()}
        return params, opt_state, stats

    return iteration


def make_eval(env, cfg: Config, split: str):
    params_env = BabyAIParams.for_split(split, max_steps=cfg.max_steps)
    groups = cfg.eval_episodes

    def evaluate(params, key):
        k_task, k_roll = jax.random.split(key)
        batch = rollout(env, params, k_roll, params_env, jax.random.split(k_task, groups), 1,
                        False, cfg.max_steps)
        return batch["success"].mean()

    return evaluate


def run_method(env, cfg: Config, method: str, seeds, log) -> dict:
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(cfg.lr))
    it_fn = jax.jit(jax.vmap(make_iteration(env, cfg, method, optimizer)))
    ev_id = jax.jit(jax.vmap(make_eval(env, cfg, "id_test")))
    ev_ood = jax.jit(jax.vmap(make_eval(env, cfg, "ood_test")))
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    params, opt_state = jax.vmap(lambda k: init_state(k, cfg, optimizer))(
        jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys))
    curves = {"iteration": [], "train": [], "closest": [], "id_iter": [], "id": [], "ood": []}
    t_train = 0.0
    for it in range(cfg.iterations):
        if it % cfg.eval_every == 0 or it == cfg.iterations - 1:
            ek = jax.vmap(lambda k: jax.random.fold_in(k, 10_000 + it))(keys)
            sid, sood = np.asarray(ev_id(params, ek)), np.asarray(ev_ood(params, ek))
            curves["id_iter"].append(it)
            curves["id"].append(sid.tolist())
            curves["ood"].append(sood.tolist())
            log({"method": method, "iteration": it, "id_success": sid.tolist(),
                 "ood_success": sood.tolist()})
        t0 = time.perf_counter()
        ik = jax.vmap(lambda k: jax.random.fold_in(k, 1 + it))(keys)
        params, opt_state, stats = it_fn(params, opt_state, ik)
        stats = jax.tree.map(np.asarray, stats)
        dt = time.perf_counter() - t0
        if it > 0:
            t_train += dt
        curves["iteration"].append(it)
        curves["train"].append(stats["success"].tolist())
        curves["closest"].append(stats["closest"].tolist())
        log({"method": method, "iteration": it, "seconds": dt,
             **{k: v.tolist() for k, v in stats.items()}})
        print(f"  {method} it {it:3d} train {stats['success'].mean():.3f} "
              f"all-fail groups {stats['group_all_fail'].mean():.2f} "
              f"len {stats['episode_len'].mean():5.1f} closest {stats['closest'].mean():.3f} "
              f"{dt:5.2f}s", flush=True)
    curves["seconds_per_iteration"] = t_train / max(cfg.iterations - 1, 1)
    return curves


def iterations_to(curve_iters, values, level=0.5):
    """First evaluated iteration whose seed-mean success ≥ level (None if never)."""
    for it, v in zip(curve_iters, values):
        if np.mean(v) >= level:
            return it
    return None


def plot(results: dict, out: Path, cfg: Config) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for i, (m, c) in enumerate(results.items()):
        for ax, key, xs in ((axes[0], "train", c["iteration"]), (axes[1], "id", c["id_iter"]),
                            (axes[2], "ood", c["id_iter"]), (axes[3], "closest", c["iteration"])):
            arr = np.asarray(c[key])
            mean = arr.mean(1)
            se = arr.std(1, ddof=1) / np.sqrt(arr.shape[1]) if arr.shape[1] > 1 else 0 * mean
            ax.plot(xs, mean, label=m, color=f"C{i}")
            ax.fill_between(xs, mean - se, mean + se, color=f"C{i}", alpha=0.2)
    titles = ("success, train (d 1-3)", "success, ID eval (d 1-3)", "success, OOD eval (d 4-5)",
              "train: share of the plan covered at the closest point")
    for ax, title in zip(axes, titles):
        ax.set_title(f"BabyAI {title}", fontsize=9)
        ax.set_xlabel("iteration (8 groups x 8 rollouts)")
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel(f"success (mean ± s.e., budget {cfg.max_steps})")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "success_curves.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (< 1 min)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--noise", type=float)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--oracle-q", type=float, help="geometric oracle q (0: linear form)")
    ap.add_argument("--room-size", type=int, default=7, help="BabyAI room size (7, 8 or 9)")
    ap.add_argument("--out", default="experiments/results/lvrl_babyai")
    args = ap.parse_args(argv)
    cfg = Config()
    if args.quick:
        cfg = dataclasses.replace(cfg, iterations=3, eval_every=2, eval_episodes=16, groups=4,
                                  group_size=4, max_steps=32)
        args.out = args.out + "_quick"
    for name in ("iterations", "max_steps", "noise", "lr", "oracle_q"):
        if getattr(args, name) is not None:
            cfg = dataclasses.replace(cfg, **{name: getattr(args, name)})
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"unknown method(s) {bad}; known: {list(METHODS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = BabyAIEnv(args.room_size)
    log_f = open(out / "metrics.jsonl", "w")

    def log(rec):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    results = {}
    t0 = time.perf_counter()
    for m in methods:
        print(f"[{m}] seeds {seeds}", flush=True)
        results[m] = run_method(env, cfg, m, seeds, log)
    log_f.close()
    plot(results, out, cfg)
    summary = {"config": dataclasses.asdict(cfg), "seeds": seeds,
               "wall_seconds": time.perf_counter() - t0, "methods": {}}
    lines = ["| method | train success (last 10 it.) | plan share covered, first 5 it. -> last 10 "
             "| ID success % | OOD success % | iterations to 50 % ID | value queries / iteration "
             "| s / iteration |",
             "|---|---|---|---|---|---|---|---|"]
    for m, c in results.items():
        last_train = np.asarray(c["train"])[-10:].mean()
        close0, close1 = np.asarray(c["closest"])[:5].mean(), np.asarray(c["closest"])[-10:].mean()
        idf, oodf = np.asarray(c["id"][-1]), np.asarray(c["ood"][-1])
        se = lambda a: a.std(ddof=1) / np.sqrt(len(a)) if len(a) > 1 else 0.0  # noqa: E731
        to50 = iterations_to(c["id_iter"], c["id"])
        states = "states of 64 rollouts (Oracle, no tokens)" if m.startswith("lvrl") else "-"
        summary["methods"][m] = {"train_last10": float(last_train),
                                 "closest_first5": float(close0), "closest_last10": float(close1),
                                 "id": idf.tolist(),
                                 "ood": oodf.tolist(), "iterations_to_50_id": to50,
                                 "seconds_per_iteration": c["seconds_per_iteration"]}
        lines.append(f"| {m} | {last_train:.3f} | {close0:.3f} -> {close1:.3f} "
                     f"| {100 * idf.mean():.1f} ± {100 * se(idf):.1f} "
                     f"| {100 * oodf.mean():.1f} ± {100 * se(oodf):.1f} | "
                     f"{to50 if to50 is not None else '> ' + str(cfg.iterations)} | {states} | "
                     f"{c['seconds_per_iteration']:.2f} |")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wall {summary['wall_seconds']:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
