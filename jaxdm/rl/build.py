"""Host-side construction for the trainer: env factories and pools, the policy model, the
critic. Nothing here runs per iteration."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxdm.rl import text as rltext
from jaxdm.rl.env_factories import ENV_FACTORIES
from jaxdm.rl.policy import GenerativePolicy, OptionScoringPolicy

__all__ = ["env_factory", "collect_texts", "build_policy", "make_venv", "build_critic"]


def env_factory(section: Any, split_kwargs: Mapping[str, Any]):
    from jaxdm.envs.vector import EnvFactory

    target = section.factory or ENV_FACTORIES.get(section.name)
    if target is None:
        raise ValueError(f"env.name: unknown env {section.name!r}: give env.factory="
                         f"'module:callable' or one of {sorted(ENV_FACTORIES)}")
    return EnvFactory(target, dict(section.kwargs) | dict(split_kwargs))


def collect_texts(env, seeds: Sequence[int], budget: int) -> list[str]:
    """Texts a closed-vocabulary tokenizer must cover: random-policy episodes + templates."""
    texts = [rltext.option_context("g", "o", [("o", "a")], 1, 2),
             rltext.policy_prompt("g", "o", ["a"], [("o", "a")], 1), "<think> </think>",
             "<action> </action>", rltext.INVALID_COMMAND]
    for s in seeds:
        rng = np.random.default_rng(s)
        obs, state = env.reset(int(s))
        info = env.reset_info(state, env.default_params) if hasattr(env, "reset_info") else {}
        texts += [obs, str(info.get("goal", "")), *info.get("admissible_actions", [])]
        acts = list(info.get("admissible_actions", []))
        for _ in range(budget):
            if not acts:
                break
            a = acts[rng.integers(len(acts))]
            obs, state, _, done, info = env.step(0, state, a)
            texts += [obs, *info.get("admissible_actions", [])]
            acts = list(info.get("admissible_actions", []))
            if done:
                break
    return texts


def build_policy(cfg, train_factory, eval_factory):
    """(policy, initial params, model config, tokenizer) for ``cfg.model``/``cfg.policy``."""
    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig

    m = cfg.model
    if m.path:
        from jaxdm.models.loading import load_pretrained

        pre = load_pretrained(m.path, dtype=m.dtype)
        params, mcfg = pre.params, pre.config
        tokenizer = rltext.HFTokenizer(pre.tokenizer)
    else:
        texts = collect_texts(train_factory(), range(64), cfg.max_actions)
        texts += collect_texts(eval_factory(), range(10**6, 10**6 + 64), cfg.max_actions)
        tokenizer = rltext.WordTokenizer.from_texts(texts)
        mcfg = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=m.hidden_size,
                           intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                           num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                           head_dim=m.head_dim, tie_embeddings=True, dtype=m.dtype)
        params = decoder.init_params(mcfg, jax.random.key(m.init_seed))
    p = cfg.policy
    if p.form == "option":
        policy = OptionScoringPolicy(
            mcfg, tokenizer, history=p.history, max_context_tokens=p.max_prompt_tokens,
            max_option_tokens=p.max_option_tokens, normalize=p.normalize_options,
            temperature=p.temperature)
    else:
        policy = GenerativePolicy(
            mcfg, tokenizer, history=p.history, max_prompt_tokens=p.max_prompt_tokens,
            max_response_tokens=p.max_response_tokens, temperature=p.temperature,
            top_p=p.top_p, with_entropy=cfg.algo.entropy_coef != 0.0)
    return policy, params, mcfg, tokenizer


def build_critic(cfg, vocab_size: int):
    """(critic model config, initial critic params) or (None, None) without a critic."""
    if cfg.critic.kind == "none":
        return None, None
    from jaxdm.rl.critic import critic_model_config, init_critic

    ccfg = critic_model_config(vocab_size, cfg.critic, cfg.model.dtype)
    return ccfg, init_critic(ccfg, jax.random.key(cfg.critic.init_seed))


def make_venv(cfg, factory, num_envs: int, group_size: int):
    from jaxdm.envs.local import LocalVectorEnv

    e = cfg.env
    if e.num_workers <= 0:
        return LocalVectorEnv(factory(), num_envs, group_size=group_size)
    from jaxdm.envs.vector import VectorEnv

    return VectorEnv(factory, num_envs, num_workers=e.num_workers, group_size=group_size,
                     step_timeout=e.step_timeout, max_steps=cfg.max_actions, env_name=e.name)
