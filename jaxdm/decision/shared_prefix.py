"""Shared-prefix batched scoring: one prefill per shared context, one batched pass for all suffixes.

Design (why it is exact and fast)
---------------------------------
Host side, every request is tokenised *exactly as a one-by-one API call would be* (the full
chat-templated prompt, plus the option tokens for likelihood scoring). Requests are then
grouped by shared token prefix: the token sequences are sorted, neighbours' longest common
prefixes (LCP) are measured, and runs whose neighbouring LCP is a large part of their length
form a group. Within a group the trunk is the member with the largest total LCP with the
others (for Prefix judging that is the last action's request, for Hindsight any member).
Each request ``r`` gets a visible length ``vis = min(LCP(r, trunk), first answer position)``
and a suffix ``r[vis:]``. Since ``r[:vis] == trunk[:vis]`` and attention is causal, running
the trunk once into a KV cache and then running every suffix over the first ``vis`` cache
slots, with positions ``vis, vis + 1, ...``, computes exactly the hidden states a one-by-one
forward of ``r`` would: equivalence holds by construction, whatever the prompt format. (The
prompt format in ``jaxdm.roles`` is built so that the shared prefixes are long.)

Device side, ``score_batch`` is a pure, jitted, differentiable function (no stop_gradient)
over a padded ``ScoringBatch`` of G groups: per group it prefills the trunk [T] once and runs
its N suffixes [N, S] in one batched pass over that cache (the batch-1 cache is contracted
against all N rows without copying; ``jax.vmap`` runs the G groups), each suffix masked to
its own visible length. Hidden states are read only at the answer slots, one flat list
[G, M] per batch (M bucketed on the largest group's real answer count, ``slot_bucket``), and
turned into logits only for the candidate token ids [K] (``full_vocab=False``: log-softmax over
the candidates, i.e. constrained readout) or into full-vocabulary log-probabilities of the
given ids (``full_vocab=True``: option likelihood); the [S, V] logits are never built, and the
head never runs at a padded (row, answer) pair: per-row slots [N, A] padded a 69-option tool
question's 1,170 answer positions to 128 x 32 = 4,096 full-vocabulary rows. Shapes are
bucketed (``bucket_*``) so one compilation serves many batches.

Two device layouts compute these same numbers (``score_requests(layout=...)``):

- ``"packed"`` (default, ``score_packed`` over a ``PackedScoringBatch``): per group one row,
  the trunk followed right after its real end by all suffixes packed back to back, then one
  tail of padding (``jaxdm.models.decoder.forward_trunk_suffixes``). A suffix token attends
  to the trunk tokens its request sees (its visible length) and to its own earlier tokens,
  so suffixes never meet each other's keys and nothing is padded per request. On CPU each
  layer's attention is one kernel call that skips every key block a group of queries cannot
  see; elsewhere XLA's runs over a plan: trunk blocks causal, a suffix block meeting the
  trunk plus only the ``window`` tokens before it. Suffixes are placed in order of visible
  length, and a block whose suffixes see only the start of the trunk skips the rest of it (a
  run-time choice among 8 static cuts; Prefix judging 8 % faster).
  Measured on the 2-core CPU (``benchmarks/scoring_throughput.py``, ``*_packed_vs_rows``) it
  is faster than ``"rows"`` for Hindsight, Prefix and Actor workloads. (Interleaving each
  suffix right after the trunk tokens it sees, in one causal row, was 6 % slower on Prefix
  judging: trunk tokens then meet the suffix keys placed among them.)
- ``"rows"`` (``score_batch`` above): the trunk prefilled into a KV cache, the suffixes as
  padded rows over it.

The RL option-scoring policy calls ``score_batch`` directly (its options are short and of
similar length, so the rows layout pads little): gradients flow to ``params`` through the
trunk prefill and the suffix pass; ``score_packed`` is differentiable the same way.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.models import compile_cache, decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.cpu import scan as cpu_scan

# Device layouts of score_requests: "rows" = trunk prefilled into a KV cache, suffixes as
# vmapped rows over it (score_batch); "packed" = the trunk and the packed suffixes in one row
# per group (score_packed). Same numbers; see scoring_throughput.py for which is faster.
LAYOUTS = ("packed", "rows")

# Value of masked entries in score_batch's output: finite so masked sums stay finite.
MASKED_LOGPROB = -1e9


class ScoringBatch(NamedTuple):
    """A padded batch of G groups (trunk + N suffixes each); all int32 / bool numpy or jax.

    trunk_tokens [G, T]    shared context tokens (right-padded)
    trunk_len    [G]       real trunk length (0 for an all-padding group)
    suffix_tokens [G, N, S] per-request tokens after its visible trunk part (right-padded)
    visible      [G, N]    how many leading trunk tokens each suffix attends to
    answer_index [G, M]    flat answer slots: suffix row * S + position in that row, whose
                           next-token distribution is read (``pack_groups``: M bucketed on
                           the group's real answer count, so no head runs at padded slots);
                 or [G, N, A] per row: position in row n (output [G, N, A, K])
    answer_mask  [G, M] / [G, N, A]        which answer slots are real
    label_ids    [G, M, K] / [G, N, A, K]  candidate token ids at each answer slot
    label_mask   [G, M, K] / [G, N, A, K]  which candidate slots are real
    """

    trunk_tokens: Any
    trunk_len: Any
    suffix_tokens: Any
    visible: Any
    answer_index: Any
    answer_mask: Any
    label_ids: Any
    label_mask: Any


def _check_common(batch: Any, n: int | None, integer_fields: Sequence[str]) -> None:
    """Checks shared by both batch layouts: trunk [G, T] / trunk_len [G], answer and label
    slots [G, M(, K)] (flat) or [G, N, A(, K)] (per row; N = ``n`` when given), and integer
    dtypes."""
    kind = type(batch).__name__
    if batch.trunk_tokens.ndim != 2:
        raise ValueError(f"{kind}.trunk_tokens must be [G, T], got {batch.trunk_tokens.shape}")
    g = batch.trunk_tokens.shape[0]
    if batch.trunk_len.shape != (g,):
        raise ValueError(f"trunk_len must be [G]={g}, got {batch.trunk_len.shape}")
    shape = batch.answer_index.shape
    per_row = len(shape) == 3
    if len(shape) not in (2, 3) or shape[0] != g or (per_row and n is not None
                                                     and shape[1] != n):
        want = f"G, N = {(g, n)}" if n is not None else f"G = {g}"
        raise ValueError(f"answer_index must be [G, M] (flat slots) or [G, N, A] (per row) "
                         f"with {want}, got {shape}")
    if batch.answer_mask.shape != shape:
        raise ValueError(f"answer_mask must be {shape}, got {batch.answer_mask.shape}")
    if batch.label_ids.ndim != len(shape) + 1 or batch.label_ids.shape[:-1] != shape:
        raise ValueError(f"label_ids must be answer_index's shape {shape} + [K], got "
                         f"{batch.label_ids.shape}")
    if batch.label_mask.shape != batch.label_ids.shape:
        raise ValueError(f"label_mask shape {batch.label_mask.shape} != label_ids shape "
                         f"{batch.label_ids.shape}")
    for name in integer_fields:
        if not jnp.issubdtype(getattr(batch, name).dtype, jnp.integer):
            raise TypeError(f"{kind}.{name} must be integer, got {getattr(batch, name).dtype}")


def _check_batch(batch: ScoringBatch) -> None:
    g = batch.trunk_tokens.shape[0]
    if batch.suffix_tokens.ndim != 3 or batch.suffix_tokens.shape[0] != g:
        raise ValueError(f"suffix_tokens must be [G={g}, N, S], got {batch.suffix_tokens.shape}")
    n = batch.suffix_tokens.shape[1]
    if batch.visible.shape != (g, n):
        raise ValueError(f"visible must be [G, N]={(g, n)}, got {batch.visible.shape}")
    _check_common(batch, n, ("trunk_tokens", "suffix_tokens", "label_ids", "answer_index"))


def _flat_slots(batch: Any, row_stride: int):
    """The answer slots as a flat list: (index [G, M], mask [G, M], label_ids [G, M, K],
    label_mask [G, M, K]). Per-row slots [G, N, A] become M = N * A slots, row n's positions
    offset by n * ``row_stride`` (rows layout: S; packed: 0, positions are already global)."""
    idx, mask = batch.answer_index, batch.answer_mask
    if idx.ndim == 2:
        return idx, mask, batch.label_ids, batch.label_mask
    g, n, a = idx.shape
    idx = idx + (jnp.arange(n, dtype=idx.dtype) * row_stride)[None, :, None]
    k = batch.label_ids.shape[-1]
    return (idx.reshape(g, n * a), mask.reshape(g, n * a),
            batch.label_ids.reshape(g, n * a, k), batch.label_mask.reshape(g, n * a, k))


def _group_hidden(params, config: ModelConfig, trunk_tokens, trunk_len, suffix_tokens,
                  visible):
    """One group: trunk [T], suffixes [N, S] -> hidden states of the suffixes [N, S, D]."""
    t = trunk_tokens.shape[0]
    n, s = suffix_tokens.shape
    _, cache = decoder.prefill(params, config, trunk_tokens[None], jnp.arange(t)[None],
                               trunk_len[None], cache_size=t)
    positions = visible[:, None] + jnp.arange(s)[None, :]                       # [N, S]
    cache_mask = jnp.broadcast_to(jnp.arange(t)[None, None, :] < visible[:, None, None],
                                  (n, s, t))                                    # [N, S, T]
    hidden, _, _ = decoder.forward_with_cache(params, config, suffix_tokens, positions, cache,
                                              cache_mask)                       # [N, S, D]
    return hidden


@functools.partial(jax.jit, static_argnames=("config", "full_vocab"))
def score_batch(params, config: ModelConfig, batch: ScoringBatch, *,
                full_vocab: bool = False) -> jax.Array:
    """Log-probabilities [G, M, K] of the candidate ids at every answer slot ([G, N, A, K]
    for per-row answer slots).

    full_vocab=False: log-softmax over the K real candidates only (constrained readout:
      ``exp`` gives the label distribution restricted to the labels and renormalised).
    full_vocab=True: log p(id) under the full vocabulary (option likelihood, PPO log-probs).
    Masked answer/candidate slots hold ``MASKED_LOGPROB``. Pure and differentiable in params.
    The head (label rows or the full vocabulary) runs only at the M answer slots.
    """
    _check_batch(batch)
    g, n, s = batch.suffix_tokens.shape
    hidden = jax.vmap(functools.partial(_group_hidden, params, config))(
        batch.trunk_tokens, batch.trunk_len, batch.suffix_tokens, batch.visible)  # [G,N,S,D]
    idx, mask, labels, label_mask = _flat_slots(batch, s)
    picked = jnp.take_along_axis(hidden.reshape(g, n * s, -1), idx[..., None], axis=1)
    out = _readout(params, config, picked, mask, labels, label_mask, full_vocab)  # [G, M, K]
    return out.reshape(batch.label_ids.shape)


def _readout(params, config: ModelConfig, hidden, answer_mask, label_ids, label_mask,
             full_vocab: bool) -> jax.Array:
    """hidden [G, M, D] at the answer slots -> log-probs [G, M, K] (see score_batch)."""
    mask = label_mask.astype(bool) & answer_mask.astype(bool)[..., None]
    if full_vocab:
        out = _full_vocab_logprobs(params, config, hidden, label_ids)           # [G, M, K]
    else:
        head = decoder.head_matrix(params, config)                              # [V, D]
        rows = jnp.take(head, label_ids, axis=0)                                # [G, M, K, D]
        logits = jnp.einsum("GMD,GMKD->GMK", hidden, rows,
                            preferred_element_type=jnp.float32)
        logits = jnp.where(mask, logits, -jnp.inf)
        # Rows with no real candidate would be all -inf: keep them finite.
        safe = jnp.where(mask.any(-1, keepdims=True), logits, 0.0)
        out = jax.nn.log_softmax(safe, axis=-1)
    return jnp.where(mask, out, MASKED_LOGPROB)


# Answer slots per block of the full-vocabulary head (see _full_vocab_logprobs).
HEAD_CHUNK = 128


def _full_vocab_logprobs(params, config: ModelConfig, hidden, label_ids,
                         chunk: int = HEAD_CHUNK) -> jax.Array:
    """log p(label_ids) under the full vocabulary: hidden [..., D], label_ids [..., K] ->
    [..., K] fp32, ``chunk`` slots at a time (each block's [chunk, V] logits rematerialised in
    the backward pass), so the [M, V] logits never exist at once. Measured on the 2-core CPU
    (1,280 slots, SmolLM2's 49,152 x 576 head, load ~4.5): 1.26 s in one block, 1.01 s in
    blocks of 128 (1.04 s / 1.06 s at 256 / 640), same numbers."""
    lead, d, k = hidden.shape[:-1], hidden.shape[-1], label_ids.shape[-1]
    flat_h, flat_l = hidden.reshape(-1, d), label_ids.reshape(-1, k)
    total = flat_h.shape[0]
    size = max(1, min(chunk, total))
    blocks = -(-total // size)
    flat_h = jnp.pad(flat_h, [(0, blocks * size - total), (0, 0)])
    flat_l = jnp.pad(flat_l, [(0, blocks * size - total), (0, 0)])
    head = decoder.head_matrix(params, config)                                  # [V, D]

    @jax.checkpoint
    def block(args):
        h, ids = args
        logits = jnp.einsum("TD,VD->TV", h, head, preferred_element_type=jnp.float32)
        return (jnp.take_along_axis(logits, ids, axis=-1)
                - jax.nn.logsumexp(logits, axis=-1, keepdims=True))

    out = jax.lax.map(block, (flat_h.reshape(blocks, size, d), flat_l.reshape(blocks, size, k)))
    return out.reshape(blocks * size, k)[:total].reshape(lead + (k,))


class PackedScoringBatch(NamedTuple):
    """G groups, each one row: its trunk, then its N requests' suffixes packed back to back.

    Suffix tokens see the first ``suffix_visible`` trunk tokens and the earlier tokens of their
    own request (``jaxdm.models.decoder.forward_trunk_suffixes``); suffixes never attend to
    each other, and nothing is padded per request.

    trunk_tokens [G, T] int32; trunk_len [G] int32 (real trunk length)
    suffix_tokens, suffix_positions [G, P] int32 (a suffix that sees v trunk tokens is at v..)
    suffix_segments [G, P] int32 (request row r -> r + 1; padding -1)
    suffix_visible  [G, P] int32 (trunk tokens the token's request sees)
    P is also the model row's length: P >= T, and trunk_len + the real suffix tokens <= P
    (the suffixes run right after the real trunk).
    answer_index [G, M] flat answer slots, each an index into the suffix part (or [G, N, A]
    per row, same meaning); answer_mask, label_ids, label_mask as in ``ScoringBatch``.
    """

    trunk_tokens: Any
    trunk_len: Any
    suffix_tokens: Any
    suffix_positions: Any
    suffix_segments: Any
    suffix_visible: Any
    answer_index: Any
    answer_mask: Any
    label_ids: Any
    label_mask: Any


def _check_packed(batch: PackedScoringBatch) -> None:
    g = batch.trunk_tokens.shape[0]
    if batch.suffix_tokens.ndim != 2 or batch.suffix_tokens.shape[0] != g:
        raise ValueError(f"suffix_tokens must be [G={g}, P], got {batch.suffix_tokens.shape}")
    p = batch.suffix_tokens.shape[1]
    for name in ("suffix_positions", "suffix_segments", "suffix_visible"):
        if getattr(batch, name).shape != (g, p):
            raise ValueError(f"PackedScoringBatch.{name} must be [G, P]={(g, p)}, got "
                             f"{getattr(batch, name).shape}")
    _check_common(batch, None, ("trunk_tokens", "suffix_tokens", "suffix_positions",
                                "suffix_segments", "suffix_visible", "label_ids",
                                "answer_index"))


@functools.partial(jax.jit, static_argnames=("config", "window", "full_vocab"))
def score_packed(params, config: ModelConfig, batch: PackedScoringBatch, *, window: int,
                 full_vocab: bool = False) -> jax.Array:
    """``score_batch`` for the packed layout: log-probs [G, M, K] ([G, N, A, K] for per-row
    answer slots), same semantics.

    ``window`` (static) bounds every request's suffix length. One forward per group row of P
    slots: the trunk, the packed suffixes right after its real end, one tail of padding;
    hidden states are read only at the answer slots (an answer slot past the row comes out
    NaN). Pure and differentiable in params.
    """
    _check_packed(batch)
    t = batch.trunk_tokens.shape[1]
    tokens, positions, segments, visible, read = _packed_row(batch, "score_packed")
    row_len = tokens.shape[1]
    picked = decoder.forward_trunk_suffixes(params, config, tokens, positions, segments,
                                            visible, trunk=t, window=window,
                                            read=jnp.minimum(read, row_len - 1))  # [G, M, D]
    return _packed_readout(params, config, batch, picked, read, row_len, full_vocab)


def _packed_row(batch: PackedScoringBatch, where: str, trunk_start: Any = 0):
    """The model rows [G, P] of a packed batch: (tokens, positions, segments, visible, read
    [G, M] the answer slots' row indices). Trunk tokens sit at positions trunk_start + slot
    (trunk_start [G, 1]: tokens of the context already cached before them, else 0)."""
    g, t = batch.trunk_tokens.shape
    p = row_len = batch.suffix_tokens.shape[1]
    if p < t:
        raise ValueError(f"{where}: the row (P={p}) must hold the trunk (T={t})")
    slots = jnp.arange(row_len)[None]                                           # [1, P]
    trunk_len = batch.trunk_len[:, None]
    in_trunk = slots < trunk_len
    at = jnp.clip(slots - trunk_len, 0, p - 1)           # each later slot's suffix position
    beyond = slots - trunk_len >= p

    def suffix(a, fill):
        return jnp.where(beyond, fill, jnp.take_along_axis(a, at, axis=1))

    tokens = jnp.where(in_trunk, jnp.take_along_axis(
        batch.trunk_tokens, jnp.broadcast_to(jnp.minimum(slots, t - 1), (g, row_len)), axis=1),
        suffix(batch.suffix_tokens, 0))
    positions = jnp.where(in_trunk, slots + trunk_start, suffix(batch.suffix_positions, 0))
    segments = jnp.where(in_trunk, 0, suffix(batch.suffix_segments, -1))
    visible = jnp.where(in_trunk, 0, suffix(batch.suffix_visible, 0))
    idx = _flat_slots(batch, 0)[0]
    return tokens, positions, segments, visible, trunk_len + idx


def _packed_readout(params, config: ModelConfig, batch: PackedScoringBatch, picked, read,
                    row_len: int, full_vocab: bool) -> jax.Array:
    """Log-probs of the answer slots' hidden states picked [G, M, D] (NaN at a slot past the
    row), in the batch's label layout."""
    _, mask, labels, label_mask = _flat_slots(batch, 0)
    out = _readout(params, config, picked, mask, labels, label_mask, full_vocab)
    out = jnp.where((read < row_len)[..., None], out, jnp.nan)
    return out.reshape(batch.label_ids.shape)


@functools.partial(jax.jit, static_argnames=("config", "full_vocab"))
def score_packed_cached(params, config: ModelConfig, batch: PackedScoringBatch,
                        past: decoder.KVCache, *, full_vocab: bool = False
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``score_packed`` over trunks whose first ``past.lengths[g]`` tokens are already cached
    (``past``: their keys/values [L, G, C, K, H], e.g. from a ``prefix_cache.PrefixCache``):
    the batch's trunk holds only the rest of each trunk, the suffixes' positions and visible
    lengths stay those of the whole request. Returns (log-probs as ``score_packed``'s, the
    keys and values [L, G, T, K, H] of each trunk rest, for the cache). Pure; the trunk rest
    may be empty (the whole trunk cached)."""
    _check_packed(batch)
    g, t = batch.trunk_tokens.shape
    if past.lengths.shape != (g,):
        raise ValueError(f"score_packed_cached: past.lengths must be [G]={g}, got "
                         f"{past.lengths.shape}")
    tokens, positions, segments, visible, read = _packed_row(
        batch, "score_packed_cached", past.lengths[:, None])
    row_len = tokens.shape[1]
    picked, ks, vs = decoder.forward_cached_suffixes(
        params, config, tokens, positions, segments, visible, past, keep=t,
        read=jnp.minimum(read, row_len - 1))                                    # [G, M, D]
    return _packed_readout(params, config, batch, picked, read, row_len, full_vocab), ks, vs


# ----------------------------------------------------------------------------- host side

@dataclasses.dataclass(frozen=True)
class Request:
    """One scoring request: its full token ids and what to read at which positions.

    answer_positions[a] is an index p into ``tokens``: the next-token distribution after
    tokens[:p + 1] is read there. candidates[a] are the token ids scored at that slot.
    """

    tokens: tuple[int, ...]
    answer_positions: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        if not self.tokens:
            raise ValueError("Request.tokens is empty")
        if not self.answer_positions:
            raise ValueError("Request.answer_positions is empty")
        if len(self.candidates) != len(self.answer_positions):
            raise ValueError(f"Request has {len(self.answer_positions)} answer positions but "
                             f"{len(self.candidates)} candidate lists")
        for p in self.answer_positions:
            if not 0 <= p < len(self.tokens):
                raise ValueError(f"answer position {p} outside the {len(self.tokens)} tokens")
        for c in self.candidates:
            if not c:
                raise ValueError("Request has an empty candidate list")


@dataclasses.dataclass
class Group:
    """A trunk and the requests scored over it (request ids index the caller's list)."""

    trunk: tuple[int, ...]
    members: list[int]
    visible: list[int]


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = a[:n] != b[:n]
    idx = np.flatnonzero(x)
    return int(idx[0]) if idx.size else n


def plan_groups(requests: Sequence[Request], *, min_shared_frac: float = 0.5,
                min_shared_tokens: int = 32, max_group: int = 64,
                layout: str = "packed") -> list[Group]:
    """Groups requests by shared token prefix and picks each group's trunk.

    Neighbours in sorted order join a group when their LCP is at least ``min_shared_tokens``
    and at least ``min_shared_frac`` of the shorter one (so requests that share only a
    system prompt are not forced together). A run longer than ``max_group`` is split. A run
    is also split where that costs fewer tokens in ``layout`` (see ``_plan_run``).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not requests:
        return []
    order = sorted(range(len(requests)), key=lambda i: requests[i].tokens)
    # each request's tokens as an array once (the planner compares them many times)
    arrays = [np.asarray(r.tokens, np.int64) for r in requests]
    runs: list[list[int]] = [[order[0]]]
    for prev, cur in zip(order, order[1:]):
        a, b = arrays[prev], arrays[cur]
        shared = _lcp(a, b)
        if shared >= min_shared_tokens and shared >= min_shared_frac * min(len(a), len(b)) \
                and len(runs[-1]) < max_group:
            runs[-1].append(cur)
        else:
            runs.append([cur])
    groups: list[Group] = []
    for run in runs:
        groups.extend(_plan_run(requests, arrays, run, layout))
    return groups


def _plan_run(requests: Sequence[Request], arrays: Sequence[np.ndarray], run: list[int],
              layout: str, depth: int = 0) -> list[Group]:
    """Trunk + visible lengths for one run (sorted request ids; arrays: every request's
    tokens as an array), split where that is cheaper.

    A member that shares only part of the trunk (e.g. an Actor state that shares only its
    early history with another state) carries everything after that part in its own suffix,
    once per request; in the rows layout every row is also padded to the longest suffix. The
    planner compares the cost of the whole run (``_plan_cost``) with keeping only members
    whose suffix is at most a threshold and planning the rest again as their own group(s),
    and keeps the cheaper plan (thresholds tried: quartiles of the suffix lengths).
    """
    seqs = [arrays[i] for i in run]
    m = len(run)
    # In sorted order, LCP(i, j) = min of neighbour LCPs between them.
    adj = [_lcp(seqs[i], seqs[i + 1]) for i in range(m - 1)]
    best, best_total = 0, -1
    for i in range(m):
        total, cur = 0, None
        for j in range(i + 1, m):
            cur = adj[j - 1] if cur is None else min(cur, adj[j - 1])
            total += cur
        cur = None
        for j in range(i - 1, -1, -1):
            cur = adj[j] if cur is None else min(cur, adj[j])
            total += cur
        # Ties: the longer trunk lets more requests see more of it.
        if total > best_total or (total == best_total and len(seqs[i]) > len(seqs[best])):
            best, best_total = i, total
    trunk = requests[run[best]].tokens
    visible = [min(_lcp(seqs[i], seqs[best]), min(requests[rid].answer_positions))
               for i, rid in enumerate(run)]
    tails = [len(seqs[i]) - visible[i] for i in range(m)]
    whole = [Group(trunk=tuple(trunk[:max(visible)]), members=list(run), visible=visible)]
    best_plan, best_cost = whole, _plan_cost(requests, whole, layout)
    if depth < 4 and m > 1:
        for tau in sorted({int(np.quantile(tails, q)) for q in (0.25, 0.5, 0.75)}):
            keep = [i for i in range(m) if tails[i] <= tau or i == best]
            if len(keep) == m:
                continue
            kept = set(keep)
            vis = [visible[i] for i in keep]
            plan = [Group(trunk=tuple(trunk[:max(vis)]), members=[run[i] for i in keep],
                          visible=vis)]
            plan += _plan_run(requests, arrays, [run[i] for i in range(m) if i not in kept],
                              layout, depth + 1)
            cost = _plan_cost(requests, plan, layout)
            if cost < best_cost:
                best_plan, best_cost = plan, cost
    return best_plan


def _suffix_lengths(requests: Sequence[Request], gr: Group) -> list[int]:
    """Tokens each member runs after the trunk part it sees."""
    return [len(requests[r].tokens) - v for r, v in zip(gr.members, gr.visible)]


def _plan_cost(requests: Sequence[Request], groups: Sequence[Group], layout: str) -> int:
    """Tokens run: trunk + rows x longest suffix (rows: suffixes padded within a group) or
    trunk + the suffixes (packed)."""
    total = 0
    for g in groups:
        tails = _suffix_lengths(requests, g)
        total += len(g.trunk) + (len(tails) * max(tails) if layout == "rows" else sum(tails))
    return total


def bucket(n: int, minimum: int = 8, *, fine: int = 0, fine_limit: int | None = None) -> int:
    """Padded size for n: multiples of ``fine`` up to ``fine_limit`` (default 8 * fine; when
    fine > 0), then powers of two up to 512, then multiples of 256, so padding waste stays
    bounded while the number of distinct shapes (compilations) stays small."""
    n = max(int(n), minimum, 1)
    if fine and n <= (fine_limit or 8 * fine):
        return -(-n // fine) * fine
    if n <= 512:
        return 1 << (n - 1).bit_length()
    return -(-n // 256) * 256


def _trunk_bucket(n: int, minimum: int) -> int:
    # The trunk dominates the work: pad it to multiples of 128 only (at most 127 wasted tokens)
    # up to 8192 tokens; one compile per 128-token step is cheap next to a long trunk.
    return bucket(n, minimum, fine=128, fine_limit=8192)


@dataclasses.dataclass
class PackedBatch:
    """A ScoringBatch / PackedScoringBatch (numpy) plus where each request is: ``rows``
    request -> (group slot, suffix row), ``slots`` request -> (group slot, first answer slot):
    request r's answer positions are the consecutive flat slots m0, m0 + 1, ... of its group
    (its log-probs are ``out[g, m0:m0 + len(r.answer_positions)]``)."""

    batch: "ScoringBatch | PackedScoringBatch"
    rows: dict[int, tuple[int, int]]
    unique_tokens: int
    slots: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)


def _trunk_rows(groups: Sequence[Group], t: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """trunk_tokens [G, T] (right-padded) and trunk_len [G] of a batch."""
    tokens = np.full((len(groups), t), pad_id, np.int32)
    for gi, gr in enumerate(groups):
        tokens[gi, :len(gr.trunk)] = gr.trunk
    return tokens, np.array([len(gr.trunk) for gr in groups], np.int32)


def slot_bucket(m: int) -> int:
    """Padded flat answer-slot count M of a call: multiples of 64 up to 512, then powers of
    two / multiples of 256 (``bucket``). The head (the full vocabulary for option
    likelihood) runs at every slot, so M follows the real count (a 69-option tool question:
    1,170 slots -> 1,280, where per-row slots padded it to 128 rows x 32 = 4,096)."""
    return bucket(m, 64, fine=64, fine_limit=512)


def _answer_slots(requests: Sequence[Request], groups: Sequence[Group]):
    """Empty flat answer/label slots [G, M] / [G, M, K] (M = ``slot_bucket`` of the largest
    group's answer count, K bucketed) for a batch."""
    g = len(groups)
    m = slot_bucket(max(sum(len(requests[r].answer_positions) for r in gr.members)
                        for gr in groups))
    k = bucket(max(len(c) for gr in groups for r in gr.members
                   for c in requests[r].candidates), 1)
    return (np.zeros((g, m), np.int32), np.zeros((g, m), bool),
            np.zeros((g, m, k), np.int32), np.zeros((g, m, k), bool))


def _put_answers(slots, gi: int, m0: int, req: Request, shift: int) -> int:
    """Fills flat slots m0, m0 + 1, ... of group gi with the request's answer positions +
    shift and their candidates; returns the next free slot."""
    ans, ans_mask, labels, label_mask = slots
    for ai, (pos, cand) in enumerate(zip(req.answer_positions, req.candidates)):
        ans[gi, m0 + ai] = pos + shift
        ans_mask[gi, m0 + ai] = True
        labels[gi, m0 + ai, :len(cand)] = cand
        label_mask[gi, m0 + ai, :len(cand)] = True
    return m0 + len(req.answer_positions)


def pack_groups(requests: Sequence[Request], groups: Sequence[Group], *, pad_id: int = 0,
                min_trunk: int = 64, min_suffix: int = 8) -> PackedBatch:
    """Pads groups into one ScoringBatch with bucketed T, N, S, M, K (flat answer slots)."""
    if not groups:
        raise ValueError("pack_groups: no groups")
    g = len(groups)
    t = _trunk_bucket(max(len(gr.trunk) for gr in groups), min_trunk)
    n = bucket(max(len(gr.members) for gr in groups), 1, fine=4)
    s = bucket(max(n for gr in groups for n in _suffix_lengths(requests, gr)), min_suffix, fine=8)
    trunk_tokens, trunk_len = _trunk_rows(groups, t, pad_id)
    suffix = np.full((g, n, s), pad_id, np.int32)
    visible = np.zeros((g, n), np.int32)
    ans, ans_mask, labels, label_mask = _answer_slots(requests, groups)
    rows, first = {}, {}
    unique = 0
    for gi, gr in enumerate(groups):
        unique += len(gr.trunk)
        m = 0
        for ni, (rid, vis) in enumerate(zip(gr.members, gr.visible)):
            req = requests[rid]
            tail = req.tokens[vis:]
            suffix[gi, ni, :len(tail)] = tail
            unique += len(tail)
            visible[gi, ni] = vis
            rows[rid], first[rid] = (gi, ni), (gi, m)
            # flat slot = row * S + position in the row
            m = _put_answers((ans, ans_mask, labels, label_mask), gi, m, req, ni * s - vis)
    batch = ScoringBatch(trunk_tokens, trunk_len, suffix, visible, ans, ans_mask, labels,
                         label_mask)
    return PackedBatch(batch=batch, rows=rows, unique_tokens=unique, slots=first)


def _packed_key(requests, gr: Group, min_trunk: int = 64) -> tuple[int, int, int]:
    """(trunk bucket, row bucket, window bucket) of a group in the packed layout; the row
    holds the trunk and then the suffixes (one tail of padding: on the readout's prompts 2-3 %
    fewer rows than padding the trunk and the suffixes each).

    The window (a static bound on suffix lengths) is a power of two >= 64: it only widens
    the key range of suffix attention blocks a little, and with multiples of 8 the passes
    of one job (Hindsight ~20-token suffixes, Prefix ~40, +FB ~150) each compiled their own
    program (`jaxdm demo`: 19 distinct programs -> 15, same tokens run)."""
    tails = _suffix_lengths(requests, gr)
    row = _trunk_bucket(len(gr.trunk) + sum(tails), min_trunk)
    # The trunk's bucket only bounds the XLA attention plan's context blocks (the row's length
    # is `row`): coarse, so that it adds few distinct programs.
    return min(row, bucket(len(gr.trunk), min_trunk)), row, bucket(max(tails), 64)


def pack_suffixes(requests: Sequence[Request], groups: Sequence[Group], *, pad_id: int = 0,
                  min_trunk: int = 64, shape: tuple[int, int] | None = None
                  ) -> tuple[PackedBatch, int]:
    """Lays groups out as a ``PackedScoringBatch``; returns it and the window (longest
    suffix, bucketed) that ``score_packed`` needs. The row length P is the longest group's
    trunk + suffixes, bucketed like the trunk (one tail of padding, not the trunk's and the
    suffixes'); ``shape`` (T, P) pads the trunk width and the row further (at least what the
    groups need). Unique tokens = trunks + suffixes."""
    if not groups:
        raise ValueError("pack_suffixes: no groups")
    g = len(groups)
    keys = [_packed_key(requests, gr, min_trunk) for gr in groups]
    t, p, window = (max(k[i] for k in keys) for i in range(3))
    if shape is not None:
        if shape[0] < t or shape[1] < p or shape[0] > shape[1]:
            raise ValueError(f"pack_suffixes: shape {shape} must hold T={t}, P={p} with T <= P")
        t, p = shape
    trunk_tokens, trunk_len = _trunk_rows(groups, t, pad_id)
    tokens = np.full((g, p), pad_id, np.int32)
    positions = np.zeros((g, p), np.int32)
    segments = np.full((g, p), -1, np.int32)
    visible = np.zeros((g, p), np.int32)
    ans, ans_mask, labels, label_mask = _answer_slots(requests, groups)
    rows, first = {}, {}
    unique = 0
    for gi, gr in enumerate(groups):
        placed = m = 0
        # In order of visible length: a block of suffixes that see only the start of the
        # trunk then skips the rest of it (decoder.trunk_suffix_plan's context cuts).
        for ni in sorted(range(len(gr.members)), key=lambda j: gr.visible[j]):
            rid, vis = gr.members[ni], gr.visible[ni]
            req = requests[rid]
            tail = req.tokens[vis:]
            end = placed + len(tail)
            tokens[gi, placed:end] = tail
            positions[gi, placed:end] = np.arange(vis, vis + len(tail))
            segments[gi, placed:end] = ni + 1
            visible[gi, placed:end] = vis
            rows[rid], first[rid] = (gi, ni), (gi, m)
            m = _put_answers((ans, ans_mask, labels, label_mask), gi, m, req, placed - vis)
            placed = end
        unique += len(gr.trunk) + placed
    batch = PackedScoringBatch(trunk_tokens, trunk_len, tokens, positions, segments, visible,
                               ans, ans_mask, labels, label_mask)
    return PackedBatch(batch=batch, rows=rows, unique_tokens=unique, slots=first), window


def _shape_key(requests, gr: Group, min_trunk: int, min_suffix: int) -> tuple:
    s = max(_suffix_lengths(requests, gr))
    return (_trunk_bucket(len(gr.trunk), min_trunk), bucket(len(gr.members), 1, fine=4),
            bucket(s, min_suffix, fine=8))


def _plan_calls(requests: Sequence[Request], layout: str, *, max_groups_per_call: int,
                min_shared_frac: float, min_shared_tokens: int, max_group: int
                ) -> tuple[list[Group], list[list[Group]]]:
    """The groups of ``requests`` and the device calls (lists of groups) that score them."""
    groups = plan_groups(requests, min_shared_frac=min_shared_frac,
                         min_shared_tokens=min_shared_tokens, max_group=max_group,
                         layout=layout)
    by_shape: dict[tuple, list[Group]] = {}
    for gr in groups:
        key = (_shape_key(requests, gr, 64, 8) if layout == "rows" else
               _packed_key(requests, gr))
        by_shape.setdefault(key, []).append(gr)
    return groups, _split_calls(by_shape, max_groups_per_call)


def _split_calls(by_shape: dict[tuple, list], max_groups_per_call: int) -> list[list]:
    """Each shape's items in calls of power-of-two counts (no group slot is padding)."""
    calls: list[list] = []
    for key in sorted(by_shape):
        pending = by_shape[key]
        while pending:
            size = min(max_groups_per_call, len(pending))
            size = 1 << (size.bit_length() - 1)
            calls.append(pending[:size])
            pending = pending[size:]
    return calls


def past_bucket(n: int) -> int:
    """Padded cached-prefix slots C of a call: 0, else the smallest of 256, 512, 1024, 1536,
    2048, 3072, 4096, ... (powers of two, and 1.5 times them from 1,536 on) holding n. Unused
    past slots cost no attention (the CPU kernel skips key blocks no query sees) but are
    copied in every layer (the past and the row's keys are one array there): above 1,024
    slots at most a third is padding (8 sessions of ~1,300 cached tokens: 1,536 slots, not
    2,048), while a growing agent context compiles a new program about twice per doubling
    of its cached part."""
    if n <= 0:
        return 0
    n = max(int(n), 256)
    top = 1 << (n - 1).bit_length()
    return top * 3 // 4 if top >= 2048 and n <= top * 3 // 4 else top


class _CachedGroup(NamedTuple):
    """A group whose trunk's first ``match.tokens`` tokens are cached: ``rest`` is the group
    with only the trunk after them (visible lengths and suffixes unchanged)."""

    rest: Group
    trunk: tuple[int, ...]
    match: Any  # prefix_cache.Match


def _plan_cached_calls(requests: Sequence[Request], groups: Sequence[Group], cache: Any,
                       max_groups_per_call: int) -> list[list[_CachedGroup]]:
    """Looks every group's trunk up in ``cache``; calls of up to ``max_groups_per_call``
    groups whatever their shapes (``_run_cached_call`` pads them to one)."""
    cached = []
    for gr in groups:
        # pinned until its call has gathered and stored (``_run_cached_call``): an earlier
        # call's stores must not evict the blocks a later call reads
        match = cache.match(gr.trunk, pin=True)
        rest = Group(trunk=gr.trunk[match.tokens:], members=gr.members, visible=gr.visible)
        cached.append(_CachedGroup(rest, gr.trunk, match))
    step = max(1, max_groups_per_call)
    return [cached[i:i + step] for i in range(0, len(cached), step)]


def _pad_groups(batch: PackedScoringBatch, g: int, pad_id: int) -> PackedScoringBatch:
    """The batch with all-padding groups appended up to ``g`` (no token, no answer slot)."""
    extra = g - batch.trunk_tokens.shape[0]
    if extra <= 0:
        return batch
    fills = {"trunk_tokens": pad_id, "suffix_tokens": pad_id, "suffix_segments": -1}
    return PackedScoringBatch(*(
        np.concatenate([a, np.full((extra,) + a.shape[1:], fills.get(name, 0), a.dtype)])
        for name, a in zip(PackedScoringBatch._fields, batch)))


def _run_call(params, config: ModelConfig, requests: Sequence[Request], call: Sequence[Group],
              layout: str, *, pad_id: int, full_vocab: bool) -> tuple[PackedBatch, np.ndarray]:
    """One device call of ``layout`` over groups (no prefix cache): (the batch, log-probs)."""
    if layout == "rows":
        packed = pack_groups(requests, call, pad_id=pad_id)
        # stored: a later process loads the compiled program without tracing it
        fn = functools.partial(compile_cache.stored(score_batch, ("config", "full_vocab")),
                               full_vocab=full_vocab)
    else:
        packed, window = pack_suffixes(requests, call, pad_id=pad_id)
        fn = functools.partial(
            compile_cache.stored(score_packed, ("config", "window", "full_vocab")),
            window=window, full_vocab=full_vocab)
    # numpy in: jit transfers it (jnp.asarray would compile one staging program per array
    # shape in this jax version, 7 of the 8 programs of a cold scoring job)
    return packed, np.asarray(fn(params, config, packed.batch))               # [G, M, K]


def _run_cached_call(params, config: ModelConfig, requests: Sequence[Request],
                     call: Sequence[_CachedGroup], cache: Any, kv_dtype: Any, *,
                     pad_id: int, full_vocab: bool) -> tuple[PackedBatch, np.ndarray]:
    """One device call over cached prefixes: gathers the groups' cached keys/values, scores
    the packed rest (``score_packed_cached``), stores the trunks' new whole blocks and
    releases the groups' matches."""
    try:
        rests = [cg.rest for cg in call]
        # One padded shape for the call: rows (>= 256) and the trunk width to the same power
        # of two, cached slots to a power of two, groups to a power of two. Padding costs no
        # products on CPU (the matmul kernel skips rows past a row's last token, the
        # attention kernel key blocks no query sees), only its elementwise work (rows 256 ->
        # 1,024 for 150 tokens: ~1.5x), while every distinct shape is a compile (seconds) in
        # the middle of an agent's session: an agent step runs ~120-250 tokens, which rows of
        # 128 / 256 split into two programs per cached size.
        p = max(256, 1 << (max(_packed_key(requests, r)[1] for r in rests) - 1).bit_length())
        packed, _ = pack_suffixes(requests, rests, pad_id=pad_id, shape=(p, p))
        g = 1 << (len(call) - 1).bit_length()
        batch = _pad_groups(packed.batch, g, pad_id)
        c = past_bucket(max(cg.match.tokens for cg in call))
        shape = (config.num_layers, g, c, config.num_kv_heads, config.head_dim)
        lengths = np.zeros(g, np.int32)
        lengths[:len(call)] = [cg.match.tokens for cg in call]
        fn = functools.partial(
            compile_cache.stored(score_packed_cached, ("config", "full_vocab")),
            full_vocab=full_vocab)
        # the past in the cache's reused buffers (no fresh [L, G, C, K, H] per call: its page
        # faults and zeroing cost ~1 s at 8 sessions x 2,048 slots on the 2-core VM)
        with cache.gathered([cg.match for cg in call], shape, kv_dtype) as (past_k, past_v):
            result, ks, vs = fn(params, config, batch,
                                decoder.KVCache(past_k, past_v, lengths))
            result, ks, vs = np.asarray(result), np.asarray(ks), np.asarray(vs)  # [L,G,T,K,H]
        for gi, cg in enumerate(call):
            n = len(cg.rest.trunk)
            cache.store(cg.trunk, cg.match, ks[:, gi, :n], vs[:, gi, :n])
        return packed, result
    finally:
        for cg in call:
            cache.release(cg.match)


def program_keys(requests: Sequence[Request], *, full_vocab: bool = False,
                 layout: str = "packed", max_groups_per_call: int = 4,
                 min_shared_frac: float = 0.5, min_shared_tokens: int = 32,
                 max_group: int = 64) -> list[tuple]:
    """What ``score_requests`` with these arguments compiles, call by call, without running
    the model: per call (layout, full_vocab, window or None, the batch's array shapes). Equal
    keys share one compiled program (for one params/config), so ``len(set(keys))`` bounds the
    compiles of a job (host work only: planning and packing)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    _, calls = _plan_calls(requests, layout, max_groups_per_call=max_groups_per_call,
                           min_shared_frac=min_shared_frac,
                           min_shared_tokens=min_shared_tokens, max_group=max_group)
    keys = []
    for call in calls:
        if layout == "rows":
            packed, window = pack_groups(requests, call), None
        else:
            packed, window = pack_suffixes(requests, call)
        keys.append((layout, full_vocab, window,
                     tuple(np.shape(a) for a in packed.batch)))
    return keys


def score_requests(params, config: ModelConfig, requests: Sequence[Request], *,
                   full_vocab: bool = False, max_groups_per_call: int = 4,
                   min_shared_frac: float = 0.5, min_shared_tokens: int = 32,
                   max_group: int = 64, pad_id: int = 0, progress: bool = False,
                   stats: dict | None = None, layout: str = "packed",
                   prefix_cache: Any = None) -> list[np.ndarray]:
    """Scores requests with shared-prefix batching; returns per request [A_r, K_r] log-probs.

    Groups with the same (T, N, S) buckets are packed together, up to ``max_groups_per_call``
    per call, split into power-of-two counts so no group slot is ever padding. ``stats``
    (a dict) receives "unique_tokens" (tokens actually run), "request_tokens" (tokens a
    one-by-one scorer would run), "calls" and "cached_tokens".

    prefix_cache (a ``jaxdm.decision.prefix_cache.PrefixCache`` filled for these params and
    config only; packed layout): each group's trunk is looked up, only the tokens after its
    longest cached run of whole blocks are run (``score_packed_cached``), and the trunk's new
    whole blocks are stored. Same numbers as without it (to fp32 rounding).
    """
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"requests[{i}] is {type(r).__name__}, expected Request")
        if len(r.tokens) > config.max_position_embeddings:
            raise ValueError(f"requests[{i}] has {len(r.tokens)} tokens, more than the model's "
                             f"context ({config.max_position_embeddings})")
        bad = [c for cs in r.candidates for c in cs if not 0 <= c < config.vocab_size]
        if bad:
            raise ValueError(f"requests[{i}]: candidate ids {bad[:5]} outside the vocabulary "
                             f"of {config.vocab_size}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if prefix_cache is not None and layout != "packed":
        raise ValueError(f"a prefix cache needs layout 'packed', got {layout!r}")
    groups, calls = _plan_calls(requests, layout, max_groups_per_call=max_groups_per_call,
                                min_shared_frac=min_shared_frac,
                                min_shared_tokens=min_shared_tokens, max_group=max_group)
    cached_tokens = 0
    if prefix_cache is not None:
        calls = _plan_cached_calls(requests, groups, prefix_cache, max_groups_per_call)
        cached_tokens = sum(cg.match.tokens for call in calls for cg in call)
        kv_dtype = jax.tree.leaves(params["layers"]["k"])[0].dtype
    out: list[np.ndarray | None] = [None] * len(requests)
    unique = 0
    started = 0  # calls begun (a cached call releases its own matches)
    try:
        # bf16 layer weights as their bit patterns and the projections' stacks passed whole to
        # the matmul kernel, once for all calls (no copy on CPU; inside each call's program a
        # cast would copy the whole stack, the layer loop each layer's slice)
        params = cpu_scan.inference_layers(params)
        it = calls
        if progress:
            from tqdm.auto import tqdm
            it = tqdm(calls, desc="shared-prefix scoring", unit="call")
        for call in it:
            started += 1
            if prefix_cache is not None:
                packed, result = _run_cached_call(params, config, requests, call, prefix_cache,
                                                  kv_dtype, pad_id=pad_id,
                                                  full_vocab=full_vocab)
            else:
                packed, result = _run_call(params, config, requests, call, layout,
                                           pad_id=pad_id, full_vocab=full_vocab)
            unique += packed.unique_tokens
            for rid, (gi, m0) in packed.slots.items():
                req = requests[rid]
                arr = np.full((len(req.answer_positions), max(len(c) for c in req.candidates)),
                              np.nan, np.float32)
                for ai, cand in enumerate(req.candidates):
                    arr[ai, :len(cand)] = result[gi, m0 + ai, :len(cand)]
                out[rid] = arr
    finally:
        for call in calls[started:] if prefix_cache is not None else ():
            for cg in call:
                prefix_cache.release(cg.match)
    if stats is not None:
        stats["unique_tokens"] = stats.get("unique_tokens", 0) + unique
        stats["request_tokens"] = stats.get("request_tokens", 0) + sum(
            len(r.tokens) for r in requests)
        stats["calls"] = stats.get("calls", 0) + len(calls)
        stats["groups"] = stats.get("groups", 0) + len(groups)
        stats["cached_tokens"] = stats.get("cached_tokens", 0) + cached_tokens
    return out  # type: ignore[return-value]


def score_requests_one_by_one(params, config: ModelConfig, requests: Sequence[Request], *,
                              full_vocab: bool = False) -> list[np.ndarray]:
    """Reference: each request alone through ``forward`` (no sharing), same output layout.

    Used by tests to check that shared-prefix scoring equals one-by-one scoring.
    """
    out = []
    for r in requests:
        # Right padding to a bucket changes nothing before it (causal) and bounds compiles.
        n = len(r.tokens)
        padded = np.zeros((1, bucket(n, 64, fine=128)), np.int32)
        padded[0, :n] = r.tokens
        positions = jnp.arange(padded.shape[1])[None]
        hidden = decoder.forward(params, config, jnp.asarray(padded), positions)[0]
        rows = []
        for p, cand in zip(r.answer_positions, r.candidates):
            full = decoder.lm_logits(params, config, hidden[p])
            if full_vocab:
                lp = full - jax.nn.logsumexp(full)
                rows.append(np.asarray(lp[jnp.asarray(cand)]))
            else:
                rows.append(np.asarray(jax.nn.log_softmax(full[jnp.asarray(cand)])))
        k = max(len(c) for c in r.candidates)
        arr = np.full((len(rows), k), np.nan, np.float32)
        for i, row in enumerate(rows):
            arr[i, :len(row)] = row
        out.append(arr)
    return out
