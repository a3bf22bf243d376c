"""`jaxdm decide`: a real HTTP server on 127.0.0.1 (good and bad requests, 16 concurrent
clients sharing backend calls), the micro-batcher, and both CLI modes as real processes."""
import http.client
import http.server
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading

import pytest

from jaxdm.decide import backend_from_spec
from jaxdm.decide.scheduler import MicroBatcher
from jaxdm.decide.server import DecideServer
from jaxdm.decision import MultipleChoice, Oracle

OPTS = [f"tool_{k}" for k in range(8)]


def _req(i, **kw):
    return {"context": f"customer {i} wants a refund", "question": "Which tool next?",
            "options": OPTS, "meta": {"oracle_answer": OPTS[i % 8]}, **kw}


@pytest.fixture
def server():
    batcher = MicroBatcher(Oracle(noise=0.0), max_batch=32, max_wait_ms=100.0)
    srv = DecideServer(batcher, "oracle", "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    batcher.close()


def _call(srv, method, path, body=None, raw=None, conn=None):
    c = conn or http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    if conn is None:
        c.close()
    return out


def test_good_single_and_batch_requests(server):
    status, out = _call(server, "POST", "/decide", _req(3, id="q-3"))
    assert status == 200
    assert out["choice"] == "tool_3" and out["index"] == 3 and out["id"] == "q-3"
    assert out["confidence"] == 1.0 and len(out["probs"]) == 8 and out["model"] == "oracle"
    assert out["latency_ms"] > 0
    status, out = _call(server, "POST", "/decide", {"requests": [_req(1), _req(6, id=6)]})
    assert status == 200 and [r["choice"] for r in out["results"]] == ["tool_1", "tool_6"]
    assert "id" not in out["results"][0] and out["results"][1]["id"] == 6
    assert _call(server, "GET", "/health") == (200, {"status": "ok", "model": "oracle",
                                                     "backend": {"state": "up"}})


@pytest.mark.parametrize("raw,field", [
    (b"{not json", "body"),
    (b"\xff\xfe", "body"),
    (b"[1, 2]", "body"),
    (json.dumps({"question": "q", "options": ["a"]}).encode(), "context"),
    (json.dumps({"context": "c", "question": "q", "options": []}).encode(), "options"),
    (json.dumps({"context": "c", "question": "q"}).encode(), "options"),
    (json.dumps({"context": "c", "question": 3, "options": ["a"]}).encode(), "question"),
    (json.dumps({"context": "c", "question": "q", "options": ["a", 1]}).encode(), "options[1]"),
    (json.dumps({"context": "c", "question": "q", "options": ["a", "a"]}).encode(), "options[1]"),
    (json.dumps({"context": "c", "question": "q", "options": ["a"], "temp": 1}).encode(), "temp"),
    (json.dumps({"requests": [{"context": "c", "question": "q", "options": ["a"]},
                              {"context": "c", "question": "q", "options": []}]}).encode(),
     "requests[1].options"),
    (json.dumps({"requests": []}).encode(), "requests"),
])
def test_bad_requests_name_the_field_and_server_keeps_serving(server, raw, field):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    status, out = _call(server, "POST", "/decide", raw=raw, conn=conn)
    assert status == 400 and out["error"]["field"] == field, out
    # Same keep-alive connection, then a fresh one: both still answered.
    assert _call(server, "POST", "/decide", _req(2), conn=conn)[1]["choice"] == "tool_2"
    conn.close()
    assert _call(server, "POST", "/decide", _req(5))[1]["choice"] == "tool_5"


def test_backend_failure_and_unknown_route(server):
    status, out = _call(server, "POST", "/decide", {"context": "c", "question": "q",
                                                    "options": ["a", "b"]})
    assert status == 422 and "oracle_answer" in out["error"]["message"]
    # In a batch only the failing question fails; its neighbour is answered.
    status, out = _call(server, "POST", "/decide", {"requests": [
        _req(4), {"context": "c", "question": "q", "options": ["a", "b"]}]})
    assert status == 200 and out["results"][0]["choice"] == "tool_4"
    assert "oracle_answer" in out["results"][1]["error"]["message"]
    assert _call(server, "POST", "/nope", {})[0] == 404
    assert _call(server, "GET", "/nope")[0] == 404


def test_16_concurrent_clients_share_backend_calls(server):
    barrier = threading.Barrier(16)
    answers = {}

    def client(i):
        conn = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
        barrier.wait()
        answers[i] = _call(server, "POST", "/decide", _req(i, id=i), conn=conn)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(answers[i][0] == 200 and answers[i][1]["id"] == i
               and answers[i][1]["choice"] == OPTS[i % 8] for i in range(16))
    stats = _call(server, "GET", "/stats")[1]
    assert stats["questions"] == 16 and stats["calls"] <= 4, stats   # 100 ms collection window
    assert stats["largest_batch"] >= 4


class _Recorder:
    """A real Oracle that also records the batch sizes it was called with."""

    def __init__(self):
        self.oracle, self.sizes, self.name = Oracle(), [], "recorder"

    def choose(self, qs):
        self.sizes.append(len(qs))
        return self.oracle.choose(qs)


def _mc(i, answer=True):
    return MultipleChoice(f"ctx {i}", "q", tuple(OPTS),
                          meta={"oracle_answer": OPTS[i % 8]} if answer else {})


def test_microbatcher_batches_splits_and_isolates_failures():
    rec = _Recorder()
    b = MicroBatcher(rec, max_batch=4, max_wait_ms=200.0)
    futs = b.submit([_mc(i) for i in range(10)])
    assert [f.result(10).choice for f in futs] == [i % 8 for i in range(10)]
    assert rec.sizes == [4, 4, 2]
    rec.sizes.clear()
    futs = b.submit([_mc(0), _mc(1, answer=False), _mc(2)])
    assert futs[0].result(10).choice == 0 and futs[2].result(10).choice == 2
    with pytest.raises(Exception, match="oracle_answer"):
        futs[1].result(10)
    assert rec.sizes == [3, 1, 2, 1, 1]   # the batch raised: halves retried until isolated
    b.close()
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(rec, max_batch=0)


# ------------------------------------------------------------------- CLI processes

def _cli(*args):
    return [sys.executable, "-m", "jaxdm.cli", "decide", *args]


def test_cli_stdio_json_lines():
    lines = [json.dumps(_req(1, id=1)), "", "{oops", json.dumps({"requests": [_req(2), _req(3)]}),
             json.dumps({"context": "c", "question": "q", "options": []})]
    p = subprocess.run(_cli("--stdio", "--backend", "oracle"), input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr      # some lines got error lines
    out = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(out) == 4
    assert out[0]["choice"] == "tool_1" and out[0]["id"] == 1
    assert out[1]["error"]["field"] == "body" and out[1]["error"]["line"] == 3
    assert [r["choice"] for r in out[2]["results"]] == ["tool_2", "tool_3"]
    assert out[3]["error"] == {"field": "options", "message": "is empty; give at least one option",
                               "line": 5}


def test_cli_serve_process_and_bad_backend():
    p = subprocess.Popen(_cli("--serve", "--port", "0", "--backend", "oracle"),
                         stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        banner = p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
        assert m, banner
        c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=30)
        c.request("POST", "/decide", body=json.dumps(_req(7)))
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["choice"] == "tool_7"
        c.request("POST", "/decide", body=b"{")
        r = c.getresponse()
        assert r.status == 400 and json.loads(r.read())["error"]["field"] == "body"
        c.close()
    finally:
        p.terminate()
        p.wait(timeout=30)
        p.stderr.close()
    bad = subprocess.run(_cli("--stdio", "--backend", "oracle:temperature=1"), input="",
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "temperature" in bad.stderr
    # a port outside [0, 65535] and a port in use are named errors, not tracebacks
    bad = subprocess.run(_cli("--serve", "--port", "99999", "--backend", "oracle"),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--port: port must be an integer in [0, 65535]" in bad.stderr
    assert "Traceback" not in bad.stderr
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        bad = subprocess.run(_cli("--serve", "--port", str(port), "--backend", "oracle"),
                             capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and f"cannot bind 127.0.0.1:{port}" in bad.stderr


def test_server_rejects_bad_port_and_timeout():
    b = MicroBatcher(Oracle())
    try:
        for port in (-1, 65536, 80.0, True):
            with pytest.raises(ValueError, match="port must be an integer"):
                DecideServer(b, "m", port=port)
        for t in (0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="answer_timeout"):
                DecideServer(b, "m", answer_timeout=t)
    finally:
        b.close()


# ------------------------------------------------------- a Remote backend behind decide

class _FakeOpenAI(http.server.BaseHTTPRequestHandler):
    """OpenAI-compatible chat completions: label 'B' most likely; model 'down' answers 500."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] == "down":
            data, code = b'{"error": "boom"}', 500
        else:
            top = {"A": math.log(0.2), "B": math.log(0.7), "C": math.log(0.1)}
            content = [{"token": "B", "logprob": top["B"], "top_logprobs": [
                {"token": k, "logprob": v} for k, v in top.items()]}]
            data, code = json.dumps({"choices": [{"message": {"content": "B"},
                                                  "logprobs": {"content": content}}],
                                     "usage": {"prompt_tokens": 50, "completion_tokens": 1}}
                                    ).encode(), 200
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.parametrize("model,status", [("fake", 200), ("down", 502)])
def test_remote_backend_spec_behind_the_endpoint(model, status):
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    name, backend = backend_from_spec(
        f"remote:base_url=http://127.0.0.1:{upstream.server_address[1]}/v1,model={model},"
        "max_retries=0")
    batcher = MicroBatcher(backend, max_wait_ms=20.0)
    srv = DecideServer(batcher, name, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        code, out = _call(srv, "POST", "/decide", {"context": "c", "question": "q",
                                                   "options": ["x", "y", "z"]})
        assert code == status and out["model"] == model
        if status == 200:
            assert out["choice"] == "y" and out["probs"] == pytest.approx([0.2, 0.7, 0.1])
        else:
            assert out["error"]["message"].startswith("backend failed")
    finally:
        for s in (srv, upstream):
            s.shutdown()
            s.server_close()
        batcher.close()
