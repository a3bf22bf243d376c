"""Free-text generation for LVRL's prompted value model and LLM summariser.

The decision backends answer typed questions (a choice, a score); LVRL's paper-style value
query returns a *list* of values per trajectory and its summariser a list of strings, so
these two need free text. A ``TextGenerator`` takes a batch of chat message lists and returns
one ``Generation`` each (text or failure, with its cost), never raising for a bad reply:

- ``HttpChatGenerator``: an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang,
  hosted APIs) through httpx: timeout, retries with backoff on timeouts / connection errors /
  429 / 5xx, token usage and price accounting, the API key read from an environment variable
  at each request (never stored);
- ``LocalGenerator``: greedy decoding on a local jaxdm model (``jaxdm.models.generate``).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Any, Protocol, Sequence

import httpx

from jaxdm.decision.local import encode_messages
from jaxdm.decision.types import Cost
from jaxdm.models import generate

__all__ = ["Generation", "TextGenerator", "HttpChatGenerator", "LocalGenerator"]

_RETRY = {429, 500, 502, 503, 504}


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generated reply: its text (None when it failed), whether it succeeded, the error, and
    what it cost."""
    text: str | None
    ok: bool = True
    error: str | None = None
    cost: Cost = Cost()


class TextGenerator(Protocol):
    """What a list value model generates with: a name and generate(message lists) -> Generations
    (HttpChatGenerator, LocalGenerator)."""
    name: str

    def generate(self, batch: Sequence[list[dict]]) -> list[Generation]:
        """One Generation per chat message list of ``batch``, in order (a failed one, never
        an exception, for a reply that could not be had)."""


class HttpChatGenerator:
    """Chat completions from an OpenAI-compatible endpoint (see module docstring)."""

    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None,
                 max_tokens: int = 2048, timeout: float = 60.0, max_retries: int = 2,
                 backoff: float = 0.5, concurrency: int = 8,
                 price_per_1k_in: float | None = None, price_per_1k_out: float | None = None):
        if api_key_env is not None and api_key_env not in os.environ:
            raise ValueError(f"environment variable {api_key_env!r} (api_key_env) is not set")
        if timeout <= 0 or max_retries < 0 or concurrency < 1 or max_tokens < 1:
            raise ValueError("timeout > 0, max_retries >= 0, concurrency >= 1 and "
                             "max_tokens >= 1 are required")
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.max_tokens = int(max_tokens)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.concurrency = int(concurrency)
        self.price_in, self.price_out = price_per_1k_in, price_per_1k_out
        self.name = f"http_chat({model})"

    def _cost(self, data: dict, seconds: float) -> Cost:
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        usd = None
        if self.price_in is not None or self.price_out is not None:
            usd = tin / 1000 * (self.price_in or 0.0) + tout / 1000 * (self.price_out or 0.0)
        return Cost(tokens_in=tin, tokens_out=tout, usd=usd, seconds=seconds)

    def _one(self, client: httpx.Client, messages: list[dict]) -> Generation:
        t0 = time.perf_counter()
        body = {"model": self.model, "messages": messages, "temperature": 0.0,
                "max_tokens": self.max_tokens}
        headers = {"Content-Type": "application/json"}
        if self.api_key_env is not None:
            headers["Authorization"] = f"Bearer {os.environ.get(self.api_key_env, '')}"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = client.post(self.url, json=body, headers=headers, timeout=self.timeout)
            except httpx.TimeoutException:
                last = f"timeout after {self.timeout:g} s"
                continue
            except httpx.TransportError as e:
                last = f"connection error ({type(e).__name__})"
                continue
            if resp.status_code in _RETRY:
                last = f"HTTP {resp.status_code}"
                continue
            seconds = time.perf_counter() - t0
            if resp.status_code != 200:
                return Generation(None, False, f"HTTP {resp.status_code}", Cost(seconds=seconds))
            try:
                data = resp.json()
                text = data["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                return Generation(None, False, f"malformed response ({type(e).__name__})",
                                  Cost(seconds=seconds))
            if not isinstance(text, str):
                return Generation(None, False, "response content is not a string",
                                  self._cost(data, seconds))
            return Generation(text, True, None, self._cost(data, seconds))
        return Generation(None, False, f"{last} (gave up after {self.max_retries + 1} attempts)",
                          Cost(seconds=time.perf_counter() - t0))

    def generate(self, batch: Sequence[list[dict]]) -> list[Generation]:
        """One chat-completion request per message list of ``batch`` (``concurrency`` in flight); a
        request that fails gives a failed Generation, never an exception."""
        if not batch:
            return []
        limits = httpx.Limits(max_connections=self.concurrency)
        with httpx.Client(limits=limits) as client, \
                concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda m: self._one(client, m), batch))


class LocalGenerator:
    """Greedy generation on a local jaxdm model (``Pretrained`` with a chat tokenizer)."""

    def __init__(self, pretrained: Any, *, max_new_tokens: int = 256, batch_size: int = 4):
        for attr in ("params", "config", "tokenizer"):
            if getattr(pretrained, attr, None) is None:
                raise TypeError(f"pretrained needs .{attr} (a jaxdm.models.Pretrained)")
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")
        self.pretrained = pretrained
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.name = f"local_generate({getattr(getattr(pretrained, 'path', None), 'name', 'local')})"

    def generate(self, batch: Sequence[list[dict]]) -> list[Generation]:
        """Generate a reply per message list of ``batch`` with the local model, batch_size prompts
        at a time (chat template, greedy, max_new_tokens); a prompt that would pass the model's
        context gives a failed Generation."""
        tok = self.pretrained.tokenizer
        limit = self.pretrained.config.max_position_embeddings
        out: list[Generation] = []
        for s in range(0, len(batch), self.batch_size):
            chunk = [encode_messages(tok, m) for m in batch[s:s + self.batch_size]]
            too_long = [len(p) + self.max_new_tokens > limit for p in chunk]
            run = [p for p, bad in zip(chunk, too_long) if not bad]
            t0 = time.perf_counter()
            texts: list[str] = []
            if run:
                res = generate(self.pretrained.params, self.pretrained.config, tok, run,
                               max_new_tokens=self.max_new_tokens, greedy=True)
                texts = list(res.texts) if res.texts is not None else [
                    tok.decode(t, skip_special_tokens=True) for t in res.tokens]
            per = (time.perf_counter() - t0) / max(len(run), 1)
            it = iter(texts)
            for p, bad in zip(chunk, too_long):
                if bad:
                    out.append(Generation(None, False, f"prompt of {len(p)} tokens + "
                                          f"{self.max_new_tokens} new exceeds the context "
                                          f"({limit})", Cost(tokens_in=len(p))))
                    continue
                text = next(it)
                n_out = len(tok(text, add_special_tokens=False)["input_ids"])
                out.append(Generation(text, True, None, Cost(len(p), n_out, None, per)))
        return out
