"""``jaxdm train-dm``: packed SFT of a decision model with LoRA, exact resume and HF export.

One optimiser step trains ``states_per_step`` shared contexts with every question asked about
them in one packed forward (``jaxdm.train.packing``), loss = CE + μ·SE against the mixed target
(``jaxdm.train.losses``; seed 003: α = 0.3, μ = 0.5, LoRA rank 32, 2 epochs, lr 1e-4, AdamW).

Run folder (``out_dir``): ``metrics.jsonl`` (one record per step), ``checkpoints/`` (orbax,
atomic; adapters + optimiser state + the step), ``curves.png``, ``summary.json``, and
``model/`` (adapters merged, an HF folder every jaxdm backend and transformers load).

Exact resume: the batch of step s is a pure function of (seed, s) (the epoch's permutation is
drawn from ``numpy.random.default_rng([seed, epoch])``), and the checkpoint holds everything
else, so a run killed after checkpoint k and restarted does step k + 1 exactly as an
uninterrupted run would. A non-finite loss or gradient stops the run (``TrainingError`` naming
the step, epoch and the batch's sources) before any update is applied; the last good
checkpoint stays the latest.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdm.decision import make_backend
from jaxdm.decision.types import YesNo
from jaxdm.models import lora as lora_lib
from jaxdm.models import compile_cache
from jaxdm.models.loading import save_pretrained
from jaxdm.models.lora import load_model
from jaxdm.jsonl import write_json
from jaxdm.rl.checkpoint import Checkpointer
from jaxdm.rundir import ResumeMismatchError, describe_diff, saved_form, settings_diff
from jaxdm.runlog import MetricsWriter, Progress, plot_curves
from jaxdm.train import packing
from jaxdm.train.data import read_states
from jaxdm.train.losses import ALPHA, MU


class TrainingError(RuntimeError):
    """A training run cannot continue (non-finite loss, bad data); the message says where."""


@dataclasses.dataclass(frozen=True)
class TrainDMConfig:
    """Settings of ``jaxdm train-dm`` (YAML keys / dotted overrides).

    data: JSONL of states (``jaxdm.train.data``); model: "smollm2" or an HF folder;
    mode: how options are read ("likelihood": option tokens; "readout": label letters);
    layout: the scorer layout trained through ("packed", the default: one row per context,
    its questions' suffixes packed after it, nothing padded per suffix; "rows": the context
    once as a KV cache, the suffixes as rows over it padded to the longest: see
    ``jaxdm.train.packing.pack_items`` and ``benchmarks/sft_memory.py --compare layout``);
    teacher: optional backend spec (``jaxdm.decision.make_backend``) whose probabilities
    enter the mixed target for questions without a ``teacher`` field;
    lora_rank: 0 trains all weights; require_split: refuse lines of other splits (None: off);
    on_indistinct: "error" stops on options that tokenise identically, "skip" leaves those
    questions out and lists them in summary.json; max_steps: stop after this many steps
    (a budget or a simulated kill; the run resumes from its checkpoint); remat: recompute
    each decoder layer in the backward pass (``ModelConfig.remat``; same loss and gradients,
    a fraction of the memory: see ``benchmarks/sft_memory.py``); adapter_dtype: precision of
    the adapter folder a LoRA run also exports (``out_dir/adapter``, ``lora.save_adapter``:
    a few MB, loaded by ``load_adapted`` and by ``jaxdm screen --judge <folder>``; written
    also when max_steps stops the run early, unlike the merged ``model/``); q_bucket /
    min_trunk / o_bucket: padding floors of a batch's questions / context tokens / option
    slots (``packing.pack_items``), so states of varied sizes share a few compiled steps.
    """

    data: str = ""
    model: str = "smollm2"
    out_dir: str = "train_dm_out"
    mode: Literal["likelihood", "readout"] = "likelihood"
    layout: Literal["rows", "packed"] = "packed"
    epochs: int = 2
    lr: float = 1e-4
    weight_decay: float = 0.0
    lora_rank: int = 32
    lora_alpha: float = 32.0
    lora_targets: tuple[str, ...] = tuple(lora_lib.TARGETS)
    states_per_step: int = 1
    alpha: float = ALPHA
    mu: float = MU
    seed: int = 0
    save_every: int = 50
    keep_checkpoints: int = 2
    max_steps: int | None = None
    teacher: dict | None = None
    require_split: str | None = "train"
    on_indistinct: Literal["error", "skip"] = "error"
    export: bool = True
    progress: bool = True
    dtype: str = "float32"
    remat: bool = True
    adapter_dtype: str = "float32"
    q_bucket: int = 1
    min_trunk: int = 64
    o_bucket: int = 8

    def __post_init__(self):
        for name in ("epochs", "states_per_step", "save_every", "q_bucket", "min_trunk",
                     "o_bucket"):
            if getattr(self, name) < 1:
                raise ValueError(f"train-dm: {name} must be >= 1, got {getattr(self, name)}")
        if self.lora_rank < 0:
            raise ValueError(f"train-dm: lora_rank must be >= 0, got {self.lora_rank}")
        for name in ("lr", "alpha", "mu", "weight_decay"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"train-dm: {name} must be finite and >= 0, got {v}")
        if self.adapter_dtype not in lora_lib.ADAPTER_DTYPES:
            raise ValueError(f"train-dm: adapter_dtype must be one of "
                             f"{lora_lib.ADAPTER_DTYPES}, got {self.adapter_dtype!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"train-dm: max_steps must be >= 1, got {self.max_steps}")


def with_teacher(states, spec: dict) -> tuple[list[list[packing.SFTItem]], dict[str, Any]]:
    """Items with teacher probabilities from a backend (where a line gave neither a teacher
    nor a graded target), and what was asked: {"asked", "failed", "first_error"}. An item
    whose teacher answer failed keeps the one-hot target (counted); when every answer failed
    the run stops (TrainingError): it would train without the teacher it was configured with."""
    teacher = make_backend(spec)
    flat = [it for s in states for it in s if it.teacher is None and it.target is None]
    mcs = [it for it in flat if not isinstance(it.question, YesNo)]
    yns = [it for it in flat if isinstance(it.question, YesNo)]
    got: dict[int, tuple[float, ...]] = {}
    errors = []
    for it, r in zip(mcs, teacher.choose([it.question for it in mcs]) if mcs else []):
        if r.ok and r.probs is not None:
            got[id(it)] = tuple(float(p) for p in r.probs)
        else:
            errors.append(r.error or "no distribution")
    for it, r in zip(yns, teacher.score([it.question for it in yns]) if yns else []):
        if r.ok and r.score is not None:
            got[id(it)] = (float(r.score), 1.0 - float(r.score))
        else:
            errors.append(r.error or "no score")
    report = {"asked": len(flat), "failed": len(errors),
              "first_error": errors[0] if errors else None}
    if flat and len(errors) == len(flat):
        raise TrainingError(f"train-dm: every teacher answer failed ({len(flat)} questions; "
                            f"first error: {errors[0]}); fix the teacher ({spec.get('kind')}) "
                            f"or train without one")
    return [[dataclasses.replace(it, teacher=got[id(it)]) if id(it) in got else it for it in s]
            for s in states], report


def batch_order(n_states: int, states_per_step: int, seed: int, step: int) -> list[int]:
    """State indices of (zero-based) ``step``: a pure function of (seed, step)."""
    per_epoch = -(-n_states // states_per_step)
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n_states)
    return [int(x) for x in perm[i * states_per_step:(i + 1) * states_per_step]]


@functools.lru_cache(maxsize=8)
def train_step_fn(config, lcfg: "lora_lib.LoraConfig | None", mu: float, lr: float,
                   weight_decay: float, lora_apply: Literal["unmerged", "merged"] = "unmerged",
                   donate: bool = False):
    """(jitted step, optimizer), cached so resumed / repeated runs in one process reuse the
    compiled step. lora_apply: "unmerged" (``lora.adapt``, the default) or "merged"
    (``lora.merge``: W + (α/r)·A·B built every step; the reference it is checked against).
    donate: the step takes over the buffers of its trainable and optimiser-state arguments
    (the caller must not read them again, nor pass them as ``base``): the new ones are written
    in place instead of into fresh pages the OS must zero (a full fine-tune's 0.5 GB of
    weights and 1 GB of AdamW moments each step)."""
    optimizer = optax.adamw(lr, weight_decay=weight_decay)
    if lora_apply not in ("unmerged", "merged"):
        raise ValueError(f"lora_apply must be 'unmerged' or 'merged', got {lora_apply!r}")
    apply = lora_lib.adapt if lora_apply == "unmerged" else lora_lib.merge

    def loss_fn(trainable, base, batch, window, full_vocab):
        # a full fine-tune's fp32 master weights run in the model's own precision
        params = apply(base, trainable, lcfg) if lcfg else compute_weights(trainable, base)
        return packing.batch_loss(params, config, batch, window=window, full_vocab=full_vocab,
                                  mu=mu)

    def step(trainable, opt_state, base, batch, window, full_vocab):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            trainable, base, batch, window, full_vocab)
        gnorm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                             for g in jax.tree.leaves(grads)))
        updates, new_opt = optimizer.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), new_opt, loss, gnorm, metrics

    return (jax.jit(step, static_argnames=("window", "full_vocab"),
                    donate_argnums=(0, 1) if donate else ()), optimizer)


class StepPrograms:
    """``step_fn`` (``train_step_fn``'s) compiled ahead once per batch shape, called like it.
    After each compile the compiler's freed heap goes back to the OS
    (``compile_cache.release_freed_memory``) before the program's first run adds its buffers:
    the peak RSS of a run's first step is then the step's own (69-option fp32 LoRA step:
    3.23 -> 2.27 GB). The programs are kept per ``step_fn`` (``train_step_fn`` caches it), so
    a resumed or repeated run in one process reuses them. ``len()`` is the number of distinct
    programs this instance has run (a run's compiled step shapes)."""

    _compiled: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()

    def __init__(self, step_fn):
        self._step_fn = step_fn
        self._programs = self._compiled.setdefault(step_fn, {})
        self._used: set = set()

    def __len__(self) -> int:
        return len(self._used)

    def __call__(self, trainable, opt_state, base, batch, window, full_vocab):
        shape = (window, full_vocab, jax.tree.structure(batch),
                 tuple((x.shape, x.dtype) for x in jax.tree.leaves(batch)))
        program = self._programs.get(shape)
        if program is None:
            program = self._programs[shape] = self._step_fn.lower(
                trainable, opt_state, base, batch, window, full_vocab).compile()
            compile_cache.release_freed_memory()
        self._used.add(shape)
        return program(trainable, opt_state, base, batch)


def master_weights(params: Any) -> Any:
    """A full fine-tune's trained copy of ``params``: every floating leaf in float32 (mixed
    precision: bf16 weights would lose every AdamW update below half their ulp, ~2e-4 of a
    weight of 0.05 at lr 1e-4), other leaves as they are."""
    return jax.tree.map(lambda p: jnp.array(p, jnp.float32, copy=True)  # (never the same
                        if jnp.issubdtype(p.dtype, jnp.floating)       # buffers: donated)
                        else jnp.array(p, copy=True), params)


def compute_weights(master: Any, like: Any) -> Any:
    """``master`` (``master_weights``) rounded back to the dtypes of ``like`` (the loaded
    model): what a step's forward and backward run in; the gradient flows to the fp32 copy."""
    return jax.tree.map(lambda m, p: m.astype(p.dtype), master, like)


def train(cfg: TrainDMConfig) -> dict[str, Any]:
    """Runs (or resumes) a training run; returns the summary (also in summary.json)."""
    if not cfg.data:
        raise TrainingError("train-dm: 'data' (a JSONL of training states) is required")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    states = read_states(cfg.data, require_split=cfg.require_split)
    pre = load_model(cfg.model, cfg.dtype)
    encoder = packing.Encoder(pre, mode=cfg.mode)
    problems = encoder.check_distinct([it for s in states for it in s])
    skipped = []
    if problems:
        if cfg.on_indistinct == "error":
            raise packing.IndistinctOptions(problems)
        bad = {p[0] for p in problems}
        skipped = [{"source": s, "options": list(i), "texts": list(t)} for s, i, t in problems]
        states = [[it for it in s if it.source not in bad] for s in states]
        states = [s for s in states if s]
        if not states:
            raise TrainingError("train-dm: every question was skipped (indistinct options)")
    teacher_report = None
    if cfg.teacher:
        states, teacher_report = with_teacher(states, dict(cfg.teacher))
        if teacher_report["failed"]:
            print(f"train-dm: {teacher_report['failed']} of {teacher_report['asked']} teacher "
                  f"answers failed (their questions keep the one-hot target); first: "
                  f"{teacher_report['first_error']}", file=sys.stderr, flush=True)
    n_q = sum(len(s) for s in states)
    per_epoch = -(-len(states) // cfg.states_per_step)
    total = per_epoch * cfg.epochs
    stop = total if cfg.max_steps is None else min(total, cfg.max_steps)

    base = pre.params
    key = jax.random.key(cfg.seed)
    lcfg = (lora_lib.LoraConfig(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
            if cfg.lora_rank else None)
    step_fn, optimizer = train_step_fn(pre.config.replace(remat=cfg.remat), lcfg, cfg.mu,
                                       cfg.lr, cfg.weight_decay, donate=True)
    trainable = lora_lib.init_adapters(base, lcfg, key) if lcfg else master_weights(base)
    opt_state = optimizer.init(trainable)
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=cfg.keep_checkpoints)
    start = 0
    latest = ckpt.latest_step()
    settings = _settings(cfg, len(states))
    if latest is not None:
        restored, host, _ = ckpt.restore({"trainable": trainable, "opt": opt_state})
        saved = host.get("settings") or _legacy_settings(host.get("fingerprint"))
        changed = settings_diff(saved, settings)
        if changed:
            raise ResumeMismatchError(
                f"train-dm: {out / 'checkpoints'} holds a run with different settings or data: "
                f"{describe_diff(changed, saved, settings)}; use a new out_dir")
        trainable, opt_state, start = restored["trainable"], restored["opt"], int(host["step"])
    metrics_path = out / "metrics.jsonl"
    writer = MetricsWriter(metrics_path, resume_step=start if latest is not None else None)
    bar = Progress(stop, "train-dm", initial=start, enabled=cfg.progress,
                   keys=("sft/loss", "sft/accuracy"))
    t_start = time.perf_counter()
    trained_q = 0
    programs = StepPrograms(step_fn)
    try:
        for s in range(start, stop):
            idx = batch_order(len(states), cfg.states_per_step, cfg.seed, s)
            its = [it for i in idx for it in states[i]]
            t0 = time.perf_counter()
            batch, window, full_vocab, stats = packing.pack_items(encoder, its,
                                                                  alpha=cfg.alpha,
                                                                  layout=cfg.layout,
                                                                  q_bucket=cfg.q_bucket,
                                                                  min_trunk=cfg.min_trunk,
                                                                  o_bucket=cfg.o_bucket)
            batch = jax.tree.map(jnp.asarray, batch)
            new_tr, new_opt, loss, gnorm, m = programs(trainable, opt_state, base, batch,
                                                       window, full_vocab)
            loss, gnorm = float(loss), float(gnorm)
            if not (math.isfinite(loss) and math.isfinite(gnorm)):
                last = ckpt.latest_step()
                raise TrainingError(
                    f"train-dm: non-finite {'loss' if not math.isfinite(loss) else 'gradient'} "
                    f"at step {s + 1} (epoch {s // per_epoch + 1}, batch of states "
                    f"{[states[i][0].source for i in idx]});"
                    f" stopped before the update; last good checkpoint: step {last}")
            trainable, opt_state = new_tr, new_opt
            dt = time.perf_counter() - t0
            count = max(int(m["sft/count"]), 1)
            trained_q += len(its)
            record = {"epoch": s // per_epoch + 1, "sft/loss": loss,
                      "sft/ce": float(m["sft/ce_sum"]) / count,
                      "sft/se": float(m["sft/se_sum"]) / count,
                      "sft/accuracy": float(m["sft/correct"]) / count, "grad_norm": gnorm,
                      "questions": len(its), "tokens": stats["unique_tokens"],
                      "request_tokens": stats["request_tokens"], "seconds": dt}
            writer.write(s + 1, record)
            bar.update(record)
            if (s + 1) % cfg.save_every == 0 or s + 1 == stop:
                ckpt.save(s + 1, {"trainable": trainable, "opt": opt_state},
                          {"step": s + 1, "settings": settings})
    finally:
        bar.close()
        writer.close()
    summary: dict[str, Any] = {
        "steps_done": stop, "steps_total": total, "resumed_from": start, "states": len(states),
        "compiled_steps": len(programs),
        "questions": n_q, "epochs": cfg.epochs, "mode": cfg.mode,
        "lora": None if not lcfg else {"rank": lcfg.rank, "alpha": lcfg.alpha,
                                       "targets": list(lcfg.targets),
                                       "params": lora_lib.num_params(trainable)},
        "seconds": round(time.perf_counter() - t_start, 3),
        "questions_per_second": (trained_q / (time.perf_counter() - t_start)
                                 if trained_q else None),
        "skipped_indistinct": skipped, "out_dir": str(out),
        "teacher": teacher_report}
    try:
        plot_curves({"train": metrics_path}, ["sft/loss", "sft/accuracy"], out / "curves.png",
                    title=f"train-dm ({cfg.mode}, {Path(cfg.data).name})")
        summary["curves"] = str(out / "curves.png")
    except ValueError:
        pass
    if cfg.export and stop == total:
        params = lora_lib.merge(base, trainable, lcfg) if lcfg else trainable
        folder = save_pretrained(out / "model", params, pre.config, tokenizer=pre.tokenizer,
                                 source=pre.path)
        summary["model"] = str(folder)
    if cfg.export and lcfg:
        # The adapter alone (a few MB) also after a run stopped by max_steps (meta: its step).
        ad = lora_lib.save_adapter(out / "adapter", trainable, lcfg, base=cfg.model,
                                   dtype=cfg.adapter_dtype,
                                   meta={"steps": stop, "steps_total": total,
                                         "data": str(cfg.data), "mode": cfg.mode})
        summary["adapter"] = str(ad)
        summary["adapter_bytes"] = (ad / "adapter.safetensors").stat().st_size
    write_json(out / "summary.json", summary, indent=2)
    ckpt.close()
    return summary


# Settings that do not change what a step computes: a resumed run may change them.
RESUME_FREE = ("out_dir", "max_steps", "progress", "export", "save_every", "keep_checkpoints",
               "remat", "adapter_dtype", "q_bucket", "min_trunk", "o_bucket")


def _settings(cfg: TrainDMConfig, n_states: int) -> dict[str, Any]:
    """The settings a checkpoint records (and a resume compares): the config but RESUME_FREE,
    plus the number of training states, as JSON (``jaxdm.rundir.saved_form``)."""
    keep = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUME_FREE}
    if not cfg.lora_rank and jnp.dtype(cfg.dtype) != jnp.float32:
        # (a full fine-tune in bf16 trained the bf16 weights themselves before this key)
        keep["master_weights"] = "float32"
    return saved_form({**keep, "states": n_states})


def _legacy_settings(fingerprint: str | None) -> dict[str, Any]:
    """The settings of a checkpoint written before they were a mapping (``"<json>|states=N"``)."""
    if not fingerprint:
        return {}
    text, _, n = fingerprint.rpartition("|states=")
    return saved_form({**json.loads(text), "states": int(n)})
