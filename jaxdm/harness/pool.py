"""Harness and bench episodes over an env pool: ``env.backend`` inline | process | ray.

The agent LLM and the decision model live in this process; the pool's workers only step the
environment. Each episode is its harness's generator of env transitions
(``jaxdm.harness.agent.EpisodeSteps``): ``EpisodeRunner.play`` keeps ``slots`` of them under
way, hands a task to a slot as it frees up (``RecordedPool.start_tasks``), sends every pending
action in one pool step (``VectorEnv``: the workers step in parallel, the trainer's pool with
its process or Ray backend) and resumes the episodes one at a time in slot order with what
came back. Why the workers step the env and do not play whole episodes: one decision-model
backend and one LLM client serve every episode (a loaded model is not copied into each worker,
a remote one keeps one connection and one count of its failures), its batched call per step
stays one call, and the worker protocol stays the trainer's (reset / step jobs, the parent
holding every state). An episode's results depend only on its own task, calls and states
(the simulated LLM and the decision models are seeded per call / question; the envs are
deterministic given the state), so inline, process and Ray give the same episodes.

Worker death: the pool returns the episode that was stepping on a worker that died (or hung
past ``env.step_timeout``) with ``info["error"]`` and replaces the worker, as it does for the
trainer. Here that episode is counted (``env_failures``) and run again from its reset on a
fresh slot (its calls are seeded, so the rerun is the episode an unbroken run plays), at
most ``ENV_RETRIES`` times; a pass in which more than ``max_failed_share`` of the episodes
started were lost (checked once ``early_min`` were, and at the end) stops with
``EnvWorkersFailed``, as does a task lost ``ENV_RETRIES + 1`` times.

A pass's workers start with it (their env params are the pass's) and stay open after it for
the next pass with the same workers, env and params (a command's arms on one split start
their workers once); another pass, an error or ``close_kept_pools`` closes them, and so does
the end of the process.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from collections import deque
from typing import Any, Callable, Iterator, Sequence

from jaxdm.envs.local import LocalVectorEnv
from jaxdm.envs.vector import WORKER_BACKENDS, VectorEnv, check_env_pool
from jaxdm.harness.agent import Episode, Harness
from jaxdm.harness.errors import HarnessError

ENV_BACKENDS = ("inline", *WORKER_BACKENDS)
ENV_RETRIES = 2          # runs of a task lost to an env worker, after the first
EPISODES_PER_WORKER = 2  # default slots per worker: one steps while the other's calls run here


class EnvWorkersFailed(HarnessError):
    """Too many episodes were lost to env workers (dead, hung, or an env that raised)."""


@dataclasses.dataclass(frozen=True)
class EnvWorkersConfig:
    """Where the episodes' env steps run (the ``env:`` section's worker keys, as the trainer's).

    ``backend``: ``inline`` (this process, one episode after another: no workers),
    ``process`` (``num_workers`` worker processes on this host) or ``ray`` (``num_workers``
    Ray actors, on any node of a Ray cluster; ``pip install 'jaxdm[ray]'``); ``ray``: the Ray
    backend's options (``jaxdm.envs.vector.RAY_BACKEND_OPTIONS``: ``address`` of the cluster's
    head, ``num_cpus`` and custom ``resources`` per worker, ``actor_options``);
    ``step_timeout``: seconds an env step may take before its worker is killed and replaced;
    ``in_flight``: episodes under way at once (0: ``EPISODES_PER_WORKER`` per worker, 1
    inline: each episode is ``Harness.run_task``; more inline interleave them on an
    in-process ``LocalVectorEnv``)."""

    backend: str = "inline"
    num_workers: int = 0
    in_flight: int = 0
    step_timeout: float = 60.0
    ray: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_env_workers(self)

    @property
    def slots(self) -> int:
        """Episodes under way at once."""
        if self.in_flight:
            return self.in_flight
        return 1 if self.backend == "inline" else EPISODES_PER_WORKER * self.num_workers


def check_env_workers(w: EnvWorkersConfig, where: str = "env") -> None:
    """The worker keys of a config section ``where``: named errors, checked on load (the
    process / Ray keys by ``jaxdm.envs.vector.check_env_pool``, as the trainer's)."""
    WORKER_BACKENDS.validate(w.backend, field=f"{where}.backend", also=("inline",),
                             what="env backend")
    for key in ("num_workers", "in_flight"):
        value = getattr(w, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{where}.{key} must be an int >= 0, got {value!r}")
    if isinstance(w.step_timeout, bool) or not (isinstance(w.step_timeout, (int, float))
                                                and math.isfinite(w.step_timeout)
                                                and w.step_timeout > 0):
        raise ValueError(f"{where}.step_timeout must be a finite number of seconds > 0, got "
                         f"{w.step_timeout!r}")
    if w.backend == "inline":
        if w.num_workers:
            raise ValueError(f"{where}.num_workers={w.num_workers} needs {where}.backend "
                             f"process or ray ({where}.backend is 'inline': no workers)")
        if w.ray:
            raise ValueError(f"{where}.ray is set but {where}.backend is 'inline'; set "
                             f"{where}.backend=ray")
        return
    if w.num_workers < 1:
        raise ValueError(f"{where}.backend={w.backend} needs {where}.num_workers >= 1 (or "
                         f"{where}.backend=inline)")
    check_env_pool(w.backend, w.num_workers, w.ray, where)


class EpisodeRunner:
    """Plays harness episodes with their env steps on the pool of ``workers`` (see the module
    docstring).

    Args:
      workers: the ``EnvWorkersConfig``.
      env_factory: a picklable env recipe (an env class, ``EnvFactory``, a top-level callable):
        the workers build their env with it; this process builds one too, which answers the
        harness's pure questions about a state (answer keys, the simulated LLM's view).
      params: the env params of every episode.
      env_name: recorded as the pool's env name.
      max_failed_share: the share of started episodes that may be lost to env workers.
      early_min: losses after which the share is checked before the pass ends.

    After ``play``: ``env_failures`` (episodes lost to a worker, each run again),
    ``started`` (episodes started, reruns included) and ``reused`` (the workers were those of
    the pass before, kept open: ``close_kept_pools``).
    """

    def __init__(self, workers: EnvWorkersConfig, env_factory: Any, params: Any, *,
                 env_name: str = "", max_failed_share: float, early_min: int = 10):
        self.workers, self.factory, self.params = workers, env_factory, params
        self.env_name, self.max_failed_share, self.early_min = env_name, max_failed_share, \
            early_min
        self.env = env_factory()
        self.env_failures = 0
        self.started = 0
        self.last_error: str | None = None
        self.reused = False

    def _open(self, slots: int):
        w = self.workers
        if w.backend == "inline":
            return LocalVectorEnv(self.env, slots, params=self.params, env_name=self.env_name)
        return VectorEnv(self.factory, slots, num_workers=w.num_workers, params=self.params,
                         step_timeout=w.step_timeout, env_name=self.env_name,
                         backend=w.backend, backend_options=dict(w.ray) or None)

    def play(self, tasks: Sequence[int], harness_for: Callable[[int], Harness]
             ) -> Iterator[tuple[int, Harness, Episode]]:
        """(task, its harness, its Episode) for every task of ``tasks``, in that order, as each
        is ready; ``harness_for(task)`` gives the harness that plays it (e.g.
        ``Harness.for_episode``). The worker pool starts with the pass, or is the one the
        pass before it kept (same workers, env and params); a pass that finishes keeps it for
        the next, one that stops early (an error, the generator closed) closes it. Raises
        ``EnvWorkersFailed`` past the failure share."""
        tasks = [int(t) for t in tasks]
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"play: tasks must be distinct, got {tasks}")
        if not tasks:
            return
        if self.workers.slots == 1 and self.workers.backend == "inline":
            # one after another in this process: each episode is ``run_task`` on the env
            for task in tasks:
                harness = harness_for(task)
                self.started += 1
                yield task, harness, harness.run_task(self.env, task, self.params)
            return
        need = min(self.workers.slots, len(tasks))
        key = self._pool_key()
        pool = _KEPT.pop(key, None)
        if pool is not None and (pool.num_envs < need or not _usable(pool)):
            pool.close()
            pool = None
        close_kept_pools()                     # one idle pool at a time
        self.reused = pool is not None
        if pool is None:
            pool = self._open(need)
        finished = False
        try:
            yield from self._play(pool, tasks, harness_for)
            finished = True
        finally:
            if finished:   # consistent between passes: the next pass like this one reuses it
                _KEPT[key] = pool
            else:
                pool.close()

    def _pool_key(self) -> str:
        w = self.workers
        return repr((w.backend, w.num_workers, w.step_timeout, sorted(w.ray.items()),
                     self.factory, self.params, self.env_name))

    def _play(self, pool, tasks, harness_for):
        queue = deque((t, 0) for t in tasks)      # (task, runs lost so far)
        free = list(range(pool.num_envs))
        running: dict[int, list] = {}            # slot -> [task, lost, harness, steps, request]
        finished: dict[int, tuple[Harness, Episode]] = {}
        out = 0
        while queue or running:
            starts = {}
            while free and queue:
                slot = free.pop(0)
                task, lost = queue.popleft()
                harness = harness_for(task)
                steps = harness.episode(self.env, task, self.params)
                request = next(steps)
                running[slot] = [task, lost, harness, steps, request]
                starts[slot] = request[1]
                self.started += 1
            if starts:
                begun = pool.start_tasks(starts)
                states = pool.states
                for slot in sorted(starts):
                    obs, info = begun[slot]
                    self._resume(slot, (obs, states[slot]), info, running, free, finished,
                                 queue)
            actions = [running[s][4][3] if s in running else None for s in range(pool.num_envs)]
            if any(a is not None for a in actions):
                step = pool.step(actions)
                for slot in range(pool.num_envs):
                    if actions[slot] is None:
                        continue
                    info = step.infos[slot]
                    result = (step.observations[slot], step.states[slot],
                              float(step.rewards[slot]), bool(step.dones[slot]), info)
                    self._resume(slot, result, info, running, free, finished, queue)
            pool.pop_trajectories()               # the harness keeps its own records
            while out < len(tasks) and tasks[out] in finished:
                harness, ep = finished.pop(tasks[out])
                yield tasks[out], harness, ep
                out += 1
        self._check(final=True)

    def _resume(self, slot, result, info, running, free, finished, queue) -> None:
        """Send ``result`` to the slot's episode: its next request, or it finished, or (an env
        error) it is lost and queued again."""
        task, lost, harness, steps, _ = running[slot]
        error = info.get("error")
        if error:
            steps.close()
            del running[slot]
            free.append(slot)
            self.env_failures += 1
            self.last_error = _gist(error)
            if lost >= ENV_RETRIES:
                raise EnvWorkersFailed(
                    f"task {task}: lost to an env worker {lost + 1} times (last: "
                    f"{self.last_error}); {self.env_failures} of {self.started} episodes "
                    f"lost in this pass")
            queue.appendleft((task, lost + 1))
            self._check(final=False)
            return
        try:
            running[slot][4] = steps.send(result)
        except StopIteration as stop:
            del running[slot]
            free.append(slot)
            finished[task] = (harness, stop.value)

    def _check(self, *, final: bool) -> None:
        least = 1 if final else self.early_min
        n, bound = self.env_failures, self.max_failed_share
        if n >= least and n > bound * max(self.started, 1):
            raise EnvWorkersFailed(
                f"{n} of {self.started} episodes were lost to env workers "
                f"({n / max(self.started, 1):.1%} > max_failed_share {bound:g}; each was run "
                f"again; last error: {self.last_error})")


# The worker pool of the last finished pass, kept open for the next pass with the same
# workers, env and params (a command's passes on one split: the arms, the frontier sweep, so
# their workers start once); a pass with other settings closes it. Pools close at exit too.
_KEPT: dict[str, Any] = {}


def close_kept_pools() -> None:
    """Close the worker pool kept open between passes, if any (``EpisodeRunner.play``)."""
    while _KEPT:
        _, pool = _KEPT.popitem()
        pool.close()


def _usable(pool: Any) -> bool:
    """A kept pool can take the next pass: its Ray connection (if any) is still up."""
    if getattr(pool, "backend", None) != "ray":
        return True
    return sys.modules["ray"].is_initialized()   # imported by the Ray backend that built it


def _gist(text: str) -> str:
    """The last non-empty line of an error (a traceback's exception line)."""
    text = str(text).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else text


__all__ = ["ENV_BACKENDS", "ENV_RETRIES", "EPISODES_PER_WORKER", "EnvWorkersConfig",
           "EnvWorkersFailed", "EpisodeRunner", "check_env_workers", "close_kept_pools"]
