"""jaxdm's CPU kernels vs XLA (issue 17): the fused attention (``jaxdm.models.cpu.attention``)
and the matmul (``jaxdm.models.cpu.matmul``, bf16 and fp32), chosen by ``--kernel``.

Baseline = XLA's operations (``decoder.xla_attend``; ``cpu_matmul.reference``, XLA's dot);
jaxdm = the kernel. RESULT ratio > 1 = the kernel is faster.

- ``blocks`` (in this process, alternated calls, medians, max difference):
  attention: the packed readout's attention blocks of SmolLM2-135M (9 query / 3 KV heads of
  64): a causal trunk block (256 queries at the end of T keys) and a continuation block (256
  queries seeing all T context keys plus their own 30-token segment among 256 window keys),
  fp32 and bf16. matmul: SmolLM2-135M's projections at the readout's row count (q/o 576x576,
  k/v 576x192, gate/up 576x1536, down 1536x576), fp32 and bf16, with torch's matmul (oneDNN)
  beside them where the ``[ref]`` extra is installed.
- ``program`` (one process per variant, alternated rounds), s per batch, with the kernel off
  (its environment variable ``=0``, which also keys the stored programs apart) and on: the
  Hindsight+Progress readout of 2 ALFWorld-shaped trajectories (``LocalReadout``, packed),
  Actor option likelihood (4 states, 10-20 options, ``LocalLikelihood``), and greedy decoding
  (16 prompts x 32 tokens, ``generate``: one query per row and step).

  python benchmarks/cpu_kernels_bench.py --quick                      # attention blocks, < 60 s
  python benchmarks/cpu_kernels_bench.py --kernel matmul --quick      # matmul blocks
  python benchmarks/cpu_kernels_bench.py --kernel matmul --dtype bfloat16 --workloads readout
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = """
import json, statistics, sys, time
import numpy as np
import jax.numpy as jnp
from jaxdm import roles
from jaxdm.decision.local import LocalLikelihood, LocalReadout
from jaxdm.decision.synthetic import admissible_actions, alfworld_like_trajectory
from jaxdm.models import generate, smollm2
from jaxdm.models.cpu import build as cpu_build
work, dtype, n_act, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pre = smollm2(getattr(jnp, dtype))
trajs = [alfworld_like_trajectory(100 + i, n_act) for i in range(2)]
if work == "readout":  # Hindsight+Progress judging of 2 trajectories
    model = LocalReadout(pre)
    reqs = [r for tr in trajs for r in roles.judge_requests(tr, "progress", "hindsight")]
    run = lambda: [r.score for r in model.score(reqs)]
elif work == "actor":  # option likelihood, 4 states with 10-20 options
    model = LocalLikelihood(pre)
    rng = np.random.default_rng(0)
    reqs = []
    for s in range(4):
        tr = trajs[s % 2]
        t = int(rng.integers(1, len(tr)))
        reqs.append(roles.actor_request_at(
            tr, t, admissible_actions(tr, t, int(rng.integers(10, 21)), seed=s)))
    run = lambda: [float(p) for r in model.choose(reqs) for p in r.probs]
else:  # greedy decoding, 16 prompts x 32 new tokens
    tok = pre.tokenizer
    prompts = [list(tok(tok.apply_chat_template([{"role": "user", "content": f"Question {i}?"}],
                                              tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"]) for i in range(16)]
    run = lambda: np.asarray(generate(pre.params, pre.config, None, prompts, max_new_tokens=32,
                                      greedy=True, eos_ids=()).tokens).ravel().tolist()
scores = run()
times = []
for _ in range(calls):
    t0 = time.perf_counter(); run(); times.append(time.perf_counter() - t0)
print("CHILD " + json.dumps({"s": statistics.median(times), "scores": scores,
                             "kernels": cpu_build.fingerprint()}))
"""

ENV_VARS = {"attention": "JAXDM_CPU_ATTENTION", "matmul": "JAXDM_CPU_MATMUL"}


def alternated_ms(calls: list, repeats: int) -> list[float]:
    """Median ms of each call, the calls alternated ``repeats`` times after one untimed round
    (first calls allocate and wake threads). Only JAX calls alternate: torch's OpenMP threads
    spin a few ms after its calls and a JAX call started then ran up to 2x slower (XLA's bf16
    2,432 x 576 x 576 dot: 4.4 ms alone, 6.1-8.4 ms right after torch's; 2026-12-04), while a
    pause long enough for them to stop lets XLA's threads sleep and costs short calls their
    wake-up (300-row fp32 dot 1.2 -> 2.1 ms after 20 ms idle). Time torch with its own call."""
    times: list[list[float]] = [[] for _ in calls]
    for fn in calls:
        fn()
    for _ in range(repeats):
        for fn, ts in zip(calls, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) * 1e3 for ts in times]


def bench_attention_blocks(dtypes: list[str], t: int, repeats: int) -> list[tuple]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdm.models import decoder
    from jaxdm.models.cpu import attention as cpu_attention

    on, why = cpu_attention.status()
    if not on:
        raise SystemExit(f"the fused CPU attention kernel is {why}")
    rng = np.random.default_rng(0)
    b, s, kh, g, hd, w = 1, 256, 3, 3, 64, 256
    causal = np.arange(t)[None] <= (np.arange(s) + t - s)[:, None]
    seg = np.arange(s) // 30
    own = (seg[:, None] == seg[None]) & (np.arange(s)[:, None] >= np.arange(s)[None])
    results = []
    for dtype in dtypes:
        dt = jnp.dtype(dtype)

        def arr(*shape):
            return jnp.asarray(rng.normal(size=shape), dt)

        q = arr(b, s, kh, g, hd)
        k, v, k2, v2 = arr(b, t, kh, hd), arr(b, t, kh, hd), arr(b, w, kh, hd), arr(b, w, kh, hd)
        cases = {
            "trunk": [(k, v, jnp.asarray(causal[None]))],
            "continuation": [(k, v, jnp.ones((b, s, t), bool)), (k2, v2, jnp.asarray(own[None]))],
        }
        for name, sources in cases.items():
            base_fn, ours_fn = jax.jit(decoder.xla_attend), jax.jit(decoder.attend)
            want = base_fn(q, sources).block_until_ready()
            got = ours_fn(q, sources).block_until_ready()
            diff = float(jnp.max(jnp.abs(want.astype(jnp.float32) - got.astype(jnp.float32))))
            mb, mo = alternated_ms([lambda: base_fn(q, sources).block_until_ready(),
                                    lambda: ours_fn(q, sources).block_until_ready()], repeats)
            visible = sum(float(np.asarray(m).sum()) for _, _, m in sources)
            flops = 4 * hd * kh * g * visible
            print(f"[blocks {name} {dtype} T={t}] XLA {mb:.2f} ms, kernel {mo:.2f} ms "
                  f"({flops / mo / 1e6:.0f} GFLOP/s on visible keys), max |diff| {diff:.2e}",
                  flush=True)
            results.append((f"cpu_attention_{name}_{dtype}_T{t}", mb, mo, "ms"))
    return results


def bench_matmul_blocks(dtypes: list[str], rows: int, repeats: int) -> list[tuple]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdm.models.cpu import matmul as cpu_matmul

    for dtype in dtypes:
        on, why = cpu_matmul.status(dtype)
        if not on:
            raise SystemExit(f"the {dtype} matmul kernel is {why}")
    try:
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    base_fn, ours_fn = jax.jit(cpu_matmul.reference), jax.jit(cpu_matmul.matmul)
    results = []
    shapes = [("q_o", 576, 576), ("k_v", 576, 192), ("gate_up", 576, 1536),
              ("down", 1536, 576)]
    for dtype, (name, k, n) in ((d, shape) for d in dtypes for shape in shapes):
        x = jnp.asarray(rng.normal(size=(rows, k)), dtype)
        w = jnp.asarray(rng.normal(size=(k, n)) / np.sqrt(k), dtype)
        want = base_fn(x, w).block_until_ready()
        got = ours_fn(x, w).block_until_ready()
        diff = float(jnp.max(jnp.abs(want - got)))
        tx = tw = None
        if torch is not None:
            tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
            tx = torch.from_numpy(np.array(x.astype(jnp.float32))).to(tdt)
            tw = torch.from_numpy(np.array(w.astype(jnp.float32))).to(tdt)
        mb, mo = alternated_ms([lambda: base_fn(x, w).block_until_ready(),
                                lambda: ours_fn(x, w).block_until_ready()], repeats)
        # torch after the JAX calls, on its own (see alternated_ms)
        mt = alternated_ms([lambda: torch.matmul(tx, tw)], repeats) if torch is not None else []
        flops = 2 * rows * k * n
        extra = ""
        if mt:
            mt = mt[0]
            extra = (f", torch/oneDNN ({'bf16' if dtype == 'bfloat16' else 'fp32'} out) "
                     f"{mt:.2f} ms ({flops / mt / 1e6:.0f} GFLOP/s)")
        print(f"[blocks matmul {name} {dtype} {rows}x{k}x{n}] XLA {mb:.2f} ms "
              f"({flops / mb / 1e6:.0f} GFLOP/s), kernel {mo:.2f} ms ({flops / mo / 1e6:.0f} "
              f"GFLOP/s){extra}, max |diff| {diff:.2e}", flush=True)
        tag = "bf16" if dtype == "bfloat16" else "fp32"
        results.append((f"cpu_matmul_{name}_{tag}_M{rows}", mb, mo, "ms"))
    return results


def bench_program(kernel: str, work: str, dtype: str, n_act: int, rounds: int,
                  calls: int, vs_fp32: bool = False) -> list[tuple]:
    """One child per variant, alternated: XLA (the kernel's variable = 0), the kernel, and
    with ``vs_fp32`` the same job in fp32 (a third child) as the precision and speed
    reference of a bf16 run."""
    var = ENV_VARS[kernel]
    variants = {"xla": (dtype, {var: "0"}), "kernel": (dtype, {})}
    if vs_fp32:
        variants["fp32"] = ("float32", {})
    times = {k: [] for k in variants}
    scores = {}
    for r in range(rounds):
        for name, (child_dtype, extra) in variants.items():
            env = {k: v for k, v in os.environ.items() if k != var}
            env.update(extra)
            proc = subprocess.run([sys.executable, "-c", CHILD, work, child_dtype, str(n_act),
                                   str(calls)],
                                  env=env, capture_output=True, text=True, check=False)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD ")), None)
            if line is None:
                raise SystemExit(f"{name} child failed:\n{proc.stderr[-3000:]}")
            out = json.loads(line[6:])
            times[name].append(out["s"])
            scores[name] = out["scores"]
            print(f"[program {work} round {r} {name}] {out['s']:.3f} s per batch "
                  f"({child_dtype}; {out['kernels']})", flush=True)

    def diff(a: str, b: str) -> float:
        if work == "decode":
            return sum(x != y for x, y in zip(scores[a], scores[b]))
        return max(abs(x - y) for x, y in zip(scores[a], scores[b]))

    what = "max |score diff|" if work != "decode" else "tokens differing"
    base, ours = statistics.median(times["xla"]), statistics.median(times["kernel"])
    print(f"[program {work} {dtype}] {kernel}: XLA {base:.3f} s, kernel {ours:.3f} s per batch; "
          f"{what} {diff('xla', 'kernel'):.3g}", flush=True)
    results = [(f"cpu_{kernel}_{work}_{dtype}", base, ours, "s")]
    if vs_fp32:
        ref = statistics.median(times["fp32"])
        print(f"[program {work}] fp32 {ref:.3f} s per batch; {what} vs fp32: XLA "
              f"{diff('xla', 'fp32'):.3g}, kernel {diff('kernel', 'fp32'):.3g}", flush=True)
        results.append((f"cpu_{kernel}_{work}_{dtype}_vs_fp32", ref, ours, "s"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=sorted(ENV_VARS), default="attention")
    parser.add_argument("--quick", action="store_true", help="blocks only, few repeats")
    parser.add_argument("--dtype", default=None,
                        help="float32, bfloat16 or float32,bfloat16 (default: both)")
    parser.add_argument("--keys", type=int, default=1920,
                        help="attention: context keys T of the blocks")
    parser.add_argument("--rows", type=int, default=2432,
                        help="matmul: rows of the blocks (the packed readout's 2 x 1,216)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--actions", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2, help="timed calls per program child")
    parser.add_argument("--no-program", action="store_true")
    parser.add_argument("--vs-fp32", action="store_true",
                        help="programs: also run each job in fp32 (speed and score reference)")
    parser.add_argument("--workloads", default="readout,actor,decode",
                        help="whole-program workloads: readout (Hindsight+Progress, 2 "
                             "trajectories), actor (4 states, 10-20 options), decode (16 x 32)")
    args = parser.parse_args()
    repeats = args.repeats or (5 if args.quick else 15)
    dtypes = args.dtype.split(",") if args.dtype else ["float32", "bfloat16"]
    bad = [d for d in dtypes if d not in ("float32", "bfloat16")]
    if bad:
        parser.error(f"--dtype: {', '.join(bad)} is not float32 or bfloat16")
    if args.kernel == "attention":
        results = bench_attention_blocks(dtypes, args.keys, repeats)
    else:
        results = bench_matmul_blocks(dtypes, args.rows, repeats)
    if not (args.quick or args.no_program):
        for work in args.workloads.split(","):
            for dtype in dtypes:
                results += bench_program(args.kernel, work, dtype, args.actions, args.rounds,
                                         args.calls, vs_fp32=args.vs_fp32 and dtype != "float32")
    for name, base, ours, unit in results:
        print(f"RESULT {name}: baseline {base:.3f} {unit}, jaxdm {ours:.3f} {unit}, "
              f"ratio {base / ours:.2f}x")


if __name__ == "__main__":
    main()
