"""Remote backend: base URLs with and without /v1, bad URLs, a dead server marked down
(issue 15 item 1/7), and an optional test against a real OpenAI-compatible server."""
from __future__ import annotations

import http.server
import json
import math
import os
import signal
import socket
import threading
import time

import pytest

from jaxdm.decision import Remote, YesNo, make_backend
from jaxdm.decision.remote import normalize_base_url


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers constrained Yes/No readouts on */chat/completions; model "err500" always 500."""

    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.server.delay)
        with self.server.lock:
            self.server.paths.append(self.path)
        if body["model"] == "err500":
            return self._send(500, {"error": "boom"})
        if not self.path.endswith("/v1/chat/completions") or "/v1/v1/" in self.path:
            return self._send(404, {"error": f"no route {self.path}"})
        top = [{"token": "Yes", "logprob": math.log(0.8)}, {"token": "No", "logprob": math.log(0.2)}]
        self._send(200, {"choices": [{"message": {"content": "Yes"},
                                      "logprobs": {"content": [{"token": "Yes", "logprob": -0.2,
                                                                "top_logprobs": top}]}}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 1}})


@pytest.fixture()
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.lock, srv.paths, srv.delay = threading.Lock(), [], 0.0
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _root(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}"


QS = [YesNo("context", "Answer Yes or No."), YesNo("context 2", "Answer Yes or No.")]


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(server, suffix):
    rm = Remote(_root(server) + suffix, "m", backoff=0.01)
    res = rm.score(QS)
    assert [r.ok for r in res] == [True, True], [r.error for r in res]
    assert res[0].score == pytest.approx(0.8)
    assert server.paths == ["/v1/chat/completions"] * 2


def test_base_url_with_a_path_prefix(server):
    """Hosted gateways put the API under a path: https://host/openai/v1 -> /openai/v1/..."""
    assert normalize_base_url("https://api.example.com/openai/v1") == "https://api.example.com/openai"
    rm = Remote(_root(server) + "/proxy/v1", "m", backoff=0.01)
    assert rm.score(QS[:1])[0].ok
    assert server.paths == ["/proxy/v1/chat/completions"]


def test_make_backend_accepts_the_openai_form(server):
    rm = make_backend({"kind": "remote", "base_url": _root(server) + "/v1", "model": "m",
                       "down_after": 2})
    assert rm.base_url == _root(server) and rm.down_after == 2


@pytest.mark.parametrize("url,msg", [
    ("127.0.0.1:8011", "must start with http:// or https://"),
    ("localhost:8011/v1", "must start with http:// or https://"),
    ("ftp://127.0.0.1/v1", "must start with http:// or https://"),
    ("http://", "has no host"),
    ("http:///v1", "has no host"),
    ("http://127.0.0.1:80x1/v1", "is not a valid URL"),
    ("http://127.0.0.1:99999", "is not a valid URL"),
    ("http://127.0.0.1:8000/v1?key=abc", "must not have a query"),
    ("", "non-empty http"),
])
def test_malformed_base_url_is_a_clear_error(url, msg):
    with pytest.raises(ValueError, match=msg):
        Remote(url, "m")


def test_credentials_in_a_bad_url_are_not_echoed():
    with pytest.raises(ValueError) as e:
        Remote("ftp://user:hunter2@host/v1", "m")
    assert "hunter2" not in str(e.value)


def test_non_finite_settings_are_rejected():
    with pytest.raises(ValueError, match="timeout"):
        Remote("http://127.0.0.1:1", "m", timeout=float("nan"))
    with pytest.raises(ValueError, match="price_per_1k_in must be a finite number"):
        Remote("http://127.0.0.1:1", "m", price_per_1k_in=float("inf"))


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_server_is_marked_down_after_n_connection_failures():
    rm = Remote(f"http://127.0.0.1:{_dead_port()}/v1", "m", max_retries=3, backoff=0.01,
                concurrency=2, down_after=3, timeout=2.0)
    qs = [YesNo("c", f"q{i}") for i in range(20)]
    res = rm.score(qs)
    assert not any(r.ok for r in res)
    assert rm.down is not None and "marked down after 3 consecutive connection failures" in rm.down
    # At most down_after attempts plus one per other thread already in flight, not
    # 20 questions x 4 attempts.
    assert 3 <= rm.stats["connection_failures"] <= 3 + rm.concurrency - 1
    assert sum("marked down" in r.error for r in res) >= len(qs) - rm.concurrency
    # Later calls (the next screen pass, the next iteration) fail at once without a request.
    before = rm.stats["connection_failures"]
    res2 = rm.score(qs[:5])
    assert all("marked down" in r.error for r in res2)
    assert rm.stats["connection_failures"] == before


def test_http_errors_never_mark_a_server_down(server):
    """A server that answers (even 500) is alive: only connection failures count."""
    rm = Remote(_root(server), "err500", max_retries=2, backoff=0.001, down_after=2)
    res = rm.score([YesNo("c", f"q{i}") for i in range(4)])
    assert all("HTTP 500" in r.error for r in res)
    assert rm.down is None and rm.stats["connection_failures"] == 0


def test_down_after_zero_never_marks_down():
    rm = Remote(f"http://127.0.0.1:{_dead_port()}", "m", max_retries=1, backoff=0.001,
                concurrency=1, down_after=0)
    res = rm.score([YesNo("c", f"q{i}") for i in range(3)])
    assert rm.down is None and rm.stats["connection_failures"] == 6
    assert all("connection error" in r.error for r in res)


def test_ctrl_c_does_not_wait_for_the_queued_questions(server):
    """KeyboardInterrupt in a batch cancels the questions not yet sent."""
    server.delay = 0.2
    rm = Remote(_root(server), "m", concurrency=1, backoff=0.01)
    with pytest.raises(KeyboardInterrupt):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        rm.score([YesNo("c", f"q{i}") for i in range(30)])
    sent = len(server.paths)
    time.sleep(0.5)
    assert len(server.paths) == sent < 10  # nothing sent after the interrupt, not 30


# ---- optional: a real OpenAI-compatible server (vLLM, llama.cpp server, SGLang) ---------------
REAL_URL = os.environ.get("JAXDM_TEST_OPENAI_URL")
REAL_MODEL = os.environ.get("JAXDM_TEST_OPENAI_MODEL", "smollm2")


@pytest.mark.skipif(not REAL_URL, reason="set JAXDM_TEST_OPENAI_URL (and JAXDM_TEST_OPENAI_MODEL) "
                                         "to a running OpenAI-compatible server")
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_real_openai_compatible_server(endpoint):
    """E.g. ``vllm serve ~/.cache/jaxdm/smollm2 --served-model-name smollm2 --port 8011``
    then JAXDM_TEST_OPENAI_URL=http://127.0.0.1:8011/v1. Both URL forms, both endpoints."""
    from dm_fixtures import small_trajectory

    from jaxdm.roles import judge_requests

    qs = judge_requests(small_trajectory(), "progress", "hindsight")[:3]
    root = normalize_base_url(REAL_URL)
    results = []
    for url in (root, root + "/v1"):
        rm = Remote(url, REAL_MODEL, endpoint=endpoint, timeout=120.0, max_retries=1,
                    down_after=2)
        res = rm.score(qs)
        assert rm.down is None, rm.down
        assert all(r.ok for r in res), [r.error for r in res]
        assert all(0.0 <= r.score <= 1.0 for r in res)
        assert all(r.cost.tokens_in > 0 for r in res)
        results.append([r.score for r in res])
    # Greedy first-token readout is deterministic on one server.
    assert results[0] == pytest.approx(results[1], abs=1e-4)
