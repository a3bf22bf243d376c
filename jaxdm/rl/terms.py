"""Loss terms (a registry) and the jitted train step built from them.

A loss term is a pure function ``term(params, batch, aux) -> (loss scalar, metrics)``:

- ``params``: the trainable pytrees by name, ``{"policy": ..., "critic": ...}`` ("critic"
  only when a critic is configured);
- ``batch``: one mini-batch of device arrays: ``policy`` (the policy's training batch),
  ``adv`` [M], ``old_logp`` / ``ref_logp`` [M, L] (``old_logp`` absent when the step is the
  iteration's only update: π_old is then the step's own π), and for the value term ``critic``
  (the critic's ``batch``), ``returns`` [M], ``old_values`` [M], ``row_mask`` [M];
- ``aux``: a ``TermContext`` (the policy object, the critic object and the frozen
  ``LossConfig``), static under jit.

The step minimises Σ_k w_k · term_k with the configured weights (``LossConfig.terms``),
differentiates with respect to every trainable, and updates each with its own optimiser
(``make_optimizers``): the critic's gradients never enter the policy's global-norm clip.
Compiled steps are cached on ``StepSpec`` (a frozen dataclass of everything the compiled
function depends on), so trainers built in one process share one compilation.

Registered terms: ``ppo`` (seed 000's clipped/dual-clipped surrogate + k3 KL + entropy,
needs nothing else) and ``value`` (clipped value loss, needs a critic); ``lvopd`` (gated
top-k distillation, ``jaxdm.rl.lvopd``) is registered by its module, imported on the first
lookup of a name not registered yet (``LOSS_TERMS``' providers), so this module imports no
provider.
Register more with ``register_loss_term(name, fn, needs_critic=...)``. Every term's
unweighted loss is logged as ``loss/<name>`` (unless the term logs that key itself).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from jaxdm.registry import Registry
from jaxdm.rl import advantages as advmod
from jaxdm.rl import losses
from jaxdm.rl.estimators import ESTIMATORS
from jaxdm.rl.losses import AGGREGATIONS

__all__ = ["LossConfig", "StepSpec", "TermContext", "LossTerm", "LOSS_TERMS",
           "register_loss_term", "make_optimizers",
           "make_train_step", "cached_train_step"]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Every static setting of the loss: the terms with their weights and their parameters."""

    terms: tuple[tuple[str, float], ...] = (("ppo", 1.0),)
    clip_eps: float = 0.2
    dual_clip: float = 3.0
    kl_coef: float = 0.01
    entropy_coef: float = 0.001
    aggregation: str = "token-mean"
    value_clip: float = 0.2
    distill_tail: bool = False  # the lvopd term's top-k reverse KL with the tail bucket
    distill_gate_in_kernel: bool = False  # the lvopd term skips gated-off tokens in its kernel

    def __post_init__(self):
        for name, w in self.terms:
            LOSS_TERMS.validate(name, field="LossConfig.terms")
            if not isinstance(w, (int, float)) or not jnp.isfinite(w):
                raise ValueError(f"loss term {name!r}: weight must be a finite number, got {w!r}")
        AGGREGATIONS.validate(self.aggregation, field="LossConfig.aggregation")


@dataclasses.dataclass(frozen=True)
class TermContext:
    """What a loss term reads besides its batch: the policy (its pure log-prob functions), the
    critic or None, and the loss settings."""
    policy: Any                 # the policy object (its logp_and_entropy is pure)
    critic_config: Any          # the critic object (jaxdm.rl.critic.CRITIC_KINDS), or None
    loss: LossConfig


@dataclasses.dataclass(frozen=True)
class LossTerm:
    """A registered loss term: fn(params, batch, ctx) -> (scalar loss, metrics), whether it needs a
    critic, the signals the trainer must produce for it, and whether it reads the policy's shared
    final hidden states."""
    fn: Callable[[Mapping[str, Any], Mapping[str, Any], TermContext], tuple[Any, dict]]
    needs_critic: bool = False
    needs: tuple[str, ...] = ()  # signals (jaxdm.rl.signals) the trainer must produce
    # Reads batch["policy/hidden"]: the policy's final hidden states [M, S, d] from the step's
    # ONE decoder forward (when the policy has ``hidden_states``; the ppo term then computes
    # its log-probs from the same forward, so no term runs a second forward).
    reads_policy_hidden: bool = False


# ``lvopd`` is registered by jaxdm.rl.lvopd, imported on the first lookup that misses.
LOSS_TERMS: Registry[LossTerm] = Registry("loss term", providers=("jaxdm.rl.lvopd",))


def register_loss_term(name: str, fn: Callable, *, needs_critic: bool = False,
                       needs: tuple[str, ...] = (), reads_policy_hidden: bool = False
                       ) -> LossTerm:
    """Register ``fn(params, batch, aux) -> (loss, metrics)`` under ``name`` (see module doc);
    ``needs``: the signals the trainer must produce for it each iteration;
    ``reads_policy_hidden``: see ``LossTerm``; a name registered twice is a
    ``jaxdm.registry.DuplicateNameError``."""
    return LOSS_TERMS.register(name, LossTerm(fn, needs_critic, tuple(needs),
                                              bool(reads_policy_hidden)))


def _ppo_term(params, batch, aux: TermContext):
    cfg = aux.loss
    if "policy/hidden" in batch:  # the step's shared forward (see LossTerm)
        logp, ent, mask = aux.policy.logp_and_entropy_from_hidden(
            params["policy"], batch["policy/hidden"], batch["policy"])
    else:
        logp, ent, mask = aux.policy.logp_and_entropy(params["policy"], batch["policy"])
    adv = batch["adv"]
    adv_tok = advmod.broadcast_to_tokens(adv[:, None], jnp.zeros(mask.shape, jnp.int32), mask)
    use_kl = cfg.kl_coef != 0.0
    # No "old_logp": the step is the iteration's only update (one epoch, one mini-batch), so
    # π_old is this very forward's π (its value; the trainer skips a separate π_old pass).
    old = batch["old_logp"] if "old_logp" in batch else jax.lax.stop_gradient(logp)
    return losses.ppo_loss(logp, old, batch["ref_logp"] if use_kl else None,
                           adv_tok, mask, clip_eps=cfg.clip_eps, dual_clip=cfg.dual_clip,
                           kl_coef=cfg.kl_coef, entropy=ent, entropy_coef=cfg.entropy_coef,
                           aggregation=cfg.aggregation)


def _value_term(params, batch, aux: TermContext):
    v = aux.critic_config.values(params["critic"], batch["critic"])
    return losses.clipped_value_loss(v, batch["old_values"], batch["returns"],
                                     batch["row_mask"], clip=aux.loss.value_clip)


register_loss_term("ppo", _ppo_term)
register_loss_term("value", _value_term, needs_critic=True)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """The cache key of a compiled train step: everything the step's code depends on."""

    policy_key: tuple
    critic_config: Any
    optim: Any          # the (frozen) OptimSection
    critic_lr: float | None
    loss: LossConfig


def make_optimizers(optim, critic_lr: float | None = None, with_critic: bool = False
                    ) -> dict[str, optax.GradientTransformation]:
    """AdamW after a global-norm clip, one per trainable (the critic may use its own lr)."""
    def adamw(lr):
        return optax.chain(optax.clip_by_global_norm(optim.max_grad_norm),
                           optax.adamw(lr, b1=optim.b1, b2=optim.b2,
                                       weight_decay=optim.weight_decay))
    out = {"policy": adamw(optim.lr)}
    if with_critic:
        out["critic"] = adamw(optim.lr if critic_lr is None else critic_lr)
    return out


def make_train_step(aux: TermContext, txs: Mapping[str, optax.GradientTransformation]):
    """jit(step)(params, opt_states, batch) → (params, opt_states, metrics); see module doc.

    ``metrics`` holds every term's metrics, ``loss/total`` (the weighted sum) and
    ``optim/grad_norm`` (the policy's gradient norm; ``optim/<name>_grad_norm`` for other
    trainables).
    """
    terms = [(name, LOSS_TERMS.get(name), float(w)) for name, w in aux.loss.terms]
    share_forward = (any(t.reads_policy_hidden for _, t, _ in terms)
                     and hasattr(aux.policy, "hidden_states"))

    def loss_fn(params, batch):
        total, metrics = None, {}
        if share_forward:  # one decoder forward for every term (differentiated once)
            batch = {**batch, "policy/hidden": aux.policy.hidden_states(params["policy"],
                                                                        batch["policy"])}
        for name, term, w in terms:
            loss, met = term.fn(params, batch, aux)
            metrics.update(met)
            metrics.setdefault(f"loss/{name}", loss)
            total = w * loss if total is None else total + w * loss
        metrics["loss/total"] = total
        return total, metrics

    def step(params, opt_states, batch):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        new_params, new_opt = {}, {}
        for name, tx in txs.items():
            updates, new_opt[name] = tx.update(grads[name], opt_states[name], params[name])
            new_params[name] = optax.apply_updates(params[name], updates)
            key = "optim/grad_norm" if name == "policy" else f"optim/{name}_grad_norm"
            metrics[key] = optax.tree.norm(grads[name])
        return new_params, new_opt, metrics

    return jax.jit(step)


_STEP_CACHE: dict[StepSpec, tuple[Any, Any, Any]] = {}


def cached_train_step(policy, spec: StepSpec):
    """(train_step, logp_fn, optimizers) for ``spec``, compiled once per process."""
    if spec not in _STEP_CACHE:
        txs = make_optimizers(spec.optim, spec.critic_lr, spec.critic_config is not None)
        aux = TermContext(policy, spec.critic_config, spec.loss)
        logp = jax.jit(lambda params, batch: policy.logp_and_entropy(params, batch)[0])
        _STEP_CACHE[spec] = (make_train_step(aux, txs), logp, txs)
    return _STEP_CACHE[spec]


def signals_needed(cfg) -> tuple[str, ...]:
    """The signals a ``TrainConfig`` needs: the estimator's, then those of its ``algo.terms``
    (each once; ``LossTerm.needs``, e.g. ``lvopd`` needs ``teacher_topk``)."""
    out = list(ESTIMATORS.get(cfg.algo.advantage, field="algo.advantage").needs)
    for name in cfg.algo.terms:
        out += [s for s in LOSS_TERMS.get(name, field="algo.terms").needs if s not in out]
    return tuple(out)
