"""Remote: an OpenAI-compatible HTTP decision model (vLLM, SGLang, hosted APIs).

Two interfaces over ``/v1/chat/completions`` (``endpoint="chat"``) or ``/v1/completions``:

- ``"constrained"``: ``max_tokens=1`` with ``logprobs``/``top_logprobs``; the returned
  first-token log-probs are restricted to the label tokens (A, B, ... or Yes/No; with
  ``label_match="strip"`` surface forms are compared after stripping whitespace and " A" and
  "A" add up, with ``"exact"`` only the bare label counts, as in ``LocalReadout``) and
  normalised over the labels that came back (a label missing from the top list gets
  probability 0, as in seed 000 Section 2.1). A response with none of the labels is a
  failure.
- ``"prompted"``: the model writes JSON, validated by ``jaxdm.decision.parsing``.

``base_url`` is the server's address with or without the OpenAI client's ``/v1`` suffix:
``http://127.0.0.1:8000`` and ``http://127.0.0.1:8000/v1`` both post to
``http://127.0.0.1:8000/v1/chat/completions`` (``normalize_base_url``). Anything that is not an
``http(s)://host[:port][/path]`` URL is a ValueError naming it.

Robustness: at most ``concurrency`` requests in flight (a thread pool over one httpx client);
each request has a ``timeout``; timeouts, connection errors, 429 and 5xx are retried up to
``max_retries`` times with exponential backoff (``backoff * 2**attempt`` seconds, honouring a
numeric Retry-After up to ``max_backoff``); anything that still fails, and any malformed
response, becomes a failed result with the reason, so a batch never raises because of the
server. After ``down_after`` consecutive connection failures or timeouts (attempts, across
all threads, with no HTTP answer in between) the backend is marked down (``down`` holds the
reason) and requests fail at once without contacting the server, so a dead server costs a few
attempts, not ``max_retries`` backoffs per question for the rest of a job
(``down_after=0`` never marks it down). A down server is re-probed (half-open): once
``probe_after`` seconds have passed, one request is let through; an HTTP answer marks the
server up again, a failure doubles the wait (up to ``max_backoff``). ``health()`` reports
the state for a service's ``/health`` and ``/ready``.

Prompts: with ``endpoint="completions"`` and a ``tokenizer`` (an object, or a path / "smollm2"
loaded with ``jaxdm.models.loading.load_tokenizer``) the prompt is sent as token ids built by
``jaxdm.models.tokenizer.chat_ids``, so a special-token string inside untrusted text (an
observation holding ``<|im_start|>``) stays text; a text prompt would let the server's
tokenizer parse it as a special token. With ``endpoint="chat"`` the server applies its own
template and tokenisation (vLLM parses special-token strings inside messages): for untrusted
contexts prefer completions with the model's tokenizer. The API key is read from the environment variable
named ``api_key_env`` when each request is sent; it is never stored on the object, logged or
put into results.

Cost: tokens from the response's ``usage`` (prompt/completion tokens), money from
``price_per_1k_in``/``price_per_1k_out`` when set, wall seconds per request (with retries).
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import os
import threading
import time
import urllib.parse
from typing import Any, Mapping, Sequence

from jaxdm.decision import render
from jaxdm.decision.parsing import parse_choice, parse_score
from jaxdm.decision.types import (ChoiceResult, Cost, MultipleChoice, ScoreResult, YesNo,
                                  choice_failed, choice_ok, score_failed, score_ok)

_RETRY_STATUS = {429, 500, 502, 503, 504}


class _Failure(Exception):
    """A request that failed for good (reason in args[0]); carries the raw body and the HTTP
    status of the last answer, if any."""

    def __init__(self, reason: str, raw: str | None = None, status: int | None = None):
        super().__init__(reason)
        self.raw = raw
        self.status = status


def server_message(text: str, limit: int = 300) -> str:
    """``": <message>"`` from an error body in the OpenAI shape (``{"error": {"message"}}``),
    FastAPI's ``{"detail": ...}`` or ``{"message": ...}``, cut at ``limit`` characters; ""
    when the body has none (so an HTTP error names what the server said, not only its code)."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return ""
    msg = None
    if isinstance(data, dict):
        err = data.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        msg = msg if msg is not None else data.get("detail", data.get("message"))
    if msg is None:
        return ""
    msg = msg if isinstance(msg, str) else json.dumps(msg)
    msg = " ".join(msg.split())
    return ": " + (msg if len(msg) <= limit else msg[:limit] + "...")


def normalize_base_url(base_url: str) -> str:
    """The API root of an OpenAI-compatible server: ``base_url`` without a trailing ``/`` or
    ``/v1`` (requests then go to ``<root>/v1/...``). Raises ValueError for anything that is
    not ``http(s)://host[:port][/path]`` (no query or fragment)."""
    if not isinstance(base_url, str) or not base_url.strip():
        raise ValueError(f"Remote base_url must be a non-empty http(s) URL, got {base_url!r}")
    text = base_url.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError as e:
        raise ValueError(f"Remote base_url {text!r} is not a valid URL ({e})") from None
    del port
    shown = parts._replace(netloc=parts.hostname or "").geturl() if parts.username else text
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"Remote base_url {shown!r} must start with http:// or https:// "
                         f"(e.g. http://127.0.0.1:8000/v1)")
    if not parts.hostname:
        raise ValueError(f"Remote base_url {shown!r} has no host (e.g. http://127.0.0.1:8000/v1)")
    if parts.query or parts.fragment:
        raise ValueError(f"Remote base_url {shown!r} must not have a query or fragment")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-len("/v1")]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class Remote:
    """OpenAI-compatible endpoint used for constrained readout or prompted JSON."""

    def __init__(self, base_url: str, model: str, *, interface: str = "constrained",
                 endpoint: str = "chat", api_key_env: str | None = None,
                 price_per_1k_in: float | None = None, price_per_1k_out: float | None = None,
                 concurrency: int = 8, timeout: float = 30.0, max_retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 30.0, top_logprobs: int = 20,
                 max_tokens: int = 256, tokenizer: Any = None, label_match: str = "strip",
                 progress: bool = False, down_after: int = 5, probe_after: float = 1.0):
        if interface not in ("constrained", "prompted"):
            raise ValueError(f"Remote interface must be 'constrained' or 'prompted', "
                             f"got {interface!r}")
        if endpoint not in ("chat", "completions"):
            raise ValueError(f"Remote endpoint must be 'chat' or 'completions', got {endpoint!r}")
        if api_key_env is not None and api_key_env not in os.environ:
            raise ValueError(f"environment variable {api_key_env!r} (api_key_env) is not set")
        if label_match not in ("strip", "exact"):
            raise ValueError(f"label_match must be 'strip' or 'exact', got {label_match!r}")
        if concurrency < 1 or max_retries < 0 or not timeout > 0 or down_after < 0:
            raise ValueError("concurrency >= 1, max_retries >= 0, timeout > 0 and down_after >= 0 "
                             "are required")
        if isinstance(probe_after, bool) or not isinstance(probe_after, (int, float)) \
                or not math.isfinite(probe_after) or probe_after <= 0:
            raise ValueError(f"Remote probe_after must be a finite number of seconds > 0, got "
                             f"{probe_after!r}")
        for key, val in (("timeout", timeout), ("backoff", backoff), ("max_backoff", max_backoff),
                         ("price_per_1k_in", price_per_1k_in),
                         ("price_per_1k_out", price_per_1k_out)):
            if val is not None and not math.isfinite(val):
                raise ValueError(f"Remote {key} must be a finite number, got {val!r}")
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.interface = interface
        self.endpoint = endpoint
        self.api_key_env = api_key_env
        self.price_in = price_per_1k_in
        self.price_out = price_per_1k_out
        self.concurrency = int(concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.top_logprobs = int(top_logprobs)
        self.max_tokens = int(max_tokens)
        # Completions endpoints take a raw prompt: with the model's tokenizer it is sent as the
        # chat template's token ids (untrusted text stays text), else as plain rendered text.
        if isinstance(tokenizer, str):
            from jaxdm.models.loading import load_tokenizer  # why: JAX, named tokenizer only
            from jaxdm.models.smollm2 import smollm2_path

            tokenizer = load_tokenizer(smollm2_path() if tokenizer == "smollm2" else tokenizer)
        self.tokenizer = tokenizer
        self.label_match = label_match
        self.progress = progress
        self.name = f"remote({model},{interface},{endpoint})"
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "parse_failures": 0,
                      "connection_failures": 0}
        self.down_after = int(down_after)
        self.down: str | None = None  # reason, once marked down
        self._consecutive = 0  # connection failures since the last HTTP answer
        self.probe_after = float(probe_after)
        self._probe_wait = self.probe_after   # doubles per failed probe, up to max_backoff
        self._probe_at = 0.0                  # monotonic time of the next probe while down
        self._probing = False                 # a probe request is in flight
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never shows a key (there is none stored), only its env name
        return f"Remote(base_url={self.base_url!r}, model={self.model!r}, " \
               f"interface={self.interface!r}, api_key_env={self.api_key_env!r})"

    # ---- request building ----------------------------------------------------------------
    def _payload(self, messages: list[dict]) -> tuple[str, dict]:
        body: dict[str, Any] = {"model": self.model, "temperature": 0.0}
        if self.interface == "constrained":
            body["max_tokens"] = 1
        else:
            body["max_tokens"] = self.max_tokens
        if self.endpoint == "chat":
            body["messages"] = messages
            if self.interface == "constrained":
                body["logprobs"] = True
                body["top_logprobs"] = self.top_logprobs
            return "/v1/chat/completions", body
        if self.tokenizer is not None:
            from jaxdm.models.tokenizer import chat_ids  # why: JAX (see __init__)

            prompt = chat_ids(self.tokenizer, [messages])[0]
        else:
            prompt = render.render_plain(messages)
        body["prompt"] = prompt
        if self.interface == "constrained":
            body["logprobs"] = self.top_logprobs
        return "/v1/completions", body

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise _Failure(f"environment variable {self.api_key_env!r} is not set")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post(self, client: httpx.Client, path: str, body: dict | None,
              method: str = "POST") -> dict:
        """POST (or ``method``) with retries; returns the parsed JSON body or raises
        _Failure."""
        import httpx  # here, not at import: `jaxdm` commands that never call an API skip it
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            if self.down is not None and not self._may_probe():
                raise _Failure(self.down)
            if attempt:
                with self._lock:
                    self.stats["retries"] += 1
            wait = min(self.backoff * (2 ** attempt), self.max_backoff)
            try:
                resp = client.request(method, self.base_url + path, json=body,
                                      headers=self._headers(), timeout=self.timeout)
            except httpx.TimeoutException:
                last = f"timeout after {self.timeout:g} s"
                self._connection_failed(last)
            except httpx.TransportError as e:
                last = f"connection error ({type(e).__name__})"
                self._connection_failed(last)
            else:
                self._answered()
                if resp.status_code == 200:
                    try:
                        data = resp.json()
                    except ValueError:
                        raise _Failure("malformed JSON response", raw=resp.text[:2000]) from None
                    if not isinstance(data, dict):
                        raise _Failure("response JSON is not an object", raw=resp.text[:2000])
                    return data
                last = f"HTTP {resp.status_code}" + server_message(resp.text)
                if resp.status_code not in _RETRY_STATUS:
                    raise _Failure(last, raw=resp.text[:2000], status=resp.status_code)
                retry_after = resp.headers.get("retry-after")
                try:
                    if retry_after is not None:
                        wait = min(max(float(retry_after), wait), self.max_backoff)
                except ValueError:
                    pass
            if attempt < self.max_retries and self.down is None:
                time.sleep(wait)
        status = resp.status_code if last.startswith("HTTP") else None
        raise _Failure(f"{last} (gave up after {self.max_retries + 1} attempts)",
                       raw=resp.text[:2000] if status else None, status=status)

    def _may_probe(self) -> bool:
        """While down: True for the one request that re-probes the server (half-open)."""
        with self._lock:
            if self.down is None:
                return True
            if self._probing or time.monotonic() < self._probe_at:
                return False
            self._probing = True
            return True

    def _answered(self) -> None:
        """The server answered over HTTP: it is up."""
        with self._lock:
            self._consecutive = 0
            self.down = None
            self._probing = False
            self._probe_wait = self.probe_after

    def _connection_failed(self, reason: str) -> None:
        with self._lock:
            self.stats["connection_failures"] += 1
            self._consecutive += 1
            if self.down is not None:           # the probe failed: wait twice as long
                self._probing = False
                self._probe_wait = min(self._probe_wait * 2, max(self.max_backoff,
                                                                  self.probe_after))
                self._probe_at = time.monotonic() + self._probe_wait
                return
            if self.down_after and self._consecutive >= self.down_after:
                self.down = (f"server {self.base_url} marked down after {self._consecutive} "
                             f"consecutive connection failures (last: {reason})")
                self._probe_at = time.monotonic() + self._probe_wait

    def health(self) -> dict:
        """{"state": "up"} or {"state": "down", "reason", "probe_in_s"} (the next re-probe)."""
        with self._lock:
            if self.down is None:
                return {"state": "up", "server": self.base_url}
            return {"state": "down", "server": self.base_url, "reason": self.down,
                    "probe_in_s": round(max(0.0, self._probe_at - time.monotonic()), 3)}

    # ---- response reading ----------------------------------------------------------------
    def _cost(self, data: Mapping, seconds: float) -> Cost:
        usage = data.get("usage") if isinstance(data.get("usage"), Mapping) else {}
        tin = int(usage.get("prompt_tokens") or 0)
        tout = int(usage.get("completion_tokens") or 0)
        usd = None
        if self.price_in is not None or self.price_out is not None:
            usd = tin / 1000 * (self.price_in or 0.0) + tout / 1000 * (self.price_out or 0.0)
        return Cost(tokens_in=tin, tokens_out=tout, usd=usd, seconds=seconds)

    def _first_token_logprobs(self, data: Mapping) -> dict[str, float]:
        """token -> logprob at the first generated position (chat or completions layout)."""
        try:
            choice = data["choices"][0]
            lp = choice["logprobs"]
            if self.endpoint == "chat":
                entries = lp["content"][0]["top_logprobs"]
                pairs = [(e["token"], e["logprob"]) for e in entries]
            else:
                pairs = list(lp["top_logprobs"][0].items())
        except (KeyError, IndexError, TypeError) as e:
            raise _Failure(f"response has no first-token top_logprobs ({type(e).__name__}: {e})")
        out: dict[str, float] = {}
        for tok, val in pairs:
            if not isinstance(tok, str) or isinstance(val, bool) \
                    or not isinstance(val, (int, float)) or math.isnan(val):
                raise _Failure(f"malformed top_logprobs entry {tok!r}: {val!r}")
            key = tok.strip() if self.label_match == "strip" else tok
            # Several surface forms (" A", "A") can map to one label: add probabilities.
            out[key] = math.log(math.exp(out[key]) + math.exp(val)) if key in out else float(val)
        return out

    def _text(self, data: Mapping) -> str:
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError) as e:
            raise _Failure(f"response has no generated text ({type(e).__name__}: {e})")
        if not isinstance(text, str):
            raise _Failure("generated text is not a string")
        return text

    def _label_probs(self, data: Mapping, labels: Sequence[str]) -> list[float]:
        lps = self._first_token_logprobs(data)
        found = {lab: lps[lab] for lab in labels if lab in lps}
        if not found:
            raise _Failure(f"top_logprobs contain none of the label tokens {list(labels)}",
                           raw=repr(sorted(lps))[:2000])
        m = max(found.values())
        weights = [math.exp(found[lab] - m) if lab in found else 0.0 for lab in labels]
        z = sum(weights)
        return [w / z for w in weights]

    # ---- one question ----------------------------------------------------------------------
    def _one(self, client: httpx.Client, q: MultipleChoice | YesNo):
        is_choice = isinstance(q, MultipleChoice)
        t0 = time.perf_counter()
        data: Mapping = {}
        with self._lock:
            self.stats["requests"] += 1
        try:
            labels = render.labels_for(len(q.options)) if is_choice else render.YES_NO
            path, body = self._payload(render.render_messages(q, self.interface))
            data = self._post(client, path, body)
            cost = self._cost(data, time.perf_counter() - t0)
            if self.interface == "constrained":
                probs = self._label_probs(data, labels)
                raw = None
                if is_choice:
                    return choice_ok(probs, cost=cost)
                return score_ok(probs[0], cost=cost)
            raw = self._text(data)
            res = parse_choice(raw, labels, cost) if is_choice else parse_score(raw, cost)
            if not res.ok:
                with self._lock:
                    self.stats["parse_failures"] += 1
            return res
        except _Failure as f:
            with self._lock:
                self.stats["failures"] += 1
            cost = self._cost(data, time.perf_counter() - t0)
            fail = choice_failed if is_choice else score_failed
            return fail(str(f), raw=f.raw, cost=cost)

    def _run(self, questions: Sequence, kind: type) -> list:
        for i, q in enumerate(questions):
            if not isinstance(q, kind):
                raise TypeError(f"questions[{i}] is {type(q).__name__}, expected {kind.__name__}")
            if kind is MultipleChoice:
                render.labels_for(len(q.options))  # too many options: a clear error up front
        results: list = [None] * len(questions)
        import httpx  # why: see _post

        limits = httpx.Limits(max_connections=self.concurrency,
                              max_keepalive_connections=self.concurrency)
        with httpx.Client(limits=limits) as client, \
                concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            futures = {pool.submit(self._one, client, q): i for i, q in enumerate(questions)}
            done = concurrent.futures.as_completed(futures)
            if self.progress:
                from tqdm.auto import tqdm  # why: progress bars only
                done = tqdm(done, total=len(futures), desc=self.name)
            try:
                for fut in done:
                    results[futures[fut]] = fut.result()
            except BaseException:
                # Ctrl-C: drop the queued questions so the pool's exit waits only for the
                # requests already in flight, not for the whole batch.
                for fut in futures:
                    fut.cancel()
                raise
        return results

    def choose(self, questions: Sequence[MultipleChoice]) -> list[ChoiceResult]:
        """Answer each MultipleChoice with one request to the server (``concurrency`` in flight),
        the option probabilities read from its reply; a request that fails after its retries gives a
        failed result."""
        return self._run(questions, MultipleChoice)

    def score(self, questions: Sequence[YesNo]) -> list[ScoreResult]:
        """Answer each YesNo with one request to the server (``concurrency`` in flight); a request
        that fails after its retries gives a failed result."""
        return self._run(questions, YesNo)

    # ---- shared HTTP layer (HARNESS: jaxdm.harness.RemoteLLM posts through it) -----------
    def post_json(self, path: str, body: dict) -> dict:
        """POST ``body`` to ``<base_url><path>`` with this backend's retries, backoff,
        Retry-After, timeout, down-marking and API key; returns the JSON object or raises
        ``RequestFailed`` (the reason in its message, the raw body in ``.raw``)."""
        import httpx  # why: see _post

        with httpx.Client() as client:
            return self._post(client, path, body)

    def get_json(self, path: str) -> dict:
        """GET ``<base_url><path>`` the way ``post_json`` posts (retries, key, down-marking)."""
        import httpx  # why: see _post

        with httpx.Client() as client:
            return self._post(client, path, None, method="GET")


RequestFailed = _Failure  # public name of the failure post_json raises
