"""LVOPD gated distillation loss (jaxdm.rl.distill) on hand-built batches."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.kernels import topk_reverse_kl
from jaxdm.rl.distill import lvopd_distill_loss, lvopd_gate


def test_gate_hand_computed():
    adv = jnp.array([[0.3, -0.6, 0.0], [-0.3, 9.0, 0.0]])
    mask = jnp.array([[True, True, True], [True, False, False]])
    # Valid: 0.3, -0.6, 0.0, -0.3 -> mean -0.15, var = (0.2025+0.2025+0.0225+0.0225)/4
    # = 0.1125, std = 0.335410; w = max(0, -A/std): [0, 1.788854, 0], [0.894427].
    gate = lvopd_gate(adv, mask)
    std = np.sqrt(0.1125)
    np.testing.assert_allclose(
        gate, [[0.0, 0.6 / std, 0.0], [0.3 / std, 0.0, 0.0]], rtol=1e-5
    )
    raw = lvopd_gate(adv, mask, normalize="none")
    np.testing.assert_allclose(raw, [[0.0, 0.6, 0.0], [0.3, 0.0, 0.0]], rtol=1e-6)
    with pytest.raises(ValueError, match="normalize"):
        lvopd_gate(adv, mask, normalize="zscore")
    with pytest.raises(TypeError, match="step_mask must be bool"):
        lvopd_gate(adv, mask.astype(jnp.int32))
    with pytest.raises(TypeError, match="on the host"):
        jax.jit(lambda a: lvopd_gate(a, mask))(adv)


def _batch(seed=0, batch=2, length=6, vocab=120, num_listed=32, dim=16):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(batch, length, dim)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(dim, vocab)) * 0.5, jnp.float32)
    teacher = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(batch, length, vocab)) * 2.0))
    logprobs, ids = jax.lax.top_k(teacher, num_listed)
    return hidden, head, ids.astype(jnp.int32), logprobs


def test_distill_loss_gates_tokens_by_action():
    hidden, head, ids, logprobs = _batch()
    logits = jnp.einsum("bld,dv->blv", hidden, head)
    # Row 0: tokens 0-1 prompt, 2-3 action 0 (value drop), 4-5 action 1 (value rise).
    # Row 1: tokens 0-2 action 0 (drop), 3-5 padding.
    token_action_index = jnp.array([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]])
    token_mask = jnp.array([[False, False, True, True, True, True],
                            [True, True, True, False, False, False]])
    step_adv = jnp.array([[-0.5, 0.4], [-1.0, 0.0]])
    step_mask = jnp.array([[True, True], [True, False]])
    weights = lvopd_gate(step_adv, step_mask, normalize="none")
    loss, metrics = lvopd_distill_loss(
        logits, ids, logprobs, weights, token_action_index, token_mask,
    )
    kl = np.asarray(topk_reverse_kl(logits, ids, logprobs))
    # Gates: row 0 action 0 -> 0.5, action 1 -> 0; row 1 action 0 -> 1.0. Token-mean over
    # the 7 action tokens.
    expected = (0.5 * (kl[0, 2] + kl[0, 3]) + 1.0 * kl[1, :3].sum()) / 7
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["lvopd/gated_token_fraction"], 5 / 7, rtol=1e-6)
    np.testing.assert_allclose(
        metrics["lvopd/kl_mean"], (kl[0, 2:].sum() + kl[1, :3].sum()) / 7, rtol=1e-5
    )
    assert float(metrics["lvopd/weighted_kl/count"]) == 7.0
    # Gradient reaches only gated action tokens.
    grad = jax.jit(jax.grad(
        lambda z: lvopd_distill_loss(
            z, ids, logprobs, weights, token_action_index, token_mask,
        )[0]
    ))(logits)
    touched = np.abs(np.asarray(grad)).sum(-1) > 0
    np.testing.assert_array_equal(
        touched, [[False, False, True, True, False, False], [True, True, True, False, False,
                                                              False]]
    )


def test_distill_loss_fused_equals_logits_form():
    hidden, head, ids, logprobs = _batch(seed=3)
    token_action_index = jnp.array([[0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1]])
    token_mask = jnp.ones((2, 6), bool)
    step_adv = jnp.array([[-0.2, -0.7, 0.3], [0.5, -0.1, 0.0]])
    step_mask = jnp.array([[True, True, True], [True, True, False]])
    args = (ids, logprobs, lvopd_gate(step_adv, step_mask), token_action_index, token_mask)

    def fused(h, w):
        return lvopd_distill_loss(h, *args, lm_head=w, block_v=32)[0]

    def plain(h, w):
        return lvopd_distill_loss(jnp.einsum("bld,dv->blv", h, w), *args, impl="reference")[0]

    value, grads = jax.jit(jax.value_and_grad(fused, argnums=(0, 1)))(hidden, head)
    ref_value, ref_grads = jax.jit(jax.value_and_grad(plain, argnums=(0, 1)))(hidden, head)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    assert float(value) > 0
    for ours, ref in zip(grads, ref_grads):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_distill_loss_errors():
    hidden, head, ids, logprobs = _batch()
    token_mask = jnp.ones((2, 6), bool)
    common = (ids, logprobs, jnp.zeros((2, 2)), jnp.zeros((2, 6), int))
    with pytest.raises(ValueError, match=r"student must be \[B, L, V\]"):
        lvopd_distill_loss(hidden[0], *common, token_mask)
    with pytest.raises(TypeError, match="token_mask must be bool"):
        lvopd_distill_loss(hidden, *common, token_mask.astype(jnp.int32), lm_head=head)
    with pytest.raises(ValueError, match="reduction"):
        lvopd_distill_loss(hidden, *common, token_mask, lm_head=head, reduction="mean")
