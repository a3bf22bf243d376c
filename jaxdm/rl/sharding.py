"""Placing the RL train state on a mesh: ``jaxdm.models.sharding``'s rules, re-exported.

One set of rules serves inference and training and lives in ``jaxdm.models.sharding`` (FSDP
over ``data``, tensor parallel over ``model``, logical axis names per parameter). The train
state's optimizer leaves mirror the parameters under extra path prefixes (``mu/...``,
``nu/...``): a leaf whose path ends with a known parameter path gets that parameter's
sharding, anything else (step counts, ...) is replicated, i.e. ``strict=False`` there. Batch
arrays put their leading axis on ``data`` (the padded mini-batch must divide by it). XLA's
partitioner inserts the collectives.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from jaxdm.models import sharding as _rules
from jaxdm.models.sharding import batch_sharding, make_mesh, replicated

__all__ = ["make_mesh", "param_spec", "shard_params", "batch_sharding", "replicated",
           "train_memory", "memory_line", "keep_shardings"]


def param_spec(path, shape: tuple[int, ...], mesh: Mesh):
    """Partition spec of a parameter or optimizer-state leaf at ``path`` (replicated if unknown)."""
    return _rules.param_spec(path, shape, mesh, strict=False)


def shard_params(tree: Any, mesh: Mesh) -> Any:
    """Place a parameter (or optimizer-state) pytree on ``mesh``."""
    return _rules.shard_params(tree, mesh, strict=False)


_KEPT: dict[Any, Any] = {}


def keep_shardings(step: Any, params: Any, opt_states: Any) -> Any:
    """``step(params, opt_states, batch) -> (params, opt_states, metrics)`` jitted so the new
    params and optimizer state keep the shardings of the placed ``params`` / ``opt_states``.

    Left to itself XLA picks the outputs' shardings (e.g. ``P('model', 'data')`` for a norm
    placed as ``P(None, None)``); the next call then sees other input shardings and compiles
    the whole train step a second time (measured on the ``cpu_smoke`` preset, 2 devices: two
    45-90 s compiles of ``jit(step)``). One wrapper per (step, shardings), so trainers with
    the same spec and mesh share the compiled program."""
    def shardings(tree):
        return jax.tree.map(lambda x: x.sharding, tree)

    outs = (shardings(params), shardings(opt_states))
    key = (step, jax.tree.structure(outs), tuple(jax.tree.leaves(outs)))
    if key not in _KEPT:
        _KEPT[key] = jax.jit(step, out_shardings=(*outs, None))
    return _KEPT[key]


def train_memory(params: Any, optimizer: Any, mesh: Mesh) -> dict[str, int]:
    """Bytes per device of ``params`` (arrays or shapes), their gradients and ``optimizer``'s
    state (an optax transformation; shapes only, nothing allocated) once placed on ``mesh``
    by the rules; activations excluded. The numbers ``train_memory_per_device`` gives for a
    model preset, here for the trainer's actual policy and optimizer."""
    opt_state = jax.eval_shape(optimizer.init, params)
    out = {"params": _rules.per_device_bytes(params, mesh, strict=False),
           "optimizer": _rules.per_device_bytes(opt_state, mesh, strict=False)}
    out["grads"] = out["params"]
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def memory_line(params: Any, optimizer: Any, mesh: Mesh) -> str:
    """One line for the start of a run: the mesh and ``train_memory`` per device."""
    mib = {k: v / 2 ** 20 for k, v in train_memory(params, optimizer, mesh).items()}
    data, model = mesh.shape["data"], mesh.shape["model"]
    return (f"mesh data {data} x model {model} ({mesh.size} devices): per device policy params "
            f"{mib['params']:.1f} MiB + grads {mib['grads']:.1f} MiB + optimizer "
            f"{mib['optimizer']:.1f} MiB = {mib['total']:.1f} MiB (activations not included)")
