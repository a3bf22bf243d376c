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
