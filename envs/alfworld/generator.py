"""Generate new ALFWorld problems of the six task types from what the ``alfworld`` package ships.

Sources (read from the installed package, nothing downloaded): the floor plans in
``alfworld/gen/layouts/`` (``FloorPlanN-objects.json``: object classes present;
``FloorPlanN-openable.json``: receptacle ids and the pose the agent stands at to use them),
the class tables of ``alfworld/gen/constants.py`` (receptacle classes, what each can hold,
cleanable / heatable / coolable / toggleable / sliceable classes, which rooms suit which task)
and the PDDL goal templates and English task templates of ``alfworld/gen/goal_library.py``.

A problem is the same PDDL an official ``initial_state.pddl`` holds (ALFRED ids such as
``Mug|+00.45|+00.91|-01.23`` escaped to ``Mug_bar__plus_00_dot_45...``, ``loc|x|z|r|h``
locations, the same predicates), and ``gamedir.write_game_dir`` writes the official file set:
``game.tw-pddl`` (JSON with ``pddl_domain``, ``grammar`` with the task sentence filled in,
``pddl_problem``, ``solvable``, ``walkthrough``), ``traj_data.json`` and
``initial_state.pddl``.

Splits: ``train`` and ``valid_seen`` use the training floor plans (``TRAIN_SCENE_NUMBERS``) and
partition the task instances (scene, task type, target, receptacle, lamp) by a stable hash, so
no task of one is a task of the other; ``valid_unseen`` uses only the held-out floor plans
(``TEST_SCENE_NUMBERS``). Everything is a deterministic function of (split, seed).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
from typing import Any, Sequence

from jaxdm.envs.alfworld.pddl import (Problem, parse_problem, predicate_spellings,
                                      write_problem)
from jaxdm.envs.alfworld.world import TASK_TYPES, Game, TaskInfo

SPLITS = ("train", "valid_seen", "valid_unseen")
_SEEN_EVAL_BUCKETS = 10  # 1 in 10 task instances of the train floor plans is held out as seen-eval
_LAMP_HOLDERS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand",
                 "Ottoman", "ArmChair", "Sofa", "Bed")
_STEP = 0.25  # ALFRED's grid step (constants.AGENT_STEP_SIZE)


def _require_alfworld():
    try:
        import alfworld  # noqa: F401
    except ImportError as e:  # pragma: no cover - alfworld is in the envs extra
        raise ImportError(
            "generating ALFWorld problems needs the floor plans and tables of the `alfworld` "
            "package: pip install 'jaxdm[envs]' (alfworld==0.4.2)") from e


@functools.lru_cache(maxsize=1)
def _package_data() -> dict[str, Any]:
    """Tables, templates and logic files from the installed alfworld package (read once)."""
    _require_alfworld()
    import alfworld
    import alfworld.gen.constants as C
    import alfworld.gen.goal_library as G

    root = os.path.dirname(alfworld.__file__)
    data_dir = os.path.join(root, "data")
    with open(os.path.join(data_dir, "alfred.pddl"), encoding="utf-8") as f:
        domain = f.read()
    with open(os.path.join(data_dir, "alfred.twl2"), encoding="utf-8") as f:
        grammar = f.read()
    return {
        "C": C, "gdict": G.gdict, "domain": domain, "grammar": grammar,
        "layouts": os.path.join(root, "gen", "layouts"),
    }


def logic_files() -> tuple[str, str]:
    """The shipped ``alfred.pddl`` domain and ``alfred.twl2`` grammar texts."""
    d = _package_data()
    return d["domain"], d["grammar"]


def _escape(name: str) -> str:
    """ALFRED id -> PDDL symbol, as the official generator escapes it."""
    for a, b in (("-", "_minus_"), ("#", "-"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"),
                 (",", "_comma_")):
        name = name.replace(a, b)
    return name


def _class_of(recep_id: str) -> str:
    parts = recep_id.split("|")
    return parts[-1] if parts[-1].endswith("Basin") else parts[0]


@functools.lru_cache(maxsize=None)
def _floor_plan(scene: int) -> tuple[tuple[str, ...], tuple[tuple[str, tuple], ...]]:
    d = _package_data()
    base = os.path.join(d["layouts"], f"FloorPlan{scene}")
    with open(base + "-objects.json", encoding="utf-8") as f:
        classes = tuple(json.load(f))
    with open(base + "-openable.json", encoding="utf-8") as f:
        points = tuple((k, tuple(v)) for k, v in sorted(json.load(f).items()))
    return classes, points


def scenes_for(split: str, task_type: str) -> tuple[int, ...]:
    """Floor plans a split draws a task type from."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPES}")
    C = _package_data()["C"]
    numbers = C.TEST_SCENE_NUMBERS if split == "valid_unseen" else C.TRAIN_SCENE_NUMBERS
    rooms = C.GOALS_VALID[task_type]
    out = []
    for n in numbers:
        room = next(r for r, rng in C.SCENE_TYPE.items() if n in rng)
        if room in rooms and os.path.exists(
                os.path.join(_package_data()["layouts"], f"FloorPlan{n}-objects.json")):
            out.append(n)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class GeneratedTask:
    """A generated problem plus the official side files' content."""

    problem: Problem
    goal_text: str  # e.g. "put a clean mug in countertop"
    task: TaskInfo
    traj_data: dict
    id_case: dict  # lower-case PDDL id -> ALFRED spelling (for writing files)
    seed: int
    split: str

    def game(self) -> Game:
        """The Game of this generated task (its PDDL problem, goal text and task), named by its
        split and seed."""
        return Game(self.problem, self.goal_text, task=self.task,
                    where=f"generated {self.split} seed {self.seed}",
                    meta={"seed": self.seed, "split": self.split,
                          "scene": self.traj_data["scene"]["floor_plan"]})


def _instance_bucket(key: tuple) -> int:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:4], "big") % _SEEN_EVAL_BUCKETS


def _coord(rng: random.Random) -> str:
    return "|".join(f"{rng.uniform(-3.0, 3.0):+06.2f}" for _ in range(3))


def _loc(point: Sequence[float]) -> str:
    x, z, rot, hor = point
    return f"loc|{int(round(x / _STEP))}|{int(round(z / _STEP))}|{int(rot) // 90}|{int(hor)}"


def generate_task(seed: int, *, split: str = "train",
                  task_types: Sequence[str] = TASK_TYPES) -> GeneratedTask:
    """The problem for ``seed`` of ``split``: task type ``task_types[seed % len]``, the rest drawn
    from a generator seeded by (split, seed)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    task_types = tuple(task_types)
    if not task_types or any(t not in TASK_TYPES for t in task_types):
        raise ValueError(f"task_types must be a non-empty subset of {TASK_TYPES}, got {task_types}")
    task_type = task_types[seed % len(task_types)]
    rng = random.Random(f"alfworld/{split}/{seed}")
    for _attempt in range(200):
        out = _try_generate(rng, seed, split, task_type)
        if out is not None:
            return out
    raise RuntimeError(f"could not generate a {task_type} problem for split {split} seed {seed}")


def _try_generate(rng: random.Random, seed: int, split: str, task_type: str):
    d = _package_data()
    C = d["C"]
    scene = rng.choice(scenes_for(split, task_type))
    classes, points = _floor_plan(scene)
    static_classes = set(C.RECEPTACLES) - set(C.MOVABLE_RECEPTACLES)
    present = set(classes)

    # Receptacles: the floor plan's listed ones, plus one instance of every other receptacle
    # class the scene has (the layout files list only some), at fresh grid poses.
    receptacles: list[tuple[str, str]] = []  # (ALFRED id, class)
    rec_point: dict[str, tuple] = {}
    used_points = set()
    for rid, pt in points:
        cls = _class_of(rid)
        if cls in static_classes:
            receptacles.append((rid, cls))
            rec_point[rid] = pt
            used_points.add(_loc(pt))
    listed = {c for _, c in receptacles}
    for cls in sorted(present & static_classes - listed):
        rid = f"{cls}|{_coord(rng)}"
        if cls in ("SinkBasin", "BathtubBasin"):
            rid = f"{cls[:-5]}|{_coord(rng)}|{cls}"
        while True:
            pt = (rng.randrange(-12, 13) * _STEP, rng.randrange(-12, 13) * _STEP,
                  rng.choice((0, 90, 180, 270)), rng.choice((0, 30, 60)))
            if _loc(pt) not in used_points:
                break
        used_points.add(_loc(pt))
        receptacles.append((rid, cls))
        rec_point[rid] = pt
    if not receptacles:
        return None
    rec_classes = {c for _, c in receptacles}

    val = C.VAL_RECEPTACLE_OBJECTS
    pickupable_classes = set().union(*val.values()) & set(C.OBJECTS) - static_classes
    movable = set(C.MOVABLE_RECEPTACLES)
    candidates = sorted((present & pickupable_classes) | (present & movable))

    def holders(obj_cls: str) -> list[str]:
        return [rid for rid, c in receptacles if obj_cls in val.get(c, ())]

    # ---- choose the task ---------------------------------------------------------------
    A = C.VAL_ACTION_OBJECTS
    needs = {
        "pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin"),
        "pick_heat_then_place_in_recep": ("Heatable", "Microwave"),
        "pick_cool_then_place_in_recep": ("Coolable", "Fridge"),
    }
    targets = [c for c in candidates if holders(c)]
    toggle = None
    if task_type in needs:
        action_set, station = needs[task_type]
        if station not in rec_classes:
            return None
        targets = [c for c in targets if c in A[action_set]]
    if task_type == "look_at_obj_in_light":
        lamps = sorted(present & {"DeskLamp", "FloorLamp"})
        lamp_spots = [rid for rid, c in receptacles if c in _LAMP_HOLDERS]
        if not lamps or not lamp_spots:
            return None
        toggle = rng.choice(lamps)
    if not targets:
        return None
    target = rng.choice(targets)
    parent = None
    if task_type != "look_at_obj_in_light":
        exclude = {"pick_clean_then_place_in_recep": "SinkBasin",
                   "pick_heat_then_place_in_recep": "Microwave",
                   "pick_cool_then_place_in_recep": "Fridge"}.get(task_type)
        goal_classes = sorted({c for rid, c in receptacles
                               if target in val.get(c, ()) and c != exclude})
        if not goal_classes:
            return None
        parent = rng.choice(goal_classes)
    key = (scene, task_type, target, parent, toggle)
    if split != "valid_unseen":
        in_seen = _instance_bucket(key) == 0
        if in_seen != (split == "valid_seen"):
            return None

    # ---- place objects -----------------------------------------------------------------
    objects: list[tuple[str, str, str]] = []  # (ALFRED id, class, receptacle id)
    n_target = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
    forbidden = {rid for rid, c in receptacles if c == parent}
    if task_type == "pick_cool_then_place_in_recep":
        forbidden |= {rid for rid, c in receptacles if c == "Fridge"}
    spots = [r for r in holders(target) if r not in forbidden]
    if not spots:
        return None
    for _ in range(n_target):
        objects.append((f"{target}|{_coord(rng)}", target, rng.choice(spots)))
    for cls in candidates:
        if cls == target or rng.random() < 0.35:
            continue
        spots_c = holders(cls)
        if not spots_c:
            continue
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            objects.append((f"{cls}|{_coord(rng)}", cls, rng.choice(spots_c)))
    lamp_objects = []
    if toggle is not None:
        lamp_spots = [rid for rid, c in receptacles if c in _LAMP_HOLDERS]
        for _ in range(rng.choice((1, 1, 2))):
            lamp_objects.append((f"{toggle}|{_coord(rng)}", toggle, rng.choice(lamp_spots)))
    objects.extend(lamp_objects)

    # ---- PDDL --------------------------------------------------------------------------
    case: dict[str, str] = {}

    def sym(alfred_id: str) -> str:
        s = _escape(alfred_id)
        case[s.lower()] = s
        return s.lower()

    agent_start = None
    while agent_start is None:
        pt = (rng.randrange(-12, 13) * _STEP, rng.randrange(-12, 13) * _STEP,
              rng.choice((0, 90, 180, 270)), 30)
        if _loc(pt) not in used_points:
            agent_start = _loc(pt)
    object_classes = sorted(set(C.OBJECTS_SET) - static_classes)
    decl: list[tuple[str, str]] = [("agent1", "agent")]
    decl += [(sym(c), "object") for c in object_classes]
    decl += [(sym(c + "Type"), "otype") for c in object_classes]
    decl += [(sym(c + "Type"), "rtype") for c in sorted(static_classes)]
    decl += [(sym(oid), "object") for oid, _, _ in sorted(objects)]
    decl += [(sym(rid), "receptacle") for rid, _ in sorted(receptacles)]
    locations = sorted({_loc(p) for p in rec_point.values()} | {agent_start})
    decl += [(sym(l), "location") for l in locations]
    init: list[tuple] = []
    for rid, cls in sorted(receptacles):
        init.append(("receptacletype", sym(rid), sym(cls + "Type")))
    for oid, cls, _ in sorted(objects):
        init.append(("objecttype", sym(oid), sym(cls + "Type")))
    for oid, cls, _ in sorted(objects):
        if cls in movable:
            init.append(("isreceptacleobject", sym(oid)))
    for rid, cls in sorted(receptacles):
        if cls in C.OPENABLE_CLASS_SET:
            init.append(("openable", sym(rid)))
    init.append(("atlocation", "agent1", sym(agent_start)))
    for oid, cls, _ in sorted(objects):
        if cls not in ("DeskLamp", "FloorLamp"):
            init.append(("pickupable", sym(oid)))
    for pred, table in (("cleanable", "Cleanable"), ("heatable", "Heatable"),
                        ("coolable", "Coolable"), ("toggleable", "Toggleable"),
                        ("sliceable", "Sliceable")):
        for oid, cls, _ in sorted(objects):
            if cls in A[table]:
                init.append((pred, sym(oid)))
    for oid, cls, rid in sorted(objects):
        if cls == target and _class_of(rid) == "Fridge":
            init.append(("iscool", sym(oid)))  # the official generator marks these as cool
    for oid, _, rid in sorted(objects):
        init.append(("inreceptacle", sym(oid), sym(rid)))
    for rid, _ in sorted(receptacles):
        init.append(("receptacleatlocation", sym(rid), sym(_loc(rec_point[rid]))))
    scene_classes = {c for _, c, _ in objects}
    for rcls in sorted(rec_classes):
        for ocls in sorted(val.get(rcls, ())):
            if ocls in scene_classes:
                init.append(("cancontain", sym(rcls + "Type"), sym(ocls + "Type")))
    for oid, _, rid in sorted(objects):
        init.append(("objectatlocation", sym(oid), sym(_loc(rec_point[rid]))))

    fmt = {"obj": target, "recep": parent or "", "toggle": toggle or "", "mrecep": ""}
    goal_pddl = d["gdict"][task_type]["pddl"].format(**fmt)
    goal_pddl = _escape(goal_pddl.replace("-", "\0")).replace("\0", "-")
    # The library's goal text closes the (define ...) it is appended to: keep the goal only.
    goal_tree_text = "(define (problem x) (:domain alfred) " + goal_pddl
    goal = parse_problem(goal_tree_text, where="goal_library").goal
    problem = Problem(name=f"plan_{split}_{seed}", domain="alfred", objects=tuple(decl),
                      init=tuple(init), goal=goal)
    template = rng.choice(d["gdict"][task_type]["templates"])
    goal_text = template.format(obj=target.lower(), recep=(parent or "").lower(),
                                toggle=(toggle or "").lower(), mrecep="")
    task = TaskInfo(task_type, sym(target + "Type"), sym(parent + "Type") if parent else None,
                    sym(toggle + "Type") if toggle else None)
    traj_data = {
        "task_id": f"jaxdm_{split}_{seed}",
        "task_type": task_type,
        "split": split,
        "scene": {"floor_plan": f"FloorPlan{scene}", "scene_num": scene,
                  "random_seed": seed},
        "pddl_params": {"object_target": target, "parent_target": parent or "",
                        "toggle_target": toggle or "", "mrecep_target": "",
                        "object_sliced": False},
        "turk_annotations": {"anns": [{"task_desc": goal_text, "assignment_id": "generated",
                                       "high_descs": [], "votes": []}]},
    }
    return GeneratedTask(problem=problem, goal_text=goal_text, task=task, traj_data=traj_data,
                         id_case=case, seed=seed, split=split)


@functools.lru_cache(maxsize=512)
def _cached_game(seed: int, split: str, task_types: tuple[str, ...]) -> Game:
    game = generate_task(seed, split=split, task_types=task_types).game()
    game.ref, game.rebuild = ("generated", seed, split, task_types), _cached_game
    return game


def generate_game(seed: int, *, split: str = "train",
                  task_types: Sequence[str] = TASK_TYPES) -> Game:
    """The compiled ``Game`` for (split, seed) (cached: games are immutable)."""
    return _cached_game(int(seed), split, tuple(task_types))


def grammar_with_task(goal_text: str) -> str:
    """The shipped grammar with the task sentence filled in (what the official files hold)."""
    _, grammar = logic_files()
    return grammar.replace("UNKNOWN GOAL", goal_text)


def game_file_data(task: GeneratedTask, *, walkthrough: list[str] | None = None) -> dict:
    """The JSON content of ``game.tw-pddl`` for a generated task."""
    domain, _ = logic_files()
    case = {**predicate_spellings(domain), **task.id_case}
    return {
        "pddl_domain": domain,
        "grammar": grammar_with_task(task.goal_text),
        "pddl_problem": write_problem(task.problem, objects_case=case),
        "solvable": walkthrough is not None,
        "walkthrough": walkthrough,
    }
