"""The RL trainer on JAX's multi-controller runtime: P processes train like one.

Start every process with the same config; ``jaxdm.models.sharding.initialize_distributed``
(coordinator address, process count and id from flags or ``JAX_COORDINATOR_ADDRESS`` /
``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``; SLURM and TPU pods detected by JAX) connects
them. The trainer talks to processes through one seam, ``Trainer.dist`` (``make``): a
``SingleProcess`` for one process (every method the one-process computation, so a
one-process run takes exactly the code path it took before), ``LocalCopyProcess`` with
``act_on_local_copy``, ``Distributed`` for P processes; the run with
P processes is the one-process run with the same global batch: the same episodes (bit for
bit), the same mini-batches; only the data-parallel gradient sum is split over devices. The
exact one-process reference is one process on the same N devices with ``act_on_local_copy``
(it acts on a 1-device copy of the parameters as every process does, ``LocalCopy``, and
updates with the same N-device SPMD program): ``tests/rl/test_rl_multihost.py`` (2 CPU
processes on 127.0.0.1, killed in both processes after the first checkpoint and resumed)
ends with its parameters to the last bit (max |Δ| = 0). Plain one-process runs differ in the
last bits of one stage: on 1 device the gradient sum (2.7e-6 after AdamW, which enlarges
last-bit differences where a gradient is near its eps), on N devices the acting on
FSDP-sharded parameters (π_old is the sampling log-prob; 4.4e-6). The design:

- **Tasks.** Process p plays the groups ``process_rows(tasks_per_iter)`` (a contiguous
  block of ``tasks_per_iter / P`` tasks, each ``group_size`` episodes) starting at task seed
  ``train_task_offset + cursor + first group``, so processes sample disjoint tasks and a
  GRPO/LVRL group never straddles two processes: advantages are computed per process on its
  own groups, with the one-process estimator (``num_groups`` = its groups).
- **Sampling.** The one-process rollout draws, per turn, Gumbel noise [D, N] from one key
  for all live episodes (row j = the j-th live slot; N = option slots). Each process keeps
  the same key chain and, per turn, all-gathers (live episodes, option bucket) of every
  process (one small ``process_allgather``); its live episodes are rows
  ``offset .. offset + n`` of the global turn and it draws exactly those rows of the
  global noise (``jaxdm.rl.policy.SampleWindow``; threefry noise is partitionable: element
  (i, k) depends on i * N + k only). So the union of the processes' episodes is the
  one-process rollout. A process whose episodes have all ended keeps answering the turn's
  all-gather with zeros until every process is done (``finish_rollout``). The option form
  only; the generative form samples with ``fold_in(key, process)`` (valid training, not
  the one-process samples).
- **Parameters for acting.** Rollouts and evaluation run process-locally on a replicated
  copy of the policy parameters on this process's first device (``act_params``: one
  all-gather per iteration); the update is one SPMD program over the global mesh.
- **Update.** Every process draws the same permutation of the *global* units (the host RNG
  is identical everywhere; units are numbered process after process, i.e. in the
  one-process order). The units (host token lists, small next to the model) are
  all-gathered once per iteration, so every process builds global mini-batch b
  (``order[b*m:(b+1)*m]``) exactly as one process would, and uploads only its block of rows
  (``jax.make_array_from_process_local_data`` via ``sharding.global_batch``): the update is
  the one-process update, as one SPMD program over the global mesh.
- **Files.** Metrics JSONL, progress bar, config dump and plots come from process 0 only
  (``is_main``); every process writes and restores its orbax checkpoint shards; all read
  the same ``out_dir`` (a shared file system on several hosts). Episode metrics
  (``train/*``, ``adv/*``, ``env/errors``) are over all processes' episodes.
- **Batch statistics** over every process's rows: LVRL's ``rms`` scale (``lvrl_rms``) and
  GAE's mean/std (``gae_normalize``), the rows all-gathered in the one-process order, so
  the statistics are the one-process ones.
- **Critic.** Each process computes its units' values on a local copy of the critic
  (``critic_params``; one process with ``act_on_local_copy`` does the same); the global
  mini-batches carry the critic batch, ``returns``, ``old_values`` and ``row_mask``
  (``Distributed.mini_batches``). Checked by hand (``multihost_rl_worker.py`` with
  ``critic.kind=decoder algo.advantage=gae teacher.kind=none``, 2 processes vs one process
  on 2 devices): parameters and losses equal to the last bit; not in CI (time budget).
- **Not supported with P > 1 (refused at start, naming the key):** extra loss terms
  (``algo.terms``: the LVOPD gate and top-K lists are per batch),
  ``rollout_pipeline``, a mesh that does not span every process's devices, the JAX-env
  rollout (one jitted scan over the whole batch: ``jaxdm.rl.collect``). Signal counts
  and the teacher's failure fraction and score mean/std are over all processes
  (``signal_stats``: every process takes the same stop decision); other signal statistics
  are process 0's. Every process runs the held-out evaluation (the same episodes; process
  0 records them).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import pickle
import time
import types
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxdm import runlog
from jaxdm.models import sharding as sh
from jaxdm.rl import advantages as advmod
from jaxdm.rl.policy import SampleWindow, bucket
from jaxdm.rundir import lock_run_dir

__all__ = ["SingleProcess", "LocalCopyProcess", "Distributed", "make", "LocalCopy",
           "host_mini_batches", "RecordOnly", "allgather", "barrier", "gather_rows",
           "gather_objects", "is_main", "lvrl_rms", "gae_normalize"]


def is_main() -> bool:
    """Process 0 writes metrics, progress, config and plots."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here for the others (nothing with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class RecordOnly:
    """The metrics writer of processes other than 0: the same records, no file."""

    def __init__(self, path: Any = None, *, resume_step: int | None = None):
        del path, resume_step

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """The metrics record process 0 would write for ``step`` (step, time, the metrics made
        JSON-able), returned without writing it."""
        return {"step": int(step), "time": time.time(), **runlog.jsonable(dict(metrics))}

    def close(self) -> None:
        """Nothing to close (no file is held)."""
        pass


def allgather(x: Any) -> np.ndarray:
    """[P, ...]: ``x`` (a small host array, the same shape on every process) of every
    process, in process order. A collective: every process must call it."""
    return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def check_config(cfg, mesh) -> None:
    """Refuse settings a multi-process run does not support (see module docstring)."""
    algo = cfg.algo
    bad = []
    if algo.terms:
        bad.append(f"algo.terms={dict(algo.terms)!r}")
    if cfg.rollout_pipeline:
        bad.append("rollout_pipeline=true")
    if bad:
        raise ValueError(f"{jax.process_count()} processes: not supported across processes "
                         f"yet: {', '.join(bad)} (jaxdm.rl.distributed)")
    if mesh.devices.size != jax.device_count():
        raise ValueError(f"{jax.process_count()} processes: the mesh (mesh_data="
                         f"{cfg.mesh_data}, mesh_model={cfg.mesh_model}) holds "
                         f"{mesh.devices.size} of the {jax.device_count()} devices; it must "
                         f"span every process (mesh_data=-1)")


class SingleProcess:
    """The trainer's one seam for distribution (``Trainer.dist``, from ``make``): a run of one
    process on its mesh, every method what such a run does. ``LocalCopyProcess`` (one process
    acting as every process of a multi-process run does, ``act_on_local_copy``) and
    ``Distributed`` (P processes) override what differs; the trainer and the host rollout
    call only these methods, never ``jax.process_count``."""

    processes = 1
    is_main = True  # this process writes metrics, progress, config and plots

    def __init__(self, cfg, mesh):
        self.mesh = mesh
        self.first_task, self.local_tasks = 0, cfg.tasks_per_iter  # this process's groups

    # ---- the run folder ----------------------------------------------------------------
    def lock(self, out: Any):
        """The run folder's lock (``jaxdm.rundir.lock_run_dir``), a context manager."""
        return lock_run_dir(out, "out_dir")

    def barrier(self, name: str) -> None:
        """Every process waits here for the others."""

    def metrics_writer(self, path: Any, *, resume_step: int | None):
        """The metrics JSONL writer (``runlog.MetricsWriter``; ``RecordOnly`` off process 0)."""
        return runlog.MetricsWriter(path, resume_step=resume_step)

    # ---- acting ------------------------------------------------------------------------
    def act_params(self, tree: Any) -> Any:
        """The parameters rollouts and evaluation act with (here: the placed ``tree``)."""
        return tree

    def act_key(self, key: Any) -> Any:
        """The rollout's PRNG key as the acting parameters' device sees it."""
        return key

    def critic_params(self, tree: Any) -> Any:
        """A local copy of the critic's parameters for its per-unit values, or None: the
        placed ``tree`` with mesh-placed batches."""
        del tree
        return None

    def rollout_args(self, policy, params, seed: int, key) -> tuple[Any, Any, int, Any]:
        """(policy, params, first task seed, key) of this process's share of the rollout."""
        return policy, params, seed, key

    def finish_rollout(self) -> None:
        """After this process's rollout (a multi-process run answers the others' turns)."""

    def episodes_view(self, episodes: Sequence[Any]) -> list[Any]:
        """The episodes the episode metrics cover (every process's)."""
        return list(episodes)

    # ---- signals and advantages --------------------------------------------------------
    def signal_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The signals' statistics the stop decision reads (over every process)."""
        return stats

    def advantages(self, fn, eb, signals, algo, num_groups: int):
        """The estimator ``fn`` on this process's groups (batch statistics over every
        process's rows)."""
        return fn(eb, signals, algo, num_groups)

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` [n_p, ...] of every process, in process order."""
        return rows

    # ---- update ------------------------------------------------------------------------
    def put(self, tree: Any) -> Any:
        """Host arrays placed with their leading axis on the mesh's ``data`` axis."""
        def place(x):
            x = np.asarray(x)
            return jax.device_put(x, sh.batch_sharding(self.mesh, x.ndim))
        return jax.tree.map(place, tree)

    def unit_count(self, n_local: int) -> int:
        """The iteration's training units over every process (this process holds ``n_local``)."""
        return n_local

    def mini_batches(self, policy, units: Sequence[Any], unit_adv: np.ndarray,
                     unit_logp: np.ndarray, order: np.ndarray, m: int, *, critic: Any = None,
                     columns: dict[str, np.ndarray] | None = None, extra=None
                     ) -> tuple[list[dict[str, Any]], list[Any]]:
        """(batches, recorded log-probs) of the mini-batches ``order[b*m:(b+1)*m]`` of the
        units (``host_mini_batches``), placed on the mesh."""
        out = [(self.put(b), self.put(lp)) for b, lp in host_mini_batches(
            policy, units, unit_adv, unit_logp, order, m, critic=critic, columns=columns,
            extra=extra)]
        return [b for b, _ in out], [lp for _, lp in out]


class LocalCopyProcess(SingleProcess):
    """One process acting on a replicated copy of the policy on its first device
    (``LocalCopy``), as every process of a multi-process run does, and updating with the
    N-device program: the exact one-process reference of an N-process run."""

    def __init__(self, cfg, mesh):
        super().__init__(cfg, mesh)
        self._copy, self._critic_copy = LocalCopy(mesh), LocalCopy(mesh)

    def act_params(self, tree: Any) -> Any:
        """A replicated copy of the global ``tree`` on this process's first device (a
        collective; the last copy is reused for the same tree)."""
        return self._copy(tree)

    def act_key(self, key: Any) -> Any:
        """The PRNG key on this process's first device, where the local copy of the policy acts."""
        return LocalCopy.key(key)

    def critic_params(self, tree: Any) -> Any:
        """``act_params`` of the critic's parameters (their own cached copy)."""
        return self._critic_copy(tree)


class Distributed(LocalCopyProcess):
    """Per-run multi-process state of the trainer (see module docstring)."""

    def __init__(self, cfg, mesh):
        check_config(cfg, mesh)
        super().__init__(cfg, mesh)
        self.processes = jax.process_count()
        self.is_main = is_main()
        groups = sh.process_rows(cfg.tasks_per_iter, "tasks_per_iter")
        self.first_task, self.local_tasks = groups.start, len(groups)
        # the one-process rollout pads every turn to bucket(all slots) decisions
        self.window_rows = bucket(cfg.tasks_per_iter * cfg.group_size)

    # ---- the run folder: process 0 holds the lock and writes the files ------------------
    def lock(self, out: Any):
        """The run folder's lock, held by process 0 only (a lock that holds nothing on the
        others)."""
        return super().lock(out) if self.is_main else contextlib.nullcontext()

    def barrier(self, name: str) -> None:
        """Every process waits here for the others (multihost_utils.sync_global_devices under
        ``name``)."""
        barrier(name)

    def metrics_writer(self, path: Any, *, resume_step: int | None):
        """Process 0's MetricsWriter on ``path``; the other processes get a RecordOnly (same
        records, no file)."""
        if self.is_main:
            return super().metrics_writer(path, resume_step=resume_step)
        return RecordOnly(path, resume_step=resume_step)

    # ---- acting ------------------------------------------------------------------------
    def rollout_args(self, policy, params, seed: int, key) -> tuple[Any, Any, int, Any]:
        """This process's groups; the option form samples its rows of the one-process noise."""
        seed = seed + self.first_task
        if getattr(policy, "form", None) == "option":
            return _WindowedPolicy(policy, self), params, seed, key
        return policy, params, seed, jax.random.fold_in(key, jax.process_index())

    def turn(self, live: int, options: int) -> tuple[np.ndarray, np.ndarray]:
        """One rollout turn's all-gather: every process's (live episodes, option bucket)."""
        got = allgather(np.array([live, options], np.int64))
        return got[:, 0], got[:, 1]

    def finish_rollout(self) -> None:
        """Answer the other processes' turns with zeros until every process is done."""
        while True:
            live, _ = self.turn(0, 0)
            if not live.any():
                return

    def episodes_view(self, episodes: Sequence[Any]) -> list[Any]:
        """Every process's episodes as light stand-ins (error, success, reward, truncated,
        actions with ``valid``), in process order: the trainer's episode metrics then cover
        the whole global batch."""
        rows = np.array([[bool(e.error), bool(e.success), float(e.reward), bool(e.truncated),
                          len(e.actions), sum(not a.valid for a in e.actions)]
                         for e in episodes], np.float64).reshape(-1, 6)
        out = []
        for r in gather_rows(rows):
            n, bad = int(r[4]), int(r[5])
            acts = [types.SimpleNamespace(valid=i >= bad) for i in range(n)]
            out.append(types.SimpleNamespace(error="error" if r[0] else None,
                                             success=bool(r[1]), reward=float(r[2]),
                                             truncated=bool(r[3]), actions=acts))
        return out

    # ---- signals and advantages --------------------------------------------------------
    def signal_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """The signals' statistics over every process: counts (``*/requests``, ``*/missing``,
        ``*/errors``, ``*/retried``) summed, ``teacher/failure_frac`` and
        ``teacher/score_mean`` / ``_std`` recomputed from them (so every process takes the
        same failure decision); other keys are this process's. A collective."""
        every = gather_objects([stats])
        out = dict(stats)
        for k in stats:
            if k.endswith(("/requests", "/missing", "/errors", "/retried")):
                out[k] = float(sum(s.get(k) or 0.0 for s in every))
        if "teacher/requests" in out and "teacher/missing" in out:
            req, miss = out["teacher/requests"], out["teacher/missing"]
            out["teacher/failure_frac"] = miss / req if req else 0.0
            parts = [(s["teacher/requests"] - s["teacher/missing"], s["teacher/score_mean"],
                      s["teacher/score_std"]) for s in every
                     if s.get("teacher/score_mean") is not None]
            n = sum(c for c, _, _ in parts)
            if n:
                mean = sum(c * m for c, m, _ in parts) / n
                var = sum(c * (sd * sd + m * m) for c, m, sd in parts) / n - mean * mean
                out["teacher/score_mean"], out["teacher/score_std"] = mean, max(var, 0.0) ** 0.5
        return out

    def advantages(self, fn, eb, signals, algo, num_groups: int):
        """The estimator ``fn`` on this process's groups (a group's advantages need no other
        process) with the batch statistics over every process's rows: LVRL's ``rms`` scale
        (``lvrl_rms``), GAE's normalisation (``gae_normalize``). A collective when there is
        such a statistic."""
        if algo.advantage in ("gae", "gae_shaped") and algo.gae_normalize:
            out = fn(eb, signals, dataclasses.replace(algo, gae_normalize=False), num_groups)
            return dataclasses.replace(out, adv=gae_normalize(out.adv, eb.mask, algo.eps))
        if not (algo.advantage == "lvrl" and algo.lvrl_normalize == "rms"):
            return fn(eb, signals, algo, num_groups)
        out = fn(eb, signals, dataclasses.replace(algo, lvrl_normalize="none"), num_groups)
        # the lvrl estimator's value rows: a real value and no env error
        rows = np.asarray(signals["values"].mask, bool) & ~np.asarray(eb.errored, bool)
        return dataclasses.replace(out, adv=lvrl_rms(out.adv, rows, eb.mask, algo.eps))

    def gather_rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` [n_p, ...] of every process concatenated in process order."""
        return gather_rows(rows)

    # ---- update: every process builds each global mini-batch, uploads its block ---------
    def unit_count(self, n_local: int) -> int:
        """The iteration's training units over every process: the all-gathered sum of each one's
        ``n_local``."""
        return int(allgather(np.int64(n_local)).sum())

    def mini_batches(self, policy, units: Sequence[Any], unit_adv: np.ndarray,
                     unit_logp: np.ndarray, order: np.ndarray, m: int, *, critic: Any = None,
                     columns: dict[str, np.ndarray] | None = None, extra=None
                     ) -> tuple[list[dict[str, Any]], list[Any]]:
        """The units, advantages, log-probs and ``columns`` of every process (numbered
        process after process: the one-process order), the one-process mini-batches of them,
        each a global array assembled from every process's block of rows. ``extra`` is
        refused across processes (``check_config``)."""
        if extra is not None:
            raise ValueError("extra mini-batch arrays (algo.terms) are per process")
        every = gather_objects(list(units))
        adv, logp = gather_rows(unit_adv), gather_rows(unit_logp)
        cols = {k: gather_rows(np.asarray(v, np.float32)) for k, v in (columns or {}).items()}
        p, count = jax.process_index(), jax.process_count()
        block = slice(p * m // count, (p + 1) * m // count)
        mbs, recorded = [], []
        for b, lp in host_mini_batches(policy, every, adv, logp, order, m, critic=critic,
                                       columns=cols):
            mbs.append(sh.global_batch(jax.tree.map(lambda x: np.asarray(x)[block], b),
                                       self.mesh))
            recorded.append(sh.global_batch(lp[block], self.mesh))
        return mbs, recorded


def make(cfg, mesh) -> SingleProcess:
    """The distribution seam of a run: ``Distributed`` with several processes,
    ``LocalCopyProcess`` with ``act_on_local_copy``, else ``SingleProcess``."""
    if jax.process_count() > 1:
        return Distributed(cfg, mesh)
    return (LocalCopyProcess if cfg.act_on_local_copy else SingleProcess)(cfg, mesh)


def host_mini_batches(policy, units: Sequence[Any], unit_adv: np.ndarray,
                      unit_logp: np.ndarray, order: np.ndarray, m: int, *, critic: Any = None,
                      columns: dict[str, np.ndarray] | None = None, extra=None
                      ) -> list[tuple[dict[str, Any], np.ndarray]]:
    """(host batch, recorded log-probs [m, 1]) of each mini-batch ``idx = order[s:s+m]`` of
    ``units`` (rows past ``len(idx)`` padding): ``policy`` (its ``training_batch``) and
    ``adv`` [m]; with a ``critic`` its batch, ``row_mask`` [m] and the per-unit ``columns``
    [m] (``returns``, ``old_values``); ``extra(idx)``: more arrays (the LVOPD gate's)."""
    out = []
    for s in range(0, len(order), m):
        idx = order[s:s + m]
        mb_units = [units[j] for j in idx]
        a = np.zeros((m,), np.float32)
        a[:len(idx)] = unit_adv[idx]
        batch = {"policy": policy.training_batch(mb_units, m), "adv": a}
        if extra is not None:
            batch.update(extra(idx))
        lp = np.zeros((m, 1), np.float32)
        lp[:len(idx), 0] = unit_logp[idx]
        if critic is not None:
            for k, col in (columns or {}).items():
                x = np.zeros((m,), np.float32)
                x[:len(idx)] = col[idx]
                batch[k] = x
            batch["row_mask"] = np.arange(m) < len(idx)
            batch["critic"] = critic.batch(mb_units, m)
        out.append((batch, lp))
    return out


@functools.lru_cache(maxsize=None)
def _replicate(sharding) -> Any:
    # one jitted identity per sharding (a new lambda per call would compile every iteration)
    return jax.jit(lambda tree: tree, out_shardings=sharding)


class LocalCopy:
    """``copy(tree)``: a replicated copy of the (mesh-placed) ``tree`` on this process's
    first device, the parameters every process of a multi-process run acts with; with one
    process (``act_on_local_copy``) the acting of such a run, for its reference. Needs every
    process (a collective); the last copy is reused for the same tree."""

    def __init__(self, mesh):
        self.mesh = mesh
        self._last: tuple[Any, Any] | None = None  # (placed tree, its local copy)

    def __call__(self, tree: Any) -> Any:
        if self._last is not None and self._last[0] is tree:
            return self._last[1]
        whole = _replicate(sh.replicated(self.mesh))(tree)
        local = jax.tree.map(lambda x: x.addressable_data(0), whole)
        self._last = (tree, local)
        return local

    @staticmethod
    def key(key: Any) -> Any:
        """The typed PRNG ``key`` (replicated on the mesh) on this process's first device."""
        data = jax.random.key_data(key).addressable_data(0)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


class _WindowedPolicy:
    """The policy as the rollout sees it in a multi-process run: ``act`` samples this
    process's rows of the global turn (``SampleWindow``); everything else is the policy's."""

    def __init__(self, policy, dist: Distributed):
        self._policy, self._dist = policy, dist

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def act(self, params, states, key, *, greedy: bool = False, pad_to: int | None = None):
        options = bucket(max(len(s.admissible) for s in states), 8)
        live, opts = self._dist.turn(len(states), options)
        p = jax.process_index()
        window = SampleWindow(int(live[:p].sum()), self._dist.window_rows, int(opts.max()))
        return self._policy.act(params, states, key, greedy=greedy, pad_to=pad_to,
                                window=window)


def gae_normalize(adv: np.ndarray, mask: np.ndarray, eps: float) -> np.ndarray:
    """This process's GAE advantages ``adv`` [B_p, T] normalised with the mean and std of
    every process's executed actions (gathered in the one-process order, so the estimator's
    one-process statistics; ``jaxdm.rl.estimators.gae``). A collective."""
    adv, mask = np.asarray(adv, np.float32), np.asarray(mask, bool)
    a = gather_rows(adv)[gather_rows(mask.astype(np.uint8)).astype(bool)]
    if not a.size:
        return adv
    return np.where(mask, (adv - a.mean()) / (a.std() + eps), 0.0).astype(np.float32)


def lvrl_rms(adv: np.ndarray, rows: np.ndarray, mask: np.ndarray, eps: float) -> np.ndarray:
    """This process's LVRL step advantages ``adv`` [B_p, T] (unnormalised; rows not in
    ``rows`` hold their GRPO fallback) with the ``rows`` divided by the ``rms`` scale of every
    process's value rows (``jaxdm.rl.advantages.rms_scale`` on the rows gathered in the
    one-process order: the one-process scale to the last bit). A collective."""
    adv = np.asarray(adv, np.float32)
    counted = np.asarray(mask, bool) & np.asarray(rows, bool)[:, None]
    every_adv, every_counted = gather_rows(adv), gather_rows(counted.astype(np.uint8))
    scale = advmod.rms_scale(every_adv, every_counted.astype(bool), eps)
    return np.where(np.asarray(rows, bool)[:, None], np.asarray(jnp.asarray(adv) / scale),
                    adv).astype(np.float32)


def gather_rows(rows: np.ndarray) -> np.ndarray:
    """Concatenation over processes of ``rows`` [n_p, ...] (n_p may differ). A collective."""
    rows = np.asarray(rows)
    counts = allgather(np.int64(rows.shape[0]))
    pad = np.zeros((int(counts.max()),) + rows.shape[1:], rows.dtype)
    pad[:rows.shape[0]] = rows
    every = allgather(pad)
    return np.concatenate([every[p, :int(c)] for p, c in enumerate(counts)])


def gather_objects(items: list[Any]) -> list[Any]:
    """Concatenation over processes of the lists ``items`` (picklable host data, e.g.
    training units: token id lists). A collective."""
    blob = np.frombuffer(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = allgather(np.int64(blob.size))
    # a power-of-two length: the all-gather program is compiled once per bucket, not per size
    pad = np.zeros((1 << max(int(sizes.max()) - 1, 1).bit_length(),), np.uint8)
    pad[:blob.size] = blob
    every = allgather(pad)
    out: list[Any] = []
    for p, size in enumerate(sizes):
        out.extend(pickle.loads(every[p, :int(size)].tobytes()))
    return out
