"""The generative policy's training head runs only over each row's response window (TRL's
logits_to_keep): same log-probs, entropies and gradients as the head over every position."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.rl import text as rltext
from jaxdm.rl.policy import GenerativePolicy, TokenBatch, token_log_probs_and_entropy

CFG = ModelConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=8, tie_embeddings=True,
                  max_position_embeddings=128)


def _batch(rows, s, seed=0):
    """rows: (prompt length, response length) per row; (0, 0) is a padding row."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, (len(rows), s)).astype(np.int32)
    valid = np.zeros((len(rows), s), bool)
    resp = np.zeros((len(rows), s), bool)
    for i, (p, r) in enumerate(rows):
        valid[i, :p + r] = True
        resp[i, p:p + r] = True
    return TokenBatch(tokens, valid, resp)


# a short response, one that ends at the last slot (window clipped), one response of exactly
# the window, a padding row
ROWS = [(5, 3), (26, 6), (10, 8), (0, 0)]


@pytest.mark.parametrize("with_entropy", [False, True])
def test_window_equals_full_head(with_entropy):
    params = decoder.init_params(CFG, jax.random.key(0))
    batch = _batch(ROWS, 32)
    full = token_log_probs_and_entropy(params, CFG, batch, with_entropy=with_entropy)
    win = token_log_probs_and_entropy(params, CFG, batch, with_entropy=with_entropy,
                                      response_window=8)
    for a, b in zip(full, win):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6)
    lp = np.asarray(win[0])
    assert (lp[np.asarray(batch.response_mask)] < 0).all()  # every response token scored
    assert (lp[~np.asarray(batch.response_mask)] == 0).all()
    if with_entropy:  # the chunked entropy is the full log-softmax's
        hidden = decoder.forward(params, CFG, jnp.asarray(batch.tokens),
                                 jnp.broadcast_to(jnp.arange(32), (4, 32)),
                                 attn_mask=jnp.asarray(batch.valid))
        logz = jax.nn.log_softmax(decoder.lm_logits(params, CFG, hidden[:, :-1]), -1)
        ent = np.pad(np.asarray(-(jnp.exp(logz) * logz).sum(-1)), ((0, 0), (1, 0)))
        m = np.asarray(batch.response_mask)
        np.testing.assert_allclose(np.asarray(win[1])[m], ent[m], rtol=1e-5)
        assert (np.asarray(win[1])[m] > 0).all()


def test_window_gradients_equal_full_head():
    params = decoder.init_params(CFG, jax.random.key(1))
    batch = _batch(ROWS, 32, seed=3)
    w = jnp.asarray(np.random.default_rng(4).normal(size=(4, 32)), jnp.float32)

    def loss(p, window):
        lp, ent, _ = token_log_probs_and_entropy(p, CFG, batch, with_entropy=True,
                                                 response_window=window)
        return (lp * w).sum() + 0.1 * (ent * w).sum()

    g_full = jax.grad(loss)(params, None)
    g_win = jax.grad(loss)(params, 8)
    for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_win)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_training_batch_refuses_a_response_longer_than_the_window():
    tok = rltext.WordTokenizer.from_texts(["go north", "take key"])
    pol = GenerativePolicy(CFG.replace(vocab_size=tok.vocab_size), tok, max_response_tokens=4,
                           generate_fn=lambda *a, **k: None)
    ok = pol.training_batch([{"prompt": [1, 2, 3], "response": [4, 5, 6, 7]}], 2)
    assert ok.response_mask.sum() == 4
    with pytest.raises(ValueError, match="response of 5 tokens exceeds max_response_tokens=4"):
        pol.training_batch([{"prompt": [1, 2], "response": [3, 4, 5, 6, 7]}], 2)


def test_a_step_that_is_its_own_pi_old_equals_the_recomputed_pi_old():
    """No "old_logp" in the batch: the ppo term takes π_old from its own forward (the
    iteration's one update); the update equals the one with π_old recomputed beforehand."""
    import optax

    from jaxdm.rl.terms import LossConfig, TermContext, make_train_step

    tok = rltext.WordTokenizer.from_texts(["go north", "take key"])
    cfg = CFG.replace(vocab_size=tok.vocab_size)
    pol = GenerativePolicy(cfg, tok, max_response_tokens=6, generate_fn=lambda *a, **k: None)
    params = {"policy": decoder.init_params(cfg, jax.random.key(2))}
    rng = np.random.default_rng(5)
    units = [{"prompt": rng.integers(1, tok.vocab_size, p).tolist(),
              "response": rng.integers(1, tok.vocab_size, r).tolist()}
             for p, r in ((7, 3), (12, 6), (4, 5))]
    batch = {"policy": pol.training_batch(units, 4),
             "adv": jnp.asarray([1.0, -0.5, 0.25, 0.0], jnp.float32)}
    old = pol.logp_and_entropy(params["policy"], batch["policy"])[0]
    tx = optax.adamw(1e-2)
    step = make_train_step(TermContext(pol, None, LossConfig(kl_coef=0.0)), {"policy": tx})
    opt = {"policy": tx.init(params["policy"])}
    p_a, _, m_a = step(params, opt, {**batch, "old_logp": old, "ref_logp": old})
    p_b, _, m_b = step(params, opt, batch)
    assert float(m_b["ppo/clip_frac"]) == 0.0
    np.testing.assert_allclose(float(m_b["loss/total"]), float(m_a["loss/total"]), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(p_a), jax.tree.leaves(p_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)


TRAIN = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2",
         "model.num_kv_heads=1", "model.head_dim=16", "policy.form=generative",
         "policy.max_prompt_tokens=160", "policy.max_response_tokens=6", "progress=false",
         "algo.kl_coef=0.0", "mesh_data=1", "env.name=toy_ordering", "env.kwargs={budget: 2}",
         "max_actions=2", "tasks_per_iter=2", "group_size=2", "algo.advantage=grpo",
         "optim.lr=3e-3", "iterations=1", "checkpoint_every=0"]


def test_the_trainer_skips_the_pi_old_pass_only_when_one_step_updates(tmp_path):
    import dataclasses

    from jaxdm import config as cfgmod
    from jaxdm.rl.train_config import TrainConfig
    from jaxdm.rl.trainer import Trainer

    cfg = cfgmod.load_config(TrainConfig, None, [*TRAIN, f"out_dir={tmp_path}", "iterations=2",
                                                 "algo.mini_batch=64", "model.remat=true"])
    tr = Trainer(cfg, log=False)
    assert tr.policy.config.remat  # model.remat reaches the decoder
    calls = []
    inner = tr.logp_fn
    tr.logp_fn = lambda *a: calls.append(1) or inner(*a)
    m = tr.iteration_step()  # one epoch, one mini-batch: the step is its own π_old
    assert calls == [] and m["ppo/updates"] == 1 and np.isfinite(m["loss/total"])
    # two epochs (same compiled programs; the update reads algo.ppo_epochs each iteration):
    # π_old is computed once, before the first step
    tr.cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, ppo_epochs=2))
    m = tr.iteration_step()
    tr.close()
    assert calls == [1] and m["ppo/updates"] == 2 and np.isfinite(m["loss/total"])
