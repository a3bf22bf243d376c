"""The BabyAI credit-assignment experiment's original standalone loop (vmapped over seeds,
one jitted program per method), kept for ``experiments/lvopd_babyai.py``, which builds its
LVOPD variants on it. ``experiments/lvrl_babyai.py`` now runs through the library trainer
(``policy.kind: symbolic_mlp`` on ``env.name: babyai_jax``) and re-exports these names.

``features(obs)`` is the one-hot symbolic view of a ``BabyAIObs`` (the library's
``jaxdm.rl.jax_envs.babyai_features`` computes the same from the trainer's observation
rows); the MLP is ``jaxdm.rl.symbolic``'s.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from jaxdm.envs.babyai import BabyAIParams
from jaxdm.envs.babyai.value import distance_field, plan_length_from_field, value_from_length
from jaxdm.rl import advantages as advmod
from jaxdm.rl.losses import ppo_loss
from jaxdm.rl.symbolic import init_mlp, mlp  # noqa: F401 - re-exported
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
