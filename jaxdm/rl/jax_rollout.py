"""The rollout kind for pure-JAX envs: a jitted ``lax.scan`` over a vmapped ``env.step_env``.

``JaxCollector`` (rollout kind ``jax``, ``jaxdm.rl.collect.ROLLOUT_KINDS``) plays
``tasks_per_iter`` tasks x ``group_size`` episodes of a ``jaxdm.rl.jax_envs`` env with a
``SymbolicMLPPolicy`` in one compiled program and returns the same ``EpisodeBatch`` the
estimators read, built from the scan's arrays:

- task ``i`` of an iteration is task seed ``first_seed + i``; its episodes reset with
  ``jax.random.key(seed)`` (as the text envs do for an int seed) and step ``t`` is keyed with
  ``envs.core.step_key(seed, t)`` (the one per-step key schedule of every env loop; its int is
  split into the two 32-bit words of a threefry key);
- the policy samples with the trainer's device key (split per step); episodes run to success
  or the budget ``max_actions`` (the env truncates there), finished slots are frozen;
- ``units``: one int32 row per executed action, the observation row and the chosen action
  ([N, R + 1], row-major over (episode, step)); ``unit_logp`` the sampling log-probs;
- rewards: the env's (BabyAI: 1 on picking up the target); every action is valid (the action
  set is the env's), so there is no invalid-action penalty;
- ``recorded`` (only when a signal reads env states, else None): the env side as one
  ``envs.recorder.RecordedBatch`` whose ``states`` are the stacked env states [B, T + 1, ...]
  (the reset state, then the state after every step; finished slots repeat their last state),
  so a signal that is a pure function of env states
  (the privileged teacher of ``teacher_topk``, ``jaxdm.rl.babyai_teacher``) runs as one jitted
  vmapped pass over them after the scan;
- ``trajectories`` (= ``episodes``): ``Trajectory`` views built only when a signal reads them
  (action names, no-op annotations, the outcome; observations are not rendered as text) with
  ``metadata["oracle_values"]`` = V(s_0)..V(s_T) when the env's oracle is needed (the
  ``values`` signal with ``value.kind: oracle``; computed inside the scan: the env's
  ``oracle`` hooks). Text value models (``readout``, ``list``) and text-reading estimators
  (``teacher``, ``gigpo``) need the host rollout; ``ROLLOUT_KINDS`` lists what each supports.

Evaluation plays ``eval_tasks`` held-out tasks (seeds from ``eval_task_offset``) once per
eval seed on ``env.eval_kwargs`` ("All") and on each of the env's ``extra_eval`` splits, and
reports ``eval/<split>`` success %, its std over seeds and completion within each cutoff.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm import runlog
from jaxdm.envs.core import step_key
from jaxdm.envs.recorder import RecordedBatch, RecordedEpisode, RecordedStep, to_trajectory
from jaxdm.rl.estimators import EpisodeBatch
from jaxdm.rl.jax_envs import JaxEnvSpec, make_jax_env
from jaxdm.rl.lvopd import TEACHER_POLICIES
from jaxdm.rl.terms import signals_needed
from jaxdm.trajectory import Trajectory

__all__ = ["play", "step_key_data", "JaxCollector", "LazyTrajectories"]


def step_key_data(task_seeds: Sequence[int], num_steps: int) -> np.ndarray:
    """uint32 [T, G, 2] threefry key data of ``step_key(seed, t)`` (high, low 32-bit words)."""
    k = np.array([[step_key(s, t) for s in task_seeds] for t in range(num_steps)], np.uint64)
    return np.stack([k >> np.uint64(32), k & np.uint64(0xFFFFFFFF)], -1).astype(np.uint32)


def _play(params, key, task_seeds, step_keys, env_params, *, spec: JaxEnvSpec, policy,
          group_size: int, with_values: bool, greedy: bool, record_states: bool = False):
    env = spec.env
    seeds = jnp.repeat(task_seeds, group_size)
    b = seeds.shape[0]
    obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(jax.vmap(jax.random.key)(seeds),
                                                            env_params)
    if with_values:
        init, vfn = spec.oracle
        aux = jax.vmap(init)(state)

        def value(st):
            return jax.vmap(vfn)(aux, st).astype(jnp.float32)
    else:
        def value(st):
            return jnp.zeros((b,), jnp.float32)

    def body(carry, xs):
        obs, state, alive = carry
        k, kd = xs
        row = jax.vmap(spec.obs_row)(obs, state)
        logits = policy.logits(params, row)
        act = jnp.argmax(logits, -1) if greedy else jax.random.categorical(k, logits)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), act[:, None], -1)[:, 0]
        skeys = jax.random.wrap_key_data(jnp.repeat(kd, group_size, 0))
        obs2, state2, r, term, trunc, extra = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
            skeys, state, act, env_params)
        keep = lambda n, o: jnp.where(alive.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)  # noqa
        state2, obs2 = jax.tree.map(keep, state2, state), jax.tree.map(keep, obs2, obs)
        v = jnp.where(r > 0, 1.0, value(state2))
        out = {"row": row, "action": act.astype(jnp.int32), "logp": logp, "alive": alive,
               "reward": jnp.where(alive, r, 0.0), "value": v,
               "no_op": extra["no_op"] & alive, "truncated": trunc & ~term & alive}
        if record_states:
            out["state"] = state2
        return (obs2, state2, alive & ~(term | trunc)), out

    num_steps = step_keys.shape[0]
    init = (obs, state, jnp.ones((b,), bool))
    _, out = jax.lax.scan(body, init, (jax.random.split(key, num_steps), step_keys))
    out = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), out)       # [B, T, ...]
    out["value"] = jnp.concatenate([value(state)[:, None], out["value"]], 1)  # [B, T + 1]
    if record_states:  # [B, T + 1, ...]: the reset state, then the state after every step
        out["state"] = jax.tree.map(lambda s0, s: jnp.concatenate([s0[:, None], s], 1),
                                    state, out["state"])
    return out


_PLAY_CACHE: dict[tuple, Any] = {}


def play(spec: JaxEnvSpec, policy, *, group_size: int, with_values: bool,
         greedy: bool, record_states: bool = False):
    """The jitted ``(params, key, task_seeds [G], step_keys [T, G, 2], env_params) -> arrays``
    for these statics (compiled once per process per key; env params are traced);
    ``record_states`` adds ``state``: the env states [B, T + 1, ...]."""
    key = (spec.static_key, policy.static_key, group_size, with_values, greedy, record_states)
    if key not in _PLAY_CACHE:
        _PLAY_CACHE[key] = jax.jit(functools.partial(
            _play, spec=spec, policy=policy, group_size=group_size, with_values=with_values,
            greedy=greedy, record_states=record_states))
    return _PLAY_CACHE[key]


class LazyTrajectories(Sequence):
    """``Trajectory`` views of a JAX batch, each built on first access (see module doc)."""

    def __init__(self, spec: JaxEnvSpec, env_name: str, arrays: dict, mask, reward, seeds,
                 with_values: bool):
        self.spec, self.env_name, self.a, self.mask = spec, env_name, arrays, mask
        self.reward, self.seeds, self.with_values = reward, seeds, with_values
        self.lengths = mask.sum(1)
        self._cache: dict[int, Trajectory] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]
        if i not in self._cache:
            n, a, names = int(self.lengths[i]), self.a, self.spec.action_names
            steps = [RecordedStep("", names[x], 0.0, True, {"no_op": y}) for x, y in zip(
                a["action"][i, :n].tolist(), a["no_op"][i, :n].tolist())]
            meta = {"id": (int(self.seeds[i]), i)}
            if self.with_values:
                meta["oracle_values"] = a["value"][i, :n + 1].tolist()
            r = float(self.reward[i])
            # the one builder of played trajectories (envs.recorder.to_trajectory)
            ep = RecordedEpisode(i, i, 0, int(self.seeds[i]),
                                 goal=self.spec.goal_text(a["row"][i, 0]),
                                 budget=self.mask.shape[1], env=self.env_name, steps=steps,
                                 reward_sum=r, won=r > 0,
                                 truncated=bool(a["truncated"][i].any()))
            self._cache[i] = to_trajectory(ep, metadata=meta)
        return self._cache[i]


def _reads_env_states(cfg) -> bool:
    """Whether a configured signal reads the env states: the ``teacher_topk`` signal of a
    teacher policy with ``reads_states`` (``jaxdm.rl.lvopd.TEACHER_POLICIES``)."""
    if "teacher_topk" not in signals_needed(cfg):
        return False

    return TEACHER_POLICIES.get(cfg.teacher.kind, field="teacher.kind").reads_states


class JaxCollector:
    """Rollout kind ``jax`` (see module docstring)."""

    def __init__(self, cfg, policy, *, with_values: bool):
        self.cfg, self.policy, self.with_values = cfg, policy, with_values
        e = cfg.env
        self.spec = make_jax_env(e.name, e.kwargs, cfg.max_actions)
        self.eval_params = {"All": make_jax_env(e.name, dict(e.kwargs) | dict(e.eval_kwargs),
                                                cfg.max_actions).params}
        for name, kw in self.spec.extra_eval.items():
            self.eval_params[name] = make_jax_env(e.name, dict(e.kwargs) | dict(kw),
                                                  cfg.max_actions).params
        # Training rollouts record the env states when a signal reads them (EpisodeBatch.
        # recorded; otherwise None): recording costs +56 ms per 8 x 8 x 64 rollout
        # (115 -> 171 ms, loaded), so only then.
        self.record_states = _reads_env_states(cfg)
        self._train = play(self.spec, policy, group_size=cfg.group_size,
                           with_values=with_values, greedy=False,
                           record_states=self.record_states)

    def _run(self, fn, params, key, seeds: np.ndarray, env_params) -> dict[str, np.ndarray]:
        out = fn(params, key, jnp.asarray(seeds, jnp.int32),
                 jnp.asarray(step_key_data(seeds.tolist(), self.cfg.max_actions)), env_params)
        return jax.tree.map(np.asarray, out)

    def collect(self, params, key, first_seed: int) -> tuple[EpisodeBatch, dict[str, Any]]:
        """Play one iteration in one jitted program: tasks_per_iter groups of group_size episodes
        from seed ``first_seed``; the EpisodeBatch (with the stacked env states recorded) and the
        rollout's metrics (play time, success, lengths)."""
        cfg = self.cfg
        g, k = cfg.tasks_per_iter, cfg.group_size
        seeds = first_seed + np.arange(g)
        t0 = time.perf_counter()
        a = self._run(self._train, params, key, seeds, self.spec.params)
        play_s = time.perf_counter() - t0
        mask = a["alive"]
        b, t = mask.shape
        n = mask.sum(1)
        reward = a["reward"].sum(1).astype(np.float32)
        step_r = np.zeros((b, t), np.float32)
        ended = n > 0
        step_r[np.arange(b)[ended], n[ended] - 1] = reward[ended]
        rows, cols = np.nonzero(mask)
        units = np.concatenate([a["row"][mask], a["action"][mask][:, None]], 1)
        groups = np.repeat(np.arange(g, dtype=np.int32), k)
        trajs = LazyTrajectories(self.spec, cfg.env.name, a, mask, reward,
                                 np.repeat(seeds, k), self.with_values)
        success = reward > 0
        dones = np.zeros((b, t), bool)
        dones[np.arange(b)[ended], n[ended] - 1] = True
        recorded = None if not self.record_states else RecordedBatch(
            actions=np.where(mask, a["action"], 0), rewards=a["reward"].astype(np.float32),
            dones=dones, valid=mask.copy(), mask=mask, lengths=n.astype(np.int32),
            task_seeds=np.repeat(seeds, k).astype(np.int64), groups=groups, outcome=reward,
            success=success, truncated=a["truncated"].any(1), errored=np.zeros(b, bool),
            states=a["state"])
        eb = EpisodeBatch(trajs, trajs, mask, np.where(mask, reward[:, None], 0.0).astype(
            np.float32), step_r, reward, groups, np.zeros((b, t), bool), np.zeros(b, bool),
            units, rows.astype(np.int64), cols.astype(np.int64),
            a["logp"][mask].astype(np.float32), recorded)
        all_fail = np.array([not success[groups == j].any() for j in range(g)])
        metrics = {
            "train/success": float(success.mean()), "train/reward": float(reward.mean()),
            "train/actions": float(n.mean()), "train/invalid_frac": 0.0,
            "train/truncated_frac": float(a["truncated"].any(1).mean()), "env/errors": 0.0,
            "train/all_fail_groups": float(all_fail.mean()),
            "time/generation": play_s, "time/env": 0.0, "time/env_overlapped": 0.0,
            "rollout/env_steps": float(n.sum()),
            "rollout/env_steps_per_s": float(b * t / max(play_s, 1e-9)),
        }
        return eb, metrics

    def evaluate(self, params, num_tasks: int, **_options) -> dict[str, Any]:
        """Success per split (see module docstring); the host evaluation's options (value
        curves of a text value model) do not apply."""
        cfg = self.cfg
        fn = play(self.spec, self.policy, group_size=1, with_values=False,
                  greedy=cfg.eval_greedy)
        seeds = cfg.eval_task_offset + np.arange(num_tasks)
        summary: dict[str, Any] = {}
        rows = []
        for split, env_params in self.eval_params.items():
            per_seed = []
            for s in cfg.eval_seeds:
                a = self._run(fn, params, jax.random.key(s), seeds, env_params)
                ok, n = a["reward"].sum(1) > 0, a["alive"].sum(1)
                per_seed.append([100.0 * ok.mean()] + [100.0 * (ok & (n <= c)).mean()
                                                      for c in cfg.eval_cutoffs])
            per_seed = np.asarray(per_seed)
            summary[f"eval/{split}"] = float(per_seed[:, 0].mean())
            summary[f"eval/{split}_std"] = float(per_seed[:, 0].std())
            row = {"type": split, "success %": f"{per_seed[:, 0].mean():.1f} ± "
                                                f"{per_seed[:, 0].std():.1f}"}
            for j, c in enumerate(cfg.eval_cutoffs):
                summary[f"eval/{split}@{c}"] = float(per_seed[:, 1 + j].mean())
                row[f"@{c}"] = summary[f"eval/{split}@{c}"]
            rows.append(row)
        summary["eval/table"] = runlog.format_table(
            rows, ["type", "success %", *[f"@{c}" for c in cfg.eval_cutoffs]])
        return summary

    def close(self) -> None:
        """Nothing to close: the jax rollout holds no worker processes."""
        pass
