"""LVOPD distillation: per-action weights (the gate) and the gated top-k reverse-KL loss.

LVOPD (seed 001, section 3.3 and appendix B.3) adds to the policy loss a reverse-KL
distillation towards a teacher policy, weighted per action by

    w_t = max(0, -Â_t)

where Â_t are the step advantages (LVRL value differences V(s_{t+1}) - V(s_t)) normalised
over the batch. Actions whose estimated value did not drop get no distillation; the gate
scales supervision by the size of the drop.

One weight function, three configurations (``GATES``; all host-side numpy over the *whole*
iteration batch, before mini-batching: a gate normalised per mini-batch would change with
the shuffle):

- ``"lvopd"``: w_t = max(0, -Â_t), Â = A / std(A) over the batch's executed actions
  (``normalize="std"``; no mean-centring: centring would move the zero point and distill
  actions whose value rose, contradicting "non-negative changes receive no distillation
  loss"; scaling keeps every sign), or A as given (``normalize="none"``, when the
  estimator already normalised).
- ``"pure"``: pure OPD, w_t = 1 on every executed action.
- ``"trajectory"``: trajectory-gated OPD, our definition: w_t = 1 on every executed action
  of a failed trajectory (``success`` False), 0 on every action of a successful one.

The loss: each action's weight is broadcast to the tokens it generated, the per-token KL is
the top-k reverse KL of ``jaxdm.kernels`` (student top-16 support, teacher log-probs for
its top-32 tokens, SPEC section 6; LM head fused when hidden states are given), and the
weighted reduction is ``jaxdm.kernels.weighted_kl_loss``: the only implementation of the
gated reduction (this module only gates and names the metrics).

Shapes: B trajectories (or training rows), T action slots, L tokens, V vocabulary, d hidden
size, K_T teacher list length.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.kernels import (DEFAULT_FLOOR_MIN, fused_linear_topk_reverse_kl, topk_reverse_kl,
                           weighted_kl_loss)
from jaxdm.kernels.topk_reverse_kl import REDUCTIONS
from jaxdm.registry import Registry
from jaxdm.rl.advantages import broadcast_to_tokens

__all__ = ["GATES", "GATE_NORMALIZATIONS", "REDUCTIONS", "register_gate", "gate_weights",
           "lvopd_gate", "lvopd_distill_loss"]

GATE_NORMALIZATIONS = ("std", "none")


def _check_step_arrays(step_advantages, step_mask) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(step_advantages, jax.core.Tracer) or isinstance(step_mask, jax.core.Tracer):
        raise TypeError("the LVOPD gate is computed on the host over the whole batch; call it "
                        "outside jit with concrete arrays")
    adv, mask = np.asarray(step_advantages), np.asarray(step_mask)
    if adv.ndim != 2 or adv.shape != mask.shape:
        raise ValueError(f"step_advantages {adv.shape} and step_mask {mask.shape} must both "
                         "be [B, T]")
    if mask.dtype != np.bool_:
        raise TypeError(f"step_mask must be bool, got dtype {mask.dtype}")
    if not np.issubdtype(adv.dtype, np.floating):
        raise TypeError(f"step_advantages must be floating, got dtype {adv.dtype}")
    bad = mask & ~np.isfinite(adv)
    if bad.any():
        b, t = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"step_advantages must be finite on executed actions; "
                         f"{int(bad.sum())} non-finite, first at [trajectory {b}, step {t}]: "
                         f"{adv[b, t]}")
    return adv.astype(np.float32), mask


def lvopd_gate(step_advantages, step_mask, *, normalize: str = "std",
               eps: float = 1e-6) -> np.ndarray:
    """Per-action weights w_t = max(0, -Â_t); [B, T] float32 numpy, 0 off the mask.

    ``normalize="std"`` divides by the standard deviation of the valid step advantages over
    the whole batch (Â = A / (std + eps)); ``"none"`` uses them as given. Host-side.
    """
    if normalize not in GATE_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {GATE_NORMALIZATIONS}, got {normalize!r}")
    adv, mask = _check_step_arrays(step_advantages, step_mask)
    adv = np.where(mask, adv, 0.0)
    if normalize == "std" and mask.any():
        adv = adv / (float(adv[mask].std()) + eps)
    return np.where(mask, np.maximum(-adv, 0.0), 0.0).astype(np.float32)


def _pure_gate(step_advantages, step_mask, *, success=None, normalize="std"):
    _, mask = _check_step_arrays(step_advantages, step_mask)
    return mask.astype(np.float32)


def _trajectory_gate(step_advantages, step_mask, *, success=None, normalize="std"):
    _, mask = _check_step_arrays(step_advantages, step_mask)
    if success is None:
        raise ValueError("the 'trajectory' gate needs success [B] (which trajectories failed)")
    success = np.asarray(success)
    if success.shape != mask.shape[:1] or success.dtype != np.bool_:
        raise ValueError(f"success must be bool [B] = [{mask.shape[0]}], got "
                         f"{success.dtype} {success.shape}")
    return (mask & ~success[:, None]).astype(np.float32)


def _lvopd_gate(step_advantages, step_mask, *, success=None, normalize="std"):
    return lvopd_gate(step_advantages, step_mask, normalize=normalize)


GATES: Registry[Callable[..., np.ndarray]] = Registry("gate")


def register_gate(name: str, fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Register ``fn(step_advantages, step_mask, *, success, normalize) -> [B, T]`` weights (a
    name registered twice is a ``jaxdm.registry.DuplicateNameError``)."""
    return GATES.register(name, fn)


register_gate("lvopd", _lvopd_gate)
register_gate("pure", _pure_gate)
register_gate("trajectory", _trajectory_gate)


def gate_weights(mode: str, step_advantages, step_mask, *, success=None,
                 normalize: str = "std") -> np.ndarray:
    """The registered gate ``mode`` over the whole batch: [B, T] float32, 0 off the mask."""
    gate = GATES.get(mode)
    if normalize not in GATE_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {GATE_NORMALIZATIONS}, got {normalize!r}")
    return gate(step_advantages, step_mask, success=success, normalize=normalize)


def lvopd_distill_loss(
    student: jax.Array,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    step_weights: jax.Array,
    token_action_index: jax.Array,
    token_mask: jax.Array,
    *,
    lm_head: jax.Array | None = None,
    k: int = 16,
    reduction: str = "token-mean",
    impl: str = "auto",
    floor_min: float = DEFAULT_FLOOR_MIN,
    block_v: int | None = None,
    block_t: int | None = None,
    tail: bool = False,
    gate_capacity: int | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Gated top-k reverse-KL distillation loss of LVOPD; returns ``(loss, metrics)``.

    Args:
      student: student logits [B, L, V], or final hidden states [B, L, d] when ``lm_head``
        is given (then the fused kernel never forms the logits).
      teacher_ids, teacher_logprobs: [B, L, K_T] the teacher's top-K_T tokens per position
        and their (finite) log-probs.
      step_weights: [B, T] per-action weights from ``gate_weights`` (0 = no distillation).
      token_action_index: [B, L] int, the action slot each token belongs to.
      token_mask: [B, L] bool, generated (action) tokens; others get no loss.
      lm_head: optional [d, V] LM-head weight.
      k: student support size. reduction: a ``jaxdm.kernels.weighted_kl_loss`` reduction.
      impl, floor_min, block_v, block_t, tail: passed to the top-k reverse KL (``tail``:
        the tail bucket, ``jaxdm.kernels.topk_reverse_kl``).
      gate_capacity: a static int: the gate inside the kernel (only the tokens with a
        positive gate are computed, compacted into this many rows; ``jaxdm.kernels``). The
        loss is the same; the KL metric is then ``lvopd/kl_mean_gated``, over those tokens.

    Returns:
      loss: scalar ``weighted_kl_loss(KL, w, token_mask, reduction)``.
      metrics: ``lvopd/loss``, ``lvopd/kl_mean`` (ungated, over action tokens),
        ``lvopd/gate_mean`` (over action tokens), ``lvopd/gated_token_fraction`` (w > 0),
        and the ``lvopd/weighted_kl/sum`` / ``lvopd/weighted_kl/count`` pair.
    """
    token_mask = jnp.asarray(token_mask)
    if token_mask.ndim != 2:
        raise ValueError(f"token_mask must be [B, L], got shape {token_mask.shape}")
    if token_mask.dtype != jnp.bool_:
        raise TypeError(f"token_mask must be bool, got dtype {token_mask.dtype}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    student = jnp.asarray(student)
    if student.ndim != 3 or student.shape[:2] != token_mask.shape:
        raise ValueError(
            f"student must be [B, L, V] (or [B, L, d] with lm_head) with [B, L] = "
            f"{token_mask.shape} (token_mask), got {student.shape}"
        )
    token_gate = broadcast_to_tokens(step_weights, token_action_index, token_mask)  # [B, L]
    kl_kwargs = dict(
        k=k, mask=token_mask, impl=impl, floor_min=floor_min, block_v=block_v, block_t=block_t,
        tail=tail,
    )
    if gate_capacity is not None:
        kl_kwargs.update(gate=token_gate, capacity=gate_capacity)
    if lm_head is None:
        kl = topk_reverse_kl(student, teacher_ids, teacher_logprobs, **kl_kwargs)
    else:
        kl = fused_linear_topk_reverse_kl(
            student, lm_head, teacher_ids, teacher_logprobs, **kl_kwargs
        )
    loss, met = weighted_kl_loss(kl, token_gate, token_mask, reduction=reduction)
    if gate_capacity is None:
        kl_metric = {"lvopd/kl_mean": met["distill/kl_mean"]}
    else:  # the gated-off tokens' KL was never computed (0 in kl)
        on = token_mask & (token_gate > 0)
        kl_metric = {"lvopd/kl_mean_gated": jnp.sum(jnp.where(on, kl, 0.0))
                     / jnp.maximum(jnp.sum(on), 1)}
    metrics = {
        "lvopd/loss": loss,
        **kl_metric,
        "lvopd/gate_mean": met["distill/weight_mean"],
        "lvopd/gated_token_fraction": met["distill/active_fraction"],
        "lvopd/weighted_kl/sum": met["distill/weighted_kl_sum"],
        "lvopd/weighted_kl/count": met["distill/count"],
    }
    return loss, metrics
