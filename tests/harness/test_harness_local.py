"""LocalLLM: tools in the chat template (or the system message), JSON replies parsed into
tool calls and answers, failures reported; one real greedy KV-cache generation."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jaxdm.envs.decision_gym import tool_schemas
from jaxdm.harness.agent import openai_tool
from jaxdm.harness.llm_call import HeldQuestion, LLMRequest
from jaxdm.harness.local import LocalLLM, first_json_object
from jaxdm.roles.harness import stop_question

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decision"))


@pytest.fixture(scope="module")
def tok_only():
    """SmolLM2's tokenizer (chat template) without weights: enough for scripted replies."""
    from types import SimpleNamespace

    from jaxdm.models.loading import load_tokenizer
    from jaxdm.models.smollm2 import smollm2_path
    return SimpleNamespace(tokenizer=load_tokenizer(smollm2_path()))


def _req():
    tools = tuple(openai_tool(s) for s in tool_schemas()[:3])
    return LLMRequest("Customer: where is O-12345?", tools=tools,
                      questions=(HeldQuestion("stop", stop_question("ctx", answer=[1])),))


def test_first_json_object():
    assert first_json_object('sure! {"a": {"b": "}"}} and {"c": 1}') == {"a": {"b": "}"}}
    assert first_json_object("{not json} then {\"x\": 2}") == {"x": 2}
    assert first_json_object("no braces") is None


def test_tools_are_rendered_and_replies_parsed(tok_only):
    tiny = tok_only
    seen = {}

    def fake(ids):
        seen["text"] = tiny.tokenizer.decode(ids)
        return ('{"tool": "get_order", "args": {"order_id": "O-12345"}, '
                '"answers": {"q1": "1"}}', 21)

    llm = LocalLLM(tiny, generate_fn=fake, price_per_1k_in=1.0)
    r = llm.act(_req())
    assert r.ok and r.tool == "get_order" and r.args == {"order_id": "O-12345"}
    assert r.answers == (1,) and r.tokens_out == 21 and r.tokens_in > 100
    assert r.usd == pytest.approx(r.tokens_in / 1000)
    assert "find_customer" in seen["text"] and "get_order" in seen["text"]  # tools shown
    bad = LocalLLM(tiny, generate_fn=lambda ids: ("I will check the order.", 7)).act(_req())
    assert not bad.ok and "no JSON" in bad.error
    wrong = LocalLLM(tiny, generate_fn=lambda ids: ('{"tool": "fly", "args": {}}', 5)).act(_req())
    assert not wrong.ok and "no call to an offered tool" in wrong.error


@pytest.mark.slow
def test_real_greedy_generation_runs():
    from dm_fixtures import tiny_pretrained
    r = LocalLLM(tiny_pretrained(), max_new_tokens=4).act(_req())
    assert r.tokens_in > 100 and 1 <= r.tokens_out <= 4 and r.seconds > 0
    assert r.ok is False and r.error  # a random 2-layer model writes no tool call
