"""ModelConfig.remat (each decoder layer rematerialised in the backward pass) changes memory,
not numbers: the same loss and gradients with it on and off, through every layer loop the
trainer differentiates by default: the rows layout runs the context through ``prefill`` (the
shared ``_run_layers`` scan, also under ``forward`` and the packed layout) and the suffix rows
through ``forward_with_cache`` (its own scan). The packed layout is left out: it adds only a
compile of its eight context-cut branches (about 100 s on the loaded 2-core machine)."""
import jax
import jax.numpy as jnp

from jaxdm.models import decoder
from jaxdm.train import packing
from tests.train.train_fixtures import items, tiny, yesno_items


def _max_diff(a, b):
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)))


def test_remat_sft_loss_same_loss_and_grads():
    pre = tiny()
    its = items(tag="a") + yesno_items("Another context: the customer asks for O-55555.")
    batch, window, full_vocab, _ = packing.pack_items(packing.Encoder(pre, "likelihood"), its,
                                                      layout="rows")
    batch = jax.tree.map(jnp.asarray, batch)

    def loss(params, config):
        return packing.batch_loss(params, config, batch, window=window,
                                  full_vocab=full_vocab)[0]

    l0, g0 = jax.value_and_grad(loss)(pre.params, pre.config)
    l1, g1 = jax.value_and_grad(loss)(pre.params, pre.config.replace(remat=True))
    assert abs(float(l0) - float(l1)) < 1e-6
    scale = max(jax.tree.leaves(jax.tree.map(lambda x: float(jnp.max(jnp.abs(x))), g0)))
    assert scale > 1e-4 and _max_diff(g0, g1) < 1e-6, (scale, _max_diff(g0, g1))
    # A run setting, not a model property: the HF config does not carry it.
    on = pre.config.replace(remat=True)
    assert on.remat and on.to_hf_dict() == pre.config.to_hf_dict()
