"""Calibration, fit_threshold against hand-computed cases, estimates from shadow records,
the drift monitor."""
from __future__ import annotations

import math

import numpy as np
import pytest

from jaxdm.harness.fit import (DriftMonitor, binned, ece, estimate_point, fit_threshold,
                               isotonic)


def test_isotonic_pools_violators_by_hand():
    # sorted x: 0.1 0.2 0.3 0.4 0.5 with y 1 0 0 1 1 -> pool (1,0,0) = 1/3, then 1, 1
    xs, fit = isotonic([0.3, 0.1, 0.5, 0.2, 0.4], [0, 1, 1, 0, 1])
    assert xs.tolist() == [0.1, 0.2, 0.3, 0.4, 0.5]
    np.testing.assert_allclose(fit, [1 / 3, 1 / 3, 1 / 3, 1.0, 1.0])
    assert np.all(np.diff(fit) >= 0)


def test_fitted_threshold_equals_hand_computed_case():
    # q_L = 0.95, ΔC = 0.002 USD, V = 0.04 USD -> τ* = 0.95 - 0.002/0.04 = 0.90.
    conf = [0.30, 0.55, 0.60, 0.80, 0.85, 0.90, 0.97, 0.99]
    corr = [0, 1, 0, 1, 1, 0, 1, 1]
    # isotonic over sorted conf: (0), (1,0)->0.5,0.5, (1,1,0)->2/3 x3, 1, 1
    # -> fit = [0, .5, .5, .667, .667, .667, 1, 1]; the lowest level with fit >= 0.90 is 0.97
    f = fit_threshold(conf, corr, q_llm=0.95, delta_cost=0.002, value=0.04)
    assert f.tau_star == pytest.approx(0.90)
    assert f.threshold == pytest.approx(0.97)
    assert f.share_above == pytest.approx(2 / 8) and f.accuracy_above == 1.0
    # a cheaper-to-replace point: τ* = max(0, 0.95 - 0.05/0.04) = 0 -> everything adopted
    f0 = fit_threshold(conf, corr, q_llm=0.95, delta_cost=0.05, value=0.04)
    assert f0.tau_star == 0.0 and f0.threshold == pytest.approx(0.30)
    # min_support 3: two answers above 0.97 are not enough -> the LLM keeps the point
    f3 = fit_threshold(conf, corr, q_llm=0.95, delta_cost=0.002, value=0.04, min_support=3)
    assert f3.threshold is None and f3.share_above == 0.0


def test_binned_threshold_by_hand():
    conf = [0.05, 0.15, 0.55, 0.58, 0.92, 0.95]
    corr = [1, 0, 1, 0, 1, 1]
    bins = binned(conf, corr, n_bins=10)
    assert [b["n"] for b in bins] == [1, 1, 0, 0, 0, 2, 0, 0, 0, 2]
    assert bins[5]["accuracy"] == 0.5 and bins[9]["accuracy"] == 1.0
    f = fit_threshold(conf, corr, q_llm=0.8, delta_cost=0.0, value=1.0, method="binned")
    assert f.threshold == pytest.approx(0.9)  # only the top bin is >= 0.8
    assert ece([0.9, 0.9], [1, 0], n_bins=10) == pytest.approx(0.4)


def test_no_qualifying_interval_leaves_the_point_to_the_llm():
    f = fit_threshold([0.6, 0.7, 0.99], [0, 1, 0], q_llm=0.99, delta_cost=0.001, value=1.0)
    assert f.threshold is None


@pytest.mark.parametrize("kw,match", [
    (dict(confidence=[0.5, 1.2], correct=[1, 0]), "in \\[0, 1\\]"),
    (dict(confidence=[0.5], correct=[1, 0]), "equal length"),
    (dict(confidence=[0.5], correct=[1], value=0.0), "value"),
    (dict(confidence=[0.5], correct=[1], q_llm=math.nan), "q_llm"),
    (dict(confidence=[0.5], correct=[1], method="platt"), "method"),
])
def test_fit_threshold_bad_input(kw, match):
    args = dict(q_llm=0.9, delta_cost=0.001, value=1.0) | kw
    with pytest.raises(ValueError, match=match):
        fit_threshold(args.pop("confidence"), args.pop("correct"), **args)


def test_estimate_point_from_shadow_records():
    recs = [  # task a: the LLM erred at tool and the task failed; b, c: right and solved
        {"point": "tool", "task_id": "a", "answer": [1], "llm_correct": False,
         "confidence": 0.9, "dm_correct": True},
        {"point": "tool", "task_id": "b", "answer": [0], "llm_correct": True,
         "confidence": 0.4, "dm_correct": False},
        {"point": "tool", "task_id": "c", "answer": [0], "llm_correct": True,
         "confidence": 0.8, "dm_correct": True},
        {"point": "stop", "task_id": "c", "answer": [1], "llm_correct": True,
         "confidence": 0.7, "dm_correct": True},
    ]
    eps = [{"task_id": "a", "success": False}, {"task_id": "b", "success": True},
           {"task_id": "c", "success": True}]
    e = estimate_point(recs, eps, "tool", value_per_task=1.0, llm_price_per_answer=0.0001,
                       act_call_price=0.002, dm_price_per_question=0.0005)
    assert e["q_llm"] == pytest.approx(2 / 3)
    assert e["delta_cost"] == pytest.approx(0.0015)
    assert e["value"] == pytest.approx(1.0)  # success 1.0 without an LLM error, 0.0 with one
    assert e["confidence"] == [0.9, 0.4, 0.8] and e["correct"] == [True, False, True]
    s = estimate_point(recs, eps, "stop", value_per_task=1.0, llm_price_per_answer=0.0001,
                       act_call_price=0.002, dm_price_per_question=0.00002)
    assert s["delta_cost"] == pytest.approx(0.00008) and s["value"] == 1.0  # no LLM error seen


def test_drift_monitor_flags_a_shift():
    m = DriftMonitor(threshold=0.9, reference_share=0.5, window=10, tolerance=0.2)
    for c in [0.95, 0.5] * 5:
        m.update(c)
    assert m.share == 0.5 and not m.needs_refit
    for _ in range(8):
        m.update(0.3)  # the model became unsure: few answers above τ
    assert m.share == pytest.approx(0.1) and m.needs_refit
    assert len(m.history) == 18
    with pytest.raises(ValueError, match="finite"):
        m.update(math.nan)
