"""The harness sensitivity settings (issue 40 §4): errors of the simulated LLM and the NoisyOracle
coupled at a correlation ρ (``jaxdm.harness.coupling``), the overlapping-confidence setting and
its AUC, ρ = 0 reproducing the draws of before, the named errors of the new options, the
decision keys and task offset the harness adds, and the experiment script's shadow readout."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxdm.decision.types import MultipleChoice
from jaxdm.envs.decision_gym import DecisionGym, GymParams
from jaxdm.harness import BACKEND_COST_ONLY, AgentConfig, Harness, NoisyOracle, SimulatedLLM
from jaxdm.harness.coupling import (check_correlation, coupled_uniform, decision_key,
                                    error_correlation, shared_latent)
from jaxdm.harness.dm import CONFIDENCE_SETTINGS, confidence_auc, make_dm
from jaxdm.harness.errors import HarnessError
from jaxdm.harness.llm import STRONG, LLMProfile, make_llm
from jaxdm.harness.llm_call import HeldQuestion, LLMRequest

ROOT = Path(__file__).resolve().parents[2]
GYM, PARAMS = DecisionGym(), GymParams(split="test")


def _questions(n: int, prefix: str = "d") -> list[MultipleChoice]:
    return [MultipleChoice(context=f"ctx {i}", question="Which?", options=("a", "b", "c", "d"),
                           meta={"answer": [1], "point": "stop",
                                 "decision_key": f"{prefix}{i}"}) for i in range(n)]


def _errors(rho: float, n: int = 4000, acc: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Error indicators of a NoisyOracle and a SimulatedLLM (held questions) on the same n
    synthetic decisions, both at correlation ``rho`` and accuracy ``acc``."""
    qs = _questions(n)
    dm = NoisyOracle(default_accuracy=acc, seed=7, correlation=rho)
    dm_err = np.array([int(np.argmax(r.probs)) != 1 for r in dm.choose(qs)], float)
    llm = SimulatedLLM(LLMProfile("t", default_accuracy=acc), seed=5, correlation=rho)
    llm_err = []
    for start in range(0, n, 100):
        held = tuple(HeldQuestion("stop", q) for q in qs[start:start + 100])
        llm_err += [a != 1 for a in llm.act(LLMRequest(prompt="p", questions=held,
                                                       call_id=f"c/{start}")).answers]
    return dm_err, np.array(llm_err, float)


def test_correlated_errors_reach_their_target_correlation():
    dm_err, llm_err = _errors(0.8)
    phi = np.corrcoef(dm_err, llm_err)[0, 1]
    target = error_correlation(0.8, 0.8, 0.8)
    assert 0.55 < target < 0.65          # the phi of two 0.8-accurate parties at latent 0.8
    assert abs(phi - target) < 0.05, (phi, target)
    # the marginal accuracies are unchanged by the coupling
    assert abs(dm_err.mean() - 0.2) < 0.025 and abs(llm_err.mean() - 0.2) < 0.025


def test_zero_correlation_is_independent():
    dm_err, llm_err = _errors(0.0)
    assert abs(np.corrcoef(dm_err, llm_err)[0, 1]) < 0.05
    assert error_correlation(0.0, 0.9, 0.97) == pytest.approx(0.0, abs=1e-6)


def test_zero_correlation_gives_the_draws_of_before():
    # Values from the code before the coupling existed (commit 0cf8830): the NoisyOracle's
    # keyed-option probability and top choice, and the SimulatedLLM's answers.
    qs = _questions(6)
    for dm in (NoisyOracle(default_accuracy=0.6, seed=3),
               NoisyOracle(default_accuracy=0.6, seed=3, correlation=0.0)):
        res = dm.choose(qs)
        assert [round(r.probs[1], 6) for r in res] == [0.863295, 0.25, 0.789523, 0.778272,
                                                        0.133387, 0.92329]
        assert [int(np.argmax(r.probs)) for r in res] == [1, 3, 1, 1, 0, 1]
    llm = SimulatedLLM(LLMProfile("t", default_accuracy=0.6), seed=2, correlation=0.0)
    rep = llm.act(LLMRequest(prompt="p", questions=tuple(HeldQuestion("stop", q) for q in qs),
                             call_id="c/1"))
    assert rep.answers == (3, 1, 3, 1, 1, 1)
    assert coupled_uniform(0.123, None, 0.0) == 0.123


def test_coupling_pieces():
    # the shared latent is a pure function of the key, standard normal over many keys
    z = np.array([shared_latent(f"task/{i}/tool") for i in range(4000)])
    assert shared_latent("task/3/tool") == shared_latent("task/3/tool")
    assert abs(z.mean()) < 0.06 and abs(z.std() - 1.0) < 0.05
    # ρ = 1: both parties' uniform is Φ(z0), whatever their own draws
    assert coupled_uniform(0.1, "k", 1.0) == pytest.approx(coupled_uniform(0.9, "k", 1.0))
    assert decision_key("T-1", 4, "params", "order_id") == "T-1/4/params/order_id"
    with pytest.raises(ValueError, match="needs the decision's key"):
        coupled_uniform(0.5, None, 0.3)


def test_overlap_setting_and_its_auc():
    assert CONFIDENCE_SETTINGS.get("overlap") == ((3.0, 2.0), (2.5, 2.0))
    assert confidence_auc(*CONFIDENCE_SETTINGS.get("informative")) == pytest.approx(0.9127,
                                                                                    abs=1e-3)
    assert confidence_auc(*CONFIDENCE_SETTINGS.get("overlap")) == pytest.approx(0.5594,
                                                                                abs=1e-3)
    # the NoisyOracle's own answers in the overlap setting show that AUC
    dm = NoisyOracle(default_accuracy=0.7, seed=1, confidence="overlap")
    assert dm.right == (3.0, 2.0) and dm.wrong == (2.5, 2.0)
    res = dm.choose(_questions(3000))
    conf = np.array([max(r.probs) for r in res])
    right = np.array([int(np.argmax(r.probs)) == 1 for r in res])
    auc = np.mean(conf[right][:, None] > conf[~right][None, :])
    assert abs(auc - 0.5594) < 0.03, auc
    # the default stays the harness results' informative setting
    assert NoisyOracle().right == (6.0, 1.5) and NoisyOracle().wrong == (2.0, 2.5)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, True, "0.5"])
def test_bad_correlation_is_a_named_error(bad):
    with pytest.raises(ValueError, match="correlation must be a finite number in"):
        check_correlation(bad, "x")
    with pytest.raises(ValueError, match="oracle_noisy: correlation"):
        NoisyOracle(correlation=bad)
    with pytest.raises(ValueError, match="simulated llm 'sim-strong': correlation"):
        SimulatedLLM(STRONG, 0, correlation=bad)


def test_bad_confidence_and_options_are_named_errors():
    with pytest.raises(ValueError, match="confidence setting"):
        NoisyOracle(confidence="sharp")
    with pytest.raises(ValueError, match="not both"):
        NoisyOracle(confidence="overlap", right=(2.0, 2.0))
    with pytest.raises(ValueError, match="two positive Beta parameters"):
        NoisyOracle(right=(math.inf, 1.0))
    with pytest.raises(ValueError, match="correlation"):
        make_dm({"kind": "oracle_noisy", "correlation": 2})
    with pytest.raises(HarnessError, match="correlation"):
        make_llm({"kind": "simulated", "correlation": -1})
    assert make_llm({"kind": "simulated", "correlation": 0.5}).correlation == 0.5
    for bad in (-1, True, 2.5, 10 ** 9):
        with pytest.raises(ValueError, match="task_offset"):
            AgentConfig(task_offset=bad)


def test_missing_keys_at_positive_correlation_are_named():
    q = MultipleChoice(context="c", question="q", options=("a", "b"),
                       meta={"answer": [0], "point": "stop"})
    r = NoisyOracle(correlation=0.5).choose([q])[0]
    assert not r.ok and "decision_key" in r.error
    llm = SimulatedLLM(STRONG, 0, correlation=0.5)
    env_state = GYM.reset(0, PARAMS)[1]
    tools = ({"type": "function", "function": {"name": "finish", "parameters": {}}},)
    with pytest.raises(HarnessError, match="decision_step"):
        llm.act(LLMRequest(prompt="p", tools=tools, call_id="x/0/a",
                           hidden={"env": GYM, "state": env_state, "params": PARAMS}))


class Recording:
    """A NoisyOracle that keeps the decision keys of the questions it is asked."""

    name = "recording"

    def __init__(self, **kw):
        self.inner, self.keys = NoisyOracle(**kw), []

    def choose(self, questions):
        self.keys += [q.meta.get("decision_key") for q in questions]
        return self.inner.choose(questions)


def test_harness_gives_decision_keys_and_plays_offset_tasks():
    dm = Recording(seed=2, correlation=0.8)
    settings = dataclasses.replace(BACKEND_COST_ONLY, reflection=True)
    h = Harness(SimulatedLLM(STRONG, 0, correlation=0.8), dm, shadow=True, settings=settings)
    ep = h.run_task(GYM, 0, PARAMS)
    assert ep.dm_failures == 0 and ep.steps >= 2
    assert f"{ep.task_id}/0/tool" in dm.keys and f"{ep.task_id}/0/stop" in dm.keys
    assert f"{ep.task_id}/1/reflect" in dm.keys
    assert any(k.startswith(f"{ep.task_id}/") and "/params/" in k for k in dm.keys)
    # task_offset: index 0 plays the split's task 0 + offset (another seed's task)
    h2 = Harness(SimulatedLLM(STRONG, 0), NoisyOracle(seed=2), shadow=True,
                 settings=dataclasses.replace(BACKEND_COST_ONLY, task_offset=10_000))
    ep2 = h2.run_task(GYM, 0, PARAMS)
    assert ep2.seed == 10_000 and ep2.task_id != ep.task_id
    plain = Harness(SimulatedLLM(STRONG, 0), NoisyOracle(seed=2), shadow=True,
                    settings=BACKEND_COST_ONLY)
    assert plain.run_task(GYM, 10_000, PARAMS).task_id == ep2.task_id


def _script():
    spec = importlib.util.spec_from_file_location(
        "harness_sensitivity_script", ROOT / "experiments" / "harness_sensitivity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_script_shadow_diagnostics_and_overrides(tmp_path):
    mod = _script()
    rows = [  # answer [0]; dm / llm right-right, wrong-wrong (x2), right-wrong
        {"point": "tool", "answer": [0], "dm_choice": 0, "llm_choice": 0, "confidence": 0.9},
        {"point": "tool", "answer": [0], "dm_choice": 1, "llm_choice": 2, "confidence": 0.4},
        {"point": "tool", "answer": [0], "dm_choice": 2, "llm_choice": 1, "confidence": 0.3},
        {"point": "tool", "answer": [0], "dm_choice": 0, "llm_choice": 1, "confidence": 0.35},
        {"point": "stop", "answer": [0], "dm_choice": 1, "llm_choice": 1, "confidence": 0.99},
    ]
    (tmp_path / "shadow_decisions.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    d = mod.shadow_diagnostics(tmp_path)
    assert d["n"] == 4 and d["dm_accuracy"] == 0.5 and d["llm_accuracy"] == 0.25
    # errors dm [0,1,1,0], llm [0,1,1,1]: phi = (0.5 - 0.5*0.75) / sqrt(0.25 * 0.1875)
    assert d["error_phi"] == pytest.approx(0.125 / math.sqrt(0.25 * 0.1875))
    # right confidences {0.9, 0.35} vs wrong {0.4, 0.3}: 3 of 4 pairs ordered
    assert d["confidence_auc"] == pytest.approx(0.75)
    ov = mod.overrides_for("rho0.8", 2, mod.SIZES, tmp_path)
    assert "agent.task_offset=20000" in ov and "seed=2" in ov
    assert any(o.startswith("dm=") and "correlation: 0.8" in o and "seed: 3" in o for o in ov)
    assert any(o.startswith("cheap_llm=") and "correlation: 0.8" in o for o in ov)
