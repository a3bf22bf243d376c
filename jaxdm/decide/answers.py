"""`/decide` answers: a parsed request through the batcher to its answer JSON and HTTP status,
and the backend's health as the service reports it."""
from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Hashable

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


def collect(reqs: list[Request], is_batch: bool, futures: list[cf.Future], model: str,
            t0: float, timeout: float) -> tuple[dict, int]:
    """The answers of submitted requests -> (response JSON, HTTP status). All of a request's
    questions share one deadline; at the deadline the ones still queued are cancelled."""
    deadline = time.monotonic() + timeout
    answers = [_answer_json(r, f, model, t0, deadline) for r, f in zip(reqs, futures)]
    for f in futures:
        f.cancel()     # a no-op for answered ones
    if not is_batch:
        return answers[0]
    return {"results": [a for a, _ in answers], "latency_ms": (time.perf_counter() - t0) * 1e3,
            "model": model}, 200


def answer(batcher: MicroBatcher, model: str, payload: Any, t0: float,
           timeout: float = 300.0, limits: Limits = Limits(), client: Hashable = None
           ) -> tuple[dict, int]:
    """A decoded payload -> (response JSON, HTTP status); RequestError for bad requests."""
    reqs, is_batch, futures = submit(batcher, payload, limits, client)
    return collect(reqs, is_batch, futures, model, t0, timeout)


def backend_state(backend: Any) -> dict:
    """The backend's own health (``health()``, e.g. a Remote marked down and when it is
    re-probed), or ``{"state": "up"}`` for a backend that has no outside dependency."""
    health = getattr(backend, "health", None)
    return dict(health()) if callable(health) else {"state": "up"}
