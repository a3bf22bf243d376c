"""Shared-prefix batched scoring: equivalence with one-by-one scoring, gradients, bad input."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_fixtures import small_trajectory, smollm2_pretrained, tiny_pretrained, with_params

from jaxdm import roles
from jaxdm.decision import MultipleChoice, YesNo
from jaxdm.decision import shared_prefix as sp
from jaxdm.decision.local import LocalLikelihood, LocalReadout, encode_messages, single_token_id
from jaxdm.decision.synthetic import admissible_actions, alfworld_like_trajectory

OPTIONS = ("take mug 1 from countertop 1", "go to microwave 1", "look", "go to cabinet 1",
           "go to cabinet 10")


def _judge_reqs(backend, questions):
    return backend._yesno_requests(questions)


def test_single_token_labels_in_context():
    tok = tiny_pretrained().tokenizer
    assert single_token_id(tok, "A") == 49 and single_token_id(tok, "B") == 50
    assert single_token_id(tok, "Yes") == 10539 and single_token_id(tok, "No") == 5230
    with pytest.raises(ValueError, match="not a single token"):
        single_token_id(tok, "Absolutely not")


def test_bucket_sizes():
    assert [sp.bucket(n, 8, fine=8) for n in (1, 9, 17, 64, 65, 130)] == [8, 16, 24, 64, 128, 256]
    assert [sp.bucket(n, 64, fine=128) for n in (10, 300, 1024, 1025, 1530)] == \
        [128, 384, 1024, 1280, 1536]
    assert [sp._trunk_bucket(n, 64) for n in (10, 1025, 1530, 5000)] == [128, 1152, 1536, 5120]
    assert sp.bucket(3, 1) == 4 and sp.bucket(30, 1) == 32


def test_grouping_per_trajectory_and_trunk_choice():
    pre = tiny_pretrained()
    rd = LocalReadout(pre)
    a = alfworld_like_trajectory(1, 6)
    b = alfworld_like_trajectory(2, 5)
    qs = roles.judge_requests(a, "value", "prefix") + roles.judge_requests(b, "value", "prefix")
    reqs = _judge_reqs(rd, qs)
    groups = sp.plan_groups(reqs)
    assert sorted(sorted(g.members) for g in groups) == [list(range(6)), list(range(6, 11))]
    for g in groups:
        last = max(g.members)   # the last action's Prefix request contains all the others
        assert g.trunk == reqs[last].tokens[:len(g.trunk)]
        for rid, vis in zip(g.members, g.visible):
            assert reqs[rid].tokens[:vis] == g.trunk[:vis]
            # each request sees its whole context (up to a boundary token): only the Value
            # question (about 83 tokens with the chat-template tail) is left to its suffix
            assert len(reqs[rid].tokens) - vis <= 90


@pytest.mark.parametrize("layout", sp.LAYOUTS)
def test_readout_equals_one_by_one_tiny(layout):
    pre = tiny_pretrained()
    rd = LocalReadout(pre, max_groups_per_call=2, layout=layout)
    trajs = [small_trajectory(), alfworld_like_trajectory(3, 5)]
    qs = [q for tr in trajs for question, context in
          [("progress", "hindsight"), ("value", "prefix"), ("progress", "prefix")]
          for q in roles.judge_requests(tr, question, context)]
    qs += [q for tr in trajs for e in ("fb", 0.5)
           for q in roles.judge_requests(tr, "progress", "prefix", expansion=e)]
    batched = np.array([r.score for r in rd.score(qs)])
    ref = sp.score_requests_one_by_one(pre.params, pre.config, _judge_reqs(rd, qs))
    ref_scores = np.array([np.exp(r[0, 0]) for r in ref])
    np.testing.assert_allclose(batched, ref_scores, atol=1e-5)
    assert rd.stats["unique_tokens"] < 0.25 * rd.stats["request_tokens"]
    # Requests of one trajectory share trunks (the planner may split a trajectory's requests
    # in two when padding all suffixes to the longest costs more than a second prefill)
    assert 2 <= rd.stats["groups"] <= 4


def test_readout_choose_and_likelihood_equal_one_by_one_tiny():
    pre = tiny_pretrained()
    tr = small_trajectory()
    qs = [roles.actor_request_at(tr, t, OPTIONS) for t in range(3)]
    rd = LocalReadout(pre)
    res = rd.choose(qs)
    reqs = [sp.Request(tuple(encode_messages(rd.tokenizer, roles.render_messages(q))),
                       (len(encode_messages(rd.tokenizer, roles.render_messages(q))) - 1,),
                       (rd.label_ids[:len(OPTIONS)],)) for q in qs]
    ref = sp.score_requests_one_by_one(pre.params, pre.config, reqs)
    for r, lp in zip(res, ref):
        np.testing.assert_allclose(r.probs, np.exp(lp[0]), atol=1e-5)
        assert abs(sum(r.probs) - 1) < 1e-9 and r.choice == int(np.argmax(r.probs))
    for reduction in ("mean", "sum"):
        ll = LocalLikelihood(pre, reduction=reduction)
        res = ll.choose(qs)
        for q, r in zip(qs, res):
            opt_reqs = ll.option_requests(q)
            ref = sp.score_requests_one_by_one(pre.params, pre.config, opt_reqs,
                                               full_vocab=True)
            s = np.array([x[:, 0].mean() if reduction == "mean" else x[:, 0].sum()
                          for x in ref])
            expect = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            np.testing.assert_allclose(r.probs, expect, atol=1e-5)
            assert abs(sum(r.probs) - 1) < 1e-9
        # the end-of-turn token is scored, so "cabinet 1" is not a free prefix of "cabinet 10"
        assert ll.option_requests(qs[0])[3].candidates[-1] == (pre.tokenizer.eos_token_id,)


@pytest.mark.parametrize("layout", sp.LAYOUTS)
def test_score_batch_gradients_match_one_by_one(layout):
    """score_batch / score_packed are differentiable end to end; their gradients equal the
    one-by-one gradient (Prefix requests: suffixes see different parts of the trunk)."""
    pre = tiny_pretrained()
    rd = LocalReadout(pre)
    qs = roles.judge_requests(small_trajectory(), "progress", "prefix")[1:3]
    reqs = _judge_reqs(rd, qs)
    groups = sp.plan_groups(reqs, layout=layout)
    assert len(groups) == 1
    if layout == "rows":
        packed, score = sp.pack_groups(reqs, groups), sp.score_batch
    else:
        packed, window = sp.pack_suffixes(reqs, groups)
        score = functools.partial(sp.score_packed, window=window)
    batch = jax.tree.map(jnp.asarray, packed.batch)
    slots = [packed.slots[i] for i in range(len(reqs))]

    def batched_loss(params):
        lp = score(params, pre.config, batch)                                   # [G, M, K]
        return sum(lp[g, m, 0] for g, m in slots)

    def single_loss(params):
        from jaxdm.models import decoder
        total = 0.0
        width = max(len(r.tokens) for r in reqs)
        for r in reqs:   # right-padded to one width (causal: no effect), one compile
            toks = jnp.asarray([list(r.tokens) + [0] * (width - len(r.tokens))])
            h = decoder.forward(params, pre.config, toks,
                                jnp.arange(width)[None])[0, r.answer_positions[0]]
            lg = decoder.lm_logits(params, pre.config, h, jnp.asarray(r.candidates[0]))
            total = total + jax.nn.log_softmax(lg)[0]
        return total

    g1 = jax.grad(batched_loss)(pre.params)
    g2 = jax.grad(single_loss)(pre.params)
    flat1, flat2 = jax.tree.leaves(g1), jax.tree.leaves(g2)
    assert any(float(jnp.abs(x).max()) > 0 for x in flat1)
    for a, b in zip(flat1, flat2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_score_batch_shape_errors():
    pre = tiny_pretrained()
    b = sp.ScoringBatch(np.zeros((1, 8), np.int32), np.ones((1,), np.int32),
                        np.zeros((1, 2, 4), np.int32), np.zeros((1, 3), np.int32),
                        np.zeros((1, 2, 1), np.int32), np.ones((1, 2, 1), bool),
                        np.zeros((1, 2, 1, 2), np.int32), np.ones((1, 2, 1, 2), bool))
    with pytest.raises(ValueError, match=r"visible must be \[G, N\]"):
        sp.score_batch(pre.params, pre.config, b)
    with pytest.raises(TypeError, match="integer"):
        sp.score_batch(pre.params, pre.config, b._replace(
            visible=np.zeros((1, 2), np.int32), label_ids=np.zeros((1, 2, 1, 2), np.float32)))


def test_score_packed_shape_errors():
    pre = tiny_pretrained()
    z = np.zeros((1, 8), np.int32)
    b = sp.PackedScoringBatch(z, np.ones((1,), np.int32), z, z, np.zeros((1, 7), np.int32), z,
                              np.zeros((1, 2, 1), np.int32), np.ones((1, 2, 1), bool),
                              np.zeros((1, 2, 1, 2), np.int32), np.ones((1, 2, 1, 2), bool))
    with pytest.raises(ValueError, match=r"suffix_segments must be \[G, P\]"):
        sp.score_packed(pre.params, pre.config, b, window=8)
    with pytest.raises(TypeError, match="integer"):
        sp.score_packed(pre.params, pre.config, b._replace(
            suffix_segments=z, suffix_positions=z.astype(np.float32)), window=8)
    with pytest.raises(ValueError, match="layout"):
        sp.score_requests(pre.params, pre.config, [], layout="tree")


def test_bad_input_errors():
    pre = tiny_pretrained()
    rd = LocalReadout(pre)
    with pytest.raises(ValueError, match="empty"):
        MultipleChoice("c", "q", ())
    with pytest.raises(ValueError, match="duplicates"):
        MultipleChoice("c", "q", ("look", "look"))
    with pytest.raises(ValueError, match="27 options"):
        rd.choose([MultipleChoice("c", "q", tuple(f"o{i}" for i in range(27)))])
    with pytest.raises(TypeError, match="expected YesNo"):
        rd.score([MultipleChoice("c", "q", ("a",))])
    long_option = "go to cabinet " * 800   # ~2400 tokens > the tiny model's 2048 context
    ll = LocalLikelihood(pre)
    with pytest.raises(ValueError, match=r"questions\[0\] option 0 .* longer than the model"):
        ll.choose([MultipleChoice("c", "q", ("look", long_option))])
    with pytest.raises(ValueError, match="longer than the model"):
        rd.score([YesNo("word " * 3000, "q")])
    with pytest.raises(ValueError, match="reduction"):
        LocalLikelihood(pre, reduction="max")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_raise(bad):
    pre = tiny_pretrained()
    params = dict(pre.params)
    params["final_norm"] = params["final_norm"].at[0].set(bad)
    broken = with_params(pre, params)
    with pytest.raises(FloatingPointError, match=r"questions\[0\].*non-finite"):
        LocalReadout(broken).score([YesNo("context", "question")])
    with pytest.raises(FloatingPointError, match="non-finite"):
        LocalLikelihood(broken).choose([MultipleChoice("c", "q", ("a", "b"))])


@pytest.mark.slow
def test_smollm2_batched_equals_one_by_one():
    """fp32 SmolLM2: Prefix, Hindsight and Actor options, batched vs one request at a time."""
    pre = smollm2_pretrained()
    tr = alfworld_like_trajectory(4, 4)  # 4 steps: every role, fewer one-by-one compiles
    rd = LocalReadout(pre)
    qs = roles.judge_requests(tr, "progress", "hindsight") + \
        roles.judge_requests(tr, "value", "prefix")
    batched = np.array([r.score for r in rd.score(qs)])
    ref = sp.score_requests_one_by_one(pre.params, pre.config, _judge_reqs(rd, qs))
    np.testing.assert_allclose(batched, [np.exp(r[0, 0]) for r in ref], atol=1e-3)
    assert np.all((batched > 0) & (batched < 1))
    ll = LocalLikelihood(pre)
    q = roles.actor_request_at(tr, 2, admissible_actions(tr, 2, 6))
    res = ll.choose([q])[0]
    ref = sp.score_requests_one_by_one(pre.params, pre.config, ll.option_requests(q),
                                       full_vocab=True)
    s = np.array([x[:, 0].mean() for x in ref])
    np.testing.assert_allclose(res.probs, np.exp(s - s.max()) / np.exp(s - s.max()).sum(),
                               atol=1e-3)
    # constrained readout of the same Actor question
    r = rd.choose([q])[0]
    toks = encode_messages(pre.tokenizer, roles.render_messages(q))
    ref = sp.score_requests_one_by_one(pre.params, pre.config, [sp.Request(
        tuple(toks), (len(toks) - 1,), (rd.label_ids[:6],))])[0]
    np.testing.assert_allclose(r.probs, np.exp(ref[0]), atol=1e-3)


def test_plan_and_pack_reconstruct_every_request():
    """Property: for any requests, trunk[:visible] + suffix == the request's tokens, visible
    never passes the first answer position, and answers point at the same tokens."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    seq = st.lists(st.integers(1, 5), min_size=1, max_size=40)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(seq, seq), min_size=1, max_size=8), st.integers(0, 30))
    def check(pairs, shared_len):
        base = list(range(10, 10 + shared_len))
        reqs = []
        for head, tail in pairs:
            toks = tuple(base + head + tail)
            pos = tuple(sorted({len(toks) - 1, max(0, len(toks) - 1 - len(tail) // 2)}))
            reqs.append(sp.Request(toks, pos, tuple((1, 2) for _ in pos)))
        groups = sp.plan_groups(reqs, min_shared_tokens=1, min_shared_frac=0.3, max_group=3)
        assert sorted(r for g in groups for r in g.members) == list(range(len(reqs)))
        packed = sp.pack_groups(reqs, groups)
        b = packed.batch
        s_len = b.suffix_tokens.shape[2]
        for rid, (gi, ni) in packed.rows.items():
            r = reqs[rid]
            vis = int(b.visible[gi, ni])
            assert vis <= min(r.answer_positions) and vis <= int(b.trunk_len[gi])
            suffix = list(b.suffix_tokens[gi, ni, :len(r.tokens) - vis])
            assert list(b.trunk_tokens[gi, :vis]) + suffix == list(r.tokens)
            g0, m0 = packed.slots[rid]
            assert g0 == gi
            for ai, (p, cand) in enumerate(zip(r.answer_positions, r.candidates)):
                # flat slot m0 + ai = row * S + position in the row
                row, pos = divmod(int(b.answer_index[gi, m0 + ai]), s_len)
                assert b.answer_mask[gi, m0 + ai] and row == ni
                assert b.suffix_tokens[gi, ni, pos] == r.tokens[p]
                assert list(b.label_ids[gi, m0 + ai, :len(cand)]) == list(cand)
        # no padded answer slot is marked real; the slot count is the bucketed real count
        real = [sum(len(reqs[r].answer_positions) for r in gr.members) for gr in groups]
        assert list(b.answer_mask.sum(1)) == real
        assert b.answer_index.shape[1] == sp.slot_bucket(max(real))
        assert packed.unique_tokens <= sum(len(r.tokens) for r in reqs)
        # The packed row: the trunk tokens a request's suffix sees, then its own segment, are
        # exactly the request, at the right positions, and its suffix fits the window.
        groups = sp.plan_groups(reqs, min_shared_tokens=1, min_shared_frac=0.3, max_group=3,
                                layout="packed")
        pk, window = sp.pack_suffixes(reqs, groups)
        b = pk.batch
        for rid, (gi, ni) in pk.rows.items():
            r = reqs[rid]
            own = np.flatnonzero(b.suffix_segments[gi] == ni + 1)
            vis = int(b.suffix_visible[gi, own[0]])
            assert np.all(b.suffix_visible[gi, own] == vis) and len(own) <= window
            assert vis <= int(b.trunk_len[gi])
            seen = list(b.trunk_tokens[gi, :vis]) + [int(b.suffix_tokens[gi, j]) for j in own]
            assert seen == list(r.tokens)
            assert list(b.suffix_positions[gi, own]) == list(range(vis, len(r.tokens)))
            g0, m0 = pk.slots[rid]
            for ai, p in enumerate(r.answer_positions):
                assert g0 == gi and b.answer_mask[gi, m0 + ai]
                assert b.answer_index[gi, m0 + ai] == own[p - vis]
        assert pk.unique_tokens == sum(len(g.trunk) for g in groups) + sum(
            len(reqs[r].tokens) - v for g in groups for r, v in zip(g.members, g.visible))

    check()


def test_make_backend_local_kinds():
    from jaxdm.decision import Prompted, make_backend
    pre = tiny_pretrained()
    rd = make_backend({"kind": "local_readout", "max_groups_per_call": 2}, pretrained=pre)
    assert isinstance(rd, LocalReadout) and rd.max_groups_per_call == 2
    assert rd.name.startswith("local_readout(")
    ll = make_backend({"kind": "local_likelihood", "reduction": "sum"}, pretrained=pre)
    assert isinstance(ll, LocalLikelihood) and ll.reduction == "sum"
    pm = make_backend({"kind": "prompted", "max_new_tokens": 16}, pretrained=pre)
    assert isinstance(pm, Prompted) and pm.max_new_tokens == 16
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['labels'\]"):
        make_backend({"kind": "local_readout", "labels": "abc"}, pretrained=pre)


def test_planner_splits_members_with_long_suffixes():
    """Two Actor states of one trajectory share their early history; mixing their options in
    one group would pad every option row to hundreds of tokens, so they are planned apart."""
    ll = LocalLikelihood(tiny_pretrained())
    tr = alfworld_like_trajectory(5, 12)
    reqs = [r for t in (4, 10) for r in ll.option_requests(
        roles.actor_request_at(tr, t, admissible_actions(tr, t, 6, seed=t)))]
    groups = sp.plan_groups(reqs)
    assert sorted(sorted(g.members) for g in groups) == [list(range(6)), list(range(6, 12))]
    for g in groups:
        tails = [len(reqs[r].tokens) - v for r, v in zip(g.members, g.visible)]
        assert max(tails) <= 16   # last prompt token + option tokens + end-of-turn


def test_likelihood_runs_a_many_option_question_as_one_group():
    # DECISION GYM's tool question has 69 options: all of them share one trunk (the prompt
    # runs once), not the planner's default 64 + 5 (the prompt twice). Scores of any grouping
    # equal one-by-one scoring (tests above); here: the grouping.
    pre = tiny_pretrained()
    q = MultipleChoice(context="The customer wants a refund for order O-1.",
                       question="Which tool next?", options=tuple(f"tool_{i}" for i in range(69)))
    ll = LocalLikelihood(pre)
    assert len(sp.program_keys(ll.option_requests(q), full_vocab=True)) == 2  # default: split
    [res] = ll.choose([q])
    assert ll.stats["groups"] == 1 and ll.stats["calls"] == 1
    assert res.ok and len(res.probs) == 69 and abs(sum(res.probs) - 1) < 1e-9
    # The full-vocabulary head runs at the real answer slots only (bucketed), not at every
    # padded (option row, answer position) pair: one flat list [G, M] of slots.
    reqs = ll.option_requests(q)
    [key] = sp.program_keys(reqs, full_vocab=True, max_group=69)
    n_real = sum(len(r.answer_positions) for r in reqs)
    answer_shape, label_shape = key[3][6], key[3][8]
    assert answer_shape == (1, sp.slot_bucket(n_real)) and label_shape[:2] == answer_shape
    assert sp.slot_bucket(n_real) < n_real + 64


def test_slot_bucket():
    assert [sp.slot_bucket(m) for m in (1, 64, 65, 300, 512, 513, 1170)] == \
        [64, 64, 128, 320, 512, 768, 1280]


@pytest.mark.parametrize("layout", sp.LAYOUTS)
def test_per_row_answer_slots_equal_flat(layout):
    """Answer slots given per row [G, N, A] (as the RL option policy builds them) score the
    same as the flat slots [G, M] the packers build; output [G, N, A, K] vs [G, M, K]."""
    pre = tiny_pretrained()
    ll = LocalLikelihood(pre)
    q = MultipleChoice(context="You are in a kitchen.", question="What next?", options=OPTIONS)
    reqs = ll.option_requests(q)
    groups = sp.plan_groups(reqs, layout=layout)
    if layout == "rows":
        packed, score = sp.pack_groups(reqs, groups), sp.score_batch
    else:
        packed, window = sp.pack_suffixes(reqs, groups)
        score = functools.partial(sp.score_packed, window=window)
    b = packed.batch
    n = b.suffix_tokens.shape[1] if layout == "rows" else len(reqs)
    a = max(len(r.answer_positions) for r in reqs)
    g, k = len(groups), b.label_ids.shape[-1]
    idx, mask = np.zeros((g, n, a), np.int32), np.zeros((g, n, a), bool)
    labels, lmask = np.zeros((g, n, a, k), np.int32), np.zeros((g, n, a, k), bool)
    stride = b.suffix_tokens.shape[2] if layout == "rows" else 0
    for rid, (gi, ni) in packed.rows.items():
        m0, na = packed.slots[rid][1], len(reqs[rid].answer_positions)
        idx[gi, ni, :na] = b.answer_index[gi, m0:m0 + na] - ni * stride
        mask[gi, ni, :na] = b.answer_mask[gi, m0:m0 + na]
        labels[gi, ni, :na], lmask[gi, ni, :na] = (b.label_ids[gi, m0:m0 + na],
                                                   b.label_mask[gi, m0:m0 + na])
    flat = np.asarray(score(pre.params, pre.config, b, full_vocab=True))
    per_row = np.asarray(score(pre.params, pre.config, b._replace(
        answer_index=idx, answer_mask=mask, label_ids=labels, label_mask=lmask),
        full_vocab=True))
    assert flat.shape == b.label_ids.shape and per_row.shape == (g, n, a, k)
    for rid, (gi, ni) in packed.rows.items():
        m0, na = packed.slots[rid][1], len(reqs[rid].answer_positions)
        np.testing.assert_allclose(per_row[gi, ni, :na], flat[gi, m0:m0 + na], atol=1e-6)
