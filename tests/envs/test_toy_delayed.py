"""DelayedEnv: the wrapped env's transitions, slowed by a per-step delay."""
import time

import pytest

from jaxdm.envs.toy import make_ordering_env
from jaxdm.envs.toy.delayed import DelayedEnv, make_delayed_env


@pytest.mark.parametrize("busy", [False, True])
def test_same_transitions_after_the_delay(busy):
    inner = make_ordering_env()
    env = make_delayed_env("jaxdm.envs.toy:make_ordering_env", step_delay_s=0.02, busy=busy)
    obs, state = env.reset(3)
    assert (obs, state) == inner.reset(3)
    assert env.reset_info(state) == inner.reset_info(state)  # hooks are the inner env's
    action = inner.reset_info(state)["admissible_actions"][0]
    t0 = time.perf_counter()
    out = env.step(0, state, action)
    assert time.perf_counter() - t0 >= 0.02
    assert out == inner.step(0, state, action)
    assert env.name == inner.name


def test_bad_delay_is_named():
    with pytest.raises(ValueError, match="step_delay_s must be a number of seconds >= 0"):
        DelayedEnv(make_ordering_env(), -1.0)
    with pytest.raises(ValueError, match="step_delay_s"):
        DelayedEnv(make_ordering_env(), "10ms")
    assert not hasattr(DelayedEnv(make_ordering_env(), 0.0), "warm_up")  # the inner has none
