"""Signals: per-iteration arrays computed from the rollouts for the advantage estimators.

A signal producer is ``produce(episodes, backend, cfg) -> Signal``:

- ``episodes``: the iteration's ``EpisodeBatch`` (``jaxdm.rl.estimators``: the records, their
  ``Trajectory`` objects and the [B, T] arrays, errored rows already masked out);
- ``backend``: what ``build(cfg, trainer)`` returned once at start (a decision backend from
  ``jaxdm.decision.make_backend``, or a callable bound to the trainer's critic);
- ``cfg``: the ``TrainConfig``.

It returns a ``Signal(arrays, mask, stats)``: ``arrays`` maps names to numpy arrays, ``mask``
says which entries are real (a failed request is a False entry, never an exception), and
``stats`` are flat metrics for the JSONL file (``<signal>/...`` keys). Failures inside a
producer are counted in its stats; the trainer applies failure thresholds.

Registered here: ``teacher_scores`` (arrays ``{"scores": [B, T]}``, mask [B, T]: one judge
score per executed action through ``jaxdm.roles.jobs.score_trajectories``) and
``critic_values`` (arrays ``{"values": [B, T + 1]}``, mask [B, T + 1]: the learned critic's
V(s_t) for every visited state, 0 and False at the terminal slot).
``values`` (``jaxdm.rl.values``) and ``teacher_topk`` (the LVOPD teacher's top-K_T lists,
needed by the ``lvopd`` term; ``jaxdm.rl.lvopd``) are registered by their modules, imported
on the first lookup of a name not registered yet (``SIGNALS``' providers).

Contract for ``values`` (the LVRL value model, registered from ``jaxdm.rl.values`` with
``register_signal("values", produce, build=..., check=...)``): ``arrays["values"]`` is
float32 [B, T + 1] with V(s_0)..V(s_T) on [0, 1] (the slots 0 and T_i are anchored by the
estimator and may hold anything); ``mask`` is bool [B] — True for rows whose values are real,
False for rows whose query failed (those rows fall back to their GRPO advantage); ``stats``
holds ``value/requests``, ``value/failures``, ``value/tokens_in``, ``value/tokens_out``,
``value/seconds`` and anything else worth logging. ``check(cfg)`` raises ``ValueError``
naming the config key (e.g. ``value.kind``) when the signal cannot be produced.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from jaxdm.decision import make_backend
from jaxdm.registry import Registry
from jaxdm.roles.jobs import score_trajectories

__all__ = ["Signal", "SignalSpec", "SIGNALS", "register_signal", "teacher_backend_spec"]


@dataclasses.dataclass(frozen=True)
class Signal:
    """A signal for one iteration: named host arrays (e.g. scores [B, T]), the episode rows it
    covers (mask [B] or [B, T]), and stats for the metrics."""
    arrays: dict[str, np.ndarray]
    mask: np.ndarray
    stats: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SignalSpec:
    """A registered signal: produce(episodes, backend, cfg) -> Signal each iteration, build(cfg,
    trainer) -> its backend once at start, and check(cfg) raising a ValueError naming a missing
    config key."""
    produce: Callable[[Any, Any, Any], Signal]
    build: Callable[[Any, Any], Any]            # (cfg, trainer) -> backend, once at start
    check: Callable[[Any], None]                # raises ValueError naming the missing key


# ``values`` and ``teacher_topk`` are registered by their modules (a signal needs them only
# when configured), imported on the first lookup of a name not registered yet.
SIGNALS: Registry[SignalSpec] = Registry("signal",
                                         providers=("jaxdm.rl.values", "jaxdm.rl.lvopd"))


def register_signal(name: str, produce: Callable, *, build: Callable | None = None,
                    check: Callable | None = None) -> SignalSpec:
    """Register a signal producer (see the module docstring for the contract); a name
    registered twice is a ``jaxdm.registry.DuplicateNameError``."""
    return SIGNALS.register(name, SignalSpec(produce, build or (lambda cfg, trainer: None),
                                             check or (lambda cfg: None)))


# ---- teacher_scores ---------------------------------------------------------------------
def teacher_backend_spec(section: Any) -> dict[str, Any]:
    """``make_backend``'s spec for a ``TeacherSection`` (only the keys its kind takes)."""
    kind = section.kind
    if kind == "oracle":
        return {"kind": kind, "noise": section.noise, "seed": section.seed}
    if kind == "remote":
        spec = {"kind": kind, "base_url": section.base_url, "model": section.model,
                "interface": section.interface, "timeout": section.timeout,
                "api_key_env": section.api_key_env,
                "price_per_1k_in": section.price_per_1k_in,
                "price_per_1k_out": section.price_per_1k_out}
        return {k: v for k, v in spec.items() if v is not None}
    return {"kind": kind, "path": section.path or "smollm2"}


def _teacher_check(cfg) -> None:
    if cfg.teacher.kind == "none":
        raise ValueError("teacher.kind: the 'teacher_scores' signal needs a teacher "
                         "(teacher.kind != 'none')")


def _teacher_build(cfg, trainer):
    return make_backend(teacher_backend_spec(cfg.teacher))


def _teacher_produce(episodes, backend, cfg) -> Signal:
    res = score_trajectories(backend, episodes.trajectories, question=cfg.teacher.question,
                             context=cfg.teacher.context, max_actions=cfg.max_actions,
                             retries=cfg.teacher.retries)
    ok = res.ok & episodes.mask
    stats = {f"teacher/{k}": v for k, v in res.stats.items() if k != "error_examples"}
    if res.stats["error_examples"]:
        stats["teacher/error_examples"] = "; ".join(res.stats["error_examples"])
    s = res.scores[ok]
    stats["teacher/score_mean"] = float(s.mean()) if s.size else None
    stats["teacher/score_std"] = float(s.std()) if s.size else None
    stats["teacher/failure_frac"] = res.failure_frac
    return Signal({"scores": res.scores}, ok, stats)


register_signal("teacher_scores", _teacher_produce, build=_teacher_build, check=_teacher_check)


# ---- critic_values ----------------------------------------------------------------------
def _critic_check(cfg) -> None:
    if cfg.critic.kind == "none":
        raise ValueError("critic.kind: the 'critic_values' signal needs a learned critic "
                         "(critic.kind='decoder')")


def _critic_build(cfg, trainer):
    return trainer.critic_state_values  # reads the trainer's current critic params


def _critic_produce(episodes, backend, cfg) -> Signal:
    b, t = episodes.mask.shape
    flat = backend(episodes.units)              # [N] values of every unit, in unit order
    values = np.zeros((b, t + 1), np.float32)
    mask = np.zeros((b, t + 1), bool)
    values[episodes.unit_rows, episodes.unit_cols] = flat
    mask[episodes.unit_rows, episodes.unit_cols] = True
    v = flat if flat.size else np.zeros(1, np.float32)
    return Signal({"values": values}, mask, {"critic/value_mean": float(v.mean()),
                                             "critic/value_std": float(v.std())})


register_signal("critic_values", _critic_produce, build=_critic_build, check=_critic_check)
