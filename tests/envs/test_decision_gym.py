"""DECISION GYM: catalogue, plans and keys, strict mode, variants, splits, bad input."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from jaxdm.envs.decision_gym import (ASK, BASE, CORE, FINISH, HARD, IRRELEVANT, NEAR,
                                     SHIFT, SPLIT_RANGES, TOOLS, VARIANTS,
                                     WRITE_TOOLS, DecisionGym, ExpertAgent, GymParams,
                                     expert_call, format_action, generate_task, param_questions,
                                     render_context, run_episode, split_of, split_seed,
                                     state_questions, stop_question, tool_question,
                                     tool_schemas)

ENV = DecisionGym()
N_TASKS = 120  # per variant and split in the expert sweep


def _expert_action(state, params):
    return ExpertAgent().act(ENV, state, params)


def _play(seed, params, actions):
    obs, state = ENV.reset(seed, params)
    out = None
    for a in actions:
        out = ENV.step(seed, state, a, params)
        state = out[1]
    return state, out


def _find(variant, pred, split="train", limit=4000):
    """The first (seed, task) of ``split`` whose task satisfies ``pred``."""
    for i in range(limit):
        seed = split_seed(split, i)
        task = generate_task(seed, variant)
        if pred(task):
            return seed, task
    raise AssertionError("no matching task generated")


def _expert_until(seed, params, stop):
    """Follow the expert from reset until ``stop(state, key)``; returns that state."""
    obs, state = ENV.reset(seed, params)
    for _ in range(params.max_steps):
        key = ENV.answer_key(state)
        if stop(state, key):
            return state
        state = ENV.step(seed, state, _expert_action(state, params), params)[1]
    raise AssertionError("expert never reached the wanted state")


# ---- catalogue --------------------------------------------------------------------------
def test_catalogue_has_69_tools_with_stated_composition():
    assert len(TOOLS) == 69
    kinds = [t.kind for t in TOOLS]
    assert (kinds.count(CORE), kinds.count(ASK), kinds.count(NEAR), kinds.count(IRRELEVANT),
            kinds.count(FINISH)) == (7, 1, 31, 29, 1)
    assert len({t.name for t in TOOLS}) == 69
    for t in TOOLS:
        schema = t.json_schema()
        assert schema["parameters"]["type"] == "object"
        assert set(schema["parameters"]["required"]) <= set(schema["parameters"]["properties"])
        assert t.description
    schemas = tool_schemas(shift=True)
    assert len(schemas) == 69 and schemas[0]["name"] == TOOLS[0].shift_name
    assert tool_schemas()[3]["parameters"]["required"] == ["order_id"]  # cancel_order
    # Core writes and near-duplicate writes are the data-changing tools.
    assert {"cancel_order", "update_address", "update_email", "create_return"} <= WRITE_TOOLS
    assert {"cancel_subscription", "void_invoice", "update_billing_address"} <= WRITE_TOOLS
    assert not {"get_order", "find_customer", "ask_customer", "finish"} & WRITE_TOOLS


def test_tool_question_lists_69_tools_shuffled_per_question():
    params = GymParams(variant=BASE)
    seed = split_seed("train", 3)
    obs, state = ENV.reset(seed, params)
    q0 = tool_question(state, params)
    assert len(q0.options) == 69
    names = [o.split(":")[0] for o in q0.options]
    assert sorted(names) == sorted(t.name for t in TOOLS)
    state1 = ENV.step(seed, state, _expert_action(state, params), params)[1]
    q1 = tool_question(state1, params)
    other = tool_question(ENV.reset(seed + 1, params)[1], params)
    assert [o.split(":")[0] for o in q1.options] != names
    assert [o.split(":")[0] for o in other.options] != names
    # Same state, same order: shuffling is deterministic.
    assert tool_question(state, params).options == q0.options
    # The key marks exactly the acceptable tools.
    key = ENV.answer_key(state)
    assert {names[i] for i in q0.meta["answer"]} == set(key.tools)


# ---- plans, keys, expert -----------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_every_task_and_its_action_is_always_keyed(variant, split):
    params = GymParams(variant=variant, strict=True, split=split)
    requests = set()
    for i in range(N_TASKS):
        seed = split_seed(split, i)
        obs, state = ENV.reset(seed, params)
        requests.add(state.task.request)
        while not state.done:
            key = ENV.answer_key(state)
            assert key is not None and key.tools, f"{state.task.task_id} step {state.t}"
            action = _expert_action(state, params)
            call = json.loads(action)
            tool = call["tool"] if variant != SHIFT else next(
                t.name for t in TOOLS if t.shift_name == call["tool"])
            assert key.accepts(tool, call["args"])
            obs, state, reward, done, info = ENV.step(seed, state, action, params)
            assert info["milestone"] and info["valid"] and not info["irreversible_error"]
        assert state.won and reward == 1.0, state.task.task_id
        assert state.t <= 8
    expected = 10 if variant == SHIFT else 8
    assert len(requests) == expected


def test_expert_episode_is_a_trajectory_with_questions_per_state():
    params = GymParams(variant=HARD, split="fit")
    traj, records = run_episode(ENV, ExpertAgent(), split_seed("fit", 5), params)
    assert traj.success and traj.reward == 1.0 and traj.env == "decision_gym"
    assert len(records) == len(traj.steps)
    assert all(s.action_type == "milestone" for s in traj.steps)
    for r in records:
        kinds = [q.meta["kind"] for q in r.questions]
        assert kinds[0] == "tool" and kinds[-1] == "stop"
        assert r.action == r.expert_action and not r.after_error
        assert r.to_dict()["context"].startswith("Current time:")


def test_parameter_questions_contain_the_expert_values():
    params = GymParams(variant=HARD)
    n_questions = 0
    for i in range(60):
        seed = split_seed("train", i)
        obs, state = ENV.reset(seed, params)
        while not state.done:
            key = ENV.answer_key(state)
            tool, args = expert_call(state, key)
            for q in param_questions(state, params, tool):
                assert q.meta["tool"] == tool
                value = args.get(q.meta["param"])
                chosen = "(omit)" if value is None else value
                assert chosen in q.options
                assert q.options.index(chosen) in q.meta["answer"]
                assert len(q.options) >= 2
                n_questions += 1
            state = ENV.step(seed, state, _expert_action(state, params), params)[1]
    assert n_questions > 100


def test_hard_customer_question_needs_the_right_one_of_the_directory():
    params = GymParams(variant=HARD)
    seed, task = _find(HARD, lambda t: t.request in ("cancel_order", "order_status"))
    obs, state = ENV.reset(seed, params)
    while "find_customer" not in ENV.answer_key(state).tools:
        state = ENV.step(seed, state, _expert_action(state, params), params)[1]
    (q,) = param_questions(state, params, "find_customer")
    # One id and one email per listed customer; exactly the requester's two are right.
    assert len(q.options) == 2 * len(task.directory)
    assert sorted(q.options[i] for i in q.meta["answer"]) == sorted(
        [task.requester.customer_id, task.requester.email])
    namesakes = [task.customer(c) for c in task.directory
                 if task.customer(c).name == task.requester.name]
    assert len(namesakes) >= 3


def test_keys_and_hidden_facts_are_not_in_the_context():
    params = GymParams(variant=BASE)
    seed, task = _find(BASE, lambda t: t.request == "change_address" and not {
        "order_id", "new_address"} & t.given)
    obs, state = ENV.reset(seed, params)
    ctx = render_context(state)
    assert task.fact("order_id") not in ctx and task.fact("new_address") not in ctx
    key = ENV.answer_key(state)
    assert key.tools == ("ask_customer",)
    assert key.params("ask_customer")["about"] == {"order_id", "new_address"}
    for q in state_questions(state, params):
        assert task.fact("order_id") not in q.context + q.question + " ".join(q.options)


def test_harmless_detours_keep_the_task_solvable():
    params = GymParams(variant=BASE, strict=True)
    detours = [
        {"tool": "get_weather", "args": {"city": "Paris"}},
        {"tool": "get_product_reviews", "args": {"product_id": "P-000"}},  # unknown id: error
        {"tool": "calculator", "args": {"expression": "2*(3+4)"}},
        {"tool": "ask_customer", "args": {"about": "other", "question": "How is the weather?"}},
        {"tool": "get_invoice", "args": {"order_id": "O-00000"}},
    ]
    solved = 0
    for i in range(40):
        seed = split_seed("train", i)
        n_expert = len(run_episode(ENV, ExpertAgent(), seed, params, record=False)[0].steps)
        for at in range(n_expert):
            obs, state = ENV.reset(seed, params)
            for k in range(at):
                state = ENV.step(seed, state, _expert_action(state, params), params)[1]
            key_before = ENV.answer_key(state)
            # A needless read of a real record, and a generic detour.
            products = state.task.products
            for d in (detours[(i + at) % len(detours)],
                      {"tool": "get_product", "args": {"product_id": products[at].product_id}}):
                obs, state, r, done, info = ENV.step(seed, state, d, params)
                assert not done and not info["irreversible_error"]
            key_after = ENV.answer_key(state)
            assert key_after is not None and key_after.tools
            if not key_before.accepts_tool("get_product"):
                assert key_after == key_before
            while not state.done:
                state = ENV.step(seed, state, _expert_action(state, params), params)[1]
            assert state.won, (state.task.task_id, at)
            solved += 1
    assert solved > 100


# ---- strict mode ----------------------------------------------------------------------------
def test_cancelling_instead_of_asking_ends_the_episode_in_strict_mode():
    seed, task = _find(BASE, lambda t: t.request == "cancel_order" and "order_id" not in t.given
                       and any(o.status in ("pending", "processing") and o.order_id !=
                               t.fact("order_id") and o.customer_id == t.customer_id
                               for o in t.orders))
    wrong = next(o for o in task.orders if o.status in ("pending", "processing")
                 and o.order_id != task.fact("order_id") and o.customer_id == task.customer_id)
    params = GymParams(variant=BASE, strict=True)
    obs, state = ENV.reset(seed, params)
    assert ENV.answer_key(state).tools == ("ask_customer",)
    action = {"tool": "cancel_order", "args": {"order_id": wrong.order_id}}
    obs, state, reward, done, info = ENV.step(seed, state, action, params)
    assert done and reward == 0.0 and not state.won
    assert info["irreversible_error"] and not info["milestone"] and info["valid"]
    assert state.order(wrong.order_id).status == "cancelled"
    assert ENV.answer_key(state) is None
    # The episode stays over.
    obs, state2, reward, done, info = ENV.step(seed, state, {"tool": "finish"}, params)
    assert done and state2 is state and reward == 0.0

    # Non-strict: the episode goes on but can no longer succeed.
    lenient = GymParams(variant=BASE, strict=False)
    obs, state = ENV.reset(seed, lenient)
    obs, state, reward, done, info = ENV.step(seed, state, action, lenient)
    assert not done and not info["solvable"] and ENV.answer_key(state) is None
    obs, state, reward, done, info = ENV.step(seed, state, {"tool": "finish"}, lenient)
    assert done and not state.won and reward == 0.0


def test_near_duplicate_write_is_irreversible_but_refused_calls_are_not():
    seed, task = _find(BASE, lambda t: t.request == "cancel_order" and "order_id" in t.given)
    params = GymParams(variant=BASE, strict=True)
    obs, state = ENV.reset(seed, params)
    # void_invoice on a real order changes data: irreversible.
    obs, s1, r, done, info = ENV.step(seed, state, {"tool": "void_invoice", "args": {
        "order_id": task.fact("order_id")}}, params)
    assert done and info["irreversible_error"] and s1.irreversible_error
    # A write the system refuses (unknown order) changes nothing: an error, not the end.
    obs, s2, r, done, info = ENV.step(seed, state, {"tool": "cancel_order", "args": {
        "order_id": "O-00000"}}, params)
    assert obs.startswith("Error:") and not done and not info["valid"] and s2.solvable


def test_finishing_early_fails():
    params = GymParams(variant=BASE)
    seed = split_seed("train", 0)
    obs, state = ENV.reset(seed, params)
    obs, state, reward, done, info = ENV.step(seed, state, {"tool": "finish"}, params)
    assert done and not state.won and reward == 0.0 and not info["won"]


def test_policy_branches_decide_the_write():
    params = GymParams(variant=BASE)
    # A shipped order cannot be cancelled: the plan finishes without a write.
    seed, task = _find(BASE, lambda t: t.request == "cancel_order"
                       and t.orders[0].status in ("shipped", "delivered"))
    state = _expert_until(seed, params, lambda s, k: k.tools == ("finish",))
    assert not state.wrote
    obs, s2, r, done, info = ENV.step(seed, state, {"tool": "cancel_order", "args": {
        "order_id": task.fact("order_id")}}, params)
    assert "can no longer be cancelled" in obs and not done
    # A return outside the window is refused by the plan (finish, no create_return).
    seed, task = _find(BASE, lambda t: t.request == "return_item"
                       and t.orders[0].status == "delivered"
                       and t.orders[0].delivered_days_ago > t.return_days(t.requester))
    state = _expert_until(seed, params, lambda s, k: k.tools == ("finish",))
    assert not state.wrote
    item = task.fact("item")
    obs, s2, r, done, info = ENV.step(seed, state, {"tool": "create_return", "args": {
        "order_id": task.fact("order_id"), "item_id": item, "resolution": "refund"}}, params)
    assert done and info["irreversible_error"]  # the system allowed it; the policy did not
    # Refunds go to the original payment: store credit is not in the key.
    seed, task = _find(BASE, lambda t: t.request == "return_item"
                       and t.orders[0].status == "delivered"
                       and t.orders[0].delivered_days_ago <= t.return_days(t.requester))
    state = _expert_until(seed, params, lambda s, k: k.tools == ("create_return",))
    key = ENV.answer_key(state)
    assert key.accepts("create_return", {"order_id": task.fact("order_id"), "item_id": item
                                         if False else task.fact("item"), "resolution": "refund"})
    assert not key.accepts("create_return", {"order_id": task.fact("order_id"),
                                             "item_id": task.fact("item"), "resolution": "refund",
                                             "refund_method": "store_credit"})


# ---- variants --------------------------------------------------------------------------------
def test_shift_renames_tools_rewords_and_adds_request_types():
    for t in TOOLS:
        if t.kind != FINISH:
            assert t.shift_name != t.name
        assert t.shift_description != t.description
    params = GymParams(variant=SHIFT)
    seed, task = _find(SHIFT, lambda t: t.request == "gift_card_balance")
    obs, state = ENV.reset(seed, params)
    q = tool_question(state, params)
    names = {o.split(":")[0] for o in q.options}
    assert "account_lookup" in names and "find_customer" not in names
    # The base name is an unknown tool in Shift: an error observation, not an exception.
    obs, s1, r, done, info = ENV.step(seed, state, {"tool": "find_customer", "args": {
        "query": task.requester.email}}, params)
    assert obs.startswith("Error: unknown tool") and not info["valid"]
    traj, _ = run_episode(ENV, ExpertAgent(), seed, params)
    assert traj.success and json.loads(traj.steps[0].action)["tool"] == "account_lookup"
    seed, task = _find(SHIFT, lambda t: t.request == "split_shipment")
    assert run_episode(ENV, ExpertAgent(), seed, params)[0].success
    # New wording: Shift messages never use a base template's opening.
    base_msgs = {generate_task(split_seed("train", i), BASE).message.split("\n")[0]
                 for i in range(300)}
    shift_msgs = {generate_task(split_seed("train", i), SHIFT).message.split("\n")[0]
                  for i in range(300)}
    assert not {m[:25] for m in base_msgs} & {m[:25] for m in shift_msgs}


def test_hard_has_10_or_12_customers_and_enforces_its_rules():
    sizes = {len(generate_task(split_seed("train", i), HARD).directory) for i in range(40)}
    assert sizes == {10, 12}
    assert all(not generate_task(split_seed("train", i), BASE).directory for i in range(20))
    params = GymParams(variant=HARD)
    # Fee rule: an old, cancellable, non-gold order needs the customer's consent first.
    from jaxdm.envs.decision_gym.plan import fee_applies
    seed, task = _find(HARD, lambda t: t.request == "cancel_order" and
                       t.orders[0].status in ("pending", "processing")
                       and fee_applies(t, t.orders[0]) and not t.fact("confirm_fee"))
    state = _expert_until(seed, params, lambda s, k: k.tools == ("ask_customer",)
                          and k.params("ask_customer")["about"] == {"confirm_fee"})
    ctx = render_context(state)
    assert "costs a 10% fee" in ctx
    obs, s1, r, done, info = ENV.step(seed, state, {"tool": "cancel_order", "args": {
        "order_id": task.fact("order_id")}}, params)
    assert done and info["irreversible_error"]  # cancelling without consent
    obs, s2, r, done, info = ENV.step(seed, state, {"tool": "ask_customer", "args": {
        "about": "confirm_fee"}}, params)
    assert "keep the order" in obs and ENV.answer_key(s2).tools == ("finish",)
    # Region rule: an address change into a restricted region is refused.
    seed, task = _find(HARD, lambda t: t.request == "change_address"
                       and t.orders[0].status in ("pending", "processing")
                       and re.search(r", (AK|HI|PR) \d{5}$", t.fact("new_address")))
    state = _expert_until(seed, params, lambda s, k: k.tools == ("finish",))
    obs, s1, r, done, info = ENV.step(seed, state, {"tool": "update_address", "args": {
        "order_id": task.fact("order_id"), "address": task.fact("new_address")}}, params)
    assert done and info["irreversible_error"]
    # The same move in the base variant is allowed.
    assert run_episode(ENV, ExpertAgent(), seed, params)[0].success


# ---- seeds and determinism -------------------------------------------------------------------
def test_split_seed_ranges_are_disjoint_and_reset_maps_keys_into_its_split():
    ranges = sorted(r for _, r in SPLIT_RANGES.items())
    for (lo1, hi1), (lo2, hi2) in zip(ranges, ranges[1:]):
        assert hi1 <= lo2
    seeds = {s: {split_seed(s, i) for i in range(200)} for s in SPLIT_RANGES}
    assert not seeds["train"] & seeds["fit"] and not seeds["fit"] & seeds["test"]
    assert split_of(split_seed("fit", 7)) == "fit"
    with pytest.raises(ValueError, match="outside every split"):
        split_of(-1)
    with pytest.raises(ValueError, match="unknown split"):
        split_seed("dev", 0)
    import jax
    for split, (lo, hi) in SPLIT_RANGES.items():
        p = GymParams(split=split)
        for key in (5, 123_456_789, jax.random.key(3), jax.random.PRNGKey(9)):
            assert lo <= ENV.reset(key, p)[1].task.seed < hi
        # A seed already in the split's range is used as is.
        assert ENV.reset(split_seed(split, 42), p)[1].task.seed == split_seed(split, 42)
    a = ENV.reset(5, GymParams(split="train"))[1].task
    b = ENV.reset(5, GymParams(split="test"))[1].task
    assert (a.seed, b.seed) == (split_seed("train", 5), split_seed("test", 5))
    assert a.message != b.message
    # A seed of another split is refused rather than silently remapped.
    with pytest.raises(ValueError, match="belongs to split 'test'"):
        ENV.reset(split_seed("test", 5), GymParams(split="train"))
    assert ENV.reset(split_seed("test", 5), GymParams(split=None))[1].task.seed == b.seed


def test_generation_is_deterministic_and_states_replay():
    for v in VARIANTS:
        assert generate_task(1234, v) == generate_task(1234, v)
    assert generate_task(1234, BASE) != generate_task(1235, BASE)
    params = GymParams(variant=HARD, split="test")
    seed = split_seed("test", 11)
    traj, _ = run_episode(ENV, ExpertAgent(), seed, params, record=False)
    actions = [s.action for s in traj.steps]
    _, s1 = ENV.replay(seed, actions, params)
    _, s2 = ENV.replay(seed, actions, params)
    assert s1 == s2 and s1.won
    with pytest.raises(dataclasses.FrozenInstanceError):
        s1.done = False  # type: ignore[misc]
    # Continuing a copied mid-episode state gives the same result as the original run.
    _, mid = ENV.replay(seed, actions[:2], params)
    out_a = ENV.step(seed, mid, actions[2], params)
    out_b = ENV.step(seed, dataclasses.replace(mid), actions[2], params)
    assert out_a[0] == out_b[0] and out_a[1] == out_b[1]


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("action, message", [
    ("not json", "could not parse"),
    ('{"tool": "teleport", "args": {}}', "unknown tool 'teleport'"),
    ({"tool": "get_order"}, "missing required argument 'order_id'"),
    ({"tool": "get_order", "args": {"order_id": 42}}, "must be a non-empty string"),
    ({"tool": "get_order", "args": {"order": "O-1"}}, "unknown argument 'order'"),
    ({"tool": "get_order", "args": ["O-1"]}, "must be a JSON object"),
    ({"tool": "create_return", "args": {"order_id": "O-1", "item_id": "P-1",
                                        "resolution": "teleport"}}, "must be one of"),
    ({"tool": "random_number", "args": {"low": 1.5, "high": 3}}, "must be an integer"),
    ({"tool": "get_order", "args": {"order_id": "O-1"}, "why": 1}, "unknown key"),
    ({"args": {}}, 'no "tool"'),
    (17, "must be a JSON object"),
    (None, "must be a JSON object"),
    ('["get_order"]', "must be a JSON object"),
])
def test_bad_input_gets_a_tool_error_observation(action, message):
    params = GymParams(variant=BASE)
    seed = split_seed("train", 2)
    obs, state = ENV.reset(seed, params)
    obs, new, reward, done, info = ENV.step(seed, state, action, params)
    assert obs.startswith("Error:") and message in obs
    assert not info["valid"] and info["no_op"] and not done and reward == 0.0
    assert new.t == 1 and new.solvable and ENV.answer_key(new) == ENV.answer_key(state)


def test_info_keys_budget_and_stop_question():
    params = GymParams(variant=BASE, max_steps=3)
    seed = split_seed("train", 8)
    obs, state = ENV.reset(seed, params)
    assert stop_question(state, params).meta["answer"] == (1,)
    lookup = format_action("find_customer", {"query": state.task.requester.email})
    for k, action in enumerate([lookup, lookup, format_action("get_weather", {"city": "Oslo"})]):
        obs, state, reward, done, info = ENV.step(seed, state, action, params)
        for key in ("admissible_actions", "valid", "won", "milestone", "no_op", "goal",
                    "task_type", "truncated"):
            assert key in info
        assert len(info["admissible_actions"]) == 69
        # The first lookup teaches something; its repeat and the weather change nothing.
        assert info["no_op"] == (k > 0) and info["valid"]
    assert done and state.truncated and info["truncated"] and not state.won
    params = GymParams(variant=BASE)
    state = _expert_until(seed, params, lambda s, k: k.tools == ("finish",))
    q = stop_question(state, params)
    assert q.meta["answer"] == (0,) and q.options[0].startswith("Finish")


# ---- fuzz: any action sequence; every still-solvable state finishes with the expert ---------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jaxdm.envs.decision_gym import candidates  # noqa: E402


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=st.integers(0, 10_000), variant=st.sampled_from(VARIANTS), strict=st.booleans(),
       # Half the picks among the core / ask / finish tools (TOOLS[:9]), half among all 69.
       picks=st.lists(st.tuples(st.one_of(st.integers(0, 8), st.integers(0, 68)),
                                st.integers(0, 50), st.booleans()),
                      min_size=1, max_size=6))
def test_fuzz_random_calls_never_raise_and_solvable_states_stay_solvable(task, variant, strict,
                                                                         picks):
    params = GymParams(variant=variant, strict=strict)
    seed = split_seed("train", task)
    obs, state = ENV.reset(seed, params)
    for tool_index, value_index, garbage in picks:
        if state.done:
            break
        tool = TOOLS[tool_index]
        ctx = render_context(state)
        args = {}
        for p in tool.params:
            cands = candidates(p, ctx) or ["x"]
            value = cands[value_index % len(cands)]
            if p.sem in ("number", "integer"):
                value = value_index
            args[p.name] = 3.5 if garbage and p.required else value
        action = format_action(tool.display_name(variant == SHIFT), args)
        obs, state, reward, done, info = ENV.step(seed, state, action, params)
        assert isinstance(obs, str) and obs
        assert done == state.done
        if info["irreversible_error"]:
            assert strict and done and tool.writes
    if state.done or not state.solvable:
        assert ENV.answer_key(state) is None
        return
    # The key of whatever state the calls left leads to success.
    while not state.done:
        key = ENV.answer_key(state)
        assert key is not None and key.tools
        state = ENV.step(seed, state, _expert_action(state, params), params)[1]
    assert state.won or state.truncated


def test_first_observation_briefs_the_agent():
    obs, state = ENV.reset(split_seed("train", 1), GymParams(variant=HARD))
    assert obs.startswith("Current time:") and "Shop policy:" in obs and "Catalogue:" in obs
    assert "Customers in this support queue:" in obs
    assert obs.rstrip().endswith(state.task.message.split("\n")[-1])
    assert obs == render_context(state)


def test_bad_settings_raise_clear_errors():
    with pytest.raises(ValueError, match="GymParams.variant"):
        GymParams(variant="extreme")
    with pytest.raises(ValueError, match="GymParams.split"):
        GymParams(split="dev")
    with pytest.raises(ValueError, match="max_steps"):
        GymParams(max_steps=0)
    with pytest.raises(ValueError, match="unknown variant"):
        generate_task(1, "extreme")
    with pytest.raises(ValueError, match="non-negative int"):
        generate_task(-3)
    with pytest.raises(ValueError, match="outside"):
        split_seed("train", 10**9)
    params = GymParams()
    obs, state = ENV.reset(split_seed("train", 0), params)
    finished = ENV.step(0, state, {"tool": "finish"}, params)[1]
    with pytest.raises(ValueError, match="no answer key"):
        tool_question(finished, params)
    # A keyless state can still be asked (for an acting agent), with an empty answer.
    assert tool_question(finished, params, require_key=False).meta["answer"] == ()
    with pytest.raises(ValueError, match="not an acceptable next call"):
        param_questions(state, params, "void_invoice")
