"""Harness GRPO as the trainer's rollout kind ``harness`` (``jaxdm.train.harness_rollout``):
the reward on hand cases (and under jit); the sampled tool choices are the executed ones; a
run through the trainer repeats the old standalone loop's golden (tasks, rewards, harness
counts, evaluation; the update to float tolerance); a run killed after its first iteration
and resumed ends with the uninterrupted run's parameters; bad settings name their key."""
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxdm import config as cfgmod
from jaxdm.rl.trainer import TrainConfig, Trainer
from jaxdm.runlog import read_metrics
from jaxdm.train.harness_rollout import build_policy, harness_reward, harness_settings, play

HERE = Path(__file__).resolve().parent
PRESET = HERE.parents[1] / "experiments" / "configs" / "teacher_grpo_harness.yaml"
GOLDEN = json.loads((HERE / "harness_grpo_golden.json").read_text())


def test_harness_reward_hand_cases():
    # r = success - 0.5 * max(0, C - 10) / 10 - 0.2 * E
    success = [1, 1, 0, 0, 1]
    calls = [5, 15, 30, 10, 10]
    errors = [0, 0, 1, 0, 1]
    want = [1.0, 0.75, -1.2, 0.0, 0.8]
    np.testing.assert_allclose(harness_reward(success, calls, errors), want, atol=1e-6)
    np.testing.assert_allclose(jax.jit(harness_reward)(np.array(success), np.array(calls),
                                                       np.array(errors)), want, atol=1e-6)
    # other constants
    assert float(harness_reward(1, 14, 0, lam=1.0, n0=4, eta=0.0)) == pytest.approx(-1.5)
    with pytest.raises(ValueError, match="one shape"):
        harness_reward([1, 0], [3], [0, 0])
    with pytest.raises(ValueError, match="n0"):
        harness_reward(1, 3, 0, n0=0)


def golden_cfg(out_dir, *extra):
    """The golden's setting (the old loop's keys) in trainer keys."""
    s = GOLDEN["setting"]
    h = s["hidden_size"]
    return cfgmod.load_config(TrainConfig, PRESET, [
        f"iterations={s['iterations']}", f"tasks_per_iter={s['tasks_per_iter']}",
        f"group_size={s['group_size']}", f"max_actions={s['max_steps']}",
        f"eval_tasks={s['eval_tasks']}", f"seed={s['seed']}", f"model.init_seed={s['seed']}",
        f"model.hidden_size={h}", f"model.intermediate_size={2 * h}",
        f"model.num_layers={s['num_layers']}", f"model.head_dim={h // 4}",
        f"policy.max_prompt_tokens={s['max_context_tokens']}",
        f"policy.max_option_tokens={s['max_option_tokens']}",
        f"algo.mini_batch={s['mini_batch']}", f"optim.lr={s['lr']}", "progress=false",
        f"out_dir={out_dir}", *extra])


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The golden setting trained uninterrupted through the trainer (evaluated before too)."""
    out = tmp_path_factory.mktemp("harness_full")
    tr = Trainer(golden_cfg(out), log=False)
    before = tr.evaluate()
    recs = tr.run()
    params = [np.asarray(x) for x in jax.tree.leaves(tr.params)]
    ref = [np.asarray(x) for x in jax.tree.leaves(tr.ref_params)]
    tr.close()
    return {"out": out, "before": before, "records": recs, "params": params, "ref": ref}


def test_trainer_repeats_the_old_loops_golden(full_run):
    """Same tasks, episodes (rewards, harness counts), decisions and evaluations as the old
    loop; the update's numbers to float tolerance (the trainer orders a mini-batch's rows
    by its checkpointed host RNG, the old loop by rng([seed, iteration, 1]): the sums differ
    in their last bits)."""
    its = [r for r in full_run["records"] if "train/success" in r]
    assert len(its) == len(GOLDEN["iterations"]) == 2
    for got, want in zip(its, GOLDEN["iterations"]):
        assert got["train/tasks"] == want["tasks"]
        for k in ("success", "reward", "llm_calls", "irreversible_errors", "steps",
                  "decisions", "groups_with_signal"):
            assert got[f"train/{k}"] == pytest.approx(want[k], abs=1e-9), k
        assert got["ppo/updates"] == want["ppo/updates"]
        assert got["optim/grad_norm"] == pytest.approx(want["optim/grad_norm"], rel=1e-5)
        assert got["loss/total"] == pytest.approx(want["loss/total"], abs=1e-6)
        assert np.isfinite(got["loss/total"]) and got["loss/entropy"] > 0
    final = full_run["records"][-1]
    for ev, want in ((full_run["before"], GOLDEN["before"]), (final, GOLDEN["after"])):
        assert ev["eval/All"] == pytest.approx(100.0 * want["success"])
        for k in ("reward", "llm_calls", "irreversible_errors", "steps"):
            assert ev[f"eval/All_{k}"] == pytest.approx(want[k]), k
    # GRPO moved the parameters (some group had reward variance)
    assert its[0]["train/groups_with_signal"] > 0
    assert any(not np.array_equal(a, b) for a, b in zip(full_run["params"], full_run["ref"]))
    lines = read_metrics(full_run["out"] / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 2] and "eval/table" not in lines[-1]


def test_killed_and_resumed_run_equals_the_uninterrupted_one(full_run, tmp_path):
    part = Trainer(golden_cfg(tmp_path), log=False)
    part.run(stop_after=1)
    assert part.iteration == 1
    part.close()
    resumed = Trainer(golden_cfg(tmp_path), log=False)
    recs = resumed.run(resume=True)
    assert resumed.iteration == 2
    for a, b in zip(full_run["params"], jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    resumed.close()
    assert recs[0]["train/tasks"] == full_run["records"][1]["train/tasks"]
    assert recs[-1]["eval/All_steps"] == full_run["records"][-1]["eval/All_steps"]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 2]
    # a changed run setting is refused on resume, naming the key
    from jaxdm.rundir import ResumeMismatchError
    changed = Trainer(golden_cfg(tmp_path, "env.kwargs.lam=0.7"), log=False)
    with pytest.raises(ResumeMismatchError, match="env.kwargs"):
        changed.run(resume=True)
    changed.close()


def test_sampled_choices_are_the_executed_ones(tmp_path):
    cfg = golden_cfg(tmp_path)
    policy, params, _, _ = build_policy(cfg)
    eps, rows, _ = play(policy, params, harness_settings(cfg), variant="base", split="train",
                        max_steps=3, indices=[3], key=jax.random.key(1), group_size=2)
    assert [e.group for e in eps] == [0, 0]
    for ep, row in zip(eps, rows):
        assert len(ep.actions) == row["dm_calls"] >= 1
        assert ep.reward == pytest.approx(float(harness_reward(
            float(row["success"]), row["llm_calls"], row["irreversible_errors"])))
        assert all(a.out.unit["chosen"] < len(a.out.unit["options"]) for a in ep.actions)
        assert all(a.command == a.out.action for a in ep.actions)


@pytest.mark.parametrize("override,key", [
    ("env.kwargs.variant=nope", "env.kwargs.variant"),
    ("env.kwargs.lam=nan", "env.kwargs.lam"),
    ("env.kwargs.n0=0", "env.kwargs.n0"),
    ("env.kwargs.budget=3", "env.kwargs.budget"),
    ("env.kwargs.llm={kind: simulated, profile: genius}", "env.kwargs.llm"),
    ("env.kwargs.llm={kind: gpt}", "env.kwargs.llm"),
    ("env.eval_kwargs.split=dev", "env.eval_kwargs.split"),
    ("env.name=toy_ordering", "env.name"),
    ("policy.form=generative", "policy.form"),
    ("algo.advantage=teacher;teacher.kind=oracle", "algo.advantage"),
    ("critic.kind=decoder", "critic.kind"),
    ("value={kind: oracle}", "value.kind"),
])
def test_bad_config_names_the_key(tmp_path, override, key):
    with pytest.raises((ValueError, cfgmod.ConfigError), match=key.replace(".", r"\.")):
        golden_cfg(tmp_path, *override.split(";"))
