"""JAX BabyAI: out-of-range and non-integer actions rejected at the API boundary, counted
inside jitted code (issue 15 item 12)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
from jaxdm.envs.babyai.env import NUM_ACTIONS, check_actions

ENV = BabyAIEnv()


# The host check runs before the state is used, so the rejection tests need no real state
# (and no compilation).
@pytest.mark.parametrize("action", [99, -1, 7, np.int64(7), jnp.int32(-3)])
def test_step_rejects_out_of_range_actions(action):
    with pytest.raises(ValueError, match=r"out of range: BabyAI actions are 0..6 \(left, right"):
        ENV.step(jax.random.key(1), None, action)


@pytest.mark.parametrize("action", [2.7, 2.0, True, jnp.float32(1.0), "forward"])
def test_step_rejects_non_integer_actions(action):
    with pytest.raises(TypeError, match=r"action must be integers in \[0, 7\)"):
        ENV.step(jax.random.key(1), None, action)


def test_step_batch_names_the_bad_slot():
    keys = jax.random.split(jax.random.key(2), 4)
    with pytest.raises(ValueError, match=r"actions\[2\] = 99 is out of range.*; 2 invalid"):
        ENV.step_batch(keys, None, np.array([0, 1, 99, -1]))
    with pytest.raises(TypeError, match=r"actions must be integers"):
        ENV.step_batch(keys, None, np.array([0, 1, 2.7, 3]))


def test_check_actions_accepts_valid_integers():
    for a in [0, 6, np.uint8(2), np.int64(5), jnp.int32(3)]:
        check_actions(a)
    check_actions(np.arange(NUM_ACTIONS), batched=True)
    with pytest.raises(ValueError, match="scalar"):
        check_actions(np.array([1, 2]))


def test_under_jit_out_of_range_is_a_counted_no_op():
    """Under the caller's jit the action is traced: its dtype is still checked, an
    out-of-range value changes nothing and is flagged in info["invalid_action"]."""

    @jax.jit
    def run(key, actions):
        keys = jax.random.split(key, actions.shape[0])
        _, states = jax.vmap(ENV.reset_env, in_axes=(0, None))(keys, BabyAIParams())
        out = jax.vmap(lambda k, s, a: ENV.step(k, s, a))(keys, states, actions)
        return states, out

    states, (obs, s1, reward, done, info) = run(jax.random.key(3),
                                                jnp.array([99, 2, -1, 0], jnp.int32))
    assert np.asarray(info["invalid_action"]).tolist() == [True, False, True, False]
    assert int(jnp.sum(info["invalid_action"])) == 2
    for b in (0, 2):  # the invalid slots: nothing changed but the step count
        assert bool(info["no_op"][b]) and float(reward[b]) == 0.0
        np.testing.assert_array_equal(np.asarray(s1.grid[b]), np.asarray(states.grid[b]))
        np.testing.assert_array_equal(np.asarray(s1.agent_pos[b]), np.asarray(states.agent_pos[b]))
        assert int(s1.agent_dir[b]) == int(states.agent_dir[b]) and int(s1.step_count[b]) == 1
    with pytest.raises(TypeError, match="got dtype float32"):
        run(jax.random.key(3), jnp.array([2.7, 1.0], jnp.float32))
