"""Host-side construction for the trainer: env factories and pools, the policy model, the
critic, the rollout collector. Nothing here runs per iteration.

Policy kinds are registered (``POLICY_KINDS``, the names ``policy.kind`` takes), each with
its builder and the rollout kind that plays it (``jaxdm.rl.collect.ROLLOUT_KINDS``):

- ``text``: the decoder policies on text envs (``policy.form``: ``option`` or
  ``generative``), rollout ``host``;
- ``symbolic_mlp``: an MLP on a pure-JAX env's observation rows
  (``jaxdm.rl.symbolic.SymbolicMLPPolicy``, ``policy.mlp_hidden``), rollout ``jax``.

``register_rollout_kind`` adds a rollout kind and the policy kind of the same name that plays
it in one call (``jaxdm.train.harness_rollout`` registers ``harness`` so).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxdm.envs.vector import EnvFactory
from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.lora import load_model
from jaxdm.registry import DuplicateNameError, Registry
from jaxdm.rl import text as rltext
from jaxdm.rl.collect import ROLLOUT_KINDS, RolloutKind, check_rollout
from jaxdm.rl.critic import CRITIC_KINDS
from jaxdm.rl.env_factories import ENV_FACTORIES
from jaxdm.rl.jax_envs import make_jax_env
from jaxdm.rl.policy import GenerativePolicy, OptionScoringPolicy
from jaxdm.rl.symbolic import SymbolicMLPPolicy

__all__ = ["env_factory", "env_factories", "collect_texts", "build_policy",
           "build_critic", "PolicyKind", "POLICY_KINDS", "check_policy_kind", "make_collector",
           "decoder_model", "register_rollout_kind"]


def env_factory(section: Any, split_kwargs: Mapping[str, Any]):
    """The EnvFactory of an env config section: its factory ('module:callable') or the registered
    ENV_FACTORIES entry of its name, called with the section's kwargs and the split's; an unknown
    name is a ValueError listing the known ones."""
    target = section.factory or ENV_FACTORIES.get(section.name, field="env.name")
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


def decoder_model(cfg, texts: Callable[[], Sequence[str]]):
    """(params, model config, tokenizer) of a decoder policy: ``model.path`` (an HF or adapter
    folder, or ``smollm2``: ``jaxdm.models.lora.load_model``) or a tiny random decoder of the
    ``model`` section's sizes with a word tokenizer over ``texts()``."""
    m = cfg.model
    if m.path:
        pre = load_model(m.path, dtype=m.dtype)
        return pre.params, pre.config.replace(remat=m.remat), rltext.HFTokenizer(pre.tokenizer)
    tokenizer = rltext.WordTokenizer.from_texts(texts())
    mcfg = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                       num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                       head_dim=m.head_dim, tie_embeddings=True, dtype=m.dtype, remat=m.remat)
    return decoder.init_params(mcfg, jax.random.key(m.init_seed)), mcfg, tokenizer


def _text_policy(cfg, train_factory, eval_factory):
    """(policy, params, model config, tokenizer) of the decoder text policy."""
    def texts():
        return (collect_texts(train_factory(), range(64), cfg.max_actions) +
                collect_texts(eval_factory(), range(10**6, 10**6 + 64), cfg.max_actions))

    params, mcfg, tokenizer = decoder_model(cfg, texts)
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


def _symbolic_policy(cfg, train_factory, eval_factory):
    """(policy, params, None, None): the MLP on the JAX env's observation rows."""
    spec = make_jax_env(cfg.env.name, cfg.env.kwargs, cfg.max_actions)
    policy = SymbolicMLPPolicy(spec.features, spec.row_width, spec.feature_dim,
                               spec.num_actions, tuple(cfg.policy.mlp_hidden),
                               cfg.policy.temperature)
    return policy, policy.init_params(jax.random.key(cfg.model.init_seed)), None, None


@dataclasses.dataclass(frozen=True)
class PolicyKind:
    """A registered policy.kind: how to build it from the config and env factories, the rollout kind
    (jaxdm.rl.collect.ROLLOUT_KINDS) that plays it, the critic kinds that can read its states, and
    whether it plays host env factories."""
    build: Callable[[Any, Any, Any], tuple]  # (cfg, train/eval factories) -> build_policy's
    rollout: str                                       # a jaxdm.rl.collect.ROLLOUT_KINDS name
    critics: tuple[str, ...]                           # critic kinds that read its states
    env_factories: bool = True                         # plays host env factories


POLICY_KINDS: Registry[PolicyKind] = Registry(
    "policy kind", hint="a kind of a higher layer registers when its module is imported: "
    "harness by jaxdm.train.harness_rollout")
POLICY_KINDS.register("text", PolicyKind(_text_policy, "host", ("decoder",)))
POLICY_KINDS.register("symbolic_mlp", PolicyKind(_symbolic_policy, "jax", ("mlp",),
                                                 env_factories=False))


def register_rollout_kind(name: str, rollout: RolloutKind, *, policy: Callable,
                          critics: tuple[str, ...] = ()) -> None:
    """Register rollout kind ``name`` (``jaxdm.rl.collect.ROLLOUT_KINDS``) and policy kind
    ``name`` playing it: ``policy(cfg, train_factory, eval_factory)`` returns what
    ``build_policy`` does, ``critics`` the critic kinds that read its states; host env
    factories only if the rollout takes ``env.factory``. ``policy.kind: name`` selects it."""
    if name in POLICY_KINDS:  # checked first: neither registry keeps half of a pair
        raise DuplicateNameError(f"policy kind {name!r} is already registered")
    ROLLOUT_KINDS.register(name, rollout)
    POLICY_KINDS.register(name, PolicyKind(policy, name, tuple(critics),
                                           env_factories=rollout.env_factory))


def check_policy_kind(cfg) -> None:
    """``policy.kind`` is registered and its rollout can serve ``cfg`` (errors name the key)."""
    kind = POLICY_KINDS.get(cfg.policy.kind, field="policy.kind")
    if cfg.critic.kind != "none" and cfg.critic.kind not in kind.critics:
        raise ValueError(f"critic.kind: {cfg.critic.kind!r} cannot read policy.kind="
                         f"{cfg.policy.kind!r} states; use one of "
                         f"{list(kind.critics) or ['none']}")
    check_rollout(cfg, kind.rollout)


def env_factories(cfg):
    """(train, eval) host env factories, or (None, None) for a policy kind without them."""
    if not POLICY_KINDS[cfg.policy.kind].env_factories:
        return None, None
    return env_factory(cfg.env, {}), env_factory(cfg.env, cfg.env.eval_kwargs)


def build_policy(cfg, train_factory, eval_factory):
    """(policy, initial params, model config, tokenizer) for ``cfg.policy.kind`` (the last
    two None for a policy without a decoder)."""
    return POLICY_KINDS[cfg.policy.kind].build(cfg, train_factory, eval_factory)


def make_collector(cfg, policy, train_factory, eval_factory, *, dist,
                   with_values: bool = False):
    """The rollout collector of ``cfg.policy.kind`` (``jaxdm.rl.collect``); ``dist``: the
    trainer's distribution seam (``jaxdm.rl.distributed.make``); ``with_values``: record the
    env's oracle values (the ``values`` signal's ``oracle`` model reads them)."""
    kind = ROLLOUT_KINDS[POLICY_KINDS[cfg.policy.kind].rollout]
    return kind.make(cfg, policy, {"train_factory": train_factory, "eval_factory": eval_factory,
                                   "dist": dist, "with_values": with_values})


def build_critic(cfg, policy):
    """(critic object, initial params), or (None, None) without a critic
    (``jaxdm.rl.critic.CRITIC_KINDS``)."""
    if cfg.critic.kind == "none":
        return None, None

    critic = CRITIC_KINDS.get(cfg.critic.kind, field="critic.kind")(cfg, policy)
    return critic, critic.init(jax.random.key(cfg.critic.init_seed))


