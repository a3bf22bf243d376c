"""Host-side text for the RL policy: tokenizers, policy prompts and action parsing.

- ``TextTokenizer`` is the small protocol the rollout engine needs (encode, decode, vocab
  size, pad/eos ids). ``WordTokenizer`` is a closed-vocabulary word-level tokenizer for tiny
  CPU policies on toy tasks (short sequences, exact decode); ``HFTokenizer`` adapts a
  transformers / tokenizers tokenizer (Qwen, SmolLM2) for the real presets.
- ``policy_prompt`` renders the verl-agent-style generative prompt (goal, number of steps
  taken, the last ``history`` observation/action pairs, current observation, admissible
  actions; reasoning in <think>…</think>, action in <action>…</action>);
  ``fit_prompt`` drops history entries from the oldest until the prompt fits the token limit.
- ``option_context`` is the shorter context of the option-scoring policy (the options are
  scored as continuations, so they are not listed).
- ``parse_action`` extracts the action; an output without both tag pairs is invalid.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Protocol, Sequence

from jaxdm.models.tokenizer import text_ids

__all__ = ["TextTokenizer", "WordTokenizer", "HFTokenizer", "policy_prompt", "fit_prompt",
           "option_context", "parse_action", "INVALID_COMMAND", "PROMPT_VERSION"]

PROMPT_VERSION = "rl-policy-v1"
# What the environment receives for an unparsable output: never an admissible command.
INVALID_COMMAND = "<invalid output>"


class TextTokenizer(Protocol):
    """What the text policy needs of a tokenizer: vocab_size, pad_id and eos_id, and encode / decode
    (WordTokenizer, HFTokenizer)."""
    vocab_size: int
    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (no special tokens added)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens skipped."""


_WORD_RE = re.compile(r"</?[a-z]+>|[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]")


class WordTokenizer:
    """Closed-vocabulary word tokenizer: words (lower-cased), digits, punctuation, tags.

    ``WordTokenizer.from_texts(texts)`` collects the vocabulary; unknown words map to
    ``<unk>``. Decoding joins words with spaces (punctuation attached), which is enough to
    round-trip commands and tags.
    """

    SPECIALS = ("<pad>", "<eos>", "<unk>", "<bos>")

    def __init__(self, words: Iterable[str]):
        vocab = list(self.SPECIALS)
        seen = set(vocab)
        for w in words:
            if w not in seen:
                seen.add(w)
                vocab.append(w)
        self.vocab = tuple(vocab)
        self._index = {w: i for i, w in enumerate(self.vocab)}
        self.pad_id, self.eos_id, self.unk_id, self.bos_id = 0, 1, 2, 3
        self.vocab_size = len(self.vocab)

    @staticmethod
    def split(text: str) -> list[str]:
        """The lower-cased words and punctuation marks of ``text``, in order (the tokenizer's
        units)."""
        return [t.lower() for t in _WORD_RE.findall(text)]

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "WordTokenizer":
        """A WordTokenizer whose vocabulary is every word split() finds in ``texts`` (sorted, after
        the special tokens)."""
        words = sorted({w for t in texts for w in cls.split(t)})
        return cls(words)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s words (unk_id for a word outside the vocabulary); no special tokens
        added."""
        return [self._index.get(w, self.unk_id) for w in self.split(text)]

    @property
    def eos_token_id(self) -> int:
        """HF-style alias (``jaxdm.models.generate`` reads it)."""
        return self.eos_id

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``, special tokens skipped, punctuation and tags joined to the word
        before; an id outside the vocabulary is a ValueError."""
        del skip_special_tokens  # specials are always skipped
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} outside the vocabulary of {self.vocab_size}")
            if i in (self.pad_id, self.eos_id, self.bos_id):
                continue
            w = self.vocab[i]
            if out and (re.fullmatch(r"[^\sA-Za-z0-9<]", w) or out[-1].endswith(">")
                        or re.fullmatch(r"</[a-z]+>", w)):
                out[-1] += w
            else:
                out.append(w)
        return " ".join(out)


class HFTokenizer:
    """Adapter: a transformers tokenizer (or ``tokenizers.Tokenizer``) as a TextTokenizer."""

    def __init__(self, tokenizer: Any, *, eos_id: int | None = None, pad_id: int | None = None):
        self.tok = tokenizer
        vocab = getattr(tokenizer, "vocab_size", None)
        if callable(getattr(tokenizer, "get_vocab_size", None)):
            vocab = tokenizer.get_vocab_size()
        if not isinstance(vocab, int):
            raise TypeError(f"tokenizer {type(tokenizer).__name__} has no integer vocab size")
        self.vocab_size = max(vocab, len(tokenizer) if hasattr(tokenizer, "__len__") else 0)
        eos = eos_id if eos_id is not None else getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ValueError("HFTokenizer: the tokenizer has no eos id; pass eos_id=")
        self.eos_id = int(eos)
        pad = pad_id if pad_id is not None else getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(self.eos_id if pad is None else pad)

    @property
    def eos_token_id(self) -> int:
        """The end-of-sequence id (transformers' attribute name, for code written against it)."""
        return self.eos_id

    def encode(self, text: str) -> list[int]:
        # Observations and goals are untrusted: their special-token strings stay text.
        """The ids of ``text`` with its special-token strings kept as plain text (observations and
        goals are untrusted)."""
        return text_ids(self.tok, text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (special tokens skipped unless skip_special_tokens is False)."""
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def _history_block(history: Sequence[tuple[str, str]], start_index: int) -> str:
    lines = []
    for k, (obs, act) in enumerate(history):
        n = start_index + k + 1
        lines.append(f"[Observation {n}: '{obs}', Action {n}: '{act}']")
    return "\n".join(lines)


def policy_prompt(goal: str, observation: str, admissible: Sequence[str],
                  history: Sequence[tuple[str, str]], steps_taken: int) -> str:
    """The generative policy's prompt (verl-agent structure, our wording).

    ``history`` holds the (observation, action) pairs to show, oldest first, and
    ``steps_taken`` the number of actions executed so far (history may be shorter).
    """
    actions = ", ".join(f"'{a}'" for a in admissible)
    parts = [f"You are an agent acting in a text environment. Your task: {goal}"]
    if steps_taken == 0:
        parts.append("You have not taken any action yet.")
    else:
        parts.append(f"You have already taken {steps_taken} action(s).")
        if history:
            parts.append(f"Your last {len(history)} observation(s) and the action taken after "
                         f"each:\n{_history_block(history, steps_taken - len(history))}")
    parts.append(f"This is step {steps_taken + 1}. Current observation: {observation}")
    parts.append(f"Admissible actions now: [{actions}].")
    parts.append("Think step by step about the situation inside <think> </think>, then give "
                 "exactly one admissible action inside <action> </action>.")
    return "\n".join(parts)


def fit_prompt(tokenizer: TextTokenizer, goal: str, observation: str,
               admissible: Sequence[str], history: Sequence[tuple[str, str]],
               steps_taken: int, max_tokens: int) -> tuple[list[int], int]:
    """Tokenised prompt with history dropped oldest-first until it fits ``max_tokens``.

    Returns (token ids, number of history entries dropped). When even the prompt without
    history is too long, its tokens are cut from the left (the most recent text is kept)
    and the drop count is ``len(history) + 1`` so callers can count truncations.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    for drop in range(len(history) + 1):
        ids = tokenizer.encode(policy_prompt(goal, observation, admissible, history[drop:],
                                             steps_taken))
        if len(ids) <= max_tokens:
            return ids, drop
    return ids[-max_tokens:], len(history) + 1


def option_context(goal: str, observation: str, history: Sequence[tuple[str, str]],
                   steps_taken: int, budget: int | None = None) -> str:
    """Context of the option-scoring policy; each admissible action is scored after it."""
    lines = [f"goal: {goal}"]
    for obs, act in history:
        lines.append(f"observation: {obs} action: {act}")
    lines.append(f"step {steps_taken + 1}" + (f" of {budget}" if budget else "") + ".")
    lines.append(f"observation: {observation} action:")
    return "\n".join(lines)


_THINK = re.compile(r"<think>(.*?)</think>", re.S | re.I)
_ACTION = re.compile(r"<action>(.*?)</action>", re.S | re.I)


def parse_action(text: str) -> tuple[str | None, bool]:
    """(action, valid): the text inside the last <action>…</action>, valid only when the
    output also has a <think>…</think> block and the action is non-empty."""
    if not isinstance(text, str):
        raise TypeError(f"policy output must be a string, got {type(text).__name__}")
    actions = _ACTION.findall(text)
    if not actions or not _THINK.search(text):
        return None, False
    action = " ".join(actions[-1].split())
    if not action:
        return None, False
    return action, True
