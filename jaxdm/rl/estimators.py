"""Advantage estimators (a registry) over one iteration's episodes.

An estimator is ``Estimator(needs, fn)``: ``needs`` names the signals it reads
(``jaxdm.rl.signals``), ``fn(episodes, signals, algo, num_groups) -> Advantages`` is a pure
function of arrays (the formulas live in ``jaxdm.rl.advantages``). ``TrainConfig``
validation reads this registry: an unknown name, or an estimator whose signal is not
configured (``lvrl`` without ``value``, ``gae`` without ``critic``), fails at start naming
the config key.

Registered: ``grpo`` (outcome-only), ``teacher`` (A_out + λ(s − s̄_u), seed 000),
``gigpo`` (episode + anchor-state groups), ``gae`` (PPO with a learned critic) and ``lvrl``
(value differences with anchored ends, seed 001; rows whose value query failed keep their
GRPO advantage).

``EpisodeBatch`` is the one array view of a batch of ``EpisodeRecord``s: [B, T] masks,
returns and step rewards, outcomes, group ids, the per-action training units in row-major
order, and ``errored`` [B]: episodes lost to an env error (a dead worker) are masked out of
every estimator (their group is computed over the rest) and never trained on. ``recorded``
is the env side of the same rows as the one env batch type (``jaxdm.envs.recorder.
RecordedBatch``: commands, env rewards, dones, validity and the per-step env states), present
when the pool recorded the episodes (``EpisodeRecord.record``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxdm.envs.recorder import RecordedBatch
from jaxdm.registry import Registry
from jaxdm.rl import advantages as advmod
from jaxdm.rl.values.estimator import lvrl_step_advantages

__all__ = ["EpisodeBatch", "episode_batch", "Advantages", "Estimator", "ESTIMATORS",
           "register_estimator", "bucket_int"]


@dataclasses.dataclass(frozen=True)
class EpisodeBatch:
    """One iteration's episodes as padded host arrays (B episodes, T = max_actions): the
    executed-action mask, returns, step rewards and invalid actions [B, T], outcome, group and
    env-error flags [B], and the policy's training units of the masked actions in row-major order
    with their row, column and behaviour log-prob [N]; ``recorded`` holds the jax rollout's stacked
    env states (None for host rollouts)."""
    episodes: Sequence[Any]          # EpisodeRecord
    trajectories: Sequence[Any]      # their Trajectory objects
    mask: np.ndarray                 # [B, T] bool executed actions (errored rows: all False)
    returns: np.ndarray              # [B, T] R_i − penalty on invalid actions
    step_rewards: np.ndarray         # [B, T] −penalty on invalid actions, + R_i on the last
    outcome: np.ndarray              # [B] R_i
    groups: np.ndarray               # [B] int32
    invalid: np.ndarray              # [B, T] bool
    errored: np.ndarray              # [B] bool, lost to an env error
    units: list                      # policy training units of the masked actions, row-major
    unit_rows: np.ndarray            # [N] row of each unit
    unit_cols: np.ndarray            # [N] action slot of each unit
    unit_logp: np.ndarray            # [N] sampling log-prob
    recorded: RecordedBatch | None = None  # env side of the rows (None: not recorded)


def episode_batch(episodes: Sequence[Any], max_actions: int, penalty: float) -> EpisodeBatch:
    """The EpisodeBatch of ``episodes`` (EpisodeRecord, at most ``max_actions`` actions each): an
    invalid action costs ``penalty``, the outcome R_i is added at the last executed step, and an
    episode lost to an env error is masked out entirely."""
    b = len(episodes)
    mask = np.zeros((b, max_actions), bool)
    returns = np.zeros((b, max_actions), np.float32)
    step_r = np.zeros((b, max_actions), np.float32)
    invalid = np.zeros((b, max_actions), bool)
    outcome = np.zeros((b,), np.float32)
    groups = np.zeros((b,), np.int32)
    errored = np.array([bool(ep.error) for ep in episodes], bool)
    units, rows, cols, logps = [], [], [], []
    for i, ep in enumerate(episodes):
        n = 0 if errored[i] else min(len(ep.actions), max_actions)
        mask[i, :n] = True
        outcome[i] = ep.reward
        groups[i] = ep.group
        for t, a in enumerate(ep.actions[:n]):
            invalid[i, t] = not a.valid
            units.append(a.out.unit)
            rows.append(i)
            cols.append(t)
            logps.append(a.out.logp)
        returns[i, :n] = ep.reward - penalty * invalid[i, :n]
        step_r[i, :n] = -penalty * invalid[i, :n]
        if n:
            step_r[i, n - 1] += ep.reward
    records = [getattr(ep, "record", None) for ep in episodes]
    recorded = None
    if records and all(r is not None for r in records):
        longest = max(len(r.steps) for r in records)
        recorded = RecordedBatch.from_episodes(records, max(max_actions, longest))
    return EpisodeBatch(list(episodes), [ep.trajectory for ep in episodes], mask, returns,
                        step_r, outcome, groups, invalid, errored, units,
                        np.asarray(rows, np.int64), np.asarray(cols, np.int64),
                        np.asarray(logps, np.float32), recorded)


@dataclasses.dataclass(frozen=True)
class Advantages:
    """What an estimator returns: per-action advantages adv [B, T] float32 (0 off the mask), extra
    per-action arrays the loss terms read (e.g. value targets), and scalar stats for the metrics."""
    adv: np.ndarray                                   # [B, T] float32, 0 off the mask
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator: the signals it needs (names of jaxdm.rl.signals) and
    fn(episodes, signals, algo, num_groups) -> Advantages."""
    needs: tuple[str, ...]
    fn: Callable[[EpisodeBatch, Mapping[str, Any], Any, int], Advantages]


ESTIMATORS: Registry[Estimator] = Registry("estimator")


def register_estimator(name: str, fn: Callable, *, needs: Sequence[str] = ()) -> Estimator:
    """Register ``fn(episodes, signals, algo, num_groups) -> Advantages`` needing ``needs``
    (a name registered twice is a ``jaxdm.registry.DuplicateNameError``)."""
    return ESTIMATORS.register(name, Estimator(tuple(needs), fn))


def bucket_int(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): sizes padded to it compile one program per
    doubling."""
    return 1 << max(int(n) - 1, 0).bit_length()


def _grpo(eb: EpisodeBatch, algo, num_groups: int) -> np.ndarray:
    return np.asarray(advmod.grpo_outcome_advantages(eb.returns, eb.groups, eb.mask,
                                                     num_groups=num_groups, eps=algo.eps))


def grpo(eb, signals, algo, num_groups):
    """GRPO's advantage: each episode's return normalised within its group, the same at every
    executed action ([B, T])."""
    return Advantages(_grpo(eb, algo, num_groups))


def teacher(eb, signals, algo, num_groups):
    """The teacher-augmented advantage A = A_out + lam (s - s_u) [B, T]: the group-normalised
    outcome advantage plus ``algo.lam`` times the judge's score s of each action (signal
    teacher_scores) less its group's mean score; unscored actions keep A_out."""
    sig = signals["teacher_scores"]
    a_out = advmod.grpo_outcome_advantages(eb.returns, eb.groups, eb.mask,
                                           num_groups=num_groups, eps=algo.eps)
    return Advantages(np.asarray(advmod.teacher_advantages(
        a_out, sig.arrays["scores"], eb.groups, eb.mask, num_groups=num_groups, lam=algo.lam,
        score_mask=sig.mask)))


def gigpo(eb, signals, algo, num_groups):
    """GiGPO's advantage [B, T]: the episode-level group advantage plus ``algo.gigpo_weight`` times
    the step-level one, normalised within anchor states (identical observations across a group's
    episodes) over gigpo_gamma-discounted step returns."""
    obs = [[a.observation for a in ep.actions] for ep in eb.episodes]
    anchors, n_anchors = advmod.anchor_ids_from_observations(obs, eb.groups, eb.mask)
    return Advantages(np.asarray(advmod.gigpo_advantages(
        eb.outcome, eb.step_rewards, anchors, eb.groups, eb.mask, num_groups=num_groups,
        num_anchors=bucket_int(n_anchors), gamma=algo.gigpo_gamma,
        step_weight=algo.gigpo_weight, eps=algo.eps)))


def gae(eb, signals, algo, num_groups):
    """GAE(γ, λ) on the step rewards with the critic's values; optionally normalised over
    the batch's executed actions (mean/std), as PPO implementations usually do."""
    values = signals["critic_values"].arrays["values"]
    adv, ret = advmod.gae_advantages(eb.step_rewards, values, eb.mask, gamma=algo.gamma,
                                     lam=algo.gae_lam)
    adv, ret = np.asarray(adv), np.asarray(ret)
    if algo.gae_normalize and eb.mask.any():
        a = adv[eb.mask]
        adv = np.where(eb.mask, (adv - a.mean()) / (a.std() + algo.eps), 0.0).astype(np.float32)
    return Advantages(adv, {"returns": ret, "old_values": values[:, :-1]})


def lvrl(eb, signals, algo, num_groups):
    """LVRL step advantages (``jaxdm.rl.values.estimator``); a row whose value query failed
    (signal mask False) keeps its GRPO advantage."""
    sig = signals["values"]
    rows = np.asarray(sig.mask, bool) & ~eb.errored
    adv = lvrl_step_advantages(sig.arrays["values"], rows, eb.outcome, eb.returns, eb.groups,
                               eb.mask, num_groups=num_groups, normalize=algo.lvrl_normalize,
                               kept=~np.asarray(eb.errored, bool), eps=algo.eps)
    return Advantages(np.asarray(adv, np.float32),
                      stats={"lvrl/fallback_rows": float((~rows & ~eb.errored).sum())})


def _shaped_step_rewards(eb, signals, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """(shaped step rewards [B, T], rows with real values [B]): potential-based shaping of the
    step rewards with the ``values`` signal as Φ; rows whose value query failed keep their
    unshaped rewards (Φ = 0)."""
    sig = signals["values"]
    rows = np.asarray(sig.mask, bool) & ~eb.errored
    phi = np.where(rows[:, None], np.asarray(sig.arrays["values"], np.float32), 0.0)
    return np.asarray(advmod.potential_shaped_rewards(eb.step_rewards, phi, eb.mask,
                                                      gamma=gamma)), rows


def grpo_shaped(eb, signals, algo, num_groups):
    """GRPO given the LVRL value model as a potential-based shaping reward: the step rewards
    r_t + Φ(s_{t+1}) − Φ(s_t) (Φ = the ``values`` signal, 0 after the last action) through
    GRPO with step rewards (``advantages.process_grpo_advantages``). LVRL's value differences
    without its anchors and group baseline: the control that says what those add."""
    shaped, rows = _shaped_step_rewards(eb, signals, 1.0)
    adv = advmod.process_grpo_advantages(shaped, eb.groups, eb.mask, num_groups=num_groups,
                                         eps=algo.eps)
    return Advantages(np.asarray(adv, np.float32),
                      stats={"shaping/unshaped_rows": float((~rows & ~eb.errored).sum())})


def gae_shaped(eb, signals, algo, num_groups):
    """PPO's GAE(γ, λ) with the learned critic on the shaped step rewards r_t + γ Φ(s_{t+1})
    − Φ(s_t) (Φ = the ``values`` signal): PPO given the same shaping reward as LVRL."""
    shaped, rows = _shaped_step_rewards(eb, signals, algo.gamma)
    out = gae(dataclasses.replace(eb, step_rewards=shaped), signals, algo, num_groups)
    return Advantages(out.adv, out.extras,
                      {**out.stats, "shaping/unshaped_rows": float((~rows & ~eb.errored).sum())})


register_estimator("grpo", grpo)
register_estimator("teacher", teacher, needs=("teacher_scores",))
register_estimator("gigpo", gigpo)
register_estimator("gae", gae, needs=("critic_values",))
register_estimator("lvrl", lvrl, needs=("values",))
register_estimator("grpo_shaped", grpo_shaped, needs=("values",))
register_estimator("gae_shaped", gae_shaped, needs=("critic_values", "values"))
