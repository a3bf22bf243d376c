"""LVOPD speed and memory: teacher top-32 signal, the lvopd loss + gradient, MC continuations.

1. ``lvopd_teacher_topk``: the teacher's top-32 lists for every response token of a batch of
   trajectories (8 actions each), from a random decoder: one packed pass per trajectory
   (``LocalTeacher.topk``: all actions as segments of one row) vs one forward per action
   (``topk_one_per_action``). Tokens per second, compile excluded (a warm-up call first).
2. ``lvopd_loss_peak_bf16``: peak memory of value_and_grad of the LVOPD loss head of the
   train step (clipped surrogate on log π of every token + gated top-16/top-32 reverse KL)
   w.r.t. the final hidden states [T, d] and the LM head [d, V] at Qwen2.5-1.5B shapes
   (V = 151,936, d = 1,536, T = 8,192 tokens as 8 rows of 1,024, bf16), from XLA's compiled
   memory analysis (compile only: nothing is allocated). jaxdm: ``lvopd_loss_fused`` (one
   streaming pass over the vocabulary gives log π(target) and the top-k KL); also the
   two-pass form (``lvopd_loss_from_hidden``: chunked log-probs, then the fused KL kernel,
   ``..._two_pass``); baseline: the naive form
   (logits = hidden @ W materialised in float32, full log-softmax for both the surrogate and
   the KL). The decoder layers below the final norm are the same in both and not included.
3. ``lvopd_mc_continuations``: Monte-Carlo continuations per second on the JAX BabyAI env:
   all (state, continuation) pairs vmapped in one jitted while-loop vs one continuation at a
   time (a jitted policy + env step per action, stepped from the host).

    python benchmarks/lvopd_bench.py --quick     # < 60 s on 2 cores (machine loaded: "loaded")
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

VOCAB, DIM, ROWS, SEQ = 151_936, 1_536, 8, 1_024


def _fmt(v: float) -> str:
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.4g}"


def _result(name, base, ours, unit, lower_is_better=False):
    ratio = base / ours if lower_is_better else ours / base
    return f"RESULT {name}: baseline {_fmt(base)} {unit}, jaxdm {_fmt(ours)} {unit}, " \
           f"ratio {ratio:.2f}x"


def bench_teacher(quick: bool) -> str:
    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig
    from jaxdm.rl.lvopd import LocalTeacher

    config = ModelConfig(vocab_size=8192, hidden_size=128, intermediate_size=256,
                         num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32)
    params = decoder.init_params(config, jax.random.key(0))
    rng = np.random.default_rng(0)
    n_traj = 4 if quick else 16
    trajs = [[{"prompt": rng.integers(1, 8192, size=96).tolist(),
               "response": rng.integers(1, 8192, size=16).tolist()} for _ in range(8)]
             for _ in range(n_traj)]
    teacher = LocalTeacher(params, config, rows_per_call=4)
    tokens = sum(len(u["response"]) for t in trajs for u in t)
    teacher.topk(trajs[:4])
    teacher.topk_one_per_action(trajs[:1])           # compile both shapes first
    t0 = time.perf_counter()
    teacher.topk(trajs)
    packed = time.perf_counter() - t0
    t0 = time.perf_counter()
    teacher.topk_one_per_action(trajs)
    single = time.perf_counter() - t0
    return _result("lvopd_teacher_topk (loaded)", tokens / single, tokens / packed, "tokens/s")


def bench_memory() -> str:
    from jaxdm.rl.lvopd import (STUDENT_TOP_K, TEACHER_TOP_K, gate_slots,
                                 lvopd_loss_from_hidden, lvopd_loss_fused)
    from jaxdm.kernels import plain_topk_reverse_kl
    from jaxdm.models import decoder
    from jaxdm.models.config import ModelConfig

    config = ModelConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=8960,
                         num_layers=1, num_heads=12, num_kv_heads=2, head_dim=128)
    positions = jnp.broadcast_to(jnp.arange(SEQ - 1), (ROWS, SEQ - 1))
    kt = TEACHER_TOP_K

    def common(hidden):
        m = jnp.ones((ROWS, SEQ), bool).at[:, 0].set(False)
        return m, jnp.zeros((ROWS, SEQ), jnp.float32), jnp.linspace(-1, 1, ROWS)

    def ours(hidden, head, ids, lps, targets):
        mask, old, adv = common(hidden)
        return lvopd_loss_fused(hidden[:, :-1], head, targets[:, 1:], old[:, 1:], adv,
                                jnp.ones((ROWS,)), mask[:, 1:], ids, lps, impl="xla")[0]

    def two_pass(hidden, head, ids, lps, targets, weights=None):
        mask, old, adv = common(hidden)
        lp = jnp.pad(decoder.token_logprobs({"lm_head": head}, config, hidden[:, :-1],
                                            targets[:, 1:]), ((0, 0), (1, 0)))
        batch = {"lvopd/weights": jnp.ones((ROWS,)) if weights is None else weights,
                 "lvopd/positions": positions,
                 "lvopd/mask": jnp.ones((ROWS, SEQ - 1), bool), "lvopd/teacher_ids": ids,
                 "lvopd/teacher_logprobs": lps}
        if weights is not None:  # the host's capacity, as LVOPDBatcher gives it
            batch["lvopd/gate_slots"] = gate_slots(quarter, np.ones((ROWS, SEQ - 1), bool))
        return lvopd_loss_from_hidden(lp, old, adv, mask, hidden[:, :-1], head, batch,
                                      impl="xla", gate_in_kernel=weights is not None)[0]

    # the LVOPD gate on a quarter of the rows (its measured share > 0 on BabyAI: 0.24), as a
    # multiplier on the per-token KL vs inside the kernel (algo.lvopd_gate_in_kernel)
    quarter = np.array([1.0, 0.7] + [0.0] * (ROWS - 2), np.float32)

    def two_pass_weighted(hidden, head, ids, lps, targets):
        mask, old, adv = common(hidden)
        lp = jnp.pad(decoder.token_logprobs({"lm_head": head}, config, hidden[:, :-1],
                                            targets[:, 1:]), ((0, 0), (1, 0)))
        batch = {"lvopd/weights": jnp.asarray(quarter), "lvopd/positions": positions,
                 "lvopd/mask": jnp.ones((ROWS, SEQ - 1), bool), "lvopd/teacher_ids": ids,
                 "lvopd/teacher_logprobs": lps}
        return lvopd_loss_from_hidden(lp, old, adv, mask, hidden[:, :-1], head, batch,
                                      impl="xla")[0]

    def two_pass_gated(hidden, head, ids, lps, targets):
        return two_pass(hidden, head, ids, lps, targets, jnp.asarray(quarter))

    def naive(hidden, head, ids, lps, targets):
        mask, old, adv = common(hidden)
        logits = jnp.einsum("bsd,dv->bsv", hidden[:, :-1], head,
                            preferred_element_type=jnp.float32)
        logp_all = jax.nn.log_softmax(logits, -1)
        lp = jnp.take_along_axis(logp_all, targets[:, 1:, None], -1)[..., 0]
        lp = jnp.pad(lp, ((0, 0), (1, 0)))
        ratio = jnp.exp(lp - old)
        a = adv[:, None]
        pg = -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a)
        pg = jnp.sum(jnp.where(mask, pg, 0)) / jnp.sum(mask)
        kl = plain_topk_reverse_kl(logits.reshape(-1, VOCAB), ids.reshape(-1, kt),
                                   lps.reshape(-1, kt), STUDENT_TOP_K)
        return pg + jnp.mean(kl)

    shapes = (jax.ShapeDtypeStruct((ROWS, SEQ, DIM), jnp.bfloat16),
              jax.ShapeDtypeStruct((DIM, VOCAB), jnp.bfloat16),
              jax.ShapeDtypeStruct((ROWS, SEQ - 1, kt), jnp.int32),
              jax.ShapeDtypeStruct((ROWS, SEQ - 1, kt), jnp.float32),
              jax.ShapeDtypeStruct((ROWS, SEQ), jnp.int32))

    def peak(fn):
        a = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*shapes).compile() \
            .memory_analysis()
        return (a.argument_size_in_bytes + a.output_size_in_bytes + a.temp_size_in_bytes
                - a.alias_size_in_bytes) / 2**30

    base, two, one = peak(naive), peak(two_pass), peak(ours)
    weighted, gated = peak(two_pass_weighted), peak(two_pass_gated)
    return "\n".join([
        _result("lvopd_loss_peak_bf16_T8192", base, one, "GiB", lower_is_better=True),
        _result("lvopd_loss_peak_bf16_T8192_two_pass", base, two, "GiB",
                lower_is_better=True),
        _result("lvopd_loss_peak_bf16_T8192_gate_in_kernel", weighted, gated, "GiB",
                lower_is_better=True)])


def bench_mc(quick: bool) -> str:
    from jaxdm.envs.babyai import BabyAIEnv, BabyAIParams
    from jaxdm.rl import mc_validation as mc

    env = BabyAIEnv()
    params = BabyAIParams.for_split("train", max_steps=48)
    ep = mc.babyai_record_episodes(env, params, jax.random.key(0), 8, 0.5)
    n_states = 64 if quick else 512
    ii = np.arange(n_states) % 8
    tt = np.minimum(np.arange(n_states) // 8, ep.lengths[ii] - 1)
    states = jax.tree.map(lambda x: x[ii, tt], ep.states)
    keys = jax.random.split(jax.random.key(1), n_states)
    mc.babyai_continue(env, params, states, ep.fields[ii], keys, 0.5)   # compile
    t0 = time.perf_counter()
    jax.block_until_ready(mc.babyai_continue(env, params, states, ep.fields[ii], keys, 0.5)[0])
    vmapped = n_states / (time.perf_counter() - t0)
    n_single = 4 if quick else 16
    mc.babyai_continue_one_at_a_time(env, params, ep.state(0, 0), ep.fields[0], keys[0], 0.5)
    t0 = time.perf_counter()
    for j in range(n_single):
        mc.babyai_continue_one_at_a_time(env, params, ep.state(int(ii[j]), int(tt[j])),
                                         ep.fields[ii[j]], keys[j], 0.5)
    single = n_single / (time.perf_counter() - t0)
    return _result("lvopd_mc_continuations (loaded)", single, vmapped, "continuations/s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="teacher,memory,mc")
    args = p.parse_args(argv)
    runs = {"teacher": lambda: bench_teacher(args.quick), "memory": bench_memory,
            "mc": lambda: bench_mc(args.quick)}
    for name in args.only.split(","):
        print(runs[name](), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
