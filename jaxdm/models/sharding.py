"""Logical-axis sharding for the decoder: FSDP over `data`, tensor parallelism over `model`.

Every parameter has logical axis names (`PARAM_LOGICAL_AXES`, data); `DEFAULT_RULES` maps
logical names to mesh axes. A mesh axis that does not divide a dimension (e.g. 3 KV heads on
a model axis of 2) is dropped for that dimension, so any config shards without errors.
Activations follow the inputs: shard the batch over `data` (`shard_batch`) and GSPMD
propagates through the jitted forward.

This module is the one place for placement rules; `jaxdm.rl.sharding` re-exports it for the
train state. Trees other than the parameters themselves (optimizer state, a train state) are
placed by the same rules: a leaf whose path ENDS with a parameter path (``mu/layers/q``,
``policy/embed``) is that parameter's image and gets its sharding; with ``strict=False`` every
other leaf (step counters, factored second moments whose rank differs) is replicated.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from jaxdm.models.decoder import init_params
from jaxdm.registry import Registry

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# Internal parameter path -> logical axis names (one per array axis).
PARAM_LOGICAL_AXES: dict[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "final_norm": ("norm",),
    "lm_head": ("embed", "vocab"),
    "layers/attn_norm": ("layers", "norm"),
    "layers/q": ("layers", "embed", "heads", "head_dim"),
    "layers/k": ("layers", "embed", "kv_heads", "head_dim"),
    "layers/v": ("layers", "embed", "kv_heads", "head_dim"),
    "layers/o": ("layers", "heads", "head_dim", "embed"),
    "layers/q_bias": ("layers", "heads", "head_dim"),
    "layers/k_bias": ("layers", "kv_heads", "head_dim"),
    "layers/v_bias": ("layers", "kv_heads", "head_dim"),
    "layers/o_bias": ("layers", "norm"),
    "layers/q_norm": ("layers", "head_dim"),
    "layers/k_norm": ("layers", "head_dim"),
    "layers/mlp_norm": ("layers", "norm"),
    "layers/gate": ("layers", "embed", "ffw"),
    "layers/up": ("layers", "embed", "ffw"),
    "layers/down": ("layers", "ffw", "embed"),
    "layers/gate_bias": ("layers", "ffw"),
    "layers/up_bias": ("layers", "ffw"),
    "layers/down_bias": ("layers", "norm"),
}

DEFAULT_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("embed", "data"),     # FSDP: weights' model-width axis split over data
    ("vocab", "model"),
    ("heads", "model"),    # tensor parallel
    ("kv_heads", "model"),
    ("ffw", "model"),
    ("layers", None),
    ("head_dim", None),
    ("norm", None),
    ("seq", None),
    ("cache", None),
)


# Named (data, model) mesh shapes; -1 = every device the other axis leaves. Memory per device
# for a model and device count: ``train_memory_per_device`` (or ``python
# experiments/mesh_memory.py --model qwen2.5-7b --mesh fsdp-tp2 --devices 8``).
MESH_PRESETS: Registry[tuple[int, int]] = Registry("mesh preset")
MESH_PRESETS.register("fsdp", (-1, 1))      # Qwen2.5-1.5B anywhere; Qwen2.5-7B on 8+ 80 GB GPUs
MESH_PRESETS.register("fsdp-tp2", (-1, 2))  # Qwen2.5-7B, long sequences (activations split)
MESH_PRESETS.register("fsdp-tp4", (-1, 4))  # Qwen2.5-7B on 16 GB chips (TPU v5e)


def mesh_shape(preset: str, num_devices: int) -> tuple[int, int]:
    """(data, model) of a ``MESH_PRESETS`` entry on ``num_devices`` devices."""
    data, model = MESH_PRESETS.get(preset)  # unknown: UnknownNameError (a ValueError)
    if num_devices < 1 or num_devices % model:
        raise ValueError(f"mesh preset {preset!r}: model={model} must divide the "
                         f"{num_devices} devices")
    return (num_devices // model if data == -1 else data), model


def make_mesh(data: int = -1, model: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, model) mesh with Auto axes (so sharding constraints and GSPMD apply).

    data=-1 uses every device not taken by `model`.
    """
    devices = list(jax.devices() if devices is None else devices)
    if model < 1 or len(devices) % model:
        raise ValueError(f"make_mesh: model={model} must divide the {len(devices)} devices")
    if data == -1:
        data = len(devices) // model
    if data * model != len(devices) and data * model > len(devices):
        raise ValueError(f"make_mesh: data*model={data * model} exceeds {len(devices)} devices")
    grid = np.asarray(devices[:data * model]).reshape(data, model)
    return Mesh(grid, ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """PartitionSpec for an array with these logical axes; non-dividing mesh axes dropped."""
    if len(logical) != len(shape):
        raise ValueError(f"logical_to_spec: {len(logical)} logical axes {tuple(logical)} for "
                         f"an array of shape {tuple(shape)}")
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(logical, shape):
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        kept = []
        for axis in axes:
            if axis not in mesh.shape or axis in used:
                continue
            if size % (mesh.shape[axis] * int(np.prod([mesh.shape[a] for a in kept]))) == 0:
                kept.append(axis)
        used.update(kept)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def _path_parts(path) -> list[str]:
    return [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]


def param_logical_axes(path) -> tuple[str | None, ...] | None:
    """Logical axes of the parameter a tree path ends with ("layers/q", "mu/embed", ...)."""
    parts = _path_parts(path)
    for n in (2, 1):  # parameter paths are "embed" or "layers/q"
        if len(parts) >= n and "/".join(parts[-n:]) in PARAM_LOGICAL_AXES:
            return PARAM_LOGICAL_AXES["/".join(parts[-n:])]
    return None


def param_spec(path, shape: Sequence[int], mesh: Mesh, rules: Rules = DEFAULT_RULES, *,
               strict: bool = True) -> PartitionSpec:
    """PartitionSpec of the leaf at ``path`` (a parameter, or its image in optimizer state).

    strict: a leaf that is not a parameter of matching rank raises ValueError naming its path;
    otherwise it is replicated (``PartitionSpec()``).
    """
    logical = param_logical_axes(path)
    if logical is None or len(logical) != len(shape):
        if strict:
            what = ("no logical axes for it" if logical is None else
                    f"its logical axes {logical} do not fit shape {tuple(shape)}")
            raise ValueError(f"param_shardings: parameter {'/'.join(_path_parts(path))!r}: "
                             f"{what}")
        return PartitionSpec()
    return logical_to_spec(logical, shape, mesh, rules)


def param_shardings(params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES, *,
                    strict: bool = True) -> Any:
    """A NamedSharding for every array leaf (same tree as params, or as its shapes); leaves
    without a shape stay as they are. ``strict=False`` for optimizer or train state."""

    def one(path, leaf):
        if not hasattr(leaf, "shape"):
            return leaf
        return NamedSharding(mesh, param_spec(path, leaf.shape, mesh, rules, strict=strict))

    return jax.tree_util.tree_map_with_path(one, params)


def shard_params(params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES, *,
                 strict: bool = True) -> Any:
    """Places params (or, with ``strict=False``, any tree holding them, such as optimizer
    state) on the mesh according to the logical-axis rules."""
    shardings = param_shardings(params, mesh, rules, strict=strict)
    return jax.tree.map(lambda x, s: jax.device_put(x, s) if hasattr(x, "shape") else x,
                        params, shardings)


def per_device_bytes(tree: Any, mesh: Any, rules: Rules = DEFAULT_RULES, *,
                     strict: bool = False) -> int:
    """Bytes each device holds of ``tree`` (arrays or ``jax.ShapeDtypeStruct``s) placed by the
    rules; ``mesh`` may be a ``jax.sharding.AbstractMesh`` (no devices needed)."""
    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if not hasattr(leaf, "shape"):
            continue
        spec = param_spec(path, leaf.shape, mesh, rules, strict=strict)
        shard = list(leaf.shape)
        for i, entry in enumerate(spec):
            for axis in (entry,) if isinstance(entry, str) else (entry or ()):
                shard[i] //= mesh.shape[axis]
        total += int(np.prod(shard)) * np.dtype(leaf.dtype).itemsize
    return total


def train_memory_per_device(config: Any, data: int, model: int, *, optimizer: Any = None,
                            rules: Rules = DEFAULT_RULES) -> dict[str, int]:
    """Bytes per device of the parameters, their gradients and the optimizer state
    (default: optax AdamW) of ``config`` on a (data, model) mesh; activations excluded."""
    import optax  # why: only this estimate needs an optimiser

    mesh = AbstractMesh((data, model), ("data", "model"))
    params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    opt_state = jax.eval_shape((optimizer or optax.adamw(1e-5)).init, params)
    out = {"params": per_device_bytes(params, mesh, rules, strict=True),
           "optimizer": per_device_bytes(opt_state, mesh, rules)}
    out["grads"] = out["params"]
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def activation_sharding(mesh: Mesh, logical: Sequence[str | None], shape: Sequence[int],
                        rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """NamedSharding for an activation, e.g. logical ("batch", "seq", "embed")."""
    return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))


def shard_batch(x: jax.Array, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> jax.Array:
    """Places a [B, ...] input with its batch axis over `data` (other axes replicated)."""
    logical = ("batch",) + (None,) * (x.ndim - 1)
    return jax.device_put(x, activation_sharding(mesh, logical, x.shape, rules))


def batch_sharding(mesh: Mesh, ndim: int, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """The sharding of every [B, ...] batch array of rank ``ndim``: B over the mesh axis of
    "batch" (``data``), the rest replicated. Unlike ``shard_batch`` it does not look at B,
    so B must divide by that axis (training pads its mini-batches to make it so)."""
    if not isinstance(ndim, int) or ndim < 1:
        raise ValueError(f"batch_sharding: ndim must be a positive int, got {ndim!r}")
    target = dict(rules).get("batch")
    axes = tuple(a for a in ((target,) if isinstance(target, str) else (target or ()))
                 if a in mesh.shape)
    lead = None if not axes else axes[0] if len(axes) == 1 else axes
    return NamedSharding(mesh, PartitionSpec(lead, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (scalars, RNG keys, small host state)."""
    return NamedSharding(mesh, PartitionSpec())


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           local_device_ids: Sequence[int] | None = None) -> bool:
    """Calls `jax.distributed.initialize` for multi-host runs; returns whether it did.

    Arguments left as None come from the environment: JAX_COORDINATOR_ADDRESS
    ("host:port" of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID; SLURM and TPU pods
    are detected by JAX itself (a TPU VM pod needs JAXDM_DISTRIBUTED=1, since nothing else
    in its environment says it is one). With none of these it does nothing (a single-process
    run). Cross-process programs on CPU use JAX's gloo collectives (its default).
    Calling it twice is harmless.
    """
    if jax.distributed.is_initialized():
        return True
    env = os.environ
    coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    if num_processes is None and env.get("JAX_NUM_PROCESSES"):
        num_processes = _env_int("JAX_NUM_PROCESSES")
    if process_id is None and env.get("JAX_PROCESS_ID"):
        process_id = _env_int("JAX_PROCESS_ID")
    if not (coordinator_address or num_processes is not None or env.get("SLURM_NTASKS")
            or env.get("JAXDM_DISTRIBUTED") == "1"):
        return False
    if num_processes is not None and not 0 <= (process_id or 0) < num_processes:
        raise ValueError(f"initialize_distributed: process_id={process_id} outside "
                         f"[0, num_processes={num_processes})")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               local_device_ids=local_device_ids)
    return True


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an int") from None


def process_rows(global_size: int, what: str = "rows") -> range:
    """This process's share of ``global_size`` rows (tasks, groups, batch rows): process p of
    P gets rows [p * n, (p + 1) * n) with n = global_size / P, so processes sample disjoint
    tasks and a GRPO group, if ``global_size`` counts groups, stays on one process."""
    count, index = jax.process_count(), jax.process_index()
    if not isinstance(global_size, int) or global_size < 0 or global_size % count:
        raise ValueError(f"{what}: {global_size!r} must be a non-negative int divisible by "
                         f"the {count} processes")
    per = global_size // count
    return range(index * per, (index + 1) * per)


def global_batch(local: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """Host-local [B_local, ...] arrays (a pytree; this process's ``process_rows`` of the
    batch) -> global [B_local * P, ...] arrays with the batch axis over ``data``
    (``jax.make_array_from_process_local_data``). With one process it places the arrays."""

    def one(x):
        x = np.asarray(x)
        global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
        return jax.make_array_from_process_local_data(
            batch_sharding(mesh, x.ndim, rules), x, global_shape)

    return jax.tree.map(one, local)


def is_main_process() -> bool:
    """Process 0 writes metrics, logs and progress; every process saves its checkpoint shards."""
    return jax.process_index() == 0

