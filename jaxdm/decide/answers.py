"""`/decide` answers: a parsed request through the batcher to its answer JSON and HTTP status,
and the backend's health as the service reports it."""
from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Callable, Hashable

from jaxdm.decide.protocol import Limits, Request, check_context_tokens, parse_payload
from jaxdm.decide.scheduler import BackendError, MicroBatcher
from jaxdm.decision.types import ChoiceResult


def _answer_json(req: Request, fut: cf.Future, model: str, t0: float, deadline: float
                 ) -> tuple[dict, int]:
    """One answer dict and its HTTP status (200, or the failure's status)."""
    try:
        res: ChoiceResult = fut.result(timeout=max(0.0, deadline - time.monotonic()))
    except BackendError as e:
        out, status = {"error": {"field": None, "message": str(e)}}, e.status
    except cf.TimeoutError:
        fut.cancel()   # still queued: it never reaches the backend
        out, status = {"error": {"field": None, "message": "no answer within the server's "
                                                           "answer timeout"}}, 504
    except cf.CancelledError:
        out, status = {"error": {"field": None, "message": "cancelled: the request's other "
                                                           "questions timed out"}}, 504
    else:
        if res.ok:
            out = {"probs": list(res.probs), "choice": req.question.options[res.choice],
                   "index": res.choice, "confidence": res.confidence}
            status = 200
        else:
            out = {"error": {"field": None, "message": f"backend failed: {res.error}"}}
            status = 502
    out["latency_ms"] = (time.perf_counter() - t0) * 1000.0
    out["model"] = model
    if req.has_id:
        out["id"] = req.id
    return out, status


def submit(batcher: MicroBatcher, payload: Any, limits: Limits, client: Hashable = None
           ) -> tuple[list[Request], bool, list[cf.Future]]:
    """Parses and submits a payload (RequestError for a bad one): (requests, is_batch,
    futures)."""
    reqs, is_batch = parse_payload(payload, limits)
    tokenizer = getattr(batcher.backend, "tokenizer", None)
    if limits.max_context_tokens is not None and tokenizer is not None:
        check_context_tokens(reqs, is_batch, tokenizer, limits.max_context_tokens)
    return reqs, is_batch, batcher.submit([r.question for r in reqs], client)


# How often a waiting request checks that its client is still connected (seconds).
DISCONNECT_POLL_S = 0.05


class ClientGone(Exception):
    """The client closed its connection while its questions waited: they were cancelled
    (``cancelled`` of them never reached the backend); there is no one to answer."""

    def __init__(self, cancelled: int):
        super().__init__(f"client disconnected; {cancelled} queued question(s) dropped")
        self.cancelled = cancelled


def _wait_unless_gone(futures: list[cf.Future], deadline: float,
                      gone: Callable[[], bool]) -> None:
    """Waits for the futures until the deadline; raises ClientGone (after cancelling the
    ones still queued) as soon as ``gone()`` says the client has left."""
    pending = set(futures)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        _, pending = cf.wait(pending, timeout=min(DISCONNECT_POLL_S, left))
        if pending and gone():
            raise ClientGone(sum(f.cancel() for f in futures))


def collect(reqs: list[Request], is_batch: bool, futures: list[cf.Future], model: str,
            t0: float, timeout: float, gone: Callable[[], bool] | None = None
            ) -> tuple[dict, int]:
    """The answers of submitted requests -> (response JSON, HTTP status). All of a request's
    questions share one deadline; at the deadline the ones still queued are cancelled.
    ``gone`` (e.g. "the client's socket reached EOF"), polled every ``DISCONNECT_POLL_S``
    while questions wait: when it turns true the queued questions are cancelled (they never
    reach the backend) and ClientGone is raised."""
    deadline = time.monotonic() + timeout
    if gone is not None:
        _wait_unless_gone(futures, deadline, gone)
    answers = [_answer_json(r, f, model, t0, deadline) for r, f in zip(reqs, futures)]
    for f in futures:
        f.cancel()     # a no-op for answered ones
    if not is_batch:
        return answers[0]
    return {"results": [a for a, _ in answers], "latency_ms": (time.perf_counter() - t0) * 1e3,
            "model": model}, 200


def answer(batcher: MicroBatcher, model: str, payload: Any, t0: float,
           timeout: float = 300.0, limits: Limits = Limits(), client: Hashable = None,
           gone: Callable[[], bool] | None = None) -> tuple[dict, int]:
    """A decoded payload -> (response JSON, HTTP status); RequestError for bad requests,
    ClientGone when ``gone()`` turned true while it waited (``collect``)."""
    reqs, is_batch, futures = submit(batcher, payload, limits, client)
    return collect(reqs, is_batch, futures, model, t0, timeout, gone)


def backend_state(backend: Any) -> dict:
    """The backend's own health (``health()``, e.g. a Remote marked down and when it is
    re-probed), or ``{"state": "up"}`` for a backend that has no outside dependency."""
    health = getattr(backend, "health", None)
    return dict(health()) if callable(health) else {"state": "up"}
