"""Top-k reverse-KL distillation loss (SPEC section 6; LVOPD, seed 001 appendix B.3).

Per position with student logits z in R^V:

    l = z - logsumexp(z)              student log-probs,   p = exp(l)
    S = top-k(z)                      student support (k = 16), constant for the gradient
    tau_j = teacher log-prob of j     from the teacher's top-K_T list (K_T = 32) when j is in
                                      it, else the floor log((1 - sum_i exp(tau_i)) / (V - K_T)),
                                      clamped below at ``floor_min`` (default -30, about
                                      log 1e-13; reached when the teacher's list holds all of
                                      its mass)
    KL    = sum_{j in S} p_j (l_j - tau_j)

Gradient w.r.t. z_m: 1[m in S] p_m (l_m - tau_m + 1) - p_m sum_{j in S} p_j (l_j - tau_j + 1).
The teacher is a constant (no gradient flows into ``teacher_logprobs``).

``tail=True`` adds the **tail bucket**: the mass outside S as one more outcome, so the sum is a
divergence between two proper distributions over S + {tail} (without it, a student that moves
mass out of S lowers the loss; verl's RFC #7856 reports the unbucketed clamp hit in most steps):

    p_T = 1 - sum_{j in S} p_j,   q_T = max(1 - sum_{j in S} exp(tau_j), exp(floor_min))
    KL_tail = KL + p_T (log p_T - log q_T)

(log p_T from log P_S by a stable log(1 - e^x); a row whose whole mass is in S adds 0). The
tail term is differentiated by JAX in every implementation.

``gate`` (with a static ``capacity``) skips the gated-off rows inside the kernel: the rows with
gate > 0 (and mask True) are compacted into ``capacity`` rows (``jnp.nonzero`` with a static
size), only those go through the streaming head / softmax, and their KL is scattered back (0
on every other row). The LVOPD gate max(0, -A) is zero on most tokens, so neither the [N, V]
logit blocks nor the [N, k] statistics are formed for them. ``gate_capacity`` gives the
capacity on the host (the active count rounded up, so few shapes compile). A call with more
active rows than ``capacity`` raises when the gate is concrete; inside a jitted caller the
rows that did not fit get NaN, so an overflow is never silent.

Implementations (``impl``):

- ``"reference"``: plain jnp on the full [N, V] softmax, with the hand-written SPEC gradient
  in a ``jax.custom_vjp`` (tests compare it with autodiff of the plain formula and with
  finite differences).
- ``"xla"``: ``lse_topk_xla``: a chunked loop over vocabulary blocks with an online
  log-sum-exp and a running top-k; the backward streams the vocabulary again. CPU default.
- ``"pallas"``: ``lse_topk_pallas``: the same streaming as Pallas kernels (GPU Triton / TPU
  Mosaic block shapes; ``interpret=True`` on CPU, where it is only a correctness check).
- ``"auto"``: by backend (``resolve_impl``, table ``AUTO_IMPL``): ``"pallas"`` on GPU and
  TPU, ``"xla"`` on CPU (where Pallas only runs in interpret mode) and on any other backend.
  The Pallas kernels are verified against the reference in interpret mode (the tests); they
  have not been compiled on GPU/TPU hardware in this project yet; pass ``impl="xla"`` to opt
  out there.

The streaming implementations reduce each row to (lse, top-k values, top-k ids) in a
custom_vjp primitive; the O(k * K_T) epilogue below is differentiated by JAX. Inputs may
have any leading batch dimensions; all arithmetic is float32 (bf16 inputs are upcast).

Validation: shapes, dtypes, k and K_T are checked on every call. Teacher values (finite
log-probs, ids in [0, V)) are checked when the arrays are concrete, i.e. when the public
functions are called outside ``jax.jit``; inside a jitted caller they are traced values and
cannot raise, so validate teacher outputs where they enter the program.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.kernels import lse_topk_pallas, lse_topk_xla
from jaxdm.kernels._streaming import LseTopK

__all__ = [
    "DEFAULT_FLOOR_MIN",
    "IMPLS",
    "AUTO_IMPL",
    "resolve_impl",
    "topk_reverse_kl",
    "fused_linear_topk_reverse_kl",
    "weighted_kl_loss",
    "teacher_floor_logprob",
    "teacher_logprobs_at",
    "kl_from_stats",
    "tail_bucket_kl",
    "reference_topk_reverse_kl",
    "plain_topk_reverse_kl",
    "gate_capacity",
]

DEFAULT_FLOOR_MIN = -30.0
IMPLS = ("auto", "reference", "xla", "pallas")
REDUCTIONS = ("token-mean", "weighted-mean", "sum")


# ----------------------------------------------------------------------------- semantics


def teacher_floor_logprob(
    teacher_logprobs: jax.Array, vocab_size: int, floor_min: float = DEFAULT_FLOOR_MIN
) -> jax.Array:
    """Log-prob given to a token outside the teacher's list: the leftover mass spread evenly.

    ``teacher_logprobs`` [..., K_T] -> [...]: log(max(0, 1 - sum exp) / (V - K_T)), clamped
    below at ``floor_min``. A leftover mass <= 0 (rounding) gives ``floor_min``.
    """
    num_listed = teacher_logprobs.shape[-1]
    listed_mass = jnp.sum(jnp.exp(teacher_logprobs.astype(jnp.float32)), axis=-1)
    leftover = jnp.maximum(1.0 - listed_mass, 0.0)
    unlisted = max(vocab_size - num_listed, 1)
    floor = jnp.log(leftover) - np.log(unlisted)
    return jnp.maximum(floor, jnp.float32(floor_min))


def teacher_logprobs_at(
    token_ids: jax.Array,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    vocab_size: int,
    floor_min: float = DEFAULT_FLOOR_MIN,
) -> jax.Array:
    """tau for each of ``token_ids`` [..., k]: the teacher's log-prob if listed, else the floor.

    ``teacher_ids``/``teacher_logprobs`` are [..., K_T]. A token listed twice takes its
    largest listed log-prob.
    """
    teacher_logprobs = teacher_logprobs.astype(jnp.float32)
    floor = teacher_floor_logprob(teacher_logprobs, vocab_size, floor_min)  # [...]
    match = token_ids[..., :, None] == teacher_ids[..., None, :]  # [..., k, K_T]
    listed = jnp.max(jnp.where(match, teacher_logprobs[..., None, :], -jnp.inf), axis=-1)
    return jnp.where(jnp.any(match, axis=-1), listed, floor[..., None])


_LN2 = float(np.log(2.0))


def tail_bucket_kl(log_p_s: jax.Array, tau: jax.Array,
                   floor_min: float = DEFAULT_FLOOR_MIN) -> jax.Array:
    """p_T (log p_T - log q_T) [N] from the student's log-probs ``log_p_s`` [N, k] on S and
    the teacher's ``tau`` [N, k] there (module docstring). Differentiable in ``log_p_s``;
    -inf entries of ``log_p_s`` (rows with fewer than k finite logits) hold no mass."""
    finite = jnp.isfinite(log_p_s)
    log_mass = jax.nn.logsumexp(jnp.where(finite, log_p_s, -jnp.inf), axis=-1)   # log P_S
    has_tail = log_mass < 0.0
    x = jnp.where(has_tail, log_mass, -1.0)
    # log(1 - e^x), each branch fed only values where it is exact and finite (the double
    # where keeps the gradient finite where a branch is not taken).
    near = x > -_LN2
    log_p_tail = jnp.where(near, jnp.log(-jnp.expm1(jnp.where(near, x, -1.0))),
                           jnp.log1p(-jnp.exp(jnp.where(near, -1.0, x))))
    q_s = jnp.sum(jnp.where(finite, jnp.exp(jax.lax.stop_gradient(tau)), 0.0), axis=-1)
    log_q_tail = jnp.maximum(jnp.log(jnp.maximum(1.0 - q_s, 0.0)), jnp.float32(floor_min))
    return jnp.where(has_tail, jnp.exp(log_p_tail) * (log_p_tail - log_q_tail), 0.0)


def kl_from_stats(
    stats: LseTopK,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    vocab_size: int,
    floor_min: float = DEFAULT_FLOOR_MIN,
    tail: bool = False,
) -> jax.Array:
    """sum_{j in S} p_j (l_j - tau_j) from the streaming statistics (plus the tail bucket when
    ``tail``); [N]. Differentiable."""
    log_p = stats.values - stats.lse[:, None]  # [N, k]
    tau = teacher_logprobs_at(
        stats.indices, teacher_ids, jax.lax.stop_gradient(teacher_logprobs), vocab_size, floor_min
    )
    # Rows with fewer than k finite logits have p = 0, l = -inf there: contribute 0, not NaN
    # (the double where keeps the gradient finite too).
    finite = jnp.isfinite(log_p)
    safe_log_p = jnp.where(finite, log_p, 0.0)
    terms = jnp.where(finite, jnp.exp(safe_log_p) * (safe_log_p - tau), 0.0)
    kl = jnp.sum(terms, axis=-1)
    return kl + tail_bucket_kl(log_p, tau, floor_min) if tail else kl


# ---------------------------------------------------------------------------- validation


def _concrete(x) -> np.ndarray | None:
    """The value of ``x`` when it is known now (not a tracer), else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def _check_teacher(
    teacher_ids, teacher_logprobs, lead_shape: tuple[int, ...], vocab_size: int, k: int
) -> int:
    """Validates the teacher inputs against the student's leading shape; returns K_T."""
    if not jnp.issubdtype(teacher_ids.dtype, jnp.integer):
        raise TypeError(f"teacher_ids must be integer token ids, got dtype {teacher_ids.dtype}")
    if not jnp.issubdtype(teacher_logprobs.dtype, jnp.floating):
        raise TypeError(f"teacher_logprobs must be floating, got dtype {teacher_logprobs.dtype}")
    if teacher_ids.shape != teacher_logprobs.shape:
        raise ValueError(
            f"teacher_ids {tuple(teacher_ids.shape)} and teacher_logprobs "
            f"{tuple(teacher_logprobs.shape)} must have the same shape"
        )
    if teacher_ids.ndim < 1 or tuple(teacher_ids.shape[:-1]) != tuple(lead_shape):
        raise ValueError(
            f"teacher_ids/teacher_logprobs must be [..., K_T] with leading shape {lead_shape} "
            f"(the student's positions), got {tuple(teacher_ids.shape)}"
        )
    num_listed = teacher_ids.shape[-1]
    if not 1 <= num_listed <= vocab_size:
        raise ValueError(f"K_T = {num_listed} teacher tokens must be in [1, V = {vocab_size}]")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= vocab_size:
        raise ValueError(f"k = {k!r} must be an int in [1, V = {vocab_size}]")
    ids = _concrete(teacher_ids)
    if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"teacher_ids must lie in [0, V = {vocab_size}); got range "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )
    logprobs = _concrete(teacher_logprobs)
    if logprobs is not None:
        bad = ~np.isfinite(logprobs.astype(np.float32))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"teacher_logprobs must be finite; {int(bad.sum())} non-finite value(s), "
                f"first at index {where}: {logprobs[where]}"
            )
    return num_listed


def _check_mask(mask, lead_shape: tuple[int, ...]):
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be bool, got dtype {mask.dtype}")
    if tuple(mask.shape) != tuple(lead_shape):
        raise ValueError(f"mask must have shape {lead_shape} (the positions), got {mask.shape}")
    return mask


def _check_tiling(block_v, block_t, pallas_layout) -> None:
    for name, value in (("block_v", block_v), ("block_t", block_t)):
        if value is not None and (
            not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if pallas_layout is not None and pallas_layout not in lse_topk_pallas.LAYOUTS:
        raise ValueError(
            f"pallas_layout must be one of {lse_topk_pallas.LAYOUTS} or None, "
            f"got {pallas_layout!r}"
        )


# impl="auto" by jax.default_backend(): Pallas where it compiles (Triton / Mosaic), the
# chunked XLA loop elsewhere (on CPU Pallas would run in the slow interpret mode).
AUTO_IMPL = {"cpu": "xla", "gpu": "pallas", "cuda": "pallas", "rocm": "pallas", "tpu": "pallas"}


def resolve_impl(impl: str, backend: str | None = None) -> str:
    """The implementation ``impl`` runs as: itself, or for ``"auto"`` the ``AUTO_IMPL`` entry
    of ``backend`` (default ``jax.default_backend()``; unknown backends get ``"xla"``)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    backend = jax.default_backend() if backend is None else backend
    return AUTO_IMPL.get(backend, "xla")



def _check_floating(name: str, x) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be floating, got dtype {x.dtype}")


# ---------------------------------------------------------------------------- public API


def topk_reverse_kl(
    student_logits: jax.Array,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    *,
    k: int = 16,
    mask: jax.Array | None = None,
    impl: str = "auto",
    floor_min: float = DEFAULT_FLOOR_MIN,
    block_v: int | None = None,
    block_t: int | None = None,
    pallas_layout: str | None = None,
    interpret: bool | None = None,
    tail: bool = False,
    gate: jax.Array | None = None,
    capacity: int | None = None,
) -> jax.Array:
    """Per-position top-k reverse KL(student || teacher) on the student's top-k support.

    Args:
      student_logits: [..., V] float (f32 or bf16).
      teacher_ids: [..., K_T] int token ids of the teacher's top-K_T list.
      teacher_logprobs: [..., K_T] float, finite, the teacher's log-probs for those ids.
      k: size of the student support S.
      mask: optional bool [...]; masked-out positions give KL 0 and no gradient.
      impl: "auto" | "reference" | "xla" | "pallas" (module docstring).
      floor_min: lower clamp of the teacher floor log-prob.
      tail: add the tail bucket (module docstring).
      gate, capacity: optional float [...] gate and a static int: only rows with gate > 0
        are computed, compacted into ``capacity`` rows (module docstring); others give 0.
      block_v, block_t: vocabulary / position tile sizes (streaming impls; block_t Pallas only).
      pallas_layout: "loop" (GPU) or "grid" (TPU); default by backend (``lse_topk_pallas``).
      interpret: Pallas interpret mode; default True on CPU.

    Returns:
      [...] float32 KL per position.
    """
    student_logits = jnp.asarray(student_logits)
    _check_floating("student_logits", student_logits)
    if student_logits.ndim < 2:
        raise ValueError(
            f"student_logits must be [..., T, V] or [T, V], got shape {student_logits.shape}"
        )
    return _checked_call(
        student_logits, None, student_logits.shape[-1], teacher_ids, teacher_logprobs, k=k,
        mask=mask, impl=impl, floor_min=floor_min, block_v=block_v, block_t=block_t,
        pallas_layout=pallas_layout, interpret=interpret, tail=tail, gate=gate,
        capacity=capacity,
    )


def fused_linear_topk_reverse_kl(
    hidden: jax.Array,
    lm_head: jax.Array,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    *,
    k: int = 16,
    mask: jax.Array | None = None,
    impl: str = "auto",
    floor_min: float = DEFAULT_FLOOR_MIN,
    block_v: int | None = None,
    block_t: int | None = None,
    pallas_layout: str | None = None,
    interpret: bool | None = None,
    tail: bool = False,
    gate: jax.Array | None = None,
    capacity: int | None = None,
) -> jax.Array:
    """``topk_reverse_kl(hidden @ lm_head, ...)`` without materialising the [..., V] logits.

    The streaming impls compute the logits block by block in the forward and again in the
    backward (gradients w.r.t. ``hidden`` and ``lm_head``); only ``"reference"`` forms them.

    Args:
      hidden: [..., d] float final hidden states (after the final norm).
      lm_head: [d, V] float LM-head weight (for tied embeddings: the embedding transposed).
      Others as ``topk_reverse_kl``.

    Returns:
      [...] float32 KL per position.
    """
    hidden, lm_head = jnp.asarray(hidden), jnp.asarray(lm_head)
    _check_floating("hidden", hidden)
    _check_floating("lm_head", lm_head)
    if lm_head.ndim != 2:
        raise ValueError(f"lm_head must be [d, V], got shape {lm_head.shape}")
    if hidden.ndim < 2 or hidden.shape[-1] != lm_head.shape[0]:
        raise ValueError(
            f"hidden must be [..., T, d] with d = lm_head.shape[0] = {lm_head.shape[0]}, "
            f"got hidden {hidden.shape}, lm_head {lm_head.shape}"
        )
    return _checked_call(
        hidden, lm_head, lm_head.shape[1], teacher_ids, teacher_logprobs, k=k, mask=mask,
        impl=impl, floor_min=floor_min, block_v=block_v, block_t=block_t,
        pallas_layout=pallas_layout, interpret=interpret, tail=tail, gate=gate,
        capacity=capacity,
    )


def _checked_call(
    rows_in, lm_head, vocab_size, teacher_ids, teacher_logprobs, *, k, mask, impl, floor_min,
    block_v, block_t, pallas_layout, interpret, tail, gate, capacity,
):
    """The validation both public functions share (teacher, mask, gate, tiling, impl), then
    the one compiled program. ``rows_in`` is [..., V] logits (``lm_head`` None) or [..., d]
    hidden states with ``lm_head`` [d, V]."""
    teacher_ids, teacher_logprobs = jnp.asarray(teacher_ids), jnp.asarray(teacher_logprobs)
    lead = tuple(rows_in.shape[:-1])
    num_listed = _check_teacher(teacher_ids, teacher_logprobs, lead, vocab_size, k)
    mask = _check_mask(mask, lead)
    gate, capacity = _check_gate(gate, capacity, mask, lead)
    _check_tiling(block_v, block_t, pallas_layout)
    return _topk_reverse_kl_jit(
        rows_in, lm_head, teacher_ids, teacher_logprobs, mask, gate,
        k=int(k), impl=resolve_impl(impl), floor_min=float(floor_min), block_v=block_v,
        block_t=block_t, pallas_layout=pallas_layout, interpret=interpret,
        num_listed=num_listed, tail=bool(tail), capacity=capacity,
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "k", "impl", "floor_min", "block_v", "block_t", "pallas_layout", "interpret",
        "num_listed", "tail", "capacity",
    ),
)
def _topk_reverse_kl_jit(
    rows_in, lm_head, teacher_ids, teacher_logprobs, mask, gate, *, k, impl, floor_min,
    block_v, block_t, pallas_layout, interpret, num_listed, tail, capacity,
):
    del num_listed  # part of the cache key only
    lead = rows_in.shape[:-1]
    rows = rows_in.reshape(-1, rows_in.shape[-1])
    ids = teacher_ids.reshape(rows.shape[0], -1)
    logprobs = teacher_logprobs.reshape(rows.shape[0], -1)
    rows_kl = functools.partial(
        _rows_kl, lm_head=lm_head, k=k, impl=impl, floor_min=floor_min, block_v=block_v,
        block_t=block_t, pallas_layout=pallas_layout, interpret=interpret, tail=tail,
    )
    if gate is not None:
        kl = _gated_rows(rows_kl, rows, ids, logprobs, _active(gate, mask, rows.shape[0]),
                         capacity)
        return kl.reshape(lead)
    kl = rows_kl(rows, ids, logprobs).reshape(lead)
    return kl if mask is None else jnp.where(mask, kl, 0.0)


def _rows_kl(rows, ids, logprobs, *, lm_head, k, impl, floor_min, block_v, block_t,
             pallas_layout, interpret, tail) -> jax.Array:
    """KL [N] of N rows: logits [N, V] (``lm_head`` None) or hidden states [N, d] whose
    logits the streaming impls form block by block (only ``"reference"`` forms them whole)."""
    if impl == "reference":
        logits = rows if lm_head is None else jnp.dot(
            rows, lm_head, preferred_element_type=jnp.float32)
        kl = _reference_kl(logits, ids, logprobs, k, floor_min)
        return kl + _reference_tail(logits, ids, logprobs, k, floor_min) if tail else kl
    vocab_size = rows.shape[-1] if lm_head is None else lm_head.shape[1]
    if impl == "xla":
        block = block_v or lse_topk_xla.DEFAULT_BLOCK_V
        stats = (lse_topk_xla.lse_topk_logits(rows, k, block) if lm_head is None
                 else lse_topk_xla.lse_topk_linear(rows, lm_head, k, block))
    else:
        pallas = dict(k=k, block_sizes=lse_topk_pallas.BlockSizes.make(block_t, block_v),
                      layout=pallas_layout, interpret=interpret)
        stats = (lse_topk_pallas.lse_topk_logits(rows, **pallas) if lm_head is None
                 else lse_topk_pallas.lse_topk_linear(rows, lm_head, **pallas))
    return kl_from_stats(stats, ids, logprobs, vocab_size, floor_min, tail)


def _active(gate, mask, n: int) -> jax.Array:
    """[N] bool: the rows the gated call computes (gate > 0, and mask)."""
    active = gate.reshape(n) > 0
    return active if mask is None else active & mask.reshape(n)


def _gated_rows(per_rows, rows, ids, logprobs, active, capacity: int) -> jax.Array:
    """KL [N] computed only on the ``active`` rows, compacted into ``capacity`` rows; 0 on
    the inactive rows, NaN on active rows past the capacity (module docstring)."""
    n = rows.shape[0]
    count = jnp.sum(active.astype(jnp.int32))
    idx = jnp.nonzero(active, size=capacity, fill_value=0)[0]           # [C]
    filled = jnp.arange(capacity) < count                                # real entries of idx
    kl_c = per_rows(rows[idx], ids[idx], logprobs[idx])                  # [C]
    kl = jnp.zeros((n,), jnp.float32).at[idx].add(jnp.where(filled, kl_c, 0.0))
    taken = jnp.zeros((n,), bool).at[idx].max(filled)
    return jnp.where(active & ~taken, jnp.nan, kl)


def gate_capacity(gate, mask=None, *, multiple: int = 64) -> int:
    """Host side: the static ``capacity`` for a gated call: the number of rows with gate > 0
    (and mask True), rounded up to ``multiple`` (so nearby counts share one compiled shape),
    at least 1 and at most the number of rows."""
    g = np.asarray(gate)
    if not isinstance(multiple, (int, np.integer)) or isinstance(multiple, bool) or multiple < 1:
        raise ValueError(f"multiple must be a positive int, got {multiple!r}")
    active = g > 0
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != g.shape:
            raise ValueError(f"mask {m.shape} must have the gate's shape {g.shape}")
        active &= m.astype(bool)
    count = int(active.sum())
    return int(min(max(-(-count // multiple) * multiple, 1), max(g.size, 1)))


def _check_gate(gate, capacity, mask, lead_shape: tuple[int, ...]):
    """Validates ``gate`` / ``capacity`` (both or neither); a concrete gate with more active
    rows than ``capacity`` is a named error."""
    if gate is None:
        if capacity is not None:
            raise ValueError("capacity is given without a gate")
        return None, None
    gate = jnp.asarray(gate)
    if not jnp.issubdtype(gate.dtype, jnp.floating):
        raise TypeError(f"gate must be floating, got dtype {gate.dtype}")
    if tuple(gate.shape) != tuple(lead_shape):
        raise ValueError(f"gate must have shape {lead_shape} (the positions), got {gate.shape}")
    n = int(np.prod(lead_shape))
    if capacity is None or not isinstance(capacity, (int, np.integer)) or \
            isinstance(capacity, bool) or not 1 <= capacity <= n:
        raise ValueError(f"a gated call needs a static int capacity in [1, {n}] "
                         f"(gate_capacity gives one), got {capacity!r}")
    g = _concrete(gate)
    if g is not None:
        if not np.all(np.isfinite(g)):
            raise ValueError(f"gate must be finite; {int((~np.isfinite(g)).sum())} "
                             "non-finite value(s)")
        m = _concrete(mask) if mask is not None else None
        active = (g > 0) if m is None else (g > 0) & m
        if int(active.sum()) > capacity:
            raise ValueError(f"{int(active.sum())} gated-on rows exceed capacity {capacity}; "
                             "use gate_capacity(gate, mask)")
    return gate, int(capacity)


def weighted_kl_loss(
    kl: jax.Array,
    weights: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    reduction: str = "token-mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Reduces per-position KL with per-position weights (the LVOPD gate) to a scalar loss.

    - ``token-mean``: sum(w * kl * m) / max(sum(m), 1) (every valid token counts once, so
      ungated tokens dilute the loss as in LVOPD's token-level objective),
    - ``weighted-mean``: sum(w * kl * m) / sum(w * m) (0 when no weight),
    - ``sum``: sum(w * kl * m).

    Returns ``(loss, metrics)`` with metrics ``distill/kl_mean`` (unweighted mean over valid
    positions), ``distill/weight_mean``, ``distill/active_fraction`` (share of valid positions
    with w > 0) and the ``distill/weighted_kl_sum`` / ``distill/count`` pair.
    """
    kl = jnp.asarray(kl)
    weights = jnp.ones_like(kl) if weights is None else jnp.asarray(weights)
    mask = jnp.ones(kl.shape, bool) if mask is None else jnp.asarray(mask)
    if weights.shape != kl.shape:
        raise ValueError(f"weights {weights.shape} must have the shape of kl {kl.shape}")
    if mask.shape != kl.shape:
        raise ValueError(f"mask {mask.shape} must have the shape of kl {kl.shape}")
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be bool, got dtype {mask.dtype}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    valid = mask.astype(jnp.float32)
    w = jnp.where(mask, weights.astype(jnp.float32), 0.0)
    weighted_sum = jnp.sum(jnp.where(mask, w * kl, 0.0))
    count = jnp.sum(valid)
    if reduction == "token-mean":
        loss = weighted_sum / jnp.maximum(count, 1.0)
    elif reduction == "weighted-mean":
        total_weight = jnp.sum(w)
        safe_weight = jnp.where(total_weight > 0, total_weight, 1.0)
        loss = jnp.where(total_weight > 0, weighted_sum / safe_weight, 0.0)
    else:
        loss = weighted_sum
    denom = jnp.maximum(count, 1.0)
    metrics = {
        "distill/loss": loss,
        "distill/kl_mean": jnp.sum(jnp.where(mask, kl, 0.0)) / denom,
        "distill/weight_mean": jnp.sum(w) / denom,
        "distill/active_fraction": jnp.sum(jnp.where(mask & (w > 0), 1.0, 0.0)) / denom,
        "distill/weighted_kl_sum": weighted_sum,
        "distill/count": count,
    }
    return loss, metrics


# ----------------------------------------------------------------------------- reference


def plain_topk_reverse_kl(
    logits: jax.Array,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    k: int = 16,
    floor_min: float = DEFAULT_FLOOR_MIN,
    tail: bool = False,
) -> jax.Array:
    """The SPEC formula in plain jnp on [N, V] logits, differentiated by JAX (test oracle).

    Computes in float32, or float64 for float64 logits (finite-difference checks).
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    log_p = jax.nn.log_softmax(logits, axis=-1)
    support = jax.lax.stop_gradient(jax.lax.top_k(logits, k)[1])
    log_p_s = jnp.take_along_axis(log_p, support, axis=-1)
    tau = teacher_logprobs_at(
        support, teacher_ids, jax.lax.stop_gradient(teacher_logprobs), logits.shape[-1], floor_min
    )
    finite = jnp.isfinite(log_p_s)
    safe = jnp.where(finite, log_p_s, 0.0)
    kl = jnp.sum(jnp.where(finite, jnp.exp(safe) * (safe - tau), 0.0), axis=-1)
    return kl + tail_bucket_kl(log_p_s, tau, floor_min) if tail else kl


def _reference_tail(logits, teacher_ids, teacher_logprobs, k, floor_min):
    """The tail bucket on the full softmax (autodiff: the reference's custom VJP covers S)."""
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    log_p = jax.nn.log_softmax(z, axis=-1)
    support = jax.lax.stop_gradient(jax.lax.top_k(z, k)[1])
    log_p_s = jnp.take_along_axis(log_p, support, axis=-1)
    tau = teacher_logprobs_at(support, teacher_ids, jax.lax.stop_gradient(teacher_logprobs),
                              z.shape[-1], floor_min)
    return tail_bucket_kl(log_p_s, tau, floor_min)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _reference_kl(logits, teacher_ids, teacher_logprobs, k, floor_min):
    return _reference_fwd(logits, teacher_ids, teacher_logprobs, k, floor_min)[0]


def _reference_fwd(logits, teacher_ids, teacher_logprobs, k, floor_min):
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    log_p = jax.nn.log_softmax(z, axis=-1)  # [N, V]: the reference may hold it
    support = jax.lax.top_k(z, k)[1]  # [N, k]
    log_p_s = jnp.take_along_axis(log_p, support, axis=-1)
    tau = teacher_logprobs_at(support, teacher_ids, teacher_logprobs, z.shape[-1], floor_min)
    # p_j = 0 (l_j = -inf) contributes 0 when a row has fewer than k finite logits.
    finite = jnp.isfinite(log_p_s)
    safe = jnp.where(finite, log_p_s, 0.0)
    kl = jnp.sum(jnp.where(finite, jnp.exp(safe) * (safe - tau), 0.0), axis=-1)
    # A zero-size array carries the input dtype (residuals must be arrays).
    dtype_tag = jnp.zeros((0,), logits.dtype)
    return kl, (log_p, support, safe, finite, tau, dtype_tag, teacher_logprobs)


def _reference_bwd(k, floor_min, residuals, g):
    log_p, support, log_p_s, finite, tau, dtype_tag, teacher_logprobs = residuals
    # SPEC: dKL/dz_m = 1[m in S] a_m - p_m C, a_j = p_j (l_j - tau_j + 1), C = sum_S a_j.
    a = jnp.where(finite, jnp.exp(log_p_s) * (log_p_s - tau + 1.0), 0.0)  # [N, k]
    c = jnp.sum(a, axis=-1, keepdims=True)  # [N, 1]
    dense = -jnp.exp(log_p) * c
    rows = jnp.arange(log_p.shape[0])[:, None]
    grad = dense.at[rows, support].add(a) * g[:, None].astype(dense.dtype)
    return grad.astype(dtype_tag.dtype), None, jnp.zeros_like(teacher_logprobs)


_reference_kl.defvjp(_reference_fwd, _reference_bwd)


def reference_topk_reverse_kl(
    logits: jax.Array,
    teacher_ids: jax.Array,
    teacher_logprobs: jax.Array,
    k: int = 16,
    floor_min: float = DEFAULT_FLOOR_MIN,
) -> jax.Array:
    """Reference on [N, V] logits: full softmax, hand-written SPEC gradient (custom_vjp)."""
    return _reference_kl(logits, teacher_ids, teacher_logprobs, k, floor_min)
