"""A trained judge at tiny scale: a few packed-SFT steps on Progress labels (milestone -> yes,
no-op -> no, other actions left out) move the milestone - no-op gap of the judge's P(Yes) in
the right direction (fixed seed; measured on the training trajectories: a 2-layer random
model is not expected to generalise in a few steps). Prefix contexts: each question's context
ends with its action, and the Prefix requests of a trajectory pack into one shared row."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.decision.synthetic import alfworld_like_trajectory
from jaxdm.train import packing, sft
from jaxdm.train.data import read_states, write_states
from jaxdm.train.judge_data import judge_lines
from tests.train.train_fixtures import tiny


def _p_yes(params, config, batch, items, answer):
    b, w, fv = batch
    sc = np.asarray(packing.option_scores(params, config, b, window=w, full_vocab=fv))
    p = 1.0 / (1.0 + np.exp(sc[:, 1] - sc[:, 0]))                # P(Yes) / (P(Yes) + P(No))
    return float(np.mean([pi for pi, it in zip(p, items) if it.answer == answer]))


def _gap(params, config, batch, items):
    return (_p_yes(params, config, batch, items, (0,))
            - _p_yes(params, config, batch, items, (1,)))


def test_few_steps_move_the_gap(tmp_path):
    trajs = [alfworld_like_trajectory(seed=s, n_actions=12) for s in (3, 5)]  # 4 yes, 4 no
    lines, stats = judge_lines(trajs, context="prefix")
    assert stats == {"milestone": 4, "no_op": 4, "other": 0, "unlabelled": 16,
                     "trajectories": 2}
    items = [it for s in read_states(write_states(tmp_path / "judge.jsonl", lines)) for it in s]
    assert len(items) == 8
    pre = tiny(seed=2)
    b, w, fv, stats = packing.pack_items(packing.Encoder(pre, "readout"), items)
    assert stats["groups"] == 2                     # one shared row per trajectory
    batch = (jax.tree.map(jnp.asarray, b), w, fv)
    step, opt = sft.train_step_fn(pre.config, None, 0.5, 1e-2, 0.0)
    params, opt_state = pre.params, opt.init(pre.params)
    before = _gap(params, pre.config, batch, items)
    for _ in range(12):
        params, opt_state, loss, _, _ = step(params, opt_state, params, *batch)
        assert np.isfinite(float(loss))
    after = _gap(params, pre.config, batch, items)
    assert abs(before) < 0.05 and after > before + 0.2, (before, after)


def test_judge_trains_on_the_tokens_it_is_scored_on(tmp_path):
    """A training line's Yes/No item and the judge request the teacher / screen scores for
    the same action are the same tokens, read at the same position with the same labels."""
    from jaxdm.decision.local import LocalReadout
    from jaxdm.roles import judge_requests

    traj = alfworld_like_trajectory(seed=3, n_actions=12)
    pre = tiny(seed=2)
    enc, judge = packing.Encoder(pre, "readout"), LocalReadout(pre)
    for context in ("hindsight", "prefix"):
        lines, _ = judge_lines([traj], context=context)
        items = [it for s in read_states(write_states(tmp_path / f"{context}.jsonl", lines))
                 for it in s]
        targets = [q["target"] for line in lines for q in line["questions"]]
        asked = judge_requests(traj, context=context)
        scored = judge.yesno_requests([asked[t] for t in targets])
        assert len(items) == len(scored) == 4
        for it, want in zip(items, scored):
            [got], how = enc.requests(it)
            assert how == "readout" and got == want


def test_other_actions_labelled_either_train_the_whole_ranking(tmp_path):
    """other="either": the actions that are neither milestone nor no-op get the target 0.5
    (answer ["yes", "no"]); a few steps order P(Yes) milestone > other > no-op."""
    trajs = [alfworld_like_trajectory(seed=s, n_actions=12) for s in (3, 5)]
    lines, stats = judge_lines(trajs, context="prefix", other="either")
    assert stats == {"milestone": 4, "no_op": 4, "other": 16, "unlabelled": 0,
                     "trajectories": 2}
    assert sum(q["answer"] == ["yes", "no"] for line in lines for q in line["questions"]) == 16
    items = [it for s in read_states(write_states(tmp_path / "judge.jsonl", lines)) for it in s]
    assert sorted({it.answer for it in items}) == [(0,), (0, 1), (1,)]
    pre = tiny(seed=2)
    b, w, fv, _ = packing.pack_items(packing.Encoder(pre, "readout"), items)
    batch = (jax.tree.map(jnp.asarray, b), w, fv)
    step, opt = sft.train_step_fn(pre.config, None, 0.5, 1e-2, 0.0)
    params, opt_state = pre.params, opt.init(pre.params)
    for _ in range(16):
        params, opt_state, loss, _, _ = step(params, opt_state, params, *batch)
        assert np.isfinite(float(loss))
    m, o, z = (_p_yes(params, pre.config, batch, items, a) for a in ((0,), (0, 1), (1,)))
    assert m > o + 0.1 and o > z + 0.1, (m, o, z)


def test_other_label_names_are_checked():
    with pytest.raises(ValueError, match="other must be one of"):
        judge_lines([alfworld_like_trajectory(seed=3, n_actions=4)], other="yes")


@pytest.mark.parametrize("answer", [[], ["yes", "yes"], ["maybe"], "Yes", True, ["yes", 0]])
def test_bad_yes_no_answers_are_named(tmp_path, answer):
    write_states(tmp_path / "bad.jsonl", [{"context": "c", "questions": [
        {"question": "Did it help?", "answer": answer}]}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: questions\[0\]: a question without "
                                         r"'options' is Yes/No"):
        read_states(tmp_path / "bad.jsonl")


def test_balanced_class_weights_average_one_and_reach_the_loss(tmp_path):
    """class_weights="balanced": weight n / (kinds * n_kind) per label kind, written on each
    question, read into SFTItem.weight and the batch's question_weight; the batch loss is the
    weighted mean of the per-question losses."""
    trajs = [alfworld_like_trajectory(seed=s, n_actions=12) for s in (3, 5)]
    lines, stats = judge_lines(trajs, context="hindsight", other="either",
                               class_weights="balanced")
    # 4 milestones, 4 no-ops, 16 others: 24 / (3 * n)
    assert stats["weights"] == {"milestone": 2.0, "no_op": 2.0, "other": 0.5}
    got = [(q["answer"], q["weight"]) for line in lines for q in line["questions"]]
    assert sorted({(str(a), w) for a, w in got}) == [("['yes', 'no']", 0.5), ("no", 2.0),
                                                     ("yes", 2.0)]
    assert np.mean([w for _, w in got]) == pytest.approx(1.0)
    items = [it for s in read_states(write_states(tmp_path / "w.jsonl", lines)) for it in s]
    assert sorted({it.weight for it in items}) == [0.5, 2.0]
    pre = tiny(seed=2)
    b, w, fv, _ = packing.pack_items(packing.Encoder(pre, "readout"), items)
    assert np.asarray(b.question_weight)[:len(items)].tolist() == [it.weight for it in items]
    assert np.all(np.asarray(b.question_weight)[len(items):] == 0)
    batch = jax.tree.map(jnp.asarray, b)
    loss, _ = packing.batch_loss(pre.params, pre.config, batch, window=w, full_vocab=fv)
    from jaxdm.train import losses
    sc = packing.option_scores(pre.params, pre.config, batch, window=w, full_vocab=fv)
    ce, se, valid = (np.asarray(x) for x in losses.sft_loss_terms(sc, batch.targets,
                                                                   batch.option_mask))
    qw = np.asarray(b.question_weight)
    per = np.where(valid, ce + losses.MU * se, 0.0)
    assert float(loss) == pytest.approx(float((qw * per).sum() / qw[valid].sum()), rel=1e-5)
    # unweighted lines give the plain mean, exactly as before weights existed
    plain = [it for s in read_states(write_states(tmp_path / "p.jsonl", judge_lines(
        trajs, context="hindsight", other="either")[0])) for it in s]
    b2, w2, fv2, _ = packing.pack_items(packing.Encoder(pre, "readout"), plain)
    loss2, _ = packing.batch_loss(pre.params, pre.config, jax.tree.map(jnp.asarray, b2),
                                  window=w2, full_vocab=fv2)
    assert float(loss2) == pytest.approx(float(per[valid].mean()), rel=1e-6)


def test_class_weights_and_question_weights_are_checked(tmp_path):
    traj = [alfworld_like_trajectory(seed=3, n_actions=6)]
    with pytest.raises(ValueError, match=r"unknown label kind\(s\) \['noop'\]"):
        judge_lines(traj, class_weights={"noop": 2.0})
    with pytest.raises(ValueError, match=r"class_weights\['no_op'\] must be a finite number > 0"):
        judge_lines(traj, class_weights={"no_op": float("nan")})
    with pytest.raises(ValueError, match="class_weights must be None, 'balanced' or a mapping"):
        judge_lines(traj, class_weights="inverse")
    lines, stats = judge_lines(traj, class_weights={"no_op": 3.0})
    assert stats["weights"] == {"milestone": 1.0, "no_op": 3.0, "other": 1.0}
    for bad in (0, -1.0, True, "2", float("inf")):
        write_states(tmp_path / "bad.jsonl", [{"context": "c", "questions": [
            {"question": "Did it help?", "answer": "no", "weight": bad}]}])
        with pytest.raises(ValueError, match=r"bad.jsonl:1: questions\[0\]: 'weight' must be "
                                             r"a finite number > 0"):
            read_states(tmp_path / "bad.jsonl")
