"""Group context for LVRL value queries: a per-step action→result summary of every rollout
of a task group, with its outcome (seed 001 §3.2, Appendix C "per_step" mode).

Two summarisers, registered in ``SUMMARISERS`` (config names):

- ``"deterministic"``: from the recorded env transitions only: per step the action, whether
  it was valid, the env's annotation (milestone / no effect) and a short digest of the
  observation that followed (its first sentence, at most ``digest_chars`` characters). No
  model call, no cost.
- ``"llm"``: the paper's separate per-step summarisation call, one generation per rollout
  through any ``TextGenerator`` (a local jaxdm model or an OpenAI-compatible endpoint,
  ``jaxdm.rl.values.generation``), asked for a JSON list of one short result per step. Its
  cost is counted; a reply that is not such a list is a counted failure and that rollout
  keeps its deterministic summary (never a crash).

``render_group_context`` lays the summaries out for one target trajectory. Whether the target
itself is shown is ``include_target`` (default False: the value model sees the *other*
rollouts of the task, as in the seed; showing the target's own outcome would let it copy the
outcome into every interior value, which is what GRPO already does).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence

from jaxdm.decision.types import Cost
from jaxdm.registry import Registry
from jaxdm.rl.values import prompts
from jaxdm.trajectory import Trajectory

__all__ = ["StepSummary", "RolloutSummary", "observation_digest", "summarize_deterministic",
           "summarize_llm", "SUMMARISERS", "render_group_context", "summarize_group"]


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """One earlier step as a value prompt shows it: the action taken and what it returned."""
    action: str
    result: str


@dataclasses.dataclass(frozen=True)
class RolloutSummary:
    """One rollout's per-step summaries and outcome."""

    steps: tuple[StepSummary, ...]
    success: bool
    reward: float
    source: str = "deterministic"  # or "llm"


def observation_digest(text: str, max_chars: int = 80) -> str:
    """The first sentence of ``text``, whitespace collapsed, cut to ``max_chars``."""
    flat = " ".join(str(text).split())
    m = re.match(r"(.+?[.!?])(\s|$)", flat)
    first = m.group(1) if m else flat
    return first if len(first) <= max_chars else first[:max_chars - 3].rstrip() + "..."


def _deterministic_result(traj: Trajectory, t: int, digest_chars: int) -> str:
    step = traj.steps[t]
    tags = []
    if not step.valid:
        tags.append("invalid")
    if step.annotations.get("milestone"):
        tags.append("progress")
    elif step.annotations.get("no_op"):
        tags.append("no effect")
    digest = observation_digest(traj.feedback(t), digest_chars)
    return (f"[{', '.join(tags)}] " if tags else "") + digest


def summarize_deterministic(traj: Trajectory, *, digest_chars: int = 80) -> RolloutSummary:
    """Per-step summary from the env transitions (see module docstring)."""
    steps = tuple(StepSummary(s.action, _deterministic_result(traj, t, digest_chars))
                  for t, s in enumerate(traj.steps))
    return RolloutSummary(steps, bool(traj.success), float(traj.reward), "deterministic")


def _summary_messages(traj: Trajectory, digest_chars: int) -> list[dict]:
    lines = [f"{t}. {observation_digest(s.observation, digest_chars)} | {s.action} | "
             f"{observation_digest(traj.feedback(t), digest_chars)}"
             for t, s in enumerate(traj.steps)]
    text = prompts.SUMMARY_QUESTION.format(goal=traj.goal, lines="\n".join(lines),
                                           n=len(traj.steps))
    return [{"role": "system", "content": prompts.SUMMARY_SYSTEM},
            {"role": "user", "content": text}]


def parse_string_list(text: str, n: int) -> list[str]:
    """A JSON list of exactly ``n`` non-empty strings (a ```json fence allowed), else
    ValueError saying what is wrong."""
    data = prompts.load_json_list(text, n, "entries")
    for i, s in enumerate(data):
        if not isinstance(s, str) or not s.strip():
            raise ValueError(f"entry {i} is not a non-empty string: {s!r}")
    return [" ".join(s.split()) for s in data]


def summarize_llm(trajs: Sequence[Trajectory], generator, *, digest_chars: int = 80,
                  stats: dict | None = None) -> tuple[list[RolloutSummary], Cost]:
    """One summarisation call per rollout (all sent as one batch to ``generator``).

    Returns the summaries and their total cost. A failed generation or a reply that is not a
    JSON list of one string per step is counted in ``stats["summary_failures"]`` (reason in
    ``stats["summary_errors"]``) and that rollout keeps its deterministic summary.
    """
    stats = {} if stats is None else stats
    todo = [i for i, tr in enumerate(trajs) if tr.steps]
    gens = generator.generate([_summary_messages(trajs[i], digest_chars) for i in todo]) \
        if todo else []
    out = [summarize_deterministic(tr, digest_chars=digest_chars) for tr in trajs]
    total = Cost()
    for i, gen in zip(todo, gens):
        total = total + gen.cost
        stats["summary_calls"] = stats.get("summary_calls", 0) + 1
        try:
            if not gen.ok:
                raise ValueError(gen.error or "generation failed")
            results = parse_string_list(gen.text, len(trajs[i].steps))
        except ValueError as e:
            stats["summary_failures"] = stats.get("summary_failures", 0) + 1
            stats.setdefault("summary_errors", []).append(f"rollout {i}: {e}")
            continue
        out[i] = RolloutSummary(tuple(StepSummary(s.action, r)
                                      for s, r in zip(trajs[i].steps, results)),
                                bool(trajs[i].success), float(trajs[i].reward), "llm")
    return out, total


# name -> summariser(trajs, generator, **kw) -> (summaries, cost)
SUMMARISERS: Registry[Callable] = Registry("summariser")
SUMMARISERS.register("deterministic", lambda trajs, generator=None, **kw: (
    [summarize_deterministic(t, **kw) for t in trajs], Cost()))
SUMMARISERS.register("llm", lambda trajs, generator=None, **kw: summarize_llm(
    trajs, _need(generator), **kw))


def _need(generator):
    if generator is None:
        raise ValueError("summariser 'llm' needs a text generator (summary_generator)")
    return generator


def summarize_group(trajs: Sequence[Trajectory], summariser: str = "deterministic",
                    generator=None, **kwargs) -> tuple[list[RolloutSummary], Cost]:
    """Summaries of every rollout by the registered ``summariser`` (unknown name: error)."""
    return SUMMARISERS.get(summariser)(trajs, generator, **kwargs)


def _attempt_lines(name: str, summary: RolloutSummary, max_steps: int) -> list[str]:
    outcome = "succeeded" if summary.success else "failed"
    lines = [prompts.ATTEMPT_HEADER.format(name=name, outcome=outcome, n=len(summary.steps))]
    steps = list(enumerate(summary.steps))
    if max_steps and len(steps) > max_steps:
        head, tail = max_steps // 2, max_steps - max_steps // 2
        shown = steps[:head] + [None] + steps[len(steps) - tail:]
    else:
        shown = steps
    for item in shown:
        if item is None:
            lines.append(prompts.OMITTED.format(n=len(steps) - max_steps))
        else:
            t, s = item
            lines.append(f"  {t}. {s.action} -> {s.result}")
    return lines


def render_group_context(summaries: Sequence[RolloutSummary], target: int | None, *,
                         include_target: bool = False, max_steps_per_rollout: int = 0,
                         max_rollouts: int = 0) -> str:
    """The group-context text for target rollout ``target`` (an index into ``summaries``).

    ``include_target`` False leaves the target's own summary out. ``max_steps_per_rollout``
    (0: all) keeps the first and last steps of long rollouts; ``max_rollouts`` (0: all) keeps
    the first ones in order (attempt names stay their group positions: A, B, ...).
    """
    shown = [i for i in range(len(summaries)) if include_target or i != target]
    if max_rollouts:
        shown = shown[:max_rollouts]
    if not shown:
        return prompts.NO_OTHER_ATTEMPTS
    lines = [prompts.GROUP_HEADER]
    for i in shown:
        lines += _attempt_lines(_name(i), summaries[i], max_steps_per_rollout)
    return "\n".join(lines)


def _name(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"#{i + 1}"
