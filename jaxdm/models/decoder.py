"""One decoder for the Llama (SmolLM2), Qwen2/Qwen2.5 and Qwen3 families, as pure functions.

Parameters are a plain dict pytree; per-layer weights are stacked on a leading layer axis so
the layer loop is one `lax.scan` (fast to compile, easy to shard). Every public entry point is
jitted with the config static.

Einsum legend (capital letters are axes):
  B batch          S query tokens      T key tokens (same stream)   C cached tokens
  L layers         D model width       F SwiGLU width               V vocabulary
  N query heads    K key/value heads   G query heads per KV head (N = K * G)   H head dim

Parameter layout (all stacked over L inside params["layers"]):
  embed [V, D]; final_norm [D]; lm_head [D, V] (absent when embeddings are tied)
  attn_norm [L, D]; q [L, D, N, H]; k, v [L, D, K, H]; o [L, N, H, D]
  q_bias [L, N, H]; k_bias, v_bias [L, K, H]   (config.qkv_bias)
  o_bias [L, D]                                (config.o_bias)
  q_norm, k_norm [L, H]                        (config.qk_norm)
  mlp_norm [L, D]; gate, up [L, D, F]; down [L, F, D]; gate_bias, up_bias [L, F];
  down_bias [L, D]                             (config.mlp_bias)

Attention groups the N query heads as [K, G] so GQA never repeats keys/values, and a batch-1
KV cache is contracted against all B suffix rows with one einsum that has no batch axis on
the cache side (no copy of the cache per row).

This module is the model and its XLA paths (every platform, differentiable). The CPU kernels
are a seam it calls: ``jaxdm.models.cpu.dispatch`` picks the matmul kernel or ``_einsum`` for
each projection and the fused attention kernel or ``xla_attend`` / XLA's segment attention
when tracing; ``jaxdm.models.cpu.scan.scan_layers`` runs the layer loop (bf16 stacks as bits,
stacks the matmul kernel reads in place).
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.models.cpu import dispatch as cpu_dispatch, linear as cpu_linear, \
    matmul as cpu_matmul, scan as cpu_scan
from jaxdm.models.config import ModelConfig

Params = dict[str, Any]

# A finite "minus infinity" keeps fully masked rows finite (uniform instead of NaN).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# Query block size of causal attention on long inputs (forward/prefill `attn_chunk`).
DEFAULT_ATTN_CHUNK = 256


class KVCache(NamedTuple):
    """Keys/values of a processed context.

    k, v: [L, B, C, K, H] (B may be 1 and shared by many suffix rows).
    lengths: [B] int32, how many leading cache slots of each row hold real tokens.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array


# ----------------------------------------------------------------------------- building blocks

def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in fp32, scaled by `weight`, returned in x's dtype (HF convention)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * normed.astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [H/2] and the attention (cos/sin) scale for the config's RoPE type.

    Computed on the host in float64: the values are constants of the config.
    """
    dim = config.head_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = config.rope_scaling
    rope_type = config.rope_type
    if rope_type == "default":
        return inv_freq, 1.0
    factor = float(scaling.get("factor", 1.0))
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope_type == "llama3":
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return np.where(medium, smoothed, scaled), 1.0
    if rope_type == "yarn":
        orig = float(scaling.get("original_max_position_embeddings")
                     or config.max_position_embeddings)
        beta_fast = float(scaling.get("beta_fast") or 32.0)
        beta_slow = float(scaling.get("beta_slow") or 1.0)

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attention_factor = (mscale(factor, m) / mscale(factor, m_all) if m and m_all
                                else mscale(factor))

        def correction_dim(rotations: float) -> float:
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extrapolation = 1.0 - ramp
        inv = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
        return inv, float(attention_factor)
    raise ValueError(f"unsupported rope_type {rope_type!r}")


def rope_cos_sin(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables [..., H/2] in fp32 for integer positions [...]."""
    inv_freq, scale = rope_inv_freq(config)
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, S, heads..., H] by half-split RoPE (HF rotate_half); cos/sin [B, S, H/2]."""
    half = x.shape[-1] // 2
    extra = x.ndim - cos.ndim
    cos = cos.reshape(cos.shape[:2] + (1,) * extra + cos.shape[2:])
    sin = sin.reshape(sin.shape[:2] + (1,) * extra + sin.shape[2:])
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _mm(spec: str, x: jax.Array, w: "jax.Array | cpu_scan.LayerOf | Adapted",
        valid: jax.Array | None = None) -> jax.Array:
    """einsum of activations x with a weight w: x is cast to w's dtype and the products are
    accumulated and returned in fp32 (a no-op change for fp32 weights; see _embed).

    The CPU seam picks the implementation (``cpu.dispatch.projection``): a spec that is one
    matmul runs on the matmul kernel where it is on and takes the operands, else ``_einsum``.
    w may be a ``cpu.scan.LayerOf`` (a layer of a weight stack the layer loop did not slice:
    the kernel reads the stack in place) or an ``Adapted`` weight (a frozen weight and its
    LoRA factors): x·W + s·(x·A)·B.

    valid (int [B], x [B, S, ...]): only x[b, :valid[b]] is wanted (a packed row's padding
    tail follows): the kernel computes no other row (their results are zeros); XLA's dot
    computes every row (nothing reads the others)."""
    if isinstance(w, Adapted):
        return w.project(spec, x, valid)
    return _project(spec, x.astype(w.dtype), w, valid)


def _einsum(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """``_mm``'s XLA path: the einsum with products accumulated and returned in fp32."""
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)


_project = cpu_dispatch.projection(_einsum)


def _queries(lp: Params, config: ModelConfig, h: jax.Array, cos: jax.Array, sin: jax.Array,
             valid: jax.Array | None = None):
    """Projects h [B, S, D] to queries [B, S, K, G, H] with norm and RoPE (computed in fp32,
    returned in the weights' dtype). valid: as ``_mm``'s."""
    q = _mm("BSD,DNH->BSNH", h, lp["q"], valid)
    if config.qkv_bias:
        q = q + lp["q_bias"]
    if config.qk_norm:
        q = rms_norm(q, lp["q_norm"], config.rms_norm_eps)
    q = apply_rope(q, cos, sin).astype(lp["q"].dtype)
    b, s = h.shape[:2]
    return q.reshape(b, s, config.num_kv_heads, config.num_groups, config.head_dim)


def _keys_values(lp: Params, config: ModelConfig, h: jax.Array, cos: jax.Array,
                 sin: jax.Array, valid: jax.Array | None = None):
    """Projects h [B, S, D] to keys and values [B, S, K, H] (keys with norm and RoPE)."""
    k = _mm("BSD,DKH->BSKH", h, lp["k"], valid)
    v = _mm("BSD,DKH->BSKH", h, lp["v"], valid)
    if config.qkv_bias:
        k, v = k + lp["k_bias"], v + lp["v_bias"]
    if config.qk_norm:
        k = rms_norm(k, lp["k_norm"], config.rms_norm_eps)
    dtype = lp["k"].dtype
    return apply_rope(k, cos, sin).astype(dtype), v.astype(dtype)


def _qkv(lp: Params, config: ModelConfig, h: jax.Array, cos: jax.Array, sin: jax.Array,
         valid: jax.Array | None = None):
    """q [B, S, K, G, H] and k, v [B, S, K, H] of h [B, S, D] (``_queries``, ``_keys_values``)."""
    return (_queries(lp, config, h, cos, sin, valid),
            *_keys_values(lp, config, h, cos, sin, valid))


def _out_and_mlp(lp: Params, config: ModelConfig, x: jax.Array, attn: jax.Array,
                 valid: jax.Array | None = None) -> jax.Array:
    """Adds the attention output attn [B, S, N, H] and the SwiGLU MLP to the residual x
    (valid: as ``_mm``'s)."""
    out = _mm("BSNH,NHD->BSD", attn, lp["o"], valid)
    if config.o_bias:
        out = out + lp["o_bias"]
    x = x + out
    h = rms_norm(x, lp["mlp_norm"], config.rms_norm_eps)
    gate = _mm("BSD,DF->BSF", h, lp["gate"], valid)
    up = _mm("BSD,DF->BSF", h, lp["up"], valid)
    if config.mlp_bias:
        gate, up = gate + lp["gate_bias"], up + lp["up_bias"]
    down = _mm("BSF,FD->BSD", jax.nn.silu(gate) * up, lp["down"], valid)
    if config.mlp_bias:
        down = down + lp["down_bias"]
    return x + down


def attend(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]) -> jax.Array:
    """Softmax attention of q [B, S, K, G, H] over the keys of one or more sources.

    Each source is (k [Bk, T, K, H], v [Bk, T, K, H], mask [B, S, T] bool) with Bk = B, or
    Bk = 1 for a cache shared by all B rows (contracted without a copy per row); one softmax
    spans the keys of all sources (a cache plus the new tokens, say). Returns [B, S, N, H].
    A fully masked row comes out as the uniform average of the values (finite).

    The CPU seam picks the implementation (``cpu.dispatch.attention``): on CPU the forward
    runs the fused kernel of ``jaxdm.models.cpu.attention`` where it is on (x86-64 with
    AVX-512; ``JAXDM_CPU_ATTENTION=0`` turns it off) and takes the operands; otherwise, on
    other platforms and under differentiation, ``xla_attend``.
    """
    return _attend(q, sources)


def xla_attend(q: jax.Array, sources: list[tuple[jax.Array, jax.Array, jax.Array]]
               ) -> jax.Array:
    """``attend`` in XLA operations (every platform, differentiable).

    Layout and arithmetic chosen by measurement on CPU: one KV head at a time (a Python
    loop over K, unrolled at trace time), its G query heads stacked as G*S rows of a matmul
    batched over B only. XLA:CPU runs these as fused dot + bias + max kernels and contracts
    the probabilities at its bf16 matmul rate; with K as a second batch dimension the same
    FLOPs ran 1.6x (fp32) to 4x (bf16) slower at the readout's shapes (issue 17). The mask
    enters as an additive bias shared by the G heads; the normalisation is applied to the
    [.., H] output instead of the [.., T] probabilities. A fully masked row comes out as the
    uniform average (finite).
    """
    b, s, kh, g, hd = q.shape
    q = q * (1.0 / math.sqrt(hd))
    biases = [jnp.where(mask, 0.0, MASK_VALUE).astype(jnp.float32)[:, None]  # [B, 1, S, T]
              for _, _, mask in sources]
    heads = []
    for h in range(kh):
        qh = jnp.transpose(q[:, :, h], (0, 2, 1, 3))  # [B, G, S, H]
        scored = []
        for (k, v, _), bias in zip(sources, biases):
            kk, vv = k[:, :, h], v[:, :, h]  # [Bk, T, H]
            if kk.shape[0] == 1 and b > 1:  # a shared cache: all B*G*S rows at once
                logits = jnp.einsum("RH,TH->RT", qh.reshape(b * g * s, hd), kk[0],
                                    preferred_element_type=jnp.float32)
            else:
                logits = jnp.einsum("BRH,BTH->BRT", qh.reshape(b, g * s, hd), kk,
                                    preferred_element_type=jnp.float32)
            scored.append((logits.reshape(b, g, s, -1) + bias, vv))
        top = functools.reduce(jnp.maximum, [lg.max(-1, keepdims=True) for lg, _ in scored])
        top = jax.lax.stop_gradient(top)  # a constant shift: keeps exp finite, cancels exactly
        out, denom = None, None
        for logits, vv in scored:
            p = jnp.exp(logits - top)
            total = p.sum(-1, keepdims=True)
            if vv.shape[0] == 1 and b > 1:
                part = jnp.einsum("RT,TH->RH", p.reshape(b * g * s, -1).astype(vv.dtype), vv[0],
                                  preferred_element_type=jnp.float32).reshape(b, g * s, hd)
            else:
                part = jnp.einsum("BRT,BTH->BRH", p.reshape(b, g * s, -1).astype(vv.dtype), vv,
                                  preferred_element_type=jnp.float32)
            out = part if out is None else out + part
            denom = total if denom is None else denom + total
        heads.append(out.reshape(b, g, s, hd) / denom)  # [B, G, S, H]
    out = jnp.stack(heads, axis=1).astype(q.dtype)  # [B, K, G, S, H]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, s, kh * g, hd)


# The kernel's forward with xla_attend's derivatives where it pays, else xla_attend.
_attend = cpu_dispatch.attention(xla_attend)


def _embed(params: Params, tokens: jax.Array) -> jax.Array:
    """Token embeddings as the residual stream, which stays fp32 whatever the weights' dtype.

    With bf16 weights every matmul takes bf16 inputs and accumulates in fp32 (``_mm``), but
    the residual sums stay fp32: on SmolLM2-135M's Yes/No readout a bf16 residual stream put
    P(Yes) 1.6e-2 / 2.3e-2 (Hindsight+Progress / Prefix+Value) away from fp32, an fp32 one
    3.4e-3 / 5.5e-3; rounding the weights alone costs 0.4e-3 / 1.1e-3 (issue 17)."""
    embed = params["embed"]
    return jnp.take(embed, tokens, axis=0).astype(jnp.promote_types(embed.dtype, jnp.float32))


def _final_norm(params: Params, config: ModelConfig, x: jax.Array) -> jax.Array:
    """The final RMSNorm of the fp32 residual stream, in the weights' dtype (the hidden
    states callers get keep the dtype of the parameters)."""
    return rms_norm(x, params["final_norm"], config.rms_norm_eps).astype(
        params["final_norm"].dtype)


def _check_tokens(name: str, tokens: jax.Array, positions: jax.Array) -> None:
    if tokens.ndim != 2:
        raise ValueError(f"{name}: tokens must be [B, S], got shape {tokens.shape}")
    if positions.shape != tokens.shape:
        raise ValueError(f"{name}: positions shape {positions.shape} != tokens shape "
                         f"{tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{name}: tokens must be integer ids, got dtype {tokens.dtype}")


def _check_params(params: Params, config: ModelConfig) -> None:
    embed = params.get("embed") if isinstance(params, dict) else None
    if embed is None or tuple(embed.shape) != (config.vocab_size, config.hidden_size):
        got = None if embed is None else tuple(embed.shape)
        raise ValueError(f"params['embed'] must be [{config.vocab_size}, {config.hidden_size}] "
                         f"for this config, got {got}")


# An attention plan: per query block (q_start, q_end), the key ranges [(k_start, k_end), ...]
# it may need (everything outside them is masked anyway, so it is never computed) and cuts:
# static candidate ends for its first range, one picked at run time (empty: no choice).
AttentionPlan = tuple[tuple[int, int, tuple[tuple[int, int], ...], tuple[int, ...]], ...]


def causal_plan(s: int, chunk: int) -> AttentionPlan:
    """Query block [i*chunk, (i+1)*chunk) meets keys [0, (i+1)*chunk): about half the FLOPs and
    logits memory of the full [S, S] product on long sequences (masks within the causal one)."""
    return tuple((start, min(s, start + chunk), ((0, min(s, start + chunk)),), ())
                 for start in range(0, s, chunk))


def trunk_suffix_plan(s: int, trunk: int, window: int, chunk: int,
                      context_cuts: int = 8) -> AttentionPlan:
    """Rows that hold a shared context in [0, trunk) and continuations after it, each at most
    ``window`` tokens long and seeing (part of) the context and its own earlier tokens: context
    blocks are causal; a continuation block meets the context and only the ``window`` tokens
    before it, never the other continuations further back. Continuations that see only the
    start of the context (Prefix judging) skip the rest: the context range of a continuation
    block is cut, at run time, at the first of ``context_cuts`` static bounds that covers what
    its tokens see."""
    plan = [blk for blk in causal_plan(trunk, chunk)]
    step = -(-trunk // max(1, context_cuts))
    cuts = tuple(sorted({min(trunk, step * (i + 1)) for i in range(max(1, context_cuts))}))
    for start in range(trunk, s, chunk):
        end = min(s, start + chunk)
        plan.append((start, end, ((0, trunk), (max(trunk, start - window), end)), cuts))
    return tuple(plan)


def _planned_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask_fn: Any,
                       plan: AttentionPlan, need_fn: Any = None) -> jax.Array:
    """Self-attention computed only over the key ranges of ``plan``; mask_fn(qs, qe, ks, ke)
    gives the [B, qe - qs, ke - ks] bool mask of that block. An entry with cuts has its first
    range ending at the smallest cut >= need_fn(qs, qe) (the number of leading keys its
    queries may see), chosen at run time with ``lax.switch``."""
    outs = []
    for qs, qe, ranges, cuts in plan:

        def block(q, k, v, ranges=ranges, qs=qs, qe=qe):
            sources = [(k[:, ks:ke], v[:, ks:ke], mask_fn(qs, qe, ks, ke)) for ks, ke in ranges]
            return attend(q[:, qs:qe], sources)

        if len(cuts) < 2:
            outs.append(block(q, k, v))
            continue
        (ks0, _), rest = ranges[0], ranges[1:]
        branches = [functools.partial(block, ranges=((ks0, c),) + rest) for c in cuts]
        index = jnp.clip(jnp.searchsorted(jnp.asarray(cuts), need_fn(qs, qe)), 0, len(cuts) - 1)
        outs.append(jax.lax.switch(index, branches, q, k, v))
    return jnp.concatenate(outs, axis=1)


def _planned(mask_fn: Any, plan: AttentionPlan | None = None, need_fn: Any = None) -> Any:
    """Self-attention (q, k, v) -> [B, S, N, H] over the key ranges of ``plan`` (None: one
    block, all keys) with mask_fn(qs, qe, ks, ke) -> [B, qe - qs, ke - ks] bool (True = may
    attend); see ``_planned_attention``."""
    def attention(q, k, v):
        blocks = plan if plan is not None else ((0, q.shape[1], ((0, k.shape[1]),), ()),)
        return _planned_attention(q, k, v, mask_fn, blocks, need_fn)
    return attention


def segment_mask(slot: jax.Array, seg: jax.Array, sees: jax.Array, kseg: jax.Array,
                 qs: int, qe: int, ks: int, ke: int) -> jax.Array:
    """The segment rule's mask [B, qe - qs, ke - ks] (True = may attend) of queries [qs, qe)
    over keys [ks, ke): key j is visible to query i iff it is context (kseg[j] == 0) below
    sees[i], or of the query's own segment (seg[i] > 0) at or before its slot[i]. slot, seg,
    sees [B, Sq] (int) describe the queries, kseg [B, T] the keys."""
    kseg, kidx = kseg[:, None, ks:ke], jnp.arange(ks, ke)[None, None]
    qseg = seg[:, qs:qe, None]
    return (((kseg == 0) & (kidx < sees[:, qs:qe, None]))
            | ((kseg == qseg) & (qseg > 0) & (kidx <= slot[:, qs:qe, None])))


def _segment_attention_xla(q, k, v, slot, seg, sees, kseg, need, *,
                           plan: AttentionPlan | None):
    """``attend_segments`` in XLA operations, over ``plan``'s key ranges."""
    return _planned(functools.partial(segment_mask, slot, seg, sees, kseg), plan,
                    lambda qs, qe: jnp.max(need[:, qs:qe]))(q, k, v)


def attend_segments(q: jax.Array, k: jax.Array, v: jax.Array, slot: jax.Array, seg: jax.Array,
                    sees: jax.Array, kseg: jax.Array, *, plan: AttentionPlan | None = None,
                    need: jax.Array | None = None) -> jax.Array:
    """Softmax attention of q [B, Sq, K, G, H] over k, v [B, T, K, H] under the segment rule
    (``segment_mask``) -> [B, Sq, N, H]. On CPU one call of the fused kernel
    (``cpu.attention``, picked by ``cpu.dispatch.segment_attention``), whatever the layout of
    contexts and continuations; elsewhere XLA's attention over ``plan``'s key ranges (None:
    all keys at once), need [B, Sq] (default sees) bounding the leading keys each query may
    see (for the plan's context cuts). A query that sees no key gets the uniform average of
    the values it was offered.

    Differentiable with its own backward pass (``segment_attention_vjp``): the forward keeps
    only q, k, v and the output, and the gradient recomputes each query block's probabilities
    over that block's key ranges alone, so training holds one block's [queries x keys] at a
    time (not every block's, nor every context cut's) and runs the forward on the kernel."""
    need = sees if need is None else need
    return _segment_attention(plan, q, k, v, slot, seg, sees, kseg, need)


# Query rows per block of the backward pass when the forward had no plan (the last layer's
# read slots against a whole row): bounds the [block x keys] probabilities held at once.
VJP_QUERY_BLOCK = 256


def segment_attention_vjp(q, k, v, out, dout, slot, seg, sees, kseg, need, *,
                          plan: AttentionPlan | None = None
                          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dq, dk, dv) of ``attend_segments`` at (q, k, v) with output ``out`` [B, Sq, N, H] and
    its cotangent ``dout``, block by block over ``plan`` (None: blocks of
    ``VJP_QUERY_BLOCK`` queries over all keys). Per block: logits over its key ranges (the
    context cut picked at run time as in the forward), probabilities P, then with
    Δ = Σ_h dout·out:  dv += Pᵀ·dout,  dS = P ∘ (dout·vᵀ - Δ),  dq = dS·k / √H,
    dk += dSᵀ·q / √H; dS = 0 for a query that sees no key (its output, the mean of the
    values, does not depend on q or k). fp32 softmax and accumulation; the products take q's
    precision: with bf16 q, k, v the operands (dout, P and dS rounded to bf16) are bf16 as in
    FlashAttention's bf16 backward (XLA:CPU's fp32 products were 3-5x slower on AMX), with
    fp32 q, k, v everything is fp32. dk and dv sum over the query rows, a form XLA:CPU runs
    4-9x slower than the others: ``cpu_matmul.contract_rows`` runs them on the matmul kernel
    where it is on (bf16 judge SFT step on the Xeon with AMX 7.6 -> 6.5 s, 2026-12-07). Pure,
    so it runs on every platform; in bf16 on AMX the backward kernel
    (``cpu.attention.make_segments_grad``) runs instead, with the same roundings."""
    b, sq, kh, g, hd = q.shape
    t = k.shape[1]
    scale = 1.0 / math.sqrt(hd)
    blocks = plan if plan is not None else tuple(
        (qs, min(sq, qs + VJP_QUERY_BLOCK), ((0, t),), ())
        for qs in range(0, sq, VJP_QUERY_BLOCK))
    f32 = lambda a: a.astype(jnp.float32)
    low = jnp.dtype(q.dtype) if jnp.dtype(q.dtype) in (jnp.bfloat16, jnp.float16) else None
    op = (lambda a: a.astype(low)) if low else f32   # a product's operand
    dot = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
    dout = f32(dout).reshape(b, sq, kh, g, hd)
    out = f32(out).reshape(b, sq, kh, g, hd)
    mask_fn = functools.partial(segment_mask, slot, seg, sees, kseg)

    def block_grads(dk, dv, qs, qe, ranges):
        # One KV head at a time, its G query heads stacked as G*q matmul rows batched over B
        # only (xla_attend's layout: with K and G as batch dimensions XLA:CPU ran the same
        # products several times slower).
        nq = qe - qs
        mask = jnp.concatenate([mask_fn(qs, qe, a, e) for a, e in ranges], axis=-1)
        bias = jnp.where(mask, 0.0, MASK_VALUE)[:, None]                  # [B, 1, q, n]
        # a query that sees no key gets the mean of the values, which does not depend on q
        # or k (autodiff of the masked softmax would differentiate the finite mask bias)
        seen = jnp.broadcast_to(jnp.any(mask, axis=-1)[:, None], (b, g, nq)).reshape(
            b, g * nq, 1).astype(jnp.float32)
        rows = lambda a: jnp.transpose(a, (0, 2, 1, 3)).reshape(b, g * nq, hd)  # [B,q,G,H]->
        dq_heads, dk_heads, dv_heads = [], [], []
        for h in range(kh):
            kb = jnp.concatenate([op(k[:, a:e, h]) for a, e in ranges], axis=1)  # [B, n, H]
            vb = jnp.concatenate([op(v[:, a:e, h]) for a, e in ranges], axis=1)
            qh = rows(op(q[:, qs:qe, h]))                                # [B, G*q, H]
            do = rows(dout[:, qs:qe, h])
            delta = jnp.sum(do * rows(out[:, qs:qe, h]), axis=-1, keepdims=True)
            logits = dot("BRH,BNH->BRN", qh, kb).reshape(b, g, nq, -1) * scale + bias
            p = jax.nn.softmax(logits, axis=-1).reshape(b, g * nq, -1)   # [B, G*q, n]
            ds = op(p * (dot("BRH,BNH->BRN", op(do), vb) - delta) * seen)
            dq_heads.append(dot("BRN,BNH->BRH", ds, kb).reshape(b, g, nq, hd) * scale)
            # dk, dv sum over the query rows: XLA:CPU's slow form (``contract_rows``), one
            # kernel call per row (the kernel takes one weight; vmap would fall back to XLA)
            dk_heads.append(jnp.stack([cpu_matmul.contract_rows(ds[i], qh[i])
                                       for i in range(b)]) * scale)
            pb, dob = op(p), op(do)
            dv_heads.append(jnp.stack([cpu_matmul.contract_rows(pb[i], dob[i])
                                       for i in range(b)]))
        dq = jnp.transpose(jnp.stack(dq_heads, axis=1), (0, 3, 1, 2, 4))  # [B, q, K, G, H]
        dkb, dvb = jnp.stack(dk_heads, axis=2), jnp.stack(dv_heads, axis=2)  # [B, n, K, H]
        at = 0
        for a, e in ranges:
            dk = dk.at[:, a:e].add(dkb[:, at:at + e - a])
            dv = dv.at[:, a:e].add(dvb[:, at:at + e - a])
            at += e - a
        return dq, dk, dv

    dk = jnp.zeros((b, t, kh, hd), jnp.float32)
    dv = jnp.zeros((b, t, kh, hd), jnp.float32)
    dqs = []
    for qs, qe, ranges, cuts in blocks:
        if len(cuts) < 2:
            dq, dk, dv = block_grads(dk, dv, qs, qe, ranges)
        else:
            # One branch runs (this is not differentiated again): no residuals per cut.
            (ks0, _), rest = ranges[0], ranges[1:]
            branches = [functools.partial(block_grads, qs=qs, qe=qe, ranges=((ks0, c),) + rest)
                        for c in cuts]
            index = jnp.clip(jnp.searchsorted(jnp.asarray(cuts), jnp.max(need[:, qs:qe])),
                             0, len(cuts) - 1)
            dq, dk, dv = jax.lax.switch(index, branches, dk, dv)
        dqs.append(dq)
    dq = jnp.concatenate(dqs, axis=1).astype(q.dtype)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype)


# The segment-rule kernel's forward where it is on (else XLA's), segment_attention_vjp's
# backward.
_segment_attention = cpu_dispatch.segment_attention(_segment_attention_xla,
                                                    segment_attention_vjp)


def _run_layers(params: Params, config: ModelConfig, x: jax.Array, positions: jax.Array,
                attention: Any, read: tuple[jax.Array, Any] | None = None,
                valid: jax.Array | None = None, past: tuple[jax.Array, jax.Array] | None = None,
                keep: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Runs all layers; returns (x, k [L,B,S,K,H], v [L,B,S,K,H]).

    attention(q [B, S, K, G, H], k, v [B, S, K, H]) -> [B, S, N, H]: each layer's
    self-attention (``_planned`` or ``attend_segments``).
    read: (rows [B, M] int, their attention (q [B, M, K, G, H], k, v) -> [B, M, N, H]) when
    only the residual stream at those rows is wanted: the last layer then runs its queries,
    attention, output projection and MLP at those rows only (its keys and values at every
    row), and x comes back as [B, M, D].
    valid (int [B]): only rows [0, valid[b]) of x[b] are wanted (the rest is padding): the
    matmul kernel skips the others (``_mm``); their values are then unspecified.
    past: (k, v [L, B, C, K, H]) of an earlier context (``forward_cached_suffixes``): each
    layer's attention then takes keys and values [B, C + S, K, H], the past's first; the k, v
    returned stay the new rows' own. keep: return only the first ``keep`` rows' k, v.
    """
    cos, sin = rope_cos_sin(config, positions)

    def split(inputs):
        return inputs if past is not None else (inputs, None)

    def with_past(k, v, lpast):
        if lpast is None:
            return k, v
        return (jnp.concatenate([lpast[0], k], axis=1),
                jnp.concatenate([lpast[1], v], axis=1))

    def kept(k, v):
        return (k, v) if keep is None else (k[:, :keep], v[:, :keep])

    def layer(x, inputs):
        lp, lpast = split(inputs)
        h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps)
        q, k, v = _qkv(lp, config, h, cos, sin, valid)
        out = _out_and_mlp(lp, config, x, attention(q, *with_past(k, v, lpast)), valid)
        return out, kept(k, v)

    xs = params["layers"] if past is None else (params["layers"], past)
    if read is None:
        x, (ks, vs) = cpu_scan.scan_layers(_maybe_remat(layer, config), x, xs)
        return x, ks, vs

    rows, read_attention = read
    at_rows = lambda a: jnp.take_along_axis(a, rows.reshape(rows.shape + (1,) * (a.ndim - 2)),
                                            axis=1)

    def last_layer(x, inputs):
        # nothing reads the other rows' outputs: no layer comes after this one
        lp, lpast = split(inputs)
        h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps)
        k, v = _keys_values(lp, config, h, cos, sin, valid)
        q = _queries(lp, config, at_rows(h), at_rows(cos), at_rows(sin))
        out = _out_and_mlp(lp, config, at_rows(x), read_attention(q, *with_past(k, v, lpast)))
        return x.at[jnp.arange(x.shape[0])[:, None], rows].set(out), kept(k, v)

    n_layers = config.num_layers

    def layer_or_last(x, inputs):
        lp, i = inputs
        return jax.lax.cond(i == n_layers - 1, last_layer, layer, x, lp)

    x, (ks, vs) = cpu_scan.scan_layers(_maybe_remat(layer_or_last, config), x,
                                       (xs, jnp.arange(n_layers)))
    return at_rows(x), ks, vs


@jax.tree_util.register_pytree_node_class
class Adapted:
    """A projection weight with a low-rank adapter, applied unmerged: ``_mm`` computes
    x·W + scale·(x·A)·B and never builds W + scale·A·B (``jaxdm.models.lora.adapt`` builds
    it; ``jaxdm.train.sft`` trains LoRA through it). base: the weight (stacked [L, ...] or one layer's), a [(L,) I, r],
    b [(L,) r, O] with I / O the products of base's input / output axes (as ``_mm``'s spec
    splits them). The layer scan slices the three like any other stacked leaf.

    Why: with the merged weight the gradient is a dense dW' = xᵀ·dy per projection (the
    full fine-tune's weight gradient, 2·N·T FLOPs, and a [L, I, O] stack alive in the
    backward pass) before it is contracted to dA, dB; unmerged, autodiff computes dA, dB from
    the rank-r products and no cotangent of the frozen W at all (``benchmarks/
    sft_memory.py --compare lora``)."""

    def __init__(self, base: Any, a: jax.Array, b: jax.Array, scale: float):
        self.base, self.a, self.b, self.scale = base, a, b, float(scale)

    @property
    def shape(self) -> tuple[int, ...]:
        """The frozen weight's shape (the adapter leaves it unchanged)."""
        return tuple(self.base.shape)

    @property
    def dtype(self):
        """The frozen weight's dtype (the adapters keep their own)."""
        return jnp.dtype(self.base.dtype)

    def project(self, spec: str, x: jax.Array, valid: jax.Array | None = None) -> jax.Array:
        """``einsum(spec, x, W + scale·A·B)`` without forming W + scale·A·B: the base product
        (the CPU kernel where it applies) plus ``scale · (x A) B`` (``_low_rank``: products in
        the weight's precision, fp32 accumulation); ``spec`` must be one matmul over the
        weight's leading axes (else ValueError)."""
        plan = cpu_dispatch.as_matmul(spec, x.shape, self.shape)
        if plan is None:
            raise ValueError(f"Adapted: {spec} is not one matmul over the weight's leading "
                             "axes")
        x_shape, _, out_shape = plan
        out = _mm(spec, x, self.base, valid)
        x = x.reshape(x_shape)
        if self.a.ndim != 2:  # stacked factors (not the layer loop's slices)
            low = jnp.matmul(x.astype(self.a.dtype), self.a, preferred_element_type=jnp.float32)
            low = jnp.matmul(low.astype(self.b.dtype), self.b,
                             preferred_element_type=jnp.float32)
            return out + self.scale * low.reshape(out_shape)
        low = _low_rank(self.scale, x.astype(self.base.dtype), self.a, self.b,
                        cpu_matmul.valid_rows(valid))
        return out + low.reshape(out_shape)

    def tree_flatten(self):
        """Pytree children (base, A, B); the scale is static."""
        return (self.base, self.a, self.b), self.scale

    @classmethod
    def tree_unflatten(cls, scale, children):
        """The inverse of ``tree_flatten``."""
        return cls(*children, scale)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _low_rank(scale: float, x: jax.Array, a: jax.Array, b: jax.Array,
              valid: jax.Array) -> jax.Array:
    """LoRA's update scale·(x·A)·B -> fp32 for x [..., I] (a layer's activations in the
    frozen weight's dtype), a [I, r], b [r, O]: products in x's precision (A and B rounded to
    it, fp32 accumulation; a no-op for fp32). Its tangent's transpose (``cpu.linear``) is
    the backward pass autodiff would not write: the cotangent rounded to x's dtype, skipped
    rows (valid) zero, dA = xᵀ·(s·g·Bᵀ) and dB = (s·x·A)ᵀ·g summed over the rows by
    ``cpu_matmul.contract_rows`` (on the matmul kernel as (small ᵀ·x)ᵀ: x is read in place;
    autodiff's xᵀ·(…) had XLA:CPU transpose the activations in fp32 for every projection,
    ~12 % of a LoRA step, and XLA's own row-contracting dots ran on Eigen's fp32 GEMM, ~7 %
    of the bf16 judge step: 4.75 -> 4.24 s on the Xeon with AMX, 2026-12-07)."""
    return _low_rank_products(scale, x, a, b)[1]


def _low_rank_products(scale, x, a, b):
    """(x·A, scale·(x·A)·B), both fp32, products in x's precision (``_low_rank``)."""
    xa = jnp.matmul(x, a.astype(x.dtype), preferred_element_type=jnp.float32)
    return xa, scale * jnp.matmul(xa.astype(x.dtype), b.astype(x.dtype),
                                  preferred_element_type=jnp.float32)


def _low_rank_jvp(scale, primals, tangents):
    x, a, b, valid = primals
    dx, da, db = (None if isinstance(t, jax.custom_derivatives.SymbolicZero) else t
                  for t in tangents[:3])
    xa, out = _low_rank_products(scale, x, a, b)
    if dx is None and da is None and db is None:
        return out, jnp.zeros_like(out)
    f32, dt = jnp.float32, x.dtype
    rows, rank = math.prod(x.shape[:-1]), a.shape[-1]

    def mm(u, v):
        return jnp.matmul(u.astype(dt), v.astype(dt), preferred_element_type=f32)

    def through_b(g, b, valid):
        """s·g·Bᵀ in x's dtype, g rounded to it with skipped rows zero."""
        g = cpu_matmul.zero_skipped_rows(g, valid).astype(dt)
        return (scale * jnp.einsum("...N,RN->...R", g, b.astype(dt),
                                   preferred_element_type=f32)).astype(dt)

    # One linear map per linear input (a ``lax.cond`` branch may pass one in as an
    # instantiated zero: see ``cpu.matmul``); what a map reads
    # besides its linear input comes in as residuals (a map must not close over tracers).
    skip = cpu_matmul.zero_skipped_rows
    terms = []
    if dx is not None:
        terms.append(cpu_linear.linear_map(
            lambda r, dx: skip(scale * mm(mm(dx, r[0]), r[1]), r[2]),
            lambda r, g: jnp.einsum("...R,KR->...K", through_b(g, r[1], r[2]),
                                    r[0].astype(dt), preferred_element_type=f32).astype(dt),
            (a, b, valid), dx))
    if da is not None:
        terms.append(cpu_linear.linear_map(
            lambda r, da: skip(scale * mm(mm(r[0], da), r[1]), r[2]),
            lambda r, g: cpu_matmul.contract_rows(
                r[0].reshape(rows, -1), through_b(g, r[1], r[2]).reshape(rows, rank)
            ).astype(a.dtype),
            (x, b, valid), da))
    if db is not None:
        terms.append(cpu_linear.linear_map(
            lambda r, db: skip(scale * mm(r[0], db), r[1]),
            lambda r, g: (scale * cpu_matmul.contract_rows(
                skip(g, r[1]).astype(dt).reshape(rows, -1),
                r[0].reshape(rows, rank).astype(dt)).T).astype(b.dtype),
            (xa, valid), db))
    return out, functools.reduce(jnp.add, terms)


_low_rank.defjvp(_low_rank_jvp, symbolic_zeros=True)


def _maybe_remat(layer: Any, config: ModelConfig) -> Any:
    """The scanned layer body, rematerialised in the backward pass when ``config.remat``:
    the scan then saves only each layer's input (and outputs it returns, the keys/values),
    and the layer's activations are recomputed one layer at a time during the gradient."""
    return jax.checkpoint(layer, prevent_cse=False) if config.remat else layer


def _sliced(mask: jax.Array):
    return lambda qs, qe, ks, ke: mask[:, qs:qe, ks:ke]


# ----------------------------------------------------------------------------- public entry points

@functools.partial(jax.jit, static_argnames=("config", "attn_chunk"))
def forward(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array, *,
            segment_ids: jax.Array | None = None, attn_mask: jax.Array | None = None,
            attn_chunk: int | None = DEFAULT_ATTN_CHUNK) -> jax.Array:
    """Hidden states [B, S, D] (final RMSNorm applied) for tokens [B, S] at positions [B, S].

    segment_ids [B, S] (int): tokens attend causally only within their own segment, so several
      sequences packed in one row stay independent (positions restart per sequence).
    attn_mask: [B, S] bool marks valid key tokens (ANDed with the causal/segment mask), or
      [B, S, S] bool gives the full query-by-key mask (True = may attend), used as is.
    attn_chunk: query block size for causal attention on long inputs (skips the masked upper
      triangle; same numbers). None disables it. Ignored with a full [B, S, S] attn_mask,
      which may be non-causal.
    """
    _check_params(params, config)
    _check_tokens("forward", tokens, positions)
    b, s = tokens.shape
    causal_chunk = attn_chunk
    if attn_mask is not None and attn_mask.shape == (b, s, s):
        mask = attn_mask.astype(bool)
        causal_chunk = None
    else:
        mask = jnp.tril(jnp.ones((s, s), bool))[None]
        if segment_ids is not None:
            if segment_ids.shape != tokens.shape:
                raise ValueError(f"forward: segment_ids shape {segment_ids.shape} != tokens "
                                 f"shape {tokens.shape}")
            mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
        if attn_mask is not None:
            if attn_mask.shape != (b, s):
                raise ValueError(f"forward: attn_mask must be [B, S]={b, s} or [B, S, S], got "
                                 f"{attn_mask.shape}")
            mask = mask & attn_mask.astype(bool)[:, None, :]
        mask = jnp.broadcast_to(mask, (b, s, s))
    plan = causal_plan(s, causal_chunk) if causal_chunk and s > causal_chunk else None
    x, _, _ = _run_layers(params, config, _embed(params, tokens), positions,
                          _planned(_sliced(mask), plan))
    return _final_norm(params, config, x)


@functools.partial(jax.jit, static_argnames=("config", "cache_size", "attn_chunk"))
def prefill(params: Params, config: ModelConfig, tokens: jax.Array, positions: jax.Array,
            lengths: jax.Array, *, cache_size: int,
            attn_chunk: int | None = DEFAULT_ATTN_CHUNK) -> tuple[jax.Array, KVCache]:
    """Runs right-padded prompts tokens [B, S] (valid length lengths [B]) into a KV cache.

    Returns the hidden states [B, S, D] and a KVCache with C = cache_size >= S slots whose
    first lengths[b] slots of row b hold the prompt's keys/values.
    """
    _check_params(params, config)
    _check_tokens("prefill", tokens, positions)
    b, s = tokens.shape
    if lengths.shape != (b,):
        raise ValueError(f"prefill: lengths must be [B]={b}, got {lengths.shape}")
    if cache_size < s:
        raise ValueError(f"prefill: cache_size={cache_size} is smaller than the prompt length "
                         f"S={s}")
    valid = jnp.arange(s)[None, :] < lengths[:, None]
    mask = jnp.tril(jnp.ones((s, s), bool))[None] & valid[:, None, :]
    plan = causal_plan(s, attn_chunk) if attn_chunk and s > attn_chunk else None
    x, ks, vs = _run_layers(params, config, _embed(params, tokens), positions,
                            _planned(_sliced(mask), plan))
    pad = [(0, 0), (0, 0), (0, cache_size - s), (0, 0), (0, 0)]
    ks = jnp.pad(ks * valid[None, :, :, None, None].astype(ks.dtype), pad)
    vs = jnp.pad(vs * valid[None, :, :, None, None].astype(vs.dtype), pad)
    hidden = _final_norm(params, config, x)
    return hidden, KVCache(ks, vs, lengths.astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("config",))
def forward_with_cache(params: Params, config: ModelConfig, tokens: jax.Array,
                       positions: jax.Array, cache: KVCache, cache_mask: jax.Array
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Runs new tokens [B, S] against a KV cache without modifying it.

    Each new token attends to the cache slots where cache_mask [B, S, C] is True and causally
    to the new tokens of its own row. The cache may have batch 1 (shared by all B rows: it is
    contracted without being copied) or batch B.
    Returns hidden [B, S, D] (final norm applied) and the new keys/values [L, B, S, K, H].
    """
    _check_params(params, config)
    _check_tokens("forward_with_cache", tokens, positions)
    b, s = tokens.shape
    nl, cb, c, kh, hd = cache.k.shape
    expected = (config.num_layers, cb, c, config.num_kv_heads, config.head_dim)
    if cache.k.shape != expected or cache.v.shape != expected or cb not in (1, b):
        raise ValueError(f"forward_with_cache: cache k/v must be [L, 1 or B={b}, C, K, H]="
                         f"{expected}, got k {cache.k.shape}, v {cache.v.shape}")
    if cache_mask.shape != (b, s, c):
        raise ValueError(f"forward_with_cache: cache_mask must be [B, S, C]={(b, s, c)}, got "
                         f"{cache_mask.shape}")
    cos, sin = rope_cos_sin(config, positions)
    self_mask = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), bool)), (b, s, s))
    cache_mask = cache_mask.astype(bool)

    def layer(x, inputs):
        lp, ck, cv = inputs
        h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps)
        q, k, v = _qkv(lp, config, h, cos, sin)
        attn = attend(q, [(ck, cv, cache_mask), (k, v, self_mask)])
        return _out_and_mlp(lp, config, x, attn), (k, v)

    x, (ks, vs) = cpu_scan.scan_layers(_maybe_remat(layer, config), _embed(params, tokens),
                                       (params["layers"], cache.k, cache.v))
    return _final_norm(params, config, x), ks, vs


def _check_segment_rows(fn: str, params: Params, config: ModelConfig, tokens: jax.Array,
                        positions: jax.Array, segments: jax.Array,
                        visible: jax.Array) -> tuple[int, int]:
    """The checks the segment-row forwards share (params, tokens / positions, segments and
    visible [B, S]); returns (B, S)."""
    _check_params(params, config)
    _check_tokens(fn, tokens, positions)
    b, s = tokens.shape
    for name, arr in (("segments", segments), ("visible", visible)):
        if arr.shape != (b, s):
            raise ValueError(f"{fn}: {name} must be [B, S]={(b, s)}, got {arr.shape}")
    return b, s


@functools.partial(jax.jit, static_argnames=("config", "trunk", "window", "attn_chunk",
                                             "context_cuts"))
def forward_trunk_suffixes(params: Params, config: ModelConfig, tokens: jax.Array,
                           positions: jax.Array, segments: jax.Array, visible: jax.Array, *,
                           trunk: int, window: int, attn_chunk: int = DEFAULT_ATTN_CHUNK,
                           context_cuts: int = 8, read: jax.Array | None = None) -> jax.Array:
    """Hidden states [B, S, D] of rows holding a shared context and continuations of it, or
    [B, M, D] at the slots read [B, M] (int) only: then the last layer runs its queries,
    attention and MLP at those slots alone (SmolLM2-135M, 30 layers: ~3 % of the work).

    Row layout: the context first (segment 0), then continuations packed back to back
    (segment r >= 1 each), then padding (segment -1; also allowed between the context and the
    continuations). ``trunk`` (static) bounds the context's length: the continuations may begin
    right after its real end, before slot ``trunk``. Each continuation is at most ``window``
    tokens. A context token at slot j sees context slots <= j; a continuation token sees
    context slots < visible[b, i] and the earlier tokens of its own segment. positions are the
    model positions (a continuation that sees v context tokens starts at v). Attention
    is ``attend_segments``: on CPU one kernel call per layer, which skips every 16-key block a
    group of queries cannot see (continuations never meet each other's keys); elsewhere XLA's
    over ``trunk_suffix_plan``'s key ranges. The padding tail after a row's last context or
    continuation token costs no matmul products (the CPU kernel skips those rows, ``_mm``):
    the hidden states there are unspecified.
    """
    b, s = _check_segment_rows("forward_trunk_suffixes", params, config, tokens, positions,
                               segments, visible)
    if not 0 < trunk <= s or window < 1:
        raise ValueError(f"forward_trunk_suffixes: need 0 < trunk={trunk} <= S={s} and "
                         f"window={window} >= 1")
    if read is not None and (read.ndim != 2 or read.shape[0] != b
                             or not jnp.issubdtype(read.dtype, jnp.integer)):
        raise ValueError(f"forward_trunk_suffixes: read must be integer slots [B={b}, M], got "
                         f"{read.dtype} {read.shape}")
    segments = segments.astype(jnp.int32)
    slot = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    # A context token sees the context up to itself; padding sees nothing.
    sees = jnp.where(segments == 0, slot + 1, jnp.where(segments > 0, visible, 0)).astype(
        jnp.int32)
    plan = trunk_suffix_plan(s, trunk, window, attn_chunk, context_cuts)
    # The plan's continuation blocks take slots [0, cut) of the context and the window before
    # them: a continuation that begins before `trunk` needs its cut at `trunk`.
    starts = jnp.where(segments != jnp.pad(segments, ((0, 0), (1, 0)), constant_values=-2)[:, :-1],
                       slot, 0)
    first = jax.lax.cummax(starts, axis=1)           # the slot where each token's segment begins
    need = jnp.where((segments > 0) & (first < trunk), jnp.maximum(sees, trunk), sees)
    attention = functools.partial(attend_segments, slot=slot, seg=segments, sees=sees,
                                  kseg=segments, plan=plan, need=need)
    if read is not None:
        read = read.astype(jnp.int32)
        at = lambda a: jnp.take_along_axis(a, read, axis=1)
        read = (read, functools.partial(attend_segments, slot=read, seg=at(segments),
                                        sees=at(sees), kseg=segments))
    # the rows' padding tails (past their last context or continuation token) are skipped by
    # the matmul kernel: the row buckets' padding costs no products
    valid = jnp.max(jnp.where(segments >= 0, slot + 1, 0), axis=1)
    x, _, _ = _run_layers(params, config, _embed(params, tokens), positions, attention, read,
                          valid)
    return _final_norm(params, config, x)


@functools.partial(jax.jit, static_argnames=("config", "keep"))
def forward_cached_suffixes(params: Params, config: ModelConfig, tokens: jax.Array,
                            positions: jax.Array, segments: jax.Array, visible: jax.Array,
                            past: KVCache, *, keep: int, read: jax.Array | None = None
                            ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``forward_trunk_suffixes`` over rows that continue a cached context: returns the hidden
    states [B, S, D] (or [B, M, D] at the slots ``read`` [B, M]) and the keys / values
    [L, B, keep, K, H] of each row's first ``keep`` (static) slots, for a caller to cache.

    past: the keys / values [L, B, C, K, H] of row b's earlier context tokens, positions
    0 .. past.lengths[b] - 1, in its first lengths[b] slots (the rest unused). Row layout as in
    ``forward_trunk_suffixes``: the context's continuation first (segment 0, positions
    lengths[b], lengths[b] + 1, ...; it may be empty), then continuations (segment r >= 1)
    seeing context positions < visible (cached or in the row), then padding (-1). A context
    token sees the cached context and the row's context up to itself.

    Keys are laid out as [past C | row S]; the segment rule (``attend_segments``) works on key
    indices, so a "sees v context positions" becomes an index bound: v itself while v is
    within the cached part, else v plus the unused past slots. The attention is one call per
    layer (the CPU kernel skips every 16-key block no query of a group sees, unused past slots
    included); elsewhere XLA's over all keys (no block plan: the offset key space).
    """
    b, s = _check_segment_rows("forward_cached_suffixes", params, config, tokens, positions,
                               segments, visible)
    c = past.k.shape[2]
    expected = (config.num_layers, b, c, config.num_kv_heads, config.head_dim)
    if past.k.shape != expected or past.v.shape != expected or past.lengths.shape != (b,):
        raise ValueError(f"forward_cached_suffixes: past k/v must be [L, B, C, K, H]="
                         f"{expected} with lengths [B]={b}, got k {past.k.shape}, v "
                         f"{past.v.shape}, lengths {past.lengths.shape}")
    if not 0 <= keep <= s:
        raise ValueError(f"forward_cached_suffixes: need 0 <= keep={keep} <= S={s}")
    if read is not None and (read.ndim != 2 or read.shape[0] != b
                             or not jnp.issubdtype(read.dtype, jnp.integer)):
        raise ValueError(f"forward_cached_suffixes: read must be integer slots [B={b}, M], got "
                         f"{read.dtype} {read.shape}")
    segments = segments.astype(jnp.int32)
    cached = past.lengths.astype(jnp.int32)[:, None]                            # [B, 1]
    row_slot = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    sees = jnp.where(segments == 0, positions.astype(jnp.int32) + 1,
                     jnp.where(segments > 0, visible.astype(jnp.int32), 0))      # positions
    sees = jnp.where(sees > cached, sees + (c - cached), sees)                   # key indices
    kseg = jnp.concatenate([jnp.where(jnp.arange(c)[None] < cached, 0, -1).astype(jnp.int32),
                            segments], axis=1)                                   # [B, C + S]
    slot = row_slot + c
    attention = functools.partial(attend_segments, slot=slot, seg=segments, sees=sees,
                                  kseg=kseg)
    if read is not None:
        read = read.astype(jnp.int32)
        at = lambda a: jnp.take_along_axis(a, read, axis=1)
        read = (read, functools.partial(attend_segments, slot=read + c, seg=at(segments),
                                        sees=at(sees), kseg=kseg))
    valid = jnp.max(jnp.where(segments >= 0, row_slot + 1, 0), axis=1)
    x, ks, vs = _run_layers(params, config, _embed(params, tokens), positions, attention, read,
                            valid, past=(past.k, past.v), keep=keep)
    return _final_norm(params, config, x), ks, vs


def head_matrix(params: Params, config: ModelConfig) -> jax.Array:
    """The LM head as [V, D] (tied: the embedding table itself)."""
    return params["embed"] if config.tie_embeddings else params["lm_head"].T


@functools.partial(jax.jit, static_argnames=("config",))
def lm_logits(params: Params, config: ModelConfig, hidden: jax.Array,
              token_ids: jax.Array | None = None) -> jax.Array:
    """fp32 logits for hidden [..., D]: [..., V], or [..., len(token_ids)] for token_ids [V']."""
    if hidden.shape[-1] != config.hidden_size:
        raise ValueError(f"lm_logits: hidden last axis must be D={config.hidden_size}, got "
                         f"shape {hidden.shape}")
    if token_ids is None:
        if config.tie_embeddings:
            return jnp.einsum("...D,VD->...V", hidden, params["embed"],
                              preferred_element_type=jnp.float32)
        return jnp.einsum("...D,DV->...V", hidden, params["lm_head"],
                          preferred_element_type=jnp.float32)
    if token_ids.ndim != 1:
        raise ValueError(f"lm_logits: token_ids must be 1-D [V'], got shape {token_ids.shape}")
    if config.tie_embeddings:
        rows = jnp.take(params["embed"], token_ids, axis=0)
    else:
        rows = jnp.take(params["lm_head"], token_ids, axis=1).T
    return jnp.einsum("...D,VD->...V", hidden, rows, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=("config",))
def logits(params: Params, config: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Full fp32 logits [B, S, V] for small inputs tokens [B, S] (or [S] -> [S, V])."""
    squeeze = tokens.ndim == 1
    tokens = tokens[None] if squeeze else tokens
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    out = lm_logits(params, config, forward(params, config, tokens, positions))
    return out[0] if squeeze else out


@functools.partial(jax.jit, static_argnames=("config", "chunk_size"))
def token_logprobs(params: Params, config: ModelConfig, hidden: jax.Array, targets: jax.Array,
                   *, chunk_size: int = 256) -> jax.Array:
    """log p(targets[b, s] | hidden[b, s]) as [B, S] fp32, never building [B*S, V] at once.

    Rows are processed chunk_size at a time (each chunk rematerialised in the backward pass),
    so peak memory is O(chunk_size * V). Differentiable with respect to params and hidden.
    """
    return _head_chunks(params, config, hidden, targets, chunk_size, "token_logprobs",
                        with_entropy=False)


@functools.partial(jax.jit, static_argnames=("config", "chunk_size"))
def token_logprobs_and_entropy(params: Params, config: ModelConfig, hidden: jax.Array,
                               targets: jax.Array, *, chunk_size: int = 256
                               ) -> tuple[jax.Array, jax.Array]:
    """(log p(targets | hidden), entropy of p) as two [B, S] fp32 arrays, chunk_size rows of
    [chunk_size, V] logits at a time (``token_logprobs``' memory bound, the entropy from the
    same logits)."""
    return _head_chunks(params, config, hidden, targets, chunk_size,
                        "token_logprobs_and_entropy", with_entropy=True)


def _head_chunks(params, config, hidden, targets, chunk_size: int, name: str, *,
                 with_entropy: bool):
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(f"{name}: hidden must be [B, S, D] and targets [B, S]; got "
                         f"hidden {hidden.shape}, targets {targets.shape}")
    if chunk_size <= 0:
        raise ValueError(f"{name}: chunk_size must be positive, got {chunk_size}")
    b, s, d = hidden.shape
    total = b * s
    chunks = -(-total // chunk_size)
    flat_h = jnp.pad(hidden.reshape(total, d), [(0, chunks * chunk_size - total), (0, 0)])
    flat_t = jnp.pad(targets.reshape(total), [(0, chunks * chunk_size - total)])
    head = head_matrix(params, config)

    @jax.checkpoint
    def one_chunk(args):
        h, t = args
        chunk_logits = jnp.einsum("TD,VD->TV", h, head, preferred_element_type=jnp.float32)
        picked = jnp.take_along_axis(chunk_logits, t[:, None], axis=-1)[:, 0]
        logz = jax.nn.logsumexp(chunk_logits, axis=-1)
        if not with_entropy:
            return picked - logz
        p = jax.nn.softmax(chunk_logits, axis=-1)
        # H = log Z - E_p[logit]: no [chunk, V] log-softmax kept beside p
        return picked - logz, logz - (p * chunk_logits).sum(-1)

    out = jax.lax.map(one_chunk, (flat_h.reshape(chunks, chunk_size, d),
                                  flat_t.reshape(chunks, chunk_size)))
    unflat = lambda x: x.reshape(-1)[:total].reshape(b, s)  # noqa: E731
    return tuple(map(unflat, out)) if with_entropy else unflat(out)


def init_params(config: ModelConfig, key: jax.Array, dtype: Any = None) -> Params:
    """Random parameters (normal, std 0.02; norms near 1; small biases) for tests/benchmarks."""
    dtype = jnp.dtype(dtype or config.dtype)
    l, d, f = config.num_layers, config.hidden_size, config.intermediate_size
    n, kh, hd, v = config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {
        "attn_norm": (l, d), "q": (l, d, n, hd), "k": (l, d, kh, hd), "v": (l, d, kh, hd),
        "o": (l, n, hd, d), "mlp_norm": (l, d), "gate": (l, d, f), "up": (l, d, f),
        "down": (l, f, d),
    }
    if config.qkv_bias:
        shapes.update(q_bias=(l, n, hd), k_bias=(l, kh, hd), v_bias=(l, kh, hd))
    if config.o_bias:
        shapes["o_bias"] = (l, d)
    if config.qk_norm:
        shapes.update(q_norm=(l, hd), k_norm=(l, hd))
    if config.mlp_bias:
        shapes.update(gate_bias=(l, f), up_bias=(l, f), down_bias=(l, d))
    keys = jax.random.split(key, len(shapes) + 3)
    layers = {}
    for (name, shape), k in zip(sorted(shapes.items()), keys):
        noise = jax.random.normal(k, shape, jnp.float32)
        if name.endswith("norm"):
            layers[name] = (1.0 + 0.1 * noise).astype(dtype)
        elif name.endswith("bias"):
            layers[name] = (0.02 * noise).astype(dtype)
        else:
            layers[name] = (0.02 * noise).astype(dtype)
    params: Params = {
        "embed": (0.02 * jax.random.normal(keys[-3], (v, d), jnp.float32)).astype(dtype),
        "final_norm": (1.0 + 0.1 * jax.random.normal(keys[-2], (d,), jnp.float32)).astype(dtype),
        "layers": layers,
    }
    if not config.tie_embeddings:
        params["lm_head"] = (0.02 * jax.random.normal(keys[-1], (d, v), jnp.float32)
                             ).astype(dtype)
    return params


def param_shapes(config: ModelConfig) -> dict[str, Any]:
    """The expected shape of every parameter, as the same nested dict as the params."""
    return jax.tree.map(lambda x: tuple(x.shape),
                        jax.eval_shape(lambda: init_params(config, jax.random.key(0))))
