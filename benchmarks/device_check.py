"""Device check: the compiled Pallas kernel and the throughput of scoring, decode and training
on one GPU/TPU chip, at Qwen2.5-1.5B shapes with random weights (``device_check.sh`` installs
the accelerator JAX and runs this).

Sections (each one runs even when an earlier one failed; the exit status says if any did):

- ``kernel``: the fused top-k reverse KL (k = 16, K_T = 32) + gradients w.r.t. the hidden
  states and the LM head at V = 151,936, d = 1,536: ``impl="pallas"`` COMPILED
  (``interpret=False``; interpret mode only in ``--dry-run``) against ``impl="reference"``
  (loss and gradients must agree), timed against the reference and the chunked-XLA impl.
- ``scoring``: shared-prefix scoring (``jaxdm.decision.shared_prefix.score_requests``, packed
  layout) of Hindsight-shaped requests: G trajectories, each a trunk of T tokens followed by N
  questions of S tokens, read at the last token over two candidates; against the same
  requests one by one (``score_requests_one_by_one``) on a subset.
- ``decode``: ``jaxdm.models.generate`` greedy, batch B, prompt P; the per-token time is the
  difference of two runs with different numbers of new tokens (so prefill cancels out).
- ``train``: one optimiser step (next-token cross-entropy through ``decoder.forward`` and
  ``decoder.token_logprobs``, optax AdamW, parameters donated), B x S tokens.

Figures against the device's peak (``PEAKS``, bf16 dense matmul TFLOP/s and HBM GB/s; pass
``--peak-tflops/--peak-gbs`` for a device not in the table):

- MFU = model FLOPs / time / peak. Model FLOPs count matmuls with the non-embedding
  parameters only (attention scores and the LM head excluded, so MFU is a lower bound):
  scoring 2 N_p per token actually run, training 6 N_p per token.
- decode bandwidth = bytes one decode step must read (all parameters once, plus the keys and
  values in the cache at the mean length) x steps / time, against the HBM bandwidth.

RESULT lines follow the benchmarks' convention (``baseline`` = the peak or the one-by-one
scorer, ``ratio`` = jaxdm / baseline, i.e. MFU or bandwidth share for the peak lines). A
markdown block (date, device, table) is written to ``--out`` and, on a real device, appended
to ``benchmarks/RESULTS.md`` (``--results-md``). ``--dry-run`` runs the same code paths at
tiny shapes on CPU (Pallas in interpret mode; the CPU "peak" is the matmul rate measured here),
as the CI test does; it never writes RESULTS.md.

    bash benchmarks/device_check.sh                 # on the GPU/TPU machine, < 10 min on an H200
    python benchmarks/device_check.py --dry-run --out /tmp/dc
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback
from typing import Callable

import numpy as np

# bf16 dense matmul peak (TFLOP/s) and HBM bandwidth (GB/s) per chip, from the vendors' data
# sheets. Matched in order against the lower-cased ``device_kind`` (first hit wins).
PEAKS: list[tuple[tuple[str, ...], str, float, float]] = [
    (("h100 pcie",), "H100 PCIe", 756.0, 2000.0),
    (("h100",), "H100 SXM", 989.0, 3350.0),
    (("h200",), "H200", 989.0, 4800.0),
    (("a100-sxm4-40gb", "a100-pcie-40gb"), "A100 40GB", 312.0, 1555.0),
    (("a100",), "A100 80GB", 312.0, 2039.0),
    (("tpu v4",), "TPU v4", 275.0, 1200.0),
    (("tpu v5 lite", "tpu v5e"), "TPU v5e", 197.0, 819.0),
    (("tpu v5p", "tpu v5"), "TPU v5p", 459.0, 2765.0),
    (("tpu v6 lite", "tpu v6e", "tpu v6"), "TPU v6e", 918.0, 1640.0),
]


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Workload sizes of one mode (full: Qwen2.5-1.5B; dry run: tiny, same code paths)."""

    model: str  # jaxdm.models.presets name
    dtype: str
    kernel_t: int
    kernel_d: int
    kernel_v: int
    score_groups: int
    score_trunk: int
    score_questions: int
    score_suffix: int
    score_one_by_one: int  # requests timed one by one (baseline subset)
    decode_batch: int
    decode_prompt: int
    decode_new: tuple[int, int]  # two run lengths; the difference isolates decode steps
    train_batch: int
    train_seq: int
    rounds: int


FULL = Shapes(model="qwen2.5-1.5b", dtype="bfloat16", kernel_t=4096, kernel_d=1536,
              kernel_v=151_936, score_groups=8, score_trunk=2048, score_questions=30,
              score_suffix=48, score_one_by_one=16, decode_batch=32, decode_prompt=1024,
              decode_new=(32, 288), train_batch=4, train_seq=2048, rounds=3)
DRY = Shapes(model="tiny-qwen2", dtype="float32", kernel_t=64, kernel_d=64, kernel_v=1000,
             score_groups=2, score_trunk=64, score_questions=6, score_suffix=8,
             score_one_by_one=3, decode_batch=4, decode_prompt=16, decode_new=(8, 24),
             train_batch=2, train_seq=32, rounds=2)


@dataclasses.dataclass
class Measure:
    name: str
    what: str
    unit: str
    baseline: float
    value: float
    lower_is_better: bool = False  # times: ratio = baseline / jaxdm

    @property
    def ratio(self) -> float:
        """> 1 means jaxdm is better (for the peak lines: the share of the peak reached)."""
        num, den = ((self.baseline, self.value) if self.lower_is_better
                    else (self.value, self.baseline))
        return num / den if den else float("nan")

    def result_line(self) -> str:
        return (f"RESULT device_{self.name}: baseline {_fmt(self.baseline)} {self.unit}, "
                f"jaxdm {_fmt(self.value)} {self.unit}, ratio {self.ratio:.3g}x")


def _fmt(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.4g}"


@dataclasses.dataclass
class Context:
    shapes: Shapes
    dry_run: bool
    device_kind: str
    device_label: str
    peak_tflops: float
    peak_gbs: float
    notes: list[str] = dataclasses.field(default_factory=list)


def _median_time(fn: Callable[[], object], rounds: int) -> float:
    import jax

    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


@functools.cache
def _init_params_jit():
    import jax

    from jaxdm.models import init_params

    return jax.jit(init_params, static_argnums=0)


def _params(ctx: Context):
    """Random parameters of the preset, initialised on the device by one compiled program
    (eagerly every random tensor compiles on its own) with the RBG generator (threefry's
    program takes several times longer to compile)."""
    import jax

    from jaxdm.models import presets

    config = presets.preset(ctx.shapes.model).replace(dtype=ctx.shapes.dtype)
    params = _init_params_jit()(config, jax.random.key(0, impl="unsafe_rbg"))
    embed = config.vocab_size * config.hidden_size * (1 if config.tie_embeddings else 2)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    return config, params, n_params - embed, n_params


# ------------------------------------------------------------------------------ sections
def section_kernel(ctx: Context) -> list[Measure]:
    """Compiled Pallas fused top-k reverse KL vs the reference (agreement), and its speed."""
    import jax
    import jax.numpy as jnp

    from jaxdm.kernels import fused_linear_topk_reverse_kl

    s = ctx.shapes
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((s.kernel_t, s.kernel_d), np.float32))
    head = jnp.asarray(rng.standard_normal((s.kernel_d, s.kernel_v), np.float32)
                       * (2.5 / np.sqrt(s.kernel_d)))
    ids = jnp.asarray(rng.integers(0, s.kernel_v, size=(s.kernel_t, 32)), jnp.int32)
    logprobs = jnp.asarray(np.log(rng.dirichlet(np.ones(32), size=s.kernel_t) * 0.95),
                           jnp.float32)
    interpret = ctx.dry_run  # compiled on the device; interpret mode only in the dry run

    def step(impl):
        def loss(h, w):
            return jnp.mean(fused_linear_topk_reverse_kl(
                h, w, ids, logprobs, k=16, impl=impl,
                interpret=interpret if impl == "pallas" else None))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    # Agreement at full float32 matmul precision (GPUs may otherwise use TF32), then timing
    # at the default precision (on CPU both are full precision: one compile serves both).
    fns = {impl: step(impl) for impl in ("reference", "xla", "pallas")}
    precise = (contextlib.nullcontext() if ctx.dry_run
               else jax.default_matmul_precision("highest"))
    with precise:
        outs = {impl: jax.device_get(fns[impl](hidden, head)) for impl in ("reference", "pallas")}
    (ref_loss, ref_grads), (pal_loss, pal_grads) = outs["reference"], outs["pallas"]
    loss_err = abs(float(pal_loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-12)
    grad_err = max(float(np.max(np.abs(p - r))) / max(float(np.max(np.abs(r))), 1e-12)
                   for p, r in zip(pal_grads, ref_grads))
    ctx.notes.append(f"kernel: Pallas {'interpret mode' if interpret else 'compiled'} vs "
                     f"reference at T={s.kernel_t}, d={s.kernel_d}, V={s.kernel_v}: loss rel. "
                     f"error {loss_err:.2e}, max grad error {grad_err:.2e} (of the max |grad|)")
    # Limits: as the kernel tests on CPU; 10x looser on a device (other reduction orders).
    loss_tol, grad_tol = (1e-4, 1e-3) if ctx.dry_run else (1e-3, 1e-2)
    if not (loss_err < loss_tol and grad_err < grad_tol):
        raise AssertionError(f"Pallas kernel disagrees with the reference: loss rel. error "
                             f"{loss_err:.2e} (limit {loss_tol}), grad error {grad_err:.2e} "
                             f"({grad_tol})")
    for fn in fns.values():
        jax.block_until_ready(fn(hidden, head))  # compile at the default precision
    times = {impl: [] for impl in fns}
    for _ in range(s.rounds):  # alternated rounds
        for impl, fn in fns.items():
            times[impl].append(_median_time(lambda: fn(hidden, head), 1))
    med = {impl: statistics.median(v) * 1e3 for impl, v in times.items()}
    flops = 3 * 2.0 * s.kernel_t * s.kernel_d * s.kernel_v  # forward, d hidden, d lm_head
    return [
        Measure("kernel_pallas_vs_reference", f"fused top-k KL + grads, fp32, T={s.kernel_t}, "
                f"ms per step (reference vs Pallas)", "ms", med["reference"], med["pallas"],
                lower_is_better=True),
        Measure("kernel_pallas_vs_xla", "same, chunked XLA vs Pallas", "ms", med["xla"],
                med["pallas"], lower_is_better=True),
        Measure("kernel_pallas_tflops", f"same, Pallas fp32 TFLOP/s vs the bf16 peak "
                f"({flops / 1e12:.2f} TFLOP per step)", "TFLOP/s", ctx.peak_tflops,
                flops / (med["pallas"] / 1e3) / 1e12),
    ]


def section_scoring(ctx: Context) -> list[Measure]:
    """Shared-prefix scoring of Hindsight-shaped requests vs one request at a time; MFU."""
    from jaxdm.decision.shared_prefix import (Request, score_requests,
                                              score_requests_one_by_one)

    s = ctx.shapes
    config, params, n_active, _ = _params(ctx)
    rng = np.random.default_rng(1)
    requests = []
    for _ in range(s.score_groups):
        trunk = rng.integers(10, config.vocab_size, size=s.score_trunk).tolist()
        for _ in range(s.score_questions):
            suffix = rng.integers(10, config.vocab_size, size=s.score_suffix).tolist()
            tokens = tuple(trunk + suffix)
            requests.append(Request(tokens=tokens, answer_positions=(len(tokens) - 1,),
                                    candidates=((3, 4),)))
    stats: dict = {}
    scores = score_requests(params, config, requests, stats=stats)  # compile
    shared = _median_time(lambda: score_requests(params, config, requests), s.rounds)
    subset = requests[:: max(1, len(requests) // s.score_one_by_one)][: s.score_one_by_one]
    ref = score_requests_one_by_one(params, config, subset[:1])  # compile
    diff = float(np.max(np.abs(ref[0] - scores[0])))  # subset[0] is requests[0]
    ctx.notes.append(f"scoring: {len(requests)} requests in {s.score_groups} groups "
                     f"(trunk {s.score_trunk}, suffix {s.score_suffix}); "
                     f"{stats['unique_tokens']} tokens run vs {stats['request_tokens']} one by "
                     f"one; |shared - one-by-one| = {diff:.2e} on a checked request")
    one = _median_time(lambda: score_requests_one_by_one(params, config, subset), s.rounds)
    rate_shared, rate_one = len(requests) / shared, len(subset) / one
    achieved = 2.0 * n_active * stats["unique_tokens"] / shared / 1e12
    return [
        Measure("scoring_shared_vs_one_by_one", f"{s.model} {s.dtype} Hindsight-shaped "
                f"questions/s (one request per forward vs shared prefix)", "questions/s",
                rate_one, rate_shared),
        Measure("scoring_mfu", "shared-prefix scoring TFLOP/s (2 x non-embedding params x "
                "tokens run) vs peak", "TFLOP/s", ctx.peak_tflops, achieved),
    ]


def section_decode(ctx: Context) -> list[Measure]:
    """Greedy decode tokens/s and the HBM bandwidth it achieves."""
    import jax.numpy as jnp

    from jaxdm.models import generate

    s = ctx.shapes
    config, params, _, n_total = _params(ctx)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(10, config.vocab_size, size=s.decode_prompt).tolist()
               for _ in range(s.decode_batch)]
    short, long = s.decode_new
    run = {n: (lambda n=n: generate(params, config, None, prompts, max_new_tokens=n,
                                    greedy=True, eos_ids=()).tokens) for n in (short, long)}
    for fn in run.values():
        fn()  # compile both lengths
    times = {n: [] for n in run}
    for _ in range(s.rounds):
        for n, fn in run.items():
            t0 = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t0)
    per_step = (statistics.median(times[long]) - statistics.median(times[short])) / (long - short)
    if not per_step > 0:  # timing noise swamped the difference (tiny dry-run shapes)
        per_step = statistics.median(times[long]) / long
        ctx.notes.append(f"decode: the {long}-token run was not slower than the {short}-token "
                         f"run (noise); per-step time includes the prefill")
    itemsize = jnp.dtype(s.dtype).itemsize
    mean_len = s.decode_prompt + (short + long) / 2
    kv_bytes = (2 * config.num_layers * s.decode_batch * mean_len * config.num_kv_heads
                * config.head_dim * itemsize)
    step_bytes = n_total * itemsize + kv_bytes
    measures = [
        Measure("decode_tokens", f"{s.model} greedy decode, batch {s.decode_batch}, prompt "
                f"{s.decode_prompt}, tokens/s (bandwidth-bound ideal at the HBM peak vs "
                f"measured)", "tok/s",
                ctx.peak_gbs * 1e9 / step_bytes * s.decode_batch,
                s.decode_batch / per_step),
    ]
    measures.append(Measure("decode_bandwidth", "decode GB/s read (params + KV cache per "
                            "step) vs HBM peak", "GB/s", ctx.peak_gbs,
                            step_bytes / per_step / 1e9))
    ctx.notes.append(f"decode: {per_step * 1e3:.2f} ms per step, {step_bytes / 1e9:.3f} GB per "
                     f"step ({n_total / 1e6:.1f}M params, KV at mean length {mean_len:.0f})")
    return measures


def section_train(ctx: Context) -> list[Measure]:
    """One AdamW step on next-token cross-entropy: steps/s and MFU."""
    import jax
    import jax.numpy as jnp
    import optax

    from jaxdm.models import decoder

    s = ctx.shapes
    config, params, n_active, _ = _params(ctx)
    optimizer = optax.adamw(1e-5)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(3)
    tokens = jnp.asarray(rng.integers(10, config.vocab_size, size=(s.train_batch, s.train_seq)),
                         jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(s.train_seq), tokens.shape)

    def loss_fn(p):
        hidden = decoder.forward(p, config, tokens[:, :-1], positions[:, :-1])
        return -jnp.mean(decoder.token_logprobs(p, config, hidden, tokens[:, 1:]))

    def step(p, state):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    train_step = jax.jit(step, donate_argnums=(0, 1))
    params, opt_state, loss = train_step(params, opt_state)  # compile
    if not np.isfinite(float(loss)):
        raise AssertionError(f"train: non-finite loss {float(loss)} at the first step")
    samples = []
    for _ in range(s.rounds):
        t0 = time.perf_counter()
        params, opt_state, loss = train_step(params, opt_state)
        jax.block_until_ready(loss)
        samples.append(time.perf_counter() - t0)
    step_s = statistics.median(samples)
    n_tokens = s.train_batch * (s.train_seq - 1)
    ctx.notes.append(f"train: {step_s * 1e3:.1f} ms per step of {n_tokens} tokens, loss "
                     f"{float(loss):.3f}")
    return [
        Measure("train_tokens", f"{s.model} {s.dtype} AdamW step, batch {s.train_batch} x "
                f"{s.train_seq}, tokens/s (ideal at peak: 6 x non-embedding params per token)",
                "tok/s", ctx.peak_tflops * 1e12 / (6.0 * n_active), n_tokens / step_s),
        Measure("train_mfu", "training TFLOP/s (6 x non-embedding params x tokens) vs peak",
                "TFLOP/s", ctx.peak_tflops, 6.0 * n_active * n_tokens / step_s / 1e12),
    ]


SECTIONS: dict[str, Callable[[Context], list[Measure]]] = {
    "kernel": section_kernel,
    "scoring": section_scoring,
    "decode": section_decode,
    "train": section_train,
}


# ------------------------------------------------------------------------------- device
def _cpu_matmul_tflops() -> float:
    """The CPU stand-in for a peak: the fp32 matmul rate measured here (dry run only)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((512, 512), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(x))
    t = _median_time(lambda: f(x), 5)
    return 2.0 * 512 ** 3 / t / 1e12


def _cpu_bandwidth_gbs() -> float:
    """The CPU stand-in for HBM bandwidth: a 256 MB reduction's read rate (dry run only)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((64 * 2 ** 20,), jnp.float32)
    f = jax.jit(jnp.sum)
    jax.block_until_ready(f(x))
    return x.nbytes / _median_time(lambda: f(x), 5) / 1e9


def find_peak(device_kind: str) -> tuple[str, float, float] | None:
    """(label, bf16 TFLOP/s, HBM GB/s) of a device kind from ``PEAKS``, or None."""
    kind = device_kind.lower()
    for patterns, label, tflops, gbs in PEAKS:
        if any(p in kind for p in patterns):
            return label, tflops, gbs
    return None


def make_context(args, shapes: Shapes) -> Context:
    import jax

    device = jax.devices()[0]
    kind = device.device_kind
    if args.dry_run:
        return Context(shapes, True, kind, f"CPU dry run ({platform.machine()})",
                       _cpu_matmul_tflops(), _cpu_bandwidth_gbs(),
                       ["dry run: tiny shapes on CPU; the 'peaks' are the fp32 matmul rate and "
                        "the memory read rate measured here, not device figures"])
    if jax.default_backend() == "cpu":
        raise SystemExit("device_check: JAX sees no GPU/TPU (backend cpu); install jax[cuda12] "
                         "or jax[tpu] (device_check.sh does), or pass --dry-run")
    found = find_peak(kind)
    if found is not None or (args.peak_tflops and args.peak_gbs):
        label, tflops, gbs = found or (kind, None, None)
        found = (label, args.peak_tflops or tflops, args.peak_gbs or gbs)
    if found is None:
        raise SystemExit(f"device_check: no peak figures for device kind {kind!r}; pass "
                         f"--peak-tflops and --peak-gbs")
    label, tflops, gbs = found
    return Context(shapes, False, kind, label, tflops, gbs)


# ------------------------------------------------------------------------------- report
def markdown_block(ctx: Context, measures: list[Measure], failures: dict[str, str],
                   command: str, seconds: float) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"### Device check {date}: {ctx.device_label} (`{ctx.device_kind}`)", "",
             f"`{command}`, {seconds:.0f} s; peak {ctx.peak_tflops:.4g} TFLOP/s bf16, HBM "
             f"{ctx.peak_gbs:.0f} GB/s.", "",
             "| measure | baseline | jaxdm | ratio |", "|---|---|---|---|"]
    for m in measures:
        lines.append(f"| {m.what} | {_fmt(m.baseline)} {m.unit} | {_fmt(m.value)} {m.unit} | "
                     f"{m.ratio:.3g}x |")
    lines.append("")
    lines += [f"- {n}" for n in ctx.notes]
    lines += [f"- **{name} failed**: {err.strip().splitlines()[-1]}"
              for name, err in failures.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on CPU, Pallas in interpret mode (what CI runs)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--out", default="device_check_out", help="folder for the report files")
    ap.add_argument("--results-md", default=None,
                    help="append the block to this file (default on a device: "
                         "benchmarks/RESULTS.md; never in a dry run)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="bf16 peak of a device missing from PEAKS")
    ap.add_argument("--peak-gbs", type=float, default=None, help="its HBM bandwidth")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="skip the remaining sections once this many seconds have passed")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
    if args.dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    start = time.perf_counter()
    shapes = DRY if args.dry_run else FULL
    ctx = make_context(args, shapes)
    print(f"# device_check: {ctx.device_label} ({ctx.device_kind}), peak "
          f"{ctx.peak_tflops:.4g} TFLOP/s, HBM {ctx.peak_gbs} GB/s, shapes {shapes.model}",
          flush=True)
    measures: list[Measure] = []
    failures: dict[str, str] = {}
    for name in names:
        elapsed = time.perf_counter() - start
        if elapsed > args.budget_s:
            failures[name] = f"skipped: {elapsed:.0f} s of the {args.budget_s:.0f} s budget used"
            print(f"# {name}: skipped (time budget)", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            got = SECTIONS[name](ctx)
        except Exception:
            failures[name] = traceback.format_exc()
            print(f"# {name}: FAILED\n{failures[name]}", flush=True)
            continue
        measures += got
        print(f"# {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        for m in got:
            print(m.result_line(), flush=True)
    seconds = time.perf_counter() - start
    command = "benchmarks/device_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    block = markdown_block(ctx, measures, failures, command.strip(), seconds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "device_check.md"), "w") as f:
        f.write(block)
    with open(os.path.join(args.out, "device_check.json"), "w") as f:
        json.dump({"device_kind": ctx.device_kind, "device": ctx.device_label,
                   "dry_run": ctx.dry_run, "peak_tflops": ctx.peak_tflops,
                   "peak_gbs": ctx.peak_gbs, "seconds": seconds, "notes": ctx.notes,
                   "measures": [dict(dataclasses.asdict(m), ratio=m.ratio) for m in measures],
                   "failures": failures}, f, indent=1)
    results_md = args.results_md or (None if args.dry_run else
                                     os.path.join(os.path.dirname(__file__), "RESULTS.md"))
    if results_md and not args.dry_run:
        with open(results_md, "a") as f:
            f.write("\n" + block)
    print()
    print(block)
    for m in measures:
        print(m.result_line())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
