"""Agents that produce ALFWorld data: an expert that plans over the engine state, and a noisy
expert with the mistakes judges are studied on (seed 000, sections 3.1-3.2).

``expert_plan(game)`` returns a command list that solves the task from the initial state: it
knows where everything is (it reads the state, like the official planner reads the PDDL), picks
the target instance with the shortest plan, and never issues an inadmissible command.

``NoisyExpertConfig`` adds, with configurable probabilities,

* detours: a visit to an unrelated receptacle (sometimes opening it) before a navigation step;
* repeated looks: "look" / "inventory" / re-"examine" — the no-ops of the annotation;
* invalid commands (answered "Nothing happens.");
* decoys: taking an object the task does not need where the agent stands (and so, next,
  putting it down again): state-changing actions with a milestone's verbs that are no progress;
* searching: not knowing where the target lies, visiting (and opening) receptacles that could
  hold it until one is seen;
* the dependency error of Clean / Heat / Cool tasks: carrying the target straight to the goal
  receptacle and placing it before cleaning / heating / cooling it, then either recovering
  (take it back, do the state change, place it again) or not (wandering until the budget ends).

``noisy_expert_trajectories(n, seed, ...)`` runs it on generated problems and returns
``jaxdm.trajectory.Trajectory`` objects with milestone / no-op annotations on every step.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from jaxdm.envs.alfworld.engine import (AlfWorldState, initial_state, step_state)
from jaxdm.envs.alfworld.world import HAS_DEPENDENCY, TASK_LABELS, TASK_TYPES, Game
from jaxdm.trajectory import Step, Trajectory

_CHANGE = {
    "pick_clean_then_place_in_recep": ("clean", "sinks"),
    "pick_heat_then_place_in_recep": ("heat", "microwaves"),
    "pick_cool_then_place_in_recep": ("cool", "fridges"),
}


def _where(state: AlfWorldState, obj: str) -> str | None:
    for o, r in state.in_recep:
        if o == obj:
            return r
    return None


def _goto(game: Game, state: AlfWorldState, r: str) -> list[str]:
    if state.location in game.recep_locations[r]:
        return []
    return ["go to " + game.names[r]]


def _open_if_needed(game: Game, state: AlfWorldState, r: str) -> list[str]:
    if r in game.openable and r not in state.opened:
        return ["open " + game.names[r]]
    return []


def _put_cmd(game: Game, o: str, r: str) -> str:
    return game.variant.put_template.format(o=game.names[o], r=game.names[r])


def _run(game: Game, state: AlfWorldState, cmds: Sequence[str]) -> AlfWorldState:
    for c in cmds:
        state, _, notes = step_state(game, state, c)
        if not notes["valid"]:
            raise RuntimeError(f"{game.where}: expert command {c!r} was not admissible")
    return state


def _nearest_station(game: Game, stations: Sequence[str]) -> str:
    return sorted(stations)[0]


def plan_from(game: Game, state: AlfWorldState) -> list[str]:
    """Commands that finish the task from ``state`` (empty if already won).

    Handles every state the noisy expert can reach: a held object (the target or not), a
    target already placed before its state change, one of two targets already placed."""
    if state.won:
        return []
    task = game.task
    kind = task.task_type
    targets = list(game.objects_of_type(task.object_type))
    goal_receps = sorted(game.receptacles_of_type(task.recep_type))
    plan: list[str] = []

    def do(cmds):
        nonlocal state
        state = _run(game, state, cmds)
        plan.extend(cmds)

    # Drop whatever non-target object is held (back where a put is allowed here, else anywhere).
    for o in list(state.held):
        if o in targets:
            continue
        here = game.loc_receps.get(state.location, ())
        dest = [r for r in here if _put_cmd(game, o, r) in state.command_map()]
        if not dest:
            dest = [r for r in game.receptacles if any(
                (rt, ot) in game.can_contain for rt in game.recep_types.get(r, ())
                for ot in game.obj_types.get(o, ()))]
            if not dest:
                raise RuntimeError(f"{game.where}: nowhere to put down {o}")
            do(_goto(game, state, dest[0]))
            do(_open_if_needed(game, state, dest[0]))
        do([_put_cmd(game, o, dest[0])])

    def placed_ok(o):
        r = _where(state, o)
        if r not in goal_receps:
            return False
        if kind in _CHANGE:
            changed = {"clean": state.clean, "heat": state.hot, "cool": state.cool}
            return o in changed[_CHANGE[kind][0]]
        return True

    needed = 2 if kind == "pick_two_obj_and_place" else 1
    while True:
        if state.won:
            return plan
        done_targets = {o for o in targets if placed_ok(o)}
        if kind != "look_at_obj_in_light" and len(done_targets) >= needed:
            return plan
        held = [o for o in state.held if o in targets]
        if not held:
            # Fetch the target (not one already counted) that is cheapest to reach.
            options = [o for o in targets if o not in done_targets and _where(state, o)]
            if not options:
                raise RuntimeError(f"{game.where}: no reachable target left for the expert")

            def cost(o):
                r = _where(state, o)
                return (len(_goto(game, state, r)) + len(_open_if_needed(game, state, r)), o)

            o = min(options, key=cost)
            r = _where(state, o)
            do(_goto(game, state, r))
            do(_open_if_needed(game, state, r))
            do([f"take {game.names[o]} from {game.names[r]}"])
            continue
        o = held[0]
        if kind == "look_at_obj_in_light":
            lamps = sorted(x for x in game.objects_of_type(task.toggle_type))
            lamp = lamps[0]
            r = _where(state, lamp)
            do(_goto(game, state, r))
            do(["use " + game.names[lamp]])
            continue
        if kind in _CHANGE:
            verb, attr = _CHANGE[kind]
            changed = {"clean": state.clean, "heat": state.hot, "cool": state.cool}[verb]
            if o not in changed:
                station = _nearest_station(game, getattr(game, attr))
                do(_goto(game, state, station))
                do([f"{verb} {game.names[o]} with {game.names[station]}"])
        dest = goal_receps[0]
        do(_goto(game, state, dest))
        do(_open_if_needed(game, state, dest))
        do([_put_cmd(game, o, dest)])


def expert_plan(game: Game) -> list[str]:
    """A plan that solves ``game`` from its initial state (checked by running it)."""
    state = initial_state(game)
    plan = plan_from(game, state)
    final = _run(game, state, plan)
    if not final.won:
        raise RuntimeError(f"{game.where}: expert plan does not win")
    return plan


# --------------------------------------------------------------------------------------------
# Noisy expert
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class NoisyExpertConfig:
    """Probabilities of the noisy expert's mistakes (per opportunity)."""

    detour_prob: float = 0.25  # before a "go to": visit an unrelated receptacle first
    look_prob: float = 0.15  # after an action: a "look" / "inventory" / repeated examine
    invalid_prob: float = 0.05  # an inadmissible command ("Nothing happens.")
    dependency_error_prob: float = 0.5  # Clean/Heat/Cool: place before the state change
    recover_prob: float = 0.5  # after that error: take it back and do it right
    give_up_prob: float = 0.0  # any task: stop following the plan and wander
    search_prob: float = 0.6  # per episode: the agent does not know where the target lies and
    #                           looks into receptacles that could hold it until it sees one
    decoy_prob: float = 0.0  # empty-handed: take an object the task does not need (then put
    #                          it down again: the plan drops whatever non-target it holds)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"NoisyExpertConfig.{f.name} must be in [0, 1], got {v}")


def _noise_command(rng: random.Random, game: Game, state: AlfWorldState) -> str:
    choice = rng.random()
    if choice < 0.4:
        return "look"
    if choice < 0.6:
        return "inventory"
    examines = [c for c in state.command_map() if c.startswith("examine ")]
    if examines:
        return rng.choice(sorted(examines))
    return "look"


def _invalid_command(rng: random.Random, game: Game) -> str:
    far = rng.choice(game.receptacles)
    return rng.choice([f"take {game.names[far]} from {game.names[far]}", "jump",
                       f"open {game.names[far]} with key", "pick up everything"])


def run_noisy_expert(game: Game, *, seed: int, budget: int = 30,
                     config: NoisyExpertConfig = NoisyExpertConfig()) -> Trajectory:
    """One noisy-expert episode of ``game`` under an action budget, as a Trajectory."""
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")
    rng = random.Random(seed)
    state = initial_state(game)
    obs = state.last_observation
    steps: list[Step] = []
    kind = game.task.task_type
    make_error = kind in _CHANGE and rng.random() < config.dependency_error_prob
    recover = rng.random() < config.recover_prob
    give_up = rng.random() < config.give_up_prob
    meta = {"task_type_full": kind, "dependency_error": False, "recovered": None,
            "searched": False,
            "gave_up": False, "game": game.where, **{k: v for k, v in game.meta.items()
                                                     if k in ("seed", "split", "scene")}}
    error_done = False
    wandering = False
    searching = rng.random() < config.search_prob
    meta["searched"] = searching
    seen: set[str] = set()  # receptacles whose contents the agent has seen
    targets = set(game.objects_of_type(game.task.object_type))
    goal_receps = set(game.receptacles_of_type(game.task.recep_type))
    otypes = set()
    for o in targets:
        otypes |= game.obj_types.get(o, frozenset())
    could_hold = [r for r in game.receptacles if r not in goal_receps and any(
        (rt, ot) in game.can_contain for rt in game.recep_types.get(r, ()) for ot in otypes)]

    def note_seen():
        for r in game.loc_receps.get(state.location, ()):
            if r not in game.openable or r in state.opened:
                seen.add(r)

    def search_step(cmd: str) -> bool:
        """Replace a fetch "go to" by exploration while no target has been seen."""
        if not searching or any(o in targets for o in state.held):
            return False
        known = sorted(r for o, r in state.in_recep if o in targets and r in seen
                       and r not in goal_receps)
        if known:
            if cmd != "go to " + game.names[known[0]] and state.location not in \
                    game.recep_locations[known[0]]:
                act("go to " + game.names[known[0]])
                return True
            return False
        here = game.loc_receps.get(state.location, ())
        closed_here = [r for r in here if r in could_hold and r in game.openable
                       and r not in state.opened]
        if closed_here:
            act("open " + game.names[closed_here[0]])
            return True
        unseen = [r for r in could_hold if r not in seen
                  and state.location not in game.recep_locations[r]]
        if not unseen:
            return False
        act("go to " + game.names[rng.choice(unseen)])
        return True

    def act(cmd: str):
        nonlocal state, obs
        new, feedback, notes = step_state(game, state, cmd)
        ann = {"milestone": notes["milestone"], "no_op": notes["no_op"],
               "subgoal": notes["subgoal"], "won": notes["won"]}
        steps.append(Step(observation=obs, action=cmd, valid=notes["valid"], annotations=ann))
        state, obs = new, feedback
        note_seen()

    while len(steps) < budget and not state.won:
        if wandering:
            r = rng.random()
            if r < 0.3:
                act(_noise_command(rng, game, state))
            else:
                act(rng.choice(sorted(state.command_map())))
            continue
        if config.invalid_prob and rng.random() < config.invalid_prob:
            act(_invalid_command(rng, game))
            continue
        if config.look_prob and steps and rng.random() < config.look_prob:
            act(_noise_command(rng, game, state))
            continue
        if give_up and len(steps) >= 3:
            wandering = True
            meta["gave_up"] = True
            continue
        if config.decoy_prob and not state.held and rng.random() < config.decoy_prob:
            decoys = sorted(c for c, a in state.command_map().items() if c.startswith("take ")
                            and not any(game.names[o] == c.split(" from ")[0][5:]
                                        for o in targets))
            if decoys:
                act(rng.choice(decoys))
                continue
        holding_target = any(o in targets for o in state.held)
        if make_error and not error_done and holding_target:
            verb = _CHANGE[kind][0]
            o = next(x for x in state.held if x in targets)
            changed = {"clean": state.clean, "heat": state.hot, "cool": state.cool}[verb]
            if o not in changed:
                dest = sorted(game.receptacles_of_type(game.task.recep_type))[0]
                for c in _goto(game, state, dest) + _open_if_needed(game, state, dest):
                    act(c)
                    if len(steps) >= budget:
                        break
                if len(steps) < budget:
                    act(_put_cmd(game, o, dest))
                error_done = True
                meta["dependency_error"] = True
                meta["recovered"] = recover
                if not recover:
                    wandering = True
                continue
        plan = plan_from(game, state)
        if not plan:
            break
        cmd = plan[0]
        if (cmd.startswith("go to ") or cmd.startswith("open ")) and search_step(cmd):
            continue
        if cmd.startswith("go to ") and config.detour_prob and rng.random() < config.detour_prob:
            elsewhere = [r for r in game.receptacles
                         if state.location not in game.recep_locations[r]]
            if not elsewhere:
                act(cmd)
                continue
            other = rng.choice(elsewhere)
            act("go to " + game.names[other])
            if (len(steps) < budget and other in game.openable and other not in state.opened
                    and rng.random() < 0.5):
                act("open " + game.names[other])
            continue
        act(cmd)
    truncated = (not state.won) and len(steps) >= budget
    return Trajectory(
        goal=game.goal_description,
        steps=tuple(steps), final_observation=obs, reward=1.0 if state.won else 0.0,
        success=state.won, budget=budget, task_type=TASK_LABELS[kind], env="alfworld",
        truncated=truncated, metadata={**meta, "has_dependency": HAS_DEPENDENCY[kind],
                                       "subgoals_reached": sorted(state.achieved)})


# The cue-controlled judge test set's agent (experiments/judge_cues.py): no invalid commands
# (so no no-op says "Nothing happens."), repeated looks and examines (no-ops whose feedback is
# ordinary text, beside first looks that are not no-ops), decoy takes and puts (a milestone's
# verbs, no progress), and on Clean / Heat / Cool tasks always the dependency error and its
# recovery (the recovering put repeats the earlier put's exact command and is the milestone).
CUE_CONTROLLED = NoisyExpertConfig(detour_prob=0.25, look_prob=0.3, invalid_prob=0.0,
                                   dependency_error_prob=1.0, recover_prob=1.0,
                                   search_prob=0.6, decoy_prob=0.3)


def expert_trajectory(game: Game, *, budget: int = 30) -> Trajectory:
    """The noiseless expert's episode (all probabilities zero)."""
    zero = NoisyExpertConfig(detour_prob=0, look_prob=0, invalid_prob=0,
                             dependency_error_prob=0, recover_prob=0, give_up_prob=0,
                             search_prob=0)
    return run_noisy_expert(game, seed=0, budget=budget, config=zero)


def noisy_expert_trajectories(n: int, seed: int = 0, *, task_types: Sequence[str] | None = None,
                              budget: int = 30, split: str = "train",
                              config: NoisyExpertConfig = NoisyExpertConfig()) -> list[Trajectory]:
    """``n`` noisy-expert trajectories on generated problems, cycling through ``task_types``
    (all six by default); deterministic in ``seed``."""
    from jaxdm.envs.alfworld.generator import generate_game

    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    types = tuple(task_types) if task_types else TASK_TYPES
    bad = [t for t in types if t not in TASK_TYPES]
    if bad:
        raise ValueError(f"unknown ALFWorld task type(s) {bad}; known: {list(TASK_TYPES)}")
    out = []
    for i in range(n):
        game_seed = seed * 100_003 + i
        kind = types[i % len(types)]
        game = generate_game(game_seed, split=split, task_types=(kind,))
        out.append(run_noisy_expert(game, seed=game_seed, budget=budget, config=config))
    return out


__all__ = ["CUE_CONTROLLED", "NoisyExpertConfig", "expert_plan", "expert_trajectory", "noisy_expert_trajectories",
           "plan_from", "run_noisy_expert"]
