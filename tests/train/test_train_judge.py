"""A trained judge at tiny scale: a few packed-SFT steps on Progress labels (milestone -> yes,
no-op -> no, other actions left out) move the milestone - no-op gap of the judge's P(Yes) in
the right direction (fixed seed; measured on the training trajectories: a 2-layer random
model is not expected to generalise in a few steps). Prefix contexts: each question's context
ends with its action, and the Prefix requests of a trajectory pack into one shared row."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.decision.synthetic import alfworld_like_trajectory
from jaxdm.train import packing, sft
from jaxdm.train.data import read_states, write_states
from jaxdm.train.judge_data import judge_lines
from tests.train.train_fixtures import tiny


def _gap(params, config, batch, items):
    b, w, fv = batch
    sc = np.asarray(packing.option_scores(params, config, b, window=w, full_vocab=fv))
    p = 1.0 / (1.0 + np.exp(sc[:, 1] - sc[:, 0]))                # P(Yes) / (P(Yes) + P(No))
    yes = [pi for pi, it in zip(p, items) if it.answer == (0,)]
    no = [pi for pi, it in zip(p, items) if it.answer == (1,)]
    return float(np.mean(yes) - np.mean(no))


def test_few_steps_move_the_gap(tmp_path):
    trajs = [alfworld_like_trajectory(seed=s, n_actions=12) for s in (3, 5)]  # 4 yes, 4 no
    lines, stats = judge_lines(trajs, context="prefix")
    assert stats == {"milestone": 4, "no_op": 4, "unlabelled": 16, "trajectories": 2}
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
