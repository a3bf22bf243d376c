"""jaxdm.stats: non-inferiority (seed 003's check), cost test, Holm vs statsmodels, two stages."""
import json
import math

import numpy as np
import pytest
from scipy import optimize, stats as sps
from statsmodels.stats.multitest import multipletests

from jaxdm import stats as S

METHODS = sorted(S.NONINFERIORITY_METHODS)


# ------------------------------------------------------------- the seed's check (n = 500)

@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n01", [0, 1, 2, 3])
def test_seed_case_0972_fails_for_every_consistent_pairing(method, n01):
    # Reference 0.994 (497/500), candidate 0.972 (486/500): n10 - n01 = 11, and n01 can be
    # 0..3 (the reference fails only 3 tasks). Every such pairing must fail at 3 points.
    a, b = S.paired_outcomes(500, 497, 486, n01)
    assert (a.mean(), b.mean()) == (0.994, 0.972)
    r = S.noninferiority(a, b, margin=0.03, alpha=0.05, method=method)
    assert (r.n10, r.n01) == (11 + n01, n01)
    assert not r.noninferior and r.p_value > 0.05
    assert r.lower_bound < -0.03


@pytest.mark.parametrize("method", METHODS)
def test_seed_case_1000_passes(method):
    # Candidate 1.000 solves every task, so the only pairing is n10 = 0, n01 = 3.
    a, b = S.paired_outcomes(500, 497, 500, 3)
    r = S.noninferiority(a, b, method=method)
    assert r.noninferior and r.p_value < 0.001
    assert r.diff == pytest.approx(0.006) and r.lower_bound > -0.03
    with pytest.raises(ValueError, match="no pairing"):
        S.paired_outcomes(500, 497, 500, 0)


def test_wald_hand_computed():
    # n = 500, n10 = 11, n01 = 0: d = -0.022, var = (0.022 - 0.022^2) / 500,
    # z = (d + 0.03) / sqrt(var) = 0.008 / 0.0065585 = 1.2198.
    a, b = S.paired_outcomes(500, 497, 486, 0)
    r = S.noninferiority(a, b, method="wald")
    assert r.z == pytest.approx(0.008 / math.sqrt((0.022 - 0.022 ** 2) / 500), rel=1e-12)
    assert r.p_value == pytest.approx(sps.norm.sf(r.z))
    se = math.sqrt((0.022 - 0.022 ** 2) / 500)
    assert r.lower_bound == pytest.approx(-0.022 - 1.6448536 * se)


@pytest.mark.parametrize("n10,n01", [(11, 0), (14, 3), (0, 3), (0, 0), (40, 5)])
def test_tango_matches_numerical_restricted_mle(n10, n01):
    # Tango's Z uses the ML estimate of q10 under q01 - q10 = -m; maximise that likelihood
    # numerically and rebuild Z from it.
    n, m = 500, 0.03
    rest = n - n10 - n01

    def nll(q):
        return -(n01 * np.log(q - m) + n10 * np.log(q) + rest * np.log(1 - 2 * q + m))
    q = optimize.minimize_scalar(nll, bounds=(m + 1e-12, (1 + m) / 2 - 1e-12), method="bounded",
                                 options={"xatol": 1e-13}).x
    z_num = (n01 - n10 + n * m) / math.sqrt(n * (2 * q - m * (1 + m)))
    a, b = S.paired_outcomes(n, n - rest - n01, n - rest - n10, n01)
    r = S.noninferiority(a, b, margin=m, method="tango")
    assert r.z == pytest.approx(z_num, rel=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_lower_bound_inverts_the_test(method):
    a, b = S.paired_outcomes(300, 280, 276, 6)
    r = S.noninferiority(a, b, method=method)
    # At margin = -lower_bound the test sits exactly at alpha.
    at = S.noninferiority(a, b, margin=-r.lower_bound, method=method)
    assert at.p_value == pytest.approx(0.05, abs=1e-6)
    assert S.noninferiority(a, b, margin=-r.lower_bound + 1e-3, method=method).noninferior
    assert not S.noninferiority(a, b, margin=-r.lower_bound - 1e-3, method=method).noninferior


def test_identical_arms_tango_finite_wald_degenerate():
    ones = np.ones(500, bool)
    t = S.noninferiority(ones, ones)
    # No discordant pairs: q~10 = m, Z = sqrt(n m / (1 - m)).
    assert t.z == pytest.approx(math.sqrt(500 * 0.03 / 0.97)) and t.noninferior
    assert S.noninferiority(ones, ones, method="wald").z == math.inf


def test_noninferiority_bad_input():
    with pytest.raises(ValueError, match=r"shape"):
        S.noninferiority(np.ones(5), np.ones(6))
    with pytest.raises(ValueError, match=r"success_b\[2\] = 2"):
        S.noninferiority([1, 0, 1], [1, 0, 2])
    with pytest.raises(ValueError, match="1-D"):
        S.noninferiority(np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="unknown non-inferiority method"):
        S.noninferiority([1], [1], method="exact")
    with pytest.raises(ValueError, match="margin"):
        S.noninferiority([1], [1], margin=-0.1)


# ------------------------------------------------------------------------- cost test

def test_cost_t_matches_scipy_and_wilcoxon():
    rng = np.random.default_rng(0)
    a = rng.gamma(2.0, 0.01, 200)
    b = a * 0.8 + rng.normal(0, 0.002, 200)
    r = S.cost_lower(a, b)
    ref = sps.ttest_rel(b, a, alternative="less")
    assert r.p_value == pytest.approx(ref.pvalue) and r.statistic == pytest.approx(ref.statistic)
    assert r.cheaper and r.saving == pytest.approx(1 - b.mean() / a.mean())
    w = S.cost_lower(a, b, method="wilcoxon")
    assert w.p_value == pytest.approx(sps.wilcoxon(b - a, alternative="less").pvalue)
    assert not S.cost_lower(b, a).cheaper


def test_cost_constant_difference_and_bad_input():
    a = np.full(10, 1.0)
    assert S.cost_lower(a, a - 0.5).cheaper
    assert not S.cost_lower(a, a).cheaper
    with pytest.raises(ValueError, match=r"cost_b\[1\] = nan"):
        S.cost_lower([1.0, 1.0], [1.0, float("nan")])


# ------------------------------------------------------------------------------ Holm

@pytest.mark.parametrize("seed", range(5))
def test_holm_matches_statsmodels(seed):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 0.05, 5), rng.uniform(0, 1, 6), [0.01, 0.01]])
    rng.shuffle(p)
    ours = S.holm(p, 0.05)
    reject, adj, _, _ = multipletests(p, alpha=0.05, method="holm")
    np.testing.assert_allclose(ours.p_adjusted, adj, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(ours.reject, reject)


def test_holm_hand_case_and_errors():
    # k = 3, sorted 0.01, 0.02, 0.04: 3*0.01 = 0.03, 2*0.02 = 0.04, 1*0.04 = 0.04.
    h = S.holm([0.04, 0.01, 0.02])
    np.testing.assert_allclose(h.p_adjusted, [0.04, 0.03, 0.04])
    assert h.reject.all()
    with pytest.raises(ValueError, match=r"p_values\[1\] = 1.5"):
        S.holm([0.1, 1.5])


# ------------------------------------------------------------------------ two stages

def _arm(success, cost, ids):
    return S.Arm(np.asarray(success), np.asarray(cost, float), tuple(ids))


def _stage1_data(n=500, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"t{i}" for i in range(n)]
    ref_s = (rng.random(n) < 0.95).astype(int)
    ref_c = rng.gamma(4.0, 0.005, n)
    def cand(loss, saving):
        s = ref_s.copy()
        flip = rng.choice(np.flatnonzero(s), int(loss * n), replace=False)
        s[flip] = 0
        return _arm(s, ref_c * (1 - saving) + rng.normal(0, 1e-4, n), ids)
    arms = {"tool/cascade": cand(0.0, 0.30), "tool/replace": cand(0.06, 0.60),
            "params/cascade": cand(0.002, 0.10), "params/assist": cand(0.0, 0.20),
            "stop/guard": cand(0.0, -0.05)}
    return _arm(ref_s, ref_c, ids), arms


def test_stages_end_to_end():
    reg = S.register([("tool/cascade", "tool"), ("tool/replace", "tool"),
                      ("params/cascade", "params"), ("params/assist", "params"),
                      ("stop/guard", "stop")])
    ref, arms = _stage1_data()
    r1 = S.stage1(reg, ref, arms)
    rows = {row["name"]: row for row in r1.table()}
    # Holm is applied across the registered candidates' intersection-union p-values.
    np.testing.assert_allclose([c.p_holm for c in r1.comparisons],
                               S.holm([max(c.noninferiority.p_value, c.cost.p_value)
                                       for c in r1.comparisons]).p_adjusted)
    assert r1.passed() == ["tool/cascade", "params/cascade", "params/assist"]
    assert not rows["tool/replace"]["passed"]          # 6 points lost: inferior
    assert not rows["stop/guard"]["passed"]            # 5 % dearer: not cheaper
    sel = S.stage2_selection(r1)
    assert sel == {"tool": "tool/cascade", "params": "params/assist", "stop": None}

    rng = np.random.default_rng(1)
    new_ids = [f"new{i}" for i in range(500)]
    ref2 = _arm((rng.random(500) < 0.95).astype(int), rng.gamma(4.0, 0.005, 500), new_ids)
    comb = _arm(ref2.success, ref2.cost * 0.5, new_ids)
    r2 = S.stage2(r1, ref2, {"combined": comb})
    assert r2.passed() == ["combined"] and r2.stage == 2
    assert r2.comparisons[0].cost.saving == pytest.approx(0.5)
    # Stage 2 on Stage 1's tasks is refused.
    with pytest.raises(ValueError, match="new tasks"):
        S.stage2(r1, ref, {"combined": arms["tool/cascade"]})


def test_stage_inputs_must_match_the_registration():
    reg = S.register([("a", "tool"), ("b", "tool")], margin=0.05)
    ref, arms = _stage1_data(100)
    one = arms["tool/cascade"]
    with pytest.raises(ValueError, match=r"\['zzz'\] were not registered"):
        S.stage1(reg, ref, {"a": one, "b": one, "zzz": one})
    with pytest.raises(ValueError, match=r"no result for registered \['b'\]"):
        S.stage1(reg, ref, {"a": one})
    with pytest.raises(TypeError, match="Registration"):
        S.stage1({"candidates": []}, ref, {"a": one, "b": one})
    shuffled = S.Arm(one.success, one.cost, tuple(reversed(one.task_ids)))
    with pytest.raises(ValueError, match="same tasks in the same order"):
        S.stage1(reg, ref, {"a": one, "b": shuffled})
    with pytest.raises(ValueError, match="duplicate candidate names"):
        S.register([("a", "tool"), ("a", "stop")])
    assert reg.digest != S.register([("a", "tool"), ("b", "tool")]).digest  # margin differs
    again = S.Registration.from_plan(json.loads(json.dumps(reg.plan())))
    assert again.digest == reg.digest and again.candidates == reg.candidates
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['extra'\]"):
        S.Registration.from_plan({**reg.plan(), "extra": 1})
