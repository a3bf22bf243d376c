"""AGENT DECISION BENCH L2: recorded DECISION GYM states, scored without execution.

States come from scripted-agent runs (``NoisyAgent``: the expert with realistic errors at a
per-step rate) on the test split, so they include states after the agent's own errors. The
seed's data has 30.9 % of its states after an error; ``after_error_share`` (default 0.309)
sets that share here: from the recorded pool the states are drawn (seeded) so that the share
is met as closely as the pool allows, and the realised share is reported.

Every state contributes its questions (``envs.decision_gym.state_questions``): the tool
choice over 69 shuffled tools (``must_ask`` marks states whose only right move is to ask the
customer), one question per bounded / copyable parameter of each keyed tool, and stop. Keys
travel in ``meta`` (``answer``), never in the text.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any

from jaxdm.decision.types import MultipleChoice
from jaxdm.envs.decision_gym import DecisionGym, GymParams, NoisyAgent, run_episode, split_seed

AFTER_ERROR_SHARE = 0.309


@dataclasses.dataclass(frozen=True)
class L2Config:
    """Settings of bench level L2: DECISION GYM tasks of one variant and split, the noisy scripted
    agent's error rate, the share of recorded states that follow an agent error (None: as they
    come), an optional cap on states, the seed. Rates outside [0, 1] or tasks < 1 are ValueErrors.
    """
    tasks: int = 20
    variant: str = "base"
    split: str = "test"
    agent_error_rate: float = 0.25
    after_error_share: float | None = AFTER_ERROR_SHARE
    max_states: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.tasks < 1:
            raise ValueError(f"L2 tasks must be >= 1, got {self.tasks}")
        for name in ("agent_error_rate", "after_error_share"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"L2 {name} must be in [0, 1], got {v}")


def _pick(states: list, share: float | None, limit: int | None, seed: int) -> list:
    """A seeded draw of states whose after-error share is ``share`` (as close as possible)."""
    rng = random.Random(f"l2-pick/{seed}")
    after = [s for s in states if s.after_error]
    before = [s for s in states if not s.after_error]
    n = len(states) if limit is None else min(limit, len(states))
    if share is None:
        return rng.sample(states, n) if n < len(states) else list(states)
    # Largest n' <= n with round(share * n') after-error and the rest clean states available.
    while n > 0:
        k = round(share * n)
        if k <= len(after) and n - k <= len(before):
            break
        n -= 1
    k = round(share * n)
    chosen = rng.sample(after, k) + rng.sample(before, n - k)
    return sorted(chosen, key=lambda s: (s.task_id, s.step))


def build_l2(cfg: L2Config = L2Config()) -> tuple[list[MultipleChoice], dict[str, Any]]:
    """L2 questions (meta: kind, answer, after_error, must_ask, task_id, step) and stats."""
    env = DecisionGym()
    params = GymParams(variant=cfg.variant, strict=True, split=cfg.split)
    agent = NoisyAgent(error_rate=cfg.agent_error_rate, seed=cfg.seed)
    pool, successes = [], 0
    for i in range(cfg.tasks):
        traj, records = run_episode(env, agent, split_seed(cfg.split, i), params)
        successes += bool(traj.success)
        pool.extend(records)
    states = _pick(pool, cfg.after_error_share, cfg.max_states, cfg.seed)
    questions = []
    for s in states:
        for q in s.questions:
            meta = dict(q.meta) | {"after_error": s.after_error,
                                   "must_ask": bool(s.questions[0].meta.get("must_ask")),
                                   "state": f"{s.task_id}/{s.step}"}
            questions.append(dataclasses.replace(q, meta=meta))
    stats = {"tasks": cfg.tasks, "variant": cfg.variant, "split": cfg.split,
             "agent_error_rate": cfg.agent_error_rate, "agent_success_rate": successes / cfg.tasks,
             "pool_states": len(pool),
             "pool_after_error_share": (sum(s.after_error for s in pool) / len(pool)
                                        if pool else None),
             "states": len(states),
             "after_error_share": (sum(s.after_error for s in states) / len(states)
                                   if states else None),
             "must_ask_states": sum(bool(s.questions[0].meta.get("must_ask")) for s in states),
             "questions": len(questions)}
    for kind in ("tool", "param", "stop"):
        stats[f"questions/{kind}"] = sum(q.meta["kind"] == kind for q in questions)
    return questions, stats
