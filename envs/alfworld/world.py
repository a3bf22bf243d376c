"""The static part of an ALFWorld game: entity names, indexed facts, goal, task and grammar.

A ``Game`` is built once per problem and shared (read-only) by every state of that game. It
mirrors what the official engine derives when it loads a ``game.tw-pddl`` file:

* display names: ALFRED ids such as ``Mug_bar__plus_00_dot_45_bar_...`` become ``mug 1``; the
  numbering follows the official demangler (ids of one class sorted, the first sorted id gets
  the highest number), and ``..._bar_SinkBasin`` ids get the class name ``sinkbasin``;
* which facts can change (the predicates some action of the ALFRED domain adds or deletes)
  and the static ones, indexed for the action preconditions;
* the grammar variant: the shipped ``alfred.twl2`` (``move {o} to {r}``, "You arrive at
  {r.name}.") or the older one of the 2.1.1 game files (``put {o} in/on {r}``, "You arrive at
  {lend.name}."), and whether the domain has the ``help`` action.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter, defaultdict
from typing import Any, Mapping, Sequence

from jaxdm.envs.alfworld.pddl import GameFileError, GoalChecker, Problem

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# Short labels used in trajectories (Trajectory.task_type) and reports.
TASK_LABELS = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick_two",
}
# Clean / Heat / Cool must change the object's state before the placement counts; Pick2's two
# placements can happen in either order (seed 000, section 2).
HAS_DEPENDENCY = {t: t in ("pick_clean_then_place_in_recep", "pick_heat_then_place_in_recep",
                           "pick_cool_then_place_in_recep") for t in TASK_TYPES}

# Predicates some action of alfred.pddl adds or deletes; everything else in :init is static.
DYNAMIC_PREDICATES = frozenset({
    "atlocation", "opened", "inreceptacle", "holds", "holdsany", "objectatlocation",
    "isclean", "ishot", "iscool", "ison", "istoggled", "issliced", "checked",
})

_DEMANGLE = (("_bar_", "|"), ("_minus_", "-"), ("_plus_", "+"), ("_dot_", "."), ("_comma_", ","))


def display_names(entity_ids: Sequence[str]) -> dict[str, str]:
    """Display names of ALFRED entity ids, numbered the way the official demangler does."""
    ids = sorted(set(entity_ids))
    base: dict[str, str | None] = {}
    counts: Counter = Counter()
    for eid in ids:
        if "_bar_" in eid:
            name = eid.split("_bar_", 1)[0]
            if "basin" in eid:
                name += "basin"
            base[eid] = name
            counts[name] += 1
        else:
            base[eid] = None
    remaining = dict(counts)
    names = {}
    for eid in ids:
        name = base[eid]
        if name is None:
            text = eid
            for a, b in _DEMANGLE:
                text = text.replace(a, b)
            names[eid] = f"{text} "  # the official demangler appends the (empty) number too
        else:
            names[eid] = f"{name} {remaining[name]}"
            remaining[name] -= 1
    return names


@dataclasses.dataclass(frozen=True)
class GrammarVariant:
    """Which of the two official ALFRED grammars a game uses."""

    put_template: str = "move {o} to {r}"
    put_feedback: str = "You move the {o} to the {r}."
    arrive_at_location: bool = False  # the 2.1.1 typo: "You arrive at {lend.name}."
    has_help: bool = True

    @classmethod
    def from_texts(cls, grammar: str, domain: str, *, where: str = "game") -> "GrammarVariant":
        """The grammar variant a game file's grammar and PDDL domain texts use (the "put ... in/on"
        or "move ... to" wording of its commands and feedback); an unknown grammar is a named error.
        """
        if "put {o} in/on {r}" in grammar:
            put_t, put_f = "put {o} in/on {r}", "You put the {o} in/on the {r}."
        elif "move {o} to {r}" in grammar:
            put_t, put_f = "move {o} to {r}", "You move the {o} to the {r}."
        else:
            raise GameFileError(
                f"{where}: grammar has neither 'move {{o}} to {{r}}' nor 'put {{o}} in/on {{r}}'"
                " for PutObject; not an ALFRED grammar")
        for needed in ("GotoLocation", "PickupObject", "examineReceptacle", "look"):
            if needed not in grammar:
                raise GameFileError(f"{where}: grammar lacks the {needed} rules of alfred.twl2")
        has_help = bool(re.search(r"\(:action\s+help\b", domain, re.IGNORECASE))
        return cls(put_template=put_t, put_feedback=put_f,
                   arrive_at_location="You arrive at {lend.name}." in grammar, has_help=has_help)


def task_text_from_grammar(grammar: str, *, where: str = "game") -> str:
    """The "Your task is to: ..." sentence a grammar's ``task`` rule renders."""
    m = re.search(r'"task"\s*:\s*\[\s*\{\s*"rhs"\s*:\s*"((?:[^"\\]|\\.)*)"', grammar)
    if not m:
        raise GameFileError(
            f"{where}: grammar has no \"task\" rule (expected 'Your task is to: ...')")
    return json.loads('"' + m.group(1) + '"')


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """What the task asks: type and the ALFRED classes involved (lower-case type names)."""

    task_type: str
    object_type: str  # e.g. "mugtype"
    recep_type: str | None = None  # goal receptacle class, e.g. "coffeetabletype"
    toggle_type: str | None = None  # look tasks: "desklamptype" / "floorlamptype"


def infer_task(goal: Any, *, where: str = "game") -> TaskInfo:
    """Recognise the task type and its classes from a goal of the ALFRED goal library."""
    atoms: list[tuple] = []

    def walk(e):
        if isinstance(e, str):
            return
        if e[0] in ("and", "or"):
            for x in e[1:]:
                walk(x)
        elif e[0] == "not":
            walk(e[1])
        elif e[0] in ("exists", "forall"):
            walk(e[2])
        else:
            atoms.append(e)

    walk(goal)
    preds = Counter(a[0] for a in atoms)
    obj_types = [a[2] for a in atoms if a[0] == "objecttype"]
    rec_types = [a[2] for a in atoms if a[0] == "receptacletype"]
    if not obj_types:
        raise GameFileError(f"{where}: goal names no (objectType ?o ...); not an ALFWorld task")
    if preds["istoggled"]:
        toggle = next(a[2] for a in atoms if a[0] == "objecttype" and any(
            b[0] == "istoggled" and b[1] == a[1] for b in atoms))
        target = next(t for t in obj_types if t != toggle)
        return TaskInfo("look_at_obj_in_light", target, None, toggle)
    if not rec_types:
        raise GameFileError(f"{where}: goal names no (receptacleType ?r ...)")
    if preds["isclean"]:
        kind = "pick_clean_then_place_in_recep"
    elif preds["ishot"]:
        kind = "pick_heat_then_place_in_recep"
    elif preds["iscool"]:
        kind = "pick_cool_then_place_in_recep"
    elif preds["inreceptacle"] >= 2:
        kind = "pick_two_obj_and_place"
    else:
        kind = "pick_and_place_simple"
    return TaskInfo(kind, obj_types[0], rec_types[0], None)


class Game:
    """One ALFWorld problem compiled for the native engine (immutable after construction)."""

    def __init__(self, problem: Problem, goal_text: str, *, variant: GrammarVariant | None = None,
                 task: TaskInfo | None = None, where: str = "game", meta: Mapping | None = None):
        self.problem = problem
        self.goal_text = goal_text  # e.g. "put a clean mug in countertop"
        self.variant = variant or GrammarVariant()
        self.where = where
        self.meta = dict(meta or {})
        types = problem.object_types()
        self.types = types
        init = problem.init
        entity_ids = {arg for atom in init for arg in atom[1:]}
        self.names = display_names(entity_ids)
        self.entities = tuple(sorted({n for n, _ in problem.objects} | entity_ids))
        self.entity_index = {e: i for i, e in enumerate(self.entities)}

        static: dict[str, set] = defaultdict(set)
        dynamic: dict[str, set] = defaultdict(set)
        for atom in init:
            (dynamic if atom[0] in DYNAMIC_PREDICATES else static)[atom[0]].add(tuple(atom[1:]))
        self.static = {k: frozenset(v) for k, v in static.items()}
        self.init_dynamic = {k: frozenset(v) for k, v in dynamic.items()}

        agents = sorted(n for n, t in problem.objects if t == "agent")
        if len(agents) != 1:
            raise GameFileError(f"{where}: expected exactly one agent object, found {agents}")
        self.agent = agents[0]
        starts = [l for a, l in self.init_dynamic.get("atlocation", ()) if a == self.agent]
        if len(starts) != 1:
            raise GameFileError(
                f"{where}: the agent must start at exactly one location, got {starts}")
        self.start_location = starts[0]

        rec_loc: dict[str, list[str]] = defaultdict(list)
        loc_receps: dict[str, list[str]] = defaultdict(list)
        for r, l in sorted(self.static.get("receptacleatlocation", ())):
            rec_loc[r].append(l)
            loc_receps[l].append(r)
        self.recep_locations = {r: tuple(v) for r, v in rec_loc.items()}
        self.loc_receps = {l: tuple(v) for l, v in loc_receps.items()}  # sorted by receptacle id
        self.receptacles = tuple(sorted(rec_loc))  # receptacles one can go to
        self.recep_types: dict[str, frozenset] = _group(self.static.get("receptacletype", ()))
        self.obj_types: dict[str, frozenset] = _group(self.static.get("objecttype", ()))
        self.can_contain = self.static.get("cancontain", frozenset())
        unary = lambda p: frozenset(a[0] for a in self.static.get(p, ()))  # noqa: E731
        self.openable = unary("openable")
        self.pickupable = unary("pickupable")
        self.cleanable = unary("cleanable")
        self.heatable = unary("heatable")
        self.coolable = unary("coolable")
        self.toggleable = unary("toggleable")
        self.sliceable = unary("sliceable")
        self.receptacle_objects = unary("isreceptacleobject")
        self.in_recep_object: dict[str, tuple[str, ...]] = {}
        for inner, outer in sorted(self.static.get("inreceptacleobject", ())):
            self.in_recep_object[outer] = self.in_recep_object.get(outer, ()) + (inner,)
        # Receptacles that clean / heat / cool (the domain names these rtypes as constants).
        self.sinks = frozenset(r for r, ts in self.recep_types.items() if "sinkbasintype" in ts)
        self.microwaves = frozenset(
            r for r, ts in self.recep_types.items() if "microwavetype" in ts)
        self.fridges = frozenset(r for r, ts in self.recep_types.items() if "fridgetype" in ts)
        self.knives = frozenset(o for o, ts in self.obj_types.items()
                                if ts & {"knifetype", "butterknifetype"})
        for eid in entity_ids:
            if eid not in self.names:
                self.names[eid] = eid
        by_type: dict[str, list[str]] = defaultdict(list)
        for n, t in problem.objects:
            by_type[t].append(n)
        by_type["object"] = list(set().union(*by_type.values())) if by_type else []
        self.objects_by_type = {t: tuple(sorted(v)) for t, v in by_type.items()}
        self.goal_checker = GoalChecker(problem.goal, self.objects_by_type, self.static)
        self.task = task or infer_task(problem.goal, where=where)
        self._type_cache: dict = {}

    # Objects of the task's target class (sorted ids), goal receptacles, lamps.
    def objects_of_type(self, otype: str | None) -> tuple[str, ...]:
        """The game's objects of type ``otype``, sorted (cached; none for None)."""
        if otype is None:
            return ()
        key = ("o", otype)
        if key not in self._type_cache:
            self._type_cache[key] = tuple(sorted(
                o for o, ts in self.obj_types.items() if otype in ts))
        return self._type_cache[key]

    def receptacles_of_type(self, rtype: str | None) -> tuple[str, ...]:
        """The game's receptacles of type ``rtype``, sorted (cached; none for None)."""
        if rtype is None:
            return ()
        key = ("r", rtype)
        if key not in self._type_cache:
            self._type_cache[key] = tuple(sorted(
                r for r, ts in self.recep_types.items() if rtype in ts))
        return self._type_cache[key]

    @property
    def task_type(self) -> str:
        """The game's task type (pick_and_place, pick_heat_then_place, ...)."""
        return self.task.task_type

    @property
    def goal_description(self) -> str:
        """The task without the frame, e.g. "put a clean mug in cabinet" (Trajectory.goal)."""
        text = self.goal
        return text[len("Your task is to:"):].strip().rstrip(".")

    @property
    def goal(self) -> str:
        """The task sentence of the intro, e.g. "Your task is to: put a clean mug in cabinet."."""
        if self.goal_text.startswith("Your task is to:"):
            return self.goal_text
        return f"Your task is to: {self.goal_text}."

    # Pickling: a game that knows how to rebuild itself travels as that recipe and is rebuilt
    # once per process, so VectorEnv messages carrying states stay small. Its producer sets
    # ``ref`` (("generated", seed, split, task types) or ("file", path)) and ``rebuild``, a
    # module-level function of ref[1:] that pickle finds by name: this module never imports
    # the generator or the file loader (they import it).
    ref: tuple | None = None
    rebuild: Any = None

    def __reduce__(self):
        if self.ref is not None and self.rebuild is not None:
            return (self.rebuild, tuple(self.ref[1:]))
        return (_game_from_parts, (self.problem, self.goal_text, self.variant, self.task,
                                   self.where, self.meta))


def _game_from_parts(problem, goal_text, variant, task, where, meta) -> "Game":
    return Game(problem, goal_text, variant=variant, task=task, where=where, meta=meta)


def _group(pairs) -> dict[str, frozenset]:
    out: dict[str, set] = defaultdict(set)
    for a, b in pairs:
        out[a].add(b)
    return {k: frozenset(v) for k, v in out.items()}
