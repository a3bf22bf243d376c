"""Cheap judge baselines (keyword rule, bag-of-words logistic regression), trajectory-bootstrap
intervals, and the cue-controlled ALFWorld agent they are compared on (issue 40 §2)."""
import numpy as np
import pytest

from jaxdm.envs.alfworld import noisy_expert_trajectories
from jaxdm.envs.alfworld.experts import CUE_CONTROLLED
from jaxdm.screen import metrics
from jaxdm.screen.baselines import BagOfWordsJudge, action_words, keyword_scores
from jaxdm.trajectory import Step, Trajectory


def _traj(actions_feedback, kinds):
    obs = ["You are in the middle of a room."] + [f for _, f in actions_feedback]
    steps = tuple(Step(observation=obs[i], action=a, valid=True,
                       annotations={"milestone": k == "milestone", "no_op": k == "no_op"})
                  for i, ((a, _), k) in enumerate(zip(actions_feedback, kinds)))
    return Trajectory(goal="put a mug in the cabinet", steps=steps, final_observation=obs[-1],
                      reward=0.0, success=False, budget=10, env="alfworld")


def test_keyword_rule_scores():
    tr = _traj([("go to countertop 1", "On the countertop 1, you see a mug 1."),
                ("take mug 1 from countertop 1", "You pick up the mug 1."),
                ("jump", "Nothing happens."),
                ("move mug 1 to cabinet 2", "You move the mug 1 to the cabinet 2.")],
               ["other", "milestone", "no_op", "milestone"])
    np.testing.assert_array_equal(keyword_scores(tr), [0.5, 1.0, 0.0, 1.0])
    assert action_words(tr, 1) == ["a:take", "a:mug", "a:from", "a:countertop",
                                   "f:you", "f:pick", "f:up", "f:the", "f:mug"]


def test_bag_of_words_learns_the_annotated_ranking():
    train = noisy_expert_trajectories(8, seed=11, budget=14, split="train")
    judge = BagOfWordsJudge().fit(train)
    test = noisy_expert_trajectories(6, seed=12, budget=14, split="valid_unseen")
    s = metrics.summarize([judge.scores(t) for t in test], [t.action_types for t in test])
    assert s["mean_milestone"] > s["mean_other"] > s["mean_no_op"], s
    assert all(0.0 < x < 1.0 for t in test for x in judge.scores(t))
    skip = BagOfWordsJudge(other="skip").fit(train)
    assert len(skip.vocab) < len(judge.vocab)          # fitted on milestones and no-ops only


def test_bag_of_words_bad_input_is_named():
    with pytest.raises(ValueError, match="other must be"):
        BagOfWordsJudge(other="no")
    with pytest.raises(ValueError, match="l2 must be a positive number"):
        BagOfWordsJudge(l2=float("nan"))
    with pytest.raises(RuntimeError, match="before fit"):
        BagOfWordsJudge().scores(_traj([("look", "x")], ["other"]))
    only_other = _traj([("look", "a room"), ("go to desk 1", "a desk")], ["other", "other"])
    with pytest.raises(ValueError, match="at least one milestone and one no-op"):
        BagOfWordsJudge().fit([only_other])


def test_bootstrap_intervals_bracket_the_estimate():
    trajs = noisy_expert_trajectories(10, seed=12, budget=14, split="valid_unseen")
    per = [keyword_scores(t) for t in trajs]
    types = [t.action_types for t in trajs]
    point = metrics.summarize(per, types)
    ci = metrics.bootstrap_intervals(per, types, n_resamples=300)
    for k, (lo, hi) in ci.items():
        assert lo <= point[k] + 1e-12 and point[k] <= hi + 1e-12, (k, lo, point[k], hi)
    assert ci["gap"][0] < ci["gap"][1]
    assert metrics.bootstrap_intervals(per, types, n_resamples=300) == ci    # seeded
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.bootstrap_intervals(per, types, keys=("gapp",))
    with pytest.raises(ValueError, match="at least 2 trajectories"):
        metrics.bootstrap_intervals(per[:1], types[:1])


def test_cue_controlled_agent_breaks_the_surface_cues():
    """No no-op says "Nothing happens." (so the keyword rule's only no-op cue never fires);
    decoy takes carry a milestone's verb and are no progress; on Clean/Heat/Cool tasks the
    recovering put repeats an earlier put's exact command and is the place milestone."""
    trajs = noisy_expert_trajectories(12, seed=7, budget=20, split="valid_unseen",
                                      config=CUE_CONTROLLED)
    no_ops = decoys = repeated_milestones = 0
    for tr in trajs:
        seen = set()
        for t, (step, kind) in enumerate(zip(tr.steps, tr.action_types)):
            if kind == "no_op":
                no_ops += 1
                assert not tr.feedback(t).startswith("Nothing happens")
            if kind == "other" and step.action.startswith("take "):
                decoys += 1
            if kind == "milestone" and step.action in seen:
                repeated_milestones += 1
            seen.add(step.action)
    assert no_ops >= 5 and decoys >= 5 and repeated_milestones >= 2, (
        no_ops, decoys, repeated_milestones)
    per = [keyword_scores(t) for t in trajs]
    s = metrics.summarize(per, [t.action_types for t in trajs])
    assert s["mean_no_op"] == pytest.approx(0.5)          # the rule is blind to these no-ops
