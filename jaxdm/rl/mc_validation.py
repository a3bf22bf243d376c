"""Monte-Carlo validation of value changes (seed 001, section 4.4 and appendix F).

Protocol. For every recorded state s_t of a trajectory, run ``n`` (32) independent
continuations of the current policy from s_t; the MC value V̂(s_t) is their success
fraction. States are reconstructed either from the stored state (immutable JAX states:
BabyAI; the stored (env state, policy state) pair is continued directly) or, for envs that
can only replay actions, by re-executing the recorded actions from the reset and comparing
each observation with the recorded one: from the first divergence on, the trajectory's
transitions are dropped (``replay_actions``, counted in ``ReplayStats``).

Events. ΔV̂_t = V̂(s_{t+1}) − V̂(s_t). The difference of two independent n-sample estimates
has standard deviation at most σ = sqrt(2 · 0.25 / n) (0.125 for n = 32); an event is
|ΔV̂| ≥ 3σ (0.375): a *pitfall* when negative, a *recovery* when positive. The value
model's predicted change ΔV_t agrees when it has the same sign (a zero prediction does not
agree; zero predictions are counted). Transitions are split into trajectory thirds by
t / T (first [0, 1/3), middle, last [2/3, 1]). Under the null (no true change) the chance
of a spurious event is at most ``null_tail_probability`` (exact, maximised over the common
success probability p), so the expected number of spurious events is that times the
number of labelled transitions.

BabyAI (``babyai_*``): the policy is ``field_policy``, a noisy shortest-path agent (with
probability ``eps`` a uniformly random primitive action, else the greedy action of a
distance field computed once per episode: its policy state), and continuations of all
states and all n samples run as one vmapped, jitted batch. The action at env step c uses
``fold_in(policy_key, c)``, so a continuation from a stored state under the episode's own
key reproduces the episode's continuation exactly (tested).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.decision.types import YesNo
from jaxdm.envs.alfworld import plan_from
from jaxdm.envs.babyai import env as E
from jaxdm.envs.babyai import layout as L
from jaxdm.envs.babyai.value import distance_field, move_costs
from jaxdm.rl.values import state_context, state_question
from jaxdm.runlog import pyplot

__all__ = ["N_CONTINUATIONS", "K_SIGMA", "sigma", "event_threshold", "null_tail_probability",
           "Events", "label_events", "summarize_events", "plot_events", "ReplayStats",
           "replay_actions", "field_policy", "BabyAIEpisodes", "babyai_record_episodes",
           "babyai_continue", "babyai_mc_values", "babyai_continue_one_at_a_time",
           "readout_state_values"]

N_CONTINUATIONS = 32
K_SIGMA = 3.0


def sigma(n: int = N_CONTINUATIONS) -> float:
    """Bounded std of the difference of two independent n-sample success fractions."""
    if n < 1:
        raise ValueError(f"n must be >= 1 continuations, got {n}")
    return math.sqrt(2 * 0.25 / n)


def event_threshold(n: int = N_CONTINUATIONS, k_sigma: float = K_SIGMA) -> float:
    """The value change that counts as an event: k_sigma standard deviations of the difference of
    two n-continuation success fractions."""
    return k_sigma * sigma(n)


def null_tail_probability(n: int = N_CONTINUATIONS, threshold: float | None = None,
                          grid: int = 201) -> float:
    """max over p of P(|X − Y| / n ≥ threshold), X, Y ~ Binomial(n, p) independent (exact)."""
    from scipy.stats import binom  # why: scipy.stats takes ~0.7 s to import

    thr = event_threshold(n) if threshold is None else threshold
    k = np.arange(n + 1)
    diff = np.abs(k[:, None] - k[None, :]) / n >= thr - 1e-12
    worst = 0.0
    for p in np.linspace(0.0, 1.0, grid):
        pmf = binom.pmf(k, n, p)
        worst = max(worst, float((pmf[:, None] * pmf[None, :])[diff].sum()))
    return worst


# ---- events ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Events:
    """One row per labelled transition (s_t -> s_{t+1})."""

    traj: np.ndarray        # [K] trajectory index
    t: np.ndarray           # [K] step
    third: np.ndarray       # [K] 0, 1, 2
    dv_mc: np.ndarray       # [K] ΔV̂ (Monte-Carlo)
    dv_pred: np.ndarray     # [K] ΔV predicted by the value model
    kind: np.ndarray        # [K] -1 pitfall, +1 recovery, 0 no event
    agree: np.ndarray       # [K] bool, sign(ΔV) == sign(ΔV̂) (events only meaningful)
    threshold: float
    n: int


def label_events(v_mc, v_pred, lengths, keep=None, *, n: int = N_CONTINUATIONS,
                 k_sigma: float = K_SIGMA, exclude_final: bool = False) -> Events:
    """Label the transitions of B trajectories.

    Args:
      v_mc: [B, T + 1] MC values of s_0..s_T (entries past a trajectory's length ignored).
      v_pred: [B, T + 1] the value model's values of the same states.
      lengths: [B] int, number of transitions T_i of each trajectory.
      keep: optional [B, T] bool, transitions to label (False: dropped, e.g. diverged replay).
      exclude_final: leave out each trajectory's last transition (into the terminal state,
        whose value is the known outcome for both the MC estimate and an anchored model; the
        seed's selected events contain no final transition).
    """
    v_mc, v_pred = np.asarray(v_mc, np.float64), np.asarray(v_pred, np.float64)
    lengths = np.asarray(lengths, np.int64)
    if v_mc.ndim != 2 or v_mc.shape != v_pred.shape:
        raise ValueError(f"v_mc {v_mc.shape} and v_pred {v_pred.shape} must both be [B, T + 1]")
    b, t1 = v_mc.shape
    if lengths.shape != (b,) or (lengths < 0).any() or (lengths > t1 - 1).any():
        raise ValueError(f"lengths must be [B] = [{b}] ints in [0, {t1 - 1}], got {lengths}")
    keep = np.ones((b, t1 - 1), bool) if keep is None else np.asarray(keep, bool)
    if keep.shape != (b, t1 - 1):
        raise ValueError(f"keep must be [B, T] = {(b, t1 - 1)}, got {keep.shape}")
    last = lengths[:, None] - (1 if exclude_final else 0)
    rows, cols = np.nonzero((np.arange(t1 - 1)[None] < last) & keep)
    for name, v in (("v_mc", v_mc), ("v_pred", v_pred)):
        bad = ~np.isfinite(v[rows, cols]) | ~np.isfinite(v[rows, cols + 1])
        if bad.any():
            raise ValueError(f"{name} is not finite at trajectory {rows[bad][0]}, step "
                             f"{cols[bad][0]} (or the next state)")
    thr = event_threshold(n, k_sigma)
    dv = v_mc[rows, cols + 1] - v_mc[rows, cols]
    dp = v_pred[rows, cols + 1] - v_pred[rows, cols]
    kind = np.where(dv >= thr - 1e-12, 1, np.where(dv <= -thr + 1e-12, -1, 0))
    third = np.minimum((3 * cols) // np.maximum(lengths[rows], 1), 2)
    agree = np.sign(dp) == np.sign(dv)
    return Events(rows, cols, third.astype(np.int64), dv, dp, kind.astype(np.int64),
                  agree & (kind != 0), thr, n)


def summarize_events(ev: Events) -> dict[str, Any]:
    """Counts, agreement (pitfalls, recoveries, all; by third), spurious-event expectation,
    median predicted |Δ| and zero-prediction share per third."""
    is_ev = ev.kind != 0

    def rate(sel):
        return float(ev.agree[sel].mean()) if sel.any() else None

    out: dict[str, Any] = {
        "n": ev.n, "sigma": sigma(ev.n), "threshold": ev.threshold,
        "transitions": int(ev.kind.size), "events": int(is_ev.sum()),
        "pitfalls": int((ev.kind == -1).sum()), "recoveries": int((ev.kind == 1).sum()),
        "agree_all": rate(is_ev), "agree_pitfalls": rate(ev.kind == -1),
        "agree_recoveries": rate(ev.kind == 1),
    }
    tail = null_tail_probability(ev.n, ev.threshold)
    out["null_tail_probability"] = tail
    out["expected_spurious_events"] = tail * ev.kind.size
    for j, name in enumerate(("first", "middle", "last")):
        sel = ev.third == j
        out[f"{name}/events"] = int((is_ev & sel).sum())
        out[f"{name}/agree"] = rate(is_ev & sel)
        out[f"{name}/median_abs_pred"] = (float(np.median(np.abs(ev.dv_pred[is_ev & sel])))
                                          if (is_ev & sel).any() else None)
        out[f"{name}/median_abs_mc"] = (float(np.median(np.abs(ev.dv_mc[is_ev & sel])))
                                        if (is_ev & sel).any() else None)
        out[f"{name}/zero_pred"] = (float((ev.dv_pred[is_ev & sel] == 0).mean())
                                    if (is_ev & sel).any() else None)
    return out


def plot_events(summaries: dict[str, dict[str, Any]], events: dict[str, Events], path) -> None:
    """Agreement by trajectory third per value model, and ΔV̂ vs predicted ΔV scatter."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = list(summaries)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        s = summaries[name]
        vals = [s[f"{p}/agree"] if s[f"{p}/agree"] is not None else 0.0
                for p in ("first", "middle", "last")]
        axes[0].bar(np.arange(3) + i * width, vals, width, label=name)
    axes[0].set_xticks(np.arange(3) + width * (len(names) - 1) / 2,
                       ["first third", "middle third", "last third"])
    axes[0].set_ylabel("sign agreement on MC events")
    axes[0].set_ylim(0, 1)
    axes[0].legend(fontsize=8)
    for name, ev in events.items():
        sel = ev.kind != 0
        axes[1].scatter(ev.dv_mc[sel], ev.dv_pred[sel], s=8, alpha=0.6, label=name)
    thr = next(iter(events.values())).threshold if events else 0.375
    for x in (-thr, thr):
        axes[1].axvline(x, color="grey", lw=0.8, ls="--")
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set_xlabel("ΔV Monte-Carlo (events)")
    axes[1].set_ylabel("ΔV predicted")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- action replay (envs that cannot restore a state) -----------------------------------------
@dataclasses.dataclass
class ReplayStats:
    """Counts of a replay: trajectories replayed, how many diverged from their recording, and the
    transitions dropped from each first divergence on."""
    replayed: int = 0            # trajectories replayed
    diverged: int = 0            # of which diverged somewhere
    dropped_transitions: int = 0  # transitions from the first divergence on


def replay_actions(env, key, actions: Sequence[Any], recorded_obs: Sequence[Any],
                   params=None, *, stats: ReplayStats | None = None,
                   same: Callable[[Any, Any], bool] | None = None) -> tuple[list[Any], int]:
    """Re-execute ``actions`` from ``env.reset(key)`` and keep the states that match.

    ``recorded_obs`` are the T + 1 recorded observations (reset, then after each action).
    Returns (states s_0..s_k of the agreeing prefix, k = number of kept transitions): the
    replay stops at the first observation that differs (``same``, default ==); the
    transitions from there on are dropped and counted in ``stats``.
    """
    if len(recorded_obs) != len(actions) + 1:
        raise ValueError(f"recorded_obs has {len(recorded_obs)} entries for {len(actions)} "
                         "actions (need T + 1: the reset observation, then one per action)")
    same = same or (lambda a, b: a == b)
    stats = stats if stats is not None else ReplayStats()
    stats.replayed += 1
    obs, state = env.reset(key, params)
    states = [state]
    if not same(obs, recorded_obs[0]):
        stats.diverged += 1
        stats.dropped_transitions += len(actions)
        return [], 0
    for t, a in enumerate(actions):
        obs, state, _, done, _ = env.step(key, state, a, params)
        if not same(obs, recorded_obs[t + 1]):
            stats.diverged += 1
            stats.dropped_transitions += len(actions) - t
            return states, t
        states.append(state)
    return states, len(actions)


# ---- BabyAI: a noisy shortest-path policy, episodes, vmapped continuations -------------------


def field_policy(key, state, field, eps):
    """One action of the noisy shortest-path agent (pure; vmap it). ``key`` is the episode's
    policy key: the action at env step c uses ``fold_in(key, c)``."""
    costs, cell, closed_front = move_costs(state, field)
    choice = jnp.argmin(costs)
    greedy = jnp.where(choice == 0, E.LEFT, jnp.where(choice == 1, E.RIGHT,
                                                      jnp.where(closed_front, E.TOGGLE,
                                                                E.FORWARD)))
    hands_free = state.carrying[0] == 0
    carrying_other = ~hands_free & ~((state.carrying[0] == state.target[0])
                                     & (state.carrying[1] == state.target[1]))
    at_target = field[state.agent_pos[0], state.agent_pos[1], state.agent_dir] == 0
    greedy = jnp.where(at_target & hands_free, E.PICKUP, greedy)
    greedy = jnp.where(carrying_other & (cell[0] == L.EMPTY), E.DROP, greedy)
    k1, k2 = jax.random.split(jax.random.fold_in(key, state.step_count))
    explore = jax.random.uniform(k1) < eps
    return jnp.where(explore, jax.random.randint(k2, (), 0, E.NUM_ACTIONS), greedy
                     ).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class BabyAIEpisodes:
    """Recorded episodes: states [B, H + 1] (a stacked BabyAIState), fields [B, W, H, 4],
    actions [B, H], lengths [B] (transitions), success [B], policy keys [B], task keys [B]
    (``env.reset_env(task_keys[i])`` is episode i's reset, e.g. for a text replay)."""

    states: Any
    fields: jax.Array
    actions: np.ndarray
    lengths: np.ndarray
    success: np.ndarray
    policy_keys: jax.Array
    task_keys: jax.Array | None = None

    def state(self, i: int, t: int):
        """The env state of episode ``i`` at step ``t`` (one slice of the stacked states)."""
        return jax.tree.map(lambda x: x[i, t], self.states)


def _field_step(env, params, keys, st, fields, eps, done):
    """One step of the noisy shortest-path agent on a batch [N]: the states after it (rows
    already ``done`` keep theirs), the actions [N] and the env's terminated / truncated [N]."""
    a = jax.vmap(field_policy, in_axes=(0, 0, 0, None))(keys, st, fields, eps)
    _, st2, _, term, trunc, _ = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))(
        jax.random.key(0), st, a, params)
    st_new = jax.tree.map(lambda o, n: jnp.where(
        done.reshape((-1,) + (1,) * (o.ndim - 1)), o, n), st, st2)
    return st_new, a, term, trunc


@functools.partial(jax.jit, static_argnums=(0, 1))
def _record(env, params, task_keys, policy_keys, eps):
    _, s0 = jax.vmap(env.reset_env, in_axes=(0, None))(task_keys, params)
    fields = jax.vmap(distance_field)(s0)

    def body(carry, _):
        st, done, succ = carry
        st_new, a, term, trunc = _field_step(env, params, policy_keys, st, fields, eps, done)
        out = (st_new, jnp.where(done, -1, a), done)
        return (st_new, done | term | trunc, succ | (~done & term)), out

    b = task_keys.shape[0]
    init = (s0, jnp.zeros((b,), bool), jnp.zeros((b,), bool))
    (_, _, succ), (sts, acts, was_done) = jax.lax.scan(body, init, None,
                                                        length=params.max_steps)
    states = jax.tree.map(lambda a, b_: jnp.concatenate([a[None], b_], 0), s0, sts)
    states = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), states)
    lengths = jnp.sum(~was_done, axis=0)
    return states, fields, jnp.swapaxes(acts, 0, 1), lengths, succ


def babyai_record_episodes(env, params, key, num: int, eps: float) -> BabyAIEpisodes:
    """``num`` episodes of the noisy shortest-path agent (one jitted scan, all in a batch)."""
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps must be in [0, 1], got {eps}")
    kt, kp = jax.random.split(key)
    task_keys, policy_keys = jax.random.split(kt, num), jax.random.split(kp, num)
    states, fields, actions, lengths, succ = _record(env, params, task_keys, policy_keys,
                                                     jnp.float32(eps))
    return BabyAIEpisodes(states, fields, np.asarray(actions), np.asarray(lengths),
                          np.asarray(succ), policy_keys, task_keys)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _continue(env, params, states, fields, keys, eps):
    """Run every state [N] to its end under ``keys`` [N]; returns (success [N], final)."""
    def cond(c):
        st, done, _ = c
        return jnp.any(~done)

    def body(c):
        st, done, succ = c
        st, _, term, trunc = _field_step(env, params, keys, st, fields, eps, done)
        return st, done | term | trunc, succ | (~done & term)

    done0 = states.step_count >= params.max_steps
    st, _, succ = jax.lax.while_loop(cond, body, (states, done0, jnp.zeros_like(done0)))
    return succ, st


def babyai_continue(env, params, states, fields, keys, eps: float):
    """Continue N stored states (stacked) under policy keys [N]: (success [N], final states)."""
    succ, final = _continue(env, params, states, fields, keys, jnp.float32(eps))
    return np.asarray(succ), final


def babyai_mc_values(env, params, episodes: BabyAIEpisodes, key, *, eps: float,
                     n: int = N_CONTINUATIONS, chunk: int = 4096) -> np.ndarray:
    """V̂(s_t) for every recorded state: [B, H + 1] success fractions of n continuations
    (vmapped: every (state, continuation) pair in one batch of ``chunk``); the terminal state
    of a trajectory gets its outcome, states past it NaN."""
    b, h1 = episodes.actions.shape[0], episodes.actions.shape[1] + 1
    idx = [(i, t) for i in range(b) for t in range(int(episodes.lengths[i]))]
    out = np.full((b, h1), np.nan)
    for i in range(b):
        out[i, episodes.lengths[i]] = float(episodes.success[i])
    pairs = [(i, t, c) for (i, t) in idx for c in range(n)]
    succ_all = np.zeros(len(pairs), bool)
    for s in range(0, len(pairs), chunk):
        part = pairs[s:s + chunk]
        m = len(part)
        pad = chunk - m if len(pairs) > chunk else 0
        ii = np.array([p[0] for p in part] + [0] * pad)
        tt = np.array([p[1] for p in part] + [0] * pad)
        cc = np.array([p[2] for p in part] + [0] * pad)
        states = jax.tree.map(lambda x: x[ii, tt], episodes.states)
        keys = jax.vmap(lambda i, t, c: jax.random.fold_in(
            jax.random.fold_in(jax.random.fold_in(key, i), t), c))(ii, tt, cc)
        succ, _ = babyai_continue(env, params, states, episodes.fields[ii], keys, eps)
        succ_all[s:s + m] = succ[:m]
    sums: dict[tuple[int, int], int] = {}
    for (i, t, _), ok in zip(pairs, succ_all):
        sums[(i, t)] = sums.get((i, t), 0) + int(ok)
    for (i, t), k in sums.items():
        out[i, t] = k / n
    return out


def babyai_continue_one_at_a_time(env, params, state, field, key, eps: float) -> bool:
    """One continuation stepped on the host, one jitted policy+env step per action (the
    benchmark's baseline)."""
    step = _single_step(env)
    done = bool(state.step_count >= params.max_steps)
    while not done:
        state, term, trunc = step(params, state, field, key, jnp.float32(eps))
        if bool(term):
            return True
        done = bool(trunc)
    return False


@functools.lru_cache(maxsize=None)
def _single_step(env):
    @jax.jit
    def step(params, state, field, key, eps):
        a = field_policy(key, state, field, eps)
        _, st, _, term, trunc, _ = env.step_env(jax.random.key(0), state, a, params)
        return st, term, trunc
    return step


# ---- ALFWorld (native engine): host continuations from action-replayed states --------------
def alfworld_action(state, rng, eps: float) -> str:
    """The noisy planner: with probability ``eps`` a uniformly random admissible command,
    else the next command of the expert's plan from ``state`` (random when it has none)."""
    commands = sorted(state.command_map())
    if rng.random() >= eps:
        try:
            plan = plan_from(state.game, state)
        except RuntimeError:
            plan = []
        if plan:
            return plan[0]
    return rng.choice(commands)


def alfworld_episode(env, seed: int, params, rng, eps: float, state=None, obs=None
                     ) -> tuple[list[str], list[str], bool]:
    """Play the noisy planner from ``state`` (default: the reset of ``seed``) to the end;
    returns (commands, observations incl. the start one, won)."""
    if state is None:
        obs, state = env.reset(seed, params)
    cmds, seen = [], [obs]
    while True:
        if state.won or state.t >= params.max_steps:
            return cmds, seen, bool(state.won)
        a = alfworld_action(state, rng, eps)
        obs, state, _, done, _ = env.step(seed, state, a, params)
        cmds.append(a)
        seen.append(obs)
        if done:
            return cmds, seen, bool(state.won)


def alfworld_mc_values(env, seed: int, params, commands: Sequence[str],
                       observations: Sequence[str], rng, *, eps: float,
                       n: int = N_CONTINUATIONS, stats: ReplayStats | None = None
                       ) -> tuple[np.ndarray, int]:
    """V̂(s_0..s_k) of one recorded episode: its states are rebuilt by re-executing the
    commands (a diverging replay keeps only the agreeing prefix, counted in ``stats``), then
    n host continuations of the noisy planner from each. Returns ([T + 1] with NaN past the
    kept prefix, k kept transitions)."""
    states, kept = replay_actions(env, seed, commands, observations, params, stats=stats)
    out = np.full(len(commands) + 1, np.nan)
    for t, st in enumerate(states):
        wins = 0
        for _ in range(n):
            wins += alfworld_episode(env, seed, params, rng, eps, state=st,
                                     obs=observations[t])[2]
        out[t] = wins / n
    return out, kept


# ---- a language model as the value model (the readout of jaxdm.rl.values) -----------------
def readout_state_values(backend, traj, group_context: str = "") -> np.ndarray:
    """Value-model values of s_0..s_T of one text ``Trajectory``: [T + 1] with P(Yes) of the
    LVRL value question (``jaxdm.rl.values`` prompts: ``state_context`` / ``state_question``)
    at s_0..s_{T−1}, all in one ``backend.score`` call (one packed pass for a
    ``LocalReadout``), and the known outcome at the terminal state s_T (anchored, as for the
    Oracle rows). Raises ValueError naming the state when the backend returns no value."""
    n = len(traj.steps)
    reqs = [YesNo(context=state_context(traj, group_context, t),
                  question=state_question(traj, t), meta={"role": "mc_value", "state": t})
            for t in range(n)]
    out = np.full(n + 1, np.nan)
    for t, r in enumerate(backend.score(reqs) if reqs else []):
        if not r.ok or r.score is None or not math.isfinite(float(r.score)):
            raise ValueError(f"state {t}: the value model returned no value ({r.error})")
        out[t] = float(r.score)
    out[n] = float(bool(traj.success))
    return out
