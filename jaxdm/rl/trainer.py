"""The RL trainer: a loop over registered stages (seed 000 Algorithm 1; seed 001's PPO/LVRL).

One iteration, from the previous ``TrainState`` (``jaxdm.rl.state``) to the next:
  1. **Rollout**: take the next ``tasks_per_iter`` training tasks (the data cursor) and play
     ``group_size`` episodes each with the policy kind's rollout kind (``jaxdm.rl.collect``:
     ``host`` text envs through ``jaxdm.rl.rollout``, ``jax``: one jitted scan over a
     vmapped JAX env, ``jaxdm.rl.jax_rollout``, or ``harness``: a decision model inside the
     agent harness, ``jaxdm.train.harness_rollout``); ``EpisodeBatch`` is their array view
     (``jaxdm.rl.estimators``; episodes lost to env errors are masked, ``env/errors``).
  2. **Signals** (``jaxdm.rl.signals``): the estimator's and the loss terms' signals only —
     teacher scores per action (``jaxdm.roles.jobs.score_trajectories`` on a
     ``make_backend`` backend), the critic's values, the LVRL value model's values, the
     LVOPD teacher's top-K_T lists. A teacher failure is a missing score;
     more than ``teacher.max_failed_share`` of failures in one iteration (after asking the
     failed requests again ``teacher.retries`` times) stops the run loudly.
  3. **Advantages**: the registered estimator (``grpo``, ``teacher``, ``gigpo``, ``gae``,
     ``lvrl``).
  4. **Update**: π_old / π_ref log-probs, then PPO mini-batch steps of the weighted loss
     terms (``jaxdm.rl.terms``: ``ppo``, ``value``, ``lvopd``, ...), jitted under a ("data",
     "model") mesh. With ``lvopd`` the gate (``algo.lvopd_gate``) is computed once over the
     whole iteration batch on the host and each mini-batch gets its ``lvopd/*`` arrays
     (``jaxdm.rl.lvopd.LVOPDBatcher``, from the ``teacher_topk`` signal). A non-finite
     loss term or gradient stops the run naming the iteration and term.
  5. The new state replaces the old only now; JSONL metrics, progress bar, periodic orbax
     checkpoints of the whole state.

Run folder (``run_layout``, ``jaxdm.rundir``: refuse / resume / overwrite): a resume drops a
torn last metrics line, never writes the final evaluation twice, and loads a checkpoint with
NaN/inf tensors only with ``on_nonfinite_checkpoint=warn``. Ctrl-C, kill or an error
checkpoint the last *finished and recorded* iteration, so resuming is exact. Processes: every
step that differs with several (or ``act_on_local_copy``) goes through one seam,
``self.dist`` (``jaxdm.rl.distributed.make``).
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxdm import config as cfgmod
from jaxdm import rundir, runlog
from jaxdm.rl import build, distributed, sharding
from jaxdm.rl.checkpoint import Checkpointer
from jaxdm.rl.errors import NonFiniteLossError, TeacherFailureError, TrainingStopped
from jaxdm.rl.estimators import ESTIMATORS, EpisodeBatch
from jaxdm.rl.lvopd import LVOPDBatcher
from jaxdm.rl.signals import SIGNALS
from jaxdm.rl.state import TrainState, check_restored, from_checkpoint, place_key, to_checkpoint
from jaxdm.rl.terms import StepSpec, cached_train_step, signals_needed
from jaxdm.rl.train_config import (AlgoSection, CriticSection, EnvSection,  # noqa: F401
                                   ModelSection, OptimSection, PolicySection, TeacherSection,
                                   RUN_CHANGING_EXEMPT, TrainConfig, nested_items)

__all__ = ["TrainConfig", "Trainer", "train_run", "run_layout"]

_LOSS_KEYS = ("loss/pg", "loss/kl", "loss/entropy", "loss/value", "loss/total")


class Trainer:
    """Runs the stage loop for a ``TrainConfig`` (see module docstring)."""

    def __init__(self, cfg: TrainConfig, *, mesh=None, log: bool = True):
        self.cfg, self.log = cfg, log
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.mesh = mesh if mesh is not None else sharding.make_mesh(cfg.mesh_data,
                                                                     cfg.mesh_model)
        if cfg.algo.mini_batch % self.mesh.devices.shape[0]:
            raise ValueError(f"algo.mini_batch={cfg.algo.mini_batch} must divide by the mesh "
                             f"data axis ({self.mesh.devices.shape[0]} devices)")
        # [MULTIHOST] the one seam for processes: tasks/rows, acting copies, collectives
        self.dist = distributed.make(cfg, self.mesh)
        self.train_factory, self.eval_factory = build.env_factories(cfg)
        self.policy, params, self.model_config, self.tokenizer = build.build_policy(
            cfg, self.train_factory, self.eval_factory)
        self.critic_config, critic = build.build_critic(cfg, self.policy)
        spec = StepSpec(self.policy.static_key, self.critic_config, cfg.optim, cfg.critic.lr,
                        cfg.loss_config())
        self.train_step, self.logp_fn, self.txs = cached_train_step(self.policy, spec)
        if log and self.dist.is_main:  # per-device memory before placing
            print(sharding.memory_line(params, self.txs["policy"], self.mesh), flush=True)
        rep = sharding.replicated(self.mesh)
        params = {"policy": sharding.shard_params(params, self.mesh)}
        opts = {"policy": sharding.shard_params(self.txs["policy"].init(params["policy"]),
                                                self.mesh)}
        if critic is not None:
            params["critic"] = jax.device_put(critic, rep)
            opts["critic"] = jax.device_put(self.txs["critic"].init(params["critic"]), rep)
        # [MULTIHOST] the step's outputs keep these shardings: one compile, not two
        self.train_step = sharding.keep_shardings(self.train_step, params, opts)
        # The frozen reference policy is the initial policy (rebuilt identically on resume).
        self.ref_params = params["policy"]
        self.state = TrainState(params, opts, place_key(jax.random.key(cfg.seed), rep),
                                0, 0, np.random.default_rng(cfg.seed))
        self.signal_backends = {n: SIGNALS.get(n).build(cfg, self) for n in signals_needed(cfg)}
        self.collector = build.make_collector(
            cfg, self.policy, self.train_factory, self.eval_factory, dist=self.dist,
            with_values=cfg.value.get("kind") == "oracle")
        self.checkpointer = Checkpointer(self.out / "checkpoints",
                                         max_to_keep=cfg.keep_checkpoints)

    # ---- views of the state ---------------------------------------------------------------
    params = property(lambda self: self.state.params["policy"])
    iteration = property(lambda self: self.state.iteration)
    cursor = property(lambda self: self.state.cursor)
    venv = property(lambda self: getattr(self.collector, "venv", None))  # host rollout's pool

    # ---- checkpoints --------------------------------------------------------------------
    def save(self) -> None:
        """Checkpoint the current TrainState under its iteration (orbax arrays plus the host
        record)."""
        arrays, host = to_checkpoint(self.state)
        self.checkpointer.save(self.state.iteration, arrays, host)

    def restore(self, step: int | None = None) -> bool:
        """Restore the latest (or given) checkpoint; False when there is none."""
        if step is None and self.checkpointer.latest_step() is None:
            return False
        target, _ = to_checkpoint(self.state)
        arrays, host, step = self.checkpointer.restore(target, step)
        check_restored(arrays, step, self.cfg.on_nonfinite_checkpoint)
        self.state = from_checkpoint(arrays, host, sharding.replicated(self.mesh))
        return True

    # ---- one iteration ------------------------------------------------------------------
    def critic_state_values(self, units) -> np.ndarray:
        """V(s) [N] of the states of ``units`` under the current critic (mini-batch chunks)."""
        m, out = self.cfg.algo.mini_batch, []
        params = self.state.params["critic"]
        local = self.dist.critic_params(params)  # [MULTIHOST] None: the placed params
        for s in range(0, len(units), m):
            chunk = units[s:s + m]
            batch = self.critic_config.batch(chunk, m)
            if local is None:
                v = self.critic_config.values(params, self.dist.put(batch))
            else:
                v = self.critic_config.values(local, batch)
            out.append(np.asarray(v)[:len(chunk)])
        return np.concatenate(out) if out else np.zeros((0,), np.float32)

    def iteration_step(self) -> dict[str, Any]:
        """Run one iteration; the trainer's state changes only if it finishes."""
        new, metrics = self._iterate(self.state.fork())
        self.state = new
        return metrics

    def _iterate(self, st: TrainState) -> tuple[TrainState, dict[str, Any]]:
        cfg = self.cfg
        t_start = time.perf_counter()
        st.key, k_roll = jax.random.split(st.key)
        # The rollout kind of the policy (jaxdm.rl.collect), acting on dist's copy.
        eb, roll = self.collector.collect(self.dist.act_params(st.params["policy"]),
                                          self.dist.act_key(k_roll),
                                          cfg.train_task_offset + st.cursor)
        st.cursor += cfg.tasks_per_iter
        signals, metrics = {}, {}
        for name, backend in self.signal_backends.items():
            t0 = time.perf_counter()
            signals[name] = SIGNALS.get(name).produce(eb, backend, cfg)
            metrics.update(signals[name].stats)
            metrics[f"time/{name}"] = time.perf_counter() - t0
        metrics = self.dist.signal_stats(metrics)  # [MULTIHOST] counts over all processes
        self._check_failures(metrics, st.iteration + 1)
        # [MULTIHOST] on this process's groups, batch statistics over every process's rows
        adv = self.dist.advantages(ESTIMATORS[cfg.algo.advantage].fn, eb, signals, cfg.algo,
                                   self.dist.local_tasks)
        t0 = time.perf_counter()
        upd = self._update(st, eb, adv, signals)
        update_s = time.perf_counter() - t0
        st.iteration += 1
        a = self.dist.gather_rows(adv.adv[eb.mask])  # [MULTIHOST] every process's rows
        stat = (lambda f: float(f(a)) if a.size else 0.0)  # noqa: E731
        metrics = {
            "iteration": st.iteration, **roll,
            "adv/mean": stat(np.mean), "adv/std": stat(np.std), "adv/min": stat(np.min),
            "adv/max": stat(np.max), "adv/nonzero_frac": stat(lambda x: (x != 0).mean()),
            "time/update": update_s, **metrics, **adv.stats, **upd,
            "time/iteration": time.perf_counter() - t_start,
        }
        return st, metrics

    def _check_failures(self, metrics: dict[str, Any], iteration: int) -> None:
        frac, limit = metrics.get("teacher/failure_frac"), self.cfg.teacher.max_failed_share
        if frac is None or limit is None or not metrics.get("teacher/requests"):
            return
        if frac > limit or frac >= 1.0:
            raise TeacherFailureError(
                f"iteration {iteration}: {metrics['teacher/missing']:.0f} of "
                f"{metrics['teacher/requests']:.0f} teacher requests failed after "
                f"{self.cfg.teacher.retries} retry round(s) "
                f"(teacher.max_failed_share={limit}); errors: "
                f"{metrics.get('teacher/error_examples') or metrics.get('teacher/last_error')}",
                metrics)

    def _update(self, st: TrainState, eb: EpisodeBatch, adv, signals) -> dict[str, float]:
        cfg, units = self.cfg, eb.units
        n = self.dist.unit_count(len(units))  # [MULTIHOST] over every process
        if n == 0:
            return {"ppo/updates": 0.0}
        lvopd = None
        if "lvopd" in cfg.algo.terms:  # the gate over the WHOLE batch, before mini-batching
            lvopd = LVOPDBatcher(eb, adv.adv, signals["teacher_topk"],  # [LVOPD] form
                                 gate=cfg.algo.lvopd_gate, form=self.policy.form,
                                 gate_in_kernel=cfg.algo.lvopd_gate_in_kernel)
        m = cfg.algo.mini_batch
        n_mb = -(-n // m)
        order = st.host_rng.permutation(n)
        cols = None if "critic" not in st.params else {
            k: adv.extras[k][eb.unit_rows, eb.unit_cols] for k in ("returns", "old_values")}
        # [MULTIHOST] the global mini-batches (each process uploads its rows)
        mbs, recorded = self.dist.mini_batches(
            self.policy, units, adv.adv[eb.unit_rows, eb.unit_cols], eb.unit_logp, order, m,
            critic=self.critic_config if cols is not None else None, columns=cols,
            extra=None if lvopd is None else lambda idx: lvopd.arrays(idx, m))
        # π_old / π_ref before any update: the option form's sampling log-prob *is* π_old; other
        # samplers' differ, so π_old is recomputed unless the iteration's one step is its own
        # π_old (no extra terms: the ppo term then reads its forward's; TRL does the same)
        own = cfg.algo.ppo_epochs * len(mbs) == 1 and not cfg.algo.terms
        for batch, rec in zip(mbs, recorded):
            old = rec if self.policy.exact_sampling_logp else None if own else self.logp_fn(
                st.params["policy"], batch["policy"])
            batch.update({} if old is None else {"old_logp": old, "ref_logp": old})
            if cfg.algo.kl_coef:
                batch["ref_logp"] = self.logp_fn(self.ref_params, batch["policy"])
        sums: dict[str, float] = {}
        count = 0
        for epoch in range(cfg.algo.ppo_epochs):
            for j, batch in enumerate(mbs):
                st.params, st.opt_states, met = self.train_step(st.params, st.opt_states, batch)
                met = {k: float(v) for k, v in met.items()}
                self._check_finite(met, st.iteration + 1, epoch, j)
                for k, v in met.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        tokens = sums.get("ppo/tokens", 0.0)
        out = {"ppo/updates": float(count), "ppo/padding": float(n_mb * m - n)}
        for k in sums:
            if k.startswith(("loss/", "optim/", "value/", "lvopd/")) and \
                    not k.endswith(("/sum", "/count")):
                out[k] = sums[k] / count
        for k in ("ppo/clip_frac", "ppo/approx_kl", "ppo/kl_ref", "ppo/entropy"):
            out[k] = sums.get(k + "/sum", 0.0) / max(tokens, 1.0)
        out["ppo/dual_clip_frac"] = sums.get("ppo/dual_clip_frac", 0.0) / count
        return out

    def _check_finite(self, met: dict[str, float], iteration: int, epoch: int, mb: int):
        keys = [k for k in _LOSS_KEYS if k in met] + sorted(
            k for k in met if k.startswith(("loss/", "optim/")) and k not in _LOSS_KEYS)
        for k in keys:
            if not math.isfinite(met[k]):
                raise NonFiniteLossError(
                    f"iteration {iteration}: non-finite {k} = {met[k]} (epoch {epoch}, "
                    f"mini-batch {mb}); stopping with the state of iteration "
                    f"{self.state.iteration}", {"run/nonfinite": k})

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, num_tasks: int | None = None) -> dict[str, Any]:
        """Success (and completion by action cutoff) per task type on held-out tasks."""
        num_tasks = num_tasks or self.cfg.eval_tasks
        if num_tasks < 1:
            raise ValueError("evaluate needs num_tasks >= 1 (cfg.eval_tasks)")
        return self.collector.evaluate(self.dist.act_params(self.params), num_tasks,
                                       iteration=self.iteration,
                                       values=self.signal_backends.get("values"))

    # ---- the loop -----------------------------------------------------------------------
    def run(self, *, resume: bool = False, overwrite: bool = False,
            iterations: int | None = None, stop_after: int | None = None
            ) -> list[dict[str, Any]]:
        """Train to ``iterations`` (default cfg.iterations); returns the metric records.

        ``stop_after`` stops after that many iterations *of this call* (simulates a killed
        run; the exit checkpoint is still written). The run folder (``run_layout``) is locked
        for the call: a second job on it fails at once.
        """
        with self.dist.lock(self.out):  # [MULTIHOST] shared out_dir: process 0 holds it
            return self._run(resume=resume, overwrite=overwrite, iterations=iterations,
                             stop_after=stop_after)

    def _run(self, *, resume: bool, overwrite: bool, iterations: int | None,
             stop_after: int | None) -> list[dict[str, Any]]:
        cfg = self.cfg
        total = iterations or cfg.iterations
        main = self.dist.is_main  # [MULTIHOST] files and progress from process 0 only
        layout, settings = run_layout(cfg, self.checkpointer), cfgmod.to_dict(cfg)
        if not rundir.check_folder(self.out, layout, settings, resume=resume,
                                   overwrite=overwrite, what="out_dir") and overwrite:
            self.checkpointer.close()
            if main:  # [MULTIHOST] one process clears the shared out_dir, then all go on
                rundir.clear_outputs(self.out, layout)
            self.dist.barrier("clear_run")
            self.checkpointer = Checkpointer(self.out / "checkpoints",
                                             max_to_keep=cfg.keep_checkpoints)
        resumed = self.restore() if resume else False
        writer = self.dist.metrics_writer(self.out / "metrics.jsonl",
                                          resume_step=self.iteration if resumed else None)
        self.dist.barrier("metrics_file")  # [MULTIHOST] read it after process 0 trimmed it
        # Only a run resumed at its end has its final evaluation; one resumed with more
        # iterations (``iterations`` may change on resume) evaluates again at the new end.
        final_done = resumed and self.iteration >= total and any(
            r.get("step") == self.iteration and "eval/All" in r and "train/success" not in r
            for r in runlog.read_metrics(self.out / "metrics.jsonl"))
        if not resumed and main:
            rundir.write_settings(self.out, layout, settings)
        bar = runlog.Progress(total, cfg.algo.advantage, initial=self.iteration,
                              enabled=cfg.progress and self.log and main,
                              keys=("train/success", "train/reward", "loss/total"))
        records, done_here = [], 0
        last_good, recorded = self.state, self.iteration
        try:
            while self.iteration < total:
                last_good = self.state
                try:
                    met = self.iteration_step()
                except TrainingStopped as e:
                    writer.write(self.iteration + 1, {"run/error": str(e), **e.metrics})
                    print(f"\ntraining stopped: {e}", file=sys.stderr, flush=True)
                    raise
                if cfg.eval_tasks and cfg.eval_every and self.iteration % cfg.eval_every == 0 \
                        and self.iteration < total:
                    met.update({k: v for k, v in self.evaluate().items() if k != "eval/table"})
                records.append(writer.write(self.iteration, met))
                recorded = self.iteration
                bar.update(met)
                done_here += 1
                if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
                    self.save()
                if stop_after is not None and done_here >= stop_after:
                    break
            bar.close()
            if self.iteration >= total and cfg.eval_tasks and not final_done:
                ev = self.evaluate()
                if self.log and main:
                    print(f"\nEvaluation after {self.iteration} iterations (seeds "
                          f"{list(cfg.eval_seeds)}, {cfg.eval_tasks} held-out tasks):\n"
                          f"{ev['eval/table']}", flush=True)
                final = {k: v for k, v in ev.items() if k != "eval/table"}
                final["iteration"] = self.iteration
                records.append(writer.write(self.iteration, final))
        finally:
            bar.close()
            writer.close()
            if recorded != self.iteration:  # finished but not recorded: roll back one
                self.state = last_good
            if self.checkpointer.latest_step() != self.iteration and self.iteration > 0:
                self.save()
        if main:
            self.plot()
        return records

    def plot(self) -> Path | None:
        """Learning curves of this run's metrics file as ``out_dir/curves.png``."""
        path = self.out / "metrics.jsonl"
        recs = [r for r in runlog.read_metrics(path, drop_torn_tail=True)
                if "train/success" in r] if path.exists() else []
        if not recs:
            return None
        keys = [k for k in ("train/success", "train/reward", "adv/std", "loss/total",
                            "ppo/entropy", "teacher/score_mean", "loss/value")
                if k in recs[-1]]
        return runlog.plot_curves({self.cfg.algo.advantage: recs}, keys,
                                  self.out / "curves.png", x="iteration",
                                  title=f"{self.cfg.env.name}: {self.cfg.algo.advantage}")

    def close(self) -> None:
        """Close the rollout's env pools and the checkpointer (waiting for pending saves)."""
        self.collector.close()
        self.checkpointer.close()


def run_layout(cfg: TrainConfig, checkpointer: Checkpointer) -> rundir.Layout:
    """The trainer's run folder (``jaxdm.rundir``): config.yaml (compared by dotted key on
    resume, but RUN_CHANGING_EXEMPT), metrics.jsonl, checkpoints/; other files are allowed."""
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    return rundir.Layout(
        "config.yaml", ("checkpoints", "metrics.jsonl", "curves.png"), kind="a training run",
        free=RUN_CHANGING_EXEMPT, foreign_files=True, view=nested_items,
        holds=lambda out: bool(checkpointer.all_steps()) or (
            metrics.is_file() and metrics.stat().st_size > 0),
        load=lambda path: cfgmod.to_dict(cfgmod.load_config(TrainConfig, path, [])),
        dump=lambda path, settings: cfgmod.dump_yaml(settings, path))


def train_run(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False,
              log: bool = True) -> list[dict[str, Any]]:
    """Runs (``resume``: continues; a finished run only re-reads) the training run of ``cfg``
    and returns every metric record of it, earlier sessions' included (``Trainer.run`` returns
    only the records it added)."""
    trainer = Trainer(cfg, log=log)
    try:
        trainer.run(resume=resume, overwrite=overwrite)
    finally:
        trainer.close()
    return runlog.read_metrics(Path(cfg.out_dir) / "metrics.jsonl")
