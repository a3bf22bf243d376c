"""A Python harness's client for `jaxdm decide`: ``DecideClient``.

It speaks the service's own ``POST /decide`` (the OpenAI-compatible routes are for
``jaxdm.decision.Remote`` and the official ``openai`` client) over the HTTP layer of
``jaxdm.decision.remote.Remote``, so retries, back-off, Retry-After, timeouts and the API key
work the same way: connection errors, timeouts, 429 and 5xx are retried up to
``max_retries`` times; anything else comes back as ``DecideError`` with the server's
``status``, ``field`` (e.g. ``"requests[2].options"``) and ``message``. The API key is read
from the environment variable named ``api_key_env`` at each request, never stored.

    client = DecideClient("http://127.0.0.1:8088", api_key_env="JAXDM_API_KEY")
    d = client.decide(context, "Which tool next?", ["lookup_order", "refund_order"])
    d.choice, d.confidence
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from jaxdm.decision.remote import Remote, RequestFailed


class DecideError(RuntimeError):
    """The service refused or failed a request: HTTP ``status`` (None: no answer reached
    us), the request ``field`` it names (None for a backend failure) and its ``message``."""

    def __init__(self, status: int | None, field: str | None, message: str):
        super().__init__(f"{status} {field}: {message}" if field else f"{status}: {message}")
        self.status, self.field, self.message = status, field, message


@dataclasses.dataclass(frozen=True)
class Decision:
    """One answer: a probability per option, the chosen option's text and index."""

    probs: tuple[float, ...]
    choice: str
    index: int
    confidence: float
    latency_ms: float
    model: str
    id: Any = None


def _decision(obj: Mapping) -> Decision:
    return Decision(probs=tuple(obj["probs"]), choice=obj["choice"], index=obj["index"],
                    confidence=obj["confidence"], latency_ms=obj["latency_ms"],
                    model=obj["model"], id=obj.get("id"))


def _item_error(obj: Mapping, status: int | None) -> DecideError:
    err = obj.get("error") if isinstance(obj.get("error"), Mapping) else {}
    return DecideError(status, err.get("field"), str(err.get("message", obj)))


class DecideClient:
    """Calls a `jaxdm decide` server (module docstring)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8088", *,
                 api_key_env: str | None = None, timeout: float = 300.0, max_retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 30.0):
        # down_after=0: a client asks its one server; it never gives up on it for good.
        self._http = Remote(base_url, "decide", api_key_env=api_key_env, timeout=timeout,
                            max_retries=max_retries, backoff=backoff, max_backoff=max_backoff,
                            down_after=0)
        self.base_url = self._http.base_url

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            if method == "GET":
                return self._http.get_json(path)
            return self._http.post_json(path, body)
        except RequestFailed as f:
            try:
                obj = json.loads(f.raw) if f.raw else {}
            except ValueError:
                obj = {}
            if isinstance(obj, Mapping) and isinstance(obj.get("error"), Mapping):
                raise _item_error(obj, f.status) from None
            raise DecideError(f.status, None, str(f)) from None

    def decide(self, context: str, question: str, options: Sequence[str], *, id: Any = None,
               meta: Mapping | None = None, option_names: Sequence[str] | None = None
               ) -> Decision:
        """One question; ``DecideError`` when the server refuses or fails it. ``option_names``:
        each option's leading name, the reply option likelihood scores
        (``MultipleChoice.option_names``)."""
        body: dict[str, Any] = {"context": context, "question": question,
                                "options": list(options)}
        if option_names is not None:
            body["option_names"] = list(option_names)
        if id is not None:
            body["id"] = id
        if meta is not None:
            body["meta"] = dict(meta)
        return _decision(self._request("POST", "/decide", body))

    def decide_many(self, requests: Sequence[Mapping]) -> list[Decision | DecideError]:
        """Several questions (dicts with context, question, options, optional id / meta) in
        one request; each comes back as a Decision or, for one the backend could not answer,
        a DecideError (a bad request as a whole raises DecideError)."""
        out = self._request("POST", "/decide", {"requests": [dict(r) for r in requests]})
        return [_item_error(r, None) if "error" in r else _decision(r) for r in out["results"]]

    def health(self) -> dict:
        """``GET /health``: liveness and the backend's state."""
        return self._request("GET", "/health")

    def ready(self) -> bool:
        """True when the backend can answer (a remote backend behind the service is up): the
        state ``/health`` reports, read without ``/ready``'s 503, which would be retried."""
        return self.health().get("backend", {}).get("state") == "up"

    def stats(self) -> dict:
        """``GET /stats``: batching, connection and prefix-cache counters."""
        return self._request("GET", "/stats")
