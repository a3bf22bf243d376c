"""Sharded forward on 8 fake CPU devices (mesh data=4 x model=2) equals the unsharded one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxdm.models import forward, init_params, lm_logits, make_mesh, shard_batch, shard_params
from jaxdm.models.presets import SMOLLM2_135M, TINY_QWEN2
from jaxdm.models.sharding import logical_to_spec, param_shardings

needs_8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


@needs_8
def test_sharded_forward_equals_unsharded():
    cfg = TINY_QWEN2.replace(num_heads=4, num_kv_heads=2)
    params = init_params(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (8, 12)))
    positions = jnp.broadcast_to(jnp.arange(12), (8, 12))
    ref = lm_logits(params, cfg, forward(params, cfg, tokens, positions))

    mesh = make_mesh(data=4, model=2)
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    sharded = shard_params(params, mesh)
    # FSDP over data on the model width, tensor parallel over heads / ffw / vocab.
    assert sharded["layers"]["q"].sharding.spec == P(None, "data", "model", None)
    assert sharded["layers"]["down"].sharding.spec == P(None, "model", "data")
    assert sharded["embed"].sharding.spec == P("model", "data")
    assert len(sharded["layers"]["q"].addressable_shards) == 8
    assert sharded["layers"]["q"].addressable_shards[0].data.shape == (2, 8, 2, 8)

    @jax.jit
    def run(p, t, pos):
        return lm_logits(p, cfg, forward(p, cfg, t, pos))

    out = run(sharded, shard_batch(tokens, mesh), shard_batch(positions, mesh))
    assert out.sharding.num_devices == 8
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


@needs_8
def test_non_dividing_axes_fall_back_to_replication():
    mesh = make_mesh(data=4, model=2)
    # SmolLM2: 3 KV heads do not split over model=2; 576 splits over data=4.
    assert logical_to_spec(("layers", "embed", "kv_heads", "head_dim"), (30, 576, 3, 64),
                           mesh) == P(None, "data", None, None)
    shapes = jax.eval_shape(lambda: init_params(SMOLLM2_135M, jax.random.key(0)))
    shardings = param_shardings(shapes, mesh)
    assert shardings["layers"]["q"].spec == P(None, "data", None, None)  # 9 heads
    assert shardings["layers"]["gate"].spec == P(None, "data", "model")
    with pytest.raises(ValueError, match="model=3 must divide the 8 devices"):
        make_mesh(data=1, model=3)


@needs_8
def test_optimizer_state_follows_the_parameter_rules():
    import optax

    from jaxdm.models.sharding import batch_sharding, param_spec, replicated

    mesh = make_mesh(data=4, model=2)
    cfg = TINY_QWEN2.replace(num_heads=4, num_kv_heads=2)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    state = jax.eval_shape(optax.adamw(1e-3).init, shapes)
    # mu/nu mirror the parameters under a prefix: same specs; the step count is replicated.
    specs = param_shardings({"policy": state}, mesh, strict=False)
    adam = specs["policy"][0]
    assert adam.mu["layers"]["q"].spec == P(None, "data", "model", None)
    assert adam.nu["embed"].spec == P("model", "data")
    assert adam.count.spec == P()
    with pytest.raises(ValueError, match=r"parameter '0/count': no logical axes"):
        param_shardings(state, mesh)  # strict: only parameters
    with pytest.raises(ValueError, match="do not fit shape"):
        param_spec(("layers", "q"), (4, 8), mesh)
    assert param_spec(("layers", "q"), (4, 8), mesh, strict=False) == P()
    assert batch_sharding(mesh, 3).spec == P("data", None, None)
    assert replicated(mesh).spec == P()
    with pytest.raises(ValueError, match="ndim must be a positive int"):
        batch_sharding(mesh, 0)


@needs_8
def test_single_process_multihost_helpers(monkeypatch):
    from jaxdm.models.sharding import (global_batch, initialize_distributed, is_main_process,
                                       process_rows)

    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                 "SLURM_NTASKS", "JAXDM_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    assert initialize_distributed() is False  # nothing says this is a multi-process job
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an int"):
        initialize_distributed()
    assert process_rows(6) == range(0, 6) and is_main_process()
    with pytest.raises(ValueError, match="groups: 2.5 must be a non-negative int"):
        process_rows(2.5, "groups")
    mesh = make_mesh(data=4, model=2)
    batch = global_batch({"tokens": np.arange(24).reshape(8, 3)}, mesh)
    assert batch["tokens"].sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(batch["tokens"]), np.arange(24).reshape(8, 3))


def test_training_memory_per_device():
    from jaxdm.models.presets import QWEN2_5_1_5B
    from jaxdm.models.sharding import mesh_shape, train_memory_per_device

    assert mesh_shape("fsdp-tp2", 8) == (4, 2) and mesh_shape("fsdp", 6) == (6, 1)
    with pytest.raises(ValueError, match="model=4 must divide the 6 devices"):
        mesh_shape("fsdp-tp4", 6)
    with pytest.raises(ValueError, match="unknown mesh preset 'tp8'"):
        mesh_shape("tp8", 8)
    cfg = QWEN2_5_1_5B.replace(dtype="bfloat16")
    one = train_memory_per_device(cfg, 1, 1)
    n_params = 1_543_714_304  # Qwen2.5-1.5B with tied embeddings
    assert one["params"] == 2 * n_params and one["grads"] == one["params"]
    assert one["optimizer"] == 2 * one["params"] + 4  # AdamW mu and nu in bf16, an int32 count
    eight = train_memory_per_device(cfg, 8, 1)
    # Every matrix splits 8 ways over data; norms and biases (under 1 MB) are replicated.
    assert one["params"] / 8 <= eight["params"] < one["params"] / 8 + 2 ** 20
    assert train_memory_per_device(cfg, 4, 2)["params"] <= eight["params"]
