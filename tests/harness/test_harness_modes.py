"""All 40 delegations (8 points x 5 modes) run an episode with the SimulatedLLM; the mode
rules; CASCADE adopts exactly at and above its threshold."""
from __future__ import annotations

import dataclasses

import pytest

from jaxdm.envs.alfworld import AlfWorldEnv, AlfWorldParams
from jaxdm.envs.decision_gym import DecisionGym, GymParams
from jaxdm.harness import BACKEND_COST_ONLY, Delegation, Harness, NoisyOracle, SimulatedLLM
from jaxdm.harness.llm import STRONG, WEAK
from jaxdm.harness.modes import MODES, Plan, all_delegations, plan_after, plan_before
from jaxdm.harness.textenv import TextEnvHarness
from jaxdm.roles.harness import NO_NOTE, POINTS

ALL_ON = dataclasses.replace(BACKEND_COST_ONLY, memory=True, reflection=True, cheap_tier=True,
                             read_back=True, window=2)
GYM, GYM_PARAMS = DecisionGym(), GymParams(split="test")


def _gym_harness(d: Delegation) -> Harness:
    return Harness(SimulatedLLM(STRONG, 0), NoisyOracle(default_accuracy=0.8, seed=3), [d],
                   ALL_ON, cheap_llm=SimulatedLLM(WEAK, 0))


def test_forty_combinations_are_expressible():
    ds = all_delegations(0.6)
    assert len(ds) == 40 == len(POINTS) * len(MODES)
    assert len({(d.point, d.mode) for d in ds}) == 40


@pytest.mark.parametrize("d", [d for d in all_delegations(0.6) if d.point != "next_action"],
                         ids=lambda d: d.name)
def test_gym_delegation_runs_an_episode(d):
    eps = [_gym_harness(d).run_task(GYM, i, GYM_PARAMS) for i in (0, 5)]
    for ep in eps:
        assert ep.end in ("won", "irreversible_error", "truncated", "finished")
        assert ep.llm_calls + ep.dm_calls > 0 and ep.dm_failures == 0
    recs = [r for ep in eps for r in ep.decisions if r.point == d.point]
    assert recs, f"no {d.point} decision recorded"
    assert all(r.mode == d.name and r.confidence is not None for r in recs)
    who = {r.who for r in recs}
    if d.mode == "replace" or (d.mode == "trigger" and d.point not in ("tool", "params")):
        assert who <= {"dm", "implied"}, who
    if d.mode == "assist":
        assert "dm" not in who


@pytest.fixture(scope="module")
def text_envs():
    from jaxdm.envs.webshop import make_webshop_env
    return {"alfworld": AlfWorldEnv(AlfWorldParams(max_steps=20)),
            "webshop": make_webshop_env(generate={"seed": 0, "num_products": 60})}


@pytest.mark.parametrize("adapter", ["alfworld", "webshop"])
@pytest.mark.parametrize("mode", MODES)
def test_text_env_next_action_runs_an_episode(mode, adapter, text_envs):
    env = text_envs[adapter]
    d = Delegation("next_action", mode, 0.7 if mode in ("cascade", "guard", "trigger") else None)
    h = TextEnvHarness(SimulatedLLM(STRONG, 0), NoisyOracle(default_accuracy=0.8, seed=1), [d],
                       adapter=adapter)
    ep = h.run_task(env, 2, env.default_params)
    assert ep.steps >= 1 and len(ep.decisions) == ep.steps
    assert all(r.point == "next_action" and r.mode == d.name for r in ep.decisions)
    if mode == "replace":  # the model decides; where it fails (no key) the LLM does
        assert {r.who for r in ep.decisions} <= {"dm", "llm_fallback"}
        assert ep.llm_calls == sum(r.who == "llm_fallback" for r in ep.decisions)
    keyed = [r for r in ep.decisions if r.answer is not None]
    assert keyed and all(r.confidence is not None for r in keyed)


def test_text_env_llm_alone_follows_the_key(text_envs):
    for adapter, env in text_envs.items():
        h = TextEnvHarness(SimulatedLLM(STRONG, 0), adapter=adapter)
        eps = [h.run_task(env, i, env.default_params) for i in range(3)]
        assert sum(e.success for e in eps) >= 2, adapter
        assert all(e.llm_calls == e.steps for e in eps)
    with pytest.raises(ValueError, match="adapter"):
        TextEnvHarness(SimulatedLLM(), adapter="babyai")


def test_cascade_adopts_exactly_at_and_above_threshold():
    tau = 0.7
    d = Delegation("tool", "cascade", tau)
    h = Harness(SimulatedLLM(STRONG, 0), NoisyOracle(default_accuracy=0.7, seed=11), [d])
    recs = [r for i in range(12) for r in h.run_task(GYM, i, GYM_PARAMS).decisions
            if r.point == "tool" and r.who != "implied"]
    above = [r for r in recs if r.confidence >= tau]
    below = [r for r in recs if r.confidence < tau]
    assert above and below
    assert all(r.who == "dm" and r.choice == r.dm_choice for r in above)
    assert all(r.who == "llm" for r in below)
    # exactly at the threshold: adopted
    probs = (tau, 0.2, 0.1)
    assert plan_before(d, probs, ("a", "b", "c")) == Plan("dm", 0)
    assert plan_before(d, (tau - 1e-9, 0.3, 0.1 + 1e-9), ("a", "b", "c")) == Plan("llm")


def test_mode_rules_by_hand():
    opts = ("a", "b", "c", "d")
    probs = (0.1, 0.6, 0.2, 0.1)
    assert plan_before(Delegation("tool", "replace"), probs, opts) == Plan("dm", 1)
    assert plan_before(Delegation("tool", "assist", k=2), probs, opts) == Plan("llm",
                                                                               allowed=(1, 2))
    g = Delegation("tool", "guard", 0.5)
    assert plan_before(g, probs, opts) == Plan("llm")
    assert plan_after(g, probs, 1, opts) is None               # agrees: approved
    assert plan_after(g, probs, 0, opts) == Plan("llm", allowed=(1, 2, 3))  # returned
    assert plan_after(Delegation("tool", "guard", 0.7), probs, 0, opts) is None  # not sure
    tr = Delegation("tool", "trigger", 0.15)
    assert plan_after(tr, probs, 0, opts) == Plan("llm", reflect=True)  # P(proposal) < τ
    assert plan_after(tr, probs, 2, opts) is None
    # loop points: TRIGGER runs the step iff P(run) >= τ
    assert plan_before(Delegation("memory", "trigger", 0.3), (0.35, 0.65), ("r", "s")) == \
        Plan("dm", 0)
    assert plan_before(Delegation("memory", "trigger", 0.4), (0.35, 0.65), ("r", "s")) == \
        Plan("dm", 1)
    notes = ("Note 1: x", "Note 2: y", NO_NOTE)
    assert plan_before(Delegation("notes", "trigger", 0.5), (0.3, 0.4, 0.3), notes) == \
        Plan("dm", 1)
    assert plan_before(Delegation("notes", "trigger", 0.8), (0.3, 0.4, 0.3), notes) == \
        Plan("dm", 2)


@pytest.mark.parametrize("kw,match", [
    ({"point": "lunch", "mode": "replace"}, "point"),
    ({"point": "tool", "mode": "yolo"}, "mode"),
    ({"point": "tool", "mode": "cascade", "threshold": 1.5}, "threshold"),
    ({"point": "tool", "mode": "assist", "k": 0}, "k must"),
])
def test_bad_delegations(kw, match):
    with pytest.raises(ValueError, match=match):
        Delegation(**kw)


def test_delegation_needs_its_optional_step_and_a_model():
    with pytest.raises(ValueError, match="reflection"):
        Harness(SimulatedLLM(), NoisyOracle(), [Delegation("reflect", "trigger")])
    with pytest.raises(ValueError, match="decision model"):
        Harness(SimulatedLLM(), None, [Delegation("tool", "replace")])
    with pytest.raises(ValueError, match="two delegations"):
        Harness(SimulatedLLM(), NoisyOracle(), [Delegation("tool", "replace"),
                                                Delegation("tool", "assist")])
