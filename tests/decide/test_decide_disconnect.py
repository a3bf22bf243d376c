"""`jaxdm decide` drops the queued questions of a client that closed its connection (issue 41
§2): over real sockets on 127.0.0.1, a client sends a batch while the worker is busy and
hangs up; none of its questions reaches the backend, and the next client is served."""
import http.client
import json
import socket
import threading
import time

from jaxdm.decide.scheduler import MicroBatcher
from jaxdm.decide.server import DecideServer, peer_closed
from jaxdm.decision import Oracle

OPTS = ["a", "b", "c"]


class _Gated:
    """A real Oracle whose first call waits for ``release`` (the worker is busy meanwhile);
    records every context it is asked about."""

    name = "gated-oracle"

    def __init__(self):
        self.oracle, self.seen = Oracle(), []
        self.busy, self.release = threading.Event(), threading.Event()

    def choose(self, qs):
        if not self.busy.is_set():
            self.busy.set()
            assert self.release.wait(30)
        self.seen.extend(q.context for q in qs)
        return self.oracle.choose(qs)


def _req(ctx, i=0):
    return {"context": ctx, "question": "q", "options": OPTS,
            "meta": {"oracle_answer": OPTS[i % 3]}}


def _post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/decide", body=json.dumps(body).encode())
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    c.close()
    return out


def test_a_disconnected_clients_queued_questions_are_dropped():
    backend = _Gated()
    batcher = MicroBatcher(backend, max_batch=4, max_wait_ms=1.0)
    srv = DecideServer(batcher, "oracle", "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    port = srv.server_address[1]
    try:
        first = {}
        t = threading.Thread(target=lambda: first.update(r=_post(port, _req("first"))))
        t.start()
        assert backend.busy.wait(10)                # the worker is inside the first call
        body = json.dumps({"requests": [_req(f"gone {i}", i) for i in range(6)]}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /decide HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 10
            while batcher.stats()["waiting"] < 6 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert batcher.stats()["waiting"] == 6      # queued behind the busy worker
        # the socket is closed: the handler sees EOF within its poll interval
        deadline = time.monotonic() + 10
        while srv.stats()["disconnected_requests"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        backend.release.set()
        t.join(30)
        assert first["r"][0] == 200
        status, out = _post(port, _req("after", 1))   # the next client is served
        assert status == 200 and out["choice"] == "b"
        stats = srv.stats()
        assert stats["disconnected_requests"] == 1 and stats["disconnected_questions"] == 6
        assert stats["cancelled"] == 6 and stats["waiting"] == 0
        assert not any(c.startswith("gone") for c in backend.seen), backend.seen
        assert backend.seen == ["first", "after"]
    finally:
        backend.release.set()
        srv.shutdown()
        srv.server_close()
        batcher.close()


def test_peer_closed_sees_eof_but_not_pipelined_bytes():
    a, b = socket.socketpair()
    try:
        assert not peer_closed(a)                # open, nothing sent
        b.sendall(b"GET /health HTTP/1.1\r\n")   # a pipelined request is not a hang-up
        assert not peer_closed(a) and a.recv(64).startswith(b"GET")
        b.close()
        assert peer_closed(a)
    finally:
        a.close()
