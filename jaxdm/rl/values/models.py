"""LVRL value models: the values of every interior state s_1..s_{T−1} of a target trajectory,
conditioned on its group context and the trajectory up to that state (seed 001 §3.2).

One ``values(queries)`` call takes one ``ValueQuery`` per target trajectory and returns one
``ValueResult`` each: ``values`` [T − 1] in [0, 1] (interior states only; the two ends are
anchored by the estimator), or ``ok`` False with the reason. Never raises for a bad model
answer: a failed trajectory falls back to its GRPO advantage upstream. The config names
(``value.kind``, registered in ``jaxdm.rl.values.trainer_signal.VALUE_MODELS``):

- ``"readout"`` (``ReadoutValueModel``): a YesNo "will the task be completed from state t?"
  per interior state through any decision backend. With ``LocalReadout`` the T − 1 questions
  of a trajectory share their leading tokens (prompts' token-prefix property), so they are
  scored in one packed pass (trunk = group context + trajectory; each question sees its own
  prefix). Any failed question fails the trajectory.
- ``"list"`` (``ListValueModel``): the paper's way, one generation per trajectory through a
  ``TextGenerator`` returning a JSON list of T − 1 values; parsed strictly (a JSON list of
  exactly T − 1 finite numbers in [0, 1], optionally in a ```json fence): anything else is a
  counted failure.
- ``"oracle"`` (``OracleValueModel``): the env's own estimate (``ORACLE_VALUES``: BabyAI from
  the solver's plan length and the steps left, ALFWorld from the expert's remaining plan),
  plus seeded Gaussian ``noise`` (clipped to [0, 1]) like the noisy ``Oracle`` judge, and a
  systematic ``drift``: state t's value lowered by drift · t (clipped), the downward drift
  with the step index that SmolLM2's values showed.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxdm.decision.types import Cost, YesNo
from jaxdm.envs.alfworld.value import trajectory_oracle_values as alfworld_oracle_values
from jaxdm.envs.babyai.text import make_text_env
from jaxdm.envs.babyai.value import trajectory_oracle_values
from jaxdm.registry import Registry
from jaxdm.rl.values import prompts
from jaxdm.trajectory import Trajectory

__all__ = ["ValueQuery", "ValueResult", "state_context", "state_question", "value_requests",
           "list_messages",
           "parse_value_list", "ReadoutValueModel", "ListValueModel", "OracleValueModel",
           "ORACLE_VALUES", "wrapped_name"]


@dataclasses.dataclass(frozen=True)
class ValueQuery:
    """Values wanted for the interior states of ``trajectory``; ``ident`` seeds noise."""

    trajectory: Trajectory
    group_context: str
    ident: Any = None


@dataclasses.dataclass(frozen=True)
class ValueResult:
    """A value model's answer for one trajectory: values float32 [T - 1] of the interior states
    1..T-1 (None when it failed), ok, the error, the cost and the raw reply."""
    values: np.ndarray | None  # float32 [T - 1], states 1..T-1
    ok: bool = True
    error: str | None = None
    cost: Cost = Cost()
    raw: str | None = None


def _failed(error: str, cost: Cost = Cost(), raw: str | None = None) -> ValueResult:
    return ValueResult(None, False, error, cost, raw)


# ---- prompts ------------------------------------------------------------------------------
def _head(traj: Trajectory, group_context: str) -> list[str]:
    return [prompts.VALUE_INSTRUCTIONS, f"Goal: {traj.goal}", group_context,
            prompts.CURRENT_HEADER]


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def state_context(traj: Trajectory, group_context: str, t: int) -> str:
    """Context of interior state t: instructions, goal, group context, states 0..t with the
    actions between them. A character prefix of every later state's context."""
    lines = _head(traj, group_context)
    for k in range(t):
        lines += [f"State {k}: {_flat(traj.steps[k].observation)}",
                  f"Action {k}: {_flat(traj.steps[k].action)}"]
    obs = traj.steps[t].observation if t < len(traj.steps) else traj.final_observation
    lines.append(f"State {t}: {_flat(obs)}")
    return "\n".join(lines)


def state_question(traj: Trajectory, t: int) -> str:
    """The value question asked at state ``t`` of ``traj`` (VALUE_QUESTION with the step and the
    steps left of its budget)."""
    return prompts.VALUE_QUESTION.format(t=t, left=traj.budget - t)


def list_messages(traj: Trajectory, group_context: str) -> list[dict]:
    """One chat prompt for all interior values of ``traj`` (the ``"list"`` model)."""
    n = len(traj.steps)
    text = state_context(traj, group_context, n)
    question = prompts.LIST_QUESTION.format(last=n - 1, budget=traj.budget, n=n - 1)
    return [{"role": "system", "content": prompts.LIST_SYSTEM},
            {"role": "user", "content": f"{text}\n\n{question}"}]


def parse_value_list(text: str, n: int) -> np.ndarray:
    """A JSON list of exactly ``n`` finite numbers in [0, 1] (a ```json fence allowed);
    anything else raises ValueError saying what is wrong."""
    data = prompts.load_json_list(text, n, "values")
    for i, v in enumerate(data):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"value {i} is not a number: {v!r}")
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ValueError(f"value {i} = {v!r} is not a finite number in [0, 1]")
    return np.asarray(data, np.float32)


def value_requests(q: ValueQuery) -> list[YesNo]:
    """The Yes/No question of every interior state of ``q.trajectory`` (states 1..T-1), each
    over its own prefix context: what a readout value model is asked, and what a value model
    is trained on (``jaxdm.train.value_data``)."""
    traj = q.trajectory
    return [YesNo(context=state_context(traj, q.group_context, t),
                  question=state_question(traj, t),
                  meta={"role": "lvrl_value", "state": t, "ident": q.ident})
            for t in range(1, len(traj.steps))]


def wrapped_name(kind: str, inner: Any, role: str, method: str, what: str) -> str:
    """The display name ``kind(inner's name)`` of a value model built around ``inner``;
    ``inner`` without ``.method`` is a TypeError saying that ``role`` must be ``what``."""
    if not hasattr(inner, method):
        raise TypeError(f"{role} must be {what} with .{method}, got {type(inner).__name__}")
    return f"{kind}({getattr(inner, 'name', type(inner).__name__)})"


# ---- models ------------------------------------------------------------------------------
class ReadoutValueModel:
    """YesNo per interior state through a decision backend (see module docstring)."""

    def __init__(self, backend: Any):
        self.name = wrapped_name("readout", backend, "backend", "score", "a decision model")
        self.backend = backend

    def requests(self, q: ValueQuery) -> list[YesNo]:
        """The YesNo questions of ``q``'s interior states (value_requests)."""
        return value_requests(q)

    def values(self, queries: Sequence[ValueQuery]) -> list[ValueResult]:
        """Per query the backend's yes-probability at each interior state, float32 [T - 1], in one
        score call per trajectory; a backend error or a failed answer gives a failed ValueResult
        saying why."""
        out = []
        for q in queries:
            reqs = self.requests(q)
            if not reqs:
                out.append(ValueResult(np.zeros(0, np.float32)))
                continue
            t0 = time.perf_counter()
            try:
                results = self.backend.score(reqs)  # one packed pass for a LocalReadout
            except (ValueError, FloatingPointError, RuntimeError) as e:
                out.append(_failed(f"{type(e).__name__}: {e}",
                                   Cost(seconds=time.perf_counter() - t0)))
                continue
            cost = Cost()
            for r in results:
                cost = cost + r.cost
            bad = [i + 1 for i, r in enumerate(results) if not r.ok]
            if bad:
                first = results[bad[0] - 1]
                out.append(_failed(f"state(s) {bad[:5]} without a value ({first.error})", cost,
                                   first.raw))
                continue
            out.append(ValueResult(np.asarray([r.score for r in results], np.float32),
                                   cost=cost))
        return out


class ListValueModel:
    """One generation per trajectory returning a JSON list of values (see module docstring)."""

    def __init__(self, generator: Any):
        self.name = wrapped_name("list", generator, "generator", "generate", "a TextGenerator")
        self.generator = generator

    def values(self, queries: Sequence[ValueQuery]) -> list[ValueResult]:
        """Per query one generation asked for the JSON list of the T - 1 interior values
        (parse_value_list); a failed generation or a list that does not parse gives a failed
        ValueResult. Trajectories of one step need no call (empty values)."""
        out: list[ValueResult | None] = [None] * len(queries)
        todo = []
        for i, q in enumerate(queries):
            if len(q.trajectory.steps) <= 1:
                out[i] = ValueResult(np.zeros(0, np.float32))
            else:
                todo.append(i)
        gens = self.generator.generate([list_messages(queries[i].trajectory,
                                                      queries[i].group_context)
                                        for i in todo]) if todo else []
        for i, gen in zip(todo, gens):
            n = len(queries[i].trajectory.steps) - 1
            if not gen.ok:
                out[i] = _failed(gen.error or "generation failed", gen.cost)
                continue
            try:
                out[i] = ValueResult(parse_value_list(gen.text, n), cost=gen.cost)
            except ValueError as e:
                out[i] = _failed(f"unparsable value list: {e}", gen.cost, gen.text[:2000])
        return out  # type: ignore[return-value]


@functools.lru_cache(maxsize=16)
def _babyai_text_env(split: str, room_size: int, max_steps: int):
    return make_text_env(split, room_size=room_size, max_steps=max_steps)


def _babyai_oracle(traj: Trajectory) -> np.ndarray:
    """Replays a BabyAI text trajectory from its reset seed (metadata "key", as
    ``play_trajectory`` records it, or "task_seed", as the trainer's rollout does) on its
    split's standard task distribution with ``max_steps = traj.budget``; the room size is
    metadata "room_size" or the first of 8, 7, 9 whose replay reproduces the trajectory's
    first observation (no size does: ValueError)."""
    key = traj.metadata.get("key", traj.metadata.get("task_seed"))
    if key is None:
        raise ValueError("BabyAI oracle values need metadata['key'] or ['task_seed'] (the "
                         "reset seed) or metadata['oracle_values']")
    split = str(traj.metadata.get("split", "train"))
    sizes = [traj.metadata["room_size"]] if "room_size" in traj.metadata else [8, 7, 9]
    for size in sizes:
        env = _babyai_text_env(split, int(size), int(traj.budget))
        obs, _ = env.reset(key)
        if not traj.steps or obs == traj.steps[0].observation:
            return trajectory_oracle_values(env, key, [s.action for s in traj.steps])
    raise ValueError(f"BabyAI replay of key {key!r} does not reproduce the trajectory's first "
                     f"observation for room sizes {sizes} (different task distribution?)")


def _alfworld_oracle(traj: Trajectory) -> np.ndarray:
    return alfworld_oracle_values(traj)


# env name -> fn(trajectory) -> float [T + 1] oracle values of its states
ORACLE_VALUES: Registry[Callable[[Trajectory], np.ndarray]] = Registry(
    "env with oracle values", hint="or record metadata['oracle_values'] in the trajectory")
ORACLE_VALUES.register("babyai", _babyai_oracle)
ORACLE_VALUES.register("alfworld", _alfworld_oracle)


def _stable_seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


class OracleValueModel:
    """The env's own state values plus seeded noise (see module docstring).

    A trajectory whose metadata holds "oracle_values" (a list of T + 1 numbers, recorded by
    a rollout that had the env states) uses them; otherwise ``ORACLE_VALUES[traj.env]``
    recomputes them by replay. The noise of one trajectory depends on ``seed`` and the
    query's ``ident`` only. A trajectory whose values cannot be computed (no seed to replay,
    a replay that diverges) is a failed result, not an exception.
    """

    reads_context = False  # [LVRLX] the env's values ignore the group context (signal.py)

    def __init__(self, noise: float = 0.0, seed: int = 0, drift: float = 0.0):
        for key, x in (("noise", noise), ("drift", drift)):
            if isinstance(x, bool) or not (isinstance(x, (int, float)) and math.isfinite(x)
                                           and x >= 0):
                raise ValueError(f"{key} must be a finite number >= 0, got {x!r}")
        self.noise, self.seed, self.drift = float(noise), int(seed), float(drift)
        self.name = f"oracle_value(noise={self.noise:g}" + \
            (f", drift={self.drift:g})" if self.drift else ")")

    def clean_values(self, traj: Trajectory) -> np.ndarray:
        """The noiseless oracle values [T + 1] of ``traj``: metadata['oracle_values'], else its
        env's ORACLE_VALUES function; a missing oracle or a wrong shape is a ValueError."""
        if "oracle_values" in traj.metadata:
            v = np.asarray(traj.metadata["oracle_values"], np.float32)
        else:
            v = ORACLE_VALUES.get(traj.env)(traj)
        if v.shape != (len(traj.steps) + 1,):
            raise ValueError(f"oracle values have shape {v.shape}, expected "
                             f"[T + 1] = [{len(traj.steps) + 1}]")
        return v

    def values(self, queries: Sequence[ValueQuery]) -> list[ValueResult]:
        """Per query the oracle's interior values [T - 1] of states 1..T-1, lowered by drift · t
        at state t, plus Gaussian noise (seeded by the query's identity) when noise > 0, clipped
        to [0, 1]; an oracle error gives a failed ValueResult."""
        out = []
        for q in queries:
            t0 = time.perf_counter()
            try:
                v = self.clean_values(q.trajectory)[1:-1].astype(np.float64)
            except (ValueError, RuntimeError) as e:  # counted upstream; the row falls back
                out.append(_failed(f"oracle: {e}", Cost(seconds=time.perf_counter() - t0)))
                continue
            if self.drift > 0 and v.size:
                v = np.clip(v - self.drift * np.arange(1, v.size + 1), 0.0, 1.0)
            if self.noise > 0 and v.size:
                rng = np.random.default_rng(_stable_seed(self.seed, q.ident))
                v = np.clip(v + rng.normal(0.0, self.noise, v.shape), 0.0, 1.0)
            out.append(ValueResult(v.astype(np.float32),
                                   cost=Cost(seconds=time.perf_counter() - t0)))
        return out

