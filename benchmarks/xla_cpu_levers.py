"""XLA:CPU levers on the scoring workload (issue 17): flags, threads, precision, side by side.

Each lever is a set of environment variables (``XLA_FLAGS`` is read once, when the backend
starts, so every lever runs in its own process). A child loads SmolLM2-135M, compiles the
Hindsight+Progress judging of one ALFWorld-shaped trajectory (``LocalReadout``, packed layout),
then times it, and also times the bare [1300 x 576] @ [576 x 1536] matmul in fp32 and bf16
(fp32 accumulation). Children run in alternated rounds (lever A, B, ..., A, B, ...); medians.
torch's rate on the same matmul is measured in this process for the machine floor. The
compilation cache is off in the children (compile times are part of what a flag changes).

Baseline = the default settings (first lever); RESULT ratio > 1 = that lever is faster.

  python benchmarks/xla_cpu_levers.py --quick        # 1 round, 6-action trajectory
  python benchmarks/xla_cpu_levers.py --levers default,onednn --actions 30 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

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
}

CHILD = r"""
import json, statistics, sys, time
import numpy as np
t0 = time.perf_counter()
import jax, jax.numpy as jnp
from jaxdm import roles
from jaxdm.decision.local import LocalReadout
from jaxdm.decision.synthetic import alfworld_like_trajectory
from jaxdm.models import smollm2
n_act, reps, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pre = smollm2(getattr(jnp, dtype))
model = LocalReadout(pre, max_groups_per_call=1)
qs = roles.judge_requests(alfworld_like_trajectory(100, n_act), "progress", "hindsight")
t1 = time.perf_counter()
scores = [r.score for r in model.score(qs)]
first = time.perf_counter() - t1
times = []
for _ in range(reps):
    t1 = time.perf_counter()
    model.score(qs)
    times.append(time.perf_counter() - t1)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levers", default=",".join(LEVERS))
    parser.add_argument("--actions", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--reps", type=int, default=3, help="timed scoring runs per child")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
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
            env = {**os.environ, **extra, "JAXDM_COMPILATION_CACHE": "0"}
            cmd = [sys.executable, "-c", CHILD, str(n_act), str(args.reps), args.dtype]
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
            print(f"[{lever}] scoring {r['score_s']:.2f} s (first run with compile "
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


if __name__ == "__main__":
    main()
