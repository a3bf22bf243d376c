"""Memory and speed of the fused top-k reverse KL: reference vs chunked XLA (vs Pallas on GPU).

The measured op is the LVOPD training step's loss + gradient: ``value_and_grad`` of the mean
top-k reverse KL (k = 16, K_T = 32) w.r.t. the final hidden states [T, d] and the LM head
[d, V], at Qwen2.5's vocabulary V = 151,936 and d = 1,536 (Qwen2.5-1.5B).

- baseline: ``impl="reference"``: logits = hidden @ W materialised, full softmax.
- jaxdm:    ``impl="xla"``: vocabulary streamed in blocks, logits recomputed in the backward.
- on a GPU also ``impl="pallas"`` (compiled kernels) against both.

Gate section: the LVOPD gate max(0, -A) is zero on most tokens (share > 0 about 0.24 in the
BabyAI LVOPD run): the same step with a gate on ``--gate-share`` of the rows, ungated (every
row through the streaming head, the gate applied to the per-row KL) vs the gate inside the
kernel (``gate=`` / ``capacity=``: only the gated-on rows are computed), memory and time.

Peak memory comes from XLA's compiled memory analysis (compile only, nothing allocated, so
T = 8,192 is measured even where it would not fit): ``peak = arguments + outputs + temporaries
- aliased``; ``temp`` is the working memory beyond the inputs and the returned gradients
(both impls must hold W and dW, 0.93 GB each in float32, 0.47 GB in bfloat16; the RESULT lines
``kernel_peak_{fp32,bf16}_T8192`` carry the issue's goal, peak <= 1/8 of the reference). Times
are medians of alternated rounds (baseline, jaxdm, baseline, ...), compile excluded.

    python benchmarks/kernel_bench.py --quick     # < 60 s on 2 cores
    python benchmarks/kernel_bench.py             # full: memory at T up to 8,192, time at 512/2,048
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdm.kernels import (fused_linear_topk_reverse_kl, gate_capacity, topk_reverse_kl,
                           weighted_kl_loss)

VOCAB = 151_936
DIM = 1_536
K = 16
K_TEACHER = 32
# Nominal HBM bandwidth (GB/s) of common accelerators, to put measured bandwidth in context.
PEAK_BANDWIDTH_GBS = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0, "L4": 300.0}
DTYPE_TAGS = {"float32": "fp32", "bfloat16": "bf16"}


def _fused_loss(impl: str, block_v: int | None):
    def loss(hidden, head, ids, logprobs):
        kl = fused_linear_topk_reverse_kl(
            hidden, head, ids, logprobs, k=K, impl=impl, block_v=block_v
        )
        return jnp.mean(kl)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _gated_loss(block_v: int | None, capacity: int | None):
    """value_and_grad of the gate-weighted token-mean KL; ``capacity`` None: ungated kernel."""
    def loss(hidden, head, ids, logprobs, gate):
        kw = {} if capacity is None else {"gate": gate, "capacity": capacity}
        kl = fused_linear_topk_reverse_kl(hidden, head, ids, logprobs, k=K, impl="xla",
                                          block_v=block_v, **kw)
        return weighted_kl_loss(kl, gate)[0]

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _gate(n_rows: int, share: float, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    on = rng.random(n_rows) < share
    return np.where(on, rng.random(n_rows) + 0.05, 0.0).astype(np.float32)


def _logits_loss(impl: str, block_v: int | None):
    def loss(logits, ids, logprobs):
        return jnp.mean(topk_reverse_kl(logits, ids, logprobs, k=K, impl=impl, block_v=block_v))

    return jax.jit(jax.value_and_grad(loss))


def _memory(fn, *shapes) -> dict[str, int]:
    analysis = fn.lower(*shapes).compile().memory_analysis()
    temp = int(analysis.temp_size_in_bytes)
    arguments = int(analysis.argument_size_in_bytes)
    outputs = int(analysis.output_size_in_bytes)
    peak = arguments + outputs + temp - int(analysis.alias_size_in_bytes)
    return {"peak": peak, "temp": temp, "arguments": arguments, "outputs": outputs}


def _fused_shapes(n_rows: int, dtype=jnp.float32):
    return (
        jax.ShapeDtypeStruct((n_rows, DIM), dtype),
        jax.ShapeDtypeStruct((DIM, VOCAB), dtype),
        jax.ShapeDtypeStruct((n_rows, K_TEACHER), jnp.int32),
        jax.ShapeDtypeStruct((n_rows, K_TEACHER), jnp.float32),
    )


def _fused_inputs(n_rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((n_rows, DIM), np.float32))
    # Scale so logits have std ~2.5, like a trained LM head.
    head = jnp.asarray(rng.standard_normal((DIM, VOCAB), np.float32) * (2.5 / np.sqrt(DIM)))
    ids = jnp.asarray(rng.integers(0, VOCAB, size=(n_rows, K_TEACHER)), jnp.int32)
    probs = rng.dirichlet(np.ones(K_TEACHER), size=n_rows) * 0.95
    return hidden, head, ids, jnp.asarray(np.log(probs), jnp.float32)


def _time_alternating(fns: dict[str, object], args, rounds: int) -> dict[str, float]:
    """Median seconds per call; impls alternate within each round (the machine is noisy).

    The warm-up call (compile) also checks that every impl returns the same loss and
    gradients as the first, so the timed programs are known to agree.
    """
    outs = {name: jax.device_get(fn(*args)) for name, fn in fns.items()}
    _check_agreement(outs)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def _result(name: str, baseline: float, ours: float, unit: str, lower_is_better=True) -> str:
    ratio = baseline / ours if lower_is_better else ours / baseline
    return (f"RESULT {name}: baseline {_fmt(baseline)} {unit}, jaxdm {_fmt(ours)} {unit}, "
            f"ratio {ratio:.2f}x")


def _fmt(value: float) -> str:
    """Plain decimals (no exponent): 11376.5, 209.1, 3.142."""
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"


def _check_agreement(outs: dict) -> None:
    """Every impl's (loss, (d hidden, d lm_head)) must match the first impl's."""
    names = list(outs)
    base_value, base_grads = outs[names[0]]
    for name in names[1:]:
        value, grads = outs[name]
        assert np.allclose(value, base_value, rtol=1e-4, atol=1e-6), (name, value, base_value)
        for ours, ref in zip(grads, base_grads):
            scale = max(float(np.max(np.abs(ref))), 1e-12)
            assert np.max(np.abs(ours - ref)) / scale < 1e-3, name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small timing shapes, < 60 s")
    parser.add_argument("--mem-t", type=int, nargs="*", default=None,
                        help="T values for the compiled memory analysis")
    parser.add_argument("--time-t", type=int, nargs="*", default=None,
                        help="T values for timing")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--block-v", type=int, default=None, help="vocabulary block (xla)")
    parser.add_argument("--gate-share", type=float, default=0.25,
                        help="share of rows with a positive gate in the gate section")
    args = parser.parse_args()
    mem_t = args.mem_t or ([8192] if args.quick else [1024, 2048, 4096, 8192])
    time_t = args.time_t or ([32] if args.quick else [512, 2048])
    rounds = args.rounds or (2 if args.quick else 3)
    backend = jax.default_backend()
    device = jax.devices()[0]
    print(f"# kernel_bench {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"backend={backend}, device={device.device_kind}, V={VOCAB}, d={DIM}, k={K}, "
          f"K_T={K_TEACHER}; memory in float32 and bfloat16, time in float32")
    if backend == "cpu":
        print("# no GPU/TPU here: Pallas runs only in interpret mode on CPU (a correctness "
              "check, not timed); reference vs xla only")
    results: list[str] = []

    # ---- memory: compiled analysis, value_and_grad w.r.t. hidden and lm_head
    ref_fused, xla_fused = _fused_loss("reference", None), _fused_loss("xla", args.block_v)
    for dtype in (jnp.float32, jnp.bfloat16):
        tag = jnp.dtype(dtype).name
        short = DTYPE_TAGS[tag]
        for n_rows in mem_t:
            shapes = _fused_shapes(n_rows, dtype)
            ref_mem, xla_mem = _memory(ref_fused, *shapes), _memory(xla_fused, *shapes)
            print(f"fused {tag:8s} T={n_rows:5d}: peak reference {ref_mem['peak'] / 2**20:8.1f} "
                  f"MiB, xla {xla_mem['peak'] / 2**20:7.1f} MiB "
                  f"({ref_mem['peak'] / xla_mem['peak']:.2f}x) | temp reference "
                  f"{ref_mem['temp'] / 2**20:8.1f} MiB, xla {xla_mem['temp'] / 2**20:6.1f} MiB "
                  f"({ref_mem['temp'] / xla_mem['temp']:.1f}x) | xla arguments "
                  f"{xla_mem['arguments'] / 2**20:.1f} + outputs {xla_mem['outputs'] / 2**20:.1f} "
                  f"MiB")
            if n_rows == max(mem_t):
                results.append(_result(f"kernel_peak_{short}_T{n_rows}",
                                       ref_mem["peak"] / 2**20, xla_mem["peak"] / 2**20, "MiB"))
                results.append(_result(f"kernel_temp_{short}_T{n_rows}",
                                       ref_mem["temp"] / 2**20, xla_mem["temp"] / 2**20, "MiB"))
    # Logits form (gradient w.r.t. [T, V] logits): arguments and outputs are [T, V] for
    # both, so only the working memory can differ.
    n_rows = max(mem_t)
    for dtype in (jnp.float32, jnp.bfloat16):
        tag = jnp.dtype(dtype).name
        logit_shapes = (
            jax.ShapeDtypeStruct((n_rows, VOCAB), dtype),
            jax.ShapeDtypeStruct((n_rows, K_TEACHER), jnp.int32),
            jax.ShapeDtypeStruct((n_rows, K_TEACHER), jnp.float32),
        )
        ref_mem = _memory(_logits_loss("reference", None), *logit_shapes)
        xla_mem = _memory(_logits_loss("xla", args.block_v), *logit_shapes)
        print(f"logits {tag:8s} T={n_rows}: peak reference {ref_mem['peak'] / 2**20:.1f} MiB, "
              f"xla {xla_mem['peak'] / 2**20:.1f} MiB | temp reference "
              f"{ref_mem['temp'] / 2**20:.1f} MiB, xla {xla_mem['temp'] / 2**20:.1f} MiB")
        results.append(_result(f"logits_topk_kl_peak_mib_{DTYPE_TAGS[tag]}_T{n_rows}",
                               ref_mem["peak"] / 2**20, xla_mem["peak"] / 2**20, "MiB"))

    # ---- time: alternated rounds, medians
    for n_rows in time_t:
        inputs = _fused_inputs(n_rows)
        fns = {"reference": ref_fused, "xla": xla_fused}
        if backend != "cpu":
            fns["pallas"] = _fused_loss("pallas", None)
        medians = _time_alternating(fns, inputs, rounds)
        flops = 3 * 2.0 * n_rows * DIM * VOCAB  # forward, d hidden, d lm_head
        line = ", ".join(
            f"{name} {sec * 1e3:.1f} ms ({flops / sec / 1e9:.0f} GFLOP/s)"
            for name, sec in medians.items()
        )
        print(f"fused float32 T={n_rows}: {line}, median of {rounds} alternated rounds")
        results.append(_result(f"fused_topk_kl_time_T{n_rows}", medians["reference"] * 1e3,
                               medians["xla"] * 1e3, "ms"))
        if "pallas" in medians:
            # Bytes the Pallas kernels must move at least: W read by each of the three passes
            # (forward, d hidden, d lm_head) once per position tile, and dW written once.
            tiles = -(-n_rows // 32)
            w_bytes = DIM * VOCAB * 4
            moved = (2 * tiles + 2) * w_bytes
            print(f"pallas T={n_rows}: {moved / medians['pallas'] / 1e9:.0f} GB/s achieved on W "
                  f"traffic; nominal HBM GB/s: {PEAK_BANDWIDTH_GBS} "
                  f"(device: {device.device_kind})")
            results.append(_result(f"fused_topk_kl_pallas_vs_reference_T{n_rows}",
                                   medians["reference"] * 1e3, medians["pallas"] * 1e3, "ms"))
            results.append(_result(f"fused_topk_kl_pallas_vs_xla_T{n_rows}",
                                   medians["xla"] * 1e3, medians["pallas"] * 1e3, "ms"))
    # ---- the gate inside the kernel: memory at the largest T, time at the timing T's
    n_rows = max(mem_t)
    gate = _gate(n_rows, args.gate_share)
    cap = gate_capacity(gate)
    shapes = (*_fused_shapes(n_rows), jax.ShapeDtypeStruct((n_rows,), jnp.float32))
    full_mem = _memory(_gated_loss(args.block_v, None), *shapes)
    gated_mem = _memory(_gated_loss(args.block_v, cap), *shapes)
    print(f"gated float32 T={n_rows} ({int((gate > 0).sum())} rows on, capacity {cap}): temp "
          f"ungated {full_mem['temp'] / 2**20:.1f} MiB, gated {gated_mem['temp'] / 2**20:.1f} MiB")
    results.append(_result(f"kernel_gated_temp_fp32_T{n_rows}", full_mem["temp"] / 2**20,
                           gated_mem["temp"] / 2**20, "MiB"))
    for n_rows in time_t:
        gate = _gate(n_rows, args.gate_share)
        cap = gate_capacity(gate, multiple=8)
        inputs = (*_fused_inputs(n_rows), jnp.asarray(gate))
        fns = {"ungated": _gated_loss(args.block_v, None), "gated": _gated_loss(args.block_v, cap)}
        outs = {name: fn(*inputs) for name, fn in fns.items()}
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                   zip(jax.tree.leaves(outs["ungated"]), jax.tree.leaves(outs["gated"])))
        medians = _time_alternating(fns, inputs, rounds)
        print(f"gated float32 T={n_rows} ({int((gate > 0).sum())} rows on, capacity {cap}): "
              f"ungated {medians['ungated'] * 1e3:.1f} ms, gated {medians['gated'] * 1e3:.1f} ms, "
              f"max |loss, grad diff| {diff:.1e}")
        results.append(_result(f"fused_topk_kl_gated_time_T{n_rows}", medians["ungated"] * 1e3,
                               medians["gated"] * 1e3, "ms"))
    for line in results:
        print(line)


if __name__ == "__main__":
    main()
