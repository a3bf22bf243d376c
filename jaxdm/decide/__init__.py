"""`jaxdm decide`: a decision service for external harnesses (HTTP, or JSON lines on
stdin/stdout), backed by any decision backend of ``jaxdm.decision.make_backend``.

Request (one JSON object)::

    {"context": str, "question": str, "options": [str, ...],   # required, options non-empty
     "option_names": [str, ...],                                # optional, each the start of
                                                                # its option: the reply that
                                                                # option likelihood scores
     "id": any JSON value,                                      # optional, echoed back
     "meta": {...}}                                             # optional, out-of-band data for
                                                                # the backend, never shown to a
                                                                # model (the Oracle reads
                                                                # meta.oracle_answer)

or a batch ``{"requests": [request, ...]}``. Answer::

    {"probs": [float per option], "choice": option text, "index": int,
     "confidence": max(probs), "latency_ms": float, "model": str, "id": ...}

and for a batch ``{"results": [answer, ...], "latency_ms": float, "model": str}``. Unknown keys,
a missing field, a wrong type, an empty or duplicated option list, a request over a limit and
bad or non-strict JSON get ``{"error": {"field": "requests[2].options", "message": ...}}`` with
HTTP 400 (413 / 408 / 411 for a body too large, too slow or without a length; on stdio one
error line, ``"line"`` added), and the server keeps serving. A backend that cannot answer one
question gives that answer ``{"error": {"field": null, "message": ...}}``; a single request
then gets HTTP 422 (the backend rejected the question, e.g. too many options for
constrained readout), 502 (the backend answered with a failure, e.g. a remote model's
unparsable reply), 504 (no answer within ``--answer-timeout``) or 500 (anything else).

HTTP routes: ``POST /decide``; ``GET /health`` (liveness, no API key needed: {"status": "ok",
"model", "backend": {"state": "up" | "down" | ...}}), ``GET /ready`` (200 when the backend
is up, 503 while a remote backend is marked down), ``GET /stats`` (batching and connection
counters, the backend's prefix cache); the serving engines' routes (``/v1/completions``,
``/v1/chat/completions``, ``/v1/models``, SGLang's ``/v1/score``: ``openai_routes``).

Modules: ``protocol`` (request format, strict JSON, limits), ``scheduler`` (``MicroBatcher``:
micro-batching, fairness across clients, cancellation, refused-question isolation),
``answers``, ``openai_routes``, ``server`` (HTTP: API key, timeouts, connection cap),
``stdio``; this module is the command line.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from jaxdm.decide.protocol import Limits
from jaxdm.decide.scheduler import MicroBatcher
from jaxdm.decide.server import DecideServer, exposure_warning
from jaxdm.decide.stdio import serve_stdio
from jaxdm.decision.types import DecisionModel
from jaxdm.screen.run import JUDGE_ALIASES, build_judges

API_KEY_ENV = "JAXDM_API_KEY"


def backend_from_spec(spec: str) -> tuple[str, DecisionModel]:
    """'oracle', 'smollm2', an HF model folder, or 'kind:key=value,...' -> (name, backend)."""
    if spec not in JUDGE_ALIASES and ":" not in spec and Path(spec).is_dir():
        spec = f"local_readout:path={spec},name={Path(spec).name}"
    [(name, backend)] = build_judges([spec])
    return name, backend


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``decide`` subcommand of ``jaxdm`` (see the module docstring)."""
    p = sub.add_parser("decide", help="serve a decision backend to external harnesses (HTTP or "
                                      "JSON lines)",
                       description="Answer {context, question, options} requests (or "
                                   "{\"requests\": [...]} batches) with a decision backend: "
                                   "--serve = HTTP (POST /decide, the OpenAI-compatible "
                                   "/v1 routes, SGLang's /v1/score) on 127.0.0.1, --stdio = "
                                   "one JSON object per line on stdin, one answer per line on "
                                   "stdout (exit 1 when a line got an error line).")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--serve", action="store_true", help="HTTP server (POST /decide)")
    mode.add_argument("--stdio", action="store_true", help="JSON lines on stdin/stdout")
    p.add_argument("--backend", default="smollm2", metavar="SPEC",
                   help="'smollm2' (default), 'oracle', a model folder, or 'kind:key=value,...' "
                        "(e.g. remote:base_url=http://127.0.0.1:8000/v1,model=m)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8088, help="port (0 = a free port; default 8088)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every route but /health "
                        f"(default: the {API_KEY_ENV} environment variable, which keeps the "
                        "key out of the process list)")
    p.add_argument("--max-batch", type=int, default=32,
                   help="most questions per backend call (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a batch waits for more questions after its first (default 5)")
    p.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024,
                   help="largest request body / stdio line (default 16 MiB)")
    p.add_argument("--max-questions", type=int, default=256,
                   help="most questions (or prompts, score items) per request (default 256)")
    p.add_argument("--max-options", type=int, default=256,
                   help="most options per question (default 256)")
    p.add_argument("--max-context-tokens", type=int, default=None,
                   help="most context tokens per question (default: the model's context)")
    p.add_argument("--max-connections", type=int, default=256,
                   help="open connections at most; more get 503 (default 256)")
    p.add_argument("--read-timeout", type=float, default=30.0,
                   help="seconds to receive a request's headers and body (default 30)")
    p.add_argument("--idle-timeout", type=float, default=60.0,
                   help="seconds a kept-alive connection may wait for its next request "
                        "(default 60)")
    p.add_argument("--answer-timeout", type=float, default=300.0,
                   help="seconds a request waits for its answers; then 504 and its queued "
                        "questions are dropped (default 300)")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="largest logprobs / top_logprobs of the /v1 routes (default 20)")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request to stderr")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the subcommand parsed by ``add_parser``; returns the exit code."""
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    try:
        limits = Limits(max_body_bytes=args.max_body_bytes, max_questions=args.max_questions,
                        max_options=args.max_options,
                        max_context_tokens=args.max_context_tokens)
        name, backend = backend_from_spec(args.backend)
        if limits.max_context_tokens is not None and getattr(backend, "tokenizer", None) is None:
            raise ValueError(f"--max-context-tokens needs a backend with a tokenizer; "
                             f"{name} has none")
        batcher = MicroBatcher(backend, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"jaxdm decide: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.stdio:
            print(f"jaxdm decide: {name} reading JSON lines on stdin", file=sys.stderr, flush=True)
            return serve_stdio(batcher, name, sys.stdin.buffer, sys.stdout,
                               args.answer_timeout, limits)

        try:
            server = DecideServer(batcher, name, args.host, args.port, verbose=args.verbose,
                                  answer_timeout=args.answer_timeout, api_key=api_key,
                                  limits=limits, read_timeout=args.read_timeout,
                                  idle_timeout=args.idle_timeout,
                                  max_connections=args.max_connections,
                                  max_logprobs=args.max_logprobs)
        except ValueError as e:
            print(f"jaxdm decide: error: --port: {e}" if "port" in str(e)
                  else f"jaxdm decide: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"jaxdm decide: error: cannot bind {args.host}:{args.port}: {e}",
                  file=sys.stderr)
            return 2
        warning = exposure_warning(args.host, api_key)
        if warning:
            print(f"jaxdm decide: {warning}", file=sys.stderr, flush=True)
        print(f"jaxdm decide: serving {name} on {server.url} (POST /decide, /v1/completions, "
              f"/v1/chat/completions, /v1/score; API key {'required' if api_key else 'off'})",
              file=sys.stderr, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0
    finally:
        batcher.close()
