"""MultipleChoice.option_names: validation, the likelihood rendering that scores names, and the
data, service and DECISION GYM paths that carry them."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from dm_fixtures import tiny_pretrained

from jaxdm.decision import MultipleChoice
from jaxdm.decision import render
from jaxdm.decision import shared_prefix as sp
from jaxdm.decision.local import LocalLikelihood, encode_messages
from jaxdm.models.tokenizer import text_ids

TOOLS = ("find_customer: Look up a customer by email.", "cancel_order: Cancel an unshipped order.",
         "finish: End the conversation.")
NAMES = ("find_customer", "cancel_order", "finish")


def question(names=NAMES) -> MultipleChoice:
    return MultipleChoice("Customer: please cancel O-12345.", "Which tool next?", TOOLS,
                          option_names=names)


@pytest.mark.parametrize("names, match", [
    (("find_customer", "cancel_order"), "2 names for 3 options"),
    (("find_customer", "cancel", "end"), r"option_names\[2\] \('end'\) is not the start"),
    (("find_customer", "", "finish"), r"option_names\[1\] must be a non-empty"),
    (("find", "find", "finish"), "is not the start|duplicates"),
])
def test_bad_option_names_are_named_errors(names, match):
    with pytest.raises(ValueError, match=match):
        question(names)
    with pytest.raises(TypeError, match="sequence of strings"):
        question("find_customer")


def test_duplicate_names_are_an_error():
    opts = ("a: one", "a: two")
    with pytest.raises(ValueError, match="duplicates"):
        MultipleChoice("c", "q", opts, option_names=("a", "a"))


def test_likelihood_lists_full_options_and_scores_the_names():
    pre = tiny_pretrained()
    ll = LocalLikelihood(pre)
    q = question()
    msgs = render.render_messages(q, "likelihood")
    assert msgs[0]["content"] == render.SYSTEM_PROMPTS[("choice", "likelihood_named")]
    assert all(f"- {o}" in msgs[1]["content"] for o in TOOLS)  # descriptions shown once
    full = dataclasses.replace(q, option_names=None)
    assert render.render_messages(full, "likelihood")[0]["content"] == \
        render.SYSTEM_PROMPTS[("choice", "likelihood")]
    # the other interfaces ignore the names
    for interface in ("constrained", "prompted"):
        assert render.render_messages(q, interface) == render.render_messages(full, interface)
    prompt = encode_messages(ll.tokenizer, msgs)
    reqs = ll.option_requests(q)
    eos = pre.tokenizer.eos_token_id
    for r, name in zip(reqs, NAMES):
        reply = text_ids(ll.tokenizer, name) + [eos]
        assert r.tokens == tuple(prompt + reply)
        assert r.answer_positions == tuple(range(len(prompt) - 1, len(prompt) - 1 + len(reply)))
        assert r.candidates == tuple((c,) for c in reply)
    # fewer answer slots than scoring each whole option
    assert sum(len(r.answer_positions) for r in reqs) < \
        sum(len(r.answer_positions) for r in ll.option_requests(full))
    # choose() gives the softmax of the names' mean log-likelihoods
    ref = sp.score_requests_one_by_one(pre.params, pre.config, reqs, full_vocab=True)
    s = np.array([x[:, 0].mean() for x in ref])
    np.testing.assert_allclose(ll.choose([q])[0].probs, np.exp(s - s.max()) / np.exp(
        s - s.max()).sum(), atol=1e-5)


def test_train_data_reads_option_names(tmp_path):
    import json

    from jaxdm.train.data import read_states
    line = {"context": "ctx", "split": "train",
            "questions": [{"question": "Which tool?", "options": list(TOOLS), "answer": [1],
                           "option_names": list(NAMES)}]}
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps(line) + "\n")
    (item,), = read_states(p)
    assert item.question.option_names == NAMES and "option_names" not in item.question.meta
    line["questions"][0]["option_names"] = ["find_customer", "cancel_order", "stop"]
    p.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"s.jsonl.*option_names\[2\]"):
        read_states(p)
    line["questions"][0]["option_names"] = "find_customer"
    p.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="s.jsonl.*option_names must be a sequence of strings"):
        read_states(p)


def test_service_request_carries_option_names():
    from jaxdm.decide.protocol import RequestError, parse_payload
    body = {"context": "c", "question": "q", "options": list(TOOLS), "option_names": list(NAMES)}
    (req,), _ = parse_payload(body)
    assert req.question.option_names == NAMES
    with pytest.raises(RequestError) as e:
        parse_payload(body | {"option_names": ["x", "y", "z"]})
    assert e.value.field == "option_names" and "not the start" in str(e.value)
    with pytest.raises(RequestError, match=r"option_names\[0\] must be a non-empty string"):
        parse_payload(body | {"option_names": [1, 2, 3]})
    with pytest.raises(RequestError, match="sequence of strings"):
        parse_payload(body | {"option_names": {"a": 1}})


def test_decision_gym_tool_questions_name_their_tools(tmp_path):
    from jaxdm.envs.decision_gym import DecisionGym, GymParams, tool_question
    from jaxdm.envs.decision_gym import ExpertAgent, run_episode
    env, p = DecisionGym(), GymParams()
    _, st = env.reset(0, p)
    q = tool_question(st, p)
    assert len(q.option_names) == len(q.options) == 69
    assert all(o.startswith(n + ": ") for n, o in zip(q.option_names, q.options))
    # the L2 state records (the training data) keep them
    _, records = run_episode(env, ExpertAgent(), 0, p)
    rec = records[0].to_dict()["questions"][0]
    assert rec["kind"] == "tool" and len(rec["option_names"]) == len(rec["options"])
