"""Prompted: a local jaxdm model writes a JSON answer, which is parsed and validated.

The system prompt (``jaxdm.decision.render.SYSTEM_PROMPTS[(kind, "prompted")]``) asks for
``{"choice": "B", "probabilities": {...}}`` or ``{"score": 0.7}``. Generation is greedy by
default (``jaxdm.models.generate``, batched, stopping at the end-of-turn token). Output that
does not parse or validate is returned as a failed result with the raw text and counted in
``stats["parse_failures"]``; it is never turned into a number.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from tqdm.auto import tqdm

from jaxdm.decision import render
from jaxdm.decision.local import encode_messages
from jaxdm.decision.parsing import parse_choice, parse_score
from jaxdm.decision.types import ChoiceResult, Cost, MultipleChoice, ScoreResult, YesNo
from jaxdm.models import generate


class Prompted:
    """JSON-answer decision model on a local jaxdm model (see module docstring)."""

    def __init__(self, pretrained: Any, *, max_new_tokens: int = 96, batch_size: int = 8,
                 progress: bool = False, name: str | None = None, generate_fn: Any = None):
        for attr in ("params", "config", "tokenizer"):
            if not hasattr(pretrained, attr):
                raise TypeError(f"pretrained must have .params, .config and .tokenizer; "
                                f"missing .{attr}")
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")
        self.pretrained = pretrained
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.progress = progress
        # generate_fn(prompts: list[list[int]]) -> list[str]; default: greedy jaxdm decoding.
        self._generate_fn = generate_fn or self._generate
        path = getattr(pretrained, "path", None)
        self.name = name or f"prompted({getattr(path, 'name', None) or 'local'})"
        self.stats = {"requests": 0, "parse_failures": 0}

    def _generate(self, prompts: list[list[int]]) -> list[str]:
        out = generate(self.pretrained.params, self.pretrained.config,
                       self.pretrained.tokenizer, prompts, max_new_tokens=self.max_new_tokens,
                       greedy=True)
        if out.texts is not None:
            return list(out.texts)
        return [self.pretrained.tokenizer.decode(t, skip_special_tokens=True)
                for t in out.tokens]

    def _answer(self, questions: Sequence, kind: type, parse) -> list:
        for i, q in enumerate(questions):
            if not isinstance(q, kind):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected {kind.__name__}")
        prompts = [encode_messages(self.pretrained.tokenizer,
                                   render.render_messages(q, "prompted")) for q in questions]
        limit = self.pretrained.config.max_position_embeddings
        for i, p in enumerate(prompts):
            if len(p) + self.max_new_tokens > limit:
                raise ValueError(f"questions[{i}] is {len(p)} tokens; with max_new_tokens="
                                 f"{self.max_new_tokens} it exceeds the model's context ({limit})")
        results: list = []
        starts = range(0, len(questions), self.batch_size)
        if self.progress:
            starts = tqdm(starts, desc=self.name, unit="batch")
        for s in starts:
            chunk = prompts[s:s + self.batch_size]
            t0 = time.perf_counter()
            texts = self._generate_fn(chunk)
            per = (time.perf_counter() - t0) / len(chunk)
            tok = self.pretrained.tokenizer
            for q, p, text in zip(questions[s:s + self.batch_size], chunk, texts):
                n_out = len(tok(text, add_special_tokens=False)["input_ids"])
                cost = Cost(tokens_in=len(p), tokens_out=n_out, seconds=per)
                res = parse(q, text, cost)
                self.stats["requests"] += 1
                if not res.ok:
                    self.stats["parse_failures"] += 1
                results.append(res)
        return results

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """Answer each MultipleChoice by generating a JSON reply (render.render_messages 'prompted')
        and parsing it with parse_choice; a reply that does not parse is a failed result, too many
        options or a prompt past the context a ValueError."""
        for i, q in enumerate(questions):
            if isinstance(q, MultipleChoice):
                render.labels_for(len(q.options))
        return self._answer(questions, MultipleChoice, lambda q, text, cost: parse_choice(
            text, render.labels_for(len(q.options)), cost))

    def score(self, questions: Sequence[YesNo]) -> list[ScoreResult]:
        """Answer each YesNo by generating a JSON reply and parsing it with parse_score; a reply
        that does not parse is a failed result."""
        return self._answer(questions, YesNo, lambda q, text, cost: parse_score(text, cost))
