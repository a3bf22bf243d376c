"""What a bench report counts (issue 40 §4): an L3-only run reports the decision model's
tokens and seconds per call (they were 0 and 0.0), every record keeps the model's chosen
option beside the key (majority-class effects can be checked), and the BM25 retrieval control
is a bench backend."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest

from jaxdm.bench import run as bench_run
from jaxdm.bench.run import BenchConfig, BenchError, build_backends, run
from jaxdm.decision import Oracle
from jaxdm.decision.types import Cost
from jaxdm.harness.dm import BM25Shortlist

TOKENS = 7   # per answer


class Counted:
    """The Oracle with a price tag: each answer reports TOKENS prompt tokens and takes 2 ms."""

    name = "counted"

    def __init__(self):
        self.oracle, self.answers = Oracle(), 0

    def choose(self, questions):
        time.sleep(0.002)
        self.answers += len(questions)
        return [dataclasses.replace(r, cost=Cost(tokens_in=TOKENS, seconds=0.002))
                for r in self.oracle.choose(questions)]


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_an_l3_only_report_counts_tokens_and_seconds_per_call(tmp_path, monkeypatch):
    model = Counted()
    monkeypatch.setattr(bench_run, "build_backends", lambda specs: [("counted", model)])
    res = run(BenchConfig(levels=("l3",), judges=("oracle",), out_dir=str(tmp_path),
                          l3_envs=("base",), l3_tasks=2, progress=False))
    cost = res["backends"]["counted"]["cost"]
    rows = _lines(tmp_path / "l3_episodes.jsonl")
    assert model.answers > 0 and sum(r["dm_questions"] for r in rows) == model.answers
    assert cost["calls"] == model.answers
    assert cost["tokens_in"] == TOKENS * model.answers
    assert 0.002 <= cost["seconds_per_call"] < 1.0
    line = [x for x in (tmp_path / "report.md").read_text().splitlines()
            if x.startswith("| counted | 1.000")][0]
    assert line.endswith(f"| {model.answers} | {TOKENS * model.answers} | "
                         f"{cost['seconds_per_call']} |")
    # L3 step records keep the model's own pick
    recs = _lines(tmp_path / "records.jsonl")
    assert recs and all(r["choice"] in r["answer"] for r in recs)   # the Oracle is right


def test_records_keep_the_chosen_option_and_the_key(tmp_path):
    run(BenchConfig(levels=("l2",), judges=("oracle:noise=0.6,name=noisy", "bm25"),
                    out_dir=str(tmp_path), l2_tasks=2, progress=False))
    recs = _lines(tmp_path / "records.jsonl")
    from jaxdm.bench.l2 import L2Config, build_l2
    questions, _ = build_l2(L2Config(tasks=2))
    assert len(recs) == 2 * len(questions)
    for r, q in zip(recs, questions + questions):   # backend by backend, question order
        assert r["answer"] == list(q.meta["answer"])
        assert r["chosen"] == q.options[r["choice"]]
        assert r["correct"] == (r["choice"] in r["answer"])
    noisy = [r for r in recs if r["backend"] == "noisy"]
    assert any(not r["correct"] for r in noisy) and any(r["correct"] for r in noisy)


def test_bm25_is_a_bench_backend_with_its_own_name():
    got = build_backends(["bm25", "bm25:query=tail,name=bm25-tail", "oracle"])
    assert [n for n, _ in got] == ["bm25", "bm25-tail", "oracle"]
    assert isinstance(got[0][1], BM25Shortlist) and got[1][1].query == "tail"
    with pytest.raises(BenchError, match="two judges share a name"):
        build_backends(["bm25", "bm25:query=tail"])
    with pytest.raises(BenchError, match="bm25 query must be one of"):
        build_backends(["bm25:query=all"])
