"""Both env pools record the per-step env states (one batch type), with one key schedule:
the states a rollout records replay its episodes exactly in either pool."""
import jax

from jaxdm.envs.core import step_key
from jaxdm.envs.local import LocalVectorEnv
from jaxdm.envs.toy import make_ordering_env
from jaxdm.envs.vector import EnvFactory, VectorEnv
from jaxdm.rl.policy import ActionOut
from jaxdm.rl.rollout import rollout


class FirstOption:
    """A deterministic policy: always the first admissible action."""
    form = "option"

    def act(self, params, states, key, *, greedy=False, pad_to=None):
        return [ActionOut(s.admissible[0], True, s.admissible[0], 0.0, {}) for s in states]


def test_states_recorded_and_replayable_in_both_pools():
    env = make_ordering_env(budget=4)
    kw = dict(seed=7, key=jax.random.key(0), max_actions=4)
    local = rollout(FirstOption(), None, LocalVectorEnv(env, 2, group_size=1), **kw)
    with VectorEnv(EnvFactory("jaxdm.envs.toy:make_ordering_env", {"budget": 4}), 2,
                   num_workers=1, max_steps=4) as venv:
        remote = rollout(FirstOption(), None, venv, **kw)
    for a, b in zip(local.episodes, remote.episodes):
        assert a.initial_state == b.initial_state is not None
        assert [x.state for x in a.actions] == [x.state for x in b.actions]
        # replay from the recorded initial state with the one key schedule
        state = a.initial_state
        for t, rec in enumerate(a.actions):
            _, state, _, _, _ = env.step(step_key(a.task_seed, t), state, rec.command)
            assert state == rec.state
