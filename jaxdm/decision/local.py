"""Local decision models on a jaxdm model: constrained readout and option likelihood.

Both tokenise every request exactly as a one-by-one chat API call would (the chat template of
``jaxdm.decision.render.render_messages`` applied as text, then tokenised without extra special
tokens; special-token strings inside contexts and options stay text, ``jaxdm.models.tokenizer.chat_ids``) and score all requests of a batch with ``shared_prefix.score_requests``, so each
answer equals what scoring that request alone gives (tests check max |diff| <= 1e-3 fp32).

- ``LocalReadout``: options are shown with single-token labels A, B, C, ... and the
  next-token distribution at the answer position (the first assistant token), restricted to
  the label tokens, is renormalised; Yes/No: P(Yes) / (P(Yes) + P(No)). At construction the
  labels and Yes/No are checked to be single tokens *in context* (right after the assistant
  header); a tokenizer where they are not raises ValueError. More options than the 26
  labels raise ValueError (use LocalLikelihood, which has no such limit).
- ``LocalLikelihood``: each option's tokens (plus the end-of-turn token, so that "cabinet 1"
  is not a free prefix of "cabinet 10") are appended to the shared prompt; the option's score
  is the mean (``reduction="mean"``) or sum of its token log-probs, softmaxed over options.
  The options are the suffixes of one shared state, scored in one batched pass.

Cross-call prefix cache (``prefix_cache_mb``, default ``DEFAULT_PREFIX_CACHE_MB``; 0 = off;
``prefix_cache_block`` tokens per block, default 32): the keys/values of the shared contexts
of earlier calls are kept (``jaxdm.decision.prefix_cache``, LRU within the bound), and a
call runs only the tokens after the longest cached run of whole blocks of its context, so an
agent asking at every step about its growing context does not re-run the steps before. The
answers equal the uncached ones to fp32 rounding (tests). ``cache_stats()`` reports it. The
cache is cleared when ``params`` is replaced. Packed layout only (``layout="rows"`` has it
off; asking for both is a PrefixCacheError).

Cost per answer: tokens_in is what the one-by-one API call would send (for likelihood: the
prompt once per option plus the option tokens), tokens_out 0, usd None, seconds the batch
wall time divided evenly over its questions. ``stats`` accumulates unique tokens actually run.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.decision import prefix_cache, render
from jaxdm.decision import shared_prefix
from jaxdm.decision.types import (ChoiceResult, Cost, MultipleChoice, ScoreResult, YesNo,
                                  choice_ok, score_ok)
from jaxdm.models import compile_cache, decoder
from jaxdm.models.tokenizer import chat_ids, text_ids

# Default bound of the cross-call prefix cache (MiB): SmolLM2-135M keeps 45 KiB of fp32 keys
# and values per token, so about 23,000 tokens (eight 30-step agent sessions of ~2,500).
DEFAULT_PREFIX_CACHE_MB = 1024


def encode_messages(tokenizer: Any, messages: Sequence[dict]) -> list[int]:
    """Token ids of a chat prompt with the generation header, as an API server builds them."""
    return encode_conversations(tokenizer, [messages])[0]


def encode_conversations(tokenizer: Any, conversations: Sequence[Sequence[dict]]
                         ) -> list[list[int]]:
    """``encode_messages`` of each conversation, encoded as one batch (the fast tokenizer
    spreads it over the CPU's cores: 60 judge prompts 0.14-0.19 -> 0.07 s here)."""
    if not conversations:
        return []
    # Untrusted contents stay text: a "<|im_start|>" in an observation is not a new turn.
    return chat_ids(tokenizer, [list(m) for m in conversations])


def single_token_id(tokenizer: Any, label: str) -> int:
    """The id of ``label`` when it is one token right after the assistant header, else error."""
    probe = [{"role": "user", "content": "probe"}]
    text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    base = tokenizer(text, add_special_tokens=False)["input_ids"]
    full = tokenizer(text + label, add_special_tokens=False)["input_ids"]
    alone = tokenizer(label, add_special_tokens=False)["input_ids"]
    if len(alone) != 1 or list(full[:len(base)]) != list(base) or len(full) != len(base) + 1 \
            or full[-1] != alone[0]:
        raise ValueError(f"label {label!r} is not a single token after the assistant header in "
                         f"this tokenizer (alone: {alone}, in context: {full[len(base):]})")
    return int(alone[0])


def _check_finite(arr: np.ndarray, where: str) -> None:
    if not np.all(np.isfinite(arr)):
        raise FloatingPointError(f"{where}: the model produced non-finite log-probabilities "
                                 f"{arr.ravel()[:8]} (NaN/inf in the logits or parameters)")


# ------------------------------------------- next-token distributions (`jaxdm decide` routes)
# The OpenAI-compatible routes of `jaxdm decide` need what the decision paths above never
# compute: the full-vocabulary distribution after a prompt (its top k) and, with ``echo``, each
# prompt token's log-prob. Separate programs, so the scoring paths build no logits they discard.


@functools.partial(jax.jit, static_argnames=("config", "k"))
def position_logprobs(params, config, tokens: jax.Array, read: jax.Array, targets: jax.Array,
                      *, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The next-token log-softmax over the vocabulary at positions ``read`` of one prompt.

    tokens [1, S] int32 (right padding changes nothing before it: causal), read [R] int32
    positions, targets [R] int32 ids -> (top_logprobs [R, k] fp32, top_ids [R, k] int32,
    target_logprobs [R] fp32): the k largest entries of log p(. | tokens[:r + 1]) and the
    entry of targets[r]. The [R, V] logits are built ``shared_prefix.HEAD_CHUNK`` rows at a
    time."""
    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(f"position_logprobs: tokens must be [1, S], got {tokens.shape}")
    if read.ndim != 1 or targets.shape != read.shape:
        raise ValueError(f"position_logprobs: read and targets must be [R], got {read.shape} "
                         f"and {targets.shape}")
    if not 1 <= k <= config.vocab_size:
        raise ValueError(f"position_logprobs: k must be in [1, {config.vocab_size}], got {k}")
    s = tokens.shape[1]
    hidden = decoder.forward(params, config, tokens, jnp.arange(s)[None])[0]     # [S, D]
    picked = jnp.take(hidden, read, axis=0)                                     # [R, D]
    r = read.shape[0]
    size = min(shared_prefix.HEAD_CHUNK, r)
    blocks = -(-r // size)
    picked = jnp.pad(picked, [(0, blocks * size - r), (0, 0)])
    tgt = jnp.pad(targets, [(0, blocks * size - r)])

    def block(args):
        h, t = args                                                             # [C, D], [C]
        logits = decoder.lm_logits(params, config, h)                           # [C, V]
        lp = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        vals, ids = jax.lax.top_k(lp, k)                                        # [C, k]
        return vals, ids.astype(jnp.int32), jnp.take_along_axis(lp, t[:, None], -1)[:, 0]

    vals, ids, target = jax.lax.map(block, (picked.reshape(blocks, size, -1),
                                            tgt.reshape(blocks, size)))
    return (vals.reshape(-1, k)[:r], ids.reshape(-1, k)[:r], target.reshape(-1)[:r])


@dataclasses.dataclass(frozen=True)
class PromptLogprobs:
    """``LocalReadout.prompt_logprobs`` of one prompt of n tokens, rows = positions read
    (the last one only, or with echo all n): row r is the distribution after tokens[:r + 1].

    top_ids, top_logprobs [R, k]: its k most likely next tokens (k >= 1, descending).
    token_logprobs [R]: log p(tokens[r + 1] | tokens[:r + 1]), NaN in the last row (no token
    follows the prompt).
    """

    top_ids: np.ndarray
    top_logprobs: np.ndarray
    token_logprobs: np.ndarray


def _k_bucket(k: int) -> int:
    return 1 << max(0, int(k) - 1).bit_length()   # 1, 2, 4, 8, ...: few programs


class _NextTokens:
    """Next-token distributions of a local backend (mixed into ``_LocalBase``: uses its
    params, config, pad_id, _check_length and _run)."""

    def prompt_logprobs(self, prompt: Sequence[int], *, top_k: int = 1, echo: bool = False
                        ) -> PromptLogprobs:
        """Log-probs after ``prompt`` (token ids) under the full vocabulary: its ``top_k``
        next tokens, and with ``echo`` the same at every prompt position plus each prompt
        token's own log-prob (``PromptLogprobs``). Too long a prompt or an id outside the
        vocabulary is a ValueError."""
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt has no tokens")
        self._check_length(len(ids), "prompt")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary of "
                             f"{self.config.vocab_size}")
        if not 1 <= top_k <= self.config.vocab_size:
            raise ValueError(f"top_k must be in [1, {self.config.vocab_size}], got {top_k}")
        n = len(ids)
        s = shared_prefix.bucket(n, 64, fine=128)
        tokens = np.full((1, s), self.pad_id, np.int32)
        tokens[0, :n] = ids
        if echo:
            read = np.arange(s, dtype=np.int32)        # all of the bucket: one program per S
            targets = np.zeros(s, np.int32)
            targets[:n - 1] = ids[1:]
        else:
            read = np.asarray([n - 1], np.int32)
            targets = np.zeros(1, np.int32)
        fn = compile_cache.stored(position_logprobs, ("config", "k"))
        k = min(_k_bucket(top_k), self.config.vocab_size)
        vals, top, tgt = (np.asarray(a) for a in fn(self.params, self.config, tokens, read,
                                                     targets, k=k))
        rows = slice(0, n) if echo else slice(0, 1)
        token_lp = tgt[rows].astype(np.float32)
        token_lp[-1] = np.nan
        _check_finite(vals[rows, :top_k], "prompt_logprobs")
        return PromptLogprobs(top_ids=top[rows, :top_k], top_logprobs=vals[rows, :top_k],
                              token_logprobs=token_lp)

    def label_logprobs(self, prompts: Sequence[Sequence[int]], label_ids: Sequence[int], *,
                       normalize: bool) -> list[np.ndarray]:
        """Per prompt (token ids), the log-probs [L] of ``label_ids`` as its next token: over
        the labels only (``normalize``: log-softmax across them, constrained readout) or under
        the full vocabulary. All prompts run in one shared-prefix pass (one trunk for a
        common query)."""
        if not prompts:
            return []
        labels = tuple(int(t) for t in label_ids)
        if not labels:
            raise ValueError("label_ids is empty")
        reqs = []
        for i, p in enumerate(prompts):
            toks = tuple(int(t) for t in p)
            if not toks:
                raise ValueError(f"prompts[{i}] has no tokens")
            self._check_length(len(toks), f"prompts[{i}]")
            reqs.append(shared_prefix.Request(toks, (len(toks) - 1,), (labels,)))
        out = self._run(reqs, full_vocab=not normalize)
        rows = []
        for i, lp in enumerate(out):
            _check_finite(lp, f"prompts[{i}]")
            rows.append(lp[0].astype(np.float64))
        return rows


class _LocalBase(_NextTokens):
    def __init__(self, pretrained: Any, *, max_groups_per_call: int = 4,
                 min_shared_frac: float = 0.5, progress: bool = False, name: str | None = None,
                 layout: str = "packed", prefix_cache_mb: float | None = None,
                 prefix_cache_block: int = prefix_cache.DEFAULT_BLOCK_TOKENS):
        if layout not in shared_prefix.LAYOUTS:
            raise ValueError(f"layout must be one of {shared_prefix.LAYOUTS}, got {layout!r}")
        # The cross-call prefix cache (module docstring): on by default in the packed layout.
        if prefix_cache_mb is None:
            prefix_cache_mb = DEFAULT_PREFIX_CACHE_MB if layout == "packed" else 0
        mb = prefix_cache.check_bound_mb(prefix_cache_mb)
        if mb > 0 and layout != "packed":
            raise prefix_cache.PrefixCacheError(
                f"prefix_cache_mb={prefix_cache_mb!r} needs layout 'packed', got {layout!r} "
                "(set prefix_cache_mb=0)")
        self.prefix_cache = (prefix_cache.PrefixCache(int(mb * prefix_cache.MIB),
                                                      prefix_cache_block) if mb > 0 else None)
        for attr in ("params", "config", "tokenizer"):
            if not hasattr(pretrained, attr):
                raise TypeError(f"pretrained must have .params, .config and .tokenizer (a "
                                f"jaxdm.models.Pretrained); missing .{attr}")
        if pretrained.tokenizer is None:
            raise ValueError("pretrained.tokenizer is None; load the model with its tokenizer")
        compile_cache.enable()  # second processes load the scoring programs from disk
        self.pretrained = pretrained
        self.params = pretrained.params
        self._cached_params = self.params   # the params the prefix cache's blocks belong to
        self.config = pretrained.config
        self.tokenizer = pretrained.tokenizer
        self.max_groups_per_call = int(max_groups_per_call)
        self.min_shared_frac = float(min_shared_frac)
        self.progress = progress
        self.layout = layout
        self.stats: dict[str, int] = {}
        path = getattr(pretrained, "path", None)
        self._model_name = name or (getattr(path, "name", None) or "local")
        pad = getattr(pretrained.config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        self.yes_id = single_token_id(self.tokenizer, render.YES_NO[0])
        self.no_id = single_token_id(self.tokenizer, render.YES_NO[1])

    def _check_length(self, n_tokens: int, where: str) -> None:
        limit = self.config.max_position_embeddings
        if n_tokens > limit:
            raise ValueError(f"{where} is {n_tokens} tokens, longer than the model's context "
                             f"({limit})")

    def _run(self, requests: list[shared_prefix.Request], full_vocab: bool,
             max_group: int = 64) -> list[np.ndarray]:
        if self.prefix_cache is not None and self.params is not self._cached_params:
            # new parameters (a training step, an adapter swap): no cached key is theirs
            self.prefix_cache.clear()
            self._cached_params = self.params
        return shared_prefix.score_requests(
            self.params, self.config, requests, full_vocab=full_vocab,
            max_groups_per_call=self.max_groups_per_call,
            min_shared_frac=self.min_shared_frac, pad_id=self.pad_id, progress=self.progress,
            stats=self.stats, layout=self.layout, max_group=max_group,
            prefix_cache=self.prefix_cache)

    def cache_stats(self) -> dict:
        """The cross-call prefix cache's counters (``prefix_cache.PrefixCache.stats``: bytes
        used, max_bytes, hits, misses, evictions, tokens_reused, ...); ``enabled`` False and
        zeros when it is off."""
        if self.prefix_cache is None:
            return prefix_cache.disabled_stats()
        return self.prefix_cache.stats()

    def _yesno_requests(self, questions: Sequence[YesNo]) -> list[shared_prefix.Request]:
        for i, q in enumerate(questions):
            if not isinstance(q, YesNo):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected YesNo")
        prompts = encode_conversations(
            self.tokenizer, [render.render_messages(q, "constrained") for q in questions])
        reqs = []
        for i, toks in enumerate(prompts):
            self._check_length(len(toks), f"questions[{i}]")
            reqs.append(shared_prefix.Request(tuple(toks), (len(toks) - 1,),
                                              ((self.yes_id, self.no_id),)))
        return reqs

    def yesno_requests(self, questions: Sequence[YesNo]) -> list[shared_prefix.Request]:
        """The requests ``score`` runs for ``questions`` (e.g. for
        ``shared_prefix.program_keys``: what a job compiles)."""
        return self._yesno_requests(questions)

    def score(self, questions: Sequence[YesNo]) -> list[ScoreResult]:
        """s = P(Yes) / (P(Yes) + P(No)) at the first assistant token, for every question."""
        if not questions:
            return []
        reqs = self._yesno_requests(questions)
        t0 = time.perf_counter()
        out = self._run(reqs, full_vocab=False)
        per = (time.perf_counter() - t0) / len(reqs)
        results = []
        for i, (r, lp) in enumerate(zip(reqs, out)):
            _check_finite(lp, f"questions[{i}]")
            results.append(score_ok(float(np.exp(lp[0, 0])),
                                    cost=Cost(tokens_in=len(r.tokens), seconds=per)))
        return results


class LocalReadout(_LocalBase):
    """Constrained readout on a local jaxdm model (see module docstring)."""

    def __init__(self, pretrained: Any, **kwargs):
        super().__init__(pretrained, **kwargs)
        self.label_ids = tuple(single_token_id(self.tokenizer, lab) for lab in render.LABELS)
        self.name = f"local_readout({self._model_name})"

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """Probabilities over each question's options: the next-token distribution at the end
        of the constrained prompt, restricted to the single-token labels A, B, ... of its K
        options and renormalised (probs [K] summing to 1; one forward per shared context).
        A question with more options than labels is a ValueError, a non-MultipleChoice a
        TypeError."""
        if not questions:
            return []
        for i, q in enumerate(questions):
            if not isinstance(q, MultipleChoice):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected MultipleChoice")
            if len(q.options) > len(self.label_ids):
                raise ValueError(f"questions[{i}] has {len(q.options)} options, more than the "
                                 f"{len(self.label_ids)} single-token labels; use "
                                 "LocalLikelihood or split the options")
        prompts = encode_conversations(
            self.tokenizer, [render.render_messages(q, "constrained") for q in questions])
        reqs = []
        for i, (q, toks) in enumerate(zip(questions, prompts)):
            self._check_length(len(toks), f"questions[{i}]")
            reqs.append(shared_prefix.Request(tuple(toks), (len(toks) - 1,),
                                              (self.label_ids[:len(q.options)],)))
        t0 = time.perf_counter()
        out = self._run(reqs, full_vocab=False)
        per = (time.perf_counter() - t0) / len(reqs)
        results = []
        for i, (r, lp) in enumerate(zip(reqs, out)):
            _check_finite(lp, f"questions[{i}]")
            probs = np.exp(lp[0].astype(np.float64))
            results.append(choice_ok(probs / probs.sum(),
                                     cost=Cost(tokens_in=len(r.tokens), seconds=per)))
        return results

    def refusal(self, question: Any) -> str | None:
        """Why ``choose`` would refuse ``question`` before any scoring (the server checks this
        per question, so one refused question does not fail the batch it came in), or None."""
        if not isinstance(question, MultipleChoice):
            return f"{type(question).__name__} is not a MultipleChoice"
        if len(question.options) > len(self.label_ids):
            return (f"{len(question.options)} options, more than the {len(self.label_ids)} "
                    "single-token labels; use LocalLikelihood or split the options")
        return None


class LocalLikelihood(_LocalBase):
    """Option likelihood on a local jaxdm model (see module docstring)."""

    def __init__(self, pretrained: Any, *, reduction: str = "mean", append_end: bool = True,
                 **kwargs):
        super().__init__(pretrained, **kwargs)
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.reduction = reduction
        self.append_end = append_end
        self.end_ids: list[int] = []
        if append_end:
            eos = self.tokenizer.eos_token_id
            if eos is None:
                raise ValueError("append_end=True needs a tokenizer with an eos (end-of-turn) "
                                 "token")
            self.end_ids = [int(eos)]
        self.name = f"local_likelihood({self._model_name},{reduction})"

    def option_requests(self, q: MultipleChoice, where: str = "question"
                        ) -> list[shared_prefix.Request]:
        """One request per option: the shared prompt followed by the option's reply tokens (its
        name when the question has ``option_names``, else its text)."""
        prompt = encode_messages(self.tokenizer, render.render_messages(q, "likelihood"))
        reqs = []
        for j, opt in enumerate(render.likelihood_replies(q)):
            opt_ids = text_ids(self.tokenizer, opt)
            if not opt_ids:
                raise ValueError(f"{where}: option {j} ({opt!r}) has no tokens")
            cont = opt_ids + self.end_ids
            toks = prompt + cont
            self._check_length(len(toks), f"{where} option {j} ({len(opt_ids)} option tokens)")
            positions = tuple(range(len(prompt) - 1, len(toks) - 1))
            reqs.append(shared_prefix.Request(tuple(toks), positions,
                                              tuple((c,) for c in cont)))
        return reqs

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """Probabilities over each question's K options: the softmax over options of each
        option's log-likelihood after the prompt (its text, then the end-of-turn tokens when
        ``append_end``; ``reduction``: the mean or the sum of those token log-probs), probs
        [K]; all options of a question share one prompt trunk. A non-MultipleChoice is a
        TypeError."""
        if not questions:
            return []
        reqs, owner = [], []
        for i, q in enumerate(questions):
            if not isinstance(q, MultipleChoice):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected MultipleChoice")
            for r in self.option_requests(q, f"questions[{i}]"):
                reqs.append(r)
                owner.append(i)
        t0 = time.perf_counter()
        # All options of one question share one trunk (the prompt runs once): a 69-option
        # DECISION GYM tool question split at the default 64 ran its ~2,000-token prompt twice.
        out = self._run(reqs, full_vocab=True,
                        max_group=max(64, max(len(q.options) for q in questions)))
        per = (time.perf_counter() - t0) / len(questions)
        results = []
        k = 0
        for i, q in enumerate(questions):
            scores, tokens_in = [], 0
            for _ in q.options:
                lp = out[k][:, 0]
                _check_finite(lp, f"questions[{i}]")
                scores.append(lp.mean() if self.reduction == "mean" else lp.sum())
                tokens_in += len(reqs[k].tokens)
                k += 1
            s = np.asarray(scores, np.float64)
            p = np.exp(s - s.max())
            results.append(choice_ok(p / p.sum(), cost=Cost(tokens_in=tokens_in, seconds=per)))
        return results
