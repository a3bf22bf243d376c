"""jaxdm.client.DecideClient against a real `jaxdm decide` server on 127.0.0.1: answers,
retries while the server is not up yet, the server's errors by field, the API key, and a
harness loop asking at every step."""
import socket
import threading
import time

import pytest

from jaxdm.client import DecideClient, DecideError
from jaxdm.decide.scheduler import MicroBatcher
from jaxdm.decide.server import DecideServer
from jaxdm.decision import Oracle


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(port=0, **kw):
    srv = DecideServer(MicroBatcher(Oracle()), "oracle", "127.0.0.1", port, **kw)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return srv


def _stop(srv):
    srv.shutdown()
    srv.server_close()
    srv.batcher.close()


def test_client_answers_errors_by_field_and_retries_until_the_server_is_up(monkeypatch):
    port = _free_port()
    started = {}
    threading.Timer(0.6, lambda: started.update(srv=_start(port))).start()
    client = DecideClient(f"http://127.0.0.1:{port}", max_retries=5, backoff=0.2)
    try:
        d = client.decide("ctx", "q", ["a", "b"], id="s1", meta={"oracle_answer": "b"})
        assert d.choice == "b" and d.index == 1 and d.id == "s1" and d.model == "oracle"
        with pytest.raises(DecideError) as err:
            client.decide("ctx", "q", ["a", "a"])
        assert err.value.status == 400 and err.value.field == "options[1]"
        with pytest.raises(DecideError) as err:
            client.decide("ctx", "q", ["a", "b"])          # the Oracle refuses: no answer key
        assert err.value.status == 422 and "oracle_answer" in err.value.message
        many = client.decide_many([{"context": "c", "question": "q", "options": ["x", "y"],
                                    "meta": {"oracle_answer": "x"}},
                                   {"context": "c", "question": "q", "options": ["x", "y"]}])
        assert many[0].choice == "x" and isinstance(many[1], DecideError)
        assert client.ready() and client.stats()["questions"] >= 3
    finally:
        _stop(started["srv"])


def test_client_api_key_from_the_environment(monkeypatch):
    srv = _start(api_key="k-123")
    try:
        with pytest.raises(DecideError) as err:
            DecideClient(srv.url, max_retries=0).decide("c", "q", ["a"],
                                                        meta={"oracle_answer": "a"})
        assert err.value.status == 401 and err.value.field == "Authorization"
        monkeypatch.setenv("MY_DECIDE_KEY", "k-123")
        client = DecideClient(srv.url, api_key_env="MY_DECIDE_KEY", max_retries=0)
        assert client.decide("c", "q", ["a"], meta={"oracle_answer": "a"}).choice == "a"
        assert "k-123" not in repr(client.__dict__)
    finally:
        _stop(srv)


def test_a_harness_loop_asks_the_service_at_each_step():
    """The README's example: an agent loop with a growing context, one question per step."""
    srv = _start()
    try:
        client = DecideClient(srv.url)
        context, tools = "Customer C-1042 wants a refund for order O-55120.", [
            "lookup_order", "refund_order", "ask_customer"]
        chosen = []
        for step, expert in enumerate(["lookup_order", "refund_order"]):
            d = client.decide(context, "Which tool next?", tools,
                              meta={"oracle_answer": expert})
            chosen.append(d.choice)
            context += f"\nStep {step}: called {d.choice} -> ok"
        assert chosen == ["lookup_order", "refund_order"]
    finally:
        _stop(srv)
