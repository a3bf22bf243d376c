"""The SFT mixed target and the CE + μ·SE loss against numpy written out by hand."""
import numpy as np
import pytest

import jax.numpy as jnp

from jaxdm.train import losses


def np_target(answer, opt_mask, teacher, has, alpha=0.3):
    out = np.zeros(answer.shape)
    for q in range(answer.shape[0]):
        ok = answer[q] & opt_mask[q]
        y = ok / max(ok.sum(), 1)
        if teacher is not None and has[q] and ok.any():
            t = np.where(opt_mask[q], teacher[q], 0.0)
            t = t / t.sum()
            top = int(np.argmax(np.where(opt_mask[q], t, -1)))
            if ok[top]:
                y = (1 - alpha) * y + alpha * t
        out[q] = y
    return out


def np_loss(logits, target, opt_mask, mu=0.5):
    per = []
    for q in range(logits.shape[0]):
        m = opt_mask[q]
        if not m.any() or target[q][m].sum() == 0:
            continue
        x = logits[q][m]
        logp = x - np.log(np.exp(x - x.max()).sum()) - x.max()
        p = np.exp(logp)
        t = target[q][m]
        per.append(-(t * logp).sum() + mu * ((p - t) ** 2).sum())
    return float(np.mean(per))


@pytest.fixture
def case():
    rng = np.random.default_rng(0)
    q, o = 6, 5
    opt_mask = np.ones((q, o), bool)
    opt_mask[1, 3:] = False            # a 3-option question
    opt_mask[5] = False                # a padding row
    answer = np.zeros((q, o), bool)
    answer[0, 2] = answer[1, 0] = answer[2, 4] = answer[3, 1] = True
    answer[4, [0, 3]] = True           # two acceptable options
    teacher = rng.dirichlet(np.ones(o), size=q)
    teacher[0] = [0.1, 0.1, 0.6, 0.1, 0.1]     # ranks the answer first -> mixed
    teacher[2] = [0.5, 0.1, 0.1, 0.1, 0.2]     # ranks a wrong option first -> one-hot
    teacher[1] = [0.1, 0.2, 0.1, 0.5, 0.1]     # top slot is padding: dropped, 0.2 is top -> wrong
    has = np.array([True, True, True, False, True, True])
    logits = rng.normal(size=(q, o)) * 2
    return answer, opt_mask, teacher, has, logits


def test_mixed_target_matches_numpy(case):
    answer, opt_mask, teacher, has, _ = case
    got = np.asarray(losses.mixed_target(jnp.asarray(answer), jnp.asarray(opt_mask),
                                         jnp.asarray(teacher), jnp.asarray(has)))
    want = np_target(answer, opt_mask, teacher, has)
    np.testing.assert_allclose(got, want, atol=1e-6)
    # The hand case: row 0 = 0.7 * onehot(2) + 0.3 * teacher.
    np.testing.assert_allclose(got[0], [0.03, 0.03, 0.88, 0.03, 0.03], atol=1e-6)
    np.testing.assert_allclose(got[2], [0, 0, 0, 0, 1], atol=1e-6)   # teacher wrong: one-hot
    np.testing.assert_allclose(got[3], [0, 1, 0, 0, 0], atol=1e-6)   # no teacher row
    np.testing.assert_allclose(got[5], 0, atol=0)                    # padding row
    np.testing.assert_allclose(got[:5].sum(-1), 1, atol=1e-6)


def test_target_without_teacher_is_answer_distribution(case):
    answer, opt_mask, *_ = case
    got = np.asarray(losses.mixed_target(jnp.asarray(answer), jnp.asarray(opt_mask)))
    np.testing.assert_allclose(got[4], [0.5, 0, 0, 0.5, 0], atol=1e-7)


def test_sft_loss_matches_numpy(case):
    answer, opt_mask, teacher, has, logits = case
    target = np_target(answer, opt_mask, teacher, has)
    got = float(losses.sft_loss(jnp.asarray(logits), jnp.asarray(target), jnp.asarray(opt_mask)))
    assert got == pytest.approx(np_loss(logits, target, opt_mask), rel=1e-5)
    got2 = float(losses.sft_loss(jnp.asarray(logits), jnp.asarray(target),
                                 jnp.asarray(opt_mask), mu=0.0))
    assert got2 == pytest.approx(np_loss(logits, target, opt_mask, mu=0.0), rel=1e-5)


def test_sft_loss_hand_case():
    # Two options, logits (0, 0) -> p = (0.5, 0.5); target (1, 0):
    # CE = log 2 = 0.693147; SE = 0.25 + 0.25 = 0.5; loss = 0.693147 + 0.5 * 0.5 = 0.943147.
    loss = losses.sft_loss(jnp.zeros((1, 2)), jnp.asarray([[1.0, 0.0]]), jnp.ones((1, 2), bool))
    assert float(loss) == pytest.approx(0.943147, abs=1e-6)


def test_loss_accepts_log_probs_and_logits_alike(case):
    answer, opt_mask, _, _, logits = case
    target = np_target(answer, opt_mask, None, None)
    lp = np.asarray(losses.option_log_softmax(jnp.asarray(logits), jnp.asarray(opt_mask)))
    a = losses.sft_loss(jnp.asarray(logits), jnp.asarray(target), jnp.asarray(opt_mask))
    b = losses.sft_loss(jnp.asarray(lp), jnp.asarray(target), jnp.asarray(opt_mask))
    assert float(a) == pytest.approx(float(b), rel=1e-6)


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"targets must be \[Q, O\]=\(2, 3\), got \(2, 4\)"):
        losses.sft_loss(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3), bool))
    with pytest.raises(ValueError, match="teacher_mask must be"):
        losses.mixed_target(jnp.ones((2, 3), bool), jnp.ones((2, 3), bool),
                            jnp.ones((2, 3)), jnp.ones((3,), bool))
