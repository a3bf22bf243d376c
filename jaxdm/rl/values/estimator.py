"""The LVRL advantage estimator: anchored value differences, GRPO fallback per trajectory.

``lvrl_step_advantages`` is what the ``lvrl`` estimator computes from the ``values`` signal
(seed 001 §3.2; SPEC §5 and §10):

- rows whose value query succeeded (``value_rows``) get A_t = V(s_{t+1}) − V(s_t) with
  V(s_0) = p̂_u and V(s_{T_i}) = R_i (``jaxdm.rl.advantages.lvrl_advantages``); these
  **replace** the GRPO advantage (no λ);
- rows whose value query failed (missing, short or malformed values, a dead endpoint) fall
  back to their GRPO outcome advantage (``grpo_outcome_advantages``), so a failing value
  model never stops training; the caller counts and logs them.

Pure and jit-compatible; ``normalize`` and ``num_groups`` are static.
"""
from __future__ import annotations

import jax.numpy as jnp

from jaxdm.rl.advantages import (LVRL_NORMALIZATIONS, grpo_outcome_advantages,
                                 lvrl_advantages)

__all__ = ["lvrl_step_advantages", "LVRL_NORMALIZATIONS"]


def lvrl_step_advantages(values, value_rows, rewards, returns, group_ids, mask, *,
                         num_groups: int, normalize: str = "rms", kept=None,
                         eps: float = 1e-6):
    """LVRL step advantages [B, T] with a per-row GRPO fallback.

    Args:
      values: [B, T + 1] float, V(s_0)..V(s_T) (anchored slots and slots past T_i ignored;
        rows not in ``value_rows`` may hold anything finite).
      value_rows: [B] bool, rows whose values are real.
      rewards: [B] float, R_i (the anchors).
      returns: [B, T] float, per-action outcome returns for the GRPO fallback (R_i minus
        the invalid-action penalty, as in ``grpo_outcome_advantages``).
      group_ids: [B] int; mask: [B, T] bool executed actions (a prefix of each row).
      num_groups: static number of task groups.
      normalize: "none" or "rms" (see ``lvrl_advantages``); the rms scale is taken over the
        rows with values only.
      kept: [B] bool, rows not lost to an env error (default: all): only they make the
        anchor p̂_u (an errored row has an all-False ``mask`` and gets 0 anyway).
      eps: stabiliser of both estimators.

    Returns:
      [B, T] float32, 0 where ``mask`` is False.
    """
    value_rows = jnp.asarray(value_rows)
    a_lvrl = lvrl_advantages(values, rewards, group_ids, mask, num_groups=num_groups,
                             normalize=normalize, value_rows=value_rows, kept=kept,
                             eps=eps)
    a_grpo = grpo_outcome_advantages(returns, group_ids, mask, num_groups=num_groups, eps=eps)
    return jnp.where(value_rows[:, None], a_lvrl, a_grpo)
