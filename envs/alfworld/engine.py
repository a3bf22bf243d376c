"""Native ALFWorld engine: the ALFRED PDDL domain and the alfred.twl2 text, in plain Python.

``AlfWorldEnv`` is a gymnax-style ``Environment``: it holds no episode state; ``reset`` and
``step`` are pure functions of an immutable ``AlfWorldState``, so an episode can be copied,
replayed from its actions and continued. The semantics are those of ``alfred.pddl`` as the
official TextWorld engine plays it (the admissible commands are exactly the applicable ground
actions, rendered with the grammar, sorted and de-duplicated; anything else gets
"Nothing happens." and changes nothing), and the texts are those of ``alfred.twl2``, with
lists ordered as the official grammar engine orders them (by entity id). The fidelity test
(tests/envs/test_alfworld_fidelity.py) checks this step by step against the official engine.

Quirks of the official engine reproduced on purpose (each checked against TextWorld): no
"go to" the receptacle one stands at (Fast Downward drops no-op ground actions); objects can be
examined only when held (examineObject's other disjunct never applies); "look" lists objects
"next to" a receptacle when they were taken out of another receptacle at the same spot (the
engine's leftover ``not_inreceptacle`` facts); after "look", a spot with no receptacle lists
"nothing", while the intro lists every receptacle; "a" before every name ("a apple 1").

Not modelled: the bookkeeping predicates ``checked`` / ``examined`` (no precondition, goal or
text reads them), so the no-op annotation's "state unchanged" ignores them.

Step ``info`` carries "admissible_actions", "valid", "won", "milestone", "no_op", "subgoal",
"goal" (the task, e.g. "put a clean mug in cabinet"), "task_type" (pick / look / clean / heat /
cool / pick_two), "task_type_full" (the ALFWorld name), "has_dependency", "truncated" and
"step".
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Mapping, Sequence

from jaxdm.envs.core import Environment, seed_of
from jaxdm.envs.alfworld.world import HAS_DEPENDENCY, TASK_LABELS, TASK_TYPES, Game

NOTHING_HAPPENS = "Nothing happens."
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
HELP_TEXT = (  # the grammar engine drops the rule's leading newline
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)


@dataclasses.dataclass(frozen=True)
class AlfWorldState:
    """One moment of an episode. Physical fields mirror the domain's dynamic predicates.

    ``not_in_recep`` holds the (object, receptacle) pairs the official engine has recorded as
    ``not_inreceptacle`` facts (taken out and not put back there): its "look" text lists such
    objects lying at the location. ``achieved`` are the task subgoals reached so far,
    ``seen_actions`` / ``seen_observations`` the history used by the no-op annotation (the
    observations as stable 64-bit digests, see ``text_digest``).
    """

    game: Game = dataclasses.field(compare=False, repr=False)
    location: str
    held: tuple[str, ...]
    holds_any: bool
    in_recep: frozenset
    obj_loc: frozenset
    opened: frozenset
    clean: frozenset
    hot: frozenset
    cool: frozenset
    on: frozenset
    toggled: frozenset
    sliced: frozenset
    not_in_recep: frozenset
    moves: int = 0  # successful actions (the official "moves")
    t: int = 0  # step() calls, valid or not
    won: bool = False
    achieved: frozenset = frozenset()
    seen_actions: frozenset = frozenset()
    seen_observations: frozenset = frozenset()
    last_observation: str = ""
    commands: Mapping[str, tuple] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    # Pickled compactly (VectorEnv ships states between processes every step): entity ids as
    # indices into the game's sorted entity list, no command cache (rebuilt on demand).
    _PAIR_FIELDS = ("in_recep", "obj_loc", "not_in_recep")

    def __getstate__(self):
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["commands"] = None
        index = self.game.entity_index
        for name in self._PAIR_FIELDS:
            d[name] = tuple(index[x] for pair in d[name] for x in pair)
        return d

    def __setstate__(self, d):
        entities = d["game"].entities
        for name in self._PAIR_FIELDS:
            flat = d[name]
            d[name] = frozenset((entities[flat[i]], entities[flat[i + 1]])
                                for i in range(0, len(flat), 2))
        for k, v in d.items():
            object.__setattr__(self, k, v)

    def physical(self) -> tuple:
        """The environment state proper (what the no-op annotation compares)."""
        return (self.location, self.held, self.holds_any, self.in_recep, self.obj_loc,
                self.opened, self.clean, self.hot, self.cool, self.on, self.toggled,
                self.sliced)

    @property
    def admissible_actions(self) -> list[str]:
        """The commands that can be typed in this state, sorted."""
        return sorted(self.command_map())

    def command_map(self) -> Mapping[str, tuple]:
        """{command: its parsed action} in this state (computed on first use, then kept on the
        state)."""
        if self.commands is None:
            object.__setattr__(self, "commands", command_table(self.game, self))
        return self.commands


@dataclasses.dataclass(frozen=True)
class AlfWorldParams:
    """Which games ``reset`` draws from, and the action budget.

    ``games`` (explicit ``Game`` objects, e.g. read from official files): ``reset(seed)`` plays
    ``games[seed % len(games)]``. Without games, ``reset(seed)`` generates the problem for
    ``seed`` of ``split`` among ``task_types`` (deterministic, see ``generator``).
    ``max_steps``: the budget; the episode is truncated when it is spent.
    """

    games: tuple = ()
    split: str = "train"
    task_types: tuple[str, ...] = TASK_TYPES
    max_steps: int = 50

    def __post_init__(self):
        if self.max_steps <= 0:
            raise ValueError(f"max_steps must be positive, got {self.max_steps}")
        bad = [t for t in self.task_types if t not in TASK_TYPES]
        if bad:
            raise ValueError(f"unknown ALFWorld task type(s) {bad}; known: {list(TASK_TYPES)}")


# --------------------------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------------------------
def text_digest(text: str) -> int:
    """A 64-bit digest of a text, the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _listing(items: Sequence[str]) -> str:
    """The grammar's list rendering: "nothing", "x", "x, and y", "x, y, and z"."""
    n = len(items)
    if n == 0:
        return "nothing"
    if n == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def _contents(state: AlfWorldState, receptacles) -> dict[str, list[str]]:
    wanted = set(receptacles)
    out: dict[str, list[str]] = {r: [] for r in receptacles}
    for o, r in state.in_recep:
        if r in wanted:
            out[r].append(o)
    for v in out.values():
        v.sort()
    return out


def _examine_receptacle(game: Game, state: AlfWorldState, r: str, contents: list[str]) -> str:
    names = game.names
    items = _listing(["a " + names[o] for o in contents])
    if r in game.openable:
        if r in state.opened:
            return f"The {names[r]} is open. In it, you see {items}."
        return f"The {names[r]} is closed."
    return f"On the {names[r]}, you see {items}."


def _examine_object(game: Game, state: AlfWorldState, o: str) -> str:
    name = game.names[o]
    if o in game.receptacle_objects:
        inner = [x for x in game.in_recep_object.get(o, ()) if x != o]
        inside = _listing(["a " + game.names[x] for x in inner])
        return f"This is a normal {name}. In it, you see {inside}."
    c, h, k, s = o in state.clean, o in state.hot, o in state.cool, o in state.sliced
    if c and h and s:
        return f"This is a hot and clean sliced {name}."
    if c and k and s:
        return f"This is a cool and clean sliced {name}."
    if c and s:
        return f"This is a clean sliced {name}."
    if h and s:
        return f"This is a hot sliced {name}."
    if k and s:
        return f"This is a cool sliced {name}."
    if c and h:
        return f"This is a hot and clean {name}."
    if c and k:
        return f"This is a cool and clean {name}."
    if h:
        return f"This is a hot {name}."
    if c:
        return f"This is a clean {name}."
    if k:
        return f"This is a cold {name}."
    if o in game.toggleable and o in state.toggled:
        return f"This {name} is on."
    if o in game.sliceable and s:
        return f"This is a sliced {name}."
    return f"There's nothing special about {name}."


def _look(game: Game, state: AlfWorldState, *, intro: bool) -> str:
    names = game.names
    here = game.loc_receps.get(state.location, ())
    if here:
        floor = []
        for o, l in sorted(state.obj_loc):
            if l != state.location:
                continue
            for r in here:
                if (o, r) in state.not_in_recep:
                    floor.append("a " + names[o])
        return (f"You are facing the {_listing([names[r] for r in here])}. "
                f"Next to it, you see {_listing(floor)}.")
    # In the intro no location is bound, so every receptacle is listed; after "look" the
    # agent's own location is bound and has none.
    listed = [f"a {names[r]}" for r in game.receptacles] if intro else []
    return ("You are in the middle of a room. Looking quickly around you, you see "
            f"{_listing(listed)}.")


def intro_text(game: Game, state: AlfWorldState) -> str:
    """The first observation: the welcome line, what the agent sees around it, and the goal."""
    return f"{WELCOME}\n\n{_look(game, state, intro=True)}\n\n{game.goal}"


# --------------------------------------------------------------------------------------------
# Admissible commands (the applicable ground actions of alfred.pddl)
# --------------------------------------------------------------------------------------------
def _goto_commands(game: Game, location: str) -> dict[str, tuple]:
    """The "go to" commands from ``location`` (cached per game and location)."""
    cache = game._type_cache.setdefault("goto", {})
    got = cache.get(location)
    if got is None:
        got = {}
        for r in game.receptacles:
            # Going where one already is has no effect, and the official translator (Fast
            # Downward) drops such no-op ground actions: not admissible.
            for lend in game.recep_locations[r]:
                if lend != location:
                    got.setdefault("go to " + game.names[r], ("goto", r, lend))
                    break
        cache[location] = got
    return got


def command_table(game: Game, state: AlfWorldState) -> dict[str, tuple]:
    """Every admissible command mapped to its ground action ``(kind, args...)``."""
    names = game.names
    cmds: dict[str, tuple] = {}
    here = game.loc_receps.get(state.location, ())
    cmds.update(_goto_commands(game, state.location))
    cmds["look"] = ("look",)
    cmds["inventory"] = ("inventory",)
    if game.variant.has_help:
        cmds["help"] = ("help",)
    contents = _contents(state, here)
    held = state.held
    for r in here:
        rname = names[r]
        cmds["examine " + rname] = ("examine_r", r)
        openable = r in game.openable
        if openable:
            if r in state.opened:
                cmds["close " + rname] = ("close", r)
            else:
                cmds["open " + rname] = ("open", r)
        accessible = (not openable) or r in state.opened
        for o in contents[r]:
            if o in game.toggleable:
                cmds.setdefault("use " + names[o], ("toggle", o, r))
            # (examineObject's first disjunct, an object in a reachable receptacle, never
            # applies in the official engine: its "(?l - location, ?r - receptacle)" list
            # does not parse as intended. Only held objects can be examined.)
            if accessible:
                if not state.holds_any and o in game.pickupable:
                    cmds.setdefault(f"take {names[o]} from {rname}", ("take", o, r))
        rtypes = game.recep_types.get(r, ())
        for o in held:
            if accessible:
                otypes = game.obj_types.get(o, ())
                if any((rt, ot) in game.can_contain for rt in rtypes for ot in otypes):
                    cmd = game.variant.put_template.format(o=names[o], r=rname)
                    cmds.setdefault(cmd, ("put", o, r))
            if r in game.sinks and o in game.cleanable:
                cmds.setdefault(f"clean {names[o]} with {rname}", ("clean", o, r))
            if r in game.microwaves and o in game.heatable:
                cmds.setdefault(f"heat {names[o]} with {rname}", ("heat", o, r))
            if r in game.fridges and o in game.coolable:
                cmds.setdefault(f"cool {names[o]} with {rname}", ("cool", o, r))
    for o in held:
        cmds.setdefault("examine " + names[o], ("examine_o", o))
        if o in game.knives:
            for co, l in state.obj_loc:
                if l == state.location and co in game.sliceable:
                    cmds.setdefault(f"slice {names[co]} with {names[o]}", ("slice", co, o))
    return cmds


# --------------------------------------------------------------------------------------------
# Transitions
# --------------------------------------------------------------------------------------------
def _evolve(state: AlfWorldState, **changes) -> AlfWorldState:
    """``dataclasses.replace`` without re-running ``__init__`` (the hot path of ``step``)."""
    new = object.__new__(AlfWorldState)
    d = new.__dict__
    d.update(state.__dict__)
    d.update(changes)
    return new


def _apply(game: Game, state: AlfWorldState, action: tuple) -> tuple[AlfWorldState, str]:
    """Apply a ground action; returns the new state (same history fields) and the feedback."""
    names = game.names
    kind = action[0]
    rep = _evolve
    if kind == "goto":
        _, r, lend = action
        new = rep(state, location=lend, commands=None)
        arrive = names[lend] if game.variant.arrive_at_location else names[r]
        text = f"You arrive at {arrive}. " + _examine_receptacle(
            game, new, r, _contents(new, (r,))[r])
        return new, text
    if kind == "open":
        r = action[1]
        new = rep(state, opened=state.opened | {r}, commands=None)
        return new, f"You open the {names[r]}. " + _examine_receptacle(
            game, new, r, _contents(new, (r,))[r])
    if kind == "close":
        r = action[1]
        return rep(state, opened=state.opened - {r}, commands=None), f"You close the {names[r]}."
    if kind == "take":
        _, o, r = action
        new = rep(state, in_recep=state.in_recep - {(o, r)},
                  held=tuple(sorted(set(state.held) | {o})), holds_any=True,
                  obj_loc=state.obj_loc - {(o, state.location)},
                  not_in_recep=state.not_in_recep | {(o, r)}, commands=None)
        return new, f"You pick up the {names[o]} from the {names[r]}."
    if kind == "put":
        _, o, r = action
        new = rep(state, in_recep=state.in_recep | {(o, r)},
                  held=tuple(x for x in state.held if x != o), holds_any=False,
                  obj_loc=state.obj_loc | {(o, state.location)},
                  not_in_recep=state.not_in_recep - {(o, r)}, commands=None)
        return new, game.variant.put_feedback.format(o=names[o], r=names[r])
    if kind == "clean":
        _, o, r = action
        return (rep(state, clean=state.clean | {o}, commands=None),
                f"You clean the {names[o]} using the {names[r]}.")
    if kind == "heat":
        _, o, r = action
        return (rep(state, hot=state.hot | {o}, cool=state.cool - {o}, commands=None),
                f"You heat the {names[o]} using the {names[r]}.")
    if kind == "cool":
        _, o, r = action
        return (rep(state, cool=state.cool | {o}, hot=state.hot - {o}, commands=None),
                f"You cool the {names[o]} using the {names[r]}.")
    if kind == "toggle":
        _, o, r = action
        on = state.on - {o} if o in state.on else state.on | {o}
        new = rep(state, on=on, toggled=state.toggled | {o}, commands=None)
        return new, f"You turn on the {names[o]}."
    if kind == "slice":
        _, co, ko = action
        return (rep(state, sliced=state.sliced | {co}, commands=None),
                f"You sliced the {names[co]} with the {names[ko]}.")
    if kind == "look":
        return state, _look(game, state, intro=False)
    if kind == "inventory":
        if state.holds_any and state.held:
            return state, f"You are carrying: {_listing(['a ' + names[o] for o in state.held])}."
        return state, "You are not carrying anything."
    if kind == "examine_r":
        r = action[1]
        return state, _examine_receptacle(game, state, r, _contents(state, (r,))[r])
    if kind == "examine_o":
        return state, _examine_object(game, state, action[1])
    if kind == "help":
        return state, HELP_TEXT
    raise AssertionError(f"unknown action kind {kind!r}")


def fact_source(game: Game, state: AlfWorldState) -> Callable[[str], frozenset]:
    """Predicate -> set of argument tuples true in ``state`` (for goal checking)."""
    agent = game.agent

    def facts(pred: str):
        if pred == "atlocation":
            return {(agent, state.location)}
        if pred == "inreceptacle":
            return state.in_recep
        if pred == "holds":
            return {(agent, o) for o in state.held}
        if pred == "holdsany":
            return {(agent,)} if state.holds_any else set()
        if pred == "objectatlocation":
            return state.obj_loc
        unary = {"opened": state.opened, "isclean": state.clean, "ishot": state.hot,
                 "iscool": state.cool, "ison": state.on, "istoggled": state.toggled,
                 "issliced": state.sliced}.get(pred)
        if unary is not None:
            return {(x,) for x in unary}
        return game.static.get(pred, frozenset())

    return facts


# --------------------------------------------------------------------------------------------
# Subgoals (milestone annotation, seed 000 Appendix C.1)
# --------------------------------------------------------------------------------------------
def subgoals_reached(game: Game, state: AlfWorldState, *, won: bool | None = None) -> frozenset:
    """The task subgoals that hold in ``state`` (their names: take, clean, heat, cool, light,
    place, take_second, place_second)."""
    task = game.task
    cache = game._type_cache.get("subgoal_sets")
    if cache is None:
        cache = (frozenset(game.objects_of_type(task.object_type)),
                 frozenset(game.receptacles_of_type(task.recep_type)))
        game._type_cache["subgoal_sets"] = cache
    targets, goal_receps = cache
    held_target = any(o in targets for o in state.held)
    out = set()
    if held_target:
        out.add("take")
    kind = task.task_type
    if kind == "look_at_obj_in_light":
        if state.won if won is None else won:
            out.add("light")
        return frozenset(out)
    change = {"pick_clean_then_place_in_recep": ("clean", state.clean),
              "pick_heat_then_place_in_recep": ("heat", state.hot),
              "pick_cool_then_place_in_recep": ("cool", state.cool)}.get(kind)
    placed = {o for o, r in state.in_recep if o in targets and r in goal_receps}
    if change is not None:
        name, changed = change
        if targets & changed:
            out.add(name)
        placed &= changed
    if placed:
        out.add("place")
    if kind == "pick_two_obj_and_place":
        if held_target and placed:
            out.add("take_second")
        if len(placed) >= 2:
            out.add("place_second")
    return frozenset(out)


SUBGOAL_ORDER = ("take", "clean", "heat", "cool", "light", "place", "take_second", "place_second")


def task_subgoals(task_type: str) -> tuple[str, ...]:
    """The subgoals of a task type, in the order an expert reaches them."""
    return {
        "pick_and_place_simple": ("take", "place"),
        "look_at_obj_in_light": ("take", "light"),
        "pick_clean_then_place_in_recep": ("take", "clean", "place"),
        "pick_heat_then_place_in_recep": ("take", "heat", "place"),
        "pick_cool_then_place_in_recep": ("take", "cool", "place"),
        "pick_two_obj_and_place": ("take", "place", "take_second", "place_second"),
    }[task_type]


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------
def initial_state(game: Game) -> AlfWorldState:
    """The state at the start of ``game``: the agent at its start location, what it holds, the
    initial open / on / in relations."""
    d = game.init_dynamic
    un = lambda p: frozenset(a[0] for a in d.get(p, ()))  # noqa: E731
    held = tuple(sorted(o for a, o in d.get("holds", ()) if a == game.agent))
    state = AlfWorldState(
        game=game, location=game.start_location, held=held,
        holds_any=bool(d.get("holdsany")), in_recep=d.get("inreceptacle", frozenset()),
        obj_loc=d.get("objectatlocation", frozenset()), opened=un("opened"),
        clean=un("isclean"), hot=un("ishot"), cool=un("iscool"), on=un("ison"),
        toggled=un("istoggled"), sliced=un("issliced"), not_in_recep=frozenset())
    won = game.goal_checker(fact_source(game, state))
    state = dataclasses.replace(state, won=won)
    state = dataclasses.replace(state, achieved=subgoals_reached(game, state))
    intro = intro_text(game, state)
    return dataclasses.replace(state, last_observation=intro,
                               seen_observations=frozenset({text_digest(intro)}),
                               commands=command_table(game, state))


def step_state(game: Game, state: AlfWorldState, command: str) -> tuple[AlfWorldState, str, dict]:
    """One transition without budget handling: (new state, feedback, annotations)."""
    if not isinstance(command, str):
        raise TypeError(f"ALFWorld action must be a command string, got {type(command).__name__}")
    cmds = state.command_map()
    cmd = command.strip()
    action = cmds.get(cmd)
    if action is None:
        new, feedback, valid = state, NOTHING_HAPPENS, False
    else:
        new, feedback = _apply(game, state, action)
        valid = True
    unchanged = new is state or new.physical() == state.physical()
    if unchanged:
        won, reached = state.won, state.achieved
    else:
        won = game.goal_checker(fact_source(game, new))
        reached = subgoals_reached(game, new, won=won)
    newly = reached - state.achieved
    # "Repeats": the same command again, an observation seen before, or one the previous
    # observation already contained (e.g. "examine drawer 1" right after arriving there).
    digest = text_digest(feedback)
    repeated = (cmd in state.seen_actions or digest in state.seen_observations
                or feedback in state.last_observation)
    no_op = unchanged and (feedback == NOTHING_HAPPENS or repeated)
    subgoal = "+".join(s for s in SUBGOAL_ORDER if s in newly) if newly else ""
    new = _evolve(
        new, won=won, achieved=state.achieved | reached, t=state.t + 1,
        moves=state.moves + (1 if valid else 0),
        seen_actions=state.seen_actions | {cmd},
        seen_observations=state.seen_observations | {digest},
        last_observation=feedback, commands=None)
    new.__dict__["commands"] = command_table(game, new)  # a cache, not state
    notes = {"valid": valid, "milestone": bool(newly), "no_op": no_op, "subgoal": subgoal,
             "won": won}
    return new, feedback, notes


class AlfWorldEnv(Environment):
    """The native ALFWorld engine behind the gymnax-style ``Environment`` API.

    >>> env = AlfWorldEnv()
    >>> obs, state = env.reset(0)                       # generated train problem for seed 0
    >>> obs, state, reward, done, info = env.step(0, state, "look")

    ``key`` may be an int seed or a JAX PRNG key. Picklable (for ``VectorEnv`` workers).
    """

    name = "alfworld"

    def __init__(self, params: AlfWorldParams | None = None):
        self._params = params or AlfWorldParams()

    @property
    def default_params(self) -> AlfWorldParams:
        """The params this env was built with."""
        return self._params

    @classmethod
    def from_files(cls, paths, **params) -> "AlfWorldEnv":
        """An env over official ``game.tw-pddl`` files (``reset(seed)`` plays ``seed % n``)."""
        from jaxdm.envs.alfworld.gamefile import load_game

        return cls(AlfWorldParams(games=tuple(load_game(p) for p in paths), **params))

    @classmethod
    def from_split(cls, root: str, split: str, **params) -> "AlfWorldEnv":
        """An env over an official data split (``root/<split>/...``, e.g. ``json_2.1.1``)."""
        from jaxdm.envs.alfworld.gamefile import find_games

        return cls.from_files(find_games(root, split), **params)

    def game_for_seed(self, seed: int, params: AlfWorldParams) -> Game:
        """The game of task ``seed``: params.games[seed % len] when games are given, else one
        generated for the seed, split and task types."""
        if params.games:
            return params.games[seed % len(params.games)]
        from jaxdm.envs.alfworld.generator import generate_game

        return generate_game(seed, split=params.split, task_types=params.task_types)

    def reset_env(self, key: Any, params: AlfWorldParams) -> tuple[str, AlfWorldState]:
        """A new episode of the game ``key``'s seed picks; (intro observation, initial state)."""
        game = self.game_for_seed(seed_of(key), params)
        state = initial_state(game)
        return state.last_observation, state

    def reset_game(self, game: Game) -> tuple[str, AlfWorldState]:
        """Start an episode of a given game (no params needed)."""
        state = initial_state(game)
        return state.last_observation, state

    def info_of(self, state: AlfWorldState, notes: Mapping | None = None) -> dict:
        """The step info of ``state``: admissible actions, goal and task type, whether the last
        action was valid, a milestone or a no-op, its subgoal, and won."""
        game = state.game
        notes = notes or {"valid": True, "milestone": False, "no_op": False, "subgoal": "",
                          "won": state.won}
        return {
            "admissible_actions": state.admissible_actions,
            "valid": notes["valid"],
            "won": notes["won"],
            "milestone": notes["milestone"],
            "no_op": notes["no_op"],
            "subgoal": notes["subgoal"],
            "goal": game.goal_description,
            "task_type": TASK_LABELS[game.task_type],
            "task_type_full": game.task_type,
            "has_dependency": HAS_DEPENDENCY[game.task_type],
            "step": state.t,
        }

    def reset_info(self, state: AlfWorldState, params: AlfWorldParams | None = None) -> dict:
        """What ``VectorEnv`` records at reset (goal, task type, budget) plus the step keys."""
        params = params or self._params
        info = self.info_of(state)
        info.update(budget=params.max_steps, env=self.name, observation=state.last_observation)
        return info

    def step_env(self, key: Any, state: AlfWorldState, action: Any, params: AlfWorldParams):
        """One typed command through the native engine: (feedback, new state, reward 1 on the
        winning step, done when won or out of budget, info with the milestone / no-op annotations);
        a non-string action or a foreign state is a TypeError."""
        if not isinstance(state, AlfWorldState):
            raise TypeError(f"state must be an AlfWorldState, got {type(state).__name__}")
        if not isinstance(action, str):
            raise TypeError(f"action must be a command string, got {type(action).__name__}")
        new, feedback, notes = step_state(state.game, state, action)
        truncated = (not new.won) and new.t >= params.max_steps
        info = self.info_of(new, notes)
        info["truncated"] = truncated
        reward = 1.0 if new.won else 0.0
        done = bool(new.won or truncated)
        return feedback, new, reward, done, info


__all__ = ["AlfWorldEnv", "AlfWorldParams", "AlfWorldState", "NOTHING_HAPPENS", "TASK_LABELS",
           "command_table", "initial_state", "step_state", "subgoals_reached", "task_subgoals",
           "intro_text"]
