"""One process of a multi-process CPU training run (driven by test_models_multihost.py).

    python multihost_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT_DIR

Every process builds the same tiny Qwen2 decoder, takes only its own rows of a fixed global
batch (``process_rows``), assembles the global batch (``global_batch``) on a data-parallel
mesh over all processes' devices, runs ``STEPS`` SGD steps of next-token cross-entropy,
saves the parameters with orbax from every process and restores them. Process 0 writes the
final parameters (gathered) and the restored ones to OUT_DIR as .npz.
"""
from __future__ import annotations

import sys

import numpy as np

GLOBAL_BATCH, SEQ, STEPS, LR = 8, 16, 3, 0.5


def make_batch(cfg) -> np.ndarray:
    """The fixed global batch [GLOBAL_BATCH, SEQ] of token ids."""
    return np.random.default_rng(0).integers(0, cfg.vocab_size, (GLOBAL_BATCH, SEQ)).astype(
        np.int32)


def initial_params(cfg) -> dict:
    """Random parameters drawn on the host (numpy: nothing to compile), norms near 1."""
    import jax

    from jaxdm.models import decoder

    rng = np.random.default_rng(1)

    def draw(path, shape):
        noise = rng.standard_normal(shape).astype(np.float32)
        return 1.0 + 0.1 * noise if jax.tree_util.keystr(path).endswith("norm']") else 0.02 * noise

    return jax.tree_util.tree_map_with_path(draw, decoder.param_shapes(cfg),
                                            is_leaf=lambda x: isinstance(x, tuple))


def train(mesh, cfg, local_tokens):
    """STEPS SGD steps from ``initial_params`` on the global batch; returns sharded params."""
    import jax
    import jax.numpy as jnp
    import optax

    from jaxdm.models import decoder
    from jaxdm.models import sharding as sh

    params = sh.shard_params(initial_params(cfg), mesh)
    tx = optax.sgd(LR)
    opt_state = sh.shard_params(tx.init(params), mesh, strict=False)
    tokens = sh.global_batch(local_tokens, mesh)  # global arrays are passed, never closed over

    def loss_fn(p, tokens):
        positions = jnp.broadcast_to(jnp.arange(SEQ - 1), (tokens.shape[0], SEQ - 1))
        hidden = decoder.forward(p, cfg, tokens[:, :-1], positions)
        return -jnp.mean(decoder.token_logprobs(p, cfg, hidden, tokens[:, 1:]))

    @jax.jit
    def step(p, s, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(p, tokens)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    for _ in range(STEPS):
        params, opt_state, _ = step(params, opt_state, tokens)
    return params


def flat(params, mesh) -> dict[str, np.ndarray]:
    """Every parameter as a host array (one compiled all-gather for the whole tree)."""
    import jax

    from jaxdm.models import sharding as sh

    whole = jax.jit(lambda t: t, out_shardings=sh.replicated(mesh))(params)
    return {jax.tree_util.keystr(path): np.asarray(x.addressable_data(0))
            for path, x in jax.tree_util.tree_leaves_with_path(whole)}


def main(coordinator: str, num_processes: int, process_id: int, out_dir: str) -> None:
    import jax

    from jaxdm.models import presets
    from jaxdm.models import sharding as sh
    from jaxdm.rl.checkpoint import Checkpointer

    assert sh.initialize_distributed(coordinator, num_processes, process_id)
    assert jax.process_count() == num_processes and jax.device_count() > jax.local_device_count()
    cfg = presets.TINY_QWEN2
    mesh = sh.make_mesh(data=-1, model=1)
    local = make_batch(cfg)[sh.process_rows(GLOBAL_BATCH).start:
                            sh.process_rows(GLOBAL_BATCH).stop]
    params = train(mesh, cfg, local)
    ckpt = Checkpointer(f"{out_dir}/ckpt")
    ckpt.save(STEPS, {"params": params}, {"step": STEPS})  # every process writes its shards
    restored, host, _ = ckpt.restore({"params": params})
    ckpt.close()
    final, back = flat(params, mesh), flat(restored["params"], mesh)
    if sh.is_main_process():
        np.savez(f"{out_dir}/final.npz", **final)
        np.savez(f"{out_dir}/restored.npz", **back)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
