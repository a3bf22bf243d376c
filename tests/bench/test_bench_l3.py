"""L3 (taking over a running agent): a perfect decision model with a parameter-perfect LLM
solves every task; a failing model leaves every decision to the LLM, counted; Kendall τ on a
hand case; the bench job with L3 writes τ and the level figure."""
import json

import pytest

from jaxdm.bench import l3, metrics
from jaxdm.bench.run import BenchConfig, BenchError, run
from jaxdm.decision import Oracle

PERFECT_LLM = {"kind": "simulated", "profile": "strong", "default_accuracy": 1.0,
               "accuracy": {}}


def test_l3_perfect_model_solves_every_task():
    recs, rows = l3.run_l3(Oracle(), l3.L3Config(tasks=2, llm=PERFECT_LLM))
    t = l3.breakdown(rows)
    assert [r["env"] for r in rows] == [e for e in l3.L3_ENVS for _ in range(2)]
    for env_name in l3.L3_ENVS:
        s = t[env_name]
        assert s["success"] == 1.0 and s["step_accuracy"] == 1.0, (env_name, s)
        assert s["dm_failures"] == 0 and s["irreversible_errors"] == 0
        assert s["dm_calls"] >= s["n"]  # at least one takeover decision per task
    # the LLM never picks a tool: on DECISION GYM it is called only to write parameters
    assert t["alfworld"]["llm_calls"] == 0
    assert all(r["level"] == "l3" and r["correct"] and not r["failed"] for r in recs)
    assert {r["kind"] for r in recs} == set(l3.L3_ENVS)


class _Broken:
    name = "broken"

    def choose(self, questions):
        raise RuntimeError("model server down")


def test_l3_failing_model_is_counted_and_the_llm_decides():
    recs, rows = l3.run_l3(_Broken(), l3.L3Config(envs=("base", "alfworld"), tasks=2))
    s = l3.breakdown(rows)
    for env_name in ("base", "alfworld"):
        assert s[env_name]["dm_failures"] == s[env_name]["dm_calls"] > 0
        assert s[env_name]["step_accuracy"] is None  # the model made no choice of its own
    assert recs and all(r["failed"] and not r["correct"] for r in recs)


def test_l3_config_errors_name_the_field():
    with pytest.raises(ValueError, match="webshop"):
        l3.L3Config(envs=("base", "webshop"))
    with pytest.raises(ValueError, match="tasks"):
        l3.L3Config(tasks=0)
    with pytest.raises(BenchError, match="l3_tasks|tasks"):
        BenchConfig(levels=("l3",), l3_tasks=-1)


def test_kendall_tau_hand_case():
    # pairs of (1,2,3,4) vs (1,3,2,4): 5 concordant, 1 discordant -> (5 - 1) / 6
    k = metrics.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4])
    assert k["tau"] == pytest.approx(4 / 6) and k["n"] == 4
    assert metrics.kendall_tau([0.1, 0.5, 0.9], [0.9, 0.5, 0.1])["tau"] == pytest.approx(-1.0)
    assert metrics.kendall_tau([0.5, 0.5], [0.1, 0.2])["tau"] is None   # constant side
    with pytest.raises(ValueError, match="position 1"):
        metrics.kendall_tau([0.1, float("nan")], [0.2, 0.3])
    agree = metrics.level_agreement({
        "a": {"l1": {"accuracy": 0.9}, "l3_tasks": {"all": {"success": 0.2}}},
        "b": {"l1": {"accuracy": 0.5}, "l3_tasks": {"all": {"success": 0.6}}},
        "c": {"l1": {"accuracy": 0.7}, "l3_tasks": {"all": {"success": 0.9}}}})
    # (0.9, 0.2), (0.5, 0.6), (0.7, 0.9): pairs ab D, ac D, bc C -> (1 - 2) / 3
    assert agree["l1_accuracy_vs_l3_success"]["tau"] == pytest.approx(-1 / 3)
    assert agree["l1_accuracy_vs_l3_success"]["backends"] == ["a", "b", "c"]


def test_bench_job_with_l3(tmp_path):
    cfg = BenchConfig(levels=("l2", "l3"), judges=("oracle", "oracle:noise=0.5,name=noisy"),
                      out_dir=str(tmp_path), l2_tasks=3, l3_tasks=2, l3_envs=("base", "alfworld"),
                      progress=False)
    res = run(cfg)
    ora, noisy = res["backends"]["oracle"], res["backends"]["noisy"]
    assert ora["l3_tasks"]["all"]["step_accuracy"] == 1.0
    assert noisy["l3"]["accuracy"] < 1.0
    assert ora["cost"]["calls"] == ora["l2"]["n"] + ora["l3_tasks"]["all"]["dm_calls"]
    k = res["kendall"]["l2_accuracy_vs_l3_success"]
    assert k["backends"] == ["oracle", "noisy"]
    assert (tmp_path / "levels.png").stat().st_size > 0
    rows = [json.loads(x) for x in (tmp_path / "l3_episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 and {r["backend"] for r in rows} == {"oracle", "noisy"}
    assert "L3 (taking over" in (tmp_path / "report.md").read_text()
    # saved as it goes: L3 one env at a time (what a resumed bench keeps)
    units = [json.loads(x) for x in (tmp_path / "units.jsonl").read_text().splitlines()]
    assert [(u["backend"], u["level"]) for u in units] == [
        (b, part) for b in ("oracle", "noisy") for part in ("l2", "l3/base", "l3/alfworld")]


def test_l3_with_the_agent_llm_down_measures_nothing(tmp_path):
    cfg = BenchConfig(levels=("l3",), judges=("oracle",), out_dir=str(tmp_path), l3_tasks=2,
                      l3_envs=("base",), progress=False,
                      l3_llm={"kind": "simulated", "profile": "strong", "fail_rate": 1.0})
    with pytest.raises(BenchError, match=r"nothing was measured for oracle on l3/base \(every "
                                         r"one of the agent LLM's \d+ calls failed\)"):
        run(cfg)
    assert (tmp_path / "units.jsonl").read_text() == ""
