"""VectorEnv: a pool of host worker processes stepping a batch of text-environment episodes.

Text environments (ALFWorld, WebShop, DECISION GYM) are pure Python and run on the host. A
``VectorEnv`` spreads a batch of ``num_envs`` episodes over ``num_workers`` processes, each
stepping a contiguous slice, so environment steps overlap with policy work on the accelerator
and use every host core. Design points:

* **The parent holds the truth.** Every step returns the new (immutable) env state to the
  parent; the worker also keeps it (tagged), so states travel to a worker only after it was
  replaced. If a worker crashes or hangs, only the episode it was stepping is lost: that
  episode is returned truncated with ``info["error"]`` set, the worker is killed and
  replaced, and the rest of its slice is re-sent, with the parent's states, to the
  replacement. Workers reply per episode, so the parent knows which one was interrupted.
* **Overlap.** ``step_async(actions)`` returns at once and ``step_wait()`` collects, so a
  trainer can run the policy on one half-batch while the other half's environments step
  (a ``None`` action skips a slot: ``jaxdm.rl.rollout.rollout(..., pipeline=True)``).
* **Processes, not threads**, started with ``spawn`` (or ``forkserver``): the parent may
  already run JAX threads, and forking those is unsafe.
* **Group seeding.** Episode ``i`` starts task ``seed + i // group_size``, so the G members of
  a GRPO group start the same task. With auto-reset the k-th reset of slot ``i`` starts task
  ``seed + k * num_groups + i // group_size``, so groups stay aligned.
* **Recording.** ``jaxdm.envs.recorder.EpisodeRecorder`` (shared with ``LocalVectorEnv``)
  records every episode, keys its steps (``envs.core.step_key``), does the auto-reset and
  builds each finished episode's ``jaxdm.trajectory.Trajectory``; this module only runs jobs.
* **No orphans.** ``close()`` (also via context manager, ``__del__`` and an ``atexit`` hook)
  joins or kills every worker; a worker also exits when its parent dies (pipe EOF, or a
  parent-pid watchdog while it is busy).

Optional environment hooks: ``reset_info(state, params) -> dict`` (episode facts at reset)
and ``warm_up()`` (called once in each worker before it reports ready; covered by
``start_timeout``, not ``step_timeout``).

Info keys read from environments (``reset_info(state, params)`` at reset, ``info`` at step):

``goal`` (str), ``task_type`` (str), ``budget`` (int): recorded into the trajectory;
``admissible_actions``, ``valid``, ``won``, ``milestone``, ``no_op``: the step contract
(``envs.core.INFO_KEYS``); ``truncated`` (bool): the episode ended on its action budget;
``score`` (float): the episode's outcome score if it differs from the summed rewards;
``final_observation_terminal`` (bool): the terminal observation must be masked for judges;
``subgoal`` (str): which subgoal a milestone achieved (copied into step annotations).

Info keys added by the pool (``EpisodeRecorder``, the same for ``LocalVectorEnv``): ``error``
(str or None), ``truncated`` (bool), ``episode_id`` (int), ``task_seed`` (int);
``trajectory`` when an episode ended, and when auto-reset then started a new one in its slot
``final_observation``, ``final_info`` and ``reset_info``; ``skipped`` (True: the slot's action
was ``None``, so it did not step) and ``inactive`` (True: the slot's episode had already
ended, so it did not step).
"""
from __future__ import annotations

import atexit
import dataclasses
import importlib
import multiprocessing as mp
import os
import pickle
import threading
import time
import traceback
import weakref
from multiprocessing.connection import wait as _wait_ready
from typing import Any, Callable, Mapping, Sequence


from jaxdm.envs.recorder import (  # noqa: F401 - BatchStep, ANNOTATION_KEYS re-exported
    ANNOTATION_KEYS, BatchStep, EpisodeRecorder, RecordedPool, check_actions, reset_info_of)
from jaxdm.registry import Registry


# ---------------------------------------------------------------------------------------
# Environment factories (picklable recipes that workers call to build their env).
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """A picklable recipe ``"package.module:callable"`` + keyword arguments.

    Workers import the module and call ``callable(**kwargs)``; the callable returns an
    ``Environment`` (an env class itself works too).
    """

    target: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.target, str) or self.target.count(":") != 1:
            raise ValueError(
                f"EnvFactory.target must look like 'package.module:callable', got {self.target!r}"
            )
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def __call__(self):
        module_name, attr = self.target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(f"EnvFactory: cannot import module {module_name!r}: {e}") from e
        try:
            fn = getattr(module, attr)
        except AttributeError:
            raise ValueError(f"EnvFactory: module {module_name!r} has no {attr!r}") from None
        return fn(**self.kwargs)


def _as_factory(env_factory: Any) -> Callable[[], Any]:
    if isinstance(env_factory, str):
        return EnvFactory(env_factory)
    if not callable(env_factory):
        raise TypeError(
            "env_factory must be an EnvFactory, a 'module:callable' string or a picklable "
            f"top-level callable, got {type(env_factory).__name__}"
        )
    try:
        pickle.dumps(env_factory)
    except Exception as e:  # lambdas, closures, local classes
        raise TypeError(
            f"env_factory {env_factory!r} cannot be pickled for worker processes ({e}); "
            "use EnvFactory('module:callable', kwargs) or a top-level function"
        ) from None
    return env_factory


# ---------------------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------------------
def _parent_watchdog(parent_pid: int, period: float = 1.0) -> None:
    """Exit the worker if its parent is gone (covers a worker busy in a long env step)."""
    while True:
        time.sleep(period)
        if os.getppid() != parent_pid:
            os._exit(3)


def build_worker_env(env_factory: Callable[[], Any]) -> Any:
    """Build the environment inside a worker (any backend) and run its optional ``warm_up``:
    one-off preparation (indexes, NLP models) done before the first timed step, so a slow
    first step cannot trip step_timeout."""
    env = env_factory()
    warm_up = getattr(env, "warm_up", None)
    if callable(warm_up):
        warm_up()
    return env


def run_job(env, params, held: dict, kind: str, job: tuple) -> tuple:
    """Run one ``reset`` or ``step`` job inside a worker (any backend).

    ``held`` maps slot -> (tag, latest state): a worker keeps the latest state of each of its
    slots, so the parent only re-sends a state after a worker was replaced (this also keeps
    any caches an env attaches to its state objects warm). Returns ``("ok", slot, payload)``
    or ``("error", slot, traceback)``.
    """
    idx = job[0]
    try:
        if kind == "reset":
            _, tag, seed = job
            obs, state = env.reset(seed, params)
            held[idx] = (tag, state)
            return ("ok", idx, (obs, state, reset_info_of(env, state, params)))
        _, tag_before, tag_after, state, action, key = job
        if state is None:
            have_tag, state = held.get(idx, (None, None))
            if have_tag != tag_before:
                raise RuntimeError(f"worker lost the state of slot {idx}")
        held.pop(idx, None)
        obs, new_state, reward, done, info = env.step(key, state, action, params)
        held[idx] = (tag_after, new_state)
        return ("ok", idx, (obs, new_state, float(reward), bool(done), dict(info)))
    except Exception:
        return ("error", idx, traceback.format_exc(limit=8))


def _worker_main(conn, env_factory, params, parent_pid: int) -> None:
    threading.Thread(target=_parent_watchdog, args=(parent_pid,), daemon=True).start()
    try:
        env = build_worker_env(env_factory)
    except BaseException:
        conn.send(("init_error", traceback.format_exc()))
        conn.close()
        return
    conn.send(("ready", os.getpid()))
    held: dict[int, tuple[int, Any]] = {}  # slot -> (tag, latest state)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # parent closed the pipe or died
        kind = msg[0]
        if kind == "close":
            conn.close()
            return
        # One reply per job, sent as soon as it is done, so the parent knows which job a
        # crash or a hang interrupted.
        for job in msg[1]:
            reply = run_job(env, params, held, kind, job)
            try:
                conn.send(reply)
            except Exception:  # unpicklable result: report it instead of dying
                held.pop(job[0], None)
                message = "result could not be pickled:\n" + traceback.format_exc(limit=4)
                conn.send(("error", job[0], message))


class WorkerHandle:
    """What every backend's parent-side worker handle shares: the close protocol. A subclass
    provides ``conn``, ``proc`` and ``kill`` (end the worker now and release the pipe)."""

    def kill(self) -> None:
        """Kill the worker at once (its process or actor)."""
        raise NotImplementedError

    def request_close(self) -> None:
        """Ask the worker to exit after its current job (no wait)."""
        try:
            self.conn.send(("close",))
        except (OSError, BrokenPipeError, ValueError):
            pass

    def close(self, timeout: float = 2.0) -> None:
        """Ask the worker to exit, wait up to ``timeout`` s, then ``kill`` whatever is left."""
        self.request_close()
        self.proc.join(timeout=timeout)
        self.kill()


class _Worker(WorkerHandle):
    """One worker process and its pipe. ``start`` returns at once; ``wait_ready`` blocks until
    the worker built its environment, so a pool starts its workers in parallel."""

    def __init__(self, ctx, env_factory, params, slots: range):
        self.slots = slots
        self.pid = None
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main,
            args=(child_conn, env_factory, params, os.getpid()),
            daemon=True,
            name=f"jaxdm-env-worker[{slots.start}:{slots.stop}]",
        )
        self.proc.start()
        child_conn.close()
        self.conn = parent_conn

    def wait_ready(self, deadline: float) -> "_Worker":
        slots = self.slots
        if not self.conn.poll(max(0.0, deadline - time.monotonic())):
            self.kill()
            raise RuntimeError(f"env worker for slots {slots} did not start before start_timeout")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.kill()
            raise RuntimeError(
                f"env worker for slots {slots} died while building the environment "
                f"(exit code {self.proc.exitcode})"
            ) from None
        if status != "ready":
            self.kill()
            raise RuntimeError(f"env worker failed to build the environment:\n{payload}")
        self.pid = payload
        return self

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        try:
            self.conn.close()
        except OSError:
            pass


# Worker backends: name -> "module:Class" of the parent-side worker handle, imported on first
# use (so an optional engine such as Ray is needed only when chosen). A handle is built as
# ``Class(ctx, env_factory, params, slots, **backend_options)``, subclasses ``WorkerHandle``
# (``request_close``, ``close``) and offers ``conn`` (send/poll/recv of the job protocol of
# ``run_job``), ``proc`` (sentinel, is_alive, join, exitcode), ``pid``, ``wait_ready`` and
# ``kill``.
WORKER_BACKENDS: Registry[str] = Registry("worker backend")
WORKER_BACKENDS.register("process", "jaxdm.envs.vector:_Worker")
WORKER_BACKENDS.register("ray", "jaxdm.envs.ray_workers:RayWorker")


# The backend_options of backend "ray" (``jaxdm.envs.ray_workers.RayWorker``), the keys of a
# config's ``env.ray`` section: known without importing Ray, so a config is checked on load.
RAY_BACKEND_OPTIONS = ("address", "num_cpus", "resources", "actor_options")


def check_env_pool(backend: str, num_workers: int, ray: Any, where: str) -> None:
    """The env worker pool keys of a config section ``where`` (``backend``, ``num_workers``,
    ``ray``): named errors, checked on load without importing Ray."""
    WORKER_BACKENDS.validate(backend, field=f"{where}.backend")
    if not isinstance(ray, dict):
        raise ValueError(f"{where}.ray must be a mapping, got {type(ray).__name__}")
    unknown = sorted(set(ray) - set(RAY_BACKEND_OPTIONS))
    if unknown:
        raise ValueError(f"unknown config key(s) {[f'{where}.ray.{k}' for k in unknown]}; "
                         f"known: {list(RAY_BACKEND_OPTIONS)}")
    if ray and backend != "ray":
        raise ValueError(f"{where}.ray is set but {where}.backend is {backend!r}; "
                         f"set {where}.backend=ray")
    if backend == "ray" and num_workers < 1:
        raise ValueError(f"{where}.backend=ray needs {where}.num_workers >= 1 (0 steps "
                         "in-process)")


def worker_backend(name: str) -> type:
    """The worker handle class of backend ``name`` (see ``WORKER_BACKENDS``)."""
    module_name, attr = WORKER_BACKENDS.get(name, field="backend").split(":")
    return getattr(importlib.import_module(module_name), attr)


# ---------------------------------------------------------------------------------------
# Parent-side job bookkeeping (episodes: jaxdm.envs.recorder)
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Batch:
    """Jobs in flight: worker -> unanswered slots (in send order), deadlines, results."""

    kind: str
    jobs: dict
    pending: dict = dataclasses.field(default_factory=dict)
    deadlines: dict = dataclasses.field(default_factory=dict)
    results: dict = dataclasses.field(default_factory=dict)


_LIVE: "weakref.WeakSet[VectorEnv]" = weakref.WeakSet()


@atexit.register
def _close_all_live() -> None:
    for venv in list(_LIVE):
        try:
            venv.close()
        except Exception:
            pass


class VectorEnv(RecordedPool):
    """Batched ``reset``/``step`` of ``num_envs`` text-env episodes over worker processes.

    Args:
      env_factory: ``EnvFactory``, ``"module:callable"`` string, or picklable top-level
        callable returning an ``Environment`` (built once in every worker).
      num_envs: batch size B (slots).
      num_workers: worker processes; each owns a contiguous slice of slots
        (``slot_ranges``); capped at ``num_envs``.
      group_size: G; slot ``i`` gets task ``seed + i // G``. ``num_envs`` must divide by G.
      auto_reset: start a new episode in a slot as soon as its episode ends.
      step_timeout: seconds one env step (or reset) may take before its worker is killed.
      params: env params passed to every ``reset``/``step`` (None: the env's defaults).
      max_steps: optional extra cap on actions per episode (truncates; None: the env's own).
      start_method: ``"spawn"`` (default) or ``"forkserver"``; never ``fork``.
      start_timeout: seconds a worker may take to build (and warm up) its environment.
      env_name: recorded as ``Trajectory.env`` unless the env's ``reset_info`` gives "env".
      backend: ``"process"`` (local worker processes) or ``"ray"`` (Ray actors, possibly on
        other machines; ``pip install jaxdm[ray]``); see ``WORKER_BACKENDS``.
      backend_options: keyword arguments of the backend's worker (Ray: ``num_cpus``,
        ``actor_options``); none for ``"process"``.

    ``reset(seed) -> (observations, infos)``; ``step(actions) -> BatchStep(observations,
    rewards [B] float32, dones [B] bool, infos)``; finished episodes accumulate in
    ``trajectories`` (``pop_trajectories()`` drains them).
    """

    steps_in_background = True  # between step_async and step_wait the workers step

    def __init__(
        self,
        env_factory: Any,
        num_envs: int,
        num_workers: int = 2,
        *,
        group_size: int = 1,
        auto_reset: bool = False,
        step_timeout: float = 30.0,
        params: Any = None,
        max_steps: int | None = None,
        start_method: str = "spawn",
        start_timeout: float = 120.0,
        env_name: str = "",
        backend: str = "process",
        backend_options: Mapping[str, Any] | None = None,
    ):
        # checks num_envs, group_size and max_steps
        self.recorder = EpisodeRecorder(num_envs, group_size=group_size, env_name=env_name,
                                        max_steps=max_steps, auto_reset=auto_reset)
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if not step_timeout > 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout!r}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(
                f"start_method must be 'spawn' or 'forkserver' (forking a process that may run "
                f"JAX threads is unsafe), got {start_method!r}"
            )
        self.num_envs = num_envs
        self.num_workers = min(num_workers, num_envs)
        self.group_size = group_size
        self.num_groups = num_envs // group_size
        self.auto_reset = auto_reset
        self.step_timeout = float(step_timeout)
        self.params = params
        self.max_steps = max_steps
        self.env_name = env_name
        self._factory = _as_factory(env_factory)
        try:
            pickle.dumps(params)
        except Exception as e:
            raise TypeError(f"params cannot be pickled for worker processes: {e}") from None
        self._ctx = mp.get_context(start_method)
        self._worker_cls = worker_backend(backend)
        self.backend = backend
        if backend == "process" and backend_options:
            raise ValueError(f"backend 'process' takes no backend_options, got {backend_options!r}")
        self._backend_options = dict(backend_options or {})
        self._start_timeout = start_timeout
        self._closed = False
        # Each slot's state carries a tag; ``_synced[i]`` says its worker holds that state.
        self._tags = [0] * num_envs
        self._next_tag = 1
        self._synced = [False] * num_envs
        self._in_flight = None  # (batch, actions) between step_async and step_wait
        self.num_worker_restarts = 0
        bounds = [i * num_envs // self.num_workers for i in range(self.num_workers + 1)]
        self._slot_ranges = [range(bounds[w], bounds[w + 1]) for w in range(self.num_workers)]
        self._workers: list[_Worker] = []
        try:
            # Start every worker first, then wait: environments build in parallel.
            self._workers = [self._worker_cls(self._ctx, self._factory, self.params, r,
                                              **self._backend_options)
                             for r in self._slot_ranges]
            deadline = time.monotonic() + self._start_timeout
            for w in self._workers:
                w.wait_ready(deadline)
        except BaseException:
            self.close()
            raise
        _LIVE.add(self)

    # ---- public API ----------------------------------------------------------------------
    @property
    def worker_pids(self) -> list[int]:
        """Process id of each worker (slot ranges in ``slot_ranges``)."""
        return [w.pid for w in self._workers]

    @property
    def slot_ranges(self) -> list[range]:
        """The env slots each worker holds, in worker order."""
        return list(self._slot_ranges)

    def step_async(self, actions: Sequence[Any]) -> None:
        """Send the actions to the workers and return at once, so the caller can work (e.g.
        run the policy on another batch) while the environments step; then ``step_wait``.

        ``actions[i] is None`` means "do not step slot ``i`` now": its episode stays as it
        is, and ``step_wait`` reports it with ``infos[i]["skipped"] = True``, its current
        observation, reward 0 and its current done flag. Per-step env keys depend only on a
        slot's own task and step count, so skipping other slots never changes a slot's
        trajectory. This is what a two-half pipeline steps with: half A's actions (``None``
        for half B) go out, the policy runs on half B, then ``step_wait``, and so on. One
        step is in flight at a time.
        """
        self._check_open()
        if self._in_flight is not None:
            raise RuntimeError("step_async called twice without step_wait")
        if not self.recorder.started:
            raise RuntimeError("VectorEnv.step called before reset()")
        actions = check_actions(actions, self.num_envs)
        jobs = {}
        for i, key in self.recorder.stepping(actions).items():
            tag_before = self._tags[i]
            jobs[i] = (i, tag_before, self._new_tag(i), actions[i], key)
        self._in_flight = (self._dispatch("step", jobs), actions)

    def step_wait(self) -> BatchStep:
        """Collect the step started by ``step_async`` (see ``step``)."""
        self._check_open()
        if self._in_flight is None:
            raise RuntimeError("step_wait called without step_async")
        batch, actions = self._in_flight
        try:
            results = self._collect(batch)
        finally:
            self._in_flight = None
        return self.recorder.collect(actions, results, self._run_resets)

    def close(self) -> None:
        """Stop every worker (idempotent); leaves no child processes behind."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:  # ask all to exit first, then join: shutdown in parallel
            w.request_close()
        for w in self._workers:
            w.close()
        self._workers = []
        _LIVE.discard(self)

    def __enter__(self) -> "VectorEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- internals -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("VectorEnv is closed")

    def _new_worker(self, slots: range) -> _Worker:
        worker = self._worker_cls(self._ctx, self._factory, self.params, slots,
                                  **self._backend_options)
        return worker.wait_ready(time.monotonic() + self._start_timeout)

    def _new_tag(self, slot: int) -> int:
        self._tags[slot] = self._next_tag
        self._next_tag += 1
        return self._tags[slot]

    def _wire_job(self, kind: str, job: tuple) -> tuple:
        """A step job carries the state only if the slot's worker does not hold it."""
        if kind != "step":
            return job
        i, tag_before, tag_after, action, key = job
        state = None if self._synced[i] else self.recorder.episodes[i].state
        return (i, tag_before, tag_after, state, action, key)

    def _replace_worker(self, w_idx: int) -> None:
        for i in self._slot_ranges[w_idx]:
            self._synced[i] = False
        self._workers[w_idx].kill()
        self._workers[w_idx] = self._new_worker(self._slot_ranges[w_idx])
        self.num_worker_restarts += 1

    def _run_resets(self, seeds: Mapping[int, int]) -> dict[int, tuple]:
        """Reset the slots of ``seeds`` (slot -> task seed) on their workers."""
        return self._run("reset", {i: (i, self._new_tag(i), s) for i, s in seeds.items()})

    def _run(self, kind: str, jobs: Mapping[int, tuple]) -> dict[int, tuple]:
        """Run jobs (slot -> job tuple) on the workers owning the slots; see ``_collect``."""
        return self._collect(self._dispatch(kind, jobs))

    def _dispatch(self, kind: str, jobs: Mapping[int, tuple]) -> "_Batch":
        """Send each worker the jobs of its slots (returns at once)."""
        batch = _Batch(kind, dict(jobs))
        for w_idx, r in enumerate(self._slot_ranges):
            slots = [i for i in r if i in jobs]
            if slots:
                batch.pending[w_idx] = slots
        for w_idx in list(batch.pending):
            # A worker that died while idle (or whose pipe breaks before the jobs go out) has
            # not seen them: the parent holds every slot's state, so the jobs go to a
            # replacement unchanged and no episode is lost. Only a second failure fails a job.
            if not self._workers[w_idx].proc.is_alive():
                self._replace_worker(w_idx)
            for attempt in range(2):
                try:
                    self._send(batch, w_idx)
                    break
                except (OSError, BrokenPipeError, ValueError):
                    self._replace_worker(w_idx)
            else:
                self._fail_head(batch, w_idx, "env worker pipe broken before send (twice)")
                self._restart_and_resend(batch, w_idx)
        return batch

    def _send(self, batch: "_Batch", w_idx: int) -> None:
        wire = [self._wire_job(batch.kind, batch.jobs[i]) for i in batch.pending[w_idx]]
        self._workers[w_idx].conn.send((batch.kind, wire))
        batch.deadlines[w_idx] = time.monotonic() + self.step_timeout

    def _collect(self, batch: "_Batch") -> dict[int, tuple]:
        """Wait for every job of ``batch``: slot -> ("ok", payload) or ("error", message).

        A worker that dies or exceeds ``step_timeout`` on a job fails that job only; it is
        replaced and its remaining jobs are re-sent to the replacement.
        """
        pending, kind = batch.pending, batch.kind
        while pending:
            by_handle = {}
            for w_idx in pending:
                w = self._workers[w_idx]
                by_handle[w.conn] = w_idx
                by_handle[w.proc.sentinel] = w_idx
            timeout = max(0.0, min(batch.deadlines[w] for w in pending) - time.monotonic())
            ready = _wait_ready(list(by_handle), timeout=timeout)
            handled = set()
            for h in ready:
                w_idx = by_handle[h]
                if w_idx in handled or w_idx not in pending:
                    continue
                handled.add(w_idx)
                w = self._workers[w_idx]
                try:
                    while w.conn.poll():
                        status, slot, payload = w.conn.recv()
                        batch.results[slot] = (status, payload)
                        self._synced[slot] = status == "ok"
                        pending[w_idx].remove(slot)
                        batch.deadlines[w_idx] = time.monotonic() + self.step_timeout
                        if not pending[w_idx]:
                            break
                except Exception:  # EOF or a message cut short by a dying worker
                    pass
                if not pending[w_idx]:
                    del pending[w_idx]
                elif not w.proc.is_alive():
                    w.proc.join(timeout=1)
                    self._fail_head(batch, w_idx, f"env worker (pid {w.pid}) died during {kind} "
                                                  f"(exit code {w.proc.exitcode})")
                    self._restart_and_resend(batch, w_idx)
            now = time.monotonic()
            for w_idx in list(pending):
                # A reply that arrived while this loop was busy (e.g. replacing another
                # worker) is read first: only a worker that has not answered is hung.
                if now >= batch.deadlines[w_idx] and not self._workers[w_idx].conn.poll():
                    self._fail_head(batch, w_idx,
                                    f"env {kind} exceeded step_timeout={self.step_timeout}s; "
                                    f"worker (pid {self._workers[w_idx].pid}) killed")
                    self._restart_and_resend(batch, w_idx)
        return batch.results

    def _fail_head(self, batch: "_Batch", w_idx: int, message: str) -> None:
        slot = batch.pending[w_idx].pop(0)
        batch.results[slot] = ("error", message)
        self._synced[slot] = False

    def _restart_and_resend(self, batch: "_Batch", w_idx: int) -> None:
        self._replace_worker(w_idx)
        if batch.pending.get(w_idx):
            self._send(batch, w_idx)
        else:
            batch.pending.pop(w_idx, None)


def make_vector_env(env_factory: Any, num_envs: int, **kwargs) -> VectorEnv:
    """Convenience constructor (same arguments as ``VectorEnv``)."""
    return VectorEnv(env_factory, num_envs, **kwargs)
