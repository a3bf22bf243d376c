"""The HTTP server of `jaxdm decide` (standard library ``http.server``, one thread per
connection, bounded).

Safety on a network:
- ``api_key``: every route but ``GET /health`` needs ``Authorization: Bearer <key>``
  (compared with ``hmac.compare_digest``; the key is never logged or echoed; a refused
  request gets 401 and its connection is closed unread).
- Per connection: an idle timeout for the next request on a keep-alive connection, a read
  timeout for the rest of a request (its headers and body; a body shorter than its
  Content-Length gets 408 when the timeout passes, and the connection is closed), and at most
  ``max_connections`` open at once (the next ones get 503 at once, from the accepting thread).
- Every request body is read whole or its connection closed after the answer: a chunked or
  oversized body, or a body without a valid Content-Length, is never parsed as a next
  request. Routes match the path without its query string.
- A client that closes its connection while its questions wait has them dropped: the
  waiting handler polls its socket (``peer_closed``, every ``answers.DISCONNECT_POLL_S``) and
  cancels the questions still queued, so they never reach the backend
  (``disconnected_requests`` / ``disconnected_questions`` in ``/stats``).
- One write per response (status line, headers and body together) on a TCP_NODELAY socket:
  a keep-alive client does not wait for Nagle plus delayed ACK (~40 ms) on each request.

Why ``http.server`` and not an ASGI stack (Starlette + uvicorn): measured with
``benchmarks/decide_http_stack.py`` (keep-alive latency of one client, throughput of 16
clients, same answer function); uvicorn also bounds no request body read (a body shorter than
its Content-Length holds its request until the client leaves), which this server does.
"""
from __future__ import annotations

import hmac
import ipaddress
import math
import select
import socket
import threading
import time
import urllib.parse
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jaxdm.decide.answers import ClientGone, answer, backend_state
from jaxdm.decide.openai_routes import OpenAIError, Routes
from jaxdm.decide.protocol import Limits, RequestError, decode_body, encode_json
from jaxdm.decide.scheduler import MicroBatcher

OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/score")
GET_ROUTES = ("/health", "/ready", "/stats", "/v1/models")


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning when ``host`` is reachable from other machines and no API key is set."""
    if api_key:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"warning: binding {host} without --api-key (or JAXDM_API_KEY): anyone who can "
            "reach this address can use the decision service")


class _BodyError(Exception):
    """The request body cannot be read; the connection closes after the answer."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def peer_closed(sock: socket.socket) -> bool:
    """Whether the other end of a connected socket has closed it (EOF or an error pending),
    without consuming a byte a pipelining client sent. A client that half-closes its side
    after its request counts as gone, as in the ASGI servers' ``http.disconnect``."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):   # reset, or already closed here
        return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "DecideServer"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        # Waiting for the next request on a kept-alive connection: the idle timeout.
        self.connection.settimeout(self.server.idle_timeout)
        super().handle_one_request()

    def parse_request(self) -> bool:
        # The request line came in: the rest of the request has the read timeout.
        self.connection.settimeout(self.server.read_timeout)
        return super().parse_request()

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet unless --verbose
        if self.server.verbose:
            super().log_message(fmt, *args)

    # ---- writing ----------------------------------------------------------------------------
    def _send(self, status: int, obj: Any, extra: dict | None = None) -> None:
        """The whole response in one write (see the module docstring)."""
        body = encode_json(obj)
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        head = [f"HTTP/1.1 {status} {phrase}", f"Date: {formatdate(usegmt=True)}",
                "Server: jaxdm-decide", "Content-Type: application/json",
                f"Content-Length: {len(body)}"]
        for key, value in (extra or {}).items():
            head.append(f"{key}: {value}")
        if self.close_connection:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.log_request(status)

    def _error(self, status: int, route: str, message: str, field: str | None = "body",
               code: str | None = None, extra: dict | None = None) -> None:
        if route.startswith("/v1/"):
            kind = {401: "authentication_error", 404: "not_found_error"}.get(
                status, "invalid_request_error" if status < 500 else "server_error")
            obj = OpenAIError(message, status=status, type=kind, param=field,
                              code=code).to_json()
        else:
            obj = {"error": {"field": field, "message": message}}
        self._send(status, obj, extra)

    # ---- reading ----------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        """The whole body, or _BodyError (the connection is then closed)."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            raise _BodyError(411, "Transfer-Encoding", "chunked bodies are not accepted; send "
                                                       "a Content-Length")
        length = self.headers.get("Content-Length")
        if length is None:
            if self.command == "POST":
                self.close_connection = True
                raise _BodyError(411, "Content-Length", "a Content-Length header is required")
            return b""
        if not length.isdigit():
            self.close_connection = True
            raise _BodyError(400, "Content-Length", f"not a byte count: {length[:40]!r}")
        n = int(length)
        if n > self.server.limits.max_body_bytes:
            self.close_connection = True
            raise _BodyError(413, "body", f"body of {n} bytes exceeds the server's limit of "
                                          f"{self.server.limits.max_body_bytes} "
                                          "(--max-body-bytes)")
        deadline = time.monotonic() + self.server.read_timeout
        chunks, got = [], 0
        try:
            while got < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(n - got, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except (TimeoutError, OSError):
            pass
        if got < n:
            self.close_connection = True
            raise _BodyError(408, "body", f"got {got} of {n} body bytes within the read "
                                          f"timeout ({self.server.read_timeout:g} s)")
        return b"".join(chunks)

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                key.encode())
        return ok

    # ---- routing ----------------------------------------------------------------------------
    def _route(self) -> None:
        route = urllib.parse.urlsplit(self.path).path
        known = GET_ROUTES if self.command == "GET" else ("/decide",) + OPENAI_ROUTES
        if route != "/health" and not self._authorized():
            length = self.headers.get("Content-Length", "")
            if self.headers.get("Transfer-Encoding") is None and length.isdigit() \
                    and int(length) <= 65536:
                try:
                    self._read_body()      # a small body is read: the connection stays usable
                except _BodyError:
                    pass
            else:
                self.close_connection = True   # a large or chunked body stays unread
            self._error(401, route, "missing or wrong API key (Authorization: Bearer <key>)",
                        field="Authorization", code="invalid_api_key",
                        extra={"WWW-Authenticate": "Bearer"})
            return
        try:
            raw = self._read_body()
        except _BodyError as e:
            self._error(e.status, route, e.message, field=e.field)
            return
        if route not in known:
            self._error(404, route, f"unknown route {self.command} {route} (GET "
                                    f"{', '.join(GET_ROUTES)}; POST /decide, "
                                    f"{', '.join(OPENAI_ROUTES)})", field="path")
            return
        srv = self.server
        if self.command == "GET":
            self._get(route)
            return
        t0 = time.perf_counter()
        if route == "/decide":
            try:
                out, status = answer(srv.batcher, srv.model, decode_body(raw), t0,
                                     srv.answer_timeout, srv.limits, self.client_address,
                                     gone=lambda: peer_closed(self.connection))
            except RequestError as e:
                out, status = e.to_json(), e.status
            except ClientGone as e:
                # its queued questions were dropped; nobody is left to answer
                srv.count("disconnected_requests")
                srv.count("disconnected_questions", e.cancelled)
                self.close_connection = True
                return
            self._send(status, out)
            return
        try:
            payload = decode_body(raw)
            handler = {"/v1/completions": srv.routes.completions,
                       "/v1/chat/completions": srv.routes.chat,
                       "/v1/score": srv.routes.score}[route]
            self._send(200, handler(payload))
        except RequestError as e:
            self._error(400, route, e.message, field=e.field)
        except OpenAIError as e:
            self._send(e.status, e.to_json())

    def _get(self, route: str) -> None:
        srv = self.server
        state = backend_state(srv.batcher.backend)
        if route == "/health":
            self._send(200, {"status": "ok", "model": srv.model, "backend": state})
        elif route == "/ready":
            ready = state.get("state") == "up"
            self._send(200 if ready else 503, {"ready": ready, "model": srv.model,
                                               "backend": state})
        elif route == "/stats":
            self._send(200, srv.stats())
        else:
            self._send(200, srv.routes.models())

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._route()

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        self._route()

    def _other(self) -> None:
        route = urllib.parse.urlsplit(self.path).path
        self.close_connection = True   # a body it may carry stays unread
        self._error(405, route, f"method {self.command} is not served (GET, POST)",
                    field="method")

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _other  # noqa: N815


class DecideServer(ThreadingHTTPServer):
    """The HTTP endpoint; ``server_address`` gives the bound (host, port). See the module
    docstring for the API key, timeouts, the connection cap and the limits."""

    daemon_threads = True
    request_queue_size = 128   # listen backlog: many clients connect at once (default 5 resets)

    def __init__(self, batcher: MicroBatcher, model: str, host: str = "127.0.0.1",
                 port: int = 0, *, verbose: bool = False, answer_timeout: float = 300.0,
                 api_key: str | None = None, limits: Limits = Limits(),
                 read_timeout: float = 30.0, idle_timeout: float = 60.0,
                 max_connections: int = 256, max_logprobs: int = 20):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535] (0: a free one), got "
                             f"{port!r}")
        for name, value in (("answer_timeout", answer_timeout), ("read_timeout", read_timeout),
                            ("idle_timeout", idle_timeout)):
            if isinstance(value, bool) or not (isinstance(value, (int, float))
                                               and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got "
                                 f"{value!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
                or max_connections < 1:
            raise ValueError(f"max_connections must be an integer >= 1, got "
                             f"{max_connections!r}")
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise ValueError("api_key must be a non-empty string (or None for no key)")
        self.batcher = batcher
        self.model = model
        self.verbose = verbose
        self.answer_timeout = float(answer_timeout)
        self.read_timeout = float(read_timeout)
        self.idle_timeout = float(idle_timeout)
        self.max_connections = max_connections
        self.api_key = api_key
        self.limits = limits
        self.routes = Routes(batcher.backend, model,
                             lambda fn: batcher.run(fn).result(timeout=self.answer_timeout),
                             limits=limits, max_logprobs=max_logprobs)
        self._open = 0
        self._counts = {"connections": 0, "refused_connections": 0,
                        "disconnected_requests": 0, "disconnected_questions": 0}
        self._lock = threading.Lock()
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        """The address the server listens on, as http://host:port."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def stats(self) -> dict:
        """Batching counters, connection counters, when the backend keeps one its prefix
        cache's (``cache_stats()``) under "prefix_cache", and when it counts its scoring work
        (a local backend's ``stats``: unique_tokens actually run, request_tokens a one-by-one
        scorer would run, cached_tokens read from the prefix cache, calls) under "scoring"."""
        out = self.batcher.stats()
        with self._lock:
            out.update(self._counts, open_connections=self._open,
                       max_connections=self.max_connections)
        backend = self.batcher.backend
        cache_stats = getattr(backend, "cache_stats", None)
        if callable(cache_stats):
            out["prefix_cache"] = cache_stats()
        scoring = getattr(backend, "stats", None)
        if isinstance(scoring, dict):
            out["scoring"] = dict(scoring)  # a copy: the batcher's thread adds to it
        return out

    def count(self, name: str, n: int = 1) -> None:
        """Adds ``n`` to the connection counter ``name`` (reported by ``stats``)."""
        with self._lock:
            self._counts[name] += n

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        """Accept a connection if fewer than max_connections are open (served on its own thread,
        counted); otherwise answer 503 with Retry-After at once on this thread and close it, so the
        cap holds under a flood."""
        with self._lock:
            full = self._open >= self.max_connections
            if not full:
                self._open += 1
                self._counts["connections"] += 1
            else:
                self._counts["refused_connections"] += 1
        if full:   # answered here, without a thread: the cap holds under a flood
            body = encode_json({"error": {"field": None, "message": "too many connections "
                                          f"(at most {self.max_connections}); retry later"}})
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                                b"application/json\r\nRetry-After: 1\r\nConnection: close\r\n"
                                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                                + body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        """Serve one accepted connection, then release its slot in the connection count."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open -= 1
