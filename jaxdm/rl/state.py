"""The trainer's whole state as one value, checkpointed whole by orbax.

``TrainState`` holds everything a run needs to continue bit-exactly: the trainable pytrees
(``params["policy"]``, ``params["critic"]`` when a critic is configured), one optimiser state
per trainable, the device PRNG key, and the host-side iteration counter, data cursor (the
next training task seed offset) and numpy Generator (mini-batch shuffling). The frozen
reference policy is *not* stored: it is the initial policy, rebuilt identically from the
config (``model.init_seed`` or ``model.path``) on resume.

The trainer computes an iteration's new state from the old one and replaces its state only
when the iteration has finished, so a checkpoint (periodic, on exit, on Ctrl-C, after an
error) always holds a finished iteration's state.

On disk (``Checkpointer`` items): ``state`` = {"params", "opt_state", "key"} (+ "critic",
"critic_opt_state"), the layout of earlier runs, and ``host`` = {"iteration", "cursor",
"host_rng"}.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

import jax
import numpy as np

from jaxdm.rl.checkpoint import numpy_rng_from_state, numpy_rng_state

__all__ = ["TrainState", "to_checkpoint", "from_checkpoint", "place_key", "nonfinite_leaves",
           "NonFiniteCheckpointError"]


class NonFiniteCheckpointError(ValueError):
    """A restored checkpoint holds NaN/inf tensors."""


@dataclasses.dataclass
class TrainState:
    """Everything an exact resume needs: the trainables' params and optimiser states (policy,
    critic), the device PRNG key, the iteration, the task cursor and the host RNG (mini-batch
    order)."""
    params: dict[str, Any]        # {"policy": ..., "critic": ... (optional)}
    opt_states: dict[str, Any]    # one optimiser state per trainable
    key: jax.Array                # device PRNG key (typed)
    iteration: int
    cursor: int
    host_rng: np.random.Generator

    def fork(self) -> "TrainState":
        """A copy whose host RNG can advance without touching this state's."""
        return dataclasses.replace(self, host_rng=copy.deepcopy(self.host_rng),
                                   params=dict(self.params), opt_states=dict(self.opt_states))


def to_checkpoint(state: TrainState) -> tuple[dict[str, Any], dict[str, Any]]:
    """A TrainState as (arrays orbax saves: params, optimiser states, key data; host JSON:
    iteration, cursor, host RNG state)."""
    arrays = {"params": state.params["policy"], "opt_state": state.opt_states["policy"],
              "key": jax.random.key_data(state.key)}
    if "critic" in state.params:
        arrays["critic"] = state.params["critic"]
        arrays["critic_opt_state"] = state.opt_states["critic"]
    host = {"iteration": state.iteration, "cursor": state.cursor,
            "host_rng": numpy_rng_state(state.host_rng)}
    return arrays, host


def from_checkpoint(arrays: dict[str, Any], host: dict[str, Any], key_sharding) -> TrainState:
    """The TrainState of restored checkpoint ``arrays`` and ``host`` record, its key placed with
    ``key_sharding``."""
    params = {"policy": arrays["params"]}
    opts = {"policy": arrays["opt_state"]}
    if "critic" in arrays:
        params["critic"], opts["critic"] = arrays["critic"], arrays["critic_opt_state"]
    key = place_key(jax.random.wrap_key_data(arrays["key"]), key_sharding)
    return TrainState(params, opts, key, int(host["iteration"]), int(host["cursor"]),
                      numpy_rng_from_state(host["host_rng"]))


def place_key(key: jax.Array, sharding) -> jax.Array:
    """``key`` (a typed PRNG key) placed with ``sharding``, also one spanning several
    processes (``jax.device_put`` refuses typed keys there: the raw key data travels)."""
    if sharding.is_fully_addressable:
        return jax.device_put(key, sharding)
    if key.sharding.is_equivalent_to(sharding, key.ndim):
        return key
    data = jax.device_put(np.asarray(jax.random.key_data(key)), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths of floating leaves of ``tree`` holding NaN or inf."""
    bad, spread = [], []
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
                spread.append((path, leaf))
            continue
        a = np.asarray(leaf)
        if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
            bad.append(jax.tree_util.keystr(path))
    if spread:  # arrays over several processes: one global check, its answer on every process
        finite = jax.jit(lambda xs: [jax.numpy.isfinite(x).all() for x in xs])(
            [x for _, x in spread])
        bad += [jax.tree_util.keystr(p) for (p, _), ok in zip(spread, finite)
                if not bool(ok.addressable_data(0))]
    return bad


def check_restored(arrays: dict[str, Any], step: int, mode: str) -> None:
    """Refuse (``mode="fail"``) or warn about a checkpoint with non-finite tensors."""
    bad = nonfinite_leaves({k: v for k, v in arrays.items() if k != "key"})
    if not bad:
        return
    msg = (f"checkpoint step {step} holds NaN/inf in {len(bad)} tensor(s), e.g. "
           f"{bad[:3]} (on_nonfinite_checkpoint={mode!r})")
    if mode == "fail":
        raise NonFiniteCheckpointError(msg + "; set on_nonfinite_checkpoint=warn to load it")
    warnings.warn(msg, RuntimeWarning, stacklevel=2)
