"""ECE on a hand-computed case; L2 states with the configured after-error share; a bench run."""
import json

import pytest

from jaxdm.bench import metrics
from jaxdm.bench.l2 import L2Config, build_l2
from jaxdm.bench.run import BenchConfig, BenchError, run


def test_ece_hand_case():
    # 10 bins. Confidences 0.95, 0.95, 0.85 (correct, wrong, correct), 0.55 (wrong), 1.0 (correct).
    # bin 9 [0.9, 1.0]: 0.95, 0.95, 1.0 -> acc 2/3, conf 0.9667 -> |diff| 0.3 ; weight 3/5
    # bin 8 [0.8, 0.9): 0.85 -> acc 1, conf 0.85 -> 0.15 ; weight 1/5
    # bin 5 [0.5, 0.6): 0.55 -> acc 0, conf 0.55 -> 0.55 ; weight 1/5
    # ECE = 0.6 * 0.3 + 0.2 * 0.15 + 0.2 * 0.55 = 0.18 + 0.03 + 0.11 = 0.32
    got = metrics.ece([0.95, 0.95, 0.85, 0.55, 1.0], [True, False, True, False, True])
    assert got == pytest.approx(0.32, abs=1e-9)
    assert metrics.ece([0.7] * 10, [True] * 7 + [False] * 3) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        metrics.ece([1.2], [True])


def test_l2_share_is_configurable():
    qs, st = build_l2(L2Config(tasks=12, after_error_share=0.5))
    assert abs(st["after_error_share"] - 0.5) < 0.05
    assert st["questions"] == len(qs) > 0
    assert {q.meta["kind"] for q in qs} == {"tool", "param", "stop"}
    assert all(q.meta["answer"] for q in qs)
    assert sum(q.meta["must_ask"] for q in qs if q.meta["kind"] == "tool") == st["must_ask_states"]


def test_bench_run_with_oracles(tmp_path):
    cfg = BenchConfig(levels=("l1", "l2"), judges=("oracle", "oracle:noise=0.3,name=noisy"),
                      out_dir=str(tmp_path), l1_tool=30, l1_param=30, l2_tasks=6, progress=False)
    res = run(cfg)
    assert res["backends"]["oracle"]["all"]["accuracy"] == 1.0
    assert res["backends"]["oracle"]["all"]["ece"] == 0.0
    noisy = res["backends"]["noisy"]
    assert 0.4 < noisy["all"]["accuracy"] < 0.95
    assert noisy["cost"]["calls"] == res["backends"]["oracle"]["cost"]["calls"]
    for name in ("bench.json", "report.md", "accuracy.png", "records.jsonl"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "bench.json").read_text())["data"]["l2"]["states"] > 0
    assert "l2/tool/must_ask" in (tmp_path / "report.md").read_text()
    with pytest.raises(BenchError, match="unknown bench level"):
        BenchConfig(levels=("l9",))


def test_backend_refusals_are_counted_not_dropped():
    from jaxdm.bench.run import answer_all
    from jaxdm.decision.types import MultipleChoice, choice_ok

    class Small:
        def choose(self, qs):
            if any(len(q.options) > 3 for q in qs):
                raise ValueError("more than 3 options")
            return [choice_ok([1.0] + [0.0] * (len(q.options) - 1)) for q in qs]

    qs = [MultipleChoice("c", "q", ("a", "b")), MultipleChoice("c", "q", tuple("abcde"))]
    res = answer_all(Small(), qs, batch=8)
    assert res[0].ok and not res[1].ok and "more than 3 options" in res[1].error


def _small(tmp_path, **kw):
    base = dict(levels=("l1", "l2"), judges=("oracle", "oracle:noise=0.3,name=noisy"),
                out_dir=str(tmp_path), l1_tool=8, l1_param=8, l2_tasks=2, progress=False)
    return BenchConfig(**{**base, **kw})


def _without_seconds(res):
    for b in res["backends"].values():
        b["cost"].pop("seconds"), b["cost"].pop("seconds_per_call")
    res["data"].pop("build_seconds")
    return res


def test_an_interrupted_bench_resumes_unit_by_unit(tmp_path, monkeypatch):
    from jaxdm.bench import run as bench_run
    fresh = _without_seconds(run(_small(tmp_path / "fresh")))
    calls = []
    real = bench_run._run_unit

    def crash_on_third(backend, name, level, *args):
        calls.append((name, level))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(backend, name, level, *args)

    monkeypatch.setattr(bench_run, "_run_unit", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        run(_small(tmp_path / "cut"))
    assert len((tmp_path / "cut" / "units.jsonl").read_text().splitlines()) == 2
    # a second start without a flag is refused; with other settings, --resume is refused
    with pytest.raises(BenchError, match="already holds a bench run .*--resume.*--overwrite"):
        run(_small(tmp_path / "cut"))
    with pytest.raises(BenchError, match=r"different settings: l1_tool: 8 -> 9; "):
        run(_small(tmp_path / "cut", l1_tool=9), resume=True)
    calls.clear()
    resumed = _without_seconds(run(_small(tmp_path / "cut"), resume=True))
    assert calls == [("noisy", "l1"), ("noisy", "l2")]   # the finished units were kept
    resumed["config"]["out_dir"] = fresh["config"]["out_dir"]
    assert resumed == fresh
    assert [json.loads(x) for x in (tmp_path / "cut" / "records.jsonl").read_text().splitlines()
            ] == [json.loads(x) for x in (tmp_path / "fresh" / "records.jsonl").read_text()
                  .splitlines()]


def test_overwrite_replaces_only_our_files(tmp_path):
    run(_small(tmp_path, judges=("oracle",), levels=("l1",)))
    (tmp_path / "notes.txt").write_text("mine")
    run(_small(tmp_path, judges=("oracle",), levels=("l1",), l1_tool=4), overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert json.loads((tmp_path / "bench_run.json").read_text())["l1_tool"] == 4
    with pytest.raises(BenchError, match="exclude each other"):
        run(_small(tmp_path), resume=True, overwrite=True)


def test_a_backend_failing_every_answer_fails_the_job_and_keeps_the_rest(tmp_path):
    down = "remote:base_url=http://127.0.0.1:9/v1,model=m,max_retries=0,timeout=2,name=down"
    cfg = _small(tmp_path, judges=("oracle", down), levels=("l1",))
    with pytest.raises(BenchError, match=r"too many failed answers: down on l1 \(16 of 16 "
                                         r"answers failed .*--resume"):
        run(cfg)
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["failed_units"][0]["backend"] == "down"
    assert res["backends"]["oracle"]["all"]["accuracy"] == 1.0
    # failed answers are not wrong answers: no accuracy, 16 failed
    assert res["backends"]["down"]["all"] | {"ece": None} == {
        "n": 16, "accuracy": None, "ece": None, "failed": 16, "refused": 0}
    assert res["n_failed_answers"] == 16
    assert "down failed on l1" in (tmp_path / "report.md").read_text()
    units = [json.loads(x) for x in (tmp_path / "units.jsonl").read_text().splitlines()]
    assert [(u["backend"], u["level"], u["complete"]) for u in units] == [
        ("oracle", "l1", True), ("down", "l1", False)]
    with pytest.raises(BenchError, match="max_failed_share"):
        _small(tmp_path, max_failed_share=1.5)
