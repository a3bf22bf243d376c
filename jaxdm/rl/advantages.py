"""Group-relative advantage estimators for multi-turn agent RL (pure, jit-compatible).

Batch layout shared by every estimator here:

- ``B`` trajectories × ``T`` action slots. Slot ``t`` of row ``i`` is the ``t``-th executed
  action of trajectory ``i``; ``mask`` [B, T] bool marks executed actions (a prefix of each
  row for the estimators that need order, see ``lvrl_advantages``).
- ``group_ids`` [B] int in ``[0, num_groups)``: the task group ``u`` of each trajectory (the G
  rollouts of one task share an id). ``num_groups`` is static (it fixes segment shapes).

Everything returns ``[B, T]`` float32 arrays that are exactly 0 on unexecuted slots. Each
action's advantage is later spread to all of its generated tokens (``broadcast_to_tokens``).

References: GRPO (Shao et al., 2024); teacher-augmented GRPO (seed 000, eq. 2 and
Algorithm 1); LVRL (seed 001); GiGPO (Feng et al., 2025, "Group-in-Group Policy
Optimization for LLM Agent Training").
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "grpo_outcome_advantages",
    "teacher_advantages",
    "lvrl_advantages",
    "rms_scale",
    "gigpo_advantages",
    "discounted_step_returns",
    "gae_advantages",
    "potential_shaped_rewards",
    "process_grpo_advantages",
    "anchor_ids_from_observations",
    "broadcast_to_tokens",
    "group_stats",
]


# ---------------------------------------------------------------------------------------
# Shape checks (run at trace time: they see static shapes only).
# ---------------------------------------------------------------------------------------
def _check_bt(name: str, x, shape: tuple[int, int]) -> None:
    if x.ndim != 2 or tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape [B, T]={list(shape)}, got {list(x.shape)}")


def _check_layout(group_ids, mask, num_groups: int) -> tuple[int, int]:
    if mask.ndim != 2:
        raise ValueError(f"mask must be [B, T], got shape {list(mask.shape)}")
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    b, t = mask.shape
    if group_ids.shape != (b,):
        raise ValueError(f"group_ids must have shape [B]=[{b}], got {list(group_ids.shape)}")
    if not jnp.issubdtype(group_ids.dtype, jnp.integer):
        raise TypeError(f"group_ids must be integer, got {group_ids.dtype}")
    if not isinstance(num_groups, (int, np.integer)) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive static int, got {num_groups!r}")
    return b, t


def group_stats(values, group_of, valid, num_groups: int, *, ddof: int = 1):
    """Per-group count, mean, std (``ddof``), min and max of ``values`` where ``valid``.

    All three inputs have one common shape; ``group_of`` gives each element's group. Returns
    arrays of shape [num_groups]; empty groups have count 0 and mean/std 0. Used by every
    estimator so the statistics have one definition.
    """
    v = values.reshape(-1).astype(jnp.float32)
    g = group_of.reshape(-1)
    w = valid.reshape(-1)
    count = jax.ops.segment_sum(w.astype(jnp.float32), g, num_segments=num_groups)
    total = jax.ops.segment_sum(jnp.where(w, v, 0.0), g, num_segments=num_groups)
    mean = total / jnp.maximum(count, 1.0)
    dev = jnp.where(w, v - mean[g], 0.0)
    ss = jax.ops.segment_sum(dev * dev, g, num_segments=num_groups)
    std = jnp.sqrt(ss / jnp.maximum(count - ddof, 1.0))
    vmin = jax.ops.segment_min(jnp.where(w, v, jnp.inf), g, num_segments=num_groups)
    vmax = jax.ops.segment_max(jnp.where(w, v, -jnp.inf), g, num_segments=num_groups)
    return count, mean, std, vmin, vmax


def _normalise_in_groups(values, group_of, valid, num_groups, *, eps, divide_std=True):
    """(v − mean_g) / (std_g + eps) where valid; 0 for constant or single-element groups."""
    count, mean, std, vmin, vmax = group_stats(values, group_of, valid, num_groups)
    degenerate = (count < 2) | (vmax <= vmin)  # all equal or one element: no signal, no NaN
    centred = values.astype(jnp.float32) - mean[group_of]
    scale = (std[group_of] + eps) if divide_std else 1.0
    out = jnp.where(degenerate[group_of], 0.0, centred / scale)
    return jnp.where(valid, out, 0.0)


# ---------------------------------------------------------------------------------------
# GRPO outcome advantages and the teacher term (seed 000, Algorithm 1 lines 9-15).
# ---------------------------------------------------------------------------------------
def grpo_outcome_advantages(returns, group_ids, mask, *, num_groups: int, eps: float = 1e-6):
    """Outcome advantage over all executed actions of each group.

    A_out[i, t] = (R[i, t] − μ_u) / (σ_u + eps), where μ_u and σ_u are the mean and the
    **sample** standard deviation (ddof = 1) of R over every executed action (i, t) of group
    u = group_ids[i]. A group whose returns are all equal, or that has a single executed
    action, gets 0 (never NaN).

    Args:
      returns: [B, T] float, R[i, t]: the outcome return credited to action t (episode reward
        minus the invalid-action penalty on invalid actions).
      group_ids: [B] int in [0, num_groups).
      mask: [B, T] bool, executed actions.
      num_groups: static number of groups.
      eps: stabiliser added to σ_u (Table 7: 1e-6).

    Returns:
      [B, T] float32 advantages, 0 where ``mask`` is False.
    """
    returns, group_ids, mask = jnp.asarray(returns), jnp.asarray(group_ids), jnp.asarray(mask)
    b, t = _check_layout(group_ids, mask, num_groups)
    _check_bt("returns", returns, (b, t))
    group_of = jnp.broadcast_to(group_ids[:, None], (b, t))
    return _normalise_in_groups(returns, group_of, mask, num_groups, eps=eps)


def teacher_advantages(outcome_advantages, scores, group_ids, mask, *, num_groups: int,
                       lam: float = 0.5, score_mask=None):
    """Teacher-augmented advantage A = A_out + λ (s − s̄_u) (seed 000, eq. 2).

    s̄_u is the mean of the *scored* actions of group u (no division by their std: a group in
    which the teacher gives similar scores gets only small adjustments). Actions without a
    score (``score_mask`` False, e.g. a remote judge that timed out) are left out of s̄_u and
    get no teacher term, i.e. keep their outcome advantage.

    Args:
      outcome_advantages: [B, T] float, A_out (e.g. from ``grpo_outcome_advantages``).
      scores: [B, T] float in [0, 1], s[i, t] (ignored where not scored).
      group_ids: [B] int; mask: [B, T] bool executed actions; num_groups: static.
      lam: teacher weight λ (Table 7: 0.5).
      score_mask: [B, T] bool, which executed actions have a valid score (default: all).

    Returns:
      [B, T] float32, 0 where ``mask`` is False.
    """
    a_out, scores = jnp.asarray(outcome_advantages), jnp.asarray(scores)
    group_ids, mask = jnp.asarray(group_ids), jnp.asarray(mask)
    b, t = _check_layout(group_ids, mask, num_groups)
    _check_bt("outcome_advantages", a_out, (b, t))
    _check_bt("scores", scores, (b, t))
    if score_mask is None:
        scored = mask
    else:
        score_mask = jnp.asarray(score_mask)
        _check_bt("score_mask", score_mask, (b, t))
        if score_mask.dtype != jnp.bool_:
            raise TypeError(f"score_mask must be bool, got {score_mask.dtype}")
        scored = mask & score_mask
    group_of = jnp.broadcast_to(group_ids[:, None], (b, t))
    count, mean, _, _, _ = group_stats(scores, group_of, scored, num_groups)
    safe_scores = jnp.where(scored, scores.astype(jnp.float32), 0.0)
    term = jnp.where(scored, lam * (safe_scores - mean[group_of]), 0.0)
    return jnp.where(mask, a_out.astype(jnp.float32) + term, 0.0)


# ---------------------------------------------------------------------------------------
# LVRL step advantages from value differences (seed 001).
# ---------------------------------------------------------------------------------------
# Step-advantage normalisations of lvrl_advantages ("none": raw differences).
LVRL_NORMALIZATIONS = ("none", "rms")


def lvrl_advantages(values, rewards, group_ids, mask, *, num_groups: int,
                    normalize: str = "none", value_rows=None, kept=None, eps: float = 1e-6):
    """Step advantages A_t = V(s_{t+1}) − V(s_t) with LVRL's anchored values (seed 001 §3.2).

    The anchors replace the model's estimates at the two ends: V(s_0) = p̂_u, the mean
    reward of the group's kept trajectories (its success rate for 0/1 rewards; rows lost to
    an env error, ``kept`` False, are left out), and
    V(s_{T_i}) = R_i, the trajectory's observed reward, where T_i = number of executed
    actions (a truncated episode is anchored to its observed reward like any other). So each
    row telescopes to Σ_t A_t = R_i − p̂_u. When every rollout of a group fails both anchors
    are 0 but interior values still give a signal. A single-action episode gets R_i − p̂_u.

    Normalisation (the seed says "normalized consecutive value differences" without a
    formula; ours): ``"none"`` keeps the raw differences; ``"rms"`` divides every step
    advantage by one positive batch scalar, the root mean square of the step advantages over
    executed actions of the rows in ``value_rows`` (the batch std *without centring*), plus
    ``eps``. A positive scale keeps the sign of every step and of every row's total, and the
    telescoping sum becomes (R_i − p̂_u) / scale.

    Args:
      values: [B, T + 1] float, V(s_0)..V(s_T) (slots past T_i are ignored, as are the two
        anchored slots 0 and T_i).
      rewards: [B] float, R_i.
      group_ids: [B] int; mask: [B, T] bool executed actions, a prefix of each row;
      num_groups: static.
      normalize: "none" | "rms" (static).
      value_rows: [B] bool, the rows whose values are real (default: all); only they enter
        the "rms" scale (rows without values fall back to another estimator upstream).
      kept: [B] bool, the rows whose rewards make p̂_u (default: all); False for episodes
        lost to an env error, whose reward is not an outcome.
      eps: added to the "rms" scale.

    Returns:
      [B, T] float32 step advantages, 0 where ``mask`` is False.
    """
    values, rewards = jnp.asarray(values), jnp.asarray(rewards)
    group_ids, mask = jnp.asarray(group_ids), jnp.asarray(mask)
    b, t = _check_layout(group_ids, mask, num_groups)
    if values.shape != (b, t + 1):
        raise ValueError(f"values must have shape [B, T+1]={[b, t + 1]}, got {list(values.shape)}")
    if rewards.shape != (b,):
        raise ValueError(f"rewards must have shape [B]={[b]}, got {list(rewards.shape)}")
    if normalize not in LVRL_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {LVRL_NORMALIZATIONS}, got {normalize!r}")
    if value_rows is None:
        value_rows = jnp.ones((b,), bool)
    value_rows = jnp.asarray(value_rows)
    if value_rows.shape != (b,) or value_rows.dtype != jnp.bool_:
        raise ValueError(f"value_rows must be bool [B]=[{b}], got {value_rows.dtype} "
                         f"{list(value_rows.shape)}")
    kept = jnp.ones((b,), bool) if kept is None else jnp.asarray(kept)
    if kept.shape != (b,) or kept.dtype != jnp.bool_:
        raise ValueError(f"kept must be bool [B]=[{b}], got {kept.dtype} {list(kept.shape)}")
    rewards = rewards.astype(jnp.float32)
    _, p_hat, _, _, _ = group_stats(rewards, group_ids, kept, num_groups)
    lengths = mask.sum(axis=1)
    slot = jnp.arange(t + 1)[None, :]
    v = values.astype(jnp.float32)
    v = jnp.where(slot == 0, p_hat[group_ids][:, None], v)
    v = jnp.where(slot == lengths[:, None], rewards[:, None], v)  # terminal anchor wins at T_i=0
    adv = jnp.where(mask, v[:, 1:] - v[:, :-1], 0.0)
    if normalize == "rms":
        adv = adv / rms_scale(adv, mask & value_rows[:, None], eps)
    return adv


def rms_scale(adv, counted, eps: float):
    """LVRL's ``"rms"`` scale: the root mean square of ``adv`` [B, T] over the ``counted``
    entries (bool [B, T]; 1 entry if none), plus ``eps``. A multi-process run computes it on
    every process's rows (``jaxdm.rl.distributed``)."""
    adv, counted = jnp.asarray(adv), jnp.asarray(counted)
    n = jnp.maximum(counted.sum(), 1)
    return jnp.sqrt(jnp.sum(jnp.where(counted, adv * adv, 0.0)) / n) + eps


# ---------------------------------------------------------------------------------------
# GiGPO (Feng et al., 2025): episode-level + anchor-state step-level groups.
# ---------------------------------------------------------------------------------------
def discounted_step_returns(step_rewards, mask, *, gamma: float = 0.95):
    """R_t = Σ_{k ≥ t} γ^{k−t} r_k over executed actions of each row ([B, T] → [B, T])."""
    step_rewards, mask = jnp.asarray(step_rewards), jnp.asarray(mask)
    if step_rewards.shape != mask.shape:
        raise ValueError(f"step_rewards {list(step_rewards.shape)} and mask "
                         f"{list(mask.shape)} must have the same [B, T] shape")
    r = jnp.where(mask, step_rewards.astype(jnp.float32), 0.0)

    def back(carry, r_t):
        g = r_t + gamma * carry
        return g, g

    _, out = jax.lax.scan(back, jnp.zeros(r.shape[0], jnp.float32), r.T[::-1])
    return jnp.where(mask, out[::-1].T, 0.0)


def gigpo_advantages(episode_returns, step_rewards, anchor_ids, group_ids, mask, *,
                     num_groups: int, num_anchors: int, gamma: float = 0.95,
                     step_weight: float = 1.0, normalize_std: bool = True,
                     eps: float = 1e-6):
    """GiGPO advantage A = A^E + w · A^S, a comparison baseline for the teacher.

    - Episode level: A^E_i = (R_i − mean_u R) / (std_u R + eps) over the trajectories of
      group u (sample std, ddof = 1), the same for every action of trajectory i.
    - Step level: actions taken from *identical anchor observations* (same ``anchor_ids``,
      which must already be distinct across task groups) form a step group; each action's
      discounted return R_t = Σ γ^k r_{t+k} (γ = 0.95) is normalised within its step group.
    Groups that are constant or have a single member contribute 0 (never NaN).
    ``normalize_std=False`` gives GiGPO's mean-only ("mean_norm") variant at both levels.

    Args:
      episode_returns: [B] float, the trajectory's outcome reward R_i.
      step_rewards: [B, T] float, per-action rewards r_t (e.g. the outcome on the last action
        minus invalid-action penalties).
      anchor_ids: [B, T] int in [0, num_anchors), the anchor-state group of each action
        (``anchor_ids_from_observations`` builds them host-side).
      group_ids: [B] int; mask: [B, T] bool; num_groups, num_anchors: static.

    Returns:
      [B, T] float32, 0 where ``mask`` is False.
    """
    episode_returns = jnp.asarray(episode_returns)
    step_rewards, anchor_ids = jnp.asarray(step_rewards), jnp.asarray(anchor_ids)
    group_ids, mask = jnp.asarray(group_ids), jnp.asarray(mask)
    b, t = _check_layout(group_ids, mask, num_groups)
    if episode_returns.shape != (b,):
        raise ValueError(f"episode_returns must have shape [B]={[b]}, "
                         f"got {list(episode_returns.shape)}")
    _check_bt("step_rewards", step_rewards, (b, t))
    _check_bt("anchor_ids", anchor_ids, (b, t))
    if not isinstance(num_anchors, (int, np.integer)) or num_anchors < 1:
        raise ValueError(f"num_anchors must be a positive static int, got {num_anchors!r}")
    has_action = mask.any(axis=1)
    a_ep = _normalise_in_groups(episode_returns, group_ids, has_action, num_groups,
                                eps=eps, divide_std=normalize_std)
    step_returns = discounted_step_returns(step_rewards, mask, gamma=gamma)
    a_step = _normalise_in_groups(step_returns, anchor_ids, mask, num_anchors,
                                  eps=eps, divide_std=normalize_std)
    return jnp.where(mask, a_ep[:, None] + step_weight * a_step, 0.0)


# ---------------------------------------------------------------------------------------
# GAE with a learned critic (PPO baseline, seed 001 §B.2).
# ---------------------------------------------------------------------------------------
def gae_advantages(rewards, values, mask, *, gamma: float = 1.0, lam: float = 0.95,
                   bootstrap=None):
    """Generalised advantage estimation over each row's executed actions.

    δ_t = r_t + γ V(s_{t+1}) − V(s_t) and A_t = Σ_k (γλ)^k δ_{t+k}, summed backwards within
    the row's executed prefix. After the row's last executed action T_i − 1 the next value is
    V(s_{T_i}) when ``bootstrap[i]`` (a cut-off, non-terminal end) and 0 otherwise (a
    terminal state: "bootstrap 0 after terminal"). Slots past T_i are ignored.

    Args:
      rewards: [B, T] float, r_t (0 where not executed).
      values: [B, T + 1] float, V(s_0)..V(s_T).
      mask: [B, T] bool, executed actions, a prefix of each row.
      gamma, lam: discount γ and GAE λ.
      bootstrap: [B] bool, rows whose last state is not terminal (default: none).

    Returns:
      (advantages [B, T], returns [B, T] = advantages + V(s_t), the value targets), float32,
      0 where ``mask`` is False.
    """
    rewards, values, mask = jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask)
    if mask.ndim != 2 or mask.dtype != jnp.bool_:
        raise ValueError(f"mask must be bool [B, T], got {mask.dtype} {list(mask.shape)}")
    b, t = mask.shape
    _check_bt("rewards", rewards, (b, t))
    if values.shape != (b, t + 1):
        raise ValueError(f"values must have shape [B, T+1]={[b, t + 1]}, got {list(values.shape)}")
    boot = jnp.zeros((b,), bool) if bootstrap is None else jnp.asarray(bootstrap, bool)
    if boot.shape != (b,):
        raise ValueError(f"bootstrap must have shape [B]={[b]}, got {list(boot.shape)}")
    v = values.astype(jnp.float32)
    r = jnp.where(mask, rewards.astype(jnp.float32), 0.0)
    # next state's value counts if the next slot is executed, or at the end of a cut-off row
    next_live = jnp.concatenate([mask[:, 1:], jnp.zeros((b, 1), bool)], axis=1)
    is_last = mask & ~next_live
    next_ok = next_live | (is_last & boot[:, None])
    delta = r + gamma * jnp.where(next_ok, v[:, 1:], 0.0) - v[:, :-1]
    delta = jnp.where(mask, delta, 0.0)
    carry_ok = next_live.astype(jnp.float32)  # the running sum crosses into slot t + 1 only if live

    def back(carry, xs):
        d, c = xs
        a = d + gamma * lam * c * carry
        return a, a

    _, adv = jax.lax.scan(back, jnp.zeros((b,), jnp.float32), (delta.T[::-1], carry_ok.T[::-1]))
    adv = jnp.where(mask, adv[::-1].T, 0.0)
    return adv, jnp.where(mask, adv + v[:, :-1], 0.0)


def potential_shaped_rewards(rewards, potentials, mask, *, gamma: float = 1.0):
    """Potential-based shaping (Ng, Harada & Russell 1999) of each row's step rewards.

    r'_t = r_t + γ Φ(s_{t+1}) − Φ(s_t) over the executed actions, with Φ(s_{T_i}) := 0 after
    a row's last action (terminal or cut off): each row's shaped return is then
    Σ_t γ^t r'_t = Σ_t γ^t r_t − Φ(s_0), so shaping only moves credit between the steps of an
    episode (the same total LVRL's telescoping advantages keep, up to its anchors).

    Args:
      rewards: [B, T] float step rewards (0 where not executed).
      potentials: [B, T + 1] float, Φ(s_0)..Φ(s_T) (e.g. the LVRL value model's V).
      mask: [B, T] bool executed actions, a prefix of each row.
      gamma: the discount of the shaping term (1.0 for GRPO's undiscounted returns).

    Returns:
      [B, T] float32 shaped rewards, 0 where ``mask`` is False.
    """
    rewards, potentials, mask = (jnp.asarray(rewards), jnp.asarray(potentials),
                                 jnp.asarray(mask))
    if mask.ndim != 2 or mask.dtype != jnp.bool_:
        raise ValueError(f"mask must be bool [B, T], got {mask.dtype} {list(mask.shape)}")
    b, t = mask.shape
    _check_bt("rewards", rewards, (b, t))
    if potentials.shape != (b, t + 1):
        raise ValueError(f"potentials must have shape [B, T+1]={[b, t + 1]}, got "
                         f"{list(potentials.shape)}")
    phi = potentials.astype(jnp.float32)
    next_live = jnp.concatenate([mask[:, 1:], jnp.zeros((b, 1), bool)], axis=1)
    shaped = (rewards.astype(jnp.float32) + gamma * jnp.where(next_live, phi[:, 1:], 0.0)
              - phi[:, :-1])
    return jnp.where(mask, shaped, 0.0)


def process_grpo_advantages(step_rewards, group_ids, mask, *, num_groups: int,
                            eps: float = 1e-6):
    """GRPO with step rewards (DeepSeekMath §4.1.3, "process supervision").

    Every executed step's reward is normalised within its group, r̃ = (r − μ_u) / (σ_u + eps)
    with the mean and sample std over all executed steps of group u, and the advantage of
    step t is the sum of the normalised rewards from t on, A_t = Σ_{k ≥ t} r̃_k. A group whose
    step rewards are all equal gets 0.

    Args:
      step_rewards: [B, T] float, e.g. ``potential_shaped_rewards``.
      group_ids: [B] int in [0, num_groups); mask: [B, T] bool executed actions (a prefix).
      num_groups: static.

    Returns:
      [B, T] float32 step advantages, 0 where ``mask`` is False.
    """
    step_rewards, group_ids, mask = (jnp.asarray(step_rewards), jnp.asarray(group_ids),
                                     jnp.asarray(mask))
    b, t = _check_layout(group_ids, mask, num_groups)
    _check_bt("step_rewards", step_rewards, (b, t))
    cells = jnp.broadcast_to(group_ids[:, None], (b, t))
    normed = _normalise_in_groups(step_rewards, cells, mask, num_groups, eps=eps)
    return discounted_step_returns(normed, mask, gamma=1.0)


def anchor_ids_from_observations(observations: Sequence[Sequence[str]], group_ids,
                                 mask) -> tuple[np.ndarray, int]:
    """Host-side: integer anchor-state ids for GiGPO from the observation before each action.

    Two actions share an id iff their trajectories are in the same task group and they were
    taken from the same observation text. ``observations[i][t]`` is the text before action t
    of trajectory i (rows may be shorter than T; unexecuted slots get id 0 and are ignored).
    Returns (ids [B, T] int32, num_anchors).
    """
    mask = np.asarray(mask, bool)
    group_ids = np.asarray(group_ids)
    b, t = mask.shape
    if len(observations) != b:
        raise ValueError(f"observations has {len(observations)} rows, mask has B={b}")
    table: dict[tuple[int, str], int] = {}
    ids = np.zeros((b, t), np.int32)
    for i in range(b):
        for j in range(t):
            if not mask[i, j]:
                continue
            if j >= len(observations[i]):
                raise ValueError(f"observations[{i}] has {len(observations[i])} entries but "
                                 f"mask marks slot {j} executed")
            key = (int(group_ids[i]), observations[i][j])
            ids[i, j] = table.setdefault(key, len(table))
    return ids, max(len(table), 1)


# ---------------------------------------------------------------------------------------
# Action → token broadcast.
# ---------------------------------------------------------------------------------------
def broadcast_to_tokens(action_values, token_action_index, token_mask):
    """Give each token the value of the action that generated it.

    Args:
      action_values: [B, T] per-action values (advantages).
      token_action_index: [B, L] int, for each token the action slot t it belongs to.
      token_mask: [B, L] bool, generated (trainable) tokens.

    Returns:
      [B, L] float32 with action_values[b, token_action_index[b, l]] on generated tokens,
      0 elsewhere.
    """
    action_values = jnp.asarray(action_values)
    token_action_index, token_mask = jnp.asarray(token_action_index), jnp.asarray(token_mask)
    if action_values.ndim != 2:
        raise ValueError(f"action_values must be [B, T], got {list(action_values.shape)}")
    if token_action_index.shape != token_mask.shape or token_mask.ndim != 2:
        raise ValueError(f"token_action_index {list(token_action_index.shape)} and token_mask "
                         f"{list(token_mask.shape)} must both be [B, L]")
    if token_mask.shape[0] != action_values.shape[0]:
        raise ValueError(f"batch mismatch: action_values B={action_values.shape[0]}, "
                         f"tokens B={token_mask.shape[0]}")
    idx = jnp.clip(token_action_index, 0, action_values.shape[1] - 1)
    vals = jnp.take_along_axis(action_values.astype(jnp.float32), idx, axis=1)
    return jnp.where(token_mask, vals, 0.0)
