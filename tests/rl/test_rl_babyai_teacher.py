"""The privileged BabyAI teacher (jaxdm.rl.babyai_teacher): SFT on BFS-solver labels reaches
high success on the training layouts (the LVOPD issue's teacher requirement), at a small size."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
from jaxdm.envs.babyai.value import distance_field
from jaxdm.rl import babyai_teacher as bt


@pytest.fixture(scope="module")
def env():
    return BabyAIEnv(7)


def test_features_of_a_reset_state(env):
    _, st = env.reset(jax.random.key(3), BabyAIParams.for_split("train"))
    f = np.asarray(bt.teacher_features(st, distance_field(st)))
    assert f.shape == (bt.NUM_FEATURES,)
    # one bucket per move delta, one front type, one front state, one hands flag
    assert f[:15].reshape(3, 5).sum(1).tolist() == [1.0, 1.0, 1.0]
    assert f[-3:].tolist() == [1.0, 0.0, 0.0]           # hands free at reset
    assert f[15:17].tolist() == [0.0, 0.0]               # not facing the target, has a route


def test_sft_teacher_reaches_high_success_on_training_layouts(env):
    # small: 24 episodes of 64 steps, 100 Adam steps; the success check replays the same
    # compiled program as the data collection (same batch size and budget)
    params, rep = bt.sft_teacher(env, jax.random.key(0), episodes=24, steps=100, max_steps=64)
    assert rep.label_accuracy >= 0.95, rep
    train = bt.teacher_success(env, params, jax.random.key(1), "train", episodes=24,
                               max_steps=64)
    assert train >= 0.8, f"teacher success on training layouts {train:.3f} < 0.8 ({rep})"
    logits = bt.teacher_logits(params, *_a_state(env))
    assert logits.shape == (bt.NUM_ACTIONS,) and np.isfinite(np.asarray(logits)).all()


def _a_state(env):
    _, st = env.reset(jax.random.key(9), BabyAIParams.for_split("train"))
    return st, distance_field(st)


def test_sft_teacher_rejects_empty_data(env):
    with pytest.raises(ValueError, match="episodes"):
        bt.sft_teacher(env, jax.random.key(0), episodes=0, steps=10)
