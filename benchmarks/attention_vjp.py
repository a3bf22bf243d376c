"""One layer's attention gradient at a packed training row: ``decoder.attend_segments``'s own
backward pass against XLA's autodiff of the planned reference attention.

Shapes of the full-depth 69-option DECISION GYM step in the packed layout (train-dm's
default): 2 rows x 3,456 slots, a 1,920-token context then 10-token continuations that see all
of it, SmolLM2-135M's 9 query / 3 KV heads of 64, the context-cut plan of
``decoder.forward_trunk_suffixes``. Per round, alternated: the gradient (forward + backward of
q, k, v) both ways, and the forward alone on the fused kernel and on XLA. Also XLA's compiled
temporaries of each gradient (``memory_analysis``).

  python benchmarks/attention_vjp.py            # the gym row, 5 rounds
  python benchmarks/attention_vjp.py --quick    # 1 row x 1,024 slots, 3 rounds (< 60 s)
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time


def main(argv=None):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdm.models import decoder
    from jaxdm.models.cpu import attention as cpu_attention

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args(argv)
    b, s, trunk, seg_len = (1, 1024, 512, 10) if args.quick else (2, 3456, 1920, 10)
    rounds = 3 if args.quick else args.rounds
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(b, s, 3, 3, 64)), args.dtype)
    k, v = (jnp.asarray(rng.normal(size=(b, s, 3, 64)), args.dtype) for _ in range(2))
    seg = np.full((b, s), -1, np.int32)
    seg[:, :trunk] = 0
    for i, start in enumerate(range(trunk, s - 56, seg_len)):
        seg[:, start:start + seg_len] = i + 1
    seg = jnp.asarray(seg)
    slot = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    sees = jnp.where(seg == 0, slot + 1, jnp.where(seg > 0, trunk, 0)).astype(jnp.int32)
    bucket = -(-trunk // 256) * 256
    plan = decoder.trunk_suffix_plan(s, bucket, 64, decoder.DEFAULT_ATTN_CHUNK, 8)
    real = (np.asarray(seg) >= 0)[..., None, None]
    ours_fn = lambda q, k, v: decoder.attend_segments(q, k, v, slot, seg, sees, seg,  # noqa
                                                      plan=plan)
    ref = functools.partial(decoder._segment_attention_xla, plan=plan)
    ref_fn = lambda q, k, v: ref(q, k, v, slot, seg, sees, seg, sees)  # noqa: E731

    def grad_of(fn):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(
            jnp.where(real, fn(q, k, v).astype(jnp.float32), 0.0) ** 2), argnums=(0, 1, 2)))

    progs = {"xla_autodiff": grad_of(ref_fn), "jaxdm_vjp": grad_of(ours_fn),
             "xla_forward": jax.jit(ref_fn), "kernel_forward": jax.jit(ours_fn)}
    temps = {name: progs[name].lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
             for name in ("xla_autodiff", "jaxdm_vjp")}
    g_ref, g_ours = progs["xla_autodiff"](q, k, v), progs["jaxdm_vjp"](q, k, v)
    diff = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - c.astype(jnp.float32))))
               / float(jnp.max(jnp.abs(a.astype(jnp.float32)))) for a, c in zip(g_ref, g_ours))
    times = {name: [] for name in progs}
    for _ in range(rounds):
        for name, fn in progs.items():  # alternated: the machine's load hits all alike
            jax.block_until_ready(fn(q, k, v))
            t0 = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    on = "on" if cpu_attention.segments_enabled() else "off"
    print(f"shapes: {b} x {s} slots, context {trunk}, {args.dtype}, kernel {on}; "
          f"max relative gradient difference {diff:.2e}")
    for name, t in med.items():
        print(f"  {name}: {t:.3f} s")
    print(f"RESULT attention_grad_time: baseline {med['xla_autodiff']:.3f} s, jaxdm "
          f"{med['jaxdm_vjp']:.3f} s, ratio {med['xla_autodiff'] / med['jaxdm_vjp']:.2f}x "
          f"(forward + backward of one layer's attention, median of {rounds})")
    print(f"RESULT attention_grad_memory: baseline {temps['xla_autodiff'] / 2**20:.1f} MiB, "
          f"jaxdm {temps['jaxdm_vjp'] / 2**20:.1f} MiB, ratio "
          f"{temps['xla_autodiff'] / max(temps['jaxdm_vjp'], 1):.2f}x (XLA temporaries)")
    print(f"RESULT attention_forward_time: baseline {med['xla_forward']:.3f} s, jaxdm "
          f"{med['kernel_forward']:.3f} s, ratio {med['xla_forward'] / med['kernel_forward']:.2f}x "
          "(XLA's planned attention vs the fused kernel)")


if __name__ == "__main__":
    main()
