"""Step-by-step comparison of the native engine with the official TextWorld engine.

``compare_game`` plays one game in both engines with the same commands — a given command list
(e.g. the expert plan) and/or random admissible commands with an occasional invalid one — and
checks at every step (the intro included) that the observation text, the admissible-command
set and ``won`` are identical. Used by the fidelity test and the benchmark.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Mapping, Sequence

from jaxdm.envs.alfworld.engine import initial_state, step_state
from jaxdm.envs.alfworld.gamefile import load_game_data

INVALID_PROBES = ("jump", "take everything", "go to the moon", "open sesame")


@dataclasses.dataclass
class FidelityReport:
    """Counts of what was compared, and the first mismatches (empty when faithful)."""

    problems: int = 0
    episodes: int = 0
    steps: int = 0
    won_episodes: int = 0  # episodes that ended won in both engines
    mismatches: list = dataclasses.field(default_factory=list)

    def merge(self, other: "FidelityReport") -> "FidelityReport":
        """Add ``other``'s counts and mismatches into this report; returns it."""
        self.problems += other.problems
        self.episodes += other.episodes
        self.steps += other.steps
        self.won_episodes += other.won_episodes
        self.mismatches.extend(other.mismatches)
        return self

    def summary(self) -> str:
        """One line: problems, episodes (won), steps compared and mismatches between the native and
        the official engine."""
        return (f"{self.problems} problems, {self.episodes} episodes ({self.won_episodes} won), "
                f"{self.steps} steps compared, {len(self.mismatches)} mismatches")


def _compare(where, t, cmd, ours_obs, ours_adm, ours_won, off_obs, off_adm, off_won):
    out = []
    if ours_obs != off_obs:
        out.append({"where": where, "step": t, "command": cmd, "field": "observation",
                    "native": ours_obs, "official": off_obs})
    if sorted(ours_adm) != sorted(off_adm):
        out.append({"where": where, "step": t, "command": cmd, "field": "admissible",
                    "native_only": sorted(set(ours_adm) - set(off_adm)),
                    "official_only": sorted(set(off_adm) - set(ours_adm))})
    if bool(ours_won) != bool(off_won):
        out.append({"where": where, "step": t, "command": cmd, "field": "won",
                    "native": ours_won, "official": off_won})
    return out


def compare_game(data: Mapping, *, traj_data: Mapping | None = None,
                 plans: Sequence[Sequence[str]] = (), random_episodes: int = 0,
                 random_steps: int = 30, invalid_prob: float = 0.1, goto_prob: float = 0.35,
                 seed: int = 0,
                 where: str = "game") -> FidelityReport:
    """Play ``data`` (a game.tw-pddl dict) in both engines; see the module docstring."""
    from jaxdm.envs.alfworld.official import OfficialGame

    game = load_game_data(dict(data), where=where, traj_data=dict(traj_data) if traj_data else None)
    official = OfficialGame(data, where=where)
    report = FidelityReport(problems=1)
    rng = random.Random(seed)
    episodes = [("plan", list(p)) for p in plans] + [("random", None)] * random_episodes
    for kind, plan in episodes:
        report.episodes += 1
        gs = official.reset()
        state = initial_state(game)
        report.steps += 1
        bad = _compare(where, 0, "<intro>", state.last_observation, state.admissible_actions,
                       state.won, gs.feedback, gs["admissible_commands"], gs["won"])
        n = len(plan) if plan is not None else random_steps
        for t in range(n):
            if bad:
                break
            if plan is not None:
                cmd = plan[t]
            elif rng.random() < invalid_prob:
                cmd = rng.choice(INVALID_PROBES)
            else:
                # Favour interactions over navigation so that taking, placing, opening and
                # state changes are exercised, not only "go to".
                adm = sorted(gs["admissible_commands"])
                local = [c for c in adm if not c.startswith("go to ")]
                pool = adm if (not local or rng.random() < goto_prob) else local
                cmd = rng.choice(pool)
            gs, _, done = official.step(cmd)
            state, feedback, _ = step_state(game, state, cmd)
            report.steps += 1
            bad = _compare(where, t + 1, cmd, feedback, state.admissible_actions, state.won,
                           gs.feedback, gs["admissible_commands"], gs["won"])
            if done or state.won:
                break
        if not bad and state.won and gs["won"]:
            report.won_episodes += 1
        report.mismatches.extend(bad)
    return report


__all__ = ["FidelityReport", "compare_game"]
