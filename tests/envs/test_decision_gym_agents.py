"""DECISION GYM agents, recorded states, the data script and VectorEnv use."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from jaxdm.envs.decision_gym import (BASE, HARD, SHIFT, TOOL_BY_NAME, DecisionGym,
                                     DecisionModelAgent, ExpertAgent, GymParams, NoisyAgent,
                                     generate_task, run_episode, score_answers, split_of,
                                     split_seed)
from jaxdm.envs.decision_gym.tools import CONFUSIONS, NEAR, tool_named
from jaxdm.trajectory import Trajectory

ENV = DecisionGym()


def _must_ask_seeds(request="cancel_order", n=8):
    seeds = []
    for i in range(4000):
        seed = split_seed("train", i)
        t = generate_task(seed, BASE)
        if t.request == request and "order_id" not in t.given:
            seeds.append(seed)
            if len(seeds) == n:
                return seeds
    raise AssertionError("too few must-ask tasks")


def test_noisy_agent_acting_instead_of_asking_is_an_irreversible_error():
    agent = NoisyAgent(error_rate=1.0, kinds=("act_instead_of_ask",))
    params = GymParams(variant=BASE, strict=True)
    n_irreversible = 0
    for seed in _must_ask_seeds():
        traj, records = run_episode(ENV, agent, seed, params)
        assert not traj.success
        assert all(json.loads(s.action)["tool"] == "cancel_order" for s in traj.steps)
        # Guessing a shipped order is refused (an error, no change); guessing a cancellable
        # one is irreversible and ends the episode at once.
        *refused, last = traj.steps
        assert all(not s.valid and not s.annotations["irreversible_error"] for s in refused)
        if last.annotations["irreversible_error"]:
            n_irreversible += 1
            assert traj.error and "cancel_order" in traj.error
        else:
            assert traj.truncated
        # Every recorded state keys the right answer (ask) although the agent acted.
        for rec in records:
            tool_q = rec.questions[0]
            assert [tool_q.meta["tools"][i] for i in tool_q.meta["answer"]] == ["ask_customer"]
            assert tool_q.meta["must_ask"]
            assert json.loads(rec.expert_action)["tool"] == "ask_customer"
    assert n_irreversible >= 5


def test_noisy_agent_error_kinds_are_realistic():
    params = GymParams(variant=BASE, strict=False)
    seed = split_seed("train", 4)
    obs, state = ENV.reset(seed, params)
    key = ENV.answer_key(state)
    near = json.loads(NoisyAgent(1.0, kinds=("near_duplicate",)).act(ENV, state, params))
    assert TOOL_BY_NAME[near["tool"]].kind == NEAR
    assert any(near["tool"] in CONFUSIONS[t] for t in key.tools)
    early = json.loads(NoisyAgent(1.0, kinds=("premature_finish",)).act(ENV, state, params))
    assert early["tool"] == "finish"
    # Wrong parameter: the keyed tool with a value of the right type that the key rejects.
    while "get_order" not in ENV.answer_key(state).tools or len(
            {o for o in state.orders if o.customer_id == state.task.customer_id}) < 2:
        state = ENV.step(seed, state, ExpertAgent().act(ENV, state, params), params)[1]
        if state.done:
            seed += 1
            obs, state = ENV.reset(seed, params)
    if "find_customer" in ENV.answer_key(state).tools:
        state = ENV.step(seed, state, {"tool": "find_customer", "args": {
            "query": state.task.requester.email}}, params)[1]
    key = ENV.answer_key(state)
    wrong = json.loads(NoisyAgent(1.0, kinds=("wrong_parameter",)).act(ENV, state, params))
    assert wrong["tool"] == "get_order" and not key.accepts("get_order", wrong["args"])
    assert wrong["args"]["order_id"] in [o.order_id for o in state.orders]
    with pytest.raises(ValueError, match="error_rate"):
        NoisyAgent(error_rate=1.5)
    with pytest.raises(ValueError, match="unknown error kind"):
        NoisyAgent(kinds=("typo",))


@pytest.mark.parametrize("variant", [BASE, SHIFT, HARD])
def test_noisy_runs_record_states_after_errors_with_keys(variant):
    params = GymParams(variant=variant, strict=True, split="fit")
    agent = NoisyAgent(error_rate=0.3, seed=1)
    wins, n_after, n_states = 0, 0, 0
    for i in range(60):
        traj, records = run_episode(ENV, agent, split_seed("fit", i), params)
        assert isinstance(traj, Trajectory)
        wins += traj.success
        for r in records:
            n_states += 1
            n_after += r.after_error
            for q in r.questions:
                assert q.meta["answer"] and all(0 <= a < len(q.options) for a in q.meta["answer"])
            tool = json.loads(r.expert_action)["tool"]
            tool_q = r.questions[0]
            assert tool in [tool_q.meta["tools"][a] for a in tool_q.meta["answer"]]
            assert tool_named(tool, variant == SHIFT) is not None
    assert 10 < wins < 60 and n_after > 5 and n_states > 150
    # Reproducible by seed.
    a = run_episode(ENV, agent, split_seed("fit", 3), params)[0]
    b = run_episode(ENV, agent, split_seed("fit", 3), params)[0]
    assert a.to_dict() == b.to_dict()


def test_lenient_mode_keeps_states_after_harmless_errors_keyed():
    params = GymParams(variant=BASE, strict=False)
    agent = NoisyAgent(error_rate=0.5, seed=2, kinds=("needless_lookup", "irrelevant_tool",
                                                      "near_duplicate"))
    wins = 0
    for i in range(40):
        traj, records = run_episode(ENV, agent, split_seed("train", i), params)
        wins += traj.success
    # Needless lookups and irrelevant tools never break a task; near-duplicate writes do.
    assert 10 < wins < 40


def test_data_script_writes_states_with_context_options_and_keys(tmp_path):
    path = pathlib.Path(__file__).parents[2] / "experiments" / "decision_gym_data.py"
    spec = importlib.util.spec_from_file_location("decision_gym_data", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main = module.main
    out, eps = tmp_path / "states.jsonl", tmp_path / "eps.jsonl"
    summary = main(["--n", "12", "--split", "test", "--variant", "hard", "--agent", "noisy",
                    "--error-rate", "0.3", "--out", str(out), "--episodes", str(eps)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == summary["states"] > 12
    for row in rows:
        assert row["split"] == "test" and split_of(row["seed"]) == "test"
        assert "Customers in this support queue:" in row["context"]
        kinds = [q["kind"] for q in row["questions"]]
        assert kinds[0] == "tool" and kinds[-1] == "stop"
        assert len(row["questions"][0]["options"]) == 69
        for q in row["questions"]:
            assert q["answer"] and max(q["answer"]) < len(q["options"])
    from jaxdm.trajectory import read_jsonl
    assert len(read_jsonl(eps)) == 12
    with pytest.raises(SystemExit):
        main(["--n", "0", "--out", str(out)])
    before = out.read_text()
    with pytest.raises(SystemExit):      # the data already there is not replaced unasked
        main(["--n", "2", "--out", str(out)])
    assert out.read_text() == before
    main(["--n", "2", "--out", str(out), "--overwrite"])
    assert out.read_text() != before


def test_vector_env_runs_decision_gym_episodes():
    from jaxdm.envs.vector import EnvFactory, VectorEnv
    params = GymParams(variant=BASE, split="train")
    expert = ExpertAgent()
    with VectorEnv(EnvFactory("jaxdm.envs.decision_gym:DecisionGym"), num_envs=2,
                   num_workers=1, params=params) as venv:
        obs, infos = venv.reset(seed=0)
        assert all(o.startswith("Current time:") and "\nCustomer: " in o for o in obs)
        assert all(len(i["admissible_actions"]) == 69 for i in infos)
        for _ in range(12):
            states = venv.states
            actions = [expert.act(ENV, s, params) for s in states]
            step = venv.step(actions)
            if step.dones.all():
                break
        trajs = venv.pop_trajectories()
    assert len(trajs) == 2 and all(t.success for t in trajs)


class _FirstOption:
    """A decision model that always picks option 0 with certainty."""

    name = "first"

    def choose(self, questions):
        from jaxdm.decision.types import choice_ok
        return [choice_ok([1.0] + [0.0] * (len(q.options) - 1)) for q in questions]


class _Broken:
    name = "broken"

    def choose(self, questions):
        from jaxdm.decision.types import choice_failed
        return [choice_failed("timeout") for _ in questions]


def test_decision_model_agent_l3_with_oracle_and_bad_models():
    from jaxdm.decision.oracle import Oracle
    params = GymParams(variant=SHIFT, strict=True, split="test")
    seeds = [split_seed("test", i) for i in range(40)]
    for params_from in ("expert", "model"):
        agent = DecisionModelAgent(Oracle(), params_from=params_from)
        assert all(run_episode(ENV, agent, s, params, record=False)[0].success for s in seeds)
        assert agent.fallbacks == 0
    # Always the first listed tool: the shuffled list makes that a near-random agent.
    first = DecisionModelAgent(_FirstOption())
    trajs = [run_episode(ENV, first, s, params, record=False)[0] for s in seeds]
    assert sum(t.success for t in trajs) <= 2
    # A failing model hands every decision back (to the expert here): no loss, all counted.
    broken = DecisionModelAgent(_Broken())
    traj = run_episode(ENV, broken, seeds[0], params, record=False)[0]
    assert traj.success and broken.fallbacks == len(traj.steps)
    with pytest.raises(ValueError, match="params_from"):
        DecisionModelAgent(Oracle(), params_from="llm")


def test_score_answers_l2_accuracy_per_kind():
    from jaxdm.decision.oracle import Oracle
    params = GymParams(variant=HARD, split="fit")
    questions = []
    for i in range(15):
        _, records = run_episode(ENV, NoisyAgent(0.3, seed=4), split_seed("fit", i), params)
        questions += [q for r in records for q in r.questions]
    perfect = score_answers(questions, Oracle().choose(questions))
    assert perfect["accuracy/all"] == 1.0 and perfect["n/all"] == len(questions)
    first = score_answers(questions, _FirstOption().choose(questions))
    n_tool = first["n/tool"]
    # Option 0 of a tool question is right only where the shuffle put a keyed tool first.
    expected = sum(0 in q.meta["answer"] for q in questions if q.meta["kind"] == "tool")
    assert first["accuracy/tool"] == expected / n_tool < 0.2
    failed = score_answers(questions[:3], _Broken().choose(questions[:3]))
    assert failed["accuracy/all"] == 0.0 and failed["failed/all"] == 3
    with pytest.raises(ValueError, match="results"):
        score_answers(questions[:2], [])
