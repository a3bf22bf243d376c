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
