"""The ``values`` signal for the trainer (``jaxdm.rl.signals`` contract), from ``cfg.value``.

``cfg.value`` is a plain dict (YAML ``value:`` section); keys (unknown keys are an error
naming ``value.<key>``):

- ``kind``: a ``VALUE_MODELS`` name (registered here with the keys it takes): ``"oracle"``
  (``noise``, ``seed``, ``drift``: ``OracleValueModel``), ``"readout"`` (``backend``: a ``jaxdm.decision.make_backend`` spec, e.g. ``{"kind": "local_readout",
  "path": "smollm2"}`` or a remote one) or ``"list"`` (``generator``: ``{"base_url", "model",
  "api_key_env", "price_per_1k_in", "price_per_1k_out", "max_tokens", "timeout"}`` for an
  OpenAI-compatible endpoint, or ``{"path": "smollm2" | HF folder, "max_new_tokens"}`` for a
  local model);
- group context: ``summariser`` ("deterministic" | "llm"), ``summary_generator`` (like
  ``generator``; needed by "llm"), ``include_target`` (default False),
  ``max_steps_per_rollout`` and ``max_rollouts`` (0: all);
- ``eval_trajectories``: how many evaluation trajectories each evaluation values and plots
  (``jaxdm.rl.values.curves``; default 8, 0: none).

``produce`` returns arrays ``{"values": [B, T + 1]}``, mask [B] (rows whose values are real;
errored episodes and failed queries are False and fall back to GRPO in the ``lvrl``
estimator) and ``value/...`` stats; each fallback is also logged (``value/fallback_examples``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np

from jaxdm import models
from jaxdm.decision import make_backend
from jaxdm.models.smollm2 import smollm2
from jaxdm.registry import Registry
from jaxdm.rl.signals import Signal, register_signal
from jaxdm.rl.values.context import SUMMARISERS
from jaxdm.rl.values.curves import eval_trajectory_count
from jaxdm.rl.values.generation import HttpChatGenerator, LocalGenerator
from jaxdm.rl.values.models import ListValueModel, OracleValueModel, ReadoutValueModel
from jaxdm.rl.values.signal import values_signal
from jaxdm.trajectory import Trajectory

__all__ = ["ValueModelKind", "VALUE_MODELS", "value_model_from_spec", "check_value_spec"]

_COMMON = {"kind", "summariser", "summary_generator", "include_target",
           "max_steps_per_rollout", "max_rollouts", "eval_trajectories"}
_HTTP_KEYS = {"base_url", "model", "api_key_env", "price_per_1k_in", "price_per_1k_out",
              "max_tokens", "timeout", "max_retries", "concurrency"}
_LOCAL_KEYS = {"path", "max_new_tokens", "dtype"}


def check_value_spec(spec: Mapping[str, Any]) -> None:
    """Raise ValueError naming ``value.<key>`` for anything that cannot be built."""
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError("value.kind: the 'values' signal (estimator 'lvrl') needs a value "
                         f"model; set value.kind to one of {VALUE_MODELS.names()}")
    kind = spec.get("kind")
    keys = VALUE_MODELS.get(kind, field="value.kind").keys
    unknown = sorted(set(spec) - _COMMON - keys)
    if unknown:
        raise ValueError(f"value.{unknown[0]}: unknown key for value.kind={kind!r}; allowed: "
                         f"{sorted(_COMMON | keys)}")
    eval_trajectory_count(spec)
    summariser = spec.get("summariser", "deterministic")
    SUMMARISERS.validate(summariser, field="value.summariser")
    if summariser == "llm" and not spec.get("summary_generator"):
        raise ValueError("value.summary_generator: summariser 'llm' needs a generator")
    if kind == "readout" and not isinstance(spec.get("backend"), Mapping):
        raise ValueError("value.backend: kind 'readout' needs a decision backend spec "
                         "(e.g. {kind: local_readout, path: smollm2})")
    if kind == "oracle":
        for key in ("noise", "drift"):
            x = spec.get(key, 0.0)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or \
                    not math.isfinite(x) or x < 0:
                raise ValueError(f"value.{key}: must be a finite number >= 0, got {x!r}")
    if kind == "list" and not isinstance(spec.get("generator"), Mapping):
        raise ValueError("value.generator: kind 'list' needs a generator spec")
    for key in ("generator", "summary_generator"):
        if key in spec and spec[key]:
            g = spec[key]
            allowed = _HTTP_KEYS if "base_url" in g else _LOCAL_KEYS
            bad = sorted(set(g) - allowed)
            if bad:
                raise ValueError(f"value.{key}.{bad[0]}: unknown key; allowed: {sorted(allowed)}")


def _generator(spec: Mapping[str, Any]):
    spec = dict(spec)
    if "base_url" in spec:
        return HttpChatGenerator(spec.pop("base_url"), spec.pop("model", "default"), **spec)

    path, dtype = spec.pop("path", "smollm2"), jnp.dtype(spec.pop("dtype", None) or "float32")
    if path == "smollm2":
        pre = smollm2(dtype)
    else:
        pre = models.load_pretrained(path, dtype)
    return LocalGenerator(pre, **spec)


@dataclasses.dataclass(frozen=True)
class ValueModelKind:
    """A ``value.kind``: the spec keys it takes besides the common ones, and ``build(spec) ->
    value model`` from a checked spec."""
    keys: frozenset[str]
    build: Callable[[Mapping[str, Any]], Any]


VALUE_MODELS: Registry[ValueModelKind] = Registry("value model")
VALUE_MODELS.register("readout", ValueModelKind(
    frozenset({"backend"}), lambda spec: ReadoutValueModel(make_backend(spec["backend"]))))
VALUE_MODELS.register("list", ValueModelKind(
    frozenset({"generator"}), lambda spec: ListValueModel(_generator(spec["generator"]))))
VALUE_MODELS.register("oracle", ValueModelKind(frozenset({"noise", "seed", "drift"}), lambda spec: (
    OracleValueModel(noise=float(spec.get("noise", 0.0)), seed=int(spec.get("seed", 0)),
                     drift=float(spec.get("drift", 0.0))))))


def value_model_from_spec(spec: Mapping[str, Any]):
    """(value model, values_signal options) from a ``cfg.value`` dict."""
    check_value_spec(spec)
    model = VALUE_MODELS.get(spec["kind"]).build(spec)
    opts = {"summariser": spec.get("summariser", "deterministic"),
            "summary_generator": (_generator(spec["summary_generator"])
                                  if spec.get("summary_generator") else None),
            "include_target": bool(spec.get("include_target", False)),
            "max_steps_per_rollout": int(spec.get("max_steps_per_rollout", 0)),
            "max_rollouts": int(spec.get("max_rollouts", 0))}
    return model, opts


def _check(cfg) -> None:
    check_value_spec(cfg.value)


def _build(cfg, trainer):
    return value_model_from_spec(cfg.value)


def _produce(episodes, backend, cfg) -> Signal:
    model, opts = backend
    errored = np.asarray(episodes.errored, bool)
    trajs = [tr if (tr is not None and not errored[i]) else Trajectory("", (), "")
             for i, tr in enumerate(episodes.trajectories)]
    num_steps = episodes.mask.shape[1]
    trajs = [tr if len(tr.steps) <= num_steps else Trajectory(
        tr.goal, tr.steps[:num_steps], tr.steps[num_steps].observation, tr.reward, tr.success,
        tr.budget, tr.task_type, tr.env, metadata=tr.metadata) for tr in trajs]
    sig = values_signal(trajs, episodes.groups, model, num_steps=num_steps, kept=~errored,
                        **opts)
    rows = sig.value_rows & ~errored
    stats = dict(sig.metrics)
    stats["value/requests"] = stats["value/queries"]
    stats["value/fallback_examples"] = [f"row {i}: {r}" for i, r in sig.fallbacks[:3]]
    return Signal({"values": sig.values}, rows, stats)


register_signal("values", _produce, build=_build, check=_check)
