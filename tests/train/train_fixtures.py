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


def adapter_folder(root, *, seed: int, key: int, base_name: str = "base",
                   name: str = "judge", command: str = "test"):
    """A tiny base model exported as an HF folder and a LoRA adapter folder over it (rank 2 on
    q, v, down; every adapter entry + 0.05, so B is non-zero and the delta real).
    Returns (pretrained, hf folder, adapter folder, adapters, LoraConfig)."""
    from jaxdm.models.loading import save_pretrained
    from jaxdm.models import lora

    pre = tiny(seed=seed)
    hf = save_pretrained(root / base_name, pre.params, pre.config, tokenizer=pre.tokenizer,
                         source=pre.path)
    cfg = lora.LoraConfig(rank=2, alpha=4.0, targets=("q", "v", "down"))
    ad = jax.tree.map(lambda x: x + 0.05, lora.init_adapters(pre.params, cfg,
                                                             jax.random.key(key)))
    folder = lora.save_adapter(root / name, ad, cfg, base=str(hf), meta={"command": command})
    return pre, hf, folder, ad, cfg


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


def one_by_one_loss(config, encoder, its):
    """``loss(params)`` of the reference: every request as its own row (no shared prefix, no packing) through one
    causal ``decoder.forward`` [R, S], full-vocabulary log-probs at the scored slots, then the
    same loss. The slots are read with index arrays (one gather, one scatter-add), so the
    reference is one small program to jit and differentiate, not a Python loop of ops. Host
    work (tokenising, index arrays, the mixed targets) happens here, outside ``loss``."""
    from jaxdm.train.packing import pack_items
    reqs: list = []
    rows, pos, tok, qidx, oidx, weight = [], [], [], [], [], []
    for qi, it in enumerate(its):
        rs, how = encoder.requests(it)
        base = len(reqs)
        reqs.extend(rs)
        if how == "readout":
            r = rs[0]
            for o, c in enumerate(r.candidates[0]):
                rows.append(base); pos.append(r.answer_positions[0]); tok.append(c)
                qidx.append(qi); oidx.append(o); weight.append(1.0)
        else:
            for o, r in enumerate(rs):
                k = len(r.answer_positions)
                for p, c in zip(r.answer_positions, r.candidates):
                    rows.append(base + o); pos.append(p); tok.append(c[0])
                    qidx.append(qi); oidx.append(o); weight.append(1.0 / k)
    s = max(len(r.tokens) for r in reqs)
    toks = np.zeros((len(reqs), s), np.int32)
    for i, r in enumerate(reqs):
        toks[i, :len(r.tokens)] = r.tokens        # right padding: causal rows are unchanged
    batch, *_ = pack_items(encoder, its)
    targets, option_mask = np.asarray(batch.targets), np.asarray(batch.option_mask)
    rows, pos, tok, qidx, oidx = (np.array(x) for x in (rows, pos, tok, qidx, oidx))
    weight = np.asarray(weight, np.float32)
    o = max(it.n_options for it in its)

    def loss(params):
        hidden = decoder.forward(params, config, jnp.asarray(toks),
                                 jnp.broadcast_to(jnp.arange(s), toks.shape))  # [R, S, D]
        full = decoder.lm_logits(params, config, hidden[rows, pos])            # [M, V]
        lp = (jnp.take_along_axis(full, jnp.asarray(tok)[:, None], axis=-1)[:, 0]
              - jax.nn.logsumexp(full, axis=-1))                              # [M]
        scores = jnp.zeros((len(its), o)).at[qidx, oidx].add(weight * lp)
        return sft_loss(scores, jnp.asarray(targets), jnp.asarray(option_mask))

    return loss
