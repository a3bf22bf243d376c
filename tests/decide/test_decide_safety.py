"""`jaxdm decide` on a network (issue 41, section 3), each bullet over real sockets on
127.0.0.1: API key, timeouts and the connection cap, bodies always read or the connection
closed, strict JSON, limits, fairness and cancellation, refused-question isolation, one write
per response, a remote backend that recovers, and --stdio that never loses its reader."""
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from jaxdm.decide.protocol import Limits
from jaxdm.decide.scheduler import MicroBatcher
from jaxdm.decide.server import DecideServer, exposure_warning
from jaxdm.decision import MultipleChoice, Oracle

OPTS = ["a", "b", "c"]


def _req(i=0, **kw):
    return {"context": f"ctx {i}", "question": "q", "options": OPTS,
            "meta": {"oracle_answer": OPTS[i % 3]}, **kw}


def _serve(backend=None, **kw):
    batcher = MicroBatcher(backend or Oracle(), max_batch=kw.pop("max_batch", 32),
                           max_wait_ms=kw.pop("max_wait_ms", 5.0))
    srv = DecideServer(batcher, "oracle", "127.0.0.1", 0, **kw)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return srv


@pytest.fixture
def make_server():
    made = []

    def make(backend=None, **kw):
        srv = _serve(backend, **kw)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.shutdown()
        srv.server_close()
        srv.batcher.close()


def _call(srv, method, path, body=None, raw=None, headers=None, conn=None):
    c = conn or http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    c.request(method, path, body=data, headers=headers or {})
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    if conn is None:
        c.close()
    return out


def _raw(srv, data: bytes, wait: float = 5.0) -> bytes:
    """Sends raw bytes, returns everything the server sends until it closes or goes quiet."""
    with socket.create_connection(srv.server_address[:2], timeout=wait) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pass
    return got


# ------------------------------------------------------------------ API key

def test_api_key_on_every_route_but_health(make_server, capfd):
    srv = make_server(api_key="s3cret-key", verbose=True)
    assert _call(srv, "GET", "/health")[0] == 200
    for method, path, body in (("POST", "/decide", _req()), ("GET", "/stats", None),
                               ("GET", "/ready", None), ("GET", "/v1/models", None),
                               ("POST", "/v1/completions", {"prompt": "x"})):
        status, out = _call(srv, method, path, body)
        assert status == 401, (path, out)
        status, out = _call(srv, method, path, body,
                            headers={"Authorization": "Bearer wrong-key"})
        assert status == 401
    # OpenAI routes answer in the OpenAI error shape
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["code"] == "invalid_api_key"
    status, out = _call(srv, "POST", "/decide", _req(1),
                        headers={"Authorization": "Bearer s3cret-key"})
    assert status == 200 and out["choice"] == "b"
    assert "s3cret-key" not in capfd.readouterr().err     # --verbose logs no header


def test_exposure_warning():
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("::1", None) is None and exposure_warning("localhost", None) is None
    assert "without --api-key" in exposure_warning("0.0.0.0", None)
    assert exposure_warning("0.0.0.0", "k") is None


def test_cli_reads_the_key_from_the_environment_and_warns_on_public_bind():
    env = {**os.environ, "JAXDM_API_KEY": "env-key-123"}
    p = subprocess.Popen([sys.executable, "-m", "jaxdm.cli", "decide", "--serve", "--port", "0",
                          "--host", "0.0.0.0", "--backend", "oracle"], stderr=subprocess.PIPE,
                         text=True, env={k: v for k, v in env.items() if k != "JAXDM_API_KEY"})
    try:
        warning = p.stderr.readline()
        assert "without --api-key" in warning, warning
    finally:
        p.terminate()
        p.wait(timeout=30)
        p.stderr.close()
    p = subprocess.Popen([sys.executable, "-m", "jaxdm.cli", "decide", "--serve", "--port", "0",
                          "--backend", "oracle"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = p.stderr.readline()
        assert "API key required" in banner and "env-key-123" not in banner
        port = int(banner.split("127.0.0.1:")[1].split()[0])
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/stats")
        assert c.getresponse().status == 401
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/stats", headers={"Authorization": "Bearer env-key-123"})
        assert c.getresponse().status == 200
        c.close()
    finally:
        p.terminate()
        p.wait(timeout=30)
        p.stderr.close()


# ------------------------------------------------------------------ timeouts and the cap

def test_short_body_gets_408_and_frees_its_worker(make_server):
    srv = make_server(read_timeout=0.5)
    t0 = time.monotonic()
    got = _raw(srv, b"POST /decide HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"con")
    assert got.startswith(b"HTTP/1.1 408") and b"Connection: close" in got
    assert time.monotonic() - t0 < 4
    assert _call(srv, "POST", "/decide", _req(2))[1]["choice"] == "c"


def test_idle_keepalive_connections_are_closed(make_server):
    srv = make_server(idle_timeout=0.3)
    with socket.create_connection(srv.server_address[:2], timeout=5) as s:
        time.sleep(0.8)
        assert s.recv(10) == b""          # the server closed the idle connection


def test_connection_cap_answers_503_without_a_thread(make_server):
    srv = make_server(max_connections=4, idle_timeout=30)
    held = [socket.create_connection(srv.server_address[:2], timeout=5) for _ in range(4)]
    try:
        time.sleep(0.3)
        threads_before = threading.active_count()
        extra = [_raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(20)]
        assert all(e.startswith(b"HTTP/1.1 503") for e in extra)
        assert threading.active_count() <= threads_before + 1
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert _call(srv, "GET", "/health")[0] == 200
    stats = _call(srv, "GET", "/stats")[1]
    assert stats["refused_connections"] == 20 and stats["max_connections"] == 4


# ------------------------------------------------------------------ bodies and routes

def test_chunked_body_to_unknown_route_is_not_a_second_request(make_server):
    smuggled = b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n"
    got = _raw(srv := make_server(), b"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
               b"chunked\r\n\r\n" + hex(len(smuggled))[2:].encode() + b"\r\n" + smuggled
               + b"\r\n0\r\n\r\n")
    assert got.count(b"HTTP/1.1 ") == 1 and got.startswith(b"HTTP/1.1 411")
    assert b"calls" not in got                       # /stats was not answered
    # A Content-Length body to an unknown route is read, and the connection stays usable.
    c = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    assert _call(srv, "POST", "/nope", raw=b"GET /stats HTTP/1.1\r\n\r\n", conn=c)[0] == 404
    assert _call(srv, "POST", "/decide", _req(0), conn=c)[1]["choice"] == "a"
    c.close()


def test_routes_ignore_the_query_string(make_server):
    srv = make_server()
    assert _call(srv, "GET", "/health?x=1")[0] == 200
    assert _call(srv, "POST", "/decide?trace=1", _req(1))[1]["choice"] == "b"


# ------------------------------------------------------------------ strict JSON

@pytest.mark.parametrize("raw,needle", [
    (b'{"context": "c", "question": "q", "options": ["a"], "id": NaN}', "NaN"),
    (b'{"context": "c", "question": "q", "options": ["a"], "id": -Infinity}', "-Infinity"),
    (b'{"context": "c", "question": "q", "options": ["a"], "id": 1e400}', "infinity"),
    (b'{"context": "c", "question": "q", "options": ["a"], "id": ' + b"9" * 5000 + b"}",
     "digits"),
    (b"[" * 5000 + b"]" * 5000, "nested"),
    (b'{"meta": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}", "nested"),
])
def test_non_strict_json_is_a_named_400_and_the_server_keeps_serving(make_server, raw, needle):
    srv = make_server()
    c = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    status, out = _call(srv, "POST", "/decide", raw=raw, conn=c)
    assert status == 400 and out["error"]["field"] == "body" and needle in out["error"]["message"]
    assert _call(srv, "POST", "/decide", _req(1, id=7), conn=c)[1]["id"] == 7
    c.close()


def test_answers_are_strict_json(make_server):
    srv = make_server()
    c = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    c.request("POST", "/decide", body=json.dumps(_req(0, id=[1.5, {"k": None}])))
    text = c.getresponse().read().decode()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the answer"))
    c.close()


# ------------------------------------------------------------------ limits


def test_request_limits(make_server):
    srv = make_server(limits=Limits(max_body_bytes=4096, max_questions=3, max_options=4))
    status, out = _call(srv, "POST", "/decide", {"requests": [_req(i) for i in range(4)]})
    assert status == 400 and out["error"]["field"] == "requests" and "--max-questions" in \
        out["error"]["message"]
    status, out = _call(srv, "POST", "/decide", {"context": "c", "question": "q",
                                                 "options": list("abcde")})
    assert status == 400 and out["error"]["field"] == "options" and "--max-options" in \
        out["error"]["message"]
    got = _raw(srv, b"POST /decide HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 413") and b"--max-body-bytes" in got


def test_context_token_limit(make_server):
    from tests.decision.dm_fixtures import tiny_pretrained

    from jaxdm.decision.local import LocalReadout
    srv = make_server(LocalReadout(tiny_pretrained()), limits=Limits(max_context_tokens=8))
    status, out = _call(srv, "POST", "/decide", {"requests": [
        {"context": "short", "question": "q", "options": ["x", "y"]},
        {"context": "a much longer context than eight tokens of the tokenizer, surely",
         "question": "q", "options": ["x", "y"]}]})
    assert status == 400 and out["error"]["field"] == "requests[1].context"
    assert "--max-context-tokens" in out["error"]["message"]


# ------------------------------------------------------------------ scheduling

class _Slow:
    """A real Oracle that takes 50 ms per call and records every batch's contexts."""

    name = "slow-oracle"

    def __init__(self):
        self.oracle, self.batches = Oracle(), []

    def choose(self, qs):
        time.sleep(0.05)
        self.batches.append([q.context for q in qs])
        return self.oracle.choose(qs)


def test_a_large_batch_is_interleaved_with_other_clients(make_server):
    backend = _Slow()
    srv = make_server(backend, max_batch=8, max_wait_ms=20.0)
    big = {"requests": [_req(i) | {"context": f"big {i}"} for i in range(200)]}
    out = {}
    t = threading.Thread(target=lambda: out.update(big=_call(srv, "POST", "/decide", big)))
    t.start()
    time.sleep(0.15)                    # the big batch is being answered, 8 at a time
    t0 = time.monotonic()
    small = _call(srv, "POST", "/decide", _req(2) | {"context": "small"})
    small_wait = time.monotonic() - t0
    t.join()
    assert small[0] == 200 and out["big"][0] == 200
    assert all(r["choice"] == OPTS[i % 3] for i, r in enumerate(out["big"][1]["results"]))
    at = next(i for i, b in enumerate(backend.batches) if "small" in b)
    assert at < len(backend.batches) - 5   # answered long before the big batch ended
    assert small_wait < 1.0, small_wait    # the big batch alone takes 25 calls x 50 ms


def test_a_timed_out_clients_questions_are_cancelled(make_server):
    backend = _Slow()
    srv = make_server(backend, max_batch=4, max_wait_ms=1.0, answer_timeout=0.2)
    status, out = _call(srv, "POST", "/decide", {"requests": [_req(i) for i in range(100)]})
    timed_out = [r for r in out["results"] if "answer timeout" in
                 r.get("error", {}).get("message", "")]
    assert status == 200 and len(timed_out) > 50
    time.sleep(0.3)
    stats = _call(srv, "GET", "/stats")[1]
    assert stats["cancelled"] > 50 and stats["calls"] < 15, stats
    assert stats["waiting"] == 0


class _CountingReadout:
    """A real LocalReadout wrapper counting backend calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.name, self.refusal = inner.name, inner.refusal

    def choose(self, qs):
        self.calls += 1
        return self.inner.choose(qs)


def test_a_refused_question_does_not_unbatch_its_neighbours():
    from tests.decision.dm_fixtures import tiny_pretrained

    from jaxdm.decision.local import LocalReadout
    backend = _CountingReadout(LocalReadout(tiny_pretrained()))
    b = MicroBatcher(backend, max_batch=32, max_wait_ms=200.0)
    good = [MultipleChoice(f"ctx {i}", "q", ("x", "y")) for i in range(6)]
    bad = MultipleChoice("ctx", "q", tuple(f"o{k}" for k in range(30)))
    futs = b.submit(good[:3] + [bad] + good[3:])
    results = [f.exception(60) or f.result() for f in futs]
    b.close()
    assert "30 options" in str(results[3]) and getattr(results[3], "status", None) == 422
    assert all(r.ok for i, r in enumerate(results) if i != 3)
    assert backend.calls == 1        # the six good questions in one call, the bad one in none


def test_failing_batches_are_halved_not_unbatched():
    calls = []

    class _Rec:
        name = "rec"

        def choose(self, qs):
            calls.append(len(qs))
            return Oracle().choose(qs)

    b = MicroBatcher(_Rec(), max_batch=32, max_wait_ms=200.0)
    qs = [MultipleChoice(f"c{i}", "q", ("x", "y"), meta={"oracle_answer": "x"})
          for i in range(32)]
    qs[17] = MultipleChoice("c17", "q", ("x", "y"))      # the Oracle raises for this one
    futs = b.submit(qs)
    assert sum(f.exception(30) is not None for f in futs) == 1 and futs[17].exception()
    b.close()
    assert len(calls) <= 11 and calls[0] == 32            # 1 + 2 log2(32), not 33


# ------------------------------------------------------------------ one write per response

def test_one_write_per_response_and_nodelay(make_server):
    srv = make_server()
    with socket.create_connection(srv.server_address[:2], timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = json.dumps(_req(1)).encode()
        req = (b"POST /decide HTTP/1.1\r\nHost: x\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n\r\n" + body)
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            s.sendall(req)
            got = b""
            while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < int(
                    got.split(b"Content-Length: ")[1].split(b"\r\n")[0]):
                got += s.recv(65536)
            times.append(time.perf_counter() - t0)
    times.sort()
    # Nagle + delayed ACK cost ~40 ms per keep-alive request; the oracle answers in < 10 ms.
    assert times[len(times) // 2] < 0.03, times


# ------------------------------------------------------------------ --stdio

def test_stdio_answers_every_line_and_exits_honestly():
    lines = [json.dumps(_req(0, id=1)).encode(), b"[" * 5000 + b"]" * 5000,
             b'{"context": "c", "question": "q", "options": ["a"], "id": ' + b"7" * 5000 + b"}",
             b"\xff\xfe not utf-8", json.dumps(_req(2, id=4)).encode()]
    p = subprocess.run([sys.executable, "-m", "jaxdm.cli", "decide", "--stdio", "--backend",
                        "oracle"], input=b"\n".join(lines) + b"\n", capture_output=True,
                       timeout=120)
    out = [json.loads(x) for x in p.stdout.decode().splitlines()]
    assert len(out) == 5, p.stdout
    assert out[0]["id"] == 1 and out[4]["id"] == 4 and out[4]["choice"] == "c"
    assert [o["error"]["line"] for o in out[1:4]] == [2, 3, 4]
    assert "nested" in out[1]["error"]["message"] and "digits" in out[2]["error"]["message"]
    assert p.returncode == 1, p.stderr
    ok = subprocess.run([sys.executable, "-m", "jaxdm.cli", "decide", "--stdio", "--backend",
                         "oracle"], input=lines[0] + b"\n", capture_output=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["id"] == 1
