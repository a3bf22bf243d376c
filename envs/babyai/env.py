"""JAX-native six-room BabyAI pickup world (gymnax style: pure, jittable, vmappable).

Dynamics follow MiniGrid 3.2 exactly (the tests compare both engines step by step): the
primitive actions turn left / turn right / forward / pickup / drop / toggle / done, a 7 x 7
egocentric view with walls and closed doors occluding what lies behind them, one carried
object, toggling a door opens or closes it (a locked door opens with a key of its colour),
toggling a box opens it and, being empty, it vanishes. An episode is one instruction "pick up
the <colour> <type>"; reward 1 when the target is picked up (the episode then terminates),
0 otherwise; truncation after ``max_steps`` (128). Picking up another object gives nothing
and the agent must drop it before it can pick up the target.

Tasks. Each reset draws a door distance d from the params' range, then a connected set of
doors (each of the 7 walls between neighbouring rooms holds at most one closed door, at a
random position) with an agent room and a target room exactly d doors apart, 18 objects
(each colour x type once, 1-5 per room, never touching a wall or each other, so no object
blocks a door or another object), the target among the objects of its room, and the agent
on a free cell of its room; with ``lock_prob`` > 0 the first door of the route may be locked,
its key lying in the start room. The door distance is the fewest doors on any route from the
agent to a cell next to the target (the tests recompute it by brute force on the grid).
Splits: "train" and "id_test" use d in 1..3, "ood_test" d in 4..5; a layout's split is fixed
by its door geometry (``layout.geometry_split``), so the three splits never share a layout.

Every array keeps a fixed shape, so ``reset`` and ``step`` jit and vmap over thousands of
environments; generation samples from precomputed tables (``layout.py``) with no Python loop
per environment.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdm.envs.babyai import layout as L
from jaxdm.envs.core import Environment

NUM_ACTIONS = 7
LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE, DONE = range(NUM_ACTIONS)
ACTION_NAMES = ("left", "right", "forward", "pickup", "drop", "toggle", "done")
VIEW_SIZE = 7
SPLIT_CODES = {name: i for i, name in enumerate(L.SPLITS)}


@struct.dataclass
class BabyAIState:
    """One episode. ``grid`` is MiniGrid's ``Grid.encode()`` layout: uint8 [W, H, 3]."""

    grid: jax.Array  # uint8 [W, H, 3]: (object type, colour, state) per cell
    agent_pos: jax.Array  # int32 [2]: (x, y)
    agent_dir: jax.Array  # int32 []: 0 east, 1 south, 2 west, 3 north
    carrying: jax.Array  # int32 [2]: (type, colour) of the carried object; type 0 = nothing
    target: jax.Array  # int32 [2]: (type, colour) of the object to pick up
    step_count: jax.Array  # int32 []
    # Task description (fixed for the episode; used by splits, text milestones and tests).
    door_mask: jax.Array  # int32 []: bit e set = door slot e holds a door
    door_offsets: jax.Array  # int32 [7]: position of each slot's door along its wall
    door_distance: jax.Array  # int32 []: doors on the shortest route to the target
    agent_room: jax.Array  # int32 []: the start room
    target_room: jax.Array  # int32 []
    split: jax.Array  # int32 []: 0 train, 1 ID test, 2 OOD test


@struct.dataclass
class BabyAIParams:
    """Episode settings; ``split`` picks the layout pool, the distances the task length."""

    max_steps: int = 128
    split: int = 0
    min_door_distance: int = 1
    max_door_distance: int = 3
    # Chance that the first door on the route is locked; its key (same colour) then lies in
    # the agent's start room. MiniGrid semantics: toggle with the key to unlock and open.
    lock_prob: float = 0.0

    @classmethod
    def for_split(cls, split: str, max_steps: int = 128,
                  lock_prob: float = 0.0) -> "BabyAIParams":
        """Params of a named split: "train" / "id_test" (distance 1-3), "ood_test" (4-5)."""
        if split not in SPLIT_CODES:
            raise ValueError(f"split must be one of {L.SPLITS}, got {split!r}")
        lo, hi = L.SPLIT_DOOR_DISTANCES[split]
        return cls(max_steps=max_steps, split=SPLIT_CODES[split], min_door_distance=lo,
                   max_door_distance=hi, lock_prob=lock_prob)


@struct.dataclass
class BabyAIObs:
    """What the agent sees: MiniGrid's image encoding of its view, its heading, the mission."""

    image: jax.Array  # uint8 [7, 7, 3], indexed [view column, view row]; agent at (3, 6)
    direction: jax.Array  # int32 []
    mission: jax.Array  # int32 [2]: (type, colour) of the target


def _check_params(params: BabyAIParams) -> None:
    """Validate concrete params (skipped when traced, e.g. params vmapped by a caller)."""
    try:
        lo, hi = int(params.min_door_distance), int(params.max_door_distance)
        split, max_steps = int(params.split), int(params.max_steps)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return
    if not 1 <= lo <= hi <= L.MAX_DOOR_DISTANCE:
        raise ValueError(f"door distances must satisfy 1 <= min <= max <= "
                         f"{L.MAX_DOOR_DISTANCE}, got min={lo}, max={hi}")
    if split not in (0, 1, 2):
        raise ValueError(f"params.split must be 0 (train), 1 (id_test) or 2 (ood_test), "
                         f"got {split}")
    if max_steps < 1:
        raise ValueError(f"params.max_steps must be >= 1, got {max_steps}")
    lock_prob = float(params.lock_prob)
    if not 0.0 <= lock_prob <= 1.0:
        raise ValueError(f"params.lock_prob must be in [0, 1], got {lock_prob}")


def check_actions(action: Any, batched: bool = False) -> None:
    """Host-side action check at the API boundary (the jitted core stays pure).

    Actions must be integers in ``[0, NUM_ACTIONS)`` (bools and floats such as 2.7 are
    rejected, never truncated). A traced action (``env.step`` called under the caller's
    ``jit``/``vmap``) can only have its dtype checked here; inside the jitted core an
    out-of-range action changes nothing and is flagged in ``info["invalid_action"]``, so
    such callers can count them.
    """
    what = "actions" if batched else "action"
    dtype = getattr(action, "dtype", None)
    if isinstance(action, jax.core.Tracer):
        if not jnp.issubdtype(dtype, jnp.integer):
            raise TypeError(f"{what} must be integers in [0, {NUM_ACTIONS}) "
                            f"({', '.join(ACTION_NAMES)}), got dtype {dtype}")
        return
    arr = np.asarray(action)
    if arr.dtype.kind not in "iu":
        shown = arr.tolist() if arr.size <= 8 else f"an array of shape {arr.shape}"
        raise TypeError(f"{what} must be integers in [0, {NUM_ACTIONS}) "
                        f"({', '.join(ACTION_NAMES)}), got {arr.dtype} {shown}")
    if not batched and arr.ndim != 0:
        raise ValueError(f"action must be a scalar int per env (vmap for batches), "
                         f"got shape {arr.shape}")
    bad = np.flatnonzero((arr < 0) | (arr >= NUM_ACTIONS))
    if bad.size:
        where = f"actions[{int(bad[0])}] = {arr.reshape(-1)[bad[0]]}" if batched \
            else f"action {int(arr)}"
        raise ValueError(f"{where} is out of range: BabyAI actions are 0..{NUM_ACTIONS - 1} "
                         f"({', '.join(ACTION_NAMES)}); {bad.size} invalid")


def _check_key(key: Any, batched: bool = False) -> None:
    """Keys must be JAX PRNG keys (typed, or raw uint32 [2]); ints are not silently seeded."""
    if isinstance(key, jax.core.Tracer):
        return
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if key.ndim != int(batched):
            raise ValueError(f"expected {'a [B] batch of keys' if batched else 'one key'}, "
                             f"got key shape {key.shape}")
        return
    if dtype == jnp.uint32 and key.ndim == 1 + int(batched) and key.shape[-1] == 2:
        return
    raise TypeError(f"key must be a JAX PRNG key (jax.random.key(seed)), got "
                    f"{type(key).__name__} {getattr(key, 'shape', '')}")


class BabyAIEnv(Environment[BabyAIState, BabyAIParams]):
    """Six rooms (2 x 3), closed doors, 18 objects, one pickup instruction.

    ``reset(key, params) -> (obs, state)`` and ``step(key, state, action, params) -> (obs,
    state, reward, done, info)`` are jitted with ``self`` static; vmap them for batches.
    ``step`` auto-resets: when ``done`` the returned obs/state are a fresh episode, and
    ``info`` holds ``terminated``, ``truncated`` (kept separate), ``final_obs`` (the obs the
    step led to, before the reset), ``no_op``, ``picked_wrong`` and ``invalid_action``.
    ``step`` and ``step_batch`` reject actions outside 0..6 (and non-integer actions) on the
    host (``check_actions``); under a caller's ``jit`` an out-of-range action is a counted
    no-op (``info["invalid_action"]``).
    """

    name = "babyai"

    def __init__(self, room_size: int = 8):
        self.tables = L.layout_tables(room_size)
        self.room_size = room_size
        self.width, self.height = self.tables.width, self.tables.height
        t = self.tables
        # Constants as numpy (jnp conversion happens at trace time, never per env).
        self._base_grid = t.base_grid
        self._dir_vec = L.DIR_TO_VEC
        self._origins = np.array([t.room_origin(r) for r in range(L.NUM_ROOMS)], np.int32)

    # --- public API (jitted, self static) -----------------------------------------------
    @property
    def default_params(self) -> BabyAIParams:
        """BabyAIParams() (the training split's task distribution)."""
        return BabyAIParams()

    @property
    def num_actions(self) -> int:
        """The action count (left, right, forward, pickup, drop, toggle, done)."""
        return NUM_ACTIONS

    def reset(self, key: jax.Array, params: BabyAIParams | None = None):
        """A new episode from PRNG ``key`` (checked, as are the params): (BabyAIObs, BabyAIState);
        jittable and vmappable."""
        params = self.default_params if params is None else params
        _check_key(key)
        _check_params(params)
        return self._reset(key, params)

    def step(self, key: jax.Array, state: BabyAIState, action: Any,
             params: BabyAIParams | None = None):
        """One action (an int or int array, checked) from ``state``: (obs, state, reward, done,
        info), auto-resetting a finished episode; jittable and vmappable."""
        params = self.default_params if params is None else params
        _check_key(key)
        check_actions(action)
        return self._step(key, state, jnp.asarray(action, jnp.int32), params)

    @functools.partial(jax.jit, static_argnums=0)
    def _reset(self, key, params):
        return self.reset_env(key, params)

    @functools.partial(jax.jit, static_argnums=0)
    def _step(self, key, state, action, params):
        if action.shape != ():
            raise ValueError(f"action must be a scalar int per env (vmap for batches), "
                             f"got shape {action.shape}")
        key_step, key_reset = jax.random.split(key)
        obs_st, state_st, reward, terminated, truncated, extra = self.step_env(
            key_step, state, action, params)
        obs_re, state_re = self.reset_env(key_reset, params)
        done = terminated | truncated
        state_out = jax.tree_util.tree_map(lambda r, s: jnp.where(done, r, s), state_re, state_st)
        obs_out = jax.tree_util.tree_map(lambda r, s: jnp.where(done, r, s), obs_re, obs_st)
        info = {"terminated": terminated, "truncated": truncated, "final_obs": obs_st, **extra}
        return obs_out, state_out, reward, done, info

    def step_batch(self, keys: jax.Array, states: BabyAIState, actions: jax.Array,
                   params: BabyAIParams | None = None):
        """``vmap(step)`` over a batch, with the same results, but resetting only when needed.

        Under ``vmap`` an auto-reset is a select, so ``vmap(step)`` generates a new task for
        every env at every step. Here the batch is reset inside a ``lax.cond`` taken only
        when some env is done, which makes steps without episode ends much cheaper.
        ``keys``: [B] keys; ``actions``: int [B].
        """
        params = self.default_params if params is None else params
        check_actions(actions, batched=True)
        actions = jnp.asarray(actions, jnp.int32)
        _check_key(keys, batched=True)
        if actions.ndim != 1 or keys.shape[0] != actions.shape[0]:
            raise ValueError(f"step_batch needs keys [B] and actions [B], got keys "
                             f"{keys.shape} and actions {actions.shape}")
        return self._step_batch(keys, states, actions, params)

    @functools.partial(jax.jit, static_argnums=0)
    def _step_batch(self, keys, states, actions, params):
        pairs = jax.vmap(jax.random.split)(keys)
        key_step, key_reset = pairs[:, 0], pairs[:, 1]
        obs_st, state_st, reward, terminated, truncated, extra = jax.vmap(
            self.step_env, in_axes=(0, 0, 0, None))(key_step, states, actions, params)
        done = terminated | truncated

        def with_reset(_):
            obs_re, state_re = jax.vmap(self.reset_env, in_axes=(0, None))(key_reset, params)

            def pick(r, s):
                return jnp.where(done.reshape((-1,) + (1,) * (r.ndim - 1)), r, s)

            return (jax.tree_util.tree_map(pick, obs_re, obs_st),
                    jax.tree_util.tree_map(pick, state_re, state_st))

        obs, state = jax.lax.cond(jnp.any(done), with_reset, lambda _: (obs_st, state_st), None)
        info = {"terminated": terminated, "truncated": truncated, "final_obs": obs_st, **extra}
        return obs, state, reward, done, info

    # --- generation ---------------------------------------------------------------------
    def reset_env(self, key: jax.Array, params: BabyAIParams):
        """A generated task from ``key`` and its first observation."""
        state = self.generate(key, params)
        return self.get_obs(state), state

    def generate(self, key: jax.Array, params: BabyAIParams) -> BabyAIState:
        """Sample one task of ``params``' split and door-distance range (pure, jittable)."""
        t = self.tables
        n_off = t.num_offsets
        # One threefry call for every draw of the task (64 words); much cheaper than a key
        # split per draw when thousands of envs reset at once.
        bits = jax.random.bits(key, (64,), jnp.uint32)
        draw = _Draws(bits)

        # 1. Door distance, then a (door mask, agent room, target room) triple at it.
        dist = params.min_door_distance + draw.below(
            params.max_door_distance - params.min_door_distance + 1)
        row = draw.below(jnp.asarray(t.route_counts)[dist])
        mask, agent_room, target_room, first_slot = jnp.asarray(t.route_table)[dist, row]
        present = (mask >> jnp.arange(L.NUM_DOOR_SLOTS)) & 1

        # 2. Door positions; the first present door is set so the geometry's residue
        #    (sum of present offsets mod n_off) falls in the split's range.
        offsets = draw.below(n_off, L.NUM_DOOR_SLOTS)
        first = jnp.argmax(present)
        rest = jnp.sum(offsets * present) - offsets[first]
        residue = jnp.where(params.split == 0, draw.below(n_off - 2),
                            jnp.where(params.split == 1, n_off - 2, n_off - 1))
        offsets = offsets.at[first].set(jnp.mod(residue - rest, n_off))
        door_colours = draw.below(len(L.COLOR_NAMES), L.NUM_DOOR_SLOTS)

        grid = jnp.asarray(self._base_grid)
        door_xy = jnp.asarray(t.door_base) + offsets[:, None] * jnp.asarray(t.door_axis)
        door_enc = jnp.stack([jnp.full((L.NUM_DOOR_SLOTS,), L.DOOR), door_colours,
                              jnp.full((L.NUM_DOOR_SLOTS,), L.DOOR_CLOSED)], -1)
        wall_enc = jnp.array([L.WALL, L.WALL_COLOR, 0])
        cell_enc = jnp.where(present[:, None] == 1, door_enc, wall_enc).astype(jnp.uint8)
        grid = grid.at[door_xy[:, 0], door_xy[:, 1]].set(cell_enc)

        # 3. Objects: a random order of the 18 identities, shared out among the rooms.
        perm = jnp.argsort(draw.take(L.NUM_OBJECTS)).astype(jnp.int32)
        comps = jnp.asarray(t.compositions)
        counts = comps[draw.below(comps.shape[0])]  # [6]
        starts = jnp.cumsum(counts) - counts
        set_counts = jnp.asarray(t.object_set_counts)
        set_rows = draw.below(set_counts[counts], L.NUM_ROOMS)
        cells = jnp.asarray(t.object_sets)[counts, set_rows]  # [6, k_max] inner-cell ids
        slot = jnp.arange(t.k_max)
        valid = slot[None, :] < counts[:, None]  # [6, k_max]
        ident = perm[jnp.clip(starts[:, None] + slot[None, :], 0, L.NUM_OBJECTS - 1)]
        origins = jnp.asarray(self._origins)
        ox = origins[:, :1] + 2 + cells % t.inner_side
        oy = origins[:, 1:] + 2 + cells // t.inner_side
        ox = jnp.where(valid, ox, self.width)  # out of bounds: dropped by the scatter
        types = jnp.asarray(L.OBJECT_TYPES)[ident // len(L.COLOR_NAMES)]
        colours = ident % len(L.COLOR_NAMES)
        obj_enc = jnp.stack([types, colours, jnp.zeros_like(types)], -1).astype(jnp.uint8)
        grid = grid.at[ox.reshape(-1), oy.reshape(-1)].set(obj_enc.reshape(-1, 3), mode="drop")

        target_slot = draw.below(counts[target_room])
        target_ident = perm[starts[target_room] + target_slot]
        target = jnp.stack([jnp.asarray(L.OBJECT_TYPES)[target_ident // len(L.COLOR_NAMES)],
                            target_ident % len(L.COLOR_NAMES)]).astype(jnp.int32)

        # 4. Optionally lock the route's first door, coloured like a key of the start room.
        ident_a = ident[agent_room]  # [k_max] identities in the agent's room
        is_key = valid[agent_room] & (ident_a // len(L.COLOR_NAMES) == L.OBJECT_TYPES.index(L.KEY))
        key_pick = jnp.argmax(jnp.where(is_key, draw.take(t.k_max), 0))
        lock = jnp.any(is_key) & (draw.below(1 << 20) < params.lock_prob * (1 << 20))
        lock_xy = door_xy[first_slot]
        locked_cell = jnp.stack([L.DOOR, ident_a[key_pick] % len(L.COLOR_NAMES), L.DOOR_LOCKED])
        grid = grid.at[lock_xy[0], lock_xy[1]].set(
            jnp.where(lock, locked_cell.astype(jnp.uint8), grid[lock_xy[0], lock_xy[1]]))

        # 5. Agent: a uniformly chosen empty cell of its room with an empty neighbour
        #    (computed on the room's own window of the grid).
        rs = self.room_size
        origin = origins[agent_room]
        window = jax.lax.dynamic_slice(grid[:, :, 0], (origin[0], origin[1]), (rs, rs))
        empty = window == L.EMPTY
        has_exit = empty[2:, 1:-1] | empty[:-2, 1:-1] | empty[1:-1, 2:] | empty[1:-1, :-2]
        ok = (empty[1:-1, 1:-1] & has_exit).reshape(-1)  # [(rs - 2) ** 2]
        pick = draw.below(jnp.sum(ok))
        flat = jnp.argmax(jnp.cumsum(ok) > pick)
        agent_pos = jnp.stack([origin[0] + 1 + flat // (rs - 2),
                               origin[1] + 1 + flat % (rs - 2)]).astype(jnp.int32)
        agent_dir = draw.below(4)

        return BabyAIState(
            grid=grid, agent_pos=agent_pos, agent_dir=agent_dir.astype(jnp.int32),
            carrying=jnp.zeros((2,), jnp.int32), target=target,
            step_count=jnp.zeros((), jnp.int32), door_mask=mask.astype(jnp.int32),
            door_offsets=offsets.astype(jnp.int32), door_distance=dist.astype(jnp.int32),
            agent_room=agent_room.astype(jnp.int32), target_room=target_room.astype(jnp.int32),
            split=jnp.asarray(params.split, jnp.int32),
        )

    # --- dynamics -------------------------------------------------------------------------
    def step_env(self, key: jax.Array, state: BabyAIState, action: jax.Array,
                 params: BabyAIParams):
        """One MiniGrid transition without auto-reset.

        Returns (obs, state, reward, terminated, truncated, extra info).
        """
        del key  # the dynamics are deterministic
        a = action
        dir_vec = jnp.asarray(self._dir_vec)
        fwd = state.agent_pos + dir_vec[state.agent_dir]
        fx, fy = fwd[0], fwd[1]
        cell = state.grid[fx, fy].astype(jnp.int32)
        ctype, ccol, cstate = cell[0], cell[1], cell[2]
        is_empty = ctype == L.EMPTY
        is_door = ctype == L.DOOR
        pickable = (ctype == L.KEY) | (ctype == L.BALL) | (ctype == L.BOX)
        hands_free = state.carrying[0] == 0

        new_dir = jnp.where(a == LEFT, (state.agent_dir + 3) % 4,
                            jnp.where(a == RIGHT, (state.agent_dir + 1) % 4, state.agent_dir))
        can_enter = is_empty | (is_door & (cstate == L.DOOR_OPEN))
        new_pos = jnp.where((a == FORWARD) & can_enter, fwd, state.agent_pos)

        do_pick = (a == PICKUP) & pickable & hands_free
        do_drop = (a == DROP) & is_empty & ~hands_free
        toggle_door = (a == TOGGLE) & is_door
        toggle_box = (a == TOGGLE) & (ctype == L.BOX)
        has_key = (state.carrying[0] == L.KEY) & (state.carrying[1] == ccol)
        door_next = jnp.where(cstate == L.DOOR_LOCKED,
                              jnp.where(has_key, L.DOOR_OPEN, L.DOOR_LOCKED),
                              jnp.where(cstate == L.DOOR_OPEN, L.DOOR_CLOSED, L.DOOR_OPEN))
        empty_cell = jnp.array([L.EMPTY, 0, 0], jnp.int32)
        new_cell = jnp.where(do_pick | toggle_box, empty_cell, cell)
        new_cell = jnp.where(do_drop, jnp.stack([state.carrying[0], state.carrying[1], 0]),
                             new_cell)
        new_cell = jnp.where(toggle_door, jnp.stack([ctype, ccol, door_next]), new_cell)
        grid = state.grid.at[fx, fy].set(new_cell.astype(jnp.uint8))
        carrying = jnp.where(do_pick, jnp.stack([ctype, ccol]),
                             jnp.where(do_drop, jnp.zeros((2,), jnp.int32), state.carrying))

        picked_target = do_pick & (ctype == state.target[0]) & (ccol == state.target[1])
        step_count = state.step_count + 1
        new_state = state.replace(grid=grid, agent_pos=new_pos, agent_dir=new_dir,
                                  carrying=carrying, step_count=step_count)
        reward = picked_target.astype(jnp.float32)
        terminated = picked_target
        truncated = step_count >= params.max_steps
        no_op = ((new_dir == state.agent_dir) & jnp.all(new_pos == state.agent_pos)
                 & jnp.all(new_cell == cell) & jnp.all(carrying == state.carrying))
        invalid = (a < 0) | (a >= NUM_ACTIONS)  # a no-op here; rejected on the host API
        extra = {"no_op": no_op, "picked_wrong": do_pick & ~picked_target,
                 "invalid_action": invalid}
        return self.get_obs(new_state), new_state, reward, terminated, truncated, extra

    # --- observation ----------------------------------------------------------------------
    def get_obs(self, state: BabyAIState) -> BabyAIObs:
        """The agent's observation: its egocentric view image, direction and the mission's target.
        """
        return BabyAIObs(image=self.egocentric_view(state), direction=state.agent_dir,
                         mission=state.target)

    def egocentric_view(self, state: BabyAIState) -> jax.Array:
        """MiniGrid's partial view: uint8 [7, 7, 3] with occluded cells encoded as 0.

        The view is an axis-aligned 7 x 7 window of the (wall-padded) grid, rotated so the
        agent looks "up" from (3, 6); occlusion follows MiniGrid's ``Grid.process_vis``.
        """
        v = VIEW_SIZE
        g = state.grid
        pad_values = (L.WALL, L.WALL_COLOR, 0)  # outside the grid MiniGrid shows walls
        padded = jnp.stack([jnp.pad(g[..., c], _VIEW_PAD, constant_values=pad_values[c])
                            for c in range(3)], -1)
        start = state.agent_pos + jnp.asarray(_VIEW_START)[state.agent_dir] + _VIEW_PAD
        window = jax.lax.dynamic_slice(padded, (start[0], start[1], 0), (v, v, 3))
        # MiniGrid rotates the window left (counter-clockwise) dir + 1 times.
        turned = [window]
        for _ in range(3):
            turned.append(jnp.flip(jnp.swapaxes(turned[-1], 0, 1), axis=1))
        cells = jnp.stack([turned[1], turned[2], turned[3], turned[0]])[state.agent_dir]

        opaque = (cells[..., 0] == L.WALL) | (
            (cells[..., 0] == L.DOOR) & (cells[..., 2] != L.DOOR_OPEN))
        visible = _visibility(~opaque)
        # The agent's own cell shows what it carries (MiniGrid places it there).
        held = jnp.stack([state.carrying[0], state.carrying[1], 0]).astype(jnp.uint8)
        agent_cell = jnp.where(state.carrying[0] > 0, held,
                               jnp.array([L.EMPTY, 0, 0], jnp.uint8))
        cells = cells.at[v // 2, v - 1].set(agent_cell)
        return jnp.where(visible[..., None], cells, jnp.zeros_like(cells))


# View window: its top-left corner relative to the agent for each heading (east, south,
# west, north), and the grid padding that keeps every window inside the padded grid.
_VIEW_START = np.array([[0, -3], [-3, 0], [-6, -3], [-3, -6]], np.int32)
_VIEW_PAD = VIEW_SIZE - 2


class _Draws:
    """Hands out consecutive words of one ``jax.random.bits`` draw as bounded integers."""

    def __init__(self, bits: jax.Array):
        self.bits = bits
        self.used = 0

    def take(self, n: int) -> jax.Array:
        if self.used + n > self.bits.shape[0]:
            raise ValueError(f"generation needs more than {self.bits.shape[0]} random words")
        out = self.bits[self.used:self.used + n]
        self.used += n
        return out

    def below(self, bound, n: int | None = None) -> jax.Array:
        """Integers in [0, bound) (bound may be traced and >= 1) from 24 random bits each."""
        words = self.take(1 if n is None else n)
        u = (words >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # uniform in [0, 1)
        bound = jnp.asarray(bound)
        out = jnp.minimum(jnp.floor(u * bound).astype(jnp.int32), bound - 1)
        return out[0] if n is None else out


def _visibility(see: jax.Array) -> jax.Array:
    """MiniGrid's occlusion sweep on a [7, 7] see-through mask, one table lookup per row.

    Rows are swept from the agent's row (j = 6) away from it; a row's outcome (which of its
    cells are visible, and which cells of the next row its visible see-through cells reveal)
    depends only on its 7 see-through bits and its 7 incoming visibility bits, so it is read
    from ``layout.visibility_table()`` (2 ** 14 entries).
    """
    v = see.shape[0]
    table = jnp.asarray(L.visibility_table())
    see_bits = jnp.sum(see.astype(jnp.int32) << jnp.arange(v)[:, None], axis=0)  # [v] rows
    incoming = jnp.int32(1 << (v // 2))  # the agent's own cell
    rows = [None] * v
    for j in reversed(range(v)):
        entry = table[see_bits[j] | (incoming << v)]
        rows[j] = entry & ((1 << v) - 1)
        incoming = entry >> v
    rows = jnp.stack(rows)  # [v] bitmasks over columns
    return ((rows[None, :] >> jnp.arange(v)[:, None]) & 1).astype(bool)  # [i, j]


def rollout_random(env: BabyAIEnv, key: jax.Array, num_envs: int, num_steps: int,
                   params: BabyAIParams | None = None):
    """Run ``num_envs`` vmapped envs for ``num_steps`` uniform-random actions under jit.

    Returns (total reward, number of finished episodes, checksum of all observed images);
    the checksum makes XLA compute every observation, as a policy reading them would.
    Used by the throughput benchmark.
    """
    params = env.default_params if params is None else params
    return _rollout_random(env, key, num_envs, num_steps, params)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _rollout_random(env, key, num_envs, num_steps, params):
    key, key_reset = jax.random.split(key)
    _, state = jax.vmap(env.reset_env, in_axes=(0, None))(
        jax.random.split(key_reset, num_envs), params)

    def body(carry, _):
        state, key, total, episodes, checksum = carry
        key, k_act, k_step = jax.random.split(key, 3)
        actions = jax.random.randint(k_act, (num_envs,), 0, NUM_ACTIONS)
        obs, state, reward, done, _ = env._step_batch(
            jax.random.split(k_step, num_envs), state, actions, params)
        checksum = checksum + jnp.sum(obs.image, dtype=jnp.int32)
        return (state, key, total + reward.sum(), episodes + done.sum(), checksum), None

    init = (state, key, jnp.zeros(()), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    (state, _, total, episodes, checksum), _ = jax.lax.scan(body, init, None, length=num_steps)
    return total, episodes, checksum
