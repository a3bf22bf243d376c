"""Two policy forms behind one interface: option-scoring and generative.

A policy turns the per-turn state of every live episode (``TurnInput``) into actions
(``act``: host-side, calls jitted device code) and turns recorded actions into fixed-shape
training arrays (``training_batch``) whose per-token log-probs, entropies and mask come from
the pure ``logp_and_entropy(params, batch)`` (used for the PPO ratio, the reference KL and
the entropy bonus).

- ``OptionScoringPolicy`` (the decision model as an actor): π(a | s) = softmax over the
  admissible actions of each option's mean (or summed) token log-likelihood after the state
  context, computed with ``jaxdm.decision.shared_prefix.score_batch`` (one prefill of the
  context, one batched pass over the option suffixes, differentiable). One action = one
  "token" for the PPO loss (L = 1); outputs are always valid.
- ``GenerativePolicy`` (the papers' form): the verl-agent prompt, sampling with the models'
  KV-cache sampler, ``<think>``/``<action>`` parsing; invalid outputs are flagged (the
  rollout engine sends ``INVALID_COMMAND`` and applies the penalty). L = response tokens.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import jaxdm.models as models
from jaxdm.decision import shared_prefix
from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.rl import text as rltext

__all__ = ["TurnInput", "ActionOut", "OptionScoringPolicy", "GenerativePolicy", "bucket",
           "option_log_probs", "SampleWindow"]


def bucket(n: int, minimum: int = 1) -> int:
    """Smallest power of two ≥ max(n, minimum): few distinct shapes, few compilations."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


@dataclasses.dataclass(frozen=True)
class TurnInput:
    """What the policy sees for one live episode at one turn."""

    goal: str
    observation: str
    admissible: tuple[str, ...]
    history: tuple[tuple[str, str], ...]  # all executed (observation, action) pairs so far
    steps_taken: int
    budget: int


@dataclasses.dataclass
class ActionOut:
    """One sampled action and what training needs to recompute its log-prob."""

    action: str | None         # parsed command (None: invalid output)
    valid: bool                # output well-formed (generative) / always True (options)
    raw: str                   # the model's text (generative) or the chosen option
    logp: float                # log-prob of the whole output under the sampling policy
    unit: dict[str, Any]       # form-specific token data for training_batch
    prompt_tokens: int = 0
    response_tokens: int = 0
    history_dropped: int = 0


# ---------------------------------------------------------------------------------------
# Option-scoring form.
# ---------------------------------------------------------------------------------------
class OptionBatch(NamedTuple):
    """Fixed-shape option-scoring batch (numpy or jax); D decisions, N options, A tokens."""

    scoring: shared_prefix.ScoringBatch  # G = D groups, trunk = context, suffix per option
    option_mask: Any                     # [D, N] bool, real options
    chosen: Any                          # [D] int32, the sampled option (0 when padding)
    row_mask: Any                        # [D] bool, real decisions


@functools.partial(jax.jit, static_argnames=("config", "normalize", "temperature"))
def option_log_probs(params, config: ModelConfig, batch: OptionBatch, *,
                     normalize: bool = True, temperature: float = 1.0):
    """log π(option | context) [D, N] and the policy entropy [D] (pure, differentiable).

    An option's score is the mean (``normalize``) or sum of its tokens' log-likelihoods
    after the context; π is the softmax of score / temperature over the real options.
    Padded options get log-prob −1e9 (exp = 0); padded decisions are uniform-garbage and
    must be masked by the caller (``row_mask``).
    """
    tok_lp = shared_prefix.score_batch(params, config, batch.scoring, full_vocab=True)[..., 0]
    amask = jnp.asarray(batch.scoring.answer_mask, bool)                     # [D, N, A]
    total = jnp.where(amask, tok_lp, 0.0).sum(-1)
    if normalize:
        total = total / jnp.maximum(amask.sum(-1), 1)
    omask = jnp.asarray(batch.option_mask, bool)
    # A finite "minus infinity": -inf would make p * log p NaN on padded options, and the
    # NaN would leak into gradients through the masking ``where``.
    logits = jnp.where(omask, total / temperature, -1e9)
    logits = jnp.where(omask.any(-1, keepdims=True), logits, 0.0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    safe_logp = jnp.where(omask, logp, 0.0)
    entropy = -(jnp.exp(safe_logp) * safe_logp * omask).sum(-1)
    return jnp.where(omask, logp, -1e9), entropy


class SampleWindow(NamedTuple):
    """[MULTIHOST] An ``act`` call's decisions are rows ``offset, offset + 1, ...`` of a
    larger batch of ``rows`` decisions padded to ``options`` options (another process holds
    the other rows): draw the Gumbel noise those rows get in that batch, so sampling equals
    the one-process batch's (``jaxdm.rl.distributed``). Threefry noise is "partitionable":
    element (i, k) of a [rows, options] draw depends only on i * options + k."""

    offset: int
    rows: int
    options: int


@functools.partial(jax.jit, static_argnames=("config", "normalize", "temperature", "greedy",
                                             "window_rows"))
def _sample_options(params, config, batch, key, row_offset=0, *, normalize, temperature,
                    greedy, window_rows=None):
    logp, _ = option_log_probs(params, config, batch, normalize=normalize,
                               temperature=temperature)
    if greedy:
        choice = jnp.argmax(logp, axis=-1)
    elif window_rows is None:
        choice = jax.random.categorical(key, logp, axis=-1)
    else:  # [MULTIHOST] this call's rows of the window's noise (categorical = Gumbel argmax)
        d, n = logp.shape
        noise = jax.random.gumbel(key, (window_rows + d, n), logp.dtype)
        choice = jnp.argmax(jax.lax.dynamic_slice_in_dim(noise, row_offset, d) + logp, axis=-1)
    return choice, jnp.take_along_axis(logp, choice[:, None], axis=-1)[:, 0]


class OptionScoringPolicy:
    """The decision model as an actor: a distribution over the admissible actions."""

    form = "option"
    # The sampling log-prob comes from the same jitted function as training's: it is π_old.
    exact_sampling_logp = True

    def __init__(self, config: ModelConfig, tokenizer: rltext.TextTokenizer, *,
                 history: int = 2, max_context_tokens: int = 256,
                 max_option_tokens: int = 16, max_options: int = 64, normalize: bool = True,
                 temperature: float = 1.0, fixed_context: bool = True):
        self.config, self.tokenizer = config, tokenizer
        self.history, self.normalize, self.temperature = history, normalize, float(temperature)
        self.max_context_tokens, self.max_option_tokens = max_context_tokens, max_option_tokens
        self.max_options = max_options
        self.fixed_context = fixed_context

    @property
    def static_key(self) -> tuple:
        """What the jitted log-prob computation depends on (for sharing compilations)."""
        return (self.form, self.config, self.normalize, self.temperature)

    # ---- host-side encoding -----------------------------------------------------------
    def _context_ids(self, s: TurnInput) -> tuple[list[int], int]:
        hist = list(s.history[-self.history:]) if self.history else []
        for drop in range(len(hist) + 1):
            ids = self.tokenizer.encode(rltext.option_context(
                s.goal, s.observation, hist[drop:], s.steps_taken, s.budget))
            if len(ids) <= self.max_context_tokens:
                return ids, drop
        return ids[-self.max_context_tokens:], len(hist) + 1

    def _option_ids(self, option: str) -> list[int]:
        ids = self.tokenizer.encode(" " + option)
        if not ids:
            raise ValueError(f"option {option!r} encodes to no tokens")
        return ids[: self.max_option_tokens]

    def encode(self, contexts: Sequence[Sequence[int]], options: Sequence[Sequence[Sequence[int]]],
               chosen: Sequence[int] | None = None, *, pad_decisions: int | None = None,
               pad_options: int | None = None) -> OptionBatch:
        """Pad decisions into an OptionBatch (bucketed shapes; ``pad_options``: at least
        this many option slots)."""
        d_real = len(contexts)
        if len(options) != d_real:
            raise ValueError(f"{len(options)} option lists for {d_real} contexts")
        for i, opts in enumerate(options):
            if not opts:
                raise ValueError(f"decision {i} has no options")
            if len(opts) > self.max_options:
                raise ValueError(f"decision {i} has {len(opts)} options > max_options="
                                 f"{self.max_options}")
        d = pad_decisions if pad_decisions is not None else bucket(d_real)
        if d < d_real:
            raise ValueError(f"pad_decisions={d} < number of decisions {d_real}")
        # A fixed trunk width (the context limit) keeps one compilation for every turn.
        t = bucket(max(max(len(c) for c in contexts),
                       self.max_context_tokens if self.fixed_context else 8), 8)
        n = bucket(max(max(len(o) for o in options), pad_options or 0), 8)
        a = bucket(max(len(x) for o in options for x in o), 8)
        pad = self.tokenizer.pad_id
        trunk = np.full((d, t), pad, np.int32)
        trunk_len = np.ones((d,), np.int32)
        suffix = np.full((d, n, a + 1), pad, np.int32)
        visible = np.zeros((d, n), np.int32)
        answer_index = np.zeros((d, n, a), np.int32)
        answer_mask = np.zeros((d, n, a), bool)
        label_ids = np.zeros((d, n, a, 1), np.int32)
        option_mask = np.zeros((d, n), bool)
        for i, (ctx, opts) in enumerate(zip(contexts, options)):
            if not ctx:
                raise ValueError(f"decision {i} has an empty context")
            trunk[i, :len(ctx)] = ctx
            trunk_len[i] = len(ctx)
            for k, o in enumerate(opts):
                # the suffix repeats the last context token so the first option token is
                # read from inside the suffix pass (positions continue at len(ctx) - 1)
                suffix[i, k, 0] = ctx[-1]
                suffix[i, k, 1:1 + len(o)] = o
                visible[i, k] = len(ctx) - 1
                answer_index[i, k, :len(o)] = np.arange(len(o))
                answer_mask[i, k, :len(o)] = True
                label_ids[i, k, :len(o), 0] = o
                option_mask[i, k] = True
        scoring = shared_prefix.ScoringBatch(
            trunk_tokens=trunk, trunk_len=trunk_len, suffix_tokens=suffix, visible=visible,
            answer_index=answer_index, answer_mask=answer_mask, label_ids=label_ids,
            label_mask=answer_mask[..., None].copy())
        ch = np.zeros((d,), np.int32)
        if chosen is not None:
            ch[:d_real] = np.asarray(chosen, np.int32)
        row_mask = np.arange(d) < d_real
        return OptionBatch(scoring, option_mask, ch, row_mask)

    # ---- acting -------------------------------------------------------------------------
    def act(self, params, states: Sequence[TurnInput], key, *, greedy: bool = False,
            pad_to: int | None = None, window: SampleWindow | None = None
            ) -> list[ActionOut]:
        """Sample one option per state (``pad_to``: pad the batch to this many decisions so
        every turn of a rollout reuses one compilation; ``window``: these states are rows of
        a larger batch, ``SampleWindow``)."""
        ctxs, opts, drops = [], [], []
        for s in states:
            if not s.admissible:
                raise ValueError(f"option-scoring policy needs admissible actions; goal {s.goal!r}"
                                 f" at step {s.steps_taken} has none")
            ids, drop = self._context_ids(s)
            ctxs.append(ids)
            drops.append(drop)
            opts.append([self._option_ids(o) for o in s.admissible])
        pad = None if pad_to is None else bucket(max(pad_to, len(states)))
        if window is None:
            batch = self.encode(ctxs, opts, pad_decisions=pad)
            choice, logp = _sample_options(params, self.config, batch, key,
                                           normalize=self.normalize,
                                           temperature=self.temperature, greedy=greedy)
        else:  # [MULTIHOST]
            batch = self.encode(ctxs, opts, pad_decisions=pad, pad_options=window.options)
            choice, logp = _sample_options(params, self.config, batch, key,
                                           np.int32(window.offset), normalize=self.normalize,
                                           temperature=self.temperature, greedy=greedy,
                                           window_rows=window.rows)
        choice, logp = np.asarray(choice), np.asarray(logp)
        out = []
        for i, s in enumerate(states):
            c = int(choice[i])
            out.append(ActionOut(action=s.admissible[c], valid=True, raw=s.admissible[c],
                                 logp=float(logp[i]),
                                 unit={"context": ctxs[i], "options": opts[i], "chosen": c},
                                 prompt_tokens=len(ctxs[i]), response_tokens=len(opts[i][c]),
                                 history_dropped=drops[i]))
        return out

    # ---- training -----------------------------------------------------------------------
    def training_batch(self, units: Sequence[dict[str, Any]], pad_to: int) -> OptionBatch:
        """The OptionBatch of training ``units`` (their context, options and chosen option), padded
        to ``pad_to`` decisions."""
        return self.encode([u["context"] for u in units], [u["options"] for u in units],
                           [u["chosen"] for u in units], pad_decisions=pad_to)

    def logp_and_entropy(self, params, batch: OptionBatch):
        """(logp [D, 1], entropy [D, 1], mask [D, 1]) of the chosen options."""
        logp, ent = option_log_probs(params, self.config, batch, normalize=self.normalize,
                                     temperature=self.temperature)
        chosen = jnp.asarray(batch.chosen)
        picked = jnp.take_along_axis(logp, chosen[:, None], axis=-1)
        mask = jnp.asarray(batch.row_mask, bool)[:, None]
        return jnp.where(mask, picked, 0.0), ent[:, None], mask


# ---------------------------------------------------------------------------------------
# Generative form.
# ---------------------------------------------------------------------------------------
class TokenBatch(NamedTuple):
    """Fixed-shape prompt+response rows: tokens [R, S], positions, valid, response mask."""

    tokens: Any
    valid: Any
    response_mask: Any  # [R, S] bool: the token at s was generated (its log-prob trains)


@functools.partial(jax.jit, static_argnames=("config", "with_entropy", "response_window"))
def token_log_probs_and_entropy(params, config: ModelConfig, batch: TokenBatch, *,
                                with_entropy: bool = True, response_window: int | None = None):
    """log p of every token given its prefix [R, S] (0 at s = 0) and the entropy there, both
    0 outside the response mask (``log_probs_and_entropy_from_hidden``)."""
    hidden = token_hidden_states(params, config, batch)
    return log_probs_and_entropy_from_hidden(params, config, hidden, batch,
                                             with_entropy=with_entropy,
                                             response_window=response_window)


def token_hidden_states(params, config: ModelConfig, batch: TokenBatch):
    """The decoder's final hidden states [R, S, d] of a TokenBatch (the training forward;
    LVOPD's distillation reads them too: ``jaxdm.rl.terms`` shares one forward)."""
    tokens = jnp.asarray(batch.tokens)
    r, s = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(s), (r, s))
    return decoder.forward(params, config, tokens, positions,
                           attn_mask=jnp.asarray(batch.valid, bool))


def log_probs_and_entropy_from_hidden(params, config: ModelConfig, hidden, batch: TokenBatch,
                                      *, with_entropy: bool = True,
                                      response_window: int | None = None):
    """``token_log_probs_and_entropy`` from ``token_hidden_states``' output [R, S, d].

    ``response_window`` W: each row's response is one contiguous run of at most W tokens
    (``GenerativePolicy.training_batch`` guarantees it), so the LM head runs only at the W
    positions from the row's first response token ([R, W] head rows instead of [R, S - 1]:
    TRL's ``logits_to_keep``; a 200-token prompt with a 32-token response runs the 49k-wide
    head at 1/7 of the positions). None: the head at every position."""
    tokens = jnp.asarray(batch.tokens)
    mask = jnp.asarray(batch.response_mask, bool)
    r, s = tokens.shape
    if response_window is None or response_window >= s - 1:
        h, targets, pos = hidden[:, :-1], tokens[:, 1:], None
    else:
        # token s is predicted from hidden s - 1; the window starts at the first response token
        first = jnp.argmax(mask, axis=1)
        want = first[:, None] + jnp.arange(response_window)[None, :]
        pos = jnp.clip(want, 1, s - 1)
        h = jnp.take_along_axis(hidden, (pos - 1)[:, :, None], axis=1)
        targets = jnp.take_along_axis(tokens, pos, axis=1)
    if with_entropy:
        lp, ent = decoder.token_logprobs_and_entropy(params, config, h, targets)
    else:
        lp, ent = decoder.token_logprobs(params, config, h, targets), None
    if pos is None:
        lp = jnp.pad(lp, ((0, 0), (1, 0)))
        ent = jnp.zeros_like(lp) if ent is None else jnp.pad(ent, ((0, 0), (1, 0)))
    else:  # back to [R, S]; a window slot outside the response is masked below
        keep = jnp.take_along_axis(mask, pos, axis=1) & (want == pos)  # clipped: duplicates
        rows = jnp.arange(r)[:, None]
        lp = jnp.zeros((r, s), lp.dtype).at[rows, pos].add(jnp.where(keep, lp, 0.0))
        ent = (jnp.zeros((r, s), jnp.float32) if ent is None else
               jnp.zeros((r, s), ent.dtype).at[rows, pos].add(jnp.where(keep, ent, 0.0)))
    return jnp.where(mask, lp, 0.0), jnp.where(mask, ent, 0.0), mask


class GenerativePolicy:
    """verl-agent-style generative policy over a decoder and a KV-cache sampler.

    ``generate_fn(params, config, tokenizer, prompt_ids, *, max_new_tokens, temperature,
    top_p, greedy, stop_strings, eos_ids, key)`` must return an object (or dict) with
    ``tokens`` (list of generated id lists) and ``text`` (list of strings); by default it is
    ``jaxdm.models.generate`` when that exists.
    """

    form = "generative"
    exact_sampling_logp = False  # the KV-cache sampler's numerics differ from training's

    def __init__(self, config: ModelConfig, tokenizer: rltext.TextTokenizer, *,
                 history: int = 2, max_prompt_tokens: int = 2048,
                 max_response_tokens: int = 512, temperature: float = 1.0, top_p: float = 1.0,
                 generate_fn: Callable | None = None, with_entropy: bool = True):
        self.config, self.tokenizer = config, tokenizer
        self.history, self.max_prompt_tokens = history, max_prompt_tokens
        self.max_response_tokens = max_response_tokens
        self.temperature, self.top_p, self.with_entropy = temperature, top_p, with_entropy
        if generate_fn is None:
            generate_fn = getattr(models, "generate", None)
            if generate_fn is None:
                raise RuntimeError("GenerativePolicy needs jaxdm.models.generate (the KV-cache "
                                   "sampler), which this checkout does not provide; pass "
                                   "generate_fn=")
        self.generate_fn = generate_fn

    @property
    def response_window(self) -> int:
        """The LM head's positions per training row: a response has at most this many tokens
        (``training_batch`` refuses longer ones), so the head never runs over the prompt."""
        return self.max_response_tokens

    @property
    def static_key(self) -> tuple:
        """What fixes this policy's compiled programs (form, model config, entropy on or off,
        the response window): jitted steps are cached per key."""
        return (self.form, self.config, self.with_entropy, self.response_window)

    def prompt_ids(self, s: TurnInput) -> tuple[list[int], int]:
        """The prompt token ids of one turn (goal, observation, admissible actions and the last
        ``history`` steps, fitted to max_prompt_tokens) and how many history steps were dropped to
        fit."""
        hist = list(s.history[-self.history:]) if self.history else []
        return rltext.fit_prompt(self.tokenizer, s.goal, s.observation, s.admissible, hist,
                                 s.steps_taken, self.max_prompt_tokens)

    def act(self, params, states: Sequence[TurnInput], key, *, greedy: bool = False,
            pad_to: int | None = None) -> list[ActionOut]:
        """Generate one action per state (sampled, or greedy) up to the closing </action>; each
        ActionOut holds the parsed action, whether it parsed, the raw text, the response's summed
        log-prob and the training unit (prompt ids, response ids, per-token sampling log-probs)."""
        del pad_to  # the sampler buckets its own batch shapes
        prompts, drops = zip(*(self.prompt_ids(s) for s in states))
        res = self.generate_fn(params, self.config, self.tokenizer, list(prompts),
                               max_new_tokens=self.max_response_tokens,
                               temperature=self.temperature, top_p=self.top_p, greedy=greedy,
                               stop_strings=("</action>",), eos_ids=(self.tokenizer.eos_id,),
                               key=key)
        get = (lambda k: res[k]) if isinstance(res, dict) else (lambda k: getattr(res, k))
        toks = get("tokens")
        try:
            texts = get("texts")
        except (KeyError, AttributeError):
            texts = get("text")
        if texts is None:
            texts = [self.tokenizer.decode(t) for t in toks]
        try:
            lps = get("logprobs")
        except (KeyError, AttributeError):
            lps = None
        out = []
        for i, s in enumerate(states):
            resp = [int(t) for t in toks[i]][: self.max_response_tokens]
            action, valid = rltext.parse_action(texts[i])
            tok_lp = (np.asarray(lps[i], np.float32)[: len(resp)] if lps is not None
                      else np.zeros(len(resp), np.float32))
            out.append(ActionOut(action=action, valid=valid, raw=texts[i],
                                 logp=float(tok_lp.sum()),
                                 unit={"prompt": list(prompts[i]), "response": resp,
                                       "sampling_logprobs": tok_lp.tolist()},
                                 prompt_tokens=len(prompts[i]), response_tokens=len(resp),
                                 history_dropped=drops[i]))
        return out

    def training_batch(self, units: Sequence[dict[str, Any]], pad_to: int) -> TokenBatch:
        """The TokenBatch [pad_to, S] of ``units`` (prompt + response rows, S bucketed to a multiple
        of 16, padding rows empty) with the response-token mask; pad_to below the unit count is a
        ValueError."""
        if pad_to < len(units):
            raise ValueError(f"pad_to={pad_to} < number of actions {len(units)}")
        s = bucket(max(len(u["prompt"]) + len(u["response"]) for u in units), 16)
        tokens = np.full((pad_to, s), self.tokenizer.pad_id, np.int32)
        valid = np.zeros((pad_to, s), bool)
        resp = np.zeros((pad_to, s), bool)
        for i, u in enumerate(units):
            p, r = u["prompt"], u["response"]
            if len(r) > self.response_window:  # the head runs only over the window
                raise ValueError(f"unit {i}: response of {len(r)} tokens exceeds "
                                 f"max_response_tokens={self.max_response_tokens}")
            tokens[i, :len(p) + len(r)] = list(p) + list(r)
            valid[i, :len(p) + len(r)] = True
            resp[i, len(p):len(p) + len(r)] = True
        return TokenBatch(tokens, valid, resp)

    def logp_and_entropy(self, params, batch: TokenBatch):
        """log p of each token given its prefix and the entropy there, both [R, S]
        (token_log_probs_and_entropy)."""
        return token_log_probs_and_entropy(params, self.config, batch,
                                           with_entropy=self.with_entropy,
                                           response_window=self.response_window)

    # One decoder forward shared by every loss term of a train step (``jaxdm.rl.terms``).
    def hidden_states(self, params, batch: TokenBatch):
        """The decoder's final hidden states [R, S, d] of ``batch`` (the one forward the loss terms
        share)."""
        return token_hidden_states(params, self.config, batch)

    def logp_and_entropy_from_hidden(self, params, hidden, batch: TokenBatch):
        """logp_and_entropy() from hidden_states()' output [R, S, d], without a second forward."""
        return log_probs_and_entropy_from_hidden(params, self.config, hidden, batch,
                                                 with_entropy=self.with_entropy,
                                                 response_window=self.response_window)
