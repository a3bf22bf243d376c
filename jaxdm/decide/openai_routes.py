"""The serving engines' routes on `jaxdm decide`: OpenAI-compatible ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/models`` (as vLLM serves them) and SGLang's ``/v1/score``.

What a decision service needs of them, on a local model backend (``LocalReadout`` /
``LocalLikelihood``; other backends answer 501):

- ``/v1/completions``: ``prompt`` a string, token ids, or a list of either (one choice each);
  ``max_tokens`` 0 or 1 (default 1: this server scores, it does not generate; the one token is
  the most likely, so ``temperature`` must be 0 or absent), ``logprobs`` k (0 to
  ``max_logprobs``) for the top-k next tokens, ``echo`` for the prompt's own token log-probs
  (``token_logprobs``, None for the first token, and the top k at each prompt position): what
  option likelihood over the network reads. A text prompt is tokenised as vLLM does
  (special-token strings in it become special tokens: the caller wrote the template); send
  token ids to keep untrusted text inert (``jaxdm.decision.remote.Remote`` with a tokenizer
  does).
- ``/v1/chat/completions``: ``messages`` (string or text-part contents) under the model's chat
  template, a special-token string inside a message staying text
  (``jaxdm.models.tokenizer.chat_ids``); ``max_tokens`` / ``max_completion_tokens`` 1,
  ``logprobs`` true with ``top_logprobs`` k: the first assistant token's distribution, which is
  what constrained readout reads.
- ``/v1/score`` (SGLang): ``query`` and ``items`` (text, or token ids), ``label_token_ids``,
  ``apply_softmax`` (over the labels; else each label's probability under the full
  vocabulary), ``item_first``; answers ``{"scores": [[p per label] per item], "model",
  "usage", "object": "scoring"}``. All items of a request run in one shared-prefix pass (the
  query is their common trunk).

Errors have the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``; an unknown
field is an error naming it (nothing is silently ignored), except the sampling fields a
client sends by default (``n`` 1, ``stream`` false, ``top_p`` 1, penalties 0, ``seed``,
``user``, ``stop``).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Callable

import numpy as np

from jaxdm.decide.protocol import Limits


class OpenAIError(Exception):
    """An OpenAI-shaped error answer: HTTP ``status``, ``type``, ``param`` (the field), ``code``."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param = message, status, type, param
        self.code = code

    def to_json(self) -> dict:
        """The error as OpenAI's API writes it: {"error": {message, type, param, code}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# Fields every OpenAI client may send; accepted when they ask for what this server does.
_NEUTRAL = {"n": 1, "stream": False, "top_p": 1.0, "frequency_penalty": 0.0,
            "presence_penalty": 0.0}
_FREE = ("seed", "user", "stop", "model")
_COMPLETION_KEYS = {"prompt", "max_tokens", "logprobs", "echo", "temperature"}
_CHAT_KEYS = {"messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs",
              "temperature"}
_SCORE_KEYS = {"query", "items", "label_token_ids", "apply_softmax", "item_first", "model"}


def _check_keys(body: Any, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise OpenAIError(f"the body must be a JSON object, got {type(body).__name__}")
    for key, value in body.items():
        if key in allowed or key in _FREE:
            continue
        if key in _NEUTRAL:
            if value is not None and value != _NEUTRAL[key]:
                raise OpenAIError(f"{key}={value!r} is not supported (only {_NEUTRAL[key]!r}): "
                                  "this server scores one token", param=key)
            continue
        raise OpenAIError(f"unknown or unsupported field {key!r}", param=key)
    return body


def _int_field(body: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OpenAIError(f"{key} must be an integer in [{low}, {high}], got {value!r}",
                          param=key)
    return value


def _bool_field(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OpenAIError(f"{key} must be true or false, got {value!r}", param=key)
    return value


def _check_temperature(body: dict) -> None:
    t = body.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t != 0):
        raise OpenAIError(f"temperature={t!r}: this server returns the most likely token only "
                          "(temperature 0 or absent)", param="temperature")


class Routes:
    """The engines' routes over one local backend; ``run(fn)`` executes ``fn`` on the
    backend's worker thread (``MicroBatcher.run``) and returns its result."""

    def __init__(self, backend: Any, model: str, run: Callable[[Callable[[], Any]], Any], *,
                 limits: Limits = Limits(), max_logprobs: int = 20):
        self.backend = backend
        self.model = model
        self.run = run
        self.limits = limits
        self.max_logprobs = int(max_logprobs)
        self.tokenizer = getattr(backend, "tokenizer", None)

    # ---- shared ---------------------------------------------------------------------------
    def _local(self) -> None:
        if not hasattr(self.backend, "prompt_logprobs") or self.tokenizer is None:
            name = getattr(self.backend, "name", type(self.backend).__name__)
            raise OpenAIError(f"backend {name} has no next-token distribution: serve a local "
                              "model (--backend smollm2, a model folder, local_readout:...)",
                              status=501, code="unsupported_backend")

    def _check_model(self, body: dict) -> None:
        name = body.get("model")
        if name is not None and name != self.model:
            raise OpenAIError(f"the model `{name}` does not exist (this server serves "
                              f"`{self.model}`)", status=404, type="not_found_error",
                              param="model", code="model_not_found")

    def _token(self, tid: int) -> str:
        return self.tokenizer.decode([int(tid)])

    def _ids_of(self, value: Any, where: str) -> list[int]:
        if isinstance(value, str):
            if not value:
                raise OpenAIError(f"{where} is empty", param=where)
            return list(self.tokenizer(value)["input_ids"])
        if isinstance(value, list) and value and all(
                isinstance(t, int) and not isinstance(t, bool) for t in value):
            return list(value)
        raise OpenAIError(f"{where} must be a non-empty string or list of token ids",
                          param=where)

    def _limit_tokens(self, ids: list[int], where: str) -> None:
        limit = self.limits.max_context_tokens
        if limit is not None and len(ids) > limit:
            raise OpenAIError(f"{where} has {len(ids)} tokens, more than the server's limit of "
                              f"{limit} (--max-context-tokens)", param=where,
                              code="context_length_exceeded")

    def _compute(self, fn: Callable[[], Any]) -> Any:
        try:
            return self.run(fn)
        except ValueError as e:     # the backend refused the input (too long, bad ids)
            raise OpenAIError(str(e), code="invalid_input") from None

    def _completion_token(self, max_tokens: int, res: Any) -> list[int]:
        return [int(res.top_ids[-1, 0])] if max_tokens == 1 else []

    # ---- /v1/models -------------------------------------------------------------------------
    def models(self) -> dict:
        """GET /v1/models: a list holding the one served model's card (its id, and max_model_len
        where the backend has a model config)."""
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "jaxdm"}
        config = getattr(self.backend, "config", None)
        if config is not None:
            card["max_model_len"] = int(config.max_position_embeddings)
        return {"object": "list", "data": [card]}

    # ---- /v1/completions ----------------------------------------------------------------------
    def completions(self, body: Any) -> dict:
        """POST /v1/completions on the local model: one greedy step (max_tokens 0 or 1, temperature
        0) per prompt (text or token ids, one or a list), with the top-``logprobs`` alternatives of
        each generated token and, with echo, of every prompt token; the OpenAI completion object
        with its usage. Bad fields are OpenAIErrors naming the parameter."""
        body = _check_keys(body, _COMPLETION_KEYS)
        self._check_model(body)
        self._local()
        _check_temperature(body)
        max_tokens = _int_field(body, "max_tokens", 1, 0, 1)
        k = _int_field(body, "logprobs", None, 0, self.max_logprobs)
        echo = _bool_field(body, "echo", False)
        if max_tokens == 0 and not echo:
            raise OpenAIError("max_tokens=0 needs echo=true (nothing to return otherwise)",
                              param="max_tokens")
        if "prompt" not in body:
            raise OpenAIError("prompt is missing", param="prompt")
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list))
                                                       for p in prompt):
            prompts = [self._ids_of(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        else:
            prompts = [self._ids_of(prompt, "prompt")]
        if len(prompts) > self.limits.max_questions:
            raise OpenAIError(f"{len(prompts)} prompts, more than the server's limit of "
                              f"{self.limits.max_questions} (--max-questions)", param="prompt")
        for i, ids in enumerate(prompts):
            self._limit_tokens(ids, f"prompt[{i}]" if len(prompts) > 1 else "prompt")
        top_k = max(k or 0, 1)
        results = self._compute(lambda: [self.backend.prompt_logprobs(
            ids, top_k=top_k, echo=echo) for ids in prompts])
        choices, n_prompt, n_out = [], 0, 0
        for i, (ids, res) in enumerate(zip(prompts, results)):
            out_ids = self._completion_token(max_tokens, res)
            n_prompt += len(ids)
            n_out += len(out_ids)
            text = self.tokenizer.decode(out_ids) if out_ids else ""
            if echo:
                text = self.tokenizer.decode(ids) + text
            choices.append({"index": i, "text": text, "finish_reason": "length",
                            "logprobs": None if k is None else
                            self._completion_logprobs(ids, out_ids, res, k, echo)})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.model, "choices": choices,
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                          "total_tokens": n_prompt + n_out}}

    def _top(self, res: Any, row: int, k: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for tid, lp in zip(res.top_ids[row, :k], res.top_logprobs[row, :k]):
            out.setdefault(self._token(tid), float(lp))
        return out

    def _completion_logprobs(self, ids: list[int], out_ids: list[int], res: Any, k: int,
                             echo: bool) -> dict:
        tokens: list[str] = []
        token_lps: list[float | None] = []
        tops: list[dict | None] = []
        if echo:
            tokens = [self._token(t) for t in ids]
            token_lps = [None] + [float(x) for x in res.token_logprobs[:-1]]
            tops = [None] + [self._top(res, r, k) | {tokens[r + 1]: token_lps[r + 1]}
                             if k else {tokens[r + 1]: token_lps[r + 1]}
                             for r in range(len(ids) - 1)]
        for tid in out_ids:
            tokens.append(self._token(tid))
            token_lps.append(float(res.top_logprobs[-1, 0]))
            tops.append(self._top(res, -1, k) if k else {tokens[-1]: token_lps[-1]})
        offsets, pos = [], 0
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
                "text_offset": offsets}

    # ---- /v1/chat/completions -----------------------------------------------------------------
    def _messages(self, body: dict) -> list[dict]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError("messages must be a non-empty list", param="messages")
        out = []
        for i, m in enumerate(messages):
            where = f"messages[{i}]"
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise OpenAIError(f"{where} must be an object with a string role", param=where)
            extra = sorted(set(m) - {"role", "content", "name"})
            if extra:
                raise OpenAIError(f"{where}.{extra[0]} is not supported", param=where)
            content = m.get("content")
            if isinstance(content, list):
                parts = []
                for j, part in enumerate(content):
                    if not (isinstance(part, dict) and part.get("type") == "text"
                            and isinstance(part.get("text"), str)):
                        raise OpenAIError(f"{where}.content[{j}] must be a text part",
                                          param=f"{where}.content")
                    parts.append(part["text"])
                content = "".join(parts)
            if not isinstance(content, str):
                raise OpenAIError(f"{where}.content must be a string or text parts",
                                  param=f"{where}.content")
            out.append({"role": m["role"], "content": content})
        return out

    def chat(self, body: Any) -> dict:
        """POST /v1/chat/completions on the local model: the messages through the model's chat
        template, one greedy token, and with logprobs its log-probability and the top_logprobs
        alternatives; the OpenAI chat.completion object. A template that refuses the messages or a
        bad field is an OpenAIError."""
        from jaxdm.models.tokenizer import chat_ids  # why: JAX, local model only

        body = _check_keys(body, _CHAT_KEYS)
        self._check_model(body)
        self._local()
        _check_temperature(body)
        for key in ("max_tokens", "max_completion_tokens"):
            _int_field(body, key, 1, 1, 1)
        want = _bool_field(body, "logprobs", False)
        k = _int_field(body, "top_logprobs", None, 0, self.max_logprobs)
        if k is not None and not want:
            raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
        messages = self._messages(body)
        try:
            ids = chat_ids(self.tokenizer, [messages])[0]
        except Exception as e:  # noqa: BLE001 - the template refused these messages
            raise OpenAIError(f"the chat template refused the messages: {e}",
                              param="messages") from None
        self._limit_tokens(ids, "messages")
        res = self._compute(lambda: self.backend.prompt_logprobs(ids, top_k=max(k or 0, 1)))
        tid = int(res.top_ids[0, 0])
        token = self._token(tid)
        logprobs = None
        if want:
            tops = [{"token": self._token(t), "logprob": float(lp),
                     "bytes": list(self._token(t).encode())}
                    for t, lp in zip(res.top_ids[0, :k or 0], res.top_logprobs[0, :k or 0])]
            logprobs = {"content": [{"token": token, "logprob": float(res.top_logprobs[0, 0]),
                                     "bytes": list(token.encode()), "top_logprobs": tops}]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": token},
                             "logprobs": logprobs, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": 1,
                          "total_tokens": len(ids) + 1}}

    # ---- /v1/score (SGLang) -----------------------------------------------------------------
    def score(self, body: Any) -> dict:
        """POST /v1/score as SGLang serves it: for each item joined to the query (query + item, or
        item + query with item_first) the probabilities of the label_token_ids at the next position
        (renormalised over the labels with apply_softmax); {"scores": [[p per label] per item],
        usage}."""
        if not isinstance(body, dict):
            raise OpenAIError(f"the body must be a JSON object, got {type(body).__name__}")
        extra = sorted(set(body) - _SCORE_KEYS)
        if extra:
            raise OpenAIError(f"unknown field {extra[0]!r}", param=extra[0])
        self._check_model(body)
        self._local()
        labels = body.get("label_token_ids")
        vocab = int(self.backend.config.vocab_size)
        if not (isinstance(labels, list) and labels and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                for t in labels)):
            raise OpenAIError(f"label_token_ids must be a non-empty list of token ids in "
                              f"[0, {vocab})", param="label_token_ids")
        softmax = _bool_field(body, "apply_softmax", False)
        item_first = _bool_field(body, "item_first", False)
        query, items = body.get("query"), body.get("items")
        if isinstance(items, str) or (isinstance(items, list) and items
                                      and all(isinstance(t, int) for t in items)):
            items = [items]
        if not isinstance(items, list) or not items:
            raise OpenAIError("items must be a non-empty string, list of strings or list of "
                              "token-id lists", param="items")
        if len(items) > self.limits.max_questions:
            raise OpenAIError(f"{len(items)} items, more than the server's limit of "
                              f"{self.limits.max_questions} (--max-questions)", param="items")
        text = isinstance(query, str)
        if not (text or (isinstance(query, list) and all(isinstance(t, int) for t in query))):
            raise OpenAIError("query must be a string or a list of token ids", param="query")
        prompts = []
        for i, item in enumerate(items):
            if text != isinstance(item, str):
                raise OpenAIError(f"items[{i}]: query and items must both be text or both "
                                  "token ids", param="items")
            joined = (item + query if item_first else query + item) if text else (
                list(item) + list(query) if item_first else list(query) + list(item))
            ids = self._ids_of(joined, f"items[{i}]")
            self._limit_tokens(ids, f"items[{i}]")
            prompts.append(ids)
        rows = self._compute(lambda: self.backend.label_logprobs(prompts, labels,
                                                                 normalize=softmax))
        n = sum(len(p) for p in prompts)
        return {"scores": [[float(x) for x in np.exp(r)] for r in rows], "model": self.model,
                "usage": {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n},
                "object": "scoring"}
