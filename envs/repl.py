"""Code-as-action environments over a persistent REPL (AppWorld's interface, our own CodeAct).

The agent's action is Python code; the observation is what the REPL printed. A REPL is a
live, stateful session (a process holding the apps' world), while ``jaxdm.envs.core``
environments are pure. ``ReplSessionEnv`` reconciles the two:

* **The state is the transcript.** ``ReplState`` holds the task seed, every executed code
  action (and whether it took effect) and the last output: immutable, so the pool's parent
  holds the truth and an episode can be copied, replayed and continued.
* **The live session is a cache of the state.** The env keeps the session that produced each
  state it returned (keyed by task seed and action transcript). Stepping a state whose
  session is live executes the code there; otherwise (a replaced worker, a Monte-Carlo
  continuation branching from an earlier state, a state stepped twice) a fresh session is
  opened for the task and the transcript is replayed into it (seed 001, appendix F.1:
  states are reconstructed by replaying the recorded prefix). A replay whose last output
  differs from the recorded one is flagged in ``info["replay_diverged"]``.
* **Reward from the task's own validation**, run once the agent marks the task complete or
  the turn budget is spent (never from the agent's claim): 1.0 when every requirement
  passes, else 0.0; ``info["evaluation"]`` lists the requirements.

A subclass provides ``open_session(seed, params) -> ReplSession`` and ``intro(session)``.
Params must carry ``max_turns`` and ``max_output_chars`` and may carry ``max_live_sessions``.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
from typing import Any, Protocol, Sequence

from jaxdm.envs.core import Environment, seed_of

__all__ = ["ExecResult", "Evaluation", "ReplSession", "ReplState", "ReplSessionEnv",
           "truncate_output"]


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """One executed cell: its output, whether it ran without error, and whether the code
    took effect (False: the session was lost or killed, e.g. the cell timed out, so a replay
    must not run it again)."""

    output: str
    ok: bool
    took_effect: bool = True


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The task's validation: ``requirements`` as (text, passed) pairs; ``won`` = all passed."""

    requirements: tuple[tuple[str, bool], ...]
    report: str = ""

    @property
    def won(self) -> bool:
        """Whether the task passed: it has requirements and every one passed."""
        return bool(self.requirements) and all(p for _, p in self.requirements)


class ReplSession(Protocol):
    """A live REPL over one task's world."""

    def execute(self, code: str) -> ExecResult:
        """Run one code cell in the session: its output, whether it ran cleanly and whether it took
        effect."""

    def completed(self) -> bool:
        """Whether the agent marked the task complete."""

    def evaluate(self) -> Evaluation:
        """The task's evaluation against the session's world now."""

    def close(self) -> None:
        """Release the session (its worker process or sandbox)."""


@dataclasses.dataclass(frozen=True)
class ReplState:
    """A code-as-action episode: the task seed, goal and type, the code run so far with whether each
    took effect (what a replay re-runs), the last observation, the code menu offered, done and won.
    """
    task_seed: int
    goal: str
    task_type: str
    actions: tuple[str, ...] = ()
    took_effect: tuple[bool, ...] = ()
    observation: str = ""
    menu: tuple[str, ...] = ()      # code snippets offered as admissible actions
    done: bool = False
    won: bool = False

    @property
    def steps(self) -> int:
        """How many actions (code cells) were run."""
        return len(self.actions)

    @property
    def key(self) -> tuple:
        """The identity of the live session holding this state (seed, actions, which took effect).
        """
        return (self.task_seed, self.actions, self.took_effect)


def truncate_output(text: str, limit: int) -> str:
    """The REPL output the agent sees: at most ``limit`` characters, the tail kept (errors and
    the latest prints are at the end)."""
    if limit < 1:
        raise ValueError(f"max_output_chars must be >= 1, got {limit}")
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


class ReplSessionEnv(Environment[ReplState, Any]):
    """Base of code-as-action environments (see module docstring)."""

    def __init__(self):
        self._live: "collections.OrderedDict[tuple, ReplSession]" = collections.OrderedDict()
        self.num_replays = 0  # sessions rebuilt by replaying a transcript

    # ---- subclass hooks ---------------------------------------------------------------------
    @abc.abstractmethod
    def open_session(self, seed: int, params: Any) -> ReplSession:
        """A fresh session of task ``seed`` (the world at the task's start)."""

    @abc.abstractmethod
    def intro(self, session: ReplSession, params: Any) -> tuple[str, str, str, Sequence[str]]:
        """(goal, task type, first observation, code menu) of a fresh session."""

    # ---- contract ---------------------------------------------------------------------------
    def reset_env(self, key: Any, params: Any):
        """A fresh session of task ``key``'s seed; (its first observation, the state with goal, task
        type and code menu)."""
        seed = seed_of(key)
        session = self.open_session(seed, params)
        goal, task_type, obs, menu = self.intro(session, params)
        state = ReplState(task_seed=seed, goal=goal, task_type=task_type, observation=obs,
                          menu=tuple(menu))
        self._keep(state, session, params)
        return obs, state

    def reset_info(self, state: ReplState, params: Any = None) -> dict[str, Any]:
        """The reset info: goal, task type, max_turns as the budget, the code menu as admissible
        actions, env name."""
        params = self.default_params if params is None else params
        return {"goal": state.goal, "task_type": state.task_type, "budget": params.max_turns,
                "admissible_actions": list(state.menu), "env": self.name}

    def step_env(self, key: Any, state: ReplState, action: Any, params: Any):
        """Run one code cell in the state's session (rebuilt by replaying the transcript when it is
        not live): its output (cut to max_output_chars) as the observation, reward 1 when the task's
        evaluation passes on completion; a finished episode or a non-string action is an error."""
        del key  # the world is deterministic given the task seed and the code
        if state.done:
            raise ValueError(f"step called on a finished {self.name} episode; reset first")
        if not isinstance(action, str):
            raise TypeError(f"{self.name} action must be Python code (str), got "
                            f"{type(action).__name__}")
        session, diverged = self._take(state, params)
        result = session.execute(action)
        obs = truncate_output(result.output, params.max_output_chars)
        new = dataclasses.replace(state, actions=state.actions + (action,),
                                  took_effect=state.took_effect + (result.took_effect,),
                                  observation=obs)
        info: dict[str, Any] = {"admissible_actions": list(state.menu), "valid": result.ok,
                                "milestone": False, "no_op": False, "won": False,
                                "replay_diverged": diverged}
        reward = 0.0
        completed = session.completed()
        if completed or new.steps >= params.max_turns:
            evaluation = session.evaluate()
            session.close()
            reward = 1.0 if evaluation.won else 0.0
            new = dataclasses.replace(new, done=True, won=evaluation.won)
            info.update(won=evaluation.won, truncated=not completed,
                        evaluation=[{"requirement": r, "passed": p}
                                    for r, p in evaluation.requirements])
        else:
            self._keep(new, session, params)
        return obs, new, reward, new.done, info

    def close(self) -> None:
        """Close every live session."""
        while self._live:
            _, session = self._live.popitem()
            session.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- the session cache -------------------------------------------------------------------
    def _keep(self, state: ReplState, session: ReplSession, params: Any) -> None:
        self._live[state.key] = session
        limit = getattr(params, "max_live_sessions", 64)
        while len(self._live) > limit:
            _, old = self._live.popitem(last=False)
            old.close()

    def _take(self, state: ReplState, params: Any) -> tuple[ReplSession, bool]:
        """The live session of ``state`` (removed from the cache: stepping moves it on), or a
        fresh one with the transcript replayed; (session, replay diverged)."""
        session = self._live.pop(state.key, None)
        if session is not None:
            return session, False
        self.num_replays += 1
        session = self.open_session(state.task_seed, params)
        self.intro(session, params)
        last = None
        for code, took_effect in zip(state.actions, state.took_effect):
            if took_effect:
                last = session.execute(code)
        diverged = False
        if state.actions and state.took_effect[-1] and last is not None:
            diverged = truncate_output(last.output, params.max_output_chars) != state.observation
        return session, diverged
