"""RemoteLLM against a real OpenAI-compatible tool-calling server on 127.0.0.1: native tool
calls, harness questions through the answer tool, 5xx retries, timeouts, bad replies, the API
key from an env var only, and a whole DECISION GYM episode driven over HTTP."""
from __future__ import annotations

import http.server
import json
import re
import threading
import time

import pytest

from jaxdm.envs.decision_gym import DecisionGym, GymParams, tool_schemas
from jaxdm.harness import Delegation, Harness, NoisyOracle, RemoteLLM
from jaxdm.harness.agent import openai_tool
from jaxdm.harness.llm_call import ANSWER_TOOL, HeldQuestion, LLMRequest
from jaxdm.roles.harness import memory_question

KEY_ENV = "JAXDM_TEST_HARNESS_KEY"
SECRET = "sk-harness-secret-9"


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out first (the timeout test)

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = body["model"]
        with srv.lock:
            srv.log.append((self.path, body, self.headers.get("Authorization")))
            srv.calls[model] = srv.calls.get(model, 0) + 1
            n = srv.calls[model]
        if model == "slow":
            time.sleep(0.5)
        if model == "flaky503" and n <= 2:
            return self._send(503, {"error": "overloaded"})
        if model == "err400":
            return self._send(400, {"error": "bad request"})
        usage = {"prompt_tokens": 1200, "completion_tokens": 40}
        if model == "chatty":  # answers in prose, no tool call
            return self._send(200, {"choices": [{"message": {"content": "Let me think."}}],
                                    "usage": usage})
        calls = []
        names = [t["function"]["name"] for t in body.get("tools", [])]
        choice = body.get("tool_choice")
        user = body["messages"][-1]["content"]
        env_tools = [t for t in names if t != ANSWER_TOOL]
        if env_tools:
            if isinstance(choice, dict):
                name = choice["function"]["name"]
            elif "ask_customer" in env_tools and "O-" not in user.split("Conversation:")[-1]:
                name = "ask_customer"
            else:
                name = "find_customer" if "find_customer" in env_tools else env_tools[0]
            email = re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+", user.split("Conversation:")[-1])
            args = {"find_customer": {"query": email[0] if email else "C-0000"},
                    "ask_customer": {"about": "order_id", "question": "Which order?"}
                    }.get(name, {})
            arguments = "{not json" if model == "badargs" else json.dumps(args)
            calls.append({"id": "c1", "type": "function",
                          "function": {"name": name, "arguments": arguments}})
        if ANSWER_TOOL in names:
            schema = body["tools"][names.index(ANSWER_TOOL)]["function"]["parameters"]
            calls.append({"id": "c2", "type": "function", "function": {
                "name": ANSWER_TOOL, "arguments": json.dumps(
                    {k: v["enum"][0] for k, v in schema["properties"].items()})}})
        self._send(200, {"choices": [{"message": {"content": None, "tool_calls": calls}}],
                         "usage": usage})


@pytest.fixture()
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.lock, srv.log, srv.calls = threading.Lock(), [], {}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _llm(srv, model, **kw):
    return RemoteLLM(f"http://127.0.0.1:{srv.server_address[1]}/v1", model, **kw)


def _request(**kw):
    tools = tuple(openai_tool(s) for s in tool_schemas()[:8])
    return LLMRequest(prompt="Conversation:\nCustomer: I am ann@x.org, where is order O-12345?",
                      tools=tools, **kw)


def test_native_tool_call_usage_price_and_key(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    llm = _llm(server, "toolcaller", api_key_env=KEY_ENV, price_per_1k_in=0.5,
               price_per_1k_out=2.0)
    r = llm.act(_request())
    assert r.ok and r.tool == "find_customer" and r.args == {"query": "ann@x.org"}
    assert (r.tokens_in, r.tokens_out) == (1200, 40)
    assert r.usd == pytest.approx(1.2 * 0.5 + 0.04 * 2.0) and r.seconds > 0
    path, body, auth = server.log[-1]
    assert path == "/v1/chat/completions" and auth == f"Bearer {SECRET}"
    assert body["tool_choice"] == "required" and len(body["tools"]) == 8
    assert body["tools"][0]["type"] == "function"
    assert SECRET not in repr(llm) and SECRET not in json.dumps(body)


def test_forced_tool_and_harness_questions(server):
    q = memory_question("ctx", answer=[0])
    r = _llm(server, "toolcaller").act(_request(
        forced_tool="get_order", questions=(HeldQuestion("memory", q, (1,)),)))
    assert r.ok and r.tool == "get_order"
    assert r.answers == (1,)  # only option 1 was allowed and the server picked it
    body = server.log[-1][1]
    assert ANSWER_TOOL in [t["function"]["name"] for t in body["tools"]]
    r2 = _llm(server, "toolcaller").act(LLMRequest(
        prompt="x", questions=(HeldQuestion("memory", q),)))
    assert r2.ok and r2.tool is None and r2.answers == (0,)
    assert server.log[-1][1]["tool_choice"]["function"]["name"] == ANSWER_TOOL


def test_5xx_is_retried_then_succeeds(server):
    r = _llm(server, "flaky503", backoff=0.01).act(_request())
    assert r.ok and r.tool == "find_customer"
    assert server.calls["flaky503"] == 3
    r400 = _llm(server, "err400", backoff=0.01).act(_request())
    assert not r400.ok and "HTTP 400" in r400.error and server.calls["err400"] == 1


def test_timeout_and_bad_replies_are_failures(server):
    r = _llm(server, "slow", timeout=0.1, max_retries=1, backoff=0.01).act(_request())
    assert not r.ok and "timeout" in r.error
    r = _llm(server, "chatty").act(_request())
    assert not r.ok and "no call to an offered tool" in r.error
    r = _llm(server, "badargs").act(_request())
    assert not r.ok and "not JSON" in r.error


def test_a_gym_episode_over_http_with_a_cascade(server):
    env, params = DecisionGym(), GymParams(split="test", max_steps=4)
    h = Harness(_llm(server, "toolcaller"), NoisyOracle(seed=0),
                [Delegation("params", "cascade", 0.9)])
    ep = h.run_task(env, 0, params)
    assert ep.steps >= 1 and ep.llm_calls >= 1 and ep.llm_failures == 0
    assert all(c.tokens_in == 1200 for c in ep.calls if c.kind == "llm")
    sent = [b for p, b, _ in server.log if b["model"] == "toolcaller"]
    assert len(sent) == ep.llm_calls and all(len(b["tools"]) == 69 for b in sent)
