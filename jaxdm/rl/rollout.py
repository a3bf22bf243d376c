"""Multi-turn rollout engine: policy ↔ batched text environments, with per-action records.

Per turn, the engine builds the policy input of every live episode (goal, observation,
admissible actions, history, steps taken), asks the policy for actions (one jitted device
call for the whole live batch), sends them to the env pool (``jaxdm.envs.vector.VectorEnv``
worker processes, or ``LocalVectorEnv`` in-process, ``jaxdm.envs.local``), and keeps, per
action, the tokens the policy saw and produced and their sampling log-prob. The env side of
every episode (observations, commands, rewards, validity, annotations, the env state after
each step, the outcome) is recorded once, by the pool's ``jaxdm.envs.recorder.EpisodeRecorder``
(``EpisodeRecord.record``), which keys every step with ``jaxdm.envs.core.step_key``, so a
recorded episode replays exactly from ``EpisodeRecord.initial_state``; its ``Trajectory``
comes from ``jaxdm.envs.recorder.to_trajectory`` with the rollout's budget, the policy's
validity and the group metadata. ``RolloutResult.recorded_batch`` is the array view.
Episodes end at their own time (done, or the action budget); the batch continues with the
rest. An output without both ``<think>`` and ``<action>`` tags is invalid: the env receives
``INVALID_COMMAND`` and the action is marked for the invalid-action penalty.

With ``pipeline=True`` the batch is split into two fixed halves that alternate: while one
half's commands step in the env workers (``step_async``), the policy generates for the other
half; a ``None`` action tells the pool to leave a slot alone. This hides env time behind
generation (or the reverse) at the cost of two policy calls per turn instead of one, so it
pays off when a turn's env step is not much cheaper than a half-batch policy call
(``benchmarks/rl_rollout_pipeline.py`` measures both cases).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxdm.envs.local import LocalVectorEnv  # noqa: F401 - re-exported (it lived here)
from jaxdm.envs.recorder import BatchStep, RecordedBatch, RecordedEpisode, to_trajectory
from jaxdm.rl.policy import ActionOut, TurnInput
from jaxdm.rl.text import INVALID_COMMAND
from jaxdm.trajectory import Trajectory

__all__ = ["LocalVectorEnv", "ActionRecord", "EpisodeRecord", "RolloutResult", "rollout",
           "pipeline_halves"]


@dataclasses.dataclass
class ActionRecord:
    """One executed action: the policy's output plus a copy of the env side's record
    (``jaxdm.envs.recorder.RecordedStep``)."""

    observation: str
    out: ActionOut
    command: str          # what the env received
    reward: float         # env reward of this step
    annotations: dict[str, Any]
    env_valid: bool       # the env accepted the command
    state: Any = None     # the env state after this action (immutable), when the pool has it

    @property
    def valid(self) -> bool:
        """Counts for the penalty: the policy output was well formed (parsable)."""
        return self.out.valid


@dataclasses.dataclass
class EpisodeRecord:
    """One played episode: its pool slot, group and task seed, goal, task type and step budget, the
    actions taken (ActionRecord), the Trajectory, the env state after reset, the reward and success,
    and the env error that ended it if any."""
    slot: int
    group: int
    task_seed: int
    goal: str
    task_type: str
    budget: int
    actions: list[ActionRecord]
    trajectory: Trajectory | None = None
    initial_state: Any = None  # the env state after reset (replay the episode from here)
    reward: float = 0.0
    success: bool = False
    truncated: bool = False
    error: str | None = None
    record: RecordedEpisode | None = None  # the env side, as the pool recorded it


@dataclasses.dataclass
class RolloutResult:
    """Episodes of one rollout plus where its time went.

    ``generation_s``: time inside ``policy.act``. ``env_s``: time the rollout waited on the
    env pool (inside ``step_async`` and ``step_wait``): all of the env time in a sequential
    rollout, only the part not hidden behind generation in a pipelined one. ``overlap_s``:
    time inside ``policy.act`` while an env step ran in the background (worker processes;
    0 for a sequential rollout or an in-process pool). ``wall_s``: the whole call, reset
    included, so ``wall_s - generation_s - env_s`` is reset and bookkeeping. ``turns``:
    actions of the longest episode; ``policy_calls``: ``policy.act`` calls (one per turn,
    two per turn when pipelined).
    """

    episodes: list[EpisodeRecord]
    generation_s: float
    env_s: float
    turns: int
    overlap_s: float = 0.0
    wall_s: float = 0.0
    policy_calls: int = 0

    def trajectories(self) -> list[Trajectory]:
        """The Trajectory of each episode, in episode order."""
        return [e.trajectory for e in self.episodes]

    def recorded_batch(self, num_steps: int | None = None) -> RecordedBatch:
        """The env side of the episodes as one ``RecordedBatch`` ([B, num_steps] arrays)."""
        return RecordedBatch.from_episodes([e.record for e in self.episodes], num_steps)

    @property
    def num_actions(self) -> int:
        """Actions executed over all episodes."""
        return sum(len(e.actions) for e in self.episodes)


def pipeline_halves(num_envs: int) -> list[np.ndarray]:
    """The fixed slot halves of a pipelined rollout: even slots, then odd slots.

    Interleaving (rather than first/second half) gives every ``VectorEnv`` worker, which owns
    a contiguous slice of slots, work in both halves, and puts members of every task group
    in both, so the halves' episode lengths match. One slot: a single half (no pipeline).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    halves = [np.arange(0, num_envs, 2), np.arange(1, num_envs, 2)]
    return [h for h in halves if h.size]


def rollout(policy: Any, params: Any, venv: Any, *, seed: int, key: jax.Array,
            max_actions: int, greedy: bool = False, group_of: Callable[[int], int] | None = None,
            env_name: str = "", pipeline: bool = False) -> RolloutResult:
    """Run one batch of episodes (one per env slot) to the end; see module docstring.

    ``seed`` is the env pool's task seed (slot i plays task ``seed + i // group_size``),
    ``key`` the sampling key, ``max_actions`` the action budget.

    ``pipeline=False``: each turn, one ``policy.act`` for all live episodes, then one env
    step; the sampling key is split once per turn.

    ``pipeline=True``: the slots form two fixed halves (``pipeline_halves``: even / odd
    slots). While one half's commands step in the env (``venv.step_async``), ``policy.act``
    runs on the other half; then ``venv.step_wait``. Generation on the accelerator thus
    overlaps host env steps. Each half keeps its own key chain (``fold_in(key, half)``, split
    once per turn of that half), so results are reproducible for a given key; with a
    deterministic policy (greedy decoding) the episodes are identical to a sequential
    rollout's. When one half has no live episode left, the other runs alone. It costs two
    policy calls per turn instead of one, so it pays off when a half-batch env step costs
    about as much as a half-batch policy call (``RolloutResult`` times show the split).
    """
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    for method in ("step_async", "step_wait"):
        if not callable(getattr(venv, method, None)):
            raise TypeError(f"venv must provide {method}() (VectorEnv or LocalVectorEnv), got "
                            f"{type(venv).__name__}")
    if getattr(venv, "recorder", None) is None:
        raise TypeError(f"venv must record its episodes in .recorder (an EpisodeRecorder: "
                        f"VectorEnv or LocalVectorEnv), got {type(venv).__name__}")
    t_start = time.perf_counter()
    b = venv.num_envs
    g = getattr(venv, "group_size", 1)
    group_of = group_of or (lambda i: i // g)
    obs, infos = venv.reset(seed)
    # The pool's records of these episodes (kept even if a slot is reset after them).
    records: list[RecordedEpisode] = list(venv.recorder.episodes)
    eps: list[EpisodeRecord] = []
    admissible: list[tuple[str, ...]] = []
    live = np.ones(b, bool)
    for i, rec in enumerate(records):
        info = infos[i] or {}
        eps.append(EpisodeRecord(slot=i, group=group_of(i), task_seed=rec.task_seed,
                                 goal=rec.goal, task_type=rec.task_type,
                                 budget=int(min(info.get("budget") or max_actions, max_actions)),
                                 actions=[], initial_state=rec.initial_state, record=rec))
        admissible.append(tuple(info.get("admissible_actions", ())))
        live[i] = not rec.done  # a failed reset ends the episode at once
    current_obs = list(obs)

    halves = pipeline_halves(b) if pipeline else [np.arange(b)]
    n_halves = len(halves)
    # One key chain per half; a single half keeps the plain per-turn split of ``key``.
    half_keys = [key] if n_halves == 1 else [jax.random.fold_in(key, h) for h in range(n_halves)]
    half_turns = [0] * n_halves
    pad_to = max(len(h) for h in halves)
    timing = {"gen": 0.0, "env": 0.0, "overlap": 0.0}
    in_flight: tuple | None = None  # (half, slots, outs, commands)
    background = bool(getattr(venv, "steps_in_background", False))
    ready: dict[int, tuple] = {}  # half -> (slots, outs, commands) generated, not yet sent

    def live_slots(h: int) -> np.ndarray:
        if half_turns[h] >= max_actions:
            return halves[h][:0]
        return halves[h][live[halves[h]]]

    def generate(h: int) -> tuple:
        idx = live_slots(h)
        states = [TurnInput(goal=eps[i].goal, observation=current_obs[i],
                            admissible=admissible[i],
                            history=tuple((a.observation, a.command) for a in eps[i].actions),
                            steps_taken=len(eps[i].actions), budget=eps[i].budget)
                  for i in idx]
        half_keys[h], sub = jax.random.split(half_keys[h])
        t0 = time.perf_counter()
        outs = policy.act(params, states, sub, greedy=greedy, pad_to=pad_to)
        dt = time.perf_counter() - t0
        timing["gen"] += dt
        if in_flight is not None and background:
            timing["overlap"] += dt
        if len(outs) != len(idx):
            raise RuntimeError(f"policy.act returned {len(outs)} actions for {len(idx)} states")
        commands = [outs[j].action if outs[j].valid else INVALID_COMMAND
                    for j in range(len(idx))]
        return idx, outs, commands

    def send(h: int) -> tuple:
        idx, outs, commands = ready.pop(h)
        actions: list[Any] = [None] * b
        for j, i in enumerate(idx):
            actions[i] = commands[j]
        t0 = time.perf_counter()
        venv.step_async(actions)
        timing["env"] += time.perf_counter() - t0
        half_turns[h] += 1
        return h, idx, outs, commands

    def absorb(flight: tuple, res: BatchStep) -> None:
        _, idx, outs, commands = flight
        for j, i in enumerate(idx):
            ep, step = eps[i], records[i].steps[-1]
            if len(records[i].steps) != len(ep.actions) + 1 or step.command != commands[j]:
                raise RuntimeError(f"slot {i}: the pool did not record the action just taken")
            ep.actions.append(ActionRecord(
                observation=step.observation, out=outs[j], command=step.command,
                reward=step.reward, annotations=dict(step.annotations), env_valid=step.valid,
                state=step.state))
            current_obs[i] = res.observations[i]
            admissible[i] = tuple((res.infos[i] or {}).get("admissible_actions", ()))
            if res.dones[i] or len(ep.actions) >= ep.budget:
                live[i] = False

    try:
        while True:
            # Generate for the next half that is not stepping (while the other one steps).
            first = 0 if in_flight is None else (in_flight[0] + 1) % n_halves
            for h in [(first + k) % n_halves for k in range(n_halves)]:
                if (in_flight is None or h != in_flight[0]) and h not in ready \
                        and live_slots(h).size:
                    ready[h] = generate(h)
                    break
            if in_flight is not None:
                flight, in_flight = in_flight, None
                t0 = time.perf_counter()
                res = venv.step_wait()
                timing["env"] += time.perf_counter() - t0
                absorb(flight, res)
            if ready:
                in_flight = send(next(iter(ready)))
            elif not any(live_slots(h).size for h in range(n_halves)):
                break
    except BaseException:
        if in_flight is not None:  # leave the pool usable (nothing in flight) for the caller
            try:
                venv.step_wait()
            except Exception:
                pass
        raise
    for i, (ep, rec) in enumerate(zip(eps, records)):
        # An episode the rollout stopped at its budget (the pool has not ended it) counts
        # as truncated.
        ep.reward, ep.success, ep.error = rec.reward, rec.success, rec.error
        ep.truncated = rec.truncated if rec.done else True
        ep.trajectory = to_trajectory(
            rec, env=env_name, budget=ep.budget, truncated=ep.truncated,
            valid=[a.valid for a in ep.actions],
            metadata={"id": f"seed{ep.task_seed}-slot{i}", "task_seed": ep.task_seed,
                      "group": ep.group})
    return RolloutResult(eps, timing["gen"], timing["env"], max(half_turns),
                         overlap_s=timing["overlap"], wall_s=time.perf_counter() - t_start,
                         policy_calls=sum(half_turns))
