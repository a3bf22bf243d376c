"""LVOPD in the trainer: the ``lvopd`` loss term, its per-unit arrays, and the teacher's
top-K_T signal (seed 001, section 3.3, appendix B.3).

**Objective.** With ``algo.terms: {lvopd: c}`` the trainer minimises

    L = L_PPO(clipped surrogate with the configured estimator; use algo.advantage: lvrl)
        + c · Σ_tokens w_a(t) · KL_top16(π_θ(·|s_t) ‖ π_T(·|s_t)) / #action tokens

where w_a is the gate of the action that generated token t (``jaxdm.rl.distill.GATES``:
``lvopd`` = max(0, −Â), ``pure`` = 1, ``trajectory`` = 1 on failed trajectories), computed on
the host over the whole iteration batch (``unit_gate_weights``) before mini-batching, and the
KL is the top-k reverse KL of ``jaxdm.kernels`` on the student's top-16 support against the
teacher's top-32 log-probs. Our default coefficient c = ``DEFAULT_DISTILL_COEF`` = 1.0 (the
seed does not state one). The term applies to environment-action tokens: the response tokens
of each policy turn (``TokenBatch.response_mask``), not prompts.

**Kernel.** The student's final hidden states come from the decoder forward of the training
batch (in the trainer: the step's one policy forward, shared with the ``ppo`` term through
``batch["policy/hidden"]``, ``jaxdm.rl.terms``; no second forward); only the response positions are gathered ([M, R, d]) and fed to
``fused_linear_topk_reverse_kl`` with the LM head, so no [T, V] logits tensor exists
(``impl="auto"``, the default everywhere here: Pallas on GPU/TPU, chunked XLA on CPU;
``jaxdm.kernels.resolve_impl``). ``lvopd_objective`` is the whole
LVOPD loss as one pure function (surrogate and distillation from one forward) for callers
that own their train step; the registered ``lvopd`` term adds the distillation to the
trainer's ``ppo`` term.

**Per-unit arrays** (``lvopd_unit_arrays``, host): the term reads these mini-batch keys:

- ``lvopd/weights`` [M] float32: the unit's gate weight;
- ``lvopd/positions`` [M, R] int32: hidden-state row predicting the unit's j-th response
  token (prompt length − 1 + j);
- ``lvopd/mask`` [M, R] bool: a real response token whose teacher list exists;
- ``lvopd/response`` [M, R] bool: a real response token (the surrogate's mask in
  ``lvopd_objective``);
- ``lvopd/teacher_ids`` [M, R, K_T] int32, ``lvopd/teacher_logprobs`` [M, R, K_T] float32.

**Policy forms** (``DISTILL_FORMS``, keyed by ``policy.form``): the term reads a policy as
(hidden states at the units' response positions, LM head). ``generative``: the decoder's final
hidden states and its LM head (top-16 student support, K_T = 32). ``symbolic``
(``SymbolicMLPPolicy``, the JAX BabyAI policy): one "token" per action, the MLP's last hidden
layer with a constant 1 appended and the output layer [W; b] / temperature as the head
(``linear_head``), so the same fused top-k KL runs with k = min(16, V) = 6 = V: with the
teacher's full 6-action list (K_T = 6) it is the exact reverse KL.

**Teacher signal** ``teacher_topk``: for every generated token of the student's rollouts the
teacher's top-K_T ids and log-probs, from a local jaxdm model (``LocalTeacher``: one packed
pass per trajectory; each action's prompt + response is one segment, the teacher prompt is
the policy prompt) or a remote OpenAI-compatible server (``RemoteTeacher``: ``/v1/completions``
with ``echo``, ``logprobs=K_T`` and token-id prompts; a failed request is counted and its
trajectory gets no distillation). Teacher and student must share the tokenizer (vocabulary).
Where the teacher comes from is a registry (``TEACHER_POLICIES``, keyed by ``teacher.kind``):
``remote``, ``local_readout`` / ``local_likelihood`` (a checkpoint folder, ``teacher.path``)
for text policies, and ``babyai_privileged`` for the symbolic policy on ``babyai_jax``
(``jaxdm.rl.babyai_teacher.PrivilegedTopK``: the privileged SFT teacher's log-probs over all 6
actions at every state the student acted in, one jitted vmapped pass over the rollout's
recorded env states; params from ``teacher.path`` or trained once and cached).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.decision import Remote
from jaxdm.kernels import (kl_from_stats, lse_topk_pallas, lse_topk_xla, resolve_impl,
                           weighted_kl_loss)
from jaxdm.kernels.topk_reverse_kl import DEFAULT_FLOOR_MIN
from jaxdm.models import decoder
from jaxdm.models.config import ModelConfig
from jaxdm.models.loading import load_params, read_config
from jaxdm.registry import Registry
from jaxdm.rl import losses
from jaxdm.rl.babyai_teacher import build_topk_teacher
from jaxdm.rl.distill import gate_weights, lvopd_distill_loss
from jaxdm.rl.signals import Signal, register_signal
from jaxdm.rl.terms import register_loss_term

__all__ = ["STUDENT_TOP_K", "TEACHER_TOP_K", "DEFAULT_DISTILL_COEF", "LVOPD_KEYS",
           "lm_head_matrix", "lvopd_loss_from_hidden", "lvopd_loss_fused",
           "lvopd_objective", "unit_gate_weights", "lvopd_unit_arrays", "gate_slots",
           "TeacherTopK", "LocalTeacher", "RemoteTeacher", "teacher_topk_signal",
           "pack_trajectory", "unit_teacher_lists", "LVOPDBatcher", "DistillForm",
           "DISTILL_FORMS", "TeacherPolicy", "TEACHER_POLICIES",
           "register_teacher_policy"]

STUDENT_TOP_K = 16
TEACHER_TOP_K = 32
DEFAULT_DISTILL_COEF = 1.0
LVOPD_KEYS = ("lvopd/weights", "lvopd/positions", "lvopd/mask", "lvopd/teacher_ids",
              "lvopd/teacher_logprobs")


def lm_head_matrix(params, config: ModelConfig) -> jax.Array:
    """The LM head as [d, V] (tied embeddings: the embedding table transposed)."""
    return params["embed"].T if config.tie_embeddings else params["lm_head"]


# ---- the loss ------------------------------------------------------------------------------
def _response_hidden(params, config: ModelConfig, tokens, valid, positions):
    """(hidden [M, S, d] of the batch, the rows at ``positions`` [M, R] -> [M, R, d])."""
    tokens = jnp.asarray(tokens)
    m, s = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(s), (m, s))
    hidden = decoder.forward(params, config, tokens, pos, attn_mask=jnp.asarray(valid, bool))
    return hidden, jnp.take_along_axis(hidden, jnp.asarray(positions)[..., None], axis=1)


def _distill(h_resp, head, batch, *, impl: str, tail: bool = False,
             gate_in_kernel: bool = False):
    """The gated top-k reverse KL of the units' response positions (one implementation for
    every policy form; the student support is min(16, V): all 6 actions for the symbolic
    policy, where with K_T = V = 6 the top-k KL is the exact reverse KL). ``gate_in_kernel``:
    the kernel computes only the gated-on tokens, at the capacity ``lvopd/gate_slots``'
    length (``LVOPDBatcher(gate_in_kernel=True)``)."""
    w = jnp.asarray(batch["lvopd/weights"], jnp.float32)[:, None]          # [M, 1]: one action
    mask = jnp.asarray(batch["lvopd/mask"], bool)
    capacity = None
    if gate_in_kernel:
        if "lvopd/gate_slots" not in batch:
            raise ValueError("algo.lvopd_gate_in_kernel: the mini-batch lacks "
                             "'lvopd/gate_slots' (LVOPDBatcher(gate_in_kernel=True) adds it)")
        capacity = int(batch["lvopd/gate_slots"].shape[0])
    return lvopd_distill_loss(h_resp, batch["lvopd/teacher_ids"],
                              batch["lvopd/teacher_logprobs"], w,
                              jnp.zeros(mask.shape, jnp.int32), mask, lm_head=head,
                              k=min(STUDENT_TOP_K, int(head.shape[1])), impl=impl,
                              tail=tail, gate_capacity=capacity)


def lvopd_loss_from_hidden(logp, old_logp, adv, response_mask, h_resp, head, batch: dict, *,
                           coef: float = DEFAULT_DISTILL_COEF, clip_eps: float = 0.2,
                           dual_clip: float = 3.0, impl: str = "auto", tail: bool = False,
                           gate_in_kernel: bool = False):
    """Clipped surrogate on ``logp`` [M, S] (token-mean over ``response_mask``) + coef ·
    gated top-k distillation of the gathered response hidden states ``h_resp`` [M, R, d]
    through ``head`` [d, V] (``gate_in_kernel``: only the gated-on tokens, ``batch`` holding
    ``lvopd/gate_slots``). Returns ``(loss, metrics)``."""
    if not math.isfinite(coef):
        raise ValueError(f"coef must be finite, got {coef}")
    mask = jnp.asarray(response_mask, bool)
    adv_tok = jnp.where(mask, jnp.asarray(adv, jnp.float32)[:, None], 0.0)
    pg, pg_met = losses.ppo_loss(jnp.where(mask, logp, 0.0), old_logp, None, adv_tok, mask,
                                 clip_eps=clip_eps, dual_clip=dual_clip, kl_coef=0.0,
                                 entropy=None, entropy_coef=0.0)
    dl, met = _distill(h_resp, head, batch, impl=impl, tail=tail, gate_in_kernel=gate_in_kernel)
    met = dict(met)
    met["loss/pg"] = pg_met["loss/pg"]
    met["loss/lvopd_total"] = pg + coef * dl
    return pg + coef * dl, met


def lvopd_loss_fused(h_resp, head, targets, old_logp, adv, weights, mask, teacher_ids,
                     teacher_logprobs, *, distill_mask=None, coef: float = DEFAULT_DISTILL_COEF,
                     clip_eps: float = 0.2, dual_clip: float = 3.0, impl: str = "auto",
                     block_v: int | None = None, tail: bool = False):
    """The LVOPD loss head with ONE streaming pass over the vocabulary for both parts.

    The streaming statistics of ``h_resp @ head`` (log-sum-exp and the student's top-16,
    ``jaxdm.kernels``) give both log π(target) = z_target − lse for the clipped surrogate and
    the top-k reverse KL for the distillation; no [T, V] tensor exists in the forward or the
    backward. All arrays are over the response tokens: ``h_resp`` [M, R, d], ``targets`` /
    ``old_logp`` / ``mask`` [M, R], ``adv`` / ``weights`` [M], teacher lists [M, R, K_T];
    ``distill_mask`` [M, R] (default ``mask``) the tokens whose teacher lists exist.
    Returns ``(loss, metrics)``.
    """
    if not math.isfinite(coef):
        raise ValueError(f"coef must be finite, got {coef}")
    h_resp, head = jnp.asarray(h_resp), jnp.asarray(head)
    m, r, d = h_resp.shape
    if head.ndim != 2 or head.shape[0] != d:
        raise ValueError(f"head must be [d={d}, V], got {head.shape}")
    distill_mask = mask if distill_mask is None else distill_mask
    for name, x in (("targets", targets), ("old_logp", old_logp), ("mask", mask),
                    ("distill_mask", distill_mask)):
        if jnp.shape(x) != (m, r):
            raise ValueError(f"{name} must be [M, R] = {(m, r)}, got {jnp.shape(x)}")
    vocab = head.shape[1]
    rows = h_resp.reshape(m * r, d)
    impl = resolve_impl(impl)
    if impl == "xla":
        stats = lse_topk_xla.lse_topk_linear(rows, head, STUDENT_TOP_K,
                                             block_v or lse_topk_xla.DEFAULT_BLOCK_V)
    elif impl == "pallas":
        stats = lse_topk_pallas.lse_topk_linear(rows, head, k=STUDENT_TOP_K)
    else:
        raise ValueError(f"impl must be 'auto', 'xla' or 'pallas', got {impl!r}")
    cols = jnp.take(head, jnp.asarray(targets).reshape(-1), axis=1)           # [d, N]
    z_t = jnp.einsum("nd,dn->n", rows, cols, preferred_element_type=jnp.float32)
    logp = (z_t - stats.lse).reshape(m, r)
    mask = jnp.asarray(mask, bool)
    adv_tok = jnp.where(mask, jnp.asarray(adv, jnp.float32)[:, None], 0.0)
    pg, pg_met = losses.ppo_loss(jnp.where(mask, logp, 0.0), old_logp, None, adv_tok, mask,
                                 clip_eps=clip_eps, dual_clip=dual_clip, kl_coef=0.0,
                                 entropy=None, entropy_coef=0.0)
    kl = kl_from_stats(stats, jnp.asarray(teacher_ids).reshape(m * r, -1),
                       jnp.asarray(teacher_logprobs).reshape(m * r, -1), vocab,
                       DEFAULT_FLOOR_MIN, tail).reshape(m, r)
    w_tok = jnp.broadcast_to(jnp.asarray(weights, jnp.float32)[:, None], (m, r))
    dmask = jnp.asarray(distill_mask, bool)
    dl, dmet = weighted_kl_loss(jnp.where(dmask, kl, 0.0), w_tok, dmask)
    met = {"loss/pg": pg_met["loss/pg"], "lvopd/loss": dl, "lvopd/kl_mean": dmet[
        "distill/kl_mean"], "lvopd/gate_mean": dmet["distill/weight_mean"],
        "lvopd/gated_token_fraction": dmet["distill/active_fraction"],
        "loss/lvopd_total": pg + coef * dl}
    return pg + coef * dl, met


def lvopd_objective(params, config: ModelConfig, tokens, valid, old_logp, adv, batch: dict,
                    *, coef: float = DEFAULT_DISTILL_COEF, clip_eps: float = 0.2,
                    dual_clip: float = 3.0, impl: str = "auto", tail: bool = False):
    """The whole LVOPD loss from ONE decoder forward and ONE streaming vocabulary pass:
    clipped surrogate on every response token + coef · gated distillation
    (``lvopd_loss_fused`` on the gathered response hidden states).

    Args: ``tokens``/``valid`` [M, S] (a ``TokenBatch``), ``old_logp`` [M, S] π_old
    log-probs aligned with the tokens, ``adv`` [M] per-unit advantages, ``batch`` the
    ``LVOPD_KEYS`` arrays plus ``lvopd/response``. Returns ``(loss, metrics)``.
    """
    pos = jnp.asarray(batch["lvopd/positions"])
    _, h_resp = _response_hidden(params, config, tokens, valid, pos)
    targets = jnp.take_along_axis(jnp.asarray(tokens), pos + 1, axis=1)
    old = jnp.take_along_axis(jnp.asarray(old_logp), pos + 1, axis=1)
    return lvopd_loss_fused(h_resp, lm_head_matrix(params, config), targets, old, adv,
                            batch["lvopd/weights"], batch["lvopd/response"],
                            batch["lvopd/teacher_ids"], batch["lvopd/teacher_logprobs"],
                            distill_mask=batch["lvopd/mask"], coef=coef, clip_eps=clip_eps,
                            dual_clip=dual_clip, impl=impl, tail=tail)


# ---- policy forms the term reads (a registry: policy.form -> DistillForm) ----------------
@dataclasses.dataclass(frozen=True)
class DistillForm:
    """How the ``lvopd`` term reads one policy form as (hidden states, LM head).

    ``student(policy, params, batch) -> (h_resp [M, R, d], head [d, V])``: the hidden states
    at the units' response positions and the output matrix; ``span(unit) -> (prompt length,
    response length)`` of a training unit; ``min_r``: smallest response bucket."""

    student: Callable
    span: Callable[[Any], tuple[int, int]]
    min_r: int = 8


def _gather(hidden, batch):
    return jnp.take_along_axis(hidden, jnp.asarray(batch["lvopd/positions"])[..., None],
                               axis=1)


def _generative_student(policy, params, batch):
    if "policy/hidden" in batch:  # the train step's one policy forward (jaxdm.rl.terms)
        h_resp = _gather(batch["policy/hidden"], batch)
    else:
        tb = batch["policy"]
        _, h_resp = _response_hidden(params, policy.config, tb.tokens, tb.valid,
                                     batch["lvopd/positions"])
    return h_resp, lm_head_matrix(params, policy.config)


def _symbolic_student(policy, params, batch):
    """The MLP as (last hidden layer + a constant 1, [W; b] / temperature): one "token" per
    unit, the output layer as the LM head (``SymbolicMLPPolicy.linear_head``)."""
    hidden = batch["policy/hidden"] if "policy/hidden" in batch else \
        policy.hidden_states(params, batch["policy"])                       # [M, 1, H]
    return _gather(policy.with_bias_input(hidden), batch), policy.linear_head(params)


# policy form -> how the lvopd term reads its student (errors name the term's config key).
DISTILL_FORMS: Registry[DistillForm] = Registry(
    "policy form for distillation", hint="the lvopd term needs the generative policy "
    "(policy.form 'generative') or the symbolic one (policy.kind 'symbolic_mlp')")
DISTILL_FORMS.register("generative", DistillForm(
    _generative_student, lambda u: (len(u["prompt"]), len(u["response"]))))
DISTILL_FORMS.register("symbolic", DistillForm(_symbolic_student, lambda u: (1, 1), min_r=1))
_FORM_FIELD = "algo.terms.lvopd"


def _lvopd_term(params, batch, aux):
    """Registered ``lvopd`` term: the gated distillation (the trainer's ``ppo`` term is the
    surrogate; the term's weight in ``algo.terms`` is the distillation coefficient)."""
    form = DISTILL_FORMS.get(getattr(aux.policy, "form", None), field=_FORM_FIELD)
    missing = [k for k in LVOPD_KEYS if k not in batch]
    if missing:
        raise ValueError(f"algo.terms.lvopd: the mini-batch lacks {missing}; the trainer must "
                         "add lvopd_unit_arrays(...) for the 'teacher_topk' signal")
    h_resp, head = form.student(aux.policy, params["policy"], batch)
    return _distill(h_resp, head, batch, impl="auto", tail=aux.loss.distill_tail,
                    gate_in_kernel=aux.loss.distill_gate_in_kernel)


register_loss_term("lvopd", _lvopd_term, needs=("teacher_topk",), reads_policy_hidden=True)


# ---- host-side arrays ----------------------------------------------------------------------
def unit_gate_weights(mode: str, adv: np.ndarray, mask: np.ndarray, unit_rows: np.ndarray,
                      unit_cols: np.ndarray, *, success: np.ndarray | None = None,
                      normalize: str = "std") -> np.ndarray:
    """[N] gate weight of every training unit, the gate computed over the whole [B, T] batch."""
    w = gate_weights(mode, adv, mask, success=success, normalize=normalize)
    return w[np.asarray(unit_rows), np.asarray(unit_cols)].astype(np.float32)


@dataclasses.dataclass(frozen=True)
class TeacherTopK:
    """The teacher's lists for one action's response tokens: ids/logprobs [r, K_T]."""

    ids: np.ndarray
    logprobs: np.ndarray

    def __post_init__(self):
        if self.ids.ndim != 2 or self.ids.shape != self.logprobs.shape:
            raise ValueError(f"TeacherTopK ids {self.ids.shape} and logprobs "
                             f"{self.logprobs.shape} must both be [r, K_T]")
        if not np.isfinite(self.logprobs).all():
            raise ValueError("TeacherTopK logprobs must be finite")


def _bucket(n: int, minimum: int = 8) -> int:
    n = max(int(n), minimum, 1)
    return 1 << (n - 1).bit_length()


def lvopd_unit_arrays(units: Sequence[Any], weights: Sequence[float],
                      teacher: Sequence[TeacherTopK | None], pad_to: int,
                      k_t: int = TEACHER_TOP_K, *, form: str = "generative"
                      ) -> dict[str, np.ndarray]:
    """The ``LVOPD_KEYS`` arrays of one mini-batch of units of a policy ``form``
    (``DISTILL_FORMS``: its unit spans; padding rows: zeros).

    ``teacher[i]`` None (failed teacher) gives unit i no distillation (mask False).
    """
    spec = DISTILL_FORMS.get(form, field=_FORM_FIELD)
    if not len(units) == len(weights) == len(teacher):
        raise ValueError(f"{len(units)} units, {len(weights)} weights, {len(teacher)} teacher "
                         "lists: one each")
    if pad_to < len(units):
        raise ValueError(f"pad_to={pad_to} < number of units {len(units)}")
    spans = [spec.span(u) for u in units]
    r = _bucket(max((n for _, n in spans), default=1), spec.min_r)
    pos = np.zeros((pad_to, r), np.int32)
    mask = np.zeros((pad_to, r), bool)
    response = np.zeros((pad_to, r), bool)
    ids = np.zeros((pad_to, r, k_t), np.int32)
    lps = np.full((pad_to, r, k_t), -math.log(k_t) - 1.0, np.float32)  # finite filler
    w = np.zeros((pad_to,), np.float32)
    for i, ((p, n), wi, tk) in enumerate(zip(spans, weights, teacher)):
        if p < 1:
            raise ValueError(f"unit {i}: empty prompt")
        pos[i, :n] = p - 1 + np.arange(n)
        response[i, :n] = True
        w[i] = wi
        if tk is None or n == 0:
            continue
        if tk.ids.shape != (n, k_t):
            raise ValueError(f"unit {i}: teacher lists {tk.ids.shape} != [response tokens "
                             f"{n}, K_T {k_t}]")
        ids[i, :n], lps[i, :n], mask[i, :n] = tk.ids, tk.logprobs, True
    if not np.isfinite(w).all():
        raise ValueError("lvopd weights must be finite")
    return {"lvopd/weights": w, "lvopd/positions": pos, "lvopd/mask": mask,
            "lvopd/response": response,
            "lvopd/teacher_ids": ids, "lvopd/teacher_logprobs": lps}


def gate_slots(weights: np.ndarray, mask: np.ndarray, minimum: int = 8) -> np.ndarray:
    """[C] bool, True on the first n: the compact buffer of a mini-batch's gated-on tokens
    (``weights`` [M] > 0 and ``mask`` [M, R]) for the gate inside the kernel. Its length C,
    the kernel's static capacity, is n rounded up to a power of two (at least ``minimum``, at
    most M·R), so a run compiles one train step per power of two."""
    on = (np.asarray(weights)[:, None] > 0) & np.asarray(mask, bool)
    n, rows = int(on.sum()), on.size
    cap = min(max(1 << max(n - 1, 0).bit_length(), minimum), rows)
    return np.arange(cap) < n


class LVOPDBatcher:
    """The trainer-side glue for one iteration: the gate over the WHOLE batch once, then the
    ``LVOPD_KEYS`` arrays of any mini-batch of unit indices.

    ``episodes``: the ``EpisodeBatch``; ``adv``: its [B, T] step advantages (the configured
    estimator's, LVRL by default); ``signal``: the iteration's ``teacher_topk`` signal;
    ``gate``: a ``jaxdm.rl.distill.GATES`` name (``lvopd``, ``pure``, ``trajectory``; the
    latter reads success = outcome > 0); ``form``: the policy's form (``DISTILL_FORMS``).
    """

    def __init__(self, episodes, adv: np.ndarray, signal: Signal, *, gate: str = "lvopd",
                 normalize: str = "std", form: str = "generative",
                 gate_in_kernel: bool = False):
        DISTILL_FORMS.validate(form, field=_FORM_FIELD)
        self.form = form
        self.gate_in_kernel = bool(gate_in_kernel)
        self.k_t = int(signal.arrays["ids"].shape[1])
        success = np.asarray(episodes.outcome) > 0
        self.weights = unit_gate_weights(gate, adv, episodes.mask, episodes.unit_rows,
                                         episodes.unit_cols, success=success,
                                         normalize=normalize)
        self.units = episodes.units
        self.teacher = unit_teacher_lists(signal)
        if len(self.teacher) != len(self.units):
            raise ValueError(f"teacher_topk signal has {len(self.teacher)} units, the batch "
                             f"{len(self.units)}")

    def arrays(self, idx: Sequence[int], pad_to: int) -> dict[str, np.ndarray]:
        """The lvopd term's arrays (LVOPD_KEYS) for the units ``idx`` of the iteration, padded to
        ``pad_to`` rows."""
        idx = [int(j) for j in idx]
        out = lvopd_unit_arrays([self.units[j] for j in idx], self.weights[idx],
                                [self.teacher[j] for j in idx], pad_to, self.k_t,
                                form=self.form)
        if self.gate_in_kernel:
            out["lvopd/gate_slots"] = gate_slots(out["lvopd/weights"], out["lvopd/mask"])
        return out


# ---- teachers ------------------------------------------------------------------------------
def pack_trajectory(units: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                    list[np.ndarray]]:
    """One row for a trajectory's actions: tokens [S], segment ids [S], positions [S]
    (restarting per action) and, per action, the row indices predicting its response tokens.
    """
    toks, segs, poss, reads = [], [], [], []
    off = 0
    for a, u in enumerate(units):
        p, r = list(u["prompt"]), list(u["response"])
        seq = p + r
        toks += seq
        segs += [a] * len(seq)
        poss += list(range(len(seq)))
        reads.append(off + len(p) - 1 + np.arange(len(r)))
        off += len(seq)
    return (np.asarray(toks, np.int32), np.asarray(segs, np.int32),
            np.asarray(poss, np.int32), reads)


@functools.partial(jax.jit, static_argnames=("config", "k", "chunk"))
def _topk_at(params, config, tokens, segments, positions, valid, read_idx, *, k, chunk=256):
    """Top-k (ids, log-probs) of the next-token distribution at ``read_idx`` [B, N]."""
    hidden = decoder.forward(params, config, tokens, positions, segment_ids=segments,
                             attn_mask=valid)
    h = jnp.take_along_axis(hidden, read_idx[..., None], axis=1)        # [B, N, d]
    b, n, d = h.shape
    flat = h.reshape(b * n, d)
    pad = (-flat.shape[0]) % chunk
    flat = jnp.pad(flat, ((0, pad), (0, 0))).reshape(-1, chunk, d)
    head = lm_head_matrix(params, config)

    def one(x):  # [chunk, d] -> top-k of log_softmax without keeping [T, V] beyond a chunk
        z = jnp.dot(x, head, preferred_element_type=jnp.float32)
        vals, idx = jax.lax.top_k(z, k)
        return idx.astype(jnp.int32), vals - jax.nn.logsumexp(z, axis=-1, keepdims=True)

    ids, lps = jax.lax.map(one, flat)
    ids = ids.reshape(-1, k)[:b * n].reshape(b, n, k)
    lps = lps.reshape(-1, k)[:b * n].reshape(b, n, k)
    return ids, lps


class LocalTeacher:
    """A local jaxdm decoder as the teacher: one packed pass per trajectory (``rows_per_call``
    trajectories per jitted call, shapes bucketed to powers of two)."""

    def __init__(self, params, config: ModelConfig, *, k: int = TEACHER_TOP_K,
                 rows_per_call: int = 4, vocab_size: int | None = None):
        if vocab_size is not None and vocab_size != config.vocab_size:
            raise ValueError(f"teacher vocabulary {config.vocab_size} != student vocabulary "
                             f"{vocab_size}: teacher and student must share the tokenizer")
        if not 1 <= k <= config.vocab_size:
            raise ValueError(f"k={k} must be in [1, V={config.vocab_size}]")
        self.params, self.config, self.k, self.rows = params, config, int(k), int(rows_per_call)

    def topk(self, trajectories: Sequence[Sequence[dict]]) -> list[list[TeacherTopK] | None]:
        """Per trajectory, per action, the teacher's lists for its response tokens."""
        out: list[list[TeacherTopK] | None] = []
        for s in range(0, len(trajectories), self.rows):
            chunk = trajectories[s:s + self.rows]
            packed = [pack_trajectory(units) for units in chunk]
            b = _bucket(len(chunk), 1)
            s_len = _bucket(max((len(p[0]) for p in packed), default=1), 16)
            n_read = _bucket(max((sum(len(r) for r in p[3]) for p in packed), default=1))
            tokens = np.zeros((b, s_len), np.int32)
            segs = np.full((b, s_len), -1, np.int32)
            poss = np.zeros((b, s_len), np.int32)
            valid = np.zeros((b, s_len), bool)
            read = np.zeros((b, n_read), np.int32)
            for i, (t, sg, ps, rd) in enumerate(packed):
                tokens[i, :len(t)], segs[i, :len(t)], poss[i, :len(t)] = t, sg, ps
                valid[i, :len(t)] = True
                cat = np.concatenate(rd) if rd else np.zeros(0, np.int32)
                read[i, :len(cat)] = cat
            ids, lps = _topk_at(self.params, self.config, tokens, segs, poss, valid, read,
                                k=self.k)
            ids, lps = np.asarray(ids), np.asarray(lps)
            for i, (_, _, _, rd) in enumerate(packed):
                lists, o = [], 0
                for r in rd:
                    lists.append(TeacherTopK(ids[i, o:o + len(r)], lps[i, o:o + len(r)]))
                    o += len(r)
                out.append(lists)
        return out

    def topk_one_per_action(self, trajectories: Sequence[Sequence[dict]]
                            ) -> list[list[TeacherTopK]]:
        """The same lists with one forward per action (the benchmark's baseline)."""
        out = []
        for units in trajectories:
            lists = []
            for u in units:
                seq = list(u["prompt"]) + list(u["response"])
                s_len = _bucket(len(seq), 16)
                n_read = _bucket(len(u["response"]))
                tokens = np.zeros((1, s_len), np.int32)
                tokens[0, :len(seq)] = seq
                valid = np.zeros((1, s_len), bool)
                valid[0, :len(seq)] = True
                read = np.zeros((1, n_read), np.int32)
                r = len(u["response"])
                read[0, :r] = len(u["prompt"]) - 1 + np.arange(r)
                ids, lps = _topk_at(self.params, self.config, tokens,
                                    np.zeros((1, s_len), np.int32),
                                    np.broadcast_to(np.arange(s_len), (1, s_len)).astype(np.int32),
                                    valid, read, k=self.k)
                lists.append(TeacherTopK(np.asarray(ids)[0, :r], np.asarray(lps)[0, :r]))
            out.append(lists)
        return out


class RemoteTeacher:
    """An OpenAI-compatible server as the teacher (``/v1/completions``, vLLM-style).

    One request per action: ``prompt`` = the token ids of prompt + response, ``echo: true``,
    ``max_tokens: 1``, ``logprobs: K_T``, ``return_tokens_as_token_ids: true`` (keys of
    ``top_logprobs`` are ``"token_id:<id>"``). The server must allow K_T log-probs (vLLM:
    ``--max-logprobs 32``). Any failure (HTTP, missing or short lists, unparsable keys,
    non-finite values) fails the whole trajectory, counted; it gets no distillation.
    """

    def __init__(self, base_url: str, model: str, *, k: int = TEACHER_TOP_K,
                 timeout: float = 30.0, max_retries: int = 2, api_key_env: str | None = None):
        self.remote = Remote(base_url, model, endpoint="completions", timeout=timeout,
                             max_retries=max_retries, api_key_env=api_key_env)
        self.model, self.k = model, int(k)
        self.requests = self.failures = 0
        self.last_error: str | None = None

    def _one(self, u: dict) -> TeacherTopK:
        prompt, resp = list(u["prompt"]), list(u["response"])
        body = {"model": self.model, "prompt": prompt + resp, "echo": True, "max_tokens": 1,
                "logprobs": self.k, "temperature": 0.0, "return_tokens_as_token_ids": True}
        data = self.remote.post_json("/v1/completions", body)
        try:
            top = data["choices"][0]["logprobs"]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("reply has no choices[0].logprobs.top_logprobs") from None
        n_seq = len(prompt) + len(resp)
        if not isinstance(top, list) or len(top) < n_seq:
            raise ValueError(f"top_logprobs has {len(top) if isinstance(top, list) else '?'} "
                             f"entries for {n_seq} prompt tokens")
        ids = np.zeros((len(resp), self.k), np.int32)
        lps = np.zeros((len(resp), self.k), np.float32)
        for j in range(len(resp)):
            entry = top[len(prompt) + j]
            got = len(entry) if isinstance(entry, dict) else 0
            if got < self.k:
                raise ValueError(f"response token {j}: {got} top log-probs, need {self.k}")
            pairs = sorted(((float(v), k) for k, v in entry.items()), reverse=True)[:self.k]
            for c, (v, key) in enumerate(pairs):
                if not (isinstance(key, str) and key.startswith("token_id:")):
                    raise ValueError(f"top_logprobs key {key!r} is not 'token_id:<id>' (set "
                                     "return_tokens_as_token_ids)")
                ids[j, c], lps[j, c] = int(key.split(":", 1)[1]), v
        return TeacherTopK(ids, lps)

    def topk(self, trajectories: Sequence[Sequence[dict]]) -> list[list[TeacherTopK] | None]:
        """For each trajectory's units the teacher's top-k (ids, log-probs) at every response token,
        from one echo completion request per unit to the remote server; a trajectory whose request
        fails gets None and is counted (failures, last_error)."""
        out: list[list[TeacherTopK] | None] = []
        for units in trajectories:
            self.requests += 1
            try:
                out.append([self._one(u) for u in units])
            except Exception as e:  # noqa: BLE001 - any failure is a counted missing teacher
                self.failures += 1
                self.last_error = f"{type(e).__name__}: {e}"
                out.append(None)
        return out


def teacher_topk_signal(episodes, teacher) -> Signal:
    """The ``teacher_topk`` signal of an ``EpisodeBatch``: arrays ``ids``/``logprobs``
    [N_tokens, K_T] (every unit's response tokens in unit order), ``offsets`` [N_units + 1],
    ``unit_ok`` [N_units]; mask [B] (trajectory's teacher lists exist)."""
    b = len(episodes.episodes)
    per_row: list[list[int]] = [[] for _ in range(b)]
    for j, r in enumerate(np.asarray(episodes.unit_rows)):
        per_row[int(r)].append(j)
    rows = [i for i in range(b) if per_row[i]]
    t0 = time.perf_counter()
    fails0 = getattr(teacher, "failures", 0)
    lists = teacher.topk([[episodes.units[j] for j in per_row[i]] for i in rows])
    n_units = len(episodes.units)
    unit_lists: list[TeacherTopK | None] = [None] * n_units
    mask = np.zeros((b,), bool)
    for i, ls in zip(rows, lists):
        if ls is None:
            continue
        mask[i] = True
        for j, tk in zip(per_row[i], ls):
            unit_lists[j] = tk
    k_t = getattr(teacher, "k", TEACHER_TOP_K)
    offsets = np.zeros((n_units + 1,), np.int64)
    for j, u in enumerate(episodes.units):
        offsets[j + 1] = offsets[j] + len(u["response"])
    ids = np.zeros((int(offsets[-1]), k_t), np.int32)
    lps = np.zeros((int(offsets[-1]), k_t), np.float32)
    ok = np.zeros((n_units,), bool)
    for j, tk in enumerate(unit_lists):
        if tk is not None:
            ids[offsets[j]:offsets[j + 1]], lps[offsets[j]:offsets[j + 1]] = tk.ids, tk.logprobs
            ok[j] = True
    stats = {"teacher_topk/requests": float(len(rows)),
             "teacher_topk/failures": float(getattr(teacher, "failures", 0) - fails0),
             "teacher_topk/tokens": float(offsets[-1]),
             "teacher_topk/seconds": time.perf_counter() - t0}
    return Signal({"ids": ids, "logprobs": lps, "offsets": offsets, "unit_ok": ok}, mask, stats)


def unit_teacher_lists(signal: Signal) -> list[TeacherTopK | None]:
    """Per unit, its ``TeacherTopK`` from a ``teacher_topk`` signal (None where it failed)."""
    a = signal.arrays
    off = a["offsets"]
    return [TeacherTopK(a["ids"][off[j]:off[j + 1]], a["logprobs"][off[j]:off[j + 1]])
            if a["unit_ok"][j] else None for j in range(len(off) - 1)]


# ---- teacher policies (a registry: teacher.kind -> how the signal gets the teacher) -------
@dataclasses.dataclass(frozen=True)
class TeacherPolicy:
    """A ``teacher.kind`` the ``teacher_topk`` signal can use: ``build(cfg, trainer) ->
    backend`` once at start, ``produce(episodes, backend) -> Signal`` per iteration, and the
    ``policy.kind`` values it can teach."""

    build: Callable[[Any, Any], Any]
    produce: Callable[[Any, Any], Signal]
    policy_kinds: tuple[str, ...]
    reads_states: bool = False   # reads EpisodeBatch.recorded.states (the jax rollout records)


TEACHER_POLICIES: Registry[TeacherPolicy] = Registry("teacher policy")


def register_teacher_policy(kind: str, build: Callable, produce: Callable,
                            policy_kinds: tuple[str, ...], *, reads_states: bool = False
                            ) -> TeacherPolicy:
    """Register a teacher.kind: ``build(cfg, trainer)`` once at start, ``produce(episodes, backend)
    -> Signal`` per iteration, the policy kinds it can teach, and whether it reads the rollout's
    recorded env states; a kind registered twice is a ``jaxdm.registry.DuplicateNameError``."""
    return TEACHER_POLICIES.register(kind, TeacherPolicy(build, produce, tuple(policy_kinds),
                                                         bool(reads_states)))


def _build_remote(cfg, trainer):
    t = cfg.teacher
    return RemoteTeacher(t.base_url, t.model, timeout=t.timeout, api_key_env=t.api_key_env)


def _build_local(cfg, trainer):
    t = cfg.teacher
    if not t.path:
        raise ValueError("teacher.path: a local teacher policy needs a checkpoint folder")
    config = read_config(t.path)
    return LocalTeacher(load_params(t.path, config), config,
                        vocab_size=trainer.model_config.vocab_size)


def _build_privileged(cfg, trainer):
    return build_topk_teacher(cfg, trainer)


register_teacher_policy("remote", _build_remote, teacher_topk_signal, ("text",))
for _kind in ("local_readout", "local_likelihood"):
    register_teacher_policy(_kind, _build_local, teacher_topk_signal, ("text",))
# The privileged BabyAI teacher (jaxdm.rl.babyai_teacher): K_T = 6, every action's log-prob.
register_teacher_policy("babyai_privileged", _build_privileged,
                        lambda episodes, backend: backend.topk_signal(episodes),
                        ("symbolic_mlp",), reads_states=True)


def _check(cfg) -> None:
    tp = TEACHER_POLICIES.get(cfg.teacher.kind, field="teacher.kind")
    if cfg.policy.kind not in tp.policy_kinds:
        raise ValueError(f"teacher.kind: {cfg.teacher.kind!r} teaches policy.kind "
                         f"{list(tp.policy_kinds)}, not {cfg.policy.kind!r}")
    if cfg.policy.kind == "text" and cfg.policy.form not in DISTILL_FORMS:
        raise ValueError(f"policy.form: the lvopd term distills token distributions of the "
                         f"'generative' policy, not the {cfg.policy.form!r} form")


def _build(cfg, trainer):
    return TEACHER_POLICIES[cfg.teacher.kind].build(cfg, trainer)


def _produce(episodes, backend, cfg) -> Signal:
    return TEACHER_POLICIES[cfg.teacher.kind].produce(episodes, backend)


register_signal("teacher_topk", _produce, build=_build, check=_check)
