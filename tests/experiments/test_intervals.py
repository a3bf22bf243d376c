"""``experiments/intervals.py``: the README's error-bar convention (mean ± 95 % t-interval over
seeds), the Wilson interval for one run's success rate, and the readers of the result folders.
Expected values are written out by hand (t quantiles from tables: t_{0.975,1} = 12.7062,
t_{0.975,2} = 4.3027)."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("intervals_script",
                                               ROOT / "experiments" / "intervals.py")
iv = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = iv  # its dataclasses look their module up there
_spec.loader.exec_module(iv)


def test_t_interval_of_three_seeds():
    # [1, 2, 3]: mean 2, sample sd 1, half = 4.302653 * 1 / sqrt(3) = 2.484138
    mean, half = iv.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302652729749462 / math.sqrt(3), rel=1e-12)
    assert half == pytest.approx(2.484138, abs=1e-6)
    assert isinstance(mean, float) and isinstance(half, float)


def test_t_interval_uses_the_sample_sd_not_the_population_sd():
    # README toy ordering, outcome-only GRPO: 75.0 / 74.48 / 87.5 % (the old figure, the
    # population sd, was 6.0); sample sd = 7.372, half = 4.3027 * 7.372 / sqrt(3) = 18.313
    vals = [75.0, 74.47916666666667, 87.5]
    mean, half = iv.t_interval(vals)
    assert mean == pytest.approx(78.993, abs=1e-3)
    assert np.std(vals) == pytest.approx(6.019, abs=1e-3)
    assert half == pytest.approx(18.313, abs=1e-3)


def test_t_interval_two_seeds_and_no_spread():
    # n = 2: [0, 2]: sd sqrt(2), half = 12.7062 * sqrt(2) / sqrt(2) = 12.7062
    assert iv.t_interval([0.0, 2.0]) == pytest.approx((1.0, 12.706204736174694))
    assert iv.t_interval([0.3, 0.3, 0.3]) == (pytest.approx(0.3), 0.0)


def test_t_interval_over_seeds_of_curves():
    # [seeds, iterations]: one interval per iteration, over axis 0
    mean, half = iv.t_interval([[0.0, 1.0, 5.0], [2.0, 3.0, 5.0]])
    assert mean.tolist() == [1.0, 2.0, 5.0]
    assert half == pytest.approx([12.706204736174694, 12.706204736174694, 0.0])


@pytest.mark.parametrize("bad, match", [
    ([4.0], "at least 2 values"),
    ([], "at least 2 values"),
    (3.0, "scalar"),
    ([1.0, float("nan")], "non-finite"),
    ([1.0, float("inf"), 2.0], "non-finite"),
    (["a", "b"], "not numbers"),
])
def test_t_interval_refuses_bad_input_by_name(bad, match):
    with pytest.raises(iv.IntervalError, match=match):
        iv.t_interval(bad)


def test_wilson_interval():
    # 5 of 10: centre 0.5, half = 1.96 sqrt(0.025 + 1.96² / 400) / (1 + 1.96² / 10) = 0.2634
    low, high = iv.wilson_interval(5, 10)
    assert (low, high) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    # 0 of 10: [0, z² / (n + z²)] = [0, 3.8415 / 13.8415]
    assert iv.wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    low, high = iv.wilson_interval(10, 10)
    assert high == pytest.approx(1.0) and low == pytest.approx(1 - 0.277533, abs=1e-6)
    # 186 of 200 (the harness's 0.930): centre (0.93 + 0.0096) / 1.0192 = 0.9219,
    # half 1.96 * sqrt(0.93 * 0.07 / 200 + 3.8415 / 160000) / 1.0192 = 0.0360
    assert iv.wilson_interval(186, 200) == pytest.approx((0.8859, 0.9578), abs=1e-4)
    from scipy import stats  # the same interval, computed independently by scipy

    ci = stats.binomtest(186, 200).proportion_ci(method="wilson")
    assert iv.wilson_interval(186, 200) == pytest.approx((ci.low, ci.high), abs=1e-12)


@pytest.mark.parametrize("args", [(11, 10), (-1, 10), (0, 0), (1.5, 10), (True, 2)])
def test_wilson_interval_refuses_bad_counts(args):
    with pytest.raises(iv.IntervalError):
        iv.wilson_interval(*args)


def _run(folder: Path, name: str, records: list[dict]) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_eval_per_seed_reads_each_seeds_last_or_chosen_evaluation(tmp_path):
    _run(tmp_path, "grpo_seed0", [{"step": 1, "train/success": 0.1},
                                  {"step": 3, "eval/All": 10.0}, {"step": 8, "eval/All": 20.0}])
    _run(tmp_path, "grpo_seed10", [{"step": 3, "eval/All": 30.0}, {"step": 8, "eval/All": 40.0}])
    _run(tmp_path, "grpo_seed2", [{"step": 3, "eval/All": 50.0}, {"step": 8, "eval/All": 60.0}])
    _run(tmp_path, "teacher_seed0", [{"step": 8, "eval/All": 99.0}])
    # sorted by seed number (0, 2, 10), not by name; another estimator's runs left out
    assert iv.eval_per_seed(tmp_path, "grpo") == [20.0, 60.0, 40.0]
    assert iv.eval_per_seed(tmp_path, "grpo", step=3) == [10.0, 50.0, 30.0]
    with pytest.raises(FileNotFoundError, match="no eval/All record at iteration 5"):
        iv.eval_per_seed(tmp_path, "grpo", step=5)
    with pytest.raises(FileNotFoundError, match="no gigpo_seed<s> runs"):
        iv.eval_per_seed(tmp_path, "gigpo")


def test_train_per_seed_averages_the_chosen_iterations(tmp_path):
    recs = [{"step": i, "train/success": 0.1 * i} for i in range(1, 6)]
    _run(tmp_path, "grpo_seed0", recs + [{"step": 5, "eval/All": 1.0}])
    _run(tmp_path, "grpo_seed1", [{"step": i, "train/success": 0.5} for i in range(1, 6)])
    # iterations 2-4 of seed 0: (0.2 + 0.3 + 0.4) / 3 = 0.3 -> 30 %
    assert iv.train_per_seed(tmp_path, "grpo", 2, 4) == pytest.approx([30.0, 50.0])
    with pytest.raises(FileNotFoundError, match="5 of iterations 1-6 recorded"):
        iv.train_per_seed(tmp_path, "grpo", 1, 6)


def test_babyai_per_seed_reads_summary_fractions_as_percent(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"methods": {"lvrl": {"id": [0.25, 0.5, 0.125], "ood": [0.0, 0.0, 0.0]}}}))
    assert iv.babyai_per_seed(tmp_path, "lvrl", "id") == [25.0, 50.0, 12.5]
    with pytest.raises(KeyError, match="no methods.grpo.id"):
        iv.babyai_per_seed(tmp_path, "grpo", "id")


def test_old_statistics_are_the_readmes_earlier_figures():
    # the committed results reproduce the figures the README printed before the change:
    # toy ordering's population sd and the BabyAI tables' standard error
    rows = {(r.table, r.label): r for r in iv.readme_rows()}
    grpo = rows[("toy ordering, standard: held-out success % after 30 it.", "outcome-only GRPO")]
    assert grpo.old == "pop. sd" and round(grpo.old_value(), 1) == 6.0
    lvrl = rows[("LVRL BabyAI (it. 100)", "LVRL, Oracle value: ID %")]
    assert lvrl.old == "s.e." and round(lvrl.old_value(), 1) == 6.1
    mean, half = iv.t_interval(lvrl.values)
    assert (round(mean, 1), round(half, 1)) == (26.2, 26.4)
    assert all(len(r.values) == 3 for r in rows.values())


def test_paired_differences_are_per_seed_differences():
    diffs = {r.label: r for r in iv.paired_differences()}
    d = diffs["toy hard: oracle teacher − GRPO (it. 30)"]
    # per seed teacher 78.65 / 72.92 / 72.40 minus GRPO 58.33 / 46.88 / 72.40
    assert d.values == pytest.approx((20.3125, 26.0417, 0.0), abs=1e-3)
    assert d.old is None
    assert "–" in iv.format_row(d)


def test_single_run_rates_are_counts_from_the_result_files():
    rates = {label: (k, n) for label, k, n in iv.single_run_rates()}
    assert rates["harness base_strong: llm_alone success"] == (186, 200)   # 0.930
    assert rates["mc_validation alfworld: oracle agree_all"] == (13, 13)
    assert rates["train_dm_gym L2 accuracy: smollm2-sft"] == (7, 19)
    assert rates["lvrl_smollm2_values: step-sign agreement where the Oracle moves"] == (17, 42)
    with pytest.raises(iv.IntervalError, match="not a count out of 3"):
        iv._count(0.5, 3, "x")


def test_main_prints_every_table_and_names_a_missing_folder(tmp_path, capsys):
    assert iv.main([]) == 0
    out = capsys.readouterr().out
    assert "| outcome-only GRPO | 3 | 75.0 / 74.5 / 87.5 | 79.0 ± 18.3 [60.7, 97.3] | " \
           "79.0 ± 6.0 (pop. sd) |" in out
    assert "paired differences" in out
    assert "| harness base_strong: llm_alone success | 186 / 200 | 0.930 [0.886, 0.958] |" in out
    assert iv.main(["--results", str(tmp_path / "none")]) == 2
    assert "intervals: error:" in capsys.readouterr().err
