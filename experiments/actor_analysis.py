"""Actor analyses of seed 000 (section 3.1) on ALFWorld diagnostic states.

Diagnostic state: the agent stands at the destination holding the target object, which still
needs to be cleaned / heated / cooled: placing it now satisfies the easier subgoal and fails the
task, while the prerequisite needs a trip to the sink / microwave / fridge first.

(a) Goal masking (Figure 3a): the Actor is queried at each state with the full goal and with the
    goal without its placement subgoal; the probability mass on actions toward the
    prerequisite, on the placement action, and on the rest is averaged over states.
(b) Prompt variants (Figure 3b): from each state the decision model acts (argmax choice) until
    the task is won or the budget runs out, with the original question, the dependency hint,
    and hint + ordering example applied at every step; success rates are reported.

Usage:
  python experiments/actor_analysis.py [--judge smollm2|oracle|kind:key=val,...] [--states 12]
         [--budget 30] [--out actor_out] [--quick]
Writes actor_analysis.json, actor_analysis.md, goal_masking.png and prompt_variants.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from jaxdm.envs.alfworld import (TASK_TYPES, Game, generate_game, initial_state, plan_from,
                                 step_state)
from jaxdm.jsonl import write_atomic, write_json
from jaxdm.roles import actor_request, mask_placement_subgoal
from jaxdm.trajectory import Step

DEPENDENCY_TYPES = tuple(t for t in TASK_TYPES if t.startswith(("pick_clean", "pick_heat", "pick_cool")))
_STATIONS = {"pick_clean_then_place_in_recep": "sinks", "pick_heat_then_place_in_recep": "microwaves",
             "pick_cool_then_place_in_recep": "fridges"}
VARIANTS = ("original", "hint", "hint_example")
OUTPUTS = ("actor_analysis.json", "actor_analysis.md", "goal_masking.png", "prompt_variants.png")


@dataclasses.dataclass
class DiagnosticState:
    game: Game
    state: object
    history: list            # Steps before the state
    observation: str
    target: str              # object id held
    dest: str                # goal receptacle id
    t: int                   # actions taken so far


def _run(game, state, cmds, history, obs):
    for c in cmds:
        new, feedback, notes = step_state(game, state, c)
        if not notes["valid"]:
            raise RuntimeError(f"{game.where}: command {c!r} not admissible while building a diagnostic state")
        history.append(Step(obs, c, True, {"milestone": notes["milestone"], "no_op": notes["no_op"]}))
        state, obs = new, feedback
    return state, obs


def diagnostic_states(n: int, *, seed: int = 0, split: str = "valid_seen") -> list[DiagnosticState]:
    """n states: take the target as the expert would, then go straight to the destination."""
    out = []
    s = seed
    while len(out) < n:
        game = generate_game(s, split=split, task_types=DEPENDENCY_TYPES)
        s += 1
        state = initial_state(game)
        history: list[Step] = []
        obs = state.last_observation
        plan = plan_from(game, state)
        take = next(i for i, c in enumerate(plan) if c.startswith("take "))
        state, obs = _run(game, state, plan[:take + 1], history, obs)
        targets = [o for o in state.held if o in game.objects_of_type(game.task.object_type)]
        dest = sorted(game.receptacles_of_type(game.task.recep_type))[0]
        go = f"go to {game.names[dest]}"
        if go in state.command_map():
            state, obs = _run(game, state, [go], history, obs)
        opener = f"open {game.names[dest]}"
        if opener in state.command_map():
            state, obs = _run(game, state, [opener], history, obs)
        if not targets or state.won:
            continue
        out.append(DiagnosticState(game, state, history, obs, targets[0], dest, len(history)))
    return out


def _expert_next(game, state) -> str | None:
    """The expert's next command (only for the Oracle, via meta; never shown to a model)."""
    try:
        plan = plan_from(game, state)
    except RuntimeError:
        return None
    return plan[0] if plan and plan[0] in state.command_map() else None


def categorize(ds: DiagnosticState, options) -> list[str]:
    """'prerequisite' (toward the sink/microwave/fridge or the state change itself),
    'placement' (putting the held target into the destination) or 'other' per option."""
    g = ds.game
    stations = {g.names[r] for r in getattr(g, _STATIONS[g.task.task_type])}
    obj, dest = g.names[ds.target], g.names[ds.dest]
    cats = []
    for a in options:
        if (a.startswith(("move ", "put ")) and a.split(" ", 1)[1].startswith(obj + " ")
                and a.endswith(" " + dest)):
            cats.append("placement")
        elif any(a == f"go to {s}" or a.endswith(f" with {s}") for s in stations):
            cats.append("prerequisite")
        else:
            cats.append("other")
    return cats


def goal_masking(backend, states, budget: int) -> dict:
    """Mean probability per category under the full and the masked goal (Figure 3a)."""
    reqs, cats = [], []
    for ds in states:
        opts = ds.state.admissible_actions
        c = categorize(ds, opts)
        if "placement" not in c or "prerequisite" not in c:
            raise RuntimeError(f"{ds.game.where}: diagnostic state lacks a placement or prerequisite action")
        goal = ds.game.goal_description
        for variant in ("original", "goal_masked"):
            reqs.append(actor_request(goal, ds.history, ds.observation, opts, budget - ds.t, variant=variant,
                                      masked_goal=mask_placement_subgoal(goal),
                                      oracle_answer=_expert_next(ds.game, ds.state)))
            cats.append(c)
    results = backend.choose(reqs)
    out = {"full": [], "masked": []}
    failed = 0
    for i, (r, c) in enumerate(zip(results, cats)):
        if not r.ok:
            failed += 1
            continue
        p = np.asarray(r.probs)
        mass = {k: float(p[[j for j, x in enumerate(c) if x == k]].sum()) for k in ("prerequisite", "placement", "other")}
        out["full" if i % 2 == 0 else "masked"].append(mass)
    summary = {g: {k: float(np.mean([m[k] for m in v])) if v else float("nan")
                   for k in ("prerequisite", "placement", "other")} for g, v in out.items()}
    summary["n_states"] = len(states)
    summary["failed_queries"] = failed
    return summary


def continuations(backend, states, budget: int, variant: str) -> dict:
    """Let the decision model act from every state (batched per step); success rate."""
    live = [dict(ds=ds, state=ds.state, history=list(ds.history), obs=ds.observation, t=ds.t) for ds in states]
    won = [False] * len(states)
    failed = 0
    while True:
        active = [i for i, e in enumerate(live) if not won[i] and e["t"] < budget]
        if not active:
            break
        reqs = []
        for i in active:
            e = live[i]
            reqs.append(actor_request(e["ds"].game.goal_description, e["history"], e["obs"],
                                      e["state"].admissible_actions, budget - e["t"], variant=variant,
                                      oracle_answer=_expert_next(e["ds"].game, e["state"])))
        for i, q, r in zip(active, reqs, backend.choose(reqs)):
            e = live[i]
            if not r.ok:  # no answer: the episode cannot continue (counted, never guessed)
                failed += 1
                e["t"] = budget
                continue
            action = q.options[r.choice]
            new, feedback, notes = step_state(e["ds"].game, e["state"], action)
            e["history"].append(Step(e["obs"], action, notes["valid"]))
            e["state"], e["obs"], e["t"] = new, feedback, e["t"] + 1
            won[i] = bool(new.won)
    return {"success": float(np.mean(won)), "n": len(states), "failed_queries": failed}


def _plots(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    cats = ("prerequisite", "placement", "other")
    for k, g in enumerate(("full", "masked")):
        ax.bar(np.arange(3) + 0.38 * k, [res["goal_masking"][g][c] for c in cats], 0.38,
               label="full goal" if g == "full" else "goal without placement")
    ax.set_xticks(np.arange(3) + 0.19, ["toward prerequisite", "placement", "other"])
    ax.set_ylabel("mean probability")
    ax.set_title(f"Actor at {res['goal_masking']['n_states']} diagnostic states ({res['judge']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "goal_masking.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.bar(range(len(VARIANTS)), [100 * res["variants"][v]["success"] for v in VARIANTS])
    ax.set_xticks(range(len(VARIANTS)), ["original", "+ hint", "+ hint + example"])
    ax.set_ylabel("success (%)")
    ax.set_title("Continuations from diagnostic states")
    fig.tight_layout()
    fig.savefig(out / "prompt_variants.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", default="local_likelihood:path=smollm2,name=smollm2-likelihood",
                    help="decision model spec (as for `jaxdm screen --judge`); the default scores the "
                         "options by likelihood because ALFWorld states offer more than 26 commands")
    ap.add_argument("--states", type=int, default=12)
    ap.add_argument("--budget", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="actor_out")
    ap.add_argument("--quick", action="store_true", help="4 states, budget 14")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the results already in --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    from jaxdm.rundir import refuse_overwrite
    try:   # before minutes of scoring, not after
        refuse_overwrite([out / f for f in OUTPUTS], overwrite=args.overwrite)
    except FileExistsError as e:
        print(f"actor_analysis: error: {e}", file=sys.stderr)
        return 2
    if args.quick:
        args.states, args.budget = 4, 14
    from jaxdm.screen.run import ScreenError, build_judges

    try:
        [(name, backend)] = build_judges([args.judge])
    except ScreenError as e:
        print(f"actor_analysis: error: {e}", file=sys.stderr)
        return 2
    states = diagnostic_states(args.states, seed=args.seed)
    res = {"judge": name, "budget": args.budget, "goal_masking": goal_masking(backend, states, args.budget),
           "variants": {v: continuations(backend, states, args.budget, v) for v in VARIANTS}}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "actor_analysis.json", res, indent=1)
    gm = res["goal_masking"]
    md = [f"# Actor analysis ({name}, {len(states)} diagnostic states, budget {args.budget})", "",
          "| goal | toward prerequisite | placement | other |", "|---|---|---|---|"]
    for g in ("full", "masked"):
        md.append(f"| {g} | {gm[g]['prerequisite']:.3f} | {gm[g]['placement']:.3f} | {gm[g]['other']:.3f} |")
    md += ["", "| prompt | success |", "|---|---|"]
    md += [f"| {v} | {100 * res['variants'][v]['success']:.1f} % |" for v in VARIANTS]
    write_atomic(out / "actor_analysis.md", "\n".join(md) + "\n")
    _plots(res, out)
    print("\n".join(md))
    print(f"\nwritten to {out.resolve()}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
