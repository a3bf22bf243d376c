"""The learned critic of PPO: a small separate decoder with a scalar value head.

Why a separate critic and not a head on the policy's final hidden state:
- the option-scoring policy's forward pass (``shared_prefix.score_batch``) returns option
  log-likelihoods, not the context's hidden state, and the generative policy's hidden state
  sits at the end of the *response*, not the state; a head there would change the policy's
  jitted computation (and the exact reproduction of GRPO/teacher/GiGPO runs);
- the value loss then cannot pull on the policy's representation (no value/policy gradient
  interference, no tuned value-loss weight against the policy loss), and the critic has its
  own optimiser state, so the policy's global-norm clip is unchanged;
- the seed's PPO baseline only needs V(s) per state; a 1-2 layer decoder over the same state
  tokens the policy reads is cheap next to the policy (``critic.num_layers`` etc.).

The critic reads exactly the policy's state tokens (the option form's context, the
generative form's prompt: ``state_tokens``) and outputs V(s) = w·h_last + b, where h_last is
the final hidden state at the state's last token. The terminal state after an episode's last
action is not scored: ``gae_advantages`` bootstraps 0 there (an episode cut by the action
budget also ends: the budget is part of the task and shown in the state).

Critic kinds are registered (``CRITIC_KINDS``, the names ``critic.kind`` takes): ``decoder``
(``DecoderCritic``, here) and ``mlp`` (``jaxdm.rl.symbolic.MLPCritic``, for the symbolic
policy; imported on the first lookup). A kind is ``build(cfg, policy) -> critic``, a frozen,
hashable object with ``init(key) -> params``, ``batch(units, pad_to) -> batch`` (host) and
the pure ``values(params, batch) -> [R]``; the trainer and the ``value`` loss term use only
these three.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.registry import Registry

__all__ = ["CriticBatch", "init_critic", "critic_values", "critic_batch", "state_tokens",
           "critic_model_config", "DecoderCritic", "CRITIC_KINDS", "register_critic"]


class CriticBatch(NamedTuple):
    """The states a critic scores: R rows of right-padded state tokens [R, S] int32 and their
    validity mask [R, S] bool."""
    tokens: Any  # [R, S] int32 state tokens, right-padded
    valid: Any   # [R, S] bool


def critic_model_config(vocab_size: int, section: Any, dtype: str = "float32") -> ModelConfig:
    """The critic decoder's config from a ``CriticSection`` (vocabulary of the policy)."""
    return ModelConfig(vocab_size=vocab_size, hidden_size=section.hidden_size,
                       intermediate_size=section.intermediate_size,
                       num_layers=section.num_layers, num_heads=section.num_heads,
                       num_kv_heads=section.num_kv_heads, head_dim=section.head_dim,
                       tie_embeddings=True, dtype=dtype)


def init_critic(config: ModelConfig, key: jax.Array) -> dict[str, Any]:
    """{"decoder": decoder params, "head_w": [D], "head_b": []}; the head starts at 0."""
    return {"decoder": decoder.init_params(config, key),
            "head_w": jnp.zeros((config.hidden_size,), jnp.float32),
            "head_b": jnp.zeros((), jnp.float32)}


@functools.partial(jax.jit, static_argnames=("config",))
def critic_values(params, config: ModelConfig, batch: CriticBatch):
    """V(s) [R] for each row of ``batch`` (read at the row's last valid token)."""
    tokens = jnp.asarray(batch.tokens)
    valid = jnp.asarray(batch.valid, bool)
    if tokens.ndim != 2 or valid.shape != tokens.shape:
        raise ValueError(f"critic batch tokens {list(tokens.shape)} and valid "
                         f"{list(valid.shape)} must both be [R, S]")
    r, s = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(s), (r, s))
    hidden = decoder.forward(params["decoder"], config, tokens, positions, attn_mask=valid)
    last = jnp.maximum(valid.sum(-1) - 1, 0)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    return h @ params["head_w"] + params["head_b"]


def state_tokens(unit: dict[str, Any]) -> list[int]:
    """The state tokens the policy read for one recorded action (either policy form)."""
    if "context" in unit:
        return list(unit["context"])
    if "prompt" in unit:
        return list(unit["prompt"])
    raise KeyError(f"a policy unit has 'context' (option form) or 'prompt' (generative form); "
                   f"got keys {sorted(unit)}")


def critic_batch(units: Sequence[dict[str, Any]], pad_to: int, pad_id: int, *,
                 min_width: int = 16) -> CriticBatch:
    """Right-padded state tokens of ``units`` as a [pad_to, S] batch, S the power of two ≥
    max(longest state, ``min_width``): give the policy's context limit as ``min_width`` and
    every batch has one shape (one compilation of the train step)."""
    if pad_to < len(units):
        raise ValueError(f"pad_to={pad_to} < number of states {len(units)}")
    seqs = [state_tokens(u) for u in units]
    longest = max([len(x) for x in seqs] + [min_width, 1])
    s = 1 << (longest - 1).bit_length()
    tokens = np.full((pad_to, s), pad_id, np.int32)
    valid = np.zeros((pad_to, s), bool)
    valid[:, 0] = True  # padded rows read one pad token (masked out by the caller)
    for i, x in enumerate(seqs):
        tokens[i, :len(x)] = x
        valid[i, :len(x)] = True
    return CriticBatch(tokens, valid)


# ---- registered critic kinds --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DecoderCritic:
    """The decoder critic over the text policy's state tokens (``critic.kind: decoder``)."""

    model: ModelConfig
    pad_id: int
    min_width: int  # the policy's context limit: one batch width, one compilation

    def init(self, key: jax.Array) -> dict[str, Any]:
        """The critic's parameters (value head and its decoder trunk) for ``key``."""
        return init_critic(self.model, key)

    def batch(self, units: Sequence[dict[str, Any]], pad_to: int) -> CriticBatch:
        """A CriticBatch [R, S] of the units' state tokens, padded to at least ``pad_to`` rows
        (critic_batch)."""
        return critic_batch(units, pad_to, self.pad_id, min_width=self.min_width)

    def values(self, params, batch: CriticBatch):
        """The critic's value of each row of ``batch``: [R] float32."""
        return critic_values(params, self.model, batch)


def _decoder_critic(cfg, policy) -> DecoderCritic:
    if not hasattr(policy, "tokenizer"):
        raise ValueError(f"critic.kind: 'decoder' reads a text policy's state tokens; a "
                         f"{type(policy).__name__} has none (use critic.kind: mlp)")
    return DecoderCritic(critic_model_config(policy.config.vocab_size, cfg.critic,
                                             cfg.model.dtype),
                         policy.tokenizer.pad_id, cfg.policy.max_prompt_tokens)


# critic.kind -> build(cfg, policy) -> critic; "mlp" is registered by jaxdm.rl.symbolic,
# imported on the first lookup that misses.
CRITIC_KINDS: Registry[Callable[[Any, Any], Any]] = Registry(
    "critic", providers=("jaxdm.rl.symbolic",))


def register_critic(name: str, build: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Register ``build(cfg, policy) -> critic`` (see module docstring) as ``name`` (a name
    registered twice is a ``jaxdm.registry.DuplicateNameError``)."""
    return CRITIC_KINDS.register(name, build)


register_critic("decoder", _decoder_critic)
