"""The BM25 retrieval control (issue 40 §4): options (tool names and descriptions) scored
against the user's request and replies, not the context's last lines (mostly a tool result)."""
from __future__ import annotations

import pytest

from jaxdm.harness.dm import BM25Shortlist, dialogue_turns, make_dm


def _cancel_question():
    """Task 34 of the test split, a perfect agent: the customer asks to cancel; after the
    lookups the next tool is cancel_order (one of 69 tool options)."""
    from jaxdm.envs.decision_gym import (DecisionGym, GymParams, NoisyAgent, run_episode,
                                         split_seed)
    _, records = run_episode(DecisionGym(), NoisyAgent(error_rate=0.0, seed=0),
                             split_seed("test", 34), GymParams(variant="base", strict=True,
                                                               split="test"))
    (q,) = [q for q in records[3].questions if q.question.startswith("Which tool")]
    return q


def _rank(backend, q) -> int:
    probs = backend.choose([q])[0].probs
    return sorted(range(len(probs)), key=lambda j: -probs[j]).index(q.meta["answer"][0])


def test_it_ranks_the_requested_tool_first_on_a_real_decision_gym_question():
    q = _cancel_question()
    assert len(q.options) == 69 and q.options[q.meta["answer"][0]].startswith("cancel_order: ")
    assert "Please cancel my order" in BM25Shortlist().query_text(q)
    assert _rank(BM25Shortlist(), q) == 0
    assert _rank(make_dm({"kind": "bm25", "query": "dialogue"}), q) == 0
    assert _rank(BM25Shortlist(query="tail"), q) > 3   # the earlier control missed it


def test_dialogue_turns_keep_multiline_messages_and_leave_out_the_prompt():
    ctx = ("Shop policy:\n- Customer: not a turn\nConversation:\nCustomer: Hi, cancel O-1\n"
           "- Ann (ann@x.org)\nAgent: {\"tool\": \"find_customer\"}\nResult: {\"id\": 3}")
    assert dialogue_turns(ctx) == [("Customer:", "Hi, cancel O-1\n- Ann (ann@x.org)"),
                                   ("Agent:", "{\"tool\": \"find_customer\"}"),
                                   ("Result:", "{\"id\": 3}")]
    assert dialogue_turns("no dialogue here") == []


def test_bad_options_are_named_errors():
    with pytest.raises(ValueError, match="bm25 query must be one of"):
        make_dm({"kind": "bm25", "query": "everything"})
    with pytest.raises(ValueError, match="tail_lines must be an int >= 1"):
        BM25Shortlist(tail_lines=0)
