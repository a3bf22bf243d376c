"""A strong BabyAI teacher policy for distillation (LVOPD, seed 001 §4.3): a *privileged*
MLP trained by SFT on BFS-solver demonstrations.

Why privileged. A memoryless policy on the 7 x 7 egocentric view cannot follow a plan
across rooms (an SFT'd view-MLP matched the solver on 88.6 % of held-out states and still
succeeded on only 14 % of training layouts). The standard teacher-student setup gives the
teacher information the student lacks; distillation only needs the teacher's log-probs over
the same 6 actions at the student's states. Our teacher sees, at the agent's pose, what the
BFS solver's distance field says (``jaxdm.envs.babyai.value.distance_field`` of the
episode's initial grid, computed once per episode):

- for each move (turn left, turn right, forward; forward into a closed door counts the
  toggle), the change of the cost-to-go relative to the current pose, clipped to
  [-1, 2] and one-hot, with a "blocked" bucket (5 x 3);
- facing the target (cost 0), no route (the field is infinite here);
- the front cell's type and state (one-hot 11 + 3), and the hands: free, holding the
  target, holding another object (3).

It does not see the solver's action: it must learn the argmin of the costs, to toggle a
closed door, to pick up when facing the target and to drop a wrong object, from labels.

SFT: cross-entropy on the greedy action of the shortest-path agent
(``jaxdm.rl.mc_validation.field_policy`` with eps = 0) at the states that noisy versions of
it visit (eps in ``EPS_MIX``: the teacher must be right away from the optimal path too,
where a weak student goes), on the "train" layouts. Actions: the student's 6 (left, right,
forward, pickup, drop, toggle; MiniGrid's "done" left out).

Pure functions (``teacher_features``, ``teacher_logits``) vmap over states; ``sft_teacher``
(host loop of jitted Adam steps) and ``teacher_success`` (one jitted scan over a batch of
episodes) train and measure it.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdm.envs.babyai import BabyAIParams
from jaxdm.envs.babyai.value import distance_field, move_costs
from jaxdm.rl import mc_validation as mc

__all__ = ["NUM_ACTIONS", "NUM_FEATURES", "EPS_MIX", "TeacherReport", "teacher_features",
           "teacher_logits", "init_teacher", "sft_teacher", "teacher_success"]

NUM_ACTIONS = 6                 # left, right, forward, pickup, drop, toggle
_DELTA_MIN, _DELTA_MAX = -1, 2  # clipped cost-to-go changes; one more bucket: blocked
_NUM_DELTA = _DELTA_MAX - _DELTA_MIN + 2
_NUM_TYPES, _NUM_STATES = 11, 3
NUM_FEATURES = 3 * _NUM_DELTA + 2 + _NUM_TYPES + _NUM_STATES + 3
EPS_MIX = (0.1, 0.3, 0.6)
_INF = 1 << 20


def _delta_one_hot(cost, here):
    blocked = (cost >= _INF) | (here >= _INF)
    delta = jnp.clip(cost - here, _DELTA_MIN, _DELTA_MAX) - _DELTA_MIN
    return jax.nn.one_hot(jnp.where(blocked, _NUM_DELTA - 1, delta), _NUM_DELTA)


def teacher_features(state, field) -> jax.Array:
    """The privileged features [NUM_FEATURES] of one state (vmap over a batch).

    ``field``: ``distance_field`` [W, H, 4] of the episode's initial grid."""
    (left, right, fwd), cell, _ = move_costs(state, field)
    here = field[state.agent_pos[0], state.agent_pos[1], state.agent_dir]
    hands_free = state.carrying[0] == 0
    holds_target = ~hands_free & (state.carrying[0] == state.target[0]) & (
        state.carrying[1] == state.target[1])
    flags = jnp.stack([here == 0, here >= _INF]).astype(jnp.float32)
    hands = jnp.stack([hands_free, holds_target, ~hands_free & ~holds_target]
                      ).astype(jnp.float32)
    return jnp.concatenate([
        _delta_one_hot(left, here), _delta_one_hot(right, here), _delta_one_hot(fwd, here),
        flags, jax.nn.one_hot(cell[0], _NUM_TYPES), jax.nn.one_hot(cell[2], _NUM_STATES),
        hands])


def init_teacher(key, hidden: int = 64) -> list[dict]:
    """MLP parameters [NUM_FEATURES, hidden, hidden, NUM_ACTIONS] (tanh)."""
    sizes = [NUM_FEATURES, hidden, hidden, NUM_ACTIONS]
    return [{"w": jax.random.normal(k, (a, b)) * jnp.sqrt(1.0 / a), "b": jnp.zeros((b,))}
            for k, (a, b) in zip(jax.random.split(key, 3), zip(sizes[:-1], sizes[1:]))]


def _mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def teacher_logits(params, state, field) -> jax.Array:
    """Logits over the 6 actions [..., 6] at ``state`` (one state; vmap for batches)."""
    return _mlp(params, teacher_features(state, field))


@dataclasses.dataclass(frozen=True)
class TeacherReport:
    label_accuracy: float   # greedy action == solver action on held-out visited states
    states: int             # training + held-out states
    sft_steps: int
    final_loss: float


@jax.jit
def _features_and_labels(states, fields):
    labels = jax.vmap(mc.field_policy, in_axes=(None, 0, 0, None))(
        jax.random.key(0), states, fields, jnp.float32(0.0))
    return jax.vmap(teacher_features)(states, fields), labels


def _visited_states(env, env_params, key, episodes: int, eps_mix):
    """(features [N, F], solver labels [N]) at the states noisy solvers visit (one recording
    program for every eps, one feature/label program for all states)."""
    states, fields = [], []
    for j, eps in enumerate(eps_mix):
        ep = mc.babyai_record_episodes(env, env_params, jax.random.fold_in(key, j),
                                       max(episodes // len(eps_mix), 1), eps)
        h = ep.actions.shape[1] + 1
        ii, tt = np.nonzero(np.arange(h)[None] < ep.lengths[:, None])
        states.append(jax.tree.map(lambda x: x[ii, tt], ep.states))
        fields.append(ep.fields[ii])
    states = jax.tree.map(lambda *xs: jnp.concatenate(xs), *states)
    x, y = _features_and_labels(states, jnp.concatenate(fields))
    return np.asarray(x), np.asarray(y)


def sft_teacher(env, key, *, episodes: int = 256, steps: int = 1500, batch: int = 512,
                lr: float = 3e-3, hidden: int = 64, max_steps: int = 128,
                eps_mix=EPS_MIX) -> tuple[list[dict], TeacherReport]:
    """Train the privileged teacher by SFT (cross-entropy) on solver labels at the states of
    ``episodes`` noisy-solver episodes on the "train" layouts; 10 % of states held out."""
    if episodes < 1 or steps < 1:
        raise ValueError(f"episodes ({episodes}) and steps ({steps}) must be >= 1")
    env_params = BabyAIParams.for_split("train", max_steps=max_steps)
    k_data, k_init = jax.random.split(key)
    x, y = _visited_states(env, env_params, k_data, episodes, tuple(eps_mix))
    if (y < 0).any() or (y >= NUM_ACTIONS).any():
        raise ValueError(f"solver labels outside the {NUM_ACTIONS} teacher actions: "
                         f"{np.unique(y)}")
    n = x.shape[0]
    perm = np.random.default_rng(0).permutation(n)
    test, train = perm[: max(n // 10, 1)], perm[max(n // 10, 1):]
    x, y = jnp.asarray(x), jnp.asarray(y, jnp.int32)
    opt = optax.adam(lr)
    params = init_teacher(k_init, hidden)
    state = opt.init(params)

    @jax.jit
    def step(params, state, idx):
        def loss(p):
            lp = jax.nn.log_softmax(_mlp(p, x[idx]))
            return -jnp.mean(jnp.take_along_axis(lp, y[idx][:, None], -1))
        val, g = jax.value_and_grad(loss)(params)
        up, state = opt.update(g, state, params)
        return optax.apply_updates(params, up), state, val

    rng = np.random.default_rng(1)
    val = jnp.nan
    for _ in range(steps):
        params, state, val = step(params, state,
                                  jnp.asarray(rng.choice(train, min(batch, len(train)))))
    acc = float(jnp.mean(jnp.argmax(_mlp(params, x[test]), -1) == y[test]))
    return params, TeacherReport(acc, n, steps, float(val))


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _success(env, params, key, env_params, num, greedy):
    k_task, k_act = jax.random.split(key)
    _, s0 = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(k_task, num),
                                                       env_params)
    fields = jax.vmap(distance_field)(s0)

    def body(carry, k):
        st, alive, won = carry
        logits = jax.vmap(teacher_logits, in_axes=(None, 0, 0))(params, st, fields)
        a = jnp.where(greedy, jnp.argmax(logits, -1),
                      jax.random.categorical(k, logits)).astype(jnp.int32)
        _, st2, r, term, trunc, _ = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))(
            k, st, a, env_params)
        st2 = jax.tree.map(lambda n, o: jnp.where(
            alive.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), st2, st)
        won = won | (alive & (r > 0))
        return (st2, alive & ~(term | trunc), won), None

    init = (s0, jnp.ones((num,), bool), jnp.zeros((num,), bool))
    (_, _, won), _ = jax.lax.scan(body, init, jax.random.split(k_act, env_params.max_steps))
    return won.mean()


def teacher_success(env, params, key, split: str = "train", *, episodes: int = 64,
                    max_steps: int = 128, greedy: bool = False) -> float:
    """Success rate of the teacher acting alone on ``episodes`` tasks of ``split`` (actions
    sampled from its softmax, or its argmax with ``greedy``)."""
    env_params = BabyAIParams.for_split(split, max_steps=max_steps)
    return float(_success(env, params, key, env_params, int(episodes), jnp.bool_(greedy)))
