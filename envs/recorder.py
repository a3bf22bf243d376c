"""The one episode recorder of every env loop, its batch type and the one Trajectory builder.

Every loop that plays episodes (``VectorEnv`` with process or Ray workers, the in-process
``LocalVectorEnv``, and through them ``jaxdm.rl.rollout.rollout``) records them here:

* ``EpisodeRecorder`` keeps one ``RecordedEpisode`` per slot: task seed, group, initial
  state, and per step (``RecordedStep``) the observation seen before acting, the command the
  env received, reward, env validity, annotations and the (immutable) env state after it;
  then done / truncated / error and the outcome. It owns the pool-level rules the loops
  share: which task a slot plays (``task_seed``: group seeding, and the k-th auto-reset of a
  slot), the per-step env key (``jaxdm.envs.core.step_key``), the info keys a pool reports
  (skipped / inactive slots, ``episode_id``, ``truncated``), the ``max_steps`` cut, and
  auto-reset (``collect``): the only place a text-env episode is reset after it ended. A
  pool only runs the jobs (in worker processes, Ray actors or in-process).
* ``to_trajectory`` is the only place a ``jaxdm.trajectory.Trajectory`` is built from a
  played episode (the pool's finished trajectories and the rollout's, which overrides the
  action budget, validity and metadata with the policy's view).
* ``RecordedBatch`` is the array view of finished episodes: actions / rewards / dones /
  valid [B, T] padded with a mask, per-row outcome facts, and the per-step env states (env
  states are immutable, so a batch can be replayed or continued from any step). Text pools
  build it with ``RecordedBatch.from_episodes``; a vmapped JAX rollout builds it directly
  from arrays (states as a stacked pytree [B, T + 1, ...]); ``state(i, t)`` reads both.

Text-env results arrive as ``("ok", payload)`` or ``("error", message)`` per slot (the job
protocol of ``jaxdm.envs.vector.run_job``): a reset payload is ``(obs, state, reset_info)``,
a step payload ``(obs, state, reward, done, info)``. An error ends the slot's episode,
truncated, with ``error`` set.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from jaxdm.envs.core import step_key
from jaxdm.trajectory import Step, Trajectory

__all__ = ["ANNOTATION_KEYS", "BatchStep", "RecordedStep", "RecordedEpisode", "EpisodeRecorder",
           "RecordedPool", "RecordedBatch", "to_trajectory", "reset_info_of", "check_actions",
           "play_episode"]

# Annotation keys copied from step info into RecordedStep.annotations / Step.annotations.
ANNOTATION_KEYS = ("milestone", "no_op", "subgoal")


class BatchStep(NamedTuple):
    """Result of a pool's ``step``: per-slot observations, rewards, dones, infos and the env
    state of every slot after the step (immutable; after an auto-reset, the new episode's)."""

    observations: list
    rewards: np.ndarray  # [B] float32
    dones: np.ndarray  # [B] bool
    infos: list
    states: list | None = None


def reset_info_of(env: Any, state: Any, params: Any) -> dict:
    """Episode facts at reset: the env's ``reset_info(state, params)`` hook, else the
    ``goal`` / ``task_type`` / ``budget`` attributes of its state."""
    hook = getattr(env, "reset_info", None)
    if callable(hook):
        return dict(hook(state, params))
    return {k: getattr(state, k) for k in ("goal", "task_type", "budget") if hasattr(state, k)}


def check_actions(actions: Any, num_envs: int) -> list:
    """One action per slot (``None``: skip the slot); a string is not a batch of actions."""
    if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__"):
        raise TypeError(
            f"actions must be a sequence of num_envs={num_envs} actions (None: skip the "
            f"slot), got {type(actions).__name__}")
    if len(actions) != num_envs:
        raise ValueError(f"actions has length {len(actions)}, expected num_envs={num_envs}")
    return list(actions)


@dataclasses.dataclass
class RecordedStep:
    """One executed action, env side."""

    observation: Any      # what the agent saw before acting
    command: Any          # what the env received
    reward: float         # env reward of this step (float32 precision, as in BatchStep)
    valid: bool           # the env accepted the command (False for a step that errored)
    annotations: dict     # ANNOTATION_KEYS present in the step info
    state: Any = None     # the env state after the step (None if the step errored)


@dataclasses.dataclass
class RecordedEpisode:
    """One episode played in one slot (mutable while it runs; ``trajectory`` once it ended)."""

    episode_id: int
    slot: int
    group: int
    task_seed: int
    goal: str = ""
    task_type: str = ""
    budget: int = 0                   # the env's action budget, capped by max_steps
    env: str = ""
    initial_state: Any = None         # env state after reset: replay the episode from here
    state: Any = None                 # current env state
    obs: Any = ""                     # current observation (the final one once done)
    reset_info: dict = dataclasses.field(default_factory=dict)
    steps: list = dataclasses.field(default_factory=list)  # RecordedStep
    reward_sum: float = 0.0
    score: float | None = None        # the env's outcome score, when it reported one
    won: bool = False
    done: bool = False
    truncated: bool = False
    error: str | None = None
    final_observation_terminal: bool = False
    trajectory: Trajectory | None = None

    @property
    def reward(self) -> float:
        """The outcome reward: the env's ``score`` if it gave one, else the summed rewards."""
        return self.reward_sum if self.score is None else self.score

    @property
    def success(self) -> bool:
        """Whether the episode was won without an env error."""
        return self.won and self.error is None

    def step_key(self) -> int:
        """The env key of this episode's next step (the one schedule, ``envs.core.step_key``)."""
        return step_key(self.task_seed, len(self.steps))


def to_trajectory(ep: RecordedEpisode, *, env: str | None = None, budget: int | None = None,
                  truncated: bool | None = None, valid: Sequence[bool] | None = None,
                  metadata: Mapping[str, Any] | None = None) -> Trajectory:
    """The ``Trajectory`` of a recorded episode: the one builder of played trajectories.

    Overrides (default: the episode's own): ``env`` name, action ``budget``, ``truncated``
    (a rollout that stopped an unfinished episode at its budget), ``valid`` (one bool per
    step, ANDed with the env's validity: a rollout marks malformed policy outputs) and
    ``metadata`` (default: ``task_seed`` and ``episode_id``).
    """
    if valid is not None and len(valid) != len(ep.steps):
        raise ValueError(f"valid has {len(valid)} entries for an episode of {len(ep.steps)} "
                         f"steps (slot {ep.slot}, task {ep.task_seed})")
    steps = tuple(Step(s.observation, str(s.command),
                       valid=bool(s.valid) and (valid is None or bool(valid[t])),
                       annotations=dict(s.annotations))
                  for t, s in enumerate(ep.steps))
    return Trajectory(
        goal=ep.goal, steps=steps, final_observation=ep.obs, reward=float(ep.reward),
        success=ep.success, budget=int(ep.budget if budget is None else budget),
        task_type=ep.task_type, env=ep.env if env is None else env,
        final_observation_terminal=ep.final_observation_terminal,
        truncated=bool(ep.truncated if truncated is None else truncated), error=ep.error,
        metadata=dict({"task_seed": ep.task_seed, "episode_id": ep.episode_id}
                      if metadata is None else metadata))


class EpisodeRecorder:
    """Per-slot episode records of a pool of ``num_envs`` slots (see module docstring).

    Args:
      num_envs: slots B.
      group_size: G; slot ``i`` plays task ``seed + i // G`` (its k-th auto-reset: task
        ``seed + k * (B // G) + i // G``, so groups stay aligned).
      env_name: recorded as the episode's env unless its reset info gives ``"env"``.
      max_steps: optional cap on actions per episode (the episode ends truncated).
      auto_reset: ``collect`` starts a new episode in a slot as soon as its episode ends.

    A pool calls ``begin(seed)`` and ``start`` per slot with the reset results, then per
    step ``stepping(actions)`` (slot -> env key of the slots to step) and ``collect`` with
    the step results. Finished episodes' trajectories accumulate in ``trajectories``.
    """

    def __init__(self, num_envs: int, *, group_size: int = 1, env_name: str = "",
                 max_steps: int | None = None, auto_reset: bool = False):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        if not isinstance(group_size, int) or group_size < 1 or num_envs % group_size:
            raise ValueError(f"group_size must be a positive int dividing num_envs={num_envs}, "
                             f"got {group_size!r}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be a positive int or None, got {max_steps!r}")
        self.num_envs, self.group_size = num_envs, group_size
        self.num_groups = num_envs // group_size
        self.env_name, self.max_steps, self.auto_reset = env_name, max_steps, auto_reset
        self.seed = 0
        self.episodes: list[RecordedEpisode | None] = [None] * num_envs
        self.trajectories: list[Trajectory] = []
        self._reset_counts = [0] * num_envs
        self._next_episode_id = 0

    # ---- schedule --------------------------------------------------------------------------
    def task_seed(self, slot: int, reset_count: int = 0) -> int:
        """The task seed slot ``slot`` gets on its ``reset_count``-th reset (0 = first)."""
        return self.seed + reset_count * self.num_groups + slot // self.group_size

    @property
    def started(self) -> bool:
        """Whether every slot has an episode under way (reset was called)."""
        return all(ep is not None for ep in self.episodes)

    @property
    def states(self) -> list[Any]:
        """The current env state of every slot (immutable: copy/replay freely)."""
        return [ep.state if ep is not None else None for ep in self.episodes]

    def begin(self, seed: int) -> dict[int, int]:
        """Forget the slots' episodes and return slot -> task seed of the first resets."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = int(seed)
        self._reset_counts = [0] * self.num_envs
        self.episodes = [None] * self.num_envs
        return {i: self.task_seed(i) for i in range(self.num_envs)}

    def stepping(self, actions: Sequence[Any]) -> dict[int, int]:
        """Slot -> env key of every slot that steps: its episode is running and its action is
        not ``None``. The key depends only on the slot's task and step count."""
        if not self.started:
            raise RuntimeError("step called before reset()")
        return {i: ep.step_key() for i, (ep, a) in enumerate(zip(self.episodes, actions))
                if not ep.done and a is not None}

    def pop_trajectories(self) -> list[Trajectory]:
        """The trajectories of the episodes finished since the last call (the recorder forgets
        them)."""
        out, self.trajectories = self.trajectories, []
        return out

    # ---- recording -------------------------------------------------------------------------
    def start(self, slot: int, task_seed: int, result: tuple) -> tuple[Any, dict]:
        """Record a reset result in ``slot``; returns (observation, info). A failed reset
        leaves an ended, errored episode (info carries its ``trajectory``)."""
        status, payload = result
        ep = RecordedEpisode(episode_id=self._next_episode_id, slot=slot,
                             group=slot // self.group_size, task_seed=int(task_seed),
                             env=self.env_name)
        self._next_episode_id += 1
        self.episodes[slot] = ep
        if status != "ok":
            ep.done, ep.truncated, ep.error = True, True, str(payload)
            info = {"error": ep.error, "truncated": True, "episode_id": ep.episode_id,
                    "task_seed": ep.task_seed}
            self._finish(ep, info)
            return "", info
        obs, state, reset_info = payload
        ep.initial_state = ep.state = state
        ep.obs, ep.reset_info = obs, dict(reset_info)
        ep.goal = str(reset_info.get("goal", ""))
        ep.env = str(reset_info.get("env") or self.env_name)
        ep.task_type = str(reset_info.get("task_type", ""))
        budget = reset_info.get("budget", self.max_steps or 0)
        if self.max_steps is not None:
            budget = min(budget, self.max_steps) if budget else self.max_steps
        ep.budget = int(budget or 0)
        return obs, dict(reset_info, error=None, episode_id=ep.episode_id, task_seed=ep.task_seed)

    def advance(self, slot: int, action: Any, result: tuple) -> tuple[Any, float, bool, dict]:
        """Record a step result of ``slot``; returns (observation, reward, done, info)."""
        ep = self.episodes[slot]
        status, payload = result
        if status != "ok":
            ep.steps.append(RecordedStep(ep.obs, action, 0.0, False, {}))
            ep.done, ep.truncated, ep.error = True, True, str(payload)
            info = {"error": ep.error, "truncated": True, "episode_id": ep.episode_id,
                    "task_seed": ep.task_seed, "won": False}
            self._finish(ep, info)
            return ep.obs, 0.0, True, info
        obs, state, reward, done, info = payload
        reward = float(np.float32(reward))
        ep.steps.append(RecordedStep(ep.obs, action, reward, bool(info.get("valid", True)),
                                     {k: info[k] for k in ANNOTATION_KEYS if k in info}, state))
        ep.state, ep.obs = state, obs
        ep.reward_sum += reward
        done, truncated = bool(done), bool(info.get("truncated", False))
        if not done and self.max_steps is not None and len(ep.steps) >= self.max_steps:
            done, truncated = True, True
        info = dict(info, error=None, truncated=truncated, episode_id=ep.episode_id,
                    task_seed=ep.task_seed)
        if done:
            ep.done, ep.truncated = True, truncated
            self._finish(ep, info)
        return obs, reward, done, info

    def idle(self, slot: int, action: Any) -> tuple[Any, bool, dict]:
        """A slot that did not step: (observation, done, info) with ``skipped`` (its action
        was ``None``) and ``inactive`` (its episode had ended)."""
        ep = self.episodes[slot]
        info = {"error": None, "episode_id": ep.episode_id, "task_seed": ep.task_seed}
        if action is None:
            info["skipped"] = True
        if ep.done:
            info["inactive"] = True
        return ep.obs, ep.done, info

    def collect(self, actions: Sequence[Any], results: Mapping[int, tuple],
                run_resets: Callable[[dict[int, int]], Mapping[int, tuple]]) -> BatchStep:
        """The ``BatchStep`` of one pool step: ``results`` holds the step result of every slot
        in ``stepping(actions)``; the others are idle. With ``auto_reset``, every slot whose
        episode ended is reset through ``run_resets(slot -> task seed) -> slot -> result``
        and reports ``final_observation``, ``final_info`` and ``reset_info``."""
        b = self.num_envs
        obs, infos = [None] * b, [None] * b
        rewards, dones = np.zeros(b, np.float32), np.zeros(b, bool)
        for i in range(b):
            if i in results:
                obs[i], rewards[i], dones[i], infos[i] = self.advance(i, actions[i], results[i])
            else:
                obs[i], dones[i], infos[i] = self.idle(i, actions[i])
        resets = {}
        if self.auto_reset:
            for i in results:
                if dones[i]:
                    self._reset_counts[i] += 1
                    resets[i] = self.task_seed(i, self._reset_counts[i])
        if resets:
            reset_results = run_resets(resets)
            for i, seed in resets.items():
                final_obs, final_info = obs[i], infos[i]
                obs[i], new_info = self.start(i, seed, reset_results[i])
                infos[i] = dict(final_info, final_observation=final_obs, final_info=final_info,
                                reset_info=new_info)
        return BatchStep(obs, rewards, dones, infos, self.states)

    def _finish(self, ep: RecordedEpisode, info: dict) -> None:
        if "score" in info:
            ep.score = float(info["score"])
        ep.won = bool(info.get("won", False))
        ep.final_observation_terminal = bool(info.get("final_observation_terminal", False))
        ep.trajectory = to_trajectory(ep)
        self.trajectories.append(ep.trajectory)
        info["trajectory"] = ep.trajectory


class RecordedPool:
    """What every env pool shares over its ``EpisodeRecorder``: the task schedule and the
    episodes' states and trajectories, ``reset`` and the synchronous ``step``. A pool sets
    ``recorder`` and ``num_envs`` and implements ``step_async``, ``step_wait``, ``close`` and
    ``_run_resets(seeds) -> {slot: result}`` (``EpisodeRecorder.start``'s results); between
    ``step_async`` and ``step_wait`` it holds ``_in_flight``."""

    recorder: EpisodeRecorder
    num_envs: int
    _in_flight: Any = None

    @property
    def states(self) -> list[Any]:
        """The current env state of every slot (immutable: copy/replay freely)."""
        return self.recorder.states

    @property
    def trajectories(self) -> list[Trajectory]:
        """Trajectories of the episodes finished so far (``pop_trajectories`` drains them)."""
        return self.recorder.trajectories

    def pop_trajectories(self) -> list[Trajectory]:
        """Return and clear the trajectories of episodes finished so far."""
        return self.recorder.pop_trajectories()

    def task_seed(self, slot: int, reset_count: int = 0) -> int:
        """The task seed slot ``slot`` gets on its ``reset_count``-th reset (0 = first)."""
        return self.recorder.task_seed(slot, reset_count)

    def reset(self, seed: int = 0) -> tuple[list[str], list[dict]]:
        """Start a new episode in every slot; slot ``i`` gets task ``seed + i // G``."""
        self._check_open()
        if self._in_flight is not None:
            raise RuntimeError("reset called while a step_async is in flight; call step_wait")
        seeds = self.recorder.begin(seed)
        results = self._run_resets(seeds)
        obs, infos = [None] * self.num_envs, [None] * self.num_envs
        for i, task_seed in seeds.items():
            obs[i], infos[i] = self.recorder.start(i, task_seed, results[i])
        return obs, infos

    def start_tasks(self, seeds: Mapping[int, int]) -> dict[int, tuple[Any, dict]]:
        """Start a new episode of task ``seeds[slot]`` in each slot of ``seeds`` (slot -> task
        seed), leaving the other slots' episodes as they are: a scheduler that hands tasks to
        slots as they free up (the harness's episodes over a pool). Returns slot ->
        (observation, info); a failed reset ends that slot's episode with ``info["error"]``.
        The first call must start every slot (``step`` needs an episode in each)."""
        self._check_open()
        if self._in_flight is not None:
            raise RuntimeError("start_tasks called while a step_async is in flight; call "
                               "step_wait")
        bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, (int, np.integer))
               or not 0 <= s < self.num_envs]
        if bad:
            raise ValueError(f"start_tasks: slots must be ints in [0, {self.num_envs}), got "
                             f"{bad}")
        missing = [i for i, ep in enumerate(self.recorder.episodes)
                   if ep is None and i not in seeds]
        if missing:
            raise ValueError(f"start_tasks: slots {missing} have no episode yet; the first "
                             f"call must start every slot")
        for s in seeds.values():
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
                raise TypeError(f"start_tasks: task seeds must be ints, got {s!r}")
        seeds = {int(i): int(s) for i, s in seeds.items()}
        results = self._run_resets(seeds)
        return {i: self.recorder.start(i, s, results[i]) for i, s in seeds.items()}

    def step(self, actions: Sequence[Any]) -> BatchStep:
        """Apply one action per slot. Slots whose episode already ended (no auto-reset) are
        skipped: their action is ignored and they report ``done=True``, ``inactive=True``.
        A ``None`` action leaves that slot's episode untouched this time (see
        ``step_async``)."""
        self.step_async(actions)
        return self.step_wait()

    def _check_open(self) -> None:
        """Raise if the pool can no longer step (a closed worker pool)."""

    def _run_resets(self, seeds: Mapping[int, int]) -> dict[int, tuple]:
        raise NotImplementedError


def play_episode(env: Any, key: Any, act: Callable[[Any, Any], Any], *, params: Any = None,
                 max_steps: int | None = None, env_name: str = "") -> RecordedEpisode:
    """Play one episode in-process with ``act(state, observation) -> command`` (``None``
    stops early, leaving the episode unfinished): the loop of scripted and expert agents.

    ``key`` resets the env (an int task seed, or a JAX key for JAX-backed text envs; its
    ``seed_of`` is the task seed of the step-key schedule). Recorded by an
    ``EpisodeRecorder``, so ``to_trajectory`` gives the episode's Trajectory.
    """
    from jaxdm.envs.core import seed_of

    params = env.default_params if params is None else params
    rec = EpisodeRecorder(1, env_name=env_name, max_steps=max_steps)
    obs, state = env.reset(key, params)
    rec.start(0, seed_of(key), ("ok", (obs, state, reset_info_of(env, state, params))))
    ep = rec.episodes[0]
    while not ep.done:
        action = act(ep.state, ep.obs)
        if action is None:
            break
        rec.advance(0, action, ("ok", env.step(ep.step_key(), ep.state, action, params)))
    return ep


# ---------------------------------------------------------------------------------------
# The batch type
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RecordedBatch:
    """Finished episodes as padded arrays plus their per-step env states.

    Row ``i`` is one episode of ``lengths[i]`` executed actions; columns ``t >= lengths[i]``
    are padding (``mask`` False, rewards 0, dones/valid False, actions ``pad``).

    Fields:
      actions: [B, T] the commands the env received (object array of strings for text envs,
        int for JAX envs).
      rewards: [B, T] float32 per-step env rewards.
      dones: [B, T] bool, True on the step that ended the episode (terminal or truncated).
      valid: [B, T] bool, the env accepted the action.
      mask: [B, T] bool, executed steps.
      lengths: [B] int32. task_seeds: [B] int64. groups: [B] int32.
      outcome: [B] float32 (the env's score, else the summed rewards). success, truncated,
        errored: [B] bool (errored: lost to an env error, e.g. a dead worker).
      states: the env state before step 0 and after every step: either per row a sequence
        of ``lengths[i] + 1`` states (text envs: immutable dataclasses), or one stacked
        pytree whose leaves are [B, T + 1, ...] (JAX envs; padding repeats the last state).
      episodes: the ``RecordedEpisode``s of the rows (text pools), or None.

    Build from text-pool episodes with ``from_episodes``; a JAX rollout constructs it
    directly (``__post_init__`` checks the shapes and names the offending field).
    """

    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    valid: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    task_seeds: np.ndarray
    groups: np.ndarray
    outcome: np.ndarray
    success: np.ndarray
    truncated: np.ndarray
    errored: np.ndarray
    states: Any
    episodes: Sequence[RecordedEpisode] | None = None

    def __post_init__(self):
        shape = np.shape(self.mask)
        if len(shape) != 2:
            raise ValueError(f"RecordedBatch.mask must be [B, T], got shape {shape}")
        b, t = shape
        for name in ("actions", "rewards", "dones", "valid"):
            if np.shape(getattr(self, name)) != (b, t):
                raise ValueError(f"RecordedBatch.{name} has shape "
                                 f"{np.shape(getattr(self, name))}, expected mask's {(b, t)}")
        for name in ("lengths", "task_seeds", "groups", "outcome", "success", "truncated",
                     "errored"):
            if np.shape(getattr(self, name)) != (b,):
                raise ValueError(f"RecordedBatch.{name} has shape "
                                 f"{np.shape(getattr(self, name))}, expected {(b,)}")
        lengths = np.asarray(self.lengths)
        if (lengths < 0).any() or (lengths > t).any() or \
                not np.array_equal(np.asarray(self.mask),
                                   np.arange(t)[None, :] < lengths[:, None]):
            raise ValueError(f"RecordedBatch.mask must be the first lengths[i] steps of each "
                             f"row (lengths {lengths.tolist()}, T={t})")
        if isinstance(self.states, (list, tuple)):
            if len(self.states) != b:
                raise ValueError(f"RecordedBatch.states has {len(self.states)} rows, "
                                 f"expected B={b}")
            for i, row in enumerate(self.states):
                if len(row) != lengths[i] + 1:
                    raise ValueError(f"RecordedBatch.states[{i}] has {len(row)} states, "
                                     f"expected lengths[{i}] + 1 = {lengths[i] + 1}")
        else:
            import jax

            for path, leaf in jax.tree_util.tree_leaves_with_path(self.states):
                if tuple(np.shape(leaf)[:2]) != (b, t + 1):
                    raise ValueError(
                        f"RecordedBatch.states leaf {jax.tree_util.keystr(path)} has shape "
                        f"{np.shape(leaf)}, expected leading dims {(b, t + 1)}")

    @property
    def batch_size(self) -> int:
        """B: how many episodes the batch holds."""
        return int(np.shape(self.mask)[0])

    @property
    def num_steps(self) -> int:
        """T: the padded step count of the batch."""
        return int(np.shape(self.mask)[1])

    def state(self, i: int, t: int) -> Any:
        """The env state of row ``i`` after ``t`` steps (``t = 0``: the initial state)."""
        if not 0 <= t <= int(self.lengths[i]):
            raise IndexError(f"row {i} has states 0..{int(self.lengths[i])}, asked for {t}")
        if isinstance(self.states, (list, tuple)):
            return self.states[i][t]
        import jax

        return jax.tree_util.tree_map(lambda x: x[i, t], self.states)

    def trajectories(self) -> list[Trajectory]:
        """The rows' trajectories (text pools only)."""
        if self.episodes is None:
            raise ValueError("this RecordedBatch was built from arrays; it has no episodes")
        return [ep.trajectory if ep.trajectory is not None else to_trajectory(ep)
                for ep in self.episodes]

    @classmethod
    def from_episodes(cls, episodes: Sequence[RecordedEpisode], num_steps: int | None = None,
                      *, pad: Any = "") -> "RecordedBatch":
        """Pad recorded episodes to ``num_steps`` columns (default: the longest episode).
        Rows longer than ``num_steps`` raise (cut them before, never silently)."""
        b = len(episodes)
        if b == 0:
            raise ValueError("RecordedBatch.from_episodes needs at least one episode")
        longest = max(len(ep.steps) for ep in episodes)
        t = longest if num_steps is None else int(num_steps)
        if longest > t:
            raise ValueError(f"an episode has {longest} steps, more than num_steps={t}")
        actions = np.full((b, t), pad, dtype=object if isinstance(pad, str) else None)
        rewards = np.zeros((b, t), np.float32)
        dones = np.zeros((b, t), bool)
        valid = np.zeros((b, t), bool)
        lengths = np.zeros(b, np.int32)
        states = []
        for i, ep in enumerate(episodes):
            n = lengths[i] = len(ep.steps)
            for j, s in enumerate(ep.steps):
                actions[i, j], rewards[i, j], valid[i, j] = s.command, s.reward, s.valid
            if n and ep.done:
                dones[i, n - 1] = True
            states.append([ep.initial_state] + [s.state for s in ep.steps])
        return cls(
            actions=actions, rewards=rewards, dones=dones, valid=valid,
            mask=np.arange(t)[None, :] < lengths[:, None], lengths=lengths,
            task_seeds=np.array([ep.task_seed for ep in episodes], np.int64),
            groups=np.array([ep.group for ep in episodes], np.int32),
            outcome=np.array([ep.reward for ep in episodes], np.float32),
            success=np.array([ep.success for ep in episodes], bool),
            truncated=np.array([ep.truncated for ep in episodes], bool),
            errored=np.array([ep.error is not None for ep in episodes], bool),
            states=states, episodes=list(episodes))
