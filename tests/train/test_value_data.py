"""Value-model training data (issue 40 §3): the trainer's value queries labelled by the Oracle
become graded Yes/No lines (one per rollout, each state over its own prefix context) that
train-dm reads and packs into one shared row per rollout; graded answers are checked."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.envs.babyai import BabyAIParams, make_text_env, play_trajectory, solve
from jaxdm.rl.values import OracleValueModel, ReadoutValueModel, values_signal
from jaxdm.train import packing, sft
from jaxdm.train.data import read_states, write_states
from jaxdm.train.value_data import ValueLabeller, value_lines
from tests.train.train_fixtures import tiny


class _Unasked:
    """A backend the test never calls (only the requests a readout model builds are read)."""

    def score(self, requests):
        raise AssertionError("not called")


def _rollouts():
    params = BabyAIParams.for_split("train", max_steps=12)
    env = make_text_env("train", max_steps=12)
    _, st = env.reset(60, params)
    plan = solve(st.core)
    a = play_trajectory(env, 60, plan, params)                 # success
    b = play_trajectory(env, 60, plan[:3] + [6] * 9, params)   # 3 plan steps, then "done"
    return [a, b]


def test_value_lines_are_the_trainers_questions_with_oracle_labels(tmp_path):
    trajs = _rollouts()
    labeller = ValueLabeller(OracleValueModel())
    sig = values_signal(trajs, [0, 0], labeller, num_steps=12)
    lines, stats = value_lines(labeller.asked)
    assert stats == {"rollouts": 2, "states": 8 + 11, "failed_rollouts": 0}
    # The labels are the signal's interior values; the questions are a readout model's.
    for i, line in enumerate(lines):
        n = len(trajs[i].steps)
        np.testing.assert_allclose([q["answer"] for q in line["questions"]],
                                   sig.values[i, 1:n], atol=1e-6)
        q0, res = labeller.asked[i]
        asked = ReadoutValueModel(_Unasked()).requests(q0)
        assert [(q["context"], q["question"]) for q in line["questions"]] == [
            (r.context, r.question) for r in asked]
        ctxs = [q["context"] for q in line["questions"]]
        assert all(b.startswith(a) for a, b in zip(ctxs, ctxs[1:]))
    items = read_states(write_states(tmp_path / "values.jsonl", lines))
    flat = [it for s in items for it in s]
    assert all(it.target is not None and abs(sum(it.target) - 1) < 1e-9 for it in flat)
    assert flat[0].target == pytest.approx((3 / 11, 8 / 11))
    pre = tiny(seed=2)
    b, w, fv, st = packing.pack_items(packing.Encoder(pre, "readout"), flat)
    assert st["groups"] == 2                                   # one shared row per rollout
    np.testing.assert_allclose(np.asarray(b.targets)[:, :2],
                               [list(it.target) for it in flat], atol=1e-6)
    # A few steps on graded targets move P(Yes) toward the labels.
    batch = (jax.tree.map(jnp.asarray, b), w, fv)
    step, opt = sft.train_step_fn(pre.config, None, 0.5, 1e-2, 0.0)
    params, opt_state = pre.params, opt.init(pre.params)
    want = np.array([it.target[0] for it in flat])

    def err(p):
        sc = np.asarray(packing.option_scores(p, pre.config, b, window=w, full_vocab=fv))
        return float(np.mean(np.abs(1 / (1 + np.exp(sc[:, 1] - sc[:, 0])) - want)))
    before = err(params)
    for _ in range(12):
        params, opt_state, loss, _, _ = step(params, opt_state, params, *batch)
    assert err(params) < 0.75 * before, (before, err(params))


@pytest.mark.parametrize("answer, match", [
    (1.5, r"a graded Yes/No 'answer' must be a number in \[0, 1\]"),
    (-0.1, r"a graded Yes/No 'answer' must be a number in \[0, 1\]")])
def test_bad_graded_answers_are_named(tmp_path, answer, match):
    write_states(tmp_path / "bad.jsonl", [{"context": "c", "questions": [
        {"question": "Will it succeed?", "answer": answer}]}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: questions\[0\]: " + match):
        read_states(tmp_path / "bad.jsonl")


def test_graded_answer_with_a_teacher_and_bad_own_context_are_named(tmp_path):
    write_states(tmp_path / "t.jsonl", [{"context": "c", "questions": [
        {"question": "q", "answer": 0.3, "teacher": [0.5, 0.5]}]}])
    with pytest.raises(ValueError, match="a graded 'answer' and a 'teacher'"):
        read_states(tmp_path / "t.jsonl")
    write_states(tmp_path / "c.jsonl", [{"context": "c", "questions": [
        {"context": "", "question": "q", "answer": "yes"}]}])
    with pytest.raises(ValueError, match="a question's own 'context' must be a non-empty"):
        read_states(tmp_path / "c.jsonl")


def test_failed_and_out_of_range_labels():
    from jaxdm.rl.values.models import ValueQuery, ValueResult
    traj = _rollouts()[0]
    q = ValueQuery(traj, "", ident=(0, 0))
    lines, stats = value_lines([(q, ValueResult(None, ok=False, error="down"))])
    assert lines == [] and stats["failed_rollouts"] == 1
    bad = np.full(len(traj.steps) - 1, 0.5, np.float32)
    bad[2] = 1.5
    with pytest.raises(ValueError, match="state 3: label 1.5 is not a finite value"):
        value_lines([(q, ValueResult(bad))])


def test_wrappers_name_their_inner_model_and_refuse_one_without_the_method():
    from jaxdm.rl.values import ListValueModel

    oracle = OracleValueModel()
    assert ValueLabeller(oracle).name == f"labels({oracle.name})"
    assert ReadoutValueModel(_Unasked()).name == "readout(_Unasked)"
    for build, role, method in ((ValueLabeller, "labeller", "values"),
                                (ReadoutValueModel, "backend", "score"),
                                (ListValueModel, "generator", "generate")):
        with pytest.raises(TypeError, match=rf"{role} must be .* with \.{method}, got object"):
            build(object())
