"""Pipelined rollouts: the policy generates for one half of the slots while the other half's
envs step. Same episodes as a sequential rollout for a deterministic policy, reproducible
sampling keys, halves that end at their own time, and a real overlap in time."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.envs.toy import make_ordering_env
from jaxdm.envs.vector import EnvFactory, VectorEnv
from jaxdm.rl import rollout as rollout_mod
from jaxdm.rl import evaluation as evaluation_mod
from jaxdm.rl.policy import ActionOut
from jaxdm.rl.rollout import LocalVectorEnv, pipeline_halves, rollout
from jaxdm.rl.trainer import TrainConfig, Trainer
import jaxdm.train.harness_rollout  # noqa: F401  registers policy.kind harness (a preset's)

# The stub envs' module must be importable here and in spawned VectorEnv workers (which
# inherit sys.path), whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_pipeline_stub_envs import KeyedEnv  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _out(action: str) -> ActionOut:
    return ActionOut(action=action, valid=True, raw=action, logp=0.0, unit={})


class Deterministic:
    """A deterministic stand-in policy whose choice depends on the goal and the step, so
    episodes differ in length and outcome; it records the slots' goals of every call."""

    form = "option"

    def __init__(self):
        self.calls: list[list[str]] = []

    def act(self, params, states, key, *, greedy=False, pad_to=None):
        self.calls.append([s.goal for s in states])
        return [_out(s.admissible[(s.steps_taken * 7 + len(s.goal)) % len(s.admissible)])
                for s in states]


class Sampling:
    """Samples uniformly among admissible actions with the given key (argmax-like first
    action when greedy); records the key data of every call."""

    form = "option"

    def __init__(self):
        self.keys: list[np.ndarray] = []

    def act(self, params, states, key, *, greedy=False, pad_to=None):
        self.keys.append(np.asarray(jax.random.key_data(key)))
        if greedy:
            return [_out(s.admissible[0]) for s in states]
        picks = jax.random.randint(key, (len(states),), 0, 1 << 20)
        return [_out(s.admissible[int(p) % len(s.admissible)]) for s, p in zip(states, picks)]


class Sleepy:
    """Stand-in for accelerator generation: sleeps ``per_state_s`` per state (releases the
    GIL, as a device call does), then answers deterministically."""

    form = "option"

    def __init__(self, per_state_s: float):
        self.per_state_s = per_state_s

    def act(self, params, states, key, *, greedy=False, pad_to=None):
        time.sleep(self.per_state_s * len(states))
        return [_out("a") for _ in states]


def _episodes(res):
    return [(e.slot, e.task_seed, [a.command for a in e.actions],
             [a.observation for a in e.actions], e.reward, e.success, e.truncated,
             e.trajectory) for e in res.episodes]


def test_pipeline_halves():
    assert [h.tolist() for h in pipeline_halves(5)] == [[0, 2, 4], [1, 3]]
    assert [h.tolist() for h in pipeline_halves(1)] == [[0]]
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        pipeline_halves(0)


def test_pipelined_equals_sequential_local_and_workers():
    b, g = 8, 2
    local_seq = rollout(Deterministic(), None, LocalVectorEnv(make_ordering_env(), b,
                                                              group_size=g),
                        seed=7, key=jax.random.key(0), max_actions=5)
    pol = Deterministic()
    local_pip = rollout(pol, None, LocalVectorEnv(make_ordering_env(), b, group_size=g),
                        seed=7, key=jax.random.key(0), max_actions=5, pipeline=True)
    with VectorEnv("jaxdm.envs.toy:make_ordering_env", b, num_workers=2, group_size=g,
                   max_steps=5) as venv:
        workers_seq = rollout(Deterministic(), None, venv, seed=7, key=jax.random.key(0),
                              max_actions=5)
        workers_pip = rollout(Deterministic(), None, venv, seed=7, key=jax.random.key(0),
                              max_actions=5, pipeline=True)
    assert _episodes(local_seq) == _episodes(local_pip)
    assert _episodes(workers_seq) == _episodes(workers_pip)
    assert [e[:7] for e in _episodes(local_seq)] == [e[:7] for e in _episodes(workers_pip)]
    # The episodes really differ, so the comparison means something: lengths and outcomes.
    lengths = [len(e.actions) for e in local_seq.episodes]
    assert len(set(lengths)) > 1 and max(lengths) <= 5
    assert {e.success for e in local_seq.episodes} == {True, False}
    # Sequential: one call per turn; pipelined: the two halves alternate, every call holds
    # the live slots of one half only (even slots first: slot 0, 2, 4, 6 play tasks 7-10).
    assert local_seq.policy_calls == local_seq.turns == max(lengths)
    assert local_pip.turns == local_seq.turns
    even = [e.goal for e in local_seq.episodes[0::2]]
    odd = [e.goal for e in local_seq.episodes[1::2]]
    assert pol.calls[0] == even and pol.calls[1] == odd
    for call in pol.calls:
        assert set(call) <= set(even) or set(call) <= set(odd)
    n_half_turns = sum(max(len(e.actions) for e in local_seq.episodes[h::2]) for h in (0, 1))
    assert local_pip.policy_calls == len(pol.calls) == n_half_turns
    assert local_pip.overlap_s == 0.0  # an in-process pool steps nothing in the background
    assert workers_seq.overlap_s == 0.0


def test_sampling_keys_per_half_turn_are_reproducible():
    b = 4

    def run(key, pipeline, greedy=False):
        pol = Sampling()
        res = rollout(pol, None, LocalVectorEnv(make_ordering_env(), b), seed=3, key=key,
                      max_actions=5, pipeline=pipeline, greedy=greedy)
        return res, pol.keys

    key = jax.random.key(11)
    a, keys_a = run(key, True)
    again, _ = run(key, True)
    assert _episodes(a) == _episodes(again)
    # Half h's t-th call gets the t-th split of fold_in(key, h); the halves alternate.
    expect = []
    for h in (0, 1):
        k = jax.random.fold_in(key, h)
        chain = []
        for _ in range(5):
            k, sub = jax.random.split(k)
            chain.append(np.asarray(jax.random.key_data(sub)))
        expect.append(chain)
    np.testing.assert_array_equal(keys_a[0], expect[0][0])
    np.testing.assert_array_equal(keys_a[1], expect[1][0])
    np.testing.assert_array_equal(keys_a[2], expect[0][1])
    # Sequential rollouts keep their per-turn split of ``key``.
    _, keys_seq = run(key, False)
    np.testing.assert_array_equal(keys_seq[0], np.asarray(jax.random.key_data(
        jax.random.split(key)[1])))
    # A different key gives different samples; greedy decoding gives identical episodes.
    others = [_episodes(run(jax.random.key(s), True)[0]) for s in range(12, 16)]
    assert any(o != _episodes(a) for o in others)
    assert _episodes(run(key, True, greedy=True)[0]) == _episodes(run(key, False,
                                                                      greedy=True)[0])


def test_one_half_finishes_first_then_the_other_runs_alone():
    # KeyedEnv task k needs k % 3 + 2 steps: slot 0 plays task 0 (2 steps), slot 1 task 1
    # (3 steps), slot 2 task 2 (4 steps), slot 3 task 3 (2 steps).
    pol = Deterministic()
    res = rollout(pol, None, LocalVectorEnv(KeyedEnv(), 4), seed=0, key=jax.random.key(0),
                  max_actions=6, pipeline=True)
    assert [len(e.actions) for e in res.episodes] == [2, 3, 4, 2]
    assert [e.reward > 0 for e in res.episodes] == [True] * 4
    # even half (slots 0, 2): 4 turns, odd half (1, 3): 3 turns, alternating while both live
    sizes = [len(c) for c in pol.calls]
    assert sizes == [2, 2, 2, 2, 1, 1, 1]
    assert res.policy_calls == 7 and res.turns == 4


def test_budget_and_policy_errors_leave_pool_usable():
    with pytest.raises(ValueError, match="max_actions must be >= 1"):
        rollout(Deterministic(), None, LocalVectorEnv(KeyedEnv(), 2), seed=0,
                key=jax.random.key(0), max_actions=0, pipeline=True)

    class NoAsync:
        num_envs = 2

    with pytest.raises(TypeError, match="step_async"):
        rollout(Deterministic(), None, NoAsync(), seed=0, key=jax.random.key(0),
                max_actions=2, pipeline=True)

    class Fails(Deterministic):
        def act(self, params, states, key, **kw):
            if len(self.calls) == 1:  # the second call, while half 0 steps
                raise RuntimeError("device fell over")
            return super().act(params, states, key, **kw)

    with VectorEnv(EnvFactory("rl_pipeline_stub_envs:KeyedEnv"), 4, num_workers=2) as venv:
        with pytest.raises(RuntimeError, match="device fell over"):
            rollout(Fails(), None, venv, seed=0, key=jax.random.key(0), max_actions=6,
                    pipeline=True)
        # nothing left in flight: the next rollout runs, and its budget truncates
        res = rollout(Deterministic(), None, venv, seed=2, key=jax.random.key(0),
                      max_actions=2, pipeline=True)
    assert [len(e.actions) for e in res.episodes] == [2, 2, 2, 2]
    # tasks 2, 3, 4, 5 need 4, 2, 3, 4 steps: only task 3 ends within the budget of 2
    assert [e.truncated for e in res.episodes] == [True, False, True, True]


def test_pipeline_overlaps_generation_with_env_steps():
    """Policy: 0.05 s per state (0.2 s per 4-slot call); env: 0.1 s per step, 2 workers owning
    2 slots each (0.2 s per full-batch step). 4 turns (tasks 2: 4 steps each).
    Sequential: 4 x (0.2 + 0.2) = 1.6 s. Pipelined: each half call (0.1 s) runs while the
    other half steps (0.1 s: one slot per worker), about 0.1 + 8 x 0.1 = 0.9 s."""
    factory = EnvFactory("rl_pipeline_stub_envs:SleepyEnv", {"step_s": 0.1})
    with VectorEnv(factory, 4, num_workers=2, group_size=4) as venv:
        rollout(Sleepy(0.0), None, venv, seed=2, key=jax.random.key(0), max_actions=1)
        seq = rollout(Sleepy(0.05), None, venv, seed=2, key=jax.random.key(0), max_actions=8)
        pip = rollout(Sleepy(0.05), None, venv, seed=2, key=jax.random.key(0), max_actions=8,
                      pipeline=True)
    assert seq.turns == pip.turns == 4 and _episodes(seq) == _episodes(pip)
    assert seq.policy_calls == 4 and pip.policy_calls == 8
    assert seq.wall_s > 1.5  # 0.8 s of policy sleep plus 0.8 s of env sleep
    assert seq.overlap_s == 0.0 and seq.env_s > 0.75
    assert pip.wall_s < 0.8 * seq.wall_s, (pip.wall_s, seq.wall_s)
    # 7 of the 8 half calls (0.1 s each) ran while the other half stepped
    assert pip.overlap_s > 0.5 and pip.generation_s > 0.75
    assert pip.env_s < 0.5 * seq.env_s  # most env time was hidden behind generation


def test_trainer_config_and_wiring(tmp_path, monkeypatch):
    presets = {p.stem: cfgmod.load_config(TrainConfig, p)
               for p in sorted((REPO / "experiments" / "configs").glob("teacher_grpo_*.yaml"))}
    assert presets["teacher_grpo_alfworld_qwen1.5b"].rollout_pipeline is False
    assert presets["teacher_grpo_webshop_qwen1.5b"].rollout_pipeline is False
    assert presets["teacher_grpo_cpu"].rollout_pipeline is False
    assert TrainConfig().rollout_pipeline is False
    with pytest.raises(cfgmod.ConfigError, match="rollout_pipeline: expected true/false"):
        cfgmod.load_config(TrainConfig, None, ["rollout_pipeline='yes'"])
    cfg = cfgmod.load_config(TrainConfig, None, [
        "model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
        "model.num_kv_heads=1", "model.head_dim=16", "policy.form=option",
        "policy.max_prompt_tokens=96", "progress=false", "mesh_data=1",
        "env.name=toy_ordering", "max_actions=4", "tasks_per_iter=2", "group_size=2",
        "eval_tasks=4", "eval_seeds=[0]", "eval_greedy=true", "rollout_pipeline=true",
        f"out_dir={tmp_path}"])
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["pipeline"])
        return rollout(*args, **kwargs)

    monkeypatch.setattr(rollout_mod, "rollout", spy)  # the host collector imports it per call
    monkeypatch.setattr(evaluation_mod, "rollout", spy)
    tr = Trainer(cfg, log=False)
    try:
        # The real (tiny, random) option policy, greedy: pipelined == sequential episodes.
        kw = dict(seed=0, key=jax.random.key(0), max_actions=4, greedy=True)
        seq = rollout(tr.policy, tr.params, tr.venv, **kw)
        pip = rollout(tr.policy, tr.params, tr.venv, pipeline=True, **kw)
        assert _episodes(seq) == _episodes(pip)
        assert [a.out.logp for e in seq.episodes for a in e.actions] == pytest.approx(
            [a.out.logp for e in pip.episodes for a in e.actions], abs=1e-5)
        summary = tr.evaluate()
        assert 0.0 <= summary["eval/All"] <= 100.0
        assert seen == [True]
    finally:
        tr.close()
