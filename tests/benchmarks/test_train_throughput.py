"""benchmarks/train_throughput.py's GRPO workload without running a benchmark: its argument
parsing (``--quick`` per workload, named errors), the child-process arguments, the reward
function, the single-turn first-action env and the tasks TRL is given, and the trainer
config both sides' settings come from."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tt():
    spec = importlib.util.spec_from_file_location(
        "train_throughput", os.path.join(ROOT, "benchmarks", "train_throughput.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_settings_per_workload(tt):
    g = tt.parse_args(["--workload", "grpo", "--quick"])
    assert (g.layers, g.prompts, g.group, g.completion_tokens, g.iterations, g.warmup,
            g.turns, g.rounds) == (2, 1, 2, 8, 2, 1, 0, 1)
    s = tt.parse_args(["--quick"])
    assert (s.workload, s.layers, s.budget, s.steps, s.rounds) == ("sft", 4, 12, 5, 1)
    full = tt.parse_args(["--workload", "grpo"])
    assert (full.layers, full.prompts, full.group, full.completion_tokens, full.iterations,
            full.turns, full.rounds) == (30, 2, 4, 32, 5, 3, 2)
    assert full.sides == ("trl", "jaxdm", "jaxdm_multiturn")
    assert tt.parse_args(["--workload", "grpo", "--sides", "jaxdm,jaxdm_multiturn"]).sides == (
        "jaxdm", "jaxdm_multiturn")


@pytest.mark.parametrize("argv", [
    ["--workload", "grpo", "--group", "1"],
    ["--workload", "grpo", "--dtype", "bfloat16"],
    ["--workload", "grpo", "--prompts", "0"],
    ["--workload", "grpo", "--turns", "-1"],
    ["--workload", "grpo", "--warmup", "-1"],
    ["--workload", "ppo"],
    ["--workload", "grpo", "--sides", "trl,vllm"],
    ["--workload", "grpo", "--sides", ","],
])
def test_bad_arguments_are_named_errors(tt, argv, capsys):
    with pytest.raises(SystemExit) as e:
        tt.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_child_arguments_carry_the_settings(tt):
    args = tt.parse_args(["--workload", "grpo", "--prompts", "3", "--group", "5",
                          "--completion-tokens", "12", "--iterations", "4", "--warmup", "2",
                          "--turns", "2"])
    again = tt.parse_args(["--workload", "grpo", "--child", "jaxdm", *tt.grpo_argv(args)])
    for k in ("prompts", "group", "completion_tokens", "iterations", "warmup", "turns"):
        assert getattr(again, k) == getattr(args, k), k


def test_completion_reward(tt):
    ok = "<think>the ball is ahead</think> <action>go forward</action>"
    assert tt.completion_reward(ok, "go forward") == 1.0
    assert tt.completion_reward(ok, "turn left") == 0.0
    assert tt.completion_reward("<action>go forward</action>", "go forward") == 0.0  # no think
    assert tt.completion_reward("go forward", "go forward") == 0.0
    assert tt.completion_reward(ok, None) == 0.0  # a task without a plan rewards nothing
    assert tt.action_reward(None, "go forward") == 0.0


def test_first_action_env_and_tasks(tt):
    from jaxdm.envs.babyai.solver import solve
    from jaxdm.envs.babyai.text import ACTION_WORDS
    from jaxdm.envs.core import INFO_KEYS
    from jaxdm.rl.policy import TurnInput
    from jaxdm.rl.text import INVALID_COMMAND, policy_prompt

    env = tt.first_action_env()
    obs, state = env.reset(3)
    info = env.reset_info(state)
    expert = ACTION_WORDS[int(solve(state[0].core)[0])]
    assert info["expert"] == expert and info["budget"] == 1
    assert info["admissible_actions"] == list(ACTION_WORDS)
    _, _, r, done, step_info = env.step(0, state, expert)
    assert (r, done) == (1.0, True) and step_info["won"] and step_info["valid"]
    assert set(INFO_KEYS) <= set(step_info)
    wrong = next(a for a in ACTION_WORDS if a != expert)
    assert env.step(0, state, wrong)[2] == 0.0
    _, _, r, done, step_info = env.step(0, state, INVALID_COMMAND)
    assert (r, done, step_info["valid"]) == (0.0, True, False)

    rows = tt.first_action_tasks([3, 4])
    assert [r["seed"] for r in rows] == [3, 4] and rows[0]["expert"] == expert
    # TRL's prompt text is the one the trainer's generative policy renders at this state.
    turn = TurnInput(goal=info["goal"], observation=obs, admissible=tuple(ACTION_WORDS),
                     history=(), steps_taken=0, budget=1)
    assert rows[0]["prompt"] == policy_prompt(turn.goal, turn.observation, turn.admissible,
                                              [], 0)
    assert rows[0]["prompt"] != rows[1]["prompt"]


def test_grpo_config_is_a_valid_trainer_config(tt):
    from jaxdm import config as cfgmod
    from jaxdm.rl.trainer import TrainConfig
    args = tt.parse_args(["--workload", "grpo"])
    single = cfgmod.from_dict(TrainConfig, tt.grpo_config(args, multi_turn=False,
                                                          out_dir="/tmp/x", model_path="m"))
    assert (single.max_actions, single.tasks_per_iter, single.group_size) == (1, 2, 4)
    assert single.algo.mini_batch == 8 and single.algo.advantage == "grpo"
    assert (single.algo.kl_coef, single.algo.entropy_coef, single.algo.invalid_penalty) == (
        0.0, 0.0, 0.0)
    assert single.policy.form == "generative" and single.policy.max_response_tokens == 32
    assert single.env.factory == "train_throughput:first_action_env"
    multi = cfgmod.from_dict(TrainConfig, tt.grpo_config(args, multi_turn=True,
                                                         out_dir="/tmp/x", model_path="m"))
    assert multi.max_actions == 3 and multi.env.kwargs["max_steps"] == 3
    assert multi.policy.history == 2 and multi.algo.mini_batch == 8


def test_tool_workload_trains_the_correct_option_on_trl(tt):
    """--workload tool: our step gets the 69-option DECISION GYM question; TRL's row is our
    prompt + the correct option's tokens (its likelihood request), the loss mask on exactly
    those option tokens."""
    from jaxdm.models.smollm2 import smollm2
    from jaxdm.train import packing
    quick = tt.parse_args(["--workload", "tool", "--quick"])
    assert (quick.layers, quick.items) == (4, "tool")
    assert tt.parse_args([]).items == "judge"
    (item,), mode = tt.workload_items("tool", 30)
    assert mode == "likelihood" and item.n_options == 69
    (row,) = tt.trl_rows(30, "tool")
    reqs, how = packing.Encoder(smollm2(), mode).requests(item)
    want = reqs[item.answer[0]]
    assert how == "likelihood" and row["input_ids"] == list(want.tokens)
    marked = [i for i, m in enumerate(row["completion_mask"]) if m]
    assert marked == [p + 1 for p in want.answer_positions]
    assert marked[-1] == len(row["input_ids"]) - 1       # the option ends the sequence
    judge = tt.trl_rows(12)
    assert all(r["completion_mask"][-1] == 1 and sum(r["completion_mask"]) == 1 for r in judge)


def test_visible_pairs_count_the_segment_rule(tt):
    """The floor's attention pairs: a trunk's causal pairs, then per suffix token the trunk
    tokens it sees and its own request's tokens up to itself (padding: none)."""
    import types

    import numpy as np
    scoring = types.SimpleNamespace(
        trunk_tokens=np.zeros((2, 4), np.int32), trunk_len=np.array([3, 1]),
        suffix_segments=np.array([[1, 1, 2, -1], [1, -1, -1, -1]]),
        suffix_visible=np.array([[3, 3, 2, 0], [1, 0, 0, 0]]))
    # row 0: 3 * 4 / 2 causal + (3 + 3 + 1 + 2) + (2 + 1); row 1: 1 + (1 + 1)
    assert tt.visible_pairs(scoring) == 6 + 9 + 3 + 1 + 2
