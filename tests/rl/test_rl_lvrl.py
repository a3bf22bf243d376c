"""LVRL anchoring, normalisation and the GRPO fallback against numpy transcriptions."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxdm.rl import advantages as adv
from jaxdm.rl.values.estimator import lvrl_step_advantages


def ragged(seed: int, num_groups: int = 4, max_t: int = 7):
    """Random ragged groups: sizes 1-5, lengths 0..T (single-step and full-length rows, the
    latter standing for truncation), one all-fail group, one all-success group."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, num_groups)
    group_ids = np.repeat(np.arange(num_groups), sizes).astype(np.int32)
    b = len(group_ids)
    lengths = rng.integers(0, max_t + 1, b)
    lengths[0], lengths[-1] = 1, max_t          # a single-step row and a truncated row
    mask = np.arange(max_t)[None, :] < lengths[:, None]
    rewards = (rng.random(b) < 0.4).astype(np.float32)
    rewards[group_ids == 0] = 0.0               # all-fail group
    rewards[group_ids == 1] = 1.0               # all-success group
    rewards[-1] = 0.0                           # truncated: budget ran out, no reward
    values = rng.random((b, max_t + 1)).astype(np.float32)
    return values, rewards, group_ids, mask


def np_anchored(values, rewards, group_ids, mask):
    b, t = mask.shape
    out = np.zeros((b, t))
    for i in range(b):
        v = values[i].astype(np.float64).copy()
        n = int(mask[i].sum())
        v[0] = rewards[group_ids == group_ids[i]].mean()
        v[n] = rewards[i]
        out[i, :n] = np.diff(v[:n + 1])
    return out


def np_normalised(values, rewards, group_ids, mask, rows, eps=1e-6):
    raw = np_anchored(values, rewards, group_ids, mask)
    sel = mask & rows[:, None]
    rms = np.sqrt((raw[sel] ** 2).sum() / max(sel.sum(), 1))
    return raw / (rms + eps)


@pytest.mark.parametrize("seed", range(3))
def test_anchoring_and_rms_match_numpy(seed):
    values, rewards, group_ids, mask = ragged(seed)
    for normalize in ("none", "rms"):
        got = np.asarray(adv.lvrl_advantages(values, rewards, group_ids, mask, num_groups=4,
                                             normalize=normalize))
        want = (np_anchored(values, rewards, group_ids, mask) if normalize == "none" else
                np_normalised(values, rewards, group_ids, mask, np.ones(len(rewards), bool)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.all(got[~mask] == 0.0)


@pytest.mark.parametrize("seed", range(3))
def test_rms_keeps_every_sign_and_each_total_sign(seed):
    values, rewards, group_ids, mask = ragged(seed)
    raw = np.asarray(adv.lvrl_advantages(values, rewards, group_ids, mask, num_groups=4))
    norm = np.asarray(adv.lvrl_advantages(values, rewards, group_ids, mask, num_groups=4,
                                          normalize="rms"))
    np.testing.assert_array_equal(np.sign(norm), np.sign(raw))
    p_hat = np.array([rewards[group_ids == g].mean() for g in group_ids])
    rows = mask.any(1)
    # Totals telescope to R_i - p_hat (unnormalised) and keep that sign after normalising.
    np.testing.assert_allclose(raw.sum(1)[rows], (rewards - p_hat)[rows], atol=1e-5)
    total_sign = np.sign(np.round(rewards - p_hat, 6))[rows]
    np.testing.assert_array_equal(np.sign(np.round(norm.sum(1), 5))[rows], total_sign)


def test_all_fail_group_single_step_and_truncation_by_hand():
    # Group 0: two failures (one truncated at T = 3), group 1: one single-step success.
    values = np.array([[0.5, 0.2, 0.6, 0.9],
                       [0.5, 0.3, 0.1, 0.0],
                       [0.5, 0.7, 0.0, 0.0]], np.float32)
    rewards = np.array([0.0, 0.0, 1.0], np.float32)
    mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
    got = np.asarray(adv.lvrl_advantages(values, rewards, np.array([0, 0, 1]), mask,
                                         num_groups=2))
    # row 0: V = [0, .2, .6, 0] -> [.2, .4, -.6]; row 1: V = [0, .3, 0] -> [.3, -.3];
    # row 2: V = [1, 1] -> [0] (p_hat = R = 1).
    np.testing.assert_allclose(got, [[0.2, 0.4, -0.6], [0.3, -0.3, 0.0], [0.0, 0.0, 0.0]],
                               atol=1e-6)


def test_fallback_rows_get_grpo_and_stay_out_of_the_scale():
    values, rewards, group_ids, mask = ragged(3)
    rows = np.arange(len(rewards)) % 3 != 1
    returns = np.where(mask, rewards[:, None], 0.0).astype(np.float32)
    got = np.asarray(jax.jit(lvrl_step_advantages, static_argnames=("num_groups", "normalize"))(
        values, rows, rewards, returns, group_ids, mask, num_groups=4, normalize="rms"))
    want_lvrl = np_normalised(values, rewards, group_ids, mask, rows)
    want_grpo = np.asarray(adv.grpo_outcome_advantages(returns, group_ids, mask, num_groups=4))
    np.testing.assert_allclose(got[rows], want_lvrl[rows], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[~rows], want_grpo[~rows], atol=1e-6)


def test_errored_rows_stay_out_of_the_anchor():
    # Group 0: a success (2 actions), a failure (2 actions) and an episode lost to an env error
    # whose recorded reward (1.0) is not an outcome. p_hat must be 1/2 (kept rows), not 2/3.
    values = np.array([[0.0, 0.7, 0.0], [0.0, 0.2, 0.0], [0.0, 0.9, 0.0]], np.float32)
    rewards = np.array([1.0, 0.0, 1.0], np.float32)
    mask = np.array([[1, 1], [1, 1], [0, 0]], bool)   # errored rows execute nothing
    kept = np.array([True, True, False])
    gids = np.array([0, 0, 0])
    got = np.asarray(adv.lvrl_advantages(values, rewards, gids, mask, num_groups=1, kept=kept))
    np.testing.assert_allclose(got, [[0.2, 0.3], [-0.3, -0.2], [0.0, 0.0]], atol=1e-6)
    np.testing.assert_allclose(got.sum(1)[:2], [0.5, -0.5], atol=1e-6)
    # Through the registered estimator (the EpisodeBatch ``errored`` mask): same anchors.
    import types

    from jaxdm.rl.estimators import ESTIMATORS
    from jaxdm.rl.signals import Signal

    eb = types.SimpleNamespace(outcome=rewards, returns=np.where(mask, rewards[:, None], 0.0),
                               groups=gids, mask=mask, errored=~kept)
    algo = types.SimpleNamespace(lvrl_normalize="none", eps=1e-6)
    sig = Signal({"values": values}, np.array([True, True, True]), {})
    out = ESTIMATORS["lvrl"].fn(eb, {"values": sig}, algo, 1)
    np.testing.assert_allclose(out.adv, got, atol=1e-6)
    assert out.stats["lvrl/fallback_rows"] == 0
    with pytest.raises(ValueError, match="kept"):
        adv.lvrl_advantages(values, rewards, gids, mask, num_groups=1, kept=np.ones(2, bool))


def test_bad_inputs_are_named():
    values, rewards, group_ids, mask = ragged(0)
    with pytest.raises(ValueError, match="normalize"):
        adv.lvrl_advantages(values, rewards, group_ids, mask, num_groups=4, normalize="std")
    with pytest.raises(ValueError, match="value_rows"):
        adv.lvrl_advantages(values, rewards, group_ids, mask, num_groups=4,
                            value_rows=np.ones(2, bool))
