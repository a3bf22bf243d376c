"""jaxdm.rl: group advantages, the PPO loss, the multi-turn rollout engine, policies and the
RL trainer (seed 000 Algorithm 1, seed 001 PPO/LVRL) as a loop over registered stages:
``signals`` (teacher scores, critic values, LVRL values), ``estimators`` (grpo, teacher,
gigpo, gae, lvrl) and loss ``terms`` (ppo, value), with the whole ``state.TrainState``
checkpointed by orbax.

Pure functions (jit-compatible, shapes checked) live in ``advantages`` and ``losses``; the
host-side machinery (rollout engine, trainer, checkpoints) imports lazily so that importing
``jaxdm.rl`` for the formulas stays light.
"""
from jaxdm.rl.advantages import (anchor_ids_from_observations, broadcast_to_tokens,
                                 discounted_step_returns, gae_advantages, gigpo_advantages,
                                 grpo_outcome_advantages, group_stats, lvrl_advantages,
                                 teacher_advantages)
from jaxdm.rl.losses import (AGGREGATIONS, PPOTerms, aggregate, clipped_value_loss, k3_kl,
                             ppo_loss, ppo_token_terms)

__all__ = [
    "grpo_outcome_advantages", "teacher_advantages", "lvrl_advantages", "gigpo_advantages",
    "discounted_step_returns", "gae_advantages", "anchor_ids_from_observations", "broadcast_to_tokens",
    "group_stats", "ppo_loss", "ppo_token_terms", "aggregate", "k3_kl", "PPOTerms",
    "AGGREGATIONS", "clipped_value_loss",
]
