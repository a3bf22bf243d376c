"""Rollout kinds (a registry): how the trainer gets one iteration's ``EpisodeBatch``.

A rollout kind is ``RolloutKind(make, envs, estimators, value_kinds, env_factory, check)``:
``make(cfg, policy, trainer_parts) -> collector`` with ``collect(params, key, first_seed) ->
(EpisodeBatch, metrics)`` (``train/...``, ``env/errors``, ``time/...``; ``first_seed`` is
``train_task_offset`` + the data cursor), ``evaluate(params, num_tasks, **options) -> eval
metrics`` (``eval/All`` and ``eval/table`` among them) and ``close()``; ``envs()`` the env
names it plays, and the estimators / LVRL value-model kinds it can feed (None: all);
``trainer_parts["dist"]`` is the trainer's distribution seam (``jaxdm.rl.distributed``).
The policy kind picks the rollout kind (``jaxdm.rl.build.POLICY_KINDS``);
``check_rollout(cfg)`` (called by ``TrainConfig`` validation) refuses bad combinations
naming the config key, ``check(cfg)`` the kind's own settings. A new kind is one
``jaxdm.rl.build.register_rollout_kind`` call (with the policy kind that plays it).

- ``host``: the text policies on host-side text envs (``jaxdm.rl.rollout.rollout`` over a
  ``LocalVectorEnv``/``VectorEnv``, ``episode_batch`` of its records, held-out evaluation by
  ``jaxdm.rl.evaluation``);
- ``jax``: the symbolic policy on pure-JAX envs, one jitted scan (``jaxdm.rl.jax_rollout``);
- ``harness`` (registered by ``jaxdm.train.harness_rollout``, a higher layer: it needs the
  harness): GRPO of a decision model inside the agent harness on DECISION GYM.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from jaxdm.registry import Registry
from jaxdm.rl.env_factories import ENV_FACTORIES, make_venv
from jaxdm.rl.estimators import episode_batch
from jaxdm.rl.evaluation import evaluate
from jaxdm.rl.jax_envs import JAX_ENVS
from jaxdm.rl.jax_rollout import JaxCollector
from jaxdm.rl.rollout import rollout

__all__ = ["RolloutKind", "ROLLOUT_KINDS", "HostCollector", "check_rollout"]


class HostCollector:
    """Rollout kind ``host`` (see module docstring)."""

    def __init__(self, cfg, policy, train_factory, eval_factory, *, dist):
        self.cfg, self.policy, self.eval_factory, self.dist = cfg, policy, eval_factory, dist
        self.venv = make_venv(cfg, train_factory, dist.local_tasks * cfg.group_size,
                              cfg.group_size)
        self._eval_venv = None

    def collect(self, params, key, first_seed: int):
        """(EpisodeBatch, ``train/*`` / ``env/errors`` / ``time/*`` metrics) of this
        process's groups; the metrics cover every process's episodes (``dist``)."""
        cfg = self.cfg
        policy, params, seed, key = self.dist.rollout_args(self.policy, params, first_seed, key)
        res = rollout(policy, params, self.venv, seed=seed, key=key,
                      max_actions=cfg.max_actions, env_name=cfg.env.name,
                      pipeline=cfg.rollout_pipeline)
        self.dist.finish_rollout()
        eb = episode_batch(res.episodes, cfg.max_actions, cfg.algo.invalid_penalty)
        episodes = self.dist.episodes_view(res.episodes)
        errors = sum(bool(e.error) for e in episodes)
        kept = [e for e in episodes if not e.error]
        n_act = np.array([len(e.actions) for e in kept]) if kept else np.zeros(1)
        invalid = np.array([not a.valid for e in kept for a in e.actions], bool)
        return eb, {
            "train/success": float(np.mean([e.success for e in kept])) if kept else 0.0,
            "train/reward": float(np.mean([e.reward for e in kept])) if kept else 0.0,
            "train/actions": float(n_act.mean()),
            "train/invalid_frac": float(invalid.mean()) if invalid.size else 0.0,
            "train/truncated_frac": float(np.mean([e.truncated for e in kept])) if kept
            else 0.0,
            "env/errors": float(errors),
            "time/generation": res.generation_s, "time/env": res.env_s,
            "time/env_overlapped": res.overlap_s}

    def evaluate(self, params, num_tasks: int, **kwargs):
        """``jaxdm.rl.evaluation.evaluate`` (``kwargs``: its ``values``, ``iteration``)."""
        if self._eval_venv is None or self._eval_venv.num_envs != num_tasks:
            if self._eval_venv is not None:
                self._eval_venv.close()
            self._eval_venv = make_venv(self.cfg, self.eval_factory, num_tasks, 1)
        return evaluate(self.policy, params, self._eval_venv, self.cfg, **kwargs)

    def close(self) -> None:
        """Close the training and evaluation env pools (their worker processes or actors)."""
        for v in (self.venv, self._eval_venv):
            if v is not None:
                v.close()


def _host_make(cfg, policy, parts):
    return HostCollector(cfg, policy, parts["train_factory"], parts["eval_factory"],
                         dist=parts["dist"])


def _jax_make(cfg, policy, parts):
    if parts["dist"].processes > 1:
        raise ValueError(f"policy.kind={cfg.policy.kind!r}: the jax rollout runs in one "
                         f"process (multi-process training plays host envs only)")
    return JaxCollector(cfg, policy, with_values=parts["with_values"])


def _host_envs():
    return set(ENV_FACTORIES)


def _jax_envs():
    return set(JAX_ENVS)


@dataclasses.dataclass(frozen=True)
class RolloutKind:
    """One rollout kind (module docstring); ``check(cfg)``: its own settings, ValueError
    naming the key."""

    make: Callable[[Any, Any, dict], Any]
    envs: Callable[[], set]
    estimators: tuple[str, ...] | None = None   # None: every registered estimator
    value_kinds: tuple[str, ...] | None = None  # None: every value model
    env_factory: bool = True                    # env.factory ('module:callable') allowed
    check: Callable[[Any], None] | None = None


ROLLOUT_KINDS: Registry[RolloutKind] = Registry("rollout kind")
ROLLOUT_KINDS.register("host", RolloutKind(_host_make, _host_envs))
# Text-reading estimators (teacher, gigpo) and text value models need rendered text.
ROLLOUT_KINDS.register("jax", RolloutKind(_jax_make, _jax_envs, estimators=(
                                              "grpo", "gae", "lvrl", "grpo_shaped",
                                              "gae_shaped"),
                                          value_kinds=("oracle",), env_factory=False))


def check_rollout(cfg, kind_name: str) -> None:
    """ValueError naming the key when ``cfg`` asks what rollout ``kind_name`` cannot do."""
    kind = ROLLOUT_KINDS[kind_name]
    envs = kind.envs()
    if cfg.env.factory and not kind.env_factory:
        raise ValueError(f"env.factory: policy.kind={cfg.policy.kind!r} plays registered "
                         f"JAX envs only {sorted(envs)}")
    # (host: an unknown env.name is refused when the trainer builds its env factory)
    if not kind.env_factory and cfg.env.name not in envs:
        raise ValueError(f"env.name: {cfg.env.name!r} is not an env of policy.kind="
                         f"{cfg.policy.kind!r} (rollout {kind_name!r}); its envs: {sorted(envs)}")
    if kind.estimators is not None and cfg.algo.advantage not in kind.estimators:
        raise ValueError(f"algo.advantage: {cfg.algo.advantage!r} is not available with "
                         f"policy.kind={cfg.policy.kind!r}; available: {list(kind.estimators)}")
    vk = cfg.value.get("kind") if isinstance(cfg.value, dict) else None
    if kind.value_kinds is not None and cfg.value and vk not in kind.value_kinds:
        raise ValueError(f"value.kind: {vk!r} is not available with policy.kind="
                         f"{cfg.policy.kind!r}; available: {list(kind.value_kinds)}")
    if kind.check is not None:
        kind.check(cfg)
