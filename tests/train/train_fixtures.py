"""Shared helpers for the training tests: tiny random decoders with SmolLM2's tokenizer and
small SFT items that share contexts."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.decision.types import MultipleChoice, YesNo
from jaxdm.models import decoder
from jaxdm.train.losses import sft_loss
from jaxdm.train.packing import SFTItem

CONTEXT = ("A customer writes: I want to cancel order O-12345, it has not shipped yet. "
           "The agent looked up the customer C-1001 and the order; its status is pending.")


@functools.lru_cache(maxsize=None)
def tiny(seed: int = 0, layers: int = 2):
    from jaxdm.models.config import ModelConfig
    from jaxdm.models.loading import Pretrained, load_tokenizer
    from jaxdm.models.smollm2 import smollm2_path
    path = smollm2_path()
    config = ModelConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
                         num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=8,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
                         max_position_embeddings=2048)
    params = decoder.init_params(config, jax.random.key(seed))
    return Pretrained(params=params, config=config, tokenizer=load_tokenizer(path),
                      chat_template=None, path=path)


def items(context: str = CONTEXT, tag: str = "t") -> list[SFTItem]:
    tool = MultipleChoice(context=context, question="Which tool should the agent call next?",
                          options=("cancel_order: cancel an order", "get_weather: weather",
                                   "finish: end the conversation", "void_invoice: void"))
    param = MultipleChoice(context=context, question="Which value should 'order_id' take?",
                           options=("O-12345", "O-99999", "(omit)"))
    stop = MultipleChoice(context=context, question="Should the agent finish now?",
                          options=("Finish the conversation now", "Continue working"))
    return [SFTItem(tool, (0,), (0.6, 0.1, 0.2, 0.1), source=f"{tag}:1"),
            SFTItem(param, (0,), source=f"{tag}:2"),
            SFTItem(stop, (1,), (0.7, 0.3), source=f"{tag}:3")]   # teacher wrong: one-hot


def yesno_items(context: str = CONTEXT) -> list[SFTItem]:
    return [SFTItem(YesNo(context=context, question=f"Did action {i} make progress?"),
                    (i % 2,), source=f"yn:{i}") for i in range(4)]


def one_by_one_loss(params, config, encoder, its):
    """Reference: every request as its own row (no shared prefix, no packing) through one
    causal ``decoder.forward`` [R, S], full-vocabulary log-probs, then the same loss."""
    from jaxdm.train.packing import pack_items
    plan, reqs = [], []
    for it in its:
        rs, how = encoder.requests(it)
        plan.append((how, list(range(len(reqs), len(reqs) + len(rs)))))
        reqs.extend(rs)
    s = max(len(r.tokens) for r in reqs)
    toks = np.zeros((len(reqs), s), np.int32)
    for i, r in enumerate(reqs):
        toks[i, :len(r.tokens)] = r.tokens        # right padding: causal rows are unchanged
    hidden = decoder.forward(params, config, jnp.asarray(toks),
                             jnp.broadcast_to(jnp.arange(s), toks.shape))
    full = decoder.lm_logits(params, config, hidden)                            # [R, S, V]
    lp = full - jax.nn.logsumexp(full, axis=-1, keepdims=True)
    o = max(it.n_options for it in its)
    scores = []
    for how, rids in plan:
        if how == "readout":
            r = reqs[rids[0]]
            row = lp[rids[0], r.answer_positions[0], jnp.asarray(r.candidates[0])]
        else:
            row = jnp.stack([jnp.stack([lp[i, p, c[0]] for p, c in
                                        zip(reqs[i].answer_positions, reqs[i].candidates)]).mean()
                             for i in rids])
        scores.append(jnp.pad(row, (0, o - row.shape[0])))
    batch, *_ = pack_items(encoder, its)
    return sft_loss(jnp.stack(scores), jnp.asarray(batch.targets),
                    jnp.asarray(batch.option_mask))
