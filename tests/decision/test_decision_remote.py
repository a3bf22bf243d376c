"""Remote backend against real HTTP servers on 127.0.0.1 (started by the tests)."""
from __future__ import annotations

import http.server
import json
import math
import threading
import time

import pytest
from dm_fixtures import small_trajectory

from jaxdm import roles
from jaxdm.decision import MultipleChoice, Remote, YesNo

KEY_ENV = "JAXDM_TEST_REMOTE_KEY"
SECRET = "sk-test-secret-123"


class _Handler(http.server.BaseHTTPRequestHandler):
    """Behaviour chosen by the request's "model" field."""

    server_version = "fake-openai/1"

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, code: int, body, headers: dict | None = None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.log.append((self.path, body, self.headers.get("Authorization")))
            srv.calls[body["model"]] = srv.calls.get(body["model"], 0) + 1
            n_calls = srv.calls[body["model"]]
        model = body["model"]
        chat = self.path == "/v1/chat/completions"
        usage = {"prompt_tokens": 100, "completion_tokens": 1}
        if model == "slow":
            time.sleep(0.6)
        if model == "err500":
            return self._send(500, {"error": "boom"})
        if model == "err400":
            return self._send(400, {"error": "bad request"})
        if model == "flaky429" and n_calls <= 2:
            return self._send(429, {"error": "slow down"}, {"Retry-After": "0"})
        if model == "malformed":
            return self._send(200, b"{not json")
        if srv.model_fn is not None and model == "jaxdm":
            text = body["prompt"] if not chat else None
            top = srv.model_fn(text, body["logprobs"])
            return self._send(200, {"choices": [{"text": "", "logprobs": {
                "top_logprobs": [top]}}], "usage": usage})
        if body["max_tokens"] == 1:   # constrained readout
            msgs = body.get("messages") or []
            yesno = "Yes or No" in json.dumps(msgs) or "Yes or No" in body.get("prompt", "")
            if model == "nolabels":
                top = {" the": -0.5, "I": -1.2}
            elif yesno:
                top = {"Yes": math.log(0.6), " No": math.log(0.2), "Maybe": math.log(0.2)}
            else:
                top = {"B": math.log(0.5), " A": math.log(0.3), "C": math.log(0.1), "x": -5.0}
            if chat:
                content = [{"token": "B", "logprob": top.get("B", -1.0), "top_logprobs": [
                    {"token": k, "logprob": v} for k, v in top.items()]}]
                return self._send(200, {"choices": [{"message": {"content": "B"},
                                                     "logprobs": {"content": content}}],
                                        "usage": usage})
            return self._send(200, {"choices": [{"text": "B", "logprobs": {
                "top_logprobs": [top]}}], "usage": usage})
        text = {"prompted-ok": '{"score": 0.25}', "prompted-bad": "I think yes!"}.get(
            model, '{"choice": "A", "probabilities": {"A": 0.9, "B": 0.1}}')
        if chat:
            return self._send(200, {"choices": [{"message": {"content": text}}], "usage": usage})
        return self._send(200, {"choices": [{"text": text}], "usage": usage})


@pytest.fixture()
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.lock = threading.Lock()
    srv.log, srv.calls, srv.model_fn = [], {}, None
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv):
    return f"http://127.0.0.1:{srv.server_address[1]}"


def _yesno():
    return roles.judge_requests(small_trajectory(), "progress", "hindsight")[:2]


def _choice():
    return MultipleChoice("ctx", "which?", ("go to a", "go to b", "look"))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_constrained_readout_and_cost(server, endpoint, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    rm = Remote(_url(server), "ok", endpoint=endpoint, api_key_env=KEY_ENV,
                price_per_1k_in=0.5, price_per_1k_out=2.0, backoff=0.01)
    s = rm.score(_yesno())
    # Yes 0.6, " No" 0.2 (whitespace stripped) -> 0.75
    assert [r.ok for r in s] == [True, True]
    assert s[0].score == pytest.approx(0.75)
    assert s[0].cost.tokens_in == 100 and s[0].cost.tokens_out == 1
    assert s[0].cost.usd == pytest.approx(100 / 1000 * 0.5 + 1 / 1000 * 2.0)
    assert s[0].cost.seconds > 0
    c = rm.choose([_choice()])[0]
    # B 0.5, A 0.3, C 0.1 -> normalised over the labels
    assert c.ok and c.choice == 1
    assert c.probs == pytest.approx((0.3 / 0.9, 0.5 / 0.9, 0.1 / 0.9))
    path, body, auth = server.log[0]
    assert auth == f"Bearer {SECRET}"
    assert body["max_tokens"] == 1
    if endpoint == "chat":
        assert path == "/v1/chat/completions" and body["logprobs"] is True
        assert body["top_logprobs"] == 20 and body["messages"][0]["role"] == "system"
    else:
        assert path == "/v1/completions" and body["logprobs"] == 20
        assert body["prompt"].endswith("Answer:\n\n### Assistant\n")
    assert SECRET not in repr(rm) and SECRET not in json.dumps(vars(rm), default=str)
    assert all(SECRET not in repr(r) for r in s)


def test_timeout_is_retried_then_fails(server):
    rm = Remote(_url(server), "slow", timeout=0.2, max_retries=2, backoff=0.01)
    t0 = time.perf_counter()
    r = rm.score(_yesno()[:1])[0]
    assert not r.ok and "timeout" in r.error and "3 attempts" in r.error
    assert server.calls["slow"] == 3 and rm.stats["retries"] == 2 and rm.stats["failures"] == 1
    assert time.perf_counter() - t0 < 5


def test_500_retried_with_backoff_then_fails(server):
    rm = Remote(_url(server), "err500", max_retries=3, backoff=0.05)
    t0 = time.perf_counter()
    res = rm.score(_yesno()[:1])
    elapsed = time.perf_counter() - t0
    assert not res[0].ok and "HTTP 500" in res[0].error
    assert server.calls["err500"] == 4
    assert elapsed >= 0.05 + 0.1 + 0.2 - 0.01   # exponential backoff: 0.05, 0.1, 0.2


def test_400_not_retried(server):
    rm = Remote(_url(server), "err400", backoff=0.01)
    r = rm.choose([_choice()])[0]
    assert not r.ok and "HTTP 400: bad request" in r.error and "bad request" in r.raw
    assert server.calls["err400"] == 1


def test_server_error_messages_are_named():
    """The HTTP error names what the server said: OpenAI's error shape, FastAPI's detail, a
    plain message; nothing for a body without one; long messages cut."""
    from jaxdm.decision.remote import server_message
    assert server_message('{"error": {"message": "too long: 9000 > 8192", "type": "x"}}') == \
        ": too long: 9000 > 8192"
    assert server_message('{"detail": [{"msg": "field required"}]}') == \
        ': [{"msg": "field required"}]'
    assert server_message('{"message": "no\\n such  model"}') == ": no such model"
    assert server_message("<html>oops</html>") == "" and server_message("[1]") == ""
    assert server_message('{"error": {"code": 1}}') == ""
    assert server_message('{"message": "' + "x" * 400 + '"}') == ": " + "x" * 300 + "..."


def test_429_then_success(server):
    rm = Remote(_url(server), "flaky429", max_retries=3, backoff=0.01)
    r = rm.score(_yesno()[:1])[0]
    assert r.ok and r.score == pytest.approx(0.75)
    assert server.calls["flaky429"] == 3


def test_malformed_json_and_missing_labels_are_failures(server):
    r = Remote(_url(server), "malformed", backoff=0.01).score(_yesno()[:1])[0]
    assert not r.ok and "malformed JSON" in r.error and r.raw == "{not json"
    rm = Remote(_url(server), "nolabels", backoff=0.01)
    r = rm.score(_yesno()[:1])[0]
    assert not r.ok and "none of the label tokens" in r.error
    c = rm.choose([_choice()])[0]
    assert not c.ok and c.probs is None


def test_connection_refused_is_a_failure():
    rm = Remote("http://127.0.0.1:9", "m", max_retries=1, backoff=0.01, timeout=1.0)
    r = rm.score([YesNo("c", "q")])[0]
    assert not r.ok and "connection error" in r.error


def test_prompted_interface(server):
    rm = Remote(_url(server), "prompted-ok", interface="prompted", backoff=0.01)
    assert rm.score(_yesno()[:1])[0].score == 0.25
    bad = Remote(_url(server), "prompted-bad", interface="prompted", backoff=0.01)
    r = bad.score(_yesno()[:1])[0]
    assert not r.ok and r.raw == "I think yes!" and bad.stats["parse_failures"] == 1
    c = Remote(_url(server), "prompted-choice", interface="prompted").choose(
        [MultipleChoice("c", "q", ("x", "y"))])[0]
    assert c.ok and c.choice == 0 and c.probs == pytest.approx((0.9, 0.1))


def test_bounded_concurrency_and_order(server):
    rm = Remote(_url(server), "slow", concurrency=4, timeout=5.0)
    qs = [YesNo("ctx", f"Answer Yes or No {i}") for i in range(8)]
    t0 = time.perf_counter()
    res = rm.score(qs)
    elapsed = time.perf_counter() - t0
    assert all(r.ok for r in res) and len(res) == 8
    assert 1.1 < elapsed < 3.0  # 8 requests x 0.6 s, 4 at a time -> about 1.2 s


def test_missing_key_env_is_an_error():
    with pytest.raises(ValueError, match="JAXDM_NOT_SET_KEY"):
        Remote("http://127.0.0.1:1", "m", api_key_env="JAXDM_NOT_SET_KEY")


def test_remote_serving_a_jaxdm_model_matches_local_readout(server):
    """The server runs the tiny jaxdm model's first-token distribution (all vocab ids)."""
    import jax
    import numpy as np
    from dm_fixtures import tiny_pretrained

    from jaxdm.decision.local import LocalReadout
    from jaxdm.models import decoder
    pre = tiny_pretrained()
    tok = pre.tokenizer

    # Byte-level BPE marks a leading space with "\u0120"; servers return the decoded text.
    names = [t.replace("\u0120", " ") for t in
             tok.convert_ids_to_tokens(list(range(pre.config.vocab_size)))]

    def model_fn(prompt, k):
        # Remote with the model's tokenizer sends the chat template's token ids
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt), prompt
        ids = prompt
        lg = decoder.logits(pre.params, pre.config, jax.numpy.asarray(ids))[-1]
        lp = np.asarray(jax.nn.log_softmax(lg))
        order = np.argsort(-lp)[:k]
        top = {}
        for i in order:   # first (most likely) surface form wins, as in a top-k list
            top.setdefault(names[i], float(lp[i]))
        return top

    server.model_fn = model_fn
    rm = Remote(_url(server), "jaxdm", endpoint="completions", tokenizer=tok,
                top_logprobs=pre.config.vocab_size, concurrency=1, label_match="exact")
    qs = _yesno()[:1]
    remote = [r.score for r in rm.score(qs)]
    local = [r.score for r in LocalReadout(pre).score(qs)]
    assert all(r is not None for r in remote)
    np.testing.assert_allclose(remote, local, atol=1e-4)
