"""SFT target and loss for decision models (seed 003, §training), as pure jit-able functions.

Symbols (Q questions, O option slots; padded slots are masked):
  y        [Q, O]  the answer distribution: uniform over the acceptable options (one-hot when
                   exactly one is acceptable, the seed's case; DECISION GYM keys may accept
                   several calls in any order, so we spread the mass evenly: our choice)
  t        [Q, O]  teacher probabilities (any backend), or absent
  target   = (1 - α)·y + α·t   when the teacher ranks an acceptable option first (its argmax
             is acceptable), else y                                         (α = 0.3)
  p        = softmax over the real options of the model's option scores
  loss_q   = CE(target, p) + μ · Σ_o (p_o - target_o)²                      (μ = 0.5)
  loss     = mean of loss_q over real questions (rows with at least one real option)

The seed says "squared error between the predicted distribution and the target" without
saying sum or mean over options; we sum over the options of the question (a per-question
Brier score), so the term does not shrink with the number of options.

Everything here takes and returns arrays; the forward pass runs outside (the brief's
``(option_logits, targets, mask) -> loss`` contract, so ``jaxdm.rl`` can register it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

ALPHA = 0.3
MU = 0.5


def _check_qo(name: str, x: jax.Array, shape: tuple[int, ...]) -> None:
    if x.shape != shape:
        raise ValueError(f"{name} must be [Q, O]={shape}, got {x.shape}")


def answer_distribution(answer_mask: jax.Array, option_mask: jax.Array) -> jax.Array:
    """y [Q, O]: uniform over acceptable options (answer_mask & option_mask); a row without an
    acceptable option is all zeros (excluded from the loss by ``sft_loss``)."""
    _check_qo("option_mask", option_mask, answer_mask.shape)
    ok = (answer_mask.astype(bool) & option_mask.astype(bool)).astype(jnp.float32)
    return ok / jnp.maximum(ok.sum(-1, keepdims=True), 1.0)


def mixed_target(answer_mask: jax.Array, option_mask: jax.Array,
                 teacher_probs: jax.Array | None = None, teacher_mask: jax.Array | None = None,
                 *, alpha: float = ALPHA) -> jax.Array:
    """The SFT target [Q, O] (module docstring). ``teacher_mask`` [Q] says which rows have
    teacher probabilities (default: all when ``teacher_probs`` is given). Teacher mass on
    padded option slots is dropped and the rest renormalised."""
    y = answer_distribution(answer_mask, option_mask)
    if teacher_probs is None:
        return y
    _check_qo("teacher_probs", teacher_probs, y.shape)
    q = y.shape[0]
    has = jnp.ones((q,), bool) if teacher_mask is None else teacher_mask.astype(bool)
    if has.shape != (q,):
        raise ValueError(f"teacher_mask must be [Q]={(q,)}, got {has.shape}")
    real = option_mask.astype(bool)
    t = jnp.where(real, teacher_probs.astype(jnp.float32), 0.0)
    t = t / jnp.maximum(t.sum(-1, keepdims=True), 1e-30)
    top = jnp.argmax(jnp.where(real, t, -1.0), axis=-1)                         # [Q]
    top_ok = jnp.take_along_axis(answer_mask.astype(bool) & real, top[:, None], axis=-1)[:, 0]
    use = has & top_ok & (y.sum(-1) > 0)
    return jnp.where(use[:, None], (1.0 - alpha) * y + alpha * t, y)


def option_log_softmax(option_logits: jax.Array, option_mask: jax.Array) -> jax.Array:
    """log p [Q, O] over the real options; padded slots get 0 probability (log = -1e9)."""
    _check_qo("option_mask", option_mask, option_logits.shape)
    real = option_mask.astype(bool)
    x = jnp.where(real, option_logits.astype(jnp.float32), -jnp.inf)
    x = jnp.where(real.any(-1, keepdims=True), x, 0.0)   # all-padding rows stay finite
    return jnp.where(real, jax.nn.log_softmax(x, axis=-1), -1e9)


def sft_loss_terms(option_logits: jax.Array, targets: jax.Array, option_mask: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-question (ce [Q], se [Q], valid [Q]) for option scores [Q, O] (logits, or already
    normalised log-probs: a log-softmax over the real options is applied either way)."""
    _check_qo("targets", targets, option_logits.shape)
    logp = option_log_softmax(option_logits, option_mask)
    real = option_mask.astype(bool)
    tgt = jnp.where(real, targets.astype(jnp.float32), 0.0)
    p = jnp.where(real, jnp.exp(logp), 0.0)
    ce = -jnp.sum(jnp.where(real, tgt * logp, 0.0), axis=-1)
    se = jnp.sum((p - tgt) ** 2, axis=-1)
    valid = real.any(-1) & (tgt.sum(-1) > 0)
    return ce, se, valid


def sft_loss(option_logits: jax.Array, targets: jax.Array, option_mask: jax.Array, *,
             mu: float = MU, question_weight: jax.Array | None = None) -> jax.Array:
    """Scalar loss: mean over real questions of CE + μ·SE (module docstring), weighted by
    ``question_weight`` [Q] when given (Σ w·loss / Σ w over the real questions)."""
    ce, se, valid = sft_loss_terms(option_logits, targets, option_mask)
    if question_weight is None:
        w = valid.astype(jnp.float32)
    else:
        if question_weight.shape != valid.shape:
            raise ValueError(f"question_weight must be [Q]={valid.shape}, got "
                             f"{question_weight.shape}")
        w = jnp.where(valid, question_weight.astype(jnp.float32), 0.0)
    per = jnp.where(valid, ce + mu * se, 0.0)
    return (w * per).sum() / jnp.maximum(w.sum(), 1e-30)


def sft_metrics(option_logits: jax.Array, targets: jax.Array, option_mask: jax.Array,
                answer_mask: jax.Array, *, mu: float = MU) -> dict[str, jax.Array]:
    """(sum, count) style metrics of a batch: loss parts and accuracy of the argmax."""
    ce, se, valid = sft_loss_terms(option_logits, targets, option_mask)
    logp = option_log_softmax(option_logits, option_mask)
    top = jnp.argmax(logp, axis=-1)
    right = jnp.take_along_axis(answer_mask.astype(bool), top[:, None], axis=-1)[:, 0]
    n = valid.sum()
    return {"sft/ce_sum": jnp.where(valid, ce, 0.0).sum(),
            "sft/se_sum": jnp.where(valid, se, 0.0).sum(),
            "sft/loss_sum": jnp.where(valid, ce + mu * se, 0.0).sum(),
            "sft/correct": jnp.where(valid, right, False).sum(), "sft/count": n}
