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
(host loop of jitted Adam steps) and ``teacher_success`` train and measure it (the SFT data and
the teacher's success come from one compiled scan over a batch of episodes, ``_play``).

In the trainer (``teacher.kind: babyai_privileged``, the ``teacher_topk`` signal of LVOPD,
``jaxdm.rl.lvopd``): ``PrivilegedTopK`` gives the teacher's log-probs over all 6 actions
(K_T = 6) at every state the student acted in, ``episode_log_probs`` over the jax rollout's
recorded env states (one jitted pass, vmapped over episodes and steps). Its params come from
``teacher.path`` (an .npz of ``save_teacher``) or from ``cached_sft_teacher``: trained once
with ``SFTSettings`` and cached under ``$JAXDM_CACHE/babyai_teacher/`` keyed by the settings,
the room size and the feature format.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
from jaxdm.envs.babyai.value import distance_field, move_costs
from jaxdm.models.paths import cache_root
from jaxdm.rl import mc_validation as mc
from jaxdm.rl.signals import Signal

__all__ = ["NUM_ACTIONS", "NUM_FEATURES", "EPS_MIX", "TeacherReport", "teacher_features",
           "teacher_logits", "init_teacher", "sft_teacher", "teacher_success", "SFTSettings",
           "save_teacher", "load_teacher", "cached_sft_teacher", "episode_log_probs",
           "PrivilegedTopK", "build_topk_teacher"]

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
    """How the privileged BabyAI teacher's SFT went: its greedy action's agreement with the solver
    on held-out visited states, the states used, the SFT steps and the last loss."""
    label_accuracy: float   # greedy action == solver action on held-out visited states
    states: int             # training + held-out states
    sft_steps: int
    final_loss: float


@functools.partial(jax.jit, static_argnums=(0, 1))
def _play(env, env_params, task_keys, policy_keys, eps, teacher, use_teacher, greedy):
    """One program for the SFT data and the teacher's success: ``task_keys`` [B] episodes,
    acted by the noisy solver (``mc.field_policy`` with ``eps`` [B]) or, with ``use_teacher``,
    by the teacher (sampled, or argmax with ``greedy``); returns the teacher features
    [B, T, F] and solver labels [B, T] at every acting state, the acting mask [B, T] and
    success [B]. Env steps use key 0 (BabyAI steps are deterministic)."""
    _, s0 = jax.vmap(env.reset_env, in_axes=(0, None))(task_keys, env_params)
    fields = jax.vmap(distance_field)(s0)
    zero = jax.random.key(0)

    def body(carry, _):
        st, done, succ = carry
        feats = jax.vmap(teacher_features)(st, fields)
        labels = jax.vmap(mc.field_policy, in_axes=(None, 0, 0, None))(zero, st, fields,
                                                                       jnp.float32(0.0))
        solver = jax.vmap(mc.field_policy)(policy_keys, st, fields, eps)
        logits = _mlp(teacher, feats)
        keys = jax.vmap(jax.random.fold_in)(policy_keys, st.step_count)
        sampled = jax.vmap(jax.random.categorical)(keys, logits)
        taught = jnp.where(greedy, jnp.argmax(logits, -1), sampled)
        a = jnp.where(use_teacher, taught, solver).astype(jnp.int32)
        _, st2, _, term, trunc, _ = jax.vmap(env.step_env, in_axes=(None, 0, 0, None))(
            zero, st, a, env_params)
        st_new = jax.tree.map(lambda o, n: jnp.where(
            done.reshape((-1,) + (1,) * (o.ndim - 1)), o, n), st, st2)
        return (st_new, done | term | trunc, succ | (~done & term)), (feats, labels, ~done)

    b = task_keys.shape[0]
    init = (s0, jnp.zeros((b,), bool), jnp.zeros((b,), bool))
    (_, _, succ), (feats, labels, acting) = jax.lax.scan(body, init, None,
                                                         length=env_params.max_steps)
    sw = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    return sw(feats), sw(labels), sw(acting), succ


def _episode_keys(key, episodes: int, eps_mix):
    """(task keys [B], policy keys [B], eps [B]): ``episodes // len(eps_mix)`` episodes per
    eps, each eps's keys split from ``fold_in(key, j)`` (as ``mc.babyai_record_episodes``)."""
    n = max(episodes // len(eps_mix), 1)
    tks, pks, eps = [], [], []
    for j, e in enumerate(eps_mix):
        kt, kp = jax.random.split(jax.random.fold_in(key, j))
        tks.append(jax.random.split(kt, n))
        pks.append(jax.random.split(kp, n))
        eps += [e] * n
    return jnp.concatenate(tks), jnp.concatenate(pks), jnp.asarray(eps, jnp.float32)


def _visited_states(env, env_params, key, episodes: int, eps_mix, teacher):
    """(features [N, F], solver labels [N]) at the states noisy solvers visit (one program)."""
    tk, pk, eps = _episode_keys(key, episodes, eps_mix)
    feats, labels, acting, _ = _play(env, env_params, tk, pk, eps, teacher, jnp.bool_(False),
                                     jnp.bool_(False))
    acting = np.asarray(acting)
    return np.asarray(feats)[acting], np.asarray(labels)[acting]


def sft_teacher(env, key, *, episodes: int = 256, steps: int = 1500, batch: int = 512,
                lr: float = 3e-3, hidden: int = 64, max_steps: int = 128,
                eps_mix=EPS_MIX) -> tuple[list[dict], TeacherReport]:
    """Train the privileged teacher by SFT (cross-entropy) on solver labels at the states of
    ``episodes`` noisy-solver episodes on the "train" layouts; 10 % of states held out."""
    if episodes < 1 or steps < 1:
        raise ValueError(f"episodes ({episodes}) and steps ({steps}) must be >= 1")
    env_params = BabyAIParams.for_split("train", max_steps=max_steps)
    k_data, k_init = jax.random.split(key)
    params = init_teacher(k_init, hidden)
    x, y = _visited_states(env, env_params, k_data, episodes, tuple(eps_mix), params)
    if (y < 0).any() or (y >= NUM_ACTIONS).any():
        raise ValueError(f"solver labels outside the {NUM_ACTIONS} teacher actions: "
                         f"{np.unique(y)}")
    n = x.shape[0]
    perm = np.random.default_rng(0).permutation(n)
    test, train = perm[: max(n // 10, 1)], perm[max(n // 10, 1):]
    x, y = jnp.asarray(x), jnp.asarray(y, jnp.int32)
    opt = optax.adam(lr)
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


def teacher_success(env, params, key, split: str = "train", *, episodes: int = 64,
                    max_steps: int = 128, greedy: bool = False) -> float:
    """Success rate of the teacher acting alone on ``episodes`` tasks of ``split`` (actions
    sampled from its softmax, or its argmax with ``greedy``)."""
    env_params = BabyAIParams.for_split(split, max_steps=max_steps)
    tk, pk = jax.random.split(key)
    num = int(episodes)
    _, _, _, succ = _play(env, env_params, jax.random.split(tk, num), jax.random.split(pk, num),
                          jnp.zeros((num,), jnp.float32), params, jnp.bool_(True),
                          jnp.bool_(greedy))
    return float(np.asarray(succ).mean())


# ---- the teacher inside the trainer: LVOPD's ``teacher_topk`` for the symbolic policy ----
@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """What ``sft_teacher`` is called with; the cache key of a trained teacher (with the
    feature layout and the room size)."""

    episodes: int = 256
    steps: int = 1500
    batch: int = 512
    lr: float = 3e-3
    hidden: int = 64
    max_steps: int = 128
    eps_mix: tuple[float, ...] = EPS_MIX
    seed: int = 0


_FORMAT = 1  # bump when the features or the parameter layout change (invalidates caches)


def save_teacher(params, path) -> None:
    """Write teacher params as an .npz (``layer<i>/w``, ``layer<i>/b``), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"layer{i}/{k}": np.asarray(layer[k], np.float32)
              for i, layer in enumerate(params) for k in ("w", "b")}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez(f, format=np.int64(_FORMAT), **arrays)
    os.replace(tmp, path)


def load_teacher(path, *, key: str = "teacher.path") -> list[dict]:
    """Teacher params from ``save_teacher``'s .npz; errors name ``key`` and the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{key}: no teacher checkpoint at {path} (an .npz from "
                         "jaxdm.rl.babyai_teacher.save_teacher)")
    try:
        data = dict(np.load(path))
    except Exception as e:  # noqa: BLE001 - any unreadable file names the key
        raise ValueError(f"{key}: {path} is not a teacher .npz ({type(e).__name__}: {e})"
                         ) from None
    if int(data.pop("format", -1)) != _FORMAT:
        raise ValueError(f"{key}: {path} has teacher format {data.get('format')}, this code "
                         f"reads format {_FORMAT}")
    n = len(data) // 2
    params = []
    for i in range(n):
        try:
            layer = {k: jnp.asarray(data[f"layer{i}/{k}"]) for k in ("w", "b")}
        except KeyError as e:
            raise ValueError(f"{key}: {path} lacks array {e.args[0]!r}") from None
        params.append(layer)
    prev = NUM_FEATURES
    for i, layer in enumerate(params):
        w, b = layer["w"], layer["b"]
        if w.ndim != 2 or w.shape[0] != prev or b.shape != (w.shape[1],):
            raise ValueError(f"{key}: {path} layer{i} has w {w.shape}, b {b.shape}; expected "
                             f"w [{prev}, n], b [n]")
        if not (np.isfinite(np.asarray(w)).all() and np.isfinite(np.asarray(b)).all()):
            raise ValueError(f"{key}: {path} layer{i} holds non-finite values")
        prev = w.shape[1]
    if not params or prev != NUM_ACTIONS:
        raise ValueError(f"{key}: {path} must end in {NUM_ACTIONS} action logits, got {prev}")
    return params


def cached_sft_teacher(room_size: int, settings: SFTSettings = SFTSettings(), *,
                       cache_dir=None, log=print) -> tuple[list[dict], str]:
    """The SFT teacher for ``room_size``, trained once and cached as an .npz keyed by
    ``settings``, the room size and the feature format (``$JAXDM_CACHE/babyai_teacher/``, or
    ``cache_dir``); returns ``(params, path)``."""
    spec = {"format": _FORMAT, "features": NUM_FEATURES, "room_size": int(room_size),
            **dataclasses.asdict(settings)}
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    if cache_dir is None:
        cache_dir = cache_root() / "babyai_teacher"
    path = Path(cache_dir) / f"teacher_{digest}.npz"
    if path.is_file():
        return load_teacher(path, key=f"teacher cache {path}"), str(path)
    s = settings
    params, rep = sft_teacher(BabyAIEnv(int(room_size)), jax.random.key(s.seed),
                              episodes=s.episodes, steps=s.steps, batch=s.batch, lr=s.lr,
                              hidden=s.hidden, max_steps=s.max_steps, eps_mix=s.eps_mix)
    save_teacher(params, path)
    Path(str(path)[:-4] + ".json").write_text(json.dumps(
        {**spec, "report": dataclasses.asdict(rep)}, indent=1))
    if log:
        log(f"babyai teacher: trained by SFT ({rep}), cached at {path}")
    return params, str(path)


@jax.jit
def episode_log_probs(params, states) -> jax.Array:
    """The teacher's log-probs [B, T, 6] at the first T states of every episode (``states``:
    a stacked BabyAIState with leaves [B, T + 1, ...], e.g. ``RecordedBatch.states`` of the
    jax rollout), each episode's distance field from its first state. One program: fields
    and teacher vmapped over episodes and steps."""
    s0 = jax.tree.map(lambda x: x[:, 0], states)
    fields = jax.vmap(distance_field)(s0)
    acting = jax.tree.map(lambda x: x[:, :-1], states)
    per_step = jax.vmap(teacher_logits, in_axes=(None, 0, None))
    logits = jax.vmap(per_step, in_axes=(None, 0, 0))(params, acting, fields)
    return jax.nn.log_softmax(logits, -1)


class PrivilegedTopK:
    """The ``teacher_topk`` backend of ``teacher.kind: babyai_privileged``: the teacher's
    log-probs over all 6 actions (K_T = 6 = the whole action set) at every state the student
    acted in, from the rollout's recorded env states (``EpisodeBatch.recorded``) in one jitted
    vmapped pass (``episode_log_probs``)."""

    def __init__(self, params, source: str = ""):
        self.params, self.source = params, source
        self.k = NUM_ACTIONS

    def topk_signal(self, episodes):
        """The teacher_topk Signal of a jax-rollout EpisodeBatch: per training unit (N of them) the
        teacher's log-probs over all 6 actions (ids [N, 6], logprobs [N, 6] float32, offsets [N +
        1], unit_ok [N]), the episode mask [B] and request counts; episodes without stacked recorded
        states, or non-finite log-probs, are ValueErrors."""
        rec = episodes.recorded
        if rec is None or isinstance(rec.states, (list, tuple)):
            raise ValueError("teacher.kind 'babyai_privileged' reads the stacked env states of "
                             "the jax rollout (EpisodeBatch.recorded.states)")
        t0 = time.perf_counter()
        b, t = episodes.mask.shape
        lp = np.asarray(episode_log_probs(self.params, rec.states))          # [B, T', 6]
        if lp.shape[:2] != (b, t):
            raise ValueError(f"recorded states give teacher log-probs {lp.shape[:2]}, the "
                             f"batch mask is {(b, t)}")
        rows, cols = np.asarray(episodes.unit_rows), np.asarray(episodes.unit_cols)
        n = len(rows)
        logprobs = lp[rows, cols].astype(np.float32)                          # [N, 6]
        if not np.isfinite(logprobs).all():
            raise ValueError("teacher_topk: the privileged teacher gave non-finite log-probs")
        ids = np.broadcast_to(np.arange(NUM_ACTIONS, dtype=np.int32), (n, NUM_ACTIONS)).copy()
        mask = np.zeros((b,), bool)
        mask[rows] = True
        stats = {"teacher_topk/requests": float(mask.sum()), "teacher_topk/failures": 0.0,
                 "teacher_topk/tokens": float(n),
                 "teacher_topk/seconds": time.perf_counter() - t0}
        return Signal({"ids": ids, "logprobs": logprobs,
                       "offsets": np.arange(n + 1, dtype=np.int64),
                       "unit_ok": np.ones((n,), bool)}, mask, stats)


def build_topk_teacher(cfg, trainer=None) -> PrivilegedTopK:
    """``teacher.kind: babyai_privileged``: params from ``teacher.path`` (an .npz of
    ``save_teacher``), else the cached SFT teacher (``cached_sft_teacher``, seed
    ``teacher.seed``) for ``env.kwargs.room_size``."""
    if cfg.env.name != "babyai_jax":
        raise ValueError(f"teacher.kind: 'babyai_privileged' teaches env.name 'babyai_jax', "
                         f"not {cfg.env.name!r}")
    if cfg.teacher.path:
        return PrivilegedTopK(load_teacher(cfg.teacher.path), str(cfg.teacher.path))
    room = int(dict(cfg.env.kwargs).get("room_size", 8))
    params, path = cached_sft_teacher(room, SFTSettings(seed=int(cfg.teacher.seed)))
    return PrivilegedTopK(params, path)
