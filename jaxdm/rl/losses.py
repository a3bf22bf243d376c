"""PPO-style policy loss as used by veRL (seed 000, Appendix D): unreduced terms + reducers.

Per-token terms are computed unreduced ([B, L]) by ``ppo_token_terms`` and aggregated by
``aggregate`` (a separate, tested reducer); ``ppo_loss`` composes the two and returns
``(loss, metrics)`` with slash-separated metric keys. Metrics that must be averaged across
mini-batches also come as ``.../sum`` and ``.../count`` pairs so callers can combine them
exactly.

Symbols: logπ = ``logp`` (current policy), logπ_old = ``old_logp`` (sampling policy),
logπ_ref = ``ref_logp`` (frozen reference), A = ``advantages`` (per token), ε = clip_eps,
c = dual_clip, β = kl_coef, η = entropy_coef.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp

from jaxdm.registry import Registry

__all__ = ["PPOTerms", "ppo_token_terms", "aggregate", "ppo_loss", "AGGREGATIONS", "k3_kl"]


class PPOTerms(NamedTuple):
    """Unreduced per-token terms, each [B, L] float32 (0 where the mask is False)."""

    pg_loss: jnp.ndarray       # clipped (and dual-clipped) surrogate, to minimise
    kl: jnp.ndarray            # k3 estimate of KL(π || π_ref)
    entropy: jnp.ndarray       # policy entropy (zeros if not given)
    clipped: jnp.ndarray       # 1.0 where the ε-clip was active
    dual_clipped: jnp.ndarray  # 1.0 where the dual clip was active (A < 0)
    approx_kl: jnp.ndarray     # logπ_old − logπ (veRL's ppo_kl)
    ratio: jnp.ndarray         # π / π_old


def k3_kl(logp, ref_logp, *, clamp: float = 10.0):
    """Low-variance KL estimator k3 = e^{ref−logp} − (ref − logp) − 1 (≥ 0), clamped."""
    log_ratio = ref_logp - logp
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -clamp, clamp)


def _check_same(mask, **arrays) -> None:
    if mask.ndim != 2:
        raise ValueError(f"mask must be [B, L], got shape {list(mask.shape)}")
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be bool, got {mask.dtype}")
    for name, x in arrays.items():
        if x is not None and tuple(x.shape) != tuple(mask.shape):
            raise ValueError(f"{name} must have the mask's shape [B, L]={list(mask.shape)}, "
                             f"got {list(x.shape)}")


def ppo_token_terms(logp, old_logp, ref_logp, advantages, mask, *, clip_eps: float = 0.2,
                    dual_clip: float = 3.0, entropy=None) -> PPOTerms:
    """veRL's clipped surrogate with dual clip, per token, unreduced.

    r = exp(logπ − logπ_old) (log-ratio clamped to [−20, 20]); L1 = −A r,
    L2 = −A clip(r, 1 − ε, 1 + ε), L = max(L1, L2); for A < 0 additionally
    L = min(L, −c A) (dual clip, c > 1). KL to the reference: k3 (``k3_kl``).
    ``ref_logp`` may be None (no reference: KL term zeros).
    """
    logp, old_logp, advantages, mask = map(jnp.asarray, (logp, old_logp, advantages, mask))
    ref_logp = None if ref_logp is None else jnp.asarray(ref_logp)
    entropy = None if entropy is None else jnp.asarray(entropy)
    _check_same(mask, logp=logp, old_logp=old_logp, ref_logp=ref_logp,
                advantages=advantages, entropy=entropy)
    if dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    f32 = jnp.float32
    logp, old_logp, adv = logp.astype(f32), old_logp.astype(f32), advantages.astype(f32)
    log_ratio = jnp.clip(logp - old_logp, -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    clip_loss = jnp.maximum(l1, l2)
    l3 = -adv * dual_clip
    dual = jnp.minimum(l3, clip_loss)
    pg = jnp.where(adv < 0, dual, clip_loss)
    zero = jnp.zeros_like(pg)
    kl = zero if ref_logp is None else k3_kl(logp, ref_logp.astype(f32))
    ent = zero if entropy is None else entropy.astype(f32)
    m = mask
    return PPOTerms(
        pg_loss=jnp.where(m, pg, 0.0),
        kl=jnp.where(m, kl, 0.0),
        entropy=jnp.where(m, ent, 0.0),
        clipped=jnp.where(m & (l2 > l1), 1.0, 0.0),
        dual_clipped=jnp.where(m & (adv < 0) & (l3 < clip_loss), 1.0, 0.0),
        approx_kl=jnp.where(m, old_logp - logp, 0.0),
        ratio=jnp.where(m, ratio, 0.0),
    )


def _seq_mean(per_row, row_tokens):
    rows = (row_tokens > 0).astype(jnp.float32)
    return (per_row * rows).sum() / jnp.maximum(rows.sum(), 1.0)


# aggregation mode -> reduce(x [B, L] (0 off the mask), m [B, L] float mask) -> scalar
AGGREGATIONS: Registry[Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]] = Registry(
    "aggregation mode")
AGGREGATIONS.register("token-mean", lambda x, m: x.sum() / jnp.maximum(m.sum(), 1.0))
AGGREGATIONS.register("seq-mean-token-sum", lambda x, m: _seq_mean(x.sum(axis=1), m.sum(axis=1)))
AGGREGATIONS.register("seq-mean-token-mean", lambda x, m: _seq_mean(
    x.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0), m.sum(axis=1)))


def aggregate(values, mask, mode: str = "token-mean"):
    """Reduce a [B, L] per-token term to a scalar (``AGGREGATIONS``).

    - ``token-mean``: Σ_{b,l} m x / Σ m (every token weighs the same; veRL's default).
    - ``seq-mean-token-sum``: mean over sequences with ≥1 token of Σ_l m x.
    - ``seq-mean-token-mean``: mean over sequences with ≥1 token of their token mean.
    An empty mask gives 0.
    """
    reduce = AGGREGATIONS.get(mode)
    values, mask = jnp.asarray(values), jnp.asarray(mask)
    _check_same(mask, values=values)
    m = mask.astype(jnp.float32)
    return reduce(jnp.where(mask, values.astype(jnp.float32), 0.0), m)


def ppo_loss(logp, old_logp, ref_logp, advantages, mask, *, clip_eps: float = 0.2,
             dual_clip: float = 3.0, kl_coef: float = 0.01, entropy=None,
             entropy_coef: float = 0.001, aggregation: str = "token-mean"):
    """J_PPO of seed 000 (veRL): clipped + dual-clipped surrogate, k3 KL, entropy bonus.

    loss = agg(L_pg) + β · agg(k3) − η · agg(H), aggregated with ``aggregation``
    (token-mean by default).

    Args:
      logp, old_logp, ref_logp: [B, L] log-probs of the generated tokens under the current,
        sampling and reference policies (``ref_logp`` None: no KL term).
      advantages: [B, L] per-token advantages (``broadcast_to_tokens``).
      mask: [B, L] bool, the tokens to train on.
      entropy: optional [B, L] per-token entropy of the current policy.

    Returns:
      (loss scalar, metrics) with keys ``loss/total``, ``loss/pg``, ``loss/kl``,
      ``loss/entropy``, ``ppo/clip_frac``, ``ppo/dual_clip_frac``, ``ppo/approx_kl``,
      ``ppo/ratio_mean``, ``ppo/kl_ref``, ``ppo/entropy``, ``ppo/tokens`` and ``/sum`` pairs
      of the token-level statistics.
    """
    terms = ppo_token_terms(logp, old_logp, ref_logp, advantages, mask, clip_eps=clip_eps,
                            dual_clip=dual_clip, entropy=entropy)
    mask = jnp.asarray(mask)
    pg = aggregate(terms.pg_loss, mask, aggregation)
    kl = aggregate(terms.kl, mask, aggregation)
    ent = aggregate(terms.entropy, mask, aggregation)
    loss = pg + kl_coef * kl - entropy_coef * ent
    n = mask.sum().astype(jnp.float32)
    tok = lambda x: x.sum() / jnp.maximum(n, 1.0)  # noqa: E731 - token mean of a 0-masked term
    metrics = {
        "loss/total": loss,
        "loss/pg": pg,
        "loss/kl": kl,
        "loss/entropy": ent,
        "ppo/clip_frac": tok(terms.clipped),
        "ppo/dual_clip_frac": tok(terms.dual_clipped),
        "ppo/approx_kl": tok(terms.approx_kl),
        "ppo/ratio_mean": tok(terms.ratio),
        "ppo/kl_ref": tok(terms.kl),
        "ppo/entropy": tok(terms.entropy),
        "ppo/tokens": n,
        "ppo/clip_frac/sum": terms.clipped.sum(),
        "ppo/approx_kl/sum": terms.approx_kl.sum(),
        "ppo/kl_ref/sum": terms.kl.sum(),
        "ppo/entropy/sum": terms.entropy.sum(),
    }
    return loss, metrics


def clipped_value_loss(values, old_values, returns, mask, *, clip: float = 0.2):
    """PPO's clipped value loss: ½ · mean over ``mask`` of max((V − R)², (V_clip − R)²).

    V_clip = V_old + clip(V − V_old, −clip, clip) keeps the critic near the values the
    advantages were computed with; ``clip <= 0`` turns clipping off (plain ½ (V − R)²).

    Args:
      values: [M] current critic values; old_values: [M] values at rollout time;
      returns: [M] targets (GAE returns); mask: [M] bool real rows.

    Returns:
      (loss, metrics) with ``loss/value``, ``value/clip_frac``, ``value/mean``,
      ``value/explained_var`` (1 − Var(R − V) / Var(R) over ``mask``).
    """
    values, old_values = jnp.asarray(values), jnp.asarray(old_values)
    returns, mask = jnp.asarray(returns), jnp.asarray(mask, bool)
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        if x.shape != mask.shape or x.ndim != 1:
            raise ValueError(f"{name} must have the mask's shape [M]={list(mask.shape)}, "
                             f"got {list(x.shape)}")
    w = mask.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    err = jnp.square(values - returns)
    if clip > 0:
        v_clip = old_values + jnp.clip(values - old_values, -clip, clip)
        err_clip = jnp.square(v_clip - returns)
        per = jnp.maximum(err, err_clip)
        clipped = (err_clip > err).astype(jnp.float32)
    else:
        per, clipped = err, jnp.zeros_like(err)
    loss = 0.5 * (per * w).sum() / n
    mean_r = (returns * w).sum() / n
    var_r = (jnp.square(returns - mean_r) * w).sum() / n
    resid = returns - values
    mean_e = (resid * w).sum() / n
    var_e = (jnp.square(resid - mean_e) * w).sum() / n
    return loss, {"loss/value": loss, "value/clip_frac": (clipped * w).sum() / n,
                  "value/mean": (values * w).sum() / n,
                  "value/explained_var": 1.0 - var_e / jnp.maximum(var_r, 1e-8)}
