"""L3 (taking over a running agent): a perfect decision model with a parameter-perfect LLM
solves every task; a failing model leaves every decision to the LLM, counted; Kendall τ on a
hand case; the bench job with L3 writes τ and the level figure."""
import json
import re

import pytest

from jaxdm.bench import l3, metrics
from jaxdm.bench.run import BenchConfig, BenchError, run
from jaxdm.decision import Oracle
from tests.decision.dm_fixtures import RaisingBackend

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


BROKEN = RaisingBackend("broken", RuntimeError("model server down"))
REFUSES = RaisingBackend("refuses", ValueError("more options than labels"))


def test_l3_failing_model_is_counted_and_the_llm_decides():
    # an outage (the model raised): every episode is flagged, left out of success, counted
    recs, rows = l3.run_l3(BROKEN, l3.L3Config(envs=("base", "alfworld"), tasks=2))
    s = l3.breakdown(rows)
    for env_name in ("base", "alfworld"):
        assert s[env_name]["n"] == 0 and s[env_name]["flagged"] == 2
        assert s[env_name]["dm_lost"] > 0
    assert all(r["flagged"] and r["dm_failures"] == r["dm_calls"] == r["dm_lost"] for r in rows)
    assert recs and all(r["failed"] and not r["correct"] and not r["refused"] for r in recs)
    # a refusal (the model cannot take the question) is the model's own failure: measured
    recs, rows = l3.run_l3(REFUSES, l3.L3Config(envs=("base", "alfworld"), tasks=2))
    s = l3.breakdown(rows)
    for env_name in ("base", "alfworld"):
        assert s[env_name]["dm_failures"] == s[env_name]["dm_calls"] > 0
        assert s[env_name]["step_accuracy"] is None  # the model made no choice of its own
        assert s[env_name]["flagged"] == 0 and s[env_name]["n"] == 2
    assert recs and all(r["failed"] and r["refused"] and not r["correct"] for r in recs)


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


def test_l3_with_the_agent_llm_down_fails_the_job(tmp_path):
    cfg = BenchConfig(levels=("l3",), judges=("oracle",), out_dir=str(tmp_path), l3_tasks=2,
                      l3_envs=("base",), progress=False,
                      l3_llm={"kind": "simulated", "profile": "strong", "fail_rate": 1.0})
    with pytest.raises(BenchError, match=r"too many failed answers: oracle on l3/base \(\d+ of "
                                         r"the agent LLM's calls \(\d+\) failed"):
        run(cfg)
    # kept as incomplete: a resume re-runs its flagged episodes
    (unit,) = [json.loads(x) for x in (tmp_path / "units.jsonl").read_text().splitlines()]
    assert unit["complete"] is False and all(r["flagged"] for r in unit["l3_rows"])


def test_l3_flaky_agent_llm_episodes_are_flagged_and_resume_reruns_only_them(tmp_path,
                                                                            monkeypatch):
    """An agent LLM failing some calls: its episodes are flagged (not the model's success or
    failure) and the unit is incomplete; a resume with the LLM back re-runs only those and
    equals a healthy run."""
    from jaxdm.bench import run as bench_run

    def cfg(out, **kw):
        return BenchConfig(levels=("l3",), judges=("oracle:noise=0.3,name=noisy",),
                           out_dir=str(out), l3_tasks=4, l3_envs=("base",), progress=False,
                           **kw)
    healthy = run(cfg(tmp_path / "healthy"))
    assert healthy["n_failed_answers"] == 0
    tasks = {json.loads(x)["seed"]: json.loads(x)["task_id"] for x in
             (tmp_path / "healthy" / "l3_episodes.jsonl").read_text().splitlines()}
    down = tuple(f"{tasks[s]}/" for s in (1, 3))
    real = l3.run_l3
    asked = []

    def flaky(dm, l3cfg, *, only=None, **kw):   # the LLM fails every call of tasks 1 and 3
        asked.append(only)
        from jaxdm.harness.llm import make_llm
        llm = make_llm(dict(l3cfg.llm))
        act = llm.act

        def failing(req):
            r = act(req)
            if req.call_id.startswith(down) and not healthy_now:
                import dataclasses
                return dataclasses.replace(r, ok=False, error="connection refused")
            return r
        llm.act = failing
        return real(dm, l3cfg, llm_factory=lambda: llm, only=only, **kw)

    monkeypatch.setattr(bench_run.l3_lib, "run_l3", flaky)
    healthy_now = False
    out = tmp_path / "out"
    res = run(cfg(out, max_failed_share=1.0))
    t = res["backends"]["noisy"]["l3_tasks"]["base"]
    assert t["flagged"] == 2 and t["n"] == 2 and res["n_failed_answers"] == 2
    healthy_now = True
    res = run(cfg(out, max_failed_share=1.0), resume=True)
    assert asked[-1] == [1, 3]      # only the flagged episodes ran again
    assert res["n_failed_answers"] == 0
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "overhead_s", "dm_seconds")}  # noqa
    got = [strip(json.loads(x)) for x in (out / "l3_episodes.jsonl").read_text().splitlines()]
    want = [strip(json.loads(x)) for x in
            (tmp_path / "healthy" / "l3_episodes.jsonl").read_text().splitlines()]
    assert got == want
    assert (out / "records.jsonl").read_text() == (tmp_path / "healthy" / "records.jsonl"
                                                   ).read_text()
    assert len((out / "units.jsonl").read_text().splitlines()) == 1


def test_levels_and_l3_envs_are_registries_whose_errors_name_the_field():
    from jaxdm.bench.run import LEVELS

    assert list(LEVELS) == ["l1", "l2", "l3"] and BenchConfig().levels == ("l1", "l2", "l3")
    assert list(l3.L3_ENVS) == ["base", "shift", "hard", "alfworld"]
    assert BenchConfig().l3_envs == l3.L3Config().envs == tuple(l3.L3_ENVS)
    assert [l3.L3_ENVS[e].point for e in l3.L3_ENVS] == ["tool"] * 3 + ["next_action"]
    with pytest.raises(BenchError, match=re.escape(
            "levels: unknown bench level 'l9'; known: ['l1', 'l2', 'l3']")):
        BenchConfig(levels=("l1", "l9"))
    with pytest.raises(BenchError, match=re.escape("levels: no bench level given")):
        BenchConfig(levels=())
    with pytest.raises(BenchError, match=re.escape(
            "l3_envs: unknown L3 env 'web'; known: ['alfworld', 'base', 'hard', 'shift']")):
        BenchConfig(levels=("l3",), l3_envs=("base", "web"))
    assert BenchConfig(levels=("l1",), l3_envs=("web",)).levels == ("l1",)  # L3 not run
    with pytest.raises(ValueError, match=re.escape("envs: unknown L3 env 'web'")):
        l3.L3Config(envs=("web",))
    with pytest.raises(ValueError, match=re.escape("envs: no L3 env given")):
        l3.L3Config(envs=())
    with pytest.raises(ValueError, match=re.escape("unknown L3 env 'web'; known: ['alfworld'")):
        l3.takeover_harness("web", None, Oracle())
    factory, params, seeds = l3.make_env("hard", l3.L3Config(tasks=3, gym_max_steps=7))
    assert (params.variant, params.max_steps, params.strict, seeds) == ("hard", 7, True,
                                                                         [0, 1, 2])


def test_an_unknown_level_on_the_command_line_is_the_registry_error(tmp_path, capsys):
    from jaxdm.cli import main

    assert main(["bench", "--judge", "oracle", "--level", "l9", "--out", str(tmp_path / "o"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "jaxdm bench: error: levels: unknown bench level 'l9'; known: ['l1', 'l2', 'l3']" \
        in err and "Traceback" not in err and not (tmp_path / "o").exists()
