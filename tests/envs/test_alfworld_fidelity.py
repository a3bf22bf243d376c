"""Fidelity proof: the native engine and the official TextWorld engine, step by step.

For generated problems of every task type (plus the hand-written heat problem), both engines
play the expert plan and random admissible commands (with occasional invalid ones); the
observation text, the admissible-command set and ``won`` must be identical at every step.
"""
import json
from pathlib import Path

import pytest

pytest.importorskip("textworld")
pytest.importorskip("fast_downward")
pytest.importorskip("alfworld")

from jaxdm.envs.alfworld import TASK_TYPES, expert_plan, generate_task  # noqa: E402
from jaxdm.envs.alfworld.fidelity import FidelityReport, compare_game  # noqa: E402
from jaxdm.envs.alfworld.generator import (game_file_data, grammar_with_task,  # noqa: E402
                                           logic_files)

pytestmark = [pytest.mark.official, pytest.mark.slow]

PROBLEMS_PER_TYPE = 2
REPORT = FidelityReport()


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_same_text_and_commands_as_official(task_type):
    report = FidelityReport()
    for k in range(PROBLEMS_PER_TYPE):
        task = generate_task(k, split="train" if k % 2 == 0 else "valid_unseen",
                             task_types=(task_type,))
        plan = expert_plan(task.game())
        data = game_file_data(task, walkthrough=plan)
        report.merge(compare_game(data, traj_data=task.traj_data, plans=[plan],
                                  random_episodes=1, random_steps=25, seed=k,
                                  where=f"{task_type}/{k}"))
    REPORT.merge(report)
    print(f"\n[alfworld fidelity] {task_type}: {report.summary()}")
    assert report.problems == PROBLEMS_PER_TYPE and report.episodes == 2 * PROBLEMS_PER_TYPE
    assert report.won_episodes >= PROBLEMS_PER_TYPE  # every expert plan wins in both engines
    assert report.steps > 2 * PROBLEMS_PER_TYPE * 3
    assert report.mismatches == [], json.dumps(report.mismatches[:3], indent=1)


def test_handwritten_heat_problem_matches_official():
    problem = (Path(__file__).parent / "alfworld_heat_problem.pddl").read_text()
    domain, _ = logic_files()
    data = {"pddl_domain": domain, "grammar": grammar_with_task("put a hot mug in coffeetable"),
            "pddl_problem": problem}
    plan = ["go to countertop 1", "take mug 1 from countertop 1", "go to coffeetable 1",
            "move mug 1 to coffeetable 1", "look", "take mug 1 from coffeetable 1", "inventory",
            "go to cabinet 1", "open cabinet 1", "examine cabinet 1", "go to microwave 1",
            "examine mug 1", "heat mug 1 with microwave 1", "examine mug 1", "open microwave 1",
            "look", "close microwave 1", "jump", "help", "go to coffeetable 1",
            "move mug 1 to coffeetable 1"]
    report = compare_game(data, plans=[plan], random_episodes=2, random_steps=30, seed=11,
                          where="handwritten heat")
    REPORT.merge(report)
    print(f"\n[alfworld fidelity] handwritten heat: {report.summary()}")
    assert report.steps >= len(plan) and report.won_episodes >= 1
    assert report.mismatches == [], json.dumps(report.mismatches[:3], indent=1)


def test_official_adapter_same_api_and_branching():
    from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams
    from jaxdm.envs.alfworld.official import OfficialAlfWorldEnv

    params = AlfWorldParams(split="valid_unseen", task_types=("pick_and_place_simple",),
                            max_steps=20)
    official, native = OfficialAlfWorldEnv(params), AlfWorldEnv(params)
    obs_o, s_o = official.reset(3)
    obs_n, s_n = native.reset(3)
    assert obs_o == obs_n
    plan = expert_plan(s_n.game)
    mid = None
    for i, cmd in enumerate(plan):
        obs_o, s_o, r_o, d_o, info_o = official.step(0, s_o, cmd)
        obs_n, s_n, r_n, d_n, info_n = native.step(0, s_n, cmd)
        assert obs_o == obs_n and (r_o, d_o) == (r_n, d_n)
        for key in ("admissible_actions", "valid", "won", "milestone", "no_op", "goal",
                    "task_type"):
            assert info_o[key] == info_n[key], key
        if i == 0:
            mid = s_o
    assert info_o["won"] and r_o == 1.0
    # Continue from an older copy: the adapter replays its history in TextWorld.
    obs_b, s_b, _, _, info_b = official.step(0, mid, "inventory")
    assert obs_b == "You are not carrying anything." and s_b.history == (plan[0], "inventory")
    obs_x, _, _, _, info_x = official.step(0, s_b, "dance")
    assert obs_x == "Nothing happens." and info_x["valid"] is False


def test_official_adapter_plays_native_games_and_files(tmp_path):
    from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams, Game, parse_problem
    from jaxdm.envs.alfworld.gamedir import write_game_dir
    from jaxdm.envs.alfworld.official import OfficialAlfWorldEnv

    problem = (Path(__file__).parent / "alfworld_heat_problem.pddl").read_text()
    game = Game(parse_problem(problem), "put a hot mug in coffeetable")
    params = AlfWorldParams(games=(game,))
    obs_o, s_o = OfficialAlfWorldEnv(params).reset(0)
    obs_n, s_n = AlfWorldEnv(params).reset(0)
    assert obs_o == obs_n and sorted(s_o.admissible) == s_n.admissible_actions
    path = write_game_dir(str(tmp_path / "g"), generate_task(1, split="valid_seen"))
    official = OfficialAlfWorldEnv(game_files=(path,))
    native = AlfWorldEnv.from_files([path])
    (obs_o, s_o), (obs_n, s_n) = official.reset(5), native.reset(5)
    assert obs_o == obs_n
    for cmd in json.loads(open(path).read())["walkthrough"]:
        obs_o, s_o, r_o, d_o, _ = official.step(0, s_o, cmd)
        obs_n, s_n, r_n, d_n, _ = native.step(0, s_n, cmd)
        assert (obs_o, r_o, d_o) == (obs_n, r_n, d_n)
    assert d_o and r_o == 1.0


def _as_2_1_1_files(domain: str, grammar: str) -> tuple[str, str]:
    """Undo alfworld's scripts/patch_tw-pddl.py: the older game-file grammar and domain."""
    start = domain.index("(:action help")
    domain = domain[:start] + ")\n"  # help is the domain's last action
    grammar = grammar.replace("move {o} to {r}", "put {o} in/on {r}")
    grammar = grammar.replace("You move the {o.name} to the {r.name}.",
                              "You put the {o.name} in/on the {r.name}.")
    grammar = grammar.replace("You arrive at {r.name}.", "You arrive at {lend.name}.")
    grammar = grammar[:grammar.index("action help {")]
    return domain, grammar


def test_older_game_file_grammar_matches_official():
    """Game files from before the 2.1.2 patch: "put {o} in/on {r}", no help, loc names."""
    problem = (Path(__file__).parent / "alfworld_heat_problem.pddl").read_text()
    domain, grammar = _as_2_1_1_files(*logic_files())
    data = {"pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", "put a hot mug in coffeetable"),
            "pddl_problem": problem}
    plan = ["go to countertop 1", "take mug 1 from countertop 1", "go to microwave 1",
            "heat mug 1 with microwave 1", "help", "go to coffeetable 1",
            "move mug 1 to coffeetable 1", "put mug 1 in/on coffeetable 1"]
    report = compare_game(data, plans=[plan], random_episodes=1, random_steps=20, seed=5,
                          where="handwritten heat, 2.1.1 grammar")
    REPORT.merge(report)
    print(f"\n[alfworld fidelity] 2.1.1 grammar: {report.summary()}")
    assert report.steps >= len(plan) + 1  # the whole plan episode was compared
    assert report.mismatches == [], json.dumps(report.mismatches[:3], indent=1)


def _shared_location_case():
    """A generated game where an object can move between two receptacles at one location."""
    from jaxdm.envs.alfworld import initial_state

    for seed in range(200):
        task = generate_task(seed, split="train")
        g = task.game()
        st = initial_state(g)
        for rs in g.loc_receps.values():
            for r1 in rs:
                for o, rr in sorted(st.in_recep):
                    if rr != r1 or o not in g.pickupable:
                        continue
                    for r2 in rs:
                        if r2 != r1 and any((rt, ot) in g.can_contain for rt in g.recep_types[r2]
                                            for ot in g.obj_types[o]):
                            return task, g, r1, r2, o
    raise AssertionError("no generated game with two receptacles sharing a location")


def test_objects_lying_next_to_receptacles_match_official():
    """The official "look" lists an object taken from one receptacle and put into another at
    the same location as lying "next to it" (its not_inreceptacle fact): same text here."""
    task, g, r1, r2, o = _shared_location_case()
    n = g.names
    plan = ["go to " + n[r1]] + (["open " + n[r1]] if r1 in g.openable else [])
    plan += [f"take {n[o]} from {n[r1]}"] + (["open " + n[r2]] if r2 in g.openable else [])
    plan += [f"move {n[o]} to {n[r2]}", "look", "examine " + n[r1], "examine " + n[r2],
             f"take {n[o]} from {n[r2]}", "look", f"move {n[o]} to {n[r1]}", "look"]
    report = compare_game(game_file_data(task), traj_data=task.traj_data, plans=[plan],
                          where="shared location")
    REPORT.merge(report)
    assert report.steps == len(plan) + 1
    assert report.mismatches == [], json.dumps(report.mismatches[:3], indent=1)


def test_slicing_with_a_held_knife_matches_official():
    from jaxdm.envs.alfworld import initial_state

    case = None
    for seed in range(300):
        task = generate_task(seed, split="train")
        g = task.game()
        where = {o: r for o, r in initial_state(g).in_recep}
        pairs = [(k, f) for k in sorted(g.knives) for f in sorted(g.sliceable)
                 if k in where and f in where and k in g.pickupable
                 and g.recep_locations[where[k]][0] != g.recep_locations[where[f]][0]]
        if pairs:
            case = (task, g, *pairs[0], where)
            break
    task, g, k, f, where = case
    n, rk, rf = g.names, where[k], where[f]
    plan = ["go to " + n[rk]] + (["open " + n[rk]] if rk in g.openable else [])
    plan += [f"take {n[k]} from {n[rk]}", "go to " + n[rf]]
    plan += (["open " + n[rf]] if rf in g.openable else [])
    plan += [f"slice {n[f]} with {n[k]}", f"examine {n[k]}", "look", "inventory"]
    from jaxdm.envs.alfworld import step_state

    state = initial_state(g)
    for cmd in plan:
        state, feedback, notes = step_state(g, state, cmd)
        assert notes["valid"], cmd
    assert f in state.sliced
    report = compare_game(game_file_data(task), traj_data=task.traj_data, plans=[plan],
                          where="slicing")
    REPORT.merge(report)
    assert report.steps == len(plan) + 1
    assert report.mismatches == [], json.dumps(report.mismatches[:3], indent=1)


def test_report_totals():
    """Runs last in this module: the totals compared across all problems above."""
    print(f"\n[alfworld fidelity] TOTAL: {REPORT.summary()}")
    if REPORT.problems:
        assert REPORT.mismatches == []
