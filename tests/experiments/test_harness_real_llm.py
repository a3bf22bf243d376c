"""``experiments/harness_real_llm.py``: its harness config (remote agent LLM, one fixed
CASCADE arm, no frontier, no cheap tier) loads and is checked, and its pass statistics read the
harness's own episode and decision files."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from jaxdm.harness.config import load

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("harness_real_llm_script",
                                               ROOT / "experiments" / "harness_real_llm.py")
script = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = script
_spec.loader.exec_module(script)


def _args(tmp_path, **kw):
    base = dict(max_tokens=96, dm="smollm2", max_steps=6, tasks=2, out=str(tmp_path),
                no_progress=True)
    return argparse.Namespace(**{**base, **kw})


def test_the_config_is_a_remote_llm_with_one_fixed_cascade_arm(tmp_path):
    cfg = load("decision_gym", script.overrides(_args(tmp_path), "http://127.0.0.1:9"))
    assert cfg.llm == {"kind": "remote", "base_url": "http://127.0.0.1:9", "model": "smollm2",
                       "max_tokens": 96, "timeout": 900, "max_retries": 1}
    assert cfg.dm["kind"] == "local_readout" and cfg.cheap_llm is None
    assert [a.name for a in cfg.arms] == ["tool_cascade_fixed_0.5"]
    assert cfg.arms[0].delegations[0].threshold == 0.5 and cfg.frontier_thresholds == ()
    assert (cfg.shadow_tasks, cfg.test_tasks, cfg.env.max_steps) == (2, 2, 6)
    assert not cfg.agent.cheap_tier
    assert load("decision_gym", script.overrides(_args(tmp_path, dm="oracle_noisy"),
                                                 "http://x")).dm["kind"] == "oracle_noisy"


def test_pass_stats_count_ends_calls_and_shadow_accuracy(tmp_path):
    def ep(success, steps, end, calls, fails, seconds):
        return {"success": success, "steps": steps, "end": end, "llm_calls": calls,
                "llm_failures": fails, "dm_calls": 1, "seconds": seconds}
    (tmp_path / "shadow_episodes.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [ep(False, 6, "max_steps", 6, 1, 12.0),
                                           ep(True, 3, "done", 3, 0, 6.0)]) + "\n")
    (tmp_path / "runs" / "llm_alone").mkdir(parents=True)
    (tmp_path / "runs" / "llm_alone" / "episodes.jsonl").write_text(
        json.dumps(ep(False, 2, "max_steps", 2, 0, 1.0)) + "\n")
    (tmp_path / "shadow_decisions.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"point": "tool", "answer": [2], "dm_choice": 2, "llm_choice": 1},
        {"point": "tool", "answer": [1], "dm_choice": 1, "llm_choice": 1},
        {"point": "stop", "answer": [0], "dm_choice": 1, "llm_choice": 1},
        {"point": "stop", "answer": None, "dm_choice": 0, "llm_choice": 0}]) + "\n")
    st = script.pass_stats(tmp_path)
    assert st["shadow"] == {"episodes": 2, "success": 1, "steps": [6, 3],
                            "ends": {"max_steps": 1, "done": 1}, "llm_calls": 9,
                            "llm_failures": 1, "dm_calls": 2, "seconds_per_llm_call": 2.0}
    assert st["llm_alone"]["episodes"] == 1 and st["llm_alone"]["seconds_per_llm_call"] == 0.5
    assert st["shadow_points"] == {"tool": {"n": 2, "dm_right": 2, "llm_right": 1, "agree": 1},
                                   "stop": {"n": 1, "dm_right": 0, "llm_right": 0, "agree": 1}}


def test_a_vllm_that_exits_is_a_named_error(tmp_path):
    with pytest.raises(RuntimeError, match="vllm serve exited with"):
        script.start_vllm(sys.executable, 1, tmp_path / "vllm.log", timeout_s=60)


def test_vllm_request_counts_by_status(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text('INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
                   'INFO:     127.0.0.1:2 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
                   'INFO:     127.0.0.1:3 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
                   'INFO:     127.0.0.1:4 - "GET /v1/models HTTP/1.1" 200 OK\n')
    assert script.vllm_requests(log) == {"400": 1, "200": 2}
    assert script.vllm_requests(tmp_path / "missing.log") == {}
    assert script.pass_stats(tmp_path) == {}        # no pass wrote episodes
