"""A small policy on a symbolic observation: an MLP over per-step feature rows.

The policy kind ``symbolic_mlp`` (``jaxdm.rl.build.POLICY_KINDS``) plays pure-JAX envs
(``jaxdm.rl.jax_envs``) through the jitted rollout (``jaxdm.rl.jax_rollout``). One recorded
action's training unit is its **observation row**: the env's int32 encoding of what the agent
saw (BabyAI: the 7 x 7 x 3 symbolic view, heading, mission, optionally a target compass; see
``jax_envs``). The env's ``features(rows)`` turns rows into floats inside the jitted policy, so
units stay small and training recomputes exactly what acting computed.

- ``SymbolicMLPPolicy``: π(a | s) = softmax(mlp(features(row))), a fixed action set; one
  action = one "token" for the PPO loss (L = 1), like the option-scoring text policy. It has
  the text policies' training interface (``training_batch``, ``logp_and_entropy``,
  ``static_key``), so the trainer's update (mini-batches, loss terms, TrainState, orbax
  checkpoints) is the same code for both. Like the decoder policy it exposes its last hidden
  layer (``hidden_states``, one "token" per row) and logits from it, so a term that reads the
  hidden states (``lvopd``) shares the step's one forward; ``linear_head`` is the output layer
  as one [H + 1, A] matrix (the "LM head" of LVOPD's distillation).
- ``MLPCritic``: PPO's critic for this policy, registered as ``critic.kind: mlp``
  (``jaxdm.rl.critic.CRITIC_KINDS``): a separate MLP of the same shape on the same features
  (separate, not a head, so GRPO, LVRL and PPO train the identical policy network).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.rl.critic import register_critic

__all__ = ["init_mlp", "mlp", "RowBatch", "SymbolicMLPPolicy", "MLPCritic", "rows_batch"]


def init_mlp(key: jax.Array, sizes: Sequence[int], *, last_scale: float = 0.1) -> list[dict]:
    """[{"w": [a, b], "b": [b]}] per layer; LeCun-normal weights, the last layer scaled by
    ``last_scale`` (a near-uniform initial policy, a near-zero initial critic)."""
    params = []
    for k, (a, b) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        params.append({"w": jax.random.normal(k, (a, b)) * jnp.sqrt(1.0 / a),
                       "b": jnp.zeros((b,))})
    params[-1]["w"] = params[-1]["w"] * last_scale
    return params


def mlp(params: Sequence[dict], x: jax.Array) -> jax.Array:
    """tanh hidden layers, linear output."""
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


class RowBatch(NamedTuple):
    """Fixed-shape training rows: rows [D, R] int32, chosen [D] int32, row_mask [D] bool."""

    rows: Any
    chosen: Any
    row_mask: Any


def rows_batch(units: Sequence[Any], pad_to: int, width: int,
               chosen: Sequence[int] | None = None) -> RowBatch:
    """Stack ``units`` (observation rows, or dicts with "row"/"chosen") padded to ``pad_to``."""
    if pad_to < len(units):
        raise ValueError(f"pad_to={pad_to} < number of units {len(units)}")
    rows = np.zeros((pad_to, width), np.int32)
    ch = np.zeros((pad_to,), np.int32)
    if len(units):
        arr = np.asarray(units, np.int32)
        if arr.ndim != 2 or arr.shape[1] != width + 1:
            raise ValueError(f"symbolic units must be rows [N, {width} + 1] (observation row, "
                             f"then the chosen action), got {list(arr.shape)}")
        rows[:len(arr)] = arr[:, :width]
        ch[:len(arr)] = arr[:, width]
    return RowBatch(rows, ch, np.arange(pad_to) < len(units))


@dataclasses.dataclass(frozen=True)
class SymbolicMLPPolicy:
    """MLP policy over an env's observation rows (see module docstring).

    A training unit is one int32 row [R + 1]: the observation row followed by the chosen
    action (``jaxdm.rl.jax_rollout`` records them), so ``EpisodeBatch.units`` is an [N, R + 1]
    array.
    """

    features: Callable[[jax.Array], jax.Array]   # int rows [.., R] -> float [.., F]
    row_width: int                               # R
    feature_dim: int                             # F
    num_actions: int
    hidden: tuple[int, ...] = (128, 128)
    temperature: float = 1.0
    form: str = "symbolic"
    # The sampling log-prob comes from another compiled program (the rollout's scan), so the
    # trainer recomputes π_old with ``logp_and_entropy`` before the first update.
    exact_sampling_logp: bool = False

    @property
    def static_key(self) -> tuple:
        """What fixes this policy's compiled programs (form, features, widths, actions, hidden
        sizes, temperature): jitted steps are cached per key."""
        return (self.form, self.features, self.row_width, self.feature_dim, self.num_actions,
                self.hidden, self.temperature)

    def init_params(self, key: jax.Array) -> list[dict]:
        """The MLP's layers (feature_dim -> hidden... -> num_actions logits) initialised from
        ``key``."""
        return init_mlp(key, [self.feature_dim, *self.hidden, self.num_actions])

    def last_hidden(self, params, rows: jax.Array) -> jax.Array:
        """The last hidden layer's activations [.., H] of int observation rows [.., R]."""
        if rows.shape[-1] != self.row_width:
            raise ValueError(f"observation rows have width {rows.shape[-1]}, the policy "
                             f"expects {self.row_width}")
        x = self.features(rows)
        for layer in params[:-1]:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return x

    def _head_logits(self, params, hidden: jax.Array) -> jax.Array:
        return (hidden @ params[-1]["w"] + params[-1]["b"]) / self.temperature

    def logits(self, params, rows: jax.Array) -> jax.Array:
        """Action logits [.., A] of int observation rows [.., R] (pure, jit/vmap-able)."""
        return self._head_logits(params, self.last_hidden(params, rows))

    def linear_head(self, params) -> jax.Array:
        """The output layer as one matrix [H + 1, A] (weights, then the bias row; divided by
        the temperature): ``with_bias_input(hidden) @ linear_head(params)`` are the logits.
        LVOPD's distillation reads the policy as (hidden states, "LM head") through it."""
        last = params[-1]
        return jnp.concatenate([last["w"], last["b"][None]], 0) / self.temperature

    @staticmethod
    def with_bias_input(hidden: jax.Array) -> jax.Array:
        """``hidden`` [.., H] with a constant 1 appended [.., H + 1] (see ``linear_head``)."""
        return jnp.concatenate([hidden, jnp.ones(hidden.shape[:-1] + (1,), hidden.dtype)], -1)

    def training_batch(self, units: Sequence[Any], pad_to: int) -> RowBatch:
        """The RowBatch [pad_to, row_width] of the units' observation rows and chosen actions."""
        return rows_batch(units, pad_to, self.row_width)

    def hidden_states(self, params, batch: RowBatch) -> jax.Array:
        """[D, 1, H]: one "token" per row (the train step's one forward, shared by the terms
        that read it, ``jaxdm.rl.terms``)."""
        return self.last_hidden(params, jnp.asarray(batch.rows))[:, None, :]

    def logp_and_entropy(self, params, batch: RowBatch):
        """(logp [D, 1], entropy [D, 1], mask [D, 1]) of the chosen actions."""
        return self.logp_and_entropy_from_hidden(params, self.hidden_states(params, batch),
                                                 batch)

    def logp_and_entropy_from_hidden(self, params, hidden: jax.Array, batch: RowBatch):
        """``logp_and_entropy`` from ``hidden_states``' output [D, 1, H]."""
        logp_all = jax.nn.log_softmax(self._head_logits(params, hidden[:, 0]), -1)
        chosen = jnp.asarray(batch.chosen)
        picked = jnp.take_along_axis(logp_all, chosen[:, None], axis=-1)
        ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1, keepdims=True)
        mask = jnp.asarray(batch.row_mask, bool)[:, None]
        return jnp.where(mask, picked, 0.0), jnp.where(mask, ent, 0.0), mask


@dataclasses.dataclass(frozen=True)
class MLPCritic:
    """V(s) = mlp(features(row)) for a ``SymbolicMLPPolicy``'s rows (``critic.kind: mlp``).

    The critic interface (``jaxdm.rl.critic``): ``init(key)``, ``batch(units, pad_to)`` and
    the pure ``values(params, batch) -> [R]``.
    """

    features: Callable[[jax.Array], jax.Array]
    row_width: int
    feature_dim: int
    hidden: tuple[int, ...] = (128, 128)

    def init(self, key: jax.Array) -> list[dict]:
        """The critic MLP's layers (feature_dim -> hidden... -> 1) initialised from ``key``."""
        return init_mlp(key, [self.feature_dim, *self.hidden, 1])

    def batch(self, units: Sequence[Any], pad_to: int) -> RowBatch:
        """The RowBatch [pad_to, row_width] of the units' observation rows."""
        return rows_batch(units, pad_to, self.row_width)

    def values(self, params, batch: RowBatch) -> jax.Array:
        """V(s) [D] of each row of ``batch``."""
        return mlp(params, self.features(jnp.asarray(batch.rows)))[..., 0]


def _mlp_critic(cfg, policy) -> MLPCritic:
    if not isinstance(policy, SymbolicMLPPolicy):
        raise ValueError(f"critic.kind: 'mlp' reads a symbolic policy's observation rows "
                         f"(policy.kind: symbolic_mlp), not a {type(policy).__name__}")
    return MLPCritic(policy.features, policy.row_width, policy.feature_dim, policy.hidden)


register_critic("mlp", _mlp_critic)
