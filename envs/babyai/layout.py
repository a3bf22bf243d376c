"""Host-side tables for the six-room BabyAI world (built once per room size, used inside jit).

The world is a 2 x 3 grid of rooms (rooms numbered ``row * 3 + col``) with MiniGrid's
layout conventions: rooms share walls, so the grid is ``3 * (room_size - 1) + 1`` cells wide
and ``2 * (room_size - 1) + 1`` tall, and every array is indexed ``[x, y]`` like MiniGrid's
``Grid.encode``. The seven walls between neighbouring rooms can each hold one door.

Generation samples from precomputed tables instead of rejection loops, so a reset is a fixed
amount of array work inside jit:

* ``connected_masks``: every subset of the seven door slots that connects all six rooms,
  with the room-graph distance matrix of each.
* ``route_table``: for each door distance d in 1..5, every (door mask, agent room, target
  room) triple whose rooms are exactly d doors apart, with the first door of a shortest
  route (the one a task locks when it has a locked door).
* ``object_sets``: for each count k, every set of k cells of a room's inner region (cells not
  touching a wall) with no two cells side by side. Objects placed this way can never block a
  door, split a room, or wall in another object, so every object is reachable and the door
  distance of a task equals the room-graph distance (the tests check this by brute force).
* ``compositions``: every way to share the 18 objects among the six rooms (1..k_max each).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np

# MiniGrid's encoding (minigrid.core.constants), so our grids and views equal minigrid's.
OBJECT_TO_IDX = {
    "unseen": 0, "empty": 1, "wall": 2, "floor": 3, "door": 4, "key": 5, "ball": 6, "box": 7,
    "goal": 8, "lava": 9, "agent": 10,
}
IDX_TO_OBJECT = {v: k for k, v in OBJECT_TO_IDX.items()}
COLOR_NAMES = ("red", "green", "blue", "purple", "yellow", "grey")
COLOR_TO_IDX = {c: i for i, c in enumerate(COLOR_NAMES)}
DOOR_OPEN, DOOR_CLOSED, DOOR_LOCKED = 0, 1, 2
STATE_NAMES = {DOOR_OPEN: "open", DOOR_CLOSED: "closed", DOOR_LOCKED: "locked"}

EMPTY, WALL, DOOR, KEY, BALL, BOX = 1, 2, 4, 5, 6, 7
WALL_COLOR = COLOR_TO_IDX["grey"]
OBJECT_TYPES = (BALL, BOX, KEY)  # object identity i is (OBJECT_TYPES[i // 6], colour i % 6)
NUM_OBJECTS = len(OBJECT_TYPES) * len(COLOR_NAMES)  # 18: every colour x type exactly once

NUM_ROWS, NUM_COLS, NUM_ROOMS = 2, 3, 6
# Door slots: (room a, room b, orientation); "v" = door in a vertical wall (rooms side by
# side), "h" = door in a horizontal wall (rooms one above the other).
DOOR_SLOTS = ((0, 1, "v"), (1, 2, "v"), (3, 4, "v"), (4, 5, "v"),
              (0, 3, "h"), (1, 4, "h"), (2, 5, "h"))
NUM_DOOR_SLOTS = len(DOOR_SLOTS)
MAX_DOOR_DISTANCE = 5
ALLOWED_ROOM_SIZES = (7, 8, 9)

# MiniGrid direction vectors: 0 east (+x), 1 south (+y), 2 west, 3 north.
DIR_TO_VEC = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.int32)
DIR_NAMES = ("east", "south", "west", "north")


def room_of_cell(x: int, y: int, room_size: int) -> int:
    """Room index of an interior cell, or -1 for wall and door cells."""
    step = room_size - 1
    if x % step == 0 or y % step == 0:
        return -1
    return (y // step) * NUM_COLS + (x // step)


def _room_distances(mask: int) -> np.ndarray:
    """All-pairs room-graph distances (number of doors) for a door mask; -1 if unreachable."""
    adj = [[] for _ in range(NUM_ROOMS)]
    for e, (a, b, _) in enumerate(DOOR_SLOTS):
        if mask >> e & 1:
            adj[a].append(b)
            adj[b].append(a)
    dist = np.full((NUM_ROOMS, NUM_ROOMS), -1, dtype=np.int32)
    for src in range(NUM_ROOMS):
        dist[src, src] = 0
        frontier = [src]
        while frontier:
            nxt = []
            for r in frontier:
                for s in adj[r]:
                    if dist[src, s] < 0:
                        dist[src, s] = dist[src, r] + 1
                        nxt.append(s)
            frontier = nxt
    return dist


def _first_door(mask: int, dist: np.ndarray, a: int, t: int) -> int:
    """Lowest door slot leaving room a towards t on a shortest route (-1 when a == t)."""
    for e, (r1, r2, _) in enumerate(DOOR_SLOTS):
        if mask >> e & 1 and a in (r1, r2):
            other = r2 if a == r1 else r1
            if dist[other, t] == dist[a, t] - 1:
                return e
    return -1


def _independent_sets(side: int, k: int) -> list[tuple[int, ...]]:
    """Sets of k cells of a side x side square (cell = v * side + u) with no two adjacent."""
    out = []
    for combo in itertools.combinations(range(side * side), k):
        ok = True
        for i, a in enumerate(combo):
            au, av = a % side, a // side
            for b in combo[i + 1:]:
                if abs(au - b % side) + abs(av - b // side) == 1:
                    ok = False
                    break
            if not ok:
                break
        if ok:
            out.append(combo)
    return out


def _compositions(total: int, parts: int, lo: int, hi: int) -> list[tuple[int, ...]]:
    if parts == 0:
        return [()] if total == 0 else []
    out = []
    for first in range(lo, hi + 1):
        rest = total - first
        if (parts - 1) * lo <= rest <= (parts - 1) * hi:
            out.extend((first,) + tail for tail in _compositions(rest, parts - 1, lo, hi))
    return out


@dataclasses.dataclass(frozen=True)
class LayoutTables:
    """Constant numpy tables for one room size (see the module docstring)."""

    room_size: int
    width: int
    height: int
    num_offsets: int  # door positions along a wall
    k_max: int  # most objects in one room
    base_grid: np.ndarray  # uint8 [W, H, 3]: outer and inner walls, empty interiors
    room_interior: np.ndarray  # bool [6, W, H]
    cell_room: np.ndarray  # int32 [W, H]: room of each interior cell, -1 on walls/doors
    door_base: np.ndarray  # int32 [7, 2]: door cell of each slot at offset 0
    door_axis: np.ndarray  # int32 [7, 2]: unit step along the wall as the offset grows
    connected_masks: np.ndarray  # int32 [M]
    mask_distances: np.ndarray  # int32 [M, 6, 6]
    # int32 [6, R, 4]: (mask, agent room, target room, first door slot of a shortest route)
    route_table: np.ndarray
    route_counts: np.ndarray  # int32 [6]
    object_sets: np.ndarray  # int32 [k_max + 1, S, k_max]: inner-cell indices, -1 padded
    object_set_counts: np.ndarray  # int32 [k_max + 1]
    compositions: np.ndarray  # int32 [C, 6]
    inner_side: int

    def door_cell(self, slot: int, offset: int) -> tuple[int, int]:
        """The (x, y) grid cell of door slot ``slot`` at ``offset`` along its wall."""
        x, y = self.door_base[slot] + offset * self.door_axis[slot]
        return int(x), int(y)

    def room_origin(self, room: int) -> tuple[int, int]:
        """The (x, y) of room ``room``'s top-left wall corner (rooms share their walls)."""
        step = self.room_size - 1
        return (room % NUM_COLS) * step, (room // NUM_COLS) * step


@functools.lru_cache(maxsize=None)
def layout_tables(room_size: int = 8) -> LayoutTables:
    """Build (once) the generation tables for ``room_size`` (7, 8 or 9)."""
    if room_size not in ALLOWED_ROOM_SIZES:
        raise ValueError(f"room_size must be one of {ALLOWED_ROOM_SIZES}, got {room_size!r}")
    step = room_size - 1
    width, height = NUM_COLS * step + 1, NUM_ROWS * step + 1

    base = np.zeros((width, height, 3), dtype=np.uint8)
    base[:, :, 0] = EMPTY
    interior = np.zeros((NUM_ROOMS, width, height), dtype=bool)
    cell_room = np.full((width, height), -1, dtype=np.int32)
    for x in range(width):
        for y in range(height):
            if x % step == 0 or y % step == 0:
                base[x, y] = (WALL, WALL_COLOR, 0)
            else:
                r = room_of_cell(x, y, room_size)
                interior[r, x, y] = True
                cell_room[x, y] = r

    door_base = np.zeros((NUM_DOOR_SLOTS, 2), dtype=np.int32)
    door_axis = np.zeros((NUM_DOOR_SLOTS, 2), dtype=np.int32)
    for e, (a, b, orient) in enumerate(DOOR_SLOTS):
        ax, ay = (a % NUM_COLS) * step, (a // NUM_COLS) * step
        if orient == "v":  # wall x = ax + step, door y runs along the room's interior rows
            door_base[e] = (ax + step, ay + 1)
            door_axis[e] = (0, 1)
        else:  # wall y = ay + step
            door_base[e] = (ax + 1, ay + step)
            door_axis[e] = (1, 0)

    masks, dists = [], []
    for mask in range(1 << NUM_DOOR_SLOTS):
        d = _room_distances(mask)
        if (d >= 0).all():
            masks.append(mask)
            dists.append(d)
    masks_arr = np.array(masks, dtype=np.int32)
    dists_arr = np.stack(dists)

    routes = [[] for _ in range(MAX_DOOR_DISTANCE + 1)]
    for mask, d in zip(masks, dists):
        for a in range(NUM_ROOMS):
            for t in range(NUM_ROOMS):
                routes[d[a, t]].append((mask, a, t, _first_door(mask, d, a, t)))
    r_max = max(len(r) for r in routes)
    route_table = np.zeros((MAX_DOOR_DISTANCE + 1, r_max, 4), dtype=np.int32)
    for d, rows in enumerate(routes):
        if rows:
            route_table[d, : len(rows)] = rows
    route_counts = np.array([len(r) for r in routes], dtype=np.int32)

    inner_side = room_size - 4
    sets_by_k = [[()]]
    k = 1
    while k <= 5:
        sets = _independent_sets(inner_side, k)
        if not sets:
            break
        sets_by_k.append(sets)
        k += 1
    k_max = len(sets_by_k) - 1
    s_max = max(len(s) for s in sets_by_k)
    object_sets = np.full((k_max + 1, s_max, k_max), -1, dtype=np.int32)
    for kk, sets in enumerate(sets_by_k):
        for i, combo in enumerate(sets):
            object_sets[kk, i, :kk] = combo
    object_set_counts = np.array([len(s) for s in sets_by_k], dtype=np.int32)
    comps = np.array(_compositions(NUM_OBJECTS, NUM_ROOMS, 1, k_max), dtype=np.int32)

    return LayoutTables(
        room_size=room_size, width=width, height=height, num_offsets=room_size - 2,
        k_max=k_max, base_grid=base, room_interior=interior, cell_room=cell_room,
        door_base=door_base, door_axis=door_axis, connected_masks=masks_arr,
        mask_distances=dists_arr, route_table=route_table, route_counts=route_counts,
        object_sets=object_sets, object_set_counts=object_set_counts, compositions=comps,
        inner_side=inner_side,
    )


SPLITS = ("train", "id_test", "ood_test")
# Door-distance range of each split (the paper's A.2: train and ID test 1-3, OOD test 4-5).
SPLIT_DOOR_DISTANCES = {"train": (1, 3), "id_test": (1, 3), "ood_test": (4, 5)}


def geometry_split(door_mask: int, door_offsets, num_offsets: int) -> str:
    """The split a door geometry belongs to: (sum of present doors' offsets) mod num_offsets.

    Residues ``0 .. n-3`` are train, ``n-2`` ID test and ``n-1`` OOD test. Two tasks with the
    same doors (same slots at the same positions) always share a split, so the layouts of the
    three splits are disjoint by construction.
    """
    offsets = np.asarray(door_offsets).reshape(-1)
    if offsets.shape != (NUM_DOOR_SLOTS,):
        raise ValueError(f"door_offsets must have {NUM_DOOR_SLOTS} entries, got {offsets.shape}")
    present = (int(door_mask) >> np.arange(NUM_DOOR_SLOTS)) & 1
    residue = int(np.sum(offsets * present)) % num_offsets
    if residue < num_offsets - 2:
        return "train"
    return "id_test" if residue == num_offsets - 2 else "ood_test"


@functools.lru_cache(maxsize=None)
def visibility_table(view_size: int = 7) -> np.ndarray:
    """One row of MiniGrid's occlusion sweep (``Grid.process_vis``) for every input.

    Index ``see | incoming << v`` (bit i of ``see``: cell i of the row lets sight through;
    bit i of ``incoming``: cell i is already visible). Entry ``visible | ahead << v``:
    the row's visible cells after the left-to-right then right-to-left passes, and the cells
    of the next row (further from the agent) that those passes reveal.
    """
    v = view_size
    index = np.arange(1 << (2 * v))
    through = [(index >> i) & 1 == 1 for i in range(v)]  # all inputs at once
    vis = [(index >> (v + i)) & 1 == 1 for i in range(v)]
    ahead = [np.zeros_like(index, dtype=bool) for _ in range(v)]
    for i in range(v - 1):  # left to right
        spread = vis[i] & through[i]
        vis[i + 1] = vis[i + 1] | spread
        ahead[i + 1] = ahead[i + 1] | spread
        ahead[i] = ahead[i] | spread
    for i in range(v - 1, 0, -1):  # right to left
        spread = vis[i] & through[i]
        vis[i - 1] = vis[i - 1] | spread
        ahead[i - 1] = ahead[i - 1] | spread
        ahead[i] = ahead[i] | spread
    out = np.zeros_like(index)
    for i in range(v):
        out |= vis[i].astype(np.int64) << i
        out |= ahead[i].astype(np.int64) << (v + i)
    return out.astype(np.int32)
