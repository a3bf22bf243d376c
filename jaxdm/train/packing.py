"""Packed SFT batches: one forward per shared context trains every question asked about it.

Host side (``encode_item`` / ``pack_items``): each training item (a ``MultipleChoice`` or
``YesNo`` plus its acceptable options and optional teacher probabilities) is tokenised into
the *same* ``shared_prefix.Request``\\ s the inference backends score, so what is trained is
what ``LocalReadout`` / ``LocalLikelihood`` later read:

- ``"readout"``: one request per question, the chat prompt ending in ``Answer:``; the option
  scores are the label-token logits (A, B, ... or Yes/No) at the answer position;
- ``"likelihood"``: one request per option, the prompt followed by the option's tokens and the
  end-of-turn token; an option's score is the mean log-probability of those tokens
  (``LocalLikelihood(reduction="mean")``). Yes/No items always use readout.

The requests of a batch are grouped by shared prefix and laid out exactly as the scorer's
packed layout (``shared_prefix.plan_groups`` + ``pack_suffixes``): per group one row, the
trunk (the shared context) once, then every request's few suffix tokens. ``SFTBatch`` adds
gather indices from the scorer's output [G, M, K] (flat answer slots) to option scores [Q, O]:

    score[q, o] = Σ_a weight[q, o, a] · logprob[g[q, o], m[q, o, a], k[q, o]]

Device side, ``option_scores`` (pure, jitted, differentiable) runs ``score_packed`` and that
gather; ``batch_loss`` feeds ``jaxdm.train.losses.sft_loss``. With ``full_vocab=True`` a
readout label's score is its full-vocabulary log-prob; the loss renormalises over the
options, which equals the constrained readout's restricted softmax.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm import roles
from jaxdm.decision import shared_prefix
from jaxdm.decision.local import LocalLikelihood, encode_messages, single_token_id
from jaxdm.decision.render import likelihood_replies
from jaxdm.decision.types import MultipleChoice, YesNo
from jaxdm.models.config import ModelConfig
from jaxdm.models.tokenizer import text_ids
from jaxdm.train import losses

MODES = ("readout", "likelihood")


@dataclasses.dataclass(frozen=True)
class SFTItem:
    """One training question: the question, its acceptable option indices, optional teacher
    probabilities over its options, and where it came from (``file:line`` for messages).
    A ``YesNo`` has options (Yes, No): answer (0,) = yes, (1,) = no.

    ``target``: a graded label, the target distribution itself (e.g. a value model's
    (V, 1 - V) from a Monte-Carlo return); it replaces the answer-and-teacher target, so an
    item has a teacher or a target, never both. ``answer`` still names the most likely
    option(s) for the accuracy metric.

    ``weight``: the question's weight in the batch loss (a finite number > 0; default 1), e.g.
    class-balancing weights for a judge whose labels are mostly one kind."""

    question: MultipleChoice | YesNo
    answer: tuple[int, ...]
    teacher: tuple[float, ...] | None = None
    source: str = "?"
    target: tuple[float, ...] | None = None
    weight: float = 1.0

    @property
    def n_options(self) -> int:
        """The question's option count: 2 for a YesNo, else its options."""
        return 2 if isinstance(self.question, YesNo) else len(self.question.options)

    def __post_init__(self):
        if not isinstance(self.question, (MultipleChoice, YesNo)):
            raise TypeError(f"{self.source}: question is {type(self.question).__name__}, "
                            "expected MultipleChoice or YesNo")
        n = self.n_options
        if not self.answer:
            raise ValueError(f"{self.source}: no acceptable option (answer is empty)")
        bad = [a for a in self.answer if not (isinstance(a, int) and 0 <= a < n)]
        if bad:
            raise ValueError(f"{self.source}: answer indices {bad} outside the {n} options")
        if self.teacher is not None:
            t = np.asarray(self.teacher, float)
            if t.shape != (n,) or not np.all(np.isfinite(t)) or np.any(t < 0) or t.sum() <= 0:
                raise ValueError(f"{self.source}: teacher probabilities must be {n} finite, "
                                 f"non-negative numbers with a positive sum, got {self.teacher}")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                or w <= 0:
            raise ValueError(f"{self.source}: a question's weight must be a finite number > 0, "
                             f"got {w!r}")
        if self.target is not None:
            t = np.asarray(self.target, float)
            if t.shape != (n,) or not np.all(np.isfinite(t)) or np.any(t < 0) or \
                    abs(t.sum() - 1.0) > 1e-6:
                raise ValueError(f"{self.source}: a target must be {n} finite, non-negative "
                                 f"numbers summing to 1, got {self.target}")
            if self.teacher is not None:
                raise ValueError(f"{self.source}: a graded target and teacher probabilities "
                                 "on one question; give one")


class IndistinctOptions(ValueError):
    """Options of one question that tokenise to the same ids (the model cannot tell them
    apart); ``problems`` lists (source, option indices, option texts)."""

    def __init__(self, problems: list[tuple[str, tuple[int, ...], tuple[str, ...]]]):
        self.problems = problems
        lines = [f"{src}: options {list(idx)} tokenise identically: {list(txt)}"
                 for src, idx, txt in problems[:10]]
        more = f"\n... and {len(problems) - 10} more" if len(problems) > 10 else ""
        super().__init__(f"{len(problems)} question(s) have options that do not tokenise "
                         "distinctly:\n" + "\n".join(lines) + more)


class SFTBatch(NamedTuple):
    """A packed batch of Q questions (numpy or jax arrays).

    scoring   the scorer's ``PackedScoringBatch`` (G rows of trunk + packed suffixes) or
              ``ScoringBatch`` (rows layout: trunk + N suffix rows per group)
    group, slot [Q, O] int32       where option o of question q is read: group g, candidate k
    answer_slot [Q, O, A] int32    the flat answer slots m it reads (``PackedBatch.slots``)
    weight    [Q, O, A] float32    answer-slot weights (readout: 1 at slot 0; likelihood:
                                   1/len over the option's tokens; 0 = unused)
    option_mask [Q, O] bool; answer_mask [Q, O] bool; targets [Q, O] float32 (mixed target)
    question_weight [Q] float32    each question's loss weight (``SFTItem.weight``; 0 = padding)
    """

    scoring: Any
    group: Any
    answer_slot: Any
    slot: Any
    weight: Any
    option_mask: Any
    answer_mask: Any
    targets: Any
    question_weight: Any


@dataclasses.dataclass
class Encoder:
    """Turns items into scorer requests with the backends' own prompt rendering.

    ``pretrained`` needs ``.tokenizer`` (and ``.params``/``.config`` for the likelihood
    helper, which only tokenises here)."""

    pretrained: Any
    mode: str = "likelihood"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        tok = self.pretrained.tokenizer
        if tok is None:
            raise ValueError("the model has no tokenizer; load it with its tokenizer")
        self.tokenizer = tok
        self.label_ids = tuple(single_token_id(tok, lab) for lab in roles.LABELS)
        self.yes_no = tuple(single_token_id(tok, lab) for lab in roles.YES_NO)
        self._likelihood = LocalLikelihood(self.pretrained) if self.mode == "likelihood" else None
        pad = getattr(self.pretrained.config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0

    def requests(self, item: SFTItem) -> tuple[list[shared_prefix.Request], str]:
        """The item's requests and how its options are read ("readout" or "likelihood")."""
        q = item.question
        if isinstance(q, YesNo) or self.mode == "readout":
            n = item.n_options
            labels = self.yes_no if isinstance(q, YesNo) else self.label_ids
            if n > len(labels):
                raise ValueError(f"{item.source}: {n} options, more than the {len(labels)} "
                                 "single-token labels of readout; use mode 'likelihood'")
            toks = encode_messages(self.tokenizer, roles.render_messages(q, "constrained"))
            return [shared_prefix.Request(tuple(toks), (len(toks) - 1,), (labels[:n],))], \
                "readout"
        return self._likelihood.option_requests(q, item.source), "likelihood"

    def check_distinct(self, items: Sequence[SFTItem]) -> list[tuple[str, tuple[int, ...],
                                                                      tuple[str, ...]]]:
        """Questions whose options tokenise identically (readout: identical option texts
        would get different labels but carry no distinguishing content)."""
        problems = []
        for it in items:
            q = it.question
            if isinstance(q, YesNo):
                continue
            seen: dict[tuple[int, ...], list[int]] = {}
            # Likelihood scores each option's reply (its name when the question has names).
            texts = likelihood_replies(q) if self.mode == "likelihood" else q.options
            for j, opt in enumerate(texts):
                ids = tuple(text_ids(self.tokenizer, opt))
                seen.setdefault(ids, []).append(j)
            for idx in seen.values():
                if len(idx) > 1:
                    problems.append((it.source, tuple(idx), tuple(texts[j] for j in idx)))
        return problems


def pack_items(encoder: Encoder, items: Sequence[SFTItem], *, q_bucket: int = 1,
               min_shared_frac: float = 0.5, alpha: float = losses.ALPHA,
               layout: str = "packed", min_trunk: int = 64, o_bucket: int = 1
               ) -> tuple[SFTBatch, int, bool, dict[str, int]]:
    """Packs items into one ``SFTBatch``. Returns (batch, window, full_vocab, stats) where
    window and full_vocab are the static arguments of ``option_scores``; stats counts tokens
    run ("unique_tokens") and tokens a one-sequence-per-request trainer would run.
    q_bucket (questions) and min_trunk (context tokens) are padding floors: batches of
    varied sizes then share a few shapes, so a training run compiles its step a few times
    instead of once per batch size (padded questions carry no loss). o_bucket: option slots in
    multiples of it (masked past each question's options; train-dm: 8, so the 117 DECISION
    GYM training contexts' 7 option counts, 2 .. 69, become 4: 36 -> 29 distinct programs).

    layout (``shared_prefix.LAYOUTS``): "packed" (trunk + packed suffixes in one row per
    group) or "rows" (trunk prefilled into a KV cache, suffixes as padded rows over it; window
    is then 0). Both give the same loss and gradients. For training, "packed" runs fewer
    tokens (the rows layout pads every suffix to the group's longest, here a parameter
    question's whole text) and its attention backward (``decoder.segment_attention_vjp``)
    holds one query block's probabilities at a time. Full-depth SmolLM2-135M step on the
    69-option DECISION GYM state (AMD EPYC, 2 cores, fp32, remat on): rows 117.7 s, 5.18 GiB
    peak RSS; packed 30.2 s, 3.18 GiB (benchmarks/RESULTS.md). ``ModelConfig.remat``
    (train-dm's default) rematerialises each layer in the backward pass so only one layer's
    residuals are alive."""
    if not items:
        raise ValueError("pack_items: no items")
    reqs: list[shared_prefix.Request] = []
    owners: list[tuple[int, int, str]] = []          # (question, option or -1, how)
    for qi, it in enumerate(items):
        rs, how = encoder.requests(it)
        for j, r in enumerate(rs):
            reqs.append(r)
            owners.append((qi, j if how == "likelihood" else -1, how))
    if layout not in shared_prefix.LAYOUTS:
        raise ValueError(f"layout must be one of {shared_prefix.LAYOUTS}, got {layout!r}")
    # max_group: every option of a question in one group (its prompt runs once; see
    # LocalLikelihood.choose), also for DECISION GYM's 69-option tool question.
    groups = shared_prefix.plan_groups(reqs, min_shared_frac=min_shared_frac, layout=layout,
                                       max_group=max(64, max(it.n_options for it in items)))
    if layout == "packed":
        packed, window = shared_prefix.pack_suffixes(reqs, groups, pad_id=encoder.pad_id,
                                                     min_trunk=min_trunk)
    else:
        packed, window = shared_prefix.pack_groups(reqs, groups, pad_id=encoder.pad_id,
                                                   min_trunk=min_trunk), 0
    a = shared_prefix.bucket(max(len(r.answer_positions) for r in reqs), 1)
    q = shared_prefix.bucket(len(items), 1, fine=q_bucket) if q_bucket > 1 else len(items)
    o = max(it.n_options for it in items)
    o = shared_prefix.bucket(o, 1, fine=o_bucket, fine_limit=256) if o_bucket > 1 else o
    group = np.zeros((q, o), np.int32)
    answer_slot = np.zeros((q, o, a), np.int32)
    slot = np.zeros((q, o), np.int32)
    weight = np.zeros((q, o, a), np.float32)
    option_mask = np.zeros((q, o), bool)
    answer_mask = np.zeros((q, o), bool)
    teacher = np.zeros((q, o), np.float32)
    has_teacher = np.zeros((q,), bool)
    question_weight = np.zeros((q,), np.float32)
    full_vocab = False
    for rid, (qi, j, how) in enumerate(owners):
        gi, m0 = packed.slots[rid]
        if how == "readout":
            n = items[qi].n_options
            group[qi, :n], answer_slot[qi, :n, 0], slot[qi, :n] = gi, m0, np.arange(n)
            weight[qi, :n, 0] = 1.0
        else:
            full_vocab = True
            k = len(reqs[rid].answer_positions)
            group[qi, j], slot[qi, j] = gi, 0
            answer_slot[qi, j, :k] = np.arange(m0, m0 + k)
            weight[qi, j, :k] = 1.0 / k
    for qi, it in enumerate(items):
        option_mask[qi, :it.n_options] = True
        answer_mask[qi, list(it.answer)] = True
        question_weight[qi] = it.weight
        if it.teacher is not None:
            teacher[qi, :it.n_options] = it.teacher
            has_teacher[qi] = True
    targets = np.array(losses.mixed_target(jnp.asarray(answer_mask), jnp.asarray(option_mask),
                                             jnp.asarray(teacher), jnp.asarray(has_teacher),
                                             alpha=alpha))
    for qi, it in enumerate(items):
        if it.target is not None:
            targets[qi] = 0.0
            targets[qi, :it.n_options] = it.target
    batch = SFTBatch(packed.batch, group, answer_slot, slot, weight, option_mask, answer_mask,
                     targets, question_weight)
    stats = {"unique_tokens": packed.unique_tokens,
             "request_tokens": sum(len(r.tokens) for r in reqs),
             "questions": len(items), "requests": len(reqs), "groups": len(groups)}
    return batch, window, full_vocab, stats


def gather_option_scores(logprobs: jax.Array, batch: SFTBatch) -> jax.Array:
    """Scorer output [G, M, K] -> option scores [Q, O] (see module docstring)."""
    per = logprobs[batch.group[..., None], batch.answer_slot, batch.slot[..., None]]  # [Q,O,A]
    return jnp.sum(jnp.where(batch.weight > 0, per * batch.weight, 0.0), axis=-1)


@functools.partial(jax.jit, static_argnames=("config", "window", "full_vocab"))
def option_scores(params, config: ModelConfig, batch: SFTBatch, *, window: int,
                  full_vocab: bool) -> jax.Array:
    """Option scores [Q, O] of a packed batch; pure and differentiable in params. ``window``
    is ignored for the rows layout (a ``ScoringBatch``)."""
    if isinstance(batch.scoring, shared_prefix.ScoringBatch):
        lp = shared_prefix.score_batch(params, config, batch.scoring, full_vocab=full_vocab)
    else:
        lp = shared_prefix.score_packed(params, config, batch.scoring, window=window,
                                        full_vocab=full_vocab)
    return gather_option_scores(lp, batch)


def batch_loss(params, config: ModelConfig, batch: SFTBatch, *, window: int, full_vocab: bool,
               mu: float = losses.MU) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(scalar SFT loss, the questions' weighted mean; metrics, unweighted sums) of a packed
    batch."""
    scores = option_scores(params, config, batch, window=window, full_vocab=full_vocab)
    loss = losses.sft_loss(scores, batch.targets, batch.option_mask, mu=mu,
                           question_weight=batch.question_weight)
    return loss, losses.sft_metrics(scores, batch.targets, batch.option_mask,
                                    batch.answer_mask, mu=mu)
