"""XLA:CPU levers on the scoring workload (issue 17): flags, threads, precision, side by side.

Each lever is a set of environment variables (``XLA_FLAGS`` is read once, when the backend
starts, so every lever runs in its own process). A child loads SmolLM2-135M, compiles the
Hindsight+Progress judging of one ALFWorld-shaped trajectory (``LocalReadout``, packed layout)
and one Actor state with 8 options (``LocalLikelihood``), then times both, and also times the bare [1300 x 576] @ [576 x 1536] matmul in fp32 and bf16
(fp32 accumulation). Children run in alternated rounds (lever A, B, ..., A, B, ...); medians.
torch's rate on the same matmul is measured in this process for the machine floor. The
compilation cache is off in the children (compile times are part of what a flag changes).

Baseline = the default settings (first lever); RESULT ratio > 1 = that lever is faster.

``--matmul-layout`` (in this process, no flags): the projection layouts of one decoder layer
at the readout benchmark's shapes (``--tokens`` x 576, SmolLM2-135M: 9 query / 3 KV heads of
64, MLP 1,536), alternated and timed in one run: the einsums ``decoder._mm`` runs today
(``BSD,DNH->BSNH`` ...) vs plain 2-D dots on [tokens, D], separate q/k/v vs one fused
[576 x 960] projection and separate gate/up vs one fused [576 x 3,072] (with the weights
fused once, and fused by concatenating them inside the jitted call, which copies them every
call), the o / down projections as einsum vs 2-D, and torch's time on the same 2-D shapes.
Baseline = the einsum form; RESULT ratio > 1 = the other form is faster.

``--attention-layout`` (in this process): ``decoder.attend`` (one KV head at a time, its
query heads stacked as rows) vs the layout it replaced (all KV heads as a batch dimension of
the matmuls), at the packed readout's attention blocks. Baseline = the K-batched layout.

  python benchmarks/xla_cpu_levers.py --quick        # 1 round, 6-action trajectory
  python benchmarks/xla_cpu_levers.py --levers default,onednn --actions 30 --rounds 3
  python benchmarks/xla_cpu_levers.py --matmul-layout --quick   # projection layouts
  python benchmarks/xla_cpu_levers.py --attention-layout --dtype bfloat16   # attention layouts
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MM_2D = """
import math
from jaxdm.models import decoder
def _mm_2d(spec, x, w):
    n_in = sum(c in spec.split("->")[0].split(",")[1] for c in spec.split(",")[0])
    k = math.prod(x.shape[x.ndim - n_in:])
    y = jnp.dot(x.reshape(-1, k).astype(w.dtype), w.reshape(k, -1),
                preferred_element_type=jnp.float32)
    return y.reshape(x.shape[:x.ndim - n_in] + w.shape[n_in:])
decoder._mm = _mm_2d
"""

# name -> extra environment. Flags from this jaxlib's own flag list (XLA_FLAGS=--help).
LEVERS = {
    "default": {},
    "onednn": {"XLA_FLAGS": "--xla_cpu_use_onednn=true"},
    "onednn_custom_call": {"XLA_FLAGS": "--xla_cpu_experimental_onednn_custom_call=true"},
    "xnn_dot": {"XLA_FLAGS": "--xla_cpu_experimental_xnn_fusion_type=dot"},
    "ynn_dot": {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"},
    "onednn_dot": {"XLA_FLAGS": "--xla_cpu_experimental_onednn_fusion_type=dot"},
    "xnn_graph": {"XLA_FLAGS": "--xla_cpu_experimental_xnn_graph_fusion_mode="
                               "XNN_GRAPH_FUSION_MODE_GREEDY"},
    "no_xnnpack": {"XLA_FLAGS": "--xla_cpu_use_xnnpack=false"},
    "fast_math": {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"},
    "one_thread": {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false",
                   "NPROC": "1"},
    # Not a flag: the decoder's projections (``decoder._mm``, einsums such as
    # "BSNH,NHD->BSD") as plain 2-D dots on [tokens, in] views, patched into the child before
    # anything is traced (session 6: faster on the bare projections, not on the program).
    "mm_2d": {"PATCH": MM_2D},
}

CHILD = r"""
import json, statistics, sys, time
import numpy as np
t0 = time.perf_counter()
import jax, jax.numpy as jnp
from jaxdm import roles
from jaxdm.decision.local import LocalReadout
from jaxdm.decision.synthetic import alfworld_like_trajectory
from jaxdm.decision.local import LocalLikelihood
from jaxdm.decision.synthetic import admissible_actions
from jaxdm.models import smollm2
n_act, reps, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
exec(sys.argv[4])  # the lever's patch (may be empty)
pre = smollm2(getattr(jnp, dtype))
model = LocalReadout(pre, max_groups_per_call=1)
traj = alfworld_like_trajectory(100, n_act)
qs = roles.judge_requests(traj, "progress", "hindsight")
t1 = time.perf_counter()
scores = [r.score for r in model.score(qs)]
first = time.perf_counter() - t1
# the Actor workload of scoring_throughput.py --quick: one state, 8 options
likelihood = LocalLikelihood(pre, max_groups_per_call=1)
t = int(np.random.default_rng(0).integers(1, len(traj)))
actor = [roles.actor_request_at(traj, t, admissible_actions(traj, t, 8, seed=0))]
scores += list(likelihood.choose(actor)[0].probs)
times, actor_times = [], []
for _ in range(reps):
    t1 = time.perf_counter()
    model.score(qs)
    times.append(time.perf_counter() - t1)
    t1 = time.perf_counter()
    likelihood.choose(actor)
    actor_times.append(time.perf_counter() - t1)

def rate(dt):
    a = jnp.asarray(np.random.default_rng(0).standard_normal((1300, 576)), dt)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((576, 1536)), dt)
    f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        ts.append(time.perf_counter() - t)
    return 2 * 1300 * 576 * 1536 / statistics.median(ts) / 1e9

print("LEVER " + json.dumps({"score_s": statistics.median(times), "first_s": first,
      "actor_s": statistics.median(actor_times),
      "mm_f32": rate(jnp.float32), "mm_bf16": rate(jnp.bfloat16), "scores": scores,
      "total_s": time.perf_counter() - t0}))
"""


def torch_rates() -> dict:
    import time

    import torch
    out = {}
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(1300, 576, dtype=dt), torch.randn(576, 1536, dtype=dt)
        for _ in range(2):
            a @ b
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            a @ b
            ts.append(time.perf_counter() - t)
        out[name] = 2 * 1300 * 576 * 1536 / statistics.median(ts) / 1e9
    return out


def _median_ms(fn, args, repeats: int) -> float:
    import time
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args)
        if hasattr(out, "block_until_ready"):
            out.block_until_ready()
        elif isinstance(out, (tuple, list)) and hasattr(out[0], "block_until_ready"):
            [o.block_until_ready() for o in out]
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def layout_forms(tokens: int, dtype: str):
    """name -> (jitted fn, args, FLOPs) of one layer's projections in each layout; forms of
    one group compute the same numbers (checked by ``matmul_layout``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    d, n, kh, hd, f = 576, 9, 3, 64, 1536
    rng = np.random.default_rng(0)
    dt = getattr(jnp, dtype)

    def arr(*shape):
        return jnp.asarray(0.05 * rng.standard_normal(shape), dt)

    x3 = arr(1, tokens, d)
    x2 = x3.reshape(tokens, d)
    wq, wk, wv = arr(d, n, hd), arr(d, kh, hd), arr(d, kh, hd)
    wo, wg, wu, wd = arr(n, hd, d), arr(d, f), arr(d, f), arr(f, d)
    a3 = arr(1, tokens, n, hd)
    h3 = arr(1, tokens, f)
    wqkv = jnp.concatenate([wq.reshape(d, -1), wk.reshape(d, -1), wv.reshape(d, -1)], 1)
    wgu = jnp.concatenate([wg, wu], 1)

    def mm(spec, x, w):   # decoder._mm
        return jnp.einsum(spec, x.astype(w.dtype), w, preferred_element_type=jnp.float32)

    def dot(x, w):
        return jnp.dot(x, w, preferred_element_type=jnp.float32)

    qkv_flops = 2 * tokens * d * (n + 2 * kh) * hd
    mlp_flops = 2 * tokens * d * 2 * f
    forms = {
        "qkv": {
            "einsum": (lambda x, q, k, v: (mm("BSD,DNH->BSNH", x, q), mm("BSD,DKH->BSKH", x, k),
                                           mm("BSD,DKH->BSKH", x, v)), (x3, wq, wk, wv)),
            "2d": (lambda x, q, k, v: (dot(x, q.reshape(d, -1)), dot(x, k.reshape(d, -1)),
                                       dot(x, v.reshape(d, -1))), (x2, wq, wk, wv)),
            "fused": (lambda x, w: jnp.split(dot(x, w), [n * hd, (n + kh) * hd], 1),
                      (x2, wqkv)),
            "fused_concat": (lambda x, q, k, v: jnp.split(dot(x, jnp.concatenate(
                [q.reshape(d, -1), k.reshape(d, -1), v.reshape(d, -1)], 1)),
                [n * hd, (n + kh) * hd], 1), (x2, wq, wk, wv)),
            "_flops": qkv_flops},
        "gate_up": {
            "einsum": (lambda x, g, u: (mm("BSD,DF->BSF", x, g), mm("BSD,DF->BSF", x, u)),
                       (x3, wg, wu)),
            "2d": (lambda x, g, u: (dot(x, g), dot(x, u)), (x2, wg, wu)),
            "fused": (lambda x, w: jnp.split(dot(x, w), 2, 1), (x2, wgu)),
            "fused_concat": (lambda x, g, u: jnp.split(dot(x, jnp.concatenate([g, u], 1)), 2, 1),
                             (x2, wg, wu)),
            "_flops": mlp_flops},
        "o": {
            "einsum": (lambda a, w: mm("BSNH,NHD->BSD", a, w), (a3, wo)),
            "2d": (lambda a, w: dot(a.reshape(tokens, n * hd), w.reshape(n * hd, d)), (a3, wo)),
            "_flops": 2 * tokens * n * hd * d},
        "down": {
            "einsum": (lambda h, w: mm("BSF,FD->BSD", h, w), (h3, wd)),
            "2d": (lambda h, w: dot(h.reshape(tokens, f), w), (h3, wd)),
            "_flops": 2 * tokens * f * d},
    }
    out = {}
    for group, fs in forms.items():
        flops = fs.pop("_flops")
        for name, (fn, args) in fs.items():
            out[(group, name)] = (jax.jit(fn), args, flops)
    return out


def torch_layout_ms(tokens: int, dtype: str, repeats: int) -> dict:
    """torch's time on the 2-D and fused shapes (its current thread setting)."""
    import torch
    dt = getattr(torch, dtype)
    d, f = 576, 1536
    x, h = torch.randn(tokens, d, dtype=dt), torch.randn(tokens, f, dtype=dt)
    w = {k: torch.randn(*s, dtype=dt) for k, s in
         (("q", (d, 576)), ("k", (d, 192)), ("v", (d, 192)), ("qkv", (d, 960)), ("o", (576, d)),
          ("g", (d, f)), ("u", (d, f)), ("gu", (d, 2 * f)), ("d", (f, d)))}
    fns = {("qkv", "2d"): lambda: (x @ w["q"], x @ w["k"], x @ w["v"]),
           ("qkv", "fused"): lambda: x @ w["qkv"],
           ("gate_up", "2d"): lambda: (x @ w["g"], x @ w["u"]),
           ("gate_up", "fused"): lambda: x @ w["gu"],
           ("o", "2d"): lambda: x @ w["o"], ("down", "2d"): lambda: h @ w["d"]}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        return {k: _median_ms(fn, (), repeats) for k, fn in fns.items()}


def matmul_layout(args) -> None:
    import numpy as np
    tokens, repeats = args.tokens, 5 if args.quick else 9
    rounds = args.rounds or (2 if args.quick else 5)
    forms = layout_forms(tokens, args.dtype)
    outs = {}
    for key, (fn, a, _) in forms.items():
        r = fn(*a)
        outs[key] = np.concatenate([np.asarray(x, np.float32).reshape(tokens, -1) for x in
                                    (r if isinstance(r, (tuple, list)) else [r])], 1)
    for (group, name), o in outs.items():
        diff = float(np.max(np.abs(o - outs[(group, "einsum")])))
        if diff > 1e-3:
            raise SystemExit(f"{group}/{name} differs from the einsum form by {diff}")
    times = {k: [] for k in forms}
    torch_times = []
    for _ in range(rounds):
        for key, (fn, a, _) in forms.items():
            times[key].append(_median_ms(fn, a, repeats))
        torch_times.append(torch_layout_ms(tokens, args.dtype, repeats))
    import torch
    print(f"projection layouts, {tokens} tokens x 576, {args.dtype}, {rounds} alternated "
          f"rounds x {repeats} calls (ms, median; GFLOP/s); torch {torch.get_num_threads()} "
          f"threads")
    for (group, name), ts in times.items():
        ms = statistics.median(ts)
        flops = forms[(group, name)][2]
        tt = [t[(group, name)] for t in torch_times if (group, name) in t]
        ref = f"; torch {statistics.median(tt):.2f} ms" if tt else ""
        print(f"  {group:8s} {name:13s} {ms:7.2f} ms {flops / ms / 1e6:6.1f} GFLOP/s "
              f"{[round(x, 2) for x in ts]}{ref}")
    for (group, name), ts in times.items():
        if name == "einsum":
            continue
        base = statistics.median(times[(group, "einsum")])
        ms = statistics.median(ts)
        print(f"RESULT layout_{group}_{name}_{args.dtype}: baseline {base:.2f} ms, jaxdm "
              f"{ms:.2f} ms, ratio {base / ms:.2f}x")


def kv_batched_attend(q, sources):
    """The attention layout ``decoder.attend`` used before session 7, kept here as the
    baseline of ``--attention-layout``: all KV heads at once, the K axis a batch dimension of
    both matmuls ([K, B, G*S, H] queries against [K, B, T, H] keys)."""
    import functools
    import math

    import jax
    import jax.numpy as jnp
    from jaxdm.models import decoder
    b, s, kh, g, hd = q.shape
    qq = jnp.transpose(q * (1.0 / math.sqrt(hd)), (2, 0, 3, 1, 4)).reshape(kh, b, g * s, hd)
    scored = []
    for k, v, mask in sources:
        kk, vv = jnp.transpose(k, (2, 0, 1, 3)), jnp.transpose(v, (2, 0, 1, 3))
        logits = jnp.einsum("KBQH,KBTH->KBQT", qq, kk, preferred_element_type=jnp.float32)
        bias = jnp.where(mask, 0.0, decoder.MASK_VALUE).astype(jnp.float32)[None, :, None]
        scored.append((logits.reshape(kh, b, g, s, -1) + bias, vv))
    top = jax.lax.stop_gradient(
        functools.reduce(jnp.maximum, [lg.max(-1, keepdims=True) for lg, _ in scored]))
    out, denom = None, None
    for logits, vv in scored:
        p = jnp.exp(logits - top)
        part = jnp.einsum("KBQT,KBTH->KBQH", p.reshape(kh, b, g * s, -1).astype(vv.dtype), vv,
                          preferred_element_type=jnp.float32)
        out = part if out is None else out + part
        total = p.sum(-1, keepdims=True)
        denom = total if denom is None else denom + total
    out = (out.reshape(kh, b, g, s, hd) / denom).astype(q.dtype)
    return jnp.transpose(out, (1, 3, 0, 2, 4)).reshape(b, s, kh * g, hd)


def attention_layout(args) -> None:
    """``decoder.attend`` (one KV head at a time) vs the K-batched layout it replaced, at the
    packed readout's block shapes: a 256-query block of SmolLM2-135M (3 KV heads x 3 query
    heads of 64) against 256 .. 1,920 causal keys, one row; alternated rounds."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jaxdm.models import decoder
    repeats = 5 if args.quick else 15
    rounds = args.rounds or (2 if args.quick else 5)
    keys = (256, 1920) if args.quick else (256, 768, 1280, 1920)
    s, dt = 256, getattr(jnp, args.dtype)
    forms = {"kv_batched": jax.jit(kv_batched_attend), "per_kv_head": jax.jit(decoder.attend)}
    cases = {}
    for t in keys:
        ks = jax.random.split(jax.random.PRNGKey(t), 3)
        q = jax.random.normal(ks[0], (1, s, 3, 3, 64), dt)
        k = jax.random.normal(ks[1], (1, t, 3, 64), dt)
        v = jax.random.normal(ks[2], (1, t, 3, 64), dt)
        mask = jnp.arange(t)[None, None] <= (t - s + jnp.arange(s))[None, :, None]
        cases[t] = ([(k, v, mask)], q)
        outs = [np.asarray(f(q, [(k, v, mask)]), np.float32) for f in forms.values()]
        diff = float(np.max(np.abs(outs[0] - outs[1])))
        if diff > (1e-5 if args.dtype == "float32" else 2e-2):
            raise SystemExit(f"T={t}: the layouts differ by {diff}")
    times = {(t, f): [] for t in keys for f in forms}
    for _ in range(rounds):
        for t, (sources, q) in cases.items():
            for name, fn in forms.items():
                times[(t, name)].append(_median_ms(fn, (q, sources), repeats))
    print(f"attention layouts, {s} queries x 9 heads of 64 vs T causal keys, {args.dtype}, "
          f"{rounds} alternated rounds x {repeats} calls (ms, median; GFLOP/s of QK + PV)")
    for t in keys:
        flops = 4 * 9 * s * t * 64
        base = statistics.median(times[(t, "kv_batched")])
        ours = statistics.median(times[(t, "per_kv_head")])
        print(f"  T={t:5d} kv_batched {base:7.2f} ms {flops / base / 1e6:6.1f} GFLOP/s   "
              f"per_kv_head {ours:7.2f} ms {flops / ours / 1e6:6.1f} GFLOP/s")
        print(f"RESULT attention_T{t}_{args.dtype}: baseline {base:.2f} ms, jaxdm {ours:.2f} "
              f"ms, ratio {base / ours:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levers", default=",".join(LEVERS))
    parser.add_argument("--actions", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--reps", type=int, default=3, help="timed scoring runs per child")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--matmul-layout", action="store_true",
                        help="time projection layouts in this process instead of flag levers")
    parser.add_argument("--attention-layout", action="store_true",
                        help="time decoder.attend vs the K-batched attention layout")
    parser.add_argument("--tokens", type=int, default=1300,
                        help="--matmul-layout: tokens per projection")
    args = parser.parse_args()
    if args.matmul_layout:
        return matmul_layout(args)
    if args.attention_layout:
        return attention_layout(args)
    levers = [x for x in args.levers.split(",") if x]
    unknown = [x for x in levers if x not in LEVERS]
    if unknown:
        raise SystemExit(f"unknown levers {unknown}; known: {list(LEVERS)}")
    n_act = args.actions or (6 if args.quick else 30)
    rounds = args.rounds or (1 if args.quick else 2)
    res = {x: [] for x in levers}
    for _ in range(rounds):
        for lever in levers:
            extra = dict(LEVERS[lever])
            nproc = extra.pop("NPROC", None)
            patch = extra.pop("PATCH", "")
            env = {**os.environ, **extra, "JAXDM_COMPILATION_CACHE": "0"}
            cmd = [sys.executable, "-c", CHILD, str(n_act), str(args.reps), args.dtype, patch]
            if nproc:
                cmd = ["taskset", "-c", "0"] + cmd
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("LEVER ")]
            if out.returncode or not line:
                print(f"[{lever}] failed ({out.returncode}): {out.stderr.strip()[-400:]}",
                      flush=True)
                continue
            r = json.loads(line[-1][len("LEVER "):])
            res[lever].append(r)
            print(f"[{lever}] scoring {r['score_s']:.2f} s, Actor {r['actor_s']:.2f} s "
                  f"(first readout run with compile "
                  f"{r['first_s']:.1f} s); matmul f32 {r['mm_f32']:.1f} / bf16 "
                  f"{r['mm_bf16']:.1f} GFLOP/s", flush=True)
    torch_r = torch_rates()
    print(f"torch matmul (this process, {__import__('torch').get_num_threads()} threads): "
          f"f32 {torch_r['f32']:.1f} / bf16 {torch_r['bf16']:.1f} GFLOP/s")
    base = levers[0]
    if not res[base]:
        raise SystemExit(f"baseline lever {base!r} failed")
    b_s = statistics.median(r["score_s"] for r in res[base])
    ref = res[base][0]["scores"]
    for lever in levers[1:]:
        if not res[lever]:
            continue
        s = statistics.median(r["score_s"] for r in res[lever])
        diff = max(abs(a - b) for a, b in zip(ref, res[lever][0]["scores"]))
        print(f"  {lever}: max |score - default| {diff:.1e}; matmul f32 "
              f"{statistics.median(r['mm_f32'] for r in res[lever]):.1f}, bf16 "
              f"{statistics.median(r['mm_bf16'] for r in res[lever]):.1f} GFLOP/s")
        print(f"RESULT lever_{lever}_{args.dtype}: baseline {1 / b_s:.3f} runs/s, jaxdm "
              f"{1 / s:.3f} runs/s, ratio {b_s / s:.2f}x")
        b_a = statistics.median(r["actor_s"] for r in res[base])
        a = statistics.median(r["actor_s"] for r in res[lever])
        print(f"RESULT lever_{lever}_actor_{args.dtype}: baseline {1 / b_a:.3f} runs/s, jaxdm "
              f"{1 / a:.3f} runs/s, ratio {b_a / a:.2f}x")


if __name__ == "__main__":
    main()
