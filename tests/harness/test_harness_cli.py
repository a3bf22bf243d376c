"""`jaxdm harness shadow|fit|run|compare` end to end on the smoke preset, and config errors."""
from __future__ import annotations

import json

import pytest

from jaxdm.cli import main


def test_harness_all_on_the_smoke_preset(tmp_path, capsys):
    # a perfect decision model and a wide margin, so that Stage 1 passes at 8 tasks and the
    # registered Stage 2 combination runs on 8 new tasks
    rc = main(["harness", "all", "shadow_tasks=8", "--config", "smoke", "--out", str(tmp_path),
               "--no-progress", "--set", "test_tasks=8", "--set", "stage2_tasks=8",
               "dm.default_accuracy=1.0", "stats.margin=0.4"])
    assert rc == 0
    for f in ("shadow_decisions.jsonl", "shadow_episodes.jsonl", "thresholds.json",
              "calibration.png", "summary.json", "report.md", "report.json", "frontier.png",
              "savings_by_point.png", "runs/llm_alone/decisions.jsonl",
              "runs/tool_replace/episodes.jsonl"):
        assert (tmp_path / f).is_file(), f
    shadow = [json.loads(x) for x in (tmp_path / "shadow_decisions.jsonl").read_text()
              .splitlines()]
    assert shadow and all(r["mode"] == "shadow" and "probs" in r for r in shadow)
    rows = [json.loads(x) for x in (tmp_path / "runs/tool_replace/decisions.jsonl")
            .read_text().splitlines()]
    tool = [r for r in rows if r["point"] == "tool"]
    assert tool and {r["who"] for r in tool} <= {"dm", "implied"}
    assert {"point", "mode", "who", "confidence", "correct", "cost_usd", "latency_s"} <= set(
        rows[0])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["arms"])[0] == "llm_alone" and summary["frontier"]
    drift = summary["arms"]["tool_cascade_fitted"]["drift"]
    assert drift["point"] == "tool" and 0 <= drift["final_share"] <= 1
    fits = json.loads((tmp_path / "thresholds.json").read_text())
    assert "tool" in fits and fits["tool"]["tau_star"] <= fits["tool"]["q_llm"]
    report = (tmp_path / "report.md").read_text()
    assert "Stage 1" in report and "tool_cascade_fitted" in report
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["stage2_delegations"] and rep["stage2"][0]["name"] == "combined"
    s2 = [json.loads(x) for x in (tmp_path / "runs/stage2_combined/episodes.jsonl")
          .read_text().splitlines()]
    s1 = [json.loads(x) for x in (tmp_path / "runs/llm_alone/episodes.jsonl")
          .read_text().splitlines()]
    assert not {r["task_id"] for r in s2} & {r["task_id"] for r in s1}  # new tasks
    out = capsys.readouterr().out
    assert "shadow:" in out and "fit tool" in out


def test_a_fitted_candidate_the_fit_leaves_to_the_llm_is_still_compared(tmp_path, capsys):
    # min_support above every count: the fit keeps the point at the LLM, so the arm runs with
    # no delegation (its summary has no live point); compare still tests it (found live:
    # "candidate arms must have exactly one delegation")
    arms = ("arms=[{name: params_cascade_fitted, candidate: true, delegations: "
            "[{point: params, mode: cascade, fitted: true}]}]")
    rc = main(["harness", "all", "--config", "smoke", "--out", str(tmp_path), "--no-progress",
               "shadow_tasks=4", "test_tasks=4", "stage2_tasks=2", "frontier_thresholds=[]",
               "fit.min_support=1000", arms])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "thresholds.json").read_text())["params"]["threshold"] is None
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["arms"]["params_cascade_fitted"]["point"] is None
    rep = json.loads((tmp_path / "report.json").read_text())
    assert "params_cascade_fitted" in json.dumps(rep["stage1"])
    assert rep["stage2_delegations"] == []   # the LLM alone cannot cost less than itself


@pytest.mark.parametrize("override,match", [
    ("shadow_taks=3", "did you mean shadow_tasks"),
    ("agent.windw=3", "agent.windw"),
    ("llm={kind: simulated, profile: genius}", "genius"),
    ("llm={kind: simulated, temperature: 0.2}", "temperature"),
])
def test_config_errors_name_the_key(tmp_path, capsys, override, match):
    rc = main(["harness", "shadow", "--config", "smoke", "--out", str(tmp_path),
               "--no-progress", "--set", override])
    assert rc == 2
    assert match in capsys.readouterr().err


def test_fit_before_shadow_names_the_missing_file(tmp_path, capsys):
    assert main(["harness", "fit", "--config", "smoke", "--out", str(tmp_path)]) == 2
    assert "shadow_decisions.jsonl does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("override,match", [
    ("test_tasks=0", "test_tasks must be >= 1"),
    ("stats.margin=-1", "stats: margin must be a number in [0, 1)"),
    ("stats.alpha=1.5", "stats: alpha must be a number in (0, 1)"),
    ("fit.method=foo", "fit: method must be one of"),
    ("fit.points=[nope]", "'nope' is not a decision point"),
    ("fit.points=[params]", "fitted threshold for 'tool', which fit.points ['params'] leaves out"),
    ("frontier_thresholds=[2]", "frontier_thresholds[0] must be in [0, 1]"),
    ("frontier_point=zz", "frontier_point 'zz' is not a decision point"),
    ("agent.window=0", "agent: AgentConfig.window must be a positive int"),
    ("arms=[{name: a, delegations: [{point: tool, mode: cascade, threshold: 0.5, fitted: true}]}]",
     "give either a threshold or fitted: true"),
    ("arms=[{name: a, delegations: [{point: tool, mode: nope}]}]", "unknown delegation mode 'nope'"),
])
def test_bad_values_fail_before_any_episode(tmp_path, capsys, override, match):
    # each of these used to surface only after the shadow pass (or as a traceback at the end)
    rc = main(["harness", "all", "--config", "smoke", "--out", str(tmp_path), "--no-progress",
               "--set", override])
    assert rc == 2
    assert match in capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # nothing ran, nothing written


def _smoke(tmp_path, action, *extra):
    return main(["harness", action, "--config", "smoke", "--out", str(tmp_path), "--no-progress",
                 "shadow_tasks=4", "test_tasks=4", "stage2_tasks=4", *extra])


def test_results_are_never_overwritten_without_being_asked(tmp_path, capsys):
    from jaxdm.harness.config import HarnessConfig
    from jaxdm.harness.journal import COMMAND_KEYS, RECORD_FILE, UNRECORDED_KEYS
    import dataclasses
    # every config key belongs to exactly one command (or shapes no result)
    keys = [k for ks in COMMAND_KEYS.values() for k in ks] + list(UNRECORDED_KEYS)
    assert sorted(keys) == sorted(f.name for f in dataclasses.fields(HarnessConfig))

    assert _smoke(tmp_path, "shadow") == 0 and _smoke(tmp_path, "fit") == 0
    shadow = (tmp_path / "shadow_decisions.jsonl").read_text()
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert list(record) == ["shadow", "fit"] and record["shadow"]["shadow_tasks"] == 4
    capsys.readouterr()
    # the same command again: refused, files untouched
    assert _smoke(tmp_path, "shadow") == 2
    err = capsys.readouterr().err
    assert "already holds results of `shadow` or a later command" in err and "--overwrite" in err
    assert (tmp_path / "shadow_decisions.jsonl").read_text() == shadow
    # a later command with another value of an earlier command's key: refused by name
    assert _smoke(tmp_path, "run", "seed=3") == 2
    assert "`shadow` results were made with other values of ['seed']" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()
    # fitting again with another method is asked for: the shadow pass is reused
    assert _smoke(tmp_path, "fit", "fit.method=binned", "--overwrite") == 0
    assert (tmp_path / "shadow_decisions.jsonl").read_text() == shadow
    assert json.loads((tmp_path / RECORD_FILE).read_text())["fit"]["fit"]["method"] == "binned"
    # ... and a run made with the old fit cannot go on with the new one
    assert _smoke(tmp_path, "run") == 2
    assert "`fit` results were made with other values of ['fit']" in capsys.readouterr().err
    assert _smoke(tmp_path, "run", "fit.method=binned") == 0
    # redoing shadow removes what was built on the old pass
    assert _smoke(tmp_path, "shadow", "--overwrite") == 0
    assert not any((tmp_path / f).exists() for f in ("thresholds.json", "summary.json", "runs"))
    assert list(json.loads((tmp_path / RECORD_FILE).read_text())) == ["shadow"]


def test_an_interrupted_command_is_not_built_on(tmp_path, capsys):
    assert _smoke(tmp_path, "shadow") == 0
    (tmp_path / "harness_config.json").unlink()   # as if shadow had stopped before its record
    assert _smoke(tmp_path, "fit") == 2
    assert "`shadow` results there were never recorded as finished" in capsys.readouterr().err


def _timeless(path):
    drop = ("seconds", "overhead_s")
    return [{k: v for k, v in json.loads(x).items() if k not in drop}
            for x in path.read_text().splitlines()]


def test_an_interrupted_command_resumes_episode_by_episode(tmp_path, capsys, monkeypatch):
    from jaxdm.harness.agent import Harness
    assert _smoke(tmp_path / "whole", "all") == 0
    real, ran = Harness.run_task, []

    def cut_at_third(self, env, seed, params):
        ran.append(seed)
        if len(ran) == 3:
            raise KeyboardInterrupt     # a kill mid-pass: two episodes are in the journal
        return real(self, env, seed, params)

    monkeypatch.setattr(Harness, "run_task", cut_at_third)
    with pytest.raises(KeyboardInterrupt):
        _smoke(tmp_path / "cut", "shadow")
    journal = tmp_path / "cut/journal/shadow/shadow.jsonl"
    assert len(journal.read_text().splitlines()) == 2
    with journal.open("a") as f:
        f.write('{"index": 2, "episo')          # a kill in the middle of writing the third
    capsys.readouterr()
    assert _smoke(tmp_path / "cut", "shadow") == 2
    assert "holds an interrupted `shadow` (2 episodes finished" in capsys.readouterr().err
    assert _smoke(tmp_path / "cut", "fit") == 2
    assert "`shadow` was interrupted there; run `jaxdm harness shadow --resume`" in \
        capsys.readouterr().err
    assert _smoke(tmp_path / "cut", "shadow", "--resume", "seed=1") == 2
    assert "ran with other values of ['seed']" in capsys.readouterr().err
    ran.clear()
    monkeypatch.setattr(Harness, "run_task", lambda self, env, seed, params: (
        ran.append(seed), real(self, env, seed, params))[1])
    assert _smoke(tmp_path / "cut", "all", "--resume") == 0
    assert ran[:2] == [2, 3]           # shadow: only the two tasks the cut left
    assert not (tmp_path / "cut/journal/shadow").exists()
    for f in ("shadow_decisions.jsonl", "shadow_episodes.jsonl",
              "runs/llm_alone/episodes.jsonl", "runs/tool_replace/decisions.jsonl"):
        assert _timeless(tmp_path / "cut" / f) == _timeless(tmp_path / "whole" / f), f
    # everything finished: a resumed `all` keeps it and runs nothing
    ran.clear()
    assert _smoke(tmp_path / "cut", "all", "--resume") == 0 and ran == []
    assert "finished in" in capsys.readouterr().out


def test_an_interrupted_run_resumes_with_its_finished_arms(tmp_path, capsys, monkeypatch):
    from jaxdm.harness.agent import Harness
    assert _smoke(tmp_path / "whole", "all") == 0
    assert _smoke(tmp_path / "cut", "shadow") == 0 and _smoke(tmp_path / "cut", "fit") == 0
    real, ran = Harness.run_task, []

    def cut(self, env, seed, params):
        ran.append(seed)
        if len(ran) == 7:     # the reference arm (4 tasks) is saved, the next arm cut
            raise KeyboardInterrupt
        return real(self, env, seed, params)

    monkeypatch.setattr(Harness, "run_task", cut)
    with pytest.raises(KeyboardInterrupt):
        _smoke(tmp_path / "cut", "run")
    assert (tmp_path / "cut/runs/llm_alone/episodes.jsonl").is_file()   # partial results
    ran.clear()
    monkeypatch.setattr(Harness, "run_task", lambda self, env, seed, params: (
        ran.append(seed), real(self, env, seed, params))[1])
    assert _smoke(tmp_path / "cut", "run", "--resume") == 0
    assert ran[:2] == [2, 3]    # the cut arm's two missing tasks first, nothing run twice
    for f in ("runs/llm_alone/episodes.jsonl", "runs/tool_replace/decisions.jsonl"):
        assert _timeless(tmp_path / "cut" / f) == _timeless(tmp_path / "whole" / f), f
    s_cut = json.loads((tmp_path / "cut/summary.json").read_text())
    s_whole = json.loads((tmp_path / "whole/summary.json").read_text())
    assert [a["success"] for a in s_cut["arms"].values()] == \
        [a["success"] for a in s_whole["arms"].values()]


@pytest.mark.parametrize("override,who,reason", [
    ("llm={kind: simulated, profile: strong, fail_rate: 1.0}", "agent LLM", "first error: "),
    # the server's reason, not the 69-option batch the backend refused before asking it
    ("dm={kind: remote, base_url: 'http://127.0.0.1:9/v1', model: m, max_retries: 0, "
     "timeout: 2}", "decision model", "first error: 1 of 1 answers failed: connection error"),
])
def test_a_pass_where_every_call_failed_fails_the_job(tmp_path, capsys, override, who, reason):
    # the harness falls back at every decision, so the pass would "succeed" and measure nothing
    assert _smoke(tmp_path, "shadow", "--set", override) == 2
    err = capsys.readouterr().err
    assert f"shadow: every {who} " in err and "failed" in err and "--resume" in err
    assert reason in err
    assert not (tmp_path / "shadow_decisions.jsonl").exists()
    assert not list((tmp_path / "journal/shadow").glob("*.jsonl"))   # nothing of it kept


def test_some_failed_calls_are_counted_and_flagged(tmp_path, capsys):
    flaky = "llm={kind: simulated, profile: strong, fail_rate: 0.3}"
    # over max_failed_share (default 0.05): the pass stops by name, its record unwritten
    assert _smoke(tmp_path / "a", "shadow", "--set", flaky) == 2
    assert "over max_failed_share 0.05" in capsys.readouterr().err
    assert not (tmp_path / "a/harness_config.json").exists()
    # within the bound: kept, but the episodes a timeout hit are flagged and not counted
    assert _smoke(tmp_path / "b", "shadow", "--set", flaky, "max_failed_share=1") == 0
    eps = [json.loads(x) for x in (tmp_path / "b/shadow_episodes.jsonl").read_text().splitlines()]
    assert 0 < sum(e["llm_failures"] for e in eps) < sum(e["llm_calls"] for e in eps)
    assert any(e["incomplete"] for e in eps)
    assert all(e["incomplete"] == (e["llm_unanswered"] > 0) for e in eps)
    out = capsys.readouterr().out
    assert "incomplete, not counted" in out and "--resume" in out
