"""Ray backend of ``VectorEnv``: env workers as Ray actors (``VectorEnv(..., backend="ray")``).

Each worker of the pool is one Ray actor, so workers can live on other machines of a Ray
cluster (backend option ``address``, or ``ray.init(address=...)`` before building the
``VectorEnv``; without either Ray starts a local instance, or joins the cluster named by
``RAY_ADDRESS``; ``resources`` places each actor on nodes that offer them). The actor runs
exactly the job protocol of the process pool (``jaxdm.envs.vector.build_worker_env`` /
``run_job``: it builds the env once, keeps the latest state of each of its slots, replies per
job), and the parent
side is a handle with the process worker's interface, so ``VectorEnv``'s bookkeeping, fault
handling and step overlap are the same code for both backends:

* ``conn`` is a local pipe. A pump thread in the parent reads each batch from it, makes one
  actor call per job, and writes each reply back as soon as it arrives, so the parent still
  knows which job a failure interrupted. Calls go one at a time: a reply that has left the
  actor is only certain to arrive once the owner has it, so pipelining the calls would let a
  job that kills its actor take the previous job's reply with it.
* ``proc`` reports the actor's liveness: when a call fails because the actor died (killed,
  crashed, its node lost), the pump marks it dead and closes the pipe and the sentinel, which
  ``VectorEnv`` sees as a dead worker: that episode is returned truncated with
  ``info["error"]``, the actor is replaced and the rest of its slice re-sent. A hung step hits
  ``step_timeout`` in the parent, which calls ``kill`` (``ray.kill``).
* ``close``/``kill`` end the actor with ``ray.kill`` (no restart), so no actor outlives the
  pool; actors are owned by the driver, so Ray also ends them if the driver process dies.

Cost: each job is one actor call (about a millisecond of Ray overhead locally), so the Ray
backend pays off when env steps are slow or the host has too few cores for the workers;
``benchmarks/env_workers.py`` measures when.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from typing import Any, Mapping

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
except ImportError as e:  # the optional extra
    raise ImportError(
        "VectorEnv(backend='ray') needs Ray: pip install 'jaxdm[ray]'") from e

from jaxdm.envs.vector import WorkerHandle, build_worker_env, run_job


class EnvActor:
    """One env worker inside a Ray actor: builds the env, holds its slots' states, runs jobs."""

    def __init__(self, env_factory, params):
        self._params = params
        self._held: dict[int, tuple[int, Any]] = {}  # slot -> (tag, latest state)
        self._env, self._init_error = None, None
        try:
            self._env = build_worker_env(env_factory)
        except BaseException:  # reported by ready(), like the process worker's init_error
            self._init_error = traceback.format_exc()

    def ready(self) -> tuple:
        """("ready", (pid, host)) once the actor built its environment, else ("init_error", the
        traceback)."""
        if self._init_error is not None:
            return ("init_error", self._init_error)
        return ("ready", (os.getpid(), socket.gethostname()))

    def run(self, kind: str, job: tuple) -> tuple:
        """Run one pool job (reset, step, ...) on the actor's env slots; the job's reply."""
        return run_job(self._env, self._params, self._held, kind, job)

    def watch(self) -> None:
        """Never returns: its pending result fails when the actor dies, which tells the parent
        that an idle actor is gone without calling it (see ``ActorLiveness.is_alive``)."""
        threading.Event().wait()


# Actors are never restarted by Ray: VectorEnv replaces a dead worker itself (and fails the
# one episode that was stepping), exactly as with processes. Two threads: one blocks in
# ``watch`` for the actor's lifetime, the other runs the jobs (one at a time).
RemoteEnvActor = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=2)(EnvActor)


class ActorLiveness:
    """The ``proc`` of a Ray worker handle: what ``VectorEnv`` asks of a worker process."""

    def __init__(self):
        self.sentinel, self._sentinel_w = os.pipe()  # readable (EOF) once the actor is gone
        self.exitcode: str | None = None  # why the actor ended, once it has
        self._alive = True
        self._lock = threading.Lock()  # the pump and the parent may both end it
        self.thread: threading.Thread | None = None
        self.watch = None  # the actor's pending ``watch`` call, once it is running

    def is_alive(self) -> bool:
        """False once the pump saw the actor die, or Ray failed its ``watch`` call (an actor
        killed while idle: ``VectorEnv`` then replaces it before sending it jobs)."""
        if self._alive and self.watch is not None and ray.wait([self.watch], timeout=0)[0]:
            self.mark_dead("Ray actor died while idle")
        return self._alive

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the liveness thread to end (not from that thread
        itself)."""
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def mark_dead(self, reason: str) -> None:
        """Called once by the pump thread, before it closes the pipe."""
        with self._lock:
            if self._alive:
                self.exitcode, self._alive = reason, False
                os.close(self._sentinel_w)

    def close(self) -> None:
        """Release the sentinel (after the handle is no longer waited on)."""
        self.mark_dead("closed")
        with self._lock:
            if self.sentinel is not None:
                os.close(self.sentinel)
                self.sentinel = None


class RayWorker(WorkerHandle):
    """Parent-side handle of one env worker running as a Ray actor (``VectorEnv`` backend
    ``"ray"``); same interface as the process worker (``close`` is ``WorkerHandle``'s).

    Args:
      ctx: the multiprocessing context (only its ``Pipe`` is used, for the local pipe).
      env_factory, params: as for ``VectorEnv``; sent to the actor (Ray pickles them).
      slots: the slots this worker owns.
      address: the Ray cluster to join (``connect``); None: the driver's connection, else
        ``RAY_ADDRESS`` or a new local instance.
      num_cpus: CPUs the actor reserves in Ray's scheduler (default 1: an env worker keeps
        one core busy).
      resources: custom resources the actor reserves (e.g. ``{"env_node": 1}`` to run the
        workers on the nodes started with that resource).
      actor_options: further ``ray.remote`` options for the actor (``scheduling_strategy``,
        ``runtime_env``, ...).

    These are ``VectorEnv``'s ``backend_options`` for ``"ray"`` (``vector.RAY_BACKEND_OPTIONS``),
    a config's ``env.ray`` section.
    """

    def __init__(self, ctx, env_factory, params, slots: range, *, address: str | None = None,
                 num_cpus: float = 1, resources: Mapping[str, float] | None = None,
                 actor_options: Mapping[str, Any] | None = None):
        if not isinstance(num_cpus, (int, float)) or isinstance(num_cpus, bool) or num_cpus < 0:
            raise ValueError(f"backend_options num_cpus must be a number >= 0, got {num_cpus!r}")
        if resources is not None and not (
                isinstance(resources, Mapping) and all(
                    isinstance(k, str) and isinstance(v, (int, float))
                    and not isinstance(v, bool) and v >= 0 for k, v in resources.items())):
            raise ValueError(f"backend_options resources must map resource names to numbers "
                             f">= 0, got {resources!r}")
        options = dict(actor_options or {})
        for key in ("num_cpus", "resources", "max_restarts", "max_task_retries"):
            if key in options:
                raise ValueError(
                    f"backend_options actor_options must not set {key!r} (num_cpus and "
                    "resources are their own options; VectorEnv replaces dead workers itself)")
        if resources:
            options["resources"] = dict(resources)
        connect(address)
        self.slots = slots
        self.pid: int | None = None
        self.node: str | None = None
        self.conn, self._peer = ctx.Pipe(duplex=True)
        self.proc = ActorLiveness()
        self.actor = RemoteEnvActor.options(
            num_cpus=num_cpus, name=None, **options).remote(env_factory, params)
        self._closed = False

    # ---- start -----------------------------------------------------------------------------
    def wait_ready(self, deadline: float) -> "RayWorker":
        """Wait until ``deadline`` for the actor to build its environment, then start the thread
        that forwards its replies; a timeout or a build error kills the actor and raises
        RuntimeError with the cause."""
        slots = self.slots
        ref = self.actor.ready.remote()
        try:
            status, payload = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except GetTimeoutError:
            self.kill()
            raise RuntimeError(
                f"env worker (Ray actor) for slots {slots} did not start before start_timeout"
            ) from None
        except RayActorError as e:
            self.kill()
            raise RuntimeError(
                f"env worker (Ray actor) for slots {slots} died while building the "
                f"environment (is the env factory importable on the Ray workers?):\n{e}"
            ) from None
        if status != "ready":
            self.kill()
            raise RuntimeError(f"env worker (Ray actor) failed to build the environment:\n"
                               f"{payload}")
        self.pid, self.node = payload
        self.proc.watch = self.actor.watch.remote()
        thread = threading.Thread(target=self._pump, daemon=True,
                                  name=f"jaxdm-ray-pump[{slots.start}:{slots.stop}]")
        self.proc.thread = thread
        thread.start()
        return self

    # ---- the pump: pipe <-> actor calls ------------------------------------------------------
    def _pump(self) -> None:
        conn, reason = self._peer, "closed"
        try:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    break  # the parent closed its end
                if msg[0] == "close":
                    break
                kind, jobs = msg
                # One call at a time: a job's reply reaches the parent before the next job
                # starts, so a job that kills its actor cannot take an earlier job's reply
                # (still in Ray's send queue) down with it.
                for job in jobs:
                    try:
                        reply = ray.get(self.actor.run.remote(kind, job))
                    except RayActorError as e:  # killed, crashed, node lost
                        reason = f"Ray actor died: {_first_line(e)}"
                        return
                    except RayTaskError as e:  # e.g. the result could not be serialised
                        reply = ("error", job[0], f"{kind} failed in the Ray actor:\n{e}")
                    except RayError as e:  # anything else Ray reports: treat the actor as lost
                        reason = f"Ray actor lost: {_first_line(e)}"
                        return
                    conn.send(reply)
        except (OSError, BrokenPipeError, EOFError):
            pass  # the parent closed its end while a reply was on its way
        finally:
            self.proc.mark_dead(reason)  # before closing the pipe: EOF implies not alive
            _kill_actor(self.actor)
            try:
                conn.close()
            except OSError:
                pass

    # ---- stop ------------------------------------------------------------------------------
    def kill(self) -> None:
        """End the actor now (``ray.kill``), stop the pump and release the pipe."""
        if self._closed:
            return
        self._closed = True
        _kill_actor(self.actor)  # unblocks a pump waiting on a call
        self.conn.close()  # unblocks a pump waiting on the pipe (EOF); it closes its own end
        if self.proc.thread is None:  # never started: nobody else owns the other end
            self._peer.close()
        self.proc.join(timeout=5)
        self.proc.close()


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address`` ("host:port" of its head, "auto" or "ray://...")
    unless this driver is connected; None: keep the connection, else ``ray.init()``'s default.
    A driver already connected to another "host:port" is a named error, not a silent switch."""
    if address is not None and (not isinstance(address, str) or not address):
        raise ValueError(f"backend_options address must be a Ray address string, got "
                         f"{address!r}")
    if not ray.is_initialized():
        ray.init(address=address)
        return
    if address is None or address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    try:
        wanted = f"{socket.gethostbyname(host)}:{port}"
    except OSError as e:
        raise ValueError(f"backend_options address {address!r}: cannot resolve {host!r} "
                         f"({e})") from None
    current = ray.get_runtime_context().gcs_address
    if current != wanted:
        raise ValueError(f"backend_options address {address!r}: this process is already "
                         f"connected to the Ray cluster at {current}")


def _kill_actor(actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone, or Ray shut down
        pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
