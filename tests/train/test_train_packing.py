"""Packed SFT: one forward per context; loss and gradients equal the one-by-one reference."""
import functools

import jax
import numpy as np
import pytest

from jaxdm.decision.types import MultipleChoice
from jaxdm.train import packing
from tests.train.train_fixtures import items, one_by_one_loss, tiny, yesno_items


def _items():
    # Two contexts (two groups): option-likelihood questions and Yes/No readout questions
    # (label logits) in one batch, so both ways of reading options are checked.
    return items(tag="a") + yesno_items("Another context: the customer asks for O-55555.")[:2]


@functools.lru_cache(maxsize=None)
def _reference():
    """(loss, grads) of the one-by-one reference: the same for both layouts, computed once."""
    pre = tiny()
    encoder = packing.Encoder(pre, mode="likelihood")
    return jax.jit(jax.value_and_grad(one_by_one_loss(pre.config, encoder, _items())))(
        pre.params)


def _grads(pre, encoder, its, layout):
    batch, window, full_vocab, stats = packing.pack_items(encoder, its, layout=layout)
    batch = jax.tree.map(jax.numpy.asarray, batch)

    def packed(p):
        return packing.batch_loss(p, pre.config, batch, window=window, full_vocab=full_vocab)[0]

    lp, gp = jax.value_and_grad(packed)(pre.params)
    lr, gr = _reference()
    return lp, gp, lr, gr, stats


@pytest.mark.parametrize("layout", ["packed", "rows"])
def test_packed_gradients_equal_per_question_gradients(layout):
    pre = tiny()
    encoder = packing.Encoder(pre, mode="likelihood")
    its = _items()
    lp, gp, lr, gr, stats = _grads(pre, encoder, its, layout)
    assert abs(float(lp) - float(lr)) < 1e-5
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), gp, gr))
    scale = max(jax.tree.leaves(jax.tree.map(lambda a: float(np.max(np.abs(a))), gr)))
    assert max(diffs) < 1e-5, (max(diffs), scale)
    assert scale > 1e-4                       # the gradients are not trivially zero
    # The shared context ran once per group, not once per request.
    if layout == "packed":
        assert stats["unique_tokens"] < 0.6 * stats["request_tokens"]


def test_indistinct_options_are_reported():
    import copy
    import dataclasses

    from tokenizers import normalizers
    pre = tiny()
    # A real tokenizer whose normaliser lowercases (as uncased vocabularies do): "Cancel order"
    # and "cancel order" become the same ids.
    # (The transformers tokenizer: jaxdm's FastTokenizer encodes with its own tokenizers
    # object, which its backend_tokenizer attribute does not reach.)
    full = getattr(pre.tokenizer, "full", None)
    tok = copy.deepcopy(full() if callable(full) else pre.tokenizer)
    tok.backend_tokenizer.normalizer = normalizers.Lowercase()
    enc = packing.Encoder(dataclasses.replace(pre, tokenizer=tok), mode="likelihood")
    q = MultipleChoice(context="c", question="q?", options=("Cancel order", "cancel order",
                                                            "finish"))
    probs = enc.check_distinct([packing.SFTItem(q, (0,), source="data.jsonl:7")])
    assert probs == [("data.jsonl:7", (0, 1), ("Cancel order", "cancel order"))]
    err = packing.IndistinctOptions(probs)
    assert "data.jsonl:7: options [0, 1] tokenise identically" in str(err)


def test_bad_items_name_their_source():
    q = MultipleChoice(context="c", question="q?", options=("a", "b"))
    with pytest.raises(ValueError, match=r"f.jsonl:3: answer indices \[5\] outside the 2"):
        packing.SFTItem(q, (5,), source="f.jsonl:3")
    with pytest.raises(ValueError, match="f.jsonl:4: teacher probabilities must be 2"):
        packing.SFTItem(q, (0,), (0.5, float("nan")), source="f.jsonl:4")
    pre = tiny()
    many = MultipleChoice(context="c", question="q?", options=tuple(f"o{i}" for i in range(30)))
    with pytest.raises(ValueError, match="f.jsonl:9: 30 options, more than the 26"):
        packing.Encoder(pre, mode="readout").requests(packing.SFTItem(many, (0,),
                                                                      source="f.jsonl:9"))


def test_padded_option_slots_change_nothing():
    """o_bucket (train-dm: 8) pads the option slots to a multiple of 8, masked: the same loss
    and gradients as the unpadded batch, and fewer distinct shapes."""
    pre = tiny()
    encoder = packing.Encoder(pre, mode="likelihood")
    got = {}
    for o_bucket in (1, 8):
        batch, window, full_vocab, _ = packing.pack_items(encoder, _items(), o_bucket=o_bucket)
        batch = jax.tree.map(jax.numpy.asarray, batch)
        got[o_bucket] = (batch.option_mask.shape, jax.value_and_grad(
            lambda p: packing.batch_loss(p, pre.config, batch, window=window,
                                         full_vocab=full_vocab)[0])(pre.params))
    (shape1, (l1, g1)), (shape8, (l8, g8)) = got[1], got[8]
    assert shape1[1] < 8 and shape8[1] == 8 and shape1[0] == shape8[0]
    assert abs(float(l1) - float(l8)) < 1e-6
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g8)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
