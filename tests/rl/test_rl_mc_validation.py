"""Monte-Carlo validation: thresholds, event labelling, replay from stored states, diverging
action replays."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxdm.rl import mc_validation as mc


def test_sigma_threshold_and_null_tail():
    assert mc.sigma(32) == pytest.approx(0.125)
    assert mc.event_threshold(32) == pytest.approx(0.375)
    tail = mc.null_tail_probability(32)
    # at p = 1/2, X + (32 - Y) ~ Binomial(64, 1/2): P(|X - Y| >= 12) = P(|B - 32| >= 12)
    from math import comb
    at_half = sum(comb(64, b) for b in range(65) if abs(b - 32) >= 12) / 2 ** 64
    assert at_half == pytest.approx(0.00369, abs=1e-5)
    assert at_half - 1e-12 <= tail < 0.005
    assert mc.null_tail_probability(32, 0.25) > tail
    with pytest.raises(ValueError, match="n must be"):
        mc.sigma(0)


def test_event_labelling_on_synthetic_values():
    # trajectory 0: 6 transitions; 1: 3 transitions (rest padding)
    v_mc = np.array([[0.5, 0.5, 0.0, 0.0, 0.5, 0.875, 1.0],
                     [0.9, 0.5, 0.125, 0.5, np.nan, np.nan, np.nan]])
    v_pred = np.array([[0.5, 0.6, 0.4, 0.4, 0.4, 0.9, 1.0],
                       [0.9, 0.9, 0.8, 0.9, 0.0, 0.0, 0.0]])
    ev = mc.label_events(v_mc, v_pred, lengths=[6, 3], n=32)
    # trajectory 0: dv = 0, -.5, 0, +.5, +.375, +.125 -> events at t=1 (pitfall), 3, 4
    # (recoveries; .375 is exactly 3 sigma); trajectory 1: -.4 (pitfall), -.375 (pitfall), +.375
    kinds = {(int(i), int(t)): int(k) for i, t, k in zip(ev.traj, ev.t, ev.kind)}
    assert kinds == {(0, 0): 0, (0, 1): -1, (0, 2): 0, (0, 3): 1, (0, 4): 1, (0, 5): 0,
                     (1, 0): -1, (1, 1): -1, (1, 2): 1}
    agree = {(int(i), int(t)) for i, t, a in zip(ev.traj, ev.t, ev.agree) if a}
    # (0,1): pred -.2 agrees; (0,3): pred 0 -> not; (0,4): pred +.5 agrees;
    # (1,0): pred 0 -> not; (1,1): pred -.1 agrees; (1,2): pred +.1 agrees
    assert agree == {(0, 1), (0, 4), (1, 1), (1, 2)}
    thirds = {(int(i), int(t)): int(j) for i, t, j in zip(ev.traj, ev.t, ev.third)}
    assert [thirds[(0, t)] for t in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [thirds[(1, t)] for t in range(3)] == [0, 1, 2]
    s = mc.summarize_events(ev)
    assert s["events"] == 6 and s["pitfalls"] == 3 and s["recoveries"] == 3
    assert s["agree_pitfalls"] == pytest.approx(2 / 3)
    assert s["agree_recoveries"] == pytest.approx(2 / 3)
    assert s["first/events"] == 2 and s["first/agree"] == pytest.approx(0.5)  # (0,1), (1,0)
    assert s["last/agree"] == pytest.approx(1.0)          # (0,4), (1,2)
    assert s["first/zero_pred"] == pytest.approx(0.5)
    assert s["expected_spurious_events"] == pytest.approx(9 * s["null_tail_probability"])
    assert s["middle/median_abs_pred"] == pytest.approx(0.05)  # (0,3): 0, (1,1): .1
    # dropped transitions are not labelled
    keep = np.ones((2, 6), bool)
    keep[0, 1] = False
    assert mc.summarize_events(mc.label_events(v_mc, v_pred, [6, 3], keep))["pitfalls"] == 2
    # final transitions (into the terminal state) can be left out: (0,5) and (1,2) go
    no_final = mc.label_events(v_mc, v_pred, [6, 3], exclude_final=True)
    assert mc.summarize_events(no_final)["transitions"] == 7
    assert mc.summarize_events(no_final)["recoveries"] == 2
    bad = v_mc.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="v_mc is not finite at trajectory 1, step 1"):
        mc.label_events(bad, v_pred, [6, 3])


def test_replay_from_stored_state_equals_the_original_continuation():
    from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams

    env = BabyAIEnv()
    params = BabyAIParams.for_split("train", max_steps=40)
    ep = mc.babyai_record_episodes(env, params, jax.random.key(3), 6, eps=0.3)
    assert ep.lengths.min() >= 2
    idx = np.arange(6)
    t = ep.lengths // 2
    states = jax.tree.map(lambda x: x[idx, t], ep.states)
    succ, final = mc.babyai_continue(env, params, states, ep.fields, ep.policy_keys, 0.3)
    np.testing.assert_array_equal(succ, ep.success)
    end = jax.tree.map(lambda x: x[idx, ep.lengths], ep.states)
    for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(end)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # a different key gives a different continuation somewhere (the policy is stochastic)
    other = jax.random.split(jax.random.key(99), 6)
    _, final2 = mc.babyai_continue(env, params, states, ep.fields, other, 0.3)
    assert not np.array_equal(np.asarray(final2.step_count), np.asarray(end.step_count))
    # the one-at-a-time baseline reproduces the outcome too
    i = int(np.argmax(ep.lengths))
    assert mc.babyai_continue_one_at_a_time(env, params, ep.state(i, int(t[i])), ep.fields[i],
                                            ep.policy_keys[i], 0.3) == bool(ep.success[i])
    # MC values: terminal states hold the outcome, values are fractions of n
    v = mc.babyai_mc_values(env, params, ep, jax.random.key(5), eps=0.3, n=4)
    for j in range(6):
        assert v[j, ep.lengths[j]] == float(ep.success[j])
        row = v[j, :ep.lengths[j]]
        assert np.all(np.isin(row * 4, np.arange(5)))
        assert np.isnan(v[j, ep.lengths[j] + 1:]).all()
    # the recorded task keys replay an episode as text (for a language value model)
    from jaxdm.envs.babyai import make_text_env, play_trajectory

    tr = play_trajectory(make_text_env("train", room_size=env.room_size, max_steps=40),
                         ep.task_keys[i], ep.actions[i, :ep.lengths[i]], params)
    assert len(tr.steps) == ep.lengths[i] and tr.success == bool(ep.success[i])


def test_readout_state_values_of_a_text_trajectory():
    """A language value model's values of s_0..s_T: P(Yes) of the LVRL value question at every
    non-terminal state in one packed call (equal to scoring each question alone), the outcome
    at s_T."""
    from jaxdm.decision import LocalReadout
    from jaxdm.decision.types import YesNo
    from jaxdm.rl.values import state_context, state_question
    from tests.decision.dm_fixtures import small_trajectory, tiny_pretrained

    dm = LocalReadout(tiny_pretrained())
    for success in (True, False):
        traj = small_trajectory(success)
        v = mc.readout_state_values(dm, traj)
        n = len(traj.steps)
        assert v.shape == (n + 1,) and v[n] == float(success)
        assert np.all((v[:n] > 0) & (v[:n] < 1))
        one = dm.score([YesNo(state_context(traj, "", 1), state_question(traj, 1))])[0]
        np.testing.assert_allclose(v[1], one.score, atol=1e-5)


def test_diverging_action_replay_is_dropped_and_counted():
    from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams

    env = AlfWorldEnv(AlfWorldParams(split="valid_unseen", max_steps=30))
    params = env.default_params
    obs, state = env.reset(3)
    recorded, actions, action = [obs], [], "look"
    for _ in range(4):
        obs, state, _, _, info = env.step(3, state, action, params)
        actions.append(action)
        recorded.append(obs)
        action = sorted(info["admissible_actions"])[-1]
    stats = mc.ReplayStats()
    states, kept = mc.replay_actions(env, 3, actions, recorded, params, stats=stats)
    assert kept == 4 and len(states) == 5 and stats.diverged == 0
    tampered = list(recorded)
    tampered[3] = tampered[3] + " (changed)"
    states, kept = mc.replay_actions(env, 3, actions, tampered, params, stats=stats)
    assert kept == 2 and len(states) == 3
    assert (stats.replayed, stats.diverged, stats.dropped_transitions) == (2, 1, 2)
    with pytest.raises(ValueError, match="T \\+ 1"):
        mc.replay_actions(env, 3, actions, recorded[:-1], params)
