"""`jaxdm decide`: a decision endpoint for external harnesses (HTTP on 127.0.0.1, or JSON lines
on stdin/stdout), backed by any decision backend of ``jaxdm.decision.make_backend``.

Request (one JSON object)::

    {"context": str, "question": str, "options": [str, ...],   # required, options non-empty
     "id": any JSON value,                                      # optional, echoed back
     "meta": {...}}                                             # optional, out-of-band data for
                                                                # the backend, never shown to a
                                                                # model (the Oracle reads
                                                                # meta.oracle_answer)

or a batch ``{"requests": [request, ...]}``. Answer::

    {"probs": [float per option], "choice": option text, "index": int,
     "confidence": max(probs), "latency_ms": float, "model": str, "id": ...}

and for a batch ``{"results": [answer, ...], "latency_ms": float, "model": str}``. Unknown keys,
a missing field, a wrong type, an empty or duplicated option list and bad JSON get
``{"error": {"field": "requests[2].options", "message": ...}}`` with HTTP 400 (on stdio one
error line, ``"line"`` added), and the server keeps serving. A backend that cannot answer one
question gives that answer ``{"error": {"field": null, "message": ...}}``; a single request
then gets HTTP 422 (the backend rejected the question, e.g. too many options for
constrained readout), 502 (the backend answered with a failure, e.g. a remote model's
unparsable reply) or 500 (anything else).

HTTP routes: ``POST /decide`` (requests), ``GET /health`` ({"status": "ok", "model"}), ``GET
/stats`` (batching counters). Concurrency: ``MicroBatcher`` collects the questions of
concurrent requests for up to ``max_wait_ms`` after the first one arrives (or until
``max_batch``) and answers them with one ``backend.choose`` call from a single worker thread,
so 16 concurrent clients share scoring passes and the backend is never called from two
threads at once. If a batched call raises, each of its questions is retried alone, so one bad
question does not fail its neighbours.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import math
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

from jaxdm.decision.types import ChoiceResult, DecisionModel, MultipleChoice

REQUEST_KEYS = ("context", "question", "options", "id", "meta")
MAX_BODY_BYTES = 16 * 1024 * 1024


class RequestError(ValueError):
    """A bad request; ``field`` names the offending JSON field (dotted / indexed path)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def to_json(self) -> dict:
        return {"error": {"field": self.field, "message": self.message}}


@dataclasses.dataclass(frozen=True)
class Request:
    question: MultipleChoice
    id: Any = None
    has_id: bool = False


# ------------------------------------------------------------------------ parsing


def _parse_one(obj: Any, where: str) -> Request:
    def field(name: str) -> str:
        return f"{where}.{name}" if where else name

    if not isinstance(obj, dict):
        raise RequestError(where or "body", f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(field(unknown[0]), f"unknown key (allowed: {list(REQUEST_KEYS)})")
    for name in ("context", "question"):
        if name not in obj:
            raise RequestError(field(name), "missing")
        if not isinstance(obj[name], str):
            raise RequestError(field(name), f"must be a string, got {type(obj[name]).__name__}")
    if "options" not in obj:
        raise RequestError(field("options"), "missing")
    options = obj["options"]
    if not isinstance(options, list):
        raise RequestError(field("options"), f"must be a list of strings, got "
                                             f"{type(options).__name__}")
    if not options:
        raise RequestError(field("options"), "is empty; give at least one option")
    seen: set[str] = set()
    for i, o in enumerate(options):
        if not isinstance(o, str):
            raise RequestError(f"{field('options')}[{i}]", f"must be a string, got "
                                                           f"{type(o).__name__}")
        if o in seen:
            raise RequestError(f"{field('options')}[{i}]", f"duplicate option {o!r}")
        seen.add(o)
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise RequestError(field("meta"), f"must be an object, got {type(meta).__name__}")
    mc = MultipleChoice(context=obj["context"], question=obj["question"], options=tuple(options),
                        meta=meta)
    return Request(mc, obj.get("id"), "id" in obj)


def parse_payload(payload: Any) -> tuple[list[Request], bool]:
    """A decoded JSON payload -> (requests, is_batch); RequestError names the bad field."""
    if isinstance(payload, dict) and "requests" in payload:
        extra = sorted(set(payload) - {"requests"})
        if extra:
            raise RequestError(extra[0], "unknown key next to 'requests' (a batch is "
                                         "{\"requests\": [...]} only)")
        reqs = payload["requests"]
        if not isinstance(reqs, list):
            raise RequestError("requests", f"must be a list, got {type(reqs).__name__}")
        if not reqs:
            raise RequestError("requests", "is empty")
        return [_parse_one(r, f"requests[{i}]") for i, r in enumerate(reqs)], True
    if not isinstance(payload, dict):
        raise RequestError("body", "expected a JSON object: one request or "
                                   "{\"requests\": [...]}, got " + type(payload).__name__)
    return [_parse_one(payload, "")], False


def decode_body(raw: bytes | str) -> Any:
    """JSON text -> value; bad UTF-8 or JSON raises RequestError('body', ...)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise RequestError("body", f"not UTF-8 ({e})") from None
    except json.JSONDecodeError as e:
        raise RequestError("body", f"invalid JSON: {e}") from None


# --------------------------------------------------------------------- batching


class BackendError(RuntimeError):
    """The backend raised for a question; ``status`` is 422 for ValueError/TypeError (it
    rejected the question), 500 otherwise."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


_STOP = object()


class MicroBatcher:
    """Collects concurrently submitted questions into one ``backend.choose`` call.

    A worker thread takes the first queued question, then waits up to ``max_wait_ms`` more
    for others (stopping at ``max_batch``), and answers all of them with one call. Every
    future resolves to a ``ChoiceResult`` or raises ``BackendError``.
    """

    def __init__(self, backend: DecisionModel, *, max_batch: int = 32,
                 max_wait_ms: float = 5.0):
        if not (isinstance(max_batch, int) and max_batch >= 1):
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not (isinstance(max_wait_ms, (int, float)) and math.isfinite(max_wait_ms)
                and max_wait_ms >= 0):
            raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms!r}")
        self.backend = backend
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.calls = 0          # backend.choose calls
        self.questions = 0      # questions answered (or failed)
        self.largest = 0        # largest batch sent
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="jaxdm-decide-batcher",
                                        daemon=True)
        self._thread.start()

    def submit(self, questions: Sequence[MultipleChoice]) -> list[cf.Future]:
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        futures = []
        for q in questions:
            fut: cf.Future = cf.Future()
            self._queue.put((q, fut))
            futures.append(fut)
        return futures

    def stats(self) -> dict:
        with self._lock:
            return {"calls": self.calls, "questions": self.questions,
                    "mean_batch": self.questions / self.calls if self.calls else 0.0,
                    "largest_batch": self.largest, "max_batch": self.max_batch,
                    "max_wait_ms": self.max_wait * 1000.0}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        stop = False
        while not stop:
            item = self._queue.get()
            if item is _STOP:
                return
            batch = [item]
            deadline = time.monotonic() + self.max_wait
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic())) \
                        if self.max_wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            try:
                self._answer(batch)
            except Exception as e:  # noqa: BLE001 - never leave a client waiting forever
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(BackendError(f"batcher: {type(e).__name__}: {e}", 500))

    def _call(self, questions: list[MultipleChoice]) -> list[ChoiceResult]:
        with self._lock:
            self.calls += 1
            self.largest = max(self.largest, len(questions))
        results = list(self.backend.choose(questions))
        if len(results) != len(questions):
            raise RuntimeError(f"backend {self.backend.name!r} returned {len(results)} answers "
                               f"for {len(questions)} questions")
        return results

    def _answer(self, batch: list) -> None:
        questions = [q for q, _ in batch]
        try:
            results = self._call(questions)
        except Exception as e:  # noqa: BLE001 - isolate the failing question(s)
            if len(batch) > 1:
                for item in batch:
                    self._answer([item])
                return
            status = 422 if isinstance(e, (ValueError, TypeError)) else 500
            with self._lock:
                self.questions += 1
            batch[0][1].set_exception(BackendError(f"{type(e).__name__}: {e}", status))
            return
        with self._lock:
            self.questions += len(batch)
        for (_, fut), res in zip(batch, results):
            fut.set_result(res)


# --------------------------------------------------------------------- answers


def _answer_json(req: Request, fut: cf.Future, model: str, t0: float, timeout: float
                 ) -> tuple[dict, int]:
    """One answer dict and its HTTP status (200, or the failure's status)."""
    try:
        res: ChoiceResult = fut.result(timeout=timeout)
    except BackendError as e:
        out, status = {"error": {"field": None, "message": str(e)}}, e.status
    except cf.TimeoutError:
        out, status = {"error": {"field": None, "message": f"no answer within {timeout:g} s"}}, 504
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


def answer(batcher: MicroBatcher, model: str, payload: Any, t0: float,
           timeout: float = 300.0) -> tuple[dict, int]:
    """A decoded payload -> (response JSON, HTTP status); RequestError for bad requests."""
    reqs, is_batch = parse_payload(payload)
    futures = batcher.submit([r.question for r in reqs])
    answers = [_answer_json(r, f, model, t0, timeout) for r, f in zip(reqs, futures)]
    if not is_batch:
        return answers[0]
    return {"results": [a for a, _ in answers], "latency_ms": (time.perf_counter() - t0) * 1e3,
            "model": model}, 200


# ------------------------------------------------------------------------ HTTP


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "DecideServer"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet unless --verbose
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _send(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        if self.path == "/health":
            self._send(200, {"status": "ok", "model": self.server.model})
        elif self.path == "/stats":
            self._send(200, self.server.batcher.stats())
        else:
            self._send(404, {"error": {"field": "path", "message":
                                       f"unknown route GET {self.path} (GET /health, GET /stats, "
                                       "POST /decide)"}})

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        t0 = time.perf_counter()
        length = self.headers.get("Content-Length")
        if self.path != "/decide":
            # Drain the body so the connection stays usable.
            if length and length.isdigit() and int(length) <= MAX_BODY_BYTES:
                self.rfile.read(int(length))
            self._send(404, {"error": {"field": "path", "message":
                                       f"unknown route POST {self.path} (POST /decide)"}})
            return
        if length is None or not length.isdigit():
            self.close_connection = True
            self._send(411, {"error": {"field": "Content-Length",
                                       "message": "a Content-Length header is required"}})
            return
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, {"error": {"field": "body", "message":
                                       f"body of {length} bytes exceeds {MAX_BODY_BYTES}"}})
            return
        raw = self.rfile.read(int(length))
        try:
            out, status = answer(self.server.batcher, self.server.model, decode_body(raw), t0,
                                 self.server.answer_timeout)
        except RequestError as e:
            out, status = e.to_json(), 400
        self._send(status, out)


class DecideServer(ThreadingHTTPServer):
    """The HTTP endpoint; ``server_address`` gives the bound (host, port)."""

    daemon_threads = True
    request_queue_size = 128   # listen backlog: many clients connect at once (default 5 resets)

    def __init__(self, batcher: MicroBatcher, model: str, host: str = "127.0.0.1",
                 port: int = 0, *, verbose: bool = False, answer_timeout: float = 300.0):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535] (0: a free one), got "
                             f"{port!r}")
        if not (isinstance(answer_timeout, (int, float)) and math.isfinite(answer_timeout)
                and answer_timeout > 0):
            raise ValueError(f"answer_timeout must be a finite number of seconds > 0, got "
                             f"{answer_timeout!r}")
        self.batcher = batcher
        self.model = model
        self.verbose = verbose
        self.answer_timeout = answer_timeout
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


# ------------------------------------------------------------------------ stdio


def serve_stdio(batcher: MicroBatcher, model: str, lines: Iterable[str], out: TextIO,
                timeout: float = 300.0) -> int:
    """One JSON answer line per non-blank input line, in input order; returns the line count.

    A reader thread submits every line as soon as it is read, so lines piped together are
    micro-batched like concurrent HTTP requests.
    """
    pending: queue.Queue = queue.Queue()

    def reader() -> None:
        try:
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                t0 = time.perf_counter()
                try:
                    reqs, is_batch = parse_payload(decode_body(line))
                except RequestError as e:
                    pending.put((lineno, t0, e, None))
                    continue
                pending.put((lineno, t0, (reqs, is_batch),
                             batcher.submit([r.question for r in reqs])))
        finally:
            pending.put(None)

    threading.Thread(target=reader, name="jaxdm-decide-stdin", daemon=True).start()
    n = 0
    while (item := pending.get()) is not None:
        lineno, t0, parsed, futures = item
        if isinstance(parsed, RequestError):
            obj = parsed.to_json()
            obj["error"]["line"] = lineno
        else:
            reqs, is_batch = parsed
            answers = [_answer_json(r, f, model, t0, timeout)[0] for r, f in zip(reqs, futures)]
            obj = answers[0] if not is_batch else {
                "results": answers, "latency_ms": (time.perf_counter() - t0) * 1e3,
                "model": model}
        out.write(json.dumps(obj) + "\n")
        out.flush()
        n += 1
    return n


# -------------------------------------------------------------------------- CLI


def backend_from_spec(spec: str) -> tuple[str, DecisionModel]:
    """'oracle', 'smollm2', an HF model folder, or 'kind:key=value,...' -> (name, backend)."""
    from jaxdm.screen.run import JUDGE_ALIASES, build_judges

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
                                   "--serve = HTTP POST /decide on 127.0.0.1, --stdio = one "
                                   "JSON object per line on stdin, one answer per line on stdout.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--serve", action="store_true", help="HTTP server (POST /decide)")
    mode.add_argument("--stdio", action="store_true", help="JSON lines on stdin/stdout")
    p.add_argument("--backend", default="smollm2", metavar="SPEC",
                   help="'smollm2' (default), 'oracle', a model folder, or 'kind:key=value,...' "
                        "(e.g. remote:base_url=http://127.0.0.1:8000/v1,model=m)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8088, help="port (0 = a free port; default 8088)")
    p.add_argument("--max-batch", type=int, default=32,
                   help="most questions per backend call (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a batch waits for more questions after its first (default 5)")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request to stderr")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the subcommand parsed by ``add_parser``; returns the exit code."""
    try:
        name, backend = backend_from_spec(args.backend)
        batcher = MicroBatcher(backend, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"jaxdm decide: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.stdio:
            print(f"jaxdm decide: {name} reading JSON lines on stdin", file=sys.stderr, flush=True)
            serve_stdio(batcher, name, sys.stdin, sys.stdout)
            return 0
        try:
            server = DecideServer(batcher, name, args.host, args.port, verbose=args.verbose)
        except ValueError as e:
            print(f"jaxdm decide: error: --port: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"jaxdm decide: error: cannot bind {args.host}:{args.port}: {e}",
                  file=sys.stderr)
            return 2
        print(f"jaxdm decide: serving {name} on {server.url} (POST /decide)", file=sys.stderr,
              flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0
    finally:
        batcher.close()


__all__ = ["RequestError", "Request", "parse_payload", "decode_body", "BackendError",
           "MicroBatcher", "answer", "DecideServer", "serve_stdio", "backend_from_spec",
           "add_parser", "run"]
